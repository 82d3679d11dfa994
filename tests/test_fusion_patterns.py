"""Patterns in the forms real models write them (issue 20), on public architectures built from their definitions.

- Attention: scores from ``einsum``/``baddbmm`` (BLOOM's ALiBi), a bias and a mask with views between the adds
  (Swin-V2's shifted windows), a tensor scale (Swin-V2's per-head ``logit_scale``), Gemma2's tanh soft-cap (found,
  handed to inductor with its reason: neither SDPA nor the Triton kernel computes it).
- Add+LayerNorm across an eval-mode dropout or a row-keeping reshape whose sum has other users (ViT, GPT-2).
- Linear + activation written otherwise: GPT-2's ``addmm`` and written-out tanh GELU, CLIP's quick GELU, Falcon's
  ``x @ W.T``, MobileNetV3's Linear + hardswish.

Each new fused call is checked against float64 on odd shapes in fp32/fp16/bf16 with the family's tolerances (Triton
interpreted on the CPU); each public model's counts are pinned from its architecture (1–2 layers, seeded weights) and
its fused graph computes what the captured one does.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from explorer.fusions import WORDS as ALL_WORDS
from explorer.fusions import attention, linear, norm
from explorer.fusions.epilogue import EPILOGUE_TOLERANCES, TRITON_ACTIVATIONS, apply_activation
from tests.triton_testing import assert_close64, detect_module, fuse_all, rand, triton_interpreter, up64  # noqa: F401

DTYPES = (torch.float32, torch.float16, torch.bfloat16)


# ---------------------------------------------------------------------- the fused calls against float64

@pytest.mark.parametrize("dtype", DTYPES)
def test_soft_capped_scores_softmax(dtype):
    """Gemma2: softmax(50·tanh(q@kᵀ·s / 50) + causal) in one kernel (scores scaled ×8 so the cap bends them)."""
    gen = torch.Generator().manual_seed(5)
    q, k = rand((2, 3, 11, 10), dtype, "cpu", gen, 3.0), rand((2, 3, 13, 10), dtype, "cpu", gen, 3.0)
    causal = torch.triu(torch.full((11, 13), float("-inf"), dtype=dtype), 3)
    out = attention.fused_scores_softmax(q, k, 10 ** -0.5, None, False, True, ((causal, [2, 3, 11, 13], 1.0),),
                                         None, 50.0)
    s = up64(q) @ up64(k).transpose(-2, -1) * 10 ** -0.5
    assert s.abs().max() > 25                                                 # the cap changes the scores
    want = torch.softmax(torch.tanh(s / 50.0) * 50.0 + up64(causal), -1)
    assert_close64(out, want, attention.TOLERANCES[dtype])
    assert not torch.allclose(out.double(), torch.softmax(s + up64(causal), -1), atol=1e-2)


class _CappedBlock(torch.nn.Module):
    def forward(self, q, k, v):
        s = torch.tanh(q @ k.transpose(-2, -1) * 0.3 / 30.0) * 30.0
        return s.softmax(-1) @ v


def test_a_soft_cap_before_the_second_matmul_is_the_scores_kernel_then_a_matmul(monkeypatch):
    """SDPA has no soft-cap: with the second MatMul in the chain the Triton scores kernel applies the cap and P·V is
    one matmul; where no Triton runs, inductor takes the chain, with that reason."""
    from explorer.fusions.edit import RewriteContext, UseGeneric

    q, k, v = torch.randn(2, 9, 8), torch.randn(2, 10, 8), torch.randn(2, 10, 8)
    gm, det = detect_module(_CappedBlock(), (q, k, v))
    (chain,) = [c for c in det.chains if c.pattern == "matmul_softmax"]
    assert chain.node_for("context") is not None and chain.node_for("cap_tanh") is not None
    fused = fuse_all(gm, det)
    (applied,) = [a for a in fused.applied if a.pattern == "matmul_softmax"]
    assert applied.status == "fused" and applied.impl == "triton" and "P·V" in applied.implementation
    assert "fused_capped_attention" in fused.gm.code
    from explorer.launches import stated_kernels
    assert stated_kernels(applied.implementation) == 2           # the scores kernel, then the P·V matmul
    torch.testing.assert_close(fused.gm(q, k, v), gm(q, k, v), rtol=1e-5, atol=1e-5)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(UseGeneric) as why:
        attention.rewrite(RewriteContext(gm, {n.name: n for n in gm.graph.nodes}, torch.device("cpu")), chain, "auto")
    assert why.value.args[0].id == "attention.generic.softcap"
    assert ALL_WORDS["attention.generic.softcap"][1].startswith("softmax 之前")


@pytest.mark.parametrize("dtype", DTYPES)
def test_soft_capped_attention_against_float64(dtype):
    """Gemma2's block with P·V: the scores kernel (cap, causal mask) regrouped to what P·V reads, then the matmul."""
    gen = torch.Generator().manual_seed(8)
    q, k, v = (rand((2, 3, 11, 10), dtype, "cpu", gen, 3.0), rand((2, 3, 13, 10), dtype, "cpu", gen, 3.0),
               rand((2, 3, 13, 7), dtype, "cpu", gen))
    causal = torch.triu(torch.full((11, 13), float("-inf"), dtype=dtype), 3)
    out = attention.fused_capped_attention(q, k, v, 10 ** -0.5, None, False, True, ((causal, [2, 3, 11, 13], 1.0),),
                                           None, 50.0, [2, 3, 11, 13])
    s = up64(q) @ up64(k).transpose(-2, -1) * 10 ** -0.5
    p = torch.softmax(torch.tanh(s / 50.0) * 50.0 + up64(causal), -1)
    # P is rounded once to the dtype (as the model's .to(q.dtype) does) before P·V, which the dtype's matmul computes
    assert_close64(out, p.to(dtype).double() @ up64(v), attention.ATTENTION_TOLERANCES[dtype])


