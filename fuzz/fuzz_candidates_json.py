"""Coverage-guided fuzzing of the recorder's candidates JSON formatter
(collectors/router/_native.c).

The input bytes are read (atheris' FuzzedDataProvider) as candidate rows: one value per field,
mostly of the field's type, sometimes None or another type, with edge values (int64 bounds,
non-finite and subnormal floats, escapes and non-ASCII in strings). The sanitized formatter must
never crash or trip ASan/UBSan; when it answers, its text must be strict JSON holding the same
objects, keys in the same order, as the Python formatter's (orjson) for the same rows. Run
through ``fuzz/run.sh``.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import _sanitized
import atheris

_sanitized.load("collectors.router._native")  # before the recorder configures the in-place one
from collectors.router import _recorder  # noqa: E402

_EDGE_INTS = [0, -1, 1, 2**63 - 1, -(2**63), 2**63, -(2**63) - 1, 2**64, 10**30]
_EDGE_FLOATS = [0.0, -0.0, 5e-324, 1e-4, 9.9999e-05, 1e15, 1e16, 1e22, 1.7976931348623157e308,
                float("inf"), float("-inf"), float("nan"), 0.1 + 0.2]


def _value(fdp: Any, kind: int) -> Any:
    pick = fdp.ConsumeIntInRange(0, 9)
    if pick == 0:
        return None
    if pick == 1:  # a value of another type: the formatter must decline, never misformat
        return fdp.PickValueInList([b"x", [1], 1.5, 3, True, "s", {"a": 1}])
    if kind == _recorder._T_STR:
        return fdp.ConsumeUnicode(fdp.ConsumeIntInRange(0, 40))
    if kind == _recorder._T_BOOL:
        return fdp.ConsumeBool()
    if kind == _recorder._T_INT:
        return fdp.PickValueInList(_EDGE_INTS) if pick == 2 else fdp.ConsumeInt(8)
    if pick == 2:
        return fdp.PickValueInList(_EDGE_FLOATS)
    return fdp.ConsumeInt(8) if pick == 3 else fdp.ConsumeRegularFloat()


def _python(rows: list[tuple[Any, ...]], chosen: int, t: int) -> str:
    native, _recorder._native_candidates_json = _recorder._native_candidates_json, None
    try:
        return _recorder._candidates_json(rows, chosen, t)[0]
    finally:
        _recorder._native_candidates_json = native


def _strict(text: str) -> Any:
    def refuse(constant: str) -> None:
        raise AssertionError(f"not strict JSON: {constant}")
    return json.loads(text, parse_constant=refuse)


def test_one_input(data: bytes) -> None:
    fdp = atheris.FuzzedDataProvider(data)
    t = fdp.ConsumeIntInRange(0, 2**63 - 1)
    chosen = fdp.ConsumeIntInRange(-1, 8)
    n = fdp.ConsumeIntInRange(0, 8)
    spec = _recorder._JSON_SPEC
    width = len(spec) if fdp.ConsumeIntInRange(0, 15) else fdp.ConsumeIntInRange(0, len(spec) + 2)
    rows = [tuple(_value(fdp, spec[i][1] if i < len(spec) else _recorder._T_STR) for i in range(width))
            for _ in range(n)]
    native = _recorder._native_candidates_json
    assert native is not None
    try:
        text = native(rows, chosen, t)
    except (TypeError, ValueError, OverflowError):
        return  # a refusal the recorder catches; the Python path then formats the rows
    if text is None:
        return
    got = _strict(text)
    try:
        reference = _python(rows, chosen, t)
    except TypeError:
        # orjson refuses a str holding a lone surrogate, which the C formatter writes as a
        # \ud8xx escape; that text is checked for strict JSON above, with nothing to compare
        return
    want = _strict(reference)
    if [list(o.items()) for o in got] != [list(o.items()) for o in want]:
        raise AssertionError(f"C formatter {text!r} != Python {json.dumps(want)!r}")


if __name__ == "__main__":
    assert _recorder._native_candidates_json is sys.modules["collectors.router._native"].candidates_json
    atheris.Setup(sys.argv, test_one_input)
    atheris.Fuzz()
