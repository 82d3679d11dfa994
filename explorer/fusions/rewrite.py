"""Apply a fusion plan to a graph: a NEW fx GraphModule where each accepted chain is one call.

::

    original (never mutated)                 fused copy
    x ─► conv2d ─► batch_norm ─► relu_       x ─► fused_conv_bn_act(x, w', b', ..., "relu")
         (w)        (mean, var, γ, β)                       (w', b' = BN folded into w, b: new buffers)

    x, r ─► add ─► layer_norm ─► y           x, r ─► fused_add_layer_norm ─► (sum, y)
             └──► (sum used later)                         getitem 0 ─► (sum used later)
                                                           getitem 1 ─► y

Each chain of a ``Detection`` that the ``Plan`` accepts is rewritten in two
steps. First every edit is *planned* on the copied graph without changing it:
the chain's pattern's ``rewrite`` (in its family module) returns an ``Edit``.
Then the edits are *applied* one after another (insert the fused call after
its last input, reroute the users of the chain's outputs, erase the chain's
nodes). A chain whose planning or application fails is recorded as
``failed`` (or ``refused`` when a guard says no) with a one-line reason, and
the other chains go on. The plan's kernel choice "inductor", a pattern
without a rewrite of its own, and a rewrite that raises ``UseGeneric`` take the
generic path (``explorer.fusions.generic``).

``level`` follows the staged table (``LEVELS``): "none" copies, "conv_bn" only
folds BatchNorm, "activation" also fuses the conv and GEMM epilogues, "all"
applies every accepted chain.

What the fused model is made for is one ``Target(device, dtype, memory_format)``
(``explorer.vocab``). Each chain's kernel is chosen once, by its family's
selection, for that target: its dtype is the one the prepared graph runs in
(``RewriteContext.run_dtype``), not the capture's float32. The fused call records
the ``Choice`` (``node.meta["fused_choice"]``, for ``node.meta["fused_for"]``:
the device type, torch dtype and memory format), the chain's ``AppliedChain`` carries
its impl and label (the launch counts read those: ``explorer.launches``), and the
lowering of a lean graph prepared for the same target reads it (``edit.planned``)
instead of deciding again; the families whose fused calls would otherwise decide at
run time (Add+LayerNorm, the attention scores kernel) are handed the recorded impl
by their lowering (``edit.bind_choice``). The memory format is part of the target:
in nchw the graph runs with the capture's layouts, so the conv selection reads each
input's layout from the graph (1×1 and depthwise convs over a contiguous input take
the epilogue pass, not a kernel that would fall back at run time); in channels_last
a permute can still hand a conv a contiguous tensor, so the layout stays a run-time
question there.
"""

from __future__ import annotations

import copy
import dataclasses
import operator
from typing import Any

import torch
import torch.fx

from explorer.errors import PlanError
from explorer.messages import PLAN
from explorer.fusions import BY_NAME, generic
from explorer.fusions.base import STAGES, WORDS, Chain, Detection
from explorer.fusions.edit import Edit, NewAttr, Refuse, RewriteContext, UseGeneric, extract_subgraph, in_graph_order
from explorer.fusions.plan import Plan
from explorer.graph import aten
from explorer.vocab import Target
from explorer.words import Message

LEVELS = STAGES
#: The torch dtype of each dtype name of the vocabulary (``explorer.vocab.DTYPE_NAMES``, and the reference's fp64).
TORCH_DTYPES: dict[str, torch.dtype] = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16,
                                        "fp64": torch.float64}
UNFUSED_LABEL = WORDS("unfused")


