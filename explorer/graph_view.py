"""The graph view: which ops fuse into which chains, laid out in layers and drawn with pyvis.

Two halves, kept apart so the first is testable without a browser:

- ``build_view(graph, detection, accepted, options)`` is pure. It turns the
  networkx graph of ``explorer.graph.build`` plus the detection and the
  accepted chain ids into a renderer-neutral ``GraphView``: nodes with colours,
  labels, tooltips, sizes and fixed positions; edges with the waypoints that
  route them around nodes; one ``ChainBand`` per chain so that each chain is
  drawn as one unit. It collapses modules into one node each by origin-name
  prefix (``layer1``, ``encoder.layer.3``), expands the modules asked for,
  focuses on one chain with its k-hop neighbourhood, highlights search hits,
  and never draws more than ``options.max_nodes`` nodes (it collapses further
  on its own).
- ``fused_graph(graph, detection, fused)`` is the graph after the accepted
  fusions: each chain the engine fused (``FusedChain``, from
  ``rewrite.apply_plan``'s ``applied`` entries) becomes one node labelled with
  its kernel. ``build_view`` draws it like any other graph.
- ``render_html(view, options)`` draws a ``GraphView`` with pyvis, every script
  in line (no CDN: the app must work offline), with the chain bands, an
  overview map, and a first view that is readable (``RenderOptions``).

Every text a person reads in a view (labels, tooltips, notes, the overview's
title) is in the language ``ViewOptions.lang`` / ``RenderOptions.lang`` names
("en" or "zh"), from the catalog (``explorer/ui/locale/graph.py``, keys
``gv.*``) through ``explorer.ui.i18n.t_in``, which needs no Streamlit session:
this module imports no Streamlit.

The layout is a layered (Sugiyama) layout computed by igraph
(``Graph.layout_sugiyama``: crossing reduction by barycenters, dummy vertices
on edges that span layers). Dataflow runs top to bottom (or left to right);
an edge that spans several layers passes through the dummy vertices' places,
which are slots of their own in each layer, so a skip connection is drawn
around the nodes it passes, never behind them.

      x ──────────┐
      ▼           │        ╭───────────╮ band: one chain (pattern colour)
    ╭─conv─╮      │        │ conv      │
    │ bn   │      │        │ bn        │ filled: accepted; grey, dashed: rejected
    ╰─relu─╯      │        │ add ◄─────┘ the skip edge routed around the chain
      ...         │
"""

from __future__ import annotations

import dataclasses
import html as html_lib
import json
import math
import re
from collections import Counter, deque
from typing import Iterable, Mapping

import networkx as nx

from explorer import launches as launch_counts
from explorer.fusions import BY_NAME, PATTERNS, UNKNOWN_COLOR, color_of
from explorer.fusions.base import Chain, Detection
from explorer.ui.i18n import t_in, translate_phrases, translate_text
from explorer.units import human_bytes, human_count  # noqa: F401  (re-exported for the pages)

PLAIN_COLOR = "#f4f4f4"      # ops in no chain
PLAIN_BORDER = "#9e9e9e"
REJECTED_FILL = "#e6e6e6"    # rejected chains: grey fill, pattern-coloured dashed border
GROUP_COLOR = "#eef1f6"      # a collapsed module with no accepted chain
GROUP_BORDER = "#424242"
IO_COLOR = "#ffe082"         # model inputs and output
EDGE_COLOR = "#7a7a7a"
HIGHLIGHT_BORDER = "#d81b60"  # search hits
DEFAULT_MAX_NODES = 600
DIRECTIONS = ("TB", "LR")

FONT_PX = 14                 # label font size in graph units (on screen at zoom 1)
OP_WIDTH, OP_HEIGHT = 170, 44
FUSED_HEIGHT = 60
MODULE_WIDTH, MODULE_HEIGHT = 230, 64
LAYER_GAP = 44               # free space between two layers
SLOT_GAP = 46                # free space between two neighbours in a layer
BAND_PAD = 7                 # how far a chain's band reaches around its nodes
CHARS_PER_LINE = {OP_WIDTH: 19, MODULE_WIDTH: 27}


@dataclasses.dataclass(frozen=True)
class ViewOptions:
    """What to draw.

    depth      collapse modules by origin prefix of this many dotted parts (0: no collapse)
    expand     module prefixes to open one level further
    focus      node ids to centre on (one chain's nodes): drawn with their neighbourhood;
               empty: the whole graph
    hops       neighbourhood radius around ``focus``
    highlight  node ids to mark (search hits); a hit inside a collapsed module marks the module
    reveal     a node that must be drawn on its own: the modules around it are opened
    max_nodes  hard cap on drawn nodes; beyond it the view collapses on its own
    direction  "TB" (top to bottom, the default) or "LR" (left to right)
    lang       the language of labels, tooltips and notes: "en" (the default) or "zh"
    """

    depth: int = 0
    expand: tuple[str, ...] = ()
    focus: tuple[str, ...] = ()
    hops: int = 2
    highlight: tuple[str, ...] = ()
    reveal: str | None = None
    max_nodes: int = DEFAULT_MAX_NODES
    direction: str = "TB"
    lang: str = "en"


@dataclasses.dataclass(frozen=True)
class ViewNode:
    """One drawn node: an op, a collapsed module (``members`` > 1) or a fused chain (``kind`` "fused")."""

    id: str
    label: str
    title: str             # hover text
    fill: str
    border: str
    dashed: bool = False
    shape: str = "box"
    members: int = 1       # >1 for a collapsed module
    chain: str | None = None
    pattern: str | None = None
    highlighted: bool = False
    x: float = 0.0
    y: float = 0.0
    width: float = OP_WIDTH
    height: float = OP_HEIGHT
    kind: str = "op"       # op | io | module | fused


@dataclasses.dataclass(frozen=True)
class ViewEdge:
    """A drawn edge; ``points`` are the waypoints (graph units) that route it around nodes."""

    source: str
    target: str
    title: str = ""
    weight: int = 1        # how many graph edges it stands for
    points: tuple[tuple[float, float], ...] = ()


@dataclasses.dataclass(frozen=True)
class ChainBand:
    """One chain drawn as a unit: a band around its drawn nodes, along its own edges."""

    chain: str
    title: str
    pattern: str
    accepted: bool
    fill: str
    border: str
    nodes: tuple[str, ...]
    paths: tuple[tuple[tuple[float, float], ...], ...]   # polylines (node centres and waypoints) it follows


@dataclasses.dataclass(frozen=True)
class GraphView:
    """Everything a renderer needs to draw one view of a graph."""

    nodes: tuple[ViewNode, ...]
    edges: tuple[ViewEdge, ...]
    total_nodes: int            # nodes in the full graph
    depth: int                  # collapse depth actually used
    collapsed_modules: tuple[str, ...]   # modules drawn as one node (expandable)
    notes: tuple[str, ...] = ()
    bands: tuple[ChainBand, ...] = ()
    direction: str = "TB"
    drawn_of: tuple[tuple[str, str], ...] = ()   # (graph node, drawn node id) for every drawn graph node

    def drawn_id(self, node: str) -> str | None:
        """The id of the drawn node that shows graph node ``node`` (itself, its module, its fused chain)."""
        return dict(self.drawn_of).get(node)


