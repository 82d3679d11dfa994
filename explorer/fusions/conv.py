"""The convolution family: BatchNorm folding and the conv epilogue (bias, residual add, activation).

::

    conv_bn_add_act                      conv_bn_act             conv_bn_add          conv_bn
    x ─► conv(w) ─► bn ─► + z ─► act     x ─► conv ─► bn ─► act  x ─► conv ─► bn ─► + z   x ─► conv ─► bn
                          ▲ residual
    ==>  x ─► conv(w', b') [+ z] [act]   one call: BatchNorm folded into (w', b'),
                                         bias, residual and activation in the epilogue

    conv_add_act / conv_add / conv_act: the same without a BatchNorm (already
    folded, as ONNX exporters do).

Folding (``fold_conv_bn``) is pure arithmetic done once, in float64::

    s  = γ / sqrt(var + eps)          (one scale per output channel)
    w' = w · s                        (broadcast over in-channels and kernel)
    b' = (b − mean) · s + β           (b = 0 when the conv has no bias)

It is valid only for inference: in training BatchNorm normalises with the
statistics of the current batch, so there is no fixed (mean, var) to fold.

How the epilogue runs: ``select_conv_epilogue`` is the one decision, for a
device, dtype, activation and shape; the runtime call (``conv_epilogue``), the
report's label and the lean lowering (``LOWERINGS``) all ask it::

    cudnn_conv_add_relu  relu with a residual, on CUDA: one cuDNN call
    cudnn_conv_relu      relu, on CUDA, except 1×1 convolutions over large maps
                         (``CUDNN_RELU_1X1_MAX_PIXELS``): one cuDNN call
    triton_gemm          a 1×1 convolution (stride 1, no padding, one group) over a
                         channels_last input, on CUDA: ONE Triton GEMM over the pixels with
                         the whole epilogue (``conv1x1_epilogue``, ``gemm_epilogue``); any
                         other input layout takes ``triton_epilogue``
    triton_depthwise     a depthwise convolution over a channels_last input, on CUDA:
                         ONE Triton kernel computes the convolution and its whole
                         epilogue (``depthwise_conv_epilogue``); any other input
                         layout takes ``triton_epilogue``
    triton_epilogue      on CUDA otherwise (and on the CPU under TRITON_INTERPRET=1):
                         the convolution WITHOUT bias, then ONE vectorised Triton
                         pass ``bias_act_``: y = act(y + b[c] (+ z)), in place
    separate             anywhere else: the convolution with its bias, then
                         ``add_`` and the activation in place (torch, one kernel each)

Why the bias leaves the convolution on CUDA: ATen's cuDNN path adds a conv's bias
as a separate broadcast ``add_`` over the output, which is not vectorised over a
channels_last tensor, and issue 13's H200 profile of fused MobileNetV2 found those
adds (and the ReLU6 kernels after them) to be the largest share of its GPU time. ``bias_act_`` reads
and writes the output once, in 16-byte vectors, whatever the layout (it reads
the strides at run time: NCHW and channels_last both run as they are; the graph
cannot say which, as it is captured in NCHW).

Why 1×1 convolutions become GEMMs: over a channels_last input a 1×1 convolution is
exactly ``(N·H·W, C_in) @ (C_in, C_out)``, a view, and MobileNetV2's and EfficientNet's
expansions and projections have a small C_in: they are bound by writing their output, so
the epilogue's extra read and write of it would cost as much again. The Triton GEMM adds the
bias, the residual and the activation to its fp32 accumulator before the one store.

Why depthwise convolutions carry their epilogue: they do k² multiply-adds per
output element and are bound by memory, like the epilogue pass itself; one
kernel that writes the activated output moves the output once instead of three
times (conv write, epilogue read and write). The kernel tiles (output pixels ×
channels) with channels innermost, so every load and store is a 16-byte vector
of a channels_last tensor. ``POLICY`` lets a benchmark measure the alternatives
in one run (``benchmarks/bench_cnn_fusions.py``).

The depthwise kernel also takes a LayerNorm over the channels as its epilogue
(ConvNeXt's block, ``explorer.fusions.convnext``): with every channel of a pixel
in one program, the mean and variance are a reduction over the tile's rows.

Works for conv1d/2d/3d, grouped and depthwise convolutions (the output channel
is always dim 0 of the weight); not for transposed convolutions. The Triton
paths take fp32, fp16 and bf16; all arithmetic in them is fp32 and the result is
rounded once, to nearest even.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
import operator
from collections.abc import Iterator, Sequence

import torch
import torch.fx

from explorer.fusions import edit
from explorer.fusions.base import PAYS_CAVEAT, PRECISION_CAVEAT, Choice, Pattern, Step
from explorer.fusions.edit import NewAttr, Refuse, RewriteContext, UseGeneric
from explorer.fusions.epilogue import (EPILOGUE_TOLERANCES, TRITON_ACTIVATIONS, apply_activation,
                                       apply_activation_, check, in_place_node, triton_activation,
                                       triton_round_bf16)
from explorer.fusions.triton_support import (import_triton, interpreting, jit_helpers, launch,
                                             library_reductions_usable, next_power_of_2, operand_key, planned,
                                             remember, triton_runs_on)
from explorer.graph import aten
from explorer.vocab import ACTIVATIONS

#: Activations the conv epilogue applies (every path: cuDNN takes relu only, the others all of them).
CONV_ACTIVATIONS = TRITON_ACTIVATIONS
TRITON_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_CUDNN_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
LAYOUTS = ("nchw", "nhwc")

#: Conv with an epilogue against the unfused computation in float64 (see ``explorer.fusions.epilogue``).
TOLERANCES = EPILOGUE_TOLERANCES
#: ``bias_act_`` alone (``y`` given in its dtype) against float64: every input is exact in fp32,
#: the fp32 sum and activation err by a few fp32 ulps (~1e-7 relative for unit-scale data, ≪ u;
#: GELU's 1 + erf(x) cancels for x ≪ 0 to ~1.5e-7 absolute) and the output is rounded once, to
#: nearest (≤ u·|out|): rtol 1.25u (fp16 u = 4.9e-4, bf16 3.9e-3), tight enough that truncating
#: instead of rounding (up to 2u) fails; atol covers fp16 subnormals and that cancellation.
BIAS_ACT_TOLERANCES = {
    torch.float32: dict(rtol=1e-5, atol=1e-6),
    torch.float16: dict(rtol=6.1e-4, atol=1e-5),    # 1.25u
    torch.bfloat16: dict(rtol=4.9e-3, atol=1e-5),   # 1.25u
}
#: The depthwise kernel against the float64 conv graph, for unit-scale data (|conv| up to ~4):
#: it sums k² products in fp32 (≤ k²·6e-8 relative) and rounds once (u·|out|); the activation's
#: slope is at most 1.5 (hardswish at 3). rtol 2u, atol 8u for 16-bit; fp32 2e-5 (49 terms of 7×7).
DEPTHWISE_TOLERANCES = {
    torch.float32: dict(rtol=2e-5, atol=2e-5),
    torch.float16: dict(rtol=1e-3, atol=4e-3),      # 2u, 8u
    torch.bfloat16: dict(rtol=8e-3, atol=3.2e-2),   # 2u, 8u
}
#: The BatchNorm fold in float64 is exact algebra up to float64 rounding.
FOLD_TOLERANCE_F64 = 1e-10

#: cuDNN's fused conv+bias+ReLU lost to the convolution followed by a separate ReLU for 1×1
#: convolutions over large maps on the H200 (ResNet-50 fp16 channels_last, batch 32: slower than
#: unfused, as CUDA graphs, for the eight 1×1 convolutions at 56×56 and 28×28, faster for every 3×3
#: and every 1×1 at 14×14 or 7×7: ``chains`` of
#: ``benchmarks/results/report_resnet50_fp16_channels_last_h200.json``). Above this many output
#: pixels (N·H·W) a 1×1 conv + ReLU takes a Triton path instead.
CUDNN_RELU_1X1_MAX_PIXELS = 16384

TRAINING_REFUSAL = ("BatchNorm in training mode: its statistics change every step, "
                    "folding is valid only for inference")
NO_RUNNING_STATS_REFUSAL = ("BatchNorm without running statistics (track_running_stats=False) normalises "
                            "with batch statistics even in eval mode: there is nothing fixed to fold")
FOLD_CAVEAT = ("BatchNorm folding is valid only for inference: in training the batch statistics "
               "change every step, so the folded weights would be wrong.")
FORMULA = ("W' = W * gamma / sqrt(var + eps)  (per output channel);  "
           "b' = (b - mean) * gamma / sqrt(var + eps) + beta")


@dataclasses.dataclass(frozen=True)
class ConvPolicy:
    """Which paths ``select_conv_epilogue`` may take on CUDA (all on by default).

    A benchmark switches one off (``with policy(depthwise_triton=False): ...``) to
    measure what it buys, in the same run; the lean lowering bakes the choice into
    a prepared graph, so switch before ``prepare_graph``.
    """

    cudnn_relu: bool = True         # cuDNN's fused conv+bias(+add)+ReLU
    depthwise_triton: bool = True   # depthwise convs (channels_last) as one Triton kernel with their epilogue
    gemm_triton: bool = True        # 1×1 convs (channels_last) and ConvNeXt's linears as one Triton GEMM + epilogue
    #: ConvNeXt's two linears as Triton GEMMs with their epilogues (needs ``gemm_triton`` too). Off: cuBLAS
    #: plus one pass each (GELU; the residual) had the lower or level medians at all four stages of
    #: ConvNeXt-Tiny on the H200 and the lower profiled GPU time in the model (convnext.py says where); the
    #: benchmark times both.
    mlp_gemm_triton: bool = False
    triton_epilogue: bool = True    # conv without bias, then one Triton pass (else: the separate torch path)


POLICY = ConvPolicy()


@contextlib.contextmanager
def policy(**changes: bool) -> Iterator[ConvPolicy]:
    """Run a block with some ``ConvPolicy`` switches changed; the previous policy comes back after."""
    global POLICY
    saved = POLICY
    POLICY = dataclasses.replace(saved, **changes)
    try:
        yield POLICY
    finally:
        POLICY = saved


# ====================================================================== the arithmetic

def check_foldable(training: bool, has_running_stats: bool = True) -> str | None:
    """Return ``None`` when a BatchNorm can be folded, else a readable reason."""
    if training:
        return TRAINING_REFUSAL
    if not has_running_stats:
        return NO_RUNNING_STATS_REFUSAL
    return None


def fold_conv_bn(conv_weight: torch.Tensor, conv_bias: torch.Tensor | None, bn_mean: torch.Tensor,
                 bn_var: torch.Tensor, bn_weight: torch.Tensor | None, bn_bias: torch.Tensor | None,
                 eps: float, *, training: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Return ``(weight, bias)`` of the conv that equals conv → BatchNorm(eval).

    Takes the conv weight ``(C_out, C_in/groups, *kernel)``, its bias ``(C_out,)``
    or None, and the BatchNorm's running mean/var, affine weight γ and bias β
    (None when ``affine=False``) and eps. Computes in float64 and returns
    tensors in the conv weight's dtype and device; the bias is always returned
    (a conv without bias gains one). The inputs are not modified.
    Raises ``Refuse`` when ``training`` is true or the statistics are missing.
    """
    reason = check_foldable(training, has_running_stats=bn_mean is not None and bn_var is not None)
    if reason:
        raise Refuse(reason)
    out_channels = conv_weight.shape[0]
    for name, t in (("bn_mean", bn_mean), ("bn_var", bn_var), ("bn_weight", bn_weight),
                    ("bn_bias", bn_bias), ("conv_bias", conv_bias)):
        if t is not None and t.numel() != out_channels:
            raise ValueError(f"{name} has {t.numel()} elements, the conv has {out_channels} output channels")

    f64 = dict(dtype=torch.float64, device=conv_weight.device)
    w = conv_weight.detach().to(**f64)                                     # (C_out, C_in/g, *k)
    b = conv_bias.detach().to(**f64) if conv_bias is not None else torch.zeros(out_channels, **f64)
    mean = bn_mean.detach().to(**f64).reshape(-1)                          # (C_out,)
    var = bn_var.detach().to(**f64).reshape(-1)
    gamma = bn_weight.detach().to(**f64).reshape(-1) if bn_weight is not None else torch.ones(out_channels, **f64)
    beta = bn_bias.detach().to(**f64).reshape(-1) if bn_bias is not None else torch.zeros(out_channels, **f64)

    scale = gamma / torch.sqrt(var + eps)                                  # (C_out,)
    new_w = w * scale.reshape((-1,) + (1,) * (w.dim() - 1))
    new_b = (b - mean) * scale + beta
    return new_w.to(conv_weight.dtype), new_b.to(conv_weight.dtype)


