"""The router's last-replica prefix index: its predictions against the replicas' true caches."""

from __future__ import annotations

import pytest

import testbed
from testbed import ConfigError, FleetConfig, RouterConfig, prepare_scenario
from testbed._prefix_tree import LastReplicaIndex, PrefixTree
from testbed._sim import Record

N = 400


@pytest.fixture(scope="module")
def sim() -> testbed.Simulation:
    s = prepare_scenario("last_replica_prefix_index", n_requests=N)
    s.run()
    return s


def test_scenario_uses_a_last_replica_index(sim: testbed.Simulation) -> None:
    assert sim.cfg.router.policy == "cache_aware"
    assert isinstance(sim.routers[0].tree, LastReplicaIndex)
    base = prepare_scenario("partial_prefix_index", n_requests=1)
    assert isinstance(base.routers[0].tree, PrefixTree)


def test_prediction_is_the_run_owned_by_the_last_receiver(sim: testbed.Simulation) -> None:
    """Each decision predicts cached tokens on one replica at most: the one that last received
    the prompt's first block, for the leading blocks it also received last."""
    last: dict[int, int] = {}  # block key -> replica that last received it, from the records
    predicted_somewhere = 0
    for rec in sim.records:
        req = rec.req
        keys = req.block_keys
        owner = last.get(keys[0])
        expect = [0] * len(rec.predicted)
        if owner is not None:
            n = 0
            for k in keys:
                if last.get(k) != owner:
                    break
                n += 1
            expect[owner] = min(n * req.block_tokens, req.input_tokens)
            predicted_somewhere += expect[owner] > 0
        assert rec.predicted == expect, req.request_id
        assert sum(p > 0 for p in rec.predicted) <= 1
        assert rec.choice is not None
        if rec.choice.index is not None:
            for k in keys:
                last[k] = rec.choice.index
    assert predicted_somewhere > 0


def test_index_is_wrong_both_ways_on_the_true_state(sim: testbed.Simulation) -> None:
    """Cold on a replica whose cache holds the prefix (an earlier receiver), hot on the last
    receiver after its cache evicted blocks that had been computed there."""
    last: dict[int, int] = {}
    sent_to: dict[tuple[int, int], list[Record]] = {}
    cold_but_held = hot_but_evicted = 0
    for rec in sim.records:
        req = rec.req
        bt = req.block_tokens
        now = rec.t_decide
        for r, (p, c) in enumerate(zip(rec.predicted, rec.true_cached, strict=True)):
            if p == 0 and c >= bt:
                # the replica holds the first block, yet the index names another replica
                assert last.get(req.block_keys[0]) not in (None, r)
                assert (req.block_keys[0], r) in sent_to
                cold_but_held += 1
            if p - c >= bt:
                # first predicted block the replica lacks now; it was sent there, and every
                # request that brought it had been prefilled before this decision
                k = req.block_keys[c // bt]
                assert last.get(k) == r
                senders = sent_to[(k, r)]
                if all(s.seq is not None and s.seq.t_first_token is not None
                       and s.seq.t_first_token <= now for s in senders):
                    hot_but_evicted += 1
        assert rec.choice is not None
        i = rec.choice.index
        if i is not None:
            for k in req.block_keys:
                last[k] = i
                sent_to.setdefault((k, i), []).append(rec)
    assert cold_but_held > 0
    assert hot_but_evicted > 0


def test_index_trims_least_recent_blocks() -> None:
    from testbed._requests import Request

    idx = LastReplicaIndex(2, max_tokens=1024)  # 2048 tokens in all
    a = Request("a", 0.0, 1536, 1, 1, (1, 2, 3))
    b = Request("b", 0.0, 1536, 1, 1, (4, 5, 6))
    idx.insert(0, a)
    idx.insert(1, b)
    assert idx.match_all(a) == [1536, 0] and idx.match_all(b) == [0, 1536]
    idx.insert(1, a)  # a's blocks move to replica 1 and become the most recent
    assert idx.match_all(a) == [0, 1536]
    assert idx.evict() == 2 and idx.size_tokens() == 2048
    assert idx.owner(4) is None and idx.owner(6) == 1
    assert idx.match_all(b) == [0, 0]


def test_unknown_prefix_index_is_a_config_error() -> None:
    with pytest.raises(ConfigError):
        FleetConfig(router=RouterConfig(policy="cache_aware", prefix_index="nope")).validate()  # type: ignore[arg-type]
