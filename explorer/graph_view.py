"""The graph view: which ops fuse into which chains, drawn with pyvis.

Two halves, kept apart so the first is testable without a browser:

- ``build_view(graph, detection, accepted, options)`` is pure. It turns the
  networkx graph of ``explorer.graph_model`` plus the detection and the
  accepted chain ids into a renderer-neutral ``GraphView`` (plain dataclasses
  of nodes and edges with colours, tooltips and fixed positions). It collapses
  modules into one node each by origin-name prefix (``layer1``,
  ``encoder.layer.3``), expands the modules the user asked for, focuses on a
  node or a chain with its k-hop neighbourhood, and never draws more than
  ``options.max_nodes`` nodes (it collapses further on its own).
- ``render_html(view, height_px)`` draws a ``GraphView`` with pyvis, every
  script in line (no CDN: the app must work offline).

Layout is computed here, not by a physics simulation: dataflow runs left to
right by longest-path depth over the drawn nodes, and long graphs wrap into
rows, so even large graphs open at once.

    x ─► [conv ─► bn ─► relu]  ─► ...       filled: accepted chain (pattern colour)
                                            dashed grey with coloured border: rejected
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections import Counter, deque
from typing import Iterable

import networkx as nx

from explorer.fusions.base import Detection
from explorer.fusions import PATTERNS, UNKNOWN_COLOR, color_of
from explorer.units import human_bytes, human_count  # noqa: F401  (re-exported for the pages)

PLAIN_COLOR = "#f4f4f4"      # ops in no chain
PLAIN_BORDER = "#9e9e9e"
REJECTED_FILL = "#e6e6e6"    # rejected chains: grey fill, pattern-coloured dashed border
GROUP_BORDER = "#424242"
IO_COLOR = "#ffe082"         # model inputs and output
DEFAULT_MAX_NODES = 600


@dataclasses.dataclass(frozen=True)
class ViewOptions:
    """What to draw.

    depth      collapse modules by origin prefix of this many dotted parts (0: no collapse)
    expand     module prefixes to open one level further
    focus      node ids to centre on (search hits or one chain's nodes); empty: whole graph
    hops       neighbourhood radius around ``focus``
    max_nodes  hard cap on drawn nodes; beyond it the view collapses on its own
    """

    depth: int = 0
    expand: tuple[str, ...] = ()
    focus: tuple[str, ...] = ()
    hops: int = 2
    max_nodes: int = DEFAULT_MAX_NODES


@dataclasses.dataclass(frozen=True)
class ViewNode:
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


@dataclasses.dataclass(frozen=True)
class ViewEdge:
    source: str
    target: str
    title: str = ""
    weight: int = 1        # how many graph edges it stands for


@dataclasses.dataclass(frozen=True)
class GraphView:
    nodes: tuple[ViewNode, ...]
    edges: tuple[ViewEdge, ...]
    total_nodes: int            # nodes in the full graph
    depth: int                  # collapse depth actually used
    collapsed_modules: tuple[str, ...]   # modules drawn as one node (expandable)
    notes: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class LegendItem:
    name: str
    label: str
    color: str
    count: int


# ------------------------------------------------------------------ helpers

def legend(detection: Detection | None = None) -> list[LegendItem]:
    """One item per registered pattern (with its chain count in ``detection``), then 'unknown'."""
    counts = detection.counts if detection is not None else {}
    items = [LegendItem(p.name, p.label, p.color, counts.get(p.name, 0)) for p in PATTERNS]
    items.append(LegendItem("unknown", "unknown pattern", UNKNOWN_COLOR, 0))
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
    """Module prefixes (``layer1``, ``layer1.0``) that hold at least two ops: what can be collapsed."""
    counts: Counter = Counter()
    for _, a in graph.nodes(data=True):
        parts = str(a.get("origin", "")).split(".")
        for d in range(1, min(len(parts), max_depth) + 1):
            counts[".".join(parts[:d])] += 1
    return sorted((p for p, n in counts.items() if n >= 2), key=lambda p: (p.count("."), p))


def find_nodes(graph: nx.DiGraph, query: str, limit: int = 20) -> list[str]:
    """Node ids whose id equals ``query`` or whose id/origin contains it (case-insensitive)."""
    q = query.strip().lower()
    if not q:
        return []
    if query.strip() in graph:
        return [query.strip()]
    hits = [n for n, a in sorted(graph.nodes(data=True), key=lambda kv: kv[1].get("order", 0))
            if q in n.lower() or q in str(a.get("origin", "")).lower()]
    return hits[:limit]


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


def _node_title(nid: str, a: dict, chain: str | None, status: str) -> str:
    shapes = "; ".join("x".join(str(d) for d in s) or "scalar" for s in a.get("shapes", [])) or "-"
    lines = [
        f"{nid}  ({a.get('kind', '?')})",
        f"op: {a.get('target', '?')}",
        f"origin: {a.get('origin', '?')}",
        f"shape: {shapes}  {', '.join(a.get('dtypes', []))}",
        f"bytes: read {human_bytes(a.get('bytes_read', 0))}, written {human_bytes(a.get('bytes_written', 0))}",
        f"FLOPs: {human_count(a.get('flops', 0))}",
    ]
    if chain:
        lines.append(f"chain: {chain} ({status})")
    return "\n".join(lines)


# ------------------------------------------------------------------ the view

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
    """Depth and expansions that fit under the cap; notes say what was changed."""
    notes: list[str] = []
    depth, expand = options.depth, tuple(options.expand)
    cap = max(1, options.max_nodes)
    if _count_drawn(graph, nodes, depth, expand) <= cap:
        return depth, expand, notes
    # Too many: first drop expansions (newest first), then collapse deeper.
    while expand and _count_drawn(graph, nodes, depth, expand) > cap:
        notes.append(f"not expanding {expand[-1]}: more than {cap} nodes")
        expand = expand[:-1]
    if _count_drawn(graph, nodes, depth, expand) <= cap:
        return depth, expand, notes
    max_depth = max((len(str(graph.nodes[n].get("origin", n)).split(".")) for n in nodes), default=1)
    candidates = range(max_depth, 0, -1) if depth <= 0 else range(min(depth, max_depth), 0, -1)
    for d in candidates:
        if _count_drawn(graph, nodes, d, expand) <= cap:
            notes.append(f"{len(nodes)} ops are more than the cap of {cap}: modules collapsed at depth {d}")
            return d, expand, notes
    notes.append(f"even fully collapsed the graph has more than {cap} nodes: showing the first {cap}")
    return 1, (), notes


def _layout(ids: list[str], edges: list[tuple[str, str]], rank: dict[str, float],
            per_row: int | None = None, dx: float = 150.0, dy: float = 70.0) -> dict[str, tuple[float, float]]:
    """Left-to-right layered layout: level = longest path over forward edges; rows wrap."""
    order = sorted(ids, key=lambda n: rank[n])
    preds: dict[str, list[str]] = {n: [] for n in ids}
    for s, t in edges:
        if rank[s] < rank[t]:
            preds[t].append(s)
    level: dict[str, int] = {}
    for n in order:
        level[n] = max((level[p] + 1 for p in preds[n]), default=0)
    by_level: dict[int, list[str]] = {}
    for n in order:
        by_level.setdefault(level[n], []).append(n)
    n_levels = (max(level.values()) + 1) if level else 0
    if per_row is None:
        per_row = n_levels if n_levels <= 40 else max(24, int(math.ceil(math.sqrt(n_levels * 6))))
    pos: dict[str, tuple[float, float]] = {}
    row_top = 0.0
    for row_start in range(0, max(n_levels, 1), max(per_row, 1)):
        levels = range(row_start, min(row_start + per_row, n_levels))
        width = max((len(by_level.get(lv, [])) for lv in levels), default=1)
        for lv in levels:
            members = by_level.get(lv, [])
            for i, n in enumerate(members):
                offset = (i - (len(members) - 1) / 2.0) * dy
                pos[n] = ((lv - row_start) * dx, row_top + (width - 1) * dy / 2.0 + offset)
        row_top += (width + 1.5) * dy
    return pos


def build_view(graph: nx.DiGraph, detection: Detection, accepted: Iterable[str],
               options: ViewOptions = ViewOptions()) -> GraphView:
    """Build the renderer-neutral view of ``graph`` (pure; see module docstring)."""
    accepted = set(accepted)
    node_chain = detection.node_to_chain()
    chain_pattern = {c.id: c.pattern for c in detection.chains}
    notes: list[str] = []

    all_nodes = sorted(graph.nodes, key=lambda n: graph.nodes[n].get("order", 0))
    focus = tuple(f for f in options.focus if f in graph)
    if options.focus and not focus:
        notes.append("nothing to focus on: no such node")
    if focus:
        keep = neighbourhood(graph, focus, max(0, options.hops))
        nodes = [n for n in all_nodes if n in keep]
        depth, expand = 0, ()
        if len(nodes) > options.max_nodes:
            # keep the nodes nearest the focus
            dist = {}
            for f in focus:
                for n, d in nx.single_source_shortest_path_length(graph.to_undirected(as_view=True), f,
                                                                  cutoff=options.hops).items():
                    dist[n] = min(d, dist.get(n, d))
            nodes = sorted(nodes, key=lambda n: (dist.get(n, 99), graph.nodes[n].get("order", 0)))
            nodes = sorted(nodes[: options.max_nodes], key=lambda n: graph.nodes[n].get("order", 0))
            notes.append(f"neighbourhood cut to the {options.max_nodes} nearest nodes")
    else:
        nodes = all_nodes
        depth, expand, extra = _choose_collapse(graph, nodes, options)
        notes.extend(extra)

    groups = _group_members(graph, nodes, depth, expand) if depth > 0 else {n: [n] for n in nodes}
    if len(groups) > options.max_nodes:
        first = sorted(groups, key=lambda k: min(graph.nodes[m].get("order", 0) for m in groups[k]))
        groups = {k: groups[k] for k in first[: options.max_nodes]}
    member_of = {m: key for key, ms in groups.items() for m in ms}
    rank = {key: min(graph.nodes[m].get("order", 0) for m in ms) for key, ms in groups.items()}

    view_nodes: list[ViewNode] = []
    collapsed: list[str] = []
    focus_set = set(focus)
    for key, ms in groups.items():
        if len(ms) == 1:
            view_nodes.append(_op_node(ms[0], graph, node_chain, chain_pattern,
                                       accepted, focus_set))
        else:
            collapsed.append(key)
            view_nodes.append(_group_node(key, ms, graph, node_chain, chain_pattern, accepted))
    # op nodes drawn alone keep their own id; groups use the module prefix as id
    id_of = {}
    for vn in view_nodes:
        if vn.members == 1:
            id_of[vn.id] = vn.id
    drawn_id = {m: (m if m in id_of else f"module:{member_of[m]}") for m in member_of}

    edge_count: Counter = Counter()
    edge_bytes: Counter = Counter()
    for s, t, a in graph.edges(data=True):
        if s in drawn_id and t in drawn_id:
            ds, dt = drawn_id[s], drawn_id[t]
            if ds != dt:
                edge_count[(ds, dt)] += 1
                edge_bytes[(ds, dt)] += int(a.get("bytes", 0))
    edges = [ViewEdge(s, t, f"{human_bytes(edge_bytes[(s, t)])}" + (f" over {c} edges" if c > 1 else ""), c)
             for (s, t), c in edge_count.items()]

    ranks = {vn.id: rank[member_of[vn.id]] if vn.members == 1 else rank[vn.id[len("module:"):]]
             for vn in view_nodes}
    pos = _layout([vn.id for vn in view_nodes], [(e.source, e.target) for e in edges], ranks)
    view_nodes = [dataclasses.replace(vn, x=pos[vn.id][0], y=pos[vn.id][1]) for vn in view_nodes]
    view_nodes.sort(key=lambda vn: ranks[vn.id])
    return GraphView(nodes=tuple(view_nodes), edges=tuple(edges), total_nodes=graph.number_of_nodes(),
                     depth=depth, collapsed_modules=tuple(sorted(collapsed)), notes=tuple(notes))


def _op_node(nid: str, graph: nx.DiGraph, node_chain: dict, chain_pattern: dict, accepted: set,
             focus: set) -> ViewNode:
    a = graph.nodes[nid]
    chain = node_chain.get(nid)
    kind = a.get("kind", "?")
    label = f"{kind}\n{a.get('origin', nid)}"
    if len(label) > 40:
        label = label[:39] + "…"
    if chain is None:
        io = kind in ("input", "output")
        fill, border, dashed, status, pattern = (IO_COLOR if io else PLAIN_COLOR), PLAIN_BORDER, False, "", None
        shape = "ellipse" if io else "box"
    else:
        pattern = chain_pattern.get(chain)
        color = color_of(pattern or "")
        if chain in accepted:
            fill, border, dashed, status = color, _darker(color), False, "accepted"
        else:
            fill, border, dashed, status = REJECTED_FILL, color, True, "rejected"
        shape = "box"
    return ViewNode(id=nid, label=label, title=_node_title(nid, a, chain, status), fill=fill, border=border,
                    dashed=dashed, shape=shape, chain=chain, pattern=pattern, highlighted=nid in focus)


def _group_node(key: str, members: list[str], graph: nx.DiGraph, node_chain: dict, chain_pattern: dict,
                accepted: set) -> ViewNode:
    chains = {node_chain[m] for m in members if m in node_chain}
    by_pattern = Counter(chain_pattern.get(c) for c in chains)
    n_acc = sum(1 for c in chains if c in accepted)
    if by_pattern:
        top = by_pattern.most_common(1)[0][0]
        color = color_of(top or "")
        fill = color if n_acc else REJECTED_FILL
        border, dashed = (_darker(color), False) if n_acc == len(chains) else (color, True)
    else:
        top, fill, border, dashed = None, PLAIN_COLOR, GROUP_BORDER, False
    flops = sum(graph.nodes[m].get("flops", 0) for m in members)
    moved = sum(graph.nodes[m].get("bytes_read", 0) + graph.nodes[m].get("bytes_written", 0) for m in members)
    lines = [f"module {key}: {len(members)} ops, {len(chains)} chains ({n_acc} accepted)"]
    lines += [f"  {n} x {p}" for p, n in by_pattern.most_common()]
    lines += [f"bytes moved unfused: {human_bytes(moved)}", f"FLOPs: {human_count(flops)}",
              "expand it with 'Expand modules'"]
    label = f"{key}\n{len(members)} ops · {len(chains)} chains"
    return ViewNode(id=f"module:{key}", label=label, title="\n".join(lines), fill=fill, border=border,
                    dashed=dashed, shape="box", members=len(members), pattern=top)


def _darker(color: str, factor: float = 0.65) -> str:
    m = re.fullmatch(r"#([0-9a-fA-F]{6})", color)
    if not m:
        return color
    v = int(m.group(1), 16)
    r, g, b = (v >> 16) & 255, (v >> 8) & 255, v & 255
    return "#{:02x}{:02x}{:02x}".format(int(r * factor), int(g * factor), int(b * factor))


def _text_color(fill: str) -> str:
    m = re.fullmatch(r"#([0-9a-fA-F]{6})", fill)
    if not m:
        return "#000000"
    v = int(m.group(1), 16)
    r, g, b = (v >> 16) & 255, (v >> 8) & 255, v & 255
    return "#000000" if (0.299 * r + 0.587 * g + 0.114 * b) > 150 else "#ffffff"


# ------------------------------------------------------------------ rendering

_REMOTE = re.compile(r"<(script|link)\b[^>]*\b(src|href)\s*=\s*[\"']https?://[^>]*>(\s*</script>)?",
                     re.IGNORECASE | re.DOTALL)


def render_html(view: GraphView, height_px: int = 640) -> str:
    """Draw ``view`` with pyvis; every script and style in line, nothing fetched from the network."""
    from pyvis.network import Network

    net = Network(height=f"{height_px}px", width="100%", directed=True, cdn_resources="in_line",
                  bgcolor="#ffffff")
    for vn in view.nodes:
        net.add_node(
            vn.id, label=vn.label, title=vn.title, shape=vn.shape, x=vn.x, y=vn.y, physics=False,
            color={"background": vn.fill, "border": vn.border,
                   "highlight": {"background": vn.fill, "border": "#000000"}},
            borderWidth=4 if vn.highlighted else (3 if vn.dashed or vn.members > 1 else 1.5),
            shapeProperties={"borderDashes": [6, 4] if vn.dashed else False},
            font={"color": _text_color(vn.fill), "size": 16 if vn.members > 1 else 13,
                  "face": "sans-serif", "multi": False},
            margin=8 if vn.members > 1 else 5,
            shadow=vn.highlighted,
        )
    for e in view.edges:
        net.add_edge(e.source, e.target, title=e.title, width=min(1 + math.log2(e.weight), 5),
                     color="#8a8a8a", arrows="to")
    net.set_options(
        """{"physics": {"enabled": false},
            "interaction": {"hover": true, "tooltipDelay": 120, "navigationButtons": true,
                            "keyboard": false, "multiselect": true},
            "edges": {"smooth": {"enabled": false}, "arrows": {"to": {"scaleFactor": 0.5}}},
            "layout": {"improvedLayout": false}}"""
    )
    html = net.generate_html(notebook=False)
    html = _REMOTE.sub("", html)
    # pyvis prints an empty heading twice and floats the canvas: tidy both.
    html = html.replace("<center>\n<h1></h1>\n</center>", "").replace(
        "<center>\n          <h1></h1>\n        </center>", "")
    html = html.replace("float: left;", "")
    html = html.replace("<head>", "<head><style>body{margin:0} .vis-tooltip{white-space:pre !important;"
                        "font-family:monospace;font-size:12px}</style>", 1)
    return html


def remote_urls(html: str) -> list[str]:
    """Every http(s) script/stylesheet the page would fetch (should be empty)."""
    return [m.group(0) for m in _REMOTE.finditer(html)]
