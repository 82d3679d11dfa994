"""Bound calls (``triton_support.BoundCall``, ``lean.bind_calls``/``bind_attention``): a fused node planned once.

Each Triton family's fused call target, bound, against its reference in float64 at awkward shapes (rows not a
multiple of a tile, hidden 40, GQA 3 over 1 heads of 16, odd K) in fp32, fp16 and bf16: the first call records,
the second replays (its outputs allocated poisoned with NaN, so an element the replay forgets fails). On CUDA the
replay must equal the generic call bit for bit. Then what the replay must not do: take a changed input (shape,
strides, dtype, a misaligned pointer) without falling back, read the environment, plan, or replay a call that ran
a tensor op besides its kernels. A lean graph with its fused calls bound equals the unbound graph. Two of
torchvision's ViT blocks, prepared lean: every add+LayerNorm node binds, at batch 2 (its transposed attention output
copied by its own node) and at batch 1 (replayed outputs with the recorded strides), bit for bit.
"""

from __future__ import annotations

import copy
import dataclasses
import os

import pytest
import torch
import torch.nn.functional as F
from triton_testing import (DTYPE_IDS, DTYPES, HAS_CUDA, INTERPRET, assert_close64, device_params, rand,
                            triton_interpreter, up64)

from explorer.fusions import linear_residual, norm, rms_norm, rotary, swiglu, triton_support as ts
from explorer.fusions.kernels import gemm
from explorer.fusions.linear import fused_linear_act_forms
from explorer.runtime import lean

#: ``prepare_graph``'s binds without ``lean_heads``: that pass runs the attention batch-first, so no transposed
#: operand reaches the add+LayerNorm on these ViT blocks; what ``norm.contiguous_operands`` is for (a transposed
#: operand the pass does not cover, as these blocks had before it) is tested with it off
NO_HEADS = dataclasses.replace(lean.DEFAULT_BINDS, heads=False)

assert triton_interpreter  # the autouse fixture, imported into this module


def _gen(seed=0):
    return torch.Generator().manual_seed(seed)


