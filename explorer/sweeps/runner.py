"""The scheduler: a sweep's points to its workers, one at a time each, their answers into the sweep folder.

``run_sweep(spec, folder, backend=...)``:

1. opens the sweep folder (``store.SweepStore``) and starts the workers (``backends``), each of which probes its
   device; workers with different GPUs, drivers or library versions are refused unless the sweep allows it
   (``allow_mixed_gpus``), and two workers on one GPU are unless the sweep asks for that many
   (``workers_per_gpu``: they take turns on it through its exclusive device section, ``runtime.gpulock``);
2. asks a worker to **resolve** each (model, batch, sequence length) once: the graph fingerprint and every plan
   the sweep names, made for that graph (``worker.resolve``); a free worker resolves the next shape only while
   fewer points are ready than there are workers, so the first point is measured after one load, not after all
   of them (a resumed sweep loads every shape again to find its keys: that load runs beside the measuring);
3. gives each free worker the next point, the points of one shape in (dtype, levers, plan) order, so that the
   plans of one model, shape and dtype follow each other (``plan none`` after ``all``: its torch.compile
   baselines are the same compiles, read from the sweep's compile cache, ``compile_cache``). Its cache key
   (``spec.cache_key``: fingerprints, shape, dtype, levers, that worker's device, driver, torch and Triton) is
   looked up first, and a point measured already is counted as cached and skipped (``force`` measures it
   again); otherwise the worker **measures** it with ``gpu_runner.run``, and the answer becomes one record and
   one report in the folder as soon as it arrives;
4. a point that fails (crash, timeout, out of memory, a model that does not load) is a record with its one-line
   reason, and the sweep goes on; one the explorer refuses before measuring it (a shape the model cannot take,
   such as BERT-base at 1024 tokens, a plan that does not apply to the graph) is recorded "refused", not
   "failed"; a worker that dies is replaced (``backend.restart``) and its point is tried once more before it is
   recorded as failed;
5. at the end (also when cancelled or interrupted) writes ``results.parquet`` and the final progress.

``stop_after_s`` (a device lent for a fixed time): no point starts that, at the mean wall time of the points
measured so far, would end more than that many seconds after the sweep began; the sweep then ends "interrupted"
with every started point recorded, and the same command resumes it.

Progress (``SweepProgress``: points done, failed, cached, running, restarts, and the time left: the mean wall time
of the points measured so far times those left, over the workers) goes to the ``progress`` callback and to the
folder's ``progress.json`` about once a second, which the app's Sweeps page shows live.
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import os
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable

from explorer.messages import SWEEPS
from explorer.runtime.progress import estimating, format_seconds, with_left
from explorer.sweeps import backends as sweep_backends
from explorer.sweeps import env as sweep_env
from explorer.sweeps.spec import (Point, SweepError, SweepSpec, cache_key, expand, key_fields, plan_by_label,
                                  plan_fingerprint, run_settings)
from explorer.sweeps.store import SweepStore, make_record
from explorer.sweeps.worker import plan_slot

BACKENDS = ("local", "ray")
PROGRESS_EVERY_S = 1.0


@dataclasses.dataclass
class SweepProgress:
    """Where a sweep stands (module docstring); ``status`` is running, done, cancelled or interrupted."""

    total: int
    done: int = 0
    failed: int = 0
    refused: int = 0
    cached: int = 0
    running: int = 0
    restarts: int = 0
    elapsed_s: float = 0.0
    left_s: float | None = None
    status: str = "running"
    message: str = ""

    @property
    def finished(self) -> int:
        return self.done + self.failed + self.refused + self.cached

    @property
    def fraction(self) -> float:
        return self.finished / self.total if self.total else 1.0

    def line(self) -> str:
        """``5/8 points: 3 measured, 1 failed, 1 cached, 1 running · about 40 s left``."""
        counts = dict(n=self.finished, n2=self.total, n3=self.done, n4=self.failed, n5=self.cached, n6=self.running)
        text = (SWEEPS("points_measured_failed_cached_2", **counts, n7=self.restarts) if self.restarts
                else SWEEPS("points_measured_failed_cached", **counts))
        if self.refused:
            text = SWEEPS("and_refused", msg=text, n=self.refused)
        if self.status in ("done", "cancelled", "interrupted"):
            return SWEEPS(self.status, msg=text, msg2=format_seconds(self.elapsed_s))
        if self.status != "running":
            return f"{text} · {self.status} in {format_seconds(self.elapsed_s)}"
        return estimating(text) if self.left_s is None else with_left(text, self.left_s)

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "fraction": round(self.fraction, 4), "line": self.line(),
                "updated_unix": time.time()}


@dataclasses.dataclass
class SweepSummary:
    """What ``run_sweep`` returns: the folder, the final progress, the workers' environments, the records."""

    folder: Path
    progress: SweepProgress
    workers: list[dict]
    backend: str
    records: list[dict]


