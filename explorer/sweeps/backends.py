"""Where a sweep's workers run: processes of this host (``LocalBackend``) or Ray Core actors (``RayBackend``).

Both give the scheduler (``explorer.sweeps.runner``) the same four calls, one task in flight per worker:

    start() -> [environment of each worker]        (each worker probes itself: ``worker.Worker``)
    submit(worker, task)                           (a ``probe``/``resolve``/``measure`` dict)
    poll(timeout_s) -> [Event]                     (a result, a progress line, or a worker's death)
    restart(worker) -> environment                 (a dead worker replaced)
    stop()

**Local**: one process per visible GPU (``CUDA_VISIBLE_DEVICES`` set to that GPU before the worker starts, so the
runner's child sees it alone), or ``cpu_workers`` processes on the CPU (one by default: on a CPU, two measurements
at once would time each other). ``workers_per_gpu`` > 1 starts that many workers per GPU (or on the CPU), which
take turns on it through its exclusive device section (``worker.Worker``'s ``share``, ``runtime.gpulock``). Processes are started with ``spawn``: a worker holds no state of the parent. A
worker whose process ends while it holds a task is reported dead, with its exit status, and restarted. A worker's
measurement runs in a child of its own session (``runtime.child``), which a killed worker would leave running: the
backend notes each worker's children as it polls (``/proc``) and kills their process groups when the worker dies.

**Ray**: one actor per GPU of the cluster, each created with ``num_gpus=1`` (Ray sets ``CUDA_VISIBLE_DEVICES``
for it and never gives one GPU to two actors), or ``cpu_workers`` actors with ``num_cpus`` each when the cluster
has no GPU. ``workers_per_gpu`` = N > 1: N actors per GPU, each with ``num_gpus=1/N`` (Ray places N of them on
each GPU), taking turns through the device's section as local workers do. ``max_restarts`` lets Ray restart an actor that dies; a task in flight then fails with
``RayActorError``, which becomes a death event (the scheduler retries the point once). With ``address`` None a
local Ray is started (and shut down at the end); otherwise ``ray.init(address=...)`` joins an existing cluster,
whose nodes must have this package installed. Results (each point's whole report) come back through Ray's object
store to the driver, which alone writes the sweep folder.

``simulate_s`` is passed to every worker (``worker.Worker``: benchmarks of the scheduler only).
"""

from __future__ import annotations

import dataclasses
import multiprocessing as mp
import os
import queue
import signal
import time
from typing import Any

from explorer.childproc import ROOT
from explorer.sweeps.spec import SweepError
from explorer.sweeps.worker import Worker

RAY_INSTALL = "the Ray backend needs Ray: pip install 'fusion-explorer[ray]' (or pip install ray)"
START_TIMEOUT_S = 300.0


@dataclasses.dataclass
class Event:
    """What ``poll`` reports: ``kind`` is "result" (``data``: the task's answer), "progress" (``data``: fraction and
    status) or "died" (``data``: {"reason": one line})."""

    kind: str
    worker: int
    task_id: int
    data: dict


# ====================================================================== local processes

def _local_main(worker_id: int, gpu: str | None, tasks: Any, events: Any, simulate_s: float | None,
                share: int = 1, lock_folder: str | None = None, exclusive: bool = True) -> None:
    """A local worker process: probe, then answer tasks until ``None``."""
    if gpu is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = gpu
    worker = Worker(worker_id, gpu, simulate_s, share, lock_folder, exclusive)
    events.put(("hello", worker_id, -1, worker.environment))
    while True:
        task = tasks.get()
        if task is None:
            return
        task_id = int(task.get("id", -1))

        def progress(fraction: float, status: str, task_id: int = task_id) -> None:
            events.put(("progress", worker_id, task_id, {"fraction": fraction, "status": status}))

        events.put(("result", worker_id, task_id, worker.handle(task, progress)))


def _children(pid: int) -> list[int]:
    """The child processes of ``pid`` (Linux ``/proc``; [] elsewhere)."""
    try:
        with open(f"/proc/{pid}/task/{pid}/children", encoding="ascii") as f:
            return [int(c) for c in f.read().split()]
    except (OSError, ValueError):
        return []


