"""Types of the native OTLP decoder (collectors/otlp/_native.c; its ``methods`` table)."""

from typing import Any, TypeAlias

from typing_extensions import Buffer

Column: TypeAlias = tuple[int, int, int, bytes | None, Any, bytes | None]
"""``(kind, n, null_count, validity | None, data, offsets | None)``: data is the values' bytes, the
child column of a list column, or None when every value is null (validity and offsets None)."""

Kinds: TypeAlias = list[tuple[str, int]]
"""``[(attribute key, column kind)]`` for one context (spans, resources or events)."""

def make_config(typed: tuple[Kinds, Kinds, Kinds], prompt_keys: list[str], prompt_patterns: list[str],
                apart_keys: list[str], once_keys: list[str], max_str: int, max_apart_str: int,
                max_span_bytes: int, min_ns: int, max_ns: int, /) -> object:
    """The decoder configuration, a capsule for :func:`decode`; ``typed``: span, resource and
    event keys; ``prompt_patterns``: lower case keys, or prefixes ending in ``*``, matched with
    ASCII letters in any case (``prompt_keys``: those matched byte for byte first)."""

def decode(
    body: Buffer, config: object, keep_prompts: bool, received_ns: int, /
) -> tuple[tuple[Column, ...], list[Column | list[Any]], list[Column | list[Any]],
           tuple[Column, ...], list[Column | list[Any]], list[str], int, int] | None:
    """``(span columns, resource typed, span typed, event columns, event typed, rejections,
    truncated values, prompt values dropped)``, or None when the body is left to Python. A typed
    column is a :data:`Column`, or its raw values when Python must coerce them."""

def expand_candidates(
    offsets: Buffer, data: Buffer, offset: int, n: int, keys: list[tuple[bytes, int]],
    max_candidates: int, /,
) -> tuple[bytes, bytes, int, int, list[Column], bytes] | None:
    """``(rows, index, count, malformed, [column per key], keep)`` for the candidates texts of a
    string array's buffers, or None when they are left to Python."""
