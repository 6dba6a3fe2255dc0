"""Each package's public surface is its ``__all__``: nothing public that is not listed, nothing
listed that is missing."""

from __future__ import annotations

import importlib
import types

import pytest

PACKAGES = [
    "collectors.otlp", "collectors.router", "collectors.client", "collectors.replica",
    "collectors.scrape", "testbed", "testbed.live",
]


@pytest.mark.parametrize("name", PACKAGES)
def test_all_matches_public_names(name: str) -> None:
    module = importlib.import_module(name)
    exported = set(module.__all__)
    public = {
        attr for attr, value in vars(module).items()
        if not attr.startswith("_") and not isinstance(value, types.ModuleType)
        and attr not in ("annotations", "TYPE_CHECKING")
    }
    assert exported == public
    for attr in exported:
        assert getattr(module, attr) is not None
