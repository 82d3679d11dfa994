"""Fuzzing the one-line contract (issue 9): mutated ONNX files, plans and reports either load or fail
with exactly one ``ExplorerError`` line, never another exception, over thousands of inputs.

ONNX files go through ``load_model`` in-process as the isolated loader's child runs it (the child
marker is set, so no second process is started per example); the memory budget is lowered to
64 MiB so that a mutation that inflates a size is refused quickly instead of allocating.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import hostile as H
from explorer.errors import ExplorerError, PlanError, ReportError
from explorer.fusions.plan import Plan
from explorer.ui import files as ui_files

def fuzz(examples: int) -> settings:
    return settings(max_examples=examples, deadline=None, derandomize=True, database=None,
                    suppress_health_check=list(HealthCheck))

VALID_PLAN = {"version": 1, "model": "residual_block", "fingerprint": "abc", "accepted": ["conv_bn_act@conv2d"],
              "kernels": {"conv_bn_act@conv2d": "auto"}, "memory_format": "nchw", "cuda_graphs": False}
VALID_REPORT = {"version": 1, "model": {"name": "m"}, "plan": {"cuda_graphs": False},
                "unfused": {"latency_ms": {"median": 1.0, "p20": 0.9, "p80": 1.1}},
                "fused": {"latency_ms": {"median": 0.8, "p20": 0.7, "p80": 0.9}},
                "chains": [{"id": "a", "slower": False, "speedup": 1.2}], "notes": ["n"]}

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=20)


def _one_line(exc: ExplorerError) -> None:
    text = str(exc)
    assert text and "\n" not in text and "\r" not in text, repr(text)


def _mutate(data: bytes, edits: list[tuple[int, int, int]]) -> bytes:
    """Apply (kind, position, byte) edits: 0 flips a byte, 1 inserts one, 2 deletes one, 3 truncates."""
    out = bytearray(data)
    for kind, pos, value in edits:
        if not out:
            break
        pos %= len(out)
        if kind == 0:
            out[pos] ^= value or 1
        elif kind == 1:
            out.insert(pos, value)
        elif kind == 2:
            del out[pos]
        else:
            del out[pos:]
    return bytes(out)


edits = st.lists(st.tuples(st.integers(0, 3), st.integers(0, 1 << 20), st.integers(0, 255)), min_size=1, max_size=6)


@pytest.fixture(scope="module")
def onnx_seed() -> bytes:
    return H.escape_named_model().SerializeToString()


def test_mutated_onnx_files_load_or_fail_in_one_line(onnx_seed, tmp_path_factory, monkeypatch):
    from explorer.sources import isolate, load_model

    monkeypatch.setenv(isolate.CHILD_ENV, "1")
    monkeypatch.setenv("FUSION_EXPLORER_MEMORY_BUDGET", "64M")
    folder = tmp_path_factory.mktemp("fuzz-onnx")
    outcomes = {"loaded": 0, "refused": 0}

    @fuzz(400)
    @given(edits)
    def check(mutation):
        path = folder / "m.onnx"
        path.write_bytes(_mutate(onnx_seed, mutation))
        try:
            load_model(str(path))
            outcomes["loaded"] += 1
        except ExplorerError as exc:
            _one_line(exc)
            outcomes["refused"] += 1

    check()
    assert outcomes["refused"] > 50, outcomes  # the mutations do reach the error paths


@fuzz(1500)
@given(st.one_of(
    json_values.map(json.dumps),
    st.tuples(st.sampled_from(sorted(VALID_PLAN)), json_values).map(
        lambda kv: json.dumps({**VALID_PLAN, kv[0]: kv[1]})),
    edits.map(lambda e: _mutate(json.dumps(VALID_PLAN).encode(), e).decode("utf-8", "replace"))))
def test_mutated_plans_parse_or_fail_in_one_line(text):
    try:
        plan = Plan.from_json(text)
    except PlanError as exc:
        _one_line(exc)
        return
    assert isinstance(plan.cuda_graphs, bool) and all(isinstance(a, str) for a in plan.accepted)


@fuzz(1500)
@given(st.one_of(
    json_values.map(lambda v: json.dumps(v).encode()),
    st.tuples(st.sampled_from(sorted(VALID_REPORT)), json_values).map(
        lambda kv: json.dumps({**VALID_REPORT, kv[0]: kv[1]}).encode()),
    edits.map(lambda e: _mutate(json.dumps(VALID_REPORT).encode(), e))))
def test_mutated_reports_load_or_fail_in_one_line(data):
    try:
        report = ui_files.load_report("r.json", data)
    except ReportError as exc:
        _one_line(exc)
        return
    assert isinstance(report, dict)


# ------------------------------------------------------------------ issue 19: typed mutations of valid reports

RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results"
#: Values of every JSON type, and numbers at and past the edges readers convert: 400 digits, 64 bits,
#: infinities, NaN, negatives, a denormal; strings that parse as nothing and that hold markup.
HOSTILE_VALUES = [10 ** 400, -10 ** 400, 2 ** 64, 2 ** 63, -1, 0, 1, float("inf"), float("-inf"), float("nan"),
                  1e308, -1e-320, 0.5, "abc", "", "1e999", "faster", "slower", "host", "[a](http://x)", [], [1],
                  ["a"], [{}], {}, {"a": 1}, {"median": "x"}, None, True, False]


def _paths(value, prefix=()) -> list[tuple]:
    """Every path into a JSON document (containers and leaves alike)."""
    out = [prefix] if prefix else []
    if isinstance(value, dict):
        for key, item in value.items():
            out += _paths(item, prefix + (key,))
    elif isinstance(value, list):
        for i, item in enumerate(value[:3]):  # the first items of a list stand for the rest
            out += _paths(item, prefix + (i,))
    return out


def _mutated(base, edits) -> object:
    """``base`` with each (path, value-or-DELETE) edit applied; an edit whose path is gone is skipped."""
    doc = copy.deepcopy(base)
    for path, value in edits:
        target = doc
        try:
            for key in path[:-1]:
                target = target[key]
            if value is _DELETE:
                del target[path[-1]]
            else:
                target[path[-1]] = copy.deepcopy(value)
        except (KeyError, IndexError, TypeError):
            continue
    return doc


_DELETE = object()


def _at(doc, path):
    for key in path:
        doc = doc[key]
    return doc


def _same_type(value) -> list:
    """Values of ``value``'s own type at its edges (most of them fit the schema: the readers get to read)."""
    if isinstance(value, bool):
        return [not value]
    if isinstance(value, int):
        return [0, 1, value * 1000, 2 ** 62]
    if isinstance(value, float):
        return [0.0, value * 1e6, 1e-300, 1e300]
    if isinstance(value, str):
        return ["", "[a](http://evil.invalid) `t` <img src=x>", value + "\n\u202e`"]
    if isinstance(value, list):
        return [[], value[:1]]
    return [value]


