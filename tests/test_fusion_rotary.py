"""The rotary family (``explorer.fusions.rotary``): the Q+K kernel against float64, its selection, the
matcher (q and k found as one chain) and the rewrite.

Kernels run in Triton's interpreter without a GPU (``triton_testing``): strided q/k from a transpose,
GQA (3 query heads over 1 kv head), head_dim 64 and 40 (a half of 20: masked lanes), batch 1 and 3, in
fp32, fp16 and bf16; ``gpu``-marked parameters run them compiled on CUDA. The reference is checked
bitwise against transformers' ``apply_rotary_pos_emb`` with ``LlamaRotaryEmbedding``'s cos and sin.
"""

from __future__ import annotations

import pytest
import torch
from triton_testing import (DTYPE_IDS, DTYPES, KERNEL_DEVICE, assert_close64, correctly_rounded_fraction,
                            detect_module, device_params, fuse_all, needs_backend, poison, rand, tiny_llama_config,
                            triton_interpreter, up64)

from explorer.fusions import rotary as rot

transformers = pytest.importorskip("transformers")
from transformers.models.llama import modeling_llama as hf_llama  # noqa: E402

assert triton_interpreter  # the autouse fixture, imported into this module


def llama_cos_sin(batch, seq, head_dim, dtype, device, offset=0, theta=10000.0):
    """cos, sin of shape (batch, seq, head_dim) as LlamaRotaryEmbedding builds them (fp32, then cast)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    pos = (torch.arange(seq) + offset)[None, :].expand(batch, seq).float()        # (B, S)
    emb = torch.cat([pos[..., None] * inv_freq] * 2, dim=-1)                      # (B, S, D)
    return emb.cos().to(dtype=dtype, device=device), emb.sin().to(dtype=dtype, device=device)


def strided_qk(batch, hq, hkv, seq, d, dtype, device, gen):
    """q (B, Hq, S, D) and k (B, Hkv, S, D) as transposes of (B, S, H, D) projections (strided views)."""
    q = rand((batch, seq, hq, d), dtype, device, gen).transpose(1, 2)
    k = rand((batch, seq, hkv, d), dtype, device, gen).transpose(1, 2)
    return q, k


#: (batch, Hq, Hkv, seq, head_dim): GQA 3 over 1, MHA, head_dim 64 and 40 (a half of 20: masked lanes).
SHAPES = [(1, 3, 1, 5, 64), (3, 3, 1, 13, 40), (3, 4, 4, 5, 64)]


# ====================================================================== kernel

@pytest.mark.parametrize("device", device_params())
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("b, hq, hkv, s, d", SHAPES)
def test_rotary_matches_float64(b, hq, hkv, s, d, dtype, device, monkeypatch):
    """Strided q/k from a transpose, Llama's cos/sin (per batch, offset positions): float64 and eager."""
    gen = torch.Generator().manual_seed(b * 100 + hq * 10 + d)
    q, k = strided_qk(b, hq, hkv, s, d, dtype, device, gen)
    cos, sin = llama_cos_sin(b, s, d, dtype, device, offset=37)
    assert not q.is_contiguous() and rot.select_rotary(device, dtype, d).fused
    poison(monkeypatch, rot)
    qo, ko = rot.rotary(q, k, cos, sin)
    assert qo.dtype == ko.dtype == dtype and qo.shape == q.shape and ko.shape == k.shape
    q64, k64 = rot.rotary_reference(up64(q), up64(k), up64(cos), up64(sin))
    assert_close64(qo, q64, rot.TOLERANCES[dtype])
    assert_close64(ko, k64, rot.TOLERANCES[dtype])
    qe, ke = rot.rotary_reference(q, k, cos, sin)
    torch.testing.assert_close(qo, qe, **rot.EAGER_TOLERANCES[dtype])
    torch.testing.assert_close(ko, ke, **rot.EAGER_TOLERANCES[dtype])


