"""Apply a fusion plan to a model: a NEW fx GraphModule where each accepted chain is one call.

::

    original (never mutated)                 fused copy
    x ─► conv2d ─► batch_norm ─► relu_       x ─► fused_conv_bn_act(x, w', b', ..., "relu")
         (w)        (mean, var, γ, β)                       (w', b' = BN folded into w, b: new buffers)

    x, r ─► add ─► layer_norm ─► y           x, r ─► fused_add_layer_norm ─► (sum, y)
             └──► (sum used later)                         getitem 0 ─► (sum used later)
                                                           getitem 1 ─► y

Each chain of a ``Detection`` that the ``Plan`` accepts is rewritten in two
steps. First every edit is *planned* on the copied graph without changing it
(read the chain's nodes by role, fold weights, choose the fused function and
its arguments); then the edits are *applied* one after another (insert the
fused call after its last input, reroute the users of the chain's outputs,
erase the chain's nodes). A chain whose planning or application fails is
recorded as ``failed`` (or ``refused`` when a guard says no) with a one-line
reason, and the other chains go on.

The fused call targets are the module-level functions below (``fused_*``), so
``gm.code`` reads as what runs. Each delegates to ``explorer.kernels``, which
picks the fused kernel where the device has one and otherwise runs the plain
composition; ``AppliedChain.implementation`` says which, per device.
Patterns without a kernel of their own (``elementwise_chain``), and chains
whose shape the kernels do not take, run through ``fused_subgraph``: the
chain's ops as a small GraphModule compiled by inductor on first call. The
plan's kernel choice for a chain (``Plan.kernels``) can ask for that path
("inductor") or for the epilogue as separate kernels ("separate_epilogue").

``level`` follows the seed's staged table (``LEVELS``): "none" copies,
"conv_bn" only folds BatchNorm, "activation" also fuses conv/linear epilogues,
"all" applies every accepted chain.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import logging
import operator
import os
import shutil
from typing import Any, Callable, Iterable

import torch
import torch.fx

from explorer import ops
from explorer.errors import PlanError
from explorer.fusion_engine import Chain, Detection
from explorer.kernels import add_layernorm as _aln
from explorer.kernels import bn_fold as _bn_fold
from explorer.kernels import conv_epilogue as _conv_ep
from explorer.kernels import linear_act as _lin
from explorer.kernels import matmul_softmax as _mms
from explorer.kernels import sibling_linear as _sib
from explorer.patterns import BY_NAME
from explorer.plan import Plan
from explorer.sources import LoadedModel

log = logging.getLogger(__name__)

LEVELS = ("none", "conv_bn", "activation", "all")
GENERIC_LABEL = "generic: torch.compile's inductor on the chain subgraph"
_EPILOGUE_STAGES = ("conv_bn", "activation")


@dataclasses.dataclass
class AppliedChain:
    """What happened to one accepted chain: ``status`` is fused | failed | refused."""

    chain_id: str
    pattern: str
    implementation: str
    status: str
    reason: str = ""
    kernel: str = "auto"     # the plan's kernel choice for this chain (patterns.KERNEL_CHOICES)

    def to_dict(self) -> dict[str, str]:
        return dataclasses.asdict(self)


@dataclasses.dataclass
class FusedModel:
    """The fused copy of a model's graph and the fate of every accepted chain."""

    gm: torch.fx.GraphModule
    applied: list[AppliedChain]

    def by_id(self) -> dict[str, AppliedChain]:
        return {a.chain_id: a for a in self.applied}


# ====================================================================== fused call targets
# Plain module-level functions: gm.code names them, pickle finds them by name.

def fused_conv_bn(x, weight, bias, stride, padding, dilation, groups):
    """conv with BatchNorm folded into ``weight``/``bias`` (one conv kernel)."""
    return _bn_fold.conv_nd(x, weight, bias, stride, padding, dilation, groups)


def fused_conv_act(x, weight, bias, stride, padding, dilation, groups, act):
    """``act(conv(x, weight) + bias)``: conv epilogue (cuDNN fused for relu on CUDA)."""
    return _conv_ep.conv_bias_act(x, weight, bias, stride, padding, dilation, groups, act)


def fused_conv_bn_act(x, weight, bias, stride, padding, dilation, groups, act):
    """``act(conv(x, w') + b')`` with BatchNorm folded into ``w'``/``b'``."""
    return _conv_ep.conv_bias_act(x, weight, bias, stride, padding, dilation, groups, act)


def fused_conv_add_act(x, weight, bias, z, stride, padding, dilation, groups, act):
    """``act(conv(x, weight) + bias + z)``: residual add and activation in the conv epilogue."""
    return _conv_ep.conv_bias_add_act(x, weight, bias, z, stride, padding, dilation, groups, act)


def fused_conv_bn_add_act(x, weight, bias, z, stride, padding, dilation, groups, act):
    """``act(conv(x, w') + b' + z)`` with BatchNorm folded into ``w'``/``b'``."""
    return _conv_ep.conv_bias_add_act(x, weight, bias, z, stride, padding, dilation, groups, act)


def fused_linear_act(x, weight, bias, act):
    """``act(x @ weightᵀ + bias)``: cuBLASLt epilogue where it applies."""
    return _lin.linear_act(x, weight, bias, act)


def fused_conv_separate_epilogue(x, weight, bias, z, stride, padding, dilation, groups, act):
    """Kernel choice "separate_epilogue": conv with its bias, then ``+ z`` (when given) and ``act`` in place."""
    return _conv_ep.conv_bias_act_separate(x, weight, bias, z, stride, padding, dilation, groups, act)


def fused_linear_separate_epilogue(x, weight, bias, act):
    """Kernel choice "separate_epilogue": the linear with its bias, then ``act`` in place."""
    return _lin.linear_act_separate(x, weight, bias, act)


def fused_linear_siblings(x, weight, bias, sizes):
    """Sibling projections of ``x`` as one GEMM over concatenated weights: a tuple of column views."""
    return _sib.linear_siblings(x, weight, bias, sizes)


def fused_add_layer_norm(x, residual, weight, bias, eps):
    """``(x + residual, layer_norm(x + residual))`` over the last dim, from one kernel where possible."""
    return _aln.add_layernorm(x, residual, weight, bias, eps)


def fused_add_layer_norm_normed(x, residual, weight, bias, eps):
    """``layer_norm(x + residual)`` from one kernel where possible; the sum (read by nothing else) is not written."""
    return _aln.add_layernorm(x, residual, weight, bias, eps, keep_sum=False)[1]


def fused_matmul_softmax(a, b, scale, mask):
    """``softmax(a @ b * scale + mask, dim=-1)``, scores kept on chip where the Triton kernel runs."""
    return _mms.matmul_softmax(a, b, scale, _mask_like(mask, a))


def fused_attention(q, k, v, scale, mask):
    """``softmax(q @ kᵀ * scale + mask) @ v`` as one scaled_dot_product_attention call."""
    return _mms.attention(q, k, v, scale, mask)  # it casts a floating mask to q's dtype, as _mask_like


