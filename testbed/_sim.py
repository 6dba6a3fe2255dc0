"""The simulation: arrivals -> router(s) -> replicas, telemetry polling, ground truth.

Ground truth is taken from the simulator's own state at decision time (true queue contents, true
cache contents) and at prefill/finish time; it never reads anything an audit produced.
"""

from __future__ import annotations

import gc
import heapq
import math
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ._config import FleetConfig
from ._env import PRIO_ARRIVAL, PRIO_TELEMETRY, PRIO_TIMEOUT
from ._errors import TestbedError
from ._groundtruth import label_record, write_ground_truth
from ._heapenv import HeapEnvironment
from ._replica import Replica, Seq, Snapshot
from ._requests import Request
from ._router import Router, build_views
from .emit import CandidateTrace, RequestTrace, SpanEmitter
from .policies import CandidateView, Choice, RequestView

__all__ = ["Record", "RunSummary", "Simulation"]


class Record:
    """Per-request facts collected during the run (the raw material of the ground truth)."""

    __slots__ = (
        "req", "router", "t_decide", "choice", "seen", "true_snaps", "true_cached", "true_backlog",
        "est",
        "d_true_load", "d_oracle", "predicted", "unseen_other", "unseen_own", "seq", "speed",
        "labels",
    )

    def __init__(self, req: Request) -> None:
        self.req = req
        self.router = 0
        self.t_decide = 0.0
        self.choice: Choice | None = None
        self.seen: list[CandidateView] = []
        self.true_snaps: list[Snapshot] = []
        self.true_cached: list[int] = []
        self.true_backlog: list[int] = []
        self.est: list[tuple[float, float]] = []
        self.d_true_load: int | None = None
        self.d_oracle: int | None = None
        self.predicted: list[int] = []
        self.unseen_other = 0
        self.unseen_own = 0
        self.seq: Seq | None = None
        self.speed = 1.0
        self.labels: dict[str, Any] = {}


@dataclass(slots=True)
class RunSummary:
    """Figures of one run. Latencies in ms over requests that produced a first token."""

    scenario: str
    seed: int
    policy: str
    n_requests: int
    n_finished: int
    n_rejected: int
    n_aborted: int
    n_slow: int
    ttft_p50_ms: float
    ttft_p90_ms: float
    ttft_p99_ms: float
    ttft_mean_ms: float
    cached_token_fraction: float
    preemptions: int
    evictions: int
    sim_duration_s: float
    wall_s: float
    events: int
    cause_counts: dict[str, int] = field(default_factory=dict)
    primary_cause_counts: dict[str, int] = field(default_factory=dict)
    ground_truth_path: str | None = None
    run_id: str = ""


_GC_GEN0 = 100_000
"""Allocations between two collections of the youngest generation while a simulation runs."""


