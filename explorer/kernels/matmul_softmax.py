"""Attention scores and softmax in one Triton kernel: the scores never reach memory.

::

    unfused (3-4 kernels, scores written and re-read each time)
    a (…,M,K) ─┐
               matmul ─► S (…,M,N) ─► ·scale ─► + mask ─► softmax ─► P (…,M,N)
    b (…,K,N) ─┘

    fused (1 kernel): one program owns BLOCK_M full rows of S
    for k in K/BLOCK_K:  acc[BLOCK_M, N] += a[rows, k] @ b[k, :]     (fp32 accumulate)
    acc = acc·scale + mask[rows, :];  P = exp(acc − rowmax) / rowsum   (in registers)
    store P

The row must fit in one block, so the fused path handles ``N <= MAX_FUSED_N``
(1024); longer rows take the reference path (``matmul_softmax_impl`` says
which, and why). Padded columns are set to −inf before the row max (so they
get probability 0); padded rows and K lanes load 0 and are never stored.
fp32 inputs use ``tl.dot(..., input_precision="ieee")`` (no TF32), so the
fused result is as accurate as an fp32 matmul; fp16/bf16 inputs use tensor
cores with fp32 accumulation, and only the final probabilities are rounded
to the input dtype (the unfused path also rounds the scores).

``attention`` is the whole of scaled dot-product attention as PyTorch fuses it
(``F.scaled_dot_product_attention``: flash / memory-efficient kernels on CUDA);
``attention_reference`` spells it out as matmul, scale, mask, softmax, matmul.
"""

from __future__ import annotations

import functools

import torch

from explorer.kernels import import_triton, interpreting, launch, library_reductions_usable, triton_runs_on

MAX_FUSED_N = 1024
SUPPORTED_DTYPES = (torch.float32, torch.float16, torch.bfloat16)

#: Fused kernel vs the unfused computation in float64, ``|out - ref| <= atol + rtol·|ref|``.
#: The inputs are exact in the fp32 accumulator; a score error e becomes a relative
#: probability error ~e, and the probabilities are rounded once (u). fp32 uses IEEE
#: dot (no TF32): scores good to ~1e-6 for K up to a few hundred.
TOLERANCES = {
    torch.float32: dict(rtol=1e-5, atol=1e-6),
    torch.float16: dict(rtol=2e-3, atol=2e-5),      # 4u
    torch.bfloat16: dict(rtol=1.6e-2, atol=2e-4),   # 4u
}
#: attention (SDPA) and its unfused reference, both computed by torch in the dtype:
#: intermediates (scores, probabilities) are rounded too, and 16-bit GEMMs may
#: accumulate in reduced precision: ~8u relative to the output's scale.
ATTENTION_TOLERANCES = {
    torch.float32: dict(rtol=1e-5, atol=1e-5),
    torch.float16: dict(rtol=4e-3, atol=4e-3),
    torch.bfloat16: dict(rtol=3.2e-2, atol=3.2e-2),
}


