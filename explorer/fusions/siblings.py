"""Sibling linears (horizontal fusion): several projections of one input as one GEMM.

::

    unfused                                   fused
    x ─► linear(W_1, b_1) ─► y_1              x ─► linear(W_1|W_2|W_3, b_1|b_2|b_3) ─► Y
    x ─► linear(W_2, b_2) ─► y_2                   y_i = Y[..., o_i : o_i + n_i]  (column views)
    x ─► linear(W_3, b_3) ─► y_3
    (x read 3 times, 3 launches)              (x read once, 1 launch)

``concat_weights`` stacks the weights along the output dimension (and the biases
alike) once, when the plan is applied; ``packed_linear`` then runs one
``F.linear`` and splits its output into views, with no copy (both the shared packed
GEMM, ``explorer.fusions.kernels.packed_gemm``, with its reference; the fused call is
marked ``packed_gemm_call`` so that rotary's QKV epilogue finds it). Each ``y_i`` has
the unfused output's shape but not its strides: row stride ``sum(n_i)`` instead
of ``n_i``. The rewrite refuses a group whose outputs are viewed in a way a
column slice does not allow (it would need a copy).

Numerics: each output column is the same dot product over the same ``x`` row;
the library may pick another GEMM algorithm for the wider matrix, so results
can differ from the unfused ones at the dtype's rounding (``TOLERANCES``).
"""

from __future__ import annotations

import torch
import torch.fx

from explorer.fusions import edit
from explorer.fusions.base import WORDS as BASE_WORDS
from explorer.fusions.base import PAYS_CAVEAT, PRECISION_CAVEAT, Choice, Pattern, Step
from explorer.fusions.edit import NewAttr, Refuse, RewriteContext
from explorer.fusions.kernels.packed_gemm import PACKED_TOLERANCES, concat_weights, packed_gemm_call, packed_linear
from explorer.graph import aten
from explorer.words import Words

#: What this family says to a person, in English and 中文 (rendered by explorer.ui.i18n by id).
WORDS = Words("siblings", {
    "title": ("Sibling linears (Q, K, V)", "并列线性层（Q、K、V）"),
    "linear_siblings.label": ("Sibling linears (QKV)", "并列线性层（QKV）"),
    "linear_siblings.implementation": (("one GEMM over the concatenated weights (W_1|W_2|...), its output split "
                                        "into column views: no copy"),
                                       "一个 GEMM 作用在拼接后的权重（W_1|W_2|...）上，输出切成列视图：没有拷贝"),
    "linear_siblings.explanation": (("Horizontal fusion: a transformer layer projects the same input three times, "
                                     "for the queries, keys and values. One GEMM with the three weight matrices "
                                     "side by side reads the input once instead of three times and costs one "
                                     "launch instead of three; each projection is then a column slice of the one "
                                     "output. Nothing is saved in the outputs: they are all still written, "
                                     "because each is read afterwards."),
                                    ("横向融合：Transformer 层对同一个输入做三次投影，得到查询、键和值。把三个权重矩阵并排放在一个 GEMM "
                                     "里，输入只读一次而不是三次，内核启动也只要一次而不是三次；每个投影就是这一个输出的列切片。输出上没有节省：它们仍然都要写出，因为之后都会被读取。")),
    "linear_siblings.caveat": (("The outputs are column slices of one buffer: a consumer that needs them "
                                "contiguous (a flattening view) makes the rewrite refuse the group."),
                               "输出是同一块缓冲区的列切片：若某个使用者要求它们连续（展平视图），重写就会拒绝这一组。"),
    "refuse.view": ("{user} views {branch} in a way a column slice does not allow (it would need a copy)",
                    "{user} 对 {branch} 的 view 方式是列切片做不到的（需要一次拷贝）"),
    "refuse.not_linear": ("a sibling is not a plain linear", "有一个并列分支不是普通的线性层"),
    "refuse.inputs": ("the siblings do not read the same input", "并列分支读取的不是同一个输入"),
    "label.one_gemm": ("one GEMM over {n} concatenated weights ({columns} columns), split into views",
                       "对 {n} 个拼接的权重做一次 GEMM（{columns} 列），再切分成视图"),
})