@dataclasses.dataclass(frozen=True)
class LegendItem:
    """One pattern in the legend, with how many chains of it the model has."""

    name: str
    label: str
    color: str
    count: int


@dataclasses.dataclass(frozen=True)
class FusedChain:
    """What the engine made of one accepted chain (from ``rewrite.AppliedChain`` with status "fused").

    kernel          short name of what runs (``AppliedChain.impl``: ``cudnn_conv_relu``, ``sdpa`` ...)
    implementation  the engine's full label of it
    fused_kernel    False when it is really the same ops one after another (no fused kernel here)
    """

    kernel: str
    implementation: str
    fused_kernel: bool = True
    status: str = "fused"


def chain_launches(graph: nx.DiGraph, chain: Chain, info: FusedChain | None) -> launch_counts.ChainLaunches:
    """A chain's kernel launches on the device its ``info`` was made for (``explorer.launches``, the count the
    runner's report and the command line show): its ops' unfused, what its kernel runs fused."""
    unfused = int(sum(graph.nodes[n].get("launches", 0) for n in chain.nodes if n in graph))
    return launch_counts.chain_launches(chain.id, unfused, info)


@dataclasses.dataclass(frozen=True)
class FusedCounts:
    """Nodes and kernel launches before and after the accepted fusions (the page states them)."""

    nodes_before: int
    nodes_after: int
    launches_before: int
    launches_after: int
    chains_fused: int


# ------------------------------------------------------------------ names, search, sorting

def natural_key(text: str) -> tuple:
    """Sort key that orders ``layer.2`` before ``layer.10`` (digit runs compare as numbers)."""
    return tuple((0, int(part), "") if part.isdigit() else (1, 0, part)
                 for part in re.split(r"(\d+)", str(text)) if part != "")


def chain_name(chain: Chain) -> str:
    """A person's name for a chain: the engine's one name (``Chain.title``: module path and ops,
    ``layer1.0: conv3 → bn3 → add → relu``), the same on every page, the command line and the report."""
    return chain.title


def legend(detection: Detection | None = None) -> list[LegendItem]:
    """One item per pattern that has chains in ``detection`` (registry order, with the count);
    an 'unknown' item only when a chain's pattern is not registered."""
    if detection is None:
        return []
    counts = Counter(c.pattern for c in detection.chains)
    items = [LegendItem(p.name, p.label, p.color, counts[p.name]) for p in PATTERNS if counts[p.name]]
    unknown = sum(n for name, n in counts.items() if name not in BY_NAME)
    if unknown:
        items.append(LegendItem("unknown", "unknown pattern", UNKNOWN_COLOR, unknown))
    return items


def module_of(origin: str, depth: int, expand: Iterable[str] = ()) -> str:
    """The module prefix a node with ``origin`` collapses into (the origin itself if shallow)."""
    parts = origin.split(".")
    if depth <= 0:
        return origin
    opened = set(expand)
    d = min(depth, len(parts))
    while d < len(parts) and ".".join(parts[:d]) in opened:
        d += 1
    return ".".join(parts[:d])


def module_prefixes(graph: nx.DiGraph, max_depth: int = 6) -> list[str]:
    """Module prefixes (``layer1``, ``layer1.0``) that hold at least two ops: what can be collapsed.
    Sorted by depth, then naturally (``layer.2`` before ``layer.10``)."""
    counts: Counter = Counter()
    for _, a in graph.nodes(data=True):
        parts = str(a.get("origin", "")).split(".")
        for d in range(1, min(len(parts), max_depth) + 1):
            counts[".".join(parts[:d])] += 1
    return sorted((p for p, n in counts.items() if n >= 2), key=lambda p: (p.count("."), natural_key(p)))


def find_nodes(graph: nx.DiGraph, query: str, limit: int | None = None) -> list[str]:
    """Every node whose id, op (kind or ATen target) or origin contains ``query`` (case-insensitive),
    in graph order; ``limit`` caps the list (None: all)."""
    q = query.strip().lower()
    if not q:
        return []
    hits = []
    for n, a in sorted(graph.nodes(data=True), key=lambda kv: kv[1].get("order", 0)):
        fields = (str(n), str(a.get("kind", "")), str(a.get("target", "")), str(a.get("origin", "")))
        if any(q in f.lower() for f in fields):
            hits.append(n)
    return hits if limit is None else hits[:limit]


def neighbourhood(graph: nx.DiGraph, seeds: Iterable[str], hops: int) -> set[str]:
    """Nodes within ``hops`` edges (either direction) of any seed."""
    seen = {s for s in seeds if s in graph}
    frontier = deque((s, 0) for s in seen)
    while frontier:
        node, d = frontier.popleft()
        if d >= hops:
            continue
        for nb in list(graph.predecessors(node)) + list(graph.successors(node)):
            if nb not in seen:
                seen.add(nb)
                frontier.append((nb, d + 1))
    return seen


# ------------------------------------------------------------------ the fused graph

def _common_module(names: Iterable[str]) -> str:
    parts = [str(n).split(".") for n in names]
    if not parts:
        return ""
    common = 0
    while all(len(p) > common + 1 for p in parts) and len({p[common] for p in parts}) == 1:
        common += 1
    return ".".join(parts[0][:common]) if common else parts[0][0]


def fused_graph(graph: nx.DiGraph, detection: Detection, fused: Mapping[str, FusedChain]) -> nx.DiGraph:
    """The graph after the fusions in ``fused`` (chain id -> what the engine made of it; pure).

    Each of those chains becomes one node, id = the chain id, kind "fused", its origin the
    chain's common module (so it collapses with that module), its edges those of its members
    to the rest of the graph. Every other node and edge is kept as it is.
    """
    owner: dict[str, str] = {}
    chains = {c.id: c for c in detection.chains if c.id in fused}
    for cid, chain in chains.items():
        for n in chain.nodes:
            if n in graph:
                owner[n] = cid
    out = nx.DiGraph(**graph.graph)
    for n, a in graph.nodes(data=True):
        if n not in owner:
            out.add_node(n, **a)
    for cid, chain in chains.items():
        members = [n for n in chain.nodes if n in graph]
        if not members:
            continue
        attrs = [graph.nodes[m] for m in members]
        last = graph.nodes[chain.outputs[0]] if chain.outputs and chain.outputs[0] in graph else attrs[-1]
        info = fused[cid]
        out.add_node(
            cid, kind="fused", target=info.kernel, origin=_common_module(chain.names or members),
            order=min(a.get("order", 0) for a in attrs), shapes=last.get("shapes", []),
            dtypes=last.get("dtypes", []),
            bytes_read=sum(a.get("bytes_read", 0) for a in attrs), bytes_written=last.get("bytes_written", 0),
            flops=sum(a.get("flops", 0) for a in attrs),
            launches=chain_launches(graph, chain, info).fused,
            launches_unfused=chain_launches(graph, chain, info).unfused,
            chain=cid, pattern=chain.pattern, kernel=info.kernel, implementation=info.implementation,
            fused_kernel=info.fused_kernel, members=tuple(members), title=chain_name(chain))
    for s, t, a in graph.edges(data=True):
        ds, dt = owner.get(s, s), owner.get(t, t)
        if ds == dt:
            continue
        if out.has_edge(ds, dt):
            out.edges[ds, dt]["bytes"] = out.edges[ds, dt].get("bytes", 0) + a.get("bytes", 0)
        else:
            out.add_edge(ds, dt, **a)
    return out


