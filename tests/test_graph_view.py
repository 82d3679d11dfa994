"""The graph view without a browser: layered layout, routed edges, chain bands, the fused graph,
search, names and sorting (``explorer.ui.graph``).

The geometric checks here use the view's own boxes; ``tests/test_browser.py`` checks the same
things on what vis-network really drew.
"""

from __future__ import annotations

import time

import networkx as nx
import pytest

from explorer.fusion_engine import analyze, detect, fuse
from explorer.fusions import PATTERNS, UNKNOWN_COLOR, color_of
from explorer.fusions.base import Chain
from explorer.graph.synthetic import residual_cnn_graph
from explorer.ui import graph as graph_view
from explorer.ui.graph import FusedChain, ViewOptions


@pytest.fixture(scope="module")
def resnet():
    return analyze("resnet50")


@pytest.fixture(scope="module")
def residual():
    return analyze("residual_block")


@pytest.fixture(scope="module")
def transformer():
    return analyze("transformer_block")


def _fused(analysis, accepted=None) -> dict[str, FusedChain]:
    """What the engine made of the accepted chains (all when None), as the page asks for it."""
    from explorer.fusions.plan import make_plan

    det = analysis.detection
    reject = [] if accepted is None else [c.id for c in det.chains if c.id not in accepted]
    applied = fuse(analysis, make_plan(det, reject=reject), "cpu").applied
    return {a.chain_id: FusedChain(a.impl, a.implementation, a.fused_kernel) for a in applied if a.status == "fused"}


# ------------------------------------------------------------------ colours, legend, names

def test_view_colours_chains_and_marks_rejected(residual):
    model, graph, det = residual
    rejected, kept = det.chains[0].id, det.chains[1].id
    view = graph_view.build_view(graph, det, [kept])
    assert len(view.nodes) == graph.number_of_nodes()
    by_id = {n.id: n for n in view.nodes}
    for nid in det.chain(kept).compute_nodes:
        node = by_id[nid]
        assert node.fill == PATTERNS[[p.name for p in PATTERNS].index(det.chain(kept).pattern)].color
        assert not node.dashed
    for nid in det.chain(rejected).compute_nodes:
        node = by_id[nid]
        assert node.dashed and node.fill == graph_view.REJECTED_FILL
        assert node.border == color_of(det.chain(rejected).pattern)
    conv = by_id[det.chain(kept).compute_nodes[0]]
    for word in ("op: aten.conv2d", "origin:", "shape:", "bytes:", "FLOPs:", "chain: conv2: conv2 → bn2",
                 f"chain id: {kept}"):
        assert word.split(": conv2 →")[0] in conv.title
    # layered top to bottom: dataflow goes down, one layer per step of the chain
    ys = [by_id[n].y for n in det.chain(kept).compute_nodes]
    assert ys == sorted(ys) and len(set(ys)) == len(ys)
    lr = graph_view.build_view(graph, det, [kept], ViewOptions(direction="LR"))
    xs = [{n.id: n for n in lr.nodes}[n].x for n in det.chain(kept).compute_nodes]
    assert xs == sorted(xs) and len(set(xs)) == len(xs)


def test_legend_lists_only_patterns_present(residual, transformer):
    items = graph_view.legend(residual.detection)
    assert [i.name for i in items] == [p.name for p in PATTERNS if p.name in residual.detection.counts
                                       and residual.detection.counts[p.name]]
    assert all(i.count > 0 for i in items) and len(items) == 2
    assert {i.name for i in graph_view.legend(transformer.detection)} == {
        c.pattern for c in transformer.detection.chains}
    assert color_of("no_such_pattern") == UNKNOWN_COLOR


