"""The linear + residual family (``explorer.fusions.linear_residual``): the GEMM with the residual in its epilogue
against float64, its selection, the pattern's chains and near misses, the rewrite, both languages.

The kernel runs in Triton's interpreter without a GPU (``triton_testing``) on awkward shapes (ragged tiles in M, N
and K, a 3-D input, a residual that is a strided view) in fp32, fp16 and bf16; ``gpu``-marked parameters run it
compiled on CUDA. The reference is the unfused ``F.linear(x, W, b) + r``; outputs start poisoned (NaN) where the
kernel allocates them. The model-level tests derive their counts from the architecture.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn
from triton_testing import (DTYPE_IDS, DTYPES, INTERPRET, KERNEL_DEVICE, assert_close64, detect_module, device_params,
                            fuse_all, needs_backend, rand, triton_interpreter, up64)

from explorer.fusions import BY_NAME, claims, linear_residual as lr
from explorer.ui import i18n

assert triton_interpreter  # the autouse fixture, imported into this module

#: (leading dims of x, in_features, out_features): ragged against every tile size the GEMM plans.
SHAPES = [((37,), 19, 45), ((3, 13), 72, 33), ((1, 5), 130, 17)]


# ====================================================================== kernel

@pytest.mark.parametrize("device", device_params())
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("lead, k, n", SHAPES, ids=lambda v: str(v))
def test_gemm_with_residual_matches_float64(lead, k, n, dtype, device):
    """``x @ Wᵀ + b + r`` in one kernel equals the unfused ops in float64 within the GEMM epilogue's tolerances."""
    gen = torch.Generator().manual_seed(k * n)
    x, w = rand((*lead, k), dtype, device, gen), rand((n, k), dtype, device, gen, scale=k ** -0.5)
    b, r = rand((n,), dtype, device, gen), rand((*lead, n), dtype, device, gen)
    choice = lr.select_linear_residual(device, dtype)
    assert choice.impl == "triton_gemm" and choice.fused
    with torch.inference_mode():
        out = lr.linear_residual(x, w, b, r)
    assert out.shape == (*lead, n) and out.dtype == dtype
    assert_close64(out, lr.linear_residual_reference(up64(x), up64(w), up64(b), up64(r)), lr.TOLERANCES[dtype])


@pytest.mark.parametrize("device", device_params())
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_no_bias_and_a_strided_residual(dtype, device):
    """A linear without bias, and a residual read through its strides (a column slice of a wider tensor)."""
    gen = torch.Generator().manual_seed(3)
    x, w = rand((29, 40), dtype, device, gen), rand((23, 40), dtype, device, gen, scale=40 ** -0.5)
    r = rand((29, 50), dtype, device, gen)[:, 3:26]                               # (29, 23), row stride 50
    assert not r.is_contiguous()
    with torch.inference_mode():
        out = lr.linear_residual(x, w, None, r)
    assert_close64(out, lr.linear_residual_reference(up64(x), up64(w), None, up64(r)), lr.TOLERANCES[dtype])


@needs_backend
def test_the_kernel_is_really_called(monkeypatch):
    """Where Triton runs (compiled on CUDA, else interpreted) the fused call goes through the Triton GEMM (a broken
    kernel is seen), and the separate choice never does."""
    calls = []
    zeros = torch.zeros(4, 3, device=KERNEL_DEVICE)
    monkeypatch.setattr(lr, "gemm_epilogue", lambda *a, **k: calls.append(a) or zeros)
    x, w, r = (torch.ones(*s, device=KERNEL_DEVICE) for s in ((4, 5), (3, 5), (4, 3)))
    with torch.inference_mode():
        assert torch.equal(lr.fused_linear_residual(x, w, None, r), zeros) and len(calls) == 1
        assert torch.equal(lr.fused_linear_residual_separate(x, w, None, r), torch.full_like(zeros, 6.0))
    assert len(calls) == 1


