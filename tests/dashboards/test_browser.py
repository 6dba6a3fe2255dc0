"""The dashboard in a real browser: a `streamlit run` server, each page in headless Chromium.

Needs Debian's chromium at /usr/bin/chromium (``apt-get install chromium``); playwright drives
it, no browser download. Screenshots land in ``test-artifacts/dashboards/``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import duckdb
import httpx
import pytest
from _stores import mart_store

from collectors.routers import free_port

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = Path("/usr/bin/chromium")
ARTIFACTS = ROOT / "test-artifacts" / "dashboards"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update",
                 "--disable-sync"]

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not CHROMIUM.exists(),
                       reason="Debian chromium not installed at /usr/bin/chromium "
                              "(apt-get install chromium)"),
]

# url path → (heading, text that only shows once the page's queries answered)
PAGES = {
    "": ("Overview", "SLO attainment"),  # the default page lives at /
    "slow": ("Slow requests", "Top cause"),
    "request?request_id=req-000058": ("Request drill-down", "Primary cause"),
    "cache": ("Cache", "Requests with both"),
    "telemetry": ("Telemetry", "Herding episodes"),
    "policies": ("Policies", "Goodput"),
    "sql": ("SQL", "Read-only"),
}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    db = mart_store(tmp_path_factory.mktemp("browser") / "audit.duckdb", n=400)
    # relations rebuilt two minutes ago over no spans, and a span stored since: the sidebar's
    # note that the pages lag the raw tables shows on every page
    con = duckdb.connect(str(db))
    con.execute("insert into routeaudit_meta values ('refreshed_ns', ?), ('relations_spans', '0')",
                [str(time.time_ns() - 120 * 10**9)])
    con.execute("insert into raw_spans (trace_id, span_id, name, kind, start_ns, end_ns, "
                "status_code, received_ns, event_count) values "
                "(repeat('a', 32), repeat('b', 16), 's', 'internal', 1, 2, 'unset', 3, 0)")
    con.close()
    port = free_port()
    env = {**os.environ, "ROUTEAUDIT_DB": str(db)}
    env.pop("ROUTEAUDIT_DASHBOARD_TOKEN", None)
    log = open(tmp_path_factory.mktemp("log") / "streamlit.log", "wb")  # noqa: SIM115
    proc = subprocess.Popen(
        [sys.executable, "-m", "streamlit", "run", str(ROOT / "dashboards" / "app.py"),
         "--server.port", str(port), "--server.address", "127.0.0.1",
         "--server.headless", "true", "--browser.gatherUsageStats", "false",
         "--server.fileWatcherType", "none"],
        cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"{url}/_stcore/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                log.flush()
                pytest.fail(f"streamlit did not start: {Path(log.name).read_text()[-2000:]}")
            time.sleep(0.3)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def test_every_page_renders_in_chromium(server: str) -> None:
    from playwright.sync_api import sync_playwright

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            for path, (heading, ready) in PAGES.items():
                page.goto(f"{server}/{path}", wait_until="domcontentloaded")
                page.get_by_role("heading", name=heading, exact=True).wait_for(timeout=30_000)
                page.get_by_text(ready).first.wait_for(timeout=30_000)
                # Streamlit shows a status widget while the script runs.
                page.wait_for_function(
                    "!document.querySelector('[data-testid=\"stStatusWidget\"]')",
                    timeout=30_000)
                if path in ("", "cache"):
                    page.locator(".vega-embed").first.wait_for(timeout=30_000)
                page.wait_for_timeout(500)
                name = path.split("?")[0] or "overview"
                page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)
                body = page.inner_text("body")
                assert "Traceback" not in body, (path, body[:2000])
                assert "Page not found" not in body, path
                side = page.inner_text("[data-testid='stSidebar']")
                assert "1 span stored since then is not in them yet. These pages" in side, path
                assert "The store covers 2026-01-01 00:00:00 to 2026-01-01 00:00:39 UTC" in side, path
                assert page.locator("[data-testid='stException']").count() == 0, path
                errors = page.locator("[data-testid='stAlertContentError']")
                assert errors.count() == 0, (path, errors.all_inner_texts())
        finally:
            browser.close()


def test_the_window_survives_navigation_and_a_link(server: str) -> None:
    """The sidebar's window is in the URL: a link opens on it, and it stays when the person
    moves to another page through the navigation."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            sidebar = page.locator("[data-testid='stSidebar']")
            page.goto(f"{server}/?window=all", wait_until="domcontentloaded")
            sidebar.get_by_text("Showing requests over the whole store.").wait_for(timeout=30_000)
            sidebar.get_by_role("link", name="Slow requests").click()
            page.get_by_role("heading", name="Slow requests", exact=True).wait_for(timeout=30_000)
            try:
                page.get_by_text("Top cause").first.wait_for(timeout=30_000)
            finally:
                ARTIFACTS.mkdir(parents=True, exist_ok=True)
                page.screenshot(path=str(ARTIFACTS / "window-after-navigation.png"), full_page=True)
            assert "Showing requests over the whole store." in sidebar.inner_text()
            page.wait_for_function("location.search.includes('window=all')", timeout=10_000)
            page.goto(f"{server}/slow", wait_until="domcontentloaded")
            sidebar.get_by_text("Showing requests between").wait_for(timeout=30_000)
        finally:
            browser.close()
