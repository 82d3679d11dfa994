"""Reading ATen fx nodes: their canonical kind, their arguments, their cost (FLOPs, bytes).

The kinds themselves are ``explorer.vocab`` (pure data); this module is where
an fx node of ``torch.export``'s ATen vocabulary (or of the ONNX importer,
which emits the same targets) is read.

- ``kind_of(node)`` maps it onto a kind.
- ``args_of(node)`` reads its arguments by name through the op's own schema,
  positional or keyword, with the schema's defaults: no argument position or
  default is written by hand anywhere in the explorer. The typed readers
  (``conv_args``, ``batch_norm_args``, ``layer_norm_args``, ``linear_args``,
  ``softmax_args``, ``binary_args``, ``activation_name``) are built on it and
  are what the guards' facts, the planners and the lowering read.
- ``flops_of``/``facts`` give the cost model and the facts the guards read.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import operator
from typing import Any

import torch
import torch.fx

from explorer.vocab import ELEMENTWISE, IGNORED_NAMES, KIND_BY_ATEN_NAME, TRANSCENDENTAL_FLOPS, VIEW_NAMES


def aten_name(node: torch.fx.Node) -> str:
    """ATen base name of a call_function node: ``aten.relu_.default`` -> ``relu_``."""
    target = node.target
    if target is operator.getitem:
        return "getitem"
    if isinstance(target, torch._ops.OpOverload):
        return target._schema.name.split("::", 1)[-1]
    if isinstance(target, torch._ops.OpOverloadPacket):
        return target._qualified_op_name.split("::", 1)[-1]
    return getattr(target, "__name__", str(target))


def target_str(node: torch.fx.Node) -> str:
    if node.target is operator.getitem:
        return "getitem"
    return str(node.target)


# ---------------------------------------------------------------- arguments by schema

class _Missing:
    """A required argument the node does not pass (never the case for a well-formed graph)."""

    def __repr__(self) -> str:
        return "MISSING"


MISSING = _Missing()


@functools.lru_cache(maxsize=None)
def _schema_arguments(target: torch._ops.OpOverload) -> tuple[tuple[str, bool, Any], ...]:
    """``(name, has_default, default)`` of each argument of an ATen overload, in schema order."""
    return tuple((a.name, a.has_default_value(), a.default_value if a.has_default_value() else MISSING)
                 for a in target._schema.arguments)


def args_of(node: torch.fx.Node) -> dict[str, Any]:
    """Every schema argument of an ATen call node by name (positional, keyword or the schema default).

    A node whose target is not an ATen overload gives ``{}``; a required argument
    the node does not pass is ``MISSING``.
    """
    if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload):
        return {}
    out: dict[str, Any] = {}
    for i, (name, _has_default, default) in enumerate(_schema_arguments(node.target)):
        if i < len(node.args):
            out[name] = node.args[i]
        else:
            out[name] = node.kwargs.get(name, default)
    return out


def attr_owner(root: torch.nn.Module, target: str) -> tuple[Any, str]:
    """``(object, name)`` such that ``getattr(object, name)`` is what a ``get_attr`` node with this
    dotted ``target`` reads from ``root``; raises ``AttributeError`` for a missing submodule."""
    *path, leaf = str(target).split(".")
    return functools.reduce(getattr, path, root), leaf


def attr_value(root: torch.nn.Module, target: str) -> Any:
    """What a ``get_attr`` node with this dotted ``target`` reads from ``root`` (``AttributeError`` if none)."""
    owner, leaf = attr_owner(root, target)
    return getattr(owner, leaf)


@dataclasses.dataclass(frozen=True)
class ConvArgs:
    """A forward convolution: ``conv1d/2d/3d``, ``convolution`` or ``_convolution``."""

    input: Any
    weight: Any
    bias: Any
    stride: Any
    padding: Any
    dilation: Any
    groups: Any
    transposed: bool = False
    output_padding: Any = ()


def conv_args(node: torch.fx.Node) -> ConvArgs | None:
    """The convolution's arguments, or None when the node is not a convolution."""
    name = aten_name(node)
    if name not in ("conv1d", "conv2d", "conv3d", "convolution", "_convolution"):
        return None
    a = args_of(node)
    return ConvArgs(a["input"], a["weight"], a.get("bias"), a["stride"], a["padding"], a["dilation"], a["groups"],
                    bool(a.get("transposed", False)), a.get("output_padding", ()))


@dataclasses.dataclass(frozen=True)
class BatchNormArgs:
    """A BatchNorm in any of its ATen spellings; ``training`` False for the ``no_training`` variant."""

    input: Any
    weight: Any
    bias: Any
    running_mean: Any
    running_var: Any
    training: bool
    momentum: Any
    eps: float


