"""Write the seed corpora of the three harnesses from real inputs.

``otlp_decode``: the OTLP captures in tests/testdata/otlp, each behind a flag byte (prompts
dropped / kept). ``otlp_json``: the same requests as OTLP/JSON (hex ids), compact and indented.
``candidates_json``: byte strings the harness reads as candidate rows.
"""

from __future__ import annotations

import base64
import json
import sys
from pathlib import Path
from typing import Any

from google.protobuf import json_format
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

ROOT = Path(__file__).resolve().parent.parent


def _hex_ids(doc: dict[str, Any]) -> dict[str, Any]:
    """protobuf's JSON mapping writes bytes as base64; OTLP/JSON writes ids as hex."""
    for rs in doc.get("resourceSpans", []):
        for ss in rs.get("scopeSpans", []):
            for sp in ss.get("spans", []):
                for node in (sp, *sp.get("links", [])):
                    for key in ("traceId", "spanId", "parentSpanId"):
                        if key in node:
                            node[key] = base64.b64decode(node[key]).hex()
    return doc


def main(out: Path) -> None:
    dirs = {name: out / name for name in ("otlp_decode", "otlp_json", "candidates_json")}
    for d in dirs.values():
        d.mkdir(parents=True, exist_ok=True)
    captures = sorted((ROOT / "tests" / "testdata" / "otlp").glob("*.pb"))
    if not captures:
        raise SystemExit("no OTLP captures under tests/testdata/otlp")
    for pb in captures:
        body = pb.read_bytes()
        (dirs["otlp_decode"] / f"{pb.stem}.drop").write_bytes(b"\x00" + body)
        (dirs["otlp_decode"] / f"{pb.stem}.keep").write_bytes(b"\x01" + body)
        req = ExportTraceServiceRequest()
        req.ParseFromString(body)
        doc = _hex_ids(json_format.MessageToDict(req))
        (dirs["otlp_json"] / f"{pb.stem}.json").write_text(json.dumps(doc, separators=(",", ":")))
        (dirs["otlp_json"] / f"{pb.stem}.indented.json").write_text(json.dumps(doc, indent=2))
    for i, seed in enumerate((b"\x05" * 200, bytes(range(256)) * 2, b"\xff\x07" * 150)):
        (dirs["candidates_json"] / f"seed{i}").write_bytes(seed)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