def test_cast_is_exact_where_the_fused_kernels_compute_what_the_model_does():
    assert attention.cast_is_exact("bfloat16", "float32", "bfloat16")      # HF: softmax(s, dtype=fp32).to(q.dtype)
    assert attention.cast_is_exact("float16", "float32", "float16")
    assert attention.cast_is_exact("float32", "float32", "float32")        # a float32 capture: the cast is a no-op
    assert attention.cast_is_exact("bfloat16", "bfloat16", "bfloat16")     # GPT-2's .type(v.dtype)
    assert not attention.cast_is_exact("bfloat16", "bfloat16", "float32")  # an upcast after a bf16 softmax
    assert not attention.cast_is_exact("bfloat16", "float32", "float16")   # back to another dtype
    assert not attention.cast_is_exact("float32", "float64", "float32")    # a float64 softmax: kernels are fp32


class _HFEager(torch.nn.Module):
    """transformers' ``eager_attention_forward``: scores, scale, causal mask, the softmax in float32 cast back to
    the queries' dtype, eval dropout, P·V."""

    def forward(self, q, k, v, mask):
        s = torch.matmul(q, k.transpose(2, 3)) * 0.35 + mask
        p = torch.nn.functional.softmax(s, dim=-1, dtype=torch.float32).to(q.dtype)
        p = torch.nn.functional.dropout(p, p=0.1, training=False)
        return torch.matmul(p, v)


class _UpcastAfter(torch.nn.Module):
    """A bf16 softmax whose result is upcast for a float32 consumer: the cast is not the kernels' (they write bf16)."""

    def forward(self, q, k):
        return (q @ k.transpose(-2, -1)).softmax(-1).to(torch.float32) * 2.0


class _Float32Probs(torch.nn.Module):
    """softmax(s_bf16, dtype=float32) read in float32, never cast back."""

    def forward(self, q, k):
        return torch.softmax(q @ k.transpose(-2, -1), -1, dtype=torch.float32) * 2.0


def _attention_inputs(dtype, seed=9):
    gen = torch.Generator().manual_seed(seed)
    q, k, v = rand((2, 3, 11, 10), dtype, "cpu", gen), rand((2, 3, 13, 10), dtype, "cpu", gen), \
        rand((2, 3, 13, 6), dtype, "cpu", gen)
    mask = torch.triu(torch.full((11, 13), torch.finfo(dtype).min, dtype=dtype), 3).expand(2, 1, 11, 13)
    return q, k, v, mask


@pytest.mark.parametrize("dtype", DTYPES)
def test_hf_eager_attention_captured_in_its_dtype_is_sdpa(dtype):
    """Captured at the run dtype (a bf16 ``.pt2``), the float32 softmax and its cast back join the chain: SDPA,
    against the float64 computation and the captured graph."""
    q, k, v, mask = _attention_inputs(dtype)
    gm, det = detect_module(_HFEager(), (q, k, v, mask))
    (chain,) = [c for c in det.chains if c.pattern == "matmul_softmax"]
    assert chain.node_for("cast") is not None and chain.node_for("context") is not None
    fused = fuse_all(gm, det)
    (applied,) = [a for a in fused.applied if a.pattern == "matmul_softmax"]
    assert applied.status == "fused" and applied.impl == "sdpa"
    s = up64(q) @ up64(k).transpose(-2, -1) * 0.35 + up64(mask)
    want = torch.softmax(s, -1) @ up64(v)
    with torch.no_grad():
        got, unfused = fused.gm(q, k, v, mask), gm(q, k, v, mask)
    assert got.dtype == dtype
    assert_close64(got, want, attention.ATTENTION_TOLERANCES[dtype])
    assert_close64(got, unfused.double(), attention.ATTENTION_TOLERANCES[dtype])


