"""The operators a graph read from a file may run: an allowlist of pure tensor computations.

A ``.pt2`` archive names its operators by string, and every ATen operator
resolves: ``aten.from_file(path, shared=True, size)`` maps any file the user
can write, and ``fill_``/``copy_`` then write it. A blocklist of such operators
would always be one operator short, so this module lists what is allowed
instead, by target **and** overload (``aten.add.Tensor``, not ``aten.add``):
the operators that the zoo, torchvision, timm and transformers exports (the
training IR ``torch.export.export`` writes, its core-ATen decomposition, and
the module ``ExportedProgram.module()`` unlifts) and the ONNX importer
produce, each one a function of its tensor arguments with no effect outside
its outputs. Nothing that opens files, touches storages, the allocator or the
RNG state is on it; an ``empty``-family allocation is not either (its contents
are whatever the allocator held), the initialised ones (``full``, ``zeros``,
``arange``) are, and their sizes are derived and counted like every other
value's (``pt2.derive_shapes``).

Three rules refine the list, each checked per node by ``check_graph_ops``:

- an operator that writes into an argument (a ``Tensor(a!)`` in its schema:
  ``relu_``, ``add_``, ``index_copy_``) may write only into a value the graph
  computed itself, or a view of one (``_owned``): never into a placeholder
  (the user's inputs), a weight, a buffer or a constant. ``detach_`` is one:
  it changes no value, only the autograd metadata of its argument (which an
  inference run has none of), and transformers' ``DynamicCache.update``
  writes it on the fresh copy of an empty cache when a decoder is exported
  with its default ``use_cache=True``: allowed on such a value, refused on an
  input or a weight like every other write;
- an operator tagged ``nondeterministic_seeded`` is allowed only where an
  argument guard proves it deterministic (``dropout(x, p, train=False)``,
  ``scaled_dot_product_attention`` with ``dropout_p=0``: ``GUARDS``);
- higher-order operators (``torch.ops.higher_order.*``, such as
  ``wrap_with_autocast``) are refused by name: they carry subgraphs and
  change how their bodies run.

Two more kinds of operator are allowed, each proven safe by what runs, not by
what the file says:

- custom operators of a known library (``LIBRARY_OPS``: transformers'
  ``grouped_mm_fallback``, which its Mixtral-style MoE exports): the file
  names the operator only; what runs is the implementation the library
  registers when it is imported (``library_op``), from the installed
  package, never code from the file. The library must be installed here and
  the operator's schema must write nothing; otherwise the operator is refused
  with its name and the library's;
- ``empty_like``, whose contents are whatever the allocator held, is allowed
  only because ``initialise_allocations`` replaces it by ``zeros_like``
  before anything runs (the MoE's inverse permutation fills it whole with
  ``index_put_``; a graph that does not gets zeros, never stale memory).

``refusal(node) -> str | None`` says why one node is refused;
``check_graph_ops(gm, name)`` raises one ``ModelLoadError`` line naming the
first refused operator. ``tests/test_security_ops.py`` proves every zoo
model's and several torchvision models' operators are on the list, and that
every operator of this torch's registry with a side effect is refused.
"""

from __future__ import annotations

import operator
from typing import Any, Callable

from explorer.errors import ModelLoadError

