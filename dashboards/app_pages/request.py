"""Request drill-down: one request's timeline, its routing decision beside the truth, verdict."""

from __future__ import annotations

import altair as alt
import streamlit as st

from dashboards import _ui

st.title("Request drill-down")

default_id = st.query_params.get("request_id") or st.session_state.get("request_id") or ""
request_id = st.text_input("Request id (or request key)", value=default_id,
                           key="drill_request_id").strip()
if not request_id:
    st.info("Pick a request on the Slow requests page, or paste a request id (X-Request-Id).")
    st.stop()
if st.query_params.get("request_id") != request_id:
    st.query_params["request_id"] = request_id

wanted = st.query_params.get("request_key") or st.session_state.get("request_key")
window = _ui.time_window()
matches = _ui.query_or_stop("request_matches", request_id, prefer=wanted, window=window)
outside = ("none" if matches.height == 0
           else "linked" if wanted and wanted not in matches["request_key"].to_list() else None)
if outside is not None and not window.is_all:
    # a pasted id or a link names a request: it opens wherever it is in the store
    matches = _ui.query_or_stop("request_matches", request_id, prefer=wanted)
    if matches.height:
        st.caption((f"No request `{request_id}` started" if outside == "none"
                    else "The linked request did not start")
                   + f" {_ui.describe_window(window)}: listed from the whole store.")
if matches.height == 0:
    st.warning(f"No request `{request_id}` in `requests`.")
    st.stop()
keys = matches["request_key"].to_list()
if len(keys) > 1:
    # request ids repeat (capture runs, replays, clients reusing X-Request-Id): pick one
    labels = {m["request_key"]: f"run {m['run_id']} · started {m['started_at']} · {m['status']} · "
              f"key {m['request_key']}" for m in matches.iter_rows(named=True)}
    total = int(matches["matching"][0])
    st.caption(f"{total:,} requests carry the id `{request_id}`"
               + (f" (the latest {len(keys)} listed)." if total > len(keys) else "."))
    request_key = st.selectbox("Which request", keys, index=keys.index(wanted) if wanted in keys
                               else 0, format_func=labels.__getitem__, key="drill_request_key")
else:
    request_key = keys[0]
if st.query_params.get("request_key") != request_key:
    st.query_params["request_key"] = request_key
# when it started: its queries read only the partitions near it, not the whole history
at = matches.filter(matches["request_key"] == request_key)["started_at"][0]

def _served_by(r: dict[str, object]) -> str:
    if r["served_by"] is not None:
        return f"`{r['served_by']}`"
    return "no replica (no replica span: the request never ran, or its replica is not instrumented)"


detail = _ui.query("request_detail", request_key, at=at)
if _ui.empty(detail):
    st.stop()
r = detail.row(0, named=True)
slo = _ui.slo()

cols = st.columns(5)
cols[0].metric("Status", str(r["status"]))
if r.get("failure_reason"):
    st.warning(f"Failed ({r['status']}), seen by the {r.get('failure_source') or 'unknown side'}: "
             f"{r['failure_reason']}")
cols[1].metric("TTFT", _ui.fmt_ms(r["ttft_ms"]),
               delta=None if r["ttft_ms"] is None
               else f"{r['ttft_ms'] - slo.ttft_ms:+,.0f} ms vs SLO",
               delta_color="inverse")
cols[2].metric("TPOT", _ui.fmt_ms(r["tpot_ms"]))
cols[3].metric("E2E", _ui.fmt_ms(r["e2e_ms"]))
cols[4].metric("Chosen replica", str(r["chosen_replica"]))
st.caption(f"policy `{r['policy']}` · router `{r['router_id']}` · run `{r['run_id']}` · "
           f"served by {_served_by(r)} · attempts {r['attempts']} · input "
           f"{r['input_tokens']} tokens · output {r['output_tokens']} tokens · sides seen: "
           f"client={r['has_client']}, router={r['has_router']}, replica={r['has_replica']} · "
           f"link {r['link_method']}" + (" · ⚠ clock suspect" if r["clock_suspect"] else ""))

