"""bench_corpus.py's pipeline: the GPU lock serialises the model processes' GPU sections, and --merge.

The lock test runs real child processes twice: with the lock their held intervals never overlap, and with the lock
path removed (``None``) the same children overlap, so the check is one that can fail. The smoke test runs the
script's own pipeline (2 workers, two corpus models on the CPU) and checks the intervals its children recorded and
that their host phase (build, capture, detect, fuse, cast records) ran before the lock. The quiet test shows a
holder's timing window stopping another process (which writes a time stamp every 5 ms: none inside the window);
the capture test shows ``measure.capture_differs`` telling a device-branching model from a plain one.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks import bench_corpus  # noqa: E402

CHILD = """
import json, sys, time
from benchmarks.bench_corpus import GpuLock
lock = sys.argv[1] if sys.argv[1] != "-" else None
time.sleep(max(0.0, float(sys.argv[3]) - time.time()))   # every child starts its section at the same moment
with GpuLock(lock) as g:
    time.sleep(0.3)
print(json.dumps([g.record["acquired_at"], g.record["released_at"], g.record["waited_s"]]))
"""


def _overlaps(intervals: list[tuple[float, float]]) -> bool:
    intervals = sorted(intervals)
    return any(b[0] < a[1] for a, b in zip(intervals, intervals[1:]))


def _run_children(lock: str, n: int = 2) -> list[list[float]]:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    start = time.time() + 1.0
    procs = [subprocess.Popen([sys.executable, "-c", CHILD, lock, str(i), str(start)], env=env,
                              stdout=subprocess.PIPE, text=True) for i in range(n)]
    return [json.loads(p.communicate(timeout=30)[0]) for p in procs]


def test_lock_serialises_children_and_the_check_fails_without_it(tmp_path):
    held = _run_children(str(tmp_path / "gpu.lock"))
    assert not _overlaps([(a, b) for a, b, _ in held])
    assert max(w for _a, _b, w in held) >= 0.2          # someone really waited for the lock
    unlocked = _run_children("-")
    assert _overlaps([(a, b) for a, b, _ in unlocked])   # without the lock the same check catches it


def test_smoke_pipeline_two_workers_never_overlap(tmp_path):
    out = tmp_path / "smoke.json"
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_corpus.py"), "--smoke", "--no-compile",
                    "--out", str(out)], env=env, check=True, timeout=120, capture_output=True)
    doc = json.loads(out.read_text())
    assert doc["pipeline"]["workers"] == 2
    rows = list(doc["models"].values())
    assert len(rows) == 2 and all("error" not in r for r in rows)
    locks = [r["lock"] for r in rows]
    assert all(k["locked"] and k["held_s"] > 0 for k in locks)
    assert not _overlaps([(k["acquired_at"], k["released_at"]) for k in locks])
    assert all(r["verdicts"] for r in rows)
    # which fused calls bound, and which replays declined while timed (none bind on the CPU: both empty here)
    assert all(isinstance(r["bound_fused"], dict) and isinstance(r["declined_fused"], dict) for r in rows)
    # capture, detection, fusion and the cast records run before the GPU section: their seconds are recorded
    # outside the lock and none inside, the host phase ended before the lock was taken (fails if the capture
    # moves back inside the lock), and each holder's timing had its quiet window
    host = {"build", "capture", "detect_fuse", "casts_fp16", "casts_bf16"}
    for r in rows:
        outside, inside = r["seconds"]["outside_lock"], r["seconds"]["inside_lock"]
        assert host <= set(outside) and not host & set(inside)
        assert {"prepare", "reference_float64", "fidelity", "timing"} <= set(inside)
        assert r["lock"]["host_done_at"] <= r["lock"]["acquired_at"]
        assert r["lock"]["quiet"]["granted"]
        assert all("ratio" in f for f in r["fidelity"].values()) and {"fp16", "bf16"} <= set(r["fidelity"])


def test_merge_keeps_later_rows_and_recounts(tmp_path, capsys):
    def part(name, models, skipped=()):
        p = tmp_path / name
        p.write_text(json.dumps(dict(schema="bench_corpus/1", models=models, skipped_models=list(skipped))))
        return str(p)

    row = lambda m, label: dict(model=m, dtype="fp16", verdicts={"fused_vs_unfused": dict(label=label, ratio=1.2)})
    a = part("a.json", {"tv/a": row("tv/a", "slower"), "tv/b": row("tv/b", "faster")}, skipped=["tv/c", "tv/d"])
    b = part("b.json", {"tv/a": row("tv/a", "level"), "tv/c": row("tv/c", "faster"),
                        "tv/b": dict(model="tv/b", error="exited 1: boom"),
                        "tv/e": dict(model="tv/e", error="timed out (past --budget-s): x")})
    out = tmp_path / "m.json"
    assert bench_corpus.main(["--merge", f"{a},{b}", "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert sorted(doc["models"]) == ["tv/a", "tv/b", "tv/c"]
    assert doc["models"]["tv/a"]["source"] == "b.json"
    assert doc["models"]["tv/b"]["source"] == "a.json"     # a later failure does not replace a measured row
    assert doc["skipped_models"] == ["tv/d", "tv/e"]        # cut by the budget: not measured, not failed
    assert doc["summary"]["fused_vs_unfused"]["counts"] == {"level": 1, "faster": 2}
    fidelity = lambda ratio: dict(model="tv/f", verdicts={}, fidelity={"fp16": dict(ratio=ratio)})  # noqa: E731
    for ratio, within, beyond, not_finite in ((1.2, 1, {}, []), (2.0, 0, {"tv/f": 2.0}, []),
                                              (float("nan"), 0, {}, ["tv/f"])):
        counts = bench_corpus.summarize([fidelity(ratio)])["fidelity_fp16"]
        assert (counts["within_1_5x"], counts["beyond_1_5x"], counts["not_finite"]) == (within, beyond, not_finite)
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    assert bench_corpus.main(["--merge", str(bad), "--out", str(out)]) == 2
    assert "cannot read" in capsys.readouterr().err


def test_skip_measured_reads_what_results_measured(tmp_path, capsys):
    a = tmp_path / "a.json"
    a.write_text(json.dumps(dict(schema="bench_corpus/1", models={
        "tv/a": dict(model="tv/a"), "tv/b": dict(model="tv/b", error="exited 1: boom"),
        "tv/c": dict(model="tv/c", error="timed out (past --budget-s): x")})))
    b = tmp_path / "b.json"
    b.write_text(json.dumps(dict(schema="bench_corpus/1", models={"hf/d": dict(model="hf/d")})))
    assert bench_corpus.measured_in(f"{a},{b}") == {"tv/a", "hf/d"}    # failed and cut rows are not measured
    assert bench_corpus.measured_in("") == set()
    merged = ROOT / "benchmarks" / "results" / "bench_corpus_h200_merged.json"
    doc = json.loads(merged.read_text())
    assert bench_corpus.measured_in(str(merged)) == {n for n, r in doc["models"].items() if "error" not in r}
    not_ours = tmp_path / "other.json"
    not_ours.write_text(json.dumps(dict(schema="sweep/1")))
    for path, why in ((not_ours, "is not a bench_corpus/1 result"), (tmp_path / "none.json", "cannot read")):
        assert bench_corpus.main(["--skip-measured", str(path), "--out", str(tmp_path / "o.json")]) == 2
        err = capsys.readouterr().err
        assert why in err and str(path) in err and len(err.strip().splitlines()) == 1


SPIN = """
import sys, time
end = time.time() + float(sys.argv[2])
with open(sys.argv[1], "a") as f:
    while time.time() < end:
        f.write(f"{time.time()}\\n")
        f.flush()
        time.sleep(0.005)
