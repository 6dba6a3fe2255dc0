"""The hand-written C codecs against maintained libraries, and ingest before/after, in one run.

    pip install ptars==0.0.25     # only this benchmark needs it
    python3 benchmarks/decode_ab.py --before REV [--rounds 2] [--seconds 20] [--ptars-rev REV]

Each figure is taken in a fresh process, rounds interleaved, so that the ratios of one run can
be compared (the machine is shared; rounds show the spread):

1. decode, spans per CPU second over the ingest templates (benchmarks/ingest.py: 512-span
   requests of testbed spans, about 1.5 KB of protobuf a span), best of 3:
   ``c``: ``collectors.otlp._decode.decode_protobuf`` with the C decoder (``_native.c``);
   ``python``: the same call without the C code (upb messages + Python, the reference path);
   ``ptars``: the prototype without hand-written C (ptars parses the protobuf into a nested Arrow
   batch, Arrow compute flattens it and writes the JSON). It is a fork of the decoder kept out of
   the tree, read from git at ``--ptars-rev`` (``benchmarks/ptars_prototype`` there). Its
   tables are first checked equal to the C decoder's.
2. OTLP/JSON → protobuf bytes, spans per CPU second: ``c``: the C transcoder
   (``_json_native.c``); ``orjson``: ``orjson.loads`` + the upb constructors
   (``collectors.otlp._otlp_json.build_request``) + ``SerializeToString``.
3. candidates JSON of 8 candidates, µs: ``c``: ``collectors/router/_native.c``; ``orjson``: the
   recorder's Python path (per-signature plan, ``orjson.dumps``); and the whole decision record
   (``bench_decisions`` of benchmarks/decision_overhead.py, BatchSpanProcessor) with and
   without the C formatter.
4. ingest end to end over OTLP/HTTP protobuf (``end_to_end`` of benchmarks/ingest.py), the
   collector of each tree in its own process: ``before``: the working tree with ``collectors/``
   and ``setup.py`` as of ``REV`` (C built there); ``after``: the working tree.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT))

import ingest  # noqa: E402

PTARS_REV = "a3ea506"
"""The commit whose ``benchmarks/ptars_prototype`` is the ptars decoder measured."""

SWAPPED = ("setup.py", "collectors")
"""Paths taken from ``REV`` for the "before" tree."""

_DECODE = """
import pickle, sys, time
kind, path = sys.argv[1], sys.argv[2]
bodies = pickle.loads(open(path, "rb").read())
if kind == "ptars":
    sys.path.insert(0, sys.argv[3])
    from ptars_prototype.decode import decode_protobuf
    from collectors.otlp._decode import decode_protobuf as reference
    for b in bodies:
        want, got = reference(b, 7), decode_protobuf(b, 7)
        assert got.spans.equals(want.spans) and got.events.equals(want.events), "ptars differs"
else:
    from collectors.otlp import _decode
    if kind == "python":
        _decode._native = None
        _decode._candidate_events._native = None
    decode_protobuf = _decode.decode_protobuf
decode_protobuf(bodies[0], 1)
best = 0.0
for _ in range(3):
    t = time.process_time()
    for b in bodies:
        decode_protobuf(b, time.time_ns())
    best = max(best, 512 * len(bodies) / (time.process_time() - t))
print(best)
"""

_JSON = """
import pickle, sys, time
sys.path.insert(0, "benchmarks")
import ingest
kind, path = sys.argv[1], sys.argv[2]
bodies = [ingest.to_json(b).encode() for b in pickle.loads(open(path, "rb").read())]
from collectors.otlp import _decode
if kind == "orjson":
    _decode._json_native = None
best = 0.0
for _ in range(3):
    t = time.process_time()
    for b in bodies:
        _decode.json_to_protobuf(b)
    best = max(best, 512 * len(bodies) / (time.process_time() - t))
print(best)
"""

_RECORD = """
import json, sys, time
sys.path.insert(0, "benchmarks")
kind, n = sys.argv[1], int(sys.argv[2])
from collectors.router import _recorder
if kind == "orjson":
    _recorder._native_candidates_json = None
t0 = 1_700_000_000_000_000_000
rows = [(f"http://10.0.0.{i}:8000", True, None, i, 3, 0.5, None, t0, 1, None, None, None, float(i), None)
        for i in range(8)]
best = float("inf")
for _ in range(5):
    t = time.process_time()
    for _ in range(n):
        _recorder._candidates_json(rows, 3, t0 + 5000)
    best = min(best, (time.process_time() - t) / n * 1e6)
