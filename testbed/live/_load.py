"""Request dicts for :func:`collectors.client.run_load` with real prompt text.

``"aibrix"`` uses the AIBrix trace's own prompt text (its shared prefixes are real shared text).
Any other workload name (see ``testbed.WORKLOADS``), or a list of testbed ``Request`` objects, is
turned into text with :func:`~testbed.live._tokens.text_for_keys`: each prefix segment becomes
text determined by its chained key, so requests that share leading segments share leading text,
and the live replicas' crude tokenizer gives back the same token count.
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from typing import Any

from .._requests import Request
from ..workloads import make_workload, read_trace
from ._tokens import prompt_info, text_for_keys

__all__ = ["live_requests"]


def _aibrix(n: int | None, max_tokens: int | None) -> list[tuple[str, float, str, int]]:
    _, lines = read_trace("aibrix")
    out: list[tuple[str, float, str, int]] = []
    t0: float | None = None
    for line_no, line in enumerate(lines, 1):
        if not line.strip():
            continue
        obj = json.loads(line)
        ts = float(obj["timestamp"]) / 1000.0
        t0 = ts if t0 is None else t0
        for j, it in enumerate(obj["requests"]):
            o = max(1, int(it["Output Length"]))
            out.append((f"ab-{line_no - 1}-{j}", ts - t0, str(it["prompt"]),
                        min(o, max_tokens) if max_tokens else o))
            if n is not None and len(out) >= n:
                return out
    return out


def live_requests(
    workload: str | Sequence[Request], n: int | None = None, seed: int = 0, *,
    stream_fraction: float = 0.5, chat_fraction: float = 0.25, max_tokens: int | None = 256,
    time_scale: float = 1.0, model: str | None = None, id_prefix: str | None = None,
) -> list[dict[str, Any]]:
    """Requests ``{request_id, at_s, endpoint, prompt | messages, prompt_tokens, max_tokens,
    stream, model}`` in arrival order.

    ``max_tokens`` caps the output (the body's ``max_tokens`` is the workload's output length, so
    the live replica generates exactly that); ``time_scale`` multiplies arrival offsets;
    ``stream_fraction`` / ``chat_fraction`` pick SSE and ``/v1/chat/completions`` per request
    (seeded). Request ids are ``<id_prefix>-<workload id>`` (default prefix ``s<seed>``).
    """
    rng = random.Random(seed)
    rows: list[tuple[str, float, str, int]]
    if isinstance(workload, str) and workload == "aibrix":
        rows = _aibrix(n, max_tokens)
    else:
        reqs = (make_workload(workload, n_requests=n, rng=random.Random(seed))
                if isinstance(workload, str) else list(workload)[:n])
        rows = [
            (r.request_id, r.arrival_s,
             text_for_keys(r.block_keys, r.block_tokens, r.input_tokens),
             min(r.output_tokens, max_tokens) if max_tokens else r.output_tokens)
            for r in reqs
        ]
    prefix = id_prefix if id_prefix is not None else f"s{seed}"
    out: list[dict[str, Any]] = []
    for rid, at, text, mt in sorted(rows, key=lambda x: x[1]):
        chat = rng.random() < chat_fraction
        stream = rng.random() < stream_fraction
        d: dict[str, Any] = {"request_id": f"{prefix}-{rid}" if prefix else rid,
                             "at_s": at * time_scale, "max_tokens": mt, "stream": stream}
        if chat:
            d["endpoint"] = "/v1/chat/completions"
            d["messages"] = [{"role": "user", "content": text}]
            d["prompt_tokens"] = prompt_info({"messages": d["messages"]}).input_tokens
        else:
            d["endpoint"] = "/v1/completions"
            d["prompt"] = text
            d["prompt_tokens"] = prompt_info({"prompt": text}).input_tokens
        if model is not None:
            d["model"] = model
        out.append(d)
    return out