def _cases(dtype, device, shape):
    """family -> (target, args, float64 reference of the same args, tolerance). ``shape`` 0 or 1: two sizes."""
    g = _gen(shape)
    rows, hidden = ((3, 7), 40) if shape == 0 else ((1, 13), 72)
    b, s = rows

    def r(*dims, scale=1.0, shift=0.0):
        return rand(dims, dtype, device, g, scale, shift)

    x, res, w = r(b, s, hidden), r(b, s, hidden), r(hidden, scale=0.1, shift=1.0)
    hq, hkv, d = 3, 1, 16
    q, k = r(b, hq, s, d), r(b, hkv, s, d)
    cos, sin = r(1, s, d), r(1, s, d)
    kin = 24 if shape == 0 else 45
    xa = r(b, s, kin)
    w_qkv = r((hq + 2 * hkv) * d, kin, scale=kin ** -0.5)
    bias_qkv = r((hq + 2 * hkv) * d, scale=0.1) if shape == 1 else None
    w_lin, b_lin, z = r(hidden, kin, scale=kin ** -0.5), r(hidden, scale=0.1), r(b, s, hidden)
    inter = 23 if shape == 0 else 40
    w_gu = r(2 * inter, kin, scale=kin ** -0.5)
    w_il, b_il = gemm.interleave_gate_up(w_gu, r(2 * inter, scale=0.1) if shape == 1 else None)
    gu = r(b, s, 2 * inter)
    eps = 1e-6
    paired = gemm.PAIRED_TOLERANCES[dtype]

    def qkv64(x_, w_, b_, c_, s_):
        y = F.linear(x_, w_, b_)
        qq, kk, vv = y.split((hq * d, hkv * d, hkv * d), -1)
        qe, ke = rotary.rotary_reference(qq.view(b, s, hq, d).transpose(1, 2), kk.view(b, s, hkv, d).transpose(1, 2),
                                         c_, s_)
        return qe, ke, vv

    def swiglu64(x_, w_, b_, _tiles):
        y = F.linear(x_, w_, b_)
        return F.silu(y[..., 0::2]) * y[..., 1::2]

    return {
        "rms_norm": (rms_norm.fused_rms_norm, (x, w, eps), rms_norm.rms_norm_reference, rms_norm.TOLERANCES[dtype]),
        "add_rms_norm": (rms_norm.fused_add_rms_norm, (x, res, w, eps), rms_norm.add_rms_norm_reference,
                         rms_norm.TOLERANCES[dtype]),
        "add_rms_norm_normed": (rms_norm.fused_add_rms_norm_normed, (x, res, w, eps),
                                lambda *a: rms_norm.add_rms_norm_reference(*a)[1], rms_norm.TOLERANCES[dtype]),
        "add_layer_norm": (norm.fused_add_layer_norm, (x, res, w, w - 1, 1e-5), _add_ln64, norm.TOLERANCES[dtype]),
        "add_layer_norm_viewed": (norm.fused_add_layer_norm_viewed, (x.view(-1, hidden), res.view(-1, hidden), w,
                                                                   w - 1, 1e-5, [b, s, hidden]),
                                  lambda x_, r_, w_, b_, e_, sh: (_add_ln64(x_, r_, w_, b_, e_)[0],
                                                                  _add_ln64(x_, r_, w_, b_, e_)[1].reshape(sh)),
                                  norm.TOLERANCES[dtype]),
        "rotary": (rotary.fused_rotary, (q, k, cos, sin), rotary.rotary_reference, rotary.TOLERANCES[dtype]),
        "qkv_rotary": (rotary.qkv_rotary, (xa, w_qkv, bias_qkv, cos, sin, hq, hkv, d, None),
                       lambda x_, w_, b_, c_, s_, *_: qkv64(x_, w_, b_, c_, s_), paired),
        "qkv_rotary_token_major": (rotary.qkv_rotary, (xa, w_qkv, bias_qkv, cos, sin, hq, hkv, d, None, True),
                                   lambda x_, w_, b_, c_, s_, *_: qkv64(x_, w_, b_, c_, s_), paired),
        "linear_residual": (linear_residual.linear_residual_gemm, (xa, w_lin, b_lin, z),
                            lambda x_, w_, b_, z_: F.linear(x_, w_, b_) + z_, paired),
        "swiglu_interleaved": (swiglu.swiglu_epilogue_interleaved, (xa, w_il, b_il, None), swiglu64, paired),
        "silu_mul_packed": (swiglu.silu_mul_packed, (gu, inter), lambda g_, i: swiglu.silu_mul_packed_reference(g_, i),
                            swiglu.TOLERANCES[dtype]),
    }


FAMILIES = ("rms_norm", "add_rms_norm", "add_rms_norm_normed", "add_layer_norm", "add_layer_norm_viewed", "rotary", "qkv_rotary", "qkv_rotary_token_major",
            "linear_residual",
            "swiglu_interleaved", "silu_mul_packed")


def _add_ln64(x, r, w, b, eps):
    h = x + r
    return h, F.layer_norm(h, h.shape[-1:], w, b, eps)


def _flat(out):
    return [t for t in (out if isinstance(out, (tuple, list)) else (out,)) if t is not None]


def _poison(monkeypatch):
    """Replayed allocations full of NaN: an element the replayed kernels do not write fails the comparison."""
    def nan_maker(shape, stride, dtype, device, contiguous):
        return lambda: torch.empty_strided(shape, stride, dtype=dtype, device=device).fill_(float("nan"))
    monkeypatch.setattr(ts, "_buffer_maker", nan_maker)


@pytest.mark.parametrize("device", device_params())
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("family", FAMILIES)
def test_bound_family_matches_float64_and_the_generic_call(family, dtype, device, monkeypatch):
    """Recorded on the first call, replayed on the second: within the family's tolerance of float64, and on CUDA
    bit for bit the generic call's outputs (same shapes, strides, dtypes)."""
    _poison(monkeypatch)
    for shape in ((0, 1) if device == "cuda" or dtype == torch.bfloat16 else (0,)):
        target, args, ref, tol = _cases(dtype, device, shape)[family]
        bound = ts.BoundCall(target)
        with torch.no_grad():
            first = bound(*args)
            assert bound.replay is not None, bound.why
            replayed = bound(*args)
            generic = target(*args)
        ref64 = ref(*(up64(a) if isinstance(a, torch.Tensor) else a for a in args))
        for out, want, gen in zip(_flat(replayed), _flat(ref64), _flat(generic)):
            assert (out.shape, out.stride(), out.dtype) == (gen.shape, gen.stride(), gen.dtype)
            assert_close64(out, want, tol)
            if device == "cuda":
                assert torch.equal(out, gen), f"{family}: bound differs from generic"
        assert len(_flat(first)) == len(_flat(replayed))


