"""Always-on soak: a collector left running under steady traffic, sampled every ``--sample-s``.

The collector is ``python -m collectors.otlp`` in its own process on a fresh store in a temporary
folder, with the collector's defaults: no spool, the background refresh every 2 s (paced to a
quarter of the time while the writer's queue is behind), ``--refresh-mode auto`` (full rebuilds
below 20,000 spans, slices of event time from there on: what a user who starts ``routeaudit
collect`` gets). Only the store's partitioning is not the default: the collector creates the
store with ``--partition`` ``--partition-s`` (60 s) and ``--max-request`` ``--max-request-s``
(60 s) (docs/architecture.md, "Partitions and windows"), so a slice recomputes about a minute
of traffic and partitions close to Parquet within minutes (about 10 at these settings; 28 at
the defaults, ``--partition-s 0``).

Traffic: ``--senders`` processes run the testbed's virtual-time simulator (``hot_prefix``,
``qp_cost`` router, no ground truth) for fleets of 8 replicas at ``--fleet-rate`` requests/s
each, enough fleets for ``--rate`` in all. Each fleet's clock starts at the soak's start (Unix
ns), and each finished request is handed to the testbed's ``OTelEmitter`` only once the wall
clock has reached its end, so spans arrive as a live fleet sends them: fresh trace and request
ids, timestamps of now. A fleet is a new run (run id) every ``--run-minutes``; its replicas keep
their names. The spans of a sender's components go through the real OpenTelemetry SDK: one
``BatchSpanProcessor`` (as an agent beside the fleet batches) and ``OTLPSpanExporter`` over
OTLP/HTTP protobuf, which retries 429/503. A span counts as acknowledged when its export
returned SUCCESS; ``sender behind`` is how late (wall clock minus the request's end) the
simulator handed a request to the SDK, non-zero when the senders cannot keep up.

Every ``--sample-s`` seconds: the collector's RSS (/proc), the spans committed, the background
refreshes (count, seconds, the last one's duration), ``closed_until_ns``, ``last_close_ms`` and
``last_checkpoint_ms`` from ``/health``, the size of the store's WAL (``<db>.wal``; it falls to 0
at each checkpoint), the store's bytes on disk (blocks allocated to its DuckDB file, WAL and
closed partitions' Parquet), and the lag of ``attributions``:

* ``newest complete`` = the newest ``start_ns`` of a ``routeaudit.client`` span in
  ``raw_spans``. The client span ends last and is sent when the request has ended, so this is
  the newest complete request's anchor (its earliest start: client and router start together),
  on the reference clock (the testbed's client; all its components share one clock, the
  store's offsets are 0). Read through the collector's ``POST /routeaudit/query``
  (``audit.open``), the supported way to read a store a collector writes; a query of raw tables
  only never waits for a rebuild.
* ``newest judged`` = ``newest_request_ns`` of ``/health``: the newest anchor in the stored
  ``requests`` relation, written in the same refresh transaction as the default-SLO tables of
  ``attributions``, so every request up to it has been judged. Read from ``/health`` rather
  than by querying ``attributions``, since a query of a relation would itself start a rebuild
  when one is due (docs/architecture.md, "Freshness") and so change what is measured.
* ``lag`` = newest complete - newest judged, seconds of event time, 0 when negative (a
  request whose decision arrived before its client span). ``verdict age`` = wall clock -
  newest judged, which adds the request's own duration and the export delay.

At the end the senders stop (every acknowledged span must be committed), the store is counted
through the collector (``raw_spans`` includes the closed partitions in Parquet), and the
summary prints the lag's p50/p99/max (samples from ``--warmup-s`` on), the mean refresh
duration in minute 5 and in the last minute, RSS at minute 5 and at the end, acknowledged vs
stored spans and whether partitions closed. With the collector's retention on
(``--collector-arg=--retain-raw --collector-arg=12m``, ``--retain-verdicts``), the spans it
deleted count as stored (``retention_spans_deleted``), and the summary gives the disk when its
counters first show a deletion, its maximum after that and in the second half of the time after
it, with and without the WAL: a store that keeps a fixed width of time holds its disk level from
then on. It ends with the range the store says it covers (``store_range``, the dashboard's).

    python3 benchmarks/always_on_soak.py --rate 200 --minutes 2
    python3 benchmarks/always_on_soak.py --rate 200 --minutes 30
    python3 benchmarks/always_on_soak.py --rate 50 --minutes 30 --senders 1 \
        --collector-arg=--retain-raw --collector-arg=12m \
        --collector-arg=--retain-verdicts --collector-arg=16m
"""

