"""The staged table: the model at each fusion level (original, Conv+BN folded, + epilogues, all).

Each level is ``explorer.fusions.rewrite.apply_plan(level=...)`` of the same
plan; the levels are prepared and timed alike, alternated.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

from explorer.fusions import rewrite
from explorer.runtime import measure as m
from explorer.runtime.settings import RunSettings
from explorer.runtime.variants import make_variant, measure_variants

STAGE_LABELS = {
    "none": "original",
    "conv_bn": "Conv+BN fused",
    "activation": "+ epilogues (activation/add)",
    "all": "all accepted",
}


def stage_measurements(model: Any, detection: Any, plan: Any, device: str, dtype: Any, channels_last: bool,
                       settings: RunSettings, emit: Callable[[float, str], None]) -> tuple[list, list]:
    """Cumulative levels of ``rewrite.LEVELS``, timed alternated; a level that fuses
    nothing more than the previous one is skipped and listed with the reason."""

    kept: list[tuple[str, Any, list[str]]] = []
    skipped = []
    previous: set[str] | None = None
    for level in rewrite.LEVELS:
        if level == "none":
            gm, fused = model.gm, []
        else:
            fm = rewrite.apply_plan(model.gm, detection, plan, device, level=level)
            gm, fused = fm.gm, sorted(a.chain_id for a in fm.applied if a.status == "fused")
        if previous is not None and set(fused) == previous:
            skipped.append({"stage": level, "label": STAGE_LABELS.get(level, level),
                            "reason": f"fuses the same {len(fused)} chain(s) as the previous stage"})
            continue
        previous = set(fused)
        kept.append((level, gm, fused))
    emit(0.1, f"timing {len(kept)} stages")
    inputs = m.prepare_inputs(model.example_inputs, device, dtype, channels_last)
    variants = [make_variant(level, m.prepare_graph(gm, device, dtype, channels_last), inputs, device,
                             plan.cuda_graphs) for level, gm, _ in kept]
    timing = m.TimingPlan.for_device(device, settings.warmup, settings.reps)
    timing = dataclasses.replace(timing, target_s=timing.target_s / 2)
    res = measure_variants(variants, device, timing, model.batch, launches=False,
                           on_round=lambda r, n: emit(0.1 + 0.9 * r / n, f"timing stages, round {r}/{n}")
                           if r % max(1, n // 10) == 0 else None)
    stages = []
    for level, _gm, fused in kept:
        r = res[level]
        stages.append({"stage": level, "label": STAGE_LABELS.get(level, level), "latency_ms": r["latency_ms"],
                       "throughput": r["throughput"], "peak_memory_bytes": r["peak_memory_bytes"],
                       "activation_peak_bytes": r["activation_peak_bytes"], "chains_fused": len(fused)})
    return stages, skipped
