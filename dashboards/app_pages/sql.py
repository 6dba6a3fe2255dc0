"""SQL: a read-only query box over the store, with examples and CSV download."""

from __future__ import annotations

import json

import polars as pl
import streamlit as st

from audit import queries
from dashboards import _ui

MAX_ROWS = 10_000


def to_csv(df: pl.DataFrame) -> str:
    """CSV of ``df``; lists and structs (CSV has no nesting) become JSON text."""
    nested = [c for c, t in df.schema.items() if t.is_nested()]
    if nested:
        df = df.with_columns(
            pl.Series(c, [None if v is None else json.dumps(v, default=str)
                          for v in df[c].to_list()], dtype=pl.String)
            for c in nested
        )
    return df.write_csv()

st.title("SQL")
st.caption("Read-only: SELECT, WITH, DESCRIBE, SHOW, SUMMARIZE, EXPLAIN. Writes, ATTACH, COPY, "
           "INSTALL and file access are refused. Relations: "
           + ", ".join(f"`{n}`" for n in _ui.reader().relations()))

example = st.selectbox("Example", ["(none)", *queries.EXAMPLE_QUERIES], key="sql_example")
if example != "(none)" and st.session_state.get("sql_loaded_example") != example:
    st.session_state["sql_text"] = queries.EXAMPLE_QUERIES[example]
    st.session_state["sql_loaded_example"] = example
sql = st.text_area("Query", key="sql_text", height=180,
                   placeholder="select * from requests limit 10")
if st.button("Run", type="primary", key="sql_run") and sql.strip():
    st.session_state["sql_last"] = sql
last = st.session_state.get("sql_last")
if last:
    answer = _ui.uncached("run_sql", last, MAX_ROWS)
    if answer is not None:
        df, truncated = answer
        st.caption(f"{df.height:,} rows" + (f" (first {MAX_ROWS:,} shown)" if truncated else ""))
        st.dataframe(df, hide_index=True)
        st.download_button("Download CSV", to_csv(df), file_name="routeaudit-query.csv",
                           mime="text/csv", key="sql_csv")
