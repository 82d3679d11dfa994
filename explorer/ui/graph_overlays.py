"""The Graph page's layers over ``explorer.ui.graph``: torch.compile's kernels as bands, our chains
beside them, per-chain overlays from a run report, their legends, and the view as one file to send.

Pure (no Streamlit): every function takes values and returns values or html, so the tests read
them directly. The drawn view is ``explorer.ui.graph``'s; this module only chooses what the bands are
(``kernel_detection``, ``compare_detection``), repaints a built ``GraphView`` (``paint``) and adds
to the drawing's html (``decorate``: the legend inside the page, a label over each band)::

    view "torch.compile"   one band per inductor kernel, coloured by its kind, labelled name (kind)
    view "compare"         our chains coloured both / partly / ours only; groups only inductor fuses
                           as bands of their own; ops inductor runs as single-op kernels marked
    overlay (any view of our chains: Original, Fused, Side by side)
                           each measured chain coloured by speed-up (with its verdict), bytes saved,
                           launches saved, precision change against float64, or measured / predicted gain

Colour scales: a diverging red-white-green scale on a log axis for ratios (speed-up, measured over
predicted, error change: green is better), a white-to-blue scale for counts saved.
"""

from __future__ import annotations

import dataclasses
import html as html_lib
import json
import math
from typing import Any, Iterable, Mapping

from explorer.ui import graph as graph_view
from explorer.fusions.base import Chain, Detection
from explorer.report import chain_speedups
from explorer.ui.i18n import t_in
from explorer.units import human_bytes

#: Overlays a link may name (``&overlay=speedup``); "none" draws the patterns' colours.
OVERLAYS = ("none", "speedup", "bytes", "launches", "precision", "predicted")
#: Compare categories, in legend order.
COMPARE = ("both", "partly", "ours", "inductor", "separate")
COMPARE_COLORS = {"both": "#43a047", "partly": "#fb8c00", "ours": "#1e88e5", "inductor": "#8e24aa",
                  "separate": "#b0bec5"}
KIND_COLORS = {"triton_pointwise": "#26a69a", "triton_reduction": "#ab47bc",
               "triton_persistent_reduction": "#7e57c2", "triton_template": "#ef5350", "triton": "#4db6ac",
               "cpp": "#42a5f5", "extern": "#8d6e63"}
NO_VALUE = "#d6d6d6"      # a chain the report has no number for
BAD, MID, GOOD, LOW, HIGH = "#d73027", "#f7f7f7", "#1a9850", "#f7fbff", "#08519c"
PREFIX = "inductor:"      # chain ids of the bands made for inductor's kernels and groups


# ------------------------------------------------------------------ bands: inductor's kernels, the comparison

def _pseudo_chain(cid: str, pattern: str, nodes: list[str], graph: Any) -> Chain:
    kinds = tuple(str(graph.nodes[n].get("kind", "?")) for n in nodes)
    return Chain(id=cid, pattern=pattern, ops=kinds, nodes=tuple(nodes),
                 names=tuple(str(graph.nodes[n].get("origin", n)) for n in nodes),
                 roles=tuple((n, k) for n, k in zip(nodes, kinds)), bytes_saved=0, launches_saved=0)


def _in_order(graph: Any, nodes: Iterable[str]) -> list[str]:
    return sorted((n for n in nodes if n in graph), key=lambda n: graph.nodes[n].get("order", 0))


def kernel_detection(graph: Any, cmap: Any, model: str = "") -> tuple[Detection, dict[str, Any]]:
    """A ``Detection`` whose chains are inductor's kernels (those owning a node of ``graph``), for
    ``graph_view.build_view``; and {chain id: the ``compile_map.Kernel``}."""
    chains, kernels = [], {}
    for k in cmap.kernels:
        nodes = _in_order(graph, k.nodes)
        if not nodes:
            continue
        cid = PREFIX + k.key
        chains.append(_pseudo_chain(cid, PREFIX + k.kind, nodes, graph))
        kernels[cid] = k
    return Detection(model=model, fingerprint=cmap.fingerprint, chains=tuple(chains), near_misses=(),
                     totals={}, counts={}), kernels


