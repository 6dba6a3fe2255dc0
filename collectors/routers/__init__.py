"""Launchers for third-party routers with tracing switched on.

* ``python -m collectors.routers.vllm_router --worker-urls ... --otlp-traces-endpoint HOST:PORT``:
  vllm-router's own command line plus the tracing its CLI lacks (see ``docs/routers.md``).
* ``start_smg(worker_urls, policy=..., otlp_traces_endpoint=...)`` and
  ``start_vllm_router(...)``: child processes on free loopback ports, ready (SMG
  ``/readiness``, vllm-router ``/health``) when returned,
  stopped by ``stop()`` / the ``with`` block / at interpreter exit.

Nothing here imports the routers themselves at import time.
"""

from ._errors import RouterStartError
from ._process import (
    RouterProcess,
    free_port,
    free_ports,
    smg_available,
    start_smg,
    start_vllm_router,
    vllm_router_available,
)

__all__ = [
    "RouterProcess",
    "RouterStartError",
    "free_port",
    "free_ports",
    "smg_available",
    "start_smg",
    "start_vllm_router",
    "vllm_router_available",
]
