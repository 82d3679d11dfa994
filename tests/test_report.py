"""The typed report (``explorer.report``): round trip, strict validation in one line, version 1 upgrade.

No torch and no run here: reports are built from the dataclasses directly, and
the committed H200 reports (version 1) are read from ``benchmarks/results``.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from explorer import report as R
from explorer.errors import ReportError
from report_samples import sample_report

RESULTS = Path(__file__).resolve().parent.parent / "benchmarks" / "results"
#: The H200 reports committed before the typed report (version 1); later reports are saved at the current version.
V1_REPORTS = sorted(p for p in RESULTS.glob("report_*_h200.json") if json.loads(p.read_text()).get("version", 1) == 1)


def test_round_trip_through_json_is_exact():
    report = sample_report()
    text = report.to_json()
    back = R.load(text.encode(), "r.json")
    assert back == report
    assert isinstance(back.model.inputs[0].shape, tuple) and back.settings["compile_modes"] == ("default",)
    assert json.loads(text)["version"] == R.REPORT_VERSION


def test_derived_facts_are_read_from_the_stored_verdicts():
    report = sample_report()
    assert report.slower_chains == ["b"]
    assert report.chain_ids(R.NO_KERNEL) == ["c"]
    assert report.limited_by(R.GPU) == ["b"] and report.limited_by(R.HOST) == []
    assert report.verdict_counts() == {R.FASTER: 1, R.SLOWER: 1, R.SAME: 0, R.NO_KERNEL: 1, R.NOT_MEASURED: 0}
    assert report.speedup == pytest.approx(2.0 / 1.5)
    assert report.chain("a").speedup == pytest.approx(1 / 0.8)
    assert report.baseline("torch_compile").compile_s == 12.5
    assert "b" in R.summary_table(report) and "slower" in R.summary_table(report)


def _mutated(path: list, value, delete: bool = False) -> bytes:
    d = sample_report().to_dict()
    target = d
    for key in path[:-1]:
        target = target[key]
    if delete:
        del target[path[-1]]
    else:
        target[path[-1]] = value
    return json.dumps(d).encode()


@pytest.mark.parametrize("path, value, delete, needle", [
    (["unfused", "latency", "median"], "fast", False, "'unfused.latency.median' must be a number, got string"),
    (["chains", 1, "verdict", "p_value"], [0.1], False, "'chains[1].verdict.p_value' must be a number, got list"),
    (["chains", 0, "fused_kernel"], 1, False, "'chains[0].fused_kernel' must be true or false, got number"),
    (["environment", "is_cpu"], "yes", False, "'environment.is_cpu' must be true or false"),
    (["model", "inputs", 0, "shape"], [2, "3"], False, "'model.inputs[0].shape[1]' must be an integer"),
    (["stages", 0, "latency", "reps"], 1.5, False, "'stages[0].latency.reps' must be an integer"),
    (["model", "fingerprint"], None, True, "missing field 'model.fingerprint'"),
    (["chains", 2, "verdict"], None, True, "missing field 'chains[2].verdict'"),
    (["chains", 0, "slower"], True, False, "unknown field 'chains[0].slower'"),
    (["environment", "extra", "nested"], {"a": 1}, False, "'environment.extra.nested' must be"),
    (["baselines"], {"eager": {}}, False, "'baselines' must be a list, got object"),
])
def test_a_bad_field_is_refused_in_one_line_naming_it(path, value, delete, needle):
    with pytest.raises(ReportError) as err:
        R.load(_mutated(path, value, delete), "bad.json")
    message = str(err.value)
    assert needle in message and message.startswith("bad.json") and "\n" not in message, message


@pytest.mark.parametrize("data, needle", [
    (b"[1, 2]", "JSON list, not an object"),
    (b'{"version": "2"}', "no integer 'version'"),
    (b'{"version": 7}', "report version 7 is not supported"),
    (b"\x80 not text", "not UTF-8"),
    (b'{"version": 2' + b"[" * 100, "nested"),
])
def test_not_a_report_is_refused_in_one_line(data, needle):
    with pytest.raises(ReportError) as err:
        R.load(data, "x.json")
    assert needle in str(err.value) and "\n" not in str(err.value), str(err.value)


def test_size_is_bounded_and_paths_must_be_regular_files(tmp_path):
    with pytest.raises(ReportError, match="over the limit"):
        R.load(b" " * (R.MAX_REPORT_BYTES + 1), "big.json")
    with pytest.raises(ReportError, match="directory"):
        R.load(tmp_path)
    path = tmp_path / "r.json"
    R.save(sample_report(), path)
    assert R.load(path) == sample_report()


def test_a_report_of_another_model_says_so_in_one_line():
    with pytest.raises(ReportError) as err:
        sample_report().check_model("ffff0000", "resnet50")
    assert "measured on model 'tiny' (graph abc123)" in str(err.value) and "ffff0000" in str(err.value)
    sample_report().check_model("abc123")  # its own model: no error


@pytest.mark.parametrize("path", V1_REPORTS, ids=lambda p: p.name)
def test_committed_version_1_reports_are_upgraded(path):
    """The H200 reports committed before the typed report still open: numbers carried over, verdicts marked
    as the old spread rule, what limits each slower chain kept."""
    raw = json.loads(path.read_text())
    report = R.load(path)
    assert report.upgraded_from == 1 and report.version == R.REPORT_VERSION
    assert report.environment.device_name.startswith("NVIDIA")
    assert report.unfused.latency.median == raw["unfused"]["latency_ms"]["median"]
    assert len(report.chains) == len(raw["chains"])
    assert report.slower_chains == [c["id"] for c in raw["chains"] if c.get("slower")]
    assert report.limited_by(R.GPU) == [c["id"] for c in raw["chains"] if c.get("slower_in_graph")]
    assert all(c.verdict.method == R.V1_RULE for c in report.chains if c.verdict.label != R.NOT_MEASURED)
    assert any("Upgraded from report version 1" in n for n in report.notes)
    assert [s.stage for s in report.stages] == ["none", "conv_bn", "activation", "all"]
    assert R.Report.from_dict(report.to_dict()) == report   # and it saves as version 2


def test_a_broken_version_1_report_is_refused():
    raw = json.loads(V1_REPORTS[0].read_text())
    broken = copy.deepcopy(raw)
    broken["chains"] = {"a": 1}
    with pytest.raises(ReportError, match="'chains' is not a list"):
        R.Report.from_dict(broken, "old.json")
    broken = copy.deepcopy(raw)
    broken["chains"][0]["max_abs"] = "big"
    with pytest.raises(ReportError, match=r"chains\[0\].max_abs"):
        R.Report.from_dict(broken, "old.json")
    del broken["fused"]
    with pytest.raises(ReportError, match="'fused' must be an object"):
        R.Report.from_dict(broken, "old.json")


def test_a_non_finite_output_is_named_with_whose_fault_it_is():
    """NaN or infinity in the outputs: the model's own ops in the run's dtype (the unfused graph's, and eager's
    where that baseline ran: Swin-V2 in fp16) or a fusion (unfused finite, fused not); said in the CLI table."""
    import dataclasses

    report = sample_report()
    bad = R.Precision(max_abs=float("inf"), max_rel=float("inf"), rel_l2=float("inf"), finite=False)

    def with_finite(unfused: bool, fused: bool, eager: bool | None = None) -> R.Report:
        def meas(m: R.Measurement, ok: bool) -> R.Measurement:
            return m if ok else dataclasses.replace(m, precision=bad)
        baselines = report.baselines
        if eager is not None:
            baselines += (R.Baseline(name="eager", label="eager PyTorch", method="eager", mode=None,
                                     cuda_graphs=False, memory_format="nchw",
                                     measurement=meas(report.fused, eager)),)
        return dataclasses.replace(report, unfused=meas(report.unfused, unfused), fused=meas(report.fused, fused),
                                   settings={**report.settings, "dtype": "fp16"}, baselines=baselines)

    assert R.finiteness_warning(report) is None and "WARNING" not in R.summary_table(report)
    model = R.finiteness_warning(with_finite(False, False))
    assert model.id == "notes.unfused_not_finite" and "in fp16: the model's own ops fail" in model
    assert R.finiteness_warning(with_finite(False, False, eager=False)).id == "notes.unfused_not_finite_eager"
    assert R.finiteness_warning(with_finite(False, False, eager=True)).id == "notes.unfused_not_finite"
    fusion = R.finiteness_warning(with_finite(True, False))
    assert fusion.id == "notes.fused_not_finite" and "fusion made the output not finite" in fusion
    assert f"WARNING: {fusion}" in R.summary_table(with_finite(True, False))
    back = R.load(with_finite(True, False).to_json().encode(), "r.json")      # as a saved report reads
    assert R.finiteness_warning(back).id == "notes.fused_not_finite"
