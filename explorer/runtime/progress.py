"""Progress with a sense of time: the seconds left, from what this run (and earlier ones) measured.

Three parts, all pure of torch:

- **the cost model** (``run_estimates``): the seconds each phase of a run should take (reference,
  main timing, chains, stages, baselines), from what the run has measured so far (one forward's
  time, applying the plan) and the sizes known up front (chains to time, stage graphs, torch.compile
  modes, the timing plan's rounds and budgets). Before a forward has been timed the phases are
  priced from the forward time an earlier run of the same model measured (``CostMemory``), or a
  stated guess.
- **the schedule** (``Schedule``, in the process that measures): phases with those estimates;
  ``emit(phase, within, status)`` appends "· about N s left". Inside a phase the time left blends
  the estimate with the rate the phase is going at (its seconds so far over the part done), weighted
  by how many of its units (rounds, chains) are done, so a phase slower than priced (a busy host)
  shows it within a unit or two; a finished phase's real duration replaces its estimate.
- **the countdown** (``Countdown``, in the caller: the app's job, the command line): starts at the
  click, reads the "about N s left" of each status (``split_left``), counts it down between
  statuses, and gives the bar's fraction as elapsed / (elapsed + left): a fraction of the time,
  not of steps. It never goes back: when a revision makes the run look longer, the bar waits.

``CostMemory`` keeps a few measured costs between runs (starting a measuring process, loading a
model, one forward of it), in a small JSON file (``FUSION_EXPLORER_COSTS``: a path, or ``off``;
default ``~/.cache/fusion-explorer/costs.json``). Unreadable or unwritable, it is simply empty.
"""

from __future__ import annotations

import json
import math
import os
import re
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable

from explorer.messages import PROGRESS

COSTS_ENV = "FUSION_EXPLORER_COSTS"

#: Guesses for what has never been measured on this machine (seconds): starting the measuring
#: process (Python, torch, the engine), loading a zoo model, one forward on the CPU / on CUDA.
PRIOR_CHILD_START_S = 6.0
PRIOR_LOAD_S = 4.0
#: From a measuring process's last status to its report read by the caller (building, sending, parsing it).
PRIOR_FINISH_S = 0.3
PRIOR_FORWARD_S = {"cpu": 0.05, "cuda": 0.01}
#: A chain timed alone: building and preparing its two graphs, a float64 check, warm-up, paired rounds
#: (``measure.TimingPlan.for_device(short=True)``) and two launch counts, before any was measured.
PRIOR_CHAIN_S = {"cpu": 0.15, "cuda": 0.6}
#: Compiling with torch.compile, per mode, before a compile was measured.
PRIOR_COMPILE_S = {"cpu": 25.0, "cuda": 50.0}
#: How many units of progress a phase without its own count is worth when blending estimate and rate.
DEFAULT_UNITS = 4

_LEFT = re.compile(r"^(?P<text>.*) · about (?:(?P<min>\d+) min (?P<sec>\d+) s|(?P<s>\d+) s) left$", re.S)


