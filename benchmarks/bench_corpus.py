"""The corpus (``benchmarks/corpus.py``) at its real sizes on one GPU: fused against unfused and torch.compile.

Every corpus model at its real layer sizes and real input shape (``Entry.real``), fp16 (bf16 for decoders),
CNNs channels_last, through the runner's own pieces: captured, detected, every chain fused
(``fusion_engine`` / ``fusions.rewrite``), both graphs prepared as the runner prepares them
(``runtime.measure.prepare_graph`` with the model's own casts, ``record_casts``; for a model that branches on its
dtype, its capture in the run dtype, ``run_dtype_graph``), against eager, torch.compile
default and, as CUDA graphs, the fused graph replayed against ``torch.compile(mode="reduce-overhead")``. All
variants of a model are timed in the same alternated rounds (``measure.time_paired``) and each pair gets the
paired verdict (``explorer.stats.compare``: Wilcoxon over paired rounds, 3% minimum effect). Precision is
rel_l2 against the model in float64. Where the fused graph loses, the JSON keeps the top kernels of one
profiled forward of fused and compiled beside the kernel each chain chose (its label): the per-kernel reason.

Device time is scarce, so:
- models run in order of what they tell (``ORDER``: one of each family first, the decoders at 7-8B layer
  sizes early), each in a child process of its own (a CUDA fault or an out-of-memory loses one model);
- each child does everything that needs no GPU before it takes the GPU (``prepare_on_host``, on the waiting cores,
  while another model holds the GPU): the imports, the model built on the CPU (``Entry.build``: seeded, the same
  weights on any machine; the library's own initialisation draws from the CPU generator, as in the CI tests),
  captured, detected, fused with the kernels chosen for the GPU, and its casts recorded for the bench dtype and the
  other ``fidelity`` dtype on fake CUDA tensors. The CPU capture is checked against a capture on fake CUDA tensors
  (``measure.capture_differs``: node for node, devices aside); where they differ the graph is captured again on the
  GPU inside the lock, and the row says why;
- the GPU section (``measure_on_device``: an exclusive OS file lock, ``fcntl.flock`` on ``--lock``, taken after the
  host phase and released after the model's GPU memory is freed) moves the model to the device, prepares both
  graphs and eager, compiles (default and reduce-overhead; caches warm), runs the float64 reference, precision and
  fidelity (the bench dtype's row from the variants just checked, only the other dtype prepared anew), timing
  and profiling. The JSON keeps per model the seconds of every phase on each side (``seconds.outside_lock``,
  ``seconds.inside_lock``) and of the lock (``lock``: waited, held, the wall-clock interval, ``host_done_at``);
- ``--workers`` model processes (default 4; 2 in ``--smoke``) make the pipeline; the waiting ones share the
  waiting cores' threads (``--host-threads``, set by the parent);
- before the timing phase, ``--warm-workers`` child processes (default 6) build each model on the GPU, compile it
  (default and reduce-overhead) and run the fused graph once, all sharing one ``TORCHINDUCTOR_CACHE_DIR`` and
  ``TRITON_CACHE_DIR``: the timing phase then finds inductor's and Triton's kernels compiled. The parent holds the
  GPU lock through the warm phase, so the first timing children do their host phase meanwhile. A model is warmed
  only while the models warmed so far are fewer than the rest of the budget can time (``PER_MODEL_S`` each, plus
  the workers): the phase ends where warming and timing balance, and ``--warm-share`` of the budget caps it;
- ``--budget-s`` (default 330) bounds the whole run: no model starts after it and each child's timeout is what is
  left; a child that gets the lock with under ``LOCK_MARGIN_S`` left skips (``COLD_LOCK_MARGIN_S`` for a model the
  warm phase did not warm); what was skipped is listed in the JSON
  and the table;
- ``--only`` / ``--skip`` (comma-separated corpus names or prefixes: ``hf/``, ``tv/resnet``);
- ``--skip-measured A.json,...``: skip every model those results measured (a row without an error; a merged
  table's ``models``): the next part of a corpus run without its names on the command line;
- ``--merge A.json,B.json,...``: one table from several runs' JSONs (a model measured twice keeps the later);
- ``--smoke``: the CPU, two tiny entries at their CI sizes, float32, end to end through the pipeline (no warm
  workers; the numbers are not GPU numbers).

Why the overlap cannot perturb the timing: every variant of one model is still built, prepared and timed in one
process, in the same alternated rounds, with the same layout and plan as before. While a process holds the lock
no other process runs work on the GPU: the others are before their GPU section (their host phase launches nothing
there and allocates nothing: it reads the device through fake tensors and device queries) or gone (a child frees
its GPU memory and exits its GPU section before releasing). A waiting process does hold an idle CUDA context by
then (part 5: ``cuda_context_before_lock`` true for every model; some device query of the fake capture or of the
kernel choice makes the driver create it): it takes no GPU time, and it is stopped while the holder times.
The host phases are heavy CPU work now (builds, captures), so while the holder times and profiles, the parent
stops every other model process (``Quiet``: ``SIGSTOP`` to their process groups, ``SIGCONT`` after; the row's
``lock.quiet`` says whether the window was granted): the timed rounds run with the host to themselves, as a serial
run's did. Outside that window the holder is pinned (``os.sched_setaffinity``) to its own cores (the first half of
the machine's) and every waiting process to the other half.

    python3 benchmarks/bench_corpus.py                         # on the H200: JSON per model + summary in $OUT
    python3 benchmarks/bench_corpus.py --smoke                 # here, on the CPU
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import dataclasses
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks._common import results_path, run_stamp, write_json  # noqa: E402
from explorer.runtime.gpulock import GpuLock, core_sets, free_device  # noqa: E402,F401  (the one exclusive section)

#: What runs first: the decoders nobody here wrote at 7-8B layer sizes, then the architectures that failed
#: before (RegNet, Swin, ViT, EfficientNet-V2), then one of each family; the rest of torchvision last.
ORDER = ("hf/llama", "hf/qwen2", "tv/regnet_y_1_6gf", "tv/swin_t", "hf/vit", "tv/efficientnet_v2_s", "hf/mistral",
         "hf/bert", "tv/resnet50", "timm/convnextv2_atto", "hf/gemma2", "hf/phi3", "hf/mixtral", "hf/gpt2",
         "tv/mobilenet_v3_large", "timm/regnety_016", "timm/efficientnetv2_rw_t", "timm/ghostnet_100",
         "hf/t5_encoder", "hf/whisper_encoder", "hf/falcon", "hf/gpt_neox", "hf/opt", "tv/efficientnet_b0",
         "tv/convnext_tiny", "timm/mobilenetv4_conv_small", "hf/roberta", "hf/distilbert", "hf/clip_vision",
         "hf/swin", "timm/repvgg_a0", "timm/resnet50d", "tv/densenet121", "tv/shufflenet_v2_x1_0", "tv/vit_b_16",
         "timm/edgenext_xx_small", "timm/fastvit_t8", "timm/levit_128s", "timm/mobilevit_xxs",
         "timm/poolformer_s12", "timm/coatnet_0_rw_224", "timm/maxvit_tiny_rw_224", "timm/deit_tiny_patch16_224",
         "timm/swin_tiny_patch4_window7_224", "timm/mixer_b16_224", "tv/maxvit_t", "tv/mnasnet1_0",
         "tv/squeezenet1_1", "tv/googlenet", "tv/inception_v3", "tv/resnext50_32x4d", "tv/swin_v2_t")
SMOKE = ("tv/squeezenet1_1", "hf/distilbert")
#: the pairs each model's verdicts compare: (baseline, candidate)
PAIRS = (("unfused", "fused"), ("eager", "fused"), ("compile_default", "fused"),
         ("compile_reduce_overhead", "fused_cuda_graphs"))
#: the low dtypes whose fidelity every model reports (``fidelity``)
FIDELITY_DTYPES = ("fp16", "bf16")


def ordered(names: list[str]) -> list[str]:
    """``ORDER`` first, then every other corpus entry (the rest of torchvision, smallest names first)."""
    rank = {n: i for i, n in enumerate(ORDER)}
    return sorted(names, key=lambda n: (rank.get(n, len(ORDER)), n))


def measured_in(paths: str) -> set[str]:
    """The models the ``bench_corpus/1`` results at ``paths`` (comma-separated) measured: rows without an error
    (a model cut by a budget or that failed is not measured). ``ValueError`` with the file for a file that is not
    such a result."""
    names: set[str] = set()
    for p in (q for q in paths.split(",") if q):
        doc = read_result(p)
        names |= {n for n, row in (doc.get("models") or {}).items() if isinstance(row, dict) and "error" not in row}
    return names


def read_result(p: str) -> dict:
    """The ``bench_corpus/1`` result at ``p``; ``ValueError`` with a one-line reason naming ``p`` otherwise."""
    try:
        doc = json.loads(Path(p).read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"cannot read {p}: {type(exc).__name__}: {exc}") from None
    if not isinstance(doc, dict) or doc.get("schema") != "bench_corpus/1":
        raise ValueError(f"{p} is not a bench_corpus/1 result")
    return doc


def select(all_names: list[str], only: str, skip: str) -> list[str]:
    def hit(n: str, spec: str) -> bool:
        return any(n == s or (s.endswith("/") and n.startswith(s)) or n.startswith(s) for s in spec.split(",") if s)

    names = [n for n in all_names if (not only or hit(n, only)) and not (skip and hit(n, skip))]
    return ordered(names)


#: device seconds one model takes in the timing pipeline (to the device through profile, caches warm; part 5: 17
#: models in the 311 s after its warm phase, the lock held 8.8-30.4 s, 17.0 on average): sizes the warm set
PER_MODEL_S = 18.0
#: a warm child is started only with this much of the warm phase left (part 5: 16-86 s a model under the host
#: phases' load, median 29; the 6 started too late were killed at the phase's end, their compiles lost)
WARM_MODEL_S = 30.0
#: a child that gets the lock with less than this left skips (part 4 lost 22 s to a model killed mid-section)
LOCK_MARGIN_S = 20.0
#: the same for a model the warm phase did not warm (its compiles run cold inside the lock: part 6 lost its last 58 s
#: to such a model, killed at the budget's end)
COLD_LOCK_MARGIN_S = 75.0
#: how long a lock holder waits for the other model processes to be stopped before it times (``Quiet``)
QUIET_WAIT_S = 3.0


def run_case(args) -> dict:
    """A child: the imports and every CPU-side step of the model (``prepare_on_host``) outside the lock, on the
    waiting cores; what runs kernels on the GPU (``measure_on_device``) inside it, on the holder's. The JSON's
    ``seconds`` keeps the phases of each side (``outside_lock``, ``inside_lock``), ``lock`` the seconds waited
    and held and when the host phase ended (``host_done_at``, before ``acquired_at``)."""
    import importlib

    holder, waiting = core_sets()
    pin = len(holder | waiting) > 1 and not args.warm
    if len(os.sched_getaffinity(0)) > 1:
        os.sched_setaffinity(0, waiting)
    t0 = time.perf_counter()
    import torch

    from benchmarks import _common, corpus  # noqa: F401
    from explorer import stats  # noqa: F401
    from explorer.fusion_engine import detect  # noqa: F401
    from explorer.fusions.rewrite import apply_plan  # noqa: F401
    from explorer.runtime import measure, variants  # noqa: F401
    from explorer.sources import capture  # noqa: F401

    library = {"torchvision": "torchvision", "timm": "timm", "transformers": "transformers"}.get(
        corpus.by_name(args.case).library)
    if library:
        importlib.import_module(library)
    if not args.no_compile:      # torch.compile's own imports (a second or so), outside the lock
        import torch._dynamo  # noqa: F401
        import torch._inductor.compile_fx  # noqa: F401
    if args.host_threads:
        torch.set_num_threads(args.host_threads)
    imports_s = round(time.perf_counter() - t0, 1)
    device = "cpu" if args.smoke else "cuda"
    # the warm phase shares the GPU on purpose (nothing is timed then): no lock, no pinning, built on the device
    lock_path = None if args.warm or os.environ.get("BENCH_CORPUS_NO_LOCK") == "1" else args.lock
    outside, inside = Phases(), Phases()
    host = prepare_on_host(args.case, args.smoke, device if args.warm else "cpu", outside,
                           () if args.warm else FIDELITY_DTYPES)
    host_done_at = time.time()
    quiet = Quiet(args.quiet if pin or args.smoke else None)
    with GpuLock(lock_path, holder if pin else None) as lock:
        if pin:
            torch.set_num_threads(len(holder))
        if args.deadline and time.time() > args.deadline - (args.lock_margin or LOCK_MARGIN_S):
            result = dict(model=args.case, error="skipped: the lock came too late (past --budget-s)")
        else:
            result = measure_on_device(host, args.warm, args.no_compile, inside, quiet)
        host = None        # the model's tensors, on the device now: freed before the lock is released
        with inside("free"):
            free_device()
    result["lock"] = dict(lock.record, imports_s=imports_s, host_done_at=host_done_at, quiet=quiet.record)
    if "error" not in result:
        result["seconds"] = dict(outside_lock=outside.total(), inside_lock=inside.total(),
                                 total=round(sum(outside.seconds.values()) + sum(inside.seconds.values()), 1))
    return result


class Phases:
    """Seconds per named phase, in the order they ran (``with phases("capture"): ...``)."""

    def __init__(self):
        self.seconds: dict[str, float] = {}

    @contextlib.contextmanager
    def __call__(self, name: str):
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] = round(self.seconds.get(name, 0.0) + time.perf_counter() - t0, 2)

    def total(self) -> dict[str, float]:
        return dict(self.seconds, total=round(sum(self.seconds.values()), 1))


class Quiet:
    """The holder's quiet window: while it times and profiles, the other model processes are stopped.

    The holder writes its pid to ``<folder>/request``; the parent (``_QuietKeeper``) stops every other running
    child (``SIGSTOP`` to its process group), starts none, and writes the pid to ``<folder>/granted``; when the
    request is gone it resumes them (``SIGCONT``). The holder waits at most ``QUIET_WAIT_S`` for the grant and
    times anyway without it (``record["granted"]`` says which). ``folder`` None: no window (the record says so).
    """

    def __init__(self, folder: str | None):
        self.folder = Path(folder) if folder else None
        self.record: dict = dict(granted=False, asked=bool(folder))

    def __enter__(self):
        if self.folder is None:
            return self
        t0 = time.time()
        tmp = self.folder / f"request.{os.getpid()}"
        tmp.write_text(str(os.getpid()))
        tmp.replace(self.folder / "request")
        granted = self.folder / "granted"
        while time.time() - t0 < QUIET_WAIT_S:
            try:
                if granted.read_text().strip() == str(os.getpid()):
                    self.record["granted"] = True
                    break
            except OSError:
                pass
            time.sleep(0.01)
        self.record.update(waited_s=round(time.time() - t0, 3), started_at=time.time())
        return self

    def __exit__(self, *exc):
        if self.folder is not None:
            (self.folder / "request").unlink(missing_ok=True)
            self.record["held_s"] = round(time.time() - self.record["started_at"], 3)
        return False


# ====================================================================== one model (in a child process)

@dataclasses.dataclass
class HostModel:
    """What ``prepare_on_host`` made for one model, on the CPU (or, in the warm phase, on the device): the
    features module and float32 inputs, the captured graph and its fused copy (kernels chosen for ``device``),
    the cast records per dtype (``casts``: dtype name -> (record, note)), and the JSON row so far (``out``).
    ``recapture``: why the graph is captured again on the device inside the lock (the CPU capture is not the
    graph a capture on the device makes), else empty."""

    name: str
    device: str
    dtype_name: str
    channels_last: bool
    smoke: bool
    features: object
    x32: tuple
    gm: object
    fused: object
    casts: dict
    out: dict
    recapture: str = ""


def graph_stage(features, x32, name: str, device: str, dtype_names: list[str], out: dict, phases: Phases,
                channels_last: bool = False):
    """Capture, graph, detect, fuse and the cast record of each of ``dtype_names`` (fake tensors of ``device``
    where the module is not there): ``(gm, fused, casts)``, the detection's counts written into ``out``. The
    kernels are chosen for what the run is: ``device`` in the first of ``dtype_names`` (the bench dtype) and its
    memory format, ``measure.run_target``, as ``fusion-explorer run`` chooses them (a bare device name would
    mean fp32 in NCHW: until 2026-12-02 every corpus part chose so)."""
    from explorer.fusion_engine import detect
    from explorer.fusions.plan import make_plan
    from explorer.fusions.rewrite import apply_plan
    from explorer.graph.build import build_graph
    from explorer.runtime import measure as m
    from explorer.sources import capture

    with phases("capture"):
        gm = capture(features, x32, name)
    with phases("detect_fuse"):
        det = detect(build_graph(gm, name))
        fused = apply_plan(gm, det, make_plan(det), m.run_target(device, m.torch_dtype(dtype_names[0]), channels_last))
    out["chains"] = {k: v for k, v in det.counts.items() if v}
    out["applied"] = dict(collections.Counter(a.status for a in fused.applied))
    out["kernels_chosen"] = dict(collections.Counter(a.implementation for a in fused.applied if a.status == "fused"))
    out["near_misses"] = len(det.near_misses)
    casts = {}
    for label in dtype_names:
        if label in ("fp32", "fp64"):
            continue            # nothing to record (``record_casts``)
        with phases(f"casts_{label}"):
            casts[label] = m.record_casts(features, x32, gm, m.torch_dtype(label), device=device)
    return gm, fused, casts


def prepare_on_host(name: str, smoke: bool, build_device: str, phases: Phases,
                    fidelity_dtypes: tuple[str, ...] = FIDELITY_DTYPES) -> HostModel:
    """Everything of one model that needs no GPU, before the lock: built on ``build_device`` (the CPU, seeded:
    ``Entry.build``), captured, detected, fused, and its casts recorded for the bench dtype and every
    ``fidelity`` dtype, on fake tensors of the device it will run on. A CPU capture for a CUDA run is checked
    against a capture on fake CUDA tensors (``measure.capture_differs``); where they differ, the graph is
    captured again on the device inside the lock (``HostModel.recapture`` says why)."""
    from benchmarks import corpus
    from explorer.runtime import measure as m

    device = "cpu" if smoke else "cuda"
    entry = corpus.by_name(name)
    scale = "ci" if smoke else "real"
    dtype_name = "fp32" if smoke else entry.bench_dtype
    channels_last = entry.input_kind == "image"
    out: dict = dict(model=name, kind=entry.kind, library=entry.library, description=entry.description,
                     shape=dataclasses.asdict(entry.shape(scale)), dtype=dtype_name,
                     memory_format="channels_last" if channels_last else "nchw", notes=[],
                     built_on=build_device)
    with phases("build"):
        module = entry.build(scale, device=build_device)
        features = corpus.features_module(entry, module)
        x32 = tuple(t.to(build_device) for t in entry.inputs(scale, module=module))
    out["parameters"] = sum(p.numel() for p in features.parameters())
    dtype_names = list(dict.fromkeys([dtype_name, *fidelity_dtypes]))
    gm, fused, casts = graph_stage(features, x32, name, device, dtype_names, out, phases, channels_last)
    recapture = ""
    if build_device != device:
        with phases("capture_check"):
            recapture = m.capture_differs(gm, features, x32, device) or ""
        if recapture:
            out["notes"].append(f"captured again on {device} inside the lock: the CPU capture differs ({recapture})")
        if device == "cuda":
            import torch

            out["cuda_context_before_lock"] = bool(torch._C._cuda_hasPrimaryContext(0)) \
                if torch.cuda.is_available() else None
    return HostModel(name, device, dtype_name, channels_last, smoke, features, x32, gm, fused, casts, out, recapture)


def to_device(module, device: str):
    """``module.to(device)``, in place, and the tensors its submodules hold as plain attributes (neither parameters
    nor buffers, which ``Module.to`` leaves where they are) moved too: what a build on ``device`` would have
    made them. Returns ``module``."""
    import torch

    module.to(device)
    for mod in module.modules():
        for key, value in list(vars(mod).items()):
            if isinstance(value, torch.Tensor) and not isinstance(value, torch.nn.Parameter) \
                    and value.device != torch.device(device):
                setattr(mod, key, value.to(device))
    return module


@dataclasses.dataclass
class DeviceModel:
    """One corpus model on its device, as ``measure_on_device`` starts: the features module and its float32 inputs
    there, the inputs in the bench dtype and layout (``x``), the captured graph and its fused copy, the cast record
    of the bench dtype (None where it did not match: then the graph's ops are typed as captured), the JSON row."""

    name: str
    device: str
    dtype: object
    channels_last: bool
    features: object
    x32: tuple
    x: tuple
    gm: object
    fused: object
    record: object
    out: dict

    def prepare(self, gm, binds=None):
        """``gm`` (``self.gm`` or ``self.fused.gm``) prepared as the bench prepares it, with ``binds`` (default
        ``prepare_graph``'s)."""
        from explorer.runtime import measure as m

        extra = {} if binds is None else dict(binds=binds)
        return m.prepare_graph(gm, self.device, self.dtype, self.channels_last, casts=self.record, **extra)


def moved_to_device(host: HostModel, phases: Phases) -> tuple:
    """``host``'s model, inputs and graphs on its device (captured again there where the CPU capture differs:
    ``host.recapture``), and the bench dtype's cast record (its note, if any, in ``host.out["notes"]``):
    ``(features, x32, gm, fused, casts, record)``."""
    from explorer.runtime import measure as m

    device = host.device
    with phases("to_device"):
        features = to_device(host.features, device)  # in place: the graph shares its parameters
        x32 = tuple(t.to(device) for t in host.x32)
        gm, fused, casts = host.gm.to(device), host.fused, host.casts
        fused.gm.to(device)
        m.synchronize(device)
    if host.recapture:
        gm, fused, casts = graph_stage(features, x32, host.name, device, list(dict.fromkeys([host.dtype_name, *casts])),
                                       host.out, phases, host.channels_last)
    record, note = casts.get(host.dtype_name, (None, ""))
    if note:
        host.out["notes"].append(note)
    return features, x32, gm, fused, casts, record


def model_on_device(name: str, smoke: bool) -> DeviceModel:
    """``prepare_on_host`` then the move to the device (and the capture again there where the CPU capture
    differs), for a script that measures one thing of a corpus model the way this bench runs it
    (``bench_heads.py``, ``profile_host.py``). Only the bench dtype's casts are recorded."""
    from explorer.runtime import measure as m

    phases = Phases()
    host = prepare_on_host(name, smoke, "cpu", phases, fidelity_dtypes=())
    device, out = host.device, host.out
    features, x32, gm, fused, casts, record = moved_to_device(host, phases)
    dtype = m.torch_dtype(host.dtype_name)
    x = m.prepare_inputs(x32, device, dtype, host.channels_last)
    out["seconds"] = phases.total()
    return DeviceModel(name, device, dtype, host.channels_last, features, x32, x, gm, fused, record, out)


def measure_on_device(host: HostModel, warm_only: bool, no_compile: bool, phases: Phases,
                      quiet: "Quiet | None" = None) -> dict:
    """The GPU section of one model (``host`` from ``prepare_on_host``): moved to the device, both graphs and
    eager prepared, compiled (default and reduce-overhead); unless ``warm_only``: checked against float64,
    ``fidelity`` (the bench dtype's row from the variants just checked), every variant timed alternated, the
    paired verdicts, a profile of fused and compiled (timing and profile in the ``quiet`` window)."""
    import torch

    from benchmarks._common import compile_copy, cuda_graph_replay, errors, profile_forward
    from explorer import stats
    from explorer.messages import CASTS
    from explorer.runtime import lean
    from explorer.runtime import measure as m

    device, out, smoke = host.device, host.out, host.smoke
    dtype = m.torch_dtype(host.dtype_name)
    channels_last = host.channels_last
    seconds: dict[str, float] = {}
    features, x32, gm, fused, casts, record = moved_to_device(host, phases)
    with phases("prepare"):
        # a model that branches on its dtype: the unfused baseline is its capture in that dtype, as the runner's
        typed = m.run_dtype_graph(features, x32, gm, dtype, device=device) if record is None else None
        if typed is not None:
            out["notes"].append(CASTS("captured_in_run_dtype", dtype=str(dtype).replace("torch.", "")))
        unfused_gm = m.prepare_graph(gm if typed is None else typed, device, dtype, channels_last, casts=record)
        fused_gm = m.prepare_graph(fused.gm, device, dtype, channels_last, casts=record)
        eager = m.prepare_module(features, device, dtype, channels_last)
        x = m.prepare_inputs(x32, device, dtype, channels_last)
    fns = {"unfused": lambda: unfused_gm(*x), "fused": lambda: fused_gm(*x), "eager": lambda: eager(*x)}
    keep = []
    if not no_compile:
        modes = [("compile_default", None)] + ([("compile_reduce_overhead", "reduce-overhead")]
                                               if device == "cuda" else [])
        for label, mode in modes:
            try:
                with phases(label):
                    call, target, s = compile_copy(eager, mode, x, device)
                fns[label] = call
                keep.append(target)
            except Exception as exc:  # a compile failure is a result
                out["notes"].append(f"{label}: torch.compile failed: {type(exc).__name__}: {str(exc)[:200]}")
    with phases("first_fused_run"):
        with torch.inference_mode():
            fns["fused"]()
        m.synchronize(device)
    # which nodes bound at that first call (``lean.bound_calls``: "bound", or "generic: <why>"): a node that stays
    # generic pays its Python path at every plain call (vit_b_32's 12 add+LayerNorm calls did, before
    # ``norm.contiguous_operands``), which only the CUDA run can show for the CUDA kernels' own reasons
    out["bound_fused"] = dict(collections.Counter(
        repr(c) for c in lean.bound_calls(fused_gm) if not isinstance(c, lean.BoundViews) or c.root is None))
    if warm_only:
        return dict(out, warm_only=True)
    if device == "cuda":
        with phases("cuda_graph_capture"):
            replay, why = cuda_graph_replay(fns["fused"], device)
        if replay is not None:
            fns["fused_cuda_graphs"] = replay
        else:
            out["notes"].append(f"fused_cuda_graphs: not captured: {why}")
    # precision against the model in float64 (on the device; a model too large for that is a note)
    try:
        with phases("reference_float64"):
            ref_module = m.prepare_module(features, device, torch.float64)
            with torch.inference_mode():
                ref = m.flat_outputs(ref_module(*m.prepare_inputs(x32, device, torch.float64)))[0]
            del ref_module
        out["precision"] = {}
        with phases("precision"):
            for v, fn in fns.items():
                try:
                    with torch.inference_mode():
                        out["precision"][v] = errors(m.flat_outputs(fn())[0].float(), ref)
                except Exception as exc:   # one variant's check must not lose the others'
                    out["notes"].append(f"precision of {v}: {type(exc).__name__}: {str(exc)[:200]}")
        with phases("fidelity"):
            measured = {v: out["precision"][v]["rel_l2"] for v in ("eager", "unfused") if v in out["precision"]}
            out["fidelity"] = fidelity(features, x32, gm, ref, device, channels_last, casts=casts,
                                       measured={host.dtype_name: measured} if len(measured) == 2 else None)
        del ref
    except Exception as exc:
        out["notes"].append(f"precision: not measured: {type(exc).__name__}: {str(exc)[:200]}")
    if device == "cuda":
        torch.cuda.empty_cache()
    plan = (m.TimingPlan(warmup=1, reps=3) if smoke else
            m.TimingPlan(target_s=0.6, min_reps=10, max_reps=200, max_rounds=300, budget_s=3.0))
    pairs = [(b, c) for b, c in PAIRS if b in fns and c in fns]
    with quiet or contextlib.nullcontext():
        with phases("timing"):
            samples = m.time_paired(fns, pairs, device, plan)
        # the fused calls whose replay declined during the timed rounds (``BoundCall.declined``): a node that
        # bound but declines at every call pays its Python path as if it never bound, which ``bound_fused`` (the
        # states after the first call) cannot show (vit_b_32's 12 replays at batch 1, before b245bff)
        out["declined_fused"] = {n.name: n.target.declined for n in fused_gm.graph.nodes
                                 if n.op == "call_function" and isinstance(n.target, lean.BoundCall)
                                 and n.target.declined}
        out["latency_ms"] = {v: m.summarize(s) for v, s in samples.items()}
        out["samples_ms"] = {v: [round(t, 5) for t in s] for v, s in samples.items()}
        out["verdicts"] = {}
        for b, c in pairs:
            verdict = stats.compare(samples[b], samples[c], basis=f"{c} against {b}, paired rounds")
            out["verdicts"][f"{c}_vs_{b}"] = dict(dataclasses.asdict(verdict), speedup=(1 / verdict.ratio
                                                                                        if verdict.ratio else None))
        losing = any(v["label"] == stats.SLOWER for v in out["verdicts"].values())
        if losing or smoke:
            with phases("profile"):
                out["profile"] = {v: profile_forward(fns[v], device, top=8, cpu_ops=False)
                                  for v in ("fused", "compile_default", "unfused") if v in fns}
    del keep
    return out


def fidelity(features, x32, gm, ref, device: str, channels_last: bool,
             labels: tuple[str, ...] = FIDELITY_DTYPES, casts: dict | None = None,
             measured: dict | None = None) -> dict:
    """Per low dtype (``labels``): whether the model's own casts were recorded (``matched``) and the record's note,
    and rel_l2 against float64 of eager and of the unfused graph prepared with that record (the issue's bar: the
    graph within 1.5x of eager), one copy at a time. ``check_cast_record.py`` asks the same. ``casts``: records
    already made (dtype name -> (record, note), ``record_casts``'s answer), else each is recorded here;
    ``measured``: dtype name -> {"eager": rel_l2, "unfused": rel_l2} already measured against this ``ref`` by the
    same preparation (the bench dtype's variants), so that dtype is not prepared and run again."""
    import torch

    from benchmarks._common import errors
    from explorer.runtime import measure as m

    out = {}
    for label in labels:
        dtype = m.torch_dtype(label)
        try:
            casts_here, note = (casts or {}).get(label) or m.record_casts(features, x32, gm, dtype)
            row = {"matched": casts_here is not None, "casts_note": note}
            done = (measured or {}).get(label)
            if done:
                row.update(eager=done["eager"], unfused=done["unfused"])
            else:
                x = m.prepare_inputs(x32, device, dtype, channels_last)
                for what, make in (("eager", lambda: m.prepare_module(features, device, dtype, channels_last)),
                                   ("unfused", lambda: m.prepare_graph(gm, device, dtype, channels_last,
                                                                       casts=casts_here))):
                    model = make()
                    with torch.inference_mode():
                        row[what] = errors(m.flat_outputs(model(*x))[0].float(), ref)["rel_l2"]
                    del model
            row["ratio"] = row["unfused"] / row["eager"] if row["eager"] else None
            out[label] = row
        except Exception as exc:
            out[label] = {"error": f"{type(exc).__name__}: {str(exc)[:200]}"}
        if device == "cuda":
            torch.cuda.empty_cache()
    return out


# ====================================================================== the run

def _child(name: str, args, warm: bool, timeout: float, env: dict, folder: Path,
           lock: str | None = None, deadline: float = 0.0, quiet: str | None = None,
           host_threads: int = 0, lock_margin: float = 0.0) -> subprocess.Popen:
    path = folder / (name.replace("/", "_") + (".warm" if warm else "") + ".json")
    path.unlink(missing_ok=True)
    cmd = [sys.executable, str(Path(__file__).resolve()), "--case", name, "--case-out", str(path)]
    cmd += (["--lock", lock] if lock else []) + (["--deadline", f"{deadline:.3f}"] if deadline else [])
    cmd += (["--quiet", quiet] if quiet else []) + (["--host-threads", str(host_threads)] if host_threads else [])
    cmd += ["--lock-margin", f"{lock_margin:.1f}"] if lock_margin else []
    cmd += (["--warm"] if warm else []) + (["--smoke"] if args.smoke else []) + (["--no-compile"] if args.no_compile else [])
    log = open(folder / (name.replace("/", "_") + (".warm" if warm else "") + ".log"), "w")
    proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    proc.case = (name, path, time.perf_counter() + timeout, log)  # type: ignore[attr-defined]
    return proc


class _QuietKeeper:
    """The parent's side of ``Quiet``: ``poll(running)`` stops the other children while a holder's request
    stands (and says so in ``granted``), and resumes them when it is gone or its holder has ended."""

    def __init__(self, folder: Path):
        self.folder, self.granted, self.stopped = folder, None, []
        folder.mkdir(parents=True, exist_ok=True)
        for stale in ("request", "granted"):
            (folder / stale).unlink(missing_ok=True)

    def poll(self, running: list) -> bool:
        """True while a quiet window is granted (start no child then)."""
        import signal

        try:
            pid = int((self.folder / "request").read_text().strip())
        except (OSError, ValueError):
            pid = None
        if pid is not None and pid not in {p.pid for p in running if p.poll() is None}:
            (self.folder / "request").unlink(missing_ok=True)    # its holder has ended
            pid = None
        if pid is not None and pid != self.granted:
            self.resume()
            for p in running:
                if p.pid != pid and p.poll() is None:
                    try:
                        os.killpg(p.pid, signal.SIGSTOP)
                        self.stopped.append(p.pid)
                    except ProcessLookupError:
                        pass
            self.granted = pid
            tmp = self.folder / "granted.tmp"
            tmp.write_text(str(pid))
            tmp.replace(self.folder / "granted")
        elif pid is None and self.granted is not None:
            self.resume()
        return self.granted is not None

    def resume(self) -> None:
        import signal

        for pid in self.stopped:
            try:
                os.killpg(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
        self.stopped, self.granted = [], None
        (self.folder / "granted").unlink(missing_ok=True)


def _finish(proc: subprocess.Popen, kill: bool = False) -> dict:
    import signal

    name, path, _deadline, log = proc.case  # type: ignore[attr-defined]
    if kill:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()
    log.close()
    if path.exists():
        return json.loads(path.read_text())
    tail = Path(log.name).read_text()[-800:]
    why = "timed out (past --budget-s)" if kill else f"exited {proc.returncode}"
    return dict(model=name, error=f"{why}: {tail.strip().splitlines()[-1] if tail.strip() else ''}"[:400])


def summarize(results: list[dict]) -> dict:
    """How many models gain, lose, are level per comparison; the worst losses with their kernels."""
    out: dict = {}
    for key in ("fused_vs_unfused", "fused_vs_eager", "fused_vs_compile_default",
                "fused_cuda_graphs_vs_compile_reduce_overhead"):
        tally = collections.Counter()
        losses = []
        for r in results:
            v = (r.get("verdicts") or {}).get(key)
            if not v:
                continue
            tally[v["label"]] += 1
            if v["label"] == "slower":
                losses.append((v["ratio"], r))
        losses.sort(key=lambda t: -t[0])
        out[key] = dict(counts=dict(tally), worst=[dict(
            model=r["model"], ratio=round(ratio, 3),
            fused_top_kernels=[k["name"][:80] for k in ((r.get("profile") or {}).get("fused") or {}).get(
                "top_kernels", [])[:4]],
            compile_top_kernels=[k["name"][:80] for k in ((r.get("profile") or {}).get("compile_default") or {}).get(
                "top_kernels", [])[:4]],
            kernels_chosen=sorted(r.get("kernels_chosen", {}), key=lambda k: -r["kernels_chosen"][k])[:4])
            for ratio, r in losses[:5]])
    for label in ("fp16", "bf16"):
        rows = {r["model"]: (r.get("fidelity") or {}).get(label, {}) for r in results}
        ratios = {n: f["ratio"] for n, f in rows.items() if f.get("ratio") is not None}
        # A NaN ratio (eager's own output not finite in this dtype: Swin-V2 in fp16) is neither within nor beyond:
        # counted apart, not dropped from both sides by the comparisons.
        finite = {n: v for n, v in ratios.items() if math.isfinite(v)}
        out[f"fidelity_{label}"] = dict(within_1_5x=sum(v <= 1.5 for v in finite.values()),
                                        beyond_1_5x={n: round(v, 2) for n, v in finite.items() if v > 1.5},
                                        not_finite=sorted(n for n in ratios if n not in finite),
                                        not_measured=sorted(n for n, f in rows.items() if f.get("ratio") is None))
    return out


def table(results: list[dict], skipped: list[str], label: str) -> list[str]:
    lines = [label, f"{'model':<36} {'dtype':<5} {'unfused':>9} {'fused':>9} {'compile':>9} {'fused+CG':>9} "
             f"{'red.-ovh':>9}  verdict fused vs unfused / compile / red.-ovh"]
    for r in results:
        if "error" in r:
            lines.append(f"{r['model']:<36} FAILED: {r['error'][:120]}")
            continue
        lat = r.get("latency_ms", {})

        def ms(v):
            return f"{lat[v]['median']:.3f}" if v in lat else "-"

        verdicts = r.get("verdicts", {})
        words = [(verdicts.get(k) or {}).get("label", "-") for k in
                 ("fused_vs_unfused", "fused_vs_compile_default", "fused_cuda_graphs_vs_compile_reduce_overhead")]
        lines.append(f"{r['model']:<36} {r['dtype']:<5} {ms('unfused'):>9} {ms('fused'):>9} {ms('compile_default'):>9} "
                     f"{ms('fused_cuda_graphs'):>9} {ms('compile_reduce_overhead'):>9}  {' / '.join(words)}")
    if skipped:
        lines.append(f"skipped (past --budget-s): {', '.join(skipped)}")
    return lines


def merge(paths: list[str], out: str | None) -> int:
    """One table from several runs' JSONs (``--merge``): the models of each in order, a model measured in more
    than one keeping the later file's row; the summary recomputed over them all."""
    models: dict[str, dict] = {}
    sources, skipped = [], []
    for p in paths:
        try:
            doc = read_result(p)
        except ValueError as exc:
            print(f"bench_corpus --merge: {exc}", file=sys.stderr)
            return 2
        for name, row in (doc.get("models") or {}).items():
            if str(row.get("error", "")).startswith("timed out (past --budget-s)"):
                skipped.append(name)        # the run's budget ended, not the model
            elif "error" not in row or name not in models or "error" in models[name]:
                models[name] = dict(row, source=Path(p).name)
        skipped += doc.get("skipped_models") or []
        sources.append(dict(file=Path(p).name, git=doc.get("git"), wall_s=doc.get("wall_s"),
                            models=len(doc.get("models") or {}), gpu=(doc.get("environment") or {}).get("gpu")))
    results = list(models.values())
    never = sorted(set(skipped) - set(models))
    merged = dict(schema="bench_corpus/1", label=f"merged from {len(paths)} runs", merged_from=sources,
                  models=models, skipped_models=never, summary=summarize(results))
    path = results_path(out, "bench_corpus_merged.json")
    write_json(path, merged)
    for line in table(results, [], merged["label"]):
        print(line)
    print(f"wrote {path} ({len(models)} models; {len(never)} skipped in every part and measured in none)")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget-s", type=float, default=330.0)
    parser.add_argument("--only", default="")
    parser.add_argument("--skip", default="")
    parser.add_argument("--skip-measured", default="", help="comma-separated result JSONs: skip what they measured")
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--no-compile", action="store_true")
    parser.add_argument("--warm-workers", type=int, default=6)
    parser.add_argument("--warm-share", type=float, default=0.4)
    parser.add_argument("--out", default=None)
    parser.add_argument("--case", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--case-out", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--warm", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--workers", type=int, default=None, help="model processes in the pipeline (4; 2 in --smoke)")
    parser.add_argument("--lock", default=None, help="the GPU lock file (default: one in the run's folder)")
    parser.add_argument("--deadline", type=float, default=0.0, help=argparse.SUPPRESS)
    parser.add_argument("--quiet", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--host-threads", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--lock-margin", type=float, default=0.0, help=argparse.SUPPRESS)
    parser.add_argument("--merge", default="", help="comma-separated result JSONs: write one table of them")
    args = parser.parse_args(argv)
    if args.case:
        write_json(Path(args.case_out), run_case(args))
        return 0
    if args.merge:
        return merge(args.merge.split(","), args.out)
    try:
        done = measured_in(args.skip_measured)
    except ValueError as exc:
        print(f"bench_corpus --skip-measured: {exc}", file=sys.stderr)
        return 2
    started = time.perf_counter()
    deadline = started + args.budget_s
    import torch

    from benchmarks import corpus

    path = results_path(args.out, "bench_corpus_smoke_cpu.json" if args.smoke else "bench_corpus_h200.json")
    doc: dict = dict(schema="bench_corpus/1", **run_stamp(),
                     label="SMOKE run on the CPU: the numbers are not GPU numbers" if args.smoke else "GPU run",
                     settings=vars(args))
    if not args.smoke and not torch.cuda.is_available():
        doc["skipped"] = "no CUDA device here: run with --smoke for the CPU path"
        write_json(path, doc)
        print(f"bench_corpus: SKIPPED - no CUDA device; wrote {path}")
        return 0
    from explorer.runtime.measure import environment

    doc["environment"] = environment("cpu" if args.smoke else "cuda")
    names = list(SMOKE) if args.smoke else select([e.name for e in corpus.entries()], args.only, args.skip)
    names = [n for n in names if n not in done]
    if args.smoke and (args.only or args.skip):
        names = select(names, args.only, args.skip)
    folder = path.parent / (path.stem + "_models")
    folder.mkdir(parents=True, exist_ok=True)
    cache = Path(tempfile.gettempdir()) / "bench_corpus_cache"
    env = dict(os.environ, PYTHONPATH=str(ROOT), TORCHINDUCTOR_CACHE_DIR=str(cache / "inductor"),
               TRITON_CACHE_DIR=str(cache / "triton"), TRANSFORMERS_VERBOSITY="error", HF_HUB_OFFLINE="1")
    if args.smoke:
        env.setdefault("EXPLORER_GENERIC_COMPILE", "0")
        env["OMP_NUM_THREADS"] = env.get("OMP_NUM_THREADS", "1")
    results, skipped = [], []
    workers = args.workers or (2 if args.smoke else 4)
    lock = args.lock or str(folder / "gpu.lock")
    keeper = _QuietKeeper(folder / "quiet")
    wall_deadline = time.time() + (deadline - time.perf_counter())
    # the waiting children share the waiting cores: their torch threads divided among them (a holder takes its own)
    host_threads = max(1, len(core_sets()[1]) // max(1, workers - 1))
    queue, running = list(names), []
    warmed: dict[str, dict] = {}
    warm_done = False

    def start_timing() -> None:
        while queue and len(running) < workers and not keeper.poll(running):
            left = deadline - time.perf_counter()
            if left < 20:
                skipped.extend(queue)
                queue.clear()
                break
            name = queue.pop(0)
            # a model the finished warm phase did not warm compiles cold in the lock: it needs a wider margin
            cold = warm_done and ("error" in warmed.get(name, {"error": "not warmed"}))
            running.append(_child(name, args, False, left, env, folder, lock, wall_deadline, str(keeper.folder),
                                  host_threads, COLD_LOCK_MARGIN_S if cold else LOCK_MARGIN_S))

    def collect() -> None:
        for p in list(running):
            late = time.perf_counter() > p.case[2]
            if p.poll() is None and not late:
                continue
            running.remove(p)
            r = _finish(p, kill=p.poll() is None)
            keeper.poll(running)             # a window its holder left open ends with it
            if str(r.get("error", "")).startswith("skipped"):
                skipped.append(r["model"])
                continue
            results.append(r)
            lk = r.get("lock") or {}
            sec = r.get("seconds") or {}
            print(f"[{time.perf_counter() - started:6.1f}s] {r['model']}: "
                  + (r["error"][:100] if "error" in r else
                     f"{(sec.get('outside_lock') or {}).get('total')} s outside the lock, "
                     f"{(sec.get('inside_lock') or {}).get('total')} s inside")
                  + (f" (lock waited {lk.get('waited_s')} s, held {lk.get('held_s')} s)" if lk else ""),
                  file=sys.stderr, flush=True)
            doc["models"] = {x["model"]: {k: v for k, v in x.items() if k != "samples_ms"} for x in results}
            doc["skipped_models"] = skipped
            write_json(path, doc)

    if not args.smoke and args.warm_workers > 0 and not args.no_compile:
        warm_end = started + args.warm_share * args.budget_s
        # The parent holds the GPU lock through the warm phase: the first timing children's host phases (build,
        # capture, fuse on the CPU) run meanwhile, and the first of them takes the GPU when the warm phase ends.
        # Warm only what the rest of the budget can time: a model is started while the ones started so far are
        # fewer than the timing phase could take from now on (``PER_MODEL_S`` each), so the phase ends by itself
        # where warming and timing balance; ``--warm-share`` caps it.
        with GpuLock(lock):
            warm_queue, warm_running, launched = list(names), [], 0
            while (warm_queue or warm_running) and time.perf_counter() < warm_end:
                can_time = workers + (deadline - time.perf_counter()) / PER_MODEL_S
                while warm_queue and len(warm_running) < args.warm_workers and launched < can_time \
                        and warm_end - time.perf_counter() > WARM_MODEL_S:
                    warm_running.append(_child(warm_queue.pop(0), args, True, warm_end - time.perf_counter(), env,
                                               folder))
                    launched += 1
                if launched >= can_time:
                    warm_queue.clear()
                start_timing()
                time.sleep(0.2)
                for p in [p for p in warm_running if p.poll() is not None]:
                    warm_running.remove(p)
                    warmed[p.case[0]] = _finish(p)
                collect()                    # a timing child that failed in its host phase
            for p in warm_running:
                warmed[p.case[0]] = _finish(p, kill=True)
        doc["warm"] = {n: (r.get("seconds") or {}).get("total") if "error" not in r else r["error"]
                       for n, r in warmed.items()}
        doc["warm_s"] = round(time.perf_counter() - started, 1)
        warm_done = True
        print(f"warm phase: {len(warmed)} models in {doc['warm_s']} s", file=sys.stderr, flush=True)
    while queue or running:
        start_timing()
        time.sleep(0.05)
        keeper.poll(running)
        collect()
    keeper.resume()
    held = sum((r.get("lock") or {}).get("held_s") or 0 for r in results)
    phase_s = {side: round(sum(((r.get("seconds") or {}).get(side) or {}).get("total") or 0 for r in results), 1)
               for side in ("outside_lock", "inside_lock")}
    doc["pipeline"] = dict(workers=workers, lock=lock, held_s=round(held, 1), models_timed=len(results),
                           host_threads=host_threads, seconds=phase_s,
                           quiet_granted=sum(bool(((r.get("lock") or {}).get("quiet") or {}).get("granted"))
                                             for r in results),
                           models_per_device_minute=round(60 * len(results) / (time.perf_counter() - started), 2))
    doc["models"] = {x["model"]: {k: v for k, v in x.items() if k != "samples_ms"} for x in results}
    doc["skipped_models"] = skipped
    doc["summary"] = summarize(results)
    doc["wall_s"] = round(time.perf_counter() - started, 1)
    doc["pipeline"]["models_per_device_minute"] = round(60 * len(results) / doc["wall_s"], 2) if doc["wall_s"] else None
    write_json(path, doc)
    for line in table(results, skipped, doc["label"]):
        print(line)
    print(json.dumps(doc["summary"], indent=1)[:3000])
    print(f"wrote {path} (per model, with every round: {folder})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
