"""The C expansion of the candidates JSON (``_native.expand_candidates``) against the Python one.

``_candidate_events.expand(native=True)`` must give exactly what ``expand(native=False)`` gives:
the same span and event tables and the same malformed count, for every text. The C code handles
the plain texts itself and leaves every other batch to Python; these tests check both that the
results are equal and that the plain texts really take the C path (else equality is free).
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import semconv
from audit.schema import RAW_SPAN_EVENTS_SCHEMA, RAW_SPANS_SCHEMA
from collectors.otlp import _candidate_events as ce
from collectors.otlp._decode import NATIVE_AVAILABLE

pytestmark = pytest.mark.skipif(not NATIVE_AVAILABLE, reason="native extension not built")

SHORT = list(semconv.CANDIDATE_JSON_KEYS.values())
CI = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _spans(texts: list[str | None]) -> pa.Table:
    """A batch of decision spans carrying ``texts`` as their candidates attribute."""
    n = len(texts)
    cols: dict[str, Any] = {name: pa.nulls(n, RAW_SPANS_SCHEMA.field(name).type)
                            for name in RAW_SPANS_SCHEMA.names}
    cols["trace_id"] = pa.array([f"{i:032x}" for i in range(n)])
    cols["span_id"] = pa.array([f"{i:016x}" for i in range(n)])
    cols["event_count"] = pa.array([i % 3 for i in range(n)], pa.int64())
    cols["start_ns"] = pa.array([1_000 + i for i in range(n)], pa.int64())
    cols["a_decision_time_ns"] = pa.array([None if i % 4 == 0 else 2_000 + i for i in range(n)], pa.int64())
    cols[ce._COLUMN] = pa.array(texts, pa.string())
    return pa.Table.from_pydict(cols, schema=RAW_SPANS_SCHEMA)


NO_EVENTS = RAW_SPAN_EVENTS_SCHEMA.empty_table()


def assert_same(texts: list[str | None]) -> bool:
    """Both expansions equal; returns whether the C path handled the batch."""
    spans = _spans(texts)
    got = ce.expand(spans, NO_EVENTS, native=True)
    want = ce.expand(spans, NO_EVENTS, native=False)
    assert got[2] == want[2], "malformed counts differ"
    assert got[0].equals(want[0])
    assert got[1].to_pylist() == want[1].to_pylist()
    assert got[1].schema == want[1].schema
    for name in got[1].schema.names:  # doubles bit for bit (to_pylist has -0.0 == 0.0)
        if pa.types.is_floating(got[1].schema.field(name).type):
            bits = [pc.fill_null(t[1].column(name), 0.0).combine_chunks().view(pa.int64()) for t in (got, want)]
            assert bits[0].equals(bits[1]), name
    picked = spans.filter(spans.column(ce._COLUMN).is_valid())
    return picked.num_rows > 0 and ce._expand_native(picked.select(
        ["trace_id", "span_id", "event_count", "start_ns", "a_decision_time_ns", ce._COLUMN])) is not None


def test_recorded_candidates_take_the_c_path() -> None:
    """The recorder's own encoding (testbed traffic through the real SDK) is handled in C."""
    from collectors.otlp import _decode

    bodies = _sdk_bodies()
    seen: list[pa.Table] = []
    real = ce.expand

    def spy(spans: pa.Table, events: pa.Table, *, native: bool = True) -> Any:
        seen.append(spans)
        return real(spans, events, native=native)

    _decode._candidate_events.expand = spy  # type: ignore[assignment]
    try:
        for body in bodies:
            _decode.decode_protobuf(body, time.time_ns())
    finally:
        _decode._candidate_events.expand = real  # type: ignore[assignment]
    texts = [t for s in seen for t in s.column(ce._COLUMN).to_pylist() if t is not None]
    assert len(texts) >= 50
    assert assert_same(texts)


def _sdk_bodies() -> list[bytes]:
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    import testbed
    from testbed.emit import OTelEmitter

    exp = InMemorySpanExporter()
    em = OTelEmitter(exp, batch=False)
    sim = testbed.prepare_scenario("baseline", n_requests=60, replicas=4, emitter=em, workload="hot_prefix")
    sim.run()
    spans = list(exp.get_finished_spans())
    em.close()
    return [bytes(encode_spans(spans[i:i + 64]).SerializeToString()) for i in range(0, len(spans), 64)]