@dataclasses.dataclass(frozen=True)
class AppliedChain:
    """What happened to one accepted chain: ``status`` is fused | failed | refused.

    ``implementation`` is the label of what runs; ``impl`` its short name and
    ``fused_kernel`` whether that is fewer kernels than the unfused ops (False:
    e.g. no fused kernel for it on this device). ``kernel`` is the plan's choice.
    """

    chain_id: str
    pattern: str
    implementation: str
    status: str
    reason: str = ""
    kernel: str = "auto"
    impl: str = ""
    fused_kernel: bool = False

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class FusedModel:
    """The fused copy of a model's graph and the fate of every accepted chain."""

    gm: torch.fx.GraphModule
    applied: tuple[AppliedChain, ...]

    def by_id(self) -> dict[str, AppliedChain]:
        return {a.chain_id: a for a in self.applied}


# ====================================================================== public API

def as_target(target: Target | str, memory_format: str = "nchw") -> Target:
    """``target`` with its device resolved (``auto``: cuda where torch sees one, else cpu); a bare device name
    is that device in fp32 (the capture's dtype) and ``memory_format``."""
    if not isinstance(target, Target):
        target = Target(str(target), "fp32", memory_format)
    return target.on(str(_device(target.device))) if target.device == "auto" else target


def apply_plan(gm: torch.fx.GraphModule, detection: Detection, plan: Plan, target: Target | str = "cpu",
               level: str = "all") -> FusedModel:
    """Return a fused copy of ``gm`` with the plan's accepted chains rewritten.

    ``target`` chooses the implementations (which kernel runs where, in which dtype) and their labels, once
    per chain (module docstring); a device name alone is that device in fp32 with the plan's memory format.
    The returned module is on ``gm``'s device. ``level`` is one of ``LEVELS``. Raises ``PlanError`` for a
    plan made for another model or an unknown level. Never mutates ``gm``.
    """
    if level not in LEVELS:
        raise PlanError(PLAN("unknown_level", level=level, choices=", ".join(LEVELS)))
    plan.check_for(detection)
    fused = copy.deepcopy(gm)
    work = [(c, _mode(c, level), plan.kernel_for(c.id)) for c in detection.accepted_chains(plan.accepted)]
    return FusedModel(gm=fused, applied=_rewrite(fused, work, as_target(target, plan.memory_format), level))


def chain_module(gm: torch.fx.GraphModule, detection: Detection, chain_id: str, target: Target | str = "cpu",
                 kernel: str = "auto") -> tuple[torch.fx.GraphModule, torch.fx.GraphModule, tuple[torch.Tensor, ...]]:
    """The chain alone: ``(unfused module, fused module, example inputs)`` for a micro-benchmark.

    The unfused module has one placeholder per external tensor input of the
    chain (in graph order), its weights as ``get_attr`` and returns the chain's
    outputs. The fused module is the same module with the chain applied
    (``apply_plan`` semantics at level "all", with the plan's ``kernel`` choice).
    Example inputs are seeded random tensors at the real shapes, dtypes and
    strides (additive masks are zeros). Everything is on the ``target``'s device (the kernel chosen for the
    target, as ``apply_plan``). Raises ``KeyError`` for an unknown chain and ``RuntimeError`` when it cannot
    be fused.
    """
    chain = detection.chain(chain_id)
    target = as_target(target)
    dev = torch.device(target.device)
    by_name = {n.name: n for n in gm.graph.nodes}
    names = list(chain.nodes)
    outputs = [by_name[n] for n in chain.outputs]
    alone = BY_NAME[chain.pattern].alone
    if alone is not None:  # a fold into ops outside the chain: they come along, and their outputs are the chain's
        extra, outputs = alone(gm, chain)
        names += [n.name for n in extra]
    members = [by_name[n] for n in in_graph_order(gm, names)]
    unfused, inputs = extract_subgraph(gm, members, outputs, attrs_as_placeholders=False)
    unfused = unfused.to(dev)
    fused = copy.deepcopy(unfused)
    applied = _rewrite(fused, [(chain, "full", kernel)], target, "all")
    if applied[0].status != "fused":
        raise RuntimeError(f"{chain_id} could not be fused: {applied[0].reason}")
    mask_inputs = _mask_operands(chain, by_name)
    gen = torch.Generator().manual_seed(0)
    examples = tuple(_example(n, gen, n.name in mask_inputs).to(dev) for n in inputs)
    return unfused, fused, examples


