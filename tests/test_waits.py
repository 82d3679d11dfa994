"""Waits that say how long: the time-left model, the countdown from the click, a real run against its estimate."""

from __future__ import annotations

import time

import pytest

from explorer.runtime.progress import (Countdown, CostMemory, Schedule, format_seconds, run_estimates, split_left,
                                       with_left)


def test_status_carries_its_time_left_both_ways():
    for seconds in (0, 7, 89, 95, 200, 3700):
        text, left = split_left(with_left("timing chain 3/9", seconds))
        assert text == "timing chain 3/9" and left == float(round(seconds)) if seconds < 90 else left == seconds
    assert split_left("done in 4 s") == ("done in 4 s", None)
    assert format_seconds(200) == "3 min 20 s"


def test_a_phase_slower_than_priced_shows_it_from_its_own_rate():
    """The estimate said 1 s for 10 rounds; after a 2 s warm-up, rounds 1 to 4 took 3 s: the time left follows the rate
    counted from round 1 (6 s for the 6 rounds left, weighed 3:1 against the estimate: over 4 s), not the estimate
    (which would say 0), and the warm-up is not read as rounds (2 s for round 1 would say 18 s)."""
    seen = []
    schedule = Schedule(lambda f, s: seen.append((f, s)), {"main": 1.0, "stages": 2.0}, units={"main": 10})
    schedule.emit("main", 0.0, "warming up")
    schedule._phase_start -= 2.0   # 2 s spent in the phase (no sleeping in a test)
    schedule.started -= 2.0
    schedule.emit("main", 0.1, "round 1/10")
    _text, left = split_left(seen[-1][1])
    assert left - 2.0 <= 1.0, seen[-1]           # one round done: no rate yet, the warm-up is not one
    schedule._phase_start -= 3.0
    schedule.started -= 3.0
    schedule.emit("main", 0.4, "round 4/10")
    _text, left = split_left(seen[-1][1])
    assert 4.0 <= left - 2.0 <= 7.0, seen[-1]   # the phase's 4.5 s and the stages' 2 s
    assert 0.35 < seen[-1][0] < 0.55             # 5 s done of ~11.5: the bar is a fraction of the time


def test_remembered_costs_follow_the_hosts_pace_now():
    """A process that took twice the remembered start runs on a busier host: the costs earlier runs remembered are
    scaled by its pace, within bounds (a start is no measure of a model)."""
    from explorer.runtime.progress import PACE_RANGE, host_pace

    assert host_pace(100.0, 2.0, now=104.0) == pytest.approx(2.0 if PACE_RANGE[1] >= 2 else PACE_RANGE[1])
    assert host_pace(100.0, 2.0, now=102.0) == pytest.approx(1.0)
    assert host_pace(100.0, 2.0, now=100.1) == PACE_RANGE[0]
    assert host_pace(None, 2.0) == host_pace(100.0, None) == host_pace(100.0, True) == 1.0
    assert host_pace(100.0, 2.0, now=99.0) == 1.0   # a clock gone back says nothing
    from explorer.runtime.progress import PROBE_PACE_RANGE, probe_pace

    assert probe_pace(0.2, 0.05) == pytest.approx(4.0)             # the same work 4x slower: a busier host
    assert probe_pace(0.05, None, fallback=1.3) == 1.3              # nothing remembered: the start's pace
    assert probe_pace(10.0, 0.01) == PROBE_PACE_RANGE[1] and probe_pace(0.001, 1.0) == PROBE_PACE_RANGE[0]


def test_countdown_counts_from_the_click_and_between_statuses():
    click = 1000.0
    c = Countdown(click)
    fraction, status, left, elapsed = c.view(now=click + 2)
    assert (fraction, status, left, elapsed) == (0.0, "starting…", None, 2.0)   # no estimate yet: no number
    c.update(0.9, with_left("loading", 30))   # the work's own fraction of steps is not the bar's
    c.at = click + 10
    fraction, status, left, elapsed = c.view(now=click + 16)
    assert status == "loading" and left == 24 and elapsed == 16
    assert fraction == pytest.approx(16 / 40)
    c.update(0.95, with_left("timing", 200))   # the run looks longer: the bar waits, it never goes back
    c.at = click + 17
    assert c.view(now=click + 17)[0] == pytest.approx(16 / 40)
    c.update(1.0, "done in 40 s")
    assert c.view(now=click + 41)[0] == 1.0


def test_the_cost_model_grows_with_what_is_known():
    timing = {"target_s": 0.4, "min_reps": 8, "max_reps": 200, "budget_s": 1.5}
    phases = ("reference", "main", "chains", "stages")
    common = dict(cuda=False, timing=timing, quick=False, phases=phases, chains_timed=True,
                  stage_graphs=3, stages=True, compile_modes=0, fuse_s=0.1)
    small = run_estimates(forward_s=0.01, chains_to_time=5, **common)
    slow = run_estimates(forward_s=0.2, chains_to_time=5, **common)
    more = run_estimates(forward_s=0.01, chains_to_time=50, chain_s=1.0, **common)
    assert slow["main"] > 2 * small["main"] and slow["stages"] > small["stages"]
    assert more["chains"] == 50.0 and small["baselines"] == 0.0
    assert run_estimates(forward_s=0.01, chains_to_time=5, **{**common, "chains_timed": False})["chains"] == 0.0


def test_cost_memory_keeps_what_was_measured(tmp_path):
    memory = CostMemory(tmp_path / "costs.json")
    assert memory.get("child_start", 6.0) == 6.0
    memory.record("child_start", 2.0, average=True)
    memory.record("child_start", 4.0, average=True)
    assert memory.get("child_start") == pytest.approx(0.3 * 2.0 + 0.7 * 4.0)
    (tmp_path / "costs.json").write_text("not json")
    assert CostMemory(tmp_path / "costs.json").get("child_start") is None   # unreadable: simply empty