def format_seconds(seconds: float) -> str:
    """``45 s``, ``3 min 20 s`` (a ``Message``: the UI renders it in its language)."""
    seconds = max(0, int(round(seconds)))
    if seconds < 90:
        return PROGRESS("seconds", s=seconds)
    return PROGRESS("minutes", min=seconds // 60, s=seconds % 60)


def with_left(text: str, left_s: float) -> str:
    """``text · about N s left``: the one way a status says the time left (``split_left`` reads it)."""
    return PROGRESS("about_left", status=text, left=format_seconds(left_s))


def estimating(text: str) -> str:
    """``text · estimating the time left``: a status before anything it could be priced from was measured."""
    return PROGRESS("estimating", msg=text)


def split_left(status: str) -> tuple[str, float | None]:
    """(the status without its time left, the seconds left or None when it says none)."""
    found = _LEFT.match(status or "")
    if found is None:
        return status, None
    if found.group("s") is not None:
        return found.group("text"), float(found.group("s"))
    return found.group("text"), 60.0 * int(found.group("min")) + int(found.group("sec"))


# ------------------------------------------------------------------ costs measured before

class CostMemory:
    """A few measured costs kept between runs (module docstring): ``get(key)``, ``record(key, seconds)``.

    Machine-wide costs (``child_start``) are averaged (the last runs weigh most); a model's costs
    (``load:<model>``, ``forward:<model>:<device>:<dtype>``) are its latest measurement.
    """

    _lock = threading.Lock()

    def __init__(self, path: str | Path | None = None) -> None:
        if path is None:
            env = os.environ.get(COSTS_ENV)
            if env is not None and env.strip().lower() in ("", "off", "0", "none"):
                path = None
            elif env:
                path = Path(env)
            else:
                path = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "fusion-explorer" / \
                    "costs.json"
        self.path = Path(path) if path is not None else None

    def _read(self) -> dict[str, float]:
        if self.path is None:
            return {}
        try:
            with open(self.path, "rb") as f:
                data = json.loads(f.read(1 << 20) or b"{}")
        except (OSError, ValueError):
            return {}
        if not isinstance(data, dict):
            return {}
        return {str(k): float(v) for k, v in data.items()
                if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and 0 <= v < 1e6}

    def get(self, key: str, default: float | None = None) -> float | None:
        return self._read().get(key, default)

    def record(self, key: str, seconds: float, average: bool = False) -> None:
        """Keep ``seconds`` for ``key`` (``average``: 0.3 old + 0.7 new, for machine-wide costs)."""
        if self.path is None or not (isinstance(seconds, (int, float)) and math.isfinite(seconds) and seconds >= 0):
            return
        with self._lock:
            data = self._read()
            old = data.get(key)
            data[key] = round(float(seconds) if old is None or not average else 0.3 * old + 0.7 * seconds, 4)
            if len(data) > 400:  # keep the file small: drop the oldest models' entries
                data = dict(list(data.items())[-300:])
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                fd, tmp = tempfile.mkstemp(prefix=".costs-", dir=self.path.parent)
                with os.fdopen(fd, "w") as f:
                    json.dump(data, f)
                os.replace(tmp, self.path)
            except OSError:
                pass  # an estimate is a convenience: a read-only home leaves it at the guesses


def model_key(source: str, batch: int | None, seq_len: int | None) -> str:
    """The key of a model in ``CostMemory``: its source (zoo name or path), batch and sequence length."""
    return f"{source}|{batch}|{seq_len}"


def child_load_key(key: str) -> str:
    """The load of a model (``model_key``) in a measuring process: a fresh process, its imports cold, never the
    app's load of the same model in its warm process (``load:``, what the app's own wait is priced from)."""
    return f"child_load:{key}"


#: How far the host's pace may scale remembered costs (``host_pace``): a start twice as slow as remembered says the
#: host is busier now, never that the model grew.
PACE_RANGE = (0.6, 1.8)


def host_pace(spawned_at: object, remembered_start_s: object, now: float | None = None) -> float:
    """This process's start (``now`` less ``spawned_at``, wall-clock seconds) over the start earlier runs remembered:
    the host's pace now against then (1.0 when either is unknown), bounded by ``PACE_RANGE``. The costs remembered
    from earlier runs (a load, applying the plan) are scaled by it until this run measures its own."""
    ok = lambda x: isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)  # noqa: E731
    if not ok(spawned_at) or not ok(remembered_start_s) or remembered_start_s <= 0.2:
        return 1.0
    took = (time.time() if now is None else now) - float(spawned_at)
    if not 0 < took < 600:
        return 1.0
    return min(max(took / float(remembered_start_s), PACE_RANGE[0]), PACE_RANGE[1])


