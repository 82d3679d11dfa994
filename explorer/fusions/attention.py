"""The attention family: scores and softmax in one Triton kernel, or the whole block as SDPA.

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
(1024); longer rows take the reference path (``select_matmul_softmax`` says
which, and why: the one decision, made once per chain at the rewrite for the run's
target and recorded on the fused call; the lowering of a lean graph for that target
hands the recorded impl to the call (``LOWERINGS``), which follows it without asking
again; a fused graph run as it is asks at each call). Padded columns are set to −inf before the row max (so they
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

import contextlib
import contextvars
import functools
import math
import os
from typing import Any

import torch
import torch.fx

from explorer.fusions import edit, measured_tables
from explorer.fusions.base import WORDS as BASE_WORDS
from explorer.fusions.base import PRECISION_CAVEAT, Choice, Pattern, Step, selection
from explorer.fusions.edit import Refuse, RewriteContext, UseGeneric
from explorer.fusions.triton_support import no_triton, where
from explorer.fusions.triton_support import (cdiv, import_triton, interpreting, jit_helpers, launch,
                                             library_reductions_usable, next_power_of_2, triton_runs_on)
from explorer.graph import aten
from explorer.words import Words

#: What this family says to a person, in English and 中文 (rendered by explorer.ui.i18n by id).
WORDS = Words("attention", {
    "title": ("Attention (MatMul+Softmax)", "注意力（MatMul+Softmax）"),
    "matmul_softmax.label": ("MatMul+Softmax", "MatMul+Softmax（矩阵乘法+Softmax）"),
    "matmul_softmax.implementation": (("one Triton kernel for scores->softmax; scaled_dot_product_attention "
                                       "(flash attention) when the chain ends in the second MatMul"),
                                      ("分数 → softmax 用一个 Triton 内核；链以第二个 MatMul 结尾时用 "
                                       "scaled_dot_product_attention（flash attention）")),
    "matmul_softmax.explanation": (("Attention scores (Q K^T, scaled and masked) are sized seq x seq per head: "
                                    "the largest intermediates in a transformer. Fusing the MatMul with the "
                                    "scale, the mask and the softmax keeps each row of scores in registers; "
                                    "adding the second MatMul (the whole attention block) means the seq x seq "
                                    "matrix never reaches device memory at all."),
                                   ("注意力分数（Q K^T，经过缩放和掩码）每个头的大小是 序列长度 × 序列长度：Transformer 里最大的中间结果。把 MatMul "
                                    "与缩放、掩码和 softmax 融合，每一行分数都留在寄存器里；再把第二个 MatMul 也融合进来（整个注意力块），这个 序列长度 × 序列长度 "
                                    "的矩阵就完全不会写到显存。")),
    "matmul_softmax.caveat": ("Softmax is computed in fp32 inside the kernel even for fp16 inputs.",
                              "即使输入是 fp16，内核内部也用 fp32 计算 softmax。"),
    "why.shapes": ("shapes are not (..., M, K) @ (..., K, N)", "形状不是 (..., M, K) @ (..., K, N)"),
    "why.row": ("N = {n} > {max}: a score row does not fit in one block", "N = {n} > {max}：一行分数放不进一个块"),
    "why.grid": ("M = {m}: too many row blocks for one grid axis", "M = {m}：行块太多，一个 grid 维度放不下"),
    "label.triton": ("triton matmul+scale+mask+softmax (1 kernel, scores stay on chip)",
                     "triton matmul+scale+mask+softmax（1 个内核，分数留在片上）"),
    "label.reference": ("matmul, scale, softmax ({steps} kernels: {why}); reference composition, no fused kernel",
                        "matmul、scale、softmax（{steps} 个内核：{why}）；参考实现的组合，没有融合内核"),
    "label.reference_mask": (("matmul, scale, mask, softmax ({steps} kernels: {why}); reference composition, no "
                              "fused kernel"),
                             "matmul、scale、mask、softmax（{steps} 个内核：{why}）；参考实现的组合，没有融合内核"),
    "label.sdpa": ("scaled_dot_product_attention (flash / memory-efficient attention, 1 kernel)",
                   "scaled_dot_product_attention（flash / memory-efficient 注意力，1 个内核）"),
    "label.sdpa_cpu": (("scaled_dot_product_attention on {device} (PyTorch's CPU attention kernel; no GPU fused "
                        "kernel on cpu)"),
                       "{device} 上的 scaled_dot_product_attention（PyTorch 的 CPU 注意力内核；cpu 上没有 GPU 融合内核）"),
    "generic.not_matmul": ("{op} is not a matmul", "{op} 不是 matmul"),
    "refuse.scale_tensor": ("scale is a tensor, not a constant", "缩放因子是张量，不是常量"),
    "generic.scalar_div": ("scalar divided by the scores", "标量除以分数"),
    "generic.not_softmax": ("{op} is not a softmax", "{op} 不是 softmax"),
    "refuse.dim": ("softmax over dim {dim}, not the last one", "softmax 作用在第 {dim} 维，不是最后一维"),
    "generic.casts": ("softmax casts its result", "softmax 对结果做了类型转换"),
    "generic.upcasts": ("softmax upcasts half to float", "softmax 把 half 升为 float"),
    "generic.no_shapes": ("scores operands without shapes", "分数的操作数没有形状"),
    "generic.attn_no_shapes": ("attention operands without shapes", "注意力的操作数没有形状"),
    "generic.broadcast": ("attention operands with broadcast batch dims", "注意力的操作数在批维度上广播"),
    "refuse.left": ("softmax output is not the left operand of the next MatMul", "softmax 的输出不是下一个 MatMul 的左操作数"),
    "refuse.scale_rows": (("the scale is a tensor of shape {shape} that varies along the score rows or columns "
                           "(only a per-head or per-batch scale folds into the queries)"),
                          "缩放因子是形状为 {shape} 的张量，沿分数的行或列变化（只有按头或按批的缩放能并入查询）"),
    "generic.softcap": (("a tanh soft-cap before the softmax (cap·tanh(s/cap)) and the chain ends in the second "
                         "MatMul: SDPA has no soft-cap, so inductor compiles the chain"),
                        "softmax 之前有 tanh 软上限（cap·tanh(s/cap)），且链以第二个 MatMul 结尾：SDPA 没有软上限，所以由 inductor 编译这条链"),
    "generic.softcap_form": (("a tanh before the softmax that is not cap·tanh(s / cap) with one constant cap: "
                              "inductor compiles the chain"),
                             "softmax 之前的 tanh 不是同一个常量 cap 的 cap·tanh(s / cap)：由 inductor 编译这条链"),
    "generic.einsum": ("einsum '{equation}' is not a batched matrix product", "einsum“{equation}”不是批量矩阵乘法"),
    "generic.reshape": (("a view between the scores and the softmax changes more than the batch dims "
                         "({before} to {after})"),
                        "分数和 softmax 之间的视图不只改变批维度（{before} 变为 {after}）"),
    "generic.reshape_context": (("a view regroups the scores for the softmax and the chain ends in the second "
                                 "MatMul: the attention call would need the same view of Q, K and V"),
                                "一个视图为 softmax 重新分组了分数，而链以第二个 MatMul 结尾：注意力调用还需要对 Q、K、V 做同样的视图"),
    "generic.mask_operand": ("{node}: an additive term that is not a tensor of the graph", "{node}：加性项不是计算图中的张量"),
    "label.forms": ("{label}; scores from {scores}, {terms} additive term(s)", "{label}；分数来自 {scores}，{terms} 个加性项"),
    "generic.cast_back": (("the softmax computes in {probs} and its result is cast to {out}, while the scores are "
                           "{scores}: the fused kernels compute the softmax in float32 and write the scores' dtype"),
                          "softmax 以 {probs} 计算，结果转换为 {out}，而分数是 {scores}：融合内核以 float32 计算 softmax 并写出分数的数据类型"),
    "generic.cast_op": ("{op} between the softmax and the next MatMul is not a dtype cast",
                        "softmax 与下一个 MatMul 之间的 {op} 不是数据类型转换"),
    "label.capped": ("{label}, then P·V as a matmul (1 kernel; SDPA has no soft-cap)",
                     "{label}，然后 P·V 作为一次矩阵乘法（1 个内核；SDPA 没有软上限）"),
    # the measured choice of the whole block (select_attention, the table baked from bench_attention_choice.py)
    "device_unknown": ("a CUDA device not known where the plan is made", "未知的 CUDA 设备（制定计划的机器上没有）"),
    "label.sdpa_unmeasured": ("{label}; not measured at S={s} (bucket {bucket}), D={d}, {dtype} on {device}: SDPA, "
                              "as before",
                              "{label}；S={s}（≤ {bucket}）、D={d}、{dtype} 在 {device} 上没有测量：照旧用 SDPA"),
    "refuse.measured": ("SDPA measured slower than the unfused block at S={s}, D={d} on {device}: {sdpa} µs against "
                        "{unfused} µs ({dtype}, {shapes} shape(s) summed)",
                        ("在 {device} 上 S={s}、D={d} 时测得 SDPA 比未融合的块慢：{sdpa} µs 对 {unfused} µs（{dtype}，"
                         "{shapes} 个形状合计）")),
    "label.triton_measured": (("triton scores->softmax (1 kernel), then P·V as one matmul: measured {triton} µs "
                               "against SDPA's {sdpa} µs at S={s}, D={d} on {device} ({dtype}, {shapes} shape(s) "
                               "summed)"),
                              ("triton 分数 → softmax（1 个内核），然后 P·V 作为一次矩阵乘法：在 {device} 上 S={s}、D={d} "
                               "时测得 {triton} µs，SDPA 为 {sdpa} µs（{dtype}，{shapes} 个形状合计）")),
    "label.sdpa_measured": (("{label}; measured {sdpa} µs against the unfused block's {unfused} µs at S={s}, D={d} on "
                             "{device} ({dtype}, {shapes} shape(s) summed)"),
                            ("{label}；在 {device} 上 S={s}、D={d} 时测得 {sdpa} µs，未融合的块为 {unfused} µs（{dtype}，"
                             "{shapes} 个形状合计）")),
    "label.sdpa_measured_alone": ("{label}; measured {sdpa} µs at S={s}, D={d} on {device} ({dtype}, {shapes} "
                                  "shape(s) summed)",
                                  "{label}；在 {device} 上 S={s}、D={d} 时测得 {sdpa} µs（{dtype}，{shapes} 个形状合计）"),
})


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
                             mask: torch.Tensor | None = None, tscale: torch.Tensor | None = None,
                             cap: float | None = None) -> torch.Tensor:
    """Unfused: ``softmax(softcap(a @ b * tscale * scale) + mask, dim=-1)``, each step its own op (``tscale``: a
    tensor constant along the rows and columns of the scores, such as a per-head scale, or None; ``cap``: Gemma2's
    soft-cap ``cap·tanh(s / cap)``, or None)."""
    s = torch.matmul(a, b)
    if tscale is not None:
        s = s * tscale
    s = s * scale                                                             # (..., M, N)
    if cap is not None:
        s = torch.tanh(s / cap) * cap
    if mask is not None:
        s = s + _additive_mask(mask, s.dtype)
    return torch.softmax(s, dim=-1)


@selection
def select_matmul_softmax(device: torch.device | str, a_dtype: torch.dtype, b_dtype: torch.dtype,
                          a_shape: tuple[int, ...], b_shape: tuple[int, ...], same_device: bool = True,
                          has_mask: bool = False) -> Choice:
    """The one decision of how ``softmax(a @ b * scale + mask)`` runs: ``triton`` or ``reference``."""
    device = torch.device(device)
    if not triton_runs_on(device):
        why = no_triton(device)
    elif len(a_shape) < 2 or len(b_shape) < 2 or a_shape[-1] != b_shape[-2]:
        why = WORDS("why.shapes")
    elif a_dtype not in SUPPORTED_DTYPES or b_dtype != a_dtype:
        why = BASE_WORDS("dtypes_one_of", a=a_dtype, b=b_dtype)
    elif not same_device:
        why = BASE_WORDS("devices")
    elif b_shape[-1] > MAX_FUSED_N:
        why = WORDS("why.row", n=b_shape[-1], max=MAX_FUSED_N)
    elif 0 in a_shape or 0 in b_shape:
        why = BASE_WORDS("empty")
    elif a_shape[-2] > 65535 * 16:
        why = WORDS("why.grid", m=a_shape[-2])
    else:
        return Choice("triton", where(WORDS("label.triton"), device), True)
    steps = 3 + has_mask
    return Choice("reference", WORDS("label.reference_mask" if has_mask else "label.reference", steps=steps, why=why),
                  False)


def select_for_tensors(a: torch.Tensor, b: torch.Tensor, mask: torch.Tensor | None = None) -> Choice:
    """``select_matmul_softmax`` for these operands (what ``matmul_softmax`` asks at run time)."""
    same_device = b.device == a.device and (mask is None or mask.device == a.device)
    return select_matmul_softmax(a.device, a.dtype, b.dtype, tuple(a.shape), tuple(b.shape), same_device,
                                 mask is not None)


def launch_config(n: int, k: int, elem_size: int) -> dict:
    """Block sizes and warps for rows of ``n`` scores and a reduction depth ``k``."""
    block_n = max(16, next_power_of_2(n))
    block_m = 64 if block_n <= 128 else 32 if block_n <= 512 else 16
    # keep one (BLOCK_K, BLOCK_N) tile of b at <= 64 KiB of shared memory per pipeline stage
    block_k = max(16, min(64, next_power_of_2(k), 65536 // (block_n * elem_size)))
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
    functions (``_add`` from ``triton_support.jit_helpers``, ``_max``: interpretable
    whatever the order of imports).
    """
    global tl, _add, _max
    triton, tl = import_triton()
    _add = jit_helpers(interpret).add

    @triton.jit
    def _max(a, b):
        return tl.maximum(a, b)

    @triton.jit
    def _matmul_softmax_fwd(
        A, Bm, MASK, O, TS,
        M, N, K, B1,                                   # B1: size of the inner batch dim
        sa0, sa1, sam, sak,                            # strides of a as (B0, B1, M, K)
        sb0, sb1, sbk, sbn,                            # strides of b as (B0, B1, K, N)
        sk0, sk1, skm, skn,                            # strides of the mask as (B0, B1, M, N); 0 = broadcast
        so0, so1, som, son,
        st0, st1,                                      # strides of the tensor scale as (B0, B1); 0 = broadcast
        scale, cap,
        HAS_MASK: tl.constexpr, HAS_TSCALE: tl.constexpr, HAS_CAP: tl.constexpr, DOT_PRECISION: tl.constexpr, UPCAST: tl.constexpr,
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
        if HAS_TSCALE:  # a per-(batch, head) scale on the fp32 scores, as the unfused graph multiplies them
            acc = acc * tl.load(TS + b0 * st0 + b1 * st1).to(tl.float32)
        s = acc * scale
        if HAS_CAP:  # Gemma2's soft-cap cap·tanh(s / cap); tanh(|u|) = (1 - e) / (1 + e), e = exp(-2|u|)
            u = s / cap
            e = tl.exp(-2.0 * tl.abs(u))
            th = (1.0 - e) / (1.0 + e)
            s = cap * tl.where(u < 0.0, -th, th)
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
                   mask: torch.Tensor | None = None, tscale: torch.Tensor | None = None,
                   cap: float | None = None, impl: str | None = None) -> torch.Tensor:
    """``softmax(a @ b * scale + mask, dim=-1)`` from one kernel where ``select_matmul_softmax`` allows.

    ``a``: ``(..., M, K)``; ``b``: ``(..., K, N)``; batch dims broadcast;
    ``mask``: additive (or boolean, True = keep), broadcastable to ``(..., M, N)``
    (a ``(B, 1, 1, N)`` padding mask is read with stride 0, never expanded in
    memory). Returns ``(..., M, N)`` in the input dtype. ``impl``: the ``Choice.impl`` decided for this
    call's target (a lowered fused call is handed it); given, the selection is not asked ("triton" runs the
    kernel where the operands share a device, anything else the reference).
    """
    if impl is None:
        impl = select_for_tensors(a, b, mask).impl
    elif impl == "triton" and not (b.device == a.device and (mask is None or mask.device == a.device)):
        impl = "reference"
    if impl != "triton" or (tscale is not None and tscale.device != a.device):
        return matmul_softmax_reference(a, b, scale, mask, tscale, cap)
    m, k = a.shape[-2:]
    n = b.shape[-1]
    mask = _additive_mask(mask, torch.float32)
    shapes = [a.shape[:-2], b.shape[:-2]] + ([mask.shape[:-2]] if mask is not None and mask.dim() > 2 else [])
    batch = tuple(torch.broadcast_shapes(*shapes))
    a4 = _as_4d(a, batch, (m, k))                                              # (B0, B1, M, K)
    b4 = _as_4d(b, batch, (k, n))                                              # (B0, B1, K, N)
    mask4 = _as_4d(mask, batch, (m, n)) if mask is not None else None          # (B0, B1, M, N), strides may be 0
    if tscale is not None:
        batch = tuple(torch.broadcast_shapes(batch, tscale.shape[:-2]))
        a4, b4 = _as_4d(a, batch, (m, k)), _as_4d(b, batch, (k, n))
        mask4 = _as_4d(mask, batch, (m, n)) if mask is not None else None
    ts4 = _as_4d(tscale, batch, (1, 1)) if tscale is not None else None       # (B0, B1, 1, 1), strides may be 0
    out = _new_output(batch + (m, n), a.dtype, a.device)
    o4 = _as_4d(out, batch, (m, n))
    cfg = launch_config(n, k, a.element_size())
    b0, b1 = a4.shape[0], a4.shape[1]
    grid = (b0 * b1, cdiv(m, cfg["BLOCK_M"]))
    mk = mask4 if mask4 is not None else a4
    ts = ts4 if ts4 is not None else a4
    upcast = interpreting() and a.dtype == torch.bfloat16
    kernel = _build_kernel(interpreting())
    options = {k: cfg[k] for k in ("num_warps", "num_stages")}
    launch(
        kernel, grid,
        (a4, b4, mk, o4, ts, m, n, k, b1, *a4.stride(), *b4.stride(), *mk.stride(), *o4.stride(),
         *ts.stride()[:2], float(scale), float(cap or 1.0)),
        dict(HAS_MASK=mask4 is not None, HAS_TSCALE=ts4 is not None, HAS_CAP=cap is not None,
             DOT_PRECISION="ieee" if a.dtype == torch.float32 or upcast else "tf32",
             UPCAST=upcast, LIBRARY_REDUCE=library_reductions_usable(),
             BLOCK_M=cfg["BLOCK_M"], BLOCK_N=cfg["BLOCK_N"], BLOCK_K=cfg["BLOCK_K"]),
        **options,
    )
    return out


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float | None = None,
              mask: torch.Tensor | None = None) -> torch.Tensor:
    """PyTorch's fused attention: ``F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)``.

    ``q``: ``(..., L, E)``, ``k``: ``(..., S, E)``, ``v``: ``(..., S, Ev)`` → ``(..., L, Ev)``.
    The flash, memory-efficient and cuDNN kernels need each operand's last dim
    contiguous and a mask in the query's dtype; anything else silently drops to
    the op-by-op "math" backend (many kernels instead of one or two), so operands
    are fixed up first.
    """
    if q.stride(-1) != 1:
        q = q.contiguous()
    if k.stride(-1) != 1:
        k = k.contiguous()
    if v.stride(-1) != 1:
        v = v.contiguous()
    if mask is not None and mask.dtype != q.dtype and mask.is_floating_point():
        mask = mask.to(q.dtype)
    if mask is not None and mask.dim() and mask.stride(-1) != 1 and mask.shape[-1] != 1:
        mask = last_dim_contiguous(mask)
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)


