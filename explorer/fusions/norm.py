"""The normalisation family: a residual add and the LayerNorm after it, in one Triton kernel.

::

    unfused (2 kernels)                         fused (1 kernel)
    x ───┐                                      x ───┐
         add ─► sum ─► HBM ─► layer_norm ─► y        add_layernorm ─► sum  (kept: next residual)
    r ───┘        │                                r ───┘           └──► y = LN(sum)·γ + β
                  └─► (next residual)

A pre-norm transformer block's residual stream needs the sum afterwards (it is
the next block's residual), so the fused kernel writes it as a second output
instead of refusing the fusion. What fusion saves there is the re-read of
``sum`` by the LayerNorm and one launch: the unfused pair moves 2R+1W (add) +
1R+1W (norm) = 5 row-sized transfers, the fused kernel 2R+2W = 4. Where nothing
else reads the sum (post-norm blocks such as BERT's), ``keep_sum=False`` does
not write it at all: 2R+1W = 3 transfers, and one allocation fewer.

Kernel design (bandwidth-bound, one pass): one program per row by default
(``rows_per_prog`` packs several); the whole row (``BLOCK = next_pow2(N)``
lanes, masked beyond N) is loaded once into registers, summed in fp32, rounded
to the input dtype and stored (the sum is rounded *before* normalising, exactly
as the unfused graph normalises the stored sum), then mean and variance are
reduced in fp32 (masked lanes contribute 0 to both), normalised, scaled,
shifted and stored with a cast. ``num_warps`` grows with BLOCK so that each
thread holds a few 16-byte vectors.

Supported: fp32, fp16, bf16; any number of rows; last dim up to 16384; weight
and bias optional. Anything else, and CPU tensors without ``TRITON_INTERPRET=1``,
takes the reference path; ``select_add_layer_norm`` is the one decision. It is made
once per chain, at the rewrite, for the run's target, and recorded on the fused call;
the lowering of a lean graph for that target hands the recorded impl to the call
(``LOWERINGS``: ``edit.bind_choice``), which then follows it without asking again.
A fused graph run as it is (not lowered) asks once per call signature.
"""


from __future__ import annotations

import functools
import operator

import torch
import torch.fx

from explorer.fusions import edit
from explorer.fusions.base import WORDS as BASE_WORDS
from explorer.fusions.base import PRECISION_CAVEAT, Choice, Pattern, Step, selection
from explorer.fusions.edit import Refuse, RewriteContext, UseGeneric, leading_broadcast, residual_add_operands
from explorer.fusions.triton_support import no_triton, where
from explorer.fusions.triton_support import (Launch, cdiv, contiguous_key, import_triton, interpreting,
                                             jit_helpers, launch, library_reductions_usable, next_power_of_2,
                                             planned, row_warps, triton_runs_on)
from explorer.graph import aten
from explorer.words import Words

