"""routeaudit dashboard entrypoint: token gate, shared sidebar (time window, SLO targets),
navigation.

``routeaudit dashboard --db PATH`` sets ``ROUTEAUDIT_DB`` and runs ``streamlit run`` on this
file. Pages live in ``app_pages/``.
"""

from __future__ import annotations

import hmac
import os

import streamlit as st

import audit
from dashboards import _ui

st.set_page_config(page_title="routeaudit", layout="wide")

token = os.environ.get(_ui.ENV_TOKEN)
if token and not st.session_state.get("authenticated"):
    st.title("routeaudit")
    entered = st.text_input("Dashboard token", type="password", key="token_input")
    if entered and hmac.compare_digest(entered.encode(), token.encode()):
        st.session_state["authenticated"] = True
        st.rerun()
    if entered:
        st.error("Wrong token.")
    else:
        st.info(f"This dashboard needs a token ({_ui.ENV_TOKEN}).")
    st.stop()

pages = [
    st.Page("app_pages/overview.py", title="Overview", url_path="overview", default=True),
    st.Page("app_pages/slow.py", title="Slow requests", url_path="slow"),
    st.Page("app_pages/request.py", title="Request drill-down", url_path="request"),
    st.Page("app_pages/cache.py", title="Cache", url_path="cache"),
    st.Page("app_pages/telemetry.py", title="Telemetry", url_path="telemetry"),
    st.Page("app_pages/policies.py", title="Policies", url_path="policies"),
    st.Page("app_pages/sql.py", title="SQL", url_path="sql"),
]
page = st.navigation(pages)

with st.sidebar:
    st.caption(f"Store: `{_ui.store_path()}`")
    if (behind := _ui.freshness_note()) is not None:
        st.warning(behind)
    _ui.window_sidebar(applies=page.url_path != "sql")
    st.subheader("SLO targets")
    default = audit.SLO()
    st.number_input("TTFT target (ms)", min_value=1.0, value=default.ttft_ms, step=100.0,
                    key="slo_ttft_ms")
    st.number_input("TPOT target (ms)", min_value=1.0, value=default.tpot_ms, step=10.0,
                    key="slo_tpot_ms")

page.run()
