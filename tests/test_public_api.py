"""Package boundaries: each package's public surface is its ``__all__`` (nothing public that is
not listed, nothing listed that is missing), its error types are public, no package reaches into
another's private modules, and instrumentation does not load the store."""

from __future__ import annotations

import ast
import importlib
import inspect
import subprocess
import sys
import types
import typing
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

PACKAGES = [
    "audit", "audit.queries", "semconv", "collectors.otlp", "collectors.router",
    "collectors.client", "collectors.replica", "collectors.routers", "collectors.scrape",
    "testbed", "testbed.live", "testbed.policies",
]

SOURCE_PACKAGES = ("audit", "collectors", "dashboards", "routeaudit", "semconv", "testbed")
"""Top-level folders whose modules :func:`test_no_package_imports_another_packages_private_names`
reads."""


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


def _errors_modules() -> list[str]:
    return sorted(".".join(p.relative_to(ROOT).with_suffix("").parts)
                  for top in SOURCE_PACKAGES for p in (ROOT / top).rglob("_errors.py"))


@pytest.mark.parametrize("errors_module", _errors_modules())
def test_every_error_type_is_public_where_it_is_defined(errors_module: str) -> None:
    """The exception tree of a package lives in its ``_errors.py``; each class there is
    exported by the package."""
    module = importlib.import_module(errors_module)
    package = importlib.import_module(errors_module.rpartition(".")[0])
    defined = {name for name, value in vars(module).items()
               if inspect.isclass(value) and issubclass(value, BaseException)
               and value.__module__ == errors_module}
    assert defined, f"{errors_module} defines no error type"
    assert defined <= set(package.__all__), sorted(defined - set(package.__all__))


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imported(tree: ast.Module, module: str, is_package: bool) -> list[tuple[int, str]]:
    """(line, dotted name) of everything ``module`` imports: ``from a.b import c`` gives
    ``a.b.c``, relative imports resolved."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = module.split(".")
                if not is_package:
                    anchor = anchor[:-1]
                anchor = anchor[:len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, *([base] if base else [])])
            found.extend((node.lineno, f"{base}.{alias.name}") for alias in node.names)
    return found


def _private_owner(dotted: str) -> str | None:
    """The package a private name belongs to: everything before the first ``_name``
    component (``audit._store.Store`` → ``audit``); None for a public name."""
    parts = dotted.split(".")
    for i, part in enumerate(parts):
        if part.startswith("_") and not (part.startswith("__") and part.endswith("__")):
            return ".".join(parts[:i])
    return None


def test_no_package_imports_another_packages_private_names() -> None:
    """A private module or name (leading underscore) is used only inside the package that holds
    it and that package's subpackages; everyone else goes through the package's ``__all__``."""
    offences: list[str] = []
    for top in SOURCE_PACKAGES:
        for path in sorted((ROOT / top).rglob("*.py")):
            module = _module_name(path)
            tree = ast.parse(path.read_text("utf-8"), str(path))
            for line, dotted in _imported(tree, module, path.name == "__init__.py"):
                owner = _private_owner(dotted)
                if owner is not None and module != owner and not module.startswith(owner + "."):
                    offences.append(f"{path.relative_to(ROOT)}:{line}: {dotted}")
    assert offences == []


def test_the_private_import_rule_sees_what_it_should() -> None:
    tree = ast.parse("from audit._store import Store\nfrom .._config import CostModel\n"
                     "from audit import _relations\nfrom . import _ui\nimport semconv\n")
    imported = [d for _, d in _imported(tree, "testbed.policies._base", is_package=False)]
    assert imported == ["audit._store.Store", "testbed._config.CostModel", "audit._relations",
                        "testbed.policies._ui", "semconv"]
    assert [_private_owner(d) for d in imported] == ["audit", "testbed", "audit",
                                                     "testbed.policies", None]


@pytest.mark.parametrize("instrumentation", [
    "collectors.router", "collectors.client", "collectors.replica", "collectors.scrape", "semconv",
])
def test_instrumentation_does_not_import_the_store(instrumentation: str) -> None:
    # A fresh interpreter: this one has imported everything already.
    code = (f"import sys, {instrumentation}\n"
            "print(sorted(m for m in ('audit', 'duckdb', 'polars') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=ROOT)
    assert out.stdout.strip() == "[]"
