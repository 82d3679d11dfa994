"""Benchmark the decoder fusions on a GPU: the kernels against a copy, the Llama-style decoder against torch.compile.

::

    kernels  Add+RMSNorm (bf16, fp32), RMSNorm, silu·mul (two tensors; one packed [gate; up] GEMM output),
             rotary Q+K (MHA and GQA), at Llama-7B sizes: fused | eager (the reference ops) | torch.compile
             (default, max-autotune-no-cudagraphs) | a device-to-device copy of the same bytes, in the same rounds.
             GB/s from an explicit byte model (each input read once, each output written once); target:
             the fused Add+RMSNorm and SwiGLU kernels at >= 90% of the copy's GB/s.
    prefill  zoo llama_decoder in bf16 at batch x seq (default 16 x 1024): eager (the transformers module) |
             graph (the unfused explorer graph) | fused (every chain) | fused + CUDA graphs | torch.compile
             default | max-autotune-no-cudagraphs | reduce-overhead. Targets: fused <= the faster of compile
             default and max-autotune-no-cudagraphs (no CUDA graphs on either side); fused + CUDA graphs <=
             reduce-overhead (CUDA graphs on both). Same inputs, same dtype, same layout for all.
    decode   zoo llama_decode_step (one token over a static KV cache) the same way; not in the default run.

Method. Kernels: ``triton.testing.do_bench`` (CUDA events around each call, the L2 flushed before each,
warm-up first), every per-call time kept, pooled over ``--rounds`` rounds that alternate the variants,
inputs rotated over enough buffer sets to exceed 4x the L2; each variant's output checked against eager
first. Models: ``explorer.runtime.measure.time_alternated`` (warm-up, CUDA events per call, variants
alternated ABBA round after round), graphs prepared by ``measure.prepare_graph`` as the runner times
them; per variant the median with p20/p80, the GPU-busy time of one forward (the union of its kernels'
intervals in ``torch.profiler``), the kernel count, the error against the unfused graph in float64, and
the top kernels of the fused model and of torch.compile's faster mode: the per-kernel profile that
says where a target is missed.

Usage::

    python benchmarks/bench_llm_fusions.py --part kernels        # ~4-5 min on an H200
    python benchmarks/bench_llm_fusions.py --part prefill        # ~4-6 min (max-autotune compiles the GEMMs)
    python benchmarks/bench_llm_fusions.py --quick               # both parts: 1 round, no max-autotune, 8 x 512
    python benchmarks/bench_llm_fusions.py --smoke               # no GPU needed: tiny shapes, proves the plumbing
    python benchmarks/bench_llm_fusions.py --aot-check           # no GPU needed: compile every kernel for sm_90

Without CUDA (and without ``--smoke``) it measures nothing, says SKIPPED and exits 0. Writes JSON
(``--out``, default ``$OUT/bench_llm_fusions.json``, else ``benchmarks/results/``) holding the
command, the date, the GPU, driver and library versions and every number, rewritten after each part
(a run cut short keeps the finished parts), and prints a short table last. ``--budget-s`` bounds one
call: parts and compile modes that would start after it are skipped, with a note.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import functools
import itertools
import math
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks import _common as common  # noqa: E402  (after the root is on sys.path)

#: The fused kernels that must reach this fraction of the copy's bandwidth.
TARGET_FRACTION = 0.90
TARGET_KERNELS = ("add_rms_norm", "silu_mul")
#: torch.compile baselines of the kernels part (the model parts': ``common.COMPILE_MODES``).
KERNEL_COMPILE_MODES = (("compile_default", None), ("compile_max_autotune_no_cudagraphs", "max-autotune-no-cudagraphs"))
MODELS = {"prefill": "llama_decoder", "decode": "llama_decode_step"}
#: Tiny decoder sizes of the CPU smoke run (the zoo's are too slow under the Triton interpreter).
SMOKE_SIZES = dict(layers=1, hidden=64, heads=2, kv_heads=1, intermediate=96, vocab=64, max_positions=64)


# ====================================================================== kernels

@dataclasses.dataclass
class Case:
    """One kernel benchmark: its byte model, a maker of one input set, and the variants to time."""

    name: str                                   # e.g. "add_rms_norm 8192x4096 bf16"
    kernel: str                                 # "add_rms_norm", "rms_norm", "silu_mul", "rotary"
    bytes: int                                  # each input read once + each output written once
    make_inputs: Callable[[], tuple]            # one set of input tensors
    fused: Callable[..., Any]                   # inputs -> outputs
    reference: Callable[..., Any]               # inputs -> outputs (eager; also what torch.compile gets)
    tolerances: dict                            # per dtype, fused vs eager
    dtype: Any
    note: str = ""
    sweep: dict = dataclasses.field(default_factory=dict)   # "fused[knobs]" -> fn, timed with --sweep
    max_autotune: bool = False                  # also compile the reference with max-autotune-no-cudagraphs


def _short(dtype) -> str:
    import torch

    return {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}[dtype]


def kernel_cases(dev: str, smoke: bool = False) -> list[Case]:
    """The kernel cases: Llama-7B sizes (hidden 4096, intermediate 11008, 32 heads of 128), then the zoo
    decoder's own (16 x 1024 tokens, hidden 512, intermediate 1376, 8 heads over 2 of 64), or tiny awkward
    ones for the smoke run. The two target kernels at 7B sizes are also compiled with max-autotune.
    Nothing is allocated here."""
    import torch

    from explorer.fusions import rms_norm as rn
    from explorer.fusions import rotary as rot
    from explorer.fusions import swiglu

    m, n, i = (24, 103, 200) if smoke else (8192, 4096, 11008)
    cases: list[Case] = []
    for dt in (torch.bfloat16, torch.float32):
        e = dt.itemsize

        def make(dt=dt):
            """x, residual (M, N) and a weight (N,) around 1."""
            return (torch.randn(m, n, device=dev, dtype=dt), torch.randn(m, n, device=dev, dtype=dt),
                    (torch.randn(n, device=dev) * 0.1 + 1).to(dt))
        sweep = {f"fused[rows={r},w={w}]": (lambda x, res, wt, r=r, w=w:
                                            rn.add_rms_norm(x, res, wt, 1e-6, rows_per_prog=r, num_warps=w))
                 for r, w in ((1, 4), (1, 16), (2, 8), (2, 16), (4, 16))}
        cases.append(Case(f"add_rms_norm {m}x{n} {_short(dt)}", "add_rms_norm", 4 * m * n * e + n * e, make,
                          lambda x, r, w: rn.add_rms_norm(x, r, w, 1e-6),
                          lambda x, r, w: rn.add_rms_norm_reference(x, r, w, 1e-6),
                          rn.EAGER_TOLERANCES, dt, "reads x, residual, weight; writes sum, normed", sweep,
                          max_autotune=dt == torch.bfloat16))

    def make_norm():
        """x (M, N) and a weight (N,), bf16."""
        return (torch.randn(m, n, device=dev, dtype=torch.bfloat16),
                (torch.randn(n, device=dev) * 0.1 + 1).to(torch.bfloat16))
    cases.append(Case(f"rms_norm {m}x{n} bf16", "rms_norm", 2 * m * n * 2 + n * 2, make_norm,
                      lambda x, w: rn.rms_norm(x, w, 1e-6), lambda x, w: rn.rms_norm_reference(x, w, 1e-6),
                      rn.EAGER_TOLERANCES, torch.bfloat16, "reads x, weight; writes normed"))

    def make_sep():
        """gate, up (M, I), contiguous, bf16."""
        return (torch.randn(m, i, device=dev, dtype=torch.bfloat16) * 3,
                torch.randn(m, i, device=dev, dtype=torch.bfloat16))
    sweep = {f"fused[bn={bn},w={w}]": (lambda g, u, bn=bn, w=w: swiglu.silu_mul(g, u, block_n=bn, num_warps=w))
             for bn, w in ((1024, 4), (2048, 4), (2048, 8), (8192, 16))}
    cases.append(Case(f"silu_mul {m}x{i} bf16", "silu_mul", 3 * m * i * 2, make_sep, swiglu.silu_mul,
                      swiglu.silu_mul_reference, swiglu.EAGER_TOLERANCES, torch.bfloat16, "gate, up contiguous",
                      sweep))

    def make_packed():
        """gu (M, 2I): one [gate; up] GEMM output, bf16."""
        gu = torch.randn(m, 2 * i, device=dev, dtype=torch.bfloat16)
        gu[:, :i] *= 3
        return (gu,)
    sweep = {f"fused[bm={bm},bn={bn},w={w}]": (lambda gu, bm=bm, bn=bn, w=w:
                                               swiglu.silu_mul_packed(gu, i, block_m=bm, block_n=bn, num_warps=w))
             for bm, bn, w in ((1, 1024, 4), (2, 1024, 4), (8, 1024, 16), (2, 2048, 8), (1, 4096, 8))}
    cases.append(Case(f"silu_mul_packed {m}x(2*{i}) bf16", "silu_mul", 3 * m * i * 2, make_packed,
                      lambda gu: swiglu.silu_mul_packed(gu, i), lambda gu: swiglu.silu_mul_packed_reference(gu, i),
                      swiglu.EAGER_TOLERANCES, torch.bfloat16, "one [gate; up] GEMM output read as column views",
                      sweep, max_autotune=True))

    shapes = ((1, 5, 3, 1, 40),) if smoke else ((4, 2048, 32, 32, 128), (1, 8192, 32, 8, 128), (16, 1024, 8, 2, 64))
    for b, s, hq, hkv, d in shapes:
        def make_rope(b=b, s=s, hq=hq, hkv=hkv, d=d):
            """q, k as transposed (B, S, H, D) projections and Llama's cos, sin (B, S, D), bf16."""
            q = torch.randn(b, s, hq, d, device=dev, dtype=torch.bfloat16).transpose(1, 2)   # (B, Hq, S, D)
            k = torch.randn(b, s, hkv, d, device=dev, dtype=torch.bfloat16).transpose(1, 2)  # (B, Hkv, S, D)
            pos = torch.arange(s, device=dev, dtype=torch.float32)[None].expand(b, s)
            inv = 1.0 / (10000.0 ** (torch.arange(0, d, 2, device=dev, dtype=torch.float32) / d))
            emb = torch.cat([pos[..., None] * inv] * 2, dim=-1)                             # (B, S, D)
            return q, k, emb.cos().to(torch.bfloat16), emb.sin().to(torch.bfloat16)
        qk = b * s * (hq + hkv) * d * 2
        sweep = {f"fused[tokens={t},w={w}]": (lambda q, k, c, sn, t=t, w=w: rot.rotary(q, k, c, sn, tokens=t,
                                                                                        num_warps=w))
                 for t, w in (((1, 2), 4), ((2, 8), 4), ((4, 16), 4), ((1, 1), 4), ((2, 8), 8))}
        cases.append(Case(f"rotary B{b} S{s} Hq{hq} Hkv{hkv} D{d} bf16", "rotary", 2 * qk + 2 * b * s * d * 2,
                          make_rope, rot.rotary, rot.rotary_reference, rot.EAGER_TOLERANCES, torch.bfloat16,
                          "q, k transposed views of (B,S,H,D); writes q_embed, k_embed", sweep))
    if not smoke:                                  # the zoo decoder's own sizes (llama_decoder at 16 x 1024)
        t, h, inter = 16 * 1024, 512, 1376

        def make_small_norm():
            """x, residual (tokens, 512) and a weight, bf16."""
            return (torch.randn(t, h, device=dev, dtype=torch.bfloat16),
                    torch.randn(t, h, device=dev, dtype=torch.bfloat16),
                    (torch.randn(h, device=dev) * 0.1 + 1).to(torch.bfloat16))
        cases.append(Case(f"add_rms_norm {t}x{h} bf16 (zoo decoder)", "add_rms_norm", 4 * t * h * 2 + h * 2,
                          make_small_norm, lambda x, r, w: rn.add_rms_norm(x, r, w, 1e-6),
                          lambda x, r, w: rn.add_rms_norm_reference(x, r, w, 1e-6), rn.EAGER_TOLERANCES,
                          torch.bfloat16, "the zoo decoder's rows", {
                              f"fused[rows={r},w={w}]": (lambda x, res, wt, r=r, w=w: rn.add_rms_norm(
                                  x, res, wt, 1e-6, rows_per_prog=r, num_warps=w))
                              for r, w in ((1, 2), (2, 4), (4, 4), (8, 8))}))

        def make_small_packed():
            """gu (tokens, 2 x 1376), bf16."""
            return (torch.randn(t, 2 * inter, device=dev, dtype=torch.bfloat16) * 2,)
        cases.append(Case(f"silu_mul_packed {t}x(2*{inter}) bf16 (zoo decoder)", "silu_mul", 3 * t * inter * 2,
                          make_small_packed, lambda gu: swiglu.silu_mul_packed(gu, inter),
                          lambda gu: swiglu.silu_mul_packed_reference(gu, inter), swiglu.EAGER_TOLERANCES,
                          torch.bfloat16, "the zoo decoder's MLP"))
    return cases


