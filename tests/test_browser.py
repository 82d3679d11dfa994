"""The app in a real browser: the pyvis canvas is drawn, a run's plotly charts appear.

Starts ``streamlit run explorer/app.py`` on a free port and drives Debian's chromium with
Playwright (never ``playwright install``). Screenshots go to a temporary folder (``assets/`` with FUSION_EXPLORER_UPDATE_SCREENSHOTS=1). Skipped only when
no chromium can be found.
"""

from __future__ import annotations

import os
import tempfile
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

pytestmark = pytest.mark.browser

ROOT = Path(__file__).resolve().parent.parent
# Screenshots land in a temporary folder; FUSION_EXPLORER_UPDATE_SCREENSHOTS=1 writes the
# README's copies in assets/ instead (a test run never changes tracked files by default).
ASSETS = ROOT / "assets" if os.environ.get("FUSION_EXPLORER_UPDATE_SCREENSHOTS") == "1" else Path(
    tempfile.mkdtemp(prefix="fusion-explorer-screens-"))
CHROMIUM = next((p for p in ("/usr/bin/chromium", shutil.which("chromium") or "",
                             shutil.which("chromium-browser") or "") if p and os.path.exists(p)), None)
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--no-first-run", "--disable-sync"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def app_url():
    if CHROMIUM is None:
        pytest.skip("no chromium found")
    pytest.importorskip("playwright.sync_api")
    port = _free_port()
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    log = subprocess.DEVNULL
    proc = subprocess.Popen(
        [sys.executable, "-m", "streamlit", "run", str(ROOT / "explorer" / "app.py"), "--server.headless", "true",
         "--server.port", str(port), "--server.address", "127.0.0.1", "--browser.gatherUsageStats", "false"],
        cwd=str(ROOT), env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        end = time.time() + 60
        while time.time() < end:
            try:
                if urllib.request.urlopen(url + "/_stcore/health", timeout=2).read().strip() == b"ok":
                    break
            except OSError:
                time.sleep(0.3)
        else:
            pytest.fail("streamlit did not start")
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
        if log is not subprocess.DEVNULL:
            log.close()


def _graph_frame(page, timeout_s: float):
    """The iframe holding a drawn vis-network canvas, and the canvas size."""
    end = time.time() + timeout_s
    last_error = None
    while time.time() < end:
        for frame in page.frames:
            if frame == page.main_frame:
                continue
            try:
                info = frame.evaluate("""() => {
                    const c = document.querySelector('#mynetwork canvas');
                    if (!c || typeof vis === 'undefined' || !c.width || !c.height) return null;
                    const ctx = c.getContext('2d');
                    const d = ctx.getImageData(0, 0, c.width, c.height).data;
                    let ink = 0;
                    for (let i = 0; i < d.length; i += 4 * 97) if (d[i + 3] > 0 && (d[i] < 240 || d[i+1] < 240 || d[i+2] < 240)) ink++;
                    return {w: c.width, h: c.height, ink: ink, nodes: network.body.data.nodes.length};
                }""")
            except Exception as exc:  # a frame still loading or navigating
                last_error = exc
                continue
            if info and info["ink"] > 0:
                return frame, info
        page.wait_for_timeout(250)  # not time.sleep: Playwright's sync API must keep pumping events
    print(f"no drawn canvas; last error: {last_error}")
    return None, None


def _select(page, label: str, option: str) -> None:
    box = page.locator('[data-testid="stSelectbox"]').filter(has_text=label).first
    box.click()
    page.keyboard.type(option)
    page.keyboard.press("Enter")


def test_graph_and_results_in_chromium(app_url):
    from playwright.sync_api import sync_playwright

    ASSETS.mkdir(exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        page = browser.new_page(viewport={"width": 1600, "height": 1000})
        t0 = time.perf_counter()
        page.goto(app_url)
        frame, info = _graph_frame(page, timeout_s=60)
        time_to_graph = time.perf_counter() - t0
        print(f"time to graph (resnet50, page open -> drawn canvas): {time_to_graph:.1f} s; {info}")
        assert frame is not None, "the pyvis canvas was not drawn"
        assert info["w"] > 100 and info["h"] > 100 and info["nodes"] > 100
        page.wait_for_timeout(800)
        page.screenshot(path=str(ASSETS / "screenshot-graph.png"))

        # a small model: the graph redraws
        _select(page, "Zoo model", "residual_block")
        page.get_by_text("Loaded: residual_block").wait_for(timeout=60_000)
        deadline = time.time() + 30
        while time.time() < deadline:
            frame, info = _graph_frame(page, timeout_s=10)
            if info and info["nodes"] < 20:
                break
        assert info and info["nodes"] < 20, info

        # Fusions: reject one chain
        page.get_by_role("link", name="Fusions", exact=True).first.click()
        page.get_by_text("One chain: details, accept or reject").click()
        page.get_by_role("button", name="Reject this chain").click()
        page.get_by_text("1 of 2 accepted").wait_for(timeout=30_000)
        page.wait_for_timeout(500)
        page.screenshot(path=str(ASSETS / "screenshot-fusions.png"), full_page=True)

        # Run on the CPU
        page.get_by_role("link", name="Run", exact=True).first.click()
        page.get_by_text("Quick (few repetitions)").click()
        page.get_by_role("button", name="Run", exact=True).click()
        page.get_by_text("Results for the current plan and settings").wait_for(timeout=300_000)

        # Results: plotly charts drawn
        page.get_by_role("link", name="Results", exact=True).first.click()
        page.locator(".js-plotly-plot .main-svg").first.wait_for(timeout=60_000)
        page.wait_for_timeout(1500)
        n_plots = page.locator(".js-plotly-plot").count()
        print(f"plotly charts on the Results page: {n_plots}")
        assert n_plots >= 3
        page.set_viewport_size({"width": 1600, "height": 3200})  # Streamlit scrolls inside its own container
        page.wait_for_timeout(1500)
        page.screenshot(path=str(ASSETS / "screenshot-results.png"))
        browser.close()
