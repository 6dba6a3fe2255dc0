"""Build every relation with Spark SQL over raw tables in partitioned Parquet.

Input: a folder in the closed-partition layout (``<table>/part=<p>/*.parquet``) holding
``raw_spans``, ``raw_span_events``, ``raw_snapshots`` and optionally ``routeaudit_meta``
(the store's settings, one ``key``/``value`` row each). :func:`export_raw` writes that folder
from a DuckDB store. Output: each public relation under ``<out>/<name>/``, partitioned by
``part`` where it has that column, readable with DuckDB's
``read_parquet('<out>/<name>/**/*.parquet', hive_partitioning = true)``.
"""

from __future__ import annotations

import os
import re
import shutil
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from audit import _relations
from audit._errors import StoreError
from audit.schema import RAW_TABLES
from audit.spark._translate import Stage, Translation, translate

if TYPE_CHECKING:
    import duckdb
    from pyspark.sql import DataFrame, SparkSession

META_TABLE: Final = "routeaudit_meta"
DEFAULT_MASTER: Final = "local[2]"
DEFAULT_DRIVER_MEMORY: Final = "2g"
"""The driver JVM's heap unless told otherwise: enough for the tests and runs of about
100,000 requests on ``local[2]``; a larger local run needs more (``--driver-memory``)."""
SHORT_RUN_JAVA_OPTIONS: Final = ("-XX:TieredStopAtLevel=1 -XX:+UseSerialGC "
                                 "-XX:ReservedCodeCacheSize=256m")
"""Driver JVM options for a short local run (a test, a run of tens of thousands of requests):
the C1 compiler only, and the serial collector. Over the 20,000-request generated run at
``local[2]`` the JVM's CPU time fell from 285 s to 215 s: with the default tiered compilation
the C2 compiler threads alone took 115 s of it, compiling code the run then barely uses, and G1's
concurrent threads 41 s (docs/scale-out.md). With C1 alone the JVM reserves only 48 MB for
compiled code, which one build of every relation fills (the classes Spark generates per query
are compiled too): the JVM then stops compiling ("CodeCache is full. Compiler has been
disabled") and runs the rest interpreted; a second build in the same JVM (the sample data,
then a generated run of 20,000 requests) ran mostly so. 256 MB holds both builds' code."""


def session(master: str = DEFAULT_MASTER, *, shuffle_partitions: int = 4,
            app_name: str = "routeaudit", java_options: str | None = None,
            driver_memory: str = DEFAULT_DRIVER_MEMORY,
            conf: Mapping[str, str] | None = None) -> SparkSession:
    """A SparkSession set up as the relations need: UTC session time zone (timestamps are
    instants), non-ANSI arithmetic (a division by zero is NULL, as in DuckDB).
    ``java_options``: the driver JVM's options (``spark.driver.extraJavaOptions``, e.g.
    :data:`SHORT_RUN_JAVA_OPTIONS`); ``driver_memory``: its heap (``spark.driver.memory``,
    where a ``local[N]`` master runs every task); both apply only when this call starts the
    JVM. ``conf``: any other Spark settings, set last (an object store's connector and
    credentials, e.g. ``spark.jars.packages`` and ``spark.hadoop.fs.s3a.*``)."""
    from pyspark.sql import SparkSession

    builder = (SparkSession.builder.master(master).appName(app_name)
               .config("spark.sql.session.timeZone", "UTC")
               .config("spark.sql.ansi.enabled", "false")
               .config("spark.sql.shuffle.partitions", str(shuffle_partitions))
               .config("spark.driver.memory", driver_memory)
               .config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.sql.parquet.outputTimestampType", "TIMESTAMP_MICROS"))
    if java_options:
        builder = builder.config("spark.driver.extraJavaOptions", java_options)
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def export_raw(con: duckdb.DuckDBPyConnection, out: str | os.PathLike[str]) -> Path:
    """Write a store's raw tables and settings to ``out`` in the partitioned layout: raw spans
    by their start's partition, events with their span, scrapes by scrape time (the layout of
    the store's closed partitions, audit/_closed.py)."""
    root = Path(out).absolute()
    root.mkdir(parents=True, exist_ok=True)
    w = int(con.execute("select partition_ns from stg_partitioning").fetchall()[0][0])
    selects = {
        "raw_spans": f"select *, start_ns // {w} as part from raw_spans",
        "raw_span_events": f"select e.*, s.start_ns // {w} as part from raw_span_events as e "
                           "join raw_spans as s using (trace_id, span_id)",
        "raw_snapshots": f"select *, scraped_ns // {w} as part from raw_snapshots",
    }
    for table, select in selects.items():
        target = root / table
        if target.exists():
            shutil.rmtree(target)
        if int(con.execute(f"select count(*) from ({select})").fetchall()[0][0]) == 0:
            # an empty table still needs its columns: one file without a partition folder
            target.mkdir()
            con.execute(f"copy ({select} limit 0) to '{_quote(target / 'empty.parquet')}' "
                        "(format parquet)")
            continue
        con.execute(f"copy ({select}) to '{_quote(target)}' (format parquet, compression zstd, "
                    "partition_by (part), filename_pattern 'data_{i}')")
    meta = root / META_TABLE
    meta.mkdir(exist_ok=True)
    con.execute(f"copy (select key, value from {META_TABLE}) to "
                f"'{_quote(meta / 'data_0.parquet')}' (format parquet)")
    return root


def _quote(path: Path) -> str:
    return str(path).replace("'", "''")


@dataclass
class Built:
    """What :func:`build` did: seconds per relation, and the relations that failed with why."""

    seconds: dict[str, float] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)
    written: list[str] = field(default_factory=list)


