"""Starting and stopping live servers: uvicorn in threads of this process, on loopback ports.

Each server runs its own event loop in its own thread (uvicorn only installs signal handlers in
the main thread, so none are installed here). A port of 0 picks a free port: the socket is bound
before the server starts, so there is no window in which another process could take it.
"""

from __future__ import annotations

import logging
import signal
import socket
import sys
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from types import TracebackType
from typing import Any, Self

import uvicorn
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SpanExporter

from .._config import CostModel, ReplicaConfig, RouterConfig
from ._otel import make_tracer_provider
from ._replica_app import LiveReplica
from ._router_app import LiveRouter
from ._tokens import DEFAULT_BLOCK_TOKENS

__all__ = ["Fleet", "ServerThread", "serve_replicas", "serve_router"]

_STOP_GRACE_S = 3.0
_LOG = logging.getLogger("testbed.live")


class ServerThread:
    """One uvicorn server in a daemon thread. ``start()`` returns once it accepts connections
    (its lifespan startup has run); ``stop()`` is idempotent and waits for the thread."""

    def __init__(self, app: Any, host: str = "127.0.0.1", port: int = 0, *,
                 name: str = "server", sock: socket.socket | None = None) -> None:
        self.sock = sock or bind(host, port)
        self.host = host
        self.port: int = self.sock.getsockname()[1]
        self.name = name
        config = uvicorn.Config(app, log_level="warning", lifespan="on", access_log=False,
                                loop="asyncio", http="h11", timeout_graceful_shutdown=2,
                                timeout_keep_alive=5)
        self.server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._run, name=f"routeaudit-{name}", daemon=True)
        self._error: BaseException | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def _run(self) -> None:
        try:
            self.server.run(sockets=[self.sock])
        except BaseException as exc:  # reported by start()  # noqa: BLE001
            self._error = exc

    def start(self, timeout_s: float = 15.0) -> ServerThread:
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while not self.server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"{self.name} on {self.url} failed to start"
                                   + (f": {self._error}" if self._error else ""))
            time.sleep(0.01)
        return self

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def stop(self) -> None:
        self.server.should_exit = True
        if self._thread.is_alive():
            self._thread.join(_STOP_GRACE_S + 5)
            if self._thread.is_alive():
                self.server.force_exit = True
                self._thread.join(5)
        try:
            self.sock.close()
        except OSError:
            pass


