"""Ground-truth labels from the simulator's true state (rules in docs/testbed.md).

Counterfactual TTFTs (what another replica would have given) are estimates: the cost model's
Q+P on the *true* state at decision time (true backlog, true cache, true speed); with
``LabelConfig.measured_routing``, where that estimate decides the label (a slow request on a slow
replica, a modelled routing saving above the TTFT, a TTFT on a chosen replica under memory
pressure that the model misses by the cause bar, or a routing saving resting on a replica under
memory pressure), they are measured by re-running the simulation with the request
forced onto each other replica. Actual TTFT is measured. Each
cause gets an attributed number of milliseconds; a cause is assigned when the request is slow
and its share is significant; the primary cause is the largest share.
"""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._sim import Record, Simulation

__all__ = ["CAUSES", "ground_truth_row", "label_record", "write_ground_truth"]

CAUSES = ("misrouting", "eviction", "stale_telemetry", "overload", "slow_replica", "long_prompt")
"""Cause labels besides ``none``, in tie-break order for the primary cause."""


def label_record(rec: Record, sim: Simulation) -> dict[str, Any]:
    """Causes of one request and their cost in ms (rules: docs/testbed.md, "Labelling rules").

    One principle for every cause: its ms are a counterfactual saving, how much lower the TTFT
    would have been had that cause been absent, estimated on the simulator's true state at the
    decision (cost model Q+P, true backlog, true cache, true speed), or for the routing causes
    measured by forced re-runs (``LabelConfig.measured_routing``, below; overload too). On a
    slow replica the routing savings are sized from its TTFT at the fleet's speed (slowness
    first: what routing would have saved beyond the replica's slowness, which is
    slow_replica's). The primary cause is the counted cause with the largest saving.
    """
    lc = sim.cfg.labels
    cost = sim.cfg.cost
    req = rec.req
    ch = rec.choice
    n = len(rec.est)
    est_ttft = [q + p for q, p in rec.est]
    best = min(range(n), key=lambda i: (est_ttft[i], i))
    max_cached = max(rec.true_cached) if rec.true_cached else 0
    iq, ip = cost.estimate_ms(
        backlog_prefill_tokens=0, n_running=0, uncached_tokens=req.input_tokens - max_cached,
        cached_tokens=max_cached, max_batched_tokens=sim.cfg.replica.max_batched_tokens,
    )
    ideal = iq + ip
    out: dict[str, Any] = {
        "best_alternative": sim.replicas[best].id,
        "best_alternative_est_ttft_ms": est_ttft[best],
        "ideal_ttft_ms": ideal,
        "cause_ms": dict.fromkeys(CAUSES, 0.0),
        "stale_subcause": None,
        "eviction_subcause": None,
    }
    cause_ms: dict[str, float] = out["cause_ms"]
    if ch is None or ch.index is None:  # rejected: the fleet had no admissible room
        out.update(slow=True, causes=["overload"], primary_cause="overload", cache_outcome=None,
                   lost_cached_tokens=0, actual_ttft_ms=None, chosen_est_ttft_ms=None)
        cause_ms["overload"] = float("inf")
        return out
    c = ch.index
    seq = rec.seq
    # -- cache outcome on the chosen replica: tokens the router predicted cached that the
    # prefill had to recompute. Whether they were there at the decision and went before the
    # prefill (evicted after the decision) or were never there (the router's prefix view was
    # wrong: its tree outlived an eviction, or never matched) is the sub-kind, not the cause:
    # both are "eviction", sized the same way.
    pred = rec.predicted[c]
    at_dec = rec.true_cached[c]
    actual_cached = (seq.cached_first or 0) if seq is not None else 0
    admitted = seq is not None and seq.t_admit is not None
    expected = min(pred, req.input_tokens - 1)
    lost = max(0, expected - actual_cached) if admitted else 0
    tol = lc.cache_tolerance_tokens
    evicted_after = max(0, min(at_dec, expected) - actual_cached) if admitted else 0
    if lost >= tol:
        never = lost - evicted_after
        outcome = "evicted_before_prefill" if evicted_after >= never else "never_present"
    else:
        lost = 0
        if pred > 0:
            outcome = "as_predicted"
        elif actual_cached > 0:
            outcome = "unpredicted_hit"
        else:
            outcome = "no_prediction"
    out["cache_outcome"] = outcome
    out["lost_cached_tokens"] = lost
    # -- actual TTFT (or its lower bound when cancelled before the first token)
    if seq is not None and seq.t_first_token is not None:
        actual = (seq.t_first_token - req.arrival_s) * 1000.0
        out["actual_ttft_ms"] = actual
    else:
        end = seq.t_finish if seq is not None and seq.t_finish is not None else rec.t_decide
        actual = (end - req.arrival_s) * 1000.0
        out["actual_ttft_ms"] = None
    slow = out["actual_ttft_ms"] is None or actual > lc.ttft_slo_ms
    out["slow"] = slow
    margin = max(lc.min_cause_ms, lc.min_cause_frac * actual)
    # -- counterfactual savings per cause
    # eviction: had the predicted blocks been there, their prefill would not have run
    if lost:
        cause_ms["eviction"] = cost.prefill_chunk_ms(actual_cached, lost) / rec.speed
    # routing: estimate against estimate, so the cost model's error on this request cancels
    # (the counterfactual TTFT on r is actual - (E'(c) - E(r))). E'(c) is the chosen replica on
    # the true load with the cache the router predicted there (the eviction is its own cause).
    # Stale telemetry: the policy re-run on the true load (its own cache view kept) picks d;
    # its saving is E'(c) - E(d). Misrouting: what the best replica would still have saved
    # beyond that decision, or beyond the choice made when the view did not change it
    # materially: E(d) - E(best), else E'(c) - E(best).
    routed_cached = min(max(at_dec, expected), req.input_tokens - 1)
    if routed_cached != at_dec:
        sn = rec.true_snaps[c]
        rq, rp = cost.estimate_ms(
            backlog_prefill_tokens=rec.true_backlog[c], n_running=sn.running,
            uncached_tokens=req.input_tokens - routed_cached, cached_tokens=routed_cached,
            max_batched_tokens=sim.replicas[c].cfg.max_batched_tokens, speed=rec.speed,
        )
        routed = rq + rp
    else:
        rp = rec.est[c][1]
        routed = est_ttft[c]
    out["chosen_est_ttft_ms"] = routed
    # slowness first: on a slow replica the routing causes are credited only with what an
    # alternative would have saved beyond the replica's slowness, i.e. from the chosen replica's
    # TTFT at the fleet's speed (`speed` times its TTFT, the same counterfactual slow_replica is
    # sized from); the slowness itself is slow_replica's
    nominal = rec.speed if rec.speed < lc.slow_replica_speed else 1.0
    tl = rec.d_true_load
    routed_nominal = routed * nominal
    stale_saving = (max(0.0, routed_nominal - est_ttft[tl])
                    if (tl is not None and tl != c) else 0.0)
    if tl is not None and stale_saving >= margin:
        cause_ms["stale_telemetry"] = stale_saving
        cause_ms["misrouting"] = max(0.0, est_ttft[tl] - est_ttft[best])
    else:
        cause_ms["misrouting"] = max(0.0, routed_nominal - est_ttft[best])
    # measured routing savings (LabelConfig.measured_routing), where the cost model's estimate
    # decides the label: a slow request on a slow replica (the routing savings, modelled on the
    # true state, compete with slow_replica, sized from the measured TTFT), one whose modelled
    # routing saving exceeds its whole TTFT, or one whose TTFT on a chosen replica under memory
    # pressure (the request preempted, or the KV cache at kv_pressure at the decision) the cost
    # model misses by the bar or more: memory held up its queue or its prefill there, which the
    # model does not see, so the model's error no longer cancels between replicas (elsewhere
    # it does: the steps shared with later requests would have met it on any replica, the
    # audit's premise too), or one whose modelled routing saving counts while the best replica
    # or the policy's true-load choice is under memory pressure. The TTFT and the
    # wait on every other replica are measured by
    # re-running the simulation with the request routed there (same requests, configuration
    # and seed; stopped at its first token); the chosen replica's are the actual ones, the TTFT
    # less the eviction's saving (its own cause), at the fleet's speed on a slow replica
    # (slowness first, above). Same rules:
    # stale_telemetry = that TTFT less the TTFT on the policy's true-load choice d; misrouting
    # = what the best replica (least measured TTFT) would still have saved beyond d, or beyond
    # the chosen replica; overload = the least measured wait (TTFT less the prompt's prefill).
    measured: dict[int, float | None] | None = None
    snaps = rec.true_snaps
    memory_missed = (
        abs(actual - cause_ms["eviction"] - routed) >= margin and seq is not None
        and (seq.preemptions > 0 or snaps[c].kv_usage >= lc.kv_pressure)
    ) or (
        # or the modelled routing saving that counts rests on a replica under memory pressure
        max(cause_ms["stale_telemetry"], cause_ms["misrouting"]) >= margin
        and (snaps[best].kv_usage >= lc.kv_pressure
             or (tl is not None and snaps[tl].kv_usage >= lc.kv_pressure))
    )
    measured_waits: list[float] = []
    if (lc.measured_routing and slow and out["actual_ttft_ms"] is not None
            and (rec.speed < lc.slow_replica_speed or memory_missed
                 or max(cause_ms["stale_telemetry"], cause_ms["misrouting"]) > actual)):
        measured = {i: sim.forced_ttft_ms(req.request_id, i) for i in range(n) if i != c}
        ttft = {i: t for i, t in measured.items() if t is not None}
        # the wait there: the TTFT beyond the prompt's own prefill on that replica's true
        # cache (a scheduler that admits at once shows the work present as a longer prefill)
        measured_waits = [max(0.0, t - rec.est[i][1]) for i, t in ttft.items()]
        measured_waits.append(max(0.0, actual - cause_ms["eviction"] - rp))
        ttft[c] = actual * nominal
        routed_there = (actual - cause_ms["eviction"]) * nominal
        best_ttft = min(ttft.values())
        stale = routed_there - ttft[tl] if (tl is not None and tl != c and tl in ttft) else 0.0
        if tl is not None and stale >= margin:
            cause_ms["stale_telemetry"] = stale
            cause_ms["misrouting"] = max(0.0, ttft[tl] - best_ttft)
        else:
            cause_ms["stale_telemetry"] = 0.0
            cause_ms["misrouting"] = max(0.0, routed_there - best_ttft)
    out["measured_ttft_ms"] = measured
    # overload: the wait even the best-placed request would have had
    cause_ms["overload"] = min(measured_waits) if measured_waits else min(q for q, _ in rec.est)
    # slow replica: at nominal speed everything on it takes `speed` as long
    if rec.speed < lc.slow_replica_speed:
        cause_ms["slow_replica"] = actual * (1.0 - rec.speed)
    # long prompt: the part of the best achievable TTFT (idle nominal replica, best cache
    # anywhere) above the SLO: only a prompt whose ideal itself misses the SLO
    if ideal > lc.ttft_slo_ms:
        cause_ms["long_prompt"] = ideal - lc.ttft_slo_ms
    causes: list[str] = []
    if slow:
        causes = [k for k in CAUSES if cause_ms[k] >= margin]
    if "stale_telemetry" in causes:
        if rec.unseen_other > 0 and len(sim.routers) > 1:
            out["stale_subcause"] = "herding"
        elif rec.unseen_own > 0 and not sim.cfg.router.pending_correction:
            out["stale_subcause"] = "own_pending"
        else:
            out["stale_subcause"] = "telemetry_age"
    if "eviction" in causes:
        out["eviction_subcause"] = (
            "evicted_after_decision" if outcome == "evicted_before_prefill" else "never_cached"
        )
    if causes:
        primary = max(causes, key=lambda k: (cause_ms[k], -CAUSES.index(k)))
    else:
        primary = "none"
        causes = ["none"]
    out["causes"] = causes
    out["primary_cause"] = primary
    return out


