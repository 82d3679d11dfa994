"""The verdict statistics (``explorer.stats``): power, minimum effect, undecided rounds, no fused kernel.

Samples are drawn from seeded log-normal distributions (latencies have a long
right tail), paired by round as the runner's alternated timing pairs them.
"""

from __future__ import annotations

import benchmark_scripts
import numpy as np
import pytest

from explorer import stats
from explorer.report import FASTER, NO_KERNEL, SAME, SLOWER


def _pairs(effect: float, n: int, spread: float = 0.05, seed: int = 0, drift: float = 0.0):
    """Baseline and candidate times for ``n`` rounds; the candidate is ``1 + effect`` times slower.
    ``drift`` adds a slow trend shared by both (a clock ramping), which pairing must cancel."""
    rng = np.random.default_rng(seed)
    trend = 1.0 + drift * np.linspace(0, 1, n)
    base = 1.0 * trend * rng.lognormal(0, spread, n)
    cand = (1.0 + effect) * trend * rng.lognormal(0, spread, n)
    return base.tolist(), cand.tolist()


@pytest.mark.parametrize("effect, expected", [(0.10, SLOWER), (-0.10, FASTER), (0.0, SAME)])
def test_clear_effects_are_found_and_no_effect_is_not(effect, expected):
    v = stats.compare(*_pairs(effect, 60))
    assert v.label == expected and v.decided, v
    assert v.ci_low <= v.ratio <= v.ci_high
    if expected != SAME:
        assert v.p_value < stats.ALPHA
        assert abs(v.ratio - (1 + effect)) < 0.03


def test_a_significant_effect_under_the_minimum_is_no_significant_difference():
    """1% slower with a tiny spread is significant, but under the 3% minimum effect: not 'slower'."""
    v = stats.compare(*_pairs(0.01, 200, spread=0.005))
    assert v.p_value < stats.ALPHA and v.ratio > 1.0
    assert v.label == SAME and ("minimum effect" in v.note or "inside" in v.note), v


def test_power_false_positive_rate_and_detection_rate():
    """Over many seeded experiments at the rounds the test asks for: an effect of twice the minimum is
    found almost always (power), no effect is called faster/slower about alpha of the time or less."""
    detected = false = 0
    trials = 60
    for seed in range(trials):
        d = stats.compare(*_pairs(0.06, 40, spread=0.04, seed=seed))
        detected += d.label == SLOWER
        z = stats.compare(*_pairs(0.0, 40, spread=0.04, seed=1000 + seed))
        false += z.label != SAME
    assert detected / trials >= 0.9, detected
    assert false / trials <= 0.1, false


def test_too_few_rounds_are_undecided_and_ask_for_more():
    v = stats.compare(*_pairs(0.2, 5))
    assert v.label == SAME and not v.decided and "needed" in v.note
    assert stats.needs_more(v, max_rounds=100) >= stats.MIN_ROUNDS - 5
    noisy = stats.compare(*_pairs(0.04, 12, spread=0.3))
    assert not noisy.decided and noisy.rounds_needed > 12
    assert stats.needs_more(noisy, max_rounds=400) == min(noisy.rounds_needed, 400) - 12
    assert stats.needs_more(noisy, max_rounds=12) == 0          # the budget is spent: stop


def test_pairing_cancels_a_shared_drift():
    """A 40% clock ramp shared by both variants hides a 5% effect from an unpaired comparison of the
    pooled samples; the paired test still finds it."""
    b, c = _pairs(0.05, 80, spread=0.01, drift=0.4)
    pooled_spread = np.std(np.log(b))
    assert pooled_spread > 0.05 * 2  # the drift dwarfs the effect in the pooled samples
    assert stats.compare(b, c).label == SLOWER


def test_required_rounds_grow_with_the_spread():
    quiet = stats.rounds_needed(stats.log_ratios(*_pairs(0, 50, spread=0.01)))
    loud = stats.rounds_needed(stats.log_ratios(*_pairs(0, 50, spread=0.10)))
    assert stats.MIN_ROUNDS <= quiet < loud


def test_a_chain_without_a_fused_kernel_is_never_slower():
    """The runner labels it NO_KERNEL and does not time it: its verdict cannot be SLOWER whatever noise says."""
    import torch

    from explorer.fusion_engine import analyze
    from explorer.fusions.rewrite import AppliedChain
    from explorer.runtime.chains import chain_entry

    model, graph, det = analyze("transformer_block")
    chain = next(c for c in det.chains if c.pattern == "add_layer_norm")
    applied = AppliedChain(chain.id, chain.pattern, "reference ops", "fused", impl="reference", fused_kernel=False)
    entry = chain_entry(chain, applied, graph, torch.float32)
    assert entry.verdict.label == NO_KERNEL and not entry.slower
    assert entry.title == chain.title


def test_verdicts_script_tests_any_pair_of_a_committed_run(capsys):
    """The README's extra ConvNeXt verdicts come from this script over the committed rounds: fused against
    eager is faster, against compile default slower; a missing file, model or variant is one line, exit 2."""
    script, results = benchmark_scripts.load("verdicts"), benchmark_scripts.ROOT / "benchmarks" / "results"
    run = str(results / "bench_cnn_fusions_convnext_tiny_quick_h200.json")
    assert script.main([run, "fused", "eager"]) == 0
    assert "fused / eager = 0.942 [0.925, 0.946]: faster" in capsys.readouterr().out
    assert script.main([run, "fused", "compile_default"]) == 0
    assert ": slower" in capsys.readouterr().out
    for argv in ([run, "fused", "nosuch"], [run, "fused", "eager", "--model", "resnet"],
                 [str(results / "no_such_run.json"), "fused", "eager"]):
        assert script.main(argv) == 2
        err = capsys.readouterr().err
        assert err.startswith("verdicts.py: ") and err.count("\n") == 1 and "Traceback" not in err
