"""The app's views and flows: chart builders, file handling, and AppTest flows (the graph view's
own tests are in ``tests/test_graph_view.py``).

AppTest drives the app by widget key on a small zoo model and runs it on the CPU through the
real ``explorer.gpu_runner`` (a child process), so the flow tests take a minute or two.
"""

from __future__ import annotations

import io
import json
import pickle
import time
import zipfile
from pathlib import Path

import pytest

from explorer.ui import charts
from explorer.ui import files as ui_files
from explorer.fusion_engine import analyze
from report_samples import sample_report

APP = str(Path(__file__).resolve().parent.parent / "explorer" / "app.py")


# ------------------------------------------------------------------ charts (pure)

def _report():
    """The typed sample report (tests/report_samples.py): chains a (faster), b (slower, GPU-bound),
    c (no fused kernel), four stages ('all' the same graph as '+ epilogues'), a torch.compile baseline."""
    return sample_report()


def test_comparison_figure_has_error_bars_baselines_and_missing_memory():
    fig = charts.comparison_figure(_report())
    latency = [t for t in fig.data if t.xaxis in ("x", None)]
    assert [t.name for t in latency] == ["unfused", "fused", "torch.compile (default)"]   # baselines are bars
    assert latency[0].error_y.arrayminus[0] == pytest.approx(0.1)
    assert latency[0].error_y.array[0] == pytest.approx(0.2)
    memory_texts = [t.text[0] for t in fig.data if t.xaxis == "x3"]
    assert memory_texts == ["n/a", "n/a", "n/a"]
    rows = charts.summary_rows(_report())   # the latency row's change is THE speed-up, with its interval
    assert rows[0]["change, fused against unfused"] == "speed-up 1.33× [95% CI 1.29–1.37×]"
    assert None not in [v for r in rows for v in r.values()]
    # bytes under 10 MiB with the chart's three digits (a table "1.0 -> 0.3" sat beside the chart's 0.956 -> 0.331)
    assert [r["unfused"] for r in rows if r["metric"] == "Bytes moved (MiB)"] == ["1.000"]
    baselines = {r["variant"]: r for r in charts.baseline_rows(_report())}
    compiled = baselines["torch.compile (default)"]
    assert compiled["compared with"] == "fused" and compiled["compile s"] == "12.5"
    assert compiled["verdict (fused vs this)"] == "faster" and compiled["median ms"] == "1.800"


def test_chain_bars_styled_by_the_one_verdict_and_slower_has_its_own_colour():
    from explorer import report as R
    from explorer.fusions import PATTERNS, UNKNOWN_COLOR, color_of

    fig = charts.chain_speedup_figure(_report())
    bars = fig.data[0]
    assert list(bars.x) == sorted(bars.x)
    by_chain = dict(zip(bars.y, zip(bars.marker.color, bars.marker.pattern.shape)))
    assert by_chain["layer: b"] == (charts.SLOWER_COLOR, charts.SLOWER_PATTERN)            # verdict: slower
    assert by_chain["layer: a"] == (color_of("conv_bn_act"), "")                           # verdict: faster
    assert "layer: c" not in by_chain                     # no fused kernel: not timed, so no bar (and no 1.00x)
    assert charts.bar_style(R.NO_KERNEL, "conv_bn_act") == (charts.NO_KERNEL_COLOR, charts.NO_KERNEL_PATTERN, 1.0)
    assert any(t.name == "slower after fusion" for t in fig.data)
    # a bar below 1x ends on the left, over the chains' names: its label sits right of the no-change line instead
    labels = dict(zip(bars.y, bars.text))
    slower = next(c for c in _report().chains if c.title == "layer: b")
    assert labels["layer: b"] == "" and labels["layer: a"]
    moved = [a for a in fig.layout.annotations if a.y == "layer: b"]
    assert len(moved) == 1 and moved[0].x == 0.0 and moved[0].xanchor == "left"
    assert moved[0].text == charts.speedup_text(slower.verdict)
    # the legend sits below the axis title whatever the chart's height (it covered the title on a two-chain run)
    layout = fig.layout
    plot_px = layout.height - layout.margin.t - layout.margin.b
    assert layout.legend.yanchor == "top" and -layout.legend.y * plot_px >= 55 and layout.margin.b >= 100

    def rgb(color: str) -> tuple[int, ...]:
        return tuple(int(color[i:i + 2], 16) for i in (1, 3, 5))

    def distance(a: str, b: str) -> float:
        return sum((x - y) ** 2 for x, y in zip(rgb(a), rgb(b))) ** 0.5

    for color in [p.color for p in PATTERNS] + [UNKNOWN_COLOR, charts.UNFUSED_COLOR, charts.FUSED_COLOR]:
        assert distance(charts.SLOWER_COLOR, color) > 100, color   # never a pattern's colour (MatMul+Softmax was red)
    assert distance(charts.NO_KERNEL_COLOR, charts.SLOWER_COLOR) > 100


