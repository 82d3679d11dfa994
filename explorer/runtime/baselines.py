"""Baselines a fused model is compared with: the eager module and ``torch.compile``.

Timed alternated with the fused graph in one run, with the plan's levers
(memory format, CUDA graphs) applied to every variant, so that only the method
differs.
"""

from __future__ import annotations

import time
from typing import Any, Callable

import torch

from explorer.runtime import measure as m
from explorer.runtime.settings import RunSettings
from explorer.runtime.variants import make_variant, measure_variants


def baselines(model: Any, fused_gm: Any, inputs: tuple, device: str, dtype: Any, channels_last: bool,
              settings: RunSettings, emit: Callable[[float, str], None], cuda_graphs: bool = False) -> dict:
    """Eager ``nn.Module`` and ``torch.compile`` (default mode), timed alternated with the fused graph,
    all with the plan's levers (memory format, CUDA graphs) so that only the method differs."""

    result: dict[str, Any] = {}
    variants = [make_variant("fused", fused_gm, inputs, device, cuda_graphs)]
    eager = model.module
    if eager is not None:
        eager = m.prepare_module(eager, device, dtype, channels_last)
        variants.append(make_variant("eager", eager, inputs, device, cuda_graphs))
    else:
        result["eager"] = {"error": "this source has no eager nn.Module (ONNX or .pt2): not measured"}
    target = eager if eager is not None else m.prepare_graph(model.gm, device, dtype, channels_last)
    emit(0.1, "compiling with torch.compile (default mode)")
    try:
        compiled = torch.compile(target)
        t0 = time.perf_counter()
        with torch.inference_mode():
            compiled(*inputs)
        m.synchronize(device)
        compile_s = time.perf_counter() - t0
        v = make_variant("torch_compile", compiled, inputs, device, cuda_graphs)
        v.resident_bytes = m.weight_bytes(target) + m.tensor_bytes(inputs)
        variants.append(v)
    except Exception as exc:
        result["torch_compile"] = {"error": f"torch.compile failed: {m._one_line(exc)}"}
        compile_s = None
    emit(0.6, "timing baselines")
    timing = m.TimingPlan.for_device(device, settings.warmup, settings.reps)
    res = measure_variants(variants, device, timing, model.batch)
    for name, r in res.items():
        result[name if name != "fused" else "fused_same_rounds"] = r
    if "torch_compile" in result and compile_s is not None:
        result["torch_compile"]["compile_s"] = round(compile_s, 2)
        result["torch_compile"]["mode"] = "default"
    return result
