"""Start the app with ``streamlit run`` and find its drawn graph in headless Chromium.

Shared by ``tests/test_browser.py`` and ``benchmarks/bench_app_startup.py``. Uses Debian's
chromium through Playwright (never ``playwright install``).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Iterator

ROOT = Path(__file__).resolve().parent.parent

CHROMIUM = next((p for p in ("/usr/bin/chromium", shutil.which("chromium") or "",
                             shutil.which("chromium-browser") or "") if p and os.path.exists(p)), None)
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--no-first-run", "--disable-sync"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def running_app() -> Iterator[str]:
    """``streamlit run explorer/app.py`` on a free localhost port; yields its URL."""
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
            raise RuntimeError("streamlit did not start within 60 s")
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
        if log is not subprocess.DEVNULL:
            log.close()


def graph_frame(page, timeout_s: float):
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