@pytest.mark.parametrize("texts, native", [
    # the recorder's shape, and JSON's freedoms: whitespace, escapes, unknown and nested keys
    (['[{"replica": "a", "waiting": 2, "kv_usage": 1, "chosen": true, "score": -0.0}]'], True),
    (['  [ { "replica" : "a\\"b\\\\c\\u00e9\\ud83d\\ude00\\n" , "extra": {"x": [1, {"y": null}]} } ] '], True),
    (['[{"repl\\u0069ca": "escaped key", "replica": null}]'], True),
    (['[]', '[{}]', '[{"waiting": 1}, {"waiting": 2, "waiting": 3}]'], True),  # last duplicate wins
    (['[{"kv_usage": 9007199254740992, "telemetry_age_ms": 1e-5, "score": 1.5E+300}]'], True),
    (['[{"score": 0.1}, {"score": 238.05420800000002}, {"score": 12345678901234}]'], True),
    (['{"not": "a list"}', '[1, {"replica": "a"}]', '"text"', '[{"replica": "a"}, []]'], True),  # malformed
    # left to Python: not strict JSON, or values that need coercion
    (['[{"replica": "a", "kv_usage": NaN}]'], False),
    (['[{"replica": 7}]'], False),
    (['[{"waiting": 3.0}]'], False),  # Arrow turns 3.0 into 3; Python decides
    (['[{"waiting": "3"}]'], False),
    (['[{"waiting": "1E100"}, {"waiting": "99999999999999999999"}]'], False),  # NULL, once a crash
    (['[{"chosen": 1}]'], False),
    (['[{"waiting": 9223372036854775808}]'], False),
    (['[{"kv_usage": 9007199254740993}]'], False),
    (['[{"replica": ["a"]}]'], False),
    (['[{"replica": "a"}'], False),  # truncated
    (['[{"replica": "a"}] x'], False),
    (['[{"replica": "\\ud800"}]'], False),  # lone surrogate
    (['[{"replica": "tab\there"}]'], False),  # raw control character
    (['[{"score": 1e400}]'], False),
    (['[{"waiting": 01}]'], False),
    ([''], False),
    # numbers orjson refuses make the text non-strict, even under a key nobody reads
    (['[{"replica": "a", "zz": ' + "1" * 4301 + '}]'], False),
    (['[{"replica": "a", "zz": 1e400}]'], False),
])
def test_texts(texts: list[str], native: bool) -> None:
    assert assert_same(texts) is native


def test_more_candidates_than_the_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ce, "MAX_CANDIDATES", 3)
    text = json.dumps([{"replica": f"r{i}", "waiting": i} for i in range(5)] + [{"waiting": "x"}])
    assert assert_same([text, '[{"replica": "a"}]'])
    assert ce.expand(_spans([text]), NO_EVENTS)[1].num_rows == 3


def test_a_batch_with_one_awkward_text_is_left_to_python_whole() -> None:
    texts = ['[{"replica": "a"}]', '[{"replica": "b", "kv_usage": NaN}]']
    assert assert_same(texts) is False


# -- generated --------------------------------------------------------------------------------
_DOUBLES = st.one_of(st.floats(allow_nan=False, allow_infinity=False),
                     st.floats(-1e6, 1e6, allow_nan=False).map(lambda x: round(x, 6)))
_STRINGS = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=12)
_SCALAR = st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.integers(-100, 100),
                    _DOUBLES, _STRINGS)
_ANY = st.recursive(_SCALAR, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                     st.dictionaries(_STRINGS, inner, max_size=3)),
                    max_leaves=6)


def _typed_value(short: str) -> st.SearchStrategy[Any]:
    col, typ = semconv.TYPED_EVENT_ATTRIBUTES[next(k for k, v in semconv.CANDIDATE_JSON_KEYS.items()
                                                   if v == short)]
    right = {"VARCHAR": _STRINGS, "BIGINT": st.integers(-(2**63), 2**63 - 1), "BOOLEAN": st.booleans(),
             "DOUBLE": st.one_of(_DOUBLES, st.integers(-(2**53), 2**53))}[typ]
    return st.one_of(right, right, right, st.none(), _SCALAR)  # mostly the column's own type


_CANDIDATE = st.lists(st.one_of(*(st.tuples(st.just(k), _typed_value(k)) for k in SHORT),
                                st.tuples(_STRINGS, _ANY)), max_size=8)


