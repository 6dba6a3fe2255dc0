from __future__ import annotations

import collections

import pytest

pytest.importorskip("collectors.router")

from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter  # noqa: E402

import semconv as sc  # noqa: E402
import testbed  # noqa: E402
from collectors.router import candidates_of  # noqa: E402
from testbed.emit import OTelEmitter  # noqa: E402


def test_otel_emitter_produces_linked_spans_with_simulated_times() -> None:
    exp = InMemorySpanExporter()
    em = OTelEmitter(exp, batch=False)
    s = testbed.run_scenario("baseline", n_requests=20, emitter=em, progress=False, replicas=2)
    assert em.errors == 0 and s.n_finished == 20
    spans = exp.get_finished_spans()
    names = collections.Counter(sp.name for sp in spans)
    assert names[sc.SPAN_CLIENT] == 20 and names[sc.SPAN_DECISION] == 20
    assert names[sc.SPAN_VLLM_REQUEST] == 20
    by_id = {sp.context.span_id: sp for sp in spans}
    cfg = testbed.FleetConfig()
    for sp in spans:
        assert sp.start_time >= cfg.t0_ns and sp.resource.attributes[sc.RUN_ID] == s.run_id
        if sp.name == sc.SPAN_VLLM_REQUEST:
            # replica span -> forward -> decision -> client, one trace
            chain = [sp]
            while chain[-1].parent is not None:
                chain.append(by_id[chain[-1].parent.span_id])
            assert chain[-1].name == sc.SPAN_CLIENT
            assert len({c.context.trace_id for c in chain}) == 1
            assert sp.resource.attributes[sc.REPLICA_ID].startswith("replica-")
        if sp.name == sc.SPAN_DECISION:
            assert len(candidates_of(sp)) == 2
    em.close()
    em.close()  # idempotent


def _normalised(spans: list) -> list[tuple]:  # type: ignore[type-arg]
    """Everything a span exports except its random ids; parents by position in the list."""
    pos = {sp.context.span_id: i for i, sp in enumerate(spans)}
    out = []
    for sp in spans:
        scope = sp.instrumentation_scope
        out.append((
            sp.name, sp.kind, dict(sp.attributes or {}),
            [(e.name, e.timestamp, dict(e.attributes or {})) for e in sp.events],
            list(sp.links), sp.start_time, sp.end_time, sp.status.status_code,
            sp.status.description, dict(sp.resource.attributes), scope.name, scope.version,
            scope.schema_url, None if sp.parent is None else pos.get(sp.parent.span_id),
            sp.context.trace_flags, sp.dropped_attributes, sp.dropped_events,
        ))
    return out


@pytest.mark.parametrize("scenario", ["mixed+herding", "overload_bursts"])
def test_direct_spans_export_what_the_sdk_exports(scenario: str) -> None:
    # an admission limit and a client timeout, so rejected and cancelled requests are emitted
    fleet = testbed.FleetConfig(n_replicas=3, client_timeout_s=4.0, router=testbed.RouterConfig(
        policy="qp_cost", admission_limit=3))
    exported = []
    for direct in (True, False):
        exp = InMemorySpanExporter()
        em = OTelEmitter(exp, batch=False, direct_spans=direct)
        sim = testbed.prepare_scenario(scenario, n_requests=120, seed=1, emitter=em, fleet=fleet)
        sim.run()
        em.close()
        assert em.errors == 0
        spans = list(exp.get_finished_spans())
        # one trace per request on both paths
        traces: dict[str, set[int]] = collections.defaultdict(set)
        by_id = {sp.context.span_id: sp for sp in spans}
        for sp in spans:
            root = sp
            while root.parent is not None:
                root = by_id[root.parent.span_id]
            traces[str(root.attributes[sc.REQUEST_ID])].add(sp.context.trace_id)
        assert len(traces) == len(sim.records) and all(len(t) == 1 for t in traces.values())
        exported.append(spans)
    direct_spans, sdk_spans = exported
    assert len(direct_spans) == len(sdk_spans) > 3 * 100
    assert _normalised(direct_spans) == _normalised(sdk_spans)
    statuses = {str(sp.attributes.get(sc.STATUS)) for sp in sdk_spans if sp.name == sc.SPAN_CLIENT}
    assert {"ok", "cancelled"} <= statuses and (scenario != "overload_bursts" or "rejected" in statuses)
