"""The zoo's detections and fused outputs, as a fingerprint to compare before and after a refactor.

For every zoo model (smallest batch the zoo builds by default): the chains the
engine detects (id, pattern, nodes), its near misses (pattern, nodes, English
reason), the implementation label of every applied chain, and a SHA-256 of the
fused graph's output bytes on the CPU (seeded weights and inputs, float32, the
plan that accepts every chain). Two runs of this script on two trees give equal
JSON exactly when detection, labels and fused outputs are bitwise the same.

    python3 benchmarks/zoo_fingerprints.py --out fingerprints.json [--models a,b] [--no-outputs]

Runs on the CPU only (no GPU number is measured here).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys

import torch


def fingerprint(name: str, outputs: bool = True) -> dict:
    """Detection (chains, near misses) and, with ``outputs``, the labels and the fused output hash of one zoo model."""
    from explorer.fusion_engine import analyze, fuse

    torch.manual_seed(0)
    analysis = analyze(name)
    model, _, det = analysis
    got = {"chains": [[c.id, c.pattern, list(c.nodes)] for c in det.chains],
           "near_misses": [[m.pattern, list(m.nodes), str(m.reason)] for m in det.near_misses]}
    if outputs:
        fused = fuse(analysis)
        got["applied"] = [[a.chain_id, a.status, str(a.implementation)] for a in fused.applied]
        torch.manual_seed(1)
        inputs = model.example_inputs
        with torch.inference_mode():
            out = fused.gm(*inputs)
        flat = out if isinstance(out, (tuple, list)) else (out,)
        digest = hashlib.sha256()
        for t in flat:
            if isinstance(t, torch.Tensor):
                digest.update(t.detach().contiguous().cpu().numpy().tobytes())
        got["output_sha256"] = digest.hexdigest()
    return got


def main(argv: list[str] | None = None) -> int:
    from explorer.sources.zoo import ZOO

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--models", default=",".join(ZOO))
    ap.add_argument("--no-outputs", action="store_true")
    args = ap.parse_args(argv)
    result = {}
    for name in args.models.split(","):
        result[name] = fingerprint(name, outputs=not args.no_outputs)
        print(name, len(result[name]["chains"]), result[name].get("output_sha256", "")[:12], file=sys.stderr, flush=True)
    with open(args.out, "w") as fh:
        json.dump(result, fh, indent=1, sort_keys=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