from __future__ import annotations

import argparse
import math
import multiprocessing as mp
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from ingest import _cpu_seconds, _rss  # noqa: E402

from collectors.routers import free_port  # noqa: E402

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import ReadableSpan
    from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

    from testbed.emit import RequestTrace, SpanEmitter

REPLICAS_PER_FLEET = 8
"""Each fleet: 8 replicas, so a decision has 8 candidates, as in the other benchmarks."""


# -- senders ------------------------------------------------------------------------------------
class _Shared:
    """Counters a sender process shares with the soak (``multiprocessing.Value``)."""

    def __init__(self) -> None:
        self.requests = mp.Value("q", 0)
        self.spans_handed = mp.Value("q", 0)
        """Spans handed to the SDK's processor (beyond its queue's 131,072 it drops them)."""
        self.spans_acked = mp.Value("q", 0)
        self.spans_failed = mp.Value("q", 0)
        self.behind_max_ms = mp.Value("d", 0.0)
        """Most a request was handed to the SDK after its end since the soak last read this."""


def _sdk_pipeline(url: str, shared: _Shared) -> tuple[Any, SpanExporter]:
    """(the sender's ``BatchSpanProcessor`` over a counting ``OTLPSpanExporter``, an exporter for
    the ``OTelEmitter``s that hands their spans to that processor)."""
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

    class Counting(SpanExporter):
        def __init__(self) -> None:
            self.inner = OTLPSpanExporter(endpoint=url, timeout=60)

        def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
            result = self.inner.export(spans)
            counter = shared.spans_acked if result == SpanExportResult.SUCCESS else shared.spans_failed
            with counter.get_lock():
                counter.value += len(spans)
            return result

        def shutdown(self) -> None:
            self.inner.shutdown()  # type: ignore[no-untyped-call]

    batch = BatchSpanProcessor(Counting(), max_queue_size=1 << 17, max_export_batch_size=512,
                               schedule_delay_millis=500)

    class ToBatch(SpanExporter):
        """Each emitter's spans into the one processor (the emitters' providers export
        synchronously); closing an emitter leaves the processor running."""

        def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
            for span in spans:
                batch.on_end(span)
            with shared.spans_handed.get_lock():
                shared.spans_handed.value += len(spans)
            return SpanExportResult.SUCCESS

        def force_flush(self, timeout_millis: int = 30_000) -> bool:
            return bool(batch.force_flush(timeout_millis))

        def shutdown(self) -> None:
            pass

    return batch, ToBatch()


class _Paced:
    """A :class:`~testbed.emit.SpanEmitter` that hands each finished request on once the wall
    clock has reached its end (the simulator finishes requests in end order)."""

    def __init__(self, inner: SpanEmitter, shared: _Shared) -> None:
        self.inner = inner
        self.shared = shared

    def emit(self, t: RequestTrace) -> None:
        late_s = (time.time_ns() - t.end_ns) / 1e9
        if late_s < 0:
            time.sleep(-late_s)
        else:
            with self.shared.behind_max_ms.get_lock():
                self.shared.behind_max_ms.value = max(self.shared.behind_max_ms.value, late_s * 1e3)
        self.inner.emit(t)
        with self.shared.requests.get_lock():
            self.shared.requests.value += 1

    def close(self) -> None:
        self.inner.close()


