"""What the shape of its input costs the writer (docs/performance.md, "Less text per row").

``Store.append`` in isolation, in groups of ``--group`` spans with their events (fresh trace ids
per copy, so nothing is a duplicate; a group is many decoded 512-span tables, one Arrow chunk
each, as the collector's writer concatenates them), for the testbed's spans
(``benchmarks/ingest.py``'s templates) decoded by the collector's decoder, in three forms,
interleaved for ``--rounds``:

- ``stored once``: the decoder's ``raw_spans.attributes`` (what no typed column holds exactly),
  inserted as ``Store.append`` does (``audit._store.as_inserted``: all-null columns left out,
  one chunk);
- ``every column``: the same tables inserted as they come (every column, chunked), as the
  writer did before it left all-null columns out and combined the chunks;
- ``whole``: every span attribute in the JSON, as stores written by older versions keep it
  (rebuilt from the same requests by the Python decoder's value converter).

Prints spans per second (wall) and per CPU second of this process (DuckDB's threads included).

    python3 benchmarks/append_bytes.py --cache /tmp/templates.pkl
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))


def whole_json(bodies: list[bytes]) -> list[str]:
    """Every span's attributes as one JSON text, in the decoder's span order."""
    import semconv
    from collectors.otlp._decode import _JSON, _ValueConverter, parse_protobuf

    out = []
    for body in bodies:
        for rs in parse_protobuf(body).resource_spans:
            for ss in rs.scope_spans:
                for sp in ss.spans:
                    conv = _ValueConverter()
                    attrs = conv.attrs(sp.attributes, True)
                    if conv.apart_string:  # stored as rows either way
                        attrs.pop(semconv.DECISION_CANDIDATES)
                    out.append(_JSON(attrs))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cache", type=Path, default=None, help="templates pickle (benchmarks/ingest.py)")
    ap.add_argument("--requests", type=int, default=1024, help="testbed requests for templates")
    ap.add_argument("--group", type=int, default=65_536, help="spans per append (the collector's groups)")
    ap.add_argument("--spans", type=int, default=500_000, help="spans appended per form and round")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()

    import pyarrow as pa
    import pyarrow.compute as pc
    from ingest import make_templates

    import audit._store
    from audit._store import Store, as_inserted
    from collectors.otlp._decode import decode_protobuf

    bodies = make_templates(args.requests, 512, args.cache)
    decoded = [decode_protobuf(b, time.time_ns()) for b in bodies]
    spans = pa.concat_tables([d.spans for d in decoded])
    events = pa.concat_tables([d.events for d in decoded])
    whole = whole_json(bodies)
    if len(whole) != spans.num_rows:
        raise SystemExit(f"{len(whole)} whole JSON texts for {spans.num_rows} decoded spans")
    col = spans.schema.get_field_index("attributes")
    forms = {"stored once": spans, "every column": spans,
             "whole": spans.set_column(col, "attributes", pa.array(whole, pa.string()))}
    for name, t in forms.items():
        chars = sum(len(x or "") for x in t.column("attributes").to_pylist()) / t.num_rows
        print(f"{name:12} attributes: {chars:,.0f} characters per span on average")
    copies = max(1, args.group // spans.num_rows)
    tags = iter(range(1, 1 << 31))

    def tagged(t: pa.Table, prefix: str) -> pa.Table:
        return t.set_column(0, "trace_id", pc.binary_join_element_wise(
            pa.scalar(prefix), pc.utf8_slice_codeunits(t.column("trace_id"), 8), ""))

    for rnd in range(args.rounds):
        for name, form in forms.items():
            # the only difference of "every column": Store.append takes its input as it comes
            audit._store.as_inserted = (lambda t: t) if name == "every column" else as_inserted
            with tempfile.TemporaryDirectory() as tmp:
                store = Store(Path(tmp) / "s.duckdb", refresh_interval_s=3600)
                n, wall, cpu = 0, 0.0, 0.0
                while n < args.spans:
                    prefixes = [f"{next(tags):08x}" for _ in range(copies)]
                    s2 = pa.concat_tables([tagged(form, p) for p in prefixes])
                    e2 = pa.concat_tables([tagged(events, p) for p in prefixes])
                    c0, w0 = time.process_time(), time.perf_counter()
                    store.append(spans=s2, events=e2)
                    if n + s2.num_rows >= args.spans:
                        store.checkpoint()  # the last checkpoint is part of the cost
                    wall += time.perf_counter() - w0
                    cpu += time.process_time() - c0
                    n += s2.num_rows
                store._dirty = False  # measure the writer alone: no relation rebuild at close
                store.close()
            print(f"round {rnd + 1}  {name:12} {n / wall:9,.0f} spans/s   {n / cpu:9,.0f} spans per CPU second",
                  flush=True)


if __name__ == "__main__":
    main()