def _dump(pairs: list[tuple[str, Any]], ascii_: bool, spaced: bool) -> str:
    sep = ", " if spaced else ","
    colon = ": " if spaced else ":"
    return "{" + sep.join(json.dumps(k, ensure_ascii=ascii_) + colon + json.dumps(v, ensure_ascii=ascii_)
                          for k, v in pairs) + "}"


@st.composite
def _texts(draw: Any) -> str:
    cands = draw(st.lists(_CANDIDATE, max_size=5))
    ascii_, spaced = draw(st.booleans()), draw(st.booleans())
    body = [_dump(c, ascii_, spaced) for c in cands]
    if draw(st.integers(0, 9)) == 0:  # a non-object element: malformed
        body.insert(draw(st.integers(0, len(body))), json.dumps(draw(_ANY)))
    text = "[" + (", " if spaced else ",").join(body) + "]"
    damage = draw(st.integers(0, 14))
    if damage == 0 and text:  # cut or corrupt it
        pos = draw(st.integers(0, len(text) - 1))
        text = text[:pos] + draw(st.sampled_from(["", "x", "NaN", "\\", '"', "}", "\t"])) + text[pos + 1:]
    return text


@CI
@given(st.lists(_texts(), min_size=1, max_size=4))
def test_generated_texts_equal(texts: list[str]) -> None:
    assert_same(texts)


@CI
@given(st.lists(st.lists(st.fixed_dictionaries(
    {}, optional={k: _typed_value(k) for k in SHORT}), max_size=4), min_size=1, max_size=4))
def test_generated_recorder_like_texts_equal(cands: list[list[dict[str, Any]]]) -> None:
    texts = [json.dumps(c, separators=(",", ":"), allow_nan=False) for c in cands]
    handled = assert_same(texts)
    plain = all(_plain(k, v) for c in cands for d in c for k, v in d.items())
    if plain:
        assert handled, "a plain batch fell back to Python"


def _plain(short: str, value: Any) -> bool:
    """Whether the C path must take this value (the column's exact kind or null)."""
    typ = semconv.TYPED_EVENT_ATTRIBUTES[next(k for k, v in semconv.CANDIDATE_JSON_KEYS.items()
                                              if v == short)][1]
    if value is None:
        return True
    if typ == "VARCHAR":
        return isinstance(value, str)
    if typ == "BOOLEAN":
        return isinstance(value, bool)
    if typ == "BIGINT":
        return isinstance(value, int) and not isinstance(value, bool) and -(2**63) <= value < 2**63
    return (isinstance(value, float) and math.isfinite(value) and (value == 0 or abs(value) > 1e-300)
            and abs(value) < 1e300) or (isinstance(value, int) and not isinstance(value, bool)
                                        and abs(value) <= 2**53)


def test_the_c_path_reads_buffers_with_an_offset() -> None:
    """A sliced column (Arrow offset) is read from its offset."""
    spans = _spans(['[{"replica": "skip"}]', '[{"replica": "a"}]', '[{"replica": "b"}]']).slice(1)
    got = ce.expand(spans, NO_EVENTS)[1].column("c_replica").to_pylist()
    assert got == ["a", "b"]
    assert ce.expand(spans, NO_EVENTS, native=False)[1].column("c_replica").to_pylist() == got




def test_a_lone_surrogate_counts_as_malformed() -> None:
    """JSON can escape a lone surrogate, which is no UTF-8 text: counted, the batch still stored
    (it once failed the whole export)."""
    texts = ['[{"replica": "\\ud800"}]', '[{"replica": "a"}]']
    for native in (True, False):
        _spans_out, events, malformed = ce.expand(_spans(texts), NO_EVENTS, native=native)
        assert malformed == 1
        assert events.column("c_replica").to_pylist() == ["a"]


def test_config_with_keys_apart_from_the_typed_ones() -> None:
    """make_config sizes its key table for every key it interns: apart keys that are not typed
    keys used to write past it (a crash or an endless probe); once keys likewise. In a child so a
    crash shows."""
    code = ("from collectors.otlp import _native as n\n"
            "for _ in range(50):\n"
            "    n.make_config(([], [], []), [], [], [f'k{i}' for i in range(40)], [f'o{i}' for i in range(40)],\n"
            "                  16384, 2097152, 262144, 0, 2**63)\n")
    done = subprocess.run([sys.executable, "-c", code], env={"MALLOC_CHECK_": "3", "PATH": ""},
                          cwd=Path(__file__).resolve().parents[2], timeout=60, capture_output=True)
    assert done.returncode == 0, done.stderr[-500:]
