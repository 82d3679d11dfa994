"""The convolution family (``explorer.fusions.conv``): folding, the epilogue kernels, their selection, the patterns.

Kernels are checked against float64 on awkward shapes (odd channel counts, ragged
tiles, strides, dilation) in every dtype they take and in both layouts (NCHW and
channels_last). Without a GPU the Triton kernels run in Triton's interpreter
(``TRITON_INTERPRET=1``, set per test by ``triton_testing``'s autouse fixture; Triton
itself is first imported with it set, so that ``tl.sum`` can be interpreted); with CUDA the
same tests run the compiled kernels, and the ``gpu``-marked ones the cuDNN paths.

Tolerances: ``|out - ref64| <= atol + rtol·|ref64|``, ``ref64`` the unfused
computation in float64 from the same inputs upcast; each kernel declares its own
(``conv.BIAS_ACT_TOLERANCES``, ``DEPTHWISE_TOLERANCES``, ``TOLERANCES``) with its
error model. NaN never passes. New outputs are allocated full of NaN ("poisoned")
so that an element a kernel forgets to write fails; the in-place epilogue is
checked for coverage by starting from ``-inf`` inside a NaN guard zone.

The activation and residual kinds rotate over the (shape, dtype, layout) grid, so
that every one meets every dtype and layout somewhere without the full product.
"""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn
from triton_testing import (DTYPE_IDS, DTYPES, HAS_CUDA, assert_close64, compile_for_sm90, fused_matches,
                            needs_backend, triton_interpreter, up64)

from explorer.fusion_engine import detect
from explorer.fusions import attention, conv, conv_measured
from explorer.fusions.kernels import depthwise
from explorer.fusions.plan import make_plan
from explorer.fusions.rewrite import apply_plan
from explorer.fusions.triton_support import triton_available
from explorer.graph.build import build_graph
from explorer.runtime import lean, measure
from explorer.sources import capture

DEVICE = "cuda" if HAS_CUDA else "cpu"
gpu = pytest.mark.gpu
needs_cuda = pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device")

LAYOUTS = ["nchw", "nhwc"]
ACTS = list(conv.CONV_ACTIVATIONS)


@pytest.fixture(autouse=True)
def no_tf32():
    """fp32 CUDA convs are compared with float64 at 1e-5: keep cuDNN off TF32."""
    saved = torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cudnn.allow_tf32 = saved


@pytest.fixture
def poisoned(monkeypatch):
    """Every output the depthwise kernel allocates starts full of NaN."""
    monkeypatch.setattr(depthwise, "_new_output", lambda shape, dtype, device: torch.full(
        shape, float("nan"), dtype=dtype, device=device).contiguous(memory_format=torch.channels_last))


def rand(shape, dtype, gen, scale=1.0, device=DEVICE):
    """Normal samples drawn in float64 on the CPU (same values on any device), then cast."""
    return (torch.randn(shape, generator=gen, dtype=torch.float64) * scale).to(dtype=dtype, device=device)


def strided(t: torch.Tensor) -> torch.Tensor:
    """A copy of ``t`` viewed with a gap after every element of its last dim (neither layout)."""
    wide = torch.full((*t.shape[:-1], 2 * t.shape[-1]), float("nan"), dtype=t.dtype, device=t.device)
    wide[..., ::2] = t
    return wide[..., ::2]                                                    # (N, C, *spatial), last stride 2


def make_layout(t: torch.Tensor, layout: str) -> torch.Tensor:
    """``t`` in "nchw", "nhwc" or "strided" (neither layout)."""
    return strided(t) if layout == "strided" else conv.to_layout(t, layout)


def grid(*axes):
    """The product of ``axes`` (each a list of (value, id)), as pytest params, with an index for rotations."""
    combos = [[]]
    for axis in axes:
        combos = [c + [v] for c in combos for v in axis]
    return [pytest.param(i, *(v for v, _ in c), id="-".join(i_ for _, i_ in c)) for i, c in enumerate(combos)]


_DT = list(zip(DTYPES, DTYPE_IDS))
_LAY = [(lay, lay) for lay in LAYOUTS]


# ===================================================================== BatchNorm fold

def _bn_stats(c, gen, affine=True):
    mean = torch.randn(c, generator=gen, dtype=torch.float64)
    var = torch.rand(c, generator=gen, dtype=torch.float64) * 2 + 0.05
    gamma = torch.randn(c, generator=gen, dtype=torch.float64) if affine else None
    beta = torch.randn(c, generator=gen, dtype=torch.float64) if affine else None
    return mean, var, gamma, beta


@pytest.mark.parametrize(
    "x_shape, w_shape, groups, stride, padding, has_bias, affine",
    [
        ((2, 3, 7, 9), (17, 3, 3, 3), 1, 2, 1, True, True),           # conv2d, odd channels, stride 2
        ((2, 17, 7, 9), (17, 1, 3, 3), 17, 1, 1, False, True),        # depthwise, no conv bias
        ((2, 6, 7, 9), (9, 2, 1, 3), 3, 1, 0, True, False),           # grouped, BN without affine
        ((3, 5, 11), (7, 5, 3), 1, 2, 1, True, True),                 # conv1d
        ((1, 3, 5, 6, 7), (4, 3, 3, 3, 3), 1, 1, 1, False, True),     # conv3d
    ],
    ids=["conv2d", "depthwise", "grouped-noaffine", "conv1d", "conv3d"],
)
def test_fold_conv_bn_float64_exact(x_shape, w_shape, groups, stride, padding, has_bias, affine):
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(x_shape, generator=gen, dtype=torch.float64)
    w = torch.randn(w_shape, generator=gen, dtype=torch.float64)
    b = torch.randn(w_shape[0], generator=gen, dtype=torch.float64) if has_bias else None
    mean, var, gamma, beta = _bn_stats(w_shape[0], gen, affine)
    w_before = w.clone()
    fw, fb = conv.fold_conv_bn(w, b, mean, var, gamma, beta, 1e-5)
    assert torch.equal(w, w_before), "the fold must not modify its inputs"
    assert fw.shape == w.shape and fb.shape == (w_shape[0],)
    folded = conv.conv_nd(x, fw, fb, stride, padding, 1, groups)
    ref = conv.conv_bn_reference(x, w, b, mean, var, gamma, beta, 1e-5, stride, padding, 1, groups)
    assert (folded - ref).abs().max().item() <= conv.FOLD_TOLERANCE_F64


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_fold_conv_bn_keeps_dtype_and_matches_module(dtype):
    gen = torch.Generator().manual_seed(1)
    layer = torch.nn.Conv2d(3, 17, 3, stride=2, padding=1).double()
    bn = torch.nn.BatchNorm2d(17).double()
    mean, var, gamma, beta = _bn_stats(17, gen)
    with torch.no_grad():
        bn.running_mean.copy_(mean), bn.running_var.copy_(var), bn.weight.copy_(gamma), bn.bias.copy_(beta)
    bn.eval()
    x = torch.randn(2, 3, 7, 9, generator=gen, dtype=torch.float64)
    ref64 = bn(layer(x))
    fw, fb = conv.fold_conv_bn(layer.weight.to(dtype), layer.bias.to(dtype), bn.running_mean,
                               bn.running_var, bn.weight, bn.bias, bn.eps)
    assert fw.dtype == dtype and fb.dtype == dtype
    out = torch.nn.functional.conv2d(x, fw.double(), fb.double(), 2, 1)     # only the fold's rounding
    assert_close64(out, ref64, conv.TOLERANCES[dtype])


def test_fold_refused_in_training_mode():
    reason = conv.check_foldable(training=True)
    assert reason == ("BatchNorm in training mode: its statistics change every step, "
                      "folding is valid only for inference")
    assert conv.check_foldable(training=False) is None
    assert "running statistics" in conv.check_foldable(training=False, has_running_stats=False)
    w = torch.randn(4, 3, 3, 3)
    mean, var, gamma, beta = _bn_stats(4, torch.Generator().manual_seed(2))
    with pytest.raises(conv.Refuse, match="training mode"):
        conv.fold_conv_bn(w, None, mean, var, gamma, beta, 1e-5, training=True)


