"""Package boundaries: each package's public surface is its ``__all__`` (nothing public that is
not listed, nothing listed that is missing), and instrumentation does not load the store."""

from __future__ import annotations

import importlib
import subprocess
import sys
import types
import typing

import pytest

PACKAGES = [
    "semconv", "collectors.otlp", "collectors.router", "collectors.client", "collectors.replica",
    "collectors.scrape", "testbed", "testbed.live",
]


def _public_names(module: types.ModuleType) -> set[str]:
    """Names a user of ``module`` sees: not private, not a submodule, not an import made only
    for annotations (``from typing import Final``)."""
    return {
        attr for attr, value in vars(module).items()
        if not attr.startswith("_") and not isinstance(value, types.ModuleType)
        and attr not in ("annotations", "TYPE_CHECKING")
        and getattr(typing, attr, None) is not value
    }


@pytest.mark.parametrize("name", PACKAGES)
def test_all_matches_public_names(name: str) -> None:
    module = importlib.import_module(name)
    exported = set(module.__all__)
    assert len(exported) == len(module.__all__), "a name is listed twice"
    assert exported == _public_names(module)
    for attr in exported:
        assert getattr(module, attr) is not None


@pytest.mark.parametrize("instrumentation", [
    "collectors.router", "collectors.client", "collectors.replica", "collectors.scrape", "semconv",
])
def test_instrumentation_does_not_import_the_store(instrumentation: str) -> None:
    # A fresh interpreter: this one has imported everything already.
    code = (f"import sys, {instrumentation}\n"
            "print(sorted(m for m in ('audit', 'duckdb', 'polars') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
