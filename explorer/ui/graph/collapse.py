"""How a graph is collapsed to fit: modules by origin prefix, or runs of ops when names do not nest.

``group_members`` maps each drawn key (a module prefix, or a node id at depth 0) to the graph nodes it
stands for; ``choose_collapse`` finds the depth and the expansions that keep a view under its node cap
(dropping expansions first, then collapsing deeper), with a note in the view's language for each change;
``segments`` cuts a graph whose names do not nest into runs of consecutive ops (keys ``SEGMENT`` + range).
"""

from __future__ import annotations

import math
from typing import Iterable

import networkx as nx

from explorer.ui.graph.model import ViewOptions
from explorer.ui.graph.names import module_of
from explorer.ui.i18n import t_in

SEGMENT = "ops "   # prefix of the groups made when module names cannot collapse a graph


def group_members(graph: nx.DiGraph, nodes: Iterable[str], depth: int,
                  expand: tuple[str, ...]) -> dict[str, list[str]]:
    """{drawn key: its graph nodes}: each node under its module at ``depth`` (opening ``expand``), or alone."""
    groups: dict[str, list[str]] = {}
    for n in nodes:
        key = module_of(str(graph.nodes[n].get("origin", n)), depth, expand) if depth > 0 else n
        groups.setdefault(key, []).append(n)
    return groups


def _count_drawn(graph: nx.DiGraph, nodes: list[str], depth: int, expand: tuple[str, ...]) -> int:
    return len(group_members(graph, nodes, depth, expand))


def choose_collapse(graph: nx.DiGraph, nodes: list[str], options: ViewOptions) -> tuple[int, tuple[str, ...], list[str]]:
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


def segments(graph: nx.DiGraph, nodes: list[str], cap: int) -> dict[str, list[str]]:
    """Consecutive ops (graph order) in at most ``cap`` groups: for graphs whose names do not nest."""
    size = max(2, math.ceil(len(nodes) / max(1, int(cap * 0.8))))
    groups: dict[str, list[str]] = {}
    for i in range(0, len(nodes), size):
        run = nodes[i:i + size]
        groups[f"{SEGMENT}{i + 1}–{i + len(run)}"] = run
    return groups

