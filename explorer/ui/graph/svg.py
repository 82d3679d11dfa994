"""A graph view as one standalone SVG (and a PNG of it), for slides.

``render_svg(view, legend, title)`` is a pure function of a ``GraphView`` (``model``), the same view the
pyvis page draws (``pyvis_page``): the chain
bands behind (the pattern's tint, outlined), the edges as polylines through the layout's waypoints
with an arrow head at the target, the nodes as rounded boxes (fill, border, dashed as the HTML view
draws them, the highlight border for search hits), their labels, a title and the legend below.
Its viewBox fits the drawing. Every text in it comes from a model (names, origins) or a catalog and
is escaped (``xml.sax.saxutils``): a label ``<script>`` is text, never markup.

``render_png(svg)`` rasterises that SVG with cairosvg (the optional ``png`` extra, over the system's
libcairo); without it it raises ``PngUnavailable`` with one line saying so. Cairo draws a text in one
face (no per-glyph fallback), so the PNG names the one face fontconfig picks for Chinese.

``legend_entries(detection, lang, fused)`` is the legend the Graph page shows (the patterns the model
has, with their counts, then every style the view uses) as ``LegendEntry`` rows, in ``lang``.

No Streamlit here.
"""

from __future__ import annotations

import dataclasses
import functools
import html as html_lib
import math
import re
from typing import Iterable, Sequence
from xml.sax.saxutils import escape, quoteattr

from explorer.ui.graph.build import legend as pattern_legend
from explorer.ui.graph.model import (BAND_PAD, EDGE_COLOR, FONT_PX, GROUP_BORDER, GROUP_COLOR, HIGHLIGHT_BORDER,
                                     IO_COLOR, PLAIN_COLOR, REJECTED_FILL, GraphView, ViewNode, border_width, box_of,
                                     text_color)
from explorer.ui.i18n import t_in, translate_text

FONT_FAMILY = ("system-ui, -apple-system, 'Segoe UI', Roboto, 'Helvetica Neue', Arial, "
               "'Noto Sans CJK SC', 'Noto Sans SC', 'Source Han Sans SC', 'PingFang SC', "
               "'Microsoft YaHei', 'WenQuanYi Micro Hei', sans-serif")
MARGIN = 24
LEGEND_ROW = 22
LEGEND_SWATCH = 14
TITLE_PX = 18


class PngUnavailable(RuntimeError):
    """PNG export needs cairosvg (``pip install 'fusion-explorer[png]'``) and libcairo."""


@dataclasses.dataclass(frozen=True)
class LegendEntry:
    """One legend row: a swatch (fill, border, dashed?) and its text."""

    label: str
    fill: str
    border: str = "#999999"
    dashed: bool = False


def legend_entries(detection, lang: str = "en", fused: bool = False) -> list[LegendEntry]:
    """The Graph page's legend (``pages.graph.legend_html``) as rows: patterns present, then styles."""
    out = []
    for item in pattern_legend(detection):
        label = t_in(lang, "graph.legend.unknown") if item.name == "unknown" else translate_text(item.label, lang)
        out.append(LegendEntry(f"{label} ({item.count})", item.color, item.color))
    out.append(LegendEntry(t_in(lang, "graph.legend.rejected"), REJECTED_FILL, "#777777", True))
    out.append(LegendEntry(t_in(lang, "graph.legend.plain"), PLAIN_COLOR, "#999999"))
    out.append(LegendEntry(t_in(lang, "graph.legend.band"), "#ffffff", "#777777"))
    out.append(LegendEntry(t_in(lang, "graph.legend.io"), IO_COLOR, "#999999"))
    out.append(LegendEntry(t_in(lang, "graph.legend.module"), GROUP_COLOR, GROUP_BORDER))
    out.append(LegendEntry(t_in(lang, "graph.legend.module_rejected"), REJECTED_FILL,
                           GROUP_BORDER, True))
    if fused:
        out.append(LegendEntry(t_in(lang, "graph.legend.fused"), "#dddddd", "#333333"))
        out.append(LegendEntry(t_in(lang, "graph.legend.no_kernel"), "#dddddd", "#333333", True))
    return out


_CHIP = re.compile(r"background:\s*([#\w(),. ]+?);\s*border:\s*([^;']*)[^']*'></span>(.*?)</span>", re.DOTALL)
_BAR = re.compile(r"linear-gradient\(to right,([^)]*)\)'></div>(.*?)</div>", re.DOTALL)
_TAG = re.compile(r"<[^>]*>")