st.subheader("Verdict")
# the request's id and the relations the page already has: a query each less
known = _ui.query("relation_columns")
attributions = _ui.query("request_attributions", request_key, slo, at=at,
                         request_id=r["request_id"], known=known)
if attributions is None:
    pass
elif attributions.height == 0:
    if _ui.has("attributions"):
        st.info("No cause attributed to this request.")
    else:
        st.info(_ui.NO_ATTRIBUTION)
else:
    top = attributions.row(0, named=True)
    st.markdown(f"**Primary cause: {top['cause']}**"
                + (f" ({top['sub_kind']})" if top.get("sub_kind") else "")
                + f" — {_ui.fmt_ms(top.get('excess_ms'))} excess, confidence "
                f"{top.get('confidence')}")
    if top.get("evidence"):
        st.markdown(f"Evidence ({top.get('evidence_source')}): {top['evidence']}")
    st.dataframe(attributions, hide_index=True)

st.subheader("Timeline (reference clock)")
waterfall = _ui.query("request_waterfall", request_key, at=at)
if _ui.empty(waterfall):
    st.info("No timed spans for this request.")
else:
    _ui.chart(alt.Chart(waterfall.to_pandas()).mark_bar().encode(
        x=alt.X("start_ms:Q", title="time since the request's first span (ms)"),
        x2="end_ms:Q",
        y=alt.Y("phase:N", title=None, sort=None,
                axis=alt.Axis(labelLimit=320, labelOverlap=False)),
        color=alt.Color("lane:N", title="side"),
        tooltip=["lane:N", "phase:N", alt.Tooltip("start_ms:Q", format=",.1f"),
                 alt.Tooltip("duration_ms:Q", format=",.1f")],
    ).properties(height=max(120, 36 * waterfall.height)))

st.subheader("Decision record")
decisions = _ui.query("request_decisions", request_key, at=at)
if _ui.empty(decisions):
    st.info(_ui.NO_DECISIONS)
else:
    for d in decisions.iter_rows(named=True):
        st.markdown(f"Attempt {d['attempt']}: router `{d['router_id']}` ({d['policy']}) chose "
                    f"**{d['chosen_replica']}** because *{d['reason']}* → {d['outcome']}"
                    + ("" if d["recorded"] in (None, True) else " (reconstructed from snapshots)"))
    candidates = _ui.query("request_candidates", request_key, at=at)
    if _ui.empty(candidates):
        st.info("The decision carries no candidate records.")
    else:
        st.caption("Left: what the router saw (telemetry, estimates, score). Right: the true "
                   "state at the decision instant (requests executing on the replica; latest "
                   "scrape).")
        st.dataframe(candidates, hide_index=True, column_config={
            "telemetry_age_ms": st.column_config.NumberColumn("telemetry age (ms)",
                                                              format="%.0f"),
            "est_queue_ms": st.column_config.NumberColumn("est. queue (ms)", format="%.0f"),
            "est_prefill_ms": st.column_config.NumberColumn("est. prefill (ms)", format="%.0f"),
            "scrape_age_ms": st.column_config.NumberColumn("scrape age (ms)", format="%.0f"),
        })

st.subheader("Cached tokens: predicted vs actual")
cached = st.columns(3)
cached[0].metric("Predicted cached tokens", "–" if r["predicted_cached_tokens"] is None
                 else f"{r['predicted_cached_tokens']:,}")
cached[1].metric("Actual cached tokens", "–" if r["actual_cached_tokens"] is None
                 else f"{r['actual_cached_tokens']:,}")
cached[2].metric("Input tokens", "–" if r["input_tokens"] is None else f"{r['input_tokens']:,}")

with st.expander("Raw spans (each emitter's own clock)"):
    spans = _ui.query("request_spans", request_key, at=at, known=known)
    if _ui.empty(spans):
        st.info("No raw spans carry this request id or trace.")
    else:
        st.dataframe(spans, hide_index=True)