def test_fold_rejects_mismatched_channels():
    with pytest.raises(ValueError, match="output channels"):
        conv.fold_conv_bn(torch.randn(4, 3, 3, 3), None, torch.zeros(5), torch.ones(5), None, None, 1e-5)


# ===================================================================== layouts

def test_layout_of():
    t = torch.empty(2, 5, 3, 4)
    assert conv.layout_of(t) == "nchw"
    assert conv.layout_of(t.to(memory_format=torch.channels_last)) == "nhwc"
    assert conv.layout_of(t[..., ::2]) is None
    assert conv.layout_of(t.transpose(2, 3)) is None
    assert conv.layout_of(torch.empty(2, 5, 7).movedim(1, -1).contiguous().movedim(-1, 1)) == "nhwc"   # 3-D
    assert conv.layout_of(torch.empty(2, 5, 2, 3, 4).to(memory_format=torch.channels_last_3d)) == "nhwc"
    assert conv.layout_of(torch.empty(2, 5, 1, 1).to(memory_format=torch.channels_last)) == "nchw"  # both hold
    assert conv.layout_of(torch.empty(5)) is None
    assert conv.layout_of(conv.to_layout(t, "nhwc")) == "nhwc" and conv.to_layout(t, "nchw") is t


# ===================================================================== bias_act_: the epilogue pass

EPI_SHAPES = [((2, 24, 7, 9), "2x24x7x9"), ((3, 37, 13, 13), "3x37x13x13"), ((2, 97, 1, 1), "2x97x1x1")]
RESIDUALS = ["none", "same", "other", "strided"]     # z absent, in y's layout, in the other one, neither


def _epilogue_inputs(shape, dtype, layout, residual, gen):
    other = {"nchw": "nhwc", "nhwc": "nchw"}[layout]
    y = make_layout(rand(shape, dtype, gen, scale=2.0), layout)                       # (N, C, H, W)
    # |bias| >= 0.25: an element the kernel skipped would differ from its expected value
    b = rand(shape[1], dtype, gen)
    b = torch.where(b < 0, b - 0.25, b + 0.25).to(dtype)                              # (C,)
    z = None
    if residual != "none":
        z = make_layout(rand(shape, dtype, gen), {"same": layout, "other": other, "strided": "strided"}[residual])
    return y, b, z


def _check_bias_act(shape, dtype, layout, residual, act, seed):
    gen = torch.Generator().manual_seed(seed)
    y, b, z = _epilogue_inputs(shape, dtype, layout, residual, gen)
    ref64 = conv.bias_act_reference(up64(y), up64(b), up64(z), act)
    z_before = None if z is None else z.clone()
    strides = y.stride()
    out = conv.bias_act_(y, b, z, act)
    assert out is y and y.stride() == strides, "bias_act_ works in place and keeps the layout"
    assert_close64(out, ref64, conv.BIAS_ACT_TOLERANCES[dtype])
    if z is not None:
        assert torch.equal(z, z_before), "the residual must not be modified"


@needs_backend
@pytest.mark.parametrize("i, shape, dtype, layout, residual",
                         grid(EPI_SHAPES, _DT, _LAY, [(r, r) for r in RESIDUALS]))
def test_bias_act_matches_float64(i, shape, dtype, layout, residual):
    """Every (shape, dtype, layout, residual kind); the activation rotates over all of them."""
    _check_bias_act(shape, dtype, layout, residual, ACTS[i % len(ACTS)], seed=10 + i)


@needs_backend
@pytest.mark.parametrize("act", ACTS)
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_bias_act_every_activation(dtype, act):
    _check_bias_act((3, 37, 13, 13), dtype, "nhwc", "other", act, seed=9)


@needs_backend
@pytest.mark.parametrize("i, shape, dtype, layout", grid([((3, 5, 11), "3d"), ((2, 6, 3, 4, 5), "5d")], _DT, _LAY))
def test_bias_act_other_ranks(i, shape, dtype, layout):
    _check_bias_act(shape, dtype, layout, ("other", "none")[i % 2], ("hardswish", "gelu_tanh", "tanh")[i % 3], 11)


@needs_backend
@pytest.mark.parametrize("i, shape, dtype, layout",
                         grid(EPI_SHAPES + [((3, 5, 11), "3d")], _DT, _LAY))
def test_bias_act_writes_every_element_and_nothing_else(i, shape, dtype, layout):
    """``y`` starts as -inf inside a NaN guard zone, at an odd (unaligned) offset: after relu
    every element must be exactly 0 (written), every guard element still NaN (not written)."""
    gen = torch.Generator().manual_seed(12)
    _, b, z = _epilogue_inputs(shape, dtype, layout, RESIDUALS[i % 4], gen)
    numel, guard = torch.Size(shape).numel(), 37
    buf = torch.full((numel + 2 * guard,), float("nan"), dtype=dtype, device=DEVICE)
    body = buf[guard:guard + numel]
    y = body.view(shape) if layout == "nchw" else body.view(shape[0], *shape[2:], shape[1]).movedim(-1, 1)
    y.fill_(float("-inf"))
    conv.bias_act_(y, b, z, "relu")
    assert torch.equal(y, torch.zeros_like(y)), "an element of y was not written"
    assert torch.isnan(buf[:guard]).all() and torch.isnan(buf[guard + numel:]).all(), "wrote outside y"


@needs_backend
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_bias_act_rounds_to_nearest_even(dtype, layout):
    """y + b of unit-scale 16-bit values is exact in fp32 and in float64: the result must be
    exactly the float64 sum rounded to nearest even (torch's cast), in every element."""
    gen = torch.Generator().manual_seed(15)
    y = make_layout(rand((3, 37, 13, 13), dtype, gen), layout)
    b = rand(37, dtype, gen, scale=1e-2)                  # small: many sums fall between two 16-bit values
    expected = conv.bias_act_reference(up64(y), up64(b), None, "none").to(dtype)
    assert torch.equal(conv.bias_act_(y, b, None, "none").cpu(), expected)


@needs_backend
def test_bias_act_without_bias_and_small_blocks():
    """No bias, and a block far smaller than the tensor: many programs and a ragged tail."""
    gen = torch.Generator().manual_seed(13)
    y = make_layout(rand((3, 37, 13, 13), torch.float16, gen), "nhwc")
    z = rand((3, 37, 13, 13), torch.float16, gen)
    ref64 = conv.bias_act_reference(up64(y), None, up64(z), "gelu")
    assert_close64(conv.bias_act_(y, None, z, "gelu", block=512, num_warps=2), ref64,
                   conv.BIAS_ACT_TOLERANCES[torch.float16])


@needs_backend
@pytest.mark.parametrize("act", ACTS)
def test_bias_act_propagates_nan_like_torch(act):
    gen = torch.Generator().manual_seed(14)
    y = rand((2, 24, 3, 5), torch.float32, gen, scale=4.0).to(memory_format=torch.channels_last)
    y.masked_fill_(torch.arange(y.numel(), device=DEVICE).view(y.shape) % 7 == 0, float("nan"))
    b = rand(24, torch.float32, gen)
    expected_nan = torch.isnan(conv.bias_act_reference(up64(y), up64(b), None, act))
    out = conv.bias_act_(y, b, None, act)
    assert torch.equal(torch.isnan(out).cpu(), expected_nan)


def test_bias_act_rejects_bad_operands():
    y = torch.zeros(2, 5, 3, 3, device=DEVICE)
    with pytest.raises(ValueError, match="bias"):
        conv.bias_act_(y, torch.zeros(4, device=DEVICE))
    with pytest.raises(ValueError, match="residual"):
        conv.bias_act_(y, torch.zeros(5, device=DEVICE), torch.zeros(2, 5, 3, 4, device=DEVICE))
    with pytest.raises(ValueError, match="unknown activation"):
        conv.bias_act_(y, torch.zeros(5, device=DEVICE), act="swish")