@pytest.mark.parametrize("device", device_params())
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_layouts_broadcast_and_general_cos(dtype, device, monkeypatch):
    """Contiguous q/k with cos (1, S, D) broadcast over the batch; arbitrary (not duplicated-half) cos/sin;
    (B, S, H, D) inputs with ``unsqueeze_dim=2``; program layouts that split Q's heads unevenly and the
    tokens into groups with a partial last one (13 tokens a sequence, 39 in all)."""
    gen = torch.Generator().manual_seed(23)
    poison(monkeypatch, rot)
    q, k = rand((3, 3, 13, 40), dtype, device, gen), rand((3, 1, 13, 40), dtype, device, gen)
    cos, sin = rand((1, 13, 40), dtype, device, gen), rand((1, 13, 40), dtype, device, gen)
    tol = dict(rot.TOLERANCES[dtype], atol=4 * rot.TOLERANCES[dtype]["atol"])   # |cos|, |sin| up to ~4 here
    for tokens, heads in ((None, None), ((2, 8), (2, 1)), ((1, 16), (4, 1))):
        qo, ko = rot.rotary(q, k, cos, sin, tokens=tokens, heads=heads)
        q64, k64 = rot.rotary_reference(up64(q), up64(k), up64(cos), up64(sin))
        assert_close64(qo, q64, tol)
        assert_close64(ko, k64, tol)
    qs, ks = q.transpose(1, 2), k.transpose(1, 2)                                 # (B, S, H, D) views
    cos, sin = llama_cos_sin(3, 13, 40, dtype, device)
    qo, ko = rot.rotary(qs, ks, cos, sin, unsqueeze_dim=2)
    q64, k64 = rot.rotary_reference(up64(qs), up64(ks), up64(cos), up64(sin), unsqueeze_dim=2)
    assert_close64(qo, q64, rot.TOLERANCES[dtype])
    assert_close64(ko, k64, rot.TOLERANCES[dtype])


@pytest.mark.parametrize("device", device_params())
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_rotary_rounds_once(dtype, device):
    """16-bit: the fused result is the float64 value rounded once almost everywhere; eager, which rounds
    both products and the sum, is not, and is never more accurate."""
    gen = torch.Generator().manual_seed(29)
    q, k = strided_qk(3, 3, 1, 13, 64, dtype, device, gen)
    cos, sin = llama_cos_sin(3, 13, 64, dtype, device, offset=100)
    qo, _ = rot.rotary(q, k, cos, sin)
    q64, _ = rot.rotary_reference(up64(q), up64(k), up64(cos), up64(sin))
    qe, _ = rot.rotary_reference(q, k, cos, sin)
    assert correctly_rounded_fraction(qo, q64) >= 0.99
    assert correctly_rounded_fraction(qe.cpu(), q64) < 0.99
    assert (qo.double().cpu() - q64).abs().max() <= (qe.double().cpu() - q64).abs().max()


@pytest.mark.parametrize("device", device_params())
def test_fp32_cos_promotes(device, monkeypatch):
    """fp32 cos/sin on bf16 q/k give fp32 outputs, as eager's type promotion does."""
    gen = torch.Generator().manual_seed(31)
    q, k = strided_qk(1, 3, 1, 5, 64, torch.bfloat16, device, gen)
    cos, sin = llama_cos_sin(1, 5, 64, torch.float32, device)
    poison(monkeypatch, rot)
    qo, ko = rot.rotary(q, k, cos, sin)
    assert qo.dtype == ko.dtype == torch.float32
    q64, k64 = rot.rotary_reference(up64(q), up64(k), up64(cos), up64(sin))
    assert_close64(qo, q64, rot.TOLERANCES[torch.float32])
    assert_close64(ko, k64, rot.TOLERANCES[torch.float32])


