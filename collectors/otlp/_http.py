"""OTLP/HTTP transport (Starlette on uvicorn, in a thread), plus the collector's own endpoints.

Routes:

* ``POST /v1/traces`` and ``POST /`` (vLLM posts to the endpoint URL as given): OTLP/HTTP,
  ``application/x-protobuf`` or ``application/json``, optionally ``Content-Encoding: gzip`` or
  ``deflate``. The answer is an ``ExportTraceServiceResponse`` in the request's encoding, sent
  only after the spans were committed; refusals carry a ``google.rpc.Status`` body in the
  request's encoding (OTLP spec, "Failures"), JSON for unknown content types.
* ``GET /health``: JSON status and counters; the only route open without a token.
* ``GET /metrics``: Prometheus text of the collector's own registry.
* ``POST /routeaudit/query``: ``{"sql": ..., "params": [...], "variables": {...}}`` (session
  variables such as the SLO targets) → Arrow IPC stream, or 400
  ``{"error": "<one line>"}``. Runs ``Store.query_arrow`` (read-only guard inside).

What a web page must not do to this port, and why it cannot:

* Cross-site (a page on another origin, the user's browser as the attacker's client): the query
  route takes only ``Content-Type: application/json`` with an ``X-Routeaudit-Query: 1`` header.
  Neither can be sent by a form or by a "simple" ``fetch``; any other ``fetch`` is preflighted,
  and the preflight (``OPTIONS``) is answered only for ``allowed_origins``. A request carrying an
  ``Origin`` that is not allowed is refused (403) before anything runs, so even a browser that
  sent it anyway gets nothing done. OTLP routes take only protobuf or JSON content types
  (preflighted), and no route answers with CORS headers but the query route for allowed origins,
  so cross-site pages cannot read ``/health`` or ``/metrics``.
* DNS rebinding (the attacker's name re-pointed at this address, so the page is same-origin):
  the ``Host`` header then carries the attacker's name. :class:`HostCheck` accepts only the bound
  address (any loopback spelling when bound on loopback; any IP literal when bound on a
  wildcard) and ``allowed_hosts``. It guards the query route, ``/health`` and ``/metrics``
  always, and the OTLP routes when no token is set (with a token, the page cannot authenticate,
  while senders legitimately use any name, port forwards and load balancers included). Only the
  name is compared, not the port: rebinding works by name, and ``kubectl port-forward`` or an SSH
  tunnel reaches the port under another number. OTLP/gRPC needs HTTP/2 with trailers, which a
  page cannot speak.
"""

from __future__ import annotations

import asyncio
import functools
import hmac
import ipaddress
import json
import logging
import math
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

import h11
import pyarrow as pa
import uvicorn
from google.protobuf import json_format
from google.protobuf.message import Message
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from uvicorn.protocols.http.h11_impl import H11Protocol

from audit import AuditError, QueryCancel, Store
from collectors.otlp._decode import json_to_protobuf
from collectors.otlp._errors import (
    BadRequest,
    BodyTimeout,
    BodyTooLarge,
    ExportRefused,
    Forbidden,
    Overloaded,
    StartError,
    Unauthenticated,
    UnsupportedMediaType,
    WriterUnavailable,
)
from collectors.otlp._export import Exporter, decode_protobuf_request
from collectors.otlp._limits import GZIP_WBITS, ZLIB_WBITS, ByteBudget, Hold, drop_frames, inflate
from collectors.otlp._metrics import Metrics
from collectors.otlp._status import http_answer, is_refusal, one_line, status_message
from collectors.otlp.config import DEFAULT_MAX_QUERY_BYTES, CollectorConfig

log = logging.getLogger("routeaudit.collector")

PROTOBUF_TYPES = ("application/x-protobuf", "application/protobuf")
JSON_TYPES = ("application/json",)
ARROW_STREAM = "application/vnd.apache.arrow.stream"
QUERY_DISCONNECT_POLL_S = 0.25
"""How often a running query checks whether its client is still there."""
QUERY_HEADER = "x-routeaudit-query"
"""Header (value ``1``) every query must carry: a browser cannot add it without a preflight."""


