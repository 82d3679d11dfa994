"""The fused graph's host path, before and after its bound calls (issue 22): host time per forward and per launch.

``prepare_graph`` now binds each Triton-only fused node once (``lean.bind_calls``: ``triton_support.BoundCall``,
after its first call an input check, the allocations and one C launch per kernel), each SDPA node to the
backend the dispatcher picks (``lean.bind_attention``) and each linear on a contiguous input to the mm/addmm ATen's
linear runs for it (``lean.bind_linears``). This script measures what that saves, on the GPU, for the
graphs exactly as ``bench_measured.py`` prepares them (``bench_measured.prepared``), against the same graph with
every bound node put back to its generic target (``generic``: the path before this change):

- **host issue ms**: host time to issue one forward with the GPU idle (synchronised before each call);
- **plain calls**: ms per forward of ``fused_generic``, ``fused_bound``, the fused graph's own CUDA-graph replay
  (``fused_graph``; the same kernels either way) and torch.compile default (and its CUDA-graph replay) timed in
  the same alternated rounds (``measure.time_paired``);
- **host µs per launch**: (plain call − CUDA-graph replay) / kernels launched, per round, for each;
- **bitwise**: the bound graph's outputs against the generic graph's, ``torch.equal`` on every output, and each
  bound node's state (bound, or why it stayed generic);
- **token-major QKV** (``fused_bound_token_major``, decoders whose QKV GEMM has rotary in its epilogue): the same
  graph with ``qkv_rotary`` writing q, k, v as column views of its own rows (``rotary.QKV_TOKEN_MAJOR``), so that
  attention writes (B, S, H, D) memory and the reshape before o_proj is a view: its time, GPU busy and launches,
  and its outputs against the generic graph's (not bitwise: attention reads other strides).

Usage (GPU machine)::

    python3 benchmarks/bench_host_path.py --budget-s 240
    python3 benchmarks/bench_host_path.py --models llama_decoder --no-compile --budget-s 90

Writes ``$OUT/bench_host_path.json`` (else ``benchmarks/results/bench_host_path.json``) after every model; prints
a short table. A model does not start with less than 45 s of ``--budget-s`` left, torch.compile is skipped with
less than 120 s left (the JSON says what was skipped).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks import _common as common  # noqa: E402
from benchmarks import bench_measured as bm  # noqa: E402
from benchmarks import profile_host as ph  # noqa: E402

MODELS = ("llama_decoder", "gpt2_medium_layers", "llama_decoder_8b_layers")
START = time.perf_counter()


def generic_copy(gm):
    """The same graph (same tensors, same nodes) with every bound node back on its generic target."""
    import torch.fx

    from explorer.runtime import lean

    graph = torch.fx.Graph()
    graph._codegen = gm.graph._codegen                # the pytree in/out specs: the same calling convention
    out = graph.graph_copy(gm.graph, {})
    graph.output(out)
    copy = torch.fx.GraphModule(gm, graph)
    copy.__dict__.update({k: v for k, v in gm.__dict__.items() if k.startswith("_pin_")})
    lean.unbind(copy)
    return copy


def token_major_copy(gm):
    """``generic_copy`` with each QKV-rotary node read by attention only writing token-major outputs
    (``rotary.QKV_TOKEN_MAJOR``'s choice), bound again; (graph, nodes switched)."""
    import torch

    from explorer.fusions import rotary
    from explorer.runtime import lean

    copy = generic_copy(gm)
    switched = 0
    for node in copy.graph.nodes:
        if node.op == "call_function" and node.target is rotary.qkv_rotary and len(node.args) == 10:
            readers = [u for g in node.users if g.args[1] in (0, 1) for u in g.users]
            if readers and all(u.target is torch._C._nn.scaled_dot_product_attention for u in readers):
                node.args = (*node.args[:9], True)
                switched += 1
    copy.recompile()
    lean.bind_calls(copy)
    lean.bind_attention(copy)
    lean.bind_linears(copy)
    return copy, switched


def _flat(out) -> list:
    import torch
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, (tuple, list)):
        return [t for o in out for t in _flat(o)]
    if isinstance(out, dict):
        return [t for o in out.values() for t in _flat(o)]
    return []


def bitwise(a, b) -> dict:
    """Whether two forwards' outputs are equal bit for bit, output by output."""
    import torch
    fa, fb = _flat(a), _flat(b)
    same = [bool(x.shape == y.shape and x.dtype == y.dtype and torch.equal(x, y)) for x, y in zip(fa, fb)]
    return dict(outputs=len(fa), equal=all(same) and len(fa) == len(fb), per_output=same)


