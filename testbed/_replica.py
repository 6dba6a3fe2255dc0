"""One engine replica: continuous batching with chunked prefill, a KV pool with prefix cache,
preemption by recompute, and a step-time cost model.

The scheduler follows vLLM V1 in outline: each step first serves running sequences (one token
per decoding sequence, the next prefill chunk for partially prefilled ones), then admits waiting
sequences FCFS while the token budget, ``max_running`` and the KV pool allow. When a running
sequence cannot get a block, the most recently admitted running sequence is preempted (blocks
released, requeued at the head, recomputed later).

Speed: stretches where every running sequence is decoding and nothing can be admitted are run as
one "decode run" of ``k`` identical steps (``k`` = steps until the first sequence finishes),
interrupted when a request arrives or is aborted. The decode step time of a run uses the context
length at its start. Everything observable (snapshots, token times) is computed as if each step
had been simulated.

A replica never reads global state; it is driven by the :class:`~testbed._env.Environment` it is
given, so a live (asyncio) mode can reuse it.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections import deque
from collections.abc import Callable
from typing import NamedTuple

from ._config import CostModel, ReplicaConfig
from ._env import PRIO_STEP, Environment, Event
from ._kvcache import Entry, KVPool
from ._requests import Request

__all__ = ["Replica", "Seq", "Snapshot"]

WAITING, RUNNING, DONE = 0, 1, 2
_new_tuple = tuple.__new__


class Snapshot(NamedTuple):
    """Telemetry of one replica at virtual time ``ts`` (what a metrics scrape would return).

    Immutable; a named tuple because one is built per replica at every telemetry poll (and, with
    ground truth, at every decision): several times cheaper to build than a frozen dataclass."""

    replica: str
    ts: float
    waiting: int
    running: int
    kv_usage: float
    remaining_prefill_tokens: int
    remaining_decode_tokens: int

    @property
    def remaining_tokens(self) -> int:
        return self.remaining_prefill_tokens + self.remaining_decode_tokens


class Seq:
    """A request's life on one replica (mutable, owned by the replica)."""

    __slots__ = (
        "req", "state", "target", "computed", "generated", "exp_out", "refs", "own",
        "t_arrival", "t_admit", "t_first_token", "t_finish", "cached_first", "preemptions",
        "finish_reason", "abort_flag", "admitted", "first_done",
    )

    def __init__(self, req: Request, now: float, expected_output: int) -> None:
        self.req = req
        self.state = WAITING
        self.target = req.input_tokens  # tokens to prefill (prompt + outputs lost to preemption)
        self.computed = 0
        self.generated = 0
        self.exp_out = min(req.max_tokens, expected_output)
        self.refs: list[Entry] = []
        self.own = 0  # private KV blocks
        self.t_arrival = now
        self.t_admit: float | None = None
        self.t_first_token: float | None = None
        self.t_finish: float | None = None
        self.cached_first: int | None = None  # prompt tokens reused at first admission
        self.preemptions = 0
        self.finish_reason: str | None = None
        self.abort_flag = False
        self.admitted = False
        self.first_done = False


