"""The Spark session: local mode unless a master is given (or set by spark-submit)."""

from __future__ import annotations

import os
import sys

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
        # Every core busy to the end of each stage: a shuffle's partitions are not merged into
        # fewer than there are (8 tasks of about one size, where the adaptive plan made 3 on
        # 2 cores and one core waited on the third: a sixth of those stages' time)
        .config("spark.sql.adaptive.coalescePartitions.enabled", "false")
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
    # The capture read in about 4 splits per core, not 1.5: a capture's files are row groups
    # of a few MB, and 5 files on 2 cores made 3 tasks, one of them alone at the end of every
    # pass (the bench: 10 tasks, 4.5 against 5.6 s for its first pass)
    if spark.conf.get("spark.sql.files.minPartitionNum", None) is None:
        spark.conf.set("spark.sql.files.minPartitionNum",
                       str(4 * spark.sparkContext.defaultParallelism))
    return spark