def test_bias_act_without_triton_is_torch_in_place(monkeypatch):
    """Where Triton does not run (the CPU without the interpreter) the same maths runs as in-place torch ops."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    gen = torch.Generator().manual_seed(0)
    y = torch.randn(2, 5, 3, 4, generator=gen).to(memory_format=torch.channels_last)
    b, z = torch.randn(5, generator=gen), torch.randn(2, 5, 3, 4, generator=gen)
    ref64 = conv.bias_act_reference(up64(y), up64(b), up64(z), "silu")
    out = conv.bias_act_(y, b, z, "silu")
    assert out is y
    assert_close64(out, ref64, conv.BIAS_ACT_TOLERANCES[torch.float32])


# ===================================================================== the depthwise kernel

DW_CASES = [
    # x shape, k, stride, padding, dilation
    (((2, 24, 9, 7), 3, 1, 1, 1), "3x3"),                          # MobileNetV2's
    (((3, 37, 13, 11), 5, 2, 2, 1), "5x5-s2-odd-channels"),        # EfficientNet's, channel lanes masked
    (((2, 40, 8, 9), 3, (2, 1), (1, 2), 2), "per-dim-dilated"),    # stride, padding per dim, dilation 2
    (((1, 64, 7, 7), 7, 1, 3, 1), "7x7"),                           # ConvNeXt's
]


def _dw_inputs(case, dtype, layout, with_z, gen):
    x_shape, k, stride, padding, dilation = case
    c = x_shape[1]
    x = make_layout(rand(x_shape, dtype, gen), layout)                              # (N, C, H, W)
    w = rand((c, 1, k, k), dtype, gen, scale=1 / k)                                 # (C, 1, k, k)
    b = rand(c, dtype, gen, scale=0.5)
    z = None
    if with_z:
        z = rand(conv.conv_out_shape(x_shape, w.shape, stride, padding, dilation), dtype, gen)
    return x, w, b, z, (stride, padding, dilation)


@needs_backend
@pytest.mark.parametrize("i, case, dtype, layout", grid(DW_CASES, _DT, _LAY))
def test_depthwise_matches_float64(i, case, dtype, layout, poisoned):
    """Every geometry, dtype and input layout; the activation rotates, a residual every other case;
    the packed weight (what lean graphs pass) and the conv's own weight layout alternate."""
    gen = torch.Generator().manual_seed(20 + i)
    act = ACTS[(3 * i) % len(ACTS)]
    x, w, b, z, args = _dw_inputs(case, dtype, layout, i % 2 == 1, gen)
    ref64 = conv.conv_epilogue_reference(up64(x), up64(w), up64(b), up64(z), *args, groups=x.shape[1], act=act)
    weight = conv.pack_depthwise_weight(w) if i % 3 else w
    out = conv.depthwise_conv(x, weight, b, z, *args, act=act)
    assert conv.layout_of(out) == "nhwc" or out.shape[2] * out.shape[3] == 1
    assert_close64(out, ref64, conv.DEPTHWISE_TOLERANCES[dtype])


@needs_backend
@pytest.mark.parametrize("tiles", [(16, 16, 4), (8, 64, 4)], ids=["16x16", "8x64"])
def test_depthwise_ragged_tiles(tiles, poisoned):
    """Tiles that do not divide the pixels or the channels: many programs, masked tails on both sides."""
    gen = torch.Generator().manual_seed(25)
    x, w, b, z, args = _dw_inputs(((2, 37, 9, 7), 3, 2, 1, 1), torch.float16, "nhwc", True, gen)
    ref64 = conv.conv_epilogue_reference(up64(x), up64(w), up64(b), up64(z), *args, groups=37, act="relu6")
    out = conv.depthwise_conv(x, conv.pack_depthwise_weight(w), b, z, *args, act="relu6", tiles=tiles)
    assert_close64(out, ref64, conv.DEPTHWISE_TOLERANCES[torch.float16])


@needs_backend
@pytest.mark.parametrize("i, channels, dtype", grid([(48, "C48"), (100, "C100")], _DT))
def test_depthwise_layer_norm_epilogue(i, channels, dtype, poisoned):
    """ConvNeXt's epilogue: LayerNorm over the channels of each pixel after the bias (C = 100: masked lanes
    must not enter the mean or the variance); without affine parameters every other case."""
    gen = torch.Generator().manual_seed(26 + i)
    x = make_layout(rand((2, channels, 9, 8), dtype, gen, scale=2.0), "nhwc")
    w, b = rand((channels, 1, 7, 7), dtype, gen, scale=1 / 7), rand(channels, dtype, gen)
    affine = i % 2 == 0
    lw = rand(channels, dtype, gen, scale=0.2) + 1 if affine else None
    lb = rand(channels, dtype, gen, scale=0.2) if affine else None
    y64 = conv.conv_nd(up64(x), up64(w), up64(b), 1, 3, 1, channels).permute(0, 2, 3, 1)
    ref64 = torch.nn.functional.layer_norm(y64, (channels,), up64(lw), up64(lb), 1e-6)
    out = conv.depthwise_conv(x, conv.pack_depthwise_weight(w), b, None, 1, 3, 1, "none", norm=(lw, lb, 1e-6))
    # the conv's own rounding (TOLERANCES' error model) divided by σ ~ 1 of the normalised row
    assert_close64(out.permute(0, 2, 3, 1), ref64, conv.DEPTHWISE_TOLERANCES[dtype])


def test_depthwise_layer_norm_tiles_split_three_times_a_power_of_two():
    """ConvNeXt's widths (3·2^k) take three power-of-two chunks instead of a tile padded by a third."""
    for c in (48, 96, 192, 384, 768):
        bp, bc, warps = conv.depthwise_tiles(c, True)
        assert conv.depthwise_split(c, True) == 3 and bc * 3 == c and bp & (bp - 1) == 0, (c, bp, bc)
    for c in (100, 72, 12, 64):
        assert conv.depthwise_split(c, True) == 1 and conv.depthwise_tiles(c, True)[1] >= c
    assert conv.depthwise_split(96, False) == 1


def test_depthwise_rejects_what_it_does_not_compute():
    x = torch.zeros(1, 8, 5, 5, device=DEVICE)
    with pytest.raises(ValueError, match="not a depthwise"):
        conv.depthwise_conv(x, torch.zeros(8, 2, 3, 3, device=DEVICE), None, None)
    with pytest.raises(ValueError, match="residual"):
        conv.depthwise_conv(x, torch.zeros(8, 1, 3, 3, device=DEVICE), None, torch.zeros(1, 8, 5, 5, device=DEVICE))
    assert conv.is_depthwise(8, (8, 1, 3, 3), 8) and not conv.is_depthwise(8, (16, 1, 3, 3), 8)


# ===================================================================== the GEMM with an epilogue

GEMM_CASES = [((100, 37, 24), "100x37->24"), ((77, 16, 100), "77x16->100"), ((130, 144, 40), "130x144->40")]


@needs_backend
@pytest.mark.parametrize("i, case, dtype", grid(GEMM_CASES, _DT))
def test_gemm_epilogue_matches_float64(i, case, dtype):
    """M, N, K that no tile divides; a bias every case but one, a residual every other case (transposed, so not
    contiguous, every fourth), the activation rotating."""
    m, k, n = case
    gen = torch.Generator().manual_seed(40 + i)
    a, w = rand((m, k), dtype, gen), rand((n, k), dtype, gen, scale=k ** -0.5)              # (M, K), (N, K)
    b = rand(n, dtype, gen) if i != 4 else None
    z = None
    if i % 2:
        z = rand((n, m), dtype, gen).t() if i % 4 == 3 else rand((m, n), dtype, gen)        # (M, N)
    act = ACTS[(3 * i + 1) % len(ACTS)]
    assert conv.gemm_applies(a, w, z)
    out = conv.gemm_epilogue(a, w, b, z, act)
    ref64 = conv.apply_activation(up64(a) @ up64(w).t() + (0 if b is None else up64(b))
                                  + (0 if z is None else up64(z)), act)
    assert_close64(out, ref64, conv.TOLERANCES[dtype])


