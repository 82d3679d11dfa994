"""The graph after the accepted fusions, and what they change: nodes and kernel launches.

``fused_graph(graph, detection, fused)`` turns each chain the engine fused (``FusedChain``, from
``rewrite.apply_plan``'s ``applied`` entries) into one node labelled with its kernel; the view draws
it like any other graph. ``fused_counts`` states nodes and launches before and after, each chain's
launches counted on the device its kernel was chosen for (``explorer.launches``). Pure.
"""

from __future__ import annotations

import dataclasses
from typing import Iterable, Mapping

import networkx as nx

from explorer import launches as launch_counts
from explorer.fusions.base import Chain, Detection
from explorer.ui.graph.names import chain_name


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