class HttpReceiver:
    """The Starlette application; decoding runs in the thread pool, never on the event loop."""

    def __init__(self, exporter: Exporter, store: Store, metrics: Metrics, config: CollectorConfig,
                 health: Callable[[], dict[str, Any]], budget: ByteBudget) -> None:
        self._exporter = exporter
        self._store = store
        self._metrics = metrics
        self._config = config
        self._health = health
        self._budget = budget
        self._token = config.token.encode() if config.token else None
        self._hosts = HostCheck(config.http_host, config.allowed_hosts)
        self._origins = frozenset(_origin_key(o) for o in config.allowed_origins)
        self.app = Starlette(routes=[
            Route("/v1/traces", self.traces, methods=["POST"]),
            Route("/", self.traces, methods=["POST"]),
            Route("/health", self.health, methods=["GET"]),
            Route("/metrics", self.metrics, methods=["GET"]),
            Route("/routeaudit/query", self.query, methods=["POST"]),
            Route("/routeaudit/query", self.query_preflight, methods=["OPTIONS"]),
        ])

    # -- OTLP ---------------------------------------------------------------------------------
    async def traces(self, request: Request) -> Response:
        encoding = "json"
        body_read = False
        try:
            if self._token is None:
                self._check_host(request)
            self._check_auth(request)
            ctype = _media_type(request.headers.get("content-type", ""))
            if ctype in PROTOBUF_TYPES:
                encoding = "protobuf"
            elif ctype not in JSON_TYPES:
                raise UnsupportedMediaType(
                    f"unsupported content type {ctype or '(none)'!r}; send application/x-protobuf "
                    "or application/json")
            cenc = request.headers.get("content-encoding", "").strip().lower()
            if cenc not in ("", "identity", "gzip", "x-gzip", "deflate"):
                raise UnsupportedMediaType(f"unsupported content encoding {cenc!r}; send gzip or none")
            with self._budget.hold() as hold:
                body = await _read_body(request, self._config.max_body_bytes,
                                        self._config.body_timeout_s, hold)
                body_read = True
                batch = await run_in_threadpool(self._decode, body, encoding, cenc, hold)
                del body
            result = await self._exporter.export_async(batch)
        except Exception as exc:  # noqa: BLE001 - every failure gets an answer
            answer = self._refuse(exc, encoding)
            if not body_read:
                # The body is left unread, so the connection cannot carry another request: say
                # so, or the client reuses it and its next export meets a closed socket.
                answer.headers["connection"] = "close"
            return answer
        self._metrics.request("http", 200)
        return _encode(result.response(), encoding, 200)

    def _decode(self, body: bytes, encoding: str, cenc: str, hold: Hold) -> Any:
        if cenc in ("gzip", "x-gzip"):
            body = inflate(body, GZIP_WBITS, self._config.max_decompressed_bytes, hold)
        elif cenc == "deflate":
            body = inflate(body, ZLIB_WBITS, self._config.max_decompressed_bytes, hold)
        # The decoder's own working memory (parsed messages, Arrow buffers) is of the body's order.
        hold.take(len(body))
        if encoding == "protobuf":  # straight from the bytes
            return decode_protobuf_request(body, self._metrics, keep_prompts=self._config.keep_prompts,
                                           drop_attributes=self._config.drop_attributes)
        # OTLP/JSON is re-encoded to protobuf bytes: one decoder for both
        return decode_protobuf_request(json_to_protobuf(body), self._metrics,
                                       keep_prompts=self._config.keep_prompts,
                                       drop_attributes=self._config.drop_attributes)

    def _refuse(self, exc: BaseException, encoding: str) -> Response:
        if isinstance(exc, Overloaded):
            self._metrics.inc("overload_refusals")
        if isinstance(exc, ClientDisconnect):
            exc = BadRequest("client disconnected before the body was read")
        if not is_refusal(exc):
            log.exception("unexpected error answering an OTLP/HTTP export", exc_info=exc)
            self._metrics.inc("internal_errors")
        answer = http_answer(exc, self._config.retry_after_s)
        drop_frames(exc)
        self._metrics.request("http", answer.status)
        return _encode(status_message(answer), encoding, answer.status, answer.headers)

    # -- the collector's own endpoints -------------------------------------------------------------
    async def health(self, request: Request) -> Response:
        try:
            self._check_host(request)
        except Forbidden as exc:
            return self._error_json(exc, "health")
        report = self._health()
        # 503 while starting or stopping, so a load balancer or a waiting script sees "not ready".
        return JSONResponse(report, 200 if report["status"] in ("ok", "degraded") else 503)

    async def metrics(self, request: Request) -> Response:
        try:
            self._check_host(request)
            self._check_auth(request)
        except (Forbidden, Unauthenticated) as exc:
            return self._error_json(exc, "metrics")
        return Response(self._metrics.exposition(), media_type=CONTENT_TYPE_LATEST)

    async def query_preflight(self, request: Request) -> Response:
        """CORS preflight: answered (204) only for an allowed origin on an allowed host."""
        try:
            self._check_host(request)
            origin = self._check_origin(request)
            if origin is None:
                raise Forbidden("a preflight needs an Origin header")
        except Forbidden as exc:
            return self._error_json(exc)
        return Response(status_code=204, headers={
            **_cors_headers(origin),
            "access-control-allow-methods": "POST",
            "access-control-allow-headers": f"content-type, authorization, {QUERY_HEADER}",
            "access-control-max-age": "600",
        })

    async def query(self, request: Request) -> Response:
        origin: str | None = None
        body_read = False
        try:
            self._check_host(request)
            origin = self._check_origin(request)
            self._check_auth(request)
            ctype = _media_type(request.headers.get("content-type", ""))
            if ctype not in JSON_TYPES:
                raise UnsupportedMediaType(
                    f"unsupported content type {ctype or '(none)'!r}; send application/json")
            if request.headers.get(QUERY_HEADER, "").strip() != "1":
                raise Forbidden(f"a query must carry the header {QUERY_HEADER}: 1")
            with self._budget.hold() as hold:
                body = await _read_body(request, DEFAULT_MAX_QUERY_BYTES,
                                        self._config.body_timeout_s, hold)
            body_read = True
            try:
                doc = json.loads(body)
            except (ValueError, RecursionError) as exc:
                raise BadRequest(f"body is not JSON: {one_line(exc)}") from exc
            if not isinstance(doc, dict) or not isinstance(doc.get("sql"), str):
                raise BadRequest('body must be {"sql": "...", "params": [...]}')
            params = doc.get("params")
            if params is not None and not isinstance(params, list):
                raise BadRequest('"params" must be a list')
            variables = doc.get("variables")
            if variables is not None and not (
                    isinstance(variables, dict)
                    and all(isinstance(v, (int, float, str)) and not isinstance(v, bool)
                            for v in variables.values())):
                raise BadRequest('"variables" must be an object of numbers or strings')
            table = await self._run_query(request, doc["sql"], params or None, variables or None)
            payload = await run_in_threadpool(_ipc_stream, table)
        except (AuditError, ExportRefused, ClientDisconnect) as exc:
            answer = self._error_json(exc, origin=origin)
            if not body_read:  # as for an export: the unread body ends the connection
                answer.headers["connection"] = "close"
            return answer
        except Exception as exc:  # noqa: BLE001 - DuckDB errors outside QueryError, our bugs
            log.warning("query failed: %s", one_line(exc))
            return self._error_json(BadRequest(one_line(exc)), origin=origin)
        self._metrics.request("query", 200)
        return Response(payload, media_type=ARROW_STREAM, headers=_cors_headers(origin))

    async def _run_query(self, request: Request, sql: str, params: list[Any] | None,
                         variables: dict[str, Any] | None) -> pa.Table:
        """Run the query on a worker thread; stop it when the client goes away (a browser tab
        closed, a script interrupted), so it does not run on for nobody."""
        cancel = QueryCancel()
        work = asyncio.ensure_future(run_in_threadpool(
            functools.partial(self._store.query_arrow, sql, params, variables, cancel=cancel)))
        while not work.done():
            done, _ = await asyncio.wait({work}, timeout=QUERY_DISCONNECT_POLL_S)
            if not done and await request.is_disconnected():
                cancel.cancel("the client went away")
                self._metrics.inc("queries_cancelled")
                break
        return await work

    def _error_json(self, exc: BaseException, route: str = "query", origin: str | None = None) -> Response:
        if isinstance(exc, (AuditError, ClientDisconnect)):
            exc = BadRequest(one_line(exc))
        if isinstance(exc, Overloaded):
            self._metrics.inc("overload_refusals")
        answer = http_answer(exc, self._config.retry_after_s)
        drop_frames(exc)
        self._metrics.request(route, answer.status)
        return JSONResponse({"error": answer.message}, answer.status,
                            headers={**answer.headers, **_cors_headers(origin)})

    def _check_host(self, request: Request) -> None:
        host = request.headers.get("host")
        if not self._hosts.allows(host):
            raise Forbidden(f"Host {host!r} is not this collector's address nor an allowed name "
                            "(--allow-host)")

    def _check_origin(self, request: Request) -> str | None:
        """The request's Origin when it is allowed, None when it has none; else Forbidden."""
        origin = request.headers.get("origin")
        if origin is None:
            return None
        if _origin_key(origin) not in self._origins:
            raise Forbidden(f"Origin {origin[:200]!r} is not allowed (--allow-origin)")
        return origin

    def _check_auth(self, request: Request) -> None:
        if self._token is None:
            return
        scheme, _, cred = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(cred.strip().encode(), self._token):
            raise Unauthenticated("missing or wrong bearer token")