@needs_backend
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_gemm_epilogue_small_tiles(dtype):
    """Tiles that divide nothing: 5 row tiles in a group of 8 (the grouped order's ragged last group), 3 column
    tiles, 5 steps along K with a masked tail; and the output written through strides."""
    gen = torch.Generator().manual_seed(44)
    a, w = rand((130, 144), dtype, gen), rand((40, 144), dtype, gen, scale=144 ** -0.5)
    b, z = rand(40, dtype, gen), rand((130, 40), dtype, gen)
    out = torch.full((40, 130), float("nan"), dtype=dtype, device=DEVICE).t()                  # (M, N), strided
    conv.gemm_epilogue(a, w, b, z, "hardswish", out, tiles=(32, 16, 32))
    ref64 = conv.apply_activation(up64(a) @ up64(w).t() + up64(b) + up64(z), "hardswish")
    assert_close64(out, ref64, conv.TOLERANCES[dtype])


@needs_backend
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_conv1x1_as_a_gemm(dtype, layout):
    """A 1×1 conv over a channels_last input is one GEMM over the pixels (output channels_last); over an NCHW
    input the conv runs, then the epilogue pass. The same result either way."""
    gen = torch.Generator().manual_seed(45)
    x = make_layout(rand((2, 24, 7, 9), dtype, gen), layout)
    w = rand((40, 24, 1, 1), dtype, gen, scale=24 ** -0.5)
    b, z = rand(40, dtype, gen), make_layout(rand((2, 40, 7, 9), dtype, gen), layout)
    assert conv.conv1x1_applies(x, w, z) == (layout == "nhwc")
    out = conv.conv1x1_epilogue(x, w, b, z, "relu6")
    ref64 = conv.conv_epilogue_reference(up64(x), up64(w), up64(b), up64(z), act="relu6")
    assert conv.layout_of(out) == layout
    assert_close64(out, ref64, conv.TOLERANCES[dtype])
    assert conv.is_pointwise_conv((40, 24, 1, 1), 1, 0, 1, 1) and not conv.is_pointwise_conv((40, 24, 1, 1), 2, 0, 1, 1)


# ===================================================================== conv + epilogue, every path

CONV_CASES = [
    # x shape, w shape, stride, padding, dilation, groups
    (((2, 3, 7, 9), (17, 3, 3, 3), 2, 1, 1, 1), "conv-s2"),
    (((2, 17, 7, 9), (17, 1, 3, 3), 1, 1, 1, 17), "depthwise"),
    (((1, 6, 9, 7), (10, 3, 3, 1), (2, 1), [1, 0], 2, 2), "grouped-dilated"),   # tuple/list args
    (((2, 24, 5, 6), (40, 24, 1, 1), 1, 0, 1, 1), "1x1"),
]


def _conv_inputs(case, dtype, gen, layout="nchw", with_z=False, device=DEVICE):
    x_shape, w_shape, stride, padding, dilation, groups = case
    x = make_layout(rand(x_shape, dtype, gen, device=device), layout)
    w = rand(w_shape, dtype, gen, scale=0.3, device=device)
    b = rand(w_shape[0], dtype, gen, device=device)
    args = (stride, padding, dilation, groups)
    z = None
    if with_z:
        z = make_layout(rand(conv.conv_out_shape(x_shape, w_shape, stride, padding, dilation), dtype, gen,
                             device=device), layout)
    return x, w, b, z, args


@pytest.mark.parametrize("i, case, dtype, layout", grid(CONV_CASES, _DT, _LAY))
def test_conv_epilogue_matches_float64(i, case, dtype, layout):
    """``conv_epilogue`` as the selection decides here (under the interpreter: the Triton epilogue, the
    depthwise kernel for a channels_last depthwise conv); the activation rotates, a residual every other case."""
    gen = torch.Generator().manual_seed(3 + i)
    act = ACTS[(7 * i) % len(ACTS)]
    x, w, b, z, args = _conv_inputs(case, dtype, gen, layout, with_z=i % 2 == 0)
    z_before = None if z is None else z.clone()
    out = conv.conv_epilogue(x, w, b, z, *args, act=act)
    ref64 = conv.conv_epilogue_reference(up64(x), up64(w), up64(b), up64(z), *args, act=act)
    assert_close64(out, ref64, conv.TOLERANCES[dtype])
    if z is not None:
        assert torch.equal(z, z_before), "the residual input must not be modified"


@pytest.mark.parametrize("i, case, dtype", grid(CONV_CASES[:3], _DT))
def test_conv_epilogue_torch_path(i, case, dtype, monkeypatch):
    """Without Triton (the CPU, no interpreter): the conv with its bias, then add and activation in place."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    gen = torch.Generator().manual_seed(4 + i)
    act = ACTS[(5 * i) % len(ACTS)]
    x, w, b, z, args = _conv_inputs(case, dtype, gen, with_z=i % 2 == 1, device="cpu")
    assert conv.select_conv_epilogue("cpu", dtype, act, residual=z is not None).impl == "separate"
    out = conv.conv_epilogue(x, w, b, z, *args, act=act)
    ref64 = conv.conv_epilogue_reference(up64(x), up64(w), up64(b), up64(z), *args, act=act)
    assert_close64(out, ref64, conv.TOLERANCES[dtype])


# ===================================================================== selection

def test_labels_without_triton(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    label = lambda act, **kw: conv.select_conv_epilogue("cpu", kw.pop("dtype", torch.float32), act, **kw).label
    assert label("relu") == "conv+bias + relu in place (2 kernels)"
    assert label("none") == "conv+bias (1 kernel)"
    assert label("silu", residual=True) == "conv+bias + add_ in place + silu in place (3 kernels)"
    assert label("relu", depthwise=True) == "conv+bias + relu in place (2 kernels)"
    with pytest.raises(ValueError):
        label("swish")


def test_grouped_table_takes_the_nearest_measured_batch():
    """A grouped conv measured at batches 8 (the fused call faster) and 32 (the pass faster): another batch takes
    the nearest one's winner, a tie the smaller batch; another map size, dtype or GPU is unmeasured (None)."""
    def row(n, fused_us, plain_us, dtype="float16"):
        key = conv_measured.shape_key((n, 64, 28, 28), (64, 16, 3, 3), 1, 1, 1, 4)
        return {"device": "Some GPU", "dtype": dtype, "key": list(key), "residual": False,
                "us": {"cudnn": dict(median=fused_us, p20=fused_us, p80=fused_us),
                       "epilogue": dict(median=plain_us, p20=plain_us, p80=plain_us)}}
    table = conv_measured.read_table(json.dumps({"schema": conv_measured.TABLE_SCHEMA,
                                                 "rows": [row(8, 10.0, 20.0), row(32, 50.0, 30.0)]}))
    at = lambda n, hw=28, dtype=torch.float16: conv_measured.winner(  # noqa: E731
        "cuda", dtype, conv_measured.shape_key((n, 64, hw, hw), (64, 16, 3, 3), 1, 1, 1, 4), False)
    with conv_measured.measured_table(table), attention.measured_table({}, device_name="Some GPU"):
        assert [at(n) for n in (1, 8, 19, 20, 21, 32, 256)] == ["cudnn"] * 4 + ["epilogue"] * 3
        assert at(8, hw=14) is None and at(8, dtype=torch.bfloat16) is None
        assert conv_measured.winner("cuda", torch.float16, None, False) is None
    with conv_measured.measured_table(table), attention.measured_table({}, device_name="Another GPU"):
        assert at(8) is None