def fused_attention_kt(q, k_t, v, scale, mask):
    """Like ``fused_attention`` when the graph holds ``kᵀ`` itself (not a transpose of ``k``)."""
    return _mms.attention(q, k_t.transpose(-2, -1), v, scale, mask)


def fused_subgraph(chain_module, *inputs):
    """Run a chain's own small GraphModule (``_CompiledChain``: compiled by inductor at its first call)."""
    return chain_module(*inputs)


def _mask_like(mask, x):
    """SDPA takes a bool mask or one in the query's dtype; the unfused add would have promoted."""
    if isinstance(mask, torch.Tensor) and mask.is_floating_point() and mask.dtype != x.dtype:
        return mask.to(x.dtype)
    return mask


def _input_signature(inputs: tuple) -> tuple:
    """What a compiled chain is specialised on: each tensor's shape, strides, dtype and device."""
    return tuple((t.shape, t.stride(), t.dtype, t.device) if isinstance(t, torch.Tensor) else (type(t), t)
                 for t in inputs)


class _CompiledChain(torch.nn.Module):
    """A chain's subgraph, compiled by inductor (torch.compile's compiler) at its first call.

    The subgraph is already a graph of ATen ops, so it goes to inductor
    (``torch._inductor.compile_fx.compile_fx``) directly, without dynamo. Dynamo
    would trace it again and check its guards before every call: about 230 µs
    of host time per call of one small chain in BERT-base on the H200 machine
    (``benchmarks/results/graph_host_before_fastpath_h200.json``), several times the ops it
    replaces. Its one guard that matters here is kept, cheaper: each compiled
    version is specialised on its inputs' shapes, strides, dtypes and devices
    (``_input_signature``), and a call with another signature compiles another.

    When compiling is impossible (CPU without a C++ compiler) or fails, the
    subgraph runs eagerly, op by op; ``mode`` says which ("pending",
    "compiled", "eager").
    """

    def __init__(self, sub: torch.fx.GraphModule, compile_it: bool) -> None:
        super().__init__()
        self.sub = sub
        self.mode = "pending" if compile_it else "eager"
        self._compiled: dict[tuple, Callable] = {}

    def forward(self, *inputs):
        if self.mode == "eager":
            return self.sub(*inputs)
        key = _input_signature(inputs)
        fn = self._compiled.get(key)
        if fn is None:
            try:
                from torch._inductor.compile_fx import compile_fx

                # compile_fx rewrites the graph it is given (its outputs become a list): a copy
                fn = compile_fx(copy.deepcopy(self.sub), list(inputs))
                out = fn(*inputs)
            except Exception as exc:  # inductor raises many kinds; the eager path is exact
                log.warning("inductor could not compile a fused chain, running it eagerly: %s",
                            str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__)
                self.mode = "eager"
                return self.sub(*inputs)
            self._compiled[key] = fn
            self.mode = "compiled"
            return out
        return fn(*inputs)

    def __deepcopy__(self, memo):
        return _CompiledChain(copy.deepcopy(self.sub, memo), self.mode != "eager")

    def __getstate__(self):
        state = self.__dict__.copy()
        state["_compiled"] = {}
        if state.get("mode") == "compiled":
            state["mode"] = "pending"
        return state


# ====================================================================== public API

def apply_plan(model: LoadedModel, detection: Detection, plan: Plan, device: str = "cpu",
               level: str = "all") -> FusedModel:
    """Return a fused copy of ``model.gm`` with the plan's accepted chains rewritten.

    ``device`` only chooses the implementation labels (which kernel runs
    where); the returned module is on the model's device. ``level`` is one of
    ``LEVELS``. Raises ``PlanError`` for a plan made for another model or an
    unknown level. Never mutates ``model.gm``.
    """
    if level not in LEVELS:
        raise PlanError(f"unknown fusion level '{level}': choose one of {', '.join(LEVELS)}")
    plan.check_for(detection)
    dev = _device(device)
    gm = copy.deepcopy(model.gm)
    accepted = set(plan.accepted)
    chains = [c for c in detection.chains if c.id in accepted]
    applied = _rewrite(gm, [(c, _mode(c, level), plan.kernel_for(c.id)) for c in chains], dev, level)
    return FusedModel(gm=gm, applied=applied)


def chain_module(model: LoadedModel, detection: Detection, chain_id: str, device: str = "cpu",
                 kernel: str = "auto") -> tuple[torch.fx.GraphModule, torch.fx.GraphModule, tuple[torch.Tensor, ...]]:
    """The chain alone: ``(unfused module, fused module, example inputs)`` for a micro-benchmark.

    The unfused module has one placeholder per external tensor input of the
    chain (in graph order), its weights as ``get_attr`` and returns the
    chain's last node (a tuple with the extra outputs after it when there are
    any). The fused module is the same module with the chain applied
    (``apply_plan`` semantics at level "all", with the plan's ``kernel`` choice). Example inputs are seeded
    random tensors at the real shapes and dtypes (additive masks are zeros).
    Everything is on ``device``. Raises ``KeyError`` for an unknown chain and
    ``RuntimeError`` when the chain cannot be fused.
    """
    chain = detection.chain(chain_id)
    dev = _device(device)
    by_name = {n.name: n for n in model.gm.graph.nodes}
    members = [by_name[n] for n in _in_graph_order(model.gm, chain.nodes)]
    outputs = [by_name[n] for n in chain.outputs]
    unfused, inputs = _extract(model.gm, members, outputs, attrs_as_placeholders=False)
    unfused = unfused.to(dev)
    fused = copy.deepcopy(unfused)
    applied = _rewrite(fused, [(chain, "full", kernel)], dev, "all")
    if applied[0].status != "fused":
        raise RuntimeError(f"{chain_id} could not be fused: {applied[0].reason}")
    mask_inputs = _mask_operands(chain, by_name)
    gen = torch.Generator().manual_seed(0)
    examples = tuple(_example(n, gen, n.name in mask_inputs).to(dev) for n in inputs)
    return unfused, fused, examples


# ====================================================================== levels

def _mode(chain: Chain, level: str) -> str | None:
    """How much of ``chain`` a level applies: "full", "fold" (BN only) or None."""
    has_bn = chain.node_for("bn") is not None
    if level == "all":
        return "full"
    if level == "activation" and BY_NAME[chain.pattern].stage in _EPILOGUE_STAGES:
        return "full"
    if level in ("conv_bn", "activation") and has_bn:
        return "fold"
    return None


# ====================================================================== planning

class _Refuse(Exception):
    """A guard said no (status "refused"): the message is the reason."""


class _UseGeneric(Exception):
    """The specialised kernel does not take this chain; run the generic fallback (message: why)."""


@dataclasses.dataclass
class _NewAttr:
    """A tensor the edit registers as a buffer, referenced in the fused call's arguments."""

    key: str