def test_a_cast_that_is_not_back_to_the_scores_dtype_stays_outside_and_says_why():
    from explorer.fusions.edit import RewriteContext, UseGeneric

    q, k, _, _ = _attention_inputs(torch.bfloat16)
    gm, det = detect_module(_UpcastAfter(), (q, k))
    (chain,) = [c for c in det.chains if c.pattern == "matmul_softmax"]
    assert chain.node_for("cast") is None                      # the chain ends at the softmax: its kernel is exact
    fused = fuse_all(gm, det)
    assert [a.status for a in fused.applied if a.pattern == "matmul_softmax"] == ["fused"]
    torch.testing.assert_close(fused.gm(q, k), gm(q, k), **attention.ATTENTION_TOLERANCES[torch.bfloat16])
    gm, det = detect_module(_Float32Probs(), (q, k))
    (chain,) = [c for c in det.chains if c.pattern == "matmul_softmax"]
    with pytest.raises(UseGeneric) as why:
        attention.rewrite(RewriteContext(gm, {n.name: n for n in gm.graph.nodes}, torch.device("cpu")), chain, "auto")
    assert why.value.args[0].id == "attention.generic.casts"
    assert ALL_WORDS["attention.generic.cast_back"][1].startswith("softmax 以")


def test_einsum_forms():
    assert attention.einsum_form("bhqd,bhkd->bhqk") == "k"
    assert attention.einsum_form("b h i d, b h d j -> b h i j") == "kn"
    assert attention.einsum_form("bhqk,bhkd->bhqd") == "kn"
    for eq in ("bhqd,bhkd->bhkq", "bhqd,hkd->bhqk", "...qd,...kd->...qk", "bqd,bkd->bq", "ii,ij->ij"):
        assert attention.einsum_form(eq) is None, eq


@pytest.mark.parametrize("dtype", DTYPES)
def test_scores_softmax_with_bias_mask_regroup_and_tensor_scale(dtype):
    """(B·nW, H, M, K) scores with a per-head tensor scale, a bias added in that shape and a window mask added in
    (B, nW, H, M, N): one kernel, against the model's order of ops in float64."""
    gen = torch.Generator().manual_seed(0)
    b, nw, h, m, k, n = 2, 3, 2, 13, 19, 13
    a = rand((b * nw, h, m, k), dtype, "cpu", gen)
    kk = rand((b * nw, h, n, k), dtype, "cpu", gen)                       # K itself: the einsum form "k"
    t = rand((h, 1, 1), dtype, "cpu", gen, 0.3, 1.0)                         # Swin-V2's exp(clamp(logit_scale))
    bias = rand((1, h, m, n), dtype, "cpu", gen)
    mask = torch.zeros((1, nw, 1, m, n), dtype=dtype)
    mask[..., 1::3] = -100.0
    terms = ((bias, [b * nw, h, m, n], 1.0), (mask, [b, nw, h, m, n], 1.0))
    out = attention.fused_scores_softmax(a, kk, 0.7, t, False, True, terms, [b * nw, h, m, n])
    ref = attention.scores_softmax_reference(up64(a), up64(kk), 0.7, up64(t), False, True,
                                             tuple((up64(x), s, c) for x, s, c in terms), [b * nw, h, m, n])
    assert_close64(out, ref, attention.TOLERANCES[dtype])
    # against the plain unfused ops too (matmul, mul, add, view, add, view, softmax)
    s = (up64(a) @ up64(kk).transpose(-2, -1) * up64(t) * 0.7 + up64(bias)).view(b, nw, h, m, n) + up64(mask)
    assert_close64(out, torch.softmax(s.view(b * nw, h, m, n), -1), attention.TOLERANCES[dtype])


