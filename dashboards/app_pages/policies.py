"""Policies: compare two runs (policies) on the same arrival trace, or the router's policies over
the time window when requests carry no run id."""

from __future__ import annotations

import altair as alt
import polars as pl
import streamlit as st

from dashboards import _ui

st.title("Policies")
slo = _ui.slo()
window = _ui.time_window()
_ui.stop_if_window_empty(window)

# Replays of one trace carry a run id each (the testbed, the load generator); a production fleet's
# requests carry none, and its router's policies are compared over the time window instead.
runs = _ui.query_or_stop("run_list", window=window)
by_policy = _ui.query_or_stop("run_list", window=window, by="policy")
choices = [c for c, found in (("run", runs), ("router policy", by_policy)) if found.height]
if not choices:
    where = ("in this store" if window.is_all
             else f"among the requests started {_ui.describe_window(window)}")
    st.info(f"Nothing to compare {where}: requests carry neither a `run_id` (set it with the "
            "testbed or the load generator) nor a router policy (a decision span's "
            "`routeaudit.router.policy`).")
    st.stop()
unit = st.radio("Compare", choices, horizontal=True, key="policy_compare_by")
by = "run_id" if unit == "run" else "policy"
groups = runs if by == "run_id" else by_policy
if by == "run_id":
    st.caption("Two runs replaying the same trace under different policies, over their requests "
               f"started {_ui.describe_window(window)}. Latency percentiles cover successful "
               "requests; failures are shown separately.")
else:
    st.caption("The router's policies over the requests they placed, started "
               f"{_ui.describe_window(window)}: not a replay of one trace, so differences also "
               "reflect when and what each policy served. Latency percentiles cover successful "
               "requests; failures are shown separately.")
labels = {f"{r[by]} ({r['requests']:,} req)" if by == "policy"
          else f"{r[by]} ({r['policies']}, {r['requests']:,} req)": r[by]
          for r in groups.iter_rows(named=True)}
names = list(labels)
cols = st.columns(2)
noun = "Run" if by == "run_id" else "Policy"
a = cols[0].selectbox(f"{noun} A", names, index=0, key=f"policy_{by}_a")
b = cols[1].selectbox(f"{noun} B", names, index=min(1, len(names) - 1), key=f"policy_{by}_b")
chosen = list(dict.fromkeys([labels[a], labels[b]]))

cmp = _ui.query("run_summaries", chosen, slo, window=window, by=by)
if _ui.empty(cmp):
    st.stop()
if by == "run_id" and cmp.height == 2 and cmp["requests"][0] != cmp["requests"][1]:
    st.warning("The two runs have different request counts: are they replays of the same trace?")

# One column per row of the comparison rather than per chosen run: run_summaries returns a row
# only for the runs it finds, in a read (and cache entry) apart from run_list's, so the pairing
# holds by construction and strict= can never fire.
run_cols = st.columns(cmp.height)
for col, row in zip(run_cols, cmp.iter_rows(named=True), strict=True):
    with col:
        st.markdown(f"**{row[by]}**")
        st.metric("Goodput (req/s)", f"{row['goodput_rps']:.2f}")
        st.metric("SLO attainment", _ui.fmt_pct(row["attainment"]))
        st.metric("Failures", f"{row['failed']:,}")

metrics = ["ttft_p50", "ttft_p90", "ttft_p99", "tpot_p50", "tpot_p90", "tpot_p99"]
long = cmp.select(pl.col(by).alias("group"), *metrics).unpivot(
    index="group", variable_name="metric", value_name="ms")
long = long.with_columns(
    pl.col("metric").str.split("_").list.get(0).str.to_uppercase().alias("latency"),
    pl.col("metric").str.split("_").list.get(1).alias("percentile"),
)
_ui.chart(alt.Chart(long.to_pandas()).mark_bar().encode(
    x=alt.X("percentile:N", title="percentile"),
    xOffset="group:N",
    y=alt.Y("ms:Q", title="latency (ms)"),
    color=alt.Color("group:N", title=noun.lower()),
    column=alt.Column("latency:N", title=None),
    tooltip=["group:N", "metric:N", alt.Tooltip("ms:Q", format=",.1f")],
).properties(width=260, height=260).resolve_scale(y="independent"))
st.dataframe(cmp, hide_index=True)

st.subheader("Failures")
failures = _ui.query("run_failures", chosen, window=window, by=by)
if _ui.empty(failures):
    st.success(f"No failed requests in these {noun.lower()}s.")
else:
    failures = failures.rename({by: "group"})
    _ui.chart(alt.Chart(failures.to_pandas()).mark_bar().encode(
        x=alt.X("requests:Q", title="failed requests (count)"),
        y=alt.Y("kind:N", title="status / HTTP status"),
        color=alt.Color("group:N", title=noun.lower()), yOffset="group:N",
        tooltip=["group:N", "kind:N", "requests:Q"],
    ).properties(height=alt.Step(20)))
