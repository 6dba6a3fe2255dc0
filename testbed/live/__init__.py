"""Live mode: real HTTP replicas (the testbed's replica model in scaled real time) behind a real
reference router, traced with ``collectors`` into a real collector.

    >>> from testbed.live import Fleet, live_requests
    >>> from collectors.client import run_load
    >>> with Fleet(2, "cache_aware", otlp_endpoint="http://127.0.0.1:4318/v1/traces") as f:
    ...     results = run_load(f.router_url, live_requests("hot_prefix", 50), 8,
    ...                        run_id=f.run_id, tracer_provider=f.client_tracer_provider)

See ``docs/testbed.md`` ("Live mode").
"""

from ._load import live_requests
from ._otel import SkewedExporter, make_tracer_provider
from ._replica_app import LiveReplica
from ._router_app import LiveRouter
from ._servers import Fleet, ServerThread, serve_replicas, serve_router
from ._tokens import CHARS_PER_TOKEN, prompt_info

__all__ = [
    "CHARS_PER_TOKEN",
    "Fleet",
    "LiveReplica",
    "LiveRouter",
    "ServerThread",
    "SkewedExporter",
    "live_requests",
    "make_tracer_provider",
    "prompt_info",
    "serve_replicas",
    "serve_router",
]
