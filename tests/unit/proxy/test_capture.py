"""The capture writer: records reach Parquet intact, files rotate and are complete when
renamed, and a writer that falls behind drops (counted) instead of blocking."""

from __future__ import annotations

import os
import socket
import threading
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from kafka_quota_proxy.proxy.features.capture.writer import (
    FIELDS,
    SCHEMA,
    SCHEMA_VERSION,
    Capture,
    CaptureWriter,
    read_capture_file,
)
from kafka_quota_proxy.quota.capture_schema import SCHEMA_VERSION_KEY, CaptureRow


def row(i: int) -> tuple[Any, ...]:
    return ("1-2", "host-a", "host-a/1/2", i, 1_700_000_000_000 + i, 5_000 + i, 7, 1,
            "ANONYMOUS", f"client-{i % 3}", "127.0.0.1", 0, 9, 1000 + i, 50, 1200, 1.2, False,
            i % 5, 0, 0, None, 0, 0.5 if i % 3 else None,
            [("t", i % 4, 900 + i)] if i % 2 else None)


def read_all(directory: Path) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for path in sorted(directory.glob("*.parquet")):
        rows += pq.read_table(path).to_pylist()
    return sorted(rows, key=lambda r: r["seq"])


def test_records_round_trip_with_the_versioned_schema(tmp_path: Path) -> None:
    capture = Capture(tmp_path, batch=10)
    for i in range(95):
        capture.record(row(i))
    capture.close()
    assert list(tmp_path.glob("*.inprogress")) == []
    got = read_all(tmp_path)
    names = [name for name, _ in FIELDS]
    expected = [dict(zip(names, row(i), strict=True)) for i in range(95)]
    for e in expected:
        if e["partitions"] is not None:
            e["partitions"] = [dict(zip(("topic", "partition", "bytes"), p, strict=True))
                               for p in e["partitions"]]
    assert got == expected
    path = next(tmp_path.glob("*.parquet"))
    schema = pq.read_schema(path)
    assert schema.metadata[b"kafka_quota_proxy.capture_schema_version"] == str(
        SCHEMA_VERSION).encode()
    assert schema.remove_metadata() == SCHEMA.remove_metadata()
    assert capture.records == 95 and capture.dropped == 0
    assert capture.writer.records_written == 95
    assert SCHEMA_VERSION == 4
    assert {(r["instance"], r["process"]) for r in got} == {("host-a", "host-a/1/2")}
    assert read_capture_file(path).to_pylist() == pq.read_table(path).to_pylist()


def test_rows_name_their_instance_and_process(tmp_path: Path) -> None:
    """v4: ``instance`` and ``process`` by name in ``CaptureRow`` and in the file; a
    ``Capture`` given none takes the host name and ``<host>/0/<pid>-<start ms>``."""
    named = Capture(tmp_path / "named", instance="proxy-7", process="proxy-7/3/1700000000000")
    assert (named.instance, named.process) == ("proxy-7", "proxy-7/3/1700000000000")
    named.close()
    before = int(time.time() * 1000)
    capture = Capture(tmp_path / "default", batch=1)
    instance, worker, run = capture.process.split("/")
    pid, start = run.split("-")
    assert capture.instance == instance == socket.gethostname() != ""
    assert worker == "0" and int(pid) == os.getpid()
    assert before <= int(start) <= time.time() * 1000
    assert capture.run == run  # one start time for the run and the process
    fields = dict(zip((name for name, _ in FIELDS), row(5), strict=True))
    capture.record(tuple(CaptureRow(**{**fields, "instance": capture.instance,
                                       "process": capture.process})))
    capture.close()
    [got] = read_all(tmp_path / "default")
    assert (got["run"], got["instance"], got["process"]) == (
        "1-2", capture.instance, capture.process)


def test_a_version_3_file_reads_with_the_defaults(tmp_path: Path) -> None:
    """A file written before v4 (no ``instance``, ``process``) reads as v4: instance "" and
    process = the row's run; one of v1 (no ``storage_scale`` either) as well."""
    names = [name for name, _ in FIELDS]
    for version, missing in ((3, {"instance", "process"}),
                             (1, {"instance", "process", "storage_scale"})):
        kept = [(name, kind) for name, kind in FIELDS if name not in missing]
        old = pa.schema([pa.field(name, kind) for name, kind in kept],
                        metadata={SCHEMA_VERSION_KEY: str(version)})
        rows = [dict(zip(names, row(i), strict=True)) | {"run": f"{100 + i % 2}-5"}
                for i in range(6)]
        table = pa.Table.from_pylist([{n: r[n] for n, _ in kept} for r in rows], schema=old)
        path = tmp_path / f"capture-v{version}.parquet"
        pq.write_table(table, path)
        got = read_capture_file(path)
        assert got.schema == SCHEMA
        for r, g in zip(rows, got.to_pylist(), strict=True):
            assert (g["instance"], g["process"]) == ("", r["run"])
            assert g["storage_scale"] == (None if version == 1 else r["storage_scale"])
            assert g["seq"] == r["seq"] and g["client_id"] == r["client_id"]


def test_files_rotate_by_size_and_age(tmp_path: Path) -> None:
    capture = Capture(tmp_path, rotate_mb=0.001, batch=50)  # ~1 KB: every batch rotates
    for i in range(500):
        capture.record(row(i))
    capture.close()
    assert len(list(tmp_path.glob("*.parquet"))) >= 5
    assert [r["seq"] for r in read_all(tmp_path)] == list(range(500))

    aged = tmp_path / "aged"
    capture = Capture(aged, rotate_seconds=0.2, batch=1)
    capture.record(row(1))
    deadline = time.monotonic() + 10
    while not list(aged.glob("*.parquet")) and time.monotonic() < deadline:
        threading.Event().wait(0.05)
    assert len(list(aged.glob("*.parquet"))) == 1  # closed by age, with the proxy running
    capture.close()


def test_a_writer_that_falls_behind_drops_and_counts(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    release = threading.Event()
    original = CaptureWriter._write

    def stuck(self: CaptureWriter, rows: Any) -> None:
        release.wait(30)
        original(self, rows)

    monkeypatch.setattr(CaptureWriter, "_write", stuck)
    capture = Capture(tmp_path, batch=10, queue_batches=2)
    for i in range(1000):
        capture.record(row(i))  # returns although the writer is stuck (a block would hang)
    # two batches queued, perhaps one more in the stuck writer; the rest dropped, counted
    assert capture.dropped in (1000 - 20, 1000 - 30)
    release.set()
    capture.close()
    assert capture.writer.records_written + capture.dropped == 1000
    assert len(read_all(tmp_path)) == capture.writer.records_written
