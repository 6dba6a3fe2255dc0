"""Hypothesis strategies for OTLP attributes full of edge cases, shared by the differential
test of the two decoders (``collectors/test_native_decode.py``) and the ``raw_span_attributes``
round trip (``audit/test_raw_span_attributes.py``).

Keys mix the typed semconv attributes, prompt keys, odd Unicode and random text; values cover
every ``AnyValue`` member at the edges of the decoders' coercions (string length limits, int64
bounds, NaN, -0.0). ``awkward=True`` adds what the native decoder leaves to Python: nested arrays,
kvlists, bytes and duplicate keys.

Like ``audit/relation_rows.py`` it is imported by its bare name: pytest (default ``prepend``
import mode, no ``__init__.py`` under ``tests/``) puts ``tests/`` on ``sys.path`` when it loads
``tests/conftest.py``.
"""

from __future__ import annotations

from hypothesis import strategies as st
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, ArrayValue, KeyValue, KeyValueList

import semconv
from collectors.otlp._decode import MAX_STRING_LEN, PROMPT_KEYS

TYPED_KEYS = sorted(set(semconv.TYPED_SPAN_ATTRIBUTES) | set(semconv.TYPED_RESOURCE_ATTRIBUTES)
                    | set(semconv.TYPED_EVENT_ATTRIBUTES))
KEYS = st.one_of(
    st.sampled_from(TYPED_KEYS),
    st.sampled_from(sorted(PROMPT_KEYS) + ["gen_ai.prompt.0.content", "llm.output_messages.1.x",
                                           "gen_ai.completion", "gen_ai.promptish"]),
    st.sampled_from(["k", "", "ключ", "é\u0000\n\"\\", "\U0001F600key", "a" * 40]),
    st.text(max_size=12),
)
TEXT = st.one_of(
    st.text(max_size=20),
    st.sampled_from(["", "200", " 12 ", "1e3", "3.5", "-7", "true", "False", "0", "x", "\u2028\u007f",
                     "\t\r\n\b\f\u0001\u001f", "\U0010FFFF\U0001F600", "\ud7ff\ue000"]),
    st.builds(lambda c, n: c * n, st.sampled_from(["a", "é", "😀", "\u0000"]),
              st.sampled_from([MAX_STRING_LEN - 1, MAX_STRING_LEN, MAX_STRING_LEN + 1, MAX_STRING_LEN + 7])),
)
DOUBLES = st.one_of(st.floats(allow_nan=True, allow_infinity=True),
                    st.sampled_from([0.0, -0.0, 1e16, 1e-5, 0.1, 5e-324, 1.7976931348623157e308, 2.0**62,
                                     -(2.0**62), 2.0**63, 123456789.125]))
INTS = st.one_of(st.integers(-(2**63), 2**63 - 1),
                 st.sampled_from([0, 1, -1, 2**62, 2**63 - 1, -(2**63)]))


def scalar_values() -> st.SearchStrategy[AnyValue]:
    return st.one_of(
        TEXT.map(lambda s: AnyValue(string_value=s)),
        INTS.map(lambda i: AnyValue(int_value=i)),
        DOUBLES.map(lambda d: AnyValue(double_value=d)),
        st.booleans().map(lambda b: AnyValue(bool_value=b)),
        st.just(AnyValue()),
    )


def any_values(awkward: bool) -> st.SearchStrategy[AnyValue]:
    scalar = scalar_values()
    array = st.lists(scalar, max_size=4).map(lambda xs: AnyValue(array_value=ArrayValue(values=xs)))
    if not awkward:
        return st.one_of(scalar, scalar, scalar, array)
    return st.one_of(
        scalar, scalar, scalar, array,
        st.lists(st.one_of(scalar, array), max_size=3).map(  # nested arrays
            lambda xs: AnyValue(array_value=ArrayValue(values=xs))),
        st.lists(st.tuples(KEYS, scalar), max_size=3).map(
            lambda kvs: AnyValue(kvlist_value=KeyValueList(values=[KeyValue(key=k, value=v) for k, v in kvs]))),
        st.binary(max_size=8).map(lambda b: AnyValue(bytes_value=b)),
    )


def attribute_lists(awkward: bool) -> st.SearchStrategy[list[KeyValue]]:
    value = any_values(awkward)
    unique = st.lists(st.tuples(KEYS, value), max_size=6, unique_by=lambda kv: kv[0])
    lists = st.one_of(unique, st.lists(st.tuples(KEYS, value), max_size=4)) if awkward else unique
    return lists.map(lambda kvs: [KeyValue(key=k, value=v) for k, v in kvs])
