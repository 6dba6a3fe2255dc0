"""The attribution relations on small hand-built stores whose answer is known by construction.

Each test creates the marts as plain TABLES with the documented columns (docs/schema.md), the raw
tables from their DDL, and installs only the attribution layer on top. Every replica prefills at
1 ms per uncached token (intercept 0), so estimated TTFTs are exact arithmetic.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import duckdb
import pytest

from audit import _relations
from audit._store import _tune

ROOT = Path(__file__).resolve().parents[2]
T0 = datetime(2025, 1, 1, tzinfo=UTC)

MART_COLUMNS: dict[str, list[tuple[str, str]]] = {
    "requests": [
        ("request_key", "varchar"), ("request_id", "varchar"), ("trace_id", "varchar"), ("run_id", "varchar"),
        ("model", "varchar"), ("endpoint", "varchar"), ("input_tokens", "bigint"),
        ("max_tokens", "bigint"), ("stream", "boolean"), ("client_start", "timestamptz"),
        ("ttft_ms", "double"), ("tpot_ms", "double"), ("e2e_ms", "double"),
        ("output_tokens", "bigint"), ("finish_reason", "varchar"), ("status", "varchar"),
        ("http_status", "bigint"), ("failure_source", "varchar"), ("failure_reason", "varchar"),
        ("router_id", "varchar"), ("policy", "varchar"), ("attempts", "bigint"),
        ("chosen_replica", "varchar"), ("served_by", "varchar"),
        ("predicted_cached_tokens", "bigint"), ("actual_cached_tokens", "bigint"),
        ("router_ms", "double"), ("queue_ms", "double"), ("prefill_ms", "double"),
        ("decode_ms", "double"), ("replica_ttft_ms", "double"), ("has_client", "boolean"),
        ("has_router", "boolean"), ("has_replica", "boolean"),
        ("router_side_missing", "boolean"), ("link_method", "varchar"),
        ("clock_suspect", "boolean"), ("anchor_ns", "bigint"), ("part", "bigint"),
        ("verdict_final", "boolean"),
    ],
    "decisions": [
        ("request_key", "varchar"), ("request_id", "varchar"), ("attempt", "bigint"), ("trace_id", "varchar"),
        ("span_id", "varchar"), ("router_id", "varchar"), ("policy", "varchar"),
        ("decided_at", "timestamptz"), ("decided_ns", "bigint"),
        ("chosen_replica", "varchar"), ("reason", "varchar"), ("outcome", "varchar"),
        ("candidate_count", "bigint"), ("forward_status", "bigint"),
        ("forward_ms", "double"), ("recorded", "boolean"),
    ],
    "candidates": [
        ("request_key", "varchar"), ("request_id", "varchar"), ("attempt", "bigint"), ("decision_span_id", "varchar"),
        ("replica", "varchar"), ("eligible", "boolean"), ("excluded_reason", "varchar"),
        ("chosen", "boolean"), ("waiting", "bigint"), ("running", "bigint"),
        ("kv_usage", "double"), ("remaining_tokens", "bigint"),
        ("telemetry_ts", "timestamptz"), ("telemetry_age_ms", "double"),
        ("pending", "bigint"), ("predicted_cached_tokens", "bigint"),
        ("est_queue_ms", "double"), ("est_prefill_ms", "double"), ("score", "double"),
    ],
    "executions": [
        ("request_key", "varchar"), ("request_id", "varchar"), ("trace_id", "varchar"), ("span_id", "varchar"),
        ("replica", "varchar"), ("dp_rank", "bigint"), ("start_at", "timestamptz"),
        ("end_at", "timestamptz"), ("queue_ms", "double"), ("prefill_ms", "double"),
        ("decode_ms", "double"), ("ttft_ms", "double"), ("e2e_ms", "double"),
        ("input_tokens", "bigint"), ("output_tokens", "bigint"), ("cached_tokens", "bigint"),
        ("finish_reason", "varchar"), ("preemptions", "bigint"), ("status", "varchar"),
    ],
    "snapshots": [
        ("replica", "varchar"), ("dp_rank", "bigint"), ("scraped_at", "timestamptz"),
        ("ok", "boolean"), ("error", "varchar"), ("running", "double"),
        ("waiting", "double"), ("kv_usage", "double"), ("prefix_cache_hit_rate", "double"),
        ("cache_hit_rate", "double"), ("source", "varchar"), ("target", "varchar"),
        ("router_in_flight", "double"), ("router_healthy", "boolean"),
    ],
}


PARTITION_NS = 300 * 10**9
"""stg_partitioning's default width: every scenario lies within a few partitions of T0."""


