"""The squeeze-and-excitation family: pool, two tiny FC layers, a gate and the multiply, in two Triton kernels.

::

    unfused (6 ops, each at least one kernel; x read twice, plus five tiny intermediates)
    x (N,C,H,W) ─┬─► avg_pool ─► s (N,C,1,1) ─► fc1 (1×1 conv) ─► act ─► fc2 (1×1 conv) ─► gate ─► g (N,C,1,1)
                 │                                                                              │
                 └────────────────────────────────────────────────────────────────────► x * g ─► y

    fused (2 kernels; x read twice, y written once; besides them only a few KB of partial sums)
    ┌ squeeze: grid (N, spatial splits S, channel blocks B) ────────────────────────────────┐
    │ program (n, s, b): pooled = Σ_{hw in split s} x[n, block b, hw] / HW     (fp32)      │
    │                    P[n, s·B + b, :] = w1[:, block b] @ pooled             (Cr partial)│
    └───────────────────────────────────────────────────────────────────────────────────────┘
                 │ P (N, S·B, Cr) fp32: partial hidden pre-activations, no atomics, no memset
    ┌ excite: grid (N, B, spatial splits S') ───────────────────────────────────────────────┐
    │ program (n, b, s'): h = act(Σ_p P[n, p, :] + b1)                 (Cr,  recomputed)    │
    │                     g = gate(w2[block b, :] @ h + b2[block b])   (channel block)      │
    │                     y[n, block b, hw] = x[n, block b, hw] · g    for hw in split s'   │
    └───────────────────────────────────────────────────────────────────────────────────────┘

The first FC layer is linear, so each squeeze program multiplies its partial
channel means by its slice of ``w1`` and writes a partial hidden vector; the
excite programs sum those partials (S·B·Cr floats per sample), apply ``act``,
and compute only the gates of their own channel block (``w2`` rows of that
block): the tiny MLP costs two loops over L2-resident weights and no launch
of its own. Pooling, both FC layers and the gate stay in fp32; ``y`` is
rounded once into ``x``'s dtype. Spatial splits keep enough programs in
flight when N·B is small (early, wide-spatial SE blocks).

Layouts: ``x`` NCHW- or channels_last-contiguous (``conv.layout_of``; anything
else is copied to NCHW first), addressed through (n, c, spatial) strides so
that the contiguous dimension (spatial for NCHW, channel for NHWC) vectorises;
``y`` has ``x``'s layout. EfficientNet: ``act="silu", gate="sigmoid"``;
MobileNetV3: ``act="relu", gate="hardsigmoid"``. The squeeze may be a global
average pool (torchvision) or a mean over the spatial dims (timm); the FC layers
1×1 convolutions (torchvision) or linear layers (a flatten in between is looked
through).

The pattern is declared with steps: the one fan-out of the subgraph, ``x``
feeding both the pool and the multiply, is at the chain's input, which the
step matcher does not follow; the multiply's guard checks that its other
operand is the pooled tensor itself. ``select_squeeze_excite`` is the one
decision the runtime call, the label and the lowering ask.
"""

from __future__ import annotations

import functools

import torch
import torch.fx
import torch.nn.functional as F

from explorer.fusions import edit
from explorer.fusions.base import WORDS as BASE_WORDS
from explorer.fusions.base import PRECISION_CAVEAT, Choice, Pattern, Step, selection
from explorer.fusions.kernels.common import LAYOUTS, conv_nd, layout_of, sm_count
from explorer.fusions.edit import NewAttr, Refuse, RewriteContext, UseGeneric
from explorer.fusions.epilogue import TRITON_ACTIVATIONS, apply_activation, check, in_place_node, triton_activation
from explorer.fusions.triton_support import no_triton, where
from explorer.fusions.triton_support import (import_triton, interpreting, jit_helpers, launch,
                                             library_reductions_usable, next_power_of_2, planned, triton_runs_on)
from explorer.graph import aten
from explorer.words import Words