def ground_truth_row(rec: Record, sim: Simulation) -> dict[str, Any]:
    req = rec.req
    ch = rec.choice
    lab = rec.labels
    seq = rec.seq
    reps = sim.replicas
    c = None if ch is None else ch.index
    true_state = []
    for i, s in enumerate(rec.true_snaps):
        q, p = rec.est[i]
        true_state.append({
            "replica": s.replica, "waiting": s.waiting, "running": s.running,
            "remaining_tokens": s.remaining_tokens,
            "remaining_prefill_tokens": s.remaining_prefill_tokens,
            "backlog_prefill_tokens": rec.true_backlog[i], "kv_usage": s.kv_usage,
            "cached_tokens": rec.true_cached[i], "est_queue_ms": q, "est_prefill_ms": p,
            "est_ttft_ms": q + p, "speed": reps[i].cfg.speed,
        })
    seen_state = []
    for v in rec.seen:
        seen_state.append({
            "replica": v.replica, "eligible": v.eligible, "waiting": v.waiting,
            "running": v.running, "remaining_tokens": v.remaining_tokens,
            "telemetry_age_ms": v.age_s * 1000.0, "pending": v.pending,
            "predicted_cached_tokens": v.predicted_cached_tokens,
            "est_queue_ms": v.est_queue_ms, "est_prefill_ms": v.est_prefill_ms,
            "score": (ch.scores[v.index] if ch is not None and ch.scores else None),
        })

    def rid(i: int | None) -> str | None:
        return None if i is None else reps[i].id

    cm = lab.get("cause_ms", {})
    row: dict[str, Any] = {
        "run_id": sim.run_id,
        "scenario": sim.scenario,
        "request_id": sim.wire_id(req.request_id),
        "router_id": sim.routers[rec.router].id,
        "policy": sim.routers[rec.router].policy.name,
        "arrival_s": req.arrival_s,
        "decided_s": rec.t_decide,
        "input_tokens": req.input_tokens,
        "output_tokens": req.output_tokens,
        "max_tokens": req.max_tokens,
        "outcome": "rejected" if c is None else "routed",
        "chosen": rid(c),
        "reason": None if ch is None else ch.reason,
        "true_state": true_state,
        "seen_state": seen_state,
        "decision_on_true_load": rid(rec.d_true_load),
        "decision_on_true_state": rid(rec.d_oracle),
        "changes_on_true_load": c is not None and rec.d_true_load != c,
        "changes_on_true_state": c is not None and rec.d_oracle != c,
        "predicted_cached_tokens": None if c is None else rec.predicted[c],
        "cached_at_decision_tokens": None if c is None else rec.true_cached[c],
        "actual_cached_tokens": None if seq is None else seq.cached_first,
        "cache_outcome": lab.get("cache_outcome"),
        "lost_cached_tokens": lab.get("lost_cached_tokens", 0),
        "best_alternative": lab.get("best_alternative"),
        "best_alternative_est_ttft_ms": lab.get("best_alternative_est_ttft_ms"),
        "chosen_est_ttft_ms": lab.get("chosen_est_ttft_ms"),
        "ideal_ttft_ms": lab.get("ideal_ttft_ms"),
        "actual_ttft_ms": lab.get("actual_ttft_ms"),
        "queue_ms": None if seq is None or seq.t_admit is None else (seq.t_admit - req.arrival_s) * 1000.0,
        "e2e_ms": None if seq is None or seq.t_finish is None else (seq.t_finish - req.arrival_s) * 1000.0,
        "generated_tokens": None if seq is None else seq.generated,
        "finish_reason": None if seq is None else seq.finish_reason,
        "preemptions": 0 if seq is None else seq.preemptions,
        "chosen_speed": None if c is None else reps[c].cfg.speed,
        "unseen_assignments_own": rec.unseen_own,
        "unseen_assignments_other_routers": rec.unseen_other,
        "slow": bool(lab.get("slow")),
        "causes": list(lab.get("causes", ["none"])),
        "primary_cause": lab.get("primary_cause", "none"),
        "stale_subcause": lab.get("stale_subcause"),
        "eviction_subcause": lab.get("eviction_subcause"),
    }
    for k in ("misrouting", "eviction", "stale_telemetry", "overload", "slow_replica", "long_prompt"):
        v = cm.get(k, 0.0)
        row[f"cause_ms_{k}"] = None if v == float("inf") else v
    if sim.cfg.labels.measured_routing:
        measured = lab.get("measured_ttft_ms")
        row["routing_measured"] = measured is not None
        # measured TTFT per other replica (None: no first token there); null when modelled
        row["measured_ttft_ms"] = (None if measured is None
                                   else {reps[i].id: t for i, t in measured.items()})
    return row


def write_ground_truth(rows: list[dict[str, Any]], path: str | os.PathLike[str]) -> None:
    """Write rows as JSONL (``.jsonl``/``.json``) or Parquet (``.parquet``)."""
    p = os.fspath(path)
    os.makedirs(os.path.dirname(os.path.abspath(p)), exist_ok=True)
    if p.endswith(".parquet"):
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.Table.from_pylist(rows), p)
        return
    with open(p, "w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r, separators=(",", ":")))
            f.write("\n")
