"""Benchmark whole models fairly: the fused model against eager and torch.compile, like with like.

Every comparison pairs like with like (the issue's rule):

- one memory format per case for every variant (CNNs: channels_last for eager, fused and every
  torch.compile mode alike; ``--layout nchw`` to compare in NCHW);
- plain calls against plain calls: fused against eager, ``torch.compile`` default and, with
  ``--autotune``, ``max-autotune-no-cudagraphs`` (its compile time recorded: minutes);
- CUDA graphs against CUDA graphs: fused + CUDA graphs against eager + CUDA graphs and against
  ``torch.compile(mode="reduce-overhead")`` (torch.compile's own CUDA graphs).

It runs the runner's own baseline code (``explorer.runtime.baselines.baselines``): every variant
of a case is timed in the same alternated rounds (CUDA events, one synchronised call per sample),
the verdict of each pair is ``explorer.stats.compare`` over the paired rounds, and each variant
also gets its GPU busy time per forward (the profiler's summed kernel time: a variant whose busy
time is well under its latency is host-bound), its kernel count, peak memory and error against a
float64 reference.

Cases::

    resnet50_fp16      ResNet-50    batch 32           fp16   channels_last
    bert_base_fp16     BERT-base    batch 32, seq 128  fp16
    mobilenet_v2_fp16  MobileNetV2  batch 32           fp16   channels_last
    resnet50_fp32      ResNet-50    batch 32           fp32   channels_last   (on request)

Usage::

    python benchmarks/bench_models.py                       # the three fp16 cases, CUDA, about 6-8 min on an H200
    python benchmarks/bench_models.py --models resnet50_fp16,bert_base_fp16 --autotune
    python benchmarks/bench_models.py --smoke               # CPU, tiny models, default mode: proves every path

``--budget-s`` stops starting new cases once spent (a case already started finishes). Writes one
JSON (``--out``, default ``$OUT/bench_models.json``, else ``benchmarks/results/bench_models.json``)
after each case (a run cut short keeps the finished cases): the command, date, device, driver, CUDA,
cuDNN, torch and Triton versions, the settings and every variant's summary; prints a table last.
Without CUDA (and without ``--smoke``) it says so, writes the JSON with the reason and exits 0.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks._common import (ModelCase, elapsed_logger, results_path, run_stamp, write_json,  # noqa: E402
                                 write_skipped)

#: The CNN cases are channels_last unless ``--layout nchw`` says otherwise; the others are "nchw" (plain).
CASES = (
    ModelCase("resnet50_fp16", "resnet50", 32, None, "fp16", "channels_last"),
    ModelCase("bert_base_fp16", "bert_base", 32, 128, "fp16", "nchw"),
    ModelCase("mobilenet_v2_fp16", "mobilenet_v2", 32, None, "fp16", "channels_last"),
    ModelCase("resnet50_fp32", "resnet50", 32, None, "fp32", "channels_last"),
)
DEFAULT_CASES = ("resnet50_fp16", "bert_base_fp16", "mobilenet_v2_fp16")
SMOKE_CASES = (
    ModelCase("residual_block_fp32", "residual_block", 2, None, "fp32", "channels_last"),
    ModelCase("transformer_block_fp32", "transformer_block", 2, 16, "fp32", "nchw"),
)


def bench_case(case: ModelCase, device: str, layout: str, modes: tuple[str, ...], target_s: float | None,
               log) -> dict[str, Any]:
    """Measure one case with the runner's baselines; returns its JSON-able result."""
    import torch

    from explorer.fusion_engine import analyze, fuse
    from explorer.fusions.plan import make_plan
    from explorer.runtime import measure as m
    from explorer.runtime.baselines import baselines
    from explorer.runtime.settings import RunSettings
    from explorer.runtime.variants import reference_output

    t0 = time.perf_counter()
    dtype = m.torch_dtype(case.dtype)
    channels_last = case.memory_format == "channels_last" and layout == "channels_last"
    log(f"[{case.key}] loading")
    analysis = analyze(case.model, batch=case.batch, seq_len=case.seq_len)
    model, _graph, det = analysis
    plan = make_plan(det, "all", memory_format="channels_last" if channels_last else "nchw")
    fused = fuse(analysis, plan, device)
    fused_gm = m.prepare_graph(fused.gm, device, dtype, channels_last)
    inputs = m.prepare_inputs(model.example_inputs, device, dtype, channels_last)
    log(f"[{case.key}] float64 reference")
    ref, _where = reference_output(model.gm, model.example_inputs, device)
    settings = RunSettings(device=device, dtype=case.dtype, batch=case.batch, seq_len=case.seq_len,
                           compile_baseline=True, compile_modes=modes)
    timing = m.TimingPlan.for_device(device)
    if target_s is not None:
        timing = dataclasses.replace(timing, target_s=target_s)
    entries = baselines(model, fused_gm, inputs, device, dtype, channels_last, settings,
                        lambda f, s: log(f"[{case.key}] {s}"), ref=ref,
                        classification=model.task == "classification", timing=timing)
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    return {
        "case": case.key, "model": case.model, "batch": case.batch, "seq_len": case.seq_len,
        "dtype": case.dtype, "memory_format": "channels_last" if channels_last else "nchw",
        "chains_detected": len(det.chains),
        "chains_fused": sum(1 for a in fused.applied if a.status == "fused"),
        "variants": [dataclasses.asdict(e) for e in entries],
        "wall_s": round(time.perf_counter() - t0, 1),
    }


