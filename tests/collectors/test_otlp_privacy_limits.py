"""Privacy and receiver limits: no prompt text stored by default (``keep_prompts``), and a slow
body sender (slow-loris) cannot hold the OTLP/HTTP receiver (``body_timeout_s``)."""

from __future__ import annotations

import argparse
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
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, ArrayValue, KeyValue, KeyValueList
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span

from collectors.otlp import Collector, CollectorConfig, ConfigError
from collectors.otlp._decode import decode, decode_protobuf, is_prompt_key
from collectors.tuning_args import add_tuning_arguments, tuning_overrides

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
                                             "from raw_spans"},
                   headers={"x-routeaudit-query": "1"})
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
        s.sendall(f"POST /v1/traces HTTP/1.1\r\nhost: 127.0.0.1:{c.http_port}\r\n".encode()
                  + b"content-type: application/x-protobuf\r\n"
                  + f"content-length: {len(body)}\r\n\r\n".encode() + body[:3])
        loris.append(s)
    # Meanwhile an honest sender is served.
    r = httpx.post(c.traces_url, content=_request(span_id=2).SerializeToString(),
                   headers={"content-type": "application/x-protobuf"}, timeout=60)
    assert r.status_code == 200
    # The stalled ones are answered 408 and disconnected (waiting for that, not for a clock).
    for s in loris:
        s.settimeout(60)
        data = b""
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
        s.close()
        assert data.startswith(b"HTTP/1.1 408"), data[:80]
    assert c.health()["counters"]["spans_received"] == 1


# -- every convention's prompt carriers --------------------------------------------------------------
CONVENTIONS = {
    "OpenTelemetry GenAI": [
        "gen_ai.input.messages", "gen_ai.output.messages", "gen_ai.system_instructions",
        "gen_ai.prompt", "gen_ai.prompt.0.content", "gen_ai.completion", "gen_ai.completion.0.content",
        "gen_ai.choice", "gen_ai.tool.call.arguments", "gen_ai.tool.call.result"],
    "OpenLLMetry": [
        "traceloop.entity.input", "traceloop.entity.output", "llm.prompts.0.content", "llm.prompts",
        "llm.completions.0.content", "llm.prompt_template.template", "llm.prompt_template.variables"],
    "OpenInference": [
        "input.value", "output.value", "llm.input_messages.0.message.content",
        "llm.output_messages.1.message.contents.0.message_content.text"],
}
CARRIERS = [key for keys in CONVENTIONS.values() for key in keys]
NOT_CARRIERS = ["gen_ai.usage.prompt_tokens", "gen_ai.usage.completion_tokens", "gen_ai.request.model",
                "llm.token_count.prompt", "input.mime_type", "traceloop.entity.name", "llm.model_name",
                "gen_ai.tool.name", "output.mime_type", "my.input.value"]


def _casings(key: str) -> list[str]:
    return [key, key.upper(), "".join(c.upper() if i % 2 else c for i, c in enumerate(key))]


def _placed(key: str, where: str) -> ExportTraceServiceRequest:
    """One span carrying ``key`` = "SECRET-TEXT" in one place (and a plain attribute beside)."""
    secret = KeyValue(key=key, value=AnyValue(string_value="SECRET-TEXT"))
    plain = _kv("plain", "visible")
    nested = AnyValue(kvlist_value=KeyValueList(values=[plain, KeyValue(key="deeper", value=AnyValue(
        array_value=ArrayValue(values=[AnyValue(kvlist_value=KeyValueList(values=[secret]))])))]))
    span = Span(trace_id=(7).to_bytes(16, "big"), span_id=(1).to_bytes(8, "big"), name="chat",
                start_time_unix_nano=NOW, end_time_unix_nano=NOW + 1000, attributes=[plain])
    rs = ResourceSpans()
    if where == "span":
        span.attributes.append(secret)
    elif where == "event":
        span.events.append(Span.Event(name="e", time_unix_nano=NOW, attributes=[secret, plain]))
    elif where == "link":
        span.links.append(Span.Link(trace_id=(8).to_bytes(16, "big"), span_id=(2).to_bytes(8, "big"),
                                    attributes=[secret]))
    elif where == "resource":
        rs.resource.attributes.extend([plain, secret])
    elif where == "kvlist":
        span.attributes.append(KeyValue(key="io", value=AnyValue(kvlist_value=KeyValueList(values=[secret]))))
    else:  # a kvlist in an array in a kvlist
        span.attributes.append(KeyValue(key="io", value=nested))
    rs.scope_spans.append(ScopeSpans(spans=[span]))  # a copy: the span is complete by now
    return ExportTraceServiceRequest(resource_spans=[rs])


