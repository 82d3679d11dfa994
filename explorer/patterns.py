"""The fusion pattern registry: every pattern the explorer knows, declared once.

A pattern is data: an ordered list of steps, each a set of op kinds, with
optional steps, guards that return a readable refusal, and a flag for steps
whose output may leave the chain as an extra output of the fused kernel. The
command line, the statistics, the app's legend and checkboxes and the tests
all read ``PATTERNS``; nothing else spells a pattern name.

Registry order is match priority: earlier patterns claim nodes first.

    conv_bn_add_act          matmul_softmax                  add_layer_norm
    ---------------          --------------                  --------------
      x                        q     k^T                       x     residual
      |                         \\   /                           \\   /
     conv                       matmul                            add ----> (sum kept:
      |                          |  * scale (opt)                  |         extra output)
     bn                          |  + mask  (opt)              layer_norm
      |   z (residual)         softmax                             |
      |  /                       |  (dropout, eval)
     add                       matmul (opt: whole attention block)
      |
     relu

    linear_siblings (horizontal: one input, several projections)
    ---------------
          x                      x
        / | \\        ==>         |
    linear linear linear   linear(W_q|W_k|W_v)
      q     k     v              |  split (views, no copy)
                               q  k  v
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Optional

import networkx as nx

from explorer import ops

Guard = Callable[[nx.DiGraph, str, dict], Optional[str]]

CONV_ACTS = frozenset({"relu", "relu6", "silu", "gelu", "hardswish"})
LINEAR_ACTS = frozenset({"relu", "gelu", "silu", "tanh"})


@dataclasses.dataclass(frozen=True)
class Step:
    """One op of a pattern.

    kinds     op kinds accepted here
    role      the step's name in the pattern (``conv``, ``bn``, ``act`` ...)
    optional  the chain may skip this step
    family    kinds recognised as "this sort of op" but not supported here:
              meeting one yields a near miss "X not supported"
    emits     this op's output may also be used outside the chain; the fused
              kernel then writes it as an extra output
    guard     (graph, node, context) -> refusal reason or None
    """

    kinds: frozenset[str]
    role: str
    optional: bool = False
    family: frozenset[str] = frozenset()
    emits: bool = False
    guard: Guard | None = None


@dataclasses.dataclass(frozen=True)
class Pattern:
    """A fusion pattern: what it matches, how it is fused, and why it pays."""

    name: str
    label: str
    steps: tuple[Step, ...]
    color: str
    implementation: str
    explanation: str
    stage: str  # the seed's staged table: "conv_bn", "activation", "other"
    caveats: tuple[str, ...] = ()
    formula: str = ""
    kernels: tuple[str, ...] = ("auto", "inductor")  # kernel choices a plan may name (KERNEL_CHOICES)
    siblings: bool = False  # the steps are parallel consumers of one input, not a dataflow chain

    @property
    def joiner(self) -> str:
        """How a chain's ops are written: in sequence, or side by side (siblings)."""
        return " ∥ " if self.siblings else " → "

    @property
    def anchor_kinds(self) -> frozenset[str]:
        return self.steps[0].kinds


#: What a plan's per-chain kernel choice means (``Plan.kernels``; each pattern lists its own).
KERNEL_CHOICES: dict[str, str] = {
    "auto": "the pattern's fused kernel where it applies on the device (the default)",
    "separate_epilogue": ("the GEMM or convolution with its bias, then the residual add and the activation "
                          "in place: one kernel more, no cuDNN/cuBLASLt fused epilogue (BatchNorm still folded)"),
    "inductor": "the chain's subgraph compiled by torch.compile's inductor, as the generic fallback does",
}
_EPILOGUE_KERNELS = ("auto", "separate_epilogue", "inductor")


# ------------------------------------------------------------------ guards

def _bn_inference(g: nx.DiGraph, node: str, ctx: dict) -> str | None:
    if g.nodes[node].get("training"):
        return "BatchNorm in training mode: folding is valid only for inference (frozen statistics)"
    return None


def _same_shape_add(g: nx.DiGraph, node: str, ctx: dict) -> str | None:
    """The residual operand of a fused conv+add must have the conv output's shape."""
    prev = ctx["prev"]
    out_shape = g.nodes[prev]["shapes"][:1]
    for src in g.predecessors(node):
        if src == prev or src in ctx["chain"]:
            continue
        if g.nodes[src]["shapes"][:1] != out_shape:
            return f"add operand shape {g.nodes[src]['shapes'][:1]} differs from the conv output {out_shape} (broadcast)"
    if g.in_degree(node) == 1:
        return "add of a constant, not a residual"
    return None


def _scalar_scale(g: nx.DiGraph, node: str, ctx: dict) -> str | None:
    if g.nodes[node].get("scalar_operand") or g.in_degree(node) == 1:
        return None
    return "scale is a tensor, not a constant"


def _last_dim_norm(g: nx.DiGraph, node: str, ctx: dict) -> str | None:
    if g.nodes[node].get("norm_dims", 1) != 1:
        return "LayerNorm normalizes over more than the last dimension"
    return None