def _flatten(out) -> list:
    """Outputs as a list of tensors (a tuple's None entries dropped)."""
    import torch

    if isinstance(out, torch.Tensor):
        return [out]
    return [t for t in out if t is not None]


def _check(case: Case, got, want) -> str:
    """``"ok"`` when every output matches eager within the case's tolerance, else what differs."""
    import torch

    got, want = _flatten(got), _flatten(want)
    if len(got) != len(want):
        return f"{len(got)} outputs vs {len(want)}"
    for g, w in zip(got, want):
        if torch.isnan(g).any() and not torch.isnan(w).any():
            return "NaN in output"
        tol = case.tolerances[case.dtype]
        try:
            torch.testing.assert_close(g.float(), w.float(), **tol)
        except AssertionError as err:
            return "mismatch: " + _mismatch_detail(g, w, tol, err)
    return "ok"


def _mismatch_detail(got, want, tol: dict, err: Exception) -> str:
    """How many elements are beyond ``|got - want| <= atol + rtol·|want|`` and the worst one (its values, how far
    past the bound), so a failed check says whether it is a few elements near a dtype's range limits or more."""
    import torch

    try:
        g, w = got.double().reshape(-1), want.double().reshape(-1)
        diff = (g - w).abs()
        bound = tol.get("atol", 0.0) + tol.get("rtol", 0.0) * w.abs()
        over = diff > bound
        i = int(torch.argmax(torch.where(over, diff - bound, torch.full_like(diff, -1.0))))
        return (f"{int(over.sum())} of {g.numel()} elements beyond atol {tol.get('atol')} + rtol {tol.get('rtol')}; "
                f"worst: got {g[i].item():.6g}, eager {w[i].item():.6g}, |diff| {diff[i].item():.3g} "
                f"(allowed {bound[i].item():.3g})")
    except Exception:  # a shape mismatch and the like: torch's own first line
        return str(err).strip().splitlines()[0][:120]


