"""The Graph page's compare view and its export in a real browser (issue 23).

Starts ``streamlit run explorer/app.py`` for the module with the compile map of ``residual_block``
already in its cache (``tests/test_compile_map.py``'s cache folder; compiled here through the
child process when that module has not run), and drives Debian's headless chromium with
Playwright (never ``playwright install``). Checks: the compare view's canvas is drawn with its
bands and its legend inside the drawing; the exported HTML opens from a file with every request
outside that file refused and recorded: there is none. A screenshot of the compare view goes to a
temporary folder (``assets/`` with FUSION_EXPLORER_UPDATE_SCREENSHOTS=1). Skipped only when no
chromium can be found.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

from browser_harness import ARGS, CHROMIUM, ROOT, graph_frames, running_app, wait_idle

pytestmark = pytest.mark.browser

CACHE_ROOT = Path(tempfile.gettempdir()) / "fusion-explorer-tests-cache"
ASSETS = ROOT / "assets" if os.environ.get("FUSION_EXPLORER_UPDATE_SCREENSHOTS") == "1" else Path(
    tempfile.mkdtemp(prefix="fusion-explorer-screens-"))

# How much of the canvas is drawn (not white), and what the page script says it drew.
_DRAWN_JS = """() => {
    const c = document.querySelector('#mynetwork canvas');
    const ctx = c.getContext('2d');
    const d = ctx.getImageData(0, 0, c.width, c.height).data;
    let ink = 0;
    for (let i = 0; i < d.length; i += 16) if (d[i] < 240 || d[i + 1] < 240 || d[i + 2] < 240) ink++;
    const legend = document.getElementById('fe-legend');
    return {width: c.width, height: c.height, ink: ink, layer: window.FE.layer, bands: window.FE.bands.length,
            labels: (window.FE.bandLabels || []).map(b => b.label), legend: legend ? legend.innerText : null};
}"""


@pytest.fixture(scope="module")
def app():
    from explorer.fusion_engine import analyze
    from explorer.runtime import compile_map as cm

    if CHROMIUM is None:
        pytest.skip("no chromium found")
    pytest.importorskip("playwright.sync_api")
    analysis = analyze("residual_block")
    cmap, comparison = cm.for_analysis(analysis, "residual_block", "cpu", "fp32", directory=CACHE_ROOT / "compile_map",
                                       timeout_s=600)
    before = os.environ.get(cm.CACHE_ENV)
    os.environ[cm.CACHE_ENV] = str(CACHE_ROOT)
    try:
        with running_app() as url:
            yield url, analysis, cmap, comparison
    finally:
        if before is None:
            os.environ.pop(cm.CACHE_ENV, None)
        else:
            os.environ[cm.CACHE_ENV] = before


def test_compare_view_drawn_and_exported_file_opens_offline(app, tmp_path):
    from playwright.sync_api import sync_playwright

    url, analysis, cmap, comparison = app
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        try:
            page = browser.new_page(viewport={"width": 1500, "height": 1000})
            page.goto(url + "/?model=residual_block&view=compare&device=cpu&dtype=fp32")
            frame = graph_frames(page, {"compare"}, 120).get("compare")
            assert frame is not None, "the compare view was not drawn"
            wait_idle(page, 60_000)
            page.wait_for_timeout(800)
            drawn = frame.evaluate(_DRAWN_JS)
            assert drawn["layer"] == "compare" and drawn["width"] > 300 and drawn["ink"] > 500, drawn
            assert drawn["bands"] == len(analysis.detection.chains)
            assert drawn["legend"] and "inductor fuses part" in drawn["legend"] and "only ours" in drawn["legend"]
            assert drawn["labels"] == ["inductor fuses part"] * len(analysis.detection.chains)
            page.screenshot(path=str(ASSETS / "screenshot-graph-compare.png"))

            with page.expect_download(timeout=60_000) as info:
                page.get_by_text("Download this view (HTML)").first.click()
            exported = tmp_path / "view.html"
            info.value.save_as(str(exported))
            page.close()

            # the file, opened with every request but the file itself refused and recorded
            context = browser.new_context(viewport={"width": 1200, "height": 800})
            requests: list[str] = []

            def refuse(route) -> None:
                if route.request.url != exported.as_uri():
                    requests.append(route.request.url)
                    route.abort()
                else:
                    route.continue_()

            context.route("**/*", refuse)
            offline = context.new_page()
            offline.on("websocket", lambda ws: requests.append(ws.url))
            offline.goto(exported.as_uri())
            offline.wait_for_function("() => window.FE && window.FE.ready", timeout=30_000)
            offline.wait_for_timeout(500)
            alone = offline.evaluate(_DRAWN_JS)
            assert requests == [], requests
            assert alone["layer"] == "compare" and alone["ink"] > 500 and "only ours" in (alone["legend"] or "")
            context.close()
        finally:
            browser.close()