def conv_nd(x, weight, bias, stride=1, padding=0, dilation=1, groups: int = 1) -> torch.Tensor:
    """``conv1d``/``conv2d``/``conv3d`` chosen by the weight's rank."""
    conv = {3: torch.nn.functional.conv1d, 4: torch.nn.functional.conv2d,
            5: torch.nn.functional.conv3d}.get(weight.dim())
    if conv is None:
        raise ValueError(f"conv weight must have 3, 4 or 5 dims, got {tuple(weight.shape)}")
    return conv(x, weight, bias, stride, padding, dilation, groups)


def conv_bn_reference(x, conv_weight, conv_bias, bn_mean, bn_var, bn_weight, bn_bias, eps,
                      stride=1, padding=0, dilation=1, groups: int = 1) -> torch.Tensor:
    """The unfused computation: convolution, then BatchNorm in eval mode."""
    y = conv_nd(x, conv_weight, conv_bias, stride, padding, dilation, groups)
    return torch.nn.functional.batch_norm(y, bn_mean, bn_var, bn_weight, bn_bias, training=False, eps=eps)


def conv_epilogue_reference(x, weight, bias, z=None, stride=1, padding=0, dilation=1, groups=1, act="relu"):
    """Unfused: conv (with bias), then ``+ z`` (when given), then the activation, each out of place.

    Runs in any dtype torch's convolution takes, float64 included (the tests' reference).
    """
    check(act, CONV_ACTIVATIONS)
    y = conv_nd(x, weight, bias, stride, padding, dilation, groups)
    return apply_activation(y if z is None else y + z, act)


def bias_act_reference(y: torch.Tensor, bias: torch.Tensor | None, z: torch.Tensor | None = None,
                       act: str = "relu") -> torch.Tensor:
    """The epilogue alone, unfused and out of place: ``act(y + bias[c] (+ z))``."""
    check(act, CONV_ACTIVATIONS)
    out = y if bias is None else y + _channel_view(bias, y.dim())           # (N, C, *spatial)
    if z is not None:
        out = out + z                                                       # (N, C, *spatial)
    return apply_activation(out, act)


def _as_list(value, n: int) -> list[int]:
    if type(value) is list and len(value) == n:       # what the rewritten graph passes: no copy
        return value
    if isinstance(value, int):
        return [value] * n
    value = [int(v) for v in value]
    return value * n if len(value) == 1 else value


def conv_out_shape(x_shape: Sequence[int], weight_shape: Sequence[int], stride, padding, dilation
                   ) -> tuple[int, ...]:
    """Output shape of a convolution with integer padding."""
    n = len(weight_shape) - 2
    stride, padding, dilation = _as_list(stride, n), _as_list(padding, n), _as_list(dilation, n)
    spatial = [(size + 2 * p - d * (k - 1) - 1) // s + 1
               for size, k, s, p, d in zip(x_shape[2:], weight_shape[2:], stride, padding, dilation)]
    return (x_shape[0], weight_shape[0], *spatial)


def _channel_view(t: torch.Tensor, ndim: int) -> torch.Tensor:
    """A per-channel vector ``(C,)`` viewed as ``(1, C, 1, ...)`` to broadcast over ``ndim`` dims."""
    return t.view(1, -1, *([1] * (ndim - 2)))


def is_depthwise(x_channels: int, weight_shape: Sequence[int], groups) -> bool:
    """A depthwise 2-D convolution with channel multiplier 1: ``groups == C_in == C_out``, weight ``(C, 1, kh, kw)``."""
    return (len(weight_shape) == 4 and isinstance(groups, int) and groups > 1
            and weight_shape[1] == 1 and weight_shape[0] == groups == x_channels)


# ====================================================================== layouts

def layout_of(t: torch.Tensor) -> str | None:
    """``"nchw"`` (row-major contiguous), ``"nhwc"`` (channels-last contiguous) or None.

    Any rank >= 2 (``(N, C, *spatial)``); strides of size-1 dims are ignored, as
    ``is_contiguous`` does. Where both hold (C == 1 or one spatial element) the answer is
    ``"nchw"``: both layouts then order the storage the same way.
    """
    if t.dim() < 2:
        return None
    if t.is_contiguous():
        return "nchw"
    shape, strides = t.shape, t.stride()
    expected = 1
    for d in (1, *range(t.dim() - 1, 1, -1), 0):         # innermost to outermost: c, spatial..., n
        if shape[d] != 1 and strides[d] != expected:
            return None
        expected *= shape[d]
    return "nhwc"


def to_layout(t: torch.Tensor, layout: str) -> torch.Tensor:
    """``t`` made contiguous in ``layout`` ("nchw" or "nhwc"); ``t`` itself when it already is."""
    current = layout_of(t)
    if current == layout or (layout == "nhwc" and current == "nchw" and _layouts_coincide(t)):
        return t
    if layout == "nchw":
        return t.contiguous()
    return t.movedim(1, -1).contiguous().movedim(-1, 1)                    # (N, C, *spatial), C innermost


def _layouts_coincide(t: torch.Tensor) -> bool:
    """Both layouts order the storage alike (a single channel, or a single spatial element)."""
    return t.shape[1] == 1 or math.prod(t.shape[2:]) == 1


@functools.lru_cache(maxsize=8)
def _sm_count(device_index: int) -> int:
    """Streaming multiprocessors of a CUDA device (cached)."""
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def sm_count(device: torch.device) -> int:
    """Streaming multiprocessors of ``device`` (CUDA), read once per device."""
    return _sm_count(device.index if device.index is not None else torch.cuda.current_device())


# ====================================================================== Triton kernels

