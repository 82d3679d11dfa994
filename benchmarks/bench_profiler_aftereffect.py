"""Does a CUDA profile slow the plain calls timed after it? Before and after one profile, per CUPTI setting.

Kineto leaves NVIDIA's profiling library attached after a CUDA profile unless
``TEARDOWN_CUPTI=1`` (pytorch/pytorch#144455), and every later kernel launch pays
its callbacks. A host-bound model that launches hundreds of kernels per forward
is where that shows. This script times the unfused ResNet-50 (fp16, batch 32,
channels_last, plain calls: about 280 kernels per forward) for ``--rounds``
synchronised calls with CUDA events, profiles one forward, and times it again;
once in a process where ``TEARDOWN_CUPTI`` is unset and once where the
explorer's ``explorer.runtime.measure.profiling`` sets it. Each setting runs in
a fresh process (the library's state is per process).

    python benchmarks/bench_profiler_aftereffect.py --out $OUT/profiler_aftereffect_h200.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys

CHILD = r"""
import json, os, statistics, sys, torch
from torch.profiler import ProfilerActivity, profile
from explorer.fusion_engine import analyze
from explorer.runtime import measure as m
teardown = sys.argv[1] == "teardown"
rounds = int(sys.argv[2])
model, _, _ = analyze("resnet50", batch=32)
gm = m.prepare_graph(model.gm, "cuda", torch.float16, channels_last=True)
x = m.prepare_inputs(model.example_inputs, "cuda", torch.float16, channels_last=True)
def timed():
    out = []
    with torch.inference_mode():
        for _ in range(rounds):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record(); gm(*x); b.record(); b.synchronize()
            out.append(a.elapsed_time(b))
    return out
with torch.inference_mode():
    for _ in range(10): gm(*x)
torch.cuda.synchronize()
before = timed()
with torch.inference_mode():
    if teardown:
        with m.profiling([ProfilerActivity.CPU, ProfilerActivity.CUDA]):
            gm(*x); torch.cuda.synchronize()
    else:
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]):
            gm(*x); torch.cuda.synchronize()
after = timed()
q = lambda v, p: sorted(v)[int(p * (len(v) - 1))]
print(json.dumps({"setting": sys.argv[1], "TEARDOWN_CUPTI": os.environ.get("TEARDOWN_CUPTI"),
                  "before_ms": {"median": statistics.median(before), "p20": q(before, .2), "p80": q(before, .8)},
                  "after_ms": {"median": statistics.median(after), "p20": q(after, .2), "p80": q(after, .8)},
                  "rounds": rounds}))
"""


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=200)
    ap.add_argument("--out")
    args = ap.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("no CUDA GPU here: nothing to measure (the effect is CUPTI's, on a GPU)", file=sys.stderr)
        return 0
    env = {k: v for k, v in os.environ.items() if k != "TEARDOWN_CUPTI"}
    rows = []
    for setting in ("default", "teardown"):
        proc = subprocess.run([sys.executable, "-c", CHILD, setting, str(args.rounds)], capture_output=True,
                              text=True, env=env, timeout=300)
        if proc.returncode:
            print(proc.stderr[-2000:], file=sys.stderr)
            return 1
        rows.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    doc = {"command": " ".join(sys.argv), "date_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(),
           "device": torch.cuda.get_device_name(0), "torch": torch.__version__, "cuda": torch.version.cuda,
           "case": "resnet50 unfused, fp16, batch 32, channels_last, plain synchronised calls", "rows": rows}
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(doc, fh, indent=2)
    print(f"{'setting':<10}{'before ms':>11}{'after ms':>10}{'after/before':>14}")
    for r in rows:
        b, a = r["before_ms"]["median"], r["after_ms"]["median"]
        print(f"{r['setting']:<10}{b:>11.3f}{a:>10.3f}{a / b:>14.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
