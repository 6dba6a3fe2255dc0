"""A live collector fed real OTLP/HTTP spans by the testbed serves ``routeaudit_verdicts_*``
equal to SQL on its store; the shipped alert rules pass ``promtool``; the Grafana dashboard
reads only metrics the collector exports; and a real Prometheus server scrapes the collector,
holds the same values and fires an alert from the shipped rules."""

from __future__ import annotations

import json
import re
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from prometheus_client.parser import text_string_to_metric_families

import testbed
from collectors.otlp import Collector, CollectorConfig
from testbed.emit import OTelEmitter

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
RULES = DEPLOY / "prometheus" / "routeaudit_rules.yml"
RULES_TEST = DEPLOY / "prometheus" / "routeaudit_rules_test.yml"
DASHBOARD = DEPLOY / "grafana" / "routeaudit.json"
WAIT_S = 60.0
"""Upper bound on any wait below (a loaded CI machine); each ends as soon as its condition holds."""

PROMTOOL = shutil.which("promtool")
PROMETHEUS = shutil.which("prometheus")
NO_PROMETHEUS = ("Debian's prometheus package is not installed (make setup-test installs it: "
                 "apt-get install prometheus)")


def _wait(what: str, check: Any, state: Any = lambda: "") -> Any:
    deadline = time.monotonic() + WAIT_S
    while True:
        got = check()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what} {state()}")
        time.sleep(0.1)


def _metrics(c: Collector) -> dict[str, list[Any]]:
    text = httpx.get(c.http_url + "/metrics", timeout=10).text
    return {f.name: f.samples for f in text_string_to_metric_families(text)}


def _by(samples: list[Any], label: str) -> dict[str, float]:
    return {s.labels[label]: s.value for s in samples}


@pytest.fixture(scope="module")
def collector(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Collector]:
    """A collector whose relations hold one testbed run (300 requests, the `mixed` scenario: a
    slow replica, stale telemetry), sent over OTLP/HTTP by the OpenTelemetry SDK."""
    cfg = CollectorConfig(db_path=tmp_path_factory.mktemp("prom") / "audit.duckdb", http_port=0,
                          grpc_port=None, refresh_interval_s=0.1, refresh_max_share=1.0)
    with Collector(cfg) as c:
        em = OTelEmitter(OTLPSpanExporter(endpoint=c.traces_url, timeout=30))
        testbed.prepare_scenario("mixed", n_requests=300, replicas=4, emitter=em).run()
        em.close()
        assert em.errors == 0
        store = c._store
        assert store is not None

        def caught_up() -> bool:
            snap = c.verdicts.snapshot
            return (store.relations_lag_spans == 0 and snap is not None
                    and snap.newest_request_ns == store.newest_request_ns)

        _wait("the verdict metrics of every span", caught_up, lambda: (
            f"lag {store.relations_lag_spans}, newest {store.newest_request_ns}, verdicts "
            f"{c.verdicts.snapshot and c.verdicts.snapshot.newest_request_ns}, "
            f"failures {c.verdicts.failures}, refresh error {store.last_refresh_error}"))
        yield c


def _sql(c: Collector, sql: str) -> list[dict[str, Any]]:
    assert c._store is not None
    rows: list[dict[str, Any]] = c._store.query_arrow(sql).to_pylist()
    return rows


def test_metrics_equal_sql_on_the_store(collector: Collector) -> None:
    m = _metrics(collector)
    assert _by(m["routeaudit_verdicts_requests"], "status") == {
        "ok": 0, "error": 0, "timeout": 0, "cancelled": 0, "rejected": 0, "other": 0,
        **{r["status"]: r["n"] for r in _sql(collector, "select status, count(*) as n from requests "
                                                         "group by status")}}
    slow = {r["cause"]: r["n"] for r in _sql(
        collector, "select cause, count(*) as n from slow_requests group by cause")}
    got = {k: v for k, v in _by(m["routeaudit_verdicts_slow_requests"], "cause").items() if v}
    assert got == slow and sum(slow.values()) > 0
    [summary] = _sql(collector, "select sum(goodput) / sum(requests) as g, "
                                "sum(requests) as n from slo_summary")
    assert summary["n"] == 300
    assert m["routeaudit_verdicts_goodput_ratio"][0].value == pytest.approx(float(summary["g"]))
    [ttft] = _sql(collector, "select quantile_cont(ttft_ms, 0.99) / 1000 as p99 from requests "
                             "where status = 'ok'")
    assert _by(m["routeaudit_verdicts_ttft_seconds"], "quantile")["0.99"] == pytest.approx(ttft["p99"])
    [newest] = _sql(collector, "select max(anchor_ns) as n from requests")
    assert m["routeaudit_verdicts_newest_request_timestamp_seconds"][0].value == newest["n"] / 1e9
    assert m["routeaudit_verdicts_updates"][0].value >= 1
    assert m["routeaudit_verdicts_update_failures"][0].value == 0