#: Pure ATen operators, as ``namespace.name.overload``.
PURE_ATEN = frozenset("""
aten.__and__.Tensor aten.__or__.Tensor aten._assert_scalar.default aten._adaptive_avg_pool2d.default aten._assert_tensor_metadata.default
aten._log_softmax.default aten._native_batch_norm_legit_no_training.default aten._softmax.default
aten._to_copy.default aten.abs.default aten.adaptive_avg_pool1d.default aten.adaptive_avg_pool2d.default
aten.add.Scalar aten.add.Tensor aten.addcmul.default aten.addmm.default aten.alias.default aten.amax.default aten.amin.default
aten.any.dim aten.arange.default aten.arange.start aten.arange.start_step aten.argmax.default
aten.as_strided.default aten.atan.default aten.avg_pool1d.default aten.avg_pool2d.default
aten.avg_pool3d.default aten.baddbmm.default aten.batch_norm.default aten.bitwise_and.Tensor
aten.bitwise_not.default aten.bitwise_or.Tensor aten.bmm.default aten.bucketize.Tensor aten.cat.default
aten.ceil.default aten.channel_shuffle.default aten.chunk.default aten.clamp.default aten.clamp_max.default
aten.clamp_min.default aten.clone.default aten.constant_pad_nd.default aten.contiguous.default
aten.conv1d.default aten.conv2d.default aten.conv3d.default aten.conv_transpose2d.input
aten.convolution.default aten.copy.default aten.cos.default aten.cumprod.default aten.cumsum.default
aten.diff.default aten.div.Scalar aten.div.Tensor aten.div.Tensor_mode aten.einsum.default
aten.elu.default aten.embedding.default aten.eq.Scalar aten.eq.Tensor aten.erf.default aten.erfinv.default
aten.exp.default aten.exp2.default aten.expand.default aten.expand_as.default aten.expm1.default
aten.flatten.using_ints aten.flip.default aten.floor.default aten.floor_divide.default aten.fmod.Scalar
aten.fmod.Tensor aten.full.default aten.full_like.default aten.gather.default aten.ge.Scalar aten.ge.Tensor
aten.gelu.default aten.group_norm.default aten.histc.default aten.scatter.src aten.scatter_add.default aten.scatter_reduce.two aten.gt.Scalar aten.gt.Tensor aten.hardsigmoid.default
aten.hardswish.default aten.hardtanh.default aten.index.Tensor aten.index_put.default aten.index_put_.default
aten.index_select.default aten.instance_norm.default aten.isnan.default aten.layer_norm.default
aten.le.Scalar aten.le.Tensor aten.leaky_relu.default aten.lift_fresh_copy.default aten.linalg_vector_norm.default
aten.linear.default aten.log.default aten.log1p.default aten.log2.default aten.log_softmax.int
aten.logical_and.default aten.logical_not.default aten.logical_or.default aten.logical_xor.default
aten.lt.Scalar aten.lt.Tensor aten.masked_fill.Scalar aten.masked_fill.Tensor aten.matmul.default
aten.max.dim aten.max_pool1d.default aten.max_pool2d.default aten.max_pool2d_with_indices.default
aten.max_pool3d.default aten.maximum.default aten.mean.default aten.mean.dim aten.min.dim aten.minimum.default
aten.min.other aten.max.other
aten.mish.default aten.mm.default aten.mul.Scalar aten.mul.Tensor aten.narrow.default
aten.native_channel_shuffle.default aten.native_group_norm.default aten.native_layer_norm.default
aten.ne.Scalar aten.ne.Tensor aten.neg.default aten.new_ones.default aten.new_zeros.default aten.ones.default
aten.ones_like.default aten.pad.default aten.permute.default aten.pixel_shuffle.default aten.pow.Scalar
aten.pow.Tensor_Scalar aten.pow.Tensor_Tensor aten.prod.dim_int aten.reciprocal.default aten.relu.default
aten.relu6.default aten.remainder.Scalar aten.remainder.Tensor aten.repeat.default
aten.repeat_interleave.self_int aten.reshape.default aten.rms_norm.default aten.roll.default aten.round.default
aten.rsqrt.default aten.rsub.Scalar aten.rsub.Tensor aten.scalar_tensor.default aten.select.int
aten.sigmoid.default aten.sign.default aten.silu.default aten.sin.default aten.slice.Tensor
aten.slice_scatter.default aten.softmax.int aten.softplus.default aten.sort.default aten.split.Tensor
aten.split_with_sizes.default aten.sqrt.default aten.squeeze.default aten.squeeze.dim aten.squeeze.dims
aten.stack.default aten.std.correction aten.sub.Scalar aten.sub.Tensor aten.sum.default aten.sum.dim_IntList
aten.swapaxes.default aten.sym_numel.default aten.sym_size.int aten.sym_stride.int aten.t.default
aten.tanh.default aten.tile.default aten.to.device aten.to.dtype aten.to.dtype_layout aten.topk.default
aten.transpose.int aten.tril.default aten.triu.default aten.type_as.default aten.unbind.int aten.unflatten.int
aten.unfold.default aten.unsqueeze.default aten.upsample_bicubic2d.vec aten.upsample_bilinear2d.vec
aten.upsample_linear1d.vec aten.upsample_nearest1d.vec aten.upsample_nearest2d.vec aten.upsample_nearest3d.vec
aten.upsample_trilinear3d.vec aten.var.correction aten.var_mean.correction aten.view.default aten.view_as.default aten.reshape_as.default aten.numpy_T.default
aten.where.Scalar aten.where.ScalarOther aten.where.ScalarSelf aten.where.self aten.zeros.default
aten.zeros_like.default
aten.dropout.default aten.feature_dropout.default aten.alpha_dropout.default
aten.scaled_dot_product_attention.default
aten.add_.Scalar aten.add_.Tensor aten.clamp_.default aten.div_.Tensor aten.dropout_.default aten.fill_.Scalar
aten.fill_.Tensor aten.gelu_.default aten.hardsigmoid_.default aten.hardswish_.default aten.hardtanh_.default
aten.index_copy_.default aten.leaky_relu_.default aten.masked_fill_.Scalar aten.mul_.Scalar aten.mul_.Tensor
aten.relu_.default aten.sigmoid_.default aten.silu_.default aten.sub_.Tensor aten.tanh_.default aten.zero_.default
aten.detach_.default
""".split())

