"""Reading a capture directory (schema: docs/capture-schema.md)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, SparkSession

SCHEMA_VERSION = 1


def read_capture(spark: SparkSession, directory: str | Path) -> DataFrame:
    """Every complete capture file (``.inprogress`` ones are being written)."""
    files = sorted(str(p) for p in Path(directory).glob("capture-*.parquet"))
    if not files:
        raise FileNotFoundError(f"no capture-*.parquet files in {directory}")
    return spark.read.parquet(*files)


def read_live_configs(directory: str | Path) -> dict[tuple[str, int], Mapping[str, Any]]:
    """(run, quota generation) -> the ``quotas`` section that was live."""
    out: dict[tuple[str, int], Mapping[str, Any]] = {}
    for path in Path(directory).glob("quotas-*.json"):
        doc = json.loads(path.read_text())
        out[(str(doc["run"]), int(doc["quota_generation"]))] = doc["quotas"]
    return out
