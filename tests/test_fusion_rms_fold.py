"""The RMSNorm γ fold (``explorer.fusions.rms_fold``): the arithmetic, the numerics against float64, the
matcher's near misses, and the fold on public decoders (transformers' Llama, Qwen2, Mistral, Gemma configs with
seeded weights) composed with the sibling linears and SwiGLU.

The folded computation (the unit-γ kernel, interpreted on the CPU under ``TRITON_INTERPRET=1``, then the GEMMs
on ``W·diag(γ)``) and the unfused one (γ in the norm) are both measured against float64 on odd shapes in fp32,
fp16 and bf16: the rounding point moves, and both errors stay of one size (``READER_TOLERANCES``).
"""

from __future__ import annotations

import pytest
import torch
from triton_testing import (DTYPE_IDS, DTYPES, KERNEL_DEVICE, detect_module, fuse_all, needs_backend, rand,
                            randomized, triton_interpreter)

from explorer.fusions import BY_NAME, PATTERNS, rms_fold
from explorer.fusions import rms_norm as rn
from explorer.fusions import FAMILIES
from explorer.fusions.order import runs_before
from explorer.graph import aten

transformers = pytest.importorskip("transformers")
from transformers.models.llama.modeling_llama import LlamaRMSNorm  # noqa: E402

assert triton_interpreter  # the autouse fixture, imported into this module


@pytest.fixture(autouse=True)
def _no_generic_compile(monkeypatch):
    """Chains outside this family (elementwise) run their own ops, not an inductor compile: seconds saved."""
    monkeypatch.setenv("EXPLORER_GENERIC_COMPILE", "0")


def _rel(out: torch.Tensor, ref: torch.Tensor) -> float:
    return float(((out.double() - ref).norm() / ref.norm()).item())


# ====================================================================== the arithmetic

def test_fold_is_w_times_diag_gamma_exactly():
    """``W·diag(γ)`` column by column, in float64 (exact up to its rounding); ``offset`` folds (1 + γ); the
    inputs are untouched; shapes that do not fit say so."""
    gen = torch.Generator().manual_seed(1)
    w, g = torch.randn(45, 103, generator=gen), torch.randn(103, generator=gen)
    w0, g0 = w.clone(), g.clone()
    folded = rms_fold.fold_rms_gamma(w.double(), g)
    torch.testing.assert_close(folded, w.double() @ torch.diag(g.double()), rtol=rms_fold.FOLD_TOLERANCE_F64, atol=0)
    gemma = rms_fold.fold_rms_gamma(w, g, offset=1.0)
    assert gemma.dtype == w.dtype and torch.equal(gemma, (w.double() * (1 + g.double())).float())
    assert torch.equal(w, w0) and torch.equal(g, g0)
    with pytest.raises(ValueError, match="need"):
        rms_fold.fold_rms_gamma(w, g[:-1])


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("add", [False, True], ids=["rms", "add_rms"])
def test_folded_and_unfused_against_float64(dtype, add):
    """37 rows of 103 into linears of 45 and 19 outputs: the unit-γ kernel + folded GEMMs and the unfused norm +
    GEMMs, both within ``READER_TOLERANCES`` of float64, and of one size: the fold moves a rounding, it does not
    add one (the folded error at most 1.5x the unfused one, plus fp32's GEMM noise)."""
    gen = torch.Generator().manual_seed(7 + add)
    x = rand((37, 103), dtype, KERNEL_DEVICE, gen)
    r = rand((37, 103), dtype, KERNEL_DEVICE, gen) if add else None
    g = rand(103, dtype, KERNEL_DEVICE, gen, scale=0.5, shift=1.0)
    ws = [rand((o, 103), dtype, KERNEL_DEVICE, gen, scale=0.1) for o in (45, 19)]
    up = (lambda t: None if t is None else t.double())
    ref = rms_fold.rms_fold_reference(up(x), up(g), [up(w) for w in ws], 1e-6, up(r))
    unfused = rms_fold.rms_fold_reference(x, g, ws, 1e-6, r)
    folded = rms_fold.rms_fold_folded(x, g, ws, 1e-6, r)
    tol = rms_fold.READER_TOLERANCES[dtype]
    for u, f, want in zip(unfused, folded, ref):
        e_u, e_f = _rel(u, want), _rel(f, want)
        assert f.dtype == dtype and e_u <= tol and e_f <= tol, (e_u, e_f)
        assert e_f <= 1.5 * e_u + 1e-6, (e_u, e_f)


