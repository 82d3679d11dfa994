"""The Sweeps page through AppTest, in English and 中文, on the committed CPU sweep (benchmarks/results/sweeps).

The page lists the sweep folders under its root, draws the charts of the one chosen, reads where a fusion stops
paying from the verdicts, opens a point's report on the Results page, and shows a running sweep's progress from
its folder's ``progress.json``. The figures are checked against the records they come from.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from explorer.sweeps import store as st
from explorer.ui import i18n
from explorer.ui import sweep_views as views

ROOT = Path(__file__).resolve().parents[1]
COMMITTED = ROOT / "benchmarks" / "results" / "sweeps"
FOLDER = "cpu_teaching"
MISSING_KEY = re.compile(r"\[[a-z_]+(\.[a-z_0-9A-Z]+)+\]")


def _texts(at) -> str:
    out = []
    for kind in ("markdown", "caption", "warning", "info", "error", "title", "success"):
        out += [str(e.value) for e in at.get(kind)]
    for kind in ("selectbox", "radio", "button"):
        out += [str(getattr(e, "label", "")) for e in at.get(kind)]
    for frame in at.dataframe:
        out += [str(c) for c in frame.value.columns]
    return "\n".join(out)


def _has(text: str, lang: str, key: str) -> bool:
    part = max(re.split(r"\{[^}]*\}", i18n.catalog()[key][lang == "zh"]), key=len).strip()
    return part in text


def test_the_committed_sweep_reads_back_the_same_from_jsonl_and_parquet():
    folder = COMMITTED / FOLDER
    journal = st.read_results("results.jsonl", (folder / st.JOURNAL).read_bytes())
    table = st.read_results("results.parquet", (folder / st.TABLE).read_bytes())
    assert journal == table and len(journal) == 8
    assert {r["model"] for r in journal} == {"conv_bn_relu", "residual_block"}
    for rec in journal:
        assert st.SweepStore(folder).report_path(rec["key"]).is_file()


def test_figures_follow_the_records():
    records = st.SweepStore.open(FOLDER, root=COMMITTED).results()
    fig = views.speedup_figure(records, "batch", "en")
    measured = views.ok(records)
    assert sum(len(tr.x) for tr in fig.data) == len(measured)
    keys = {row[0] for tr in fig.data for row in tr.customdata}
    assert keys == {r["key"] for r in measured}
    for tr in fig.data:      # each marker's colour is its record's verdict
        for (key, _label), colour in zip(tr.customdata, tr.marker.color):
            assert colour == views.VERDICT_COLOURS[next(r for r in records if r["key"] == key)["verdict"]]
    heat = views.heatmap_figure(records, "en", "fp32", 1)
    assert list(heat.data[0].y) == ["conv_bn_relu", "residual_block"] and list(heat.data[0].x) == ["all", "none"]
    # in 中文 the plans are named as the series beside them name them (the heatmap said all/none)
    assert list(views.heatmap_figure(records, "zh", "fp32", 1).data[0].x) == ["全部融合", "不融合"]
    # stops_paying reads verdicts: a series faster at batch 1 and not at 2 stops at 2
    fake = [dict(r) for r in measured if r["plan"] == "all" and r["model"] == "conv_bn_relu"]
    fake[0]["verdict"], fake[1]["verdict"] = "faster", "slower"
    assert views.stops_paying(fake, "batch")[0]["stops"] == max(r["batch"] for r in fake)
    fake[1]["verdict"] = "faster"
    assert views.stops_paying(fake, "batch")[0]["stops"] is None
    # one size measured: no claim about "every size"
    reading = views.stops_rows(fake[:1], "batch", "en")[0]["reading"]
    assert reading == i18n.t_in("en", "sweeps.stop.pays_one", at=fake[0]["batch"]), reading


def _sweeps_page(lang: str, root: Path, monkeypatch):
    """The Sweeps page through AppTest in ``lang``, its root ``root`` (a copy of the committed CPU sweep in it)."""
    from streamlit.testing.v1 import AppTest

    monkeypatch.setenv("FUSION_EXPLORER_SWEEPS_ROOT", str(root))
    at = AppTest.from_file(str(ROOT / "explorer" / "app.py"), default_timeout=180)
    at.session_state["zoo_name"] = "conv_bn_relu"
    at.session_state["lang"] = lang
    at.switch_page("ui/pages/sweeps.py")
    at.run()
    assert not at.exception, at.exception
    return at


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_the_sweeps_page_in_both_languages(lang, tmp_path, monkeypatch):
    root = tmp_path / "sweeps"
    shutil.copytree(COMMITTED / FOLDER, root / FOLDER)
    at = _sweeps_page(lang, root, monkeypatch)
    text = _texts(at)
    assert not MISSING_KEY.search(text) and i18n.UNTRANSLATED not in text
    for key in ("sweeps.title", "sweeps.h.speedup", "sweeps.h.heatmap", "sweeps.h.stops", "sweeps.no_memory",
                "sweeps.no_compile", "sweeps.cpu", "sweeps.col.verdict", "sweeps.last_run"):
        assert _has(text, lang, key), (lang, key)
    charts = at.get("plotly_chart")
    assert len(charts) == 2                      # speed-up and heatmap (no baselines, no CUDA memory here)
    drawn = json.loads(charts[0].proto.spec)
    assert drawn["layout"]["title"]["text"] == i18n.t_in(lang, "sweeps.fig.speedup")
    assert sum(len(tr["x"]) for tr in drawn["data"]) == 8

    # every point's cells are text in one format per column, never a bare None (issue 26's walk: "None" in the
    # torch.compile and clock columns of a CPU sweep)
    points = at.dataframe[-1].value
    assert not points.isna().any().any() and "None" not in points.astype(str).to_numpy().ravel().tolist()
    speedups = points[i18n.t_in(lang, "sweeps.col.speedup")].tolist()
    assert all(re.fullmatch(r"\d+\.\d\d×", s) for s in speedups), speedups
    assert set(points[i18n.t_in(lang, "sweeps.col.clock")]) == {i18n.t_in(lang, "chart.missing.cpu")}
    names = points[i18n.t_in(lang, "sweeps.col.point")].tolist()   # in the page's language, as the series are
    assert any((" · 全部融合 · 批 1 · " if lang == "zh" else " · all · batch 1 · ") in n for n in names), names

    # a running sweep in the folder: its progress, live
    (root / FOLDER / st.PROGRESS).write_text(json.dumps({"status": "running", "fraction": 0.5, "done": 3,
                                                         "failed": 1, "cached": 0, "total": 8, "running": 1,
                                                         "left_s": 125}))
    at.run()
    bars = at.get("progress")
    assert bars and i18n.t_in(lang, "sweeps.left_min", m=2, s=5) in bars[0].proto.text

    # a point's report opens on the Results page
    records = st.SweepStore.open(FOLDER, root=root).results()
    chosen = records[-1]
    at.selectbox(key="sweeps_point").set_value(chosen["key"]).run()
    at.button(key="sweeps_open_report").click().run()
    assert not at.exception, at.exception
    opened = at.session_state["last_report"]
    assert opened is not None and opened[0].endswith(chosen["key"])
    assert opened[1].model.batch == chosen["batch"] and opened[1].verdict.label == chosen["verdict"]
    assert _has(_texts(at), lang, "results.opened.run")


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_a_refused_point_is_counted_apart_from_the_failed(lang, tmp_path, monkeypatch):
    """A point the explorer refused before measuring (BERT-base at 1024 tokens on the H200 grid) is "refused" in
    the summary, in a note of its own (not the failure warning) and in the table's status column."""
    from explorer.sweeps import spec as S

    root = tmp_path / "sweeps"
    shutil.copytree(COMMITTED / FOLDER, root / FOLDER)
    point = S.Point("bert_base", "all", 1, 1024, "fp32", "nchw", False, False)
    reason = "sequence length 1024 exceeds bert_base's maximum of 512"
    st.SweepStore(root / FOLDER).append(st.make_record(point, "f" * 32, {"model": "bert_base"},
                                                       {"status": "refused", "reason": reason}))
    at = _sweeps_page(lang, root, monkeypatch)
    want = i18n.t_in(lang, "sweeps.summary_refused", n=9, ok=8, failed=0, refused=1, devices="cpu")
    assert any(want.split(" · ")[0] == str(m.value).split(" · ")[0] for m in at.markdown), want
    assert any(str(e.value) == i18n.t_in(lang, "sweeps.refused", n=1) for e in at.info)
    assert not any(str(e.value) == i18n.t_in(lang, "sweeps.failed", n=1) for e in at.warning)
    status = at.dataframe[-1].value[i18n.t_in(lang, "sweeps.col.status")].tolist()
    assert status.count(i18n.t_in(lang, "sweeps.status.refused")) == 1


