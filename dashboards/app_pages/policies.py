"""Policies: compare two runs (policies) on the same arrival trace."""

from __future__ import annotations

import altair as alt
import polars as pl
import streamlit as st

from dashboards import _ui

st.title("Policies")
slo = _ui.slo()
window = _ui.time_window()
st.caption("Two runs replaying the same trace under different policies, over their requests "
           f"started {_ui.describe_window(window)}. Latency percentiles cover successful "
           "requests; failures are shown separately.")
_ui.stop_if_window_empty(window)

runs = _ui.query_or_stop("run_list", window=window)
if runs.height == 0:
    where = ("in this store" if window.is_all
             else f"among the requests started {_ui.describe_window(window)}")
    st.info(f"No runs {where}: requests carry no `run_id` (set it with the testbed or the "
            "load generator).")
    st.stop()
labels = {f"{r['run_id']} ({r['policies']}, {r['requests']:,} req)": r["run_id"]
          for r in runs.iter_rows(named=True)}
names = list(labels)
cols = st.columns(2)
a = cols[0].selectbox("Run A", names, index=0, key="policy_run_a")
b = cols[1].selectbox("Run B", names, index=min(1, len(names) - 1), key="policy_run_b")
chosen = list(dict.fromkeys([labels[a], labels[b]]))

cmp = _ui.query("run_summaries", chosen, slo, window=window)
if _ui.empty(cmp):
    st.stop()
if cmp.height == 2 and cmp["requests"][0] != cmp["requests"][1]:
    st.warning("The two runs have different request counts: are they replays of the same trace?")

# One column per row of the comparison rather than per chosen run: run_summaries returns a row
# only for the runs it finds, in a read (and cache entry) apart from run_list's, so the pairing
# holds by construction and strict= can never fire.
run_cols = st.columns(cmp.height)
for col, row in zip(run_cols, cmp.iter_rows(named=True), strict=True):
    with col:
        st.markdown(f"**{row['run_id']}**")
        st.metric("Goodput (req/s)", f"{row['goodput_rps']:.2f}")
        st.metric("SLO attainment", _ui.fmt_pct(row["attainment"]))
        st.metric("Failures", f"{row['failed']:,}")

metrics = ["ttft_p50", "ttft_p90", "ttft_p99", "tpot_p50", "tpot_p90", "tpot_p99"]
long = cmp.select("run_id", *metrics).unpivot(index="run_id", variable_name="metric",
                                              value_name="ms")
long = long.with_columns(
    pl.col("metric").str.split("_").list.get(0).str.to_uppercase().alias("latency"),
    pl.col("metric").str.split("_").list.get(1).alias("percentile"),
)
_ui.chart(alt.Chart(long.to_pandas()).mark_bar().encode(
    x=alt.X("percentile:N", title="percentile"),
    xOffset="run_id:N",
    y=alt.Y("ms:Q", title="latency (ms)"),
    color=alt.Color("run_id:N", title="run"),
    column=alt.Column("latency:N", title=None),
    tooltip=["run_id:N", "metric:N", alt.Tooltip("ms:Q", format=",.1f")],
).properties(width=260, height=260).resolve_scale(y="independent"))
st.dataframe(cmp, hide_index=True)

st.subheader("Failures")
failures = _ui.query("run_failures", chosen, window=window)
if _ui.empty(failures):
    st.success("No failed requests in these runs.")
else:
    _ui.chart(alt.Chart(failures.to_pandas()).mark_bar().encode(
        x=alt.X("requests:Q", title="failed requests (count)"),
        y=alt.Y("kind:N", title="status / HTTP status"),
        color=alt.Color("run_id:N", title="run"), yOffset="run_id:N",
        tooltip=["run_id:N", "kind:N", "requests:Q"],
    ).properties(height=alt.Step(20)))
