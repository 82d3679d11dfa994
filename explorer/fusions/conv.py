"""The convolution family: BatchNorm folding and the conv epilogue (bias, residual add, activation).

::

    conv_bn_add_act                      conv_bn_act             conv_bn
    x ─► conv(w) ─► bn ─► + z ─► act     x ─► conv ─► bn ─► act  x ─► conv ─► bn
                          ▲ residual
    ==>  x ─► conv(w', b') [+ z] [act]   one call: BatchNorm folded into (w', b'),
                                         bias, residual and activation in the epilogue

    conv_add_act / conv_act: the same without a BatchNorm (already folded, as
    ONNX exporters do).

Folding (``fold_conv_bn``) is pure arithmetic done once, in float64::

    s  = γ / sqrt(var + eps)          (one scale per output channel)
    w' = w · s                        (broadcast over in-channels and kernel)
    b' = (b − mean) · s + β           (b = 0 when the conv has no bias)

It is valid only for inference: in training BatchNorm normalises with the
statistics of the current batch, so there is no fixed (mean, var) to fold.

The epilogue's one kernel selection, ``select_conv_epilogue``, decides for a
device, dtype and shapes: on CUDA, for ReLU, cuDNN runs conv + bias (+ z) +
ReLU as one call (``torch.cudnn_convolution_relu`` /
``torch.cudnn_convolution_add_relu``); anything else runs the convolution
(bias fused by the library) and then the add and the activation in place. The
runtime call, the report's label and the lean lowering all ask it.

Works for conv1d/2d/3d, grouped and depthwise convolutions (the output channel
is always dim 0 of the weight); not for transposed convolutions.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence

import torch
import torch.fx

from explorer.fusions import edit
from explorer.fusions.base import PAYS_CAVEAT, PRECISION_CAVEAT, Choice, Pattern, Step
from explorer.fusions.edit import NewAttr, Refuse, RewriteContext, UseGeneric
from explorer.fusions.epilogue import EPILOGUE_TOLERANCES, apply_activation, apply_activation_, check, in_place_node
from explorer.graph import aten
from explorer.vocab import ACTIVATIONS

CONV_ACTIVATIONS = ("relu", "relu6", "silu", "gelu", "hardswish", "none")
_CUDNN_DTYPES = (torch.float32, torch.float16, torch.bfloat16)

TOLERANCES = EPILOGUE_TOLERANCES  # see explorer.fusions.epilogue for the error model
#: The BatchNorm fold in float64 is exact algebra up to float64 rounding.
FOLD_TOLERANCE_F64 = 1e-10

TRAINING_REFUSAL = ("BatchNorm in training mode: its statistics change every step, "
                    "folding is valid only for inference")
NO_RUNNING_STATS_REFUSAL = ("BatchNorm without running statistics (track_running_stats=False) normalises "
                            "with batch statistics even in eval mode: there is nothing fixed to fold")
FOLD_CAVEAT = ("BatchNorm folding is valid only for inference: in training the batch statistics "
               "change every step, so the folded weights would be wrong.")
FORMULA = ("W' = W * gamma / sqrt(var + eps)  (per output channel);  "
           "b' = (b - mean) * gamma / sqrt(var + eps) + beta")


# ====================================================================== the arithmetic

def check_foldable(training: bool, has_running_stats: bool = True) -> str | None:
    """Return ``None`` when a BatchNorm can be folded, else a readable reason."""
    if training:
        return TRAINING_REFUSAL
    if not has_running_stats:
        return NO_RUNNING_STATS_REFUSAL
    return None


def fold_conv_bn(conv_weight: torch.Tensor, conv_bias: torch.Tensor | None, bn_mean: torch.Tensor,
                 bn_var: torch.Tensor, bn_weight: torch.Tensor | None, bn_bias: torch.Tensor | None,
                 eps: float, *, training: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Return ``(weight, bias)`` of the conv that equals conv → BatchNorm(eval).

    Takes the conv weight ``(C_out, C_in/groups, *kernel)``, its bias ``(C_out,)``
    or None, and the BatchNorm's running mean/var, affine weight γ and bias β
    (None when ``affine=False``) and eps. Computes in float64 and returns
    tensors in the conv weight's dtype and device; the bias is always returned
    (a conv without bias gains one). The inputs are not modified.
    Raises ``Refuse`` when ``training`` is true or the statistics are missing.
    """
    reason = check_foldable(training, has_running_stats=bn_mean is not None and bn_var is not None)
    if reason:
        raise Refuse(reason)
    out_channels = conv_weight.shape[0]
    for name, t in (("bn_mean", bn_mean), ("bn_var", bn_var), ("bn_weight", bn_weight),
                    ("bn_bias", bn_bias), ("conv_bias", conv_bias)):
        if t is not None and t.numel() != out_channels:
            raise ValueError(f"{name} has {t.numel()} elements, the conv has {out_channels} output channels")

    f64 = dict(dtype=torch.float64, device=conv_weight.device)
    w = conv_weight.detach().to(**f64)                                     # (C_out, C_in/g, *k)
    b = conv_bias.detach().to(**f64) if conv_bias is not None else torch.zeros(out_channels, **f64)
    mean = bn_mean.detach().to(**f64).reshape(-1)                          # (C_out,)
    var = bn_var.detach().to(**f64).reshape(-1)
    gamma = bn_weight.detach().to(**f64).reshape(-1) if bn_weight is not None else torch.ones(out_channels, **f64)
    beta = bn_bias.detach().to(**f64).reshape(-1) if bn_bias is not None else torch.zeros(out_channels, **f64)

    scale = gamma / torch.sqrt(var + eps)                                  # (C_out,)
    new_w = w * scale.reshape((-1,) + (1,) * (w.dim() - 1))
    new_b = (b - mean) * scale + beta
    return new_w.to(conv_weight.dtype), new_b.to(conv_weight.dtype)


