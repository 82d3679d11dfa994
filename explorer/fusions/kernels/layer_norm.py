"""A LayerNorm over the channels of a channels_last tensor, one pass, beside its reference.

A channels_last ``(N, C, H, W)`` tensor is, in memory, the contiguous ``(N·H·W, C)`` matrix whose rows are
its pixels, so ``permute → layer_norm(C) → permute`` (ConvNeXt's ``LayerNorm2d``, and its blocks'
LayerNorm after the depthwise conv) is a LayerNorm over contiguous rows of C: ``rows_layer_norm``
reads each row once, adds a per-channel ``pre_bias`` first where given (the bias of the convolution
before it, which then runs without its bias: ATen adds a cuDNN conv's bias as a pass of its own),
reduces mean and variance in fp32 and writes ``γ·x̂ + β`` (or ``x̂`` alone, where the affine is folded
into the next layer) rounded once. ``rows_layer_norm_reference`` is the unfused computation;
``LAYER_NORM_TOLERANCES`` its error model.

One program holds ``ROWS`` whole rows, each as chunks of a power-of-two number of channels that divides C
(``rows_tile``: masked whole chunks keep the loads 16-byte vectors; ConvNeXt's C = 3·2^k is 3 chunks of
2^k): about 2048 fp32 values over 4 warps; rows of 2048 or more get 8 warps and one row each. Under the
interpreter, few large programs. The launch is planned once per call signature (``PLANS``), so that a call
costs the host a dictionary look-up, one allocation and the launch.
"""

from __future__ import annotations

import functools

import torch

from explorer.fusions.kernels.common import PLANS, TRITON_DTYPES, LaunchPlan
from explorer.fusions.triton_support import (import_triton, interpreting, jit_helpers, launch,
                                             library_reductions_usable, next_power_of_2, remember, triton_runs_on)

#: Widest row one program holds.
MAX_CHANNELS = 16384

#: ``rows_layer_norm`` against float64 from the same inputs, for unit-scale rows: mean and variance in
#: fp32 over C terms (≪ u), the normalised value computed in fp32 and rounded once (u·|out|); the
#: pre-bias is added in fp32 to the input as stored (the unfused conv rounds x + b once more: within
#: the same u). rtol 2u, atol 4u for 16-bit (outputs near 0 after the shift β); fp32 1e-5 (rsqrt's and the
#: variance's fp32 error times |x̂| up to ~4).
LAYER_NORM_TOLERANCES = {
    torch.float32: dict(rtol=1e-5, atol=1e-5),
    torch.float16: dict(rtol=1e-3, atol=2e-3),      # 2u, 4u
    torch.bfloat16: dict(rtol=8e-3, atol=1.6e-2),   # 2u, 4u
}


def rows_layer_norm_reference(x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None, eps: float,
                              pre_bias: torch.Tensor | None = None) -> torch.Tensor:
    """``layer_norm(x + pre_bias)`` over the last dim, unfused (any dtype: float64 for test references)."""
    if pre_bias is not None:
        x = x + pre_bias
    return torch.nn.functional.layer_norm(x, (x.shape[-1],), weight, bias, eps)


