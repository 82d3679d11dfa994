"""The Sweeps page in a real browser: the committed CPU sweep's speed-up chart drawn by plotly, one marker a point.

Starts the app once for the module (``app_url``, conftest) and drives Debian's chromium with Playwright. A
screenshot goes to a temporary folder (``assets/`` with FUSION_EXPLORER_UPDATE_SCREENSHOTS=1). Skipped only when
no chromium can be found.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

from browser_harness import ARGS, CHROMIUM, ROOT, wait_idle

pytestmark = pytest.mark.browser

ASSETS = ROOT / "assets" if os.environ.get("FUSION_EXPLORER_UPDATE_SCREENSHOTS") == "1" else Path(
    tempfile.mkdtemp(prefix="fusion-explorer-screens-"))


def test_the_sweeps_page_draws_every_point_in_chromium(app_url):
    from playwright.sync_api import sync_playwright

    from explorer.sweeps import store as st

    records = st.SweepStore.open("cpu_teaching", root=ROOT / "benchmarks" / "results" / "sweeps").results()
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 1800})
        try:
            page.goto(app_url + "/sweeps")
            page.locator(".js-plotly-plot .main-svg").first.wait_for(timeout=120_000)
            wait_idle(page)
            first = page.locator(".js-plotly-plot").first
            markers = first.locator(".scatterlayer .point").count()
            assert markers == sum(1 for r in records if r["status"] == "ok" and r["speedup"] is not None)
            assert "break-even" in first.inner_text()
            assert page.locator(".js-plotly-plot").count() >= 2          # speed-up and the heatmap
            page.screenshot(path=str(ASSETS / "screenshot-sweeps-cpu.png"), full_page=True)
        finally:
            browser.close()