@pytest.mark.parametrize("dtype", DTYPES)
def test_scores_softmax_from_baddbmm_regrouped(dtype):
    """BLOOM: softmax(view(β·alibi + α·q@k, (B, H, q, k)) + causal), the ALiBi row broadcast over the queries."""
    gen = torch.Generator().manual_seed(1)
    bsz, h, q, d = 2, 3, 11, 7
    a = rand((bsz * h, q, d), dtype, "cpu", gen)
    kt = rand((bsz * h, d, q), dtype, "cpu", gen)
    alibi = rand((bsz * h, 1, q), dtype, "cpu", gen)
    causal = torch.triu(torch.full((q, q), -1e4, dtype=dtype), 1).expand(bsz, 1, q, q)
    terms = ((alibi, [bsz * h, q, q], 1.0), (causal, [bsz, h, q, q], 1.0))
    out = attention.fused_scores_softmax(a, kt, d ** -0.5, None, False, False, terms, [bsz, h, q, q])
    want = torch.softmax((torch.baddbmm(up64(alibi), up64(a), up64(kt), alpha=d ** -0.5)).view(bsz, h, q, q)
                         + up64(causal), -1)
    assert_close64(out, want, attention.TOLERANCES[dtype])


@pytest.mark.parametrize("dtype", DTYPES)
def test_attention_with_bias_and_mask_is_sdpa_with_one_mask(dtype):
    gen = torch.Generator().manual_seed(2)
    q = rand((2, 3, 9, 12), dtype, "cpu", gen)
    k = rand((2, 3, 10, 12), dtype, "cpu", gen)
    v = rand((2, 3, 10, 5), dtype, "cpu", gen)
    t = rand((3, 1, 1), dtype, "cpu", gen, 0.2, 1.0)
    bias = rand((1, 3, 9, 10), dtype, "cpu", gen)
    mask = torch.zeros((2, 1, 1, 10), dtype=dtype)
    mask[0, ..., -3:] = float("-inf")
    terms = ((bias, [2, 3, 9, 10], 1.0), (mask, [2, 3, 9, 10], 1.0))
    out = attention.fused_attention_forms(q, k, v, 0.5, t, True, True, terms)
    p = attention.scores_softmax_reference(up64(q), up64(k), 0.5, up64(t), True, True,
                                           tuple((up64(x), s, c) for x, s, c in terms))
    assert_close64(out, p @ up64(v), attention.ATTENTION_TOLERANCES[dtype])


@pytest.mark.parametrize("dtype", DTYPES)
def test_add_layer_norm_through_a_view(dtype):
    gen = torch.Generator().manual_seed(3)
    x, r = rand((2 * 7, 37), dtype, "cpu", gen), rand((2 * 7, 37), dtype, "cpu", gen)
    w, b = rand((37,), dtype, "cpu", gen, 0.1, 1.0), rand((37,), dtype, "cpu", gen, 0.1)
    s, y = norm.fused_add_layer_norm_viewed(x, r, w, b, 1e-5, [2, 7, 37])
    s64 = (up64(x) + up64(r)).to(dtype).double()            # the stored sum, rounded, as the unfused graph reads it
    assert_close64(s, up64(x) + up64(r), norm.TOLERANCES[dtype])
    assert_close64(y, F.layer_norm(s64, (37,), up64(w), up64(b), 1e-5).view(2, 7, 37), norm.TOLERANCES[dtype])
    alone = norm.fused_add_layer_norm_viewed(x, r, w, b, 1e-5, [2, 7, 37], False)
    assert torch.equal(alone, y)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("act", ["gelu_tanh", "quick_gelu", "hardswish", "none"])
def test_linear_act_forms(dtype, act):
    """addmm's (in, out) weight, x @ W.T's (out, in) weight, a reshape after: the same as F.linear + act."""
    gen = torch.Generator().manual_seed(4)
    x = rand((21, 19), dtype, "cpu", gen)
    w = rand((45, 19), dtype, "cpu", gen, 19 ** -0.5)
    b = rand((45,), dtype, "cpu", gen)
    want = apply_activation(F.linear(up64(x), up64(w), up64(b)), act).view(3, 7, 45)
    tol = EPILOGUE_TOLERANCES[dtype]
    assert_close64(linear.fused_linear_act_forms(x, w.t().contiguous(), b, act, True, [3, 7, 45]), want, tol)
    assert_close64(linear.fused_linear_act_forms(x, w, b, act, False, [3, 7, 45]), want, tol)


