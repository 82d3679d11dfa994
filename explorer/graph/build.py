"""The networkx view of a captured model: one node per tensor op, with costs.

``build_graph(gm)`` turns an ATen-level ``torch.fx.GraphModule`` into a
``networkx.DiGraph`` whose node ids are the fx node names. Weights are not
nodes; their bytes and element counts are charged to the op that reads them.

Node attributes
    kind            canonical op kind (``explorer.vocab``, read by ``explorer.graph.aten``)
    target          the ATen op, e.g. ``aten.conv2d.default``
    origin          module path (``layer1.0.conv1``) or ONNX node name
    shapes, dtypes  output tensor shapes (lists) and dtype names
    bytes_read      bytes of every tensor input, weights included
    bytes_written   bytes of every output
    flops           FLOP estimate
    params          weight elements read by this op
    launches        kernels it launches unfused (0 for views, inputs, output)
    order           position in topological order

Graph attributes (``G.graph``): ``model``, ``nodes``, ``ops``, ``params``,
``flops``, ``bytes``, ``launches``, ``fingerprint``.
"""

from __future__ import annotations

import hashlib
from typing import Iterable

import networkx as nx
import torch
import torch.fx

from explorer.graph import aten
from explorer.vocab import is_view_kind


def ensure_shapes(gm: torch.fx.GraphModule, example_inputs: Iterable[torch.Tensor]) -> None:
    """Fill ``meta['val']`` on every node by fake-tensor propagation, if any lacks it."""
    needs = any(
        n.op in ("placeholder", "call_function") and "val" not in n.meta for n in gm.graph.nodes
    )
    if not needs:
        return
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp

    mode = FakeTensorMode(allow_non_fake_inputs=True)
    FakeTensorProp(gm, mode).propagate(*example_inputs)


def origin_of(node: torch.fx.Node) -> str:
    """Where a node came from: the innermost module path (torch.export's, or the one an ONNX file
    records), else an ONNX node name, else its own name."""
    stack = node.meta.get("nn_module_stack")
    if stack:
        path = list(stack.values())[-1][0]
        path = str(path).replace("L['self'].", "").replace("L__self__.", "")
        if path:
            return path
    if "onnx_name" in node.meta and node.meta["onnx_name"]:
        return str(node.meta["onnx_name"])
    return node.name


def _input_nodes(node: torch.fx.Node) -> list[torch.fx.Node]:
    return list(node.all_input_nodes)


def build_graph(gm: torch.fx.GraphModule, model_name: str = "model") -> nx.DiGraph:
    """Build the annotated DiGraph of ``gm`` (shapes must be in ``meta['val']``)."""
    g = nx.DiGraph(model=model_name)
    weight_elems: dict[str, int] = {}
    order = 0
    kept: set[str] = set()
    for node in gm.graph.nodes:
        if node.op == "get_attr" or aten.is_ignored(node):
            continue
        kind = aten.kind_of(node)
        outs = aten.tensor_vals(node.meta.get("val")) if node.op != "output" else []
        bytes_read = 0
        params = 0
        for src in _input_nodes(node):
            vals = aten.tensor_vals(src.meta.get("val"))
            if src.op == "get_attr":
                attr = getattr(*aten.attr_owner(gm, src.target), None)
                if isinstance(attr, torch.Tensor):
                    vals = [attr]
                    weight_elems[src.target] = attr.numel()
                    params += attr.numel()
            if is_view_kind(kind) and kind != "output":
                continue
            bytes_read += sum(aten.nbytes(t) for t in vals)
        written = 0 if is_view_kind(kind) else sum(aten.nbytes(t) for t in outs)
        if kind == "output":
            bytes_read = 0
        launches = 0 if is_view_kind(kind) else 1
        g.add_node(
            node.name,
            kind=kind,
            target=aten.target_str(node) if node.op == "call_function" else node.op,
            origin=origin_of(node) if node.op == "call_function" else node.name,
            shapes=[list(t.shape) for t in outs],
            dtypes=[str(t.dtype).replace("torch.", "") for t in outs],
            bytes_read=int(bytes_read),
            bytes_written=int(written),
            flops=int(aten.flops_of(node, kind)) if node.op == "call_function" else 0,
            params=int(params),
            launches=launches,
            order=order,
            **(aten.facts(node, kind) if node.op == "call_function" else {}),
        )
        kept.add(node.name)
        order += 1
        for src in _input_nodes(node):
            if src.name in kept:
                vals = aten.tensor_vals(src.meta.get("val"))
                g.add_edge(src.name, node.name, bytes=int(sum(aten.nbytes(t) for t in vals)))
    _totals(g, sum(weight_elems.values()))
    return g


def _totals(g: nx.DiGraph, params: int) -> None:
    data = g.nodes.data()
    compute = [a for _, a in data if a["launches"]]
    g.graph.update(
        nodes=g.number_of_nodes(),
        ops=len(compute),
        params=int(params),
        flops=int(sum(a["flops"] for a in compute)),
        bytes=int(sum(a["bytes_read"] + a["bytes_written"] for a in compute)),
        launches=int(sum(a["launches"] for a in compute)),
        fingerprint=fingerprint(g),
    )


def fingerprint(g: nx.DiGraph) -> str:
    """A hash of the graph's structure (node ids, kinds, edges), independent of batch size."""
    h = hashlib.sha256()
    for name, attrs in sorted(g.nodes(data=True), key=lambda kv: kv[1]["order"]):
        h.update(f"{name}:{attrs['kind']};".encode())
    for u, v in sorted(g.edges()):
        h.update(f"{u}>{v};".encode())
    return h.hexdigest()[:16]


def topo_nodes(g: nx.DiGraph) -> list[str]:
    """Node ids in the fx (topological) order."""
    return [n for n, _ in sorted(g.nodes(data="order"), key=lambda kv: kv[1])]