"""

HOLDER = """
import json, sys, time
from benchmarks.bench_corpus import Quiet
time.sleep(0.6)
with Quiet(sys.argv[1]) as q:
    time.sleep(0.4)
print(json.dumps(q.record))
"""


def test_quiet_window_stops_the_other_children(tmp_path):
    """While a holder's quiet window stands, another child writes nothing (it is stopped), and it resumes after."""
    keeper = bench_corpus._QuietKeeper(tmp_path / "quiet")
    stamps = tmp_path / "stamps"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    other = subprocess.Popen([sys.executable, "-c", SPIN, str(stamps), "2.5"], start_new_session=True)
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(tmp_path / "quiet")], env=env,
                              stdout=subprocess.PIPE, text=True, start_new_session=True)
    running = [other, holder]
    deadline = time.time() + 30
    while holder.poll() is None and time.time() < deadline:
        keeper.poll(running)
        time.sleep(0.01)
    keeper.poll(running)
    record = json.loads(holder.communicate(timeout=10)[0])
    other.wait(timeout=30)
    times = [float(t) for t in stamps.read_text().split()]
    start, end = record["started_at"], record["started_at"] + record["held_s"]
    assert record["granted"] and record["held_s"] >= 0.35
    assert any(t < start for t in times) and any(t > end for t in times)   # it ran before and after
    assert not [t for t in times if start < t < end]                       # and not while the window stood


def test_capture_differs_finds_a_device_branch():
    """A CPU capture of a model that branches on its device is not the graph a CUDA capture makes; one that does
    not branch is the same graph (fake CUDA tensors: no GPU needed where torch can fake them)."""
    import torch

    from explorer.runtime import measure
    from explorer.sources import capture

    class Branchy(torch.nn.Module):
        def forward(self, x):
            return x * 2 if x.device.type == "cuda" else x + 1

    x = (torch.randn(2, 3),)
    plain = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU()).eval()
    same = measure.capture_differs(capture(plain, x, "plain"), plain, x, "cuda")
    if same and same.startswith("the capture on cuda failed"):
        import pytest

        pytest.skip(f"this torch cannot fake CUDA tensors: {same}")
    assert same is None
    assert measure.capture_differs(capture(Branchy(), x, "branchy"), Branchy(), x, "cuda") is not None


def test_graph_stage_chooses_kernels_for_the_run_dtype_and_layout():
    """The corpus fuses for what it runs, as ``fusion-explorer run`` does (``measure.run_target``): every fused call
    records the bench dtype (the first of ``dtype_names``) and the model's memory format, not the fp32/NCHW a bare
    device name means (every corpus part until 2026-12-02 chose so: Swin-T's windows kept SDPA, which the
    H200 table picks only for fp32)."""
    import torch

    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU()).eval()
    x = (torch.randn(2, 3, 16, 16),)
    out: dict = {"notes": []}
    _, fused, _ = bench_corpus.graph_stage(model, x, "cbr", "cpu", ["bf16"], out, bench_corpus.Phases(),
                                           channels_last=True)
    made = [n.meta["fused_for"] for n in fused.gm.graph.nodes if "fused_for" in n.meta]
    assert made and all(tuple(m[:2]) == ("cpu", torch.bfloat16) and m[2] == "channels_last" for m in made), made
