"""bench_corpus.py's pipeline: the GPU lock serialises the model processes' GPU sections, and --merge.

The lock test runs real child processes twice: with the lock their held intervals never overlap, and with the lock
path removed (``None``) the same children overlap, so the check is one that can fail. The smoke test runs the
script's own pipeline (2 workers, two corpus models on the CPU) and checks the intervals its children recorded.
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
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    assert bench_corpus.main(["--merge", str(bad), "--out", str(out)]) == 2
    assert "cannot read" in capsys.readouterr().err