def conv_nd(x, weight, bias, stride=1, padding=0, dilation=1, groups: int = 1) -> torch.Tensor:
    """``conv1d``/``conv2d``/``conv3d`` chosen by the weight's rank."""
    conv = {3: torch.nn.functional.conv1d, 4: torch.nn.functional.conv2d,
            5: torch.nn.functional.conv3d}.get(weight.dim())
    if conv is None:
        raise ValueError(f"conv weight must have 3, 4 or 5 dims, got {tuple(weight.shape)}")
    return conv(x, weight, bias, stride, padding, dilation, groups)


def conv_bn_reference(x, conv_weight, conv_bias, bn_mean, bn_var, bn_weight, bn_bias, eps,
                      stride=1, padding=0, dilation=1, groups: int = 1) -> torch.Tensor:
    """The unfused computation: convolution, then BatchNorm in eval mode."""
    y = conv_nd(x, conv_weight, conv_bias, stride, padding, dilation, groups)
    return torch.nn.functional.batch_norm(y, bn_mean, bn_var, bn_weight, bn_bias, training=False, eps=eps)


def conv_epilogue_reference(x, weight, bias, z=None, stride=1, padding=0, dilation=1, groups=1, act="relu"):
    """Unfused: conv (with bias), then ``+ z`` (when given), then the activation, each out of place."""
    check(act, CONV_ACTIVATIONS)
    y = conv_nd(x, weight, bias, stride, padding, dilation, groups)
    return apply_activation(y if z is None else y + z, act)


def _as_list(value, n: int) -> list[int]:
    if type(value) is list and len(value) == n:       # what the rewritten graph passes: no copy
        return value
    if isinstance(value, int):
        return [value] * n
    value = [int(v) for v in value]
    return value * n if len(value) == 1 else value


def conv_out_shape(x_shape: Sequence[int], weight_shape: Sequence[int], stride, padding, dilation
                   ) -> tuple[int, ...]:
    """Output shape of a convolution with integer padding."""
    n = len(weight_shape) - 2
    stride, padding, dilation = _as_list(stride, n), _as_list(padding, n), _as_list(dilation, n)
    spatial = [(size + 2 * p - d * (k - 1) - 1) // s + 1
               for size, k, s, p, d in zip(x_shape[2:], weight_shape[2:], stride, padding, dilation)]
    return (x_shape[0], weight_shape[0], *spatial)


