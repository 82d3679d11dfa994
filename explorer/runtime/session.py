"""One whole measurement, in the process that runs it: the typed report of a model under a plan.

``measure(source, plan, settings, emit)`` is what a benchmark may call in-process;
``measure_phases`` is what the runner's child process does (``explorer.gpu_runner``)::

    setup: analyze (load, graph, detect) ─► plan (None: all accepted) ─► fuse
           ─► unfused gm | fused gm, both prepared alike (device, dtype, memory format, lean calls,
              the model's own casts at the run dtype: ``measure.record_casts``; a model that branches on
              its dtype: the unfused gm from its capture in the run dtype, ``measure.run_dtype_graph``)
    phases (``report.PHASES``), each on its own:
       reference  the float64 reference, precision of unfused and fused
       main       latency (paired, alternated rounds; a tested verdict), peak memory, launches, bytes
       chains     per-chain micro-benchmarks
       stages     the staged table
       baselines  eager, torch.compile modes
    ─► explorer.report.Report, every derived fact computed here, once

A fault never loses a run: a phase that raises (a CUDA fault, an out-of-memory,
a compile failure, any exception) ends only that phase. The report keeps what
the other phases measured and lists the failure (``report.PhaseFailure``: the
phase, the variant running, the one-line reason). A failure that leaves the
process's CUDA context unusable (``process_lost``) ends the process's work:
``measure_phases`` returns the phases it could not run, for which the runner
starts a fresh child; an in-process ``measure`` marks them not run. A failure in
setup (a model that does not load, a plan for another model) is the run's: one
``RunError`` line, as before, since nothing can be measured.

After setup and after each phase, ``on_part`` (when given) receives a snapshot
of the report so far, and the name of each phase as it starts: the runner keeps
them, so that even a process that dies mid-phase (a segmentation fault) loses
only that phase. Test hook (a real code path, kept on purpose): the environment
variable ``FUSION_EXPLORER_FAIL_PHASE=<phase>[:crash][,...]`` makes that phase raise
at its start, or with ``:crash`` kill its process with SIGSEGV, as a CUDA fault
that takes a process down does.

Progress goes through ``explorer.runtime.progress.Schedule``: each status says
about how many seconds are left. ``settings.quick`` takes fewer repetitions and
skips the per-chain timing.
"""

from __future__ import annotations

import dataclasses
import gc
import os
import signal
import time
from typing import Any, Callable

import torch

from explorer.messages import CASTS, NOTES, PHASES as PHASES_WORDS, PROGRESS
from explorer import stats
from explorer.fusion_engine import Analysis, analyze, fuse, launch_counts
from explorer.fusions import rewrite
from explorer.fusions.plan import Plan, make_plan
from explorer.report import (NOT_MEASURED, PHASES, Environment, HostLoad, InputInfo, Measurement, ModelInfo,
                             PhaseFailure, PlanInfo, Report, Verdict)
from explorer.runtime import measure as m
from explorer.runtime.baselines import baselines
from explorer.runtime.chains import chain_benchmarks, chain_entry
from explorer.runtime.child import describe_failure
from explorer.runtime.progress import (PRIOR_FORWARD_S, PRIOR_LOAD_S, CostMemory, Schedule, child_load_key,
                                       model_key, probe_pace, run_estimates)
from explorer.runtime.settings import RunSettings
from explorer.runtime.stages import stage_measurements
from explorer.runtime.variants import make_variant, measure_variants, precision_of, reference_output
from explorer.sources import describe_source

PRECISION_NOTE = ("max_rel = max|out-ref| / max|ref|; rel_l2 = ||out-ref|| / ||ref||; ref = {ref}; top1_agreement "
                  "only for classification (argmax of last dim); relative figures are refused (with the reason) "
                  "when the reference is all zero, constant or denormal in the run's dtype")
#: Every CPU run, quick or not, runs one intra-op thread unless the settings say otherwise (``cpu_threads``), so
#: that two runs a user compares were taken alike; on a CPU shared with other work the threads of one op wait
#: for each other (a ResNet-50 forward took 0.11 s on 1 thread, 0.3-2.4 s on 2).
DEFAULT_CPU_THREADS = 1
QUICK_CPU_THREADS = DEFAULT_CPU_THREADS   # the older name
GRAPH_CALLS_NOTE = ("unfused and fused graphs alike are timed lean (explorer.runtime.lean): ATen calls through "
                    "their public bindings, fused calls resolved once to the library call they take on this "
                    "device, weights read as plain attributes; the same kernels either way")


