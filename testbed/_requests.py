"""Requests as a workload describes them (immutable, shared by every run of that workload)."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Request", "chain_keys"]

_MASK = (1 << 63) - 1


def chain_keys(raw_ids: tuple[int, ...] | list[int], salt: int = 0) -> tuple[int, ...]:
    """Hash-chain raw block ids: key i depends on ids 0..i, so equal keys mean equal prefixes.

    Python's hash of a tuple of ints is deterministic across processes (no hash
    randomisation for ints), so keys are stable run to run.
    """
    out: list[int] = []
    parent = salt
    for rid in raw_ids:
        parent = hash((parent, rid)) & _MASK
        out.append(parent)
    return tuple(out)


@dataclass(frozen=True, slots=True)
class Request:
    """One client request.

    ``block_keys`` are hash-chained prefix keys, one per ``block_tokens``-token segment of the
    prompt (the last segment may be shorter): ``len(block_keys) == ceil(input_tokens /
    block_tokens)``. ``output_tokens`` is what the model will generate if not aborted
    (``<= max_tokens``; equal means finish reason ``length``). ``arrival_s`` is virtual time.
    """

    request_id: str
    arrival_s: float
    input_tokens: int
    output_tokens: int
    max_tokens: int
    block_keys: tuple[int, ...]
    block_tokens: int = 512

    @property
    def finish_reason(self) -> str:
        return "length" if self.output_tokens >= self.max_tokens else "stop"

    def prefix_hashes(self) -> list[str]:
        """Block keys as hex strings (the ``routeaudit.request.prefix_hashes`` attribute)."""
        return [format(k, "016x") for k in self.block_keys]