# ====================================================================== kernel selection

def select_conv_epilogue(device: torch.device | str, dtype: torch.dtype, act: str, *, weight_dim: int = 4,
                         int_padding: bool = True, residual: bool = False, residual_fits: bool = True,
                         separate: bool = False) -> Choice:
    """The one decision of how ``act(conv(x, w) + b [+ z])`` runs on ``device`` in ``dtype``.

    ``residual_fits``: z has the conv output's shape and x's dtype (cuDNN does not
    broadcast z). ``separate``: the plan's kernel choice "separate_epilogue" (never
    cuDNN's fused call). ``Choice.impl`` is ``cudnn_conv_relu``,
    ``cudnn_conv_add_relu`` or ``separate``; ``fused`` is whether the epilogue runs
    inside the convolution.
    """
    check(act, CONV_ACTIVATIONS)
    device = torch.device(device)
    cudnn = (not separate and act == "relu" and device.type == "cuda" and dtype in _CUDNN_DTYPES
             and weight_dim == 4 and int_padding and (not residual or residual_fits)
             and torch.backends.cudnn.is_available()
             and torch._C._get_cudnn_enabled())          # torch.backends.cudnn.enabled, without its wrapper
    if cudnn and residual:
        return Choice("cudnn_conv_add_relu", "cudnn conv+bias+add+relu (1 fused call: cudnn_convolution_add_relu)",
                      True)
    if cudnn:
        return Choice("cudnn_conv_relu", "cudnn conv+bias+relu (1 fused call: cudnn_convolution_relu)", True)
    steps = ["conv+bias"] + (["add_ in place"] if residual else []) + ([f"{act} in place"] if act != "none" else [])
    label = f"{' + '.join(steps)} ({len(steps)} kernel{'s' if len(steps) > 1 else ''})"
    return Choice("separate", label, False)


def conv_epilogue(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, z: torch.Tensor | None,
                  stride=1, padding=0, dilation=1, groups: int = 1, act: str = "relu",
                  separate: bool = False) -> torch.Tensor:
    """``act(conv(x, weight) + bias [+ z])`` as ``select_conv_epilogue`` decides.

    Shapes: ``x`` ``(N, C_in, *spatial)``; ``weight`` ``(C_out, C_in/groups, *kernel)``;
    ``bias`` ``(C_out,)`` or None; ``z`` the conv output's shape, or None.
    """
    fits = z is None or (z.dtype == x.dtype and not isinstance(padding, str)
                         and tuple(z.shape) == conv_out_shape(x.shape, weight.shape, stride, padding, dilation))
    choice = select_conv_epilogue(x.device, x.dtype, act, weight_dim=weight.dim(),
                                  int_padding=not isinstance(padding, str), residual=z is not None,
                                  residual_fits=fits, separate=separate)
    n = weight.dim() - 2
    if choice.impl == "cudnn_conv_relu":
        return torch.cudnn_convolution_relu(x, weight, bias, _as_list(stride, n), _as_list(padding, n),
                                            _as_list(dilation, n), groups)
    if choice.impl == "cudnn_conv_add_relu":
        return torch.cudnn_convolution_add_relu(x, weight, z, 1.0, bias, _as_list(stride, n),
                                                _as_list(padding, n), _as_list(dilation, n), groups)
    y = conv_nd(x, weight, bias, stride, padding, dilation, groups)         # (N, C_out, *out_spatial)
    if z is not None:
        y.add_(z)
    return apply_activation_(y, act)


# ====================================================================== fused call targets
# Module-level functions: gm.code names them, pickle finds them by name.

def fused_conv_bn(x, weight, bias, stride, padding, dilation, groups):
    """conv with BatchNorm folded into ``weight``/``bias`` (one conv kernel)."""
    return conv_nd(x, weight, bias, stride, padding, dilation, groups)