def _kill_orphan(pid: int) -> None:
    """Kill the process group of a dead worker's measurement child, if ``pid`` is still that child."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmdline = f.read()
    except OSError:
        return
    if b"explorer.gpu_runner" not in cmdline:
        return   # gone, or the number was reused by another process
    try:
        os.killpg(pid, signal.SIGKILL)   # the child leads a session of its own (childproc.start)
    except OSError:
        pass


class LocalBackend:
    """Worker processes of this host (module docstring)."""

    name = "local"

    def __init__(self, gpus: list[str] | None = None, cpu_workers: int = 1, simulate_s: float | None = None,
                 workers_per_gpu: int = 1, lock_folder: str | None = None, exclusive: bool = True) -> None:
        self.share = max(1, int(workers_per_gpu))
        self.gpus: list[str | None] = ([g for g in gpus for _ in range(self.share)] if gpus else
                                       [None] * (self.share if self.share > 1 else max(1, int(cpu_workers))))
        self.simulate_s = simulate_s
        self.lock_folder, self.exclusive = lock_folder, exclusive
        self._ctx = mp.get_context("spawn")
        self._events = self._ctx.Queue()
        self._procs: dict[int, Any] = {}
        self._tasks: dict[int, Any] = {}
        self._busy: dict[int, int] = {}        # worker -> task id in flight
        self._kids: dict[int, list[int]] = {}  # worker -> its child processes when last polled
        self.environments: dict[int, dict] = {}

    def _spawn(self, w: int) -> None:
        self._tasks[w] = self._ctx.Queue()
        proc = self._ctx.Process(target=_local_main, name=f"fusion-explorer-sweep-worker-{w}",
                                 args=(w, self.gpus[w], self._tasks[w], self._events, self.simulate_s, self.share,
                                       self.lock_folder, self.exclusive), daemon=True)
        proc.start()
        self._procs[w] = proc

    def _wait_hello(self, waiting: set[int]) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while waiting:
            if time.monotonic() > deadline:
                raise SweepError(f"worker(s) {sorted(waiting)} did not start within {START_TIMEOUT_S:g} s")
            try:
                kind, w, _tid, data = self._events.get(timeout=0.5)
            except queue.Empty:
                dead = [x for x in waiting if not self._procs[x].is_alive()]
                if dead:
                    raise SweepError(f"worker {dead[0]} ended while starting (exit status "
                                     f"{self._procs[dead[0]].exitcode})") from None
                continue
            if kind == "hello":
                self.environments[w] = data
                waiting.discard(w)

    def start(self) -> list[dict]:
        for w in range(len(self.gpus)):
            self._spawn(w)
        self._wait_hello(set(range(len(self.gpus))))
        return [self.environments[w] for w in range(len(self.gpus))]

    @property
    def workers(self) -> list[int]:
        return list(range(len(self.gpus)))

    def submit(self, worker: int, task: dict) -> None:
        self._busy[worker] = int(task["id"])
        self._tasks[worker].put(task)

    def poll(self, timeout_s: float = 0.2) -> list[Event]:
        out: list[Event] = []
        alive = {w: p.is_alive() for w, p in self._procs.items()}   # before draining: a result already sent wins
        for w, proc in self._procs.items():
            if alive[w] and w in self._busy:
                self._kids[w] = _children(proc.pid)
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                kind, w, tid, data = self._events.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                break
            if kind == "result" and self._busy.get(w) == tid:
                del self._busy[w]
                out.append(Event("result", w, tid, data))
            elif kind == "progress" and self._busy.get(w) == tid:
                out.append(Event("progress", w, tid, data))
            if out and any(e.kind == "result" for e in out):
                break
        for w, tid in list(self._busy.items()):
            if not alive.get(w, True):
                code = self._procs[w].exitcode
                del self._busy[w]
                for child in self._kids.pop(w, []):
                    _kill_orphan(child)
                out.append(Event("died", w, tid, {"reason": f"worker {w} died (exit status {code})"}))
        return out

    def restart(self, worker: int) -> dict:
        proc = self._procs.get(worker)
        if proc is not None and proc.is_alive():
            proc.kill()
        if proc is not None:
            proc.join(timeout=10)
        self._spawn(worker)
        self._wait_hello({worker})
        return self.environments[worker]

    def pids(self) -> dict[int, int]:
        return {w: p.pid for w, p in self._procs.items()}

    def stop(self) -> None:
        """End every worker; a measurement still in flight (a cancelled sweep) is killed with its process group."""
        in_flight = [c for w, p in self._procs.items() if w in self._busy
                     for c in (_children(p.pid) if p.is_alive() else self._kids.get(w, []))]
        for w, q in self._tasks.items():
            if self._procs[w].is_alive():
                try:
                    q.put(None)
                except (OSError, ValueError):
                    pass
        for child in in_flight:
            _kill_orphan(child)
        end = time.monotonic() + 5
        for proc in self._procs.values():
            proc.join(timeout=max(0.1, end - time.monotonic()))
            if proc.is_alive():
                proc.kill()
                proc.join(timeout=5)
        self._events.close()


# ====================================================================== Ray actors

def import_ray():
    """``ray``, or one line saying how to install it."""
    try:
        import ray
    except ImportError:
        raise SweepError(RAY_INSTALL) from None
    return ray


class _RayWorker:
    """The actor: a ``Worker`` on the GPU Ray gave it (``ray.get_gpu_ids()``), or on the CPU."""

    def __init__(self, worker_id: int, on_gpu: bool, simulate_s: float | None, share: int = 1,
                 lock_folder: str | None = None, exclusive: bool = True) -> None:
        import ray

        gpu = None
        if on_gpu:
            ids = ray.get_gpu_ids()
            gpu = str(ids[0]) if ids else None
        self.worker = Worker(worker_id, gpu, simulate_s, share, lock_folder, exclusive)

    def environment(self) -> dict:
        return self.worker.environment

    def handle(self, task: dict) -> dict:
        return self.worker.handle(task)

    def pid(self) -> int:
        return os.getpid()


class RayBackend:
    """Ray Core actors, one per GPU (module docstring)."""

    name = "ray"

    def __init__(self, address: str | None = None, cpu_workers: int = 1, cpus_per_worker: float = 1.0,
                 simulate_s: float | None = None, max_restarts: int = 3, num_cpus: int | None = None,
                 use_gpus: bool = True, workers_per_gpu: int = 1, lock_folder: str | None = None,
                 exclusive: bool = True) -> None:
        self.ray = import_ray()
        self.address = address
        self.cpu_workers = max(1, int(cpu_workers))
        self.cpus_per_worker = float(cpus_per_worker)
        self.simulate_s = simulate_s
        self.max_restarts = int(max_restarts)
        self.num_cpus = num_cpus
        self.use_gpus = use_gpus
        self.share = max(1, int(workers_per_gpu))
        self.lock_folder, self.exclusive = lock_folder, exclusive
        self._started_ray = False
        self._actors: dict[int, Any] = {}
        self._inflight: dict[Any, tuple[int, int]] = {}    # ref -> (worker, task id)
        self.on_gpu = False
        self.environments: dict[int, dict] = {}

    def _init_ray(self) -> None:
        ray = self.ray
        if ray.is_initialized():
            return
        if self.address:
            try:
                ray.init(address=self.address, log_to_driver=False)
            except Exception as exc:  # a wrong address, a cluster of another Ray version
                raise SweepError(f"cannot join the Ray cluster at {self.address[:200]}: "
                                 f"{' '.join(str(exc).split())[:200]}") from None
            return
        path = os.environ.get("PYTHONPATH", "")
        ray.init(include_dashboard=False, log_to_driver=False, num_cpus=self.num_cpus,
                 runtime_env={"env_vars": {"PYTHONPATH": ROOT + (os.pathsep + path if path else "")}})
        self._started_ray = True

    def _make(self, w: int) -> Any:
        options: dict[str, Any] = {"max_restarts": self.max_restarts, "max_task_retries": 0}
        if self.on_gpu:
            options.update(num_gpus=1 / self.share, num_cpus=1)
        else:
            options.update(num_gpus=0, num_cpus=self.cpus_per_worker)
        actor_class = self.ray.remote(_RayWorker)
        return actor_class.options(**options).remote(w, self.on_gpu, self.simulate_s, self.share, self.lock_folder,
                                                     self.exclusive)

    def start(self) -> list[dict]:
        self._init_ray()
        gpus = int(self.ray.cluster_resources().get("GPU", 0)) if self.use_gpus else 0
        self.on_gpu = gpus > 0
        count = gpus * self.share if self.on_gpu else (self.share if self.share > 1 else self.cpu_workers)
        for w in range(count):
            self._actors[w] = self._make(w)
        refs = {w: a.environment.remote() for w, a in self._actors.items()}
        try:
            envs = self.ray.get(list(refs.values()), timeout=START_TIMEOUT_S)
        except Exception as exc:
            raise SweepError(f"the Ray workers did not start: {' '.join(str(exc).split())[:200]}") from None
        self.environments = dict(zip(refs, envs))
        return [self.environments[w] for w in sorted(self.environments)]

    @property
    def workers(self) -> list[int]:
        return sorted(self._actors)

    def submit(self, worker: int, task: dict) -> None:
        ref = self._actors[worker].handle.remote(task)
        self._inflight[ref] = (worker, int(task["id"]))

    def poll(self, timeout_s: float = 0.2) -> list[Event]:
        if not self._inflight:
            time.sleep(timeout_s)
            return []
        ready, _ = self.ray.wait(list(self._inflight), num_returns=len(self._inflight), timeout=timeout_s)
        out = []
        for ref in ready:
            w, tid = self._inflight.pop(ref)
            try:
                out.append(Event("result", w, tid, self.ray.get(ref)))
            except self.ray.exceptions.RayActorError as exc:
                out.append(Event("died", w, tid, {"reason": f"worker {w} died ({type(exc).__name__})"}))
            except self.ray.exceptions.RayError as exc:
                out.append(Event("result", w, tid, {"status": "failed",
                                                    "reason": f"{type(exc).__name__}: "
                                                              f"{' '.join(str(exc).split())[:200]}"}))
        return out

    def restart(self, worker: int) -> dict:
        """Ray restarts a dead actor itself (``max_restarts``); when it cannot any more, a new actor replaces it."""
        try:
            env = self.ray.get(self._actors[worker].environment.remote(), timeout=START_TIMEOUT_S)
        except Exception:
            self._actors[worker] = self._make(worker)
            env = self.ray.get(self._actors[worker].environment.remote(), timeout=START_TIMEOUT_S)
        self.environments[worker] = env
        return env

    def pids(self) -> dict[int, int]:
        return {w: self.ray.get(a.pid.remote(), timeout=60) for w, a in self._actors.items()}

    def stop(self) -> None:
        for actor in self._actors.values():
            try:
                self.ray.kill(actor, no_restart=True)
            except Exception:
                pass
        self._actors.clear()
        self._inflight.clear()
        if self._started_ray:
            self.ray.shutdown()