def table(results: list[dict]) -> str:
    """The short table printed last: each variant, its latency, GPU busy time, and its pair's verdict."""
    lines = [f"{'case':<24}{'variant':<44}{'median':>8}{'p20':>8}{'p80':>8}{'busy':>8}{'kern':>6}"
             f"{'rel_l2':>9}{'comp s':>7}  fused vs it"]
    for c in results:
        for v in c["variants"]:
            m = v.get("measurement") or {}
            lat = m.get("latency") or {}
            rel = (m.get("precision") or {}).get("rel_l2")
            verdict = v.get("verdict") or {}
            pair = (f"{v['pairs_with']}: {1 / verdict['ratio']:.2f}x {verdict['label']}"
                    if verdict.get("ratio") else (v.get("error") or "")[:60])

            def f(x: Any, d: int = 3) -> str:
                return f"{x:.{d}f}" if isinstance(x, (int, float)) else "-"

            lines.append(f"{c['case']:<24}{v['label'][:43]:<44}{f(lat.get('median')):>8}{f(lat.get('p20')):>8}"
                         f"{f(lat.get('p80')):>8}{f(m.get('gpu_busy_ms')):>8}{str(m.get('kernel_launches', '-')):>6}"
                         f"{(f'{rel:.1e}' if isinstance(rel, float) else '-'):>9}"
                         f"{f(v.get('compile_s'), 1):>7}  {pair}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", "--quick", action="store_true", dest="smoke",
                        help="CPU, tiny models, torch.compile default only: proves every code path runs")
    parser.add_argument("--models", default="", help="comma-separated case keys (default: "
                        + ", ".join(DEFAULT_CASES) + "); all: " + ", ".join(c.key for c in CASES + SMOKE_CASES))
    parser.add_argument("--device", default=None, help="cuda | cpu (default: cuda, cpu with --smoke)")
    parser.add_argument("--layout", default="channels_last", choices=["channels_last", "nchw"],
                        help="memory format of every variant of a CNN case")
    parser.add_argument("--autotune", action="store_true",
                        help="also torch.compile max-autotune-no-cudagraphs (compiles for minutes)")
    parser.add_argument("--target-s", type=float, default=None, help="timing seconds per variant (adaptive reps)")
    parser.add_argument("--budget-s", type=float, default=420.0, help="start no new case after this many seconds")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)

    from explorer.runtime import measure as m
    from explorer.runtime.settings import DEFAULT_COMPILE_MODES

    out_path = results_path(args.out, "bench_models.json")
    doc: dict[str, Any] = {**run_stamp(), "cases": []}
    import torch

    device = args.device or ("cpu" if args.smoke else "cuda")
    if device.startswith("cuda") and not torch.cuda.is_available():
        return write_skipped(doc, out_path, "bench_models")
    device = m.resolve_device(device)
    by_key = {c.key: c for c in CASES + SMOKE_CASES}
    wanted = [k.strip() for k in args.models.split(",") if k.strip()] or \
        ([c.key for c in SMOKE_CASES] if args.smoke else list(DEFAULT_CASES))
    unknown = [k for k in wanted if k not in by_key]
    if unknown:
        parser.error(f"unknown case(s) {', '.join(unknown)}")
    modes = ("default",) if args.smoke else DEFAULT_COMPILE_MODES + (("max-autotune-no-cudagraphs",)
                                                                      if args.autotune else ())
    target_s = args.target_s if args.target_s is not None else (0.2 if args.smoke else None)
    env = m.environment(device)
    env["tf32_matmul"] = bool(torch.backends.cuda.matmul.allow_tf32)
    env["tf32_cudnn"] = bool(torch.backends.cudnn.allow_tf32)
    doc.update({
        "label": "CPU run: numbers are CPU numbers, not GPU numbers" if env["is_cpu"] else "GPU run",
        "environment": env,
        "settings": {"cases": wanted, "layout": args.layout, "compile_modes": list(modes), "target_s": target_s,
                     "budget_s": args.budget_s},
        "method": ("the runner's baselines (explorer.runtime.baselines): every variant of a case in the same "
                   "alternated rounds, one synchronised call per sample timed with CUDA events (perf_counter on "
                   "the CPU), median with p20/p80 in ms; fused paired with eager/torch.compile default (and "
                   "max-autotune-no-cudagraphs), fused + CUDA graphs with eager + CUDA graphs and reduce-overhead; "
                   "verdicts: explorer.stats.compare on the paired rounds; gpu_busy_ms: summed CUDA kernel time of "
                   "one forward (torch.profiler); precision against the unfused graph in float64"),
    })
    started = time.perf_counter()
    log = elapsed_logger(started)
    for key in wanted:
        if time.perf_counter() - started > args.budget_s:
            doc["cases"].append({"case": key, "error": f"not started: the {args.budget_s:.0f} s budget was spent"})
            continue
        try:
            result = bench_case(by_key[key], device, args.layout, modes, target_s, log)
        except Exception as exc:  # one failed case must not lose the others
            import traceback

            traceback.print_exc()
            result = {"case": key, "error": m._one_line(exc), "variants": []}
        doc["cases"].append(result)
        doc["wall_s"] = round(time.perf_counter() - started, 1)
        write_json(out_path, doc)
        log(f"[{key}] done in {result.get('wall_s', '?')} s; wrote {out_path}")
        if device.startswith("cuda"):
            torch.cuda.empty_cache()
    print(f"{doc['label']}: {env.get('device_name')} torch {env['torch']} cuda {env['cuda']} cudnn {env['cudnn']} "
          f"triton {env['triton']} driver {env.get('driver')}  ({doc['date_utc']})")
    print(table([c for c in doc["cases"] if "error" not in c]))
    for c in doc["cases"]:
        if "error" in c:
            print(f"{c['case']}: FAILED: {c['error']}")
    print(f"wrote {out_path}")
    return 0 if all("error" not in c for c in doc["cases"]) else 1


if __name__ == "__main__":
    sys.exit(main())
