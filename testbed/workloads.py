"""Workloads: loaders for the public traces shipped with the package, and synthetic mixes.

The traces (Mooncake conversation, Azure LLM 2023 code and conv, AIBrix prefix-share sample) are
package data under ``testbed/data/traces``, xz-compressed, each beside its licence and an
attribution README. ``ROUTEAUDIT_TRACE_DIR`` names a folder to read instead, laid out the same
way (``mooncake/conversation_trace.jsonl``...), its files plain or compressed (``.xz``, ``.gz``).

Every loader validates its input and raises :class:`~testbed.WorkloadError` naming
``file:line: reason`` for the first bad line. All randomness comes from the ``rng`` passed in.
Arrival times are seconds from the first request, multiplied by ``time_scale`` (0.5 = twice
the rate).
"""

from __future__ import annotations

import csv
import gzip
import hashlib
import importlib.resources
import io
import json
import math
import os
import random
import zlib
from collections.abc import Callable, Iterable, Iterator, Mapping
from datetime import datetime
from typing import IO, Any, Final

from ._errors import UnknownNameError, WorkloadError
from ._requests import Request, chain_keys

__all__ = [
    "TRACE_DIR_ENV",
    "TRACE_FILES",
    "WORKLOADS",
    "bursts",
    "hot_prefix",
    "load_aibrix",
    "load_azure",
    "load_mooncake",
    "make_workload",
    "read_trace",
    "short_long_mix",
    "subsample",
    "uniform_short",
    "with_bursts",
]

TRACE_DIR_ENV: Final = "ROUTEAUDIT_TRACE_DIR"
"""Environment variable: a folder of traces read instead of the packaged ones (read at each load)."""

TRACE_FILES: Final[Mapping[str, str]] = {
    "mooncake": "mooncake/conversation_trace.jsonl",
    "azure_code": "azure_llm_2023/AzureLLMInferenceTrace_code.csv",
    "azure_conv": "azure_llm_2023/AzureLLMInferenceTrace_conv.csv",
    "aibrix": "aibrix_synthetic/realistic-prefix-share-workload-p1024-s128-rps5.jsonl",
}
"""Trace name -> its path, uncompressed, under the trace folder."""

_COMPRESSED = (".xz", ".gz")


def _decompress(data: bytes, label: str) -> bytes:
    if label.endswith(".gz"):
        return gzip.decompress(data)
    if not label.endswith(".xz"):
        return data
    try:
        import lzma  # optional in CPython builds (needs liblzma); only .xz traces need it
    except ImportError:
        raise WorkloadError("cannot read .xz: this Python was built without the lzma module",
                            path=label) from None
    return lzma.decompress(data)


def _read_lines(label: str, opener: Callable[[], IO[bytes]]) -> list[str]:
    # Catch every way a file can be unusable here so a missing or damaged trace is one
    # WorkloadError naming the file (LZMAError and zlib.error are not OSErrors).
    try:
        with opener() as raw:
            text = _decompress(raw.read(), label).decode("utf-8")
    except FileNotFoundError:
        raise WorkloadError("trace file not found", path=label) from None
    except WorkloadError:
        raise
    except Exception as exc:  # OSError, EOFError, lzma.LZMAError, zlib.error, UnicodeDecodeError
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise WorkloadError(f"cannot read trace ({reason})", path=label) from None
    # Only line breaks end a line (str.splitlines would also cut at U+2028 inside JSON strings).
    return io.StringIO(text, newline="").readlines()


def read_trace(name: str, path: str | None = None) -> tuple[str, list[str]]:
    """Where trace ``name`` (a key of :data:`TRACE_FILES`) was read from, and its lines.

    ``path`` names a file to read instead (plain, ``.xz`` or ``.gz`` by its suffix). Else, with
    ``ROUTEAUDIT_TRACE_DIR`` set, the file under that folder, plain or with a ``.xz`` / ``.gz``
    suffix, first found; else the packaged copy. Raises :class:`~testbed.WorkloadError` (one line,
    naming the file) when the trace is missing, unreadable or not UTF-8.
    """
    if path is not None:
        return path, _read_lines(path, lambda: open(path, "rb"))
    try:
        rel = TRACE_FILES[name]
    except KeyError:
        raise WorkloadError(f"unknown trace {name!r}; known: {sorted(TRACE_FILES)}") from None
    folder = os.environ.get(TRACE_DIR_ENV)
    if folder:
        found = [p for p in (os.path.join(folder, rel + s) for s in ("", *_COMPRESSED)) if os.path.exists(p)]
        if not found:
            raise WorkloadError(f"trace file not found, nor with .xz or .gz ({TRACE_DIR_ENV} is set)",
                                path=os.path.join(folder, rel))
        return read_trace(name, found[0])
    packaged = importlib.resources.files("testbed").joinpath("data", "traces", rel + ".xz")
    return str(packaged), _read_lines(str(packaged), lambda: packaged.open("rb"))


