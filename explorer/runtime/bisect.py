"""Precision bisect: which fused chain makes the fused model drift from the float64 reference?

Fusion reorders arithmetic (数值精度影响): a folded BatchNorm, a fused epilogue
or a softmax with fp32 statistics rounds differently from the ops it replaces.
When the fused model is further from the reference than the unfused one, this
module finds the chain responsible:

- **one at a time** (``mode="one_at_a_time"``): the model with only chain *c*
  fused, for every accepted chain; *c*'s contribution is its output error
  minus the unfused model's, and the chains are ranked by it (n fused models);
- **bisect** (``mode="bisect"``): fuse half of the accepted set, then the other
  half; keep the half whose error exceeds the unfused model's more, and halve
  again until one chain is left (about 2·log2(n) fused models). Errors of
  chains need not add up, so bisect finds the dominant culprit, and one at a
  time ranks them all.

The error is ``rel_l2`` = ||out − ref|| / ||ref|| of the model's output against
the unfused graph in float64 (``measure.precision``), every graph prepared as
the runner prepares it (``measure.prepare_graph``: device, dtype, lean calls).
"""

from __future__ import annotations

import dataclasses
import threading
from typing import Any, Callable, Sequence

import torch
import torch.fx

from explorer.fusion_engine import Analysis
from explorer.messages import NOTES, TASKS
from explorer.fusions.plan import plan_for_chains
from explorer.fusions.rewrite import apply_plan
from explorer.runtime import measure as m
from explorer.vocab import Target

MODES = ("one_at_a_time", "bisect", "both")

#: (chain ids to fuse) -> the fused graph (the default applies a plan that accepts exactly those chains).
FuseFn = Callable[[Sequence[str]], torch.fx.GraphModule]


@dataclasses.dataclass(frozen=True)
class ChainError:
    """One chain fused alone: its model's output error and its contribution (error − the unfused model's)."""

    id: str
    pattern: str
    title: str
    rel_l2: float | None
    max_abs: float | None
    contribution: float | None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class BisectResult:
    """What the bisect found; ``ranked`` (one at a time) is sorted by contribution, largest first;
    ``steps`` is the bisect's path ({"a": ids, "b": ids, "error_a", "error_b", "kept": "a"|"b"}).
    ``drifts``: the fused model's error is more than twice the unfused model's (the
    runner's rule); ``culprit`` is the chain found, None when nothing drifts."""

    device: str
    dtype: str
    reference: str
    unfused_rel_l2: float | None
    fused_rel_l2: float | None
    drifts: bool
    ranked: tuple[ChainError, ...] = ()
    steps: tuple[dict, ...] = ()
    culprit: str | None = None
    fused_models: int = 0
    cancelled: bool = False

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["ranked"] = [c.to_dict() for c in self.ranked]
        d["steps"] = list(self.steps)
        return d


def default_fuse(analysis: Analysis, kernels: dict[str, str] | None = None, device: Target | str = "cpu") -> FuseFn:
    """A ``FuseFn`` that applies a plan accepting exactly the given chains (with the user's kernel choices), for
    ``device`` (a ``Target``: its kernels chosen for the run's dtype; a device name: for fp32)."""
    model, _graph, detection = analysis

    def fuse(ids: Sequence[str]) -> torch.fx.GraphModule:
        keep = set(ids)
        plan = plan_for_chains(detection, ids, kernels={k: v for k, v in (kernels or {}).items() if k in keep})
        return apply_plan(model.gm, detection, plan, device).gm

    return fuse


