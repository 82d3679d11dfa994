"""Benchmark the LLM epilogue kernels on a GPU: SwiGLU and rotary in the GEMM's epilogue, rotary and the SwiGLU pass.

::

    memory   rotary Q+K (zoo decoder 16x1024 tokens, 8 heads over 2 of D=64; Llama-3-8B 4x1024, 32 over 8 of
             D=128; Llama-7B 4x2048, 32 of D=128) and the packed SwiGLU pass (zoo, 8B): ours | eager | the
             launch-setting sweep | torch.compile of the reference | a device copy of the same bytes, in the
             same rounds; % of the copy's GB/s. Target: >= 93%.
    swiglu   x @ [W_gate; W_up]^T then silu(g)·u: ours (one Triton GEMM, SwiGLU in its epilogue, the (M, 2I)
             product never written; a sweep of tiles) | cuBLAS + our silu_mul_packed pass | cuBLAS + eager
             silu, mul | torch.compile of the eager reference | cuBLAS's GEMM alone (the matrix rate).
    qkv      x @ [W_q; W_k; W_v]^T then rotary on q and k: ours (one Triton GEMM, rotary in its epilogue, the
             q, k in (B, H, S, D) as apply_rotary_pos_emb returns them, v as v_proj's rows) | cuBLAS + our rotary kernel | eager | torch.compile |
             cuBLAS's GEMM alone.

Every variant is timed by ``bench_llm_fusions.run_case`` (``triton.testing.do_bench``, L2 flushed, inputs
rotated over 4x the L2, variants alternated round by round) and checked against eager first. For the
GEMMs, % of the matrix rate = cuBLAS's GEMM-alone time / the variant's time (the same FLOPs). The
``table`` key of the JSON is the per-shape kernel table the Learn page shows (``explorer/ui/kernel_table.py``)
and the decision ``explorer.fusions.llm_epilogue.DECISIONS`` is read from: ours is chosen for a shape only
where its best tile's median beat cuBLAS + pass by more than 2%.

Usage::

    python3 benchmarks/bench_llm_epilogues.py                   # all parts, ~5 min on an H200
    python3 benchmarks/bench_llm_epilogues.py --part memory     # rotary + pass only
    python3 benchmarks/bench_llm_epilogues.py --smoke           # CPU, TRITON_INTERPRET=1, tiny shapes

Writes JSON to ``--out``, else ``$OUT/bench_llm_epilogues.json``, else ``benchmarks/results/``. Without
CUDA (and without ``--smoke``) it measures nothing, says SKIPPED and exits 0.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks import _common as common  # noqa: E402
from benchmarks.bench_llm_fusions import Case, _quantiles, cpu_do_bench, run_case  # noqa: E402,F401

TARGET_FRACTION = 0.93
#: Ours is chosen only where it is faster than cuBLAS + pass by more than this fraction of the latter.
MARGIN = 0.02
#: (name, batch, seq, hidden, heads, kv heads, head dim, intermediate)
SHAPES = (("zoo decoder", 16, 1024, 512, 8, 2, 64, 1376),
          ("Llama-3-8B", 4, 1024, 4096, 32, 8, 128, 14336))
ROTARY_ONLY = (("Llama-7B", 4, 2048, 4096, 32, 32, 128, 11008),)
SMOKE_SHAPES = (("smoke", 2, 7, 24, 3, 1, 16, 20),)
#: Tiles (BLOCK_M, BLOCK_N pairs, BLOCK_K, warps, stages) the GEMM sweep times.
SWIGLU_TILES = ((128, 64, 64, 8, 4), (128, 64, 64, 4, 4), (128, 128, 64, 8, 3), (64, 64, 64, 4, 4),
                (128, 64, 32, 8, 5), (256, 64, 64, 8, 3), (64, 128, 64, 8, 3), (128, 32, 64, 4, 4),
                (256, 64, 64, 8, 4), (256, 64, 32, 8, 4), (128, 128, 64, 8, 4))
#: Tiles (BLOCK_M, BLOCK_N interleaved columns, BLOCK_K, warps, stages) of the interleaved SwiGLU GEMM.
INTERLEAVED_TILES = ((128, 128, 64, 8, 4), (128, 128, 64, 8, 3), (256, 128, 64, 8, 3), (128, 256, 64, 8, 3),
                     (256, 128, 32, 8, 4), (128, 256, 64, 8, 4))
ROTARY_TILES = ((128, 64, 64, 8, 4), (128, 64, 64, 4, 4), (128, 128, 64, 8, 3), (64, 64, 64, 4, 4),
                (64, 128, 64, 8, 3), (128, 32, 64, 4, 4), (256, 64, 64, 8, 3))


def _cos_sin(b, s, d, dev, dtype):
    """Llama's cos, sin (B, S, D) for positions 0..S-1, in ``dtype``."""
    import torch

    pos = torch.arange(s, device=dev, dtype=torch.float32)[None].expand(b, s)
    inv = 1.0 / (10000.0 ** (torch.arange(0, d, 2, device=dev, dtype=torch.float32) / d))
    emb = torch.cat([pos[..., None] * inv] * 2, dim=-1)                                 # (B, S, D)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def memory_cases(dev: str, smoke: bool) -> list[Case]:
    """Rotary at each shape (q, k as transposed (B, S, H, D) projections) and the packed SwiGLU pass."""
    import torch

    from explorer.fusions import rotary as rot
    from explorer.fusions import swiglu

    bf16 = torch.float32 if smoke else torch.bfloat16
    cases = []
    for name, b, s, _, hq, hkv, d, inter in (SMOKE_SHAPES if smoke else SHAPES + ROTARY_ONLY):
        def make_rope(b=b, s=s, hq=hq, hkv=hkv, d=d):
            q = torch.randn(b, s, hq, d, device=dev, dtype=bf16).transpose(1, 2)           # (B, Hq, S, D)
            k = torch.randn(b, s, hkv, d, device=dev, dtype=bf16).transpose(1, 2)          # (B, Hkv, S, D)
            return (q, k, *_cos_sin(b, s, d, dev, bf16))
        qk = b * s * (hq + hkv) * d * bf16.itemsize
        settings = (((4, 16), None, 4), ((2, 8), None, 4), ((1, 2), None, 4), ((1, 1), None, 4), ((1, 4), None, 4),
                    ((2, 8), None, 8), ((1, 2), (16, 8), 4), ((2, 4), (8, 8), 4))
        sweep = {f"ours[tokens={t},heads={h},w={w}]": (lambda q, k, c, sn, t=t, h=h, w=w: rot.rotary(
                     q, k, c, sn, tokens=t, heads=h, num_warps=w)) for t, h, w in settings}
        cases.append(Case(f"rotary {name} B{b} S{s} Hq{hq} Hkv{hkv} D{d}", "rotary", 2 * qk + 2 * b * s * d * 2,
                          make_rope, rot.rotary, rot.rotary_reference, rot.EAGER_TOLERANCES, bf16,
                          "q, k transposed views of (B,S,H,D); writes q_embed, k_embed", sweep))

        def make_packed_rope(b=b, s=s, hq=hq, hkv=hkv, d=d):
            """q, k as the model has them after the siblings' QKV GEMM: column views of one (B, S, (Hq+2Hkv)·D)
            output, viewed (B, S, H, D) and transposed; the outputs are then (B, H, S, D) contiguous."""
            y = torch.randn(b, s, (hq + 2 * hkv) * d, device=dev, dtype=bf16)
            q, k, _ = y.split((hq * d, hkv * d, hkv * d), -1)
            return (q.view(b, s, hq, d).transpose(1, 2), k.view(b, s, hkv, d).transpose(1, 2),
                    *_cos_sin(b, s, d, dev, bf16))
        cases.append(Case(f"rotary on QKV column views {name} B{b} S{s} Hq{hq} Hkv{hkv} D{d}", "rotary",
                          2 * qk + 2 * b * s * d * 2, make_packed_rope, rot.rotary, rot.rotary_reference,
                          rot.EAGER_TOLERANCES, bf16, "the zoo graph's layout: reads column views, writes (B,H,S,D)",
                          {**dict(list(sweep.items())[:3]),
                           "ours[token-major outputs]": lambda q, k, c, sn: rot.rotary(q, k, c, sn, token_major=True)}))
        if (name, b) in ((n, bb) for n, bb, *_ in ROTARY_ONLY):
            continue
        m = b * s

        def make_packed(m=m, inter=inter):
            return (torch.randn(m, 2 * inter, device=dev, dtype=bf16) * 2,)
        cases.append(Case(f"silu_mul_packed {name} {m}x(2*{inter})", "silu_mul", 3 * m * inter * bf16.itemsize,
                          make_packed, lambda gu, i=inter: swiglu.silu_mul_packed(gu, i),
                          lambda gu, i=inter: swiglu.silu_mul_packed_reference(gu, i), swiglu.EAGER_TOLERANCES,
                          bf16, "the pass after cuBLAS: reads (M, 2I), writes (M, I)"))
    return cases


