"""Workers taking turns on one device (``workers_per_gpu``): the exclusive section, the cores, the scheduling.

The lock test runs real child processes that take the section as the runner's child does (configured through the
environment, ``gpulock.Section.from_env``), twice: with the lock file named their held intervals never overlap and
someone waits; without it the same children overlap, so the check is one that can fail. The scheduling tests use
an in-process backend of simulated workers (``Worker(simulate_s=...)``: nothing is loaded or measured) to check
the order points are given out in, that a shape is resolved only while too few points are ready, and that
``stop_after_s`` ends the sweep "interrupted" with what it started recorded. The sweep with two workers sharing
the CPU through the lock, whose keys must equal the serial sweep's, is in ``tests/test_sweeps_run.py`` (it reuses
that file's serial sweep).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from explorer.runtime import gpulock
from explorer.sweeps import spec as S
from explorer.sweeps.backends import Event
from explorer.sweeps.runner import check_workers, compile_cache, run_sweep
from explorer.sweeps.spec import SweepError
from explorer.sweeps.worker import PhaseClock, Worker, step_of

ROOT = Path(__file__).resolve().parents[1]

CHILD = """
import json, sys, time
from explorer.runtime.gpulock import Section
section = Section.from_env()
time.sleep(max(0.0, float(sys.argv[1]) - time.time()))   # every child asks for the section at the same moment
if section is None:
    acquired = time.time(); time.sleep(0.3); print(json.dumps([acquired, time.time(), 0.0, False]))
else:
    section.acquire(); time.sleep(0.3); r = section.release()
    print(json.dumps([r["acquired_at"], r["released_at"], r["waited_s"], r["locked"]]))