def legend_from_html(legend: str) -> list[LegendEntry]:
    """The rows of a legend the app wrote as html chips (``ui.graph_overlays.*_legend_html``): each chip's
    colour, border and text, and an overlay's colour bar as its end (and middle) colours with their ticks."""
    out = []
    bar = _BAR.search(legend)
    if bar:
        stops = [c.strip() for c in bar.group(1).split(",")]
        ticks = [html_lib.unescape(_TAG.sub("", t)) for t in re.findall(r"<span>(.*?)</span>", bar.group(2))]
        if len(stops) == 2 and len(ticks) == 3:
            ticks = [ticks[0], ticks[2]]
        for colour, tick in zip(stops, ticks):
            out.append(LegendEntry(tick, colour, "#999999"))
    for colour, border, text in _CHIP.findall(legend):
        label = " ".join(html_lib.unescape(_TAG.sub("", text)).split())
        dashed = "dashed" in border
        edge = re.search(r"#[0-9a-fA-F]{3,6}", border)
        out.append(LegendEntry(label, colour.strip(), edge.group(0) if edge else "#999999", dashed))
    return out


def _num(v: float) -> str:
    return f"{v:.1f}".rstrip("0").rstrip(".")


def _color(c: str) -> str:
    """A colour from the view as an attribute value (quoted and escaped; an odd one draws nothing odd)."""
    return quoteattr(c if isinstance(c, str) and c else "#000000")


def _bounds(view: GraphView) -> tuple[float, float, float, float]:
    xs0, ys0, xs1, ys1 = [], [], [], []
    for n in view.nodes:
        l, t, r, b = box_of(n)
        xs0.append(l - BAND_PAD - 2), ys0.append(t - BAND_PAD - 2), xs1.append(r + BAND_PAD + 2)
        ys1.append(b + BAND_PAD + 2)
    for e in view.edges:
        for x, y in e.points:
            xs0.append(x), xs1.append(x), ys0.append(y), ys1.append(y)
    if not xs0:
        return 0.0, 0.0, 200.0, 60.0
    return min(xs0), min(ys0), max(xs1), max(ys1)


def _text_width(text: str, px: float) -> float:
    """A generous width estimate (CJK characters count double)."""
    return sum(px * (1.0 if ord(ch) > 0x2E80 else 0.6) for ch in text)


def _band(band, where: dict[str, ViewNode], grow: float, color: str) -> list[str]:
    out = []
    neck_x = min((where[i].width for i in band.nodes if i in where), default=0) + 2 * BAND_PAD
    neck_y = min((where[i].height for i in band.nodes if i in where), default=0) + 2 * BAND_PAD
    for nid in band.nodes:
        vn = where.get(nid)
        if vn is None:
            continue
        l, t, r, b = box_of(vn)
        pad = BAND_PAD + grow
        h = b - t + 2 * pad
        out.append(f'<rect class="band" x="{_num(l - pad)}" y="{_num(t - pad)}" width="{_num(r - l + 2 * pad)}" '
                   f'height="{_num(h)}" rx="{_num(min(10, h / 3))}" fill={color}/>')
    for path in band.paths:
        for (x0, y0), (x1, y1) in zip(path, path[1:]):
            w = neck_x if abs(x0 - x1) < 1 else neck_y if abs(y0 - y1) < 1 else 22
            out.append(f'<line x1="{_num(x0)}" y1="{_num(y0)}" x2="{_num(x1)}" y2="{_num(y1)}" '
                       f'stroke={color} stroke-width="{_num(w + 2 * grow)}"/>')
    return out


def _arrow_end(points: list[tuple[float, float]], target: ViewNode) -> list[tuple[float, float]]:
    """The polyline cut where it enters the target's box, so the arrow head touches the border."""
    (x0, y0), (x1, y1) = points[-2], points[-1]
    l, t, r, b = box_of(target)
    dx, dy = x1 - x0, y1 - y0
    best = 1.0
    for pk, edge in ((dx, l), (dx, r)):
        if pk:
            s = (edge - x0) / pk
            y = y0 + s * dy
            if 0 <= s <= best and t - 1e-6 <= y <= b + 1e-6:
                best = s
    for pk, edge in ((dy, t), (dy, b)):
        if pk:
            s = (edge - y0) / pk
            x = x0 + s * dx
            if 0 <= s <= best and l - 1e-6 <= x <= r + 1e-6:
                best = s
    return [*points[:-1], (x0 + best * dx, y0 + best * dy)]


