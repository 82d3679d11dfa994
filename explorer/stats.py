"""Is the fused form faster, slower, or not significantly different? One statistic over paired rounds.

The runner times a baseline (unfused) and a candidate (fused) alternated, round
after round (``explorer.runtime.measure``), so round ``i`` gives a pair
``(b_i, c_i)`` measured under the same conditions (clock, temperature, what
else the machine was doing). ``compare(b, c)`` decides on the paired log ratios
``d_i = ln(c_i / b_i)`` with ONE statistic, the Wilcoxon signed-rank test, which
gives all three figures, so that they cannot disagree:

- **estimate**: the Hodges-Lehmann estimator of the shift of ``d``: the median
  of the ``n(n+1)/2`` Walsh averages ``(d_i + d_j) / 2``, ``i <= j``, shown as
  the ratio ``exp(estimate)``. It is the shift at which the signed-rank test is
  least able to reject (the ratio at which half the Walsh averages lie on each
  side); it is not the median of the per-round ratios, nor the ratio of the two
  marginal medians (rounds slowed by a busy host on both sides of a pair move
  both medians, not the paired ratios);
- **interval**: the ``1 - alpha`` (95%) confidence interval obtained by
  inverting the same test: every shift ``s`` at which the test of ``d - s``
  does not reject at ``alpha``. Its ends are two order statistics of the Walsh
  averages (``walsh_order_statistic``: a selection over the sorted matrix of
  pair sums, memory O(n), so thousands of rounds are fine);
- **test**: the p-value of that test at shift 0 ("the candidate takes as long
  as the baseline"), two-sided. The statistic is ``W(s) = #{Walsh averages > s}
  + ½ #{Walsh averages = s}`` (the signed-rank sum of ``d - s``, a round equal
  to ``s`` counted half as scipy's ``zero_method="zsplit"`` does). Its null
  distribution: exact (all ``2^n`` sign patterns) for ``n <= EXACT_MAX_ROUNDS``
  without repeated values of ``d``; otherwise the normal approximation
  (no continuity correction) with the tie correction of the repeated values of
  ``d``. Those ties are the same at every shift, so the p-value and the interval
  use one null distribution and ``W`` falls as the shift grows.

Agreement and discreteness. With ``[low, high]`` the interval (log scale):
``low > 0`` or ``high < 0`` implies ``p < alpha``, and ``low < 0 < high``
implies ``p >= alpha``. The one case left is 0 exactly at an end of the
interval, which needs a Walsh average exactly 0 (a round with identical times,
or two rounds with exactly opposite ratios): there the test's own p-value
decides. The exact null is discrete, so the exact interval covers with
probability at least 95% (a little more for few rounds) and the smallest
p-value with ``n`` rounds is ``2 / 2^n``. Ties that exist at only one shift
(zeros, opposite ratios) are counted half but not variance-corrected there:
the test is slightly conservative at such a point (``tests/test_stats_hl.py``
pins all of this).

- **minimum effect**: a difference under ``MIN_EFFECT`` (3%) is not called
  faster or slower even when it is significant: it is too small to act on,
  and smaller than what typically separates two runs of the same code;
- **power**: ``rounds_needed`` is how many pairs the observed spread needs to
  detect a ``MIN_EFFECT`` difference at 80% power (normal approximation for a
  one-sample test on ``d``, divided by the Wilcoxon test's worst-case
  asymptotic relative efficiency 0.864). ``needs_more`` tells a timing loop to
  take more rounds while the verdict is open and fewer than that were taken.

This is THE speed-up of the project (``1 / ratio``, ``explorer.report.Verdict.speedup``):
every page, the command line and the report show it with this interval.

Labels (``explorer.report.VERDICTS``): ``FASTER`` / ``SLOWER`` when the test
rejects at ``ALPHA`` (then the interval lies on one side of 1, an end at most
touching it) and the estimate is beyond the minimum effect; otherwise ``SAME``
("no significant difference"), with ``decided`` True when the interval lies
inside the minimum-effect band or enough rounds were taken, and False when the
rounds ran out first ("undecided").

Layer 0: no torch (numpy and scipy only).
"""

