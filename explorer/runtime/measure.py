"""Measurement primitives shared by the runner and the benchmarks.

Everything here is plain torch: no UI packages, no child processes. The
runner (``explorer.gpu_runner``) calls these inside its measurement process;
``benchmarks/bench_models.py`` calls them in-process.

Method (``.library/device/METHOD.md``, ``shared/STYLE.md``):

- **latency**: warm up, then time every variant once per round, the variants
  alternated round after round (A B C A B C ...), so that clock and thermal
  drift hit all of them alike. On CUDA each call is timed with a pair of CUDA
  events; on the CPU with ``time.perf_counter``. We report the median with the
  20th and 80th percentiles, in milliseconds. Repetitions are chosen from the
  warm-up time so that each variant gets about ``target_s`` of timing.
- **peak memory** (CUDA only): ``reset_peak_memory_stats`` then one forward;
  ``activation_peak_bytes`` = ``max_memory_allocated`` minus what was allocated
  before the forward; ``peak_memory_bytes`` = this variant's own weights +
  inputs + its activation peak (other variants that share the device are not
  counted). On the CPU there is no allocator high-water mark we trust, so both
  are ``None`` with a note.
- **launches**: CUDA kernels in one forward, counted with ``torch.profiler``
  (``ProfilerActivity.CUDA`` events of device type CUDA, memcpy/memset left
  out). On the CPU: top-level ATen ops (``aten::`` events with no ``aten::``
  ancestor), labelled ``"aten ops (cpu)"``.
- **precision**: against a float64 reference (unfused graph, float64):
  ``max_abs``; ``max_rel`` = max|a-b| / max|ref| (normalised by the largest
  reference magnitude, not elementwise); ``rel_l2`` = ||a-b|| / ||ref||;
  ``cosine``; ``top1_agreement`` (classification only: argmax over the last
  dim of the first output).
- **bytes moved**: the graph byte model (``explorer.graph_model``: each op
  reads its inputs and weights once and writes its outputs once), captured in
  float32; floating bytes are scaled by ``element_size(dtype) / 4``.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import datetime
import math
import os
import platform
import shutil
import statistics
import subprocess
import time
from typing import Any, Callable, Iterable, Iterator, Sequence

import torch
import torch.fx
import torch.utils._python_dispatch

from explorer import stats
from explorer.errors import RunError
from explorer.messages import CASTS, NOTES, RUN
from explorer.graph import aten
from explorer.runtime import lean as lean_graphs
from explorer.units import GIB, available_host_bytes  # noqa: F401  (the runner reads both from here)
from explorer.fusions.rewrite import TORCH_DTYPES
from explorer.vocab import REFERENCE_DTYPE, Target, parse_dtype

DTYPES = TORCH_DTYPES   # the vocabulary's names (explorer.vocab) -> torch dtypes, and fp64 for the reference


# ------------------------------------------------------------------ devices and dtypes

def resolve_device(device: str) -> str:
    """``auto`` → ``cuda`` when available, else ``cpu``; ``cuda`` without CUDA is an error."""
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise RunError(RUN("no_cuda"))
    if device != "cpu" and not device.startswith("cuda"):
        raise RunError(RUN("unknown_device", device=device))
    return device


def torch_dtype(name: str) -> torch.dtype:
    """The torch dtype of a dtype name (``explorer.vocab.DTYPE_NAMES``, or ``fp64``); ``TargetError`` otherwise."""
    return DTYPES[name if name == REFERENCE_DTYPE else parse_dtype(name)]


def run_target(device: str, dtype: torch.dtype, channels_last: bool = False) -> Target:
    """The ``Target`` a graph prepared with these arguments runs for: ``fuse`` makes each chain's kernel choice
    for it, and ``prepare_graph``'s lowering reads that choice (``explorer.fusions.edit.planned``)."""
    name = next((n for n, d in DTYPES.items() if d == dtype), None)
    return Target(device, parse_dtype(name), "channels_last" if channels_last else "nchw")


def cuda_context_lost(device: str, exc: BaseException) -> bool:
    """Whether a failure left this process's CUDA context unusable: a CUDA error other than an
    out-of-memory (those are sticky: every later call fails), or a device that no longer answers.
    Always False on the CPU."""
    if not device.startswith("cuda"):
        return False
    text = str(exc)
    oom = isinstance(exc, torch.cuda.OutOfMemoryError) or "out of memory" in text.lower()
    if not oom and any(mark in text for mark in ("CUDA error", "cudaError", "illegal memory access",
                                                 "unspecified launch failure", "device-side assert")):
        return True
    try:
        torch.cuda.synchronize()
        torch.ones(1, device=device).add_(1).item()
        return False
    except Exception:
        return True