def test_quick_gelu_is_an_epilogue_activation():
    from explorer.fusions.epilogue import apply_activation_

    t = torch.linspace(-6, 6, 101, dtype=torch.float64)
    assert torch.allclose(apply_activation(t, "quick_gelu"), t * torch.sigmoid(1.702 * t))
    assert torch.equal(apply_activation_(t.clone(), "quick_gelu"), apply_activation(t, "quick_gelu"))
    assert "quick_gelu" in TRITON_ACTIVATIONS


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("act", ["gelu_tanh", "silu"])
def test_gated_pass_on_a_packed_projection(dtype, act):
    """GeGLU and SwiGLU on one packed (M, 2I) GEMM output read in place (I = 37: ragged against every block)."""
    from explorer.fusions import swiglu

    gen = torch.Generator().manual_seed(10)
    gu = rand((3, 7, 74), dtype, "cpu", gen, 2.0)
    out = swiglu.silu_mul_packed(gu, 37, act=act)
    want = swiglu.silu_mul_packed_reference(up64(gu), 37, act)
    assert_close64(out, want, swiglu.TOLERANCES[dtype])
    if act == "gelu_tanh":   # the gate really is the tanh GELU, not silu
        assert not torch.allclose(out.double(), swiglu.silu_mul_packed_reference(up64(gu), 37), atol=1e-2)


def test_blooms_gelu_spelling_is_the_tanh_gelu():
    """The recogniser reads BLOOM's formula as gelu_tanh: in float64 the two agree to its 8-digit √(2/π)."""
    x = torch.linspace(-8, 8, 4001, dtype=torch.float64)
    bloom = x * 0.5 * (1.0 + torch.tanh(0.79788456 * x * (1 + 0.044715 * x * x)))
    assert torch.allclose(bloom, F.gelu(x, approximate="tanh"), rtol=0, atol=1e-8)
    assert not torch.allclose(bloom, F.gelu(x), rtol=0, atol=1e-4)         # not the erf GELU


class _PackedUpFirst(torch.nn.Module):
    """A packed projection whose first half is the up projection: ``up, gate = proj(x).chunk(2, -1)``."""

    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(19, 2 * 23)
        self.down = torch.nn.Linear(23, 19)

    def forward(self, x):
        up, gate = self.proj(x).chunk(2, dim=-1)
        return self.down(torch.nn.functional.gelu(gate, approximate="tanh") * up)


def test_a_packed_projection_with_the_up_half_first_is_one_gemm_with_its_rows_reordered():
    torch.manual_seed(0)
    x = torch.randn(2, 5, 19)
    gm, det = detect_module(_PackedUpFirst(), (x,))
    (chain,) = [c for c in det.chains if c.pattern == "swiglu"]
    assert chain.node_for("packed") is not None and "gelu" in chain.ops
    fused = fuse_all(gm, det)
    (applied,) = [a for a in fused.applied if a.pattern == "swiglu"]
    assert applied.status == "fused" and applied.impl == "one_gemm_triton"
    torch.testing.assert_close(fused.gm(x), gm(x), rtol=1e-5, atol=1e-5)


