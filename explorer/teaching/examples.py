"""Worked examples on the loaded model: a Conv+BN fold by hand, and the bytes each version of a chain moves.

Pure functions of an ``Analysis`` (``fusion_engine.analyze``); nothing here
changes the model.

- ``fold_example``: one real Conv+BN chain of the model, one output channel:
  γ, β, μ (running mean), σ² (running variance), ε, the folded scale
  s = γ/√(σ²+ε), the folded bias b' = (b − μ)·s + β, a few weights before and
  after (w' = w·s), and the chain's output before and after folding on a seeded
  input of the real shape (one sample), computed in float64 with
  ``explorer.fusions.conv.fold_conv_bn`` and compared against
  ``FOLD_TOLERANCE_F64`` (relative to the largest output). The same fold in
  float32 is shown beside it: that difference is rounding, not algebra.
- ``traffic_example``: for one chain, what each op reads and writes in device
  memory (the byte model, scaled to the dtype) and what the fused kernel reads
  and writes; the intermediates that no longer go to device memory and back
  are listed (``kept`` when something outside the chain still reads one, so the
  fused kernel writes it as an extra output). The two totals differ by exactly
  ``Chain.bytes_saved``. ``external_inputs`` are the activations each op reads
  from outside the chain (weights are charged to the op, not listed).
- ``examples_by_family``: the first chain of each pattern family the model has.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from explorer.fusions import FAMILIES
from explorer.fusions.conv import FOLD_TOLERANCE_F64, conv_bn_reference, conv_nd, fold_conv_bn
from explorer.graph import aten
from explorer.runtime import measure as m

#: pattern name -> its family module's short name (conv, norm, attention, ...)
FAMILY_OF: dict[str, str] = {p.name: f.__name__.rsplit(".", 1)[-1] for f in FAMILIES for p in f.PATTERNS}


@dataclasses.dataclass(frozen=True)
class FoldExample:
    """One output channel of a Conv+BN fold, and the chain's output before and after folding."""

    chain_id: str
    title: str
    channel: int
    channels: int
    gamma: float
    beta: float
    mean: float
    var: float
    eps: float
    scale: float
    conv_bias: float
    folded_bias: float
    weights_before: tuple[float, ...]
    weights_after: tuple[float, ...]
    input_shape: tuple[int, ...]
    output_shape: tuple[int, ...]
    max_abs_diff_f64: float
    max_abs_output: float
    rel_diff_f64: float
    tolerance: float
    agrees: bool
    rel_diff_f32_folded: float
    rel_diff_f32_unfused: float

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def bn_chains(detection: Any) -> list:
    """The chains with a BatchNorm that folds into a convolution (role ``bn`` after role ``conv``)."""
    return [c for c in detection.chains if c.node_for("bn") is not None and c.node_for("conv") is not None]


def _tensor(gm: torch.fx.GraphModule, node: Any, what: str) -> torch.Tensor | None:
    if node is None:
        return None
    if isinstance(node, torch.fx.Node) and node.op == "get_attr":
        value = aten.attr_value(gm, node.target)
        if isinstance(value, torch.Tensor):
            return value.detach()
    raise ValueError(f"{what} is not a constant of the graph")