def fused_counts(graph: nx.DiGraph, detection: Detection, fused: Mapping[str, FusedChain]) -> FusedCounts:
    """Node and kernel-launch counts before and after the fusions in ``fused``; the launches removed
    are each chain's on the device ``fused`` was made for (``chain_launches``: ``explorer.launches``)."""
    chains = [c for c in detection.chains if c.id in fused]
    removed_nodes = sum(len([n for n in c.nodes if n in graph]) - 1 for c in chains)
    launches = sum(int(a.get("launches", 0)) for _, a in graph.nodes(data=True))
    saved = sum(chain_launches(graph, c, fused[c.id]).saved for c in chains)
    return FusedCounts(graph.number_of_nodes(), graph.number_of_nodes() - removed_nodes,
                       launches, launches - saved, len(chains))


# ------------------------------------------------------------------ collapse

_SEGMENT = "ops "   # prefix of the groups made when module names cannot collapse a graph


def _group_members(graph: nx.DiGraph, nodes: Iterable[str], depth: int,
                   expand: tuple[str, ...]) -> dict[str, list[str]]:
    groups: dict[str, list[str]] = {}
    for n in nodes:
        key = module_of(str(graph.nodes[n].get("origin", n)), depth, expand) if depth > 0 else n
        groups.setdefault(key, []).append(n)
    return groups


def _count_drawn(graph: nx.DiGraph, nodes: list[str], depth: int, expand: tuple[str, ...]) -> int:
    return len(_group_members(graph, nodes, depth, expand))


def _choose_collapse(graph: nx.DiGraph, nodes: list[str], options: ViewOptions) -> tuple[int, tuple[str, ...], list[str]]:
    """Depth and expansions that fit under the cap (depth -1: no module names do); notes say what changed."""
    notes: list[str] = []
    depth, expand = options.depth, tuple(options.expand)
    cap = max(1, options.max_nodes)
    lang = options.lang
    if _count_drawn(graph, nodes, depth, expand) <= cap:
        return depth, expand, notes
    # Too many: first drop expansions (newest first), then collapse deeper.
    while expand and _count_drawn(graph, nodes, depth, expand) > cap:
        notes.append(t_in(lang, "gv.note.not_expanding", module=expand[-1], cap=cap))
        expand = expand[:-1]
    if _count_drawn(graph, nodes, depth, expand) <= cap:
        return depth, expand, notes
    max_depth = max((len(str(graph.nodes[n].get("origin", n)).split(".")) for n in nodes), default=1)
    candidates = range(max_depth, 0, -1) if depth <= 0 else range(min(depth, max_depth), 0, -1)
    for d in candidates:
        if _count_drawn(graph, nodes, d, expand) <= cap:
            notes.append(t_in(lang, "gv.note.collapsed", n=len(nodes), cap=cap, depth=d))
            return d, expand, notes
    notes.append(t_in(lang, "gv.note.segments", n=len(nodes), cap=cap))
    return -1, (), notes


def _segments(graph: nx.DiGraph, nodes: list[str], cap: int) -> dict[str, list[str]]:
    """Consecutive ops (graph order) in at most ``cap`` groups: for graphs whose names do not nest."""
    size = max(2, math.ceil(len(nodes) / max(1, int(cap * 0.8))))
    groups: dict[str, list[str]] = {}
    for i in range(0, len(nodes), size):
        run = nodes[i:i + size]
        groups[f"{_SEGMENT}{i + 1}–{i + len(run)}"] = run
    return groups


# ------------------------------------------------------------------ labels

def _fit(text: str, chars: int) -> str:
    """A dotted module path in at most ``chars`` characters.

    The last part (``query``) and the numbered parts (``layer.3``, ``layer1.0``) tell ops
    apart, so they are kept first; then the parts nearest the end, as room allows; gaps
    are written "…" (``bert.encoder.layer.3.attention.self.query`` -> ``…layer.3…self.query``).
    """
    if len(text) <= chars:
        return text
    parts = text.split(".")
    last = len(parts) - 1
    keep = {last, last - 1} if parts[last].isdigit() and last else {last}   # downsample.0, not just 0
    numbered = []
    for i in range(last - 1, -1, -1):
        if parts[i].isdigit():
            numbered.append({i, i - 1} if i else {i})
        elif any(ch.isdigit() for ch in parts[i]):
            numbered.append({i})

    def render(idx: set) -> str:
        out, prev = "", -1
        for i in sorted(idx):
            out += ("…" if i != prev + 1 else ("." if out else "")) + parts[i]
            prev = i
        return out

    for extra in numbered:                 # the numbered parts nearest the end, while they fit
        if len(render(keep | extra)) <= chars:
            keep |= extra
    for i in range(last - 1, -1, -1):      # then the parts nearest the end, while they fit
        if i not in keep:
            if len(render(keep | {i})) > chars:
                break
            keep.add(i)
    text = render(keep)
    return text if len(text) <= chars else "…" + text[-(chars - 1):]


def _width(text: str) -> int:
    """How many Latin characters' room ``text`` takes in a label (a CJK character or full-width mark: two)."""
    return sum(2 if "\u2e80" <= ch <= "\u9fff" or "\uff00" <= ch <= "\uffef" else 1 for ch in text)


def _box_label(label: str, lang: str, chars: int) -> str:
    """A pattern's label for a node box: in ``lang`` where that fits in ``chars``, else as registered (the
    short, technical name: "Add+LayerNorm", whose Chinese adds a gloss; the tooltip has the whole)."""
    shown = translate_text(label, lang)
    return shown if _width(shown) <= chars else label


def _op_label(nid: str, a: dict) -> str:
    kind = str(a.get("kind", "?"))
    origin = str(a.get("origin", nid))
    chars = CHARS_PER_LINE[OP_WIDTH]
    second = origin if origin != kind else nid
    return f"{_fit(kind, chars)}\n{_fit(second, chars)}"


def _node_title(nid: str, a: dict, chain: Chain | None, accepted: bool, lang: str = "en") -> str:
    scalar = t_in(lang, "gv.scalar")
    shapes = "; ".join("x".join(str(d) for d in s) or scalar for s in a.get("shapes", [])) or "-"
    lines = [
        f"{nid}  ({a.get('kind', '?')})",
        t_in(lang, "gv.tip.op", op=a.get("target", "?")),
        t_in(lang, "gv.tip.origin", origin=a.get("origin", "?")),
        t_in(lang, "gv.tip.shape", shapes=shapes, dtypes=", ".join(a.get("dtypes", []))),
        t_in(lang, "gv.tip.bytes", read=human_bytes(a.get("bytes_read", 0)),
             written=human_bytes(a.get("bytes_written", 0))),
        t_in(lang, "gv.tip.flops", flops=human_count(a.get("flops", 0))),
    ]
    if chain is not None:
        status = t_in(lang, "gv.status.accepted" if accepted else "gv.status.rejected")
        lines.append(t_in(lang, "gv.tip.chain", name=chain_name(chain), status=status))
        lines.append(t_in(lang, "gv.tip.chain_id", id=chain.id))
    return "\n".join(lines)


