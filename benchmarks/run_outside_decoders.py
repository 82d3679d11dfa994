"""Decoders nobody here wrote, at their real layer sizes, through ``fusion-explorer run`` as a user runs it.

A Llama-style decoder at Llama-3-8B layer sizes (hidden 4096, 32 query heads over 8 KV heads, MLP 14336)
and a Qwen2 one at Qwen2-7B layer sizes (hidden 3584, 28 heads over 4, MLP 18944), 2 layers each,
vocabulary 32000, seeded random weights, saved as bf16 safetensors Hugging Face folders; then

    fusion-explorer run FOLDER --device cuda --dtype bf16 --batch 4 --seq-len 1024 --no-stages --baselines

with per-chain timing on. This is the command that lost the whole run to "CUDA error: unspecified launch
failure" before ``explorer.runtime.variants._own_cublas_workspace`` (issue 20). Each model's report is
written next to this run's record (``$OUT`` on the GPU machine, else ``benchmarks/results``).

    python3 benchmarks/run_outside_decoders.py [--models llama8b,qwen2_7b]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks._common import results_path, run_stamp, write_json  # noqa: E402

SIZES = {
    "llama8b": ("LlamaConfig", dict(hidden_size=4096, num_attention_heads=32, num_key_value_heads=8,
                                    intermediate_size=14336)),
    "qwen2_7b": ("Qwen2Config", dict(hidden_size=3584, num_attention_heads=28, num_key_value_heads=4,
                                     intermediate_size=18944)),
}
COMMAND = ["--device", "cuda", "--dtype", "bf16", "--batch", "4", "--seq-len", "1024", "--no-stages", "--baselines"]


def build_folder(name: str, folder: Path) -> None:
    import torch
    import transformers
    config_cls, sizes = SIZES[name]
    config = getattr(transformers, config_cls)(num_hidden_layers=2, vocab_size=32000, max_position_embeddings=4096,
                                               **sizes)
    torch.manual_seed(0)
    with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
        model = transformers.AutoModelForCausalLM.from_config(config).to(torch.bfloat16)
    model.save_pretrained(folder, safe_serialization=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(SIZES))
    args = parser.parse_args()
    import torch
    doc = {**run_stamp(), "cli": "fusion-explorer run FOLDER " + " ".join(COMMAND), "runs": {}}
    if not torch.cuda.is_available():
        doc["skipped"] = "no CUDA device here"
        write_json(results_path(None, "outside_decoders_h200.json"), doc)
        print("skipped: no CUDA device here")
        return 0
    doc["gpu"] = torch.cuda.get_device_name(0)
    env = dict(os.environ, FUSION_EXPLORER_MEMORY_BUDGET=os.environ.get("FUSION_EXPLORER_MEMORY_BUDGET", "64GiB"),
               PYTHONPATH=str(ROOT))
    for name in args.models.split(","):
        with tempfile.TemporaryDirectory() as tmp:
            folder = Path(tmp) / name
            build_folder(name, folder)
            report = results_path(None, f"report_{name}_layers_bf16_h200.json")
            t0 = time.perf_counter()
            proc = subprocess.run([sys.executable, "-m", "explorer.cli", "run", str(folder), *COMMAND,
                                   "--out", str(report)], env=env, capture_output=True, text=True)
            wall = time.perf_counter() - t0
        run = {"exit": proc.returncode, "wall_s": round(wall, 1), "report": report.name,
               "stdout_tail": proc.stdout[-3000:], "stderr_tail": proc.stderr[-1500:]}
        if proc.returncode == 0 and report.exists():
            data = json.loads(report.read_text())
            run["baselines"] = {b.get("name"): (b.get("measurement") or {}).get("latency", {}).get("median")
                                for b in data.get("baselines") or []}
        doc["runs"][name] = run
        print(f"{name}: exit {proc.returncode} in {wall:.0f} s")
        print(proc.stdout[-1500:])
    write_json(results_path(None, "outside_decoders_h200.json"), doc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