#: What this family says to a person, in English and 中文 (rendered by explorer.ui.i18n by id).
WORDS = Words("norm", {
    "title": ("Add + LayerNorm", "残差相加 + 层归一化"),
    "add_layer_norm.label": ("Add+LayerNorm", "Add+LayerNorm（残差相加+层归一化）"),
    "add_layer_norm.implementation": (("one Triton kernel that writes the normalized output, and the sum too "
                                       "where something else reads it (a pre-norm residual stream)"),
                                      "一个 Triton 内核写出归一化结果；别处还要读和时（pre-norm 的残差流），也写出和"),
    "add_layer_norm.explanation": (("The residual add and the LayerNorm each read and write the whole activation. "
                                    "One kernel reads both operands once, keeps the row in registers for the mean "
                                    "and variance, and writes the sum (the residual stream needs it) and the "
                                    "normalized row."),
                                   ("残差相加和 LayerNorm "
                                    "各自都要读写整个激活张量。一个内核把两个操作数只读一次，把这一行留在寄存器里求均值和方差，写出和（残差流需要它）与归一化后的行。")),
    "add_layer_norm.caveat": ("Statistics are accumulated in fp32 even for fp16/bf16 inputs.",
                              "即使输入是 fp16/bf16，统计量也用 fp32 累加。"),
    "label.two_outputs": ("triton add+layer_norm (1 kernel, 2 outputs)", "triton add+layer_norm（1 个内核，2 个输出）"),
    "label.no_sum": ("triton add+layer_norm (1 kernel; the sum is not written: nothing else reads it)",
                     "triton add+layer_norm（1 个内核；不写出和：没有别的算子读它）"),
    "label.reference": ("add + layer_norm (2 kernels; reference composition: {why})",
                        "add + layer_norm（2 个内核；参考实现的组合：{why}）"),
    "why.rows": ("rows of {hidden} are outside 1..{max}", "行长 {hidden} 超出 1..{max}"),
    "generic.not_add_ln": ("{add} → {ln} is not add → layer_norm", "{add} → {ln} 不是 add → layer_norm"),
    "generic.view": ("a view between the add and the LayerNorm", "相加和 LayerNorm 之间有一个视图"),
    "group_norm_act.label": ("GroupNorm+act", "GroupNorm+激活"),
    "group_norm_act.implementation": (("group_norm, then the activation in place on its output (no new buffer); no "
                                       "fused kernel yet: a candidate for one Triton program per (sample, group)"),
                                      "先 group_norm，再在其输出上原地做激活（不分配新缓冲区）；还没有融合内核：候选方案是每个（样本，组）一个 Triton 程序"),
    "group_norm_act.explanation": (("GroupNorm normalises each group of channels of each sample (diffusion UNets, "
                                    "detection heads) and is nearly always followed by SiLU or ReLU. Applying the "
                                    "activation in place saves the second output buffer; a fused kernel would also "
                                    "save its write and re-read."),
                                   ("GroupNorm 对每个样本的每组通道做归一化（扩散模型的 UNet、检测头），后面几乎总跟着 SiLU 或 ReLU。原地做激活省掉第二个输出缓冲区；"
                                    "融合内核还能省掉它的一次写出和读回。")),
    "label.group_norm": ("group_norm + {act} in place (2 kernels, one buffer)", "group_norm + 原地 {act}（2 个内核，一个缓冲区）"),
    "generic.group_act": ("activation {act} has no in-place form here", "激活函数 {act} 在这里没有原地形式"),
    "generic.view_last": (("a {op} between the add and the LayerNorm changes the normalised dim ({before} to "
                           "{after})"),
                          "相加和 LayerNorm 之间的 {op} 改变了被归一化的维度（{before} 变为 {after}）"),
    "refuse.last_dim": ("LayerNorm normalizes over more than the last dimension", "LayerNorm 归一化的不只是最后一维"),
})


MAX_HIDDEN = 16384
SUPPORTED_DTYPES = (torch.float32, torch.float16, torch.bfloat16)

#: Agreement with the unfused computation in float64, ``|out - ref| <= atol + rtol·|ref|``.
#: With u the unit roundoff (fp32 6e-8, fp16 4.9e-4, bf16 3.9e-3): the sum is rounded once
#: (0.5u) before normalising, so the normalised value inherits ~u·|s|/σ (|s| up to ~4σ)
#: plus its own output rounding u·|y|; fp32 reductions over 16k values add ~1e-6.
TOLERANCES = {
    torch.float32: dict(rtol=1e-5, atol=1e-5),
    torch.float16: dict(rtol=1e-3, atol=2e-3),      # 2u, 4u
    torch.bfloat16: dict(rtol=8e-3, atol=1.6e-2),   # 2u, 4u
}


def add_layernorm_reference(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor | None,
                            bias: torch.Tensor | None, eps: float = 1e-5) -> tuple[torch.Tensor, torch.Tensor]:
    """Unfused: ``sum = x + residual`` then ``layer_norm(sum)`` over the last dim; returns ``(sum, normed)``."""
    s = x + residual                                                          # (..., N)
    return s, torch.nn.functional.layer_norm(s, (s.shape[-1],), weight, bias, eps)


@selection
def select_add_layer_norm(device: torch.device | str, hidden: int | None = None,
                          dtype: torch.dtype | None = None, keep_sum: bool = True) -> Choice:
    """The one decision of how add + LayerNorm runs: ``triton`` (one kernel) or ``reference`` (two).

    The runtime call (which also checks its operands' shapes and devices), the
    label and the lowering all ask this.
    """
    device = torch.device(device)
    if not triton_runs_on(device):
        why = no_triton(device)
    elif hidden is not None and not 1 <= hidden <= MAX_HIDDEN:
        why = WORDS("why.rows", hidden=hidden, max=MAX_HIDDEN)
    elif dtype is not None and dtype not in SUPPORTED_DTYPES:
        why = BASE_WORDS("dtype_one_of", dtype=dtype)
    else:
        return Choice("triton", where(WORDS("label.two_outputs" if keep_sum else "label.no_sum"), device), True)
    return Choice("reference", WORDS("label.reference", why=why), False)


def launch_config(hidden: int) -> tuple[int, int]:
    """``(BLOCK, num_warps)`` for a row of ``hidden`` elements (BLOCK = next power of two)."""
    block = next_power_of_2(hidden)
    return block, row_warps(block)


