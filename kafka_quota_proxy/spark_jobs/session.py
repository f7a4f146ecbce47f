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
