"""Work in a child process: JSON in on stdin, JSON lines out on stdout, killed on cancel or timeout.

The parent (``run_child``) starts ``python -m <module> --child`` in a new
process session and writes the payload; the child (``child_main``) streams::

    {"progress": 0.42, "status": "timing chain 12/49"}
    {"part": {...}}              # what the work sends with emit.part (kept if the child dies)
    {"report": {...}}            # last line on success
    {"error": "one line"}        # last line on a failure the child could name

so an out-of-memory error, a CUDA fault or a hard crash ends the child, not the
caller: every failure reaches the caller as ``RunError`` with one line (for a
crash, the exit status and the last line of the child's stderr). ``cancel``
(a ``threading.Event``) and the timeout kill the child's whole process group
(torch.compile starts workers). Starting, killing and the child's stdout are
``explorer.childproc``'s, shared with the isolated loader.

Memory: when the model is a file (not a zoo name) and the run is on the CPU,
the child lowers its own address-space limit (``RLIMIT_AS``) before the work
starts (``limit_host_memory``): its size after importing torch plus
``HOST_BUDGETS`` times the memory budget an untrusted source is held to
(``sources.limits``: the runner keeps the graph, its fused copy, their inputs
and outputs and the compiled baselines), plus ``HOST_SLACK``. A file that
slipped past the loaders' derived sizes ends this child with one line, not
the machine. A CUDA run gets no such limit: the CUDA driver reserves far
more address space than it uses, and fails to start under ``RLIMIT_AS``; its
host memory is bounded by the loaders' derived sizes alone.

Test hook (a real code path, kept on purpose): with the environment variable
``FUSION_EXPLORER_CHILD_CRASH_TEST=1`` the child writes one line to stderr and
exits with status 3 before doing anything, so tests can prove that a crashing
child becomes a ``RunError`` and the caller survives.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from typing import Any, Callable

from explorer.childproc import child_env, kill, parse_message, signal_name, start, take_stdout, wait_group_gone
from explorer.errors import ExplorerError, RunError
from explorer.messages import RUN

CRASH_TEST_ENV = "FUSION_EXPLORER_CHILD_CRASH_TEST"
HOST_BUDGETS = 4
HOST_SLACK = 2**30


def _runs_on_cpu(payload: dict) -> bool:
    settings = payload.get("settings") if isinstance(payload.get("settings"), dict) else {}
    device = str(settings.get("device", "auto"))
    if device == "cpu":
        return True
    return device == "auto" and not any(os.path.exists(p) for p in ("/dev/nvidiactl", "/dev/nvidia0", "/dev/kfd"))


def limit_host_memory(payload: dict) -> int:
    """Lower this child's ``RLIMIT_AS`` for a CPU run of a file source (see the module docstring);
    returns the limit set, or 0 when none is (a zoo model, a CUDA run, no ``RLIMIT_AS``)."""
    source = payload.get("source")
    if not isinstance(source, str) or not os.path.exists(source) or not _runs_on_cpu(payload):
        return 0
    import torch  # noqa: F401  (the interpreter's baseline includes torch)

    from explorer.sources import isolate, limits

    return isolate.limit_address_space(HOST_BUDGETS * limits.memory_budget() + HOST_SLACK)


def run_child(module: str, payload: dict, timeout_s: float,
              progress: Callable[[float, str], None] | None = None,
              cancel: threading.Event | None = None,
              on_part: Callable[[Any], None] | None = None,
              on_start: Callable[[int], None] | None = None,
              stop_grace_s: float = 0.0, reap_group: bool = False) -> dict:
    """Run ``python -m <module> --child`` with ``payload`` as JSON on stdin; return its report.

    ``progress(fraction, status)`` is called from this thread as the child
    reports, ``on_part(value)`` for each ``{"part": value}`` line (what the work
    sent with ``emit.part``: kept by the caller even if the child dies later),
    ``on_start(pid)`` once the child has started.
    Raises ``RunError`` with one line on any failure, including
    ``RunError("cancelled")`` when ``cancel`` is set and a timeout.

    ``stop_grace_s`` (0 for a run: killed at once): on a cancel or the timeout the child is first sent
    ``SIGTERM`` (``stop_on_sigterm`` makes that its own cancel) and given that many seconds to stop its
    own workers and answer; a report it sends after a cancel is returned (the caller's ``cancel`` says
    it was cancelled: the part done before it), after the timeout it is not. ``reap_group``: when the
    child has ended, kill what is left of its process group (workers it started, were it killed).
    """
    payload = json.dumps(payload)
    env = child_env()
    env.setdefault("PYTHONUNBUFFERED", "1")
    stderr_file = tempfile.TemporaryFile(mode="w+b")
    try:
        proc = start(["-m", module, "--child"], env, stderr_file)
    except OSError as exc:
        stderr_file.close()
        raise RunError(RUN("start_failed", reason=str(exc))) from None
    lines: queue.Queue = queue.Queue()

    def read_stdout() -> None:
        assert proc.stdout is not None
        for raw in proc.stdout:
            lines.put(raw)
        lines.put(None)

    reader = threading.Thread(target=read_stdout, name="child-stdout", daemon=True)
    reader.start()
    if on_start is not None:
        on_start(proc.pid)
    try:
        assert proc.stdin is not None
        try:
            proc.stdin.write(payload.encode())
            proc.stdin.close()
        except BrokenPipeError:
            pass  # the child died at once; its exit status says why below
        deadline = time.monotonic() + float(timeout_s)
        result: dict | None = None
        error: str | None = None
        eof = False
        stopping: tuple[str, float] | None = None   # (why, the end of its grace) once the child was asked to stop
        while not eof:
            why = "cancelled" if cancel is not None and cancel.is_set() else \
                "timed_out" if time.monotonic() > deadline else None
            if why is not None and stop_grace_s > 0 and stopping is None:
                stopping = (why, time.monotonic() + float(stop_grace_s))
                _terminate(proc)
            elif why is not None and (stopping is None or time.monotonic() > stopping[1]):
                kill(proc)
                why = stopping[0] if stopping is not None else why
                raise RunError(RUN("cancelled") if why == "cancelled" else RUN("timed_out", limit=timeout_s))
            try:
                raw = lines.get(timeout=0.1)
            except queue.Empty:
                continue
            if raw is None:
                eof = True
                break
            message = parse_message(raw)
            if message is None:
                continue
            if "progress" in message and progress is not None:
                progress(float(message["progress"]), str(message.get("status", "")))
            elif "part" in message:
                if on_part is not None:
                    on_part(message["part"])
            elif "report" in message:
                result = message["report"]
            elif "error" in message:
                error = str(message["error"])
        # stdout closed: the child is exiting
        try:
            code = proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            kill(proc)
            code = proc.wait()
        if stopping is not None and (stopping[0] == "timed_out" or result is None):
            raise RunError(RUN("cancelled") if stopping[0] == "cancelled" else RUN("timed_out", limit=timeout_s))
        if error is not None:
            raise RunError(error)
        if result is not None and code == 0:
            return result
        raise RunError(_crash_message(code, _last_stderr_line(stderr_file)))
    finally:
        if proc.poll() is None:
            kill(proc)
        if reap_group:
            _kill_group(proc.pid)
        stderr_file.close()


def _terminate(proc: subprocess.Popen) -> None:
    """Ask the child alone (not its group: its workers are its own to stop) to stop: ``SIGTERM``."""
    try:
        proc.send_signal(signal.SIGTERM)
    except OSError:
        pass


def _kill_group(pgid: int) -> None:
    """Kill what is left of a reaped child's process group (its number cannot be reused while the group lives), and
    wait until it is gone: a child that stopped on a cancel leaves its sweep's workers, killed here, to be reaped by
    the system a moment later, and the caller reports the task ended as soon as this returns."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except OSError:
        return   # nothing left: the usual case
    wait_group_gone(pgid)


