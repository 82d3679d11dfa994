"""torch.compile's kernels mapped onto our graph on the GPU (Triton kernels): ResNet-50, BERT-base, the decoder.

For each model, compiles it with torch.compile (inductor, the mode asked for) in a child process
(``explorer.runtime.compile_map``, a fresh cache folder so nothing is reused), maps every generated
kernel back to our FX nodes from inductor's provenance records, checks the map against inductor's
own output code (``compile_map.problems``: every kernel maps to a node of ours, no node is owned
twice, one kernel per launch site, the generated kernels those the code defines) and compares it with
our chains. Writes one JSON document (the maps, the comparisons, the checks, the command and the
versions) to ``--out``, else ``$OUT/compile_map_h200.json``, else ``benchmarks/results/``::

    python3 benchmarks/compile_map_h200.py                        # the H200: fp16, default mode
    python3 benchmarks/compile_map_h200.py --smoke                # the CPU, residual_block only (C++ kernels)

Nothing is timed: this records which kernels inductor generates, not how fast they run.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._common import elapsed_logger, results_path, run_stamp, write_json  # noqa: E402

#: (zoo name, batch, sequence length) measured on the GPU.
MODELS = (("resnet50", 32, None), ("bert_base", 8, 128), ("llama_decoder", 4, 128))
SMOKE = (("residual_block", 1, None),)


def entry(analysis, cmap, comparison) -> dict:
    """One model's record: the checks, the counts by kind and by compare status, the map and the comparison."""
    from explorer.runtime import compile_map as cm

    return {"model": analysis.model.name, "batch": cmap.batch, "seq_len": cmap.seq_len,
            "problems": cm.problems(cmap, analysis.graph), "kernels": len(cmap.kernels),
            "kinds": dict(Counter(k.kind for k in cmap.kernels)),
            "extern_libraries": dict(Counter(k.library for k in cmap.kernels if k.kind == "extern")),
            "chains": dict(Counter(c.status for c in comparison.chains)),
            "candidate_patterns": [{"ops": ops, "count": n} for ops, n in comparison.candidate_patterns()],
            "separate_ops": len(comparison.separate), "compile_s": cmap.compile_s,
            "compile_map": cmap.to_dict(), "comparison": comparison.to_dict()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", help="where to write the JSON")
    parser.add_argument("--dtype", default="fp16", choices=["fp32", "fp16", "bf16"])
    parser.add_argument("--mode", default="default")
    parser.add_argument("--models", default="", help="zoo names separated by commas (default: all three)")
    parser.add_argument("--smoke", action="store_true", help="the CPU, residual_block, fp32: the plumbing only")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds one compile may take")
    args = parser.parse_args(argv)

    import torch

    from explorer.errors import ExplorerError
    from explorer.fusion_engine import analyze
    from explorer.runtime import compile_map as cm

    log = elapsed_logger(time.perf_counter())
    path = results_path(args.out, "compile_map_smoke_cpu.json" if args.smoke else "compile_map_h200.json")
    device = "cpu" if args.smoke else "cuda"
    dtype = "fp32" if args.smoke else args.dtype
    doc = {"schema": "compile_map_h200/1", **run_stamp(), "device": device, "dtype": dtype, "mode": args.mode,
           "torch": torch.__version__, "cuda": torch.version.cuda,
           "device_name": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu", "models": []}
    if device == "cuda" and not torch.cuda.is_available():
        doc["skipped"] = "no CUDA device here: run with --smoke for the CPU plumbing"
        write_json(path, doc)
        print(f"compile_map_h200: SKIPPED ({doc['skipped']}); wrote {path}")
        return 0
    wanted = SMOKE if args.smoke else MODELS
    if args.models:
        names = args.models.split(",")
        wanted = tuple(m for m in MODELS + SMOKE if m[0] in names)
    folder = Path(tempfile.mkdtemp(prefix="compile-map-"))
    failed = 0
    for name, batch, seq_len in wanted:
        log(f"{name}: loading (batch {batch}, seq_len {seq_len})")
        try:
            analysis = analyze(name, batch=batch, seq_len=seq_len)
            log(f"{name}: compiling with torch.compile ({args.mode}, {dtype}, {device})")
            cmap, comparison = cm.for_analysis(analysis, name, device, dtype, args.mode, timeout_s=args.timeout,
                                               directory=folder,
                                               progress=lambda f, s, name=name: log(f"{name}: {s}"))
        except ExplorerError as exc:
            failed += 1
            doc["models"].append({"model": name, "error": str(exc)})
            write_json(path, doc)
            log(f"{name}: FAILED: {exc}")
            continue
        record = entry(analysis, cmap, comparison)
        doc["models"].append(record)
        write_json(path, doc)
        failed += bool(record["problems"])
        log(f"{name}: {record['kernels']} kernels {record['kinds']}, chains {record['chains']}, "
            f"problems: {record['problems'] or 'none'}")
    print(f"wrote {path}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
