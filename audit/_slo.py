"""Service-level objectives: the targets a request is judged against.

The judgement itself is SQL, in one place: ``slo_targets`` (one row, the targets) and
``int_attr_requests_judged`` (one row per request: ok, good, slow, ms over the targets), which
every query that splits good from slow reads. ``slo_targets`` reads the DuckDB session
variables :meth:`SLO.variables` names and holds their defaults; this module reads those
defaults from it, so they are written once.

Precedence, as everywhere in routeaudit: explicit argument, then the ``[slo]`` table of a
``routeaudit.toml`` config file, then the ``ROUTEAUDIT_*`` environment variable, then the
``DEFAULT_*`` constant.
"""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from audit import _relations
from audit._errors import AuditError

SLO_RELATION: Final = "slo_targets"
"""The relation that holds the targets (and their defaults) the other relations judge by."""
TTFT_VARIABLE: Final = "routeaudit_ttft_slo_ms"
"""Session variable ``slo_targets`` reads the TTFT target from."""
TPOT_VARIABLE: Final = "routeaudit_tpot_slo_ms"
"""Session variable ``slo_targets`` reads the TPOT target from."""


def _sql_default(variable: str) -> float:
    """The default ``slo_targets`` gives ``variable`` when it is unset."""
    relation = [r for r in _relations.load_relations() if r.name == SLO_RELATION]
    return float(_relations.variable_defaults(relation)[variable])


DEFAULT_TTFT_SLO_MS: Final = _sql_default(TTFT_VARIABLE)
"""Time to first token target, ms: a request over it is slow."""
DEFAULT_TPOT_SLO_MS: Final = _sql_default(TPOT_VARIABLE)
"""Mean time per output token (after the first) target, ms."""
ENV_TTFT_SLO_MS: Final = "ROUTEAUDIT_TTFT_SLO_MS"
ENV_TPOT_SLO_MS: Final = "ROUTEAUDIT_TPOT_SLO_MS"
ENV_CONFIG: Final = "ROUTEAUDIT_CONFIG"
"""Path of a ``routeaudit.toml`` config file."""


@dataclass(frozen=True)
class SLO:
    """TTFT and TPOT targets in milliseconds: the one form every API takes them in."""

    ttft_ms: float = DEFAULT_TTFT_SLO_MS
    tpot_ms: float = DEFAULT_TPOT_SLO_MS

    def variables(self) -> dict[str, float]:
        """The DuckDB session variables ``slo_targets`` reads."""
        return {TTFT_VARIABLE: float(self.ttft_ms), TPOT_VARIABLE: float(self.tpot_ms)}


def load_slo(config: str | os.PathLike[str] | None = None, *, ttft_ms: float | None = None,
             tpot_ms: float | None = None) -> SLO:
    """Resolve the SLO from arguments, config file, environment and defaults."""
    from_file: dict[str, float] = {}
    path = config or os.environ.get(ENV_CONFIG)
    if path:
        try:
            doc = tomllib.loads(Path(path).read_text("utf-8"))
        except OSError as exc:
            raise AuditError(f"cannot read config {path}: {exc.strerror}") from exc
        except tomllib.TOMLDecodeError as exc:
            raise AuditError(f"config {path} is not valid TOML: {exc}") from exc
        table = doc.get("slo", {})
        for key in ("ttft_ms", "tpot_ms"):
            if key in table:
                from_file[key] = _positive(table[key], f"{path}: slo.{key}")

    def pick(arg: float | None, key: str, env: str, default: float) -> float:
        if arg is not None:
            return _positive(arg, key)
        if key in from_file:
            return from_file[key]
        if os.environ.get(env):
            return _positive(os.environ[env], env)
        return default

    return SLO(
        ttft_ms=pick(ttft_ms, "ttft_ms", ENV_TTFT_SLO_MS, DEFAULT_TTFT_SLO_MS),
        tpot_ms=pick(tpot_ms, "tpot_ms", ENV_TPOT_SLO_MS, DEFAULT_TPOT_SLO_MS),
    )


def _positive(value: object, what: str) -> float:
    try:
        f = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise AuditError(f"{what} must be a number of milliseconds, got {value!r}") from None
    if not f > 0:
        raise AuditError(f"{what} must be positive, got {value!r}")
    return f