def _check_memory(source: str, settings: RunSettings) -> None:
    need = m.zoo_input_bytes(source, settings.batch, settings.seq_len)
    if need is None:
        return
    # fp32 inputs as generated, their float64 reference copy (2x), the copy in the run dtype.
    m.check_fits(4 * need, m.available_host_bytes(), "host memory, inputs alone")


def _check_device_memory(model: Any, graph: Any, device: str, dtype: Any) -> None:
    largest = max((a["bytes_written"] for _, a in graph.nodes(data=True)), default=0)
    if not device.startswith("cuda"):
        need = m.weight_bytes(model.gm) + 4 * largest
        m.check_fits(int(need), m.available_host_bytes(), "host memory, weights and largest activations")
        return
    ratio = m.element_ratio(dtype)
    # two copies of the weights (unfused + fused), the inputs, a few live activations, float64 reference
    need = (2 * ratio + 2) * m.weight_bytes(model.gm) + (ratio + 2) * m.tensor_bytes(model.example_inputs) \
        + 4 * largest * 2
    free, _total = torch.cuda.mem_get_info()
    m.check_fits(int(need), int(free), "GPU memory, estimated from weights, inputs and largest activation")


def _environment(device: str) -> Environment:
    env = m.environment(device)
    env["tf32_matmul"] = bool(torch.backends.cuda.matmul.allow_tf32)
    env["tf32_cudnn"] = bool(torch.backends.cudnn.allow_tf32)
    known = {"device", "device_name", "is_cpu", "note", "started_utc", "torch", "triton", "cuda", "cudnn",
             "driver", "python"}
    cudnn = env.get("cudnn")
    return Environment(
        device=str(env["device"]), device_name=env.get("device_name"), is_cpu=bool(env["is_cpu"]),
        note=str(env.get("note") or ""), started_utc=str(env.get("started_utc") or ""), torch=env.get("torch"),
        triton=env.get("triton"), cuda=env.get("cuda"), cudnn=int(cudnn) if isinstance(cudnn, int) else None,
        driver=None if env.get("driver") is None else str(env["driver"]), python=env.get("python"),
        extra={k: v for k, v in env.items() if k not in known and (v is None or isinstance(v, (str, int, float, bool)))})


def _model_info(model: Any, detection: Any) -> ModelInfo:
    described = describe_source(model)
    return ModelInfo(
        name=str(described["name"]), source=str(described["source"]), fingerprint=detection.fingerprint,
        batch=described.get("batch"), seq_len=described.get("seq_len"), path=described.get("path"),
        task=str(model.task or ""), description=str(model.description or ""),
        inputs=tuple(InputInfo(str(i["name"]), tuple(int(s) for s in i["shape"]), str(i["dtype"]))
                     for i in described.get("inputs") or []),
        chains_detected=len(detection.chains), ops=int(detection.totals.get("ops", 0)),
        params=int(detection.totals.get("params", 0)), flops=int(detection.totals.get("flops", 0)))


def _plan_info(plan: Plan) -> PlanInfo:
    d = plan.to_dict()
    return PlanInfo(model=d["model"], fingerprint=d["fingerprint"], accepted=tuple(d["accepted"]),
                    kernels=dict(d["kernels"]), memory_format=d["memory_format"], cuda_graphs=bool(d["cuda_graphs"]),
                    version=int(d["version"]))


FAIL_PHASE_ENV = "FUSION_EXPLORER_FAIL_PHASE"


def measure(source: str, plan_data: dict | None, settings: RunSettings,
            emit: Callable[[float, str], None] | None = None) -> Report:
    """Run the whole measurement in this process and return the typed report (module docstring).

    The intra-op thread count (``settings.cpu_threads``, or one thread for a quick CPU run) holds for
    the measurement and is restored afterwards, for callers that measure in-process. Phases that a
    lost CUDA context left unrun are listed as failures (``not_run``): this process cannot start afresh.
    """
    report, left = measure_phases(source, plan_data, settings, emit)
    if not left:
        return report
    lost = next((f for f in report.failures if f.process_lost), None)
    why = PHASES_WORDS("run_phase_left_this", x=lost.phase) if lost else "not run"
    return dataclasses.replace(report, failures=report.failures + tuple(
        PhaseFailure(phase=p, reason=why, not_run=True) for p in left))