# ====================================================================== levels

def _mode(chain: Chain, level: str) -> str | None:
    """How much of ``chain`` a level applies: "full", "fold" (BatchNorm only) or None."""
    pattern = BY_NAME[chain.pattern]
    if STAGES.index(pattern.stage) <= STAGES.index(level):
        return "full"
    if (pattern.fold is not None and STAGES.index(level) >= 1
            and (chain.node_for("bn") is not None or chain.node_for("gamma") is not None)):
        return "fold"   # a BatchNorm folded into its conv, or RMSNorm's γ into its readers
    return None


def _level_reason(level: str) -> str:
    return {
        "none": WORDS("level_none"), "conv_bn": WORDS("level_conv_bn"), "activation": WORDS("level_activation"),
    }.get(level, "")


# ====================================================================== planning and applying

def _plan_chain(ctx: RewriteContext, chain: Chain, mode: str, kernel: str) -> Edit:
    """The edit for one chain. A level's "fold" mode folds BatchNorm whatever the kernel choice;
    otherwise the plan's kernel choice (``KERNEL_CHOICES``) picks the implementation."""
    missing = [n for n in chain.nodes if n not in ctx.by_name]
    if missing:
        raise RuntimeError(PLAN("nodes_missing", nodes=", ".join(missing[:3])))
    _check_inplace(ctx, chain)
    pattern = BY_NAME[chain.pattern]
    if mode == "fold":
        return pattern.fold(ctx, chain)
    if kernel not in pattern.kernels:
        raise Refuse(WORDS("not_a_choice", kernel=kernel, pattern=chain.pattern))
    if kernel == "inductor":
        return generic.rewrite(ctx, chain, kernel, generic.WORDS("choice_inductor"))
    if pattern.rewrite is None:
        return generic.rewrite(ctx, chain, kernel)
    try:
        return pattern.rewrite(ctx, chain, kernel)
    except UseGeneric as why:
        return generic.rewrite(ctx, chain, kernel, why.args[0] if why.args else "")


def _rewrite(gm: torch.fx.GraphModule, work: list[tuple[Chain, str | None, str]], target: Target,
             level: str) -> tuple[AppliedChain, ...]:
    """Plan every edit (chain, level mode, kernel choice) for ``target`` (its device resolved), then apply
    them in order; clean up and recompile."""
    ctx = RewriteContext(gm, {n.name: n for n in gm.graph.nodes}, torch.device(target.device),
                         TORCH_DTYPES[target.dtype], target)
    results: dict[str, AppliedChain] = {}
    edits: list[tuple[Edit, str, str]] = []
    replaced: dict[torch.fx.Node, torch.fx.Node] = {}
    read_attrs: set[str] = set()
    made_for = (ctx.device.type, ctx.dtype, target.memory_format)
    for chain, mode, kernel in work:
        def unfused(status: str, reason: str) -> AppliedChain:
            return AppliedChain(chain.id, chain.pattern, UNFUSED_LABEL, status, reason, kernel)

        if mode is None:
            results[chain.id] = unfused("refused", _level_reason(level))
            continue
        try:
            e = _plan_chain(ctx, chain, mode, kernel)
        except Refuse as why:
            results[chain.id] = unfused("refused", _one_line(why))
            continue
        except Exception as exc:  # one chain's failure must not stop the others
            results[chain.id] = unfused("failed", WORDS("planning_failed", reason=_one_line(exc)))
            continue
        if not e.weights:
            edits.append((e, mode, kernel))
            continue
        # A fold into ops outside the chain: applied now, so that the chains planned after it (graph order:
        # its readers come later) read the folded weights; a failure restores them.
        previous = _swap_weights(gm, e.weights)
        try:
            read_attrs |= _apply_edit(gm, e, replaced, made_for)
        except Exception as exc:
            _swap_weights(gm, previous)
            results[chain.id] = unfused("failed", f"rewrite failed: {_one_line(exc)}")
            continue
        results[chain.id] = AppliedChain(chain.id, chain.pattern, e.choice.label, "fused", "", kernel,
                                         e.choice.impl, e.choice.fused)
    for e, mode, kernel in edits:
        chain = e.chain
        try:
            read_attrs |= _apply_edit(gm, e, replaced, made_for)
        except Exception as exc:
            results[chain.id] = AppliedChain(chain.id, chain.pattern, UNFUSED_LABEL, "failed",
                                             PLAN("rewrite_failed", reason=_one_line(exc)), kernel)
            continue
        reason = _level_reason(level) if mode == "fold" and BY_NAME[chain.pattern].stage != "conv_bn" else ""
        results[chain.id] = AppliedChain(chain.id, chain.pattern, e.choice.label, "fused", reason, kernel,
                                         e.choice.impl, e.choice.fused)
    ordered = tuple(results[c.id] for c, _, _ in work)
    if not any(r.status == "fused" for r in ordered):
        return ordered  # nothing changed: the copy stays an exact copy
    gm.graph.eliminate_dead_code()
    _drop_unused_tensors(gm, read_attrs)
    gm.graph.lint()
    gm.recompile()
    return ordered


