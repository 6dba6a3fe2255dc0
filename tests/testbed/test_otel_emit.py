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