def _quantiles(times: list[float]) -> tuple[float, float, float]:
    """(median, 20th, 80th percentile) of per-call times, in ms."""
    import torch

    t = torch.tensor(times, dtype=torch.float64)
    q = torch.quantile(t, torch.tensor([0.5, 0.2, 0.8], dtype=torch.float64))
    return float(q[0]), float(q[1]), float(q[2])


def cpu_do_bench(fn, warmup=0, rep=0, return_mode="all") -> list[float]:
    """A CPU stand-in for ``triton.testing.do_bench``: three wall-clock timings in ms (smoke runs only)."""
    del warmup, rep, return_mode
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return times


def run_case(case: Case, args, l2_bytes: int, do_bench, deadline: float) -> list[dict]:
    """Time every variant of one case (and a copy of the same bytes) in interleaved rounds; one row each."""
    import torch

    first = case.make_inputs()
    dev = first[0].device
    input_bytes = sum(t.numel() * t.element_size() for t in first)
    n_sets = max(2, math.ceil(args.rotate_l2 * l2_bytes / max(input_bytes, 1)))
    sets = [first] + [case.make_inputs() for _ in range(n_sets - 1)]
    half = case.bytes // 2
    copy_src = [torch.empty(half, dtype=torch.uint8, device=dev)
                for _ in range(max(2, math.ceil(args.rotate_l2 * l2_bytes / max(half, 1))))]
    copy_dst = torch.empty(half, dtype=torch.uint8, device=dev)

    variants: dict[str, Callable | None] = {"copy": None, "fused": case.fused, "eager": case.reference}
    if args.sweep:
        variants.update(case.sweep)
    notes: dict[str, str] = {}
    modes = [] if args.no_compile else [KERNEL_COMPILE_MODES[0]] + (
        [KERNEL_COMPILE_MODES[1]] if case.max_autotune and not args.quick else [])
    for label, mode in modes:
        if time.perf_counter() > deadline:
            notes[label] = "skipped: past --budget-s"
            continue
        try:
            torch._dynamo.reset()
            fn = torch.compile(case.reference, mode=mode, dynamic=False)
            t0 = time.perf_counter()
            fn(*first)
            if dev.type == "cuda":
                torch.cuda.synchronize()
            notes[label] = f"compiled in {time.perf_counter() - t0:.1f} s"
            variants[label] = fn
        except Exception as err:  # a compile failure is a result, not a crash
            notes[label] = f"torch.compile failed: {type(err).__name__}: {str(err).strip()[:160]}"

    want = case.reference(*first)
    checks = {name: ("n/a" if fn is None else _check(case, fn(*first), want)) for name, fn in variants.items()}
    times: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(args.rounds):
        for name, fn in variants.items():
            if fn is None:
                srcs = itertools.cycle(copy_src)
                call = lambda: copy_dst.copy_(next(srcs))                       # noqa: E731
            else:
                inputs = itertools.cycle(sets)
                call = lambda fn=fn: fn(*next(inputs))                          # noqa: E731
            times[name] += do_bench(call, warmup=args.warmup_ms, rep=args.rep_ms, return_mode="all")
    copy_gbps = case.bytes / (_quantiles(times["copy"])[0] * 1e-3) / 1e9
    rows = []
    for name in variants:
        p50, p20, p80 = _quantiles(times[name])
        gbps = case.bytes / (p50 * 1e-3) / 1e9
        rows.append(dict(case=case.name, kernel=case.kernel, variant=name, bytes=case.bytes, ms_p50=p50,
                         ms_p20=p20, ms_p80=p80, samples=len(times[name]), gbps=gbps,
                         fraction_of_copy=gbps / copy_gbps, check=checks[name], input_sets=n_sets,
                         note=notes.get(name, case.note if name == "fused" else "")))
    del sets, copy_src, copy_dst
    if dev.type == "cuda":
        torch.cuda.empty_cache()
    return rows


