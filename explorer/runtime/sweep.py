"""When does a fusion stop paying? One point of a chain's sweep over batch sizes and dtypes, as the Learn page shows it.

The seed's warning, 不是所有算子都适合融合: at small shapes a chain's time is
mostly launch and host overhead, which fusion cuts; at large shapes its kernels
are bound by memory or arithmetic, and a fused kernel under register pressure
can lose. The sweep that measures it is a sweep like any other
(``explorer.sweeps.chain``: the model at each batch size and dtype with that
chain accepted alone, each point one run of ``gpu_runner.run`` in the sweep's
workers, in the Learn page's task child, ``runtime.teach_tasks``); there is no
second measurement path. ``SweepPoint`` is what one point's report says of the
chain: its unfused and fused medians with their spread, the speed-up (the
verdict's: ``ChainResult.speedup``, the Hodges-Lehmann estimate of the paired
ratios, not unfused median / fused median), the chain's bytes by the byte model, and the verdict of
the report's paired test (``explorer.stats.compare``: faster, slower or no
significant difference, with its interval and whether the rounds decided it):
a point is "slower" only when the test says so, and "undecided"
(``SweepPoint.undecided``) when the rounds ran out first. Medians alone decide
nothing: one stalled round of a shared machine moved them enough for two
sweeps of one chain to disagree.

Pure of torch: the caller (the app, the task child) reads points, never times them.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from explorer.report import SAME, Verdict


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
    ci_low: float | None = None  # the verdict's 95% interval of the fused/unfused time ratio (the same test's)
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
