"""Load the sanitizer builds of the C extensions (``make fuzz-build`` writes them to
``build/fuzz/lib``) in place of the in-place ones, before the modules that import them."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LIB = Path(os.environ.get("ROUTEAUDIT_FUZZ_LIB", ROOT / "build" / "fuzz" / "lib"))
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def load(module: str) -> None:
    """Put the sanitized build of ``module`` (dotted name) into ``sys.modules``; fail when it is
    missing, so a harness never fuzzes the uninstrumented extension by accident."""
    rel = Path(*module.split("."))
    found = sorted(LIB.joinpath(rel.parent).glob(rel.name + ".*.so"))
    if not found:
        raise SystemExit(f"no sanitizer build of {module} under {LIB} (run `make fuzz-build`)")
    spec = importlib.util.spec_from_file_location(module, found[0])
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    sys.modules[module] = mod
    parent = sys.modules.get(module.rpartition(".")[0])
    if parent is not None:
        setattr(parent, module.rpartition(".")[2], mod)
