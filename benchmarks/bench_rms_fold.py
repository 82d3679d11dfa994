"""Benchmark the RMSNorm kernels against a copy, the residual's two homes, and the decoder with the γ fold.

::

    rmsnorm  Add+RMSNorm (sum kept / sum not written), RMSNorm, and the unit-γ variants the fold leaves
             (no weight load), bf16, at the zoo decoder's rows (16384 x 512) and Llama-3-8B's (4096, 8192,
             16384 x 4096): every launch setting of a small sweep (rows per program x num_warps) and the
             default, each as % of a device copy of the same bytes timed in the same rounds. Target: >= 93%.
    fold     the norm before a packed QKV (and gate/up) GEMM: RMSNorm(γ) then the GEMM on W against the
             unit-γ RMSNorm then the GEMM on W·diag(γ), at 8B shapes: what folding γ saves per norm.
    linres   the residual add after o_proj / down_proj, which two fusions want: cuBLAS + the fused
             Add+RMSNorm (the norm reads x and r) against the Triton GEMM with the residual in its epilogue
             + RMSNorm (the norm reads the sum), per shape (8B: M 4096..16384, K 4096 / 14336, N 4096; the
             zoo: M 16384, K 512 / 1376, N 512), a few GEMM tiles; the faster one per shape is the decision
             (``explorer.fusions.claims.RESIDUAL_EPILOGUE_WINS``).
    layer    the zoo's llama_decoder_8b_layers (2 layers at Llama-3-8B sizes) in bf16, batch x seq (default
             4 x 1024): the unfused graph, fused without the fold, fused with the fold, and fused with the
             fold and the residual in the o_proj/down_proj epilogue everywhere; median with p20/p80 of
             alternated rounds, GPU busy of one forward, error against float64.

Method: kernels through ``triton.testing.do_bench`` (CUDA events, L2 flushed, warm-up), ``--rounds``
interleaved rounds over the variants, inputs rotated over sets exceeding 4x the L2; bytes from an explicit
model (each input read once, each output written once); every variant checked against eager first. The
layer part times with ``explorer.runtime.measure`` as the runner does.

Usage::

    python3 benchmarks/bench_rms_fold.py                          # rmsnorm,fold,linres (~4 min on an H200)
    python3 benchmarks/bench_rms_fold.py --only layer             # the 8B-layer decoder (~3 min)
    python3 benchmarks/bench_rms_fold.py --only rmsnorm --smoke   # no GPU: tiny shapes, interpreted

Without CUDA (and without ``--smoke``) it measures nothing, says SKIPPED and exits 0. JSON goes to ``--out``
(default ``$OUT/bench_rms_fold.json``, else ``benchmarks/results/``), rewritten after each part.
"""

from __future__ import annotations

import argparse
import itertools
import math
import sys
import time
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks import _common as common  # noqa: E402  (after the root is on sys.path)

TARGET_FRACTION = 0.93
PARTS = ("rmsnorm", "fold", "linres", "layer")
DEFAULT_PARTS = ("rmsnorm", "fold", "linres")
#: (rows per program, num_warps) swept per row length (the default setting is always timed too).
SWEEP = {4096: ((1, 4), (1, 8), (1, 16), (2, 4), (2, 8), (2, 16), (4, 8), (4, 16)),
         512: ((1, 1), (1, 2), (2, 2), (2, 4), (4, 4), (4, 8), (8, 4), (8, 8), (16, 8))}
SMOKE_SWEEP = ((1, 1), (2, 2))
#: ``--quick``: a few settings beside the default (the ones the full sweep found best somewhere).
QUICK_SWEEP = {4096: ((1, 16), (2, 16), (4, 16)), 512: ((2, 2), (4, 4), (4, 8), (16, 8))}
GEMM_TILES = (None, (128, 256, 64, 8, 3), (128, 128, 64, 4, 4), (256, 128, 64, 8, 3), (128, 128, 64, 8, 4))


def _quantiles(times: list[float]) -> tuple[float, float, float]:
    """(median, 20th, 80th percentile) in ms."""
    import torch

    t = torch.tensor(times, dtype=torch.float64)
    q = torch.quantile(t, torch.tensor([0.5, 0.2, 0.8], dtype=torch.float64))
    return float(q[0]), float(q[1]), float(q[2])


def _cpu_bench(fn, warmup=0, rep=0, return_mode="all") -> list[float]:
    """The CPU stand-in for ``do_bench`` (smoke runs): three wall-clock times in ms."""
    out = []
    for _ in range(3):
        t0 = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t0) * 1e3)
    return out


