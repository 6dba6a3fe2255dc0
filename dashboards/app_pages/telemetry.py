"""Telemetry: how old the routers' view of the replicas was when they decided; herding."""

from __future__ import annotations

import altair as alt
import streamlit as st

from dashboards import _ui

st.title("Telemetry")
window = _ui.time_window()
st.caption("Telemetry age: how old each candidate's load data was at the decision instant, "
           f"for decisions taken {_ui.describe_window(window)}.")
_ui.stop_if_window_empty(window)

by_router = _ui.query_or_stop("telemetry_age_by_router", window=window)
if by_router.height == 0:
    st.info(_ui.NO_DECISIONS + " (or its candidates carry no telemetry age)")
else:
    cols = st.columns(max(1, min(by_router.height, 4)))
    for i, row in enumerate(by_router.head(4).iter_rows(named=True)):
        cols[i].metric(f"{row['router_id']} age p99", _ui.fmt_ms(row["age_p99"]),
                       help=f"p50 {_ui.fmt_ms(row['age_p50'])}, {row['candidates']:,} candidates")
    st.dataframe(by_router, hide_index=True)
    over_time = _ui.query("telemetry_age_over_time", _ui.BUCKETS, window=window)
    if not _ui.empty(over_time):
        long = over_time.unpivot(index=["bucket", "router_id"], variable_name="percentile",
                                 value_name="age_ms")
        _ui.chart(alt.Chart(long.to_pandas()).mark_line().encode(
            x=_ui.time_axis(), y=_ui.y_ms("age_ms", "telemetry age"),
            color=alt.Color("router_id:N", title="router"),
            strokeDash=alt.StrokeDash("percentile:N", title="percentile"),
            tooltip=[_ui.time_tooltip(), "router_id:N", "percentile:N",
                     alt.Tooltip("age_ms:Q", format=",.0f")],
        ).properties(title="Telemetry age at decision time", height=300))

st.subheader("Herding episodes")
if by_router.height == 0:
    st.info("Herding episodes are found in decision records; there are none yet.")
elif not _ui.has("herding_episodes"):
    st.info("The `herding_episodes` relation is not in this store yet (attribution layer).")
else:
    episodes = _ui.query("herding_episodes", _ui.TABLE_ROWS, window=window)
    if _ui.empty(episodes):
        st.success("No herding episodes detected.")
    else:
        total = int(episodes["episodes_total"][0])
        episodes = episodes.drop("episodes_total")
        if total > episodes.height:
            st.caption(f"The {episodes.height:,} largest of {total:,} episodes: most decisions on "
                       "one telemetry sample first.")
        lanes = episodes["replica"].n_unique()
        # points, not start-to-end bars: an episode's decisions share one telemetry sample and
        # often one instant, so its bar would be a pixel wide or none
        _ui.chart(alt.Chart(episodes.to_pandas()).mark_circle(opacity=0.6).encode(
            x=_ui.time_axis("started_at"), y=alt.Y("replica:N", title="replica"),
            size=alt.Size("decisions:Q", title="decisions"),
            tooltip=["replica:N", _ui.time_tooltip("started_at"), "decisions:Q",
                     "routers:Q", "unreflected_assignments:Q", "evidence:N"],
        ).properties(title="Episodes", height=max(100, 40 * lanes)))
        st.dataframe(episodes, hide_index=True)
