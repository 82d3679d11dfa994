"""The attention block's measured choice (issue 20): SDPA, the unfused block or the Triton scores kernel, per
device name, dtype, S bucket, head dim and additive terms, from a table baked from
``benchmarks/bench_attention_choice.py``'s JSON.

The tables here are written by the test into tmp as the bench writes its JSON and baked by the bench's own
``bake``: Swin-T's window attention (S = 49, D = 32, a bias) measured slower as SDPA than unfused, BERT's
(S = 128, D = 64, a padding mask) faster. The rewrite of torchvision's swin_t (random weights, 1×3×64×64) for an
H200 in fp16 then leaves its 12 window attentions unfused with the measured reason, in English and 中文; BERT's
block stays one SDPA call; a CPU target keeps SDPA and computes what the model does.
"""

from __future__ import annotations

import json

import pytest
import torch
from benchmark_scripts import load
from triton_testing import detect_module

from explorer.fusions import attention
from explorer.fusions.plan import make_plan
from explorer.fusions.rewrite import apply_plan
from explorer.ui import i18n
from explorer.vocab import Target

H200 = "NVIDIA H200"


def _case(name, s, d, terms, times):
    """One row of the bench's JSON (``run_case``'s keys the bake reads)."""
    return dict(case=name, model=name, dtype="float16", s=s, d=d, has_terms=terms, s_bucket=attention.s_bucket(s),
                checks={n: dict(ok=True) for n in times},
                times={n: dict(median_us=m, p20_us=m * 0.98, p80_us=m * 1.02) for n, m in times.items()})


def _table(tmp_path, triton_us: float | None = None):
    """Bake a bench result (Swin-T's four stages: SDPA slower; BERT: SDPA faster) into ``tmp_path``."""
    swin = [dict(sdpa=s, unfused=u, **({"triton": triton_us / 4} if triton_us else {}))
            for s, u in ((600.0, 300.0), (400.0, 220.0), (300.0, 170.0), (264.0, 120.0))]
    doc = dict(schema="bench_attention_choice/1", command="python3 benchmarks/bench_attention_choice.py",
               date_utc="2026-12-02T08:55:00+00:00", environment=dict(device_name=H200, torch="2.11"),
               cases=[_case(f"tv/swin_t stage {i}", 49, 32, True, t) for i, t in enumerate(swin, 1)]
               + [_case("hf/bert s128", 128, 64, True, dict(sdpa=300.0, unfused=900.0, triton=500.0))])
    result = tmp_path / "bench_attention_choice_h200.json"
    result.write_text(json.dumps(doc))
    table = tmp_path / "attention_measured.json"
    load("bench_attention_choice").bake(result, table)
    return table


def test_the_selection_reads_the_table(tmp_path):
    table = _table(tmp_path)
    rows = json.loads(table.read_text())["rows"]
    assert {(r["s_bucket"], r["d"], r["best"]) for r in rows} == {(49, 32, "unfused"), (128, 64, "sdpa")}
    with attention.measured_table(table, device_name=H200):
        swin = attention.select_attention("cuda", torch.float16, 49, 32, True)
        bert = attention.select_attention("cuda", torch.float16, 128, 64, True, scores_kernel=True)
        v2 = attention.select_attention("cuda", torch.float16, 64, 32, True)       # Swin-V2's S = 64: not measured
        fp32 = attention.select_attention("cuda", torch.float32, 49, 32, True)
        bare = attention.select_attention("cuda", torch.float16, 49, 32, False)    # no additive term: not measured
        cpu = attention.select_attention("cpu", torch.float16, 49, 32, True)
    assert (swin.impl, swin.fused) == ("unfused", False)
    assert str(swin.label) == ("SDPA measured slower than the unfused block at S=49, D=32 on NVIDIA H200: 1564 µs "
                               "against 810 µs (float16, 4 shape(s) summed)")
    assert i18n.message(swin.label, "zh") == ("在 NVIDIA H200 上 S=49、D=32 时测得 SDPA 比未融合的块慢：1564 µs 对 810 µs"
                                              "（float16，4 个形状合计）")
    assert v2.impl == "sdpa" and "not measured at S=64 (bucket 64)" in str(v2.label)
    assert (bert.impl, bert.fused) == ("sdpa", True)
    assert "measured 300 µs against the unfused block's 900 µs at S=128, D=64 on NVIDIA H200" in str(bert.label)
    assert "未融合的块为 900 µs" in i18n.message(bert.label, "zh")
    for c in (fp32, bare):   # not in the table: SDPA, as before, and the label says so
        assert c.impl == "sdpa" and "not measured at S=49 (bucket 49)" in str(c.label)
        assert "没有测量：照旧用 SDPA" in i18n.message(c.label, "zh")
    assert cpu.impl == "sdpa" and str(cpu.label) == str(attention.WORDS("label.sdpa_cpu", device="cpu"))
    for c in (swin, bert, fp32, bare):   # read back from the English a report stores, too
        assert i18n.message(str(c.label), "zh") == i18n.message(c.label, "zh")
    # outside the block: the committed table, keyed by this machine's device name (none here: no CUDA)
    if not torch.cuda.is_available():
        outside = attention.select_attention("cuda", torch.float16, 49, 32, True)
        assert outside.impl == "sdpa" and "a CUDA device not known where the plan is made" in str(outside.label)
        assert "未知的 CUDA 设备" in i18n.message(outside.label, "zh")