#: Python functions fx graphs call on sizes and on multi-output nodes (pure, on ints and tuples).
PURE_PYTHON: dict[str, Callable] = {
    "_operator.getitem": operator.getitem, "_operator.add": operator.add, "_operator.sub": operator.sub,
    "_operator.mul": operator.mul, "_operator.floordiv": operator.floordiv, "_operator.mod": operator.mod,
    "_operator.neg": operator.neg,
}


def _literal(value: Any, *allowed: Any) -> bool:
    return not hasattr(value, "op") and any(value == a and type(value) is type(a) for a in allowed)


def _argument(node: Any, schema: Any, name: str, default: Any) -> Any:
    for i, arg in enumerate(schema.arguments):
        if arg.name == name:
            if i < len(node.args):
                return node.args[i]
            return node.kwargs.get(name, default)
    return default


#: Argument guards of the seeded (RNG-drawing) operators on the list: each returns why the node is
#: refused, or None when its arguments make it deterministic.
GUARDS: dict[str, Callable[[Any, Any], str | None]] = {
    **{key: (lambda node, schema: None if _literal(_argument(node, schema, "train", None), False)
             else "it draws random numbers unless train=False") for key in (
        "aten.dropout.default", "aten.feature_dropout.default", "aten.alpha_dropout.default",
        "aten.dropout_.default")},
    "aten.scaled_dot_product_attention.default": lambda node, schema: None if _literal(
        _argument(node, schema, "dropout_p", 0.0), 0.0, 0) else "it draws random numbers unless dropout_p=0",
}


#: Custom operators of known libraries, by key: the module whose import registers the operator's implementation.
LIBRARY_OPS: dict[str, str] = {
    "transformers.grouped_mm_fallback.default": "transformers.integrations.moe",
}

#: Allocations whose contents are undefined, allowed in a file because ``initialise_allocations`` zeroes them.
ZEROED = {"aten.empty_like.default": "zeros_like"}

_LIBRARY_CACHE: dict[str, Any] = {}