def compare_detection(graph: Any, detection: Detection, comparison: Any) -> tuple[Detection, dict[str, str]]:
    """Our chains and the groups only inductor fuses (their nodes outside our chains) as one
    ``Detection``; and {chain id: compare category}."""
    status = comparison.status_of()
    category = {c.id: status.get(c.id, "ours") for c in detection.chains}
    ours = {n for c in detection.chains for n in c.nodes}
    chains = list(detection.chains)
    for g in comparison.only_inductor:
        nodes = [n for n in _in_order(graph, g.nodes) if n not in ours]
        if nodes:
            cid = PREFIX + g.kernel
            chains.append(_pseudo_chain(cid, PREFIX + "group", nodes, graph))
            category[cid] = "inductor"
    return dataclasses.replace(detection, chains=tuple(chains)), category


# ------------------------------------------------------------------ repainting a built view

@dataclasses.dataclass(frozen=True)
class Paint:
    """How one chain (or one node) is drawn: fill, border, lines added to its tooltip, its band's label."""

    fill: str
    border: str
    tip: tuple[str, ...] = ()
    label: str = ""


def paint(view: Any, chains: Mapping[str, Paint], nodes: Mapping[str, Paint] | None = None) -> Any:
    """``view`` (a ``graph_view.GraphView``) with the chains and nodes named repainted (a node's own paint
    over its chain's); the rest as drawn."""
    nodes = nodes or {}
    new_nodes = []
    for vn in view.nodes:
        p = nodes.get(vn.id) or (chains.get(vn.chain) if vn.chain else None)
        if p is None:
            new_nodes.append(vn)
            continue
        title = vn.title + ("\n" + "\n".join(p.tip) if p.tip else "")
        new_nodes.append(dataclasses.replace(vn, fill=p.fill, border=p.border, title=title, dashed=False))
    bands = []
    for b in view.bands:
        p = chains.get(b.chain)
        if p is None:
            bands.append(b)
            continue
        bands.append(dataclasses.replace(b, fill=_tint(p.fill, 0.45), border=_darker(p.fill),
                                         title=p.label or b.title))
    return dataclasses.replace(view, nodes=tuple(new_nodes), bands=tuple(bands))


def kernel_paint(kernels: Mapping[str, Any], lang: str = "en") -> dict[str, Paint]:
    """One ``Paint`` per inductor kernel band: its kind's colour, labelled ``name (kind)``."""
    from explorer.runtime.compile_map import kind_label

    out = {}
    for cid, k in kernels.items():
        color = KIND_COLORS.get(k.kind, NO_VALUE)
        kind = kind_label(k.kind, k.library)
        tip = [t_in(lang, "gv.cmp.kernel", name=k.name, kind=kind),
               t_in(lang, "gv.cmp.kernel_ops", n=len(k.nodes), ops=", ".join(k.nodes[:8]) + (" …" if len(k.nodes) > 8 else ""))]
        if k.touches:
            tip.append(t_in(lang, "gv.cmp.touches", nodes=", ".join(k.touches[:6]) + (" …" if len(k.touches) > 6 else "")))
        if k.replaced:
            tip.append(t_in(lang, "gv.cmp.replaced", nodes=", ".join(k.replaced[:6])))
        out[cid] = Paint(color, _darker(color), tuple(tip), f"{k.name} ({kind})")
    return out


def compare_paint(category: Mapping[str, str], comparison: Any, graph: Any, cmap: Any,
                  lang: str = "en") -> tuple[dict[str, Paint], dict[str, Paint]]:
    """Chain paints by compare category, and node paints for the ops inductor runs alone."""
    owner = cmap.owner()
    kernels_of = {c.chain_id: c.kernels for c in comparison.chains}
    chains = {}
    for cid, cat in category.items():
        color = COMPARE_COLORS[cat]
        keys = kernels_of.get(cid, ()) if cat != "inductor" else (cid[len(PREFIX):],)
        tip = [t_in(lang, f"gv.cmp.status.{cat}"), t_in(lang, "gv.cmp.kernels", kernels=", ".join(keys) or "-")]
        if cat == "inductor":
            group = next((g for g in comparison.only_inductor if PREFIX + g.kernel == cid), None)
            if group is not None:
                tip.append(t_in(lang, "gv.cmp.candidate", ops=" → ".join(group.ops)))
        label = t_in(lang, f"graph.cmp.{cat}")
        chains[cid] = Paint(color, _darker(color), tuple(tip), label)
    nodes = {}
    for node, kind, key in comparison.separate:
        if node in graph:
            k = owner.get(node)
            name = k.label if k is not None else key
            nodes[node] = Paint(COMPARE_COLORS["separate"], "#607d8b", (t_in(lang, "gv.cmp.separate", kernel=name),))
    return chains, nodes


