"""Does the unfused graph compute what the model computes, in bf16 and fp16? Every zoo model, on any device.

    python3 benchmarks/check_dtype_fidelity.py                     # every zoo model but the large ones
    python3 benchmarks/check_dtype_fidelity.py --models llama_decoder,bert_base --device cuda

For each model and dtype: the relative L2 error against the float64 reference (the unfused graph in
float64) of eager PyTorch in that dtype (``measure.prepare_module``), of the unfused graph prepared as the
runner prepares it (``prepare_graph`` with the model's own casts, ``measure.record_casts``) and of the
graph with every float dtype retargeted (what the runner did before the cast record); the ratio of the
graph's error to eager's (the issue's bar: within 1.5x) and the graph's distance from eager itself.
Models are the zoo's, calibrated (``explorer.sources.calibrate``), at batch 1 and 16 tokens. Writes
``dtype_fidelity_<device>.json`` to ``$OUT`` (or ``benchmarks/results``).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._common import results_path, run_stamp, write_json  # noqa: E402


def check(name: str, device: str) -> dict:
    import torch

    from explorer.runtime import measure as m
    from explorer.sources import load_model, zoo

    entry = zoo.get_entry(name)
    model = load_model(name, batch=1, seq_len=16 if entry.inputs.seq_len else None)
    inputs = model.example_inputs
    with torch.inference_mode():
        ref = m.prepare_graph(model.gm, device, torch.float64)(*m.prepare_inputs(inputs, device, torch.float64))
    ref = [t.detach().cpu() for t in m.flat_outputs(ref)]
    out = {}
    for label, dtype in (("bf16", torch.bfloat16), ("fp16", torch.float16)):
        casts, note = m.record_casts(model.module, inputs, model.gm, dtype)
        x = m.prepare_inputs(inputs, device, dtype)
        with torch.inference_mode():
            eager = m.prepare_module(model.module, device, dtype)(*x)
            graph = m.prepare_graph(model.gm, device, dtype, casts=casts)(*x)
            blanket = m.prepare_graph(model.gm, device, dtype)(*x)
        rel = lambda o, r: m.precision(o, r, False, dtype)["rel_l2"]  # noqa: E731
        as_ref = [t.double().cpu() for t in m.flat_outputs(eager)]
        e, g, b = rel(eager, ref), rel(graph, ref), rel(blanket, ref)
        out[label] = {"eager": e, "graph": g, "graph_all_retargeted": b,
                      "ratio": g / e if e and g is not None else None,
                      "ratio_before": b / e if e and b is not None else None,
                      "graph_vs_eager": rel(graph, as_ref), "note": note}
    return out


def main(argv: list[str] | None = None) -> int:
    import torch

    from explorer.sources import zoo

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(n for n, e in zoo.ZOO.items() if not e.large))
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--out")
    args = parser.parse_args(argv)
    path = results_path(args.out, f"dtype_fidelity_{args.device}.json")
    doc = {**run_stamp(), "device": args.device, "models": {}}
    for name in [n.strip() for n in args.models.split(",") if n.strip()]:
        t0 = time.perf_counter()
        try:
            doc["models"][name] = check(name, args.device)
        except Exception as exc:  # one model's failure is its row, not the run's
            doc["models"][name] = {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"}
        row = doc["models"][name]
        print(f"{name:<22} " + ("  ".join(
            f"{k}: eager {v['eager']:.2e} graph {v['graph']:.2e} ({v['ratio']:.2f}x; before {v['ratio_before']:.2f}x)"
            for k, v in row.items() if isinstance(v, dict) and v.get("ratio") is not None) or str(row))
              + f"  [{time.perf_counter() - t0:.0f} s]", file=sys.stderr)
        write_json(path, doc)
    print(f"wrote {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
