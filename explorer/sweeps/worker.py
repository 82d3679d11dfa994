"""A sweep's worker: one per GPU (or one on the CPU), the same code under the local and the Ray backend.

A worker answers three kinds of task (plain dicts, so they cross a process queue or Ray's object store alike):

- ``probe``: its environment (``env.probe``: device, driver, clocks, versions, host);
- ``resolve``: load one model at one shape (``fusion_engine.analyze``) and turn every plan of the sweep into the
  plan it means for that model (``all``/``none``/patterns through ``make_plan``; a plan file checked against the
  graph with ``Plan.check_for``), each with the point's memory format and CUDA-graph switch; answers the graph
  fingerprint and the plans, from which the scheduler makes the cache keys. Nothing is timed here.
- ``measure``: one point, by ``explorer.gpu_runner.run`` (the runner's child process, its report, its paired-test
  verdicts: the one measurement path), with the clocks and the host's load sampled before and after, and where
  the point's wall time went (``PhaseClock``: the seconds of each step the runner's progress names, from starting
  its child to reading its report back).

Workers that share one device (``share`` > 1: a sweep's ``workers_per_gpu``) take turns on it: each worker
names the device's lock file (``runtime.gpulock``) and the cores of each side to the runner's child through the
environment, and runs on the waiting cores itself (its ``resolve`` tasks are host work). The child then takes the
lock after its host work (process start, imports, load, capture, detect, plan, fuse) and before its first device
allocation, and gives it back once its report is measured: one point's device work at a time, while the next
point's host work runs beside it. ``exclusive`` False (tests only) shares the device without the lock, to show
that the test's check catches overlapping sections.

Each worker's measuring children share one inductor cache (``cache_dir``, one per sweep folder: the scheduler
names it), so that a point compiles what an earlier point of the same model, shape and dtype compiled from the
cache, and what it says about compile times is this sweep's own; a cache the user set
(``TORCHINDUCTOR_CACHE_DIR``) is kept.

A task never raises: a failure (the runner's ``RunError``: a crash, a timeout, out of memory; a model that does
not load) is an answer with ``status`` "failed" and the one-line ``reason``. A worker that dies (killed, out of
host memory) is the backend's to replace.

``simulate_s`` (benchmarks only, ``benchmarks/bench_sweep.py``): a ``measure`` task sleeps that long and answers
``status`` "simulated" without measuring, and a ``resolve`` task answers made-up fingerprints without loading the
model (``simulated_resolve``), so that the scheduler's own cost per point can be timed with many light workers; no
test or sweep command uses it.
"""

from __future__ import annotations

import dataclasses
import os
import threading
import time
from typing import Any, Callable

from explorer.errors import ExplorerError
from explorer.messages import PROGRESS
from explorer.runtime import gpulock
from explorer.runtime.progress import split_left
from explorer.sweeps import env as sweep_env
from explorer.words import Reader

Progress = Callable[[float, str], None]


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())[:300]
    return text if isinstance(exc, ExplorerError) else f"{type(exc).__name__}: {text}"


