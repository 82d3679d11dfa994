"""The rotary family: the rotate-half embedding of Q and K (``apply_rotary_pos_emb``) in one Triton launch.

::

    unfused, per tensor (q, then k: 5 kernels each)
    t (B,H,S,D) ─┬─────────────────────────────────────────── mul(cos) ──┐
                 ├─ slice[D/2:] ─► neg ─┐                                 add ─► t_embed
                 └─ slice[:D/2] ────────cat ─► rotate_half(t) ─ mul(sin) ─┘
    cos, sin: (B|1, S, D), unsqueezed to (B|1, 1, S, D)

    fused (1 kernel for q and k): program (token b·S+s, head block); cos/sin rows loaded once
    t1, t2 = t[..., :D/2], t[..., D/2:]                        (fp32)
    out[..., :D/2] = t1·cos[:D/2] − t2·sin[:D/2]
    out[..., D/2:] = t2·cos[D/2:] + t1·sin[D/2:]                one rounding to the output dtype

The formula is ``apply_rotary_pos_emb``'s element by element for any cos/sin (it
does not assume Llama's duplicated halves). Q's and K's head blocks share one
grid, so grouped-query attention (Hkv < Hq) costs no extra launch. q and k may be
strided views (the transpose of a (B, S, H, D) projection, or a column slice of
the Q/K/V GEMM); only the last dim must be contiguous (else a copy is made).
Outputs take q's and k's memory layout (``empty_like``).

Arithmetic: fp32, one rounding. Eager rounds the two products and the sum in the
dtype (three roundings), so the fused result is the more accurate one; see
``TOLERANCES``/``EAGER_TOLERANCES``. Output dtype: ``promote(q, cos)`` as eager's.

Supported: fp32, fp16, bf16; even D up to 1024; q and k of one dtype, batch and
sequence; cos and sin of one shape ``(B or 1, S, D)`` and dtype. ``select_rotary``
is the one decision, made at the rewrite for the run's target; the lean lowering hands
the recorded impl to the fused call (``_bind``), which then follows it (checking only
that the operands fit the kernel). Calls autograd records take the reference.

Matching: q (and k) fan out to the cos product and both slices, so the pattern
brings its own matcher (``_match_rotary``), anchored at q's ``neg``; it then finds
the partner tensor (k) rotated with the same cos and sin.

Program layout: a program rotates a (tokens × heads × D/2) tile of q or of k, about
``TILE`` elements a half (16-byte vectors, no mask along D when D/2 is a power of
two); under GQA K's programs take proportionally more tokens, and Q's and K's
programs of the same tokens are neighbours in the 1-D grid (cos/sin read once).

Rotary in the QKV GEMM's epilogue (``qkv_rotary``, ``kernels.gemm.gemm_qkv_rotary``):
where q and k are the first two column views of the siblings' one QKV GEMM
(viewed (B, S, H, D), transposed) and the third is v, the lean lowering
(``LOWERINGS``) replaces the GEMM and this kernel by one Triton GEMM whose tile
holds both halves of whole heads: q and k are rotated from the fp32 accumulator
with each row's cos/sin and stored as (B, H, S, D), v stored plain. It runs for a
shape only where ``kernels.measured`` says it measured faster than cuBLAS + this
kernel (``qkv_decision``); the chain's label carries the verdict, or why q, k, v
cannot share the GEMM (``_qkv_rewrite_note``). On the H200: 2.2x faster at the
zoo decoder's sizes, 30% slower at Llama-3-8B's.

cos/sin as whole tiles in x's register layout (``TABLE_TILE``, off): proposed from the sm_90 PTX (no
shared-memory broadcast, 16-byte loads only), not yet measured; the measured broadcast rows stay the default.

Token-major outputs (``TOKEN_MAJOR_ON_COLUMN_VIEWS``, off): on the QKV column views
they measured no faster at the zoo's sizes (94.2% of copy against 95.1%) and
slower at 8B's (84.8% against 96.5%), so outputs keep ``empty_like``'s layout.
"""

from __future__ import annotations

import functools
import operator

import networkx as nx
import torch
import torch.fx
import torch.nn.functional as F

from explorer.fusions import edit, siblings
from explorer.fusions.kernels import gemm as gemm_kernels
from explorer.fusions.kernels import measured
from explorer.fusions.base import WORDS as BASE_WORDS
from explorer.fusions.base import PRECISION_CAVEAT, Choice, NoMatch, Pattern, Step, selection
from explorer.fusions.edit import RewriteContext, UseGeneric
from explorer.fusions.triton_support import where
from explorer.fusions.triton_support import (Launch, import_triton, interpreting, jit_helpers, launch, needs_autograd,
                                             next_power_of_2, operand_key, planned, refusal_for_device)
from explorer.graph import aten
from explorer.words import Words