def precision_bisect(analysis: Analysis, chain_ids: Sequence[str], device: str = "cpu", dtype: str = "fp32",
                     mode: str = "both", fuse: FuseFn | None = None,
                     on_step: Callable[[float, str], None] | None = None,
                     cancel: threading.Event | None = None) -> BisectResult:
    """Rank the accepted chains ``chain_ids`` of ``analysis`` by how much each adds to the output error.

    ``fuse`` builds the fused graph of a subset (``default_fuse`` unless given:
    a test may wrap it to inflate one chain's error). ``mode`` is one of
    ``MODES``. ``cancel`` stops between fused models (``cancelled`` is then True).
    """
    if mode not in MODES:
        raise ValueError(f"unknown mode '{mode}': choose one of {', '.join(MODES)}")
    device = m.resolve_device(device)
    emit = on_step or (lambda f, s: None)
    model, _graph, detection = analysis
    ids = [c.id for c in detection.accepted_chains(chain_ids)]
    torch_dtype = m.torch_dtype(dtype)
    fuse = fuse or default_fuse(analysis, device=m.run_target(device, torch_dtype))
    classification = model.task == "classification"
    where = device if device.startswith("cuda") else "cpu"
    emit(0.02, "float64 reference")
    ref_gm = m.prepare_graph(model.gm, where, torch.float64)
    with torch.inference_mode():
        ref = [t.detach().to("cpu") for t in m.flat_outputs(ref_gm(*m.prepare_inputs(model.example_inputs, where,
                                                                                       torch.float64)))]
    del ref_gm
    inputs = m.prepare_inputs(model.example_inputs, device, torch_dtype)
    built = 0

    def error(gm: torch.fx.GraphModule) -> dict[str, Any]:
        prepared = m.prepare_graph(gm, device, torch_dtype)
        with torch.inference_mode():
            return m.precision(prepared(*inputs), ref, classification)

    def subset_error(subset: Sequence[str]) -> dict[str, Any]:
        nonlocal built
        built += 1
        return error(fuse(list(subset)))

    base = error(model.gm)["rel_l2"]
    total_steps = (len(ids) if mode != "bisect" else 0) + (2 * max(len(ids), 1).bit_length() if mode != "one_at_a_time" else 0) + 1
    emit(0.05, "the model with every accepted chain fused")
    fused_all = subset_error(ids)["rel_l2"]
    cancelled = False

    ranked: list[ChainError] = []
    if mode in ("one_at_a_time", "both"):
        for i, cid in enumerate(ids):
            if cancel is not None and cancel.is_set():
                cancelled = True
                break
            emit(0.05 + 0.9 * built / total_steps, TASKS("only_fused", x=cid, n=i + 1, n2=len(ids)))
            e = subset_error([cid])
            chain = detection.chain(cid)
            contribution = (e["rel_l2"] - base) if e["rel_l2"] is not None and base is not None else None
            ranked.append(ChainError(cid, chain.pattern, chain.title, e["rel_l2"], e["max_abs"], contribution))
        ranked.sort(key=lambda c: -(c.contribution if c.contribution is not None else float("-inf")))

    steps: list[dict] = []
    culprit = None
    if mode in ("bisect", "both") and not cancelled and ids:
        current = list(ids)
        while len(current) > 1:
            if cancel is not None and cancel.is_set():
                cancelled = True
                break
            half = len(current) // 2
            a, b = current[:half], current[half:]
            emit(0.05 + 0.9 * built / total_steps, TASKS("bisect_chains", n=len(a), n2=len(b)))
            ea, eb = subset_error(a)["rel_l2"], subset_error(b)["rel_l2"]
            keep_a = (ea if ea is not None else -1.0) >= (eb if eb is not None else -1.0)
            steps.append({"a": a, "b": b, "error_a": ea, "error_b": eb, "kept": "a" if keep_a else "b"})
            current = a if keep_a else b
        if not cancelled:
            culprit = current[0]
    if culprit is None and ranked and not cancelled:
        culprit = ranked[0].id
    drifts = bool(fused_all is not None and base is not None and fused_all > 2 * base + 1e-12)
    if not drifts:
        culprit = None  # nothing to blame: the ranking still says what each chain adds
    emit(1.0, "done")
    return BisectResult(device=device, dtype=dtype, reference=NOTES("unfused_graph_float64", x=where),
                        unfused_rel_l2=base, fused_rel_l2=fused_all, drifts=drifts, ranked=tuple(ranked),
                        steps=tuple(steps), culprit=culprit, fused_models=built, cancelled=cancelled)
