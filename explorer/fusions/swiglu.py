"""The SwiGLU family: gate and up projections as one GEMM, then ``silu(gate) * up`` in one Triton pass.

::

    LlamaMLP, unfused (4 kernels)                        fused (2 kernels)
    x ─► gate_proj ─► g ─► silu ─► a ─┐                  x ─► linear([W_gate; W_up]) ─► gu (…, 2I)
    x ─► up_proj   ─► u ──────────────mul ─► (down_proj)       └─► silu_mul_packed(gu) ─► (…, I) ─► (down_proj)
    (x read twice; g, a, u written and read back)        (x read once; gate and up read in place as column views)

``concat_weights`` (``explorer.fusions.kernels.packed_gemm``) stacks ``W_gate`` and ``W_up``
once, when the plan is applied, so the two projections become one GEMM over
``x`` (as the Q/K/V siblings are). ``silu_mul_packed`` reads that GEMM's output
in place: gate in the first I columns, up in the last I (each a column view
whose rows are 2I apart), and writes a contiguous ``(…, I)``. Eager's ``silu``
then ``mul`` move 1R+1W and 2R+1W of an ``(…, I)`` tensor; the kernel 2R+1W.
``silu_mul`` is the same kernel on two separate tensors.

Arithmetic: ``a = round_dtype(g / (1 + exp(-g)) * u)`` with ``g``, ``u`` in fp32
and one rounding at the end. Eager (and ``LlamaMLP``) rounds twice (``F.silu``
returns the dtype, then the multiply rounds again), so the fused result is the
more accurate one: it agrees with eager within ``EAGER_TOLERANCES`` and with
float64 within ``TOLERANCES``, the tighter of the two. The one GEMM computes
each output column as the same dot product over the same ``x`` row; the
library may block the wider GEMM differently (``kernels.packed_gemm.PACKED_TOLERANCES``).

Kernel design (bandwidth-bound): programs tile (rows × columns) of the output
with a contiguous last dim (row strides are arguments, so column views need no
copy); contiguous same-shape inputs are treated as one long row. The 1-D grid is
split into (row block, column block) with the column blocks of one row block
adjacent, so neighbouring programs read neighbouring memory.

Supported: fp32, fp16, bf16; gate and up of one shape and dtype; any layout
whose last dim is contiguous (others are copied to rows first).
``select_swiglu`` is the one decision, made at the rewrite for the run's target; the lean
lowering hands the pass the recorded impl (``silu_mul_packed(gu, I, impl)``), which then
follows it (checking only that the operands fit the kernel). Calls autograd records take
the reference.

SwiGLU in the GEMM's epilogue (``swiglu_epilogue``, ``kernels.gemm.gemm_swiglu``):
one Triton GEMM whose tile accumulates matching gate and up columns (two fp32
accumulators over the same x tile) and writes ``silu(g)·u``; the (…, 2I) product
never reaches memory. It is our GEMM against cuBLAS, so it runs for a shape only
where ``kernels.measured`` says it measured faster than cuBLAS + the pass
(``epilogue_decision``, asked per call signature and by the lean lowering); the
chain's label carries the verdict and both times (``epilogue_note``). A second
variant interleaves the gate/up rows once at plan time (``swiglu_epilogue_interleaved``,
``gemm_swiglu_interleaved``: one accumulator whose neighbouring columns split in
registers). On the H200 the interleaved variant won at the zoo decoder's sizes
(112.1 against 115.8 µs) and runs there in lean graphs; at Llama-3-8B's the paired
one lost by 21% (the interleaved one is unmeasured there), so cuBLAS + pass runs.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import networkx as nx
import torch
import torch.fx
import torch.nn.functional as F

from explorer.fusions import edit
from explorer.fusions.base import WORDS as BASE_WORDS
from explorer.fusions.base import PAYS_CAVEAT, PRECISION_CAVEAT, Choice, NoMatch, Pattern, Step, selection
from explorer.fusions.edit import NewAttr, Refuse, RewriteContext, UseGeneric
from explorer.fusions.kernels import gemm as gemm_kernels
from explorer.fusions.kernels import measured
from explorer.fusions.kernels.packed_gemm import concat_weights
from explorer.fusions.triton_support import where
from explorer.fusions.triton_support import (Launch, cdiv, import_triton, interpreting, jit_helpers, launch,
                                             needs_autograd, next_power_of_2, operand_key, planned,
                                             refusal_for_device, remember)
from explorer.graph import aten
from explorer.words import Words

#: What this family says to a person, in English and 中文 (rendered by explorer.ui.i18n by id).
WORDS = Words("swiglu", {
    "title": ("SwiGLU", "SwiGLU"),
    "swiglu.label": ("SwiGLU (gate/up GEMM + silu·mul)", "SwiGLU（gate/up GEMM + silu·mul）"),
    "swiglu.implementation": (("one GEMM over the concatenated gate and up weights, then one Triton kernel "
                               "computing silu(gate)·up from its column views"),
                              "一个 GEMM 作用在拼接后的 gate 与 up 权重上，再用一个 Triton 内核从它的列视图计算 silu(gate)·up"),
    "swiglu.explanation": (("A gated MLP projects the same input twice (gate and up), applies SiLU to the gate "
                            "and multiplies: four kernels, with three intermediates written and read back. One "
                            "GEMM with both weight matrices stacked reads the input once; one elementwise kernel "
                            "then reads gate and up in place and writes only the product."),
                           ("门控 MLP 对同一个输入做两次投影（gate 和 up），对 gate 做 SiLU 再相乘：四个内核，三个中间结果写回显存再读出。把两个权重矩阵堆叠起来的一个 "
                            "GEMM 只读一次输入；接着一个逐元素内核原地读取 gate 和 up，只写出乘积。")),
    "swiglu.caveat": ("silu·mul is computed in fp32 and rounded once (eager rounds twice).",
                      "silu·mul 用 fp32 计算、只舍入一次（eager 舍入两次）。"),
    "swiglu.formula": ("a = silu(x W_gateᵀ) · (x W_upᵀ)", "a = silu(x W_gateᵀ) · (x W_upᵀ)"),
    "why.dtypes": ("gate is {dtype} but up is {up} (the kernel takes one dtype)",
                   "gate 是 {dtype}，up 却是 {up}（该内核只接受一种数据类型）"),
    "why.shapes": ("gate {gate} and up {up} differ in shape (no broadcasting)", "gate {gate} 与 up {up} 形状不同（不做广播）"),
    "label.reference": ("silu + mul (2 kernels: {why})", "silu + mul（2 个内核：{why}）"),
    "label.triton": ("triton silu*mul (1 elementwise kernel)", "triton silu*mul（1 个逐元素内核）"),
    "label.triton_gate": ("triton {act}*mul (1 elementwise kernel)", "triton {act}*mul（1 个逐元素内核）"),
    "label.reference_gate": ("{act} + mul (2 kernels: {why})", "{act} + mul（2 个内核：{why}）"),
    "why.gate": ("the kernel takes silu and tanh-GELU gates, not {act}", "该内核只接受 silu 和 tanh-GELU 门，不接受 {act}"),
    "generic.split": (("the packed projection is not split into two equal halves along its last dim "
                       "(chunk(2, -1) or split(I, -1))"),
                      "打包的投影没有沿最后一维均分成两半（chunk(2, -1) 或 split(I, -1)）"),
    "label.packed": (("one GEMM over the packed [W_gate; W_up] ({i}+{i} columns, as the model stores it), then "
                      "{label} reading its column views"),
                     "对打包的 [W_gate; W_up] 做一次 GEMM（{i}+{i} 列，按模型存储的方式），然后{label}，读取它的列视图"),
    "what.gate": ("gate projection", "gate 投影"),
    "what.silu": ("silu", "silu"),
    "what.up": ("up projection", "up 投影"),
    "what.sigmoid": ("sigmoid", "sigmoid"),
    "refuse.computed": ("a projection's weight is computed in the graph (one GEMM needs constant weights)",
                        "有一个投影的权重是在计算图中算出来的（合成一个 GEMM 需要常量权重）"),
    "refuse.bias": ("one projection has a bias and the other does not", "一个投影带偏置，另一个不带"),
    "refuse.dtypes": ("the projections differ in dtype", "两个投影的数据类型不同"),
    "generic.not_linear": ("a projection is not a plain linear", "有一个投影不是普通的线性层"),
    "refuse.inputs": ("the projections do not read the same input", "两个投影读取的不是同一个输入"),
    "generic.not_silu": ("the activation is not silu of the gate projection", "激活函数不是 gate 投影的 silu"),
    "generic.product": ("the product is not silu(gate) * up", "乘积不是 silu(gate) * up"),
    "refuse.widths": ("gate and up widths differ ({gate} and {up})", "gate 和 up 的宽度不同（{gate} 和 {up}）"),
    "label.one_gemm": ("one GEMM over [W_gate; W_up] ({gate}+{up} columns), then {label} reading its column views",
                       "对 [W_gate; W_up] 做一次 GEMM（{gate}+{up} 列），然后{label}，读取它的列视图"),
    "label.with_note": ("{label}; kernel note: {note}", "{label}；内核说明：{note}"),
    "label.epilogue": (("one Triton GEMM over [W_gate; W_up] with silu(gate)·up in its epilogue (the (…, {two_i}) "
                        "product is never written)"),
                       "一个 Triton GEMM 作用在 [W_gate; W_up] 上，尾处理里算 silu(gate)·up（(…, {two_i}) 的乘积从不写出）"),
    "note.faster": (("SwiGLU in the GEMM's epilogue at M={m}, K={k}, I={i} in bf16: {ours:.3f} ms against cuBLAS + "
                     "pass {base:.3f} ms on {device}: the epilogue runs there"),
                    "在 M={m}、K={k}、I={i}、bf16 下，GEMM 尾处理里的 SwiGLU：{ours:.3f} ms，cuBLAS + 单独一遍为 "
                    "{base:.3f} ms（{device}）：在那里运行尾处理版本"),
    "note.slower": (("SwiGLU in the GEMM's epilogue (near miss): at M={m}, K={k}, I={i} in bf16 it measured {ours:.3f} "
                     "ms against cuBLAS + pass {base:.3f} ms on {device}, so cuBLAS + pass runs"),
                    "GEMM 尾处理里的 SwiGLU（差一点）：在 M={m}、K={k}、I={i}、bf16 下实测 {ours:.3f} ms，cuBLAS + 单独一遍为 "
                    "{base:.3f} ms（{device}），所以运行 cuBLAS + 单独一遍"),
    "note.unmeasured": (("SwiGLU in the GEMM's epilogue is not measured at M={m}, K={k}, I={i}: cuBLAS + pass runs "
                         "(benchmarks/bench_llm_epilogues.py measures a shape)"),
                        "GEMM 尾处理里的 SwiGLU 没有在 M={m}、K={k}、I={i} 下测过：运行 cuBLAS + 单独一遍"
                        "（benchmarks/bench_llm_epilogues.py 可测量某个形状）"),
    "epilogue.teach": (("Why not always in the epilogue? The fused GEMM never writes the 2·I-wide product and never "
                        "reads it back (at Llama-3-8B sizes, 4096 tokens: 235 MB written and read, about 0.15 ms "
                        "of a 1.4 ms GEMM), but it is a Triton GEMM against cuBLAS: if it computes the matrix "
                        "product even 10% slower, the bytes saved do not pay. Small hidden sizes (the GEMM short "
                        "in K, the output large next to the work) favour the epilogue; large ones favour cuBLAS. "
                        "So it is chosen per shape, from a measurement."),
                       ("为什么不总放进尾处理？融合的 GEMM 不写出 2·I 宽的乘积、也不再读回（Llama-3-8B 尺寸、4096 个 token 时："
                        "写 235 MB 再读回，约占 1.4 ms GEMM 中的 0.15 ms），但它是 Triton GEMM 对 cuBLAS：矩阵乘只要慢 10%，"
                        "省下的字节就不划算。隐藏维小（GEMM 的 K 短，输出相对计算量大）时尾处理占优；大时 cuBLAS 占优。所以按形状、依据实测来选。")),
})


SUPPORTED_DTYPES = (torch.float32, torch.float16, torch.bfloat16)

#: Fused kernel vs float64 (the references on upcast inputs), ``|out - ref| <= atol + rtol·|ref|``.
#: u = unit roundoff (fp32 6e-8, fp16 4.9e-4, bf16 3.9e-3). One rounding (<= u) after fp32 arithmetic
#: whose own relative error is ~|g|·6e-8 (exp of the rounded product) plus a few fp32 ulps:
#: rtol = 1.5u for 16-bit types, below the 2u that a second rounding (eager's) can reach; 2e-6 for
#: fp32 (|g| up to ~20). atol covers fp16 results below its normal range.
TOLERANCES = {
    torch.float32: dict(rtol=2e-6, atol=1e-7),
    torch.float16: dict(rtol=7.3e-4, atol=1e-7),    # 1.5u
    torch.bfloat16: dict(rtol=5.9e-3, atol=1e-7),   # 1.5u
}

#: Fused kernel vs eager in the dtype (what a model-level check compares): eager's two roundings
#: (<= 2u) plus the kernel's one (<= u): rtol = 3u. fp16's atol: below its normal range (6.1e-5) a rounding
#: errs by up to 2^-25 absolute, not u relative, and eager rounds silu(g) there before multiplying by up, so
#: its first rounding reaches the output times |up|: |eager - t| <= 2u|t| + (|up| + 1)·2^-25 for the exact t,
#: |kernel - t| <= u|t| + 2^-25, hence |kernel - eager| <= 3u|t| + (|up| + 2)·2^-25, and atol = 8·2^-25 = 2^-22
#: covers |up| <= 6 (six standard deviations of a unit-normal up). Example (``tests/test_fusion_swiglu.py``):
#: g = -18, up = 5: silu(g) = -2.74e-7 is stored as 5·2^-24 = -2.98e-7; eager gives -1.490e-6, the kernel
#: -1.371e-6, float64 -1.3707e-6: the kernel is the closer, 1.19e-7 from eager where 1e-7 + 3u·|t| allowed 1.02e-7.
#: bf16 and fp32 have no such range at these magnitudes (their normal range reaches 1.2e-38).
EAGER_TOLERANCES = {
    torch.float32: dict(rtol=2e-6, atol=1e-7),
    torch.float16: dict(rtol=1.5e-3, atol=2.0 ** -22),    # 3u; atol: eager's subnormal silu(g) times |up| <= 6
    torch.bfloat16: dict(rtol=1.2e-2, atol=1e-7),         # 3u
}


#: The gates a gated MLP may apply, by ``aten.activation_name``: SwiGLU's silu (Llama, Mistral, Qwen2, Phi-3) and
#: GeGLU's tanh GELU (Gemma, Gemma2: ``gelu_pytorch_tanh``) run in the kernel; the exact (erf) GELU takes the
#: reference pass (two kernels) after the one GEMM.
GATES = ("silu", "gelu_tanh", "gelu")
KERNEL_GATES = {"silu": 0, "gelu_tanh": 1}


def gate_act(gate: torch.Tensor, act: str = "silu") -> torch.Tensor:
    """The gate's activation as the model applies it: ``F.silu``, ``F.gelu(approximate="tanh")`` or ``F.gelu``."""
    if act == "silu":
        return F.silu(gate)
    if act in ("gelu_tanh", "gelu"):
        return F.gelu(gate, approximate="tanh" if act == "gelu_tanh" else "none")
    raise ValueError(f"gate activation {act!r} is not one of {GATES}")