#: What this family says to a person, in English and 中文 (rendered by explorer.ui.i18n by id).
WORDS = Words("rotary", {
    "title": ("Rotary embedding", "旋转位置编码"),
    "rotary.label": ("Rotary embedding (Q+K)", "旋转位置编码（Q+K）"),
    "rotary.implementation": ("one Triton kernel rotating q and k (all heads, grouped-query attention included)",
                              "一个 Triton 内核旋转 q 和 k（所有头，包括分组查询注意力）"),
    "rotary.explanation": (("Rotary position embedding, written as transformers writes it, is a multiply, two "
                            "slices, a negation, a concatenation, a second multiply and an add, for q and again "
                            "for k: ten kernels, each reading and writing a whole (batch, heads, sequence, "
                            "head_dim) tensor. One kernel reads each q and k element once, with its cos and sin "
                            "row, and writes the rotated value."),
                           ("按 transformers 的写法，旋转位置编码是一次乘法、两次切片、一次取负、一次拼接、第二次乘法和一次加法，q 做一遍、k "
                            "再做一遍：十个内核，每个都读写一整个（batch, heads, sequence, head_dim）张量。一个内核把每个 q、k 元素连同它的 cos、sin "
                            "行只读一次，写出旋转后的值。")),
    "rotary.caveat": ("The rotation is computed in fp32 and rounded once (eager rounds three times).",
                      "旋转用 fp32 计算、只舍入一次（eager 舍入三次）。"),
    "rotary.formula": ("t' = t·cos + rotate_half(t)·sin,  rotate_half(t) = (−t[D/2:], t[:D/2])",
                       "t' = t·cos + rotate_half(t)·sin，  rotate_half(t) = (−t[D/2:], t[:D/2])"),
    "why.dtype": ("{what} dtype {dtype} is not one of fp32/fp16/bf16", "{what} 的数据类型 {dtype} 不是 fp32/fp16/bf16 之一"),
    "why.head_dim": ("head_dim {d} is odd or outside 2..{max}", "head_dim {d} 是奇数或超出 2..{max}"),
    "why.dtypes": ("q is {q} but k is {k}", "q 是 {q}，k 却是 {k}"),
    "why.shapes": ("q {q} and k {k} are not (B, H, S, D) of one B, S and D",
                   "q {q} 与 k {k} 不是同一组 B、S、D 的 (B, H, S, D)"),
    "why.tables": ("cos {cos} / sin {sin} are not one shape ({b} or 1, {s}, {d})",
                   "cos {cos} / sin {sin} 不是同一个形状（{b} 或 1, {s}, {d}）"),
    "label.reference": ("apply_rotary_pos_emb (eager ops: {why})", "apply_rotary_pos_emb（eager 算子：{why}）"),
    "label.triton": ("triton rotary q+k (1 kernel)", "triton rotary q+k（1 个内核）"),
    "refuse.one": ("only one tensor is rotated with these cos and sin (the kernel rotates q and k together)",
                   "用这组 cos 和 sin 旋转的只有一个张量（该内核同时旋转 q 和 k）"),
    "generic.table": ("the constant {what} is not a (B, 1, S, D) table", "常量 {what} 不是 (B, 1, S, D) 的表"),
    "generic.unsqueeze": ("{what} is not unsqueeze({what}, 1) of a (B, S, D) tensor",
                          "{what} 不是对 (B, S, D) 张量做的 unsqueeze({what}, 1)"),
    "generic.different": ("q and k are rotated with different cos/sin", "q 和 k 用不同的 cos/sin 旋转"),
    "label.with_note": ("{label}; kernel note: {note}", "{label}；内核说明：{note}"),
    "label.qkv": (("one Triton GEMM over [W_q; W_k; W_v] with rotary in its epilogue: q and k rotated before the "
                   "store, straight into (B, H, S, D)"),
                  "一个 Triton GEMM 作用在 [W_q; W_k; W_v] 上，尾处理里做旋转：q、k 在写出前旋转，直接写成 (B, H, S, D)"),
    "note.faster": (("rotary in the QKV GEMM's epilogue at M={m}, K={k}, {hq} over {hkv} heads of {d} in bf16: "
                     "{ours:.3f} ms against cuBLAS + rotary kernel {base:.3f} ms on {device}: the epilogue runs there"),
                    "在 M={m}、K={k}、{hq}/{hkv} 个 {d} 维头、bf16 下，QKV GEMM 尾处理里的旋转：{ours:.3f} ms，"
                    "cuBLAS + 旋转内核为 {base:.3f} ms（{device}）：在那里运行尾处理版本"),
    "note.slower": (("rotary in the QKV GEMM's epilogue (near miss): at M={m}, K={k}, {hq} over {hkv} heads of {d} in "
                     "bf16 it measured {ours:.3f} ms against cuBLAS + rotary kernel {base:.3f} ms on {device}, so the "
                     "rotary kernel runs after cuBLAS"),
                    "QKV GEMM 尾处理里的旋转（差一点）：在 M={m}、K={k}、{hq}/{hkv} 个 {d} 维头、bf16 下实测 {ours:.3f} ms，"
                    "cuBLAS + 旋转内核为 {base:.3f} ms（{device}），所以在 cuBLAS 之后运行旋转内核"),
    "note.unmeasured": (("rotary in the QKV GEMM's epilogue is not measured at M={m}, K={k}, {hq} over {hkv} heads "
                         "of {d}: cuBLAS + the rotary kernel run"),
                        "QKV GEMM 尾处理里的旋转没有在 M={m}、K={k}、{hq}/{hkv} 个 {d} 维头下测过：运行 cuBLAS + 旋转内核"),
    "note.no_qkv": ("rotary in the QKV GEMM's epilogue (near miss): {why}", "QKV GEMM 尾处理里的旋转（差一点）：{why}"),
    "qkv.not_projection": ("{what} is not view + transpose of a linear projection",
                           "{what} 不是对一个线性投影做 view + transpose 的结果"),
    "qkv.no_v": ("no v projection of the same input beside q's and k's", "q、k 的投影旁边没有同一输入的 v 投影"),
    "qkv.shared": ("the unrotated {what} is read elsewhere too", "未旋转的 {what} 还被别处读取"),
    "qkv.order": ("the projections are not in the order q, k, v", "投影的顺序不是 q、k、v"),
    "qkv.tables": ("cos/sin are computed after the projections", "cos/sin 在投影之后才算出"),
    "qkv.teach": (("Why not always in the QKV GEMM? Its epilogue would rotate q and k while they are in "
                   "registers, saving the rotary kernel's read and write of q and k (at Llama-3-8B sizes, 4096 "
                   "tokens: 2 × 42 MB, about 25 µs), but the GEMM is then ours against cuBLAS, about 0.4 ms of "
                   "work: a few per cent slower there and the saving is gone. So it is chosen per shape, from a "
                   "measurement; otherwise the separate rotary kernel runs at copy speed."),
                  ("为什么不总放进 QKV GEMM？尾处理可以在 q、k 还在寄存器里时旋转，省掉旋转内核对 q、k 的一次读和一次写"
                   "（Llama-3-8B 尺寸、4096 个 token：2 × 42 MB，约 25 µs），但 GEMM 就成了我们的对 cuBLAS，约 0.4 ms 的计算："
                   "慢上几个百分点，省下的就没了。所以按形状、依据实测来选；否则单独的旋转内核以拷贝的速度运行。")),
})


MAX_HEAD_DIM = 1024
SUPPORTED_DTYPES = (torch.float32, torch.float16, torch.bfloat16)

#: Fused kernel vs float64 (``rotary_reference`` on upcast inputs), ``|out - ref| <= atol + rtol·|ref|``,
#: for unit-scale q, k (|x| up to ~5) and |cos|, |sin| <= 1. u = unit roundoff (fp32 6e-8, fp16 4.9e-4,
#: bf16 3.9e-3). 16-bit: the products of two 16-bit values are exact in fp32, their difference is
#: rounded in fp32 (~6e-7 absolute at this scale), then once to the dtype (<= u relative): rtol = 1.5u,
#: atol 2e-6. fp32: two rounded products and a rounded sum (a fused multiply-add saves one), u of each
#: term: <= 3·6e-8·(|x1·c| + |x2·s|) ~ 2e-6 absolute at worst here, so atol 2e-6 with rtol 1e-6. atol
#: (not rtol) carries cancellation: a result near 0 from two large terms errs relative to the terms.
TOLERANCES = {
    torch.float32: dict(rtol=1e-6, atol=2e-6),
    torch.float16: dict(rtol=7.3e-4, atol=2e-6),    # 1.5u
    torch.bfloat16: dict(rtol=5.9e-3, atol=2e-6),   # 1.5u
}

#: Fused kernel vs eager in the dtype (what a model-level check compares), same unit scale: eager
#: rounds x1·c and x2·s (u of each term, up to ~5 each) and their sum (u): atol = 10u covers the
#: terms' rounding, rtol = 2u the two final roundings (eager's and ours).
EAGER_TOLERANCES = {
    torch.float32: dict(rtol=1e-6, atol=2e-6),
    torch.float16: dict(rtol=9.8e-4, atol=4.9e-3),   # 2u, 10u
    torch.bfloat16: dict(rtol=7.8e-3, atol=3.9e-2),  # 2u, 10u
}


