"""Exposed host time per kernel launch: the unfused graph, the fused graph and torch.compile's wrapper, per zoo model.

A plain (synchronised) call costs the GPU's work plus whatever host time the GPU does not hide; a CUDA-graph
replay of the same callable costs the GPU's work alone. So, per timed round,

    exposed host µs per launch = (plain call − its own CUDA-graph replay) / kernels launched per call
    host issue µs per launch   = (host time to issue one call with the GPU idle) / kernels launched per call

"Exposed": host work that overlaps kernels still running is not counted, so a GPU-bound graph (the unfused
ResNet-50) shows little of its host cost; a host-bound one (a decoder at small batches) shows nearly all.

for three callables on every model: the unfused graph and the fused graph (both as the runner prepares
them: ``fusion_engine.fuse`` + ``runtime.measure.prepare_graph``, lean) and ``torch.compile`` default of
the eager module (inductor's generated wrapper). All six (three plain, three replayed) are timed in the
same alternated rounds with CUDA events (``runtime.measure.time_paired``); launches are counted by the
profiler (``runtime.measure.count_launches``). The verdict "fused against inductor" is the paired test
(``explorer.stats.compare``) over the per-round host times. Issue 22's first target: the fused graph's
host time per launch at most inductor's. (The JSON names the figure ``host_us_per_launch``.)

    python3 benchmarks/bench_launch_path.py [--models resnet50,mobilenet_v2,bert_base,llama_decoder]
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks._common import (compile_copy, cuda_graph_replay, results_path, run_stamp,  # noqa: E402
                                write_json)

#: (zoo name, batch, sequence length, dtype, channels_last)
CASES = {
    "resnet50": ("resnet50", 32, None, "fp16", True),
    "mobilenet_v2": ("mobilenet_v2", 32, None, "fp16", True),
    "bert_base": ("bert_base", 32, 128, "fp16", False),
    "llama_decoder": ("llama_decoder", 16, 1024, "bf16", False),
    "llama_decoder_small_batch": ("llama_decoder", 1, 128, "bf16", False),
    "efficientnet_b0": ("efficientnet_b0", 32, None, "fp16", True),
    "convnext_tiny": ("convnext_tiny", 32, None, "fp16", True),
    "vit_b_16": ("vit_b_16", 32, None, "fp16", False),
    "llama_decoder_8b_layers": ("llama_decoder_8b_layers", 4, 1024, "bf16", False),
}

#: Single calls timed for the host's issue time (``host_issue_us``).
ISSUE_CALLS = 40


def host_issue_ms(fn, calls: int = ISSUE_CALLS) -> list[float]:
    """Host time to issue one call with an idle GPU: synchronise, then time the call alone (ms each).

    No queue is full and nothing waits for the GPU, so this is the host's own cost of the call (its
    Python, the dispatcher, the launches), what the "exposed" figure shows only where the GPU does not hide it.
    """
    import torch

    times = []
    for _ in range(calls):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    torch.cuda.synchronize()
    return times


def measure_case(key: str) -> dict:
    import torch

    from explorer import stats
    from explorer.fusion_engine import analyze, fuse
    from explorer.fusions.plan import make_plan
    from explorer.runtime import measure as m

    name, batch, seq, dtype_name, channels_last = CASES[key]
    device, dtype = "cuda", m.torch_dtype(dtype_name)
    analysis = analyze(name, batch=batch, seq_len=seq)
    model, _graph, detection = analysis
    plan = make_plan(detection, "all")
    fused = fuse(analysis, plan, device)
    inputs = m.prepare_inputs(model.example_inputs, device, dtype, channels_last)
    unfused_gm = m.prepare_graph(model.gm, device, dtype, channels_last)
    fused_gm = m.prepare_graph(fused.gm, device, dtype, channels_last)
    eager = m.prepare_module(model.module, device, dtype, channels_last)
    compiled, _target, compile_s = compile_copy(eager, None, inputs, device)
    plain = {"unfused": lambda: unfused_gm(*inputs), "fused": lambda: fused_gm(*inputs), "inductor": compiled}
    fns, notes, launches = {}, {}, {}
    for v, fn in plain.items():
        replay, why = cuda_graph_replay(fn, device)
        if replay is None:
            notes[v] = why
            continue
        fns[v], fns[v + "_graph"] = fn, replay
        launches[v] = m.count_launches(fn, device).get("kernel_launches")
    plan_t = m.TimingPlan.for_device(device)
    with torch.inference_mode():
        samples = m.time_paired(fns, [], device, plan_t)
        issue = {v: host_issue_ms(plain[v]) for v in plain if v in launches}
    host: dict[str, list[float]] = {}
    out = {"model": name, "batch": batch, "seq_len": seq, "dtype": dtype_name,
           "memory_format": "channels_last" if channels_last else "nchw", "compile_s": compile_s,
           "notes": notes, "variants": {}}
    for v in plain:
        if v not in launches or not launches[v]:
            continue
        per_round = [(a - b) * 1e3 / launches[v] for a, b in zip(samples[v], samples[v + "_graph"])]
        host[v] = per_round
        out["variants"][v] = {
            "launches": launches[v], "plain_ms": m.summarize(samples[v]), "graph_ms": m.summarize(samples[v + "_graph"]),
            "host_us_per_launch": m.summarize(per_round),
            "host_issue_ms": m.summarize(issue[v]),
            "host_issue_us_per_launch": m.summarize([t * 1e3 / launches[v] for t in issue[v]])}
    for what, basis in (("", "plain calls"), ("_graph", "CUDA-graph replays (the GPU's work)")):
        if "fused" + what in samples and "inductor" + what in samples:
            verdict = stats.compare(samples["inductor" + what], samples["fused" + what],
                                    basis=f"{basis}, fused graph against torch.compile default")
            out[f"verdict{what}_ms_fused_vs_inductor"] = dataclasses.asdict(verdict)
    if "fused" in issue and "inductor" in issue:
        verdict = stats.compare(issue["inductor"], issue["fused"],
                                basis="host issue time per call, fused graph against torch.compile default")
        out["verdict_issue_fused_vs_inductor"] = dataclasses.asdict(verdict)
    if "fused" in host and "inductor" in host:
        # compare() tests paired log ratios of positive times: a round whose replay came out slower
        # than its plain call (noise) is clipped to 1 ns of host time rather than dropped.
        clip = [max(x, 1e-3) for x in host["inductor"]], [max(x, 1e-3) for x in host["fused"]]
        verdict = stats.compare(*clip, basis="host µs per launch, fused graph against torch.compile default")
        out["verdict_fused_vs_inductor"] = dataclasses.asdict(verdict)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(CASES))
    parser.add_argument("--out", default=None, help="the JSON's path (default: results/launch_path_h200.json)")
    args = parser.parse_args()
    import torch
    from explorer.runtime import measure as m

    doc = {**run_stamp(), "benchmark": "bench_launch_path", "cases": {}}
    path = results_path(args.out, "launch_path_h200.json")
    if not torch.cuda.is_available():
        doc["skipped"] = "no CUDA device here: host time per launch needs CUDA-graph replays"
        write_json(path, doc)
        print(doc["skipped"])
        return 0
    doc["environment"] = m.environment("cuda") if hasattr(m, "environment") else {}
    for key in args.models.split(","):
        t0 = time.perf_counter()
        try:
            doc["cases"][key] = measure_case(key)
        except Exception as exc:  # one model's failure must not lose the others
            doc["cases"][key] = {"error": f"{type(exc).__name__}: {str(exc).strip()[:300]}"}
        doc["cases"][key]["wall_s"] = round(time.perf_counter() - t0, 1)
        write_json(path, doc)
    print(f"{'model':28} {'variant':9} {'launches':>8} {'plain ms':>9} {'graph ms':>9} {'exposed us/l':>12} "
          f"{'issue ms':>9} {'issue us/l':>10}")
    for key, case in doc["cases"].items():
        for v, r in (case.get("variants") or {}).items():
            print(f"{key:28} {v:9} {r['launches']:>8} {r['plain_ms']['median']:>9.3f} {r['graph_ms']['median']:>9.3f} "
                  f"{r['host_us_per_launch']['median']:>12.2f} {r['host_issue_ms']['median']:>9.3f} "
                  f"{r['host_issue_us_per_launch']['median']:>10.2f}")
        if "error" in case:
            print(f"{key:28} error: {case['error']}")
        for name in ("verdict_ms_fused_vs_inductor", "verdict_graph_ms_fused_vs_inductor",
                     "verdict_issue_fused_vs_inductor", "verdict_fused_vs_inductor"):
            verdict = case.get(name)
            if not verdict:
                continue
            print(f"{'':28} {verdict.get('basis')}: {verdict.get('label')} ratio {verdict.get('ratio'):.3f} "
                  f"[{verdict.get('ci_low'):.3f}, {verdict.get('ci_high'):.3f}]")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