def render_svg(view: GraphView, legend: Sequence[LegendEntry] = (), title: str = "") -> str:
    """The view as one standalone SVG document (UTF-8 text)."""
    left, top, right, bottom = _bounds(view)
    body = [*_band_elements(view), *_edge_elements(view), *_node_elements(view)]
    # title above, legend below the drawing
    head = []
    if title:
        top -= TITLE_PX * 2
        head.append(f'<text class="title" x="{_num(left)}" y="{_num(top + TITLE_PX)}" font-size="{TITLE_PX}" '
                    f'font-weight="bold" fill="#222222">{escape(title)}</text>')
    width = right - left
    legend_rows, y = _legend_elements(legend, left, width, bottom)
    if legend_rows:
        bottom = y + LEGEND_ROW / 2
        right = max(right, left + max(width, 480))
    if title:
        right = max(right, left + _text_width(title, TITLE_PX))
    vx, vy = left - MARGIN, top - MARGIN
    vw, vh = right - left + 2 * MARGIN, bottom - top + 2 * MARGIN
    return "".join([
        '<?xml version="1.0" encoding="UTF-8"?>\n',
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="{_num(vx)} {_num(vy)} {_num(vw)} {_num(vh)}" '
        f'width="{_num(vw)}" height="{_num(vh)}" font-family={quoteattr(FONT_FAMILY)} font-size="{FONT_PX}">',
        f"<title>{escape(title)}</title>" if title else "",
        '<defs><marker id="arrow" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="7" markerHeight="7" '
        f'markerUnits="userSpaceOnUse" orient="auto"><path d="M0,0 L10,5 L0,10 z" fill="{EDGE_COLOR}"/>'
        "</marker></defs>",
        f'<rect class="background" x="{_num(vx)}" y="{_num(vy)}" width="{_num(vw)}" height="{_num(vh)}" '
        'fill="#ffffff"/>',
        *head, *body, '<g class="legend">', *legend_rows, "</g></svg>\n",
    ])


def _band_elements(view: GraphView) -> list[str]:
    """The chain bands: outline first, then the fill over it (one outline per band), as the HTML view does."""
    where = {n.id: n for n in view.nodes}
    out: list[str] = []
    for band in view.bands:
        out.append(f'<g class="chain-band" data-chain={quoteattr(band.chain)}><title>{escape(band.title)}</title>')
        out += _band(band, where, 2, _color(band.border))
        out += _band(band, where, 0, _color(band.fill))
        out.append("</g>")
    return out


def _edge_elements(view: GraphView) -> list[str]:
    """The edges as polylines through their waypoints, cut at the target's border for the arrow head."""
    where = {n.id: n for n in view.nodes}
    out = [f'<g class="edges" fill="none" stroke="{EDGE_COLOR}" stroke-linejoin="round">']
    for e in view.edges:
        if e.source not in where or e.target not in where:
            continue
        s, tgt = where[e.source], where[e.target]
        pts = _arrow_end([(s.x, s.y), *e.points, (tgt.x, tgt.y)], tgt)
        width = min(1.2 + math.log2(max(e.weight, 1)), 5)
        out.append(f'<polyline points="{" ".join(f"{_num(x)},{_num(y)}" for x, y in pts)}" '
                   f'stroke-width="{_num(width)}" marker-end="url(#arrow)">'
                   + (f"<title>{escape(e.title)}</title>" if e.title else "") + "</polyline>")
    out.append("</g>")
    return out


def _node_elements(view: GraphView) -> list[str]:
    """The nodes: rounded boxes (dashed, or the highlight border) with their label lines centred."""
    out = ['<g class="nodes">']
    for vn in view.nodes:
        l, t, r, b = box_of(vn)
        border = HIGHLIGHT_BORDER if vn.highlighted else vn.border
        dash = ' stroke-dasharray="6 4"' if vn.dashed else ""
        out.append(f'<g class="node" data-id={quoteattr(vn.id)}><title>{escape(vn.title)}</title>'
                   f'<rect x="{_num(l)}" y="{_num(t)}" width="{_num(vn.width)}" height="{_num(vn.height)}" rx="4" '
                   f'fill={_color(vn.fill)} stroke={_color(border)} stroke-width="{_num(border_width(vn))}"{dash}/>')
        lines = vn.label.split("\n") or [""]
        y0 = vn.y - (len(lines) - 1) * FONT_PX * 1.2 / 2
        out.append(f'<text x="{_num(vn.x)}" text-anchor="middle" dominant-baseline="central" '
                   f'fill="{text_color(vn.fill)}">'
                   + "".join(f'<tspan x="{_num(vn.x)}" y="{_num(y0 + i * FONT_PX * 1.2)}">{escape(line)}</tspan>'
                             for i, line in enumerate(lines)) + "</text></g>")
    out.append("</g>")
    return out


