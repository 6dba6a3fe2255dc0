"""Instrumented OpenAI-compatible clients (httpx), sync and async.

Each call sends ``traceparent`` and ``X-Request-Id``, emits one ``routeaudit.client`` span and
returns a :class:`ClientResult`. A call never raises for what the server or network did (HTTP
errors, timeouts, broken streams become ``status``); asyncio cancellation is recorded as
``cancelled`` and then re-raised, as asyncio requires.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Mapping
from typing import Any

import httpx
from opentelemetry import trace
from opentelemetry.context import Context

from ._result import INSTRUMENTATION_NAME, REJECTED_STATUSES, ClientResult, SpanCall, new_request_id

DEFAULT_TIMEOUT_S = 300.0
"""Default httpx timeout for one request (connect, read, write, pool), seconds."""


def build_body(
    endpoint: str, *, model: str | None, prompt: Any = None, messages: Any = None,
    max_tokens: int | None = None, stream: bool = False, extra: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The JSON body for ``/v1/completions`` or ``/v1/chat/completions`` (usage requested)."""
    body: dict[str, Any] = {}
    if model is not None:
        body["model"] = model
    if endpoint.endswith("/chat/completions"):
        if messages is None:
            messages = [{"role": "user", "content": "" if prompt is None else str(prompt)}]
        body["messages"] = messages
    else:
        body["prompt"] = "" if prompt is None else prompt
    if max_tokens is not None:
        body["max_tokens"] = max_tokens
    body["stream"] = stream
    if stream:
        body["stream_options"] = {"include_usage": True}
    if extra:
        body.update(extra)
    return body


def _sse_data(line: str) -> Any:
    """Decoded JSON of one SSE ``data:`` line; None for other lines, ``...`` for [DONE]."""
    if not line.startswith("data:"):
        return None
    payload = line[5:].strip()
    if payload == "[DONE]":
        return ...
    try:
        return json.loads(payload)
    except ValueError:
        return None


def _status_of(code: int) -> str:
    return "rejected" if code in REJECTED_STATUSES else "error"


