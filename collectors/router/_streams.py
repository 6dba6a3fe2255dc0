"""Relaying a replica's streamed answer while its forward span stays honest.

The wrappers end the forward span when the body is done: as soon as the replica's answer is
complete (``data: [DONE]`` seen, or the Content-Length reached), *before* relaying those last
bytes, so that on true time the forward span ends before its caller can see the end (clock
correction relies on that nesting: docs/clock.md); else when the body is exhausted; with the
error that broke it; or as ``cancelled`` when the consumer stopped early (``GeneratorExit`` from
``close()`` / ``aclose()`` or garbage collection, ``asyncio.CancelledError`` when the server
cancels the task of a client that went away, httpx's ``StreamClosed`` when the router closed the
upstream response before its body was read through). A router without a server span
(``RouterMiddleware`` / ``rec.serve()``) has no other span to say its client went away, so the
forward span then also carries the status the middleware would record, 499: the request is
``cancelled`` by the router's account, not an error. The first non-empty chunk marks the
router's first byte. Errors of the body itself are re-raised: they are the router's to handle.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    from ._recorder import Forward

__all__ = ["answer_complete", "async_relay", "sync_relay"]

_DONE: Final = b"data: [DONE]"
CLIENT_CLOSED: Final = 499
"""The status of an answer the client went away from (nginx's "client closed request"), as
``RouterMiddleware`` records it on the server span."""


def answer_complete(chunk: bytes, seen: int, total: int | None) -> bool:
    """Whether ``chunk`` completes an answer: an SSE stream's ``data: [DONE]``, or ``seen`` bytes
    (this chunk included) reaching the announced length ``total``."""
    return (total is not None and seen >= total) or chunk.rstrip().endswith(_DONE)


def _length(body: Any) -> int | None:
    value = body.headers.get("content-length")
    return int(value) if isinstance(value, str) and value.isdigit() else None


def _is_cancel(exc: BaseException) -> bool:
    """The consumer went away: a closed generator, a cancelled task, or httpx's ``StreamClosed``
    (duck-typed: this package does not import httpx)."""
    return (isinstance(exc, (GeneratorExit, asyncio.CancelledError))
            or type(exc).__name__ == "StreamClosed")


def _cancelled(fwd: Forward) -> None:
    """End ``fwd`` as cancelled; with no server span to record the client's leaving, the
    forward span carries it as status 499."""
    if not fwd._ended and fwd._decision._server is None:
        fwd.set_http_status(CLIENT_CLOSED)
    fwd._end_cancelled()


def _is_response(body: Any) -> bool:
    """An httpx.Response (duck-typed: this package does not import httpx)."""
    return hasattr(body, "status_code") and hasattr(body, "iter_raw") and hasattr(body, "aiter_raw")


def sync_relay(fwd: Forward, body: Any) -> Iterator[bytes]:
    """``body``: an iterable of chunks, or a streamed sync ``httpx.Response`` (read raw, closed at
    the end, its status recorded now)."""
    close: Callable[[], Any] | None = None
    total = None
    if _is_response(body):
        fwd.set_http_status(body.status_code)
        close = body.close
        total = _length(body)
        chunks: Iterable[Any] = body.iter_raw()
    else:
        chunks = body
    return _sync(fwd, chunks, close, total)


def async_relay(fwd: Forward, body: Any) -> AsyncIterator[bytes]:
    """``body``: an async iterable of chunks, or a streamed ``httpx.Response`` from an
    ``AsyncClient`` (read raw, closed at the end, its status recorded now)."""
    close: Callable[[], Awaitable[Any]] | None = None
    total = None
    if _is_response(body):
        fwd.set_http_status(body.status_code)
        close = body.aclose
        total = _length(body)
        chunks: AsyncIterable[Any] = body.aiter_raw()
    else:
        chunks = body
    return _async(fwd, chunks, close, total)


def _sync(
    fwd: Forward, chunks: Iterable[Any], close: Callable[[], Any] | None, total: int | None
) -> Iterator[bytes]:
    first = True
    seen = 0
    try:
        for chunk in chunks:
            if chunk:
                if first:
                    first = False
                    fwd._first_byte()
                seen += len(chunk)
                if isinstance(chunk, bytes) and answer_complete(chunk, seen, total):
                    fwd.end()
            yield chunk
    except BaseException as exc:
        if _is_cancel(exc):
            _cancelled(fwd)
        else:
            fwd.end(exc)
        raise
    finally:
        fwd.end()
        if close is not None:
            try:
                close()
            except Exception:  # the upstream connection is the pool's to clean up now
                pass


async def _async(
    fwd: Forward, chunks: AsyncIterable[Any], close: Callable[[], Awaitable[Any]] | None,
    total: int | None,
) -> AsyncIterator[bytes]:
    first = True
    seen = 0
    try:
        async for chunk in chunks:
            if chunk:
                if first:
                    first = False
                    fwd._first_byte()
                seen += len(chunk)
                if isinstance(chunk, bytes) and answer_complete(chunk, seen, total):
                    fwd.end()
            yield chunk
    except BaseException as exc:
        if _is_cancel(exc):
            _cancelled(fwd)
        else:
            fwd.end(exc)
        raise
    finally:
        fwd.end()
        if close is not None:
            try:
                await close()
            except Exception:  # cancellation still propagates (BaseException)
                pass