def check_workers(environments: list[dict], allow_mixed: bool, workers_per_gpu: int = 1) -> None:
    """Refuse (one line) more workers on one GPU than ``workers_per_gpu``, and workers on different devices or
    versions unless allowed."""
    seen: dict[str, list] = collections.defaultdict(list)
    for env in environments:
        uuid = env.get("gpu_uuid")
        if env.get("device_kind") == "cuda" and uuid:
            seen[uuid].append(env.get("worker"))
            if len(seen[uuid]) > max(1, workers_per_gpu):
                a, b = seen[uuid][0], seen[uuid][-1]
                raise SweepError(f"workers {a} and {b} were given the same GPU {uuid}: "
                                 + ("each worker needs a GPU of its own" if workers_per_gpu <= 1 else
                                    f"more than the {workers_per_gpu} workers per GPU the sweep asks for"))
    if allow_mixed:
        return
    kinds = collections.OrderedDict()
    for env in environments:
        what = (env.get("device_name"), env.get("driver"), env.get("torch"), env.get("triton"))
        kinds.setdefault(what, env.get("worker"))
    if len(kinds) > 1:
        (a, wa), (b, wb) = list(kinds.items())[:2]
        raise SweepError(f"workers differ: {_describe(a)} on worker {wa}, {_describe(b)} on worker {wb}; "
                         "their numbers would not compare: set allow_mixed_gpus (--allow-mixed-gpus) to sweep anyway")


def _describe(what: tuple) -> str:
    name, driver, torch_v, triton_v = what
    return f"{name} (driver {driver}, torch {torch_v}, Triton {triton_v})"


def make_backend(name: str, spec: SweepSpec, ray_address: str | None = None, cpu_workers: int = 1,
                 simulate_s: float | None = None) -> Any:
    """The backend ``name`` ("local" or "ray") for ``spec``'s device setting."""
    device = spec.settings.device
    if name == "local":
        gpus = [] if device == "cpu" else sweep_env.visible_gpus()
        if device == "cuda" and not gpus:
            raise SweepError("device cuda was asked for, but no GPU is visible (nvidia-smi lists none)")
        return sweep_backends.LocalBackend(gpus, cpu_workers=cpu_workers, simulate_s=simulate_s,
                                           workers_per_gpu=spec.settings.workers_per_gpu)
    if name == "ray":
        if device == "cuda" and ray_address is None and not sweep_env.visible_gpus():
            raise SweepError("device cuda was asked for, but no GPU is visible (nvidia-smi lists none)")
        return sweep_backends.RayBackend(address=ray_address, cpu_workers=cpu_workers, simulate_s=simulate_s,
                                         use_gpus=device != "cpu", workers_per_gpu=spec.settings.workers_per_gpu)
    raise SweepError(f"unknown backend '{name[:40]}': choose local or ray")