@dataclasses.dataclass
class _Edit:
    """One planned rewrite: replace ``remove`` by ``target(*args)``; reroute ``outputs``' users."""

    chain: Chain
    remove: list[torch.fx.Node]
    outputs: list[torch.fx.Node]                      # the call returns a tuple when more than one
    target: Callable
    args: tuple
    implementation: str
    tensors: dict[str, torch.Tensor] = dataclasses.field(default_factory=dict)
    modules: dict[str, torch.nn.Module] = dataclasses.field(default_factory=dict)
    tuple_result: bool = False                        # the call returns a tuple: outputs[i] <- result[i]
    read_attrs: set = dataclasses.field(default_factory=set)  # get_attr targets the removed nodes read


def _rewrite(gm: torch.fx.GraphModule, work: list[tuple[Chain, str | None, str]], dev: torch.device,
             level: str) -> list[AppliedChain]:
    """Plan every edit (chain, level mode, kernel choice), then apply them in order; clean up and recompile."""
    by_name = {n.name: n for n in gm.graph.nodes}
    results: dict[str, AppliedChain] = {}
    edits: list[_Edit] = []
    kernels = {c.id: k for c, _, k in work}
    for chain, mode, kernel in work:
        if mode is None:
            results[chain.id] = AppliedChain(chain.id, chain.pattern, "unfused (separate ops)", "refused",
                                             _level_reason(level), kernel)
            continue
        try:
            edit = _plan_chain(gm, by_name, chain, mode, dev, level, kernel)
        except _Refuse as why:
            results[chain.id] = AppliedChain(chain.id, chain.pattern, "unfused (separate ops)", "refused",
                                             _one_line(why), kernel)
            continue
        except Exception as exc:  # one chain's failure must not stop the others
            results[chain.id] = AppliedChain(chain.id, chain.pattern, "unfused (separate ops)", "failed",
                                             f"planning failed: {_one_line(exc)}", kernel)
            continue
        edits.append(edit)
    replaced: dict[torch.fx.Node, torch.fx.Node] = {}
    for edit in edits:
        try:
            _apply_edit(gm, edit, replaced)
        except Exception as exc:
            results[edit.chain.id] = AppliedChain(edit.chain.id, edit.chain.pattern, "unfused (separate ops)",
                                                  "failed", f"rewrite failed: {_one_line(exc)}",
                                                  kernels[edit.chain.id])
            continue
        reason = _level_reason(level) if level != "all" and edit.target is fused_conv_bn \
            and edit.chain.pattern != "conv_bn" else ""
        results[edit.chain.id] = AppliedChain(edit.chain.id, edit.chain.pattern, edit.implementation,
                                              "fused", reason, kernels[edit.chain.id])
    if not any(r.status == "fused" for r in results.values()):
        return [results[c.id] for c, _, _ in work]  # nothing changed: the copy stays an exact copy
    gm.graph.eliminate_dead_code()
    _drop_unused_tensors(gm, [e for e in edits if results[e.chain.id].status == "fused"])
    gm.graph.lint()
    gm.recompile()
    return [results[c.id] for c, _, _ in work]


def _level_reason(level: str) -> str:
    return {
        "none": "level 'none': nothing is fused",
        "conv_bn": "level 'conv_bn': only BatchNorm is folded; the rest of the chain runs as separate ops",
        "activation": "level 'activation': only BatchNorm folding and conv/linear epilogues are applied",
    }.get(level, "")


def _plan_chain(gm, by_name, chain: Chain, mode: str, dev: torch.device, level: str,
                kernel: str = "auto") -> _Edit:
    """The edit for one chain. A level's "fold" mode folds BatchNorm whatever the kernel choice;
    otherwise the plan's kernel choice (``patterns.KERNEL_CHOICES``) picks the implementation."""
    missing = [n for n in chain.nodes if n not in by_name]
    if missing:
        raise RuntimeError(f"chain nodes not in the graph: {', '.join(missing[:3])}")
    _check_inplace(gm, by_name, chain)
    if mode == "fold":
        return _plan_fold(gm, by_name, chain, dev)
    if kernel not in BY_NAME[chain.pattern].kernels:
        raise _Refuse(f"kernel '{kernel}' is not a choice for {chain.pattern}")
    if kernel == "inductor":
        return _plan_generic(gm, by_name, chain, dev, "kernel choice: inductor")
    if chain.pattern == "conv_bn":
        return _plan_fold(gm, by_name, chain, dev)
    if kernel == "separate_epilogue":
        return _PLANNERS[chain.pattern](gm, by_name, chain, dev, separate=True)
    planner = _PLANNERS.get(chain.pattern)
    if planner is None:
        return _plan_generic(gm, by_name, chain, dev, "")
    try:
        return planner(gm, by_name, chain, dev)
    except _UseGeneric as why:
        return _plan_generic(gm, by_name, chain, dev, str(why))


# ---------------------------------------------------------------------- conv family

def _conv_params(conv: torch.fx.Node) -> tuple[Any, Any, Any, Any, Any, Any]:
    """(weight, bias, stride, padding, dilation, groups) of a conv node."""
    name = ops.aten_name(conv)
    if name in ("conv1d", "conv2d", "conv3d"):
        return (ops.arg(conv, 1, "weight"), ops.arg(conv, 2, "bias"), ops.arg(conv, 3, "stride", 1),
                ops.arg(conv, 4, "padding", 0), ops.arg(conv, 5, "dilation", 1), ops.arg(conv, 6, "groups", 1))
    if name == "convolution":
        if ops.arg(conv, 6, "transposed", False):
            raise _UseGeneric("transposed convolution")
        if any(ops.arg(conv, 7, "output_padding", [0]) or [0]):
            raise _UseGeneric("convolution with output padding")
        return (ops.arg(conv, 1, "weight"), ops.arg(conv, 2, "bias"), ops.arg(conv, 3, "stride", 1),
                ops.arg(conv, 4, "padding", 0), ops.arg(conv, 5, "dilation", 1), ops.arg(conv, 8, "groups", 1))
    raise _UseGeneric(f"conv op {name} is not one the epilogue takes")


def _bn_params(bn: torch.fx.Node) -> tuple[Any, Any, Any, Any, bool, float]:
    """(weight, bias, running_mean, running_var, training, eps) of a batch_norm node."""
    name = ops.aten_name(bn)
    if name in ("batch_norm", "native_batch_norm", "_native_batch_norm_legit"):
        return (ops.arg(bn, 1, "weight"), ops.arg(bn, 2, "bias"), ops.arg(bn, 3, "running_mean"),
                ops.arg(bn, 4, "running_var"), bool(ops.arg(bn, 5, "training", False)),
                float(ops.arg(bn, 7, "eps", 1e-5)))
    if name == "_native_batch_norm_legit_no_training":
        return (ops.arg(bn, 1, "weight"), ops.arg(bn, 2, "bias"), ops.arg(bn, 3, "running_mean"),
                ops.arg(bn, 4, "running_var"), False, float(ops.arg(bn, 6, "eps", 1e-5)))
    raise _Refuse(f"BatchNorm variant {name} is not folded")


