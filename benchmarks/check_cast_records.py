"""Which corpus models branch on their dtype: does the cast record (``measure.record_casts``) match, per dtype?

    python3 benchmarks/check_cast_records.py                          # every entry (~20 min on 2 cores)
    python3 benchmarks/check_cast_records.py --entries hf             # the transformers entries
    python3 benchmarks/check_cast_records.py --entries tv/resnet18,hf/t5_encoder

For each corpus entry (``benchmarks/corpus.py``) at its CI size on the CPU: the module the exporters see
(``corpus.features_module``) captured in float32 (``explorer.sources.capture``), then its cast record made
for bf16 and fp16, and whether a run-dtype graph (``measure.run_dtype_graph``, the unfused baseline the
runner then takes) was made. A model whose run-dtype capture differs from its float32 one (T5, Whisper and
Mixtral branch on their dtype) has no record; its row says where the two captures first differ. Writes
``cast_records_cpu.json`` to ``$OUT`` (or ``benchmarks/results``). Used to find which models take
``prepare_graph``'s no-record path (issue 20).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._common import results_path, run_stamp, write_json  # noqa: E402


def check(name: str) -> dict:
    """One entry's record per dtype: ``{"bf16": {"kept": bool, "run_dtype_graph": bool, "note": str}, ...}``."""
    import torch

    from benchmarks import corpus
    from explorer.runtime import measure as m
    from explorer.sources import capture

    entry = corpus.by_name(name)
    module = entry.build("ci")
    inputs = entry.inputs("ci", module=module)
    features = corpus.features_module(entry, module)
    gm = capture(features, inputs, name)
    out = {}
    for label, dtype in (("bf16", torch.bfloat16), ("fp16", torch.float16)):
        record, note = m.record_casts(features, inputs, gm, dtype)
        typed = m.run_dtype_graph(features, inputs, gm, dtype) if record is None else None
        out[label] = {"kept": record is not None, "run_dtype_graph": typed is not None, "note": note}
    return out


def main(argv: list[str] | None = None) -> int:
    from benchmarks import corpus

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--entries", default="all", help="all, hf, or entry names, comma-separated")
    parser.add_argument("--out")
    args = parser.parse_args(argv)
    path = results_path(args.out, "cast_records_cpu.json")
    import timm
    import torch
    import torchvision
    import transformers

    doc = {**run_stamp(), "device": "cpu", "scale": "ci", "entries": {},
           "versions": {"torch": torch.__version__, "torchvision": torchvision.__version__,
                        "timm": timm.__version__, "transformers": transformers.__version__}}
    names = {"all": [e.name for e in corpus.entries()],
             "hf": [e.name for e in corpus.entries() if e.library == "transformers"]}.get(
        args.entries, [n.strip() for n in args.entries.split(",") if n.strip()])
    for name in names:
        t0 = time.perf_counter()
        try:
            row = check(name)
        except Exception as exc:  # one entry's failure is its row, not the run's
            row = {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"}
        doc["entries"][name] = row
        print(f"{name:<28} " + ("  ".join(f"{k}: {'record' if v['kept'] else 'NO RECORD'}"
                                         f"{' (run-dtype graph)' if v['run_dtype_graph'] else ''} ({v['note']})"
                                         for k, v in row.items() if isinstance(v, dict)) or str(row))
              + f"  [{time.perf_counter() - t0:.0f} s]", file=sys.stderr, flush=True)
        write_json(path, doc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
