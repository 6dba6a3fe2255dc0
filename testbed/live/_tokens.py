"""Prompt → token count and prefix keys, shared by the live replicas and the live router.

No tokenizer: a prompt of ``n`` characters is ``ceil(n / CHARS_PER_TOKEN)`` tokens (4 characters
per token, about right for English BPE vocabularies). Prefix keys cut the text into segments of
``block_tokens * CHARS_PER_TOKEN`` characters, hash each with BLAKE2b and hash-chain them
(:func:`testbed._requests.chain_keys`), so two prompts that share their first ``k`` whole segments
of text share their first ``k`` keys, on the replica and in the router's prefix view alike.

Explicit alternatives, checked first (the load generator can drive Mooncake-like traces):

* ``routeaudit_prefix_hashes`` (list of hex strings or integers, already chained, like the
  ``routeaudit.request.prefix_hashes`` attribute) with ``routeaudit_input_tokens`` and optionally
  ``routeaudit_block_tokens`` (default: ``ceil(input_tokens / len(hashes))``);
* token ids: ``prompt_token_ids``, ``input_ids`` (``/generate``) or a ``prompt`` that is a list of
  integers; the count is exact and keys chain the ids of each ``block_tokens`` segment.
"""

from __future__ import annotations

import hashlib
import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from .._requests import Request, chain_keys

__all__ = ["CHARS_PER_TOKEN", "DEFAULT_BLOCK_TOKENS", "PromptInfo", "prompt_info", "text_for_keys"]

CHARS_PER_TOKEN: Final = 4
"""Characters per token of the crude tokenizer."""

DEFAULT_BLOCK_TOKENS: Final = 16
"""Tokens per prefix-cache segment for text prompts (vLLM's default KV block size)."""

_MASK: Final = (1 << 63) - 1


@dataclass(frozen=True, slots=True)
class PromptInfo:
    """What the live fleet derives from a request body."""

    input_tokens: int
    block_keys: tuple[int, ...]
    block_tokens: int
    text: str

    def request(self, request_id: str, max_tokens: int, output_tokens: int | None = None) -> Request:
        """A testbed :class:`Request` (arrival 0; live code keeps its own clocks)."""
        out = max_tokens if output_tokens is None else max(1, min(output_tokens, max_tokens))
        return Request(request_id, 0.0, self.input_tokens, out, max_tokens, self.block_keys,
                       self.block_tokens)


def _hash(data: bytes) -> int:
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "big")


def _text_of(body: Mapping[str, Any]) -> str:
    messages = body.get("messages")
    if isinstance(messages, list):
        parts = []
        for m in messages:
            if not isinstance(m, Mapping):
                continue
            content = m.get("content")
            if isinstance(content, list):  # OpenAI content parts
                content = "".join(str(p.get("text", "")) for p in content if isinstance(p, Mapping))
            parts.append(f"<|{m.get('role', 'user')}|>\n{'' if content is None else content}\n")
        return "".join(parts) + "<|assistant|>\n"
    for key in ("prompt", "text"):
        value = body.get(key)
        if isinstance(value, list) and len(value) == 1 and isinstance(value[0], str):
            value = value[0]
        if isinstance(value, str):
            return value
    return ""


def _token_ids(body: Mapping[str, Any]) -> list[int] | None:
    for key in ("prompt_token_ids", "input_ids", "prompt"):
        value = body.get(key)
        if (isinstance(value, list) and value
                and all(isinstance(x, int) and not isinstance(x, bool) for x in value)):
            return list(value)
    return None


def text_keys(text: str, block_tokens: int = DEFAULT_BLOCK_TOKENS) -> tuple[int, ...]:
    """Chained keys of ``text`` cut into ``block_tokens``-token segments (last one partial)."""
    step = block_tokens * CHARS_PER_TOKEN
    if not text:
        return chain_keys([_hash(b"")])
    # cut on characters, not bytes, so the key of a segment does not depend on what follows
    raw = [_hash(text[i:i + step].encode("utf-8", "surrogatepass"))
           for i in range(0, len(text), step)]
    return chain_keys(raw)


def prompt_info(body: Mapping[str, Any], block_tokens: int = DEFAULT_BLOCK_TOKENS) -> PromptInfo:
    """Token count and prefix keys of an OpenAI / SGLang request body (see module docstring).

    Raises ``ValueError`` on malformed extension fields.
    """
    text = _text_of(body)
    hashes = body.get("routeaudit_prefix_hashes")
    if hashes is not None:
        if not isinstance(hashes, list) or not hashes:
            raise ValueError("routeaudit_prefix_hashes must be a non-empty list")
        keys = tuple((int(h, 16) if isinstance(h, str) else int(h)) & _MASK for h in hashes)
        n = body.get("routeaudit_input_tokens")
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise ValueError("routeaudit_input_tokens must be a positive integer")
        bt = body.get("routeaudit_block_tokens")
        if bt is None:
            bt = math.ceil(n / len(keys))
        if not isinstance(bt, int) or isinstance(bt, bool) or bt < 1:
            raise ValueError("routeaudit_block_tokens must be a positive integer")
        if math.ceil(n / bt) != len(keys):
            raise ValueError(f"{len(keys)} prefix hashes do not fit {n} tokens in blocks of {bt}")
        return PromptInfo(n, keys, bt, text)
    ids = _token_ids(body)
    if ids is not None:
        raw = [_hash(repr(ids[i:i + block_tokens]).encode()) for i in range(0, len(ids), block_tokens)]
        return PromptInfo(len(ids), chain_keys(raw), block_tokens, text)
    n = max(1, math.ceil(len(text) / CHARS_PER_TOKEN))
    return PromptInfo(n, text_keys(text, block_tokens), block_tokens, text)


_WORDS: Final = (
    "the", "model", "router", "replica", "cache", "prefix", "token", "batch", "queue", "serve",
    "request", "latency", "policy", "decode", "prefill", "memory", "block", "engine", "fleet",
    "trace", "audit", "signal", "system", "prompt", "answer", "context", "window", "stream",
)


def text_for_keys(block_keys: Sequence[int], block_tokens: int, input_tokens: int) -> str:
    """Deterministic text of exactly ``input_tokens * CHARS_PER_TOKEN`` characters whose
    ``block_tokens``-token segments are a function of the (chained) key of that segment, so
    requests sharing leading keys share leading text, and nothing else is shared."""
    seg_chars = block_tokens * CHARS_PER_TOKEN
    total = input_tokens * CHARS_PER_TOKEN
    parts: list[str] = []
    for i, key in enumerate(block_keys):
        want = min(seg_chars, total - i * seg_chars)
        if want <= 0:
            break
        rng = random.Random(key)
        buf: list[str] = []
        size = 0
        while size < want:
            w = _WORDS[rng.randrange(len(_WORDS))] + " "
            buf.append(w)
            size += len(w)
        parts.append("".join(buf)[:want])
    text = "".join(parts)
    return text + " " * (total - len(text))
