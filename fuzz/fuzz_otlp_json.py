"""Coverage-guided fuzzing of the OTLP/JSON transcoder (collectors/otlp/_json_native.c).

Each input is an OTLP/JSON body (mutated from the JSON form of the captures in
tests/testdata/otlp). The sanitized transcoder must never crash or trip ASan/UBSan; when it
answers, its bytes must equal what the Python path builds from the same text
(``build_request(json.loads(text)).SerializeToString()``), and it must decline (None) every body
the Python path does not build. Run through ``fuzz/run.sh``.
"""

from __future__ import annotations

import sys
from typing import Any

import _sanitized
import atheris

_sanitized.load("collectors.otlp._json_native")  # before collectors.otlp imports the in-place one
import collectors.otlp._decode  # noqa: E402,F401  (imports the transcoder it uses)
from collectors.otlp._otlp_json import MAX_BUILT_DEPTH, reference_transcode  # noqa: E402

TRANSCODER: Any = sys.modules["collectors.otlp._json_native"]


_built = reference_transcode


def test_one_input(data: bytes) -> None:
    wire = TRANSCODER.transcode(data, MAX_BUILT_DEPTH)
    if wire is None:
        return  # declining is always allowed: the Python path then takes the body
    built = _built(data)
    if built is None:
        raise AssertionError("the transcoder answered for a body the Python path does not build")
    if wire != built:
        raise AssertionError(f"transcoded bytes differ from the Python path's ({len(wire)} vs {len(built)})")


if __name__ == "__main__":
    assert sys.modules["collectors.otlp._decode"]._json_native is TRANSCODER
    atheris.Setup(sys.argv, test_one_input)
    atheris.Fuzz()