def test_chain_names_are_module_paths(residual, resnet):
    det = residual.detection
    assert [graph_view.chain_name(c) for c in det.chains] == ["conv1 → bn1 → relu", "conv2 → bn2 → add → relu"]
    names = {graph_view.chain_name(c) for c in resnet.detection.chains}
    assert {"layer1.0: conv1 → bn1 → relu", "layer1.0: conv3 → bn3 → add → relu",     # the block's own add
            "layer1.0: downsample.0 → downsample.1"} <= names                          # numbers keep a parent
    assert len(names) == len(resnet.detection.chains)                                 # every name says which
    # ops that share one module (BERT's attention scores) are told apart by their kinds
    chain = Chain(id="matmul_softmax@matmul_4", pattern="matmul_softmax", ops=("matmul", "mul", "add", "softmax"),
                  nodes=("matmul_4", "mul_2", "add_9", "softmax_2"), names=("enc.layer.2.attention.self",) * 4,
                  roles=(), bytes_saved=0, launches_saved=3)
    assert graph_view.chain_name(chain) == "enc.layer.2.attention.self: matmul → mul → add → softmax"


def test_module_lists_sort_naturally():
    g = nx.DiGraph()
    for i, layer in enumerate((10, 2, 1, 11)):
        for j in range(2):
            g.add_node(f"n{i}_{j}", origin=f"enc.layer.{layer}.op{j}", kind="add", order=2 * i + j)
    prefixes = graph_view.module_prefixes(g)
    assert prefixes == ["enc", "enc.layer", "enc.layer.1", "enc.layer.2", "enc.layer.10", "enc.layer.11"]
    assert sorted(["layer.10", "layer.2", "layer.1.x"], key=graph_view.natural_key) == ["layer.1.x", "layer.2",
                                                                                      "layer.10"]


# ------------------------------------------------------------------ search

def test_search_finds_every_match_by_op_id_and_origin(resnet):
    model, graph, det = resnet
    convs = [n for n, a in graph.nodes(data=True) if a["kind"] == "conv"]
    hits = graph_view.find_nodes(graph, "conv2d")           # an exact id exists, but every match counts
    assert len(hits) == len(convs) == 53 and hits[0] == "conv2d"
    assert graph_view.find_nodes(graph, "layer3.2.conv2") and all(
        "layer3.2.conv2" in graph.nodes[h]["origin"] for h in graph_view.find_nodes(graph, "layer3.2.conv2"))
    assert set(graph_view.find_nodes(graph, "batch_norm")) == {n for n, a in graph.nodes(data=True)
                                                              if a["kind"] == "batch_norm"}
    assert graph_view.find_nodes(graph, "   ") == []
    # hits are marked; a hit inside a collapsed module marks the module, and reveal opens it
    view = graph_view.build_view(graph, det, [], ViewOptions(depth=1, highlight=tuple(hits[:2])))
    assert {n.id for n in view.nodes if n.highlighted} == {"conv2d", "module:layer1"}
    opened = graph_view.build_view(graph, det, [], ViewOptions(depth=1, reveal=hits[1]))
    assert hits[1] in {n.id for n in opened.nodes} and opened.drawn_id(hits[1]) == hits[1]


def test_a_module_with_tied_patterns_takes_the_first_chains_colour(residual):
    """residual_block's module "relu" holds one op of each chain (a tie): its colour is the first chain's in
    graph order, in every process (a set of chain ids would order by string hashing, which changes per run)."""
    _, graph, det = residual
    view = graph_view.build_view(graph, det, [c.id for c in det.chains], ViewOptions(depth=1))
    module = next(n for n in view.nodes if n.id == "module:relu")
    assert module.members == 2 and module.pattern == det.chains[0].pattern != det.chains[1].pattern
    assert "1 Conv+BN+act, 1 Conv+BN+" in module.label


def test_focus_on_chain_keeps_search_hits(resnet):
    model, graph, det = resnet
    chain = det.chains[5]
    view = graph_view.build_view(graph, det, [], ViewOptions(focus=chain.nodes, hops=1, highlight=chain.nodes[:1]))
    ids = {n.id for n in view.nodes}
    assert set(chain.nodes) <= ids and len(ids) < 15
    assert [n.id for n in view.nodes if n.highlighted] == [chain.nodes[0]]