def test_chain_rows_and_slower_split_by_what_limits_them():
    import dataclasses

    from explorer import report as R

    report = _report()
    rows = {r["id"]: r for r in charts.chain_rows(report)}
    assert rows["b"]["verdict"] == R.SLOWER and rows["b"]["limited by"] == R.GPU and rows["b"]["p"] == "0.001"
    assert rows["a"]["chain"] == "layer: a" and rows["a"]["95% CI"]
    assert rows["c"]["verdict"] == R.NO_KERNEL
    assert "speed-up, CUDA graph" not in rows["a"]                     # no graph timings in this report
    assert "kernel" not in rows["a"]                                   # no kernel chosen: no column
    assert charts.slower_where(report) == {"host": [], "gpu": ["b"], "unknown": []}
    chains = list(report.chains)
    chains[1] = dataclasses.replace(chains[1], limited_by=R.HOST, unfused_graph=chains[1].unfused,
                                    fused_graph=chains[1].unfused, graph=R.Verdict(R.SAME, ratio=1.0))
    report = dataclasses.replace(report, chains=tuple(chains))
    rows = {r["id"]: r for r in charts.chain_rows(report)}
    assert rows["b"]["speed-up, CUDA graph"] == "1.00× (medians, no paired test)"
    assert charts.slower_where(report) == {"host": ["b"], "gpu": [], "unknown": []}


H200_REPORT = Path(__file__).resolve().parent.parent / "benchmarks" / "results" / \
    "report_resnet50_fp16_channels_last_h200.json"


def test_load_report_reads_a_real_report_and_refuses_the_rest():
    report = ui_files.load_report("r.json", H200_REPORT.read_bytes())
    assert report.environment.device_name.startswith("NVIDIA") and len(report.chains) == 53
    assert report.upgraded_from == 1
    bad = {
        "garbage.json": (b"\x80\x81 not text", "not a JSON report"),
        "truncated.json": (H200_REPORT.read_bytes()[:500], "not a JSON report"),
        "list.json": (b"[1, 2]", "JSON list, not an object"),
        "plan.json": (json.dumps({"model": "x", "accepted": []}).encode(), "no integer 'version'"),
        "chains.json": (json.dumps({"version": 1, "unfused": {"latency_ms": {}}, "fused": {"latency_ms": {}},
                                    "chains": {"a": 1}}).encode(), "'chains' is not a list"),
        "typed.json": (json.dumps({**_report().to_dict(), "chains": [{"id": 3}]}).encode(),
                       "'chains[0].id' must be a string"),
    }
    for name, (data, needle) in bad.items():
        with pytest.raises(ui_files.ReportError) as err:
            ui_files.load_report(name, data)
        message = str(err.value)
        assert needle in message and name in message and "\n" not in message, message
    with pytest.raises(ui_files.ReportError, match="over the report limit"):
        ui_files.load_report("big.json", b" " * (ui_files.MAX_REPORT_MB * 2**20 + 1))