def measure_phases(source: str, plan_data: dict | None, settings: RunSettings,
                   emit: Callable[[float, str], None] | None = None, phases: tuple[str, ...] = PHASES,
                   on_part: Callable[[dict], None] | None = None,
                   pace: float = 1.0, before_device: Callable[[], None] | None = None
                   ) -> tuple[Report, tuple[str, ...]]:
    """Set up, then run ``phases`` (a subset of ``PHASES``, in order), each on its own (module docstring).
    ``pace``: the host's pace against earlier runs (``progress.host_pace``), scaling the costs they remembered.
    ``before_device``: called before the first device allocation, after the host work of setup (``_setup``).

    Returns the report and the requested phases left unrun because a failure lost the process
    (empty when every phase ran or failed alone). ``on_part`` receives ``{"started": phase}`` as a
    phase starts and ``{"snapshot": report dict, "done": [...]}`` after setup and after each phase.
    """
    cuda = m.resolve_device(settings.device).startswith("cuda")
    threads = settings.cpu_threads or (DEFAULT_CPU_THREADS if not cuda else None)
    before = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)  # before anything runs; environment() records it
    try:
        first_load = host_load_1min()
        run = _setup(source, plan_data, settings, emit, tuple(phases), threads, pace, before_device)
        run.load[:0] = [first_load, host_load_1min()]
        send = on_part or (lambda part: None)
        send({"snapshot": _report(run).to_dict(), "done": []})
        wanted = [p for p in PHASES if p in phases and settings.runs_phase(p)]
        for i, phase in enumerate(wanted):
            send({"started": phase})
            lost = _run_phase(run, phase)
            run.load.append(host_load_1min())
            send({"snapshot": _report(run).to_dict(), "done": list(run.done)})
            if lost:
                return _report(run), tuple(wanted[i + 1:])
        report = _report(run)
        run.schedule.done()
        return report, ()
    finally:
        torch.set_num_threads(before)


@dataclasses.dataclass
class _Run:
    """What setup prepared and what the phases have measured so far (one measurement's state)."""

    settings: RunSettings
    phases: tuple[str, ...]
    threads: int | None
    t_start: float
    device: str
    dtype: Any
    schedule: Schedule
    environment: Environment
    model: Any
    graph: Any
    detection: Any
    plan: Plan
    applied: dict
    fused_ids: list
    accepted: list
    channels_last: bool
    classification: bool
    unfused_gm: Any
    fused_gm: Any
    inputs: tuple
    casts: Any
    bytes_unfused: int
    bytes_fused: int
    fuse_s: float
    notes: list = dataclasses.field(default_factory=list)
    memory: Any = None
    key: str = ""
    chains_to_time: int = 0
    stage_graphs: int = 3
    ref: Any = None
    ref_where: str = ""
    forward_s: float | None = None
    prec_unfused: dict | None = None
    prec_fused: dict | None = None
    fused_vs_unfused: dict | None = None
    unfused: Measurement | None = None
    fused: Measurement | None = None
    verdict: Verdict | None = None
    chains: tuple = ()
    rotation: str = ""
    stages: tuple = ()
    baselines: tuple = ()
    failures: list = dataclasses.field(default_factory=list)
    done: list = dataclasses.field(default_factory=list)
    load: list = dataclasses.field(default_factory=list)   # the host's 1-minute load, sampled (HostLoad)
    cpu_pace: float = 1.0   # the host's pace for CPU work against the runs whose costs are remembered
    scales: dict = dataclasses.field(default_factory=dict)   # each phase's remembered scale (``_phase_scales``)

    @property
    def cuda(self) -> bool:
        return self.device.startswith("cuda")


