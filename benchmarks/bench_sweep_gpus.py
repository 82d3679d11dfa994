"""Benchmark (issue 25): does a sweep spread over the GPUs of one host? The same sweep on 1, 2, ... N GPUs.

For each GPU count ``n`` of ``--gpus`` and each backend of ``--backend``, the sweep file is run into a folder of
its own (``--force``: every point measured) on the first ``n`` visible GPUs: the local backend with one worker
process per GPU, Ray with a local Ray given ``num_gpus=n`` (one actor per GPU, ``num_gpus=1`` each). A thread
samples every GPU (``nvidia-smi``: utilisation, SM clock, memory) every ``--sample-s`` seconds meanwhile.

Reported (JSON, ``bench_sweep_gpus_<kind>.json``, and ``bench_sweep_gpus_<kind>.svg``: points per minute
against the number of GPUs):

- wall time, points per minute, speed-up and efficiency against the one-GPU run of the same backend;
- per-point agreement: each point measured in the one-GPU run and in an n-GPU run (matched by cache key): the
  ratio of their speed-ups, whether their 95% intervals overlap, and on which GPU (UUID) the n-GPU run measured it;
- each worker's GPU (name, UUID, clocks) from the folder's ``sweep.json``, and a check that no two workers
  shared a device; the sampled utilisation and clocks per GPU.

    python3 benchmarks/bench_sweep_gpus.py --sweep benchmarks/sweeps/h200_small.toml --gpus 1,2 --backend ray,local
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks._common import results_path, run_stamp, write_json  # noqa: E402


class Sampler(threading.Thread):
    """Every GPU's utilisation, clock and memory every ``every_s`` seconds until stopped."""

    def __init__(self, every_s: float) -> None:
        super().__init__(daemon=True)
        self.every_s, self.samples, self._stop = every_s, [], threading.Event()

    def run(self) -> None:
        from explorer.sweeps import env

        while not self._stop.is_set():
            t = time.time()
            self.samples += [{"t": t, **{k: r.get(k) for k in ("gpu_uuid", "gpu_util_pct", "sm_clock_mhz",
                                                                "memory_used_mib")}} for r in env.gpu_rows()]
            self._stop.wait(self.every_s)

    def stop(self) -> dict:
        self._stop.set()
        self.join(timeout=10)
        out: dict = {}
        for s in self.samples:
            out.setdefault(s["gpu_uuid"], []).append(s)
        return {uuid: {"samples": len(rows),
                       "util_mean_pct": statistics.mean(r["gpu_util_pct"] or 0 for r in rows),
                       "sm_clock_median_mhz": statistics.median(r["sm_clock_mhz"] or 0 for r in rows)}
                for uuid, rows in out.items()}


def one_run(spec, folder: Path, backend_name: str, gpus: list[str], every_s: float) -> dict:
    from explorer.sweeps import backends
    from explorer.sweeps.runner import run_sweep

    if backend_name == "local":
        backend = backends.LocalBackend(gpus)
    else:
        import ray

        os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(gpus)   # the local Ray sees these GPUs alone
        ray.init(num_gpus=len(gpus), include_dashboard=False, log_to_driver=False,
                 runtime_env={"env_vars": {"PYTHONPATH": str(ROOT)}})
        backend = backends.RayBackend()
    sampler = Sampler(every_s)
    sampler.start()
    t0 = time.perf_counter()
    try:
        summary = run_sweep(spec, folder, backend, force=True)
    finally:
        wall = time.perf_counter() - t0
        gpus_seen = sampler.stop()
        if backend_name == "ray":
            import ray

            ray.shutdown()
            os.environ.pop("CUDA_VISIBLE_DEVICES", None)
    workers = summary.workers
    uuids = [w.get("gpu_uuid") for w in workers]
    return {"backend": backend_name, "gpus": len(gpus), "folder": str(folder), "wall_s": round(wall, 2),
            "points": len(summary.records), "ok": sum(r["status"] == "ok" for r in summary.records),
            "points_per_min": round(60 * len(summary.records) / wall, 3),
            "workers": [{k: w.get(k) for k in ("worker", "device_name", "gpu_uuid", "gpu_index", "driver",
                                               "sm_clock_max_mhz")} for w in workers],
            "no_shared_device": len(set(uuids)) == len(uuids) and None not in uuids, "gpu_samples": gpus_seen,
            "records": {r["key"]: {k: r[k] for k in ("point", "status", "speedup", "speedup_low", "speedup_high",
                                                     "gpu_uuid", "wall_s")} for r in summary.records}}


