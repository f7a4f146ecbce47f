"""The capture record: one per request the proxy forwarded (never payloads), what the proxy
writes (``proxy.capture_writer``: Parquet, ``docs/capture-schema.md``) and the replays read
(``quota.replay``, ``spark_jobs``). Defined once, here; the Parquet types are the writer's."""

from __future__ import annotations

from typing import NamedTuple

SCHEMA_VERSION = 3
# the key of the schema version in each file's metadata
SCHEMA_VERSION_KEY = "kafka_quota_proxy.capture_schema_version"


class CaptureRow(NamedTuple):
    """One capture record, built by field name."""

    run: str  # one proxy process: "<pid>-<start, Unix ms>"
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