def test_a_grouped_conv_label_cites_the_measurement_that_chose_it(monkeypatch):
    """The label of a grouped conv + ReLU names the row its way was chosen by (the shape timed, both ways' median
    µs), whichever way won, the nearest batch's row for another batch; a depthwise conv, a conv without ReLU and a
    shape no row has keep the plain label. (A CUDA plan's labels: compiled Triton, not the interpreter.)"""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    def row(n, fused_us, plain_us):
        key = conv_measured.shape_key((n, 64, 28, 28), (64, 16, 3, 3), 1, 1, 1, 4)
        return {"device": "Some GPU", "dtype": "float16", "key": list(key), "residual": False,
                "us": {"cudnn": dict(median=fused_us, p20=fused_us, p80=fused_us),
                       "epilogue": dict(median=plain_us, p20=plain_us, p80=plain_us)}}
    table = conv_measured.read_table(json.dumps({"schema": conv_measured.TABLE_SCHEMA,
                                                 "rows": [row(8, 10.0, 20.0), row(32, 50.0, 30.0)]}))

    def choose(n, act="relu", hw=28):
        return conv.select_conv_epilogue("cuda", torch.float16, act, kernel_size=(3, 3), grouped=True,
                                         grouped_key=conv_measured.shape_key((n, 64, hw, hw), (64, 16, 3, 3),
                                                                             1, 1, 1, 4))
    with conv_measured.measured_table(table), attention.measured_table({}, device_name="Some GPU"):
        fused, plain, nearest = choose(8), choose(32), choose(30)
        assert fused.impl == "cudnn_conv_relu" and fused.label == (
            "cudnn conv+bias+relu (1 fused call: cudnn_convolution_relu) [chosen by: measured at N=8, 64→64 "
            "channels, 28×28, 3×3, 4 groups: cuDNN's fused call 10 µs, conv + pass 20 µs]")
        assert plain.impl == "triton_epilogue" and plain.label.endswith(
            "[chosen by: measured at N=32, 64→64 channels, 28×28, 3×3, 4 groups: cuDNN's fused call 50 µs, "
            "conv + pass 30 µs]")
        assert nearest.impl == "triton_epilogue" and "measured at N=32," in nearest.label
        from explorer.ui.i18n import translate_text
        assert translate_text(fused.label, "zh").endswith(
            "【依据：在 N=8、64→64 通道、28×28、3×3、4 组实测：cuDNN 融合调用 10 µs，卷积 + 单遍 20 µs】")
        for other in (choose(8, act="relu6"), choose(8, hw=14)):
            assert "chosen by" not in other.label
    with conv_measured.measured_table(table), attention.measured_table({}, device_name="Some GPU"):
        assert "chosen by" not in conv.select_conv_epilogue("cuda", torch.float16, "relu", kernel_size=(3, 3),
                                                            depthwise=True, grouped=True).label


def test_a_grouped_shape_is_timed_only_on_the_gpu_present():
    """Without a CUDA device nothing is timed (the default stands); ``measured_table`` is the whole truth."""
    key = conv_measured.shape_key((2, 24, 9, 7), (24, 6, 3, 3), 1, 1, 1, 4)
    assert conv_measured.measure_now(torch.device("cpu"), torch.float16, key, False) is None
    assert conv_measured.winner("cpu", torch.float16, key, False) is None
    with attention.measured_table({}, device_name="Some GPU"):      # a plan for a GPU that is not here
        assert conv_measured.winner("cuda", torch.float16, key, False) is None
    assert not any(k[2] == key for k in conv_measured.measured_here())
    xs, w, b, z = conv_measured.seeded_inputs(key, torch.float32, "cpu", copies=2, residual=True)
    y = torch.conv2d(xs[1], w, b, 1, 1, 1, 4)
    assert len(xs) == 2 and z.shape == y.shape and w.shape == (24, 6, 3, 3) and b.shape == (24,)
    assert xs[0].is_contiguous(memory_format=torch.channels_last) and not torch.equal(xs[0], xs[1])


@needs_cuda
def test_an_unmeasured_grouped_shape_is_timed_on_the_gpu_present():
    """An awkward grouped shape no table has, in fp16 and bf16, with and without a residual: timed both ways on this
    GPU once, and the selection follows what it measured; both ways compute the same as float64."""
    name = torch.cuda.get_device_name(0)
    key = conv_measured.shape_key((3, 48, 17, 13), (48, 12, 3, 3), 1, 1, 1, 4)
    for dtype in (torch.float16, torch.bfloat16):
        for residual in (False, True):
            got = conv_measured.winner("cuda", dtype, key, residual)
            row = conv_measured.measured_here()[(name, str(dtype).replace("torch.", ""), key, residual)]
            assert row is not None and row["measured"] == "now", row
            assert all(b["median"] > 0 and b["p20"] <= b["median"] <= b["p80"] for b in row["us"].values()), row
            assert got == conv_measured.best(row)
            impl = conv.select_conv_epilogue("cuda", dtype, "relu", residual=residual, grouped=True,
                                             grouped_key=key).impl
            assert impl == ({"cudnn": "cudnn_conv_add_relu" if residual else "cudnn_conv_relu"}.get(
                got, "triton_epilogue")), (impl, row)
    with conv_measured.measured_table({}):                       # a swapped-in table: nothing timed, the default
        assert conv_measured.winner("cuda", torch.float16, key, False) is None
    gen = torch.Generator(device="cuda").manual_seed(3)
    x = torch.randn(3, 48, 17, 13, generator=gen, device="cuda", dtype=torch.float16).to(
        memory_format=torch.channels_last)
    w = torch.randn(48, 12, 3, 3, generator=gen, device="cuda", dtype=torch.float16) * 0.3
    b = torch.randn(48, generator=gen, device="cuda", dtype=torch.float16)
    out = conv.conv_epilogue(x, w, b, None, 1, 1, 1, 4, act="relu")
    ref64 = conv.conv_epilogue_reference(up64(x), up64(w), up64(b), None, 1, 1, 1, 4, act="relu")
    assert_close64(out, ref64, conv.TOLERANCES[torch.float16])


