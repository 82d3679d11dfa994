"""The Learn page through ``streamlit.testing.v1.AppTest``, in English and 中文: every tab drawn, the guided
tour's fold by hand, the background profile, sweep and bisect, and a teaching report opened on the CPU."""

from __future__ import annotations

import importlib.util
import re
import sys
import time
from pathlib import Path

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
    assert len(at.image) >= 4
    tables = [df.value for df in at.dataframe]
    assert any("γ" in str(v.to_dict()) for v in tables)
    # the language switch changes the page in place
    at.radio(key="lang").set_value("en" if lang == "zh" else "zh").run()
    assert not at.exception and bool(CJK.search(at.tabs[0].label)) == (lang == "en")


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
    assert any("CPU profiling" in w.value for w in at.warning)
    keys = {c.proto.id for c in at.get("plotly_chart")}
    assert any("chart_breakdown" in k for k in keys), keys

    at.select_slider(key="sweep_batches").set_range(1, 2).run()
    at.button(key="sweep_start").click().run()
    _wait(at, "sweep")
    points = at.session_state["tasks"]["sweep"].result
    assert [(p.batch, p.dtype) for p in points] == [(1, "fp32"), (2, "fp32")] and all(p.speedup for p in points)
    assert any("chart_sweep" in c.proto.id for c in at.get("plotly_chart"))

    at.button(key="bisect_start").click().run()
    _wait(at, "bisect")
    result = at.session_state["tasks"]["bisect"].result
    assert len(result.ranked) == 2 and not result.drifts
    assert any("没有偏离" in s.value for s in at.success)
    assert not at.error, [e.value for e in at.error]


@pytest.fixture(scope="module")
def teaching_report(tmp_path_factory) -> Path:
    spec = importlib.util.spec_from_file_location("teach_reports_app", ROOT / "benchmarks" / "teach_reports.py")
    script = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = script
    spec.loader.exec_module(script)
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
