"""Service-level objectives used to call a request slow.

Precedence, as everywhere in routeaudit: explicit argument, then the ``[slo]`` table of a
``routeaudit.toml`` config file, then the ``ROUTEAUDIT_*`` environment variable, then the
``DEFAULT_*`` constant. The SQL relations read the values as DuckDB session variables
(``getvariable('routeaudit_ttft_slo_ms')``), which every read path sets before a query.
"""

from __future__ import annotations

import inspect
import os
import tomllib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from audit._errors import AuditError

DEFAULT_TTFT_SLO_MS: Final = 2000.0
"""Time to first token target, ms: a request over it is slow."""
DEFAULT_TPOT_SLO_MS: Final = 100.0
"""Mean time per output token (after the first) target, ms."""
ENV_TTFT_SLO_MS: Final = "ROUTEAUDIT_TTFT_SLO_MS"
ENV_TPOT_SLO_MS: Final = "ROUTEAUDIT_TPOT_SLO_MS"
ENV_CONFIG: Final = "ROUTEAUDIT_CONFIG"
"""Path of a ``routeaudit.toml`` config file."""


@dataclass(frozen=True)
class SLO:
    """TTFT and TPOT targets in milliseconds."""

    ttft_ms: float = DEFAULT_TTFT_SLO_MS
    tpot_ms: float = DEFAULT_TPOT_SLO_MS

    def variables(self) -> dict[str, float]:
        """The DuckDB session variables the relations read."""
        return {"routeaudit_ttft_slo_ms": float(self.ttft_ms), "routeaudit_tpot_slo_ms": float(self.tpot_ms)}


def as_slo(value: object = None) -> SLO:
    """An :class:`SLO` from None (the defaults), an SLO, a mapping with ``ttft_ms``/``tpot_ms``
    (missing or None keys keep their default), or a ``(ttft_ms, tpot_ms)`` pair."""
    if value is None:
        return SLO()
    if isinstance(value, SLO):
        return value
    if isinstance(value, Mapping):
        return SLO(
            ttft_ms=_positive(value.get("ttft_ms") or DEFAULT_TTFT_SLO_MS, "ttft_ms"),
            tpot_ms=_positive(value.get("tpot_ms") or DEFAULT_TPOT_SLO_MS, "tpot_ms"),
        )
    if hasattr(value, "ttft_ms") and hasattr(value, "tpot_ms"):
        return SLO(ttft_ms=_positive(value.ttft_ms, "ttft_ms"),
                   tpot_ms=_positive(value.tpot_ms, "tpot_ms"))
    if not isinstance(value, Iterable):
        # The message unpacking a non-iterable raises, so callers see what they saw before.
        raise TypeError(f"cannot unpack non-iterable {type(value).__name__} object")
    ttft, tpot = value
    return SLO(ttft_ms=_positive(ttft, "ttft_ms"), tpot_ms=_positive(tpot, "tpot_ms"))


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


def query_with_slo(reader: Any, sql: str, params: Sequence[Any] | None, slo: object,
                   variables: Mapping[str, float | str] | None = None) -> Any:
    """``reader.query(sql, params)``, passing the SLO (and further session ``variables``) to
    readers that accept them (``audit.Reader`` sets them as the session variables the
    attribution relations read); a reader without those parameters judges by the defaults."""
    accepts = inspect.signature(reader.query).parameters
    kwargs: dict[str, Any] = {}
    if slo is not None and "slo" in accepts:
        kwargs["slo"] = as_slo(slo)
    if variables and "variables" in accepts:
        kwargs["variables"] = dict(variables)
    return reader.query(sql, params, **kwargs)