def fused_conv_act(x, weight, bias, stride, padding, dilation, groups, act):
    """``act(conv(x, weight) + bias)``: conv epilogue (cuDNN fused for relu on CUDA)."""
    return conv_epilogue(x, weight, bias, None, stride, padding, dilation, groups, act)


def fused_conv_bn_act(x, weight, bias, stride, padding, dilation, groups, act):
    """``act(conv(x, w') + b')`` with BatchNorm folded into ``w'``/``b'``."""
    return conv_epilogue(x, weight, bias, None, stride, padding, dilation, groups, act)


def fused_conv_add_act(x, weight, bias, z, stride, padding, dilation, groups, act):
    """``act(conv(x, weight) + bias + z)``: residual add and activation in the conv epilogue."""
    return conv_epilogue(x, weight, bias, z, stride, padding, dilation, groups, act)


def fused_conv_bn_add_act(x, weight, bias, z, stride, padding, dilation, groups, act):
    """``act(conv(x, w') + b' + z)`` with BatchNorm folded into ``w'``/``b'``."""
    return conv_epilogue(x, weight, bias, z, stride, padding, dilation, groups, act)


def fused_conv_separate_epilogue(x, weight, bias, z, stride, padding, dilation, groups, act):
    """Kernel choice "separate_epilogue": conv with its bias, then ``+ z`` (when given) and ``act`` in place."""
    return conv_epilogue(x, weight, bias, z, stride, padding, dilation, groups, act, separate=True)


# ====================================================================== rewrite

def _bn_output(bn: torch.fx.Node, chain_nodes: set[str]) -> tuple[torch.fx.Node, list[torch.fx.Node]]:
    """The node that carries the normalised tensor (bn itself, or its ``getitem 0``), and extra nodes to remove."""
    val = bn.meta.get("val")
    if not isinstance(val, (tuple, list)):
        return bn, []
    users = list(bn.users)
    firsts = [u for u in users if u.target is operator.getitem and u.args[1] == 0]
    others = [u for u in users if u not in firsts and not aten.is_ignored(u)]
    if len(firsts) != 1 or any(u.users for u in others):
        raise Refuse("BatchNorm statistics outputs are used: not folded")
    return firsts[0], [u for u in users if u is not firsts[0]] if firsts[0].name in chain_nodes else users


def _conv(conv: torch.fx.Node) -> aten.ConvArgs:
    args = aten.conv_args(conv)
    if args is None:
        raise UseGeneric(f"conv op {aten.aten_name(conv)} is not one the epilogue takes")
    if args.transposed:
        raise UseGeneric("transposed convolution")
    if any(args.output_padding or [0]):
        raise UseGeneric("convolution with output padding")
    return args


def _folded(ctx: RewriteContext, conv: torch.fx.Node, bn: torch.fx.Node) -> tuple[torch.Tensor, torch.Tensor]:
    """Fold ``bn`` into ``conv``: returns the new (weight, bias)."""
    c = _conv(conv)
    b = aten.batch_norm_args(bn)
    if b is None:
        raise Refuse(f"BatchNorm variant {aten.aten_name(bn)} is not folded")
    if b.training:
        raise Refuse(TRAINING_REFUSAL)
    if b.running_mean is None or b.running_var is None:
        raise Refuse(NO_RUNNING_STATS_REFUSAL)
    if not edit.through_identity(b.input, conv):
        raise Refuse("BatchNorm does not read the conv output directly")
    tensors = [ctx.constant(t, what) for t, what in (
        (c.weight, "conv weight"), (c.bias, "conv bias"), (b.running_mean, "running mean"),
        (b.running_var, "running var"), (b.weight, "BatchNorm weight"), (b.bias, "BatchNorm bias"))]
    return fold_conv_bn(*tensors, b.eps)


FOLD_CHOICE = Choice("bn_fold", "BatchNorm folded into the conv weights (exact arithmetic, 1 conv kernel on any "
                     "device)", True)


