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

A fourth: values that depend on no input. A decoder recomputes its rotary
angles at every forward (``arange`` → ``matmul`` with the inverse frequencies →
``cat`` → ``cos``/``sin`` → casts: ten launches for two small tensors that are
the same at every call of a prepared graph, whose sequence length is fixed).
``fold_constants`` computes such values once, with the same ops on the same
device, and the graph reads the result as an attribute.

A fifth, on CUDA graphs (``prepare_graph`` runs these after the others): a node's call is bound once, at its
first call, to what that call resolved to. ``bind_calls``: each Triton-only fused call
(``triton_support.BoundCall``) records its launches, allocations and outputs and later replays them (an input
check, the allocations, one C launch per kernel), where the generic call selected, built keys, looked plans up
and read the environment at every call. ``bind_attention``: each SDPA call (and the attention family's masked
one) calls the backend op the dispatcher picked for it. ``bind_linears``: each linear on a contiguous input calls
the ``mm``/``addmm`` ATen's ``linear`` runs for it. Each keeps its bound path only where the first call's
outputs are the generic call's bit for bit, and takes the generic call whenever an input differs from the
recorded one; ``unbind`` puts a graph back. ``prepare_graph`` applies those of them that measured cheaper
(``DEFAULT_BINDS``: today the fused calls only; attention and linears bound cost host time or saved none).

