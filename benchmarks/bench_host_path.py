"""The fused graph's host path, bind by bind (issue 22): host time per forward and per launch of each variant.

``prepare_graph`` binds nodes once, at their first call: each Triton-only fused node (``lean.bind_calls``:
``triton_support.BoundCall``, after its first call an input check, the allocations and one C launch per kernel),
each SDPA node to the backend the dispatcher picks (``lean.bind_attention``), each linear on a contiguous input to
the mm/addmm ATen's linear runs for it (``lean.bind_linears``), and each tree of view-like nodes read from one
tensor to one ``as_strided`` per view the graph reads (``lean.collapse_views``). Which of them apply is
``lean.DEFAULT_BINDS``, set from this script's measurements. For the fused graph exactly as ``bench_measured.py``
prepares it (``prepared_fused``: its steps, the model's casts kept), prepared with no binds, the variants
(``bind_variants``) each apply a set of binds to a copy of that graph (same tensors, same nodes):

- ``fused_generic`` none; ``fused_bound`` every bind but the views (the path before the view pass);
  ``fused_bound_nolinear`` / ``_noattention`` / ``_nocalls`` ``fused_bound`` less one bind (so the pair with
  ``fused_bound`` is that bind's effect); ``fused_views`` ``fused_bound`` plus the views; ``fused_lean``
  ``lean.DEFAULT_BINDS`` (where it is none of the others); ``fused_lean_nocats`` that without
  ``lean.pass_empty_cats`` (``fused_lean_emptycats`` that with it, were the default without it): the pair with
  ``fused_lean`` is that pass's effect, on a model with such a cat; its CUDA-graph replay is its own
  (``fused_emptycats_graph``: no cat kernels), against ``fused_graph``; ``fused_lean_addmm`` that plus
  ``lean.addmm_as_linear`` (``fused_lean_noaddmm`` that without it, were the default with it), on a model with a
  flattened ``addmm`` (GPT-2's ``Conv1D``);
- **bitwise**: each variant's outputs against ``fused_generic``'s, ``torch.equal`` on every output;
- **nodes** and **ATen calls per forward** (``lean.aten_calls_per_forward``, a dispatcher count) per variant;
- **host issue ms**: host time to issue one forward with the GPU idle (synchronised before each call);
- **plain calls**: ms per forward of every variant, the fused graph's own CUDA-graph replay (``fused_graph``:
  the same kernels for every variant) and torch.compile default (and its CUDA-graph replay) in the same
  alternated rounds (``measure.time_paired``), paired verdicts (``explorer.stats.compare``);
- **host µs per launch**: (plain call − CUDA-graph replay) / kernels launched, per round, with a paired verdict
  against compile default's.

Usage (GPU machine)::

    python3 benchmarks/bench_host_path.py                  # zoo decoder + GPT-2 folder, about 110 s on one H200
    python3 benchmarks/bench_host_path.py --models gpt2_medium_layers,bert_base --compile --budget-s 200

Writes ``$OUT/bench_host_path.json`` (else ``benchmarks/results/bench_host_path.json``) after every model; prints
a short table, then the per-family GPU bitwise checks (``family_checks``) while time is left. A model does not
start with less than 35 s of ``--budget-s`` left; torch.compile runs only with ``--compile`` (on
``--compile-models`` where given) and 60 s left; at ``--budget-s`` + 10 s a watchdog writes the JSON and ends
the process (the JSON says what was skipped).
"""

from __future__ import annotations

import argparse
import dataclasses
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

MODELS = ("llama_decoder", "gpt2_medium_layers")
START = time.perf_counter()


def prepared_fused(case, device: str, tmp: Path, eager: bool, binds=None) -> dict:
    """``bench_measured.prepared`` without the unfused graph (and without the eager module unless ``eager``): the
    fused graph exactly as the runner prepares it (the model's casts kept; ``binds``: ``prepare_graph``'s, default
    its default), its inputs."""
    from explorer.fusion_engine import fuse
    from explorer.fusions.plan import make_plan
    from explorer.runtime import measure as m

    analysis = bm.load_case(case, tmp)
    model, _graph, det = analysis
    plan = make_plan(det, "all", memory_format="channels_last" if case.channels_last else "nchw")
    fused = fuse(analysis, plan, device)
    dtype = m.torch_dtype(case.dtype)
    casts, _note = (m.record_casts(model.module, model.example_inputs, model.gm, dtype)
                    if model.module is not None else (None, None))
    return dict(inputs=m.prepare_inputs(model.example_inputs, device, dtype, case.channels_last),
                fused_gm=m.prepare_graph(fused.gm, device, dtype, case.channels_last, casts=casts, binds=binds),
                eager=m.prepare_module(model.module, device, dtype, case.channels_last) if eager else None)


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


