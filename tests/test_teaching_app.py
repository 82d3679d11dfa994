"""The Learn page through ``streamlit.testing.v1.AppTest``, in English and 中文: every tab drawn, the guided
tour's fold by hand, the profile, sweep and bisect in a child process (started, their progress, their results,
cancelled, a child killed, a task past its time limit), and a teaching report opened on the CPU."""

from __future__ import annotations

import os
import re
import signal
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
    from explorer.ui.i18n import t_in

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
    # the device's ceilings with their sources, whole sentences, in a table that wraps (a grid cut them off)
    source = "来源" if lang == "zh" else "source"
    ceilings = [tb.value for tb in at.table if source in list(tb.value.columns)]
    assert ceilings and max(len(str(v)) for v in ceilings[0][source]) > 60
    # the tour's and the worked examples' fused captions say the CPU's launches (conv+BN+ReLU runs as two there:
    # the conv, then ReLU in place), the engine's one count as on the Graph page, not the one kernel drawn (issue 26)
    from explorer.fusion_engine import analyze, chain_launch_table

    analysis = analyze("residual_block")
    counted = chain_launch_table(analysis, None, "cpu").of(analysis.detection.chains[0].id)
    assert counted.fused == 2   # the premise: the CPU runs this chain as two launches
    svgs = [m.value for m in at.markdown if "<svg" in m.value]
    said = "在这台 CPU 上 2 次内核启动" if lang == "zh" else "2 launch(es) on this CPU"
    assert len([s for s in svgs if said in s]) >= 2, [re.findall(r"\d+ launch\(es\)[^<]*", s) for s in svgs]
    saves = t_in(lang, "learn.pattern.saves", launches=counted.saved, bytes="")   # the Patterns tab's column
    assert any(saves.rstrip() in str(v.to_dict()) for v in tables), saves
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


def _answered(at, name: str, timeout: float = 120.0):
    """The task once its child has started and sent its first status (or the task has ended)."""
    end = time.time() + timeout
    while time.time() < end:
        job = at.session_state["tasks"].get(name)
        if job is not None and (job.done or (job.pid and not job.message.startswith("starting the task's"))):
            return job
        time.sleep(0.1)
    raise AssertionError(f"task {name} never answered")


def _group_gone(pid: int) -> bool:
    """Whether nothing is left of a task child's process group (the child, the sweep's workers)."""
    try:
        os.killpg(pid, 0)
    except ProcessLookupError:
        return True
    return False


def _progress_texts(at) -> list[str]:
    return [str(p.proto.text) for p in at.get("progress")]


def _never_here(*_args, **_kwargs):
    raise AssertionError("the app process ran a Learn task itself")


def test_profile_sweep_and_bisect_run_in_a_child_process(tmp_path, monkeypatch):
    """Each task in a child process: the app's own copies of the three computations raise if called here. Its
    progress says the time left; its result is drawn; the sweep is a sweep folder that the Sweeps page opens."""
    from explorer.runtime import bisect, breakdown
    from explorer.sweeps import chain, runner

    for module, name in ((breakdown, "model_breakdowns"), (bisect, "precision_bisect"), (chain, "sweep_chain"),
                         (runner, "run_sweep")):
        monkeypatch.setattr(module, name, _never_here)
    monkeypatch.setenv("FUSION_EXPLORER_SWEEPS_ROOT", str(tmp_path))
    at = _learn("zh")
    at.button(key="teach_profile").click().run()
    at.button(key="bisect_start").click().run()   # two children at once: the page polls both
    job = _answered(at, "profile")
    at.run()
    assert job.pid and job.pid != os.getpid()
    statuses = _progress_texts(at)
    assert any("秒" in text for text in statuses), statuses   # the time left, in 中文
    _wait(at, "profile")
    _wait(at, "bisect")
    assert not at.error, [e.value for e in at.error]
    assert _group_gone(job.pid)
    # a CPU profile says what it can and cannot show, and where the GPU picture is (the committed H200 report)
    assert any("CPU 上的 profiling" in i.value and "teaching_report_h200.json" in i.value for i in at.info)
    keys = {c.proto.id for c in at.get("plotly_chart")}
    assert any("chart_breakdown" in k for k in keys), keys

    at.select_slider(key="sweep_batches").set_range(1, 1).run()
    at.button(key="sweep_start").click().run()
    _answered(at, "sweep")
    at.run()
    statuses += _progress_texts(at)
    _wait(at, "sweep")
    job = at.session_state["tasks"]["sweep"]
    assert job.error is None and not job.cancelled, job.error
    points = job.result["points"]
    assert [(p["batch"], p["dtype"]) for p in points] == [(1, "fp32")] and all(p["speedup"] for p in points)
    assert all(p["verdict"] and p["decided"] is not None for p in points)   # each point's paired test, as in a run
    assert any("结论（配对检验）" in df.value.columns for df in at.dataframe)
    assert any("chart_sweep" in c.proto.id for c in at.get("plotly_chart"))
    folder = Path(job.result["folder"])
    assert folder.parent == tmp_path / "learn" and (folder / "results.jsonl").is_file()

    result = at.session_state["tasks"]["bisect"].result["bisect"]
    assert len(result["ranked"]) == 2 and not result["drifts"]
    assert any("没有偏离" in s.value for s in at.success)
    assert not at.error, [e.value for e in at.error]
    from test_i18n import _shown_texts, english_prose   # the 中文 check: no English left, results and statuses

    names = {"Wilcoxon", "profiler"}   # a test's and a tool's names, in the panels only a finished task shows
    left = sorted({f"{w}: {x[:100]!r}" for x in _shown_texts(at) + statuses for w in english_prose(x)
                   if w not in names})
    assert not left, "English left in 中文:\n" + "\n".join(left[:30])

    at.button(key="sweep_open").click().run()   # the sweep, on the Sweeps page
    assert not at.exception, at.exception
    assert at.session_state["sweeps_folder"] == os.path.relpath(folder, tmp_path)
    assert any("chart_sweep_speedup" in c.proto.id for c in at.get("plotly_chart"))