A sixth, on every device: the nodes that launch nothing. ``collapse_views`` makes each tree of view-like nodes
read from one tensor one call (``BoundViews``: an ``as_strided`` per view the graph reads, bound at the first
call where those views share the root's storage), and ``drop_noop_detach`` drops the ``detach_`` of a constant
without autograd state. GPT-2-medium's fused graph goes from 223 nodes to 170, BERT-base's from 418 to 321.

A seventh, on every device, on by default since the H200 measured it (``Binds.empty_cats``; ``DEFAULT_BINDS`` says
the run): transformers' key/value cache
starts as an empty constant that each attention ``cat``s its key and value onto (8 copies per GPT-2-medium
forward, 4 layers). ``pass_empty_cats`` makes each such ``cat`` return its one operand (``PassEmptyCat``, bound at
the first call where the result keeps the operand's dtype and shape), only where the cat is not an output and
nothing between it and its last reader writes (the readers see the operand's strides instead of a contiguous
copy: the bench checks the outputs bit for bit on the GPU too).

An eighth, on every device, off because the H200 measured no gain (``Binds.addmm_linears``): transformers' ``Conv1D``
(GPT-2's projections) writes ``x.view(-1, nx)``, ``addmm``, then a view back; ``addmm_as_linear`` makes that one
``linear`` on a transposed view of the weight, which ATen runs as the same ``addmm`` on the same flattened view, in
C++ (GPT-2-medium layers at 1 × 128: 8 fewer ATen calls a forward in the fused graph, 20 in the unfused one, bit for
bit: ``benchmarks/results/check_host_frames.json``). On the H200, GPT-2-medium layers at 4 × 1024 bf16, the plain
calls took 1.713 ms with it against 1.685 without (no significant difference: ``bench_host_path_addmm_h200.json``).

A ninth, on every device, on by default (``Binds.heads``, ``explorer.runtime.lean_heads``): ``nn.MultiheadAttention``
with ``batch_first=True`` (torchvision's ViTs) runs sequence-first inside, and its head split and gather copy the
activations three times a layer (the input's rows inside ``linear``, the packed Q/K/V's ``contiguous``, the heads'
``reshape`` before the out-projection). ``batch_first_heads`` computes the same rows through the same ATen ops in
batch-first order, Q, K and V as views of the in-projection: bit for bit on the CPU (ViT-B/32's unfused graph at
batch 2: 85 copies a forward to 37, 367 ATen calls to 283, ``benchmarks/results/check_host_frames.json``).

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

import collections
import copy
import dataclasses
import math
import operator

import torch
import torch.fx

from explorer.fusions import BOUND_CALLS, LOWERINGS
from explorer.runtime.lean_heads import batch_first_heads
from explorer.runtime.lean_heads import op_name as _target_name
from explorer.fusions import attention as attention_family
from explorer.fusions.edit import attr_tensor, set_aside_for
from explorer.fusions.triton_support import BoundCall
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
    aten.to.dtype: ("method", "to"),      # (dtype, non_blocking, copy, memory_format): Tensor.to's order
    aten.addmm.default: ("function", torch.addmm),
    aten.pow.Tensor_Scalar: ("function", torch.pow),
    aten.tanh.default: ("function", torch.tanh),
    aten.neg.default: ("function", torch.neg),
    aten.rsqrt.default: ("function", torch.rsqrt),
    aten.mean.dim: ("function", torch.mean),
    aten.where.ScalarOther: ("function", torch.where),
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

def specialize_fused_calls(gm: torch.fx.GraphModule, device: torch.device | str, dtype: torch.dtype,
                           memory_format: str | None = None) -> int:
    """Replace each fused call target by the library calls it would take on ``device`` in ``dtype``.

    Each family declares its lowerings (``explorer.fusions.LOWERINGS``); a
    lowering reads the choice the rewrite recorded for this target (else asks the
    family's one kernel selection), so the graph runs what the generic target
    would have chosen at every call; a family whose fused call would decide at run
    time is handed the choice instead. ``gm`` must already hold its
    tensors on ``device`` with floating ones in ``dtype`` (as ``prepare_graph``
    leaves it); ``memory_format`` (``nchw`` or ``channels_last``, as prepared; None:
    not known) sets aside the choices recorded for the other one (``edit.set_aside_for``).
    Edits ``gm`` in place and returns how many fused calls were lowered.
    """
    device = torch.device(device)
    changed = 0
    for node in list(gm.graph.nodes):
        if node.op == "call_function" and not node.kwargs:
            lower = LOWERINGS.get(node.target)
            if lower is not None and memory_format is not None:
                set_aside_for(node, memory_format)
            if lower is not None and lower(gm, node, device, dtype):
                changed += 1
    if changed:
        gm.graph.eliminate_dead_code()
        gm.graph.lint()
        gm.recompile()
    return changed


def bind_calls(gm: torch.fx.GraphModule, targets: frozenset | None = None) -> int:
    """Give each node whose target is a Triton-only fused call (``explorer.fusions.BOUND_CALLS``, or ``targets``)
    its own ``triton_support.BoundCall``: planned once, at its first call, then outputs allocated and kernels
    launched with nothing else per call (see ``BoundCall``). Run after ``specialize_fused_calls`` (which
    chooses the targets); ``prepare_graph`` does it for CUDA graphs. Edits ``gm`` in place and returns how many
    nodes were bound.
    """
    targets = BOUND_CALLS if targets is None else targets
    changed = 0
    for node in gm.graph.nodes:
        if node.op == "call_function" and not node.kwargs and node.target in targets:
            node.target = BoundCall(node.target)
            changed += 1
    if changed:
        gm.recompile()
    return changed


def bound_calls(gm: torch.fx.GraphModule) -> list:
    """The graph's bound calls, in graph order (their ``replay``/``why`` say whether each is bound)."""
    return [n.target for n in gm.graph.nodes if n.op == "call_function"
            and isinstance(n.target, (BoundCall, BoundAttention, BoundMaskedAttention, BoundLinear, BoundViews))]


def audit_bound_calls(gm: torch.fx.GraphModule, inputs: tuple, forwards: int = 3) -> list[dict]:
    """Run ``gm`` (a prepared graph whose fused calls are bound: ``bind_calls``) ``forwards`` times in inference
    mode and say, per ``BoundCall`` node, whether it bound at its first call and how many of the later calls its
    replay declined, each with the reason: a node that never bound, or whose replay declines at every call,
    pays the fused call's whole Python path at every forward (``bound_calls``' states miss the second kind).

    Returns one dict per node, in graph order: ``node``, ``target`` (the generic call's name), ``state``
    (``bound``, ``generic`` or ``not called``), ``why`` (why it stays generic), ``calls`` (``forwards``),
    ``declined`` (calls after the first whose replay declined) and ``declined_why`` (``_Replay.mismatch`` on the
    node's arguments in one more forward, run through ``torch.fx.Interpreter``; None where that forward
    replayed). The counts start from the node's own (a graph already run counts on from where it was)."""
    nodes = [n for n in gm.graph.nodes if n.op == "call_function" and isinstance(n.target, BoundCall)]
    start = {n: n.target.declined for n in nodes}
    with torch.inference_mode():
        for _ in range(forwards):
            gm(*inputs)
    declined = {n: n.target.declined - start[n] for n in nodes}
    reasons: dict = {}
    if any(declined.values()):

        class _Why(torch.fx.Interpreter):
            def run_node(self, n):
                if n in declined and n.target.replay is not None:
                    args, _ = self.fetch_args_kwargs_from_env(n)
                    reasons[n] = n.target.replay.mismatch(tuple(args))
                return super().run_node(n)

        with torch.inference_mode():
            _Why(gm).run(*inputs)
        for n in nodes:
            n.target.declined = start[n] + declined[n]   # the diagnostic forward's own calls not counted
    rows = []
    for n in nodes:
        call = n.target
        state = "bound" if call.replay is not None else "generic" if call.recorded else "not called"
        rows.append(dict(node=n.name, target=call.__name__, state=state, why=call.why, calls=forwards,
                         declined=declined[n], declined_why=reasons.get(n) if declined[n] else None))
    return rows


def audit_summary(rows: list[dict]) -> dict:
    """``audit_bound_calls``' rows counted: fused (bound) nodes, how many bound, the reasons of those that did not
    (reason -> nodes), and of those whose replay declined (reason -> nodes; ``always`` of them at every call)."""
    never = collections.Counter(r["why"] or r["state"] for r in rows if r["state"] != "bound")
    declining = [r for r in rows if r["declined"]]
    return dict(fused=len(rows), bound=sum(r["state"] == "bound" for r in rows), never_bound=dict(never),
                declining=dict(collections.Counter(r["declined_why"] or "not reproduced" for r in declining)),
                always_declining=sum(r["declined"] >= r["calls"] - 1 for r in declining))


def unbind(gm: torch.fx.GraphModule) -> int:
    """Put every bound node of ``gm`` back on its generic call (``BoundCall``'s target; the public SDPA call with
    the node's arguments): the graph as it was before ``bind_calls``/``bind_attention``/``bind_linears``.
    ``collapse_views``'s trees stay (prepare with ``binds=lean.NO_BINDS`` for a graph without them). Returns how
    many."""
    changed = 0
    for node in gm.graph.nodes:
        target = node.target if node.op == "call_function" else None
        if isinstance(target, BoundCall):
            node.target = target.generic
        elif isinstance(target, BoundMaskedAttention):
            node.target = attention_family.fused_attention
        elif isinstance(target, BoundLinear):
            node.target = torch._C._nn.linear
            node.args = node.args if target.had_bias_arg else node.args[:2]
        elif isinstance(target, BoundAttention):
            node.target = torch._C._nn.scaled_dot_product_attention
            node.args = (*node.args, None, 0.0, target.is_causal)
            node.kwargs = dict(scale=target.scale, enable_gqa=target.enable_gqa)
        else:
            continue
        changed += 1
    if changed:
        gm.recompile()
    return changed


# ------------------------------------------------------------------ attention bound to its backend

#: SDPBackend values of ``torch._fused_sdp_choice`` (``torch.nn.attention.SDPBackend``) that ``BoundAttention``
#: calls directly, and the public binding of each backend's op.
_SDP_FLASH, _SDP_EFFICIENT, _SDP_CUDNN = 1, 2, 3


def _capturing(t: torch.Tensor) -> bool:
    """Whether a CUDA graph is being captured on the current stream: a first call then binds nothing (its
    comparison would synchronise); it binds at a later call outside the capture."""
    return t.is_cuda and torch.cuda.is_current_stream_capturing()


def _public_sdpa(q, k, v, is_causal, scale, enable_gqa):
    return torch._C._nn.scaled_dot_product_attention(q, k, v, None, 0.0, is_causal, scale=scale, enable_gqa=enable_gqa)


class BoundAttention:
    """One SDPA node (no mask, no dropout) bound to the backend the dispatcher picks for it.

    ``scaled_dot_product_attention`` asks ``_fused_sdp_choice`` at every call which backend runs (a dozen checks
    of shapes, strides, dtypes and device properties), then calls that backend's op. A prepared graph's
    shapes are fixed, so at the first call on CUDA this asks ``torch._fused_sdp_choice`` once, calls the chosen
    op (flash, memory-efficient or cuDNN attention) exactly as ``scaled_dot_product_attention`` calls it (no mask;
    flash with the head dim's scale computed as PyTorch computes it, only where the head dim needs no padding),
    and keeps the op only where its output equals the public call's bit for bit and in layout on these inputs;
    later calls whose q, k, v have the recorded shapes, strides, dtype and device call it directly, others
    (and calls autograd records) the public SDPA. On the CPU: always the public call. ``why`` says why a node
    kept the public call; ``backend`` names the op taken.
    """

    def __init__(self, is_causal: bool, scale: float | None, enable_gqa: bool = False) -> None:
        self.is_causal, self.scale, self.enable_gqa = bool(is_causal), scale, bool(enable_gqa)
        # not torch's own module name: fx would then emit a call of torch's function by its qualified name
        self.__name__ = self.__qualname__ = "bound_scaled_dot_product_attention"
        self.__module__ = __name__
        self.op: Any = None
        self.backend: str | None = None
        self.checks: tuple | None = None
        self.recorded = False
        self.why: str | None = None

    def generic(self, q, k, v):
        """The public call with this node's arguments."""
        return _public_sdpa(q, k, v, self.is_causal, self.scale, self.enable_gqa)

    def __repr__(self) -> str:
        state = f"bound: {self.backend}" if self.op is not None else f"generic: {self.why}" if self.why else "new"
        return f"BoundAttention({state})"

    def __deepcopy__(self, memo) -> "BoundAttention":
        return BoundAttention(self.is_causal, self.scale, self.enable_gqa)

    def __reduce__(self):
        return (BoundAttention, (self.is_causal, self.scale, self.enable_gqa))

    def __call__(self, q, k, v):
        op = self.op
        if op is not None:
            checks = self.checks
            if (q.shape == checks[0] and k.shape == checks[1] and v.shape == checks[2] and q.stride() == checks[3]
                    and k.stride() == checks[4] and v.stride() == checks[5] and q.dtype == checks[6]
                    and k.dtype == checks[6] and v.dtype == checks[6] and q.device == checks[7]
                    and k.device == checks[7] and v.device == checks[7]
                    and not (torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad))):
                return op(q, k, v)
            return _public_sdpa(q, k, v, self.is_causal, self.scale, self.enable_gqa)
        if self.recorded:
            return _public_sdpa(q, k, v, self.is_causal, self.scale, self.enable_gqa)
        return self._bind(q, k, v)

    def _bind(self, q, k, v):
        out = _public_sdpa(q, k, v, self.is_causal, self.scale, self.enable_gqa)
        if (torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)) or _capturing(q):
            return out                                    # bound later, on a call autograd does not record
        self.recorded = True
        if q.device.type != "cuda" or not (q.device == k.device == v.device) or not (q.dtype == k.dtype == v.dtype):
            self.why = "not three CUDA tensors of one dtype"
            return out
        try:
            choice = int(torch._fused_sdp_choice(q, k, v, None, 0.0, self.is_causal, scale=self.scale,
                                                 enable_gqa=self.enable_gqa))
            op, name = self._op(choice, q)
            if op is None:
                self.why = name
                return out
            direct = op(q, k, v)
        except Exception as exc:  # a backend that refuses these inputs: keep the public call
            self.why = f"{type(exc).__name__}: {exc}"[:160]
            return out
        if direct.shape != out.shape or direct.stride() != out.stride() or not torch.equal(direct, out):
            self.why = f"{name} differs from the public call on these inputs"
            return out
        self.op, self.backend = op, name
        self.checks = (q.shape, k.shape, v.shape, q.stride(), k.stride(), v.stride(), q.dtype, q.device)
        return out

    def _op(self, choice: int, q) -> tuple[Any, str]:
        """(the backend op as ``scaled_dot_product_attention`` calls it, its name), or (None, why not)."""
        causal, scale = self.is_causal, self.scale
        if choice == _SDP_CUDNN:
            fn = torch._scaled_dot_product_cudnn_attention
            return (lambda q, k, v: fn(q, k, v, None, False, 0.0, causal, False, scale=scale)[0]), "cudnn"
        if choice == _SDP_EFFICIENT:
            fn = torch._scaled_dot_product_efficient_attention
            return (lambda q, k, v: fn(q, k, v, None, False, 0.0, causal, scale=scale)[0]), "efficient"
        if choice == _SDP_FLASH:
            d = q.shape[-1]
            if d % 8:
                return None, f"flash pads head dim {d} to a multiple of 8"
            og_scale = scale if scale is not None else 1.0 / math.sqrt(d)   # PyTorch's calculate_scale, in double
            fn = torch._scaled_dot_product_flash_attention
            return (lambda q, k, v: fn(q, k, v, 0.0, causal, False, scale=og_scale)[0]), "flash"
        return None, f"the dispatcher picks backend {choice} (math or another), not one called directly"


class BoundMaskedAttention:
    """A ``fused_attention(q, k, v, scale, mask)`` node (the attention family's SDPA call with an additive mask:
    GPT-2's, BERT's) bound like ``BoundAttention``: at the first call on CUDA the backend the dispatcher picks
    for these inputs, called as ``scaled_dot_product_attention`` calls it (cuDNN with the mask as it is; the
    memory-efficient kernel with the mask expanded to (B, H, L, S), where that needs no padding or copy), kept only
    where it equals the generic call bit for bit; later calls whose q, k, v and mask have the recorded shapes,
    strides, dtype and device call it directly. The generic call (``attention.fused_attention``, with its
    contiguity and dtype fix-ups) otherwise, and always on the CPU.
    """

    def __init__(self) -> None:
        self.__name__ = self.__qualname__ = "bound_fused_attention"
        self.__module__ = __name__
        self.op: Any = None
        self.backend: str | None = None
        self.checks: tuple | None = None
        self.scale: Any = None
        self.recorded = False
        self.why: str | None = None

    @staticmethod
    def generic(q, k, v, scale, mask):
        return attention_family.fused_attention(q, k, v, scale, mask)

    def __repr__(self) -> str:
        state = f"bound: {self.backend}" if self.op is not None else f"generic: {self.why}" if self.why else "new"
        return f"BoundMaskedAttention({state})"

    def __deepcopy__(self, memo) -> "BoundMaskedAttention":
        return BoundMaskedAttention()

    def __reduce__(self):
        return (BoundMaskedAttention, ())

    def __call__(self, q, k, v, scale, mask):
        op = self.op
        if op is not None:
            c = self.checks
            if (isinstance(mask, torch.Tensor) and q.shape == c[0] and k.shape == c[1] and v.shape == c[2]
                    and mask.shape == c[3] and q.stride() == c[4] and k.stride() == c[5] and v.stride() == c[6]
                    and mask.stride() == c[7] and q.dtype == c[8] and k.dtype == c[8] and v.dtype == c[8]
                    and mask.dtype == c[8] and q.device == c[9] and k.device == c[9] and v.device == c[9]
                    and mask.device == c[9] and scale == self.scale
                    and not (torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad))):
                return op(q, k, v, mask)
            return attention_family.fused_attention(q, k, v, scale, mask)
        out = attention_family.fused_attention(q, k, v, scale, mask)
        if not self.recorded and not _capturing(q) and not (torch.is_grad_enabled() and (
                q.requires_grad or k.requires_grad or v.requires_grad)):
            self._bind(q, k, v, scale, mask, out)
        return out

    def _bind(self, q, k, v, scale, mask, out) -> None:
        self.recorded = True
        tensors = (q, k, v, mask)
        if (not isinstance(mask, torch.Tensor) or q.device.type != "cuda" or any(t.device != q.device for t in tensors)
                or any(t.dtype != q.dtype for t in tensors) or any(t.stride(-1) != 1 for t in (q, k, v))
                or q.dim() != 4 or not (scale is None or isinstance(scale, float))):
            self.why = "not four CUDA tensors of one dtype, (B, H, L, E) with a contiguous last dim"
            return
        try:
            choice = int(torch._fused_sdp_choice(q, k, v, mask, 0.0, False, scale=scale))
            op, name = self._op(choice, q, k, mask, scale)
            if op is None:
                self.why = name
                return
            direct = op(q, k, v, mask)
        except Exception as exc:  # a backend that refuses these inputs: keep the generic call
            self.why = f"{type(exc).__name__}: {exc}"[:160]
            return
        if direct.shape != out.shape or direct.stride() != out.stride() or not torch.equal(direct, out):
            self.why = f"{name} differs from the generic call on these inputs"
            return
        self.op, self.backend, self.scale = op, name, scale
        self.checks = (q.shape, k.shape, v.shape, mask.shape, q.stride(), k.stride(), v.stride(), mask.stride(),
                       q.dtype, q.device)

    @staticmethod
    def _op(choice: int, q, k, mask, scale) -> tuple[Any, str]:
        if choice == _SDP_CUDNN:
            fn = torch._scaled_dot_product_cudnn_attention
            return (lambda q, k, v, m: fn(q, k, v, m, False, 0.0, False, False, scale=scale)[0]), "cudnn"
        if choice == _SDP_EFFICIENT:
            shape = (q.shape[0], q.shape[1], q.shape[2], k.shape[2])
            m4 = mask.expand(shape)
            if shape[-1] % 16 or any(st % 16 for st in m4.stride()[:3]):
                return None, "the memory-efficient kernel would pad or copy this mask"
            fn = torch._scaled_dot_product_efficient_attention
            return (lambda q, k, v, m: fn(q, k, v, m.expand(shape), False, 0.0, False, scale=scale)[0]), "efficient"
        return None, f"the dispatcher picks backend {choice} for a masked call, not one called directly"


class BoundLinear:
    """One ``linear`` node whose input is contiguous: the ``mm``/``addmm`` ATen's ``linear`` runs for it, called
    directly on the input's row view, without ``linear``'s composite steps (``matmul``'s folding decisions).

    For a contiguous ``(..., K)`` input ATen's ``linear`` runs ``addmm(bias, x.view(-1, K), weight.t())`` with a
    bias and ``x.view(-1, K).mm(weight.t())`` without (matmul folds the leading dims), then views the result
    back: the same cuBLAS call on the same pointers. The first call runs ``linear`` and the direct call and keeps
    the direct one only where both are equal bit for bit and in layout; later calls whose input has the recorded
    shape, strides, dtype and device (and whose weight has the recorded shape) take it, others ``linear``.
    """

    def __init__(self, had_bias_arg: bool = True) -> None:
        self.had_bias_arg = had_bias_arg                  # the node passed a bias argument (None or a tensor)
        self.__name__ = self.__qualname__ = "bound_linear"
        self.__module__ = __name__
        self.sig: tuple | None = None
        self.recorded = False
        self.why: str | None = None

    generic = staticmethod(torch._C._nn.linear)

    def __repr__(self) -> str:
        return "BoundLinear(bound)" if self.sig else f"BoundLinear(generic: {self.why})" if self.why else "BoundLinear"

    def __deepcopy__(self, memo) -> "BoundLinear":
        return BoundLinear(self.had_bias_arg)

    def __reduce__(self):
        return (BoundLinear, (self.had_bias_arg,))

    def __call__(self, x, w, b=None):
        sig = self.sig
        if sig is not None:
            if (x.shape == sig[0] and x.stride() == sig[1] and x.dtype == sig[2] and x.device == sig[3]
                    and w.shape == sig[4] and not (torch.is_grad_enabled() and (x.requires_grad or w.requires_grad))):
                rows = x.view(sig[5], sig[6])
                out = torch.mm(rows, w.t()) if b is None else torch.addmm(b, rows, w.t())
                return out.view(sig[7])
            return torch._C._nn.linear(x, w, b)
        out = torch._C._nn.linear(x, w, b)
        if not self.recorded and not _capturing(x) and not (torch.is_grad_enabled() and (
                x.requires_grad or w.requires_grad)):
            self._bind(x, w, b, out)
        return out

    def _bind(self, x, w, b, out) -> None:
        self.recorded = True
        if x.dim() < 2 or not x.is_contiguous() or w.dim() != 2 or (b is not None and b.dim() != 1):
            self.why = "not a contiguous (..., K) input with a 2-D weight"
            return
        k = x.shape[-1]
        m = x.numel() // k if k else 0
        try:
            rows = x.view(m, k)
            direct = (torch.mm(rows, w.t()) if b is None else torch.addmm(b, rows, w.t())).view(out.shape)
        except Exception as exc:
            self.why = f"{type(exc).__name__}: {exc}"[:160]
            return
        if direct.stride() != out.stride() or direct.dtype != out.dtype or not torch.equal(direct, out):
            self.why = "mm differs from linear on these inputs"
            return
        self.sig = (x.shape, x.stride(), x.dtype, x.device, w.shape, m, k, out.shape)


def bind_linears(gm: torch.fx.GraphModule) -> int:
    """Give each ``linear`` node (input, weight[, bias]) its own ``BoundLinear``. Edits ``gm`` in place; returns how
    many nodes were bound."""
    changed = 0
    for node in gm.graph.nodes:
        if (node.op == "call_function" and node.target is torch._C._nn.linear and not node.kwargs
                and len(node.args) in (2, 3)):
            node.target = BoundLinear(len(node.args) == 3)
            node.args = (*node.args, None) if len(node.args) == 2 else node.args
            changed += 1
    if changed:
        gm.recompile()
    return changed


def bind_attention(gm: torch.fx.GraphModule) -> int:
    """Bind each ``scaled_dot_product_attention`` node without mask or dropout to its backend (``BoundAttention``;
    under ``enable_gqa`` the backends that take fewer key/value heads read them as they are, as the public call
    passes them), and each ``attention.fused_attention`` node (an additive mask) to ``BoundMaskedAttention``. Edits ``gm`` in place; returns how many nodes were bound."""
    names = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")
    defaults = dict(attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False)
    changed = 0
    for node in gm.graph.nodes:
        if node.op != "call_function" or node.target is not torch._C._nn.scaled_dot_product_attention:
            continue
        if len(node.args) > len(names) or any(k not in names for k in node.kwargs):
            continue
        bound = {**defaults, **dict(zip(names, node.args)), **node.kwargs}
        if not all(k in bound for k in names[:3]) or bound["attn_mask"] is not None or bound["dropout_p"] != 0.0:
            continue
        if not isinstance(bound["enable_gqa"], bool) or not isinstance(bound["is_causal"], bool) or not (
                bound["scale"] is None or isinstance(bound["scale"], float)):
            continue
        node.target = BoundAttention(bound["is_causal"], bound["scale"], bound["enable_gqa"])
        node.args, node.kwargs = (bound["query"], bound["key"], bound["value"]), {}
        changed += 1
    for node in gm.graph.nodes:
        if (node.op == "call_function" and node.target is attention_family.fused_attention and not node.kwargs
                and len(node.args) == 5):
            node.target = BoundMaskedAttention()
            changed += 1
    if changed:
        gm.recompile()
    return changed


# ------------------------------------------------------------------ values that depend on no input

#: A computed constant larger than this stays computed at each call: folding trades device memory for launches.
FOLD_MAX_BYTES = 16 * 2**20

#: Public functions (the targets ``lower_aten_calls`` writes) that are pure and deterministic.
_PURE_PUBLIC = {target for kind, target in PUBLIC_BINDINGS.values() if kind == "function"}
_PURE_METHODS = {target for kind, target in PUBLIC_BINDINGS.values() if kind == "method"
                 and not target.endswith("_")}


def _foldable(node: torch.fx.Node) -> bool:
    """Whether ``node`` may be computed once: a pure, deterministic op that writes none of its inputs."""
    target = node.target
    if node.op == "call_method":
        return target in _PURE_METHODS
    if node.op != "call_function":
        return False
    if target is operator.getitem:
        return True
    if isinstance(target, torch._ops.OpOverload):
        schema = target._schema
        return (not schema.is_mutable and torch.Tag.nondeterministic_seeded not in target.tags
                and torch.Tag.dynamic_output_shape not in target.tags)
    return target in _PURE_PUBLIC and not getattr(target, "__name__", "").endswith("_")


#: In-place calls that change a tensor's autograd state only, never its values: transformers' empty cache is
#: ``torch.tensor([]).detach_()`` at every forward (its constant must still fold: ``pass_empty_cats`` reads it).
_STATE_ONLY_WRITES = frozenset({"detach_"})


def _writes_inputs(node: torch.fx.Node) -> bool:
    """Whether ``node`` may write a tensor it reads: an in-place call (``x.add_(y)``, ``aten.add_``), an ``out=``.
    A ``detach_`` writes no values (``_STATE_ONLY_WRITES``)."""
    target = node.target
    if "out" in node.kwargs:
        return True
    if _target_name(node) in _STATE_ONLY_WRITES:
        return False
    if node.op == "call_method":
        return isinstance(target, str) and target.endswith("_") and not target.startswith("__")
    if isinstance(target, torch._ops.OpOverload):
        return target._schema.is_mutable
    name = getattr(target, "__name__", "")
    return name.endswith("_") and not name.startswith("__")


def _nbytes(value: Any) -> int | None:
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    return None


def fold_constants(gm: torch.fx.GraphModule, max_bytes: int = FOLD_MAX_BYTES) -> int:
    """Compute once every tensor that depends on no graph input; the graph then reads it as an attribute.

    Only pure, deterministic, non-mutating ops are evaluated (``_foldable``), in graph order, with the
    graph's own tensors (moved and cast already: ``prepare_graph`` calls this last), so the stored value
    is the one each call would have computed. A value is kept only where it leaves the constant part of
    the graph (a node outside it reads it) and is at most ``max_bytes``; larger ones and non-tensors stay
    computed. A constant that a call writes in place (T5's ``relative_buckets += ...``: ``add_``), and every
    constant it is computed from (a view of a folded buffer would be written through), stays computed: folded,
    each call would add to the sum of the calls before (T5's buckets indexed past their table at the second
    call). Edits ``gm`` in place and returns how many nodes now read a folded value.
    """
    values: dict[torch.fx.Node, Any] = {}
    computed: list[torch.fx.Node] = []
    for node in gm.graph.nodes:
        if node.op == "get_attr":
            values[node] = attr_value(gm, node.target)
            continue
        if node.op not in ("call_function", "call_method") or not _foldable(node):
            continue
        if not all(n in values for n in node.all_input_nodes):
            continue
        args = torch.fx.node.map_arg(node.args, lambda n: values[n])
        kwargs = torch.fx.node.map_arg(node.kwargs, lambda n: values[n])
        try:
            with torch.no_grad():
                if node.op == "call_method":
                    value = getattr(args[0], node.target)(*args[1:], **kwargs)
                else:
                    value = node.target(*args, **kwargs)
        except Exception:  # leave it to the call: the forward raises, or runs, as it did
            continue
        values[node] = value
        computed.append(node)
    written = [n for n in computed if any(_writes_inputs(u) for u in n.users)]
    fresh: set[torch.fx.Node] = set()      # written in place, or what a written constant is computed from
    while written:
        node = written.pop()
        if node not in fresh and node in values:
            fresh.add(node)
            written.extend(node.all_input_nodes)
    folded = 0
    for node in computed:
        size = _nbytes(values[node])
        if node in fresh or size is None or size > max_bytes or all(u in values for u in node.users):
            continue
        name = "_folded_" + node.name
        while hasattr(gm, name):
            name += "_"
        gm.register_buffer(name, values[node], persistent=False)
        with gm.graph.inserting_before(node):
            attr = gm.graph.get_attr(name)
        attr.meta = dict(node.meta)
        node.replace_all_uses_with(attr)
        folded += 1
    if folded:
        gm.graph.eliminate_dead_code()
        gm.graph.lint()
        gm.recompile()
    return folded


# ------------------------------------------------------------------ which binds a prepared graph takes

@dataclasses.dataclass(frozen=True)
class Binds:
    """Which lean passes ``prepare_graph`` applies after lowering: each a switch, set from measurement.

    ``calls``, ``attention`` and ``linears`` (``bind_calls``, ``bind_attention``, ``bind_linears``) apply on CUDA
    only (elsewhere each bound call would keep its generic path anyway); ``views`` (``collapse_views``, and
    ``drop_noop_detach`` before it: the nodes that launch nothing), ``empty_cats`` (``pass_empty_cats``: a
    ``cat`` onto a constant empty tensor) and ``addmm_linears`` (``addmm_as_linear``: a flattened ``addmm`` and its
    views as one ``linear``) on every device. ``DEFAULT_BINDS`` holds what measured faster (``benchmarks/bench_host_path.py``; the README's
    "Measured" section names the run).
    """

    calls: bool = True
    attention: bool = True
    linears: bool = True
    views: bool = True
    empty_cats: bool = False
    addmm_linears: bool = False
    heads: bool = True

    def label(self) -> str:
        on = [name for name in ("calls", "attention", "linears", "views", "empty_cats", "addmm_linears", "heads")
              if getattr(self, name)]
        return "+".join(on) if on else "none"


#: The binds ``prepare_graph`` applies unless told otherwise: each only where it measured cheaper
#: (``benchmarks/results/bench_host_path_binds_h200.json``, every switch against the bound path in the same rounds
#: on GPT-2-medium layers, BERT-base, ConvNeXt-Tiny, the zoo decoder prefill, the 8B-layer decoder and ResNet-50).
#: ``calls`` on: without them the zoo decoder's plain calls are 1.34x slower, level elsewhere. ``views`` on: GPT-2
#: 0.90x, BERT 0.97x, level elsewhere. ``linears`` off: never faster, and the graph without them was faster on
#: BERT (0.88x) and ConvNeXt (0.95x). ``attention`` off: never faster, the graph without it faster on GPT-2
#: (0.97x, its masked attention), its point estimate below 1 on every other model with attention. ``empty_cats``
#: on (``bench_host_path_host5_h200.json``): GPT-2's 8 cats onto the empty cache passed, plain calls 0.89x
#: [0.88, 0.91] and the CUDA-graph replay 0.83x of the graph without the pass (its cat kernels gone), bit for bit;
#: no other model there has such a cat. ``heads`` on (``lean_heads``) without an H200 run of its own: it launches the
#: same GEMMs and SDPA as the graph without it and removes three activation copies per attention (1.94 ms of
#: ViT-L/16's 11.35 ms of GPU work in ``bench_corpus_h200_part15``); its plain calls are measured by the next
#: corpus run's ViT rows.
DEFAULT_BINDS = Binds(attention=False, linears=False, empty_cats=True)

#: No bind at all: the lowered graph (what ``unbind`` gives back, before ``collapse_views``).
NO_BINDS = Binds(calls=False, attention=False, linears=False, views=False, heads=False)


def apply_binds(gm: torch.fx.GraphModule, device: torch.device | str | None, binds: Binds = DEFAULT_BINDS) -> dict:
    """Apply ``binds``'s call, attention and linear switches to a lowered graph on ``device`` (CUDA only; None:
    on any device, as the host-path bench's CPU smoke run binds). ``prepare_graph`` calls this before
    ``fold_constants`` and ``apply_view_binds`` after it, so that views of constants are folded rather than
    collapsed. Returns how many nodes each pass bound."""
    cuda = device is None or torch.device(device).type == "cuda"
    done = dict(calls=0, attention=0, linears=0)
    if cuda and binds.calls:
        done["calls"] = bind_calls(gm)
    if cuda and binds.attention:
        done["attention"] = bind_attention(gm)
    if cuda and binds.linears:
        done["linears"] = bind_linears(gm)
    return done


def apply_view_binds(gm: torch.fx.GraphModule, binds: Binds = DEFAULT_BINDS) -> dict:
    """``binds.heads`` (``lean_heads.batch_first_heads``) and ``binds.addmm_linears`` (``addmm_as_linear``) on any
    device; then ``binds.views``: ``drop_noop_detach``, then ``collapse_views``; then ``binds.empty_cats``
    (``pass_empty_cats``). Returns how many each changed."""
    done = dict(detach=0, views=0, empty_cats=0, addmm_linears=0, heads=0)
    if binds.heads:                                 # before the view pass, whose trees would hold its views
        done["heads"] = batch_first_heads(gm)
    if binds.addmm_linears:                         # before the view pass: its views are then not in a tree
        done["addmm_linears"] = addmm_as_linear(gm)
    if binds.views:
        done.update(detach=drop_noop_detach(gm), views=collapse_views(gm))
    if binds.empty_cats:
        done["empty_cats"] = pass_empty_cats(gm)
    return done


# ------------------------------------------------------------------ view-like chains collapsed into one call

#: Methods (``call_method`` targets, as ``lower_aten_calls`` writes them) whose result is a view of ``self``
#: (or ``self``) with a geometry that depends only on ``self``'s shape, strides and offset, given constant
#: arguments. Those of ``_MAY_COPY`` may copy instead: ``BoundViews`` keeps its bound path only where the first
#: call's results share the root's storage, and ``_view_trees`` takes one into a tree only where nothing between
#: the tree's first node and it may write in place (a tree's ops all run where its first node was; a copy made
#: there, before a write into the root that the graph makes later, reads the data as it was: torchvision's Swin
#: fills slices of its shifted-window mask in place and then views, permutes and reshapes it, and with the copy
#: made first the mask was all zeros and Swin-T's output 17% off).
_VIEW_METHODS = frozenset({"view", "reshape", "contiguous", "expand", "transpose", "permute", "unsqueeze",
                           "squeeze", "flatten", "unflatten", "t", "narrow", "select", "split", "chunk",
                           "unbind", "split_with_sizes", "to", "__getitem__"})

#: Functions (public bindings and ATen overloads) of the same kind.
_VIEW_FUNCTIONS = frozenset({
    torch.transpose, torch.reshape, torch.permute, torch.unsqueeze, torch.squeeze, torch.unflatten,
    torch.flatten, torch.select, torch.narrow, torch.t, torch.split, torch.split_with_sizes, torch.chunk,
    torch.unbind, aten.view.default, aten.reshape.default, aten.transpose.int, aten.permute.default,
    aten.unsqueeze.default, aten.squeeze.dim, aten.squeeze.dims, aten.squeeze.default, aten.t.default,
    aten.slice.Tensor, aten.select.int, aten.split.Tensor, aten.split_with_sizes.default, aten.unbind.int,
    aten.chunk.default, aten.narrow.default, aten.expand.default, aten.alias.default, aten.contiguous.default,
    aten.flatten.using_ints, aten.unflatten.int, aten.detach.default,
})

#: Of those, the ones that may return a copy (``reshape`` of strides a view cannot express, ``to`` another dtype).
_MAY_COPY = frozenset({"reshape", "contiguous", "flatten", "to", torch.reshape, torch.flatten,
                       aten.reshape.default, aten.contiguous.default, aten.flatten.using_ints})

#: Functions of the ``operator`` module that never write into their operands (``iadd`` and friends may).
_PURE_OPERATORS = frozenset({operator.getitem, operator.add, operator.sub, operator.mul, operator.truediv,
                             operator.floordiv, operator.mod, operator.pow, operator.neg, operator.pos,
                             operator.matmul, operator.eq, operator.ne, operator.lt, operator.le, operator.gt,
                             operator.ge, operator.and_, operator.or_, operator.xor, operator.invert})

#: Of those, the ones that return a tuple of views (read by ``operator.getitem`` with an int).
_MULTI_VIEWS = frozenset({"split", "split_with_sizes", "chunk", "unbind", torch.split, torch.split_with_sizes,
                          torch.chunk, torch.unbind, aten.split.Tensor,
                          aten.split_with_sizes.default, aten.unbind.int, aten.chunk.default})

#: In-place ops that change a tensor's geometry (not its data): a tree any of them touches is left alone, since
#: ``BoundViews`` makes every view of its tree where the tree's first view was.
_GEOMETRY_WRITES = frozenset({"resize_", "resize_as_", "set_", "as_strided_", "t_", "transpose_", "squeeze_",
                              "unsqueeze_", "swapdims_", "swapaxes_", "detach_"})


def _has_node(value: Any) -> bool:
    found = []
    torch.fx.node.map_arg(value, lambda n: found.append(n))
    return bool(found)


def _basic_index(index: Any) -> bool:
    """Whether a ``tensor[index]`` is basic indexing (a view): ints, slices of ints, None, Ellipsis."""
    items = index if isinstance(index, tuple) else (index,)
    for item in items:
        if isinstance(item, slice):
            if not all(p is None or isinstance(p, int) for p in (item.start, item.stop, item.step)):
                return False
        elif not (item is None or item is Ellipsis or (isinstance(item, int) and not isinstance(item, bool))):
            return False
    return True


def _view_kind(node: torch.fx.Node) -> str | None:
    """``"tensor"`` for a view-like node that returns a tensor, ``"tuple"`` for one that returns a tuple of views,
    ``"item"`` for the ``getitem`` that reads one of them; None otherwise. Every argument but the first must be a
    constant (no graph value): then the result's geometry follows from the first's alone."""
    if node.op not in ("call_method", "call_function") or not node.args:
        return None
    if not isinstance(node.args[0], torch.fx.Node) or _has_node((node.args[1:], node.kwargs)):
        return None
    target = node.target
    if node.op == "call_function" and target is operator.getitem:
        producer = node.args[0]
        if _view_kind(producer) == "tuple":
            return "item" if isinstance(node.args[1], int) else None
        if producer.op == "call_function" and producer.target is operator.getitem:
            return None                        # a getitem of a tuple element: not known to be a tensor
        val = producer.meta.get("val")
        if isinstance(val, (tuple, list)):
            return None
        return "tensor" if _basic_index(node.args[1]) and _tensor_valued(producer) else None
    if node.op == "call_method":
        if target not in _VIEW_METHODS:
            return None
        if target == "to":                     # only to(dtype) (returns self where the dtype is the same)
            if node.kwargs or len(node.args) < 2 or not isinstance(node.args[1], torch.dtype) or any(
                    a not in (False, None) for a in node.args[2:]):
                return None
        if target == "__getitem__" and not _basic_index(node.args[1] if len(node.args) > 1 else ()):
            return None
        if target == "view" and any(isinstance(a, torch.dtype) for a in node.args[1:]):
            return None                        # view(dtype) reinterprets the bytes
        return "tuple" if target in _MULTI_VIEWS else "tensor"
    if target not in _VIEW_FUNCTIONS:
        return None
    return "tuple" if target in _MULTI_VIEWS else "tensor"


def _tensor_valued(node: torch.fx.Node) -> bool:
    """Whether ``node`` is known to give a tensor: a placeholder or attribute, or a call whose recorded value is
    one, or a view-like call of such a node."""
    val = node.meta.get("val")
    if isinstance(val, torch.Tensor):
        return True
    if node.op in ("placeholder", "get_attr"):
        return val is None or isinstance(val, torch.Tensor)
    return _view_kind(node) == "tensor"


class BoundViews:
    """A tree of view-like nodes read from one tensor (the root), replaced by one call: ``as_strided`` of the
    root for each view the rest of the graph reads (a leaf).

    ``view``, ``transpose``, ``split``/``getitem``, ``permute``… each cost a Python-to-ATen call and make a
    tensor the next one only re-views; a prepared graph's shapes are fixed, so where the root has the same
    shape, strides, offset and dtype as at the first call, every leaf has the same geometry in the same storage
    as then. At the first call this runs the tree's own ops (``generic``, a small graph of exactly those nodes)
    and keeps the bound path only where every leaf shares the root's storage (no ``reshape``/``contiguous``/
    ``to`` copied); later calls whose root matches the recorded geometry make each leaf with one ``as_strided``
    (the same storage, sizes, strides and offset: the same tensor bit for bit), others (and calls autograd
    records) run the tree's ops. ``why`` says why a tree kept its ops.

    ::

        addmm ─ view ─ split ┬ getitem ─ view ─ transpose ─▶ attention      addmm ─ bound_views ┬ [0] ─▶ attention
                             ├ getitem ─ view ─ transpose ─▶ attention  →                        ├ [1] ─▶ attention
                             └ getitem ─ view ─ transpose ─▶ attention                           └ [2] ─▶ attention
    """

    def __init__(self, generic: torch.fx.GraphModule, leaves: int, calls: int) -> None:
        self.generic, self.leaves, self.calls = generic, leaves, calls
        self.__name__ = self.__qualname__ = "bound_views"
        self.__module__ = __name__
        self.root: tuple | None = None                # shape, strides, offset, dtype of the root at the first call
        self.views: tuple = ()                        # (size, stride, offset) per leaf
        self.recorded = False
        self.why: str | None = None

    def __repr__(self) -> str:
        state = "bound" if self.root is not None else f"generic: {self.why}" if self.why else "new"
        return f"BoundViews({self.calls} calls, {self.leaves} leaves, {state})"

    def __deepcopy__(self, memo) -> "BoundViews":
        return BoundViews(copy.deepcopy(self.generic, memo), self.leaves, self.calls)

    def __reduce__(self):
        return (BoundViews, (self.generic, self.leaves, self.calls))

    def __call__(self, x):
        r = self.root
        if (r is not None and x.shape == r[0] and x.stride() == r[1] and x.storage_offset() == r[2]
                and x.dtype == r[3] and not (x.requires_grad and torch.is_grad_enabled())):
            if self.leaves == 1:
                v = self.views[0]
                return x.as_strided(v[0], v[1], v[2])
            return tuple([x.as_strided(v[0], v[1], v[2]) for v in self.views])
        out = self.generic.forward(x)                 # the tree's own ops (no Module.__call__ around them)
        if not self.recorded and not (x.requires_grad and torch.is_grad_enabled()):
            self._bind(x, out)
        return out

    def _bind(self, x, out) -> None:
        self.recorded = True
        leaves = (out,) if self.leaves == 1 else tuple(out)
        if not isinstance(x, torch.Tensor) or not all(isinstance(t, torch.Tensor) for t in leaves):
            self.why = "a value of the tree is not a tensor"
            return
        storage = x.untyped_storage().data_ptr()
        for t in leaves:
            if t.dtype != x.dtype or t.untyped_storage().data_ptr() != storage or t.is_conj() != x.is_conj() \
                    or t.is_neg() != x.is_neg():
                self.why = "a view of the tree is a copy on these inputs (reshape, contiguous or to copied)"
                return
        self.views = tuple((tuple(t.shape), tuple(t.stride()), t.storage_offset()) for t in leaves)
        self.root = (x.shape, x.stride(), x.storage_offset(), x.dtype)


def _may_write(node: torch.fx.Node) -> bool:
    """Whether ``node`` may write into a tensor in place: an in-place method or ATen overload, an ``out=`` or
    ``inplace=True`` call, ``setitem``, a submodule, or any callable not known to be pure (the explorer's fused
    calls among them)."""
    if node.op in ("placeholder", "get_attr", "output"):
        return False
    if node.kwargs.get("out") is not None or node.kwargs.get("inplace") is True:
        return True
    target = node.target
    if node.op == "call_method":
        return target.endswith("_")
    if node.op != "call_function":
        return True
    if isinstance(target, torch._ops.OpOverload):
        return target._schema.is_mutable
    if target in _PURE_OPERATORS or isinstance(target, BoundViews):
        return False
    module, name = getattr(target, "__module__", None) or "", getattr(target, "__name__", "")
    public = module == "torch" or module.startswith(("torch._C", "torch.nn.functional"))
    return not public or name.endswith("_")


def _view_trees(gm: torch.fx.GraphModule) -> dict[torch.fx.Node, list[torch.fx.Node]]:
    """root -> the view-like nodes read from it (transitively), in graph order. An op that may copy
    (``_MAY_COPY``) joins its source's tree only where no node between the tree's first node and it may write
    in place (``_may_write``); otherwise it is a node like any other (and may root a tree of its own)."""
    nodes = list(gm.graph.nodes)
    kind = {n: _view_kind(n) for n in nodes}
    writes_before, count = {}, 0                     # node -> how many nodes before it may write in place
    for n in nodes:
        writes_before[n] = count
        count += _may_write(n)
    root_of: dict[torch.fx.Node, torch.fx.Node] = {}
    trees: dict[torch.fx.Node, list[torch.fx.Node]] = {}
    for node in nodes:
        if kind[node] is None:
            continue
        src = node.args[0]
        if kind.get(src) is None and kind[node] == "item":
            continue                           # a getitem of a tuple another op made: a root, not a view
        root = root_of[src] if kind.get(src) is not None else src    # a non-tensor root: ``_bind`` refuses it
        first = (trees.get(root) or [node])[0]
        if node.target in _MAY_COPY and writes_before[node] != writes_before[first]:
            kind[node] = None                  # a copy made at ``first`` could miss a write the graph makes
            continue
        root_of[node] = root
        trees.setdefault(root, []).append(node)
    return trees


def collapse_views(gm: torch.fx.GraphModule, min_saved: int = 1) -> int:
    """Replace each tree of view-like nodes read from one tensor by one ``BoundViews`` node (and a ``getitem`` per
    leaf where it has several), where that saves at least ``min_saved`` Python-to-ATen calls: a tree of ``c``
    ATen calls with ``l`` leaves costs one bound call (its check and Python frame, about one view's cost) and
    ``l`` ``as_strided`` calls instead, so it is collapsed where ``c >= l + min_saved`` (on this project's CPU
    host a ``view`` + ``transpose`` took 2.0 µs, the bound call 1.6 µs).

    A leaf is a tensor view read by a node outside the tree (or an output). A tree is left alone where an
    in-place op that changes geometry (``resize_``, ``transpose_``…) reads any of its nodes or its root, where a
    tuple of views leaves it (read other than by ``getitem``), or where it would gain nothing. Edits ``gm`` in
    place; returns how many trees were collapsed.
    """
    collapsed = 0
    for root, nodes in _view_trees(gm).items():
        members = set(nodes)
        if any(u.op in ("call_method", "call_function") and _geometry_write(u)
               for n in (root, *nodes) for u in n.users):
            continue
        leaves, ok = [], True
        for n in nodes:
            outside = [u for u in n.users if u not in members]
            if _view_kind(n) == "tuple":
                ok = ok and not outside        # a tuple read other than by getitem of the tree
            elif outside:
                leaves.append(n)
        calls = sum(1 for n in nodes if _view_kind(n) != "item")
        if not ok or not leaves or calls < len(leaves) + min_saved:
            continue
        sub = torch.fx.Graph()
        env = {root: sub.placeholder("root")}
        for n in nodes:
            env[n] = sub.node_copy(n, lambda a: env[a])
        sub.output(env[leaves[0]] if len(leaves) == 1 else tuple(env[n] for n in leaves))
        bound = BoundViews(torch.fx.GraphModule(torch.nn.Module(), sub), len(leaves), calls)
        with gm.graph.inserting_before(nodes[0]):
            call = gm.graph.call_function(bound, (root,))
        if len(leaves) == 1:
            leaves[0].replace_all_uses_with(call, delete_user_cb=lambda u: u not in members)
        else:
            with gm.graph.inserting_after(call):
                items = [gm.graph.call_function(operator.getitem, (call, i)) for i in range(len(leaves))]
            for leaf, item in zip(leaves, items):
                item.meta = dict(leaf.meta)
                leaf.replace_all_uses_with(item, delete_user_cb=lambda u: u not in members)
        call.meta["views_collapsed"] = calls
        for n in reversed(nodes):
            if not n.users:
                gm.graph.erase_node(n)
        collapsed += 1
    if collapsed:
        gm.graph.lint()
        gm.recompile()
    return collapsed


def drop_noop_detach(gm: torch.fx.GraphModule) -> int:
    """Drop each in-place ``detach_`` of a graph attribute that has no autograd state (no grad, no history, not a
    view): it returns that same tensor and changes nothing. transformers' empty cache (``torch.tensor([])``, a
    lifted constant) is detached so at every forward of GPT-2 (8 ATen calls a forward for 4 layers). Edits ``gm``
    in place; returns how many were dropped."""
    dropped = 0
    for node in list(gm.graph.nodes):
        is_detach = ((node.op == "call_function" and node.target is aten.detach_.default)
                     or (node.op == "call_method" and node.target == "detach_"))
        if not is_detach or len(node.args) != 1 or node.kwargs:
            continue
        src = node.args[0]
        value = attr_value(gm, src.target) if isinstance(src, torch.fx.Node) and src.op == "get_attr" else None
        if (not isinstance(value, torch.Tensor) or value.requires_grad or value.grad_fn is not None
                or value._base is not None):
            continue
        node.replace_all_uses_with(src)
        gm.graph.erase_node(node)
        dropped += 1
    if dropped:
        gm.graph.lint()
        gm.recompile()
    return dropped


# ------------------------------------------------------------------ a cat onto an empty constant: its input

#: Call targets (by name) that read their tensor arguments and write none of them: the nodes that may run between
#: a passed-through ``cat`` and its last reader (besides view-like nodes and other such cats).
_READ_ONLY_NAMES = frozenset({"fused_attention", "fused_attention_kt", "bound_views",
                              "scaled_dot_product_attention", "matmul", "bmm", "getitem", "cat",
                              "pass_empty_cat"})


class PassEmptyCat:
    """A ``cat`` whose every operand but one is a constant empty tensor (transformers' key/value cache before its
    first token: ``torch.cat([torch.tensor([]), key], -2)``), bound to return that operand itself.

    ``cat`` copies the operand into a new tensor (one kernel, and the dispatcher's work for two inputs); its
    values are the operand's. At the first call this runs the ``cat`` and binds only where the result has the
    operand's dtype (a float32 empty constant promotes a bf16 key: then the ``cat`` stays) and shape; later calls
    whose operand has that dtype and shape return it. What changes is identity and strides: the readers get the
    operand (a view, its strides), not a contiguous copy; ``pass_empty_cats`` binds only where that cannot be
    seen (see there). ``why`` says why a cat kept its copy.

    ::

        empty ─┐                                       key ─▶ attention
        key ───┴ cat ─▶ attention             →
    """

    def __init__(self, index: int, dim: int) -> None:
        self.index, self.dim = index, dim
        self.__name__ = self.__qualname__ = "pass_empty_cat"
        self.__module__ = __name__
        self.bound: tuple | None = None               # (dtype, shape) of the operand at the first call
        self.recorded = False
        self.why: str | None = None

    def __repr__(self) -> str:
        state = "bound" if self.bound is not None else f"copies: {self.why}" if self.why else "new"
        return f"PassEmptyCat({state})"

    def __deepcopy__(self, memo) -> "PassEmptyCat":
        return PassEmptyCat(self.index, self.dim)

    def __reduce__(self):
        return (PassEmptyCat, (self.index, self.dim))

    def __call__(self, tensors):
        x = tensors[self.index]
        b = self.bound
        if b is not None and x.dtype == b[0] and x.shape == b[1]:
            return x
        out = torch.cat(tensors, self.dim)
        if not self.recorded:
            self.recorded = True
            if out.dtype != x.dtype or out.shape != x.shape:
                self.why = f"the cat's result is {out.dtype} {tuple(out.shape)}, its operand {x.dtype} {tuple(x.shape)}"
            else:
                self.bound = (x.dtype, x.shape)
        return out


def _empty_constant(gm: torch.fx.GraphModule, node: Any) -> bool:
    if not (isinstance(node, torch.fx.Node) and node.op == "get_attr"):
        return False
    value = attr_value(gm, node.target)
    return isinstance(value, torch.Tensor) and value.numel() == 0


def _aliases(node: torch.fx.Node) -> set:
    """``node`` and the nodes that may be views of it: view-like nodes read from it, transitively (a
    ``bound_views`` and the ``getitem``s of its leaves among them)."""
    found, todo = {node}, [node]
    while todo:
        for u in todo.pop().users:
            view = _view_kind(u) is not None or isinstance(u.target, BoundViews) or (
                u.op == "call_function" and u.target is operator.getitem and isinstance(u.args[0], torch.fx.Node)
                and isinstance(u.args[0].target, BoundViews))
            if view and u not in found:
                found.add(u)
                todo.append(u)
    return found


def pass_empty_cats(gm: torch.fx.GraphModule) -> int:
    """Replace each ``cat`` onto constant empty tensors by a ``PassEmptyCat`` (its one other operand, bound at the
    first call). Only where returning the operand instead of a fresh copy cannot change a value: neither the cat
    nor a view of it (``_aliases``) is an output of the graph, and every node from the cat to the last reader of
    it or of its views is view-like or only reads its tensors (``_READ_ONLY_NAMES``: nothing writes into the
    operand or the result while the result is read). Edits ``gm``
    in place; returns how many cats it replaced."""
    nodes = list(gm.graph.nodes)
    order = {n: i for i, n in enumerate(nodes)}
    outputs: set = set()
    for n in nodes:
        if n.op == "output":
            torch.fx.node.map_arg(n.args, outputs.add)
    replaced = 0
    for node in nodes:
        if node.op != "call_function" or node.target not in (torch.cat, aten.cat.default) or node.kwargs:
            continue
        if len(node.args) not in (1, 2) or not isinstance(node.args[0], (list, tuple)):
            continue
        dim = node.args[1] if len(node.args) == 2 else 0
        operands = list(node.args[0])
        full = [i for i, a in enumerate(operands) if not _empty_constant(gm, a)]
        if not isinstance(dim, int) or len(full) != 1 or len(operands) < 2 or node in outputs or not node.users:
            continue
        if not isinstance(operands[full[0]], torch.fx.Node):
            continue
        aliases = _aliases(node)
        if aliases & outputs:
            continue
        last = max(order[u] for a in aliases for u in a.users)
        between = nodes[order[node] + 1:last + 1]
        if not all(_view_kind(n) is not None or (n.op == "call_function" and _target_name(n) in _READ_ONLY_NAMES)
                   for n in between):
            continue
        with gm.graph.inserting_before(node):
            call = gm.graph.call_function(PassEmptyCat(full[0], dim), (operands,))
        call.meta = dict(node.meta)
        node.replace_all_uses_with(call)
        gm.graph.erase_node(node)
        replaced += 1
    if replaced:
        gm.graph.lint()
        gm.recompile()
    return replaced


# ------------------------------------------------------------------ a flattened addmm back into one linear

#: The targets ``addmm_as_linear`` reads as ``addmm`` and as a view of a contiguous tensor.
_ADDMM = (torch.addmm, aten.addmm.default)
_FLAT_VIEWS = frozenset({"view", "reshape", torch.reshape, aten.view.default, aten.reshape.default})


def _flat_view(node: Any) -> bool:
    """Whether ``node`` is ``x.view(shape)``/``x.reshape(shape)`` (a method or a function) of a graph tensor: on a
    contiguous ``x``, a view with ``x``'s memory order."""
    return (isinstance(node, torch.fx.Node) and node.op in ("call_method", "call_function")
            and node.target in _FLAT_VIEWS and len(node.args) >= 2 and isinstance(node.args[0], torch.fx.Node)
            and not node.kwargs and not any(isinstance(a, torch.dtype) for a in node.args[1:]))


def _view_shape(node: torch.fx.Node) -> tuple:
    """The shape a ``_flat_view`` node asks for (``view(a, b)`` and ``view([a, b])`` alike)."""
    args = node.args[1:]
    return tuple(args[0]) if len(args) == 1 and isinstance(args[0], (list, tuple)) else tuple(args)


def _flattened_input(view: Any, k: int) -> torch.fx.Node | None:
    """``x`` where ``view`` is ``x.view(-1, k)`` (or ``reshape``, or ``view(m, k)``) of a 2-D or 3-D tensor ``x``
    that ATen's ``linear`` flattens the same way: contiguous as recorded, and made by an op that is not a view or
    by ``view``/``reshape`` calls of one (views that reorder or slice are where a non-contiguous tensor comes
    from; ``view`` of a contiguous tensor stays contiguous); None otherwise."""
    if not _flat_view(view) or len(view.users) != 1:
        return None
    x, shape = view.args[0], _view_shape(view)
    val = x.meta.get("val")
    if not isinstance(val, torch.Tensor) or len(shape) != 2 or shape[1] != k or val.shape[-1] != k:
        return None
    if shape[0] not in (-1, math.prod(val.shape[:-1])):
        return None
    if val.dim() not in (2, 3) or not val.is_contiguous():
        return None
    return x if _contiguous_root(x) else None


#: Calls whose result is always a fresh contiguous tensor (a GEMM's output).
_FRESH = frozenset({torch._C._nn.linear, torch.addmm, torch.mm, torch.matmul, torch.bmm})


def _contiguous_root(node: torch.fx.Node) -> bool:
    """Whether ``node`` is a contiguous tensor at run time by construction: through ``view``/``reshape`` calls and
    in-place ops that return their first operand (an activation's ``gelu_``) up to the op that made it, which is no
    view and either recorded contiguous or a GEMM (``_FRESH``: the lowered Linear+act has no recorded value)."""
    n = node
    while isinstance(n, torch.fx.Node) and n.op in ("call_method", "call_function") and n.args:
        name = _target_name(n)
        if _flat_view(n):
            n = n.args[0]
        elif (name.endswith("_") and not name.endswith("__") and not _geometry_write(n) and _view_kind(n) is None
              and isinstance(n.args[0], torch.fx.Node)):
            n = n.args[0]                      # in place: the same tensor, the same geometry
        else:
            break
    if not isinstance(n, torch.fx.Node) or n.op not in ("call_function", "call_method") or _view_kind(n) is not None:
        return False
    val = n.meta.get("val")
    if isinstance(val, torch.Tensor):
        return val.is_contiguous()
    return n.op == "call_function" and n.target in _FRESH


def _is_transpose_of(value: Any, weight: torch.Tensor) -> bool:
    """Whether ``value`` is ``weight.t()``: the same storage, offset and transposed geometry."""
    return (isinstance(value, torch.Tensor) and value.data_ptr() == weight.data_ptr()
            and value.shape == weight.t().shape and value.stride() == weight.t().stride())


def addmm_as_linear(gm: torch.fx.GraphModule) -> int:
    """Each ``addmm(b, x.view(-1, K), W)`` whose result only views read (transformers' ``Conv1D``: GPT-2's
    projections write ``x.view(-1, nx)``, ``addmm``, then a view back) as one ``linear(x, Wᵀ, b)``. ATen's
    ``linear`` runs that same ``addmm`` on that same flattened view (a 2-D input; a contiguous 3-D one through its
    flatten path), in C++: the same kernel on the same operands, bit for bit, and the two Python-to-ATen calls of
    the views around it are gone (a view back to the 3-D shape ``linear`` already returns is dropped; any other
    reads the 3-D result). ``Wᵀ`` is a transposed view of the weight, no copy, held as a plain attribute (as
    ``pin_attrs`` holds them). Only where the bias is 1-D, the weight 2-D, ``addmm`` has no ``beta``/``alpha`` and
    every reader of its result is a ``view``/``reshape`` (``_flattened_input`` says which inputs qualify). Edits
    ``gm`` in place; returns how many it replaced."""
    replaced = 0
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target not in _ADDMM or node.kwargs or len(node.args) != 3:
            continue
        b_node, view, w_node = node.args
        bias, weight = attr_tensor(gm, b_node), attr_tensor(gm, w_node)
        if bias is None or weight is None or weight.dim() != 2 or bias.dim() != 1 or bias.shape[0] != weight.shape[1]:
            continue
        x = _flattened_input(view, weight.shape[0])
        users = list(node.users)
        if x is None or not users or not all(_flat_view(u) and u.args[0] is node for u in users):
            continue
        out_shape = (*x.meta["val"].shape[:-1], weight.shape[1])
        name = "_lean_wt_" + str(w_node.target).replace(".", "_")
        while name in gm.__dict__ and not _is_transpose_of(gm.__dict__[name], weight):
            name += "_"
        gm.__dict__.setdefault(name, weight.detach().t())   # not registered: a plain attribute, a view
        with gm.graph.inserting_before(node):
            wt = gm.graph.create_node("get_attr", name)   # (get_attr() warns on an unregistered attribute)
            linear = gm.graph.call_function(torch._C._nn.linear, (x, wt, b_node))
        val = node.meta.get("val")
        if isinstance(val, torch.Tensor):
            linear.meta["val"] = val.view(out_shape)
        for u in users:
            if _view_shape(u) == tuple(out_shape):
                u.replace_all_uses_with(linear)
                gm.graph.erase_node(u)
            else:
                u.replace_input_with(node, linear)
        gm.graph.erase_node(node)
        gm.graph.erase_node(view)
        replaced += 1
    if replaced:
        gm.recompile()
    return replaced


def _geometry_write(node: torch.fx.Node) -> bool:
    target = node.target
    name = target if isinstance(target, str) else getattr(target, "__name__", "")
    if isinstance(target, torch._ops.OpOverload):
        name = target._schema.name.split("::")[-1]
    return name in _GEOMETRY_WRITES


def copies_per_forward(fn, *args) -> int:
    """How many ``aten::copy_`` one call of ``fn(*args)`` runs at any depth (the profiler sees inside composite
    ops: a ``contiguous``, a ``reshape`` that copies, ``matmul`` copying its rows into order): the CPU proxy of a
    forward's activation copies."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        fn(*args)
    return sum(e.count for e in prof.key_averages() if e.key == "aten::copy_")


def aten_calls_per_forward(fn, *args) -> int:
    """How many ATen ops one call of ``fn(*args)`` reaches through the dispatcher (``TorchDispatchMode``: views,
    ``as_strided`` and kernels alike; not tensor attribute reads such as ``stride()``): the CPU proxy of a
    forward's Python-to-ATen calls."""
    from torch.utils._python_dispatch import TorchDispatchMode

    count = [0]

    class _Count(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            count[0] += 1
            return func(*args, **(kwargs or {}))

    with _Count():
        fn(*args)
    return count[0]