def _add_rms(device="cpu", dtype=torch.bfloat16, rows=(3, 7), hidden=40):
    g = _gen(3)
    return tuple(rand(dims, dtype, device, g) for dims in ((*rows, hidden), (*rows, hidden), (hidden,))) + (1e-6,)


@pytest.mark.skipif(not INTERPRET, reason="the interpreter's fallback checks (CUDA: the family test above)")
def test_changed_inputs_take_the_generic_path(monkeypatch):
    """What can change between calls of a prepared graph: another shape, other strides, another dtype, a pointer
    no longer 16-byte aligned. Each takes the generic path (right answer), and the recorded replay stays."""
    x, r, w, eps = _add_rms()
    bound = ts.BoundCall(rms_norm.fused_add_rms_norm)
    calls = []
    generic = bound.generic
    monkeypatch.setattr(bound, "generic", lambda *a: calls.append(1) or generic(*a))
    with torch.no_grad():
        bound(x, r, w, eps)                                           # recorded: through the generic call
        replay = bound.replay
        assert replay is not None and calls == [1]
        calls.clear()
        bound(x, r, w, eps)
        assert not calls                                              # replayed
        x2, r2, _, _ = _add_rms(rows=(2, 5))                          # shape
        wide = torch.empty(3, 7, 48, dtype=torch.bfloat16)[..., :40].copy_(x)   # strides
        buf = torch.empty(3 * 7 * 40 + 1, dtype=torch.bfloat16)
        shifted = buf[1:].view(3, 7, 40).copy_(x)                     # same shape and strides, pointer 2 bytes off
        assert bound.declined == 0 and replay.mismatch((x, r, w, eps)) is None
        for args, what in (((x2, r2, w, eps), "shape"), ((wide, r, w, eps), "strides"),
                           ((x.float(), r.float(), w.float(), eps), "dtype"), ((shifted, r, w, eps), "aligned")):
            n, declined = len(calls), bound.declined
            out = bound(*args)
            assert len(calls) == n + 1, f"a changed {what} was replayed"
            assert bound.declined == declined + 1 and what in replay.mismatch(args)   # counted, and why in words
            for o, want in zip(out, rms_norm.add_rms_norm_reference(*args)):
                torch.testing.assert_close(o.float(), want.float(), rtol=2e-2, atol=2e-2)
        assert bound.replay is replay
        w.requires_grad_(True)
    with torch.enable_grad():
        n = len(calls)
        bound(x, r, w, eps)                                           # autograd records: the reference
        assert len(calls) == n + 1 and "autograd" in replay.mismatch((x, r, w, eps))


class _CountingEnviron(dict):
    reads = 0

    def __getitem__(self, key):
        type(self).reads += 1
        return super().__getitem__(key)

    def get(self, key, default=None):
        type(self).reads += 1
        return super().get(key, default)


@pytest.mark.skipif(not INTERPRET, reason="runs the replay in the interpreter")
@pytest.mark.parametrize("family", ["add_rms_norm", "qkv_rotary", "swiglu_interleaved"])
def test_replay_reads_no_environment_and_plans_nothing(family, monkeypatch):
    """After the first call the replay reads no environment variable and asks no planner, selection or plan
    cache: with all of them made to fail, the bound call still returns the right outputs."""
    target, args, ref, tol = _cases(torch.float32, "cpu", 0)[family]
    bound = ts.BoundCall(target)
    with torch.no_grad():
        bound(*args)
    assert bound.replay is not None, bound.why

    def planner(*_a, **_k):
        raise AssertionError("a bound call planned")
    for module, names in ((rms_norm, ("_plan_launch", "select_rms_norm", "_signature")),
                          (gemm, ("paired_config", "gemm_config", "paired_applies", "gemm_applies")),
                          (rotary, ("select_rotary",)), (swiglu, ("select_swiglu",)),
                          (ts, ("interpreting", "planned", "operand_key", "launch"))):
        for name in names:
            monkeypatch.setattr(module, name, planner)
    env = _CountingEnviron(os.environ)
    monkeypatch.setattr(os, "environ", env)
    with torch.no_grad():
        out = bound(*args)
    assert _CountingEnviron.reads == 0, "the replay read the environment"
    for o, want in zip(_flat(out), _flat(ref(*(up64(a) if isinstance(a, torch.Tensor) else a for a in args)))):
        assert_close64(o, want, tol)