def library_op(key: str) -> Any:
    """The ``OpOverload`` a known library registers for ``key`` (``LIBRARY_OPS``), importing the library's module
    (the installed package's code) once; None when the library is not installed, the operator is not registered
    there, or its schema writes an argument."""
    if key in _LIBRARY_CACHE:
        return _LIBRARY_CACHE[key]
    import importlib
    import importlib.util

    import torch

    op = None
    module = LIBRARY_OPS.get(key)
    namespace, name, overload = key.split(".")
    try:
        if module is not None and importlib.util.find_spec(module.split(".")[0]) is not None:
            importlib.import_module(module)
            packet = getattr(getattr(torch.ops, namespace), name, None)
            op = getattr(packet, overload, None) if packet is not None else None
    except Exception:  # a broken install: the operator is refused, with its name
        op = None
    if op is not None and any(a.alias_info is not None and a.alias_info.is_write for a in op._schema.arguments):
        op = None
    _LIBRARY_CACHE[key] = op
    return op


def _library_refusal(key: str) -> str | None:
    if library_op(key) is not None:
        return None
    library = LIBRARY_OPS[key].split(".")[0]
    return (f"the program calls the custom operator {key}, which only {library} implements, and {library} is not "
            f"installed here (or does not register it); refused")


def initialise_allocations(gm: Any) -> int:
    """Replace every undefined-contents allocation (``ZEROED``: ``empty_like``) of fx graph ``gm`` by its zeroed
    twin, in place, before anything runs; returns how many. The graph's result is unchanged wherever it writes the
    allocation before reading it."""
    import torch

    done = 0
    for node in gm.graph.nodes:
        if node.op == "call_function" and key_of(node.target) in ZEROED:
            node.target = getattr(torch.ops.aten, ZEROED[key_of(node.target)]).default
            done += 1
    if done:
        gm.recompile()
    return done


def key_of(target: Any) -> str:
    """``namespace.name.overload`` of an ``OpOverload``, ``_operator.name`` of a Python operator, else ``str``."""
    import torch

    if isinstance(target, torch._ops.OpOverload):
        return f"{target.namespace}.{target._schema.name.split('::', 1)[-1]}.{target._overloadname}"
    module = getattr(target, "__module__", None)
    if module in ("_operator", "operator") and hasattr(target, "__name__"):
        return f"_operator.{target.__name__}"
    return str(target)


def json_target_refusal(target: str) -> str | None:
    """Why a node target as a ``.pt2`` program JSON spells it (``torch.ops.aten.add.Tensor``,
    ``_operator.getitem``) is refused, or None. Checked before torch's deserializer resolves it."""
    if target in PURE_PYTHON:
        return None
    if target.startswith("torch.ops.higher_order."):
        return (f"the program uses the higher-order operator {target[:80]}, which the explorer does not run "
                "(export without autocast or other wrapped regions); refused")
    key = target.removeprefix("torch.ops.")
    if target.startswith("torch.ops.") and (key in PURE_ATEN or key in ZEROED):
        return None
    if target.startswith("torch.ops.") and key in LIBRARY_OPS:
        return _library_refusal(key)
    return (f"the program calls {key[:100]}, which is not on the explorer's list of pure tensor operations "
            "(files, storages, the allocator, the RNG state and side effects are refused)")


def _mutated(node: Any, schema: Any) -> list[tuple[str, Any]]:
    out = []
    for i, arg in enumerate(schema.arguments):
        if arg.alias_info is not None and arg.alias_info.is_write:
            value = node.args[i] if i < len(node.args) else node.kwargs.get(arg.name)
            out.append((arg.name, value))
    return out


def _aliased_source(value: Any) -> Any:
    """The argument a view or in-place node ``value`` aliases, or None for a fresh value."""
    import torch

    if getattr(value, "op", None) != "call_function":
        return None
    target = value.target
    if target is operator.getitem:
        return value.args[0] if value.args else None
    if not isinstance(target, torch._ops.OpOverload):
        return None
    sets = {a for r in target._schema.returns if r.alias_info is not None for a in r.alias_info.before_set}
    for i, arg in enumerate(target._schema.arguments):
        if arg.alias_info is not None and set(arg.alias_info.before_set) & sets:
            return value.args[i] if i < len(value.args) else value.kwargs.get(arg.name)
    return None