def test_the_triton_scores_kernel_is_chosen_only_where_it_applies(tmp_path):
    table = _table(tmp_path, triton_us=400.0)      # 400 µs over Swin's four stages: faster than 810 unfused
    with attention.measured_table(table, device_name=H200):
        fits = attention.select_attention("cuda", torch.float16, 49, 32, True, scores_kernel=True)
        not_here = attention.select_attention("cuda", torch.float16, 49, 32, True, scores_kernel=False)
        bert = attention.select_attention("cuda", torch.float16, 128, 64, True, scores_kernel=True)
    assert fits.impl == "triton" and "measured 400 µs against SDPA's 1564 µs at S=49, D=32" in str(fits.label)
    assert "时测得 400 µs，SDPA 为 1564 µs" in i18n.message(fits.label, "zh")
    assert not_here.impl == "unfused"
    assert bert.impl == "sdpa"                      # triton 500 µs is slower than SDPA's 300


def test_the_bench_runs_and_bakes_on_the_cpu(tmp_path):
    """The script the H200 runs, as a CPU smoke run (tiny batches): every candidate passes its float64 check and
    is timed, and its JSON bakes into a table the selection reads."""
    bench = load("bench_attention_choice")
    out = tmp_path / "smoke.json"
    assert bench.main(["--smoke", "--only", "tv/swin_t stage 1", "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert [r["case"] for r in doc["cases"]] == ["tv/swin_t stage 1", "tv/swin_t stage 1 shifted"]
    assert all(c["ok"] for r in doc["cases"] for c in r["checks"].values())
    assert all(set(r["times"]) == {"sdpa", "unfused"} for r in doc["cases"])
    rows = bench.bake(out, tmp_path / "table.json")
    assert list(rows) == [("cpu (smoke)", "float16", 49, 32, True)]
    assert attention.read_table((tmp_path / "table.json").read_text()) == rows


def test_a_candidate_within_the_spread_keeps_sdpa():
    row = dict(us=dict(sdpa=[100.0, 90.0, 110.0], unfused=[95.0, 85.0, 105.0]))
    assert attention.measured_best(row) == "sdpa"                 # 5 % faster, bands overlap: SDPA stays
    row["us"]["unfused"] = [80.0, 78.0, 85.0]
    assert attention.measured_best(row) == "unfused"
    assert attention.measured_best(row, ("sdpa",)) == "sdpa"


@pytest.mark.parametrize("text, words", [
    ("{", "not JSON"), ('{"schema": "other", "rows": []}', "not a attention_measured/1 table"),
    ('{"schema": "attention_measured/1", "rows": [{"device": "x"}]}', "row 0 is not"),
])
def test_a_bad_table_is_one_line(text, words):
    with pytest.raises(attention.TableError) as err:
        attention.read_table(text, "t.json")
    assert words in str(err.value) and "\n" not in str(err.value)


@pytest.fixture(scope="module")
def swin():
    import torchvision

    torch.manual_seed(0)
    model = torchvision.models.swin_t(weights=None).eval()
    x = torch.randn(1, 3, 64, 64)
    gm, det = detect_module(model, (x,), "swin_t")
    return gm, det, x


def test_swin_window_attention_is_left_unfused_with_the_measured_reason(tmp_path, swin):
    gm, det, x = swin
    chains = [c for c in det.chains if c.pattern == "matmul_softmax"]
    by_name = {n.name: n for n in gm.graph.nodes}
    # 64² → 16² tokens at stage 1: padded to 21², 3 × 3 windows of 49 tokens, 3 heads of 32; the shifted blocks of
    # stages 1 and 2 add the window mask (stages 3 and 4 are one window: no shift)
    first = by_name[chains[0].node_for("scores")].meta["val"]
    assert len(chains) == 12 and tuple(first.shape) == (9, 3, 49, 49)
    assert sum(c.node_for("mask2") is not None for c in chains) == 2
    table = _table(tmp_path)
    with attention.measured_table(table, device_name=H200):
        fused = apply_plan(gm, det, make_plan(det, "matmul_softmax"), Target("cuda", "fp16"))
        on_cpu = apply_plan(gm, det, make_plan(det, "matmul_softmax"), Target("cpu"))
    attn = [a for a in fused.applied if a.pattern == "matmul_softmax"]
    assert len(attn) == 12 and all(a.status == "refused" for a in attn), attn
    reason = attn[0].reason
    assert str(reason).startswith("SDPA measured slower than the unfused block at S=49, D=32 on NVIDIA H200")
    assert "测得 SDPA 比未融合的块慢" in i18n.message(reason, "zh")
    assert "fused_attention" not in fused.gm.code and "scaled_dot_product_attention" not in fused.gm.code
    # a CPU target keeps today's choice, and the fused graph computes what the model does; the refused graph is
    # the model's own ops, bit for bit
    assert all(a.status == "fused" and a.impl == "sdpa" for a in on_cpu.applied if a.pattern == "matmul_softmax")
    with torch.no_grad():
        ref, out, kept = gm(x), on_cpu.gm(x), fused.gm(x)
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-4)
    assert torch.equal(kept, ref)


def test_swin_takes_the_triton_scores_kernel_where_the_table_says_so(tmp_path, swin, monkeypatch):
    gm, det, x = swin
    monkeypatch.setenv("TRITON_INTERPRET", "0")     # planned for the GPU, where the kernel compiles
    chains = [c.id for c in det.chains if c.pattern == "matmul_softmax"]
    plan = make_plan(det, "matmul_softmax", reject=chains[2:])   # stage 1: the plain form and the shifted (2 terms)
    with attention.measured_table(_table(tmp_path, triton_us=400.0), device_name=H200):
        fused = apply_plan(gm, det, plan, Target("cuda", "fp16"))
    monkeypatch.setenv("TRITON_INTERPRET", "1")     # run here, interpreted
    attn = [a for a in fused.applied if a.pattern == "matmul_softmax"]
    assert len(attn) == 2 and all(a.status == "fused" and a.impl == "triton" for a in attn), attn
    calls = [n for n in fused.gm.graph.nodes if n.target is attention.fused_capped_attention]
    assert len(calls) == 2 and all(n.meta["fused_choice"].impl == "triton" for n in calls)   # for the lowering
    with torch.no_grad():    # the graph as captured (fp32, CPU, kernel interpreted): what the model computes
        torch.testing.assert_close(fused.gm(x), gm(x), rtol=1e-4, atol=1e-4)


def test_bert_stays_one_sdpa_call(tmp_path):
    import transformers as T

    torch.manual_seed(0)
    cfg = T.BertConfig(hidden_size=128, num_attention_heads=2, num_hidden_layers=1, intermediate_size=256,
                       vocab_size=100, max_position_embeddings=128)
    cfg._attn_implementation = "eager"
    ids = torch.randint(0, 100, (1, 128))
    keep = torch.ones(1, 128, dtype=torch.long)
    keep[0, 100:] = 0
    gm, det = detect_module(T.BertModel(cfg).eval(), (ids, keep), "bert")
    with attention.measured_table(_table(tmp_path), device_name=H200):
        fused = apply_plan(gm, det, make_plan(det, "matmul_softmax"), Target("cuda", "fp16"))
        on_cpu = apply_plan(gm, det, make_plan(det, "matmul_softmax"), Target("cpu"))
    (a,) = [a for a in fused.applied if a.pattern == "matmul_softmax"]
    assert a.status == "fused" and a.impl == "sdpa" and "against the unfused block's 900 µs" in str(a.implementation)
    assert "fused_attention" in fused.gm.code and all(a.impl == "sdpa" for a in on_cpu.applied)
    with torch.no_grad():   # SDPA as chosen for the H200 (run here on the CPU) and for the CPU: the model's output
        ref = torch.utils._pytree.tree_leaves(gm(ids, keep))
        for out in (fused.gm(ids, keep), on_cpu.gm(ids, keep)):
            for r, o in zip(ref, torch.utils._pytree.tree_leaves(out), strict=True):
                torch.testing.assert_close(o, r, rtol=1e-4, atol=1e-4)


def test_the_table_keys_window_sizes_apart():
    """Window attention's token counts are keys of their own (the H200 picked differently at 49 and 64); long
    sequences share power-of-two keys."""
    assert [attention.s_bucket(s) for s in (1, 49, 64, 196, 197, 256)] == [1, 49, 64, 196, 197, 256]
    assert [attention.s_bucket(s) for s in (257, 1000, 1024, 1025)] == [512, 1024, 1024, 2048]