def probe_pace(probe_s: float, remembered_probe_s: float | None, fallback: float = 1.0) -> float:
    """A fixed piece of CPU work timed now (``session.host_probe_s``) over the same work timed by the run whose costs
    are remembered: the host's pace for CPU work now against then, bounded by ``PROBE_PACE_RANGE``; ``fallback``
    (the start's pace, ``host_pace``) when none was remembered."""
    if not remembered_probe_s or remembered_probe_s <= 0 or not math.isfinite(probe_s) or probe_s <= 0:
        return fallback
    return min(max(probe_s / remembered_probe_s, PROBE_PACE_RANGE[0]), PROBE_PACE_RANGE[1])


#: A timed piece of work says more about the host than a process's start: it may scale remembered costs further.
PROBE_PACE_RANGE = (0.4, 6.0)


# ------------------------------------------------------------------ the cost model

def warm_up_s(forward_s: float, cuda: bool) -> float:
    """``measure.warm_up`` without fixed counts: at least 3 calls and up to 0.2 s (CPU) / 1 s (CUDA), at most 50."""
    budget = 1.0 if cuda else 0.2
    return max(3 * forward_s, min(budget, 50 * forward_s))


def paired_s(forward_s: float, variants: int, target_s: float, min_reps: int, max_reps: int, budget_s: float,
             cuda: bool, reps: int | None = None, extra: float = 0.5) -> float:
    """Warm-up and alternated rounds of ``variants`` forwards of about ``forward_s`` each
    (``measure.time_paired``): the planned rounds (each variant once, plus the untimed call where the
    order switches variant), then ``extra`` of the budget for rounds added while a verdict is open."""
    forward_s = max(forward_s, 1e-5)
    rounds = reps if reps is not None else int(min(max_reps, max(min_reps, target_s / forward_s)))
    per_round = forward_s * (variants + (variants + 1) / 2 if variants > 1 else 1)
    added = 0.0 if reps is not None else extra * budget_s
    return variants * warm_up_s(forward_s, cuda) + rounds * per_round + added


def run_estimates(*, cuda: bool, forward_s: float, timing: dict, quick: bool,
                  phases: tuple[str, ...], chains_to_time: int, chains_timed: bool, stage_graphs: int,
                  stages: bool, compile_modes: int, fuse_s: float, warmup: int | None = None,
                  reps: int | None = None, chain_s: float | None = None) -> dict[str, float]:
    """Seconds for each phase of a run still to come (``report.PHASES``; 0 for one that does not run).

    ``forward_s``: one steady forward of the unfused model (measured, or remembered); ``timing``: the
    whole model's ``TimingPlan`` as a dict (target_s, min_reps, max_reps, budget_s); ``chains_to_time``: chains with a fused kernel (the others are not timed);
    ``stage_graphs``: distinct stage graphs; ``fuse_s``: applying the plan once; ``chain_s``: one
    chain's cost measured earlier (else ``PRIOR_CHAIN_S``)."""
    device = "cuda" if cuda else "cpu"
    f = max(float(forward_s), 1e-5)
    launches = 2 * (2 * f + (0.02 if cuda else 3 * f))   # count_launches: a warm call, a profiled call
    out = {p: 0.0 for p in ("reference", "main", "chains", "stages", "baselines")}
    if "reference" in phases:
        out["reference"] = 4 * f + 3 * f + 0.2          # float64 forward (about 4x fp32 on a CPU), 3 forwards
    if "main" in phases:
        out["main"] = paired_s(f, 2, timing["target_s"], timing["min_reps"], timing["max_reps"], timing["budget_s"],
                               cuda, reps) + launches + (2 * f if cuda else 0.0) + 0.1
    if chains_timed and "chains" in phases:
        out["chains"] = chains_to_time * (chain_s if chain_s is not None else PRIOR_CHAIN_S[device])
    if stages and "stages" in phases:
        stage_target = timing["target_s"] / 2
        out["stages"] = 3 * fuse_s + paired_s(f, max(stage_graphs, 1), stage_target,
                                              4 if quick else timing["min_reps"], timing["max_reps"], 0.0, cuda,
                                              reps, extra=0.0) + 0.2
    if compile_modes and "baselines" in phases:
        out["baselines"] = compile_modes * PRIOR_COMPILE_S[device] + paired_s(
            f, 2 + compile_modes, timing["target_s"], timing["min_reps"], timing["max_reps"], timing["budget_s"],
            cuda, reps)
    return out


