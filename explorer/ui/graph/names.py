"""Names, search and sorting over a model's graph, for the Graph page's controls and the view.

``chain_name`` is a person's name for a chain; ``module_of`` and ``module_prefixes`` are the module
paths a graph collapses into; ``find_nodes`` is the page's search; ``neighbourhood`` the k-hop focus;
``natural_key`` sorts ``layer.2`` before ``layer.10``. Pure: graph and strings in, values out.
"""

from __future__ import annotations

import re
from collections import Counter, deque
from typing import Iterable

import networkx as nx

from explorer.fusions.base import Chain


def natural_key(text: str) -> tuple:
    """Sort key that orders ``layer.2`` before ``layer.10`` (digit runs compare as numbers)."""
    return tuple((0, int(part), "") if part.isdigit() else (1, 0, part)
                 for part in re.split(r"(\d+)", str(text)) if part != "")


def chain_name(chain: Chain) -> str:
    """A person's name for a chain: the engine's one name (``Chain.title``: module path and ops,
    ``layer1.0: conv3 → bn3 → add → relu``), the same on every page, the command line and the report."""
    return chain.title


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
