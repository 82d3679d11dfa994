"""Benchmark: load + capture and detection time for every zoo model, and detection scaling.

This is the "explorer stays instant" benchmark. It runs on the CPU machine the
app runs on (no GPU involved), so it is run here, not on the H200:

    .venv/bin/python benchmarks/bench_detect.py --out benchmarks/results/detect_cpu.json

Targets (2-core machine): detection on BERT-large under 0.5 s; load + capture
+ detect for any zoo model under 10 s; detection linear in graph size
(synthetic graphs of 10k and 100k nodes).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import sys
import time

import torch


def _median_time(fn, repeats: int) -> tuple[float, list[float]]:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), times


def bench_zoo(names: list[str], repeats: int) -> list[dict]:
    from explorer.fusion_engine import detect
    from explorer.graph.build import build_graph
    from explorer.sources import load_model

    rows = []
    for name in names:
        t0 = time.perf_counter()
        model = load_model(name)
        t1 = time.perf_counter()
        graph = build_graph(model.gm, name)
        t2 = time.perf_counter()
        det = detect(graph)
        t3 = time.perf_counter()
        detect_median, detect_times = _median_time(lambda: detect(graph), repeats)
        rows.append({
            "model": name, "nodes": graph.number_of_nodes(), "chains": len(det.chains),
            "load_capture_s": round(t1 - t0, 3), "build_graph_s": round(t2 - t1, 3),
            "first_detect_s": round(t3 - t2, 4), "total_s": round(t3 - t0, 3),
            "detect_median_s": round(detect_median, 4),
            "detect_p20_s": round(sorted(detect_times)[len(detect_times) // 5], 4),
            "detect_p80_s": round(sorted(detect_times)[(4 * len(detect_times)) // 5], 4),
        })
        print(f"{name:<18} nodes {rows[-1]['nodes']:>5}  load+capture {rows[-1]['load_capture_s']:6.2f} s  "
              f"graph {rows[-1]['build_graph_s']:5.2f} s  detect {detect_median * 1000:7.1f} ms  "
              f"total {rows[-1]['total_s']:6.2f} s", flush=True)
    return rows


def bench_scaling(sizes: list[int], repeats: int) -> list[dict]:
    from explorer.fusion_engine import detect
    from explorer.graph.synthetic import residual_cnn_graph

    rows = []
    for nodes in sizes:
        graph = residual_cnn_graph((nodes - 2) // 7)
        median, _ = _median_time(lambda: detect(graph), repeats)
        rows.append({"nodes": graph.number_of_nodes(), "detect_median_s": round(median, 4),
                     "us_per_node": round(median / graph.number_of_nodes() * 1e6, 2)})
        print(f"synthetic {graph.number_of_nodes():>7} nodes: detect {median:7.3f} s "
              f"({rows[-1]['us_per_node']} us/node)", flush=True)
    return rows


def main() -> int:
    from explorer.sources import zoo

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default=",".join(zoo.ZOO), help="comma-separated zoo names")
    parser.add_argument("--sizes", default="10000,100000")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", default="")
    args = parser.parse_args()
    torch.set_num_threads(os.cpu_count() or 1)
    result = {
        "benchmark": "bench_detect",
        "command": " ".join([os.path.basename(sys.executable)] + sys.argv),
        "date_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": {"cpu_count": os.cpu_count(), "processor": platform.processor() or platform.machine(),
                    "python": platform.python_version(), "torch": torch.__version__,
                    "gpu": "none (CPU benchmark: capture and detection run on the CPU)"},
        "zoo": bench_zoo([m for m in args.models.split(",") if m], args.repeats),
        "scaling": bench_scaling([int(s) for s in args.sizes.split(",") if s], args.repeats),
    }
    scaling = result["scaling"]
    if len(scaling) >= 2:
        ratio = scaling[-1]["detect_median_s"] / scaling[0]["detect_median_s"]
        size_ratio = scaling[-1]["nodes"] / scaling[0]["nodes"]
        result["scaling_ratio"] = {"time": round(ratio, 2), "nodes": round(size_ratio, 2)}
        print(f"time ratio {ratio:.2f} for a node ratio of {size_ratio:.2f}")
    text = json.dumps(result, indent=2)
    if args.out:
        with open(args.out, "w") as fh:
            fh.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