def _probs_left_operand(g: nx.DiGraph, node: str, ctx: dict) -> str | None:
    if g.nodes[node].get("first_input") != ctx["prev"]:
        return "softmax output is not the left operand of the next MatMul"
    return None


# ------------------------------------------------------------------ registry

_CONV = Step(frozenset({"conv"}), "conv")
_BN = Step(frozenset({"batch_norm"}), "bn", guard=_bn_inference)
_CONV_ACT = Step(CONV_ACTS, "act", family=ops.ACTIVATIONS)
_RES_ADD = Step(frozenset({"add"}), "add", guard=_same_shape_add)

_CONV_ADD_WHY = (
    "The residual add and the activation run in the convolution's epilogue: the conv output "
    "is never written to device memory and read back, and the add and the activation cost no "
    "launch of their own."
)
_CONV_BN_FORMULA = (
    "W' = W * gamma / sqrt(var + eps)  (per output channel);  "
    "b' = (b - mean) * gamma / sqrt(var + eps) + beta"
)
_FOLD_CAVEAT = ("BatchNorm folding is valid only for inference: in training the batch statistics "
                "change every step, so the folded weights would be wrong.")
_PRECISION_CAVEAT = ("Fusion reorders arithmetic: expect output differences near the dtype's rounding "
                     "(about 1e-6 relative in fp32, 1e-3 in fp16 and bf16).")
_PAYS_CAVEAT = ("Not every fusion pays: a fused kernel that is slower than the library kernels it "
                "replaces (register pressure, a worse algorithm choice) makes the model slower. Measure.")

