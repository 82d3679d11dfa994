"""The LLM path's memory-bound kernels against a device copy of the same bytes, at the zoo's and Llama-3-8B's shapes.

Issue 22's target: Add+RMSNorm (each variant the runner uses), Add+LayerNorm, the SwiGLU pass (packed and split
inputs) and rotary (standalone and on the QKV GEMM's column views, head dims 64 and 128) at >= 93% of a device
copy of the same number of bytes timed in the same rounds, in bf16 and fp16::

    shape                      rows x hidden       heads (q/kv) x head dim   MLP
    zoo llama_decoder          16 x 1024 x 512     8 / 2 x 64                1376
    llama_decoder_8b_layers    4 x 1024 x 4096     32 / 8 x 128              14336
    GPT-2-medium (LayerNorm)   4096 x 1024
    BERT-base (LayerNorm)      4096 x 768

Parts (``--only``): ``rmsnorm`` (Add+RMSNorm with the sum written / not written, without γ (the fold's) with and
without the sum, RMSNorm with and without γ), ``layernorm`` (Add+LayerNorm, sum written / not), ``swiglu``
(``silu_mul`` on two contiguous GEMM outputs, ``silu_mul_packed`` on one packed gate/up output), ``rotary``
(q, k as transposed (B, S, H, D) projections; q, k as column views of the siblings' one QKV output).

Per case: the copy, the kernel with its default launch setting (what the runner launches), eager, and
torch.compile default of the reference function (inductor) on the same inputs; with ``--sweep`` also every
launch setting of a small per-kernel grid (rows per program and num_warps for the norms; BLOCK_M, BLOCK_N,
num_warps, the flat or tiled walk (``flat=``) and the cache hints (``hints=``) for SwiGLU; tokens and heads per
program, num_warps and the cos/sin layout (``table_tile=``) for rotary), the best one named with its % of copy.
None of these kernels loops, so there is no num_stages to sweep. Every case also times the setting it had before
this tuning (``PREVIOUS``) where that differs from the launched one. Bytes: what the kernel must read + write
(each input once, each output once; γ/β and cos/sin included).

Method (``bench_llm_fusions.run_case``): every variant checked against eager first (tolerances per dtype), then
``--rounds`` interleaved rounds of ``triton.testing.do_bench`` (CUDA events, L2 flushed, warm-up), inputs rotated
over sets exceeding ``--rotate-l2`` L2s; median with p20/p80. No case starts after ``--budget-s``; the JSON
(rewritten after every case) lists what was skipped.

Usage::

    python3 benchmarks/bench_membw.py --sweep --budget-s 240     # the sweep (bf16) and fp16 at the launched
                                                                 # settings: ~3-4 min on an H200 (estimated:
                                                                 # ~170 Triton compiles, 24 inductor compiles)
    python3 benchmarks/bench_membw.py --verify --budget-s 240    # once the winners are baked in: launched vs
                                                                 # previous settings, both dtypes, inductor
    python3 benchmarks/bench_membw.py --verify --only rmsnorm,swiglu,rotary --budget-s 100 --cases \
        'silu_mul,add_rms_norm 8B,add_rms_norm_nosum 8B,add_rms_norm_unit 8B,add_rms_norm_unit_nosum 8B,rotary zoo'
                                   # LEAN_VERIFY: only the cases whose setting changed (with PREVIOUS) or that have
                                   # CANDIDATES, and the zoo rotary; ~60-100 s (rmsnorm first: the candidates)
    python3 benchmarks/bench_membw.py --verify --only rmsnorm,swiglu --budget-s 90 --cases \
        'add_rms_norm 8B,add_rms_norm_nosum 8B,add_rms_norm_unit 8B,add_rms_norm_unit_nosum 8B,silu_mul 8B'
                                   # HINTS_VERIFY: the baked Add+RMSNorm cache hints against evict-first, + a control
    python3 benchmarks/bench_membw.py --smoke --only rmsnorm     # CPU plumbing: tiny shapes, interpreted
    python3 benchmarks/bench_membw.py --table RESULT.json        # the README table of a result
    python3 benchmarks/bench_membw.py --table SWEEP.json,VERIFY.json  # the verify's cases over the sweep's; any number
                                                                      # of files, the later ones winning
    python3 benchmarks/bench_membw.py --propose RESULT.json      # what to bake: winners beyond the spread

Without CUDA (and without ``--smoke``) it measures nothing, says SKIPPED and exits 0. JSON: ``--out``, else
``$OUT/bench_membw.json``, else ``benchmarks/results/``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks import _common as common  # noqa: E402  (after the root is on sys.path)
from benchmarks.bench_llm_fusions import Case, cpu_do_bench, run_case  # noqa: E402

TARGET_FRACTION = 0.93
PARTS = ("rotary", "swiglu", "layernorm", "rmsnorm")     # the least measured first: a budget cut takes the last
#: (name, batch, seq, hidden, q heads, kv heads, head dim, intermediate)
DECODERS = (("zoo", 16, 1024, 512, 8, 2, 64, 1376),
            ("8B", 4, 1024, 4096, 32, 8, 128, 14336))
SMOKE_DECODERS = (("smoke", 2, 5, 96, 3, 1, 16, 40),)
#: (name, rows, hidden) of the Add+LayerNorm cases.
LAYERNORMS = (("gpt2-medium", 4096, 1024), ("bert-base", 4096, 768))
SMOKE_LAYERNORMS = (("smoke", 7, 96),)

#: Launch settings swept (the default is always timed too), per kernel; keys are the row length where it matters.
RMS_SWEEP = {512: ((1, 2), (2, 2), (2, 4), (4, 4), (4, 8), (8, 8)),
             4096: ((1, 8), (1, 16), (2, 16), (4, 16))}
LN_SWEEP = ((1, 2), (1, 4), (1, 8), (2, 4), (2, 8), (4, 4), (4, 8), (8, 8))
#: (BLOCK_M, BLOCK_N, num_warps); contiguous gate/up are one long row (BLOCK_M 1).
SPLIT_SWEEP = ((1, 1024, 4), (1, 2048, 4), (1, 2048, 8), (1, 4096, 4), (1, 4096, 16), (1, 8192, 8), (1, 8192, 16))
#: Packed: also each tile walked flat (``swiglu.flat_rule``'s two layouts), the default tile included.
PACKED_SWEEP = ((4, 1024, 8), (1, 1024, 4), (2, 1024, 4), (2, 1024, 8), (8, 1024, 8), (8, 1024, 16), (4, 512, 4),
                (8, 512, 8), (2, 2048, 8), (16, 256, 8))
#: SwiGLU's cache hints (``swiglu.HINTS``): 0 inputs evict-first, 1 none, 2 evict-first + streaming store.
HINT_SWEEP = (0, 1, 2)
#: (tokens per (Q, K) program, heads per (Q, K) program or None, num_warps)
ROTARY_SWEEP = (((4, 16), None, 4), ((2, 8), None, 4), ((1, 2), None, 4), ((1, 1), None, 4), ((1, 4), None, 4),
                ((2, 8), None, 8), ((1, 2), (16, 8), 4), ((2, 4), (8, 8), 4))
SMOKE_SWEEP = 2          # a smoke run times the first two settings of each grid

#: The launch settings each kernel had before this tuning (commit d2d49e0), per (kernel, shape): ``--verify`` times
#: them beside the current defaults in the same rounds, so a change is measured against what it replaced.
PREVIOUS = {
    **{(k, "zoo"): dict(rows=2, warps=2) for k in ("add_rms_norm", "add_rms_norm_nosum", "add_rms_norm_unit",
                                                 "add_rms_norm_unit_nosum", "rms_norm")},
    ("rms_norm_unit", "zoo"): dict(rows=4, warps=4),
    # the four Add+RMSNorm variants at 8B: evict-first at the rows launched when the first verify ran (its hints are
    # the change being timed; the unit variant's 4 rows a program before the sweep are in bench_membw_verify_h200.json)
    **{(k, "8B"): dict(rows=r, warps=16, hints=0) for k, r in (("add_rms_norm", 4), ("add_rms_norm_nosum", 1),
                                                               ("add_rms_norm_unit", 2), ("add_rms_norm_unit_nosum", 1))},
    **{(k, "8B"): dict(rows=r, warps=16) for k, r in (("rms_norm", 2), ("rms_norm_unit", 4))},
    **{(k, ln): dict(rows=1, warps=4) for k in ("add_layer_norm", "add_layer_norm_nosum")
       for ln in ("gpt2-medium", "bert-base")},
    **{("silu_mul", d): dict(block_m=1, block_n=4096, warps=8, flat=None, hints=0) for d in ("zoo", "8B")},
    **{("silu_mul_packed", d): dict(block_m=4, block_n=1024, warps=8, flat=False, hints=0) for d in ("zoo", "8B")},
    **{(k, "zoo"): dict(tokens=(4, 16), heads=(8, 2), warps=4, table_tile=False) for k in ("rotary", "rotary_qkv_views")},
    **{(k, "8B"): dict(tokens=(1, 2), heads=(16, 8), warps=4, table_tile=False) for k in ("rotary", "rotary_qkv_views")},
}


def _add_previous(kind: str, shape: str, default: dict, sweep: dict, settings: dict, make) -> str | None:
    """Add the pre-tuning setting of ``(kind, shape)`` to a case's sweep as ``previous[...]`` (``make(settings)`` the
    call) unless it is the default; returns its label, or None."""
    prev = PREVIOUS.get((kind, shape))
    if prev is None or all(default.get(k) == v for k, v in prev.items()):
        return None
    label = "previous" + _label(**prev)[3:]
    sweep[label], settings[label] = make(prev), prev
    return label


#: Settings not swept before that ``--verify`` times beside the launched one and ``PREVIOUS`` (and ``--sweep``
#: with the grid), per (kernel, shape). The 8B Add+RMSNorm variants: the first verify
#: (``bench_membw_verify_h200.json``) timed x and the residual loaded without hints (``rms_norm.HINTS`` 1) for all
#: four and evict-last (2) for the one whose sum is not written; the second (``bench_membw_verify2_h200.json``)
#: timed 1 as launched and 2 for the other three. Evict-last won everywhere and is launched now (``rms_norm.TUNED``);
#: no hints stays a candidate, beside evict-first (``PREVIOUS``).
CANDIDATES = {(k, "8B"): (dict(rows=r, warps=16, hints=1),)
              for k, r in (("add_rms_norm", 4), ("add_rms_norm_nosum", 1), ("add_rms_norm_unit", 2),
                           ("add_rms_norm_unit_nosum", 1))}


#: ``--cases`` of the lean verify call (``LEAN_VERIFY``): every case whose launched setting changed with the sweep (so
#: ``PREVIOUS`` is timed beside it), every case with ``CANDIDATES``, and the zoo rotary (92.9% in fp16 in the sweep,
#: inside its spread), in both dtypes; ``tests/test_kernel_layouts.py`` checks it selects exactly those.
LEAN_VERIFY_CASES = ("silu_mul,add_rms_norm 8B,add_rms_norm_nosum 8B,add_rms_norm_unit 8B,add_rms_norm_unit_nosum 8B,"
                     "rotary zoo")
#: The H200 call after a sweep's winners are baked in (about 60-100 s: 18 cases, 5-8 variants each, 3 rounds).
LEAN_VERIFY = ("python3 benchmarks/bench_membw.py --verify --only rmsnorm,swiglu,rotary "
               f"--cases '{LEAN_VERIFY_CASES}' --budget-s 100")
#: The H200 call that re-times the cache hints baked into ``rms_norm.TUNED``: the four 8B Add+RMSNorm variants
#: (the hints launched, evict-first as ``PREVIOUS``, the other hint as ``CANDIDATES``) and the 8B split SwiGLU pass
#: as an unchanged control, both dtypes, inductor in both (10 cases, 33 s on the H200 in verify 2).
HINTS_VERIFY_CASES = "add_rms_norm 8B,add_rms_norm_nosum 8B,add_rms_norm_unit 8B,add_rms_norm_unit_nosum 8B,silu_mul 8B"
HINTS_VERIFY = ("python3 benchmarks/bench_membw.py --verify --only rmsnorm,swiglu "
                f"--cases '{HINTS_VERIFY_CASES}' --budget-s 90")


def _add_candidates(kind: str, shape: str, sweep: dict, settings: dict, make) -> list[str]:
    """Add ``CANDIDATES`` of ``(kind, shape)`` to a case's sweep as ``candidate[...]``; returns their labels."""
    labels = []
    for cand in CANDIDATES.get((kind, shape), ()):
        label = "candidate" + _label(**cand)[3:]
        sweep[label], settings[label] = make(cand), cand
        labels.append(label)
    return labels


