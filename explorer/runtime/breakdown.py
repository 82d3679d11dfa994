"""Where one forward's wall time goes: launch and host overhead, memory-bound kernels, compute-bound kernels, other.

The seed document's table (实际计算 / Kernel Launch / 内存读写 / 其他开销) measured on
the loaded model, before and after fusion. The method, for a prepared graph
(``measure.prepare_graph``: device, dtype, lean calls, as the runner times it):

1. **Wall time**: the plain forward, synchronised per call, timed alternated
   with the other variant (``measure.time_alternated``): the median.
2. **Device busy time**: one forward run node by node (``torch.fx.Interpreter``)
   under ``torch.profiler``, each node inside ``record_function("fx::<node>")``;
   every CUDA kernel's device time (memcpy and memset counted apart, as
   "other"). The Interpreter adds host time but not device time: a kernel takes
   as long however late it was issued, so only the device times of this pass
   are used, never its wall time.
3. **Classification** of each kernel, by this rule:
   - memcpy / memset → *other*;
   - a kernel issued inside a graph node whose FLOP and byte counts are known
     (the graph byte model: ``explorer.graph.build``, scaled to the dtype; a
     fused call counts its chain's FLOPs and the chain's bytes minus what fusion
     saves) → *compute-bound* when the node's arithmetic intensity (FLOP/byte)
     is at or above the device's ridge point (``Ceilings.ridge``), else
     *memory-bound*. When a node issues several kernels (a convolution, then
     its activation in place), this holds for its GEMM/convolution kernels
     only; its other kernels are memory-bound;
   - otherwise (no node, no counts, or no known ridge) by the kernel's name:
     GEMM and convolution families (gemm, cutlass, xmma, nvjet, cudnn conv,
     flash/fmha attention, ``mm``/``conv`` ATen ops on the CPU) → compute-bound;
     everything else (elementwise, reductions, norms, softmax, copies, Triton
     fused elementwise kernels) → memory-bound.
4. **Launch and host overhead** = wall − device busy: the time the device sat
   idle waiting for the host to issue the next kernel (Python, dispatch,
   launch). The four categories add up to the wall time exactly.

On the CPU there are no kernel launches in the GPU sense: the "kernels" are the
top-level ATen ops of each node, and wall − op time is the framework's own
overhead (Python between the calls). The profiler's own cost per op would count
as op time there, so each node's ops are scaled to the node's time measured
without the profiler (``perf_counter`` around each call, median of 5 runs).
``Breakdown.is_cpu`` says so and the views say it plainly.

What a CPU profile can show, and what it cannot. It measures each op's time (a
function call on the host) and so which kinds of op take the time
(``by_kind_ms``: convolution, matmul, normalization, activation, elementwise,
softmax/attention, data movement, other; ``op_kind``), how many ops a forward
runs before and after fusion, and the time between ops. It cannot show kernel
launch overhead (an op is a call, not a launch: nothing waits on a device), nor
whether an op is bound by memory or by arithmetic: a host timer does not see
DRAM stalls (that needs hardware counters), so the CPU's memory/compute split
here is only the byte model's intensity against a nominal ridge. The views show
the CPU's time by kind of op and say this; the GPU picture of the seed's table
is the committed H200 teaching report (``benchmarks/results/teaching_report_h200.json``).
"""

from __future__ import annotations

import bisect
import dataclasses
import re
import statistics
import time
from collections import Counter
from typing import Any, Callable, Iterable, Sequence

import torch
import torch.fx

from explorer.messages import BREAKDOWN, TASKS
from explorer.graph import aten
from explorer.runtime import measure as m

CATEGORIES = ("launch_host", "memory_bound", "compute_bound", "other")
#: Kinds of op a CPU profile splits its time into (``op_kind``), in the order the views list them.
OP_KINDS = ("convolution", "matmul", "normalization", "activation", "elementwise", "softmax_attention",
            "data_movement", "other")
