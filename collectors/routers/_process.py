"""Third-party routers as child processes: start on free loopback ports, wait until ready, stop.

``start_smg(...)`` runs ``smg launch``; ``start_vllm_router(...)`` runs this package's tracing
launcher (``python -m collectors.routers.vllm_router``). Both return a :class:`RouterProcess`
that is ready (SMG: ``/readiness``, i.e. its workers are registered and healthy; vllm-router:
``/health``, served only once its workers are healthy) and that stops cleanly: SIGTERM to the
process it started, then SIGKILL to that process's own group after a grace period. It is a
context manager, and every process still running when the interpreter exits is stopped
(``atexit``), so a failing test cannot leak a router.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib.util
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import IO, Final, Self
from urllib.error import HTTPError, URLError
from urllib.request import urlopen

from ._errors import RouterStartError

DEFAULT_READY_TIMEOUT_S: Final = 60.0
"""Longest wait for ``/health`` = 200 (SMG and vllm-router are ready in about 1-2 s on loopback
once the workers answer ``/health``)."""
STOP_GRACE_S: Final = 10.0
"""SIGTERM → SIGKILL delay. Both routers shut down gracefully in well under a second when idle."""

_LIVE: set[RouterProcess] = set()
_LIVE_LOCK = threading.Lock()
_REPO_ROOT = Path(__file__).resolve().parents[2]


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on ``host`` that nothing listens on right now (a child process binds it
    later, so another process could in principle take it first)."""
    return free_ports(1, host)[0]


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """``count`` distinct such ports. Two calls of :func:`free_port` in a row may give the same
    port, since the kernel can hand out a port again once its socket is closed (a router then
    refused ``--port`` and ``--prometheus-port`` both 42077): these are held open together."""
    fam = socket.AF_INET6 if ":" in host else socket.AF_INET
    with contextlib.ExitStack() as stack:
        socks = [stack.enter_context(socket.socket(fam, socket.SOCK_STREAM)) for _ in range(count)]
        for s in socks:
            s.bind((host, 0))
        return [int(s.getsockname()[1]) for s in socks]


def _ports(host: str, port: int, prometheus_port: int | None) -> tuple[int, int | None]:
    """The router's port and its metrics port: 0 picks a free one, distinct from the other."""
    fresh = iter([p for p in free_ports(3, host) if p != port])  # never the port asked for
    return (port or next(fresh), next(fresh) if prometheus_port == 0 else prometheus_port)


def smg_available() -> str | None:
    """None when ``smg`` can be started, else why not (for ``pytest.skip``)."""
    if importlib.util.find_spec("smg") is None:
        return "the smg package is not installed (pip install smg)"
    if _smg_command() is None:
        return "no smg executable found"
    return None


def vllm_router_available() -> str | None:
    """None when the vllm-router Rust core can be built from Python, else why not."""
    for mod in ("vllm_router_rs", "vllm_router"):
        if importlib.util.find_spec(mod) is None:
            return f"{mod} is not importable (pip install vllm-router)"
    return None


def _smg_command() -> list[str] | None:
    exe = Path(sys.executable).parent / "smg"
    if exe.is_file():
        return [str(exe)]
    found = shutil.which("smg")
    if found:
        return [found]
    if importlib.util.find_spec("smg") is not None:
        return [sys.executable, "-m", "smg"]
    return None


def _host_for_url(host: str) -> str:
    if host in ("0.0.0.0", ""):
        return "127.0.0.1"
    if host == "::":
        return "[::1]"
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