@needs_backend
def test_select_says_why_and_falls_back(monkeypatch):
    """Odd head_dim, mismatched k, cos of the wrong shape: refused with a reason, reference result."""
    dev = KERNEL_DEVICE
    assert "odd" in rot.select_rotary(dev, torch.float32, 41).label
    assert "k is" in rot.select_rotary(dev, torch.float16, 64, k_dtype=torch.float32).label
    assert "cos" in rot.select_rotary(dev, torch.float16, 64, q_shape=(2, 3, 5, 64), k_shape=(2, 1, 5, 64),
                                      cos_shape=(5, 64)).label
    assert "forward-only" in rot.select_rotary(dev, torch.float32, 64, requires_grad=True).label
    q, k = torch.randn(2, 3, 5, 41), torch.randn(2, 1, 5, 41)
    cos, sin = torch.randn(2, 5, 41), torch.randn(2, 5, 41)
    qo, ko = rot.rotary(q, k, cos, sin)
    qr, kr = rot.rotary_reference(q, k, cos, sin)
    assert torch.equal(qo, qr) and torch.equal(ko, kr)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert "TRITON_INTERPRET" in rot.select_rotary("cpu", torch.float32, 64).label


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_reference_equals_apply_rotary_pos_emb(dtype):
    """``rotary_reference`` is bitwise transformers' ``apply_rotary_pos_emb`` with LlamaRotaryEmbedding's
    cos/sin (per-sequence positions), and the helper ``llama_cos_sin`` is what that module returns."""
    config = tiny_llama_config()
    gen = torch.Generator().manual_seed(41)
    rope = hf_llama.LlamaRotaryEmbedding(config)
    q, k = strided_qk(3, 3, 1, 13, 40, dtype, "cpu", gen)
    position_ids = torch.arange(13)[None].expand(3, 13) + torch.tensor([[0], [5], [50]])
    with torch.no_grad():
        cos, sin = rope(q, position_ids)                                                  # (B, S, D) in q's dtype
        assert cos.shape == (3, 13, 40) and cos.dtype == dtype
        ours_q, ours_k = rot.rotary_reference(q, k, cos, sin)
        hf_q, hf_k = hf_llama.apply_rotary_pos_emb(q, k, cos, sin)
    assert torch.equal(ours_q, hf_q) and torch.equal(ours_k, hf_k)
    c, s = llama_cos_sin(1, 13, 40, torch.float32, "cpu")
    with torch.no_grad():
        want_c, want_s = rope(q.float(), torch.arange(13)[None])
    assert torch.equal(c, want_c) and torch.equal(s, want_s)


# ====================================================================== matching and rewriting

class _Rope(torch.nn.Module):
    """q and k projections split into heads, rotated with ``apply_rotary_pos_emb`` (or only q: ``q_only``)."""

    def __init__(self, q_only: bool = False) -> None:
        super().__init__()
        self.q_only = q_only
        self.q, self.k = torch.nn.Linear(120, 120), torch.nn.Linear(120, 40)
        self.rope = hf_llama.LlamaRotaryEmbedding(tiny_llama_config())

    def forward(self, x):
        b, s, _ = x.shape
        q = self.q(x).view(b, s, 3, 40).transpose(1, 2)                                  # (B, 3, S, 40)
        k = self.k(x).view(b, s, 1, 40).transpose(1, 2)                                  # (B, 1, S, 40)
        cos, sin = self.rope(x, torch.arange(s)[None])
        if self.q_only:
            return q * cos.unsqueeze(1) + hf_llama.rotate_half(q) * sin.unsqueeze(1), k
        return hf_llama.apply_rotary_pos_emb(q, k, cos, sin)


def test_q_and_k_become_one_chain_and_one_call(monkeypatch):
    """apply_rotary_pos_emb over q and k is one chain (two outputs) and, fused, one call; same result."""
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    model = _Rope().eval()
    x = rand((2, 7, 120), torch.float32, "cpu", torch.Generator().manual_seed(3))
    gm, det = detect_module(model, (x,), "rope")
    assert det.counts["rotary"] == 1
    chain = next(c for c in det.chains if c.pattern == "rotary")
    assert chain.ops == ("mul", "neg", "cat", "mul", "add") * 2 and chain.extra_outputs == (chain.node_for("q_add"),)
    fused = fuse_all(gm, det)
    assert [n.target for n in fused.gm.graph.nodes].count(rot.fused_rotary) == 1
    assert "neg" not in fused.gm.code
    with torch.no_grad():
        for got, want in zip(fused.gm(x), model(x)):
            assert torch.equal(got, want)


@needs_backend
def test_rope_through_the_kernel():
    """The same module fused with the interpreted kernel: within the eager tolerance of the module."""
    model = _Rope().eval()
    x = rand((2, 7, 120), torch.float32, "cpu", torch.Generator().manual_seed(4))
    gm, det = detect_module(model, (x,), "rope")
    fused = fuse_all(gm, det, KERNEL_DEVICE)
    assert next(a for a in fused.applied if a.pattern == "rotary").impl == "triton"
    with torch.no_grad():
        for got, want in zip(fused.gm(x), model(x)):
            torch.testing.assert_close(got, want, **rot.EAGER_TOLERANCES[torch.float32])