def fold(ctx: RewriteContext, chain) -> edit.Edit:
    """conv → (views) → BN becomes one conv with folded weights; the rest of the chain stays."""
    conv, bn = ctx.node(chain, "conv"), ctx.node(chain, "bn")
    names = list(chain.nodes)
    covered = [ctx.by_name[n] for n in names[: names.index(bn.name) + 1]]
    out, extra_remove = _bn_output(bn, set(names))
    w, b = _folded(ctx, conv, bn)
    if out is not bn and out.name in names:
        covered += [out]
    remove = covered + extra_remove
    edit.check_no_outside_users(remove, [out])
    c = _conv(conv)
    key = conv.name
    return edit.Edit(chain, tuple(remove), (out,), fused_conv_bn,
                     (c.input, NewAttr(f"{key}_weight"), NewAttr(f"{key}_bias"),
                      c.stride, c.padding, c.dilation, c.groups),
                     FOLD_CHOICE, tensors={f"{key}_weight": w, f"{key}_bias": b})


def rewrite(ctx: RewriteContext, chain, kernel: str) -> edit.Edit:
    """conv [→ BN] [→ add z] → act as one epilogue call (BN folded); the kernel choice "separate_epilogue"
    runs the conv with its bias, then the add and the activation in place, never cuDNN's fused call."""
    if chain.node_for("act") is None:  # conv_bn: the fold is the whole chain
        return fold(ctx, chain)
    edit.only_identity_views(ctx, chain)
    conv, bn, add = ctx.node(chain, "conv"), ctx.node(chain, "bn"), ctx.node(chain, "add")
    act = aten.activation_name(ctx.node(chain, "act"))
    if act not in CONV_ACTIVATIONS:
        raise UseGeneric(f"activation {act} has no conv epilogue")
    c = _conv(conv)
    weight, bias = c.weight, c.bias
    tensors: dict[str, torch.Tensor] = {}
    if bn is not None:
        w, b = _folded(ctx, conv, bn)
        tensors = {f"{conv.name}_weight": w, f"{conv.name}_bias": b}
        weight, bias = NewAttr(f"{conv.name}_weight"), NewAttr(f"{conv.name}_bias")
    members = set(ctx.members(chain))
    weight_val = aten.node_val(c.weight)
    z = None
    if add is not None:
        edit.check_alpha(add)
        z = edit.other_operand(add, members)
    separate = kernel == "separate_epilogue"
    z_shape, x_shape = aten.static_shape(z), aten.static_shape(c.input)
    fits = z is None or (z_shape is not None and x_shape is not None and not isinstance(c.padding, str)
                         and isinstance(weight_val, torch.Tensor)
                         and z_shape == conv_out_shape(x_shape, weight_val.shape, c.stride, c.padding, c.dilation))
    choice = select_conv_epilogue(ctx.device, edit.dtype_of(conv), act,
                                  weight_dim=weight_val.dim() if isinstance(weight_val, torch.Tensor) else 4,
                                  int_padding=not isinstance(c.padding, str), residual=z is not None,
                                  residual_fits=fits, separate=separate)
    label = choice.label
    if bn is not None:
        label = f"BatchNorm folded (exact) + {label}"
    if separate:
        label += "; kernel choice: separate epilogue"
    elif not choice.fused:
        label += edit.not_fused_note(ctx.device, "the conv epilogue")
    choice = Choice(choice.impl, label, choice.fused or bn is not None)
    if separate:
        target = fused_conv_separate_epilogue
    elif z is not None:
        target = fused_conv_bn_add_act if bn is not None else fused_conv_add_act
    else:
        target = fused_conv_bn_act if bn is not None else fused_conv_act
    args = (c.input, weight, bias, *((z,) if (z is not None or separate) else ()),
            c.stride, c.padding, c.dilation, c.groups, act)
    return edit.whole_chain_edit(ctx, chain, target, args, choice, tensors)


# ====================================================================== lowering (lean graphs)

