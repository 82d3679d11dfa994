"""SDPA for the whole attention block against the unfused block, at the corpus' attention shapes (issue 20).

``explorer.fusions.attention.select_attention`` decides per (device, dtype, S bucket, D, has additive terms)
whether the attention family fuses a block into one ``scaled_dot_product_attention`` call, runs the Triton
scores→softmax kernel then P·V as one matmul, or leaves the block unfused; this script measures the three at the
shapes the corpus' models (``benchmarks/corpus.py``, their real sizes) hand the family, and its JSON is what
``--bake`` turns into the committed table ``explorer/fusions/attention_measured.json``.

Each candidate is called exactly as the fused graph or the unfused graph runs it:

- ``sdpa``: ``attention.fused_attention`` (the plain form: one additive term, no views) or
  ``attention.fused_attention_forms`` (two terms regrouped as Swin's shifted windows add them, a tensor scale,
  an einsum) with the arguments the rewrite gives them (the bias and the mask as it passes them: Swin's window
  mask expanded to the scores' shape and summed with the bias, in the model's dtype);
- ``unfused``: the model's own ops in the model's dtype: matmul (or einsum), the scale, each add in the shape the
  model adds it in, the softmax (Hugging Face's in float32, cast back), the second matmul;
- ``triton``: ``attention.fused_capped_attention`` without a cap: the scores→softmax kernel, then P·V (only where
  ``select_matmul_softmax`` gives the kernel: rows up to 1024).

Every candidate is first checked against float64 (the same inputs, the model's formula); one outside
``attention.ATTENTION_TOLERANCES`` is reported and never chosen. Timing: CUDA events around ``inner`` calls,
candidates in interleaved rounds (the order rotates each round), after a warm-up; medians with p20/p80 of the
per-call µs.

Usage::

    python3 benchmarks/bench_attention_choice.py                # the H200 run (<= 60 s), JSON under $OUT
    python3 benchmarks/bench_attention_choice.py --smoke        # CPU plumbing check: tiny batches, no Triton
    python3 benchmarks/bench_attention_choice.py --bake RESULT.json   # write explorer/fusions/attention_measured.json

``--budget-s`` (default 40) starts no case past it. Pass 1 runs every case in its corpus model's dtype (Swin-T
first), pass 2 the other dtype; the Triton candidate is timed only before 60 % of the budget in pass 1 and 40 % in
pass 2 (its compiles are the slow part; the JSON says where it was skipped); the JSON is rewritten after each case, so a cut run keeps what it measured.
Skipped by design: fp32 (the corpus runs fp16/bf16 at real size), backward passes, the SDPA backend's name (a
profile per case costs more than the budget allows; the kernel names are in bench_corpus' profiles).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import sys
import time
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import _common  # noqa: E402

SCHEMA = "bench_attention_choice/1"
FILENAME = "bench_attention_choice_h200.json"
TABLE = _common.ROOT / "explorer" / "fusions" / "attention_measured.json"


@dataclasses.dataclass(frozen=True)
class Case:
    """One attention block of a corpus model at its real size.

    ``batch``: the batch dims of the scores (Swin: windows·images, heads; MaxViT: images, windows, heads);
    ``s``: tokens (queries = keys); ``d``: the query/key head dim; ``dv``: the value head dim; ``form``:
    ``plain`` (scores → one add → softmax → P·V: ``fused_attention``), ``shifted`` (Swin's bias, then the
    window mask in the regrouped ``(images, windows, heads, S, S)`` shape), ``v2`` (Swin-V2: cosine scores
    times a per-head tensor scale, the bias, the mask where shifted), ``einsum`` (MaxViT: einsum scores, a
    bias, einsum P·V); ``mask``: the additive term of the plain form (``bias`` (1 or no batch, H, S, S),
    ``padding`` / ``causal`` (B, 1, S, S) in the dtype, or None); ``windows``: Swin's windows per image;
    ``hf``: the softmax is Hugging Face's ``softmax(s, dtype=float32).to(q.dtype)``; ``scale``: the scalar
    scale the chain multiplies by (None: D**-0.5 applied to the queries before the chain, as torchvision).
    """

    name: str
    model: str
    dtypes: tuple[str, ...]
    batch: tuple[int, ...]
    s: int
    d: int
    dv: int
    form: str = "plain"
    mask: str | None = "bias"
    windows: int = 1
    hf: bool = False
    scale: float | None = None


def _swin(model: str, stage: int, images: int, window: int, heads: int, side: int, shifted: bool, v2: bool) -> Case:
    per_image = (math.ceil(side / window)) ** 2
    s = window * window
    form = "v2" if v2 else ("shifted" if shifted else "plain")
    return Case(f"{model} stage {stage}{' shifted' if shifted else ''}", model, ("float16", "bfloat16"),
                (images * per_image, heads), s, 32, 32, form, "bias", per_image)


def cases() -> list[Case]:
    """The corpus' attention shapes, most telling first (a cut run keeps Swin). Sizes from benchmarks/corpus.py
    (real shapes: images 32 at 224², encoders 32 × 128 tokens, decoders 4 × 1024 tokens)."""
    out: list[Case] = []
    # tv/swin_t: 224² → 56, 28, 14, 7 tokens a side, window 7 (S = 49), head dim 32, heads 3/6/12/24; the last
    # stage's 7 × 7 is one window, so torchvision drops its shift (no mask there)
    for stage, (side, heads) in enumerate(((56, 3), (28, 6), (14, 12), (7, 24)), 1):
        out.append(_swin("tv/swin_t", stage, 32, 7, heads, side, False, False))
        if stage < 4:
            out.append(_swin("tv/swin_t", stage, 32, 7, heads, side, True, False))
    # tv/swin_v2_t: window 8 (S = 64), cosine attention with a per-head logit scale, 16·sigmoid(bias)
    for stage, (side, heads) in enumerate(((56, 3), (28, 6), (14, 12), (7, 24)), 1):
        out.append(_swin("tv/swin_v2_t", stage, 32, 8, heads, side, False, True))
    out.append(dataclasses.replace(_swin("tv/swin_v2_t", 1, 32, 8, 3, 56, True, True), name="tv/swin_v2_t stage 1 shifted"))
    # ViT-B/16 (hf/vit, eager): 197 tokens, 12 heads of 64, no mask; DeiT-tiny (timm: 3 heads of 64)
    out.append(Case("hf/vit (ViT-B/16)", "hf/vit", ("float16", "bfloat16"), (32, 12), 197, 64, 64, mask=None,
                    hf=True, scale=0.125))
    out.append(Case("timm/deit_tiny", "timm/deit_tiny_patch16_224", ("float16", "bfloat16"), (32, 3), 197, 64, 64,
                    mask=None, scale=0.125))
    # hf/bert s128: 12 heads of 64, the padding mask as transformers' eager path builds it, (B, 1, S, S)
    out.append(Case("hf/bert s128", "hf/bert", ("float16", "bfloat16"), (32, 12), 128, 64, 64, mask="padding",
                    hf=True, scale=0.125))
    # hf/gpt2 at 1024 tokens: 12 heads of 64, causal (B, 1, S, S)
    out.append(Case("hf/gpt2 s1024", "hf/gpt2", ("bfloat16", "float16"), (4, 12), 1024, 64, 64, mask="causal",
                    hf=True, scale=0.125))
    # hf/llama prefill: 32 query heads over 8 KV heads of 128 (repeat_kv before the chain: K and V at 32 heads)
    out.append(Case("hf/llama prefill s1024 (GQA 32/8)", "hf/llama", ("bfloat16", "float16"), (4, 32), 1024, 128,
                    128, mask="causal", hf=True, scale=128 ** -0.5))
    # timm/levit_128s: q·kᵀ·scale + attention_biases (H, N, N); key dim 16, value dim 32 (attn_ratio 2); 14², 7², 4²
    for stage, (s, heads) in enumerate(((196, 4), (49, 6), (16, 8)), 1):
        out.append(Case(f"timm/levit_128s stage {stage}", "timm/levit_128s", ("float16", "bfloat16"), (32, heads), s,
                        16, 32, mask="bias", scale=0.25))
    # tv/maxvit_t: einsum scores over (images, 64 windows or grid cells, heads, 49, 49), head dim 32, a bias
    # (stage 1 at 56²: 64 windows of 7 × 7, and a 7 × 7 grid of 64 cells; stage 2 at 28²: 16 of each; heads 2, 4)
    for stage, (groups, heads) in enumerate(((64, 2), (16, 4)), 1):
        out.append(Case(f"tv/maxvit_t stage {stage} window/grid", "tv/maxvit_t", ("float16", "bfloat16"),
                        (32, groups, heads), 49, 32, 32, form="einsum"))
    return out


# ====================================================================== the candidates

def _inputs(case: Case, dtype, device: str, gen) -> dict:
    """Seeded operands in ``dtype`` on ``device`` (and their float64 copies for the reference)."""
    import torch

    B, s, d, dv = case.batch, case.s, case.d, case.dv
    def randn(*shape, std=1.0):
        return (torch.randn(*shape, generator=gen, dtype=torch.float32) * std)

    q = randn(*B, s, d, std=d ** -0.5 if case.scale is None else 1.0)
    k, v = randn(*B, s, d), randn(*B, s, dv)
    heads = B[-1]
    terms: list[torch.Tensor] = []
    tscale = None
    if case.form == "v2":
        q = torch.nn.functional.normalize(q, dim=-1)
        k = torch.nn.functional.normalize(k, dim=-1)
        tscale = torch.full((heads, 1, 1), 10.0)                     # exp(clamp(log(10), max=log(100)))
    if case.form in ("plain", "shifted", "v2", "einsum") and case.mask == "bias":
        bias = randn(1, heads, s, s, std=0.02)
        if case.form == "v2":
            bias = 16 * torch.sigmoid(randn(1, heads, s, s))
        if case.form == "einsum":
            bias = bias[0]                                            # (H, S, S)
        terms.append(bias)
    if case.form == "shifted" or (case.form == "v2" and "shifted" in case.name):
        ids = torch.randint(0, 4, (case.windows, s), generator=gen).float()
        win = ids.unsqueeze(1) - ids.unsqueeze(2)
        win = win.masked_fill(win != 0, -100.0).masked_fill(win == 0, 0.0)
        terms.append(win.unsqueeze(1).unsqueeze(0))                  # (1, nW, 1, S, S)
    if case.mask == "padding":
        keep = torch.ones(B[0], s, dtype=torch.bool)
        keep[B[0] // 2:, s * 3 // 4:] = False                        # half the batch padded at the end
        pad = torch.zeros(B[0], 1, s, s).masked_fill(~keep[:, None, None, :], torch.finfo(dtype).min)
        terms.append(pad)
    if case.mask == "causal":
        causal = torch.zeros(B[0], 1, s, s).masked_fill(
            torch.ones(s, s, dtype=torch.bool).triu(1), torch.finfo(dtype).min)
        terms.append(causal)
    low = dict(q=q, k=k, v=v, terms=terms, tscale=tscale)
    cast = {key: (val.to(device=device, dtype=dtype) if isinstance(val, torch.Tensor) else
                  [t.to(device=device, dtype=dtype) for t in val] if isinstance(val, list) else val)
            for key, val in low.items()}
    ref = {key: (val.to(device=device, dtype=torch.float64) if isinstance(val, torch.Tensor) else
                 [t.to(device=device, dtype=torch.float64) for t in val] if isinstance(val, list) else val)
           for key, val in cast.items()}  # the reference reads the very values the candidates read
    return dict(x=cast, ref=ref)


def _unfused(case: Case, x: dict) -> Callable[[], Any]:
    """The block as the unfused graph computes it, op by op in the model's dtype."""
    import torch

    q, k, v, terms, tscale = x["q"], x["k"], x["v"], x["terms"], x["tscale"]
    B, s = case.batch, case.s

    def run():
        if case.form == "einsum":
            a = torch.einsum("bghid,bghjd->bghij", q, k)
        else:
            a = torch.matmul(q, k.transpose(-2, -1))
        if tscale is not None:
            a = a * tscale
        if case.scale is not None:
            a = a * case.scale
        if terms:
            a = a + terms[0]
        if len(terms) > 1:                                           # Swin's shifted windows: regrouped for the mask
            a = a.view(B[0] // case.windows, case.windows, B[1], s, s) + terms[1]
            a = a.view(-1, B[1], s, s)
        if case.hf:
            p = torch.softmax(a, dim=-1, dtype=torch.float32).to(q.dtype)
        else:
            p = torch.softmax(a, dim=-1)
        if case.form == "einsum":
            return torch.einsum("bghij,bghjd->bghid", p, v)
        return torch.matmul(p, v)

    return run


def _forms_args(case: Case, x: dict):
    """The ``fused_attention_forms`` / ``fused_capped_attention`` arguments the rewrite builds for this block:
    ``(q, b, scale, qscale, b_is_k, terms, shape)``."""
    q, k, terms = x["q"], x["k"], x["terms"]
    B, s = case.batch, case.s
    scores_shape = [*B, s, s]
    if case.form == "einsum":
        return q, k, 1.0, None, True, tuple((t, scores_shape, 1.0) for t in terms), None
    b = k.transpose(-2, -1)
    scale = 1.0 if case.scale is None else case.scale
    if len(terms) > 1:
        regrouped = [B[0] // case.windows, case.windows, B[1], s, s]
        return (q, b, scale, x["tscale"], False, ((terms[0], scores_shape, 1.0), (terms[1], regrouped, 1.0)),
                scores_shape)
    return q, b, scale, x["tscale"], False, tuple((t, scores_shape, 1.0) for t in terms), None


def _sdpa(case: Case, x: dict) -> Callable[[], Any]:
    """The block as the fused graph runs it: the rewrite's own call and arguments."""
    from explorer.fusions import attention

    q, k, v = x["q"], x["k"], x["v"]
    if case.form == "plain":
        mask = x["terms"][0] if x["terms"] else None
        scale = 1.0 if case.scale is None else case.scale
        return lambda: attention.fused_attention(q, k, v, scale, mask)
    a, b, scale, qscale, b_is_k, terms, shape = _forms_args(case, x)
    return lambda: attention.fused_attention_forms(a, b, v, scale, qscale, False, b_is_k, terms, shape)


def _triton(case: Case, x: dict) -> Callable[[], Any]:
    """The Triton scores→softmax kernel, then P·V as one matmul (``fused_capped_attention`` without a cap)."""
    from explorer.fusions import attention

    a, b, scale, qscale, b_is_k, terms, shape = _forms_args(case, x)
    p_shape = [*case.batch, case.s, case.s]
    return lambda: attention.fused_capped_attention(a, b, x["v"], scale, qscale, False, b_is_k, terms, shape, None,
                                                    p_shape, "triton")


def _reference(case: Case, r: dict):
    """float64: the model's formula on the candidates' own (rounded) inputs."""
    import torch

    q, k, v, terms, tscale = r["q"], r["k"], r["v"], r["terms"], r["tscale"]
    B, s = case.batch, case.s
    a = torch.matmul(q, k.transpose(-2, -1))
    if tscale is not None:
        a = a * tscale
    if case.scale is not None:
        a = a * case.scale
    if terms:
        a = a + terms[0]
    if len(terms) > 1:
        a = (a.view(B[0] // case.windows, case.windows, B[1], s, s) + terms[1]).view(-1, B[1], s, s)
    return torch.matmul(torch.softmax(a, dim=-1), v)


def _check(out, ref, dtype) -> dict:
    """Max error relative to the output's scale, against ``ATTENTION_TOLERANCES`` (atol and rtol at that scale)."""
    import torch
    from explorer.fusions import attention

    tol = attention.ATTENTION_TOLERANCES[dtype]
    o = out.double().reshape(ref.shape)
    scale = float(ref.abs().max()) or 1.0
    err = (o - ref).abs()
    ok = bool(torch.isfinite(o).all()) and bool((err <= tol["atol"] * scale + tol["rtol"] * ref.abs()).all())
    return dict(ok=ok, max_err_rel=float(err.max()) / scale, rel_l2=float((o - ref).norm() / ref.norm()))


def _time(cands: dict[str, Callable[[], Any]], device: str, rounds: int, log) -> dict:
    """Per-call µs of each candidate: warm-up, then ``rounds`` interleaved rounds of ``inner`` calls each."""
    import torch

    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    est = {}
    for name, fn in cands.items():                                  # warm-up (and the compile of a kernel)
        fn()
        sync()
        t = time.perf_counter()
        for _ in range(3):
            fn()
        sync()
        est[name] = (time.perf_counter() - t) / 3
    inner = {n: max(1, min(50, int(3e-4 / max(e, 1e-6)))) for n, e in est.items()}  # >= ~300 µs a sample
    samples: dict[str, list[float]] = {n: [] for n in cands}
    names = list(cands)
    for r in range(rounds):
        order = names[r % len(names):] + names[:r % len(names)]
        for name in order:
            fn, n = cands[name], inner[name]
            if device == "cuda":
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                for _ in range(n):
                    fn()
                end.record()
                end.synchronize()
                samples[name].append(start.elapsed_time(end) * 1000 / n)
            else:
                t = time.perf_counter()
                for _ in range(n):
                    fn()
                samples[name].append((time.perf_counter() - t) * 1e6 / n)
    out = {}
    for name, xs in samples.items():
        xs = sorted(xs)
        def q(f):
            return xs[min(len(xs) - 1, int(round(f * (len(xs) - 1))))]
        out[name] = dict(median_us=round(q(0.5), 2), p20_us=round(q(0.2), 2), p80_us=round(q(0.8), 2),
                         rounds=len(xs), inner=inner[name])
    return out


def _scores_kernel_applies(case: Case, dtype, device: str) -> bool:
    import torch
    from explorer.fusions import attention

    a = (*case.batch, case.s, case.d)
    b = (*case.batch, case.d, case.s)
    return attention.select_matmul_softmax(torch.device(device), dtype, dtype, a, b, True, True).impl == "triton"


def run_case(case: Case, dtype_name: str, device: str, rounds: int, with_triton: bool, log) -> dict:
    import torch

    dtype = getattr(torch, dtype_name)
    gen = torch.Generator().manual_seed(0)
    data = _inputs(case, dtype, device, gen)
    cands = {"sdpa": _sdpa(case, data["x"]), "unfused": _unfused(case, data["x"])}
    skipped = []
    if with_triton and _scores_kernel_applies(case, dtype, device):
        cands["triton"] = _triton(case, data["x"])
    else:
        skipped.append("triton: " + ("past its share of --budget-s, or --no-triton" if not with_triton
                                     else "select_matmul_softmax gives no kernel here"))
    ref = _reference(case, data["ref"])
    checks, eligible = {}, {}
    for name, fn in cands.items():
        try:
            out = fn()
            checks[name] = _check(out, ref, dtype)
        except Exception as exc:  # a candidate that cannot run here is reported, never timed
            checks[name] = dict(ok=False, error=f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}")
        if checks[name]["ok"]:
            eligible[name] = fn
    del ref, data["ref"]
    times = _time(eligible, device, rounds, log) if eligible else {}
    if device == "cuda":
        torch.cuda.empty_cache()
    from explorer.fusions import attention
    return dict(case=case.name, model=case.model, dtype=dtype_name, batch=list(case.batch), s=case.s, d=case.d,
                dv=case.dv, form=case.form, terms=len(data["x"]["terms"]), has_terms=bool(data["x"]["terms"]),
                tensor_scale=data["x"]["tscale"] is not None, s_bucket=attention.s_bucket(case.s),
                checks=checks, times=times, skipped=skipped)


def _table_lines(rows: list[dict]) -> list[str]:
    head = f"{'case':<36} {'dtype':<8} {'S':>5} {'D':>4} {'sdpa µs':>16} {'unfused µs':>16} {'triton µs':>16}  best"
    lines = [head, "-" * len(head)]
    for r in rows:
        cells = []
        for name in ("sdpa", "unfused", "triton"):
            t = r["times"].get(name)
            if t is None:
                bad = r["checks"].get(name)
                cells.append("check failed" if bad and not bad.get("ok") else "—")
            else:
                cells.append(f"{t['median_us']:.1f} [{t['p20_us']:.0f}-{t['p80_us']:.0f}]")
        best = min(r["times"], key=lambda n: r["times"][n]["median_us"]) if r["times"] else "—"
        lines.append(f"{r['case'][:36]:<36} {r['dtype']:<8} {r['s']:>5} {r['d']:>4} "
                     f"{cells[0]:>16} {cells[1]:>16} {cells[2]:>16}  {best}")
    return lines


# ====================================================================== bake: the JSON into the committed table

def bake(result: Path, table: Path = TABLE) -> dict:
    """Aggregate a run's cases into ``(device, dtype, S key, D, has terms)`` rows (the S key from each case's S by
    ``attention.s_bucket`` as it is now, not the bucket the run recorded) and write ``table``
    (``attention.TABLE_SCHEMA`` JSON, what ``select_attention`` reads).

    Per key, each candidate's median, p20 and p80 are summed over the key's cases (the corpus' time spent in that
    bucket), keeping the candidates every one of those cases timed after passing its float64 check;
    ``attention.measured_best`` then picks (another than SDPA only when clearly faster)."""
    import json

    from explorer.fusions import attention

    doc = json.loads(Path(result).read_text())
    device = doc["environment"]["device_name"]
    keys: dict[tuple, dict] = {}
    for row in doc.get("cases", []):
        if not row.get("times") or "sdpa" not in row["times"]:
            continue
        key = (device, row["dtype"], attention.s_bucket(row["s"]), row["d"], row["has_terms"])   # today's keying
        entry = keys.setdefault(key, dict(cases=[], names=None))
        names = set(row["times"])
        entry["names"] = names if entry["names"] is None else entry["names"] & names
        entry["cases"].append(row)
    rows = []
    for key, entry in sorted(keys.items(), key=lambda kv: str(kv[0])):
        us = {n: [round(sum(r["times"][n][q] for r in entry["cases"]), 1) for q in ("median_us", "p20_us", "p80_us")]
              for n in sorted(entry["names"])}
        row = dict(zip(("device", "dtype", "s_bucket", "d", "has_terms"), key), us=us,
                   s=sorted({r["s"] for r in entry["cases"]}), cases=sorted({r["case"] for r in entry["cases"]}))
        row["best"] = attention.measured_best(row)
        rows.append(row)
    out = dict(schema=attention.TABLE_SCHEMA,
               source=f"python3 benchmarks/bench_attention_choice.py --bake {result}",
               measured_by=doc.get("command"), date_utc=doc.get("date_utc"), environment=doc.get("environment"),
               note=("us: [median, p20, p80] µs per call, summed over the key's cases; best: measured_best's pick "
                     "among every candidate (the rewrite drops triton where the scores kernel does not apply)"),
               rows=rows)
    attention.read_table(json.dumps(out))      # what the selection will read back
    table.write_text(json.dumps(out, indent=1) + "\n")
    return {tuple(r[f] for f in ("device", "dtype", "s_bucket", "d", "has_terms")): r for r in rows}


# ====================================================================== main

def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="CPU plumbing check (tiny batches, no Triton)")
    parser.add_argument("--budget-s", type=float, default=40.0, help="start no case past this many seconds")
    parser.add_argument("--rounds", type=int, default=9, help="interleaved timing rounds per case")
    parser.add_argument("--no-triton", action="store_true", help="skip the Triton scores-kernel candidate")
    parser.add_argument("--only", default="", help="run only cases whose name contains this")
    parser.add_argument("--out", default=None, help="JSON path (default $OUT/" + FILENAME + ")")
    parser.add_argument("--bake", default=None, metavar="RESULT.json",
                        help="write explorer/fusions/attention_measured.json from a run's JSON and exit")
    args = parser.parse_args(argv)
    if args.bake:
        rows = bake(Path(args.bake))
        for key, val in rows.items():
            print(key, val["best"], {n: band[0] for n, band in val["us"].items()})
        print(f"wrote {TABLE}")
        return 0
    started = time.perf_counter()
    log = _common.elapsed_logger(started)
    device = _common.bench_device("bench_attention_choice.py", args.smoke)
    path = _common.results_path(args.out, FILENAME if not args.smoke else "bench_attention_choice_smoke_cpu.json")
    import torch

    env = dict(torch=torch.__version__, device=device,
               device_name=(torch.cuda.get_device_name() if device == "cuda" else "cpu (smoke)"))
    try:
        import triton
        env["triton"] = triton.__version__
    except ImportError:
        env["triton"] = None
    doc: dict[str, Any] = dict(schema=SCHEMA, **_common.run_stamp(),
                               label="SMOKE run on the CPU: not GPU numbers" if args.smoke else "GPU run",
                               environment=env, settings=dict(budget_s=args.budget_s, rounds=args.rounds),
                               cases=[], skipped=[])
    if device is None:
        return _common.write_skipped(doc, path, "bench_attention_choice.py")
    todo = [c for c in cases() if args.only in c.name]
    if args.smoke:
        todo = [dataclasses.replace(c, batch=(1,) * (len(c.batch) - 1) + (min(2, c.batch[-1]),),
                                    windows=1, dtypes=c.dtypes[:1]) for c in todo[:4] + todo[4:][-6:]]
    rounds = 3 if args.smoke else args.rounds
    # pass 1: every case in the dtype its corpus model runs in (with the Triton candidate); pass 2: the other
    # (Swin-T first: the loss this measures; then one of each other family, then the rest of the stages)
    first_models = ("tv/swin_t", "hf/bert", "hf/gpt2", "hf/llama", "hf/vit")
    todo.sort(key=lambda c: first_models.index(c.model) if c.model in first_models else len(first_models))
    passes = [(case, case.dtypes[0], True) for case in todo] + [(case, d, False) for case in todo
                                                                 for d in case.dtypes[1:]]
    for case, dtype_name, first in passes:
        elapsed = time.perf_counter() - started
        if elapsed > args.budget_s:
            doc["skipped"].append(f"{case.name} {dtype_name}: past --budget-s")
            continue
        with_triton = (not args.no_triton and (not args.smoke or os.environ.get("TRITON_INTERPRET") == "1")
                       and elapsed < (0.6 if first else 0.4) * args.budget_s)
        try:
            row = run_case(case, dtype_name, device, rounds, with_triton, log)
        except Exception as exc:  # one case's failure (an out-of-memory, a kernel error) must not lose the run
            doc["skipped"].append(f"{case.name} {dtype_name}: {type(exc).__name__}: "
                                  f"{str(exc).splitlines()[0][:200] if str(exc) else ''}")
            continue
        doc["cases"].append(row)
        bad = [n for n, c in row["checks"].items() if not c["ok"]]
        log(f"{case.name} {dtype_name}: " + ", ".join(f"{n} {t['median_us']:.1f} µs" for n, t in
                                                      row["times"].items()) + (f"; failed check: {bad}" if bad else ""))
        doc["wall_s"] = round(time.perf_counter() - started, 1)
        _common.write_json(path, doc)
    doc["wall_s"] = round(time.perf_counter() - started, 1)
    _common.write_json(path, doc)
    print("\n".join(_table_lines(doc["cases"])))
    if doc["skipped"]:
        print("skipped: " + "; ".join(doc["skipped"]))
    print(f"wrote {path} ({doc['wall_s']} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
