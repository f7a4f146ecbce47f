"""Reading a capture directory (schema: docs/capture-schema.md)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F


def read_capture(spark: SparkSession, directory: str | Path) -> DataFrame:
    """Every complete capture file (``.inprogress`` ones are being written)."""
    files = sorted(str(p) for p in Path(directory).glob("capture-*.parquet"))
    if not files:
        raise FileNotFoundError(f"no capture-*.parquet files in {directory}")
    frame = spark.read.option("mergeSchema", "true").parquet(*files)
    if "storage_scale" not in frame.columns:  # schema v1
        frame = frame.withColumn("storage_scale", F.lit(None).cast("double"))
    return with_processes(frame)


def with_processes(frame: DataFrame) -> DataFrame:
    """``instance`` and ``process`` (capture schema v4) for rows of any version: rows written
    before v4 (the columns missing, or null where older files are read with newer ones) take
    instance "" and process = their run (``quota.capture_schema.defaults_before``)."""
    instance = F.col("instance") if "instance" in frame.columns else F.lit(None)
    process = F.col("process") if "process" in frame.columns else F.lit(None)
    return frame.withColumns({
        "instance": F.coalesce(instance.cast("string"), F.lit("")),
        "process": F.coalesce(process.cast("string"), F.col("run")),
    })


def read_live_configs(directory: str | Path) -> dict[tuple[str, int], Mapping[str, Any]]:
    """(run, quota generation) -> the ``quotas`` section that was live."""
    out: dict[tuple[str, int], Mapping[str, Any]] = {}
    for path in Path(directory).glob("quotas-*.json"):
        doc = json.loads(path.read_text())
        out[(str(doc["run"]), int(doc["quota_generation"]))] = doc["quotas"]
    return out


def read_live_config_times(directory: str | Path) -> dict[tuple[str, int], int]:
    """(run, quota generation) -> when it became live (Unix ms, the proxy's wall clock)."""
    out: dict[tuple[str, int], int] = {}
    for path in Path(directory).glob("quotas-*.json"):
        doc = json.loads(path.read_text())
        if "since_ms" in doc:
            out[(str(doc["run"]), int(doc["quota_generation"]))] = int(doc["since_ms"])
    return out


def read_storage_settings(directory: str | Path) -> dict[str, Mapping[str, Any]]:
    """run -> what storage throttling applied besides its factor (runs with a ``storage``
    section only)."""
    out: dict[str, Mapping[str, Any]] = {}
    for path in Path(directory).glob("quotas-*.json"):
        doc = json.loads(path.read_text())
        if doc.get("storage"):
            out[str(doc["run"])] = doc["storage"]
    return out
