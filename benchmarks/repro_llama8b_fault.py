"""Reproduce the H200 fault of issue 20: a Llama-style Hugging Face folder at Llama-3-8B layer sizes, run
with chains and baselines through the command line.

    python3 benchmarks/repro_llama8b_fault.py                 # the exact command, its report in $OUT
    python3 benchmarks/repro_llama8b_fault.py --diagnose      # + the controls that tell the hypotheses apart
    python3 benchmarks/repro_llama8b_fault.py --smoke         # the same machinery, tiny sizes, on the CPU

It builds the folder into a temporary directory (transformers ``LlamaForCausalLM``: hidden 4096, 32 query
heads over 8 KV heads, MLP 14336, 2 layers, vocabulary 32000; seeded weights at unit activation scale,
``explorer.sources.models.fast_llama_weights``, saved in bf16 with ``save_pretrained(safe_serialization=True)``)
and runs, as a user would::

    fusion-explorer run FOLDER --device cuda --dtype bf16 --batch 4 --seq-len 1024 --no-stages --baselines

Each run's report is written to ``$OUT/report_llama8b_<run>.json`` (or beside this script's results) and a
summary, ``repro_llama8b_fault.json``, lists every run: its exit status, seconds, the phases that failed
(``report.failures``: phase, variant, one-line reason) and whether a fresh process ran the rest. Before
the runner's phases were split, the fault lost the whole run; now the report keeps the chains and the
main timing and names the failed phase.

``--diagnose`` adds, each in its own process (the hypotheses are in the run's notes, ``HYPOTHESES``):

- ``no_chains``: ``--no-chains`` (the issue's control: fine there);
- ``no_cupti_teardown``: ``TEARDOWN_CUPTI=0`` (the runner's profiles tear CUPTI down after each forward;
  PyTorch turned that off around CUDA graphs because CUPTI re-initialised after a teardown crashed graph
  launches, pytorch/pytorch#112507, believed fixed in CUDA 12.6; the chains phase profiles every chain
  twice, with CUDA graphs captured in between);
- ``launch_blocking``: ``CUDA_LAUNCH_BLOCKING=1`` (the failing kernel named where it fails).
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

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._common import results_path, run_stamp, write_json  # noqa: E402

SIZES = dict(hidden_size=4096, num_attention_heads=32, num_key_value_heads=8, intermediate_size=14336,
             num_hidden_layers=2, vocab_size=32000, max_position_embeddings=8192)
SMOKE = dict(hidden_size=96, num_attention_heads=6, num_key_value_heads=2, intermediate_size=160,
             num_hidden_layers=2, vocab_size=512, max_position_embeddings=128)

HYPOTHESES = (
    "CUPTI teardown: every profile (count_launches) ends with cuptiFinalize (TEARDOWN_CUPTI=1, "
    "measure.CUPTI_TEARDOWN_ENV); the chains phase profiles about 20 times with CUDA graphs captured "
    "between; CUPTI re-initialised after a teardown has crashed CUDA-graph launches (pytorch/pytorch#112507). "
    "Test: --diagnose's no_cupti_teardown run.",
    "A CUDA-graph memory pool freed while something still reads it: every chain's graphs (make_variant) are "
    "freed when the chain is done; a later capture (fused_cuda_graphs, eager_cuda_graphs, reduce-overhead's "
    "cudagraph trees) reuses that memory. Test: launch_blocking names the kernel; compute-sanitizer on it.",
    "Stream-pool wrap-around: every make_variant takes a torch.cuda.Stream() from PyTorch's pool of 32, so "
    "after the chains phase a baseline's warm-up stream is one an earlier capture used (with its cuBLAS "
    "workspace). Test: launch_blocking, and the baselines alone (no_chains) work.",
    "Int32 offsets in a Triton kernel: ruled out by reading (every kernel the decoder uses, rms_norm, swiglu, "
    "rotary, matmul_softmax, computes its row/batch offsets in int64; the largest tensor at batch 4 x 1024 is "
    "the packed gate/up GEMM output, 4096 x 28672 = 1.2e8 elements, 18x below 2**31).",
)


def build_folder(folder: Path, sizes: dict) -> dict:
    """A ``save_pretrained`` folder of a Llama decoder of ``sizes``, bf16 safetensors, seeded weights."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from explorer.sources.models import fast_llama_weights

    config = LlamaConfig(**sizes, rms_norm_eps=1e-5, hidden_act="silu", tie_word_embeddings=False, use_cache=False)
    t0 = time.perf_counter()
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    model = model.to_empty(device="cpu")
    model.model.rotary_emb = type(model.model.rotary_emb)(config=config)
    fast_llama_weights(model)
    model = model.to(torch.bfloat16).eval()
    model.save_pretrained(str(folder), safe_serialization=True)
    params = sum(p.numel() for p in model.parameters())
    return {"params": int(params), "build_and_save_s": round(time.perf_counter() - t0, 1)}


