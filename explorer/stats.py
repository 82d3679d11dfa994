"""Is the fused form faster, slower, or not significantly different? A test over paired rounds.

The runner times a baseline (unfused) and a candidate (fused) alternated, round
after round (``explorer.runtime.measure``), so round ``i`` gives a pair
``(b_i, c_i)`` measured under the same conditions (clock, temperature, what
else the machine was doing). ``compare(b, c)`` decides on the paired log ratios
``d_i = ln(c_i / b_i)``:

- **test**: the Wilcoxon signed-rank test of "median d = 0" (two-sided,
  ``scipy.stats.wilcoxon``): distribution-free, robust to the long right tail
  of latencies, and it uses the pairing, which removes drift between rounds;
- **estimate and interval**: the ratio ``exp(median d)`` with a 95% bootstrap
  confidence interval of that median (``scipy.stats.bootstrap``, percentile
  method, seeded: the same samples give the same interval), widened where needed
  to hold the estimate. This is THE speed-up of the project (``1 / ratio``,
  ``explorer.report.Verdict.speedup``): every page, the command line and the
  report show it with this interval, never the ratio of the two marginal medians,
  which can lie far outside it (rounds slowed by a busy host on both sides of a
  pair move both medians, not the paired ratio);
- **minimum effect**: a difference under ``MIN_EFFECT`` (3%) is not called
  faster or slower even when it is significant: it is too small to act on,
  and smaller than what typically separates two runs of the same code;
- **power**: ``rounds_needed`` is how many pairs the observed spread needs to
  detect a ``MIN_EFFECT`` difference at 80% power (normal approximation for a
  one-sample test on ``d``, divided by the Wilcoxon test's worst-case
  asymptotic relative efficiency 0.864). ``needs_more`` tells a timing loop to
  take more rounds while the verdict is open and fewer than that were taken.

Labels (``explorer.report.VERDICTS``): ``FASTER`` / ``SLOWER`` when the test
rejects at ``ALPHA``, the interval lies on one side of 1 and the estimate is
beyond the minimum effect; otherwise ``SAME`` ("no significant difference"),
with ``decided`` True when the interval lies inside the minimum-effect band or
enough rounds were taken, and False when the rounds ran out first.

Layer 0: no torch (numpy and scipy only).
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np
from scipy import stats as sps

from explorer.report import FASTER, SAME, SLOWER, Verdict

MIN_EFFECT = 0.03
ALPHA = 0.05
POWER = 0.80
MIN_ROUNDS = 8            # below this the signed-rank test can barely reject anything
WILCOXON_ARE = 0.864      # worst-case asymptotic relative efficiency against the t-test
BOOTSTRAP_RESAMPLES = 1999
METHOD = ("Wilcoxon signed-rank test on paired log ratios (two-sided); 95% bootstrap CI of the median "
          "ratio; minimum effect {effect:.0%}")


def log_ratios(baseline_ms: Sequence[float], candidate_ms: Sequence[float]) -> np.ndarray:
    """``ln(candidate_i / baseline_i)`` for each round with two positive times (pairs by index)."""
    n = min(len(baseline_ms), len(candidate_ms))
    b = np.asarray(baseline_ms[:n], dtype=float)
    c = np.asarray(candidate_ms[:n], dtype=float)
    keep = (b > 0) & (c > 0) & np.isfinite(b) & np.isfinite(c)
    return np.log(c[keep] / b[keep])


def robust_sd(d: np.ndarray) -> float:
    """Standard deviation estimated from the median absolute deviation (robust to outliers)."""
    if len(d) < 2:
        return float("inf")
    return float(1.4826 * np.median(np.abs(d - np.median(d))))


def rounds_needed(d: np.ndarray, min_effect: float = MIN_EFFECT, alpha: float = ALPHA,
                  power: float = POWER) -> int:
    """Pairs needed to detect a ``min_effect`` difference at ``power`` given the spread of ``d``."""
    sd = robust_sd(d)
    if not math.isfinite(sd):
        return MIN_ROUNDS
    z = sps.norm.ppf(1 - alpha / 2) + sps.norm.ppf(power)
    n = (z * sd / math.log1p(min_effect)) ** 2 / WILCOXON_ARE
    return max(MIN_ROUNDS, int(math.ceil(n)))


def compare(baseline_ms: Sequence[float], candidate_ms: Sequence[float], min_effect: float = MIN_EFFECT,
            alpha: float = ALPHA, basis: str = "", seed: int = 0) -> Verdict:
    """The verdict of ``candidate`` against ``baseline`` from paired per-round times (module docstring)."""
    d = log_ratios(baseline_ms, candidate_ms)
    n = int(len(d))
    method = METHOD.format(effect=min_effect)
    if n < MIN_ROUNDS:
        return Verdict(SAME, ratio=float(math.exp(np.median(d))) if n else None, n=n, min_effect=min_effect,
                       decided=False, basis=basis, method=method,
                       note=f"{n} paired rounds: at least {MIN_ROUNDS} are needed for a test")
    estimate = float(np.median(d))
    if np.all(d == d[0]):
        low = high = estimate
        p_value = 1.0 if estimate == 0 else 0.0
    else:
        p_value = float(sps.wilcoxon(d, zero_method="zsplit").pvalue)
        low, high = _median_interval(d, seed)
        # The percentile bootstrap of a median can miss the sample median itself by one order statistic
        # (few rounds, ties): the interval reported always holds its own estimate.
        low, high = min(low, estimate), max(high, estimate)
    band = math.log1p(min_effect)
    needed = rounds_needed(d, min_effect, alpha)
    significant = p_value < alpha
    if significant and low > 0 and estimate >= band:
        label, decided, note = SLOWER, True, ""
    elif significant and high < 0 and estimate <= -band:
        label, decided, note = FASTER, True, ""
    else:
        label = SAME
        inside = -band < low and high < band
        decided = inside or n >= needed
        if inside:
            note = f"95% CI inside ±{min_effect:.0%}"
        elif significant:
            note = f"significant but under the {min_effect:.0%} minimum effect"
        elif n >= needed:
            note = f"not significant with {n} rounds (enough for 80% power at {min_effect:.0%})"
        else:
            note = f"undecided: {n} rounds, {needed} needed for 80% power at {min_effect:.0%}"
    return Verdict(label, ratio=math.exp(estimate), ci_low=math.exp(low), ci_high=math.exp(high),
                   p_value=p_value, n=n, rounds_needed=needed, min_effect=min_effect, decided=decided,
                   basis=basis, method=method, note=note)


def _median_interval(d: np.ndarray, seed: int) -> tuple[float, float]:
    """95% percentile-bootstrap interval of the median of ``d`` (seeded; scipy's ``rng`` argument is
    ``random_state`` before scipy 1.15, which the GPU machine's image may have)."""
    kwargs = dict(confidence_level=0.95, n_resamples=BOOTSTRAP_RESAMPLES, method="percentile")
    try:
        result = sps.bootstrap((d,), np.median, rng=np.random.default_rng(seed), **kwargs)
    except TypeError:
        result = sps.bootstrap((d,), np.median, random_state=np.random.default_rng(seed), **kwargs)
    return float(result.confidence_interval.low), float(result.confidence_interval.high)


def needs_more(verdict: Verdict, max_rounds: int) -> int:
    """How many more rounds to take: 0 when decided or at ``max_rounds``, else up to ``rounds_needed``."""
    if verdict.decided or verdict.n >= max_rounds:
        return 0
    target = max(verdict.rounds_needed or MIN_ROUNDS, MIN_ROUNDS, verdict.n + 1)
    return max(0, min(target, max_rounds) - verdict.n)