#: The variants of the fused graph timed against each other: which binds each applies to the graph prepared with
#: none (``lean.NO_BINDS``). Each differs from ``fused_bound`` (every bind but the views: the path before the
#: view pass) in one switch, so each pair's verdict is that one switch's effect; ``fused_lean`` is what
#: ``prepare_graph`` applies by default (left out where it equals another variant).
def bind_variants() -> dict:
    from explorer.runtime import lean

    none, bound = lean.NO_BINDS, lean.Binds(views=False)
    out = dict(fused_generic=none, fused_bound=bound,
               fused_bound_nolinear=lean.Binds(linears=False, views=False),
               fused_bound_noattention=lean.Binds(attention=False, views=False),
               fused_bound_nocalls=lean.Binds(calls=False, views=False),
               fused_views=lean.Binds())
    if lean.DEFAULT_BINDS not in out.values():
        out["fused_lean"] = lean.DEFAULT_BINDS
    for switch, (on, off) in SWITCH_VARIANTS.items():   # against fused_lean: that one switch's effect
        has = getattr(lean.DEFAULT_BINDS, switch)
        other = dataclasses.replace(lean.DEFAULT_BINDS, **{switch: not has})
        if other not in out.values():
            out[off if has else on] = other
    return out


#: The lean passes timed as one switch flipped from ``lean.DEFAULT_BINDS``: switch -> (the variant's name with it
#: on, with it off), where the default has it the other way.
SWITCH_VARIANTS = {"empty_cats": ("fused_lean_emptycats", "fused_lean_nocats"),
                   "addmm_linears": ("fused_lean_addmm", "fused_lean_noaddmm")}


def switch_pair(switch: str, binds_row: dict, graphs: dict) -> tuple[str, str] | None:
    """``(without, with)``: the two variants whose pair is ``switch``'s effect (one of them ``fused_lean``), or
    None where the pass bound nothing on this model (its variant is then ``fused_lean``'s graph again and is
    dropped from ``graphs``)."""
    from explorer.runtime import lean

    on, off = SWITCH_VARIANTS[switch]
    has = getattr(lean.DEFAULT_BINDS, switch)
    with_, without = ("fused_lean", off) if has else (on, "fused_lean")
    if not binds_row.get(with_, {}).get("bound", {}).get(switch):
        graphs.pop(off if has else on, None)
        return None
    return without, with_


def variant_copy(gm, binds):
    """``generic_copy`` of a graph prepared without binds, with ``binds`` applied (on any device: the smoke run
    binds on the CPU too); (graph, how many nodes each pass bound)."""
    from explorer.runtime import lean

    copy = generic_copy(gm)
    done = dict(lean.apply_binds(copy, None, binds), **lean.apply_view_binds(copy, binds))
    return copy, done


def _flat_outputs(out) -> list:
    from explorer.runtime.measure import flat_outputs   # (torch imported late: --help stays fast)
    return flat_outputs(out)


def bitwise(a, b) -> dict:
    """Whether two forwards' outputs are equal bit for bit, output by output."""
    import torch
    fa, fb = _flat_outputs(a), _flat_outputs(b)
    same = [bool(x.shape == y.shape and x.dtype == y.dtype and torch.equal(x, y)) for x, y in zip(fa, fb)]
    return dict(outputs=len(fa), equal=all(same) and len(fa) == len(fb), per_output=same)


