"""Prometheus text → ``raw_snapshots`` rows (pure functions)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final
from urllib.parse import urlsplit

import pyarrow as pa
from prometheus_client.parser import text_string_to_metric_families

from semconv import METRIC_ALIASES, METRIC_DP_RANK_LABELS

COLUMNS: Final = (
    "target", "replica", "dp_rank", "scraped_ns", "scrape_ms", "ok", "error", "running",
    "waiting", "kv_usage", "prefix_cache_queries", "prefix_cache_hits", "cache_hit_rate",
    "model_name",
)
"""Columns of ``audit/sql/raw/raw_snapshots.sql``, in order."""

SCHEMA: Final = pa.schema([
    ("target", pa.string()), ("replica", pa.string()), ("dp_rank", pa.int64()),
    ("scraped_ns", pa.int64()), ("scrape_ms", pa.float64()), ("ok", pa.bool_()),
    ("error", pa.string()), ("running", pa.float64()), ("waiting", pa.float64()),
    ("kv_usage", pa.float64()), ("prefix_cache_queries", pa.float64()),
    ("prefix_cache_hits", pa.float64()), ("cache_hit_rate", pa.float64()),
    ("model_name", pa.string()),
])
"""Arrow schema of the tables handed to the sink (same columns and types as the DDL)."""

_FIELDS: Final = tuple(k for k in METRIC_ALIASES)
# metric sample name -> (field, priority: lower wins = earlier alias)
_BY_NAME: Final[dict[str, tuple[str, int]]] = {
    name: (fld, i) for fld, names in METRIC_ALIASES.items() for i, name in enumerate(names)
}
# Several samples of one field in one engine (e.g. per model): counts add up, fractions do not.
_SUMMED: Final = frozenset({"running", "waiting", "prefix_cache_queries", "prefix_cache_hits"})


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
               scrape_ms=scrape_ms, ok=True)
    return row


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
    text: str, target: str, scraped_ns: int, scrape_ms: float | None = None
) -> list[dict[str, Any]]:
    """One row per DP rank found in ``text`` (or one row with dp_rank null when unranked).

    Values without a rank label fill the fields the ranked rows lack. Unknown metrics are
    ignored; text that does not parse gives one failed row.
    """
    # rank -> field -> (priority, value); rank -> model name
    groups: dict[int | None, dict[str, tuple[int, float]]] = {}
    models: dict[int | None, str] = {}
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                hit = _BY_NAME.get(sample.name)
                if hit is None:
                    continue
                fld, prio = hit
                rank = _rank(sample.labels)
                fields = groups.setdefault(rank, {})
                if rank not in models and sample.labels.get("model_name"):
                    models[rank] = sample.labels["model_name"]
                value = float(sample.value)
                old = fields.get(fld)
                if old is None or prio < old[0]:
                    fields[fld] = (prio, value)
                elif prio == old[0]:
                    fields[fld] = (prio, old[1] + value if fld in _SUMMED else max(old[1], value))
    except Exception as exc:  # prometheus_client raises ValueError and friends on bad text
        return [failed_row(target, scraped_ns, f"parse error: {type(exc).__name__}: {exc}",
                           scrape_ms)]
    unranked = groups.pop(None, {})
    # the unranked group is popped: the keys left are ranks
    ranks: Sequence[int | None] = sorted(r for r in groups if r is not None) if groups else [None]
    rows = []
    for rank in ranks:
        fields = dict(unranked)
        fields.update(groups.get(rank, {}) if rank is not None else {})
        row = _row(target, scraped_ns, scrape_ms)
        row["dp_rank"] = rank
        row["model_name"] = models.get(rank) or models.get(None)
        for fld, (_, value) in fields.items():
            row[fld] = value
        rows.append(row)
    return rows


def to_table(rows: list[dict[str, Any]]) -> pa.Table:
    """Rows as an Arrow table with :data:`SCHEMA`."""
    return pa.Table.from_pylist(rows, schema=SCHEMA)
