"""Start the app with ``streamlit run`` and read its drawn graphs out of headless Chromium.

Shared by the browser tests (``tests/test_browser.py``, ``tests/test_browser_offline.py``; their app
comes from the ``app_url`` fixture of ``tests/conftest.py``) and ``benchmarks/bench_app_startup.py``.
Uses Debian's chromium through Playwright (never ``playwright install``).
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
    # FUSION_EXPLORER_APP_ROOT runs another checkout's app (e.g. an old commit in a worktree, to see
    # that these checks fail on it); the tests themselves stay these.
    root = Path(os.environ.get("FUSION_EXPLORER_APP_ROOT", ROOT))
    env = dict(os.environ, PYTHONPATH=str(root))
    log = subprocess.DEVNULL
    proc = subprocess.Popen(
        [sys.executable, "-m", "streamlit", "run", str(root / "explorer" / "app.py"), "--server.headless", "true",
         "--server.port", str(port), "--server.address", "127.0.0.1", "--browser.gatherUsageStats", "false"],
        cwd=str(root), env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
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


def wait_idle(page, timeout_ms: int = 30_000) -> None:
    """Wait until Streamlit has finished its current script run (its status widget is gone)."""
    page.wait_for_timeout(300)
    page.locator('[data-testid="stStatusWidget"]').wait_for(state="hidden", timeout=timeout_ms)


# Reads what vis-network drew in one graph iframe: every node's box (graph units), the edge
# segments, the zoom, and how many screen pixels one graph unit takes at the current view.
# Works on the pages of any version of the app (window.FE is only there since the layered view).
_GEOMETRY_JS = """() => {
    if (typeof network === 'undefined' || typeof vis === 'undefined') return null;
    const FE = window.FE || {name: 'original', waypointPrefix: 'via:', ready: true};
    if (!FE.ready) return null;
    const el = document.getElementById('mynetwork');
    const a = network.canvasToDOM({x: 0, y: 0}), b = network.canvasToDOM({x: 0, y: 100});
    const nodes = network.body.nodeIndices.map(id => {
        const n = network.body.nodes[id], box = network.getBoundingBox(id), d = network.canvasToDOM({x: n.x, y: n.y});
        return {id: String(id), l: box.left, t: box.top, r: box.right, b: box.bottom, x: n.x, y: n.y,
                font: n.options.font.size, via: String(id).startsWith(FE.waypointPrefix),
                visible: d.x >= 0 && d.y >= 0 && d.x <= el.clientWidth && d.y <= el.clientHeight};
    });
    const edges = network.body.edgeIndices.map(eid => {
        const e = network.body.edges[eid];
        return {from: String(e.fromId), to: String(e.toId), fx: e.from.x, fy: e.from.y, tx: e.to.x, ty: e.to.y};
    });
    return {name: FE.name, scale: network.getScale(), px_per_unit: Math.abs(b.y - a.y) / 100,
            width: el.clientWidth, height: el.clientHeight, nodes: nodes, edges: edges};
}"""


def graph_frames(page, names: set[str], timeout_s: float = 60.0) -> dict:
    """{name: frame} of the drawn graph iframes (``window.FE.name``: "original", "fused") once all of
    ``names`` are drawn; the frames found so far when time runs out."""
    end = time.time() + timeout_s
    found: dict = {}
    while time.time() < end:
        found = {}
        for frame in page.frames:
            if frame == page.main_frame:
                continue
            try:
                name = frame.evaluate("() => (typeof network !== 'undefined' && document.querySelector("
                                      "'#mynetwork canvas') && (!window.FE || window.FE.ready)) ? "
                                      "(window.FE ? window.FE.name : 'original') : null")
            except Exception:  # a frame still loading or navigating
                continue
            if name:
                found[name] = frame
        if names <= set(found):
            return found
        page.wait_for_timeout(250)
    return found


def read_geometry(frame) -> dict:
    """What vis-network drew in ``frame`` (see ``_GEOMETRY_JS``)."""
    return frame.evaluate(_GEOMETRY_JS)


def logical_edges(geometry: dict) -> dict[tuple[str, str], list[tuple[tuple[float, float], tuple[float, float]]]]:
    """{(source, target): its drawn segments} with edges drawn through waypoint nodes joined up again."""
    via = {n["id"] for n in geometry["nodes"] if n["via"]}
    out_of: dict[str, list[dict]] = {}
    for e in geometry["edges"]:
        out_of.setdefault(e["from"], []).append(e)
    edges = {}
    for e in geometry["edges"]:
        if e["from"] in via:
            continue
        segments, cur = [((e["fx"], e["fy"]), (e["tx"], e["ty"]))], e
        while cur["to"] in via:
            cur = out_of[cur["to"]][0]
            segments.append(((cur["fx"], cur["fy"]), (cur["tx"], cur["ty"])))
        edges[(e["from"], cur["to"])] = segments
    return edges


def overlaps(geometry: dict) -> list[tuple[str, str]]:
    """Pairs of drawn (non-waypoint) nodes whose boxes overlap."""
    boxes = sorted((n for n in geometry["nodes"] if not n["via"]), key=lambda n: n["l"])
    out = []
    for i, a in enumerate(boxes):
        for b in boxes[i + 1:]:
            if b["l"] >= a["r"]:
                break
            if a["t"] < b["b"] and b["t"] < a["b"]:
                out.append((a["id"], b["id"]))
    return out


def _segment_hits_box(p, q, box) -> bool:
    """Whether segment p-q passes through the inside of box (left, top, right, bottom): Liang-Barsky.
    (Written here again on purpose, not imported from the app: the layout routes edges around nodes
    with ``explorer.ui.graph.layout.segment_hits_box``, so a check that used it would share its mistakes.)"""
    (x0, y0), (x1, y1) = p, q
    dx, dy = x1 - x0, y1 - y0
    t0, t1 = 0.0, 1.0
    for pk, qk in ((-dx, x0 - box[0]), (dx, box[2] - x0), (-dy, y0 - box[1]), (dy, box[3] - y0)):
        if pk == 0:
            if qk <= 0:
                return False
        else:
            r = qk / pk
            if pk < 0:
                t0 = max(t0, r)
            else:
                t1 = min(t1, r)
            if t0 >= t1:
                return False
    return t1 - t0 > 1e-6


def hidden_edges(geometry: dict, only: set[tuple[str, str]] | None = None) -> list[tuple[str, str, str]]:
    """(source, target, node) for each edge (of ``only``, or all) drawn through a node other than its ends."""
    boxes = [(n["id"], (n["l"], n["t"], n["r"], n["b"])) for n in geometry["nodes"] if not n["via"]]
    out = []
    for (s, t), segments in logical_edges(geometry).items():
        if only is not None and (s, t) not in only:
            continue
        for nid, box in boxes:
            if nid not in (s, t) and any(_segment_hits_box(p, q, box) for p, q in segments):
                out.append((s, t, nid))
    return out


def label_px(geometry: dict) -> list[float]:
    """On-screen label size (CSS px) of every drawn node that is inside the visible window."""
    return [n["font"] * geometry["px_per_unit"] for n in geometry["nodes"] if n["visible"] and not n["via"]]