def test_selection_on_cuda(monkeypatch):
    """What a CUDA device gets (decided without one: the selection reads the device type, not a device)."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    if not triton_available():
        pytest.skip("Triton is not importable")
    select = lambda act, **kw: conv.select_conv_epilogue("cuda", kw.pop("dtype", torch.float16), act, **kw)  # noqa
    cudnn = torch.backends.cudnn.is_available()
    assert select("relu").impl == ("cudnn_conv_relu" if cudnn else "triton_epilogue")
    assert select("relu", residual=True).impl == ("cudnn_conv_add_relu" if cudnn else "triton_epilogue")
    big = conv.CUDNN_RELU_1X1_MAX_PIXELS + 1
    assert select("relu", kernel_size=(1, 1), out_pixels=big).impl == "triton_epilogue"    # cuDNN lost there
    assert select("relu", kernel_size=(3, 3), out_pixels=big).impl == select("relu").impl
    assert select("relu", kernel_size=(1, 1), out_pixels=big, residual=True).impl == select("relu", residual=True).impl
    assert select("relu", kernel_size=(1, 1), out_pixels=big, pointwise=True).impl == "triton_gemm"
    # a grouped conv as its shape measured (conv_measured), GROUPED_UNMEASURED where the table lacks it
    key = conv_measured.shape_key((32, 336, 56, 56), (336, 168, 3, 3), 1, 1, 1, 2)
    row = lambda fused_us, plain_us: {"device": "Some GPU", "dtype": "float16", "key": list(key), "residual": False,  # noqa
                                      "us": {"cudnn": dict(median=fused_us, p20=fused_us, p80=fused_us),
                                             "epilogue": dict(median=plain_us, p20=plain_us, p80=plain_us)}}
    unmeasured = "cudnn_conv_relu" if conv.GROUPED_UNMEASURED == "cudnn" and cudnn else "triton_epilogue"
    with conv_measured.measured_table({}):                                            # an empty table: unmeasured
        assert select("relu", grouped=True, grouped_key=key).impl == unmeasured
    for fused_us, plain_us, impl in ((537.0, 30.0, "triton_epilogue"), (30.0, 40.0, "cudnn_conv_relu"),
                                     (29.9, 30.0, "triton_epilogue")):                 # within MARGIN: the plain conv
        table = conv_measured.read_table(json.dumps({"schema": conv_measured.TABLE_SCHEMA,
                                                     "rows": [row(fused_us, plain_us)]}))
        with conv_measured.measured_table(table), attention.measured_table({}, device_name="Some GPU"):
            assert select("relu", grouped=True, grouped_key=key).impl == (impl if cudnn else "triton_epilogue")
            other = conv_measured.shape_key((32, 336, 28, 28), (336, 168, 3, 3), 1, 1, 1, 2)
            assert select("relu", grouped=True, grouped_key=other).impl == unmeasured
            for batch in (1, 8, 64):                     # the same conv at another batch: the measured row's winner
                at = conv_measured.shape_key((batch, 336, 56, 56), (336, 168, 3, 3), 1, 1, 1, 2)
                assert select("relu", grouped=True, grouped_key=at).impl == (impl if cudnn else "triton_epilogue")
            assert (select("relu", grouped=True, grouped_key=key, dtype=torch.bfloat16).impl
                    == select("relu", grouped=True, dtype=torch.bfloat16).impl)             # the row is fp16's
    with pytest.raises(conv_measured.TableError, match="row 0 is not"):
        conv_measured.read_table(json.dumps({"schema": conv_measured.TABLE_SCHEMA, "rows": [{**row(1, 2), "key": [1]}]}))
    with pytest.raises(conv_measured.TableError, match="not a conv_grouped_measured/1 table"):
        conv_measured.read_table("[]")
    assert conv_measured.shape_key((1, 4, 5, 5), (4, 2, 3, 3), 1, "same", 1, 2) is None       # string padding
    assert conv_measured.shape_key((1, 4, 5, 5), (4, 4, 3, 3), 1, 1, 1, 1) is None           # one group: no row
    assert select("relu", depthwise=True).impl == select("relu", depthwise=True, residual=True).impl == "triton_depthwise"
    assert select("relu", depthwise=True, layout="nchw").impl == "triton_epilogue"
    with conv.policy(depthwise_triton=False):
        assert select("relu", depthwise=True).impl == "triton_epilogue"
    for act in ("relu6", "silu", "hardswish", "gelu", "none"):
        assert select(act).impl == "triton_epilogue" and "triton" in select(act).label
        assert select(act, pointwise=True).impl == "triton_gemm"
        assert select(act, pointwise=True, layout="nchw").impl == "triton_epilogue"
        assert select(act, depthwise=True).impl == "triton_depthwise"
        assert select(act, depthwise=True, layout="nchw").impl == "triton_epilogue"
    assert select("relu6", separate=True).impl == "separate"
    assert select("relu6", dtype=torch.float64).impl == "separate"
    with conv.policy(depthwise_triton=False, gemm_triton=False):
        assert select("relu6", depthwise=True).impl == select("relu6", pointwise=True).impl == "triton_epilogue"
    with conv.policy(triton_epilogue=False, cudnn_relu=False):
        assert select("relu").impl == select("relu6").impl == "separate"
    assert select("relu6", depthwise=True).impl == "triton_depthwise", "the policy comes back after the block"


@needs_backend
def test_selection_under_the_interpreter():
    if HAS_CUDA:
        pytest.skip("the interpreter runs without CUDA")
    choice = conv.select_conv_epilogue("cpu", torch.float16, "relu6", residual=True)
    assert choice.impl == "triton_epilogue" and choice.fused
    assert choice.label == ("conv (no bias) + triton bias + add + relu6 (2 kernels: one vectorised pass after "
                            "the conv) [Triton interpreter on cpu]")


# ===================================================================== GPU: cuDNN's fused calls

@gpu
@needs_cuda
@pytest.mark.parametrize("channels_last", [False, True], ids=["nchw", "nhwc"])
@pytest.mark.parametrize("with_add", [False, True], ids=["relu", "add-relu"])
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("case", [c for c, _ in CONV_CASES[:3]], ids=[i for _, i in CONV_CASES[:3]])
def test_cudnn_fused_conv_relu_gpu(case, dtype, with_add, channels_last):
    gen = torch.Generator().manual_seed(5)
    x, w, b, z, args = _conv_inputs(case, dtype, gen, "nhwc" if channels_last else "nchw", with_z=with_add,
                                    device="cuda")
    if channels_last:
        w = w.to(memory_format=torch.channels_last)
    depthwise = conv.is_depthwise(x.shape[1], w.shape, case[-1])
    choice = conv.select_conv_epilogue("cuda", dtype, "relu", residual=with_add, depthwise=depthwise,
                                       grouped=case[-1] > 1)       # a grouped shape the table lacks: the default
    takes_cudnn = not depthwise and (case[-1] == 1 or conv.GROUPED_UNMEASURED == "cudnn")
    assert choice.label.startswith("cudnn") == takes_cudnn, choice   # depthwise (and unmeasured grouped) skip it
    out = conv.conv_epilogue(x, w, b, z, *args, act="relu")
    ref64 = conv.conv_epilogue_reference(up64(x), up64(w), up64(b), up64(z), *args, act="relu")
    assert_close64(out, ref64, conv.TOLERANCES[dtype])


# ===================================================================== the kernels compile for sm_90

_COMPILE_FOR_SM90 = r'''
from explorer.fusions import attention, conv, conv_measured
from explorer.fusions.kernels import bias_act, depthwise, gemm

def loads(compiled):
    found = re.findall(r"ld\.global[^;]*;", compiled.asm["ptx"])
    return len(found), sum(".v4" in l for l in found)

def attrs(kernel, aligned, ones=()):   # what Triton's launcher assumes for 16-aligned pointers and ints
    out = {(list(kernel.arg_names).index(n),): [["tt.divisibility", 16]] for n in aligned}
    return out

out = []
k = bias_act._build_bias_act_kernel(False)
for dt, cl, act in (("fp16", True, "relu6"), ("bf16", True, "silu"), ("fp32", True, "gelu")):
    const = dict(C=96, HW=1, CHANNELS_LAST=cl, HAS_BIAS=True, HAS_Z=True, Z_CHANNELS_LAST=cl, ACT=act,
                 BLOCK=1024 if dt == "fp32" else 2048, BF16_RTNE_BY_HAND=False, INT64=False)
    sig = {"Y": "*" + dt, "BIAS": "*" + dt, "Z": "*" + dt, "numel": "i32", **{c: "constexpr" for c in const}}
    c = triton.compile(ASTSource(k, sig, const, attrs(k, ["Y", "BIAS", "Z", "numel"])), target=target,
                       options={"num_warps": 4})
    n, v4 = loads(c)
    out.append(dict(kernel="bias_act", dtype=dt, loads=n, vector_loads=v4, local=local_bytes(c)))
k = depthwise._build_depthwise_kernel(False)
for dt, kk, s, c_, norm in (("fp16", 3, 1, 96, False), ("fp16", 3, 2, 192, False), ("bf16", 5, 1, 240, False),
                            ("fp16", 7, 1, 768, True)):
    bp, bc, warps = conv.depthwise_tiles(c_, norm)
    const = dict(KH=kk, KW=kk, SH=s, SW=s, PH=kk // 2, PW=kk // 2, DH=1, DW=1, HAS_BIAS=True, HAS_Z=False,
                 ACT="none" if norm else "relu6", NORM=norm, NORM_AFFINE=norm, BLOCK_P=bp, BLOCK_C=bc,
                 SPLIT=conv.depthwise_split(c_, norm), BF16_RTNE_BY_HAND=False, LIBRARY_REDUCE=True)
    sig = {a: "i32" for a in k.arg_names}
    sig.update({p: "*" + dt for p in ("X", "WEIGHT", "BIAS", "Z", "Y", "NORM_W", "NORM_B")}, eps="fp32")
    for unit in ("sxc", "syc", "szc", "swc"):       # channels_last tensors and the packed weight: stride 1
        sig[unit] = "constexpr"
        const[unit] = 1
    sig.update({c: "constexpr" for c in const})
    aligned = ["X", "WEIGHT", "BIAS", "Z", "Y", "NORM_W", "NORM_B", "C", "sxn", "sxh", "sxw", "syn", "syh",
               "syw", "szn", "szh", "szw", "swh", "sww"]
    c = triton.compile(ASTSource(k, sig, const, attrs(k, aligned)), target=target, options={"num_warps": warps})
    n, v4 = loads(c)
    out.append(dict(kernel="depthwise", dtype=dt, k=kk, channels=c_, norm=norm, loads=n, vector_loads=v4,
                    local=local_bytes(c)))
k = gemm._build_gemm_kernel(False)
for dt, (m, n, kk) in (("fp16", (401408, 96, 16)), ("bf16", (100352, 384, 96)), ("fp16", (6272, 96, 384))):
    bm, bn, bk, warps, stages = conv.gemm_config(m, n, kk, 2, __import__("torch").device("cuda"))
    const = dict(HAS_BIAS=True, HAS_Z=True, ACT="gelu", BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=8,
                 DOT_PRECISION="tf32", BF16_RTNE_BY_HAND=False)
    sig = {a: "i32" for a in k.arg_names}
    sig.update({p: "*" + dt for p in ("A", "W", "BIAS", "Z", "C")})
    for unit in ("sak", "swk", "szn", "scn"):       # row-major operands: stride 1 along K and N
        sig[unit] = "constexpr"
        const[unit] = 1
    sig.update({c: "constexpr" for c in const})
    aligned = ["A", "W", "BIAS", "Z", "C", "M", "N", "K", "sam", "swn", "szm", "scm"]
    c = triton.compile(ASTSource(k, sig, const, attrs(k, aligned)), target=target,
                       options={"num_warps": warps, "num_stages": stages})
    out.append(dict(kernel="gemm", dtype=dt, shape=[m, n, kk], wgmma="wgmma.mma_async" in c.asm["ptx"],
                    local=local_bytes(c)))
print(json.dumps(out))
'''


@pytest.mark.skipif(HAS_CUDA, reason="on a GPU the compiled kernels are run by the tests above")
def test_conv_kernels_compile_for_sm90_without_gpu():
    """Compile (not run) the epilogue, depthwise and GEMM kernels for an H100/H200 (sm_90): the interpreter does
    not check what only the compiler does. On channels_last tensors with 16-byte aligned rows every load of the
    epilogue pass is a 128-bit vector, the depthwise kernel's loads are mostly vectors, the GEMM runs on the
    tensor cores (wgmma), and nothing spills."""
    results = compile_for_sm90(_COMPILE_FOR_SM90)
    assert len(results) == 10
    for r in results:
        assert r["local"] in (0, None), f"register spills: {r}"
        if r["kernel"] == "gemm":
            assert r["wgmma"], f"the GEMM does not use Hopper's tensor-core instructions: {r}"
        elif r["kernel"] == "bias_act":
            assert r["loads"] == r["vector_loads"] > 0, f"scalar loads in a channels_last epilogue: {r}"
        elif r["channels"] % 8 == 0 and not r["norm"]:
            assert r["vector_loads"] >= r["loads"] - 1 > 0, f"scalar loads in the depthwise kernel: {r}"
        else:   # a LayerNorm over 768 = 3·256 channels: three chunks, the input and weight loads all vectors
            assert r["vector_loads"] >= 3 * 7 * 2, f"scalar loads in the depthwise kernel's taps: {r}"


# ===================================================================== patterns and rewrites

class _LinearBottleneck(nn.Module):
    """MobileNetV2's inverted residual: expand 1×1 (BN, ReLU6), depthwise 3×3 (BN, ReLU6), project 1×1 (BN), + x."""

    def __init__(self, c: int = 12, expand: int = 3, act: type = nn.ReLU6) -> None:
        super().__init__()
        hidden = c * expand
        self.expand = nn.Sequential(nn.Conv2d(c, hidden, 1, bias=False), nn.BatchNorm2d(hidden), act())
        self.dw = nn.Sequential(nn.Conv2d(hidden, hidden, 3, padding=1, groups=hidden, bias=False),
                                nn.BatchNorm2d(hidden), act())
        self.project = nn.Sequential(nn.Conv2d(hidden, c, 1, bias=False), nn.BatchNorm2d(c))

    def forward(self, x):
        return x + self.project(self.dw(self.expand(x)))