#: The GPU picture of the seed's table, measured on an H200 (the views point to it from a CPU profile).
GPU_TEACHING_REPORT = "benchmarks/results/teaching_report_h200.json"
_KINDS = (("softmax_attention", re.compile(r"softmax|attention|sdpa|flash|fmha", re.I)),
          ("convolution", re.compile(r"conv|mkldnn_convolution|cudnn", re.I)),
          ("matmul", re.compile(r"\bmm\b|::mm|bmm|addmm|matmul|linear|gemm|baddbmm|einsum", re.I)),
          ("normalization", re.compile(r"batch_norm|layer_norm|group_norm|rms_norm|instance_norm|native_norm", re.I)),
          ("activation", re.compile(r"relu|gelu|silu|sigmoid|tanh|hardswish|hardtanh|hardsigmoid|mish|elu|"
                                    r"leaky|softplus|clamp", re.I)),
          ("data_movement", re.compile(r"copy|clone|contiguous|cat|stack|view|reshape|permute|transpose|expand|"
                                       r"slice|select|index|gather|pad|to_copy|_to|empty|zeros|split|chunk|flatten|"
                                       r"unsqueeze|squeeze|t\b", re.I)),
          ("elementwise", re.compile(r"add|sub|mul|div|pow|exp|log|sqrt|rsqrt|neg|mean|sum|max|min|where|"
                                     r"masked|fill|cumsum|amax|var|std|abs|pool", re.I)))


def op_kind(name: str) -> str:
    """The kind of op (``OP_KINDS``) of an ATen op or kernel name (``aten::conv2d`` → "convolution"), by name;
    a fused call of ours is named by what it computes first (``fused_conv_bn_act`` → "convolution")."""
    name = name.split("::", 1)[-1] if "::" in name else name
    for kind, pattern in _KINDS:
        if pattern.search(name):
            return kind
    return "other"
LABEL_PREFIX = "fx::"

RULE = ("kernels issued by a graph node with known FLOP and byte counts: compute-bound when the node's "
        "arithmetic intensity (FLOP/byte, graph byte model) is at or above the device's ridge point (peak "
        "FLOP/s / bandwidth), else memory-bound (of a node that issues several kernels, only its GEMM/convolution "
        "kernels; the others are memory-bound); kernels without counts or without a known ridge: by name "
        "(GEMM/convolution/attention families compute-bound, the rest memory-bound); memcpy/memset: other; "
        "launch and host overhead = wall time − device busy time")

_OTHER = re.compile(r"memcpy|memset", re.I)
_COMPUTE = re.compile(r"gemm|cutlass|xmma|nvjet|wgmma|hmma|cublas|matmul|_mm_|conv|fprop|dgrad|wgrad|"
                      r"implicit_convolve|winograd|flash|fmha|attention|sdpa|aten::mm|aten::bmm|aten::addmm|"
                      r"aten::linear|aten::conv|mkldnn_convolution|aten::_convolution", re.I)
# Names that contain a compute word but are memory-bound work around it.
_NOT_COMPUTE = re.compile(r"bn_fw|batch_norm|batchnorm|layer_norm|layernorm|softmax|elementwise|reduce_kernel|"
                          r"nchwtonhwc|nhwctonchw|transpose|copy", re.I)


def kernel_family(name: str) -> str:
    """"compute", "memory" or "other" for a kernel (or, on the CPU, an ATen op) by its name alone."""
    if _OTHER.search(name):
        return "other"
    if _COMPUTE.search(name) and not _NOT_COMPUTE.search(name):
        return "compute"
    return "memory"


@dataclasses.dataclass(frozen=True)
class KernelTime:
    """One device kernel (or, on the CPU, one top-level ATen op) of the profiled forward.

    ``node`` is the graph node that issued it ("" when unknown); ``flops`` and
    ``nbytes`` that node's counts from the byte model (None when unknown).
    """

    name: str
    us: float
    node: str = ""
    flops: float | None = None
    nbytes: float | None = None

    @property
    def intensity(self) -> float | None:
        """FLOP per byte of the node that issued the kernel, when both counts are known."""
        if self.flops is None or not self.nbytes:
            return None
        return self.flops / self.nbytes


def classify(k: KernelTime, ridge: float | None, alone: bool = True) -> tuple[str, str]:
    """(category, how it was decided) for one kernel: see the module docstring's rule.

    ``alone`` says whether the kernel is the only one its node issued; of a node
    that issues several (a convolution, then its activation in place), only the
    GEMM/convolution-family kernels take the node's intensity and the others are
    memory-bound by name.
    """
    family = kernel_family(k.name)
    if family == "other":
        return "other", "name (copy)"
    if ridge is not None and k.intensity is not None and (alone or family == "compute"):
        return ("compute_bound" if k.intensity >= ridge else "memory_bound"), "intensity"
    return ("compute_bound" if family == "compute" else "memory_bound"), "name"