class Worker:
    """The tasks of one worker (module docstring). ``gpu`` is its device as ``CUDA_VISIBLE_DEVICES`` names it
    (None: the CPU); the backend sets ``CUDA_VISIBLE_DEVICES`` so that the runner's child sees that GPU alone."""

    def __init__(self, worker_id: int, gpu: str | None, simulate_s: float | None = None, share: int = 1,
                 lock_folder: str | None = None, exclusive: bool = True) -> None:
        self.worker_id = worker_id
        self.gpu = gpu
        self.simulate_s = simulate_s
        self.share = max(1, int(share))
        self.environment = {**sweep_env.probe(gpu), "worker": worker_id, "workers_per_gpu": self.share}
        if self.share > 1 and exclusive:
            # the waiting side runs one child's start and load and a worker's resolve per extra worker: two cores
            # each; the holder keeps the rest (its torch.compile baselines compile on them)
            holder, waiting = gpulock.core_sets(waiting=2 * (self.share - 1))
            device = self.environment.get("gpu_uuid") or gpu or "cpu"
            os.environ[gpulock.LOCK_ENV] = gpulock.lock_path(str(device), lock_folder)
            os.environ[gpulock.CORES_ENV] = gpulock.format_cores(holder, waiting)
            gpulock.pin(waiting)
            self.environment["gpu_lock"] = os.environ[gpulock.LOCK_ENV]

    def handle(self, task: dict, progress: Progress | None = None, cancel: threading.Event | None = None) -> dict:
        kind = task.get("kind")
        try:
            if kind == "probe":
                self.environment = {**sweep_env.probe(self.gpu), "worker": self.worker_id}
                return {"status": "ok", "environment": self.environment}
            if kind == "resolve":
                return simulated_resolve(task) if self.simulate_s is not None else resolve(task)
            if kind == "measure":
                return self.measure(task, progress, cancel)
            return {"status": "failed", "reason": f"unknown task kind {str(kind)[:40]}"}
        except Exception as exc:  # the task boundary: one line back to the scheduler, the worker lives on
            return {"status": "failed", "reason": _one_line(exc)}

    def measure(self, task: dict, progress: Progress | None, cancel: threading.Event | None) -> dict:
        before = sweep_env.clocks(self.gpu)
        load = sweep_env.HostLoad()
        load.start()
        t0 = time.perf_counter()
        out: dict[str, Any] = {"environment": self.environment, "clocks_before": before}
        clock = PhaseClock(progress)
        if self.simulate_s is not None:
            time.sleep(self.simulate_s)
            out.update(status="simulated", reason="simulated point (benchmark of the scheduler)")
        else:
            from explorer import gpu_runner
            from explorer.fusions.plan import Plan   # imports torch: not in a simulated worker

            use_cache(task.get("cache_dir"))
            try:
                settings = gpu_runner.RunSettings.from_dict(task["settings"])
                report = gpu_runner.run(task["point"]["model"], Plan.from_dict(task["plan"]), settings,
                                        progress=clock, cancel=cancel)
                out.update(status="ok", report=report.to_dict())
            except ExplorerError as exc:
                out.update(status="failed", reason=str(exc))
        out["wall_s"] = round(time.perf_counter() - t0, 3)
        out["phase_s"] = clock.seconds()
        out["clocks_after"] = sweep_env.clocks(self.gpu)
        out["host_load"] = load.stop()
        return out


def use_cache(folder: str | None) -> None:
    """The inductor cache the runner's children use: ``folder`` (module docstring), unless the user set their own.
    Triton's own cache (our fused kernels, and the kernels inductor generates) stays the user's, shared by every
    run of this machine."""
    if folder:
        os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", folder)


_READER = Reader(PROGRESS.texts)
_WRAPPERS = ("progress.estimating", "progress.taking_longer")


class PhaseClock:
    """Where a point's wall time went: the runner's progress (its caller's clock and its child's statuses), each
    status read back as its message (``explorer.words.Reader``), timed from one step to the next. ``seconds()``:
    ``{step: seconds}`` in the order the steps began (``starting_process``: the child's start and imports;
    ``loading``: building, capturing and detecting the model; ``waiting_for_device``: the exclusive section's wait;
    ``compiling_with_torch_compile:<mode>``; ...; ``finishing``: from the child's last status to its report read
    back). Passes every call on to ``progress``."""

    def __init__(self, progress: Progress | None = None) -> None:
        self.progress = progress
        self.t0 = time.perf_counter()
        self.steps: list[tuple[float, str]] = []

    def __call__(self, fraction: float, status: str) -> None:
        if fraction < 1.0:
            label = step_of(status)
            if not self.steps or self.steps[-1][1] != label:
                self.steps.append((time.perf_counter() - self.t0, label))
        if self.progress is not None:
            self.progress(fraction, status)

    def seconds(self) -> dict[str, float]:
        end = time.perf_counter() - self.t0
        marks = self.steps + [(end, "")]
        out: dict[str, float] = {}
        if marks[0][0] > 0.0005:
            out["before_first_status"] = marks[0][0]
        for (t, label), (t_next, _) in zip(marks, marks[1:]):
            out[label] = out.get(label, 0.0) + (t_next - t)
        return {k: round(v, 3) for k, v in out.items()}