def test_the_selection(monkeypatch):
    """Triton where it runs in fp32/fp16/bf16; the separate ops for float64, without Triton, or when asked."""
    assert lr.select_linear_residual("cpu", torch.float64).impl == "separate"
    assert lr.select_linear_residual("cpu", torch.float16, separate=True).label == "linear + add_ in place (2 kernels)"
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    off = lr.select_linear_residual("cpu", torch.float32)
    assert not off.fused and str(off.label) == ("linear + add_ in place (2 kernels: no Triton on cpu "
                                                "(TRITON_INTERPRET=1 interprets it))")


# ====================================================================== the pattern on small models

class ResidualMLP(nn.Module):
    """``x + fc2(gelu(fc1(x)))`` twice, then projections added to a constant, to a broadcast tensor, and after a view
    that flattens them."""

    def __init__(self, d: int = 24) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(nn.ModuleDict({"fc1": nn.Linear(d, 2 * d), "fc2": nn.Linear(2 * d, d)})
                                    for _ in range(2))
        self.to_const, self.to_row, self.to_flat = nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, d)
        self.offset = nn.Parameter(torch.randn(d))

    def forward(self, x, row):
        for b in self.blocks:
            x = b["fc2"](torch.nn.functional.gelu(b["fc1"](x))) + x            # linear + residual: one chain each
        y = self.to_const(x) + self.offset                                       # a constant: no residual
        y = self.to_row(y) + row                                                 # (1, d) broadcast over (B, d)
        return self.to_flat(y).view(-1) + y.view(-1)                             # reshaped before the add


def _model():
    torch.manual_seed(0)
    return ResidualMLP().eval(), (torch.randn(6, 24), torch.randn(1, 24))


def test_chains_near_misses_and_the_rewrite():
    """Two residual blocks: two chains (their fc1 → gelu is the linear family's); the constant, the broadcast and the
    reshaped add are near misses with their reasons, in both languages; the fused model computes the same."""
    model, inputs = _model()
    gm, det = detect_module(model, inputs, "residual_mlp")
    chains = [c for c in det.chains if c.pattern == "linear_residual"]
    assert len(chains) == len(model.blocks) == 2
    assert [c.pattern for c in det.chains].count("linear_act") == len(model.blocks)
    misses = {str(m.reason).split(" ")[0]: m for m in det.near_misses if m.pattern == "linear_residual"}
    assert sorted(misses) == ["a", "add", "the"]
    assert str(misses["a"].reason) == "a view reshapes the linear output before the add"
    assert str(misses["add"].reason) == "add of a constant, not a residual"
    assert str(misses["the"].reason) == "the residual's shape [[1, 24]] differs from the linear output [[6, 24]] (broadcast)"
    assert i18n.message(misses["the"].reason, "zh") == "残差的形状 [[1, 24]] 与线性层输出 [[6, 24]] 不同（广播）"
    fused = fuse_all(gm, det)
    applied = {a.chain_id: a for a in fused.applied}
    assert all(applied[c.id].status == "fused" for c in chains)
    if INTERPRET:   # the model is on the CPU: its kernel is Triton's only where the interpreter runs it
        assert str(applied[chains[0].id].implementation) == \
            "triton GEMM+bias+residual (1 kernel) [Triton interpreter on cpu]"
        assert i18n.translate_phrases(applied[chains[0].id].implementation, "zh") == \
            "triton GEMM+bias+残差（1 个内核） [cpu 上用 Triton 解释器运行]"
    else:
        assert str(applied[chains[0].id].implementation).startswith("linear + add_ in place (2 kernels")
    with torch.inference_mode():
        want, got = gm(*inputs), fused.gm(*inputs)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_its_texts_in_both_languages():
    """The pattern's title, explanation and teaching texts come from its own ``WORDS``, in English and Chinese."""
    p = BY_NAME["linear_residual"]
    assert i18n.pattern_text(p, "label", "en") == "Linear+bias+residual"
    assert i18n.pattern_text(p, "label", "zh") == "Linear+偏置+残差"
    assert "残差" in i18n.pattern_text(p, "explanation", "zh")
    assert i18n.family_title("linear_residual", "zh") == "线性层 + 残差相加"
    assert all(i18n.has_translation(c) for c in p.caveats)