# ------------------------------------------------------------------ overlays from a report

@dataclasses.dataclass(frozen=True)
class OverlayValue:
    """One chain's number under an overlay, how it reads, and its verdict (speed-up only)."""

    value: float | None
    text: str
    verdict: str = ""


@dataclasses.dataclass(frozen=True)
class Scale:
    """A colour scale: ``log`` ratios between ``lo`` and ``hi`` around 1 (diverging, ``better`` says
    which side is green), or counts from 0 to ``hi`` (sequential)."""

    kind: str              # ratio | count
    lo: float
    hi: float
    better: str = "high"   # ratio: is a high value good (speed-up) or bad (error growth)
    unit: str = ""


def _plain(report: Any) -> dict:
    from explorer.teaching.readers import as_plain

    value = as_plain(report)
    return value if isinstance(value, dict) else {}


def report_matches(report: Any, detection: Detection) -> bool:
    """The report was measured on this graph (by fingerprint, else by model name)."""
    data = _plain(report)
    model, plan = data.get("model") or {}, data.get("plan") or {}
    fp = model.get("fingerprint") or plan.get("fingerprint")
    if fp:
        return fp == detection.fingerprint
    return model.get("name") == detection.model


def overlay_values(measure: str, report: Any, detection: Detection,
                   predicted: Mapping[str, float] | None = None, lang: str = "en") -> dict[str, OverlayValue]:
    """{chain id: OverlayValue} of every chain ``report`` measured, under ``measure`` (``OVERLAYS``).

    ``predicted`` is {chain id: predicted gain} (``teaching.predict``) for the "predicted" overlay.
    A chain the report has no number for is left out (drawn in ``NO_VALUE``).
    """
    if measure == "none" or report is None or not report_matches(report, detection):
        return {}
    entries = _plain(report).get("chains") or []
    out: dict[str, OverlayValue] = {}
    for e in entries:
        if not isinstance(e, dict) or "id" not in e:
            continue
        cid = str(e["id"])
        verdict = e.get("verdict") or {}
        label = str(verdict.get("label", "")) if isinstance(verdict, dict) else str(verdict)
        speedup = chain_speedups(e)[0]   # THE chain speed-up (its verdict's paired estimate), as the Results page
        if measure == "speedup":
            if speedup is not None:
                out[cid] = OverlayValue(speedup, f"{speedup:.2f}×", label)
        elif measure == "bytes":
            bu, bf = e.get("bytes_unfused"), e.get("bytes_fused")
            if isinstance(bu, (int, float)) and isinstance(bf, (int, float)):
                out[cid] = OverlayValue(float(bu - bf), human_bytes(int(bu - bf)), label)
        elif measure == "launches":
            lu, lf = e.get("launches_unfused"), e.get("launches_fused")
            if isinstance(lu, (int, float)) and isinstance(lf, (int, float)):
                out[cid] = OverlayValue(float(lu - lf), f"{int(lu - lf)}", label)
        elif measure == "precision":
            ef, eu = e.get("rel_err"), e.get("rel_err_unfused")
            if isinstance(ef, (int, float)) and isinstance(eu, (int, float)) and math.isfinite(ef) and math.isfinite(eu):
                floor = 1e-12
                ratio = max(ef, floor) / max(eu, floor)
                out[cid] = OverlayValue(ratio, t_in(lang, "gv.ov.precision_text", fused=f"{ef:.2e}",
                                                    unfused=f"{eu:.2e}", ratio=f"{ratio:.2f}"), label)
        elif measure == "predicted":
            gain = (predicted or {}).get(cid)
            if speedup is not None and gain:
                ratio = speedup / gain
                out[cid] = OverlayValue(ratio, t_in(lang, "gv.ov.predicted_text", measured=f"{speedup:.2f}",
                                                    predicted=f"{gain:.2f}", ratio=f"{ratio:.2f}"), label)
    return out


def scale_for(measure: str, values: Mapping[str, OverlayValue]) -> Scale:
    """The scale an overlay is drawn in, its range from the values (ratios symmetric on a log axis)."""
    nums = [v.value for v in values.values() if v.value is not None and v.value > 0]
    if measure in ("bytes", "launches"):
        hi = max([v.value for v in values.values() if v.value is not None] + [1.0])
        return Scale("count", 0.0, float(hi), unit="bytes" if measure == "bytes" else "launches")
    spread = max([abs(math.log(v)) for v in nums] + [math.log(1.25)])
    spread = min(spread, math.log(100.0))
    return Scale("ratio", math.exp(-spread), math.exp(spread), better="low" if measure == "precision" else "high")