def rotate_half_reference(x: torch.Tensor) -> torch.Tensor:
    """transformers' ``rotate_half``: ``cat(-x[..., D/2:], x[..., :D/2])`` over the last dim."""
    x1 = x[..., : x.shape[-1] // 2]                                           # (..., D/2)
    x2 = x[..., x.shape[-1] // 2:]                                            # (..., D/2)
    return torch.cat((-x2, x1), dim=-1)                                       # (..., D)


def rotary_reference(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                     unsqueeze_dim: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """transformers' ``apply_rotary_pos_emb`` (Llama), op for op, in the inputs' dtype.

    ``q``: (B, Hq, S, D), ``k``: (B, Hkv, S, D) (or (B, S, H, D) with ``unsqueeze_dim=2``);
    ``cos``, ``sin``: (B or 1, S, D). Returns ``(q_embed, k_embed)``; on float64 inputs, the tests' oracle.
    """
    cos = cos.unsqueeze(unsqueeze_dim)                                        # (B|1, 1, S, D)
    sin = sin.unsqueeze(unsqueeze_dim)
    q_embed = (q * cos) + (rotate_half_reference(q) * sin)                   # (B, Hq, S, D)
    k_embed = (k * cos) + (rotate_half_reference(k) * sin)                    # (B, Hkv, S, D)
    return q_embed, k_embed


# ====================================================================== kernel selection

@selection
def select_rotary(device: torch.device | str, dtype: torch.dtype | None = None, head_dim: int | None = None, *,
                  k_dtype: torch.dtype | None = None, cos_dtype: torch.dtype | None = None,
                  q_shape=None, k_shape=None, cos_shape=None, sin_shape=None, requires_grad: bool = False) -> Choice:
    """The one decision of how the rotary embedding of q and k runs: ``triton`` (one kernel) or ``reference``.

    Shapes in the (B, H, S, D) convention. Only ``device`` is required; arguments left as None raise
    no objection. ``requires_grad``: autograd would record the call (the kernel is forward-only).
    """
    why = refusal_for_device(device) or _dtype_refusal(dtype, cos_dtype)
    if why is None and requires_grad:
        why = BASE_WORDS("autograd")
    why = why or _shape_refusal(dtype, head_dim, k_dtype, q_shape, k_shape, cos_shape, sin_shape)
    if why is not None:
        return Choice("reference", WORDS("label.reference", why=why), False)
    return Choice("triton", where(WORDS("label.triton"), torch.device(device)), True)


def _dtype_refusal(dtype, cos_dtype) -> str | None:
    """Why the kernel does not take q (``dtype``) or cos/sin of these dtypes (None: it does)."""
    for what, dt in (("q", dtype), ("cos/sin", cos_dtype)):
        if dt is not None and dt not in SUPPORTED_DTYPES:
            return WORDS("why.dtype", what=what, dtype=dt)
    return None


def _shape_refusal(dtype, head_dim, k_dtype, q_shape, k_shape, cos_shape, sin_shape) -> str | None:
    """Why the kernel does not take operands of this head_dim, k dtype and shapes (None: it does)."""
    if head_dim is not None and (head_dim % 2 or not 2 <= head_dim <= MAX_HEAD_DIM):
        return WORDS("why.head_dim", d=head_dim, max=MAX_HEAD_DIM)
    if k_dtype is not None and dtype is not None and k_dtype != dtype:
        return WORDS("why.dtypes", q=dtype, k=k_dtype)
    if q_shape is not None and k_shape is not None:
        q_shape, k_shape = tuple(q_shape), tuple(k_shape)
        if len(q_shape) != 4 or len(k_shape) != 4 or (q_shape[0], q_shape[2], q_shape[3]) != (
                k_shape[0], k_shape[2], k_shape[3]):
            return WORDS("why.shapes", q=q_shape, k=k_shape)
    if q_shape is not None and cos_shape is not None:
        b, _, s, d = q_shape
        cos_shape = tuple(cos_shape)
        if cos_shape not in ((b, s, d), (1, s, d)) or (sin_shape is not None and tuple(sin_shape) != cos_shape):
            return WORDS("why.tables", cos=cos_shape, sin=None if sin_shape is None else tuple(sin_shape), b=b, s=s,
                         d=d)
    return None


# ====================================================================== the kernel

def launch_config(hq: int, hkv: int, head_dim: int, tokens: int = 1 << 30) -> tuple[int, int, int, int, int, int]:
    """``(BLOCK_HQ, BLOCK_HK, TOKENS_Q, TOKENS_K, BLOCK_HALF, num_warps)``: the program layout.

    A program rotates one (tokens × heads × D/2) tile of q or of k: Q's programs ``TOKENS_Q`` tokens of
    up to ``BLOCK_HQ`` heads, K's ``TOKENS_K`` tokens of up to ``BLOCK_HK`` heads (at most ``HEADS_TILE``
    elements of a half), each sized to about ``TILE`` elements of each half, so that under GQA a K program
    moves as many bytes as a Q program instead of a quarter of them. Q's and K's programs of the same
    tokens are launched next to each other (``_rotary_fwd``), so cos/sin rows are read from DRAM once.
    """
    block_half = next_power_of_2(head_dim // 2)
    cap = max(1, HEADS_TILE // block_half)               # heads of one program at most
    block_hq = min(next_power_of_2(hq), cap)
    block_hk = min(next_power_of_2(hkv), cap)
    tokens_q = max(1, TILE // (block_hq * block_half))
    tokens_k = max(tokens_q, TILE // (block_hk * block_half))
    limit = next_power_of_2(max(1, tokens))
    tokens_k = min(tokens_k, limit)
    tokens_q = min(tokens_q, tokens_k)
    tile = tokens_q * block_hq * block_half
    num_warps = 4 if tile >= 1024 else 2 if tile >= 256 else 1
    return block_hq, block_hk, tokens_q, tokens_k, block_half, num_warps


#: Elements of each half a program rotates (``TILE``: 2 KiB in bf16, one 16-byte vector per thread and half with
#: 4 warps), also the most heads of one token a program takes (``HEADS_TILE``), so that every program moves the
#: same bytes. H200, same-run fractions of a copy (``benchmarks/results/bench_llm_epilogues*_h200.json``): the
#: zoo decoder's rotary (8 over 2 heads of 64) 95.1% and, reading the QKV GEMM's column views, 95.1% (2048-element
#: tiles: 91.1%); Llama-3-8B's (32 over 8 heads of 128) 94.8% with these 16-head, 1024-element programs against
#: 91.1-92.6% with one token's 32 heads in a program (96.5% for that one on the column views; the 16-head split
#: there is unmeasured).
TILE = 1024
HEADS_TILE = 1024
#: Whether cos/sin are loaded in x's register layout (``_rotate_tile``'s ``TABLE_TILE``) unless a call says
#: (``rotary(..., table_tile=)``). Off: the measured layout above. On is a proposal from reading the sm_90 PTX, NOT
#: a measurement: the broadcast rows compile to 2-byte scalar loads and a 512-byte shared-memory broadcast per
#: program, the tiles to 16-byte loads only and no shared memory (``tests/test_kernel_layouts.py`` checks both).
#: ``benchmarks/bench_membw.py --sweep`` times both in one run; switch it on only where that measures faster.
TABLE_TILE = False


def _new_output_like(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """An output with ``t``'s shape and memory layout, fully overwritten by the kernel (tests poison it)."""
    return torch.empty_like(t, dtype=dtype)


@functools.lru_cache(maxsize=2)
def _build_kernel(interpret: bool):
    """Define the Triton kernel (imports Triton); cached per interpreter mode (see ``rms_norm._build_kernel``)."""
    global tl, _round_to, _rotate_tile
    triton, tl = import_triton()
    _round_to = jit_helpers(interpret).round_to

    @triton.jit
    def _rotate_tile(X, O, C, SN, t0, T, S, h0, H, sx_b, sx_s, sx_h, so_b, so_s, so_h, sc_b, sc_s, ss_b, ss_s,
                     HALF: tl.constexpr, BLOCK_HALF: tl.constexpr, TOKENS: tl.constexpr, BLOCK_H: tl.constexpr,
                     BF16_RTNE_BY_HAND: tl.constexpr, TABLE_TILE: tl.constexpr):
        """Rotate tokens t0 .. t0+TOKENS-1 (< T) × heads h0 .. h0+BLOCK_H-1 (< H): a (TOKENS, BLOCK_H, HALF) tile
        of each half, with the tokens' cos/sin rows read from DRAM once for all the heads.

        ``TABLE_TILE``: cos/sin are loaded as whole (TOKENS, BLOCK_H, HALF) tiles in x's register layout (each
        head's copy an L1 hit), as ``rms_norm`` loads its weight; else as (TOKENS, 1, HALF) rows, which Triton
        gives a layout of their own (scalar 2-byte loads) and broadcasts through shared memory."""
        tok = (t0 + tl.arange(0, TOKENS)).to(tl.int64)[:, None, None]                 # (TOKENS, 1, 1)
        h = (h0 + tl.arange(0, BLOCK_H))[None, :, None]                                # (1, BLOCK_H, 1)
        d = tl.arange(0, BLOCK_HALF)[None, None, :]                                    # (1, 1, BLOCK_HALF)
        b = tok // S
        s = tok - b * S
        if BLOCK_HALF == HALF:                             # no mask along d: whole 16-byte vectors
            row_live = tok < T
            live = row_live & (h < H)
        else:
            row_live = (tok < T) & (d < HALF)
            live = row_live & (h < H)
        if TABLE_TILE:
            d_tile = d + h * 0                                                         # (1, BLOCK_H, BLOCK_HALF)
            table_live = live
        else:
            d_tile = d
            table_live = row_live
        c = C + b * sc_b + s * sc_s + d_tile                                  # (TOKENS, 1 or BLOCK_H, BLOCK_HALF)
        sn = SN + b * ss_b + s * ss_s + d_tile
        c1 = tl.load(c, mask=table_live, other=0.0, eviction_policy="evict_last").to(tl.float32)
        c2 = tl.load(c + HALF, mask=table_live, other=0.0, eviction_policy="evict_last").to(tl.float32)
        s1 = tl.load(sn, mask=table_live, other=0.0, eviction_policy="evict_last").to(tl.float32)
        s2 = tl.load(sn + HALF, mask=table_live, other=0.0, eviction_policy="evict_last").to(tl.float32)
        x = X + b * sx_b + s * sx_s + h * sx_h + d                                     # (TOKENS, BLOCK_H, BLOCK_HALF)
        x1 = tl.load(x, mask=live, other=0.0, eviction_policy="evict_first").to(tl.float32)          # x[..., :D/2]
        x2 = tl.load(x + HALF, mask=live, other=0.0, eviction_policy="evict_first").to(tl.float32)   # x[..., D/2:]
        o1 = x1 * c1 - x2 * s1                                                         # x·cos + (−x2)·sin
        o2 = x2 * c2 + x1 * s2                                                         # x·cos + x1·sin
        o = O + b * so_b + s * so_s + h * so_h + d
        tl.store(o, _round_to(o1, O.dtype.element_ty, BF16_RTNE_BY_HAND), mask=live)
        tl.store(o + HALF, _round_to(o2, O.dtype.element_ty, BF16_RTNE_BY_HAND), mask=live)

    @triton.jit
    def _rotary_fwd(
        Q, K, C, SN, QO, KO,                                  # pointers: q, k, cos, sin, q_embed, k_embed
        T, S, HQ, HKV,                                        # tokens (B·S), seq len, heads
        sq_b, sq_h, sq_s, sk_b, sk_h, sk_s,                   # q, k strides (B, H, S); D is contiguous
        sc_b, sc_s, ss_b, ss_s,                               # cos, sin strides (B, S); 0 for a broadcast B
        sqo_b, sqo_h, sqo_s, sko_b, sko_h, sko_s,             # output strides
        HALF: tl.constexpr, BLOCK_HALF: tl.constexpr, BLOCK_HQ: tl.constexpr, BLOCK_HK: tl.constexpr,
        TOKENS_Q: tl.constexpr, TOKENS_K: tl.constexpr, Q_BLOCKS: tl.constexpr, Q_PER: tl.constexpr,
        PER: tl.constexpr, BF16_RTNE_BY_HAND: tl.constexpr, TABLE_TILE: tl.constexpr,
    ):
        """1-D grid in groups of TOKENS_K tokens: first the group's Q programs (TOKENS_Q tokens × BLOCK_HQ heads
        each), then its K programs (TOKENS_K tokens × BLOCK_HK heads), neighbours in launch order: Q_PER
        = (TOKENS_K / TOKENS_Q)·Q_BLOCKS programs of q, PER in all."""
        pid = tl.program_id(0)
        group = pid // PER
        j = pid - group * PER
        t_group = group * TOKENS_K
        if j < Q_PER:
            _rotate_tile(Q, QO, C, SN, t_group + (j // Q_BLOCKS) * TOKENS_Q, T, S, (j % Q_BLOCKS) * BLOCK_HQ, HQ,
                         sq_b, sq_s, sq_h, sqo_b, sqo_s, sqo_h, sc_b, sc_s, ss_b, ss_s,
                         HALF, BLOCK_HALF, TOKENS_Q, BLOCK_HQ, BF16_RTNE_BY_HAND, TABLE_TILE)
        else:
            _rotate_tile(K, KO, C, SN, t_group, T, S, (j - Q_PER) * BLOCK_HK, HKV,
                         sk_b, sk_s, sk_h, sko_b, sko_s, sko_h, sc_b, sc_s, ss_b, ss_s,
                         HALF, BLOCK_HALF, TOKENS_K, BLOCK_HK, BF16_RTNE_BY_HAND, TABLE_TILE)

    return _rotary_fwd


#: ``Launch`` by call signature: planned once (``triton_support.planned``), so that a repeated call
#: costs two allocations and the launch. Bounded.
_LAUNCHES: dict[tuple, Launch] = {}


def _kernel_runs(q, k, cos, sin, impl: str | None) -> bool:
    """The decision for these (B, H, S, D) operands: the impl the call was handed (its lowering binds the choice
    the rewrite recorded for the target, ``LOWERINGS``), else the selection's, asked with every operand fact.

    Handed ``triton``, the call checks only what the kernel needs of the actual operands (``select_rotary``'s
    checks less the device, which is the decision), so the same operands take the same path as before."""
    d = q.shape[-1] if q.dim() else None
    if impl is None:
        return select_rotary(q.device, q.dtype, d, k_dtype=k.dtype, cos_dtype=cos.dtype, q_shape=q.shape,
                             k_shape=k.shape, cos_shape=cos.shape, sin_shape=sin.shape).fused
    return impl == "triton" and (_dtype_refusal(q.dtype, cos.dtype) or _shape_refusal(
        q.dtype, d, k.dtype, q.shape, k.shape, cos.shape, sin.shape)) is None


def _plan(q, k, cos, sin, tuning, impl: str | None = None) -> Launch:
    """Decide whether the kernel runs for these (B, H, S, D) operands and prepare its launch (not output strides)."""
    if (not _kernel_runs(q, k, cos, sin, impl) or sin.dtype != cos.dtype or any(t.device != q.device for t in (k, cos, sin))
            or q.numel() == 0 or any(t.stride(-1) != 1 for t in (q, k, cos, sin))):
        return Launch()
    interpret = interpreting()
    b, hq, s, d = q.shape
    hkv = k.shape[1]
    block_hq, block_hk, tokens_q, tokens_k, block_half, warps = launch_config(hq, hkv, d, b * s)
    tokens_override, heads_override, warps_override, *table_override = tuning
    table_tile = TABLE_TILE if not table_override or table_override[0] is None else table_override[0]
    if tokens_override:                                 # (TOKENS_Q, TOKENS_K): tokens per Q / K program
        tokens_q, tokens_k = tokens_override
    if heads_override:                                  # (BLOCK_HQ, BLOCK_HK): heads per Q / K program
        block_hq, block_hk = heads_override
    q_blocks, k_blocks = -(-hq // block_hq), -(-hkv // block_hk)
    groups = -(-(b * s) // tokens_k)
    q_per = (tokens_k // tokens_q) * q_blocks
    grid = (groups * (q_per + k_blocks),)
    cos_b = cos.stride(0) if cos.shape[0] > 1 else 0                              # broadcast over B
    sin_b = sin.stride(0) if sin.shape[0] > 1 else 0
    ints = (b * s, s, hq, hkv, q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1),
            k.stride(2), cos_b, cos.stride(1), sin_b, sin.stride(1))
    return Launch(_build_kernel(interpret), grid, ints,
                  dict(HALF=d // 2, BLOCK_HALF=block_half, BLOCK_HQ=block_hq, BLOCK_HK=block_hk, TOKENS_Q=tokens_q,
                       TOKENS_K=tokens_k, Q_BLOCKS=q_blocks, Q_PER=q_per, PER=q_per + k_blocks,
                       BF16_RTNE_BY_HAND=interpret, TABLE_TILE=bool(table_tile)),
                  warps_override or warps, torch.promote_types(q.dtype, cos.dtype))


def rotary(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, unsqueeze_dim: int = 1, *,
           tokens: tuple[int, int] | None = None, heads: tuple[int, int] | None = None,
           num_warps: int | None = None, token_major: bool = False,
           table_tile: bool | None = None, impl: str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``apply_rotary_pos_emb(q, k, cos, sin)`` for both q and k in one kernel launch.

    ``q``: (B, Hq, S, D), ``k``: (B, Hkv, S, D), any strides with a contiguous last dim; with
    ``unsqueeze_dim=2`` they are (B, S, H, D) instead. ``cos``, ``sin``: (B or 1, S, D) as
    ``LlamaRotaryEmbedding`` returns them. Returns ``(q_embed, k_embed)`` with q's and k's shapes and
    memory layouts, in ``promote(q, cos)``. Falls back to ``rotary_reference`` where ``select_rotary``
    refuses. ``tokens`` = (tokens per Q program, tokens per K program), powers of two with the second a
    multiple of the first, ``heads`` = (heads per Q program, per K program), powers of two, and
    ``num_warps`` override the launch heuristics (``launch_config``), ``table_tile`` the cos/sin load layout
    (``TABLE_TILE``). ``token_major``: write the outputs as
    transposes of (B, S, H, D) buffers whatever q's layout (a benchmark's question: what the output layout
    costs where q and k are column views, whose ``empty_like`` is (B, H, S, D)). ``impl``: the ``Choice.impl``
    decided for this call's target (a lowered fused call is handed it): given, the selection is not asked
    ("reference" runs the reference, "triton" the kernel where the operands fit it).
    """
    if unsqueeze_dim == 2:
        qe, ke = rotary(q.transpose(1, 2), k.transpose(1, 2), cos, sin, 1, tokens=tokens, heads=heads,
                        num_warps=num_warps, table_tile=table_tile, impl=impl)
        return qe.transpose(1, 2), ke.transpose(1, 2)
    if unsqueeze_dim != 1 or needs_autograd(q, k, cos, sin) or (impl is not None and impl != "triton"):
        return rotary_reference(q, k, cos, sin, unsqueeze_dim)                 # forward-only kernel; or handed it
    if tokens is not None:
        tq, tk = tokens
        if tq < 1 or tq & (tq - 1) or tk < tq or tk & (tk - 1):
            raise ValueError(f"tokens must be powers of two (q, k) with k >= q, got {tokens}")
    if heads is not None and any(h < 1 or h & (h - 1) for h in heads):
        raise ValueError(f"heads must be powers of two (q, k), got {heads}")
    key = (operand_key(q), operand_key(k), operand_key(cos), operand_key(sin), tokens, heads, num_warps,
           q.is_cuda or interpreting(), table_tile, impl)
    plan = planned(_LAUNCHES, key, _plan, q, k, cos, sin, (tokens, heads, num_warps, table_tile), impl)
    if plan.kernel is None:
        return rotary_reference(q, k, cos, sin, unsqueeze_dim)
    if token_major:
        qo = _new_output_like(q.transpose(1, 2), plan.out_dtype).transpose(1, 2)   # (B, S, Hq, D) memory
        ko = _new_output_like(k.transpose(1, 2), plan.out_dtype).transpose(1, 2)
        if not (qo.transpose(1, 2).is_contiguous() and ko.transpose(1, 2).is_contiguous()):
            qo = torch.empty((q.shape[0], q.shape[2], q.shape[1], q.shape[3]), dtype=plan.out_dtype,
                             device=q.device).transpose(1, 2)
            ko = torch.empty((k.shape[0], k.shape[2], k.shape[1], k.shape[3]), dtype=plan.out_dtype,
                             device=k.device).transpose(1, 2)
    else:
        qo = _new_output_like(q, plan.out_dtype)                                  # (B, Hq, S, D), q's layout
        ko = _new_output_like(k, plan.out_dtype)                                  # (B, Hkv, S, D), k's layout
    # output strides are read from the outputs themselves: empty_like keeps a dense layout, or makes
    # a contiguous one for a q with gaps, and the plan must not assume which
    launch(plan.kernel, plan.grid,
           (q, k, cos, sin, qo, ko, *plan.ints, qo.stride(0), qo.stride(1), qo.stride(2),
            ko.stride(0), ko.stride(1), ko.stride(2)),
           plan.constexprs, num_warps=plan.num_warps,
           key=(key, qo.stride(), ko.stride()))
    return qo, ko


# ====================================================================== rotary in the QKV GEMM's epilogue

def qkv_decision(device: torch.device | str, dtype: torch.dtype, m: int, k: int, hq: int, hkv: int,
                 d: int, choice: Choice | None = None) -> measured.Decision:
    """Whether q and k are rotated in the QKV GEMM's epilogue at this shape: Triton must run there in one of its
    dtypes with an even head_dim, then ``kernels.measured.decide`` (the committed H200 table). ``choice``: the
    rotary choice the rewrite recorded for this target (the lowering passes it), so the selection is not asked
    again."""
    if (choice or select_rotary(device, dtype, d)).impl != "triton":
        return measured.Decision(False, None, None, "device")
    return measured.decide("qkv_rotary", device, dtype, m, k, hq, hkv, d)


def qkv_note(m: int, k: int, hq: int, hkv: int, d: int) -> str | None:
    """The kernel note of a rotary chain whose q, k, v come from one input: what the H200 table decides for bf16."""
    decision = measured.decide("qkv_rotary", "cuda", torch.bfloat16, m, k, hq, hkv, d)
    found = decision.measurement
    if decision.why in ("measured_faster", "measured_slower"):
        return WORDS("note.faster" if decision.fused else "note.slower", m=m, k=k, hq=hq, hkv=hkv, d=d,
                     ours=found.ours_ms, base=found.baseline_ms, device=found.device)
    if decision.why == "unmeasured":
        return WORDS("note.unmeasured", m=m, k=k, hq=hq, hkv=hkv, d=d)
    return None


def qkv_rotary_reference(x, weight, bias, cos, sin, heads: int, kv_heads: int, head_dim: int):
    """Unfused: one GEMM, split into q, k, v, each viewed (B, S, H, D) and transposed, q and k rotated
    (``rotary``, the kernel where it runs). Returns ``(q_embed, k_embed, v)``, v as (B, S, Hkv·D)."""
    y = F.linear(x, weight, bias)                                                     # (B, S, (Hq+2Hkv)·D)
    q, k, v = y.split((heads * head_dim, kv_heads * head_dim, kv_heads * head_dim), -1)
    b, s = x.shape[0], x.shape[1]
    qe, ke = rotary(q.view(b, s, heads, head_dim).transpose(1, 2), k.view(b, s, kv_heads, head_dim).transpose(1, 2),
                    cos, sin)
    return qe, ke, v


def qkv_rotary(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, cos: torch.Tensor,
               sin: torch.Tensor, heads: int, kv_heads: int, head_dim: int,
               tiles: tuple[int, ...] | None = None,
               token_major: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q, k, v of ``x`` (B, S, in) through ``weight = [W_q; W_k; W_v]`` with q and k rotated, as ONE Triton GEMM
    (``kernels.gemm.gemm_qkv_rotary``). Returns ``(q_embed, k_embed, v)``: (B, Hq, S, D), (B, Hkv, S, D)
    contiguous and v as (B, S, Hkv·D) rows, the layouts the unfused model has; ``qkv_rotary_reference``
    where the kernel does not take the operands. ``token_major``: column views of the GEMM's own rows instead
    (``gemm_qkv_rotary``; what the lowering chooses with ``QKV_TOKEN_MAJOR``)."""
    b = x.shape[0]
    a = x.reshape(-1, weight.shape[1])                                                # (B·S, in)
    if (x.dim() != 3 or needs_autograd(x, weight, bias, cos, sin) or not gemm_kernels.paired_applies(a, weight)
            or cos.dtype != x.dtype or sin.dtype != x.dtype or cos.device != x.device or sin.device != x.device
            or cos.dim() != 3 or cos.shape != sin.shape or cos.shape[0] not in (1, b) or cos.shape[1] != x.shape[1]
            or cos.shape[2] != head_dim or (bias is not None and bias.dtype != x.dtype)):
        return qkv_rotary_reference(x, weight, bias, cos, sin, heads, kv_heads, head_dim)
    qe, ke, v = gemm_kernels.gemm_qkv_rotary(a, weight, bias, cos, sin, b, heads, kv_heads, head_dim, tiles=tiles,
                                             token_major=token_major)
    return qe, ke, v.view(b, x.shape[1], kv_heads * head_dim)


def _is_view(n) -> bool:
    return isinstance(n, torch.fx.Node) and ((n.op == "call_method" and n.target == "view") or (
        n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload) and aten.aten_name(n) == "view"))


def _is_transpose_12(n) -> bool:
    if not (isinstance(n, torch.fx.Node) and n.op == "call_function"):
        return False
    if n.target is torch.transpose or (isinstance(n.target, torch._ops.OpOverload) and aten.aten_name(n) == "transpose"):
        return sorted(int(a) % 4 for a in n.args[1:3]) == [1, 2]
    return False


def _projection_source(t):
    """``(getitem, packed source, index)`` where ``t`` = transpose(view(getitem(source, i)), 1, 2) and the source
    is the siblings' one GEMM (``fused_linear_siblings`` or its lowering, ``split_with_sizes(linear(...))``);
    None otherwise. ``packed source`` is ``(x, weight, bias, sizes)``."""
    if not _is_transpose_12(t) or not _is_view(t.args[0]):
        return None
    item = t.args[0].args[0]
    if not (isinstance(item, torch.fx.Node) and item.target is operator.getitem):
        return None
    src, index = item.args
    if src.target is siblings.fused_linear_siblings:
        x, weight, bias, sizes = src.args
        return item, src, index, (x, weight, bias, list(sizes))
    if src.target is torch.split_with_sizes and isinstance(src.args[0], torch.fx.Node) and (
            src.args[0].target is torch._C._nn.linear and src.args[2] in (-1, 2)):
        lin = src.args[0]
        x, weight = lin.args[:2]
        bias = lin.args[2] if len(lin.args) > 2 else lin.kwargs.get("bias")
        return item, src, index, (x, weight, bias, list(src.args[1]))
    return None


def _only_user(n: torch.fx.Node, user: torch.fx.Node) -> bool:
    return list(n.users) == [user]


#: Whether a rotary kernel that reads the QKV GEMM's column views writes token-major outputs (transposes of
#: (B, S, H, D) buffers) where every reader is attention, which takes any strides. Off: on the H200 it
#: measured no faster (zoo 94.2% of copy against 95.1%; Llama-3-8B 84.8% against 96.5%;
#: ``benchmarks/results/bench_llm_epilogues_followup_h200.json``).
TOKEN_MAJOR_ON_COLUMN_VIEWS = False


#: Whether the lowering's ``qkv_rotary`` writes q, k, v as column views of the GEMM's own rows (``token_major``)
#: where attention is the only reader of q and k: attention whose output follows q's layout (cuDNN's) then
#: writes (B, S, H, D) memory and the reshape before o_proj is a view, not a copy (one copy kernel per layer:
#: ``benchmarks/results/profile_host_h200.json``). On: on the H200 the zoo decoder prefill's plain call measured
#: 1.518 against 1.620 ms (0.93× [0.92, 0.94], paired rounds), 31 launches against 35, GPU busy 1.237 against
#: 1.328 ms, outputs bit for bit the same (``benchmarks/results/bench_host_path_h200.json``).
QKV_TOKEN_MAJOR = True


def _read_by_attention(node: torch.fx.Node) -> bool:
    """Whether every reader of the rotary's q and k outputs is attention (which takes any strides)."""
    readers = [u for g in node.users for u in g.users]
    return bool(readers) and all(_is_attention(u) for u in readers)


def rotary_token_major(q, k, cos, sin, impl=None):
    """``rotary`` writing its outputs as transposes of (B, S, H, D) buffers (``token_major``)."""
    return rotary(q, k, cos, sin, token_major=True, impl=impl)


def _is_attention(n: torch.fx.Node) -> bool:
    return n.op == "call_function" and (n.target is torch._C._nn.scaled_dot_product_attention or (
        isinstance(n.target, torch._ops.OpOverload) and aten.aten_name(n) == "scaled_dot_product_attention"))


def _lower(gm, node, device, dtype) -> bool:
    """fused_rotary whose q and k are the first two column views of the siblings' QKV GEMM, transposed, and
    whose third view is v → one ``qkv_rotary`` call (the GEMM with rotary in its epilogue) where
    ``qkv_decision`` chooses it for this shape; else, with ``TOKEN_MAJOR_ON_COLUMN_VIEWS``, a rotary reading
    column views and read by attention only writes token-major outputs; else the node stays. A rotary call that
    stays is handed the impl decided for the target (``_bind``), so it does not ask ``select_rotary`` again."""
    if len(node.args) != 4:
        return False
    if _fold_qkv(gm, node, device, dtype):
        return True
    readers = [u for g in node.users for u in g.users]
    if (TOKEN_MAJOR_ON_COLUMN_VIEWS and _projection_source(node.args[0]) is not None   # q: a column view
            and readers and all(_is_attention(u) for u in readers)):
        node.target = rotary_token_major
    return _bind(node, device, dtype)


def _bind(node: torch.fx.Node, device: torch.device, dtype: torch.dtype) -> bool:
    """Hand the rotary call the impl decided for this device and dtype: the rewrite's (``edit.planned``), else (a
    call fused for another target) the selection's, asked here once with the shapes the graph records."""
    choice = edit.planned(node, device, dtype)
    if choice is None:
        q, k, cos, sin = (aten.node_val(a) for a in node.args[:4])
        if not all(isinstance(t, torch.Tensor) for t in (q, k, cos, sin)):
            return False
        choice = select_rotary(device, dtype, int(q.shape[-1]), k_dtype=dtype, cos_dtype=dtype, q_shape=q.shape,
                               k_shape=k.shape, cos_shape=cos.shape, sin_shape=sin.shape)
    return edit.bind_choice(node, 4, choice.impl)


def _fold_qkv(gm, node, device, dtype) -> bool:
    """The QKV fold of ``_lower``: True where it replaced ``node``."""
    q, k, cos, sin = node.args
    qs, ks = _projection_source(q), _projection_source(k)
    if qs is None or ks is None or qs[1] is not ks[1] or (qs[2], ks[2]) != (0, 1):
        return False
    x, weight, bias, sizes = qs[3]
    qv, kv = aten.node_val(q), aten.node_val(k)
    x_val = aten.node_val(x)
    w = edit.attr_tensor(gm, weight)
    if (len(sizes) != 3 or not all(isinstance(v, torch.Tensor) for v in (qv, kv, x_val)) or w is None
            or x_val.dim() != 3):
        return False
    hq, hkv, d = int(qv.shape[1]), int(kv.shape[1]), int(qv.shape[3])
    if sizes != [hq * d, hkv * d, hkv * d]:
        return False
    getitems = {u.args[1]: u for u in qs[1].users if u.target is operator.getitem}
    if set(getitems) != {0, 1, 2} or not all(_only_user(n.args[0], n) and _only_user(n.args[0].args[0], n.args[0])
                                             for n in (q, k)) or not all(_only_user(n, node) for n in (q, k)):
        return False
    decision = qkv_decision(device, dtype, x_val.numel() // x_val.shape[-1], int(w.shape[1]), hq, hkv, d,
                            edit.planned(node, device, dtype))
    if not decision.fused:
        return False
    position = {n: i for i, n in enumerate(gm.graph.nodes)}
    first = min(getitems.values(), key=position.__getitem__)
    if any(isinstance(t, torch.fx.Node) and position[t] > position[first] for t in (cos, sin)):
        return False                                    # the tables come later: the GEMM cannot move after them
    with gm.graph.inserting_before(first):
        call = gm.graph.call_function(qkv_rotary, (x, weight, bias, cos, sin, hq, hkv, d, decision.tiles,
                                                   QKV_TOKEN_MAJOR and _read_by_attention(node)))
        v = gm.graph.call_function(operator.getitem, (call, 2))
    v.meta.update(getitems[2].meta)
    getitems[2].replace_all_uses_with(v)
    with gm.graph.inserting_before(node):
        outs = [gm.graph.call_function(operator.getitem, (call, i)) for i in (0, 1)]
    for user in list(node.users):
        if user.target is operator.getitem and user.args[1] in (0, 1):
            outs[user.args[1]].meta.update(user.meta)
            user.replace_all_uses_with(outs[user.args[1]])
    return True


# ====================================================================== fused call target

def fused_rotary(q, k, cos, sin, impl=None):
    """``apply_rotary_pos_emb(q, k, cos, sin)``: q and k rotated by one kernel where possible; ``(q_embed, k_embed)``.
    ``impl``: what its lowering hands it (``_bind``); None (a graph run as it is fused): the selection decides,
    once per call signature."""
    return rotary(q, k, cos, sin, impl=impl)


LOWERINGS = {fused_rotary: _lower}

#: Targets a lean CUDA graph binds per node (``triton_support.BoundCall``): Triton launches only.
BOUND_CALLS = (fused_rotary, qkv_rotary, rotary_token_major)


# ====================================================================== matching

def _succ(g: nx.DiGraph, n: str) -> list[str]:
    return sorted(g.successors(n), key=lambda s: g.nodes[s]["order"])


def _single(g: nx.DiGraph, n: str, kind: str) -> str:
    """The one successor of ``n``, of ``kind`` (structural mismatch otherwise)."""
    succ = list(g.successors(n))
    if len(succ) != 1 or g.nodes[succ[0]]["kind"] != kind:
        raise NoMatch(None, [n])
    return succ[0]


def _other(g: nx.DiGraph, n: str, known: str) -> str:
    """The operand of the binary op ``n`` that is not ``known`` (structural mismatch if none)."""
    others = [p for p in g.predecessors(n) if p != known]
    if len(others) != 1:
        raise NoMatch(None, [n])
    return others[0]


def _table(g: nx.DiGraph, n: str, known: str) -> str:
    """The cos or sin operand of the product ``n``: a graph node, or ``const:<target>`` for a constant
    (an ONNX exporter folds the tables of a fixed-length graph into initializers)."""
    others = [p for p in g.predecessors(n) if p != known]
    constants = g.nodes[n].get("const_inputs") or []
    if len(others) == 1 and not constants:
        return others[0]
    if not others and len(constants) == 1:
        return "const:" + constants[0]
    raise NoMatch(None, [n])


def _rotate_half_of(g: nx.DiGraph, neg: str) -> tuple[str, str, str, str, str]:
    """From a ``neg``: ``(t, slice_hi, slice_lo, cat)`` of ``cat(-t[..., D/2:], t[..., :D/2], dim=-1)`` and the
    ``mul`` by sin after it, as ``(t, hi, lo, cat, mul_sin)``; ``NoMatch(None)`` where it is not rotate-half."""
    preds = list(g.predecessors(neg))
    if len(preds) != 1 or "slice" not in g.nodes[preds[0]]:
        raise NoMatch(None, [neg])
    hi = preds[0]
    tensors = list(g.predecessors(hi))
    if len(tensors) != 1 or not g.nodes[tensors[0]]["shapes"]:
        raise NoMatch(None, [neg])
    t = tensors[0]
    shape = g.nodes[t]["shapes"][0]
    d = shape[-1] if shape else 0
    last = len(shape) - 1
    if d % 2 or g.nodes[hi]["slice"] != [last, d // 2, d, 1]:
        raise NoMatch(None, [neg])
    cat = _single(g, neg, "cat")
    inputs = g.nodes[cat].get("cat_inputs") or []
    if g.nodes[cat].get("cat_dim") != last or len(inputs) != 2 or inputs[0] != neg:
        raise NoMatch(None, [neg, cat])
    lo = inputs[1]
    if lo not in g or g.nodes[lo].get("slice") != [last, 0, d // 2, 1] or list(g.predecessors(lo)) != [t]:
        raise NoMatch(None, [neg, cat])
    if list(g.successors(hi)) != [neg] or list(g.successors(lo)) != [cat]:
        raise NoMatch(None, [neg, cat])
    return t, hi, lo, cat, _single(g, cat, "mul")


def _rotated(g: nx.DiGraph, neg: str) -> tuple[str, list[tuple[str, str, bool]], str, str]:
    """One tensor's ``t·cos + rotate_half(t)·sin`` from its ``neg``: ``(t, matched, cos, sin)``, where
    ``cos``/``sin`` are the (unsqueezed) operands the two products read."""
    t, hi, lo, cat, mul_sin = _rotate_half_of(g, neg)
    sin = _table(g, mul_sin, cat)
    add = _single(g, mul_sin, "add")
    mul_cos = _other(g, add, mul_sin)
    if g.nodes[mul_cos]["kind"] != "mul" or t not in set(g.predecessors(mul_cos)) or g.out_degree(mul_cos) != 1:
        raise NoMatch(None, [neg, cat, mul_sin, add])
    cos = _table(g, mul_cos, t)
    matched = [(mul_cos, "mul_cos", True), (hi, "view", False), (lo, "view", False), (neg, "neg", True),
               (cat, "cat", True), (mul_sin, "mul_sin", True), (add, "add", True)]
    return t, matched, cos, sin


def _match_rotary(g: nx.DiGraph, pattern: Pattern, anchor: str, claimed: dict[str, str]) -> list:
    """``q·cos + rotate_half(q)·sin`` and the same for ``k`` with the same cos and sin (its matcher).

    Anchored at a ``neg``; the partner is the other tensor rotated with the same ``cos`` and ``sin``
    (found through the ``cos`` node's products, or, where the tables are constants, among the other
    ``neg`` nodes), the unclaimed one nearest in graph order. The first in graph order plays q (roles
    ``q_*``), the other k (``k_*``).
    """
    t, first, cos, sin = _rotated(g, anchor)
    if cos.startswith("const:"):
        negs = [n for n in g.nodes if g.nodes[n]["kind"] == "neg" and n != anchor]
    else:
        negs = [n for user in _succ(g, cos) if g.nodes[user]["kind"] == "mul" and user != first[0][0]
                for p in g.predecessors(user) if p != cos
                for s in _succ(g, p) if "slice" in g.nodes[s]
                for n in _succ(g, s) if g.nodes[n]["kind"] == "neg"]
    partners = []
    for neg in negs:
        try:
            t2, second, cos2, sin2 = _rotated(g, neg)
        except NoMatch:
            continue
        if (cos2, sin2) == (cos, sin) and t2 != t and not any(n in claimed for n, _, _ in second):
            partners.append(second)
    nodes = [n for n, _, _ in first]
    if not partners:
        raise NoMatch(BASE_WORDS("own_matcher", pattern=pattern.label, reason=WORDS("refuse.one")), nodes)
    here = g.nodes[anchor]["order"]
    second = min(partners, key=lambda m: abs(g.nodes[m[0][0]]["order"] - here))
    if g.nodes[second[0][0]]["order"] < g.nodes[first[0][0]]["order"]:
        first, second = second, first
    matched = [(n, r if r == "view" else "q_" + r, c) for n, r, c in first] + \
              [(n, r if r == "view" else "k_" + r, c) for n, r, c in second]
    taken = [n for n, _, _ in matched if n in claimed]
    if taken:
        why = BASE_WORDS("already_in_chain", op=taken[0], chain=claimed[taken[0]])
        raise NoMatch(BASE_WORDS("own_matcher", pattern=pattern.label, reason=why), [n for n, _, _ in matched])
    return matched


# ====================================================================== rewrite

def _table_source(ctx: RewriteContext, unsqueezed: torch.fx.Node, what: str,
                  tensors: dict[str, torch.Tensor]) -> tuple[object, torch.Tensor]:
    """The (B|1, S, D) table the kernel reads for ``unsqueezed`` (= ``unsqueeze(table, 1)``), and its value
    or metadata: the unsqueeze's input node, or, for a constant (B|1, 1, S, D), a squeezed copy registered
    in ``tensors`` under a new attribute."""
    if unsqueezed.op == "get_attr":
        value = ctx.constant(unsqueezed, what)
        if value.dim() != 4 or value.shape[1] != 1:
            raise UseGeneric(WORDS("generic.table", what=what))
        key = f"{unsqueezed.target}_squeezed".replace(".", "_")
        tensors[key] = value.squeeze(1).contiguous()                               # (B|1, S, D)
        return edit.NewAttr(key), tensors[key]
    if aten.aten_name(unsqueezed) != "unsqueeze" or aten.args_of(unsqueezed).get("dim") not in (1, -3):
        raise UseGeneric(WORDS("generic.unsqueeze", what=what))
    src = unsqueezed.args[0]
    val = aten.node_val(src)
    if not isinstance(val, torch.Tensor) or val.dim() != 3:
        raise UseGeneric(WORDS("generic.unsqueeze", what=what))
    return src, val


def rewrite(ctx: RewriteContext, chain, kernel: str) -> edit.Edit:
    """q's and k's rotate-half chains → one ``fused_rotary(q, k, cos, sin)`` call returning both."""
    tensors, cos_sin = [], []
    for p in ("q", "k"):
        mul_cos, mul_sin, cat = (ctx.node(chain, f"{p}_{r}") for r in ("mul_cos", "mul_sin", "cat"))
        t = cat.args[0][1].args[0]                      # cat((-t[..., D/2:], t[..., :D/2])): the second slice's input
        tensors.append(t)
        cos_sin.append((edit.other_operand(mul_cos, {t}), edit.other_operand(mul_sin, {cat})))
    if cos_sin[0] != cos_sin[1]:
        raise UseGeneric(WORDS("generic.different"))
    constants: dict[str, torch.Tensor] = {}
    (cos, cs), (sin, ss) = (_table_source(ctx, n, what, constants) for n, what in zip(cos_sin[0], ("cos", "sin")))
    q, k = tensors
    qs, ks = aten.node_val(q), aten.node_val(k)
    choice = select_rotary(ctx.device, ctx.run_dtype(qs.dtype), int(qs.shape[-1]), k_dtype=ctx.run_dtype(ks.dtype),
                           cos_dtype=ctx.run_dtype(cs.dtype),
                           q_shape=qs.shape, k_shape=ks.shape, cos_shape=cs.shape, sin_shape=ss.shape)
    outputs = [ctx.node(chain, "q_add"), ctx.node(chain, "k_add")]
    if choice.fused:
        note = _qkv_rewrite_note(q, k, set(ctx.members(chain)))
        if note is not None:
            choice = Choice(choice.impl, WORDS("label.with_note", label=choice.label, note=note), choice.fused)
    return edit.whole_chain_edit(ctx, chain, fused_rotary, (q, k, cos, sin), choice, tensors=constants,
                                 outputs=outputs, tuple_result=True)


def _linear_under(t: torch.fx.Node) -> torch.fx.Node | None:
    """The linear node of ``t`` = transpose(view(linear(x)), 1, 2) in the captured graph, or None."""
    if not _is_transpose_12(t) or not _is_view(t.args[0]):
        return None
    lin = t.args[0].args[0]
    return lin if isinstance(lin, torch.fx.Node) and aten.linear_args(lin) is not None else None


def _qkv_rewrite_note(q: torch.fx.Node, k: torch.fx.Node, members: set) -> str | None:
    """What the QKV-epilogue choice says for this chain (shown with its label): the table's verdict at its shape,
    or why q, k, v cannot share the GEMM (a near miss)."""
    lq, lk = _linear_under(q), _linear_under(k)
    for what, lin in (("q", lq), ("k", lk)):
        if lin is None:
            return WORDS("note.no_qkv", why=WORDS("qkv.not_projection", what=what))
    x = aten.linear_args(lq).input
    if aten.linear_args(lk).input is not x:
        return WORDS("note.no_qkv", why=WORDS("qkv.not_projection", what="k"))
    qv, kv, xv = aten.node_val(q), aten.node_val(k), aten.node_val(x)
    if not all(isinstance(v, torch.Tensor) for v in (qv, kv, xv)) or xv.dim() != 3:
        return None
    hq, hkv, d = int(qv.shape[1]), int(kv.shape[1]), int(qv.shape[3])
    vs = [u for u in x.users if u not in (lq, lk) and aten.linear_args(u) is not None
          and aten.linear_args(u).input is x and isinstance(aten.node_val(u), torch.Tensor)
          and aten.node_val(u).shape[-1] == hkv * d]
    if not vs:
        return WORDS("note.no_qkv", why=WORDS("qkv.no_v"))
    for what, lin, t in (("q", lq, q), ("k", lk, k)):
        if len(lin.users) != 1 or len(t.args[0].users) != 1 or not set(t.users) <= members:
            return WORDS("note.no_qkv", why=WORDS("qkv.shared", what=what))
    return qkv_note(xv.numel() // xv.shape[-1], int(xv.shape[-1]), hq, hkv, d)


# ====================================================================== patterns

#: Which families this one must claim nodes before or after (explorer.fusions.order).
RUNS_BEFORE = ("linear", "rms_norm", "norm")

PATTERNS = (
    Pattern(
        name="rotary", label=WORDS("rotary.label"),
        steps=(Step(frozenset({"neg"}), "q_neg"), Step(frozenset({"cat"}), "q_cat"),
               Step(frozenset({"mul"}), "q_mul_sin"), Step(frozenset({"mul"}), "q_mul_cos"),
               Step(frozenset({"add"}), "q_add")),
        match=_match_rotary, color="#ff9896", rewrite=rewrite,
        implementation=WORDS("rotary.implementation"),
        explanation=WORDS("rotary.explanation"),
        caveats=(PRECISION_CAVEAT, WORDS("rotary.caveat"), WORDS("qkv.teach")),
        formula=WORDS("rotary.formula"),
    ),
)