# ------------------------------------------------------------------ layout (igraph Sugiyama)

def _layers(ids: list[str], edges: list[tuple[str, str]]) -> list[int]:
    """Longest-path layers, with each source (an input, a constant) pulled down to just above
    its first consumer so it does not hang at the top with a long edge.

    An op graph has no cycle, but collapsed modules can (A feeds B feeds A): the edges of a
    feedback arc set (igraph, Eades-Lin-Smyth, as its own Sugiyama layout does) are turned round
    for the layering, and drawn pointing back up.
    """
    import igraph

    index = {n: i for i, n in enumerate(ids)}
    links = [(index[s], index[t]) for s, t in edges if s != t]
    back = set(igraph.Graph(n=len(ids), edges=links, directed=True).feedback_arc_set(method="eades"))
    g = nx.DiGraph()
    g.add_nodes_from(range(len(ids)))
    g.add_edges_from((t, s) if i in back else (s, t) for i, (s, t) in enumerate(links))
    layer = [0] * len(ids)
    for v in nx.topological_sort(g):
        layer[v] = max((layer[p] + 1 for p in g.predecessors(v)), default=0)
    for v in g.nodes:
        if g.in_degree(v) == 0 and g.out_degree(v):
            layer[v] = max(0, min(layer[s] for s in g.successors(v)) - 1)
    return layer


def layered_layout(ids: list[str], edges: list[tuple[str, str]], sizes: Mapping[str, tuple[float, float]],
                   direction: str = "TB") -> tuple[dict[str, tuple[float, float]],
                                                     dict[tuple[str, str], tuple[tuple[float, float], ...]]]:
    """Positions (node centres) and edge waypoints of a layered Sugiyama layout by igraph.

    ``sizes`` are node (width, height) in graph units; every layer is as tall (TB) or wide (LR)
    as its biggest node plus ``LAYER_GAP``, and neighbours in a layer are at least the widest
    node plus ``SLOT_GAP`` apart, so no two boxes overlap. An edge that spans layers gets one
    waypoint per layer it crosses: the place igraph gave its dummy vertex there.
    """
    import igraph

    if not ids:
        return {}, {}
    if direction not in DIRECTIONS:
        raise ValueError(f"direction must be one of {DIRECTIONS}, got {direction!r}")
    index = {n: i for i, n in enumerate(ids)}
    pairs = list(dict.fromkeys((s, t) for s, t in edges if s != t and s in index and t in index))
    layer = _layers(ids, pairs)
    # A proper layering: an edge that spans k layers goes through k-1 dummy vertices, one per
    # layer, which igraph orders and places like any vertex. (igraph 1.0 inserts dummies itself,
    # but its ``edge_routing`` hands some edges another edge's dummy points, e.g. on BERT; with
    # the dummies in the graph every edge spans one layer and no routing is needed.)
    n_vertices = len(ids)
    dummy_of: dict[tuple[str, str], list[int]] = {}
    links: list[tuple[int, int]] = []
    for s, t in pairs:
        a, b = index[s], index[t]
        low, high = sorted((layer[a], layer[b]))
        chain = []
        for lv in range(low + 1, high):
            chain.append(n_vertices)
            layer.append(lv)
            n_vertices += 1
        if layer[a] > layer[b]:
            chain.reverse()
        dummy_of[(s, t)] = chain
        path = [a, *chain, b]
        links.extend(zip(path, path[1:]))
    g = igraph.Graph(n=n_vertices, edges=links, directed=True)
    layout = g.layout_sugiyama(layers=layer, hgap=1, vgap=1, maxiter=100)
    wmax = max(w for w, _ in sizes.values())
    hmax = max(h for _, h in sizes.values())
    across = wmax if direction == "TB" else hmax
    all_coords = [tuple(c[:2]) for c in layout.coords]
    coords, routes = _separate(all_coords[:len(ids)],
                               [[all_coords[d] for d in dummy_of[p]] for p in pairs],
                               node_gap=1.0, mixed_gap=(across / 2 + 14) / (across + SLOT_GAP),
                               dummy_gap=16 / (across + SLOT_GAP))
    if direction == "TB":
        slot, step = wmax + SLOT_GAP, hmax + LAYER_GAP

        def place(u: float, v: float) -> tuple[float, float]:
            return (round(u * slot, 1), round(v * step, 1))
    else:
        slot, step = hmax + SLOT_GAP * 0.6, wmax + LAYER_GAP

        def place(u: float, v: float) -> tuple[float, float]:
            return (round(v * step, 1), round(u * slot, 1))
    pos = {n: place(*coords[i]) for n, i in index.items()}
    waypoints = {pair: tuple(place(float(p[0]), float(p[1])) for p in route)
                 for pair, route in zip(pairs, routes)}
    return pos, waypoints


def _separate(coords: list[tuple[float, float]], routes: list[list[tuple[float, float]]],
              node_gap: float, mixed_gap: float, dummy_gap: float):
    """Keep igraph's order in each layer but enforce the minimum gaps between neighbours.

    igraph places x coordinates by averaging four alignments (Brandes-Köpf), which keeps each
    layer's order but can bring two vertices closer than ``hgap`` (even onto one place). Each
    layer is pushed apart once to the right and once to the left, and the two are averaged:
    both keep the order and the gaps, so their mean does too, and it stays centred.
    """
    layers: dict[float, list[tuple[float, int, int]]] = {}   # y -> (x, kind 0 node / 1 dummy, index)
    for i, (x, y) in enumerate(coords):
        layers.setdefault(y, []).append((x, 0, i))
    flat: list[tuple[int, int]] = []
    for r, route in enumerate(routes):
        for k, (x, y) in enumerate(route):
            layers.setdefault(y, []).append((x, 1, len(flat)))
            flat.append((r, k))
    node_x = [x for x, _ in coords]
    dummy_x = [routes[r][k][0] for r, k in flat]
    for items in layers.values():
        items.sort()
        gaps = [node_gap if a[1] == b[1] == 0 else dummy_gap if a[1] == b[1] == 1 else mixed_gap
                for a, b in zip(items, items[1:])]
        xs = [x for x, _, _ in items]
        right, left = xs[:], xs[:]
        for j in range(1, len(xs)):
            right[j] = max(right[j], right[j - 1] + gaps[j - 1])
        for j in range(len(xs) - 2, -1, -1):
            left[j] = min(left[j], left[j + 1] - gaps[j])
        for (x, kind, i), a, b in zip(items, right, left):
            (node_x if kind == 0 else dummy_x)[i] = (a + b) / 2
    new_coords = [(node_x[i], y) for i, (_, y) in enumerate(coords)]
    new_routes = [list(route) for route in routes]
    for j, (r, k) in enumerate(flat):
        new_routes[r][k] = (dummy_x[j], routes[r][k][1])
    return new_coords, new_routes