def _bn_output(bn: torch.fx.Node, chain_nodes: set[str]) -> tuple[torch.fx.Node, list[torch.fx.Node]]:
    """The node that carries the normalised tensor (bn itself, or its ``getitem 0``), and extra nodes to remove."""
    val = bn.meta.get("val")
    if not isinstance(val, (tuple, list)):
        return bn, []
    users = list(bn.users)
    firsts = [u for u in users if u.target is operator.getitem and u.args[1] == 0]
    others = [u for u in users if u not in firsts and not ops.is_ignored(u)]
    if len(firsts) != 1 or any(u.users for u in others):
        raise _Refuse("BatchNorm statistics outputs are used: not folded")
    return firsts[0], [u for u in users if u is not firsts[0]] if firsts[0].name in chain_nodes else users


def _folded(gm, conv: torch.fx.Node, bn: torch.fx.Node) -> tuple[torch.Tensor, torch.Tensor, tuple]:
    """Fold ``bn`` into ``conv``: returns (weight, bias, (stride, padding, dilation, groups))."""
    weight, bias, stride, padding, dilation, groups = _conv_params(conv)
    bn_w, bn_b, mean, var, training, eps = _bn_params(bn)
    if training or ops.is_training_batch_norm(bn):
        raise _Refuse(_bn_fold.TRAINING_REFUSAL)
    if mean is None or var is None:
        raise _Refuse(_bn_fold.NO_RUNNING_STATS_REFUSAL)
    if not _through_identity(ops.arg(bn, 0, "input"), conv):
        raise _Refuse("BatchNorm does not read the conv output directly")
    tensors = [_constant(gm, t, what) for t, what in ((weight, "conv weight"), (bias, "conv bias"),
                                                      (mean, "running mean"), (var, "running var"),
                                                      (bn_w, "BatchNorm weight"), (bn_b, "BatchNorm bias"))]
    w, b = _bn_fold.fold_conv_bn(tensors[0], tensors[1], tensors[2], tensors[3], tensors[4], tensors[5], eps)
    return w, b, (stride, padding, dilation, groups)


def _plan_fold(gm, by_name, chain: Chain, dev: torch.device) -> _Edit:
    """conv → (views) → BN becomes one conv with folded weights; the rest of the chain stays."""
    conv, bn = by_name[chain.node_for("conv")], by_name[chain.node_for("bn")]
    names = list(chain.nodes)
    covered = [by_name[n] for n in names[: names.index(bn.name) + 1]]
    out, extra_remove = _bn_output(bn, set(names))
    w, b, (stride, padding, dilation, groups) = _folded(gm, conv, bn)
    if out is not bn and out.name in names:
        covered += [out]
    remove = covered + extra_remove
    _check_no_outside_users(remove, [out])
    label = "BatchNorm folded into the conv weights (exact arithmetic, 1 conv kernel on any device)"
    key = conv.name
    return _Edit(chain, remove, [out], fused_conv_bn,
                 (ops.arg(conv, 0, "input"), _NewAttr(f"{key}_weight"), _NewAttr(f"{key}_bias"),
                  stride, padding, dilation, groups),
                 label, tensors={f"{key}_weight": w, f"{key}_bias": b})


def _plan_conv(gm, by_name, chain: Chain, dev: torch.device, separate: bool = False) -> _Edit:
    """conv [→ BN] [→ add z] → act as one epilogue call (BN folded); ``separate``: the kernel choice
    "separate_epilogue" (conv with bias, then add and activation in place, never cuDNN's fused call)."""
    _only_identity_views(by_name, chain)
    conv = by_name[chain.node_for("conv")]
    bn_name, add_name = chain.node_for("bn"), chain.node_for("add")
    act_node = by_name[chain.node_for("act")]
    act = _act_name(act_node)
    if act not in _conv_ep.CONV_ACTIVATIONS:
        raise _UseGeneric(f"activation {act} has no conv epilogue")
    weight, bias, stride, padding, dilation, groups = _conv_params(conv)
    tensors: dict[str, torch.Tensor] = {}
    if bn_name is not None:
        w, b, _ = _folded(gm, conv, by_name[bn_name])
        tensors = {f"{conv.name}_weight": w, f"{conv.name}_bias": b}
        weight, bias = _NewAttr(f"{conv.name}_weight"), _NewAttr(f"{conv.name}_bias")
    members = {by_name[n] for n in chain.nodes}
    x = ops.arg(conv, 0, "input")
    wdim = _val(conv.args[1]).dim() if isinstance(_val(conv.args[1]), torch.Tensor) else 4
    dtype = _dtype(conv)
    z = None
    if add_name is not None:
        add = by_name[add_name]
        _check_alpha(add)
        z = _other_operand(add, members)
        target = fused_conv_bn_add_act if bn_name is not None else fused_conv_add_act
        args = (x, weight, bias, z, stride, padding, dilation, groups, act)
    else:
        target = fused_conv_bn_act if bn_name is not None else fused_conv_act
        args = (x, weight, bias, stride, padding, dilation, groups, act)
    if separate:
        target, args = fused_conv_separate_epilogue, (x, weight, bias, z, stride, padding, dilation, groups, act)
    label = _conv_ep.describe(act, dev, add=add_name is not None, dtype=dtype, weight_dim=wdim, cudnn=not separate)
    if bn_name is not None:
        label = f"BatchNorm folded (exact) + {label}"
    if separate:
        label += "; kernel choice: separate epilogue"
    elif "cudnn" not in label:
        label += _not_fused_note(dev, "the conv epilogue")
    return _whole_chain_edit(by_name, chain, target, args, label, tensors)


# ---------------------------------------------------------------------- transformer family

def _plan_linear_act(gm, by_name, chain: Chain, dev: torch.device, separate: bool = False) -> _Edit:
    """linear → act as one cuBLASLt epilogue call where it applies; ``separate``: the kernel choice
    "separate_epilogue" (the linear, then the activation in place)."""
    _only_identity_views(by_name, chain)
    lin = by_name[chain.node_for("linear")]
    if ops.aten_name(lin) != "linear":
        raise _UseGeneric(f"{ops.aten_name(lin)} is not a plain linear")
    act = _act_name(by_name[chain.node_for("act")])
    if act not in _lin.LINEAR_ACTIVATIONS:
        raise _UseGeneric(f"activation {act} has no linear epilogue")
    args = (ops.arg(lin, 0, "input"), ops.arg(lin, 1, "weight"), ops.arg(lin, 2, "bias"), act)
    if separate:
        steps = 1 + (act != "none")
        label = (f"linear{f' + {act} in place' if act != 'none' else ''} ({steps} kernel{'s' if steps > 1 else ''}; "
                 "kernel choice: separate epilogue)")
        return _whole_chain_edit(by_name, chain, fused_linear_separate_epilogue, args, label)
    try:
        label = _lin.describe(act, dev, _dtype(lin))
    except RuntimeError:  # describe probes the GPU's GELU epilogue: not possible without the device
        if dev.type != "cuda" or torch.cuda.is_available():
            raise
        label = (f"cuBLASLt GEMM+bias+{act} epilogue where it applies on the device, "
                 f"else linear + {act} in place (2 kernels)")
    if "cuBLASLt" not in label:
        label += _not_fused_note(dev, "the GEMM epilogue")
    return _whole_chain_edit(by_name, chain, fused_linear_act, args, label)


