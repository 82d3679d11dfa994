"""The Learn page's long tasks in a child process: a profile, a precision bisect, a chain's sweep.

Each runs as a run does (``runtime.child``): ``python -m explorer.runtime.teach_tasks --child`` with the task as
JSON on stdin, its progress and its answer as JSON lines out, a time limit, a cancel that stops it, the memory
budget a file source is held to on the CPU (``child.limit_host_memory``), and any failure of the child (a crash,
a kill, out of memory, the time limit) one ``RunError`` line for the caller; the caller's process never loads
or runs the model. The tasks:

- ``profile``: where one forward's time goes, unfused and fused (``runtime.breakdown.model_breakdowns``), of the
  model under the page's plan; answers ``{"breakdowns": {"unfused": ..., "fused": ...}}``;
- ``bisect``: which accepted chain makes the fused model drift (``runtime.bisect.precision_bisect``); answers
  ``{"bisect": BisectResult.to_dict()}``;
- ``sweep``: when one chain stops paying (``sweeps.chain.sweep_chain``: a sweep on the local backend, measured by
  its workers with the runner's own measurement); answers ``{"points": [...], "folder": its sweep folder}``.

The time left (``runtime.progress``), measured costs first: before the child answers, the caller prices starting
a task's process (``START_KEY``), loading the model (``IMPORT_KEY`` for torch and the engine, ``load:<model>`` as
runs keep it) and the task itself (its last duration on this machine, ``cost_key``); in the child the load and the
task are phases of a ``Schedule`` (each estimate blended with the rate its steps go at) and their real durations
are kept for the next time. Before anything was measured the status says it is estimating (``PRIOR_TASK_S`` then
prices the task in the child). A sweep's status brings its own time left (``sweeps.chain``: from earlier sweeps
of the model, then from the points measured).

A cancel or the time limit first asks the child to stop (``SIGTERM``, ``STOP_GRACE_S``): a bisect that has its
model, or a sweep whose workers have started, then answers with the part done (the sweep's runner stops its
workers); before that, and for a profile, the child just ends. What is left of the child's process group (a
sweep's workers) is killed when it ends (``reap_group``). Imports no torch in the caller.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from typing import Any, Callable

from explorer.errors import RunError
from explorer.messages import PROGRESS, TASKS as WORDS
from explorer.runtime.child import child_main, run_child, stop_on_sigterm
from explorer.runtime.progress import (ESTIMATING, PRIOR_CHILD_START_S, PRIOR_LOAD_S, CallerClock, CostMemory,
                                       Schedule, format_seconds, model_key, split_left)

MODULE = "explorer.runtime.teach_tasks"
NAMES = ("profile", "bisect", "sweep")
#: Each task's time limit (seconds) unless the caller gives another.
TIMEOUT_S = {"profile": 600.0, "bisect": 900.0, "sweep": 1800.0}
#: What a task takes before one like it was measured on this machine (seconds, the work alone).
PRIOR_TASK_S = {"profile": 8.0, "bisect": 8.0, "sweep": 30.0}
#: ``CostMemory`` keys: starting a task's process (until its first status), importing torch and the engine in it.
START_KEY = "task_child_start"
IMPORT_KEY = "task_import"
PRIOR_IMPORT_S = 3.0
#: After a cancel or the time limit, how long a child may take to stop its own work and answer (0: killed at once).
STOP_GRACE_S = {"profile": 0.0, "bisect": 5.0, "sweep": 10.0}


def cost_key(name: str, payload: dict) -> str:
    """The ``CostMemory`` key of a task's own work: the task, the model and its shape, the device and dtype."""
    model = model_key(str(payload.get("source")), payload.get("batch"), payload.get("seq_len"))
    what = payload.get("dtypes") if name == "sweep" else payload.get("dtype")
    return f"task:{name}:{model}|{payload.get('device')}|{what}|{len(payload.get('batches') or ())}"