def _root_kind(value: Any) -> str:
    """What a written value is, seen through views: "an input", "a weight or constant", ..."""
    for _ in range(10_000):
        source = _aliased_source(value)
        if source is None:
            break
        value = source
    return {"placeholder": "an input", "get_attr": "a weight or constant"}.get(
        getattr(value, "op", None), "a value the graph did not compute")


def _owned(value: Any, memo: dict) -> bool:
    """Whether ``value`` (an fx node) is a tensor this graph computed, or a view or in-place result of one:
    never a placeholder, weight, buffer or constant (``get_attr``), nor a view of one."""
    import torch

    if not hasattr(value, "op"):
        return False
    if value in memo:
        return memo[value]
    memo[value] = False  # a cycle cannot occur in an fx graph; this only stops a malformed one
    owned = False
    if value.op == "call_function":
        target = value.target
        if target is operator.getitem and value.args and hasattr(value.args[0], "op"):
            owned = _owned(value.args[0], memo)
        elif isinstance(target, torch._ops.OpOverload):
            schema = target._schema
            returns = [r.alias_info for r in schema.returns]
            if all(info is None for info in returns):
                owned = True
            else:  # a view or an in-place result: owned when what it aliases is
                sets = {a for info in returns if info is not None for a in info.before_set}
                owned = True
                for i, arg in enumerate(schema.arguments):
                    if arg.alias_info is not None and set(arg.alias_info.before_set) & sets:
                        source = value.args[i] if i < len(value.args) else value.kwargs.get(arg.name)
                        owned = owned and _owned(source, memo)
    memo[value] = owned
    return owned


def refusal(node: Any, memo: dict | None = None) -> str | None:
    """Why the fx ``node`` may not run, or None. ``memo`` caches ownership across one graph's nodes."""
    import torch

    memo = {} if memo is None else memo
    if node.op in ("call_module", "call_method"):
        return f"the graph calls {node.op} '{str(node.target)[:80]}', which is refused"
    if node.op != "call_function":
        return None
    target = node.target
    if isinstance(target, torch._ops.OpOverloadPacket):  # the ONNX importer's own calls: resolved by name
        target = getattr(target, "default", None)
        if target is None:
            return f"the graph calls {node.target}, an operator without a default overload; refused"
    key = key_of(target)
    if key in PURE_PYTHON and PURE_PYTHON[key] is target:
        return None
    if isinstance(target, torch._ops.OpOverload) and key in LIBRARY_OPS:
        if library_op(key) is not target:
            return _library_refusal(key) or f"the graph calls {key}, not the implementation its library registers"
        return None
    if isinstance(target, torch._ops.HigherOrderOperator):
        return (f"the graph uses the higher-order operator {key[:80]}, which the explorer does not run "
                "(export without autocast or other wrapped regions)")
    if not isinstance(target, torch._ops.OpOverload) or key not in PURE_ATEN:
        return (f"the graph calls {key[:100]}, which is not on the explorer's list of pure tensor operations "
                "(files, storages, the allocator, the RNG state and side effects are refused)")
    schema = target._schema
    guard = GUARDS.get(key)
    if guard is not None:
        why = guard(node, schema)
        if why:
            return f"the graph calls {key}, refused because {why}"
    elif torch.Tag.nondeterministic_seeded in target.tags:
        return f"the graph calls {key}, which draws random numbers; refused"
    for arg_name, value in _mutated(node, schema):
        if not _owned(value, memo):
            what = _root_kind(value)
            return f"the graph calls {key}, which writes its argument '{arg_name}' into {what}; refused"
    return None


def check_graph_ops(gm: Any, name: str) -> None:
    """Raise one ``ModelLoadError`` line naming the first node of fx graph ``gm`` that may not run."""
    memo: dict = {}
    for node in gm.graph.nodes:
        why = refusal(node, memo)
        if why:
            raise ModelLoadError(f"{name}: {why}")
