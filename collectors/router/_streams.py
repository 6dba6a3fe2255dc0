"""Relaying a replica's streamed answer while its forward span stays honest.

The wrappers end the forward span when the body is done: normally, with the error that broke
it, or as ``cancelled`` when the consumer stopped early (``GeneratorExit`` from ``close()`` /
``aclose()`` or garbage collection, ``asyncio.CancelledError`` when the server cancels the task
of a client that went away). The first non-empty chunk marks the router's first byte. Errors of
the body itself are re-raised: they are the router's to handle.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._recorder import Forward

__all__ = ["async_relay", "sync_relay"]


def _is_response(body: Any) -> bool:
    """An httpx.Response (duck-typed: this package does not import httpx)."""
    return hasattr(body, "status_code") and hasattr(body, "iter_raw") and hasattr(body, "aiter_raw")


def sync_relay(fwd: Forward, body: Any) -> Iterator[bytes]:
    """``body``: an iterable of chunks, or a streamed sync ``httpx.Response`` (read raw, closed at
    the end, its status recorded now)."""
    close: Callable[[], Any] | None = None
    if _is_response(body):
        fwd.set_http_status(body.status_code)
        close = body.close
        chunks: Iterable[Any] = body.iter_raw()
    else:
        chunks = body
    return _sync(fwd, chunks, close)


def async_relay(fwd: Forward, body: Any) -> AsyncIterator[bytes]:
    """``body``: an async iterable of chunks, or a streamed ``httpx.Response`` from an
    ``AsyncClient`` (read raw, closed at the end, its status recorded now)."""
    close: Callable[[], Awaitable[Any]] | None = None
    if _is_response(body):
        fwd.set_http_status(body.status_code)
        close = body.aclose
        chunks: AsyncIterable[Any] = body.aiter_raw()
    else:
        chunks = body
    return _async(fwd, chunks, close)


def _sync(fwd: Forward, chunks: Iterable[Any], close: Callable[[], Any] | None) -> Iterator[bytes]:
    first = True
    try:
        for chunk in chunks:
            if first and chunk:
                first = False
                fwd._first_byte()
            yield chunk
    except GeneratorExit:
        fwd._end_cancelled()
        raise
    except BaseException as exc:
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
    fwd: Forward, chunks: AsyncIterable[Any], close: Callable[[], Awaitable[Any]] | None
) -> AsyncIterator[bytes]:
    first = True
    try:
        async for chunk in chunks:
            if first and chunk:
                first = False
                fwd._first_byte()
            yield chunk
    except (GeneratorExit, asyncio.CancelledError):
        fwd._end_cancelled()
        raise
    except BaseException as exc:
        fwd.end(exc)
        raise
    finally:
        fwd.end()
        if close is not None:
            try:
                await close()
            except Exception:  # cancellation still propagates (BaseException)
                pass
