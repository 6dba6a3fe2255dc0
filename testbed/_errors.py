"""Exception tree of the testbed, in one module.

::

    TestbedError
    ├── ConfigError          invalid configuration (raised before a run starts)
    ├── WorkloadError        a trace file or synthetic spec is unusable
    │   (also a ValueError)  message: ``file:line: reason``
    └── UnknownNameError     unknown scenario / policy / workload name (also a KeyError)
"""

from __future__ import annotations

__all__ = ["ConfigError", "TestbedError", "UnknownNameError", "WorkloadError"]


class TestbedError(Exception):
    """Base class of every error the testbed raises on purpose."""

    __test__ = False  # not a pytest test class despite the name


class ConfigError(TestbedError, ValueError):
    """A configuration value is invalid; raised by ``validate()`` before anything runs."""


class WorkloadError(TestbedError, ValueError):
    """A workload file has a bad line, or a synthetic spec is inconsistent.

    ``path`` and ``line`` (1-based) name the offending input when known; ``str(err)`` reads
    ``path:line: reason``.
    """

    def __init__(self, reason: str, *, path: str | None = None, line: int | None = None) -> None:
        self.reason = reason
        self.path = path
        self.line = line
        where = ""
        if path is not None:
            where = f"{path}:{line}: " if line is not None else f"{path}: "
        super().__init__(f"{where}{reason}")


class UnknownNameError(TestbedError, KeyError):
    """A name looked up in a registry (scenario, policy, workload) does not exist."""

    def __str__(self) -> str:  # KeyError quotes its argument; keep the message readable
        return str(self.args[0]) if self.args else ""
