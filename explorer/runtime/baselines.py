"""Baselines the fused model is compared with, like with like: eager and torch.compile's modes.

Every entry runs in the plan's memory format (a channels_last fused model is
never set against an NCHW compile), and all are timed in the same alternated
rounds, so each pair is measured under the same conditions:

    fused (plain calls)        against   eager, torch.compile default,
                                         torch.compile max-autotune-no-cudagraphs (on request)
    fused + CUDA graphs        against   eager + CUDA graphs, torch.compile reduce-overhead   (CUDA only)

CUDA graphs are only ever compared with CUDA graphs: ``reduce-overhead`` is
torch.compile's own CUDA-graph mode. Each torch.compile entry records its
compile time (the first call). Each baseline carries the verdict of its fused
partner against it (``explorer.stats.compare`` on the paired rounds:
``FASTER`` means the fused model is faster than that baseline).
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable

import torch

from explorer.messages import BASELINES, PROGRESS
from explorer import stats
from explorer.report import Baseline
from explorer.runtime import measure as m
from explorer.runtime.settings import RunSettings
from explorer.runtime.variants import Variant, make_variant, measure_variants, precision_of

LABELS = {
    "fused": "fused (this plan)",
    "fused_cuda_graphs": "fused + CUDA graphs",
    "eager": "eager PyTorch",
    "eager_cuda_graphs": "eager + CUDA graphs",
    "torch_compile": "torch.compile (default)",
    "torch_compile_reduce_overhead": "torch.compile reduce-overhead (CUDA graphs)",
    "torch_compile_max_autotune_no_cudagraphs": "torch.compile max-autotune-no-cudagraphs",
}
MODE_NAMES = {"default": "torch_compile", "reduce-overhead": "torch_compile_reduce_overhead",
              "max-autotune-no-cudagraphs": "torch_compile_max_autotune_no_cudagraphs"}


def _compiled_variant(name: str, target: torch.nn.Module, mode: str, inputs: tuple, device: str
                      ) -> tuple[Variant, float]:
    """``torch.compile(target, mode=mode)`` called once (the compile, timed) and wrapped for timing.

    ``reduce-overhead`` records CUDA graphs (cudagraph trees): each timed call
    starts a new step (``torch.compiler.cudagraph_mark_step_begin``), as a
    training or serving loop does.
    """
    compiled = torch.compile(target, mode=None if mode == "default" else mode)
    graphs = mode == "reduce-overhead" and device.startswith("cuda")

    def call() -> Any:
        if graphs:
            torch.compiler.cudagraph_mark_step_begin()
        return compiled(*inputs)

    t0 = time.perf_counter()
    with torch.inference_mode():
        call()
    m.synchronize(device)
    compile_s = time.perf_counter() - t0
    with torch.inference_mode():
        for _ in range(2):  # cudagraph trees record on a later call than the first
            call()
    m.synchronize(device)
    resident = m.weight_bytes(target) + m.tensor_bytes(inputs)
    note = "timed as cudagraph-tree replays (torch.compile's own CUDA graphs)" if graphs else ""
    return Variant(name, call, call, resident, cuda_graph=graphs, note=note), compile_s


def baselines(model: Any, fused_gm: Any, inputs: tuple, device: str, dtype: Any, channels_last: bool,
              settings: RunSettings, emit: Callable[[float, str], None], ref: Any = None,
              classification: bool = False, timing: m.TimingPlan | None = None, casts: Any = None
              ) -> tuple[Baseline, ...]:
    """Time the fused model beside eager and torch.compile (module docstring); returns every entry,
    fused ones included, with verdicts of each fused entry against its baselines. ``timing``
    overrides the settings' timing plan (a benchmark's own target); ``casts`` is the model's cast
    record (``measure.record_casts``) for a graph compiled in place of a missing eager module.

    A baseline that fails while timed (``measure.VariantFailed``) is dropped with its error and the
    others are timed again without it; a failure of the fused entry itself, or one that leaves the
    CUDA context unusable, is the phase's (raised)."""
    cuda = device.startswith("cuda")
    fmt = "channels_last" if channels_last else "nchw"
    entries: dict[str, dict[str, Any]] = {}
    variants: list[Variant] = [make_variant("fused", fused_gm, inputs, device)]
    entries["fused"] = dict(method="fused", mode=None, cuda_graphs=False)
    if cuda:
        variants.append(make_variant("fused_cuda_graphs", fused_gm, inputs, device, cuda_graphs=True))
        entries["fused_cuda_graphs"] = dict(method="fused", mode=None, cuda_graphs=True)
    eager = model.module
    if eager is not None:
        eager = m.prepare_module(eager, device, dtype, channels_last)
        variants.append(make_variant("eager", eager, inputs, device))
        entries["eager"] = dict(method="eager", mode=None, cuda_graphs=False, pairs_with="fused")
        if cuda:
            variants.append(make_variant("eager_cuda_graphs", eager, inputs, device, cuda_graphs=True))
            entries["eager_cuda_graphs"] = dict(method="eager", mode=None, cuda_graphs=True,
                                                pairs_with="fused_cuda_graphs")
    else:
        entries["eager"] = dict(method="eager", mode=None, cuda_graphs=False, pairs_with="fused",
                                error="this source has no eager nn.Module (ONNX or .pt2): not measured")
    target = eager if eager is not None else m.prepare_graph(model.gm, device, dtype, channels_last, lean=False,
                                                                    casts=casts)
    modes = list(settings.compile_modes)
    for i, mode in enumerate(modes):
        name = MODE_NAMES[mode]
        graphs = mode == "reduce-overhead"
        entry = dict(method="torch.compile", mode=mode, cuda_graphs=graphs and cuda,
                     pairs_with="fused_cuda_graphs" if graphs else "fused")
        entries[name] = entry
        if graphs and not cuda:
            entry["error"] = "reduce-overhead is torch.compile's CUDA-graph mode: not measured without CUDA"
            continue
        emit(0.05 + 0.5 * i / max(len(modes), 1), PROGRESS("compiling_with_torch_compile", x=mode))
        try:
            variant, compile_s = _compiled_variant(name, target, mode, inputs, device)
            variants.append(variant)
            entry["compile_s"] = round(compile_s, 2)
        except Exception as exc:
            if cuda:
                torch.cuda.synchronize()
            entry["error"] = BASELINES("torch_compile_failed", x=mode, x2=m._one_line(exc))
    timing = timing or m.TimingPlan.for_device(device, settings.warmup, settings.reps, quick=settings.quick)
    while True:
        emit(0.6, PROGRESS("timing_variants_alternated", n=len(variants)))
        names = {v.name for v in variants}
        pairs = tuple((name, e["pairs_with"]) for name, e in entries.items()
                      if e.get("pairs_with") in names and name in names)
        try:
            res, samples = measure_variants(variants, device, timing, model.batch, pairs=pairs)
            break
        except m.VariantFailed as exc:
            cause = exc.__cause__ or exc
            if exc.variant == "fused" or exc.variant not in entries or m.cuda_context_lost(device, cause):
                raise
            entries[exc.variant]["error"] = BASELINES("failed_while_timed_dropped", x=m._one_line(cause))
            variants = [v for v in variants if v.name != exc.variant]
    out = []
    for name, e in entries.items():
        measured = res.get(name)
        if measured is not None and ref is not None:
            try:
                with torch.inference_mode():
                    forward = next(v for v in variants if v.name == name).forward
                    prec = precision_of(m.precision(forward(), ref, classification, dtype))
                measured = dataclasses.replace(measured, precision=prec)
            except Exception as exc:
                if m.cuda_context_lost(device, exc):
                    raise
                e["error"] = BASELINES("precision_measured", x=m._one_line(exc))
        verdict = None
        partner = e.get("pairs_with")
        if measured is not None and e["method"] != "torch.compile" and e["cuda_graphs"] and not measured.cuda_graph:
            # the capture failed and it ran as plain calls: not the CUDA-graph variant it is named for
            e["error"] = BASELINES("cuda_graph_measurement", msg=measured.note)
            partner = None
        if partner is not None and (res.get(partner) is None or (entries[partner]["cuda_graphs"]
                                                                  and not res[partner].cuda_graph)):
            partner_note = BASELINES("partner_was_measured_named", x=partner)
            e["error"] = e.get("error") or partner_note
            partner = None
        if measured is not None and partner in samples:
            verdict = stats.compare(samples[name], samples[partner], basis=f"{LABELS[partner]} against {LABELS[name]}")
        out.append(Baseline(name=name, label=LABELS[name], method=e["method"], mode=e["mode"],
                            cuda_graphs=bool(e["cuda_graphs"]), memory_format=fmt, measurement=measured,
                            compile_s=e.get("compile_s"), pairs_with=e.get("pairs_with"), verdict=verdict,
                            error=e.get("error")))
    return tuple(out)