# ------------------------------------------------------------------ the schedule (the measuring process)

class Schedule:
    """Phases with estimated seconds; ``emit`` turns (phase, fraction of it) into progress and time left."""

    def __init__(self, emit: Callable[[float, str], None], estimates: dict[str, float],
                 units: dict[str, int] | None = None) -> None:
        self._emit = emit
        self.estimates = dict(estimates)
        self.units = dict(units or {})
        self.actual: dict[str, float] = {}
        self.started = time.perf_counter()
        self._phase: str | None = None
        self._phase_start = self.started
        # where the phase's own rate is counted from: its first status past the one it started with, so a fixed
        # cost at its start (a warm-up before round 1, building the first chain) is not read as a slow rate
        self._first_within: float | None = None
        self._anchor: tuple[float, float] | None = None   # (seconds into the phase, fraction done)
        self._shown = 0.0  # the largest fraction reported: progress never goes back when estimates grow

    def revise(self, units: dict[str, int] | None = None, **estimates: float) -> None:
        """New estimates for phases not yet finished (0 drops a phase); ``units``: how many units (rounds,
        chains) a phase is, for weighing its own rate against its estimate."""
        for phase, seconds in estimates.items():
            if phase not in self.actual:
                self.estimates[phase] = max(0.0, float(seconds))
        self.units.update(units or {})

    def begin(self, phase: str) -> None:
        """Close the phase in progress (its real duration replaces its estimate) and start ``phase``."""
        now = time.perf_counter()
        if self._phase is not None:
            self.actual[self._phase] = now - self._phase_start
        self._phase, self._phase_start = phase, now
        self._first_within, self._anchor = None, None

    def _mark(self, within: float, elapsed: float) -> None:
        """Note a status of the phase in progress: its first fraction, then the first status past it (the anchor)."""
        if self._first_within is None:
            self._first_within = within
        elif self._anchor is None and within > self._first_within:
            self._anchor = (elapsed, within)

    def phase_left(self, phase: str, within: float, elapsed: float) -> float:
        """Seconds left of the phase in progress: its estimate less the time spent, blended with its own rate,
        the rate weighing more as units get done. The rate is the phase's time over its part done since its
        anchor (``_mark``: its first status past the one it began with), so the fixed cost before its first
        unit is not spread over the units still to come."""
        estimate = self.estimates.get(phase, 0.0)
        if within >= 1:
            return 0.0
        by_estimate = max(estimate - elapsed, estimate * (1 - within) * 0.25, 0.0)
        anchor = self._anchor if phase == self._phase else None
        if anchor is None or within <= anchor[1] or elapsed <= anchor[0]:
            return by_estimate if estimate > elapsed else max(by_estimate, 0.5 * elapsed)
        by_rate = (elapsed - anchor[0]) * (1 - within) / (within - anchor[1])
        done_units = (within - anchor[1]) * max(self.units.get(phase, DEFAULT_UNITS), 1)
        weight = done_units / (done_units + 1.0)
        return weight * by_rate + (1 - weight) * by_estimate

    def remaining_s(self, within: float = 0.0) -> float:
        """Estimated seconds left: the phase in progress and every later phase."""
        left = 0.0
        for phase, estimate in self.estimates.items():
            if phase in self.actual:
                continue
            if phase == self._phase:
                left += self.phase_left(phase, within, time.perf_counter() - self._phase_start)
            else:
                left += estimate
        return left

    def fraction(self, within: float = 0.0) -> float:
        done = time.perf_counter() - self.started
        total = done + self.remaining_s(within)
        return min(0.99, done / total) if total > 0 else 0.0

    def emit(self, phase: str, within: float, status: str) -> None:
        """Report ``status`` of ``phase`` (``within``: the fraction of that phase done)."""
        if phase != self._phase:
            self.begin(phase)
        within = min(max(float(within), 0.0), 1.0)
        self._mark(within, time.perf_counter() - self._phase_start)
        left = self.remaining_s(within)
        self._shown = max(self._shown, self.fraction(within))
        self._emit(self._shown, with_left(status, left))

    def done(self, status: str = "done") -> None:
        self.begin("(done)")
        elapsed = format_seconds(time.perf_counter() - self.started)
        self._emit(1.0, PROGRESS("done", elapsed=elapsed) if status == "done" else f"{status} in {elapsed}")

    def for_phase(self, phase: str) -> Callable[[float, str], None]:
        """An ``emit(fraction, status)`` callback bound to one phase (for the runtime's helpers)."""
        return lambda within, status: self.emit(phase, within, status)