@pytest.mark.skipif(not INTERPRET, reason="records in the interpreter")
def test_a_call_that_computes_besides_its_kernels_stays_generic():
    """``swiglu_pass`` runs cuBLAS (a linear) before its kernel: the recording sees the op and keeps the generic
    path, with the reason; its outputs are the generic call's."""
    g = _gen(5)
    x, w = rand((2, 5, 16), torch.float32, "cpu", g), rand((2 * 24, 16), torch.float32, "cpu", g)
    bound = ts.BoundCall(swiglu.swiglu_pass)
    with torch.no_grad():
        out = bound(x, w, None, 24)
        again = bound(x, w, None, 24)
    assert bound.replay is None and "besides its kernels" in bound.why
    assert torch.equal(out, again) and torch.equal(out, swiglu.swiglu_pass(x, w, None, 24))
    assert "generic" in repr(bound) and copy.deepcopy(bound).why is None


@pytest.mark.skipif(not INTERPRET, reason="lowers the decoder on the CPU in Triton's interpreter")
def test_bound_decoder_graph_equals_the_unbound_graph():
    """The tiny Llama decoder, fused and prepared lean on the CPU: its fused nodes bound (every one replays
    after the first forward) give the unbound graph's logits bit for bit; SDPA on the CPU keeps the public
    call, with the reason."""
    from triton_testing import detect_module, fuse_all, randomized

    from explorer.fusions.kernels import measured
    from explorer.runtime import measure
    from explorer.sources import models

    torch.manual_seed(0)
    sizes = dict(layers=1, hidden=48, heads=3, kv_heads=1, intermediate=40, vocab=64, max_positions=32)
    model = randomized(models.LlamaDecoder(sizes).eval(), 1)
    ids = torch.randint(0, 64, (2, 7))
    gm, det = detect_module(model, (ids,), "tiny_llama")
    fused = fuse_all(gm, det)
    with measured.policy(swiglu="always", qkv_rotary="always"):
        plain = measure.prepare_graph(fused.gm, "cpu", torch.float32)
    bound_gm = copy.deepcopy(plain)
    assert lean.bind_calls(bound_gm) >= 3 and lean.bind_attention(bound_gm) == 1
    with torch.inference_mode():
        want = plain(ids)
        first = bound_gm(ids)
        second = bound_gm(ids)
    calls = lean.bound_calls(bound_gm)
    assert all(c.replay is not None for c in calls if isinstance(c, ts.BoundCall)), calls
    sdpa = [c for c in calls if isinstance(c, lean.BoundAttention)]
    assert sdpa and sdpa[0].op is None and "CUDA" in sdpa[0].why
    for a, b, c in zip(_flat(want), _flat(first), _flat(second)):
        assert torch.equal(a, b) and torch.equal(a, c)


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("shape", [(2, 8, 2, 128, 64), (4, 16, 16, 1024, 128)])
def test_bound_attention_equals_public_sdpa(shape, dtype):
    """SDPA bound to the dispatcher's backend: the same output bit for bit (and layout) as the public call, causal
    or not, at two shapes (the zoo decoder's 8 over 2 heads of 64 with ``enable_gqa``, 16 heads of 128); a changed
    shape takes the public call."""
    b, hq, hkv, s, d = shape
    gqa = hq != hkv
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=dtype, generator=g) for h in (hq, hkv, hkv))

    def public(q, k, v, causal):
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=gqa)
    for causal in (True, False):
        bound = lean.BoundAttention(causal, None, gqa)
        with torch.inference_mode():
            first = bound(q, k, v)
            again = bound(q, k, v)
            want = public(q, k, v, causal)
            half = [t[:, :, : s // 2] for t in (q, k, v)]
            other = bound(*half)
            other_want = public(*half, causal)
        assert bound.op is not None, bound.why
        assert torch.equal(first, want) and torch.equal(again, want) and again.stride() == want.stride()
        assert torch.equal(other, other_want)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_bound_linear_is_linear_bit_for_bit(dtype):
    """``BoundLinear``: the mm/addmm ATen's linear runs, called directly: bit for bit ``linear``'s output (3-D and
    2-D inputs, with and without bias, K and N not multiples of anything); a changed shape or a strided input
    takes ``linear``; a strided first input is never bound."""
    g = _gen(7)
    cases = [(rand((3, 7, 45), dtype, "cpu", g), rand((23, 45), dtype, "cpu", g), rand((23,), dtype, "cpu", g)),
             (rand((5, 45), dtype, "cpu", g), rand((23, 45), dtype, "cpu", g), None)]
    for x, w, b in cases:
        bound = lean.BoundLinear()
        with torch.inference_mode():
            first = bound(x, w, b)
            assert bound.sig is not None, bound.why
            again = bound(x, w, b)
            want = F.linear(x, w, b)
            assert torch.equal(first, want) and torch.equal(again, want) and again.stride() == want.stride()
            other = x[:2] if x.dim() == 3 else x[:3]
            assert torch.equal(bound(other, w, b), F.linear(other, w, b))
            t = torch.empty(*x.shape[:-1], 2 * x.shape[-1], dtype=dtype)[..., ::2].copy_(x)  # same shape, strided
            assert torch.equal(bound(t, w, b), F.linear(t, w, b))
    strided = lean.BoundLinear()
    x, w, b = cases[0]
    with torch.inference_mode():
        strided(x.transpose(0, 1), w, b)
    assert strided.sig is None and "contiguous" in strided.why


class _Forms(torch.nn.Module):
    """A GPT-2 Conv1D-style MLP input: ``gelu_tanh(x @ W + b)`` with ``W`` stored (in, out), as a fused call."""

    def __init__(self, weight_t: bool, act: str):
        super().__init__()
        g = _gen(11)
        self.weight_t, self.act = weight_t, act
        w = torch.randn(45, 23, generator=g) / 45 ** 0.5                              # (in, out)
        self.w = torch.nn.Parameter(w if weight_t else w.t().contiguous())
        self.b = torch.nn.Parameter(torch.randn(23, generator=g) * 0.1)

    def forward(self, x):
        return fused_linear_act_forms(x, self.w, self.b, self.act, self.weight_t, [3, 7, 23])


@pytest.mark.parametrize("weight_t, act", [(True, "gelu_tanh"), (False, "relu"), (True, "none")])
def test_linear_forms_lowering_runs_the_generic_calls(weight_t, act):
    """``fused_linear_act_forms`` lowered for the CPU: ``linear`` + the activation in place, then the reshape, bit for
    bit the generic target; lowered for CUDA (on a CPU graph: structure only): one ``_addmm_activation`` reading
    the stored ``Wᵀ`` (GPT-2) or a transpose view, and the reshape."""
    from explorer.runtime.lean import specialize_fused_calls

    module = _Forms(weight_t, act).eval()
    x = torch.randn(3, 7, 45, generator=_gen(12))
    for device in ("cpu", "cuda"):
        graph = torch.fx.Graph()
        xn = graph.placeholder("x")
        xn.meta["val"] = x
        call = graph.call_function(fused_linear_act_forms, (xn, graph.get_attr("w"), graph.get_attr("b"), act,
                                                            weight_t, [3, 7, 23]))
        graph.output(call)
        gm = torch.fx.GraphModule(module, graph)
        lowered = specialize_fused_calls(gm, device, torch.float32)
        if device == "cuda" and act.startswith("gelu") and not HAS_CUDA:
            assert lowered == 0   # whether cuBLASLt's GELU is the model's is probed on the device: left generic
            continue
        assert lowered == 1
        targets = [n.target for n in gm.graph.nodes if n.op == "call_function"]
        assert fused_linear_act_forms not in targets
        if device == "cpu":
            with torch.inference_mode():
                assert torch.equal(gm(x), module(x))
        elif act != "none":
            assert torch._addmm_activation in targets and torch.reshape in targets


@pytest.mark.parametrize("device", device_params())
@pytest.mark.parametrize("mask_shape", [(1, 1, 64, 64), (2, 1, 1, 64)], ids=["causal_bias", "padding"])
def test_bound_masked_attention_equals_the_generic_call(mask_shape, device):
    """``fused_attention`` with an additive mask (GPT-2's causal bias, BERT's padding mask), bound: bit for bit the
    generic call's output and layout, and a changed mask shape takes the generic call; on the CPU it stays
    generic (with the reason)."""
    from explorer.fusions import attention

    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    g = _gen(13)
    q, k, v = (rand((2, 4, 64, 64), dtype, device, g) for _ in range(3))
    mask = torch.where(rand(mask_shape, torch.float32, device, g) > -1.0, 0.0, -1e4).to(dtype)
    bound = lean.BoundMaskedAttention()
    with torch.inference_mode():
        first = bound(q, k, v, 0.125, mask)
        again = bound(q, k, v, 0.125, mask)
        want = attention.fused_attention(q, k, v, 0.125, mask)
        other_mask = mask.expand(2, 1, 64, 64).contiguous()
        other = bound(q, k, v, 0.125, other_mask)
    assert torch.equal(first, want) and torch.equal(again, want) and again.stride() == want.stride()
    assert torch.equal(other, attention.fused_attention(q, k, v, 0.125, other_mask))
    if device == "cuda":
        assert bound.op is not None, bound.why
    else:
        assert bound.op is None and "CUDA" in bound.why


def _vit_blocks():
    """Two of torchvision's ViT encoder blocks and a final LayerNorm, small (hidden 32, 2 heads), seeded, and an
    input at batch 2: the attention output reaches the add before ``ln_2`` as ``out_proj``'s ``view`` +
    ``transpose(1, 0)``, a non-contiguous ``(B, T, C)`` (strides ``(C, B·C, 1)``) as in vit_b_32."""
    from torchvision.models.vision_transformer import EncoderBlock
    from triton_testing import randomized

    torch.manual_seed(0)
    blocks = torch.nn.Sequential(EncoderBlock(2, 32, 64, 0.0, 0.0), EncoderBlock(2, 32, 64, 0.0, 0.0),
                                 torch.nn.LayerNorm(32, eps=1e-6))
    return randomized(blocks.eval(), 3), torch.randn(2, 5, 32, generator=_gen(7))


@pytest.mark.skipif(not INTERPRET, reason="runs the add+LayerNorm kernel on the CPU in Triton's interpreter")
def test_vit_attention_residual_binds_bit_for_bit(monkeypatch):
    """ViT's add before ``ln_2`` reads the attention output transposed: the lowering gives the fused call that
    operand through ``Tensor.contiguous`` (``norm.contiguous_operands``), so every bound add+LayerNorm node
    replays after the first forward (without it the general path's ``reshape`` copy kept 2 of the 4 here on the
    generic path at every forward: vit_b_32's 12 of 25); the lean graph's output equals the graph's without the
    copy node, and the unbound graph's, bit for bit."""
    from triton_testing import detect_module, fuse_all

    from explorer.runtime import measure

    model, x = _vit_blocks()
    gm, det = detect_module(model, (x,), "vit_blocks")
    fused = fuse_all(gm, det)
    plain = measure.prepare_graph(fused.gm, "cpu", torch.float32, binds=NO_HEADS)
    copies = [n for n in plain.graph.nodes if n.target is torch.Tensor.contiguous]
    with monkeypatch.context() as m:
        m.setattr(norm, "contiguous_operands", lambda node: 0, raising=False)   # (the graph as before it)
        before = measure.prepare_graph(fused.gm, "cpu", torch.float32, binds=NO_HEADS)
    bound_gm, bound_before = copy.deepcopy(plain), copy.deepcopy(before)
    assert lean.bind_calls(bound_gm) == 4 and lean.bind_calls(bound_before) == 4
    with torch.inference_mode():
        want, without = plain(x), before(x)
        outs = [bound_gm(x) for _ in range(3)]
        [bound_before(x) for _ in range(2)]
    assert len(copies) == 2                              # one per block: the transposed attention output
    calls = [c for c in lean.bound_calls(bound_gm) if isinstance(c, ts.BoundCall)]
    assert len(calls) == 4 and all(c.replay is not None for c in calls), calls
    stayed = [c for c in lean.bound_calls(bound_before) if isinstance(c, ts.BoundCall) and c.replay is None]
    assert len(stayed) == 2, lean.bound_calls(bound_before)      # the cost the copy node removes
    assert torch.equal(want, without) and want.stride() == without.stride()
    assert all(torch.equal(want, o) and want.stride() == o.stride() for o in outs)
    with torch.no_grad():                               # and the graph still computes the model (the kernel's
        torch.testing.assert_close(want, model(x), rtol=1e-5, atol=1e-5)   # fp32 sums, not eager's bit for bit)


@pytest.mark.skipif(not INTERPRET, reason="runs the add+LayerNorm kernel on the CPU in Triton's interpreter")
def test_replayed_outputs_keep_the_recorded_strides_at_batch_1(monkeypatch):
    """At batch 1 ViT's attention output ``(1, T, C)`` is contiguous with strides ``(C, C, 1)``, and the kernel's
    outputs (``empty_like``) keep them; the replay allocates the same strides (``torch.empty`` would give
    ``(T·C, C, 1)``, and the next bound call, recorded with the first call's strides, would decline at every
    forward: 2 of the 4 here, vit_b_32's 12 of 25). Every bound node replays, bit for bit, strides too."""
    from triton_testing import detect_module, fuse_all

    from explorer.runtime import measure

    model, x = _vit_blocks()
    x = x[:1].clone()
    gm, det = detect_module(model, (x,), "vit_blocks")
    plain = measure.prepare_graph(fuse_all(gm, det).gm, "cpu", torch.float32)
    bound_gm = copy.deepcopy(plain)
    assert lean.bind_calls(bound_gm) == 4
    declined = []
    run = ts._Replay.run
    monkeypatch.setattr(ts._Replay, "run", lambda self, args: declined.append(self) if (out := run(self, args)) is None
                        else out)
    with torch.inference_mode():
        want = plain(x)
        outs = [bound_gm(x) for _ in range(3)]
    calls = [c for c in lean.bound_calls(bound_gm) if isinstance(c, ts.BoundCall)]
    assert all(c.replay is not None for c in calls), calls
    assert not declined                                   # each replay ran: none fell back to the generic call
    assert all(torch.equal(want, o) and want.stride() == o.stride() for o in outs)


@pytest.mark.skipif(not INTERPRET, reason="runs the add+LayerNorm kernel on the CPU in Triton's interpreter")
def test_audit_reports_unbound_nodes_and_declining_replays(monkeypatch):
    """``lean.audit_bound_calls`` on ViT's blocks: with both fixes every node binds and no replay declines; with
    replayed outputs allocated by ``torch.empty`` (b245bff undone) at batch 1 the 2 nodes that read one decline at
    every call after the first, which the nodes' states (all "bound") do not show, reported with the strides;
    without ``norm.contiguous_operands`` (8441971 undone) at batch 2, 2 nodes never bind, with the reason."""
    from triton_testing import detect_module, fuse_all

    from explorer.runtime import measure

    model, x = _vit_blocks()
    x1 = x[:1].clone()

    def audited(x, ops=0):
        gm, det = detect_module(model, (x,), "vit_blocks")
        with monkeypatch.context() as m:
            if ops is None:
                m.setattr(norm, "contiguous_operands", lambda node: 0, raising=False)
            g = measure.prepare_graph(fuse_all(gm, det).gm, "cpu", torch.float32, binds=NO_HEADS)
        assert lean.bind_calls(g) == 4
        return lean.audit_bound_calls(g, (x,))

    rows = audited(x1)
    assert lean.audit_summary(rows) == dict(fused=4, bound=4, never_bound={}, declining={}, always_declining=0)
    make = ts._buffer_maker
    with monkeypatch.context() as m:
        m.setattr(ts, "_buffer_maker", lambda shape, stride, dtype, device, contiguous:
                  make(shape, stride, dtype, device, True))
        rows = audited(x1)
    assert all(r["state"] == "bound" for r in rows)
    declining = [r for r in rows if r["declined"]]
    assert len(declining) == 2 and all(r["declined"] == 2 for r in declining), rows
    assert all("strides" in r["declined_why"] for r in declining), declining
    summary = lean.audit_summary(rows)
    assert summary["bound"] == 4 and summary["always_declining"] == 2 and sum(summary["declining"].values()) == 2
    rows = audited(x, ops=None)
    summary = lean.audit_summary(rows)
    assert summary["bound"] == 2 and summary["never_bound"] == {"reads a tensor made outside the call": 2}, summary
    assert not summary["declining"]
