"""One whole measurement, in the process that runs it: the typed report of a model under a plan.

``measure(source, plan, settings, emit)`` is what the runner's child process
does (``explorer.gpu_runner``), and what a benchmark may call in-process::

    analyze (load, graph, detect) ─► plan (None: all accepted) ─► fuse
       ─► unfused gm | fused gm, both prepared alike (device, dtype, memory format, lean calls)
       ─► precision vs float64 ─► latency (paired, alternated rounds; a tested verdict),
          peak memory, launches, GPU busy time, bytes
       ─► per-chain micro-benchmarks ─► stages ─► baselines (eager, torch.compile modes)
       ─► explorer.report.Report, every derived fact computed here, once

Progress goes through ``explorer.runtime.progress.Schedule``: each status says
about how many seconds are left. ``settings.quick`` takes fewer repetitions and
skips the per-chain timing.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable

import torch

from explorer import stats
from explorer.fusion_engine import analyze, fuse
from explorer.fusions.plan import Plan, make_plan
from explorer.report import Environment, InputInfo, ModelInfo, PlanInfo, Report
from explorer.runtime import measure as m
from explorer.runtime.baselines import baselines
from explorer.runtime.chains import chain_benchmarks, chain_entry
from explorer.runtime.progress import Schedule
from explorer.runtime.settings import RunSettings
from explorer.runtime.stages import stage_measurements
from explorer.runtime.variants import make_variant, measure_variants, precision_of, reference_output
from explorer.sources import describe_source

PRECISION_NOTE = ("max_rel = max|out-ref| / max|ref|; rel_l2 = ||out-ref|| / ||ref||; ref = {ref}; top1_agreement "
                  "only for classification (argmax of last dim); relative figures are refused (with the reason) "
                  "when the reference is all zero, constant or denormal in the run's dtype")
#: Quick mode on the CPU runs one intra-op thread unless told otherwise: on a CPU shared with other work,
#: the threads of one op wait for each other (a ResNet-50 forward took 0.11 s on 1 thread, 0.3-2.4 s on 2).
QUICK_CPU_THREADS = 1
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


def measure(source: str, plan_data: dict | None, settings: RunSettings,
            emit: Callable[[float, str], None] | None = None) -> Report:
    """Run the whole measurement in this process and return the typed report (module docstring).

    The intra-op thread count (``settings.cpu_threads``, or one thread for a quick CPU run) holds for
    the measurement and is restored afterwards, for callers that measure in-process.
    """
    cuda = m.resolve_device(settings.device).startswith("cuda")
    threads = settings.cpu_threads or (QUICK_CPU_THREADS if settings.quick and not cuda else None)
    before = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)  # before anything runs; environment() records it
    try:
        return _measure(source, plan_data, settings, emit, threads)
    finally:
        torch.set_num_threads(before)


def _measure(source: str, plan_data: dict | None, settings: RunSettings,
             emit: Callable[[float, str], None] | None, threads: int | None) -> Report:
    t_start = time.perf_counter()
    cuda_device = m.resolve_device(settings.device)
    cuda = cuda_device.startswith("cuda")
    # Rough first estimates (seconds); revised once a forward has been timed.
    schedule = Schedule(emit or (lambda f, s: None), {
        "load": 10.0, "prepare": 3.0, "reference": 3.0, "main": 10.0 if settings.quick else 20.0,
        "chains": 60.0 if settings.chains_timed else 0.0, "stages": 15.0 if settings.stages else 0.0,
        "baselines": 60.0 * len(settings.compile_modes) if settings.compile_baseline else 0.0})
    device, dtype = cuda_device, m.torch_dtype(settings.dtype)
    environment = _environment(device)
    notes: list[str] = []

    schedule.emit("load", 0.0, f"loading {source}")
    _check_memory(source, settings)
    analysis = analyze(source, batch=settings.batch, seq_len=settings.seq_len)
    model, graph, detection = analysis
    plan = make_plan(detection, "all") if plan_data is None else Plan.from_dict(plan_data)
    plan.check_for(detection)
    _check_device_memory(model, graph, device, dtype)

    schedule.emit("prepare", 0.0, "applying the plan")
    t0 = time.perf_counter()
    fused_model = fuse(analysis, plan, device)
    fuse_s = time.perf_counter() - t0
    applied = {a.chain_id: a for a in fused_model.applied}
    fused_ids = [a.chain_id for a in fused_model.applied if a.status == "fused"]
    channels_last = plan.memory_format == "channels_last"
    if plan.cuda_graphs and not cuda:
        notes.append("CUDA graphs requested but ignored: they need CUDA")
    schedule.emit("prepare", 0.5, f"preparing models ({settings.dtype}, {device}, {plan.memory_format})")
    unfused_gm = m.prepare_graph(model.gm, device, dtype, channels_last)
    fused_gm = m.prepare_graph(fused_model.gm, device, dtype, channels_last)
    inputs = m.prepare_inputs(model.example_inputs, device, dtype, channels_last)
    classification = model.task == "classification"

    ratio = m.element_ratio(dtype)
    bytes_unfused = m.graph_bytes(graph, dtype)
    bytes_fused = int(bytes_unfused - ratio * sum(detection.chain(cid).bytes_saved for cid in fused_ids))

    # -- precision first: a wrong fused model is the first thing to know
    schedule.emit("reference", 0.0, "computing the float64 reference")
    ref, ref_where = reference_output(model.gm, model.example_inputs, device)
    with torch.inference_mode():
        out_unfused = unfused_gm(*inputs)
        t0 = time.perf_counter()  # the second call: the first pays one-time costs, the estimate wants steady state
        out_unfused = unfused_gm(*inputs)
        m.synchronize(device)
        forward_s = time.perf_counter() - t0
        out_fused = fused_gm(*inputs)
    prec_unfused = m.precision(out_unfused, ref, classification, dtype)
    prec_fused = m.precision(out_fused, ref, classification, dtype)
    fused_vs_unfused = m.precision(out_fused, [t.double() for t in m.flat_outputs(out_unfused)], classification, dtype)
    del out_unfused, out_fused

    timing = m.TimingPlan.for_device(device, settings.warmup, settings.reps, quick=settings.quick)
    per_variant = max(timing.target_s, timing.min_reps * forward_s)
    accepted = [c for c in detection.chains if c.id in set(plan.accepted)]
    timed_chains = sum(1 for c in accepted if applied.get(c.id) is not None and applied[c.id].fused_kernel
                       and applied[c.id].status == "fused")
    schedule.revise(
        main=2 * per_variant + 12 * forward_s + 0.5 * timing.budget_s,
        chains=timed_chains * (1.2 if cuda else 0.5) if settings.chains_timed else 0.0,
        stages=(3 * fuse_s + 3 * (max(timing.target_s / 2, (4 if settings.quick else timing.min_reps) * forward_s)
                                  + 4 * forward_s)) if settings.stages else 0.0,
        baselines=((45.0 if cuda else 20.0) * len(settings.compile_modes) + 4 * per_variant)
        if settings.compile_baseline else 0.0)

    # -- the main A/B, paired rounds, more while the verdict is open
    schedule.emit("main", 0.0, "warming up unfused and fused")
    variants = [make_variant("unfused", unfused_gm, inputs, device, plan.cuda_graphs),
                make_variant("fused", fused_gm, inputs, device, plan.cuda_graphs)]

    def main_round(r: int, n: int) -> None:
        if r % max(1, n // 20) == 0 or r == n:
            schedule.emit("main", 0.8 * r / n, f"timing unfused vs fused, round {r}/{n}")

    graph_launches = int(detection.totals.get("launches", 0))
    main, samples = measure_variants(variants, device, timing, model.batch,
                                     {"unfused": bytes_unfused, "fused": bytes_fused}, main_round,
                                     pairs=(("unfused", "fused"),))
    basis = "CUDA-graph replays" if variants[1].cuda_graph else "synchronised calls"
    verdict = stats.compare(samples["unfused"], samples["fused"], basis=f"whole model, {basis}")
    unfused = dataclasses.replace(main["unfused"], precision=precision_of(prec_unfused),
                                  graph_launches=graph_launches)
    fused = dataclasses.replace(main["fused"], precision=precision_of(prec_fused),
                                graph_launches=graph_launches - sum(detection.chain(c).launches_saved for c in fused_ids))
    del variants

    # -- per-chain micro-benchmarks
    if settings.chains_timed:
        chains = chain_benchmarks(model, graph, detection, accepted, applied, device, dtype, settings,
                                  schedule.for_phase("chains"), cuda_graphs=plan.cuda_graphs)
        rotation = chains[0].rotation if chains else ""
    else:
        chains = [chain_entry(c, applied.get(c.id), graph, dtype) for c in accepted]
        notes.append("per-chain micro-benchmarks not run (" + ("quick mode" if settings.quick else "per_chain off")
                     + ")")
        rotation = ""

    stages = ()
    if settings.stages:
        schedule.emit("stages", 0.0, "measuring stages")
        stages = stage_measurements(model, detection, plan, device, dtype, channels_last, settings,
                                    schedule.for_phase("stages"))

    base = ()
    if settings.compile_baseline:
        schedule.emit("baselines", 0.0, "measuring eager and torch.compile baselines")
        base = baselines(model, fused_gm, inputs, device, dtype, channels_last, settings,
                         schedule.for_phase("baselines"), ref=ref, classification=classification)
    if settings.quick:
        notes.append("quick mode: fewer repetitions and no per-chain timing; verdicts may be undecided")
    if threads is not None:
        notes.append(f"{threads} intra-op thread(s) on the CPU" + (" (quick mode's default: stable on a shared CPU)"
                                                                  if settings.cpu_threads is None else ""))

    f_rel, u_rel = prec_fused.get("rel_l2"), prec_unfused.get("rel_l2")
    report = Report(
        model=_model_info(model, detection), plan=_plan_info(plan), environment=environment,
        unfused=unfused, fused=fused, verdict=verdict,
        settings={**settings.to_dict(), "device_resolved": device},
        fused_vs_unfused=precision_of(fused_vs_unfused), reference=ref_where,
        fused_worse=None if f_rel is None or u_rel is None else bool(f_rel > 2 * u_rel + 1e-12),
        chains=tuple(chains), stages=tuple(stages), baselines=tuple(base), notes=tuple(notes),
        precision_note=PRECISION_NOTE.format(ref=ref_where),
        bytes_note=("graph byte model: each op reads its inputs and weights once and writes its outputs once; "
                    f"captured in float32, floating tensors scaled by {ratio:g} for {settings.dtype}; "
                    "fused = unfused minus the fused chains' intermediates"),
        graph_calls_note=GRAPH_CALLS_NOTE,
        rotation_note=rotation,
        duration_s=round(time.perf_counter() - t_start, 2))
    schedule.done()
    return report