# ------------------------------------------------------------------ the view

def build_view(graph: nx.DiGraph, detection: Detection, accepted: Iterable[str],
               options: ViewOptions = ViewOptions()) -> GraphView:
    """Build the renderer-neutral view of ``graph`` (pure; see module docstring).

    ``graph`` may be a model's graph or its ``fused_graph``; ``accepted`` are the accepted chain ids.
    """
    accepted = set(accepted)
    node_chain = detection.node_to_chain()
    chains = {c.id: c for c in detection.chains}
    notes: list[str] = []

    # In a fused graph an op of a fused chain is drawn as the chain: focus, highlight and reveal follow.
    alias = {m: n for n, a in graph.nodes(data=True) if a.get("kind") == "fused" for m in a.get("members", ())}
    options = dataclasses.replace(
        options, focus=tuple(dict.fromkeys(alias.get(f, f) for f in options.focus)),
        highlight=tuple(dict.fromkeys(alias.get(h, h) for h in options.highlight)),
        reveal=alias.get(options.reveal, options.reveal) if options.reveal else None)
    all_nodes = sorted(graph.nodes, key=lambda n: graph.nodes[n].get("order", 0))
    focus = tuple(f for f in options.focus if f in graph)
    lang = options.lang
    if options.focus and not focus:
        notes.append(t_in(lang, "gv.note.no_focus"))
    expand = tuple(options.expand)
    if options.reveal and options.reveal in graph:
        parts = str(graph.nodes[options.reveal].get("origin", "")).split(".")
        expand = expand + tuple(".".join(parts[:d]) for d in range(1, len(parts)) if ".".join(parts[:d]) not in expand)
    if focus:
        keep = neighbourhood(graph, focus, max(0, options.hops))
        nodes = [n for n in all_nodes if n in keep]
        depth, expand = 0, ()
        if len(nodes) > options.max_nodes:
            dist: dict[str, int] = {}
            undirected = graph.to_undirected(as_view=True)
            for f in focus:
                for n, d in nx.single_source_shortest_path_length(undirected, f, cutoff=options.hops).items():
                    dist[n] = min(d, dist.get(n, d))
            nodes = sorted(nodes, key=lambda n: (dist.get(n, 99), graph.nodes[n].get("order", 0)))
            nodes = sorted(nodes[: options.max_nodes], key=lambda n: graph.nodes[n].get("order", 0))
            notes.append(t_in(lang, "gv.note.cut", n=options.max_nodes))
        groups = {n: [n] for n in nodes}
    else:
        nodes = all_nodes
        depth, expand, extra = _choose_collapse(graph, nodes, dataclasses.replace(options, expand=expand))
        notes.extend(extra)
        if depth < 0:
            groups = _segments(graph, nodes, options.max_nodes)
        elif depth > 0:
            groups = _group_members(graph, nodes, depth, expand)
        else:
            groups = {n: [n] for n in nodes}

    member_of = {m: key for key, ms in groups.items() for m in ms}
    rank = {key: min(graph.nodes[m].get("order", 0) for m in ms) for key, ms in groups.items()}
    highlight = {h for h in options.highlight if h in member_of}
    hit_groups = {member_of[h] for h in highlight}

    view_nodes: list[ViewNode] = []
    collapsed: list[str] = []
    drawn_id: dict[str, str] = {}
    for key, ms in groups.items():
        if len(ms) == 1 and not key.startswith(_SEGMENT):
            vn = _op_node(ms[0], graph, node_chain, chains, accepted, ms[0] in highlight, lang)
        else:
            if not key.startswith(_SEGMENT):
                collapsed.append(key)
            vn = _group_node(key, ms, graph, node_chain, chains, accepted, key in hit_groups, lang)
        view_nodes.append(vn)
        for m in ms:
            drawn_id[m] = vn.id
    drawn_of = dict(drawn_id)
    drawn_of.update({m: drawn_id[n] for m, n in alias.items() if n in drawn_id})
    node_rank = {vn.id: rank[member_of[vn.id] if vn.id in member_of else vn.id[len("module:"):]]
                 for vn in view_nodes}

    edge_count: Counter = Counter()
    edge_bytes: Counter = Counter()
    for s, t, a in graph.edges(data=True):
        if s in drawn_id and t in drawn_id:
            ds, dt = drawn_id[s], drawn_id[t]
            if ds != dt:
                edge_count[(ds, dt)] += 1
                edge_bytes[(ds, dt)] += int(a.get("bytes", 0))

    ids = sorted((vn.id for vn in view_nodes), key=lambda n: node_rank[n])
    sizes = {vn.id: (vn.width, vn.height) for vn in view_nodes}
    pos, waypoints = layered_layout(ids, list(edge_count), sizes, options.direction)
    edges = [ViewEdge(s, t, t_in(lang, "gv.edge.many", bytes=human_bytes(edge_bytes[(s, t)]), n=c) if c > 1
                      else human_bytes(edge_bytes[(s, t)]), c, waypoints.get((s, t), ()))
             for (s, t), c in edge_count.items()]
    view_nodes = [dataclasses.replace(vn, x=pos[vn.id][0], y=pos[vn.id][1]) for vn in view_nodes]
    view_nodes.sort(key=lambda vn: node_rank[vn.id])
    edges = _bend_around(view_nodes, edges, options.direction)
    bands = _bands(view_nodes, edges, chains, accepted)
    return GraphView(nodes=tuple(view_nodes), edges=tuple(edges), total_nodes=graph.number_of_nodes(),
                     depth=max(depth, 0), collapsed_modules=tuple(sorted(collapsed, key=natural_key)),
                     notes=tuple(notes), bands=bands, direction=options.direction,
                     drawn_of=tuple(drawn_of.items()))


def _bend_around(nodes: list[ViewNode], edges: list[ViewEdge], direction: str) -> list[ViewEdge]:
    """Give a bend to every edge segment that would pass behind a node.

    Between two neighbouring layers a straight segment can clip a node beside its ends when the
    layout put them far apart. Such a segment leaves its start straight down (TB) to the middle of
    the gap between the layers, runs along that gap, where there are no nodes, and drops into its
    end: the three pieces touch no box but the two it joins.
    """
    tb = direction == "TB"
    by_layer: dict[float, list[ViewNode]] = {}
    for vn in nodes:
        by_layer.setdefault(vn.y if tb else vn.x, []).append(vn)
    where = {vn.id: (vn.x, vn.y) for vn in nodes}
    out = []
    for e in edges:
        pts = [where[e.source], *e.points, where[e.target]]
        ends = {e.source, e.target}
        new = [pts[0]]
        bent = False
        for p, q in zip(pts, pts[1:]):
            near = by_layer.get(p[1] if tb else p[0], []) + by_layer.get(q[1] if tb else q[0], [])
            if any(vn.id not in ends and segment_hits_box(p, q, box_of(vn)) for vn in near):
                if tb:
                    mid = (p[1] + q[1]) / 2
                    new += [(p[0], mid), (q[0], mid)]
                else:
                    mid = (p[0] + q[0]) / 2
                    new += [(mid, p[1]), (mid, q[1])]
                bent = True
            new.append(q)
        out.append(dataclasses.replace(e, points=tuple(new[1:-1])) if bent else e)
    return out


