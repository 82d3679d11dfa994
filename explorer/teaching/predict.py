"""Predict each chain's gain before running it, then say why a measurement is far from the prediction.

The model (one roofline of the device, ``explorer.runtime.ceilings``)::

    device time of a kernel   t_dev  = max(FLOPs / peak FLOP/s, bytes / bandwidth)
    host time of a chain      t_host = launches × launch cost (host µs per kernel call, measured)
    time of a chain           t      = max(t_host, t_dev)      (the host issues while the device runs)

    unfused: every op is its own kernel: t_dev = Σ_ops max(FLOPs_i / P, bytes_i / B), launches = Σ launches_i
    fused:   one kernel:                 t_dev = max(Σ FLOPs / P, (Σ bytes − bytes saved) / B), 1 launch

    predicted gain = t_unfused / t_fused

FLOPs and bytes come from the graph byte model (``explorer.graph.build``,
scaled to the dtype by ``measure.graph_bytes``; ``Chain.bytes_saved`` is what
fusion removes). For fixed FLOPs and launches the predicted gain never falls
as the bytes saved grow. The arithmetic intensity of a chain is its FLOPs per
byte moved; at or above the ridge point (peak FLOP/s / bandwidth) it is
compute-bound, and saving bytes buys little.

A measured gain more than ``FAR`` times away from the prediction (either way)
is the interesting case; ``why_far`` names the likeliest reason, in this order:

- ``slower_kernel``: the fused chain is slower on the device itself (slower
  even as a CUDA-graph replay, or below 1 with no host in the way): register
  pressure or a worse algorithm, which no byte count sees;
- ``host_bound``: the host, not the device, set the time: the plain calls and
  the CUDA-graph replays disagree by more than ``FAR``, or the model's host time
  dominates (then the real per-call cost differs from the launch constant);
- ``compute_bound``: the fused chain's intensity is at or above the ridge: its
  time is arithmetic, and the bytes saved were not on the critical path;
- ``l2_resident``: every intermediate fusion removes fits in the L2 cache: the
  unfused ops read it back from L2, not from device memory, so little DRAM
  traffic was really saved;
- ``unexplained``: none of the above (e.g. the unfused library kernels run far
  below their roofline).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Iterable

from explorer.runtime import measure as m
from explorer.runtime.ceilings import Ceilings
from explorer.teaching.readers import MeasuredChain

FAR = 1.5
REASONS = ("slower_kernel", "host_bound", "compute_bound", "l2_resident", "unexplained")


@dataclasses.dataclass(frozen=True)
class ChainPrediction:
    """What the model predicts for one chain (times in µs; None where a ceiling is unknown)."""

    id: str
    pattern: str
    title: str
    flops: float
    bytes_unfused: int
    bytes_fused: int
    launches_unfused: int
    launches_fused: int
    largest_intermediate: int
    intensity_unfused: float | None
    intensity_fused: float | None
    device_unfused_us: float | None
    device_fused_us: float | None
    host_unfused_us: float | None
    host_fused_us: float | None
    unfused_us: float | None
    fused_us: float | None
    gain: float | None
    bound: str | None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def roofline_us(flops: float, nbytes: float, ceilings: Ceilings, dtype: str) -> float | None:
    """max(FLOPs / peak, bytes / bandwidth) in µs, or None when a ceiling is unknown."""
    peak = ceilings.peak_flops(dtype)
    if not peak or not ceilings.bandwidth:
        return None
    return max(flops / peak, nbytes / ceilings.bandwidth) * 1e6


def _written(graph: Any, node: str, dtype: Any) -> int:
    attrs = graph.nodes[node]
    floating = any(str(d).startswith(("float", "bfloat", "half", "double")) for d in attrs.get("dtypes") or [])
    return int(round(attrs["bytes_written"] * (m.element_ratio(dtype) if floating or not attrs.get("dtypes") else 1)))


def predict_from_counts(chain_id: str, pattern: str, title: str, op_counts: list[tuple[float, float, int]],
                        bytes_saved: float, largest_intermediate: int, ceilings: Ceilings, dtype: str
                        ) -> ChainPrediction:
    """The prediction from plain counts: ``op_counts`` is [(FLOPs, bytes, launches)] per op of the chain,
    ``bytes_saved`` what fusion removes (in ``dtype``). A pure function (the tests vary the bytes saved)."""
    flops = float(sum(f for f, _, _ in op_counts))
    before = float(sum(b for _, b, _ in op_counts))
    after = max(before - bytes_saved, 0.0)
    launches = int(sum(n for _, _, n in op_counts))
    dev_before = None
    if ceilings.known(dtype):
        dev_before = sum(roofline_us(f, b, ceilings, dtype) for f, b, _ in op_counts)
    dev_after = roofline_us(flops, after, ceilings, dtype)
    launch_us = ceilings.launch_us
    host_before = launches * launch_us if launch_us is not None else None
    host_after = 1 * launch_us if launch_us is not None else None

    def total(dev: float | None, host: float | None) -> float | None:
        parts = [p for p in (dev, host) if p is not None]
        return max(parts) if parts else None

    t_before, t_after = total(dev_before, host_before), total(dev_after, host_after)
    gain = t_before / t_after if t_before and t_after else None
    ridge = ceilings.ridge(dtype)
    intensity_after = flops / after if after else None
    bound = None
    if ridge is not None and intensity_after is not None:
        bound = "compute" if intensity_after >= ridge else "memory"
    return ChainPrediction(
        id=chain_id, pattern=pattern, title=title, flops=flops, bytes_unfused=int(round(before)),
        bytes_fused=int(round(after)), launches_unfused=launches, launches_fused=1,
        largest_intermediate=int(largest_intermediate),
        intensity_unfused=flops / before if before else None, intensity_fused=intensity_after,
        device_unfused_us=dev_before, device_fused_us=dev_after, host_unfused_us=host_before,
        host_fused_us=host_after, unfused_us=t_before, fused_us=t_after, gain=gain, bound=bound)


def predict_chain(graph: Any, chain: Any, dtype_name: str, ceilings: Ceilings) -> ChainPrediction:
    """The prediction for one ``Chain`` of ``graph`` (the analysis graph) in ``dtype_name``."""
    dtype = m.torch_dtype(dtype_name)
    counts = [(float(graph.nodes[n]["flops"]), float(m.graph_bytes(graph, dtype, [n])),
               int(graph.nodes[n]["launches"])) for n in chain.compute_nodes]
    inner = [_written(graph, n, dtype) for n in chain.compute_nodes[:-1]] if not chain.siblings else [0]
    return predict_from_counts(chain.id, chain.pattern, chain.title, counts,
                               chain.bytes_saved * m.element_ratio(dtype), max(inner or [0]), ceilings, dtype_name)


def predict_chains(graph: Any, detection: Any, chain_ids: Iterable[str], dtype_name: str,
                   ceilings: Ceilings) -> list[ChainPrediction]:
    """``predict_chain`` for every chain of ``detection`` whose id is in ``chain_ids``, in graph order."""
    ids = set(chain_ids)
    return [predict_chain(graph, c, dtype_name, ceilings) for c in detection.chains if c.id in ids]


# ------------------------------------------------------------------ far from the prediction: why

def why_far(pred: ChainPrediction, measured: MeasuredChain, ceilings: Ceilings, dtype: str) -> str | None:
    """None when the measured gain is within ``FAR`` of the predicted one, else one of ``REASONS``."""
    if pred.gain is None or measured.speedup is None:
        return None
    ratio = measured.speedup / pred.gain
    if 1 / FAR <= ratio <= FAR:
        return None
    graph = measured.graph_speedup
    if ratio < 1 / FAR:
        device_slower = (graph < 1) if graph is not None else (measured.speedup < 1 and not _host_dominant(pred))
        if device_slower:
            return "slower_kernel"
    if graph is not None and not (1 / FAR <= measured.speedup / graph <= FAR):
        return "host_bound"
    if _host_dominant(pred):
        return "host_bound"
    if ratio > FAR:
        return "unexplained"
    ridge = ceilings.ridge(dtype)
    if ridge is not None and pred.intensity_fused is not None and pred.intensity_fused >= ridge:
        return "compute_bound"
    if ceilings.l2_bytes and 0 < pred.largest_intermediate <= ceilings.l2_bytes:
        return "l2_resident"
    return "unexplained"


def _host_dominant(pred: ChainPrediction) -> bool:
    """The model expects the unfused chain's time to be set by the host (launches), not the device."""
    return (pred.host_unfused_us is not None and pred.device_unfused_us is not None
            and pred.host_unfused_us >= pred.device_unfused_us)


def compare(predictions: Iterable[ChainPrediction], measured: dict[str, MeasuredChain], ceilings: Ceilings,
            dtype: str) -> list[dict[str, Any]]:
    """Rows of predicted against measured gain, one per predicted chain that was measured; ``far`` is the
    factor between them (≥ 1, either way) and ``why`` ``why_far``'s reason (None when close)."""
    rows = []
    for p in predictions:
        got = measured.get(p.id)
        if got is None:
            continue
        far = None
        if p.gain and got.speedup:
            far = math.exp(abs(math.log(got.speedup / p.gain)))
        rows.append({"id": p.id, "pattern": p.pattern, "title": p.title, "predicted": p.gain,
                     "measured": got.speedup, "measured_graph": got.graph_speedup, "far": far,
                     "why": why_far(p, got, ceilings, dtype), "bound": p.bound,
                     "intensity": p.intensity_fused})
    return rows