_URI = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://")


def _location(where: str | os.PathLike[str]) -> str:
    """A folder as Spark reads it: a URI (``s3a://``, ``hdfs://``, ``file://``: any scheme
    Hadoop knows) as given, a local path made absolute."""
    text = os.fspath(where)
    return text.rstrip("/") if _URI.match(text) else str(Path(text).absolute())


def _child(root: str, name: str) -> str:
    return f"{root}/{name}" if _URI.match(root) else str(Path(root) / name)


def _is_dir(spark: SparkSession, location: str) -> bool:
    """Whether ``location`` is a folder, asked of Hadoop's file system for a URI (an object
    store's folder is a prefix that holds objects)."""
    if not _URI.match(location):
        return Path(location).is_dir()
    hadoop_path = spark._jvm.org.apache.hadoop.fs.Path(location)  # type: ignore[union-attr]
    fs = hadoop_path.getFileSystem(spark._jsc.hadoopConfiguration())
    return bool(fs.exists(hadoop_path) and fs.getFileStatus(hadoop_path).isDirectory())


def load_raw(spark: SparkSession, raw: str | os.PathLike[str]) -> None:
    """Register the raw tables (and the settings) of ``raw`` (a local folder or a URI) as
    temporary views."""
    root = _location(raw)
    for table in RAW_TABLES:
        folder = _child(root, table)
        if not _is_dir(spark, folder):
            raise FileNotFoundError(f"{folder}: no such table folder")
        frame = spark.read.option("mergeSchema", "false").parquet(folder)
        if "part" in frame.columns:
            frame = frame.drop("part")
        frame.createOrReplaceTempView(table)
    meta = _child(root, META_TABLE)
    if _is_dir(spark, meta):
        spark.read.parquet(meta).createOrReplaceTempView(META_TABLE)
    else:
        spark.sql("select cast(null as string) as key, cast(null as string) as value "
                  "where false").createOrReplaceTempView(META_TABLE)


def build(spark: SparkSession, *, only: Iterable[str] | None = None,
          settings: Mapping[str, str] | None = None,
          on_built: Callable[[str, float], None] | None = None) -> Built:
    """Build every relation (or those of ``only`` and what they read) in dependency order, each
    as a materialised temporary view. A relation that fails is recorded, and the relations
    reading it are skipped."""
    rels = _relations.load_relations()
    wanted = _relations.upstream(rels, set(only)) if only is not None else {r.name for r in rels}
    views = set(_relations.ALWAYS_VIEWS)
    result = Built()
    for rel in rels:
        if rel.name not in wanted:
            continue
        missing = sorted(d for d in _relations.reads(rel.sql)
                         if d in result.failed or d in result.skipped)
        if missing:
            result.skipped[rel.name] = "reads " + ", ".join(missing)
            continue
        started = time.perf_counter()
        try:
            frame = _evaluate(spark, translate(rel.sql, rel.name, settings))
            if rel.name not in views:
                frame = _materialise(frame)
            frame.createOrReplaceTempView(rel.name)
        except Exception as exc:  # noqa: BLE001 - a relation Spark cannot build is reported
            result.failed[rel.name] = _first_line(exc)
            continue
        result.seconds[rel.name] = time.perf_counter() - started
        if on_built is not None:
            on_built(rel.name, result.seconds[rel.name])
    return result


MAX_LEVELS: Final = 10_000
"""A recursive CTE that has not ended after this many levels is an error (DuckDB would loop)."""


def _evaluate(spark: SparkSession, translation: Translation) -> DataFrame:
    """The relation's query, after its steps: each shared CTE built once and kept as a view,
    each recursive CTE evaluated level by level (one Spark job per level, each level a set of
    rows)."""
    for step in translation.steps:
        if isinstance(step, Stage):
            _materialise(spark.sql(step.sql)).createOrReplaceTempView(step.view)
            continue
        rec = step
        level = _materialise(spark.sql(rec.anchor))
        levels = [level]
        while True:
            if len(levels) > MAX_LEVELS:
                raise RuntimeError(f"{rec.view}: recursion did not end after {MAX_LEVELS} levels")
            level.createOrReplaceTempView(f"{rec.view}_prev")
            level = _materialise(spark.sql(rec.step))
            if level.isEmpty():
                break
            levels.append(level)
        union = levels[0]
        for more in levels[1:]:
            union = union.unionAll(more)
        _materialise(union).createOrReplaceTempView(f"{rec.view}_all")
        spark.catalog.dropTempView(f"{rec.view}_prev")
    return spark.sql(translation.sql)


