"""A Triton GEMM with its epilogue (bias, residual, activation added to the fp32 accumulator before one store).

Used by the convolution family (1×1 convolutions over channels_last inputs) and
ConvNeXt's MLP. Its reference is the unfused ``x @ Wᵀ + b (+ z)`` then the
activation; its tolerances are the epilogue's (``explorer.fusions.epilogue``).

The LLM epilogues (the swiglu and rotary families) add GEMMs whose epilogue
combines two columns of the product before the store: ``gemm_swiglu`` (gate and up
columns in two accumulators over one A tile), ``gemm_swiglu_interleaved`` (gate/up
rows interleaved once at plan time, one accumulator split in registers) and
``gemm_qkv_rotary`` (both halves of whole heads: q and k rotated, stored as
(B, H, S, D)). Their tolerances against float64 are ``PAIRED_TOLERANCES``.
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
def grouped_tile(interpret: bool):
    """The Triton helper ``_tile(pid, M, N, BLOCK_M, BLOCK_N, GROUP_M) -> (pid_m, pid_n)`` every GEMM here uses:
    programs walk the output tiles in groups of ``GROUP_M`` row tiles, column after column, so that a group's
    row tiles share the weight tiles they read while those are still in L2."""
    global tl
    del interpret
    triton, tl = import_triton()

    @triton.jit
    def _tile(pid, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
        tiles_m, tiles_n = tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N)
        per_group = GROUP_M * tiles_n                  # GROUP_M row tiles share their weight tiles in L2
        first_m = (pid // per_group) * GROUP_M
        rows_here = tl.minimum(tiles_m - first_m, GROUP_M)
        return first_m + (pid % per_group) % rows_here, (pid % per_group) // rows_here

    return _tile


@functools.lru_cache(maxsize=2)
def _build_gemm_kernel(interpret: bool):
    """Define the GEMM with its epilogue (imports Triton); cached per interpreter mode."""
    global tl, _activation, _round_for, _tile
    _activation, _round_for, _tile = triton_activation(interpret), triton_round_bf16(interpret), grouped_tile(interpret)
    triton, tl = import_triton()

    @triton.jit
    def _gemm_epilogue_kernel(
        A, W, BIAS, Z, C,                          # a (M, K), w (N, K), bias (N,), z and c (M, N); unused alias A
        M, N, K, sam, sak, swn, swk, szm, szn, scm, scn,
        HAS_BIAS: tl.constexpr, HAS_Z: tl.constexpr, ACT: tl.constexpr, BLOCK_M: tl.constexpr,
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


# ====================================================================== paired-column GEMMs (LLM epilogues)
#
# One program computes two (BLOCK_M × BLOCK_N) accumulators over the same A tile: columns ``col1`` and their
# partners ``col2`` of ``a @ weightᵀ``. The epilogue combines each pair before the store:
#   "swiglu": weight = [W_gate; W_up] (2I, K); pair n = (gate n, up n); writes silu(g)·u to an (M, I) output:
#             the (M, 2I) product never reaches memory.
#   "rotary": weight = [W_q; W_k; W_v] ((Hq+2Hkv)·D, K); pair n = (column d, column d + D/2) of head n // (D/2);
#             q's and k's heads are rotated with the row's cos/sin and stored straight into (B, H, S, D)
#             tensors (the layout apply_rotary_pos_emb returns: the model's view and transpose are folded
#             into the store), v's stored plain into its own (M, Hkv·D) rows, as v_proj wrote them.

PAIRED_EPILOGUES = ("swiglu", "rotary")

#: Paired GEMM vs float64 (the unfused computation on upcast inputs), ``|out - ref| <= atol + rtol·|ref|``, for
#: unit-scale a and weights ~ N(0, 1/K), |cos|, |sin| <= 1. 16-bit inputs: their products are exact in fp32 and
#: the fp32 sums err by ~K·6e-8 of the sum of |terms| (<= 1e-6 absolute here); the epilogue's silu·u or rotation
#: adds a few fp32 ulps; then ONE rounding to the dtype (<= u relative): rtol = 1.5u (fp16 4.9e-4, bf16 3.9e-3),
#: atol 1e-5 for the fp32 part near zero. fp32 (no TF32): the same sums, no final rounding beyond fp32: 1e-5 both.
#: The unfused model rounds the GEMM's output before silu·u or the rotation (a second rounding): against eager
#: in the dtype, ``EPILOGUE_TOLERANCES``.
PAIRED_TOLERANCES = {
    torch.float32: dict(rtol=1e-5, atol=1e-5),
    torch.float16: dict(rtol=7.3e-4, atol=1e-5),     # 1.5u
    torch.bfloat16: dict(rtol=5.9e-3, atol=1e-5),    # 1.5u
}


def _new_output(shape, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """An output the paired kernel fully overwrites (tests replace this to poison it)."""
    return torch.empty(shape, dtype=dtype, device=device)


@functools.lru_cache(maxsize=2)
def _build_paired_kernel(interpret: bool):
    """Define the paired-column GEMM (imports Triton); cached per interpreter mode."""
    global tl, _round_for, _tile
    _round_for, _tile = triton_round_bf16(interpret), grouped_tile(interpret)
    triton, tl = import_triton()

    @triton.jit
    def _paired_gemm_kernel(
        A, W, BIAS, C, QO, KO, COS, SIN,           # a (M, K), w (N, K), bias (N,), c (swiglu; rotary: v), q, k out
        M, NP, K, sam, sak, swn, swk, scm, scn,    # NP: column pairs
        PAIR_OFF, S, HQ, HKV, sq_b, sq_h, sq_s, sk_b, sk_h, sk_s, scos_b, scos_s, ssin_b, ssin_s,
        EPI: tl.constexpr, HALF: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr,
        BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr, DOT_PRECISION: tl.constexpr,
        BF16_RTNE_BY_HAND: tl.constexpr,
    ):
        pid_m, pid_n = _tile(tl.program_id(0), M, NP, BLOCK_M, BLOCK_N, GROUP_M)
        rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)                       # (BM,) output rows
        rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)                       # (BN,) column pairs
        if EPI == "swiglu":
            col1 = rn                                                      # gate column
            col2 = rn + PAIR_OFF                                           # up column
        else:
            col1 = (rn // HALF) * (2 * HALF) + rn % HALF                   # head's first half
            col2 = col1 + HALF                                             # its second half
        rk = tl.arange(0, BLOCK_K)
        m_live, n_live = rm < M, rn < NP
        a_ptr = A + rm[:, None].to(tl.int64) * sam + rk[None, :] * sak    # (BM, BK)
        w1_ptr = W + col1[None, :] * swn + rk[:, None] * swk              # (BK, BN): w[col1]ᵀ
        w2_ptr = W + col2[None, :] * swn + rk[:, None] * swk              # (BK, BN): w[col2]ᵀ
        acc1 = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        acc2 = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            k_live = k0 + rk < K
            a = tl.load(a_ptr, mask=m_live[:, None] & k_live[None, :], other=0.0)
            w1 = tl.load(w1_ptr, mask=k_live[:, None] & n_live[None, :], other=0.0, eviction_policy="evict_last")
            w2 = tl.load(w2_ptr, mask=k_live[:, None] & n_live[None, :], other=0.0, eviction_policy="evict_last")
            if BF16_RTNE_BY_HAND:  # bf16 in the interpreter only (see _gemm_epilogue_kernel)
                a = a.to(tl.float32)
                w1 = w1.to(tl.float32)
                w2 = w2.to(tl.float32)
            acc1 = tl.dot(a, w1, acc1, input_precision=DOT_PRECISION)     # fp32 accumulation
            acc2 = tl.dot(a, w2, acc2, input_precision=DOT_PRECISION)
            a_ptr += BLOCK_K * sak
            w1_ptr += BLOCK_K * swk
            w2_ptr += BLOCK_K * swk
        if HAS_BIAS:
            acc1 += tl.load(BIAS + col1, mask=n_live, other=0.0).to(tl.float32)[None, :]
            acc2 += tl.load(BIAS + col2, mask=n_live, other=0.0).to(tl.float32)[None, :]
        live = m_live[:, None] & n_live[None, :]
        rows = rm[:, None].to(tl.int64)
        if EPI == "swiglu":
            out = acc1 / (1.0 + tl.exp(-acc1)) * acc2                      # silu(g)·u in fp32
            out = _round_for(out, BF16_RTNE_BY_HAND)
            tl.store(C + rows * scm + rn[None, :] * scn, out.to(C.dtype.element_ty, fp_downcast_rounding="rtne"),
                     mask=live)
        else:
            b = rows // S                                                  # (BM, 1): the row's batch and position
            s = rows - b * S
            h = (rn // HALF)[None, :]                                      # (1, BN): head of q, then k, then v
            d = (rn % HALF)[None, :]
            is_q = live & (h < HQ)
            is_k = live & (h >= HQ) & (h < HQ + HKV)
            is_v = live & (h >= HQ + HKV)
            rot = is_q | is_k
            c = COS + b * scos_b + s * scos_s + d
            sn = SIN + b * ssin_b + s * ssin_s + d
            c1 = tl.load(c, mask=rot, other=1.0).to(tl.float32)
            c2 = tl.load(c + HALF, mask=rot, other=1.0).to(tl.float32)
            s1 = tl.load(sn, mask=rot, other=0.0).to(tl.float32)
            s2 = tl.load(sn + HALF, mask=rot, other=0.0).to(tl.float32)
            o1 = _round_for(acc1 * c1 - acc2 * s1, BF16_RTNE_BY_HAND)      # cos 1, sin 0 on v's columns: plain
            o2 = _round_for(acc2 * c2 + acc1 * s2, BF16_RTNE_BY_HAND)
            o1 = o1.to(C.dtype.element_ty, fp_downcast_rounding="rtne")
            o2 = o2.to(C.dtype.element_ty, fp_downcast_rounding="rtne")
            q_ptr = QO + b * sq_b + h * sq_h + s * sq_s + d                # (B, Hq, S, D)
            tl.store(q_ptr, o1, mask=is_q)
            tl.store(q_ptr + HALF, o2, mask=is_q)
            k_ptr = KO + b * sk_b + (h - HQ) * sk_h + s * sk_s + d         # (B, Hkv, S, D)
            tl.store(k_ptr, o1, mask=is_k)
            tl.store(k_ptr + HALF, o2, mask=is_k)
            v_ptr = C + rows * scm + ((h - HQ - HKV) * (2 * HALF) + d) * scn   # (M, Hkv·D)
            tl.store(v_ptr, o1, mask=is_v)
            tl.store(v_ptr + HALF * scn, o2, mask=is_v)

    return _paired_gemm_kernel


def paired_config(m: int, pairs: int, k: int, element_size: int, device: torch.device,
                  half: int | None = None) -> tuple[int, int, int, int, int]:
    """``(BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages)`` of a paired GEMM: BLOCK_N column pairs, so the
    tile computes 2·BLOCK_N columns. On CUDA 128 × 64 pairs × 64 (a 128 × 128 output tile's registers), 8
    warps, 4 stages (3 in fp32); for rotary BLOCK_N is a multiple of D/2, so a tile covers whole heads.
    Under the interpreter, as large as the matrices allow (its cost is per program and operation)."""
    if device.type != "cuda":
        block_n = min(512, max(16, next_power_of_2(pairs)))
        return (min(256, max(16, next_power_of_2(m))), block_n, min(256, max(16, next_power_of_2(k))), 4, 1)
    block_n = 64 if half is None else max(64, half)
    block_k = 64 if element_size <= 2 else 32
    block_m = 128 if m >= 2048 else 64
    return block_m, block_n, block_k, 8 if block_m * block_n >= 128 * 64 else 4, 4 if element_size <= 2 else 3


def paired_applies(a: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether the paired GEMM takes ``a`` (M, K) and ``weight`` (N, K) (as ``gemm_applies``)."""
    return gemm_applies(a, weight)


def _paired(epi: str, a: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, out: torch.Tensor,
            qo: torch.Tensor | None, ko: torch.Tensor | None, pairs: int, pair_off: int, half: int,
            cos: torch.Tensor | None, sin: torch.Tensor | None, seq: int, hq: int, hkv: int,
            tiles: tuple[int, ...] | None) -> None:
    """Plan once per signature (``PLANS``), then launch the paired GEMM writing ``out`` (and ``qo``, ``ko``)."""
    m, k = a.shape
    if m == 0 or pairs == 0:
        return
    key = ("paired", epi, a.dtype, m, pairs, k, a.stride(), weight.shape, weight.stride(),
           None if bias is None else (bias.dtype, bias.stride()), out.stride(), pair_off, half, seq, hq, hkv,
           None if qo is None else (qo.shape, qo.stride(), ko.shape, ko.stride()),
           None if cos is None else (cos.dtype, cos.shape, cos.stride(), sin.dtype, sin.shape, sin.stride()),
           a.device, tiles, interpreting())
    plan = PLANS.get(key)
    if plan is None:
        block_m, block_n, block_k, warps, stages = paired_config(m, pairs, k, a.element_size(), a.device,
                                                                 half if epi == "rotary" else None)
        if tiles is not None:                   # (BLOCK_M, BLOCK_N, BLOCK_K[, num_warps, num_stages])
            block_m, block_n, block_k = tiles[:3]
            if len(tiles) == 5:
                warps, stages = tiles[3:]
        interpret = interpreting()

        def bs(t):                              # (batch stride: 0 where broadcast, seq stride) of a table
            return (0, 0) if t is None else (0 if t.shape[0] == 1 else t.stride(0), t.stride(1))
        q_strides = (0, 0, 0) if qo is None else (qo.stride(0), qo.stride(1), qo.stride(2))
        k_strides = (0, 0, 0) if ko is None else (ko.stride(0), ko.stride(1), ko.stride(2))
        ints = (m, pairs, k, *a.stride(), weight.stride(0), weight.stride(1), *out.stride(), pair_off, seq, hq,
                hkv, *q_strides, *k_strides, *bs(cos), *bs(sin))
        constexprs = dict(EPI=epi, HALF=half, HAS_BIAS=bias is not None, BLOCK_M=block_m, BLOCK_N=block_n,
                          BLOCK_K=block_k, GROUP_M=8,
                          DOT_PRECISION="ieee" if a.dtype == torch.float32 or (
                              interpret and a.dtype == torch.bfloat16) else "tf32",
                          BF16_RTNE_BY_HAND=interpret and a.dtype == torch.bfloat16)
        plan = remember(PLANS, key, LaunchPlan(_build_paired_kernel(interpret),
                                               (-(-m // block_m) * -(-pairs // block_n),), ints, constexprs,
                                               warps, num_stages=stages))
    pointers = (a, weight, a if bias is None else bias, out, out if qo is None else qo, out if ko is None else ko,
                a if cos is None else cos, a if sin is None else sin)
    launch(plan.kernel, plan.grid, (*pointers, *plan.ints), plan.constexprs,
           key=(key, tuple(t.data_ptr() & 15 == 0 for t in pointers)), num_warps=plan.num_warps,
           num_stages=plan.num_stages)


def gemm_swiglu(a: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, intermediate: int,
                out: torch.Tensor | None = None, *, tiles: tuple[int, ...] | None = None) -> torch.Tensor:
    """``silu(a W_gateᵀ + b_gate) · (a W_upᵀ + b_up)`` as ONE Triton GEMM with SwiGLU in its epilogue.

    ``a``: ``(M, K)``; ``weight``: ``[W_gate; W_up]``, ``(2I, K)``; ``bias``: ``(2I,)`` or None. Each tile
    accumulates matching gate and up columns in fp32 and writes ``silu(g)·u`` once rounded: ``(M, I)``,
    contiguous by default. Callers check ``paired_applies``.
    """
    m = a.shape[0]
    if weight.shape[0] != 2 * intermediate:
        raise ValueError(f"weight has {weight.shape[0]} rows, not 2 × {intermediate}")
    if out is None:
        out = _new_output((m, intermediate), a.dtype, a.device)
    _paired("swiglu", a, weight, bias, out, None, None, intermediate, intermediate, 1, None, None, 1, 0, 0, tiles)
    return out


def gemm_qkv_rotary(a: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, cos: torch.Tensor,
                    sin: torch.Tensor, batch: int, heads: int, kv_heads: int, head_dim: int, *,
                    tiles: tuple[int, ...] | None = None,
                    token_major: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``q, k, v = split(a @ weightᵀ + bias)`` with q and k rotated, as ONE Triton GEMM (rotary in its epilogue).

    ``a``: ``(B·S, K)``, rows ``b·S + s``; ``weight``: ``[W_q; W_k; W_v]``, ``((Hq + 2·Hkv)·D, K)``; ``bias``
    of its rows or None; ``cos``, ``sin``: ``(B or 1, S, D)``. Returns ``(q_embed, k_embed, v)``:
    ``(B, Hq, S, D)`` and ``(B, Hkv, S, D)`` contiguous (what ``apply_rotary_pos_emb`` returns after the
    model's view and transpose), each element ``t·cos + rotate_half(t)·sin`` of the fp32 accumulator
    rounded once, and ``v`` as ``(B·S, Hkv·D)`` contiguous rows (what ``v_proj`` returns).

    ``token_major``: the three outputs are column views of ONE ``(B·S, (Hq + 2·Hkv)·D)`` buffer, the GEMM's own
    row layout (q and k ``(B, H, S, D)`` views of ``(B, S, H, D)`` memory, v rows ``(Hq + 2·Hkv)·D`` apart), the
    layout the unfused model's packed projection has: attention that writes its output in q's layout then
    writes ``(B, S, H, D)`` memory, which o_proj reads without a copy.
    """
    m = a.shape[0]
    d = head_dim
    if d % 2 or weight.shape[0] != (heads + 2 * kv_heads) * d or m % batch:
        raise ValueError(f"weight rows {weight.shape[0]} are not (Hq + 2·Hkv)·D = ({heads} + 2·{kv_heads})·{d}, "
                         f"or {m} rows are not {batch} sequences")
    seq = m // batch
    if cos.stride(-1) != 1 or sin.stride(-1) != 1:
        cos, sin = cos.contiguous(), sin.contiguous()
    nq, nk = batch * heads * seq * d, batch * kv_heads * seq * d
    if token_major:
        rows = _new_output((m, (heads + 2 * kv_heads) * d), a.dtype, a.device)   # the GEMM's rows: q | k | v
        qo = rows[:, :heads * d].view(batch, seq, heads, d).transpose(1, 2)       # (B, Hq, S, D) of (B, S, Hq, D)
        ko = rows[:, heads * d:(heads + kv_heads) * d].view(batch, seq, kv_heads, d).transpose(1, 2)
        v = rows[:, (heads + kv_heads) * d:]                                      # (M, Hkv·D), rows N apart
    else:
        out = _new_output((nq + 2 * nk,), a.dtype, a.device)            # one allocation for the three outputs
        qo = out[:nq].view(batch, heads, seq, d)
        ko = out[nq:nq + nk].view(batch, kv_heads, seq, d)
        v = out[nq + nk:].view(m, kv_heads * d)
    _paired("rotary", a, weight, bias, v, qo, ko, (heads + 2 * kv_heads) * d // 2, 0, d // 2, cos, sin, seq,
            heads, kv_heads, tiles)
    return qo, ko, v


# ====================================================================== SwiGLU over interleaved weights

def interleave_gate_up(weight: torch.Tensor, bias: torch.Tensor | None = None
                       ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``[W_gate; W_up]`` (2I, K) → rows g_0, u_0, g_1, u_1, … (2I, K), and the bias alike: done once, at plan
    time, so that one GEMM tile holds each gate column beside its up column (``gemm_swiglu_interleaved``)."""
    i = weight.shape[0] // 2
    w = torch.stack((weight[:i], weight[i:]), dim=1).reshape(2 * i, weight.shape[1]).contiguous()
    b = None if bias is None else torch.stack((bias[:i], bias[i:]), dim=1).reshape(2 * i).contiguous()
    return w, b


@functools.lru_cache(maxsize=2)
def _build_interleaved_kernel(interpret: bool):
    """Define the GEMM over interleaved gate/up rows with SwiGLU in its epilogue; cached per interpreter mode."""
    global tl, _round_for, _tile
    _round_for, _tile = triton_round_bf16(interpret), grouped_tile(interpret)
    triton, tl = import_triton()

    @triton.jit
    def _swiglu_interleaved_kernel(
        A, W, BIAS, C, M, N, K, sam, sak, swn, swk, scm, scn,       # N = 2I interleaved columns; C is (M, I)
        HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
        GROUP_M: tl.constexpr, DOT_PRECISION: tl.constexpr, BF16_RTNE_BY_HAND: tl.constexpr,
    ):
        pid_m, pid_n = _tile(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)
        rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)                       # interleaved columns: g, u, g, u, …
        rk = tl.arange(0, BLOCK_K)
        m_live, n_live = rm < M, rn < N
        a_ptr = A + rm[:, None].to(tl.int64) * sam + rk[None, :] * sak
        w_ptr = W + rn[None, :] * swn + rk[:, None] * swk
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            k_live = k0 + rk < K
            a = tl.load(a_ptr, mask=m_live[:, None] & k_live[None, :], other=0.0)
            w = tl.load(w_ptr, mask=k_live[:, None] & n_live[None, :], other=0.0, eviction_policy="evict_last")
            if BF16_RTNE_BY_HAND:
                a = a.to(tl.float32)
                w = w.to(tl.float32)
            acc = tl.dot(a, w, acc, input_precision=DOT_PRECISION)
            a_ptr += BLOCK_K * sak
            w_ptr += BLOCK_K * swk
        if HAS_BIAS:
            acc += tl.load(BIAS + rn, mask=n_live, other=0.0).to(tl.float32)[None, :]
        g, u = tl.split(tl.reshape(acc, (BLOCK_M, BLOCK_N // 2, 2)))       # neighbours: in one thread's registers
        out = _round_for(g / (1.0 + tl.exp(-g)) * u, BF16_RTNE_BY_HAND)
        ro = pid_n * (BLOCK_N // 2) + tl.arange(0, BLOCK_N // 2)           # output columns
        live = m_live[:, None] & (ro < N // 2)[None, :]
        tl.store(C + rm[:, None].to(tl.int64) * scm + ro[None, :] * scn,
                 out.to(C.dtype.element_ty, fp_downcast_rounding="rtne"), mask=live)

    return _swiglu_interleaved_kernel


def gemm_swiglu_interleaved(a: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                            out: torch.Tensor | None = None, *,
                            tiles: tuple[int, ...] | None = None) -> torch.Tensor:
    """``silu(a W_gateᵀ + b_gate) · (a W_upᵀ + b_up)`` as ONE Triton GEMM over ``interleave_gate_up``'s weight
    (and bias): one accumulator of 2·BLOCK_N/2 columns whose neighbouring pairs are (gate, up), split in
    registers by the epilogue. Returns ``(M, I)``. ``tiles`` = (BLOCK_M, BLOCK_N columns, BLOCK_K[, warps,
    stages]); the default is ``gemm_config``'s for the 2I-wide GEMM."""
    m, k = a.shape
    n = weight.shape[0]
    if n % 2:
        raise ValueError(f"an interleaved gate/up weight has an even number of rows, not {n}")
    if out is None:
        out = _new_output((m, n // 2), a.dtype, a.device)
    if m == 0:
        return out
    key = ("swiglu_il", a.dtype, m, n, k, a.stride(), weight.stride(), None if bias is None else bias.dtype,
           out.stride(), a.device, tiles, interpreting())
    plan = PLANS.get(key)
    if plan is None:
        block_m, block_n, block_k, warps, stages = gemm_config(m, n, k, a.element_size(), a.device)
        if tiles is not None:
            block_m, block_n, block_k = tiles[:3]
            if len(tiles) == 5:
                warps, stages = tiles[3:]
        interpret = interpreting()
        constexprs = dict(HAS_BIAS=bias is not None, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, GROUP_M=8,
                          DOT_PRECISION="ieee" if a.dtype == torch.float32 or (
                              interpret and a.dtype == torch.bfloat16) else "tf32",
                          BF16_RTNE_BY_HAND=interpret and a.dtype == torch.bfloat16)
        plan = remember(PLANS, key, LaunchPlan(_build_interleaved_kernel(interpret),
                                               (-(-m // block_m) * -(-n // block_n),),
                                               (m, n, k, *a.stride(), weight.stride(0), weight.stride(1),
                                                *out.stride()), constexprs, warps, num_stages=stages))
    pointers = (a, weight, a if bias is None else bias, out)
    launch(plan.kernel, plan.grid, (*pointers, *plan.ints), plan.constexprs,
           key=(key, tuple(t.data_ptr() & 15 == 0 for t in pointers)), num_warps=plan.num_warps,
           num_stages=plan.num_stages)
    return out
