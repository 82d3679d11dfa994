"""The pyvis renderer: a ``GraphView`` as one HTML page, every script and style in line (no CDN: the app
must work offline), with the chain bands, an overview map and a first view that is readable.

``render_html(view, options)`` lays the view's nodes out as fixed vis-network nodes (long edges through
small waypoint nodes, ids ``via:<n>``), has pyvis write the page with ``cdn_resources="in_line"``, and
appends the page script: the data it needs as ``window.FE`` (JSON escaped for a ``<script>``), then
``page.js``, this package's asset (read with ``importlib.resources``; it ships in the wheel as package
data). The script draws the bands under the nodes, opens the first view (the whole graph if its labels
stay readable, else the graph's start at a readable size), adds the overview map and makes scrolling pan
(Ctrl+scroll zooms), as in Netron. ``remote_urls`` lists what a page would fetch (it should be nothing).

Text from a file stays text: a tooltip cannot switch vis-network to HTML (``_inert_title``) and a
string in the page data cannot close the script (``_script_json``).
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.resources
import json
import math
import re

from explorer.ui.graph.model import (BAND_PAD, EDGE_COLOR, FONT_PX, GROUP_COLOR, HIGHLIGHT_BORDER, PLAIN_COLOR,
                                     GraphView, ViewNode, border_width, text_color)
from explorer.ui.i18n import t_in

@dataclasses.dataclass(frozen=True)
class RenderOptions:
    """How to draw a view.

    height_px     height of the drawing in CSS pixels
    center_on     a drawn node id to open on (a search hit), else the start of the graph
    min_font_px   the smallest label size on screen at the first view: if fitting the whole graph
                  would make labels smaller, the view opens at full size on the graph's start
    overview      draw an overview map (the whole graph and the visible window; click to move)
    name          what the drawing is ("original", "fused"), readable by tests as window.FE.name
    lang          the language of the overview's tooltip: "en" (the default) or "zh"
    """

    height_px: int = 640
    center_on: str | None = None
    min_font_px: float = 12.0
    overview: bool = True
    name: str = "original"
    lang: str = "en"


_REMOTE = re.compile(r"<(script|link)\b[^>]*\b(src|href)\s*=\s*[\"']https?://[^>]*>(\s*</script>)?",
                     re.IGNORECASE | re.DOTALL)

WAYPOINT_PREFIX = "via:"


@functools.lru_cache(maxsize=1)
def page_script() -> str:
    """The page's own script (``page.js`` beside this module), run after pyvis's ``drawGraph()``."""
    return importlib.resources.files(__package__).joinpath("page.js").read_text(encoding="utf-8")


def _inert_title(title: str) -> str:
    """A tooltip as pyvis shows text: vis-network sets a string title with ``innerText``, but pyvis
    switches every tooltip to ``innerHTML`` when any node's title holds "href". A word joiner
    (U+2060, invisible) inside each "href" of a title from a file keeps the text and the text path."""
    return re.sub(r"(?i)(hre)(f)", "\\1\u2060\\2", title)


def _script_json(value: object) -> str:
    """JSON for inside a ``<script>`` element: ``<``, ``>`` and ``&`` as ``\\u`` escapes, so a string
    from a file (a chain's title) cannot close the script or open a tag."""
    text = json.dumps(value)
    for ch, esc in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026"), ("\u2028", "\\u2028"),
                    ("\u2029", "\\u2029")):
        text = text.replace(ch, esc)
    return text


def _node_dict(vn: ViewNode) -> dict:
    """A drawn node as a vis-network node, fixed where the layout put it."""
    width = border_width(vn)
    return {
        "id": vn.id, "label": vn.label, "title": _inert_title(vn.title), "shape": "box", "x": vn.x, "y": vn.y,
        "physics": False, "fixed": True,
        "color": {"background": vn.fill, "border": HIGHLIGHT_BORDER if vn.highlighted else vn.border,
                  "highlight": {"background": vn.fill, "border": "#000000"},
                  "hover": {"background": vn.fill, "border": "#000000"}},
        "borderWidth": width, "borderWidthSelected": width + 1,
        "shapeProperties": {"borderDashes": [6, 4] if vn.dashed else False, "borderRadius": 4},
        "font": {"color": text_color(vn.fill), "size": FONT_PX, "face": "sans-serif", "multi": False},
        # vis-network adds the margins and 4 px of border room to these: the box is width x height
        "widthConstraint": {"minimum": vn.width - 20, "maximum": vn.width - 20},
        "heightConstraint": {"minimum": vn.height - 16, "valign": "middle"},
        "margin": {"top": 4, "bottom": 4, "left": 6, "right": 6},
        "shadow": {"enabled": vn.highlighted, "color": HIGHLIGHT_BORDER, "size": 12, "x": 0, "y": 0},
    }


