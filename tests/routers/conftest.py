"""A live stack for third-party router tests: a collector (OTLP/gRPC + OTLP/HTTP on free loopback
ports, scraping the replicas' /metrics) and two live testbed replicas exporting OTLP/HTTP to it.
The test puts a real router (SMG, vllm-router) in front, drives the instrumented client through
it and reads the marts. Everything is stopped in the fixture's teardown, also on failure.
``scraped_stack`` also scrapes a router's Prometheus port, reserved before the collector starts
(``Stack.router_metrics_port``), so the router started on it is sampled like the replicas."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider

import audit
from audit._slo import SLO
from collectors.client import ClientResult, run_load
from collectors.otlp import Collector, default_config
from collectors.routers import free_port
from testbed.live import LiveReplica, ServerThread, live_requests, make_tracer_provider
from testbed.live._servers import bind

N_REQUESTS = 20
MODEL = "sim-8b"


@dataclass
class Stack:
    collector: Collector
    db: Path
    run_id: str
    replica_ids: list[str]
    servers: list[ServerThread] = field(default_factory=list)
    providers: list[TracerProvider] = field(default_factory=list)
    client_tp: TracerProvider | None = None
    router_metrics_port: int | None = None

    @property
    def worker_urls(self) -> list[str]:
        return [f"http://{r}" for r in self.replica_ids]

    @property
    def grpc_endpoint(self) -> str:
        target = self.collector.grpc_target
        assert target is not None
        return target

    def reader(self, slo: SLO | None = None) -> audit.Reader:
        return audit.open(self.db, slo=slo)

    def query(self, sql: str, params: Sequence[Any] | None = None) -> list[dict[str, Any]]:
        return self.reader().query(sql, params).rows(named=True)

    def scalar(self, sql: str, params: Sequence[Any] | None = None) -> Any:
        return self.reader().query(sql, params).item()

    def flush(self) -> None:
        for tp in self.providers:
            tp.force_flush(10_000)

    def wait_for_scrapes(self, timeout_s: float = 15.0) -> None:
        """Until every replica has an ok scrape (so reconstructed candidates have telemetry)."""
        deadline = time.monotonic() + timeout_s
        while True:
            n = self.scalar("select count(distinct replica) from raw_snapshots where ok")
            if n >= len(self.replica_ids):
                return
            if time.monotonic() > deadline:
                pytest.fail(f"only {n} of {len(self.replica_ids)} replicas scraped "
                            f"in {timeout_s} s")
            time.sleep(0.1)

    def drive(self, router_url: str, id_prefix: str, *, n: int = N_REQUESTS,
              seed: int = 7) -> list[ClientResult]:
        """``n`` shared-prefix requests (hot_prefix, ~40 % streaming, ~30 % chat, every one with
        its own X-Request-Id) over about two seconds, four in flight."""
        reqs = live_requests("hot_prefix", n, seed=seed, time_scale=0.05, stream_fraction=0.4,
                             chat_fraction=0.3, max_tokens=16, model=MODEL, id_prefix=id_prefix)
        assert len(reqs) == n
        if n >= 10:
            assert any(r["stream"] for r in reqs) and not all(r["stream"] for r in reqs)
        return run_load(router_url, reqs, 4, progress=False, run_id=self.run_id,
                        tracer_provider=self.client_tp, timeout=30.0)

    def wait_for_requests(self, ids: Sequence[str], *, allowed_router_missing: int = 0,
                          timeout_s: float = 25.0, settle_s: float = 3.0) -> int:
        """Poll the ``requests`` mart until every id has its client and replica side and its
        router side (or, with ``allowed_router_missing``, until at most that many lack it and
        nothing changed for ``settle_s``). Returns how many have a router side."""
        self.flush()
        deadline = time.monotonic() + timeout_s
        last: tuple[int, int] | None = None
        since = time.monotonic()
        sql = ("select count(*) filter (where has_client and has_replica), "
               "count(*) filter (where has_router) from requests "
               "where request_id in (select unnest(?::varchar[]))")
        while True:
            row = self.reader().query(sql, [list(ids)]).row(0)
            both, routed = int(row[0]), int(row[1])
            now = time.monotonic()
            if (both, routed) != last:
                last, since = (both, routed), now
            if both >= len(ids) and routed >= len(ids):
                return routed
            if (both >= len(ids) and routed >= len(ids) - allowed_router_missing
                    and now - since >= settle_s):
                return routed
            if now > deadline:
                return routed
            time.sleep(0.25)

    def truth(self, ids: Sequence[str]) -> dict[str, str]:
        """request id → replica that served it, from the replica's own raw ``llm_request`` span
        (its resource ``routeaudit.replica.id``), independent of the marts' joins."""
        rows = self.query(
            "select a_request_id as rid, r_replica_id as replica, count(*) over "
            "(partition by a_request_id) as n from raw_spans where name = 'llm_request' "
            "and a_request_id in (select unnest(?::varchar[]))", [list(ids)])
        assert all(r["n"] == 1 for r in rows), "a request executed more than once"
        return {r["rid"]: r["replica"] for r in rows}


@contextlib.contextmanager
def _stack(tmp_path: Path, router_metrics_port: int | None = None) -> Iterator[Stack]:
    # the replicas' sockets are bound first so the collector knows its scrape targets
    socks = [bind("127.0.0.1", 0) for _ in range(2)]
    ids = [f"127.0.0.1:{s.getsockname()[1]}" for s in socks]
    targets = [f"http://{i}/metrics" for i in ids]
    if router_metrics_port is not None:
        targets.append(f"http://127.0.0.1:{router_metrics_port}/metrics")
    db = tmp_path / "audit.duckdb"
    cfg = default_config(db_path=db, http_port=0, grpc_port=0, refresh_interval_s=0.5,
                         scrape_targets=targets, scrape_interval_s=0.2)
    col = Collector(cfg)
    try:
        col.start()
    except BaseException:
        for s in socks:
            s.close()
        raise
    st = Stack(col, db, f"routers-{tmp_path.name[-12:]}", ids,
               router_metrics_port=router_metrics_port)
    try:
        for s, rid in zip(socks, ids, strict=True):
            tp = make_tracer_provider("replica", rid, otlp_endpoint=col.traces_url,
                                      run_id=st.run_id)
            assert tp is not None
            st.providers.append(tp)
            rep = LiveReplica(rid, time_scale=0.05, model=MODEL, tracer_provider=tp)
            st.servers.append(ServerThread(rep.asgi, "127.0.0.1", name=f"replica-{rid}",
                                           sock=s).start())
        st.client_tp = make_tracer_provider("client", "client-0", otlp_endpoint=col.traces_url,
                                            run_id=st.run_id)
        assert st.client_tp is not None
        st.providers.append(st.client_tp)
        yield st
    finally:
        for srv in st.servers:
            srv.stop()
        for s in socks:
            s.close()
        for tp in st.providers:
            try:
                tp.force_flush(5_000)
                tp.shutdown()
            except Exception:  # noqa: BLE001 - teardown goes on
                pass
        col.stop()


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[Stack]:
    with _stack(tmp_path) as st:
        yield st


@pytest.fixture
def scraped_stack(tmp_path: Path) -> Iterator[Stack]:
    """A stack whose collector also scrapes ``router_metrics_port`` (nothing listens there
    until the test starts a router with ``prometheus_port=stack.router_metrics_port``)."""
    with _stack(tmp_path, free_port()) as st:
        yield st