def bench_kernels(args, device: str, log, deadline: float) -> dict:
    """The kernel part: every case, the copy reference in the same rounds, and the >= 90% verdicts."""
    import torch

    from explorer.fusions.rms_norm import select_rms_norm
    from explorer.fusions.rotary import select_rotary
    from explorer.fusions.swiglu import select_swiglu

    if device.startswith("cuda"):
        from triton.testing import do_bench

        props = torch.cuda.get_device_properties(0)
        l2_bytes = int(getattr(props, "L2_cache_size", 0) or 60 * 2**20)
    else:
        do_bench, l2_bytes = cpu_do_bench, 64 * 1024
    names = {s.strip() for s in args.cases.split(",") if s.strip()} or None
    rows: list[dict] = []
    skipped: list[str] = []
    for case in kernel_cases(device, smoke=args.smoke):
        if names is not None and case.kernel not in names:
            continue
        if time.perf_counter() > deadline:
            skipped.append(case.name)
            continue
        choice = {"add_rms_norm": lambda: select_rms_norm(device, None, case.dtype),
                  "rms_norm": lambda: select_rms_norm(device, None, case.dtype, add=False),
                  "silu_mul": lambda: select_swiglu(device, case.dtype),
                  "rotary": lambda: select_rotary(device, case.dtype, 128)}[case.kernel]()
        log(f"[kernels] {case.name}: fused = {choice.label}")
        rows += run_case(case, args, l2_bytes, do_bench, deadline)
    verdicts = [dict(case=r["case"], fraction_of_copy=r["fraction_of_copy"],
                     meets_target=r["fraction_of_copy"] >= TARGET_FRACTION)
                for r in rows if r["variant"] == "fused" and r["kernel"] in TARGET_KERNELS
                and "zoo decoder" not in r["case"]]
    return dict(rows=rows, verdicts=verdicts, skipped_past_budget=skipped,
                target=dict(fraction_of_copy=TARGET_FRACTION, kernels=list(TARGET_KERNELS)),
                byte_model=("each input read once + each output written once; the copy moves the same bytes "
                            "(half read, half written)"),
                settings=dict(rounds=args.rounds, warmup_ms=args.warmup_ms, rep_ms=args.rep_ms,
                              rotate_l2=args.rotate_l2, l2_bytes=l2_bytes, sweep=args.sweep))


