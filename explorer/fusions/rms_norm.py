"""The RMSNorm family: Llama's RMSNorm, after the residual add or alone, in one Triton pass.

::

    unfused (transformers' LlamaRMSNorm: 6-7 kernels, fp32 temporaries)      fused (1 kernel)
    x ───┐                                                                    x ───┐
         add ─► s ─► to(fp32) ─┬─► pow(2) ─► mean(-1) ─► + eps ─► rsqrt ─┐         add_rms_norm ─► s  (kept)
    r ───┘   │                 └─────────────────────────────────────── mul   r ───┘           └──► y
             │                          to(dtype) ◄──────────────────────┘
             │                              └─► mul(weight) ─► y            y = w · round(s / rms(s))
             └─► (next residual)

    without the add (the first norm of a decoder):  rms_norm(x, w) ─► y

In a Llama decoder layer the residual stream's sum is also the next residual, so
the sum is the fused kernel's second output (the pattern's ``emits``); where
nothing else reads it (the last norm) it is not written at all. What fusion
saves: the unfused add moves 2R+1W and the norm, in eager, six ops with fp32
temporaries; the kernel moves 2R+2W (2R+1W without the sum, 1R+1W without the add).

Arithmetic, step by step as ``LlamaRMSNorm.forward`` rounds::

    s = round_dtype(x + r)                 # the unfused add stores s in the dtype
    h = float32(s)                         # hidden_states.to(torch.float32)
    v = sum(h * h) / N                     # hidden_states.pow(2).mean(-1, keepdim=True)  (fp32)
    h = round_dtype(h * rsqrt(v + eps))    # ... * torch.rsqrt(variance + eps), .to(input_dtype)
    y = round_out(float32(w) * h)          # self.weight * hidden_states  (out = promote(w, x))

The products ``w·h`` of two 16-bit values are exact in fp32, so the last step
rounds exactly like PyTorch's multiply; only the order of the fp32 sum of squares
and the rsqrt's last bit can differ from eager.

Kernel design (bandwidth-bound, one pass): ``ROWS`` rows per program (1 for rows
of 1024 or more elements, more for short rows), the whole row (``BLOCK =
next_pow2(N)`` lanes, masked beyond N) loaded once into registers, the sum
rounded and stored, the mean square reduced in fp32 (masked lanes load 0 and add
0), normalised, rounded, scaled and stored. Launches are planned once per call
signature (``_LAUNCHES``) and go through ``triton_support.launch``.

Supported: fp32, fp16, bf16 (x and residual of one dtype; the weight any of those),
last dim 1..16384, a residual that broadcasts over leading dims (either operand).
Anything else, calls autograd records, and CPU tensors without
``TRITON_INTERPRET=1`` take the reference; ``select_rms_norm`` is the one decision. It is
made once per chain, at the rewrite, for the run's target, and recorded on the fused call;
the lowering of a lean graph for that target hands the recorded impl to the call
(``LOWERINGS``: ``edit.bind_choice``), which then follows it, checking only that the operands
fit the kernel. A fused graph run as it is (not lowered) asks once per call signature.

Matching: the norm has a fan-out inside (``h`` feeds ``pow`` and the ``mul``), so
both patterns bring their own matcher (``match_add_rms_norm``, ``match_rms_norm``; the γ fold,
``explorer.fusions.rms_fold``, matches through them too)
over the facts ``explorer.graph.aten.facts`` records (pow exponent, reduced dims,
the eps scalar, cast dtypes).
"""

from __future__ import annotations

import functools

import networkx as nx
import torch
import torch.fx

from explorer.fusions import edit
from explorer.fusions.base import WORDS as BASE_WORDS
from explorer.fusions.base import PRECISION_CAVEAT, Choice, NoMatch, Pattern, Step, selection
from explorer.fusions.claims import epilogue_claim
from explorer.fusions.edit import Refuse, RewriteContext, UseGeneric, leading_broadcast, residual_add_operands
from explorer.fusions.triton_support import where
from explorer.fusions.triton_support import (Launch, cdiv, contiguous_key, import_triton, interpreting, jit_helpers,
                                             launch, library_reductions_usable, needs_autograd, next_power_of_2,
                                             planned, refusal_for_device, row_warps)
from explorer.graph import aten
from explorer.words import Words

