"""``lean_heads`` on the GPU: torchvision's ViTs with the batch-first heads pass on and off, in the same rounds.

The pass (``explorer/runtime/lean_heads.py``, ``lean.Binds.heads``) replaces ``nn.MultiheadAttention``'s
sequence-first head split and gather by views of the in-projection's own rows: three activation copies a layer
fewer (ViT-L/16 fused at batch 32 in fp16 spent 1.94 ms of its 11.35 ms of GPU work in 72 ``direct_copy_kernel``
calls, ``bench_corpus_h200_part15``). Per model (built as ``bench_corpus.py`` builds it: seeded, its real size,
fp16, channels_last input, the model's own casts kept), the fused and the unfused graph each prepared twice,
with the pass (``prepare_graph``'s default) and without it (``heads=False``, every other bind the default):

- **outputs**: each graph with the pass against itself without (``torch.equal``, and the largest difference),
  and every variant against the model in float64 (``_common.errors``);
- **plain calls and CUDA-graph replays**: every variant timed in the same alternated rounds
  (``measure.time_paired``), paired verdicts of on against off (``explorer.stats.compare``);
- **profile**: GPU busy per forward, kernel launches, and the copy kernels (``direct_copy`` in the name) of the
  fused graph on and off (``_common.profile_forward``, 3 forwards).

Usage::

    python3 benchmarks/bench_heads.py                               # ViT-B/16, ViT-L/16 (about 2 min on one H200)
    python3 benchmarks/bench_heads.py --models tv/vit_b_32,tv/vit_h_14
    python3 benchmarks/bench_heads.py --smoke                       # the CPU plumbing check, CI sizes, fp32

Writes ``$OUT/bench_heads.json`` (else ``benchmarks/results/bench_heads.json``): command, GPU, versions, date.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks import _common as common  # noqa: E402

MODELS = ("tv/vit_b_16", "tv/vit_l_16")
PAIRS = (("fused_off", "fused_on"), ("unfused_off", "unfused_on"), ("fused_off_graphs", "fused_on_graphs"))


def _copies(profile: dict) -> dict:
    top = [k for k in profile.get("top_kernels", []) if "direct_copy" in k["name"]]
    return dict(calls=sum(k["calls"] for k in top), us=round(sum(k["total_us"] for k in top), 1))


def measure_model(name: str, smoke: bool, log) -> dict:
    """One model: both graphs with the pass and without, checked, timed in the same rounds, profiled."""
    import torch

    from benchmarks import bench_corpus as bc
    from explorer import stats
    from explorer.runtime import lean, lean_heads
    from explorer.runtime import measure as m

    off_binds = dataclasses.replace(lean.DEFAULT_BINDS, heads=False)
    model = bc.model_on_device(name, smoke)
    device, out, x, x32, features = model.device, model.out, model.x, model.x32, model.features
    graphs = {}
    for label, g in (("fused", model.fused.gm), ("unfused", model.gm)):
        for side, binds in (("on", lean.DEFAULT_BINDS), ("off", off_binds)):
            graphs[f"{label}_{side}"] = model.prepare(g, binds)
    out["rewritten"] = {k: sum(1 for n in g.graph.nodes if lean_heads.op_name(n) == "seq_first_qkv")
                        for k, g in graphs.items()}
    fns = {k: (lambda g=g: g(*x)) for k, g in graphs.items()}
    with torch.inference_mode():
        outs = {k: m.flat_outputs(f())[0] for k, f in fns.items()}
    m.synchronize(device)
    out["same_outputs"] = {}
    for label in ("fused", "unfused"):
        a, b = outs[f"{label}_off"], outs[f"{label}_on"]
        out["same_outputs"][label] = dict(bitwise=bool(torch.equal(a, b)),
                                          max_abs_diff=float((a.float() - b.float()).abs().max()))
    ref_module = m.prepare_module(features, device, torch.float64)
    with torch.inference_mode():
        ref = m.flat_outputs(ref_module(*m.prepare_inputs(x32, device, torch.float64)))[0]
    del ref_module
    out["precision"] = {k: common.errors(o.float(), ref) for k, o in outs.items()}
    del ref, outs
    if device == "cuda":
        for side in ("on", "off"):
            replay, why = common.cuda_graph_replay(fns[f"fused_{side}"], device)
            if replay is not None:
                fns[f"fused_{side}_graphs"] = replay
            else:
                out["notes"].append(f"fused_{side}_graphs: not captured: {why}")
        torch.cuda.empty_cache()
    plan = (m.TimingPlan(warmup=1, reps=3) if smoke else
            m.TimingPlan(target_s=1.0, min_reps=20, max_reps=400, max_rounds=600, budget_s=6.0))
    pairs = [(b, c) for b, c in PAIRS if b in fns and c in fns]
    log(f"{name}: timing {len(fns)} variants")
    samples = m.time_paired(fns, pairs, device, plan)
    out["latency_ms"] = {v: m.summarize(s) for v, s in samples.items()}
    out["verdicts"] = {}
    for b, c in pairs:
        v = stats.compare(samples[b], samples[c], basis=f"{c} against {b}, paired rounds")
        out["verdicts"][f"{c}_vs_{b}"] = dataclasses.asdict(v)
    out["profile"] = {}
    for v in ("fused_on", "fused_off"):
        p = common.profile_forward(fns[v], device, top=10_000, cpu_ops=smoke, calls=3)   # every kernel: the copies
        out["profile"][v] = dict(p, copies=_copies(p), top_kernels=p["top_kernels"][:12])
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--smoke", action="store_true", help="CPU, CI sizes, fp32: the plumbing, no GPU number")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    device = common.bench_device("bench_heads.py", args.smoke)
    path = common.results_path(args.out, "bench_heads.json")
    from explorer.runtime.measure import environment

    doc = dict(common.run_stamp(), script="bench_heads.py", environment=environment(device or "cpu"), models={})
    if device is None:
        return common.write_skipped(doc, path, "bench_heads.py")
    log = common.elapsed_logger(time.perf_counter())
    for name in [n for n in args.models.split(",") if n]:
        try:
            doc["models"][name] = measure_model(name, args.smoke, log)
        except Exception as exc:   # one model's failure is its row, the others still run
            doc["models"][name] = dict(model=name, error=f"{type(exc).__name__}: {str(exc)[:300]}")
        common.write_json(path, doc)
    print(f"{'model':<14} {'variant':<18} {'ms':>8}   verdict on vs off")
    for name, r in doc["models"].items():
        if "error" in r:
            print(f"{name:<14} {r['error']}")
            continue
        for v, s in r["latency_ms"].items():
            print(f"{name:<14} {v:<18} {s['median']:8.3f}")
        for k, v in r["verdicts"].items():
            ratio = "" if None in (v["ratio"], v["ci_low"], v["ci_high"]) else \
                f" {v['ratio']:.3f} [{v['ci_low']:.3f}, {v['ci_high']:.3f}]"
            print(f"{name:<14} {k:<36} {v['label']}{ratio}")
        for v, p in r["profile"].items():
            print(f"{name:<14} {v:<18} GPU busy {p.get('gpu_busy_ms')} ms, launches {p.get('kernel_launches')}, "
                  f"copies {p['copies']}")
        print(f"{name:<14} rewritten {r['rewritten']}, same outputs {r['same_outputs']}")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