_BATCH_NORMS = ("batch_norm", "native_batch_norm", "_native_batch_norm_legit",
                "_native_batch_norm_legit_no_training", "cudnn_batch_norm")


def batch_norm_args(node: torch.fx.Node) -> BatchNormArgs | None:
    """The BatchNorm's arguments, or None when the node is not a BatchNorm.

    ``training`` comes from the node itself (the schemas have no default for it); a
    node that does not say is read as training, the answer that never folds wrongly.
    """
    name = aten_name(node)
    if name not in _BATCH_NORMS:
        return None
    a = args_of(node)
    training = False if name == "_native_batch_norm_legit_no_training" else a.get("training", MISSING)
    return BatchNormArgs(a["input"], a.get("weight"), a.get("bias"), a.get("running_mean"), a.get("running_var"),
                         True if training is MISSING else bool(training), a.get("momentum"),
                         float(a.get("eps", a.get("epsilon", 1e-5))))


@dataclasses.dataclass(frozen=True)
class LayerNormArgs:
    input: Any
    normalized_shape: Any
    weight: Any
    bias: Any
    eps: float


def layer_norm_args(node: torch.fx.Node) -> LayerNormArgs | None:
    """``layer_norm``/``native_layer_norm`` arguments, or None."""
    if aten_name(node) not in ("layer_norm", "native_layer_norm"):
        return None
    a = args_of(node)
    return LayerNormArgs(a["input"], a["normalized_shape"], a.get("weight"), a.get("bias"), float(a["eps"]))


@dataclasses.dataclass(frozen=True)
class LinearArgs:
    input: Any
    weight: Any
    bias: Any


def linear_args(node: torch.fx.Node) -> LinearArgs | None:
    """A plain ``linear(input, weight, bias)``, or None (``addmm`` and friends are not plain linears)."""
    if aten_name(node) != "linear":
        return None
    a = args_of(node)
    return LinearArgs(a["input"], a["weight"], a.get("bias"))


@dataclasses.dataclass(frozen=True)
class SoftmaxArgs:
    input: Any
    dim: int
    dtype: Any            # the result dtype asked for (``softmax.int``), or None
    half_to_float: bool   # ``_softmax`` computing half inputs in float


def softmax_args(node: torch.fx.Node) -> SoftmaxArgs | None:
    """``softmax``/``_softmax``/``_safe_softmax`` arguments, or None."""
    if aten_name(node) not in ("softmax", "_softmax", "_safe_softmax"):
        return None
    a = args_of(node)
    return SoftmaxArgs(a.get("self", a.get("input")), int(a["dim"]), a.get("dtype"), bool(a.get("half_to_float", False)))


@dataclasses.dataclass(frozen=True)
class BinaryArgs:
    """``add``/``sub``/``mul``/``div`` (Tensor or Scalar overloads): the two operands and ``alpha``."""

    self: Any
    other: Any
    alpha: Any = 1


def binary_args(node: torch.fx.Node) -> BinaryArgs | None:
    if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload):
        return None
    a = args_of(node)
    if "self" not in a or "other" not in a:
        return None
    return BinaryArgs(a["self"], a["other"], a.get("alpha", 1))


def activation_name(node: torch.fx.Node) -> str:
    """The activation a node applies, as the fused kernels name it: its kind, with
    ``gelu_tanh`` for the tanh-approximated GELU (the two differ by up to ~5e-4)."""
    kind = kind_of(node)
    if kind == "gelu" and args_of(node).get("approximate", "none") == "tanh":
        return "gelu_tanh"
    return kind


def is_training_dropout(node: torch.fx.Node) -> bool:
    a = args_of(node)
    return bool(a.get("train", True)) and float(a.get("p", 0.5)) > 0


def is_training_batch_norm(node: torch.fx.Node) -> bool:
    """True when a batch_norm node uses batch statistics (training mode)."""
    bn = batch_norm_args(node)
    return bn is not None and bn.training


# ---------------------------------------------------------------- kinds

def kind_of(node: torch.fx.Node) -> str:
    """Canonical kind of an fx node (placeholder -> ``input``, output -> ``output``)."""
    if node.op == "placeholder":
        return "input"
    if node.op == "output":
        return "output"
    if node.op == "get_attr":
        return "weight"
    if node.op != "call_function":
        return node.op
    name = aten_name(node)
    if name in ("hardtanh", "hardtanh_"):
        a = args_of(node)
        return "relu6" if (a.get("min_val"), a.get("max_val")) in ((0.0, 6.0), (0, 6)) else "hardtanh"
    if name in ("dropout", "dropout_", "feature_dropout"):
        return "dropout" if not is_training_dropout(node) else "dropout_train"
    if name in VIEW_NAMES:
        return "view"
    return KIND_BY_ATEN_NAME.get(name, name)


