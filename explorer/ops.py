"""The canonical op vocabulary, and the cost model (FLOPs, bytes) of each op.

Patterns are written against a small set of op *kinds* (``conv``,
``batch_norm``, ``relu``, ``add``, ``matmul``, ``linear``, ``softmax``,
``layer_norm``, ...), never against raw ATen names. ``kind_of`` maps an fx
node (from ``torch.export`` or the ONNX importer) to its kind.

Some kinds are *transparent*: views, tuple unpacking and inference-mode
dropout launch no kernel and move no bytes. Patterns look through them.
"""

from __future__ import annotations

import functools

import math
import operator
from typing import Any

import torch
import torch.fx

# ATen base name -> canonical kind. Names not listed keep their ATen base name.
_KIND_BY_NAME: dict[str, str] = {
    **dict.fromkeys(["conv1d", "conv2d", "conv3d", "convolution", "_convolution", "cudnn_convolution"], "conv"),
    **dict.fromkeys(["conv_transpose1d", "conv_transpose2d", "conv_transpose3d"], "conv_transpose"),
    **dict.fromkeys(["batch_norm", "_native_batch_norm_legit_no_training", "native_batch_norm",
                     "_native_batch_norm_legit", "cudnn_batch_norm"], "batch_norm"),
    **dict.fromkeys(["relu", "relu_"], "relu"),
    **dict.fromkeys(["relu6", "relu6_"], "relu6"),
    **dict.fromkeys(["silu", "silu_"], "silu"),
    **dict.fromkeys(["gelu", "gelu_"], "gelu"),
    **dict.fromkeys(["hardswish", "hardswish_"], "hardswish"),
    **dict.fromkeys(["hardsigmoid", "hardsigmoid_"], "hardsigmoid"),
    **dict.fromkeys(["sigmoid", "sigmoid_"], "sigmoid"),
    **dict.fromkeys(["tanh", "tanh_"], "tanh"),
    **dict.fromkeys(["leaky_relu", "leaky_relu_"], "leaky_relu"),
    **dict.fromkeys(["elu", "elu_"], "elu"),
    **dict.fromkeys(["mish", "mish_"], "mish"),
    **dict.fromkeys(["add", "add_"], "add"),
    **dict.fromkeys(["sub", "sub_", "rsub"], "sub"),
    **dict.fromkeys(["mul", "mul_"], "mul"),
    **dict.fromkeys(["div", "div_"], "div"),
    **dict.fromkeys(["matmul", "bmm", "mm"], "matmul"),
    **dict.fromkeys(["linear", "addmm"], "linear"),
    **dict.fromkeys(["softmax", "_softmax", "_safe_softmax"], "softmax"),
    **dict.fromkeys(["layer_norm", "native_layer_norm"], "layer_norm"),
    **dict.fromkeys(["scaled_dot_product_attention", "_scaled_dot_product_flash_attention",
                     "_scaled_dot_product_efficient_attention", "_scaled_dot_product_cudnn_attention",
                     "_native_multi_head_attention"], "sdpa"),
    **dict.fromkeys(["dropout", "dropout_", "native_dropout", "feature_dropout"], "dropout"),
    **dict.fromkeys(["max_pool2d", "max_pool1d", "max_pool3d", "max_pool2d_with_indices"], "max_pool"),
    **dict.fromkeys(["avg_pool2d", "avg_pool1d", "avg_pool3d", "adaptive_avg_pool2d",
                     "adaptive_avg_pool1d", "_adaptive_avg_pool2d"], "avg_pool"),
    **dict.fromkeys(["contiguous", "clone", "_to_copy", "copy"], "copy"),
    **dict.fromkeys(["cat", "concat", "stack"], "cat"),
    **dict.fromkeys(["mean", "sum", "amax", "var_mean", "var"], "reduce"),
    **dict.fromkeys(["upsample_nearest2d", "upsample_bilinear2d", "_upsample_nearest_exact2d"], "upsample"),
}

# Pure metadata ops: they launch nothing and move no bytes.
VIEW_NAMES = frozenset({
    "view", "_unsafe_view", "reshape", "permute", "transpose", "t", "expand", "expand_as",
    "unsqueeze", "squeeze", "flatten", "unflatten", "alias", "detach", "select", "slice",
    "unbind", "split", "split_with_sizes", "chunk", "narrow", "as_strided", "view_as",
    "lift_fresh_copy", "getitem",
})

# Ops that carry no tensor work at all and are left out of the graph view.
IGNORED_NAMES = frozenset({
    "_assert_tensor_metadata", "_assert_scalar", "sym_constrain_range_for_size",
    "sym_constrain_range", "_assert_async", "sym_size", "sym_numel", "sym_stride",
})

ACTIVATIONS = frozenset({"relu", "relu6", "silu", "gelu", "hardswish", "hardsigmoid", "sigmoid",
                         "tanh", "leaky_relu", "elu", "mish"})
