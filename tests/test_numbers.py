"""One model, one plan, one CPU run: every page, the command line and the report show the same figures.

The kernel launches (the device's, per kernel choice: ``explorer.launches`` through
``fusion_engine.launch_counts``), the speed-up with its interval (``Verdict.speedup`` / ``interval``: the
Hodges-Lehmann estimate of the paired ratios, ``explorer.stats``) and each chain's name (``Chain.title``) are computed once; this test reads them
back from the report, ``report.summary_table`` (the command line), and the Graph, Fusions, Run and Results
pages driven by AppTest, and checks they agree, with no raw None in any table.

Measured on ``residual_block`` (two chains) in-process on the CPU with few rounds: about 20 s.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from explorer import fusion_engine as fe
from explorer import report as R
from explorer.fusions.plan import make_plan
from explorer.runtime.session import measure
from explorer.runtime.settings import RunSettings
from explorer.ui import charts
from explorer.ui.files import escape_markdown

APP = str(Path(__file__).resolve().parent.parent / "explorer" / "app.py")


@pytest.fixture(scope="module")
def run(analyze_cached):
    analysis = fe.Analysis(*analyze_cached("residual_block"))
    plan = make_plan(analysis.detection)
    report = measure("residual_block", plan.to_dict(),
                     RunSettings(device="cpu", per_chain=True, stages=False, warmup=1, reps=10, cpu_threads=1))
    engine = fe.launch_counts(analysis, fe.fuse(analysis, plan, "cpu").applied, plan.accepted, "cpu")
    return analysis, plan, report, engine


def test_report_cli_and_engine_agree(run):
    analysis, plan, report, engine = run
    # launches: the CPU's (the conv epilogues run as separate ops), in the report as the engine counts them,
    # and the profiler measures the same saving
    assert (report.unfused.graph_launches, report.fused.graph_launches) == (engine.before, engine.after) == (7, 5)
    assert report.unfused.kernel_launches - report.fused.kernel_launches == engine.saved
    for c in report.chains:
        chain = analysis.detection.chain(c.id)
        assert c.title == chain.title                                 # the engine's one name (module path: ops)
        assert c.graph_launches_saved == engine.of(c.id).saved == c.launches_unfused - c.launches_fused
        assert c.speedup is not None and c.verdict.interval is not None
        lo, hi = c.verdict.interval
        assert lo <= c.speedup <= hi, (c.id, c.speedup, lo, hi)        # an estimate inside its own interval
    lo, hi = report.verdict.interval
    assert lo <= report.speedup <= hi and report.speedup == report.verdict.speedup
    text = R.summary_table(report)
    assert report.verdict.describe() in text and "None" not in text
    assert f"{engine.before} -> {engine.after} (saves {engine.saved})" in text
    assert text.count("speed-up") == 1 or "speed-up fused vs unfused" not in text   # one whole-model figure
    for c in report.chains:
        assert f"  {c.title}: {c.verdict.describe()}" in text


def _cells(at) -> list[str]:
    return [str(v) for d in at.dataframe for v in d.value.astype(str).to_numpy().ravel()]


def test_every_page_shows_the_same_figures(run):
    from streamlit.testing.v1 import AppTest

    analysis, plan, report, engine = run
    titles = [c.title for c in analysis.detection.chains]
    at = AppTest.from_file(APP, default_timeout=180)
    at.session_state["zoo_name"] = "residual_block"
    at.run()
    assert not at.exception, at.exception
    at.session_state["last_report"] = ("numbers", report)

    at.segmented_control(key="graph_mode").set_value("side").run()
    assert not at.exception
    md = [m.value for m in at.markdown]
    assert any(f"on **cpu** they save **{engine.saved}** kernel launches ({engine.before} → {engine.after})" in m
               for m in md), md
    assert any(f"{engine.after} kernel launches" in m and "After the accepted fusions" in m for m in md)
    assert any(f"from **{engine.before} to {engine.after} kernel launches** (−{engine.saved}" in m for m in md)
    assert any("dashed fused node" in m for m in md)                     # the fused view's legend, every style

    at.switch_page("ui/pages/fusions.py").run()
    assert not at.exception
    assert any(f"on cpu would save {engine.saved} kernel launches ({engine.before} → {engine.after})" in c.value
               for c in at.caption), [c.value for c in at.caption]
    table = at.dataframe[0].value if at.dataframe else next(iter(at.get("arrow_data_frame"))).value
    assert list(table["chain"]) == titles
    assert list(table["launches saved"]) == [engine.of(c.id).saved for c in analysis.detection.chains]

    for page in ("ui/pages/run.py", "ui/pages/results.py"):
        at.switch_page(page).run()
        assert not at.exception
        assert any(escape_markdown(charts.verdict_text(report)) in m.value for m in at.markdown)
        cells = _cells(at)
        assert "None" not in cells and "nan" not in cells, page
        assert charts.speedup_text(report.verdict) in " ".join(cells)      # the same figure and interval
        assert f"saves {engine.saved}" in cells
    chains = next(d.value for d in at.dataframe if "95% CI" in d.value.columns)
    by_id = {c.id: c for c in report.chains}
    assert sorted(chains["chain"]) == sorted(titles)
    for _, row in chains.iterrows():
        c = by_id[row["id"]]
        lo, hi = c.verdict.interval
        assert row["speed-up"] == f"{c.speedup:.2f}×" and row["95% CI"] == f"{lo:.2f}–{hi:.2f}×"


def test_a_busy_host_cannot_put_the_speed_up_outside_its_interval():
    """The bug behind "689.8× with interval 1.11–1.44×": the speed-up shown was unfused median ÷ fused median
    while the interval was the paired ratios'. On a host that is busy in about half of the rounds (both calls
    of a round slowed alike), the two medians fall in different modes; the paired ratio does not move."""
    import random

    from explorer import stats

    rng = random.Random(0)
    unfused, fused = [], []
    for i in range(41):
        busy = 700.0 if i % 2 == 0 else 1.0                 # every other round the host takes the CPU away
        base = 0.01 * busy * (1 + 0.02 * rng.random())
        unfused.append(base * 1.25)
        fused.append(base * (1 + 0.02 * rng.random()))
    fused[0], fused[2] = fused[0] / 700, fused[2] / 700       # two rounds where only the fused call ran unslowed
    medians = sorted(unfused)[20] / sorted(fused)[20]
    verdict = stats.compare(unfused, fused)
    lo, hi = verdict.interval
    assert not lo <= medians <= hi                            # the old figure: far outside the interval
    assert lo <= verdict.speedup <= hi and 1.15 < verdict.speedup < 1.3
    chain = R.ChainResult(id="c", title="t", pattern="conv_bn_act", status="fused", reason="", implementation="",
                          kernel="auto", fused_kernel=True, verdict=verdict, plain=verdict)
    assert chain.speedup == verdict.speedup and charts.speedup_text(verdict).startswith(f"{verdict.speedup:.2f}×")


@pytest.mark.parametrize("label, kernels", [
    ("BatchNorm folded (exact) + conv+bias + relu in place (2 kernels); cpu: no fused kernel for the conv epilogue, "
     "the ops run one after another", 2),
    ("BatchNorm folded (exact) + cudnn conv+bias+relu (1 fused call: cudnn_convolution_relu)", 1),
    ("BatchNorm folded (exact) + triton 1x1 conv as a GEMM + bias (1 kernel for a channels_last input; any other: "
     "conv + triton epilogue)", 1),
    ("cuBLASLt GEMM+bias+gelu epilogue where the device's epilogue computes gelu, else linear + gelu in place "
     "(2 kernels)", None),
    ("one GEMM over 3 concatenated weights (768+768+768 columns), split into views", 1),
    ("one GEMM over [W_gate; W_up] (4+4 columns), then triton silu*mul (1 elementwise kernel) reading its column "
     "views", 2),
    ("triton squeeze-excite: 2 kernels (squeeze+fc1, fc2+sigmoid+scale)", 2),
    ("triton add+layer_norm (1 kernel, 2 outputs)", 1),
    ("scaled_dot_product_attention on cpu (PyTorch's CPU attention kernel; no GPU fused kernel on cpu)", None),
])
def test_each_kernel_label_states_its_launches(label, kernels):
    from explorer import launches

    assert launches.stated_kernels(label) == kernels
