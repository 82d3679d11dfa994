"""The runtime's entry point: measure a model unfused and fused, in a child process, and return one report.

``run(source, plan, settings, progress, cancel)`` is what the command line and
the app call. It runs on the GPU when there is one and on the CPU otherwise
(the report says which). The work happens in ``python -m explorer.gpu_runner
--child`` (``explorer.runtime.child``: JSON in, JSON lines out), so an
out-of-memory error, a CUDA fault or a crash ends the child, not the caller,
and reaches it as one ``RunError`` line. Inside the child,
``explorer.runtime.session.measure`` does the measurement.

A fault never loses a run. The child sends a snapshot of its report after
setup and after each phase (``report.PHASES``), and names each phase as it
starts. When the child dies mid-phase (a segmentation fault, a kill) or reports
that a phase left its CUDA context unusable, ``run`` keeps what was measured,
marks that phase failed with its one-line reason, and starts a fresh child for
the phases still to run (``fresh_processes`` counts them); the reports are
merged phase by phase (``PHASE_FIELDS``). Only a failure before any phase
(loading, planning: nothing measured yet), a cancel or the timeout end the run
with one ``RunError`` line.

This module imports no torch: the parent stays light. Never Streamlit,
plotly or pyvis either.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from typing import Any, Callable

from explorer.messages import PHASES as PHASES_WORDS, PROGRESS, RUN
from explorer.errors import ReportError, RunError
from explorer.report import PHASES, Report
from explorer.runtime import gpulock
from explorer.runtime.child import child_main, run_child
from explorer.runtime.progress import (PRIOR_CHILD_START_S, PRIOR_FINISH_S, CallerClock, estimating, format_seconds,
                                       host_pace, split_left)
from explorer.runtime.settings import RunSettings

__all__ = ["Report", "RunSettings", "run"]


#: The report fields each phase writes: a fresh child's report gives these for the phases it ran.
PHASE_FIELDS = {"reference": ("fused_vs_unfused", "reference", "fused_worse", "precision_note"),
                "main": ("unfused", "fused", "verdict"),
                "chains": ("chains", "rotation_note"),
                "stages": ("stages",),
                "baselines": ("baselines",)}


def run(source: str, plan: Any | None, settings: RunSettings,
        progress: Callable[[float, str], None] | None = None,
        cancel: threading.Event | None = None) -> Report:
    """Measure ``source`` under ``plan`` in a child process and return the typed report.

    ``plan`` is a ``Plan`` (or ``None``: every detected chain accepted).
    ``progress(fraction, status)`` is called from this thread as the child
    reports (the status ends with the estimated time left). A phase that fails
    is in the report's ``failures``; a lost process is followed by a fresh child
    for the remaining phases (module docstring). Raises ``RunError`` with one line
    when nothing could be measured, including ``RunError("cancelled")`` when
    ``cancel`` is set, and on the timeout (``settings.timeout_s``, for all children together).
    """
    deadline = time.monotonic() + float(settings.timeout_s)
    todo = [p for p in PHASES if settings.runs_phase(p)]
    clock = _Clock(progress, source, settings)
    pieces: list[tuple[dict, list[str]]] = []      # (report dict, the phases it owns)
    failures: list[dict] = []
    fresh = 0
    while todo:
        seen: dict[str, Any] = {"snapshot": None, "done": [], "started": None}

        def keep(part: Any) -> None:
            if isinstance(part, dict):
                if "started" in part:
                    seen["started"] = str(part["started"])
                if isinstance(part.get("snapshot"), dict):
                    seen["snapshot"], seen["done"] = part["snapshot"], [str(p) for p in part.get("done") or []]

        payload = {"source": str(source), "plan": plan.to_dict() if plan is not None else None,
                   "settings": settings.to_dict(), "phases": todo,
                   # the child compares its own start with the remembered one: the host's pace now
                   "spawned_at": time.time(), "child_start_s": clock.memory.get("child_start")}
        left_s = deadline - time.monotonic()
        if left_s <= 0:
            raise RunError(RUN("timed_out", limit=settings.timeout_s))
        clock.starting()
        try:
            data = run_child("explorer.gpu_runner", payload, left_s, clock.progress, cancel, on_part=keep)
        except RunError as exc:
            if cancel is not None and cancel.is_set():
                raise
            if "timed out" in str(exc):  # the child had what was left of the run's time: say the run's limit
                raise RunError(RUN("timed_out", limit=settings.timeout_s)) from None
            if seen["snapshot"] is None:
                if not pieces:
                    raise  # nothing measured: the run's own failure (loading, planning)
                failures += [{"phase": p, "reason": PHASES_WORDS("run_fresh_process_failed", msg=str(exc)),
                              "variant": None, "process_lost": False, "not_run": True} for p in todo]
                break
            # the child died: keep what it measured, the phase it was in failed, the rest run afresh
            crashed = seen["started"] if seen["started"] not in seen["done"] else None
            pieces.append((seen["snapshot"], list(seen["done"])))
            if crashed is not None:
                failures.append({"phase": crashed, "reason": str(exc), "variant": None, "process_lost": True,
                                 "not_run": False})
            todo = [p for p in todo if p not in seen["done"] and p != crashed]
            fresh += bool(todo)
            continue
        lost = [f for f in data.get("failures") or [] if isinstance(f, dict) and f.get("process_lost")]
        failed = {str(f.get("phase")) for f in data.get("failures") or [] if isinstance(f, dict)}
        done = list(seen["done"])
        pieces.append((data, done + [p for p in todo if p in failed]))
        todo = [p for p in todo if p not in done and p not in failed] if lost else []
        fresh += bool(todo)
    merged = _merge(pieces, failures, fresh)
    try:
        report = Report.from_dict(merged, "the measurement's report")
    except ReportError as exc:
        raise RunError(str(exc)) from None
    clock.finished()
    return report


class _Clock(CallerClock):
    """The caller's side of the time left (``explorer.runtime.progress``): before a child answers, the
    time to start one (measured by earlier runs) plus what the last run of this model took; then the
    child's own estimate. The fraction passed on is of the time since ``run`` was called."""

    def __init__(self, progress: Callable[[float, str], None] | None, source: str, settings: RunSettings) -> None:
        super().__init__(progress)
        self.key = f"run:{source}|{settings.batch}|{settings.seq_len}|" + "|".join(
            str(x) for x in (settings.device, settings.dtype, settings.quick, settings.chains_timed, settings.stages,
                             settings.compile_baseline, settings.compile_modes))
        # after the child's last status: its report built, sent and read here (measured by earlier runs)
        self.finish_key = f"run_finish:{settings.device}"
        self.finish_s = self.memory.get(self.finish_key, PRIOR_FINISH_S)
        self.last_status: float | None = None
        self.spawned: float | None = None

    def starting(self) -> None:
        """A child is about to start: say so, with the time it takes to start one and the run after it."""
        self.spawned, self.answered = time.monotonic(), False
        start = self.memory.get("child_start", PRIOR_CHILD_START_S)
        last = self.memory.get(self.key)
        # the whole run's time only when a run like this one was measured before; else the child's first
        # status (right after it started) brings the first estimate
        if last is None:
            self._send(estimating(PROGRESS("starting_process")), None)
        else:
            self._send(PROGRESS("starting_process"), start + last)

    def progress(self, fraction: float, status: str) -> None:
        if not self.answered and self.spawned is not None:
            self.answered = True
            self.memory.record("child_start", time.monotonic() - self.spawned, average=True)
        if fraction >= 1.0:
            return   # the child's "done": the run is done once its report is read (``finished``)
        self.last_status = time.monotonic()
        text, left = split_left(status)
        self._send(text, None if left is None else left + self.finish_s)

    def finished(self) -> None:
        took = time.monotonic() - self.t0
        self.memory.record(self.key, max(0.0, took - self.memory.get("child_start", PRIOR_CHILD_START_S)))
        if self.last_status is not None:
            self.memory.record(self.finish_key, time.monotonic() - self.last_status, average=True)
        self._progress(1.0, PROGRESS("done", elapsed=format_seconds(took)))


