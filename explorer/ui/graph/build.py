"""``build_view``: a model's graph (or its fused graph) and its detection as a ``GraphView``. Pure.

It collapses modules into one node each by origin-name prefix (``layer1``, ``encoder.layer.3``;
``collapse``), expands the modules asked for, focuses on one chain with its k-hop neighbourhood,
highlights search hits, never draws more than ``options.max_nodes`` nodes (it collapses further on
its own), lays the drawn nodes out (``layout``) and gives each chain a band so that it is drawn as
one unit. ``legend`` is the patterns a detection has, with their counts.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from typing import Iterable

import networkx as nx

from explorer.fusions import BY_NAME, PATTERNS, UNKNOWN_COLOR, color_of
from explorer.fusions.base import Detection
from explorer.ui.graph.collapse import SEGMENT, choose_collapse, group_members, segments
from explorer.ui.graph.layout import bend_around, layered_layout
from explorer.ui.graph.model import (ChainBand, GraphView, LegendItem, ViewEdge, ViewNode, ViewOptions, darker,
                                     tint)
from explorer.ui.graph.names import chain_name, natural_key, neighbourhood
from explorer.ui.graph.nodes import group_node, op_node
from explorer.ui.i18n import t_in
from explorer.units import human_bytes


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


def build_view(graph: nx.DiGraph, detection: Detection, accepted: Iterable[str],
               options: ViewOptions = ViewOptions()) -> GraphView:
    """Build the renderer-neutral view of ``graph`` (pure; see the module docstring).

    ``graph`` may be a model's graph or its ``fused_graph``; ``accepted`` are the accepted chain ids.
    """
    accepted = set(accepted)
    node_chain = detection.node_to_chain()
    chains = {c.id: c for c in detection.chains}
    alias, options = _follow_fused(graph, options)
    groups, depth, notes = _groups(graph, options)
    member_of = {m: key for key, ms in groups.items() for m in ms}
    rank = {key: min(graph.nodes[m].get("order", 0) for m in ms) for key, ms in groups.items()}
    highlight = {h for h in options.highlight if h in member_of}
    hit_groups = {member_of[h] for h in highlight}

    view_nodes: list[ViewNode] = []
    collapsed: list[str] = []
    drawn_id: dict[str, str] = {}
    for key, ms in groups.items():
        if len(ms) == 1 and not key.startswith(SEGMENT):
            vn = op_node(ms[0], graph, node_chain, chains, accepted, ms[0] in highlight, options.lang)
        else:
            if not key.startswith(SEGMENT):
                collapsed.append(key)
            vn = group_node(key, ms, graph, node_chain, chains, accepted, key in hit_groups, options.lang)
        view_nodes.append(vn)
        for m in ms:
            drawn_id[m] = vn.id
    drawn_of = dict(drawn_id)
    drawn_of.update({m: drawn_id[n] for m, n in alias.items() if n in drawn_id})
    node_rank = {vn.id: rank[member_of[vn.id] if vn.id in member_of else vn.id[len("module:"):]]
                 for vn in view_nodes}
    view_nodes, edges = _placed(graph, view_nodes, drawn_id, node_rank, options)
    bands = _bands(view_nodes, edges, chains, accepted)
    return GraphView(nodes=tuple(view_nodes), edges=tuple(edges), total_nodes=graph.number_of_nodes(),
                     depth=max(depth, 0), collapsed_modules=tuple(sorted(collapsed, key=natural_key)),
                     notes=tuple(notes), bands=bands, direction=options.direction,
                     drawn_of=tuple(drawn_of.items()))


def _follow_fused(graph: nx.DiGraph, options: ViewOptions) -> tuple[dict[str, str], ViewOptions]:
    """{op: its fused chain's node} of a fused graph, and ``options`` with focus, highlight and reveal moved
    from a fused chain's ops onto the chain (in a fused graph an op of a fused chain is drawn as the chain)."""
    alias = {m: n for n, a in graph.nodes(data=True) if a.get("kind") == "fused" for m in a.get("members", ())}
    options = dataclasses.replace(
        options, focus=tuple(dict.fromkeys(alias.get(f, f) for f in options.focus)),
        highlight=tuple(dict.fromkeys(alias.get(h, h) for h in options.highlight)),
        reveal=alias.get(options.reveal, options.reveal) if options.reveal else None)
    return alias, options


def _groups(graph: nx.DiGraph, options: ViewOptions) -> tuple[dict[str, list[str]], int, list[str]]:
    """{drawn key: its graph nodes}, the collapse depth used (-1: runs of ops) and the notes saying what
    the view left out: a focused neighbourhood (cut to the cap, nearest first), or the whole graph
    collapsed to fit, with the modules around ``options.reveal`` opened."""
    all_nodes = sorted(graph.nodes, key=lambda n: graph.nodes[n].get("order", 0))
    focus = tuple(f for f in options.focus if f in graph)
    lang = options.lang
    notes: list[str] = []
    if options.focus and not focus:
        notes.append(t_in(lang, "gv.note.no_focus"))
    expand = tuple(options.expand)
    if options.reveal and options.reveal in graph:
        parts = str(graph.nodes[options.reveal].get("origin", "")).split(".")
        expand = expand + tuple(".".join(parts[:d]) for d in range(1, len(parts)) if ".".join(parts[:d]) not in expand)
    if focus:
        nodes, cut = _focused(graph, all_nodes, focus, options)
        if cut:
            notes.append(t_in(lang, "gv.note.cut", n=options.max_nodes))
        return {n: [n] for n in nodes}, 0, notes
    depth, expand, extra = choose_collapse(graph, all_nodes, dataclasses.replace(options, expand=expand))
    notes.extend(extra)
    if depth < 0:
        return segments(graph, all_nodes, options.max_nodes), depth, notes
    if depth > 0:
        return group_members(graph, all_nodes, depth, expand), depth, notes
    return {n: [n] for n in all_nodes}, depth, notes


def _focused(graph: nx.DiGraph, all_nodes: list[str], focus: tuple[str, ...],
             options: ViewOptions) -> tuple[list[str], bool]:
    """The nodes within ``options.hops`` of ``focus`` in graph order (beyond the cap, the nearest ones), and
    whether the cap cut some off."""
    keep = neighbourhood(graph, focus, max(0, options.hops))
    nodes = [n for n in all_nodes if n in keep]
    if len(nodes) <= options.max_nodes:
        return nodes, False
    dist: dict[str, int] = {}
    undirected = graph.to_undirected(as_view=True)
    for f in focus:
        for n, d in nx.single_source_shortest_path_length(undirected, f, cutoff=options.hops).items():
            dist[n] = min(d, dist.get(n, d))
    nodes = sorted(nodes, key=lambda n: (dist.get(n, 99), graph.nodes[n].get("order", 0)))
    return sorted(nodes[: options.max_nodes], key=lambda n: graph.nodes[n].get("order", 0)), True


def _placed(graph: nx.DiGraph, view_nodes: list[ViewNode], drawn_id: dict[str, str], node_rank: dict[str, int],
            options: ViewOptions) -> tuple[list[ViewNode], list[ViewEdge]]:
    """The drawn nodes at their layout positions (in graph order) and the edges between them: one per pair
    of drawn nodes, standing for every graph edge between their members (its tooltip: the bytes it moves)."""
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
    edges = [ViewEdge(s, t, t_in(options.lang, "gv.edge.many", bytes=human_bytes(edge_bytes[(s, t)]), n=c) if c > 1
                      else human_bytes(edge_bytes[(s, t)]), c, waypoints.get((s, t), ()))
             for (s, t), c in edge_count.items()]
    view_nodes = [dataclasses.replace(vn, x=pos[vn.id][0], y=pos[vn.id][1]) for vn in view_nodes]
    view_nodes.sort(key=lambda vn: node_rank[vn.id])
    return view_nodes, bend_around(view_nodes, edges, options.direction)


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
                               fill=tint(color, 0.30) if ok else "#f0f0f0",
                               border=darker(color) if ok else color,
                               nodes=tuple(vn.id for vn in members), paths=tuple(paths)))
    return tuple(bands)