def _dt(name: str):
    import torch

    return {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[name]


def _label(**knobs) -> str:
    return "cfg[" + ",".join(f"{k}={v}" for k, v in knobs.items()) + "]"


def _knobs(label: str) -> str:
    """``rows=2,warps=16`` of ``cfg[rows=2,warps=16]``; ``previous``/``candidate`` labels keep their word."""
    head, _, rest = label.partition("[")
    return rest[:-1] if head == "cfg" else f"{head}: {rest[:-1]}"


def _grid(grid, smoke: bool):
    return tuple(grid)[:SMOKE_SWEEP] if smoke else tuple(grid)


# ====================================================================== cases (case, meta)

def rms_cases(dev: str, dt, smoke: bool) -> list[tuple[Case, dict]]:
    """The six (add +) RMSNorm variants the runner launches, at each decoder's rows."""
    import torch

    from explorer.fusions import rms_norm as rn

    e = torch.empty((), dtype=dt).element_size()
    out = []
    for name, b, s, n, *_ in (SMOKE_DECODERS if smoke else DECODERS):
        m = b * s

        def make(m=m, n=n):
            return (torch.randn(m, n, device=dev, dtype=dt), torch.randn(m, n, device=dev, dtype=dt),
                    (torch.randn(n, device=dev) * 0.1 + 1).to(dt))
        # kind -> (call(x, r, w, rows, warps, hints), reference(x, r, w), bytes, (residual, weight, sum written))
        kinds = {
            "add_rms_norm": (lambda x, r, w, R=None, W=None, H=None: rn.add_rms_norm(
                                 x, r, w, 1e-6, rows_per_prog=R, num_warps=W, hints=H),
                             lambda x, r, w: rn.add_rms_norm_reference(x, r, w, 1e-6), 4 * m * n * e + n * e,
                             (True, True, True)),
            "add_rms_norm_nosum": (lambda x, r, w, R=None, W=None, H=None: rn.add_rms_norm(
                                       x, r, w, 1e-6, False, rows_per_prog=R, num_warps=W, hints=H)[1],
                                   lambda x, r, w: rn.add_rms_norm_reference(x, r, w, 1e-6)[1],
                                   3 * m * n * e + n * e, (True, True, False)),
            "add_rms_norm_unit": (lambda x, r, w, R=None, W=None, H=None: rn.add_rms_norm(
                                      x, r, None, 1e-6, rows_per_prog=R, num_warps=W, hints=H),
                                  lambda x, r, w: rn.add_rms_norm_reference(x, r, None, 1e-6), 4 * m * n * e,
                                  (True, False, True)),
            "add_rms_norm_unit_nosum": (lambda x, r, w, R=None, W=None, H=None: rn.add_rms_norm(
                                            x, r, None, 1e-6, False, rows_per_prog=R, num_warps=W, hints=H)[1],
                                        lambda x, r, w: rn.add_rms_norm_reference(x, r, None, 1e-6)[1],
                                        3 * m * n * e, (True, False, False)),
            "rms_norm": (lambda x, r, w, R=None, W=None, H=None: rn.rms_norm(x, w, 1e-6, rows_per_prog=R,
                                                                             num_warps=W, hints=H),
                         lambda x, r, w: rn.rms_norm_reference(x, w, 1e-6), 2 * m * n * e + n * e,
                         (False, True, False)),
            "rms_norm_unit": (lambda x, r, w, R=None, W=None, H=None: rn.rms_norm(x, None, 1e-6, rows_per_prog=R,
                                                                                  num_warps=W, hints=H),
                              lambda x, r, w: rn.rms_norm_reference(x, None, 1e-6), 2 * m * n * e,
                              (False, False, False)),
        }
        grid = _grid(RMS_SWEEP.get(n, RMS_SWEEP[4096]), smoke)
        for kind, (fn, ref, nbytes, variant) in kinds.items():
            _, d_rows, d_warps, d_hints = rn.launch_setting(n, e, *variant)
            sweep, settings = {}, {}
            for r, w in grid:
                if (r, w) == (d_rows, d_warps):
                    continue
                label = _label(rows=r, warps=w)
                sweep[label] = (lambda x, res, wt, fn=fn, r=r, w=w: fn(x, res, wt, r, w))
                settings[label] = dict(rows=r, warps=w)
            default = dict(rows=d_rows, warps=d_warps, hints=d_hints)

            def make_setting(p, fn=fn):
                return lambda x, res, wt: fn(x, res, wt, p["rows"], p["warps"], p.get("hints"))
            previous = _add_previous(kind, name, default, sweep, settings, make_setting)
            candidates = _add_candidates(kind, name, sweep, settings, make_setting)
            case = Case(f"{kind} {name} {m}x{n} {_short(dt)}", kind, nbytes, make, fn, ref, rn.EAGER_TOLERANCES,
                        dt, "", sweep)
            out.append((case, dict(family="rmsnorm", shape=name, m=m, n=n, variant=kind,
                                   default=default, settings=settings, previous=previous,
                                   candidates=candidates)))
    return out


def layernorm_cases(dev: str, dt, smoke: bool) -> list[tuple[Case, dict]]:
    """Add+LayerNorm (sum written / not written) at GPT-2-medium's and BERT-base's rows."""
    import torch

    from explorer.fusions import norm

    e = torch.empty((), dtype=dt).element_size()
    out = []
    for name, m, n in (SMOKE_LAYERNORMS if smoke else LAYERNORMS):
        def make(m=m, n=n):
            return (torch.randn(m, n, device=dev, dtype=dt), torch.randn(m, n, device=dev, dtype=dt),
                    (torch.randn(n, device=dev) * 0.1 + 1).to(dt), (torch.randn(n, device=dev) * 0.1).to(dt))
        for keep in (True, False):
            def fn(x, r, w, b, R=None, W=None, keep=keep):
                got = norm.add_layernorm(x, r, w, b, 1e-5, num_warps=W, rows_per_prog=R, keep_sum=keep)
                return got if keep else got[1]

            def ref(x, r, w, b, keep=keep):
                got = norm.add_layernorm_reference(x, r, w, b, 1e-5)
                return got if keep else got[1]
            nbytes = (4 if keep else 3) * m * n * e + 2 * n * e
            d_rows, d_warps = norm.launch_rows(n, e, keep)
            sweep, settings = {}, {}
            for r, w in _grid(LN_SWEEP, smoke):
                if (r, w) == (d_rows, d_warps):
                    continue
                label = _label(rows=r, warps=w)
                sweep[label] = (lambda x, res, wt, bs, fn=fn, r=r, w=w: fn(x, res, wt, bs, r, w))
                settings[label] = dict(rows=r, warps=w)
            kind = "add_layer_norm" if keep else "add_layer_norm_nosum"
            previous = _add_previous(kind, name, dict(rows=d_rows, warps=d_warps), sweep, settings,
                                     lambda p, fn=fn: (lambda x, res, wt, bs: fn(x, res, wt, bs, p["rows"],
                                                                                  p["warps"])))
            case = Case(f"{kind} {name} {m}x{n} {_short(dt)}", kind, nbytes, make, fn, ref, norm.TOLERANCES, dt,
                        "", sweep)
            out.append((case, dict(family="layernorm", shape=name, m=m, n=n, variant=kind,
                                   default=dict(rows=d_rows, warps=d_warps), settings=settings, previous=previous)))
    return out


def swiglu_cases(dev: str, dt, smoke: bool) -> list[tuple[Case, dict]]:
    """The SwiGLU pass: two contiguous (M, I) GEMM outputs, and one packed (M, 2I) output read as column views."""
    import torch

    from explorer.fusions import swiglu

    e = torch.empty((), dtype=dt).element_size()
    out = []
    for name, b, s, _, _, _, _, inter in (SMOKE_DECODERS if smoke else DECODERS):
        m = b * s

        def make_split(m=m, i=inter):
            return (torch.randn(m, i, device=dev, dtype=dt) * 3, torch.randn(m, i, device=dev, dtype=dt))

        def make_packed(m=m, i=inter):
            gu = torch.randn(m, 2 * i, device=dev, dtype=dt)
            gu[:, :i] *= 3
            return (gu,)
        for kind, make, default, fn, ref in (
                ("silu_mul", make_split, swiglu.launch_setting(1, m * inter),
                 lambda g, u, bm=None, bn=None, w=None, f=None, h=None: swiglu.silu_mul(
                     g, u, block_m=bm, block_n=bn, num_warps=w, flat=f, hints=h),
                 swiglu.silu_mul_reference),
                ("silu_mul_packed", make_packed, swiglu.launch_setting(m, inter),
                 lambda gu, bm=None, bn=None, w=None, f=None, h=None, i=inter: swiglu.silu_mul_packed(
                     gu, i, block_m=bm, block_n=bn, num_warps=w, flat=f, hints=h),
                 lambda gu, i=inter: swiglu.silu_mul_packed_reference(gu, i))):
            split = kind == "silu_mul"
            default, d_flat, d_hints = default[:3], default[3], default[4]        # launch_setting's walk, hints
            if split:      # one long row: no layout to choose; the cache hints at the default and at 1024 x 4
                grid = [(*t, None, d_hints) for t in SPLIT_SWEEP] + [
                    (*t, None, h) for t in (tuple(default), (1, 1024, 4)) for h in HINT_SWEEP]
            else:          # each tile walked flat and in tiles; the cache hints at the default
                grid = [(*t, f, d_hints) for f in (False, True) for t in PACKED_SWEEP] + [
                    (*default, d_flat, h) for h in HINT_SWEEP]
            sweep, settings = {}, {}
            for bm, bn, w, f, h in _grid(grid, smoke):
                if (bm, bn, w) == tuple(default) and (f is None or f == d_flat) and h == d_hints:
                    continue
                knobs = dict(block_m=bm, block_n=bn, warps=w) | ({} if f is None else dict(flat=int(f))) | dict(
                    hints=h)
                label = _label(**knobs)
                if label in sweep:
                    continue
                sweep[label] = (lambda *t, fn=fn, bm=bm, bn=bn, w=w, f=f, h=h: fn(*t, bm=bm, bn=bn, w=w, f=f, h=h))
                settings[label] = dict(block_m=bm, block_n=bn, warps=w, flat=f, hints=h)
            d_settings = dict(zip(("block_m", "block_n", "warps"), default), flat=None if split else d_flat,
                              hints=d_hints)
            previous = _add_previous(kind, name, d_settings, sweep, settings,
                                     lambda p, fn=fn: (lambda *t: fn(*t, bm=p["block_m"], bn=p["block_n"],
                                                                     w=p["warps"], f=p["flat"], h=p["hints"])))
            case = Case(f"{kind} {name} {m}x{inter} {_short(dt)}", kind, 3 * m * inter * e, make, fn, ref,
                        swiglu.EAGER_TOLERANCES, dt, "", sweep)
            out.append((case, dict(family="swiglu", shape=name, m=m, n=inter, variant=kind, default=d_settings,
                                   settings=settings, previous=previous)))
    return out


def _cos_sin(b, s, d, dev, dtype):
    """Llama's cos, sin (B, S, D) for positions 0..S-1, in ``dtype``."""
    import torch

    pos = torch.arange(s, device=dev, dtype=torch.float32)[None].expand(b, s)
    inv = 1.0 / (10000.0 ** (torch.arange(0, d, 2, device=dev, dtype=torch.float32) / d))
    emb = torch.cat([pos[..., None] * inv] * 2, dim=-1)                                 # (B, S, D)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def rotary_cases(dev: str, dt, smoke: bool) -> list[tuple[Case, dict]]:
    """Rotary of q and k: transposed (B, S, H, D) projections, and column views of one QKV output."""
    import torch

    from explorer.fusions import rotary as rot

    e = torch.empty((), dtype=dt).element_size()
    out = []
    for name, b, s, _, hq, hkv, d, _ in (SMOKE_DECODERS if smoke else DECODERS):
        def make_proj(b=b, s=s, hq=hq, hkv=hkv, d=d):
            q = torch.randn(b, s, hq, d, device=dev, dtype=dt).transpose(1, 2)            # (B, Hq, S, D)
            k = torch.randn(b, s, hkv, d, device=dev, dtype=dt).transpose(1, 2)           # (B, Hkv, S, D)
            return (q, k, *_cos_sin(b, s, d, dev, dt))

        def make_views(b=b, s=s, hq=hq, hkv=hkv, d=d):
            y = torch.randn(b, s, (hq + 2 * hkv) * d, device=dev, dtype=dt)                # one QKV GEMM output
            q, k, _ = y.split((hq * d, hkv * d, hkv * d), -1)
            return (q.view(b, s, hq, d).transpose(1, 2), k.view(b, s, hkv, d).transpose(1, 2),
                    *_cos_sin(b, s, d, dev, dt))
        nbytes = 2 * b * s * (hq + hkv) * d * e + 2 * b * s * d * e
        d_cfg = rot.launch_config(hq, hkv, d, b * s)
        table = bool(getattr(rot, "TABLE_TILE", False))
        default = dict(tokens=(d_cfg[2], d_cfg[3]), heads=(d_cfg[0], d_cfg[1]), warps=d_cfg[5], table_tile=table)
        grid = [(t, h, w, tt) for tt in (True, False) for t, h, w in
                ((default["tokens"], None, default["warps"]),) + _grid(ROTARY_SWEEP, smoke)]
        for kind, make in (("rotary", make_proj), ("rotary_qkv_views", make_views)):
            sweep, settings = {}, {}
            for t, h, w, tt in grid:
                hh = h or (d_cfg[0], d_cfg[1])
                if (t, hh, w, tt) == (default["tokens"], default["heads"], default["warps"], table):
                    continue
                label = _label(tokens=t, heads=h, warps=w, table_tile=int(tt))
                if label in sweep:
                    continue
                sweep[label] = (lambda q, k, c, sn, t=t, h=h, w=w, tt=tt: rot.rotary(
                    q, k, c, sn, tokens=t, heads=h, num_warps=w, table_tile=tt))
                settings[label] = dict(tokens=t, heads=h, warps=w, table_tile=tt)
            previous = _add_previous(kind, name, default, sweep, settings,
                                     lambda p: (lambda q, k, c, sn: rot.rotary(
                                         q, k, c, sn, tokens=p["tokens"], heads=p["heads"], num_warps=p["warps"],
                                         table_tile=p["table_tile"])))
            case = Case(f"{kind} {name} B{b} S{s} Hq{hq} Hkv{hkv} D{d} {_short(dt)}", kind, nbytes, make,
                        rot.rotary, rot.rotary_reference, rot.EAGER_TOLERANCES, dt, "", sweep)
            out.append((case, dict(family="rotary", shape=name, b=b, s=s, hq=hq, hkv=hkv, d=d, variant=kind,
                                   default=default, settings=settings, previous=previous)))
    return out


CASES = {"rmsnorm": rms_cases, "layernorm": layernorm_cases, "swiglu": swiglu_cases, "rotary": rotary_cases}


def _short(dtype) -> str:
    import torch

    return {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}[dtype]


# ====================================================================== running

def summarise(rows: list[dict], meta: dict) -> dict:
    """One case's line: copy GB/s, the default's % of copy, the best setting's, inductor's, eager's."""
    by = {r["variant"]: r for r in rows}
    ok = [r for r in rows if r["variant"] not in ("copy", "eager") and not r["variant"].startswith("compile")
          and r["check"] == "ok"]
    best = max(ok, key=lambda r: r["fraction_of_copy"], default=None)
    fused = by.get("fused", {})
    inductor = by.get("compile_default")
    best_settings = (meta["default"] if best is not None and best["variant"] == "fused"
                     else meta["settings"].get(best["variant"]) if best is not None else None)
    return dict(case=rows[0]["case"], family=meta["family"], variant=meta["variant"], shape=meta["shape"],
                dtype=rows[0]["case"].rsplit(" ", 1)[-1], bytes=rows[0]["bytes"],
                copy_gbps=round(by["copy"]["gbps"], 1), copy_us=round(by["copy"]["ms_p50"] * 1e3, 2),
                default=meta["default"], default_us=round(fused.get("ms_p50", float("nan")) * 1e3, 2),
                default_fraction=round(fused.get("fraction_of_copy", float("nan")), 4),
                default_spread_us=(round(fused["ms_p20"] * 1e3, 2), round(fused["ms_p80"] * 1e3, 2)) if fused else None,
                best_variant=None if best is None else best["variant"], best_settings=best_settings,
                best_fraction=None if best is None else round(best["fraction_of_copy"], 4),
                inductor_fraction=None if inductor is None else round(inductor["fraction_of_copy"], 4),
                inductor_us=None if inductor is None else round(inductor["ms_p50"] * 1e3, 2),
                eager_fraction=round(by["eager"]["fraction_of_copy"], 4) if "eager" in by else None,
                candidates={c: round(by[c]["fraction_of_copy"], 4) for c in meta.get("candidates", ()) if c in by
                            and by[c]["check"] == "ok"},
                previous=meta.get("previous"),
                previous_fraction=(round(by[meta["previous"]]["fraction_of_copy"], 4)
                                   if meta.get("previous") in by else None),
                meets_target=bool(fused) and fused["check"] == "ok" and fused["fraction_of_copy"] >= TARGET_FRACTION,
                checks_ok=all(r["check"] in ("ok", "n/a") for r in rows))


def bench_part(part: str, args, device: str, log, deadline: float, checkpoint) -> dict:
    """One family: every case in every dtype, its rows and summary lines; written after every case."""
    import torch

    if device.startswith("cuda"):
        from triton.testing import do_bench

        l2_bytes = int(getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 0) or 60 * 2**20)
    else:
        do_bench, l2_bytes = cpu_do_bench, 64 * 1024
    rows, summary, skipped = [], [], []
    wanted = [w.strip() for w in args.cases.split(",") if w.strip()]
    for dname in args.dtypes:
        dt = torch.float32 if args.smoke else _dt(dname)
        for case, meta in CASES[part](device, dt, args.smoke):
            if wanted and not any(w in case.name for w in wanted):
                continue
            if time.perf_counter() > deadline:
                skipped.append(case.name)
                continue
            sub = argparse.Namespace(**vars(args))
            sub.sweep = args.sweep and dname in args.sweep_dtypes
            if args.verify:       # the defaults, the settings they replaced and the candidates in the same rounds
                keep = {meta.get("previous"), *meta.get("candidates", ())}
                case.sweep = {k: v for k, v in case.sweep.items() if k in keep}
                sub.sweep = bool(case.sweep)
            sub.no_compile = args.no_compile or dname not in args.compile_dtypes
            log(f"[{part}] {case.name}" + (f" + {len(case.sweep)} settings" if sub.sweep else ""))
            got = run_case(case, sub, l2_bytes, do_bench, deadline)
            rows += got
            summary.append(summarise(got, meta))
            checkpoint(dict(rows=rows, summary=summary, skipped_past_budget=skipped))
    return dict(rows=rows, summary=summary, skipped_past_budget=skipped)