def measure(key: str, args, log) -> dict:
    import torch

    from explorer.runtime import lean
    from explorer.runtime import measure as m

    device = "cpu" if args.smoke else "cuda"
    case = bm.SMOKE_CASES[key] if args.smoke else bm.CASES[key]
    compile_here = args.compile and key in (args.compile_models.split(",") if args.compile_models else [key])
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        p = prepared_fused(case, device, Path(tmp), eager=compile_here, binds=lean.NO_BINDS)
    base, inputs = p["fused_gm"], p["inputs"]
    row: dict[str, Any] = dict(title=case.title, load_s=round(time.perf_counter() - t0, 1), notes=[],
                               default_binds=lean.DEFAULT_BINDS.label())
    graphs, row["binds"] = {}, {}
    for name, binds in bind_variants().items():
        graphs[name], done = variant_copy(base, binds)
        row["binds"][name] = dict(switches=binds.label(), bound=done)
    nocats, cats = switch_pair("empty_cats", row["binds"], graphs) or (None, None)
    addmm_pair = switch_pair("addmm_linears", row["binds"], graphs)
    row["nodes"] = {name: len(g.graph.nodes) for name, g in graphs.items()}
    with torch.inference_mode():
        outs = {}
        for _ in range(3):                            # the first call records each bound node
            for name, g in graphs.items():
                outs[name] = g(*inputs)
        m.synchronize(device)
        row["bitwise_vs_generic"] = {name: bitwise(o, outs["fused_generic"]) for name, o in outs.items()
                                     if name != "fused_generic"}
        row["aten_calls_per_forward"] = {name: lean.aten_calls_per_forward(g, *inputs) for name, g in graphs.items()}
        m.synchronize(device)
    del outs
    row["bitwise_bound_vs_generic"] = row["bitwise_vs_generic"]["fused_bound"]
    row["bound_nodes"] = {name: [repr(b) for b in lean.bound_calls(g)] for name, g in graphs.items()}
    row["bound"] = {name: sum(1 for b in nodes if "generic" not in b and ("bound)" in b or "bound:" in b))
                    for name, nodes in row["bound_nodes"].items()}
    row["view_trees"] = {name: [repr(n.target) for n in g.graph.nodes if isinstance(n.target, lean.BoundViews)]
                         for name, g in graphs.items() if row["binds"][name]["bound"]["views"]}
    plain = {name: (lambda g=g: g(*inputs)) for name, g in graphs.items()}
    if not args.smoke and args.budget_s - (time.perf_counter() - START) < 20:
        row["notes"].append("stopped after the bitwise check: under 20 s of --budget-s left")
        return row
    left = args.budget_s - (time.perf_counter() - START)
    keep = []
    if compile_here and not args.smoke and left > 60:
        try:
            call, target, seconds = common.compile_copy(p["eager"], None, inputs, device)
            keep.append(target)
            plain["compile_default"] = call
            row["compile_s"] = seconds
        except Exception as exc:
            row["notes"].append(f"compile default failed: {m._one_line(exc)[:200]}")
    else:
        row["notes"].append("compile default: not run here (no --compile, not in --compile-models, or under 60 s "
                            "of --budget-s left)")
    variants = dict(plain)
    graph_of = {name: "fused_graph" for name in graphs}   # every fused variant launches the same kernels
    graph_of["compile_default"] = "compile_default_graph"
    if cats:                                          # launches fewer kernels (no cat copies): its own replay
        graph_of[cats] = "fused_emptycats_graph"
    for name in ("fused_bound", "compile_default", cats):
        if name in plain and not args.smoke:
            replay, why = common.cuda_graph_replay(plain[name], device)
            if replay is None:
                row["notes"].append(f"{name} CUDA graph: {why}")
            else:
                variants[graph_of[name]] = replay
    last = "fused_lean" if "fused_lean" in plain else "fused_views"
    with torch.inference_mode():
        issue = {v: bm.host_issue_ms(fn, device, args.issue_calls) for v, fn in plain.items()}
        # where the host time still goes (own time per function, as profile_host.py reports it)
        row["cprofile_fused_bound"] = ph.cprofile_top(plain["fused_bound"], 10, device, 14)
        row["cprofile_" + last] = ph.cprofile_top(plain[last], 10, device, 14)
    left = args.budget_s - (time.perf_counter() - START)
    plan = m.TimingPlan(warmup=1, reps=3) if args.smoke else m.TimingPlan(
        warmup=2, reps=None, target_s=min(args.target_s, max(0.2, left / 40)), min_reps=15, max_reps=120,
        max_rounds=150, budget_s=min(args.extend_s, max(0.0, left / 15)))
    pairs = [("fused_generic", "fused_bound"), ("fused_bound", "fused_bound_nolinear"),
             ("fused_bound", "fused_bound_noattention"), ("fused_bound", "fused_bound_nocalls"),
             ("fused_bound", "fused_views")]
    pairs += [("fused_bound", "fused_lean"), ("fused_bound_nolinear", "fused_lean")] if "fused_lean" in plain else []
    pairs += [("compile_default", "fused_bound"), ("compile_default", last)] if "compile_default" in plain else []
    if cats:                                          # the pass's effect on plain calls, on any device
        pairs += [(nocats, cats)]
        pairs += [("fused_graph", "fused_emptycats_graph")] if "fused_emptycats_graph" in variants else []
        pairs += [("compile_default", cats)] if "compile_default" in plain and cats != last else []
    if addmm_pair and "fused_lean" in plain:          # the flattened addmm as one linear, on any device
        pairs += [addmm_pair]
    samples = m.time_paired(variants, pairs, device, plan)
    # the profiler's launches and GPU busy: every fused variant runs the same kernels (bitwise equal, above), so
    # the bound graph, the default one and compile are profiled and the other fused variants take the bound one's
    profiled = [v for v in ("fused_bound", last, cats, "compile_default") if v in plain]
    profiles = {v: common.profile_forward(plain[v], device, top=6, cpu_ops=False) for v in profiled}
    row["variants"] = {}
    for v in variants:
        r = dict(latency_ms=m.summarize(samples[v]))
        if v in plain:
            prof = profiles.get(v) or profiles["fused_bound"]
            r["host_issue_ms"] = m.summarize(issue[v])
            r["launches"] = prof.get("kernel_launches")
            r["launches_from"] = v if v in profiles else "fused_bound"
            r["gpu_busy_ms"] = prof.get("gpu_busy_ms")
            if v in profiles:
                r["top_kernels"] = prof.get("top_kernels")
            g = graph_of[v]
            if r["launches"] and g in samples:
                r["host_us_per_launch"] = m.summarize(bm.host_per_launch(samples[v], samples[g], r["launches"]))
                r["exposed_host_ms"] = m.summarize([x - y for x, y in zip(samples[v], samples[g])])
        row["variants"][v] = r
    row["verdicts"] = [bm.verdict(samples, b, c, "plain calls, paired rounds", f"{c} vs {b}") for b, c in pairs]
    if "compile_default" in samples and all(g in samples for g in ("fused_graph", "compile_default_graph")):
        per_launch = {v: bm.host_per_launch(samples[v], samples[graph_of[v]], row["variants"][v]["launches"])
                      for v in ("compile_default", "fused_bound", last, cats)
                      if v in row["variants"] and graph_of[v] in samples and row["variants"][v].get("launches")}
        if "compile_default" in per_launch:
            row["host_per_launch_verdicts"] = [
                dict(bm.verdict(per_launch, "compile_default", v, "host µs per launch, paired rounds",
                                f"host µs per launch {v} vs compile_default"))
                for v in per_launch if v != "compile_default" and min(per_launch[v]) > 0
                and min(per_launch["compile_default"]) > 0]
    row["samples_ms"] = {v: [round(t, 5) for t in s] for v, s in samples.items()}
    row["wall_s"] = round(time.perf_counter() - t0, 1)
    del keep, plain, variants, graphs
    if not args.smoke:
        torch.cuda.empty_cache()
    log(f"{key}: done in {row['wall_s']} s")
    return row


