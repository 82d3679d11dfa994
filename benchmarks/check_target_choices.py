"""Every zoo model's kernel choices for each target, to compare before and after a change (CPU only).

For each zoo model and each target (cpu fp32 contiguous; cuda × fp32/fp16/bf16 × nchw/channels_last, as
planned: no GPU is needed, the selections take a device name) it records what the rewrite decided for every
chain (status, impl, label, fused) and the call targets of the lean graph the lowering makes for that target
(``prepare_graph`` on the CPU without lowering, then ``specialize_fused_calls`` for the target's device and
dtype). Two runs' files compare with ``--compare``::

    python3 benchmarks/check_target_choices.py --out before.json          # on the old tree
    python3 benchmarks/check_target_choices.py --out after.json           # on the new one
    python3 benchmarks/check_target_choices.py --compare before.json after.json [--summary s.json]

``--models`` picks a subset (a name with a slash is a corpus entry, ``hf/gpt2``, at its CI size); ``--skip``
leaves some out (the 8B-layer decoder takes minutes per target).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from explorer import fusion_engine  # noqa: E402
from explorer.fusions.plan import make_plan  # noqa: E402
from explorer.runtime import lean, measure  # noqa: E402
from explorer.sources.zoo import ZOO  # noqa: E402

TARGETS = [("cpu", "fp32", "nchw")] + [("cuda", d, f) for d in ("fp32", "fp16", "bf16")
                                      for f in ("nchw", "channels_last")]


def _fuse(analysis, plan, device: str, dtype: str, fmt: str):
    try:
        from explorer.vocab import Target
    except ImportError:   # the tree before Target: the rewrite knew the device only
        return fusion_engine.fuse(analysis, plan, device)
    return fusion_engine.fuse(analysis, plan, target=Target(device, dtype, fmt))


def record(name: str) -> dict:
    if "/" in name:   # a corpus entry (hf/gpt2), captured at its CI size as check_selection_calls captures it
        from benchmarks.check_selection_calls import analysis as corpus_analysis
        analysis = corpus_analysis(name)
    else:
        analysis = fusion_engine.analyze(name)
    out = {}
    for device, dtype, fmt in TARGETS:
        plan = make_plan(analysis.detection, "all", memory_format=fmt)
        fused = _fuse(analysis, plan, device, dtype, fmt)
        applied = [[a.chain_id, a.status, a.impl, str(a.implementation), a.fused_kernel] for a in fused.applied]
        gm = measure.prepare_graph(fused.gm, "cpu", measure.torch_dtype(dtype), fmt == "channels_last", lean=False)
        lean.specialize_fused_calls(gm, torch.device(device), measure.torch_dtype(dtype))
        lowered = [getattr(n.target, "__name__", str(n.target)) for n in gm.graph.nodes if n.op == "call_function"]
        out[f"{device}/{dtype}/{fmt}"] = {"applied": applied, "lowered": lowered}
    return out


def compare(before: dict, after: dict) -> int:
    """Print the differences; returns how many (model, target) pairs differ in their lowered graphs."""
    lowered_diffs = 0
    for model in sorted(set(before) | set(after)):
        for key in sorted(set(before.get(model, {})) | set(after.get(model, {}))):
            b, a = before.get(model, {}).get(key), after.get(model, {}).get(key)
            if b is None or a is None:
                print(f"{model} {key}: only in {'after' if b is None else 'before'}")
                continue
            if b["lowered"] != a["lowered"]:
                lowered_diffs += 1
                print(f"{model} {key}: LOWERED GRAPH DIFFERS")
            for rb, ra in zip(b["applied"], a["applied"]):
                if rb != ra:
                    print(f"{model} {key} {rb[0]}: {rb[1:]} -> {ra[1:]}")
    return lowered_diffs


def _digest(value: object) -> str:
    return hashlib.sha256(json.dumps(value).encode()).hexdigest()[:16]


def summary(before: dict, after: dict) -> dict:
    """Per model and target: chains, and a digest of the choices (status, impl, label, fused) and of the lowered
    calls on each side, with whether they are equal (a compact record of a comparison, to commit)."""
    out = {"command": " ".join(sys.argv), "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "models": {}}
    for model in sorted(set(before) & set(after)):
        rows = {}
        for key in sorted(set(before[model]) & set(after[model])):
            b, a = before[model][key], after[model][key]
            rows[key] = {"chains": len(a["applied"]),
                         "choices": [_digest(b["applied"]), _digest(a["applied"])],
                         "lowered": [_digest(b["lowered"]), _digest(a["lowered"])],
                         "equal": b == a}
        out["models"][model] = rows
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="target_choices.json")
    ap.add_argument("--models", nargs="*", default=None)
    ap.add_argument("--skip", nargs="*", default=[])
    ap.add_argument("--compare", nargs=2, metavar=("BEFORE", "AFTER"))
    ap.add_argument("--summary", help="with --compare: write per model and target the chain count and a digest "
                                      "of each side's choices and lowered calls")
    args = ap.parse_args()
    if args.compare:
        before, after = (json.loads(Path(p).read_text()) for p in args.compare)
        n = compare(before, after)
        if args.summary:
            Path(args.summary).write_text(json.dumps(summary(before, after), indent=1))
        print(f"{n} lowered graphs differ over {sum(len(v) for v in after.values())} (model, target) pairs")
        sys.exit(1 if n else 0)
    result = {}
    for name in args.models or list(ZOO):
        if name in args.skip:
            continue
        t0 = time.time()
        result[name] = record(name)
        print(f"{name}: {time.time() - t0:.1f} s", flush=True)
    Path(args.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
