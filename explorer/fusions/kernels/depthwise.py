"""The depthwise convolution with its whole epilogue (or a LayerNorm over the channels) in one Triton kernel.

Used by the convolution family (``triton_depthwise``) and ConvNeXt's block
(``norm=True``). The reference is the unfused conv graph
(``conv.conv_epilogue_reference``); ``DEPTHWISE_TOLERANCES`` holds the error model.
"""

from __future__ import annotations

import functools

import torch

from explorer.fusions.epilogue import TRITON_ACTIVATIONS, check, triton_activation, triton_round_bf16
from explorer.fusions.kernels.bias_act import bias_act_
from explorer.fusions.kernels.common import (PLANS, TRITON_DTYPES, LaunchPlan, as_list, conv_out_shape, is_depthwise,
                                             layout_of)
from explorer.fusions.triton_support import (import_triton, interpreting, jit_helpers, launch,
                                             library_reductions_usable, next_power_of_2, planned,
                                             remember, triton_runs_on)

EPILOGUE_ACTIVATIONS = TRITON_ACTIVATIONS

#: The depthwise kernel against the float64 conv graph, for unit-scale data (|conv| up to ~4):
#: it sums k² products in fp32 (≤ k²·6e-8 relative) and rounds once (u·|out|); the activation's
#: slope is at most 1.5 (hardswish at 3). rtol 2u, atol 8u for 16-bit; fp32 2e-5 (49 terms of 7×7).
DEPTHWISE_TOLERANCES = {
    torch.float32: dict(rtol=2e-5, atol=2e-5),
    torch.float16: dict(rtol=1e-3, atol=4e-3),      # 2u, 8u
    torch.bfloat16: dict(rtol=8e-3, atol=3.2e-2),   # 2u, 8u
}


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
            tiles, x.is_cuda or interpreting())


def plan_depthwise(x, weight, bias, z, stride, padding, dilation, act, norm, tiles) -> LaunchPlan:
    """Check the operands (``ValueError`` for what the kernel does not compute) and plan the launch; the
    plan's ``kernel`` is None for an empty output (nothing to launch)."""
    check(act, EPILOGUE_ACTIVATIONS)
    if x.dim() != 4 or not is_depthwise(x.shape[1], weight.shape, weight.shape[0]):
        raise ValueError(f"not a depthwise 2-D convolution: x {tuple(x.shape)}, weight {tuple(weight.shape)}")
    stride, padding, dilation = as_list(stride, 2), as_list(padding, 2), as_list(dilation, 2)
    shape = conv_out_shape(x.shape, weight.shape, stride, padding, dilation)
    if z is not None and tuple(z.shape) != shape:
        raise ValueError(f"residual z must have the output's shape {shape}, got {tuple(z.shape)}")
    n, c, h, w = x.shape
    kh, kw = weight.shape[2:]
    (sh, sw), (ph, pw), (dh, dw) = stride, padding, dilation
    h_out, w_out = shape[2], shape[3]
    if h_out <= 0 or w_out <= 0 or x.numel() == 0:
        return LaunchPlan(out_shape=shape)
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
    return LaunchPlan(_build_depthwise_kernel(interpret), grid, (h, w, h_out, w_out, c, eps, *x.stride()), constexprs,
                 warps, tail=(*(z.stride() if z is not None else (0, 0, 0, 0)), sw_[0], sw_[2], sw_[3]),
                 out_shape=shape)


def _run_depthwise(plan: LaunchPlan, key: tuple, x, weight, bias, z, norm) -> torch.Tensor:
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
    plan = planned(PLANS, key, plan_depthwise, x, weight, bias, z, stride, padding, dilation, act, norm, tiles)
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
    plan = PLANS.get(key)
    if plan is None:
        plan = remember(PLANS, key, plan_depthwise(x, packed, bias, z, stride, padding, dilation, act, None, None)
                        if depthwise_applies(x, weight, weight.shape[0], z) else LaunchPlan(out_shape="fallback"))
    if plan.out_shape != "fallback":
        return _run_depthwise(plan, key, x, packed, bias, z, None)
    y = torch.conv2d(x, weight, None, stride, padding, dilation, weight.shape[0])   # (N, C, H', W')
    return bias_act_(y, bias, z, act)