_MOONCAKE_BLOCK = 512


def _json_objects(path: str, lines: Iterable[str]) -> Iterator[tuple[int, dict[str, Any]]]:
    """The JSON object on each non-blank line of a JSONL trace, with its line number."""
    for line_no, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise WorkloadError(f"invalid JSON ({exc.msg})", path=path, line=line_no) from None
        if not isinstance(obj, dict):
            raise WorkloadError("expected a JSON object", path=path, line=line_no)
        yield line_no, obj


def _int_field(obj: dict[str, Any], key: str, path: str, line: int, *, minimum: int = 0) -> int:
    if key not in obj:
        raise WorkloadError(f"missing field {key!r}", path=path, line=line)
    v = obj[key]
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v != int(v):
        raise WorkloadError(f"field {key!r} must be an integer, got {v!r}", path=path, line=line)
    if v < minimum:
        raise WorkloadError(f"field {key!r} must be >= {minimum}, got {v!r}", path=path, line=line)
    return int(v)


def _finish(reqs: list[Request], time_scale: float) -> list[Request]:
    if not time_scale > 0:
        raise WorkloadError(f"time_scale must be > 0, got {time_scale}")
    if not reqs:
        return reqs
    t0 = min(r.arrival_s for r in reqs)
    out = [
        Request(r.request_id, (r.arrival_s - t0) * time_scale, r.input_tokens, r.output_tokens,
                r.max_tokens, r.block_keys, r.block_tokens)
        for r in reqs
    ]
    out.sort(key=lambda r: r.arrival_s)
    return out


def _cap(out_len: int, max_tokens: int) -> tuple[int, int]:
    out_len = max(1, out_len)
    return min(out_len, max_tokens), max_tokens


def subsample(reqs: list[Request], *, limit: int | None = None, fraction: float | None = None,
              rng: random.Random | None = None) -> list[Request]:
    """Keep each request with probability ``fraction`` (seeded), then the first ``limit``."""
    if fraction is not None:
        if not 0 < fraction <= 1:
            raise WorkloadError(f"fraction must be in (0, 1], got {fraction}")
        r = rng or random.Random(0)
        reqs = [q for q in reqs if r.random() < fraction]
    if limit is not None:
        reqs = reqs[:limit]
    return reqs


def load_mooncake(path: str | None = None, *, max_tokens: int = 2048, time_scale: float = 1.0,
                  limit: int | None = None, fraction: float | None = None,
                  rng: random.Random | None = None) -> list[Request]:
    """Mooncake JSONL ``{timestamp (ms), input_length, output_length, hash_ids}``.

    ``hash_ids`` are 512-token prefix blocks (``len == ceil(input_length / 512)``); they become
    hash-chained segment keys, so a segment is reusable only after all earlier ones. Outputs
    longer than ``max_tokens`` are cut there (finish reason ``length``).
    """
    path, lines = read_trace("mooncake", path)
    reqs: list[Request] = []
    for line_no, obj in _json_objects(path, lines):
        if limit is not None and fraction is None and len(reqs) >= limit:
            break
        ts = _int_field(obj, "timestamp", path, line_no)
        inp = _int_field(obj, "input_length", path, line_no, minimum=1)
        out = _int_field(obj, "output_length", path, line_no)
        ids = obj.get("hash_ids")
        if not isinstance(ids, list) or not all(isinstance(x, int) and not isinstance(x, bool) for x in ids):
            raise WorkloadError("field 'hash_ids' must be a list of integers", path=path, line=line_no)
        want = math.ceil(inp / _MOONCAKE_BLOCK)
        if len(ids) != want:
            raise WorkloadError(
                f"hash_ids has {len(ids)} blocks, input_length {inp} needs {want}",
                path=path, line=line_no,
            )
        o, mt = _cap(out, max_tokens)
        reqs.append(Request(f"mc-{line_no - 1}", ts / 1000.0, inp, o, mt, chain_keys(ids), _MOONCAKE_BLOCK))
    return _finish(subsample(reqs, limit=limit, fraction=fraction, rng=rng), time_scale)


