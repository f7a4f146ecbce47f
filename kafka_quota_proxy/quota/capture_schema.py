"""The capture record: one per request the proxy forwarded (never payloads), what the proxy
writes (``proxy.features.capture.writer``: Parquet, ``docs/capture-schema.md``) and the replays read
(``quota.replay``, ``spark_jobs``). Defined once, here; the Parquet types are the writer's."""

from __future__ import annotations

from typing import NamedTuple

SCHEMA_VERSION = 4
# the key of the schema version in each file's metadata
SCHEMA_VERSION_KEY = "kafka_quota_proxy.capture_schema_version"
# The schema version that added each field that older files lack; readers give such a field
# its default (``defaults_before``).
ADDED_IN = {"storage_scale": 2, "instance": 4, "process": 4}


class CaptureRow(NamedTuple):
    """One capture record, built by field name."""

    run: str  # one proxy process: "<pid>-<start, Unix ms>"
    # v4: the proxy instance (e.g. its host name) and the process within it, "<instance>/<worker
    # index>/<start, Unix ms>" (``process_id``), as shared quota budgets name processes
    instance: str
    process: str
    seq: int  # order of the records within the run
    ts_ms: int  # wall clock (Unix ms) when the request was read
    quota_ms: int  # the quota engine's clock (monotonic ms) at recording time
    connection: int
    broker: int  # upstream node id; -1: the bootstrap listener
    user: str
    client_id: str
    client_address: str
    api_key: int
    api_version: int
    request_bytes: int  # whole frame, size prefix included
    response_bytes: int  # as the broker sent it; -1: no response (acks=0)
    duration_us: int  # request forwarded -> response started; -1: no response
    # v3: what the request costs a request quota (``quota.request_time``: the proxy's own time
    # on it plus the broker estimate), for every answered request; before v3 it was the round
    # trip, and 0 where no request quota was configured
    request_time_ms: float
    follower: bool  # a replica's fetch (quota-exempt)
    throttle_produce_ms: int
    throttle_fetch_ms: int
    throttle_request_ms: int
    client_rack: str | None
    quota_generation: int  # which quota config was live (see quotas-*.json)
    # v2: the storage factor produce quotas were scaled by (None: storage throttling was not
    # in force; 0: paused)
    storage_scale: float | None
    # Produce and Fetch: bytes of record batches per partition (topic: name, or topic id in hex)
    partitions: list[tuple[str, int, int]] | None


FIELD_NAMES: tuple[str, ...] = CaptureRow._fields


def process_id(instance: str, worker: int, start_ms: int, pid: int) -> str:
    """A process's id: ``<instance>/<worker index>/<pid>-<start time, Unix ms>`` (a restarted
    worker is a new process; ``docs/scale-out.md``): the key of its usage reports too."""
    return f"{instance}/{worker}/{pid}-{start_ms}"


def defaults_before(version: int, run: str) -> dict[str, object]:
    """What a reader takes for the fields a file of schema ``version`` lacks, in a row of
    ``run``: ``storage_scale`` None (v1), ``instance`` "" and ``process`` the run (v1-v3: one
    run was one process)."""
    defaults: dict[str, object] = {"storage_scale": None, "instance": "", "process": run}
    return {name: value for name, value in defaults.items() if ADDED_IN[name] > version}