def color_for(scale: Scale, value: float | None) -> str:
    """The colour of ``value`` on ``scale`` (``NO_VALUE`` for none)."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return NO_VALUE
    if scale.kind == "count":
        x = 0.0 if scale.hi <= 0 else min(max(value / scale.hi, 0.0), 1.0)
        return _mix(LOW, HIGH, x)
    if value <= 0:
        return NO_VALUE
    x = math.log(value) / math.log(scale.hi) if scale.hi > 1 else 0.0   # -1 .. 1
    x = min(max(x, -1.0), 1.0)
    good, bad = (GOOD, BAD) if scale.better == "high" else (BAD, GOOD)
    return _mix(MID, good, x) if x >= 0 else _mix(MID, bad, -x)


def overlay_paint(measure: str, values: Mapping[str, OverlayValue], detection: Detection, scale: Scale,
                  lang: str = "en") -> dict[str, Paint]:
    """A ``Paint`` for every chain of ``detection``: its value's colour, or ``NO_VALUE`` with a note."""
    out = {}
    name = t_in(lang, f"graph.overlay.{measure}")
    for c in detection.chains:
        v = values.get(c.id)
        if v is None:
            out[c.id] = Paint(NO_VALUE, "#9e9e9e", (t_in(lang, "gv.ov.no_value", measure=name),))
            continue
        color = color_for(scale, v.value)
        tip = [t_in(lang, "gv.ov.value", measure=name, value=v.text)]
        if v.verdict:
            tip.append(t_in(lang, "gv.ov.verdict", verdict=translate_verdict(v.verdict, lang)))
        out[c.id] = Paint(color, _darker(color), tuple(tip), f"{v.text}" + (f" · {translate_verdict(v.verdict, lang)}"
                                                                              if measure == "speedup" and v.verdict else ""))
    return out


def translate_verdict(label: str, lang: str) -> str:
    """A report's verdict label (``faster``, ``slower``, ...) in ``lang``, through the catalog's ``verdict.*``."""
    key = "verdict." + label.replace(" ", "_").replace("-", "_")
    text = t_in(lang, key)
    return label if text.startswith("[") else text


# ------------------------------------------------------------------ legends

def _chip(color: str, text: str, border: str = "1px solid #777") -> str:
    return (f"<span style='display:inline-block;margin:1px 10px 1px 0;white-space:nowrap'>"
            f"<span style='display:inline-block;width:11px;height:11px;border-radius:2px;background:{color};"
            f"border:{border};vertical-align:middle'></span> {text}</span>")


def kernel_legend_html(kernels: Mapping[str, Any], lang: str = "en") -> str:
    """The torch.compile view's legend: each kernel kind present, with its count."""
    from collections import Counter

    from explorer.runtime.compile_map import kind_label

    counts = Counter((k.kind, k.library) for k in kernels.values())
    chips = [_chip(KIND_COLORS.get(kind, NO_VALUE), f"{html_lib.escape(kind_label(kind, lib))} <b>{n}</b>")
             for (kind, lib), n in sorted(counts.items())]
    return _legend_box(t_in(lang, "graph.legend.kernels"), "".join(chips))


def compare_legend_html(comparison: Any, lang: str = "en") -> str:
    """The compare view's legend: both / partly / ours only / only inductor / separate, with counts."""
    from collections import Counter

    counts = Counter(c.status for c in comparison.chains)
    counts["inductor"] = len(comparison.only_inductor)
    counts["separate"] = len(comparison.separate)
    chips = [_chip(COMPARE_COLORS[c], f"{html_lib.escape(t_in(lang, f'graph.cmp.{c}'))} <b>{counts[c]}</b>")
             for c in COMPARE]
    return _legend_box(t_in(lang, "graph.legend.compare"), "".join(chips))


