"""Bounds shared by both transports: the in-flight byte budget, streaming decompression under it,
and the rate limit on repeated log lines.

A per-request cap alone does not bound memory: 64 concurrent gzip bombs each stopped at a 64 MiB
cap still hold 4 GiB. :class:`ByteBudget` is one counter for the whole process; every request
takes what it holds from it (body as read, decompressed output as produced, a decode estimate)
and gives it back when answered. A request that cannot take its share is refused at once
(:class:`Overloaded`, retryable), rather than waiting while holding memory.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import threading
import time
import traceback
import zlib
from collections.abc import Callable
from types import TracebackType

from collectors.otlp._decode import PayloadError
from collectors.otlp._errors import BodyTooLarge, Overloaded

GZIP_WBITS = 16 + zlib.MAX_WBITS
ZLIB_WBITS = zlib.MAX_WBITS
INFLATE_CHUNK = 1024 * 1024
"""Decompressed bytes produced (and taken from the budget) per step."""

_TRIM_AFTER_BYTES = 64 * 1024 * 1024
"""Return freed heap to the system once this much was released since the last trim."""


class ByteBudget:
    """Bytes all requests together may hold. Thread-safe; never blocks."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._used = 0
        self._peak = 0
        self._released_since_trim = 0
        self._lock = threading.Lock()
        self._trim = _malloc_trim()

    @property
    def used(self) -> int:
        """Bytes held right now."""
        with self._lock:
            return self._used

    @property
    def peak(self) -> int:
        """Most bytes held at once since start."""
        with self._lock:
            return self._peak

    def hold(self) -> Hold:
        """A new, empty share for one request; use it as a context manager."""
        return Hold(self)

    def _take(self, n: int) -> bool:
        with self._lock:
            if self._used + n > self.limit:
                return False
            self._used += n
            self._peak = max(self._peak, self._used)
            return True

    def _give(self, n: int) -> None:
        trim = False
        with self._lock:
            self._used -= n
            self._released_since_trim += n
            if self._used == 0 and self._released_since_trim >= _TRIM_AFTER_BYTES:
                self._released_since_trim = 0
                trim = True
        if trim and self._trim is not None:
            # glibc keeps freed chunks below its (self-raising) mmap threshold in its arenas; after a
            # burst of large bodies that is the burst's size, for good. Trimming hands it back.
            self._trim(0)


class Hold:
    """One request's share of a :class:`ByteBudget`; everything still held is given back on exit."""

    def __init__(self, budget: ByteBudget) -> None:
        self._budget = budget
        self.held = 0

    def take(self, n: int) -> None:
        """Take ``n`` more bytes or raise :class:`Overloaded`."""
        if n <= 0:
            return
        if not self._budget._take(n):
            raise Overloaded(
                f"the collector is holding its limit of {self._budget.limit} bytes of request "
                "bodies; retry later")
        self.held += n

    def give(self, n: int) -> None:
        """Give back ``n`` of the bytes held."""
        n = min(n, self.held)
        if n > 0:
            self.held -= n
            self._budget._give(n)

    def __enter__(self) -> Hold:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.give(self.held)


def inflate(data: bytes, wbits: int, limit: int, hold: Hold) -> bytes:
    """Decompress step by step, taking each step's output from ``hold``; stop at ``limit`` bytes.

    Raises :class:`BodyTooLarge` over ``limit``, :class:`Overloaded` when the budget runs out,
    :class:`PayloadError` for a corrupt or truncated stream. Concatenated gzip members (RFC 1952)
    are decompressed one after the other. On return ``hold`` holds ``len(result)`` more bytes
    than before (the steps' output, freed, is given back after the final join, which is taken).
    """
    parts: list[bytes] = []
    try:
        return _inflate(parts, data, wbits, limit, hold)
    finally:
        parts.clear()  # not left to a traceback's frames (see drop_frames)