def bind(host: str, port: int) -> socket.socket:
    """A listening-ready TCP socket bound to ``host:port`` (0: a free port)."""
    fam = socket.AF_INET6 if ":" in host else socket.AF_INET
    s = socket.socket(fam, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((host, port))
    s.set_inheritable(True)
    return s


def _offsets(n: int, given: Sequence[float] | Mapping[int, float] | None) -> list[float]:
    if given is None:
        return [0.0] * n
    if isinstance(given, Mapping):
        bad = [i for i in given if not 0 <= i < n]
        if bad:
            raise ValueError(f"clock_offsets_s names replicas out of range: {bad}")
        return [float(given.get(i, 0.0)) for i in range(n)]
    vals = [float(x) for x in given]
    if len(vals) > n:
        raise ValueError(f"{len(vals)} clock offsets for {n} replicas")
    return vals + [0.0] * (n - len(vals))


class Fleet:
    """``n_replicas`` live replicas and one reference router, each a uvicorn server in a thread
    of this process, on free loopback ports; a context manager (everything stops on exit).

    ``otlp_endpoint`` (OTLP/HTTP, the full ``.../v1/traces`` URL) or ``span_exporter`` (shared,
    e.g. ``InMemorySpanExporter``) receives every component's spans; neither: no tracing.
    ``clock_offsets_s`` (list by replica index, or ``{index: seconds}``) stamps that replica's
    spans on a clock that far ahead. ``router`` (a :class:`RouterConfig`) overrides ``policy``,
    ``telemetry_interval_s``, ``pending_correction`` and ``admission_limit``;
    ``replica_overrides`` are per-index :class:`ReplicaConfig` field changes (e.g. speed).
    """

    def __init__(
        self, n_replicas: int = 2, policy: str = "round_robin",
        otlp_endpoint: str | None = None, *, host: str = "127.0.0.1",
        time_scale: float = 0.05, telemetry_interval_s: float = 0.25,
        pending_correction: bool = True, admission_limit: int | None = None,
        replica_max_waiting: int | None = None,
        clock_offsets_s: Sequence[float] | Mapping[int, float] | None = None,
        replica: ReplicaConfig | None = None,
        replica_overrides: Mapping[int, Mapping[str, Any]] | None = None,
        cost: CostModel | None = None, router: RouterConfig | None = None,
        model: str = "sim-8b", run_id: str | None = None, seed: int = 0,
        span_exporter: SpanExporter | None = None, router_port: int = 0,
        replica_ports: Sequence[int] | None = None, block_tokens: int = DEFAULT_BLOCK_TOKENS,
    ) -> None:
        if n_replicas < 1:
            raise ValueError("n_replicas must be >= 1")
        if replica_ports is not None and len(replica_ports) != n_replicas:
            raise ValueError("replica_ports needs one port per replica")
        self.n_replicas = n_replicas
        self.host = host
        self.otlp_endpoint = otlp_endpoint
        self.span_exporter = span_exporter
        self.run_id = run_id or f"live-{uuid.uuid4().hex[:8]}"
        self.model = model
        self.time_scale = time_scale
        self.seed = seed
        self.block_tokens = block_tokens
        self.offsets = _offsets(n_replicas, clock_offsets_s)
        self.replica_cfg = replica or ReplicaConfig()
        self.replica_overrides = dict(replica_overrides or {})
        self.cost = cost or CostModel()
        self.router_cfg = router or RouterConfig(
            policy=policy, telemetry_interval_s=telemetry_interval_s,
            pending_correction=pending_correction, admission_limit=admission_limit)
        self.router_cfg.validate()
        self.replica_max_waiting = replica_max_waiting
        self.router_port = router_port
        self.replica_ports = list(replica_ports or [0] * n_replicas)
        self.replicas: list[LiveReplica] = []
        self.router: LiveRouter | None = None
        self.client_tracer_provider: TracerProvider | None = None
        """Provider for the load generator's client spans (same exporter, ``host.name`` client-0)."""
        self._servers: list[ServerThread] = []
        self._providers: list[TracerProvider] = []
        self._router_server: ServerThread | None = None
        self._started = False
        self._stopped = False

    # ------------------------------------------------------------------ addresses
    @property
    def replica_urls(self) -> list[str]:
        return [s.url for s in self._servers]

    @property
    def replica_ids(self) -> list[str]:
        """``host:port`` of each replica (candidate ids and ``routeaudit.replica.id``)."""
        return [f"{s.host}:{s.port}" for s in self._servers]

    @property
    def metrics_urls(self) -> list[str]:
        return [u + "/metrics" for u in self.replica_urls]

    @property
    def router_url(self) -> str:
        if self._router_server is None:
            raise RuntimeError("fleet not started")
        return self._router_server.url

    def _provider(self, component: str, instance: str, offset_s: float = 0.0) -> TracerProvider | None:
        tp = make_tracer_provider(component, instance, otlp_endpoint=self.otlp_endpoint,
                                  exporter=self.span_exporter, run_id=self.run_id,
                                  clock_offset_s=offset_s)
        if tp is not None:
            self._providers.append(tp)
        return tp

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> Self:
        if self._started:
            raise RuntimeError("a Fleet starts once; create a new one")
        self._started = True
        try:
            for i in range(self.n_replicas):
                sock = bind(self.host, self.replica_ports[i])
                rid = f"{self.host}:{sock.getsockname()[1]}"
                over = self.replica_overrides.get(i)
                cfg = self.replica_cfg if not over else _replace(self.replica_cfg, over)
                rep = LiveReplica(rid, replica=cfg, cost=self.cost, time_scale=self.time_scale,
                                  model=self.model, max_waiting=self.replica_max_waiting,
                                  block_tokens=self.block_tokens,
                                  tracer_provider=self._provider("replica", rid, self.offsets[i]))
                self.replicas.append(rep)
                srv = ServerThread(rep.asgi, self.host, name=f"replica-{i}", sock=sock)
                self._servers.append(srv)
                srv.start()
            self.router = LiveRouter(
                self.replica_urls, router=self.router_cfg, router_id="router-0", seed=self.seed,
                cost=self.cost, replica=self.replica_cfg, block_tokens=self.block_tokens,
                tracer_provider=self._provider("router", "router-0"))
            self._router_server = ServerThread(self.router.app, self.host, self.router_port,
                                               name="router")
            self._router_server.start()
            self.client_tracer_provider = self._provider("client", "client-0")
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Stop the router, then the replicas, then flush every provider (idempotent)."""
        if self._stopped:
            return
        self._stopped = True
        if self._router_server is not None:
            self._router_server.stop()
        for s in self._servers:
            s.stop()
        for tp in self._providers:
            try:
                tp.force_flush(10_000)
                tp.shutdown()
            except Exception:  # stopping must go on for the other providers  # noqa: BLE001
                _LOG.warning("flushing spans failed", exc_info=True)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()


def _replace(cfg: ReplicaConfig, over: Mapping[str, Any]) -> ReplicaConfig:
    import dataclasses

    new = dataclasses.replace(cfg, **dict(over))
    new.validate()
    return new


def _block(stop_event: threading.Event | None, servers: Sequence[ServerThread]) -> None:
    """Wait for SIGINT/SIGTERM (or ``stop_event``), or until a server thread dies."""
    ev = stop_event or threading.Event()
    old: dict[signal.Signals, Any] = {}
    if stop_event is None and threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            old[sig] = signal.signal(sig, lambda *_: ev.set())
    try:
        while not ev.wait(0.2):
            if not all(s.alive for s in servers):
                break
    finally:
        for sig, h in old.items():
            signal.signal(sig, h)


def serve_replicas(
    n: int, base_port: int = 8001, *, host: str = "127.0.0.1", time_scale: float = 0.05,
    model: str = "sim-8b", otlp_endpoint: str | None = None,
    clock_offsets_s: Sequence[float] | Mapping[int, float] | None = None,
    max_waiting: int | None = None, replica: ReplicaConfig | None = None,
    cost: CostModel | None = None, run_id: str | None = None,
    stop_event: threading.Event | None = None,
) -> None:
    """Serve ``n`` live replicas on ``base_port``, ``base_port + 1``, ... until SIGINT/SIGTERM
    (``routeaudit testbed replicas``). ``base_port`` 0 picks free ports. Prints one URL a line."""
    offsets = _offsets(n, clock_offsets_s)
    servers: list[ServerThread] = []
    providers: list[TracerProvider] = []
    try:
        for i in range(n):
            sock = bind(host, base_port + i if base_port else 0)
            rid = f"{host}:{sock.getsockname()[1]}"
            tp = make_tracer_provider("replica", rid, otlp_endpoint=otlp_endpoint, run_id=run_id,
                                      clock_offset_s=offsets[i])
            if tp is not None:
                providers.append(tp)
            rep = LiveReplica(rid, replica=replica, cost=cost, time_scale=time_scale, model=model,
                              max_waiting=max_waiting, tracer_provider=tp)
            srv = ServerThread(rep.asgi, host, name=f"replica-{i}", sock=sock)
            servers.append(srv)
            srv.start()
            print(srv.url, flush=True)
        _block(stop_event, servers)
    finally:
        for s in servers:
            s.stop()
        for tp in providers:
            tp.shutdown()


def serve_router(
    replica_urls: Sequence[str], port: int = 8000, policy: str = "round_robin", *,
    host: str = "127.0.0.1", telemetry_interval_s: float = 0.25, pending_correction: bool = True,
    admission_limit: int | None = None, otlp_endpoint: str | None = None,
    run_id: str | None = None, seed: int = 0, router_id: str = "router-0",
    router: RouterConfig | None = None, stop_event: threading.Event | None = None,
) -> None:
    """Serve the reference router on ``port`` until SIGINT/SIGTERM (``routeaudit testbed
    router``). Prints its URL once it has polled every replica once."""
    cfg = router or RouterConfig(policy=policy, telemetry_interval_s=telemetry_interval_s,
                                 pending_correction=pending_correction,
                                 admission_limit=admission_limit)
    tp = make_tracer_provider("router", router_id, otlp_endpoint=otlp_endpoint, run_id=run_id)
    r = LiveRouter(replica_urls, router=cfg, router_id=router_id, seed=seed, tracer_provider=tp)
    srv = ServerThread(r.app, host, port, name="router")
    try:
        srv.start()
        print(srv.url, flush=True)
        down = [rid for rid, ok in zip(r.ids, r.healthy, strict=True) if not ok]
        if down:
            print(f"warning: no telemetry yet from {', '.join(down)}", file=sys.stderr, flush=True)
        _block(stop_event, [srv])
    finally:
        srv.stop()
        if tp is not None:
            tp.shutdown()
