"""KV block pool with a hash-chained prefix cache and LRU eviction of unreferenced entries.

Cache entries are prompt *segments* (a workload's prefix block, e.g. Mooncake's 512 tokens),
each holding ``ceil(segment_tokens / block_size)`` KV blocks. Lookups walk a prompt's keys from
the first and stop at the first miss, so a segment is reusable only if all earlier segments of
the same prompt are resident (the prefix-chain rule). Only entries with no reference are
evictable, oldest release first; a referenced entry is never evicted.
"""

from __future__ import annotations

from collections import OrderedDict

__all__ = ["Entry", "KVPool"]


class Entry:
    __slots__ = ("key", "nblocks", "ref")

    def __init__(self, key: int, nblocks: int, ref: int = 0) -> None:
        self.key = key
        self.nblocks = nblocks
        self.ref = ref


class KVPool:
    """Block accounting for one replica. Not thread-safe; owned by one replica."""

    __slots__ = ("capacity", "free", "entries", "lru", "evictable", "evictions", "evicted_blocks")

    def __init__(self, capacity_blocks: int) -> None:
        self.capacity = capacity_blocks
        self.free = capacity_blocks  # blocks neither held by a sequence nor cached
        self.entries: dict[int, Entry] = {}
        self.lru: OrderedDict[int, Entry] = OrderedDict()  # unreferenced entries, oldest first
        self.evictable = 0  # blocks in ``lru``
        self.evictions = 0
        self.evicted_blocks = 0

    # -- lookups ---------------------------------------------------------------------------
    def match(self, keys: tuple[int, ...]) -> int:
        """Number of leading keys resident (contiguous prefix only)."""
        entries = self.entries
        n = 0
        for k in keys:
            if k not in entries:
                break
            n += 1
        return n

    def available(self) -> int:
        """Blocks that an allocation could obtain (free plus evictable)."""
        return self.free + self.evictable

    def usage(self) -> float:
        """Fraction of blocks in use by sequences (cached-but-free blocks count as free, as in
        vLLM's ``kv_cache_usage_perc``)."""
        return (self.capacity - self.free - self.evictable) / self.capacity

    # -- references ------------------------------------------------------------------------
    def acquire(self, entry: Entry) -> None:
        if entry.ref == 0:
            del self.lru[entry.key]
            self.evictable -= entry.nblocks
        entry.ref += 1

    def release(self, entry: Entry) -> None:
        entry.ref -= 1
        if entry.ref == 0:
            if entry.key in self.entries:
                self.lru[entry.key] = entry  # most recently used at the end
                self.evictable += entry.nblocks
            else:  # pragma: no cover - entries are only removed when unreferenced
                self.free += entry.nblocks

    def release_all(self, entries: list[Entry]) -> None:
        """:meth:`release` each of ``entries`` in order (one call per finished sequence: this
        runs once per cached segment of every request)."""
        lru = self.lru
        live = self.entries
        freed = 0
        for e in entries:
            e.ref -= 1
            if e.ref == 0:
                if e.key in live:
                    lru[e.key] = e
                    freed += e.nblocks
                else:  # pragma: no cover - entries are only removed when unreferenced
                    self.free += e.nblocks
        self.evictable += freed

    # -- blocks ----------------------------------------------------------------------------
    def allocate(self, n: int) -> bool:
        """Take ``n`` free blocks, evicting LRU entries as needed; False (nothing taken, but
        evictions may have happened) when impossible."""
        if n <= 0:
            return True
        free = self.free
        if n > free + self.evictable:
            return False
        if free < n:
            lru = self.lru
            entries = self.entries
            blocks = count = 0
            while free < n:
                key, e = lru.popitem(False)  # oldest first
                del entries[key]
                free += e.nblocks
                blocks += e.nblocks
                count += 1
            self.evictable -= blocks
            self.evictions += count
            self.evicted_blocks += blocks
        self.free = free - n
        return True

    def release_blocks(self, n: int) -> None:
        self.free += n

    def register(self, key: int, nblocks: int) -> Entry:
        """Turn ``nblocks`` blocks a sequence holds privately into a cache entry it references."""
        e = Entry(key, nblocks, 1)
        self.entries[key] = e
        return e

    def check(self) -> None:
        """Invariant check (tests): counters agree with the entries."""
        assert self.evictable == sum(e.nblocks for e in self.lru.values())
        assert all(e.ref == 0 for e in self.lru.values())
        assert all(e.ref > 0 or k in self.lru for k, e in self.entries.items())
        assert 0 <= self.free <= self.capacity
