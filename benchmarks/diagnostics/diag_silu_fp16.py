"""Why bench_membw's fp16 check of the SwiGLU pass failed on the H200: fused vs eager vs float64, worst elements."""
import torch
from explorer.fusions import swiglu

dev = "cuda"
for m, i in ((16384, 1376), (4096, 14336)):
    for packed in (False, True):
        for rep in range(2):
            torch.manual_seed(rep)
            if packed:
                gu = torch.randn(m, 2 * i, device=dev, dtype=torch.bfloat16); gu[:, :i] *= 3; gu = gu.half()
                g, u = gu[:, :i], gu[:, i:]
                out = swiglu.silu_mul_packed(gu, i)
            else:
                g = (torch.randn(m, i, device=dev, dtype=torch.bfloat16) * 3).half()
                u = torch.randn(m, i, device=dev, dtype=torch.bfloat16).half()
                out = swiglu.silu_mul(g, u)
            eager = torch.nn.functional.silu(g) * u
            f64 = torch.nn.functional.silu(g.double()) * u.double()
            te, t64 = swiglu.EAGER_TOLERANCES[torch.float16], swiglu.TOLERANCES[torch.float16]
            d_e = (out.double() - eager.double()).abs()
            bad_e = d_e > te["atol"] + te["rtol"] * eager.double().abs()
            d_64 = (out.double() - f64).abs()
            bad_64 = d_64 > t64["atol"] + t64["rtol"] * f64.abs()
            de64 = (eager.double() - f64).abs()
            bad_e64 = de64 > t64["atol"] + t64["rtol"] * f64.abs()
            line = (f"{m}x{i} packed={packed} rep={rep}: fused~eager bad {int(bad_e.sum())}, fused~f64 bad {int(bad_64.sum())}, "
                    f"eager~f64 bad {int(bad_e64.sum())}; max|fused-eager| {d_e.max().item():.3g}")
            if bad_e.any():
                k = torch.nonzero(bad_e)[0]; r, c = int(k[0]), int(k[1])
                line += (f"; first bad at ({r},{c}): g={g[r, c].item():.6g} u={u[r, c].item():.6g} fused={out[r, c].item():.6g} "
                         f"eager={eager[r, c].item():.6g} f64={f64[r, c].item():.6g}; bad |eager| max {eager.double().abs()[bad_e].max().item():.3g}")
            print(line, flush=True)