def gemm_cases(dev: str, smoke: bool, part: str) -> list[tuple[Case, int]]:
    """(case, FLOPs) for the SwiGLU GEMM (``part="swiglu"``) or the QKV GEMM with rotary (``"qkv"``)."""
    import torch
    import torch.nn.functional as F

    from explorer.fusions import rotary as rot
    from explorer.fusions import swiglu
    from explorer.fusions.kernels import gemm

    bf16 = torch.float32 if smoke else torch.bfloat16
    out = []
    for name, b, s, hidden, hq, hkv, d, inter in (SMOKE_SHAPES if smoke else SHAPES):
        m = b * s
        if part == "swiglu":
            def make(m=m, hidden=hidden, inter=inter):
                x = torch.randn(m, hidden, device=dev, dtype=bf16)
                w = (torch.randn(2 * inter, hidden, device=dev) / hidden ** 0.5).to(bf16)
                return x, w, gemm.interleave_gate_up(w)[0]              # the interleaved copy: made at plan time
            sweep = {f"ours[{'x'.join(map(str, t[:3]))} w{t[3]} s{t[4]}]":
                     (lambda x, w, wi, t=t, i=inter: gemm.gemm_swiglu(x, w, None, i, tiles=t)) for t in SWIGLU_TILES}
            sweep.update({f"ours[il {'x'.join(map(str, t[:3]))} w{t[3]} s{t[4]}]":
                          (lambda x, w, wi, t=t: gemm.gemm_swiglu_interleaved(x, wi, None, tiles=t))
                          for t in INTERLEAVED_TILES})
            sweep["cublas+pass"] = lambda x, w, wi, i=inter: swiglu.silu_mul_packed(F.linear(x, w), i)
            sweep["cublas_gemm_only"] = lambda x, w, wi: F.linear(x, w)
            case = Case(f"swiglu_gemm {name} M{m} K{hidden} I{inter}", "swiglu_gemm",
                        (m * hidden + 2 * inter * hidden + m * inter) * bf16.itemsize, make,
                        lambda x, w, wi, i=inter: gemm.gemm_swiglu(x, w, None, i),
                        lambda x, w, wi, i=inter: swiglu.silu_mul_packed_reference(F.linear(x, w), i),
                        swiglu_gemm_tolerances(), bf16, "writes (M, I); the (M, 2I) product never", sweep)
            out.append((case, 2 * m * hidden * 2 * inter))
        else:
            heads = hq + 2 * hkv

            def make(b=b, s=s, hidden=hidden, heads=heads, d=d):
                x = torch.randn(b * s, hidden, device=dev, dtype=bf16)
                w = (torch.randn(heads * d, hidden, device=dev) / hidden ** 0.5).to(bf16)
                return (x, w, *_cos_sin(b, s, d, dev, bf16))

            def views(y, b=b, s=s, hq=hq, hkv=hkv, d=d):
                """The model's q, k, v from the packed output: split, view (B, S, H, D), transpose."""
                q, k, v = y.split((hq * d, hkv * d, hkv * d), -1)
                return tuple(t.reshape(b, s, -1, d).transpose(1, 2) for t in (q, k, v))

            def ours(x, w, c, sn, tiles=None, b=b, s=s, hq=hq, hkv=hkv, d=d):
                q, k, v = gemm.gemm_qkv_rotary(x, w, None, c, sn, b, hq, hkv, d, tiles=tiles)
                return q, k, v.view(b, s, hkv, d).transpose(1, 2)

            def cublas_pass(x, w, c, sn, views=views):
                q, k, v = views(F.linear(x, w))
                return (*rot.rotary(q, k, c, sn), v)

            def eager(x, w, c, sn, views=views):
                q, k, v = views(F.linear(x, w))
                return (*rot.rotary_reference(q, k, c, sn), v)
            sweep = {f"ours[{'x'.join(map(str, t[:3]))} w{t[3]} s{t[4]}]": (lambda *a, t=t, f=ours: f(*a, tiles=t))
                     for t in ROTARY_TILES}
            sweep["cublas+pass"] = cublas_pass
            sweep["cublas_gemm_only"] = lambda x, w, c, sn: F.linear(x, w)
            case = Case(f"qkv_rotary_gemm {name} M{m} K{hidden} Hq{hq} Hkv{hkv} D{d}", "qkv_gemm",
                        (m * hidden + heads * d * hidden + m * heads * d) * bf16.itemsize, make, ours, eager,
                        swiglu_gemm_tolerances(), bf16, "writes q_embed, k_embed (B, H, S, D) and v (M, Hkv·D)", sweep)
            out.append((case, 2 * m * hidden * heads * d))
    return out