def _geometry(gm, weight, stride, padding, dilation, groups):
    """``(weight tensor, stride, padding, dilation)`` as int lists for a 2-D conv, or None when unresolvable."""
    w = edit.attr_tensor(gm, weight)
    lists = edit.int_lists(2, stride, padding, dilation)
    if w is None or w.dim() != 4 or lists is None or not isinstance(groups, int):
        return None
    return (w, *lists)


def _lower(gm, node, device, dtype, x, w, b, z, stride, padding, dilation, groups, act, separate) -> bool:
    geometry = _geometry(gm, w, stride, padding, dilation, groups)
    if geometry is None or act not in CONV_ACTIVATIONS:
        return False
    weight, stride, padding, dilation = geometry
    fits = True
    if z is not None:
        x_shape, z_shape = aten.static_shape(x), aten.static_shape(z)
        if x_shape is None or z_shape is None:
            return False
        fits = conv_out_shape(x_shape, weight.shape, stride, padding, dilation) == z_shape
    choice = select_conv_epilogue(device, dtype, act, weight_dim=4, residual=z is not None,
                                  residual_fits=fits, separate=separate)
    if choice.impl == "cudnn_conv_relu":
        return edit.replace_node(gm, node, lambda g: g.call_function(
            torch.cudnn_convolution_relu, (x, w, b, stride, padding, dilation, groups)))
    if choice.impl == "cudnn_conv_add_relu":  # z floating like x: both in ``dtype`` after prepare_graph
        return edit.replace_node(gm, node, lambda g: g.call_function(
            torch.cudnn_convolution_add_relu, (x, w, z, 1.0, b, stride, padding, dilation, groups)))

    def build(g: torch.fx.Graph) -> torch.fx.Node:
        y = g.call_function(torch.conv2d, (x, w, b, stride, padding, dilation, groups))
        if z is not None:
            y = g.call_method("add_", (y, z))
        return in_place_node(g, y, act)

    return edit.replace_node(gm, node, build)


def _lower_conv_bn(gm, node, device, dtype) -> bool:
    """fused_conv_bn (BatchNorm already folded into the weight) → ``conv2d``."""
    x, w, b, stride, padding, dilation, groups = node.args
    geometry = _geometry(gm, w, stride, padding, dilation, groups)
    if geometry is None:
        return False
    _, stride, padding, dilation = geometry
    return edit.replace_node(gm, node, lambda g: g.call_function(
        torch.conv2d, (x, w, b, stride, padding, dilation, groups)))


def _lower_act(gm, node, device, dtype) -> bool:
    x, w, b, stride, padding, dilation, groups, act = node.args
    return _lower(gm, node, device, dtype, x, w, b, None, stride, padding, dilation, groups, act, False)


def _lower_add_act(gm, node, device, dtype) -> bool:
    x, w, b, z, stride, padding, dilation, groups, act = node.args
    return _lower(gm, node, device, dtype, x, w, b, z, stride, padding, dilation, groups, act, False)


def _lower_separate(gm, node, device, dtype) -> bool:
    x, w, b, z, stride, padding, dilation, groups, act = node.args
    return _lower(gm, node, device, dtype, x, w, b, z, stride, padding, dilation, groups, act, True)


#: fused call target -> lowering(gm, node, device, dtype) -> bool (explorer.runtime.lean)
LOWERINGS = {
    fused_conv_bn: _lower_conv_bn,
    fused_conv_act: _lower_act,
    fused_conv_bn_act: _lower_act,
    fused_conv_add_act: _lower_add_act,
    fused_conv_bn_add_act: _lower_add_act,
    fused_conv_separate_epilogue: _lower_separate,
}


# ====================================================================== patterns

def _bn_inference(g, node: str, ctx: dict) -> str | None:
    if g.nodes[node].get("training"):
        return "BatchNorm in training mode: folding is valid only for inference (frozen statistics)"
    return None