def run_sweep(spec: SweepSpec, folder: str | Path, backend: str | Any = "local", *, ray_address: str | None = None,
              cpu_workers: int = 1, force: bool = False, retries: int = 1,
              progress: Callable[[SweepProgress], None] | None = None, cancel: threading.Event | None = None,
              simulate_s: float | None = None, stop_after_s: float | None = None) -> SweepSummary:
    """Measure every point of ``spec`` into ``folder`` (module docstring). ``backend`` is "local", "ray" or a
    backend object (not started). Raises ``SweepError`` (one line) for a folder or workers it refuses."""
    store = SweepStore.create(folder)
    points = expand(spec)
    be = make_backend(backend, spec, ray_address, cpu_workers, simulate_s) if isinstance(backend, str) else backend
    scheduler = _Scheduler(spec, store, points, be, force, retries, progress, cancel, stop_after_s)
    return scheduler.run()


def compile_cache(folder: str | os.PathLike) -> str:
    """The inductor cache the points of the sweep in ``folder`` share (``worker.use_cache``): a folder of the
    system's temporary folder named by the sweep folder's path, so that it is never part of the results and a
    resumed sweep on the same machine finds what its first part compiled."""
    digest = hashlib.sha256(str(Path(folder).resolve()).encode()).hexdigest()[:16]
    return os.path.join(tempfile.gettempdir(), "fusion-explorer-sweep-cache", digest)


def _command() -> str:
    """The command line that ran this sweep (``fusion-explorer sweep ...`` when it was the CLI)."""
    name = os.path.basename(sys.argv[0] or "python")
    if name in ("cli.py", "fusion-explorer", "__main__.py"):
        name = "fusion-explorer"
    return " ".join([name, *sys.argv[1:]])


