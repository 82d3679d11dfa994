"""The README's Measured table from ``bench_measured.py``'s JSON: rows, verdict cells, the targets missed, and
the README block replaced with the rest kept (``benchmarks/measured_table.py``); the host-per-launch arithmetic
of ``bench_measured.py``. Records are built the way ``bench_measured`` writes them; no GPU is needed."""

from __future__ import annotations

import benchmark_scripts

table = benchmark_scripts.load("measured_table", "measured_table_test")


def _row(median: float, busy: float | None = None, launches: float | None = None) -> dict:
    return dict(latency_ms=dict(median=median, p20=median, p80=median, reps=10), precision=dict(rel_l2=1e-3),
                gpu_busy_ms=busy, kernel_launches=launches)


def _verdict(target, candidate, baseline, c_ms, b_ms, label, ratio):
    return dict(target=target, candidate=candidate, baseline=baseline, candidate_ms=c_ms, baseline_ms=b_ms,
                verdict=label, met=label != "slower", ratio=ratio, ci_low=ratio * 0.98, ci_high=ratio * 1.02,
                p_value=1e-6, n=120, note="")


def _record() -> dict:
    variants = {"unfused": _row(7.3, 6.9, 60), "fused": dict(_row(5.8, 5.6, 48), top_kernels=[
                    dict(name="nvjet_gemm_bf16", calls=14, total_us=3100.0, share=0.55)]),
                "compile_default": _row(6.3, 5.8, 57),
                "compile_max_autotune_no_cudagraphs": _row(6.1, 5.5, 55),
                "fused_graph": _row(5.62), "compile_reduce_overhead": _row(5.5, 5.7)}
    return {
        "case": {"title": "8B-layer decoder prefill 4 × 1024"}, "notes": [], "compile_notes": {},
        "sessions": [{"rounds": 120, "variants": variants}],
        "verdicts": [
            _verdict("fused <= faster of compile default / max-autotune-no-cudagraphs", "fused",
                     "compile_max_autotune_no_cudagraphs", 5.8, 6.1, "faster", 0.95),
            _verdict("fused vs unfused", "fused", "unfused", 5.8, 7.3, "faster", 0.79),
            _verdict("fused + CUDA graphs <= reduce-overhead", "fused_graph", "compile_reduce_overhead",
                     5.62, 5.5, "slower", 1.04)],
        "gpu_busy": {"fused_ms": 5.6, "inductor_ms": {"compile_default": 5.8,
                                                      "compile_max_autotune_no_cudagraphs": 5.5},
                     "inductor_best": "compile_max_autotune_no_cudagraphs", "ratio": 5.6 / 5.5, "met": False},
        "host": {"variants": {v: {"launches": n, "host_us_per_launch": {"median": us}}
                              for v, n, us in (("unfused", 60, 9.0), ("fused", 48, 4.0),
                                               ("compile_default", 57, 8.8))},
                 "verdict_per_launch": {"label": "faster", "ratio": 0.45, "ci_low": 0.4, "ci_high": 0.5}},
    }


def test_row_verdicts_and_missed_targets():
    docs = [("call1.json", {"environment": {"device_name": "NVIDIA H200", "torch": "2.11", "triton": "3.6",
                                             "driver": "580"},
                             "models": {"llama_decoder_8b_layers": _record(),
                                        "bert_base": {"error": "not started: 530 s of the 520 s budget spent"}}})]
    text = table.markdown(docs)
    lines = text.splitlines()
    row = next(line for line in lines if line.startswith("| 8B-layer"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    # fused faster than the faster compile (max-autotune here): bold on fused, the baseline plain
    assert cells[1:5] == ["7.30", "**5.80**", "6.30", "6.10"]
    assert cells[5].startswith("faster 0.95×")
    # the graph pairing: reduce-overhead faster, so it is the bold one and the verdict says slower
    assert cells[6:9] == ["5.62", "**5.50**", "**slower** 1.04× [1.02, 1.06]"]
    assert cells[9] == "5.600 / 5.500 (1.02×)"
    assert cells[10] == "9.0 / 4.0 / 8.8 (faster 0.45× [0.40, 0.50])"
    assert cells[11] == "60 / 48 / 57"
    assert any(line.startswith("| BERT-base s128 |") and "not measured" in line for line in lines)
    missed = text.split("Targets missed in this run:")[1]
    assert "fused + CUDA graphs <= reduce-overhead: **missed**, 5.620 against compile_reduce_overhead 5.500" in missed
    assert "GPU busy ≤ inductor's: **missed**, 5.600 against compile_max_autotune_no_cudagraphs 5.500" in missed
    assert "BERT-base s128: not measured" in missed
    assert "GPU busy at least 5% below inductor's: **missed**, 5.600 against 5.500 ms" in missed
    assert "fused `nvjet_gemm_bf16` ×14 3100 µs; inductor not profiled" in missed
    assert "fused vs unfused" not in missed          # not a target


def test_merge_keeps_a_measured_record_over_a_later_failure():
    good, failed = _record(), {"error": "stopped at --hard-s 575 during 'loading'"}
    merged = table.merge([("a.json", {"models": {"m": good}}), ("b.json", {"models": {"m": failed}})])
    assert merged["m"][0] == "a.json"
    merged = table.merge([("a.json", {"models": {"m": failed}}), ("b.json", {"models": {"m": good}})])
    assert merged["m"][0] == "b.json"


def test_readme_block_replaced_and_the_rest_kept():
    text = f"intro\n{table.START}\nold table\n{table.END}\nafter\n"
    out = table.replace_block(text, "new table")
    assert out == f"intro\n{table.START}\nnew table\n{table.END}\nafter\n"


def test_host_per_launch_is_plain_minus_replay_over_launches():
    bench = benchmark_scripts.load("bench_measured", "bench_measured_test")
    assert bench.host_per_launch([2.0, 3.0], [1.5, 1.0], 50) == [10.0, 40.0]


def test_autotune_cited_from_an_earlier_run_with_its_own_verdict():
    later = _record()
    later["sessions"][0]["variants"].pop("compile_max_autotune_no_cudagraphs")
    later["verdicts"][0] = _verdict("fused <= faster of compile default / max-autotune-no-cudagraphs (max-autotune-"
                                    "no-cudagraphs not measured)", "fused", "compile_default", 5.8, 6.3, "faster", 0.92)
    docs = [("call1.json", {"models": {"llama_decoder_8b_layers": _record()}}),
            ("call2.json", {"models": {"llama_decoder_8b_layers": later}})]
    text = table.markdown(docs)
    row = next(line for line in text.splitlines() if line.startswith("| 8B-layer"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[4] == "6.10 (`call1.json`; there fused 5.80 vs max_autotune_no_cudagraphs 6.10: faster 0.95× [0.93, 0.97])"
    assert cells[5].startswith("faster 0.92×")          # the plain verdict is the later run's own pairing
    assert "max-autotune-no-cudagraphs not measured" not in text.split("Targets missed")[1]