def last_dim_contiguous(t: torch.Tensor) -> torch.Tensor:
    """``t``'s values with ``stride(-1) == 1``, its broadcast dims (stride 0) still broadcast: each distinct element
    copied once. T5's position bias is ``(1, H, L, S)`` permuted from the ``(L, S, H)`` embedding lookup (last stride
    H). The fused kernels want the mask's last dim contiguous too: with T5's as it was, the H200's profile of T5's
    fused graph has float32 SIMT GEMMs where the SDPA kernel should be (``sm80_xmma_gemm_f32f32``, 4 calls for 2
    layers, ``bench_corpus_h200_part9.json``): the math backend's, which computes fp16 in float32."""
    last = t.dim() - 1
    base = [1 if st == 0 and i != last else n for i, (n, st) in enumerate(zip(t.shape, t.stride()))]
    return t.as_strided(base, t.stride(), t.storage_offset()).contiguous().expand(t.shape)


def attention_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float | None = None,
                        mask: torch.Tensor | None = None) -> torch.Tensor:
    """Unfused attention: ``softmax(q @ kᵀ · scale + mask) @ v``, every intermediate in memory."""
    if scale is None:
        scale = q.shape[-1] ** -0.5
    p = matmul_softmax_reference(q, k.transpose(-2, -1), scale, mask)         # (..., L, S)
    return torch.matmul(p, v)                                                  # (..., L, Ev)


