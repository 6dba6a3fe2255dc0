"""Live mode pieces: tokens, request generation, replica and router behaviour, clock skew,
admission, retries, the blocking serve_* entry points. Spans go to an in-memory exporter."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import semconv as sc
from collectors.router import candidates_of
from testbed import ReplicaConfig, live
from testbed.live import Fleet, live_requests, prompt_info, serve_replicas, serve_router
from testbed.live._tokens import text_for_keys
from tests.conftest import free_port


@pytest.fixture
def exporter() -> Iterator[InMemorySpanExporter]:
    exp = InMemorySpanExporter()
    yield exp
    exp.shutdown()


def _by(spans: tuple[ReadableSpan, ...], name: str) -> dict[str, list[ReadableSpan]]:
    out: dict[str, list[ReadableSpan]] = {}
    for s in spans:
        if s.name == name:
            out.setdefault(str((s.attributes or {}).get(sc.REQUEST_ID)), []).append(s)
    return out


def test_public_names() -> None:
    assert sorted(live.__all__) == sorted(
        n for n in dir(live) if not n.startswith("_") and n not in {"annotations"})


# ------------------------------------------------------------------------------ tokens, load
def test_prompt_info_text_ids_and_extension() -> None:
    a = prompt_info({"prompt": "x" * 640 + "tail one"})
    b = prompt_info({"prompt": "x" * 640 + "other tail"})
    assert a.input_tokens == 162 and len(a.block_keys) == 11 and a.block_tokens == 16
    assert a.block_keys[:10] == b.block_keys[:10] and a.block_keys[10] != b.block_keys[10]
    chat = prompt_info({"messages": [{"role": "system", "content": "s" * 300},
                                     {"role": "user", "content": "q"}]})
    chat2 = prompt_info({"messages": [{"role": "system", "content": "s" * 300},
                                      {"role": "user", "content": "r"}]})
    assert chat.block_keys[:4] == chat2.block_keys[:4] and chat.block_keys != chat2.block_keys
    ids = prompt_info({"prompt": list(range(40))})
    assert ids.input_tokens == 40 and len(ids.block_keys) == 3
    assert prompt_info({"input_ids": list(range(40))}).block_keys == ids.block_keys
    ext = prompt_info({"prompt": "x", "routeaudit_prefix_hashes": ["00ff", "0a0b"],
                       "routeaudit_input_tokens": 1000})
    assert ext.input_tokens == 1000 and ext.block_keys == (0xFF, 0x0A0B) and ext.block_tokens == 500
    with pytest.raises(ValueError):
        prompt_info({"routeaudit_prefix_hashes": ["00ff"], "routeaudit_input_tokens": 0})


def test_text_for_keys_round_trips_through_the_tokenizer() -> None:
    t1 = text_for_keys((1, 2, 3), 64, 150)
    t2 = text_for_keys((1, 2, 9), 64, 150)
    assert len(t1) == 600 and t1[:512] == t2[:512] and t1[512:] != t2[512:]
    assert prompt_info({"prompt": t1}).input_tokens == 150


def test_live_requests_shapes() -> None:
    reqs = live_requests("hot_prefix", 20, seed=2, stream_fraction=0.5, chat_fraction=0.5)
    assert reqs == live_requests("hot_prefix", 20, seed=2, stream_fraction=0.5,
                                 chat_fraction=0.5)
    assert [r["at_s"] for r in reqs] == sorted(r["at_s"] for r in reqs)
    assert {r["endpoint"] for r in reqs} == {"/v1/completions", "/v1/chat/completions"}
    for r in reqs:
        assert r["request_id"].startswith("s2-hp-") and r["max_tokens"] == 128
        body = {"prompt": r["prompt"]} if "prompt" in r else {"messages": r["messages"]}
        assert prompt_info(body).input_tokens == r["prompt_tokens"]
    texts = [r["prompt"] for r in reqs if "prompt" in r]
    assert any(a[:4096] == b[:4096] for i, a in enumerate(texts) for b in texts[i + 1:])
    ab = live_requests("aibrix", 5, max_tokens=32, chat_fraction=0.0)
    assert len(ab) == 5 and all(len(r["prompt"]) > 100 and r["max_tokens"] <= 32 for r in ab)


# ------------------------------------------------------------------------------ servers
def test_replica_endpoints_and_admission(exporter: InMemorySpanExporter) -> None:
    with Fleet(1, span_exporter=exporter, replica=ReplicaConfig(max_running=1),
               replica_max_waiting=1) as fleet:
        url = fleet.replica_urls[0]
        with httpx.Client(base_url=url, timeout=10) as c:
            assert c.get("/health").status_code == 200
            assert c.get("/v1/models").json()["data"][0]["id"] == "sim-8b"
            assert c.get("/get_server_info").json()["max_running_requests"] == 1
            assert c.get("/get_model_info").json()["is_generation"] is True
            g = c.post("/generate", json={"text": "hello " * 30,
                                          "sampling_params": {"max_new_tokens": 3}}).json()
            assert g["meta_info"]["completion_tokens"] == 3 and g["meta_info"]["prompt_tokens"] == 45
            stop = c.post("/v1/completions", json={"prompt": "hi", "max_tokens": 9,
                                                   "routeaudit_output_tokens": 4}).json()
            assert stop["choices"][0]["finish_reason"] == "stop"
            assert stop["usage"]["completion_tokens"] == 4
            assert c.post("/v1/completions", content=b"{").status_code == 400

            # one running (max_running=1), one waiting (max_waiting=1): the third is refused
            def post(i: int) -> int:
                return c.post("/v1/completions", json={"prompt": "p" * 400, "max_tokens": 2000},
                              headers={"X-Request-Id": f"adm-{i}"}).status_code

            with ThreadPoolExecutor(3) as pool:
                first = [pool.submit(post, i) for i in range(2)]
                time.sleep(0.2)
                third = post(2)
                codes = sorted(f.result() for f in first)
        assert third == 503 and codes == [200, 200]
    spans = _by(exporter.get_finished_spans(), sc.SPAN_VLLM_REQUEST)
    refused = (spans["adm-2"][0].attributes or {})
    assert refused[sc.STATUS] == "rejected" and refused[sc.HTTP_STATUS] == 503


def test_replica_clock_offset_shifts_its_spans(exporter: InMemorySpanExporter) -> None:
    with Fleet(2, "round_robin", span_exporter=exporter, clock_offsets_s={1: 3.0},
               telemetry_interval_s=0.1) as fleet:
        with httpx.Client(base_url=fleet.router_url, timeout=10) as c:
            for i in range(4):
                r = c.post("/v1/completions", json={"prompt": "skew " * 50, "max_tokens": 4},
                           headers={"X-Request-Id": f"skew-{i}"})
                assert r.status_code == 200 and r.headers["x-request-id"] == f"skew-{i}"
        skewed = fleet.replica_ids[1]
    spans = exporter.get_finished_spans()
    fwd = {k: v[0] for k, v in _by(spans, sc.SPAN_FORWARD).items()}
    rep = {k: v[0] for k, v in _by(spans, sc.SPAN_VLLM_REQUEST).items()}
    served = {k: s.resource.attributes[sc.REPLICA_ID] for k, s in rep.items()}
    assert set(served.values()) == set(fleet.replica_ids)
    for rid, s in rep.items():
        f = fwd[rid]
        assert s.parent is not None and s.parent.span_id == f.context.span_id
        assert s.start_time is not None and s.end_time is not None
        assert f.start_time is not None and f.end_time is not None
        shift = 3e9 if served[rid] == skewed else 0.0
        # the replica span lies inside its forward span once the offset is taken off
        assert f.start_time - 1e6 <= s.start_time - shift
        assert s.end_time - shift <= f.end_time + 1e6
        assert s.resource.attributes[sc.HOST_NAME] == served[rid]
        for e in s.events:
            assert s.start_time <= e.timestamp <= s.end_time


def test_router_admission_limit_rejects_with_429(exporter: InMemorySpanExporter) -> None:
    # telemetry every 5 s: the first request stays pending, so the second finds the replica full
    with (Fleet(1, "least_load", span_exporter=exporter, admission_limit=1,
                telemetry_interval_s=5.0) as fleet,
          httpx.Client(base_url=fleet.router_url, timeout=10) as c):
        a = c.post("/v1/completions", json={"prompt": "a", "max_tokens": 2},
                   headers={"X-Request-Id": "adm-ok"})
        b = c.post("/v1/completions", json={"prompt": "b", "max_tokens": 2},
                   headers={"X-Request-Id": "adm-full"})
    assert a.status_code == 200 and b.status_code == 429
    dec = _by(exporter.get_finished_spans(), sc.SPAN_DECISION)
    full = dec["adm-full"][0]
    attrs = full.attributes or {}
    assert attrs[sc.DECISION_OUTCOME] == "rejected" and attrs[sc.DECISION_REASON] == "admission_limit"
    ev = candidates_of(full)[0]
    assert ev[sc.CANDIDATE_ELIGIBLE] is False and ev[sc.CANDIDATE_EXCLUDED_REASON] == "full"
    assert ev[sc.CANDIDATE_PENDING] == 1


def test_router_retries_connect_error_as_attempt_1(exporter: InMemorySpanExporter) -> None:
    with Fleet(2, "round_robin", span_exporter=exporter, telemetry_interval_s=5.0) as fleet:
        fleet._servers[1].stop()  # replica-1 dies; the router's telemetry does not know yet
        with httpx.Client(base_url=fleet.router_url, timeout=10) as c:
            codes = [c.post("/v1/completions", json={"prompt": "r", "max_tokens": 2},
                            headers={"X-Request-Id": f"rt-{i}"}).status_code for i in range(3)]
        dead = fleet.replica_ids[1]
    assert codes == [200, 200, 200]
    spans = exporter.get_finished_spans()
    dec = _by(spans, sc.SPAN_DECISION)
    retried = [k for k, v in dec.items() if len(v) == 2]
    assert retried
    d0, d1 = sorted(dec[retried[0]], key=lambda s: (s.attributes or {})[sc.ATTEMPT])
    assert (d0.attributes or {})[sc.DECISION_CHOSEN] == dead
    assert (d1.attributes or {})[sc.ATTEMPT] == 1 and (d1.attributes or {})[sc.DECISION_CHOSEN] != dead
    excl = {c[sc.CANDIDATE_REPLICA]: c.get(sc.CANDIDATE_EXCLUDED_REASON) for c in candidates_of(d1)}
    assert excl[dead] == "connect_error"
    fwd = [f for f in _by(spans, sc.SPAN_FORWARD)[retried[0]] if f.parent == d0.context]
    assert fwd and not fwd[0].status.is_ok


def test_serve_functions_block_until_stopped() -> None:
    stop = threading.Event()
    base = free_port()
    t = threading.Thread(target=serve_replicas, args=(1, base), kwargs={"stop_event": stop})
    t.start()
    try:
        url = f"http://127.0.0.1:{base}"
        deadline = time.monotonic() + 10
        while True:
            try:
                if httpx.get(url + "/health").status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline
            time.sleep(0.05)
        rport = free_port()
        stop_r = threading.Event()
        tr = threading.Thread(target=serve_router, args=([url], rport),
                              kwargs={"stop_event": stop_r, "policy": "power_of_two"})
        tr.start()
        try:
            deadline = time.monotonic() + 10
            while True:
                try:
                    r = httpx.post(f"http://127.0.0.1:{rport}/v1/completions",
                                   json={"prompt": "x", "max_tokens": 2})
                    break
                except httpx.HTTPError:
                    assert time.monotonic() < deadline
                    time.sleep(0.05)
            assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 2
        finally:
            stop_r.set()
            tr.join(15)
        assert not tr.is_alive()
    finally:
        stop.set()
        t.join(15)
    assert not t.is_alive()