def _setup(source: str, plan_data: dict | None, settings: RunSettings,
           emit: Callable[[float, str], None] | None, phases: tuple[str, ...], threads: int | None,
           pace: float = 1.0, before_device: Callable[[], None] | None = None) -> _Run:
    """Load, plan, fuse and prepare both graphs; a failure here is the run's (a ``RunError`` line).
    ``before_device`` is called once the host work (load, capture, detect, plan, fuse, the casts' record) is done,
    before the device's first allocation (``gpulock.Section.acquire``: the exclusive device section)."""
    t_start = time.perf_counter()
    device = m.resolve_device(settings.device)
    cuda = device.startswith("cuda")
    memory = CostMemory()
    key = model_key(source, settings.batch, settings.seq_len)
    # First estimates from what earlier runs of this model measured (or stated guesses); revised once the
    # chains are known, again once a forward has been timed, and as each phase goes (explorer.runtime.progress).
    # The remembered costs are scaled by the host's pace now: a fixed piece of CPU work timed now against the same
    # work timed by the run that remembered them (else this process's start against the remembered one).
    probe = host_probe_s()
    pace = probe_pace(probe, memory.get(f"probe:{key}"), pace)
    memory.record(f"probe:{key}", probe)
    remembered_forward = memory.get(_forward_key(key, device, settings.dtype))
    cpu_pace = 1.0 if cuda else pace   # a CUDA forward's time is the GPU's as much as the host's
    scales = _phase_scales(memory, key, device, settings)   # read once: this run records only its own phases'
    schedule = Schedule(emit or (lambda f, s: None), {
        "load": pace * memory.get(child_load_key(key), PRIOR_LOAD_S),
        "prepare": pace * memory.get(f"prepare:{key}", 1.0),
        **_phase_estimates(settings, phases, cuda, device,
                           None if remembered_forward is None else cpu_pace * remembered_forward,
                           memory.get(f"chains:{key}", 0.0), 3, pace * memory.get(f"fuse:{key}", 0.3),
                           _chain_cost(memory, key, device, cpu_pace), scales)})
    dtype = m.torch_dtype(settings.dtype)

    schedule.emit("load", 0.0, PROGRESS("loading", x=source))
    _check_memory(source, settings)
    t0 = time.perf_counter()
    analysis = analyze(source, batch=settings.batch, seq_len=settings.seq_len)
    memory.record(child_load_key(key), time.perf_counter() - t0)
    t_prepare = time.perf_counter()
    model, graph, detection = analysis
    plan = make_plan(detection, "all") if plan_data is None else Plan.from_dict(plan_data)
    plan.check_for(detection)

    schedule.emit("prepare", 0.0, "applying the plan")
    t0 = time.perf_counter()
    fused_model = fuse(analysis, plan, m.run_target(device, dtype, plan.memory_format == "channels_last"))
    fuse_s = time.perf_counter() - t0
    applied = {a.chain_id: a for a in fused_model.applied}
    fused_ids = [a.chain_id for a in fused_model.applied if a.status == "fused"]
    channels_last = plan.memory_format == "channels_last"
    notes: list[str] = []
    if plan.cuda_graphs and not cuda:
        notes.append("CUDA graphs requested but ignored: they need CUDA")
    casts = None
    unfused_source = model.gm   # the graph the unfused baseline is prepared from
    if model.module is not None:
        schedule.emit("prepare", 0.3, PROGRESS("reading_casts", dtype=settings.dtype))
        casts, cast_note = m.record_casts(model.module, model.example_inputs, model.gm, dtype)
        if cast_note:
            notes.append(cast_note)
        # a model that branches on its dtype: no record applies to the float32 capture, and the unfused baseline
        # is the model captured in the run dtype (chains, the plan and the fused graph stay the float32 capture's)
        typed = m.run_dtype_graph(model.module, model.example_inputs, model.gm, dtype) if casts is None else None
        if typed is not None:
            unfused_source = typed
            notes.append(CASTS("captured_in_run_dtype", dtype=str(dtype).replace("torch.", "")))
    elif dtype not in (torch.float32, torch.float64):
        notes.append(CASTS("no_eager_module_this", x=m.capture_dtype(model.gm), x2=settings.dtype))
    if before_device is not None:   # everything above is host work; the device's first allocation is below
        before_device()
    environment = _environment(device)   # the device's name and clocks, read inside its section
    _check_device_memory(model, graph, device, dtype)
    schedule.emit("prepare", 0.5, PROGRESS("preparing_models", x=settings.dtype, x2=device, x3=plan.memory_format))
    unfused_gm = m.prepare_graph(unfused_source, device, dtype, channels_last, casts=casts)
    fused_gm = m.prepare_graph(fused_model.gm, device, dtype, channels_last, casts=casts)
    inputs = m.prepare_inputs(model.example_inputs, device, dtype, channels_last)
    ratio = m.element_ratio(dtype)
    bytes_unfused = m.graph_bytes(graph, dtype)
    bytes_fused = int(bytes_unfused - ratio * sum(detection.chain(cid).bytes_saved for cid in fused_ids))
    accepted = detection.accepted_chains(plan.accepted)
    to_time = _chains_to_time(accepted, applied)
    memory.record(f"chains:{key}", to_time)
    memory.record(f"fuse:{key}", fuse_s)
    memory.record(f"prepare:{key}", time.perf_counter() - t_prepare)
    schedule.revise(**_phase_estimates(settings, phases, cuda, device,
                                       None if remembered_forward is None else cpu_pace * remembered_forward, to_time,
                                       _stage_graphs(accepted), fuse_s, _chain_cost(memory, key, device, cpu_pace),
                                       scales))
    return _Run(settings=settings, phases=phases, threads=threads, t_start=t_start, device=device, dtype=dtype,
                schedule=schedule, environment=environment, model=model, graph=graph, detection=detection,
                plan=plan, applied=applied, fused_ids=fused_ids, accepted=accepted, channels_last=channels_last,
                classification=model.task == "classification", unfused_gm=unfused_gm, fused_gm=fused_gm,
                inputs=inputs, casts=casts, bytes_unfused=bytes_unfused, bytes_fused=bytes_fused, fuse_s=fuse_s,
                notes=notes, memory=memory, key=key, chains_to_time=to_time, stage_graphs=_stage_graphs(accepted),
                cpu_pace=cpu_pace, scales=scales)