# ====================================================================== fused call targets

def fused_matmul_softmax(a, b, scale, mask, impl=None):
    """``softmax(a @ b * scale + mask, dim=-1)``, scores kept on chip where the Triton kernel runs (``impl``: what
    its lowering hands it, ``LOWERINGS``; None: the selection decides at the call)."""
    return matmul_softmax(a, b, scale, _mask_like(mask, a), impl=impl)


def fused_attention(q, k, v, scale, mask):
    """``softmax(q @ kᵀ * scale + mask) @ v`` as one scaled_dot_product_attention call."""
    return attention(q, k, v, scale, mask)  # it casts a floating mask to q's dtype, as _mask_like


def fused_attention_kt(q, k_t, v, scale, mask):
    """Like ``fused_attention`` when the graph holds ``kᵀ`` itself (not a transpose of ``k``)."""
    return attention(q, k_t.transpose(-2, -1), v, scale, mask)


def _mask_like(mask, x):
    """SDPA takes a bool mask or one in the query's dtype; the unfused add would have promoted."""
    if isinstance(mask, torch.Tensor) and mask.is_floating_point() and mask.dtype != x.dtype:
        return mask.to(x.dtype)
    return mask


# ====================================================================== rewrite

def _untransposed(b) -> torch.fx.Node | None:
    """``k`` when ``b`` is ``k.transpose(-2, -1)`` (or the equivalent permute), else None."""
    if not isinstance(b, torch.fx.Node) or b.op != "call_function":
        return None
    src = b.args[0] if b.args else None
    sval = aten.node_val(src)
    if not isinstance(src, torch.fx.Node) or not isinstance(sval, torch.Tensor) or sval.dim() < 2:
        return None
    nd = sval.dim()
    name = aten.aten_name(b)
    if name == "mT":
        return src
    if name in ("transpose", "swapaxes", "swapdims"):
        dims = sorted(d % nd for d in b.args[1:3])
        return src if dims == [nd - 2, nd - 1] else None
    if name == "permute":
        perm = [d % nd for d in b.args[1]]
        return src if perm == list(range(nd - 2)) + [nd - 1, nd - 2] else None
    return None


