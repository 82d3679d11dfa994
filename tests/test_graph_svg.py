"""The SVG/PNG export of a graph view (``explorer.ui.graph.svg``) and its downloads on the Export page.

- The SVG parses as XML, draws one node ``<rect>`` per view node (fill and dashed border as the view),
  one band group per chain band, one arrow-headed polyline per edge, every legend entry, and a
  viewBox that holds every node.
- A hostile name (``<script>``, ``&``) from the model is text in the SVG, never an element.
- The PNG (cairosvg) decodes with PIL at the size the viewBox and scale give.
- The Export page offers both downloads in English and Chinese (AppTest).
"""

from __future__ import annotations

import io
import xml.etree.ElementTree as ET

import networkx as nx
import pytest

from explorer.fusion_engine import detect
from explorer.graph.synthetic import residual_cnn_graph
from explorer.ui import graph as graph_view
from explorer.ui.graph import ViewOptions
from explorer.ui.graph import svg as graph_svg

NS = "{http://www.w3.org/2000/svg}"
HOSTILE = "<script>alert(1)</script>&amp"


@pytest.fixture(scope="module")
def hostile():
    """Three residual blocks, one op renamed (and its origin) to a hostile module name; the first chain rejected."""
    g = residual_cnn_graph(3)
    g = nx.relabel_nodes(g, {"b1_conv1": HOSTILE})
    g.nodes[HOSTILE]["origin"] = HOSTILE
    det = detect(g)
    accepted = [c.id for c in det.chains[1:]]
    view = graph_view.build_view(g, det, accepted, ViewOptions(highlight=(HOSTILE,)))
    return g, det, view


def _parse(svg: str) -> ET.Element:
    return ET.fromstring(svg.encode("utf-8"))


def test_svg_draws_every_node_band_edge_and_legend_entry(hostile):
    _, det, view = hostile
    legend = graph_svg.legend_entries(det, "en")
    root = _parse(graph_svg.render_svg(view, legend, "synthetic_3 & co"))
    assert root.tag == f"{NS}svg"
    nodes = root.findall(f".//{NS}g[@class='node']")
    assert len(nodes) == len(view.nodes) > 10
    by_id = {g.get("data-id"): g.find(f"{NS}rect") for g in nodes}
    for vn in view.nodes:
        rect = by_id[vn.id]
        assert rect.get("fill") == vn.fill
        assert (rect.get("stroke-dasharray") is not None) == vn.dashed
    assert any(vn.dashed for vn in view.nodes) and view.bands
    bands = root.findall(f".//{NS}g[@class='chain-band']")
    assert sorted(b.get("data-chain") for b in bands) == sorted(b.chain for b in view.bands)
    assert all(b.findall(f"{NS}rect") for b in bands)
    lines = root.findall(f".//{NS}g[@class='edges']/{NS}polyline")
    assert len(lines) == len(view.edges) and all(pl.get("marker-end") == "url(#arrow)" for pl in lines)
    entries = root.findall(f".//{NS}g[@class='legend-entry']")
    assert [e.find(f"{NS}text").text for e in entries] == [e.label for e in legend]
    assert any("(" in e.label for e in legend)       # the patterns with their counts come first
    vx, vy, vw, vh = map(float, root.get("viewBox").split())
    for vn in view.nodes:
        l, t, r, b = graph_view.box_of(vn)
        assert vx <= l and vy <= t and r <= vx + vw and b <= vy + vh
    assert "Noto Sans CJK SC" in root.get("font-family")


def test_hostile_names_are_text(hostile):
    _, det, view = hostile
    hit = next(vn for vn in view.nodes if vn.id == HOSTILE)
    svg = graph_svg.render_svg(view, graph_svg.legend_entries(det, "zh"), f"{HOSTILE} 原始图")
    assert "<script" not in svg and "&amp;lt;" not in svg
    root = _parse(svg)
    assert not [el for el in root.iter() if el.tag.endswith("script")]
    assert root.find(f"{NS}title").text == f"{HOSTILE} 原始图"
    node = next(g for g in root.iter(f"{NS}g") if g.get("data-id") == HOSTILE)
    assert node.find(f"{NS}title").text == hit.title
    assert "".join(node.find(f"{NS}text").itertext()) == hit.label.replace("\n", "")
    assert node.find(f"{NS}rect").get("stroke") == graph_view.HIGHLIGHT_BORDER


