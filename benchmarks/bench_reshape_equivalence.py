"""Before and after the package reshape (issue 10): the same models, the same kernels, the same speed.

Two frozen copies of the package, renamed so that both import in one process
(``explorer_before`` from commit 677e76d, ``explorer_after`` from 6f852e3; made
by the command below), build the same zoo model, apply the same all-accepted
plan and prepare their graphs the way each runner does (lean calls, device,
dtype, memory format). This script then checks that the two fused graphs give
the same outputs and times the four graphs (unfused and fused, before and
after) alternated round by round with CUDA events, so that the clock and the
thermal state hit all of them alike. Its verdict on each pair is a bootstrap
95% confidence interval of the ratio of medians: "same within noise" when the
interval holds 1 or lies within ±3%.

    mkdir -p .gpu_trees
    for pair in "677e76d explorer_before" "6f852e3 explorer_after"; do set -- $pair
      tmp=$(mktemp -d); git archive $1 explorer | tar -x -C $tmp; mv $tmp/explorer .gpu_trees/$2
      grep -rl explorer .gpu_trees/$2 --include=*.py | xargs sed -i -E \\
        "s/\\bfrom explorer(\\.| import)/from $2\\1/g; s/\\bimport explorer\\b/import $2/g"
    done
    PYTHONPATH=.gpu_trees python benchmarks/bench_reshape_equivalence.py --out $OUT/reshape_equivalence_h200.json

The same script compares any two trees: for issue 21 (a family owns its words, shared kernels in
``fusions/kernels``, explicit order), ``f15471b`` (before) against the branch ``house-words`` (after),
made with the loop above and written to ``$OUT/house_words_equivalence_h200.json``.

Without CUDA it runs a small CPU smoke check (``--smoke``) and says that no GPU
number was measured.
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import importlib.util
import json
import platform
import random
import statistics
import sys
import time

import torch

CASES = {  # name: (zoo model, batch, seq_len, dtype, channels_last)
    "resnet50_fp16_cl": ("resnet50", 32, None, torch.float16, True),
    "bert_base_fp16": ("bert_base", 32, 128, torch.float16, False),
}
SMOKE = {"residual_block_fp32": ("residual_block", 2, None, torch.float32, False)}


def _build(pkg: str, model_name: str, batch: int, seq_len: int | None, device: str, dtype, cl: bool):
    """(unfused gm, fused gm, inputs) prepared the way the package's own runner prepares them."""
    engine = importlib.import_module(f"{pkg}.fusion_engine")
    model, _, det = engine.analyze(model_name, batch=batch, seq_len=seq_len)
    if importlib.util.find_spec(f"{pkg}.fusions.plan") is None:          # the layout before issue 10's reshape
        plan_mod, rewrite, measure = (importlib.import_module(f"{pkg}.{m}") for m in ("plan", "rewrite", "measure"))
        fused = rewrite.apply_plan(model, det, plan_mod.make_plan(det, "all"), device, level="all")
    else:
        plan_mod = importlib.import_module(f"{pkg}.fusions.plan")
        rewrite = importlib.import_module(f"{pkg}.fusions.rewrite")
        measure = importlib.import_module(f"{pkg}.runtime.measure")
        fused = rewrite.apply_plan(model.gm, det, plan_mod.make_plan(det, "all"), device, level="all")
    unfused_gm = measure.prepare_graph(model.gm, device, dtype, cl)
    fused_gm = measure.prepare_graph(fused.gm, device, dtype, cl)
    inputs = measure.prepare_inputs(model.example_inputs, device, dtype, cl)
    labels = sorted({a.implementation for a in fused.applied if a.status == "fused"})
    return unfused_gm, fused_gm, inputs, labels


def _first(out):
    return out[0] if isinstance(out, (tuple, list)) else out


def _time(fns: dict, device: str, rounds: int) -> dict[str, list[float]]:
    """Alternated rounds (ABCD, DCBA, ...): each call synchronised, timed with events (CUDA) or perf_counter."""
    names = list(fns)
    times = {n: [] for n in names}
    with torch.inference_mode():
        for n in names:  # warm-up
            for _ in range(5):
                fns[n]()
        if device == "cuda":
            torch.cuda.synchronize()
        for r in range(rounds):
            for n in (names if r % 2 == 0 else names[::-1]):
                if device == "cuda":
                    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    a.record()
                    fns[n]()
                    b.record()
                    b.synchronize()
                    times[n].append(a.elapsed_time(b))
                else:
                    t0 = time.perf_counter()
                    fns[n]()
                    times[n].append((time.perf_counter() - t0) * 1e3)
    return times