class _PackedAlongRows(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(8, 12)

    def forward(self, x):
        gate, up = self.proj(x).chunk(2, dim=0)                # halves of the rows, not of the features
        return torch.nn.functional.silu(gate) * up


def test_a_packed_projection_split_along_another_dim_is_not_one_gemm_and_says_why():
    from explorer.fusions import swiglu
    from explorer.fusions.edit import RewriteContext, UseGeneric

    gm, det = detect_module(_PackedAlongRows(), (torch.randn(4, 8),))
    (chain,) = [c for c in det.chains if c.pattern == "swiglu"]
    with pytest.raises(UseGeneric) as why:
        swiglu.rewrite(RewriteContext(gm, {n.name: n for n in gm.graph.nodes}, torch.device("cpu")), chain, "auto")
    assert why.value.args[0].id == "swiglu.generic.split"
    assert ALL_WORDS["swiglu.generic.split"][1].startswith("打包的投影")


# ---------------------------------------------------------------------- small modules: the near misses

class _Scores(torch.nn.Module):
    """softmax(q @ kᵀ · t): t a per-head tensor, or one that varies along the rows."""

    def __init__(self, t_shape):
        super().__init__()
        self.t = torch.nn.Parameter(torch.rand(t_shape) + 0.5)

    def forward(self, q, k, v):
        s = torch.einsum("bhqd,bhkd->bhqk", q, k) * self.t.exp()
        return torch.einsum("bhqk,bhkd->bhqd", s.softmax(-1), v)


def test_einsum_attention_with_a_per_head_tensor_scale_is_sdpa():
    q, k, v = torch.randn(2, 3, 9, 8), torch.randn(2, 3, 10, 8), torch.randn(2, 3, 10, 8)
    gm, det = detect_module(_Scores((3, 1, 1)), (q, k, v))
    assert det.counts["matmul_softmax"] == 1
    fused = fuse_all(gm, det)
    (applied,) = [a for a in fused.applied if a.pattern == "matmul_softmax"]
    assert applied.status == "fused" and applied.impl == "sdpa"
    torch.testing.assert_close(fused.gm(q, k, v), gm(q, k, v), rtol=1e-5, atol=1e-5)


def test_a_scale_that_varies_along_the_rows_is_a_near_miss():
    q, k, v = torch.randn(2, 3, 9, 8), torch.randn(2, 3, 10, 8), torch.randn(2, 3, 10, 8)
    gm, det = detect_module(_RowScale(), (q, k, v))
    assert det.counts["matmul_softmax"] == 0
    (miss,) = [m for m in det.near_misses if m.pattern == "matmul_softmax"]
    assert miss.reason.id == "attention.refuse.scale_rows" and "[2, 3, 9, 1]" in miss.reason
    assert ALL_WORDS["attention.refuse.scale_rows"][1].startswith("缩放因子")


class _RowScale(torch.nn.Module):
    def forward(self, q, k, v):
        t = q.sum(-1, keepdim=True).sigmoid()                                # (B, H, M, 1): varies along the rows
        return (q @ k.transpose(-2, -1) * t).softmax(-1) @ v


# ---------------------------------------------------------------------- public architectures

def _tokens():
    return (torch.randint(0, 96, (2, 9), generator=torch.Generator().manual_seed(0)),)


def _pixels(size):
    return (torch.randn((2, 3, size, size), generator=torch.Generator().manual_seed(0)),)


def _build(name):
    import transformers as T

    torch.manual_seed(0)
    eager = dict(attn_implementation="eager")
    if name == "gpt2":
        return T.GPT2Model(T.GPT2Config(n_embd=40, n_layer=1, n_head=4, vocab_size=96, n_positions=16,
                                        use_cache=False, **eager)), _tokens()
    if name == "gemma2":
        return T.Gemma2Model(T.Gemma2Config(hidden_size=40, intermediate_size=72, num_hidden_layers=2,
                                            num_attention_heads=4, num_key_value_heads=2, head_dim=10, vocab_size=96,
                                            sliding_window=4, use_cache=False, **eager)), _tokens()
    if name == "bloom":
        return T.BloomModel(T.BloomConfig(hidden_size=40, n_layer=1, n_head=4, vocab_size=96, use_cache=False,
                                          **eager)), _tokens()
    if name == "falcon":
        return T.FalconModel(T.FalconConfig(hidden_size=40, num_hidden_layers=1, num_attention_heads=4,
                                            vocab_size=96, use_cache=False, **eager)), _tokens()
    if name == "clip":
        return T.CLIPVisionModel(T.CLIPVisionConfig(hidden_size=40, intermediate_size=72, num_hidden_layers=1,
                                                    num_attention_heads=4, image_size=28, patch_size=7,
                                                    **eager)), _pixels(28)
    if name == "vit":
        return T.ViTModel(T.ViTConfig(hidden_size=40, intermediate_size=72, num_hidden_layers=1, num_attention_heads=4,
                                      image_size=28, patch_size=7, **eager)), _pixels(28)
    if name == "opt":
        return T.OPTModel(T.OPTConfig(hidden_size=40, ffn_dim=72, num_hidden_layers=1, num_attention_heads=4,
                                      vocab_size=96, max_position_embeddings=32, word_embed_proj_dim=40,
                                      use_cache=False, **eager)), _tokens()
    if name == "swin":
        return T.SwinModel(T.SwinConfig(image_size=56, patch_size=4, embed_dim=12, depths=[2], num_heads=[2],
                                        window_size=7, **eager)), _pixels(56)
    if name == "phi3":
        return T.Phi3Model(T.Phi3Config(hidden_size=40, intermediate_size=72, num_hidden_layers=1,
                                        num_attention_heads=4, num_key_value_heads=2, vocab_size=96,
                                        max_position_embeddings=32, pad_token_id=0, use_cache=False, **eager)), _tokens()
    if name == "gemma":
        return T.GemmaModel(T.GemmaConfig(hidden_size=40, intermediate_size=72, num_hidden_layers=1,
                                          num_attention_heads=4, num_key_value_heads=2, head_dim=10, vocab_size=96,
                                          use_cache=False, **eager)), _tokens()
    if name == "swinv2":
        return T.Swinv2Model(T.Swinv2Config(image_size=56, patch_size=4, embed_dim=12, depths=[2], num_heads=[2],
                                            window_size=7)), _pixels(56)
    import torchvision

    return torchvision.models.mobilenet_v3_small(num_classes=10), _pixels(32)


#: Counts derived from each architecture at the layers built above (L = layers):
#: GPT-2 (L=1): an attention per layer; LayerNorms ln_1 (after the embeddings' dropout, read by the residual
#: too), ln_2 and ln_f, each after an add: 2L+1; one c_fc addmm + written-out tanh GELU per layer.
#: Gemma2 (L=2): one soft-capped attention per layer (the Triton scores kernel takes the cap). BLOOM (L=1): one baddbmm attention per layer.
#: Falcon (L=1): dense_h_to_4h (x @ W.T) + GELU per layer. CLIP (L=1): fc1 + quick GELU per layer.
#: ViT (L=1): LayerNorms before (after the embeddings' dropout), after, and the final one: 2L+1.
#: Swin-V2 (depth 2): a tensor-scaled attention per block, the shifted one with its window mask (3 adds).
#: MobileNetV3-small: the classifier's Linear + hardswish.
#: Every HF eager attention above but Swin-V2's (GPT-2, Gemma2, BLOOM, CLIP, ViT, OPT, Swin) casts its softmax back
#: to the queries' dtype before P·V: one chain per attention layer takes the cast and P·V (SDPA; Gemma2's soft-cap:
#: the scores kernel, then one matmul). OPT (L=1): one; Swin (depth 2): one per block, the shifted one with its mask.
PINNED = {
    "gpt2": {"matmul_softmax": 1, "add_layer_norm": 3, "linear_act_forms": 1},
    "gemma2": {"matmul_softmax": 2, "swiglu": 2},
    "bloom": {"matmul_softmax": 1, "linear_act_forms": 1},
    "falcon": {"linear_act_forms": 1},
    "clip": {"linear_act_forms": 1, "matmul_softmax": 1},
    "vit": {"add_layer_norm": 3, "matmul_softmax": 1},
    "swinv2": {"matmul_softmax": 2},
    "mobilenet_v3": {"linear_act": 1},
    "opt": {"matmul_softmax": 1},
    "swin": {"matmul_softmax": 2},
    "phi3": {"swiglu": 1},
    "gemma": {"swiglu": 1},
}

#: What runs for the new chains on the CPU (Triton interpreted): impl per pattern, and a reason where inductor
#: takes the chain.
IMPLS = {
    "gpt2": {"linear_act_forms": {"separate"}, "add_layer_norm": {"triton"}, "matmul_softmax": {"sdpa"}},
    "gemma2": {"matmul_softmax": {"triton"}, "swiglu": {"one_gemm_triton"}},
    "bloom": {"matmul_softmax": {"sdpa"}, "linear_act_forms": {"separate"}},
    "falcon": {"linear_act_forms": {"separate"}},
    "clip": {"linear_act_forms": {"separate"}, "matmul_softmax": {"sdpa"}},
    "vit": {"add_layer_norm": {"triton"}, "matmul_softmax": {"sdpa"}},
    "swinv2": {"matmul_softmax": {"sdpa"}},
    "mobilenet_v3": {"linear_act": {"separate"}},
    "opt": {"matmul_softmax": {"sdpa"}},
    "swin": {"matmul_softmax": {"sdpa"}},
    "phi3": {"swiglu": {"one_gemm_triton"}},
    "gemma": {"swiglu": {"one_gemm_triton"}},
}


@pytest.fixture(scope="module", params=sorted(PINNED))
def public(request):
    name = request.param
    module, inputs = _build(name)
    gm, det = detect_module(module.eval(), inputs, name)
    return name, gm, det, inputs


def test_public_architectures_counts_and_fused_outputs(public, monkeypatch):
    """The pinned counts; the new chains (only those: the others are their families' tests, and inductor's compile
    of generic chains costs seconds) fused with the implementation named, computing what the model does."""
    from explorer.fusions.plan import make_plan
    from explorer.fusions.rewrite import apply_plan

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    name, gm, det, inputs = public
    for pattern, count in PINNED[name].items():
        assert det.counts[pattern] == count, (name, pattern, det.counts)
    if name == "gemma2":
        assert all(c.node_for("cap_tanh") is not None for c in det.chains if c.pattern == "matmul_softmax")
    fused = apply_plan(gm, det, make_plan(det, list(IMPLS[name])), "cpu")
    for pattern, impls in IMPLS[name].items():
        got = {a.impl for a in fused.applied if a.pattern == pattern}
        assert got == impls, (name, pattern, got)
        assert all(a.status == "fused" for a in fused.applied if a.pattern == pattern)
    with torch.no_grad():
        want, got = gm(*inputs), fused.gm(*inputs)
    want, got = torch.utils._pytree.tree_leaves(want)[0], torch.utils._pytree.tree_leaves(got)[0]
    scale = want.abs().max().item()
    assert scale > 0 and math.isfinite(scale)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4 * scale)