class Replica:
    """A simulated engine. ``on_finish(seq)`` is called once per request, at its finish time."""

    def __init__(
        self,
        index: int,
        replica_id: str,
        cfg: ReplicaConfig,
        cost: CostModel,
        env: Environment,
        on_finish: Callable[[Seq], None],
        on_first_token: Callable[[Seq], None] | None = None,
    ) -> None:
        self.index = index
        self.id = replica_id
        self.cfg = cfg
        self.cost = cost
        self.env = env
        self.on_finish = on_finish
        self.on_first_token = on_first_token
        self.pool = KVPool(cfg.capacity_blocks)
        self.waiting: deque[Seq] = deque()
        self.running: list[Seq] = []
        self.rem_prefill = 0
        self.waiting_decode = 0
        self.steps = 0
        self.busy_s = 0.0
        self.preemptions = 0
        self._aborting = 0  # sequences flagged by abort() and not finished yet
        self._bs = cfg.block_size
        # step in progress
        self._event: Event | None = None
        self._step_start = 0.0
        self._prefill: list[tuple[Seq, int]] = []
        self._decode: list[Seq] = []
        self._run_k = 0  # >0: a decode run of this many steps is in progress
        self._run_dt = 0.0
        # Snapshots are taken for every replica at every decision, far more often than the
        # state changes: the remaining-decode sum is cached per state version (bumped by every
        # change of the queues or of a sequence's progress).
        self._ver = 0
        self._dec_ver = -1
        self._dec_sum = 0  # sum of remaining decode tokens over running (no step in flight)
        self._dec_xs: list[int] = []  # in a decode run: remaining per running seq, ascending
        self._dec_suffix: list[int] = []  # suffix sums of _dec_xs (one more element)

    # ---------------------------------------------------------------- block arithmetic
    def _prompt_blocks(self, req: Request, t: int) -> int:
        bt, bs = req.block_tokens, self._bs
        per_seg = -(-bt // bs)
        return (t // bt) * per_seg + -(-(t % bt) // bs)

    def _need(self, seq: Seq, t: int) -> int:
        """Extra blocks ``seq`` must allocate to hold KV for its first ``t`` tokens."""
        req = seq.req
        p = req.input_tokens
        bt = req.block_tokens
        ref_tokens = len(seq.refs) * bt
        if ref_tokens > p:
            ref_tokens = p
        if t <= ref_tokens:
            return 0
        # _prompt_blocks inlined twice (this runs for every sequence at every step)
        bs = self._bs
        per_seg = -(-bt // bs)
        tp = t if t < p else p
        total = (tp // bt) * per_seg + -(-(tp % bt) // bs)
        if t > p:
            total += -(-(t - p) // bs)
        n = total - ((ref_tokens // bt) * per_seg + -(-(ref_tokens % bt) // bs)) - seq.own
        return n if n > 0 else 0

    def blocks_for(self, req: Request) -> int:
        """Blocks a request needs when nothing is cached (prompt plus outputs)."""
        return self._prompt_blocks(req, req.input_tokens) + -(-req.output_tokens // self._bs)

    # ---------------------------------------------------------------- public
    def match_tokens(self, req: Request) -> int:
        """Prompt tokens that would be reused if ``req`` were admitted now (true cache)."""
        m = self.pool.match(req.block_keys)
        return min(m * req.block_tokens, req.input_tokens - 1) if m else 0

    def backlog_prefill_tokens(self) -> int:
        """Prefill tokens the work present must still compute before a request arriving now,
        each queued prompt counted without the prefix it finds cached at its admission: what
        the cache holds now, or what a sequence ahead of it (running, or queued before it)
        computes first (FCFS admission; a chunked prefill publishes its complete segments
        before the budget frees for the next prompt). A cached segment no sequence references
        is gone when the prefills ahead of the prompt allocate more blocks than are free and
        the pool evicts it for them (least recently released first; a preempted sequence's
        own segments among them).
        ``remaining_prefill_tokens`` of the snapshot counts every queued prompt whole (the
        telemetry a replica reports)."""
        waiting = self.waiting
        if not waiting:
            return self.rem_prefill
        pool = self.pool
        entries = pool.entries
        free = pool.free
        bs = self._bs
        ahead: set[int] = set()
        total = 0
        need = 0  # blocks the prefills ahead still allocate
        for s in self.running:
            if s.computed < s.target:
                total += s.target - s.computed
                need += self._need(s, s.target)
                ahead.update(s.req.block_keys)
        lru = iter(pool.lru.values())  # unreferenced entries, least recently released first
        gone: set[int] = set()
        evicted = 0
        for s in waiting:
            while free + evicted < need:
                e = next(lru, None)
                if e is None:
                    break
                gone.add(e.key)
                evicted += e.nblocks
            req = s.req
            keys = req.block_keys
            m = 0
            for k in keys:
                if k not in ahead and (k not in entries or k in gone):
                    break
                m += 1
            cached = min(m * req.block_tokens, req.input_tokens)
            if cached >= s.target:
                cached = s.target - 1  # at least one token is recomputed (as _admit)
            total += s.target - cached
            need += -(-(s.target - cached) // bs)
            ahead.update(keys)
        return total

    def submit(self, req: Request) -> Seq:
        """A request arrives at the replica now."""
        now = self.env.now
        seq = Seq(req, now, self.cfg.expected_output_tokens)
        if self.blocks_for(req) > self.pool.capacity:
            seq.finish_reason = "abort"  # can never fit: rejected by the engine
            seq.state = DONE
            seq.t_finish = now
            self.on_finish(seq)
            return seq
        self.waiting.append(seq)
        self.rem_prefill += seq.target
        self.waiting_decode += seq.exp_out
        self._ver += 1
        self._wake()
        return seq

    def abort(self, seq: Seq) -> None:
        """The client gave up: drop the request now (waiting) or at the end of this step."""
        if seq.state == DONE:
            return
        self._ver += 1
        if seq.state == WAITING:
            self.waiting.remove(seq)
            self.rem_prefill -= seq.target - seq.computed
            self.waiting_decode -= max(0, seq.exp_out - seq.generated)
            self._finish(seq, "abort")
            return
        if not seq.abort_flag:
            seq.abort_flag = True
            self._aborting += 1
        self._wake()

    def snapshot(self) -> Snapshot:
        """Telemetry now (valid in the middle of a decode run too)."""
        now = self.env.now
        if self._dec_ver != self._ver:
            self._refresh_decode_cache()
        dec = self.waiting_decode
        j = 0
        if self._run_k:
            j = min(self._run_k, int((now - self._step_start) / self._run_dt + 1e-9))
        if j:
            # every running sequence decodes during a run: sum of max(0, x - j) over them
            xs = self._dec_xs
            i = bisect_right(xs, j)
            dec += self._dec_suffix[i] - j * (len(xs) - i)
        else:
            dec += self._dec_sum
        pool = self.pool
        cap = pool.capacity
        return _new_tuple(Snapshot, (  # Snapshot(...) without the Python-level __new__
            self.id, now, len(self.waiting), len(self.running),
            (cap - pool.free - pool.evictable) / cap, self.rem_prefill, dec,
        ))

    def _refresh_decode_cache(self) -> None:
        xs = sorted(s.exp_out - s.generated for s in self.running)
        total = 0
        suffix = [0] * (len(xs) + 1)
        for i in range(len(xs) - 1, -1, -1):
            total += xs[i] if xs[i] > 0 else 0
            suffix[i] = total
        self._dec_xs = xs
        self._dec_suffix = suffix
        self._dec_sum = total
        self._dec_ver = self._ver

    # ---------------------------------------------------------------- stepping
    def _wake(self) -> None:
        """Something changed (arrival, abort): start a step, or cut a decode run short."""
        if self._event is None:
            self._start_step()
            return
        if self._run_k > 1:
            now = self.env.now
            done = (now - self._step_start) / self._run_dt
            new_k = min(self._run_k, max(1, math.ceil(done - 1e-9)))
            if new_k < self._run_k:
                self._event.cancel()
                self._ver += 1
                self._run_k = new_k
                self._event = self.env.at(
                    self._step_start + new_k * self._run_dt, PRIO_STEP, self._end_step
                )

    def _release(self, seq: Seq) -> None:
        """Give back the cache entries and blocks ``seq`` holds."""
        pool = self.pool
        pool.release_all(seq.refs)
        seq.refs = []
        pool.release_blocks(seq.own)
        seq.own = 0

    def _finish(self, seq: Seq, reason: str) -> None:
        if seq.abort_flag:
            self._aborting -= 1
        self._release(seq)
        self._ver += 1
        seq.state = DONE
        seq.finish_reason = reason
        seq.t_finish = self.env.now
        self.on_finish(seq)

    def _preempt(self, seq: Seq) -> None:
        self._release(seq)
        self.running.remove(seq)
        self.rem_prefill -= seq.target - seq.computed
        seq.target = seq.req.input_tokens + seq.generated
        seq.computed = 0
        seq.state = WAITING
        seq.admitted = False
        seq.preemptions += 1
        self.preemptions += 1
        self.rem_prefill += seq.target
        self.waiting_decode += max(0, seq.exp_out - seq.generated)
        self.waiting.appendleft(seq)

    def _register(self, seq: Seq) -> None:
        """Publish fully computed prompt segments to the prefix cache (contiguously)."""
        req = seq.req
        keys = req.block_keys
        bt = req.block_tokens
        p = req.input_tokens
        pool = self.pool
        comp = min(seq.computed, p)
        refs = seq.refs
        i = len(refs)
        n_keys = len(keys)
        if i >= n_keys or comp < (i + 1) * bt and comp < p:
            return  # no new segment complete (most prefill chunks end inside one)
        bs = self._bs
        per_seg = -(-bt // bs)  # blocks of one full segment, as in _prompt_blocks
        entries = pool.entries
        get = entries.get
        append = refs.append
        moved = 0
        while i < n_keys:
            end = (i + 1) * bt
            if end <= p:
                if comp < end:
                    break
                nb = per_seg
            else:
                if comp < p:
                    break
                nb = self._prompt_blocks(req, p) - i * per_seg
            k = keys[i]
            e = get(k)
            moved += nb
            if e is None:  # KVPool.register inlined: a new entry this sequence references
                e = Entry(k, nb, 1)
                entries[k] = e
            else:  # computed twice concurrently: keep the cached copy, free ours
                pool.acquire(e)
                pool.release_blocks(nb)
            append(e)
            i += 1
        seq.own -= moved

    def _admit(self, seq: Seq) -> int:
        """Look the prompt up in the prefix cache and take references; returns cached tokens."""
        req = seq.req
        pool = self.pool
        m = pool.match(req.block_keys)
        cached = min(m * req.block_tokens, req.input_tokens)
        if cached >= seq.target:
            cached = seq.target - 1  # at least one token is recomputed to produce logits
        entries = pool.entries
        for k in req.block_keys[:m]:
            e = entries[k]
            pool.acquire(e)
            seq.refs.append(e)
        seq.computed = cached
        return cached

    def _unadmit(self, seq: Seq) -> None:
        self.pool.release_all(seq.refs)
        seq.refs = []
        seq.computed = 0

    def _start_step(self) -> None:
        running = self.running
        waiting = self.waiting
        cfg = self.cfg
        env = self.env
        now = env.now
        pool = self.pool
        self._ver += 1
        self._prefill = prefill = []
        self._decode = decode = []
        self._run_k = 0
        if not running and not waiting:
            self._event = None
            return
        # decode run: all running are decoding and nobody can be admitted until one finishes
        if running and (not waiting or len(running) >= cfg.max_running):
            k = 1 << 30
            ok = True
            for s in running:
                if s.computed < s.target or s.abort_flag:
                    ok = False
                    break
                r = s.req.output_tokens - s.generated
                if r < k:
                    k = r
            if ok and k >= 2:
                needs = [self._need(s, s.req.input_tokens + s.generated + k - 1) for s in running]
                if sum(needs) <= pool.available():
                    pool.allocate(sum(needs))
                    ctx = 0
                    for s, n in zip(running, needs, strict=True):
                        s.own += n
                        ctx += s.req.input_tokens + s.generated
                    dt = self._step_s(len(running), ctx, ())
                    self._decode = list(running)
                    self._run_k = k
                    self._run_dt = dt
                    self._step_start = now
                    self._event = env.at(now + k * dt, PRIO_STEP, self._end_step)
                    return
        budget = cfg.max_batched_tokens
        chunks: list[tuple[int, int]] = []
        ctx = 0
        i = 0
        while i < len(running):
            s = running[i]
            if s.computed < s.target:
                chunk = min(s.target - s.computed, budget)
                if chunk <= 0:
                    i += 1
                    continue
                t = s.computed + chunk
            else:
                chunk = 0
                t = s.req.input_tokens + s.generated
            need = self._need(s, t)
            preempted_self = False
            while not pool.allocate(need):
                victim = running[-1]
                self._preempt(victim)
                if victim is s:
                    preempted_self = True
                    break
            if preempted_self:
                break
            s.own += need
            if chunk:
                prefill.append((s, chunk))
                chunks.append((s.computed, chunk))
                budget -= chunk
            else:
                decode.append(s)
                ctx += t
                budget -= 1
            i += 1
        # admit waiting FCFS
        while waiting and budget > 0 and len(running) < cfg.max_running:
            s = waiting[0]
            cached = self._admit(s)
            chunk = min(s.target - s.computed, budget)
            need = self._need(s, s.computed + chunk)
            if need > pool.available():
                self._unadmit(s)
                break
            pool.allocate(need)
            s.own += need
            waiting.popleft()
            self.waiting_decode -= max(0, s.exp_out - s.generated)
            self.rem_prefill -= cached
            s.state = RUNNING
            s.admitted = True
            if s.t_admit is None:
                s.t_admit = now
                s.cached_first = min(cached, s.req.input_tokens)
            running.append(s)
            prefill.append((s, chunk))
            chunks.append((s.computed, chunk))
            budget -= chunk
        if not prefill and not decode:
            # nothing schedulable (pool exhausted by waiting heads); wait for a change
            self._event = None
            return
        dt = self._step_s(len(decode), ctx, chunks)
        self._step_start = now
        self._event = env.at(now + dt, PRIO_STEP, self._end_step)

    def _step_s(self, n_decode: int, ctx: int, chunks: tuple[tuple[int, int], ...] | list[tuple[int, int]]) -> float:
        c = self.cost
        ms = c.step_overhead_ms
        if n_decode:
            ms += c.decode_ms_per_seq * n_decode + c.decode_ms_per_ctx_token * ctx
        for start, chunk in chunks:
            ms += c.prefill_chunk_ms(start, chunk)
        return ms / (1000.0 * self.cfg.speed)

    def _end_step(self) -> None:
        now = self.env.now
        self._ver += 1
        self.busy_s += now - self._step_start
        finished: list[Seq] = []
        if self._run_k:
            k = self._run_k
            self.steps += k
            for s in self._decode:
                s.generated += k
                if s.generated >= s.req.output_tokens:
                    finished.append(s)
        else:
            self.steps += 1
            for s, chunk in self._prefill:
                if s.state != RUNNING:
                    continue
                s.computed += chunk
                self.rem_prefill -= chunk
                self._register(s)
                if s.computed >= s.target:
                    s.generated += 1
                    if not s.first_done:
                        s.first_done = True
                        s.t_first_token = now
                        if self.on_first_token is not None:
                            self.on_first_token(s)
                            self._ver += 1
                    if s.generated >= s.req.output_tokens:
                        finished.append(s)
            for s in self._decode:
                if s.state != RUNNING:
                    continue
                s.generated += 1
                if s.generated >= s.req.output_tokens:
                    finished.append(s)
        self._prefill = []
        self._decode = []
        self._run_k = 0
        if finished or self._aborting:  # (a flagged sequence may also be waiting: no harm)
            done = set(map(id, finished))
            keep: list[Seq] = []
            for s in self.running:
                if id(s) in done:
                    self._finish(s, s.req.finish_reason)
                elif s.abort_flag:
                    self.rem_prefill -= s.target - s.computed
                    self._finish(s, "abort")
                else:
                    keep.append(s)
            self.running = keep
        self._event = None
        self._start_step()
