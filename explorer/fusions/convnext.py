"""The ConvNeXt block in three kernels: depthwise conv + LayerNorm, GEMM + GELU, GEMM + layer scale + residual.

::

    unfused (eager, channels_last: 8 kernels; NCHW: a 9th, the copy LayerNorm makes of the permuted tensor)
    x ─┬─► dwconv 7×7 ─► +b ─► permute ─► LayerNorm(C) ─► linear(4C)+b ─► GELU ─► linear(C)+b ─► permute ─► ·γ ─► + ─► y
       │    (cuDNN)   (bias kernel)        (1 kernel)      (cuBLASLt)    (1 kernel)  (cuBLASLt)               (1)  (1)
       └──────────────────────────────────────────────────────────────────────────────────────────────────────────┘

    fused (3 kernels where Triton runs and the input is channels_last)
    x ─┬─► depthwise_conv(x, w, b, norm=LN) ─► t (M=N·H·W, C) ─► GEMM+b₁+GELU ─► h (M, 4C) ─► GEMM(γ·W₂)+γ·b₂+x ─► y
       │      ONE Triton kernel: conv, bias and            ONE Triton kernel:         ONE Triton kernel: the
       │      the LayerNorm over the C channels            GELU in the epilogue       residual read in the epilogue
       └───────────────────────────────────────────────────────────────────────────────────────────────▲ (x's rows)

What each step buys, and why it is this way:

- **Depthwise conv + bias + LayerNorm, one kernel** (``conv.depthwise_conv`` with a
  LayerNorm epilogue): the conv output is never written and read back three times
  (bias add, LayerNorm, and in NCHW the copy of the permuted tensor). One program
  holds every channel of a few output pixels (``conv.depthwise_tiles``), so the
  mean and variance are a reduction over its tile; the output is channels_last,
  i.e. exactly the contiguous ``(N·H·W, C)`` matrix the first linear reads. It needs
  Triton (CUDA, or the interpreter on the CPU) and a channels_last input; otherwise
  cuDNN's conv, then ``layer_norm``.
- **Linear + GELU, one kernel** (``conv.gemm_epilogue``): the exact (erf) GELU in the
  GEMM's epilogue, on the fp32 accumulator. cuBLASLt's GELU epilogue is the tanh
  approximation (``linear.gelu_epilogue_variant`` probes it), so without our GEMM the
  widest tensor of the block (4C) is written, read and written again by a GELU pass.
  Without Triton: the linear family decides.
- **Layer scale folded into the second linear**: ``γ · (h W₂ᵀ + b₂) = h (γW₂)ᵀ + γb₂``
  per output channel, exact algebra done once in float64 like the BatchNorm fold
  (``fold_layer_scale``): the multiply disappears.
- **Residual in the second GEMM's epilogue**: over a channels_last input the block input's
  pixels are the rows of a ``(N·H·W, C)`` view, read once in the epilogue; any other layout
  takes one vectorised ``bias_act_`` pass after the GEMM (eager runs the multiply and the
  add as two passes).

Whether our GEMMs beat cuBLAS plus the separate passes is measured, not assumed:
``benchmarks/bench_cnn_fusions.py`` times the fused model with ``conv.POLICY``'s
``gemm_triton`` and ``depthwise_triton`` switched off beside it. ``select_convnext_block``
is the one decision the runtime call, the label and the lowering ask.
"""

from __future__ import annotations

import functools

import torch
import torch.fx
import torch.nn.functional as F

from explorer.fusions import conv, edit, linear
from explorer.fusions.base import PRECISION_CAVEAT, Choice, Pattern, Step
from explorer.fusions.edit import NewAttr, Refuse, RewriteContext, UseGeneric
from explorer.fusions.epilogue import triton_round_bf16
from explorer.fusions.triton_support import (import_triton, interpreting, jit_helpers, launch,
                                             library_reductions_usable, next_power_of_2, planned,
                                             triton_runs_on)
from explorer.graph import aten

SUPPORTED_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
#: A LayerNorm epilogue holds every channel of its pixels in one program: up to this many.
MAX_CHANNELS = 2048

#: The fused block against the unfused one in float64 from the same inputs upcast, for
#: unit-scale data: the LayerNorm output is rounded once (u), each GEMM accumulates in fp32
#: and rounds its output (u relative to the row's scale), GELU rounds once more, the folded
#: weights γ·W₂ are rounded once (u per weight) and the residual sum once: ~8u of the output's
#: scale for 16-bit dtypes (the same error model as a GEMM with an epilogue, ``EPILOGUE_TOLERANCES``),
#: 2e-5 for fp32 (sums over 4C terms).
TOLERANCES = {
    torch.float32: dict(rtol=2e-5, atol=2e-5),
    torch.float16: dict(rtol=4e-3, atol=4e-3),
    torch.bfloat16: dict(rtol=3.2e-2, atol=3.2e-2),
}

