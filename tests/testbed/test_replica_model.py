from __future__ import annotations

from testbed import CostModel, Environment, ReplicaConfig, Request
from testbed._kvcache import KVPool
from testbed._replica import Replica, Seq
from testbed._requests import chain_keys


def _req(rid: str, ids: list[int], *, bt: int = 64, t: float = 0.0, out: int = 4, inp: int | None = None) -> Request:
    inp = inp if inp is not None else len(ids) * bt
    return Request(rid, t, inp, out, 1024, chain_keys(ids), bt)


def _replica(env: Environment, done: list[Seq], **kw: object) -> Replica:
    cfg = ReplicaConfig(**{"kv_capacity_tokens": 64 * 64, "block_size": 16, **kw})  # type: ignore[arg-type]
    return Replica(0, "r0", cfg, CostModel(), env, done.append)


def test_cache_hit_only_on_contiguous_prefix() -> None:
    pool = KVPool(100)
    keys = chain_keys([1, 2, 3, 4])
    for k in keys:
        assert pool.allocate(4)
        pool.release(pool.register(k, 4))
    assert pool.match(keys) == 4
    # evict the first segment's entry: nothing after it may hit any more
    del pool.lru[keys[0]], pool.entries[keys[0]]
    pool.evictable -= 4
    pool.free += 4
    assert pool.match(keys) == 0
    # same raw ids after a different first block give different (chained) keys
    other = chain_keys([9, 2, 3, 4])
    assert not set(other) & set(keys)


def test_replica_reuses_prefix_of_previous_request() -> None:
    env, done = Environment(), []
    rep = _replica(env, done)
    rep.submit(_req("a", [1, 2, 3, 4]))
    env.run()
    assert rep.match_tokens(_req("b", [1, 2, 7, 8])) == 128
    assert rep.match_tokens(_req("c", [5, 2, 3, 4])) == 0  # middle blocks alone never hit
    seq = rep.submit(_req("b", [1, 2, 7, 8], t=env.now))
    env.run()
    assert seq.cached_first == 128 and seq.finish_reason == "stop"


def test_eviction_frees_only_unreferenced_blocks() -> None:
    pool = KVPool(10)
    e1 = pool.register(1, 4)
    pool.allocate(4)  # e1's blocks (held by a sequence, then registered)
    e2 = pool.register(2, 4)
    pool.allocate(4)
    pool.release(e2)  # e2 unreferenced -> evictable; e1 still referenced
    assert pool.available() == 2 + 4
    assert not pool.allocate(7)  # would need e1's blocks: impossible
    assert pool.allocate(6)  # evicts e2 only
    assert 1 in pool.entries and 2 not in pool.entries and e1.ref == 1
    assert pool.evictions == 1
    pool.check()


def test_ttft_grows_with_queue() -> None:
    env, done = Environment(), []
    rep = _replica(env, done, max_batched_tokens=512, kv_capacity_tokens=1 << 20)
    seqs = [rep.submit(_req(f"q{i}", [100 + i] * 1, bt=2048, inp=2048)) for i in range(6)]
    env.run()
    ttfts = [s.t_first_token for s in seqs]
    assert all(t is not None for t in ttfts)
    assert ttfts == sorted(ttfts) and ttfts[-1] > 3 * ttfts[0]  # type: ignore[operator]


def test_preemption_when_pool_exhausted_and_finish_reasons() -> None:
    env, done = Environment(), []
    # 40 blocks of 16 tokens; each request needs 16 prompt blocks and grows while decoding
    rep = _replica(env, done, kv_capacity_tokens=40 * 16)
    a = rep.submit(Request("a", 0, 256, 200, 200, chain_keys([1, 2, 3, 4]), 64))
    b = rep.submit(Request("b", 0, 256, 150, 400, chain_keys([5, 6, 7, 8]), 64))
    env.run()
    assert {s.finish_reason for s in done} == {"length", "stop"}
    assert a.finish_reason == "length" and b.finish_reason == "stop"
    assert a.preemptions + b.preemptions >= 1
    assert a.generated == 200 and b.generated == 150
    rep.pool.check()
    assert rep.pool.free + rep.pool.evictable == rep.pool.capacity  # nothing leaked


def test_request_that_never_fits_is_aborted() -> None:
    env, done = Environment(), []
    rep = _replica(env, done, kv_capacity_tokens=16 * 16)
    s = rep.submit(Request("big", 0, 1024, 8, 8, chain_keys(list(range(16))), 64))
    assert s.finish_reason == "abort" and done == [s]