def rewrite(ctx: RewriteContext, chain, kernel: str) -> edit.Edit:
    """matmul [→ scale] [→ mask] → softmax [→ matmul] as one Triton kernel, or SDPA for the whole block.

    The forms real models write (scores from ``einsum``/``baddbmm``, a bias and a mask, a tensor scale, views
    between the adds, a soft-cap) go through ``_rewrite_forms``; the plain form keeps its own targets."""
    if not _plain(ctx, chain):
        return _rewrite_forms(ctx, chain)
    scores, softmax = ctx.node(chain, "scores"), ctx.node(chain, "softmax")
    members = set(ctx.members(chain))
    edit.only_identity_views(ctx, chain)  # refuses training-mode dropout before the second MatMul
    if aten.aten_name(scores) != "matmul":
        raise UseGeneric(WORDS("generic.not_matmul", op=aten.aten_name(scores)))
    a, b = scores.args[0], scores.args[1]
    scale = 1.0
    scale_node = ctx.node(chain, "scale")
    if scale_node is not None:
        value = ctx.scalar(edit.other_operand(scale_node, members, allow_scalar=True))
        if value is None:
            raise Refuse(WORDS("refuse.scale_tensor"))
        if aten.kind_of(scale_node) == "div":
            if isinstance(scale_node.args[0], torch.fx.Node) and scale_node.args[0] not in members:
                raise UseGeneric(WORDS("generic.scalar_div"))
            value = 1.0 / value
        scale = float(value)
    mask = None
    mask_node = ctx.node(chain, "mask")
    if mask_node is not None:
        edit.check_alpha(mask_node)
        mask = edit.other_operand(mask_node, members, allow_scalar=True)
        if not isinstance(mask, torch.fx.Node):
            mask = None  # softmax(s + c) == softmax(s): a constant shift does not change it
    check_softmax(ctx, chain, aten.node_val(a))
    context = ctx.node(chain, "context")
    if context is None:
        av, bv = aten.node_val(a), aten.node_val(b)
        if not isinstance(av, torch.Tensor) or not isinstance(bv, torch.Tensor):
            raise UseGeneric(WORDS("generic.no_shapes"))
        choice = select_matmul_softmax(ctx.device, ctx.run_dtype(av.dtype), ctx.run_dtype(bv.dtype), tuple(av.shape),
                                       tuple(bv.shape), True, mask is not None)
        return edit.whole_chain_edit(ctx, chain, fused_matmul_softmax, (a, b, scale, mask), choice)
    if aten.aten_name(context) != "matmul":
        raise UseGeneric(WORDS("generic.not_matmul", op=aten.aten_name(context)))
    v = context.args[1]
    k = _untransposed(b)
    av, bv, vv = aten.node_val(a), aten.node_val(b), aten.node_val(v)
    if not all(isinstance(t, torch.Tensor) for t in (av, bv, vv)) or av.dim() < 2:
        raise UseGeneric(WORDS("generic.attn_no_shapes"))
    if not (av.shape[:-2] == bv.shape[:-2] == vv.shape[:-2]):
        raise UseGeneric(WORDS("generic.broadcast"))
    terms = ((mask, list(aten.static_shape(mask_node) or ()), 1.0),) if mask is not None else ()
    p_shape = aten.static_shape(context.args[0])
    choice = block_choice(ctx, av, tuple(av.shape), tuple(bv.shape), mask is not None, p_shape is not None)
    if choice.impl == "unfused":
        raise Refuse(choice.label)          # measured: the model's own ops are faster here than SDPA
    if choice.impl == "triton":
        return edit.whole_chain_edit(ctx, chain, fused_capped_attention,
                                     (a, b, v, scale, None, False, False, terms, None, None, list(p_shape)), choice)
    target, first_k = (fused_attention, k) if k is not None else (fused_attention_kt, b)
    return edit.whole_chain_edit(ctx, chain, target, (a, first_k, v, scale, mask), choice)


# ---------------------------------------------------------------------- the forms real models write

#: Views that only regroup the batch dims of the scores when their last two dims stay (BLOOM's
#: ``(B·H, q, k) → (B, H, q, k)``, Swin's ``(B·nW, H, N, N) → (B, nW, H, N, N)`` around the window mask).
_RESHAPES = frozenset({"view", "_unsafe_view", "reshape", "unsqueeze", "squeeze", "flatten", "unflatten"})
_CAP_ROLES = ("cap_div", "cap_tanh", "cap_mul")
_MORE_MASKS = ("mask2", "mask3")


def einsum_form(equation: str) -> str | None:
    """``"k"`` for ``…ik,…jk->…ij`` (the second operand is K), ``"kn"`` for ``…ik,…kj->…ij`` (a plain
    batched matmul), None for any other equation (repeated, summed or broadcast indices)."""
    eq = str(equation).replace(" ", "")
    if eq.count("->") != 1 or "." in eq:
        return None
    lhs, out = eq.split("->")
    if lhs.count(",") != 1:
        return None
    x, y = lhs.split(",")
    if not (len(x) == len(y) == len(out) >= 2) or len(set(x)) != len(x) or len(set(y)) != len(y):
        return None
    batch = out[:-2]
    if x[:-2] != batch or y[:-2] != batch:
        return None
    i, k = x[-2:]
    j = out[-1]
    if out[-2] != i or len({i, j, k}) != 3 or set(batch) & {i, j, k}:
        return None
    if y[-2:] == j + k:
        return "k"
    if y[-2:] == k + j:
        return "kn"
    return None


def scores_shapes(a_shape, b_shape, b_is_k: bool, shape) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The scores' operand shapes as ``(…, M, K)`` and ``(…, K, N)`` (what ``select_matmul_softmax`` reads) for
    operands of shapes ``a_shape`` and ``b_shape`` (``b_is_k``: the second is K, ``(…, N, K)``), regrouped to the
    batch dims of ``shape`` (the softmax's, where views regroup them; None: ``a``'s own)."""
    m, k = a_shape[-2:]
    n = b_shape[-2] if b_is_k else b_shape[-1]
    batch = tuple(shape[:-2]) if shape is not None else tuple(a_shape[:-2])
    return batch + (int(m), int(k)), batch + (int(k), int(n))


def _scores_operands(a, b, qscale, qdiv, b_is_k, shape):
    """The scores' operands as ``(…, M, K) @ (…, K, N)``: the tensor scale folded into the queries
    (``(a·t) @ b == (a @ b)·t`` when ``t`` is constant along M and N), regrouped to ``shape``'s batch dims."""
    if qscale is not None:
        a = a / qscale if qdiv else a * qscale
    if b_is_k:
        b = b.transpose(-2, -1)
    if shape is not None:
        a = a.reshape(tuple(shape[:-2]) + tuple(a.shape[-2:]))
        b = b.reshape(tuple(shape[:-2]) + tuple(b.shape[-2:]))
    return a, b