def _typed_mutations(base):
    """One to three edits of ``base``: a field replaced by a value of its own type at an edge, by a value
    of another type or range (``HOSTILE_VALUES``, random JSON), or removed."""
    def edit(path):
        value = st.sampled_from(_same_type(_at(base, path))) | st.sampled_from(HOSTILE_VALUES + [_DELETE]) \
            | json_values
        return st.tuples(st.just(path), value)

    return st.lists(st.sampled_from(_paths(base)).flatmap(edit), min_size=1, max_size=3).map(
        lambda edits: _mutated(base, edits))


def _read_run_report(report, figures: bool = True) -> None:
    """What the CLI, the Results page and the plan helpers read of a loaded report (the plotly figures,
    a quarter of a second, when ``figures``)."""
    from explorer import report as R
    from explorer.fusions.plan import slower_chains
    from explorer.teaching import readers
    from explorer.ui import charts

    R.summary_table(report)
    ui_files.report_csv(report)
    slower_chains(report)
    readers.measured_chains(report), readers.report_stages(report)
    for lang in ("en", "zh"):
        charts.device_caption(report, lang), charts.verdict_text(report, lang), charts.summary_rows(report, lang)
        charts.baseline_rows(report, lang), charts.precision_rows(report, lang), charts.chain_rows(report, lang)
        charts.stages_rows(report, lang), charts.slower_where(report)
    if figures:
        charts.comparison_figure(report), charts.chain_speedup_figure(report), charts.chain_precision_figure(report)
        charts.stages_figure(report)