def test_client_abort_frees_blocks() -> None:
    env, done = Environment(), []
    rep = _replica(env, done)
    s = rep.submit(Request("a", 0, 256, 500, 1024, chain_keys([1, 2, 3, 4]), 64))
    env.at(0.2, 3, rep.abort, s)
    env.run()
    assert s.finish_reason == "abort" and 0 < s.generated < 500
    assert rep.pool.free + rep.pool.evictable == rep.pool.capacity


def test_decode_run_matches_stepwise_token_count() -> None:
    """A decode run interrupted by an arrival still produces every token exactly once."""
    env, done = Environment(), []
    rep = _replica(env, done, kv_capacity_tokens=1 << 20)
    a = rep.submit(Request("a", 0, 64, 300, 1024, chain_keys([1]), 64))
    env.at(0.5, 2, lambda: rep.submit(Request("b", 0.5, 64, 50, 1024, chain_keys([2]), 64)))
    env.run()
    assert a.generated == 300 and len(done) == 2
    snap = rep.snapshot()
    assert snap.waiting == 0 and snap.running == 0 and snap.remaining_tokens == 0


def test_backlog_counts_a_queued_prompt_without_the_prefix_it_finds_cached() -> None:
    # a 2,048-token prompt, a second one sharing its 32 segments plus two of its own, and an
    # unrelated one, all at once on a 512-token step budget: the second is admitted after the
    # first has published its segments and recomputes only its own two (the snapshot's
    # remaining_prefill_tokens counts it whole)
    env, done = Environment(), []
    rep = _replica(env, done, max_batched_tokens=512, kv_capacity_tokens=1 << 20)
    prefix = list(range(1, 33))
    seqs = [rep.submit(_req("a", prefix)), rep.submit(_req("b", [*prefix, 90, 91])),
            rep.submit(_req("c", list(range(200, 216))))]
    backlog = rep.backlog_prefill_tokens()
    whole = rep.snapshot().remaining_prefill_tokens
    env.run()
    assert seqs[1].cached_first == 2048
    assert backlog == sum(s.target - (s.cached_first or 0) for s in seqs) == 2048 + 128 + 1024
    assert whole == 2048 + 2176 + 1024
    assert rep.backlog_prefill_tokens() == rep.rem_prefill == 0


def test_backlog_counts_the_cache_held_now_and_nothing_while_idle() -> None:
    env, done = Environment(), []
    rep = _replica(env, done, max_batched_tokens=512, kv_capacity_tokens=1 << 20)
    rep.submit(_req("a", list(range(1, 9))))
    env.run()
    assert rep.backlog_prefill_tokens() == 0
    # a long unrelated prompt keeps the budget; the queued one finds a's 8 segments cached
    rep.submit(_req("x", list(range(300, 340)), t=env.now))
    rep.submit(_req("b", [*range(1, 9), 95], t=env.now))
    assert rep.backlog_prefill_tokens() == 40 * 64 + 64


def test_backlog_counts_an_unreferenced_prefix_until_the_work_ahead_evicts_it() -> None:
    # a's 8 segments stay cached unreferenced (32 of 256 blocks); a long prompt x goes ahead
    # of b, which shares a's prefix: while what x still allocates fits the free blocks, b finds
    # the prefix at its admission; past that the pool evicts a's first segment (released
    # first) and b computes the prompt whole
    for x_tokens, b_cached in ((3300, 512), (3800, 0)):
        env, done = Environment(), []
        rep = _replica(env, done, max_batched_tokens=512)
        rep.submit(_req("a", list(range(1, 9))))
        env.run()
        rep.submit(_req("x", list(range(300, 300 + -(-x_tokens // 64))), inp=x_tokens,
                        t=env.now))
        b = rep.submit(_req("b", [*range(1, 9), 95], t=env.now))
        backlog = rep.backlog_prefill_tokens()
        env.run()
        assert b.cached_first == b_cached
        assert backlog == x_tokens + 576 - b_cached


def test_backlog_evicts_the_least_recently_released_segments_first() -> None:
    # o's segments were released before a's: the blocks x takes beyond the free ones come out
    # of o's, and b still finds a's prefix at its admission
    env, done = Environment(), []
    rep = _replica(env, done, max_batched_tokens=512)
    rep.submit(_req("o", list(range(500, 508))))
    env.run()
    rep.submit(_req("a", list(range(1, 9)), t=env.now))
    env.run()
    x = rep.submit(_req("x", list(range(300, 352)), inp=3300, t=env.now))
    b = rep.submit(_req("b", [*range(1, 9), 95], t=env.now))
    backlog = rep.backlog_prefill_tokens()
    assert x.req.input_tokens - 32 * 16 > rep.pool.free * 16  # x evicts cached segments
    env.run()
    assert b.cached_first == 512
    assert backlog == 3300 + 64