def measure(key: str, args, log) -> dict:
    import torch

    from explorer.runtime import lean
    from explorer.runtime import measure as m

    device = "cpu" if args.smoke else "cuda"
    case = bm.SMOKE_CASES[key] if args.smoke else bm.CASES[key]
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        p = bm.prepared(case, device, Path(tmp))
    fused, inputs = p["fused_gm"], p["inputs"]
    if args.smoke:                                    # prepare_graph binds on CUDA only: bind here for the check
        lean.bind_calls(fused)
        lean.bind_attention(fused)
        lean.bind_linears(fused)
    generic = generic_copy(fused)
    row: dict[str, Any] = dict(title=case.title, load_s=round(time.perf_counter() - t0, 1), notes=[])
    with torch.inference_mode():
        for _ in range(3):                            # the first call records each bound node
            out_b = fused(*inputs)
            out_g = generic(*inputs)
        m.synchronize(device)
        row["bitwise_bound_vs_generic"] = bitwise(out_b, out_g)
    row["bound_nodes"] = [repr(b) for b in lean.bound_calls(fused)]
    row["bound"] = sum(1 for b in row["bound_nodes"] if "generic" not in b and ("bound)" in b or "bound:" in b))
    plain = {"fused_generic": lambda: generic(*inputs), "fused_bound": lambda: fused(*inputs)}
    tm, switched = token_major_copy(fused)
    row["token_major_nodes"] = switched
    if switched:
        with torch.inference_mode():
            for _ in range(3):
                out_t = tm(*inputs)
            m.synchronize(device)
            row["token_major_vs_generic"] = dict(bitwise(out_t, out_g), max_abs=max(
                float((a.double() - b.double()).abs().max()) for a, b in zip(_flat(out_t), _flat(out_g))))
        row["token_major_bound_nodes"] = [repr(b) for b in lean.bound_calls(tm)]
        plain["fused_bound_token_major"] = lambda: tm(*inputs)
        del out_t
    del out_b, out_g
    left = args.budget_s - (time.perf_counter() - START)
    keep = []
    if not args.no_compile and not args.smoke and left > 120:
        try:
            call, target, seconds = common.compile_copy(p["eager"], None, inputs, device)
            keep.append(target)
            plain["compile_default"] = call
            row["compile_s"] = seconds
        except Exception as exc:
            row["notes"].append(f"compile default failed: {m._one_line(exc)[:200]}")
    else:
        row["notes"].append("compile default: skipped (--no-compile, or under 120 s of --budget-s left)")
    variants = dict(plain)
    graph_of = {"fused_generic": "fused_graph", "fused_bound": "fused_graph", "compile_default": "compile_default_graph",
                "fused_bound_token_major": "fused_token_major_graph"}
    for name in ("fused_bound", "compile_default", "fused_bound_token_major"):
        if name in plain and not args.smoke:
            replay, why = common.cuda_graph_replay(plain[name], device)
            if replay is None:
                row["notes"].append(f"{name} CUDA graph: {why}")
            else:
                variants[graph_of[name]] = replay
    with torch.inference_mode():
        issue = {v: bm.host_issue_ms(fn, device, args.issue_calls) for v, fn in plain.items()}
        # where the bound graph's host time still goes (own time per function, as profile_host.py reports it)
        row["cprofile_fused_bound"] = ph.cprofile_top(plain["fused_bound"], 20, device, 20)
        row["cprofile_fused_generic"] = ph.cprofile_top(plain["fused_generic"], 20, device, 12)
    left = args.budget_s - (time.perf_counter() - START)
    plan = m.TimingPlan(warmup=1, reps=3) if args.smoke else m.TimingPlan(warmup=3, reps=None, target_s=min(args.target_s, max(0.3, left / 20)), min_reps=20,
                        max_reps=200, max_rounds=300, budget_s=min(args.extend_s, max(0.0, left / 10)))
    pairs = [("fused_generic", "fused_bound")] + ([("compile_default", "fused_bound")] if "compile_default" in plain
                                                   else []) + ([("fused_bound", "fused_bound_token_major")]
                                                               if "fused_bound_token_major" in plain else [])
    samples = m.time_paired(variants, pairs, device, plan)
    profiles = {v: common.profile_forward(fn, device, top=6, cpu_ops=False) for v, fn in plain.items()}
    launches = {v: profiles[v].get("kernel_launches") for v in plain}
    row["variants"] = {}
    for v in variants:
        r = dict(latency_ms=m.summarize(samples[v]))
        if v in plain:
            r["host_issue_ms"] = m.summarize(issue[v])
            r["launches"] = launches[v]
            r["gpu_busy_ms"] = profiles[v].get("gpu_busy_ms")
            r["top_kernels"] = profiles[v].get("top_kernels")
            g = graph_of[v]
            if launches[v] and g in samples:
                r["host_us_per_launch"] = m.summarize(bm.host_per_launch(samples[v], samples[g], launches[v]))
                r["exposed_host_ms"] = m.summarize([a - b for a, b in zip(samples[v], samples[g])])
        row["variants"][v] = r
    row["verdicts"] = [bm.verdict(samples, b, c, "plain calls, paired rounds", f"{c} vs {b}") for b, c in pairs]
    row["samples_ms"] = {v: [round(t, 5) for t in s] for v, s in samples.items()}
    row["wall_s"] = round(time.perf_counter() - t0, 1)
    del keep, plain, variants
    if not args.smoke:
        torch.cuda.empty_cache()
    log(f"{key}: done in {row['wall_s']} s")
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--budget-s", type=float, default=240.0)
    ap.add_argument("--no-compile", action="store_true", help="skip torch.compile default")
    ap.add_argument("--issue-calls", type=int, default=40)
    ap.add_argument("--target-s", type=float, default=1.0, help="timed seconds per variant to aim at")
    ap.add_argument("--extend-s", type=float, default=6.0, help="seconds of extra rounds for an open verdict")
    ap.add_argument("--out", default=None)
    ap.add_argument("--smoke", action="store_true",
                    help="CPU, Triton's interpreter, bench_measured's GPT-2 tiny smoke case: the plumbing, not GPU numbers")
    args = ap.parse_args(argv)
    path = common.results_path(args.out, "bench_host_path.json")
    doc: dict[str, Any] = dict(schema="bench_host_path/1", **common.run_stamp(), models={}, skipped=[])
    import torch
    if args.smoke:
        import os
        os.environ["TRITON_INTERPRET"] = "1"
        args.models, args.no_compile = "gpt2_tiny_smoke", True
        doc["label"] = "SMOKE run on the CPU (Triton interpreter): the numbers are not GPU numbers"
    elif not torch.cuda.is_available():
        return common.write_skipped(doc, path, "bench_host_path.py")
    doc["gpu"] = torch.cuda.get_device_name(0) if not args.smoke else "none (CPU smoke)"
    doc["versions"] = dict(torch=torch.__version__, triton=__import__("triton").__version__)
    log = common.elapsed_logger(START)
    for key in [k for k in args.models.split(",") if k]:
        if args.budget_s - (time.perf_counter() - START) < 45:
            doc["skipped"].append(f"{key}: under 45 s of --budget-s left")
            continue
        try:
            doc["models"][key] = measure(key, args, log)
        except Exception as exc:  # a failed model is recorded, the others still run
            import traceback
            doc["models"][key] = dict(error=f"{type(exc).__name__}: {exc}"[:400],
                                      where=traceback.format_exc()[-1500:])
        common.write_json(path, doc)
    print(f"{'model':26} {'variant':16} {'ms':>8} {'issue ms':>9} {'launch':>7} {'host us/launch':>15}")
    for key, r in doc["models"].items():
        if "error" in r:
            print(key, r["error"])
            continue
        print(f"{key}: bitwise bound == generic: {r['bitwise_bound_vs_generic']['equal']}, "
              f"{r['bound']} of {len(r['bound_nodes'])} bound nodes bound")
        for v, x in r["variants"].items():
            hpl = x.get("host_us_per_launch")
            print(f"{key:26} {v:16} {x['latency_ms']['median']:8.3f} "
                  f"{x.get('host_issue_ms', {}).get('median', float('nan')):9.3f} {x.get('launches') or 0:7.0f} "
                  f"{hpl['median'] if hpl else float('nan'):15.1f}")
        for vd in r["verdicts"]:
            print(f"   {vd['target']}: {vd['verdict']} ({vd['candidate_ms']:.3f} vs {vd['baseline_ms']:.3f} ms)")
        for s in r["bound_nodes"]:
            if "generic" in s:
                print("   stays generic:", s)
        for x in r.get("cprofile_fused_bound", [])[:8]:
            print(f"   bound cProfile own {x['own_us']:7.1f} us x{x['calls_per_forward']:.0f} {x['function']}")
    for s in doc["skipped"]:
        print("skipped:", s)
    print("wrote", path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