#: How far elapsed + time left may stray from the real duration of the run below, after its first 10%: issue 26's ±30%.
ESTIMATE_TOLERANCE = 0.3


def test_a_normal_run_ends_within_30_percent_of_its_estimate(tmp_path, monkeypatch):
    """A real normal run of a zoo model on the CPU (load, plan, reference, paired rounds, every chain timed alone,
    the stages), the second of two: the first, the machine's first run of it, measured the costs it is priced
    from. From the first 10% of its time on, every status's elapsed + time left is within ±30% of the time the run
    really took, counted from the call (the click); 0.5 s more for the status's whole seconds. Before issue 26's
    estimator (the applying phase priced at 1 s for ever, the app's warm load taken for a fresh process's, the
    warm-up read as a round's rate, no pace of the host) this run's estimates overshot by 57-58% at load 0.9 on the
    2-core machine (on a host at load 11 both pass: the fixed errors shrink against a slower run). Under
    ``make test``'s two workers this file is handed out last, beside the suite's lightest files
    (``tests/conftest.py``, ``TIMING_FILES``): the check itself is unchanged."""
    from explorer import gpu_runner
    from explorer.runtime.settings import RunSettings

    monkeypatch.setenv("FUSION_EXPLORER_COSTS", str(tmp_path / "costs.json"))
    settings = RunSettings(device="cpu")
    gpu_runner.run("residual_block", None, settings)
    seen: list[tuple[float, float | None, str]] = []
    t0 = time.monotonic()

    def progress(fraction: float, status: str) -> None:
        seen.append((time.monotonic() - t0, split_left(status)[1], status))

    report = gpu_runner.run("residual_block", None, settings, progress=progress)
    total = time.monotonic() - t0
    assert report.chains and any(c.verdict is not None for c in report.chains)   # chains were timed: a normal run
    assert seen[0][1] is not None, seen[0]   # an estimate from the click on, measured by the first run
    late = [(t, left, s) for t, left, s in seen if t >= 0.1 * total and left is not None]
    assert len(late) >= 5, seen
    for t, left, status in late:
        assert abs(t + left - total) <= ESTIMATE_TOLERANCE * total + 0.5, (status, t, left, total)
    assert seen[-1][2].startswith("done in")


def test_the_views_list_the_engines_kinds_of_op():
    from explorer.runtime import breakdown as bd
    from explorer.ui import teaching_views

    assert teaching_views.OP_KINDS == bd.OP_KINDS and teaching_views.GPU_TEACHING_REPORT == bd.GPU_TEACHING_REPORT
    assert [bd.op_kind(n) for n in ("aten::conv2d", "aten::addmm", "aten::batch_norm", "aten::relu_", "aten::add_",
                                    "aten::_softmax", "aten::view", "aten::lift_fresh")] == list(bd.OP_KINDS)


def test_a_countdown_past_its_estimate_says_so():
    c = Countdown(0.0)
    c.update(0.5, with_left("loading", 5))
    c.at = 0.0
    assert c.line(now=3.0) == with_left("loading", 2)
    assert c.line(now=10.0) == "loading · taking longer than estimated"   # not "about 0 s left" for ever


def test_a_phase_is_priced_by_what_it_took_against_its_price_last_time(tmp_path, monkeypatch):
    """The formula's price of each phase is scaled by what the phase took against it in the last run like this one;
    the scale is kept against the formula's own price (not the scaled one a run showed), within bounds, and only
    for a phase priced above ``SCALE_MIN_PRICED_S``."""
    from types import SimpleNamespace

    from explorer.runtime import session
    from explorer.runtime.progress import CostMemory
    from explorer.runtime.settings import RunSettings

    monkeypatch.setenv("FUSION_EXPLORER_COSTS", str(tmp_path / "costs.json"))
    settings = RunSettings(device="cpu")
    args = (settings, ("reference", "main", "chains", "stages"), False, "cpu", 0.01, 2, 3, 0.05, 0.1)
    plain = session._phase_estimates(*args)
    scaled = session._phase_estimates(*args, {"main": 0.5, "stages": 2.0})
    assert scaled["main"] == pytest.approx(0.5 * plain["main"]) and scaled["stages"] == pytest.approx(
        2 * plain["stages"]) and scaled["reference"] == plain["reference"] and plain["main"] > 0

    memory = CostMemory()
    run = SimpleNamespace(memory=memory, key="m|1|None", device="cpu", settings=settings,
                          schedule=SimpleNamespace(estimates={"main": 2.0, "chains": 0.01}), scales={})
    session._remember_scale(run, "main", 1.0)
    assert session._phase_scales(memory, run.key, "cpu", settings) == {"main": 0.5}
    run.scales = session._phase_scales(memory, run.key, "cpu", settings)    # the next run, read at its setup
    run.schedule.estimates["main"] = 2.0 * 0.5          # showed the scaled price, and it held
    session._remember_scale(run, "main", 1.0)
    assert session._phase_scales(memory, run.key, "cpu", settings)["main"] == pytest.approx(0.5)
    session._remember_scale(run, "main", 1e-4)          # one odd run is no model: bounded
    assert session._phase_scales(memory, run.key, "cpu", settings)["main"] == session.SCALE_RANGE[0]
    session._remember_scale(run, "chains", 5.0)         # priced too small to say anything
    assert "chains" not in session._phase_scales(memory, run.key, "cpu", settings)
    other = RunSettings(device="cpu", quick=True)      # other settings: another run's scale
    assert session._phase_scales(memory, run.key, "cpu", other) == {}
