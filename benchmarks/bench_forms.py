"""The forms of issue 20 on the GPU: HF eager attention as SDPA, and the GeGLU / packed SwiGLU passes.

What it measures (bf16, one H200, each case fused against unfused in alternated rounds, the paired verdict of
``explorer.stats.compare``, precision against float64):

- ``hf_eager_attention``: transformers' ``eager_attention_forward`` at GPT-2-medium sizes (batch 4, 16 heads,
  1024 tokens, head dim 64): scores · scale + causal mask, ``softmax(s, dtype=float32).to(q.dtype)``, eval
  dropout, P·V. Captured, detected and rewritten by the explorer: the cast joins the chain, so the fused graph is
  one SDPA call; the unfused one is the captured graph (``measure.prepare_graph``), as the runner times them.
- ``geglu_pass``: Gemma-2-2B's GeGLU at 4 × 1024 tokens (I = 9216): ``F.gelu(gate, approximate="tanh") * up`` on
  the packed GEMM output's column views (eager) against ``swiglu.silu_mul_packed(gu, I, act="gelu_tanh")``.
- ``packed_swiglu_pass``: Phi-3-mini's packed ``gate_up_proj`` output (I = 8192) at 4 × 1024 tokens: eager
  ``silu(gate) * up`` against the packed Triton pass.

Usage::

    python3 benchmarks/bench_forms.py                 # the H200 run (about a minute), JSON under $OUT
    python3 benchmarks/bench_forms.py --smoke         # the CPU plumbing check (tiny sizes, Triton interpreted)

``--budget-s`` (default 300) starts no case past it; the JSON is rewritten after each case, so a cut run keeps
what it measured. Skipped: torch.compile baselines (bench_measured.py has them), profiles beyond one forward.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import _common  # noqa: E402

SCHEMA = "bench_forms/1"


def _attention_case(device: str, smoke: bool) -> tuple[dict, object, str]:
    """(variants, float64 reference, what) of the HF eager attention block through the explorer's rewrite."""
    import torch

    from explorer.fusion_engine import detect
    from explorer.fusions.plan import make_plan
    from explorer.fusions.rewrite import apply_plan
    from explorer.graph.build import build_graph
    from explorer.runtime import measure
    from explorer.sources import capture

    class HFEager(torch.nn.Module):
        def forward(self, q, k, v, mask):
            s = torch.matmul(q, k.transpose(2, 3)) * q.shape[-1] ** -0.5 + mask
            p = torch.nn.functional.softmax(s, dim=-1, dtype=torch.float32).to(q.dtype)
            p = torch.nn.functional.dropout(p, p=0.1, training=False)
            return torch.matmul(p, v)

    b, h, s, d = (1, 2, 24, 16) if smoke else (4, 16, 1024, 64)
    dtype = torch.bfloat16
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(b, h, s, d, generator=gen) for _ in range(3))
    mask = torch.triu(torch.full((s, s), torch.finfo(torch.float32).min), 1).expand(b, 1, s, s)
    gm = capture(HFEager().eval(), (q, k, v, mask), "hf_eager_attention")
    det = detect(build_graph(gm, "hf_eager_attention"))
    fused = apply_plan(gm, det, make_plan(det, ["matmul_softmax"]), device)
    applied = [a for a in fused.applied if a.pattern == "matmul_softmax"]
    x = measure.prepare_inputs((q, k, v, mask), device, dtype)
    casts, _ = measure.record_casts(HFEager().eval(), (q, k, v, mask), gm, dtype)   # the model's fp32 softmax kept
    unfused_gm = measure.prepare_graph(gm, device, dtype, casts=casts)
    fused_gm = measure.prepare_graph(fused.gm, device, dtype, casts=casts)
    with torch.inference_mode():
        ref = measure.prepare_graph(gm, device, torch.float64)(*measure.prepare_inputs((q, k, v, mask), device,
                                                                                       torch.float64))
    variants = {"unfused": lambda: unfused_gm(*x), "fused": lambda: fused_gm(*x)}
    what = (f"B={b} H={h} S={s} D={d} bf16; chain {det.counts.get('matmul_softmax', 0)}, "
            f"{[(a.status, a.impl) for a in applied]}")
    return variants, ref, what