def scale_legend_html(measure: str, scale: Scale, lang: str = "en") -> str:
    """An overlay's legend: the colour bar with its ends and middle, and the no-value colour."""
    if scale.kind == "count":
        stops = [LOW, HIGH]
        fmt = (lambda v: human_bytes(int(v))) if scale.unit == "bytes" else (lambda v: f"{v:g}")
        ticks = [fmt(0), fmt(scale.hi / 2), fmt(scale.hi)]
    else:
        lo, hi = (BAD, GOOD) if scale.better == "high" else (GOOD, BAD)
        stops = [lo, MID, hi]
        ticks = [f"{scale.lo:.2f}×", "1×", f"{scale.hi:.2f}×"]
    bar = (f"<div style='height:10px;width:180px;border:1px solid #999;background:linear-gradient(to right,"
           f"{','.join(stops)})'></div><div style='display:flex;justify-content:space-between;width:182px;"
           f"font-size:11px'>" + "".join(f"<span>{html_lib.escape(x)}</span>" for x in ticks) + "</div>")
    note = t_in(lang, f"gv.ov.note.{measure}")
    body = (f"<div style='display:inline-block;vertical-align:middle;margin-right:12px'>{bar}</div>"
            + _chip(NO_VALUE, html_lib.escape(t_in(lang, "gv.ov.no_value_short")))
            + f"<div style='font-size:11px;color:#555'>{html_lib.escape(note)}</div>")
    return _legend_box(t_in(lang, f"graph.overlay.{measure}"), body, kind=f"overlay-{measure}")


def _legend_box(title: str, body: str, kind: str = "") -> str:
    return (f"<div class='fe-legend' data-kind='{html_lib.escape(kind)}' style='font-size:12px;line-height:1.5'>"
            f"<b>{html_lib.escape(title)}</b><br>{body}</div>")


# ------------------------------------------------------------------ the drawing: legend inside, band labels

_LABELS_JS = r"""
(function () {
  const FE = window.FE, net = network;
  net.on("afterDrawing", function (ctx) {
    ctx.font = "bold 12px sans-serif"; ctx.textBaseline = "bottom";
    for (const band of FE.bandLabels || []) {
      let box = null;
      for (const id of band.nodes) {
        const b = net.getBoundingBox(id);
        if (b && (!box || b.top < box.top || (b.top === box.top && b.left < box.left))) box = b;
      }
      if (!box) continue;
      const x = box.left - FE.bandPad, y = box.top - FE.bandPad - 3, w = ctx.measureText(band.label).width;
      ctx.fillStyle = "rgba(255,255,255,0.85)"; ctx.fillRect(x - 2, y - 14, w + 4, 15);
      ctx.fillStyle = band.color; ctx.fillText(band.label, x, y);
    }
  });
  net.redraw();
})();
"""


def decorate(html: str, view: Any, legend: str = "", layer: str = "", title: str = "") -> str:
    """The drawing's html with ``legend`` (html) shown inside it at the bottom left, each band's title
    drawn over it (none when ``view`` is None), ``window.FE.layer`` and ``window.FE.legend`` set (what a test reads), and a title."""
    labels = [{"nodes": list(b.nodes), "label": b.title, "color": _darker(b.border)}
              for b in (view.bands if view is not None else ())]
    box = ""
    if legend:
        box = ("<div id='fe-legend' style='position:absolute;left:8px;bottom:8px;z-index:6;max-width:70%;"
               "background:rgba(255,255,255,0.92);border:1px solid #9e9e9e;border-radius:4px;padding:4px 8px;"
               f"font-family:sans-serif'>{legend}</div>")
    script = (f"<script>window.FE.layer = {json.dumps(layer)}; window.FE.legend = {json.dumps(bool(legend))};"
              f"window.FE.bandLabels = {json.dumps(labels)};{_LABELS_JS}</script>")
    out = html.replace("</body>", box + script + "</body>", 1)
    if title:
        out = out.replace("<head>", f"<head><title>{html_lib.escape(title)}</title>", 1)
    if box:
        out = out.replace("<head>", "<head><style>body{position:relative}</style>", 1)
    return out


def export_html(html: str) -> bytes:
    """The drawing as a standalone file: everything in line already; refused if it would fetch anything."""
    remote = graph_view.remote_urls(html)
    if remote:
        raise ValueError(f"the view would fetch {len(remote)} remote file(s)")
    return html.encode("utf-8")


# ------------------------------------------------------------------ colours

def _rgb(color: str) -> tuple[int, int, int]:
    c = color.lstrip("#")
    return int(c[0:2], 16), int(c[2:4], 16), int(c[4:6], 16)


def _mix(a: str, b: str, x: float) -> str:
    ra, rb = _rgb(a), _rgb(b)
    return "#" + "".join(f"{round(p + (q - p) * x):02x}" for p, q in zip(ra, rb))


def _tint(color: str, strength: float) -> str:
    return _mix("#ffffff", color, strength)


def _darker(color: str, factor: float = 0.65) -> str:
    return _mix("#000000", color, factor)