# ====================================================================== whole decoder

#: One profiled forward per variant: the top 12 kernels; on the CPU nothing (a note).
profile_forward = functools.partial(common.profile_forward, top=12, cpu_ops=False)


def _smoke_analysis(batch: int, seq: int, decode: bool):
    """The tiny decoder of the smoke run as an ``Analysis`` (the zoo's sizes are too slow interpreted)."""
    import torch

    from explorer.fusion_engine import Analysis, detect
    from explorer.graph.build import build_graph
    from explorer.sources import LoadedModel, capture, models

    torch.manual_seed(0)
    module = (models.LlamaDecodeStep if decode else models.LlamaDecoder)(SMOKE_SIZES).eval()
    ids = torch.randint(0, SMOKE_SIZES["vocab"], (batch, 1 if decode else seq))
    head_dim = SMOKE_SIZES["hidden"] // SMOKE_SIZES["heads"]
    cache = tuple(torch.randn(batch, SMOKE_SIZES["kv_heads"], seq, head_dim)
                  for _ in range(2 * SMOKE_SIZES["layers"])) if decode else ()
    inputs = (ids, *cache)
    gm = capture(module, tuple(t.clone() for t in inputs), "smoke_llama")
    model = LoadedModel("smoke_llama", "zoo", gm, inputs, [f"in{i}" for i in range(len(inputs))],
                        task="classification", module=module, batch=batch, seq_len=seq)
    graph = build_graph(gm, model.name)
    return Analysis(model, graph, detect(graph))


