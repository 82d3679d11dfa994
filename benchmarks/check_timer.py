"""Check the runner's timer against independent ones: do its medians agree within ±5%?

For each case the runner measures the model as a user's run does
(``explorer.runtime.session.measure``, whole model only), then the same
prepared graphs are timed again, in the same process, by two timers that
share none of the runner's timing code:

- ``triton.testing.do_bench`` (``return_mode="median"``): CUDA events around
  each call, the L2 cache cleared between calls, no host synchronisation
  between calls;
- blocks of back-to-back calls between two CUDA events (``BLOCK`` calls per
  block, the median over blocks of the time per call): the steady-state
  throughput of issuing one forward after another.

The runner times one synchronised call per sample with its own pair of
events, alternating unfused and fused. A disagreement beyond ``TOLERANCE``
means one of them measures something else (an unsynchronised tail, a warm-up
left in the samples). The check passes when do_bench agrees with the runner
within ±5% for both the unfused and the fused model of every case; the blocks
are reported beside it (for host-bound plain calls they can be faster: the host
issues the next forward while the GPU runs this one).

Cases: ResNet-50 fp16 batch 32 channels_last and BERT-base fp16 batch 32, seq 128; each as plain
calls and (``--cuda-graphs``, the default: both) replayed as CUDA graphs.

Usage::

    python benchmarks/check_timer.py                  # CUDA, about 3-4 min on an H200
    python benchmarks/check_timer.py --smoke          # CPU, tiny models, perf_counter blocks: proves the paths

Writes ``$OUT/check_timer.json`` (else ``benchmarks/results/check_timer.json``; ``--out``): the
command, date, device and library versions, settings, every timer's summary per variant, and the
verdict; prints a table last. Exit status 1 when the check fails on CUDA; without CUDA (and without
``--smoke``) it says so and exits 0.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

TOLERANCE = 0.05
BLOCK = 20
CASES = (("resnet50_fp16", "resnet50", 32, None, "fp16", "channels_last"),
         ("bert_base_fp16", "bert_base", 32, 128, "fp16", "nchw"))
SMOKE_CASES = (("residual_block_fp32", "residual_block", 2, None, "fp32", "channels_last"),
               ("transformer_block_fp32", "transformer_block", 2, 16, "fp32", "nchw"))


def _blocks(fn: Callable[[], Any], device: str, blocks: int, block: int = BLOCK) -> dict[str, float]:
    """Median over ``blocks`` of (time of ``block`` back-to-back calls) / ``block``, in ms."""
    import torch

    per_call = []
    with torch.inference_mode():
        for _ in range(3):
            fn()
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        for _ in range(blocks):
            if device.startswith("cuda"):
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                for _ in range(block):
                    fn()
                end.record()
                end.synchronize()
                per_call.append(start.elapsed_time(end) / block)
            else:
                t0 = time.perf_counter()
                for _ in range(block):
                    fn()
                per_call.append((time.perf_counter() - t0) * 1e3 / block)
    return {"median": statistics.median(per_call), "min": min(per_call), "max": max(per_call),
            "blocks": blocks, "calls_per_block": block}


def _do_bench(fn: Callable[[], Any], rep_ms: float) -> dict[str, float] | None:
    """``triton.testing.do_bench`` median (ms), or None without Triton or CUDA."""
    import torch

    if not torch.cuda.is_available():
        return None
    try:
        from triton.testing import do_bench
    except ImportError:
        return None
    with torch.inference_mode():
        median = do_bench(fn, warmup=100, rep=rep_ms, return_mode="median")
        p20, p80 = do_bench(fn, warmup=25, rep=rep_ms, quantiles=[0.2, 0.8])
    return {"median": float(median), "p20": float(p20), "p80": float(p80), "rep_ms": rep_ms}


def check_case(key: str, model_name: str, batch: int, seq_len: int | None, dtype_name: str, layout: str,
               device: str, graphs: bool, rep_ms: float, blocks: int, smoke: bool, log) -> dict[str, Any]:
    """The runner's medians for one case and one lever setting, then the independent timers' on the same graphs."""
    import torch

    from explorer.fusion_engine import analyze, fuse
    from explorer.fusions.plan import make_plan
    from explorer.runtime import measure as m
    from explorer.runtime.session import measure
    from explorer.runtime.settings import RunSettings
    from explorer.runtime.variants import make_variant

    analysis = analyze(model_name, batch=batch, seq_len=seq_len)
    model, _graph, det = analysis
    plan = make_plan(det, "all", memory_format=layout, cuda_graphs=graphs)
    settings = RunSettings(device=device, dtype=dtype_name, batch=batch, seq_len=seq_len, per_chain=False,
                           stages=False, quick=smoke)
    log(f"[{key}{' graphs' if graphs else ''}] the runner's measurement")
    report = measure(model_name, plan.to_dict(), settings)
    runner = {"unfused": report.unfused.latency, "fused": report.fused.latency}

    log(f"[{key}{' graphs' if graphs else ''}] independent timers on the same prepared graphs")
    dtype = m.torch_dtype(dtype_name)
    channels_last = layout == "channels_last"
    fused = fuse(analysis, plan, device)
    graphs_gm = {"unfused": m.prepare_graph(model.gm, device, dtype, channels_last),
                 "fused": m.prepare_graph(fused.gm, device, dtype, channels_last)}
    inputs = m.prepare_inputs(model.example_inputs, device, dtype, channels_last)
    rows = {}
    threads_before = torch.get_num_threads()
    if not device.startswith("cuda") and report.environment.extra.get("cpu_threads"):
        torch.set_num_threads(int(report.environment.extra["cpu_threads"]))  # the runner's own thread count
    for name, gm in graphs_gm.items():
        variant = make_variant(name, gm, inputs, device, cuda_graphs=graphs)
        bench = _do_bench(variant.timed, rep_ms)
        block = _blocks(variant.timed, device, blocks)
        r = runner[name]
        primary = bench["median"] if bench else block["median"]
        rows[name] = {
            "runner": {"median": r.median, "p20": r.p20, "p80": r.p80, "reps": r.reps},
            "do_bench": bench, "blocks": block, "cuda_graph": variant.cuda_graph,
            "primary_timer": "do_bench" if bench else "blocks",
            "deviation": primary / r.median - 1.0,
            "blocks_deviation": block["median"] / r.median - 1.0,
        }
        rows[name]["agrees"] = abs(rows[name]["deviation"]) <= TOLERANCE
        del variant
        if device.startswith("cuda"):
            torch.cuda.synchronize()
    torch.set_num_threads(threads_before)
    return {"case": key, "cuda_graphs": graphs, "memory_format": layout, "variants": rows,
            "runner_verdict": report.verdict.describe(),
            "agrees": all(v["agrees"] for v in rows.values())}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", "--quick", action="store_true", dest="smoke",
                        help="CPU, tiny models, perf_counter blocks as the independent timer (tolerance not enforced)")
    parser.add_argument("--device", default=None)
    parser.add_argument("--graphs", default="both", choices=["both", "plain", "cuda_graphs"],
                        help="time plain calls, CUDA-graph replays, or both")
    parser.add_argument("--rep-ms", type=float, default=1000.0, help="do_bench's timing budget per variant (ms)")
    parser.add_argument("--blocks", type=int, default=30, help="blocks of back-to-back calls per variant")
    parser.add_argument("--budget-s", type=float, default=420.0, help="start no new case after this many seconds")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)

    import torch

    from explorer.runtime import measure as m

    out_path = Path(args.out) if args.out else (Path(os.environ["OUT"]) / "check_timer.json" if os.environ.get("OUT")
                                                 else ROOT / "benchmarks" / "results" / "check_timer.json")
    out_path.parent.mkdir(parents=True, exist_ok=True)
    doc: dict[str, Any] = {"command": " ".join([os.path.basename(sys.executable), *sys.argv]),
                           "date_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                           "tolerance": TOLERANCE, "results": []}
    device = args.device or ("cpu" if args.smoke else "cuda")
    if device.startswith("cuda") and not torch.cuda.is_available():
        doc["skipped"] = "no CUDA device here: run with --smoke for the CPU path"
        out_path.write_text(json.dumps(doc, indent=1))
        print(f"check_timer: skipped ({doc['skipped']}); wrote {out_path}")
        return 0
    device = m.resolve_device(device)
    doc["environment"] = m.environment(device)
    doc["settings"] = {"graphs": args.graphs, "rep_ms": args.rep_ms, "blocks": args.blocks, "block": BLOCK,
                       "smoke": args.smoke}
    started = time.perf_counter()

    def log(msg: str) -> None:
        print(f"[{time.perf_counter() - started:6.1f}s] {msg}", file=sys.stderr, flush=True)

    levers = {"both": (False, True), "plain": (False,), "cuda_graphs": (True,)}[args.graphs]
    if not device.startswith("cuda"):
        levers = (False,)
    for case in (SMOKE_CASES if args.smoke else CASES):
        for graphs in levers:
            if time.perf_counter() - started > args.budget_s:
                doc["results"].append({"case": case[0], "cuda_graphs": graphs,
                                       "error": f"not started: the {args.budget_s:.0f} s budget was spent"})
                continue
            try:
                doc["results"].append(check_case(*case, device, graphs, args.rep_ms,
                                                 max(5, args.blocks // (6 if args.smoke else 1)), args.smoke, log))
            except Exception as exc:
                import traceback

                traceback.print_exc()
                doc["results"].append({"case": case[0], "cuda_graphs": graphs, "error": m._one_line(exc)})
            out_path.write_text(json.dumps(doc, indent=1, default=str))
    done = [r for r in doc["results"] if "error" not in r]
    doc["agrees"] = bool(done) and all(r["agrees"] for r in done) and len(done) == len(doc["results"])
    doc["wall_s"] = round(time.perf_counter() - started, 1)
    out_path.write_text(json.dumps(doc, indent=1, default=str))

    env = doc["environment"]
    print(f"{env.get('device_name')} torch {env['torch']} triton {env['triton']} driver {env.get('driver')} "
          f"({doc['date_utc']}); tolerance ±{TOLERANCE:.0%}")
    print(f"{'case':<24}{'levers':<12}{'variant':<9}{'runner':>9}{'do_bench':>10}{'blocks':>9}{'dev':>8}{'blk dev':>9}  ok")
    for r in doc["results"]:
        if "error" in r:
            print(f"{r['case']:<24}{'graphs' if r['cuda_graphs'] else 'plain':<12}FAILED: {r['error']}")
            continue
        for name, v in r["variants"].items():
            bench = v["do_bench"]["median"] if v["do_bench"] else float("nan")
            print(f"{r['case']:<24}{'graphs' if r['cuda_graphs'] else 'plain':<12}{name:<9}{v['runner']['median']:>9.3f}"
                  f"{bench:>10.3f}{v['blocks']['median']:>9.3f}{v['deviation']:>+8.1%}{v['blocks_deviation']:>+9.1%}"
                  f"  {'yes' if v['agrees'] else 'NO'}")
    print(f"check: {'PASS' if doc['agrees'] else 'FAIL'}" + (" (smoke on the CPU: not enforced)" if args.smoke else ""))
    print(f"wrote {out_path}")
    return 0 if (doc["agrees"] or args.smoke) else 1


if __name__ == "__main__":
    sys.exit(main())
