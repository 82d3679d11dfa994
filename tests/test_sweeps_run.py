"""Sweeps measured on the CPU: two teaching models x two batches x two plans on the local backend and on Ray.

Every point is a real ``gpu_runner.run`` (its child process, its report, its paired test), kept tiny (quick mode,
one warm-up, eight rounds). The two backends must give the same result set (the same points, each with the same
status; timings differ). The local sweep has its worker killed after its first point (the worker is replaced and
every point still measured); the Ray sweep is cancelled after a few points and resumed with points that cannot
load added (only the rest measured, the others recorded as refused); the command line then forces the grid again
with a timeout no point can meet (each recorded as failed, the sweep goes on). Ray starts once for the module (a
local Ray with CPU actors). Timings are never asserted on.
"""

from __future__ import annotations

import json
import os
import signal
import threading

import pytest

from benchmarks import sweep_time
from explorer import report as run_report
from explorer.cli import main
from explorer.sweeps import backends, spec as S, store as st
from explorer.sweeps.runner import run_sweep

SETTINGS = {"device": "cpu", "quick": True, "warmup": 1, "reps": 8}
GRID = S.from_flags(["conv_bn_relu", "residual_block"], ["all", "none"], [1, 2], ["fp32"], settings=SETTINGS)


def _outcome(records):
    return {(r["point"], r["status"]) for r in records}


@pytest.fixture(scope="module")
def local_sweep(tmp_path_factory):
    """The grid on the local backend, its worker killed (SIGKILL) once the first point is in."""
    folder = tmp_path_factory.mktemp("local")
    backend = backends.LocalBackend([], cpu_workers=1)
    killed = []

    def progress(p):
        if p.done >= 1 and not killed:
            pid = backend.pids()[0]
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)

    summary = run_sweep(GRID, folder, backend, progress=progress)
    return folder, summary, killed


@pytest.fixture(scope="module")
def ray_session():
    ray = pytest.importorskip("ray")
    from explorer.childproc import ROOT

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": ROOT, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}})
    yield ray
    ray.shutdown()


def test_local_sweep_measures_every_point_after_its_worker_is_killed(local_sweep):
    folder, summary, killed = local_sweep
    assert killed and summary.progress.restarts >= 1 and summary.progress.status == "done"
    assert len(summary.records) == 8 and all(r["status"] == "ok" for r in summary.records), summary.records
    assert _outcome(summary.records) == {(p.label, "ok") for p in S.expand(GRID)}
    assert summary.progress.done == 8 and summary.progress.failed == 0
    # each record's verdict is its report's paired test, and the report is the runner's, read back whole
    for rec in summary.records:
        report = run_report.load(folder / st.REPORTS / f"{rec['key']}.json", rec["point"])
        assert rec["verdict"] == report.verdict.label and rec["rounds"] == report.verdict.n >= 8
        assert rec["speedup"] == pytest.approx(1 / report.verdict.ratio)
        assert rec["speedup_low"] == pytest.approx(1 / report.verdict.ci_high)
        assert report.model.batch == rec["batch"] and report.settings["quick"] is True
        assert rec["chains_accepted"] == (0 if rec["plan"] == "none" else rec["chains_detected"])
        assert rec["device_kind"] == "cpu" and rec["torch"] and rec["host_cpu_busy"] is not None
    table = st.read_results("results.parquet", (folder / st.TABLE).read_bytes())
    assert {r["key"] for r in table} == {r["key"] for r in summary.records}
    assert json.loads((folder / st.PROGRESS).read_text())["status"] == "done"