def bench_model(part: str, args, device: str, log, deadline: float,
                checkpoint: Callable[[dict], None] = lambda partial: None) -> dict:
    """One decoder (prefill or decode step) in bf16, in two timing sessions of one run.

    Session 1: eager, graph, fused, fused + CUDA graphs, compile default and reduce-overhead, alternated.
    Its result is handed to ``checkpoint`` (written to the JSON) before max-autotune-no-cudagraphs, the
    slowest compile, starts. Session 2: fused, compile default and max-autotune-no-cudagraphs, alternated
    again, so that the first target compares the three in the same rounds.
    """
    import torch

    from explorer.fusion_engine import analyze, fuse
    from explorer.runtime import measure

    dtype = torch.float32 if args.smoke else torch.bfloat16
    name = MODELS[part]
    batch, seq = args.batch, args.seq_len
    t0 = time.perf_counter()
    log(f"[{part}] {name}: batch {batch}, seq {seq}, {str(dtype).replace('torch.', '')}: load, detect, fuse")
    analysis = _smoke_analysis(batch, seq, part == "decode") if args.smoke else analyze(name, batch, seq)
    model, _, det = analysis
    fused = fuse(analysis, None, device)
    applied = collections.Counter((a.pattern, a.status, a.implementation) for a in fused.applied)
    x = measure.prepare_inputs(model.example_inputs, device, dtype)
    notes: list[str] = [
        "graph and fused are prepared by explorer.runtime.measure.prepare_graph, which retargets every float "
        "dtype argument to the run's dtype: the decoder's fp32 islands (RMSNorm statistics, the rotary "
        "positions and angles) then run in the run's dtype in both; eager and torch.compile keep transformers' "
        "fp32 islands (the fused RMSNorm kernel computes its statistics in fp32 either way)"]
    ref_gm = measure.prepare_graph(model.gm, device, torch.float64)
    with torch.inference_mode():
        ref = ref_gm(*measure.prepare_inputs(model.example_inputs, device, torch.float64)).detach().cpu()
    del ref_gm

    variants: dict[str, Callable[[], Any]] = {}
    eager = measure.prepare_module(model.module, device, dtype)
    variants["eager"] = lambda: eager(*x)
    graph = measure.prepare_graph(model.gm, device, dtype)
    variants["graph"] = lambda: graph(*x)
    fgm = measure.prepare_graph(fused.gm, device, dtype)
    variants["fused"] = lambda: fgm(*x)
    head = dict(part=part, model=name, batch=batch, seq_len=seq, dtype=str(dtype).replace("torch.", ""),
                tokens=batch * (1 if part == "decode" else seq), chains=dict(det.counts),
                applied=[dict(pattern=p, status=s, implementation=i, chains=n) for (p, s, i), n in applied.items()])
    out = common.sessions_against_compile(
        variants, eager, x, ref, head, notes, device=device, args=args, deadline=deadline,
        log=lambda msg: log(f"[{part}] {msg}"), profile=profile_forward,
        checkpoint=lambda partial: checkpoint(dict(partial, wall_s=round(time.perf_counter() - t0, 1))))
    del variants, fgm, graph, eager
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
    return dict(out, wall_s=round(time.perf_counter() - t0, 1))


# ====================================================================== sm_90 compilation without a GPU

def _ptx_memory_ops(ptx: str) -> dict[str, int]:
    """Global loads/stores in the PTX by instruction (``...v4.b32`` = 16-byte vectors), with counts."""
    return dict(collections.Counter(m.group(1) for m in re.finditer(r"((?:ld|st)\.global\S*)", ptx)))


def _cubin_resources(cubin: bytes) -> str:
    """``REG:n STACK:n SHARED:n`` of a cubin's kernel, read with Triton's bundled cuobjdump."""
    import triton

    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(cubin)
    try:
        out = subprocess.run([tool, "-res-usage", f.name], capture_output=True, text=True, check=True).stdout
    finally:
        os.unlink(f.name)
    m = re.search(r"REG:\d+ STACK:\d+ SHARED:\d+", out)
    return m.group(0) if m else out.strip()[-200:]


