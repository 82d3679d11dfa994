"""The LLM epilogues: SwiGLU in the gate/up GEMM's epilogue, rotary in the QKV GEMM's, their per-shape choice.

Kernels (``explorer.fusions.kernels.gemm.gemm_swiglu``/``gemm_qkv_rotary``) run in Triton's interpreter
against float64 on odd shapes: M not a multiple of any tile (37, 14 rows), an odd intermediate size (23),
K not a multiple of the K tile (45), GQA (3 query heads over 1 kv head), head_dim 16 and 64, cos/sin per
batch or broadcast, with and without bias, in fp32, fp16 and bf16, outputs poisoned with NaN first. The
choice (``kernels.measured``) is checked on a table, and the decoder's fused graph, lowered with the
epilogues forced on, against the unfused graph in float64.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from triton_testing import (DTYPE_IDS, DTYPES, HAS_CUDA, INTERPRET, KERNEL_DEVICE, assert_close64, device_params, poison, rand, triton_interpreter,
                            up64)

from explorer.fusions import rotary as rot
from explorer.fusions import swiglu
from explorer.fusions.kernels import gemm, measured

assert triton_interpreter  # the autouse fixture, imported into this module


def cos_sin(batch, seq, d, dtype, device, offset=0):
    """Llama's cos, sin (batch, seq, d) for positions offset + 0..seq-1 (offset differs per batch row)."""
    inv = 1.0 / (10000.0 ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
    pos = torch.arange(seq, dtype=torch.float64)[None] + offset + 5 * torch.arange(batch, dtype=torch.float64)[:, None]
    emb = torch.cat([pos[..., None] * inv] * 2, dim=-1)
    return emb.cos().to(dtype=dtype, device=device), emb.sin().to(dtype=dtype, device=device)


# ====================================================================== SwiGLU in the GEMM's epilogue

@pytest.mark.parametrize("device", device_params())
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("m, k, i, bias", [(37, 45, 23, True), (5, 16, 40, False)])
def test_gemm_swiglu_matches_float64(m, k, i, bias, dtype, device, monkeypatch):
    """One GEMM writing silu(g)·u (M, I): float64 within PAIRED_TOLERANCES, eager (cuBLAS + pass) within the
    epilogue's; every element written (NaN-poisoned output)."""
    gen = torch.Generator().manual_seed(m * 7 + i)
    x = rand((m, k), dtype, device, gen)
    w = rand((2 * i, k), dtype, device, gen, scale=k ** -0.5 * 2)
    b = rand((2 * i,), dtype, device, gen, scale=0.5) if bias else None
    poison(monkeypatch, gemm)
    out = gemm.gemm_swiglu(x, w, b, i, tiles=(16, 16, 16))                  # several tiles in M, N and K
    ref = swiglu.silu_mul_packed_reference(F.linear(up64(x), up64(w), up64(b)), i)
    assert out.shape == (m, i) and out.dtype == dtype
    assert_close64(out, ref, gemm.PAIRED_TOLERANCES[dtype])
    assert_close64(gemm.gemm_swiglu(x, w, b, i), ref, gemm.PAIRED_TOLERANCES[dtype])   # the default (one) tile
    eager = swiglu.swiglu_pass(x, w, b, i)
    torch.testing.assert_close(out, eager, **gemm.TOLERANCES[dtype])


@pytest.mark.parametrize("device", device_params())
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_gemm_swiglu_interleaved_matches_float64(dtype, device, monkeypatch):
    """The variant over interleaved rows (g_0, u_0, g_1, …): one accumulator split in registers; odd M, K and I,
    a bias, tiles that cut M, N and K; float64 within PAIRED_TOLERANCES."""
    gen = torch.Generator().manual_seed(41)
    m, k, i = 37, 45, 23
    x = rand((m, k), dtype, device, gen)
    w = rand((2 * i, k), dtype, device, gen, scale=k ** -0.5 * 2)
    b = rand((2 * i,), dtype, device, gen, scale=0.5)
    w_il, b_il = gemm.interleave_gate_up(w, b)
    assert torch.equal(w_il[1::2], w[i:]) and torch.equal(b_il[0::2], b[:i])
    poison(monkeypatch, gemm)
    out = gemm.gemm_swiglu_interleaved(x, w_il, b_il, tiles=(16, 32, 16))
    ref = swiglu.silu_mul_packed_reference(F.linear(up64(x), up64(w), up64(b)), i)
    assert_close64(out, ref, gemm.PAIRED_TOLERANCES[dtype])


def test_swiglu_epilogue_keeps_leading_dims_and_refuses_autograd():
    """(B, S, K) in, (B, S, I) out; a call autograd records takes cuBLAS + pass (the kernel is forward-only)."""
    gen = torch.Generator().manual_seed(3)
    x, w = rand((2, 7, 24), torch.float32, "cpu", gen), rand((40, 24), torch.float32, "cpu", gen, scale=0.2)
    out = swiglu.swiglu_epilogue(x, w, None, 20)
    assert out.shape == (2, 7, 20)
    assert_close64(out, swiglu.swiglu_reference(up64(x), up64(w[:20]), up64(w[20:])), gemm.PAIRED_TOLERANCES[torch.float32])
    wg = w.clone().requires_grad_()
    got = swiglu.swiglu_epilogue(x, wg, None, 20)
    assert got.requires_grad and got.grad_fn is not None


# ====================================================================== rotary in the QKV GEMM's epilogue

@pytest.mark.parametrize("device", device_params())
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("b, s, hq, hkv, d, bias, table_b", [(2, 7, 3, 1, 16, True, 2), (1, 5, 2, 2, 64, False, 1)])
def test_gemm_qkv_rotary_matches_float64(b, s, hq, hkv, d, bias, table_b, dtype, device, monkeypatch):
    """q, k rotated in the epilogue and stored (B, H, S, D), v stored plain (B·S, Hkv·D): float64 within
    PAIRED_TOLERANCES, eager (cuBLAS + the rotary ops in the dtype) within the epilogue's."""
    gen = torch.Generator().manual_seed(b * 31 + hq * 7 + d)
    k_in = 40
    heads = hq + 2 * hkv
    x = rand((b * s, k_in), dtype, device, gen)
    w = rand((heads * d, k_in), dtype, device, gen, scale=k_in ** -0.5 * 2)
    bb = rand((heads * d,), dtype, device, gen, scale=0.5) if bias else None
    cos, sin = cos_sin(table_b, s, d, dtype, device, offset=11)
    poison(monkeypatch, gemm)
    qe, ke, v = gemm.gemm_qkv_rotary(x, w, bb, cos, sin, b, hq, hkv, d, tiles=(16, 16, 16))

    def unfused(x, w, bb, cos, sin):
        y = F.linear(x, w, bb).view(b, s, heads, d)
        q, k, vv = y[:, :, :hq].transpose(1, 2), y[:, :, hq:hq + hkv].transpose(1, 2), y[:, :, hq + hkv:]
        return (*rot.rotary_reference(q, k, cos, sin), vv.reshape(b * s, hkv * d))
    refs = unfused(up64(x), up64(w), up64(bb), up64(cos), up64(sin))
    assert qe.shape == (b, hq, s, d) and ke.shape == (b, hkv, s, d) and v.shape == (b * s, hkv * d)
    assert qe.is_contiguous() and ke.is_contiguous() and v.is_contiguous()
    for got, ref in zip((qe, ke, v), refs):
        assert_close64(got, ref, gemm.PAIRED_TOLERANCES[dtype])
    for got, ref in zip((qe, ke, v), unfused(x, w, bb, cos, sin)):
        torch.testing.assert_close(got, ref, **gemm.TOLERANCES[dtype])


def test_qkv_rotary_call_layouts_and_fallback():
    """``rotary.qkv_rotary`` on (B, S, K): v comes back (B, S, Hkv·D); an fp32 table on bf16 activations (eager
    would promote) takes the unfused path, with the same values."""
    gen = torch.Generator().manual_seed(5)
    b, s, hq, hkv, d = 2, 3, 2, 1, 16
    x = rand((b, s, 24), torch.bfloat16, "cpu", gen)
    w = rand(((hq + 2 * hkv) * d, 24), torch.bfloat16, "cpu", gen, scale=0.3)
    cos, sin = cos_sin(1, s, d, torch.bfloat16, "cpu")
    qe, ke, v = rot.qkv_rotary(x, w, None, cos, sin, hq, hkv, d)
    assert v.shape == (b, s, hkv * d)
    rq, rk, rv = rot.qkv_rotary_reference(x, w, None, cos, sin, hq, hkv, d)
    for got, ref in zip((qe, ke, v), (rq, rk, rv)):
        torch.testing.assert_close(got, ref, **gemm.TOLERANCES[torch.bfloat16])
    q32, _, _ = rot.qkv_rotary(x, w, None, cos.float(), sin.float(), hq, hkv, d)
    assert q32.dtype == torch.float32                     # promote(q, cos), as eager


# ====================================================================== the rotary kernel's program layout

def test_rotary_layout_balances_gqa():
    """Each program moves about TILE elements a half: K's programs take more tokens than Q's under GQA."""
    bhq, bhk, tq, tk, half, _ = rot.launch_config(8, 2, 64)                 # the zoo decoder
    assert (bhq, bhk, half) == (8, 2, 32) and tq * bhq * half == tk * bhk * half == rot.TILE
    bhq, bhk, tq, tk, half, _ = rot.launch_config(32, 8, 128)               # Llama-3-8B: 16 of one token's q heads
    assert (bhq, bhk, tq, tk) == (16, 8, 1, 2) and bhq * half == rot.TILE
    assert rot.launch_config(8, 2, 64, tokens=5)[3] == 8                    # a short input: no empty groups


# ====================================================================== the per-shape choice

def test_decide_follows_the_table(monkeypatch):
    """Ours only where the table says it was faster by more than MARGIN, on CUDA; unmeasured shapes and the CPU
    take cuBLAS + pass; the policy forces either way."""
    k_fast = measured.key("swiglu", torch.bfloat16, 64, 32, 16)
    k_close = measured.key("swiglu", torch.bfloat16, 64, 32, 8)
    monkeypatch.setitem(measured.MEASURED, k_fast, measured.Measurement(0.9, 1.0, 1.1, (64, 32, 32, 4, 3)))
    monkeypatch.setitem(measured.MEASURED, k_close, measured.Measurement(0.99, 1.0, None, (64, 32, 32, 4, 3)))
    fast = measured.decide("swiglu", "cuda", torch.bfloat16, 64, 32, 16)
    assert fast.fused and fast.tiles == (64, 32, 32, 4, 3) and fast.why == "measured_faster"
    assert measured.decide("swiglu", "cuda", torch.bfloat16, 64, 32, 8).why == "measured_slower"
    assert measured.decide("swiglu", "cuda", torch.bfloat16, 65, 32, 8).why == "unmeasured"
    assert not measured.decide("swiglu", "cpu", torch.bfloat16, 64, 32, 16).fused
    with measured.policy(swiglu="always"):
        assert measured.decide("swiglu", "cpu", torch.bfloat16, 1, 2, 3).fused
    with measured.policy(swiglu="never"):
        assert not measured.decide("swiglu", "cuda", torch.bfloat16, 64, 32, 16).fused
    with pytest.raises(ValueError):
        with measured.policy(swiglu="sometimes"):
            pass
    note = swiglu.epilogue_note(64, 32, 8)
    assert "near miss" in note and "0.990 ms" in note and note.id == "swiglu.note.slower"


def test_table_from_bench_reads_the_benchmark_json():
    """The benchmark's kernel table becomes MEASURED entries: the shape from the case, the best tile from its name."""
    doc = {"environment": {"device_name": "NVIDIA H200"},
           "swiglu": {"table": [dict(case="swiglu_gemm zoo decoder M16384 K512 I1376", ours_variant="ours[128x64x64 w8 s4]",
                                     ours_ms=0.1, baseline_ms=0.2, inductor_ms=0.15)]},
           "qkv": {"table": [dict(case="qkv_rotary_gemm Llama-3-8B M4096 K4096 Hq32 Hkv8 D128", ours_variant="fused",
                                  ours_ms=0.5, baseline_ms=0.4, inductor_ms=None)]}}
    table = measured.table_from_bench(doc)
    assert table[("swiglu", "bfloat16", 16384, 512, 1376)].tiles == (128, 64, 64, 8, 4)
    got = table[("qkv_rotary", "bfloat16", 4096, 4096, 32, 8, 128)]
    assert got.tiles is None and got.baseline_ms == 0.4


# ====================================================================== the decoder, lowered with the epilogues

@pytest.mark.skipif(not INTERPRET, reason="lowers the decoder on the CPU, where Triton runs only in its interpreter "
                                          "(without CUDA); on a GPU machine the CUDA tests above run the kernels")
def test_decoder_lowered_with_epilogues_matches_float64(monkeypatch):
    """The tiny Llama decoder's fused graph, prepared lean with both epilogues forced on: one qkv_rotary and one
    swiglu_epilogue call per layer replace the QKV GEMM + rotary kernel and the gate/up GEMM + pass, and the
    logits match the unfused graph in float64 (also with the interleaved SwiGLU variant, and with token-major
    rotary outputs); with the epilogues off, neither call appears."""
    from triton_testing import detect_module, fuse_all, randomized

    from explorer.runtime import measure
    from explorer.sources import models

    torch.manual_seed(0)
    sizes = dict(layers=1, hidden=48, heads=3, kv_heads=1, intermediate=40, vocab=64, max_positions=32)
    model = randomized(models.LlamaDecoder(sizes).eval(), 1)
    ids = torch.randint(0, 64, (2, 7))
    gm, det = detect_module(model, (ids,), "tiny_llama")
    fused = fuse_all(gm, det)
    labels = {a.pattern: a.implementation for a in fused.applied}
    assert "not measured at M=14, K=48, 3 over 1 heads of 16" in labels["rotary"]
    assert "not measured at M=14, K=48, I=40" in labels["swiglu"]
    ref = measure.prepare_graph(gm, "cpu", torch.float64)(ids)
    ref = ref[0] if isinstance(ref, (tuple, list)) else ref
    with measured.policy(swiglu="always", qkv_rotary="always"):
        lean = measure.prepare_graph(fused.gm, "cpu", torch.float32)
    targets = [n.target for n in lean.graph.nodes if n.op == "call_function"]
    assert targets.count(rot.qkv_rotary) == 1 and targets.count(swiglu.swiglu_epilogue) == 1
    assert rot.fused_rotary not in targets
    out = lean(ids)
    out = out[0] if isinstance(out, (tuple, list)) else out
    torch.testing.assert_close(out.double(), ref.double(), rtol=1e-4, atol=1e-4)
    # a measured interleaved tile: the lowering interleaves the weight once and calls that variant
    monkeypatch.setitem(measured.MEASURED, measured.key("swiglu", torch.float32, 14, 48, 40),
                        measured.Measurement(0.1, 0.2, None, (16, 32, 16, 4, 1), "test", "interleaved"))
    with measured.policy(swiglu="always", qkv_rotary="never"):
        il = measure.prepare_graph(fused.gm, "cpu", torch.float32)
    targets = [n.target for n in il.graph.nodes if n.op == "call_function"]
    assert targets.count(swiglu.swiglu_epilogue_interleaved) == 1 and rot.qkv_rotary not in targets
    out = il(ids)
    out = out[0] if isinstance(out, (tuple, list)) else out
    torch.testing.assert_close(out.double(), ref.double(), rtol=1e-4, atol=1e-4)
    # epilogues off: neither call; the rotary kernel on the column views, read by attention only, writes
    # token-major outputs where that is switched on
    monkeypatch.setattr(rot, "TOKEN_MAJOR_ON_COLUMN_VIEWS", True)
    with measured.policy(swiglu="never", qkv_rotary="never"):
        tm = measure.prepare_graph(fused.gm, "cpu", torch.float32)
    targets = [n.target for n in tm.graph.nodes if n.op == "call_function"]
    assert rot.qkv_rotary not in targets and swiglu.swiglu_epilogue not in targets
    assert targets.count(rot.rotary_token_major) == 1
    out = tm(ids)
    out = out[0] if isinstance(out, (tuple, list)) else out
    torch.testing.assert_close(out.double(), ref.double(), rtol=1e-4, atol=1e-4)


def test_committed_table_is_the_committed_measurement():
    """``MEASURED`` is exactly what ``table_from_bench`` reads from the committed H200 JSON: no number typed by hand."""
    import json
    from pathlib import Path

    from explorer.ui import kernel_table

    results = Path(__file__).resolve().parents[1] / "benchmarks" / "results"
    docs = [json.loads((results / name).read_text()) for name in kernel_table.FILES if (results / name).exists()]
    assert measured.table_from_runs(docs) == measured.MEASURED
    assert measured.decide("qkv_rotary", "cuda", torch.bfloat16, 16384, 512, 8, 2, 64).fused
    assert not measured.decide("swiglu", "cuda", torch.bfloat16, 4096, 4096, 14336).fused
    zoo = measured.decide("swiglu", "cuda", torch.bfloat16, 16384, 512, 1376)
    assert zoo.fused and zoo.measurement.variant == "interleaved" and zoo.tiles == (128, 256, 64, 8, 3)


def test_learn_page_kernel_table_rows(tmp_path):
    """The Learn page's table: one row per committed entry, in English and 中文, the chosen path named; a missing
    file is None (the panel then says so in one line)."""
    from pathlib import Path

    from explorer.ui import kernel_table

    doc = kernel_table.load(Path(__file__).resolve().parents[1] / "benchmarks" / "results")
    en, zh = kernel_table.kernel_rows(doc, "en"), kernel_table.kernel_rows(doc, "zh")
    assert len(en) == len(zh) == sum(len(doc[p]["table"]) for p in ("memory", "swiglu", "qkv"))
    qkv = next(r for r in en if r["kernel and shape"].startswith("qkv_rotary_gemm zoo"))
    assert qkv["what runs"] == "ours (the epilogue)" and qkv["ours (µs)"] == "57.8"
    assert any("拷贝的" in v for r in zh for v in r.values())
    assert kernel_table.load(tmp_path) is None


def test_fused_swiglu_call_follows_the_policy():
    """The fused call target (the non-lean graph's) asks the decision once per signature and policy: forced on it
    runs the epilogue GEMM, forced off cuBLAS + pass; both match float64."""
    from unittest import mock

    if not (HAS_CUDA or INTERPRET):
        pytest.skip("Triton runs neither compiled nor interpreted")
    gen = torch.Generator().manual_seed(9)
    x, w = rand((3, 5, 24), torch.float32, KERNEL_DEVICE, gen), rand((40, 24), torch.float32, KERNEL_DEVICE, gen, scale=0.2)
    ref = swiglu.swiglu_reference(up64(x), up64(w[:20]), up64(w[20:]))
    for mode, calls in (("always", 1), ("never", 0)):
        with measured.policy(swiglu=mode), mock.patch.object(gemm, "gemm_swiglu", wraps=gemm.gemm_swiglu) as spy:
            assert_close64(swiglu.fused_swiglu(x, w, None, 20), ref, gemm.PAIRED_TOLERANCES[torch.float32])
        assert spy.call_count == calls
