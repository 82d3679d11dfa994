"""Make a prepared graph cheap to run on the host: resolve each call once, not at every forward.

Without CUDA graphs a BERT-base or ResNet-50 forward at batch 32 is bound by
the host, not the GPU (see ``benchmarks/results/graph_host_*.json``): what a
call costs in Python and in PyTorch's dispatcher decides the latency. Two kinds
of call in a captured graph pay for work that could be done once:

- **ATen calls through ``OpOverload``** (``torch.ops.aten.view.default``).
  torch.export writes every op so; each call goes through a schema-driven
  argument parser that costs more than the public binding of the same op
  (``torch.transpose``, ``Tensor.view``: 4.0 against 2.6 µs of host time for a
  view on the H200 machine, ``benchmarks/results/host_overhead_lean_h200.json``).
  ``lower_aten_calls`` swaps the target for the public binding where the two
  take the same arguments in the same order. It is the same ATen kernel either
  way: outputs are bitwise equal (tested per op).
- **The explorer's fused call targets** (``explorer.rewrite.fused_*``) choose at
  every call which kernel applies: cuDNN's fused conv+bias+ReLU or the conv and
  an in-place activation, cuBLASLt's epilogue or a GEMM and an in-place GELU.
  That choice depends only on what a prepared graph fixes (device, dtype,
  activation, shapes), so ``specialize_fused_calls`` takes it here, once, and
  the node calls the library function directly. The kernels run are exactly the
  ones the generic target would have run; where a condition cannot be read from
  the graph (no shape metadata, an unusual argument), the node is left alone.

A third, smaller cost: a weight read as ``self.<name>`` goes through
``nn.Module.__getattr__`` (parameters and buffers are not instance attributes):
0.2 µs against 0.1 for a plain attribute on the H200 machine (same JSON), and
BERT-base reads about 200 per forward. ``pin_attrs`` makes each read a plain
instance-attribute lookup of the same tensor object.

A lean graph is final: it is tied to the state it was made in. Pinned reads
follow a parameter through ``.to()`` (PyTorch moves parameters in place) but
not a buffer, and a later ``torch.backends.cudnn.enabled = False`` does not
move its convolutions off cuDNN. So move and cast first, then make it lean, as
``prepare_graph`` does. It runs the three passes on every graph the runner
times, unfused and fused alike, so neither side gets an advantage the other
lacks.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import torch
import torch.fx

from explorer import ops

aten = torch.ops.aten

#: ATen overloads whose public binding takes the same positional arguments and
#: keyword names: ("function", f) calls ``f(*args, **kwargs)``, ("method", name)
#: calls ``args[0].name(*args[1:], **kwargs)``. Only exact equivalents belong here:
#: ``tests/test_lean.py`` checks each against the overload on sample arguments.
PUBLIC_BINDINGS: dict[Any, tuple[str, Any]] = {
    aten.linear.default: ("function", torch._C._nn.linear),
    aten.transpose.int: ("function", torch.transpose),
    aten.view.default: ("method", "view"),
    aten.reshape.default: ("function", torch.reshape),
    aten.contiguous.default: ("method", "contiguous"),
    aten.expand.default: ("method", "expand"),
    aten.permute.default: ("function", torch.permute),
    aten.unsqueeze.default: ("function", torch.unsqueeze),
    aten.squeeze.dim: ("function", torch.squeeze),
    aten.unflatten.int: ("function", torch.unflatten),
    aten.flatten.using_ints: ("function", torch.flatten),
    aten.select.int: ("function", torch.select),
    aten.cat.default: ("function", torch.cat),
    aten.add.Tensor: ("function", torch.add),
    aten.add_.Tensor: ("method", "add_"),
    aten.mul.Tensor: ("function", torch.mul),
    aten.matmul.default: ("function", torch.matmul),
    aten.conv2d.default: ("function", torch.conv2d),
    aten.batch_norm.default: ("function", torch.batch_norm),
    aten.layer_norm.default: ("function", torch.layer_norm),
    aten.softmax.int: ("function", torch.softmax),
    aten.relu.default: ("function", torch.relu),
    aten.relu_.default: ("function", torch.relu_),
    aten.gelu.default: ("function", torch._C._nn.gelu),
    aten.silu.default: ("function", torch._C._nn.silu),
    aten.hardtanh_.default: ("function", torch._C._nn.hardtanh_),
    aten.max_pool2d.default: ("function", torch.max_pool2d),
    aten.adaptive_avg_pool2d.default: ("function", torch._C._nn.adaptive_avg_pool2d),
    aten.embedding.default: ("function", torch.embedding),
    aten.scaled_dot_product_attention.default: ("function", torch._C._nn.scaled_dot_product_attention),
}


def lower_aten_calls(gm: torch.fx.GraphModule) -> int:
    """Call the public binding instead of the ``OpOverload`` wherever ``PUBLIC_BINDINGS`` has one.

    Edits ``gm`` in place (recompiles it) and returns how many nodes changed.
    """
    changed = 0
    for node in gm.graph.nodes:
        if node.op != "call_function":
            continue
        binding = PUBLIC_BINDINGS.get(node.target)
        if binding is None:
            continue
        kind, target = binding
        if kind == "method":
            node.op, node.target = "call_method", target
        else:
            node.target = target
        changed += 1
    if changed:
        gm.recompile()
    return changed


def pin_attrs(gm: torch.fx.GraphModule) -> int:
    """Read each tensor of a ``get_attr`` node from the instance ``__dict__`` (the same object).

    The tensor stays registered where it was (parameter counts and
    ``state_dict`` do not change); the node reads it through a new name,
    ``_pin_<target>``, that ``nn.Module.__getattr__`` is never asked for.
    Returns how many nodes were retargeted.
    """
    changed = 0
    for node in gm.graph.nodes:
        if node.op != "get_attr":
            continue
        value = ops.attr_value(gm, node.target)
        if not isinstance(value, torch.Tensor):
            continue
        name = "_pin_" + str(node.target).replace(".", "_")
        while name in gm.__dict__ and gm.__dict__[name] is not value:
            name += "_"
        gm.__dict__[name] = value  # bypasses Module.__setattr__: no registration, a plain attribute
        node.target = name
        changed += 1
    if changed:
        gm.recompile()
    return changed


# ------------------------------------------------------------------ fused call targets

Specializer = Callable[[torch.fx.GraphModule, torch.fx.Node, torch.device, torch.dtype], bool]


def specialize_fused_calls(gm: torch.fx.GraphModule, device: torch.device | str, dtype: torch.dtype) -> int:
    """Replace each fused call target by the library call it would take on ``device`` in ``dtype``.

    ``gm`` must already hold its tensors on ``device`` with floating ones in
    ``dtype`` (as ``prepare_graph`` leaves it). Edits ``gm`` in place and returns
    how many fused calls were specialised.
    """
    device = torch.device(device)
    specializers = _specializers()
    changed = 0
    for node in list(gm.graph.nodes):
        if node.op == "call_function" and not node.kwargs:
            special = specializers.get(node.target)
            if special is not None and special(gm, node, device, dtype):
                changed += 1
    if changed:
        gm.graph.eliminate_dead_code()
        gm.graph.lint()
        gm.recompile()
    return changed


@functools.lru_cache(maxsize=1)
def _specializers() -> dict[Callable, Specializer]:
    from explorer import rewrite  # on first use: it pulls in the whole engine and the kernels

    return {
        rewrite.fused_conv_bn: _conv_bn,
        rewrite.fused_conv_act: _conv_act,
        rewrite.fused_conv_bn_act: _conv_act,
        rewrite.fused_conv_add_act: _conv_add_act,
        rewrite.fused_conv_bn_add_act: _conv_add_act,
        rewrite.fused_conv_separate_epilogue: _conv_separate,
        rewrite.fused_linear_act: _linear_act,
        rewrite.fused_linear_separate_epilogue: _linear_separate,
        rewrite.fused_linear_siblings: _linear_siblings,
    }


#: In-place activations as single library calls (the same ops ``kernels.apply_activation_`` runs).
_INPLACE: dict[str, tuple[Callable, dict]] = {
    "relu": (torch.relu_, {}),
    "relu6": (torch.clamp_, {"min": 0.0, "max": 6.0}),
    "silu": (torch._C._nn.silu_, {}),
    "gelu": (torch._C._nn.gelu_, {}),
    "gelu_tanh": (torch._C._nn.gelu_, {"approximate": "tanh"}),
    "hardswish": (torch._C._nn.hardswish_, {}),
    "tanh": (torch.tanh_, {}),
}


def _shape(arg: Any) -> tuple[int, ...] | None:
    val = arg.meta.get("val") if isinstance(arg, torch.fx.Node) else None
    if isinstance(val, torch.Tensor):
        try:
            return tuple(int(s) for s in val.shape)
        except TypeError:  # symbolic sizes: not a shape this pass can rely on
            return None
    return None


def _attr(gm: torch.fx.GraphModule, arg: Any) -> torch.Tensor | None:
    if not (isinstance(arg, torch.fx.Node) and arg.op == "get_attr"):
        return None
    value = ops.attr_value(gm, arg.target)
    return value if isinstance(value, torch.Tensor) else None


def _int_lists(n: int, *values: Any) -> tuple[list[int], ...] | None:
    out = []
    for v in values:
        if isinstance(v, int):
            out.append([v] * n)
        elif isinstance(v, (list, tuple)) and all(isinstance(i, int) for i in v) and len(v) in (1, n):
            out.append([int(i) for i in v] * (n if len(v) == 1 else 1))
        else:
            return None  # string padding ("same"), symbolic values: leave the node alone
    return tuple(out)


def _replace(gm: torch.fx.GraphModule, node: torch.fx.Node, build: Callable[[torch.fx.Graph], torch.fx.Node]) -> bool:
    with gm.graph.inserting_before(node):
        new = build(gm.graph)
    new.meta.update(node.meta)
    node.replace_all_uses_with(new)
    gm.graph.erase_node(node)
    return True


def _in_place(graph: torch.fx.Graph, y: torch.fx.Node, act: str) -> torch.fx.Node:
    if act == "none":
        return y
    fn, kwargs = _INPLACE[act]
    return graph.call_function(fn, (y,), dict(kwargs))


def _conv_geometry(gm, weight, stride, padding, dilation, groups):
    """``(weight tensor, stride, padding, dilation)`` as int lists for a 2-D conv, or None when unresolvable."""
    w = _attr(gm, weight)
    lists = _int_lists(2, stride, padding, dilation)
    if w is None or w.dim() != 4 or lists is None or not isinstance(groups, int):
        return None
    return (w, *lists)


def _conv_args(gm, node, device, dtype):
    """(x, weight, bias, stride, padding, dilation, groups, act, cudnn, weight tensor) or None when unresolvable."""
    from explorer.kernels import conv_epilogue as ce

    x, weight, bias, stride, padding, dilation, groups, act = (
        node.args[0], node.args[1], node.args[2], *node.args[-5:])
    geometry = _conv_geometry(gm, weight, stride, padding, dilation, groups)
    if geometry is None or (act not in _INPLACE and act != "none"):
        return None
    w, stride, padding, dilation = geometry
    cudnn = ce.cudnn_fusion_applies(act, device, dtype, 4, padding)
    return (x, weight, bias, stride, padding, dilation, groups, act, cudnn, w)


def _conv_bn(gm, node, device, dtype) -> bool:
    """fused_conv_bn (BatchNorm already folded into the weight) → ``conv2d``."""
    x, weight, bias, stride, padding, dilation, groups = node.args
    geometry = _conv_geometry(gm, weight, stride, padding, dilation, groups)
    if geometry is None:
        return False
    _, stride, padding, dilation = geometry
    return _replace(gm, node, lambda g: g.call_function(
        torch.conv2d, (x, weight, bias, stride, padding, dilation, groups)))


def _conv_act(gm, node, device, dtype) -> bool:
    """fused_conv(_bn)_act → ``torch.cudnn_convolution_relu`` or ``conv2d`` + the activation in place."""
    resolved = _conv_args(gm, node, device, dtype)
    if resolved is None:
        return False
    x, w, b, stride, padding, dilation, groups, act, cudnn, _ = resolved
    if cudnn:
        return _replace(gm, node, lambda g: g.call_function(
            torch.cudnn_convolution_relu, (x, w, b, stride, padding, dilation, groups)))
    return _replace(gm, node, lambda g: _in_place(
        g, g.call_function(torch.conv2d, (x, w, b, stride, padding, dilation, groups)), act))


def _conv_add_act(gm, node, device, dtype) -> bool:
    """fused_conv(_bn)_add_act → ``torch.cudnn_convolution_add_relu`` or conv2d, ``add_`` and the activation."""
    from explorer.kernels import conv_epilogue as ce

    resolved = _conv_args(gm, node, device, dtype)
    if resolved is None:
        return False
    x, w, b, stride, padding, dilation, groups, act, cudnn, weight = resolved
    z = node.args[3]
    x_shape, z_shape = _shape(x), _shape(z)
    if x_shape is None or z_shape is None:
        return False
    out_shape = ce._conv_out_shape(torch.empty(x_shape, device="meta"), weight, stride, padding, dilation)
    if cudnn and tuple(out_shape) == z_shape:  # z floating like x: both in ``dtype`` after prepare_graph
        return _replace(gm, node, lambda g: g.call_function(
            torch.cudnn_convolution_add_relu, (x, w, z, 1.0, b, stride, padding, dilation, groups)))
    return _conv_separate_nodes(gm, node, x, w, b, z, stride, padding, dilation, groups, act)


def _conv_separate(gm, node, device, dtype) -> bool:
    """fused_conv_separate_epilogue → conv2d, ``add_`` (with a residual) and the activation in place."""
    x, w, b, z = node.args[:4]
    resolved = _conv_args(gm, node, device, dtype)
    if resolved is None:
        return False
    _, _, _, stride, padding, dilation, groups, act, _, _ = resolved
    return _conv_separate_nodes(gm, node, x, w, b, z, stride, padding, dilation, groups, act)


def _conv_separate_nodes(gm, node, x, w, b, z, stride, padding, dilation, groups, act) -> bool:
    def build(g: torch.fx.Graph) -> torch.fx.Node:
        y = g.call_function(torch.conv2d, (x, w, b, stride, padding, dilation, groups))
        if z is not None:
            y = g.call_method("add_", (y, z))
        return _in_place(g, y, act)

    return _replace(gm, node, build)


def _linear_act(gm, node, device, dtype) -> bool:
    """fused_linear_act → one ``torch._addmm_activation`` (cuBLASLt epilogue) or ``linear`` + the activation."""
    from explorer.kernels import linear_act as la

    x, weight, bias, act = node.args
    w = _attr(gm, weight)
    x_shape = _shape(x)
    if w is None or w.dim() != 2 or x_shape is None or act not in la.LINEAR_ACTIVATIONS:
        return False
    use_gelu = la._lt_epilogue(act, device, dtype, w.shape[1], w.shape[0])
    if use_gelu is None:
        return _linear_separate(gm, node, device, dtype)
    b = _attr(gm, bias)
    if b is None or b.dim() != 1 or not b.is_contiguous() or 0 in x_shape:
        return False  # the generic target handles these (a zero bias, a cast, an empty input)
    name = _weight_t(gm, weight, w)

    def build(g: torch.fx.Graph) -> torch.fx.Node:
        x2 = g.call_function(torch.reshape, (x, [-1, x_shape[-1]]))                      # (rows, in)
        wt = g.get_attr(name)                                                           # (in, out) view
        y = g.call_function(torch._addmm_activation, (bias, x2, wt), {"use_gelu": use_gelu})
        return g.call_function(torch.reshape, (y, [*x_shape[:-1], w.shape[0]]))

    return _replace(gm, node, build)


def _linear_separate(gm, node, device, dtype) -> bool:
    """fused_linear(_act|_separate_epilogue) → ``linear`` then the activation in place."""
    x, weight, bias, act = node.args
    if act != "none" and act not in _INPLACE:
        return False
    return _replace(gm, node, lambda g: _in_place(g, g.call_function(torch._C._nn.linear, (x, weight, bias)), act))


def _linear_siblings(gm, node, device, dtype) -> bool:
    """fused_linear_siblings → ``linear`` over the concatenated weights, then ``split_with_sizes`` (column views)."""
    x, weight, bias, sizes = node.args
    return _replace(gm, node, lambda g: g.call_function(
        torch.split_with_sizes, (g.call_function(torch._C._nn.linear, (x, weight, bias)), list(sizes), -1)))


def _weight_t(gm: torch.fx.GraphModule, weight: torch.fx.Node, w: torch.Tensor) -> str:
    """A root attribute holding ``w.t()`` (a view: no copy), for cuBLASLt's (in, out) operand."""
    name = "_lean_t_" + str(weight.target).replace(".", "_")
    if not hasattr(gm, name):
        gm.register_buffer(name, w.t(), persistent=False)
    return name