def _plan_add_layer_norm(gm, by_name, chain: Chain, dev: torch.device) -> _Edit:
    _only_identity_views(by_name, chain)
    add, ln = by_name[chain.node_for("add")], by_name[chain.node_for("layer_norm")]
    if ops.aten_name(ln) != "layer_norm" or ops.aten_name(add) not in ("add",):
        raise _UseGeneric(f"{ops.aten_name(add)} → {ops.aten_name(ln)} is not add → layer_norm")
    _check_alpha(add)
    x, residual = add.args[0], add.args[1]
    if not all(isinstance(t, torch.fx.Node) for t in (x, residual)):
        raise _UseGeneric("add of a constant")
    xs, rs, out = _val(x), _val(residual), _val(add)
    if not all(isinstance(t, torch.Tensor) for t in (xs, rs, out)) or xs.dtype != rs.dtype:
        raise _UseGeneric("the add mixes dtypes")
    if xs.shape != out.shape and rs.shape == out.shape:  # the add is commutative: the full operand first
        x, residual, xs, rs = residual, x, rs, xs
    if xs.shape != out.shape or not _aln.leading_broadcast(rs.shape, xs.shape):
        raise _UseGeneric("the add broadcasts other than over leading dims")
    if ops.arg(ln, 0, "input") is not add:
        raise _UseGeneric("a view between the add and the LayerNorm")
    shape = ops.arg(ln, 1, "normalized_shape")
    if list(shape) != [out.shape[-1]]:
        raise _Refuse("LayerNorm normalizes over more than the last dimension")
    args = (x, residual, ops.arg(ln, 2, "weight"), ops.arg(ln, 3, "bias"), float(ops.arg(ln, 4, "eps", 1e-5)))
    keep_sum = add.name in chain.extra_outputs
    triton = _aln.add_layernorm_impl(dev, int(out.shape[-1]), out.dtype) == "triton"
    label = _aln.describe(dev, int(out.shape[-1]), out.dtype, keep_sum)
    if triton and dev.type == "cpu":
        label += " [Triton interpreter on cpu]"
    elif not triton:
        label += f"; reference composition: no fused kernel on {dev.type}" + (
            "" if dev.type == "cpu" else " for these arguments")
    if not keep_sum:  # nothing else reads the sum (post-norm): it is never written
        return _whole_chain_edit(by_name, chain, fused_add_layer_norm_normed, args, label)
    return _whole_chain_edit(by_name, chain, fused_add_layer_norm, args, label, outputs=[add, ln],
                             tuple_result=True)  # the call returns (sum, normed)


def _plan_linear_siblings(gm, by_name, chain: Chain, dev: torch.device) -> _Edit:
    """Sibling linears → one GEMM over their concatenated weights, split into column views."""
    branches = [by_name[n] for n in chain.compute_nodes]
    if any(ops.aten_name(b) != "linear" for b in branches):
        raise _Refuse("a sibling is not a plain linear")
    x = ops.arg(branches[0], 0, "input")
    weights, biases = [], []
    for b in branches:
        if ops.arg(b, 0, "input") is not x:
            raise _Refuse("the siblings do not read the same input")
        w, bias = ops.arg(b, 1, "weight"), ops.arg(b, 2, "bias")
        weights.append(_constant(gm, w, "weight"))
        biases.append(_constant(gm, bias, "bias") if bias is not None else None)
    try:
        weight, bias, sizes = _sib.concat_weights(weights, biases)
    except ValueError as exc:
        raise _Refuse(str(exc)) from None
    _check_column_views(branches, sizes)
    key = branches[0].name
    tensors = {f"{key}_cat_weight": weight}
    bias_arg = None
    if bias is not None:
        tensors[f"{key}_cat_bias"] = bias
        bias_arg = _NewAttr(f"{key}_cat_bias")
    label = f"one GEMM over {len(sizes)} concatenated weights ({'+'.join(map(str, sizes))} columns), split into views"
    return _Edit(chain, branches, branches, fused_linear_siblings,
                 (x, _NewAttr(f"{key}_cat_weight"), bias_arg, sizes), label, tensors=tensors, tuple_result=True)


def _check_column_views(branches: list[torch.fx.Node], sizes: list[int]) -> None:
    """Refuse when a consumer views a branch output in a way its column slice does not allow.

    Every ``view`` user of a branch is replayed on a meta tensor with the slice's
    strides (row stride ``sum(sizes)``); ``view`` fails there exactly when it
    would fail on the real slice.
    """
    width = sum(sizes)
    for branch, size in zip(branches, sizes):
        val = _val(branch)
        if not isinstance(val, torch.Tensor):
            raise _Refuse(f"{branch.name} has no shape metadata")
        full = torch.empty((*val.shape[:-1], width), device="meta", dtype=val.dtype)
        piece = full[..., :size]
        for user in branch.users:
            if ops.aten_name(user) != "view":
                continue
            try:
                piece.view(ops.arg(user, 1, "size"))
            except RuntimeError:
                raise _Refuse(f"{user.name} views {branch.name} in a way a column slice does not allow "
                              "(it would need a copy)") from None


