"""A small, complete typed report built from the dataclasses (no run): for the report, chart and app tests."""

from __future__ import annotations

from explorer import report as R


def _lat(ms: float) -> R.Latency:
    return R.Latency(median=ms, p20=ms * 0.95, p80=ms * 1.1, reps=40)


def _verdict(label: str, ratio: float | None = None, **kw) -> R.Verdict:
    return R.Verdict(label, ratio=ratio, ci_low=ratio and ratio * 0.97, ci_high=ratio and ratio * 1.03,
                     p_value=0.001 if ratio else None, n=40 if ratio else 0, rounds_needed=20, decided=True,
                     basis="synchronised calls", **kw)


def sample_report() -> R.Report:
    """A small but complete report: three chains with three verdicts, four stages, two baselines."""
    prec = R.Precision(max_abs=1e-6, max_rel=1e-7, rel_l2=2e-7, cosine=1.0, top1_agreement=1.0, finite=True)

    def meas(name: str, ms: float) -> R.Measurement:
        return R.Measurement(name=name, latency=_lat(ms), throughput=1000 / ms, kernel_launches=7,
                             launches_kind="aten ops (cpu)", bytes_moved=2**20, precision=prec)

    def chain(cid: str, label: str, ratio: float | None, kernel: bool = True, limited: str | None = None):
        return R.ChainResult(id=cid, title=f"layer: {cid}", pattern="conv_bn_act", status="fused", reason="",
                             implementation="cudnn", kernel="auto", fused_kernel=kernel,
                             verdict=_verdict(label, ratio), unfused=_lat(1.0), fused=_lat(ratio or 1.0),
                             limited_by=limited)

    return R.Report(
        model=R.ModelInfo(name="tiny", source="zoo", fingerprint="abc123", batch=2,
                          inputs=(R.InputInfo("x", (2, 3, 8, 8), "float32"),)),
        plan=R.PlanInfo(model="tiny", fingerprint="abc123", accepted=("a", "b", "c"), kernels={"a": "inductor"}),
        environment=R.Environment(device="cpu", device_name="CPU", is_cpu=True, note="CPU run",
                                  extra={"cpu_threads": 2, "tf32_cudnn": True, "host": "h"}),
        unfused=meas("unfused", 2.0), fused=meas("fused", 1.5), verdict=_verdict(R.FASTER, 0.75),
        settings={"dtype": "fp32", "quick": False, "compile_modes": ("default",)},
        fused_vs_unfused=prec,
        chains=(chain("a", R.FASTER, 0.8), chain("b", R.SLOWER, 1.2, limited=R.GPU),
                chain("c", R.NO_KERNEL, None, kernel=False)),
        stages=tuple(R.Stage(stage=s, label=s, differs="...", graph_ops=7 - i, fused_calls=i, batch_norms=0,
                             chains_fused=i, chains_folded=0, latency=_lat(2.0 - i / 10) if s != "all" else None,
                             same_as="activation" if s == "all" else None)
                     for i, s in enumerate(("none", "conv_bn", "activation", "all"))),
        baselines=(R.Baseline(name="fused", label="fused", method="fused", mode=None, cuda_graphs=False,
                              memory_format="nchw", measurement=meas("fused", 1.5)),
                   R.Baseline(name="torch_compile", label="torch.compile (default)", method="torch.compile",
                              mode="default", cuda_graphs=False, memory_format="nchw",
                              measurement=meas("torch_compile", 1.8), compile_s=12.5, pairs_with="fused",
                              verdict=_verdict(R.FASTER, 0.83))),
        notes=("a note",), duration_s=3.5)
