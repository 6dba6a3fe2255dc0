"""Merge speed: ``audit.merge.merge`` of two stores split by trace id (a testbed ``mixed`` replay
through the real OpenTelemetry SDK, encoded and decoded as a collector does), into a new target.
Prints seconds and spans per second for: the first merge copying only, the target's refresh, a
merge that finds nothing new, and a merge after 10 % more traffic.

    python3 benchmarks/merge_speed.py [--requests 12000] [--dir DIR] [--live]

``--live`` reads the first source through a ``routeaudit collect`` process running on it (the
query endpoint, Arrow over HTTP) instead of opening it read-only.

All spans of a run are received within a minute or two, so the merge after more traffic reads
the minutes it shares with the earlier run again (and copies only the new spans); a fleet's
spans spread over the minutes of receipt time and a later merge reads only the new minutes.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path and not os.environ.get("PYTHONPATH"):
    sys.path.insert(0, str(REPO))  # run from a checkout without PYTHONPATH


def _spans(seed: int, n: int) -> list[Any]:
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    import testbed
    from testbed.emit import OTelEmitter

    mem = InMemorySpanExporter()
    em = OTelEmitter(mem, batch=False)
    testbed.prepare_scenario("mixed", seed=seed, n_requests=n, replicas=8, emitter=em).run()
    em.close()
    return list(mem.get_finished_spans())


def _load(paths: list[Path], spans: list[Any]) -> None:
    """Spans into the stores by trace id, 2,000 per export, as two collectors would store them."""
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

    from audit import Store
    from collectors.otlp._decode import decode_protobuf

    stores = [Store(p, incremental=False) for p in paths]
    try:
        for i in range(0, len(spans), 2000):
            chunk = spans[i:i + 2000]
            for k, store in enumerate(stores):
                part = [s for s in chunk if s.context.trace_id % len(stores) == k]
                if part:
                    b = decode_protobuf(encode_spans(part).SerializeToString(), time.time_ns())
                    store.append(spans=b.spans, events=b.events)
    finally:
        for store in stores:
            store.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=12_000)
    ap.add_argument("--dir", type=Path, default=None, help="work folder (default: a temporary one)")
    ap.add_argument("--live", action="store_true", help="read source a through a running collector")
    args = ap.parse_args()
    from audit.merge import merge

    work = args.dir or Path(tempfile.mkdtemp(prefix="merge-speed-"))
    work.mkdir(parents=True, exist_ok=True)
    sources = [work / "a.duckdb", work / "b.duckdb"]
    target = work / "merged.duckdb"
    for p in work.glob("*.duckdb*"):
        shutil.rmtree(p) if p.is_dir() else p.unlink()
    started = time.perf_counter()
    first = _spans(0, args.requests)
    _load(sources, first)
    print(f"sources: {len(first):,} spans in two stores, built in "
          f"{time.perf_counter() - started:.1f} s", flush=True)
    proc = None
    if args.live:
        from collectors.routers import free_port

        port = free_port()
        proc = subprocess.Popen([sys.executable, "-m", "routeaudit", "collect", "--db",
                                 str(sources[0]), "--http-port", str(port), "--grpc-port", "0"],
                                cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        import httpx

        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.2)
    try:
        def timed(label: str, **kw: Any) -> None:
            t = time.perf_counter()
            r = merge(target, sources, **kw)
            s = time.perf_counter() - t
            read = sum(x.spans_read for x in r.sources)
            rate = f", {r.spans_new / s:,.0f} new spans/s" if r.spans_new else ""
            refresh = f"; refresh ({r.refresh_kind}) {r.refresh_s:.2f} s" if r.refresh_kind != "none" else ""
            print(f"{label}: {s:.2f} s, {read:,} spans read, {r.spans_new:,} new{rate}{refresh}",
                  flush=True)

        timed("first merge, copy only", refresh=False)
        timed("refresh of the target")
        timed("nothing new")
        if proc is not None:
            proc.send_signal(signal.SIGTERM)
            proc.wait(120)
            proc = None
        _load(sources, _spans(1, max(1, args.requests // 10)))
        timed("after 10 % more traffic")
    finally:
        if proc is not None:
            proc.send_signal(signal.SIGTERM)
            proc.wait(120)
    return 0


if __name__ == "__main__":
    sys.exit(main())