# ------------------------------------------------------------------ the caller's clock (before a child answers)

class CallerClock:
    """The caller's side of a child's time left: ``progress(fraction, status)`` is passed on with the fraction
    of the time since the call (elapsed / (elapsed + left)), never going back, below 1 until the end.
    ``gpu_runner`` (a run) and ``runtime.teach_tasks`` (the Learn page's tasks) price the time before the
    child's own first estimate from what they remember (``memory``) and pass the child's statuses on."""

    def __init__(self, progress: Callable[[float, str], None] | None) -> None:
        self._progress = progress or (lambda f, s: None)
        self.memory = CostMemory()
        self.t0 = time.monotonic()
        self.answered = False
        self.shown = 0.0

    def _send(self, status: str, left: float | None) -> None:
        elapsed = time.monotonic() - self.t0
        if left is not None:
            self.shown = max(self.shown, min(0.99, elapsed / (elapsed + left) if elapsed + left > 0 else 0.0))
        self._progress(self.shown, status if left is None else with_left(status, left))


# ------------------------------------------------------------------ the countdown (the caller)

class Countdown:
    """What a waiting caller shows: elapsed since the click, the time left counted down between statuses,
    and the bar's fraction of the time (module docstring). ``update(fraction, status)`` is the progress
    callback; ``view()`` is (fraction, status without its time left, seconds left or None, elapsed)."""

    def __init__(self, started: float | None = None, status: str = "starting…") -> None:
        self.started = time.time() if started is None else started
        self.status = status
        self.left_s: float | None = None
        self.at = self.started
        self.reported = 0.0   # the fraction the work itself reported (its steps), kept for callers
        self._shown = 0.0
        self.finished = False

    def update(self, fraction: float, status: str) -> None:
        text, left = split_left(str(status))
        self.status, self.left_s, self.at = text, left, time.time()
        self.reported = min(max(float(fraction), 0.0), 1.0)
        if self.reported >= 1.0:
            self.finished = True

    def view(self, now: float | None = None) -> tuple[float, str, float | None, float]:
        now = time.time() if now is None else now
        elapsed = max(0.0, now - self.started)
        if self.finished:
            return 1.0, self.status, None, elapsed
        left = None if self.left_s is None else max(self.left_s - (now - self.at), 0.0)
        if left is not None:
            fraction = elapsed / (elapsed + left) if elapsed + left > 0 else 0.0
        else:
            fraction = self._shown   # no estimate yet: the bar waits
        self._shown = max(self._shown, min(fraction, 0.99))
        return self._shown, self.status, left, elapsed

    def line(self, now: float | None = None) -> str:
        """``status · about N s left`` as of now (the status alone while there is no estimate; ``status · taking
        longer than estimated`` once the estimate has run out and no new status has come)."""
        now = time.time() if now is None else now
        _fraction, text, left, _elapsed = self.view(now)
        if left is None:
            return text
        if left <= 0 and self.left_s is not None and now - self.at > self.left_s + 1.0:
            return PROGRESS("taking_longer", msg=text)
        return with_left(text, left)


#: What a countdown says once its estimate has run out (``Countdown.line``; the text of ``progress.taking_longer``).
OVERDUE = "taking longer than estimated"
#: What a status says before anything it could be priced from was measured.
ESTIMATING = "estimating the time left"