# ------------------------------------------------------------------ layout geometry

@pytest.mark.parametrize("options", [ViewOptions(), ViewOptions(depth=1), ViewOptions(depth=2),
                                     ViewOptions(direction="LR")], ids=["ops", "depth1", "depth2", "LR"])
def test_resnet_layout_has_no_overlap_and_no_hidden_edge(resnet, options):
    model, graph, det = resnet
    view = graph_view.build_view(graph, det, [c.id for c in det.chains], options)
    assert graph_view.overlapping_nodes(view) == []
    assert graph_view.hidden_edges(view) == []


def test_skip_edge_of_residual_block_is_routed_around_the_chain(residual):
    model, graph, det = residual
    view = graph_view.build_view(graph, det, [c.id for c in det.chains])
    skip = next(e for e in view.edges if (e.source, e.target) == ("x", "add"))
    assert len(skip.points) >= 4          # one waypoint per layer it spans
    by_id = {n.id: n for n in view.nodes}
    column = {by_id[n].x for n in det.chains[0].nodes}
    assert all(x not in column for x, _ in skip.points)   # beside the conv chain, not through it
    assert graph_view.hidden_edges(view) == [] and graph_view.overlapping_nodes(view) == []


def test_bert_collapsed_and_transformer_layouts_are_clean(transformer):
    _, graph, det = analyze("bert_base", seq_len=32)
    for depth in (0, 3, 4, 5):
        view = graph_view.build_view(graph, det, [c.id for c in det.chains], ViewOptions(depth=depth))
        assert graph_view.overlapping_nodes(view) == [], depth
        assert graph_view.hidden_edges(view) == [], depth
        labels = [n.label for n in view.nodes if n.kind == "op" and n.chain and "linear" in n.label]
        assert len(labels) == len(set(labels)) or depth > 0  # Q, K and V are told apart
    modules = graph_view.build_view(graph, det, [], ViewOptions(depth=4))
    box = next(n for n in modules.nodes if n.id == "module:bert.encoder.layer.3")
    assert "ops ·" in box.label and "chains" in box.label and "Add+LayerNorm" in box.title
    view = graph_view.build_view(transformer.graph, transformer.detection, [])
    assert graph_view.overlapping_nodes(view) == [] and graph_view.hidden_edges(view) == []


def test_chains_are_bands_with_gaps_between_neighbours(resnet):
    model, graph, det = resnet
    view = graph_view.build_view(graph, det, [c.id for c in det.chains])
    assert {b.chain for b in view.bands} == {c.id for c in det.chains}
    by_id = {n.id: n for n in view.nodes}
    band_of = {n: b for b in view.bands for n in b.nodes}
    pad = graph_view.BAND_PAD + 2
    touching = []
    for s, t in graph.edges:
        bs, bt = band_of.get(s), band_of.get(t)
        if bs and bt and bs is not bt and bs.pattern == bt.pattern:   # two chains of one pattern meet
            a, b = graph_view.box_of(by_id[s]), graph_view.box_of(by_id[t])
            if a[3] + pad >= b[1] - pad and b[3] + pad >= a[1] - pad and a[2] + pad >= b[0] - pad \
                    and b[2] + pad >= a[0] - pad:
                touching.append((s, t))
    assert touching == []


# ------------------------------------------------------------------ the fused graph