def swiglu_gemm_tolerances() -> dict:
    """Ours vs cuBLAS + eager: the GEMM epilogue's error model (``explorer.fusions.epilogue``)."""
    from explorer.fusions.kernels.gemm import TOLERANCES

    return TOLERANCES


def gemm_rows(rows: list[dict], flops: int) -> list[dict]:
    """Add TFLOP/s and % of the matrix rate (cuBLAS's GEMM alone, same run) to a GEMM case's rows."""
    gemm_only = next(r for r in rows if r["variant"] == "cublas_gemm_only")
    for r in rows:
        r["tflops"] = flops / (r["ms_p50"] * 1e-3) / 1e12
        r["fraction_of_matrix_rate"] = gemm_only["ms_p50"] / r["ms_p50"]
        if r["variant"] in ("cublas_gemm_only", "copy"):
            r["check"] = "n/a"
    return rows


def table_entry(case: Case, rows: list[dict], gemm: bool) -> dict:
    """One row of the per-shape kernel table: ours (its best setting), cuBLAS + pass (or eager for the memory
    kernels), inductor; the fraction of copy or of the matrix rate; the decision and why."""
    by = {r["variant"]: r for r in rows}
    ours = [r for r in rows if (r["variant"] == "fused" or r["variant"].startswith("ours[")) and r["check"] == "ok"]
    best = min(ours, key=lambda r: r["ms_p50"]) if ours else None
    baseline = by.get("cublas+pass") if gemm else by.get("eager")
    inductor = by.get("compile_default")
    frac = "fraction_of_matrix_rate" if gemm else "fraction_of_copy"
    entry = dict(case=case.name, kernel=case.kernel, metric="matrix rate" if gemm else "copy",
                 ours_variant=best and best["variant"], ours_ms=best and best["ms_p50"],
                 ours_default_ms=by["fused"]["ms_p50"], baseline=baseline and baseline["variant"],
                 baseline_ms=baseline and baseline["ms_p50"], inductor_ms=inductor and inductor["ms_p50"],
                 ours_fraction=best and best[frac], default_fraction=by["fused"][frac],
                 baseline_fraction=baseline and baseline[frac], inductor_fraction=inductor and inductor[frac])
    if gemm:
        chosen = best is not None and baseline is not None and best["ms_p50"] < (1 - MARGIN) * baseline["ms_p50"]
        entry["decision"] = "ours" if chosen else "cublas+pass"
    else:
        entry["meets_target"] = best is not None and by["fused"]["fraction_of_copy"] >= TARGET_FRACTION
    return entry


