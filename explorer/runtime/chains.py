"""Every accepted chain timed alone, unfused against fused, on its real shapes.

Each chain becomes two small graphs (``explorer.fusions.rewrite.chain_module``):
the chain's own ops, and the same with the chain applied. They are prepared as
the whole model is (``prepare_graph``: same device, dtype and lean calls), run
on seeded inputs with the model's strides, checked against a float64
reference, and timed alternated; on CUDA also as CUDA-graph replays, which
take the host out of the comparison.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import torch

from explorer.fusions import rewrite
from explorer.runtime import measure as m
from explorer.runtime.settings import RunSettings
from explorer.runtime.variants import make_variant


def chain_entry(chain: Any, applied: Any, graph: Any, dtype: Any) -> dict:

    b_unfused = m.graph_bytes(graph, dtype, chain.compute_nodes)
    return {
        "id": chain.id, "pattern": chain.pattern,
        "implementation": getattr(applied, "implementation", "") if applied else "",
        "kernel": getattr(applied, "kernel", "auto") if applied else "auto",
        "status": applied.status if applied else "not applied",
        "reason": getattr(applied, "reason", "") if applied else "apply_plan did not report this chain",
        "unfused_ms": None, "fused_ms": None, "unfused_latency_ms": None, "fused_latency_ms": None,
        "speedup": None,
        "bytes_unfused": b_unfused, "bytes_fused": int(b_unfused - chain.bytes_saved * m.element_ratio(dtype)),
        "launches_unfused": None, "launches_fused": None, "launches_kind": None,
        "graph_launches_saved": chain.launches_saved,
        "max_abs": None, "rel_err": None, "rel_err_unfused": None, "slower": None, "verdict": None,
    }


def chain_benchmarks(model: Any, graph: Any, detection: Any, chains: list, applied: dict, device: str,
                     dtype: Any, settings: RunSettings, emit: Callable[[float, str], None],
                     cuda_graphs: bool = False) -> list[dict]:
    """Time each accepted chain alone, unfused vs fused, on its real shapes.

    Each timed call is synchronised, so ``unfused_ms``/``fused_ms`` include the
    host's launch overhead (Python, Triton's launcher), which a chain of tiny
    kernels pays in an eager model. On CUDA the chain is also captured as a
    CUDA graph and its replays timed (``*_graph_ms``: device time with launch
    overhead removed), alternated with the plain calls. ``slower`` uses the
    plain calls, or the graph replays when the plan uses CUDA graphs
    (``slower_basis`` says which): true when the fused chain's 20th percentile
    is above the unfused chain's 80th, i.e. slower beyond the measured spread.
    ``verdict`` is faster / slower / within noise. A failing chain is reported
    with its reason, never hidden.
    """

    timing = m.TimingPlan.for_device(device, 3 if settings.warmup is None else min(settings.warmup, 3),
                                     settings.reps, short=True)
    if settings.reps is not None:
        timing = dataclasses.replace(timing, reps=max(3, min(settings.reps, 20)))
    out = []
    n = len(chains)
    for i, chain in enumerate(chains):
        emit(i / max(n, 1), f"timing chain {i + 1}/{n}")
        entry = chain_entry(chain, applied.get(chain.id), graph, dtype)
        out.append(entry)
        if entry["status"] != "fused":
            continue
        try:
            unfused_c, fused_c, c_inputs = rewrite.chain_module(model.gm, detection, chain.id, device,
                                                                kernel=entry["kernel"])
            u = m.prepare_graph(unfused_c, device, dtype)
            f = m.prepare_graph(fused_c, device, dtype)
            x = m.prepare_inputs(c_inputs, device, dtype)
            ref_where = device if device.startswith("cuda") else "cpu"
            ref_gm = m.prepare_graph(unfused_c, ref_where, torch.float64)
            with torch.inference_mode():
                ref = ref_gm(*m.prepare_inputs(c_inputs, ref_where, torch.float64))
                out_u, out_f = u(*x), f(*x)
            p_u, p_f = m.precision(out_u, ref, False), m.precision(out_f, ref, False)
            fns = {"unfused": lambda: u(*x), "fused": lambda: f(*x)}
            graph_notes = []
            if device.startswith("cuda"):
                for name, mod in (("unfused", u), ("fused", f)):
                    v = make_variant(name, mod, x, device, cuda_graphs=True)
                    if v.cuda_graph:
                        fns[name + "_graph"] = v.timed
                    else:
                        graph_notes.append(f"{name}: {v.note}")
            lat = m.time_alternated(fns, device, timing)
            lu, lf = m.count_launches(lambda: u(*x), device), m.count_launches(lambda: f(*x), device)
        except Exception as exc:
            if device.startswith("cuda"):
                try:
                    torch.cuda.synchronize()
                except Exception:
                    pass
            entry.update(status="failed", reason=f"chain benchmark failed: {m._one_line(exc)}")
            continue
        ul, fl = lat["unfused"], lat["fused"]
        ug, fg = lat.get("unfused_graph"), lat.get("fused_graph")
        basis = "cuda graph replays" if (cuda_graphs and ug and fg) else "synchronised calls"
        bu, bf = (ug, fg) if basis == "cuda graph replays" else (ul, fl)
        slower = bf["p20"] > bu["p80"]
        faster = bf["p80"] < bu["p20"]
        if ug and fg:
            entry.update(unfused_graph_ms=ug["median"], fused_graph_ms=fg["median"],
                         graph_speedup=m.speedup(ug["median"], fg["median"]),
                         slower_in_graph=bool(fg["p20"] > ug["p80"]))
        if graph_notes:
            entry["graph_note"] = "; ".join(graph_notes)
        entry.update(
            unfused_ms=ul["median"], fused_ms=fl["median"], unfused_latency_ms=ul, fused_latency_ms=fl,
            speedup=m.speedup(ul["median"], fl["median"]), slower_basis=basis,
            launches_unfused=lu["kernel_launches"], launches_fused=lf["kernel_launches"],
            launches_kind=lu["kernel_launches_kind"],
            max_abs=p_f["max_abs"], rel_err=p_f["rel_l2"], rel_err_unfused=p_u["rel_l2"],
            slower=bool(slower), verdict="slower" if slower else ("faster" if faster else "within noise"),
        )
    emit(1.0, f"timed {n} chains")
    return out