def is_ignored(node: torch.fx.Node) -> bool:
    """Nodes that carry no tensor work (capture-time asserts, export's guard modules)."""
    return node.op == "call_function" and aten_name(node) in IGNORED_NAMES or node.op == "call_module"


# ---------------------------------------------------------------- tensor metadata

def tensor_vals(val: Any) -> list[torch.Tensor]:
    """Flatten an fx ``meta['val']`` into its tensors."""
    if isinstance(val, torch.Tensor):
        return [val]
    if isinstance(val, (list, tuple)):
        return [t for v in val for t in tensor_vals(v)]
    return []


def nbytes(t: torch.Tensor) -> int:
    return int(t.numel()) * t.element_size()


def _numel(t: torch.Tensor | None) -> int:
    return int(t.numel()) if isinstance(t, torch.Tensor) else 0


def node_val(node: Any) -> Any:
    """A node's ``meta['val']`` (its fake or meta tensor), or None for non-nodes."""
    return node.meta.get("val") if isinstance(node, torch.fx.Node) else None


def static_shape(node: Any) -> tuple[int, ...] | None:
    """The node's tensor shape as ints, or None (no metadata, or symbolic sizes)."""
    val = node_val(node)
    if not isinstance(val, torch.Tensor):
        return None
    try:
        return tuple(int(s) for s in val.shape)
    except TypeError:
        return None