def _apply_edit(gm: torch.fx.GraphModule, e: Edit, replaced: dict[torch.fx.Node, torch.fx.Node],
                made_for: tuple[str, torch.dtype, str] | None = None) -> set[str]:
    """Insert ``e``'s fused call, reroute its outputs' users and erase the chain's nodes.

    ``replaced`` maps nodes earlier edits removed to what replaced them (an
    argument of this edit may be one); ``made_for`` (device type, torch dtype, memory format) is the
    target the edit's choice was made for, recorded with it on the call. Returns the
    ``get_attr`` targets the removed nodes read (candidates for ``_drop_unused_tensors``).
    """
    graph = gm.graph
    attr_names: dict[str, str] = {}
    for key, tensor in e.tensors.items():
        attr_names[key] = _unique_attr(gm, f"_fused_{key}")
        gm.register_buffer(attr_names[key], tensor)
    for key, module in e.modules.items():
        attr_names[key] = _unique_attr(gm, f"_{key}")
        gm.add_module(attr_names[key], module)

    def resolve(a):
        while isinstance(a, torch.fx.Node) and a in replaced:
            a = replaced[a]
        return a

    args = torch.fx.node.map_aggregate(e.args, resolve)
    position = {n: i for i, n in enumerate(graph.nodes)}
    inputs = [a for a in _flatten(args) if isinstance(a, torch.fx.Node)]
    removing = set(e.remove)
    first_member = min(e.remove, key=position.__getitem__)
    anchor = max(inputs, key=position.__getitem__) if inputs else None
    outside_users = [u for o in e.outputs if o is not None for u in o.users if u not in removing]
    if anchor is not None and outside_users and position[anchor] >= min(position[u] for u in outside_users):
        raise RuntimeError("an output of the chain is used before all of its inputs exist")
    created: list[torch.fx.Node] = []
    try:
        # after the last input (inserting_before its successor keeps the new nodes in creation order)
        ctx = graph.inserting_before(anchor.next) if anchor is not None and position[anchor] > position[first_member] \
            else graph.inserting_before(first_member)
        with ctx:
            getters = {}
            for key in list(e.tensors) + list(e.modules):
                getters[key] = graph.get_attr(attr_names[key])
                created.append(getters[key])
                if key in e.tensors:
                    getters[key].meta["val"] = e.tensors[key]
            final_args = torch.fx.node.map_aggregate(
                args, lambda a: getters[a.key] if isinstance(a, NewAttr) else a)
            call = graph.call_function(e.target, tuple(final_args))
            created.append(call)
            call.meta["fused_chain"] = e.chain.id
            call.meta["fused_pattern"] = e.chain.pattern
            call.meta["fused_choice"] = e.choice          # the one decision: the lowering reads it (edit.planned)
            call.meta["fused_for"] = made_for
            if e.parts:
                call.meta["fused_parts"] = dict(e.parts)   # its parts' choices (edit.hand_part)
            if not e.tuple_result:
                results = [call]
                _copy_val(call, e.outputs[0])
            else:
                results = []
                prev = call
                for i, out in enumerate(e.outputs):
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
    read = {a.target for n in e.remove for a in n.all_input_nodes if a.op == "get_attr"}
    for out, new in zip(e.outputs, results):
        if out is None:
            continue
        out.replace_all_uses_with(new, delete_user_cb=lambda u: u not in removing)
        replaced[out] = new
    for node in sorted(e.remove, key=position.__getitem__, reverse=True):
        for user in list(node.users):
            if user not in removing and aten.is_ignored(user) and not user.users:
                graph.erase_node(user)
        graph.erase_node(node)
    return read