#: What this family says to a person, in English and 中文 (rendered by explorer.ui.i18n by id).
WORDS = Words("squeeze_excite", {
    "title": ("Squeeze-excite", "Squeeze-excite（通道注意力）"),
    "squeeze_excite.label": ("Squeeze-excite", "Squeeze-excite（通道注意力）"),
    "squeeze_excite.implementation": ("two Triton kernels: pool + fc1 partial sums, then fc2 + gate + scale",
                                      "两个 Triton 内核：先是池化 + fc1 的部分和，然后是 fc2 + 门控 + 缩放"),
    "squeeze_excite.explanation": (("Squeeze-and-excitation is six ops, four of them on tensors of one value per "
                                    "channel: their cost is launches, not bytes. The pool and the first FC layer "
                                    "share one pass over x; the second FC layer, the gate and the multiply share "
                                    "the other: two kernels, and x is read twice and y written once, as in the "
                                    "unfused graph's pool and multiply."),
                                   ("Squeeze-and-excitation "
                                    "有六个算子，其中四个作用在每通道只有一个值的张量上：它们的开销在内核启动，不在访存。池化和第一个全连接层共用一遍对 x "
                                    "的读取；第二个全连接层、门控和乘法共用另一遍：两个内核，x 读两次、y 写一次，和未融合计算图中的池化与乘法一样。")),
    "squeeze_excite.caveat": ("Pooling, both FC layers and the gate are computed in fp32 for 16-bit inputs.",
                              "对 16 位输入，池化、两个全连接层和门控都用 fp32 计算。"),
    "label.triton": ("triton squeeze-excite: 2 kernels (squeeze+fc1, fc2+{gate}+scale)",
                     "triton squeeze-excite：2 个内核（squeeze+fc1，fc2+{gate}+scale）"),
    "label.triton_copy": ("triton squeeze-excite: 2 kernels (squeeze+fc1, fc2+{gate}+scale) after copying x to NCHW",
                          "triton squeeze-excite：2 个内核（squeeze+fc1，fc2+{gate}+scale），先把 x 拷贝成 NCHW"),
    "label.reference": ("pool, conv, {act}, conv, {gate}, mul (6 kernels; reference composition: {why})",
                        "pool、conv、{act}、conv、{gate}、mul（6 个内核；参考实现的组合：{why}）"),
    "fused_kernel": ("squeeze-excite", "squeeze-excite "),
    "generic.not_1x1": ("{what} is not a plain 1×1 convolution", "{what} 不是普通的 1×1 卷积"),
    "generic.neither": ("{what} ({op}) is neither a 1×1 convolution nor a linear layer",
                        "{what}（{op}）既不是 1×1 卷积，也不是线性层"),
    "what.weight": ("{what} weight", "{what} 的权重"),
    "generic.mean": ("the mean is not over every spatial dim", "均值不是对所有空间维求的"),
    "generic.pool": ("{op} is not a global average pool", "{op} 不是全局平均池化"),
    "refuse.scale": ("the multiply does not scale the pooled tensor", "乘法缩放的不是被池化的张量"),
    "generic.act": ("{act} / {gate} is not an activation / gate the kernels compute",
                    "{act} / {gate} 不是这些内核能算的激活 / 门控"),
    "generic.broadcast": ("the multiply broadcasts x", "乘法对 x 做了广播"),
    "refuse.reduction": ("the reduction is not a mean over every spatial dim", "这个归约不是对所有空间维求均值"),
    "refuse.pool": ("the average pool does not pool to one value per channel", "平均池化没有把每个通道池化成一个值"),
    "refuse.fc": ("the FC layer is not a plain 1×1 convolution", "全连接层不是普通的 1×1 卷积"),
    "refuse.pooled": ("the multiply does not scale the tensor that was pooled", "乘法缩放的不是被池化的那个张量"),
    "refuse.bn_training": ("the BatchNorm between the squeeze FCs is in training mode", "两个压缩全连接层之间的 BN 处于训练模式"),
    "what.bn": ("the BatchNorm after fc1", "fc1 之后的 BN"),
})


#: Activations between the two FC layers (any the Triton helper computes) and the gates.
SE_ACTIVATIONS = tuple(a for a in TRITON_ACTIVATIONS if a != "none")
GATES = ("sigmoid", "hardsigmoid")
SUPPORTED_DTYPES = (torch.float32, torch.float16, torch.bfloat16)

#: Fused result against the unfused graph in float64 from the same inputs upcast,
#: ``|y - ref| <= atol + rtol·|ref|``. The pooled means, both FC layers and the gate are
#: fp32 (sums over C terms err by ~sqrt(C)·6e-8 relative to their magnitude; the gate's
#: slope is at most 1/4, or 1/6 for hardsigmoid), so g is good to ~1e-6; y = x·g is
#: rounded once, to nearest (≤ u·|y|). fp32: 1e-5; 16-bit: rtol 1.25u (u: fp16 4.9e-4,
#: bf16 3.9e-3), so that truncation (up to 2u) fails; atol covers fp16 subnormals.
TOLERANCES = {
    torch.float32: dict(rtol=1e-5, atol=1e-5),
    torch.float16: dict(rtol=6.1e-4, atol=1e-5),    # 1.25u
    torch.bfloat16: dict(rtol=4.9e-3, atol=1e-5),   # 1.25u
}

#: Programs per SM aimed for by each pass when choosing spatial splits (compiled).
PROGRAMS_PER_SM = 4
#: At most this many spatial splits in the squeeze pass (each adds Cr floats per sample
#: and channel block that every excite program sums).
MAX_SQUEEZE_SPLITS = 32


# ====================================================================== reference

def _check_names(act: str, gate: str) -> None:
    check(act, SE_ACTIVATIONS)
    if gate not in GATES:
        raise ValueError(f"unknown gate {gate!r}; known: {list(GATES)}")