def _total_mask(terms, shape, like: torch.Tensor) -> torch.Tensor | None:
    """The sum of the additive terms, each as it was added (its shape then), in the softmax's shape."""
    total = None
    for t, at_shape, coef in terms:
        t = _additive_mask(t, like.dtype)
        if coef != 1:
            t = t * coef
        if shape is not None and tuple(at_shape) != tuple(shape):
            t = t.expand(tuple(at_shape)).reshape(tuple(shape))
        total = t if total is None else total + t
    return _mask_like(total, like)


def scores_softmax_reference(a, b, scale=1.0, qscale=None, qdiv=False, b_is_k=False, terms=(), shape=None,
                             cap=None):
    """Unfused, in the model's order: ``(a @ b)`` (scaled by ``scale`` and the tensor ``qscale``), then each
    additive term in the shape it was added in, regrouped to ``shape``, then the softmax."""
    s = torch.matmul(a, b.transpose(-2, -1) if b_is_k else b)
    if qscale is not None:
        s = s / qscale if qdiv else s * qscale
    s = s * scale
    if cap is not None:
        s = torch.tanh(s / cap) * cap
    for t, at_shape, coef in terms:
        s = s.reshape(tuple(at_shape)) + _additive_mask(t, s.dtype) * coef
    if shape is not None:
        s = s.reshape(tuple(shape))
    return torch.softmax(s, dim=-1)


def fused_scores_softmax(a, b, scale, qscale, qdiv, b_is_k, terms, shape, cap=None, impl=None):
    """``softmax(a @ b · t · scale + Σ terms)`` in ``shape``: scores from a matmul, an einsum or a ``baddbmm``,
    the tensor scale ``t`` (constant along the score rows and columns) applied to the fp32 scores in the kernel,
    the bias and the mask summed once, Gemma2's soft-cap ``cap·tanh(s / cap)`` (``cap``) before them; one
    Triton kernel where it runs (``impl``: what its lowering hands it; None: the selection decides at the call)."""
    a, b = _scores_operands(a, b, None, False, b_is_k, shape)
    tscale = None
    if qscale is not None:
        tscale = 1.0 / qscale.float() if qdiv else qscale
    return matmul_softmax(a, b, scale, _total_mask(terms, shape, a), tscale, cap, impl)


def fused_attention_forms(q, b, v, scale, qscale, qdiv, b_is_k, terms, shape=None):
    """The whole block as one SDPA call with its additive mask (exact for a bias plus a mask: SDPA adds
    ``attn_mask`` to the scaled scores before its softmax); ``shape`` is the scores' own shape when terms were
    added in a regrouped one (Swin's window mask), else None."""
    q, b = _scores_operands(q, b, qscale, qdiv, b_is_k, None)
    return attention(q, b.transpose(-2, -1), v, scale, _total_mask(terms, shape, q))


def check_softmax(ctx: RewriteContext, chain, a_val) -> None:
    """The softmax over the last dim, and the dtypes from the scores through the softmax and the cast after it
    (``cast_is_exact``) as the fused kernels compute them; ``UseGeneric`` (inductor takes the chain) with the
    reason otherwise."""
    softmax = ctx.node(chain, "softmax")
    sm = aten.softmax_args(softmax)
    sval = aten.node_val(softmax)
    if sm is None:
        raise UseGeneric(WORDS("generic.not_softmax", op=aten.aten_name(softmax)))
    if not isinstance(sval, torch.Tensor) or sm.dim not in (-1, sval.dim() - 1):
        raise Refuse(WORDS("refuse.dim", dim=sm.dim))
    if not isinstance(a_val, torch.Tensor):
        raise UseGeneric(WORDS("generic.no_shapes"))
    cast = ctx.node(chain, "cast")
    out = sval if cast is None else aten.node_val(cast)
    if cast is not None and not str(cast.target).startswith(_CAST_TARGETS):
        raise UseGeneric(WORDS("generic.cast_op", op=str(cast.target)))
    if not isinstance(out, torch.Tensor):
        raise UseGeneric(WORDS("generic.no_shapes"))
    names = (_dtype_name(a_val.dtype), _dtype_name(sval.dtype), _dtype_name(out.dtype))
    if cast_is_exact(*names):
        return
    if cast is None:
        raise UseGeneric(WORDS("generic.upcasts" if sm.half_to_float else "generic.casts"))
    raise UseGeneric(WORDS("generic.cast_back", scores=names[0], probs=names[1], out=names[2]))


def fused_capped_attention(q, b, v, scale, qscale, qdiv, b_is_k, terms, shape, cap, p_shape, impl=None):
    """Gemma2's soft-capped attention: ``softmax(cap·tanh(q @ kᵀ·scale / cap) + Σ terms)`` from the Triton scores
    kernel (SDPA has no soft-cap), regrouped to ``p_shape`` (what the model's P·V reads), then ``P @ v``."""
    p = fused_scores_softmax(q, b, scale, qscale, qdiv, b_is_k, terms, shape, cap, impl)
    return torch.matmul(p.reshape(tuple(p_shape)), v)


def _plain(ctx: RewriteContext, chain) -> bool:
    """The form the first kernel was written for: a matmul, a scalar scale, at most one add, no regrouping."""
    scores = ctx.node(chain, "scores")
    if aten.aten_name(scores) != "matmul" or any(ctx.node(chain, r) is not None for r in _CAP_ROLES + _MORE_MASKS):
        return False
    scale_node = ctx.node(chain, "scale")
    if scale_node is not None:
        members = set(ctx.members(chain))
        operand = edit.other_operand(scale_node, members, allow_scalar=True)
        if ctx.scalar(operand) is None:
            return False
    compute = set(chain.compute_nodes)
    return not any(aten.aten_name(ctx.by_name[n]) in _RESHAPES for n in chain.nodes if n not in compute)


def _matmul_form(node) -> tuple[Any, Any, bool] | None:
    """``(a, b, b_is_k)`` of a matmul-like node (``matmul``/``bmm``/a matmul-form ``einsum``), else None."""
    name = aten.aten_name(node)
    if name in ("matmul", "bmm"):
        return node.args[0], node.args[1], False
    if name == "einsum":
        form = einsum_form(node.args[0])
        operands = node.args[1]
        if form is None or not isinstance(operands, (list, tuple)) or len(operands) != 2:
            return None
        return operands[0], operands[1], form == "k"
    return None


def _check_views(ctx: RewriteContext, chain, scores_shape) -> tuple[int, ...] | None:
    """The softmax's shape when views between the scores and the softmax regroup the batch dims (else None);
    refuses training dropout and any other op or reshape."""
    compute = set(chain.compute_nodes)
    softmax = ctx.node(chain, "softmax")
    reshaped = False
    for name in chain.nodes:
        if name in compute:
            continue
        node = ctx.by_name[name]
        if edit.is_identity_view(node):
            continue
        aname = aten.aten_name(node)
        shape = aten.static_shape(node)
        if aname not in _RESHAPES or shape is None or scores_shape is None:
            raise UseGeneric(BASE_WORDS("op_inside", op=aname))
        if tuple(shape[-2:]) != tuple(scores_shape[-2:]) or math.prod(shape) != math.prod(scores_shape):
            raise UseGeneric(WORDS("generic.reshape", before=list(scores_shape), after=list(shape)))
        if tuple(shape) != tuple(scores_shape):
            reshaped = True
    out = aten.static_shape(softmax)
    return out if reshaped else None