def _run_report_bases() -> list[dict]:
    from report_samples import sample_report
    from test_security_text import valid_v1

    committed = json.loads((RESULTS / "report_resnet50_fp16_cl_separate_h200.json").read_text())
    committed["chains"], committed["stages"] = committed["chains"][:3], committed["stages"][:2]
    return [sample_report().to_dict(), valid_v1(), committed]


@pytest.mark.parametrize("base", range(3), ids=["v2-sample", "v1-minimal", "v1-committed"])
def test_typed_mutations_of_run_reports_load_and_read_or_fail_in_one_line(base):
    """Issue 19: a valid report (version 2, and version 1 through its upgrade) with one to three fields
    replaced by a value of another type or range (or removed) either loads, and then every reader of
    the CLI, the Results page and the plan helpers reads it without an exception, or is refused with
    one ``ReportError`` line."""
    from explorer import report as R

    doc = _run_report_bases()[base]
    outcomes = {"loaded": 0, "refused": 0}

    @fuzz(50)
    @given(_typed_mutations(doc))
    def check(mutated):
        try:
            report = R.load(json.dumps(mutated), "r.json")
        except ReportError as exc:
            _one_line(exc)
            outcomes["refused"] += 1
            return
        outcomes["loaded"] += 1
        _read_run_report(report, figures=outcomes["loaded"] % 4 == 1)

    check()
    assert outcomes["refused"] > 10 and outcomes["loaded"] > 3, outcomes


def _read_teaching_report(rep: dict, figures: bool = True) -> None:
    """What the Results and Learn pages read of a validated teaching report (the tables, and the figures
    when ``figures``)."""
    from explorer.runtime.ceilings import Ceilings
    from explorer.ui import teaching_views as views

    ceilings = Ceilings.from_dict({"device_name": "?", **rep["ceilings"]})  # as the Learn page builds them
    for entry in rep["models"]:
        if "error" in entry:
            continue
        ceilings.ridge(entry["dtype"]), ceilings.peak_flops(entry["dtype"])
        bd, traffic = entry["breakdown"], entry["traffic"]
        if "error" not in bd:
            views.breakdown_rows(bd)
            if figures:
                views.breakdown_figure(bd)
        if "error" not in traffic:
            views.traffic_rows(traffic)
            if figures:
                views.traffic_figure(traffic, entry["name"])
        rows = entry.get("stages") or []
        views.stage_table(rows)
        if rows and rows[0].get("latency_ms"):
            last = next((r for r in reversed(rows) if r.get("latency_ms")), None)
            rows[0]["latency_ms"] / last["latency_ms"]
        if entry.get("comparison") and figures:
            views.prediction_figure(entry["comparison"])


def test_typed_mutations_of_teaching_reports_validate_and_read_or_fail_in_one_line():
    """Issue 19: the committed teaching report with fields replaced by values of another type or range
    either validates, and then the Results and Learn pages' figures and tables read it without an
    exception, or is refused with one ``ReportError`` line."""
    from explorer.teaching import report as teach_report

    base = json.loads((RESULTS / "teaching_report_h200.json").read_text())
    for entry in base["models"]:  # the first rows of each list stand for the rest
        for key in ("comparison", "predictions", "measured", "stages"):
            entry[key] = entry.get(key, [])[:3]
        entry["traffic"]["chains"] = entry["traffic"]["chains"][:3]
        for variant in entry["breakdown"].values():
            if isinstance(variant, dict) and "top" in variant:
                variant["top"] = variant["top"][:3]
    outcomes = {"loaded": 0, "refused": 0}

    @fuzz(80)
    @given(_typed_mutations(base))
    def check(mutated):
        try:
            rep = teach_report.validate(mutated, "t.json")
        except ReportError as exc:
            _one_line(exc)
            outcomes["refused"] += 1
            return
        outcomes["loaded"] += 1
        _read_teaching_report(rep, figures=outcomes["loaded"] % 4 == 1)

    check()
    assert outcomes["refused"] > 20 and outcomes["loaded"] > 5, outcomes
