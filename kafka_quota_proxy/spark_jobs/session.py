"""The Spark session: local mode unless a master is given (or set by spark-submit)."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager

from pyspark.sql import SparkSession


def spark_session(master: str | None = None, app: str = "kafka-quota-proxy") -> SparkSession:
    # Python workers must run the interpreter that has this project installed.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    builder = (
        SparkSession.builder.appName(app)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "8")
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        # (a replay group of a few hundred thousand rows crosses to Python in one batch)
        .config("spark.sql.execution.arrow.maxRecordsPerBatch", "1000000")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.memory", os.environ.get("KQP_SPARK_DRIVER_MEMORY", "4g"))
        # Throughput over pause times: the jobs are batches (about a tenth less CPU than G1)
        .config("spark.driver.extraJavaOptions", "-XX:+UseParallelGC")
        .config("spark.executor.extraJavaOptions", "-XX:+UseParallelGC")
    )
    if os.environ.get("KQP_SPARK_EXECUTOR_MEMORY"):  # (a cluster's executors: 1g by default)
        builder = builder.config("spark.executor.memory",
                                 os.environ["KQP_SPARK_EXECUTOR_MEMORY"])
    if master:
        builder = builder.master(master)
    elif "spark.master" not in os.environ.get("PYSPARK_SUBMIT_ARGS", ""):
        builder = builder.master("local[*]")
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


SPLITS_PER_CORE = 5  # (``small_splits``)


@contextmanager
def small_splits(spark: SparkSession, per_core: int = SPLITS_PER_CORE) -> Iterator[None]:
    """The capture's scans, while inside, in about ``per_core`` tasks per core instead of
    one or two (Spark's default for a few files: a 10 M request capture of five files is
    read in 3 tasks, 2, 2 and 1 files, so that on 2 cores the last runs alone for a third of
    the scan). Only for passes whose results do not depend on how the capture is split (the
    names, the replays and the offered load: counts, extremes, and groups sorted in full by
    Python): the profile's approximate percentiles and floating-point sums follow Spark's
    partial aggregates, one per scan task."""
    key = "spark.sql.files.minPartitionNum"
    before = spark.conf.get(key, None)
    spark.conf.set(key, str(per_core * spark.sparkContext.defaultParallelism))
    try:
        yield
    finally:
        if before is None:
            spark.conf.unset(key)
        else:
            spark.conf.set(key, before)