def _fleet(name: str, rate: float, start_ns: int, seconds: float, run_s: float, seed: int,
           exporter: SpanExporter, shared: _Shared) -> None:
    """One fleet's traffic from ``start_ns`` for ``seconds``: a run per ``run_s``."""
    from testbed import FleetConfig, RouterConfig, Simulation
    from testbed.emit import OTelEmitter
    from testbed.workloads import hot_prefix

    rng = random.Random(seed)
    k = 0
    while k * run_s < seconds:
        length = min(run_s, seconds - k * run_s)
        reqs = [r for r in hot_prefix(math.ceil(rate * length * 1.1) + 10, rng, rate=rate)
                if r.arrival_s < length]
        cfg = FleetConfig(n_replicas=REPLICAS_PER_FLEET, router=RouterConfig(policy="qp_cost"),
                          t0_ns=start_ns + int(k * run_s * 1e9))
        emitter = _Paced(OTelEmitter(exporter, batch=False), shared)
        sim = Simulation(reqs, cfg, seed=rng.getrandbits(32), scenario="soak", emitter=emitter,
                         run_id=f"soak-{name}-r{k}", ground_truth=False)
        # one fleet's replicas and routers keep their names from run to run, and differ from
        # every other fleet's (the simulator numbers them from 0)
        for rep in sim.replicas:
            rep.id = f"{name}-{rep.id}"
        for router in sim.routers:
            router.id = f"{name}-{router.id}"
        sim.run()
        emitter.close()
        k += 1


def sender(url: str, idx: int, rates: list[float], start_ns: int, seconds: float, run_s: float,
           shared: _Shared) -> None:
    batch, exporter = _sdk_pipeline(url, shared)
    threads = [threading.Thread(target=_fleet, args=(f"s{idx}f{j}", rate, start_ns, seconds, run_s,
                                                     1000 * idx + j, exporter, shared), daemon=True)
               for j, rate in enumerate(rates)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    batch.shutdown()  # flushes what is queued


# -- the soak -----------------------------------------------------------------------------------
@dataclass
class Sample:
    t_s: float
    rss_mib: float
    committed: int
    acked: int
    refreshes: int
    refresh_s: float
    last_refresh_ms: float | None
    lag_s: float | None
    age_s: float | None
    behind_ms: float
    closed_until_ns: int | None
    last_close_ms: float | None
    last_checkpoint_ms: float | None
    wal_mib: float
    disk_mib: float
    retained_spans: int
    retained_requests: int
    query_ms: float
    load1: float


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:  # no WAL: everything checkpointed
        return 0


def _disk(db: Path) -> int:
    """Bytes on disk of the store: its DuckDB file, WAL and closed partitions' folder (blocks
    allocated, so a file DuckDB leaves sparse counts what it holds)."""
    paths = [db, Path(f"{db}.wal")]
    folder = Path(f"{db}.parquet")
    if folder.is_dir():
        paths += [Path(root) / name for root, _, names in os.walk(folder) for name in names]
    total = 0
    for path in paths:
        try:
            total += path.stat().st_blocks * 512
        except OSError:  # gone between the listing and the stat (a close or retention)
            pass
    return total


def _retained_spans(base: str) -> int:
    """The spans the collector's retention has deleted so far (``/health``)."""
    import httpx

    return int(httpx.get(f"{base}/health", timeout=60).json()["counters"].get(
        "retention_spans_deleted", 0))


def _pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, math.ceil(q * len(s)) - 1))]