def _legend_elements(legend: Sequence[LegendEntry], left: float, width: float,
                     bottom: float) -> tuple[list[str], float]:
    """The legend's swatches and texts in rows below ``bottom``, wrapped at the drawing's width (at least
    480); and the last row's y."""
    rows: list[str] = []
    y = bottom + LEGEND_ROW
    x = left
    for entry in legend:
        w = LEGEND_SWATCH + 8 + _text_width(entry.label, 12) + 20
        if x > left and x + w > left + max(width, 480):
            x, y = left, y + LEGEND_ROW
        dash = ' stroke-dasharray="4 3"' if entry.dashed else ""
        rows.append(f'<g class="legend-entry"><rect x="{_num(x)}" y="{_num(y - LEGEND_SWATCH / 2)}" '
                    f'width="{LEGEND_SWATCH}" height="{LEGEND_SWATCH}" rx="2" fill={_color(entry.fill)} '
                    f'stroke={_color(entry.border)} stroke-width="1.5"{dash}/>'
                    f'<text x="{_num(x + LEGEND_SWATCH + 6)}" y="{_num(y)}" dominant-baseline="central" '
                    f'font-size="12" fill="#222222">{escape(entry.label)}</text></g>')
        x += w
    return rows, y


MAX_PNG_PIXELS = 40_000_000   # about 6300 x 6300; a larger drawing is scaled down to fit
MAX_PNG_SIDE = 32_000


def render_png(svg: str, scale: float = 2.0) -> bytes:
    """``svg`` (from ``render_svg``) as PNG bytes, at ``scale`` pixels per unit (less if it would be huge)."""
    try:
        import cairosvg
    except (ImportError, OSError) as exc:   # OSError: cairocffi found no libcairo
        raise PngUnavailable(f"PNG export needs cairosvg and libcairo (pip install 'fusion-explorer[png]'): "
                             f"{str(exc).splitlines()[0] if str(exc) else type(exc).__name__}") from None
    m = re.search(r'viewBox="[-\d.]+ [-\d.]+ ([\d.]+) ([\d.]+)"', svg)
    if m:
        w, h = max(float(m.group(1)), 1.0), max(float(m.group(2)), 1.0)
        # cairo's image surfaces are at most 32767 pixels a side; and a huge one would not fit memory
        scale = min(scale, math.sqrt(MAX_PNG_PIXELS / (w * h)), MAX_PNG_SIDE / w, MAX_PNG_SIDE / h)
    # cairo draws each text in one face, with no per-glyph fallback: a stack of families would draw Chinese
    # as empty boxes. The PNG uses the one sans-serif face fontconfig picks for Chinese (it has Latin too).
    family = png_font_family()
    svg = svg.replace(f"font-family={quoteattr(FONT_FAMILY)}", f"font-family={quoteattr(family)}", 1)
    return cairosvg.svg2png(bytestring=svg.encode("utf-8"), scale=scale, background_color="white")


@functools.lru_cache(maxsize=1)
def png_font_family() -> str:
    """The sans-serif family fontconfig (``fc-match``) picks for Simplified Chinese, else "sans-serif"."""
    import shutil
    import subprocess

    exe = shutil.which("fc-match")
    if exe is None:
        return "sans-serif"
    try:
        out = subprocess.run([exe, "-f", "%{family[0]}", "sans-serif:lang=zh-cn"], capture_output=True, text=True,
                             timeout=10)
    except (OSError, subprocess.SubprocessError):
        return "sans-serif"
    family = out.stdout.strip()
    return family if out.returncode == 0 and family and len(family) < 100 else "sans-serif"


def file_stem(name: str) -> str:
    """A model's name as a safe file-name part."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name).strip("._")[:80] or "model"


__all__: Iterable[str] = ("LegendEntry", "PngUnavailable", "legend_entries", "render_svg", "render_png", "file_stem")