CAVEAT = ("Folding the layer scale into the second linear rounds γ·W₂ to the weights' dtype once, "
          "as BatchNorm folding does; valid in inference and training alike (it is exact algebra).")
#: Not every fusion pays, and this one did not where it was measured: said where the user chooses.
CAVEAT_MEASURED = ("Slower than what it replaces by the medians of one H200 run (ConvNeXt-Tiny, fp16, "
                   "batch 32): the depthwise 7x7 + LayerNorm kernel and the GEMM epilogues lose to cuDNN and cuBLAS there, and the fused model "
                   "ran slower than eager and torch.compile "
                   "(benchmarks/results/bench_cnn_fusions_autotune_convnext_tiny_h200.json). Time these chains on "
                   "your GPU before accepting them, or give them the inductor kernel.")


# ====================================================================== the arithmetic

def fold_layer_scale(weight: torch.Tensor, bias: torch.Tensor | None, gamma: torch.Tensor
                     ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``(γ·W, γ·b)``: a linear ``(C_out, C_in)`` followed by a per-output-channel scale ``γ`` as one linear.

    ``gamma`` has C_out elements (any shape, e.g. ConvNeXt's ``(C, 1, 1)``). Computed in
    float64, returned in the weight's dtype and device; the inputs are not modified.
    """
    if gamma.numel() != weight.shape[0]:
        raise ValueError(f"layer scale has {gamma.numel()} elements, the linear has {weight.shape[0]} outputs")
    g = gamma.detach().to(torch.float64).reshape(-1, 1)                   # (C_out, 1)
    w = (weight.detach().to(torch.float64) * g).to(weight.dtype)          # (C_out, C_in)
    b = None if bias is None else (bias.detach().to(torch.float64) * g[:, 0]).to(bias.dtype)
    return w, b


def convnext_block_reference(x, dw_weight, dw_bias, ln_weight, ln_bias, eps, w1, b1, w2, b2, gamma=None,
                             act: str = "gelu", stride=1, padding=3, dilation=1) -> torch.Tensor:
    """Unfused, as torchvision's ``CNBlock`` runs it: dwconv, permute, LayerNorm, linear, act, linear,
    permute, ``γ ·``, ``+ x``. Any float dtype (float64 for test references)."""
    c = x.shape[1]
    y = conv.conv_nd(x, dw_weight, dw_bias, stride, padding, dilation, c).permute(0, 2, 3, 1)   # (N, H, W, C)
    y = F.layer_norm(y, (c,), ln_weight, ln_bias, eps)
    y = linear.linear_act_reference(y, w1, b1, act)                                            # (N, H, W, 4C)
    y = F.linear(y, w2, b2).permute(0, 3, 1, 2)                                                # (N, C, H, W)
    if gamma is not None:
        y = gamma * y
    return y + x


# ====================================================================== selection

def uses_gemm(device: torch.device | str, dtype: torch.dtype) -> bool:
    """Whether the block's two linears run as Triton GEMMs with their epilogues (``conv.gemm_epilogue``):
    where Triton runs, in fp32/fp16/bf16, unless ``conv.POLICY`` switches ``gemm_triton`` off."""
    return conv.POLICY.gemm_triton and triton_runs_on(device) and dtype in SUPPORTED_DTYPES


def select_convnext_block(device: torch.device | str, dtype: torch.dtype, channels: int | None = None,
                          act: str = "gelu", layout: str | None = None) -> Choice:
    """The one decision of how a ConvNeXt block runs; ``Choice.impl`` names its first step:

    ``triton``: the depthwise conv, its bias and the LayerNorm in one Triton kernel (a
    channels_last input; ``layout`` None: not known yet, as in a captured graph);
    ``reference``: cuDNN's conv and ``layer_norm``. Then the MLP: where ``uses_gemm``, each
    linear is one Triton GEMM with its epilogue (the first adds the bias and applies ``act``,
    the second adds the bias and the residual where the input is channels_last); otherwise
    the linear family's choice, ``linear`` and the residual as one pass. ``conv.POLICY``'s
    ``depthwise_triton`` and ``gemm_triton`` switches turn the Triton steps off. The label
    names every kernel.
    """
    device = torch.device(device)
    triton = triton_runs_on(device) and dtype in SUPPORTED_DTYPES
    where = " [Triton interpreter on cpu]" if device.type == "cpu" else ""
    if uses_gemm(device, dtype):
        mlp = (f"triton GEMM+bias+{act} (1 kernel) + triton GEMM+bias+residual, layer scale folded (1 kernel; "
               "a residual that is not channels_last: 1 pass more)")
        fused = True
    else:
        lin = linear.select_linear_act(device, dtype, act, 2, 2)
        residual = "triton residual add (1 pass)" if triton else "residual add_"
        mlp = (f"linear+{act} ({'1 kernel: ' + lin.impl if lin.fused else '2 kernels'}) + linear, layer scale "
               f"folded (1 kernel) + {residual}")
        fused = lin.fused
    if (triton and conv.POLICY.depthwise_triton and (channels is None or channels <= MAX_CHANNELS)
            and layout in (None, "nhwc")):
        tail = "" if layout == "nhwc" else " for a channels_last input, else conv + layer_norm"
        return Choice("triton", f"triton dwconv+bias+LayerNorm (1 kernel{tail}) + {mlp}{where}", True)
    if not triton:
        why = f"no Triton on {device.type}" if not triton_runs_on(device) else f"dtype {dtype}"
    elif not conv.POLICY.depthwise_triton:
        why = "conv.POLICY: depthwise_triton off"
    elif channels is not None and channels > MAX_CHANNELS:
        why = f"{channels} channels > {MAX_CHANNELS}"
    else:
        why = "the input is not channels_last"
    return Choice("reference", f"dwconv+bias + layer_norm + {mlp} ({why}){where}", fused)


# ====================================================================== the 7×7 depthwise + LayerNorm kernel, row by row

#: The one kernel size the row kernel computes (ConvNeXt's depthwise convolution), at stride 1, dilation 1.
ROWS_K = 7


@functools.lru_cache(maxsize=2)
def _build_rows_kernel(interpret: bool):
    """Define the row-rolling 7×7 depthwise conv + bias + LayerNorm kernel (imports Triton); cached per
    interpreter mode. Why row by row: see ``depthwise7_layer_norm``."""
    global tl, _add, _round_for
    _add, _round_for = jit_helpers(interpret).add, triton_round_bf16(interpret)
    triton, tl = import_triton()

    @triton.jit
    def _dwln_rows_kernel(
        X, WEIGHT, BIAS, Y, NORM_W, NORM_B,        # unused pointers alias X
        H, W, H_OUT, W_OUT, C, eps,
        sxn, sxh, sxw, syn, syh, syw, swh, sww,   # channels (x, y and the packed weight): stride 1
        PH: tl.constexpr, PW: tl.constexpr, HAS_BIAS: tl.constexpr, NORM_AFFINE: tl.constexpr,
        ROWS: tl.constexpr, BLOCK_W: tl.constexpr, BLOCK_C: tl.constexpr, LIBRARY_REDUCE: tl.constexpr,
        BF16_RTNE_BY_HAND: tl.constexpr,
    ):
        ow = tl.program_id(0) * BLOCK_W + tl.arange(0, BLOCK_W)             # (BW,) output columns
        oh0 = tl.program_id(1) * ROWS                                         # first output row of the band
        n = tl.program_id(2).to(tl.int64)
        cols = tl.arange(0, BLOCK_C)
        c_live = cols < C
        x_base = X + n * sxn + cols[None, :]
        # the weights as (BW, BC) tiles of one row repeated: loaded in x's layout, 16-byte vectors (a (BC,)
        # load gets one element per thread, then a shuffle through shared memory into x's layout)
        c_2d = tl.broadcast_to(c_live[None, :], (BLOCK_W, BLOCK_C))
        w_base = tl.broadcast_to(WEIGHT + cols[None, :], (BLOCK_W, BLOCK_C))
        # a_j: the partial sums of output row oh0 - 6 + i + j while input row oh0 - PH + i is read
        a0 = tl.zeros((BLOCK_W, BLOCK_C), dtype=tl.float32)
        a1, a2, a3, a4, a5, a6 = a0, a0, a0, a0, a0, a0
        for i in range(0, ROWS + 6):
            ih = oh0 - PH + i
            row_ok = (ih >= 0) & (ih < H)
            for kw in range(7):                  # a loop, not unrolled: the weights stay loads, not 49 registers
                iw = ow - PW + kw
                ok = row_ok & (iw >= 0) & (iw < W)
                xv = tl.load(x_base + (ih * sxh + iw * sxw)[:, None], mask=ok[:, None] & c_live[None, :],
                             other=0.0).to(tl.float32)                        # (BW, BC): read once per row
                wp = w_base + kw * sww                                        # weight[c, 0, kh, kw] at wp + kh·swh
                a0 += xv * tl.load(wp + 6 * swh, mask=c_2d, other=0.0).to(tl.float32)
                a1 += xv * tl.load(wp + 5 * swh, mask=c_2d, other=0.0).to(tl.float32)
                a2 += xv * tl.load(wp + 4 * swh, mask=c_2d, other=0.0).to(tl.float32)
                a3 += xv * tl.load(wp + 3 * swh, mask=c_2d, other=0.0).to(tl.float32)
                a4 += xv * tl.load(wp + 2 * swh, mask=c_2d, other=0.0).to(tl.float32)
                a5 += xv * tl.load(wp + 1 * swh, mask=c_2d, other=0.0).to(tl.float32)
                a6 += xv * tl.load(wp, mask=c_2d, other=0.0).to(tl.float32)
            oh = oh0 - 6 + i                                                  # a0's row: complete now
            if (i >= 6) & (oh < H_OUT):
                acc = a0
                if HAS_BIAS:
                    acc += tl.load(BIAS + cols, mask=c_live, other=0.0).to(tl.float32)[None, :]
                acc = tl.where(c_live[None, :], acc, 0.0)                     # LayerNorm over the C channels
                if LIBRARY_REDUCE:
                    mean = tl.sum(acc, axis=1) / C
                else:
                    mean = tl.reduce(acc, 1, _add) / C
                d = tl.where(c_live[None, :], acc - mean[:, None], 0.0)
                if LIBRARY_REDUCE:
                    var = tl.sum(d * d, axis=1) / C
                else:
                    var = tl.reduce(d * d, 1, _add) / C
                acc = d * (1.0 / tl.sqrt(var + eps))[:, None]
                if NORM_AFFINE:
                    acc = acc * tl.load(NORM_W + cols, mask=c_live, other=0.0).to(tl.float32)[None, :]
                    acc += tl.load(NORM_B + cols, mask=c_live, other=0.0).to(tl.float32)[None, :]
                acc = _round_for(acc, BF16_RTNE_BY_HAND)
                tl.store(Y + n * syn + oh * syh + (ow * syw)[:, None] + cols[None, :],
                         acc.to(Y.dtype.element_ty, fp_downcast_rounding="rtne"),
                         mask=(ow < W_OUT)[:, None] & c_live[None, :])
            a0, a1, a2, a3, a4, a5 = a1, a2, a3, a4, a5, a6
            a6 = tl.zeros((BLOCK_W, BLOCK_C), dtype=tl.float32)

    return _dwln_rows_kernel


def rows_tiles(channels: int, h_out: int, w_out: int) -> tuple[int, int, int]:
    """``(BLOCK_W, ROWS, num_warps)`` of the row kernel: a strip of BLOCK_W output columns × every channel
    (``BLOCK_C``, the next power of two of C) walking down ROWS output rows.

    Seven accumulators of BLOCK_W × BLOCK_C fp32 live in registers: BLOCK_W × BLOCK_C is kept near 1024
    per 4 warps (8 warps from 512 channels). ROWS covers the whole height up to 32 rows (each band
    re-reads 6 rows of halo and spends 6/(ROWS+6) of its multiply-adds on rows other bands finish),
    halved while the grid would leave most of the GPU's 132 SMs idle.
    """
    block_c = next_power_of_2(channels)
    warps = 8 if block_c >= 512 else 4
    block_w = max(1, min(next_power_of_2(w_out), (1024 * warps // 4) // block_c, 16))
    rows = min(h_out, 32)
    while rows > 4 and -(-w_out // block_w) * -(-h_out // rows) < 8:
        rows = -(-rows // 2)
    return block_w, rows, warps


def rows_applies(x: torch.Tensor, weight: torch.Tensor, stride, padding, dilation) -> bool:
    """Whether the row kernel computes this depthwise conv: 7×7, stride 1, dilation 1, padding up to 6, a
    channels_last input whose channels have stride 1 (the depthwise kernel's other conditions too)."""
    lists = edit.int_lists(2, stride, padding, dilation)
    return (lists is not None and lists[0] == [1, 1] and lists[2] == [1, 1] and all(0 <= p <= 6 for p in lists[1])
            and tuple(weight.shape[2:]) == (ROWS_K, ROWS_K) and conv.depthwise_applies(x, weight, weight.shape[0])
            and x.stride(1) == 1 and weight.stride(0) == 1 and x.shape[1] <= MAX_CHANNELS)


def _plan_rows(x, weight, bias, padding, norm, tiles) -> conv._Plan:
    n, c, h, w = x.shape
    ph, pw = edit.int_lists(2, 1, padding, 1)[1]
    h_out, w_out = h + 2 * ph - 6, w + 2 * pw - 6
    shape = (n, c, h_out, w_out)
    if h_out <= 0 or w_out <= 0 or x.numel() == 0:
        return conv._Plan(out_shape=shape)
    if n > 65535:
        raise ValueError(f"batch {n} exceeds the row kernel's grid (65535)")
    interpret = interpreting()
    block_c = next_power_of_2(c)
    block_w, rows, warps = tiles or rows_tiles(c, h_out, w_out)
    if x.device.type != "cuda" and tiles is None:        # the interpreter's cost is per operation: whole rows
        block_w, rows = next_power_of_2(w_out), h_out
    constexprs = dict(PH=ph, PW=pw, HAS_BIAS=bias is not None, NORM_AFFINE=norm[0] is not None, ROWS=rows,
                      BLOCK_W=block_w, BLOCK_C=block_c, LIBRARY_REDUCE=library_reductions_usable(),
                      BF16_RTNE_BY_HAND=interpret and x.dtype == torch.bfloat16)
    grid = (-(-w_out // block_w), -(-h_out // rows), n)
    return conv._Plan(_build_rows_kernel(interpret), grid,
                      (h, w, h_out, w_out, c, float(norm[2]), x.stride(0), x.stride(2), x.stride(3)), constexprs,
                      warps, tail=(weight.stride(2), weight.stride(3)), out_shape=shape)


def depthwise7_layer_norm(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None, padding,
                          ln_weight: torch.Tensor | None, ln_bias: torch.Tensor | None, eps: float, *,
                          tiles: tuple[int, int, int] | None = None) -> torch.Tensor:
    """``layer_norm(dwconv7×7(x) + b)`` over the channels, as a contiguous ``(N, H', W', C)``: ONE Triton kernel.

    ``x``: channels_last ``(N, C, H, W)``; ``packed``: the weight ``(C, 1, 7, 7)`` as
    ``conv.pack_depthwise_weight`` stores it (channels innermost); stride 1, dilation 1 (callers
    check ``rows_applies``). Each program owns a strip of output columns with every channel and
    walks down its rows: each input row is loaded once (as 7 shifted tiles, served by L1) and
    added into the seven output rows it touches, held as seven rolling accumulators; a row is
    normalised and stored the moment its seventh input row is in. The tap-by-tap kernel
    (``conv.depthwise_conv``) loads every input pixel 49 times. ``tiles`` = (BLOCK_W, ROWS,
    num_warps) overrides ``rows_tiles`` (tests). Planned once per call signature.
    """
    key = ("dwln-rows", x.shape, x.stride(), x.dtype, x.device, packed.shape, packed.stride(), packed.dtype,
           None if bias is None else bias.dtype, None if ln_weight is None else ln_weight.dtype,
           None if ln_bias is None else ln_bias.dtype, conv._geometry_key(padding), float(eps), tiles,
           interpreting())
    plan = planned(conv._PLANS, key, _plan_rows, x, packed, bias, padding, (ln_weight, ln_bias, eps), tiles)
    n, c, h_out, w_out = plan.out_shape
    out = torch.empty((n, h_out, w_out, c), dtype=x.dtype, device=x.device)          # (N, H', W', C)
    if plan.kernel is None:
        return out
    pointers = (x, packed, x if bias is None else bias, out, x if ln_weight is None else ln_weight,
                x if ln_bias is None else ln_bias)
    launch(plan.kernel, plan.grid, (*pointers, *plan.ints, *out.stride()[:3], *plan.tail), plan.constexprs,
           key=(key, tuple(t.data_ptr() & 15 == 0 for t in pointers)), num_warps=plan.num_warps)
    return out


# ====================================================================== the block

def depthwise_layer_norm(x: torch.Tensor, weight: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None,
                         stride, padding, dilation, ln_weight, ln_bias, eps: float) -> torch.Tensor:
    """``layer_norm(dwconv(x) + b)`` over the channels, as ``(N, H', W', C)``: one Triton kernel where
    it takes the operands (``conv.depthwise_applies``: a channels_last input on a device Triton runs
    on), reading the weight ``packed`` (``conv.pack_depthwise_weight``; ``weight`` itself works too,
    more slowly); otherwise cuDNN's conv, a permute and ``layer_norm``."""
    c = x.shape[1]
    key = ("convnext-dwln", x.shape, x.stride(), x.dtype, x.device, weight.shape, weight.device,
           conv.POLICY.depthwise_triton, interpreting())
    decision = conv.cached_plan(key)
    if decision is None:
        use = conv.POLICY.depthwise_triton and c <= MAX_CHANNELS and conv.depthwise_applies(x, weight, weight.shape[0])
        decision = conv.fallback_plan(key, "kernel" if use else "fallback")
    if decision.out_shape == "kernel":
        y = conv.depthwise_conv(x, packed, bias, None, stride, padding, dilation, "none",
                                norm=(ln_weight, ln_bias, eps))                  # (N, C, H', W') channels_last
        return y.permute(0, 2, 3, 1)                                             # (N, H', W', C) contiguous
    y = torch.conv2d(x, weight, bias, stride, padding, dilation, c).permute(0, 2, 3, 1)   # (N, H', W', C)
    return F.layer_norm(y, (c,), ln_weight, ln_bias, eps)


def residual_add_(y: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """``y += x`` in place: one vectorised Triton pass where Triton runs (any two dense layouts), else ``add_``."""
    return conv.bias_act_(y, None, x, "none")


def mlp_hidden(t: torch.Tensor, w1: torch.Tensor, b1: torch.Tensor | None, act: str, gemm: bool) -> torch.Tensor:
    """``act(t @ w1ᵀ + b1)`` for the contiguous ``t`` ``(N, H, W, C)``, as ``(N·H·W, 4C)``: one Triton GEMM with
    the bias and the activation in its epilogue (``gemm``, where ``conv.gemm_applies``), else as the linear
    family decides. Planned once per call signature."""
    c = t.shape[-1]
    key = ("convnext-fc1", t.shape, t.stride(), t.dtype, t.device, w1.shape, w1.stride(), w1.dtype,
           None if b1 is None else b1.dtype, act, gemm, interpreting())
    plan = conv.cached_plan(key)
    if plan is None:
        rows = t.reshape(-1, c)
        if gemm and t.is_contiguous() and conv.gemm_applies(rows, w1) and rows.shape[0] > 0:
            plan = conv.gemm_plan(key, t, w1, b1, None, act, rows.shape[0], c, (c, 1), None, (w1.shape[0], 1))
        else:
            plan = conv.fallback_plan(key)
    if plan.out_shape == "fallback":
        return linear.linear_act(t.reshape(-1, c), w1, b1, act)
    out = torch.empty((t.numel() // c, w1.shape[0]), dtype=t.dtype, device=t.device)   # (M, 4C)
    return conv.gemm_launch(plan, key, t, w1, b1, None, out)


def project_residual(h: torch.Tensor, w2: torch.Tensor, b2: torch.Tensor | None, x: torch.Tensor,
                     gemm: bool) -> torch.Tensor:
    """``x + (h @ w2ᵀ + b2)`` as ``(N, C, H, W)`` (channels_last memory): one Triton GEMM that adds the bias and
    the residual in its epilogue where ``x`` is channels_last (its pixels are then rows of stride C) and ``gemm``;
    else the GEMM (or ``linear``) and ``residual_add_``. Planned once per call signature."""
    n, c, hh, ww = x.shape
    key = ("convnext-fc2", h.shape, h.stride(), x.shape, x.stride(), x.dtype, x.device, w2.shape, w2.stride(),
           w2.dtype, None if b2 is None else b2.dtype, gemm, interpreting())
    plan = conv.cached_plan(key)
    if plan is None:
        if gemm and conv.gemm_applies(h, w2) and h.shape[0] == n * hh * ww > 0:
            z = x if conv.layout_of(x) == "nhwc" else None      # the residual read in the epilogue, as rows of x
            plan = conv.gemm_plan(key, h, w2, b2, z, "none", h.shape[0], h.shape[1], h.stride(),
                                  None if z is None else (c, 1), (c, 1))
            plan.out_shape = "residual in the epilogue" if z is not None else "residual pass"
        else:
            plan = conv.fallback_plan(key)
    if plan.out_shape == "fallback":
        y = F.linear(h, w2, b2).view(n, hh, ww, c).permute(0, 3, 1, 2)      # (N, C, H, W)
        return residual_add_(y, x)
    out = torch.empty((n, c, hh, ww), dtype=x.dtype, device=x.device, memory_format=torch.channels_last)
    if plan.out_shape == "residual in the epilogue":
        return conv.gemm_launch(plan, key, h, w2, b2, x, out)
    return residual_add_(conv.gemm_launch(plan, key, h, w2, b2, None, out), x)


def convnext_block(x, dw_weight, dw_bias, stride, padding, dilation, ln_weight, ln_bias, eps, w1, b1, act,
                   w2, b2) -> torch.Tensor:
    """A ConvNeXt block with its layer scale already folded into ``(w2, b2)`` (``fold_layer_scale``).

    ``x``: ``(N, C, H, W)``; ``dw_weight``: ``(C, 1, k, k)``; ``w1``: ``(4C, C)``; ``w2``:
    ``(C, 4C)``. Returns ``x + block(x)``, ``(N, C, H, W)`` in channels_last memory (as the
    unfused block's output is, whatever the input's layout).
    """
    gemm = conv.POLICY.gemm_triton
    t = depthwise_layer_norm(x, dw_weight, dw_weight, dw_bias, stride, padding, dilation, ln_weight, ln_bias,
                             eps)                                                  # (N, H, W, C)
    h = mlp_hidden(t, w1, b1, act, gemm)                                           # (N·H·W, 4C)
    return project_residual(h, w2, b2, x, gemm)                                    # (N, C, H, W)


def fused_convnext_block(x, dw_weight, dw_bias, stride, padding, dilation, ln_weight, ln_bias, eps, w1, b1, act,
                         w2, b2):
    """``x + γ·MLP(LN(dwconv(x)))`` with γ folded into ``(w2, b2)``: as ``select_convnext_block`` decides."""
    return convnext_block(x, dw_weight, dw_bias, stride, padding, dilation, ln_weight, ln_bias, eps, w1, b1, act,
                          w2, b2)


# ====================================================================== rewrite

def _permute_between(ctx: RewriteContext, chain, first: torch.fx.Node, last: torch.fx.Node, dims: list[int]) -> None:
    """The chain's only view between ``first`` and ``last`` is ``permute(dims)``."""
    names = list(chain.nodes)
    views = [ctx.by_name[n] for n in names[names.index(first.name) + 1: names.index(last.name)]]
    if len(views) != 1 or aten.aten_name(views[0]) != "permute" or list(views[0].args[1]) != dims:
        raise UseGeneric(f"{first.name} → {last.name} is not one permute{tuple(dims)}")


def rewrite(ctx: RewriteContext, chain, kernel: str) -> edit.Edit:
    """The whole block as one call: layer scale folded into the second linear, the rest as selected."""
    dw, ln_node = ctx.node(chain, "dwconv"), ctx.node(chain, "norm")
    fc1, act_node, fc2 = ctx.node(chain, "fc1"), ctx.node(chain, "act"), ctx.node(chain, "fc2")
    scale, add = ctx.node(chain, "scale"), ctx.node(chain, "residual")
    c = aten.conv_args(dw)
    if c is None or c.transposed:
        raise UseGeneric(f"{aten.aten_name(dw)} is not a forward convolution")
    x_shape, w_shape = aten.static_shape(c.input), aten.static_shape(c.weight)
    geometry = edit.int_lists(2, c.stride, c.padding, c.dilation)
    if x_shape is None or w_shape is None or geometry is None or not conv.is_depthwise(x_shape[1], w_shape, c.groups):
        raise UseGeneric("the convolution is not a 2-D depthwise convolution with integer geometry")
    channels = x_shape[1]
    _permute_between(ctx, chain, dw, ln_node, [0, 2, 3, 1])
    _permute_between(ctx, chain, fc2, scale if scale is not None else add, [0, 3, 1, 2])
    ln = aten.layer_norm_args(ln_node)
    if ln is None or list(ln.normalized_shape) != [channels]:
        raise Refuse("the LayerNorm does not normalise over the channels alone")
    lin1, lin2 = aten.linear_args(fc1), aten.linear_args(fc2)
    if lin1 is None or lin2 is None or lin1.input is not ln_node or lin2.input is not act_node:
        raise UseGeneric("the MLP is not linear → act → linear reading the LayerNorm")
    act = aten.activation_name(act_node)
    if act not in linear.LINEAR_ACTIVATIONS:
        raise UseGeneric(f"activation {act} has no linear epilogue")
    members = set(ctx.members(chain))
    edit.check_alpha(add)
    if not edit.through_identity(edit.other_operand(add, members), c.input):
        raise Refuse("the residual add does not add the block's input")
    w2, b2 = ctx.constant(lin2.weight, "second linear weight"), ctx.constant(lin2.bias, "second linear bias")
    tensors = {}
    if scale is not None:
        gamma = ctx.constant(edit.other_operand(scale, members), "layer scale")
        if gamma.numel() != channels:
            raise Refuse(f"the scale has {gamma.numel()} elements, not one per channel ({channels})")
        w2, b2 = fold_layer_scale(w2, b2, gamma)
    key = fc2.name
    tensors[f"{key}_scaled_weight"] = w2
    w2_arg = NewAttr(f"{key}_scaled_weight")
    b2_arg = None
    if b2 is not None:
        tensors[f"{key}_scaled_bias"] = b2
        b2_arg = NewAttr(f"{key}_scaled_bias")
    stride, padding, dilation = geometry
    choice = select_convnext_block(ctx.device, edit.dtype_of(dw), channels, act)
    label = choice.label + ("" if choice.fused else edit.not_fused_note(ctx.device, "the ConvNeXt block"))
    args = (c.input, c.weight, c.bias, stride, padding, dilation, ln.weight, ln.bias, ln.eps,
            lin1.weight, lin1.bias, act, w2_arg, b2_arg)
    return edit.whole_chain_edit(ctx, chain, fused_convnext_block, args, Choice(choice.impl, label, choice.fused),
                                 tensors)


# ====================================================================== lowering (lean graphs)

def _lower(gm, node, device, dtype) -> bool:
    """The block as direct calls: ``depthwise_layer_norm`` (or conv, permute, layer_norm), the MLP's first linear
    (``mlp_hidden``'s GEMM, or the linear family's lowering of linear+act) and ``project_residual``."""
    x, dw_w, dw_b, stride, padding, dilation, ln_w, ln_b, eps, w1, b1, act, w2, b2 = node.args
    weight, w1t, w2t = (edit.attr_tensor(gm, t) for t in (dw_w, w1, w2))
    x_shape = aten.static_shape(x)
    if weight is None or w1t is None or w2t is None or x_shape is None or len(x_shape) != 4:
        return False
    n, c = x_shape[0], x_shape[1]
    out = conv.conv_out_shape(x_shape, weight.shape, stride, padding, dilation)
    choice = select_convnext_block(device, dtype, c, act)
    gemm = uses_gemm(device, dtype)
    hidden_linear = []

    def build(g: torch.fx.Graph) -> torch.fx.Node:
        if choice.impl == "triton":
            packed = conv._register(gm, "_lean_dw_" + str(dw_w.target).replace(".", "_"),
                                    conv.pack_depthwise_weight(weight))
            t = g.call_function(depthwise_layer_norm, (x, dw_w, g.get_attr(packed), dw_b, stride, padding,
                                                       dilation, ln_w, ln_b, eps))
        else:
            y = g.call_function(torch.conv2d, (x, dw_w, dw_b, stride, padding, dilation, c))
            t = g.call_function(torch.layer_norm, (g.call_function(torch.permute, (y, [0, 2, 3, 1])), [c], ln_w,
                                                   ln_b, eps))
        if gemm:
            h = g.call_function(mlp_hidden, (t, w1, b1, act, True))                      # (N·H·W, 4C)
        else:
            rows = g.call_function(torch.reshape, (t, [-1, c]))
            rows.meta["val"] = torch.empty((n * out[2] * out[3], c), dtype=dtype, device="meta")      # (M, C)
            h = g.call_function(linear.fused_linear_act, (rows, w1, b1, act))
            hidden_linear.append(h)
        return g.call_function(project_residual, (h, w2, b2, x, gemm))

    edit.replace_node(gm, node, build)
    if hidden_linear:
        linear.LOWERINGS[linear.fused_linear_act](gm, hidden_linear[0], device, dtype)
    return True


LOWERINGS = {fused_convnext_block: _lower}


# ====================================================================== pattern

def _depthwise(g, conv_node: str) -> bool:
    attrs = g.nodes[conv_node]
    shapes = attrs["shapes"]
    inputs = list(g.predecessors(conv_node))
    channels = shapes[0][1] if shapes and len(shapes[0]) == 4 else None
    return (channels is not None and attrs.get("groups", 1) == channels and len(inputs) == 1
            and g.nodes[inputs[0]]["shapes"][0][1] == channels)


def _norm_after_depthwise(g, node: str, ctx: dict) -> str | None:
    """(The anchor's own guard would never be asked: the conv is checked here, from the step after it.)"""
    if not _depthwise(g, ctx["prev_real"]):
        return "the convolution before the LayerNorm is not depthwise"
    if g.nodes[node].get("norm_dims", 1) != 1:
        return "LayerNorm normalizes over more than the last dimension"
    return None


def _per_channel_constant(g, node: str, ctx: dict) -> str | None:
    if not g.nodes[node].get("const_operand") or g.in_degree(node) != 1:
        return "the multiply is not by a constant (a layer scale)"
    return None


def _adds_block_input(g, node: str, ctx: dict) -> str | None:
    """The residual add's other operand is the tensor the block's convolution read."""
    anchor = next(n for n in ctx["chain"] if g.nodes[n]["kind"] == "conv")
    block_input = set(g.predecessors(anchor))
    others = {p for p in g.predecessors(node) if p != ctx["prev"] and p not in ctx["chain"]}
    if others != block_input:
        return "the add does not add the block's input (not a residual)"
    return None


PATTERNS = (
    Pattern(
        name="convnext_block", label="ConvNeXt block", priority=18,
        steps=(Step(frozenset({"conv"}), "dwconv"),
               Step(frozenset({"layer_norm"}), "norm", guard=_norm_after_depthwise),
               Step(frozenset({"linear"}), "fc1"),
               Step(frozenset(linear.LINEAR_ACTIVATIONS) - {"none", "gelu_tanh"}, "act"),
               Step(frozenset({"linear"}), "fc2"),
               Step(frozenset({"mul"}), "scale", optional=True, guard=_per_channel_constant),
               Step(frozenset({"add"}), "residual", guard=_adds_block_input)),
        color="#6b6ecf", rewrite=rewrite,
        implementation=("depthwise conv + bias + LayerNorm in one Triton kernel, Linear+GELU, the second "
                        "linear with the layer scale folded in, the residual add in one vectorised pass"),
        explanation=("A ConvNeXt block is eight kernels in eager mode, five of them moving the whole "
                     "activation for a few flops each (the conv's bias, LayerNorm, GELU, the layer scale, "
                     "the residual add). The LayerNorm runs in the depthwise convolution's epilogue, the "
                     "layer scale disappears into the second linear's weights, and the residual add is one "
                     "pass."),
        caveats=(PRECISION_CAVEAT, CAVEAT, CAVEAT_MEASURED),
        formula="gamma * (h W2^T + b2) = h (gamma W2)^T + gamma b2   (per output channel)",
    ),
)