def _soft_cap(ctx: RewriteContext, chain, members: set) -> float | None:
    """The cap of ``cap·tanh(s / cap)`` (div, tanh, mul by the same constant), None without one; any other
    tanh form goes to inductor."""
    nodes = [ctx.node(chain, r) for r in _CAP_ROLES]
    if all(n is None for n in nodes):
        return None
    div, _tanh, mul = nodes
    if div is None or mul is None or not isinstance(div.args[0], torch.fx.Node) or div.args[0] not in members:
        raise UseGeneric(WORDS("generic.softcap_form"))
    caps = [ctx.scalar(edit.other_operand(n, members, allow_scalar=True)) for n in (div, mul)]
    if caps[0] is None or caps[0] != caps[1] or caps[0] == 0:
        raise UseGeneric(WORDS("generic.softcap_form"))
    return float(caps[0])


def _rewrite_forms(ctx: RewriteContext, chain) -> edit.Edit:
    """Scores from ``einsum``/``baddbmm``/``bmm``, a tensor scale, a bias and a mask (views between them),
    as one Triton scores→softmax kernel or, with the second MatMul, one SDPA call with an additive mask."""
    scores, softmax = ctx.node(chain, "scores"), ctx.node(chain, "softmax")
    members = set(ctx.members(chain))
    cap = _soft_cap(ctx, chain, members)
    scores_shape = aten.static_shape(scores)
    shape = _check_views(ctx, chain, scores_shape)
    scale, terms = 1.0, []
    name = aten.aten_name(scores)
    if name == "baddbmm":
        args = aten.args_of(scores)
        a, b, b_is_k = args["batch1"], args["batch2"], False
        scale = float(args.get("alpha", 1))
        if not isinstance(args["self"], torch.fx.Node) or scores_shape is None:
            raise UseGeneric(WORDS("generic.mask_operand", node=scores.name))
        if float(args.get("beta", 1)) != 0:
            terms.append((args["self"], list(scores_shape), float(args.get("beta", 1))))
    else:
        form = _matmul_form(scores)
        if form is None:
            raise UseGeneric(WORDS("generic.einsum", equation=scores.args[0]) if name == "einsum"
                             else WORDS("generic.not_matmul", op=name))
        a, b, b_is_k = form
    qscale, qdiv = None, False
    scale_node = ctx.node(chain, "scale")
    if scale_node is not None:
        operand = edit.other_operand(scale_node, members, allow_scalar=True)
        value = ctx.scalar(operand)
        is_div = aten.kind_of(scale_node) == "div"
        if is_div and isinstance(scale_node.args[0], torch.fx.Node) and scale_node.args[0] not in members:
            raise UseGeneric(WORDS("generic.scalar_div"))
        if value is not None:
            scale *= 1.0 / value if is_div else value
        else:
            tshape = aten.static_shape(operand)
            if tshape is None or any(d != 1 for d in tshape[-2:]) or len(tshape) > len(scores_shape or ()):
                raise Refuse(WORDS("refuse.scale_rows", shape=list(tshape or ())))
            qscale, qdiv = operand, is_div
            if shape is not None and tuple(shape) != tuple(scores_shape):
                raise UseGeneric(WORDS("generic.reshape", before=list(scores_shape), after=list(shape)))
    for role in ("mask",) + _MORE_MASKS:
        node = ctx.node(chain, role)
        if node is None:
            continue
        edit.check_alpha(node)
        other = edit.other_operand(node, members, allow_scalar=True)
        if isinstance(other, torch.fx.Node):
            terms.append((other, list(aten.static_shape(node) or ()), 1.0))
        elif ctx.scalar(other) is None:
            raise UseGeneric(WORDS("generic.mask_operand", node=node.name))
        # a constant shift does not change a softmax: dropped
    terms = tuple(terms)
    av, bv = aten.node_val(a), aten.node_val(b)
    if not isinstance(av, torch.Tensor) or not isinstance(bv, torch.Tensor):
        raise UseGeneric(WORDS("generic.no_shapes"))
    check_softmax(ctx, chain, av)
    context = ctx.node(chain, "context")
    if context is None:
        choice = select_matmul_softmax(ctx.device, ctx.run_dtype(av.dtype), ctx.run_dtype(bv.dtype),
                                       *scores_shapes(av.shape, bv.shape, b_is_k, shape), True, bool(terms))
        label = WORDS("label.forms", label=choice.label, scores=name, terms=len(terms))
        return edit.whole_chain_edit(ctx, chain, fused_scores_softmax,
                                     (a, b, scale, qscale, qdiv, b_is_k, terms, shape, cap),
                                     Choice(choice.impl, label, choice.fused))
    cform = _matmul_form(context)
    if cform is None or cform[2]:
        raise UseGeneric(WORDS("generic.not_matmul", op=aten.aten_name(context)))
    v = cform[1]
    p_shape = aten.static_shape(cform[0])
    if cap is not None:
        # SDPA has no soft-cap: the Triton scores kernel applies it, then P·V is one matmul
        choice = select_matmul_softmax(ctx.device, ctx.run_dtype(av.dtype), ctx.run_dtype(bv.dtype),
                                       *scores_shapes(av.shape, bv.shape, b_is_k, shape), True, bool(terms))
        if choice.impl != "triton" or p_shape is None:
            raise UseGeneric(WORDS("generic.softcap"))
        label = WORDS("label.forms", label=WORDS("label.capped", label=choice.label), scores=name, terms=len(terms))
        return edit.whole_chain_edit(ctx, chain, fused_capped_attention,
                                     (a, b, v, scale, qscale, qdiv, b_is_k, terms, shape, cap, list(p_shape)),
                                     Choice(choice.impl, label, choice.fused))
    choice = block_choice(ctx, av, *scores_shapes(av.shape, bv.shape, b_is_k, shape), bool(terms), p_shape is not None)
    if choice.impl == "triton":   # the scores kernel in the softmax's shape, then P·V in the shape the model reads
        label = WORDS("label.forms", label=choice.label, scores=name, terms=len(terms))
        return edit.whole_chain_edit(ctx, chain, fused_capped_attention,
                                     (a, b, v, scale, qscale, qdiv, b_is_k, terms, shape, None, list(p_shape)),
                                     Choice(choice.impl, label, choice.fused))
    if shape is not None and tuple(shape) != tuple(scores_shape):
        if p_shape is None or tuple(p_shape) != tuple(scores_shape):
            raise UseGeneric(WORDS("generic.reshape_context"))
        # BLOOM: the scores regrouped (B·H, q, k) → (B, H, q, k) for the mask and back for P·V: SDPA runs in the
        # scores' layout, each additive term regrouped to it
        shape = list(scores_shape)
    vv = aten.node_val(v)
    if not isinstance(vv, torch.Tensor) or av.dim() < 2 or not (av.shape[:-2] == bv.shape[:-2] == vv.shape[:-2]):
        raise UseGeneric(WORDS("generic.broadcast"))
    if choice.impl == "unfused":
        raise Refuse(choice.label)          # measured: the model's own ops are faster here than SDPA
    label = WORDS("label.forms", label=choice.label, scores=name, terms=len(terms))
    return edit.whole_chain_edit(ctx, chain, fused_attention_forms, (a, b, v, scale, qscale, qdiv, b_is_k, terms, shape),
                                 Choice(choice.impl, label, choice.fused))


#: Up to this many tokens the measured table keys on the exact count: window attention lives there, and its
#: choice changes between neighbouring counts (H200: Swin-T's 49-token windows run faster as the model's own ops,
#: Swin-V2's 64-token windows faster as SDPA, and the two once shared one power-of-two key).
EXACT_S_UP_TO = 256