#: Rows per program. Packing several rows per program (less than 16 KB of each input in
#: flight per program for 2-byte dtypes) measured within one run's spread of one row on an H200
#: (``benchmarks/results/bench_kernels_add_layernorm_rows_h200.json``), so one row stays the
#: default and ``rows_per_prog`` remains a tuning knob.
DEFAULT_ROWS_PER_PROGRAM = 1

#: Whether programs whose rows fill BLOCK exactly (and whose ROWS divide M) take the kernel's unmasked ``EVEN``
#: path. Chosen from the sm_90 PTX, not a measurement: at one row a program it is the masked kernel less a compare
#: and a predicate (223 against 227 instructions at 1024 bf16; 768 is masked either way); False restores the masked
#: kernel everywhere. ``benchmarks/bench_membw.py`` times GPT-2-medium's 1024-wide rows, where it applies.
EVEN_PATH = True

#: Measured launch settings, ``(BLOCK, element size, sum written) -> (ROWS, num_warps)``, where the sweep of
#: ``benchmarks/bench_membw.py --sweep`` found one better than ``launch_rows``' rule by more than its spread.
TUNED: dict[tuple[int, int, bool], tuple[int, int]] = {}


def launch_rows(hidden: int, element_size: int = 2, keep_sum: bool = True) -> tuple[int, int]:
    """``(ROWS, num_warps)`` for rows of ``hidden`` elements of ``element_size`` bytes: ``TUNED`` where measured,
    else ``DEFAULT_ROWS_PER_PROGRAM`` rows and ``launch_config``'s warps."""
    block, warps = launch_config(hidden)
    tuned = TUNED.get((block, element_size, keep_sum))
    return tuned if tuned is not None else (DEFAULT_ROWS_PER_PROGRAM, warps)