class _Folded(nn.Module):
    """What an ONNX exporter leaves (BatchNorm folded): conv+act, conv+add, conv+add+act, conv+act (GELU)."""

    def __init__(self, c: int = 10) -> None:
        super().__init__()
        self.a = nn.Conv2d(c, c, 3, padding=1)
        self.b = nn.Conv2d(c, c, 1)
        self.c = nn.Conv2d(c, c, 3, padding=1, groups=c)
        self.d = nn.Conv2d(c, c, 1)

    def forward(self, x):
        y = nn.functional.hardswish(self.a(x))
        y = self.b(y) + x                                    # conv_add (a projection, no activation)
        y = nn.functional.silu(self.c(y) + y)                # conv_add_act
        return nn.functional.gelu(self.d(y))                 # conv_act


def _seeded(module: nn.Module) -> nn.Module:
    """``module`` with seeded BatchNorm statistics and affine parameters (not the identity), in eval mode."""
    gen = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for m in module.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.copy_(torch.randn(m.num_features, generator=gen) * 0.1)
                m.running_var.copy_(torch.rand(m.num_features, generator=gen) + 0.5)
                m.weight.copy_(torch.randn(m.num_features, generator=gen) * 0.2 + 1)
                m.bias.copy_(torch.randn(m.num_features, generator=gen) * 0.2)
    return module.eval()


def _detect(module: nn.Module, x: torch.Tensor):
    gm = capture(module, (x,), type(module).__name__)
    return gm, detect(build_graph(gm, type(module).__name__))


def test_linear_bottleneck_chains():
    """1 expand + 1 depthwise (Conv+BN+ReLU6) and the projection with its residual (Conv+BN+Add, no activation)."""
    _, det = _detect(_seeded(_LinearBottleneck()), torch.randn(2, 12, 9, 7))
    assert det.counts["conv_bn_act"] == 2 and det.counts["conv_bn_add"] == 1
    assert sum(det.counts.values()) == 3
    [project] = [c for c in det.chains if c.pattern == "conv_bn_add"]
    assert project.ops == ("conv", "batch_norm", "add")


def test_folded_convs_chains():
    _, det = _detect(_Folded().eval(), torch.randn(2, 10, 8, 6))
    assert [(c.pattern, c.ops) for c in det.chains] == [
        ("conv_act", ("conv", "hardswish")), ("conv_add", ("conv", "add")),
        ("conv_add_act", ("conv", "add", "silu")), ("conv_act", ("conv", "gelu"))]