def _merge(pieces: list[tuple[dict, list[str]]], failures: list[dict], fresh: int) -> dict:
    """One report from the children's: the first child's, each phase's fields from the child that
    ran it, every failure and note kept, the durations summed."""
    merged = dict(pieces[0][0])
    notes = list(merged.get("notes") or [])
    all_failures = list(merged.get("failures") or [])
    duration = merged.get("duration_s") or 0.0
    for data, owned in pieces[1:]:
        for phase in owned:
            for field in PHASE_FIELDS.get(phase, ()):
                if field in data:
                    merged[field] = data[field]
            if phase == "main":  # precision is the reference phase's, measured by an earlier child
                for side in ("unfused", "fused"):
                    before = (pieces[0][0].get(side) or {}).get("precision")
                    if isinstance(merged.get(side), dict) and merged[side].get("precision") is None:
                        merged[side] = {**merged[side], "precision": before}
        notes += [n for n in data.get("notes") or [] if n not in notes]
        all_failures += [f for f in data.get("failures") or [] if f not in all_failures]
        duration += data.get("duration_s") or 0.0
    all_failures += failures
    order = {p: i for i, p in enumerate(PHASES)}
    merged["failures"] = sorted(all_failures, key=lambda f: order.get(str(f.get("phase")), len(order)))
    hosts = [d["host"] for d, _owned in pieces if isinstance(d.get("host"), dict)]
    if len(hosts) > 1:   # every child's samples: the host was busy if it was during any of them
        merged["host"] = {**hosts[0], "load_1min": [x for h in hosts for x in h.get("load_1min") or []],
                          "busy": any(bool(h.get("busy")) for h in hosts)}
    merged["notes"] = notes
    merged["fresh_processes"] = fresh
    merged["duration_s"] = round(duration, 2) if duration else merged.get("duration_s")
    return merged


