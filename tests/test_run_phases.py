"""A fault never loses a run: a phase that fails ends only that phase, and a lost process is followed by a
fresh one for the phases still to run.

The failures are real, injected on the CPU through the session's test hook
(``session.FAIL_PHASE_ENV``): a phase that raises at its start, or a process that
dies by SIGSEGV at the start of a phase (as a CUDA fault that takes a process
down does). What is asserted: the other phases' results are in the report, the
report names the failed phase with its one-line reason, the command line prints
it, and a crash is followed by a fresh child whose phases are merged in.
"""

from __future__ import annotations

import json

import pytest

from explorer import cli
from explorer.report import NOT_MEASURED, PHASES, Report, summary_table
from explorer.runtime import measure
from explorer.runtime.session import FAIL_PHASE_ENV, measure as measure_in_process
from explorer.runtime.settings import RunSettings

FAST = dict(device="cpu", warmup=1, reps=8)


def test_a_crash_in_one_phase_keeps_the_others_and_a_fresh_child_runs_the_rest(monkeypatch, tmp_path, capsys):
    """chains: the child dies by SIGSEGV; stages: raises. main and the reference were measured before the
    crash, the baselines (eager, in the fresh child) after it; the CLI prints both failures."""
    monkeypatch.setenv(FAIL_PHASE_ENV, "chains:crash,stages")
    out = tmp_path / "report.json"
    code = cli.main(["run", "residual_block", "--device", "cpu", "--batch", "2", "--compile-modes", "",
                     "--baselines", "--out", str(out)])
    assert code == 0
    report = Report.from_dict(json.loads(out.read_text()))
    chains, stages = report.failure("chains"), report.failure("stages")
    assert chains is not None and chains.process_lost and "SIGSEGV" in chains.reason, chains
    assert stages is not None and not stages.process_lost and FAIL_PHASE_ENV in stages.reason, stages
    assert "\n" not in chains.reason + stages.reason
    assert report.failure("main") is None and report.failure("reference") is None
    assert report.fresh_processes == 1
    # measured before the crash: the whole-model timing and precision
    assert report.unfused.latency.median > 0 and report.fused.latency.median > 0
    assert report.verdict.n >= 8 and report.fused.precision.rel_l2 < 1e-4
    # the crashed phase: entries, no timing; the failed one: nothing
    assert report.chains and all(c.fused is None for c in report.chains)
    assert report.stages == ()
    # measured after it, by the fresh child
    eager = report.baseline("eager")
    assert eager is not None and eager.measurement.latency.median > 0 and eager.error is None
    assert eager.measurement.precision.rel_l2 < 1e-4
    printed = capsys.readouterr().err
    assert "phase chains FAILED" in printed and "phase stages FAILED" in printed, printed
    assert "1 fresh measuring process" in printed


def test_a_failed_phase_in_process_keeps_every_other_phase(monkeypatch):
    """main raises: no whole-model latency, a NOT_MEASURED verdict that says why, and the reference, the
    chains and the stages all measured."""
    monkeypatch.setenv(FAIL_PHASE_ENV, "main")
    report = measure_in_process("conv_bn_relu", None, RunSettings(batch=2, **FAST))
    failure = report.failure("main")
    assert failure is not None and FAIL_PHASE_ENV in failure.reason and not failure.not_run
    assert [f.phase for f in report.failures] == ["main"]
    assert report.unfused.latency is None and report.fused.latency is None
    assert report.verdict.label == NOT_MEASURED and "main phase failed" in report.verdict.note
    assert report.unfused.precision.rel_l2 < 1e-4                        # the reference phase ran
    timed = [c for c in report.chains if c.fused_kernel]
    assert timed and all(c.fused.median > 0 for c in timed)              # the chains phase ran
    assert any(s.latency is not None for s in report.stages)             # the stages phase ran
    assert Report.from_dict(json.loads(report.to_json())) == report
    assert "phase main FAILED" in summary_table(report)