from __future__ import annotations

import math
from functools import lru_cache
from typing import Sequence

import numpy as np
from scipy import stats as sps

from explorer.report import FASTER, SAME, SLOWER, Verdict

MIN_EFFECT = 0.03
ALPHA = 0.05
POWER = 0.80
MIN_ROUNDS = 8            # below this the signed-rank test can barely reject anything
WILCOXON_ARE = 0.864      # worst-case asymptotic relative efficiency against the t-test
EXACT_MAX_ROUNDS = 50     # exact null distribution up to here (as scipy's "auto"), normal approximation above
METHOD = ("Wilcoxon signed-rank test on paired log ratios (two-sided); Hodges-Lehmann estimate with the "
          "95% interval inverting that test; minimum effect {effect:.0%}")
_GATHER = 1 << 15         # candidates left when a selection gathers them and partitions


def log_ratios(baseline_ms: Sequence[float], candidate_ms: Sequence[float]) -> np.ndarray:
    """``ln(candidate_i / baseline_i)`` for each round with two positive times (pairs by index), computed as
    ``ln c_i - ln b_i``: swapping the two sides then negates every ratio exactly, and two rounds with opposite
    times give ratios that cancel exactly (``ln(c / b)`` rounds the quotient first: ``ln(1 / 0.75)`` and
    ``ln(0.75 / 1)`` differ in their last bit, a Walsh average of 5e-17 instead of 0 and a p-value that
    depended on which side was called the baseline)."""
    n = min(len(baseline_ms), len(candidate_ms))
    b = np.asarray(baseline_ms[:n], dtype=float)
    c = np.asarray(candidate_ms[:n], dtype=float)
    keep = (b > 0) & (c > 0) & np.isfinite(b) & np.isfinite(c)
    return np.log(c[keep]) - np.log(b[keep])


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


# --- Walsh averages without building them: the sorted matrix of pair sums d_i + d_j (i <= j) ----------------
# Row i of that matrix (j = i..n-1) rises with j when d is sorted, and a float sum is monotone in each term,
# so every count below is of the very floats ``d[i] + d[j]`` a brute-force list would hold.

def _row_cut(d: np.ndarray, value: float, inclusive: bool) -> np.ndarray:
    """For each row ``i`` of sorted ``d``: the first ``j >= i`` whose sum ``d[i] + d[j]`` is above ``value``
    (``inclusive``) or at least ``value`` (not inclusive); ``n`` where none is. A binary search in every row at once."""
    n = len(d)
    lo, hi = np.arange(n), np.full(n, n)
    while True:
        open_ = lo < hi
        if not open_.any():
            return lo
        mid = (lo + hi) // 2
        s = d + d[np.minimum(mid, n - 1)]
        left = (s <= value) if inclusive else (s < value)     # the cut lies right of mid
        lo = np.where(open_ & left, mid + 1, lo)
        hi = np.where(open_ & ~left, mid, hi)


def walsh_counts(d: np.ndarray, shift: float) -> tuple[int, int]:
    """How many Walsh averages of sorted ``d`` lie below ``shift``, and how many equal it."""
    rows = np.arange(len(d))
    below = int((_row_cut(d, 2 * shift, inclusive=False) - rows).sum())
    return below, int((_row_cut(d, 2 * shift, inclusive=True) - rows).sum()) - below


