"""ConvNeXt's new kernels and LayerNorm2d chains: the one-pass LayerNorm over channels_last rows
(``kernels.layer_norm``), the GEMM with the GELU applied to its input (``kernels.gemm_prologue``), the
LayerNorm-affine fold, and the stem / downsampling / head chains (``convnext``'s patterns).

Every kernel is checked against float64 on awkward shapes (C not a power of two, 7×7 maps, odd batch) in
fp32, fp16 and bf16 with its module's tolerances, outputs poisoned with NaN; without a GPU the kernels run in
Triton's interpreter. The chains are checked on torchvision's ConvNeXt (a small configuration, seeded
weights) in float64 without Triton (exact up to rounding) and through the interpreter.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn
from triton_testing import (DTYPE_IDS, DTYPES, HAS_CUDA, KERNEL_DEVICE, assert_close64, compile_for_sm90,
                            detect_module, needs_backend, poison, rand, triton_interpreter, up64)  # noqa: F401

import torchvision  # after triton_testing: importing torchvision imports Triton

from explorer.fusions import convnext
from explorer.fusions.kernels import gemm_prologue, layer_norm, policy
from explorer.fusions.plan import make_plan
from explorer.fusions.rewrite import apply_plan
from explorer.runtime import measure

DEVICE = KERNEL_DEVICE


# ===================================================================== the one-pass LayerNorm

@needs_backend
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("channels, affine, pre", [(96, True, True), (40, False, True), (7, True, False)],
                         ids=["C96-affine-prebias", "C40-prebias", "C7-affine"])
def test_channels_layer_norm_matches_float64(dtype, channels, affine, pre, monkeypatch):
    poison(monkeypatch, layer_norm)
    gen = torch.Generator().manual_seed(channels)
    x = rand((3, channels, 7, 7), dtype, DEVICE, gen, 2.0, 0.5).contiguous(memory_format=torch.channels_last)
    w = rand(channels, dtype, DEVICE, gen, 0.1, 1.0) if affine else None
    b = rand(channels, dtype, DEVICE, gen, 0.1) if affine else None
    pb = rand(channels, dtype, DEVICE, gen, 0.3) if pre else None
    out = layer_norm.channels_layer_norm(x, w, b, 1e-6, pb)
    assert out.shape == (3, 7, 7, channels) and out.is_contiguous() and out.dtype == dtype
    ref = layer_norm.rows_layer_norm_reference(up64(x).permute(0, 2, 3, 1), up64(w), up64(b), 1e-6, up64(pb))
    assert_close64(out, ref, layer_norm.LAYER_NORM_TOLERANCES[dtype])


@needs_backend
def test_rows_that_are_not_contiguous_take_the_reference():
    """An NCHW map's permute is not rows of C: the reference runs (what torch computes, bit for bit)."""
    gen = torch.Generator().manual_seed(0)
    x = rand((2, 24, 5, 5), torch.float32, DEVICE, gen)
    w, b = rand(24, torch.float32, DEVICE, gen), rand(24, torch.float32, DEVICE, gen)
    out = layer_norm.channels_layer_norm(x, w, b, 1e-5)
    assert torch.equal(out, nn.functional.layer_norm(x.permute(0, 2, 3, 1), (24,), w, b, 1e-5))


def test_row_tiles_keep_whole_power_of_two_chunks():
    """C = 3·2^k rows are 4 chunks of 2^k (3 live, every load a whole vector); odd C one padded chunk."""
    cuda = torch.device("cuda")
    assert layer_norm.rows_tile(96, 10**5, cuda) == (16, 32, 4, 4)
    assert layer_norm.rows_tile(768, 10**5, cuda) == (2, 256, 4, 4)
    assert layer_norm.rows_tile(100, 10**5, cuda) == (16, 128, 1, 4)
    assert layer_norm.rows_tile(6144, 10, cuda) == (1, 256, 32, 8)


# ===================================================================== the GELU-prologue GEMM

