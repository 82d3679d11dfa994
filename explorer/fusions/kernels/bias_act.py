"""The epilogue pass: ``y = act(y + bias[c] (+ z))`` in place, one vectorised Triton kernel, beside its reference.

Used after a convolution without its bias (the convolution family's
``triton_epilogue`` path) and by ConvNeXt's block. ``bias_act_reference`` is the
unfused computation out of place; ``BIAS_ACT_TOLERANCES`` holds the error model.
"""

from __future__ import annotations

import functools

import torch

from explorer.fusions.epilogue import (TRITON_ACTIVATIONS, apply_activation, apply_activation_, check,
                                       triton_activation, triton_round_bf16)
from explorer.fusions.kernels.common import (LAYOUTS, PLANS, TRITON_DTYPES, LaunchPlan, channel_view, layout_of,
                                             layouts_coincide, sm_count, to_layout)
from explorer.fusions.triton_support import import_triton, interpreting, launch, operand_key, planned, triton_runs_on

#: Activations the pass applies.
EPILOGUE_ACTIVATIONS = TRITON_ACTIVATIONS

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


def bias_act_reference(y: torch.Tensor, bias: torch.Tensor | None, z: torch.Tensor | None = None,
                       act: str = "relu") -> torch.Tensor:
    """The epilogue alone, unfused and out of place: ``act(y + bias[c] (+ z))``."""
    check(act, EPILOGUE_ACTIVATIONS)
    out = y if bias is None else y + channel_view(bias, y.dim())           # (N, C, *spatial)
    if z is not None:
        out = out + z                                                       # (N, C, *spatial)
    return apply_activation(out, act)


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


def plan_bias_act(y, bias, z, act, block=None, num_warps=None) -> LaunchPlan:
    """Decide whether the epilogue kernel runs for these operands, and prepare its launch (``kernel`` None: the
    torch ops run instead); callers that plan a whole step launch it themselves (``convnext.project_residual``)."""
    _check_epilogue_operands(y, bias, z)
    layout = layout_of(y)
    if (layout not in LAYOUTS or y.dtype not in TRITON_DTYPES or not triton_runs_on(y.device) or y.numel() == 0
            or any(t is not None and not t.dtype.is_floating_point for t in (bias, z))):
        return LaunchPlan()
    z_layout = None
    z_channels_last = layout == "nhwc"
    if z is not None:
        zl = layout_of(z)
        if zl is None:
            z_layout = layout                                       # copied into y's layout on each call
        elif zl != layout and not layouts_coincide(y):
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
    return LaunchPlan(_build_bias_act_kernel(interpret), (-(-numel // block),), (numel,), constexprs,
                 num_warps or auto_warps, z_layout)


def bias_act_torch_(y, bias, z, act) -> torch.Tensor:
    """The same maths as in-place torch ops: ``y += b``, ``y += z``, ``act_(y)``, one kernel each."""
    if bias is not None:
        y.add_(channel_view(bias, y.dim()))
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
    ``act``: one of ``EPILOGUE_ACTIVATIONS``. One vectorised Triton pass where Triton runs
    on ``y``'s device (CUDA, or the CPU under ``TRITON_INTERPRET=1``); anything else (other
    dtypes or layouts, no Triton) runs the same maths as in-place torch ops.
    ``block``/``num_warps`` override the launch heuristic (for tuning).

    The launch is planned once per call signature (dtypes, shapes, strides, alignment)
    and reused: a model makes the same calls on every forward.
    """
    check(act, EPILOGUE_ACTIVATIONS)
    key = (operand_key(y), operand_key(bias), operand_key(z), act, block, num_warps, y.is_cuda or interpreting())
    plan = planned(PLANS, key, plan_bias_act, y, bias, z, act, block, num_warps)
    if plan.kernel is None:
        _check_epilogue_operands(y, bias, z)
        return bias_act_torch_(y, bias, z, act)
    if plan.z_layout is not None:
        z = to_layout(z, plan.z_layout)
    if bias is not None and not bias.is_contiguous():
        bias = bias.contiguous()
    launch(plan.kernel, plan.grid, (y, y if bias is None else bias, y if z is None else z, *plan.ints),
           plan.constexprs, key=key, num_warps=plan.num_warps)
    return y