def s_bucket(s: int) -> int:
    """The token-count key of the measured table: ``s`` itself up to ``EXACT_S_UP_TO`` (49, 64, 197 apart), the
    next power of two above (1000 and 1024 share 1024)."""
    s = max(1, int(s))
    return s if s <= EXACT_S_UP_TO else next_power_of_2(s)


# ---------------------------------------------------------------------- the measured table

#: The committed table (package data), baked from ``benchmarks/bench_attention_choice.py``'s JSON by
#: ``python3 benchmarks/bench_attention_choice.py --bake RESULT.json``.
TABLE_FILE = "attention_measured.json"
TABLE_SCHEMA = "attention_measured/1"
#: The candidates a row may time: the whole block as one SDPA call, the model's own ops, the Triton scores kernel
#: then P·V as one matmul.
CANDIDATES = ("sdpa", "unfused", "triton")
_KEY_FIELDS = ("device", "dtype", "s_bucket", "d", "has_terms")
_PLANNED_FOR: contextvars.ContextVar[str | None] = contextvars.ContextVar("attention_device_name", default=None)
TableError = measured_tables.TableError


def _row_ok(row: object) -> bool:
    return (isinstance(row, dict) and isinstance(row.get("device"), str) and row.get("dtype") in DTYPE_KEYS
            and all(isinstance(row.get(f), int) and not isinstance(row.get(f), bool) for f in ("s_bucket", "d"))
            and isinstance(row.get("has_terms"), bool) and isinstance(row.get("us"), dict)
            and "sdpa" in row["us"] and set(row["us"]) <= set(CANDIDATES)
            and all(isinstance(band, list) and len(band) == 3 and all(isinstance(x, (int, float)) and x >= 0
                                                                      for x in band)
                    for band in row["us"].values()))


TABLE = measured_tables.MeasuredTable(__package__, TABLE_FILE, TABLE_SCHEMA, _row_ok,
                                      lambda row: tuple(row[f] for f in _KEY_FIELDS),
                                      "(device, dtype, s_bucket, d, has_terms, us)")


def read_table(text: str, where: str = TABLE_FILE) -> dict[tuple, dict]:
    """The rows of a measured table (``TABLE_SCHEMA`` JSON) by key ``(device, dtype, S bucket, D, has terms)``;
    ``TableError`` (one line) for anything else."""
    return TABLE.read(text, where)


def committed_table() -> dict[tuple, dict]:
    """The committed table (``explorer/fusions/attention_measured.json``); empty where the file is absent."""
    return TABLE.committed()


@contextlib.contextmanager
def measured_table(table: "str | os.PathLike | dict[tuple, dict]", device_name: str | None = None):
    """``with measured_table(path):`` ``select_attention`` reads this table (a file as ``read_table`` reads, or
    its rows) instead of the committed one; ``device_name``: the CUDA device a plan is made for where the planning
    machine has none (else its own device's name is used)."""
    token = _PLANNED_FOR.set(device_name)
    try:
        with TABLE.swapped(table) as rows:
            yield rows
    finally:
        _PLANNED_FOR.reset(token)


def planned_device_name(device: torch.device) -> str | None:
    """The name the table is keyed by for ``device``: the one ``measured_table`` was given, else torch's name of
    this machine's CUDA device; None where neither is known (a plan for CUDA made on a machine without one)."""
    given = _PLANNED_FOR.get()
    if given:
        return given
    if device.type == "cuda" and torch.cuda.is_available():
        try:
            return torch.cuda.get_device_name(device)
        except (RuntimeError, AssertionError, ValueError):
            return None
    return None


#: The table's dtype names (``torch.float16`` → ``"float16"``).
DTYPE_KEYS = ("float16", "bfloat16", "float32")


def measured_best(row: dict, allowed: tuple[str, ...] = CANDIDATES) -> str:
    """The candidate a row picks among ``allowed``: the fastest median, but another than SDPA only when its p80
    is below SDPA's p20 (clearly faster, not within the rounds' spread); SDPA otherwise (today's choice)."""
    us = {n: band for n, band in row["us"].items() if n in allowed or n == "sdpa"}
    best = min(us, key=lambda n: us[n][0])
    if best != "sdpa" and not us[best][2] < us["sdpa"][1]:
        return "sdpa"
    return best


def _us(x: float) -> str:
    return f"{x:.0f}" if x >= 10 else f"{x:.1f}"


@selection
def select_attention(device: torch.device | str, dtype: torch.dtype | None = None, s: int | None = None,
                     d: int | None = None, has_terms: bool = False, scores_kernel: bool = False) -> Choice:
    """How the whole attention block (``s`` keys, head dim ``d``, additive terms or not, in ``dtype``) runs on
    ``device``: ``sdpa`` (PyTorch's fused kernel), ``triton`` (the scores→softmax kernel, then P·V as one matmul;
    only where ``scores_kernel``: ``select_matmul_softmax`` gives it) or ``unfused`` (the model's own ops: the
    rewrite leaves the chain, with the label as its reason), as the measured table says for the device's name
    (``measured_best``). A CPU device, and a shape, dtype or device the table lacks, keep SDPA (and say so)."""
    device = torch.device(device)
    if device.type != "cuda":
        return Choice("sdpa", WORDS("label.sdpa_cpu", device=device.type), True)
    if dtype is None or s is None or d is None:
        return Choice("sdpa", WORDS("label.sdpa"), True)
    name = planned_device_name(device)
    dtype_key = _dtype_name(dtype)
    row = TABLE.rows().get((name, dtype_key, s_bucket(s), int(d), bool(has_terms)))
    if row is None:
        return Choice("sdpa", WORDS("label.sdpa_unmeasured", label=WORDS("label.sdpa"), s=s, bucket=s_bucket(s), d=d,
                                    dtype=dtype_key, device=name or WORDS("device_unknown")), True)
    allowed = ("sdpa", "unfused") + (("triton",) if scores_kernel else ())
    best = measured_best(row, allowed)
    us = {n: _us(band[0]) for n, band in row["us"].items()}
    fields = dict(s=", ".join(str(x) for x in row.get("s", [s])), d=d, device=name, dtype=dtype_key,
                  sdpa=us["sdpa"], shapes=len(row.get("cases", ())) or 1)
    if best == "unfused":
        return Choice("unfused", WORDS("refuse.measured", unfused=us["unfused"], **fields), False)
    if best == "triton":
        return Choice("triton", WORDS("label.triton_measured", triton=us["triton"], **fields), True)
    if "unfused" in us:
        return Choice("sdpa", WORDS("label.sdpa_measured", label=WORDS("label.sdpa"), unfused=us["unfused"], **fields),
                      True)
    return Choice("sdpa", WORDS("label.sdpa_measured_alone", label=WORDS("label.sdpa"), **fields), True)


def block_choice(ctx: RewriteContext, a_val: torch.Tensor, scores_a: tuple, scores_b: tuple,
                 has_terms: bool, triton_fits: bool = True) -> Choice:
    """``select_attention`` asked once for this chain in the run's dtype, from the scores' operand shapes
    (``(…, M, K)`` and ``(…, K, N)``: N keys of head dim K); the Triton scores kernel is a candidate where the
    rewrite can build its call (``triton_fits``: P·V's operand shape is known) and ``select_matmul_softmax``
    gives it for the same shapes."""
    dtype = ctx.run_dtype(a_val.dtype)
    kernel = triton_fits and select_matmul_softmax(ctx.device, dtype, dtype, tuple(scores_a), tuple(scores_b), True,
                                                   has_terms).impl == "triton"
    return select_attention(ctx.device, dtype, int(scores_b[-1]), int(scores_a[-1]), has_terms, kernel)


