"""Make a prepared graph cheap to run on the host: resolve each call once, not at every forward.

Without CUDA graphs a BERT-base or ResNet-50 forward at batch 32 is bound by
the host, not the GPU (see ``benchmarks/results/graph_host_*.json``): what a
call costs in Python and in PyTorch's dispatcher decides the latency. Two kinds
of call in a captured graph pay for work that could be done once:

- **ATen calls through ``OpOverload``** (``torch.ops.aten.view.default``).
  torch.export writes every op so; each call goes through a schema-driven
  argument parser that costs more host time than the public binding of the same
  op (``torch.transpose``, ``Tensor.view``; measured in
  ``benchmarks/results/host_overhead_lean_h200.json``).
  ``lower_aten_calls`` swaps the target for the public binding where the two
  take the same arguments in the same order. It is the same ATen kernel either
  way: outputs are bitwise equal (tested per op).
- **The explorer's fused call targets** (``fused_*`` in each family module of
  ``explorer.fusions``) choose at every call which kernel applies: cuDNN's fused
  conv+bias+ReLU or the conv and an in-place activation, cuBLASLt's epilogue or
  a GEMM and an in-place GELU. That choice depends only on what a prepared graph
  fixes (device, dtype, activation, shapes), so ``specialize_fused_calls`` takes
  it here, once, through each family's lowering (which asks the family's one
  kernel selection), and the node calls the library function directly. The
  kernels run are exactly the ones the generic target would have run; where a
  condition cannot be read from the graph (no shape metadata, an unusual
  argument), the node is left alone.

A third, smaller cost: a weight read as ``self.<name>`` goes through
``nn.Module.__getattr__`` (parameters and buffers are not instance attributes),
about twice a plain attribute read (same JSON), and BERT-base reads about 200
per forward. ``pin_attrs`` makes each read a plain
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

from typing import Any

import torch
import torch.fx

from explorer.fusions import LOWERINGS
from explorer.graph.aten import attr_value

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
        value = attr_value(gm, node.target)
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

def specialize_fused_calls(gm: torch.fx.GraphModule, device: torch.device | str, dtype: torch.dtype) -> int:
    """Replace each fused call target by the library calls it would take on ``device`` in ``dtype``.

    Each family declares its lowerings (``explorer.fusions.LOWERINGS``); a
    lowering asks the family's one kernel selection, so the graph runs what the
    generic target would have chosen at every call. ``gm`` must already hold its
    tensors on ``device`` with floating ones in ``dtype`` (as ``prepare_graph``
    leaves it). Edits ``gm`` in place and returns how many fused calls were lowered.
    """
    device = torch.device(device)
    changed = 0
    for node in list(gm.graph.nodes):
        if node.op == "call_function" and not node.kwargs:
            lower = LOWERINGS.get(node.target)
            if lower is not None and lower(gm, node, device, dtype):
                changed += 1
    if changed:
        gm.graph.eliminate_dead_code()
        gm.graph.lint()
        gm.recompile()
    return changed
