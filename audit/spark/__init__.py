"""routeaudit's relations on Apache Spark (optional: needs ``pyspark`` and a Java runtime).

The same ``audit/sql`` relations, translated from DuckDB's dialect to Spark's at run time
(:mod:`audit.spark._translate`), built over raw tables in partitioned Parquet, the public ones
written back as partitioned Parquet (docs/scale-out.md). Importing this package does not import
pyspark; the functions that run Spark do.
"""

from audit.spark._run import (
    DEFAULT_DRIVER_MEMORY,
    DEFAULT_MASTER,
    SHORT_RUN_JAVA_OPTIONS,
    Built,
    build,
    command,
    export_raw,
    load_raw,
    run,
    session,
    write_public,
)
from audit.spark._translate import REWRITES, Translation, to_spark, translate

__all__ = ["DEFAULT_DRIVER_MEMORY", "DEFAULT_MASTER", "REWRITES", "SHORT_RUN_JAVA_OPTIONS", "Built",
           "Translation", "build", "command", "export_raw", "load_raw", "run", "session", "to_spark",
           "translate", "write_public"]
