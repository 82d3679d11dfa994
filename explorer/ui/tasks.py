"""Long computations the pages start and poll: the Learn page's profile, sweep and bisect, the Graph page's compile map.

A task is a ``TaskJob``: a thread of this process that only waits. The Learn page's tasks (``start_child``) run
in a child process through ``explorer.runtime.teach_tasks`` (``runtime.child``, as a run does: its time limit,
its cancel, its memory budget; a child that crashes, is killed or runs past its limit is one line in ``error``),
so the app never loads or runs the model for them; the Graph page's compile map (``start``) is a function that
starts its own child (``runtime.compile_map``). Its progress says the time left, counted from the click
(``TaskJob.view``). One task per name at a time; its result (or its one-line error) stays until the same name
starts again.

Session state: ``tasks`` ({name: TaskJob}), initialised by ``explorer.ui.state``.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from typing import Any, Callable

import streamlit as st

from explorer.errors import ExplorerError
from explorer.runtime.progress import Countdown, split_left, with_left

#: The part of a task done before its own rate prices the rest (fewer steps say too little).
MIN_RATE_FRACTION = 0.1


@dataclasses.dataclass
class TaskJob:
    """One background computation: ``fn(*args, on_step=..., cancel=...)``'s result or error, and its progress."""

    name: str
    key: str
    cancel: threading.Event
    fraction: float = 0.0
    message: str = ""
    result: Any = None
    error: str | None = None
    done: bool = False
    cancelled: bool = False
    started: float = dataclasses.field(default_factory=time.time)   # the click
    finished: float | None = None
    thread: threading.Thread | None = None
    countdown: Countdown | None = None
    pid: int | None = None          # the task's child process, once started (``start_child``)

    def __post_init__(self) -> None:
        self.countdown = Countdown(self.started, "")

    def progress(self, fraction: float, message: str) -> None:
        """The ``on_step`` callback the computation calls. A status without its own time left (a bisect's
        steps, a profile's) gets one from the rate its steps go at, once a tenth of them is done: elapsed
        × (1 − done) / done; a sweep's status brings its own (``explorer.sweeps.chain``)."""
        fraction = min(max(float(fraction), 0.0), 1.0)
        text, left = split_left(str(message))
        if left is None and MIN_RATE_FRACTION <= fraction < 1.0:
            elapsed = time.time() - self.started
            message = with_left(text, elapsed * (1.0 - fraction) / fraction)
        self.countdown.update(fraction, str(message))
        self.fraction = self.countdown.view()[0] if split_left(str(message))[1] is not None else fraction
        self.message = str(message)

    def view(self) -> tuple[float, str, float]:
        """(the bar's fraction, the status with the time left as of now, seconds since the click)."""
        fraction, _text, left, elapsed = self.countdown.view()
        if left is None:
            fraction = self.fraction
        return fraction, self.countdown.line(), elapsed

    @property
    def running(self) -> bool:
        return not self.done


def _tasks() -> dict[str, TaskJob]:
    ss = st.session_state
    if "tasks" not in ss or ss.tasks is None:
        ss.tasks = {}
    return ss.tasks


def _run(job: TaskJob, fn: Callable[..., Any], args: tuple) -> None:
    try:
        job.result = fn(*args, on_step=job.progress, cancel=job.cancel)
        job.cancelled = job.cancel.is_set()
    except ExplorerError as exc:
        if job.cancel.is_set():
            job.cancelled = True   # the user's cancel, not a failure
        else:
            job.error = str(exc)
    except Exception as exc:  # the task boundary: one line for the page, never a traceback
        text = str(exc).strip().splitlines()
        job.error = f"{type(exc).__name__}: {text[0][:300] if text else ''}"
    finally:
        job.finished = time.time()
        job.done = True


def _launch(name: str, key: str, fn: Callable[..., Any], args: Callable[[TaskJob], tuple]) -> TaskJob:
    """Task ``name`` running ``fn(*args(job), on_step, cancel)`` in a thread; one still running is returned."""
    tasks = _tasks()
    job = tasks.get(name)
    if job is not None and job.running:
        return job
    job = TaskJob(name=name, key=key, cancel=threading.Event())
    job.thread = threading.Thread(target=_run, args=(job, fn, args(job)), name=f"fusion-explorer-{name}",
                                  daemon=True)
    tasks[name] = job
    job.thread.start()
    return job


def start(name: str, key: str, fn: Callable[..., Any], *args: Any) -> TaskJob:
    """Start ``fn(*args, on_step, cancel)`` as task ``name`` (``key`` says what it computes); a task of that
    name still running is returned unchanged."""
    return _launch(name, key, fn, lambda _job: args)


def _child_task(payload: dict, timeout_s: float | None, job: TaskJob, *, on_step: Callable[[float, str], None],
                cancel: threading.Event) -> Any:
    from explorer.runtime.teach_tasks import run_task

    def started(pid: int) -> None:
        job.pid = pid

    return run_task(job.name, payload, timeout_s, progress=on_step, cancel=cancel, on_start=started)


def start_child(name: str, key: str, payload: dict, timeout_s: float | None = None) -> TaskJob:
    """Start the Learn page's task ``name`` ("profile", "bisect", "sweep": ``runtime.teach_tasks.run_task``) in a
    child process, with ``payload`` and a time limit (None: the task's default); ``key`` says what it computes.
    The job's ``result`` is the child's answer; a task of that name still running is returned unchanged."""
    return _launch(name, key, _child_task, lambda job: (dict(payload), timeout_s, job))


def get(name: str) -> TaskJob | None:
    """The task of that name (running or finished), or None."""
    return _tasks().get(name)


def cancel(name: str) -> None:
    """Ask a running task to stop after its current step."""
    job = get(name)
    if job is not None and job.running:
        job.cancel.set()


def wait(name: str, timeout_s: float = 300.0, poll_s: float = 0.2) -> bool:
    """Block until the task is done (tests and scripts); True when it finished in time."""
    end = time.time() + timeout_s
    job = get(name)
    while job is not None and job.running and time.time() < end:
        time.sleep(poll_s)
    return job is None or job.done