def _parse_azure_ts(s: str) -> float:
    s = s.strip()
    if "." in s:
        head, frac = s.split(".", 1)
        s = f"{head}.{frac[:6]}"
    return datetime.fromisoformat(s).timestamp()


def load_azure(path: str | None = None, *, kind: str = "conv", max_tokens: int = 2048,
               time_scale: float = 1.0, limit: int | None = None, fraction: float | None = None,
               rng: random.Random | None = None, block_tokens: int = 512) -> list[Request]:
    """Azure LLM inference 2023 CSV ``TIMESTAMP,ContextTokens,GeneratedTokens``.

    No prefix information: every request gets unique segment keys (no reuse).
    """
    if kind not in ("code", "conv"):
        raise WorkloadError(f"kind must be 'code' or 'conv', got {kind!r}")
    path, lines = read_trace(f"azure_{kind}", path)
    reqs: list[Request] = []
    reader = csv.reader(lines)
    header = next(reader, None)
    if header is None or [h.strip() for h in header] != ["TIMESTAMP", "ContextTokens", "GeneratedTokens"]:
        raise WorkloadError(f"expected header TIMESTAMP,ContextTokens,GeneratedTokens, got {header}",
                            path=path, line=1)
    for row in reader:
        line_no = reader.line_num
        if not row:
            continue
        if limit is not None and fraction is None and len(reqs) >= limit:
            break
        if len(row) != 3:
            raise WorkloadError(f"expected 3 columns, got {len(row)}", path=path, line=line_no)
        try:
            ts = _parse_azure_ts(row[0])
        except ValueError:
            raise WorkloadError(f"bad TIMESTAMP {row[0]!r}", path=path, line=line_no) from None
        try:
            inp, out = int(row[1]), int(row[2])
        except ValueError:
            raise WorkloadError(f"token counts must be integers, got {row[1:]!r}",
                                path=path, line=line_no) from None
        if inp < 1 or out < 0:
            raise WorkloadError(f"token counts out of range: {inp}, {out}", path=path, line=line_no)
        n = math.ceil(inp / block_tokens)
        o, mt = _cap(out, max_tokens)
        rid = f"az{kind}-{line_no - 2}"
        keys = chain_keys(list(range(n)), salt=zlib.crc32(rid.encode()))
        reqs.append(Request(rid, ts, inp, o, mt, keys, block_tokens))
    return _finish(subsample(reqs, limit=limit, fraction=fraction, rng=rng), time_scale)


def _text_keys(text: str, n_tokens: int, block_tokens: int) -> tuple[int, ...]:
    n = math.ceil(n_tokens / block_tokens)
    chars_per_block = max(1, math.ceil(len(text) / n)) if n else 1
    raw = []
    for i in range(n):
        chunk = text[i * chars_per_block:(i + 1) * chars_per_block].encode("utf-8")
        raw.append(int.from_bytes(hashlib.blake2b(chunk, digest_size=8).digest(), "big"))
    return chain_keys(raw)


def load_aibrix(path: str | None = None, *, max_tokens: int = 2048, time_scale: float = 1.0,
                limit: int | None = None, fraction: float | None = None,
                rng: random.Random | None = None, block_tokens: int = 64) -> list[Request]:
    """AIBrix JSONL ``{timestamp (ms), requests: [{"Prompt Length", "Output Length", "prompt"}]}``.

    Prefix keys come from the prompt text, cut into ``block_tokens``-token segments by the
    characters-per-token ratio of the prompt (no tokenizer), hashed with BLAKE2b.
    """
    path, lines = read_trace("aibrix", path)
    reqs: list[Request] = []
    for line_no, obj in _json_objects(path, lines):
        ts = _int_field(obj, "timestamp", path, line_no)
        items = obj.get("requests")
        if not isinstance(items, list) or not items:
            raise WorkloadError("field 'requests' must be a non-empty list", path=path, line=line_no)
        for j, it in enumerate(items):
            if not isinstance(it, dict):
                raise WorkloadError(f"requests[{j}] must be an object", path=path, line=line_no)
            inp = _int_field(it, "Prompt Length", path, line_no, minimum=1)
            out = _int_field(it, "Output Length", path, line_no)
            text = it.get("prompt")
            if not isinstance(text, str) or not text:
                raise WorkloadError(f"requests[{j}].prompt must be a non-empty string", path=path, line=line_no)
            o, mt = _cap(out, max_tokens)
            reqs.append(Request(f"ab-{line_no - 1}-{j}", ts / 1000.0, inp, o, mt,
                                _text_keys(text, inp, block_tokens), block_tokens))
    return _finish(subsample(reqs, limit=limit, fraction=fraction, rng=rng), time_scale)


