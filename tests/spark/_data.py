"""The store the Spark tests compare over: the sample data and a generated run, in one store.

The generated run is a virtual-time testbed run (the ``baseline`` scenario, ``hot_prefix``
workload, 8 replicas, seed 0) emitted through the OTel SDK and the collector's decoder, as
``benchmarks/spark_scaling.py`` makes it, starting a day after the sample data
(:data:`GENERATED_T0_NS`): the two share the replicas' names, and on the same instants the
generated run's load would change the sample data's attributions. Apart in time they fall in
different partitions and share no request, trace, run or instant; the store's relations over
both are the union of those over each (``test_spark_equivalence.py`` checks the sample data's
part against a store of the sample data alone).
"""

from __future__ import annotations

import importlib.util
import random
from pathlib import Path

REQUESTS = 5_000
"""The generated run's requests: enough to span several partitions of every relation, each
split across Spark's shuffle partitions (the equivalence test joins by shuffles, not
broadcasts: ``test_spark_equivalence.BROADCAST_MAX_BYTES``)."""

GENERATED_T0_NS = 1_767_312_000_000_000_000
"""Unix ns of the generated run's virtual time 0: 2026-01-02T00:00Z, a day after the sample
data's start (its runs end within four minutes of 2026-01-01T00:00Z)."""

ROOT = Path(__file__).resolve().parents[2]


def make_store(path: Path, requests: int = REQUESTS) -> Path:
    """A store at ``path`` holding the generated run of ``requests`` requests and the sample
    data, every relation built by DuckDB (one refresh over both); returns ``path``."""
    spec = importlib.util.spec_from_file_location(
        "analysis_scaling", ROOT / "benchmarks" / "analysis_scaling.py")
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)

    import testbed
    from audit._store import Store
    from routeaudit._demo import load_sample_data
    from testbed.emit import OTelEmitter

    # the OTel SDK draws trace and span ids from the random module: the same run every time
    random.seed(0)
    fleet = testbed.FleetConfig(n_replicas=8, router=testbed.RouterConfig(policy="qp_cost"),
                                t0_ns=GENERATED_T0_NS)
    store = Store(path, refresh_interval_s=3600, incremental=False)
    try:
        emitter = OTelEmitter(bench.StoreExporter(store, 2000), batch=False)
        testbed.prepare_scenario("baseline", n_requests=requests, emitter=emitter,
                                 workload="hot_prefix", seed=0, fleet=fleet).run()
        emitter.close()
        load_sample_data(store)
        store.refresh()
    finally:
        store.close()
    return path