def soak(args: argparse.Namespace) -> int:
    import httpx

    import audit
    import semconv as sc
    from audit import queries

    fleets = max(1, math.ceil(args.rate / args.fleet_rate))
    per_fleet = args.rate / fleets
    senders = min(args.senders, fleets)
    tmp = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="ra-soak-"))
    tmp.mkdir(parents=True, exist_ok=True)
    db = tmp / "audit.duckdb"
    wal = Path(f"{db}.wal")
    # a SIGTERM stops the senders and the collector too (the finally below)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(3))
    port = free_port()
    log = open(tmp / "collector.log", "wb")  # noqa: SIM115 - closed in the finally below
    partitioning = (["--partition", f"{args.partition_s:g}s", "--max-request", f"{args.max_request_s:g}s"]
                    if args.partition_s > 0 else [])
    proc = subprocess.Popen([sys.executable, "-m", "collectors.otlp", "--db", str(db),
                             "--http-port", str(port), "--grpc-port", "-1", *partitioning,
                             *args.collector_arg],
                            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=log)
    base = f"http://127.0.0.1:{port}"
    shared = [_Shared() for _ in range(senders)]
    procs: list[Any] = []
    try:
        for _ in range(600):
            try:
                if httpx.get(f"{base}/health", timeout=30).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        reader = audit.open(db)
        print(f"soak: {args.rate:g} requests/s for {args.minutes:g} min: {fleets} fleets of "
              f"{REPLICAS_PER_FLEET} replicas at {per_fleet:.1f}/s in {senders} sender process(es), "
              f"a run per {args.run_minutes:g} min; partitions "
              + (f"{args.partition_s:g} s, max_request_s {args.max_request_s:g}" if args.partition_s > 0
                 else "at the store's defaults")
              + f"; collector {' '.join(args.collector_arg) or 'at its defaults'}; nproc "
                f"{os.cpu_count()}, load {' '.join(f'{x:.1f}' for x in os.getloadavg())}; store {db}",
              flush=True)
        seconds = args.minutes * 60
        start_ns = time.time_ns() + 1_000_000_000
        for i in range(senders):
            rates = [per_fleet] * (fleets // senders + (1 if i < fleets % senders else 0))
            procs.append(mp.Process(target=sender, args=(f"{base}/v1/traces", i, rates, start_ns,
                                                         seconds, args.run_minutes * 60, shared[i])))
        cpu0 = _cpu_seconds(proc.pid)
        for p in procs:
            p.start()
        t0 = time.perf_counter()
        samples: list[Sample] = []
        print("   t s   RSS MiB  committed      acked  refr (s in them)  last ms   lag s  "
              "age s  sender behind ms  closed   query ms  load  WAL MiB  disk MiB", flush=True)

        def sample() -> Sample:
            q0 = time.perf_counter()
            window = time.time_ns() - 600 * 10**9
            newest = reader.query_arrow(
                "select max(start_ns) from raw_spans where name = ? and start_ns >= ?",
                [sc.SPAN_CLIENT, window]).column(0)[0].as_py()
            query_ms = (time.perf_counter() - q0) * 1e3
            h = httpx.get(f"{base}/health", timeout=60).json()
            now_ns = time.time_ns()
            c = h["counters"]
            # /health rounds counters to whole numbers; /metrics has the seconds exactly
            refresh_s = next((float(line.split()[-1]) for line in httpx.get(
                f"{base}/metrics", timeout=60).text.splitlines() if line.startswith(
                    "routeaudit_collector_background_refresh_seconds_total ")), -1.0)
            judged = h.get("newest_request_ns")
            behind = 0.0
            for s in shared:
                with s.behind_max_ms.get_lock():
                    behind = max(behind, s.behind_max_ms.value)
                    s.behind_max_ms.value = 0.0
            out = Sample(
                t_s=time.perf_counter() - t0, rss_mib=_rss(proc.pid)[0] / 2**20,
                committed=c.get("spans_committed", -1), acked=sum(s.spans_acked.value for s in shared),
                refreshes=c.get("background_refreshes", -1),
                refresh_s=refresh_s,
                last_refresh_ms=h.get("last_refresh_ms"),
                lag_s=(None if judged is None or newest is None else max(0.0, (newest - judged) / 1e9)),
                age_s=None if judged is None else (now_ns - judged) / 1e9, behind_ms=behind,
                closed_until_ns=h.get("closed_until_ns"), last_close_ms=h.get("last_close_ms"),
                last_checkpoint_ms=h.get("last_checkpoint_ms"), wal_mib=_size(wal) / 2**20,
                disk_mib=_disk(db) / 2**20,
                retained_spans=int(c.get("retention_spans_deleted", 0)),
                retained_requests=int(c.get("retention_requests_deleted", 0)),
                query_ms=query_ms,
                load1=os.getloadavg()[0])
            lag = "-" if out.lag_s is None else f"{out.lag_s:.1f}"
            age = "-" if out.age_s is None else f"{out.age_s:.1f}"
            closed = ("-" if out.closed_until_ns is None
                      else f"-{(now_ns - out.closed_until_ns) / 6e10:.1f}m")
            print(f"{out.t_s:6.0f} {out.rss_mib:9,.0f} {out.committed:10,d} {out.acked:10,d} "
                  f"{out.refreshes:5d} ({out.refresh_s:7.1f}) {out.last_refresh_ms or 0:8,.0f} "
                  f"{lag:>7} {age:>6} {out.behind_ms:17,.0f} {closed:>7} {query_ms:10,.0f} "
                  f"{out.load1:5.1f} {out.wal_mib:8,.0f} {out.disk_mib:9,.0f}", flush=True)
            return out

        next_at = t0 + args.sample_s
        while any(p.is_alive() for p in procs):
            time.sleep(max(0.0, min(1.0, next_at - time.perf_counter())))
            if time.perf_counter() >= next_at:
                samples.append(sample())
                next_at += args.sample_s
        for p in procs:
            p.join()
        sent_s = time.perf_counter() - t0
        acked = sum(s.spans_acked.value for s in shared)
        failed = sum(s.spans_failed.value for s in shared)
        requests = sum(s.requests.value for s in shared)
        handed = sum(s.spans_handed.value for s in shared)
        collector_cpu = _cpu_seconds(proc.pid) - cpu0
        # no spool: an acknowledged span is committed; the relations catch up for a while
        for _ in range(6):
            time.sleep(args.sample_s)
            samples.append(sample())
        # spans retention deleted were stored first: acknowledged = stored now + deleted. The
        # count is taken between two equal readings of retention's counter (a run in between
        # would delete spans that neither side counts)
        while True:
            deleted = _retained_spans(base)
            stored = reader.query_arrow("select count(*) from raw_spans").column(0)[0].as_py()
            if _retained_spans(base) == deleted:
                break
        # what the dashboard's sidebar says the store covers, and the raw spans' time
        held = queries.store_range(reader).row(0, named=True)
        raw_from = reader.query_arrow("select min(start_ns) from raw_spans").column(0)[0].as_py()
        warnings = [line for line in (tmp / "collector.log").read_text(errors="replace").splitlines()
                    if " WARNING " in line or " ERROR " in line]
        for line in warnings[:10]:
            print("  collector:", line[:300])
        summarise(args, samples, requests, handed, acked, failed, stored + deleted, deleted, sent_s,
                  collector_cpu)
        if held["first_at"] is not None and raw_from is not None:
            span = (held["last_at"] - held["first_at"]).total_seconds() / 60
            raw_min = (time.time_ns() - raw_from) / 6e10
            print(f"  the store covers {held['requests']:,} requests over {span:.1f} min "
                  f"(store_range, as the dashboard says); its oldest raw span started "
                  f"{raw_min:.1f} min ago")
        return 0 if stored + deleted >= acked else 1
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)


