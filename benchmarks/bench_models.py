"""Benchmark whole models: eager vs all fusions (NCHW / channels_last, ± CUDA graphs) vs torch.compile.

Cases (the issue's list)::

    resnet50_fp32      ResNet-50    batch 32            fp32
    resnet50_fp16      ResNet-50    batch 32            fp16
    mobilenet_v2_fp32  MobileNetV2  batch 32            fp32
    bert_base_fp16     BERT-base    batch 32, seq 128   fp16

Variants: eager (± CUDA graphs), fused (± CUDA graphs; the graph made lean by
``explorer.lean``, as the runner times it), ``fused*_plain_calls`` (the same
fused graph without ``explorer.lean``: what resolving each call once buys), and
torch.compile.

Every variant of a case is timed in the same run by the same method as the
runner (``explorer.measure``): warm-up, CUDA events per call, the variants
alternated round after round, median with p20/p80; plus peak memory, CUDA
kernels per forward (torch.profiler), error against a float64 reference of the
unfused graph, and the per-chain micro-benchmark summary (how many fused chains
are faster / slower beyond the spread / within noise).

Usage::

    python benchmarks/bench_models.py                       # all cases, CUDA, ~8 min on an H200
    python benchmarks/bench_models.py --models bert_base_fp16,resnet50_fp16
    python benchmarks/bench_models.py --quick               # CPU, tiny models: proves the script runs

Writes one JSON (``--out``, default ``$OUT/bench_models.json``, else
``benchmarks/results/bench_models.json``) holding the command, the date, the
device and library versions and every number, after each case (a run cut short
keeps the finished cases), and prints a compact table last.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


@dataclasses.dataclass(frozen=True)
class Case:
    key: str
    model: str
    batch: int
    seq_len: int | None
    dtype: str
    cnn: bool


CASES = (
    Case("resnet50_fp32", "resnet50", 32, None, "fp32", True),
    Case("resnet50_fp16", "resnet50", 32, None, "fp16", True),
    Case("mobilenet_v2_fp32", "mobilenet_v2", 32, None, "fp32", True),
    Case("bert_base_fp16", "bert_base", 32, 128, "fp16", False),
)
QUICK_CASES = (
    Case("residual_block_fp32", "residual_block", 2, None, "fp32", True),
    Case("transformer_block_fp32", "transformer_block", 2, 32, "fp32", False),
)


def bench_case(case: Case, device: str, compile_baseline: bool, chains: bool, chain_budget_s: float,
               target_s: float | None, log, lean_ablation: bool = True) -> dict[str, Any]:
    """Measure one case; returns its JSON-able result."""
    import torch

    from explorer.fusion_engine import analyze, fuse
    from explorer.fusions.plan import make_plan
    from explorer.runtime import measure as m
    from explorer.runtime.chains import chain_benchmarks
    from explorer.runtime.settings import RunSettings
    from explorer.runtime.variants import make_variant, measure_variants, reference_output

    t0 = time.perf_counter()
    dtype = m.torch_dtype(case.dtype)
    cuda = device.startswith("cuda")
    log(f"[{case.key}] loading")
    analysis = analyze(case.model, batch=case.batch, seq_len=case.seq_len)
    model, graph, det = analysis
    plan = make_plan(det, "all")
    fused = fuse(analysis, plan, device)
    fused_ids = [a.chain_id for a in fused.applied if a.status == "fused"]
    failed = [dataclasses.asdict(a) for a in fused.applied if a.status != "fused"]
    classification = model.task == "classification"

    log(f"[{case.key}] float64 reference")
    ref, ref_where = reference_output(model.gm, model.example_inputs, device)

    formats = (False, True) if case.cnn else (False,)
    variants = []
    outputs: dict[str, Any] = {}
    notes: list[str] = []
    for cl in formats:
        suffix = "_channels_last" if cl else ""
        x = m.prepare_inputs(model.example_inputs, device, dtype, cl)
        if model.module is not None:
            eager = m.prepare_module(model.module, device, dtype, cl)
            variants.append(make_variant("eager" + suffix, eager, x, device))
            if cuda:  # so that the CUDA-graph gain is not credited to fusion
                variants.append(make_variant("eager" + suffix + "_cuda_graphs", eager, x, device, cuda_graphs=True))
        fgm = m.prepare_graph(fused.gm, device, dtype, cl)
        variants.append(make_variant("fused" + suffix, fgm, x, device))
        if lean_ablation:  # the same fused graph without explorer.lean: what resolving calls once buys
            plain = m.prepare_graph(fused.gm, device, dtype, cl, lean=False)
            variants.append(make_variant("fused" + suffix + "_plain_calls", plain, x, device))
        if cuda:
            variants.append(make_variant("fused" + suffix + "_cuda_graphs", fgm, x, device, cuda_graphs=True))
        if not cl and compile_baseline and model.module is not None:
            log(f"[{case.key}] torch.compile (default mode)")
            try:
                target = m.prepare_module(model.module, device, dtype)
                compiled = torch.compile(target)
                tc = time.perf_counter()
                with torch.inference_mode():
                    compiled(*x)
                m.synchronize(device)
                notes.append(f"torch.compile first call (compile) {time.perf_counter() - tc:.1f} s")
                v = make_variant("torch_compile", compiled, x, device)
                v.resident_bytes = m.weight_bytes(target) + m.tensor_bytes(x)
                variants.append(v)
            except Exception as exc:
                notes.append(f"torch.compile failed: {m._one_line(exc)}")
    for v in variants:
        with torch.inference_mode():
            outputs[v.name] = m.precision(v.forward(), ref, classification)
    timing = m.TimingPlan.for_device(device)
    if target_s is not None:
        timing = dataclasses.replace(timing, target_s=target_s)
    log(f"[{case.key}] timing {len(variants)} variants alternated")
    ratio = m.element_ratio(dtype)
    bytes_unfused = m.graph_bytes(graph, dtype)
    bytes_fused = int(bytes_unfused - ratio * sum(det.chain(c).bytes_saved for c in fused_ids))
    res = measure_variants(variants, device, timing, model.batch)
    for name, r in res.items():
        r["precision"] = outputs[name]
        r["bytes_moved"] = bytes_fused if name.startswith("fused") else bytes_unfused
    del variants

    chain_summary: dict[str, Any] | None = None
    if chains:
        log(f"[{case.key}] per-chain micro-benchmarks (budget {chain_budget_s:.0f} s)")
        accepted = [c for c in det.chains if c.id in set(plan.accepted)]
        applied = {a.chain_id: a for a in fused.applied}
        start = time.perf_counter()
        timed, rows = [], []
        for chain in accepted:
            if time.perf_counter() - start > chain_budget_s:
                break
            timed.append(chain)
            rows += chain_benchmarks(model, graph, det, [chain], applied, device, dtype, RunSettings(),
                                     lambda f, s: None)
        verdicts = [r.get("verdict") for r in rows]
        chain_summary = {
            "accepted": len(accepted), "timed": len(timed),
            "not_timed_budget": len(accepted) - len(timed),
            "faster": verdicts.count("faster"), "slower": verdicts.count("slower"),
            "slower_in_graph": sum(1 for r in rows if r.get("slower_in_graph")),
            "within_noise": verdicts.count("within noise"),
            "failed": sum(1 for r in rows if r["status"] == "failed"),
            "slower_chains": [{"id": r["id"], "speedup": r["speedup"], "graph_speedup": r.get("graph_speedup"),
                               "implementation": r["implementation"]} for r in rows if r.get("slower")],
            "by_pattern": _by_pattern(rows),
            "rows": rows,
        }
    eager_ms = (res.get("eager") or {}).get("latency_ms", {}).get("median")
    for r in res.values():
        r["speedup_vs_eager"] = (eager_ms / r["latency_ms"]["median"]) if eager_ms else None
    return {
        "case": case.key, "model": case.model, "batch": case.batch, "seq_len": case.seq_len, "dtype": case.dtype,
        "chains_detected": len(det.chains), "chains_fused": len(fused_ids), "apply_failures": failed,
        "reference": ref_where, "variants": res, "chains": chain_summary, "notes": notes,
        "timing": dataclasses.asdict(timing), "wall_s": round(time.perf_counter() - t0, 1),
    }


def _by_pattern(rows: list[dict]) -> dict[str, dict]:
    out: dict[str, dict] = {}
    for r in rows:
        if r.get("speedup") is None:
            continue
        d = out.setdefault(r["pattern"], {"n": 0, "slower": 0, "speedups": []})
        d["n"] += 1
        d["slower"] += bool(r.get("slower"))
        d["speedups"].append(r["speedup"])
    for d in out.values():
        s = sorted(d.pop("speedups"))
        d["median_speedup"] = s[len(s) // 2]
        d["min_speedup"], d["max_speedup"] = s[0], s[-1]
    return out


def table(results: list[dict]) -> str:
    lines = [f"{'case':<24}{'variant':<34}{'median ms':>10}{'p20':>9}{'p80':>9}{'items/s':>10}"
             f"{'vs eager':>9}{'kernels':>8}{'peak MiB':>9}{'rel_l2':>9}"]
    for c in results:
        for name, r in c["variants"].items():
            lat = r["latency_ms"]
            peak = r.get("peak_memory_bytes")
            rel = (r.get("precision") or {}).get("rel_l2")
            sp = r.get("speedup_vs_eager")
            if "failed" in (r.get("note") or ""):
                name += " (!)"  # e.g. CUDA-graph capture failed: timed as plain calls, reason in the notes below
            lines.append(f"{c['case']:<24}{name:<34}{lat['median']:>10.3f}{lat['p20']:>9.3f}{lat['p80']:>9.3f}"
                         f"{(r.get('throughput') or 0):>10.1f}{(f'{sp:.2f}x' if sp else '-'):>9}"
                         f"{str(r.get('kernel_launches', '-')):>8}"
                         f"{(f'{peak / 2**20:.0f}' if peak else '-'):>9}"
                         f"{(f'{rel:.1e}' if isinstance(rel, float) else '-'):>9}")
        ch = c.get("chains")
        if ch:
            lines.append(f"{c['case']:<24}chains: {ch['timed']}/{ch['accepted']} timed, {ch['faster']} faster, "
                         f"{ch['slower']} slower, {ch['within_noise']} within noise, {ch['failed']} failed"
                         f" (synchronised calls); as CUDA graphs {ch['slower_in_graph']} slower")
        for name, r in c["variants"].items():
            if "failed" in (r.get("note") or ""):
                lines.append(f"{c['case']:<24}(!) {name}: {r['note'][:150]}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="CPU, tiny models (proves the script works)")
    parser.add_argument("--models", default="", help="comma-separated case keys (default: all): "
                        + ", ".join(c.key for c in CASES + QUICK_CASES))
    parser.add_argument("--device", default=None, help="cuda | cpu (default: cuda, cpu with --quick)")
    parser.add_argument("--no-compile", action="store_true", help="skip the torch.compile baseline")
    parser.add_argument("--compile", action="store_true", help="with --quick: also run torch.compile")
    parser.add_argument("--no-chains", action="store_true", help="skip the per-chain micro-benchmarks")
    parser.add_argument("--no-lean-ablation", action="store_true",
                        help="skip the fused graph without explorer.lean (variant fused*_plain_calls)")
    parser.add_argument("--chain-budget-s", type=float, default=40.0, help="wall budget per case for chains")
    parser.add_argument("--target-s", type=float, default=None, help="timing seconds per variant (adaptive reps)")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)

    import torch

    from explorer.runtime import measure as m

    device = args.device or ("cpu" if args.quick else "cuda")
    device = m.resolve_device(device)
    pool = QUICK_CASES if args.quick else CASES
    wanted = [k.strip() for k in args.models.split(",") if k.strip()]
    by_key = {c.key: c for c in CASES + QUICK_CASES}
    unknown = [k for k in wanted if k not in by_key]
    if unknown:
        parser.error(f"unknown case(s) {', '.join(unknown)}")
    cases = [by_key[k] for k in wanted] if wanted else list(pool)
    compile_baseline = (args.compile or not args.quick) and not args.no_compile
    target_s = args.target_s if args.target_s is not None else (0.2 if args.quick else 1.0)
    out_path = Path(args.out) if args.out else (Path(os.environ["OUT"]) / "bench_models.json" if os.environ.get("OUT")
                                                 else ROOT / "benchmarks" / "results" / "bench_models.json")
    out_path.parent.mkdir(parents=True, exist_ok=True)
    env = m.environment(device)
    env["tf32_matmul"] = bool(torch.backends.cuda.matmul.allow_tf32)
    env["tf32_cudnn"] = bool(torch.backends.cudnn.allow_tf32)
    doc: dict[str, Any] = {
        "command": " ".join([os.path.basename(sys.executable), *sys.argv]),
        "date_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "label": "CPU run: numbers are CPU numbers, not GPU numbers" if env["is_cpu"] else "GPU run",
        "environment": env,
        "method": ("warm-up, then variants alternated per round (ABBA), one forward per timed call, CUDA events "
                   "(perf_counter on CPU), median with p20/p80 in ms; throughput = batch / median; peak memory = own "
                   "weights + inputs + max_memory_allocated increase over one forward; kernels = CUDA kernel events "
                   "in one forward (torch.profiler; with CUDA graphs the same kernels, one graph launch); precision "
                   "vs the unfused graph in float64; bytes from the graph byte model scaled to the dtype"),
        "cases": [],
    }
    started = time.perf_counter()

    def log(msg: str) -> None:
        print(f"[{time.perf_counter() - started:6.1f}s] {msg}", file=sys.stderr, flush=True)

    for case in cases:
        try:
            result = bench_case(case, device, compile_baseline, not args.no_chains, args.chain_budget_s,
                                target_s, log, lean_ablation=not args.no_lean_ablation)
        except Exception as exc:  # one failed case must not lose the others
            import traceback

            traceback.print_exc()
            result = {"case": case.key, "error": m._one_line(exc), "variants": {}}
            if device.startswith("cuda"):
                torch.cuda.empty_cache()
        doc["cases"].append(result)
        doc["wall_s"] = round(time.perf_counter() - started, 1)
        out_path.write_text(json.dumps(doc, indent=1, default=str))
        log(f"[{case.key}] done in {result.get('wall_s', '?')} s; wrote {out_path}")
        if device.startswith("cuda"):
            torch.cuda.empty_cache()
    print(f"{doc['label']}: {env.get('device_name')} torch {env['torch']} cuda {env['cuda']} "
          f"triton {env['triton']} driver {env.get('driver')}  ({doc['date_utc']})")
    print(table([c for c in doc["cases"] if "error" not in c]))
    for c in doc["cases"]:
        if "error" in c:
            print(f"{c['case']}: FAILED: {c['error']}")
    print(f"wrote {out_path}")
    return 0 if all("error" not in c for c in doc["cases"]) else 1


if __name__ == "__main__":
    sys.exit(main())
