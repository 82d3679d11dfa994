"""The teaching report: the seed's tables measured on whole models, on a GPU (ResNet-50 and BERT-base, fp16).

For each case (model, batch, dtype, memory format) it measures, with every
accepted chain fused (the plan "all"):

- the **time breakdown** of one forward before and after fusion
  (``explorer.runtime.breakdown``: launch and host overhead, memory-bound and
  compute-bound kernels, other; wall time against the profiler's device time);
- the **memory traffic** before and after, per chain and in total, from the
  byte model (``explorer.runtime.traffic``) and, where Nsight Compute works,
  the DRAM bytes of one forward measured by ``ncu`` beside it;
- the **staged table** (original → Conv+BN folded → + epilogues → all accepted);
- each chain's **predicted** gain (``explorer.teaching.predict``, from the
  ceilings measured at the start of this run) and its **measured** gain (each
  chain timed alone, ``explorer.runtime.chains``), within a time budget.

Cases::

    resnet50_fp16   ResNet-50   batch 32            fp16   channels_last (unfused and fused alike)
    bert_base_fp16  BERT-base   batch 32, seq 128   fp16

Usage::

    python3 benchmarks/teach_reports.py                 # both cases on CUDA, ncu when found: ~4-5 min on an H200
    python3 benchmarks/teach_reports.py --no-ncu        # without Nsight Compute: ~3 min
    python3 benchmarks/teach_reports.py --quick         # CPU smoke run on two tiny models: ~30 s, proves the script
    python3 benchmarks/teach_reports.py --quick --device cuda   # the same tiny models on the GPU: ~1 min

Without CUDA (and without ``--quick`` or ``--device cpu``) it says so in one
line and exits with status 2. Writes one JSON (``--out``, default
``$OUT/teaching_report.json``, else ``benchmarks/results/teaching_report.json``)
after each case, holding the command, the date, the GPU, driver and library
versions and every number (``explorer.teaching.report`` validates it; the
Learn page opens it), and prints a short table last.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks._common import ModelCase, elapsed_logger, results_path, run_stamp  # noqa: E402

CASES = (
    ModelCase("resnet50_fp16", "resnet50", 32, None, "fp16", "channels_last"),
    ModelCase("bert_base_fp16", "bert_base", 32, 128, "fp16", "nchw"),
)
QUICK_CASES = (
    ModelCase("residual_block_fp32", "residual_block", 2, None, "fp32", "nchw"),
    ModelCase("transformer_block_fp32", "transformer_block", 2, 32, "fp32", "nchw"),
)


def clean(value: Any) -> Any:
    """JSON-safe: dataclasses as dicts, tuples as lists, non-finite floats as None (JSON has no NaN)."""
    from explorer.teaching.readers import as_plain

    value = as_plain(value)
    if isinstance(value, dict):
        return {str(k): clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [clean(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    return str(value)


class Budget:
    """Seconds left for the whole run: later optional steps are skipped (and say so) when it runs out."""

    def __init__(self, seconds: float) -> None:
        self.end = time.perf_counter() + seconds

    def left(self) -> float:
        return self.end - time.perf_counter()


def run_case(case: ModelCase, device: str, ceilings: Any, args: argparse.Namespace, budget: Budget, log) -> dict:
    """Measure one case; returns its model entry of the teaching report."""
    import torch

    from explorer.fusion_engine import analyze, fuse
    from explorer.fusions.plan import make_plan
    from explorer.runtime import measure as m
    from explorer.runtime.breakdown import model_breakdowns
    from explorer.runtime.traffic import explain_difference, measure_dram_bytes, traffic_table
    from explorer.teaching.predict import compare, predict_chains
    from explorer.teaching.readers import chain_timing, stage_rows

    t0 = time.perf_counter()
    dtype = m.torch_dtype(case.dtype)
    channels_last = case.memory_format == "channels_last"
    log(f"[{case.key}] loading")
    analysis = analyze(case.model, batch=case.batch, seq_len=case.seq_len)
    model, graph, det = analysis
    plan = make_plan(det, "all", memory_format=case.memory_format)
    fused = fuse(analysis, plan, device)
    fused_ids = [a.chain_id for a in fused.applied if a.status == "fused"]
    notes: list[str] = []
    entry: dict[str, Any] = {"name": case.model, "case": case.key, "batch": case.batch, "seq_len": case.seq_len,
                             "dtype": case.dtype, "memory_format": case.memory_format, "device": device,
                             "fingerprint": det.fingerprint, "chains_detected": len(det.chains),
                             "chains_fused": len(fused_ids), "notes": notes}

    log(f"[{case.key}] time breakdown, unfused and fused")
    timing = m.TimingPlan.for_device(device, short=args.quick)
    try:
        bd = model_breakdowns(analysis, fused.gm, device, case.dtype, ceilings.ridge(case.dtype), channels_last,
                              timing)
        entry["breakdown"] = {name: b.to_dict() for name, b in bd.items()}
    except Exception as exc:
        entry["breakdown"] = {"error": m._one_line(exc)}
    if device.startswith("cuda"):
        torch.cuda.empty_cache()

    log(f"[{case.key}] traffic (byte model)")
    traffic = traffic_table(graph, det, fused_ids, dtype)
    traffic["ncu"] = None
    if args.ncu and device.startswith("cuda"):
        traffic["ncu"], traffic["explained"] = {}, {}
        for variant in ("unfused", "fused"):
            left = budget.left() - 60
            if left < 30:
                traffic["ncu"][variant] = {"error": "skipped: the run's time budget is spent"}
                continue
            log(f"[{case.key}] ncu: DRAM bytes of one {variant} forward")
            result = measure_dram_bytes(case.model, variant, case.dtype, case.batch, case.seq_len,
                                        case.memory_format, timeout_s=min(args.ncu_timeout_s, left))
            traffic["ncu"][variant] = result
            if "error" in result:
                log(f"[{case.key}] ncu {variant}: {result['error']}")
            else:
                model_bytes = traffic["total"]["bytes_unfused" if variant == "unfused" else "bytes_fused"]
                traffic["explained"][variant] = explain_difference(model_bytes, result["dram_bytes"],
                                                                   ceilings.l2_bytes)
    elif args.ncu:
        notes.append("ncu not run: DRAM bytes are measured on a GPU only")
    entry["traffic"] = traffic

    entry["stages"] = []
    if not args.no_stages and budget.left() > 60:
        log(f"[{case.key}] staged table")
        try:
            from explorer.runtime.settings import RunSettings
            from explorer.runtime.stages import stage_measurements

            stages = stage_measurements(model, det, plan, device, dtype, channels_last, RunSettings(),
                                        lambda f, s: None)
            stages = stages[0] if isinstance(stages, tuple) and len(stages) == 2 and isinstance(stages[0], list) \
                else stages
            entry["stages"] = stage_rows(stages)
        except Exception as exc:
            notes.append(f"staged table failed: {m._one_line(exc)}")
    elif not args.no_stages:
        notes.append("staged table skipped: the run's time budget is spent")

    predictions = predict_chains(graph, det, fused_ids, case.dtype, ceilings)
    entry["predictions"] = [p.to_dict() for p in predictions]
    entry["measured"] = []
    entry["comparison"] = []
    if not args.no_chains:
        from explorer.runtime.chains import chain_benchmarks
        from explorer.runtime.settings import RunSettings

        chain_budget = min(args.chain_budget_s, max(budget.left() - 90, 0))
        log(f"[{case.key}] chains timed alone (budget {chain_budget:.0f} s)")
        applied = {a.chain_id: a for a in fused.applied}
        start, timed = time.perf_counter(), []
        for chain in (c for c in det.chains if c.id in set(fused_ids)):
            if time.perf_counter() - start > chain_budget:
                notes.append(f"{len(fused_ids) - len(timed)} chain(s) not timed: chain budget of "
                             f"{chain_budget:.0f} s spent")
                break
            try:
                timed += chain_benchmarks(model, graph, det, [chain], applied, device, dtype, RunSettings(),
                                          lambda f, s: None, cuda_graphs=False)
            except Exception as exc:
                notes.append(f"chain {chain.id} failed: {m._one_line(exc)}")
                timed.append({"id": chain.id})
        measured = {t.id: t for t in (chain_timing(r) for r in timed) if t is not None}
        entry["measured"] = [t.to_dict() for t in measured.values()]
        entry["comparison"] = compare(predictions, measured, ceilings, case.dtype)
    entry["wall_s"] = round(time.perf_counter() - t0, 1)
    return entry


def table(doc: dict) -> str:
    """The short table printed last: breakdown shares, traffic and predictions per case."""
    lines = [f"{'case':<24}{'variant':<9}{'wall ms':>9}{'launch+host':>12}{'memory':>8}{'compute':>8}{'other':>7}"
             f"{'model MB':>10}{'DRAM MB':>9}"]
    for e in doc["models"]:
        if "error" in e:
            lines.append(f"{e.get('case', e['name']):<24}error: {e['error'][:90]}")
            continue
        bd, tr = e["breakdown"], e["traffic"]
        for variant in ("unfused", "fused"):
            b = bd.get(variant) if "error" not in bd else None
            model_mb = tr["total"]["bytes_unfused" if variant == "unfused" else "bytes_fused"] / 1e6
            ncu = (tr.get("ncu") or {}).get(variant) or {}
            dram = f"{ncu['dram_bytes'] / 1e6:.0f}" if "dram_bytes" in ncu else "-"
            if b:
                f = {c: v / b["wall_ms"] for c, v in b["categories_ms"].items()} if b["wall_ms"] else {}
                lines.append(f"{e['case']:<24}{variant:<9}{b['wall_ms']:>9.3f}{f.get('launch_host', 0):>12.0%}"
                             f"{f.get('memory_bound', 0):>8.0%}{f.get('compute_bound', 0):>8.0%}{f.get('other', 0):>7.0%}"
                             f"{model_mb:>10.0f}{dram:>9}")
            else:
                lines.append(f"{e['case']:<24}{variant:<9}{'breakdown failed: ' + bd.get('error', '')[:60]}")
        rows = e.get("comparison") or []
        if rows:
            far = [r for r in rows if r.get("why")]
            lines.append(f"{e['case']:<24}chains: {len(rows)} measured, {len(far)} far (>1.5x) from the prediction"
                         + (f" ({', '.join(sorted({r['why'] for r in far}))})" if far else ""))
        for note in e.get("notes") or []:
            lines.append(f"{e['case']:<24}note: {note[:100]}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny models, short timing (CPU unless --device cuda)")
    parser.add_argument("--models", default="", help="comma-separated case keys: "
                        + ", ".join(c.key for c in CASES + QUICK_CASES))
    parser.add_argument("--device", default=None, help="cuda | cpu (default: cuda, cpu with --quick)")
    parser.add_argument("--no-ncu", dest="ncu", action="store_false", help="skip Nsight Compute's DRAM bytes")
    parser.add_argument("--no-chains", action="store_true", help="skip timing each chain alone")
    parser.add_argument("--no-stages", action="store_true", help="skip the staged table")
    parser.add_argument("--chain-budget-s", type=float, default=40.0, help="seconds per case for timing chains")
    parser.add_argument("--ncu-timeout-s", type=float, default=180.0, help="seconds per ncu run")
    parser.add_argument("--budget-s", type=float, default=540.0, help="seconds for the whole run")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)

    import torch

    from explorer.runtime import measure as m
    from explorer.runtime.ceilings import measure_ceilings
    from explorer.runtime.traffic import find_ncu
    from explorer.teaching.report import SCHEMA, VERSION, validate

    device = args.device or ("cpu" if args.quick else "cuda")
    if device.startswith("cuda") and not torch.cuda.is_available():
        print("teach_reports: no CUDA device on this machine; run it on the GPU machine, or with --quick "
              "(CPU smoke run on tiny models)", file=sys.stderr)
        return 2
    device = m.resolve_device(device)
    by_key = {c.key: c for c in CASES + QUICK_CASES}
    wanted = [k.strip() for k in args.models.split(",") if k.strip()]
    unknown = [k for k in wanted if k not in by_key]
    if unknown:
        parser.error(f"unknown case(s) {', '.join(unknown)}")
    cases = [by_key[k] for k in wanted] if wanted else list(QUICK_CASES if args.quick else CASES)
    out_path = results_path(args.out, "teaching_report.json")
    budget = Budget(args.budget_s)
    started = time.perf_counter()
    invalid = None
    log = elapsed_logger(started)
    env = m.environment(device)
    env["tf32_matmul"] = bool(torch.backends.cuda.matmul.allow_tf32)
    env["tf32_cudnn"] = bool(torch.backends.cudnn.allow_tf32)
    ncu = find_ncu() if (args.ncu and device.startswith("cuda")) else None
    if ncu:
        import subprocess

        try:
            env["ncu"] = subprocess.run([ncu, "--version"], capture_output=True, text=True,
                                        timeout=30).stdout.strip().splitlines()[-1]
        except Exception as exc:
            env["ncu"] = f"{ncu} (version not read: {m._one_line(exc)})"
    log("measuring the device's ceilings (copy bandwidth, matrix rate, launch cost)")
    ceilings = measure_ceilings(device, tuple(sorted({c.dtype for c in cases})), quick=args.quick)
    doc: dict[str, Any] = {
        "schema": SCHEMA, "version": VERSION, **run_stamp(),
        "label": "CPU run: numbers are CPU numbers, not GPU numbers" if env["is_cpu"] else "GPU run",
        "environment": env, "ceilings": ceilings.to_dict(), "models": [],
        "notes": [] if ncu or not args.ncu or not device.startswith("cuda") else
                 ["Nsight Compute (ncu) not found: no measured DRAM bytes"],
    }
    for case in cases:
        try:
            entry = run_case(case, device, ceilings, args, budget, log)
        except Exception as exc:  # one failed case must not lose the others
            import traceback

            traceback.print_exc()
            entry = {"name": case.model, "case": case.key, "error": m._one_line(exc)}
        doc["models"].append(entry)
        doc["wall_s"] = round(time.perf_counter() - started, 1)
        doc = clean(doc)
        out_path.write_text(json.dumps(doc, indent=1, allow_nan=False))
        log(f"[{case.key}] done; wrote {out_path}")
        try:
            validate(doc, out_path.name)
        except Exception as exc:  # written anyway: the numbers are kept, the failure is loud
            invalid = str(exc)
            log(f"the report does not validate: {invalid}")
        if device.startswith("cuda"):
            torch.cuda.empty_cache()
    print(f"teaching report: {out_path} ({doc['label']}, {env.get('device_name')}, torch {env.get('torch')}, "
          f"{doc['wall_s']} s)")
    print(table(doc))
    if invalid:
        print(f"ERROR: {invalid}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