def _ratio_ci(before: list[float], after: list[float], seed: int = 0, draws: int = 2000) -> tuple[float, float, float]:
    """Median(after) / median(before) with a bootstrap 95% confidence interval."""
    rng = random.Random(seed)
    ratio = statistics.median(after) / statistics.median(before)
    boot = sorted(statistics.median(rng.choices(after, k=len(after))) /
                  statistics.median(rng.choices(before, k=len(before))) for _ in range(draws))
    return ratio, boot[int(0.025 * draws)], boot[int(0.975 * draws)]


def _summary(ts: list[float]) -> dict:
    xs = sorted(ts)
    q = lambda p: xs[min(len(xs) - 1, int(p * (len(xs) - 1)))]  # noqa: E731
    return {"median": statistics.median(xs), "p20": q(0.2), "p80": q(0.8), "n": len(xs)}


def run_case(key: str, spec, device: str, rounds: int) -> dict:
    name, batch, seq, dtype, cl = spec
    built = {pkg: _build(pkg, name, batch, seq, device, dtype, cl) for pkg in ("explorer_before", "explorer_after")}
    (ub, fb, xb, lb), (ua, fa, xa, la) = built["explorer_before"], built["explorer_after"]
    with torch.inference_mode():
        yb, ya = _first(fb(*xb)).float(), _first(fa(*xa)).float()
    rel = float((ya - yb).norm() / yb.norm().clamp_min(1e-30))
    times = _time({"unfused_before": lambda: ub(*xb), "unfused_after": lambda: ua(*xa),
                   "fused_before": lambda: fb(*xb), "fused_after": lambda: fa(*xa)}, device, rounds)
    out = {"case": key, "model": name, "batch": batch, "seq_len": seq, "dtype": str(dtype).replace("torch.", ""),
           "channels_last": cl, "fused_outputs_rel_l2_after_vs_before": rel,
           "labels_before": lb, "labels_after": la, "latency_ms": {k: _summary(v) for k, v in times.items()}}
    for side in ("unfused", "fused"):
        r, lo, hi = _ratio_ci(times[f"{side}_before"], times[f"{side}_after"])
        out[f"{side}_after_over_before"] = {"ratio": r, "ci95": [lo, hi],
                                            "verdict": "same within noise" if (lo <= 1 <= hi or (lo >= 0.97 and hi <= 1.03))
                                            else ("after faster" if hi < 1 else "after slower")}
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=200)
    ap.add_argument("--smoke", action="store_true", help="tiny CPU check of every code path")
    ap.add_argument("--out", help="write the JSON here")
    args = ap.parse_args(argv)
    cuda = torch.cuda.is_available() and not args.smoke
    device = "cuda" if cuda else "cpu"
    cases = CASES if cuda else SMOKE
    if not cuda:
        print("no CUDA GPU here (or --smoke): a CPU smoke check only, no GPU number is measured", file=sys.stderr)
    results = [run_case(k, v, device, args.rounds if cuda else 10) for k, v in cases.items()]
    doc = {"command": " ".join(sys.argv), "date": datetime.datetime.now(datetime.timezone.utc).isoformat(),
           "device": torch.cuda.get_device_name(0) if cuda else f"CPU ({platform.processor() or platform.machine()})",
           "torch": torch.__version__, "cuda": torch.version.cuda,
           "cudnn": torch.backends.cudnn.version() if cuda else None, "results": results}
    try:
        import triton
        doc["triton"] = triton.__version__
    except Exception:
        doc["triton"] = None
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(doc, fh, indent=2)
    print(f"{'case':<22}{'side':<9}{'before ms':>11}{'after ms':>10}{'ratio':>8}  95% CI          verdict   rel_l2")
    for r in results:
        for side in ("unfused", "fused"):
            v = r[f"{side}_after_over_before"]
            print(f"{r['case']:<22}{side:<9}{r['latency_ms'][side + '_before']['median']:>11.3f}"
                  f"{r['latency_ms'][side + '_after']['median']:>10.3f}{v['ratio']:>8.3f}  "
                  f"[{v['ci95'][0]:.3f}, {v['ci95'][1]:.3f}]  {v['verdict']}   {r['fused_outputs_rel_l2_after_vs_before']:.1e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
