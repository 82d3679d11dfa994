"""One target, one decision, on the GPU: the fused model made for its Target runs the same kernels as before.

Before issue 21's change the rewrite chose each chain's kernel for the device alone (the capture's float32) and
the lowering of the lean graph chose again for the run's dtype. That path still exists (a graph fused for a device
name alone: its recorded choices are for fp32, so the lowering asks the selection again), so both run in one tree:

    legacy  fuse(analysis, plan, "cuda")                      then prepare_graph(..., dtype): the lowering decides
    target  fuse(analysis, plan, Target("cuda", dtype, fmt))  then prepare_graph(..., dtype): it reads the choice

For each case it records whether the two lean graphs call the same targets, whether their outputs are bitwise
equal, how many selection calls each preparation made (``explorer.fusions.base.counting``), and both forwards'
median time (alternated rounds, ``explorer.runtime.measure.time_paired``). Cases run in order until
``--budget-s`` is spent; the skipped ones are listed. ``--smoke`` runs one small case on the CPU (plumbing only,
no GPU numbers)::

    python3 benchmarks/bench_target_equivalence.py --budget-s 80       # JSON: $OUT/bench_target_equivalence.json
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._common import bench_device, elapsed_logger, results_path, run_stamp, write_json  # noqa: E402

#: (zoo model, batch, dtype, memory format), in order, the fewest that cover every family's lowering on CUDA:
#: conv (ResNet-50), the conv selection given nchw (MobileNetV2: its 1×1 and depthwise convs over contiguous
#: inputs are lowered to conv2d + bias_act_ for the target, to the GEMM / depthwise calls that fall back to those
#: same kernels at run time for the legacy graph, so the calls differ by design and the outputs must not), linear
#: + attention + Add+LayerNorm (BERT: both handed their choice), RMSNorm + SwiGLU + rotary + siblings (the
#: decoder), ConvNeXt's block and LayerNorm2d (ConvNeXt-T). Small batches: the check is equality, not speed.
CASES = [("resnet50", 4, "fp16", "channels_last"), ("mobilenet_v2", 4, "fp16", "nchw"),
         ("bert_base", 2, "fp16", "nchw"), ("llama_decoder", 1, "bf16", "nchw"), ("convnext_tiny", 2, "bf16", "channels_last")]
SMOKE_CASES = [("residual_block", 2, "fp32", "nchw"), ("transformer_block", 2, "fp32", "nchw")]


def run_case(model: str, batch: int, dtype_name: str, fmt: str, device: str) -> dict:
    import statistics
    from collections import Counter

    import torch

    from explorer.fusion_engine import analyze, fuse
    from explorer.fusions.base import counting
    from explorer.fusions.plan import make_plan
    from explorer.runtime import measure as m
    from explorer.vocab import Target

    analysis = analyze(model, batch=batch)
    plan = make_plan(analysis.detection, "all", memory_format=fmt)
    dtype, channels_last = m.torch_dtype(dtype_name), fmt == "channels_last"
    graphs, selections = {}, {}
    for name, target in (("legacy", device), ("target", Target(device, dtype_name, fmt))):
        fused = fuse(analysis, plan, target)
        with counting() as calls:
            graphs[name] = m.prepare_graph(fused.gm, device, dtype, channels_last)
        selections[name] = sum(calls.values())
    x = m.prepare_inputs(analysis.model.example_inputs, device, dtype, channels_last)
    calls_of = {k: [getattr(n.target, "__name__", str(n.target)) for n in g.graph.nodes if n.op == "call_function"]
                for k, g in graphs.items()}
    with torch.inference_mode():
        outs = {k: g(*x) for k, g in graphs.items()}
        equal = all(torch.equal(a, b) for a, b in zip(torch.utils._pytree.tree_leaves(outs["legacy"]),
                                                        torch.utils._pytree.tree_leaves(outs["target"])))
        plan_t = m.TimingPlan.for_device(device, warmup=3, reps=10, quick=True)   # short: equality comes first
        samples = m.time_paired({k: (lambda g=g: g(*x)) for k, g in graphs.items()}, (("legacy", "target"),),
                                device, plan_t)
    return {"model": model, "batch": batch, "dtype": dtype_name, "memory_format": fmt,
            "same_calls": calls_of["legacy"] == calls_of["target"], "bitwise_equal": bool(equal),
            "calls_only_in": {k: dict(Counter(calls_of[k]) - Counter(calls_of[o]))
                              for k, o in (("legacy", "target"), ("target", "legacy"))},
            "selection_calls_in_lowering": selections,
            "median_ms": {k: statistics.median(v) for k, v in samples.items()},
            "rounds": {k: len(v) for k, v in samples.items()}}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--budget-s", type=float, default=80.0, help="start no case after this many seconds")
    ap.add_argument("--smoke", action="store_true", help="one small case on the CPU (no GPU numbers)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    started = time.perf_counter()
    log = elapsed_logger(started)
    device = bench_device("bench_target_equivalence", args.smoke)
    path = results_path(args.out, "bench_target_equivalence.json")
    doc: dict = {"schema": "target_equivalence/1", **run_stamp(), "smoke": args.smoke, "cases": [], "skipped": []}
    if device is None:
        doc["skipped"] = ["no CUDA device"]
        write_json(path, doc)
        return 0
    import torch

    doc["environment"] = {"torch": torch.__version__,
                          "device": torch.cuda.get_device_name() if device == "cuda" else "cpu"}
    for case in SMOKE_CASES if args.smoke else CASES:
        if time.perf_counter() - started > args.budget_s:
            doc["skipped"].append(list(case))
            continue
        log(f"{case}")
        try:
            doc["cases"].append(run_case(*case, device))
        except Exception as exc:  # one case's failure is recorded, the others go on
            doc["cases"].append({"case": list(case), "error": f"{type(exc).__name__}: {str(exc)[:300]}"})
        write_json(path, doc)
    write_json(path, doc)
    print(f"{'case':44} {'same calls':>10} {'bitwise':>8} {'legacy ms':>10} {'target ms':>10} {'sel. calls':>12}")
    for c in doc["cases"]:
        if "error" in c:
            print(f"{str(c['case']):44} error: {c['error'][:60]}")
            continue
        key = f"{c['model']} b{c['batch']} {c['dtype']} {c['memory_format']}"
        sel = c["selection_calls_in_lowering"]
        print(f"{key:44} {str(c['same_calls']):>10} {str(c['bitwise_equal']):>8} {c['median_ms']['legacy']:>10.3f} "
              f"{c['median_ms']['target']:>10.3f} {sel['legacy']:>5}/{sel['target']:<5}")
    if doc["skipped"]:
        print(f"skipped (budget): {doc['skipped']}")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