def _materialise(frame: DataFrame) -> DataFrame:
    """Compute ``frame`` once and keep its rows, as the store keeps a relation's table: the
    result's plan is one scan of those rows, whatever the plan that computed them.

    ``localCheckpoint`` keeps the rows, but its scan keeps the computing plan's column ids and
    output partitioning, and a self-join of two relations derived from one then fails to
    resolve ("key not found: <column>#<id>"); so the checkpointed rows are wrapped in a new
    scan with fresh ids. A cached frame (``persist``) would instead keep the whole lineage as
    its plan: every later query re-analyses it, a level of a recursive CTE holds every level
    before it, and the plans of the relations reading a recursion's result grow until the
    driver's heap runs out."""
    from pyspark.sql import DataFrame

    kept = frame.localCheckpoint(eager=True)
    jdf = kept._jdf
    fresh = jdf.sparkSession().internalCreateDataFrame(jdf.queryExecution().toRdd(),
                                                       jdf.schema(), False)
    return DataFrame(fresh, frame.sparkSession)


def _first_line(exc: BaseException) -> str:
    """The line that says what went wrong (a Java error's first line names only the call)."""
    lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
    if not lines:
        return type(exc).__name__
    if lines[0].startswith("An error occurred while calling") and len(lines) > 1:
        return lines[1].lstrip(": ")[:400]
    return lines[0][:400]


def write_public(spark: SparkSession, out: str | os.PathLike[str], built: Built) -> list[str]:
    """Write each public relation that built to ``out/<name>/`` (``out`` a local folder or a
    URI; partitioned by ``part`` where it has that column and rows; an empty one as one file
    with its columns); returns the names written."""
    root = _location(out)
    written = []
    for name in _relations.public_relations():
        if name not in built.seconds:
            continue
        frame = spark.table(name)
        writer = frame.write.mode("overwrite").option("compression", "zstd")
        # an empty relation partitioned by part would be written as no file at all (no
        # partition folder), which a reader cannot tell from a missing relation: one empty file
        if "part" in frame.columns and not frame.isEmpty():
            writer = writer.partitionBy("part")
        writer.parquet(_child(root, name))
        written.append(name)
    built.written = written
    return written


def run(raw: str | os.PathLike[str], out: str | os.PathLike[str], *,
        master: str = DEFAULT_MASTER, spark: SparkSession | None = None,
        settings: Mapping[str, str] | None = None, **options: Any) -> Built:
    """Read ``raw``, build every relation, write the public ones to ``out``."""
    own = spark is None
    spark = session(master, **options) if spark is None else spark
    try:
        load_raw(spark, raw)
        built = build(spark, settings=settings)
        write_public(spark, out, built)
        return built
    finally:
        if own:
            spark.stop()


def command(*, raw: str, out: str, master: str = DEFAULT_MASTER,
            export_from: str | None = None, driver_memory: str = DEFAULT_DRIVER_MEMORY,
            conf: Mapping[str, str] | None = None) -> int:
    """``routeaudit spark``: optionally export a store's raw tables to ``raw``, then build the
    relations with Spark and write the public ones to ``out``; prints what it wrote. ``raw``
    and ``out`` are local folders or URIs Spark's Hadoop file systems read (``s3a://``,
    ``hdfs://``; their connectors set up through ``conf``)."""
    import importlib.util
    import sys

    if importlib.util.find_spec("pyspark") is None or importlib.util.find_spec("sqlglot") is None:
        raise StoreError("the Spark path needs pyspark and sqlglot: pip install 'routeaudit[spark]'")
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        raise StoreError("the Spark path needs a Java 17 runtime (Debian: openjdk-17-jre-headless)")
    if export_from is not None:
        import duckdb

        if _URI.match(raw):
            raise StoreError(f"--db exports to a local folder, not to {raw}: export to a local "
                             "--raw, copy that folder to the object store, then run on it")
        if not Path(export_from).exists():
            raise StoreError(f"{export_from}: no such store")
        con = duckdb.connect(export_from, read_only=True)
        try:
            export_raw(con, raw)
        finally:
            con.close()
    if not _URI.match(raw):
        # a URI is checked by load_raw, through Hadoop's file system, once Spark runs
        for table in RAW_TABLES:
            if not (Path(raw) / table).is_dir():
                raise StoreError(f"{raw}: no {table}/ folder (export one with --db STORE)")
    try:
        built = run(raw, out, master=master, driver_memory=driver_memory, conf=conf)
    except FileNotFoundError as exc:
        raise StoreError(f"{exc} (export one with --db STORE)") from None
    for name in built.written:
        print(_child(_location(out), name))
    for name, why in {**built.failed, **built.skipped}.items():
        print(f"not built: {name}: {why}", file=sys.stderr)
    return 0