def test_a_lone_rotated_tensor_is_a_near_miss():
    """Only q rotated: the kernel rotates q and k together, so it is a near miss that says so."""
    _, det = detect_module(_Rope(q_only=True), (torch.randn(2, 7, 120),), "rope_q")
    assert det.counts["rotary"] == 0
    assert any("only one tensor is rotated" in m.reason for m in det.near_misses if m.pattern == "rotary")


class _ConstantTables(torch.nn.Module):
    """q and k rotated with cos/sin tables held as constants (1, 1, S, D), as a fixed-length ONNX export has them."""

    def __init__(self) -> None:
        super().__init__()
        cos, sin = llama_cos_sin(1, 7, 40, torch.float32, "cpu", offset=3)
        self.register_buffer("cos", cos[:, None])                                         # (1, 1, S, D)
        self.register_buffer("sin", sin[:, None])
        self.q, self.k = torch.nn.Linear(120, 120), torch.nn.Linear(120, 40)

    def forward(self, x):
        b, s, _ = x.shape
        q = self.q(x).view(b, s, 3, 40).transpose(1, 2)
        k = self.k(x).view(b, s, 1, 40).transpose(1, 2)
        return (q * self.cos + hf_llama.rotate_half(q) * self.sin,
                k * self.cos + hf_llama.rotate_half(k) * self.sin)


def test_constant_tables_are_matched_and_passed_squeezed(monkeypatch):
    """With constant cos/sin (not graph nodes) the partner is found among the other negations; the fused
    call reads the tables squeezed to (1, S, D). Same result."""
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    model = _ConstantTables().eval()
    x = rand((2, 7, 120), torch.float32, "cpu", torch.Generator().manual_seed(5))
    gm, det = detect_module(model, (x,), "const_rope")
    assert det.counts["rotary"] == 1
    fused = fuse_all(gm, det)
    call = next(n for n in fused.gm.graph.nodes if n.target is rot.fused_rotary)
    assert getattr(fused.gm, call.args[2].target).shape == (1, 7, 40)
    with torch.no_grad():
        for got, want in zip(fused.gm(x), model(x)):
            assert torch.equal(got, want)


@needs_backend
@pytest.mark.parametrize("case", ["fits", "odd_head_dim", "k_dtype", "tables", "fp64"])
def test_a_handed_impl_is_followed_without_asking(case, monkeypatch):
    """The lowered rotary call is handed the impl the rewrite recorded (``_bind``): handed ``triton`` it asks no
    selection and still takes the reference wherever the selection would have refused these operands (bit for bit
    the call that asks); handed ``reference`` it runs the reference."""
    from explorer.fusions.base import counting

    launches = []
    real = rot.launch
    monkeypatch.setattr(rot, "launch", lambda *a, **kw: (launches.append(1), real(*a, **kw))[1])
    dtype = torch.float64 if case == "fp64" else torch.float16
    d = 7 if case == "odd_head_dim" else 16
    q, k = strided_qk(2, 2, 1, 5, d, dtype, KERNEL_DEVICE, torch.Generator().manual_seed(3))
    cos, sin = (t[..., :d] for t in llama_cos_sin(2, 5, 16, dtype, KERNEL_DEVICE))
    if case == "k_dtype":
        k = k.float()
    elif case == "tables":
        cos, sin = cos[:, :1], sin[:, :1]                       # one position for all: the reference broadcasts it

    def call(impl):
        launches.clear()
        return list(rot.fused_rotary(q, k, cos, sin, impl)), len(launches)

    asked, asked_launches = call(None)
    with counting() as calls:
        handed, handed_launches = call("triton")
        eager, eager_launches = call("reference")
    assert not calls
    assert handed_launches == asked_launches == (1 if case == "fits" else 0) and eager_launches == 0
    reference = rot.rotary_reference(q, k, cos, sin)
    for a, b, e, ref in zip(asked, handed, eager, reference):
        assert torch.equal(a, b) and torch.equal(e, ref)
