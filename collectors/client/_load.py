"""Open-loop load generator over the instrumented async client (``routeaudit testbed load``)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable, Mapping, Sized
from typing import Any

from opentelemetry import trace
from tqdm import tqdm

from ._client import AsyncInstrumentedClient, build_body
from ._result import ClientResult

DEFAULT_ENDPOINT = "/v1/completions"


def synthetic_prompt(tokens: int) -> str:
    """A prompt of about ``tokens`` tokens (one short word each) for ``prompt_tokens`` requests."""
    return " ".join(f"w{i % 50}" for i in range(max(0, int(tokens))))


def _request_args(req: Mapping[str, Any]) -> tuple[str, dict[str, Any], int | None]:
    endpoint = str(req.get("endpoint") or DEFAULT_ENDPOINT)
    input_tokens = req.get("prompt_tokens")
    prompt = req.get("prompt")
    if prompt is None and input_tokens is not None:
        prompt = synthetic_prompt(int(input_tokens))
    body = build_body(
        endpoint, model=req.get("model"), prompt=prompt, messages=req.get("messages"),
        max_tokens=req.get("max_tokens"), stream=bool(req.get("stream", False)),
        extra=req.get("extra"),
    )
    return endpoint, body, None if input_tokens is None else int(input_tokens)


def run_load(
    url: str,
    requests: Iterable[Mapping[str, Any]],
    concurrency: int,
    progress: bool = True,
    *,
    timeout: float = 300.0,
    run_id: str | None = None,
    tracer_provider: trace.TracerProvider | None = None,
) -> list[ClientResult]:
    """Send ``requests`` to ``url`` (the router's base URL) and return the results.

    Each request is a dict ``{request_id?, at_s, endpoint, prompt | prompt_tokens | messages,
    max_tokens, stream, model, extra?}`` (``extra``: more body fields, sent as they are);
    ``at_s`` is the arrival offset from the start of the run, in order. At most ``concurrency``
    requests are in flight; an arrival that finds no free slot waits for one (so the arrival
    trace is only honoured below saturation). Results are in completion order. Blocks; runs its
    own event loop.
    """
    return asyncio.run(
        arun_load(url, requests, concurrency, progress, timeout=timeout, run_id=run_id,
                  tracer_provider=tracer_provider)
    )


async def arun_load(
    url: str,
    requests: Iterable[Mapping[str, Any]],
    concurrency: int,
    progress: bool = True,
    *,
    timeout: float = 300.0,
    run_id: str | None = None,
    tracer_provider: trace.TracerProvider | None = None,
) -> list[ClientResult]:
    """Async form of :func:`run_load`."""
    concurrency = max(1, int(concurrency))
    total = len(requests) if isinstance(requests, Sized) else None
    results: list[ClientResult] = []
    slots = asyncio.Semaphore(concurrency)
    bar = tqdm(total=total, disable=not progress, unit="req", desc="load")
    async with AsyncInstrumentedClient(url, timeout=timeout, run_id=run_id,
                                       tracer_provider=tracer_provider,
                                       max_connections=concurrency) as client:

        async def one(req: Mapping[str, Any]) -> None:
            try:
                endpoint, body, input_tokens = _request_args(req)
                res = await client.request(endpoint, body, request_id=req.get("request_id"),
                                           input_tokens=input_tokens)
                results.append(res)
                bar.update(1)
                if res.status != "ok":
                    bar.set_postfix_str(f"last {res.status}: {(res.error or '')[:60]}", refresh=False)
            finally:
                slots.release()

        tasks: list[asyncio.Task[None]] = []
        t0 = time.monotonic()
        try:
            for req in requests:
                delay = t0 + float(req.get("at_s", 0.0)) - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
                await slots.acquire()
                tasks.append(asyncio.create_task(one(req)))
            await asyncio.gather(*tasks)
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            bar.close()
    return results