# ====================================================================== the add two fusions want

def test_residual_home_reads_the_measured_table(monkeypatch):
    """One decision per shape: the table's threshold in M, a shape not in it keeps the add with the Add+RMSNorm, and
    the policy forces either side; each answer says on what it rests."""
    monkeypatch.setattr(claims, "RESIDUAL_EPILOGUE_WINS", {(4096, 4096): 8192})
    assert claims.residual_home(16384, 4096, 4096)[0] == "epilogue"
    assert claims.residual_home(4096, 4096, 4096) == ("norm", claims.WORDS("why.measured_faster"))
    assert claims.residual_home(16384, 14336, 4096) == ("norm", claims.WORDS("why.not_measured"))
    monkeypatch.setattr(claims, "RESIDUAL_OWNER", "epilogue")
    assert claims.residual_home(1, 14336, 4096)[0] == "epilogue"


@pytest.mark.parametrize("home", ["norm", "epilogue"])
def test_a_captured_llama_gives_the_add_to_the_faster_home(home, monkeypatch):
    """transformers' Llama as captured (``residual + o_proj(...)``, ``residual + down_proj(...)``): with the add
    measured better in the Add+RMSNorm, every such add is an Add+RMSNorm chain (γ folded) and linear_residual shows
    a near miss saying why; measured better in the epilogue (the table says so for these shapes), every o_proj and
    down_proj carries its add, the norm after it reads the sum (γ still folded), and the Add+RMSNorm shows the near
    miss. Both fuse to what the model computes; the reasons read in Chinese."""
    import transformers

    from triton_testing import randomized, tiny_llama_config

    monkeypatch.setenv("TRITON_INTERPRET", "0")
    monkeypatch.setenv("EXPLORER_GENERIC_COMPILE", "0")
    layers = 1
    model = randomized(transformers.LlamaModel(tiny_llama_config(layers)), 11).eval()

    class Hidden(nn.Module):
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, ids):
            return self.m(input_ids=ids, use_cache=False).last_hidden_state

    wrapped = Hidden(model).eval()
    ids = torch.randint(0, 32, (1, 9), generator=torch.Generator().manual_seed(0))
    if home == "epilogue":   # 9 rows; o_proj 120 -> 120, down_proj 200 -> 120
        monkeypatch.setattr(claims, "RESIDUAL_EPILOGUE_WINS", {(120, 120): 1, (200, 120): 1})
    gm, det = detect_module(wrapped, (ids,), "llama")
    # per layer two residual adds (after o_proj, after down_proj), each before a norm; the last norm is the model's
    # output (no reader to fold γ into)
    if home == "norm":
        assert det.counts["linear_residual"] == 0
        assert det.counts["add_rms_fold"] == 2 * layers - 1 and det.counts["add_rms_norm"] == 1
        misses = [m for m in det.near_misses if m.pattern == "linear_residual"]
        assert len(misses) == 2 * layers and all("stays with add_rms_" in str(m.reason) for m in misses)
        assert all("残差相加留在" in i18n.message(m.reason, "zh") for m in misses)
    else:
        assert det.counts["linear_residual"] == 2 * layers and det.counts["add_rms_fold"] == 0
        assert det.counts["rms_fold"] == 2 * layers and det.counts["rms_norm"] == 1
        misses = [m for m in det.near_misses if m.pattern in ("add_rms_fold", "add_rms_norm")]
        assert {m.nodes[0] for m in misses} == {c.node_for("add") for c in det.chains if c.pattern == "linear_residual"}
        assert all("GEMM epilogue of linear" in str(m.reason) for m in misses)
        assert all("GEMM 尾处理" in i18n.message(m.reason, "zh") for m in misses)
    fused = fuse_all(gm, det)
    assert {a.status for a in fused.applied} == {"fused"}
    with torch.no_grad():
        torch.testing.assert_close(fused.gm(ids), wrapped(ids), rtol=2e-5, atol=2e-5)