def test_each_task_stops_when_cancelled(tmp_path, monkeypatch):
    """Cancel, pressed while each task's child runs: the child and its process group end, the page says so."""
    monkeypatch.setenv("FUSION_EXPLORER_SWEEPS_ROOT", str(tmp_path))
    at = _learn("en")
    for name, start, stop in (("profile", "teach_profile", "profile_cancel"), ("sweep", "sweep_start", "sweep_cancel"),
                              ("bisect", "bisect_start", "bisect_cancel")):
        at.button(key=start).click().run()
        job = _answered(at, name)
        at.run()
        assert any("left" in text for text in _progress_texts(at)), (name, _progress_texts(at))
        assert not at.button(key=stop).disabled
        at.button(key=stop).click().run()
        _wait(at, name, 60)
        assert job.cancelled and job.error is None, (name, job.error)
        assert _group_gone(job.pid), name
        warnings = [w.value for w in at.warning]
        assert any(w.startswith("Cancelled") for w in warnings), (name, warnings)
        assert not at.error and not at.exception


def test_a_killed_child_and_a_task_past_its_limit_are_one_line_each():
    """The profile's child killed mid-task, and a bisect given one second: one line each; the app lives on."""
    at = _learn("en")
    at.button(key="teach_profile").click().run()
    job = _answered(at, "profile")
    os.kill(job.pid, signal.SIGKILL)
    _wait(at, "profile", 60)
    errors = [e.value for e in at.error]
    assert len(errors) == 1 and "killed by SIGKILL" in errors[0] and "\n" not in errors[0], errors
    assert len(at.tabs) == 7 and not at.exception   # the page and its other tabs, drawn as before

    at.number_input(key="bisect_timeout").set_value(1).run()
    at.button(key="bisect_start").click().run()
    _wait(at, "bisect", 60)
    job = at.session_state["tasks"]["bisect"]
    assert job.error and "timed out after 1 s" in job.error
    errors = [e.value for e in at.error]
    assert len(errors) == 2 and all("\n" not in e for e in errors) and "timed out after 1 s" in errors[1], errors
    assert _group_gone(job.pid) and not at.exception


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
    small = {"chains": [], "total": {"bytes_unfused": int(0.956 * 2**20), "bytes_fused": int(0.331 * 2**20)}}
    labels = [bar.text[0] for bar in views.traffic_figure(small).data]
    assert labels == ["0.956", "0.331"], labels   # as the table beside it says (the chart said 1.0 and 0.3)
    traffic["chains"][0]["pattern"] = "conv_bn_add_act"   # a pattern by its label, as every other table names it
    assert views.traffic_rows(traffic)[0]["pattern"] == "Conv+BN+Add+act"
    bars = views.traffic_figure(traffic, "resnet50")
    assert list(bars.data[0].x) == ["byte model", "reference article's claim (batch not stated)"]