def _timer(device: str):
    """``(do_bench, l2_bytes)`` for the device."""
    import torch

    if device == "cuda":
        from triton.testing import do_bench

        return do_bench, int(getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 0) or 60 * 2**20)
    return _cpu_bench, 64 * 1024


def _time_variants(variants: dict[str, tuple[Callable, list]], args, do_bench) -> dict[str, list[float]]:
    """Every variant ``name -> (fn, input sets)`` timed in ``args.rounds`` interleaved rounds; per-call ms."""
    times: dict[str, list[float]] = {k: [] for k in variants}
    for _ in range(args.rounds):
        for name, (fn, sets) in variants.items():
            cycle = itertools.cycle(sets)
            times[name] += do_bench(lambda: fn(*next(cycle)), warmup=args.warmup_ms, rep=args.rep_ms,
                                    return_mode="all")
    return times


def _sets(make: Callable[[], tuple], l2_bytes: int, rotate: float) -> list[tuple]:
    """Enough input sets of ``make()`` to exceed ``rotate`` L2s."""
    first = make()
    size = sum(t.numel() * t.element_size() for t in first)
    return [first] + [make() for _ in range(max(1, math.ceil(rotate * l2_bytes / max(size, 1))) - 1)]


def _copy_variant(nbytes: int, device: str, l2_bytes: int, rotate: float) -> tuple[Callable, list]:
    """A device-to-device copy moving ``nbytes`` (half read, half written), sources rotated."""
    import torch

    half = max(nbytes // 2, 1)
    dst = torch.empty(half, dtype=torch.uint8, device=device)
    srcs = [(torch.empty(half, dtype=torch.uint8, device=device),)
            for _ in range(max(2, math.ceil(rotate * l2_bytes / half)))]
    return (lambda src: dst.copy_(src)), srcs


def _close(got, want, tol) -> str:
    import torch

    got = [t for t in (got if isinstance(got, (tuple, list)) else (got,)) if t is not None]
    want = [t for t in (want if isinstance(want, (tuple, list)) else (want,)) if t is not None]
    try:
        for g, w in zip(got, want, strict=True):
            torch.testing.assert_close(g.float(), w.float(), **tol)
    except (AssertionError, ValueError) as err:
        return "mismatch: " + str(err).strip().splitlines()[0][:120]
    return "ok"


# ====================================================================== rmsnorm

def rms_cases(smoke: bool) -> list[tuple[int, int]]:
    """(rows, hidden) of the rmsnorm part."""
    return [(37, 96), (24, 512)] if smoke else [(16384, 512), (4096, 4096), (8192, 4096), (16384, 4096)]


def bench_rmsnorm(args, device: str, log) -> dict:
    """Every (add +) RMSNorm variant at every shape and swept launch setting, as % of a copy."""
    import torch

    from explorer.fusions import rms_norm as rn

    do_bench, l2 = _timer(device)
    dt = torch.float32 if args.smoke else torch.bfloat16
    e = dt.itemsize if hasattr(dt, "itemsize") else torch.empty((), dtype=dt).element_size()
    rows_out = []
    best: dict[str, dict] = {}
    for m, n in rms_cases(args.smoke):
        def make(m=m, n=n):
            return (torch.randn(m, n, device=device, dtype=dt), torch.randn(m, n, device=device, dtype=dt),
                    (torch.randn(n, device=device) * 0.1 + 1).to(dt))
        sets = _sets(make, l2, args.rotate_l2)
        kinds = {   # name -> (fn(x, r, w, rows, warps), reference(x, r, w), bytes, (residual, weight, sum written))
            "add_rms_norm": (lambda x, r, w, R, W: rn.add_rms_norm(x, r, w, 1e-6, rows_per_prog=R, num_warps=W),
                             lambda x, r, w: rn.add_rms_norm_reference(x, r, w, 1e-6), 4 * m * n * e + n * e,
                             (True, True, True)),
            "add_rms_norm_nosum": (lambda x, r, w, R, W: rn.add_rms_norm(x, r, w, 1e-6, False, rows_per_prog=R,
                                                                         num_warps=W)[1],
                                   lambda x, r, w: rn.add_rms_norm_reference(x, r, w, 1e-6)[1],
                                   3 * m * n * e + n * e, (True, True, False)),
            "add_rms_norm_unit": (lambda x, r, w, R, W: rn.add_rms_norm(x, r, None, 1e-6, rows_per_prog=R,
                                                                        num_warps=W),
                                  lambda x, r, w: rn.add_rms_norm_reference(x, r, None, 1e-6), 4 * m * n * e,
                                  (True, False, True)),
            "add_rms_norm_unit_nosum": (lambda x, r, w, R, W: rn.add_rms_norm(x, r, None, 1e-6, False,
                                                                              rows_per_prog=R, num_warps=W)[1],
                                        lambda x, r, w: rn.add_rms_norm_reference(x, r, None, 1e-6)[1],
                                        3 * m * n * e, (True, False, False)),
            "rms_norm": (lambda x, r, w, R, W: rn.rms_norm(x, w, 1e-6, rows_per_prog=R, num_warps=W),
                         lambda x, r, w: rn.rms_norm_reference(x, w, 1e-6), 2 * m * n * e + n * e,
                         (False, True, False)),
            "rms_norm_unit": (lambda x, r, w, R, W: rn.rms_norm(x, None, 1e-6, rows_per_prog=R, num_warps=W),
                              lambda x, r, w: rn.rms_norm_reference(x, None, 1e-6), 2 * m * n * e,
                              (False, False, False)),
        }
        settings = SMOKE_SWEEP if args.smoke else (QUICK_SWEEP if args.quick else SWEEP).get(n, SWEEP[4096])
        for kind, (fn, ref, nbytes, (has_r, has_w, writes)) in kinds.items():
            block, d_rows, d_warps = rn.launch_config(n, e, has_r, has_w, writes)
            configs = {f"default[rows={d_rows},w={d_warps}]": (None, None)}
            configs.update({f"rows={r},w={w}": (r, w) for r, w in settings if (r, w) != (d_rows, d_warps)})
            variants: dict[str, tuple[Callable, list]] = {"copy": _copy_variant(nbytes, device, l2, args.rotate_l2)}
            checks = {"copy": "n/a"}
            want = ref(*sets[0])
            for label, (r, w) in configs.items():
                f = (lambda x, res, wt, fn=fn, r=r, w=w: fn(x, res, wt, r, w))
                checks[label] = _close(f(*sets[0]), want, rn.EAGER_TOLERANCES[dt])
                variants[label] = (f, sets)
            times = _time_variants(variants, args, do_bench)
            copy_ms = _quantiles(times["copy"])[0]
            case = f"{kind} {m}x{n} {str(dt).replace('torch.', '')}"
            for label in variants:
                p50, p20, p80 = _quantiles(times[label])
                rows_out.append(dict(case=case, kind=kind, m=m, n=n, variant=label, bytes=nbytes, ms_p50=p50,
                                     ms_p20=p20, ms_p80=p80, gbps=nbytes / (p50 * 1e-3) / 1e9,
                                     fraction_of_copy=copy_ms / p50, check=checks[label],
                                     samples=len(times[label])))
            fused = [r for r in rows_out if r["case"] == case and r["variant"] != "copy" and r["check"] == "ok"]
            top = min(fused, key=lambda r: r["ms_p50"]) if fused else None
            if top:
                best[case] = dict(variant=top["variant"], fraction_of_copy=top["fraction_of_copy"],
                                  default=next(r["fraction_of_copy"] for r in fused
                                               if r["variant"].startswith("default")),
                                  meets_target=top["fraction_of_copy"] >= TARGET_FRACTION, block=block,
                                  element_size=e, residual=has_r, weight=has_w, sum_written=writes)
                log(f"[rmsnorm] {case}: best {top['variant']} {top['fraction_of_copy']:.1%} of copy "
                    f"(default {best[case]['default']:.1%})")
        del sets
        if device == "cuda":
            torch.cuda.empty_cache()
    return dict(rows=rows_out, best=best, target=TARGET_FRACTION,
                byte_model="each input read once + each output written once; the copy moves the same bytes")


# ====================================================================== fold

def bench_fold(args, device: str, log) -> dict:
    """RMSNorm(γ) + GEMM(W) against unit RMSNorm + GEMM(W·diag γ) (packed QKV, packed gate/up), per shape."""
    import torch
    import torch.nn.functional as F

    from explorer.fusions import rms_norm as rn

    do_bench, l2 = _timer(device)
    dt = torch.float32 if args.smoke else torch.bfloat16
    shapes = [(16, 96, 160)] if args.smoke else [(m, 4096, o) for m in (4096, 16384) for o in (6144, 28672)]
    rows = []
    for m, n, out in shapes:
        w = torch.randn(out, n, device=device, dtype=dt) / math.sqrt(n)
        g = (torch.randn(n, device=device) * 0.1 + 1).to(dt)
        wf = (w.double() * g.double()).to(dt)

        def make(m=m, n=n):
            return (torch.randn(m, n, device=device, dtype=dt),)
        sets = _sets(make, l2, 1.0)
        variants = {
            "norm_gamma+gemm": (lambda x, w=w, g=g: F.linear(rn.rms_norm(x, g, 1e-6), w), sets),
            "norm_unit+gemm_folded": (lambda x, wf=wf: F.linear(rn.rms_norm(x, None, 1e-6), wf), sets),
            "norm_gamma": (lambda x, g=g: rn.rms_norm(x, g, 1e-6), sets),
            "norm_unit": (lambda x: rn.rms_norm(x, None, 1e-6), sets),
        }
        ref = F.linear(rn.rms_norm_reference(sets[0][0].double(), g.double(), 1e-6), w.double())
        errs = {k: float(((variants[k][0](*sets[0]).double() - ref).norm() / ref.norm()).item())
                for k in ("norm_gamma+gemm", "norm_unit+gemm_folded")}
        times = _time_variants(variants, args, do_bench)
        for k in variants:
            p50, p20, p80 = _quantiles(times[k])
            rows.append(dict(case=f"{m}x{n} -> {out}", variant=k, ms_p50=p50, ms_p20=p20, ms_p80=p80,
                             rel_l2_vs_fp64=errs.get(k)))
        log(f"[fold] {m}x{n}->{out}: " + ", ".join(f"{r['variant']} {r['ms_p50'] * 1e3:.1f} us" for r in rows[-4:]))
    return dict(rows=rows)


# ====================================================================== linres

def linres_shapes(smoke: bool) -> list[tuple[str, int, int, int]]:
    """(what, M, K, N) of the residual projections."""
    if smoke:
        return [("tiny", 24, 40, 96)]
    return ([(f"8b o_proj", m, 4096, 4096) for m in (4096, 8192, 16384)]
            + [(f"8b down_proj", m, 14336, 4096) for m in (4096, 8192, 16384)]
            + [("zoo o_proj", 16384, 512, 512), ("zoo down_proj", 16384, 1376, 512)])


def bench_linres(args, device: str, log) -> dict:
    """Per shape: cuBLAS + fused Add+RMSNorm against the Triton GEMM with the residual + RMSNorm."""
    import torch
    import torch.nn.functional as F

    from explorer.fusions import rms_norm as rn
    from explorer.fusions.kernels.gemm import gemm_epilogue

    do_bench, l2 = _timer(device)
    dt = torch.float32 if args.smoke else torch.bfloat16
    rows, decisions = [], []
    for what, m, k, n in linres_shapes(args.smoke):
        w = torch.randn(n, k, device=device, dtype=dt) / math.sqrt(k)
        g = (torch.randn(n, device=device) * 0.1 + 1).to(dt)

        def make(m=m, k=k, n=n):
            return (torch.randn(m, k, device=device, dtype=dt), torch.randn(m, n, device=device, dtype=dt))
        sets = _sets(make, l2, 1.0)
        variants: dict[str, tuple[Callable, list]] = {
            "cublas+add_rms_norm": (lambda h, r, w=w, g=g: rn.add_rms_norm(F.linear(h, w), r, g, 1e-6), sets),
            "cublas": (lambda h, r, w=w: F.linear(h, w), sets),
            "add_rms_norm": (lambda h, r, w=w, g=g, n=n: rn.add_rms_norm(r, r, g, 1e-6), sets),
            "rms_norm": (lambda h, r, g=g: rn.rms_norm(r, g, 1e-6), sets),
        }
        for tiles in GEMM_TILES if not args.smoke else (None,):
            tag = "default" if tiles is None else "x".join(map(str, tiles))
            variants[f"gemm_epilogue[{tag}]+rms_norm"] = (
                lambda h, r, w=w, g=g, t=tiles: rn.rms_norm(gemm_epilogue(h, w, None, r, tiles=t), g, 1e-6), sets)
            variants[f"gemm_epilogue[{tag}]"] = (lambda h, r, w=w, t=tiles: gemm_epilogue(h, w, None, r, tiles=t),
                                                 sets)
        h0, r0 = sets[0]
        ref = rn.add_rms_norm_reference(F.linear(h0.double(), w.double()), r0.double(), g.double(), 1e-6)
        checks = {}
        for name in list(variants):
            if "+" not in name:
                continue
            try:
                got = variants[name][0](h0, r0)
                got = got[1] if isinstance(got, tuple) else got
                err = float(((got.double() - ref[1]).norm() / ref[1].norm()).item())
                checks[name] = f"rel_l2 {err:.2e}" if err < 3e-2 else f"mismatch: rel_l2 {err:.2e}"
            except Exception as exc:  # a tile that does not compile (shared memory) is a result
                checks[name] = f"failed: {type(exc).__name__}: {str(exc)[:100]}"
                variants.pop(name)
                variants.pop(name.replace("+rms_norm", ""), None)
        times = _time_variants(variants, args, do_bench)
        here = {}
        for name in variants:
            p50, p20, p80 = _quantiles(times[name])
            here[name] = p50
            rows.append(dict(case=f"{what} M{m} K{k} N{n}", what=what, m=m, k=k, n=n, variant=name, ms_p50=p50,
                             ms_p20=p20, ms_p80=p80, check=checks.get(name, "")))
        epi = {k_: v for k_, v in here.items() if k_.startswith("gemm_epilogue[") and k_.endswith("+rms_norm")
               and checks.get(k_, "").startswith("rel_l2")}
        best_epi = min(epi, key=epi.get) if epi else None
        norm_ms = here["cublas+add_rms_norm"]
        decisions.append(dict(what=what, m=m, k=k, n=n, cublas_add_rms_norm_ms=norm_ms, best_epilogue=best_epi,
                              best_epilogue_ms=epi.get(best_epi), epilogue_wins=bool(best_epi and
                                                                                      epi[best_epi] < norm_ms)))
        log(f"[linres] {what} M{m} K{k} N{n}: cuBLAS+Add+RMSNorm {norm_ms * 1e3:.1f} us, "
            f"best epilogue {best_epi} {epi.get(best_epi, float('nan')) * 1e3:.1f} us")
        del sets
        if device == "cuda":
            torch.cuda.empty_cache()
    return dict(rows=rows, decisions=decisions)


# ====================================================================== layer

def bench_layer(args, device: str, log) -> dict:
    """The 8B-layer decoder fused without the fold, with it, and with it and the epilogue residual."""
    import torch

    from explorer import fusions
    from explorer.fusion_engine import analyze, detect
    from explorer.fusions import claims
    from explorer.fusions.plan import make_plan
    from explorer.fusions.rewrite import apply_plan
    from explorer.runtime import measure

    dtype = torch.float32 if args.smoke else torch.bfloat16
    name = "llama_decoder" if args.smoke else "llama_decoder_8b_layers"
    batch, seq = (1, 16) if args.smoke else (args.batch, args.seq_len)
    log(f"[layer] {name} {batch}x{seq}: load and detect")
    analysis = analyze(name, batch, seq)
    model, graph = analysis.model, analysis.graph
    fold_names = {p.name for p in fusions.PATTERNS if p.name.endswith("rms_fold")}
    x = measure.prepare_inputs(model.example_inputs, device, dtype)
    ref_gm = measure.prepare_graph(model.gm, device, torch.float64)
    with torch.inference_mode():
        ref = ref_gm(*measure.prepare_inputs(model.example_inputs, device, torch.float64)).detach().cpu()
    del ref_gm
    plans = {"no_fold": ([p for p in fusions.PATTERNS if p.name not in fold_names], "measured"),
             "fold": (list(fusions.PATTERNS), "measured"),
             "fold+epilogue_residual": (list(fusions.PATTERNS), "epilogue")}
    variants: dict[str, Callable[[], Any]] = {}
    graph_gm = measure.prepare_graph(model.gm, device, dtype)
    variants["graph"] = lambda: graph_gm(*x)
    counts, keep = {}, []
    for label, (patterns, owner) in plans.items():
        before = claims.RESIDUAL_OWNER
        claims.RESIDUAL_OWNER = owner
        try:
            det = detect(graph, patterns)
        finally:
            claims.RESIDUAL_OWNER = before
        fused = apply_plan(model.gm, det, make_plan(det, "all"), device)
        counts[label] = dict(chains=dict((k, v) for k, v in det.counts.items() if v),
                             failed=[(a.chain_id, a.reason) for a in fused.applied if a.status != "fused"])
        fgm = measure.prepare_graph(fused.gm, device, dtype)
        keep.append(fgm)
        variants[label] = (lambda fgm=fgm: fgm(*x))
        del fused
    if device == "cuda":
        torch.cuda.empty_cache()
    out = common.session(variants, ref, device, args.smoke, lambda msg: log(f"[layer] {msg}"), "layer",
                         lambda fn, dev: common.profile_forward(fn, dev, top=12, cpu_ops=False))
    for v in out.values():
        v.pop("samples_ms", None)
    return dict(model=name, batch=batch, seq_len=seq, dtype=str(dtype).replace("torch.", ""), detection=counts,
                variants=out)


# ====================================================================== main

def parse_args(argv=None) -> argparse.Namespace:
    """Command-line options."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--only", default=",".join(DEFAULT_PARTS), help=f"comma-separated parts: {', '.join(PARTS)}")
    p.add_argument("--rounds", type=int, default=2, help="interleaved rounds over the variants")
    p.add_argument("--warmup-ms", type=int, default=20)
    p.add_argument("--rep-ms", type=int, default=60)
    p.add_argument("--rotate-l2", type=float, default=4.0, help="kernel inputs rotate over this many L2s")
    p.add_argument("--batch", type=int, default=4, help="layer part: batch")
    p.add_argument("--seq-len", type=int, default=1024, help="layer part: prompt length")
    p.add_argument("--quick", action="store_true", help="rmsnorm part: the default and a few settings only")
    p.add_argument("--smoke", action="store_true", help="the CPU at tiny sizes (TRITON_INTERPRET=1): the plumbing")
    p.add_argument("--budget-s", type=float, default=540.0, help="no part starts after this many seconds")
    p.add_argument("--out", default=None, help="JSON path (default $OUT/bench_rms_fold.json)")
    args = p.parse_args(argv)
    args.parts = [s.strip() for s in args.only.split(",") if s.strip()]
    unknown = [s for s in args.parts if s not in PARTS]
    if unknown:
        p.error(f"unknown part(s) {', '.join(unknown)}: choose from {', '.join(PARTS)}")
    if args.smoke:
        args.rounds, args.rotate_l2 = 1, 1.0
    return args


def table(doc: dict) -> str:
    """The short table printed last: per rmsnorm case the best setting and the default, linres decisions."""
    lines = []
    for case, b in (doc.get("rmsnorm") or {}).get("best", {}).items():
        lines.append(f"{case:40s} best {b['variant']:24s} {b['fraction_of_copy']:6.1%} of copy "
                     f"(default {b['default']:6.1%}){'' if b['meets_target'] else '  < target'}")
    for d in (doc.get("linres") or {}).get("decisions", []):
        lines.append(f"{d['what']:14s} M{d['m']:<6d} K{d['k']:<6d} N{d['n']:<5d} cuBLAS+Add+RMSNorm "
                     f"{d['cublas_add_rms_norm_ms'] * 1e3:8.1f} us | {d['best_epilogue']} "
                     f"{(d['best_epilogue_ms'] or float('nan')) * 1e3:8.1f} us -> "
                     f"{'epilogue' if d['epilogue_wins'] else 'Add+RMSNorm'}")
    for label, v in ((doc.get("layer") or {}).get("variants") or {}).items():
        lat = v["latency_ms"]
        lines.append(f"layer {label:26s} {lat.get('median', float('nan')):8.3f} ms  busy {v['gpu_busy_ms']}")
    return "\n".join(lines)


def main(argv=None) -> int:
    """Run the parts; exit status 0 also when skipped without CUDA."""
    args = parse_args(argv)
    device = common.bench_device("bench_rms_fold.py", args.smoke)
    if device is None:
        return 0
    from explorer.runtime import measure

    run = common.BenchRun(common.results_path(args.out, "bench_rms_fold.json"), "bench_rms_fold/1", args.smoke,
                          measure.environment(device), dict(parts=args.parts, rounds=args.rounds,
                                                            warmup_ms=args.warmup_ms, rep_ms=args.rep_ms,
                                                            rotate_l2=args.rotate_l2), args.budget_s)
    fns = {"rmsnorm": bench_rmsnorm, "fold": bench_fold, "linres": bench_linres, "layer": bench_layer}
    failed = run.run_parts({p: (lambda checkpoint, p=p: fns[p](args, device, run.log)) for p in args.parts})
    print(run.environment_line())
    print(table(run.doc))
    print(f"wrote {run.path}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
