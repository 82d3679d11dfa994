"""A Triton GEMM that applies an activation to its input as it loads it: ``act(a) @ Wᵀ + b (+ z)``, one kernel.

ConvNeXt's MLP is ``fc2(GELU(fc1(t))) + x``. cuBLAS has no exact-GELU epilogue (cuBLASLt's is the tanh
approximation), so after cuBLAS's fc1 the exact GELU is a pass of its own: it reads and writes the
4C-wide hidden activation, the largest tensor of the block. Here the second GEMM reads fc1's output as
cuBLAS wrote it and applies the GELU to each tile of it on the way to the tensor cores, rounding it to
the input dtype exactly where the unfused graph stores it; the bias and the residual are added to the
fp32 accumulator before the one store. The pass is gone, and fc1 stays on cuBLAS. Inductor keeps the
GELU as a pointwise kernel of its own there (it fuses pointwise ops into GEMM epilogues, not prologues,
outside its Triton templates).

``gemm_act_prologue_reference`` is the unfused computation; the tolerances are the epilogue's
(``explorer.fusions.epilogue.EPILOGUE_TOLERANCES``): the GELU output is rounded once, as stored, then
an fp32-accumulated GEMM rounds once more. Each A element is activated once per column tile of the
output (N / BLOCK_N times): ConvNeXt's fc2 has N = C, one to six tiles.
"""

from __future__ import annotations

import functools

import torch

from explorer.fusions.epilogue import (EPILOGUE_TOLERANCES, TRITON_ACTIVATIONS, apply_activation, check,
                                       triton_activation, triton_round_bf16)
from explorer.fusions.kernels.common import PLANS, TRITON_DTYPES, LaunchPlan
from explorer.fusions.kernels.gemm import grouped_tile
from explorer.fusions.triton_support import (import_triton, interpreting, launch, next_power_of_2, remember,
                                             triton_runs_on)

PROLOGUE_ACTIVATIONS = TRITON_ACTIVATIONS
TOLERANCES = EPILOGUE_TOLERANCES


def gemm_act_prologue_reference(a: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                                z: torch.Tensor | None, act: str) -> torch.Tensor:
    """Unfused: ``act(a)``, then ``linear`` and ``+ z`` (any float dtype; float64 for test references)."""
    check(act, PROLOGUE_ACTIVATIONS)
    y = torch.nn.functional.linear(apply_activation(a, act), weight, bias)
    return y if z is None else y + z


@functools.lru_cache(maxsize=2)
def _build_kernel(interpret: bool):
    """Define the GEMM with the activation prologue (imports Triton); cached per interpreter mode."""
    global tl, _activation, _round_for, _tile
    _activation, _round_for, _tile = triton_activation(interpret), triton_round_bf16(interpret), grouped_tile(interpret)
    triton, tl = import_triton()

    @triton.jit
    def _gemm_act_prologue_kernel(
        A, W, BIAS, Z, C,                          # a (M, K), w (N, K), bias (N,), z and c (M, N); unused alias A
        M, N, K, sam, sak, swn, swk, szm, szn, scm, scn,
        HAS_BIAS: tl.constexpr, HAS_Z: tl.constexpr, ACT_IN: tl.constexpr, BLOCK_M: tl.constexpr,
        BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr, DOT_PRECISION: tl.constexpr,
        BF16_RTNE_BY_HAND: tl.constexpr,
    ):
        pid_m, pid_n = _tile(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)
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
            # the activation in fp32, rounded to the input dtype where the unfused graph stores it
            # (act(0) = 0 for the masked lanes of every activation here but sigmoid/hardsigmoid: masked k
            # lanes meet zero weights, masked rows are never stored)
            h = _round_for(_activation(a.to(tl.float32), ACT_IN), BF16_RTNE_BY_HAND)
            if BF16_RTNE_BY_HAND:  # bf16 in the interpreter only: its tl.dot misreads bf16; products are exact
                a = h.to(A.dtype.element_ty).to(tl.float32)  # in fp32 (tensor-core arithmetic)
                w = w.to(tl.float32)
            else:
                a = h.to(A.dtype.element_ty, fp_downcast_rounding="rtne")
            acc = tl.dot(a, w, acc, input_precision=DOT_PRECISION)        # fp32 accumulation
            a_ptr += BLOCK_K * sak
            w_ptr += BLOCK_K * swk
        if HAS_BIAS:
            acc += tl.load(BIAS + rn, mask=n_live, other=0.0).to(tl.float32)[None, :]
        live = m_live[:, None] & n_live[None, :]
        rows = rm[:, None].to(tl.int64)
        if HAS_Z:
            acc += tl.load(Z + rows * szm + rn[None, :] * szn, mask=live, other=0.0).to(tl.float32)
        acc = _round_for(acc, BF16_RTNE_BY_HAND)
        tl.store(C + rows * scm + rn[None, :] * scn, acc.to(C.dtype.element_ty, fp_downcast_rounding="rtne"),
                 mask=live)

    return _gemm_act_prologue_kernel