def _chain_colours(pattern: str, accepted: bool) -> tuple[str, str]:
    color = color_of(pattern)
    if accepted:
        return color, _darker(color)
    return REJECTED_FILL, color


def _op_node(nid: str, graph: nx.DiGraph, node_chain: dict, chains: dict, accepted: set,
             highlighted: bool, lang: str = "en") -> ViewNode:
    a = graph.nodes[nid]
    kind = a.get("kind", "?")
    if kind == "fused":
        return _fused_node(nid, a, chains, highlighted, lang)
    chain = chains.get(node_chain.get(nid, ""))
    label = _op_label(nid, a)
    if chain is None:
        io = kind in ("input", "output")
        return ViewNode(id=nid, label=label, title=_node_title(nid, a, None, False, lang),
                        fill=IO_COLOR if io else PLAIN_COLOR, border=PLAIN_BORDER, highlighted=highlighted,
                        kind="io" if io else "op")
    ok = chain.id in accepted
    fill, border = _chain_colours(chain.pattern, ok)
    return ViewNode(id=nid, label=label, title=_node_title(nid, a, chain, ok, lang),
                    fill=fill, border=border, dashed=not ok, chain=chain.id, pattern=chain.pattern,
                    highlighted=highlighted)


def _fused_node(nid: str, a: dict, chains: dict, highlighted: bool, lang: str = "en") -> ViewNode:
    chain = chains.get(a.get("chain", nid))
    pattern = a.get("pattern", "")
    label_of = translate_text(BY_NAME[pattern].label, lang) if pattern in BY_NAME else pattern
    chars = CHARS_PER_LINE[OP_WIDTH]
    box_label = _box_label(BY_NAME[pattern].label, lang, chars) if pattern in BY_NAME else pattern
    members = a.get("members", ())
    first = chain.names[0] if chain is not None and chain.names else str(a.get("origin", ""))
    n_launches = a.get("launches")
    kernel = f"⚙ {a.get('kernel', '?')}" + (f" ×{n_launches}" if isinstance(n_launches, int) and n_launches > 1 else "")
    label = "\n".join([_fit(box_label, chars), _fit(first, chars), kernel[:chars]])
    fill, border = _chain_colours(pattern, True)
    lines = [t_in(lang, "gv.tip.fused_chain", name=a.get("title") or nid), t_in(lang, "gv.tip.chain_id", id=nid),
             t_in(lang, "gv.tip.pattern", pattern=label_of), t_in(lang, "gv.tip.kernel", kernel=a.get("kernel", "?")),
             t_in(lang, "gv.tip.runs", implementation=implementation_text(str(a.get("implementation", "?")), lang)),
             t_in(lang, "gv.tip.replaces", n=len(members), ops=chain.ops_text if chain else ", ".join(members)),
             t_in(lang, "gv.tip.launches_device", before=a.get("launches_unfused", "?"), n=a.get("launches", "?"))]
    if not a.get("fused_kernel", True):
        lines.append(t_in(lang, "gv.tip.no_fused_kernel"))
    return ViewNode(id=nid, label=label, title="\n".join(lines), fill=fill, border=border,
                    dashed=not a.get("fused_kernel", True), chain=nid, pattern=pattern,
                    highlighted=highlighted, height=FUSED_HEIGHT, kind="fused")


def _group_node(key: str, members: list[str], graph: nx.DiGraph, node_chain: dict, chains: dict,
                accepted: set, highlighted: bool, lang: str = "en") -> ViewNode:
    in_chains = {node_chain[m] for m in members if m in node_chain}
    in_chains |= {graph.nodes[m].get("chain") for m in members if graph.nodes[m].get("kind") == "fused"}
    in_chains.discard(None)
    by_pattern = Counter(chains[c].pattern for c in in_chains if c in chains)
    n_acc = sum(1 for c in in_chains if c in accepted or any(
        graph.nodes[m].get("chain") == c for m in members))
    ops = Counter(str(graph.nodes[m].get("kind", "?")) for m in members)
    if by_pattern:
        top = by_pattern.most_common(1)[0][0]
        color = color_of(top)
        fill = _tint(color, 0.45) if n_acc else REJECTED_FILL
        border, dashed = (_darker(color), False) if n_acc == len(in_chains) else (color, True)
    else:
        top, fill, border, dashed = None, GROUP_COLOR, GROUP_BORDER, False
    flops = sum(graph.nodes[m].get("flops", 0) for m in members)
    moved = sum(graph.nodes[m].get("bytes_read", 0) + graph.nodes[m].get("bytes_written", 0) for m in members)
    label_of = {p.name: translate_text(p.label, lang) for p in PATTERNS}
    chars = CHARS_PER_LINE[MODULE_WIDTH]
    short = {p.name: _box_label(p.label, lang, chars) for p in PATTERNS}
    inside = (", ".join(f"{n} {short.get(p, p)}" for p, n in by_pattern.most_common())
              or t_in(lang, "gv.group.no_chain"))
    inside_line = inside
    while _width(inside_line) > chars:
        inside_line = inside_line[:-2] + "…"
    segment = key.startswith(_SEGMENT)
    shown = t_in(lang, "gv.group.segment", range=key[len(_SEGMENT):]) if segment else key
    label = "\n".join([_fit(shown, chars), t_in(lang, "gv.group.counts", ops=len(members), chains=len(in_chains)),
                       inside_line])
    lines = [t_in(lang, "gv.tip.run_of" if segment else "gv.tip.module", module=key, ops=len(members),
                  chains=len(in_chains), accepted=n_acc)]
    lines += [f"  {n} x {label_of.get(p, p)}" for p, n in by_pattern.most_common()]
    lines += [t_in(lang, "gv.tip.ops", ops=", ".join(f"{n} {k}" for k, n in ops.most_common(8))
                   + (" …" if len(ops) > 8 else ""))]
    lines += [t_in(lang, "gv.tip.first_last", first=members[0], last=members[-1])]
    lines += [t_in(lang, "gv.tip.moved", bytes=human_bytes(moved)), t_in(lang, "gv.tip.flops", flops=human_count(flops))]
    if not segment:
        lines.append(t_in(lang, "gv.tip.expand"))
    return ViewNode(id=f"module:{key}", label=label, title="\n".join(lines), fill=fill, border=border,
                    dashed=dashed, shape="box", members=len(members), pattern=top, highlighted=highlighted,
                    width=MODULE_WIDTH, height=MODULE_HEIGHT, kind="module")