def bench_part(part: str, args, device: str, log, deadline: float) -> dict:
    """One part: its cases timed, their rows, and their kernel-table entries."""
    import torch

    if device.startswith("cuda"):
        from triton.testing import do_bench

        props = torch.cuda.get_device_properties(0)
        l2_bytes = int(getattr(props, "L2_cache_size", 0) or 60 * 2**20)
    else:
        do_bench, l2_bytes = cpu_do_bench, 64 * 1024
    cases = ([(c, None) for c in memory_cases(device, args.smoke)] if part == "memory"
             else gemm_cases(device, args.smoke, part))
    rows, table, skipped = [], [], []
    wanted = [w.strip() for w in args.cases.split(",") if w.strip()]
    for case, flops in cases:
        if wanted and not any(w in case.name for w in wanted):
            continue
        if time.perf_counter() > deadline:
            skipped.append(case.name)
            continue
        log(f"[{part}] {case.name}")
        got = run_case(case, args, l2_bytes, do_bench, deadline)
        if flops is not None:
            got = gemm_rows(got, flops)
        rows += got
        table.append(table_entry(case, got, flops is not None))
    return dict(rows=rows, table=table, skipped_past_budget=skipped)


def print_table(doc: dict) -> None:
    """Every row, then the kernel table."""
    for part in ("memory", "swiglu", "qkv"):
        got = doc.get(part) or {}
        for r in got.get("rows", []):
            extra = (f"{r['tflops']:7.1f} TF/s {100 * r['fraction_of_matrix_rate']:5.1f}% mm"
                     if "tflops" in r else f"{r['gbps']:7.0f} GB/s {100 * r['fraction_of_copy']:5.1f}% copy")
            print(f"{r['case']:<52} {r['variant']:<36} {r['ms_p50'] * 1e3:9.1f} us  {extra}  {r['check']}")
        for t in got.get("table", []):
            print(f"TABLE {t['case']}: ours {t['ours_variant']} {t['ours_ms']} ms (default {t['ours_default_ms']}), "
                  f"{t['baseline']} {t['baseline_ms']}, inductor {t['inductor_ms']}; "
                  f"{t['metric']} {t['ours_fraction']} -> {t.get('decision', t.get('meets_target'))}")
        if "error" in got:
            print(f"{part}: {got['error']}")