TOLERANCES = PACKED_TOLERANCES  # a GEMM's error model: see explorer.fusions.kernels.packed_gemm


@packed_gemm_call
def fused_linear_siblings(x, weight, bias, sizes):
    """Sibling projections of ``x`` as one GEMM over concatenated weights: a tuple of column views."""
    return packed_linear(x, weight, bias, sizes)


# ====================================================================== rewrite

def _check_column_views(branches: list[torch.fx.Node], sizes: list[int]) -> None:
    """Refuse when a consumer views a branch output in a way its column slice does not allow.

    Every ``view`` user of a branch is replayed on a meta tensor with the slice's
    strides (row stride ``sum(sizes)``); ``view`` fails there exactly when it
    would fail on the real slice.
    """
    width = sum(sizes)
    for branch, size in zip(branches, sizes):
        val = aten.node_val(branch)
        if not isinstance(val, torch.Tensor):
            raise Refuse(BASE_WORDS("no_shape", node=branch.name))
        piece = torch.empty((*val.shape[:-1], width), device="meta", dtype=val.dtype)[..., :size]
        for user in branch.users:
            if aten.aten_name(user) != "view":
                continue
            try:
                piece.view(aten.args_of(user)["size"])
            except RuntimeError:
                raise Refuse(WORDS("refuse.view", user=user.name, branch=branch.name)) from None


def rewrite(ctx: RewriteContext, chain, kernel: str) -> edit.Edit:
    """Sibling linears → one GEMM over their concatenated weights, split into column views."""
    branches = [ctx.by_name[n] for n in chain.compute_nodes]
    lins = [aten.linear_args(b) for b in branches]
    if any(lin is None for lin in lins):
        raise Refuse(WORDS("refuse.not_linear"))
    x = lins[0].input
    if any(lin.input is not x for lin in lins):
        raise Refuse(WORDS("refuse.inputs"))
    weights = [ctx.constant(lin.weight, BASE_WORDS("weight")) for lin in lins]
    biases = [ctx.constant(lin.bias, BASE_WORDS("bias")) if lin.bias is not None else None for lin in lins]
    try:
        weight, bias, sizes = concat_weights(weights, biases)
    except ValueError as exc:
        raise Refuse(str(exc)) from None
    _check_column_views(branches, sizes)
    key = branches[0].name
    tensors = {f"{key}_cat_weight": weight}
    bias_arg = None
    if bias is not None:
        tensors[f"{key}_cat_bias"] = bias
        bias_arg = NewAttr(f"{key}_cat_bias")
    choice = Choice("one_gemm", WORDS("label.one_gemm", n=len(sizes), columns="+".join(map(str, sizes))), True)
    return edit.Edit(chain, tuple(branches), tuple(branches), fused_linear_siblings,
                     (x, NewAttr(f"{key}_cat_weight"), bias_arg, sizes), choice, tensors=tensors,
                     tuple_result=True)


def _lower(gm, node, device, dtype) -> bool:
    """fused_linear_siblings → ``linear`` over the concatenated weights, then ``split_with_sizes`` (column views)."""
    x, weight, bias, sizes = node.args
    return edit.replace_node(gm, node, lambda g: g.call_function(
        torch.split_with_sizes, (g.call_function(torch._C._nn.linear, (x, weight, bias)), list(sizes), -1)))


LOWERINGS = {fused_linear_siblings: _lower}

#: Which families this one must claim nodes before or after (explorer.fusions.order).
RUNS_AFTER = ("*",)   # horizontal fusion of the linears no chain claimed

PATTERNS = (
    Pattern(
        name="linear_siblings", label=WORDS("linear_siblings.label"),
        steps=(Step(frozenset({"linear"}), "branch"),), siblings=True, kernels=("auto",),
        color="#bcbd22", rewrite=rewrite,
        implementation=WORDS("linear_siblings.implementation"),
        explanation=WORDS("linear_siblings.explanation"),
        caveats=(PRECISION_CAVEAT,
                 WORDS("linear_siblings.caveat"), PAYS_CAVEAT),
    ),
)