class HostCheck:
    """Which ``Host`` header names reach this server legitimately (DNS-rebinding defence).

    Accepted: the bound name or address; when it is a loopback one, every loopback spelling
    (``127.0.0.1``, ``localhost``, ``[::1]``, ...); when it is a wildcard (``0.0.0.0``, ``::``),
    any IP literal (a rebinding page always sends a name) and ``localhost``; every name of
    ``allowed`` (``"*"``: anything). Names compare case-insensitively without a trailing dot; the
    port is not compared (see the module docstring).
    """

    def __init__(self, bind_host: str, allowed: tuple[str, ...] = ()) -> None:
        bind = _host_name(bind_host)
        self._any = "*" in allowed
        self._names = {bind} | {_host_name(a) for a in allowed}
        self._wildcard = bind in ("0.0.0.0", "::", "")
        if self._wildcard or _is_loopback_name(bind):
            self._names |= {"localhost", "127.0.0.1", "::1"}
        self._loopback = _is_loopback_name(bind)

    def allows(self, header: str | None) -> bool:
        if self._any:
            return True
        if not header:
            return False
        name = _host_name(_strip_port(header.strip()))
        if name in self._names:
            return True
        try:
            ip = ipaddress.ip_address(name)
        except ValueError:
            return False
        return self._wildcard or (self._loopback and ip.is_loopback)


