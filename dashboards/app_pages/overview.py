"""Overview: how the fleet did — requests, SLO attainment, goodput, latency, load, failures."""

from __future__ import annotations

import altair as alt
import streamlit as st

from dashboards import _ui

st.title("Overview")
slo = _ui.slo()
window = _ui.time_window()
st.caption(f"Requests started {_ui.describe_window(window)}. SLO: TTFT ≤ {slo.ttft_ms:,.0f} ms "
           f"and TPOT ≤ {slo.tpot_ms:,.0f} ms; failures are counted apart from slow requests.")
_ui.stop_if_window_empty(window)

totals = _ui.query("overview_totals", slo, window=window)
if _ui.empty(totals) or totals["requests"][0] == 0:
    st.info(_ui.NO_REQUESTS)
    st.stop()
t = totals.row(0, named=True)

cols = st.columns(6)
cols[0].metric("Requests", f"{t['requests']:,}")
cols[1].metric("SLO attainment", _ui.fmt_pct(t["attainment"]))
cols[2].metric("Goodput (req/s)", f"{t['goodput_rps']:.2f}",
               help="requests meeting the SLO per second of the observed window")
cols[3].metric("Slow", f"{t['slow']:,}")
cols[4].metric("Failed", f"{t['failed']:,}")
cols[5].metric("TTFT p99", _ui.fmt_ms(t["ttft_p99"]))

st.subheader("Latency percentiles (successful requests)")
cols = st.columns(6)
for i, (label, key) in enumerate([("TTFT p50", "ttft_p50"), ("TTFT p90", "ttft_p90"),
                                  ("TTFT p99", "ttft_p99"), ("TPOT p50", "tpot_p50"),
                                  ("TPOT p90", "tpot_p90"), ("TPOT p99", "tpot_p99")]):
    cols[i].metric(label, _ui.fmt_ms(t[key]))

over_time = _ui.query("requests_over_time", slo, _ui.BUCKETS, window=window)
if not _ui.empty(over_time):
    bucket_s = int(over_time["bucket_s"][0])
    st.subheader(f"Over time ({bucket_s} s buckets)")
    left, right = st.columns(2)
    with left:
        _ui.chart(alt.Chart(over_time.to_pandas()).mark_line(point=True).encode(
            x=_ui.time_axis(),
            y=alt.Y("attainment:Q", title="SLO attainment (fraction of requests)",
                    scale=alt.Scale(domain=[0, 1])),
            tooltip=[_ui.time_tooltip(), "requests:Q", "good:Q", "failed:Q",
                     alt.Tooltip("attainment:Q", format=".1%")],
        ).properties(title="SLO attainment", height=260))
    with right:
        _ui.chart(alt.Chart(over_time.to_pandas()).mark_area(opacity=0.6).encode(
            x=_ui.time_axis(),
            y=alt.Y("goodput_rps:Q", title="goodput (requests meeting SLO per s)"),
            tooltip=[_ui.time_tooltip(), alt.Tooltip("goodput_rps:Q", format=".2f")],
        ).properties(title="Goodput", height=260))
    ttft = over_time.select("bucket", "ttft_p50", "ttft_p99").unpivot(
        index="bucket", variable_name="percentile", value_name="ttft_ms")
    _ui.chart(alt.Chart(ttft.to_pandas()).mark_line().encode(
        x=_ui.time_axis(), y=_ui.y_ms("ttft_ms", "TTFT"),
        color=alt.Color("percentile:N", title="percentile"),
        tooltip=[_ui.time_tooltip(), "percentile:N", alt.Tooltip("ttft_ms:Q", format=",.0f")],
    ).properties(title="TTFT over time", height=240))

st.subheader("Per-replica load: true vs what routers saw")
load = _ui.query("replica_load_over_time", _ui.BUCKETS, window=window)
if _ui.empty(load):
    st.info("No replica executions or decision records yet: are the replicas and the router "
            "instrumented?")
else:
    _ui.chart(alt.Chart(load.to_pandas()).mark_line().encode(
        x=_ui.time_axis(),
        y=alt.Y("load:Q", title="load (requests in flight / waiting + running seen)"),
        color=alt.Color("replica:N", title="replica"),
        strokeDash=alt.StrokeDash("source:N", title="source"),
        tooltip=[_ui.time_tooltip(), "replica:N", "source:N", alt.Tooltip("load:Q", format=".1f")],
    ).properties(height=300))

st.subheader("Failures by kind")
failures = _ui.query("failures_by_kind", window=window)
if _ui.empty(failures):
    st.success("No failed requests.")
else:
    _ui.chart(alt.Chart(failures.to_pandas()).mark_bar().encode(
        x=alt.X("requests:Q", title="failed requests (count)"),
        y=alt.Y("kind:N", title="status / HTTP status", sort=None),
        tooltip=["kind:N", "requests:Q"],
    ).properties(height=alt.Step(30)))