def test_fused_graph_has_one_node_per_fused_chain(resnet):
    fused = _fused(resnet)
    model, graph, det = resnet
    g = graph_view.fused_graph(graph, det, fused)
    saved = sum(c.launches_saved for c in det.chains)
    assert g.number_of_nodes() == graph.number_of_nodes() - saved == 59
    assert nx.is_directed_acyclic_graph(g)
    chain = det.chains[0]
    node = g.nodes[chain.id]
    assert node["kind"] == "fused" and node["kernel"] == fused[chain.id].kernel and node["members"] == chain.nodes
    counts = graph_view.fused_counts(graph, det, fused)
    # nodes: one per chain; launches: the CPU's (conv then the activation in place: only the BatchNorm goes),
    # the engine's one count (fusion_engine.launch_counts, which the runner's report carries)
    from explorer.fusion_engine import launch_counts

    engine = launch_counts(resnet, fuse(resnet, None, "cpu").applied, [c.id for c in det.chains], "cpu")
    assert counts.nodes_before - counts.nodes_after == saved
    assert (counts.launches_before, counts.launches_after) == (engine.before, engine.after) == (174, 121)
    view = graph_view.build_view(g, det, list(fused))
    kinds = {n.kind for n in view.nodes}
    assert "fused" in kinds and len(view.nodes) == 59 and not view.bands
    drawn = next(n for n in view.nodes if n.id == chain.id)
    assert fused[chain.id].kernel in drawn.label and chain.id in drawn.title
    assert g.nodes[chain.id]["launches"] == 2 and "×2" in drawn.label and "3 → 2" in drawn.title  # CPU: conv, relu_
    assert graph_view.overlapping_nodes(view) == [] and graph_view.hidden_edges(view) == []
    # an op of a fused chain is found through its chain node
    assert view.drawn_id(chain.nodes[1]) == chain.id


def test_rejecting_a_chain_changes_the_fused_graph(residual):
    det = residual.detection
    keep = det.chains[1].id
    fused = _fused(residual, accepted={keep})
    assert set(fused) == {keep}
    g = graph_view.fused_graph(residual.graph, det, fused)
    assert g.number_of_nodes() == residual.graph.number_of_nodes() - det.chains[1].launches_saved
    assert det.chains[0].nodes[0] in g and keep in g


# ------------------------------------------------------------------ rendering and size

def test_render_html_is_offline_and_carries_the_drawing(residual):
    import re

    model, graph, det = residual
    view = graph_view.build_view(graph, det, [det.chains[0].id])
    html = graph_view.render_html(view, graph_view.RenderOptions(name="original"))
    assert graph_view.remote_urls(html) == []
    assert not re.search(r"<script[^>]+src=[\"']https?://", html, re.I)
    assert not re.search(r"<link[^>]+href=[\"']https?://", html, re.I)
    assert "new vis.Network" in html and "borderDashes" in html and "window.FE =" in html
    assert f'"{graph_view.WAYPOINT_PREFIX}0"' in html          # the skip edge's waypoints
    assert 'net.on("beforeDrawing"' in html                     # the page script (page.js) draws the bands


def test_every_file_of_the_package_that_is_not_python_ships_in_the_wheel():
    """The page script (``ui/graph/page.js``), the font and the icon are read at run time from beside the code:
    each must be named by ``[tool.setuptools.package-data]`` or an installed wheel lacks it."""
    import fnmatch
    import tomllib
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    globs = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["explorer"]
    data = [p.relative_to(root / "explorer").as_posix() for p in (root / "explorer").rglob("*")
            if p.is_file() and p.suffix not in (".py", ".pyc") and "__pycache__" not in p.parts]
    assert "ui/graph/page.js" in data
    assert [f for f in data if not any(fnmatch.fnmatch(f, g) for g in globs)] == []


def test_a_10k_node_graph_collapses_and_draws_quickly():
    graph = residual_cnn_graph(1428)
    det = detect(graph)
    t = time.perf_counter()
    view = graph_view.build_view(graph, det, [c.id for c in det.chains])
    html = graph_view.render_html(view)
    elapsed = time.perf_counter() - t
    print(f"synthetic: {graph.number_of_nodes()} nodes -> {len(view.nodes)} drawn in {elapsed:.2f} s")
    assert graph.number_of_nodes() >= 9990 and len(view.nodes) <= graph_view.DEFAULT_MAX_NODES and html
    assert view.notes and all("ops ·" in n.label for n in view.nodes if n.kind == "module")
    assert graph_view.overlapping_nodes(view) == []
    assert elapsed < 10