def _plan_matmul_softmax(gm, by_name, chain: Chain, dev: torch.device) -> _Edit:
    scores = by_name[chain.node_for("scores")]
    softmax = by_name[chain.node_for("softmax")]
    members = {by_name[n] for n in chain.nodes}
    _only_identity_views(by_name, chain)  # refuses training-mode dropout before the second MatMul
    if ops.aten_name(scores) != "matmul":
        raise _UseGeneric(f"{ops.aten_name(scores)} is not a matmul")
    a, b = scores.args[0], scores.args[1]
    # scale
    scale = 1.0
    scale_name = chain.node_for("scale")
    if scale_name is not None:
        node = by_name[scale_name]
        value = _scalar(gm, _other_operand(node, members, allow_scalar=True))
        if value is None:
            raise _Refuse("scale is a tensor, not a constant")
        if ops.kind_of(node) == "div":
            if isinstance(node.args[0], torch.fx.Node) and node.args[0] not in members:
                raise _UseGeneric("scalar divided by the scores")
            value = 1.0 / value
        scale = float(value)
    # mask
    mask = None
    mask_name = chain.node_for("mask")
    if mask_name is not None:
        node = by_name[mask_name]
        _check_alpha(node)
        mask = _other_operand(node, members, allow_scalar=True)
        if not isinstance(mask, torch.fx.Node):
            mask = None  # softmax(s + c) == softmax(s): a constant shift does not change it
    # softmax
    sval = _val(softmax)
    dim = ops.arg(softmax, 1, "dim", -1)
    if not isinstance(sval, torch.Tensor) or dim not in (-1, sval.dim() - 1):
        raise _Refuse(f"softmax over dim {dim}, not the last one")
    if ops.arg(softmax, 2, "dtype", None) not in (None, sval.dtype) and ops.aten_name(softmax) == "softmax":
        raise _UseGeneric("softmax casts its result")
    if ops.aten_name(softmax) not in ("softmax", "_softmax", "_safe_softmax"):
        raise _UseGeneric(f"{ops.aten_name(softmax)} is not a softmax")
    if ops.aten_name(softmax) == "_softmax" and ops.arg(softmax, 2, "half_to_float", False):
        raise _UseGeneric("softmax upcasts half to float")
    context_name = chain.node_for("context")
    if context_name is None:
        args = (a, b, scale, mask)
        label = _matmul_softmax_label(dev, a, b, mask)
        return _whole_chain_edit(by_name, chain, fused_matmul_softmax, args, label)
    ctx = by_name[context_name]
    if ops.aten_name(ctx) != "matmul":
        raise _UseGeneric(f"{ops.aten_name(ctx)} is not a matmul")
    v = ctx.args[1]
    k = _untransposed(b)
    av, bv, vv = _val(a), _val(b), _val(v)
    if not all(isinstance(t, torch.Tensor) for t in (av, bv, vv)) or av.dim() < 2:
        raise _UseGeneric("attention operands without shapes")
    if not (av.shape[:-2] == bv.shape[:-2] == vv.shape[:-2]):
        raise _UseGeneric("attention operands with broadcast batch dims")
    target, first_k = (fused_attention, k) if k is not None else (fused_attention_kt, b)
    if dev.type == "cuda":
        label = "scaled_dot_product_attention (flash / memory-efficient attention, 1 kernel)"
    else:
        label = (f"scaled_dot_product_attention on {dev.type} (PyTorch's CPU attention kernel; "
                 "no GPU fused kernel on cpu)")
    return _whole_chain_edit(by_name, chain, target, (a, first_k, v, scale, mask), label)


def _matmul_softmax_label(dev: torch.device, a: Any, b: Any, mask: Any) -> str:
    """The kernel module's ``describe`` on stand-in tensors of the real shapes (one element of memory each)."""
    def stand_in(node):
        val = _val(node)
        if not isinstance(val, torch.Tensor):
            return None
        return torch.empty_strided(tuple(int(s) for s in val.shape), (0,) * val.dim(), dtype=val.dtype, device=dev)

    try:
        fake_a, fake_b, fake_mask = stand_in(a), stand_in(b), stand_in(mask)
        if fake_a is None or fake_b is None:
            raise RuntimeError("no shapes")
        label = _mms.describe(fake_a, fake_b, fake_mask) if hasattr(_mms, "describe") else None
        impl = _mms.matmul_softmax_impl(fake_a, fake_b, fake_mask)[0]
    except Exception:  # no such device here: say what decides it
        return "triton matmul+scale+mask+softmax where the device runs Triton, else the unfused ops"
    if label is None:
        label = ("triton matmul+scale+mask+softmax (1 kernel)" if impl == "triton"
                 else "matmul, scale, mask, softmax (separate kernels)")
    if impl == "triton" and dev.type == "cpu":
        label += " [Triton interpreter on cpu]"
    elif impl != "triton":
        label += "; reference composition, no fused kernel"
    return label


def _untransposed(b: Any) -> torch.fx.Node | None:
    """``k`` when ``b`` is ``k.transpose(-2, -1)`` (or the equivalent permute), else None."""
    if not isinstance(b, torch.fx.Node) or b.op != "call_function":
        return None
    src = b.args[0] if b.args else None
    sval = _val(src)
    if not isinstance(src, torch.fx.Node) or not isinstance(sval, torch.Tensor) or sval.dim() < 2:
        return None
    nd = sval.dim()
    name = ops.aten_name(b)
    if name == "transpose":
        dims = sorted(d % nd for d in b.args[1:3])
        return src if dims == [nd - 2, nd - 1] else None
    if name == "permute":
        perm = [d % nd for d in b.args[1]]
        return src if perm == list(range(nd - 2)) + [nd - 1, nd - 2] else None
    return None


# ---------------------------------------------------------------------- generic fallback

def _plan_generic(gm, by_name, chain: Chain, dev: torch.device, why: str) -> _Edit:
    """The chain's nodes as a small GraphModule, compiled with torch.compile on first call."""
    members = [by_name[n] for n in _in_graph_order(gm, chain.nodes)]
    outputs = [by_name[n] for n in chain.outputs]
    sub, inputs = _extract(gm, members, outputs, attrs_as_placeholders=True)
    compiles, note = _compile_available(dev)
    label = GENERIC_LABEL + (f" ({why})" if why else "") + note
    key = f"chain_{chain.roles[0][0]}"
    _check_no_outside_users(members, outputs)
    return _Edit(chain, members, outputs, fused_subgraph, (_NewAttr(key), *inputs), label,
                 modules={key: _CompiledChain(sub, compiles)}, tuple_result=len(outputs) > 1)


def _compile_available(dev: torch.device) -> tuple[bool, str]:
    """(compile the generic chains?, label note). ``EXPLORER_GENERIC_COMPILE=0`` turns compiling off."""
    if os.environ.get("EXPLORER_GENERIC_COMPILE", "1").strip().lower() in ("0", "false", "no", "off"):
        return False, "; torch.compile off (EXPLORER_GENERIC_COMPILE=0): the ops run eagerly, one kernel each (not fused)"
    if dev.type == "cuda":
        return True, ""
    if _cpp_compiler() is None:
        return False, "; no C++ compiler on cpu: the ops run eagerly, one kernel each (not fused)"
    return True, " [cpu: inductor C++ kernel]"


@functools.lru_cache(maxsize=1)
def _cpp_compiler() -> str | None:
    for name in ("g++", "c++", "clang++"):
        path = shutil.which(name)
        if path:
            return path
    return None