@dataclasses.dataclass(frozen=True)
class Breakdown:
    """One forward's wall time split into ``CATEGORIES`` (milliseconds; they add up to ``wall_ms``)."""

    variant: str
    device: str
    is_cpu: bool
    wall_ms: float
    busy_ms: float
    categories_ms: dict[str, float]
    kernels: int
    by_intensity: int
    by_name: int
    ridge: float | None
    rule: str = RULE
    wall_p20_ms: float | None = None
    wall_p80_ms: float | None = None
    notes: tuple[str, ...] = ()
    top: tuple[dict, ...] = ()
    by_kind_ms: dict[str, float] = dataclasses.field(default_factory=dict)   # op time by ``OP_KINDS`` (ms)
    ops: int | None = None   # ops (CPU) or kernels (CUDA) per forward: ``kernels``, kept under its CPU name

    def fractions(self) -> dict[str, float]:
        """Each category's share of the wall time (0..1)."""
        return {c: (v / self.wall_ms if self.wall_ms > 0 else 0.0) for c, v in self.categories_ms.items()}

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["notes"], d["top"] = list(self.notes), list(self.top)
        return d

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Breakdown":
        names = {f.name for f in dataclasses.fields(cls)}
        d = {k: v for k, v in data.items() if k in names}
        d["notes"], d["top"] = tuple(d.get("notes", ())), tuple(d.get("top", ()))
        return cls(**d)


def combine(variant: str, device: str, wall_ms: float, kernels: Sequence[KernelTime], ridge: float | None,
            busy_ms: float | None = None, wall_spread: tuple[float, float] | None = None,
            notes: Iterable[str] = ()) -> Breakdown:
    """Split ``wall_ms`` into the four categories from the profiled kernels (a pure function).

    ``busy_ms`` is the device busy time (the union of kernel intervals); None
    means the sum of the kernels' times. When the device was busy longer than
    the wall time (the profiled pass and the timed forwards differ a little),
    the busy categories are scaled down to the wall time, launch and host
    overhead is 0, and a note says by how much.
    """
    notes = list(notes)
    total_us = sum(k.us for k in kernels)
    busy = (total_us / 1e3) if busy_ms is None else float(busy_ms)
    share: dict[str, float] = {c: 0.0 for c in CATEGORIES}
    ways = Counter()
    rows = []
    per_node = Counter(k.node for k in kernels if k.node)
    for k in kernels:
        cat, how = classify(k, ridge, alone=per_node.get(k.node, 0) <= 1)
        share[cat] += k.us
        ways[how] += 1
        rows.append((k, cat))
    busy_parts = {c: (share[c] / total_us * busy if total_us > 0 else 0.0) for c in CATEGORIES if c != "launch_host"}
    if busy > wall_ms > 0:
        notes.append(BREAKDOWN("device_busy_time_ms", x=f"{busy:.3f}", x2=f"{wall_ms:.3f}",
                               x3=f"{100 * (busy / wall_ms - 1):.1f}"))
        busy_parts = {c: v * wall_ms / busy for c, v in busy_parts.items()}
        busy = wall_ms
    categories = {"launch_host": max(wall_ms - busy, 0.0), **busy_parts}
    by_node: dict[tuple[str, str], dict] = {}
    for k, cat in rows:
        key = (k.node or k.name, cat)
        entry = by_node.setdefault(key, {"node": k.node, "kernel": k.name, "category": cat, "us": 0.0,
                                         "kernels": 0, "intensity": k.intensity})
        entry["us"] += k.us
        entry["kernels"] += 1
    top = sorted(by_node.values(), key=lambda e: -e["us"])[:15]
    by_kind = {kind: 0.0 for kind in OP_KINDS}
    for k in kernels:
        by_kind[op_kind(k.name)] += k.us / 1e3
    scale = busy / (total_us / 1e3) if total_us > 0 else 1.0   # the same scaling as the busy categories
    by_kind = {kind: round(v * scale, 6) for kind, v in by_kind.items()}
    return Breakdown(by_kind_ms=by_kind, ops=len(kernels),
        variant=variant, device=device, is_cpu=not device.startswith("cuda"), wall_ms=float(wall_ms),
        busy_ms=float(busy), categories_ms={c: float(categories[c]) for c in CATEGORIES},
        kernels=len(kernels), by_intensity=ways["intensity"], by_name=ways["name"] + ways["name (copy)"],
        ridge=ridge, wall_p20_ms=wall_spread[0] if wall_spread else None,
        wall_p80_ms=wall_spread[1] if wall_spread else None, notes=tuple(notes), top=tuple(top))