def walsh_order_statistic(d: np.ndarray, k: int) -> float:
    """The ``k``-th smallest (1-based) of the ``n(n+1)/2`` Walsh averages ``(d_i + d_j) / 2`` of sorted ``d``.

    A selection over the sorted matrix of pair sums: each row keeps a window of candidate columns; a pivot
    drawn among the candidates (seeded: the answer does not depend on it, only the work) is counted in every
    row by binary search and the windows shrink to the side that holds rank ``k``; when few are left they are
    gathered and partitioned. Memory O(n + 32768), time O(n log n) per step, O(log n) steps expected.
    """
    n = len(d)
    total = n * (n + 1) // 2
    if not 1 <= k <= total:
        raise ValueError(f"rank {k} outside 1..{total}")
    rows = np.arange(n)
    lo, hi = rows.copy(), np.full(n, n)
    rng = np.random.default_rng(k)
    while True:
        sizes = hi - lo
        left = int(sizes.sum())
        done_below = int((lo - rows).sum())                     # sums known to lie below rank k
        if left <= max(_GATHER, 2 * n):
            take = np.repeat(rows, sizes)
            cols = lo[take] + np.arange(left) - np.repeat(np.cumsum(sizes) - sizes, sizes)
            return float(np.partition(d[take] + d[cols], k - done_below - 1)[k - done_below - 1]) / 2
        pick = int(rng.integers(left))
        row = int(np.searchsorted(np.cumsum(sizes), pick, side="right"))
        pivot = d[row] + d[lo[row] + pick - int(np.cumsum(sizes)[row] - sizes[row])]
        under, upto = _row_cut(d, pivot, inclusive=False), _row_cut(d, pivot, inclusive=True)
        if k <= int((under - rows).sum()):
            hi = np.minimum(hi, under)
        elif k > int((upto - rows).sum()):
            lo = np.maximum(lo, upto)
        else:
            return float(pivot) / 2


# --- the signed-rank test's null distribution, and the test ---------------------------------------------------