ELEMENTWISE = ACTIVATIONS | frozenset({"add", "sub", "mul", "div", "exp", "erf", "pow", "sqrt",
                                       "rsqrt", "neg", "abs", "clamp", "where", "reciprocal", "log"})
TRANSPARENT = frozenset({"view", "dropout"})

_TRANSCENDENTAL_FLOPS = {"gelu": 8, "silu": 4, "sigmoid": 4, "tanh": 4, "hardswish": 4, "mish": 8,
                         "elu": 4, "exp": 4, "erf": 4, "log": 4, "sqrt": 2, "rsqrt": 2, "pow": 4}


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
        lo, hi = arg(node, 1, "min_val", -1.0), arg(node, 2, "max_val", 1.0)
        return "relu6" if (lo, hi) == (0.0, 6.0) or (lo, hi) == (0, 6) else "hardtanh"
    if name in ("dropout", "dropout_", "feature_dropout"):
        return "dropout" if not is_training_dropout(node) else "dropout_train"
    if name in VIEW_NAMES:
        return "view"
    return _KIND_BY_NAME.get(name, name)


def is_ignored(node: torch.fx.Node) -> bool:
    return node.op == "call_function" and aten_name(node) in IGNORED_NAMES or node.op == "call_module"


def is_training_dropout(node: torch.fx.Node) -> bool:
    p = arg(node, 1, "p", 0.5)
    train = arg(node, 2, "train", True)
    return bool(train) and float(p) > 0


def is_training_batch_norm(node: torch.fx.Node) -> bool:
    """True when a batch_norm node uses batch statistics (training mode)."""
    name = aten_name(node)
    if name == "batch_norm":
        return bool(arg(node, 5, "training", False))
    if name in ("native_batch_norm", "_native_batch_norm_legit"):
        return bool(arg(node, 5, "training", True))
    return False


def attr_value(root: torch.nn.Module, target: str) -> Any:
    """What a ``get_attr`` node with this dotted ``target`` reads from ``root``."""
    return functools.reduce(getattr, str(target).split("."), root)


def arg(node: torch.fx.Node, index: int, name: str, default: Any = None) -> Any:
    """Positional-or-keyword argument ``index``/``name`` of an fx node."""
    if len(node.args) > index:
        return node.args[index]
    return node.kwargs.get(name, default)


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
    return node.meta.get("val") if isinstance(node, torch.fx.Node) else None


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
        name = aten_name(node)
        k = node_val(node.args[2]).shape[0] if name == "addmm" else first.shape[-1]
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
        return _TRANSCENDENTAL_FLOPS.get(kind, 1) * n_out
    if kind == "reduce":
        return _numel(first)
    return 0


def is_view_kind(kind: str) -> bool:
    return kind in TRANSPARENT or kind in ("input", "output", "weight")


def facts(node: torch.fx.Node, kind: str) -> dict[str, Any]:
    """Per-kind facts the pattern guards read (kept small: they become graph attributes)."""
    out: dict[str, Any] = {}
    if kind == "batch_norm":
        out["training"] = is_training_batch_norm(node)
    if kind in ("add", "sub", "mul", "div"):
        operands = list(node.args[:2])
        out["scalar_operand"] = any(isinstance(a, (int, float)) for a in operands) or any(
            isinstance(a, torch.fx.Node) and a.op == "get_attr"
            and isinstance(node_val(a), torch.Tensor) and node_val(a).numel() == 1 for a in operands)
        out["const_operand"] = any(isinstance(a, torch.fx.Node) and a.op == "get_attr" for a in operands)
    if kind == "layer_norm":
        shape = arg(node, 1, "normalized_shape", [0])
        out["norm_dims"] = len(shape) if isinstance(shape, (list, tuple)) else 1
    if kind == "matmul" and node.args and isinstance(node.args[0], torch.fx.Node):
        out["first_input"] = node.args[0].name
    if kind == "linear" and aten_name(node) == "linear" and isinstance(arg(node, 0, "input"), torch.fx.Node):
        weight, bias = arg(node, 1, "weight"), arg(node, 2, "bias")
        out["first_input"] = arg(node, 0, "input").name
        out["const_weight"] = isinstance(weight, torch.fx.Node) and weight.op == "get_attr"
        out["has_bias"] = bias is not None
    if kind == "conv":
        weight = node_val(node.args[1]) if len(node.args) > 1 else None
        groups = arg(node, 6, "groups", 1)
        if aten_name(node) in ("convolution", "_convolution"):
            groups = arg(node, 8, "groups", 1)
        out["groups"] = int(groups) if isinstance(groups, int) else 1
        if isinstance(weight, torch.Tensor):
            out["kernel"] = list(weight.shape[2:])
    return out