def _strip_port(host: str) -> str:
    if host.startswith("["):
        return host[1:host.find("]")] if "]" in host else host
    if host.count(":") == 1:
        return host.split(":", 1)[0]
    return host


def _host_name(host: str) -> str:
    return host.strip().strip("[]").rstrip(".").lower()


def _is_loopback_name(name: str) -> bool:
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def _origin_key(origin: str) -> str:
    return origin.strip().rstrip("/").lower()


def _cors_headers(origin: str | None) -> dict[str, str]:
    if origin is None:
        return {}
    return {"access-control-allow-origin": origin, "vary": "Origin"}


async def _read_body(request: Request, limit: int, timeout_s: float, hold: Hold) -> bytes:
    """The whole body, at most ``limit`` bytes, arriving within ``timeout_s`` (else BodyTimeout),
    its bytes taken from ``hold`` as they arrive."""
    try:
        async with asyncio.timeout(timeout_s):
            return await _read_body_unbounded(request, limit, hold)
    except TimeoutError as exc:
        raise BodyTimeout(f"request body did not arrive within {timeout_s:g} s") from exc
    except asyncio.CancelledError as exc:
        # uvicorn cancels what is still reading once the stop's grace is over: answered (if the
        # client still listens) as retryable, instead of a traceback in the log.
        raise WriterUnavailable("the collector is stopping; retry later") from exc