def test_a_failing_baseline_is_dropped_and_the_others_timed(monkeypatch):
    """A baseline whose calls raise while timed (a real error from its own forward) is dropped with its
    reason; the fused entry and the other baselines are timed without it, in the same phase."""
    from explorer.runtime import baselines as baselines_module

    real = baselines_module.make_variant

    def eager_fails_on_its_third_call(name, module, inputs, device, cuda_graphs=False):
        variant = real(name, module, inputs, device, cuda_graphs)
        if name != "eager":
            return variant
        calls = {"n": 0}

        def forward():
            calls["n"] += 1
            if calls["n"] >= 3:
                raise RuntimeError("eager forward failed on its third call")
            return module(*inputs)

        return type(variant)(variant.name, forward, forward, variant.resident_bytes)

    monkeypatch.setattr(baselines_module, "make_variant", eager_fails_on_its_third_call)
    report = measure_in_process("conv_bn_relu", None,
                                RunSettings(batch=2, per_chain=False, stages=False, compile_baseline=True,
                                            compile_modes=(), **FAST))
    assert report.failures == ()
    eager = report.baseline("eager")
    assert eager.measurement is None and "third call" in eager.error and "dropped" in eager.error
    assert report.baseline("fused").measurement.latency.median > 0


def test_variant_failures_name_the_variant():
    def boom():
        raise ValueError("bad shape")

    with pytest.raises(measure.VariantFailed) as info:
        measure.time_rounds({"fine": lambda: None, "broken": boom}, "cpu", 2)
    assert info.value.variant == "broken" and "bad shape" in str(info.value)
    assert PHASES == ("reference", "main", "chains", "stages", "baselines")


def test_the_results_page_says_which_phase_failed_in_both_languages():
    """A report with a failed phase (on a variant) and a phase not run opens on the Results page: each is
    one line in the sidebar's language, and the rest of the report is shown as usual."""
    import dataclasses
    from pathlib import Path

    from streamlit.testing.v1 import AppTest

    from explorer import report as report_module
    from explorer.report import PhaseFailure
    from explorer.ui import i18n
    from explorer.ui.files import escape_markdown as plain

    root = Path(__file__).resolve().parents[1]
    saved = report_module.load(root / "benchmarks" / "results" / "report_resnet50_quick_cpu.json")
    broken = dataclasses.replace(saved, fresh_processes=1, failures=(
        PhaseFailure("baselines", "CUDA error: AcceleratorError: CUDA error: unspecified launch failure",
                     variant="torch_compile", process_lost=True),
        PhaseFailure("stages", "not run: phase 'baselines' left this process's CUDA context unusable",
                     not_run=True)))
    at = AppTest.from_file(str(root / "explorer" / "app.py"), default_timeout=180)
    at.session_state["zoo_name"] = "residual_block"
    at.switch_page("ui/pages/results.py").run()
    for lang in ("en", "zh"):
        at.radio(key="lang").set_value(lang).run()
        at.file_uploader(key="report_file").set_value(("broken.json", broken.to_json().encode(),
                                                       "application/json")).run()
        assert not at.exception, at.exception
        T = lambda key, **kw: i18n.t_in(lang, key, **kw)  # noqa: E731
        failed = T("results.phase_failed", phase=T("results.phase.baselines"),
                   variant=T("results.phase_variant", variant=plain("torch_compile")),
                   reason=plain(i18n.message(broken.failures[0].reason, lang)))
        assert [e.value for e in at.error] == [failed], [e.value for e in at.error]
        not_run = T("results.phase_not_run", phase=T("results.phase.stages"),
                    reason=plain(i18n.message(broken.failures[1].reason, lang)))
        assert not_run in [w.value for w in at.warning], [w.value for w in at.warning]
        assert i18n.UNTRANSLATED not in not_run                  # our sentence, translated whole
        # torch's own error text stays as torch wrote it (marked as English in 中文) inside our translated frame
        assert lang == "en" or "CUDA 错误：" in failed
        assert any(T("results.fresh_processes", n=1) in c.value for c in at.caption)
        assert any(T("results.precision") in m.value for m in at.markdown)   # the rest of the report is there