#: What this family says to a person, in English and 中文 (rendered by explorer.ui.i18n by id).
WORDS = Words("rms_norm", {
    "title": ("Add + RMSNorm", "残差相加 + RMSNorm"),
    "add_rms_norm.label": ("Add+RMSNorm", "Add+RMSNorm（残差相加+RMSNorm）"),
    "add_rms_norm.implementation": (("one Triton kernel that writes the normalised row, and the sum too where the "
                                     "next residual reads it"),
                                    "一个 Triton 内核写出归一化后的行；下一个残差要读时，也写出和"),
    "add_rms_norm.explanation": (("The residual add writes the sum that the RMSNorm then reads back. A "
                                  "hand-written RMSNorm (transformers' LlamaRMSNorm) is six ops, each reading and "
                                  "writing the whole activation, with fp32 temporaries: cast, square, mean, add "
                                  "eps, rsqrt, multiply, cast back, scale. One kernel reads the row once, keeps "
                                  "it in registers for the mean square, and writes the normalised row, rounding "
                                  "where the module rounds. With the add in the same kernel the sum is read from "
                                  "registers, and written once for the next residual."),
                                 ("残差相加写出的和，接着又被 RMSNorm 读回。手写的 RMSNorm（transformers 的 "
                                  "LlamaRMSNorm）有六个算子，每个都要读写整个激活张量，还有 fp32 临时张量：类型转换、平方、求均值、加 "
                                  "eps、rsqrt、相乘、转换回来、缩放。一个内核只读一遍这一行，把它留在寄存器里求均方，再写出归一化后的行，并在原模块舍入的地方舍入。把相加放进同一个内核后，和直接从寄存器读取，只为下一个残差写出一次。")),
    "caveats": ("Statistics are accumulated in fp32 even for fp16/bf16 inputs, as LlamaRMSNorm does.",
                "即使输入是 fp16/bf16，统计量也用 fp32 累加，和 LlamaRMSNorm 一样。"),
    "add_rms_norm.formula": ("s = x + r;  y = w · round(s / sqrt(mean(s²) + eps))",
                             "s = x + r；  y = w · round(s / sqrt(mean(s²) + eps))"),
    "rms_norm.label": ("RMSNorm", "RMSNorm"),
    "rms_norm.implementation": (("one Triton kernel for the whole RMSNorm (the first norm of a decoder, with no "
                                 "add before it)"),
                                "整个 RMSNorm 用一个 Triton 内核（解码器的第一个归一化，前面没有残差相加）"),
    "teaching": (("A hand-written RMSNorm (transformers' LlamaRMSNorm) is six ops, each reading and writing the "
                  "whole activation, with fp32 temporaries: cast, square, mean, add eps, rsqrt, multiply, cast "
                  "back, scale. One kernel reads the row once, keeps it in registers for the mean square, and "
                  "writes the normalised row, rounding where the module rounds."),
                 ("手写的 RMSNorm（transformers 的 LlamaRMSNorm）有六个算子，每个都要读写整个激活张量，还有 fp32 临时张量：类型转换、平方、求均值、加 "
                  "eps、rsqrt、相乘、转换回来、缩放。一个内核只读一遍这一行，把它留在寄存器里求均方，再写出归一化后的行，并在原模块舍入的地方舍入。")),
    "rms_norm.formula": ("y = w · round(x / sqrt(mean(x²) + eps))", "y = w · round(x / sqrt(mean(x²) + eps))"),
    "why.dtype": ("{what} dtype {dtype} is not one of fp32/fp16/bf16", "{what} 的数据类型 {dtype} 不是 fp32/fp16/bf16 之一"),
    "what.input": ("input", "输入"),
    "what.weight": ("weight", "权重"),
    "why.rows": ("rows of {hidden} are outside 1..{max} (one row must fit in one program)",
                 "行长 {hidden} 超出 1..{max}（一行必须放进一个 program）"),
    "why.residual_dtype": ("x is {dtype} but the residual is {residual} (the kernel takes one dtype)",
                           "x 是 {dtype}，残差却是 {residual}（该内核只接受一种数据类型）"),
    "why.broadcast": ("residual {residual} and x {x} differ other than over leading dims",
                      "残差 {residual} 与 x {x} 除前导维度外还有不同"),
    "label.eager_add": ("add + RMSNorm (eager ops: {why})", "add + RMSNorm（eager 算子：{why}）"),
    "label.eager": ("RMSNorm (eager ops: {why})", "RMSNorm（eager 算子：{why}）"),
    "label.eager_add_plain": ("add + RMSNorm (eager ops)", "add + RMSNorm（eager 算子）"),
    "label.eager_plain": ("RMSNorm (eager ops)", "RMSNorm（eager 算子）"),
    "label.rms": ("triton rms_norm (1 kernel)", "triton rms_norm（1 个内核）"),
    "label.two_outputs": ("triton add+rms_norm (1 kernel, 2 outputs)", "triton add+rms_norm（1 个内核，2 个输出）"),
    "label.no_sum": ("triton add+rms_norm (1 kernel; the sum is not written: nothing else reads it)",
                     "triton add+rms_norm（1 个内核；不写出和：没有别的算子读它）"),
    "refuse.mean_dims": ("the RMSNorm's mean is not over the last dimension alone", "RMSNorm 的均值不是只在最后一维上求的"),
    "refuse.fp32_also": ("the fp32 copy of the sum is also read outside the RMSNorm", "和的 fp32 副本在 RMSNorm 之外也被读取"),
    "refuse.both": ("the sum is read both before and after its cast", "和在类型转换之前和之后都被读取"),
    "generic.rounded": (("the normalised value is {dtype}, not the input's {input}: the kernel rounds it to the "
                         "input dtype"),
                        "归一化后的值是 {dtype}，不是输入的 {input}：该内核会把它舍入到输入的数据类型"),
    "generic.eps": ("eps is not a number", "eps 不是一个数"),
    "generic.weight": ("the RMSNorm weight is not a vector of {n}", "RMSNorm 的权重不是长度为 {n} 的向量"),
    "generic.result": ("the chain's result is {dtype}, not promote(weight, x)",
                       "链的结果是 {dtype}，不是 promote(weight, x)"),
    "refuse.leaves": ("the sum leaves the chain from more than one node", "和从不止一个节点离开这条链"),
    "refuse.fp32": ("the fp32 copy of the sum is read outside the RMSNorm", "和的 fp32 副本在 RMSNorm 之外被读取"),
    "generic.input": ("the RMSNorm input is not a tensor of the graph", "RMSNorm 的输入不是计算图中的张量"),
})


MAX_HIDDEN = 16384
SUPPORTED_DTYPES = (torch.float32, torch.float16, torch.bfloat16)

#: Fused kernel vs the same computation in float64 from the same inputs (the references on upcast
#: inputs: no intermediate rounding), ``|out - ref| <= atol + rtol·|ref|``, for the sum and the
#: normalised output alike. u = unit roundoff (fp32 6e-8, fp16 4.9e-4, bf16 3.9e-3). Every step is
#: multiplicative, so the error is relative to each element: the sum is rounded (u), which moves
#: rms(s) by at most u (in practice ~u/sqrt(N)); h is rounded (u) and w·h is rounded (u): < 4u in
#: all, ~3u worst seen, plus the fp32 statistics (a tree sum of up to 16k squares and an approximate
#: rsqrt, ~1e-6 relative at most). rtol = 4u for 16-bit; 4e-6 for fp32, where the statistics' own
#: error dominates. atol covers only results that leave the normal range.
TOLERANCES = {
    torch.float32: dict(rtol=4e-6, atol=1e-6),
    torch.float16: dict(rtol=2e-3, atol=1e-6),      # 4u
    torch.bfloat16: dict(rtol=1.6e-2, atol=1e-6),   # 4u
}

#: Fused kernel vs eager in the dtype (what a model-level check compares). Both round at the same
#: points, so they agree bitwise except where the fp32 statistics' last bits tip the rounding of h:
#: one ulp of h (<= 2u relative), then of w·h (u): rtol = 4u; fp32 as above.
EAGER_TOLERANCES = dict(TOLERANCES)


def rms_norm_reference(x: torch.Tensor, weight: torch.Tensor | None, eps: float = 1e-6) -> torch.Tensor:
    """``LlamaRMSNorm.forward`` spelled out: ``weight * normalise(x)`` over the last dim.

    Statistics in fp32 for fp32/fp16/bf16 inputs (bitwise the module's result); float64 inputs
    stay in float64, so the same function on upcast inputs is the exact oracle of the tests.
    ``weight``: ``(N,)`` or None. Output dtype: ``promote(weight, x)``, as the module's.
    """
    input_dtype = x.dtype
    h = x.to(torch.promote_types(input_dtype, torch.float32))                # (..., N)
    variance = h.pow(2).mean(-1, keepdim=True)                               # (..., 1)
    h = (h * torch.rsqrt(variance + eps)).to(input_dtype)                    # (..., N)
    return h if weight is None else weight * h                               # (..., N)


def add_rms_norm_reference(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor | None,
                           eps: float = 1e-6, keep_sum: bool = True) -> tuple[torch.Tensor | None, torch.Tensor]:
    """Unfused: ``s = x + residual`` (stored in the dtype), then ``rms_norm_reference(s)``; returns ``(s, y)``
    (``s`` None with ``keep_sum=False``): a decoder's residual add and the next RMSNorm."""
    s = x + residual                                                         # (..., N), rounded to the dtype
    return (s if keep_sum else None), rms_norm_reference(s, weight, eps)


# ====================================================================== kernel selection

def _refusal_for_dtype(dtype: torch.dtype | None, what: str) -> str | None:
    if dtype is not None and dtype not in SUPPORTED_DTYPES:
        return WORDS("why.dtype", what=WORDS("what." + what), dtype=dtype)
    return None


