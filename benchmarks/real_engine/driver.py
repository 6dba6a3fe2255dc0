"""Real engines behind real routers, traced into routeaudit: how many rows link, and which don't.

Runs in routeaudit's environment (needs ``smg`` and/or ``vllm-router``); the engines run in the
vLLM venv given by ``--vllm-python`` (see ``run.sh``). Per router (vllm-router, then SMG):

1. a collector (OTLP/gRPC for the routers, OTLP/HTTP for engines and client) scraping both
   engines' ``/metrics``;
2. two ``vllm.entrypoints.openai.api_server`` engines (started once, shared by both routers) with
   ``--otlp-traces-endpoint http://127.0.0.1:<http>/v1/traces --enable-request-id-headers
   --enable-prompt-tokens-details``;
3. the router with tracing, two warm-up requests, then ``--requests`` requests from the
   instrumented client (shared prefix, chat and completions, some streaming, each with an
   ``X-Request-Id``);
4. prints linked-row counts from ``requests`` / ``decisions`` and every row that failed to link.

``--engines testbed`` swaps the vLLM engines for two live testbed replicas (same wire format):
a quick check of this driver without the multi-GB install.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import audit  # noqa: E402
from collectors.client import run_load  # noqa: E402
from collectors.otlp import Collector, default_config  # noqa: E402
from collectors.routers import (  # noqa: E402
    RouterProcess,
    free_ports,
    start_smg,
    start_vllm_router,
)

SHARED_PREFIX = ("You are the assistant of a serving fleet. Answer briefly about routers, "
                 "replicas, caches and queues. ") * 6
WORDS = "router replica cache token batch queue prefix decode prefill latency".split()


def workload(n: int, prefix: str, model: str, seed: int = 0) -> list[dict[str, Any]]:
    """Short prompts (fit --max-model-len 512): every 2nd shares a ~130-token prefix; chat and
    completions alternate; every 3rd streams; one request every 100 ms."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        tail = " ".join(rng.choice(WORDS) for _ in range(rng.randint(8, 40)))
        text = (SHARED_PREFIX if i % 2 == 0 else "") + f"Question {i}: {tail}?"
        r: dict[str, Any] = {"request_id": f"{prefix}-{i:03d}", "at_s": 0.1 * i, "max_tokens": 16,
                             "stream": i % 3 == 0, "model": model}
        if i % 2:
            r["endpoint"] = "/v1/chat/completions"
            r["messages"] = [{"role": "user", "content": text}]
        else:
            r["endpoint"] = "/v1/completions"
            r["prompt"] = text
        out.append(r)
    return out


def start_engines(args: argparse.Namespace, ports: list[int], traces_url: str) -> list[Any]:
    procs: list[Any] = []
    if args.engines == "testbed":
        from testbed.live import LiveReplica, ServerThread, make_tracer_provider

        for p in ports:
            rid = f"127.0.0.1:{p}"
            tp = make_tracer_provider("replica", rid, otlp_endpoint=traces_url)
            srv = ServerThread(LiveReplica(rid, model=args.served_name, tracer_provider=tp).asgi,
                               "127.0.0.1", p, name=rid).start()
            procs.append((srv, tp))
        return procs
    for p in ports:
        rid = f"127.0.0.1:{p}"
        env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE="1", HF_HUB_OFFLINE="1",
                   TRANSFORMERS_OFFLINE="1", OTEL_EXPORTER_OTLP_TRACES_PROTOCOL="http/protobuf",
                   OTEL_SERVICE_NAME="vllm",
                   OTEL_RESOURCE_ATTRIBUTES=f"service.instance.id={rid},routeaudit.replica.id={rid}")
        cmd = [args.vllm_python, "-m", "vllm.entrypoints.openai.api_server", "--model", args.model,
               "--served-model-name", args.served_name, "--host", "127.0.0.1", "--port", str(p),
               "--otlp-traces-endpoint", traces_url, "--enable-request-id-headers",
               "--enable-prompt-tokens-details", "--max-model-len", "512", "--max-num-seqs", "4",
               "--dtype", "float32"]
        proc = RouterProcess(f"vllm-engine-{p}", cmd, host="127.0.0.1", port=p, metrics_port=p,
                             log_path=Path(args.work) / f"engine-{p}.log", env=env)
        procs.append(proc)
        proc.start(ready_timeout_s=args.engine_timeout)  # /health = 200 (35-45 s on 2 vCPU)
        print(f"engine {rid} ready after {proc.ready_s:.0f} s", flush=True)
    return procs


def stop_engines(procs: list[Any]) -> None:
    for p in procs:
        if isinstance(p, tuple):
            p[0].stop()
            p[1].shutdown()
        else:
            p.stop()