def _additive_mask(mask: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:
    """A boolean mask (True = keep, as in SDPA) becomes an additive 0 / −inf mask."""
    if mask is None or mask.dtype != torch.bool:
        return mask
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(~mask, float("-inf"))


def matmul_softmax_reference(a: torch.Tensor, b: torch.Tensor, scale: float = 1.0,
                             mask: torch.Tensor | None = None) -> torch.Tensor:
    """Unfused: ``softmax(a @ b * scale + mask, dim=-1)``, each step its own op."""
    s = torch.matmul(a, b) * scale                                            # (..., M, N)
    if mask is not None:
        s = s + _additive_mask(mask, s.dtype)
    return torch.softmax(s, dim=-1)


def matmul_softmax_impl(a: torch.Tensor, b: torch.Tensor, mask: torch.Tensor | None = None) -> tuple[str, str]:
    """``("triton", "")`` when ``matmul_softmax`` runs the fused kernel, else ``("reference", reason)``."""
    if not triton_runs_on(a.device):
        return "reference", f"no Triton on {a.device.type} (set TRITON_INTERPRET=1 to interpret on CPU)"
    if a.dim() < 2 or b.dim() < 2 or a.shape[-1] != b.shape[-2]:
        return "reference", "shapes are not (..., M, K) @ (..., K, N)"
    if a.dtype not in SUPPORTED_DTYPES or b.dtype != a.dtype:
        return "reference", f"dtypes {a.dtype}/{b.dtype}: the kernel takes one of fp32, fp16, bf16"
    if b.device != a.device or (mask is not None and mask.device != a.device):
        return "reference", "inputs on different devices"
    if b.shape[-1] > MAX_FUSED_N:
        return "reference", f"N = {b.shape[-1]} > {MAX_FUSED_N}: a score row does not fit in one block"
    if a.numel() == 0 or b.numel() == 0:
        return "reference", "empty input"
    if a.shape[-2] > 65535 * 16:
        return "reference", f"M = {a.shape[-2]}: too many row blocks for one grid axis"
    return "triton", ""


def describe(a: torch.Tensor, b: torch.Tensor, mask: torch.Tensor | None = None) -> str:
    """Human-readable label of the implementation ``matmul_softmax`` takes for these inputs."""
    impl, reason = matmul_softmax_impl(a, b, mask)
    if impl == "triton":
        return "triton matmul+scale+mask+softmax (1 kernel, scores stay on chip)"
    steps = 3 + (mask is not None)
    return f"matmul, scale, {'mask, ' if mask is not None else ''}softmax ({steps} kernels: {reason})"


def launch_config(n: int, k: int, elem_size: int) -> dict:
    """Block sizes and warps for rows of ``n`` scores and a reduction depth ``k``."""
    block_n = max(16, 1 << max(n - 1, 0).bit_length())
    block_m = 64 if block_n <= 128 else 32 if block_n <= 512 else 16
    # keep one (BLOCK_K, BLOCK_N) tile of b at <= 64 KiB of shared memory per pipeline stage
    block_k = max(16, min(64, 1 << max(k - 1, 0).bit_length(), 65536 // (block_n * elem_size)))
    num_warps = 4 if block_m * block_n <= 8192 else 8
    return dict(BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, num_warps=num_warps, num_stages=2)


def _new_output(shape, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Allocate an output the kernel fully overwrites (tests replace this to poison it)."""
    return torch.empty(shape, dtype=dtype, device=device)


@functools.lru_cache(maxsize=2)
def _build_kernel(interpret: bool):
    """Define the Triton kernel (imports Triton); cached per interpreter mode.

    As in ``add_layernorm``: defined lazily because ``triton.jit`` reads TRITON_INTERPRET
    when it decorates; the names it uses are module globals; ``LIBRARY_REDUCE`` picks
    ``tl.max``/``tl.sum`` (always when compiled) or ``tl.reduce`` with our own combine
    functions (interpretable whatever the order of imports).
    """
    global tl, _add, _max
    del interpret  # cache key only
    triton, tl = import_triton()

    @triton.jit
    def _add(a, b):
        return a + b

    @triton.jit
    def _max(a, b):
        return tl.maximum(a, b)

    @triton.jit
    def _matmul_softmax_fwd(
        A, Bm, MASK, O,
        M, N, K, B1,                                   # B1: size of the inner batch dim
        sa0, sa1, sam, sak,                            # strides of a as (B0, B1, M, K)
        sb0, sb1, sbk, sbn,                            # strides of b as (B0, B1, K, N)
        sk0, sk1, skm, skn,                            # strides of the mask as (B0, B1, M, N); 0 = broadcast
        so0, so1, som, son,
        scale,
        HAS_MASK: tl.constexpr, DOT_PRECISION: tl.constexpr, UPCAST: tl.constexpr,
        LIBRARY_REDUCE: tl.constexpr,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    ):
        pid_b = tl.program_id(0)                       # batch on axis 0: up to 2**31 - 1 programs
        pid_m = tl.program_id(1)                       # row blocks on axis 1 (limit 65535 blocks)
        b0 = (pid_b // B1).to(tl.int64)
        b1 = (pid_b % B1).to(tl.int64)
        rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        cols = tl.arange(0, BLOCK_N)
        ks = tl.arange(0, BLOCK_K)
        row_ok = rows < M
        col_ok = cols < N
        a_ptr = A + b0 * sa0 + b1 * sa1 + rows[:, None] * sam
        b_ptr = Bm + b0 * sb0 + b1 * sb1 + cols[None, :] * sbn
        acc = tl.full((BLOCK_M, BLOCK_N), 0.0, dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            kk = k0 + ks
            k_ok = kk < K
            a = tl.load(a_ptr + kk[None, :] * sak, mask=row_ok[:, None] & k_ok[None, :], other=0.0)
            b = tl.load(b_ptr + kk[:, None] * sbk, mask=k_ok[:, None] & col_ok[None, :], other=0.0)
            if UPCAST:  # bf16 in the interpreter only: its tl.dot misreads bf16 (stored as uint16);
                # bf16 x bf16 products are exact in fp32, so this is the tensor-core arithmetic
                a = a.to(tl.float32)
                b = b.to(tl.float32)
            acc = tl.dot(a, b, acc, input_precision=DOT_PRECISION)
        s = acc * scale
        if HAS_MASK:
            m_ptr = MASK + b0 * sk0 + b1 * sk1 + rows[:, None] * skm + cols[None, :] * skn
            s = s + tl.load(m_ptr, mask=row_ok[:, None] & col_ok[None, :], other=0.0).to(tl.float32)
        s = tl.where(col_ok[None, :], s, float("-inf"))        # padded columns: probability 0
        if LIBRARY_REDUCE:
            row_max = tl.max(s, axis=1)
        else:
            row_max = tl.reduce(s, 1, _max)
        e = tl.exp(s - row_max[:, None])
        if LIBRARY_REDUCE:
            p = e / tl.sum(e, axis=1)[:, None]
        else:
            p = e / tl.reduce(e, 1, _add)[:, None]
        if UPCAST:  # interpreter only: its fp32 -> bf16 cast truncates; round to nearest even first
            bits = p.to(tl.uint32, bitcast=True)
            p = ((bits + (((bits >> 16) & 1) + 0x7FFF)) >> 16 << 16).to(tl.float32, bitcast=True)
        o_ptr = O + b0 * so0 + b1 * so1 + rows[:, None] * som + cols[None, :] * son
        tl.store(o_ptr, p.to(O.dtype.element_ty, fp_downcast_rounding="rtne"), mask=row_ok[:, None] & col_ok[None, :])

    return _matmul_softmax_fwd


def _as_4d(t: torch.Tensor, batch: tuple[int, ...], last2: tuple[int, int]) -> torch.Tensor:
    """View ``t`` broadcast to ``batch + last2`` as 4 dims ``(B0, B1, *last2)``, keeping stride-0 broadcasts."""
    t = t.expand(batch + last2)
    if len(batch) == 0:
        return t.reshape((1, 1) + last2)
    if len(batch) == 1:
        return t.unsqueeze(0)
    if len(batch) == 2:
        return t
    try:  # fold the leading batch dims into B0 (a view when their strides allow it)
        return t.view((-1,) + tuple(batch[-1:]) + last2)
    except RuntimeError:
        return t.reshape((-1,) + tuple(batch[-1:]) + last2)


def matmul_softmax(a: torch.Tensor, b: torch.Tensor, scale: float = 1.0,
                   mask: torch.Tensor | None = None) -> torch.Tensor:
    """``softmax(a @ b * scale + mask, dim=-1)`` from one kernel where ``matmul_softmax_impl`` allows.

    ``a``: ``(..., M, K)``; ``b``: ``(..., K, N)``; batch dims broadcast;
    ``mask``: additive (or boolean, True = keep), broadcastable to ``(..., M, N)``
    (a ``(B, 1, 1, N)`` padding mask is read with stride 0, never expanded in
    memory). Returns ``(..., M, N)`` in the input dtype.
    """
    impl, _ = matmul_softmax_impl(a, b, mask)
    if impl != "triton":
        return matmul_softmax_reference(a, b, scale, mask)
    m, k = a.shape[-2:]
    n = b.shape[-1]
    mask = _additive_mask(mask, torch.float32)
    shapes = [a.shape[:-2], b.shape[:-2]] + ([mask.shape[:-2]] if mask is not None and mask.dim() > 2 else [])
    batch = tuple(torch.broadcast_shapes(*shapes))
    a4 = _as_4d(a, batch, (m, k))                                              # (B0, B1, M, K)
    b4 = _as_4d(b, batch, (k, n))                                              # (B0, B1, K, N)
    mask4 = _as_4d(mask, batch, (m, n)) if mask is not None else None          # (B0, B1, M, N), strides may be 0
    out = _new_output(batch + (m, n), a.dtype, a.device)
    o4 = _as_4d(out, batch, (m, n))
    cfg = launch_config(n, k, a.element_size())
    b0, b1 = a4.shape[0], a4.shape[1]
    grid = (b0 * b1, _cdiv(m, cfg["BLOCK_M"]))
    mk = mask4 if mask4 is not None else a4
    upcast = interpreting() and a.dtype == torch.bfloat16
    kernel = _build_kernel(interpreting())
    options = {k: cfg[k] for k in ("num_warps", "num_stages")}
    launch(
        kernel, grid,
        (a4, b4, mk, o4, m, n, k, b1, *a4.stride(), *b4.stride(), *mk.stride(), *o4.stride(), float(scale)),
        dict(HAS_MASK=mask4 is not None,
             DOT_PRECISION="ieee" if a.dtype == torch.float32 or upcast else "tf32",
             UPCAST=upcast, LIBRARY_REDUCE=library_reductions_usable(),
             BLOCK_M=cfg["BLOCK_M"], BLOCK_N=cfg["BLOCK_N"], BLOCK_K=cfg["BLOCK_K"]),
        **options,
    )
    return out


def _cdiv(x: int, y: int) -> int:
    return (x + y - 1) // y


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float | None = None,
              mask: torch.Tensor | None = None) -> torch.Tensor:
    """PyTorch's fused attention: ``F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)``.

    ``q``: ``(..., L, E)``, ``k``: ``(..., S, E)``, ``v``: ``(..., S, Ev)`` → ``(..., L, Ev)``.
    The flash, memory-efficient and cuDNN kernels need each operand's last dim
    contiguous and a mask in the query's dtype; anything else silently drops to
    the op-by-op "math" backend (18 kernels instead of 1–2 for BERT-base shapes
    in fp16, measured on the H200), so operands are fixed up first.
    """
    if q.stride(-1) != 1:
        q = q.contiguous()
    if k.stride(-1) != 1:
        k = k.contiguous()
    if v.stride(-1) != 1:
        v = v.contiguous()
    if mask is not None and mask.dtype != q.dtype and mask.is_floating_point():
        mask = mask.to(q.dtype)
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)


def attention_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float | None = None,
                        mask: torch.Tensor | None = None) -> torch.Tensor:
    """Unfused attention: ``softmax(q @ kᵀ · scale + mask) @ v``, every intermediate in memory."""
    if scale is None:
        scale = q.shape[-1] ** -0.5
    p = matmul_softmax_reference(q, k.transpose(-2, -1), scale, mask)         # (..., L, S)
    return torch.matmul(p, v)                                                  # (..., L, Ev)
