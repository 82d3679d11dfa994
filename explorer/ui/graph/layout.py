"""Where the drawn nodes go: a layered (Sugiyama) layout by igraph, edges routed around nodes.

``layered_layout(ids, edges, sizes, direction)`` computes node centres and edge waypoints with
igraph's ``Graph.layout_sugiyama`` (crossing reduction by barycenters). Dataflow runs top to bottom
("TB") or left to right ("LR"). An edge that spans several layers passes through dummy vertices, which
are slots of their own in each layer, so a skip connection is drawn around the nodes it passes, never
behind them; ``bend_around`` bends the few straight segments that would still clip a node.

The geometry checks (``overlapping_nodes``, ``hidden_edges``, ``segment_hits_box``) say whether a
built view keeps those promises; the tests and the start-up benchmark use them.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Mapping

import networkx as nx

from explorer.ui.graph.model import DIRECTIONS, LAYER_GAP, SLOT_GAP, GraphView, ViewEdge, ViewNode, box_of

Point = tuple[float, float]


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
                   direction: str = "TB") -> tuple[dict[str, Point], dict[tuple[str, str], tuple[Point, ...]]]:
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
    n_vertices, links, dummy_of = _with_dummies(index, pairs, layer)
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
    place = _placer(direction, wmax, hmax)
    pos = {n: place(*coords[i]) for n, i in index.items()}
    waypoints = {pair: tuple(place(float(p[0]), float(p[1])) for p in route)
                 for pair, route in zip(pairs, routes)}
    return pos, waypoints


def _with_dummies(index: Mapping[str, int], pairs: list[tuple[str, str]], layer: list[int]
                  ) -> tuple[int, list[tuple[int, int]], dict[tuple[str, str], list[int]]]:
    """A proper layering: an edge that spans k layers goes through k-1 dummy vertices, one per layer, which
    igraph orders and places like any vertex. Returns the vertex count, the links and {edge: its dummies};
    ``layer`` grows by the dummies' layers.

    (igraph 1.0 inserts dummies itself, but its ``edge_routing`` hands some edges another edge's dummy
    points, e.g. on BERT; with the dummies in the graph every edge spans one layer and no routing is needed.)
    """
    n_vertices = len(index)
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
    return n_vertices, links, dummy_of


def _placer(direction: str, wmax: float, hmax: float) -> Callable[[float, float], Point]:
    """Layout coordinates (slot across, layer along) to graph units, for ``direction``."""
    if direction == "TB":
        slot, step = wmax + SLOT_GAP, hmax + LAYER_GAP

        def place(u: float, v: float) -> Point:
            return (round(u * slot, 1), round(v * step, 1))
    else:
        slot, step = hmax + SLOT_GAP * 0.6, wmax + LAYER_GAP

        def place(u: float, v: float) -> Point:
            return (round(v * step, 1), round(u * slot, 1))
    return place


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



def bend_around(nodes: list[ViewNode], edges: list[ViewEdge], direction: str) -> list[ViewEdge]:
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