@needs_backend
def test_the_unit_kernel_loads_no_weight(monkeypatch):
    """The norm the fold leaves is the kernel's HAS_W=False variant: it equals x·rsqrt(mean(x²)+ε) rounded, and a
    weight of ones gives the same bits (so nothing of γ is left in it)."""
    gen = torch.Generator().manual_seed(3)
    x = rand((5, 4096), torch.bfloat16, KERNEL_DEVICE, gen)              # a full block: the unmasked path
    unit = rn.rms_norm(x, None, 1e-6)
    assert torch.equal(unit, rn.rms_norm(x, torch.ones(4096, dtype=torch.bfloat16, device=KERNEL_DEVICE), 1e-6))
    assert torch.equal(unit, rn.rms_norm_reference(x, None, 1e-6))


# ====================================================================== matching and near misses

class _Norms(torch.nn.Module):
    """Five LlamaRMSNorms over one input, each read in its own way::

        y0 ─► q, k (linears)                 folds
        y1 ─► up (linear) and + x (residual)  near miss: the row also goes to an add
        y2 ─► tied (a linear sharing the weight of one that reads x)   near miss: tied
        y3 ─► F.linear(y3, W·1) (computed)     near miss: the weight is computed
        y4 = norm(x)·(2·s)  (s an input)       near miss: the scale is computed from an input
    """

    def __init__(self, n: int = 48) -> None:
        super().__init__()
        self.norms = torch.nn.ModuleList(LlamaRMSNorm(n, eps=1e-6) for _ in range(4))
        self.q, self.k, self.up, self.w3, self.other = (torch.nn.Linear(n, n, bias=False) for _ in range(5))
        self.tied = torch.nn.Linear(n, n, bias=False)
        self.tied.weight = self.other.weight

    def forward(self, x, s):
        y0, y1, y2, y3 = (norm(x) for norm in self.norms)
        out = self.q(y0) + self.k(y0) + self.up(y1) + (y1 + x) + self.tied(y2) + self.other(x)
        out = out + torch.nn.functional.linear(y3, self.w3.weight * 1.0)
        h = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6)
        return out + h.to(x.dtype) * (2 * s)


def test_near_misses_say_why_in_both_languages():
    """One fold (two linears read the norm); a near miss per other norm, each naming its reason, in English and
    Chinese; the refused norms stay RMSNorm chains; the fused model computes what the model does."""
    from explorer.ui import i18n

    torch.manual_seed(0)
    model = randomized(_Norms(), 5).eval()
    x, s = torch.randn(2, 5, 48), torch.randn(48)
    gm, det = detect_module(model, (x, s), "norms")
    assert det.counts["rms_fold"] == 1 and det.counts["rms_norm"] == 4
    misses = {m.reason.id.split(".")[-1]: m for m in det.near_misses if m.pattern == "rms_fold"}
    assert set(misses) == {"reader", "tied", "weight_computed", "gamma"}, [str(m.reason) for m in det.near_misses]
    assert "add" in str(misses["reader"].reason) and "tied" in str(misses["tied"].reason)
    for m in misses.values():
        assert i18n.message(str(m.reason), "zh") == i18n.message(m.reason, "zh")   # read back from plain English
        zh = i18n.message(m.reason, "zh")
        assert zh != str(m.reason) and ("γ" in zh or "折叠" in zh), zh
    assert i18n.message(misses["tied"].reason, "zh").endswith("把 γ 折叠进去也会改变它们")
    fused = fuse_all(gm, det)
    assert {a.status for a in fused.applied} == {"fused"}
    with torch.no_grad():
        torch.testing.assert_close(fused.gm(x, s), model(x, s), rtol=1e-5, atol=1e-5)
    assert "mul(" not in str([n for n in fused.gm.graph.nodes if "norms_0" in str(n.args)])


def test_the_fold_runs_before_the_norms_and_shows_as_a_fold():
    """Order: the fold claims a norm before Add+RMSNorm/RMSNorm; the app's pattern texts say it is a fold valid
    only for inference, and that fusion can change numerics, in both languages."""
    from explorer.ui import i18n

    assert runs_before(FAMILIES, "add_rms_fold", "add_rms_norm") and runs_before(FAMILIES, "rms_fold", "rms_norm")
    for name in ("add_rms_fold", "rms_fold"):
        p = BY_NAME[name]
        assert p.fold is rms_fold.fold and p.alone is rms_fold.alone and p in PATTERNS
        caveats = i18n.pattern_text(p, "caveats", "zh")
        assert any("推理" in c for c in caveats) and any("舍入" in c for c in caveats)
        assert "W·diag(γ)" in i18n.pattern_text(p, "formula", "en")
    assert i18n.family_title("rms_fold", "zh") == "RMSNorm 的 γ 折叠进线性层"


# ====================================================================== public decoders