def _measure_in_child(payload: dict, emit: Callable[[float, str], None]) -> dict:
    """The child's work: ``explorer.runtime.session.measure`` (torch is imported here, in the child only).

    When the parent shares the device with other measuring processes (``gpulock.LOCK_ENV``: a sweep's
    ``workers_per_gpu``), the device work is an exclusive section: the lock is taken after setup's host work,
    before the first device allocation, and given back once the report is measured and the device memory freed;
    the report's ``environment.extra`` says how long it waited and held it (``gpu_lock_*``, Unix seconds)."""
    section = gpulock.Section.from_env()
    if section is not None:
        gpulock.pin(section.waiting)   # host work on the waiting cores until the section begins

    def before_device() -> None:
        emit(0.0, PROGRESS("waiting_for_device"))
        section.acquire()

    from explorer.runtime.session import measure_phases  # the parent never imports torch

    settings = RunSettings.from_dict(payload.get("settings") or {})
    phases = tuple(p for p in payload.get("phases") or PHASES if p in PHASES)
    try:
        report, _left = measure_phases(payload["source"], payload.get("plan"), settings, emit, phases,
                                       on_part=getattr(emit, "part", None),
                                       pace=host_pace(payload.get("spawned_at"), payload.get("child_start_s")),
                                       before_device=before_device if section is not None else None)
        out = report.to_dict()
    finally:
        if section is not None and section.held:
            gpulock.free_device()
            section.release()
    if section is not None and section.record.get("locked"):
        r = section.record
        out["environment"].setdefault("extra", {}).update(
            gpu_lock_waited_s=r["waited_s"], gpu_lock_held_s=r["held_s"], gpu_lock_wait_started_at=r["wait_started_at"],
            gpu_lock_acquired_at=r["acquired_at"], gpu_lock_released_at=r["released_at"])
    return out


if __name__ == "__main__":
    if "--child" in sys.argv[1:]:
        code = child_main(_measure_in_child)
        sys.stdout.flush()
        sys.stderr.flush()
        # The report is sent: skip the interpreter's teardown of torch and the models (1-6 s measured on the
        # 2-core CPU, a wait with nothing left to show), which os._exit does not run.
        os._exit(code)
    print("usage: python -m explorer.gpu_runner --child  (arguments as JSON on stdin); "
          "use the fusion-explorer CLI to run a measurement", file=sys.stderr)
    sys.exit(2)