def print_table(doc: dict) -> None:
    """One line per case: default, best setting, inductor, as % of copy."""
    print(f"{'case':<52} {'copy GB/s':>9} {'default':>8} {'before':>7} {'best':>7} {'inductor':>8}  best setting")
    for part in PARTS:
        got = doc.get(part) or {}
        for s in got.get("summary", []):
            best = "-" if s["best_fraction"] is None else f"{100 * s['best_fraction']:.1f}%"
            ind = "-" if s["inductor_fraction"] is None else f"{100 * s['inductor_fraction']:.1f}%"
            mark = "" if s["meets_target"] else " <93"
            prev = "-" if s.get("previous_fraction") is None else f"{100 * s['previous_fraction']:.1f}%"
            print(f"{s['case']:<52} {s['copy_gbps']:9.0f} {100 * s['default_fraction']:7.1f}% {prev:>7} {best:>7} "
                  f"{ind:>8}  "
                  f"{s['best_variant']}{mark}{'' if s['checks_ok'] else ' CHECK FAILED'}")
        if got.get("skipped_past_budget"):
            print(f"{part}: skipped past --budget-s: {len(got['skipped_past_budget'])} cases")
        if "error" in got:
            print(f"{part}: {got['error']}")


def merge_results(paths: list[str]) -> dict:
    """Several results as one: per part, each case's summary and rows from the LAST file that has the case (a verify
    after a sweep replaces the sweep's cases it re-timed), each summary marked with its file's name (``source``)."""
    import json

    merged: dict = {}
    for path in paths:
        doc = json.loads(Path(path).read_text())
        for part in PARTS:
            got = doc.get(part) or {}
            into = merged.setdefault(part, dict(summary=[], rows=[]))
            for s in got.get("summary", []):
                into["summary"] = [t for t in into["summary"] if t["case"] != s["case"]] + [
                    dict(s, source=Path(path).name)]
                into["rows"] = [r for r in into["rows"] if r["case"] != s["case"]] + [
                    r for r in got.get("rows", []) if r["case"] == s["case"]]
    order = {(v, sh, d): i for i, (v, sh, d) in enumerate(
        (s["variant"], s["shape"], s["dtype"]) for path in paths[:1] for part in PARTS
        for s in (json.loads(Path(path).read_text()).get(part) or {}).get("summary", []))}
    for part in merged.values():
        part["summary"].sort(key=lambda s: order.get((s["variant"], s["shape"], s["dtype"]), len(order)))
    return merged


