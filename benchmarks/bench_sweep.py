"""Benchmark: what the sweep machinery costs per point, against a plain ``gpu_runner.run``; and with many workers.

Two parts, one JSON (``bench_sweep_<device>.json``):

- ``overhead``: the same points (``--model`` at batches 1..K, plan ``all``, quick settings) measured K times by a
  plain ``gpu_runner.run`` (what ``fusion-explorer run`` calls) and then by ``run_sweep`` on the local backend
  (and on Ray with ``--ray``), with sweeps of 1 and of K points. Reported: each point's wall time both ways (the
  runner's call inside the worker is the same call), the sweep's total, its fixed cost (starting the worker,
  resolving fingerprints, writing the table: the 1-point sweep's total less its point) and its marginal cost per
  point (the K-point sweep's total less its points' wall times, less the fixed cost, over K).
- ``simulated``: the scheduler alone, on a local Ray with 8 and 64 CPU actors (``--workers``): every point is a
  simulated one (``Worker(simulate_s=...)``: no model is loaded, a measure task sleeps ``--sleep-s``), so what
  is timed is dispatch, the task round trip through Ray, the journal line (synced), the progress file and the
  Parquet table. Each simulated point is two tasks (its shape resolved, then measured: every batch is a shape of
  its own). Reported per worker count: actor start-up, the sweep's wall time after it, points per second and the
  driver's time per point (with ``--sleep-s 0`` the driver is the bottleneck: that is the scheduler's cost).

Run here (CPU, both parts, about 2 minutes on a quiet 2-core machine):

    python3 benchmarks/bench_sweep.py --out benchmarks/results/bench_sweep_cpu.json

On the H200 (the overhead part on the GPU, ResNet-50, then Ray):

    python3 benchmarks/bench_sweep.py --part overhead --model resnet50 --points 3 --ray
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks._common import results_path, run_stamp, write_json  # noqa: E402


def _versions() -> dict:
    import importlib.metadata as md

    out = {"python": platform.python_version(), "host": platform.node(), "cpus": os.cpu_count()}
    for package in ("torch", "triton", "ray", "pyarrow"):
        try:
            out[package] = md.version(package)
        except md.PackageNotFoundError:
            out[package] = None
    from explorer.sweeps import env

    gpus = env.gpu_rows()
    out["gpus"] = [{k: g.get(k) for k in ("device_name", "driver", "sm_clock_max_mhz")} for g in gpus]
    try:
        out["load_avg_1m_start"] = os.getloadavg()[0]
    except OSError:
        pass
    return out


def overhead(model: str, points: int, device: str, use_ray: bool, log) -> dict:
    from explorer import gpu_runner
    from explorer.sweeps import spec as S
    from explorer.sweeps.runner import run_sweep

    settings = {"device": device, "quick": True, "warmup": 1, "reps": 8}
    batches = list(range(1, points + 1))
    out: dict = {"model": model, "points": points, "settings": settings}
    plain = []
    for b in batches:
        t0 = time.perf_counter()
        gpu_runner.run(model, None, gpu_runner.RunSettings(device=device, quick=True, warmup=1, reps=8, batch=b,
                                                           per_chain=False, stages=False))
        plain.append(round(time.perf_counter() - t0, 3))
        log(f"plain run, batch {b}: {plain[-1]:.2f} s")
    out["plain_wall_s"] = plain
    for backend in ("local", "ray") if use_ray else ("local",):
        rows = {}
        for k in (1, points):
            spec = S.from_flags([model], ["all"], batches[:k], ["fp32" if device == "cpu" else "fp16"],
                                settings=settings)
            with tempfile.TemporaryDirectory() as folder:
                t0 = time.perf_counter()
                summary = run_sweep(spec, folder, backend)
                total = time.perf_counter() - t0
            walls = [r["wall_s"] for r in summary.records]
            rows[k] = {"total_s": round(total, 3), "point_wall_s": walls,
                       "statuses": [r["status"] for r in summary.records],
                       "outside_points_s": round(total - sum(w for w in walls if w), 3)}
            log(f"{backend} sweep of {k} point(s): {total:.2f} s, points {walls}")
        fixed = rows[1]["outside_points_s"]
        marginal = (rows[points]["outside_points_s"] - fixed) / points if points > 1 else None
        out[backend] = {"sweeps": rows, "fixed_s": fixed, "marginal_per_point_s": marginal,
                        "mean_point_wall_s": statistics.mean(rows[points]["point_wall_s"]),
                        "mean_plain_wall_s": statistics.mean(plain)}
    return out


def simulated(worker_counts: list[int], points_per_worker: int, sleep_s: float, log) -> dict:
    import ray

    from explorer.childproc import ROOT as PKG
    from explorer.sweeps import spec as S
    from explorer.sweeps.backends import RayBackend
    from explorer.sweeps.runner import run_sweep

    out = {}
    for n in worker_counts:
        t0 = time.perf_counter()
        ray.init(num_cpus=n, include_dashboard=False, log_to_driver=False,
                 runtime_env={"env_vars": {"PYTHONPATH": PKG}})
        backend = RayBackend(cpu_workers=n, cpus_per_worker=1, simulate_s=sleep_s, use_gpus=False)
        points = n * points_per_worker
        spec = S.from_flags(["conv_bn_relu"], ["all"], list(range(1, points + 1)), ["fp32"],
                            settings={"device": "cpu"})
        starts = []
        with tempfile.TemporaryDirectory() as folder:
            t_sweep = time.perf_counter()
            summary = run_sweep(spec, folder, backend,
                                progress=lambda p: starts.append(time.perf_counter()) if not starts else None)
            sweep_s = time.perf_counter() - t_sweep
        ray.shutdown()
        startup = (starts[0] - t_sweep) if starts else None
        working = sweep_s - (startup or 0.0)
        row = {"workers": n, "points": points, "sleep_s": sleep_s, "ray_init_and_sweep_s": round(time.perf_counter() - t0, 3),
               "actors_start_s": None if startup is None else round(startup, 3), "sweep_s": round(sweep_s, 3),
               "after_start_s": round(working, 3), "points_per_s": round(points / working, 2),
               "driver_s_per_point": round(working / points, 5),
               "statuses": sorted({r["status"] for r in summary.records}), "records": len(summary.records),
               "driver_max_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)}
        out[str(n)] = row
        log(f"{n} simulated workers: {points} points in {working:.2f} s after {startup:.2f} s of start-up "
            f"({row['points_per_s']} points/s)")
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--part", choices=["overhead", "simulated", "all"], default="all")
    p.add_argument("--model", default="conv_bn_relu")
    p.add_argument("--points", type=int, default=3)
    p.add_argument("--device", default="auto", choices=["auto", "cuda", "cpu"])
    p.add_argument("--ray", action="store_true", help="the overhead part on Ray too")
    p.add_argument("--workers", default="8,64", help="simulated worker counts (default 8,64)")
    p.add_argument("--points-per-worker", type=int, default=4, dest="points_per_worker")
    p.add_argument("--sleep-s", type=float, default=0.0, dest="sleep_s")
    p.add_argument("--out")
    args = p.parse_args(argv)
    from explorer.sweeps import env

    device = args.device if args.device != "auto" else ("cuda" if env.visible_gpus() else "cpu")
    path = results_path(args.out, f"bench_sweep_{'h200' if device == 'cuda' else 'cpu'}.json")
    started = time.perf_counter()

    def log(message: str) -> None:
        print(f"[{time.perf_counter() - started:7.1f}s] {message}", file=sys.stderr, flush=True)

    doc = {**run_stamp(), "script": "benchmarks/bench_sweep.py", "device": device, "versions": _versions()}
    if args.part in ("overhead", "all"):
        doc["overhead"] = overhead(args.model, args.points, device, args.ray, log)
        write_json(path, doc)
    if args.part in ("simulated", "all"):
        doc["simulated"] = simulated([int(n) for n in args.workers.split(",")], args.points_per_worker,
                                     args.sleep_s, log)
    doc["elapsed_s"] = round(time.perf_counter() - started, 1)
    write_json(path, doc)
    print(f"wrote {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
