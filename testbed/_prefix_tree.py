"""A router's own approximate view of what each replica has cached.

Like SGLang's cache-aware router it remembers, per replica, the prefixes it *sent* there (not
what the replica actually kept), and trims itself with its own LRU policy on its own schedule.
So it can believe in blocks the replica evicted long ago: exactly the disagreement an audit must
be able to see.
"""

from __future__ import annotations

from collections import OrderedDict

from ._requests import Request

__all__ = ["PrefixTree"]


class PrefixTree:
    """Per-replica LRU sets of chained block keys; ``match`` stops at the first miss."""

    __slots__ = ("_sets", "_tokens", "max_tokens")

    def __init__(self, n_replicas: int, max_tokens: int) -> None:
        self._sets: list[OrderedDict[int, int]] = [OrderedDict() for _ in range(n_replicas)]
        self._tokens = [0] * n_replicas
        self.max_tokens = max_tokens

    def match_tokens(self, replica: int, req: Request) -> int:
        s = self._sets[replica]
        n = 0
        for k in req.block_keys:
            if k not in s:
                break
            n += 1
        return min(n * req.block_tokens, req.input_tokens)

    def match_all(self, req: Request) -> list[int]:
        """:meth:`match_tokens` for every replica."""
        keys = req.block_keys
        bt = req.block_tokens
        inp = req.input_tokens
        out = []
        for s in self._sets:
            n = 0
            for k in keys:
                if k not in s:
                    break
                n += 1
            t = n * bt
            out.append(t if t < inp else inp)
        return out

    def insert(self, replica: int, req: Request) -> None:
        s = self._sets[replica]
        bt = req.block_tokens
        p = req.input_tokens
        move = s.move_to_end
        added = 0
        for i, k in enumerate(req.block_keys):
            if k in s:
                move(k)
            else:
                size = min(bt, p - i * bt)
                s[k] = size
                added += size
        self._tokens[replica] += added

    def size_tokens(self, replica: int) -> int:
        return self._tokens[replica]

    def evict(self) -> int:
        """Trim every replica's set to ``max_tokens`` (least recently used first)."""
        removed = 0
        for r, s in enumerate(self._sets):
            while self._tokens[r] > self.max_tokens and s:
                _, size = s.popitem(last=False)
                self._tokens[r] -= size
                removed += 1
        return removed
