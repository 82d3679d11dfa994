"""One whole measurement, in the process that runs it: the report of a model under a plan.

``measure(source, plan, settings, emit)`` is what the runner's child process
does (``explorer.gpu_runner``), and what a benchmark may call in-process::

    analyze (load, graph, detect) ─► plan (None: all accepted) ─► fuse
       ─► unfused gm | fused gm, both prepared alike (device, dtype, memory format, lean calls)
       ─► precision vs float64 ─► latency (alternated), peak memory, launches, bytes
       ─► per-chain micro-benchmarks ─► stages ─► baselines (eager, torch.compile)
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable

import torch

from explorer.fusion_engine import analyze, fuse
from explorer.fusions.plan import Plan, make_plan
from explorer.report import REPORT_VERSION
from explorer.runtime import measure as m
from explorer.runtime.baselines import baselines
from explorer.runtime.chains import chain_entry, chain_benchmarks
from explorer.runtime.settings import RunSettings
from explorer.runtime.stages import stage_measurements
from explorer.runtime.variants import make_variant, measure_variants, reference_output
from explorer.sources import describe_source


def _check_memory(source: str, settings: RunSettings) -> None:

    need = m.zoo_input_bytes(source, settings.batch, settings.seq_len)
    if need is None:
        return
    # fp32 inputs as generated, their float64 reference copy (2x), the copy in the run dtype.
    m.check_fits(4 * need, m.available_host_bytes(), "host memory, inputs alone")


def _check_device_memory(model: Any, graph: Any, device: str, dtype: Any) -> None:

    if not device.startswith("cuda"):
        largest = max((a["bytes_written"] for _, a in graph.nodes(data=True)), default=0)
        need = m.weight_bytes(model.gm) + 4 * largest
        m.check_fits(int(need), m.available_host_bytes(), "host memory, weights and largest activations")
        return
    ratio = m.element_ratio(dtype)
    largest = max((a["bytes_written"] for _, a in graph.nodes(data=True)), default=0)
    # two copies of the weights (unfused + fused), the inputs, a few live activations, float64 reference
    need = (2 * ratio + 2) * m.weight_bytes(model.gm) + (ratio + 2) * m.tensor_bytes(model.example_inputs) \
        + 4 * largest * 2
    free, _total = torch.cuda.mem_get_info()
    m.check_fits(int(need), int(free), "GPU memory, estimated from weights, inputs and largest activation")


def measure(source: str, plan_data: dict | None, settings: RunSettings,
            emit: Callable[[float, str], None] | None = None) -> dict:
    """Run the whole measurement in this process and return the report (see module docstring)."""

    emit = emit or (lambda f, s: None)
    t_start = time.perf_counter()
    device = m.resolve_device(settings.device)
    dtype = m.torch_dtype(settings.dtype)
    env = m.environment(device)
    env["tf32_matmul"] = bool(torch.backends.cuda.matmul.allow_tf32)
    env["tf32_cudnn"] = bool(torch.backends.cudnn.allow_tf32)
    notes: list[str] = []

    emit(0.01, f"loading {source}")
    _check_memory(source, settings)
    analysis = analyze(source, batch=settings.batch, seq_len=settings.seq_len)
    model, graph, detection = analysis
    plan = make_plan(detection, "all") if plan_data is None else Plan.from_dict(plan_data)
    plan.check_for(detection)
    _check_device_memory(model, graph, device, dtype)

    emit(0.08, "applying the plan")
    fused_model = fuse(analysis, plan, device)
    applied = {a.chain_id: a for a in fused_model.applied}
    fused_ids = [a.chain_id for a in fused_model.applied if a.status == "fused"]

    channels_last = plan.memory_format == "channels_last"
    if plan.cuda_graphs and not device.startswith("cuda"):
        notes.append("CUDA graphs requested but ignored: they need CUDA")
    emit(0.1, f"preparing models ({settings.dtype}, {device}, {plan.memory_format})")
    unfused_gm = m.prepare_graph(model.gm, device, dtype, channels_last)
    fused_gm = m.prepare_graph(fused_model.gm, device, dtype, channels_last)
    inputs = m.prepare_inputs(model.example_inputs, device, dtype, channels_last)
    classification = model.task == "classification"

    # -- bytes (graph model, scaled to the dtype)
    ratio = m.element_ratio(dtype)
    bytes_unfused = m.graph_bytes(graph, dtype)
    saved = sum(detection.chain(cid).bytes_saved for cid in fused_ids)
    bytes_fused = int(bytes_unfused - saved * ratio)

    # -- precision first: a wrong fused model is the first thing to know
    emit(0.12, "computing the float64 reference")
    ref, ref_where = reference_output(model.gm, model.example_inputs, device)
    with torch.inference_mode():
        out_unfused = unfused_gm(*inputs)
        out_fused = fused_gm(*inputs)
    prec_unfused = m.precision(out_unfused, ref, classification)
    prec_fused = m.precision(out_fused, ref, classification)
    fused_vs_unfused = m.precision(out_fused, [t.double() for t in m.flat_outputs(out_unfused)], classification)
    del out_unfused, out_fused

    # -- the main A/B
    timing = m.TimingPlan.for_device(device, settings.warmup, settings.reps)
    emit(0.15, "warming up unfused and fused")
    variants = [make_variant("unfused", unfused_gm, inputs, device, plan.cuda_graphs),
                make_variant("fused", fused_gm, inputs, device, plan.cuda_graphs)]

    def main_round(r: int, n: int) -> None:
        if r % max(1, n // 20) == 0 or r == n:
            emit(0.15 + 0.3 * r / n, f"timing unfused vs fused, round {r}/{n}")

    main = measure_variants(variants, device, timing, model.batch,
                            {"unfused": bytes_unfused, "fused": bytes_fused}, main_round)
    main["unfused"]["precision"] = prec_unfused
    main["fused"]["precision"] = prec_fused
    main["fused"]["precision_vs_unfused"] = fused_vs_unfused
    main["unfused"]["graph_launches"] = int(detection.totals.get("launches", 0))
    main["fused"]["graph_launches"] = int(detection.totals.get("launches", 0)
                                          - sum(detection.chain(c).launches_saved for c in fused_ids))
    del variants

    report: dict[str, Any] = {
        "version": REPORT_VERSION,
        "model": {**describe_source(model), "task": model.task, "description": model.description,
                  "fingerprint": detection.fingerprint, "chains_detected": len(detection.chains),
                  "ops": int(detection.totals.get("ops", 0)), "params": int(detection.totals.get("params", 0)),
                  "flops": int(detection.totals.get("flops", 0))},
        "plan": plan.to_dict(),
        "settings": {**settings.to_dict(), "device_resolved": device,
                     "timing": dataclasses.asdict(timing)},
        "environment": env,
        "unfused": main["unfused"],
        "fused": main["fused"],
        "reference": {"what": ref_where, "unfused": prec_unfused, "fused": prec_fused,
                      "fused_worse": _worse(prec_fused, prec_unfused)},
        "precision_note": ("max_rel = max|out-ref| / max|ref|; rel_l2 = ||out-ref|| / ||ref||; ref = "
                           + ref_where + "; top1_agreement only for classification (argmax of last dim)"),
        "bytes_note": ("graph byte model: each op reads its inputs and weights once and writes its outputs "
                       f"once; captured in float32, floating tensors scaled by {ratio:g} for {settings.dtype}; "
                       "fused = unfused minus the fused chains' intermediates"),
        "speedup": m.speedup(main["unfused"]["latency_ms"]["median"], main["fused"]["latency_ms"]["median"]),
        "graph_calls_note": ("unfused and fused graphs alike are timed lean (explorer.lean): ATen calls through "
                             "their public bindings, fused calls resolved once to the library call they take "
                             "on this device, weights read as plain attributes; the same kernels either way"),
        "applied": [dataclasses.asdict(a) for a in fused_model.applied],
        "chains": [],
        "stages": [],
        "stages_skipped": [],
        "baselines": None,
        "notes": notes,
    }

    # -- per-chain micro-benchmarks
    accepted = [c for c in detection.chains if c.id in set(plan.accepted)]
    if settings.per_chain:
        report["chains"] = chain_benchmarks(model, graph, detection, accepted, applied, device, dtype,
                                            settings, lambda f, s: emit(0.45 + 0.3 * f, s),
                                            cuda_graphs=plan.cuda_graphs)
    else:
        report["chains"] = [chain_entry(c, applied.get(c.id), graph, dtype) for c in accepted]
        notes.append("per-chain micro-benchmarks not run (per_chain=False)")

    # -- stages
    if settings.stages:
        emit(0.76, "measuring stages")
        report["stages"], report["stages_skipped"] = stage_measurements(
            model, detection, plan, device, dtype, channels_last, settings,
            lambda f, s: emit(0.76 + 0.14 * f, s))

    # -- baselines
    if settings.compile_baseline:
        emit(0.9, "measuring eager and torch.compile baselines")
        report["baselines"] = baselines(model, fused_gm, inputs, device, dtype, channels_last, settings,
                                        lambda f, s: emit(0.9 + 0.09 * f, s), cuda_graphs=plan.cuda_graphs)
    report["duration_s"] = round(time.perf_counter() - t_start, 2)
    emit(1.0, "done")
    return report


def _worse(fused: dict, unfused: dict) -> bool | None:
    f, u = fused.get("rel_l2"), unfused.get("rel_l2")
    if f is None or u is None:
        return None
    return bool(f > 2 * u + 1e-12)