def stop_on_sigterm(cancel: threading.Event, ready: threading.Event) -> None:
    """The child's side of ``stop_grace_s``: once the work has set ``ready`` (it has a part worth sending),
    ``SIGTERM`` sets ``cancel`` instead of ending the process, so the work stops its workers and sends what it
    has; before that, the process ends at once (its caller kills what is left of its group)."""
    def stop(_signum: int, _frame: Any) -> None:
        if not ready.is_set():
            os._exit(128 + signal.SIGTERM)
        cancel.set()

    signal.signal(signal.SIGTERM, stop)


def _last_stderr_line(f: Any) -> str:
    try:
        f.seek(0, os.SEEK_END)
        size = f.tell()
        f.seek(max(0, size - 16384))
        text = f.read().decode("utf-8", "replace")
    except (OSError, ValueError):
        return ""
    kept = [line.strip() for line in text.splitlines() if line.strip()]
    return kept[-1][:300] if kept else ""


def _crash_message(code: int | None, last: str) -> str:
    if code is not None and code < 0:
        why = RUN("killed_oom" if -code == signal.SIGKILL else "killed", signal=signal_name(-code))
    elif code == 0:
        why = RUN("no_report")
    else:
        why = RUN("crashed", code=code)
    return RUN("last_stderr", why=why, line=last) if last else why


def child_main(work: Callable[[dict, Callable[[float, str], None]], dict]) -> int:
    """The child's side: read the JSON payload, call ``work(payload, emit)``, send its report.

    The protocol owns the real stdout; anything else the work prints goes to
    stderr. Every failure becomes one ``{"error": ...}`` line (the trace goes to
    stderr, where the parent keeps the last line for crashes).
    """
    if os.environ.get(CRASH_TEST_ENV) == "1":
        sys.stderr.write(f"{CRASH_TEST_ENV}=1: simulated crash, exiting with status 3\n")
        sys.stderr.flush()
        os._exit(3)
    send = take_stdout(default=_json_default)    # anything else printing to fd 1 goes to stderr

    def emit(fraction: float, status: str) -> None:
        send({"progress": round(float(min(max(fraction, 0.0), 1.0)), 4), "status": status})

    # emit.part(value): one {"part": value} line, which the parent keeps even if this process dies later
    emit.part = lambda value: send({"part": _jsonable(value)})  # type: ignore[attr-defined]

    try:
        payload = json.loads(sys.stdin.read() or "{}")
        limit_host_memory(payload if isinstance(payload, dict) else {})
        report = work(payload, emit)
        send({"report": _jsonable(report)})
        return 0
    except ExplorerError as exc:
        send({"error": str(exc)})
        return 0
    except Exception as exc:  # OOM, CUDA errors, bugs: one line for the user, the trace on stderr
        traceback.print_exc()
        send({"error": describe_failure(exc)})
        return 0


def describe_failure(exc: BaseException) -> str:
    first = (str(exc).strip().splitlines() or [""])[0][:240]
    if type(exc).__name__ == "OutOfMemoryError":  # torch.cuda.OutOfMemoryError, without importing torch
        return RUN("gpu_oom", reason=first)
    text = f"{type(exc).__name__}: {first}"
    if "CUDA" in first or "cuda" in type(exc).__name__.lower() or "cuDNN" in first:
        return RUN("cuda_error", reason=text)
    if "can't allocate memory" in first or "not enough memory" in first.lower():
        return RUN("host_oom", reason=text)
    return RUN("failed", reason=text)


def _json_default(obj: Any) -> Any:
    return str(obj)


def _jsonable(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, float) and obj != obj:
        return None
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    return str(obj)