class _Base:
    def __init__(
        self, base_url: str, *, model: str | None, tracer_provider: trace.TracerProvider | None,
        run_id: str | None, headers: Mapping[str, str] | None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.run_id = run_id
        self._headers = dict(headers or {})
        self._tracer = trace.get_tracer(INSTRUMENTATION_NAME, "0.1.0", tracer_provider)

    def _start(
        self, endpoint: str, body: dict[str, Any], request_id: str | None,
        input_tokens: int | None, parent_context: Context | None,
    ) -> tuple[SpanCall, dict[str, str]]:
        call = SpanCall(
            self._tracer, request_id=request_id or new_request_id(), endpoint=endpoint,
            stream=bool(body.get("stream")), url=self.base_url + endpoint,
            model=body.get("model"), max_tokens=body.get("max_tokens"),
            input_tokens=input_tokens, run_id=self.run_id, parent_context=parent_context,
        )
        headers = dict(self._headers)
        headers.update(call.headers)
        headers["X-Request-Id"] = headers.pop("x-request-id")
        return call, headers


class InstrumentedClient(_Base):
    """Sync client. ``cancel`` (a ``threading.Event``) aborts a stream between chunks."""

    def __init__(
        self, base_url: str, *, model: str | None = None, timeout: float = DEFAULT_TIMEOUT_S,
        tracer_provider: trace.TracerProvider | None = None, run_id: str | None = None,
        headers: Mapping[str, str] | None = None, http_client: httpx.Client | None = None,
    ) -> None:
        super().__init__(base_url, model=model, tracer_provider=tracer_provider, run_id=run_id,
                         headers=headers)
        self._own = http_client is None
        self._http = http_client or httpx.Client(timeout=timeout)

    def close(self) -> None:
        if self._own:
            self._http.close()

    def __enter__(self) -> InstrumentedClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def completions(
        self, prompt: Any, *, max_tokens: int | None = None, stream: bool = False,
        model: str | None = None, request_id: str | None = None, input_tokens: int | None = None,
        extra: Mapping[str, Any] | None = None, parent_context: Context | None = None,
        cancel: threading.Event | None = None,
    ) -> ClientResult:
        body = build_body("/v1/completions", model=model or self.model, prompt=prompt,
                          max_tokens=max_tokens, stream=stream, extra=extra)
        return self.request("/v1/completions", body, request_id=request_id,
                            input_tokens=input_tokens, parent_context=parent_context,
                            cancel=cancel)

    def chat(
        self, messages: Any, *, max_tokens: int | None = None, stream: bool = False,
        model: str | None = None, request_id: str | None = None, input_tokens: int | None = None,
        extra: Mapping[str, Any] | None = None, parent_context: Context | None = None,
        cancel: threading.Event | None = None,
    ) -> ClientResult:
        body = build_body("/v1/chat/completions", model=model or self.model, messages=messages,
                          max_tokens=max_tokens, stream=stream, extra=extra)
        return self.request("/v1/chat/completions", body, request_id=request_id,
                            input_tokens=input_tokens, parent_context=parent_context,
                            cancel=cancel)

    def request(
        self, endpoint: str, body: dict[str, Any], *, request_id: str | None = None,
        input_tokens: int | None = None, parent_context: Context | None = None,
        cancel: threading.Event | None = None,
    ) -> ClientResult:
        """POST ``body`` to ``endpoint``; streams when ``body["stream"]`` is true."""
        call, headers = self._start(endpoint, body, request_id, input_tokens, parent_context)
        try:
            with self._http.stream("POST", self.base_url + endpoint, json=body,
                                   headers=headers) as resp:
                call.http_status = resp.status_code
                if resp.status_code >= 400:
                    resp.read()
                    return call.finish(_status_of(resp.status_code),
                                       f"HTTP {resp.status_code}: {resp.text[:200]}")
                if call.stream:
                    for line in resp.iter_lines():
                        if cancel is not None and cancel.is_set():
                            return call.finish("cancelled", "cancelled by caller")
                        data = _sse_data(line)
                        if data is ...:
                            break
                        if data is not None:
                            call.chunk(data, time.time_ns())
                    if cancel is not None and cancel.is_set():
                        return call.finish("cancelled", "cancelled by caller")
                else:
                    call.body(json.loads(resp.read() or b"null"))
            return call.finish("ok")
        except httpx.TimeoutException as exc:
            return call.finish("timeout", f"{type(exc).__name__}: {exc}")
        except (KeyboardInterrupt, SystemExit):
            call.finish("cancelled", "interrupted")
            raise
        except Exception as exc:
            return call.finish("error", f"{type(exc).__name__}: {exc}")


class AsyncInstrumentedClient(_Base):
    """Async client. Cancelling the task closes the stream, records ``cancelled``, re-raises."""

    def __init__(
        self, base_url: str, *, model: str | None = None, timeout: float = DEFAULT_TIMEOUT_S,
        tracer_provider: trace.TracerProvider | None = None, run_id: str | None = None,
        headers: Mapping[str, str] | None = None, http_client: httpx.AsyncClient | None = None,
        max_connections: int = 100,
    ) -> None:
        super().__init__(base_url, model=model, tracer_provider=tracer_provider, run_id=run_id,
                         headers=headers)
        self._own = http_client is None
        self._http = http_client or httpx.AsyncClient(
            timeout=timeout,
            limits=httpx.Limits(max_connections=max_connections,
                                max_keepalive_connections=max_connections),
        )

    async def aclose(self) -> None:
        if self._own:
            await self._http.aclose()

    async def __aenter__(self) -> AsyncInstrumentedClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def completions(
        self, prompt: Any, *, max_tokens: int | None = None, stream: bool = False,
        model: str | None = None, request_id: str | None = None, input_tokens: int | None = None,
        extra: Mapping[str, Any] | None = None, parent_context: Context | None = None,
    ) -> ClientResult:
        body = build_body("/v1/completions", model=model or self.model, prompt=prompt,
                          max_tokens=max_tokens, stream=stream, extra=extra)
        return await self.request("/v1/completions", body, request_id=request_id,
                                  input_tokens=input_tokens, parent_context=parent_context)

    async def chat(
        self, messages: Any, *, max_tokens: int | None = None, stream: bool = False,
        model: str | None = None, request_id: str | None = None, input_tokens: int | None = None,
        extra: Mapping[str, Any] | None = None, parent_context: Context | None = None,
    ) -> ClientResult:
        body = build_body("/v1/chat/completions", model=model or self.model, messages=messages,
                          max_tokens=max_tokens, stream=stream, extra=extra)
        return await self.request("/v1/chat/completions", body, request_id=request_id,
                                  input_tokens=input_tokens, parent_context=parent_context)

    async def request(
        self, endpoint: str, body: dict[str, Any], *, request_id: str | None = None,
        input_tokens: int | None = None, parent_context: Context | None = None,
    ) -> ClientResult:
        """POST ``body`` to ``endpoint``; streams when ``body["stream"]`` is true."""
        call, headers = self._start(endpoint, body, request_id, input_tokens, parent_context)
        try:
            async with self._http.stream("POST", self.base_url + endpoint, json=body,
                                         headers=headers) as resp:
                call.http_status = resp.status_code
                if resp.status_code >= 400:
                    await resp.aread()
                    return call.finish(_status_of(resp.status_code),
                                       f"HTTP {resp.status_code}: {resp.text[:200]}")
                if call.stream:
                    async for line in resp.aiter_lines():
                        data = _sse_data(line)
                        if data is ...:
                            break
                        if data is not None:
                            call.chunk(data, time.time_ns())
                else:
                    call.body(json.loads(await resp.aread() or b"null"))
            return call.finish("ok")
        except asyncio.CancelledError:
            call.finish("cancelled", "cancelled by caller")
            raise
        except httpx.TimeoutException as exc:
            return call.finish("timeout", f"{type(exc).__name__}: {exc}")
        except Exception as exc:
            return call.finish("error", f"{type(exc).__name__}: {exc}")