def family_checks(deadline: float, device: str = "cuda") -> dict:
    """Each bound family on CUDA at one awkward shape in bf16: the replay (second call) against the generic call,
    bit for bit and in layout, and the bound state. A family not started before ``deadline`` is listed as skipped."""
    import torch
    import torch.nn.functional as F

    from explorer.fusions import linear_residual, norm, rms_norm, rotary, swiglu
    from explorer.fusions import triton_support as ts
    from explorer.fusions.kernels import gemm
    from explorer.runtime import lean
    from explorer.runtime import measure as m

    g = torch.Generator(device=device).manual_seed(0)

    def r(*shape, scale=1.0):
        return torch.randn(*shape, device=device, dtype=torch.bfloat16, generator=g) * scale

    x, res, w = r(3, 37, 520), r(3, 37, 520), r(520)
    q, k, cos, sin = r(2, 8, 33, 64), r(2, 2, 33, 64), r(1, 33, 64), r(1, 33, 64)
    xa = r(2, 33, 520)
    w_qkv, w_o, b_o, z = r(12 * 64, 520, scale=0.05), r(384, 520, scale=0.05), r(384), r(2, 33, 384)
    w_il, _ = gemm.interleave_gate_up(r(2 * 344, 520, scale=0.05))
    qa, ka, va = r(2, 8, 128, 64), r(2, 2, 128, 64), r(2, 2, 128, 64)
    cases = {
        "rms_norm": (rms_norm.fused_rms_norm, (x, w, 1e-6)),
        "add_rms_norm": (rms_norm.fused_add_rms_norm, (x, res, w, 1e-6)),
        "add_rms_norm_normed": (rms_norm.fused_add_rms_norm_normed, (x, res, w, 1e-6)),
        "add_layer_norm": (norm.fused_add_layer_norm, (x, res, w, r(520), 1e-5)),
        "rotary": (rotary.fused_rotary, (q, k, cos, sin)),
        "qkv_rotary": (rotary.qkv_rotary, (xa, w_qkv, None, cos, sin, 8, 2, 64, None, False)),
        "qkv_rotary_token_major": (rotary.qkv_rotary, (xa, w_qkv, None, cos, sin, 8, 2, 64, None, True)),
        "linear_residual": (linear_residual.linear_residual_gemm, (xa, w_o, b_o, z)),
        "swiglu_interleaved": (swiglu.swiglu_epilogue_interleaved, (xa, w_il, None, None)),
        "silu_mul_packed": (swiglu.silu_mul_packed, (r(5, 41, 688), 344)),
        "linear": ("linear", (x, w_o, b_o)),
        "sdpa_gqa_causal": ("sdpa", (qa, ka, va)),
    }
    out: dict[str, Any] = {}
    for name, (target, args) in cases.items():
        if time.perf_counter() > deadline:
            out[name] = "skipped: the deadline"
            continue
        t0 = time.perf_counter()
        try:
            with torch.inference_mode():
                if target == "linear":
                    bound, generic = lean.BoundLinear(), (lambda *a: F.linear(*a))
                elif target == "sdpa":
                    bound = lean.BoundAttention(True, None, True)
                    generic = lambda *a: F.scaled_dot_product_attention(*a, is_causal=True, enable_gqa=True)  # noqa
                else:
                    bound, generic = ts.BoundCall(target), target
                bound(*args)
                replayed = bound(*args)
                want = generic(*args)
                m.synchronize(device)
                flat_r, flat_w = _flat_outputs(replayed), _flat_outputs(want)
                equal = len(flat_r) == len(flat_w) and all(
                    a.shape == b.shape and a.stride() == b.stride() and torch.equal(a, b) for a, b in zip(flat_r, flat_w))
            out[name] = dict(equal=equal, state=repr(bound), seconds=round(time.perf_counter() - t0, 2))
        except Exception as exc:  # one family's failure is a result
            out[name] = dict(equal=False, error=f"{type(exc).__name__}: {exc}"[:300])
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--budget-s", type=float, default=100.0,
                    help="no model starts after it; the process writes its JSON and exits at --budget-s + 10")
    ap.add_argument("--compile", action="store_true", help="also time torch.compile default (tens of seconds each)")
    ap.add_argument("--compile-models", default="",
                    help="with --compile: only these models (comma-separated; default every model)")
    ap.add_argument("--issue-calls", type=int, default=30)
    ap.add_argument("--target-s", type=float, default=0.4, help="timed seconds per variant to aim at")
    ap.add_argument("--extend-s", type=float, default=3.0, help="seconds of extra rounds for an open verdict")
    ap.add_argument("--no-family-checks", action="store_true",
                    help="skip the per-family GPU bitwise checks at the end (the models' own checks still run)")
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
        args.models, args.compile = "gpt2_tiny_smoke", False
        doc["label"] = "SMOKE run on the CPU (Triton interpreter): the numbers are not GPU numbers"
    elif not torch.cuda.is_available():
        return common.write_skipped(doc, path, "bench_host_path.py")
    doc["gpu"] = torch.cuda.get_device_name(0) if not args.smoke else "none (CPU smoke)"
    doc["versions"] = dict(torch=torch.__version__, triton=__import__("triton").__version__)
    log = common.elapsed_logger(START)
    if not args.smoke:
        _watchdog(doc, path, args.budget_s + 10)
    for key in [k for k in args.models.split(",") if k]:
        if args.budget_s - (time.perf_counter() - START) < 35:
            doc["skipped"].append(f"{key}: under 35 s of --budget-s left")
            continue
        try:
            doc["models"][key] = measure(key, args, log)
        except Exception as exc:  # a failed model is recorded, the others still run
            import traceback
            doc["models"][key] = dict(error=f"{type(exc).__name__}: {exc}"[:400],
                                      where=traceback.format_exc()[-1500:])
        common.write_json(path, doc)
    if not args.smoke:
        if args.no_family_checks:
            doc["skipped"].append("family_checks: --no-family-checks")
        elif args.budget_s - (time.perf_counter() - START) > 8:
            doc["family_checks"] = family_checks(START + args.budget_s)
        else:
            doc["skipped"].append("family_checks: under 8 s of --budget-s left")
        common.write_json(path, doc)
    print(f"{'model':26} {'variant':16} {'ms':>8} {'issue ms':>9} {'launch':>7} {'host us/launch':>15}")
    for key, r in doc["models"].items():
        if "error" in r:
            print(key, r["error"])
            continue
        print(f"{key}: bitwise == generic: " + ", ".join(f"{v} {b['equal']}" for v, b in r['bitwise_vs_generic'].items()))
        print(f"   nodes {r['nodes']}\n   ATen calls/forward {r['aten_calls_per_forward']}")
        for v, x in r["variants"].items():
            hpl = x.get("host_us_per_launch")
            print(f"{key:26} {v:16} {x['latency_ms']['median']:8.3f} "
                  f"{x.get('host_issue_ms', {}).get('median', float('nan')):9.3f} {x.get('launches') or 0:7.0f} "
                  f"{hpl['median'] if hpl else float('nan'):15.1f}")
        for vd in r["verdicts"] + r.get("host_per_launch_verdicts", []):
            print(f"   {vd['target']}: {vd['verdict']} ({vd['candidate_ms']:.3f} vs {vd['baseline_ms']:.3f} ms)")
        for s in sorted(set(x for nodes in r["bound_nodes"].values() for x in nodes)):
            if "generic" in s:
                print("   stays generic:", s)
        for x in r.get("cprofile_fused_bound", [])[:8]:
            print(f"   bound cProfile own {x['own_us']:7.1f} us x{x['calls_per_forward']:.0f} {x['function']}")
    for name, c in doc.get("family_checks", {}).items():
        print(f"family {name:24} {c if isinstance(c, str) else ('bitwise ' + str(c.get('equal')) + ' ' + c.get('state', c.get('error', '')))}")
    for s in doc["skipped"]:
        print("skipped:", s)
    print("wrote", path, f"in {time.perf_counter() - START:.1f} s")
    return 0


def _watchdog(doc: dict, path: Path, at_s: float) -> None:
    """At ``at_s`` seconds after the start: write what was measured and leave the process (a hard deadline)."""
    import os
    import threading

    def stop() -> None:
        try:
            doc.setdefault("skipped", []).append(f"stopped by the hard deadline at {at_s:.0f} s")
            common.write_json(path, doc)
        finally:
            print(f"bench_host_path: hard deadline at {at_s:.0f} s; wrote {path}", flush=True)
            os._exit(0)

    timer = threading.Timer(max(1.0, at_s - (time.perf_counter() - START)), stop)
    timer.daemon = True
    timer.start()


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    import os
    os._exit(code)        # no lingering threads or children (the watchdog, compile workers)
