"""When does a fusion stop paying? One chain's micro-benchmark re-run over batch sizes and dtypes.

The seed's warning, 不是所有算子都适合融合: at small shapes a chain's time is
mostly launch and host overhead, which fusion cuts; at large shapes its kernels
are bound by memory or arithmetic, and a fused kernel under register pressure
can lose. ``sweep_chain`` measures where the speed-up goes as the shape grows:
for each batch size the model is loaded again at that batch
(``fusion_engine.analyze``: the chain has the same id, fx node names do not
depend on the batch), the chain is cut out alone (``rewrite.chain_module``),
prepared as the runner prepares it (``measure.prepare_graph``) in each dtype,
and its unfused and fused forms are timed in paired, alternated rounds
(``measure.time_paired``, rounds added while the verdict is open), as a run
times a chain. Each point records the speed-up (unfused median / fused
median), the times with their spread, the chain's bytes by the byte model, and
the verdict of the same paired test as a run's (``explorer.stats.compare``:
faster, slower or no significant difference, with its interval and whether the
rounds decided it): a point is "slower" only when the test says so, and
"undecided" (``SweepPoint.undecided``) when the rounds ran out first. Medians
alone decide nothing: one stalled round of a shared machine moved them enough
for two sweeps of one chain to disagree.
"""

from __future__ import annotations

import dataclasses
import threading
from typing import Any, Callable, Sequence

import torch

from explorer import stats
from explorer.fusion_engine import analyze
from explorer.report import SAME, Verdict
from explorer.fusions import rewrite
from explorer.runtime import measure as m
from explorer.runtime.traffic import chain_bytes


@dataclasses.dataclass(frozen=True)
class SweepPoint:
    """One (batch, dtype) of a chain's sweep; ``error`` is set (and times are None) when it could not run."""

    batch: int
    dtype: str
    unfused_ms: float | None = None
    fused_ms: float | None = None
    unfused_p20: float | None = None
    unfused_p80: float | None = None
    fused_p20: float | None = None
    fused_p80: float | None = None
    speedup: float | None = None
    bytes_unfused: int | None = None
    bytes_fused: int | None = None
    error: str | None = None
    verdict: str | None = None   # the paired test's label (explorer.stats.compare; a run report's, explorer.sweeps.chain)
    decided: bool | None = None  # whether the rounds decided that verdict (False: "undecided")
    ci_low: float | None = None  # the verdict's 95% interval of the fused/unfused time ratio
    ci_high: float | None = None
    rounds: int | None = None    # the paired rounds the verdict rests on

    @property
    def undecided(self) -> bool:
        """Timed, but the paired test could not decide: neither "faster" nor "slower" nor "no difference"."""
        return self.verdict == SAME and self.decided is False

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "undecided": self.undecided}


def verdict_fields(verdict: Verdict) -> dict[str, Any]:
    """A verdict's fields as a sweep point keeps them."""
    return {"verdict": verdict.label, "decided": verdict.decided, "ci_low": verdict.ci_low,
            "ci_high": verdict.ci_high, "rounds": verdict.n}


def time_chain(analysis: Any, chain_id: str, device: str, dtype_name: str, timing: m.TimingPlan,
               kernel: str = "auto") -> SweepPoint:
    """One point: the chain of ``analysis`` alone, unfused against fused, in ``dtype_name`` on ``device``."""
    model, graph, detection = analysis
    batch = int(model.batch or 1)
    try:
        chain = detection.chain(chain_id)
    except KeyError:
        return SweepPoint(batch, dtype_name, error=f"chain {chain_id} is not detected at batch {batch}")
    dtype = m.torch_dtype(dtype_name)
    before, after = chain_bytes(graph, chain, dtype)
    try:
        unfused, fused, inputs = rewrite.chain_module(model.gm, detection, chain_id, m.run_target(device, dtype),
                                                      kernel=kernel)
        u = m.prepare_graph(unfused, device, dtype)
        f = m.prepare_graph(fused, device, dtype)
        x = m.prepare_inputs(inputs, device, dtype)
        samples = m.time_paired({"unfused": lambda: u(*x), "fused": lambda: f(*x)}, (("unfused", "fused"),),
                                device, timing)
    except Exception as exc:  # one point failing (out of memory, a dtype the device lacks) keeps the others
        if device.startswith("cuda"):
            torch.cuda.empty_cache()
        return SweepPoint(batch, dtype_name, bytes_unfused=before, bytes_fused=after, error=m._one_line(exc))
    lu, lf = m.summarize(samples["unfused"]), m.summarize(samples["fused"])
    verdict = stats.compare(samples["unfused"], samples["fused"], basis="synchronised calls")
    return SweepPoint(batch, dtype_name, lu["median"], lf["median"], lu["p20"], lu["p80"], lf["p20"], lf["p80"],
                      m.speedup(lu["median"], lf["median"]), before, after, **verdict_fields(verdict))


def sweep_chain(source: str, chain_id: str, batches: Sequence[int], dtypes: Sequence[str], device: str = "cpu",
                seq_len: int | None = None, timing: m.TimingPlan | None = None, kernel: str = "auto",
                on_step: Callable[[float, str], None] | None = None,
                cancel: threading.Event | None = None) -> list[SweepPoint]:
    """The chain's speed-up at every (batch, dtype): points in batch order, then dtype order.

    ``source`` is what ``analyze`` loads (a zoo name or a path), ``seq_len`` its
    sequence length. ``on_step(fraction, message)`` reports progress; setting
    ``cancel`` stops after the point in progress (the points so far are returned).
    """
    device = m.resolve_device(device)
    emit = on_step or (lambda f, s: None)
    timing = timing or m.TimingPlan.for_device(device, short=True)
    points: list[SweepPoint] = []
    todo = len(batches) * len(dtypes)
    for batch in sorted({int(b) for b in batches}):
        if cancel is not None and cancel.is_set():
            break
        emit(len(points) / max(todo, 1), f"loading the model at batch {batch}")
        try:
            analysis = analyze(source, batch=batch, seq_len=seq_len)
        except Exception as exc:
            points += [SweepPoint(batch, d, error=m._one_line(exc)) for d in dtypes]
            continue
        for dtype_name in dtypes:
            if cancel is not None and cancel.is_set():
                break
            emit(len(points) / max(todo, 1), f"timing batch {batch}, {dtype_name}")
            points.append(time_chain(analysis, chain_id, device, dtype_name, timing, kernel))
    emit(1.0, f"{len(points)} points")
    return points