@needs_backend
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_gemm_act_prologue_matches_float64(dtype):
    """act(a) @ Wᵀ + b + z with the residual read as rows of a channels_last map (strides (C, 1))."""
    gen = torch.Generator().manual_seed(5)
    m, k, n = 3 * 7 * 7, 120, 40
    a = rand((m, k), dtype, DEVICE, gen)
    w, b = rand((n, k), dtype, DEVICE, gen, k ** -0.5), rand(n, dtype, DEVICE, gen, 0.1)
    x = rand((3, n, 7, 7), dtype, DEVICE, gen).contiguous(memory_format=torch.channels_last)
    rows = x.permute(0, 2, 3, 1).reshape(m, n)                                 # a view: strides (C, 1)
    out = torch.full((m, n), float("nan"), dtype=dtype, device=DEVICE)
    gemm_prologue.gemm_act_prologue(a, w, b, rows, "gelu", out=out)
    ref = gemm_prologue.gemm_act_prologue_reference(up64(a), up64(w), up64(b), up64(rows), "gelu")
    assert_close64(out, ref, gemm_prologue.TOLERANCES[dtype])


# ===================================================================== the LayerNorm-affine fold

def test_layer_norm_affine_fold_is_exact_without_padding_only():
    gen = torch.Generator().manual_seed(1)
    g64 = dict(generator=gen, dtype=torch.float64)
    xhat = torch.randn(2, 6, 8, 8, **g64)
    gamma, beta = torch.rand(6, **g64) + 0.5, torch.randn(6, **g64)
    w, b = torch.randn(10, 6, 2, 2, **g64), torch.randn(10, **g64)
    affine = xhat * gamma.view(1, -1, 1, 1) + beta.view(1, -1, 1, 1)
    fw, fb = convnext.fold_layer_norm_affine(w, b, gamma, beta)
    assert (nn.functional.conv2d(xhat, fw, fb, 2) - nn.functional.conv2d(affine, w, b, 2)).abs().max() < 1e-12
    padded = nn.functional.conv2d(xhat, fw, fb, 1, 1) - nn.functional.conv2d(affine, w, b, 1, 1)
    assert padded.abs().max() > 1e-3, "with padding the fold is not exact: why the rewrite folds only without"
    lw, lb = torch.randn(5, 6, **g64), torch.randn(5, **g64)
    fw, fb = convnext.fold_layer_norm_affine(lw, lb, gamma, beta)
    rows = xhat.permute(0, 2, 3, 1)
    torch.testing.assert_close(nn.functional.linear(rows, fw, fb),
                               nn.functional.linear(rows * gamma + beta, lw, lb), rtol=1e-12, atol=1e-12)


# ===================================================================== the LayerNorm2d chains

def small_convnext(seed: int = 0) -> nn.Module:
    """torchvision's ConvNeXt with ConvNeXt's structure (stem, stages, downsamplings, head) at small widths
    (24 → 48 channels, one block each), weights at unit scale, a layer scale that matters."""
    from torchvision.models.convnext import CNBlockConfig

    model = torchvision.models.convnext.ConvNeXt([CNBlockConfig(24, 48, 1), CNBlockConfig(48, None, 1)],
                                                 num_classes=10)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("layer_scale"):
                p.copy_(0.1 + 0.4 * torch.rand(p.shape, generator=gen))
            elif p.dim() == 1:
                p.copy_(0.1 * torch.randn(p.shape, generator=gen) + (1.0 if "weight" in name else 0.0))
            else:
                p.copy_(torch.randn(p.shape, generator=gen) / p[0].numel() ** 0.5)
    return model.eval()


@pytest.fixture(scope="module")
def captured():
    x = torch.randn(3, 3, 32, 32, generator=torch.Generator().manual_seed(7))
    gm, det = detect_module(small_convnext(), (x,), "convnext_small_widths")
    return gm, det, x


def test_the_five_kinds_of_chain_are_found(captured):
    _, det, _ = captured
    counts = {k: v for k, v in det.counts.items() if v}
    assert counts == {"convnext_block": 2, "convnext_stem_ln": 1, "convnext_downsample_ln": 1, "convnext_head_ln": 1}


