"""Retake the screenshots in ``assets/`` (every one the README shows), in headless Chromium at 1600×1000.

    .venv/bin/python assets/make_screenshots.py                 # all of them (a few minutes on an idle 2-core machine)
    .venv/bin/python assets/make_screenshots.py graph learn-zh  # only these (names below, without "screenshot-")

It starts the app from this checkout (``streamlit run explorer/app.py`` on a free port, as the browser tests do:
``tests/browser_harness.py``), drives it as a user would and writes ``assets/screenshot-<name>.png``; run it after
any change the pictures show (the lead retakes them after merging). Needs the dev setup (``make test`` installs
Debian's ``chromium``; Playwright drives it, never ``playwright install``). A shot that fails says which and why
in one line and the others are still taken; the exit status is the number of failures.

The browser tests (``tests/test_browser.py`` and the others) take some of the same pictures into a temporary
folder as they check the pages; ``FUSION_EXPLORER_UPDATE_SCREENSHOTS=1`` writes theirs here too.
"""

from __future__ import annotations

import contextlib
import sys
import time
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parent.parent
ASSETS = ROOT / "assets"
H200_REPORT = ROOT / "benchmarks" / "results" / "report_resnet50_fp16_channels_last_h200.json"
VIEWPORT = {"width": 1600, "height": 1000}


def _settle(page, timeout_s: float = 240.0) -> None:
    """Until the page is drawn and idle: no script running, no spinner, its main text unchanged for 2 s."""
    end = time.time() + timeout_s
    page.locator('[data-testid="stMain"]').first.wait_for(timeout=timeout_s * 1000)
    last, since = None, time.time()
    while time.time() < end:
        busy = (page.locator('[data-testid="stStatusWidget"]').first.is_visible()
                or page.locator('[data-testid="stSpinner"]').first.is_visible())
        try:
            text = page.locator('[data-testid="stMain"]').inner_text(timeout=3000)
        except Exception:   # replaced while read
            text = None
        if busy or text != last:
            last, since = text, time.time()
        elif time.time() - since > 2.0 and text and len(text) > 40:
            return
        page.wait_for_timeout(400)
    raise TimeoutError(f"the page did not settle within {timeout_s:.0f} s")


def _graphs(page, names: set[str], timeout_s: float = 240.0) -> None:
    """Until the graph views ``names`` are drawn (their vis-network canvases laid out)."""
    from browser_harness import graph_frames, read_geometry

    end = time.time() + timeout_s
    while time.time() < end:
        try:
            frames = graph_frames(page, names, timeout_s=max(1.0, end - time.time()))
            if all(read_geometry(f) for f in frames.values()):
                page.wait_for_timeout(800)
                return
        except Exception:   # a frame replaced while it was read
            pass
        page.wait_for_timeout(500)
    raise TimeoutError(f"graph views {sorted(names)} not drawn within {timeout_s:.0f} s")


def _open_page(page, app: str, path: str) -> None:
    page.goto(app + path)
    _settle(page)


def _nav(page, name: str) -> None:
    """A page of the app through its navigation link (the session and its state kept)."""
    page.locator(f'[data-testid="stSidebarNav"] a[href$="/{name}"], header a[href$="/{name}"], '
                 f'a[href$="/{name}"]').first.click()
    page.wait_for_timeout(1000)
    _settle(page)


def _tall(page, height: int, path: Path) -> None:
    """A taller viewport for a page that scrolls inside Streamlit's own container, then the shot."""
    page.set_viewport_size({"width": VIEWPORT["width"], "height": height})
    page.wait_for_timeout(1500)
    _settle(page, 60)
    page.screenshot(path=str(path))
    page.set_viewport_size(VIEWPORT)


def graph(page, app: str, path: Path) -> None:
    """ResNet-50 as it first opens, original and fused side by side."""
    _open_page(page, app, "/?model=resnet50&view=side&lang=en")
    _graphs(page, {"original", "fused"})
    page.screenshot(path=str(path))


def graph_bert(page, app: str, path: Path) -> None:
    """BERT-base as it first opens, side by side, scrolled (over the header, not the graph) until its first chain,
    the embeddings' Add+LayerNorm, is in view below the legend."""
    _open_page(page, app, "/?model=bert_base&view=side&lang=en")
    _graphs(page, {"original", "fused"})
    page.mouse.move(800, 220)
    page.mouse.wheel(0, 340)
    page.wait_for_timeout(1200)
    page.screenshot(path=str(path))


def fusions(page, app: str, path: Path) -> None:
    """The Fusions page of residual_block with one chain rejected in the one-chain panel."""
    _open_page(page, app, "/fusions?model=residual_block&lang=en")
    page.get_by_text("One chain: details, accept or reject").click()
    _settle(page)
    page.locator(".st-key-chain_reject button").first.click()
    page.get_by_text("1 of 2 accepted").wait_for(timeout=60_000)
    _settle(page)
    page.mouse.move(800, 300)
    page.mouse.wheel(0, -5000)   # back to the top: the table, then the panel (Streamlit scrolls its own container)
    _tall(page, 1800, path)