def _bands(nodes: list[ViewNode], edges: list[ViewEdge], chains: dict, accepted: set) -> tuple[ChainBand, ...]:
    """One band per chain with at least one op drawn on its own (collapsed or fused chains are one
    node already): its nodes, and the polylines of the edges inside it (siblings: side by side)."""
    by_chain: dict[str, list[ViewNode]] = {}
    for vn in nodes:
        if vn.chain and vn.kind == "op":
            by_chain.setdefault(vn.chain, []).append(vn)
    where = {vn.id: (vn.x, vn.y) for vn in nodes}
    bands = []
    for cid, members in by_chain.items():
        chain = chains.get(cid)
        if chain is None:
            continue
        ids = {vn.id for vn in members}
        paths = [(where[e.source], *e.points, where[e.target]) for e in edges
                 if e.source in ids and e.target in ids]
        if chain.siblings and len(members) > 1:
            row = sorted(members, key=lambda vn: (vn.x, vn.y))
            paths += [((a.x, a.y), (b.x, b.y)) for a, b in zip(row, row[1:])]
        ok = cid in accepted
        color = color_of(chain.pattern)
        bands.append(ChainBand(chain=cid, title=chain_name(chain), pattern=chain.pattern, accepted=ok,
                               fill=_tint(color, 0.30) if ok else "#f0f0f0",
                               border=_darker(color) if ok else color,
                               nodes=tuple(vn.id for vn in members), paths=tuple(paths)))
    return tuple(bands)


def _darker(color: str, factor: float = 0.65) -> str:
    m = re.fullmatch(r"#([0-9a-fA-F]{6})", color)
    if not m:
        return color
    v = int(m.group(1), 16)
    r, g, b = (v >> 16) & 255, (v >> 8) & 255, v & 255
    return "#{:02x}{:02x}{:02x}".format(int(r * factor), int(g * factor), int(b * factor))


def _tint(color: str, strength: float) -> str:
    """``color`` mixed with white: ``strength`` 1 is the colour, 0 is white."""
    m = re.fullmatch(r"#([0-9a-fA-F]{6})", color)
    if not m:
        return color
    v = int(m.group(1), 16)
    rgb = ((v >> 16) & 255, (v >> 8) & 255, v & 255)
    return "#{:02x}{:02x}{:02x}".format(*(int(255 - (255 - c) * strength) for c in rgb))


def _text_color(fill: str) -> str:
    m = re.fullmatch(r"#([0-9a-fA-F]{6})", fill)
    if not m:
        return "#000000"
    v = int(m.group(1), 16)
    r, g, b = (v >> 16) & 255, (v >> 8) & 255, v & 255
    return "#000000" if (0.299 * r + 0.587 * g + 0.114 * b) > 150 else "#ffffff"


# ------------------------------------------------------------------ geometry (for tests and checks)

def box_of(node: ViewNode) -> tuple[float, float, float, float]:
    """(left, top, right, bottom) of a node's box in graph units."""
    return (node.x - node.width / 2, node.y - node.height / 2, node.x + node.width / 2, node.y + node.height / 2)


def overlapping_nodes(view: GraphView) -> list[tuple[str, str]]:
    """Pairs of drawn nodes whose boxes overlap (should be empty)."""
    boxes = sorted(((box_of(n), n.id) for n in view.nodes), key=lambda b: b[0][0])
    out = []
    for i, (a, aid) in enumerate(boxes):
        for b, bid in boxes[i + 1:]:
            if b[0] >= a[2]:
                break
            if a[1] < b[3] and b[1] < a[3]:
                out.append((aid, bid))
    return out


def segment_hits_box(p: tuple[float, float], q: tuple[float, float], box: tuple[float, float, float, float]) -> bool:
    """Whether segment p-q passes through the inside of ``box`` (Liang-Barsky clipping)."""
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


def hidden_edges(view: GraphView) -> list[tuple[str, str, str]]:
    """(source, target, node) for every edge that passes behind a node other than its two ends."""
    where = {n.id: n for n in view.nodes}
    out = []
    for e in view.edges:
        pts = [(where[e.source].x, where[e.source].y), *e.points, (where[e.target].x, where[e.target].y)]
        for n in view.nodes:
            if n.id in (e.source, e.target):
                continue
            box = box_of(n)
            if any(segment_hits_box(p, q, box) for p, q in zip(pts, pts[1:])):
                out.append((e.source, e.target, n.id))
    return out


# ------------------------------------------------------------------ rendering

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

