"""Prometheus text → ``raw_snapshots`` rows (pure functions).

An engine's ``/metrics`` gives rows about the engine itself (``source = 'replica'``). A router's
``/metrics`` gives one row per worker it labels (``source = 'router'``): what the router knows of
that worker (its requests in flight there, its health verdict and, where the router re-exports
them, the engine load it polled), which is the router's view when it records no decision.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any, Final
from urllib.parse import urlsplit

import pyarrow as pa
from prometheus_client.parser import text_string_to_metric_families

from semconv import METRIC_ALIASES, METRIC_DP_RANK_LABELS

COLUMNS: Final = (
    "target", "replica", "dp_rank", "scraped_ns", "scrape_ms", "ok", "error", "running",
    "waiting", "kv_usage", "prefix_cache_queries", "prefix_cache_hits", "cache_hit_rate",
    "model_name", "source", "router_in_flight", "router_dispatched", "router_healthy",
)
"""Columns of ``audit/sql/raw/raw_snapshots.sql``, in order."""

SCHEMA: Final = pa.schema([
    ("target", pa.string()), ("replica", pa.string()), ("dp_rank", pa.int64()),
    ("scraped_ns", pa.int64()), ("scrape_ms", pa.float64()), ("ok", pa.bool_()),
    ("error", pa.string()), ("running", pa.float64()), ("waiting", pa.float64()),
    ("kv_usage", pa.float64()), ("prefix_cache_queries", pa.float64()),
    ("prefix_cache_hits", pa.float64()), ("cache_hit_rate", pa.float64()),
    ("model_name", pa.string()), ("source", pa.string()), ("router_in_flight", pa.float64()),
    ("router_dispatched", pa.float64()), ("router_healthy", pa.bool_()),
])
"""Arrow schema of the tables handed to the sink (same columns and types as the DDL)."""

ROUTER_METRICS: Final[dict[str, tuple[str, str]]] = {
    # SMG (sglang-router): per worker URL; smg_engine_* re-export the load SMG polled from the
    # engine (only for workers that answer its load poll), labelled dp_rank too
    "smg_worker_requests_active": ("router_in_flight", "worker"),
    "smg_worker_requests_total": ("router_dispatched", "worker"),
    "smg_worker_health": ("router_healthy", "worker"),
    "smg_engine_running_requests": ("running", "worker"),
    "smg_engine_waiting_requests": ("waiting", "worker"),
    "smg_engine_token_usage": ("kv_usage", "worker"),
    "smg_engine_cache_hit_rate": ("cache_hit_rate", "worker"),
    # vllm-router: per worker URL
    "vllm_router_running_requests": ("router_in_flight", "worker"),
    "vllm_router_processed_requests_total": ("router_dispatched", "worker"),
    "vllm_router_worker_health": ("router_healthy", "worker"),
    # llm-d endpoint picker: per endpoint (pod) name; the second is the older name
    "llm_d_epp_per_endpoint_queue_size": ("waiting", "model_server_endpoint"),
    "inference_pool_per_pod_queue_size": ("waiting", "model_server_pod"),
    "llm_d_epp_inflight_requests": ("router_in_flight", "endpoint_name"),
}
"""Router metric sample name -> (snapshot field, label naming the worker). Each labelled worker
gets its own row with ``source = 'router'``. Two names of one field: the earlier one wins."""

ROUTER_PREFIXES: Final = ("smg_", "vllm_router_", "llm_d_epp_", "inference_pool_",
                          "inference_extension_")
"""Metric name prefixes that mark a scrape target as a router: its answer gives rows about the
workers it labels and none about itself, so a router never appears as a replica."""

WORKER_ADDR_LABEL: Final = "worker_addr"
"""Label SMG's ``/engine_metrics`` adds to the engines' own series it gathers: such a sample is
about the engine at that address, not about the scraped target."""

# metric sample name -> (field, priority: lower wins = earlier alias, worker label or None)
_BY_NAME: Final[dict[str, tuple[str, int, str | None]]] = {
    name: (fld, i, None) for fld, names in METRIC_ALIASES.items() for i, name in enumerate(names)
}
_BY_NAME.update({
    name: (fld, [n for n, (f, _) in ROUTER_METRICS.items() if f == fld].index(name), label)
    for name, (fld, label) in ROUTER_METRICS.items()
})
# Several samples of one field in one engine (e.g. per model): counts add up, fractions do not.
_SUMMED: Final = frozenset({"running", "waiting", "prefix_cache_queries", "prefix_cache_hits",
                            "router_in_flight", "router_dispatched"})
_HOST_PORT: Final = re.compile(r"^(\[[^\]]+\]|[^/:\s]+):[0-9]+(/.*)?$")


def replica_of(target: str) -> str:
    """Replica id of a scrape URL: ``host:port`` (default port from the scheme)."""
    parts = urlsplit(target if "://" in target else "http://" + target)
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return f"{host}:{port}"


def _row(target: str, scraped_ns: int, scrape_ms: float | None) -> dict[str, Any]:
    row: dict[str, Any] = dict.fromkeys(COLUMNS)
    row.update(target=target, replica=replica_of(target), scraped_ns=int(scraped_ns),
               scrape_ms=scrape_ms, ok=True, source="replica")
    return row


def _worker_replica(value: str) -> str:
    """Replica id of a worker label: ``host:port`` for a URL or address, else the name as is
    (llm-d labels endpoints by pod name)."""
    value = value.strip()
    return replica_of(value) if "://" in value or _HOST_PORT.match(value) else value


def failed_row(target: str, scraped_ns: int, error: str, scrape_ms: float | None = None
               ) -> dict[str, Any]:
    """The row of a failed scrape: ok = false, the error, dp_rank null."""
    row = _row(target, scraped_ns, scrape_ms)
    row.update(ok=False, error=error[:1000])
    return row


def _rank(labels: dict[str, str]) -> int | None:
    for name in METRIC_DP_RANK_LABELS:
        value = labels.get(name)
        if value is not None:
            try:
                return int(value)
            except ValueError:
                return None
    return None


def parse_metrics(
    text: str, target: str, scraped_ns: int, scrape_ms: float | None = None, *,
    router: bool = False,
) -> list[dict[str, Any]]:
    """Rows found in ``text``: one per DP rank of the scraped engine (one row with dp_rank null
    when unranked), then one per worker (and rank) a router labels, in replica order.

    Per replica, values without a rank label fill the fields its ranked rows lack. A target with
    nothing known gives one row for itself (all fields null), unless it is a router: its text
    has a :data:`ROUTER_PREFIXES` family, or ``router`` says the target answered as one before
    (a router that has not registered its families, or no longer has them, answers like an
    engine that knows nothing). A router gives only its workers' rows, none while it names no
    worker. An answer with no metric family at all (vllm-router's first answers after start)
    says nothing about the target: no row. Unknown metrics are ignored; text that does not
    parse gives one failed row.
    """
    return parse_scrape(text, target, scraped_ns, scrape_ms, router=router)[0]


def parse_scrape(
    text: str, target: str, scraped_ns: int, scrape_ms: float | None = None, *,
    router: bool = False,
) -> tuple[list[dict[str, Any]], bool]:
    """:func:`parse_metrics`' rows, and whether ``text`` showed the target to be a router (a
    :data:`ROUTER_PREFIXES` family; ``router`` is passed through when it did not)."""
    # (source, replica or None = the target) -> rank -> field -> (priority, value)
    groups: dict[tuple[str, str | None], dict[int | None, dict[str, tuple[int, float]]]] = {}
    models: dict[tuple[str, str | None, int | None], str] = {}
    seen_router = False
    answered = False  # the text has at least one metric family
    try:
        for family in text_string_to_metric_families(text):
            answered = True
            seen_router = seen_router or family.name.startswith(ROUTER_PREFIXES)
            for sample in family.samples:
                hit = _BY_NAME.get(sample.name)
                if hit is None:
                    continue
                fld, prio, worker_label = hit
                labels = sample.labels
                if worker_label is not None:
                    worker = labels.get(worker_label)
                    if not worker:
                        continue
                    key: tuple[str, str | None] = ("router", _worker_replica(worker))
                elif labels.get(WORKER_ADDR_LABEL):
                    key = ("replica", _worker_replica(labels[WORKER_ADDR_LABEL]))
                else:
                    key = ("replica", None)
                rank = _rank(labels)
                fields = groups.setdefault(key, {}).setdefault(rank, {})
                model = labels.get("model_name") or (worker_label and labels.get("model"))
                if model and (*key, rank) not in models:
                    models[(*key, rank)] = model
                value = float(sample.value)
                old = fields.get(fld)
                if old is None or prio < old[0]:
                    fields[fld] = (prio, value)
                elif prio == old[0]:
                    fields[fld] = (prio, old[1] + value if fld in _SUMMED else max(old[1], value))
    except Exception as exc:  # prometheus_client raises ValueError and friends on bad text
        return [failed_row(target, scraped_ns, f"parse error: {type(exc).__name__}: {exc}",
                           scrape_ms)], router or seen_router
    router = router or seen_router
    if not groups and not router and answered:
        groups = {("replica", None): {}}  # the engine answered: its (empty) row says so
    rows = []
    for key in sorted(groups, key=lambda k: (k[0] != "replica", k[1] is not None, k[1] or "")):
        by_rank = groups[key]
        unranked = by_rank.pop(None, {})
        # the unranked group is popped: the keys left are ranks
        ranks: Sequence[int | None] = sorted(r for r in by_rank if r is not None) or [None]
        for rank in ranks:
            fields = dict(unranked)
            fields.update(by_rank.get(rank, {}) if rank is not None else {})
            row = _row(target, scraped_ns, scrape_ms)
            source, replica = key
            row["source"] = source
            if replica is not None:
                row["replica"] = replica
            row["dp_rank"] = rank
            row["model_name"] = models.get((*key, rank)) or models.get((*key, None))
            for fld, (_, value) in fields.items():
                row[fld] = (None if value < 0 else value > 0) if fld == "router_healthy" else value
            rows.append(row)
    return rows, router


def to_table(rows: list[dict[str, Any]]) -> pa.Table:
    """Rows as an Arrow table with :data:`SCHEMA`."""
    return pa.Table.from_pylist(rows, schema=SCHEMA)