@selection
def select_rms_norm(device: torch.device | str, hidden: int | None = None, dtype: torch.dtype | None = None, *,
                    residual_dtype: torch.dtype | None = None, weight_dtype: torch.dtype | None = None,
                    x_shape=None, residual_shape=None, keep_sum: bool = True, add: bool = True,
                    requires_grad: bool = False) -> Choice:
    """The one decision of how (add +) RMSNorm runs: ``triton`` (one kernel) or ``reference`` (eager ops).

    Only ``device`` is required; arguments left as None raise no objection, so the rewrite asks
    with what the graph says (device, dtype, hidden size) and a call that was handed no choice (a fused
    graph run as it is) with everything (shapes, the residual's and weight's dtypes). ``add=False`` is the
    plain RMSNorm. ``requires_grad``: autograd would record the call (the kernel is forward-only).
    """
    why = refusal_for_device(device) or _refusal_for_dtype(dtype, "input") or _refusal_for_dtype(weight_dtype,
                                                                                                  "weight")
    if why is None and requires_grad:
        why = BASE_WORDS("autograd")
    why = why or _shape_refusal(hidden, dtype, residual_dtype, x_shape, residual_shape)
    if why is not None:
        return Choice("reference", WORDS("label.eager_add" if add else "label.eager", why=why), False)
    label = WORDS("label.rms" if not add else "label.two_outputs" if keep_sum else "label.no_sum")
    return Choice("triton", where(label, torch.device(device)), True)


def _shape_refusal(hidden, dtype, residual_dtype, x_shape, residual_shape) -> str | None:
    """Why the kernel does not take operands of these row lengths, dtypes and shapes (None: it does)."""
    if hidden is not None and not 1 <= hidden <= MAX_HIDDEN:
        return WORDS("why.rows", hidden=hidden, max=MAX_HIDDEN)
    if residual_dtype is not None and dtype is not None and residual_dtype != dtype:
        return WORDS("why.residual_dtype", dtype=dtype, residual=residual_dtype)
    if x_shape is not None and residual_shape is not None and not (
            leading_broadcast(residual_shape, x_shape) or leading_broadcast(x_shape, residual_shape)):
        return WORDS("why.broadcast", residual=tuple(residual_shape), x=tuple(x_shape))
    return None


# ====================================================================== the kernel

#: Measured launch settings, ``(BLOCK, element size, residual, weight, sum written) -> (ROWS, num_warps, HINTS)``:
#: per kernel variant the setting whose worst fraction of a device copy (the same bytes, the same run) over the rows
#: measured was highest, on the H200 in bf16 (``benchmarks/bench_rms_fold.py --only rmsnorm``: the full sweep in
#: ``benchmarks/results/bench_rms_fold_h200.json``, the kernel as it is now in ``bench_rms_fold_h200_run2.json``;
#: hidden 4096 at 4096, 8192 and 16384 rows, hidden 512 at 16384). The fractions below are run 2's, per row count.
#: fp16 shares bf16's entries (the same bytes); fp32 and other widths take the heuristic.
#:
#: ``HINTS`` (the loads' cache hints, see ``HINTS`` below) of the four Add+RMSNorm variants at hidden 4096:
#: evict-last (2), the best in both dtypes of the two H200 verifies (8B's 4096 rows, paired rounds with the copy):
#: ``benchmarks/results/bench_membw_verify_h200.json`` timed no hints (1) for all four and evict-last for the one
#: whose sum is not written; ``bench_membw_verify2_h200.json`` timed no hints as launched, evict-first
#: (``PREVIOUS_TUNED``) and evict-last for the other three. Each evict-last median is under the launched setting's
#: 20th percentile there. The other entries keep evict-first (0): no other hint was timed for them.
TUNED: dict[tuple[int, int, bool, bool, bool], tuple[int, int, int]] = {
    # Add+RMSNorm, the sum written: 95.2 / 93.1 / 94.0% of copy (run 2); verify 2: evict-last 100.2% bf16 / 96.9%
    # fp16, no hints 96.0 / 93.5%, evict-first 93.0 / 92.6%
    (4096, 2, True, True, True): (4, 16, 2),
    # Add+RMSNorm, the sum not written: 92.6 / 93.4 / 93.5% (run 2); evict-last 100.6% bf16 / 98.2% fp16 where
    # evict-first measured 95.5 / 91.4% and no hints 96.3 / 93.8% (verify 1); launched, 100.2 / 99.5% against
    # evict-first's 92.7 / 93.0% (verify 2)
    (4096, 2, True, True, False): (1, 16, 2),
    # Add+RMSNorm without γ (folded), the sum written: 2 rows a program since the H200 sweep of
    # benchmarks/results/bench_membw_sweep_h200.json (4096 rows, bf16): 95.2% of copy at (2, 16) where (4, 16)
    # measured 92.5% in the same rounds (93.0 / 92.9 / 93.2% at 4096 / 8192 / 16384 rows in run 2); 8192 and 16384
    # rows are not timed at (2, 16) yet. PREVIOUS_TUNED keeps (4, 16). Verify 2: evict-last 101.5% bf16 / 99.7% fp16,
    # no hints 98.0 / 96.8%, evict-first 96.0 / 93.6%
    (4096, 2, True, False, True): (2, 16, 2),
    # the same, the sum not written (a decoder's last norm): 94.8 / 93.1 / 93.4% (run 2); verify 2: evict-last
    # 103.2% bf16 / 104.1% fp16, no hints 97.8 / 95.9%, evict-first 97.5 / 95.9%
    (4096, 2, True, False, False): (1, 16, 2),
    (4096, 2, False, True, False): (2, 16, 0),   # RMSNorm: 96.5 / 94.4 / 94.8%
    (4096, 2, False, False, False): (4, 16, 0),  # RMSNorm without γ (folded): 95.4 / 95.5 / 95.7%
    # the zoo decoder's rows (a copy of 33-67 MB runs below the device's peak, hence over 100%)
    (512, 2, True, True, True): (2, 2, 0),       # 114.8%
    (512, 2, True, True, False): (2, 2, 0),      # 110.6%
    (512, 2, True, False, True): (2, 2, 0),      # 102.7%
    (512, 2, True, False, False): (2, 2, 0),     # 98.7%
    (512, 2, False, True, False): (2, 2, 0),     # 117.0%
    (512, 2, False, False, False): (4, 4, 0),    # 100.5%
}

#: The entries ``TUNED`` replaced, by key (what they were before the sweep of ``bench_membw_sweep_h200.json`` and
#: the verify of ``bench_membw_verify_h200.json``; ``benchmarks/bench_membw.py``'s ``PREVIOUS`` times them beside
#: the current ones in the same rounds).
PREVIOUS_TUNED: dict[tuple[int, int, bool, bool, bool], tuple[int, int, int]] = {
    (4096, 2, True, True, True): (4, 16, 0),
    (4096, 2, True, True, False): (1, 16, 0),
    (4096, 2, True, False, True): (4, 16, 0),
    (4096, 2, True, False, False): (1, 16, 0),
}

#: The loads' cache hints outside ``TUNED`` unless a call says (the kernel's ``HINTS``): 0, x and the residual
#: evict-first and γ evict-last (the kernel first measured); 1, x and the residual without hints; 2, evict-last (γ
#: evict-last in all three). No hint changes a value (``tests/test_kernel_layouts.py``: the same bits at each, and
#: the same register layout compiled for sm_90).
HINTS = 0