@lru_cache(maxsize=64)
def _exact_lower_tail(n: int) -> np.ndarray:
    """``P(T <= w)`` for ``w = 0..n(n+1)/2``: ``T`` the signed-rank sum of ``n`` untied ranks under the null."""
    counts = np.zeros(n * (n + 1) // 2 + 1, dtype=np.int64)
    counts[0] = 1
    for r in range(1, n + 1):
        counts[r:] = counts[r:] + counts[:-r].copy()
    return np.cumsum(counts) / float(2 ** n)


class SignedRankNull:
    """The null distribution of ``W`` for ``n`` rounds whose values of ``d`` repeat as ``ties`` (group sizes).

    ``p(w)`` is the two-sided p-value of a statistic value ``w`` (a multiple of ½); ``accepted`` the integer
    range of ``w`` that the test does not reject at ``alpha``.
    """

    def __init__(self, n: int, ties: Sequence[int] = ()):
        self.n, self.total = n, n * (n + 1) // 2
        self.exact = n <= EXACT_MAX_ROUNDS and all(t == 1 for t in ties)
        self.mean = self.total / 2
        var = n * (n + 1) * (2 * n + 1) / 24 - sum(t ** 3 - t for t in ties) / 48
        self.sd = math.sqrt(max(var, 0.0))

    def p(self, w: float) -> float:
        """Two-sided p-value of ``W = w``."""
        if self.exact:
            tail = _exact_lower_tail(self.n)
            lower = tail[int(math.floor(w))] if w >= 0 else 0.0              # P(T <= w)
            top = self.total - int(math.ceil(w))                              # P(T >= w) = P(T <= total - ceil w)
            upper = tail[top] if top >= 0 else 0.0
            return float(min(1.0, 2 * min(lower, upper)))
        if self.sd == 0:
            return 1.0
        return float(min(1.0, 2 * sps.norm.sf(abs(w - self.mean) / self.sd)))

    def accepted(self, alpha: float) -> tuple[int, int]:
        """The integer values ``lo..hi`` of ``W`` at which the test does not reject (symmetric about the mean)."""
        if self.exact:
            ws = np.arange(self.total + 1)
            ok = [w for w in ws if self.p(w) >= alpha]
            return int(ok[0]), int(ok[-1])
        half = sps.norm.isf(alpha / 2) * self.sd
        hi = int(math.floor(self.mean + half))
        while hi > self.mean and self.p(hi) < alpha:            # guard the float edge of the closed form
            hi -= 1
        while hi + 1 <= self.total and self.p(hi + 1) >= alpha:
            hi += 1
        return self.total - hi, hi


def _tie_groups(d: np.ndarray) -> list[int]:
    """Sizes of the groups of equal values in ``d`` (a rank tie at every shift)."""
    return [int(t) for t in np.unique(d, return_counts=True)[1]]


def signed_rank(d: Sequence[float], alpha: float = ALPHA) -> tuple[float, float, float, float]:
    """``(estimate, low, high, p)`` of the paired log ratios ``d`` (module docstring): the Hodges-Lehmann
    estimate, the ``1 - alpha`` interval inverting the signed-rank test (``-inf``/``inf`` where ``n`` is too
    small for an end), and that test's two-sided p-value at 0."""
    d = np.sort(np.asarray(d, dtype=float))
    n = len(d)
    if n == 0:
        raise ValueError("no paired rounds")
    total = n * (n + 1) // 2
    null = SignedRankNull(n, _tie_groups(d))
    if total % 2:
        estimate = walsh_order_statistic(d, (total + 1) // 2)
    else:
        estimate = (walsh_order_statistic(d, total // 2) + walsh_order_statistic(d, total // 2 + 1)) / 2
    w_lo, w_hi = null.accepted(alpha)
    # A shift between the m-th and (m+1)-th Walsh averages has W = total - m: the accepted W's are the shifts
    # from the (total - w_hi)-th average to the (total - w_lo + 1)-th.
    m_lo, m_hi = total - w_hi, total - w_lo + 1
    low = walsh_order_statistic(d, m_lo) if m_lo >= 1 else -math.inf
    high = walsh_order_statistic(d, m_hi) if m_hi <= total else math.inf
    below, equal = walsh_counts(d, 0.0)
    p_value = null.p(total - below - equal / 2)
    return estimate, low, high, p_value


def compare(baseline_ms: Sequence[float], candidate_ms: Sequence[float], min_effect: float = MIN_EFFECT,
            alpha: float = ALPHA, basis: str = "", seed: int = 0) -> Verdict:
    """The verdict of ``candidate`` against ``baseline`` from paired per-round times (module docstring).

    ``seed`` is kept for callers of the bootstrap this replaced: the statistic is deterministic."""
    del seed
    d = log_ratios(baseline_ms, candidate_ms)
    n = int(len(d))
    method = METHOD.format(effect=min_effect)
    if n < MIN_ROUNDS:
        return Verdict(SAME, ratio=float(math.exp(signed_rank(d, alpha)[0])) if n else None, n=n,
                       min_effect=min_effect, decided=False, basis=basis, method=method,
                       note=f"{n} paired rounds: at least {MIN_ROUNDS} are needed for a test")
    estimate, low, high, p_value = signed_rank(d, alpha)
    band = math.log1p(min_effect)
    needed = rounds_needed(d, min_effect, alpha)
    significant = p_value < alpha
    if significant and estimate >= band:
        label, decided, note = SLOWER, True, ""
    elif significant and estimate <= -band:
        label, decided, note = FASTER, True, ""
    else:
        label = SAME
        inside = -band < low and high < band
        decided = inside or n >= needed
        if significant:       # said first: shown beside a p under alpha, "no significant difference" needs it
            note = f"significant but under the {min_effect:.0%} minimum effect"
        elif inside:
            note = f"95% CI inside ±{min_effect:.0%}"
        elif n >= needed:
            note = f"not significant with {n} rounds (enough for 80% power at {min_effect:.0%})"
        else:
            note = f"undecided: {n} rounds, {needed} needed for 80% power at {min_effect:.0%}"
    return Verdict(label, ratio=math.exp(estimate), ci_low=math.exp(low), ci_high=math.exp(high),
                   p_value=p_value, n=n, rounds_needed=needed, min_effect=min_effect, decided=decided,
                   basis=basis, method=method, note=note)


def needs_more(verdict: Verdict, max_rounds: int) -> int:
    """How many more rounds to take: 0 when decided or at ``max_rounds``, else up to ``rounds_needed``."""
    if verdict.decided or verdict.n >= max_rounds:
        return 0
    target = max(verdict.rounds_needed or MIN_ROUNDS, MIN_ROUNDS, verdict.n + 1)
    return max(0, min(target, max_rounds) - verdict.n)