def synchronize(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def prepare_graph(gm: torch.fx.GraphModule, device: str, dtype: torch.dtype,
                  channels_last: bool = False, lean: bool = True,
                  casts: "CastRecord | None" = None,
                  binds: "lean_graphs.Binds | None" = None) -> torch.fx.GraphModule:
    """A copy of ``gm`` on ``device`` with floating weights and constants in ``dtype``.

    torch.export bakes ``device=cpu`` and ``dtype=torch.float32`` into factory
    calls (``arange``, ``zeros``, ``to``); those arguments are retargeted too,
    and float constants beyond the dtype's range (a mask's ``finfo(float32).min``)
    are clamped to the dtype's own extreme, as eager code using ``finfo(dtype)`` does.
    Integer and boolean tensors and dtypes are left alone. The original is not
    changed.

    Which floating dtypes are retargeted: with ``casts`` (a ``CastRecord`` made
    by ``record_casts`` for this ``dtype``), every node and lifted constant the
    record names takes the dtype the model itself gives it when it runs in
    ``dtype`` (an fp32 capture's no-op ``to(float32)`` stays an upcast where the
    model upcasts: RMSNorm's statistics, softmax, the rotary angles), except a
    cast that feeds a fused call (the fused kernel takes its chain's input in the
    run dtype and rounds inside as the model does), and the rest is retargeted as below. Without a record, the graph's capture dtype
    (``capture_dtype``) becomes ``dtype`` and other floating dtypes are kept (a
    bf16 capture's own float32 upcasts stay float32); a float64 target (the
    reference) retargets every floating dtype.

    Two clean-ups make the copy cheaper to run on the host, for unfused and fused
    graphs alike (every graph the runner times goes through here): calls that do
    no work in inference (eval-mode ``dropout``, capture-time metadata asserts)
    are dropped, and tensors read from nested submodules become attributes of
    the root (``_flatten_attrs``). With ``lean`` (the default), each call is
    also resolved once for the device and dtype (``explorer.lean``): ATen calls
    go through their public bindings, fused call targets call the library
    function they would pick at every forward, and weights are read as plain
    instance attributes. The result is final: move and cast before, not after.
    ``binds`` (default ``lean.DEFAULT_BINDS``, set from measurement) says which
    nodes are then bound at their first call: Triton fused calls, attention and
    linears on CUDA, trees of view-like nodes (``lean.collapse_views``) on every
    device, and ``nn.MultiheadAttention``'s sequence-first head split and gather
    run batch-first without their copies (``lean_heads``) on every device.

    The chains' own graphs that a fused graph calls (an inductor chain's
    ``CompiledChain``) are retargeted as the root's nodes are: a softmax's
    ``dtype=torch.float32`` inside one is the capture's dtype too (Falcon's
    ``softmax(..., dtype=hidden_states.dtype)``).
    """
    captured = capture_dtype(gm)
    record = casts if casts is not None and casts.dtype == dtype else None
    gm = copy.deepcopy(gm)
    target_device = torch.device(device)
    # Plain tensor attributes (lifted constants) are neither parameters nor buffers: .to() skips them.
    params = {id(p) for p in gm.parameters()} | {id(b) for b in gm.buffers()}
    for node in gm.graph.nodes:
        if node.op != "get_attr":
            continue
        owner, name = aten.attr_owner(gm, node.target)
        value = getattr(owner, name, None)
        if isinstance(value, torch.Tensor) and id(value) not in params:
            new = value.to(target_device)
            if new.is_floating_point():
                kept = record.attrs.get(str(node.target)) if record is not None else None
                new = new.to(kept or _float_target(new.dtype, dtype, captured))
            setattr(owner, name, new)

    limit = torch.finfo(dtype).max

    def retarget(a: Any, recorded: list[torch.dtype] | None, keep_float: bool = False) -> Any:
        if isinstance(a, torch.device):
            return target_device
        if keep_float and (isinstance(a, float) or (isinstance(a, torch.dtype) and a.is_floating_point)):
            return a                    # an index computation's own precision (``_index_regions``)
        if isinstance(a, torch.dtype) and a.is_floating_point:
            if recorded:
                return recorded.pop(0)  # what the model itself casts to at this dtype
            return _float_target(a, dtype, captured)
        if isinstance(a, float) and math.isfinite(a) and abs(a) > limit:
            # e.g. an attention mask's finfo(float32).min: the dtype's own extreme, as eager code does
            return math.copysign(limit, a)
        if isinstance(a, (list, tuple)):
            return type(a)(retarget(x, recorded, keep_float) for x in a)
        return a

    if record is not None and record.rewires:
        by_name = {n.name: n for n in gm.graph.nodes}
        for name, pairs in record.rewires.items():
            node = by_name.get(name)
            for old_name, new_name in pairs if node is not None else ():
                old, new_input = by_name.get(old_name), by_name.get(new_name)
                if old is not None and new_input is not None and new_input in _cast_chain(old)[1:]:
                    node.replace_input_with(old, new_input)  # what the model reads at this dtype
    # the root's graph, and the chains' own graphs a fused graph calls (``generic.CompiledChain``: a softmax's
    # ``dtype=torch.float32`` inside an inductor chain is the capture's as much as the root's ops are; their node
    # names are the capture's, so the record applies to them by name)
    for owner in [gm, *(m for m in gm.modules() if m is not gm and isinstance(m, torch.fx.GraphModule))]:
        keep = _index_regions(owner.graph, captured) if record is None and dtype in (torch.float16,
                                                                                     torch.bfloat16) else set()
        for node in list(owner.graph.nodes):
            if node.op != "call_function":
                continue
            if "_assert_tensor_metadata" in str(node.target) and not node.users:
                owner.graph.erase_node(node)  # a check of the capture-time dtype/device, not model work
                continue
            if node.target is torch.ops.aten.dropout.default and aten.args_of(node).get("train") is False:
                node.replace_all_uses_with(node.args[0])  # eval-mode dropout returns its input
                owner.graph.erase_node(node)
                continue
            entry = record.args.get(node.name) if record is not None else None
            if entry is not None and any("fused_chain" in user.meta for user in node.users):
                entry = None  # a fused kernel takes its chain's input in the run dtype and upcasts inside, as the model
            recorded = list(entry[1]) if entry is not None and entry[0] == str(node.target) else None
            node.args = tuple(retarget(a, recorded, node.name in keep) for a in node.args)
            node.kwargs = {k: retarget(v, recorded, node.name in keep) for k, v in node.kwargs.items()}
        owner.graph.lint()
        owner.recompile()
    gm = gm.to(target_device)
    gm = _cast_floating(gm, dtype)
    if channels_last:
        gm = gm.to(memory_format=torch.channels_last)
    _flatten_attrs(gm)
    if lean:
        lean_graphs.lower_aten_calls(gm)
        lean_graphs.specialize_fused_calls(gm, target_device, dtype, "channels_last" if channels_last else "nchw")
        binds = lean_graphs.DEFAULT_BINDS if binds is None else binds
        lean_graphs.apply_binds(gm, target_device, binds)
        lean_graphs.fold_constants(gm)
        lean_graphs.apply_view_binds(gm, binds)    # after folding: views of constants are folded, not collapsed
        lean_graphs.pin_attrs(gm)
    return gm.eval()


def capture_dtype(gm: torch.fx.GraphModule) -> torch.dtype:
    """The floating dtype the graph was captured in: that of most floating weights and inputs (float32
    when it has none). ``prepare_graph`` retargets this dtype to the run's."""
    counts: dict[torch.dtype, int] = {}
    for t in list(gm.parameters()) + list(gm.buffers()):
        if t.is_floating_point():
            counts[t.dtype] = counts.get(t.dtype, 0) + t.numel()
    for node in gm.graph.nodes:
        val = node.meta.get("val") if node.op == "placeholder" else None
        if isinstance(val, torch.Tensor) and val.is_floating_point():
            counts[val.dtype] = counts.get(val.dtype, 0) + 1
    return max(counts, key=counts.get) if counts else torch.float32


_INT_TO_FLOAT = ("aten.to.dtype", "aten._to_copy.default", "aten.to.dtype_layout")


def _index_regions(graph: torch.fx.Graph, captured: torch.dtype) -> set[str]:
    """The nodes of index computations a run without a cast record keeps in the capture's float dtype.

    Such a computation starts with a cast of an integer (or boolean) tensor to ``captured`` and ends in integer
    tensors again, with no other floating tensor coming in and none going out (T5's relative-position buckets:
    ``log(rp.float() / max_exact) ... .to(torch.long)``, an index into a bias table). Where the model's casts
    could not be recorded (its capture in the run dtype differs: T5 branches on its dtype), retargeting that
    ``float()`` to fp16 computes the buckets in fp16 and indexes past the table on a GPU. Kept as captured, it is
    what eager computes for ``.float()``, and at worst more precise than eager for a ``.to(x.dtype)``: its
    values are integers either way, and nothing floating of the model's changes dtype. Conservative: a node
    without a tensor ``val`` ends the search, and a region reached from two sides is not kept."""
    def val(n: Any) -> torch.Tensor | None:
        v = n.meta.get("val") if isinstance(n, torch.fx.Node) else None
        return v if isinstance(v, torch.Tensor) else None

    keep: set[str] = set()
    for node in graph.nodes:
        v = val(node)
        src = val(node.args[0]) if node.op == "call_function" and node.args else None
        if (v is None or src is None or str(node.target) not in _INT_TO_FLOAT or v.dtype != captured
                or src.is_floating_point() or src.is_complex()):
            continue
        region, stack, closed = {node.name}, [node], True
        while stack and closed:
            for user in stack.pop().users:
                if user.name in region or "_assert_tensor_metadata" in str(user.target):
                    continue                                       # (a capture-time check, erased here)
                uv = val(user)
                if user.op != "call_function" or uv is None:
                    closed = False
                    break
                if not uv.is_floating_point():
                    continue                                       # back to integers: the region's end there
                if any(a.name not in region and (val(a) is None or val(a).is_floating_point())
                       for a in user.all_input_nodes):
                    closed = False                                 # a floating tensor from outside: model work
                    break
                region.add(user.name)
                stack.append(user)
        if closed:
            keep |= region
    return keep


def _float_target(found: torch.dtype, dtype: torch.dtype, captured: torch.dtype) -> torch.dtype:
    """The dtype a floating dtype of the captured graph takes in a run in ``dtype`` (no cast record):
    the capture dtype becomes ``dtype``; others stay, except in a float64 run (the reference)."""
    if dtype == torch.float64 or found == captured:
        return dtype
    return found


@dataclasses.dataclass(frozen=True)
class CastRecord:
    """The floating dtypes a model gives its own casts and factories when it runs in ``dtype``.

    A graph captured in float32 cannot say which of its ``to(float32)`` calls are
    upcasts (RMSNorm's ``x.to(torch.float32)``) and which cast back to the input's
    dtype (``x.to(input_dtype)``): both are no-ops there. ``record_casts``
    captures the model once more with its weights in ``dtype`` and reads the
    answer. ``args``: node name → (its target, the floating dtypes among its
    arguments in order); ``attrs``: lifted constant → its dtype (a constant the
    model creates in float32 stays float32, as eager does). ``kept_float32``
    counts the casts that stay wider than ``dtype``. ``rewires``: node name →
    ((a no-op cast it reads in float32, the tensor the model reads instead), ...)
    (``_alias_rewires``).
    """

    dtype: torch.dtype
    args: dict[str, tuple[str, tuple[torch.dtype, ...]]]
    attrs: dict[str, torch.dtype]
    kept_float32: int = 0
    rewires: dict[str, tuple[tuple[str, str], ...]] = dataclasses.field(default_factory=dict)

    def describe(self) -> str:
        name = str(self.dtype).replace("torch.", "")
        return CASTS("kept", dtype=name, n=len(self.args), wider=self.kept_float32)


def _dtype_nodes(gm: torch.fx.GraphModule) -> list[torch.fx.Node]:
    out = []
    for node in gm.graph.nodes:
        if node.op != "call_function" or "_assert_tensor_metadata" in str(node.target):
            continue
        if _float_dtypes((node.args, node.kwargs)):
            out.append(node)
    return out


def _float_dtypes(a: Any) -> list[torch.dtype]:
    if isinstance(a, torch.dtype):
        return [a] if a.is_floating_point else []
    if isinstance(a, dict):
        return [d for v in a.values() for d in _float_dtypes(v)]
    if isinstance(a, (list, tuple)):
        return [d for v in a for d in _float_dtypes(v)]
    return []


_CASTS = ("aten.to.dtype", "aten.to.dtype_layout", "aten.to.device", "aten._to_copy.default", "aten.type_as.default")


def _is_cast(node: Any) -> bool:
    return isinstance(node, torch.fx.Node) and node.op == "call_function" and str(node.target) in _CASTS \
        and bool(node.args) and isinstance(node.args[0], torch.fx.Node)


def _cast_chain(node: torch.fx.Node) -> list[torch.fx.Node]:
    """``node`` and, while it is a cast, what it casts: ``[to_4, embedding]`` for ``to_4 = embedding.to(...)``."""
    chain = [node]
    while _is_cast(chain[-1]) and len(chain) < 16:
        chain.append(chain[-1].args[0])
    return chain


def _alias_rewires(gm: torch.fx.GraphModule, typed: torch.fx.GraphModule) -> dict[str, tuple[tuple[str, str], ...]] | None:
    """Where a float32 capture reads a no-op cast that the model does not read: node name → ((cast, the
    tensor the model reads), ...); None when the two captures' wiring differs in any other way.

    In float32, ``x.to(torch.float32)`` returns ``x`` itself, and torch.export then attributes every
    later use of ``x`` to the cast: a Llama layer's residual add reads RMSNorm's upcast ``to_4``
    instead of the embedding. At bf16 the model reads the bf16 tensor, and the run-dtype capture says so.
    """
    by_name = {n.name: n for n in gm.graph.nodes}
    out: dict[str, tuple[tuple[str, str], ...]] = {}
    for t in typed.graph.nodes:
        mine = by_name.get(t.name)
        if t.op != "call_function" or mine is None or str(mine.target) != str(t.target):
            continue
        a_in, t_in = mine.all_input_nodes, [_through_views(x) for x in t.all_input_nodes]
        if [x.name for x in a_in] == [x.name for x in t_in]:
            continue
        if len(a_in) != len(t_in):
            return None
        pairs = []
        for a, b in zip(a_in, t_in):
            if a.name == b.name or _through_views(a).name == b.name:
                continue
            names = [x.name for x in _cast_chain(a)]
            if b.name not in names[1:]:
                return None
            pairs.append((a.name, b.name))
        out[t.name] = tuple(pairs)
    return out


#: Calls a capture on the meta device and one on real tensors may differ in, never in what they compute: a
#: ``contiguous`` call on an already contiguous tensor returns it; a constant the model makes with
#: ``torch.tensor`` is read through ``lift_fresh_copy`` (a copy of it) from real tensors, directly on meta.
_SAME_VALUE = ("aten.contiguous.default", "aten.lift_fresh_copy.default")


def _through_views(node: torch.fx.Node) -> torch.fx.Node:
    """What a chain of ``_SAME_VALUE`` calls reads."""
    while node.op == "call_function" and str(node.target) in _SAME_VALUE and node.args \
            and isinstance(node.args[0], torch.fx.Node):
        node = node.args[0]
    return node


def _first_difference(gm: torch.fx.GraphModule, typed: torch.fx.GraphModule, mine: list[torch.fx.Node],
                      theirs: list[torch.fx.Node]) -> str:
    """Where two captures first differ, in a few words (for the "differs" note): a dtype-bearing node that one
    has and the other has not, or reads other inputs; else the first node whose inputs differ otherwise."""
    def says(n: torch.fx.Node | None) -> str:
        if n is None:
            return "nothing"
        return f"{n.name} = {str(n.target).replace('aten.', '')}({', '.join(_through_views(i).name for i in n.all_input_nodes)})"

    for a, b in zip(mine, theirs):
        if _signature(a) != _signature(b):
            return f"float32 has {says(a)}, the run dtype {says(b)}"
    if len(mine) != len(theirs):
        extra = (mine if len(mine) > len(theirs) else theirs)[min(len(mine), len(theirs))]
        return f"{'float32' if len(mine) > len(theirs) else 'the run dtype'} also has {says(extra)}"
    by_name = {n.name: n for n in gm.graph.nodes}
    for t in typed.graph.nodes:
        ours = by_name.get(t.name)
        if t.op == "call_function" and (ours is None or str(ours.target) != str(t.target) or
                                        [_through_views(i).name for i in ours.all_input_nodes] !=
                                        [_through_views(i).name for i in t.all_input_nodes]):
            return f"float32 has {says(ours)}, the run dtype {says(t)}"
    return "the wiring of a cast"


def _signature(node: torch.fx.Node) -> tuple:
    return (node.name, str(node.target), tuple(_through_views(n).name for n in node.all_input_nodes))


def _typed_capture(module: torch.nn.Module, inputs: Sequence[torch.Tensor], dtype: torch.dtype,
                   device: str | None = None, fake: bool = False) -> torch.fx.GraphModule:
    """``module`` captured with ``torch.export`` as if its floating weights and inputs were in ``dtype`` and on
    ``device`` (default: where its tensors are), without computing or copying a weight (``record_casts``'s
    capture; the result's parameters are meta or fake tensors: it is for reading, not for running). Raises
    what ``torch.export`` raises."""
    # on the device the model runs on, without its memory: a model's code may branch on its tensors' device
    # (an autocast region for CUDA only), so a capture on "meta" of a CUDA model is not the CUDA model's. On the
    # CPU, meta tensors (proven against every CPU test's capture) unless ``fake``; elsewhere fake tensors of that
    # device. A model may branch on meta too: transformers' MoE experts take another path there (Mixtral's capture
    # on meta differs from its CPU capture in float32 already, and fails to run with real weights: ``histc`` of
    # integers), which fake CPU tensors do not.
    devices = [t.device for t in (*module.parameters(), *module.buffers(), *inputs) if t.device.type != "meta"]
    target = torch.device(device) if device is not None else (devices[0] if devices else torch.device("cpu"))
    fake_mode = None
    if target.type != "cpu" or fake:
        from torch._subclasses.fake_tensor import FakeTensorMode

        fake_mode = FakeTensorMode(allow_non_fake_inputs=True)

    def meta(value: torch.Tensor) -> torch.Tensor:
        kind = dtype if value.is_floating_point() else value.dtype
        if fake_mode is None:
            return torch.empty(value.shape, device="meta", dtype=kind)
        with fake_mode:
            return torch.empty(value.shape, device=target, dtype=kind)

    # the copy's parameters and buffers are meta tensors of ``dtype``; every other tensor it holds is the
    # original's own (detached where autograd computed it): nothing is copied, and whatever the capture's
    # forward stores (a per-device cache: timm LeViT's attention biases under "meta") stays in the copy
    memo: dict[int, Any] = {id(t): t.detach() for t in _attribute_tensors(module)}
    for mod in module.modules():
        for key, value in mod._parameters.items():
            if value is not None and id(value) not in memo:
                memo[id(value)] = torch.nn.Parameter(meta(value), requires_grad=False)
        for key, value in mod._buffers.items():
            if value is not None and id(value) not in memo:
                memo[id(value)] = meta(value)
    typed_module = copy_module(module, memo)
    meta_inputs = tuple(meta(t) for t in inputs)
    with torch.no_grad():
        return torch.export.export(typed_module, meta_inputs).module()


def record_casts(module: torch.nn.Module, inputs: Sequence[torch.Tensor], gm: torch.fx.GraphModule,
                 dtype: torch.dtype, device: str | None = None) -> tuple[CastRecord | None, str]:
    """What the model's own casts are when its weights are in ``dtype`` (``CastRecord``), and a note.

    ``module`` is captured again with ``torch.export`` on the meta device (fake tensors of the model's
    own device where that is not the CPU: its code may branch on the device; ``device`` names the device the
    model will run on where its tensors are not there yet: a CPU module recorded for CUDA captures on fake
    CUDA tensors) (no weight is copied or
    computed: a structural copy of the module (``copy_module``) holds meta tensors of ``dtype`` for its
    parameters and buffers, as ``module.to(dtype)`` would cast them, and shares every other tensor; the
    module itself is not changed, not even by what its forward caches), and its dtype-bearing nodes are
    matched with ``gm``'s by name, target and inputs. When the two captures do not match node for
    node (the model branches on its dtype), no record is returned and the note says so: the graph
    then runs every capture-dtype op in ``dtype``. float32 and float64 need no record.
    """
    name = str(dtype).replace("torch.", "")
    if dtype in (torch.float32, torch.float64):
        return None, ""
    try:
        typed = _typed_capture(module, inputs, dtype, device)
    except Exception as exc:
        return None, CASTS("not_captured", dtype=name, reason=_one_line(exc))
    mine, theirs = _dtype_nodes(gm), _dtype_nodes(typed)
    rewires = _alias_rewires(gm, typed)
    on_cpu = device is None or torch.device(device).type == "cpu"
    if ([_signature(n) for n in mine] != [_signature(n) for n in theirs] or rewires is None) and on_cpu:
        try:   # a model that branches on the meta device (``_typed_capture``): its capture on fake CPU tensors
            other = _typed_capture(module, inputs, dtype, device, fake=True)
        except Exception:
            other = None
        if other is not None and [_signature(n) for n in mine] == [_signature(n) for n in _dtype_nodes(other)] \
                and _alias_rewires(gm, other) is not None:
            typed, theirs, rewires = other, _dtype_nodes(other), _alias_rewires(gm, other)
    if [_signature(n) for n in mine] != [_signature(n) for n in theirs] or rewires is None:
        return None, CASTS("differs_at", dtype=name, where=_first_difference(gm, typed, mine, theirs))
    args = {n.name: (str(n.target), tuple(_float_dtypes((n.args, n.kwargs)))) for n in theirs}
    wide = sum(1 for _t, ds in args.values() for d in ds if torch.finfo(d).bits > torch.finfo(dtype).bits)
    attrs: dict[str, torch.dtype] = {}
    ours = {str(n.target) for n in gm.graph.nodes if n.op == "get_attr"}
    params = {id(p) for p in typed.parameters()} | {id(b) for b in typed.buffers()}
    for node in typed.graph.nodes:
        if node.op != "get_attr" or str(node.target) not in ours:
            continue
        owner, attr = aten.attr_owner(typed, node.target)
        value = getattr(owner, attr, None)
        if isinstance(value, torch.Tensor) and id(value) not in params and value.is_floating_point():
            attrs[str(node.target)] = value.dtype
    record = CastRecord(dtype, args, attrs, wide, rewires)
    return record, record.describe()


def run_dtype_graph(module: torch.nn.Module, inputs: Sequence[torch.Tensor], gm: torch.fx.GraphModule,
                    dtype: torch.dtype, device: str | None = None) -> torch.fx.GraphModule | None:
    """``module`` captured with its floating weights and inputs in ``dtype``, runnable, for a model that branches
    on its dtype: ``None`` unless ``dtype`` is bf16 or fp16 and that capture differs from ``gm`` (``module``'s
    float32 capture) where ``record_casts`` matches the two (T5's and Whisper's fp16 clamp, T5's norm casting
    back to its weight's dtype, Mixtral's experts in bf16): there no cast record can be applied to ``gm``, and
    this graph is the unfused baseline that computes what eager computes in ``dtype``, every op in the dtype
    the model gives it (``prepare_graph`` keeps its float32 islands: its capture dtype is ``dtype``).

    Its analysis would not be ``gm``'s (other nodes, other names, another fingerprint): chains, plans and the
    fused graph stay ``gm``'s, so that a plan made at float32 applies in every dtype. The capture is
    ``record_casts``'s (``_typed_capture``) on fake tensors of the device (``device`` as there; never meta,
    which a model may branch on); its parameters and
    buffers are then the module's own, by name, cast to ``dtype`` where floating (what ``module.to(dtype)``
    holds; one copy of the weights in ``dtype``). ``None`` too where the capture fails or a tensor it names
    is not the module's."""
    if dtype not in (torch.float16, torch.bfloat16):
        return None
    try:
        typed = _typed_capture(module, inputs, dtype, device, fake=True)
    except Exception:
        return None
    mine, theirs = _dtype_nodes(gm), _dtype_nodes(typed)
    if [_signature(n) for n in mine] == [_signature(n) for n in theirs] and _alias_rewires(gm, typed) is not None:
        return None                                        # a record applies (``record_casts``): not needed
    own = {**dict(module.named_parameters(remove_duplicate=False)), **dict(module.named_buffers(remove_duplicate=False))}
    for kind, named in (("_parameters", typed.named_parameters(remove_duplicate=False)),
                        ("_buffers", typed.named_buffers(remove_duplicate=False))):
        for name, value in list(named):
            real = own.get(name)
            if real is None or tuple(real.shape) != tuple(value.shape):
                return None
            real = real.detach().to(dtype) if real.is_floating_point() else real.detach()  # moved by prepare_graph
            owner_name, _, attr = name.rpartition(".")
            owner = typed.get_submodule(owner_name) if owner_name else typed
            getattr(owner, kind)[attr] = torch.nn.Parameter(real, requires_grad=False) if kind == "_parameters" \
                else real
    return typed


def _graph_form(gm: torch.fx.GraphModule) -> list[tuple]:
    """Every node of ``gm`` as (op, name, target, arguments) with nodes by name and devices as one token: what two
    captures of one model on two devices must agree in to be the same graph (``prepare_graph`` retargets the
    devices)."""
    def form(a: Any) -> Any:
        if isinstance(a, torch.fx.Node):
            return ("node", a.name)
        if isinstance(a, torch.device):
            return "<device>"
        if isinstance(a, (list, tuple)):
            return type(a).__name__, tuple(form(x) for x in a)
        if isinstance(a, dict):
            return tuple(sorted((k, form(v)) for k, v in a.items()))
        if isinstance(a, (torch.dtype, torch.layout, torch.memory_format, str, int, float, bool, type(None))):
            return repr(a)
        return type(a).__name__
    # export's input-guard call (``_guards_fn``: shape checks, no model work) is dropped by ``capture`` too
    return [(n.op, n.name, str(n.target), form(n.args), form(n.kwargs)) for n in gm.graph.nodes
            if not (n.op == "call_module" and not n.users)]


def capture_differs(gm: torch.fx.GraphModule, module: torch.nn.Module, inputs: Sequence[torch.Tensor],
                    device: str) -> str | None:
    """Whether ``gm``, captured from ``module`` where its tensors are (the CPU), is the graph a capture on
    ``device`` makes (on fake tensors of that device, ``_typed_capture`` at the capture's dtype): ``None`` when
    the two agree node for node in op, name, target and arguments, devices aside (``prepare_graph`` retargets
    those); else where they first differ, in a few words (a model that branches on its device, or an operator
    decomposed per device). A capture that fails on ``device`` is a difference too."""
    try:
        other = _typed_capture(module, inputs, capture_dtype(gm), device)
    except Exception as exc:
        return f"the capture on {device} failed: {_one_line(exc)}"
    mine, theirs = _graph_form(gm), _graph_form(other)
    for a, b in zip(mine, theirs):
        if a != b:
            return f"node {a[1]} = {a[2]} here, {b[1]} = {b[2]} on {device}" if a[:3] != b[:3] else \
                f"node {a[1]} = {a[2]}: other arguments on {device}"
    if len(mine) != len(theirs):
        return f"{len(mine)} nodes here, {len(theirs)} on {device}"
    return None


def _flatten_attrs(gm: torch.fx.GraphModule) -> None:
    """Read every tensor through one attribute of the root instead of a chain of submodules.

    ``getattr(self.bert.encoder.layer, "0").attention.self.query.weight`` costs six
    ``Module.__getattr__`` calls per forward; BERT-base reads about 200 weights so. The
    tensor (the same object: a parameter stays a parameter of its submodule too, so
    weight counts do not change) is also registered on the root, and the node reads it there.
    """
    taken = set(dir(gm))
    for node in gm.graph.nodes:
        if node.op != "get_attr" or "." not in str(node.target):
            continue
        owner, name = aten.attr_owner(gm, node.target)
        value = getattr(owner, name, None)
        if not isinstance(value, torch.Tensor):
            continue
        flat = "_flat_" + str(node.target).replace(".", "_")
        while flat in taken:
            flat += "_"
        taken.add(flat)
        if isinstance(value, torch.nn.Parameter):
            gm.register_parameter(flat, value)
        elif any(b is value for b in owner.buffers(recurse=False)):
            gm.register_buffer(flat, value, persistent=False)
        else:
            setattr(gm, flat, value)
        node.target = flat
    gm.recompile()


def _attribute_tensors(module: torch.nn.Module) -> list[torch.Tensor]:
    """Tensors a module holds outside its parameters and buffers: plain attributes, and those in dicts, lists
    and tuples among them (a cache: timm LeViT's ``attention_bias_cache``)."""
    found: dict[int, torch.Tensor] = {}

    def visit(value: Any, depth: int) -> None:
        if isinstance(value, torch.Tensor):
            if not isinstance(value, torch.nn.Parameter):
                found[id(value)] = value
        elif depth < 4 and isinstance(value, dict):
            for v in value.values():
                visit(v, depth + 1)
        elif depth < 4 and isinstance(value, (list, tuple)):
            for v in value:
                visit(v, depth + 1)

    for mod in module.modules():
        for key, value in vars(mod).items():
            if key not in ("_parameters", "_buffers", "_modules"):
                visit(value, 0)
    return list(found.values())


def copy_module(module: torch.nn.Module, memo: dict[int, Any] | None = None) -> torch.nn.Module:
    """``copy.deepcopy(module)``, where a tensor autograd computed (in ``_attribute_tensors``) is copied as a detached
    clone (same values, same dtype and device; ``deepcopy`` refuses a non-leaf tensor). ``memo``: what the copy
    takes for given objects instead (``id`` → replacement), as ``copy.deepcopy``'s."""
    memo = dict(memo or {})
    for t in _attribute_tensors(module):
        if not t.is_leaf:   # a cache filled by a forward with gradients on: copy.deepcopy refuses it
            memo.setdefault(id(t), t.detach().clone())
    return copy.deepcopy(module, memo)


def grouped_mm_reference(mat_a: torch.Tensor, mat_b: torch.Tensor, offs: torch.Tensor | None = None,
                         bias: torch.Tensor | None = None, out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """What ``torch._grouped_mm`` computes, as a loop of per-group matmuls in any dtype (float64 included,
    which the op has no kernel for): ``mat_a`` (S, K) with its rows sorted by group, ``mat_b`` (G, K, N),
    ``offs`` (G,) the groups' cumulative row ends; row block ``offs[g-1]:offs[g]`` times ``mat_b[g]``. Rows past
    ``offs[-1]`` are zero here (the op leaves them unwritten). A 3-D ``mat_a`` (G, M, K) is a batched matmul.
    Other forms (2-D times 2-D, grouped along K: the op's backward) and a ``bias`` (which the op does not
    take yet) raise ``NotImplementedError``."""
    if bias is not None:
        raise NotImplementedError("grouped_mm_reference: a bias (torch._grouped_mm does not take one yet)")
    if mat_a.dim() == 3 and mat_b.dim() == 3 and offs is None:
        out = torch.bmm(mat_a, mat_b)                                      # (G, M, N)
        return out.to(out_dtype or out.dtype)
    if mat_a.dim() != 2 or mat_b.dim() != 3 or offs is None:
        raise NotImplementedError(f"grouped_mm_reference: mat_a {tuple(mat_a.shape)}, mat_b {tuple(mat_b.shape)}, "
                                  f"offs {'given' if offs is not None else 'none'}: only (S, K) x (G, K, N) by offs")
    out = torch.zeros(mat_a.shape[0], mat_b.shape[2], dtype=mat_a.dtype, device=mat_a.device)  # (S, N)
    start = 0
    for g, end in enumerate(offs.tolist()):
        if end > start:
            out[start:end] = mat_a[start:end] @ mat_b[g]                   # (rows of group g, K) @ (K, N)
        start = end
    return out.to(out_dtype or out.dtype)


class _Float64Ops(torch.utils._python_dispatch.TorchDispatchMode):
    """Routes the ATen operators with no float64 kernel (``_grouped_mm``: transformers' MoE experts on this
    torch) to their reference decompositions (``grouped_mm_reference``) when they get float64 tensors; every
    other call runs as it is."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.ops.aten._grouped_mm.default and args and args[0].dtype == torch.float64:
            names = ("mat_a", "mat_b", "offs", "bias", "out_dtype")
            return grouped_mm_reference(**dict(zip(names, args)), **kwargs)
        return func(*args, **kwargs)


class Float64Reference(torch.nn.Module):
    """An eager module in float64, called under ``_Float64Ops``: what ``prepare_module`` returns for float64,
    so that a model whose ops lack a float64 kernel still has its reference (never a skipped one)."""

    def __init__(self, module: torch.nn.Module) -> None:
        super().__init__()
        self.module = module

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        with _Float64Ops():
            return self.module(*args, **kwargs)


def prepare_module(module: torch.nn.Module, device: str, dtype: torch.dtype,
                   channels_last: bool = False) -> torch.nn.Module:
    """A copy of an eager module on ``device``, floating weights in ``dtype`` (``copy_module``); in float64
    wrapped in ``Float64Reference`` (operators without a float64 kernel run their reference decomposition)."""
    module = _cast_floating(copy_module(module).to(torch.device(device)), dtype)
    if channels_last:
        module = module.to(memory_format=torch.channels_last)
    return Float64Reference(module.eval()).eval() if dtype == torch.float64 else module.eval()


def _cast_floating(module: torch.nn.Module, dtype: torch.dtype) -> torch.nn.Module:
    # Module.to(dtype) casts only floating parameters and buffers: integer buffers stay.
    return module.to(dtype)


def prepare_inputs(inputs: Sequence[torch.Tensor], device: str, dtype: torch.dtype,
                   channels_last: bool = False) -> tuple[torch.Tensor, ...]:
    """Inputs on ``device``; floating ones in ``dtype`` (integer ids and masks untouched)."""
    out = []
    for t in inputs:
        t = t.to(torch.device(device))
        if t.is_floating_point():
            t = t.to(dtype)
            if channels_last and t.dim() == 4:
                t = t.contiguous(memory_format=torch.channels_last)
        out.append(t)
    return tuple(out)


def weight_bytes(module: torch.nn.Module) -> int:
    """Bytes of every distinct tensor the module holds (parameters, buffers, tensor attributes)."""
    seen: dict[int, int] = {}
    for t in list(module.parameters()) + list(module.buffers()):
        seen[t.data_ptr()] = t.numel() * t.element_size()
    if isinstance(module, torch.fx.GraphModule):
        for node in module.graph.nodes:
            if node.op == "get_attr":
                owner, name = aten.attr_owner(module, node.target)
                t = getattr(owner, name, None)
                if isinstance(t, torch.Tensor):
                    seen[t.data_ptr()] = t.numel() * t.element_size()
    return int(sum(seen.values()))


def tensor_bytes(tensors: Iterable[torch.Tensor]) -> int:
    return int(sum(t.numel() * t.element_size() for t in tensors))


# ------------------------------------------------------------------ memory fit

def check_fits(need_bytes: int, available_bytes: int, where: str) -> None:
    """Raise ``RunError("does not fit in memory: needs X GiB, Y GiB available")``."""
    if need_bytes > available_bytes:
        raise RunError(RUN("does_not_fit", need=need_bytes / GIB, available=available_bytes / GIB, where=where))


def zoo_input_bytes(source: str, batch: int | None, seq_len: int | None) -> int | None:
    """Bytes of a zoo model's example inputs at this size, computed without allocating them."""
    from explorer.sources import zoo

    entry = zoo.ZOO.get(source)
    return None if entry is None else entry.inputs.nbytes(batch, seq_len)


# ------------------------------------------------------------------ timing

def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile, ``q`` in [0, 100]."""
    xs = sorted(values)
    if not xs:
        return float("nan")
    pos = (len(xs) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def summarize(times_ms: Sequence[float]) -> dict[str, float]:
    return {"median": statistics.median(times_ms), "p20": percentile(times_ms, 20),
            "p80": percentile(times_ms, 80), "reps": len(times_ms)}


@dataclasses.dataclass(frozen=True)
class TimingPlan:
    """How to time: fixed warm-up/reps, or adaptive reps aiming at ``target_s`` per variant.

    ``max_rounds`` caps the rounds a paired comparison may grow to when its verdict
    is still open (``explorer.stats.needs_more``), within ``budget_s`` seconds of timing.
    """

    warmup: int | None = None
    reps: int | None = None
    target_s: float = 1.5
    min_reps: int = 10
    max_reps: int = 2000
    max_rounds: int = 2000
    budget_s: float = 3.0

    @classmethod
    def for_device(cls, device: str, warmup: int | None = None, reps: int | None = None,
                   short: bool = False, quick: bool = False) -> "TimingPlan":
        """The plan for whole models (``short``: single chains; ``quick``: a quick run's fewer repetitions)."""
        cuda = device.startswith("cuda")
        if quick:
            return (cls(warmup, reps, 0.3, 10, 200, 200, 0.6) if cuda else cls(warmup, reps, 0.1, 8, 12, 12, 0.5))
        if short:
            return (cls(warmup, reps, 0.15, 20, 200, 600, 1.5) if cuda else cls(warmup, reps, 0.05, 10, 30, 60, 0.6))
        return cls(warmup, reps, 1.5, 10, 2000, 4000, 3.0) if cuda else cls(warmup, reps, 0.4, 8, 200, 400, 1.5)


class L2Flush:
    """Evict the GPU's L2 cache before a timed call, as ``triton.testing.do_bench`` does.

    Zeroes a buffer of twice the L2 size (at least 64 MiB) on the current stream:
    the next kernel reads its inputs and weights from device memory, as a layer
    deep inside a real forward does, not from the 60 MB of L2 an H200 keeps of
    the previous call. The zeroing runs before the start event, so it is not timed.
    """

    def __init__(self, device: str) -> None:
        props = torch.cuda.get_device_properties(torch.device(device))
        self.l2_bytes = int(getattr(props, "L2_cache_size", 0) or 0)
        self.nbytes = max(2 * self.l2_bytes, 64 * 2**20)
        self.buffer = torch.empty(self.nbytes, dtype=torch.int8, device=device)

    def __call__(self) -> None:
        self.buffer.zero_()

    def describe(self) -> str:
        return NOTES("l2_flushed_before_every", n=f"{self.nbytes / 2**20:.0f}", n2=f"{self.l2_bytes / 2**20:.0f}")


def _timed_call(fn: Callable[[], Any], device: str, before: Callable[[], None] | None = None) -> float:
    if device.startswith("cuda"):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        if before is not None:
            before()
        start.record()
        fn()
        end.record()
        end.synchronize()
        return float(start.elapsed_time(end))
    if before is not None:
        before()
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1e3


class VariantFailed(RuntimeError):
    """A variant's call raised while it was timed: ``variant`` names it, ``__cause__`` is the error.

    Raised by the timing loops (``warm_up``, ``time_rounds``) and ``measure_variants``, so that a phase
    that fails can say which variant failed; the message is the error's own one line.
    """

    def __init__(self, variant: str, cause: BaseException) -> None:
        super().__init__(_one_line(cause))
        self.variant = variant


@contextlib.contextmanager
def _attributed(current: Callable[[], str | None]) -> Iterator[None]:
    """Re-raise any error inside as ``VariantFailed`` naming ``current()``, the variant then running
    (no wrapper around the timed calls themselves: nothing is added to what is timed)."""
    try:
        yield
    except VariantFailed:
        raise
    except Exception as exc:
        name = current()
        if name is None:
            raise
        raise VariantFailed(str(name), exc) from exc


def warm_up(variants: dict[str, Callable[[], Any]], device: str, plan: TimingPlan) -> dict[str, float]:
    """Run each variant until warm (``plan.warmup`` calls, or adaptively: at least 3 calls and up to
    0.2 s on the CPU, 1 s on CUDA); returns the last call's time of each, in ms."""
    first_ms: dict[str, float] = {}
    name = None
    with torch.inference_mode(), _attributed(lambda: name):
        for name, fn in variants.items():
            if plan.warmup is not None:
                for _ in range(plan.warmup):
                    fn()
                synchronize(device)
                first_ms[name] = _timed_call(fn, device)
            else:
                budget = 1.0 if device.startswith("cuda") else 0.2
                t0, calls, last = time.perf_counter(), 0, 0.0
                while calls < 3 or (time.perf_counter() - t0 < budget and calls < 50):
                    last = _timed_call(fn, device)
                    calls += 1
                first_ms[name] = last
    return first_ms


def planned_reps(plan: TimingPlan, first_ms: dict[str, float]) -> int:
    """Rounds to time: ``plan.reps``, or as many as give each variant about ``plan.target_s``."""
    if plan.reps is not None:
        return max(1, plan.reps)
    slowest = max(max(first_ms.values(), default=1e-3), 1e-3)
    return int(min(plan.max_reps, max(plan.min_reps, plan.target_s * 1e3 / slowest)))


def time_rounds(variants: dict[str, Callable[[], Any]], device: str, rounds: int, start_round: int = 0,
                on_round: Callable[[int, int], None] | None = None,
                before: Callable[[], None] | None = None,
                samples: dict[str, list[float]] | None = None) -> dict[str, list[float]]:
    """Time ``rounds`` more rounds, every variant once per round, alternated ABBA; returns every
    variant's samples (ms), appended to ``samples`` when given. Round ``i`` of each variant is a
    pair measured under the same conditions (``explorer.stats`` pairs them by index).

    A timed call always follows a call of the same variant: where the order switches variant, one
    untimed call of the new one runs first (then a synchronisation). Without it, half the calls of a
    host-bound model paid for the other model having just run (its code and objects in the CPU's
    caches, its weights in L2): ``benchmarks/check_timer.py`` measured plain calls of the fused
    ResNet-50 11% slower alternated than back to back, while CUDA-graph replays did not move.
    """
    names = list(variants)
    samples = samples if samples is not None else {n: [] for n in names}
    last = name = None
    with torch.inference_mode(), _attributed(lambda: name):
        for r in range(start_round, start_round + rounds):
            order = names if r % 2 == 0 else names[::-1]  # ABBA: neither variant always goes first
            for name in order:
                if len(names) > 1 and name != last:
                    variants[name]()  # steady state: the timed call follows one of its own
                    synchronize(device)
                samples[name].append(_timed_call(variants[name], device, before))
                last = name
            if on_round is not None:
                on_round(r + 1 - start_round, rounds)
    return samples


def time_paired(variants: dict[str, Callable[[], Any]], pairs: Sequence[tuple[str, str]], device: str,
                plan: TimingPlan, on_round: Callable[[int, int], None] | None = None,
                before: Callable[[], None] | None = None) -> dict[str, list[float]]:
    """Warm up, time the planned rounds, then add rounds while a (baseline, candidate) pair's verdict
    is open and the test needs more (``explorer.stats.needs_more``), up to ``plan.max_rounds`` and
    ``plan.budget_s`` seconds. Returns every variant's samples (ms)."""
    first = warm_up(variants, device, plan)
    n = planned_reps(plan, first)
    t0 = time.perf_counter()
    samples = time_rounds(variants, device, n, 0, on_round, before)
    if plan.reps is not None:
        return samples
    while time.perf_counter() - t0 < plan.budget_s:
        more = max((stats.needs_more(stats.compare(samples[b], samples[c]), plan.max_rounds) for b, c in pairs),
                   default=0)
        if not more:
            break
        per_round = (time.perf_counter() - t0) / max(len(next(iter(samples.values()))), 1)
        left = plan.budget_s - (time.perf_counter() - t0)
        more = max(1, min(more, int(left / max(per_round, 1e-6))))
        time_rounds(variants, device, more, len(next(iter(samples.values()))), None, before, samples)
    return samples


def time_alternated(variants: dict[str, Callable[[], Any]], device: str, plan: TimingPlan,
                    on_round: Callable[[int, int], None] | None = None) -> dict[str, dict[str, float]]:
    """Time each zero-argument callable; variants alternate in every round.

    Returns {name: {median, p20, p80, reps}} in milliseconds. Warm-up calls
    (``plan.warmup``, or adaptively: until 3 calls and 0.2 s/1 s of work) are not
    counted. Every call is synchronised, so a variant's time includes its own
    launch overhead, which is what fusion reduces.
    """
    if not variants:
        return {}
    first = warm_up(variants, device, plan)
    samples = time_rounds(variants, device, planned_reps(plan, first), 0, on_round)
    return {n: summarize(t) for n, t in samples.items()}


def speedup(before_ms: float | None, after_ms: float | None) -> float | None:
    """``before / after`` (how many times faster ``after`` is), or None when either is missing or zero."""
    return float(before_ms) / float(after_ms) if before_ms and after_ms else None


def throughput(batch: int, latency: dict[str, float]) -> float | None:
    """Items per second from the median latency."""
    ms = latency.get("median")
    return float(batch) / (ms / 1e3) if ms and ms > 0 else None


# ------------------------------------------------------------------ memory

def peak_memory(fn: Callable[[], Any], device: str, resident_bytes: int) -> dict[str, Any]:
    """Peak device memory over one call of ``fn``.

    ``resident_bytes`` is this variant's weights plus inputs; the total peak is
    reported as resident + activation peak so that other variants on the same
    device do not inflate it.
    """
    if not device.startswith("cuda"):
        return {"peak_memory_bytes": None, "activation_peak_bytes": None,
                "memory_note": "CPU run: no device allocator high-water mark; not measured"}
    with torch.inference_mode():
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        fn()
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated()
    activation = max(0, int(peak - before))
    return {"peak_memory_bytes": int(resident_bytes + activation), "activation_peak_bytes": activation,
            "memory_note": "peak = own weights + inputs + activation peak (max_memory_allocated over one "
                           "forward minus memory held before it)"}


# ------------------------------------------------------------------ launches

#: Kineto leaves NVIDIA's profiling library (CUPTI) attached after a CUDA profile unless told to tear it
#: down, and every later kernel launch then pays its callbacks: host-bound plain calls timed after a
#: profile were measured up to several times slower, the more so the more kernels they launch
#: (``benchmarks/results/check_timer_h200.json``, pytorch/pytorch#144455). Every profile is taken
#: through ``profiling``, which asks for the teardown (unless the caller's environment says otherwise).
CUPTI_TEARDOWN_ENV = ("TEARDOWN_CUPTI", "1")


def profiling(activities: list) -> Any:
    """``torch.profiler.profile(activities=...)`` that leaves no profiling library attached afterwards."""
    from torch.profiler import profile

    os.environ.setdefault(*CUPTI_TEARDOWN_ENV)
    return profile(activities=activities)


def count_launches(fn: Callable[[], Any], device: str) -> dict[str, Any]:
    """Kernels (CUDA) or top-level ATen ops (CPU) in one call of ``fn``; on CUDA also ``gpu_busy_ms``,
    the summed duration of those kernels (the GPU's own work per forward, from the profiler)."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity

    cuda = device.startswith("cuda")
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    try:
        with torch.inference_mode():
            fn()  # make sure lazy initialisation is not profiled
            synchronize(device)
            with profiling(activities) as prof:
                fn()
                synchronize(device)
        events = prof.events()
    except Exception as exc:  # the profiler is optional evidence: never fail the run for it
        return {"kernel_launches": None, "kernel_launches_kind": NOTES("counted", x=_one_line(exc))}
    if cuda:
        kernels = [e for e in events if e.device_type == DeviceType.CUDA
                   and not e.name.lower().startswith(("memcpy", "memset"))]
        try:
            busy_ms = sum(e.time_range.elapsed_us() for e in kernels) / 1e3
        except Exception:
            busy_ms = None
        return {"kernel_launches": len(kernels), "kernel_launches_kind": "cuda kernels", "gpu_busy_ms": busy_ms}
    n = 0
    for e in events:
        if not e.name.startswith("aten::"):
            continue
        parent, nested = e.cpu_parent, False
        while parent is not None:
            if parent.name.startswith("aten::"):
                nested = True
                break
            parent = parent.cpu_parent
        n += not nested
    return {"kernel_launches": int(n), "kernel_launches_kind": "aten ops (cpu)"}


# ------------------------------------------------------------------ precision

def flat_outputs(out: Any) -> list[torch.Tensor]:
    """Every tensor of a (nested) output, in order."""
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, dict):
        out = list(out.values())
    if isinstance(out, (list, tuple)):
        return [t for o in out for t in flat_outputs(o)]
    if hasattr(out, "to_tuple"):
        return flat_outputs(out.to_tuple())
    return []


def reference_problem(ref: torch.Tensor, dtype: torch.dtype | None = None) -> str | None:
    """Why relative errors against ``ref`` would mean nothing, or None when they are meaningful.

    A reference that is all zero (they divide by zero), constant (every element
    equal: the output says nothing about the model), or smaller than the run
    dtype's smallest normal number (in that dtype it is denormal or zero: the
    errors would measure underflow, not fusion).
    """
    if ref.numel() == 0:
        return "the reference output is empty"
    if not bool(torch.isfinite(ref).all()):
        return "the reference output is not finite"
    biggest = float(ref.abs().max())
    if biggest == 0.0:
        return "the reference output is all zero: relative errors would divide by zero"
    if ref.numel() > 1 and float(ref.max()) == float(ref.min()):
        return NOTES("reference_output_constant_every", x=f"{float(ref.flatten()[0]):.3g}")
    tiny = torch.finfo(dtype).tiny if dtype is not None and dtype.is_floating_point else torch.finfo(torch.float32).tiny
    name = str(dtype).replace("torch.", "") if dtype is not None else "float32"
    nonzero = ref[ref != 0].abs()
    if biggest < tiny or float((nonzero < tiny).double().mean()) > 0.5:
        return NOTES("reference_output_denormal_largest", x=name, x2=f"{biggest:.2e}", x3=f"{tiny:.2e}")
    return None


def precision(out: Any, ref: Any, classification: bool, dtype: torch.dtype | None = None) -> dict[str, Any]:
    """Errors of ``out`` against the float64 ``ref`` (floating outputs only, concatenated).

    ``dtype`` is the dtype the model ran in: a reference too small for it, all
    zero or constant gets no relative figures, and ``refused`` says why
    (``reference_problem``); ``max_abs`` is still given.
    """
    a_list = [t for t in flat_outputs(out) if t.is_floating_point()]
    r_list = [t for t in flat_outputs(ref) if t.is_floating_point()]
    if not a_list or len(a_list) != len(r_list):
        return {"max_abs": None, "max_rel": None, "rel_l2": None, "cosine": None, "top1_agreement": None,
                "finite": None, "refused": "no comparable floating outputs"}
    a = torch.cat([t.detach().to("cpu", torch.float64).reshape(-1) for t in a_list])
    r = torch.cat([t.detach().to("cpu", torch.float64).reshape(-1) for t in r_list])
    diff = a - r
    ref_max = float(r.abs().max()) if r.numel() else 0.0
    ref_norm = float(r.norm())
    finite = bool(torch.isfinite(a).all())
    denom = float(a.norm()) * ref_norm
    result: dict[str, Any] = {
        "max_abs": float(diff.abs().max()) if diff.numel() else 0.0,
        "max_rel": float(diff.abs().max()) / ref_max if ref_max > 0 else None,
        "rel_l2": float(diff.norm()) / ref_norm if ref_norm > 0 else None,
        "cosine": float((a * r).sum()) / denom if denom > 0 else None,
        "top1_agreement": None,
        "finite": finite,
        "refused": None,
    }
    if not finite:
        result.update(max_abs=float("inf"), max_rel=float("inf"), rel_l2=float("inf"))
    if classification:
        x, y = a_list[0], r_list[0]
        if x.dim() >= 1 and x.shape == y.shape and x.shape[-1] > 1:
            agree = (x.argmax(-1).cpu() == y.argmax(-1).cpu()).double().mean()
            result["top1_agreement"] = float(agree)
    problem = reference_problem(r, dtype)
    if problem is not None:
        result.update(max_rel=None, rel_l2=None, cosine=None, top1_agreement=None, refused=problem)
    return result


# ------------------------------------------------------------------ byte model

def element_ratio(dtype: torch.dtype) -> float:
    """Bytes per floating element in ``dtype`` over those of float32 (the capture dtype)."""
    return torch.empty((), dtype=dtype).element_size() / 4.0


def _is_float_name(name: str) -> bool:
    return name.startswith(("float", "bfloat", "half", "double"))


def graph_bytes(graph: Any, dtype: torch.dtype, nodes: Iterable[str] | None = None) -> int:
    """Bytes moved by the compute ops of ``graph`` (all, or ``nodes``), scaled to ``dtype``.

    Writes of floating outputs and reads of floating inputs (weights included)
    scale by ``element_ratio``; integer and boolean tensors (token ids, masks)
    keep their size.
    """
    ratio = element_ratio(dtype)
    names = graph.nodes if nodes is None else [n for n in nodes if n in graph.nodes]
    total = 0.0
    for n in names:
        attrs = graph.nodes[n]
        if not attrs.get("launches"):
            continue
        int_read = 0
        for u in graph.predecessors(n):
            dts = graph.nodes[u].get("dtypes") or []
            if dts and not any(_is_float_name(d) for d in dts):
                int_read += graph.edges[u, n].get("bytes", 0)
        int_read = min(int_read, attrs["bytes_read"])
        dts = attrs.get("dtypes") or []
        written = attrs["bytes_written"]
        w_ratio = ratio if (not dts or any(_is_float_name(d) for d in dts)) else 1.0
        total += (attrs["bytes_read"] - int_read) * ratio + int_read + written * w_ratio
    return int(round(total))


# ------------------------------------------------------------------ environment

def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:300]


def environment(device: str) -> dict[str, Any]:
    """Device, driver and library versions, UTC start time. Never raises."""
    env: dict[str, Any] = {
        "device": device,
        "is_cpu": not device.startswith("cuda"),
        "started_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": None, "triton": None, "driver": None, "device_name": None, "sm_clock_mhz": None,
        "python": platform.python_version(), "host": platform.node(),
        "cpu": platform.processor() or platform.machine(), "cpu_threads": torch.get_num_threads(),
    }
    try:
        import triton

        env["triton"] = triton.__version__
    except Exception:
        pass
    try:
        env["cudnn"] = torch.backends.cudnn.version()
    except Exception:
        pass
    if env["is_cpu"]:
        env["device_name"] = NOTES("cpu_device_name", cpu=env["cpu"], n=env["cpu_threads"])
        env["note"] = "CPU run: numbers are CPU numbers, not GPU numbers"
        return env
    try:
        idx = torch.device(device).index or 0
        props = torch.cuda.get_device_properties(idx)
        env["device_name"] = props.name
        env["device_memory_bytes"] = int(props.total_memory)
        env["compute_capability"] = f"{props.major}.{props.minor}"
        env["sm_count"] = props.multi_processor_count
    except Exception:
        pass
    env["note"] = "CUDA run"
    env.update(_nvidia_smi())
    return env


def _nvidia_smi() -> dict[str, Any]:
    exe = shutil.which("nvidia-smi")
    if not exe:
        return {}
    try:
        out = subprocess.run([exe, "--query-gpu=driver_version,clocks.sm,clocks.max.sm,temperature.gpu,power.draw",
                              "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=10)
        fields = [f.strip() for f in out.stdout.strip().splitlines()[0].split(",")]
        keys = ("driver", "sm_clock_mhz", "sm_clock_max_mhz", "temperature_c", "power_w")
        return {k: v for k, v in zip(keys, fields)}
    except Exception:
        return {}