def silu_mul_reference(gate: torch.Tensor, up: torch.Tensor, act: str = "silu") -> torch.Tensor:
    """``act_fn(gate_proj(x)) * up_proj(x)`` of ``LlamaMLP`` (``hidden_act="silu"``; GeGLU's ``act="gelu_tanh"``):
    ``F.silu(gate) * up``, rounding after the activation and after the multiply as the module does (on float64: the
    tests' oracle)."""
    return gate_act(gate, act) * up                                           # (..., I)


def split_sizes(gu_last: int, sizes: int | Sequence[int]) -> int:
    """``I`` for a packed ``(..., 2I)`` tensor: ``sizes`` is ``I`` or ``(I, I)`` (torch.split style).

    Raises ValueError when the halves differ or do not add up to the last dim.
    """
    sizes = (sizes, sizes) if isinstance(sizes, int) else tuple(int(s) for s in sizes)
    if len(sizes) != 2 or sizes[0] != sizes[1] or sizes[0] < 1 or sum(sizes) != gu_last:
        raise ValueError(f"sizes {sizes} must be (I, I) with 2I == the last dim {gu_last}")
    return sizes[0]


def silu_mul_packed_reference(gu: torch.Tensor, sizes: int | Sequence[int], act: str = "silu") -> torch.Tensor:
    """Unfused on one packed GEMM output: ``gate, up = gu.split(sizes, -1)`` (Phi-3's ``gate_up_proj`` then
    ``chunk(2, -1)``), then ``silu_mul_reference``."""
    i = split_sizes(gu.shape[-1], sizes)
    gate, up = gu.split((i, i), dim=-1)                                       # (..., I) column views each
    return silu_mul_reference(gate, up, act)                                  # (..., I)