def parse_args(argv=None) -> argparse.Namespace:
    """Command-line options (the timing ones are ``bench_llm_fusions``' kernel part's)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--part", default="memory,swiglu,qkv", help="comma-separated: memory, swiglu, qkv")
    p.add_argument("--cases", default="", help="comma-separated substrings: only the cases whose name has one")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--warmup-ms", type=int, default=25)
    p.add_argument("--rep-ms", type=int, default=100)
    p.add_argument("--rotate-l2", type=float, default=4.0)
    p.add_argument("--no-compile", action="store_true", help="skip torch.compile of the references")
    p.add_argument("--smoke", action="store_true", help="CPU, interpreted kernels, tiny shapes: the plumbing")
    p.add_argument("--budget-s", type=float, default=480.0, help="no case starts after this many seconds")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    args.sweep, args.quick = True, False          # run_case's switches: always the sweep, never max-autotune
    if args.smoke:
        args.no_compile, args.rounds = True, 1
    args.parts = [s.strip() for s in args.part.split(",") if s.strip()]
    unknown = [s for s in args.parts if s not in ("memory", "swiglu", "qkv")]
    if unknown:
        p.error(f"unknown part(s) {', '.join(unknown)}")
    return args


def main(argv=None) -> int:
    """Run the parts; 0 also when skipped without CUDA, 1 when a part failed or a variant's check did."""
    args = parse_args(argv)
    device = common.bench_device("bench_llm_epilogues.py", args.smoke)
    if device is None:
        return 0
    from explorer.runtime import measure

    run = common.BenchRun(common.results_path(args.out, "bench_llm_epilogues.json"), "bench_llm_epilogues/1",
                          args.smoke, measure.environment(device),
                          dict(parts=args.parts, rounds=args.rounds, compile=not args.no_compile,
                               target_fraction_of_copy=TARGET_FRACTION, margin=MARGIN), args.budget_s)
    failed = run.run_parts({part: (lambda checkpoint, part=part: bench_part(part, args, device, run.log, run.deadline))
                            for part in args.parts})
    print(run.environment_line())
    print_table(run.doc)
    bad = run.failed_checks(args.parts)
    print(f"wrote {run.path}")
    return 1 if failed or bad else 0


if __name__ == "__main__":
    sys.exit(main())