def test_png_decodes_at_the_drawing_size(hostile):
    pytest.importorskip("cairosvg")
    from PIL import Image

    _, det, view = hostile
    svg = graph_svg.render_svg(view, graph_svg.legend_entries(det, "zh"), "synthetic_3")
    data = graph_svg.render_png(svg, scale=1.5)
    img = Image.open(io.BytesIO(data))
    img.load()
    assert img.format == "PNG"
    _, _, vw, vh = map(float, _parse(svg).get("viewBox").split())
    assert abs(img.width - vw * 1.5) <= 2 and abs(img.height - vh * 1.5) <= 2
    px = img.convert("RGB")
    assert px.getpixel((1, 1)) == (255, 255, 255)            # the white background
    colours = {px.getpixel((x, y)) for x in range(0, img.width, 7) for y in range(0, img.height, 7)}
    assert len(colours) > 5                                  # something was drawn on it


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_export_page_offers_svg_and_png(lang):
    """The Export page offers the view as SVG and PNG, labelled in the page's language; after the Graph page
    drew a view (with its own options), the Export page offers that view."""
    from pathlib import Path

    from streamlit.testing.v1 import AppTest

    from explorer.ui import i18n

    at = AppTest.from_file(str(Path(__file__).resolve().parents[1] / "explorer" / "app.py"), default_timeout=120)
    at.session_state["zoo_name"] = "residual_block"
    at.session_state["lang"] = lang
    at.run()
    assert not at.exception, at.exception
    at.session_state["graph_export_views"] = {}     # as before any Graph page drew a view
    at.switch_page("ui/pages/export.py").run()
    assert not at.exception, at.exception
    buttons = {b.key: b for b in at.get("download_button")}
    assert {"export_view_original_svg", "export_view_original_png"} <= set(buttons), sorted(buttons)
    for kind in ("svg", "png"):
        b = buttons[f"export_view_original_{kind}"]
        assert b.label == i18n.t_in(lang, f"export.view.{kind}")
        assert b.help == i18n.t_in(lang, f"export.view.{kind}_help")      # enabled: cairosvg is installed here
    texts = [c.value for c in at.caption]
    assert i18n.t_in(lang, "export.view.default") in texts

    at.session_state["graph_direction"] = "LR"
    at.switch_page("ui/pages/graph.py").run()
    assert not at.exception, at.exception
    keys = {b.key for b in at.get("download_button")}
    assert {"graph_export_original_svg", "graph_export_original_png"} <= keys
    recorded = at.session_state["graph_export_views"]["original"]
    assert recorded["lang"] == lang and recorded["view"].direction == "LR"
    at.switch_page("ui/pages/export.py").run()
    assert not at.exception, at.exception
    assert i18n.t_in(lang, "export.view.default") not in [c.value for c in at.caption]
    assert {"export_view_original_svg", "export_view_original_png"} <= {b.key for b in at.get("download_button")}


def test_png_draws_chinese_glyphs_not_boxes():
    """Cairo has no per-glyph fallback: with a Latin-only face every Chinese character is the same empty box.
    Two different characters must draw differently."""
    pytest.importorskip("cairosvg")
    from PIL import Image, ImageChops

    empty = graph_view.GraphView(nodes=(), edges=(), total_nodes=0, depth=0, collapsed_modules=())
    a, b = (Image.open(io.BytesIO(graph_svg.render_png(graph_svg.render_svg(
        empty, [graph_svg.LegendEntry(text, "#ffffff")]), scale=2))).convert("L") for text in ("融合", "拒绝"))
    assert a.size == b.size
    assert ImageChops.difference(a, b).getbbox() is not None


def test_png_of_a_very_tall_view_fits_cairo():
    """Cairo refuses surfaces over 32767 pixels a side: a long unfolded graph is scaled down to fit."""
    pytest.importorskip("cairosvg")
    from PIL import Image

    nodes = tuple(graph_view.ViewNode(id=n, label=n, title=n, fill="#f4f4f4", border="#9e9e9e", y=y)
                  for n, y in (("top", 0.0), ("bottom", 60_000.0)))
    tall = graph_view.GraphView(nodes=nodes, edges=(graph_view.ViewEdge("top", "bottom"),), total_nodes=2,
                                depth=0, collapsed_modules=())
    img = Image.open(io.BytesIO(graph_svg.render_png(graph_svg.render_svg(tall), scale=2)))
    assert img.format == "PNG" and 30_000 < img.height <= graph_svg.MAX_PNG_SIDE and img.width >= 100


def test_overlay_legends_become_rows():
    """An overlay's or the compare view's html legend (app-written chips, a colour bar) as SVG legend rows."""
    from explorer.ui import graph_overlays as overlays

    rows = graph_svg.legend_from_html(overlays.scale_legend_html(
        "speedup", overlays.Scale(kind="ratio", lo=0.5, hi=2.0), "zh"))
    assert [r.label for r in rows] == ["0.50×", "1×", "2.00×", i18n_t("zh", "gv.ov.no_value_short")]
    assert rows[0].fill == overlays.BAD and rows[2].fill == overlays.GOOD
    rows = graph_svg.legend_from_html(overlays.scale_legend_html(
        "bytes", overlays.Scale(kind="count", lo=0, hi=2 ** 21, unit="bytes"), "en"))
    assert [r.label for r in rows][:2] == ["0 B", "2.0 MiB"]
    svg = graph_svg.render_svg(graph_view.GraphView((), (), 0, 0, ()), rows)
    assert len(_parse(svg).findall(f".//{NS}g[@class='legend-entry']")) == len(rows) == 3


def i18n_t(lang: str, key: str) -> str:
    from explorer.ui.i18n import t_in

    return t_in(lang, key)