def _new_output(shape, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Allocate an output the kernel fully overwrites (tests replace this to poison it)."""
    return torch.empty(shape, dtype=dtype, device=device)


def _new_output_like(t: torch.Tensor) -> torch.Tensor:
    """``_new_output`` shaped like the contiguous ``t``: ``empty_like`` parses no arguments, the
    cheaper call on the fast path (tests replace this too)."""
    return torch.empty_like(t)


@functools.lru_cache(maxsize=2)
def _build_kernel(interpret: bool):
    """Define the Triton kernel (imports Triton); cached per interpreter mode.

    ``triton.jit`` reads TRITON_INTERPRET when it decorates, hence the lazy definition.
    Names the kernel uses (``tl``, ``_add``: ``triton_support.jit_helpers``) are module
    globals, not closure variables, which every Triton version resolves. ``LIBRARY_REDUCE``
    picks ``tl.sum`` (always when compiled) or ``tl.reduce`` with that combine function:
    Triton decorates its library functions when first imported, so in a process that
    imported Triton before setting TRITON_INTERPRET only the latter can be interpreted.
    """
    global tl, _add
    triton, tl = import_triton()
    _add = jit_helpers(interpret).add

    @triton.jit
    def _add_layernorm_fwd(
        X, R, W, B, S, Y,                     # pointers: inputs x, residual; weight, bias; outputs sum, normed
        stride_x, stride_r, stride_s, stride_y,  # row strides (elements); the last dim is contiguous
        M, N, R_ROWS, eps,                       # R_ROWS: rows of the residual (< M: it repeats, a broadcast)
        HAS_W: tl.constexpr, HAS_B: tl.constexpr, BLOCK: tl.constexpr, BF16_RTNE_BY_HAND: tl.constexpr,
        LIBRARY_REDUCE: tl.constexpr, ROWS: tl.constexpr, WRITE_SUM: tl.constexpr, EVEN: tl.constexpr,
    ):
        """Program i: rows i·ROWS .. i·ROWS+ROWS-1; writes their sum (if WRITE_SUM) and normalised rows.

        ``EVEN``: N == BLOCK and ROWS divides M, so no lane is masked and every access is a plain 16-byte
        vector (as in ``rms_norm``'s kernel; ``EVEN_PATH``). γ and β load as (ROWS, BLOCK) tiles: at ROWS > 1 the
        (1, BLOCK) load they replaced was converted through 8 KB of shared memory with 6 more barriers (sm_90 PTX
        at 4 rows of 1024 in bf16; not yet timed on a GPU)."""
        rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)[:, None]   # (ROWS, 1)
        cols = tl.arange(0, BLOCK)[None, :]                                          # (1, BLOCK)
        in_row = cols < N
        live = (rows < M) & in_row                                                   # (ROWS, BLOCK)
        if EVEN:
            x = tl.load(X + rows * stride_x + cols, eviction_policy="evict_first")
            r = tl.load(R + (rows % R_ROWS) * stride_r + cols, eviction_policy="evict_first")
        else:
            x = tl.load(X + rows * stride_x + cols, mask=live, other=0.0, eviction_policy="evict_first")
            r = tl.load(R + (rows % R_ROWS) * stride_r + cols, mask=live, other=0.0,
                        eviction_policy="evict_first")
        # γ and β are issued now, with the rows, so their (L2) latency overlaps the reductions. They are loaded
        # as (ROWS, BLOCK) tiles in the rows' own register layout (each row's copy an L1 hit): a (1, BLOCK) load
        # takes another layout and a conversion through shared memory when ROWS > 1 (rms_norm's kernel measured
        # that at a third of a short row's time)
        vec = cols + rows * 0                                                        # (ROWS, BLOCK)
        if HAS_W:
            if EVEN:
                w = tl.load(W + vec, eviction_policy="evict_last").to(tl.float32)
            else:
                w = tl.load(W + vec, mask=live, other=0.0, eviction_policy="evict_last").to(tl.float32)
        if HAS_B:
            if EVEN:
                b = tl.load(B + vec, eviction_policy="evict_last").to(tl.float32)
            else:
                b = tl.load(B + vec, mask=live, other=0.0, eviction_policy="evict_last").to(tl.float32)
        s = x.to(tl.float32) + r.to(tl.float32)
        if BF16_RTNE_BY_HAND:  # interpreter only: its fp32 -> bf16 cast truncates; round to nearest even first
            bits = s.to(tl.uint32, bitcast=True)
            s = ((bits + (((bits >> 16) & 1) + 0x7FFF)) >> 16 << 16).to(tl.float32, bitcast=True)
        s = s.to(S.dtype.element_ty, fp_downcast_rounding="rtne")           # rounded like the unfused add
        if WRITE_SUM:
            if EVEN:
                tl.store(S + rows * stride_s + cols, s)
            else:
                tl.store(S + rows * stride_s + cols, s, mask=live)
        s = s.to(tl.float32)                                                # padded lanes are 0 + 0 = 0
        if LIBRARY_REDUCE:
            mean = tl.sum(s, axis=1) / N                                    # (ROWS,)
        else:
            mean = tl.reduce(s, 1, _add) / N
        d = tl.where(in_row, s - mean[:, None], 0.0)                        # padded lanes must not add (0-mean)^2
        if LIBRARY_REDUCE:
            var = tl.sum(d * d, axis=1) / N
        else:
            var = tl.reduce(d * d, 1, _add) / N
        rstd = 1.0 / tl.sqrt(var + eps)
        y = d * rstd[:, None]
        if HAS_W:
            y = y * w
        if HAS_B:
            y = y + b
        if BF16_RTNE_BY_HAND:
            bits = y.to(tl.uint32, bitcast=True)
            y = ((bits + (((bits >> 16) & 1) + 0x7FFF)) >> 16 << 16).to(tl.float32, bitcast=True)
        y = y.to(Y.dtype.element_ty, fp_downcast_rounding="rtne")
        if EVEN:
            tl.store(Y + rows * stride_y + cols, y)
        else:
            tl.store(Y + rows * stride_y + cols, y, mask=live)

    return _add_layernorm_fwd


#: ``Launch`` by call signature (see ``_signature``): the decisions and launch arguments
#: are worked out once per signature (``triton_support.planned``), so that a repeated call
#: costs the host little more than two allocations and the launch itself. Bounded.
_LAUNCHES: dict[tuple, Launch] = {}


def _signature(x, residual, weight, bias, eps, num_warps, rows_per_prog, keep_sum=True,
               impl: str | None = None) -> tuple | None:
    """Hashable call signature for the fast path, or None where only the general path applies.

    Contiguous inputs only. It holds what the kernel is specialised on (dtypes; shapes,
    hence every integer argument; which pointers are 16-byte aligned), the device (and
    on the CPU whether Triton is interpreting), the tuning overrides and the impl the call was handed.
    """
    operands = contiguous_key(x, residual, weight, bias)
    if operands is None:
        return None
    return (operands, float(eps), num_warps, rows_per_prog, keep_sum, x.is_cuda or interpreting(), impl)


def _kernel_applies(x, residual, weight, bias, residual_shape_ok: bool, impl: str | None = None) -> bool:
    """Whether the Triton kernel runs for these operands (else the reference composition): the choice the call
    was handed (``impl``), else the selection's for their device, row length and dtype; and operands it takes."""
    if impl is None:
        impl = select_add_layer_norm(x.device, x.shape[-1] if x.dim() else 0, x.dtype).impl
    return (impl == "triton" and residual_shape_ok
            and residual.dtype == x.dtype and residual.device == x.device and x.numel() > 0
            and all(t is None or t.device == x.device for t in (weight, bias)))


def _plan_launch(x, residual, weight, bias, num_warps, rows_per_prog, keep_sum, impl=None) -> Launch:
    """Decide, for contiguous inputs, whether the kernel runs, and prepare its launch."""
    if not _kernel_applies(x, residual, weight, bias, leading_broadcast(residual.shape, x.shape), impl):
        return Launch()                                                       # kernel None: the reference
    n = x.shape[-1]
    interpret = interpreting()
    rows = x.numel() // n                                                     # rows of N, row stride N
    r_rows = residual.numel() // n                                            # = rows unless it broadcasts
    block = launch_config(n)[0]
    tuned_rows, warps = launch_rows(n, x.element_size(), keep_sum)
    per_program = tuned_rows if rows_per_prog is None else rows_per_prog
    constexprs = dict(HAS_W=weight is not None, HAS_B=bias is not None, BLOCK=block,
                      BF16_RTNE_BY_HAND=interpret and x.dtype == torch.bfloat16,
                      LIBRARY_REDUCE=library_reductions_usable(), ROWS=per_program, WRITE_SUM=keep_sum,
                      EVEN=EVEN_PATH and n == block and rows % per_program == 0)
    return Launch(_build_kernel(interpret), (cdiv(rows, per_program),), (n, n, n, n, rows, n, r_rows),
                  constexprs, num_warps or warps)


def add_layernorm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor | None = None,
                  bias: torch.Tensor | None = None, eps: float = 1e-5,
                  num_warps: int | None = None, rows_per_prog: int | None = None, keep_sum: bool = True,
                  impl: str | None = None) -> tuple[torch.Tensor | None, torch.Tensor]:
    """Return ``(x + residual, layer_norm(x + residual))`` over the last dim, from one kernel.

    ``x`` and ``residual``: shape ``(..., N)`` and one dtype; ``residual`` may also
    broadcast over ``x``'s leading dims (``leading_broadcast``) when both are
    contiguous. ``weight``/``bias``: ``(N,)`` or None. Both outputs have ``x``'s
    shape and dtype. With ``keep_sum=False`` the sum is neither written nor
    allocated and the first element is None (the normalised output is unchanged:
    it is computed from the sum rounded to the dtype either way). Falls back to
    ``add_layernorm_reference`` where ``select_add_layer_norm`` says "reference" or
    the operands do not fit the kernel (other broadcasts, mixed dtypes or devices).
    ``num_warps`` and ``rows_per_prog`` override the launch heuristics (for tuning). ``impl`` is the
    ``Choice.impl`` decided for this call's target (a lowered fused call is handed it): given, the
    selection is not asked ("reference" runs the reference, "triton" the kernel where the operands fit).

    Contiguous inputs take a fast path: the launch is planned once per call signature
    and then reused (a model calls this with the same shapes every forward); anything
    else goes through ``_add_layernorm_general``, planned afresh on every call.
    """
    if impl is not None and impl != "triton":
        s, y = add_layernorm_reference(x, residual, weight, bias, eps)
        return (s if keep_sum else None), y
    key = _signature(x, residual, weight, bias, eps, num_warps, rows_per_prog, keep_sum, impl)
    if key is None:
        return _add_layernorm_general(x, residual, weight, bias, eps, num_warps, rows_per_prog, keep_sum, impl)
    plan = planned(_LAUNCHES, key, _plan_launch, x, residual, weight, bias, num_warps, rows_per_prog, keep_sum,
                   impl)
    if plan.kernel is None:
        s, y = add_layernorm_reference(x, residual, weight, bias, eps)
        return (s if keep_sum else None), y
    y = _new_output_like(x)
    s = _new_output_like(x) if keep_sum else y                      # S is never stored to without keep_sum
    launch(plan.kernel, plan.grid,
           (x, residual, x if weight is None else weight, x if bias is None else bias, s, y, *plan.ints, eps),
           plan.constexprs, key=plan, num_warps=plan.num_warps)
    return (s if keep_sum else None), y


def _add_layernorm_general(x, residual, weight, bias, eps, num_warps, rows_per_prog, keep_sum=True, impl=None):
    """Any layout and device: rows through ``reshape``, each call planned afresh."""
    if not _kernel_applies(x, residual, weight, bias, residual.shape == x.shape, impl):
        s, y = add_layernorm_reference(x, residual, weight, bias, eps)
        return (s if keep_sum else None), y
    n = x.shape[-1]
    x2 = x.reshape(-1, n)                                                     # (rows, N)
    r2 = residual.reshape(-1, n)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    if r2.stride(-1) != 1:
        r2 = r2.contiguous()
    w = weight.contiguous() if weight is not None else None
    b = bias.contiguous() if bias is not None else None
    rows = x2.shape[0]
    y = _new_output((rows, n), x.dtype, x.device)
    s = _new_output((rows, n), x.dtype, x.device) if keep_sum else y
    block = launch_config(n)[0]
    tuned_rows, warps = launch_rows(n, x.element_size(), keep_sum)
    warps = num_warps or warps
    per_program = tuned_rows if rows_per_prog is None else rows_per_prog
    kernel = _build_kernel(interpreting())
    launch(
        kernel, (cdiv(rows, per_program),),
        (x2, r2, w if w is not None else x2, b if b is not None else x2, s, y,
         x2.stride(0), r2.stride(0), s.stride(0), y.stride(0), rows, n, rows, eps),
        dict(HAS_W=w is not None, HAS_B=b is not None, BLOCK=block,
             BF16_RTNE_BY_HAND=interpreting() and x.dtype == torch.bfloat16,
             LIBRARY_REDUCE=library_reductions_usable(), ROWS=per_program, WRITE_SUM=keep_sum,
             EVEN=EVEN_PATH and n == block and rows % per_program == 0),
        num_warps=warps,
    )
    return (s.view(x.shape) if keep_sum else None), y.view(x.shape)


# ====================================================================== fused call targets

# Each takes, last, the impl its lowering hands it (``LOWERINGS``); None (a graph run as it is fused): the
# selection decides, once per call signature.

def fused_add_layer_norm(x, residual, weight, bias, eps, impl=None):
    """``(x + residual, layer_norm(x + residual))`` over the last dim, from one kernel where possible."""
    return add_layernorm(x, residual, weight, bias, eps, impl=impl)


def fused_add_layer_norm_viewed(x, residual, weight, bias, eps, shape, keep_sum=True, impl=None):
    """``(x + residual, layer_norm(x + residual))`` where the LayerNorm reads the sum through a view that keeps its
    rows (OPT's ``(B·T, C) → (B, T, C)``; an eval-mode dropout): the normalised rows are the same, in ``shape``.
    Without ``keep_sum`` (nothing outside the chain reads the sum) only the normalised output is returned."""
    s, y = add_layernorm(x, residual, weight, bias, eps, keep_sum=keep_sum, impl=impl)
    return (s, y.reshape(tuple(shape))) if keep_sum else y.reshape(tuple(shape))


def fused_add_layer_norm_normed(x, residual, weight, bias, eps, impl=None):
    """``layer_norm(x + residual)`` from one kernel where possible; the sum (read by nothing else) is not written."""
    return add_layernorm(x, residual, weight, bias, eps, keep_sum=False, impl=impl)[1]


#: Targets a lean CUDA graph binds per node (``triton_support.BoundCall``: a call that runs anything but its
#: Triton kernel is recorded once and stays generic).
BOUND_CALLS = (fused_add_layer_norm, fused_add_layer_norm_viewed, fused_add_layer_norm_normed)


# ====================================================================== rewrite

def rewrite(ctx: RewriteContext, chain, kernel: str) -> edit.Edit:
    """add → layer_norm as one kernel call, writing the sum too where something else reads it."""
    add, ln_node = ctx.node(chain, "add"), ctx.node(chain, "layer_norm")
    if ln_node is not None and ln_node.args and ln_node.args[0] is add:
        edit.only_identity_views(ctx, chain)
    ln = aten.layer_norm_args(ln_node)
    if ln is None or aten.aten_name(ln_node) != "layer_norm" or aten.aten_name(add) != "add":
        raise UseGeneric(WORDS("generic.not_add_ln", add=aten.aten_name(add), ln=aten.aten_name(ln_node)))
    x, residual, out = residual_add_operands(add)
    if list(ln.normalized_shape) != [out.shape[-1]]:
        raise Refuse(WORDS("refuse.last_dim"))
    args = (x, residual, ln.weight, ln.bias, ln.eps)
    keep_sum = add.name in chain.extra_outputs
    if ln.input is not add:
        # read through views shared with the next residual (outside the chain): the sum is written anyway
        _rows_kept(ctx, chain, ln.input, add, int(out.shape[-1]))
        choice = select_add_layer_norm(ctx.device, int(out.shape[-1]), ctx.run_dtype(out.dtype), keep_sum)
        shape = list(aten.static_shape(ln_node) or out.shape)
        if not keep_sum:
            return edit.whole_chain_edit(ctx, chain, fused_add_layer_norm_viewed, (*args, shape, False), choice)
        return edit.whole_chain_edit(ctx, chain, fused_add_layer_norm_viewed, (*args, shape, True), choice,
                                     outputs=[add, ln_node], tuple_result=True)
    choice = select_add_layer_norm(ctx.device, int(out.shape[-1]), ctx.run_dtype(out.dtype), keep_sum)
    if not keep_sum:  # nothing else reads the sum (post-norm): it is never written
        return edit.whole_chain_edit(ctx, chain, fused_add_layer_norm_normed, args, choice)
    return edit.whole_chain_edit(ctx, chain, fused_add_layer_norm, args, choice, outputs=[add, ln_node],
                                 tuple_result=True)  # the call returns (sum, normed)


_ROW_VIEWS = frozenset({"view", "_unsafe_view", "reshape", "flatten", "unflatten", "unsqueeze", "squeeze"})


def _rows_kept(ctx: RewriteContext, chain, node, add, n: int) -> None:
    """``node`` reads ``add`` through eval-mode dropout, aliases and reshapes that keep the last dim (``n``), and the
    chain holds no other view; else the chain is refused (training dropout) or left to inductor (any other op)."""
    on_path = set()
    while node is not add:
        on_path.add(node)
        if not isinstance(node, torch.fx.Node) or node.op != "call_function" or not node.args:
            raise UseGeneric(WORDS("generic.view"))
        name = aten.aten_name(node)
        shape = aten.static_shape(node)
        if name.startswith("dropout") or name == "feature_dropout":
            if aten.is_training_dropout(node):
                raise Refuse(BASE_WORDS("training_dropout"))
        elif name not in _ROW_VIEWS and name not in ("alias", "detach"):
            raise UseGeneric(BASE_WORDS("op_inside", op=name))
        elif shape is None or shape[-1] != n:
            raise UseGeneric(WORDS("generic.view_last", op=name, before=n, after=list(shape or ())))
        node = node.args[0]
    compute = set(chain.compute_nodes)
    if any(ctx.by_name[m] not in on_path for m in chain.nodes if m not in compute):
        raise UseGeneric(WORDS("generic.view"))


# ====================================================================== lowering (lean graphs)

def _lower(node: torch.fx.Node, device: torch.device, dtype: torch.dtype, arity: int, keep_sum: bool) -> bool:
    """Hand the fused call the impl decided for this device and dtype: the rewrite's (``edit.planned``), else (a
    call fused for another target) the selection's, asked here once for the row length the graph records."""
    choice = edit.planned(node, device, dtype)
    if choice is None:
        shape = aten.static_shape(node.args[0])                             # x: floating, in ``dtype`` now
        choice = select_add_layer_norm(device, int(shape[-1]) if shape else None, dtype, keep_sum)
    if choice.impl == "triton":
        contiguous_operands(node)
    return edit.bind_choice(node, arity, choice.impl)


def contiguous_operands(node: torch.fx.Node) -> int:
    """Give the fused call its ``x`` and ``residual`` through ``Tensor.contiguous`` where the graph records a
    non-contiguous one of the same shape as the other. Returns how many it inserted.

    Why: a non-contiguous operand takes ``_add_layernorm_general``, whose ``reshape`` copies it; that copy is an op
    besides the kernel, so ``triton_support.BoundCall`` never binds the node, and every forward pays the general
    path's Python (the plan made afresh, two ``torch.empty``, the JIT's own launch) on top of the copy. torchvision's
    ViT hands its attention output (``view`` + ``transpose(1, 0)`` of ``out_proj``: strides ``(C, B·C, 1)``) to
    the add before ``ln_2``: 12 of vit_b_32's 25 calls stayed generic. With the copy as its own node the call sees
    contiguous operands, takes the fast path and binds; the copy is the same one the general path made (same
    values, one ATen call), and the kernel gets the same operands and integers, so the outputs are the same bit
    for bit. Only where both shapes are equal: there the general path runs the kernel, as the fast path does (a
    broadcasting residual makes the general path take the reference, and a copy would change that choice). A graph
    whose layout at run time differs from its record (a channels_last conv before a permute) gets a
    ``contiguous`` that returns its input, one cheap call. ``Tensor.contiguous`` as a function, not the
    ``contiguous`` method: ``lean.collapse_views`` would take the method into the view tree before it, and a tree
    whose leaf copies keeps its ops at every call. An operand that another of these calls returned is left alone:
    its record is the unfused ``add``'s (whose layout follows its first operand, the transposed one in ViT), but
    the kernel writes its outputs contiguous."""
    vals = [aten.node_val(a) for a in node.args[:2]]
    if not all(isinstance(v, torch.Tensor) for v in vals) or vals[0].shape != vals[1].shape:
        return 0
    inserted = 0
    for i, (arg, val) in enumerate(zip(node.args[:2], vals)):
        if not isinstance(arg, torch.fx.Node) or val.is_contiguous() or _kernel_output(arg):
            continue
        with node.graph.inserting_before(node):
            rows = node.graph.call_function(torch.Tensor.contiguous, (arg,))
        rows.meta["val"] = val.new_empty(val.shape)                        # fake: its shape, contiguous
        node.args = (*node.args[:i], rows, *node.args[i + 1:])
        inserted += 1
    return inserted


def _kernel_output(arg: torch.fx.Node) -> bool:
    """Whether ``arg`` is an output of one of this family's fused calls lowered to the kernel (contiguous: the
    kernel's outputs are allocated so, on its fast and its general path)."""
    src = arg.args[0] if arg.op == "call_function" and arg.target is operator.getitem and arg.args else arg
    return (isinstance(src, torch.fx.Node) and src.op == "call_function" and src.target in LOWERINGS
            and src.meta.get("fused_bound") == "triton")


#: fused call target -> lowering(gm, node, device, dtype) -> bool (explorer.runtime.lean)
LOWERINGS = {
    fused_add_layer_norm: lambda gm, node, device, dtype: _lower(node, device, dtype, 5, True),
    fused_add_layer_norm_normed: lambda gm, node, device, dtype: _lower(node, device, dtype, 5, False),
    fused_add_layer_norm_viewed: lambda gm, node, device, dtype: _lower(
        node, device, dtype, 7, bool(node.args[6]) if len(node.args) > 6 else True),
}


# ====================================================================== GroupNorm + activation

GROUP_NORM_ACTIVATIONS = ("relu", "silu", "gelu", "gelu_tanh", "hardswish", "sigmoid", "tanh")


def group_norm_act_reference(x, groups: int, weight, bias, eps: float, act: str):
    """Unfused: ``act(group_norm(x))``, the activation out of place."""
    from explorer.fusions.epilogue import apply_activation

    return apply_activation(torch.nn.functional.group_norm(x, groups, weight, bias, eps), act)


def fused_group_norm_act(x, groups, weight, bias, eps, act):
    """``act(group_norm(x))`` with the activation applied in place on the norm's output (the same rounding as the
    unfused pair: each op rounds once to the dtype)."""
    from explorer.fusions.epilogue import apply_activation_

    return apply_activation_(torch.nn.functional.group_norm(x, groups, weight, bias, eps), act)


def rewrite_group_norm(ctx: RewriteContext, chain, kernel: str) -> edit.Edit:
    """group_norm → act as one call, the activation in place."""
    edit.only_identity_views(ctx, chain)
    gn = ctx.node(chain, "group_norm")
    a = aten.args_of(gn)
    act = aten.activation_name(ctx.node(chain, "act"))
    if aten.aten_name(gn) != "group_norm" or act not in GROUP_NORM_ACTIVATIONS:
        raise UseGeneric(WORDS("generic.group_act", act=act))
    choice = Choice("separate", WORDS("label.group_norm", act=act), False)
    return edit.whole_chain_edit(ctx, chain, fused_group_norm_act,
                                 (a["input"], a["num_groups"], a.get("weight"), a.get("bias"), a.get("eps", 1e-5), act),
                                 choice)


# ====================================================================== patterns

def _last_dim_norm(g, node: str, ctx: dict) -> str | None:
    if g.nodes[node].get("norm_dims", 1) != 1:
        return WORDS("refuse.last_dim")
    return None


PATTERNS = (
    Pattern(
        name="add_layer_norm", label=WORDS("add_layer_norm.label"),
        steps=(Step(frozenset({"add"}), "add", emits=True),
               Step(frozenset({"layer_norm"}), "layer_norm", guard=_last_dim_norm)),
        color="#8c564b", rewrite=rewrite,
        implementation=WORDS("add_layer_norm.implementation"),
        explanation=WORDS("add_layer_norm.explanation"),
        caveats=(PRECISION_CAVEAT, WORDS("add_layer_norm.caveat")),
    ),
    Pattern(
        name="group_norm_act", label=WORDS("group_norm_act.label"),
        steps=(Step(frozenset({"group_norm"}), "group_norm"),
               Step(frozenset(GROUP_NORM_ACTIVATIONS) - {"gelu_tanh"}, "act")),
        color="#dbb0a0", rewrite=rewrite_group_norm,
        implementation=WORDS("group_norm_act.implementation"),
        explanation=WORDS("group_norm_act.explanation"),
        caveats=(PRECISION_CAVEAT,),
    ),
)
