"""A Triton GEMM with its epilogue (bias, residual, activation added to the fp32 accumulator before one store).

Used by the convolution family (1×1 convolutions over channels_last inputs) and
ConvNeXt's MLP. Its reference is the unfused ``x @ Wᵀ + b (+ z)`` then the
activation; its tolerances are the epilogue's (``explorer.fusions.epilogue``).
"""

from __future__ import annotations

import functools

import torch

from explorer.fusions.epilogue import (EPILOGUE_TOLERANCES, TRITON_ACTIVATIONS, check, triton_activation,
                                       triton_round_bf16)
from explorer.fusions.kernels.common import PLANS, TRITON_DTYPES, LaunchPlan
from explorer.fusions.triton_support import (import_triton, interpreting, launch, next_power_of_2, planned, remember,
                                             triton_runs_on)

EPILOGUE_ACTIVATIONS = TRITON_ACTIVATIONS
TOLERANCES = EPILOGUE_TOLERANCES


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


def gemm_plan(key: tuple, a: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, z: torch.Tensor | None,
              act: str, m: int, k: int, a_strides: tuple[int, int], z_strides: tuple[int, int] | None,
              out_strides: tuple[int, int], tiles: tuple[int, ...] | None = None) -> LaunchPlan:
    """The launch of ``gemm_epilogue``'s kernel for a call signature ``key`` (planned once, then reused).

    ``a`` is read as an ``(m, k)`` matrix through ``a_strides`` (row, column), ``z`` (when given) and the
    output as ``(m, N)`` through theirs: a channels_last ``(N, C, H, W)`` tensor is the ``(N·H·W, C)``
    matrix with strides ``(C, 1)``, no view needed. ``weight``: ``(N, k)`` through its own strides.
    """
    plan = PLANS.get(key)
    if plan is not None:
        return plan
    check(act, EPILOGUE_ACTIVATIONS)
    n = weight.shape[0]
    block_m, block_n, block_k, warps, stages = gemm_config(m, n, k, a.element_size(), a.device)
    if tiles is not None:                       # (BLOCK_M, BLOCK_N, BLOCK_K[, num_warps, num_stages])
        block_m, block_n, block_k = tiles[:3]
        if len(tiles) == 5:
            warps, stages = tiles[3:]
    interpret = interpreting()
    grid = (-(-m // block_m) * -(-n // block_n),)
    plan = LaunchPlan(_build_gemm_kernel(interpret), grid,
                 (m, n, k, *a_strides, weight.stride(0), weight.stride(1),
                  *(z_strides if z is not None else (0, 0)), *out_strides),
                 _gemm_constexprs(a.dtype, bias, z, act, block_m, block_n, block_k, interpret),
                 warps, num_stages=stages)
    return remember(PLANS, key, plan)


def gemm_launch(plan: LaunchPlan, key: tuple, a: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
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