def fold_example(analysis: Any, chain_id: str | None = None, channel: int = 0, seed: int = 0) -> FoldExample | None:
    """The fold of one output ``channel`` of a Conv+BN chain (the first one when ``chain_id`` is None).

    Returns None when the model has no such chain. Raises ValueError for an
    unknown chain id, a chain without a BatchNorm, or a channel out of range.
    """
    model, _graph, detection = analysis
    chains = bn_chains(detection)
    if not chains:
        return None
    chain = chains[0] if chain_id is None else next((c for c in chains if c.id == chain_id), None)
    if chain is None:
        raise ValueError(f"{chain_id} is not a Conv+BN chain of {detection.model}")
    gm = model.gm
    by_name = {n.name: n for n in gm.graph.nodes}
    conv_node, bn_node = by_name[chain.node_for("conv")], by_name[chain.node_for("bn")]
    c, b = aten.conv_args(conv_node), aten.batch_norm_args(bn_node)
    if c is None or b is None:
        raise ValueError(f"{chain.id}: its conv or BatchNorm is not one the fold reads")
    w = _tensor(gm, c.weight, "conv weight")
    bias = _tensor(gm, c.bias, "conv bias")
    mean, var = _tensor(gm, b.running_mean, "running mean"), _tensor(gm, b.running_var, "running var")
    gamma, beta = _tensor(gm, b.weight, "BatchNorm weight"), _tensor(gm, b.bias, "BatchNorm bias")
    channels = int(w.shape[0])
    if not 0 <= channel < channels:
        raise ValueError(f"channel {channel} is out of range: the conv has {channels} output channels")
    eps = float(b.eps)

    f64 = torch.float64
    def d(t):
        return None if t is None else t.to(f64)
    w_f, b_f = fold_conv_bn(d(w), d(bias), d(mean), d(var), d(gamma), d(beta), eps)
    s = (d(gamma) if gamma is not None else torch.ones(channels, dtype=f64)) / torch.sqrt(d(var) + eps)

    x_val = aten.node_val(c.input)
    shape = (1, *[int(v) for v in x_val.shape[1:]]) if isinstance(x_val, torch.Tensor) else None
    if shape is None:
        raise ValueError(f"{chain.id}: the conv input has no shape metadata")
    x = torch.randn(shape, generator=torch.Generator().manual_seed(seed), dtype=f64)
    geometry = (c.stride, c.padding, c.dilation, c.groups)
    ref = conv_bn_reference(x, d(w), d(bias), d(mean), d(var), d(gamma), d(beta), eps, *geometry)
    folded = conv_nd(x, w_f, b_f, *geometry)
    diff = float((ref - folded).abs().max())
    top = float(ref.abs().max())
    # the same fold in float32 (as the fused model holds it), and the unfused ops in float32
    w32, b32 = fold_conv_bn(w.float(), None if bias is None else bias.float(), mean.float(), var.float(),
                            None if gamma is None else gamma.float(), None if beta is None else beta.float(), eps)
    x32 = x.float()
    out_f32 = conv_nd(x32, w32, b32, *geometry).double()
    unf_f32 = conv_bn_reference(x32, w.float(), None if bias is None else bias.float(), mean.float(), var.float(),
                                None if gamma is None else gamma.float(), None if beta is None else beta.float(),
                                eps, *geometry).double()
    rel = diff / top if top > 0 else 0.0
    wc, wfc = d(w)[channel].reshape(-1), w_f[channel].reshape(-1)
    return FoldExample(
        chain_id=chain.id, title=chain.title, channel=channel, channels=channels,
        gamma=float(gamma[channel]) if gamma is not None else 1.0,
        beta=float(beta[channel]) if beta is not None else 0.0,
        mean=float(mean[channel]), var=float(var[channel]), eps=eps, scale=float(s[channel]),
        conv_bias=float(bias[channel]) if bias is not None else 0.0, folded_bias=float(b_f[channel]),
        weights_before=tuple(float(v) for v in wc[:3]), weights_after=tuple(float(v) for v in wfc[:3]),
        input_shape=tuple(shape), output_shape=tuple(int(v) for v in ref.shape),
        max_abs_diff_f64=diff, max_abs_output=top, rel_diff_f64=rel, tolerance=FOLD_TOLERANCE_F64,
        agrees=rel <= FOLD_TOLERANCE_F64,
        rel_diff_f32_folded=float((out_f32 - ref).abs().max()) / top if top > 0 else 0.0,
        rel_diff_f32_unfused=float((unf_f32 - ref).abs().max()) / top if top > 0 else 0.0)


# ------------------------------------------------------------------ bytes each version reads and writes