"""


def _overlaps(intervals: list[tuple[float, float]]) -> bool:
    intervals = sorted(intervals)
    return any(b[0] < a[1] for a, b in zip(intervals, intervals[1:]))


def _children(lock: str | None, n: int = 2) -> list[list]:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    env.pop(gpulock.LOCK_ENV, None)
    if lock:
        env[gpulock.LOCK_ENV] = lock
    start = time.time() + 1.0
    procs = [subprocess.Popen([sys.executable, "-c", CHILD, str(start)], env=env, stdout=subprocess.PIPE, text=True)
             for _ in range(n)]
    return [json.loads(p.communicate(timeout=30)[0]) for p in procs]


def test_the_section_serialises_children_and_the_check_fails_without_it(tmp_path):
    held = _children(gpulock.lock_path("GPU-test", str(tmp_path)))
    assert all(locked for *_x, locked in held)
    assert not _overlaps([(a, b) for a, b, *_ in held])
    assert max(w for _a, _b, w, _l in held) >= 0.2          # someone really waited
    unlocked = _children(None)
    assert _overlaps([(a, b) for a, b, *_ in unlocked])      # without the lock the same check catches it


def test_cores_and_lock_paths():
    holder, waiting = gpulock.core_sets({0, 1, 2, 3, 4, 5, 6, 7, 9})
    assert holder == {0, 1, 2, 3} and waiting == {4, 5, 6, 7, 9}
    assert gpulock.core_sets({3}) == ({3}, {3})
    assert gpulock.core_sets(set(range(16)), waiting=2) == (set(range(14)), {14, 15})
    assert gpulock.core_sets(set(range(16)), waiting=12) == (set(range(8)), set(range(8, 16)))   # at most half
    assert gpulock.core_sets({0, 1}, waiting=2) == ({0}, {1})
    text = gpulock.format_cores(holder, waiting)
    assert text == "0-3|4-7,9" and gpulock.parse_cores(text) == (holder, waiting)
    assert gpulock.parse_cores("0-3") is None and gpulock.parse_cores("a|b") is None
    a, b = gpulock.lock_path("GPU-6d7c/../x"), gpulock.lock_path("GPU-6d7c/../y")
    assert a != b and "/../" not in Path(a).name and Path(a).parent == Path(b).parent
    assert gpulock.Section.from_env({}) is None
    section = gpulock.Section.from_env({gpulock.LOCK_ENV: "/tmp/x.lock", gpulock.CORES_ENV: "0|1"})
    assert section.path == "/tmp/x.lock" and section.holder == {0} and section.waiting == {1}


def test_check_workers_allows_the_workers_per_gpu_asked_for():
    env = {"device_kind": "cuda", "gpu_uuid": "GPU-1", "device_name": "H200", "driver": "1", "torch": "2",
           "triton": "3"}
    two = [dict(env, worker=0), dict(env, worker=1)]
    with pytest.raises(SweepError, match="a GPU of its own"):
        check_workers(two, False)
    check_workers(two, False, workers_per_gpu=2)
    with pytest.raises(SweepError, match="more than the 2 workers per GPU"):
        check_workers(two + [dict(env, worker=2)], False, workers_per_gpu=2)


def test_phase_clock_names_each_step_and_adds_up():
    from explorer.messages import PROGRESS
    from explorer.runtime.progress import estimating, with_left

    statuses = (estimating(PROGRESS("starting_process")), str(PROGRESS("loading", x="resnet50")),
                with_left(str(PROGRESS("loading", x="resnet50")), 9.0), str(PROGRESS("waiting_for_device")),
                with_left(str(PROGRESS("compiling_with_torch_compile", x="reduce-overhead")), 3.0),
                "a line no message makes")       # made before the clock starts: its first status comes at once
    step_of(statuses[0])                             # (and the catalogs its reading back loads, loaded once)
    clock = PhaseClock()
    for status in statuses:
        clock(0.1, status)
        time.sleep(0.01)
    clock(1.0, str(PROGRESS("done", elapsed="1 s")))
    seconds = clock.seconds()
    assert list(seconds) == ["starting_process", "loading", "waiting_for_device",
                             "compiling_with_torch_compile:reduce-overhead", "other"]
    assert seconds["loading"] >= 0.02 and sum(seconds.values()) <= time.perf_counter() - clock.t0 + 1e-3
    assert step_of(str(PROGRESS("timing_unfused_vs_fused", n=3, n2=40))) == "timing_unfused_vs_fused"


class _SimulatedBackend:
    """Simulated workers in this process (the scheduler's four calls): each task answered on the next poll."""

    name = "simulated"

    def __init__(self, workers: int, sleep_s: float = 0.0) -> None:
        self.sleep_s = sleep_s
        self.pool = {w: Worker(w, None, simulate_s=sleep_s) for w in range(workers)}
        self.pending: list[tuple[int, dict]] = []
        self.log: list[tuple[str, int, dict]] = []

    def start(self) -> list[dict]:
        return [w.environment for w in self.pool.values()]

    @property
    def workers(self) -> list[int]:
        return list(self.pool)

    def submit(self, worker: int, task: dict) -> None:
        self.log.append((task["kind"], worker, task))
        self.pending.append((worker, task))

    def poll(self, timeout_s: float = 0.2) -> list[Event]:
        out = [Event("result", w, int(t["id"]), self.pool[w].handle(t)) for w, t in self.pending]
        self.pending.clear()
        return out

    def restart(self, worker: int) -> dict:
        return self.pool[worker].environment

    def stop(self) -> None:
        pass


GRID = S.from_flags(["conv_bn_relu", "residual_block"], ["all", "none"], [1, 2], ["fp32", "bf16"],
                    settings={"device": "cpu"})


def test_points_of_one_shape_go_out_dtype_by_dtype_each_plan_in_turn_after_one_load(tmp_path):
    backend = _SimulatedBackend(workers=1)
    summary = run_sweep(GRID, tmp_path, backend)
    assert summary.progress.status == "done" and summary.progress.total == 16
    kinds = [k for k, _w, _t in backend.log]
    assert kinds[:2] == ["resolve", "measure"]          # measuring starts after one load, not four
    assert kinds.count("resolve") == 4 and kinds.count("measure") == 16
    measured = [(t["point"]["model"], t["point"]["batch"], t["point"]["dtype"], t["point"]["plan"])
                for k, _w, t in backend.log if k == "measure"]
    assert measured[:4] == [("conv_bn_relu", 1, "fp32", "all"), ("conv_bn_relu", 1, "fp32", "none"),
                            ("conv_bn_relu", 1, "bf16", "all"), ("conv_bn_relu", 1, "bf16", "none")]
    caches = {t["cache_dir"] for k, _w, t in backend.log if k == "measure"}   # one compile cache per sweep folder
    assert caches == {compile_cache(tmp_path)} and not str(compile_cache(tmp_path)).startswith(str(tmp_path))


def test_two_workers_resolve_ahead_only_while_too_few_points_are_ready(tmp_path):
    backend = _SimulatedBackend(workers=2)
    run_sweep(GRID, tmp_path, backend)
    kinds = [k for k, _w, _t in backend.log]
    assert kinds[:3] == ["resolve", "resolve", "measure"]   # both workers load first, then measure
    assert kinds.count("resolve") == 4


def test_stop_after_s_ends_interrupted_with_the_started_points_recorded(tmp_path):
    backend = _SimulatedBackend(workers=1, sleep_s=0.15)
    summary = run_sweep(GRID, tmp_path, backend, stop_after_s=0.5)
    assert summary.progress.status == "interrupted"
    started = sum(1 for k, _w, _t in backend.log if k == "measure")
    assert 1 <= started < 16 and len(summary.records) == started
    assert json.loads((tmp_path / "sweep.json").read_text())["stop_after_s"] == 0.5