def _inflate(parts: list[bytes], data: bytes, wbits: int, limit: int, hold: Hold) -> bytes:
    size = 0
    rest = data
    try:
        while True:
            d = zlib.decompressobj(wbits)
            pending = rest
            while not d.eof:
                piece = d.decompress(pending, min(INFLATE_CHUNK, limit - size + 1))
                pending = d.unconsumed_tail
                if not piece and not pending:
                    break
                size += len(piece)
                if size > limit:
                    raise BodyTooLarge(f"body decompresses to more than {limit} bytes")
                hold.take(len(piece))
                parts.append(piece)
            if not d.eof:
                raise PayloadError("compressed body is truncated")
            rest = d.unused_data
            if not rest or wbits != GZIP_WBITS:
                break
    except zlib.error as exc:
        raise PayloadError(f"body is not valid compressed data: {exc}") from exc
    if len(parts) == 1:
        return parts[0]
    hold.take(size)  # the joined copy, while the steps are still alive
    joined = b"".join(parts)
    parts.clear()
    hold.give(size)
    return joined


def drop_frames(exc: BaseException) -> None:
    """Clear the locals of the frames ``exc`` (and what it chains) went through.

    A refused request's exception is kept alive by reference cycles (asyncio futures, anyio's
    worker) until the cyclic garbage collector runs, which large but few allocations do not
    trigger; its traceback's frames hold the request's bodies: 1 GB stayed resident after two
    waves of gzip bombs though the budget had been given back.
    """
    seen: set[int] = set()
    todo: list[BaseException | None] = [exc]
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        if e.__traceback__ is not None:
            traceback.clear_frames(e.__traceback__)
        todo += [e.__cause__, e.__context__]


class RepeatFilter(logging.Filter):
    """Lets the same warning through once per ``interval_s``; the next one it lets through says
    how many were left out. "The same": same logger, level and first line of the message
    (asyncio logs a failing ``accept()`` at the file limit thousands of times a second).

    Records below WARNING pass untouched. Thread-safe.
    """

    def __init__(self, interval_s: float, clock: Callable[[], float] | None = None,
                 on_suppress: Callable[[], None] | None = None) -> None:
        super().__init__()
        self.interval_s = interval_s
        self._clock = clock or time.monotonic
        self._on_suppress = on_suppress
        self._lock = threading.Lock()
        self._seen: dict[tuple[str, int, str], tuple[float, int]] = {}
        self.suppressed = 0

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING:
            return True
        first = str(record.msg).split("\n", 1)[0]
        key = (record.name, record.levelno, first)
        now = self._clock()
        with self._lock:
            last, skipped = self._seen.get(key, (float("-inf"), 0))
            if now - last < self.interval_s:
                self._seen[key] = (last, skipped + 1)
                self.suppressed += 1
                suppress = True
            else:
                suppress = False
                self._seen[key] = (now, 0)
                if len(self._seen) > 1000:  # forget old keys: messages may carry ever-new text
                    self._seen = {k: v for k, v in self._seen.items() if now - v[0] < self.interval_s}
        if suppress:
            if self._on_suppress is not None:
                self._on_suppress()
            return False
        if skipped:
            record.msg = f"{record.msg} [{skipped} more like this in the last {now - last:.0f} s]"
            if record.exc_info:
                record.exc_info = None  # the first one had the traceback
                record.exc_text = None
        return True


LOGGERS_FILTERED: tuple[str, ...] = ("routeaudit.collector", "asyncio", "uvicorn.error")
"""Loggers whose repeated warnings are rate limited: ours, and the two that log every failed
``accept()`` or bad request of the HTTP server."""


class RepeatFilterInstalled:
    """A :class:`RepeatFilter` on :data:`LOGGERS_FILTERED` until :meth:`remove`."""

    def __init__(self, interval_s: float, on_suppress: Callable[[], None] | None = None) -> None:
        self.filter = RepeatFilter(interval_s, on_suppress=on_suppress)
        self._loggers = [logging.getLogger(name) for name in LOGGERS_FILTERED]
        for lg in self._loggers:
            lg.addFilter(self.filter)

    def remove(self) -> None:
        for lg in self._loggers:
            lg.removeFilter(self.filter)


def _malloc_trim() -> ctypes._NamedFuncPointer | None:
    name = ctypes.util.find_library("c")
    if not name:
        return None
    try:
        fn = ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError):  # not glibc
        return None
    fn.argtypes = [ctypes.c_size_t]
    fn.restype = ctypes.c_int
    return fn
