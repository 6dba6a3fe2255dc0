"""The router launchers' exception: a third-party router that did not start."""

from __future__ import annotations


class RouterStartError(RuntimeError):
    """The router exited or never became ready; the message ends with the tail of its log."""