def swiglu_reference(x: torch.Tensor, w_gate: torch.Tensor, w_up: torch.Tensor, b_gate: torch.Tensor | None = None,
                     b_up: torch.Tensor | None = None) -> torch.Tensor:
    """Unfused, as the model runs it: two GEMMs over ``x``, ``silu`` of the first, times the second."""
    return silu_mul_reference(F.linear(x, w_gate, b_gate), F.linear(x, w_up, b_up))       # (..., I)


# ====================================================================== kernel selection

@selection
def select_swiglu(device: torch.device | str, dtype: torch.dtype | None = None, *,
                  up_dtype: torch.dtype | None = None, gate_shape=None, up_shape=None,
                  requires_grad: bool = False, act: str = "silu") -> Choice:
    """The one decision of how ``silu(gate) * up`` runs: ``triton`` (one kernel) or ``reference`` (two).

    Only ``device`` is required; arguments left as None raise no objection. ``requires_grad``:
    autograd would record the call (the kernel is forward-only).
    """
    why = refusal_for_device(device) or _gate_dtype_refusal(dtype, act)
    if why is None and requires_grad:
        why = BASE_WORDS("autograd")
    why = why or _operand_refusal(dtype, up_dtype, gate_shape, up_shape)
    if why is not None:
        return Choice("reference", WORDS("label.reference" if act == "silu" else "label.reference_gate", why=why,
                                         act=act), False)
    label = WORDS("label.triton") if act == "silu" else WORDS("label.triton_gate", act=act)
    return Choice("triton", where(label, torch.device(device)), True)


def _gate_dtype_refusal(dtype, act: str) -> str | None:
    """Why the kernel does not take this gate activation or dtype (None: it does)."""
    if act not in KERNEL_GATES:
        return WORDS("why.gate", act=act)
    if dtype is not None and dtype not in SUPPORTED_DTYPES:
        return BASE_WORDS("dtype_slash", dtype=dtype)
    return None


def _operand_refusal(dtype, up_dtype, gate_shape, up_shape) -> str | None:
    """Why the kernel does not take separate gate and up tensors of these dtypes and shapes (None: it does)."""
    if up_dtype is not None and dtype is not None and up_dtype != dtype:
        return WORDS("why.dtypes", dtype=dtype, up=up_dtype)
    if gate_shape is not None and up_shape is not None and tuple(gate_shape) != tuple(up_shape):
        return WORDS("why.shapes", gate=tuple(gate_shape), up=tuple(up_shape))
    return None


def elementwise_impl(choice: Choice) -> str:
    """The silu*mul pass's impl in a chain's recorded ``choice``: ``one_gemm_<impl>`` names it; ``gemm_epilogue``
    was chosen only where the pass's selection said ``triton``."""
    return "triton" if choice.impl == "gemm_epilogue" else choice.impl.removeprefix("one_gemm_")


# ====================================================================== the kernel