def test_ray_sweep_resumes_records_failures_and_equals_the_local_one(local_sweep, ray_session, tmp_path):
    """Cancelled after three points, then resumed with a batch that does not fit in memory added: only the points
    not measured yet are measured, the oversized ones are recorded as refused (the explorer refuses the shape
    when it loads it, before any measuring) with their reason, and the points both sweeps share have the same
    keys and statuses as on the local backend."""
    cancel = threading.Event()
    first = run_sweep(GRID, tmp_path, "ray", cpu_workers=2,
                      progress=lambda p: cancel.set() if p.done >= 3 else None, cancel=cancel)
    assert first.progress.status == "cancelled" and 3 <= first.progress.done < 8
    measured_first = {r["key"] for r in first.records if r["status"] == "ok"}
    wider = S.from_flags(["conv_bn_relu", "residual_block"], ["all", "none"], [1, 2, 10**7], ["fp32"],
                         settings=SETTINGS)
    second = run_sweep(wider, tmp_path, "ray", cpu_workers=2)
    assert second.progress.status == "done"
    assert second.progress.cached == len(measured_first) and second.progress.done == 8 - len(measured_first)
    refused = [r for r in second.records if r["status"] == "refused"]
    assert len(refused) == 4 and {r["batch"] for r in refused} == {10**7} and second.progress.refused == 4
    assert second.progress.failed == 0 and "4 refused" in second.progress.line()
    assert all("do not fit in memory" in r["reason"] and "\n" not in r["reason"] for r in refused)
    shared = [r for r in second.records if r["batch"] != 10**7]
    assert _outcome(shared) == _outcome(local_sweep[1].records)            # same points, same statuses
    assert {r["key"] for r in shared} == {r["key"] for r in local_sweep[1].records}
    assert {r["worker"] for r in shared} <= {0, 1}


def test_the_cli_forces_a_remeasure_and_records_timeouts(local_sweep, capsys):
    """``--force`` measures the grid again; with a timeout no point can meet, each is recorded as failed with
    the runner's one-line reason, and the sweep still ends (exit 0)."""
    folder = local_sweep[0]
    assert main(["sweep", "--models", "conv_bn_relu,residual_block", "--batches", "1,2", "--plan", "all",
                 "--plan", "none", "--device", "cpu", "--quick", "--warmup", "1", "--reps", "8", "--timeout-s", "0.5",
                 "--force", "--out", str(folder)]) == 0
    captured = capsys.readouterr()
    lines = captured.out.strip().splitlines()
    assert len(lines) == 8 and all("failed: the measurement timed out after 0.5 s" in line for line in lines)
    assert "8 failed, 0 cached" in captured.err
    records = st.SweepStore(folder).results()
    assert {r["key"] for r in records} == {r["key"] for r in local_sweep[1].records}   # the timeout is not in the key
    assert all(r["status"] == "failed" for r in records)


def test_two_workers_sharing_the_cpu_take_turns_and_give_the_serial_keys(local_sweep, tmp_path):
    """``workers_per_gpu`` 2 on the CPU: two worker processes, each point's device section under the device's lock
    (the held intervals the children recorded never overlap), and the same keys and statuses as the serial sweep
    for the same points (what a point measures did not change). ``tests/test_sweeps_shared.py`` shows that the
    interval check fails without the lock."""
    grid = S.from_flags(["conv_bn_relu"], ["all", "none"], [1, 2], ["fp32"], settings=SETTINGS)
    backend = backends.LocalBackend([], workers_per_gpu=2, lock_folder=str(tmp_path))
    summary = run_sweep(grid, tmp_path / "shared", backend)
    assert summary.progress.status == "done" and len(backend.workers) == 2
    serial = [r for r in local_sweep[1].records if r["model"] == "conv_bn_relu"]
    assert _outcome(summary.records) == _outcome(serial) and len(summary.records) == 4
    assert {r["key"] for r in summary.records} == {r["key"] for r in serial}
    held = [(r["lock_acquired_at"], r["lock_released_at"]) for r in summary.records]
    assert all(a is not None and b > a for a, b in held)
    intervals = sorted(held)
    assert all(b[0] >= a[1] for a, b in zip(intervals, intervals[1:]))
    assert {r["workers_per_gpu"] for r in summary.records} == {2} and {r["worker"] for r in summary.records} <= {0, 1}
    for rec in summary.records:   # where the wall time went: the child's start, the load, the wait, the timing
        steps = json.loads(rec["phase_s"])
        assert {"starting_process", "loading", "waiting_for_device"} <= set(steps)
        assert steps["waiting_for_device"] == pytest.approx(rec["lock_waited_s"], abs=0.5)
        assert sum(steps.values()) <= rec["wall_s"] + 0.01
    # benchmarks/sweep_time.py's summary of the same folder: no overlap, every point's section counted
    doc = sweep_time.summarize(str(tmp_path / "shared"))
    assert doc["points_measured"] == 4 and doc["points_left"] == 0 and not any(p["overlap"] for p in doc["parts"])
    assert sum(p["points"] for p in doc["parts"]) == 4
    assert sum(p["held_s"] for p in doc["parts"]) == pytest.approx(sum(r["lock_held_s"] for r in summary.records), abs=0.2)
