"""Coverage-guided fuzzing of the native OTLP protobuf decoder (collectors/otlp/_native.c).

Each input is an OTLP ``ExportTraceServiceRequest`` body (mutated from the captures in
tests/testdata/otlp). The sanitized C decoder must never crash or trip ASan/UBSan, and its result
must equal the pure-Python decoder's on the same bytes: equal tables, rejections and counters,
or both refusing the body. Run through ``fuzz/run.sh`` (it sets up the sanitizer runtime).
"""

from __future__ import annotations

import sys
from typing import Any

import _sanitized
import atheris

_sanitized.load("collectors.otlp._native")  # before collectors.otlp imports the in-place one
from collectors.otlp import _decode  # noqa: E402

DECODE: Any = _decode  # its private switch to the Python path

NOW = 1_764_000_000 * 10**9


def _python(body: bytes, keep: bool) -> _decode.DecodedBatch | None:
    native, DECODE._native = DECODE._native, None
    try:
        return _decode.decode_protobuf(body, NOW, keep_prompts=keep)
    except _decode.PayloadError:
        return None
    finally:
        DECODE._native = native


def test_one_input(data: bytes) -> None:
    if not data:
        return
    keep = bool(data[0] & 1)  # both drop-pattern tables (prompts dropped, kept)
    body = data[1:]
    try:  # the sanitized C decoder first, so a memory error is reported as such
        got: _decode.DecodedBatch | None = _decode.decode_protobuf(body, NOW, keep_prompts=keep)
    except _decode.PayloadError:
        got = None
    want = _python(body, keep)
    if want is None or got is None:
        if (want is None) != (got is None):
            raise AssertionError(f"one decoder refused the body: python={want is not None} "
                                 f"native={got is not None}")
        return
    for name in ("spans", "events"):
        if not getattr(got, name).equals(getattr(want, name)):
            raise AssertionError(f"{name} tables differ")
    for name in ("rejected", "truncated_values", "prompt_values_dropped", "duplicate_spans",
                 "candidate_json_malformed"):
        if getattr(got, name) != getattr(want, name):
            raise AssertionError(f"{name}: native {getattr(got, name)!r} != python {getattr(want, name)!r}")


if __name__ == "__main__":
    assert DECODE._native is sys.modules["collectors.otlp._native"]
    atheris.Setup(sys.argv, test_one_input)
    atheris.Fuzz()