def launch_setting(hidden: int, element_size: int = 2, residual: bool = True, weight: bool = True,
                   write_sum: bool | None = None) -> tuple[int, int, int, int]:
    """``(BLOCK, ROWS, num_warps, HINTS)`` for rows of ``hidden`` elements of ``element_size`` bytes, for the kernel
    variant (with a residual, a weight, the sum written; ``write_sum`` defaults to ``residual``).

    BLOCK = next power of two >= hidden. ``TUNED`` holds the measured settings; otherwise short rows
    are packed ``ROWS`` to a program so that a program holds at least 1024 elements (at most 16 rows),
    warps grow with the tile so that each thread holds a few 16-byte vectors
    (``benchmarks/bench_rms_fold.py`` times the alternatives), and the hints are ``HINTS``.
    """
    block = next_power_of_2(hidden)
    write_sum = residual if write_sum is None else write_sum
    tuned = TUNED.get((block, element_size, residual, weight, residual and write_sum))
    if tuned is not None:
        return (block, *tuned)
    rows = max(1, min(16, 1024 // block))
    return block, rows, row_warps(block * rows), HINTS


def launch_config(hidden: int, element_size: int = 2, residual: bool = True, weight: bool = True,
                  write_sum: bool | None = None) -> tuple[int, int, int]:
    """``(BLOCK, ROWS, num_warps)`` of ``launch_setting`` (the hints left out)."""
    return launch_setting(hidden, element_size, residual, weight, write_sum)[:3]


def _new_output(shape, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Allocate an output the kernel fully overwrites (tests replace this to poison it)."""
    return torch.empty(shape, dtype=dtype, device=device)


def _new_output_like(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``_new_output`` shaped like the contiguous ``t``: ``empty_like`` parses less than ``empty`` (about half the
    host time of a small call on the H200); tests replace this too."""
    return torch.empty_like(t) if dtype == t.dtype else torch.empty_like(t, dtype=dtype)


@functools.lru_cache(maxsize=2)
def _build_kernel(interpret: bool):
    """Define the Triton kernel (imports Triton); cached per interpreter mode.

    ``triton.jit`` reads TRITON_INTERPRET when it decorates, hence the lazy definition. The
    names the kernel calls (``tl``, ``_round_to``, ``_add``, ``_load_rows``) are module globals, which every
    Triton version resolves. ``LIBRARY_REDUCE`` picks ``tl.sum`` (always when compiled) or
    ``tl.reduce`` with our own combine function (``library_reductions_usable``).
    """
    global tl, _round_to, _add, _load_rows
    triton, tl = import_triton()
    helpers = jit_helpers(interpret)
    _round_to, _add = helpers.round_to, helpers.add

    @triton.jit
    def _load_rows_fn(ptrs, live, EVEN: tl.constexpr, HINTS: tl.constexpr):
        """x's or the residual's rows, unmasked where ``EVEN``; cache hints by ``HINTS`` (0 evict-first, 1 none,
        2 evict-last)."""
        if EVEN:
            if HINTS == 1:
                v = tl.load(ptrs)
            elif HINTS == 2:
                v = tl.load(ptrs, eviction_policy="evict_last")
            else:
                v = tl.load(ptrs, eviction_policy="evict_first")
        else:
            if HINTS == 1:
                v = tl.load(ptrs, mask=live, other=0.0)
            elif HINTS == 2:
                v = tl.load(ptrs, mask=live, other=0.0, eviction_policy="evict_last")
            else:
                v = tl.load(ptrs, mask=live, other=0.0, eviction_policy="evict_first")
        return v

    _load_rows = _load_rows_fn

    @triton.jit
    def _add_rms_norm_fwd(
        X, R, W, S, Y,                              # pointers: x, residual; weight; outputs sum, normed
        stride_x, stride_r, stride_s, stride_y,     # row strides (elements); the last dim is contiguous
        M, N, R_ROWS, eps,                          # R_ROWS: rows of the residual (< M: it repeats)
        HAS_R: tl.constexpr, HAS_W: tl.constexpr, WRITE_SUM: tl.constexpr, BLOCK: tl.constexpr,
        ROWS: tl.constexpr, BF16_RTNE_BY_HAND: tl.constexpr, LIBRARY_REDUCE: tl.constexpr,
        EVEN: tl.constexpr, HINTS: tl.constexpr,
    ):
        """Program i: rows i·ROWS .. i·ROWS+ROWS-1 of x; writes their sum (if WRITE_SUM) and normalised rows.

        ``EVEN``: N == BLOCK and ROWS divides M, so no lane is masked: loads and stores are plain
        16-byte vectors (a masked access is vectorised only where the compiler can prove the mask
        constant over a vector). ``HINTS``: x and the residual loaded 0 evict-first, 1 without hints, 2 evict-last
        (``HINTS``); γ is loaded evict-last either way. No hint changes a value."""
        rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)[:, None]   # (ROWS, 1)
        cols = tl.arange(0, BLOCK)[None, :]                                          # (1, BLOCK)
        in_row = cols < N
        live = (rows < M) & in_row                                                   # (ROWS, BLOCK)
        x = _load_rows(X + rows * stride_x + cols, live, EVEN, HINTS)
        if HAS_R:
            r = _load_rows(R + (rows % R_ROWS) * stride_r + cols, live, EVEN, HINTS)
        # the weight is issued now, with the rows, so that its (L2) latency overlaps the reduction. It is loaded
        # as a (ROWS, BLOCK) tile (each row's copy an L1 hit), in the rows' own register layout: loaded as
        # (1, BLOCK), Triton gives it another layout and converts it through shared memory (two barriers),
        # which cost a third of the time of short rows (RMSNorm over 512 on the H200: bench_rms_fold_h200.json)
        w_cols = cols + rows * 0                                                     # (ROWS, BLOCK)
        if HAS_W:
            if EVEN:
                w = tl.load(W + w_cols, eviction_policy="evict_last").to(tl.float32)
            else:
                w = tl.load(W + w_cols, mask=live, other=0.0, eviction_policy="evict_last").to(tl.float32)
        if HAS_R:
            # the unfused add stores the sum in the dtype, and the norm reads that rounded sum
            s = _round_to(x.to(tl.float32) + r.to(tl.float32), X.dtype.element_ty, BF16_RTNE_BY_HAND)
            if WRITE_SUM:
                if EVEN:
                    tl.store(S + rows * stride_s + cols, s)
                else:
                    tl.store(S + rows * stride_s + cols, s, mask=live)
            h = s.to(tl.float32)                                                     # (ROWS, BLOCK)
        else:
            h = x.to(tl.float32)
        if LIBRARY_REDUCE:                                                           # padded lanes add 0
            variance = tl.sum(h * h, axis=1) / N                                     # (ROWS,)
        else:
            variance = tl.reduce(h * h, 1, _add) / N
        h = h * tl.math.rsqrt(variance + eps)[:, None]
        # hidden_states.to(input_dtype): rounded to the input dtype before the weight multiplies it
        h = _round_to(h, X.dtype.element_ty, BF16_RTNE_BY_HAND).to(tl.float32)
        if HAS_W:
            h = w * h                                                                # exact for 16-bit w, h
        out = _round_to(h, Y.dtype.element_ty, BF16_RTNE_BY_HAND)
        if EVEN:
            tl.store(Y + rows * stride_y + cols, out)
        else:
            tl.store(Y + rows * stride_y + cols, out, mask=live)

    return _add_rms_norm_fwd


#: ``Launch`` by call signature (see ``_signature``): decisions and launch arguments are worked out
#: once per signature (``triton_support.planned``), so that a repeated call costs the host two
#: allocations and the launch. Bounded.
_LAUNCHES: dict[tuple, Launch] = {}


def _signature(x, residual, weight, eps, keep_sum, rows_per_prog, num_warps, impl=None,
               hints=None) -> tuple | None:
    """Hashable call signature for the fast path, or None where only the general path applies.

    Contiguous operands only. It holds what the kernel is specialised on (dtypes; shapes, hence
    every integer argument; which pointers are 16-byte aligned), the devices (and on the CPU
    whether Triton is interpreting), the tuning overrides and the impl the call was handed.
    """
    operands = contiguous_key(x, residual, weight)
    if operands is None:
        return None
    return (operands, float(eps), keep_sum, rows_per_prog, num_warps, x.is_cuda or interpreting(), impl) + (
        () if hints is None else (hints,))


def _unfit(x, residual, weight) -> bool:
    """Operands no kernel call takes whatever was decided: empty, a scalar, on different devices, a weight that
    is not ``(N,)``."""
    n = x.shape[-1] if x.dim() else 0
    return (x.numel() == 0 or x.dim() == 0 or any(t is not None and t.device != x.device for t in (residual, weight))
            or (weight is not None and tuple(weight.shape) != (n,)))


def _operands_choice(x, residual, weight, keep_sum) -> Choice:
    """``select_rms_norm`` asked with everything about the actual operands (plus device agreement): a call
    handed no choice (``impl`` None: a fused graph run as it is, not lowered)."""
    add = residual is not None
    if _unfit(x, residual, weight):
        return Choice("reference", WORDS("label.eager_add_plain" if add else "label.eager_plain"), False)
    return select_rms_norm(x.device, x.shape[-1], x.dtype, residual_dtype=None if residual is None else residual.dtype,
                           weight_dtype=None if weight is None else weight.dtype, x_shape=x.shape,
                           residual_shape=None if residual is None else residual.shape, keep_sum=keep_sum,
                           add=add)


def _kernel_runs(x, residual, weight, keep_sum, impl=None) -> bool:
    """Whether the kernel runs for these operands: the impl the call was handed (its lowering binds the choice
    the rewrite recorded for the target, ``LOWERINGS``), else the selection's (``_operands_choice``).

    Handed ``triton``, the call checks only what the kernel needs of the actual operands (dtypes, row length,
    residual dtype and broadcast: ``select_rms_norm``'s checks less the device, which is the decision), so
    the same operands take the same path as when the selection was asked here."""
    if impl is None:
        return _operands_choice(x, residual, weight, keep_sum).fused
    if impl != "triton" or _unfit(x, residual, weight):
        return False
    why = _refusal_for_dtype(x.dtype, "input") or _refusal_for_dtype(None if weight is None else weight.dtype,
                                                                      "weight")
    return why is None and _shape_refusal(x.shape[-1], x.dtype, None if residual is None else residual.dtype,
                                          x.shape, None if residual is None else residual.shape) is None


def _constexprs(residual, weight, keep_sum, block, rows, interpret, m: int, n: int, hints=None) -> dict:
    """The kernel's constexpr arguments for these operands (``m`` rows of ``n``; ``hints`` None for ``HINTS``)."""
    return dict(HAS_R=residual is not None, HAS_W=weight is not None,
                WRITE_SUM=keep_sum and residual is not None, BLOCK=block, ROWS=rows,
                BF16_RTNE_BY_HAND=interpret, LIBRARY_REDUCE=library_reductions_usable(),
                EVEN=n == block and m % rows == 0, HINTS=HINTS if hints is None else int(hints))


def _out_dtype(x, weight) -> torch.dtype:
    """The normalised output's dtype: ``weight * h.to(x.dtype)`` promotes, as in LlamaRMSNorm."""
    return x.dtype if weight is None else torch.promote_types(weight.dtype, x.dtype)


def _plan_launch(x, residual, weight, keep_sum, rows_per_prog, num_warps, impl=None,
                 hints=None) -> Launch:
    """Decide, for contiguous operands, whether the kernel runs (``_kernel_runs``), and prepare its launch."""
    if not _kernel_runs(x, residual, weight, keep_sum, impl):
        return Launch()
    n = x.shape[-1]
    interpret = interpreting()
    m = x.numel() // n                                                      # rows of N, row stride N
    r_rows = m if residual is None else residual.numel() // n               # < m when it broadcasts
    block, rows, warps, tuned_hints = launch_setting(n, x.element_size(), residual is not None, weight is not None,
                                                     keep_sum)
    rows = rows_per_prog or rows
    return Launch(_build_kernel(interpret), (cdiv(m, rows),), (n, n, n, n, m, n, r_rows),
                  _constexprs(residual, weight, keep_sum, block, rows, interpret, m, n,
                              tuned_hints if hints is None else hints),
                  num_warps or warps, _out_dtype(x, weight))


def _reference(x, residual, weight, eps, keep_sum):
    """The unfused computation, in the shape ``_run`` returns."""
    if residual is None:
        return None, rms_norm_reference(x, weight, eps)
    return add_rms_norm_reference(x, residual, weight, eps, keep_sum)


def _rows(t: torch.Tensor, n: int) -> torch.Tensor:
    """``t`` as ``(rows, n)`` with a contiguous last dim (a view where ``reshape`` can make one)."""
    t2 = t.reshape(-1, n)                                                   # (rows, N)
    return t2 if t2.stride(-1) == 1 or t2.shape[0] == 0 else t2.contiguous()


def _run(x, residual, weight, eps, keep_sum, rows_per_prog, num_warps, impl=None, hints=None):
    """Shared body of ``add_rms_norm`` and ``rms_norm`` (``residual`` None: no add, no sum; ``impl``: the choice
    the call was handed, None to ask the selection)."""
    if rows_per_prog is not None and (rows_per_prog < 1 or rows_per_prog & (rows_per_prog - 1)):
        raise ValueError(f"rows_per_prog must be a power of two, got {rows_per_prog}")
    if needs_autograd(x, residual, weight):
        return _reference(x, residual, weight, eps, keep_sum)                 # forward-only kernel
    if residual is not None and not leading_broadcast(residual.shape, x.shape) \
            and leading_broadcast(x.shape, residual.shape):
        x, residual = residual, x                                           # x + r == r + x, bitwise
    if impl is not None and impl != "triton":
        return _reference(x, residual, weight, eps, keep_sum)                 # handed the eager ops
    if hints not in (None, 0, 1, 2):
        raise ValueError(f"hints must be 0, 1 or 2, got {hints}")
    key = _signature(x, residual, weight, eps, keep_sum, rows_per_prog, num_warps, impl, hints)
    if key is None:
        return _run_general(x, residual, weight, eps, keep_sum, rows_per_prog, num_warps, impl, hints)
    plan = planned(_LAUNCHES, key, _plan_launch, x, residual, weight, keep_sum, rows_per_prog, num_warps, impl,
                   hints)
    if plan.kernel is None:
        return _reference(x, residual, weight, eps, keep_sum)
    write_sum = plan.constexprs["WRITE_SUM"]
    y = _new_output_like(x, plan.out_dtype)                                 # (..., N)
    s = _new_output_like(x, x.dtype) if write_sum else y                    # S is never stored to otherwise
    launch(plan.kernel, plan.grid,
           (x, x if residual is None else residual, x if weight is None else weight, s, y, *plan.ints, eps),
           plan.constexprs, key=plan, num_warps=plan.num_warps)
    return (s if write_sum else None), y


def _run_general(x, residual, weight, eps, keep_sum, rows_per_prog, num_warps, impl=None, hints=None):
    """Any layout: rows through ``reshape`` (a copy only where no row view exists), planned on every call."""
    if not _kernel_runs(x, residual, weight, keep_sum, impl):
        return _reference(x, residual, weight, eps, keep_sum)
    n = x.shape[-1]
    interpret = interpreting()
    x2 = _rows(x, n)                                                        # (M, N)
    r2 = x2 if residual is None else _rows(residual, n)                     # (M, N) or (R_ROWS, N)
    w = None if weight is None else weight.contiguous()                     # (N,)
    m = x2.shape[0]
    block, rows, warps, tuned_hints = launch_setting(n, x.element_size(), residual is not None, weight is not None,
                                                     keep_sum)
    rows = rows_per_prog or rows
    constexprs = _constexprs(residual, weight, keep_sum, block, rows, interpret, m, n,
                             tuned_hints if hints is None else hints)
    y = _new_output((m, n), _out_dtype(x, weight), x.device)                # (M, N)
    s = _new_output((m, n), x.dtype, x.device) if constexprs["WRITE_SUM"] else y
    launch(_build_kernel(interpret), (cdiv(m, rows),),
           (x2, r2, x2 if w is None else w, s, y,
            x2.stride(0), r2.stride(0), s.stride(0), y.stride(0), m, n, r2.shape[0], eps),
           constexprs, num_warps=num_warps or warps)
    return (s.view(x.shape) if constexprs["WRITE_SUM"] else None), y.view(x.shape)


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor | None, eps: float = 1e-6,
                 keep_sum: bool = True, *, rows_per_prog: int | None = None, num_warps: int | None = None,
                 impl: str | None = None, hints: int | None = None) -> tuple[torch.Tensor | None, torch.Tensor]:
    """Return ``(x + residual, LlamaRMSNorm(x + residual))`` from one kernel (one read of each input).

    ``x``, ``residual``: ``(..., N)``, one dtype (fp32/fp16/bf16); either may broadcast to the other
    over leading dims. ``weight``: ``(N,)`` or None. The sum has the broadcast shape and the input
    dtype; the normalised output that shape and ``promote(weight, x)``. With ``keep_sum=False`` the
    sum is neither allocated nor written and the first element is None. Falls back to
    ``add_rms_norm_reference`` where ``select_rms_norm`` refuses. ``rows_per_prog`` (a power of
    two) and ``num_warps`` override the launch heuristics (for tuning), ``hints`` the loads' cache
    hints (None: ``launch_setting``'s). ``impl`` is the ``Choice.impl`` decided for this call's target (a lowered
    fused call is handed it): given, the selection is not asked ("reference" runs the eager ops, "triton" the
    kernel where the operands fit it).

    Contiguous operands take a fast path planned once per call signature; others are planned on
    every call and read through row views (a copy only where no row view exists).
    """
    return _run(x, residual, weight, eps, keep_sum, rows_per_prog, num_warps, impl, hints)


def rms_norm(x: torch.Tensor, weight: torch.Tensor | None, eps: float = 1e-6, *,
             rows_per_prog: int | None = None, num_warps: int | None = None, impl: str | None = None,
             hints: int | None = None) -> torch.Tensor:
    """``LlamaRMSNorm(x)`` (no residual add) from the same kernel; ``x``: ``(..., N)``, returns ``(..., N)``
    (``impl``, ``hints``: as ``add_rms_norm``'s)."""
    return _run(x, None, weight, eps, False, rows_per_prog, num_warps, impl, hints)[1]


# ====================================================================== fused call targets

# Each takes, last, the impl its lowering hands it (``LOWERINGS``); None (a graph run as it is fused): the
# selection decides, once per call signature. The γ fold's unit forms are these calls with ``weight`` None.

def fused_add_rms_norm(x, residual, weight, eps, impl=None):
    """``(x + residual, RMSNorm(x + residual))`` over the last dim, from one kernel where possible."""
    return add_rms_norm(x, residual, weight, eps, impl=impl)


def fused_add_rms_norm_normed(x, residual, weight, eps, impl=None):
    """``RMSNorm(x + residual)`` from one kernel where possible; the sum (read by nothing else) is not written."""
    return add_rms_norm(x, residual, weight, eps, keep_sum=False, impl=impl)[1]


def fused_rms_norm(x, weight, eps, impl=None):
    """``RMSNorm(x)`` over the last dim, from one kernel where possible."""
    return rms_norm(x, weight, eps, impl=impl)


#: Targets a lean CUDA graph binds per node (``triton_support.BoundCall``): Triton launches only.
BOUND_CALLS = (fused_add_rms_norm, fused_add_rms_norm_normed, fused_rms_norm)


def _lower(node: torch.fx.Node, device: torch.device, dtype: torch.dtype, arity: int, add: bool,
           keep_sum: bool) -> bool:
    """Hand the fused call the impl decided for this device and dtype: the rewrite's (``edit.planned``), else (a
    call fused for another target) the selection's, asked here once for the row length the graph records."""
    choice = edit.planned(node, device, dtype)
    if choice is None:
        shape = aten.static_shape(node.args[0])                             # x: floating, in ``dtype`` now
        choice = select_rms_norm(device, int(shape[-1]) if shape else None, dtype, keep_sum=keep_sum, add=add)
    return edit.bind_choice(node, arity, choice.impl)


#: fused call target -> lowering(gm, node, device, dtype) -> bool (explorer.runtime.lean)
LOWERINGS = {
    fused_add_rms_norm: lambda gm, node, device, dtype: _lower(node, device, dtype, 4, True, True),
    fused_add_rms_norm_normed: lambda gm, node, device, dtype: _lower(node, device, dtype, 4, True, False),
    fused_rms_norm: lambda gm, node, device, dtype: _lower(node, device, dtype, 3, False, False),
}


# ====================================================================== matching

_CASTS = frozenset({"to", "copy"})


def _succ(g: nx.DiGraph, n: str) -> list[str]:
    return sorted(g.successors(n), key=lambda s: g.nodes[s]["order"])


def _is_cast(g: nx.DiGraph, n: str) -> bool:
    """A dtype conversion (``to``/``_to_copy`` with a dtype)."""
    return g.nodes[n]["kind"] in _CASTS and "to_dtype" in g.nodes[n]


def _same_dtype_cast(g: nx.DiGraph, cast: str, src: str) -> bool:
    """A cast to the dtype its input already has: an identity (no conversion, no kernel)."""
    return g.nodes[cast].get("dtypes") == g.nodes[src].get("dtypes")


def _only_successor(g: nx.DiGraph, n: str, kinds: set[str], what: str, refusals: list[str]) -> str:
    """The successor of ``n`` of one of ``kinds`` (structural mismatch if none); records a refusal
    when ``n`` also has other consumers."""
    succ = _succ(g, n)
    fits = [s for s in succ if g.nodes[s]["kind"] in kinds]
    if len(fits) != 1:
        raise NoMatch(None, [n])
    if len(succ) > 1:
        refusals.append(BASE_WORDS("consumers", op=what, n=len(succ)))
    return fits[0]


def _norm_tail(g: nx.DiGraph, h: str, refusals: list[str]) -> list[tuple[str, str, bool]]:
    """The RMSNorm computed from ``h``: ``pow(h, 2) ─► mean(-1) ─► + eps ─► rsqrt ─► h * · [─► to]
    [─► mul(weight)]``, as ``[(node, role, True), ...]``; raises ``NoMatch(None)`` where the structure
    differs and appends readable refusals (extra consumers, a mean over other dims) to ``refusals``.
    ``rsqrt`` may also be ``reciprocal(sqrt(·))``, as ONNX exporters write it."""
    pows = [s for s in _succ(g, h) if g.nodes[s]["kind"] == "pow" and g.nodes[s].get("exponent") == 2.0]
    if len(pows) != 1:
        raise NoMatch(None, [h])
    pow_ = pows[0]
    mean = _only_successor(g, pow_, {"reduce"}, "pow(2)", refusals)
    attrs = g.nodes[mean]
    rank = len(g.nodes[pow_]["shapes"][0]) if g.nodes[pow_]["shapes"] else 0
    if not attrs["target"].startswith("aten.mean") or not attrs.get("keepdim"):
        raise NoMatch(None, [pow_, mean])
    if attrs.get("reduce_dims") != [rank - 1]:
        refusals.append(WORDS("refuse.mean_dims"))
    add_eps = _only_successor(g, mean, {"add"}, "mean", refusals)
    if "scalar" not in g.nodes[add_eps]:
        raise NoMatch(None, [pow_, mean, add_eps])
    root = _only_successor(g, add_eps, {"rsqrt", "sqrt"}, "+ eps", refusals)
    out = [(pow_, "pow", True), (mean, "mean", True), (add_eps, "add_eps", True)]
    if g.nodes[root]["kind"] == "sqrt":
        out.append((root, "sqrt", True))
        root = _only_successor(g, root, {"reciprocal"}, "sqrt", refusals)
    mul = _only_successor(g, root, {"mul"}, "rsqrt", refusals)
    if set(g.predecessors(mul)) != {h, root}:
        raise NoMatch(None, [n for n, _, _ in out] + [root, mul])
    out += [(root, "rsqrt", True), (mul, "normalize", True)]
    last = mul
    succ = _succ(g, last)
    if len(succ) == 1 and _is_cast(g, succ[0]):
        last = succ[0]
        out.append((last, "cast_out", True))
    succ = _succ(g, last)
    if (len(succ) == 1 and g.nodes[succ[0]]["kind"] == "mul" and g.nodes[succ[0]].get("const_operand")
            and list(g.predecessors(succ[0])) == [last]):
        out.append((succ[0], "weight", True))
    return out


def _finish(pattern: Pattern, matched: list[tuple[str, str, bool]], refusals: list[str],
            claimed: dict[str, str]) -> list[tuple[str, str, bool]]:
    """Raise the first refusal (or a claimed node) as a near miss; else return the match."""
    nodes = [n for n, _, _ in matched]
    taken = [n for n in nodes if n in claimed]
    if taken:
        refusals.insert(0, BASE_WORDS("already_in_chain", op=taken[0], chain=claimed[taken[0]]))
    if refusals:
        raise NoMatch(BASE_WORDS("own_matcher", pattern=pattern.label, reason=refusals[0]), nodes)
    return matched


def match_add_rms_norm(g: nx.DiGraph, pattern: Pattern, anchor: str, claimed: dict[str, str]) -> list:
    """``add ─► [to(fp32)] ─► RMSNorm``: the residual add whose sum the norm reads (its matcher).

    The sum may leave the chain (the next residual reads it): from the add itself, or, in a graph
    captured in fp32 where ``to(float32)`` is an identity, from that cast; the fused kernel writes
    it as its second output. A real conversion whose fp32 copy is read elsewhere is refused.
    """
    attrs = g.nodes[anchor]
    if attrs.get("scalar_operand") or g.in_degree(anchor) != 2:
        raise NoMatch(None, [anchor])
    refusals: list[str] = []
    epilogue = epilogue_claim(g, anchor, claimed)   # the add measured better in the projection's GEMM epilogue
    matched = [(anchor, "add", True)]
    succ = _succ(g, anchor)
    casts = [s for s in succ if _is_cast(g, s)]
    if any(g.nodes[s]["kind"] == "pow" for s in succ):
        h = anchor
    elif len(casts) == 1:
        h = casts[0]
        matched.append((h, "cast_in", True))
    else:
        raise NoMatch(None, [anchor])
    tail = _norm_tail(g, h, refusals)
    inside = {n for n, r, _ in tail if r in ("pow", "normalize")}      # what reads h inside the norm
    if h != anchor:
        outside_cast = [s for s in _succ(g, h) if s not in inside]
        outside_add = [s for s in succ if s != h]
        if outside_cast and not _same_dtype_cast(g, h, anchor):
            refusals.append(WORDS("refuse.fp32_also"))
        elif outside_cast and outside_add:
            refusals.append(WORDS("refuse.both"))
    nodes = [n for n, _, _ in matched + tail]
    if epilogue is not None and not refusals and not any(n in claimed for n in nodes):
        raise NoMatch(epilogue, nodes)    # the norm matched: the add is given up, and the near miss says why
    return _finish(pattern, matched + tail, refusals, claimed)


def match_rms_norm(g: nx.DiGraph, pattern: Pattern, anchor: str, claimed: dict[str, str]) -> list:
    """``[to(fp32)] ─► pow(2) ─► mean ─► + eps ─► rsqrt ─► mul ─► [to] ─► [mul(weight)]`` (its matcher).

    The input cast belongs to the chain when only the norm reads it; an identity cast that others
    read too (a graph captured in fp32) stays outside, and the norm reads its output.
    """
    preds = list(g.predecessors(anchor))
    if len(preds) != 1:
        raise NoMatch(None, [anchor])
    h = preds[0]
    refusals: list[str] = []
    tail = _norm_tail(g, h, refusals)
    if tail[0][0] != anchor:
        raise NoMatch(None, [anchor])
    head = []
    if _is_cast(g, h) and set(g.successors(h)) == {n for n, r, _ in tail if r in ("pow", "normalize")}:
        head = [(h, "cast_in", True)]
    return _finish(pattern, head + tail, refusals, claimed)


# ====================================================================== rewrite

def _norm_args(ctx: RewriteContext, chain, x: torch.fx.Node) -> tuple:
    """``(weight, eps, hidden)`` of the chain's norm, checking that it rounds where the kernel does.

    The kernel rounds the normalised value to ``x``'s dtype (LlamaRMSNorm's ``.to(input_dtype)``);
    the chain must cast back to that dtype, or never leave it. The weight is the operand of the
    step with role ``weight`` (``gamma`` in the fold's chains).
    """
    xs = aten.node_val(x)
    if not isinstance(xs, torch.Tensor):
        raise UseGeneric(BASE_WORDS("no_shape", node=x.name))
    normalize, cast_out = ctx.node(chain, "normalize"), ctx.node(chain, "cast_out")
    rounded = cast_out if cast_out is not None else normalize
    if edit.dtype_of(rounded) != xs.dtype:
        raise UseGeneric(WORDS("generic.rounded", dtype=edit.dtype_of(rounded), input=xs.dtype))
    eps = ctx.scalar(aten.binary_args(ctx.node(chain, "add_eps")).other)
    if eps is None:
        raise UseGeneric(WORDS("generic.eps"))
    weight_node = ctx.node(chain, "weight") or ctx.node(chain, "gamma")
    weight = None
    if weight_node is not None:
        weight = edit.other_operand(weight_node, {rounded})
        w = aten.node_val(weight)
        if not isinstance(w, torch.Tensor) or tuple(w.shape) != (int(xs.shape[-1]),):
            raise UseGeneric(WORDS("generic.weight", n=int(xs.shape[-1])))
    last = ctx.by_name[chain.roles[-1][0]]
    out_dtype = edit.dtype_of(last)
    w_dtype = aten.node_val(weight).dtype if weight is not None else xs.dtype
    if torch.promote_types(w_dtype, xs.dtype) != out_dtype:
        raise UseGeneric(WORDS("generic.result", dtype=out_dtype))
    return weight, eps, int(xs.shape[-1])


def plan_norm(ctx: RewriteContext, chain, *, unit: bool = False, targets: dict | None = None
              ) -> tuple[edit.Edit, torch.fx.Node | None]:
    """The edit of an (add +) RMSNorm chain as one kernel call, and the weight operand it read (or None).

    ``unit``: the call takes no weight (the γ fold: the readers' weights carry it), so it writes
    ``x·rsqrt(mean(x²)+eps)`` only and loads no weight. ``targets`` replaces the call targets
    (keys ``"add"``, ``"add_normed"``, ``"rms"``: the fold's eager variant). A chain with the role
    ``add`` is the Add+RMSNorm; the sum is written where something else reads it.
    """
    targets = targets or {}
    add = ctx.node(chain, "add")
    if add is None:
        cast_in = ctx.node(chain, "cast_in")
        x = cast_in.args[0] if cast_in is not None else ctx.node(chain, "pow").args[0]
        if not isinstance(x, torch.fx.Node):
            raise UseGeneric(WORDS("generic.input"))
        weight, eps, hidden = _norm_args(ctx, chain, x)
        choice = select_rms_norm(ctx.device, hidden, ctx.run_dtype(x), add=False)
        return edit.whole_chain_edit(ctx, chain, targets.get("rms", fused_rms_norm),
                                     (x, None if unit else weight, eps), choice), weight
    x, residual, out = residual_add_operands(add)
    weight, eps, hidden = _norm_args(ctx, chain, add)
    if len(chain.extra_outputs) > 1:
        raise Refuse(WORDS("refuse.leaves"))
    sum_node = ctx.by_name[chain.extra_outputs[0]] if chain.extra_outputs else None
    cast_in = ctx.node(chain, "cast_in")
    if sum_node is not None and sum_node is cast_in and edit.dtype_of(cast_in) != out.dtype:
        raise Refuse(WORDS("refuse.fp32"))
    args = (x, residual, None if unit else weight, eps)
    choice = select_rms_norm(ctx.device, hidden, ctx.run_dtype(out.dtype), keep_sum=sum_node is not None)
    if sum_node is None:  # nothing else reads the sum (the last norm): it is never written
        return edit.whole_chain_edit(ctx, chain, targets.get("add_normed", fused_add_rms_norm_normed), args,
                                     choice), weight
    result = ctx.by_name[chain.roles[-1][0]]
    return edit.whole_chain_edit(ctx, chain, targets.get("add", fused_add_rms_norm), args, choice,
                                 outputs=[sum_node, result], tuple_result=True), weight  # returns (sum, normed)


def rewrite_add_rms_norm(ctx: RewriteContext, chain, kernel: str) -> edit.Edit:
    """add → RMSNorm as one kernel call, writing the sum too where something else reads it."""
    return plan_norm(ctx, chain)[0]


def rewrite_rms_norm(ctx: RewriteContext, chain, kernel: str) -> edit.Edit:
    """RMSNorm (no add) as one kernel call."""
    return plan_norm(ctx, chain)[0]


# ====================================================================== patterns

_TEACHING = WORDS("teaching")
_CAVEATS = (PRECISION_CAVEAT, WORDS("caveats"))
_NORM_STEPS = (Step(frozenset({"pow"}), "pow"), Step(frozenset({"reduce"}), "mean"),
               Step(frozenset({"add"}), "add_eps"), Step(frozenset({"sqrt"}), "sqrt", optional=True),
               Step(frozenset({"rsqrt", "reciprocal"}), "rsqrt"),
               Step(frozenset({"mul"}), "normalize"), Step(_CASTS, "cast_out", optional=True),
               Step(frozenset({"mul"}), "weight", optional=True))

#: The steps and cast kinds of the norm, for the families that match through this one's matchers (the γ fold).
NORM_STEPS, CASTS = _NORM_STEPS, _CASTS

#: Which families this one must claim nodes before or after (explorer.fusions.order).
RUNS_BEFORE = ("norm",)

PATTERNS = (
    Pattern(
        name="add_rms_norm", label=WORDS("add_rms_norm.label"),
        steps=(Step(frozenset({"add"}), "add", emits=True), Step(_CASTS, "cast_in", optional=True, emits=True),
               *_NORM_STEPS),
        match=match_add_rms_norm, color="#c49c94", rewrite=rewrite_add_rms_norm,
        implementation=WORDS("add_rms_norm.implementation"),
        explanation=WORDS("add_rms_norm.explanation"),
        caveats=_CAVEATS,
        formula=WORDS("add_rms_norm.formula"),
    ),
    Pattern(
        name="rms_norm", label=WORDS("rms_norm.label"),
        steps=_NORM_STEPS,  # anchored at pow; the matcher takes the input cast in too where only the norm reads it
        match=match_rms_norm, color="#dbdb8d", rewrite=rewrite_rms_norm,
        implementation=WORDS("rms_norm.implementation"),
        explanation=_TEACHING,
        caveats=_CAVEATS,
        formula=WORDS("rms_norm.formula"),
    ),
)