@functools.lru_cache(maxsize=2)
def _build_bias_act_kernel(interpret: bool):
    """Define the in-place epilogue kernel (imports Triton); cached per interpreter mode.

    ``triton.jit`` reads TRITON_INTERPRET when it decorates, hence the lazy definition;
    the names the kernel calls (``tl``, ``_activation``, ``_round_for``) are module globals.
    """
    global tl, _activation, _round_for
    _activation, _round_for = triton_activation(interpret), triton_round_bf16(interpret)
    triton, tl = import_triton()

    @triton.jit
    def _bias_act_kernel(
        Y, BIAS, Z,                       # y (in place), bias (C,), residual (y's shape); unused ones alias y
        numel,
        C: tl.constexpr, HW: tl.constexpr,  # HW: product of the spatial dims (1 where no index needs it)
        CHANNELS_LAST: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_Z: tl.constexpr,
        Z_CHANNELS_LAST: tl.constexpr, ACT: tl.constexpr, BLOCK: tl.constexpr,
        BF16_RTNE_BY_HAND: tl.constexpr, INT64: tl.constexpr,
    ):
        pid = tl.program_id(0)
        if INT64:
            pid = pid.to(tl.int64)
        offs = pid * BLOCK + tl.arange(0, BLOCK)                            # (BLOCK,) flat storage index
        live = offs < numel
        v = tl.load(Y + offs, mask=live, other=0.0).to(tl.float32)
        if CHANNELS_LAST:
            c = offs % C                                                    # storage (n, s, c)
        else:
            c = (offs // HW) % C                                            # storage (n, c, s)
        if HAS_BIAS:
            v += tl.load(BIAS + c, mask=live, other=0.0, eviction_policy="evict_last").to(tl.float32)
        if HAS_Z:
            if Z_CHANNELS_LAST == CHANNELS_LAST:
                z_offs = offs
            elif CHANNELS_LAST:                                             # y (n, s, c), z (n, c, s)
                n = offs // (C * HW)
                s = (offs // C) % HW
                z_offs = (n * C + c) * HW + s
            else:                                                           # y (n, c, s), z (n, s, c)
                n = offs // (C * HW)
                s = offs % HW
                z_offs = (n * HW + s) * C + c
            v += tl.load(Z + z_offs, mask=live, other=0.0).to(tl.float32)
        v = _round_for(_activation(v, ACT), BF16_RTNE_BY_HAND)
        tl.store(Y + offs, v.to(Y.dtype.element_ty, fp_downcast_rounding="rtne"), mask=live)

    return _bias_act_kernel


@functools.lru_cache(maxsize=2)
def _build_depthwise_kernel(interpret: bool):
    """Define the depthwise convolution kernel with its epilogue (imports Triton); cached per interpreter mode."""
    global tl, _activation, _round_for, _add, _dw_taps, _dw_rowsum, _dw_finish
    _activation, _round_for = triton_activation(interpret), triton_round_bf16(interpret)
    _add = jit_helpers(interpret).add
    triton, tl = import_triton()

    @triton.jit
    def _dw_taps(x_base, w_base, c_live, oh, ow, p_live, H, W, sxh, sxw, swh, sww,
                 KH: tl.constexpr, KW: tl.constexpr, SH: tl.constexpr, SW: tl.constexpr, PH: tl.constexpr,
                 PW: tl.constexpr, DH: tl.constexpr, DW: tl.constexpr, BLOCK_P: tl.constexpr,
                 BLOCK_C: tl.constexpr):
        """The (BP, BC) fp32 sums over the taps for the channels of ``x_base``/``w_base`` ((1, BC) pointers)."""
        # the tap's weights as a (BP, BC) tile of one repeated row: loaded in x's layout (a (BC,) load takes
        # a layout of its own, and converting it costs a trip through shared memory and a barrier per tap)
        w_tile = tl.broadcast_to(w_base, (BLOCK_P, BLOCK_C))
        c_tile = tl.broadcast_to(c_live[None, :], (BLOCK_P, BLOCK_C))
        acc = tl.zeros((BLOCK_P, BLOCK_C), dtype=tl.float32)
        for kh in range(KH):                                                # a loop: unrolling it holds every
            ih = oh * SH - PH + kh * DH                                     # tap's load in registers at once
            h_ok = p_live & (ih >= 0) & (ih < H)
            for kw in tl.static_range(KW):
                iw = ow * SW - PW + kw * DW
                ok = h_ok & (iw >= 0) & (iw < W)
                xv = tl.load(x_base + (ih * sxh + iw * sxw)[:, None], mask=ok[:, None] & c_live[None, :],
                             other=0.0)                                     # (BP, BC)
                wv = tl.load(w_tile + (kh * swh + kw * sww), mask=c_tile, other=0.0,
                             eviction_policy="evict_last")                  # (BP, BC) rows of weight[c, 0, kh, kw]
                acc += xv.to(tl.float32) * wv.to(tl.float32)
        return acc

    @triton.jit
    def _dw_rowsum(v, LIBRARY_REDUCE: tl.constexpr):
        """The sum of each row of ``v``."""
        if LIBRARY_REDUCE:
            return tl.sum(v, axis=1)
        else:
            return tl.reduce(v, 1, _add)

    @triton.jit
    def _dw_finish(acc, cols, c_live, rstd, n, oh, ow, p_live, NORM_W, NORM_B, Z, Y, szn, szc, szh, szw,
                   syn, syc, syh, syw, HAS_Z: tl.constexpr, ACT: tl.constexpr, NORM: tl.constexpr,
                   NORM_AFFINE: tl.constexpr, BF16_RTNE_BY_HAND: tl.constexpr):
        """Scale by ``rstd`` and apply γ, β (a LayerNorm: ``acc`` is centred), add z, activate, store."""
        live = p_live[:, None] & c_live[None, :]
        if NORM:
            acc = acc * rstd[:, None]
            if NORM_AFFINE:
                acc = acc * tl.load(NORM_W + cols, mask=c_live, other=0.0).to(tl.float32)[None, :]
                acc += tl.load(NORM_B + cols, mask=c_live, other=0.0).to(tl.float32)[None, :]
        if HAS_Z:
            acc += tl.load(Z + n * szn + (oh * szh + ow * szw)[:, None] + cols[None, :] * szc, mask=live,
                           other=0.0).to(tl.float32)
        acc = _round_for(_activation(acc, ACT), BF16_RTNE_BY_HAND)
        tl.store(Y + n * syn + (oh * syh + ow * syw)[:, None] + cols[None, :] * syc,
                 acc.to(Y.dtype.element_ty, fp_downcast_rounding="rtne"), mask=live)

    @triton.jit
    def _depthwise_kernel(
        X, WEIGHT, BIAS, Z, Y, NORM_W, NORM_B,    # unused pointers alias X
        H, W, H_OUT, W_OUT, C, eps,
        sxn, sxc, sxh, sxw, syn, syc, syh, syw, szn, szc, szh, szw, swc, swh, sww,
        KH: tl.constexpr, KW: tl.constexpr, SH: tl.constexpr, SW: tl.constexpr,
        PH: tl.constexpr, PW: tl.constexpr, DH: tl.constexpr, DW: tl.constexpr,
        HAS_BIAS: tl.constexpr, HAS_Z: tl.constexpr, ACT: tl.constexpr, NORM: tl.constexpr,
        NORM_AFFINE: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr, SPLIT: tl.constexpr,
        BF16_RTNE_BY_HAND: tl.constexpr, LIBRARY_REDUCE: tl.constexpr,
    ):
        # A program: BLOCK_P output pixels × SPLIT chunks of BLOCK_C channels (SPLIT 3: C = 3·2^k, as in
        # ConvNeXt, without the quarter of dead lanes a power-of-two tile of the whole row would carry).
        p = tl.program_id(0) * BLOCK_P + tl.arange(0, BLOCK_P)             # (BP,) output pixels
        n = tl.program_id(1).to(tl.int64)                                   # (grid dims 1, 2: at most 65535)
        cols = tl.program_id(2) * (SPLIT * BLOCK_C) + tl.arange(0, BLOCK_C)  # (BC,) channels of chunk 0
        p_live = p < H_OUT * W_OUT
        c_live = cols < C
        oh = p // W_OUT
        ow = p % W_OUT
        x_n = X + n * sxn
        acc = _dw_taps(x_n + cols[None, :] * sxc, WEIGHT + cols[None, :] * swc, c_live, oh, ow, p_live, H, W,
                       sxh, sxw, swh, sww, KH, KW, SH, SW, PH, PW, DH, DW, BLOCK_P, BLOCK_C)
        if HAS_BIAS:
            acc += tl.load(BIAS + cols, mask=c_live, other=0.0).to(tl.float32)[None, :]
        if SPLIT == 3:
            cols1, cols2 = cols + BLOCK_C, cols + 2 * BLOCK_C
            c1, c2 = cols1 < C, cols2 < C
            acc1 = _dw_taps(x_n + cols1[None, :] * sxc, WEIGHT + cols1[None, :] * swc, c1, oh, ow, p_live, H, W,
                            sxh, sxw, swh, sww, KH, KW, SH, SW, PH, PW, DH, DW, BLOCK_P, BLOCK_C)
            acc2 = _dw_taps(x_n + cols2[None, :] * sxc, WEIGHT + cols2[None, :] * swc, c2, oh, ow, p_live, H, W,
                            sxh, sxw, swh, sww, KH, KW, SH, SW, PH, PW, DH, DW, BLOCK_P, BLOCK_C)
            if HAS_BIAS:
                acc1 += tl.load(BIAS + cols1, mask=c1, other=0.0).to(tl.float32)[None, :]
                acc2 += tl.load(BIAS + cols2, mask=c2, other=0.0).to(tl.float32)[None, :]
        rstd = tl.zeros((BLOCK_P,), dtype=tl.float32)
        if NORM:                                                            # LayerNorm over the C channels
            acc = tl.where(c_live[None, :], acc, 0.0)
            total = _dw_rowsum(acc, LIBRARY_REDUCE)
            if SPLIT == 3:
                acc1 = tl.where(c1[None, :], acc1, 0.0)
                acc2 = tl.where(c2[None, :], acc2, 0.0)
                total += _dw_rowsum(acc1, LIBRARY_REDUCE) + _dw_rowsum(acc2, LIBRARY_REDUCE)
            mean = total / C                                                # (BP,)
            acc = tl.where(c_live[None, :], acc - mean[:, None], 0.0)
            squares = _dw_rowsum(acc * acc, LIBRARY_REDUCE)
            if SPLIT == 3:
                acc1 = tl.where(c1[None, :], acc1 - mean[:, None], 0.0)
                acc2 = tl.where(c2[None, :], acc2 - mean[:, None], 0.0)
                squares += _dw_rowsum(acc1 * acc1, LIBRARY_REDUCE) + _dw_rowsum(acc2 * acc2, LIBRARY_REDUCE)
            rstd = 1.0 / tl.sqrt(squares / C + eps)
        _dw_finish(acc, cols, c_live, rstd, n, oh, ow, p_live, NORM_W, NORM_B, Z, Y, szn, szc, szh, szw,
                   syn, syc, syh, syw, HAS_Z, ACT, NORM, NORM_AFFINE, BF16_RTNE_BY_HAND)
        if SPLIT == 3:
            _dw_finish(acc1, cols1, c1, rstd, n, oh, ow, p_live, NORM_W, NORM_B, Z, Y, szn, szc, szh, szw,
                       syn, syc, syh, syw, HAS_Z, ACT, NORM, NORM_AFFINE, BF16_RTNE_BY_HAND)
            _dw_finish(acc2, cols2, c2, rstd, n, oh, ow, p_live, NORM_W, NORM_B, Z, Y, szn, szc, szh, szw,
                       syn, syc, syh, syw, HAS_Z, ACT, NORM, NORM_AFFINE, BF16_RTNE_BY_HAND)

    return _depthwise_kernel


# ====================================================================== bias_act_: the epilogue pass

def bias_act_launch_config(numel: int, element_size: int, device: torch.device) -> tuple[int, int]:
    """``(BLOCK, num_warps)`` for a flat pass over ``numel`` elements.

    Compiled: 32 bytes per thread per block (two 16-byte vectors: 2048 16-bit or 1024
    fp32 elements with 4 warps), halved down to 512 elements while the grid would be
    shorter than two programs per SM. Interpreted: 4096 elements (the interpreter's cost is
    per program, not per element).
    """
    if device.type != "cuda":
        return 4096, 4
    block = 2048 if element_size <= 2 else 1024
    target = 2 * sm_count(device)
    while block > 512 and -(-numel // block) < target:
        block //= 2
    return block, 4


class _Plan:
    """What one call signature of a kernel needs, worked out once (see ``_PLANS``)."""

    __slots__ = ("kernel", "grid", "ints", "constexprs", "num_warps", "z_layout", "num_stages", "tail", "out_shape")

    def __init__(self, kernel=None, grid=(), ints=(), constexprs=None, num_warps=4, z_layout=None,
                 num_stages=None, tail=(), out_shape=None) -> None:
        self.kernel, self.grid, self.ints, self.constexprs = kernel, grid, ints, constexprs
        self.num_warps = num_warps
        self.z_layout = z_layout            # layout z must be copied into first, or None (read as it is)
        self.num_stages = num_stages        # Triton's default where None
        self.tail = tail                    # integer arguments after the per-call ones (strides fixed by the key)
        self.out_shape = out_shape          # the output a call allocates


#: ``_Plan`` by call signature (dtypes, shapes, strides, devices, 16-byte alignment, options): a
#: model calls the same signatures on every forward. Bounded (``triton_support.remember``).
_PLANS: dict[tuple, _Plan] = {}


def _check_epilogue_operands(y: torch.Tensor, bias: torch.Tensor | None, z: torch.Tensor | None) -> None:
    if y.dim() < 2:
        raise ValueError(f"y must be (N, C, *spatial), got shape {tuple(y.shape)}")
    if bias is not None and (bias.dim() != 1 or bias.shape[0] != y.shape[1]):
        raise ValueError(f"bias must be ({y.shape[1]},), got {tuple(bias.shape)}")
    if z is not None and z.shape != y.shape:
        raise ValueError(f"residual z must have y's shape {tuple(y.shape)}, got {tuple(z.shape)}")
    for t in (bias, z):
        if t is not None and t.device != y.device:
            raise ValueError(f"all operands must be on {y.device}, got one on {t.device}")


def _plan_bias_act(y, bias, z, act, block, num_warps) -> _Plan:
    """Decide whether the epilogue kernel runs for these operands, and prepare its launch."""
    _check_epilogue_operands(y, bias, z)
    layout = layout_of(y)
    if (layout not in LAYOUTS or y.dtype not in TRITON_DTYPES or not triton_runs_on(y.device) or y.numel() == 0
            or any(t is not None and not t.dtype.is_floating_point for t in (bias, z))):
        return _Plan()
    z_layout = None
    z_channels_last = layout == "nhwc"
    if z is not None:
        zl = layout_of(z)
        if zl is None:
            z_layout = layout                                       # copied into y's layout on each call
        elif zl != layout and not _layouts_coincide(y):
            z_channels_last = zl == "nhwc"
    numel, c = y.numel(), y.shape[1]
    # C and HW are compile-time constants, as in inductor's static-shape kernels: the index
    # arithmetic (i % C, i // HW) then compiles to multiply-high sequences instead of the ~20
    # instructions of a division by a runtime value, which a 16-bit element cannot afford at
    # HBM rate. One compiled kernel per (C, HW) a model uses; HW only where an index needs it.
    needs_hw = layout == "nchw" or (z is not None and z_channels_last != (layout == "nhwc"))
    hw = numel // (y.shape[0] * c) if needs_hw else 1
    interpret = interpreting()
    auto_block, auto_warps = bias_act_launch_config(numel, y.element_size(), y.device)
    block = block or auto_block
    constexprs = dict(C=c, HW=hw, CHANNELS_LAST=layout == "nhwc", HAS_BIAS=bias is not None, HAS_Z=z is not None,
                      Z_CHANNELS_LAST=z_channels_last, ACT=act, BLOCK=block,
                      BF16_RTNE_BY_HAND=interpret and y.dtype == torch.bfloat16,
                      INT64=numel + block >= 2**31)
    return _Plan(_build_bias_act_kernel(interpret), (-(-numel // block),), (numel,), constexprs,
                 num_warps or auto_warps, z_layout)


def _bias_act_torch_(y, bias, z, act) -> torch.Tensor:
    """The same maths as in-place torch ops: ``y += b``, ``y += z``, ``act_(y)``, one kernel each."""
    if bias is not None:
        y.add_(_channel_view(bias, y.dim()))
    if z is not None:
        y.add_(z)
    return apply_activation_(y, act)


def bias_act_(y: torch.Tensor, bias: torch.Tensor | None, z: torch.Tensor | None = None, act: str = "relu",
              *, block: int | None = None, num_warps: int | None = None) -> torch.Tensor:
    """``y = act(y + bias[c] (+ z))`` IN PLACE on ``y``; returns ``y``.

    ``y``: ``(N, C, *spatial)``, fp32/fp16/bf16, NCHW- or channels_last-contiguous
    (``layout_of``). ``bias``: ``(C,)`` or None (any float dtype). ``z``: None or
    ``y``'s shape, any layout and float dtype (read as fp32; NCHW or channels_last
    directly, anything else copied into ``y``'s layout first); ``z`` is never written.
    ``act``: one of ``CONV_ACTIVATIONS``. One vectorised Triton pass where Triton runs
    on ``y``'s device (CUDA, or the CPU under ``TRITON_INTERPRET=1``); anything else (other
    dtypes or layouts, no Triton) runs the same maths as in-place torch ops.
    ``block``/``num_warps`` override the launch heuristic (for tuning).

    The launch is planned once per call signature (dtypes, shapes, strides, alignment)
    and reused: a model makes the same calls on every forward.
    """
    check(act, CONV_ACTIVATIONS)
    key = (operand_key(y), operand_key(bias), operand_key(z), act, block, num_warps, interpreting())
    plan = planned(_PLANS, key, _plan_bias_act, y, bias, z, act, block, num_warps)
    if plan.kernel is None:
        _check_epilogue_operands(y, bias, z)
        return _bias_act_torch_(y, bias, z, act)
    if plan.z_layout is not None:
        z = to_layout(z, plan.z_layout)
    if bias is not None and not bias.is_contiguous():
        bias = bias.contiguous()
    launch(plan.kernel, plan.grid, (y, y if bias is None else bias, y if z is None else z, *plan.ints),
           plan.constexprs, key=key, num_warps=plan.num_warps)
    return y


# ====================================================================== the depthwise kernel

def depthwise_tiles(channels: int, norm: bool) -> tuple[int, int, int]:
    """``(BLOCK_P, BLOCK_C, num_warps)`` of the depthwise kernel's (output pixels × channels) tile.

    Channels are the contiguous side of a channels_last tensor: BLOCK_C is the largest of
    64, 32, 16, 8 that divides C (whole rows of 16-byte vectors and no masked channel lanes,
    so that the per-channel weight and bias loads vectorise too: with a masked tail the
    compiler issues them one element at a time), else the next power of two up to 128.
    With a LayerNorm epilogue one program holds every channel: BLOCK_C ≥ C, or three chunks
    of C/3 channels where C is three times a power of two (``depthwise_split``: ConvNeXt's
    96…768, which a power-of-two tile would pad by a third). The chunked tiles come from a
    sweep on the H200 at ConvNeXt-Tiny's four stages, each within 5% of the fastest tile
    there (``benchmarks/results/bench_convnext_kernels_split_h200.json``): 2 warps and 16
    channel-pixels per thread for chunks of up to 64 channels, 8 warps and 8 for 128, 4 and
    16 beyond. Against the power-of-two tile the chunks measured within the runs' noise
    (``docs/kernel-notes.md``). Otherwise BLOCK_P fills a tile of about 2048 fp32
    accumulators (4096 with 8 warps for a LayerNorm over wide rows).
    """
    if norm:
        split = depthwise_split(channels, norm)
        block_c = channels // 3 if split == 3 else next_power_of_2(channels)
        if split == 3:
            warps = 2 if block_c <= 64 else 8 if block_c <= 128 else 4
            per_thread = 8 if warps == 8 else 16            # channel-pixels per thread and chunk
            return max(1, per_thread * 32 * warps // block_c), block_c, warps
        budget, warps = (4096, 8) if block_c >= 512 else (2048, 4)
        return _floor_power_of_2(budget // block_c), block_c, warps
    block_c = next((b for b in (64, 32, 16, 8) if channels % b == 0), min(128, next_power_of_2(channels)))
    return max(1, 2048 // block_c), block_c, 4


def _floor_power_of_2(n: int) -> int:
    """The largest power of two <= ``n`` (1 for n <= 1): a tile dimension (Triton's ranges are powers of two)."""
    return 1 << max(int(n).bit_length() - 1, 0)


def depthwise_split(channels: int, norm: bool) -> int:
    """How many chunks of channels one program of the depthwise kernel holds: 3 with a LayerNorm epilogue
    over C = 3·2^k channels (k ≥ 3), else 1."""
    third = channels // 3
    return 3 if norm and channels % 3 == 0 and third >= 8 and third & (third - 1) == 0 else 1


def _geometry_key(value):
    """An int, or a per-dim list as a tuple: a hashable stand-in for a conv's stride, padding or dilation."""
    return value if isinstance(value, int) else tuple(value)


def _depthwise_key(x, weight, bias, z, stride, padding, dilation, act, norm, tiles) -> tuple:
    """What a depthwise call's plan depends on (dtypes, shapes, strides, devices, geometry, epilogue)."""
    return (x.shape, x.stride(), x.dtype, x.device, weight.shape, weight.stride(), weight.dtype, weight.device,
            None if bias is None else (bias.dtype, bias.device),
            None if z is None else (z.shape, z.stride(), z.dtype, z.device),
            _geometry_key(stride), _geometry_key(padding), _geometry_key(dilation), act,
            None if norm is None else (None if norm[0] is None else norm[0].dtype,
                                       None if norm[1] is None else norm[1].dtype, float(norm[2])),
            tiles, interpreting())


def _plan_depthwise(x, weight, bias, z, stride, padding, dilation, act, norm, tiles) -> _Plan:
    """Check the operands (``ValueError`` for what the kernel does not compute) and plan the launch; the
    plan's ``kernel`` is None for an empty output (nothing to launch)."""
    check(act, CONV_ACTIVATIONS)
    if x.dim() != 4 or not is_depthwise(x.shape[1], weight.shape, weight.shape[0]):
        raise ValueError(f"not a depthwise 2-D convolution: x {tuple(x.shape)}, weight {tuple(weight.shape)}")
    stride, padding, dilation = _as_list(stride, 2), _as_list(padding, 2), _as_list(dilation, 2)
    shape = conv_out_shape(x.shape, weight.shape, stride, padding, dilation)
    if z is not None and tuple(z.shape) != shape:
        raise ValueError(f"residual z must have the output's shape {shape}, got {tuple(z.shape)}")
    n, c, h, w = x.shape
    kh, kw = weight.shape[2:]
    (sh, sw), (ph, pw), (dh, dw) = stride, padding, dilation
    h_out, w_out = shape[2], shape[3]
    if h_out <= 0 or w_out <= 0 or x.numel() == 0:
        return _Plan(out_shape=shape)
    if n > 65535:
        raise ValueError(f"batch {n} exceeds the depthwise kernel's grid (65535)")
    interpret = interpreting()
    block_p, block_c, warps = tiles or depthwise_tiles(c, norm is not None)
    split = depthwise_split(c, norm is not None) if block_c * 3 == c else 1
    if x.device.type != "cuda" and tiles is None:       # the interpreter's cost is per program: few, large ones
        if norm is None:
            block_c = min(next_power_of_2(c), 256)
        block_p = min(next_power_of_2(h_out * w_out), _floor_power_of_2(65536 // (block_c * split)))
    if norm is not None and block_c * split < c:
        raise ValueError(f"a LayerNorm epilogue needs every channel in one tile: BLOCK_C {block_c} < C {c}")
    constexprs = dict(KH=kh, KW=kw, SH=sh, SW=sw, PH=ph, PW=pw, DH=dh, DW=dw, HAS_BIAS=bias is not None,
                      HAS_Z=z is not None, ACT=act, NORM=norm is not None,
                      NORM_AFFINE=norm is not None and norm[0] is not None, BLOCK_P=block_p, BLOCK_C=block_c,
                      SPLIT=split, BF16_RTNE_BY_HAND=interpret and x.dtype == torch.bfloat16,
                      LIBRARY_REDUCE=library_reductions_usable())
    grid = (-(-(h_out * w_out) // block_p), n, -(-c // (block_c * split)))
    sw_ = weight.stride()
    eps = float(norm[2]) if norm is not None else 0.0
    return _Plan(_build_depthwise_kernel(interpret), grid, (h, w, h_out, w_out, c, eps, *x.stride()), constexprs,
                 warps, tail=(*(z.stride() if z is not None else (0, 0, 0, 0)), sw_[0], sw_[2], sw_[3]),
                 out_shape=shape)


def _run_depthwise(plan: _Plan, key: tuple, x, weight, bias, z, norm) -> torch.Tensor:
    """Allocate the output and launch a planned depthwise call."""
    out = _new_output(plan.out_shape, x.dtype, x.device)                     # (N, C, H', W') channels_last
    if plan.kernel is None:                                                  # empty: nothing to compute
        return out
    norm_w, norm_b = (norm[0], norm[1]) if norm is not None else (None, None)
    pointers = (x, weight, x if bias is None else bias, x if z is None else z, out,
                x if norm_w is None else norm_w, x if norm_b is None else norm_b)
    out_strides = out.stride()
    launch(plan.kernel, plan.grid, (*pointers, *plan.ints, *out_strides, *plan.tail), plan.constexprs,
           key=(key, out_strides, tuple(t.data_ptr() & 15 == 0 for t in pointers)), num_warps=plan.num_warps)
    return out


def depthwise_applies(x: torch.Tensor, weight: torch.Tensor, groups, z: torch.Tensor | None = None) -> bool:
    """Whether the depthwise kernel takes these operands: a 2-D depthwise conv (``is_depthwise``) of a
    channels_last fp32/fp16/bf16 ``x`` (a batch of at most 65535: a grid dimension) on a device Triton runs
    on, weight and residual alike."""
    return (x.dim() == 4 and is_depthwise(x.shape[1], weight.shape, groups) and x.dtype in TRITON_DTYPES
            and x.shape[0] <= 65535
            and layout_of(x) == "nhwc" and triton_runs_on(x.device) and weight.device == x.device
            and (z is None or (z.device == x.device and z.dtype.is_floating_point)))


def depthwise_conv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, z: torch.Tensor | None,
                   stride=1, padding=0, dilation=1, act: str = "none",
                   norm: tuple[torch.Tensor | None, torch.Tensor | None, float] | None = None,
                   *, tiles: tuple[int, int, int] | None = None) -> torch.Tensor:
    """One Triton kernel: a depthwise 2-D convolution and its epilogue; returns a new channels_last tensor.

    ``x``: ``(N, C, H, W)`` (channels_last for speed; any strides work); ``weight``:
    ``(C, 1, kh, kw)``; ``bias``: ``(C,)`` or None; ``z``: None or the output's shape
    (added after the bias, or after the LayerNorm); ``act`` applied last. ``norm`` =
    ``(γ or None, β or None, eps)``: a LayerNorm over the C channels of each output pixel
    after the bias (ConvNeXt). Integer or per-dim ``stride``, ``padding``, ``dilation``.
    The output ``(N, C, H', W')`` is channels_last, so ``out.permute(0, 2, 3, 1)`` is a
    contiguous ``(N, H', W', C)``. Raises ``ValueError`` for operands the kernel does not
    take (callers check ``depthwise_applies``). ``tiles`` overrides the tile (tests).
    A call signature is checked and planned once.
    """
    key = ("dw", *_depthwise_key(x, weight, bias, z, stride, padding, dilation, act, norm, tiles))
    plan = planned(_PLANS, key, _plan_depthwise, x, weight, bias, z, stride, padding, dilation, act, norm, tiles)
    return _run_depthwise(plan, key, x, weight, bias, z, norm)


def _new_output(shape, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A new channels_last ``(N, C, H, W)`` output the kernel fully overwrites (tests replace this to poison it)."""
    return torch.empty(shape, dtype=dtype, device=device, memory_format=torch.channels_last)


def pack_depthwise_weight(weight: torch.Tensor) -> torch.Tensor:
    """The weight ``(C, 1, kh, kw)`` with its values stored tap by tap, channels innermost (strides
    ``(1, C, kw·C, C)``): each tap's weights are then one contiguous vector the depthwise kernel loads
    in 16-byte pieces, where the conv's own layout makes them a gather with stride kh·kw."""
    return weight.permute(2, 3, 1, 0).contiguous().permute(3, 2, 0, 1)    # (C, 1, kh, kw), memory (kh, kw, 1, C)


def depthwise_conv_epilogue(x: torch.Tensor, weight: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None,
                            z: torch.Tensor | None, stride, padding, dilation, act: str) -> torch.Tensor:
    """The lean graphs' call for ``triton_depthwise``: the depthwise kernel (reading ``packed``, the
    weight from ``pack_depthwise_weight``) where it takes the operands (a channels_last input: the
    layout is known only at run time), else conv (``weight``) + ``bias_act_``. The decision and the
    launch are planned once per call signature."""
    key = ("dw-epilogue", *_depthwise_key(x, packed, bias, z, stride, padding, dilation, act, None, None))
    plan = _PLANS.get(key)
    if plan is None:
        plan = remember(_PLANS, key, _plan_depthwise(x, packed, bias, z, stride, padding, dilation, act, None, None)
                        if depthwise_applies(x, weight, weight.shape[0], z) else _Plan(out_shape="fallback"))
    if plan.out_shape != "fallback":
        return _run_depthwise(plan, key, x, packed, bias, z, None)
    y = torch.conv2d(x, weight, None, stride, padding, dilation, weight.shape[0])   # (N, C, H', W')
    return bias_act_(y, bias, z, act)


# ====================================================================== the GEMM with an epilogue

@functools.lru_cache(maxsize=2)
def _build_gemm_kernel(interpret: bool):
    """Define the GEMM with its epilogue (imports Triton); cached per interpreter mode."""
    global tl, _activation, _round_for
    _activation, _round_for = triton_activation(interpret), triton_round_bf16(interpret)
    triton, tl = import_triton()

    @triton.jit
    def _gemm_epilogue_kernel(
        A, W, BIAS, Z, C,                          # a (M, K), w (N, K), bias (N,), z and c (M, N); unused alias A
        M, N, K, sam, sak, swn, swk, szm, szn, scm, scn,
        HAS_BIAS: tl.constexpr, HAS_Z: tl.constexpr, ACT: tl.constexpr, BLOCK_M: tl.constexpr,
        BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr, DOT_PRECISION: tl.constexpr,
        BF16_RTNE_BY_HAND: tl.constexpr,
    ):
        pid = tl.program_id(0)
        tiles_m, tiles_n = tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N)
        per_group = GROUP_M * tiles_n                  # GROUP_M row tiles share their B tiles in L2
        first_m = (pid // per_group) * GROUP_M
        rows_here = tl.minimum(tiles_m - first_m, GROUP_M)
        pid_m = first_m + (pid % per_group) % rows_here
        pid_n = (pid % per_group) // rows_here
        rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)                       # (BM,) output rows
        rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)                       # (BN,) output columns
        rk = tl.arange(0, BLOCK_K)
        m_live, n_live = rm < M, rn < N
        a_ptr = A + rm[:, None].to(tl.int64) * sam + rk[None, :] * sak    # (BM, BK)
        w_ptr = W + rn[None, :] * swn + rk[:, None] * swk                 # (BK, BN): wᵀ
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            k_live = k0 + rk < K
            a = tl.load(a_ptr, mask=m_live[:, None] & k_live[None, :], other=0.0)
            w = tl.load(w_ptr, mask=k_live[:, None] & n_live[None, :], other=0.0, eviction_policy="evict_last")
            if BF16_RTNE_BY_HAND:  # bf16 in the interpreter only: its tl.dot misreads bf16 (stored as uint16);
                a = a.to(tl.float32)  # bf16 x bf16 products are exact in fp32: the tensor-core arithmetic
                w = w.to(tl.float32)
            acc = tl.dot(a, w, acc, input_precision=DOT_PRECISION)        # fp32 accumulation
            a_ptr += BLOCK_K * sak
            w_ptr += BLOCK_K * swk
        if HAS_BIAS:
            acc += tl.load(BIAS + rn, mask=n_live, other=0.0).to(tl.float32)[None, :]
        live = m_live[:, None] & n_live[None, :]
        rows = rm[:, None].to(tl.int64)
        if HAS_Z:
            acc += tl.load(Z + rows * szm + rn[None, :] * szn, mask=live, other=0.0).to(tl.float32)
        acc = _round_for(_activation(acc, ACT), BF16_RTNE_BY_HAND)
        tl.store(C + rows * scm + rn[None, :] * scn, acc.to(C.dtype.element_ty, fp_downcast_rounding="rtne"),
                 mask=live)

    return _gemm_epilogue_kernel


def gemm_config(m: int, n: int, k: int, element_size: int, device: torch.device) -> tuple[int, int, int, int, int]:
    """``(BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages)`` for an (M×K)·(K×N) GEMM.

    BLOCK_N covers N up to 128 (a 1×1 conv's output channels: every A row is then read once), BLOCK_K
    the next power of two of K up to 64 (32 for fp32, for shared memory), BLOCK_M 128 (64 for short M);
    8 warps for 128×128 tiles, 3 pipeline stages. Under the interpreter, whose cost is per program and
    per operation, the tiles are as large as the matrices allow (up to 512 × 1024 × 256).
    """
    if device.type != "cuda":
        return (min(512, max(16, next_power_of_2(m))), min(1024, max(16, next_power_of_2(n))),
                min(256, max(16, next_power_of_2(k))), 4, 1)
    block_n = min(128, max(16, next_power_of_2(n)))
    block_k = min(64 if element_size <= 2 else 32, max(16, next_power_of_2(k)))
    block_m = 128 if m >= 4096 else 64
    warps = 8 if block_m * block_n >= 128 * 128 else 4
    return block_m, block_n, block_k, warps, 3


def _gemm_constexprs(dtype, bias, z, act, block_m, block_n, block_k, interpret) -> dict:
    """The GEMM kernel's compile-time arguments; fp32 (and bf16 under the interpreter) without TF32."""
    return dict(HAS_BIAS=bias is not None, HAS_Z=z is not None, ACT=act, BLOCK_M=block_m, BLOCK_N=block_n,
                BLOCK_K=block_k, GROUP_M=8,
                DOT_PRECISION="ieee" if dtype == torch.float32 or (interpret and dtype == torch.bfloat16) else "tf32",
                BF16_RTNE_BY_HAND=interpret and dtype == torch.bfloat16)


def gemm_applies(a: torch.Tensor, weight: torch.Tensor, z: torch.Tensor | None = None) -> bool:
    """Whether the GEMM kernel takes ``a`` (M, K) and ``weight`` (N, K): one dtype of fp32/fp16/bf16, one
    device Triton runs on, K at least 1; ``z`` (M, N) of a float dtype on that device."""
    return (a.dim() == 2 and weight.dim() == 2 and a.shape[1] == weight.shape[1] and a.dtype == weight.dtype
            and a.dtype in TRITON_DTYPES and a.device == weight.device and triton_runs_on(a.device)
            and a.shape[1] > 0 and (z is None or (z.device == a.device and z.dtype.is_floating_point
                                                  and tuple(z.shape) == (a.shape[0], weight.shape[0]))))


def cached_plan(key: tuple) -> _Plan | None:
    """The plan kept for a call signature ``key`` (of this module's kernels or a caller's), or None."""
    return _PLANS.get(key)


def fallback_plan(key: tuple, label: str = "fallback") -> _Plan:
    """Remember what calls of signature ``key`` do when no kernel launch is planned for them: ``label``
    (``"fallback"``: their reference path)."""
    return remember(_PLANS, key, _Plan(out_shape=label))


def gemm_plan(key: tuple, a: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, z: torch.Tensor | None,
              act: str, m: int, k: int, a_strides: tuple[int, int], z_strides: tuple[int, int] | None,
              out_strides: tuple[int, int], tiles: tuple[int, ...] | None = None) -> _Plan:
    """The launch of ``gemm_epilogue``'s kernel for a call signature ``key`` (planned once, then reused).

    ``a`` is read as an ``(m, k)`` matrix through ``a_strides`` (row, column), ``z`` (when given) and the
    output as ``(m, N)`` through theirs: a channels_last ``(N, C, H, W)`` tensor is the ``(N·H·W, C)``
    matrix with strides ``(C, 1)``, no view needed. ``weight``: ``(N, k)`` through its own strides.
    """
    plan = _PLANS.get(key)
    if plan is not None:
        return plan
    check(act, CONV_ACTIVATIONS)
    n = weight.shape[0]
    block_m, block_n, block_k, warps, stages = gemm_config(m, n, k, a.element_size(), a.device)
    if tiles is not None:                       # (BLOCK_M, BLOCK_N, BLOCK_K[, num_warps, num_stages])
        block_m, block_n, block_k = tiles[:3]
        if len(tiles) == 5:
            warps, stages = tiles[3:]
    interpret = interpreting()
    grid = (-(-m // block_m) * -(-n // block_n),)
    plan = _Plan(_build_gemm_kernel(interpret), grid,
                 (m, n, k, *a_strides, weight.stride(0), weight.stride(1),
                  *(z_strides if z is not None else (0, 0)), *out_strides),
                 _gemm_constexprs(a.dtype, bias, z, act, block_m, block_n, block_k, interpret),
                 warps, num_stages=stages)
    return remember(_PLANS, key, plan)


def gemm_launch(plan: _Plan, key: tuple, a: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                z: torch.Tensor | None, out: torch.Tensor) -> torch.Tensor:
    """Launch a ``gemm_plan`` on these tensors (the ones its signature describes); returns ``out``."""
    if plan.grid[0] == 0:
        return out
    pointers = (a, weight, a if bias is None else bias, a if z is None else z, out)
    launch(plan.kernel, plan.grid, (*pointers, *plan.ints), plan.constexprs,
           key=(key, tuple(t.data_ptr() & 15 == 0 for t in pointers)), num_warps=plan.num_warps,
           num_stages=plan.num_stages)
    return out


def gemm_epilogue(a: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, z: torch.Tensor | None = None,
                  act: str = "none", out: torch.Tensor | None = None, *,
                  tiles: tuple[int, ...] | None = None) -> torch.Tensor:
    """``act(a @ weightᵀ + bias (+ z))`` as ONE Triton kernel: the GEMM and its whole epilogue.

    ``a``: ``(M, K)`` (any strides); ``weight``: ``(N, K)`` (a linear's weight, or a 1×1 conv's as
    ``(C_out, C_in)``); ``bias``: ``(N,)`` or None; ``z``: ``(M, N)`` or None, any strides and float
    dtype. fp32 accumulation (fp32 inputs without TF32), one rounding of the result. Writes ``out``
    (``(M, N)``, any strides; default a new contiguous tensor) and returns it. Callers check
    ``gemm_applies``. ``tiles`` = (BLOCK_M, BLOCK_N, BLOCK_K[, num_warps, num_stages]) overrides
    ``gemm_config`` (tests, benchmarks).
    """
    m, k = a.shape
    n = weight.shape[0]
    if out is None:
        out = torch.empty((m, n), dtype=a.dtype, device=a.device)
    if m == 0 or n == 0:
        return out
    key = ("gemm", a.dtype, m, n, k, a.stride(), weight.stride(), None if bias is None else (bias.dtype, bias.stride()),
           None if z is None else (z.dtype, z.stride()), out.stride(), act, a.device, tiles, interpreting())
    plan = gemm_plan(key, a, weight, bias, z, act, m, k, a.stride(), None if z is None else z.stride(), out.stride(),
                     tiles)
    return gemm_launch(plan, key, a, weight, bias, z, out)


def is_pointwise_conv(weight_shape: Sequence[int], stride, padding, dilation, groups) -> bool:
    """A 2-D 1×1 convolution with stride 1, no padding, no dilation, one group: a GEMM over the pixels."""
    lists = edit.int_lists(2, stride, padding, dilation)
    return (len(weight_shape) == 4 and tuple(weight_shape[2:]) == (1, 1) and groups == 1 and lists is not None
            and lists == ([1, 1], [0, 0], [1, 1]))


def conv1x1_applies(x: torch.Tensor, weight: torch.Tensor, z: torch.Tensor | None = None) -> bool:
    """Whether a 1×1 conv (``is_pointwise_conv``) of ``x`` runs as one GEMM: ``x`` channels_last (its pixels
    are then the rows of a (N·H·W, C_in) matrix with row stride C_in) and ``z`` channels_last or absent."""
    return (x.dim() == 4 and layout_of(x) == "nhwc" and (z is None or (layout_of(z) == "nhwc"
                                                                     and z.dtype.is_floating_point
                                                                     and z.device == x.device))
            and x.dtype == weight.dtype and x.dtype in TRITON_DTYPES and triton_runs_on(x.device)
            and weight.device == x.device)


def conv1x1_epilogue(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, z: torch.Tensor | None,
                     act: str) -> torch.Tensor:
    """``act(conv1x1(x) + bias (+ z))`` for a 1×1 conv (stride 1, no padding, one group): ONE Triton GEMM with
    its epilogue where ``conv1x1_applies`` (a channels_last input), else the conv without bias + ``bias_act_``.

    ``x``: ``(N, C_in, H, W)``; ``weight``: ``(C_out, C_in, 1, 1)``; returns ``(N, C_out, H, W)`` in
    channels_last memory (the GEMM's output rows are the pixels). The decision and the launch are planned
    once per call signature; the kernel reads the 4-D tensors through their strides (no views per call):
    x's element (n, c, h, w) sits at ((n·H + h)·W + w)·C + c, row m = (n, h, w) of stride C.
    """
    key = ("1x1", x.shape, x.stride(), x.dtype, x.device, weight.shape, weight.stride(), weight.dtype, weight.device,
           None if bias is None else (bias.dtype, bias.device),
           None if z is None else (z.shape, z.stride(), z.dtype, z.device), act, interpreting())
    n, c, h, w = x.shape
    c_out = weight.shape[0]
    plan = _PLANS.get(key)
    if plan is None:
        if conv1x1_applies(x, weight, z) and weight.shape[1] == c and x.numel() > 0:
            plan = gemm_plan(key, x, weight, bias, z, act, n * h * w, c, (c, 1), (c_out, 1), (c_out, 1))
        else:
            check(act, CONV_ACTIVATIONS)
            plan = remember(_PLANS, key, _Plan(out_shape="fallback"))
    if plan.out_shape == "fallback":
        y = torch.conv2d(x, weight, None, 1, 0, 1, 1)                       # (N, C_out, H, W)
        return bias_act_(y, bias, z, act)
    out = torch.empty((n, c_out, h, w), dtype=x.dtype, device=x.device, memory_format=torch.channels_last)
    return gemm_launch(plan, key, x, weight, bias, z, out)                   # (N, C_out, H, W) channels_last


# ====================================================================== kernel selection

def _steps_label(act: str, residual: bool) -> str:
    return "bias" + (" + add" if residual else "") + ("" if act == "none" else f" + {act}")


def select_conv_epilogue(device: torch.device | str, dtype: torch.dtype, act: str, *, weight_dim: int = 4,
                         int_padding: bool = True, residual: bool = False, residual_fits: bool = True,
                         separate: bool = False, kernel_size: Sequence[int] | None = None,
                         depthwise: bool = False, pointwise: bool = False, out_pixels: int | None = None,
                         layout: str | None = None) -> Choice:
    """The one decision of how ``act(conv(x, w) + b [+ z])`` runs on ``device`` in ``dtype``.

    ``residual_fits``: z has the conv output's shape and x's dtype (cuDNN does not
    broadcast z). ``separate``: the plan's kernel choice "separate_epilogue" (the
    convolution with its bias, then the epilogue as separate torch ops). ``kernel_size``,
    ``depthwise`` (``is_depthwise``), ``pointwise`` (``is_pointwise_conv``), ``out_pixels``
    (N·H'·W' of the output) and ``layout`` (the input's, ``layout_of``; None where it is not
    known, as in a captured graph) are read where they decide (module docstring; None:
    unknown). ``Choice.impl`` is one of ``cudnn_conv_add_relu``, ``cudnn_conv_relu``,
    ``triton_gemm``, ``triton_depthwise``, ``triton_epilogue``, ``separate``; ``fused`` is
    whether the epilogue costs no kernel of its own per op.
    """
    check(act, CONV_ACTIVATIONS)
    device = torch.device(device)
    steps = _steps_label(act, residual)
    if separate:
        ops = ["conv+bias"] + (["add_ in place"] if residual else []) + ([f"{act} in place"] if act != "none" else [])
        return Choice("separate", f"{' + '.join(ops)} ({len(ops)} kernel{'s' if len(ops) > 1 else ''})", False)
    large_1x1 = (kernel_size is not None and all(k == 1 for k in kernel_size) and out_pixels is not None
                 and out_pixels > CUDNN_RELU_1X1_MAX_PIXELS)
    cudnn = (POLICY.cudnn_relu and act == "relu" and device.type == "cuda" and dtype in _CUDNN_DTYPES
             and weight_dim == 4 and int_padding and (not residual or residual_fits)
             and torch.backends.cudnn.is_available()
             and torch._C._get_cudnn_enabled())          # torch.backends.cudnn.enabled, without its wrapper
    if cudnn and residual:
        return Choice("cudnn_conv_add_relu", "cudnn conv+bias+add+relu (1 fused call: cudnn_convolution_add_relu)",
                      True)
    if cudnn and not large_1x1:
        return Choice("cudnn_conv_relu", "cudnn conv+bias+relu (1 fused call: cudnn_convolution_relu)", True)
    triton = triton_runs_on(device) and dtype in TRITON_DTYPES
    where = " [Triton interpreter on cpu]" if device.type == "cpu" else ""
    tail = "" if layout == "nhwc" else " for a channels_last input; any other: conv + triton epilogue"
    if triton and POLICY.gemm_triton and pointwise and weight_dim == 4 and layout in (None, "nhwc"):
        return Choice("triton_gemm", f"triton 1x1 conv as a GEMM + {steps} (1 kernel{tail}){where}", True)
    if (triton and POLICY.depthwise_triton and depthwise and weight_dim == 4 and int_padding
            and layout in (None, "nhwc")):
        return Choice("triton_depthwise", f"triton depthwise conv+{steps} (1 kernel{tail}){where}", True)
    if triton and POLICY.triton_epilogue:
        return Choice("triton_epilogue", f"conv (no bias) + triton {steps} (2 kernels: one vectorised pass "
                      f"after the conv){where}", True)
    return select_conv_epilogue(device, dtype, act, residual=residual, separate=True)


def _fits(x: torch.Tensor, weight: torch.Tensor, z: torch.Tensor | None, stride, padding, dilation) -> bool:
    """Whether the residual ``z`` has the conv output's shape and ``x``'s dtype (no broadcast)."""
    return z is None or (z.dtype == x.dtype and not isinstance(padding, str)
                         and tuple(z.shape) == conv_out_shape(x.shape, weight.shape, stride, padding, dilation))


def conv_epilogue(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, z: torch.Tensor | None,
                  stride=1, padding=0, dilation=1, groups: int = 1, act: str = "relu",
                  separate: bool = False) -> torch.Tensor:
    """``act(conv(x, weight) + bias [+ z])`` as ``select_conv_epilogue`` decides.

    Shapes: ``x`` ``(N, C_in, *spatial)``; ``weight`` ``(C_out, C_in/groups, *kernel)``;
    ``bias`` ``(C_out,)`` or None; ``z`` the conv output's shape, or None.
    """
    fits = _fits(x, weight, z, stride, padding, dilation)
    int_padding = not isinstance(padding, str)
    kernel = tuple(weight.shape[2:])
    out_pixels = None
    if act == "relu" and x.is_cuda and int_padding and all(k == 1 for k in kernel):
        out_pixels = math.prod(conv_out_shape(x.shape, weight.shape, stride, padding, dilation)[2:]) * x.shape[0]
    choice = select_conv_epilogue(x.device, x.dtype, act, weight_dim=weight.dim(), int_padding=int_padding,
                                  residual=z is not None, residual_fits=fits, separate=separate,
                                  kernel_size=kernel, depthwise=x.dim() == 4 and is_depthwise(x.shape[1], weight.shape,
                                                                                             groups),
                                  pointwise=is_pointwise_conv(weight.shape, stride, padding, dilation, groups),
                                  out_pixels=out_pixels, layout=layout_of(x))
    n = weight.dim() - 2
    if choice.impl == "cudnn_conv_relu":
        return torch.cudnn_convolution_relu(x, weight, bias, _as_list(stride, n), _as_list(padding, n),
                                            _as_list(dilation, n), groups)
    if choice.impl == "cudnn_conv_add_relu":
        return torch.cudnn_convolution_add_relu(x, weight, z, 1.0, bias, _as_list(stride, n),
                                                _as_list(padding, n), _as_list(dilation, n), groups)
    if choice.impl == "triton_depthwise" and fits and depthwise_applies(x, weight, groups, z):
        return depthwise_conv(x, weight, bias, z, stride, padding, dilation, act)
    if choice.impl == "triton_gemm" and fits and conv1x1_applies(x, weight, z):
        return conv1x1_epilogue(x, weight, bias, z, act)
    if choice.impl in ("triton_gemm", "triton_depthwise", "triton_epilogue"):
        y = conv_nd(x, weight, None, stride, padding, dilation, groups)     # (N, C_out, *out_spatial)
        if z is None or z.shape == y.shape:
            return bias_act_(y, bias, z, act)
        return _bias_act_torch_(y, bias, z, act)                            # z broadcasts: the torch ops
    y = conv_nd(x, weight, bias, stride, padding, dilation, groups)         # (N, C_out, *out_spatial)
    if z is not None:
        y.add_(z)
    return apply_activation_(y, act)


# ====================================================================== fused call targets
# Module-level functions: gm.code names them, pickle finds them by name.

def fused_conv_bn(x, weight, bias, stride, padding, dilation, groups):
    """conv with BatchNorm folded into ``weight``/``bias``: the conv, its bias where the selection puts it."""
    return conv_epilogue(x, weight, bias, None, stride, padding, dilation, groups, "none")


def fused_conv_act(x, weight, bias, stride, padding, dilation, groups, act):
    """``act(conv(x, weight) + bias)``: conv epilogue (cuDNN fused for relu on CUDA)."""
    return conv_epilogue(x, weight, bias, None, stride, padding, dilation, groups, act)


def fused_conv_bn_act(x, weight, bias, stride, padding, dilation, groups, act):
    """``act(conv(x, w') + b')`` with BatchNorm folded into ``w'``/``b'``."""
    return conv_epilogue(x, weight, bias, None, stride, padding, dilation, groups, act)


def fused_conv_add_act(x, weight, bias, z, stride, padding, dilation, groups, act):
    """``act(conv(x, weight) + bias + z)``: residual add and activation ("none": no activation) in the epilogue."""
    return conv_epilogue(x, weight, bias, z, stride, padding, dilation, groups, act)


def fused_conv_bn_add_act(x, weight, bias, z, stride, padding, dilation, groups, act):
    """``act(conv(x, w') + b' + z)`` with BatchNorm folded into ``w'``/``b'`` ("none": no activation)."""
    return conv_epilogue(x, weight, bias, z, stride, padding, dilation, groups, act)


def fused_conv_separate_epilogue(x, weight, bias, z, stride, padding, dilation, groups, act):
    """Kernel choice "separate_epilogue": conv with its bias, then ``+ z`` (when given) and ``act`` in place."""
    return conv_epilogue(x, weight, bias, z, stride, padding, dilation, groups, act, separate=True)


# ====================================================================== rewrite

def _bn_output(bn: torch.fx.Node, chain_nodes: set[str]) -> tuple[torch.fx.Node, list[torch.fx.Node]]:
    """The node that carries the normalised tensor (bn itself, or its ``getitem 0``), and extra nodes to remove."""
    val = bn.meta.get("val")
    if not isinstance(val, (tuple, list)):
        return bn, []
    users = list(bn.users)
    firsts = [u for u in users if u.target is operator.getitem and u.args[1] == 0]
    others = [u for u in users if u not in firsts and not aten.is_ignored(u)]
    if len(firsts) != 1 or any(u.users for u in others):
        raise Refuse("BatchNorm statistics outputs are used: not folded")
    return firsts[0], [u for u in users if u is not firsts[0]] if firsts[0].name in chain_nodes else users


def _conv(conv: torch.fx.Node) -> aten.ConvArgs:
    args = aten.conv_args(conv)
    if args is None:
        raise UseGeneric(f"conv op {aten.aten_name(conv)} is not one the epilogue takes")
    if args.transposed:
        raise UseGeneric("transposed convolution")
    if any(args.output_padding or [0]):
        raise UseGeneric("convolution with output padding")
    return args


def _folded(ctx: RewriteContext, conv: torch.fx.Node, bn: torch.fx.Node) -> tuple[torch.Tensor, torch.Tensor]:
    """Fold ``bn`` into ``conv``: returns the new (weight, bias)."""
    c = _conv(conv)
    b = aten.batch_norm_args(bn)
    if b is None:
        raise Refuse(f"BatchNorm variant {aten.aten_name(bn)} is not folded")
    if b.training:
        raise Refuse(TRAINING_REFUSAL)
    if b.running_mean is None or b.running_var is None:
        raise Refuse(NO_RUNNING_STATS_REFUSAL)
    if not edit.through_identity(b.input, conv):
        raise Refuse("BatchNorm does not read the conv output directly")
    tensors = [ctx.constant(t, what) for t, what in (
        (c.weight, "conv weight"), (c.bias, "conv bias"), (b.running_mean, "running mean"),
        (b.running_var, "running var"), (b.weight, "BatchNorm weight"), (b.bias, "BatchNorm bias"))]
    return fold_conv_bn(*tensors, b.eps)


def _choice(ctx: RewriteContext, conv: torch.fx.Node, act: str, z, separate: bool) -> Choice:
    """``select_conv_epilogue`` for a chain's conv, from the shapes the graph records."""
    c = _conv(conv)
    weight_val = aten.node_val(c.weight)
    w_shape = tuple(weight_val.shape) if isinstance(weight_val, torch.Tensor) else None
    x_shape = aten.static_shape(c.input)
    int_padding = not isinstance(c.padding, str)
    out_shape = (conv_out_shape(x_shape, w_shape, c.stride, c.padding, c.dilation)
                 if x_shape is not None and w_shape is not None and int_padding else None)
    z_shape = aten.static_shape(z)
    fits = z is None or (out_shape is not None and z_shape == out_shape)
    return select_conv_epilogue(ctx.device, edit.dtype_of(conv), act, weight_dim=len(w_shape) if w_shape else 4,
                                int_padding=int_padding, residual=z is not None, residual_fits=fits,
                                separate=separate, kernel_size=w_shape[2:] if w_shape else None,
                                depthwise=(x_shape is not None and w_shape is not None
                                           and is_depthwise(x_shape[1], w_shape, c.groups)),
                                pointwise=w_shape is not None and is_pointwise_conv(w_shape, c.stride, c.padding,
                                                                                    c.dilation, c.groups),
                                out_pixels=math.prod(out_shape[2:]) * out_shape[0] if out_shape else None)


def fold(ctx: RewriteContext, chain) -> edit.Edit:
    """conv → (views) → BN becomes one conv with folded weights; the rest of the chain stays."""
    conv, bn = ctx.node(chain, "conv"), ctx.node(chain, "bn")
    names = list(chain.nodes)
    covered = [ctx.by_name[n] for n in names[: names.index(bn.name) + 1]]
    out, extra_remove = _bn_output(bn, set(names))
    w, b = _folded(ctx, conv, bn)
    if out is not bn and out.name in names:
        covered += [out]
    remove = covered + extra_remove
    edit.check_no_outside_users(remove, [out])
    c = _conv(conv)
    key = conv.name
    choice = _choice(ctx, conv, "none", None, False)
    label = f"BatchNorm folded (exact) + {choice.label}"
    return edit.Edit(chain, tuple(remove), (out,), fused_conv_bn,
                     (c.input, NewAttr(f"{key}_weight"), NewAttr(f"{key}_bias"),
                      c.stride, c.padding, c.dilation, c.groups),
                     Choice(choice.impl, label, True), tensors={f"{key}_weight": w, f"{key}_bias": b})


def rewrite(ctx: RewriteContext, chain, kernel: str) -> edit.Edit:
    """conv [→ BN] [→ add z] [→ act] as one epilogue call (BN folded); the kernel choice "separate_epilogue"
    runs the conv with its bias, then the add and the activation in place, never a fused epilogue."""
    conv, bn, add = ctx.node(chain, "conv"), ctx.node(chain, "bn"), ctx.node(chain, "add")
    act_node = ctx.node(chain, "act")
    if act_node is None and add is None:  # conv_bn: the fold is the whole chain
        return fold(ctx, chain)
    edit.only_identity_views(ctx, chain)
    act = "none" if act_node is None else aten.activation_name(act_node)
    if act not in CONV_ACTIVATIONS:
        raise UseGeneric(f"activation {act} has no conv epilogue")
    c = _conv(conv)
    weight, bias = c.weight, c.bias
    tensors: dict[str, torch.Tensor] = {}
    if bn is not None:
        w, b = _folded(ctx, conv, bn)
        tensors = {f"{conv.name}_weight": w, f"{conv.name}_bias": b}
        weight, bias = NewAttr(f"{conv.name}_weight"), NewAttr(f"{conv.name}_bias")
    members = set(ctx.members(chain))
    z = None
    if add is not None:
        edit.check_alpha(add)
        z = edit.other_operand(add, members)
    separate = kernel == "separate_epilogue"
    choice = _choice(ctx, conv, act, z, separate)
    label = choice.label
    if bn is not None:
        label = f"BatchNorm folded (exact) + {label}"
    if separate:
        label += "; kernel choice: separate epilogue"
    elif not choice.fused:
        label += edit.not_fused_note(ctx.device, "the conv epilogue")
    choice = Choice(choice.impl, label, choice.fused or bn is not None)
    if separate:
        target = fused_conv_separate_epilogue
    elif z is not None:
        target = fused_conv_bn_add_act if bn is not None else fused_conv_add_act
    else:
        target = fused_conv_bn_act if bn is not None else fused_conv_act
    args = (c.input, weight, bias, *((z,) if (z is not None or separate) else ()),
            c.stride, c.padding, c.dilation, c.groups, act)
    return edit.whole_chain_edit(ctx, chain, target, args, choice, tensors)


# ====================================================================== lowering (lean graphs)

def _geometry(gm, weight, stride, padding, dilation, groups):
    """``(weight tensor, stride, padding, dilation)`` as int lists for a 2-D conv, or None when unresolvable."""
    w = edit.attr_tensor(gm, weight)
    lists = edit.int_lists(2, stride, padding, dilation)
    if w is None or w.dim() != 4 or lists is None or not isinstance(groups, int):
        return None
    return (w, *lists)


def _lower(gm, node, device, dtype, x, w, b, z, stride, padding, dilation, groups, act, separate) -> bool:
    geometry = _geometry(gm, w, stride, padding, dilation, groups)
    x_shape = aten.static_shape(x)
    if geometry is None or act not in CONV_ACTIVATIONS or x_shape is None:
        return False
    weight, stride, padding, dilation = geometry
    out_shape = conv_out_shape(x_shape, weight.shape, stride, padding, dilation)
    fits = True
    if z is not None:
        z_shape = aten.static_shape(z)
        if z_shape is None:
            return False
        fits = out_shape == z_shape
    choice = select_conv_epilogue(device, dtype, act, weight_dim=4, residual=z is not None, residual_fits=fits,
                                  separate=separate, kernel_size=tuple(weight.shape[2:]),
                                  depthwise=is_depthwise(x_shape[1], weight.shape, groups),
                                  pointwise=is_pointwise_conv(weight.shape, stride, padding, dilation, groups),
                                  out_pixels=math.prod(out_shape[2:]) * out_shape[0])
    if choice.impl == "cudnn_conv_relu":
        return edit.replace_node(gm, node, lambda g: g.call_function(
            torch.cudnn_convolution_relu, (x, w, b, stride, padding, dilation, groups)))
    if choice.impl == "cudnn_conv_add_relu":  # z floating like x: both in ``dtype`` after prepare_graph
        return edit.replace_node(gm, node, lambda g: g.call_function(
            torch.cudnn_convolution_add_relu, (x, w, z, 1.0, b, stride, padding, dilation, groups)))
    if choice.impl == "triton_depthwise" and fits:
        packed = _register(gm, "_lean_dw_" + str(w.target).replace(".", "_"), pack_depthwise_weight(weight))
        return edit.replace_node(gm, node, lambda g: g.call_function(
            depthwise_conv_epilogue, (x, w, g.get_attr(packed), b, z, stride, padding, dilation, act)))
    if choice.impl == "triton_gemm" and fits:
        return edit.replace_node(gm, node, lambda g: g.call_function(conv1x1_epilogue, (x, w, b, z, act)))
    if choice.impl in ("triton_gemm", "triton_depthwise", "triton_epilogue") and fits:
        return edit.replace_node(gm, node, lambda g: g.call_function(
            bias_act_, (g.call_function(torch.conv2d, (x, w, None, stride, padding, dilation, groups)), b, z, act)))
    if choice.impl != "separate":
        return False

    def build(g: torch.fx.Graph) -> torch.fx.Node:
        y = g.call_function(torch.conv2d, (x, w, b, stride, padding, dilation, groups))
        if z is not None:
            y = g.call_method("add_", (y, z))
        return in_place_node(g, y, act)

    return edit.replace_node(gm, node, build)


def _register(gm: torch.fx.GraphModule, name: str, tensor: torch.Tensor) -> str:
    """A root buffer ``name`` holding ``tensor`` (made once per graph); returns the name."""
    if not hasattr(gm, name):
        gm.register_buffer(name, tensor, persistent=False)
    return name


def _lower_conv_bn(gm, node, device, dtype) -> bool:
    """fused_conv_bn (BatchNorm already folded into the weight): the conv, its bias as the selection says."""
    x, w, b, stride, padding, dilation, groups = node.args
    return _lower(gm, node, device, dtype, x, w, b, None, stride, padding, dilation, groups, "none", False)


def _lower_act(gm, node, device, dtype) -> bool:
    x, w, b, stride, padding, dilation, groups, act = node.args
    return _lower(gm, node, device, dtype, x, w, b, None, stride, padding, dilation, groups, act, False)


def _lower_add_act(gm, node, device, dtype) -> bool:
    x, w, b, z, stride, padding, dilation, groups, act = node.args
    return _lower(gm, node, device, dtype, x, w, b, z, stride, padding, dilation, groups, act, False)


def _lower_separate(gm, node, device, dtype) -> bool:
    x, w, b, z, stride, padding, dilation, groups, act = node.args
    return _lower(gm, node, device, dtype, x, w, b, z, stride, padding, dilation, groups, act, True)


#: fused call target -> lowering(gm, node, device, dtype) -> bool (explorer.runtime.lean)
LOWERINGS = {
    fused_conv_bn: _lower_conv_bn,
    fused_conv_act: _lower_act,
    fused_conv_bn_act: _lower_act,
    fused_conv_add_act: _lower_add_act,
    fused_conv_bn_add_act: _lower_add_act,
    fused_conv_separate_epilogue: _lower_separate,
}


# ====================================================================== patterns

def _bn_inference(g, node: str, ctx: dict) -> str | None:
    if g.nodes[node].get("training"):
        return "BatchNorm in training mode: folding is valid only for inference (frozen statistics)"
    return None


def _same_shape_add(g, node: str, ctx: dict) -> str | None:
    """The residual operand of a fused conv+add must have the conv output's shape."""
    prev = ctx["prev"]
    out_shape = g.nodes[prev]["shapes"][:1]
    for src in g.predecessors(node):
        if src == prev or src in ctx["chain"]:
            continue
        if g.nodes[src]["shapes"][:1] != out_shape:
            return f"add operand shape {g.nodes[src]['shapes'][:1]} differs from the conv output {out_shape} (broadcast)"
    if g.in_degree(node) == 1:
        return "add of a constant, not a residual"
    return None


_CONV = Step(frozenset({"conv"}), "conv")
_BN = Step(frozenset({"batch_norm"}), "bn", guard=_bn_inference)
_ACT = Step(frozenset(CONV_ACTIVATIONS) - {"none", "gelu_tanh"}, "act", family=ACTIVATIONS)
_ADD = Step(frozenset({"add"}), "add", guard=_same_shape_add)
_KERNELS = ("auto", "separate_epilogue", "inductor")
_IMPLEMENTATION = ("cuDNN conv+bias+ReLU in one call where it wins; 1x1 convs (channels_last) as one Triton GEMM "
                   "with their epilogue, depthwise convs as one Triton kernel with theirs; otherwise the conv "
                   "without bias and one vectorised Triton pass for bias, residual and activation")
_ADD_WHY = ("The residual add and the activation run in the convolution's epilogue: the conv output "
            "is never written to device memory and read back, and the add and the activation cost no "
            "launch of their own.")
_PROJECTION_WHY = ("MobileNetV2's and EfficientNet's projection convolutions end in a residual add with no "
                   "activation (a linear bottleneck). Unfused, the add is a kernel of its own that reads the "
                   "conv output and the residual and writes the sum; in the epilogue it is one more read of "
                   "the residual in the pass that adds the bias.")

PATTERNS = (
    Pattern(
        name="conv_bn_add_act", label="Conv+BN+Add+act", priority=20, stage="activation",
        steps=(_CONV, _BN, _ADD, _ACT), color="#1f77b4", kernels=_KERNELS, rewrite=rewrite, fold=fold,
        implementation="BatchNorm folded into the conv; " + _IMPLEMENTATION,
        explanation="The residual block's tail. " + _ADD_WHY,
        caveats=(FOLD_CAVEAT, PRECISION_CAVEAT, PAYS_CAVEAT), formula=FORMULA,
    ),
    Pattern(
        name="conv_add_act", label="Conv+Add+act", priority=21, stage="activation",
        steps=(_CONV, _ADD, _ACT), color="#17becf", kernels=_KERNELS, rewrite=rewrite,
        implementation=_IMPLEMENTATION,
        explanation=("Conv, residual add and activation, BatchNorm already folded (as ONNX exporters "
                     "do). " + _ADD_WHY),
        caveats=(PRECISION_CAVEAT, PAYS_CAVEAT),
    ),
    Pattern(
        name="conv_bn_add", label="Conv+BN+Add", priority=22, stage="activation",
        steps=(_CONV, _BN, _ADD), color="#ffbb78", kernels=_KERNELS, rewrite=rewrite, fold=fold,
        implementation="BatchNorm folded into the conv; the residual added in the epilogue pass with the bias",
        explanation=_PROJECTION_WHY,
        caveats=(FOLD_CAVEAT, PRECISION_CAVEAT, PAYS_CAVEAT), formula=FORMULA,
    ),
    Pattern(
        name="conv_add", label="Conv+Add", priority=23, stage="activation",
        steps=(_CONV, _ADD), color="#9edae5", kernels=_KERNELS, rewrite=rewrite,
        implementation="the residual added in the epilogue pass with the bias",
        explanation=("A convolution and a residual add with no activation, BatchNorm already folded (as "
                     "ONNX exporters do). " + _PROJECTION_WHY),
        caveats=(PRECISION_CAVEAT, PAYS_CAVEAT),
    ),
    Pattern(
        name="conv_bn_act", label="Conv+BN+act", priority=24, stage="activation",
        steps=(_CONV, _BN, _ACT), color="#2ca02c", kernels=_KERNELS, rewrite=rewrite, fold=fold,
        implementation="BatchNorm folded into the conv; " + _IMPLEMENTATION,
        explanation=("conv -> temp1 -> bn -> temp2 -> relu is three launches and two intermediates "
                     "written and read back. Folding BN into the conv's weights removes one op exactly; "
                     "running the activation in the conv's epilogue removes the other."),
        caveats=(FOLD_CAVEAT, PRECISION_CAVEAT, PAYS_CAVEAT), formula=FORMULA,
    ),
    Pattern(
        name="conv_act", label="Conv+act", priority=25, stage="activation",
        steps=(_CONV, _ACT), color="#98df8a", kernels=_KERNELS, rewrite=rewrite,
        implementation=_IMPLEMENTATION,
        explanation=("Convolution with its activation in the epilogue (BatchNorm already folded, as "
                     "ONNX exporters do): the pre-activation tensor is never written out."),
        caveats=(PRECISION_CAVEAT, PAYS_CAVEAT),
    ),
    Pattern(
        name="conv_bn", label="Conv+BN", priority=26, stage="conv_bn",
        steps=(_CONV, _BN), color="#ff7f0e", rewrite=rewrite, fold=fold,
        implementation=("BatchNorm folded into the conv's weight and bias (exact algebra, no kernel); on CUDA "
                        "the bias in one vectorised Triton pass after the conv"),
        explanation=("In inference BatchNorm is a per-channel affine map, so it folds into the "
                     "convolution's weights: one op and one intermediate disappear at no cost."),
        caveats=(FOLD_CAVEAT, PRECISION_CAVEAT), formula=FORMULA,
    ),
)