class RouterProcess:
    """One router child process. ``url`` is its base URL; ``metrics_url`` its Prometheus
    endpoint (None when not exposed); ``log_path`` holds its stdout and stderr."""

    def __init__(self, name: str, cmd: Sequence[str], *, host: str, port: int,
                 metrics_port: int | None, log_path: Path | None = None,
                 env: dict[str, str] | None = None,
                 ready_paths: Sequence[str] = ("/health",)) -> None:
        self.name = name
        self.cmd = list(cmd)
        self.host = host
        self.port = port
        self.metrics_port = metrics_port
        if log_path is None:
            fd, tmp = tempfile.mkstemp(prefix=f"routeaudit-{name}-", suffix=".log")
            os.close(fd)
            log_path = Path(tmp)
        self.log_path = Path(log_path)
        self._env = env
        self.ready_paths = tuple(ready_paths)
        """Polled in order until one answers 200; a 404 moves on to the next path (an older
        version without that route)."""
        self._log: IO[bytes] | None = None
        self.proc: subprocess.Popen[bytes] | None = None
        self.started_s: float | None = None
        self.ready_s: float | None = None
        """Seconds from spawn to the first ``/health`` = 200."""

    @property
    def url(self) -> str:
        return f"http://{_host_for_url(self.host)}:{self.port}"

    @property
    def metrics_url(self) -> str | None:
        if self.metrics_port is None:
            return None
        return f"http://{_host_for_url(self.host)}:{self.metrics_port}/metrics"

    @property
    def pid(self) -> int | None:
        return None if self.proc is None else self.proc.pid

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_tail(self, n_bytes: int = 4000) -> str:
        try:
            data = self.log_path.read_bytes()
        except OSError:
            return ""
        return data[-n_bytes:].decode("utf-8", "replace")

    # -- lifecycle ------------------------------------------------------------------------------
    def start(self, ready_timeout_s: float = DEFAULT_READY_TIMEOUT_S) -> Self:
        """Spawn, then wait until a ready path (``/health`` by default) answers 200. Raises
        :class:`RouterStartError`
        (and stops the process) when it exits or is not ready in time."""
        if self.proc is not None:
            raise RuntimeError(f"{self.name} already started")
        self._log = open(self.log_path, "wb")  # noqa: SIM115 - closed in stop()
        env = dict(os.environ if self._env is None else self._env)
        self.started_s = time.monotonic()
        # own session: a Ctrl-C meant for the test run does not reach the router first, and
        # stop() can kill exactly the group this process leads
        self.proc = subprocess.Popen(self.cmd, stdout=self._log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, env=env, start_new_session=True)
        with _LIVE_LOCK:
            _LIVE.add(self)
        try:
            self._wait_ready(ready_timeout_s)
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        paths = list(self.ready_paths)
        while True:
            health = self.url + paths[0]
            if not self.alive:
                code = None if self.proc is None else self.proc.returncode
                raise RouterStartError(f"{self.name} exited with code {code} before it was ready; "
                                       f"log {self.log_path}:\n{self.log_tail()}")
            try:
                with urlopen(health, timeout=1.0) as resp:  # noqa: S310 - loopback http
                    if resp.status == 200:
                        self.ready_s = time.monotonic() - (self.started_s or 0.0)
                        return
            except HTTPError as exc:
                if exc.code == 404 and len(paths) > 1:
                    paths.pop(0)
                    continue
            except (URLError, OSError, ValueError):
                pass
            if time.monotonic() > deadline:
                raise RouterStartError(f"{self.name} not ready on {health} after "
                                       f"{timeout_s:.0f} s; log {self.log_path}:\n"
                                       f"{self.log_tail()}")
            time.sleep(0.1)

    def stop(self, grace_s: float = STOP_GRACE_S) -> int | None:
        """SIGTERM, wait up to ``grace_s``, then SIGKILL the process group it leads.
        Idempotent; returns the exit code."""
        proc = self.proc
        if proc is not None and proc.poll() is None:
            try:
                proc.send_signal(signal.SIGTERM)
                proc.wait(grace_s)
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)  # the group this child leads
                except (ProcessLookupError, PermissionError):
                    proc.kill()
                proc.wait(5)
            except ProcessLookupError:
                pass
        if self._log is not None:
            self._log.close()
            self._log = None
        with _LIVE_LOCK:
            _LIVE.discard(self)
        return None if proc is None else proc.returncode

    def __enter__(self) -> Self:
        return self if self.proc is not None else self.start()

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"RouterProcess({self.name!r}, url={self.url!r}, pid={self.pid})"


@atexit.register
def _stop_all() -> None:
    with _LIVE_LOCK:
        live = list(_LIVE)
    for p in live:
        p.stop(grace_s=3.0)