def run_cli(folder: Path, out: Path, device: str, batch: int, seq_len: int, extra: list[str],
            env_extra: dict[str, str], timeout_s: float) -> dict:
    """``fusion-explorer run`` on the folder in its own process; returns what happened."""
    cmd = [sys.executable, "-m", "explorer.cli", "run", str(folder), "--device", device, "--dtype", "bf16",
           "--batch", str(batch), "--seq-len", str(seq_len), "--no-stages", "--baselines", "--out", str(out), *extra]
    env = dict(os.environ, **env_extra)
    env["PYTHONPATH"] = str(Path(__file__).resolve().parent.parent) + os.pathsep + env.get("PYTHONPATH", "")
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout_s)
    entry = {"command": " ".join(["fusion-explorer", *cmd[3:]]), "env": env_extra, "exit_status": proc.returncode,
             "seconds": round(time.perf_counter() - t0, 1),
             "stderr_tail": proc.stderr.strip().splitlines()[-25:]}
    if out.exists():
        report = json.loads(out.read_text())
        entry["report"] = out.name
        entry["failures"] = report.get("failures", [])
        entry["fresh_processes"] = report.get("fresh_processes", 0)
        entry["chains_timed"] = sum(1 for c in report.get("chains", []) if c.get("fused"))
        entry["baselines_measured"] = [b["name"] for b in report.get("baselines", []) if b.get("measurement")]
    return entry


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--diagnose", action="store_true", help="also run the controls (module docstring)")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes on the CPU: the script's machinery only")
    parser.add_argument("--out", help="the summary JSON (default: $OUT/repro_llama8b_fault.json, else benchmarks/results/); "
                        "the reports are written beside it")
    parser.add_argument("--timeout-s", type=float, default=1500.0, help="per run")
    args = parser.parse_args(argv)
    sizes, device, batch, seq = (SMOKE, "cpu", 1, 16) if args.smoke else (SIZES, "cuda", 4, 1024)
    summary_path = results_path(args.out, "repro_llama8b_fault" + ("_smoke" if args.smoke else "") + ".json")
    doc = {**run_stamp(), "sizes": sizes, "hypotheses": list(HYPOTHESES), "runs": {}}
    runs = {"exact": ([], {})}
    if args.diagnose:
        runs.update(no_chains=(["--no-chains"], {}), no_cupti_teardown=([], {"TEARDOWN_CUPTI": "0"}),
                    launch_blocking=([], {"CUDA_LAUNCH_BLOCKING": "1"}))
    with tempfile.TemporaryDirectory(prefix="llama8b-layers-") as tmp:
        folder = Path(tmp) / "llama8b_layers"
        doc["folder"] = build_folder(folder, sizes)
        print(f"built {folder}: {doc['folder']}", file=sys.stderr)
        for name, (extra, env_extra) in runs.items():
            out = summary_path.parent / f"report_llama8b_{name}{'_smoke' if args.smoke else ''}.json"
            out.unlink(missing_ok=True)
            entry = run_cli(folder, out, device, batch, seq, extra, env_extra, args.timeout_s)
            doc["runs"][name] = entry
            print(f"{name}: exit {entry['exit_status']}, {entry['seconds']} s, failures "
                  f"{[(f['phase'], f.get('variant'), f['reason']) for f in entry.get('failures', [])]}",
                  file=sys.stderr)
            write_json(summary_path, doc)
    print(f"wrote {summary_path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