def test_stages_and_precision_tables():
    rows = charts.stages_rows(_report())
    assert [r["stage"] for r in rows] == ["none", "conv_bn", "activation", "all"]   # all four, always
    assert rows[2]["speed-up over the original (medians)"] == f"{2.0 / 1.8:.2f}×"
    # the row above's graph, said short (the long form pushed the table's last column off a 1600 px window)
    assert rows[3]["latency ms (median)"] == "same graph as the row above: not timed again" and rows[3]["graph"] == "..."
    import dataclasses

    report = _report()
    far = dataclasses.replace(report, stages=report.stages[:3] + (dataclasses.replace(report.stages[3],
                                                                                      same_as="conv_bn"),))
    assert charts.stages_rows(far)[3]["latency ms (median)"] == "same graph as 'conv_bn': not timed again"
    assert [b.x for b in charts.stages_figure(_report()).data][0] == ("none", "conv_bn", "activation")
    prec = charts.precision_rows(_report())
    assert prec[0]["max_abs"] == "1.00e-06" and prec[1]["top1_agreement"] == "1.000000000"
    assert prec[0]["why no relative figures"] == "—"
    assert charts.chain_precision_figure(_report()).data is not None


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_a_cpu_reports_memory_cells_fit_their_column(lang):
    """The Results tables' peak-memory cells on a CPU report were a whole sentence, cut off in Chromium at
    1600×1000 (issue 26): they are a short "n/a on the CPU", the reason one caption below the table."""
    path = Path(__file__).resolve().parent.parent / "benchmarks" / "results" / "report_resnet50_cpu.json"
    report = ui_files.load_report(path.name, path.read_bytes())
    assert report.is_cpu
    memory = [(r, k) for r in charts.summary_rows(report, lang) for k in list(r)[1:3]
              if "MiB" in str(list(r.values())[0])]
    memory_cells = [r[k] for r, k in memory]
    memory_cells += [v for r in charts.stages_rows(report, lang) for k, v in r.items() if "MiB" in k]
    assert len(memory_cells) >= 4, memory_cells
    assert all(len(c) <= 14 for c in memory_cells), memory_cells   # fits the narrowest column at 1600 px


# ------------------------------------------------------------------ files