def flops_of(node: torch.fx.Node, kind: str) -> int:
    """A FLOP estimate (multiply-add counts 2) from the node's input and output shapes."""
    outs = tensor_vals(node.meta.get("val"))
    out = outs[0] if outs else None
    n_out = _numel(out)
    first = node_val(node.args[0]) if node.args else None
    if kind == "conv" and out is not None:
        weight = node_val(node.args[1])
        if isinstance(weight, torch.Tensor):
            per_out = math.prod(weight.shape[1:])  # (Cin/groups) * kernel size
            return 2 * n_out * per_out
    if kind == "linear" and isinstance(first, torch.Tensor):
        k = node_val(node.args[2]).shape[0] if aten_name(node) == "addmm" else first.shape[-1]
        return 2 * n_out * int(k)
    if kind == "matmul" and isinstance(first, torch.Tensor):
        return 2 * n_out * int(first.shape[-1])
    if kind == "sdpa" and isinstance(first, torch.Tensor):
        key = node_val(node.args[1])
        s_k = int(key.shape[-2]) if isinstance(key, torch.Tensor) else 1
        return 4 * n_out * s_k + 5 * (n_out // max(int(first.shape[-1]), 1)) * s_k
    if kind in ("batch_norm",):
        return 2 * n_out
    if kind == "layer_norm":
        return 8 * n_out
    if kind == "softmax":
        return 5 * n_out
    if kind in ("max_pool", "avg_pool") and isinstance(first, torch.Tensor):
        return max(_numel(first), n_out)
    if kind in ELEMENTWISE or kind in ("relu", "relu6", "hardtanh"):
        return TRANSCENDENTAL_FLOPS.get(kind, 1) * n_out
    if kind == "reduce":
        return _numel(first)
    return 0


def _is_attr(value: Any) -> bool:
    return isinstance(value, torch.fx.Node) and value.op == "get_attr"


def _transposed_weight(value: Any) -> torch.fx.Node | None:
    """``W`` when ``value`` is ``W.T`` (``t``, ``numpy_T``, ``mT``, a transpose or swap of dims 0 and 1, a
    ``[1, 0]`` permute) of a 2-D constant ``W``, else None."""
    if not isinstance(value, torch.fx.Node) or value.op != "call_function" or not value.args:
        return None
    src = value.args[0]
    if not _is_attr(src) or _rank(src) != 2:
        return None
    name = aten_name(value)
    if name in ("t", "numpy_T", "mT"):
        return src
    if name in ("transpose", "swapaxes", "swapdims") and sorted(d % 2 for d in value.args[1:3]) == [0, 1]:
        return src
    if name == "permute" and [d % 2 for d in value.args[1]] == [1, 0]:
        return src
    return None


def transposed_weight(value: Any) -> torch.fx.Node | None:
    """The public name of ``_transposed_weight`` (read by the linear family's rewrite)."""
    return _transposed_weight(value)


def facts(node: torch.fx.Node, kind: str) -> dict[str, Any]:
    """Per-kind facts the pattern guards read (kept small: they become graph attributes)."""
    out: dict[str, Any] = {}
    if kind == "batch_norm":
        out["training"] = is_training_batch_norm(node)
    if kind in ("add", "sub", "mul", "div"):
        operands = list(node.args[:2])
        out["scalar_operand"] = any(isinstance(a, (int, float)) for a in operands) or any(
            _is_attr(a) and isinstance(node_val(a), torch.Tensor) and node_val(a).numel() == 1 for a in operands)
        out["const_operand"] = any(_is_attr(a) for a in operands)
    if kind == "layer_norm":
        ln = layer_norm_args(node)
        shape = ln.normalized_shape if ln is not None else [0]
        out["norm_dims"] = len(shape) if isinstance(shape, (list, tuple)) else 1
    if kind == "matmul" and node.args and isinstance(node.args[0], torch.fx.Node):
        out["first_input"] = node.args[0].name
    if kind == "matmul" and len(node.args) > 1 and _transposed_weight(node.args[1]) is not None:
        out["weight_t"] = True     # x @ W.T with W a 2-D constant: a linear written out (Falcon)
    if kind == "einsum" and len(node.args) > 1 and isinstance(node.args[1], (list, tuple)) and node.args[1] \
            and isinstance(node.args[1][0], torch.fx.Node):
        out["first_input"] = node.args[1][0].name   # an einsum's first operand, as a matmul's
    lin = linear_args(node) if kind == "linear" else None
    if lin is not None and isinstance(lin.input, torch.fx.Node):
        out["first_input"] = lin.input.name
        out["const_weight"] = _is_attr(lin.weight)
        out["has_bias"] = lin.bias is not None
        if _is_attr(lin.weight):   # which weight, and how many ops read it (tied weights: more than one)
            out["weight_attr"] = str(lin.weight.target)
            out["weight_users"] = len(lin.weight.users)
    conv = conv_args(node) if kind == "conv" else None
    if conv is not None:
        out["groups"] = int(conv.groups) if isinstance(conv.groups, int) else 1
        weight = node_val(conv.weight)
        if isinstance(weight, torch.Tensor):
            out["kernel"] = list(weight.shape[2:])
    out.update(_elementwise_facts(node, kind))
    return out


def _number(value: Any) -> float | None:
    """A Python int or float as a float (bools and anything else: None)."""
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _rank(node: Any) -> int | None:
    val = node_val(node)
    return val.dim() if isinstance(val, torch.Tensor) else None


def _elementwise_facts(node: torch.fx.Node, kind: str) -> dict[str, Any]:
    """Facts of the small ops hand-written norms and rotary embeddings are made of (RMSNorm's
    ``pow(2)``, ``mean(-1, keepdim)``, ``+ eps``, its dtype casts; rotate-half's slices and ``cat``).
    Dims are normalised to be non-negative, slice bounds clamped to the sliced size."""
    out: dict[str, Any] = {}
    name = aten_name(node)
    if kind == "pow":
        exponent = _number(args_of(node).get("exponent"))
        if exponent is not None:
            out["exponent"] = exponent
    elif kind in ("add", "sub", "mul", "div"):
        scalar = next((_number(a) for a in node.args[:2] if _number(a) is not None), None)
        if scalar is not None:
            out["scalar"] = scalar
        constants = [str(a.target) for a in node.args[:2] if _is_attr(a)]
        if constants:
            out["const_inputs"] = constants   # weights are not graph nodes: which ones an op reads
    elif kind == "reduce" and node.args:
        a, rank = args_of(node), _rank(node.args[0])
        dims = a.get("dim")
        dims = [dims] if isinstance(dims, int) else dims
        if rank and isinstance(dims, (list, tuple)) and all(isinstance(d, int) for d in dims):
            out["reduce_dims"] = sorted(d % rank for d in dims)
            out["keepdim"] = bool(a.get("keepdim", False))
    elif kind == "cat":
        a, rank = args_of(node), _rank(node)
        tensors = a.get("tensors")
        if rank and isinstance(tensors, (list, tuple)) and isinstance(a.get("dim", 0), int):
            out["cat_dim"] = a.get("dim", 0) % rank
            out["cat_inputs"] = [t.name if isinstance(t, torch.fx.Node) else None for t in tensors]
    if name in ("to", "_to_copy"):
        dtype = args_of(node).get("dtype")
        if isinstance(dtype, torch.dtype):
            out["to_dtype"] = str(dtype).replace("torch.", "")
    elif name == "slice" and node.args:
        a, shape = args_of(node), static_shape(node.args[0])
        dim, start, end, step = a.get("dim", 0), a.get("start"), a.get("end"), a.get("step", 1)
        if shape and isinstance(dim, int) and all(isinstance(v, int) or v is None for v in (start, end, step)):
            dim %= len(shape)
            size = shape[dim]
            start = 0 if start is None else (start + size if start < 0 else start)
            end = size if end is None else (end + size if end < 0 else end)
            out["slice"] = [dim, max(0, min(start, size)), max(0, min(end, size)), 1 if step is None else step]
    elif name == "unsqueeze":
        dim, rank = args_of(node).get("dim"), _rank(node)
        if isinstance(dim, int) and rank:
            out["unsqueeze_dim"] = dim % rank
    return out
