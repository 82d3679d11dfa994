"""Check: the engine's launch count per chain (``explorer.launches``, what the pages and the report show)
against the kernels the profiler sees on the device, unfused and fused, each chain alone.

The engine counts what each kernel selection's label states (``conv+bias + relu in place (2 kernels)``,
``cudnn conv+bias+relu (1 fused call)``); the profiler counts CUDA kernels (a cuDNN call may launch more
than one) or, on the CPU, top-level ATen ops. This script records both, so that a reader can see where the
graph model's count is a count of calls and where the device launches more:

    python3 benchmarks/check_launch_counts.py                 # on the GPU machine: resnet50, mobilenet_v2, bert_base
    python3 benchmarks/check_launch_counts.py --device cpu --models residual_block,resnet50

Writes ``launch_counts_<device>.json`` (``--out``, else ``$OUT``, else ``benchmarks/results``): per model the
engine's before/after and the profiler's whole-model counts, and per chain the engine's unfused/fused counts
beside the profiler's.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._common import results_path, run_stamp, write_json  # noqa: E402


def check_model(name: str, device: str, dtype_name: str, max_chains: int) -> dict:
    import torch

    from explorer import fusion_engine as fe
    from explorer.fusions import rewrite
    from explorer.fusions.plan import make_plan
    from explorer.runtime import measure as m

    dtype = m.torch_dtype(dtype_name)
    analysis = fe.analyze(name)
    plan = make_plan(analysis.detection)
    fused = fe.fuse(analysis, plan, device)
    engine = fe.launch_counts(analysis, fused.applied, plan.accepted, device)
    measured = {}
    for label, gm in (("unfused", analysis.model.gm), ("fused", fused.gm)):
        g = m.prepare_graph(gm, device, dtype)
        x = m.prepare_inputs(analysis.model.example_inputs, device, dtype)
        measured[label] = m.count_launches(lambda: g(*x), device)
    chains = []
    by_id = fused.by_id()
    for c in engine.chains[:max_chains]:
        applied = by_id.get(c.chain_id)
        row = {"id": c.chain_id, "title": analysis.detection.chain(c.chain_id).title,
               "implementation": str(applied.implementation) if applied else "",
               "engine_unfused": c.unfused, "engine_fused": c.fused, "stated": c.stated}
        try:
            u, f, inputs = rewrite.chain_module(analysis.model.gm, analysis.detection, c.chain_id, device)
            xu = m.prepare_inputs(inputs, device, dtype)
            gu, gf = m.prepare_graph(u, device, dtype), m.prepare_graph(f, device, dtype)
            row["measured_unfused"] = m.count_launches(lambda: gu(*xu), device)["kernel_launches"]
            row["measured_fused"] = m.count_launches(lambda: gf(*xu), device)["kernel_launches"]
        except Exception as exc:  # a chain that cannot be built alone is recorded, not fatal
            row["error"] = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
        chains.append(row)
        if device.startswith("cuda"):
            torch.cuda.synchronize()
    return {"model": name, "device": device, "dtype": dtype_name,
            "engine": {"before": engine.before, "after": engine.after, "saved": engine.saved},
            "measured": {k: {"kernel_launches": v.get("kernel_launches"), "kind": v.get("kernel_launches_kind")}
                         for k, v in measured.items()},
            "chains": chains}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default=None, help="cuda (default when there is one) or cpu")
    parser.add_argument("--dtype", default="fp16")
    parser.add_argument("--models", default="resnet50,mobilenet_v2,bert_base")
    parser.add_argument("--max-chains", type=int, default=60)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    import torch

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    dtype = args.dtype if device.startswith("cuda") else "fp32"
    doc = {**run_stamp(), "device": device, "torch": torch.__version__,
           "gpu": torch.cuda.get_device_name(0) if device.startswith("cuda") else None, "models": []}
    path = results_path(args.out, f"launch_counts_{device.split(':')[0]}.json")
    for name in [n.strip() for n in args.models.split(",") if n.strip()]:
        t0 = time.perf_counter()
        try:
            doc["models"].append(check_model(name, device, dtype, args.max_chains))
        except Exception as exc:
            doc["models"].append({"model": name, "error": str(exc).splitlines()[0][:300] if str(exc) else repr(exc)})
        write_json(path, doc)
        got = doc["models"][-1]
        print(f"{name}: engine {got.get('engine')} measured {got.get('measured')} ({time.perf_counter() - t0:.1f} s)")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