def markdown_table(doc: dict) -> list[str]:
    """The README's table of one run (or of ``merge_results``, then with each case's source file): per case the
    default's, the best setting's and inductor's % of copy."""
    sourced = any(s.get("source") for part in PARTS for s in (doc.get(part) or {}).get("summary", []))
    lines = ["| kernel | shape | dtype | copy GB/s | ours (launched) | before this tuning | best setting timed "
             "| inductor |" + (" source |" if sourced else ""),
             "|---|---|---|---|---|---|---|---|" + ("---|" if sourced else "")]
    for part in PARTS:
        for s in (doc.get(part) or {}).get("summary", []):
            best = "" if s["best_fraction"] is None or s["best_variant"] == "fused" else (
                f"{100 * s['best_fraction']:.1f}% `{_knobs(s['best_variant'])}`")
            ind = "not compiled" if s["inductor_fraction"] is None else f"{100 * s['inductor_fraction']:.1f}%"
            mark = "" if s["meets_target"] else " (< 93%)"
            prev = ("same setting" if s.get("previous") is None else "not timed" if s.get("previous_fraction") is None
                    else f"{100 * s['previous_fraction']:.1f}%")
            lines.append(f"| {s['variant']} | {s['shape']} | {s['dtype']} | {s['copy_gbps']:.0f} | "
                         f"{100 * s['default_fraction']:.1f}%{mark} | {prev} | {best or 'the launched one'} | {ind} |"
                         + (f" `{s.get('source', '')}` |" if sourced else ""))
    return lines