def _extract(gm: torch.fx.GraphModule, members: list[torch.fx.Node], outputs: list[torch.fx.Node],
             attrs_as_placeholders: bool) -> tuple[torch.fx.GraphModule, list[torch.fx.Node]]:
    """A GraphModule of just ``members`` (in graph order). Returns it and the nodes its placeholders stand for."""
    graph = torch.fx.Graph()
    member_set = set(members)
    env: dict[torch.fx.Node, torch.fx.Node] = {}
    inputs: list[torch.fx.Node] = []
    attrs: dict[str, Any] = {}
    externals: list[torch.fx.Node] = []
    for node in members:
        for src in node.all_input_nodes:
            if src not in member_set and src not in externals:
                externals.append(src)
    for src in externals:  # placeholders first, in first-use order
        if src.op == "get_attr" and not attrs_as_placeholders:
            continue
        ph = graph.placeholder(src.name)
        ph.meta = dict(src.meta)
        env[src] = ph
        inputs.append(src)
    for src in externals:
        if src.op == "get_attr" and not attrs_as_placeholders:
            value = _get_attr(gm, src.target)
            attrs[src.target] = value.detach().clone() if isinstance(value, torch.Tensor) else value
            env[src] = graph.get_attr(src.target)
            env[src].meta = dict(src.meta)
    for node in members:
        env[node] = graph.node_copy(node, lambda n: env[n])
    outs = [env[o] for o in outputs]
    graph.output(outs[0] if len(outs) == 1 else tuple(outs))
    graph.lint()
    sub = torch.fx.GraphModule(attrs if attrs else torch.nn.Module(), graph, class_name="ChainModule")
    return sub, inputs


# ---------------------------------------------------------------------- edit helpers

def _whole_chain_edit(by_name, chain: Chain, target: Callable, args: tuple, label: str,
                      tensors: dict[str, torch.Tensor] | None = None, outputs: list | None = None,
                      tuple_result: bool = False) -> _Edit:
    """An edit removing every node of ``chain``; the fused call's result replaces its last node
    (``outputs``: the nodes whose users get result[i] when the call returns a tuple; None = unused)."""
    members = [by_name[n] for n in chain.nodes]
    if outputs is None:
        outputs = [by_name[_last_compute(chain)]]
        if chain.extra_outputs:
            raise _UseGeneric("the chain has extra outputs this kernel does not write")
    _check_no_outside_users(members, [o for o in outputs if o is not None])
    return _Edit(chain, members, outputs, target, args, label, tensors=dict(tensors or {}),
                 tuple_result=tuple_result)


def _check_no_outside_users(remove: list[torch.fx.Node], outputs: list[torch.fx.Node]) -> None:
    """Nodes being removed may be read outside the edit only through ``outputs`` (or by ignorable asserts)."""
    removing = set(remove)
    for node in remove:
        if node in outputs:
            continue
        for user in node.users:
            if user not in removing and not ops.is_ignored(user):
                raise _Refuse(f"{node.name} is also used by {user.name} outside the chain")


def _apply_edit(gm: torch.fx.GraphModule, edit: _Edit, replaced: dict[torch.fx.Node, torch.fx.Node]) -> None:
    graph = gm.graph
    attr_names: dict[str, str] = {}
    for key, tensor in edit.tensors.items():
        attr_names[key] = _unique_attr(gm, f"_fused_{key}")
        gm.register_buffer(attr_names[key], tensor)
    for key, module in edit.modules.items():
        attr_names[key] = _unique_attr(gm, f"_{key}")
        gm.add_module(attr_names[key], module)

    def resolve(a):
        while isinstance(a, torch.fx.Node) and a in replaced:
            a = replaced[a]
        return a

    args = torch.fx.node.map_aggregate(edit.args, resolve)
    position = {n: i for i, n in enumerate(graph.nodes)}
    inputs = [a for a in _flatten(args) if isinstance(a, torch.fx.Node)]
    removing = set(edit.remove)
    first_member = min(edit.remove, key=position.__getitem__)
    anchor = max(inputs, key=position.__getitem__) if inputs else None
    outside_users = [u for o in edit.outputs if o is not None for u in o.users if u not in removing]
    if anchor is not None and outside_users and position[anchor] >= min(position[u] for u in outside_users):
        raise RuntimeError("an output of the chain is used before all of its inputs exist")
    created: list[torch.fx.Node] = []
    try:
        # after the last input (inserting_before its successor keeps the new nodes in creation order)
        ctx = graph.inserting_before(anchor.next) if anchor is not None and position[anchor] > position[first_member] \
            else graph.inserting_before(first_member)
        with ctx:
            getters = {}
            for key in list(edit.tensors) + list(edit.modules):
                getters[key] = graph.get_attr(attr_names[key])
                created.append(getters[key])
                if key in edit.tensors:
                    getters[key].meta["val"] = edit.tensors[key]
            final_args = torch.fx.node.map_aggregate(
                args, lambda a: getters[a.key] if isinstance(a, _NewAttr) else a)
            call = graph.call_function(edit.target, tuple(final_args))
            created.append(call)
            call.meta["fused_chain"] = edit.chain.id
            call.meta["fused_pattern"] = edit.chain.pattern
            if not edit.tuple_result:
                results = [call]
                _copy_val(call, edit.outputs[0])
            else:
                results = []
                prev = call
                for i, out in enumerate(edit.outputs):
                    with graph.inserting_after(prev):
                        item = graph.call_function(operator.getitem, (call, i))
                    created.append(item)
                    results.append(item)
                    prev = item
                    if out is not None:
                        _copy_val(item, out)
    except Exception:
        for node in reversed(created):
            if not node.users:
                graph.erase_node(node)
        raise
    # reroute (the point of no return), then erase the chain's nodes
    edit.read_attrs = {a.target for n in edit.remove for a in n.all_input_nodes if a.op == "get_attr"}
    for out, new in zip(edit.outputs, results):
        if out is None:
            continue
        out.replace_all_uses_with(new, delete_user_cb=lambda u: u not in removing)
        replaced[out] = new
    for node in sorted(edit.remove, key=position.__getitem__, reverse=True):
        for user in list(node.users):
            if user not in removing and ops.is_ignored(user) and not user.users:
                graph.erase_node(user)
        graph.erase_node(node)


def _copy_val(new: torch.fx.Node, old: torch.fx.Node) -> None:
    if "val" in old.meta:
        new.meta["val"] = old.meta["val"]
    if "tensor_meta" in old.meta:
        new.meta["tensor_meta"] = old.meta["tensor_meta"]


def _drop_unused_tensors(gm: torch.fx.GraphModule, edits: list[_Edit]) -> None:
    """Delete the weights the rewrite made dead (the unfolded conv weight, BN statistics) from the copy."""
    used = {n.target for n in gm.graph.nodes if n.op == "get_attr"}
    candidates = {t for e in edits for t in e.read_attrs}
    for target in candidates - used:
        owner_path, _, leaf = str(target).rpartition(".")
        try:
            owner = gm.get_submodule(owner_path) if owner_path else gm
        except AttributeError:
            continue
        if leaf in owner._parameters:
            del owner._parameters[leaf]
        elif leaf in owner._buffers:
            del owner._buffers[leaf]


# ---------------------------------------------------------------------- small readers

def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return (text[0] if text else type(exc).__name__)[:300]


def _device(device: str | torch.device) -> torch.device:
    if str(device) == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def _not_fused_note(dev: torch.device, what: str) -> str:
    if dev.type == "cpu":
        return f"; cpu: no fused kernel for {what}, the ops run one after another"
    return ""