def _swap_weights(gm: torch.fx.GraphModule, weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Give the ``get_attr`` targets in ``weights`` those values (a parameter stays a parameter, with its
    ``requires_grad``); returns the values they held, to restore them."""
    previous = {}
    for target, value in weights.items():
        owner, leaf = aten.attr_owner(gm, target)
        old = getattr(owner, leaf)
        previous[target] = old
        if isinstance(owner, torch.nn.Module) and leaf in owner._parameters:
            owner._parameters[leaf] = torch.nn.Parameter(value, requires_grad=old.requires_grad)
        elif isinstance(owner, torch.nn.Module) and leaf in owner._buffers:
            owner._buffers[leaf] = value
        else:
            setattr(owner, leaf, value)
    return previous


def _copy_val(new: torch.fx.Node, old: torch.fx.Node) -> None:
    if "val" in old.meta:
        new.meta["val"] = old.meta["val"]
    if "tensor_meta" in old.meta:
        new.meta["tensor_meta"] = old.meta["tensor_meta"]


def _drop_unused_tensors(gm: torch.fx.GraphModule, candidates: set[str]) -> None:
    """Delete the weights the rewrite made dead (the unfolded conv weight, BN statistics) from the copy."""
    used = {n.target for n in gm.graph.nodes if n.op == "get_attr"}
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


def _check_inplace(ctx: RewriteContext, chain: Chain) -> None:
    """Refuse when an in-place op of the chain mutates a tensor that is read outside the chain later."""
    members = set(ctx.members(chain))
    position = None
    for name in chain.compute_nodes:
        node = ctx.by_name[name]
        if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload):
            continue
        if not node.target._schema.is_mutable or not node.args:
            continue
        victim = node.args[0]
        if not isinstance(victim, torch.fx.Node) or victim in members:
            continue
        if position is None:
            position = {n: i for i, n in enumerate(ctx.gm.graph.nodes)}
        later = [u for u in victim.users if u not in members and position[u] > position[node]]
        if later:
            raise Refuse(WORDS("mutates", node=node.name, victim=victim.name, reader=later[0].name))


# ---------------------------------------------------------------------- small helpers

def _one_line(exc: BaseException) -> str:
    """The exception's message on one line: a family's ``Message`` as it is (it keeps its id), else its first line."""
    if exc.args and isinstance(exc.args[0], Message) and "\n" not in exc.args[0]:
        return exc.args[0]
    text = str(exc).strip().splitlines()
    return (text[0] if text else type(exc).__name__)[:300]


def _device(device: str | torch.device) -> torch.device:
    if str(device) == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


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
    val = aten.node_val(node)
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