# ------------------------------------------------------------------ costs of the nodes

def node_costs(gm: torch.fx.GraphModule, graph: Any, detection: Any, dtype: torch.dtype
               ) -> dict[str, tuple[float, float]]:
    """{node name of ``gm``: (FLOPs, bytes)} from the graph byte model, scaled to ``dtype``.

    ``gm`` is a graph prepared *without* the lean lowering (``prepare_graph(...,
    lean=False)``), so that every fused chain is still one call; ``graph`` is
    the analysis graph of the unfused model. A fused call (it carries
    ``meta["fused_chain"]``) takes its chain's FLOPs and the chain's bytes minus
    what fusion saves; any other call takes the counts of the graph node with
    the same name and the same ATen target.
    """
    ratio = m.element_ratio(dtype)
    chains = detection.known_chains()
    costs: dict[str, tuple[float, float]] = {}
    for node in gm.graph.nodes:
        if node.op not in ("call_function", "call_method", "call_module"):
            continue
        chain = chains.get(node.meta.get("fused_chain", ""))
        if chain is not None:
            flops = sum(graph.nodes[n]["flops"] for n in chain.compute_nodes)
            nbytes = m.graph_bytes(graph, dtype, chain.compute_nodes) - chain.bytes_saved * ratio
            costs[node.name] = (float(flops), float(max(nbytes, 0)))
            continue
        attrs = graph.nodes[node.name] if node.name in graph.nodes else None
        if attrs is None or not attrs.get("launches") or node.op != "call_function" \
                or aten.target_str(node) != attrs.get("target"):
            continue
        costs[node.name] = (float(attrs["flops"]), float(m.graph_bytes(graph, dtype, [node.name])))
    return costs


# ------------------------------------------------------------------ profiling

class _LabelledInterpreter(torch.fx.Interpreter):
    """Runs a graph node by node, each call inside ``record_function("fx::<node name>")``; with ``timed``, also
    the host time of each call (``perf_counter`` around it, synchronised: the CPU's op time without the
    profiler's own overhead) into ``node_us``."""

    def __init__(self, gm: torch.fx.GraphModule, device: str = "cpu") -> None:
        super().__init__(gm)
        self.device = device
        self.timed = False
        self.node_us: dict[str, float] = {}

    def run_node(self, n: torch.fx.Node) -> Any:
        if n.op not in ("call_function", "call_method", "call_module"):
            return super().run_node(n)
        if self.timed:
            t0 = time.perf_counter()
            out = super().run_node(n)
            m.synchronize(self.device)
            self.node_us[n.name] = self.node_us.get(n.name, 0.0) + (time.perf_counter() - t0) * 1e6
            return out
        with torch.profiler.record_function(LABEL_PREFIX + n.name):
            return super().run_node(n)


def _cpu_op_times(interp: _LabelledInterpreter, inputs: Sequence[torch.Tensor], passes: int) -> dict[str, float]:
    """Median host µs of each node over ``passes`` timed runs, without the profiler."""
    runs = []
    interp.timed = True
    try:
        with torch.inference_mode():
            for _ in range(max(1, passes)):
                interp.node_us = {}
                interp.run(*inputs)
                runs.append(interp.node_us)
    finally:
        interp.timed = False
    return {n: statistics.median(r.get(n, 0.0) for r in runs) for n in runs[0]}


def rescale_to_node_times(kernels: list[KernelTime], node_us: dict[str, float]) -> list[KernelTime]:
    """Each node's ops scaled so that they add up to the node's time measured without the profiler (the CPU:
    the profiler's own cost per op would otherwise count as op time); ops of no node are left as they are."""
    profiled: dict[str, float] = {}
    for k in kernels:
        profiled[k.node] = profiled.get(k.node, 0.0) + k.us
    out = []
    for k in kernels:
        if k.node and profiled.get(k.node) and k.node in node_us:
            k = dataclasses.replace(k, us=k.us * node_us[k.node] / profiled[k.node])
        out.append(k)
    return out


def interval_union_us(intervals: list[tuple[float, float]]) -> float:
    """Length of the union of ``(start_us, end_us)`` intervals, in µs: overlapping kernels count once (a
    device's busy time; the benchmarks' profiles use it too)."""
    total, end = 0.0, float("-inf")
    for s, e in sorted(intervals):
        if e <= end:
            continue
        total += e - max(s, end)
        end = e
    return total


