"""Synthetic fusion graphs of any size, for scaling benchmarks and tests.

``residual_cnn_graph(blocks)`` builds, without torch, a graph with the same
node attributes as ``graph_model.build_graph`` would: a chain of ResNet basic
blocks (conv-bn-relu, conv-bn, add, relu). Each block is 7 nodes and yields
one Conv+BN+act and one Conv+BN+Add+act chain.
"""

from __future__ import annotations

import networkx as nx

from explorer.graph.build import fingerprint

_SHAPE = [1, 64, 56, 56]
_BYTES = 64 * 56 * 56 * 4


def _add(g: nx.DiGraph, name: str, kind: str, order: int, **facts: object) -> None:
    g.add_node(name, kind=kind, target=f"synthetic.{kind}", origin=name, shapes=[_SHAPE], dtypes=["float32"],
               bytes_read=_BYTES, bytes_written=_BYTES if kind != "input" else 0, flops=_BYTES // 4,
               params=0, launches=0 if kind in ("input", "output") else 1, order=order, **facts)


def residual_cnn_graph(blocks: int) -> nx.DiGraph:
    """A graph of ``blocks`` residual blocks: 7 * blocks + 2 nodes."""
    g = nx.DiGraph(model=f"synthetic_{blocks}")
    order = 0
    _add(g, "x", "input", order)
    prev = "x"
    for b in range(blocks):
        names = [f"b{b}_{s}" for s in ("conv1", "bn1", "relu1", "conv2", "bn2", "add", "relu2")]
        kinds = ["conv", "batch_norm", "relu", "conv", "batch_norm", "add", "relu"]
        for name, kind in zip(names, kinds):
            order += 1
            _add(g, name, kind, order, **({"training": False} if kind == "batch_norm" else {}))
        for u, v in zip([prev] + names[:5], names[:6]):
            g.add_edge(u, v, bytes=_BYTES)
        g.add_edge(prev, names[5], bytes=_BYTES)  # the identity branch
        g.add_edge(names[5], names[6], bytes=_BYTES)
        prev = names[6]
    order += 1
    _add(g, "output", "output", order)
    g.add_edge(prev, "output", bytes=_BYTES)
    g.graph.update(nodes=g.number_of_nodes(), fingerprint=fingerprint(g))
    return g