import decision_overhead
whole = decision_overhead.bench_decisions(max(1000, n // 10))["json"]["recorder"]
print(json.dumps([best, whole]))
"""


def export_tree(rev: str, dest: Path) -> Path:
    """The working tree in ``dest`` with :data:`SWAPPED` as of ``rev`` (files only the working
    tree has there are left out), and its C extensions (if any) built in place."""
    dest.mkdir(parents=True)
    files = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-co", "--exclude-standard", "-z"],
                           check=True, capture_output=True).stdout.decode().split("\0")
    for name in files:
        src = ROOT / name
        if name and src.is_file() and not name.startswith(SWAPPED):
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev, *SWAPPED], check=True,
                             capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    subprocess.run([sys.executable, "setup.py", "build_ext", "--inplace"], cwd=dest, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return dest


def export_prototype(rev: str, dest: Path) -> Path:
    """``benchmarks/ptars_prototype`` as of ``rev``, under ``dest`` (put ``dest`` on the path)."""
    dest.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev, "benchmarks/ptars_prototype"],
                             check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "--strip-components=1", "-C", str(dest)], input=archive, check=True)
    return dest


def _run(tree: Path, code: str, *args: str) -> str:
    env = dict(os.environ, PYTHONPATH=str(tree))
    return subprocess.run([sys.executable, "-c", code, *args], cwd=tree, env=env, check=True,
                          capture_output=True, text=True).stdout.strip().splitlines()[-1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before", default="HEAD", metavar="REV", help="revision for the ingest 'before'")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--seconds", type=float, default=20.0, help="end-to-end run per side and round")
    ap.add_argument("--senders", type=int, default=4)
    ap.add_argument("--calls", type=int, default=20000, help="candidates JSON calls per figure")
    ap.add_argument("--skip", nargs="*", default=[], choices=["decode", "json", "record", "ingest"])
    ap.add_argument("--ptars-rev", default=PTARS_REV, metavar="REV",
                    help="commit holding benchmarks/ptars_prototype (default %(default)s)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="ra-ab-") as tmp:
        cache = Path(tmp) / "templates.pkl"
        bodies = ingest.make_templates(512, 512, cache)
        before = export_tree(args.before, Path(tmp) / "before") if "ingest" not in args.skip else ROOT
        prototype = export_prototype(args.ptars_rev, Path(tmp) / "prototype") if "decode" not in args.skip else ROOT
        print(f"machine: nproc {os.cpu_count()}, load {os.getloadavg()[0]:.1f}; {len(bodies)} requests "
              f"of 512 spans; ingest before = {args.before}, after = working tree", flush=True)
        results: dict[str, list[float]] = {}

        def note(name: str, value: float) -> None:
            results.setdefault(name, []).append(value)

        for rnd in range(args.rounds):
            if "decode" not in args.skip:
                for kind in ("c", "python", "ptars"):
                    note(f"decode spans/s {kind}", float(_run(ROOT, _DECODE, kind, str(cache), str(prototype))))
            if "json" not in args.skip:
                for kind in ("c", "orjson"):
                    note(f"OTLP/JSON→protobuf spans/s {kind}", float(_run(ROOT, _JSON, kind, str(cache))))
            if "record" not in args.skip:
                for kind in ("c", "orjson"):
                    fmt, whole = json.loads(_run(ROOT, _RECORD, kind, str(args.calls)))
                    note(f"candidates JSON µs {kind}", fmt)
                    note(f"decision record µs {kind}", whole)
            if "ingest" not in args.skip:
                for side, tree in (("before", before), ("after", ROOT)):
                    ingest.ROOT = tree  # the collector process runs from this tree
                    r = ingest.end_to_end("http", bodies, 512, args.senders, args.seconds)
                    note(f"ingest spans/s {side}", r["spans_per_s"])
                    note(f"ingest collector cores {side}", r["collector_cpu_s"] / r["wall_s"])
                    if r["stored"] < r["acked"]:
                        print(f"  {side}: MISSING SPANS (acked {r['acked']}, stored {r['stored']})")
            print(f"round {rnd + 1}: " + "  ".join(f"{k} {v[-1]:,.1f}" for k, v in results.items()),
                  flush=True)
        print("means over the rounds:")
        for name, values in results.items():
            print(f"  {name:36s} {sum(values) / len(values):12,.1f}")
        pairs = [("decode spans/s", "ptars", "c"), ("decode spans/s", "python", "c"),
                 ("OTLP/JSON→protobuf spans/s", "orjson", "c"), ("candidates JSON µs", "orjson", "c"),
                 ("decision record µs", "orjson", "c"), ("ingest spans/s", "after", "before")]
        print("ratios:")
        for name, a, b in pairs:
            if f"{name} {a}" in results and f"{name} {b}" in results:
                va, vb = (sum(results[f"{name} {k}"]) / len(results[f"{name} {k}"]) for k in (a, b))
                print(f"  {name:28s} {a} / {b} = {va / vb:.2f}")


if __name__ == "__main__":
    main()
