"""Slow requests: which requests missed the SLO, their primary cause, excess and evidence."""

from __future__ import annotations

import altair as alt
import streamlit as st

from dashboards import _ui

ALL = "(all)"

st.title("Slow requests")
slo = _ui.slo()
window = _ui.time_window()
st.caption(f"Requests started {_ui.describe_window(window)} that succeeded but missed "
           f"TTFT ≤ {slo.ttft_ms:,.0f} ms or TPOT ≤ {slo.tpot_ms:,.0f} ms. Pick a row to open "
           "its drill-down.")
_ui.stop_if_window_empty(window)

opts = _ui.query_or_stop("filter_options", window=window)
if opts["first_at"] is None:
    st.info(_ui.NO_REQUESTS)
    st.stop()
attributed = _ui.has("attributions", "request_key", "request_id", "cause", "excess_ms",
                     "is_primary")
if not attributed:
    st.info(_ui.NO_ATTRIBUTION)


def pick(col: st.delta_generator.DeltaGenerator, label: str, choices: list[str]) -> str | None:
    value = col.selectbox(label, [ALL, *choices], key=f"slow_{label}")
    return None if value == ALL else value


# Every cause seen under these SLO targets (the unfiltered page, also shown when no filter is
# set; one query computes the table and the breakdown together).
unfiltered = _ui.query("slow_page", slo, window=window)
causes = [] if unfiltered is None else unfiltered.causes["cause"].to_list()

cols = st.columns(5)
replica = pick(cols[0], "Replica", opts["replicas"])
router = pick(cols[1], "Router", opts["routers"])
policy = pick(cols[2], "Policy", opts["policies"])
run = pick(cols[3], "Run", opts["runs"])
cause = pick(cols[4], "Cause", causes)

filters = dict(replica=replica, router=router, policy=policy, run=run, cause=cause)
page = (unfiltered if not any(v is not None for v in filters.values())
        else _ui.query("slow_page", slo, window=window, **filters))
if page is None:
    st.stop()
table, breakdown = page.requests, page.causes
if breakdown.height == 0:
    st.success("No slow requests for these filters and SLO targets.")
    st.stop()

total = int(breakdown["requests"].sum())
tiles = st.columns(3)
tiles[0].metric("Slow requests", f"{total:,}")
tiles[1].metric("Total excess", _ui.fmt_ms(float(breakdown["total_excess_ms"].sum())))
tiles[2].metric("Top cause", str(breakdown["cause"][0]))

st.subheader("Causes")
left, right = st.columns(2)
bd = breakdown.to_pandas()
with left:
    _ui.chart(alt.Chart(bd).mark_bar().encode(
        x=alt.X("requests:Q", title="slow requests (count)"),
        y=alt.Y("cause:N", title="primary cause", sort=None),
        tooltip=["cause:N", "requests:Q", alt.Tooltip("share:Q", format=".1%")],
    ).properties(title="By count", height=alt.Step(30)))
with right:
    _ui.chart(alt.Chart(bd).mark_bar(color="#d62728").encode(
        x=alt.X("total_excess_ms:Q", title="total excess (ms)"),
        y=alt.Y("cause:N", title="primary cause", sort=None),
        tooltip=["cause:N", alt.Tooltip("total_excess_ms:Q", format=",.0f")],
    ).properties(title="By total excess ms", height=alt.Step(30)))

st.subheader(f"Worst {table.height} slow requests")
event = st.dataframe(
    table,
    hide_index=True,
    on_select="rerun",
    selection_mode="single-row",
    key="slow_table",
    column_config={
        "started_at": st.column_config.DatetimeColumn("started (UTC)"),
        "ttft_ms": st.column_config.NumberColumn("TTFT (ms)", format="%.0f"),
        "tpot_ms": st.column_config.NumberColumn("TPOT (ms)", format="%.1f"),
        "over_slo_ms": st.column_config.NumberColumn("over SLO (ms)", format="%.0f"),
        "excess_ms": st.column_config.NumberColumn("attributed excess (ms)", format="%.0f"),
    },
)
rows = event.selection.rows if event is not None else []
if rows:
    chosen = table.row(rows[0], named=True)
    st.session_state["request_id"] = str(chosen["request_id"])
    st.session_state["request_key"] = str(chosen["request_key"])
    st.switch_page("app_pages/request.py", query_params={
        "request_id": str(chosen["request_id"]), "request_key": str(chosen["request_key"])})

picks = {r["request_key"]: r for r in table.iter_rows(named=True)}
picked = st.selectbox(
    "Or open a request", list(picks), key="slow_pick",
    # ids may repeat (across runs): the run and the send time tell such requests apart
    format_func=lambda k: f"{picks[k]['request_id']} · run {picks[k]['run_id']} · "
                          f"{picks[k]['started_at']}")
if picked:
    st.page_link("app_pages/request.py", label=f"Drill down into {picks[picked]['request_id']} →",
                 query_params={"request_id": str(picks[picked]["request_id"]), "request_key": picked})