def _zip(members: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        for name, data in members.items():
            z.writestr(name, data)
    return buf.getvalue()


def test_zip_extraction_refuses_escapes():
    from explorer.errors import ModelLoadError

    for bad in ("../evil.onnx", "/abs/model.onnx", "a/../../x.onnx"):
        with pytest.raises(ModelLoadError):
            ui_files.extract_zip(_zip({bad: b"x", "model.onnx.data": b"y"}), "bad.zip")
    with pytest.raises(ModelLoadError):
        ui_files.extract_zip(b"not a zip", "bad.zip")
    path = ui_files.extract_zip(_zip({"m/model.onnx": b"x", "m/model.onnx.data": b"y"}), "ok.zip")
    assert Path(path).name == "model.onnx" and (Path(path).parent / "model.onnx.data").read_bytes() == b"y"
    with pytest.raises(ModelLoadError):
        ui_files.check_size("big.onnx", ui_files.MAX_UPLOAD_BYTES + 1)


def test_report_csv():
    """The CSV export reads the typed report: measurements, every chain's verdict, stages, baselines."""
    import csv

    rows = list(csv.reader(io.StringIO(ui_files.report_csv(_report()))))
    assert rows[0] == ["section", "name", "metric", "value"]
    cells = {(r[0], r[1], r[2]): r[3] for r in rows[1:]}
    assert float(cells[("model", "unfused", "latency.median")]) == 2.0
    assert cells[("chain", "b", "verdict.label")] == "slower" and cells[("chain", "b", "title")] == "layer: b"
    assert cells[("chain", "c", "verdict.label")] == "no fused kernel here"
    assert cells[("stage", "all", "same_as")] == "activation"
    assert cells[("baseline", "torch_compile", "compile_s")] == "12.5"
    assert cells[("model", "fused vs unfused", "verdict.label")] == "faster"


# ------------------------------------------------------------------ AppTest flows

def _app(model: str = "residual_block"):
    from streamlit.testing.v1 import AppTest

    at = AppTest.from_file(APP, default_timeout=180)
    at.session_state["zoo_name"] = model
    at.run()
    assert not at.exception, at.exception
    return at


def _accepted(at) -> set[str]:
    spec = at.session_state["active"]
    _, _, det = analyze(spec.source)
    return set(at.session_state["accepted"][det.fingerprint])


def _wait_run(at, timeout: float = 300) -> None:
    end = time.time() + timeout
    while time.time() < end:
        job = at.session_state["run_job"]
        if job is None or job.done:
            break
        time.sleep(0.5)
    at.run()
    assert not at.exception, at.exception


def test_app_flow_choose_run_results_plan(tmp_path):
    t0 = time.perf_counter()
    at = _app("residual_block")
    assert at.session_state["active"].source == "residual_block"
    assert not at.error
    _, _, det = analyze("residual_block")
    ids = [c.id for c in det.chains]
    assert _accepted(at) == set(ids)

    # Fusions page: reject one chain, then accept it again and reject the other
    at.switch_page("ui/pages/fusions.py").run()
    at.selectbox(key="chain_pick").set_value(ids[0]).run()
    at.button(key="chain_reject").click().run()
    assert _accepted(at) == {ids[1]}
    at.button(key="chain_accept").click().run()
    at.selectbox(key="chain_pick").set_value(ids[1]).run()
    at.button(key="chain_reject").click().run()
    assert _accepted(at) == {ids[0]}
    # the table's accept column drives the same choices
    version = at.session_state["editor_version"]
    at.session_state[f"chains_editor_{version}"] = {"edited_rows": {1: {"accept": True}},
                                                     "added_rows": [], "deleted_rows": []}
    at.run()
    assert _accepted(at) == set(ids)
    at.button(key="bulk_reject_all").click().run()
    assert _accepted(at) == set()
    at.button(key="bulk_accept_all").click().run()
    at.selectbox(key="chain_pick").set_value(ids[1]).run()
    at.button(key="chain_reject").click().run()
    assert _accepted(at) == {ids[0]}
    assert at.dataframe  # near misses / table drawn

    # Run page: measure on the CPU with the real runner
    at.switch_page("ui/pages/run.py").run()
    at.checkbox(key="run_quick").check().run()
    clicked = time.time()
    at.button(key="run_start").click().run()
    assert at.session_state["run_job"] is not None
    _wait_run(at)
    seen = time.time() - clicked
    assert not at.error, [e.value for e in at.error]
    key, report = at.session_state["last_report"]
    assert report.plan.accepted == (ids[0],) and report.settings["quick"] is True
    # the page says both times for what they are: the wait from the click, and the measuring process's part of it
    wait = at.session_state["last_report_wait_s"]
    assert report.duration_s <= wait <= seen + 0.5, (report.duration_s, wait, seen)
    said = [c.value for c in at.caption if "from your click" in c.value]
    part = round(min(report.duration_s, wait))
    assert said and f"{round(wait)} s from your click" in said[0] and f"{part} s in the" in said[0], said
    assert f"{round(wait) - part} s starting it" in said[0], said   # the two parts add up to the wait shown
    assert report.unfused.latency is not None and len(report.stages) == 4
    # the same model+plan+settings again: answered from the cache, no new job
    at.button(key="run_start").click().run()
    assert at.session_state["run_job"] is None and at.session_state["last_report_cached"]
    assert any("answered from the cache now" in c.value and f"{round(wait)} s" in c.value for c in at.caption)

    at.switch_page("ui/pages/results.py").run()
    assert not at.exception and not at.error
    charts_drawn = at.get("plotly_chart")
    assert {c.key for c in charts_drawn} == {"chart_compare", "chart_stages"}   # quick: no per-chain timing
    assert any("No per-chain timings" in c.value for c in at.caption)
    # the staged table without its sentence column (cut off in Chromium): each stage's graph listed below it
    stages = next(df.value for df in at.dataframe if "p20" in df.value.columns and "stage" in df.value.columns)
    assert "graph" not in stages.columns and len(stages) == len(report.stages)
    listed = [m.value for m in at.markdown if m.value.startswith("- **")]
    shown = [m.replace("\\", "") for m in listed]   # as rendered: the markdown escapes undone
    assert any(all(f"**{charts.stage_label(s.stage, s.label)}**" in m for s in report.stages) for m in shown), listed

    # Plan: download, change the choices, upload it again -> same choices
    at.switch_page("ui/pages/fusions.py").run()
    from explorer.fusions.plan import make_plan

    plan_json = make_plan(det, reject=[ids[1]]).to_json()
    assert json.loads(plan_json)["accepted"] == [ids[0]]
    at.button(key="bulk_accept_all").click().run()
    assert _accepted(at) == set(ids)
    at.file_uploader(key="plan_file").upload("residual_block.plan.json", plan_json.encode(), "application/json")
    at.run()
    assert _accepted(at) == {ids[0]}
    assert not at.error and at.success

    # A broken plan and another model's plan: one error line, choices intact
    at.file_uploader(key="plan_file").set_value(("broken.json", b"{not json", "application/json")).run()
    assert any("Plan not applied" in e.value for e in at.error)
    assert _accepted(at) == {ids[0]}
    _, _, other = analyze("conv_bn_relu")
    at.file_uploader(key="plan_file").set_value(
        ("other.json", make_plan(other).to_json().encode(), "application/json")).run()
    assert any("made for model 'conv_bn_relu'" in e.value for e in at.error)
    assert _accepted(at) == {ids[0]}

    # Learn and Export pages render with this model
    at.switch_page("ui/pages/learn.py").run()
    assert not at.exception and not at.error and at.expander
    at.switch_page("ui/pages/export.py").run()
    assert not at.exception and not at.error
    at.button(key="export_pt2_build").click().run()
    assert not at.exception
    print(f"flow took {time.perf_counter() - t0:.1f} s")


def test_app_broken_model_upload_keeps_previous_model():
    at = _app("conv_bn_relu")
    _, _, det = analyze("conv_bn_relu")
    at.switch_page("ui/pages/fusions.py").run()
    at.button(key="bulk_reject_all").click().run()
    before = _accepted(at)
    at.radio(key="model_kind").set_value("ONNX upload").run()
    at.sidebar.get("file_uploader")[0].set_value(("broken.onnx", b"this is not onnx", "application/octet-stream"))
    at.run()
    assert not at.exception
    errors = [e.value for e in at.error]
    assert any("Could not load the model" in e for e in errors), errors
    assert all("Traceback" not in e for e in errors)
    assert at.session_state["active"].source == "conv_bn_relu"
    assert _accepted(at) == before
    # still usable: the graph page draws and a zoo model loads again
    at.radio(key="model_kind").set_value("Zoo").run()
    at.switch_page("ui/pages/graph.py").run()
    assert not at.exception and not at.error
    at.selectbox(key="zoo_name").set_value("transformer_block").run()
    assert at.session_state["active"].source == "transformer_block"
    assert at.session_state["active"].seq_len == 32
    at.number_input(key="seq_len").set_value(16).run()
    assert at.session_state["active"].seq_len == 16


def test_app_cancel_run_says_cancelled_and_stays_usable():
    """A user's cancel is reported as a cancel, not as "Run failed"."""
    at = _app("conv_bn_relu")
    at.switch_page("ui/pages/run.py").run()
    at.button(key="run_start").click().run()
    assert at.session_state["run_job"] is not None
    at.button(key="run_cancel").click().run()
    _wait_run(at, timeout=60)
    assert any("Run cancelled" in i.value for i in at.info), [i.value for i in at.info]
    assert not any("failed" in e.value for e in at.error), [e.value for e in at.error]
    assert at.session_state["run_cancelled"] is True and at.session_state["run_error"] is None
    assert at.session_state["active"].source == "conv_bn_relu"
    at.switch_page("ui/pages/graph.py").run()
    assert not at.exception and not at.error


def _unsupported_onnx_bytes() -> bytes:
    import onnx
    from onnx import TensorProto, helper

    node = helper.make_node("NonMaxSuppression", ["boxes", "scores"], ["selected"])
    graph = helper.make_graph([node], "g",
                              [helper.make_tensor_value_info("boxes", TensorProto.FLOAT, [1, 4, 4]),
                               helper.make_tensor_value_info("scores", TensorProto.FLOAT, [1, 1, 4])],
                              [helper.make_tensor_value_info("selected", TensorProto.INT64, [None, 3])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]).SerializeToString()


@pytest.mark.parametrize("kind, uploader, name, data, needle", [
    (".pt2 upload", "pt2_file", "model.pt2", pickle.dumps({"not": "an archive"}), "pickle"),
    ("ONNX upload", "onnx_file", "nms.onnx", None, "NonMaxSuppression"),
])
def test_app_refuses_pickles_and_unsupported_ops_and_keeps_state(kind, uploader, name, data, needle):
    at = _app("conv_bn_relu")
    at.radio(key="model_kind").set_value(kind).run()
    payload = data if data is not None else _unsupported_onnx_bytes()
    uploaders = [u for u in at.sidebar.get("file_uploader") if u.key == uploader]
    uploaders[0].set_value((name, payload, "application/octet-stream"))
    at.run()
    assert not at.exception
    errors = [e.value for e in at.error]
    assert len(errors) == 1 and needle in errors[0] and "Traceback" not in errors[0], errors
    assert at.session_state["active"].source == "conv_bn_relu"


def test_results_button_rejects_the_chains_that_got_slower():
    """A real CPU report, with one chain's verdict set to slower (CPU timings are noise-level): the
    button, the counts and the chart all read that one field."""
    import dataclasses

    from explorer import report as R
    from explorer.gpu_runner import RunSettings, run

    at = _app("residual_block")
    _, _, det = analyze("residual_block")
    report = run("residual_block", None, RunSettings(device="cpu", stages=False, warmup=1, reps=8))
    slow_id = report.chains[0].id
    chains = tuple(dataclasses.replace(c, verdict=dataclasses.replace(c.verdict, label=R.SLOWER if c.id == slow_id
                                                                      else R.FASTER))
                   for c in report.chains)
    report = dataclasses.replace(report, chains=chains)
    at.session_state["last_report"] = ("test", report)
    at.switch_page("ui/pages/results.py").run()
    assert not at.exception
    at.button(key="reject_slower").click().run()
    assert _accepted(at) == {c.id for c in det.chains} - {slow_id}


def test_app_opens_a_saved_gpu_report_without_a_gpu():
    """A report measured on the H200 opens on the Results page: its charts, the CUDA-graph column,
    and why its slower chains are slower. A broken file is refused in one line and the report stays."""
    at = _app("residual_block")
    at.switch_page("ui/pages/results.py").run()
    assert not at.exception and any("No results yet" in i.value for i in at.info)
    at.file_uploader(key="report_file").set_value(
        ("resnet50_h200.json", H200_REPORT.read_bytes(), "application/json")).run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    assert any("saved report" in s.value for s in at.success)
    key, report = at.session_state["last_report"]
    assert key.startswith("file:resnet50_h200.json") and report.model.name == "resnet50"
    assert any("Results: resnet50" in h.value for h in at.subheader)
    assert not any("CPU numbers" in w.value for w in at.warning)
    assert any("slower even as CUDA graphs" in i.value for i in at.info), [i.value for i in at.info]
    table = next(d for d in at.dataframe if "speed-up, CUDA graph" in d.value.columns)
    assert len(table.value) == 53
    assert not [b for b in at.button if b.key == "reject_slower"]    # a report of another model: no button
    at.file_uploader(key="report_file").set_value(("broken.json", b"{not json", "application/json")).run()
    assert not at.exception
    errors = [e.value for e in at.error]
    assert len(errors) == 1 and "broken.json is not a JSON report" in errors[0], errors
    assert at.session_state["last_report"][1].model.name == "resnet50"   # the open report stays


def test_app_kernel_choice_goes_into_the_plan_and_comes_back_from_one():
    """The one-chain panel sets the plan's kernel choice for that chain; an uploaded plan's choices
    are restored (and shown in the panel)."""
    from explorer.fusions.plan import Plan

    at = _app("residual_block")
    _, _, det = analyze("residual_block")
    conv = next(c.id for c in det.chains if c.pattern == "conv_bn_act")
    res = next(c.id for c in det.chains if c.pattern == "conv_bn_add_act")
    at.switch_page("ui/pages/fusions.py").run()
    at.selectbox(key="chain_pick").set_value(conv).run()
    assert at.selectbox(key=f"kernel@{conv}").value == "auto"
    at.selectbox(key=f"kernel@{conv}").set_value("separate_epilogue").run()
    assert not at.exception
    assert at.session_state["kernels"][det.fingerprint] == {conv: "separate_epilogue"}
    plan = Plan(det.model, det.fingerprint, tuple(c.id for c in det.chains), {res: "inductor"})
    at.file_uploader(key="plan_file").set_value(("p.json", plan.to_json().encode(), "application/json")).run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    assert any("1 kernel choice(s)" in s.value for s in at.success)
    assert at.session_state["kernels"][det.fingerprint] == {res: "inductor"}
    at.selectbox(key="chain_pick").set_value(res).run()
    assert at.selectbox(key=f"kernel@{res}").value == "inductor"
    at.selectbox(key="chain_pick").set_value(conv).run()
    assert at.selectbox(key=f"kernel@{conv}").value == "auto"


def test_results_button_sets_the_separate_epilogue_for_chains_slower_on_the_gpu():
    """With ResNet-50 loaded, its H200 report offers to give the 8 conv chains that were slower even
    as CUDA graphs the separate epilogue; the plan then carries those kernel choices."""
    from explorer.fusions.plan import gpu_slower_chains

    at = _app("resnet50")
    _, _, det = analyze("resnet50")
    report = ui_files.load_report("h200.json", H200_REPORT.read_bytes())
    expected = set(gpu_slower_chains(report, det))
    assert len(expected) == 8
    at.session_state["last_report"] = ("test", report)
    at.switch_page("ui/pages/results.py").run()
    assert not at.exception
    at.button(key="separate_gpu_slower").click().run()
    assert not at.exception
    assert at.session_state["kernels"][det.fingerprint] == {cid: "separate_epilogue" for cid in expected}
    assert any("next run times them" in s.value for s in at.success)


# ------------------------------------------------------------------ graph and fusions pages

def test_graph_page_side_by_side_follows_rejections_and_search():
    """The fused view states the counts before and after; rejecting a chain on the Fusions page changes
    them; search lists every match and steps through them, also with one chain shown."""
    at = _app("residual_block")
    _, graph, det = analyze("residual_block")
    at.segmented_control(key="graph_mode").set_value("side").run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    n = graph.number_of_nodes()
    saved = sum(c.launches_saved for c in det.chains)
    assert any(f"from **{n} to {n - saved} nodes**" in m.value for m in at.markdown)
    at.switch_page("ui/pages/fusions.py").run()
    at.selectbox(key="chain_pick").set_value(det.chains[0].id).run()
    at.button(key="chain_reject").click().run()
    at.switch_page("ui/pages/graph.py").run()
    assert not at.exception
    left = n - det.chains[1].launches_saved
    assert any(f"from **{n} to {left} nodes**" in m.value for m in at.markdown)
    assert any(f"**After the accepted fusions**: {left} nodes" in m.value for m in at.markdown)

    at.text_input(key="graph_search").set_value("relu").run()
    relus = [nid for nid, a in graph.nodes(data=True) if a["kind"] == "relu"]
    assert at.selectbox(key="graph_match").options == [f"{r} · relu · {graph.nodes[r]['origin']}" for r in relus]
    assert at.selectbox(key="graph_match").value == relus[0]
    at.button(key="graph_next").click().run()
    assert at.selectbox(key="graph_match").value == relus[1]
    at.selectbox(key="graph_chain").set_value(det.chains[0].id).run()     # search works with one chain shown
    assert not at.exception
    assert any("matches are in this chain's neighbourhood" in c.value for c in at.caption)
    assert at.selectbox(key="graph_chain").format_func(det.chains[0].id).startswith("conv1 → bn1 → relu")


def test_link_opens_model_dtype_and_view():
    from streamlit.testing.v1 import AppTest

    at = AppTest.from_file(APP, default_timeout=180)
    at.query_params.update({"model": "transformer_block", "dtype": "bf16", "view": "fused"})
    at.run()
    assert not at.exception
    assert at.session_state["active"].source == "transformer_block"
    assert at.session_state["dtype"] == "bf16" and at.session_state["graph_mode"] == "fused"
    assert any("After the accepted fusions" in m.value for m in at.markdown)
    at.selectbox(key="zoo_name").set_value("residual_block").run()
    assert at.query_params["model"] == ["residual_block"] or at.query_params["model"] == "residual_block"
    bad = AppTest.from_file(APP, default_timeout=180)
    bad.query_params["model"] = "[x](http://example.invalid)"
    bad.run()
    assert not bad.exception and bad.session_state["active"].source != "[x](http://example.invalid)"
    warnings = [w.value for w in bad.warning if "Link ignored" in w.value]
    assert len(warnings) == 1 and "http" not in warnings[0].replace("http???", "")


def test_fusions_table_kernel_column_bulk_kernel_and_measured_speedups():
    at = _app("residual_block")
    _, _, det = analyze("residual_block")
    conv, res = det.chains[0], det.chains[1]
    at.switch_page("ui/pages/fusions.py").run()
    table = next(d for d in at.dataframe if "kernel" in d.value.columns)
    assert list(table.value["chain"]) == ["conv1 → bn1 → relu", "conv2 → bn2 → add → relu"]
    assert list(table.value["id"]) == [conv.id, res.id] and "speed-up" not in table.value.columns
    version = at.session_state["editor_version"]
    at.session_state[f"chains_editor_{version}"] = {"edited_rows": {0: {"kernel": "separate_epilogue"}},
                                                     "added_rows": [], "deleted_rows": []}
    at.run()
    assert at.session_state["kernels"][det.fingerprint] == {conv.id: "separate_epilogue"}
    at.selectbox(key="bulk_pattern").set_value(res.pattern).run()
    at.selectbox(key="bulk_kernel").set_value("inductor").run()
    at.button(key="bulk_kernel_set").click().run()
    assert at.session_state["kernels"][det.fingerprint] == {conv.id: "separate_epilogue", res.id: "inductor"}
    assert "inductor" in list(next(d for d in at.dataframe if "kernel" in d.value.columns).value["kernel"])
    at.session_state["last_report"] = ("test", {
        "model": {"name": "residual_block", "fingerprint": det.fingerprint},
        "chains": [{"id": conv.id, "speedup": 1.3, "verdict": "faster"}, {"id": res.id, "speedup": 0.8, "slower": True}]})
    at.run()
    table = next(d for d in at.dataframe if "kernel" in d.value.columns)
    assert table.value[["speed-up", "verdict"]].values.tolist() == [["1.30×", "faster"], ["0.80×", "slower"]]
    at.session_state["last_report"] = ("other", {"model": {"name": "resnet50", "fingerprint": "0" * 16},
                                                 "chains": [{"id": conv.id, "speedup": 9.0}]})
    at.run()
    assert "speed-up" not in next(d for d in at.dataframe if "kernel" in d.value.columns).value.columns


def _relu_onnx_bytes() -> bytes:
    import onnx
    from onnx import TensorProto, helper

    node = helper.make_node("Relu", ["x"], ["y"])
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]).SerializeToString()