def squeeze_excite_reference(x: torch.Tensor, w1: torch.Tensor, b1: torch.Tensor | None, w2: torch.Tensor,
                             b2: torch.Tensor | None, act: str = "relu", gate: str = "sigmoid") -> torch.Tensor:
    """Unfused, as torchvision runs it: pool, conv1x1, act, conv1x1, gate, multiply (6 ops).

    ``x``: ``(N, C, *spatial)``; ``w1``: ``(Cr, C)`` or ``(Cr, C, 1, ...)``; ``b1``: ``(Cr,)``;
    ``w2``: ``(C, Cr)`` or ``(C, Cr, 1, ...)``; ``b2``: ``(C,)``. Any float dtype (float64
    for test references). Returns ``x * gate(...)``, shape and layout of ``x``.
    """
    _check_names(act, gate)
    ones = [1] * (x.dim() - 2)
    s = F.adaptive_avg_pool2d(x, 1) if x.dim() == 4 else x.mean(tuple(range(2, x.dim())), keepdim=True)
    s = conv_nd(s, w1.reshape(w1.shape[0], w1.shape[1], *ones), b1)        # (N, Cr, 1, ...)
    s = apply_activation(s, act)
    s = conv_nd(s, w2.reshape(w2.shape[0], w2.shape[1], *ones), b2)        # (N, C, 1, ...)
    s = apply_activation(s, gate)
    return x * s                                                           # (N, C, *spatial)


# ====================================================================== selection

@selection
def select_squeeze_excite(device: torch.device | str, dtype: torch.dtype, act: str = "relu",
                          gate: str = "sigmoid", layout: str | None = None) -> Choice:
    """The one decision of how squeeze-and-excitation runs: ``triton`` (2 kernels) or ``reference`` (6 ops).

    "triton" needs a device Triton runs on (CUDA compiled, or the CPU under
    ``TRITON_INTERPRET=1``) and fp32/fp16/bf16. ``layout``: the input's, "nchw", "nhwc"
    or "other" (neither: it costs a copy first, and the label says so); None where a
    captured graph cannot say.
    """
    _check_names(act, gate)
    device = torch.device(device)
    if not triton_runs_on(device):
        why = no_triton(device)
    elif dtype not in SUPPORTED_DTYPES:
        why = BASE_WORDS("dtype_one_of", dtype=dtype)
    else:
        label = WORDS("label.triton_copy" if layout == "other" else "label.triton", gate=gate)
        return Choice("triton", where(label, device), True)
    return Choice("reference", WORDS("label.reference", act=act, gate=gate, why=why), False)


# ====================================================================== kernels

def _new_output_like(t: torch.Tensor) -> torch.Tensor:
    """The output, shaped and laid out like the dense ``t`` (tests replace this to poison it)."""
    return torch.empty_like(t)


