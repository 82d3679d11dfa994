"""Every drawn view of every zoo model, as a fingerprint to compare before and after a refactor of the views.

For each zoo model: the original view (every chain accepted; several ``ViewOptions``: English and 中文,
collapsed, left to right, focused on a chain with a search hit, a tight node cap), the fused view (the
graph ``fusion_engine.fuse`` makes of the plan that accepts every chain, drawn like the Graph page draws
it), and, where a compile map is given, the torch.compile and compare views (painted and decorated as the
page does). Each view is rendered as the pyvis page (``render_html``) and as the SVG (``render_svg`` with
the page's legend); the script records a SHA-256 of each, plus the page helpers' answers (legend,
module prefixes, search hits, fused counts). Two runs on two trees give equal JSON exactly when every
drawing is byte for byte the same.

    python3 benchmarks/graph_view_fingerprints.py --out views.json [--models a,b] [--dump DIR]
        [--compile-maps DIR]   # {model}.json CompileMap files (written there with --make-compile-maps)

``--dump DIR`` also writes every rendering to DIR (to diff a mismatch). The compile maps are made once
(``--make-compile-maps``, torch.compile on the CPU in a child process) and then read by both runs, so the
comparison is of the views alone. CPU only; no GPU number is measured here.

Run both trees with ``PYTHONHASHSEED=0``: before commit b9e5f3f a collapsed module whose chains tie between
two patterns took its colour from a set's order, which string hashing changes from one process to the next.
The move of ``explorer/graph_view.py`` into ``explorer/ui/graph/`` was checked so (13 zoo models, all but
the 8B-layer decoder; compile maps for 11 of them): 200 pages and 200 SVGs, byte for byte the same.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from pathlib import Path

try:   # the package since the views moved into the UI layer
    from explorer.ui import graph as graph_view
    from explorer.ui.graph import svg as graph_svg
except ImportError:   # the tree before the move (explorer/graph_view.py, explorer/graph_svg.py): for the "before" run
    from explorer import graph_svg, graph_view  # type: ignore[no-redef]

SMALL_CAP = 12   # a node cap that forces the view to collapse (or cut into runs of ops) on every zoo model


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


class Recorder:
    """Collects {view name: digest} and, with a dump folder, the renderings themselves."""

    def __init__(self, dump: Path | None, model: str) -> None:
        self.out: dict[str, object] = {}
        self.dump = dump / model if dump else None
        if self.dump:
            self.dump.mkdir(parents=True, exist_ok=True)

    def text(self, name: str, text: str, ext: str) -> None:
        self.out[name] = _digest(text)
        if self.dump:
            (self.dump / f"{name}.{ext}").write_text(text)

    def value(self, name: str, value: object) -> None:
        self.out[name] = value


def _view_facts(view) -> dict:
    return {"nodes": len(view.nodes), "edges": len(view.edges), "bands": len(view.bands), "depth": view.depth,
            "collapsed": len(view.collapsed_modules), "notes": list(view.notes)}


def _draw(rec: Recorder, name: str, view, render, legend, title: str, decorate=None) -> None:
    html = graph_view.render_html(view, render)
    if decorate is not None:
        html = decorate(html)
    rec.text(f"{name}.html", html, "html")
    rec.text(f"{name}.svg", graph_svg.render_svg(view, legend, title), "svg")
    rec.value(f"{name}.facts", _view_facts(view))


def _original_views(rec: Recorder, graph, det) -> None:
    accepted = [c.id for c in det.chains]
    first = det.chains[0] if det.chains else None
    hits = graph_view.find_nodes(graph, "conv") or graph_view.find_nodes(graph, "linear") or []
    cases = {
        "original.en": graph_view.ViewOptions(),
        "original.zh": graph_view.ViewOptions(lang="zh"),
        "original.depth1": graph_view.ViewOptions(depth=1),
        "original.lr": graph_view.ViewOptions(direction="LR", lang="zh"),
        "original.cap": graph_view.ViewOptions(max_nodes=SMALL_CAP),
        "original.cap_zh": graph_view.ViewOptions(max_nodes=SMALL_CAP, lang="zh", depth=1, expand=("layer1",)),
        "original.search": graph_view.ViewOptions(depth=1, highlight=tuple(hits[:3]),
                                                  reveal=hits[0] if hits else None),
    }
    if first is not None:
        cases["original.focus"] = graph_view.ViewOptions(focus=first.nodes, hops=1, highlight=first.nodes[:1])
    for name, options in cases.items():
        lang = options.lang
        view = graph_view.build_view(graph, det, accepted[1:] if name == "original.zh" else accepted, options)
        render = graph_view.RenderOptions(height_px=640, center_on=options.reveal, name="original", lang=lang)
        _draw(rec, name, view, render, graph_svg.legend_entries(det, lang), f"{det.model} original")


def _fused_views(rec: Recorder, analysis, graph, det) -> None:
    from explorer.fusion_engine import fuse

    fused = fuse(analysis)
    info = {a.chain_id: graph_view.FusedChain(a.impl, a.implementation, a.fused_kernel)
            for a in fused.applied if a.status == "fused"}
    counts = graph_view.fused_counts(graph, det, info)
    rec.value("fused.counts", [counts.nodes_before, counts.nodes_after, counts.launches_before,
                               counts.launches_after, counts.chains_fused])
    g = graph_view.fused_graph(graph, det, info)
    for lang in ("en", "zh"):
        for name, options in ((f"fused.{lang}", graph_view.ViewOptions(lang=lang)),
                              (f"fused.depth1.{lang}", graph_view.ViewOptions(depth=1, lang=lang))):
            view = graph_view.build_view(g, det, list(info), options)
            render = graph_view.RenderOptions(name="fused", lang=lang)
            _draw(rec, name, view, render, graph_svg.legend_entries(det, lang, fused=True), f"{det.model} fused")


def _compile_views(rec: Recorder, graph, det, cmap_file: Path) -> None:
    from explorer.runtime import compile_map as cm
    from explorer.ui import graph_overlays as overlays

    cmap = cm.CompileMap.from_dict(json.loads(cmap_file.read_text()), str(cmap_file))
    comparison = cm.compare(det.chains, graph, cmap)
    for lang in ("en", "zh"):
        det_k, kernels = overlays.kernel_detection(graph, cmap, det.model)
        legend = overlays.kernel_legend_html(kernels, lang)
        view = overlays.paint(graph_view.build_view(graph, det_k, [c.id for c in det_k.chains],
                                                    graph_view.ViewOptions(lang=lang)),
                              overlays.kernel_paint(kernels, lang), {})
        _draw(rec, f"compile.{lang}", view, graph_view.RenderOptions(name="compile", lang=lang),
              graph_svg.legend_from_html(legend), f"{det.model} compile",
              lambda html, v=view, lg=legend: overlays.decorate(html, v, lg, "compile"))
        det_c, category = overlays.compare_detection(graph, det, comparison)
        chain_paint, node_paint = overlays.compare_paint(category, comparison, graph, cmap, lang)
        legend = overlays.compare_legend_html(comparison, lang)
        view = overlays.paint(graph_view.build_view(graph, det_c, [c.id for c in det_c.chains],
                                                    graph_view.ViewOptions(lang=lang)), chain_paint, node_paint)
        _draw(rec, f"compare.{lang}", view, graph_view.RenderOptions(name="compare", lang=lang),
              graph_svg.legend_from_html(legend), f"{det.model} compare",
              lambda html, v=view, lg=legend: overlays.decorate(html, v, lg, "compare"))


def fingerprint(name: str, dump: Path | None, maps: Path | None) -> dict:
    """The digests of every view of zoo model ``name`` (see the module docstring)."""
    from explorer.fusion_engine import analyze

    analysis = analyze(name)
    _, graph, det = analysis
    rec = Recorder(dump, name)
    rec.value("legend", [[i.name, i.label, i.color, i.count] for i in graph_view.legend(det)])
    rec.value("prefixes", graph_view.module_prefixes(graph)[:200])
    rec.value("chain_names", [graph_view.chain_name(c) for c in det.chains])
    rec.value("search", graph_view.find_nodes(graph, "add", limit=20))
    _original_views(rec, graph, det)
    _fused_views(rec, analysis, graph, det)
    if maps is not None and (maps / f"{name}.json").exists():
        _compile_views(rec, graph, det, maps / f"{name}.json")
    return rec.out


def make_compile_maps(models: list[str], folder: Path) -> None:
    """torch.compile each model on the CPU (a child process, ``runtime.compile_map``) and keep its map."""
    from explorer.fusion_engine import analyze
    from explorer.runtime import compile_map as cm

    folder.mkdir(parents=True, exist_ok=True)
    for name in models:
        t0 = time.time()
        cmap, _ = cm.for_analysis(analyze(name), name, "cpu", "fp32", directory=folder / "cache", timeout_s=600)
        (folder / f"{name}.json").write_text(json.dumps(cmap.to_dict()))
        print(f"compile map {name}: {len(cmap.kernels)} kernels, {time.time() - t0:.0f} s", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    from explorer.sources.zoo import ZOO

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--models", default=",".join(ZOO))
    ap.add_argument("--dump", type=Path)
    ap.add_argument("--compile-maps", type=Path)
    ap.add_argument("--make-compile-maps", default="", help="comma-separated models to compile into --compile-maps")
    args = ap.parse_args(argv)
    if args.make_compile_maps:
        make_compile_maps(args.make_compile_maps.split(","), args.compile_maps)
    result = {}
    for name in args.models.split(","):
        t0 = time.time()
        result[name] = fingerprint(name, args.dump, args.compile_maps)
        print(f"{name}: {len(result[name])} entries, {time.time() - t0:.1f} s", file=sys.stderr, flush=True)
    Path(args.out).write_text(json.dumps(result, indent=1, sort_keys=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