def launch_config_before(m: int, n: int) -> tuple[int, int, int]:
    """``(BLOCK_M, BLOCK_N, num_warps)`` of the rule before the H200 sweep (``MEASURED`` False; what
    ``benchmarks/bench_membw.py``'s ``PREVIOUS`` times beside the measured rule).

    One long row (m == 1, contiguous inputs): 4096 columns a program. Rows: up to 1024 columns and as
    many rows as make 4096 elements. 8 warps for 4096 elements: 16 a thread, 2-4 vectors of 16 bytes
    per input.
    """
    if m == 1:
        block_m, block_n = 1, min(next_power_of_2(n), 4096)
    else:
        block_n = min(next_power_of_2(n), 1024)
        block_m = min(next_power_of_2(m), max(1, 4096 // block_n))
    tile = block_m * block_n
    num_warps = 8 if tile >= 4096 else 4 if tile >= 1024 else 2 if tile >= 256 else 1
    return block_m, block_n, num_warps


#: Whether launches follow the measured rule (``launch_setting``); False restores the rule before the sweep
#: exactly (``launch_config_before``, tiles, ``HINTS``): the outputs are the same bits either way (a setting
#: changes the walk over the elements, not the arithmetic on one: ``tests/test_kernel_layouts.py``).
MEASURED = True


def launch_setting(m: int, n: int) -> tuple[int, int, int, bool, int]:
    """``(BLOCK_M, BLOCK_N, num_warps, FLAT, HINTS)`` for an (m, n) output.

    The measured rule (``MEASURED``), from the H200 sweep ``benchmarks/results/bench_membw_sweep_h200.json``
    (bf16, the median's % of a device copy of the same bytes timed in the same rounds, L2 rotated), for outputs at
    least 1024 wide, which is what it measured (the zoo's I = 1376 and Llama-3-8B's 14336):

    - one long row (m == 1: contiguous gate and up): 1024 columns, 4 warps, no cache hints (``HINTS`` 1):
      97.0% at 16384×1376, 100.1% at 4096×14336, where 4096 columns, 8 warps, evict-first measured 91.7 / 91.3%
      (inductor 96.5 / 100.4%);
    - rows ragged against 1024-column tiles (a packed gate/up output, I % 1024 != 0, the zoo's 1376): one row of
      1024 a program, 4 warps, walked flat (``flat_rule``), evict-first: 97.8% where 4 × 1024 tiles, 8 warps
      measured 91.1% (inductor 97.4%);
    - rows that fill 1024-column tiles (8B's packed 14336): 4 × 1024 tiles, 8 warps, no cache hints: 100.3% where
      the same tiles with evict-first measured 97.9% (inductor 100.9%).

    Narrower outputs, and every shape with ``MEASURED`` False, take ``launch_config_before`` with ``HINTS`` and
    (only with ``FLAT_WHEN_RAGGED``) ``flat_rule``: not measured. fp16 follows bf16 (the same bytes; the sweep
    timed fp16 at the launched settings only, ``--verify`` times both).
    """
    if MEASURED and n >= 1024:
        if m == 1:
            return 1, 1024, 4, False, 1
        if n % 1024:
            return 1, 1024, 4, True, 0
        return min(4, next_power_of_2(m)), 1024, 8, False, 1
    block_m, block_n, warps = launch_config_before(m, n)
    return block_m, block_n, warps, FLAT_WHEN_RAGGED and flat_rule(m, n, block_n), HINTS


def launch_config(m: int, n: int) -> tuple[int, int, int]:
    """``(BLOCK_M, BLOCK_N, num_warps)`` of ``launch_setting`` (the walk and the hints left out)."""
    return launch_setting(m, n)[:3]


#: The kernel's cache hints outside the measured rule unless a call says (``_silu_mul_fwd``'s ``HINTS``): 0, the
#: inputs loaded evict-first.
HINTS = 0


#: Whether a launch outside the measured rule (outputs under 1024 wide, or ``MEASURED`` False) follows
#: ``flat_rule`` (else: tiles). Off: unmeasured there; the measured rule walks ragged rows flat by itself.
FLAT_WHEN_RAGGED = False


def flat_rule(m: int, n: int, block_n: int) -> bool:
    """Whether the (m, n) output is better walked as one flat index (``FLAT``) than in (BLOCK_M, BLOCK_N) tiles:
    where rows are ragged against the tile (``n % block_n``), which leaves a tile's tail lanes idle (the zoo's
    packed gate/up, I = 1376 in 1024-column tiles: two thirds of every second tile). One long row (m == 1) is
    the same walk either way. Measured at I = 1376 (``launch_setting``); elsewhere launches follow it only with
    ``FLAT_WHEN_RAGGED``."""
    return m > 1 and n % block_n != 0


def _new_output(shape, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Allocate an output the kernel fully overwrites (tests replace this to poison it)."""
    return torch.empty(shape, dtype=dtype, device=device)


@functools.lru_cache(maxsize=2)
def _build_kernel(interpret: bool):
    """Define the Triton kernel (imports Triton); cached per interpreter mode (see ``rms_norm._build_kernel``)."""
    global tl, _round_to
    triton, tl = import_triton()
    _round_to = jit_helpers(interpret).round_to

    @triton.jit
    def _silu_mul_fwd(
        G, U, O,                                   # pointers: gate, up (U may equal G: packed), output
        up_off, stride_g, stride_u, stride_o,      # up's element offset from U; row strides (elements)
        M, N, N_BLOCKS,                            # output rows, columns; column blocks per row block
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BF16_RTNE_BY_HAND: tl.constexpr, ACT: tl.constexpr,
        FLAT: tl.constexpr, HINTS: tl.constexpr,
    ):
        """Program pid: output tile (pid // N_BLOCKS, pid % N_BLOCKS) of BLOCK_M rows by BLOCK_N columns.

        ``FLAT``: program pid takes output elements pid·BLOCK_M·BLOCK_N .. + BLOCK_M·BLOCK_N - 1 of the
        row-major (M, N) output instead (row = index // N, column = index % N; the grid is then
        cdiv(M·N, BLOCK_M·BLOCK_N)), so rows that are not a multiple of BLOCK_N leave no lanes idle (the zoo's
        I = 1376 in 1024-column tiles: a third of the second tile's lanes live; measured there: see
        ``launch_setting``). ``HINTS``: 0 the inputs loaded
        evict-first, 1 no cache hints, 2 evict-first and the output stored streaming."""
        pid = tl.program_id(0)
        if FLAT:
            idx = pid.to(tl.int64) * (BLOCK_M * BLOCK_N) + tl.arange(0, BLOCK_M * BLOCK_N)[None, :]   # (1, TILE)
            rows = idx // N
            cols = idx - rows * N
            live = rows < M                                       # idx < M·N without an int32 product
        else:
            pid_m = pid // N_BLOCKS
            pid_n = pid % N_BLOCKS
            rows = (pid_m.to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M))[:, None]    # (BLOCK_M, 1)
            cols = (pid_n.to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N))[None, :]    # (1, BLOCK_N)
            live = (rows < M) & (cols < N)                                             # (BLOCK_M, BLOCK_N)
        if HINTS == 1:                                 # no cache hints (what inductor's pointwise kernels issue)
            g = tl.load(G + rows * stride_g + cols, mask=live, other=0.0)
            u = tl.load(U + up_off + rows * stride_u + cols, mask=live, other=0.0)
        else:                                          # streamed inputs: evict them first
            g = tl.load(G + rows * stride_g + cols, mask=live, other=0.0, eviction_policy="evict_first")
            u = tl.load(U + up_off + rows * stride_u + cols, mask=live, other=0.0, eviction_policy="evict_first")
        g = g.to(tl.float32)
        if ACT == 0:
            a = g / (1.0 + tl.exp(-g)) * u.to(tl.float32)                              # silu(g)·u, fp32
        else:  # GeGLU: 0.5·g·(1 + tanh(t))·u with t = √(2/π)·(g + 0.044715·g³), as g·sigmoid(2t)·u (no cancellation)
            t = 0.7978845608028654 * (g + 0.044715 * g * g * g)
            a = g / (1.0 + tl.exp(-2.0 * t)) * u.to(tl.float32)
        if HINTS == 2:                                 # and the output stored streaming (.cs)
            tl.store(O + rows * stride_o + cols, _round_to(a, O.dtype.element_ty, BF16_RTNE_BY_HAND), mask=live,
                     cache_modifier=".cs")
        else:
            tl.store(O + rows * stride_o + cols, _round_to(a, O.dtype.element_ty, BF16_RTNE_BY_HAND), mask=live)

    return _silu_mul_fwd


#: ``Launch`` by call signature: planned once (``triton_support.planned``), so that a repeated call
#: costs one allocation and the launch. Bounded.
_LAUNCHES: dict[tuple, Launch] = {}


def _rows(t: torch.Tensor, n: int) -> torch.Tensor:
    """``t`` as ``(rows, n)`` with a contiguous last dim (a view where ``reshape`` can make one)."""
    t2 = t.reshape(-1, n)                                                       # (rows, n)
    return t2 if t2.stride(-1) == 1 or t2.shape[0] == 0 else t2.contiguous()


def _fits(t: torch.Tensor) -> bool:
    """Whether the kernel can read ``t`` in place: a contiguous last dim, and leading dims that
    collapse to one row stride (a column view of a packed GEMM output does)."""
    if t.dim() == 0 or t.stride(-1) != 1:
        return False
    expected = t.stride(-2) if t.dim() > 1 else 0
    for size, stride in zip(reversed(t.shape[:-1]), reversed(t.stride()[:-1])):
        if size != 1 and stride != expected:
            return False
        expected = stride * size if size != 1 else expected
    return True


def _signature(kind: str, gate: torch.Tensor, up: torch.Tensor, tuning: tuple, act: str = "silu",
               impl: str | None = None) -> tuple:
    """Hashable call signature: what the plan depends on (shapes, strides, dtypes, alignment, device, mode, the
    impl the call was handed)."""
    return (kind, operand_key(gate), operand_key(up), tuning, gate.is_cuda or interpreting(), act, impl)


def _kernel_runs(gate: torch.Tensor, up: torch.Tensor, packed_i: int | None, act: str, impl: str | None) -> bool:
    """The decision for these operands: the impl the call was handed (its lowering binds the choice the rewrite
    recorded for the target), else the selection's, asked with every operand fact. Handed ``triton``, the call
    checks only what the kernel needs of the actual operands (``select_swiglu``'s checks less the device, which
    is the decision), so the same operands take the same path as when the selection was asked here."""
    if packed_i is None:
        if impl is None:
            return select_swiglu(gate.device, gate.dtype, up_dtype=up.dtype, gate_shape=gate.shape,
                                 up_shape=up.shape, act=act).fused
        return impl == "triton" and (_gate_dtype_refusal(gate.dtype, act)
                                     or _operand_refusal(gate.dtype, up.dtype, gate.shape, up.shape)) is None
    if impl is None:
        return select_swiglu(gate.device, gate.dtype, act=act).fused
    return impl == "triton" and _gate_dtype_refusal(gate.dtype, act) is None


def _plan(gate: torch.Tensor, up: torch.Tensor, packed_i: int | None, tuning: tuple, act: str = "silu",
          impl: str | None = None) -> Launch:
    """Decide whether the kernel runs for these operands (``_kernel_runs``) and prepare its launch.

    ``packed_i``: None for separate gate/up tensors; ``I`` when ``gate`` is the packed ``(..., 2I)``
    tensor (``up`` is then the same tensor). Only layouts ``_fits`` accepts are planned; the caller
    copies others to rows first.
    """
    if packed_i is None:
        fused = _kernel_runs(gate, up, None, act, impl) and up.device == gate.device
        out_shape = tuple(gate.shape)
    else:
        fused = _kernel_runs(gate, up, packed_i, act, impl)
        out_shape = tuple(gate.shape[:-1]) + (packed_i,)
    if not fused or gate.numel() == 0:
        return Launch(out_shape=out_shape)
    block_m_override, block_n_override, warps_override, *extra = tuning
    flat_override, hints_override = (extra + [None, None])[:2]
    if packed_i is None and gate.is_contiguous() and up.is_contiguous():
        m, n, sg, su, up_off = 1, gate.numel(), 0, 0, 0                          # one long row
    elif packed_i is None:
        n = gate.shape[-1]
        m = gate.numel() // n
        sg = gate.stride(-2) if gate.dim() > 1 else 0
        su = up.stride(-2) if up.dim() > 1 else 0
        up_off = 0
    else:
        n = packed_i
        m = gate.numel() // (2 * n)
        sg = su = gate.stride(-2) if gate.dim() > 1 else 0                        # rows 2I apart (or more)
        up_off = n                                                                # up starts I columns in
    block_m, block_n, warps, flat, hints = launch_setting(m, n)
    block_m, block_n = block_m_override or block_m, block_n_override or block_n
    flat = flat if flat_override is None else bool(flat_override)
    n_blocks = cdiv(n, block_n)
    grid = cdiv(m * n, block_m * block_n) if flat else cdiv(m, block_m) * n_blocks
    so = n if m > 1 else 0                                                        # output rows are contiguous
    interpret = interpreting()
    return Launch(_build_kernel(interpret), (grid,), (up_off, sg, su, so, m, n, n_blocks),
                  dict(BLOCK_M=block_m, BLOCK_N=block_n, BF16_RTNE_BY_HAND=interpret, ACT=KERNEL_GATES[act],
                       FLAT=flat, HINTS=hints if hints_override is None else int(hints_override)),
                  warps_override or warps, out_shape=out_shape)


def _run(kind: str, gate: torch.Tensor, up: torch.Tensor, packed_i: int | None, tuning: tuple,
         act: str = "silu", impl: str | None = None) -> torch.Tensor:
    """Plan (once per signature) and launch; the reference where the plan says so."""
    key = _signature(kind, gate, up, tuning, act, impl)
    plan = planned(_LAUNCHES, key, _plan, gate, up, packed_i, tuning, act, impl)
    if plan.kernel is None:
        if packed_i is None:
            return silu_mul_reference(gate, up, act)
        return silu_mul_packed_reference(gate, packed_i, act)
    out = _new_output(plan.out_shape, gate.dtype, gate.device)                  # (..., I) contiguous
    launch(plan.kernel, plan.grid, (gate, up, out, *plan.ints), plan.constexprs, key=plan,
           num_warps=plan.num_warps)
    return out


def _tuning(block_m, block_n, num_warps, flat=None, hints=None) -> tuple:
    """Validated launch overrides (powers of two, or None for the heuristic; ``flat`` None for ``flat_rule``,
    ``hints`` None for ``HINTS``)."""
    for name, v in (("block_m", block_m), ("block_n", block_n)):
        if v is not None and (v < 1 or v & (v - 1)):
            raise ValueError(f"{name} must be a power of two, got {v}")
    if hints not in (None, 0, 1, 2):
        raise ValueError(f"hints must be 0, 1 or 2, got {hints}")
    return (block_m, block_n, num_warps, flat, hints)


def silu_mul(gate: torch.Tensor, up: torch.Tensor, *, block_m: int | None = None, block_n: int | None = None,
             num_warps: int | None = None, act: str = "silu", flat: bool | None = None,
             hints: int | None = None, impl: str | None = None) -> torch.Tensor:
    """``silu(gate) * up`` in one pass (fp32 math, one rounding); returns a contiguous tensor of gate's shape.

    ``gate``, ``up``: one shape and dtype (fp32/fp16/bf16), any layout; layouts ``_fits`` accepts are
    read in place (column views of a packed GEMM output included), others are copied to rows first.
    Falls back to ``silu_mul_reference`` where ``select_swiglu`` refuses. ``block_m``, ``block_n``,
    ``num_warps`` override the launch heuristics (for tuning), ``flat`` the program layout (``flat_rule``),
    ``hints`` the cache hints (``HINTS``). ``impl``: the ``Choice.impl`` decided for the call's target; given, the
    selection is not asked ("reference" runs the reference, "triton" the kernel where the operands fit it).
    """
    tuning = _tuning(block_m, block_n, num_warps, flat, hints)
    if needs_autograd(gate, up) or (impl is not None and impl != "triton"):
        return silu_mul_reference(gate, up, act)                                 # forward-only kernel; or handed it
    if not (gate.is_contiguous() and up.is_contiguous()) and gate.shape == up.shape and gate.dim() > 0:
        if not _fits(gate):
            gate = _rows(gate, gate.shape[-1]).view(gate.shape)                  # copy to rows
        if not _fits(up):
            up = _rows(up, up.shape[-1]).view(up.shape)
    return _run("separate", gate, up, None, tuning, act, impl)


def silu_mul_packed(gu: torch.Tensor, sizes: int | Sequence[int], impl: str | None = None, *,
                    block_m: int | None = None, block_n: int | None = None, num_warps: int | None = None,
                    act: str = "silu", flat: bool | None = None, hints: int | None = None) -> torch.Tensor:
    """``silu(gu[..., :I]) * gu[..., I:]`` from one packed GEMM output ``gu`` of shape ``(..., 2I)``.

    ``sizes``: ``I`` or ``(I, I)``. Returns ``(..., I)``, contiguous, in ``gu``'s dtype. Gate and up
    are read in place as column views (rows 2I apart); a ``gu`` whose rows are not one stride apart
    is copied first. Falls back to ``silu_mul_packed_reference`` where ``select_swiglu`` refuses. ``impl``
    (positional, so that a lean graph's bound call takes it: ``triton_support.BoundCall``): the ``Choice.impl``
    its lowering hands it, as ``silu_mul``'s.
    """
    i = split_sizes(gu.shape[-1], sizes)
    tuning = _tuning(block_m, block_n, num_warps, flat, hints)
    if needs_autograd(gu) or (impl is not None and impl != "triton"):
        return silu_mul_packed_reference(gu, i, act)                             # forward-only kernel; or handed it
    if gu.dim() > 0 and not _fits(gu):
        gu = _rows(gu, gu.shape[-1]).view(gu.shape)                              # copy to rows
    return _run("packed", gu, gu, i, tuning, act, impl)


def swiglu_pass(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, intermediate: int,
                act: str = "silu") -> torch.Tensor:
    """cuBLAS + pass: one GEMM over ``weight = [W_gate; W_up]`` (``(2I, in)``), then ``silu_mul_packed`` on its
    column views. Returns ``(..., I)``."""
    return silu_mul_packed(F.linear(x, weight, bias), intermediate, act=act)    # (..., 2I) -> (..., I)


def epilogue_decision(device: torch.device | str, dtype: torch.dtype, m: int, k: int, i: int,
                      choice: Choice | None = None) -> measured.Decision:
    """Whether SwiGLU runs in the GEMM's epilogue at (M, K, I) in ``dtype`` on ``device``: Triton must run there in
    one of its dtypes, then ``kernels.measured.decide`` (the committed H200 table). ``choice``: what the rewrite
    recorded for this target (the lowering passes it: ``gemm_epilogue``, or ``one_gemm_<the selection's
    impl>``), which says whether Triton runs there, so the selection is not asked again."""
    triton = (choice.impl in ("gemm_epilogue", "one_gemm_triton") if choice is not None
              else select_swiglu(device, dtype).impl == "triton")
    if not triton:
        return measured.Decision(False, None, None, "device")
    return measured.decide("swiglu", device, dtype, m, k, i)


#: (device, dtype, M, K, I, policy) -> Decision, asked once per signature (bounded: ``remember``).
_DECISIONS: dict[tuple, measured.Decision] = {}


def swiglu_epilogue(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, intermediate: int,
                    tiles: tuple[int, ...] | None = None) -> torch.Tensor:
    """``silu(x W_gateᵀ + b_gate) * (x W_upᵀ + b_up)`` as one Triton GEMM with SwiGLU in its epilogue
    (``kernels.gemm.gemm_swiglu``): the (…, 2I) product never reaches memory. Returns ``(..., I)``; the
    cuBLAS + pass path where the kernel does not take the operands (autograd, a device or dtype mismatch)."""
    k = weight.shape[1]
    a = x.reshape(-1, k)                                                        # (M, K): a view where it can be
    if needs_autograd(x, weight, bias) or not gemm_kernels.paired_applies(a, weight) or (
            bias is not None and (bias.dtype != x.dtype or bias.device != x.device)):
        return swiglu_pass(x, weight, bias, intermediate)
    return gemm_kernels.gemm_swiglu(a, weight, bias, intermediate, tiles=tiles).view(*x.shape[:-1], intermediate)


def swiglu_epilogue_interleaved(x: torch.Tensor, weight_il: torch.Tensor, bias_il: torch.Tensor | None,
                                tiles: tuple[int, ...] | None = None) -> torch.Tensor:
    """``swiglu_epilogue`` over ``kernels.gemm.interleave_gate_up``'s weight (rows g_0, u_0, g_1, u_1, …) and bias:
    one accumulator whose neighbouring columns are split in registers (``gemm_swiglu_interleaved``). The lean
    lowering interleaves the weight once; the unfused path where the kernel does not take the operands."""
    k = weight_il.shape[1]
    a = x.reshape(-1, k)
    i = weight_il.shape[0] // 2
    if needs_autograd(x, weight_il, bias_il) or not gemm_kernels.paired_applies(a, weight_il) or (
            bias_il is not None and (bias_il.dtype != x.dtype or bias_il.device != x.device)):
        gu = F.linear(x, weight_il, bias_il)                                    # (..., 2I) interleaved
        return silu_mul_reference(gu[..., 0::2], gu[..., 1::2])
    return gemm_kernels.gemm_swiglu_interleaved(a, weight_il, bias_il, tiles=tiles).view(*x.shape[:-1], i)


def swiglu(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, intermediate: int) -> torch.Tensor:
    """``silu(x W_gateᵀ + b_gate) * (x W_upᵀ + b_up)`` from ``weight = [W_gate; W_up]`` (``(2I, in)``), ``(..., I)``:
    SwiGLU in the GEMM's epilogue where ``epilogue_decision`` chooses it for this shape, else cuBLAS + pass."""
    key = (x.device, x.dtype, x.numel() // max(1, x.shape[-1]), weight.shape[1], intermediate, measured.POLICY)
    decision = _DECISIONS.get(key)
    if decision is None:
        decision = remember(_DECISIONS, key, epilogue_decision(*key[:5]))
    if decision.fused and (decision.measurement is None or decision.measurement.variant == "paired"):
        return swiglu_epilogue(x, weight, bias, intermediate, decision.tiles)
    # the interleaved variant needs the weight interleaved once (the lean lowering does it); the paired one was
    # not measured faster at this shape, so this generic call takes cuBLAS + pass
    return swiglu_pass(x, weight, bias, intermediate)


def epilogue_note(m: int, k: int, i: int) -> str | None:
    """The kernel note of a chain at (M, K, I): what the H200 table decides for bf16, with both times (None
    where the policy forces a path)."""
    decision = measured.decide("swiglu", "cuda", torch.bfloat16, m, k, i)
    found = decision.measurement
    if decision.why in ("measured_faster", "measured_slower"):
        return WORDS("note.faster" if decision.fused else "note.slower", m=m, k=k, i=i, ours=found.ours_ms,
                     base=found.baseline_ms, device=found.device)
    if decision.why == "unmeasured":
        return WORDS("note.unmeasured", m=m, k=k, i=i)
    return None


# ====================================================================== fused call target

def fused_swiglu(x, weight, bias, intermediate, act="silu"):
    """SwiGLU's first half over concatenated weights: one GEMM, then silu*mul from one kernel where possible
    (``act``: the gate's activation, ``GATES``; the GEMM-epilogue variants are SwiGLU's only)."""
    if act != "silu":
        return swiglu_pass(x, weight, bias, intermediate, act)
    return swiglu(x, weight, bias, intermediate)


# ====================================================================== matching

def _silu_of(g: nx.DiGraph, gate: str) -> list[tuple[str, str, bool]]:
    """``silu(gate)`` as ``[(node, role, True)]``: one ``silu`` (or GeGLU's ``gelu``), or ``gate * sigmoid(gate)``
    (as ONNX exporters write it: roles ``sigmoid`` and ``act``); ``NoMatch(None)`` otherwise."""
    succ = list(g.successors(gate))
    silus = [s for s in succ if g.nodes[s]["kind"] in ("silu", "gelu")]
    if len(silus) == 1:
        return [(silus[0], "act", True)]
    sigmoids = [s for s in succ if g.nodes[s]["kind"] == "sigmoid"]
    if len(sigmoids) == 1:
        products = [s for s in succ if g.nodes[s]["kind"] == "mul" and set(g.predecessors(s)) == {gate, sigmoids[0]}]
        if len(products) == 1:
            return [(sigmoids[0], "sigmoid", True), (products[0], "act", True)]
    raise NoMatch(None, [gate])


_SPLITS = ("aten.chunk.", "aten.split.", "aten.split_with_sizes.")


def _packed_halves(g: nx.DiGraph, linear: str) -> tuple[str, list[str]] | None:
    """``(split node, [its two getitems])`` when the linear's only reader splits it in two (Phi-3's
    ``gate_up_proj(x).chunk(2, dim=-1)``); None otherwise (the rewrite checks the dim and the halves)."""
    succ = list(g.successors(linear))
    if len(succ) != 1 or not str(g.nodes[succ[0]].get("target", "")).startswith(_SPLITS):
        return None
    items = sorted(g.successors(succ[0]), key=lambda n: g.nodes[n]["order"])
    if len(items) != 2 or any(str(g.nodes[n].get("target", "")) != "getitem" for n in items):
        return None
    return succ[0], items


def _match_packed(g: nx.DiGraph, pattern: Pattern, anchor: str, claimed: dict[str, str],
                  split: str, items: list[str]) -> list:
    """``act(gu[gate half]) * gu[up half]`` of one packed projection ``gu`` (Phi-3's MLP)."""
    for gate_item, up_item in (items, items[::-1]):
        try:
            act_nodes = _silu_of(g, gate_item)
        except NoMatch:
            continue
        act = act_nodes[-1][0]
        muls = [s for s in g.successors(act) if g.nodes[s]["kind"] == "mul"]
        if len(muls) == 1 and set(g.predecessors(muls[0])) == {act, up_item}:
            break
    else:
        raise NoMatch(None, [anchor, split])
    mul = muls[0]
    nodes = [anchor, split, gate_item, up_item, *(n for n, _, _ in act_nodes), mul]
    refusals = [BASE_WORDS("already_in_chain", op=n, chain=claimed[n]) for n in nodes if n in claimed]
    for node, what, readers in ((gate_item, "gate", len(act_nodes)), (act, "silu", 1), (up_item, "up", 1),
                                (act_nodes[0][0], "sigmoid", 1)):
        if g.out_degree(node) > readers:
            refusals.append(BASE_WORDS("consumers", op=WORDS("what." + what), n=g.out_degree(node)))
    if not g.nodes[anchor].get("const_weight"):
        refusals.append(WORDS("refuse.computed"))
    if refusals:
        raise NoMatch(BASE_WORDS("own_matcher", pattern=pattern.label, reason=refusals[0]), nodes)
    return [(anchor, "packed", True), (split, "view", False), (gate_item, "view", False), (up_item, "view", False),
            *act_nodes, (mul, "mul", True)]


def _match_swiglu(g: nx.DiGraph, pattern: Pattern, anchor: str, claimed: dict[str, str]) -> list:
    """``silu(linear_gate(x)) * linear_up(x)``, anchored at the gate projection (its matcher); GeGLU's
    ``gelu(gate)`` alike; or one packed projection split in two (``_match_packed``).

    Both projections read one ``x`` with constant weights (one GEMM over the concatenated weights
    needs them); everything but the product must be read by the chain only.
    """
    gate = anchor
    packed = _packed_halves(g, gate)
    if packed is not None:
        return _match_packed(g, pattern, anchor, claimed, *packed)
    silu = _silu_of(g, gate)
    act = silu[-1][0]
    muls = [s for s in g.successors(act) if g.nodes[s]["kind"] == "mul"]
    if len(muls) != 1:
        raise NoMatch(None, [gate, act])
    mul = muls[0]
    others = [p for p in g.predecessors(mul) if p != act]
    if len(others) != 1 or g.nodes[others[0]]["kind"] != "linear":
        raise NoMatch(None, [gate, act, mul])
    up = others[0]
    x = g.nodes[gate].get("first_input")
    if x is None or g.nodes[up].get("first_input") != x:
        raise NoMatch(None, [gate, act, mul, up])
    nodes = [gate, up, *(n for n, _, _ in silu), mul]
    refusals = [BASE_WORDS("already_in_chain", op=n, chain=claimed[n]) for n in nodes if n in claimed]
    for node, what, readers in ((gate, "gate", len(silu)), (act, "silu", 1), (up, "up", 1), (silu[0][0], "sigmoid", 1)):
        if g.out_degree(node) > readers:
            refusals.append(BASE_WORDS("consumers", op=WORDS("what." + what), n=g.out_degree(node)))
    if not (g.nodes[gate].get("const_weight") and g.nodes[up].get("const_weight")):
        refusals.append(WORDS("refuse.computed"))
    if g.nodes[gate].get("has_bias") != g.nodes[up].get("has_bias"):
        refusals.append(WORDS("refuse.bias"))
    if g.nodes[gate]["dtypes"] != g.nodes[up]["dtypes"]:
        refusals.append(WORDS("refuse.dtypes"))
    if refusals:
        raise NoMatch(BASE_WORDS("own_matcher", pattern=pattern.label, reason=refusals[0]), nodes)
    return [(gate, "gate", True), (up, "up", True), *silu, (mul, "mul", True)]


# ====================================================================== rewrite

def _gate_name(ctx: RewriteContext, chain, gate_node) -> str:
    """The gate's activation (``GATES``) as the chain applies it to ``gate_node``; ``UseGeneric`` otherwise."""
    act, sigmoid = ctx.node(chain, "act"), ctx.node(chain, "sigmoid")
    if sigmoid is None:
        name = aten.activation_name(act)
        if name in GATES and act.args[0] is gate_node:
            return name
    elif (aten.aten_name(sigmoid) == "sigmoid" and sigmoid.args[0] is gate_node                # gate * sigmoid(gate)
          and aten.aten_name(act) == "mul" and set(act.args[:2]) == {gate_node, sigmoid}):
        return "silu"
    raise UseGeneric(WORDS("generic.not_silu"))


def _gate_up_attrs(key: str, weight: torch.Tensor, bias: torch.Tensor | None) -> tuple[dict, NewAttr, NewAttr | None]:
    """The one GEMM's packed gate/up weight (and bias) as new graph attributes named after ``key``: the tensors to
    register, and the weight's and bias's arguments (None without a bias)."""
    tensors = {f"{key}_gate_up_weight": weight}
    bias_arg = None
    if bias is not None:
        tensors[f"{key}_gate_up_bias"] = bias
        bias_arg = NewAttr(f"{key}_gate_up_bias")
    return tensors, NewAttr(f"{key}_gate_up_weight"), bias_arg


def _rewrite_packed(ctx: RewriteContext, chain) -> edit.Edit:
    """Phi-3: one packed projection split in two halves, ``act(gate) * up``: the same GEMM (its rows reordered
    once where the model's gate is the second half), then the packed kernel on its column views."""
    lin_node, mul = ctx.node(chain, "packed"), ctx.node(chain, "mul")
    lin = aten.linear_args(lin_node)
    if lin is None:
        raise UseGeneric(WORDS("generic.not_linear"))
    members = set(ctx.members(chain))
    split = next(n for n in members if n.op == "call_function" and n.args and n.args[0] is lin_node)
    out = aten.node_val(lin_node)
    items = [u for u in split.users if aten.aten_name(u) == "getitem"]
    args = aten.args_of(split)
    two_i = out.shape[-1] if isinstance(out, torch.Tensor) else None
    dim = args.get("dim", 0)
    sizes = args.get("chunks", args.get("split_size", args.get("split_sizes")))
    if aten.aten_name(split) == "chunk":
        even = sizes == 2                                                  # chunk(2, -1)
    elif isinstance(sizes, int):
        even = two_i is not None and sizes * 2 == two_i                    # split(I, -1)
    else:
        even = isinstance(sizes, (list, tuple)) and two_i is not None and list(sizes) == [two_i // 2] * 2
    halves = even and two_i % 2 == 0 and isinstance(dim, int) and dim % out.dim() == out.dim() - 1
    if not halves or len(items) != 2 or sorted(u.args[1] for u in items) != [0, 1]:
        raise UseGeneric(WORDS("generic.split"))
    by_index = {u.args[1]: u for u in items}
    gate_item = next(u for u in items if u in {a for a in ctx.node(chain, "act").args[:1]}
                     or (ctx.node(chain, "sigmoid") is not None and ctx.node(chain, "sigmoid").args[0] is u))
    up_item = by_index[1 - gate_item.args[1]]
    act = _gate_name(ctx, chain, gate_item)
    if set(mul.args[:2]) != {ctx.node(chain, "act"), up_item}:
        raise UseGeneric(WORDS("generic.product"))
    i = two_i // 2
    weight = ctx.constant(lin.weight, BASE_WORDS("weight"))
    bias = ctx.constant(lin.bias, BASE_WORDS("bias")) if lin.bias is not None else None
    if gate_item.args[1] == 1:                                            # up first: gate rows to the front, once
        weight = torch.cat([weight[i:], weight[:i]])
        bias = torch.cat([bias[i:], bias[:i]]) if bias is not None else None
    tensors, weight_arg, bias_arg = _gate_up_attrs(lin_node.name, weight, bias)
    elementwise = select_swiglu(ctx.device, ctx.run_dtype(mul), act=act)
    choice = Choice("one_gemm_" + elementwise.impl, WORDS("label.packed", i=i, label=elementwise.label),
                    elementwise.fused)
    return edit.whole_chain_edit(ctx, chain, fused_swiglu, (lin.input, weight_arg, bias_arg,
                                                            i, act), choice, tensors=tensors)


def rewrite(ctx: RewriteContext, chain, kernel: str) -> edit.Edit:
    """gate, up, silu, mul → one GEMM over ``[W_gate; W_up]`` and the packed silu*mul kernel (GeGLU's gelu gate
    alike; a packed projection: ``_rewrite_packed``)."""
    if ctx.node(chain, "packed") is not None:
        return _rewrite_packed(ctx, chain)
    gate, up = (aten.linear_args(ctx.node(chain, r)) for r in ("gate", "up"))
    act, mul = ctx.node(chain, "act"), ctx.node(chain, "mul")
    if gate is None or up is None:
        raise UseGeneric(WORDS("generic.not_linear"))
    if gate.input is not up.input:
        raise Refuse(WORDS("refuse.inputs"))
    gate_act_name = _gate_name(ctx, chain, ctx.node(chain, "gate"))
    if set(mul.args[:2]) != {act, ctx.node(chain, "up")}:
        raise UseGeneric(WORDS("generic.product"))
    weights = [ctx.constant(lin.weight, BASE_WORDS("weight")) for lin in (gate, up)]
    biases = [ctx.constant(lin.bias, BASE_WORDS("bias")) if lin.bias is not None else None for lin in (gate, up)]
    try:
        weight, bias, sizes = concat_weights(weights, biases)
    except ValueError as exc:
        raise Refuse(str(exc)) from None
    if sizes[0] != sizes[1]:
        raise Refuse(WORDS("refuse.widths", gate=sizes[0], up=sizes[1]))
    tensors, weight_arg, bias_arg = _gate_up_attrs(ctx.node(chain, "gate").name, weight, bias)
    elementwise = select_swiglu(ctx.device, ctx.run_dtype(mul), act=gate_act_name)
    label = WORDS("label.one_gemm", gate=sizes[0], up=sizes[1], label=elementwise.label)
    impl = "one_gemm_" + elementwise.impl
    x_val = aten.node_val(gate.input)
    if gate_act_name == "silu" and isinstance(x_val, torch.Tensor) and x_val.dim() >= 1:
        m, k = x_val.numel() // max(1, x_val.shape[-1]), int(weight.shape[1])
        decision = epilogue_decision(ctx.device, ctx.run_dtype(mul), m, k, sizes[0],
                                     Choice(impl, label, True))       # the pass's selection, asked above
        if decision.fused:
            label, impl = WORDS("label.epilogue", two_i=2 * sizes[0]), "gemm_epilogue"
        note = epilogue_note(m, k, sizes[0])
        if note is not None:
            label = WORDS("label.with_note", label=label, note=note)
    choice = Choice(impl, label, True)   # one GEMM fewer either way
    args = (gate.input, weight_arg, bias_arg, sizes[0])
    return edit.whole_chain_edit(ctx, chain, fused_swiglu, args + ((gate_act_name,) if gate_act_name != "silu" else ()),
                                 choice, tensors=tensors)


# ====================================================================== lowering (lean graphs)

def _lower(gm, node, device, dtype) -> bool:
    """fused_swiglu → ``swiglu_epilogue`` with its tile where ``epilogue_decision`` chooses the epilogue for this
    shape, else ``linear`` over the concatenated weights, then ``silu_mul_packed`` handed the pass's impl (the
    kernel ``select_swiglu`` picked at the rewrite): the same kernels, without the wrapper's frame and without
    asking the selection again. A call fused for another target asks it here, once."""
    x, weight, bias, intermediate = node.args[:4]
    act = node.args[4] if len(node.args) > 4 else "silu"
    x_val = aten.node_val(x)
    w = edit.attr_tensor(gm, weight)
    choice = edit.planned(node, device, dtype)
    if choice is None:
        elementwise = select_swiglu(device, dtype, act=act)
        choice = Choice("one_gemm_" + elementwise.impl, elementwise.label, elementwise.fused)
    impl = elementwise_impl(choice)
    if act == "silu" and isinstance(x_val, torch.Tensor) and x_val.dim() >= 1 and w is not None:
        decision = epilogue_decision(device, dtype, x_val.numel() // max(1, x_val.shape[-1]), w.shape[1],
                                     intermediate, choice)
        if decision.fused and decision.measurement is not None and decision.measurement.variant == "interleaved":
            b = edit.attr_tensor(gm, bias) if bias is not None else None
            if bias is None or b is not None:
                w_il, b_il = gemm_kernels.interleave_gate_up(w, b)              # once, for this graph
                names = [edit.register_buffer(gm, f"{weight.target}_interleaved".replace(".", "_"), w_il)]
                if b_il is not None:
                    names.append(edit.register_buffer(gm, f"{bias.target}_interleaved".replace(".", "_"), b_il))
                with gm.graph.inserting_before(node):
                    attrs = [gm.graph.get_attr(n) for n in names]
                return edit.replace_node(gm, node, lambda g: g.call_function(
                    swiglu_epilogue_interleaved, (x, attrs[0], attrs[1] if len(attrs) > 1 else None,
                                                  decision.tiles)))
        if decision.fused:
            paired = decision.measurement is None or decision.measurement.variant == "paired"
            return edit.replace_node(gm, node, lambda g: g.call_function(
                swiglu_epilogue, (x, weight, bias, intermediate, decision.tiles if paired else None)))

    def build(g: torch.fx.Graph) -> torch.fx.Node:
        gu = g.call_function(torch._C._nn.linear, (x, weight, bias))                   # (..., 2I)
        kwargs = {"act": act} if act != "silu" else {}
        out = g.call_function(silu_mul_packed, (gu, intermediate, impl), kwargs)       # (..., I)
        out.meta["fused_bound"] = impl                                                 # handed it: asks nothing
        return out

    return edit.replace_node(gm, node, build)


LOWERINGS = {fused_swiglu: _lower}

#: Targets a lean CUDA graph binds per node (``triton_support.BoundCall``): Triton launches only.
BOUND_CALLS = (swiglu_epilogue, swiglu_epilogue_interleaved, silu_mul_packed)


# ====================================================================== patterns

#: Which families this one must claim nodes before or after (explorer.fusions.order).
RUNS_BEFORE = ("linear", "siblings")   # its gate projection and SiLU are not a linear epilogue

PATTERNS = (
    Pattern(
        name="swiglu", label=WORDS("swiglu.label"),
        steps=(Step(frozenset({"linear"}), "gate"), Step(frozenset({"sigmoid"}), "sigmoid", optional=True),
               Step(frozenset({"silu", "mul", "gelu"}), "act"),
               Step(frozenset({"linear"}), "up"), Step(frozenset({"mul"}), "mul")),
        match=_match_swiglu, color="#aec7e8", rewrite=rewrite,
        implementation=WORDS("swiglu.implementation"),
        explanation=WORDS("swiglu.explanation"),
        caveats=(PRECISION_CAVEAT, WORDS("swiglu.caveat"),
                 PAYS_CAVEAT, WORDS("epilogue.teach")),
        formula=WORDS("swiglu.formula"),
    ),
)