def _minute_refresh(samples: list[Sample], lo_s: float, hi_s: float) -> str:
    """Mean background refresh duration between two times (from the counters), and how many."""
    inside = [s for s in samples if lo_s <= s.t_s <= hi_s]
    if len(inside) < 2 or inside[-1].refreshes <= inside[0].refreshes:
        # long refreshes: the last one that had ended by then
        before = [s for s in samples if s.t_s <= hi_s and s.last_refresh_ms]
        if not before:
            return "no refresh ended yet"
        return (f"none ended in it; the last before it {before[-1].last_refresh_ms / 1e3:.1f} s "  # type: ignore[operator]
                f"(refresh {before[-1].refreshes})")
    n = inside[-1].refreshes - inside[0].refreshes
    return f"{(inside[-1].refresh_s - inside[0].refresh_s) / n:.2f} s mean of {n}"


def summarise(args: argparse.Namespace, samples: list[Sample], requests: int, handed: int,
              acked: int, failed: int, stored: int, deleted: int, sent_s: float,
              collector_cpu: float) -> None:
    """``stored``: the spans stored, ``deleted`` of them since deleted by retention."""
    end = args.minutes * 60
    lags = [s.lag_s for s in samples if s.lag_s is not None and args.warmup_s <= s.t_s <= end]
    ages = [s.age_s for s in samples if s.age_s is not None and args.warmup_s <= s.t_s <= end]
    print(f"\nsummary: {requests:,} requests ({requests / sent_s:,.0f}/s) in {sent_s:,.0f} s; "
          f"spans handed to the SDK {handed:,}, acknowledged {acked:,}, failed exports {failed:,} spans, "
          f"dropped by the SDK's full queue or unanswered {handed - acked - failed:,}; stored {stored:,} "
          + (f"(of which deleted by retention since: {deleted:,}) " if deleted else "")
          + f"({'OK: nothing acknowledged lost' if stored >= acked else 'MISSING SPANS'}); "
          f"collector CPU {collector_cpu / sent_s:.2f} cores; load {samples[-1].load1:.1f} at the end")
    if lags:
        print(f"  lag of attributions behind the newest complete request, {len(lags)} samples "
              f"from {args.warmup_s:g} s: p50 {_pct(lags, 0.5):.1f} s, p99 {_pct(lags, 0.99):.1f} s, "
              f"max {max(lags):.1f} s (goal p99 <= 10 s: {'met' if _pct(lags, 0.99) <= 10 else 'missed'}); "
              f"verdict age p50 {_pct(ages, 0.5):.1f} s, max {max(ages):.1f} s")
    for lo in range(0, math.ceil(end), 300):
        part = [s for s in samples if lo < s.t_s <= min(end, lo + 300) and s.lag_s is not None]
        if part:
            lag5 = [s.lag_s for s in part if s.lag_s is not None]
            print(f"    minutes {lo // 60}-{min(end, lo + 300) / 60:.0f}: lag p50 {_pct(lag5, 0.5):.1f} s, "
                  f"p99 {_pct(lag5, 0.99):.1f} s, max {max(lag5):.1f} s; refreshes "
                  f"{part[-1].refreshes - part[0].refreshes}, load {statistics.mean(s.load1 for s in part):.1f}")
    behind = [s.behind_ms for s in samples if s.t_s <= end]
    if behind:
        print(f"  senders: handed requests to the SDK at most {max(behind) / 1e3:.1f} s after their "
              f"end (p50 of the samples' maxima {statistics.median(behind) / 1e3:.2f} s)")
    last_min = max(60.0, min(end, samples[-1].t_s) - 60)
    m5 = _minute_refresh(samples, 240, 300)
    mn = _minute_refresh(samples, last_min, last_min + 60)
    print(f"  refresh duration: minute 5 {m5}; minute {last_min / 60 + 1:.0f} {mn}")
    at5 = min(samples, key=lambda s: abs(s.t_s - 300))
    tail = [s for s in samples if s.t_s <= end + args.sample_s]
    print(f"  RSS: {at5.rss_mib:,.0f} MiB at {at5.t_s:.0f} s, {tail[-1].rss_mib:,.0f} MiB at "
          f"{tail[-1].t_s:.0f} s, peak sampled {max(s.rss_mib for s in samples):,.0f} MiB")
    closed = [s for s in samples if s.closed_until_ns is not None]
    print("  partitions closed to Parquet: " + (
        f"yes, first seen at {closed[0].t_s:.0f} s; at the end rows anchored before "
        f"{(time.time_ns() - closed[-1].closed_until_ns) / 6e10:.1f} min ago are closed"  # type: ignore[operator]
        if closed else "no"))
    moves = sorted({s.last_close_ms for s in samples if s.last_close_ms is not None})
    if moves:
        # distinct values of /health's last_close_ms: the moves the samples saw, not every one
        print(f"  moves to Parquet seen: {len(moves)}, median {_pct(moves, 0.5) / 1e3:.2f} s, "
              f"longest {moves[-1] / 1e3:.2f} s (each inside its refresh's duration)")
    cut = [s for s in samples if s.retained_spans or s.retained_requests]
    if cut:
        # once retention cuts, what the store holds is a window of time of fixed width: disk
        # bounded means the later samples no larger than those soon after the first cut
        after = [s for s in samples if s.t_s >= cut[0].t_s]
        half = after[len(after) // 2:]
        print(f"  retention: first deletion seen at {cut[0].t_s:.0f} s; disk {cut[0].disk_mib:,.0f} MiB "
              f"then, max {max(s.disk_mib for s in after):,.0f} MiB after it, max in its second half "
              f"{max(s.disk_mib for s in half):,.0f} MiB, {samples[-1].disk_mib:,.0f} MiB at the end "
              f"(at 300 s {at5.disk_mib:,.0f} MiB); without the WAL: max after it "
              f"{max(s.disk_mib - s.wal_mib for s in after):,.0f} MiB, in its second half "
              f"{max(s.disk_mib - s.wal_mib for s in half):,.0f} MiB; deleted "
              f"{samples[-1].retained_spans:,} spans, {samples[-1].retained_requests:,} requests")
    else:
        print(f"  disk: {at5.disk_mib:,.0f} MiB at {at5.t_s:.0f} s, {tail[-1].disk_mib:,.0f} MiB at "
              f"{tail[-1].t_s:.0f} s (no retention)")
    checkpoints = sorted({s.last_checkpoint_ms for s in samples if s.last_checkpoint_ms is not None})
    if checkpoints:
        print(f"  checkpoints between slices seen: {len(checkpoints)}, median "
              f"{_pct(checkpoints, 0.5) / 1e3:.2f} s, longest {checkpoints[-1] / 1e3:.2f} s; WAL at most "
              f"{max(s.wal_mib for s in samples):,.0f} MiB when sampled")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rate", type=float, default=200.0, help="requests/s, all fleets together")
    ap.add_argument("--minutes", type=float, default=2.0)
    ap.add_argument("--fleet-rate", type=float, default=50.0,
                    help="requests/s one fleet of 8 replicas serves (hot_prefix holds about 50)")
    ap.add_argument("--senders", type=int, default=2, help="sender processes (fleets split among them)")
    ap.add_argument("--run-minutes", type=float, default=5.0,
                    help="a fleet starts a new run (run id) this often")
    ap.add_argument("--partition-s", type=float, default=60.0,
                    help="the store's partition width (0: the store's default, 60 s)")
    ap.add_argument("--max-request-s", type=float, default=60.0,
                    help="the store's max_request_s, with --partition-s")
    ap.add_argument("--sample-s", type=float, default=10.0)
    ap.add_argument("--warmup-s", type=float, default=60.0,
                    help="lag samples before this are left out of the percentiles")
    ap.add_argument("--keep", default=None, metavar="DIR", help="keep the store and log here")
    ap.add_argument("--collector-arg", action="append", default=[], metavar="ARG",
                    help="one more argument for the collector (repeat it)")
    sys.exit(soak(ap.parse_args()))


if __name__ == "__main__":
    main()