def _run_phase(run: _Run, phase: str) -> bool:
    """Run one phase; a failure is recorded and ends only this phase. Returns whether the process is lost
    (its CUDA context unusable: the remaining phases need a fresh process)."""
    try:
        _injected_failure(phase)
        t0 = time.perf_counter()
        PHASE_WORK[phase](run)
        run.done.append(phase)
        _remember_scale(run, phase, time.perf_counter() - t0)
        return False
    except Exception as exc:
        variant = exc.variant if isinstance(exc, m.VariantFailed) else None
        cause = exc.__cause__ if isinstance(exc, m.VariantFailed) and exc.__cause__ is not None else exc
        lost = m.cuda_context_lost(run.device, cause)
        run.failures.append(PhaseFailure(phase=phase, reason=describe_failure(cause), variant=variant,
                                         process_lost=lost))
        del exc, cause  # the traceback holds the phase's tensors
    gc.collect()
    if run.cuda and not lost:
        torch.cuda.empty_cache()
    return lost


def _injected_failure(phase: str) -> None:
    """The test hook (module docstring): raise, or die by SIGSEGV, at the start of a named phase."""
    for item in os.environ.get(FAIL_PHASE_ENV, "").split(","):
        name, _, how = item.strip().partition(":")
        if name != phase:
            continue
        if how == "crash":
            os.kill(os.getpid(), signal.SIGSEGV)
        raise RuntimeError(f"failure injected by {FAIL_PHASE_ENV}={item.strip()}")


def _reference_output(run: _Run) -> None:
    """The float64 reference, computed once per process (the baselines' precision needs it too)."""
    if run.ref is None:
        run.schedule.emit("reference", 0.0, "computing the float64 reference")
        run.ref, run.ref_where = reference_output(run.model.gm, run.model.example_inputs, run.device)


def _phase_reference(run: _Run) -> None:
    """Precision first: a wrong fused model is the first thing to know."""
    _reference_output(run)
    with torch.inference_mode():
        out_unfused = run.unfused_gm(*run.inputs)
        t0 = time.perf_counter()  # the second call: the first pays one-time costs, the estimate wants steady state
        out_unfused = run.unfused_gm(*run.inputs)
        m.synchronize(run.device)
        run.forward_s = time.perf_counter() - t0
        run.prec_unfused = m.precision(out_unfused, run.ref, run.classification, run.dtype)
        out_fused = run.fused_gm(*run.inputs)
    run.prec_fused = m.precision(out_fused, run.ref, run.classification, run.dtype)
    run.fused_vs_unfused = m.precision(out_fused, [t.double() for t in m.flat_outputs(out_unfused)],
                                       run.classification, run.dtype)


def _forward_s(run: _Run) -> float:
    if run.forward_s is None:  # the reference phase did not run (or failed) in this process
        with torch.inference_mode():
            run.unfused_gm(*run.inputs)
            t0 = time.perf_counter()
            run.unfused_gm(*run.inputs)
            m.synchronize(run.device)
        run.forward_s = time.perf_counter() - t0
    return run.forward_s