class _Scheduler:
    def __init__(self, spec: SweepSpec, store: SweepStore, points: list[Point], backend: Any, force: bool,
                 retries: int, progress: Callable[[SweepProgress], None] | None,
                 cancel: threading.Event | None, stop_after_s: float | None = None) -> None:
        self.spec, self.store, self.points, self.backend = spec, store, points, backend
        self.stop_after_s = stop_after_s
        self.cache_dir = compile_cache(store.folder)
        self.force, self.retries = force, max(0, int(retries))
        self.callback, self.cancel = progress, cancel
        self.state = SweepProgress(total=len(points))
        self.started = time.monotonic()
        self._shown = 0.0
        self.cache = {} if force else store.measured()
        self.keys_this_run: set[str] = set()
        self.levers = sorted({(p.memory_format, p.cuda_graphs) for p in points})
        self.resolved: dict[tuple, dict] = {}
        self.to_resolve = collections.deque(dict.fromkeys(p.shape_key for p in points))
        self.waiting: dict[tuple, list[int]] = collections.defaultdict(list)
        for i, p in enumerate(points):
            self.waiting[p.shape_key].append(i)
        self.ready: collections.deque[int] = collections.deque()
        self.attempts: collections.Counter = collections.Counter()
        self.inflight: dict[int, tuple[str, Any, float, str]] = {}   # worker -> (kind, shape or point index, start, key)
        self.resolve_attempts: collections.Counter = collections.Counter()
        self.walls: list[float] = []
        self.messages: dict[int, str] = {}
        self.envs: dict[int, dict] = {}
        self._task_id = 0

    # ------------------------------------------------------------ the loop
    def run(self) -> SweepSummary:
        status = "interrupted"
        try:
            envs = self.backend.start()
            self.envs = {e.get("worker", i): e for i, e in enumerate(envs)}
            check_workers(envs, self.spec.settings.allow_mixed_gpus, self.spec.settings.workers_per_gpu)
            self.store.write_spec({"spec": self.spec.to_dict(), "backend": self.backend.name, "workers": envs,
                                   "command": _command(), "compile_cache": self.cache_dir,
                                   "stop_after_s": self.stop_after_s,
                                   "points": len(self.points),
                                   "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})
            self._emit(force=True)
            while self._work_left():
                if self.cancel is not None and self.cancel.is_set():
                    status = "cancelled"
                    break
                if self._stopping() and not self.inflight:
                    break   # "interrupted": the rest is for the next call of the same command
                self._assign()
                for event in self.backend.poll(0.2):
                    self._on_event(event)
                self._emit()
            else:
                status = "done"
        finally:
            self.state.running = 0
            self.state.status = status
            try:
                self.backend.stop()
            finally:
                self.store.write_table()
                self._emit(force=True)
        return SweepSummary(self.store.folder, self.state, list(self.envs.values()), self.backend.name,
                            self.store.results())

    def _work_left(self) -> bool:
        return bool(self.to_resolve or self.ready or self.inflight)

    def _next_id(self) -> int:
        self._task_id += 1
        return self._task_id

    def _stopping(self) -> bool:
        """Past ``stop_after_s``: a new point would end after it (the mean wall time of those measured so far)."""
        if self.stop_after_s is None:
            return False
        mean = sum(self.walls) / len(self.walls) if self.walls else 0.0
        return time.monotonic() - self.started + mean > self.stop_after_s

    def _assign(self) -> None:
        if self._stopping():
            return
        for w in self.backend.workers:
            if w in self.inflight:
                continue
            if self.to_resolve and len(self.ready) < len(self.backend.workers):
                shape = self.to_resolve.popleft()
                model, batch, seq = shape
                task = {"kind": "resolve", "id": self._next_id(), "model": model, "batch": batch, "seq_len": seq,
                        "plans": [p.to_dict() for p in self.spec.plans], "levers": self.levers}
                self.backend.submit(w, task)
                self.inflight[w] = ("resolve", shape, time.monotonic(), "")
                continue
            while self.ready:
                i = self.ready.popleft()
                task = self._measure_task(i, w)
                if task is None:
                    continue
                self.backend.submit(w, task)
                self.inflight[w] = ("measure", i, time.monotonic(), task["key"])
                self.state.running = sum(1 for k, *_ in self.inflight.values() if k == "measure")
                break

    def _measure_task(self, i: int, w: int) -> dict | None:
        """The ``measure`` task of point ``i`` for worker ``w``, or None when the point needs no measuring (cached,
        or failed already: its record is written here)."""
        point = self.points[i]
        res = self.resolved[point.shape_key]
        settings = run_settings(self.spec, point)
        env = self.envs.get(w, {})
        if res.get("status") != "ok":
            self._record_failure(i, None, None, env, settings, res.get("reason") or "the model did not load",
                                 refused=res.get("status") == "refused")
            return None
        plan = res["plans"].get(plan_slot(point.plan, point.memory_format, point.cuda_graphs)) or {}
        if "error" in plan:
            self._record_failure(i, res["model_fingerprint"], None, env, settings, plan["error"],
                                 refused=bool(plan.get("refused")))
            return None
        fields = key_fields(point, res["model_fingerprint"], plan_fingerprint(plan), env, settings)
        key = cache_key(fields)
        if key in self.cache or key in self.keys_this_run:
            self.state.cached += 1
            return None
        self.keys_this_run.add(key)
        return {"kind": "measure", "id": self._next_id(), "point": point.to_dict(), "plan": plan,
                "settings": settings.to_dict(), "key": key, "fields": fields, "cache_dir": self.cache_dir}

    def _record_failure(self, i: int, model_fp: str | None, plan_fp: str | None, env: dict, settings: Any,
                        reason: str, refused: bool = False) -> None:
        """Point ``i`` recorded unmeasured with its one-line ``reason``: "refused" where the explorer refused what
        the sweep asks of it (the model cannot take the shape, the plan does not apply: the same answer at every
        attempt), else "failed" (a crash, a timeout, a worker that died)."""
        point = self.points[i]
        fields = key_fields(point, model_fp, plan_fp, env, settings)
        status = "refused" if refused else "failed"
        record = make_record(point, cache_key(fields), fields,
                             {"status": status, "reason": reason, "environment": env}, self.attempts[i] or 1)
        self.store.append(record)
        if refused:
            self.state.refused += 1
        else:
            self.state.failed += 1

    # ------------------------------------------------------------ answers
    def _on_event(self, event: Any) -> None:
        w = event.worker
        if event.kind == "progress":
            self.messages[w] = str(event.data.get("status", ""))
            return
        kind, what, _start, key = self.inflight.pop(w)
        self.messages.pop(w, None)
        if event.kind == "died":
            self.state.restarts += 1
            self.envs[w] = self.backend.restart(w)
            if kind == "resolve":
                self.resolve_attempts[what] += 1
                if self.resolve_attempts[what] <= self.retries:
                    self.to_resolve.appendleft(what)
                else:
                    self._resolved(what, {"status": "failed", "reason": event.data["reason"] + " while loading"})
            else:
                self.attempts[what] += 1
                self.keys_this_run.discard(key)
                if self.attempts[what] <= self.retries:
                    self.ready.appendleft(what)
                else:
                    point = self.points[what]
                    self._record_failure(what, None, None, self.envs[w], run_settings(self.spec, point),
                                         f"{event.data['reason']} while measuring it, {self.attempts[what]} times")
        elif kind == "resolve":
            self._resolved(what, event.data)
        else:
            self._measured(what, event)
        self.state.running = sum(1 for k, *_ in self.inflight.values() if k == "measure")

    def _resolved(self, shape: tuple, answer: dict) -> None:
        self.resolved[shape] = answer
        plans = {p.label: i for i, p in enumerate(self.spec.plans)}
        dtypes = {d: i for i, d in enumerate(self.spec.dtypes)}

        def order(i: int) -> tuple:
            p = self.points[i]
            return (dtypes.get(p.dtype, 0), p.memory_format, p.cuda_graphs, p.baselines, plans.get(p.plan, 0), i)

        self.ready.extend(sorted(self.waiting.pop(shape, []), key=order))

    def _measured(self, i: int, event: Any) -> None:
        answer = event.data
        point = self.points[i]
        res = self.resolved[point.shape_key]
        plan = res["plans"][plan_slot(point.plan, point.memory_format, point.cuda_graphs)]
        env = answer.get("environment") or self.envs.get(event.worker, {})
        settings = run_settings(self.spec, point)
        fields = key_fields(point, res["model_fingerprint"], plan_fingerprint(plan), env, settings)
        key = cache_key(fields)
        record = make_record(point, key, fields, answer, self.attempts[i] + 1)
        self.store.append(record, answer.get("report"))
        if record["status"] == "failed":
            self.state.failed += 1
        else:
            self.state.done += 1
        if isinstance(answer.get("wall_s"), (int, float)):
            self.walls.append(float(answer["wall_s"]))

    # ------------------------------------------------------------ progress
    def _left_s(self) -> float | None:
        if not self.walls:
            return None
        mean = sum(self.walls) / len(self.walls)
        workers = max(1, len(self.backend.workers))
        now = time.monotonic()
        queued = self.state.total - self.state.finished - self.state.running
        running = sum(max(0.0, mean - (now - start)) for kind, _, start, _k in self.inflight.values() if kind == "measure")
        return (queued * mean + running) / workers

    def _emit(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._shown < PROGRESS_EVERY_S:
            return
        self._shown = now
        self.state.elapsed_s = round(now - self.started, 2)
        self.state.left_s = None if self.state.status != "running" else self._left_s()
        self.state.message = "; ".join(f"worker {w}: {m}" for w, m in sorted(self.messages.items()))[:500]
        try:
            self.store.write_progress(self.state.to_dict())
        except OSError:
            pass   # progress is for watching; the journal is what counts
        if self.callback is not None:
            self.callback(dataclasses.replace(self.state))
