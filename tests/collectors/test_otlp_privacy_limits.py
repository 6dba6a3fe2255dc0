"""Privacy and receiver limits: no prompt text stored by default (``keep_prompts``), and a slow
body sender (slow-loris) cannot hold the OTLP/HTTP receiver (``body_timeout_s``)."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pyarrow as pa
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span

from collectors.otlp import Collector, CollectorConfig, ConfigError
from collectors.otlp._decode import decode, is_prompt_key

NOW = time.time_ns()

PROMPT_ATTRS = {
    "gen_ai.prompt": "secret prompt",
    "gen_ai.prompt.0.content": "secret prompt part",
    "gen_ai.completion.0.content": "secret completion",
    "gen_ai.input.messages": '[{"role": "user", "content": "secret"}]',
    "gen_ai.output.messages": '[{"role": "assistant", "content": "secret"}]',
    "gen_ai.system_instructions": "secret system prompt",
    "llm.prompts": "secret",
    "llm.input_messages.0.message.content": "secret",
    "llm.output_messages.0.message.content": "secret",
    "input.value": "secret",
    "output.value": "secret",
}
KEPT_ATTRS = {
    "gen_ai.request.model": "m",
    "gen_ai.usage.input_tokens": 12,
    "routeaudit.request.id": "r-1",
    "gen_ai.prompt_tokens_note": None,  # a prefix match too: conservative on purpose
}


def _kv(key: str, value: Any) -> KeyValue:
    if isinstance(value, int):
        return KeyValue(key=key, value=AnyValue(int_value=value))
    return KeyValue(key=key, value=AnyValue(string_value=str(value)))


def _request(span_id: int = 1) -> ExportTraceServiceRequest:
    attrs = [_kv(k, v) for k, v in PROMPT_ATTRS.items()]
    attrs += [_kv(k, v) for k, v in KEPT_ATTRS.items() if v is not None]
    span = Span(
        trace_id=(7).to_bytes(16, "big"), span_id=span_id.to_bytes(8, "big"), name="chat",
        kind=Span.SPAN_KIND_CLIENT, start_time_unix_nano=NOW, end_time_unix_nano=NOW + 1000,
        attributes=attrs,
        events=[Span.Event(name="gen_ai.content.prompt", time_unix_nano=NOW,
                           attributes=[_kv("gen_ai.prompt", "secret in an event"), _kv("n", 1)])],
    )
    rs = ResourceSpans(scope_spans=[ScopeSpans(spans=[span])])
    rs.resource.attributes.append(_kv("service.name", "svc"))
    rs.resource.attributes.append(_kv("input.value", "secret in a resource"))
    return ExportTraceServiceRequest(resource_spans=[rs])


def test_prompt_keys_classified() -> None:
    for key in PROMPT_ATTRS:
        assert is_prompt_key(key), key
    for key in ("gen_ai.request.model", "gen_ai.usage.input_tokens", "input_value", "llm.model",
                "routeaudit.request.prefix_hashes"):
        assert not is_prompt_key(key), key


def test_decoder_drops_prompts_by_default_and_counts_them() -> None:
    batch = decode(_request(), NOW)
    assert batch.accepted == 1
    attrs = json.loads(batch.spans.column("attributes")[0].as_py())
    assert not set(attrs) & set(PROMPT_ATTRS)
    # typed attributes are in their columns, not in the JSON (raw_span_attributes has them all)
    assert batch.spans.column("a_model")[0].as_py() == "m" and "gen_ai.request.model" not in attrs
    assert batch.spans.column("a_request_id")[0].as_py() == "r-1"
    ev = json.loads(batch.events.column("attributes")[0].as_py())
    assert ev == {"n": 1}
    res = json.loads(batch.spans.column("resource_attributes")[0].as_py())
    assert res == {"service.name": "svc"}
    assert batch.prompt_values_dropped == len(PROMPT_ATTRS) + 2
    for col in ("attributes", "resource_attributes"):
        assert "secret" not in batch.spans.column(col)[0].as_py()


def test_decoder_keeps_prompts_when_asked() -> None:
    batch = decode(_request(), NOW, keep_prompts=True)
    attrs = json.loads(batch.spans.column("attributes")[0].as_py())
    assert {k: attrs[k] for k in PROMPT_ATTRS} == PROMPT_ATTRS
    assert json.loads(batch.events.column("attributes")[0].as_py())["gen_ai.prompt"] == "secret in an event"
    assert batch.prompt_values_dropped == 0


def _collector_config(tmp_path: Path, **changes: Any) -> CollectorConfig:
    return CollectorConfig(db_path=tmp_path / "audit.duckdb", http_port=0, grpc_port=None,
                           **changes)


def _stored_attrs(c: Collector) -> tuple[str, str]:
    r = httpx.post(c.query_url, json={"sql": "select attributes::varchar, resource_attributes::varchar "
                                             "from raw_spans"})
    assert r.status_code == 200, r.text
    rows = pa.ipc.open_stream(r.content).read_all().to_pylist()
    assert len(rows) == 1
    return tuple(rows[0].values())  # type: ignore[return-value]


@pytest.mark.parametrize("keep", [False, True])
def test_collector_keep_prompts_end_to_end(tmp_path: Path, keep: bool) -> None:
    with Collector(_collector_config(tmp_path, keep_prompts=keep)) as c:
        r = httpx.post(c.traces_url, content=_request().SerializeToString(),
                       headers={"content-type": "application/x-protobuf"})
        assert r.status_code == 200
        attrs, res = _stored_attrs(c)
        dropped = c.health()["counters"]["prompt_values_dropped"]
    if keep:
        assert "secret prompt" in attrs and "secret in a resource" in res and dropped == 0
    else:
        assert "secret" not in attrs and "secret" not in res
        assert dropped == len(PROMPT_ATTRS) + 2


def test_config_checks_new_settings(tmp_path: Path) -> None:
    with pytest.raises(ConfigError):
        _collector_config(tmp_path, body_timeout_s=0).validate()
    with pytest.raises(ConfigError):
        _collector_config(tmp_path, keep_prompts="yes").validate()
    assert CollectorConfig().keep_prompts is False


@pytest.fixture
def quick_timeout_collector(tmp_path: Path) -> Iterator[Collector]:
    with Collector(_collector_config(tmp_path, body_timeout_s=0.5)) as c:
        yield c


def test_slow_body_sender_is_cut_off_and_does_not_hold_the_collector(
        quick_timeout_collector: Collector) -> None:
    c = quick_timeout_collector
    body = _request().SerializeToString()
    # Slow-loris: announce the whole body, send a few bytes, then stall.
    loris = []
    for _ in range(5):
        s = socket.create_connection(("127.0.0.1", c.http_port), timeout=5)
        s.sendall(b"POST /v1/traces HTTP/1.1\r\nhost: x\r\ncontent-type: application/x-protobuf\r\n"
                  + f"content-length: {len(body)}\r\n\r\n".encode() + body[:3])
        loris.append(s)
    t = time.monotonic()
    # Meanwhile an honest sender is served at once.
    r = httpx.post(c.traces_url, content=_request(span_id=2).SerializeToString(),
                   headers={"content-type": "application/x-protobuf"}, timeout=5)
    assert r.status_code == 200
    assert time.monotonic() - t < 2.0
    # The stalled ones are answered 408 and disconnected after body_timeout_s.
    for s in loris:
        data = b""
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
        s.close()
        assert data.startswith(b"HTTP/1.1 408"), data[:80]
    assert time.monotonic() - t < 5.0
    assert c.health()["counters"]["spans_received"] == 1