PATTERNS: tuple[Pattern, ...] = (
    Pattern(
        name="matmul_softmax",
        label="MatMul+Softmax",
        steps=(
            Step(frozenset({"matmul"}), "scores"),
            Step(frozenset({"mul", "div"}), "scale", optional=True, guard=_scalar_scale),
            Step(frozenset({"add"}), "mask", optional=True),
            Step(frozenset({"softmax"}), "softmax"),
            Step(frozenset({"matmul"}), "context", optional=True, guard=_probs_left_operand),
        ),
        color="#d62728",
        implementation=("one Triton kernel for scores->softmax; scaled_dot_product_attention "
                        "(flash attention) when the chain ends in the second MatMul"),
        explanation=("Attention scores (Q K^T, scaled and masked) are sized seq x seq per head: the "
                     "largest intermediates in a transformer. Fusing the MatMul with the scale, the "
                     "mask and the softmax keeps each row of scores in registers; adding the second "
                     "MatMul (the whole attention block) means the seq x seq matrix never reaches "
                     "device memory at all."),
        stage="other",
        caveats=(_PRECISION_CAVEAT, "Softmax is computed in fp32 inside the kernel even for fp16 inputs."),
    ),
    Pattern(
        name="conv_bn_add_act",
        kernels=_EPILOGUE_KERNELS,
        label="Conv+BN+Add+act",
        steps=(_CONV, _BN, _RES_ADD, _CONV_ACT),
        color="#1f77b4",
        implementation="BatchNorm folded into the conv; cuDNN conv+bias+add+ReLU in one kernel",
        explanation="The residual block's tail. " + _CONV_ADD_WHY,
        stage="activation",
        caveats=(_FOLD_CAVEAT, _PRECISION_CAVEAT, _PAYS_CAVEAT),
        formula=_CONV_BN_FORMULA,
    ),
    Pattern(
        name="conv_add_act",
        kernels=_EPILOGUE_KERNELS,
        label="Conv+Add+act",
        steps=(_CONV, _RES_ADD, _CONV_ACT),
        color="#17becf",
        implementation="cuDNN conv+bias+add+ReLU in one kernel",
        explanation=("Conv, residual add and activation, BatchNorm already folded (as ONNX exporters "
                     "do). " + _CONV_ADD_WHY),
        stage="activation",
        caveats=(_PRECISION_CAVEAT, _PAYS_CAVEAT),
    ),
    Pattern(
        name="conv_bn_act",
        kernels=_EPILOGUE_KERNELS,
        label="Conv+BN+act",
        steps=(_CONV, _BN, _CONV_ACT),
        color="#2ca02c",
        implementation="BatchNorm folded into the conv; cuDNN conv+bias+ReLU in one kernel (other "
                       "activations: folded conv, then the activation in place)",
        explanation=("The seed's first example: conv -> temp1 -> bn -> temp2 -> relu is three launches "
                     "and two intermediates written and read back. Folding BN into the conv's weights "
                     "removes one op exactly; running the activation in the conv's epilogue removes the "
                     "other."),
        stage="activation",
        caveats=(_FOLD_CAVEAT, _PRECISION_CAVEAT, _PAYS_CAVEAT),
        formula=_CONV_BN_FORMULA,
    ),
    Pattern(
        name="conv_act",
        kernels=_EPILOGUE_KERNELS,
        label="Conv+act",
        steps=(_CONV, _CONV_ACT),
        color="#98df8a",
        implementation="cuDNN conv+bias+ReLU in one kernel",
        explanation=("Convolution with its activation in the epilogue (BatchNorm already folded, as "
                     "ONNX exporters do): the pre-activation tensor is never written out."),
        stage="activation",
        caveats=(_PRECISION_CAVEAT, _PAYS_CAVEAT),
    ),
    Pattern(
        name="conv_bn",
        label="Conv+BN",
        steps=(_CONV, _BN),
        color="#ff7f0e",
        implementation="BatchNorm folded into the conv's weight and bias (exact algebra, no kernel)",
        explanation=("In inference BatchNorm is a per-channel affine map, so it folds into the "
                     "convolution's weights: one op and one intermediate disappear at no cost."),
        stage="conv_bn",
        caveats=(_FOLD_CAVEAT, _PRECISION_CAVEAT),
        formula=_CONV_BN_FORMULA,
    ),
    Pattern(
        name="linear_act",
        kernels=_EPILOGUE_KERNELS,
        label="Linear+bias+act",
        steps=(Step(frozenset({"linear"}), "linear"), Step(LINEAR_ACTS, "act", family=ops.ACTIVATIONS)),
        color="#9467bd",
        implementation="cuBLASLt bias+activation epilogue (torch._addmm_activation) for ReLU/GELU",
        explanation=("The GEMM's epilogue adds the bias and applies the activation while the output "
                     "tile is still in registers: the pre-activation tensor (4x hidden wide in a "
                     "transformer MLP) is never written out."),
        stage="activation",
        caveats=(_PRECISION_CAVEAT, _PAYS_CAVEAT),
    ),
    Pattern(
        name="add_layer_norm",
        label="Add+LayerNorm",
        steps=(Step(frozenset({"add"}), "add", emits=True),
               Step(frozenset({"layer_norm"}), "layer_norm", guard=_last_dim_norm)),
        color="#8c564b",
        implementation=("one Triton kernel that writes the normalized output, and the sum too where "
                        "something else reads it (a pre-norm residual stream)"),
        explanation=("The residual add and the LayerNorm each read and write the whole activation. "
                     "One kernel reads both operands once, keeps the row in registers for the "
                     "mean and variance, and writes the sum (the residual stream needs it) and the "
                     "normalized row."),
        stage="other",
        caveats=(_PRECISION_CAVEAT, "Statistics are accumulated in fp32 even for fp16/bf16 inputs."),
    ),
    Pattern(
        name="elementwise_chain",
        label="Elementwise chain",
        steps=(
            Step(ops.ELEMENTWISE - {"where"}, "op"),
            Step(ops.ELEMENTWISE - {"where"}, "op"),
            Step(ops.ELEMENTWISE - {"where"}, "op", optional=True),
            Step(ops.ELEMENTWISE - {"where"}, "op", optional=True),
            Step(ops.ELEMENTWISE - {"where"}, "op", optional=True),
        ),
        color="#e377c2",
        implementation="the chain's subgraph compiled on its own by torch.compile's inductor (generic fallback)",
        explanation=("Consecutive pointwise ops are memory-bound: each reads and writes the whole "
                     "tensor. One kernel reads the inputs once and writes the result once."),
        stage="other",
        caveats=(_PAYS_CAVEAT,),
    ),
    Pattern(
        name="linear_siblings",
        label="Sibling linears (QKV)",
        steps=(Step(frozenset({"linear"}), "branch"),),
        siblings=True,
        kernels=("auto",),
        color="#bcbd22",
        implementation=("one GEMM over the concatenated weights (W_1|W_2|...), its output split into "
                        "column views: no copy"),
        explanation=("Horizontal fusion: a transformer layer projects the same input three times, for the "
                     "queries, keys and values. One GEMM with the three weight matrices side by side reads "
                     "the input once instead of three times and costs one launch instead of three; each "
                     "projection is then a column slice of the one output. Nothing is saved in the "
                     "outputs: they are all still written, because each is read afterwards."),
        stage="other",
        caveats=(_PRECISION_CAVEAT,
                 "The outputs are column slices of one buffer: a consumer that needs them contiguous "
                 "(a flattening view) makes the rewrite refuse the group.", _PAYS_CAVEAT),
    ),
)

BY_NAME: dict[str, Pattern] = {p.name: p for p in PATTERNS}

UNKNOWN_COLOR = "#7f7f7f"

# "Already fused" ops: reported as near misses of the pattern they would have been.
ALREADY_FUSED: dict[str, str] = {"sdpa": "matmul_softmax"}


def get_pattern(name: str) -> Pattern:
    try:
        return BY_NAME[name]
    except KeyError:
        from explorer.errors import PlanError

        raise PlanError(f"unknown pattern '{name}': known patterns are {', '.join(BY_NAME)}") from None


def color_of(pattern_name: str) -> str:
    p = BY_NAME.get(pattern_name)
    return p.color if p else UNKNOWN_COLOR