def _pct(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    i = min(len(xs) - 1, max(0, int(round(q * (len(xs) - 1)))))
    return xs[i]


class Simulation:
    """One virtual-time run. Create, :meth:`run`, then read ``records`` / ``log``.

    ``ground_truth=False`` skips what only the labels need (the true state of every replica at
    each decision, the two counterfactual decisions, the Q+P estimates, the labels): the run
    itself (decisions, timings, emitted spans) is the same, about twice as fast;
    :meth:`ground_truth_rows` then raises :class:`~testbed.TestbedError` and the summary
    counts slow requests (TTFT above the SLO, or none) but no causes.

    ``forced=(request_id, replica)`` routes that one request to that replica index whatever its
    router decides (every other decision is the policy's): the run of a counterfactual
    placement, see :meth:`forced_ttft_ms`.
    """

    def __init__(
        self,
        requests: Sequence[Request],
        cfg: FleetConfig,
        *,
        seed: int = 0,
        scenario: str = "custom",
        emitter: SpanEmitter | None = None,
        record_log: bool = False,
        progress: bool = False,
        run_id: str | None = None,
        ground_truth: bool = True,
        forced: tuple[str, int] | None = None,
    ) -> None:
        cfg.validate()
        self.cfg = cfg
        self.requests = sorted(requests, key=lambda r: r.arrival_s)  # stable: ties keep order
        self.seed = seed
        self.scenario = scenario
        self.emitter = emitter
        self.progress = progress
        self.ground_truth = ground_truth
        if forced is not None and not 0 <= forced[1] < cfg.n_replicas:
            raise TestbedError(f"forced replica {forced[1]} out of range")
        self.forced = forced
        self._forced_rec: Record | None = None
        self.run_id = run_id or f"{scenario}-{cfg.router.policy}-s{seed}"
        self.rng = random.Random(seed)
        self.env = HeapEnvironment()
        self.log: list[tuple[Any, ...]] | None = [] if record_log else None
        n = cfg.n_replicas
        self.replicas = [
            Replica(i, f"replica-{i}", cfg.replica_config(i), cfg.cost, self.env, self._on_finish)
            for i in range(n)
        ]
        rc = cfg.router
        self.routers = [
            Router(
                j, f"router-{j}", rc, cfg.cost, n, cfg.replica.max_batched_tokens,
                cfg.replica.expected_output_tokens, random.Random(self.rng.getrandbits(64)),
            )
            for j in range(rc.n_routers)
        ]
        self._assign_rng = random.Random(self.rng.getrandbits(64))
        self._cf_rng = random.Random()
        self.records: list[Record] = []
        self._by_seq: dict[int, Record] = {}
        # assignments per replica per router (cumulative) and their value at the last poll
        self._assigned = [[0] * rc.n_routers for _ in range(n)]
        self._assigned_at_poll = [[0] * rc.n_routers for _ in range(n)]
        self._next_arrival = 0
        self._outstanding = 0
        self._rr_router = 0
        self._pbar: Any = None

    # ------------------------------------------------------------------ time mapping
    def ns(self, t: float) -> int:
        return self.cfg.t0_ns + int(round(t * 1e9))

    # ------------------------------------------------------------------ driving
    def run(self) -> list[Record]:
        if self.progress:
            from tqdm import tqdm

            self._pbar = tqdm(total=len(self.requests), desc=self.scenario, unit="req", mininterval=0.5)
        self.env.at(0.0, PRIO_TELEMETRY, self._poll)
        if self.requests:
            self.env.at(self.requests[0].arrival_s, PRIO_ARRIVAL, self._arrive)
        # The run allocates a few small objects per event and keeps most of them (records,
        # sequences, views) and creates no cyclic garbage of its own: the cyclic collector's
        # youngest generation runs every _GC_GEN0 allocations instead of every 700 (still
        # collecting, for other threads' garbage too), about a tenth less CPU per run.
        thresholds = gc.get_threshold()
        if thresholds[0]:
            gc.set_threshold(max(thresholds[0], _GC_GEN0), *thresholds[1:])
        try:
            self.env.run()
        finally:
            if thresholds[0]:
                gc.set_threshold(*thresholds)
        if self._pbar is not None:
            self._pbar.close()
        self._label()
        return self.records

    def _label(self) -> None:
        if self.ground_truth:
            for rec in self.records:
                rec.labels = label_record(rec, self)

    def _run_to_forced_first_token(self) -> Record | None:
        """Run a ``forced`` simulation only until its forced request has its first token (or
        has ended without one): every event before that instant is the full run's, so its TTFT
        is the full run's. Returns the forced request's record (None: it never arrived)."""
        if self.forced is None:
            raise TestbedError("_run_to_forced_first_token needs a forced simulation")
        env = self.env
        env.at(0.0, PRIO_TELEMETRY, self._poll)
        if self.requests:
            env.at(self.requests[0].arrival_s, PRIO_ARRIVAL, self._arrive)
        q = env._heap
        pop = heapq.heappop
        thresholds = gc.get_threshold()
        if thresholds[0]:
            gc.set_threshold(max(thresholds[0], _GC_GEN0), *thresholds[1:])
        try:
            # HeapEnvironment.run's loop, which stops once the forced request is done with
            while q:
                ev = pop(q)[3]
                cb = ev.callback
                if cb is None:
                    continue
                env.now = ev.time
                ev.callback = None
                env.processed += 1
                cb(*ev.args)
                rec = self._forced_rec
                if rec is not None:
                    if rec.choice is None or rec.choice.index is None:
                        break
                    seq = rec.seq
                    if seq is not None and (seq.t_first_token is not None
                                            or seq.t_finish is not None):
                        break
        finally:
            if thresholds[0]:
                gc.set_threshold(*thresholds)
        return self._forced_rec

    def forced_ttft_ms(self, request_id: str, replica: int, *, to_end: bool = False
                       ) -> float | None:
        """Measured TTFT (arrival -> first token, ms) of ``request_id`` had it been routed to
        ``replica`` (an index): the run repeated (same requests, configuration and seed, no
        emitter, no ground truth) with only that request's routing changed, stopped at its
        first token unless ``to_end``. None when it gets no first token there."""
        sim = Simulation(self.requests, self.cfg, seed=self.seed, scenario=self.scenario,
                         ground_truth=False, forced=(request_id, replica))
        if to_end:
            sim.run()
            rec = sim._forced_rec
        else:
            rec = sim._run_to_forced_first_token()
        if rec is None or rec.seq is None or rec.seq.t_first_token is None:
            return None
        return (rec.seq.t_first_token - rec.req.arrival_s) * 1000.0

    def _poll(self) -> None:
        env = self.env
        now = env.now
        reqs = self.requests
        nxt = self._next_arrival
        if nxt < len(reqs) or self._outstanding > 0:
            ev = env.after(self.cfg.router.telemetry_interval_s, PRIO_TELEMETRY, self._poll)
            if nxt >= len(reqs) or reqs[nxt].arrival_s >= ev.time:
                # No decision reads this poll: the next arrival comes at or after the next poll
                # (which runs first at the same instant) and routers read snapshots, pending
                # assignments and the assignment counts only when deciding; the next poll
                # prunes a superset of the pending assignments. Only the prefix trees' eviction
                # clock must tick as it would.
                for rt in self.routers:
                    rt.on_unread_telemetry(now)
                return
        snaps = [r.snapshot() for r in self.replicas]
        for rt in self.routers:
            rt.on_telemetry(snaps, now)
        at_poll = self._assigned_at_poll
        for i, a in enumerate(self._assigned):
            at_poll[i] = list(a)

    def _pick_router(self) -> int:
        n = len(self.routers)
        if n == 1:
            return 0
        if self.cfg.router.router_assignment == "random":
            return self._assign_rng.randrange(n)
        j = self._rr_router
        self._rr_router = (j + 1) % n
        return j

    def _arrive(self) -> None:
        env = self.env
        req = self.requests[self._next_arrival]
        self._next_arrival += 1
        if self._next_arrival < len(self.requests):
            env.at(self.requests[self._next_arrival].arrival_s, PRIO_ARRIVAL, self._arrive)
        if self._pbar is not None:
            self._pbar.update(1)
        now = env.now
        j = self._pick_router()
        rt = self.routers[j]
        rec = Record(req)
        rec.router = j
        rec.t_decide = now
        self.records.append(rec)
        predicted = rt.predicted(req)
        rec.predicted = predicted
        seen = rt.views(req, now, predicted)
        rv = rt.request_view(req)
        if self.ground_truth:
            rng_state = rt.rng.getstate()
            choice = rt.policy.decide(rv, seen, rt.rng)
            self._capture_truth(rec, rt, rv, predicted, rng_state)
        else:
            choice = rt.policy.decide(rv, seen, rt.rng)
        forced = self.forced
        if forced is not None and req.request_id == forced[0]:
            choice = Choice(forced[1], "forced", choice.scores)
            self._forced_rec = rec
        rec.choice = choice
        rec.seen = seen
        # ---- act
        reach = now + self.cfg.router.forward_latency_s
        rt.commit(req, choice, predicted, reach)
        i = choice.index
        if self.log is not None:
            self.log.append(("route", req.request_id, rt.id, None if i is None else self.replicas[i].id, now))
        if i is None:
            self._emit(rec)
            return
        ts_assigned = self._assigned[i]
        at_poll = self._assigned_at_poll[i]
        rec.unseen_own = ts_assigned[j] - at_poll[j]
        rec.unseen_other = sum(ts_assigned) - sum(at_poll) - rec.unseen_own
        ts_assigned[j] += 1
        rec.speed = self.replicas[i].cfg.speed
        self._outstanding += 1
        if reach > now:
            env.at(reach, PRIO_ARRIVAL, self._submit, rec, i)
        else:
            self._submit(rec, i)

    def _capture_truth(self, rec: Record, rt: Router, rv: RequestView, predicted: list[int],
                       rng_state: Any) -> None:
        """Ground truth at decision time: true load, true cache, counterfactual decisions."""
        req = rec.req
        now = rec.t_decide
        true_snaps = [r.snapshot() for r in self.replicas]
        true_cached = [r.match_tokens(req) for r in self.replicas]
        true_backlog = [r.backlog_prefill_tokens() for r in self.replicas]
        rec.true_snaps = true_snaps
        rec.true_cached = true_cached
        rec.true_backlog = true_backlog
        zeros = [0] * len(self.replicas)
        mbt = self.cfg.replica.max_batched_tokens
        common = dict(
            pending=zeros, pending_tokens=zeros, pending_prefill=zeros, cost=self.cfg.cost,
            max_batched_tokens=mbt, admission_limit=self.cfg.router.admission_limit,
        )
        tl_views = build_views(req, true_snaps, now, predicted=predicted, **common)  # type: ignore[arg-type]
        cf = self._cf_rng
        cf.setstate(rng_state)
        rec.d_true_load = rt.policy.decide(rv, tl_views, cf).index
        if rt.policy.uses_prefix and true_cached != predicted:
            or_views = build_views(req, true_snaps, now, predicted=true_cached, **common)  # type: ignore[arg-type]
            cf.setstate(rng_state)
            rec.d_oracle = rt.policy.decide(rv, or_views, cf).index
        else:
            # same views, rng state and policy state: the same decision
            rec.d_oracle = rec.d_true_load
        cost = self.cfg.cost
        # CostModel.estimate_ms inlined (same float operations in the same order, so
        # bit-identical): once per replica per simulated request.
        overhead = cost.step_overhead_ms
        per_seq = cost.decode_ms_per_seq
        pmt = cost.prefill_ms_per_token
        attn = cost.prefill_attn_ms_per_token2
        inp = req.input_tokens
        est = []
        for k, r in enumerate(self.replicas):
            c = true_cached[k]
            u = inp - c
            snap = true_snaps[k]
            rcfg = r.cfg
            rmbt = rcfg.max_batched_tokens
            speed = rcfg.speed
            per_step = overhead + per_seq * snap.running
            backlog = max(0.0, true_backlog[k])
            q = backlog * pmt + math.ceil(backlog / rmbt) * per_step
            p = u * (pmt + attn * (c + u / 2)) + max(1, math.ceil(u / rmbt)) * per_step
            est.append((q / speed, p / speed))
        rec.est = est

    def _submit(self, rec: Record, i: int) -> None:
        seq = self.replicas[i].submit(rec.req)
        if seq.state != 2:  # not finished on the spot
            rec.seq = seq
            self._by_seq[id(seq)] = rec
            if self.cfg.client_timeout_s is not None:
                deadline = rec.req.arrival_s + self.cfg.client_timeout_s
                self.env.at(deadline, PRIO_TIMEOUT, self.replicas[i].abort, seq)
        else:
            rec.seq = seq

    def _on_finish(self, seq: Seq) -> None:
        rec = self._by_seq.pop(id(seq), None)
        if rec is None:  # finished inside submit (never fits): found by identity below
            for r in reversed(self.records):
                if r.req is seq.req:
                    rec = r
                    rec.seq = seq
                    break
        self._outstanding -= 1
        if self.log is not None:
            self.log.append(("finish", seq.req.request_id, seq.finish_reason, seq.t_first_token, seq.t_finish))
        if rec is not None:
            self._emit(rec)

    # ------------------------------------------------------------------ emission
    def _emit(self, rec: Record) -> None:
        if self.emitter is None:
            return
        req = rec.req
        rt = self.routers[rec.router]
        ch = rec.choice
        assert ch is not None
        cands = []
        scores = ch.scores
        t0 = self.cfg.t0_ns
        new = tuple.__new__
        for v in rec.seen:
            # CandidateTrace(...) field by field, self.ns() inlined (same arithmetic)
            cands.append(new(CandidateTrace, (
                v.replica, v.eligible, None if v.eligible else "full", v.waiting, v.running,
                v.kv_usage, v.remaining_tokens, t0 + int(round(v.telemetry_ts * 1e9)), v.pending,
                v.predicted_cached_tokens, v.est_queue_ms, v.est_prefill_ms,
                scores[v.index] if scores else None,
            )))
        seq = rec.seq
        dec_ns = self.ns(rec.t_decide)
        if ch.index is None or seq is None:
            trace = RequestTrace(
                run_id=self.run_id, request_id=self.wire_id(req.request_id), model=self.cfg.model,
                router_id=rt.id, policy=rt.policy.name, input_tokens=req.input_tokens,
                max_tokens=req.max_tokens, prefix_hashes=tuple(req.prefix_hashes()),
                send_ns=self.ns(req.arrival_s), decided_ns=dec_ns, candidates=tuple(cands),
                chosen=None, reason=ch.reason, outcome="rejected", status="rejected",
                end_ns=dec_ns, first_token_ns=None, output_tokens=0, finish_reason=None,
            )
        else:
            ft = None if seq.t_first_token is None else self.ns(seq.t_first_token)
            status = "cancelled" if seq.finish_reason == "abort" else "ok"
            trace = RequestTrace(
                run_id=self.run_id, request_id=self.wire_id(req.request_id), model=self.cfg.model,
                router_id=rt.id, policy=rt.policy.name, input_tokens=req.input_tokens,
                max_tokens=req.max_tokens, prefix_hashes=tuple(req.prefix_hashes()),
                send_ns=self.ns(req.arrival_s), decided_ns=dec_ns, candidates=tuple(cands),
                chosen=self.replicas[ch.index].id, reason=ch.reason, outcome="routed",
                status=status, end_ns=self.ns(seq.t_finish or rec.t_decide), first_token_ns=ft,
                output_tokens=seq.generated, finish_reason=seq.finish_reason,
                replica=self.replicas[ch.index].id, replica_arrival_ns=self.ns(seq.t_arrival),
                replica_admit_ns=None if seq.t_admit is None else self.ns(seq.t_admit),
                replica_first_token_ns=ft,
                replica_finish_ns=None if seq.t_finish is None else self.ns(seq.t_finish),
                cached_tokens=seq.cached_first, preemptions=seq.preemptions,
            )
        self.emitter.emit(trace)

    # ------------------------------------------------------------------ results
    def summary(self, wall_s: float, ground_truth_path: str | None = None) -> RunSummary:
        ttfts: list[float] = []
        n_fin = n_rej = n_ab = n_slow = 0
        cached = inp = 0
        causes: dict[str, int] = {}
        prim: dict[str, int] = {}
        slo_ms = self.cfg.labels.ttft_slo_ms
        for rec in self.records:
            lab = rec.labels
            seq = rec.seq
            if rec.choice is None or rec.choice.index is None:
                n_rej += 1
            elif seq is not None:
                if seq.finish_reason == "abort":
                    n_ab += 1
                else:
                    n_fin += 1
                if seq.t_first_token is not None:
                    ttfts.append((seq.t_first_token - rec.req.arrival_s) * 1000.0)
                if seq.cached_first is not None:
                    cached += seq.cached_first
                    inp += rec.req.input_tokens
            if not self.ground_truth:
                # the labels' rule for "slow", without the labels
                first = None if seq is None else seq.t_first_token
                if first is None or (first - rec.req.arrival_s) * 1000.0 > slo_ms:
                    n_slow += 1
                continue
            if lab.get("slow"):
                n_slow += 1
            for c in lab.get("causes", ()):
                causes[c] = causes.get(c, 0) + 1
            p = lab.get("primary_cause", "none")
            prim[p] = prim.get(p, 0) + 1
        ttfts.sort()
        return RunSummary(
            scenario=self.scenario, seed=self.seed, policy=self.cfg.router.policy,
            n_requests=len(self.records), n_finished=n_fin, n_rejected=n_rej, n_aborted=n_ab,
            n_slow=n_slow, ttft_p50_ms=_pct(ttfts, 0.5), ttft_p90_ms=_pct(ttfts, 0.9),
            ttft_p99_ms=_pct(ttfts, 0.99),
            ttft_mean_ms=sum(ttfts) / len(ttfts) if ttfts else float("nan"),
            cached_token_fraction=cached / inp if inp else 0.0,
            preemptions=sum(r.preemptions for r in self.replicas),
            evictions=sum(r.pool.evictions for r in self.replicas),
            sim_duration_s=self.env.now, wall_s=wall_s, events=self.env.processed,
            cause_counts=dict(sorted(causes.items())), primary_cause_counts=dict(sorted(prim.items())),
            ground_truth_path=ground_truth_path, run_id=self.run_id,
        )

    def wire_id(self, request_id: str) -> str:
        """The request id as emitted (``<run_id>:<trace id>``): unique across runs that replay the
        same trace into one store, as request ids are in a real fleet."""
        return f"{self.run_id}:{request_id}"

    def ground_truth_rows(self) -> list[dict[str, Any]]:
        from ._groundtruth import ground_truth_row

        if not self.ground_truth:
            raise TestbedError("this simulation ran with ground_truth=False: no ground truth rows")

        return [ground_truth_row(rec, self) for rec in self.records]

    def write_ground_truth(self, path: str) -> None:
        write_ground_truth(self.ground_truth_rows(), path)


def timed_run(sim: Simulation) -> float:
    t = time.perf_counter()
    sim.run()
    return time.perf_counter() - t