def aot_compile_all(arch: int = 90) -> list[dict]:
    """Compile every kernel for ``sm_<arch>`` at Llama-7B and awkward sizes with Triton's bundled ptxas (no GPU);
    one record each: registers, stack (spills), global memory instructions. The interpreter must be off."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from explorer.fusions import rms_norm as rn
    from explorer.fusions import rotary as rot
    from explorer.fusions import swiglu

    def compile_one(fn, signature, constexprs, num_warps, aligned):
        attrs = {(fn.arg_names.index(a),): [["tt.divisibility", 16]] for a in aligned}
        kernel = triton.compile(ASTSource(fn, signature, constexprs, attrs), target=GPUTarget("cuda", arch, 32),
                                options=dict(num_warps=num_warps))
        return dict(resources=_cubin_resources(kernel.asm["cubin"]), memory_ops=_ptx_memory_ops(kernel.asm["ptx"]))

    records = []
    kernel = rn._build_kernel(False)
    for dt, n in (("bf16", 4096), ("fp32", 4096), ("fp16", 103), ("bf16", 16384), ("bf16", 512)):
        block, rows, warps, hints = rn.launch_setting(n)
        sig = dict(X=f"*{dt}", R=f"*{dt}", W=f"*{dt}", S=f"*{dt}", Y=f"*{dt}", stride_x="i32", stride_r="i32",
                   stride_s="i32", stride_y="i32", M="i32", N="i32", R_ROWS="i32", eps="fp32",
                   HAS_R="constexpr", HAS_W="constexpr", WRITE_SUM="constexpr", BLOCK="constexpr",
                   ROWS="constexpr", BF16_RTNE_BY_HAND="constexpr", LIBRARY_REDUCE="constexpr",
                   EVEN="constexpr", HINTS="constexpr")
        aligned = ("X", "R", "W", "S", "Y") + (("stride_x", "stride_r", "stride_s", "stride_y", "N")
                                               if n % 16 == 0 else ())
        for has_r in (True, False):
            consts = dict(HAS_R=has_r, HAS_W=True, WRITE_SUM=has_r, BLOCK=block, ROWS=rows,
                          BF16_RTNE_BY_HAND=False, LIBRARY_REDUCE=True, EVEN=n == block, HINTS=hints)
            records.append(dict(kernel="add_rms_norm" if has_r else "rms_norm", case=f"{dt} N={n}",
                                num_warps=warps, **compile_one(kernel, sig, consts, warps, aligned)))
    kernel = swiglu._build_kernel(False)
    for label, dt, m, n in (("silu_mul (one long row)", "bf16", 1, 8192 * 11008),
                            ("silu_mul_packed", "bf16", 8192, 11008), ("silu_mul_packed", "bf16", 16384, 1376),
                            ("silu_mul (rows)", "fp32", 13, 103)):
        bm, bn, warps, flat, hints = swiglu.launch_setting(m, n)
        sig = dict(G=f"*{dt}", U=f"*{dt}", O=f"*{dt}", up_off="i32", stride_g="i32", stride_u="i32",
                   stride_o="i32", M="i32", N="i32", N_BLOCKS="i32", BLOCK_M="constexpr", BLOCK_N="constexpr",
                   BF16_RTNE_BY_HAND="constexpr", ACT="constexpr", FLAT="constexpr", HINTS="constexpr")
        aligned = ("G", "U", "O") + (("up_off", "stride_g", "stride_u", "stride_o", "N") if n % 16 == 0 else ())
        records.append(dict(kernel=label, case=f"{dt} {m}x{n} tile {bm}x{bn}", num_warps=warps,
                            **compile_one(kernel, sig, dict(BLOCK_M=bm, BLOCK_N=bn, BF16_RTNE_BY_HAND=False,
                                                            ACT=swiglu.KERNEL_GATES["silu"], FLAT=flat,
                                                            HINTS=hints), warps, aligned)))
    kernel = rot._build_kernel(False)
    names = ["Q", "K", "C", "SN", "QO", "KO", "T", "S", "HQ", "HKV", "sq_b", "sq_h", "sq_s", "sk_b", "sk_h", "sk_s",
             "sc_b", "sc_s", "ss_b", "ss_s", "sqo_b", "sqo_h", "sqo_s", "sko_b", "sko_h", "sko_s"]
    for hq, hkv, d in ((32, 32, 128), (32, 8, 128), (8, 2, 64), (3, 1, 40)):
        bhq, bhk, tq, tk, bhalf, warps = rot.launch_config(hq, hkv, d)
        q_blocks, k_blocks = -(-hq // bhq), -(-hkv // bhk)
        q_per = (tk // tq) * q_blocks
        consts = dict(HALF=d // 2, BLOCK_HALF=bhalf, BLOCK_HQ=bhq, BLOCK_HK=bhk, TOKENS_Q=tq, TOKENS_K=tk,
                      Q_BLOCKS=q_blocks, Q_PER=q_per, PER=q_per + k_blocks, BF16_RTNE_BY_HAND=False,
                      TABLE_TILE=False)
        sig = {k: ("*bf16" if j < 6 else "i32") for j, k in enumerate(names)}
        sig.update({c: "constexpr" for c in consts})
        aligned = names[:6] + (names[10:] if d % 16 == 0 else [])
        records.append(dict(kernel="rotary", case=f"bf16 Hq{hq} Hkv{hkv} D{d} tile {tq}x{bhq} / {tk}x{bhk}",
                            num_warps=warps, **compile_one(kernel, sig, consts, warps, tuple(aligned))))
    return records


def aot_check(arch: int) -> int:
    """Print one block per compilation; 1 if the interpreter is on or any kernel spills registers."""
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        print("--aot-check: unset TRITON_INTERPRET (the kernels must be decorated for compilation)")
        return 1
    spilled = False
    for r in aot_compile_all(arch):
        print(f"{r['kernel']:<26} {r['case']:<38} warps={r['num_warps']:<3} {r['resources']}")
        print("    " + ", ".join(f"{op} x{n}" for op, n in r["memory_ops"].items()))
        spilled |= "STACK:0 " not in r["resources"] + " "
    return 1 if spilled else 0


# ====================================================================== report

def table(doc: dict) -> str:
    """The short table printed last: kernels (GB/s, % of copy), then each model's variants and verdicts."""
    lines = []
    kernels = doc.get("kernels")
    if kernels:
        lines.append(f"{'kernel case':<40} {'variant':<36} {'p50 us':>9} {'p20-p80 us':>17} {'GB/s':>7} "
                     f"{'%copy':>6}  check")
        for r in kernels["rows"]:
            spread = f"{r['ms_p20'] * 1e3:.1f}-{r['ms_p80'] * 1e3:.1f}"
            lines.append(f"{r['case']:<40} {r['variant']:<36} {r['ms_p50'] * 1e3:>9.1f} {spread:>17} "
                         f"{r['gbps']:>7.0f} {100 * r['fraction_of_copy']:>5.1f}%  {r['check']}")
        for v in kernels["verdicts"]:
            lines.append(f"target >= {TARGET_FRACTION:.0%} of copy: {v['case']}: {100 * v['fraction_of_copy']:.1f}% "
                         f"{'MET' if v['meets_target'] else 'MISSED'}")
        for s in kernels.get("skipped_past_budget", []):
            lines.append(f"skipped (past --budget-s): {s}")
    for part in ("prefill", "decode"):
        lines += common.model_table_lines(part, doc.get(part), "{model} {dtype} batch {batch} seq {seq_len}:")
    return "\n".join(lines)


