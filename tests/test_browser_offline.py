"""Issue 9: the app makes no network request at all, seen from a real browser.

Starts ``streamlit run explorer/app.py`` once for the module (``app_url`` of ``conftest.py``) and
drives Debian's headless chromium with Playwright (never ``playwright install``; chromium runs with
``--disable-background-networking``, so what is recorded is the page's own traffic). Every request
the page and its frames make (``BrowserContext.on("request")``, iframes and workers included) and
every websocket it opens is recorded while a person's path is walked: the Graph page of a zoo model,
the Fusions page with a chain's panel opened, the Run page, the Results page with a saved report
open (its plotly charts drawn), the Learn page, the Export page. Each must go to the local server;
``data:``, ``blob:`` and ``about:`` URLs stay inside the browser. Skipped only when no chromium can
be found.

It fails when the page icon is put back to ``:material/hub:`` (the browser then fetches the favicon
from fonts.gstatic.com): run it on such a copy of the app with FUSION_EXPLORER_APP_ROOT=<the copy>.
"""

from __future__ import annotations

from urllib.parse import urlsplit

import pytest

from browser_harness import ARGS, CHROMIUM, ROOT, wait_idle

pytestmark = pytest.mark.browser

H200_REPORT = ROOT / "benchmarks" / "results" / "report_resnet50_fp16_channels_last_h200.json"
LOCAL_SCHEMES = {"data", "blob", "about"}
IDLE_MS = 60_000  # how long a page may take to finish its script run (the whole path is walked)
#: (link in the top navigation, a text the page shows once it is drawn)
PAGES = [("Fusions", "Near misses"), ("Run", "Press Run"), ("Results", "Open a saved report"),
         ("Learn", "Operator fusion, taught on your model"), ("Export", "Export residual_block")]


def foreign(urls: list[str], origin: str) -> list[str]:
    """The URLs of ``urls`` that leave the browser for anything but ``origin`` (scheme://host:port)."""
    local = urlsplit(origin)
    out = []
    for url in urls:
        parts = urlsplit(url)
        if parts.scheme in LOCAL_SCHEMES:
            continue
        if parts.hostname != local.hostname or (parts.port or 80) != (local.port or 80):
            out.append(url)
    return out


def test_foreign_recognises_other_hosts():
    origin = "http://127.0.0.1:8501"
    assert foreign([origin + "/static/x.js", "ws://127.0.0.1:8501/_stcore/stream", "data:image/png;base64,AA",
                    "blob:http://127.0.0.1:8501/1"], origin) == []
    assert foreign(["https://fonts.gstatic.com/s/x.woff2", "http://127.0.0.1:9999/", "http://localhost:8501/"],
                   origin) == ["https://fonts.gstatic.com/s/x.woff2", "http://127.0.0.1:9999/", "http://localhost:8501/"]


def test_no_request_leaves_the_local_server(app_url):
    from playwright.sync_api import sync_playwright

    requests: list[str] = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        try:
            context = browser.new_context(viewport={"width": 1400, "height": 1000})
            context.on("request", lambda request: requests.append(request.url))
            page = context.new_page()
            page.on("websocket", lambda ws: requests.append(ws.url))

            page.goto(app_url + "/?model=residual_block")
            page.get_by_text("Loaded: residual_block").wait_for(timeout=120_000)
            page.locator("iframe").first.wait_for(timeout=60_000)  # the graph's frame
            wait_idle(page, IDLE_MS)
            page.wait_for_timeout(1500)
            for link, text in PAGES:
                page.get_by_role("link", name=link, exact=True).first.click()
                page.get_by_text(text).first.wait_for(timeout=120_000)
                wait_idle(page, IDLE_MS)
                if link == "Fusions":
                    page.get_by_text("One chain: details, accept or reject").click()
                    page.get_by_text("Kernel for this chain").wait_for(timeout=60_000)
                if link == "Results":
                    page.locator('[data-testid="stFileUploader"] input[type="file"]').set_input_files(str(H200_REPORT))
                    page.get_by_text("Results: resnet50").wait_for(timeout=60_000)
                    page.locator(".js-plotly-plot .main-svg").first.wait_for(timeout=60_000)
                    wait_idle(page, IDLE_MS)
                page.wait_for_timeout(1500)  # fonts, images and frames the page asks for late
            context.close()
        finally:
            browser.close()
    assert len(requests) > 20, requests  # the recording itself works
    assert any(url.startswith("ws") for url in requests)
    assert foreign(requests, app_url) == [], sorted(set(foreign(requests, app_url)))