class _SharedBatchNorm(nn.Module):
    """A projection whose BatchNorm output is read twice (the next block's conv and its residual add)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv, self.bn, self.next = nn.Conv2d(6, 6, 1, bias=False), nn.BatchNorm2d(6), nn.Conv2d(6, 6, 1)

    def forward(self, x):
        y = self.bn(self.conv(x))
        return self.next(y) + y


class _BroadcastAdd(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv, self.bn = nn.Conv2d(4, 6, 3, padding=1, bias=False), nn.BatchNorm2d(6)

    def forward(self, x, z):
        return self.bn(self.conv(x)) + z


def test_near_misses_of_the_new_patterns():
    _, det = _detect(_seeded(_SharedBatchNorm()), torch.randn(1, 6, 5, 5))
    assert det.counts["conv_bn"] == 1 and det.counts["conv_bn_add"] == 0
    assert any(m.pattern == "conv_bn_add" and m.reason == "BatchNorm output has 2 consumers" for m in det.near_misses)
    gm = capture(_seeded(_BroadcastAdd()), (torch.randn(1, 4, 5, 5), torch.randn(1, 6, 1, 1)), "broadcast")
    det = detect(build_graph(gm, "broadcast"))
    assert det.counts["conv_bn"] == 1 and det.counts["conv_bn_add"] == 0
    assert any(m.pattern == "conv_bn_add" and "broadcast" in m.reason for m in det.near_misses)


def test_rewrites_match_unfused_without_triton(monkeypatch):
    """The torch path (CPU, no interpreter), in float64: the folds and epilogues are exact algebra."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    for module, shape in ((_seeded(_LinearBottleneck()), (2, 12, 9, 7)), (_Folded().eval(), (2, 10, 8, 6))):
        module = module.double()
        gm, det = _detect(module, torch.randn(shape, dtype=torch.float64))
        x = torch.randn(shape, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
        fused = fused_matches(gm, det, x, 1e-12, device="cpu")     # the CPU's path on a GPU machine too
        assert all("conv+bias" in a.implementation for a in fused.applied if a.pattern != "conv_bn")


@needs_backend
@pytest.mark.parametrize("layout", LAYOUTS)
def test_rewrites_match_unfused_through_triton(layout):
    """The Triton paths (compiled, or interpreted on the CPU), both layouts; the labels name them: fused for
    channels_last, the depthwise kernel and the 1×1 GEMM (for a channels_last input); for nchw, whose graph runs
    with the capture's contiguous layouts, the epilogue pass after each conv."""
    x = torch.randn(2, 12, 9, 7, generator=torch.Generator().manual_seed(2)).to(DEVICE)
    gm, det = _detect(_seeded(_LinearBottleneck()).to(DEVICE), x)
    fused = fused_matches(gm, det, x, 1e-5, layout)
    labels = {a.chain_id.split("@")[1]: a.implementation for a in fused.applied}
    if layout == "nhwc":
        assert "triton depthwise" in labels["conv2d_1"] and "GEMM + bias + add" in labels["conv2d_2"]
    else:
        assert all("triton bias" in labels[c] and "GEMM" not in labels[c] for c in ("conv2d_1", "conv2d_2"))


def test_separate_epilogue_choice_covers_the_add_without_activation(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    x = torch.randn(2, 12, 9, 7)
    gm, det = _detect(_seeded(_LinearBottleneck()), x)
    project = next(c.id for c in det.chains if c.pattern == "conv_bn_add")
    fused = apply_plan(gm, det, make_plan(det, kernels={project: "separate_epilogue"}))
    applied = fused.by_id()[project]
    assert applied.status == "fused" and "kernel choice: separate epilogue" in applied.implementation
    assert "fused_conv_separate_epilogue" in fused.gm.code
    with torch.no_grad():
        torch.testing.assert_close(fused.gm(x), gm(x), rtol=1e-5, atol=1e-5)


@needs_backend
def test_lean_graph_calls_the_kernels_directly():
    """A lean graph (``measure.prepare_graph``) names ``conv1x1_epilogue`` and ``depthwise_conv_epilogue`` where
    the selection takes Triton, reads the depthwise weight packed, and computes what the plain graph does."""
    x = torch.randn(2, 12, 9, 7, generator=torch.Generator().manual_seed(3)).to(DEVICE)
    gm, det = _detect(_seeded(_LinearBottleneck()).to(DEVICE), x)
    fused = apply_plan(gm, det, make_plan(det), DEVICE)
    plain = measure.prepare_graph(fused.gm, DEVICE, torch.float32, channels_last=True, lean=False)
    lean_gm = measure.prepare_graph(fused.gm, DEVICE, torch.float32, channels_last=True)
    targets = [n.target for n in lean_gm.graph.nodes if n.op == "call_function"]
    assert targets.count(conv.depthwise_conv_epilogue) == 1 and targets.count(conv.conv1x1_epilogue) == 2
    packed = [b for name, b in lean_gm.named_buffers() if name.startswith("_lean_dw_")]
    assert packed and packed[0].stride(0) == 1, "the depthwise weight is read tap by tap, channels innermost"
    x = x.contiguous(memory_format=torch.channels_last)
    with torch.inference_mode():
        torch.testing.assert_close(lean_gm(x), plain(x), rtol=1e-6, atol=1e-6)
    assert lean.specialize_fused_calls(measure.prepare_graph(fused.gm, DEVICE, torch.float32, lean=False),
                                       torch.device(DEVICE), torch.float32) == 3


def test_grouped_conv_benchmark_smoke_checks_both_ways_on_real_shapes(tmp_path, monkeypatch):
    """``bench_grouped_conv.py --smoke``: the grouped, not depthwise, convs of torchvision's RegNets and ResNeXts
    (read on meta tensors: ResNeXt-50 has one grouped 3×3 conv in each of its 16 bottlenecks, groups 32), checked
    against float64 on the CPU; the GPU's table rows read back as ``conv_measured`` reads them; a broken way fails
    the run."""
    pytest.importorskip("torchvision")
    from triton_testing import fusion_benchmark

    bench = fusion_benchmark("bench_grouped_conv")
    shapes = bench.grouped_shapes("resnext50_32x4d", 2, 64)
    assert len(shapes) == 16 and {s["groups"] for s in shapes} == {32} and all(s["w"][2:] == (3, 3) for s in shapes)
    assert not bench.grouped_shapes("mobilenet_v2", 2, 64)                     # depthwise only: none
    out = tmp_path / "smoke.json"
    assert bench.main(["--smoke", "--models", "regnet_x_400mf,resnext50_32x4d", "--out", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert len(rows) == 4 and all(c["ok"] for r in rows for c in r["check"].values()), rows
    timed = [dict(r, us={n: {"median": 2.0, "p20": 1.0, "p80": 3.0} for n in conv_measured.CANDIDATES}) for r in rows]
    table = conv_measured.read_table(json.dumps({"schema": conv_measured.TABLE_SCHEMA,
                                                 "rows": bench.table_rows(timed, "Some GPU")}))
    assert len(table) == 4 and all(k[0] == "Some GPU" and len(k[2]) == conv_measured.KEY_LEN for k in table)
    monkeypatch.setattr(conv, "TOLERANCES", {k: dict(rtol=0.0, atol=0.0) for k in conv.TOLERANCES})
    assert bench.main(["--smoke", "--models", "resnext50_32x4d", "--out", str(out)]) == 1


def test_the_committed_grouped_table_reads_and_covers_the_corpus_grouped_convs():
    """The committed table (``conv_grouped_measured.json``, from ``bench_grouped_conv.py`` on the H200) reads, is
    for one GPU, has both dtypes of every shape, and each row's choice is what ``best`` says of it."""
    table = conv_measured.committed_table()
    assert table, "conv_grouped_measured.json is missing from the package"
    assert len({k[0] for k in table}) == 1 and {k[1] for k in table} == {"float16", "bfloat16"}
    shapes = {k[2] for k in table}
    assert all((n, d, s, False) in table for n in {k[0] for k in table} for d in ("float16", "bfloat16") for s in shapes)
    name = next(iter(table))[0]
    with attention.measured_table({}, device_name=name):
        for (_, dtype, key, residual), row in list(table.items())[:20]:
            got = conv_measured.winner("cuda", getattr(torch, dtype), key, residual)
            assert got == conv_measured.best(row)