def test_dashboard_reads_only_exported_metrics(collector: Collector) -> None:
    dash = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p["targets"]]
    exprs.append(dash["templating"]["list"][1]["query"]["query"])
    assert len(exprs) >= 10 and {p["id"] for p in dash["panels"]} == set(range(1, len(dash["panels"]) + 1))
    names = {n for e in exprs for n in re.findall(r"\brouteaudit_[a-z_]+", e)}
    exported = {re.split(r"[{ ]", line)[0] for line in
                httpx.get(collector.http_url + "/metrics", timeout=10).text.splitlines()
                if line and not line.startswith("#")}
    assert len(names) >= 10 and "routeaudit_verdicts_requests" in exported
    missing = names - exported
    assert not missing, f"dashboard queries metrics the collector does not export: {sorted(missing)}"
    for title in ("Goodput", "TTFT", "lag", "cause", "status", "final"):
        assert any(title.lower() in p["title"].lower() for p in dash["panels"]), title


@pytest.mark.skipif(PROMTOOL is None, reason=NO_PROMETHEUS)
def test_promtool_checks_and_unit_tests_the_rules() -> None:
    assert PROMTOOL is not None
    check = subprocess.run([PROMTOOL, "check", "rules", str(RULES)], capture_output=True, text=True,
                           timeout=60)
    assert check.returncode == 0, check.stdout + check.stderr
    unit = subprocess.run([PROMTOOL, "test", "rules", RULES_TEST.name], capture_output=True,
                          text=True, timeout=60, cwd=RULES_TEST.parent)
    assert unit.returncode == 0, unit.stdout + unit.stderr
    rules = yaml.safe_load(RULES.read_text())
    for group in rules["groups"]:
        for rule in group["rules"]:
            assert rule.get("for") and rule["labels"]["severity"] in ("warning", "critical"), rule
            assert rule["annotations"]["summary"] and rule["annotations"]["description"], rule


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@pytest.mark.skipif(PROMETHEUS is None, reason=NO_PROMETHEUS)
def test_a_real_prometheus_scrapes_the_collector_and_fires_an_alert(
        collector: Collector, tmp_path: Path) -> None:
    assert PROMETHEUS is not None
    # the shipped rules, made to fire on their first evaluation (their `for:` is minutes)
    rules = yaml.safe_load(RULES.read_text())
    for group in rules["groups"]:
        for rule in group["rules"]:
            rule["for"] = "0s"
    (tmp_path / "rules.yml").write_text(yaml.safe_dump(rules))
    target = collector.http_url.removeprefix("http://")
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump({
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": ["rules.yml"],
        "scrape_configs": [{"job_name": "routeaudit", "static_configs": [{"targets": [target]}]}],
    }))
    port = _free_port()
    api = f"http://127.0.0.1:{port}/api/v1"
    log = (tmp_path / "prometheus.log").open("wb")
    proc = subprocess.Popen(
        [PROMETHEUS, f"--config.file={tmp_path / 'prometheus.yml'}",
         f"--storage.tsdb.path={tmp_path / 'data'}", f"--web.listen-address=127.0.0.1:{port}"],
        stdout=log, stderr=subprocess.STDOUT, cwd=tmp_path)
    try:
        def query(q: str) -> list[dict[str, Any]]:
            if proc.poll() is not None:
                raise AssertionError((tmp_path / "prometheus.log").read_text()[-2000:])
            try:
                answer = httpx.get(f"{api}/query", params={"query": q}, timeout=5)
            except httpx.TransportError:
                return []
            if answer.status_code != 200:  # still starting ("Service Unavailable")
                return []
            result: list[dict[str, Any]] = answer.json()["data"]["result"]
            return result

        by_status = _wait("a scrape of routeaudit_verdicts_requests",
                          lambda: query("routeaudit_verdicts_requests"))
        m = _metrics(collector)
        assert {r["metric"]["status"]: float(r["value"][1]) for r in by_status} == \
            _by(m["routeaudit_verdicts_requests"], "status")
        for r in by_status:
            assert r["metric"]["job"] == "routeaudit" and r["metric"]["instance"] == target
        slow = {r["metric"]["cause"]: float(r["value"][1])
                for r in query("routeaudit_verdicts_slow_requests")}
        assert slow == _by(m["routeaudit_verdicts_slow_requests"], "cause")
        [goodput] = query("routeaudit_verdicts_goodput_ratio")
        assert float(goodput["value"][1]) == pytest.approx(m["routeaudit_verdicts_goodput_ratio"][0].value)
        assert float(goodput["value"][1]) < 0.9  # the mixed scenario misses the SLO often

        def firing() -> list[dict[str, Any]]:
            alerts = httpx.get(f"{api}/alerts", timeout=5).json()["data"]["alerts"]
            return [a for a in alerts if a["labels"]["alertname"] == "RouteauditGoodputBelowTarget"
                    and a["state"] == "firing"]

        [alert] = _wait("RouteauditGoodputBelowTarget firing", firing)
        assert alert["labels"]["severity"] == "warning" and alert["labels"]["instance"] == target
        assert alert["annotations"]["summary"] == f"Goodput below 90 % on {target}"
        refused = httpx.get(f"{api}/alerts", timeout=5).json()["data"]["alerts"]
        assert not [a for a in refused if a["labels"]["alertname"] in (
            "RouteauditCollectorRefusingExports", "RouteauditCollectorDown",
            "RouteauditVerdictMetricsFailing")]
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
