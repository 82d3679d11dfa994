"""torch.compile's fusions on corpus models on the GPU (Triton kernels), beside our detection (issue 20).

``tests/test_corpus.py::test_corpus_compile_map`` makes this check on the CPU, where inductor writes C++
kernels; the CUDA backend decides fusions its own way (Triton pointwise and reduction kernels, split and
persistent reductions, its own pattern-matcher passes), so what it fuses on the GPU can differ from what it
fuses on the CPU. For each entry (``benchmarks/corpus.py``, CI shape: the same graph as the CPU check), the
``.pt2`` is loaded as a user's file, detected, compiled on the GPU in ``--dtype`` with its kernels mapped onto
our graph (``explorer.runtime.compile_map``), and every kernel that fuses ops one of our families covers in
principle and that no chain, alternative or near miss of ours touches is listed by op sequence
(``compile_map.unclaimed``): ``benchmarks.corpus.compile_check``.

    python3 benchmarks/check_compile_map_corpus.py --budget-s 420           # the H200: fp16, JSON under $OUT
    python3 benchmarks/check_compile_map_corpus.py --smoke                  # the CPU: one small entry

Nothing is timed. ``--budget-s`` starts no entry past it (the JSON says which were skipped); the JSON is
rewritten after each entry, so a cut run keeps what it mapped. Prints one line per entry.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._common import results_path, run_stamp, write_json  # noqa: E402

#: One entry per family of architecture the CPU check covers, the cheapest first.
ENTRIES = ("tv/mobilenet_v3_small", "tv/resnet18", "hf/bert", "hf/gpt2", "timm/convnextv2_atto",
           "timm/efficientnet_b0", "hf/llama", "hf/gemma2", "timm/coatnet_0_rw_224", "tv/swin_t", "hf/phi3",
           "hf/falcon")
SMOKE = ("tv/mobilenet_v3_small",)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dtype", default="fp16", choices=("fp32", "fp16", "bf16"))
    parser.add_argument("--budget-s", type=float, default=420.0, help="start no entry past this many seconds")
    parser.add_argument("--entries", nargs="*", default=None, help="corpus entries (default: ENTRIES)")
    parser.add_argument("--smoke", action="store_true", help="the CPU, one small entry (plumbing check)")
    parser.add_argument("--out", default=None, help="the JSON file (default $OUT/check_compile_map_corpus.json)")
    args = parser.parse_args(argv)

    import logging

    import torch

    from benchmarks import corpus

    logging.disable(logging.WARNING)
    device = "cpu" if args.smoke else "cuda"
    if device == "cuda" and not torch.cuda.is_available():
        print("no CUDA device: run with --smoke for the CPU check", file=sys.stderr)
        return 2
    dtype = "fp32" if args.smoke else args.dtype
    names = tuple(args.entries) if args.entries else (SMOKE if args.smoke else ENTRIES)
    path = Path(args.out) if args.out else results_path(None, "check_compile_map_corpus.json")
    doc = {"schema": "check_compile_map_corpus/1",
           "device": torch.cuda.get_device_name(0) if device == "cuda" else "cpu", "dtype": dtype,
           **run_stamp(), "torch": torch.__version__, "entries": [], "skipped": []}
    started = time.perf_counter()
    print(f"{'entry':28} {'kernels':>7} {'multi-op':>8} {'only ind.':>9} {'unclaimed':>9}  seconds")
    for name in names:
        if time.perf_counter() - started > args.budget_s:
            doc["skipped"].append({"entry": name, "why": f"past --budget-s {args.budget_s:.0f}"})
            continue
        with tempfile.TemporaryDirectory(prefix="compile-map-corpus-") as tmp:
            try:
                r = corpus.compile_check(name, tmp, device, dtype)
            except Exception as exc:   # a load or build failure: recorded, the next entry runs
                text = (str(exc).strip().splitlines() or [""])[0][:300]
                r = {"entry": name, "status": "error", "reason": f"{type(exc).__name__}: {text}"}
        doc["entries"].append(r)
        write_json(path, doc)
        if r["status"] == "ok":
            print(f"{name:28} {r['kernels']:>7} {r['multi_op_kernels']:>8} {r['only_inductor']:>9} "
                  f"{sum(r['unclaimed'].values()):>9}  {r['seconds']:.0f}  {r['unclaimed'] or ''}")
        else:
            print(f"{name:28} {r['status']}: {r['reason'][:120]}")
    for s in doc["skipped"]:
        print(f"{s['entry']:28} skipped: {s['why']}")
    write_json(path, doc)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
