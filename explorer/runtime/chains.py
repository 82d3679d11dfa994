"""Every accepted chain timed alone, unfused against fused, on its real shapes, with a tested verdict.

Each chain becomes two small graphs (``explorer.fusions.rewrite.chain_module``):
the chain's own ops, and the same with the chain applied. They are prepared as
the whole model is (``prepare_graph``: same device, dtype and lean calls), run
on seeded inputs with the model's strides, checked against a float64
reference, and timed in paired, alternated rounds; on CUDA also as CUDA-graph
replays, which take the host out of the comparison.

Cache: on CUDA the L2 is flushed before every timed call (``measure.L2Flush``),
so a chain does not time its inputs and weights sitting in the 60 MB of L2 an
H200 keeps between calls; on the CPU inputs are not rotated and the report says
so (``ChainResult.rotation``).

Verdicts (``explorer.stats.compare``): faster / slower / no significant
difference, with rounds added while undecided. A chain whose fused form has no
fused kernel on this device (``AppliedChain.fused_kernel`` False: the very same
ops run) is labelled ``NO_KERNEL`` and not timed: it is never "slower".
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import torch

from explorer.messages import PROGRESS, VERDICT
from explorer import launches, stats
from explorer.fusion_engine import unfused_launches
from explorer.fusions import rewrite
from explorer.report import GPU, HOST, NO_KERNEL, NOT_MEASURED, SLOWER, ChainResult, Verdict
from explorer.runtime import measure as m
from explorer.runtime.settings import RunSettings
from explorer.runtime.variants import latency_of, make_variant

CPU_ROTATION = ("CPU run: chain inputs and weights are the same tensors every call and may stay in the CPU's "
                "caches (not rotated)")


def chain_entry(chain: Any, applied: Any, graph: Any, dtype: Any, verdict: Verdict | None = None,
                rotation: str = "") -> ChainResult:
    """A chain's result before (or without) timing: what the plan did to it, its bytes, its title."""
    b_unfused = m.graph_bytes(graph, dtype, chain.compute_nodes)
    status = applied.status if applied else "not applied"
    fused_kernel = bool(getattr(applied, "fused_kernel", False)) and status == "fused"
    if verdict is None:
        if status != "fused":
            verdict = Verdict(NOT_MEASURED, note=VERDICT("fused", msg=getattr(applied, 'reason', '') or status))
        elif not fused_kernel:
            verdict = Verdict(NO_KERNEL, note="the fused form runs the same ops on this device; not timed")
        else:
            verdict = Verdict(NOT_MEASURED, note="per-chain timing not run")
    return ChainResult(
        id=chain.id, title=chain.title, pattern=chain.pattern, status=status,
        reason=(getattr(applied, "reason", "") if applied else "apply_plan did not report this chain") or "",
        implementation=getattr(applied, "implementation", "") if applied else "",
        kernel=getattr(applied, "kernel", "auto") if applied else "auto", fused_kernel=fused_kernel,
        verdict=verdict, bytes_unfused=b_unfused,
        bytes_fused=int(b_unfused - chain.bytes_saved * m.element_ratio(dtype)),
        graph_launches_saved=launches.chain_launches(chain.id, unfused_launches(graph, chain), applied).saved,
        rotation=rotation)


def limited_by(plain: Verdict | None, graph: Verdict | None) -> str | None:
    """What makes a chain slower: the GPU (slower even as CUDA graphs) or the host (slower only as
    plain calls, where launch and Python overhead count); None when it is not slower either way."""
    if graph is not None and graph.label == SLOWER:
        return GPU
    if plain is not None and plain.label == SLOWER and graph is not None:
        return HOST
    return None