def run_task(name: str, payload: dict, timeout_s: float | None = None,
             progress: Callable[[float, str], None] | None = None, cancel: threading.Event | None = None,
             on_start: Callable[[int], None] | None = None) -> dict:
    """Run task ``name`` (one of ``NAMES``) with ``payload`` in a child process; its answer (module docstring).

    ``payload`` holds ``source``, ``batch``, ``seq_len``, ``device`` and the task's own fields (profile: ``plan``,
    ``dtype``, ``ridge``; bisect: ``ids``, ``dtype``, ``mode``, ``kernels``; sweep: ``chain_id``, ``batches``,
    ``dtypes``, ``folder``). ``progress(fraction, status)``: the status ends with the time left. Raises
    ``RunError`` (one line) when the child fails, on the time limit, and on a cancel that left nothing."""
    if name not in NAMES:
        raise RunError(WORDS("unknown_task", x=str(name)[:40], x2=", ".join(NAMES)))
    limit = float(timeout_s if timeout_s is not None else TIMEOUT_S[name])
    clock = _Clock(progress, name, payload)
    clock.starting()
    message = {"task": name, **payload, "settings": {"device": payload.get("device", "cpu")}}
    answer = run_child(MODULE, message, limit, clock.progress, cancel, on_start=on_start,
                       stop_grace_s=STOP_GRACE_S[name], reap_group=True)
    clock.finished()
    return answer


class _Clock(CallerClock):
    """The caller's time left before the child's own (as ``gpu_runner`` prices a run): starting a process,
    loading the model, the task's last duration; the fraction is of the time since the click."""

    def __init__(self, progress: Callable[[float, str], None] | None, name: str, payload: dict) -> None:
        super().__init__(progress)
        self.name = name
        self.work_key = cost_key(name, payload)
        self.load_key = "load:" + model_key(str(payload.get("source")), payload.get("batch"), payload.get("seq_len"))

    def starting(self) -> None:
        start = self.memory.get(START_KEY, PRIOR_CHILD_START_S)
        work = self.memory.get(self.work_key)
        load = 0.0 if self.name == "sweep" else self.memory.get(self.load_key, PRIOR_LOAD_S)
        if work is None:   # never measured here: the child's first status brings the estimate
            self._send(f"{WORDS('starting_task_process')} · {ESTIMATING}", None)
        else:
            self._send(str(WORDS("starting_task_process")), start + load + work)

    def progress(self, fraction: float, status: str) -> None:
        if not self.answered:
            self.answered = True
            self.memory.record(START_KEY, time.monotonic() - self.t0, average=True)
        if fraction >= 1.0:
            return   # the child's "done": the task is done once its answer is read (``finished``)
        text, left = split_left(status)
        self._send(text, left)

    def finished(self) -> None:
        self._progress(1.0, PROGRESS("done", elapsed=format_seconds(time.monotonic() - self.t0)))


# ====================================================================== the child's side (torch imported here)

def _work(payload: dict, emit: Callable[[float, str], None]) -> dict:
    """The child's work: the task ``payload["task"]`` (module docstring)."""
    cancel, ready = threading.Event(), threading.Event()   # ready: a stop request now keeps the part done
    stop_on_sigterm(cancel, ready)
    name = payload.get("task")
    if name not in NAMES:
        raise RunError(WORDS("unknown_task", x=str(name)[:40], x2=", ".join(NAMES)))
    if name == "sweep":
        return _sweep(payload, emit, cancel, ready)
    memory = CostMemory()
    load_key = "load:" + model_key(str(payload["source"]), payload.get("batch"), payload.get("seq_len"))
    work_key = cost_key(name, payload)
    schedule = Schedule(emit, {"load": memory.get(IMPORT_KEY, PRIOR_IMPORT_S) + memory.get(load_key, PRIOR_LOAD_S),
                               "work": memory.get(work_key, PRIOR_TASK_S[name])})
    schedule.emit("load", 0.0, str(WORDS("loading_model")))
    t0 = time.perf_counter()
    from explorer.fusion_engine import analyze   # torch: the child's only

    memory.record(IMPORT_KEY, time.perf_counter() - t0, average=True)
    t0 = time.perf_counter()
    analysis = analyze(str(payload["source"]), batch=payload.get("batch"), seq_len=payload.get("seq_len"))
    memory.record(load_key, time.perf_counter() - t0)
    schedule.begin("work")
    t1 = time.perf_counter()
    step = schedule.for_phase("work")
    if name == "profile":
        answer = _profile(analysis, payload, step)
    else:
        ready.set()   # the bisect checks the cancel between fused models, and answers with the chains done
        answer = _bisect(analysis, payload, step, cancel)
    if not cancel.is_set():
        memory.record(work_key, time.perf_counter() - t1)
    schedule.done()
    return answer