def _gated_case(device: str, smoke: bool, act: str, i: int) -> tuple[dict, object, str]:
    """(variants, float64 reference, what) of the gated pass on one packed (M, 2I) GEMM output."""
    import torch

    from explorer.fusions import swiglu

    m = 48 if smoke else 4 * 1024
    i = 40 if smoke else i
    gen = torch.Generator().manual_seed(1)
    gu = (torch.randn(m, 2 * i, generator=gen) * 2).to(device=device, dtype=torch.bfloat16)
    ref = swiglu.silu_mul_packed_reference(gu.double(), i, act)

    def eager():
        gate, up = gu.split((i, i), dim=-1)
        return swiglu.gate_act(gate, act) * up

    variants = {"unfused": eager, "fused": lambda: swiglu.silu_mul_packed(gu, i, act=act)}
    return variants, ref, f"M={m} I={i} bf16, {act}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="tiny sizes on the CPU (Triton interpreted)")
    parser.add_argument("--budget-s", type=float, default=300.0, help="start no case after this many seconds")
    parser.add_argument("--out", default=None, help="the JSON path (default $OUT/bench_forms_h200.json)")
    args = parser.parse_args(argv)
    if args.smoke:
        os.environ.setdefault("TRITON_INTERPRET", "1")
    import torch

    from explorer import stats

    started = time.perf_counter()
    log = _common.elapsed_logger(started)
    path = _common.results_path(args.out, "bench_forms_smoke.json" if args.smoke else "bench_forms_h200.json")
    doc = {"schema": SCHEMA, **_common.run_stamp(), "label": "SMOKE (CPU: not GPU numbers)" if args.smoke else "",
           "environment": {"torch": torch.__version__,
                           "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"},
           "cases": {}, "skipped": []}
    device = _common.bench_device("bench_forms.py", args.smoke)
    if device is None:
        return _common.write_skipped(doc, path, "bench_forms.py", "plumbing check")
    cases = [("hf_eager_attention", lambda: _attention_case(device, args.smoke)),
             ("geglu_pass", lambda: _gated_case(device, args.smoke, "gelu_tanh", 9216)),
             ("packed_swiglu_pass", lambda: _gated_case(device, args.smoke, "silu", 8192))]
    lines = []
    for name, build in cases:
        if time.perf_counter() - started > args.budget_s:
            doc["skipped"].append(f"{name}: past --budget-s {args.budget_s:.0f}")
            continue
        try:
            variants, ref, what = build()
            rows = _common.session(variants, ref, device, args.smoke, log, name,
                                   lambda fn, dev: _common.profile_forward(fn, dev, 5, False))
            verdict = stats.compare(rows["unfused"]["samples_ms"], rows["fused"]["samples_ms"])
            doc["cases"][name] = {"what": what, "variants": rows, "verdict": dataclasses.asdict(verdict),
                                  "speedup": verdict.speedup}
            med = {v: rows[v]["latency_ms"]["median"] for v in rows}
            speedup = verdict.speedup
            lines.append(f"{name:20s} unfused {med['unfused']:.4f} ms  fused {med['fused']:.4f} ms  "
                         f"speed-up {speedup if speedup is None else round(speedup, 3)} {verdict.label}  rel_l2 "
                         f"{rows['unfused']['precision']['rel_l2']:.2e} -> {rows['fused']['precision']['rel_l2']:.2e}"
                         f"  ({what})")
        except Exception as exc:  # one case's failure keeps the others
            doc["cases"][name] = {"failed": f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"}
            lines.append(f"{name:20s} FAILED {doc['cases'][name]['failed']}")
        _common.write_json(path, doc)
    _common.write_json(path, doc)
    print("\n".join(lines))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