# ---------------------------------------------------------------------------- synthetic
def _poisson_times(rng: random.Random, n: int, rate: float, start: float = 0.0) -> list[float]:
    t = start
    out = []
    for _ in range(n):
        t += rng.expovariate(rate)
        out.append(t)
    return out


def _unique(rid: str, inp: int, out: int, t: float, bt: int, max_tokens: int, salt: int) -> Request:
    o, mt = _cap(out, max_tokens)
    return Request(rid, t, inp, o, mt, chain_keys(list(range(math.ceil(inp / bt))), salt=salt), bt)


def uniform_short(n: int, rng: random.Random, *, rate: float = 20.0, max_tokens: int = 512,
                  block_tokens: int = 64) -> list[Request]:
    """Short prompts (96-160 tokens), short answers (32-128), Poisson arrivals, no reuse."""
    times = _poisson_times(rng, n, rate)
    return [
        _unique(f"us-{i}", rng.randint(96, 160), rng.randint(32, 128), t, block_tokens, max_tokens,
                rng.getrandbits(60))
        for i, t in enumerate(times)
    ]


def short_long_mix(n: int, rng: random.Random, *, rate: float = 4.0, long_fraction: float = 0.2,
                   short_tokens: int = 128, long_tokens: int = 8192, output_tokens: int = 128,
                   max_tokens: int = 512, block_tokens: int = 64) -> list[Request]:
    """The seed's mix: 128-token questions and 8192-token documents, no reuse."""
    times = _poisson_times(rng, n, rate)
    return [
        _unique(f"sl-{i}", long_tokens if rng.random() < long_fraction else short_tokens,
                output_tokens, t, block_tokens, max_tokens, rng.getrandbits(60))
        for i, t in enumerate(times)
    ]


def hot_prefix(n: int, rng: random.Random, *, rate: float = 8.0, n_prefixes: int = 2,
               hot_fraction: float = 0.8, prefix_tokens: int = 2048, suffix_tokens: int = 256,
               output_tokens: int = 128, max_tokens: int = 512, block_tokens: int = 64) -> list[Request]:
    """Most requests share one of a few long system prompts (first prefix is the hottest)."""
    times = _poisson_times(rng, n, rate)
    pblocks = math.ceil(prefix_tokens / block_tokens)
    out: list[Request] = []
    weights = [1.0 / (k + 1) for k in range(n_prefixes)]
    for i, t in enumerate(times):
        inp = prefix_tokens + suffix_tokens
        nb = math.ceil(inp / block_tokens)
        uniq = rng.getrandbits(60)
        if rng.random() < hot_fraction:
            p = rng.choices(range(n_prefixes), weights)[0]
            raw = [(1, p, b) for b in range(pblocks)] + [(2, uniq, b) for b in range(nb - pblocks)]
        else:
            raw = [(2, uniq, b) for b in range(nb)]
        o, mt = _cap(output_tokens, max_tokens)
        out.append(Request(f"hp-{i}", t, inp, o, mt, chain_keys([hash(x) for x in raw]), block_tokens))
    return out


def with_bursts(reqs: list[Request], rng: random.Random, *, n_bursts: int = 3, burst_size: int = 60,
                burst_span_s: float = 2.0, input_tokens: tuple[int, int] = (2000, 12000),
                output_tokens: int = 256, max_tokens: int = 2048, block_tokens: int = 512) -> list[Request]:
    """Add ``n_bursts`` bursts of ``burst_size`` unique requests, each within ``burst_span_s``,
    at evenly spaced instants of the base workload's span."""
    span = max((r.arrival_s for r in reqs), default=60.0)
    extra: list[Request] = []
    for b in range(n_bursts):
        t0 = span * (b + 1) / (n_bursts + 1)
        for k in range(burst_size):
            extra.append(_unique(f"burst-{b}-{k}", rng.randint(*input_tokens), output_tokens,
                                 t0 + rng.random() * burst_span_s, block_tokens, max_tokens,
                                 rng.getrandbits(60)))
    return sorted(reqs + extra, key=lambda r: r.arrival_s)