# ====================================================================== lowering (lean graphs)

def _lower_scores(node: torch.fx.Node, device: torch.device, dtype: torch.dtype, arity: int, b_is_k: bool,
                  shape, has_terms: bool) -> bool:
    """Hand a fused scores→softmax call the impl decided for this device and dtype: the rewrite's
    (``edit.planned``), else (a call fused for another target) the selection's, asked here once from the
    shapes the graph records (its operands are floating, in ``dtype`` once the graph is prepared)."""
    choice = edit.planned(node, device, dtype)
    if choice is None:
        a_shape, b_shape = aten.static_shape(node.args[0]), aten.static_shape(node.args[1])
        if a_shape is None or b_shape is None or len(a_shape) < 2 or len(b_shape) < 2:
            return False                                          # the call asks at run time, as before
        choice = select_matmul_softmax(device, dtype, dtype, *scores_shapes(a_shape, b_shape, b_is_k, shape), True,
                                       has_terms)
    return edit.bind_choice(node, arity, choice.impl)


def _lower_forms(node: torch.fx.Node, device: torch.device, dtype: torch.dtype, arity: int, at: int) -> bool:
    """``fused_scores_softmax`` (``at`` 5) / ``fused_capped_attention`` (6, after ``v``): ``b_is_k, terms, shape``
    from argument ``at`` on."""
    if len(node.args) < arity:
        return False
    b_is_k, terms, shape = node.args[at:at + 3]
    return _lower_scores(node, device, dtype, arity, bool(b_is_k), shape, bool(terms))


#: fused call target -> lowering(gm, node, device, dtype) -> bool (explorer.runtime.lean). The SDPA calls
#: (``fused_attention*``) decide nothing at run time and are not lowered here.
LOWERINGS = {
    fused_matmul_softmax: lambda gm, node, device, dtype: _lower_scores(node, device, dtype, 4, False, None,
                                                                        node.args[3] is not None),
    fused_scores_softmax: lambda gm, node, device, dtype: _lower_forms(node, device, dtype, 9, 5),
    fused_capped_attention: lambda gm, node, device, dtype: _lower_forms(node, device, dtype, 11, 6),
}


# ====================================================================== patterns

def _scalar_scale(g, node: str, ctx: dict) -> str | None:
    """A constant, or a tensor constant along the score rows and columns (Swin-V2's per-head
    ``logit_scale``: it folds into the queries); a tensor that varies along them is refused."""
    if g.nodes[node].get("scalar_operand") or g.in_degree(node) == 1:
        return None
    others = [p for p in g.predecessors(node) if p != ctx["prev"]]
    shapes = [g.nodes[p].get("shapes") or [[]] for p in others]
    if len(others) == 1 and shapes[0] and all(d == 1 for d in shapes[0][0][-2:]):
        return None
    return WORDS("refuse.scale_rows", shape=shapes[0][0] if shapes and shapes[0] else [])


#: The casts a softmax's result may go through inside the chain (HF eager attention's
#: ``softmax(s, dtype=torch.float32).to(q.dtype)``; ``_to_copy`` in decomposed graphs; a copy that keeps the dtype).
_CAST_TARGETS = ("aten.to.", "aten._to_copy.", "aten.clone.", "aten.contiguous.")


def cast_is_exact(scores: str, probs: str, out: str) -> bool:
    """Whether scores in dtype ``scores``, a softmax computed in ``probs`` and its result cast to ``out`` (dtype
    names: ``"bfloat16"``) compute what the fused kernels do: the softmax in float32, the probabilities written in
    the scores' dtype. Exact when the result ends in the scores' dtype and the softmax computes in that dtype or,
    for fp16/bf16 scores, in float32 (the HF form). Both fused paths compute the softmax in float32 whatever the
    inputs: the Triton scores kernel (``acc`` and ``p`` above are fp32), and SDPA in every backend that matters: the
    flash, memory-efficient and cuDNN kernels keep the row max, the row sum and the probabilities in fp32 registers,
    and the math backend upcasts fp16/bf16 queries, keys and values to float32 unless
    ``torch.backends.cuda.allow_fp16_bf16_reduction_math_sdp(True)`` was set (PyTorch's
    ``aten/src/ATen/native/transformers/attention.cpp``: ``query_acc = ... query_.to(at::kFloat)`` under
    ``!ctx.allowFP16BF16ReductionMathSDP()``). A float64 softmax of float32 scores, or one cast to another dtype
    than the scores', is not what they compute."""
    if out != scores:
        return False
    return probs == scores or (probs == "float32" and scores in ("float16", "bfloat16"))


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def _cast_back(g, node: str, ctx: dict) -> str | None:
    """The cast after the softmax joins the chain where it is a dtype cast back to the scores' dtype
    (``cast_is_exact``); otherwise the chain ends at the softmax (and its rewrite says why where it must)."""
    target = str(g.nodes[node].get("target", ""))
    if not target.startswith(_CAST_TARGETS):
        return WORDS("generic.cast_op", op=target)
    scores = min(ctx["chain"], key=lambda n: g.nodes[n]["order"])
    dtypes = [(g.nodes[n].get("dtypes") or [None])[0] for n in (scores, ctx["prev_real"], node)]
    if None in dtypes or not cast_is_exact(*dtypes):
        return WORDS("generic.cast_back", scores=dtypes[0], probs=dtypes[1], out=dtypes[2])
    return None


def _probs_left_operand(g, node: str, ctx: dict) -> str | None:
    if g.nodes[node].get("first_input") != ctx["prev"]:
        return WORDS("refuse.left")
    return None


#: "Already fused" ops: reported as near misses of the pattern they would have been.
ALREADY_FUSED = {"sdpa": "matmul_softmax"}

#: Which families this one must claim nodes before or after (explorer.fusions.order).
RUNS_BEFORE = ("conv", "linear")   # its MatMuls and softmax before any epilogue or elementwise chain

PATTERNS = (
    Pattern(
        name="matmul_softmax", label=WORDS("matmul_softmax.label"),
        steps=(
            Step(frozenset({"matmul", "baddbmm", "einsum"}), "scores"),
            Step(frozenset({"mul", "div"}), "scale", optional=True, guard=_scalar_scale),
            Step(frozenset({"div"}), "cap_div", optional=True),       # Gemma2's soft-cap: cap·tanh(s / cap)
            Step(frozenset({"tanh"}), "cap_tanh", optional=True),
            Step(frozenset({"mul"}), "cap_mul", optional=True),
            Step(frozenset({"add"}), "mask", optional=True),          # a bias, or a mask
            Step(frozenset({"add"}), "mask2", optional=True),         # a bias and a mask (Swin's shifted windows)
            Step(frozenset({"add"}), "mask3", optional=True),         # (HF Swin-V2 adds its window mask twice)
            Step(frozenset({"softmax"}), "softmax"),
            Step(frozenset({"to", "copy"}), "cast", optional=True, guard=_cast_back),  # HF: .to(q.dtype)
            Step(frozenset({"matmul", "einsum"}), "context", optional=True, guard=_probs_left_operand),
        ),
        color="#d62728", rewrite=rewrite,
        implementation=WORDS("matmul_softmax.implementation"),
        explanation=WORDS("matmul_softmax.explanation"),
        caveats=(PRECISION_CAVEAT, WORDS("matmul_softmax.caveat")),
    ),
)