@functools.lru_cache(maxsize=2)
def _build_kernel(interpret: bool):
    """Define the row LayerNorm kernel (imports Triton); cached per interpreter mode (``triton.jit`` reads
    TRITON_INTERPRET when it decorates). ``tl``, ``_add`` and ``_round`` are module globals, as Triton resolves
    a kernel's names through its module."""
    global tl, _add, _round
    triton, tl = import_triton()
    helpers = jit_helpers(interpret)
    _add, _round = helpers.add, helpers.round_to

    @triton.jit
    def _rows_layer_norm_kernel(
        X, PRE, W, B, Y,                              # x, y: (M, C) contiguous; pre, w, b: (C,); unused alias X
        M, eps,
        C: tl.constexpr, CHUNK: tl.constexpr, CHUNKS: tl.constexpr, ROWS: tl.constexpr, HAS_PRE: tl.constexpr,
        HAS_W: tl.constexpr, HAS_B: tl.constexpr, LIBRARY_REDUCE: tl.constexpr,
        BF16_RTNE_BY_HAND: tl.constexpr,
    ):
        # A row of C is CHUNKS chunks of CHUNK contiguous channels (a (ROWS, CHUNKS, CHUNK) tile; chunks at or
        # beyond C masked whole): with CHUNK a power of two dividing C, every live chunk is whole, so the loads
        # and stores stay 16-byte vectors where a (ROWS, next_pow2(C)) tile masked at C would not be.
        rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)[:, None, None]   # (ROWS, 1, 1)
        chunk = tl.arange(0, CHUNKS)[None, :, None]                                      # (1, CHUNKS, 1)
        cols = chunk * CHUNK + tl.arange(0, CHUNK)[None, None, :]                        # (1, CHUNKS, CHUNK)
        in_row = cols < C
        live = (rows < M) & in_row                                                       # (ROWS, CHUNKS, CHUNK)
        v = tl.load(X + rows * C + cols, mask=live, other=0.0, eviction_policy="evict_first").to(tl.float32)
        # the per-channel vectors loaded as whole tiles in x's layout (a (1, CHUNKS, CHUNK) load takes a layout of
        # its own: scalar loads and a trip through shared memory); they are L1 hits after the first row
        vec = cols + rows * 0                                                            # (ROWS, CHUNKS, CHUNK)
        if HAS_PRE:
            v += tl.load(PRE + vec, mask=live, other=0.0, eviction_policy="evict_last").to(tl.float32)
        if HAS_W:                                     # issued with the rows: their latency overlaps the sums
            w = tl.load(W + vec, mask=live, other=0.0, eviction_policy="evict_last").to(tl.float32)
        if HAS_B:
            b = tl.load(B + vec, mask=live, other=0.0, eviction_policy="evict_last").to(tl.float32)
        if LIBRARY_REDUCE:
            mean = tl.sum(tl.sum(v, axis=2), axis=1) / C                                # (ROWS,)
        else:
            mean = tl.reduce(tl.reduce(v, 2, _add), 1, _add) / C
        d = tl.where(in_row, v - mean[:, None, None], 0.0)                              # dead lanes add nothing
        if LIBRARY_REDUCE:
            var = tl.sum(tl.sum(d * d, axis=2), axis=1) / C
        else:
            var = tl.reduce(tl.reduce(d * d, 2, _add), 1, _add) / C
        y = d * (1.0 / tl.sqrt(var + eps))[:, None, None]
        if HAS_W:
            y = y * w
        if HAS_B:
            y = y + b
        tl.store(Y + rows * C + cols, _round(y, Y.dtype.element_ty, BF16_RTNE_BY_HAND), mask=live)

    return _rows_layer_norm_kernel