def _new_output(shape, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A scratch buffer the kernels fully overwrite (tests replace this to poison it)."""
    return torch.empty(shape, dtype=dtype, device=device)


@functools.lru_cache(maxsize=2)
def _build_kernels(interpret: bool):
    """Define both SE kernels (imports Triton); cached per interpreter mode.

    Names the kernels use are module globals (``tl``, ``_activation``, ``_add``, ``_sum``).
    ``LIBRARY_REDUCE`` picks ``tl.sum`` or ``tl.reduce`` with the combine function ``_add``
    of ``triton_support.jit_helpers`` (``triton_support.library_reductions_usable``).
    """
    global tl, _activation, _add, _sum
    _activation, _add = triton_activation(interpret), jit_helpers(interpret).add
    triton, tl = import_triton()

    @triton.jit
    def _sum(v, AXIS: tl.constexpr, LIBRARY_REDUCE: tl.constexpr):
        if LIBRARY_REDUCE:
            r = tl.sum(v, axis=AXIS)
        else:
            r = tl.reduce(v, AXIS, _add)
        return r

    @triton.jit
    def _se_squeeze(
        X, W1, P,                           # x (N, C, HW) via strides; w1 (Cr, C); partials (N, S*B, Cr) fp32
        C, HW, CR, n_blocks, n_splits, rows_per_split, inv_hw,
        stride_xn, stride_xc, stride_xs,
        BLOCK_C: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_R: tl.constexpr, LIBRARY_REDUCE: tl.constexpr,
    ):
        n = tl.program_id(0)
        split = tl.program_id(1)
        blk = tl.program_id(2)
        cols = blk * BLOCK_C + tl.arange(0, BLOCK_C)                        # (BC,) channels
        c_live = cols < C
        x_base = X + n.to(tl.int64) * stride_xn
        s_start = split * rows_per_split
        s_end = tl.minimum(s_start + rows_per_split, HW)
        acc = tl.zeros((BLOCK_S, BLOCK_C), dtype=tl.float32)
        for s0 in range(s_start, s_end, BLOCK_S):
            rows = s0 + tl.arange(0, BLOCK_S)                               # (BS,) spatial positions
            live = (rows < s_end)[:, None] & c_live[None, :]
            xv = tl.load(x_base + rows[:, None] * stride_xs + cols[None, :] * stride_xc, mask=live, other=0.0)
            acc += xv.to(tl.float32)                                        # (BS, BC)
        pooled = _sum(acc, 0, LIBRARY_REDUCE) * inv_hw                      # (BC,) this split's share of the mean
        p_row = P + ((n * n_splits + split) * n_blocks + blk).to(tl.int64) * CR
        for r0 in range(0, CR, BLOCK_R):
            r = r0 + tl.arange(0, BLOCK_R)                                  # (BR,) hidden units
            r_live = r < CR
            w = tl.load(W1 + r[:, None] * C + cols[None, :], mask=r_live[:, None] & c_live[None, :],
                        other=0.0, eviction_policy="evict_last").to(tl.float32)   # (BR, BC)
            tl.store(p_row + r, _sum(w * pooled[None, :], 1, LIBRARY_REDUCE), mask=r_live)

    @triton.jit
    def _se_excite(
        X, Y, P, B1, W2, B2,                # w2 (C, Cr) contiguous; b1 (Cr,), b2 (C,) (alias x when absent)
        C, HW, CR, n_partials, rows_per_split,
        stride_xn, stride_xc, stride_xs, stride_yn, stride_yc, stride_ys,
        ACT: tl.constexpr, GATE: tl.constexpr, HAS_B1: tl.constexpr, HAS_B2: tl.constexpr,
        BLOCK_C: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_P: tl.constexpr,
        BF16_RTNE_BY_HAND: tl.constexpr, LIBRARY_REDUCE: tl.constexpr,
    ):
        n = tl.program_id(0)
        blk = tl.program_id(1)
        split = tl.program_id(2)
        cols = blk * BLOCK_C + tl.arange(0, BLOCK_C)                        # (BC,) channels
        c_live = cols < C
        p_base = P + n.to(tl.int64) * n_partials * CR
        logit = tl.zeros((BLOCK_C,), dtype=tl.float32)
        for r0 in range(0, CR, BLOCK_R):
            r = r0 + tl.arange(0, BLOCK_R)                                  # (BR,) hidden units
            r_live = r < CR
            hsum = tl.zeros((BLOCK_R,), dtype=tl.float32)
            for q0 in range(0, n_partials, BLOCK_P):
                q = q0 + tl.arange(0, BLOCK_P)                              # (BP,) partials
                part = tl.load(p_base + q[:, None] * CR + r[None, :],
                               mask=(q < n_partials)[:, None] & r_live[None, :], other=0.0)   # (BP, BR)
                hsum += _sum(part, 0, LIBRARY_REDUCE)
            if HAS_B1:
                hsum += tl.load(B1 + r, mask=r_live, other=0.0).to(tl.float32)
            h = _activation(hsum, ACT)                                      # padded units meet w2 = 0 below
            w = tl.load(W2 + cols[:, None] * CR + r[None, :], mask=c_live[:, None] & r_live[None, :],
                        other=0.0, eviction_policy="evict_last").to(tl.float32)      # (BC, BR)
            logit += _sum(w * h[None, :], 1, LIBRARY_REDUCE)
        if HAS_B2:
            logit += tl.load(B2 + cols, mask=c_live, other=0.0).to(tl.float32)
        g = _activation(logit, GATE)                                        # (BC,) gates of this block
        x_base = X + n.to(tl.int64) * stride_xn
        y_base = Y + n.to(tl.int64) * stride_yn
        s_start = split * rows_per_split
        s_end = tl.minimum(s_start + rows_per_split, HW)
        for s0 in range(s_start, s_end, BLOCK_S):
            rows = s0 + tl.arange(0, BLOCK_S)                               # (BS,) spatial positions
            live = (rows < s_end)[:, None] & c_live[None, :]
            xv = tl.load(x_base + rows[:, None] * stride_xs + cols[None, :] * stride_xc, mask=live, other=0.0,
                         eviction_policy="evict_first")
            v = xv.to(tl.float32) * g[None, :]                              # (BS, BC)
            if BF16_RTNE_BY_HAND:  # interpreter only: its fp32 -> bf16 cast truncates
                bits = v.to(tl.uint32, bitcast=True)
                v = ((bits + (((bits >> 16) & 1) + 0x7FFF)) >> 16 << 16).to(tl.float32, bitcast=True)
            tl.store(y_base + rows[:, None] * stride_ys + cols[None, :] * stride_yc,
                     v.to(Y.dtype.element_ty, fp_downcast_rounding="rtne"), mask=live)

    return _se_squeeze, _se_excite


def tile_config(c: int, hw: int, layout: str, element_size: int) -> tuple[int, int]:
    """``(BLOCK_C, BLOCK_S)`` for a ``(spatial, channel)`` tile of about 4096 elements (2048 for fp32).

    The tile's contiguous side (channels for channels_last, spatial for NCHW) gets up
    to 128 elements so that each row is whole 16-byte vectors; the other side takes
    the rest, no longer than the tensor's extent.
    """
    budget = 4096 if element_size <= 2 else 2048
    if layout == "nhwc":
        block_c = min(128, next_power_of_2(c))
        block_s = min(next_power_of_2(hw), max(1, budget // block_c))
    else:
        block_s = min(128, next_power_of_2(hw))
        block_c = min(next_power_of_2(c), max(1, budget // block_s))
    return block_c, block_s


def _splits(programs: int, row_blocks: int, device: torch.device, cap: int) -> int:
    """Spatial splits so that ``programs · splits`` reaches ``PROGRAMS_PER_SM`` per SM (1 when interpreted)."""
    if device.type != "cuda":
        return 1
    target = PROGRAMS_PER_SM * sm_count(device)
    return max(1, min(cap, row_blocks, -(-target // max(programs, 1))))


class _Plan:
    """Everything about one call signature of ``squeeze_excite`` that does not change from call to call."""

    __slots__ = ("reference", "copy_x", "as_is", "squeeze", "excite", "grid1", "grid2", "ints1", "ints2", "const1",
                 "const2", "warps", "partials", "key1", "key2")

    def __init__(self, **fields) -> None:
        for name in self.__slots__:
            setattr(self, name, fields.get(name))


#: ``_Plan`` by call signature (``triton_support.planned``); bounded.
_PLANS: dict[tuple, _Plan] = {}


def _check_operands(x, w1, b1, w2, b2, act, gate) -> None:
    _check_names(act, gate)
    if x.dim() < 3:
        raise ValueError(f"x must be (N, C, *spatial), got shape {tuple(x.shape)}")
    c, cr = x.shape[1], w1.shape[0]
    if w1.numel() != cr * c or w2.numel() != c * cr or w2.shape[0] != c:
        raise ValueError(f"w1 must be ({cr}, {c}[, 1, 1]) and w2 ({c}, {cr}[, 1, 1]); "
                         f"got {tuple(w1.shape)} and {tuple(w2.shape)}")
    if (b1 is not None and b1.shape != (cr,)) or (b2 is not None and b2.shape != (c,)):
        raise ValueError(f"b1 must be ({cr},) and b2 ({c},)")


def _plan(x, w1, b1, w2, b2, act, gate, splits, tiles, num_warps, key, impl=None) -> _Plan:
    """Check the operands, decide (the kernels, or the reference where ``select_squeeze_excite`` says so or the
    operands sit on other devices), and plan both launches. ``impl``: the choice the call was handed (its
    lowering binds the rewrite's): the selection is not asked, only the dtype checked (its one operand fact)."""
    _check_operands(x, w1, b1, w2, b2, act, gate)
    layout = layout_of(x) or "other"
    if impl is None:
        impl = select_squeeze_excite(x.device, x.dtype, act, gate, layout).impl
    elif x.dtype not in SUPPORTED_DTYPES:
        impl = "reference"
    if (impl != "triton" or x.numel() == 0
            or any(t is not None and t.device != x.device for t in (w1, b1, w2, b2))):
        return _Plan(reference=True)
    copy_x = layout not in LAYOUTS
    if copy_x:
        x, layout = x.contiguous(), "nchw"
    n, c = x.shape[0], x.shape[1]
    cr = w1.shape[0]
    hw = x.numel() // (n * c)
    # the kernels read w1 as (Cr, C) and w2 as (C, Cr), row-major, and the biases contiguous: as they are when
    # their memory already is that (a conv's (Cr, C, 1, 1) weight is), else a reshaped copy on every call
    as_is = all(t is None or (t.reshape(-1).data_ptr() == t.data_ptr() and t.is_contiguous()) for t in (b1, b2)) and \
        all(t.reshape(rows, cols).is_contiguous() and t.reshape(rows, cols).data_ptr() == t.data_ptr()
            for t, rows, cols in ((w1, cr, c), (w2, c, cr)))
    block_c, block_s = tiles or tile_config(c, hw, layout, x.element_size())
    if x.device.type != "cuda" and tiles is None:       # the interpreter's cost is per program: few, large ones
        block_c = min(next_power_of_2(c), 256)
        block_s = min(next_power_of_2(hw), max(1, 65536 // block_c))
    block_r = min(32, next_power_of_2(cr))
    n_blocks = -(-c // block_c)
    row_blocks = -(-hw // block_s)
    s1, s2 = splits or (_splits(n * n_blocks, row_blocks, x.device, MAX_SQUEEZE_SPLITS),
                        _splits(n * n_blocks, row_blocks, x.device, row_blocks))
    s1, s2 = min(s1, row_blocks), min(s2, row_blocks)
    rows1 = -(-row_blocks // s1) * block_s                                  # spatial rows per split, whole tiles
    rows2 = -(-row_blocks // s2) * block_s
    s1, s2 = -(-hw // rows1), -(-hw // rows2)                               # no empty split
    interpret = interpreting()
    reduce_lib = library_reductions_usable()
    squeeze, excite = _build_kernels(interpret)
    # (n, c, s) strides: the spatial dims of a dense NCHW or NHWC tensor flatten into one; y is x's layout
    sx = (x.stride(0), x.stride(1), x.stride(-1))
    return _Plan(
        reference=False, copy_x=copy_x, as_is=as_is, squeeze=squeeze, excite=excite, grid1=(n, s1, n_blocks),
        grid2=(n, n_blocks, s2), ints1=(c, hw, cr, n_blocks, s1, rows1, 1.0 / hw, *sx),
        ints2=(c, hw, cr, s1 * n_blocks, rows2, *sx, *sx),
        const1=dict(BLOCK_C=block_c, BLOCK_S=block_s, BLOCK_R=block_r, LIBRARY_REDUCE=reduce_lib),
        const2=dict(ACT=act, GATE=gate, HAS_B1=b1 is not None, HAS_B2=b2 is not None, BLOCK_C=block_c,
                    BLOCK_S=block_s, BLOCK_R=block_r, BLOCK_P=min(16, next_power_of_2(s1 * n_blocks)),
                    BF16_RTNE_BY_HAND=interpret and x.dtype == torch.bfloat16, LIBRARY_REDUCE=reduce_lib),
        warps=num_warps or (4 if block_c * block_s <= 2048 else 8), partials=(n, s1 * n_blocks, cr),
        key1=("squeeze", key), key2=("excite", key))


def squeeze_excite(x: torch.Tensor, w1: torch.Tensor, b1: torch.Tensor | None, w2: torch.Tensor,
                   b2: torch.Tensor | None, act: str = "relu", gate: str = "sigmoid", impl: str | None = None, *,
                   splits: tuple[int, int] | None = None, tiles: tuple[int, int] | None = None,
                   num_warps: int | None = None) -> torch.Tensor:
    """``x * gate(fc2(act(fc1(mean_spatial(x)))))`` in two Triton kernels; a new tensor like ``x``.

    ``x``: ``(N, C, *spatial)`` fp32/fp16/bf16, any layout (NCHW and channels_last run
    as they are, others are copied to NCHW); ``w1``: ``(Cr, C)`` or ``(Cr, C, 1, 1)``
    (a conv1x1 weight); ``b1``: ``(Cr,)`` or None; ``w2``: ``(C, Cr)`` or ``(C, Cr, 1, 1)``;
    ``b2``: ``(C,)`` or None; weights in any float dtype (read as fp32). ``act``: one of
    ``SE_ACTIVATIONS``; ``gate``: "sigmoid" or "hardsigmoid". ``splits`` forces the
    spatial splits of (squeeze, excite), ``tiles`` the (BLOCK_C, BLOCK_S) tile,
    ``num_warps`` the warps (tests and tuning). Where ``select_squeeze_excite`` says
    "reference", or the operands sit on different devices, returns
    ``squeeze_excite_reference(...)``. A call signature is checked and planned once: a
    model's later calls cost the host little more than two allocations and two launches. ``impl``: the
    ``Choice.impl`` its lowering hands it (the rewrite's, for the target); given, the selection is not asked.
    """
    key = (x.shape, x.stride(), x.dtype, x.device, w1.shape, w1.stride(), w1.dtype, w1.device, w2.shape, w2.stride(),
           w2.dtype, None if b1 is None else (b1.shape, b1.stride(), b1.dtype), None if b2 is None else
           (b2.shape, b2.stride(), b2.dtype), act, gate, splits, tiles, num_warps, interpreting(), impl)
    plan = planned(_PLANS, key, _plan, x, w1, b1, w2, b2, act, gate, splits, tiles, num_warps, key, impl)
    if plan.reference:
        return squeeze_excite_reference(x, w1, b1, w2, b2, act, gate)
    if plan.copy_x:
        x = x.contiguous()
    if not plan.as_is:
        c, cr = x.shape[1], w1.shape[0]
        w1, w2 = w1.reshape(cr, c).contiguous(), w2.reshape(c, cr).contiguous()    # (Cr, C), (C, Cr)
        b1 = None if b1 is None else b1.contiguous()
        b2 = None if b2 is None else b2.contiguous()
    y = _new_output_like(x)                                                 # (N, C, *spatial), x's layout
    partials = _new_output(plan.partials, torch.float32, x.device)         # (N, S·B, Cr) fp32
    aligned = tuple(t is None or t.data_ptr() & 15 == 0 for t in (x, y, w1, w2, b1, b2))
    launch(plan.squeeze, plan.grid1, (x, w1, partials, *plan.ints1), plan.const1, key=(plan.key1, aligned),
           num_warps=plan.warps)
    launch(plan.excite, plan.grid2,
           (x, y, partials, x if b1 is None else b1, w2, x if b2 is None else b2, *plan.ints2),
           plan.const2, key=(plan.key2, aligned), num_warps=plan.warps)
    return y


# ====================================================================== fused call target

def fused_squeeze_excite(x, w1, b1, w2, b2, act, gate):
    """``x * gate(fc2(act(fc1(avg_pool(x)))))`` as ``select_squeeze_excite`` decides (2 Triton kernels on CUDA)."""
    return squeeze_excite(x, w1, b1, w2, b2, act, gate)


# ====================================================================== rewrite

def _fc(ctx: RewriteContext, node: torch.fx.Node, what: str) -> tuple[torch.fx.Node, torch.fx.Node | None]:
    """(weight, bias) nodes of an FC step: a 1×1 convolution or a linear layer, with constant weights."""
    c = aten.conv_args(node)
    if c is not None:
        w = aten.static_shape(c.weight)
        geometry = edit.int_lists(2, c.stride, c.padding, c.dilation)
        if (w is None or len(w) != 4 or w[2:] != (1, 1) or c.groups != 1 or c.transposed or geometry is None
                or geometry != ([1, 1], [0, 0], [1, 1])):
            raise UseGeneric(WORDS("generic.not_1x1", what=what))
        weight, bias = c.weight, c.bias
    else:
        lin = aten.linear_args(node)
        if lin is None:
            raise UseGeneric(WORDS("generic.neither", what=what, op=aten.aten_name(node)))
        weight, bias = lin.weight, lin.bias
    for t in (weight, bias):
        ctx.constant(t, WORDS("what.weight", what=what))
    return weight, bias


def rewrite(ctx: RewriteContext, chain, kernel: str) -> edit.Edit:
    """pool → fc1 → act → fc2 → gate → multiply as one call (two Triton kernels where they run)."""
    pool, mul = ctx.node(chain, "pool"), ctx.node(chain, "scale")
    for name in chain.nodes:                                   # views between the FCs: flatten, view, unsqueeze
        node = ctx.by_name[name]
        if aten.kind_of(node) == "dropout" and aten.is_training_dropout(node):
            raise Refuse(BASE_WORDS("training_dropout"))
    x = pool.args[0]
    x_shape = aten.static_shape(x)
    name = aten.aten_name(pool)
    if name == "mean":
        a = aten.args_of(pool)
        dims = [a["dim"]] if isinstance(a.get("dim"), int) else list(a.get("dim") or [])
        if x_shape is None or sorted(d % len(x_shape) for d in dims) != list(range(2, len(x_shape))):
            raise UseGeneric(WORDS("generic.mean"))
    elif name not in ("adaptive_avg_pool2d", "_adaptive_avg_pool2d"):
        raise UseGeneric(WORDS("generic.pool", op=name))
    members = set(ctx.members(chain))
    if not edit.through_identity(edit.other_operand(mul, members), x):
        raise Refuse(WORDS("refuse.scale"))
    w1, b1 = _fc(ctx, ctx.node(chain, "fc1"), "fc1")
    w2, b2 = _fc(ctx, ctx.node(chain, "fc2"), "fc2")
    tensors = {}
    bn_node = ctx.node(chain, "bn")
    if bn_node is not None:  # ReXNet: fc1 → BatchNorm → act; an eval BatchNorm after a 1×1 conv folds into it
        w1, b1, tensors = _fold_bn(ctx, bn_node, w1, b1)
    act = aten.activation_name(ctx.node(chain, "act"))
    gate = aten.activation_name(ctx.node(chain, "gate"))
    if act not in SE_ACTIVATIONS or gate not in GATES:
        raise UseGeneric(WORDS("generic.act", act=act, gate=gate))
    xv, yv = aten.node_val(x), aten.node_val(mul)
    if not isinstance(xv, torch.Tensor) or not isinstance(yv, torch.Tensor) or xv.shape != yv.shape:
        raise UseGeneric(WORDS("generic.broadcast"))
    choice = select_squeeze_excite(ctx.device, ctx.run_dtype(xv.dtype), act, gate)
    label = choice.label if choice.fused else edit.not_fused_note(ctx.device, choice.label, WORDS("fused_kernel"))
    return edit.whole_chain_edit(ctx, chain, fused_squeeze_excite, (x, w1, b1, w2, b2, act, gate),
                                 Choice(choice.impl, label, choice.fused), tensors=tensors)


def fold_bn_into_fc(w: torch.Tensor, b: torch.Tensor | None, gamma, beta, mean, var, eps: float):
    """``(w', b')`` with ``fc'(x) == batch_norm(fc(x))`` (eval): each output channel scaled by
    ``γ/√(var + ε)`` and shifted; computed in float64, returned in the weight's dtype."""
    w64 = w.double()
    scale = (gamma.double() if gamma is not None else torch.ones_like(mean, dtype=torch.float64)) \
        / torch.sqrt(var.double() + eps)
    shift = beta.double() if beta is not None else torch.zeros_like(scale)
    b64 = b.double() if b is not None else torch.zeros_like(scale)
    wf = w64 * scale.view(-1, *([1] * (w.dim() - 1)))
    bf = (b64 - mean.double()) * scale + shift
    return wf.to(w.dtype), bf.to(w.dtype)


def _fold_bn(ctx: RewriteContext, bn_node, w1, b1):
    bn = aten.batch_norm_args(bn_node)
    if bn is None or bn.training:
        raise Refuse(WORDS("refuse.bn_training"))
    what = WORDS("what.bn")
    w, b = ctx.constant(w1, what), ctx.constant(b1, what)
    gamma, beta = ctx.constant(bn.weight, what), ctx.constant(bn.bias, what)
    mean, var = ctx.constant(bn.running_mean, what), ctx.constant(bn.running_var, what)
    wf, bf = fold_bn_into_fc(w, b, gamma, beta, mean, var, float(bn.eps))
    key = f"{bn_node.name}_se"
    return NewAttr(f"{key}_w1"), NewAttr(f"{key}_b1"), {f"{key}_w1": wf, f"{key}_b1": bf}


# ====================================================================== lowering (lean graphs)

def _lower(gm: torch.fx.GraphModule, node: torch.fx.Node, device: torch.device, dtype: torch.dtype) -> bool:
    """Triton: the kernel function, called directly. Elsewhere: the six unfused library calls. As the rewrite
    chose for this device and dtype (``edit.planned``), else as the selection says."""
    x, w1, b1, w2, b2, act, gate = node.args
    w1t, w2t = edit.attr_tensor(gm, w1), edit.attr_tensor(gm, w2)
    x_shape = aten.static_shape(x)
    if w1t is None or w2t is None or x_shape is None or len(x_shape) != 4:
        return False
    if (edit.planned(node, device, dtype) or select_squeeze_excite(device, dtype, act, gate)).impl == "triton":
        return edit.replace_node(gm, node, lambda g: g.call_function(squeeze_excite, (x, w1, b1, w2, b2, act, gate,
                                                                                      "triton")))   # handed it
    c = w1t.shape[1]

    def build(g: torch.fx.Graph) -> torch.fx.Node:
        s = g.call_function(torch._C._nn.adaptive_avg_pool2d, (x, [1, 1]))                 # (N, C, 1, 1)
        if w1t.dim() == 2:                                                                   # linear FCs
            s = g.call_function(torch.flatten, (s, 1))                                       # (N, C)
            h = in_place_node(g, g.call_function(torch._C._nn.linear, (s, w1, b1)), act)     # (N, Cr)
            s = in_place_node(g, g.call_function(torch._C._nn.linear, (h, w2, b2)), gate)    # (N, C)
            s = g.call_method("view", (s, [-1, c, 1, 1]))
        else:
            h = in_place_node(g, g.call_function(torch.conv2d, (s, w1, b1)), act)            # (N, Cr, 1, 1)
            s = in_place_node(g, g.call_function(torch.conv2d, (h, w2, b2)), gate)           # (N, C, 1, 1)
        return g.call_function(torch.mul, (s, x))

    return edit.replace_node(gm, node, build)


LOWERINGS = {fused_squeeze_excite: _lower}


# ====================================================================== pattern

def _fc_after_global_pool(g, node: str, ctx: dict) -> str | None:
    """fc1 reads a pool to one value per channel (the anchor's own guard would never be asked): a global average
    pool, or a mean over every spatial dim; and fc1 is a plain 1×1 convolution or a linear layer."""
    pool = g.nodes[ctx["prev_real"]]
    inputs = list(g.predecessors(ctx["prev_real"]))
    rank = len(g.nodes[inputs[0]]["shapes"][0]) if len(inputs) == 1 and g.nodes[inputs[0]]["shapes"] else 0
    if pool["kind"] == "reduce":
        if "mean" not in str(pool.get("target", "")) or pool.get("reduce_dims") != list(range(2, rank)) or rank < 3:
            return WORDS("refuse.reduction")
        return _one_by_one(g, node, ctx)
    shapes = pool["shapes"]
    if not shapes or len(shapes[0]) < 3 or any(s != 1 for s in shapes[0][2:]):
        return WORDS("refuse.pool")
    return _one_by_one(g, node, ctx)


def _one_by_one(g, node: str, ctx: dict) -> str | None:
    if g.nodes[node]["kind"] == "conv" and (g.nodes[node].get("kernel", [1, 1]) != [1, 1]
                                            or g.nodes[node].get("groups", 1) != 1):
        return WORDS("refuse.fc")
    return None


def _scales_pooled_input(g, node: str, ctx: dict) -> str | None:
    """The multiply's other operand is the tensor the chain pooled (x · gate(...))."""
    pool = next(n for n in ctx["chain"] if g.nodes[n]["kind"] in ("avg_pool", "reduce"))
    pooled = set(g.predecessors(pool))
    others = {p for p in g.predecessors(node) if p != ctx["prev"] and p not in ctx["chain"]}
    if others != pooled:
        return WORDS("refuse.pooled")
    return None


def _eval_bn(g, node: str, ctx: dict) -> str | None:
    return WORDS("refuse.bn_training") if g.nodes[node].get("training") else None


_FC = frozenset({"conv", "linear"})

#: Which families this one must claim nodes before or after (explorer.fusions.order).
RUNS_BEFORE = ("conv",)   # its 1×1 convolutions and their activation are one block, not conv epilogues

PATTERNS = (
    Pattern(
        name="squeeze_excite", label=WORDS("squeeze_excite.label"),
        steps=(Step(frozenset({"avg_pool", "reduce"}), "pool"),
               Step(_FC, "fc1", guard=_fc_after_global_pool),
               Step(frozenset({"batch_norm"}), "bn", optional=True, guard=_eval_bn),   # ReXNet's SE
               Step(frozenset(SE_ACTIVATIONS) - {"gelu_tanh", "sigmoid", "hardsigmoid"}, "act"),
               Step(_FC, "fc2", guard=_one_by_one),
               Step(frozenset(GATES), "gate"),
               Step(frozenset({"mul"}), "scale", guard=_scales_pooled_input)),
        color="#e7ba52", rewrite=rewrite,
        implementation=WORDS("squeeze_excite.implementation"),
        explanation=WORDS("squeeze_excite.explanation"),
        caveats=(PRECISION_CAVEAT, WORDS("squeeze_excite.caveat")),
    ),
)