def _is_label(e) -> bool:
    """An ``fx::`` range of ours (on the host; the profiler mirrors it on the GPU's timeline too)."""
    return e.name.startswith(LABEL_PREFIX)


def _ranges(events) -> tuple[list[float], list[tuple[float, float, str, int]]]:
    """The host's ``fx::`` ranges sorted by start: (starts, [(start, end, node, thread)])."""
    from torch.autograd import DeviceType

    ranges = sorted((e.time_range.start, e.time_range.end, e.name[len(LABEL_PREFIX):], e.thread)
                    for e in events if _is_label(e) and e.device_type == DeviceType.CPU)
    return [r[0] for r in ranges], ranges


def _node_at(starts, ranges, start: float, end: float, thread: int) -> str:
    i = bisect.bisect_right(starts, start) - 1
    while i >= 0:
        s, e, node, th = ranges[i]
        if th == thread and s <= start and end <= e:
            return node
        if e < start:
            break
        i -= 1
    return ""


def profile_kernels(fn: Callable[[], Any], device: str, costs: dict[str, tuple[float, float]], passes: int = 3
                    ) -> tuple[list[KernelTime], float | None, list[str]]:
    """Profile ``passes`` calls of ``fn`` (which runs a ``_LabelledInterpreter``) after one warm-up call, and
    keep the call whose total kernel time is the median (a one-off stall of a shared machine does not
    decide the breakdown): (kernels, device busy ms, notes).

    CUDA: every device kernel, attributed to the ``fx::`` range it was issued
    in where the profiler links it to a CPU event, with that node's counts;
    busy time is the union of kernel intervals. CPU: the top-level ATen ops in
    each range (their CPU time); busy is None (their sum).
    """
    with torch.inference_mode():
        fn()
        m.synchronize(device)
        runs = [_profile_once(fn, device, costs) for _ in range(max(1, passes))]
    runs.sort(key=lambda r: sum(k.us for k in r[0]))
    kernels, busy, notes = runs[len(runs) // 2]
    if len(runs) > 1:
        notes = [*notes, BREAKDOWN("median_profiled_forwards_total", n=len(runs))]
    return kernels, busy, notes


def _profile_once(fn: Callable[[], Any], device: str, costs: dict[str, tuple[float, float]]
                  ) -> tuple[list[KernelTime], float | None, list[str]]:
    """One profiled call of ``fn`` (see ``profile_kernels``)."""
    from torch.profiler import ProfilerActivity

    cuda = device.startswith("cuda")
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with torch.inference_mode():
        with m.profiling(activities) as prof:
            fn()
            m.synchronize(device)
    return attribute_events(list(prof.events()), costs, cuda)


def attribute_events(events: list, costs: dict[str, tuple[float, float]], cuda: bool
                     ) -> tuple[list[KernelTime], float | None, list[str]]:
    """The profiler's events of one labelled forward as ``KernelTime``s: (kernels, device busy ms, notes).

    ``events`` are ``torch.profiler`` ``FunctionEvent``s (anything with ``name``,
    ``device_type``, ``time_range.start/.end`` in µs, ``thread``, and on host
    events ``kernels``: (name, device, duration) of the device kernels the
    profiler linked to them). A pure function of the events, tested on made-up
    ones; ``_profile_once`` feeds it a real profile.
    """
    from torch.autograd import DeviceType

    starts, ranges = _ranges(events)
    notes: list[str] = []
    if cuda:
        # kernels, memcpy and memset; not the GPU-timeline copies of our fx:: ranges (user annotations)
        device_events = [e for e in events if e.device_type == DeviceType.CUDA and not _is_label(e)
                         and not getattr(e, "is_user_annotation", False)]
        busy_us = interval_union_us([(e.time_range.start, e.time_range.end) for e in device_events])
        attributed: dict[tuple[str, float], list[str]] = {}
        for e in events:
            if e.device_type != DeviceType.CPU:
                continue
            kernels = getattr(e, "kernels", None) or []
            if not kernels:
                continue
            node = e.name[len(LABEL_PREFIX):] if e.name.startswith(LABEL_PREFIX) else \
                _node_at(starts, ranges, e.time_range.start, e.time_range.end, e.thread)
            for k in kernels:
                attributed.setdefault((k.name, round(float(k.duration), 3)), []).append(node)
        out = []
        linked = 0
        for e in device_events:
            dur = float(e.time_range.end - e.time_range.start)
            nodes = attributed.get((e.name, round(dur, 3)))
            node = nodes.pop() if nodes else ""
            linked += bool(node)
            flops, nbytes = costs.get(node, (None, None))
            out.append(KernelTime(e.name, dur, node, flops, nbytes))
        if device_events and linked < len(device_events):
            notes.append(BREAKDOWN("kernels_could_linked_graph", n=len(device_events) - linked, n2=len(device_events)))
        return out, busy_us / 1e3, notes
    # CPU: top-level ATen ops inside each node's range
    ops = sorted((e for e in events if e.name.startswith("aten::") and e.device_type == DeviceType.CPU),
                 key=lambda e: e.time_range.start)
    out = []
    open_end: dict[int, float] = {}
    for e in ops:
        s, t = e.time_range.start, e.time_range.end
        if s < open_end.get(e.thread, float("-inf")):
            continue  # nested inside a top-level op already counted
        open_end[e.thread] = t
        node = _node_at(starts, ranges, s, t, e.thread)
        flops, nbytes = costs.get(node, (None, None))
        out.append(KernelTime(e.name, float(t - s), node, flops, nbytes))
    notes.append("CPU profile: no kernel launches in the GPU sense; 'kernels' are the top-level ATen ops of each "
                 "graph node (their CPU time) and 'launch and host overhead' is the framework's own time "
                 "(Python, dispatch, allocation)")
    return out, None, notes


def breakdowns(variants: dict[str, tuple[torch.fx.GraphModule, torch.fx.GraphModule, dict[str, tuple[float, float]]]],
               inputs: Sequence[torch.Tensor], device: str, ridge: float | None,
               timing: m.TimingPlan | None = None,
               on_step: Callable[[float, str], None] | None = None) -> dict[str, Breakdown]:
    """The breakdown of each variant, {name: (timed graph, profiled graph, node costs)}, on ``inputs``.

    The timed graph is what the runner times (lean); the profiled graph is the
    same model prepared without the lean lowering (the same kernels, one call
    per fused chain, so that each kernel can be charged to its chain). Wall
    times of all variants are measured together, alternated; then each is
    profiled once, node by node. Returns {name: Breakdown}.
    """
    emit = on_step or (lambda f, s: None)
    timing = timing or m.TimingPlan.for_device(device)  # whole forwards: the runner's plan, not a chain's
    emit(0.05, "timing the plain forwards")
    fns = {name: (lambda g=timed: g(*inputs)) for name, (timed, _, _) in variants.items()}
    walls = m.time_alternated(fns, device, timing)
    out = {}
    for i, (name, (_, profiled, costs)) in enumerate(variants.items()):
        emit(0.5 + 0.5 * i / max(len(variants), 1), TASKS("profiling_node_node", x=name))
        interp = _LabelledInterpreter(profiled, device)
        kernels, busy_ms, notes = profile_kernels(lambda: interp.run(*inputs), device, costs)
        if not device.startswith("cuda"):  # op times without the profiler's own cost per op
            kernels = rescale_to_node_times(kernels, _cpu_op_times(interp, inputs, 5))
        w = walls[name]
        out[name] = combine(name, device, w["median"], kernels, ridge, busy_ms, (w["p20"], w["p80"]), notes)
    emit(1.0, "profiled")
    return out


def model_breakdowns(analysis: Any, fused_gm: torch.fx.GraphModule, device: str, dtype_name: str,
                     ridge: float | None, channels_last: bool = False, timing: m.TimingPlan | None = None,
                     on_step: Callable[[float, str], None] | None = None) -> dict[str, Breakdown]:
    """Before and after fusion: {"unfused": Breakdown, "fused": Breakdown} for an ``Analysis`` and its fused
    graph, both prepared as the runner prepares them (device, dtype, memory format, lean calls)."""
    model, graph, detection = analysis
    dtype = m.torch_dtype(dtype_name)
    inputs = m.prepare_inputs(model.example_inputs, device, dtype, channels_last)
    variants = {}
    for name, gm in (("unfused", model.gm), ("fused", fused_gm)):
        profiled = m.prepare_graph(gm, device, dtype, channels_last, lean=False)
        variants[name] = (m.prepare_graph(gm, device, dtype, channels_last), profiled,
                          node_costs(profiled, graph, detection, dtype))
    return breakdowns(variants, inputs, device, ridge, timing, on_step)
