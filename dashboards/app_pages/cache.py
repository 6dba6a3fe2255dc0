"""Cache: how well routers predicted prefix-cache hits, per replica and policy; misses over time."""

from __future__ import annotations

import altair as alt
import polars as pl
import streamlit as st

from dashboards import _ui

st.title("Cache")
window = _ui.time_window()
st.caption("Predicted cached tokens (router, at decision time) vs actual cached tokens "
           f"(replica) for each request with both, started {_ui.describe_window(window)}.")
_ui.stop_if_window_empty(window)

summary = _ui.query_or_stop("cache_by_replica", window=window)
if summary.height == 0:
    st.info("No requests with both predicted and actual cached tokens yet: does the router "
            "record `predicted_cached_tokens`, and does the replica report cached tokens?")
else:
    n = int(summary["requests"].sum())
    over = int(summary["over_predicted"].sum())
    cols = st.columns(3)
    cols[0].metric("Requests with both", f"{n:,}")
    cols[1].metric("Over-predicted", f"{over:,}", help="predicted > actual cached tokens")
    mae = float((summary["mean_abs_error"] * summary["requests"]).sum()) / n
    cols[2].metric("Mean abs error", f"{mae:,.0f} tokens")

    left, right = st.columns(2)
    with left:
        st.subheader("Predicted vs actual")
        scatter = _ui.query("cache_scatter", window=window)
        if not _ui.empty(scatter):
            pts = alt.Chart(scatter.to_pandas()).mark_circle(opacity=0.5).encode(
                x=alt.X("predicted:Q", title="predicted cached tokens (tokens)"),
                y=alt.Y("actual:Q", title="actual cached tokens (tokens)"),
                color=alt.Color("replica:N", title="replica"),
                shape=alt.Shape("policy:N", title="policy"),
                tooltip=["request_id:N", "replica:N", "policy:N", "predicted:Q", "actual:Q"],
            )
            top = float(max(scatter["predicted"].max() or 0, scatter["actual"].max() or 0))
            diag = alt.Chart(
                # alt.Data (untyped __init__ in altair's generated schema) keeps the two points
                # inline; InlineData or a dict would move them to a named top-level dataset
                alt.Data(values=[{"x": 0, "y": 0}, {"x": top, "y": top}])  # type: ignore[no-untyped-call]
            ).mark_line(color="gray", strokeDash=[4, 4]).encode(x="x:Q", y="y:Q")
            _ui.chart((pts + diag).properties(height=340))
    with right:
        st.subheader("Hit / miss confusion")
        confusion = _ui.query("cache_confusion", window=window)
        if not _ui.empty(confusion):
            totals = confusion.group_by("predicted", "actual").agg(
                requests=pl.col("requests").sum())
            base = alt.Chart(totals.to_pandas()).encode(
                x=alt.X("predicted:N", title="router predicted"),
                y=alt.Y("actual:N", title="replica reported"),
            )
            heat = base.mark_rect().encode(
                color=alt.Color("requests:Q", title="requests (count)"))
            labels = base.mark_text(fontSize=16).encode(text="requests:Q")
            _ui.chart((heat + labels).properties(height=340))
            with st.expander("Per replica and policy"):
                st.dataframe(confusion, hide_index=True)
    st.dataframe(summary, hide_index=True)

st.subheader("Predicted-but-missing cached tokens over time")
st.caption("Tokens a router expected to be cached that the replica did not find: evictions "
           "(or a wrong prefix index).")
misses = None if summary.height == 0 else _ui.query("cache_misses_over_time", _ui.BUCKETS,
                                                             window=window)
if misses is None or _ui.empty(misses):
    st.info("Nothing to show yet.")
else:
    _ui.chart(alt.Chart(misses.to_pandas()).mark_bar().encode(
        x=_ui.time_axis(),
        y=alt.Y("missing_tokens:Q", title="missing cached tokens (tokens)"),
        color=alt.Color("replica:N", title="replica"),
        tooltip=[_ui.time_tooltip(), "replica:N", "missing_tokens:Q", "over_predicted:Q"],
    ).properties(height=260))

st.subheader("Engine prefix-cache hit rate")
hit = _ui.query("cache_hit_rate_over_time", _ui.BUCKETS, window=window)
if _ui.empty(hit):
    st.info("No replica scrapes yet: is `routeaudit collect` scraping the replicas' /metrics?")
else:
    _ui.chart(alt.Chart(hit.to_pandas()).mark_line().encode(
        x=_ui.time_axis(),
        y=alt.Y("prefix_cache_hit_rate:Q", title="prefix-cache hit rate (fraction)",
                scale=alt.Scale(domain=[0, 1])),
        color=alt.Color("replica:N", title="replica"),
        tooltip=[_ui.time_tooltip(), "replica:N", alt.Tooltip("prefix_cache_hit_rate:Q", format=".2f"),
                 alt.Tooltip("kv_usage:Q", format=".2f")],
    ).properties(height=260))
