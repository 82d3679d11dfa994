"""The staged table: the model at each fusion level (original, Conv+BN folded, + epilogues, all accepted).

Each level is ``explorer.fusions.rewrite.apply_plan(level=...)`` of the same
plan (``rewrite.LEVELS``), and each is what its name says:

    original        the captured graph, nothing fused
    Conv+BN folded  every accepted chain with a BatchNorm has it folded into its conv; activations and
                    adds stay separate ops (a Conv+BN+ReLU chain is *folded* here, not fused)
    + epilogues     conv and GEMM epilogue chains (Conv+BN+act, Conv+BN+Add+act, Linear+act) become one call
    all accepted    every accepted chain (attention, norms, elementwise, sibling GEMMs) too

Stages are told apart by their graphs, not by which chain ids the rewrite calls
"fused" (a Conv+BN+ReLU chain counts as fused at the Conv+BN level, where only
its BatchNorm is folded). ``describe_stages`` says how each graph differs from
the previous one; a stage whose graph is identical to an earlier stage's is
listed with ``same_as`` and not timed twice. The distinct ones are prepared
and timed alike, alternated.
"""

from __future__ import annotations

import dataclasses
import operator
from typing import Any, Callable

import torch

from explorer.messages import PROGRESS, STAGES
from explorer.fusions import rewrite
from explorer.fusions.base import Detection
from explorer.fusions.plan import Plan
from explorer.report import Stage
from explorer.runtime import measure as m
from explorer.runtime.settings import RunSettings
from explorer.runtime.variants import make_variant, measure_variants
from explorer.sources import LoadedModel
from explorer.vocab import Target

STAGE_LABELS = {
    "none": "original",
    "conv_bn": "Conv+BN folded",
    "activation": "+ epilogues (activation/add)",
    "all": "all accepted",
}


def graph_signature(gm: torch.fx.GraphModule) -> tuple[str, ...]:
    """The ops a graph calls, in order (getitem left out): two stages with equal signatures run the same ops."""
    return tuple(str(n.target) for n in gm.graph.nodes
                 if n.op == "call_function" and n.target is not operator.getitem)


def _count(gm: torch.fx.GraphModule) -> dict[str, int]:
    sig = graph_signature(gm)
    return {"graph_ops": len(sig),
            "fused_calls": sum(1 for n in gm.graph.nodes if n.op == "call_function" and "fused_chain" in n.meta),
            "batch_norms": sum(1 for t in sig if "batch_norm" in t)}


def describe_stages(model: LoadedModel, detection: Detection, plan: Plan, device: Target | str
                    ) -> list[tuple[Stage, torch.fx.GraphModule | None]]:
    """Every level's graph and its description (no timing): ``(Stage, gm)``, gm None when the
    graph is identical to an earlier stage's (``Stage.same_as`` names it)."""
    accepted = detection.accepted_chains(plan.accepted)
    out: list[tuple[Stage, torch.fx.GraphModule | None]] = []
    seen: dict[tuple[str, ...], str] = {}
    previous: dict[str, int] | None = None
    for level in rewrite.LEVELS:
        if level == "none":
            gm, applied = model.gm, {}
        else:
            fm = rewrite.apply_plan(model.gm, detection, plan, device, level=level)
            gm, applied = fm.gm, fm.by_id()
        modes = {c.id: rewrite._mode(c, level) for c in accepted}  # the staged table's one definition
        done = {cid for cid, a in applied.items() if a.status == "fused"}
        full = sum(1 for cid in done if modes.get(cid) == "full")
        folded = sum(1 for cid in done if modes.get(cid) == "fold")
        gammas = sum(1 for c in accepted if c.id in done and modes.get(c.id) == "fold" and c.node_for("gamma"))
        counts = _count(gm)
        sig = graph_signature(gm)
        label = STAGE_LABELS.get(level, level)
        same_as = seen.get(sig)
        if same_as is not None:
            differs = STAGES("same_graph_no_accepted", msg=STAGE_LABELS.get(same_as, same_as))
        else:
            differs = _differs(level, previous, counts, full, folded, gammas)
            seen[sig] = level
        out.append((Stage(stage=level, label=label, differs=differs, chains_fused=full, chains_folded=folded,
                          same_as=same_as, **counts), None if same_as else gm))
        previous = counts
    return out


def _differs(level: str, previous: dict[str, int] | None, now: dict[str, int], full: int, folded: int,
             gammas: int = 0) -> str:
    """What a stage changed; ``gammas`` of the ``folded`` chains fold RMSNorm's γ into linears, not a BatchNorm."""
    if previous is None:
        return STAGES("captured_graph_ops_nothing", n=now['graph_ops'])
    ops = f"{previous['graph_ops']} → {now['graph_ops']} ops"
    if level == "conv_bn":
        text = (f"{folded + full - gammas} BatchNorm(s) folded into their convs ({previous['batch_norms']} → "
                f"{now['batch_norms']} batch_norm ops, {ops}); activations and adds still separate ops")
        return text + (f"; {gammas} RMSNorm γ folded into the linears that read them" if gammas else "")
    if level == "activation":
        return f"conv/GEMM epilogues fused: {now['fused_calls']} fused call(s), {ops}"
    return f"every accepted chain applied: {full} chain(s), {now['fused_calls']} fused call(s), {ops}"


def stage_measurements(model: LoadedModel, detection: Detection, plan: Plan, device: str, dtype: torch.dtype,
                       channels_last: bool, settings: RunSettings, emit: Callable[[float, str], None],
                       casts: Any = None) -> tuple[Stage, ...]:
    """The four stages (``describe_stages``), the distinct graphs timed alternated (prepared with the
    model's own casts, ``casts``, as the whole model is)."""
    described = describe_stages(model, detection, plan, m.run_target(device, dtype, channels_last))
    distinct = [(s, gm) for s, gm in described if gm is not None]
    emit(0.1, PROGRESS("timing_distinct_stage_graphs", n=len(distinct)))
    inputs = m.prepare_inputs(model.example_inputs, device, dtype, channels_last)
    variants = [make_variant(s.stage, m.prepare_graph(gm, device, dtype, channels_last, casts=casts), inputs, device,
                             plan.cuda_graphs) for s, gm in distinct]
    timing = m.TimingPlan.for_device(device, settings.warmup, settings.reps, quick=settings.quick)
    # no verdict is drawn between stages: half the whole model's timing, and a quick run's minimum of 4 rounds
    timing = dataclasses.replace(timing, target_s=timing.target_s / 2,
                                 min_reps=4 if settings.quick else timing.min_reps)
    res, _samples = measure_variants(variants, device, timing, model.batch, launches=False,
                                     on_round=lambda r, n: emit(0.1 + 0.9 * r / n,
                                                                PROGRESS("timing_stages_round", n=r, n2=n))
                                     if r % max(1, n // 10) == 0 else None)
    out = []
    for stage, gm in described:
        if gm is None:
            out.append(stage)
            continue
        r = res[stage.stage]
        out.append(dataclasses.replace(stage, latency=r.latency, throughput=r.throughput,
                                       peak_memory_bytes=r.peak_memory_bytes,
                                       activation_peak_bytes=r.activation_peak_bytes))
    return tuple(out)