def agreement(base: dict, other: dict) -> list[dict]:
    """The same point measured in the one-GPU run and in another: the ratio of speed-ups, interval overlap."""
    rows = []
    for key, a in base["records"].items():
        b = other["records"].get(key)
        if not b or a["speedup"] is None or b["speedup"] is None:
            continue
        overlap = not (a["speedup_high"] < b["speedup_low"] or b["speedup_high"] < a["speedup_low"]) \
            if None not in (a["speedup_low"], a["speedup_high"], b["speedup_low"], b["speedup_high"]) else None
        rows.append({"point": a["point"], "ratio": round(b["speedup"] / a["speedup"], 4), "intervals_overlap": overlap,
                     "gpu_1": a["gpu_uuid"], "gpu_n": b["gpu_uuid"]})
    return rows


def svg(runs: list[dict]) -> str:
    """Points per minute against the number of GPUs, one bar per backend and count (no plotting package needed)."""
    width, height, pad = 520, 300, 40
    top = max((r["points_per_min"] for r in runs), default=1) or 1
    bar = (width - 2 * pad) / max(1, len(runs))
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" '
             'font-size="12"><text x="10" y="20">points per minute against GPUs (bench_sweep_gpus.py)</text>']
    for i, r in enumerate(runs):
        h = (height - 2 * pad) * r["points_per_min"] / top
        x = pad + i * bar
        colour = "#2563eb" if r["backend"] == "ray" else "#16a34a"
        parts.append(f'<rect x="{x + 4:.1f}" y="{height - pad - h:.1f}" width="{bar - 8:.1f}" height="{h:.1f}" '
                     f'fill="{colour}"/><text x="{x + 6:.1f}" y="{height - pad + 14}">{r["backend"]} x{r["gpus"]}</text>'
                     f'<text x="{x + 6:.1f}" y="{height - pad - h - 4:.1f}">{r["points_per_min"]:.2f}</text>')
    return "\n".join(parts + ["</svg>"])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sweep", default=str(ROOT / "benchmarks" / "sweeps" / "h200_small.toml"))
    p.add_argument("--gpus", default="1,2", help="GPU counts, separated by commas (1 first: the baseline)")
    p.add_argument("--backend", default="ray,local")
    p.add_argument("--sample-s", type=float, default=2.0, dest="sample_s")
    p.add_argument("--out")
    args = p.parse_args(argv)
    from explorer.sweeps import env, spec as S

    visible = env.visible_gpus()
    counts = sorted({int(n) for n in args.gpus.split(",")})
    if not visible or counts[-1] > len(visible):
        print(f"bench_sweep_gpus.py: needs {counts[-1]} GPUs, {len(visible)} visible", file=sys.stderr)
        return 2
    spec = S.load_spec(args.sweep)
    path = results_path(args.out, f"bench_sweep_gpus_{len(visible)}gpu.json")
    doc: dict = {**run_stamp(), "sweep": args.sweep, "gpus_visible": env.gpu_rows(), "runs": []}
    for backend in args.backend.split(","):
        for n in counts:
            folder = path.parent / f"sweep_gpus_{backend}_{n}"
            doc["runs"].append(one_run(spec, folder, backend, visible[:n], args.sample_s))
            write_json(path, doc)
    for backend in args.backend.split(","):
        runs = [r for r in doc["runs"] if r["backend"] == backend]
        base = next(r for r in runs if r["gpus"] == counts[0])
        for r in runs:
            r["speedup_vs_1"] = round(base["wall_s"] / r["wall_s"], 3)
            r["efficiency"] = round(r["speedup_vs_1"] * counts[0] / r["gpus"], 3)
            r["agreement_with_1"] = agreement(base, r) if r is not base else []
    write_json(path, doc)
    path.with_suffix(".svg").write_text(svg(doc["runs"]))
    print(f"wrote {path} and {path.with_suffix('.svg')}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
