"""Traffic capture: one record per request (never payloads), written to rotated Parquet files.

The event loop only appends a tuple to a list; every ``BATCH`` records (or on ``flush``) the
list is handed to a writer thread through a bounded queue. When the writer falls behind and
the queue is full, the batch is dropped and counted: capture never slows or blocks proxying.

Files are written as ``capture-<UTC time>-<n>.parquet.inprogress`` and renamed to
``.parquet`` when rotated (by size or age) or when the proxy stops, so readers only ever see
complete files. The schema is versioned (``SCHEMA_VERSION``, also in each file's metadata);
``docs/capture-schema.md`` documents it; ``read_capture_file`` reads a file of any version as
the current one.

Each row names the process that wrote it (``run``, and since v4 ``instance`` and ``process``):
processes keep their own quota clocks, so a capture written by several processes is replayed
per process, and compared with one enforcement point (``spark_jobs.replay``).
"""

from __future__ import annotations

import os
import queue
import socket
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from prometheus_client.core import CounterMetricFamily

from kafka_quota_proxy.proxy.logs import get_logger
from kafka_quota_proxy.quota.capture_schema import (
    FIELD_NAMES,
    SCHEMA_VERSION,
    SCHEMA_VERSION_KEY,
    defaults_before,
    process_id,
)

log = get_logger("kafka_quota_proxy.capture")

BATCH = 1024
QUEUE_BATCHES = 64

# The Parquet type of each field of ``CaptureRow`` (``quota.capture_schema``), in its order.
_TYPES: dict[str, pa.DataType] = {
    "run": pa.string(),
    "instance": pa.string(),
    "process": pa.string(),
    "seq": pa.int64(),
    "ts_ms": pa.int64(),
    "quota_ms": pa.int64(),
    "connection": pa.int64(),
    "broker": pa.int32(),
    "user": pa.string(),
    "client_id": pa.string(),
    "client_address": pa.string(),
    "api_key": pa.int16(),
    "api_version": pa.int16(),
    "request_bytes": pa.int32(),
    "response_bytes": pa.int32(),
    "duration_us": pa.int64(),
    "request_time_ms": pa.float64(),
    "follower": pa.bool_(),
    "throttle_produce_ms": pa.int32(),
    "throttle_fetch_ms": pa.int32(),
    "throttle_request_ms": pa.int32(),
    "client_rack": pa.string(),
    "quota_generation": pa.int32(),
    "storage_scale": pa.float64(),
    "partitions": pa.list_(pa.struct([("topic", pa.string()), ("partition", pa.int32()),
                                      ("bytes", pa.int64())])),
}
assert tuple(_TYPES) == FIELD_NAMES, "every capture field has one Parquet type, in order"
# (name, type), the order of the fields of ``CaptureRow``, what ``Capture.record`` takes
FIELDS: tuple[tuple[str, pa.DataType], ...] = tuple(_TYPES.items())

SCHEMA = pa.schema(
    [pa.field(name, kind) for name, kind in FIELDS],
    metadata={SCHEMA_VERSION_KEY: str(SCHEMA_VERSION)},
)


def file_schema_version(schema: pa.Schema) -> int:
    """The capture schema version of a file's schema (its metadata)."""
    return int((schema.metadata or {}).get(SCHEMA_VERSION_KEY.encode(), b"1"))


def read_capture_file(path: str | Path) -> pa.Table:
    """One capture file, of any schema version, as the current ``SCHEMA``: the fields an
    older file lacks take their defaults (``quota.capture_schema.defaults_before``:
    ``storage_scale`` null; ``instance`` "" and ``process`` the row's ``run``)."""
    table = pq.read_table(path)
    version = file_schema_version(table.schema)
    n = table.num_rows
    defaults = defaults_before(version, "")
    columns = []
    for name, kind in FIELDS:
        if name in table.column_names:
            columns.append(table.column(name).cast(kind))
        elif name == "process":  # (its default is the row's run)
            columns.append(table.column("run").cast(kind))
        elif defaults.get(name) is None:
            columns.append(pa.nulls(n, kind))
        else:
            columns.append(pa.array([defaults[name]] * n, kind))
    return pa.Table.from_arrays(columns, schema=SCHEMA)


