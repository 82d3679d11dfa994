"""The Learn page through ``streamlit.testing.v1.AppTest``, in English and 中文: every tab drawn, the guided
tour's fold by hand, the background profile, sweep and bisect, and a teaching report opened on the CPU."""

from __future__ import annotations

import re
import time
from pathlib import Path

import benchmark_scripts
import pytest

ROOT = Path(__file__).resolve().parents[1]
APP = str(ROOT / "explorer" / "app.py")
CJK = re.compile(r"[\u3400-\u9fff]")
MISSING_KEY = re.compile(r"\[[a-z_]+(\.[a-z_0-9]+)+\]")


def _learn(lang: str, model: str = "residual_block"):
    from streamlit.testing.v1 import AppTest

    at = AppTest.from_file(APP, default_timeout=240)
    at.session_state["zoo_name"] = model
    at.session_state["lang"] = lang
    at.run()
    assert not at.exception, at.exception
    at.switch_page("ui/pages/learn.py").run()
    assert not at.exception, at.exception
    return at


def _texts(at) -> list[str]:
    out = []
    for kind in ("markdown", "caption", "subheader", "success", "warning", "info", "error"):
        out += [str(e.value) for e in at.get(kind)]
    out += [t.label for t in at.tabs] + [e.label for e in at.expander]
    return out


def _wait(at, name: str, timeout: float = 180.0) -> None:
    end = time.time() + timeout
    while time.time() < end:
        job = at.session_state["tasks"].get(name)
        if job is not None and job.done:
            break
        time.sleep(0.3)
    at.run()
    assert not at.exception, at.exception


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_learn_page_draws_every_tab_in_both_languages(lang):
    at = _learn(lang)
    assert not at.error, [e.value for e in at.error]
    texts = _texts(at)
    missing = [t for t in texts if MISSING_KEY.search(t)]
    assert not missing, missing
    assert len(at.tabs) == 7
    chinese = [t for t in texts if CJK.search(t)]
    if lang == "zh":
        assert all(CJK.search(tab.label) for tab in at.tabs)
        assert len(chinese) > len(texts) // 2, texts[:10]
        assert any("内核启动" in t for t in texts) and any("中间结果" in t for t in texts)
    else:
        assert not chinese, chinese[:3]
    # the diagrams (drawn by the app as SVG) and the worked fold on the model's own weights
    assert len([m for m in at.markdown if "<svg" in m.value]) >= 4   # drawn inline, in the page's fonts
    tables = [df.value for df in at.dataframe]
    assert any("γ" in str(v.to_dict()) for v in tables)
    # the language switch changes the page in place
    at.radio(key="lang").set_value("en" if lang == "zh" else "zh").run()
    assert not at.exception and bool(CJK.search(at.tabs[0].label)) == (lang == "en")


def test_predicted_against_measured_from_this_sessions_run():
    from explorer.fusion_engine import analyze

    det = analyze("residual_block").detection
    chains = [{"id": c.id, "unfused_ms": 1.0, "fused_ms": 1.0 / speedup, "slower": False}
              for c, speedup in zip(det.chains, (1.2, 40.0))]
    at = _learn("en")
    at.session_state["last_report"] = ("k", {"version": 1, "plan": {"fingerprint": det.fingerprint},
                                             "settings": {"dtype": "fp32"}, "chains": chains, "stages": []})
    at.run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    assert any("chart_prediction" in c.proto.id for c in at.get("plotly_chart"))
    table = next(df.value for df in at.dataframe if "predicted gain" in df.value.columns)
    assert list(table["measured gain"]) == ["1.20×", "40.00×"]
    assert (table["why far"] != "close to the prediction").any()   # 40× is far from any prediction here


def test_the_tour_checks_a_fold_done_by_hand():
    from explorer.fusion_engine import analyze
    from explorer.teaching.examples import fold_example

    fold = fold_example(analyze("residual_block"))
    at = _learn("en")
    at.number_input(key="tour_scale").set_value(fold.scale * 1.1).run()
    assert any("Not yet" in w.value for w in at.warning)
    at.number_input(key="tour_scale").set_value(fold.scale).run()
    at.number_input(key="tour_bias").set_value(fold.folded_bias).run()
    assert any("Right" in s.value for s in at.success)
    assert at.session_state["tour_done"].get("fold")


def test_profile_sweep_and_bisect_run_in_the_background():
    at = _learn("zh")
    at.button(key="teach_profile").click().run()
    assert at.session_state["tasks"]["profile"] is not None
    _wait(at, "profile")
    assert not at.error, [e.value for e in at.error]
    # a CPU profile says what it can and cannot show, and where the GPU picture is (the committed H200 report)
    assert any("CPU 上的 profiling" in i.value and "teaching_report_h200.json" in i.value for i in at.info)
    keys = {c.proto.id for c in at.get("plotly_chart")}
    assert any("chart_breakdown" in k for k in keys), keys

    at.select_slider(key="sweep_batches").set_range(1, 2).run()
    at.button(key="sweep_start").click().run()
    _wait(at, "sweep")
    points = at.session_state["tasks"]["sweep"].result
    assert [(p.batch, p.dtype) for p in points] == [(1, "fp32"), (2, "fp32")] and all(p.speedup for p in points)
    assert all(p.verdict and p.decided is not None for p in points)   # each point's paired test, as in a run
    assert any("结论（配对检验）" in df.value.columns for df in at.dataframe)
    assert any("chart_sweep" in c.proto.id for c in at.get("plotly_chart"))

    at.button(key="bisect_start").click().run()
    _wait(at, "bisect")
    result = at.session_state["tasks"]["bisect"].result
    assert len(result.ranked) == 2 and not result.drifts
    assert any("没有偏离" in s.value for s in at.success)
    assert not at.error, [e.value for e in at.error]