def proposals(doc: dict) -> list[dict]:
    """Per case of a ``--sweep`` result, the setting to bake into its family's table: the fastest checked setting
    whose median beats the launched one's 20th percentile (faster than its spread), else None (keep the launched).
    Each entry: case, family, kernel variant, shape, dtype, launched and proposed settings with their % of copy."""
    out = []
    for part in PARTS:
        got = doc.get(part) or {}
        rows_by_case: dict[str, dict[str, dict]] = {}
        for r in got.get("rows", []):
            rows_by_case.setdefault(r["case"], {})[r["variant"]] = r
        for s in got.get("summary", []):
            rows = rows_by_case.get(s["case"], {})
            fused = rows.get("fused")
            best = rows.get(s["best_variant"]) if s.get("best_variant") else None
            wins = (fused is not None and best is not None and best is not fused and best["check"] == "ok"
                    and best["ms_p50"] < fused["ms_p20"])
            out.append(dict(case=s["case"], family=s["family"], variant=s["variant"], shape=s["shape"],
                            dtype=s["dtype"], launched=s["default"], launched_fraction=s["default_fraction"],
                            proposed=s["best_settings"] if wins else None,
                            proposed_fraction=s["best_fraction"] if wins else None))
    return out


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--only", default=",".join(PARTS), help=f"comma-separated parts: {', '.join(PARTS)}")
    p.add_argument("--cases", default="", help="comma-separated substrings: only the cases whose name has one")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--sweep", action="store_true", help="also time the launch-setting grid (in --sweep-dtypes)")
    mode.add_argument("--verify", action="store_true", help="defaults and inductor only, every dtype compiled")
    p.add_argument("--dtypes", default="bf16,fp16")
    p.add_argument("--sweep-dtypes", default="bf16")
    p.add_argument("--compile-dtypes", default=None, help="dtypes whose reference inductor compiles (default: "
                   "bf16 with --sweep, all otherwise)")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--warmup-ms", type=int, default=10)
    p.add_argument("--rep-ms", type=int, default=40)
    p.add_argument("--rotate-l2", type=float, default=4.0)
    p.add_argument("--no-compile", action="store_true", help="skip torch.compile of the references")
    p.add_argument("--smoke", action="store_true", help="CPU, interpreted kernels, tiny shapes: the plumbing")
    p.add_argument("--budget-s", type=float, default=240.0, help="no case starts after this many seconds")
    p.add_argument("--out", default=None)
    p.add_argument("--table", default=None, metavar="JSON", help="print the markdown table of a result and exit "
                   "(A.json,B.json,...: a later file's cases replace the earlier's, with a source column)")
    p.add_argument("--propose", default=None, metavar="JSON",
                   help="print, per case of a --sweep result, the setting that beat the launched one by more than "
                        "its spread (what to bake into the tables), and exit")
    args = p.parse_args(argv)
    args.parts = [s.strip() for s in args.only.split(",") if s.strip()]
    unknown = [s for s in args.parts if s not in PARTS]
    if unknown:
        p.error(f"unknown part(s) {', '.join(unknown)}")
    args.dtypes = [s.strip() for s in args.dtypes.split(",") if s.strip()]
    args.sweep_dtypes = [s.strip() for s in args.sweep_dtypes.split(",") if s.strip()]
    args.compile_dtypes = ([s.strip() for s in args.compile_dtypes.split(",") if s.strip()]
                           if args.compile_dtypes is not None else (["bf16"] if args.sweep else args.dtypes))
    args.quick = True                      # run_case: no max-autotune
    if args.verify:
        args.rounds = max(args.rounds, 3)
    if args.smoke:
        args.no_compile, args.rounds, args.dtypes = True, 1, ["fp32"]
        args.sweep_dtypes = ["fp32"]
    return args