def _profile(analysis: Any, payload: dict, step: Callable[[float, str], None]) -> dict:
    from explorer.fusions.plan import Plan
    from explorer.fusions.rewrite import apply_plan
    from explorer.runtime.breakdown import model_breakdowns
    from explorer.runtime.measure import resolve_device, run_target, torch_dtype

    device = resolve_device(str(payload.get("device", "cpu")))
    dtype = str(payload.get("dtype", "fp32"))
    plan = Plan.from_dict(payload["plan"])
    plan.check_for(analysis.detection)
    step(0.02, str(WORDS("fusing")))
    fused = apply_plan(analysis.model.gm, analysis.detection, plan,
                       run_target(device, torch_dtype(dtype), plan.memory_format == "channels_last"))
    ridge = payload.get("ridge")
    out = model_breakdowns(analysis, fused.gm, device, dtype,
                           float(ridge) if isinstance(ridge, (int, float)) else None,
                           plan.memory_format == "channels_last", on_step=step)
    return {"breakdowns": {k: v.to_dict() for k, v in out.items()}}


def _bisect(analysis: Any, payload: dict, step: Callable[[float, str], None], cancel: threading.Event) -> dict:
    from explorer.runtime.bisect import default_fuse, precision_bisect
    from explorer.runtime.measure import resolve_device, run_target, torch_dtype

    device = resolve_device(str(payload.get("device", "cpu")))
    dtype = str(payload.get("dtype", "fp32"))
    kernels = {str(k): str(v) for k, v in (payload.get("kernels") or {}).items()}
    result = precision_bisect(analysis, [str(i) for i in payload.get("ids") or []], device, dtype,
                              str(payload.get("mode", "both")),
                              default_fuse(analysis, kernels, run_target(device, torch_dtype(dtype))),
                              on_step=step, cancel=cancel)
    return {"bisect": result.to_dict()}


def _sweep(payload: dict, emit: Callable[[float, str], None], cancel: threading.Event,
           ready: threading.Event) -> dict:
    from explorer.sweeps.chain import sweep_chain   # no torch here: the sweep's workers load the model

    calls = [0]

    def step(fraction: float, status: str) -> None:
        calls[0] += 1
        if calls[0] > 1:   # the runner's own progress: its workers have started, and it stops them on a cancel
            ready.set()
        emit(fraction, status)

    folder = payload.get("folder")
    points = sweep_chain(str(payload["source"]), str(payload["chain_id"]), [int(b) for b in payload["batches"]],
                         [str(d) for d in payload["dtypes"]], str(payload.get("device", "cpu")),
                         payload.get("seq_len"), on_step=step, cancel=cancel,
                         folder=str(folder) if folder else None)
    return {"points": [p.to_dict() for p in points], "folder": str(folder) if folder else None,
            "cancelled": cancel.is_set()}


if __name__ == "__main__":
    if "--child" in sys.argv[1:]:
        code = child_main(_work)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)   # the answer is sent: skip the interpreter's teardown of torch and the model
    print("usage: python -m explorer.runtime.teach_tasks --child  (the task as JSON on stdin); "
          "the Learn page starts it", file=sys.stderr)
    sys.exit(2)