# ---------------------------------------------------------------------- squeeze-excite with a BatchNorm inside

class _SEWithNorm(torch.nn.Module):
    """ReXNet's squeeze-excite as its public definition writes it (timm ``rexnet.SEWithNorm``: mean, 1×1 conv,
    BatchNorm, ReLU, 1×1 conv, sigmoid gate); timm is not installed, so it is restated here."""

    def __init__(self, c: int, rd: int):
        super().__init__()
        self.fc1 = torch.nn.Conv2d(c, rd, 1)
        self.bn = torch.nn.BatchNorm2d(rd)
        self.fc2 = torch.nn.Conv2d(rd, c, 1)

    def forward(self, x):
        s = x.mean((2, 3), keepdim=True)
        s = torch.relu(self.bn(self.fc1(s)))
        return x * torch.sigmoid(self.fc2(s))


class _ReXNetBlock(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 24, 3, padding=1)
        self.se = _SEWithNorm(24, 6)

    def forward(self, x):
        return self.se(self.conv(x))


@pytest.mark.parametrize("dtype", DTYPES)
def test_batch_norm_folds_into_the_squeeze_fc(dtype):
    from explorer.fusions.squeeze_excite import fold_bn_into_fc

    gen = torch.Generator().manual_seed(6)
    w, b = rand((6, 24, 1, 1), dtype, "cpu", gen, 0.2), rand((6,), dtype, "cpu", gen)
    gamma, beta = rand((6,), dtype, "cpu", gen, 0.1, 1.0), rand((6,), dtype, "cpu", gen)
    mean, var = rand((6,), dtype, "cpu", gen), rand((6,), dtype, "cpu", gen).abs() + 0.5
    s = rand((3, 24, 1, 1), dtype, "cpu", gen)
    wf, bf = fold_bn_into_fc(w, b, gamma, beta, mean, var, 1e-5)
    want = F.batch_norm(F.conv2d(up64(s), up64(w), up64(b)), up64(mean), up64(var), up64(gamma), up64(beta),
                        False, 0.0, 1e-5)
    assert_close64(F.conv2d(s, wf, bf), want, EPILOGUE_TOLERANCES[dtype])