def _val(node: Any) -> Any:
    return node.meta.get("val") if isinstance(node, torch.fx.Node) else None


def _dtype(node: torch.fx.Node) -> torch.dtype:
    vals = ops.tensor_vals(node.meta.get("val"))
    return vals[0].dtype if vals else torch.float32


def _get_attr(gm: torch.nn.Module, target: str) -> Any:
    return ops.attr_value(gm, target)


def _constant(gm, node: Any, what: str) -> torch.Tensor | None:
    """The tensor behind a ``get_attr`` node (None stays None); refuses anything computed."""
    if node is None:
        return None
    if isinstance(node, torch.fx.Node) and node.op == "get_attr":
        value = _get_attr(gm, node.target)
        if isinstance(value, torch.Tensor):
            return value.detach()
    raise _Refuse(f"{what} is computed in the graph, not a constant: cannot fold")


def _scalar(gm, operand: Any) -> float | None:
    if isinstance(operand, (int, float)) and not isinstance(operand, bool):
        return float(operand)
    if isinstance(operand, torch.fx.Node) and operand.op == "get_attr":
        value = _get_attr(gm, operand.target)
        if isinstance(value, torch.Tensor) and value.numel() == 1:
            return float(value.item())
    return None


def _other_operand(node: torch.fx.Node, members: set, allow_scalar: bool = False) -> Any:
    """The operand of a binary op that does not come from the chain."""
    a, b = node.args[0], node.args[1]
    inside = [x in members for x in (a, b)]
    if inside == [True, False]:
        other = b
    elif inside == [False, True]:
        other = a
    else:
        raise _UseGeneric(f"{node.name}: cannot tell the chain operand from the other one")
    if not allow_scalar and not isinstance(other, torch.fx.Node):
        raise _UseGeneric(f"{node.name} adds a constant")
    return other


def _check_alpha(node: torch.fx.Node) -> None:
    if ops.arg(node, 2, "alpha", 1) != 1:
        raise _UseGeneric(f"{node.name} has alpha != 1")


def _act_name(node: torch.fx.Node) -> str:
    kind = ops.kind_of(node)
    if kind == "gelu":
        approx = ops.arg(node, 1, "approximate", "none")
        return "gelu_tanh" if approx == "tanh" else "gelu"
    return kind


_IDENTITY_VIEWS = ("dropout", "dropout_", "feature_dropout", "alias", "detach", "getitem")


def _through_identity(node: Any, target: torch.fx.Node) -> bool:
    while isinstance(node, torch.fx.Node) and node is not target and ops.aten_name(node) in _IDENTITY_VIEWS:
        node = node.args[0]
    return node is target


def _only_identity_views(by_name, chain: Chain) -> None:
    """Specialised kernels skip the chain's views: only identities (eval dropout, BN getitem 0) are allowed."""
    compute = set(chain.compute_nodes)
    for name in chain.nodes:
        if name in compute:
            continue
        node = by_name[name]
        aname = ops.aten_name(node)
        if aname.startswith("dropout") or aname == "feature_dropout":
            if ops.is_training_dropout(node):
                raise _Refuse("dropout in training mode inside the chain")
            continue
        if aname == "getitem" and node.args[1] == 0:
            continue
        if aname in ("alias", "detach"):
            continue
        raise _UseGeneric(f"a {aname} inside the chain")


def _check_inplace(gm, by_name, chain: Chain) -> None:
    """Refuse when an in-place op of the chain mutates a tensor that is read outside the chain later."""
    members = {by_name[n] for n in chain.nodes}
    position = None
    for name in chain.compute_nodes:
        node = by_name[name]
        if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload):
            continue
        if not node.target._schema.is_mutable or not node.args:
            continue
        victim = node.args[0]
        if not isinstance(victim, torch.fx.Node) or victim in members:
            continue
        if position is None:
            position = {n: i for i, n in enumerate(gm.graph.nodes)}
        later = [u for u in victim.users if u not in members and position[u] > position[node]]
        if later:
            raise _Refuse(f"{node.name} mutates {victim.name} in place, which {later[0].name} reads later")


def _last_compute(chain: Chain) -> str:
    return chain.roles[-1][0]


def _in_graph_order(gm: torch.fx.GraphModule, names: Iterable[str]) -> list[str]:
    wanted = set(names)
    return [n.name for n in gm.graph.nodes if n.name in wanted]


def _unique_attr(gm: torch.nn.Module, base: str) -> str:
    name = base.replace(".", "_")
    i = 0
    candidate = name
    while hasattr(gm, candidate):
        i += 1
        candidate = f"{name}_{i}"
    return candidate


def _flatten(value: Any) -> list:
    if isinstance(value, (list, tuple)):
        return [x for v in value for x in _flatten(v)]
    if isinstance(value, dict):
        return [x for v in value.values() for x in _flatten(v)]
    return [value]


def _mask_operands(chain: Chain, by_name) -> set[str]:
    """Names of the nodes a chain adds as an attention mask (example inputs make them zeros)."""
    name = chain.node_for("mask")
    if name is None:
        return set()
    node = by_name[name]
    members = {by_name[n] for n in chain.nodes}
    return {a.name for a in node.args[:2] if isinstance(a, torch.fx.Node) and a not in members}


def _example(node: torch.fx.Node, gen: torch.Generator, is_mask: bool) -> torch.Tensor:
    val = _val(node)
    if not isinstance(val, torch.Tensor):
        raise RuntimeError(f"input {node.name} has no tensor shape (meta['val'])")
    shape, dtype = tuple(int(s) for s in val.shape), val.dtype
    if dtype == torch.bool:
        return torch.ones(shape, dtype=dtype)
    if not dtype.is_floating_point:
        return torch.zeros(shape, dtype=dtype)
    if is_mask:
        return torch.zeros(shape, dtype=dtype)
    strides = tuple(int(s) for s in val.stride()) if val.layout == torch.strided else None
    if strides is None or val.is_contiguous() or 0 in strides or 0 in shape:
        return torch.randn(shape, generator=gen, dtype=torch.float32).to(dtype)
    # Same strides as in the model (a transposed K, a channels_last map): kernels pick
    # their paths by layout, so a micro-benchmark on contiguous copies would time another path.
    storage = 1 + sum((n - 1) * st for n, st in zip(shape, strides))
    base = torch.randn(storage, generator=gen, dtype=torch.float32).to(dtype)
    return base.as_strided(shape, strides)


_PLANNERS: dict[str, Callable[..., _Edit]] = {
    "conv_bn_act": _plan_conv,
    "conv_bn_add_act": _plan_conv,
    "conv_add_act": _plan_conv,
    "conv_act": _plan_conv,
    "linear_act": _plan_linear_act,
    "linear_siblings": _plan_linear_siblings,
    "add_layer_norm": _plan_add_layer_norm,
    "matmul_softmax": _plan_matmul_softmax,
}