def _stored_text(batch: Any) -> str:
    """Every value of every row and column the batch would store."""
    return json.dumps([batch.spans.to_pylist(), batch.events.to_pylist()], default=str)


PLACES = ["span", "event", "link", "resource", "kvlist", "deep"]


def _decoders(req: ExportTraceServiceRequest, **kw: Any) -> list[Any]:
    """The request through the decoder on parsed messages and the one on bytes (the C decoder
    where it takes the body)."""
    return [decode(req, NOW, **kw), decode_protobuf(req.SerializeToString(), NOW, **kw)]


@pytest.mark.parametrize("key", CARRIERS)
def test_every_conventions_carriers_are_dropped_in_any_case_and_place(key: str) -> None:
    for variant in _casings(key):
        assert is_prompt_key(variant), variant
        for where in PLACES:
            for batch in _decoders(_placed(variant, where)):
                assert batch.accepted == 1
                assert "SECRET-TEXT" not in _stored_text(batch), (variant, where)
                assert "visible" in _stored_text(batch)
                assert batch.prompt_values_dropped == 1, (variant, where)
            for kept in _decoders(_placed(variant, where), keep_prompts=True):
                assert "SECRET-TEXT" in _stored_text(kept) and kept.prompt_values_dropped == 0


@pytest.mark.parametrize("key", NOT_CARRIERS)
def test_neighbours_of_the_carriers_are_kept(key: str) -> None:
    assert not is_prompt_key(key)
    for where in PLACES:
        for batch in _decoders(_placed(key, where)):
            assert "SECRET-TEXT" in _stored_text(batch) and batch.prompt_values_dropped == 0


def test_user_patterns_drop_too_and_are_not_undone_by_keep_prompts() -> None:
    for keep in (False, True):
        for pattern, key in (("acme.customer.*", "Acme.Customer.Email"), ("acme.email", "ACME.EMAIL")):
            for where in PLACES:
                for batch in _decoders(_placed(key, where), keep_prompts=keep, drop_attributes=(pattern,)):
                    assert "SECRET-TEXT" not in _stored_text(batch) and batch.prompt_values_dropped == 1
    # a pattern is the whole key, or its start with "*": "acme.*" does not drop "x.acme.y", nor
    # "x.acme" "x.acme.y"
    for batch in _decoders(_placed("x.acme.y", "span"), drop_attributes=("acme.*", "x.acme", "x.acme.y.z")):
        assert "SECRET-TEXT" in _stored_text(batch)


def test_drop_attribute_flag_reaches_the_config(tmp_path: Path) -> None:
    parser = argparse.ArgumentParser()
    add_tuning_arguments(parser)
    args = parser.parse_args(["--drop-attribute", "acme.*", "--drop-attribute", "x.secret"])
    cfg = _collector_config(tmp_path, **tuning_overrides(args))
    assert cfg.validate().drop_attributes == ("acme.*", "x.secret")
    for bad in ("", " ", "*", "a\nb", "a*b"):
        with pytest.raises(ConfigError):
            _collector_config(tmp_path, drop_attributes=(bad,)).validate()


def test_collector_drops_user_patterns_end_to_end(tmp_path: Path) -> None:
    with Collector(_collector_config(tmp_path, keep_prompts=True, drop_attributes=("acme.*",))) as c:
        body = _placed("ACME.secret", "kvlist").SerializeToString()
        r = httpx.post(c.traces_url, content=body, headers={"content-type": "application/x-protobuf"})
        assert r.status_code == 200
        attrs, _res = _stored_attrs(c)
        dropped = c.health()["counters"]["prompt_values_dropped"]
    assert "SECRET-TEXT" not in attrs and "visible" in attrs and dropped == 1