def report(reader: audit.Reader, run_id: str, router: str) -> int:
    q = reader.query
    summary = q(
        "select count(*) as rows, "
        "count(*) filter (where has_client and has_router and has_replica) as fully_linked, "
        "count(*) filter (where router_side_missing) as router_side_missing, "
        "count(*) filter (where not has_replica) as no_replica, "
        "count(*) filter (where chosen_replica = served_by) as chosen_eq_served, "
        "count(*) filter (where chosen_replica <> served_by) as chosen_ne_served, "
        "count(*) filter (where link_method = 'trace') as by_trace, "
        "count(*) filter (where link_method = 'request_id') as by_request_id, "
        "count(*) filter (where actual_cached_tokens > 0) as with_cache_hits "
        "from requests where run_id = ? and request_id not like '%warm%'", [run_id])
    print(f"\n== {router}: linked rows ==")
    print(summary)
    dec = q("select dialect, recorded, count(*) as decisions_incl_warmup from decisions "
            "where request_key in (select request_key from requests where run_id = ?) "
            "group by all", [run_id])
    print(dec)
    bad = q("select request_id, has_client, has_router, has_replica, link_method, chosen_replica, "
            "served_by, status, http_status from requests where run_id = ? and "
            "request_id not like '%warm%' and (not (has_client and has_router and has_replica) "
            "or chosen_replica is distinct from served_by) order by request_id", [run_id])
    print(f"rows that failed to link: {bad.height}")
    if bad.height:
        print(bad)
    return int(bad.filter(bad["chosen_replica"].is_not_null()
                          & (bad["chosen_replica"] != bad["served_by"])).height)


def wait_rows(reader: audit.Reader, run_id: str, want: int, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    last, since = -1, time.monotonic()
    while time.monotonic() < deadline:
        n = int(reader.query("select count(*) from requests where run_id = ? and has_router "
                             "and has_replica", [run_id]).item())
        if n >= want:
            return
        if n != last:
            last, since = n, time.monotonic()
        elif time.monotonic() - since > 8:
            return
        time.sleep(0.5)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--engines", choices=["vllm", "testbed"], default="vllm")
    ap.add_argument("--vllm-python", default=None, help="python of the vllm-cpu venv")
    ap.add_argument("--model", default=None, help="tiny model folder (make_model.py)")
    ap.add_argument("--served-name", default="tiny-llama")
    ap.add_argument("--work", default=".", help="store and logs go here")
    ap.add_argument("--routers", default="vllm-router,smg")
    ap.add_argument("--policy", default="round_robin")
    ap.add_argument("--requests", type=int, default=40)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--engine-timeout", type=float, default=600.0)
    args = ap.parse_args(argv)
    import polars as pl

    pl.Config.set_tbl_cols(-1)
    pl.Config.set_tbl_width_chars(220)
    if args.engines == "vllm" and not (args.vllm_python and args.model):
        ap.error("--engines vllm needs --vllm-python and --model")
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    db = work / "real_engine.duckdb"
    for f in work.glob("real_engine.duckdb*"):
        f.unlink()
    ports = free_ports(2)
    targets = [f"http://127.0.0.1:{p}/metrics" for p in ports]
    cfg = default_config(db_path=db, http_port=0, grpc_port=0, scrape_targets=targets,
                         scrape_interval_s=0.5, refresh_interval_s=1.0)
    wrong = 0
    t0 = time.monotonic()
    with Collector(cfg) as col:
        from testbed.live import make_tracer_provider

        engines: list[Any] = []
        try:
            engines = start_engines(args, ports, col.traces_url)
            worker_urls = [f"http://127.0.0.1:{p}" for p in ports]
            for name in [r.strip() for r in args.routers.split(",") if r.strip()]:
                run_id = f"real-{name}-{args.policy}-{int(time.time())}"
                start = {"vllm-router": start_vllm_router, "smg": start_smg}[name]
                tp = make_tracer_provider("client", "client-0", otlp_endpoint=col.traces_url,
                                          run_id=run_id)
                router: RouterProcess = start(worker_urls, policy=args.policy,
                                              otlp_traces_endpoint=col.grpc_target,
                                              log_path=work / f"{name}.log")
                try:
                    print(f"\n{name} ({args.policy}) ready after {router.ready_s:.1f} s",
                          flush=True)
                    warm = workload(2, f"{name}-warm", args.served_name, seed=1)
                    run_load(router.url, warm, 1, progress=False, run_id=run_id,
                             tracer_provider=tp)
                    reqs = workload(args.requests, f"{name}-{args.policy}", args.served_name)
                    t = time.monotonic()
                    res = run_load(router.url, reqs, args.concurrency, progress=False,
                                   run_id=run_id, tracer_provider=tp, timeout=120)
                    ok = sum(r.status == "ok" for r in res)
                    print(f"{ok}/{len(res)} ok in {time.monotonic() - t:.1f} s", flush=True)
                    assert tp is not None
                    tp.force_flush()
                    wait_rows(audit.open(db), run_id, len(reqs), 60)
                finally:
                    router.stop()
                    if tp is not None:
                        tp.shutdown()
                wrong += report(audit.open(db), run_id, name)
        finally:
            stop_engines(engines)
    print(f"\ntotal {time.monotonic() - t0:.0f} s; store {db}; rows with a WRONG chosen replica: "
          f"{wrong}")
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