def _timing(run: _Run) -> m.TimingPlan:
    s = run.settings
    return m.TimingPlan.for_device(run.device, s.warmup, s.reps, quick=s.quick)


def _phase_main(run: _Run) -> None:
    """The main A/B: paired rounds, more while the verdict is open."""
    timing, forward_s = _timing(run), _forward_s(run)
    _revise(run, forward_s)
    run.schedule.emit("main", 0.0, "warming up unfused and fused")
    graphs = run.plan.cuda_graphs
    variants = [make_variant("unfused", run.unfused_gm, run.inputs, run.device, graphs),
                make_variant("fused", run.fused_gm, run.inputs, run.device, graphs)]

    def main_round(r: int, n: int) -> None:
        if r == 1:
            run.schedule.revise(units={"main": n})
        if r % max(1, n // 20) == 0 or r == n:
            run.schedule.emit("main", 0.8 * r / n, PROGRESS("timing_unfused_vs_fused", n=r, n2=n))

    main, samples = measure_variants(variants, run.device, timing, run.model.batch,
                                     {"unfused": run.bytes_unfused, "fused": run.bytes_fused}, main_round,
                                     pairs=(("unfused", "fused"),))
    basis = "CUDA-graph replays" if variants[1].cuda_graph else "synchronised calls"
    run.verdict = stats.compare(samples["unfused"], samples["fused"], basis=f"whole model, {basis}")
    run.unfused, run.fused = main["unfused"], main["fused"]
    if not variants[0].cuda_graph and run.unfused.latency is not None and run.unfused.latency.median > 0:
        run.forward_s = run.unfused.latency.median / 1e3   # many forwards' median: the later phases' unit
        _revise(run, run.forward_s)


def _phase_chains(run: _Run) -> None:
    t0 = time.perf_counter()
    run.schedule.revise(units={"chains": max(len(run.accepted), 1)})
    run.chains = tuple(chain_benchmarks(run.model, run.graph, run.detection, run.accepted, run.applied, run.device,
                                        run.dtype, run.settings, run.schedule.for_phase("chains"),
                                        cuda_graphs=run.plan.cuda_graphs, casts=run.casts))
    run.rotation = run.chains[0].rotation if run.chains else ""
    if run.chains_to_time:
        per_chain = (time.perf_counter() - t0) / run.chains_to_time
        run.memory.record(f"chain:{run.device}", per_chain, average=True)
        run.memory.record(f"chain:{run.key}:{run.device}", per_chain, average=True)


def _phase_stages(run: _Run) -> None:
    run.schedule.emit("stages", 0.0, "measuring stages")
    run.stages = stage_measurements(run.model, run.detection, run.plan, run.device, run.dtype, run.channels_last,
                                    run.settings, run.schedule.for_phase("stages"), casts=run.casts)


def _phase_baselines(run: _Run) -> None:
    run.schedule.emit("baselines", 0.0, "measuring eager and torch.compile baselines")
    try:
        _reference_output(run)  # for the baselines' precision; they are timed without it if it fails
    except Exception as exc:
        run.notes.append(PHASES_WORDS("baselines_precision_measured_float64", x=m._one_line(exc)))
    run.baselines = baselines(run.model, run.fused_gm, run.inputs, run.device, run.dtype, run.channels_last,
                              run.settings, run.schedule.for_phase("baselines"), ref=run.ref,
                              classification=run.classification, casts=run.casts)


def host_probe_s() -> float:
    """Wall seconds a fixed piece of CPU work takes now (400 products of 160×160 float32 matrices on this process's
    threads: about 40 ms on an idle core of the 2-core machine, several times that when other work holds the cores):
    what the host's load does to this process's CPU work, for ``progress.probe_pace``."""
    x = torch.full((160, 160), 0.5)
    with torch.inference_mode():
        torch.mm(x, x)
        t0 = time.perf_counter()
        for _ in range(400):
            torch.mm(x, x)
        return time.perf_counter() - t0


def _chain_cost(memory: CostMemory, key: str, device: str, pace: float = 1.0) -> float | None:
    """One chain's remembered cost: this model's chains on this device, else any model's (a machine-wide average),
    scaled by the host's pace now (``pace``)."""
    own = memory.get(f"chain:{key}:{device}")
    cost = own if own is not None else memory.get(f"chain:{device}")
    return None if cost is None else pace * cost


def _forward_key(key: str, device: str, dtype: str) -> str:
    return f"forward:{key}:{device}:{dtype}"


def _chains_to_time(accepted: list, applied: dict) -> int:
    """Chains the chains phase times (fused, with a fused kernel on this device); the others cost nothing."""
    return sum(1 for c in accepted if applied.get(c.id) is not None and applied[c.id].status == "fused"
               and applied[c.id].fused_kernel)


def _stage_graphs(accepted: list) -> int:
    """Distinct graphs of the staged table, as ``stages.describe_stages`` will find them: levels that apply
    a different set of (chain, how much) than the level before."""
    seen, graphs = set(), 0
    for level in rewrite.LEVELS:
        modes = tuple(sorted((c.id, rewrite._mode(c, level) or "") for c in accepted)) if level != "none" else ()
        modes = tuple(x for x in modes if x[1])
        if modes not in seen:
            seen.add(modes)
            graphs += 1
    return graphs


#: A phase's remembered scale (its time over its price, ``_run_phase``) is kept only for a phase priced above this,
#: and within these bounds: a formula's constant terms dominate a tiny phase, and one odd run is no model.
SCALE_MIN_PRICED_S = 0.05
SCALE_RANGE = (0.2, 5.0)


def _scale_key(key: str, device: str, settings: RunSettings, phase: str) -> str:
    """The memory's key for a phase's scale: the model, the device and the settings that change what it does."""
    return f"scale:{key}:{device}:" + "|".join(str(x) for x in (
        settings.dtype, settings.quick, settings.chains_timed, settings.stages, settings.compile_baseline,
        settings.compile_modes, settings.warmup, settings.reps)) + f":{phase}"


def _phase_scales(memory: CostMemory, key: str, device: str, settings: RunSettings) -> dict[str, float]:
    """What each phase took against its price in the last run like this one (a phase never measured: absent)."""
    got = {p: memory.get(_scale_key(key, device, settings, p)) for p in PHASE_WORK}
    return {p: v for p, v in got.items() if v is not None}


def _remember_scale(run: _Run, phase: str, took: float) -> None:
    """Keep what ``phase`` took against the formula's price for it (its last estimate, made from this run's measured
    forward, over the scale that estimate already carried), for the next run like this one."""
    if run.memory is None:
        return
    priced = run.schedule.estimates.get(phase, 0.0) / run.scales.get(phase, 1.0)    # the formula's own price
    if priced > SCALE_MIN_PRICED_S:
        run.memory.record(_scale_key(run.key, run.device, run.settings, phase),
                          min(max(took / priced, SCALE_RANGE[0]), SCALE_RANGE[1]))


def _phase_estimates(settings: RunSettings, phases: tuple[str, ...], cuda: bool, device: str,
                     forward_s: float | None, chains_to_time: float, stage_graphs: int, fuse_s: float,
                     chain_s: float | None, scales: dict[str, float] | None = None) -> dict[str, float]:
    """``progress.run_estimates`` for these settings (a forward's time measured, remembered or guessed), each phase
    scaled by what it took against its price the last time (``scales``, ``_phase_scales``): the formula's fixed
    terms (a float64 forward taken as 4 fp32 ones, 0.2 s here and there) are guesses that the run corrects."""
    timing = m.TimingPlan.for_device(device, settings.warmup, settings.reps, quick=settings.quick)
    fields = ("target_s", "min_reps", "max_reps", "budget_s")
    priced = run_estimates(
        cuda=cuda, forward_s=forward_s if forward_s is not None else PRIOR_FORWARD_S["cuda" if cuda else "cpu"],
        timing={k: getattr(timing, k) for k in fields},
        quick=settings.quick, phases=phases, chains_to_time=int(chains_to_time), chains_timed=settings.chains_timed,
        stage_graphs=stage_graphs, stages=settings.stages,
        compile_modes=len(settings.compile_modes) if settings.compile_baseline else 0, fuse_s=fuse_s,
        warmup=settings.warmup, reps=settings.reps, chain_s=chain_s)
    return {p: v * (scales or {}).get(p, 1.0) for p, v in priced.items()}


def _revise(run: _Run, forward_s: float) -> None:
    """Re-price the phases not yet finished from a measured forward, and remember it for the next run."""
    run.memory.record(_forward_key(run.key, run.device, run.settings.dtype), forward_s)
    estimates = _phase_estimates(run.settings, run.phases, run.cuda, run.device, forward_s, run.chains_to_time,
                                 run.stage_graphs, run.fuse_s,
                                 _chain_cost(run.memory, run.key, run.device, run.cpu_pace), run.scales)
    run.schedule.revise(**{p: v for p, v in estimates.items() if p not in run.done})


PHASE_WORK: dict[str, Callable[[_Run], None]] = {
    "reference": _phase_reference, "main": _phase_main, "chains": _phase_chains, "stages": _phase_stages,
    "baselines": _phase_baselines}


def _report(run: _Run) -> Report:
    """The typed report of what has been measured so far (every derived fact computed here, once)."""
    s, detection = run.settings, run.detection
    notes = list(run.notes)
    if run.settings.chains_timed and "chains" in run.done:
        chains = run.chains
    else:
        chains = tuple(chain_entry(c, run.applied.get(c.id), run.graph, run.dtype) for c in run.accepted)
        if not s.chains_timed:
            notes.append(NOTES("per_chain_micro_benchmarks" if s.quick else "per_chain_micro_benchmarks_2"))
    if s.quick:
        notes.append(NOTES("quick_mode_fewer_repetitions"))
    if run.threads is not None:
        notes.append(NOTES("threads_default" if s.cpu_threads is None else "intra_op_thread_cpu_2", n=run.threads))
    host = host_load(run.load, torch.get_num_threads(), s.cpu_threads is not None)
    if host.busy:
        notes.append(host.warning())
    counted = launch_counts(Analysis(run.model, run.graph, detection), run.applied.values(), run.fused_ids, run.device)
    graph_launches, fused_launches = counted.before, counted.after  # the device's, per kernel (explorer.launches)
    main_failed = next((f for f in run.failures if f.phase == "main"), None)
    not_timed = "not timed: the main phase failed (the report's failures say why)" if main_failed else "not timed"
    unfused = run.unfused or Measurement(name="unfused", note=not_timed, bytes_moved=run.bytes_unfused)
    fused = run.fused or Measurement(name="fused", note=not_timed, bytes_moved=run.bytes_fused)
    unfused = dataclasses.replace(unfused, precision=precision_of(run.prec_unfused), graph_launches=graph_launches)
    fused = dataclasses.replace(fused, precision=precision_of(run.prec_fused), graph_launches=fused_launches)
    verdict = run.verdict or Verdict(NOT_MEASURED, note=not_timed)
    f_rel = (run.prec_fused or {}).get("rel_l2")
    u_rel = (run.prec_unfused or {}).get("rel_l2")
    ratio = m.element_ratio(run.dtype)
    return Report(
        model=_model_info(run.model, detection), plan=_plan_info(run.plan), environment=run.environment,
        unfused=unfused, fused=fused, verdict=verdict,
        settings={**s.to_dict(), "device_resolved": run.device},
        fused_vs_unfused=precision_of(run.fused_vs_unfused), reference=run.ref_where,
        fused_worse=None if f_rel is None or u_rel is None else bool(f_rel > 2 * u_rel + 1e-12),
        chains=tuple(chains), stages=tuple(run.stages), baselines=tuple(run.baselines), notes=tuple(notes),
        precision_note=PRECISION_NOTE.format(ref=run.ref_where or "not computed"),
        bytes_note=NOTES("graph_byte_model_each", x=f"{ratio:g}", x2=s.dtype),
        graph_calls_note=GRAPH_CALLS_NOTE,
        rotation_note=run.rotation,
        failures=tuple(run.failures), host=host,
        duration_s=round(time.perf_counter() - run.t_start, 2))


def host_cores() -> int:
    """The CPUs this process may run on (its affinity), else the machine's."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def host_load_1min() -> float | None:
    """``os.getloadavg()``'s 1-minute average, or None where the system has none."""
    try:
        return round(float(os.getloadavg()[0]), 2)
    except (AttributeError, OSError):
        return None


def host_load(samples: list, torch_threads: int, threads_set: bool) -> HostLoad:
    """The report's ``HostLoad`` from the samples taken (busy: the highest above the cores)."""
    kept = tuple(float(x) for x in samples if x is not None)
    cores = host_cores()
    return HostLoad(cores=cores, torch_threads=int(torch_threads), load_1min=kept,
                    busy=bool(kept) and max(kept) > cores, threads_set=threads_set)

