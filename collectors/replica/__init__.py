"""Replica instrumentation: vLLM-format ``llm_request`` spans from Python-served replicas.

``ReplicaMiddleware(app, replica_id=..., tracer_provider=None, paths=DEFAULT_PATHS,
dp_rank=None)`` wraps any ASGI app; the app reports engine facts by filling
``engine_facts(request)`` (the dict at ``scope["state"]["routeaudit"]``, see ``ReplicaFacts``).
``record_execution(...)`` emits the same span after the fact with explicit timestamps.
"""

from ._emit import ReplicaFacts, record_execution, vllm_request_id
from ._middleware import ReplicaMiddleware, engine_facts

__all__ = [
    "ReplicaFacts",
    "ReplicaMiddleware",
    "engine_facts",
    "record_execution",
    "vllm_request_id",
]
