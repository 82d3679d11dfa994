"""Progress with a sense of time: the fraction done, and an estimate of the seconds left.

A run is a list of phases (load, reference, main timing, chains, stages,
baselines), each with an estimated duration in seconds. The estimates start
from what is known before anything runs and are revised as soon as one
forward has been timed (``Schedule.revise``). ``Schedule.emit(phase, within,
status)`` reports the overall fraction (estimated seconds done over the total)
and appends "· about N s left" to the status, which the command line prints and
the app shows, live, on the Run page and in the sidebar.

Once a phase ends its real duration replaces its estimate, so the remaining
time converges as the run goes on. The fraction shown never goes back: when a
revision makes the run look longer, the bar waits for the work to catch up.
"""

from __future__ import annotations

import time
from typing import Callable


class Schedule:
    """Phases with estimated seconds; ``emit`` turns (phase, fraction of it) into progress and time left."""

    def __init__(self, emit: Callable[[float, str], None], estimates: dict[str, float]) -> None:
        self._emit = emit
        self.estimates = dict(estimates)
        self.actual: dict[str, float] = {}
        self.started = time.perf_counter()
        self._phase: str | None = None
        self._phase_start = self.started
        self._shown = 0.0  # the largest fraction reported: progress never goes back when estimates grow

    def revise(self, **estimates: float) -> None:
        """New estimates for phases not yet finished (0 drops a phase)."""
        for phase, seconds in estimates.items():
            if phase not in self.actual:
                self.estimates[phase] = max(0.0, float(seconds))

    def begin(self, phase: str) -> None:
        """Close the phase in progress (its real duration replaces its estimate) and start ``phase``."""
        now = time.perf_counter()
        if self._phase is not None:
            self.actual[self._phase] = now - self._phase_start
        self._phase, self._phase_start = phase, now

    def remaining_s(self, within: float = 0.0) -> float:
        """Estimated seconds left: the phase in progress, prorated, and every later phase."""
        left = 0.0
        for phase, estimate in self.estimates.items():
            if phase in self.actual:
                continue
            if phase == self._phase:
                elapsed = time.perf_counter() - self._phase_start
                left += max(estimate * (1.0 - within), estimate - elapsed, 0.0) if within < 1 else 0.0
            else:
                left += estimate
        return left

    def fraction(self, within: float = 0.0) -> float:
        done = sum(self.actual.values()) + (time.perf_counter() - self._phase_start if self._phase else 0.0)
        total = done + self.remaining_s(within)
        return min(0.99, done / total) if total > 0 else 0.0

    def emit(self, phase: str, within: float, status: str) -> None:
        """Report ``status`` of ``phase`` (``within``: the fraction of that phase done)."""
        if phase != self._phase:
            self.begin(phase)
        within = min(max(float(within), 0.0), 1.0)
        left = self.remaining_s(within)
        self._shown = max(self._shown, self.fraction(within))
        self._emit(self._shown, f"{status} · about {format_seconds(left)} left")

    def done(self, status: str = "done") -> None:
        self.begin("(done)")
        self._emit(1.0, f"{status} in {format_seconds(time.perf_counter() - self.started)}")

    def for_phase(self, phase: str) -> Callable[[float, str], None]:
        """An ``emit(fraction, status)`` callback bound to one phase (for the runtime's helpers)."""
        return lambda within, status: self.emit(phase, within, status)


def format_seconds(seconds: float) -> str:
    """``45 s``, ``3 min 20 s``."""
    seconds = max(0, int(round(seconds)))
    if seconds < 90:
        return f"{seconds} s"
    return f"{seconds // 60} min {seconds % 60:02d} s"