def bursts(n: int, rng: random.Random, *, base_rate: float = 3.0, **kw: Any) -> list[Request]:
    """Short/long background at ``base_rate`` plus overload bursts (see :func:`with_bursts`)."""
    base = short_long_mix(n, rng, rate=base_rate)
    return with_bursts(base, rng, **kw)


# ---------------------------------------------------------------------------- registry
WorkloadFactory = Callable[[int | None, random.Random], list[Request]]


def _mooncake(n: int | None, rng: random.Random) -> list[Request]:
    return load_mooncake(limit=n)


WORKLOADS: dict[str, tuple[str, WorkloadFactory]] = {
    "mooncake": ("Mooncake conversation trace (Kimi, 1 h, 12,031 requests, 512-token prefix blocks)", _mooncake),
    "azure_code": ("Azure LLM 2023 code trace (no prefix info)", lambda n, rng: load_azure(kind="code", limit=n)),
    "azure_conv": ("Azure LLM 2023 conversation trace (no prefix info)",
                   lambda n, rng: load_azure(kind="conv", limit=n)),
    "aibrix": ("AIBrix synthetic prefix-share workload with prompt text", lambda n, rng: load_aibrix(limit=n)),
    "uniform_short": ("synthetic: uniform short requests", lambda n, rng: uniform_short(n or 2000, rng)),
    "short_long_mix": ("synthetic: 128 vs 8192-token prompts", lambda n, rng: short_long_mix(n or 2000, rng)),
    "hot_prefix": ("synthetic: hot shared system prompts", lambda n, rng: hot_prefix(n or 2000, rng)),
    "bursts": ("synthetic: short/long background plus overload bursts", lambda n, rng: bursts(n or 2000, rng)),
}
"""Workload name -> (one-line description, factory ``(n_requests, rng) -> requests``)."""


def trace_format(path: str) -> str:
    """``"mooncake"`` (JSONL with ``input_length``) or ``"azure"`` (CSV with the Azure header),
    read from the file's first non-blank line; :class:`WorkloadError` for anything else."""
    _, lines = read_trace("", path)
    first = next((line.strip() for line in lines if line.strip()), "")
    if first.startswith("{"):
        try:
            obj = json.loads(first)
        except json.JSONDecodeError as exc:
            raise WorkloadError(f"invalid JSON ({exc.msg})", path=path, line=1) from None
        if isinstance(obj, dict) and "input_length" in obj:
            return "mooncake"
        raise WorkloadError("a JSONL trace needs Mooncake's fields {timestamp, input_length, "
                            "output_length, hash_ids}", path=path, line=1)
    if [h.strip() for h in first.split(",")] == ["TIMESTAMP", "ContextTokens", "GeneratedTokens"]:
        return "azure"
    raise WorkloadError("not a trace this reads: Mooncake JSONL {timestamp, input_length, "
                        "output_length, hash_ids} or Azure CSV TIMESTAMP,ContextTokens,GeneratedTokens",
                        path=path, line=1)


def load_trace(path: str, *, max_tokens: int = 2048, limit: int | None = None) -> list[Request]:
    """A recorded trace of one's own as a workload, its format detected (:func:`trace_format`):
    the first ``limit`` requests in arrival order."""
    if trace_format(path) == "mooncake":
        return load_mooncake(path, max_tokens=max_tokens, limit=limit)
    return load_azure(path, max_tokens=max_tokens, limit=limit)


def make_workload(name: str, *, n_requests: int | None = None, rng: random.Random | None = None) -> list[Request]:
    try:
        _, factory = WORKLOADS[name]
    except KeyError:
        raise UnknownNameError(f"unknown workload {name!r}; known: {sorted(WORKLOADS)}") from None
    reqs = factory(n_requests, rng or random.Random(0))
    return reqs[:n_requests] if n_requests is not None else reqs
