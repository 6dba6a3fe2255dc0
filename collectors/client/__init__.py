"""Instrumented OpenAI-compatible client (httpx, sync + async) and load generator.

Live calls::

    with InstrumentedClient("http://127.0.0.1:8000", model="m") as c:
        r = c.completions("Hello", max_tokens=16, stream=True)   # -> ClientResult

After the fact (virtual-time testbed)::

    ctx = record_client_request(
        request_id, *, start_ns, end_ns, token_ns=None, first_token_ns=None,
        output_tokens=None, prompt_tokens=None, cached_tokens=None, finish_reason=None,
        status="ok", http_status=200, error=None, endpoint="/v1/completions", stream=True,
        model=None, max_tokens=None, input_tokens=None, url=None, run_id=None,
        parent_context=None, tracer_provider=None)  # -> Context of the client span, or None

Load: ``run_load(url, requests, concurrency, progress=True, *, timeout, run_id,
tracer_provider) -> list[ClientResult]``.
"""

from ._client import AsyncInstrumentedClient, InstrumentedClient
from ._load import run_load
from ._result import ClientResult, record_client_request

__all__ = [
    "AsyncInstrumentedClient",
    "ClientResult",
    "InstrumentedClient",
    "record_client_request",
    "run_load",
]