def prologue_config(m: int, n: int, k: int, element_size: int, device: torch.device) -> tuple[int, int, int, int, int]:
    """``(BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages)``: BLOCK_N covers N up to 128 (each A tile is then
    loaded and activated once per 128 output columns), BLOCK_K 64 (32 for fp32), BLOCK_M 128 (64 for short M),
    8 warps for 128×128 tiles, 3 stages; the interpreter's tiles as large as the matrices allow."""
    if device.type != "cuda":
        return (min(256, max(16, next_power_of_2(m))), min(512, max(16, next_power_of_2(n))),
                min(128, max(16, next_power_of_2(k))), 4, 1)
    block_n = min(128, max(16, next_power_of_2(n)))
    block_k = min(64 if element_size <= 2 else 32, max(16, next_power_of_2(k)))
    block_m = 128 if m >= 4096 else 64
    return block_m, block_n, block_k, 8 if block_m * block_n >= 128 * 128 else 4, 3


def gemm_act_prologue_applies(a: torch.Tensor, weight: torch.Tensor, z: torch.Tensor | None = None) -> bool:
    """Whether the kernel takes ``a`` (M, K), ``weight`` (N, K) and ``z`` (M, N): one dtype of fp32/fp16/bf16
    for a and the weight, one device Triton runs on, K ≥ 1."""
    return (a.dim() == 2 and weight.dim() == 2 and a.shape[1] == weight.shape[1] and a.dtype == weight.dtype
            and a.dtype in TRITON_DTYPES and a.device == weight.device and triton_runs_on(a.device)
            and a.shape[1] > 0 and (z is None or (z.device == a.device and z.dtype.is_floating_point
                                                  and tuple(z.shape) == (a.shape[0], weight.shape[0]))))


def prologue_plan(key: tuple, a: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                  z_strides: tuple[int, int] | None, out_strides: tuple[int, int], act: str,
                  tiles: tuple[int, ...] | None = None) -> LaunchPlan:
    """The launch for a call signature ``key`` (planned once, kept in ``PLANS``): ``a`` ``(M, K)`` through its
    strides, the residual and the output ``(M, N)`` through theirs (a channels_last ``(N, C, H, W)`` tensor is
    the ``(N·H·W, C)`` matrix of strides ``(C, 1)``)."""
    plan = PLANS.get(key)
    if plan is not None:
        return plan
    check(act, PROLOGUE_ACTIVATIONS)
    m, k = a.shape
    n = weight.shape[0]
    block_m, block_n, block_k, warps, stages = prologue_config(m, n, k, a.element_size(), a.device)
    if tiles is not None:                       # (BLOCK_M, BLOCK_N, BLOCK_K[, num_warps, num_stages])
        block_m, block_n, block_k = tiles[:3]
        if len(tiles) == 5:
            warps, stages = tiles[3:]
    interpret = interpreting()
    constexprs = dict(HAS_BIAS=bias is not None, HAS_Z=z_strides is not None, ACT_IN=act, BLOCK_M=block_m,
                      BLOCK_N=block_n, BLOCK_K=block_k, GROUP_M=8,
                      DOT_PRECISION="ieee" if a.dtype == torch.float32 or (interpret and a.dtype == torch.bfloat16)
                      else "tf32", BF16_RTNE_BY_HAND=interpret and a.dtype == torch.bfloat16)
    plan = LaunchPlan(_build_kernel(interpret), (-(-m // block_m) * -(-n // block_n),),
                      (m, n, k, *a.stride(), *weight.stride(), *(z_strides or (0, 0)), *out_strides), constexprs,
                      warps, num_stages=stages)
    return remember(PLANS, key, plan)


def prologue_launch(plan: LaunchPlan, key: tuple, a, weight, bias, z, out) -> torch.Tensor:
    """Launch a ``prologue_plan`` on these tensors (the ones its signature describes); returns ``out``."""
    if plan.grid[0] == 0:
        return out
    pointers = (a, weight, a if bias is None else bias, a if z is None else z, out)
    launch(plan.kernel, plan.grid, (*pointers, *plan.ints), plan.constexprs,
           key=(key, tuple(t.data_ptr() & 15 == 0 for t in pointers)), num_warps=plan.num_warps,
           num_stages=plan.num_stages)
    return out


def gemm_act_prologue(a: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, z: torch.Tensor | None = None,
                      act: str = "gelu", out: torch.Tensor | None = None, *,
                      tiles: tuple[int, ...] | None = None) -> torch.Tensor:
    """``act(a) @ weightᵀ + bias (+ z)`` as ONE Triton kernel (callers check ``gemm_act_prologue_applies``).

    ``a``: ``(M, K)`` (any strides); ``weight``: ``(N, K)``; ``bias``: ``(N,)`` or None; ``z``: ``(M, N)`` or
    None, any strides and float dtype. Writes ``out`` (``(M, N)``, any strides; default a new contiguous
    tensor) and returns it. ``tiles`` overrides ``prologue_config`` (tests, benchmarks).
    """
    m = a.shape[0]
    n = weight.shape[0]
    if out is None:
        out = torch.empty((m, n), dtype=a.dtype, device=a.device)
    if m == 0 or n == 0:
        return out
    key = ("gemm-prologue", a.shape, a.stride(), a.dtype, a.device, weight.shape, weight.stride(),
           None if bias is None else bias.dtype, None if z is None else (z.dtype, z.stride()), out.stride(), act,
           tiles, a.is_cuda or interpreting())
    plan = prologue_plan(key, a, weight, bias, None if z is None else z.stride(), out.stride(), act, tiles)
    return prologue_launch(plan, key, a, weight, bias, z, out)