def results(page, app: str, path: Path) -> None:
    """A quick run of residual_block on the CPU, from the Run page's button to the Results page's charts."""
    _open_page(page, app, "/run?model=residual_block&lang=en")
    page.locator(".st-key-run_quick label").first.click()
    _settle(page)
    page.locator(".st-key-run_start button").first.click()
    page.get_by_text("Results for the current plan and settings").wait_for(timeout=600_000)
    _nav(page, "results")
    page.locator(".js-plotly-plot .main-svg").first.wait_for(timeout=180_000)
    _tall(page, 3200, path)


def results_h200_report(page, app: str, path: Path) -> None:
    """ResNet-50 measured on the H200, opened on the Results page of a machine without a GPU."""
    _open_page(page, app, "/results?model=residual_block&lang=en")
    page.locator('[data-testid="stFileUploader"] input[type="file"]').first.set_input_files(str(H200_REPORT))
    page.get_by_text("Results: resnet50").wait_for(timeout=120_000)
    page.get_by_text("slower even as CUDA graphs").first.wait_for(timeout=120_000)
    _plots(page, 3)
    page.screenshot(path=str(path))


def _plots(page, n: int, timeout_s: float = 120.0) -> None:
    """Until ``n`` plotly charts are drawn, then settled."""
    end = time.time() + timeout_s
    while page.locator(".js-plotly-plot .main-svg").count() < n and time.time() < end:
        page.wait_for_timeout(500)
    _settle(page)
    page.wait_for_timeout(1500)


def results_teaching_h200(page, app: str, path: Path) -> None:
    """The committed H200 teaching report on the Results page: where one forward of ResNet-50 spends its time."""
    _open_page(page, app, "/results?model=resnet50&lang=en")
    box = page.locator(".st-key-results_committed")   # the saved-report panel is open while nothing is shown
    box.click()
    page.keyboard.type("teaching_report_h200.json")
    page.keyboard.press("Enter")
    _settle(page)
    page.locator(".st-key-results_open_committed button").first.click()
    heading = page.get_by_text("Where one forward's time goes", exact=False).first
    heading.wait_for(timeout=120_000)
    _plots(page, 1)
    heading.scroll_into_view_if_needed()
    page.mouse.wheel(0, -120)   # the heading a little below the top, as a reader scrolls to it
    page.wait_for_timeout(1500)
    page.screenshot(path=str(path))


def learn_zh(page, app: str, path: Path) -> None:
    """The Learn page in 中文 on ResNet-50: BatchNorm folded by hand for one channel of the stem's Conv+BN+ReLU."""
    _open_page(page, app, "/learn?model=resnet50&lang=zh")
    page.get_by_role("tab", name="实例演算").first.click()
    page.locator(".st-key-ex_fold_chain").first.wait_for(timeout=120_000)
    _settle(page)
    page.wait_for_timeout(1000)
    page.screenshot(path=str(path))


def sweeps_h200_models(page, app: str, path: Path) -> None:
    """The Sweeps page on the committed H200 grid (``benchmarks/results/sweeps/h200_models``): speed-up against
    batch size per model and dtype, fused against compile, the heatmap."""
    _open_page(page, app, "/sweeps?lang=en")
    box = page.locator('[data-testid="stSelectbox"]').filter(has_text="Sweep folder").first
    box.click()
    page.keyboard.type("h200_models")
    page.keyboard.press("Enter")
    _settle(page)
    _plots(page, 3)
    _tall(page, 2600, path)


SHOTS: dict[str, Callable] = {
    "graph": graph, "graph-bert": graph_bert, "fusions": fusions, "results": results,
    "results-h200-report": results_h200_report, "results-teaching-h200": results_teaching_h200,
    "learn-zh-resnet50": learn_zh, "sweeps-h200-models": sweeps_h200_models,
}


def main(argv: list[str]) -> int:
    wanted = argv or list(SHOTS)
    unknown = [w for w in wanted if w not in SHOTS and f"{w}-resnet50" not in SHOTS]
    if unknown:
        print(f"unknown screenshot(s) {', '.join(unknown)}: choose from {', '.join(SHOTS)}", file=sys.stderr)
        return 2
    sys.path.insert(0, str(ROOT / "tests"))
    from browser_harness import ARGS, CHROMIUM, running_app
    from playwright.sync_api import sync_playwright

    if CHROMIUM is None:
        print("no chromium found (make test installs Debian's chromium)", file=sys.stderr)
        return 2
    failed = 0
    with running_app() as app, sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        for name in wanted:
            name = name if name in SHOTS else f"{name}-resnet50"
            path = ASSETS / f"screenshot-{name}.png"
            page = browser.new_page(viewport=VIEWPORT)   # a fresh session per shot: none depends on another
            t0 = time.time()
            try:
                SHOTS[name](page, app, path)
                print(f"{path.relative_to(ROOT)}: {time.time() - t0:.0f} s")
            except Exception as exc:   # one line per failed shot; the others are still taken
                failed += 1
                with contextlib.suppress(Exception):   # what the page showed, beside the shot it was to be
                    page.screenshot(path=str(path.with_name(f"failed-{path.name}")))
                print(f"{name}: not taken: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}", file=sys.stderr)
            finally:
                page.close()
        browser.close()
    return failed


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