def _same_shape_add(g, node: str, ctx: dict) -> str | None:
    """The residual operand of a fused conv+add must have the conv output's shape."""
    prev = ctx["prev"]
    out_shape = g.nodes[prev]["shapes"][:1]
    for src in g.predecessors(node):
        if src == prev or src in ctx["chain"]:
            continue
        if g.nodes[src]["shapes"][:1] != out_shape:
            return f"add operand shape {g.nodes[src]['shapes'][:1]} differs from the conv output {out_shape} (broadcast)"
    if g.in_degree(node) == 1:
        return "add of a constant, not a residual"
    return None


_CONV = Step(frozenset({"conv"}), "conv")
_BN = Step(frozenset({"batch_norm"}), "bn", guard=_bn_inference)
_ACT = Step(frozenset(CONV_ACTIVATIONS) - {"none"}, "act", family=ACTIVATIONS)
_ADD = Step(frozenset({"add"}), "add", guard=_same_shape_add)
_KERNELS = ("auto", "separate_epilogue", "inductor")
_ADD_WHY = ("The residual add and the activation run in the convolution's epilogue: the conv output "
            "is never written to device memory and read back, and the add and the activation cost no "
            "launch of their own.")

PATTERNS = (
    Pattern(
        name="conv_bn_add_act", label="Conv+BN+Add+act", priority=20, stage="activation",
        steps=(_CONV, _BN, _ADD, _ACT), color="#1f77b4", kernels=_KERNELS, rewrite=rewrite, fold=fold,
        implementation="BatchNorm folded into the conv; cuDNN conv+bias+add+ReLU in one kernel",
        explanation="The residual block's tail. " + _ADD_WHY,
        caveats=(FOLD_CAVEAT, PRECISION_CAVEAT, PAYS_CAVEAT), formula=FORMULA,
    ),
    Pattern(
        name="conv_add_act", label="Conv+Add+act", priority=21, stage="activation",
        steps=(_CONV, _ADD, _ACT), color="#17becf", kernels=_KERNELS, rewrite=rewrite,
        implementation="cuDNN conv+bias+add+ReLU in one kernel",
        explanation=("Conv, residual add and activation, BatchNorm already folded (as ONNX exporters "
                     "do). " + _ADD_WHY),
        caveats=(PRECISION_CAVEAT, PAYS_CAVEAT),
    ),
    Pattern(
        name="conv_bn_act", label="Conv+BN+act", priority=22, stage="activation",
        steps=(_CONV, _BN, _ACT), color="#2ca02c", kernels=_KERNELS, rewrite=rewrite, fold=fold,
        implementation="BatchNorm folded into the conv; cuDNN conv+bias+ReLU in one kernel (other "
                       "activations: folded conv, then the activation in place)",
        explanation=("conv -> temp1 -> bn -> temp2 -> relu is three launches and two intermediates "
                     "written and read back. Folding BN into the conv's weights removes one op exactly; "
                     "running the activation in the conv's epilogue removes the other."),
        caveats=(FOLD_CAVEAT, PRECISION_CAVEAT, PAYS_CAVEAT), formula=FORMULA,
    ),
    Pattern(
        name="conv_act", label="Conv+act", priority=23, stage="activation",
        steps=(_CONV, _ACT), color="#98df8a", kernels=_KERNELS, rewrite=rewrite,
        implementation="cuDNN conv+bias+ReLU in one kernel",
        explanation=("Convolution with its activation in the epilogue (BatchNorm already folded, as "
                     "ONNX exporters do): the pre-activation tensor is never written out."),
        caveats=(PRECISION_CAVEAT, PAYS_CAVEAT),
    ),
    Pattern(
        name="conv_bn", label="Conv+BN", priority=24, stage="conv_bn",
        steps=(_CONV, _BN), color="#ff7f0e", rewrite=rewrite, fold=fold,
        implementation="BatchNorm folded into the conv's weight and bias (exact algebra, no kernel)",
        explanation=("In inference BatchNorm is a per-channel affine map, so it folds into the "
                     "convolution's weights: one op and one intermediate disappear at no cost."),
        caveats=(FOLD_CAVEAT, PRECISION_CAVEAT), formula=FORMULA,
    ),
)