def _vis_elements(view: GraphView) -> tuple[list[dict], list[dict]]:
    """vis-network nodes and edges of ``view``: an edge with waypoints becomes a run of segments through
    invisible waypoint nodes (ids ``via:<n>``), with the arrow head on its last segment only."""
    nodes = [_node_dict(vn) for vn in view.nodes]
    edges = []
    waypoints = 0
    for e in view.edges:
        width = min(1.2 + math.log2(e.weight), 5)
        chain = [e.source]
        for x, y in e.points:
            wid = f"{WAYPOINT_PREFIX}{waypoints}"
            waypoints += 1
            nodes.append({"id": wid, "label": " ", "title": _inert_title(e.title), "shape": "dot", "size": 0.5,
                          "x": x, "y": y, "physics": False, "fixed": True, "borderWidth": 0,
                          "color": {"background": "rgba(0,0,0,0)", "border": "rgba(0,0,0,0)"},
                          "chosen": False, "font": {"size": 1}})
            chain.append(wid)
        chain.append(e.target)
        for i, (s, t) in enumerate(zip(chain, chain[1:])):
            last = i == len(chain) - 2
            edges.append({"from": s, "to": t, "title": e.title, "width": width, "color": EDGE_COLOR,
                          "arrows": {"to": {"enabled": last, "scaleFactor": 0.6}}})
    return nodes, edges


_VIS_OPTIONS = {
    "physics": {"enabled": False},
    "interaction": {"hover": True, "tooltipDelay": 120, "navigationButtons": True, "keyboard": False,
                    "multiselect": True, "zoomSpeed": 0.6},
    "edges": {"smooth": {"enabled": False}, "selectionWidth": 1.5},
    "layout": {"improvedLayout": False, "hierarchical": {"enabled": False}},
}


def render_html(view: GraphView, options: RenderOptions = RenderOptions()) -> str:
    """Draw ``view`` with pyvis; every script and style in line, nothing fetched from the network.

    Long edges are drawn through small waypoint nodes (ids ``via:<n>``) at the places the layout
    routed them, so they pass around nodes.
    """
    from pyvis.network import Network

    net = Network(height=f"{options.height_px}px", width="100%", directed=True, cdn_resources="in_line",
                  bgcolor="#ffffff")
    nodes, edges = _vis_elements(view)
    net.nodes, net.edges = nodes, edges
    net.node_ids = [n["id"] for n in nodes]
    net.node_map = {n["id"]: n for n in nodes}
    net.set_options(json.dumps(_VIS_OPTIONS))
    html = net.generate_html(notebook=False)
    html = _REMOTE.sub("", html)
    # pyvis prints an empty heading twice and floats the canvas: tidy both.
    html = html.replace("<center>\n<h1></h1>\n</center>", "").replace(
        "<center>\n          <h1></h1>\n        </center>", "")
    html = html.replace("float: left;", "")
    html = html.replace("<head>", "<head><style>body{margin:0} .vis-tooltip{white-space:pre !important;"
                        "font-family:monospace;font-size:12px}</style>", 1)
    html = html.replace("</body>", f"<script>window.FE = {_script_json(_extra(view, options))};\n"
                        f"{page_script()}</script></body>", 1)
    return html


def _extra(view: GraphView, options: RenderOptions) -> dict:
    """The data the page script needs: bands, bounds, where the graph starts, the overview's boxes."""
    real = [vn for vn in view.nodes]
    if real:
        bounds = {"left": min(v.x - v.width / 2 for v in real), "right": max(v.x + v.width / 2 for v in real),
                  "top": min(v.y - v.height / 2 for v in real), "bottom": max(v.y + v.height / 2 for v in real)}
        # the first view is centred across on the first chain (else the first node), from the top
        first = next((v for v in real if v.chain), real[0])
        start = first.x if view.direction == "TB" else first.y
    else:
        bounds, start = {"left": 0, "right": 1, "top": 0, "bottom": 1}, 0.0
    center = view.drawn_id(options.center_on) if options.center_on else None
    if center is None and options.center_on in {v.id for v in real}:
        center = options.center_on
    neck = {}
    for band in view.bands:
        sizes = [vn for vn in view.nodes if vn.id in set(band.nodes)]
        neck[band.chain] = (min(v.width for v in sizes) + 2 * BAND_PAD, min(v.height for v in sizes) + 2 * BAND_PAD)
    return {
        "name": options.name, "direction": view.direction, "fontPx": FONT_PX, "minFontPx": options.min_font_px,
        "centerOn": center, "overview": options.overview, "bounds": bounds, "start": start,
        "bandPad": BAND_PAD, "neck": 22, "real": [v.id for v in real], "waypointPrefix": WAYPOINT_PREFIX,
        "mapTitle": t_in(options.lang, "gv.overview"),
        "bands": [{"chain": b.chain, "title": b.title, "fill": b.fill, "border": b.border, "nodes": list(b.nodes),
                   "paths": [list(map(list, p)) for p in b.paths], "neckX": neck[b.chain][0],
                   "neckY": neck[b.chain][1]}
                  for b in view.bands],
        "mapNodes": [[v.x, v.y, v.width, v.height, v.border if v.fill in (PLAIN_COLOR, GROUP_COLOR) else v.fill]
                     for v in real],
    }


def remote_urls(html: str) -> list[str]:
    """Every http(s) script/stylesheet the page would fetch (should be empty)."""
    return [m.group(0) for m in _REMOTE.finditer(html)]

