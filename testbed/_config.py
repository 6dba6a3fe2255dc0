"""Configuration dataclasses. Each field carries ``help`` metadata (the CLI is built from it).

Defaults describe one replica of an 8B dense model (Llama-3-8B-like: 32 layers, 8 KV heads of
128 dims, bf16) on one H100-80GB-class GPU, served by a vLLM-V1-like engine. They are documented
assumptions for a simulator, not measurements; ``docs/testbed.md`` derives them.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, Literal

from ._errors import ConfigError

__all__ = ["CostModel", "FleetConfig", "LabelConfig", "ReplicaConfig", "RouterConfig", "fields_help"]


def _f(default: Any, help: str) -> Any:  # noqa: A002 - "help" is the metadata key by design
    return field(default=default, metadata={"help": help})


@dataclass(frozen=True, slots=True)
class CostModel:
    """Step time of one engine iteration (continuous batching, chunked prefill), in ms.

    ``step_ms = step_overhead_ms + decode_ms_per_seq * n_decode
    + decode_ms_per_ctx_token * (context tokens of decoding sequences)
    + sum over prefill chunks of (prefill_ms_per_token * chunk
    + prefill_attn_ms_per_token2 * chunk * (start + chunk / 2))``, divided by the replica's
    ``speed``.
    """

    step_overhead_ms: float = _f(
        5.0, "fixed cost of one forward pass: ~16 GB of bf16 weights read at ~3.3 TB/s"
    )
    decode_ms_per_seq: float = _f(0.08, "extra cost per decoding sequence in a step")
    decode_ms_per_ctx_token: float = _f(
        4e-5, "KV read per context token of a decoding sequence (128 KiB/token at ~3.3 TB/s)"
    )
    prefill_ms_per_token: float = _f(
        0.1, "linear prefill cost per uncached prompt token (~16 GFLOP/token, ~40% of peak)"
    )
    prefill_attn_ms_per_token2: float = _f(
        1e-6, "attention cost per (prompt token x earlier token) pair in prefill"
    )

    def prefill_chunk_ms(self, start: int, chunk: int) -> float:
        """Prefill cost of ``chunk`` tokens at positions ``start..start+chunk``, no overhead."""
        return chunk * (self.prefill_ms_per_token + self.prefill_attn_ms_per_token2 * (start + chunk / 2))

    def estimate_ms(
        self,
        *,
        backlog_prefill_tokens: float,
        n_running: float,
        uncached_tokens: int,
        cached_tokens: int,
        max_batched_tokens: int,
        speed: float = 1.0,
    ) -> tuple[float, float]:
        """Q and P of the seed's Q+P model: (wait before this request's prefill, its prefill).

        A deliberately simple estimator shared by the ``qp_cost`` policy (on telemetry) and the
        ground truth (on true state): FCFS prefill backlog drained ``max_batched_tokens`` per
        step, each step also carrying the running decodes. It ignores decode lengths, chunk
        interleaving and preemption, so it is an estimate, never the truth.
        """
        per_step = self.step_overhead_ms + self.decode_ms_per_seq * n_running
        backlog = max(0.0, backlog_prefill_tokens)
        q = backlog * self.prefill_ms_per_token + math.ceil(backlog / max_batched_tokens) * per_step
        p = self.prefill_chunk_ms(cached_tokens, uncached_tokens) + max(
            1, math.ceil(uncached_tokens / max_batched_tokens)
        ) * per_step
        return q / speed, p / speed


@dataclass(frozen=True, slots=True)
class ReplicaConfig:
    """One engine replica (vLLM-V1-like scheduler)."""

    max_batched_tokens: int = _f(8192, "token budget per step (chunked prefill), vLLM max_num_batched_tokens")
    max_running: int = _f(256, "max running sequences, vLLM max_num_seqs")
    block_size: int = _f(16, "KV block size in tokens")
    kv_capacity_tokens: int = _f(
        440_000, "KV pool size in tokens: (72 GB usable - 16 GB weights - ~2 GB act.) / 128 KiB"
    )
    expected_output_tokens: int = _f(
        256, "the replica's guess of output length when it reports remaining decode work"
    )
    speed: float = _f(1.0, "speed factor; 0.5 = every step takes twice as long (slow replica)")

    @property
    def capacity_blocks(self) -> int:
        return self.kv_capacity_tokens // self.block_size

    def validate(self) -> None:
        for name in ("max_batched_tokens", "max_running", "block_size", "kv_capacity_tokens"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"replica.{name} must be > 0, got {getattr(self, name)}")
        if self.capacity_blocks < 1:
            raise ConfigError("replica.kv_capacity_tokens must hold at least one block")
        if not self.speed > 0:
            raise ConfigError(f"replica.speed must be > 0, got {self.speed}")
        if self.expected_output_tokens < 0:
            raise ConfigError("replica.expected_output_tokens must be >= 0")


@dataclass(frozen=True, slots=True)
class RouterConfig:
    """The reference router(s). Routers only ever see telemetry snapshots with their age."""

    policy: str = _f("qp_cost", "policy name (see testbed.POLICIES)")
    telemetry_interval_s: float = _f(0.25, "how often routers poll replica telemetry")
    pending_correction: bool = _f(
        True, "count own assignments not yet reflected in telemetry (per router)"
    )
    n_routers: int = _f(1, "independent router instances (each with own snapshots and pending)")
    router_assignment: Literal["round_robin", "random"] = _f(
        "round_robin", "how client requests are spread over router instances"
    )
    admission_limit: int | None = _f(
        None, "reject when every replica's seen waiting+pending is >= this (None: unbounded)"
    )
    forward_latency_s: float = _f(0.0, "router-to-replica delay before a request is queued")
    balance_abs_threshold: int = _f(64, "cache_aware: imbalance if max-min load exceeds this")
    balance_rel_threshold: float = _f(1.5, "cache_aware: ...and max load > min load times this")
    cache_threshold: float = _f(0.3, "cache_aware: follow the best match when its rate exceeds this")
    tree_max_tokens: int = _f(
        2_000_000, "router's approximate prefix tree: max tokens remembered per replica"
    )
    tree_eviction_interval_s: float = _f(60.0, "router's tree: LRU eviction period (SGLang: 60 s)")
    prefix_index: Literal["per_replica", "last_replica"] = _f(
        "per_replica", "router's prefix index: the prefixes sent to each replica, or only the "
        "last replica that received each prefix"
    )

    def validate(self) -> None:
        if not self.telemetry_interval_s > 0:
            raise ConfigError("router.telemetry_interval_s must be > 0")
        if self.n_routers < 1:
            raise ConfigError("router.n_routers must be >= 1")
        if self.router_assignment not in ("round_robin", "random"):
            raise ConfigError(f"router.router_assignment: unknown {self.router_assignment!r}")
        if self.admission_limit is not None and self.admission_limit < 1:
            raise ConfigError("router.admission_limit must be >= 1 or None")
        if self.forward_latency_s < 0:
            raise ConfigError("router.forward_latency_s must be >= 0")
        if self.tree_max_tokens < 0 or not self.tree_eviction_interval_s > 0:
            raise ConfigError("router tree limits must be positive")
        if self.prefix_index not in ("per_replica", "last_replica"):
            raise ConfigError(f"router.prefix_index: unknown {self.prefix_index!r}")
        from .policies import POLICIES  # late import: policies import this module

        if self.policy not in POLICIES:
            raise ConfigError(f"router.policy: unknown {self.policy!r}; known: {sorted(POLICIES)}")


@dataclass(frozen=True, slots=True)
class LabelConfig:
    """Rules that turn true state into cause labels (see docs/testbed.md, "Ground truth")."""

    ttft_slo_ms: float = _f(2000.0, "a request is slow when its TTFT exceeds this")
    min_cause_ms: float = _f(100.0, "a cause counts only if it explains at least this many ms")
    min_cause_frac: float = _f(0.15, "...and at least this fraction of the request's TTFT")
    cache_tolerance_tokens: int = _f(
        16, "eviction only when predicted - reused cached tokens is at least this (one KV block)"
    )
    slow_replica_speed: float = _f(
        0.85, "a replica with speed below this counts as slow: its slowness alone costs every "
        "request on it at least min_cause_frac of its TTFT (1 - 0.15); the audit's bar"
    )
    kv_pressure: float = _f(
        0.85, "KV-cache usage of a replica at the decision from which memory may hold up its "
        "queue (not modelled): with measured_routing, a TTFT on such a chosen replica that the "
        "model misses by the cause bar is measured, and so is a modelled routing saving that "
        "counts while the best replica or the policy's true-load choice is at it; the audit's "
        "kv_pressure"
    )
    measured_routing: bool = _f(
        False, "measure stale_telemetry, misrouting and overload instead of modelling them where "
        "the cost model decides the label (a slow request on a slow replica, a modelled routing "
        "saving above the TTFT, a TTFT on a chosen replica under memory pressure, preempted "
        "or at kv_pressure, that the model misses by the cause bar, or a routing saving resting "
        "on a replica at kv_pressure): re-run the simulation with the request forced onto each other replica, to its "
        "first token"
    )


@dataclass(frozen=True, slots=True)
class FleetConfig:
    """A whole run: replicas, routers, cost model, labelling, clock origin."""

    n_replicas: int = _f(8, "number of data-parallel replicas")
    replica: ReplicaConfig = field(default_factory=ReplicaConfig, metadata={"help": "replica defaults"})
    replica_overrides: dict[int, dict[str, Any]] = field(
        default_factory=dict, metadata={"help": "per-replica field overrides, e.g. {0: {'speed': 0.5}}"}
    )
    router: RouterConfig = field(default_factory=RouterConfig, metadata={"help": "router settings"})
    cost: CostModel = field(default_factory=CostModel, metadata={"help": "step cost model"})
    labels: LabelConfig = field(default_factory=LabelConfig, metadata={"help": "labelling rules"})
    client_timeout_s: float | None = _f(None, "client aborts a request not finished after this")
    t0_ns: int = _f(1_767_225_600_000_000_000, "Unix ns of virtual time 0 (2026-01-01T00:00Z)")
    model: str = _f("sim-8b", "model name reported in telemetry")

    def replica_config(self, index: int) -> ReplicaConfig:
        over = self.replica_overrides.get(index)
        return dataclasses.replace(self.replica, **over) if over else self.replica

    def validate(self) -> None:
        if self.n_replicas < 1:
            raise ConfigError("n_replicas must be >= 1")
        for i in range(self.n_replicas):
            try:
                self.replica_config(i).validate()
            except TypeError as exc:
                raise ConfigError(f"replica_overrides[{i}]: {exc}") from exc
        bad = [i for i in self.replica_overrides if not 0 <= i < self.n_replicas]
        if bad:
            raise ConfigError(f"replica_overrides names replicas out of range: {bad}")
        self.router.validate()
        if self.client_timeout_s is not None and not self.client_timeout_s > 0:
            raise ConfigError("client_timeout_s must be > 0 or None")


def fields_help(cls: type) -> dict[str, tuple[Any, str]]:
    """``{field: (default, help)}`` for a config dataclass (used to build CLI options)."""
    out: dict[str, tuple[Any, str]] = {}
    for f in dataclasses.fields(cls):
        default = f.default if f.default is not dataclasses.MISSING else None
        out[f.name] = (default, str(f.metadata.get("help", "")))
    return out