def rows_tile(channels: int, rows: int, device: torch.device) -> tuple[int, int, int, int]:
    """``(ROWS, CHUNK, CHUNKS, num_warps)``: a row is ``CHUNKS`` chunks of ``CHUNK`` channels, CHUNK the largest
    power of two up to 256 dividing C where that is at least 8 (ConvNeXt's C = 3·2^k: 3 live chunks of 4),
    else one chunk of next_pow2(C); about 2048 values per program over 4 warps (one row and 8+ warps from 2048
    lanes up); interpreted, up to 65536 values per program."""
    chunk = min(256, channels & -channels)
    if chunk < 8:
        chunk = next_power_of_2(channels)
    chunks = next_power_of_2(-(-channels // chunk))
    lanes = chunk * chunks
    if device.type != "cuda":
        return max(1, min(next_power_of_2(rows), 65536 // lanes)), chunk, chunks, 4
    if lanes >= 2048:
        return 1, chunk, chunks, 8 if lanes <= 8192 else 16
    return 2048 // lanes, chunk, chunks, 4


def rows_layer_norm_applies(x: torch.Tensor, *vectors: torch.Tensor | None) -> bool:
    """Whether the kernel takes ``x`` (contiguous, fp32/fp16/bf16, rows of 1..``MAX_CHANNELS``, on a device
    Triton runs on) and the per-channel vectors (C elements each, contiguous, on x's device, float)."""
    c = x.shape[-1] if x.dim() else 0
    return (x.dtype in TRITON_DTYPES and 0 < c <= MAX_CHANNELS and x.is_contiguous() and x.numel() > 0
            and triton_runs_on(x.device)
            and all(v is None or (v.numel() == c and v.is_contiguous() and v.device == x.device
                                  and v.dtype.is_floating_point) for v in vectors))


def _plan(x: torch.Tensor, weight, bias, pre_bias) -> LaunchPlan:
    """Decide whether the kernel runs for this signature (``out_shape`` "fallback": the reference) and
    plan its launch: the grid, the row count and the constexprs."""
    if not rows_layer_norm_applies(x, weight, bias, pre_bias):
        return LaunchPlan(out_shape="fallback")
    c = x.shape[-1]
    m = x.numel() // c
    per_program, chunk, chunks, warps = rows_tile(c, m, x.device)
    interpret = interpreting()
    constexprs = dict(C=c, CHUNK=chunk, CHUNKS=chunks, ROWS=per_program, HAS_PRE=pre_bias is not None,
                      HAS_W=weight is not None, HAS_B=bias is not None, LIBRARY_REDUCE=library_reductions_usable(),
                      BF16_RTNE_BY_HAND=interpret and x.dtype == torch.bfloat16)
    return LaunchPlan(_build_kernel(interpret), (-(-m // per_program),), (m,), constexprs, warps)


def _key(x, weight, bias, eps, pre_bias) -> tuple:
    """What a call's plan depends on: x's shape, dtype, device and contiguity, the vectors' presence and
    dtypes, eps, the interpreter mode, and which pointers are 16-byte aligned (Triton specialises on it)."""
    return ("rows-ln", x.shape, x.dtype, x.device, x.is_contiguous(), x.data_ptr() & 15,
            None if weight is None else (weight.dtype, weight.data_ptr() & 15),
            None if bias is None else (bias.dtype, bias.data_ptr() & 15),
            None if pre_bias is None else (pre_bias.dtype, pre_bias.data_ptr() & 15), eps, x.is_cuda or interpreting())


def rows_layer_norm(x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None, eps: float,
                    pre_bias: torch.Tensor | None = None) -> torch.Tensor:
    """``layer_norm(x + pre_bias, (C,), weight, bias, eps)`` over the last dim of ``x`` ``(..., C)``: ONE Triton
    pass where ``rows_layer_norm_applies`` (x contiguous), else the reference. A new contiguous output of x's
    shape and dtype. Planned once per call signature; the per-call path is the look-up, the output and the launch.
    """
    key = _key(x, weight, bias, eps, pre_bias)
    plan = PLANS.get(key)
    if plan is None:
        plan = remember(PLANS, key, _plan(x, weight, bias, pre_bias))
    if plan.out_shape == "fallback":
        return rows_layer_norm_reference(x, weight, bias, eps, pre_bias)
    out = _new_output(x.shape, x.dtype, x.device)
    launch(plan.kernel, plan.grid, (x, x if pre_bias is None else pre_bias, x if weight is None else weight,
                                    x if bias is None else bias, out, *plan.ints, eps),
           plan.constexprs, key=key, num_warps=plan.num_warps)
    return out


def _new_output(shape, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A new contiguous output the kernel fully overwrites (tests replace this to poison it)."""
    return torch.empty(shape, dtype=dtype, device=device)


def channels_layer_norm(x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None, eps: float,
                        pre_bias: torch.Tensor | None = None) -> torch.Tensor:
    """ConvNeXt's ``LayerNorm2d`` of ``x`` ``(N, C, H, W)``: ``layer_norm`` over C at every pixel (after
    ``+ pre_bias[c]``), as ``(N, H, W, C)`` contiguous, exactly what ``permute(0, 2, 3, 1) → layer_norm``
    returns. One pass where ``x`` is channels_last (its permute is then the contiguous rows), else the reference.
    """
    return rows_layer_norm(x.permute(0, 2, 3, 1), weight, bias, eps, pre_bias)