def main(argv=None) -> int:
    """Run the parts; 0 also when skipped without CUDA, 1 when a part failed or a variant's check did."""
    args = parse_args(argv)
    if args.table or args.propose:
        import json

        paths = [q for q in (args.table or args.propose).split(",") if q]
        doc = merge_results(paths) if len(paths) > 1 else json.loads(Path(paths[0]).read_text())
        if args.table:
            print("\n".join(markdown_table(doc)))
        for p in proposals(doc) if args.propose else ():
            verdict = ("keep" if p["proposed"] is None else
                       f"-> {p['proposed']} ({100 * p['proposed_fraction']:.1f}%)")
            print(f"{p['case']:<52} launched {p['launched']} ({100 * p['launched_fraction']:.1f}%) {verdict}")
        return 0
    device = common.bench_device("bench_membw.py", args.smoke)
    if device is None:
        return 0
    from explorer.runtime import measure

    run = common.BenchRun(common.results_path(args.out, "bench_membw.json"), "bench_membw/1", args.smoke,
                          measure.environment(device),
                          dict(parts=args.parts, sweep=args.sweep, verify=args.verify, dtypes=args.dtypes,
                               sweep_dtypes=args.sweep_dtypes, compile_dtypes=args.compile_dtypes,
                               rounds=args.rounds, warmup_ms=args.warmup_ms, rep_ms=args.rep_ms,
                               rotate_l2=args.rotate_l2, budget_s=args.budget_s,
                               target_fraction_of_copy=TARGET_FRACTION,
                               bytes="each input read once + each output written once (weights, cos/sin included)"),
                          args.budget_s)
    failed = run.run_parts({part: (lambda checkpoint, part=part: bench_part(part, args, device, run.log,
                                                                            run.deadline, checkpoint))
                            for part in args.parts})
    print(run.environment_line())
    print_table(run.doc)
    bad = run.failed_checks(args.parts)
    print(f"wrote {run.path} (wall {run.doc.get('wall_s')} s)")
    return 1 if failed or bad else 0


if __name__ == "__main__":
    sys.exit(main())