# Runs in the pyvis page after ``drawGraph()``: chain bands under the nodes, the first view,
# the overview map, and scrolling that pans (Ctrl+scroll zooms), as in Netron.
_EXTRA_JS = r"""
(function () {
  const FE = window.FE;
  const net = network;
  function shapeBand(ctx, band, grow) {
    const pad = FE.bandPad + grow;
    for (const id of band.nodes) {
      const b = net.getBoundingBox(id);
      if (!b) continue;
      const x = b.left - pad, y = b.top - pad, w = b.right - b.left + 2 * pad, h = b.bottom - b.top + 2 * pad;
      const r = Math.min(10, h / 3);
      ctx.beginPath();
      ctx.moveTo(x + r, y); ctx.arcTo(x + w, y, x + w, y + h, r); ctx.arcTo(x + w, y + h, x, y + h, r);
      ctx.arcTo(x, y + h, x, y, r); ctx.arcTo(x, y, x + w, y, r); ctx.closePath(); ctx.fill();
    }
    ctx.lineCap = "butt"; ctx.lineJoin = "round";
    for (const path of band.paths) {
      for (let i = 1; i < path.length; i++) {   // full width where aligned, a narrow neck where not
        const p = path[i - 1], q = path[i];
        const w = Math.abs(p[0] - q[0]) < 1 ? band.neckX : Math.abs(p[1] - q[1]) < 1 ? band.neckY : FE.neck;
        ctx.lineWidth = w + 2 * grow;
        ctx.beginPath(); ctx.moveTo(p[0], p[1]); ctx.lineTo(q[0], q[1]); ctx.stroke();
      }
    }
  }
  net.on("beforeDrawing", function (ctx) {
    for (const band of FE.bands) {            // outline first, then the fill over it: one outline per band
      ctx.fillStyle = band.border; ctx.strokeStyle = band.border; shapeBand(ctx, band, 2);
    }
    for (const band of FE.bands) { ctx.fillStyle = band.fill; ctx.strokeStyle = band.fill; shapeBand(ctx, band, 0); }
  });
  function startView() {
    const ids = FE.real;
    if (!ids.length) return;
    net.fit({nodes: ids, animation: false});
    const fitScale = net.getScale();
    if (fitScale * FE.fontPx >= FE.minFontPx && !FE.centerOn) return;
    const scale = Math.max(fitScale, FE.minFontPx / FE.fontPx);
    const el = document.getElementById("mynetwork");
    const w = el.clientWidth, h = el.clientHeight;
    let pos;
    if (FE.centerOn && net.body.nodes[FE.centerOn]) {
      pos = net.getPositions([FE.centerOn])[FE.centerOn];
    } else {
      const b = FE.bounds, start = FE.start;
      if (FE.direction === "TB") pos = {x: start, y: b.top + (h / 2 - 24) / scale};
      else pos = {x: b.left + (w / 2 - 24) / scale, y: start};
    }
    net.moveTo({position: pos, scale: scale, animation: false});
  }
  startView();
  window.FE.ready = true;
  const el = document.getElementById("mynetwork");
  el.addEventListener("wheel", function (ev) {
    if (ev.ctrlKey || ev.metaKey) return;         // vis-network zooms
    ev.preventDefault(); ev.stopPropagation();
    const s = net.getScale(), p = net.getViewPosition();
    const dx = ev.shiftKey ? ev.deltaY : ev.deltaX, dy = ev.shiftKey ? 0 : ev.deltaY;
    net.moveTo({position: {x: p.x + dx / s, y: p.y + dy / s}, scale: s, animation: false});
  }, {capture: true, passive: false});
  if (!FE.overview) return;
  const map = document.createElement("canvas");
  const b = FE.bounds, bw = Math.max(b.right - b.left, 1), bh = Math.max(b.bottom - b.top, 1);
  const maxW = 110, maxH = Math.min(170, el.clientHeight - 80);
  const k = Math.min(maxW / bw, maxH / bh);
  map.width = Math.max(40, Math.ceil(bw * k) + 8); map.height = Math.max(40, Math.ceil(bh * k) + 8);
  map.title = FE.mapTitle;
  map.style.cssText = "position:absolute;right:8px;top:8px;background:rgba(255,255,255,0.8);" +
    "border:1px solid #9e9e9e;border-radius:4px;cursor:pointer;z-index:5";
  map.id = "fe-overview";
  el.appendChild(map);
  const mctx = map.getContext("2d");
  const toMap = (x, y) => [4 + (x - b.left) * k, 4 + (y - b.top) * k];
  function drawMap() {
    mctx.clearRect(0, 0, map.width, map.height);
    for (const n of FE.mapNodes) {
      const [x, y] = toMap(n[0] - n[2] / 2, n[1] - n[3] / 2);
      mctx.fillStyle = n[4];
      mctx.fillRect(x, y, Math.max(1.5, n[2] * k), Math.max(1.5, n[3] * k));
    }
    const s = net.getScale(), p = net.getViewPosition();
    const [vx, vy] = toMap(p.x - el.clientWidth / 2 / s, p.y - el.clientHeight / 2 / s);
    mctx.strokeStyle = "#d81b60"; mctx.lineWidth = 2;
    mctx.strokeRect(vx, vy, el.clientWidth / s * k, el.clientHeight / s * k);
  }
  let dragging = false;
  function jump(ev) {
    const r = map.getBoundingClientRect();
    const x = b.left + (ev.clientX - r.left - 4) / k, y = b.top + (ev.clientY - r.top - 4) / k;
    net.moveTo({position: {x: x, y: y}, scale: net.getScale(), animation: false});
  }
  map.addEventListener("mousedown", function (ev) { dragging = true; jump(ev); ev.stopPropagation(); });
  window.addEventListener("mousemove", function (ev) { if (dragging) jump(ev); });
  window.addEventListener("mouseup", function () { dragging = false; });
  map.addEventListener("wheel", function (ev) { ev.stopPropagation(); }, {passive: true});
  net.on("afterDrawing", drawMap);
  drawMap();
})();
"""


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
    border_width = 4 if vn.highlighted else (2.5 if vn.dashed or vn.members > 1 or vn.kind == "fused" else 1.5)
    return {
        "id": vn.id, "label": vn.label, "title": _inert_title(vn.title), "shape": "box", "x": vn.x, "y": vn.y,
        "physics": False, "fixed": True,
        "color": {"background": vn.fill, "border": HIGHLIGHT_BORDER if vn.highlighted else vn.border,
                  "highlight": {"background": vn.fill, "border": "#000000"},
                  "hover": {"background": vn.fill, "border": "#000000"}},
        "borderWidth": border_width, "borderWidthSelected": border_width + 1,
        "shapeProperties": {"borderDashes": [6, 4] if vn.dashed else False, "borderRadius": 4},
        "font": {"color": _text_color(vn.fill), "size": FONT_PX, "face": "sans-serif", "multi": False},
        # vis-network adds the margins and 4 px of border room to these: the box is width x height
        "widthConstraint": {"minimum": vn.width - 20, "maximum": vn.width - 20},
        "heightConstraint": {"minimum": vn.height - 16, "valign": "middle"},
        "margin": {"top": 4, "bottom": 4, "left": 6, "right": 6},
        "shadow": {"enabled": vn.highlighted, "color": HIGHLIGHT_BORDER, "size": 12, "x": 0, "y": 0},
    }


def render_html(view: GraphView, options: RenderOptions | int = RenderOptions()) -> str:
    """Draw ``view`` with pyvis; every script and style in line, nothing fetched from the network.

    Long edges are drawn through small waypoint nodes (ids ``via:<n>``) at the places the layout
    routed them, so they pass around nodes. ``options`` may be a height in pixels (old callers).
    """
    from pyvis.network import Network

    if isinstance(options, int):
        options = RenderOptions(height_px=options)
    net = Network(height=f"{options.height_px}px", width="100%", directed=True, cdn_resources="in_line",
                  bgcolor="#ffffff")
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
    net.nodes, net.edges = nodes, edges
    net.node_ids = [n["id"] for n in nodes]
    net.node_map = {n["id"]: n for n in nodes}
    net.set_options(json.dumps({
        "physics": {"enabled": False},
        "interaction": {"hover": True, "tooltipDelay": 120, "navigationButtons": True, "keyboard": False,
                        "multiselect": True, "zoomSpeed": 0.6},
        "edges": {"smooth": {"enabled": False}, "selectionWidth": 1.5},
        "layout": {"improvedLayout": False, "hierarchical": {"enabled": False}},
    }))
    html = net.generate_html(notebook=False)
    html = _REMOTE.sub("", html)
    # pyvis prints an empty heading twice and floats the canvas: tidy both.
    html = html.replace("<center>\n<h1></h1>\n</center>", "").replace(
        "<center>\n          <h1></h1>\n        </center>", "")
    html = html.replace("float: left;", "")
    html = html.replace("<head>", "<head><style>body{margin:0} .vis-tooltip{white-space:pre !important;"
                        "font-family:monospace;font-size:12px}</style>", 1)
    html = html.replace("</body>", f"<script>window.FE = {_script_json(_extra(view, options))};"
                        f"{_EXTRA_JS}</script></body>", 1)
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


def describe(view: GraphView, lang: str = "en") -> str:
    """One line about a view, for captions: how many nodes of how many are drawn."""
    return html_lib.escape(t_in(lang, "gv.describe", drawn=len(view.nodes), total=view.total_nodes))


def implementation_text(label: str, lang: str = "en") -> str:
    """An engine's implementation label (``rewrite.AppliedChain.implementation``: "cudnn conv+bias+relu (1 fused
    call: ...)") in ``lang``: its prose translated (``i18n.translate_phrases``), its op and kernel names as
    written."""
    return translate_phrases(label, lang)