def parse_args(argv=None) -> argparse.Namespace:
    """Command-line options."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--part", default="kernels,prefill", help="comma-separated: kernels, prefill, decode")
    p.add_argument("--cases", default="", help="kernels part: add_rms_norm,rms_norm,silu_mul,rotary (default all)")
    p.add_argument("--batch", type=int, default=None, help="model parts: batch (default 16; --quick 8; --smoke 2)")
    p.add_argument("--seq-len", type=int, default=None,
                   help="model parts: prompt length, or the decode step's cache length (default 1024; --quick 512)")
    p.add_argument("--rounds", type=int, default=3, help="kernels part: interleaved rounds over the variants")
    p.add_argument("--warmup-ms", type=int, default=25, help="kernels part: do_bench warm-up per round (ms)")
    p.add_argument("--rep-ms", type=int, default=100, help="kernels part: do_bench timed duration per round (ms)")
    p.add_argument("--rotate-l2", type=float, default=4.0, help="kernels part: inputs rotate over this many L2s")
    p.add_argument("--sweep", action="store_true", help="kernels part: also time other launch settings")
    p.add_argument("--no-compile", action="store_true", help="skip every torch.compile variant")
    p.add_argument("--quick", action="store_true", help="1 round, no max-autotune, batch 8 x seq 512")
    p.add_argument("--smoke", action="store_true",
                   help="run on the CPU at tiny sizes, without torch.compile (the Triton kernels run interpreted "
                        "under TRITON_INTERPRET=1): proves the plumbing")
    p.add_argument("--aot-check", action="store_true", help="compile every kernel for --arch without a GPU, and exit")
    p.add_argument("--arch", type=int, default=90, help="--aot-check: the CUDA architecture (90: H100/H200)")
    p.add_argument("--budget-s", type=float, default=450.0,
                   help="no part or compile mode starts after this many seconds (default 450)")
    p.add_argument("--out", default=None, help="JSON path (default $OUT/bench_llm_fusions.json)")
    args = p.parse_args(argv)
    if args.quick:
        args.rounds = 1
    if args.smoke:
        args.no_compile = True   # inductor's CPU compile would take minutes and time nothing of interest here
    default_batch, default_seq = (2, 8) if args.smoke else (8, 512) if args.quick else (16, 1024)
    args.batch = args.batch or default_batch
    args.seq_len = args.seq_len or default_seq
    args.parts = [s.strip() for s in args.part.split(",") if s.strip()]
    unknown = [s for s in args.parts if s not in ("kernels", *MODELS)]
    if unknown:
        p.error(f"unknown part(s) {', '.join(unknown)}")
    return args


def main(argv=None) -> int:
    """Run the benchmark; returns the exit status (0 also when skipped without CUDA)."""
    args = parse_args(argv)
    if args.aot_check:
        return aot_check(args.arch)
    import torch

    device = common.bench_device("bench_llm_fusions.py", args.smoke)
    if device is None:
        return 0
    from explorer.runtime import measure

    env = measure.environment(device)
    if device == "cuda":
        env["tf32_matmul"] = bool(torch.backends.cuda.matmul.allow_tf32)
    run = common.BenchRun(common.results_path(args.out, "bench_llm_fusions.json"), "bench_llm_fusions/1", args.smoke,
                          env, dict(parts=args.parts, batch=args.batch, seq_len=args.seq_len, quick=args.quick,
                                    compile=not args.no_compile, budget_s=args.budget_s), args.budget_s)
    log, doc, deadline = run.log, run.doc, run.deadline
    failed = run.run_parts({part: (lambda checkpoint: bench_kernels(args, device, log, deadline)) if part == "kernels"
                            else functools.partial(bench_model, part, args, device, log, deadline)
                            for part in args.parts})
    print(run.environment_line())
    print(table(doc))
    checks = run.failed_checks(["kernels"])
    print(f"wrote {run.path}")
    return 1 if failed or checks else 0


if __name__ == "__main__":
    sys.exit(main())