@pytest.fixture(scope="module")
def teaching_report(tmp_path_factory) -> Path:
    script = benchmark_scripts.load("teach_reports", "teach_reports_app")
    out = tmp_path_factory.mktemp("teach_app") / "teaching_report.json"
    assert script.main(["--quick", "--models", "residual_block_fp32", "--no-chains", "--out", str(out)]) == 0
    return out


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_a_teaching_report_opens_without_a_gpu(teaching_report, lang):
    at = _learn(lang)
    at.file_uploader(key="teach_report_file").set_value(
        (teaching_report.name, teaching_report.read_bytes(), "application/json")).run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    assert at.session_state["teach_source"] == "report"
    keys = {c.proto.id for c in at.get("plotly_chart")}
    assert any("chart_breakdown" in k for k in keys) and any("chart_traffic" in k for k in keys), keys
    assert any(("CPU" in w.value) for w in at.warning)  # a CPU-measured report says so
    stages = [df.value for df in at.dataframe if len(df.value) == 4]
    assert stages, "the staged table from the report"
    at.file_uploader(key="teach_report_file").set_value(("broken.json", b'{"schema": "x"}', "application/json")).run()
    errors = [e.value for e in at.error]
    assert any("not a teaching report" in e for e in errors) and all("\n" not in e for e in errors)


# ------------------------------------------------------------------ the drawings and tables (pure view builders)

def test_diagrams_draw_the_round_trips_fusion_removes():
    from explorer.fusions import BY_NAME
    from explorer.ui import diagrams

    labels = {"chip": "on chip", "memory": "device memory", "kept_on_chip": "stay", "caption": "c"}
    red_tensor = f'stroke="{diagrams.ROUND_TRIP}" stroke-width="1.5"'
    spec = diagrams.spec_for_pattern(BY_NAME["conv_bn_act"])
    assert len(spec.ops) == 3
    unfused, fused = diagrams.svg(spec, False, labels), diagrams.svg(spec, True, labels)
    assert unfused.count(red_tensor) == 2 and fused.count(red_tensor) == 0
    assert diagrams.counts(spec, False) == {"launches": 3, "round_trips": 2, "input_reads": 1}
    assert diagrams.counts(spec, True)["launches"] == 1 and "t1, t2: stay" in fused
    kept = diagrams.DiagramSpec(ops=("add", "layer_norm"), inputs=("x", "r"), intermediates=(("t1", "8 KiB", True),))
    assert diagrams.svg(kept, True, labels).count(red_tensor) == 1   # the sum is still written for the residual
    qkv = diagrams.spec_for_pattern(BY_NAME["linear_siblings"])
    assert diagrams.counts(qkv, False)["input_reads"] == 3 and diagrams.counts(qkv, True)["input_reads"] == 1
    assert "<script" not in unfused and "http" not in unfused.replace("http://www.w3.org/2000/svg", "")


def test_breakdown_and_traffic_tables():
    from explorer.ui import teaching_views as views

    b = {"wall_ms": 2.0, "busy_ms": 1.5, "is_cpu": False,
         "categories_ms": {"launch_host": 0.5, "memory_bound": 1.0, "compute_bound": 0.4, "other": 0.1}}
    rows = views.breakdown_rows({"unfused": b, "fused": b})
    assert len(rows) == 5 and rows[0]["unfused %"] == "25%" and rows[-1]["unfused ms"] == 2.0
    assert rows[0]["reference article's claim %"] == "15%"
    fig = views.breakdown_figure({"unfused": b})
    assert [tr.name for tr in fig.data][:2] == ["kernel launch and host overhead", "memory-bound kernels"]
    traffic = {"chains": [{"id": "a", "title": "a", "pattern": "p", "bytes_unfused": 200, "bytes_fused": 100,
                           "bytes_saved": 100}],
               "total": {"bytes_unfused": 1000, "bytes_fused": 900, "bytes_saved": 100}}
    rows = views.traffic_rows(traffic)
    assert rows[-1]["saved"] == "10%" and rows[0]["saved"] == "50%"
    traffic["chains"][0]["pattern"] = "conv_bn_add_act"   # a pattern by its label, as every other table names it
    assert views.traffic_rows(traffic)[0]["pattern"] == "Conv+BN+Add+act"
    bars = views.traffic_figure(traffic, "resnet50")
    assert list(bars.data[0].x) == ["byte model", "reference article's claim (batch not stated)"]