def step_of(status: str) -> str:
    """The step a progress status names: its message id without the prefix (``timing_unfused_vs_fused``), a
    compile with its mode (``compiling_with_torch_compile:default``); "other" for a text no message makes."""
    text, _left = split_left(status)
    message = _READER.parse(text)
    while message is not None and message.id in _WRAPPERS:
        inner = message.args.get("msg")
        message = inner if hasattr(inner, "id") else _READER.parse(str(inner))
    if message is None:
        return "other"
    step = message.id.split(".", 1)[-1]
    if step == "compiling_with_torch_compile":
        step += f":{message.args.get('x')}"
    return step


def resolve(task: dict) -> dict:
    """The graph fingerprint of ``task["model"]`` at its shape and every plan it asks for (module docstring).

    ``task["plans"]`` lists ``PlanSpec.to_dict()`` values; ``task["levers"]`` the (memory format, CUDA graphs)
    pairs of the sweep. Answers ``{"status": "ok", "model_fingerprint", "chains", "plans": {"label|fmt|graphs":
    plan dict or {"error": one line}}}``.
    """
    from explorer.fusion_engine import analyze
    from explorer.fusions.plan import Plan, make_plan

    try:
        model, _graph, detection = analyze(task["model"], batch=task["batch"], seq_len=task["seq_len"])
    except ExplorerError as exc:   # the explorer refuses this input (a shape the model cannot take, a bad file)
        return {"status": "refused", "reason": _one_line(exc)}
    except Exception as exc:
        return {"status": "failed", "reason": _one_line(exc)}
    plans: dict[str, Any] = {}
    for spec in task["plans"]:
        for fmt, graphs in task["levers"]:
            name = plan_slot(spec["label"], fmt, graphs)
            try:
                if spec.get("data") is not None:
                    plan = Plan.from_dict(spec["data"])
                    plan.check_for(detection)
                    plan = dataclasses.replace(plan, memory_format=fmt, cuda_graphs=bool(graphs))
                elif str(spec["accept"]).startswith(CHAIN_PREFIX):
                    plan = one_chain_plan(detection, spec["accept"][len(CHAIN_PREFIX):], fmt, bool(graphs))
                else:
                    plan = make_plan(detection, spec["accept"], memory_format=fmt, cuda_graphs=bool(graphs))
                plans[name] = plan.to_dict()
            except ExplorerError as exc:   # a plan this graph cannot take: the point is refused
                plans[name] = {"error": _one_line(exc), "refused": True}
            except Exception as exc:
                plans[name] = {"error": _one_line(exc)}
    del model
    return {"status": "ok", "model_fingerprint": detection.fingerprint, "chains": len(detection.chains),
            "plans": plans}


#: A plan that accepts one chain alone: ``chain:<chain id>`` (the Learn page's "when does it stop paying?").
CHAIN_PREFIX = "chain:"


def one_chain_plan(detection, chain_id: str, memory_format: str, cuda_graphs: bool):
    """The plan that accepts chain ``chain_id`` alone (the same id at every batch size: fx node names do not
    depend on the batch); a one-line ``PlanError`` when the graph has no such chain."""
    from explorer.errors import PlanError
    from explorer.fusions.plan import make_plan

    try:
        chain = detection.chain(chain_id)
    except KeyError:
        raise PlanError(f"chain {chain_id} is not detected in this model at this shape") from None
    others = [c.id for c in detection.chains if c.pattern == chain.pattern and c.id != chain_id]
    return make_plan(detection, [chain.pattern], reject=others, memory_format=memory_format, cuda_graphs=cuda_graphs)


def simulated_resolve(task: dict) -> dict:
    """``resolve``'s answer without loading anything (benchmarks of the scheduler only: ``simulate_s``)."""
    import hashlib

    ident = f"{task['model']}|{task['batch']}|{task['seq_len']}"
    fingerprint = "simulated-" + hashlib.sha256(ident.encode()).hexdigest()[:16]
    plans = {plan_slot(spec["label"], fmt, graphs): {"simulated": spec["label"], "memory_format": fmt,
                                                      "cuda_graphs": bool(graphs), "fingerprint": fingerprint}
             for spec in task["plans"] for fmt, graphs in task["levers"]}
    return {"status": "ok", "model_fingerprint": fingerprint, "chains": 0, "plans": plans}


def plan_slot(label: str, memory_format: str, cuda_graphs: bool) -> str:
    """The name of one resolved plan in a ``resolve`` answer."""
    return f"{label}|{memory_format}|{int(bool(cuda_graphs))}"


def pid() -> int:
    return os.getpid()