def test_rewrite_without_triton_is_exact_in_float64(monkeypatch):
    """Captured in float64 (the folds are then computed and kept in float64): the rewrite is exact algebra."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    x = torch.randn(3, 3, 32, 32, generator=torch.Generator().manual_seed(8), dtype=torch.float64)
    gm, det = detect_module(small_convnext(1).double(), (x,), "convnext_small_widths64")
    fused = apply_plan(gm, det, make_plan(det), "cpu")
    assert all(a.status == "fused" for a in fused.applied) and len(fused.applied) == 5
    with torch.inference_mode():
        torch.testing.assert_close(fused.gm(x), gm(x), rtol=1e-12, atol=1e-12)


@needs_backend
@pytest.mark.parametrize("ln2d", [True, False], ids=["ln2d-pass", "ln2d-off"])
def test_lean_model_through_triton_matches_float64(captured, ln2d):
    """The lean fused model (the LayerNorm2d passes on or off at preparation) against the float64 graph."""
    gm, det, x = captured
    fused = apply_plan(gm, det, make_plan(det), DEVICE)
    labels = {a.pattern: a.implementation for a in fused.applied}
    assert "affine folded into the conv" in labels["convnext_downsample_ln"]
    assert "bias+LayerNorm (1 pass)" in labels["convnext_stem_ln"]
    with policy.policy(convnext_ln2d=ln2d):
        lean = measure.prepare_graph(fused.gm, DEVICE, torch.float32, channels_last=True)
    targets = {n.target for n in lean.graph.nodes if n.op == "call_function"}
    direct = {convnext.conv_layer_norm2d, convnext._downsample_direct, convnext._head_direct}
    assert (direct <= targets) == ln2d and not (direct & targets and not ln2d)
    ref = measure.prepare_graph(gm, "cpu", torch.float64)
    xin = x.to(DEVICE).contiguous(memory_format=torch.channels_last)
    with torch.inference_mode():
        out, ref64 = lean(xin), ref(x.double())
    assert (out.double().cpu() - ref64).abs().max() <= 1e-4 * ref64.abs().max()


@pytest.mark.skipif(HAS_CUDA, reason="on a GPU the compiled kernels are run by the tests above")
def test_new_kernels_compile_for_sm90_without_spills():
    """Compiled (not run) for an H100/H200: the LayerNorm pass loads and stores only 16-byte vectors at ConvNeXt's
    first width (C = 96: three live chunks of 32), without spilling registers to local memory."""
    results = compile_for_sm90(_COMPILE_FOR_SM90)
    for r in results:
        assert r["local"] == 0, r
        if r["kernel"] == "rows_layer_norm":
            assert r["loads"] == r["vector_loads"] and r["stores"] == r["vector_stores"], r


_COMPILE_FOR_SM90 = r'''
import torch
from explorer.fusions.kernels import layer_norm

def aligned(kernel, names):
    return {(list(kernel.arg_names).index(n),): [["tt.divisibility", 16]] for n in names}

out = []
k = layer_norm._build_kernel(False)
for dt, c in (("fp16", 96),):
    rows, chunk, chunks, warps = layer_norm.rows_tile(c, 100000, torch.device("cuda"))
    const = dict(C=c, CHUNK=chunk, CHUNKS=chunks, ROWS=rows, HAS_PRE=True, HAS_W=True, HAS_B=True,
                 LIBRARY_REDUCE=True, BF16_RTNE_BY_HAND=False)
    sig = {a: ("constexpr" if a in const else "i32") for a in k.arg_names}
    sig.update({p: "*" + dt for p in ("X", "PRE", "W", "B", "Y")}, eps="fp32")
    cc = triton.compile(ASTSource(k, sig, const, aligned(k, ["X", "PRE", "W", "B", "Y"])), target=target,
                        options={"num_warps": warps})
    loads = re.findall(r"ld\.global[^;]*;", cc.asm["ptx"])
    stores = re.findall(r"st\.global[^;]*;", cc.asm["ptx"])
    out.append(dict(kernel="rows_layer_norm", dtype=dt, c=c, loads=len(loads),
                    vector_loads=sum(".v4" in l for l in loads), stores=len(stores),
                    vector_stores=sum(".v4" in l for l in stores), local=local_bytes(cc)))
print(json.dumps(out))
'''