@dataclasses.dataclass(frozen=True)
class TrafficExample:
    """What one chain reads and writes in device memory, op by op unfused and as one fused kernel (bytes)."""

    chain_id: str
    title: str
    pattern: str
    family: str
    dtype: str
    ops: tuple[dict, ...]
    fused_reads: int
    fused_writes: int
    intermediates: tuple[dict, ...]
    bytes_saved: int
    siblings: bool = False
    external_inputs: tuple[dict, ...] = ()

    @property
    def unfused_reads(self) -> int:
        return sum(o["reads"] for o in self.ops)

    @property
    def unfused_writes(self) -> int:
        return sum(o["writes"] for o in self.ops)

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d.update(ops=list(self.ops), intermediates=list(self.intermediates), unfused_reads=self.unfused_reads,
                 unfused_writes=self.unfused_writes)
        return d


def _written(graph: Any, node: str, dtype: torch.dtype) -> int:
    attrs = graph.nodes[node]
    dts = attrs.get("dtypes") or []
    floating = not dts or any(str(t).startswith(("float", "bfloat", "half", "double")) for t in dts)
    return int(round(attrs["bytes_written"] * (m.element_ratio(dtype) if floating else 1.0)))


def traffic_example(graph: Any, chain: Any, dtype_name: str) -> TrafficExample:
    """Reads and writes of ``chain`` unfused (per op) and fused, in ``dtype_name``, by the byte model."""
    dtype = m.torch_dtype(dtype_name)
    ops = []
    for node, role in chain.roles:
        total = m.graph_bytes(graph, dtype, [node])
        writes = _written(graph, node, dtype)
        ops.append({"node": node, "role": role, "kind": graph.nodes[node]["kind"],
                    "origin": graph.nodes[node]["origin"], "reads": int(total - writes), "writes": writes})
    saved = int(round(chain.bytes_saved * m.element_ratio(dtype)))
    inter = []
    if chain.siblings:
        first = graph.nodes[chain.compute_nodes[0]].get("first_input")
        shared = int(round(saved / max(len(chain.compute_nodes) - 1, 1)))
        inter.append({"node": first, "bytes": shared, "kept": True, "reads_saved": len(chain.compute_nodes) - 1})
        fused_reads = sum(o["reads"] for o in ops) - saved
        fused_writes = sum(o["writes"] for o in ops)
    else:
        extra = set(chain.extra_outputs)
        for node in chain.compute_nodes[:-1]:
            inter.append({"node": node, "kind": graph.nodes[node]["kind"], "bytes": _written(graph, node, dtype),
                          "kept": node in extra, "reads_saved": 1})
        fused_reads = sum(o["reads"] for o in ops) - sum(i["bytes"] for i in inter)
        fused_writes = sum(o["writes"] for o in ops) - sum(i["bytes"] for i in inter if not i["kept"])
    members = set(chain.nodes)
    external = []
    for i, node in enumerate(chain.compute_nodes):
        for src in sorted(graph.predecessors(node), key=lambda n: graph.nodes[n]["order"]):
            if src not in members:
                external.append({"op_index": i, "node": src,
                                 "bytes": int(round(graph.edges[src, node].get("bytes", 0) * m.element_ratio(dtype)))})
    return TrafficExample(chain_id=chain.id, title=chain.title, pattern=chain.pattern,
                          family=FAMILY_OF.get(chain.pattern, "generic"), dtype=dtype_name, ops=tuple(ops),
                          fused_reads=int(fused_reads), fused_writes=int(fused_writes), intermediates=tuple(inter),
                          bytes_saved=saved, siblings=chain.siblings, external_inputs=tuple(external))


def examples_by_family(analysis: Any, dtype_name: str = "fp32") -> dict[str, TrafficExample]:
    """{family: TrafficExample of its first chain in the model}, in the order the families first appear."""
    _model, graph, detection = analysis
    out: dict[str, TrafficExample] = {}
    for chain in detection.chains:
        family = FAMILY_OF.get(chain.pattern, "generic")
        if family not in out:
            out[family] = traffic_example(graph, chain, dtype_name)
    return out
