"""Where a sweep's device time went: its records' steps (``phase_s``), its GPU sections and what is left.

Reads a sweep folder (``explorer.sweeps.store``: the latest record of every point) and writes one JSON beside the
numbers it prints:

- per point: wall time, the runner child's own time (``duration_s``), the machinery outside it (``wall_s -
  duration_s``: the child's start and imports, the report read back), the steps of ``phase_s`` summed into host
  work before the device section (the child's start, load, plan, fuse, the casts' record), the wait for the
  section and the section itself (everything after it), and the section's seconds as the child held the lock;
- per part (points whose sections follow each other with less than ``--part-gap-s`` between them: one device
  call each): its points, the span from its first section to its last, the seconds the GPU was held in it and
  that share of the span (how much of the call the overlap kept the GPU busy), and whether any two held
  intervals overlap (they must not: the lock);
- the points of the sweep's grid not measured yet, and the device time they need at the mean section so far.

    python3 benchmarks/sweep_time.py benchmarks/results/sweeps/h200_models --out benchmarks/results/sweeps/h200_models_time.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks._common import write_json  # noqa: E402
from explorer.sweeps.store import SweepStore  # noqa: E402

#: ``phase_s`` steps that come before a point's device section: host work a waiting point does beside another's.
HOST_STEPS = ("before_first_status", "starting_process", "loading", "applying_plan", "reading_casts")
WAIT_STEP = "waiting_for_device"


def point_row(rec: dict) -> dict:
    steps = json.loads(rec["phase_s"]) if rec.get("phase_s") else {}
    host = sum(v for k, v in steps.items() if k in HOST_STEPS)
    wait = steps.get(WAIT_STEP, 0.0)
    device = sum(v for k, v in steps.items() if k not in HOST_STEPS and k != WAIT_STEP)
    compiles = {k.split(":", 1)[1]: v for k, v in steps.items() if k.startswith("compiling_with_torch_compile:")}
    outside = (rec["wall_s"] - rec["duration_s"]) if rec.get("wall_s") is not None and rec.get("duration_s") else None
    return dict(point=rec["point"], status=rec["status"], worker=rec.get("worker"), wall_s=rec.get("wall_s"),
                duration_s=rec.get("duration_s"), outside_runner_s=None if outside is None else round(outside, 2),
                host_s=round(host, 2), wait_s=round(wait, 2), section_s=round(device, 2), compile_s=compiles,
                lock_waited_s=rec.get("lock_waited_s"), lock_held_s=rec.get("lock_held_s"),
                held=[rec.get("lock_acquired_at"), rec.get("lock_released_at")], steps=steps)


def parts(rows: list[dict], gap_s: float) -> list[dict]:
    held = sorted((r for r in rows if None not in r["held"]), key=lambda r: r["held"][0])
    groups: list[list[dict]] = []
    for r in held:
        if groups and r["held"][0] - groups[-1][-1]["held"][1] <= gap_s:
            groups[-1].append(r)
        else:
            groups.append([r])
    out = []
    for g in groups:
        span = g[-1]["held"][1] - g[0]["held"][0]
        busy = sum(r["held"][1] - r["held"][0] for r in g)
        overlap = any(b["held"][0] < a["held"][1] for a, b in zip(g, g[1:]))
        out.append(dict(points=len(g), span_s=round(span, 1), held_s=round(busy, 1),
                        held_share=round(busy / span, 3) if span > 0 else None, overlap=overlap,
                        mean_held_s=round(busy / len(g), 1)))
    return out


def summarize(folder: str, gap_s: float = 60.0) -> dict:
    store = SweepStore.open(folder)
    records = [r for r in store.results() if r["status"] == "ok"]
    rows = [point_row(r) for r in records]
    spec = store.spec() or {}
    total = spec.get("points")
    held = [r["lock_held_s"] for r in rows if r["lock_held_s"] is not None]
    sections = held or [r["section_s"] for r in rows if r["section_s"]]
    mean = statistics.mean(sections) if sections else None
    refused = sum(1 for r in store.results() if r["status"] == "refused")   # need no device time: not left
    left = None if total is None else total - len(rows) - refused
    return dict(folder=str(folder), points_total=total, points_measured=len(rows),
                failed=sum(1 for r in store.results() if r["status"] == "failed"), refused=refused,
                mean_section_s=None if mean is None else round(mean, 1),
                median_host_s=round(statistics.median(r["host_s"] for r in rows), 1) if rows else None,
                points_left=left,
                device_s_left=None if mean is None or left is None else round(mean * left, 0),
                parts=parts(rows, gap_s), points=rows)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("folder")
    p.add_argument("--out", default=None)
    p.add_argument("--part-gap-s", type=float, default=60.0)
    args = p.parse_args(argv)
    doc = summarize(args.folder, args.part_gap_s)
    for r in doc["points"]:
        comp = " ".join(f"{k} {v:.1f}" for k, v in r["compile_s"].items())
        print(f"{r['point'][:58]:58s} wall {r['wall_s'] or 0:6.1f}  host {r['host_s']:5.1f}  wait {r['wait_s']:5.1f}  "
              f"section {r['section_s']:5.1f}  held {r['lock_held_s'] or 0:5.1f}  compile {comp}")
    for i, part in enumerate(doc["parts"], 1):
        print(f"part {i}: {part['points']} points in {part['span_s']} s of sections, the GPU held {part['held_s']} s "
              f"({part['held_share']}), {part['mean_held_s']} s a point; overlapping sections: {part['overlap']}")
    print(f"{doc['points_measured']}/{doc['points_total']} measured; mean section {doc['mean_section_s']} s; "
          f"{doc['points_left']} left need about {doc['device_s_left']} s of sections")
    if args.out:
        write_json(Path(args.out), doc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