def test_an_empty_root_says_how_to_make_a_sweep(tmp_path, monkeypatch):
    from streamlit.testing.v1 import AppTest

    monkeypatch.setenv("FUSION_EXPLORER_SWEEPS_ROOT", str(tmp_path / "empty"))
    at = AppTest.from_file(str(ROOT / "explorer" / "app.py"), default_timeout=180)
    at.switch_page("ui/pages/sweeps.py")
    at.run()
    assert not at.exception
    assert _has(_texts(at), "en", "sweeps.no_folders")


def test_the_sweep_messages_have_their_chinese():
    """The progress line a sweep writes (with the runner's "about N s left") is translated whole, read back against
    the sweep's messages (``explorer.messages.SWEEPS``, tested with the others in tests/test_i18n.py)."""
    from explorer.sweeps.runner import SweepProgress

    cjk = re.compile(r"[\u3400-\u9fff]")
    assert cjk.search(i18n.message("runs/a is not a sweep folder (no results.jsonl or sweep.json in it)", "zh"))
    for state in (SweepProgress(8, 3, 1, 1, 1, left_s=125.0), SweepProgress(8, 3, 1, 1, 1, restarts=2),
                  SweepProgress(8, 8, status="done", elapsed_s=61)):
        out = i18n.message(state.line(), "zh")
        assert i18n.UNTRANSLATED not in out and "points" not in out, (state.line(), out)


def test_names_from_a_results_file_are_not_rendered_as_html():
    records = st.SweepStore.open(FOLDER, root=COMMITTED).results()
    hostile = [dict(r, model_label="<a href='http://x'>m</a>", plan="<b>all</b>") for r in views.ok(records)]
    fig = views.speedup_figure(hostile, "batch", "en")
    assert all("<a" not in tr.name and "&lt;a href" in tr.name and "&lt;b&gt;" in tr.name for tr in fig.data)
    heat = views.heatmap_figure(hostile, "en", "fp32", 1)
    assert list(heat.data[0].y) == ["&lt;a href='http://x'&gt;m&lt;/a&gt;"]