class CaptureWriter(threading.Thread):
    """Writes batches of record tuples to rotated Parquet files in ``directory``."""

    def __init__(self, directory: Path, rotate_bytes: int, rotate_seconds: float,
                 batches: queue.Queue[list[tuple[Any, ...]] | None], run: str) -> None:
        super().__init__(name="capture-writer", daemon=True)
        self.run_id = run
        self.directory = directory
        self.rotate_bytes = rotate_bytes
        self.rotate_seconds = rotate_seconds
        self.batches = batches
        self._writer: pq.ParquetWriter | None = None
        self._sink: Any = None
        self._path: Path | None = None
        self._opened = 0.0
        self._files = 0
        self.files_written = 0
        self.records_written = 0
        self.failed_records = 0  # lost to write errors (counted with the dropped ones)
        self.error: str | None = None

    def _open(self) -> None:
        stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
        self._files += 1
        self._path = self.directory / f"capture-{stamp}-{self.run_id}-{self._files:05d}.parquet"
        self._sink = pa.OSFile(str(self._path) + ".inprogress", "wb")
        self._writer = pq.ParquetWriter(self._sink, SCHEMA, compression="zstd")
        self._opened = time.monotonic()

    def _close(self) -> None:
        if self._writer is None:
            return
        self._writer.close()
        self._sink.close()
        assert self._path is not None
        os.replace(str(self._path) + ".inprogress", self._path)
        self.files_written += 1
        self._writer = self._sink = None

    def _write(self, rows: Sequence[tuple[Any, ...]]) -> None:
        if self._writer is None:
            self._open()
        assert self._writer is not None
        columns = list(zip(*rows, strict=True))
        table = pa.Table.from_arrays(
            [pa.array(col, type=kind) for col, (_, kind) in zip(columns, FIELDS, strict=True)],
            schema=SCHEMA)
        self._writer.write_table(table)
        self.records_written += len(rows)
        if (self._sink.tell() >= self.rotate_bytes
                or time.monotonic() - self._opened >= self.rotate_seconds):
            self._close()

    def run(self) -> None:
        while True:
            try:
                rows = self.batches.get(timeout=min(self.rotate_seconds, 1.0))
            except queue.Empty:
                if self._writer is not None and (
                        time.monotonic() - self._opened >= self.rotate_seconds):
                    self._close()
                continue
            if rows is None:
                break
            try:
                self._write(rows)
            except Exception as exc:  # a full disk must not take the proxy down
                self.failed_records += len(rows)
                if self.error is None:
                    log.error("capture_write_failed", error=repr(exc))
                self.error = repr(exc)
        try:
            self._close()
        except Exception as exc:
            log.error("capture_close_failed", error=repr(exc))


class Capture:
    """The event-loop side: ``record(row)`` appends; full batches go to the writer thread.

    ``instance``: the proxy instance's id ("": the host name); ``process``: this process's id,
    ``<instance>/<worker index>/<start, Unix ms>`` ("": worker 0, started now). Every row
    carries both (``CaptureFilter``), and ``run`` (``<pid>-<start, Unix ms>``)."""

    def __init__(self, directory: str | Path, rotate_mb: float = 128,
                 rotate_seconds: float = 300, queue_batches: int = QUEUE_BATCHES,
                 batch: int = BATCH, instance: str = "", process: str = "") -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.batch = batch
        start_ms = int(time.time() * 1000)
        self.run = f"{os.getpid()}-{start_ms}"
        self.instance = instance or socket.gethostname()
        self.process = process or process_id(self.instance, 0, start_ms, os.getpid())
        self._rows: list[tuple[Any, ...]] = []
        self._queue: queue.Queue[list[tuple[Any, ...]] | None] = queue.Queue(queue_batches)
        self.writer = CaptureWriter(self.directory, int(rotate_mb * 1024 * 1024),
                                    rotate_seconds, self._queue, self.run)
        self.seq = 0
        self.records = 0
        self.dropped = 0
        # pyarrow's first conversion of a Python list imports pandas where it is installed
        # (0.3-0.4 s): here, as the capture starts, not in the writer thread while the event
        # loop serves (it holds the interpreter then, and every request waits on it)
        pa.array([0], type=pa.int64())
        self.writer.start()

    def record(self, row: tuple[Any, ...]) -> None:
        self._rows.append(row)
        self.records += 1
        if len(self._rows) >= self.batch:
            self.flush()

    @property
    def lost(self) -> int:
        """Records that will never reach a file: dropped (writer behind) or failed."""
        return self.dropped + self.writer.failed_records

    def next_seq(self) -> int:
        self.seq += 1
        return self.seq

    def flush(self) -> None:
        """Hand what is buffered to the writer (or drop it, counted, if it is behind)."""
        if not self._rows:
            return
        rows, self._rows = self._rows, []
        try:
            self._queue.put_nowait(rows)
        except queue.Full:
            self.dropped += len(rows)

    def close(self, timeout: float = 30) -> None:
        """Write what is left and close the current file."""
        self.flush()
        try:
            self._queue.put(None, timeout=timeout)
        except queue.Full:
            log.error("capture_close_timeout")
        self.writer.join(timeout)

    def metric_families(self) -> Iterator[Any]:
        """This feature's metric families (``ProxyStats.feature_families``)."""
        for name, doc, value in (
            ("kafka_proxy_capture_records", "Requests captured", self.records),
            ("kafka_proxy_capture_dropped_records",
             "Capture records lost: dropped because the writer fell behind, or not written "
             "because writing failed (see the log)", self.lost),
            ("kafka_proxy_capture_written_records", "Capture records written to files",
             self.writer.records_written),
            ("kafka_proxy_capture_files", "Capture files completed", self.writer.files_written),
        ):
            c = CounterMetricFamily(name, doc)
            c.add_metric([], value)
            yield c