async def _read_body_unbounded(request: Request, limit: int, hold: Hold) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None:
        try:
            if int(declared) > limit:
                raise BodyTooLarge(f"body of {int(declared)} bytes is over the limit of {limit}")
        except ValueError as exc:
            raise BadRequest("bad Content-Length header") from exc
    parts: list[bytes] = []
    size = 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise BodyTooLarge(f"body is over the limit of {limit} bytes")
            hold.take(len(chunk))
            parts.append(chunk)
        if len(parts) == 1:
            return parts[0]
        hold.take(size)  # the joined copy while the parts are alive
        body = b"".join(parts)
        hold.give(size)
        return body
    finally:
        parts.clear()


def _media_type(header: str) -> str:
    return header.split(";", 1)[0].strip().lower()


def _encode(msg: Message, encoding: str, status: int, headers: dict[str, str] | None = None) -> Response:
    if encoding == "protobuf":
        return Response(msg.SerializeToString(), status, headers=headers,
                        media_type="application/x-protobuf")
    body = json_format.MessageToJson(msg, indent=None)
    return Response(body, status, headers=headers, media_type="application/json")


def _ipc_stream(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return bytes(sink.getvalue().to_pybytes())


def bind_socket(host: str, port: int) -> socket.socket:
    """Bind and listen now, so "port in use" is a clear :class:`StartError` at start()."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise StartError(f"cannot resolve HTTP bind host {host!r}: {exc}") from exc
    family, stype, proto, _, addr = infos[0]
    sock = socket.socket(family, stype, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(addr)
        sock.listen(1024)
    except OSError as exc:
        sock.close()
        raise StartError(f"cannot listen for OTLP/HTTP on {host}:{port}: {exc.strerror or exc}") from exc
    sock.set_inheritable(False)
    return sock


class ConnectionPolicy:
    """Connection limits of one HTTP server, shared by its connections (event-loop thread only,
    except the counters, which are read from anywhere)."""

    def __init__(self, *, max_connections: int, header_timeout_s: float, idle_timeout_s: float,
                 retry_after_s: int, metrics: Metrics) -> None:
        self.max_connections = max_connections
        self.header_timeout_s = header_timeout_s
        self.idle_timeout_s = idle_timeout_s
        self.metrics = metrics
        body = b'{"error": "too many open connections; retry later"}'
        self.refusal = (
            b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n"
            b"retry-after: " + str(retry_after_s).encode() + b"\r\nconnection: close\r\n"
            b"content-length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        self.open = 0


_LINGER_S = 1.0
"""A refused connection stays open this long after its 503, so the client reads the answer
instead of a reset caused by its own unread request."""


def guarded_protocol(policy: ConnectionPolicy) -> type[H11Protocol]:
    """uvicorn's h11 protocol plus what it lacks: a connection limit and a header timeout.

    uvicorn accepts every connection and times out only idle keep-alive ones, after a response;
    a client that connects and sends its headers slowly (or not at all) holds its socket forever.
    Here a connection beyond ``max_connections`` is answered 503 + ``Retry-After`` and closed;
    a request whose headers are not complete ``header_timeout_s`` after its first byte (or after
    the connection opened) has its connection closed; a response sent while the client is still
    sending the body (a route that does not read it) closes the connection.
    """

    class GuardedH11Protocol(H11Protocol):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.timeout_keep_alive = policy.idle_timeout_s  # type: ignore[assignment]
            self._header_timer: asyncio.TimerHandle | None = None
            self._refused = False
            self._counted = False

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            if policy.open >= policy.max_connections:
                self.connections.discard(self)
                self._refused = True
                policy.metrics.inc("connections_refused")
                log.warning("HTTP connection limit (%d) reached: refusing new connections",
                            policy.max_connections)
                transport.write(policy.refusal)
                if transport.can_write_eof():
                    transport.write_eof()
                self.loop.call_later(_LINGER_S, transport.close)
                return
            policy.open += 1
            self._counted = True
            self._arm_header_timer()

        def connection_lost(self, exc: Exception | None) -> None:
            self._cancel_header_timer()
            if self._counted:
                policy.open -= 1
                self._counted = False
            if self._refused:
                return
            super().connection_lost(exc)

        def data_received(self, data: bytes) -> None:
            if self._refused:
                return
            super().data_received(data)
            if self.transport.is_closing():
                return
            # IDLE after data: a request has begun but its headers are incomplete.
            if self.conn.their_state is h11.IDLE:
                self._arm_header_timer()
            else:
                self._cancel_header_timer()

        def on_response_complete(self) -> None:
            self._cancel_header_timer()
            if self.conn.their_state is h11.SEND_BODY and not self.transport.is_closing():
                self.transport.close()
                return
            super().on_response_complete()

        def _arm_header_timer(self) -> None:
            if self._header_timer is None:
                self._header_timer = self.loop.call_later(policy.header_timeout_s,
                                                          self._header_timeout)

        def _cancel_header_timer(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def _header_timeout(self) -> None:
            self._header_timer = None
            if self.transport.is_closing() or self.conn.their_state is not h11.IDLE:
                return
            if self.cycle is not None and not self.cycle.response_complete:
                return
            policy.metrics.inc("header_timeouts")
            log.warning("closed an HTTP connection whose request headers did not arrive within "
                        "%g s", policy.header_timeout_s)
            self.transport.close()

    return GuardedH11Protocol


class HttpServer:
    """uvicorn serving an app on an already bound socket, in its own thread, with
    :func:`guarded_protocol`'s limits."""

    def __init__(self, app: Any, sock: socket.socket, graceful_s: float,
                 policy: ConnectionPolicy) -> None:
        self._sock = sock
        self.port: int = sock.getsockname()[1]
        self.policy = policy
        config = uvicorn.Config(app, lifespan="off", log_config=None, log_level="warning", access_log=False,
                                server_header=False, ws="none", loop="asyncio",
                                http=guarded_protocol(policy),
                                timeout_graceful_shutdown=max(1, math.ceil(graceful_s)),
                                timeout_keep_alive=max(1, math.ceil(policy.idle_timeout_s)))
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._run, name="routeaudit-http", daemon=True)
        self._error: BaseException | None = None

    def _run(self) -> None:
        try:
            self._server.run(sockets=[self._sock])
        except BaseException as exc:  # noqa: BLE001 - reported by start()
            self._error = exc

    def start(self, timeout: float = 10.0) -> None:
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self._sock.close()
                raise StartError(f"HTTP server failed to start: {one_line(self._error or 'timeout')}")
            time.sleep(0.01)

    def stop(self, timeout: float = 15.0) -> None:
        """Stop accepting, let in-flight requests finish (bounded), close. Safe to call twice."""
        self._server.should_exit = True
        if self._thread.is_alive():
            self._thread.join(timeout)
        try:
            self._sock.close()
        except OSError:
            pass
