"""vllm-router with OpenTelemetry tracing: the package's own command line plus the tracing flags
its CLI does not expose.

    python -m collectors.routers.vllm_router --host 127.0.0.1 --port 8000 \\
        --worker-urls http://127.0.0.1:8001 http://127.0.0.1:8002 --policy round_robin \\
        --otlp-traces-endpoint 127.0.0.1:4317

Every ``vllm-router`` flag is accepted (the parser is ``vllm_router.router_args.RouterArgs``'s);
added here:

* ``--otlp-traces-endpoint HOST:PORT`` — OTLP/**gRPC** endpoint (e.g. ``routeaudit collect``'s
  gRPC port, 4317); a ``http://`` prefix is dropped. Giving it turns tracing on.
* ``--enable-trace`` — tracing to the default endpoint (``localhost:4317``) when no endpoint is
  given.
* ``--print-config`` — print the keyword arguments for ``vllm_router_rs.Router`` and exit.

The router object is built exactly as ``vllm_router.router.Router.from_args`` builds it (what
``vllm-router`` runs), with ``enable_trace=True, otlp_traces_endpoint=...`` added: the Rust
core's constructor accepts both, only the Python CLI lacks them (vllm-router 0.1.17).
``start()`` blocks until SIGINT/SIGTERM. Tested with vllm-router 0.1.17.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

DEFAULT_OTLP_ENDPOINT = "localhost:4317"
_TRACE_DEST = ("otlp_traces_endpoint", "enable_trace", "print_config")


def build_parser() -> argparse.ArgumentParser:
    from vllm_router.router_args import RouterArgs

    parser = argparse.ArgumentParser(
        prog="python -m collectors.routers.vllm_router",
        description="vllm-router (its own CLI) with OpenTelemetry tracing switched on.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    RouterArgs.add_cli_args(parser, use_router_prefix=False)
    grp = parser.add_argument_group("Tracing (added by routeaudit)")
    grp.add_argument("--otlp-traces-endpoint", default=None, metavar="HOST:PORT",
                     help="OTLP/gRPC endpoint for spans; turns tracing on")
    grp.add_argument("--enable-trace", action="store_true",
                     help=f"trace to {DEFAULT_OTLP_ENDPOINT} when no endpoint is given")
    grp.add_argument("--print-config", action="store_true",
                     help="print the vllm_router_rs.Router keyword arguments and exit")
    return parser


def _endpoint(value: str) -> str:
    ep = value.strip()
    for scheme in ("http://", "https://", "grpc://"):
        if ep.startswith(scheme):
            ep = ep[len(scheme):]
    return ep.rstrip("/")


def router_kwargs(argv: Sequence[str] | None = None) -> tuple[dict[str, Any], bool]:
    """(keyword arguments for ``vllm_router_rs.Router``, print_config) from a command line.
    Mirrors ``vllm_router.router.Router.from_args``; the policies stay strings here (see
    :func:`to_rust`)."""
    from vllm_router.router_args import RouterArgs

    ns = build_parser().parse_args(argv)
    extra = {k: getattr(ns, k) for k in _TRACE_DEST}
    for k in _TRACE_DEST:
        delattr(ns, k)
    args = RouterArgs.from_cli_args(ns, use_router_prefix=False)
    args._validate_router_args()  # noqa: SLF001 - what vllm-router's launcher calls
    if args.mini_lb:
        raise SystemExit("--mini-lb is vllm-router's Python debugging balancer: no tracing there")
    kw = dict(vars(args))
    kw["worker_urls"] = ([] if kw["service_discovery"] or kw["vllm_pd_disaggregation"]
                         else kw["worker_urls"])
    kw["prefill_urls"] = kw["prefill_urls"] if kw["vllm_pd_disaggregation"] else None
    kw["decode_urls"] = kw["decode_urls"] if kw["vllm_pd_disaggregation"] else None
    kw.pop("mini_lb")
    endpoint = extra["otlp_traces_endpoint"]
    if endpoint or extra["enable_trace"]:
        kw["enable_trace"] = True
        kw["otlp_traces_endpoint"] = _endpoint(endpoint or DEFAULT_OTLP_ENDPOINT)
    return kw, bool(extra["print_config"])


def to_rust(kw: dict[str, Any]) -> dict[str, Any]:
    """Policy names → ``vllm_router_rs.PolicyType`` (as ``Router.from_args`` does)."""
    from vllm_router.router import policy_from_str

    out = dict(kw)
    for key in ("policy", "prefill_policy", "decode_policy"):
        out[key] = policy_from_str(out.get(key))
    return out


def main(argv: Sequence[str] | None = None) -> int:
    kw, print_config = router_kwargs(argv)
    if print_config:
        print(json.dumps(kw, indent=2, sort_keys=True, default=str))
        return 0
    import setproctitle
    from vllm_router_rs import Router

    setproctitle.setproctitle("vllm::router")
    Router(**to_rust(kw)).start()  # blocks until SIGINT / SIGTERM
    return 0


if __name__ == "__main__":
    sys.exit(main())