def test_pages_work_for_a_model_with_no_fusible_chain():
    at = _app("residual_block")
    at.radio(key="model_kind").set_value("ONNX upload").run()
    [u for u in at.sidebar.get("file_uploader") if u.key == "onnx_file"][0].set_value(
        ("relu.onnx", _relu_onnx_bytes(), "application/octet-stream"))
    at.run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    assert at.session_state["active"].kind == "onnx"
    at.switch_page("ui/pages/fusions.py").run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    assert any("No fusible chain" in i.value for i in at.info)
    at.switch_page("ui/pages/graph.py").run()
    at.segmented_control(key="graph_mode").set_value("side").run()
    assert not at.exception and not at.error, [e.value for e in at.error]


def test_app_help_is_this_apps_own():
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "explorer.cli", "app", "--help"], capture_output=True, text=True,
                         timeout=120, cwd=str(Path(APP).parent.parent))
    assert out.returncode == 0, out.stderr
    assert "usage: fusion-explorer app" in out.stdout and "--port" in out.stdout and "?model=" in out.stdout
    assert "server.fileWatcherType" not in out.stdout and "Usage: streamlit" not in out.stdout


def test_one_chain_panel_shows_the_patterns_caveats_in_both_languages():
    """Where a chain is accepted or rejected, its pattern's warnings stand beside the buttons: BatchNorm
    folding holds only for inference, fusion changes numerics (the seed's warnings), in English and 中文."""
    from explorer.fusions import BY_NAME
    from explorer.ui.i18n import pattern_text

    at = _app("residual_block")
    _, _, det = analyze("residual_block")
    conv = next(c for c in det.chains if c.pattern == "conv_bn_act")
    at.switch_page("ui/pages/fusions.py").run()
    at.selectbox(key="chain_pick").set_value(conv.id).run()
    shown = "\n".join(m.value for m in at.markdown)
    caveats = BY_NAME["conv_bn_act"].caveats
    assert any("only for inference" in c for c in caveats)
    assert all(f"- {c}" in shown for c in caveats), shown
    at.radio(key="lang").set_value("zh").run()
    assert not at.exception
    shown = "\n".join(m.value for m in at.markdown)
    zh = pattern_text(BY_NAME["conv_bn_act"], "caveats", "zh")
    assert zh != caveats and all(f"- {c}" in shown for c in zh), shown
    assert "接受之前" in shown


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_results_say_whose_fault_a_non_finite_output_is(lang):
    """A run whose fused output is NaN while the unfused graph's is finite: the Results page warns above the
    precision table that a fusion did it, in the page's language; a finite run shows no such warning."""
    import dataclasses

    from explorer import report as R

    report = _report()
    bad = R.Precision(max_abs=float("inf"), max_rel=float("inf"), rel_l2=float("inf"), finite=False)
    broken = dataclasses.replace(report, fused=dataclasses.replace(report.fused, precision=bad),
                                 settings={**report.settings, "dtype": "fp16"})
    from streamlit.testing.v1 import AppTest

    for shown, warned in ((report, False), (broken, True)):
        at = AppTest.from_file(APP, default_timeout=180)
        at.session_state["zoo_name"] = "conv_bn_relu"
        at.session_state["lang"] = lang
        at.run()
        at.session_state["last_report"] = ("k", shown)
        at.switch_page("ui/pages/results.py").run()
        assert not at.exception, at.exception
        texts = [w.value.replace("\\", "") for w in at.warning]      # as rendered: the markdown escapes undone
        want = ("fusion made the output not finite (NaN or infinity) in fp16" if lang == "en"
                else "融合使 fp16 下的输出不再是有限值")
        assert any(want in x for x in texts) == warned, texts