def test_squeeze_excite_with_a_batch_norm_is_found_and_fused(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    torch.manual_seed(0)
    module = _ReXNetBlock().eval()
    with torch.no_grad():
        module.se.bn.running_mean.normal_()
        module.se.bn.running_var.uniform_(0.5, 2.0)
        module.se.bn.weight.normal_(1.0, 0.2)
    x = torch.randn(2, 3, 9, 11)
    gm, det = detect_module(module, (x,))
    (chain,) = [c for c in det.chains if c.pattern == "squeeze_excite"]
    assert chain.node_for("bn") is not None
    fused = fuse_all(gm, det)
    assert all(a.status == "fused" for a in fused.applied if a.pattern == "squeeze_excite")
    torch.testing.assert_close(fused.gm(x), gm(x), rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------------- GroupNorm + activation

class _UNetBlock(torch.nn.Module):
    """A diffusion UNet's ResNet block head (GroupNorm(32 → 8 groups here), SiLU, conv), as diffusers writes it."""

    def __init__(self):
        super().__init__()
        self.norm = torch.nn.GroupNorm(4, 12)
        self.conv = torch.nn.Conv2d(12, 12, 3, padding=1)

    def forward(self, x):
        return self.conv(F.silu(self.norm(x)))


@pytest.mark.parametrize("dtype", DTYPES)
def test_group_norm_act_against_float64(dtype):
    gen = torch.Generator().manual_seed(7)
    x = rand((3, 12, 7, 5), dtype, "cpu", gen, 2.0, 0.5)
    w, b = rand((12,), dtype, "cpu", gen, 0.1, 1.0), rand((12,), dtype, "cpu", gen, 0.1)
    out = norm.fused_group_norm_act(x, 4, w, b, 1e-5, "silu")
    assert_close64(out, norm.group_norm_act_reference(up64(x), 4, up64(w), up64(b), 1e-5, "silu"),
                   EPILOGUE_TOLERANCES[dtype])


def test_group_norm_act_is_found_and_fused():
    torch.manual_seed(0)
    x = torch.randn(2, 12, 6, 5)
    gm, det = detect_module(_UNetBlock(), (x,))
    assert det.counts["group_norm_act"] == 1
    fused = fuse_all(gm, det)
    (applied,) = [a for a in fused.applied if a.pattern == "group_norm_act"]
    assert applied.status == "fused" and applied.implementation.id == "norm.label.group_norm"
    torch.testing.assert_close(fused.gm(x), gm(x), rtol=1e-5, atol=1e-5)