def chain_benchmarks(model: Any, graph: Any, detection: Any, chains: list, applied: dict, device: str,
                     dtype: Any, settings: RunSettings, emit: Callable[[float, str], None],
                     cuda_graphs: bool = False, casts: Any = None) -> list[ChainResult]:
    """Time each accepted chain alone, unfused vs fused, on its real shapes (module docstring).

    Each timed call is synchronised, so plain-call times include the host's launch
    overhead, which a chain of tiny kernels pays in an eager model. On CUDA the
    chain is also captured as a CUDA graph and its replays timed. The decisive
    verdict uses the graph replays when the plan replays CUDA graphs, else the
    plain calls. A failing chain is reported with its reason, never hidden. ``casts`` (a
    ``measure.CastRecord``) keeps the model's own casts in both forms, as the whole model does.
    """
    cuda = device.startswith("cuda")
    timing = m.TimingPlan.for_device(device, 3 if settings.warmup is None else min(settings.warmup, 3),
                                     None if settings.reps is None else max(stats.MIN_ROUNDS, settings.reps),
                                     short=True)
    flush = m.L2Flush(device) if cuda else None
    rotation = flush.describe() if flush is not None else CPU_ROTATION
    out: list[ChainResult] = []
    n = len(chains)
    for i, chain in enumerate(chains):
        emit(i / max(n, 1), PROGRESS("timing_chain", n=i + 1, n2=n))
        entry = chain_entry(chain, applied.get(chain.id), graph, dtype, rotation=rotation)
        if entry.status != "fused" or not entry.fused_kernel:
            out.append(entry)
            continue
        try:
            out.append(_time_chain(model, detection, chain, entry, device, dtype, timing, flush, cuda_graphs,
                                   casts))
        except Exception as exc:
            if cuda:
                try:
                    torch.cuda.synchronize()
                except Exception:
                    pass
            out.append(dataclasses.replace(entry, status="failed",
                                           reason=VERDICT("chain_benchmark_failed", x=m._one_line(exc)),
                                           verdict=Verdict(NOT_MEASURED, note="chain benchmark failed")))
    emit(1.0, PROGRESS("timed_chains", n=n))
    return out


def _time_chain(model: Any, detection: Any, chain: Any, entry: ChainResult, device: str, dtype: Any,
                timing: m.TimingPlan, flush: Any, cuda_graphs: bool, casts: Any = None) -> ChainResult:
    """One chain: prepare both forms, check them against float64, time them paired, decide."""
    unfused_c, fused_c, c_inputs = rewrite.chain_module(model.gm, detection, chain.id, m.run_target(device, dtype),
                                                        kernel=entry.kernel)
    u = m.prepare_graph(unfused_c, device, dtype, casts=casts)
    f = m.prepare_graph(fused_c, device, dtype, casts=casts)
    x = m.prepare_inputs(c_inputs, device, dtype)
    ref_where = device if device.startswith("cuda") else "cpu"
    ref_gm = m.prepare_graph(unfused_c, ref_where, torch.float64)
    with torch.inference_mode():
        ref = ref_gm(*m.prepare_inputs(c_inputs, ref_where, torch.float64))
        out_u, out_f = u(*x), f(*x)
    p_u, p_f = m.precision(out_u, ref, False, dtype), m.precision(out_f, ref, False, dtype)
    fns: dict[str, Callable[[], Any]] = {"unfused": lambda: u(*x), "fused": lambda: f(*x)}
    notes = []
    keep = []
    if device.startswith("cuda"):
        for name, mod in (("unfused", u), ("fused", f)):
            v = make_variant(name, mod, x, device, cuda_graphs=True)
            if v.cuda_graph:
                fns[name + "_graph"] = v.timed
                keep.append(v)
            else:
                notes.append(f"{name}: {v.note}")
    pairs = [("unfused", "fused")] + ([("unfused_graph", "fused_graph")] if "fused_graph" in fns else [])
    samples = m.time_paired(fns, pairs, device, timing, before=flush)
    lu, lf = m.count_launches(lambda: u(*x), device), m.count_launches(lambda: f(*x), device)
    plain = stats.compare(samples["unfused"], samples["fused"], basis="synchronised calls")
    graph = (stats.compare(samples["unfused_graph"], samples["fused_graph"], basis="CUDA-graph replays")
             if "fused_graph" in samples else None)
    decision = graph if (cuda_graphs and graph is not None) else plain
    if notes:
        decision = dataclasses.replace(decision, note="; ".join([decision.note, *notes]).strip("; "))
    return dataclasses.replace(
        entry, verdict=decision, plain=plain, graph=graph, limited_by=limited_by(plain, graph),
        unfused=latency_of(samples["unfused"]), fused=latency_of(samples["fused"]),
        unfused_graph=latency_of(samples["unfused_graph"]) if "unfused_graph" in samples else None,
        fused_graph=latency_of(samples["fused_graph"]) if "fused_graph" in samples else None,
        launches_unfused=lu["kernel_launches"], launches_fused=lf["kernel_launches"],
        launches_kind=str(lu["kernel_launches_kind"] or ""),
        max_abs=p_f["max_abs"], rel_err=p_f["rel_l2"], rel_err_unfused=p_u["rel_l2"])
