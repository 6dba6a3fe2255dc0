"""A router's own approximate view of what each replica has cached.

Like SGLang's cache-aware router it remembers, per replica, the prefixes it *sent* there (not
what the replica actually kept), and trims itself with its own LRU policy on its own schedule.
So it can believe in blocks the replica evicted long ago: exactly the disagreement an audit must
be able to see. :class:`LastReplicaIndex` remembers only the last replica per prefix, so it also
forgets prefixes that earlier replicas still hold.
"""

from __future__ import annotations

from collections import OrderedDict

from ._requests import Request

__all__ = ["LastReplicaIndex", "PrefixTree"]


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


class LastReplicaIndex:
    """One owner per block key: the replica that most recently received a request with it.

    A router index that answers "which replica has this prefix" with a single replica, like a
    prefix tree recording one tenant per node. The prediction is the run of the prompt's
    leading blocks whose owner is the first block's owner, on that replica; every other
    replica is predicted cold. So it predicts cold where an earlier receiver still holds the
    prefix, and hot where the last receiver has since evicted it. Trimmed LRU to
    ``max_tokens`` per replica times the number of replicas, on the same schedule as
    :class:`PrefixTree`.
    """

    __slots__ = ("_n", "_owner", "_tokens", "max_tokens")

    def __init__(self, n_replicas: int, max_tokens: int) -> None:
        self._n = n_replicas
        # block key -> (owner replica, segment tokens), least recently inserted first
        self._owner: OrderedDict[int, tuple[int, int]] = OrderedDict()
        self._tokens = 0
        self.max_tokens = max_tokens

    def owner(self, key: int) -> int | None:
        """The replica that last received a request with this block key (None: unknown)."""
        o = self._owner.get(key)
        return None if o is None else o[0]

    def _match(self, req: Request) -> tuple[int | None, int]:
        keys = req.block_keys
        if not keys:
            return None, 0
        get = self._owner.get
        first = get(keys[0])
        if first is None:
            return None, 0
        r = first[0]
        n = 0
        for k in keys:
            o = get(k)
            if o is None or o[0] != r:
                break
            n += 1
        t = n * req.block_tokens
        return r, t if t < req.input_tokens else req.input_tokens

    def match_tokens(self, replica: int, req: Request) -> int:
        r, t = self._match(req)
        return t if r == replica else 0

    def match_all(self, req: Request) -> list[int]:
        """:meth:`match_tokens` for every replica: at most one is non-zero."""
        out = [0] * self._n
        r, t = self._match(req)
        if r is not None:
            out[r] = t
        return out

    def insert(self, replica: int, req: Request) -> None:
        owner = self._owner
        bt = req.block_tokens
        p = req.input_tokens
        move = owner.move_to_end
        added = 0
        for i, k in enumerate(req.block_keys):
            o = owner.get(k)
            if o is None:
                size = min(bt, p - i * bt)
                owner[k] = (replica, size)
                added += size
            else:
                owner[k] = (replica, o[1])
                move(k)
        self._tokens += added

    def size_tokens(self) -> int:
        return self._tokens

    def evict(self) -> int:
        """Trim the index to ``max_tokens`` per replica in all (least recently used first)."""
        removed = 0
        limit = self.max_tokens * self._n
        owner = self._owner
        while self._tokens > limit and owner:
            _, (_, size) = owner.popitem(last=False)
            self._tokens -= size
            removed += 1
        return removed