def _decoder(kind: str):
    """A seeded one-layer-plus decoder of transformers' ``kind`` (Llama, Qwen2, Mistral, Gemma) with an LM head,
    γ drawn away from 1 (the fold must change the weights to be seen)."""
    cfg_cls, model_cls = {"llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
                          "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM),
                          "mistral": (transformers.MistralConfig, transformers.MistralForCausalLM),
                          "gemma": (transformers.GemmaConfig, transformers.GemmaForCausalLM)}[kind]
    cfg = cfg_cls(hidden_size=72, intermediate_size=100, num_attention_heads=3, num_key_value_heads=1, head_dim=24,
                  vocab_size=40, num_hidden_layers=2, max_position_embeddings=64, tie_word_embeddings=kind == "gemma")
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    model = model_cls(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 1:
                p.copy_(torch.randn(p.shape) * 0.3 + (0 if kind == "gemma" else 1))

    class Logits(torch.nn.Module):
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, ids):
            return self.m(input_ids=ids, use_cache=False).logits

    return Logits(model).eval()


@pytest.mark.parametrize("kind", ["llama", "qwen2", "mistral", "gemma"])
def test_public_decoders_fold_and_compute_the_same(kind, monkeypatch):
    """Every norm folds (counted from the architecture: 1 + 2·layers, the last into the LM head; Gemma's tied
    head is a near miss, its (1 + γ) folds); the siblings concatenate the folded weights; in fp32 the fused model
    equals the original."""
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    model = _decoder(kind)
    ids = torch.randint(0, 40, (1, 7), generator=torch.Generator().manual_seed(1))
    gm, det = detect_module(model, (ids,), kind)
    folds = det.counts["rms_fold"] + det.counts["add_rms_fold"]
    if kind == "gemma":   # the last norm feeds the head, whose weight is the embedding's (tied)
        assert folds == 4 and det.counts["add_rms_norm"] == 1
        assert any(m.reason.id == "rms_fold.refuse.tied" for m in det.near_misses)
    else:
        assert folds == 5 and det.counts["rms_norm"] == det.counts["add_rms_norm"] == 0
    fused = fuse_all(gm, det)
    assert {a.status for a in fused.applied} == {"fused"}, [(a.chain_id, a.reason) for a in fused.applied]
    with torch.no_grad():
        torch.testing.assert_close(fused.gm(ids), model(ids), rtol=2e-5, atol=2e-5)
    by = {n.name: n for n in gm.graph.nodes}
    first = next(c for c in det.chains if c.pattern == "rms_fold")
    gamma = aten.attr_value(gm, _gamma_target(by, first))
    q = aten.attr_value(gm, next(n.target for n in gm.graph.nodes if n.op == "get_attr"
                                 and "0.self_attn.q_proj.weight" in str(n.target)))
    cat = next(v for k, v in fused.gm.named_buffers() if k.endswith("cat_weight"))
    offset = 1.0 if kind == "gemma" else 0.0
    torch.testing.assert_close(cat[: q.shape[0]], rms_fold.fold_rms_gamma(q, gamma.detach(), offset))


def _gamma_target(by, chain) -> str:
    """The γ parameter a fold chain's scale reads (directly, or through Gemma's ``to`` and ``+ 1``)."""
    names = [chain.node_for("gamma")] + [n for n, r in chain.roles if r == "gamma_const"]
    for name in names:
        for a in by[name].all_input_nodes:
            if a.op == "get_attr":
                return a.target
    raise AssertionError("no γ")


def test_fold_stage_and_a_chain_alone(monkeypatch):
    """Level "conv_bn" folds γ and leaves the norm as eager ops; a fold chain cut out alone brings its readers
    (their weights change) and computes what the model does."""
    from explorer.fusions.plan import make_plan
    from explorer.fusions.rewrite import apply_plan, chain_module

    monkeypatch.setenv("TRITON_INTERPRET", "0")
    model = _decoder("llama")
    ids = torch.randint(0, 40, (1, 7), generator=torch.Generator().manual_seed(2))
    gm, det = detect_module(model, (ids,), "llama")
    staged = apply_plan(gm, det, make_plan(det, "all"), "cpu", level="conv_bn")
    folded = [a for a in staged.applied if a.pattern.endswith("rms_fold")]
    assert folded and all(a.status == "fused" and "eager" in a.implementation for a in folded)
    with torch.no_grad():
        torch.testing.assert_close(staged.gm(ids), model(ids), rtol=2e-5, atol=2e-5)
    chain = next(c for c in det.chains if c.pattern == "add_rms_fold")
    unfused, fused, inputs = chain_module(gm, det, chain.id)
    with torch.no_grad():
        want, got = unfused(*inputs), fused(*inputs)
    assert len(want) == 3                                   # the sum the next residual reads, gate and up
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