def _otlp_host_port(endpoint: str) -> str:
    """Both routers take the OTLP/gRPC endpoint as ``host:port``; accept a URL too."""
    ep = endpoint.strip()
    for scheme in ("http://", "https://", "grpc://"):
        if ep.startswith(scheme):
            ep = ep[len(scheme):]
    return ep.rstrip("/")


def start_smg(
    worker_urls: Sequence[str], *, policy: str = "round_robin", host: str = "127.0.0.1",
    port: int = 0, otlp_traces_endpoint: str | None = None, prometheus_port: int | None = 0,
    request_id_headers: Sequence[str] | None = None, extra_args: Sequence[str] = (),
    log_path: str | os.PathLike[str] | None = None,
    ready_timeout_s: float = DEFAULT_READY_TIMEOUT_S,
) -> RouterProcess:
    """Start ``smg launch`` in front of ``worker_urls`` and wait until it is ready.

    ``otlp_traces_endpoint`` (OTLP/**gRPC**, ``host:port``; a URL's scheme is dropped) turns on
    ``--enable-trace``. ``port``/``prometheus_port`` 0 pick free ports; ``prometheus_port=None``
    leaves SMG's default (29000). ``request_id_headers`` None keeps SMG's defaults (which include
    ``x-request-id``).
    """
    why = smg_available()
    if why:
        raise RouterStartError(why)
    port, mport = _ports(host, port, prometheus_port)
    cmd = [*(_smg_command() or []), "launch", "--host", host, "--port", str(port),
           "--worker-urls", *worker_urls, "--policy", policy]
    if mport is not None:
        cmd += ["--prometheus-host", host, "--prometheus-port", str(mport)]
    if otlp_traces_endpoint:
        cmd += ["--enable-trace", "--otlp-traces-endpoint", _otlp_host_port(otlp_traces_endpoint)]
    if request_id_headers:
        cmd += ["--request-id-headers", *request_id_headers]
    cmd += list(extra_args)
    # SMG 1.13 answers /health before its workers are registered (a request then gets 404
    # "No worker available for model"); /readiness waits for healthy workers
    proc = RouterProcess(f"smg-{policy}", cmd, host=host, port=port, metrics_port=mport,
                         log_path=None if log_path is None else Path(log_path),
                         ready_paths=("/readiness", "/health"))
    return proc.start(ready_timeout_s)


def start_vllm_router(
    worker_urls: Sequence[str], *, policy: str = "round_robin", host: str = "127.0.0.1",
    port: int = 0, otlp_traces_endpoint: str | None = None, prometheus_port: int | None = 0,
    request_id_headers: Sequence[str] | None = None, extra_args: Sequence[str] = (),
    log_path: str | os.PathLike[str] | None = None,
    ready_timeout_s: float = DEFAULT_READY_TIMEOUT_S, python: str | None = None,
) -> RouterProcess:
    """Start vllm-router through ``python -m collectors.routers.vllm_router`` (the package's own
    CLI plus ``--otlp-traces-endpoint``) and wait until it is ready. Arguments as
    :func:`start_smg`; ``python`` is the interpreter (default: this one)."""
    why = vllm_router_available() if python is None else None
    if why:
        raise RouterStartError(why)
    port, mport = _ports(host, port, prometheus_port)
    cmd = [python or sys.executable, "-m", "collectors.routers.vllm_router", "--host", host,
           "--port", str(port), "--worker-urls", *worker_urls, "--policy", policy]
    if mport is not None:
        cmd += ["--prometheus-host", host, "--prometheus-port", str(mport)]
    if otlp_traces_endpoint:
        cmd += ["--otlp-traces-endpoint", _otlp_host_port(otlp_traces_endpoint)]
    if request_id_headers:
        cmd += ["--request-id-headers", *request_id_headers]
    cmd += list(extra_args)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(_REPO_ROOT), env.get("PYTHONPATH", "")) if p)
    return RouterProcess(f"vllm-router-{policy}", cmd, host=host, port=port, metrics_port=mport,
                         log_path=None if log_path is None else Path(log_path),
                         env=env).start(ready_timeout_s)