def at(ms: float) -> datetime:
    return T0 + timedelta(milliseconds=ms)


def ns(ms: float) -> int:
    return (at(ms) - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(microseconds=1) * 1000


class Fleet:
    """Builds mart rows. Times are ms after T0; every replica prefills at 1 ms/token."""

    def __init__(self, run_id: str = "run1") -> None:
        self.run_id = run_id
        self.key_prefix = ""  # a second Fleet with another prefix reuses the same request ids
        self.extra_prefix_spans: list[tuple[str, str, str, list[str]]] = []
        self.rows: dict[str, list[dict[str, Any]]] = {name: [] for name in MART_COLUMNS}
        self.prefixes: list[tuple[str, list[str]]] = []

    def key(self, request_id: str) -> str:
        """The request's request_key (unique, unlike request ids)."""
        return f"{self.key_prefix}k-{request_id}"

    def execution(self, request_id: str, replica: str, *, arrive: float, queue: float,
                  input_tokens: int, cached: int = 0, decode: float = 500.0,
                  output_tokens: int = 11, preemptions: int = 0) -> dict[str, Any]:
        prefill = float(input_tokens - cached)
        ttft = queue + prefill
        row = {
            "request_key": self.key(request_id), "request_id": request_id,
            "replica": replica, "span_id": f"x-{request_id}",
            "start_at": at(arrive), "end_at": at(arrive + ttft + decode),
            "queue_ms": queue, "prefill_ms": prefill, "decode_ms": decode, "ttft_ms": ttft,
            "e2e_ms": ttft + decode, "input_tokens": input_tokens,
            "output_tokens": output_tokens, "cached_tokens": cached, "status": "ok",
            "preemptions": preemptions, "finish_reason": "stop",
        }
        self.rows["executions"].append(row)
        return row

    def request(self, request_id: str, *, start: float, ttft: float | None, input_tokens: int,
                status: str = "ok", output_tokens: int = 11, tpot: float | None = 50.0,
                replica: str | None = None, replica_ttft: float | None = None,
                has_replica: bool = True, predicted: int | None = None,
                actual: int | None = None, run_id: str | None = None) -> None:
        e2e = None if ttft is None else ttft + (tpot or 0.0) * max(output_tokens - 1, 0)
        self.rows["requests"].append({
            "request_key": self.key(request_id), "request_id": request_id,
            "run_id": run_id or self.run_id, "status": status,
            "client_start": at(start), "ttft_ms": ttft,
            "tpot_ms": tpot if output_tokens >= 2 else None, "e2e_ms": e2e,
            "output_tokens": output_tokens, "input_tokens": input_tokens,
            "chosen_replica": replica, "served_by": replica if has_replica else None,
            "replica_ttft_ms": replica_ttft if has_replica else None,
            "predicted_cached_tokens": predicted, "actual_cached_tokens": actual,
            "has_client": True, "has_router": True, "has_replica": has_replica,
            "router_side_missing": False, "clock_suspect": False, "attempts": 1,
            "anchor_ns": ns(start), "part": ns(start) // PARTITION_NS, "verdict_final": False,
        })

    def decision(self, request_id: str, *, at_ms: float, chosen: str,
                 candidates: list[dict[str, Any]] | None = None, router: str = "r1",
                 policy: str = "cache_aware", reason: str = "cache_affinity",
                 attempt: int = 0) -> None:
        span = f"d-{request_id}" + (f"-{attempt}" if attempt else "")
        self.rows["decisions"].append({
            "request_key": self.key(request_id), "request_id": request_id, "attempt": attempt,
            "trace_id": f"t-{self.key(request_id)}", "span_id": span, "router_id": router,
            "policy": policy, "decided_at": at(at_ms), "chosen_replica": chosen,
            "reason": reason, "outcome": "routed", "recorded": candidates is not None,
            "candidate_count": len(candidates or []),
        })
        for c in candidates or []:
            row = {"request_key": self.key(request_id), "request_id": request_id,
                   "attempt": attempt, "decision_span_id": span,
                   "eligible": True, "chosen": c["replica"] == chosen, **c}
            if "telemetry_age_ms" in row and "telemetry_ts" not in row:
                row["telemetry_ts"] = at(at_ms - row["telemetry_age_ms"])
            self.rows["candidates"].append(row)

    def snapshot(self, replica: str, *, at_ms: float, waiting: float, running: float,
                 kv: float = 0.3) -> None:
        self.rows["snapshots"].append({
            "replica": replica, "scraped_at": at(at_ms), "ok": True, "waiting": waiting,
            "running": running, "kv_usage": kv, "source": "replica",
        })

    def served(self, request_id: str, replica: str, *, arrive: float, queue: float,
               input_tokens: int, cached: int = 0, status: str = "ok") -> dict[str, Any]:
        """An execution plus its (fast or slow) request, client TTFT = replica TTFT + 20 ms."""
        e = self.execution(request_id, replica, arrive=arrive, queue=queue,
                           input_tokens=input_tokens, cached=cached)
        self.request(request_id, start=arrive - 10, ttft=e["ttft_ms"] + 20,
                     input_tokens=input_tokens, replica=replica, replica_ttft=e["ttft_ms"],
                     actual=cached, status=status)
        return e

    def served_took(self, request_id: str, replica: str, *, arrive: float, queue: float,
                    input_tokens: int, prefill_ms: float, ttft_ms: float) -> dict[str, Any]:
        """:meth:`served`, its prefill and replica TTFT as given (client TTFT 20 ms later)."""
        e = self.served(request_id, replica, arrive=arrive, queue=queue, input_tokens=input_tokens)
        e.update(prefill_ms=prefill_ms, ttft_ms=ttft_ms)
        self.rows["requests"][-1].update(replica_ttft_ms=ttft_ms, ttft_ms=ttft_ms + 20.0)
        return e

    def backlog(self, replica: str, n: int, *, tokens: int = 1000, prefix: str = "q") -> None:
        """n long prompts arriving at t=0 on one replica, prefilled one after the other."""
        for i in range(n):
            self.served(f"{prefix}{replica}{i}", replica, arrive=0.0, queue=i * tokens,
                        input_tokens=tokens)

    def prefix_spans(self) -> list[tuple[str, str, str, list[str]]]:
        """(trace_id, span_id, request_id, block hashes) of each decision span with prefixes."""
        own = [(f"t-{self.key(rid)}", f"d-{rid}", rid, h) for rid, h in self.prefixes]
        return own + self.extra_prefix_spans

    def store(self) -> duckdb.DuckDBPyConnection:
        con = duckdb.connect()
        _tune(con)
        for raw in ("raw_spans", "raw_span_events", "raw_snapshots"):
            con.execute((ROOT / "audit" / "sql" / "raw" / f"{raw}.sql").read_text())
        con.execute("create table routeaudit_meta (key varchar primary key, value varchar)")
        for name, cols in MART_COLUMNS.items():
            con.execute(f"create table {name} ({', '.join(f'{c} {t}' for c, t in cols)})")
            rows = self.rows[name]
            if rows:
                names = [c for c, _ in cols]
                con.executemany(
                    f"insert into {name} values ({', '.join('?' for _ in names)})",
                    [[r.get(c) for c in names] for r in rows],
                )
        for span in self.prefix_spans():
            con.execute(
                "insert into raw_spans (trace_id, span_id, name, kind, start_ns, end_ns, "
                "status_code, received_ns, event_count, a_request_id, a_attempt, "
                "a_prefix_hashes) values (?, ?, 'routeaudit.decision', 'internal', 0, 0, "
                "'unset', 0, 0, ?, 0, ?)",
                list(span),
            )
        install_attribution(con)
        return con


def install_attribution(con: duckdb.DuckDBPyConnection) -> None:
    """The attribution's relations: its ``int_attr_*`` steps and the marts built on the marts,
    with the partitioning settings they window by; tables and views as a store's refresh makes
    them (the parametrised ones are views, so a session variable set later is read)."""
    rels = _relations.load_relations()
    as_views = _relations.views(rels)
    for rel in rels:
        attribution = rel.name.startswith(("int_attr_", "int_slo_")) or (
            rel.layer == "marts" and rel.name not in MART_COLUMNS)
        if attribution or rel.name == "stg_partitioning":
            kind = "view" if rel.name in as_views else "table"
            con.execute(f"create or replace {kind} {rel.name} as\n{rel.sql.strip().rstrip(';')}")


def rows(con: duckdb.DuckDBPyConnection, sql: str, params: list[Any] | None = None
         ) -> list[dict[str, Any]]:
    rel = con.sql(sql, params=params)
    names = rel.columns
    return [dict(zip(names, r, strict=True)) for r in rel.fetchall()]


def primary(con: duckdb.DuckDBPyConnection, request_id: str) -> dict[str, Any]:
    found = rows(con, "select * from attributions where request_id = ? and is_primary",
                 [request_id])
    assert len(found) == 1, found
    return found[0]


def seen(waiting: int, running: int, age: float = 50.0, **extra: Any) -> dict[str, Any]:
    return {"waiting": waiting, "running": running, "telemetry_age_ms": age, **extra}


# --------------------------------------------------------------------------------------------
# Scenarios
# --------------------------------------------------------------------------------------------
def load_blind_fleet(router_saw_waiting: int = 9, router_saw_running: int = 1,
                     age: float = 50.0) -> Fleet:
    """A has 10 long prompts queued at t=0 (1000 tokens, 1 s of prefill each); B is idle.
    The cache-aware router sends S (1000 tokens, 500 cached on A) to A at t=100."""
    f = Fleet()
    f.backlog("A", 10)
    f.served("b0", "B", arrive=-20_000.0, queue=0.0, input_tokens=800)
    f.decision("S", at_ms=100.0, chosen="A", candidates=[
        {"replica": "A", "predicted_cached_tokens": 500,
         **seen(router_saw_waiting, router_saw_running, age)},
        {"replica": "B", "predicted_cached_tokens": 0, **seen(0, 0, age)},
    ])
    # on A, S waits for the backlog (first tokens until t=10000), then 500 ms of prefill
    f.served("S", "A", arrive=100.0, queue=9900.0, input_tokens=1000, cached=500)
    return f


def test_load_blind_misroute_is_primary_with_excess_of_the_difference() -> None:
    con = load_blind_fleet().store()
    p = primary(con, "S")
    assert (p["cause"], p["sub_kind"]) == ("misrouting", "load_blind")
    # actual replica TTFT 10400 ms; idle B: 0 wait + 1000 uncached tokens = 1000 ms
    assert p["excess_ms"] == pytest.approx(9400.0, abs=1.0)
    assert p["evidence_source"] == "recorded"
    assert "true waiting=9" in p["evidence"]
    causes = {r["cause"] for r in rows(con, "select cause from attributions where request_id='S'")}
    assert "overload" not in causes and "stale_telemetry" not in causes


def test_true_state_is_rebuilt_from_executions() -> None:
    con = load_blind_fleet().store()
    a = rows(con, "select * from int_attr_candidates_assessed "
                  "where request_id = 'S' and replica = 'A'")[0]
    assert (a["true_waiting"], a["true_running"]) == (9, 1)
    # q0 is 100 ms into its 1000 ms prefill: 900 + 9 * 1000 prefill tokens, 10 * 11 decode
    assert a["true_remaining_tokens"] == pytest.approx(9900 + 110, abs=1.0)
    assert a["drain_ms"] == pytest.approx(9900.0, abs=1.0)
    assert a["prefill_ms_per_token"] == pytest.approx(1.0)


def test_fast_requests_get_no_attribution() -> None:
    con = load_blind_fleet().store()
    assert rows(con, "select * from attributions where request_id = 'b0'") == []
    assert rows(con, "select * from attributions where request_id = 'qA0'") == []
    slow = {r["request_id"] for r in rows(con, "select request_id from slow_requests")}
    assert "S" in slow and "b0" not in slow and "qA0" not in slow


def test_stale_telemetry_when_router_saw_an_empty_queue() -> None:
    """A least_load router saw A empty; on the true state (12 queued prompts) it would have
    picked the idle B."""
    f = Fleet()
    f.backlog("A", 12)
    f.served("b0", "B", arrive=-20_000.0, queue=0.0, input_tokens=800)
    f.decision("S", at_ms=100.0, chosen="A", policy="least_load", reason="least_load", candidates=[
        {"replica": "A", "predicted_cached_tokens": 500, **seen(0, 0, age=5000.0)},
        {"replica": "B", "predicted_cached_tokens": 0, **seen(0, 0, age=5000.0)},
    ])
    f.served("S", "A", arrive=100.0, queue=11_900.0, input_tokens=1000, cached=500)
    con = f.store()
    p = primary(con, "S")
    assert (p["cause"], p["sub_kind"]) == ("stale_telemetry", "stale_view")
    assert "router saw waiting=0" in p["evidence"]
    assert "at age 5000 ms; true waiting was 11" in p["evidence"]
    assert p["excess_ms"] == pytest.approx(12_400.0 - 1000.0, abs=1.0)


def test_stale_telemetry_reconstructed_from_snapshots_for_unrecorded_decisions() -> None:
    f = Fleet()
    f.backlog("A", 12)
    f.served("b0", "B", arrive=-20_000.0, queue=0.0, input_tokens=800)
    f.snapshot("A", at_ms=-4700.0, waiting=0, running=0)
    f.snapshot("B", at_ms=-4700.0, waiting=0, running=0)
    f.decision("S", at_ms=100.0, chosen="A", candidates=None, policy="smg")
    f.served("S", "A", arrive=100.0, queue=11_900.0, input_tokens=1000)
    con = f.store()
    p = primary(con, "S")
    assert p["cause"] == "stale_telemetry"
    assert p["evidence_source"] == "reconstructed"
    assert "at age 4800 ms; true waiting was 11" in p["evidence"]
    assert p["confidence"] < 0.8


def test_herding_onto_one_replica_on_one_telemetry_sample() -> None:
    f = Fleet()
    f.served("a0", "A", arrive=-20_000.0, queue=0.0, input_tokens=800)
    f.served("b0", "B", arrive=-20_000.0, queue=0.0, input_tokens=800)
    sample = at(-300.0)
    for k in range(5):
        rid = f"h{k}"
        router = "r1" if k % 2 == 0 else "r2"
        f.decision(rid, at_ms=10.0 * k, chosen="A", router=router, policy="least_load",
                   reason="least_load", candidates=[
                       {"replica": "A", "waiting": 0, "running": 0, "pending": k // 2,
                        "telemetry_ts": sample, "telemetry_age_ms": 300.0 + 10 * k},
                       {"replica": "B", "waiting": 3, "running": 0, "pending": 0,
                        "telemetry_ts": sample, "telemetry_age_ms": 300.0 + 10 * k},
                   ])
        # each 1500-token prompt waits for the previous ones' prefill on A
        f.served(rid, "A", arrive=10.0 * k, queue=max(1500.0 * k - 10.0 * k, 0.0),
                 input_tokens=1500)
    con = f.store()
    episodes = rows(con, "select * from herding_episodes")
    assert len(episodes) == 1
    ep = episodes[0]
    assert (ep["replica"], ep["decisions"], ep["routers"]) == ("A", 5, 2)
    assert ep["unreflected_assignments"] > 0
    # in decision order, by id and by key
    assert ep["request_ids"].split(",") == [f"h{k}" for k in range(5)]
    assert ep["request_keys"].split(",") == [f.key(f"h{k}") for k in range(5)]
    for rid in ("h1", "h2", "h3", "h4"):
        p = primary(con, rid)
        assert (p["cause"], p["sub_kind"]) == ("stale_telemetry", "herding"), (rid, p)
    assert rows(con, "select * from attributions where request_id = 'h0'") == []


def test_overload_when_every_candidate_is_busy() -> None:
    f = Fleet()
    f.backlog("A", 10)
    f.backlog("B", 10)
    f.decision("S", at_ms=100.0, chosen="A", policy="least_load", reason="least_load",
               candidates=[{"replica": "A", **seen(9, 1)}, {"replica": "B", **seen(9, 1)}])
    f.served("S", "A", arrive=100.0, queue=9900.0, input_tokens=1000)
    con = f.store()
    causes = {r["cause"] for r in rows(con, "select cause from attributions where request_id='S'")}
    assert "misrouting" not in causes
    p = primary(con, "S")
    assert p["cause"] == "overload"
    # what the load cost: the shortest estimated wait over every eligible candidate
    waits = rows(con, "select wait_est_ms from int_attr_candidates_assessed "
                      "where request_id = 'S' and eligible")
    assert len(waits) == 2
    assert p["excess_ms"] == pytest.approx(min(w["wait_est_ms"] for w in waits), abs=0.1)
    assert p["excess_ms"] > 2000.0


def eviction_fleet(served_prefix_before: bool) -> Fleet:
    """A idle; the router predicted 1500 of 2500 tokens cached on A; A had none at prefill."""
    f = Fleet()
    f.served("b0", "B", arrive=-20_000.0, queue=0.0, input_tokens=800)
    f.served("p0", "A", arrive=-10_000.0, queue=0.0, input_tokens=900)
    f.decision("p0", at_ms=-10_000.0, chosen="A")  # its span carries the prefix hashes below
    if served_prefix_before:
        f.prefixes.append(("p0", ["h1", "h2", "h3"]))
    else:
        f.prefixes.append(("p0", ["z1", "z2", "z3"]))
    f.prefixes.append(("E", ["h1", "h2", "h3", "h4", "h5"]))
    f.decision("E", at_ms=0.0, chosen="A", candidates=[
        {"replica": "A", "predicted_cached_tokens": 1500, **seen(0, 0)},
        {"replica": "B", "predicted_cached_tokens": 0, **seen(0, 0)},
    ])
    f.served("E", "A", arrive=5.0, queue=0.0, input_tokens=2500, cached=0)
    f.rows["requests"][-1]["predicted_cached_tokens"] = 1500
    return f


def test_eviction_after_decision() -> None:
    con = eviction_fleet(served_prefix_before=True).store()
    p = primary(con, "E")
    assert (p["cause"], p["sub_kind"]) == ("eviction", "evicted_after_decision")
    assert p["excess_ms"] == pytest.approx(1500.0, abs=1.0)
    causes = {r["cause"] for r in rows(con, "select cause from attributions where request_id='E'")}
    # the 1000 ms the prompt needs with its 1500 cached tokens is within the SLO: no long_prompt
    assert causes == {"eviction"}


def test_never_cached() -> None:
    """The prefix was never on A (nor predicted elsewhere): the router's prefix view was wrong,
    which is eviction/never_cached, sized like any eviction (the 1500 predicted tokens'
    prefill). Even an idle replica with the best cache that existed needs 2500 ms: long_prompt
    is the 500 ms of that above the 2000 ms SLO, a secondary cause."""
    con = eviction_fleet(served_prefix_before=False).store()
    p = primary(con, "E")
    assert (p["cause"], p["sub_kind"]) == ("eviction", "never_cached")
    assert p["excess_ms"] == pytest.approx(1500.0, abs=1.0)
    assert "no earlier request sharing the prefix" in p["evidence"]
    (lp,) = rows(con, "select * from attributions where request_id='E' and cause='long_prompt'")
    assert lp["excess_ms"] == pytest.approx(500.0, abs=1.0)


def test_long_prompt_when_even_an_idle_hot_replica_misses() -> None:
    f = Fleet()
    f.served("b0", "B", arrive=-20_000.0, queue=0.0, input_tokens=800)
    f.decision("L", at_ms=0.0, chosen="A", candidates=[
        {"replica": "A", **seen(0, 0)}, {"replica": "B", **seen(0, 0)}])
    f.served("L", "A", arrive=0.0, queue=0.0, input_tokens=5000)
    con = f.store()
    p = primary(con, "L")
    assert p["cause"] == "long_prompt"
    # the part of what the prompt costs on an idle replica (5000 tokens at 1 ms/token) above
    # the 2000 ms SLO: no placement could have saved it
    assert p["excess_ms"] == pytest.approx(3000.0, abs=1.0)


def test_missing_replica_span_is_incomplete_trace() -> None:
    f = Fleet()
    f.served("b0", "B", arrive=-20_000.0, queue=0.0, input_tokens=800)
    f.decision("M", at_ms=0.0, chosen="A", candidates=[
        {"replica": "A", **seen(0, 0)}, {"replica": "B", **seen(0, 0)}])
    f.request("M", start=0.0, ttft=5000.0, input_tokens=100, replica="A", has_replica=False)
    con = f.store()
    p = primary(con, "M")
    assert (p["cause"], p["sub_kind"]) == ("incomplete_trace", "replica_side_missing")
    assert p["confidence"] == 0.0
    assert p["excess_ms"] == pytest.approx(3000.0)


def test_unknown_when_no_rule_fires() -> None:
    f = Fleet()
    f.served("b0", "B", arrive=-20_000.0, queue=0.0, input_tokens=800)
    f.decision("U", at_ms=0.0, chosen="B", candidates=[{"replica": "B", **seen(0, 0)}])
    # a TPOT miss on an otherwise normal replica
    f.execution("U", "B", arrive=0.0, queue=0.0, input_tokens=100)
    f.request("U", start=0.0, ttft=120.0, tpot=150.0, input_tokens=100, replica="B",
              replica_ttft=100.0)
    con = f.store()
    p = primary(con, "U")
    assert p["cause"] == "unknown"
    assert p["excess_ms"] == pytest.approx(50.0 * 10)


def test_slo_summary_keeps_failures_in_the_denominators() -> None:
    f = Fleet()
    for i, ttft in enumerate([100.0, 200.0, 300.0, 2500.0]):
        f.request(f"ok{i}", start=1000.0 * i, ttft=ttft, input_tokens=100)
    for status in ("timeout", "rejected", "error", "cancelled"):
        f.request(status, start=500.0, ttft=None, input_tokens=100, status=status,
                  output_tokens=0, tpot=None)
    f.request("one_token", start=600.0, ttft=100.0, input_tokens=10, output_tokens=1,
              tpot=None)
    con = f.store()
    s = rows(con, "select * from slo_summary")[0]
    assert s["requests"] == 9
    assert (s["ok"], s["slow"], s["goodput"]) == (5, 1, 4)
    assert (s["timeouts"], s["rejected"], s["errors"], s["cancelled"]) == (1, 1, 1, 1)
    assert s["attainment"] == pytest.approx(4 / 9)
    assert s["ok_without_tpot"] == 1


def test_slo_targets_follow_session_variables() -> None:
    con = load_blind_fleet().store()
    assert rows(con, "select * from slo_targets") == [{"ttft_slo_ms": 2000.0, "tpot_slo_ms": 100.0}]
    con.execute("set variable routeaudit_ttft_slo_ms = 20000")
    assert rows(con, "select * from attributions where request_id = 'S'") == []


def renamed(f: Fleet, run_id: str, key_prefix: str) -> Fleet:
    """``f`` as another run of the same requests: the same request ids (as capture runs and
    clients reuse them), other request keys, run and replicas (so neither run loads the other's
    replicas)."""
    g = Fleet(run_id)
    g.key_prefix = key_prefix
    for name, table in f.rows.items():
        for row in table:
            r = dict(row)
            if "request_id" in r:
                r["request_key"] = g.key(r["request_id"])
            if "run_id" in r:
                r["run_id"] = run_id
            if "trace_id" in r and r["trace_id"] is not None:
                r["trace_id"] = f"t-{r['request_key']}"
            for col in ("replica", "chosen_replica", "served_by"):
                if r.get(col) is not None:
                    r[col] = f"{r[col]}-{run_id}"
            g.rows[name].append(r)
    g.prefixes = list(f.prefixes)
    return g


def merged(*fleets: Fleet) -> Fleet:
    """One store holding every fleet's rows (the prefix spans keep each fleet's keys)."""
    out = Fleet()
    for f in fleets:
        for name, table in f.rows.items():
            out.rows[name].extend(table)
    out.extra_prefix_spans = [span for f in fleets for span in f.prefix_spans()]
    return out


@pytest.mark.parametrize("build", [load_blind_fleet, lambda: eviction_fleet(True)],
                         ids=["load_blind", "eviction"])
def test_request_ids_repeated_across_runs_are_judged_apart(build: Any) -> None:
    """Two runs of the same requests (same request ids, other keys) in one store: each run's
    attributions are exactly those of the run alone. Joined on request_id, the two runs'
    candidates and executions mixed (a request judged on the other run's replicas, herding and
    in-flight work across runs, one row per id instead of two)."""
    cols = "request_id, cause, sub_kind, excess_ms, is_primary, confidence"
    alone = rows(build().store(), f"select {cols} from attributions order by all")
    assert alone, "the scenario has something to attribute"
    both = merged(build(), renamed(build(), "run2", "b-")).store()
    for run in ("run1", "run2"):
        got = rows(both, f"select {cols} from attributions where run_id = ? order by all", [run])
        assert got == alone, run
    keys = rows(both, "select count(distinct request_key) as n, count(*) as k from slow_requests")
    assert keys[0]["n"] == keys[0]["k"] == 2 * len({r["request_id"] for r in alone})


def test_calibration_counts_hits_and_false_hits() -> None:
    con = eviction_fleet(served_prefix_before=True).store()
    r = rows(con, "select * from calibration where scope = 'replica' and replica = 'A'")[0]
    # E (predicted 1500, had none) and p0 (no prediction: neither a hit nor a miss)
    assert (r["decisions"], r["hits"], r["false_hits"], r["misses"]) == (2, 0, 1, 0)
    assert r["mean_abs_error_tokens"] == pytest.approx(1500.0)
    router = rows(con, "select * from calibration where scope = 'router'")[0]
    assert router["telemetry_age_p50_ms"] == pytest.approx(50.0)


def test_calibration_scores_each_attempt_on_its_own_prediction() -> None:
    """R's first attempt went to A predicting 1000 cached tokens, and A had them (its execution
    then failed); the retry went to B predicting none. A's calibration counts a hit: the
    request's prediction (the final attempt's, 0) would have made it a miss."""
    f = Fleet()
    f.served("b0", "B", arrive=-20_000.0, queue=0.0, input_tokens=800)
    f.decision("R", at_ms=0.0, chosen="A", candidates=[
        {"replica": "A", "predicted_cached_tokens": 1000, **seen(0, 0)},
        {"replica": "B", "predicted_cached_tokens": 0, **seen(0, 0)},
    ])
    first = f.execution("R", "A", arrive=5.0, queue=0.0, input_tokens=2000, cached=1000)
    first.update(span_id="x-R-0", status="error")
    f.decision("R", at_ms=100.0, chosen="B", attempt=1, candidates=[
        {"replica": "A", "predicted_cached_tokens": 1000, **seen(0, 0)},
        {"replica": "B", "predicted_cached_tokens": 0, **seen(0, 0)},
    ])
    f.served("R", "B", arrive=105.0, queue=0.0, input_tokens=2000, cached=0)
    f.rows["requests"][-1].update(predicted_cached_tokens=0, attempts=2)
    con = f.store()
    a = rows(con, "select * from calibration where scope = 'replica' and replica = 'A'")[0]
    assert (a["decisions"], a["hits"], a["false_hits"], a["misses"]) == (1, 1, 0, 0)
    assert a["mean_abs_error_tokens"] == pytest.approx(0.0)


def test_attribution_layer_installs_on_the_real_marts() -> None:
    con = duckdb.connect()
    for raw in ("raw_spans", "raw_span_events", "raw_snapshots"):
        con.execute((ROOT / "audit" / "sql" / "raw" / f"{raw}.sql").read_text())
    con.execute("create table routeaudit_meta (key varchar primary key, value varchar)")
    _relations.install(con)
    names = {r[0] for r in con.sql("select view_name from duckdb_views()").fetchall()}
    assert {"attributions", "slow_requests", "slo_summary", "calibration",
            "herding_episodes", "slo_targets"} <= names
