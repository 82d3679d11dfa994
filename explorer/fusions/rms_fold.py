"""The RMSNorm γ fold: RMSNorm's weight folded into the linears that read the normalised row.

::

    unfused                                                folded (inference only)
    x ─► RMSNorm(γ) ─► y = γ·n ─┬─► linear(W_q) ─► q        x ─► RMSNorm(unit) ─► n ─┬─► linear(W_q·diag γ) ─► q
    n = x·rsqrt(mean(x²)+ε)     ├─► linear(W_k) ─► k        (no weight load,         ├─► linear(W_k·diag γ) ─► k
                                └─► linear(W_v) ─► v         no multiply)            └─► linear(W_v·diag γ) ─► v

    with the add (Add+RMSNorm):  s = x + r;  n = s·rsqrt(mean(s²)+ε);  the readers as above

The algebra is exact, like folding BatchNorm into a convolution: a linear reads
``y = γ ⊙ n`` as ``W y = W diag(γ) n = W' n`` with ``W' = W·diag(γ)`` (column j of W
scaled by γ_j), computed once in float64 when the plan is applied (``fold_rms_gamma``).
Gemma's RMSNorm scales by ``(1 + γ)``; the fold takes that scale too (``offset=1``).

Where: every reader of the normalised row must be a linear reading it as its input
(through views that keep the last dimension: the decoder's last norm is sliced to
the last position before the LM head), with a weight that is a parameter only that
linear reads. Near misses, each with its reason: a reader that is not a linear (the
row also goes to a residual add), a weight computed in the graph, a weight another op
reads too (tied), a view that reshapes the row, a γ computed in the graph.

After the fold the sibling linears (QKV, gate/up: ``explorer.fusions.siblings``) and
the SwiGLU chain read the folded weights: a fold's edit is applied as soon as it is
planned (``Edit.weights``), before the chains after it are planned. The norm itself is
the Add+RMSNorm / RMSNorm kernel of ``explorer.fusions.rms_norm`` without its weight
(``rms_norm.plan_norm(..., unit=True)``): one load and one multiply less per element. This family is the
RMSNorm family's fold variant (``EXTENDS = "rms_norm"``): the one family it imports.

Numerics: the rounding point moves. Unfused (bf16), the row is rounded, multiplied by γ
and rounded again before the GEMM reads it; folded, the row is rounded once and γ sits
inside the weight, rounded once with it. Against float64 both carry about one rounding
of the GEMM's operands (``tests/test_fusion_rms_fold.py`` measures both); they differ from
each other in the last bits: fusion can change numerics.

Valid only for inference: γ must be a constant parameter (the model in eval, not training).
"""

from __future__ import annotations

import dataclasses

import networkx as nx
import torch
import torch.fx

from explorer.fusions import edit, rms_norm
from explorer.fusions.base import WORDS as BASE_WORDS
from explorer.fusions.base import PRECISION_CAVEAT, Choice, NoMatch, Pattern, Step
from explorer.fusions.claims import is_epilogue_claim
from explorer.fusions.edit import Refuse, RewriteContext
from explorer.graph import aten
from explorer.words import Words

#: What this family says to a person, in English and 中文 (rendered by explorer.ui.i18n by id).
WORDS = Words("rms_fold", {
    "title": ("RMSNorm γ folded into the linears", "RMSNorm 的 γ 折叠进线性层"),
    "add_rms_fold.label": ("Add+RMSNorm, γ folded", "Add+RMSNorm（γ 折叠）"),
    "rms_fold.label": ("RMSNorm, γ folded", "RMSNorm（γ 折叠）"),
    "implementation": (("γ folded into the weights of the linears that read the row (W' = W·diag(γ), exact, "
                        "once); the norm as one Triton kernel without its weight"),
                       "γ 折叠进读取这一行的线性层的权重（W' = W·diag(γ)，精确，只算一次）；归一化用一个不带权重的 Triton 内核"),
    "explanation": (("Every reader of the normalised row is a linear, so RMSNorm's scale γ can move into their "
                     "weights: W·(γ ⊙ n) = (W·diag(γ))·n. This is exact algebra, like folding BatchNorm into a "
                     "convolution, done once when the plan is applied. The norm then writes the unit row only: "
                     "no weight to load, no multiply, and nothing else changes for the GEMMs, which read the same "
                     "number of bytes. It composes with the sibling linears (the QKV and gate/up GEMMs concatenate "
                     "the folded weights) and with the residual add before the norm."),
                    ("归一化后的这一行的每个读取者都是线性层，所以 RMSNorm 的缩放 γ 可以移进它们的权重：W·(γ ⊙ n) = "
                     "(W·diag(γ))·n。这是精确的代数变换，和把 BN 折叠进卷积一样，在应用计划时只做一次。之后归一化只写出单位 γ "
                     "的行：不用加载权重，也没有乘法；各个 GEMM 读取的字节数不变。它可以和并列线性层组合（QKV 和 gate/up 的 "
                     "GEMM 拼接折叠后的权重），也可以和归一化之前的残差相加组合。")),
    "formula": ("W' = W·diag(γ);  y = x·rsqrt(mean(x²) + ε);  W'·y = W·(γ ⊙ x·rsqrt(mean(x²) + ε))",
                "W' = W·diag(γ)；  y = x·rsqrt(mean(x²) + ε)；  W'·y = W·(γ ⊙ x·rsqrt(mean(x²) + ε))"),
    "caveat.inference": (("Folding γ is valid only for inference: γ must be a constant parameter (the model in "
                          "eval); training changes γ every step and the folded weights would be stale."),
                         "γ 折叠只在推理时成立：γ 必须是常量参数（模型处于 eval 模式）；训练时 γ 每一步都在变，折叠后的权重就过时了。"),
    "caveat.rounding": (("Fusion can change numerics: the rounding point moves. Unfused, the normalised row is "
                         "rounded to the dtype, multiplied by γ and rounded again before the GEMM reads it; folded, "
                         "the row is rounded once and γ is rounded inside the weight W·diag(γ). Against float64 "
                         "both are one rounding of the GEMM's operands (tests/test_fusion_rms_fold.py measures "
                         "them); they differ from each other in the last bits."),
                        ("融合会改变数值：舍入的位置变了。未融合时，归一化后的行先舍入到该数据类型，乘以 γ 后再舍入一次，然后才被 "
                         "GEMM 读取；折叠后，这一行只舍入一次，γ 则在权重 W·diag(γ) 里和权重一起舍入。与 float64 相比，两者都相当于对 "
                         "GEMM 的操作数做一次舍入（tests/test_fusion_rms_fold.py 测量了这两者）；它们彼此只在最后几位上不同。")),
    "label.folded": ("γ folded into {readers} (exact) + {label}, without the weight load",
                     "γ 折叠进 {readers}（精确） + {label}，不加载权重"),
    "label.folded_plain": ("γ folded into {readers} (exact) + {label}", "γ 折叠进 {readers}（精确） + {label}"),
    "label.folded_eager": ("γ folded into {readers} (exact); the norm as eager ops without γ",
                           "γ 折叠进 {readers}（精确）；归一化用不带 γ 的 eager 算子"),
    "refuse.reader": ("the normalised row also goes to {op}, not a linear: only a linear's weight can absorb γ",
                      "归一化后的行还流向 {op}，它不是线性层：只有线性层的权重能吸收 γ"),
    "refuse.input": ("{op} reads the normalised row as its weight, not its input", "{op} 把归一化后的行当作权重读取，而不是输入"),
    "refuse.view": ("{op} reshapes the normalised row before a reader (its last dimension changes)",
                    "{op} 在读取之前改变了归一化后的行的形状（最后一维变了）"),
    "refuse.weight_computed": ("{op}'s weight is computed in the graph, not a parameter: there is nothing to fold into",
                               "{op} 的权重是在计算图中算出来的，不是参数：没有可以折叠进去的地方"),
    "refuse.tied": (("{op}'s weight is also read by {n} other op(s) (tied): folding γ into it would change them "
                     "too"),
                    "{op} 的权重还被另外 {n} 个算子读取（共享权重）：把 γ 折叠进去也会改变它们"),
    "refuse.gamma": ("the RMSNorm scale {op} is computed in the graph, not a constant parameter: cannot fold",
                     "RMSNorm 的缩放 {op} 是在计算图中算出来的，不是常量参数：无法折叠"),
    "refuse.no_reader": ("nothing but the graph's output reads the normalised row", "除了计算图的输出，没有算子读取归一化后的行"),
    "refuse.dtype": ("γ is {gamma}, the row {row}: the folded row would change dtype",
                     "γ 是 {gamma}，这一行却是 {row}：折叠后这一行的数据类型会改变"),
})

#: The fold itself, in float64, against the same product computed in float64: exact up to float64 rounding.
FOLD_TOLERANCE_F64 = 1e-12

#: Folded (unit norm + W·diag γ) and unfused computations against float64, relative L2 error of the readers'
#: outputs. Both carry one rounding of the GEMM operands (u: fp32 6e-8, fp16 4.9e-4, bf16 3.9e-3) and the
#: GEMM's own accumulation: relative L2 <= 2u (a sum of independent roundings is far below its worst case).
READER_TOLERANCES = {torch.float32: 1e-5, torch.float16: 1e-3, torch.bfloat16: 8e-3}

#: Ops a normalised row may pass through on its way to a reader, when they keep its last dimension as it is.
_ROW_VIEWS = frozenset({"view", "reshape", "_unsafe_view", "unsqueeze", "squeeze", "alias", "detach", "clone",
                        "contiguous", "dropout", "slice", "getitem"})


# ====================================================================== the arithmetic

def fold_rms_gamma(weight: torch.Tensor, gamma: torch.Tensor, offset: float = 0.0) -> torch.Tensor:
    """``W' = W·diag(offset + γ)``: a linear's weight ``(out, N)`` with column j scaled by ``offset + γ_j``.

    ``gamma``: ``(N,)``. Computed in float64, returned in the weight's dtype and device; the inputs
    are not modified. ``offset=1`` folds Gemma's ``(1 + γ)``.
    """
    if weight.dim() != 2 or gamma.dim() != 1 or weight.shape[1] != gamma.shape[0]:
        raise ValueError(f"weight {tuple(weight.shape)} and γ {tuple(gamma.shape)}: need (out, N) and (N,)")
    scale = gamma.detach().to(torch.float64) + offset                          # (N,)
    return (weight.detach().to(torch.float64) * scale[None, :].to(weight.device)).to(weight.dtype)


def rms_fold_reference(x: torch.Tensor, gamma: torch.Tensor, weights, eps: float,
                       residual: torch.Tensor | None = None) -> tuple[torch.Tensor, ...]:
    """Unfused: (add +) ``LlamaRMSNorm(x)`` with γ, then each linear ``F.linear(y, W_i)``."""
    s = x if residual is None else x + residual                              # (..., N)
    y = rms_norm.rms_norm_reference(s, gamma, eps)                            # (..., N)
    return tuple(torch.nn.functional.linear(y, w) for w in weights)


def rms_fold_folded(x: torch.Tensor, gamma: torch.Tensor, weights, eps: float,
                    residual: torch.Tensor | None = None) -> tuple[torch.Tensor, ...]:
    """Folded: the unit (add +) RMSNorm kernel (no weight), then each linear on ``W_i·diag(γ)``."""
    if residual is None:
        n = rms_norm.rms_norm(x, None, eps)                                   # (..., N)
    else:
        n = rms_norm.add_rms_norm(x, residual, None, eps, keep_sum=False)[1]
    return tuple(torch.nn.functional.linear(n, fold_rms_gamma(w, gamma)) for w in weights)


# ====================================================================== eager targets (the fold stage)

def fused_add_rms_norm_folded_eager(x, residual, weight, eps):
    """``(x + residual, RMSNorm(x + residual))`` as eager ops, γ already folded into the readers (``weight`` None)."""
    return rms_norm.add_rms_norm_reference(x, residual, weight, eps)


def fused_add_rms_norm_folded_eager_normed(x, residual, weight, eps):
    """``RMSNorm(x + residual)`` as eager ops without γ (folded into the readers); the sum is not kept."""
    return rms_norm.add_rms_norm_reference(x, residual, weight, eps, keep_sum=False)[1]


def fused_rms_norm_folded_eager(x, weight, eps):
    """``RMSNorm(x)`` as eager ops without γ (folded into the readers)."""
    return rms_norm.rms_norm_reference(x, weight, eps)


_EAGER = {"add": fused_add_rms_norm_folded_eager, "add_normed": fused_add_rms_norm_folded_eager_normed,
          "rms": fused_rms_norm_folded_eager}


# ====================================================================== matching (on the graph)

def _row_view(g: nx.DiGraph, node: str, hidden: int) -> bool:
    """Whether ``node`` passes the row on with its last dimension as it is (a view over leading dims)."""
    attrs = g.nodes[node]
    name = str(attrs.get("target", "")).split(".")[1] if "." in str(attrs.get("target", "")) else ""
    shapes = attrs.get("shapes") or [[]]
    if name not in _ROW_VIEWS or not shapes[0] or shapes[0][-1] != hidden:
        return False
    if name == "slice":
        sl = attrs.get("slice")
        return sl is not None and sl[0] != len(shapes[0]) - 1
    return True


def graph_readers(g: nx.DiGraph, out: str, hidden: int) -> tuple[list[str], str | None, str | None]:
    """The linears reading node ``out``'s row (through row views), or the first refusal: ``(linears, reason,
    offending node)``."""
    linears: list[str] = []
    frontier = [out]
    while frontier:
        node = frontier.pop(0)
        succ = sorted(g.successors(node), key=lambda s: g.nodes[s]["order"])
        for s in succ:
            attrs = g.nodes[s]
            kind = attrs["kind"]
            if kind == "linear":
                if attrs.get("first_input") != node:
                    return linears, WORDS("refuse.input", op=s), s
                if not attrs.get("const_weight"):
                    return linears, WORDS("refuse.weight_computed", op=s), s
                if attrs.get("weight_users", 1) > 1:
                    return linears, WORDS("refuse.tied", op=s, n=attrs["weight_users"] - 1), s
                linears.append(s)
            elif kind == "output":
                return linears, WORDS("refuse.no_reader"), s
            elif _row_view(g, s, hidden):
                frontier.append(s)
            elif kind in ("view", "dropout"):
                return linears, WORDS("refuse.view", op=s), s
            else:
                return linears, WORDS("refuse.reader", op=f"{kind} ({s})"), s
    if not linears:
        return linears, WORDS("refuse.no_reader"), out
    return linears, None, None


def _constant_scale(g: nx.DiGraph, mul: str, row: str, hidden: int) -> list[str] | str:
    """The nodes computing the other operand of the scale ``mul`` from constants only (Gemma's ``1 + γ`` is
    ``to(γ) + 1``), in graph order; or the node that makes it not constant (a graph input reaches it, or
    something else reads its steps), as a string."""
    others = [p for p in g.predecessors(mul) if p != row]
    if len(others) != 1:
        return mul
    top = others[0]
    if (g.nodes[top].get("shapes") or [[]])[0] != [hidden]:
        return top
    seen, frontier = [], [top]
    while frontier:
        node = frontier.pop()
        if node in seen:
            continue
        seen.append(node)
        if g.nodes[node]["kind"] == "input" or len(seen) > 4:
            return top
        frontier += list(g.predecessors(node))
    inside = set(seen) | {mul}
    if any(set(g.successors(n)) - inside for n in seen):
        return top
    return sorted(seen, key=lambda n: g.nodes[n]["order"])


def _fold_matcher(inner):
    """A matcher for the fold over an RMSNorm matcher of ``explorer.fusions.rms_norm``: the norm as it matches
    there, γ (role ``gamma``) required, every reader of its output a linear it can fold into."""
    def match(g: nx.DiGraph, pattern: Pattern, anchor: str, claimed: dict[str, str]) -> list:
        try:
            matched = inner(g, pattern, anchor, claimed)
        except NoMatch as why:
            # the norm's own near misses are the RMSNorm pattern's to report (it runs next, on the same nodes), but
            # for the add it gives up to a projection's GEMM epilogue: that one is the fold's too (it runs first)
            if is_epilogue_claim(why.reason):
                raise
            raise NoMatch(None, why.nodes) from None
        nodes = [n for n, _, _ in matched]
        roles = {r: n for n, r, _ in matched}
        last = nodes[-1]
        hidden = (g.nodes[last].get("shapes") or [[0]])[0][-1]
        tail: list[tuple[str, str, bool]] = []
        if "weight" not in roles:
            succ = list(g.successors(last))
            if not (len(succ) == 1 and g.nodes[succ[0]]["kind"] == "mul"
                    and not g.nodes[succ[0]].get("scalar_operand")):
                raise NoMatch(None, nodes)    # no γ: nothing to fold (RMSNorm's plain pattern takes it)
            scale = _constant_scale(g, succ[0], last, hidden)
            if isinstance(scale, str):
                raise NoMatch(WORDS("refuse.gamma", op=scale), nodes + succ)
            # Gemma's (1 + γ), or another scale computed from constants only: folded as its value
            tail = [(n, "gamma_const", True) for n in scale] + [(succ[0], "gamma", True)]
            last = succ[0]
            after = list(g.successors(last))
            kind = g.nodes[after[0]]["kind"] if len(after) == 1 else None
            # Gemma's ``.type_as(x)`` reads x for its dtype only
            if (kind in rms_norm.CASTS and list(g.predecessors(after[0])) == [last]) or kind == "type_as":
                tail.append((after[0], "cast_scaled", True))
                last = after[0]
        _, why, offender = graph_readers(g, last, hidden)
        if why is not None:
            raise NoMatch(why, nodes + [n for n, _, _ in tail] + [offender])
        return [(n, "gamma" if r == "weight" else r, c) for n, r, c in matched] + tail

    match.__doc__ = f"The γ fold over ``rms_norm.{inner.__name__}`` (see ``_fold_matcher``)."
    return match


# ====================================================================== rewrite (on the fx graph)

def _passes_row(node: torch.fx.Node, hidden: int) -> bool:
    """The fx twin of ``_row_view``."""
    name = aten.aten_name(node)
    val = aten.node_val(node)
    if name not in _ROW_VIEWS or not isinstance(val, torch.Tensor) or val.dim() == 0 or val.shape[-1] != hidden:
        return False
    if name == "slice":
        dim = aten.args_of(node).get("dim", 0)
        return isinstance(dim, int) and dim % val.dim() != val.dim() - 1
    return True


def fx_readers(out: torch.fx.Node, hidden: int) -> tuple[list[torch.fx.Node], list[torch.fx.Node]]:
    """``(linears, views)``: the linears reading ``out``'s row and the row views on the way; ``Refuse`` with the
    reason where another op reads it (the graph's check, repeated on what the rewrite edits)."""
    linears, views, frontier = [], [], [out]
    while frontier:
        node = frontier.pop(0)
        for user in node.users:
            if aten.is_ignored(user):
                continue
            if aten.kind_of(user) == "linear":
                lin = aten.linear_args(user)
                if lin is None or lin.input is not node:
                    raise Refuse(WORDS("refuse.input", op=user.name))
                linears.append(user)
            elif _passes_row(user, hidden):
                views.append(user)
                frontier.append(user)
            else:
                raise Refuse(WORDS("refuse.reader", op=f"{aten.aten_name(user)} ({user.name})"))
    if not linears:
        raise Refuse(WORDS("refuse.no_reader"))
    return linears, views


def _reader_weight(ctx: RewriteContext, lin: torch.fx.Node) -> tuple[str, torch.Tensor]:
    """``(get_attr target, tensor)`` of a reader's weight, refusing a computed or shared (tied) one."""
    weight = aten.linear_args(lin).weight
    if not (isinstance(weight, torch.fx.Node) and weight.op == "get_attr"):
        raise Refuse(WORDS("refuse.weight_computed", op=lin.name))
    tensor = ctx.constant(weight, BASE_WORDS("weight"))
    sharing = [n for n in ctx.gm.graph.nodes if n.op == "get_attr" and n is not weight
               and (n.target == weight.target or (isinstance(v := aten.attr_value(ctx.gm, n.target), torch.Tensor)
                                                  and v.data_ptr() == tensor.data_ptr() and v.numel()))]
    users = [u for u in weight.users if u is not lin] + [u for n in sharing for u in n.users]
    if users:
        raise Refuse(WORDS("refuse.tied", op=lin.name, n=len(users)))
    return str(weight.target), tensor


def _short(target: str) -> str:
    """``model.layers.0.self_attn.q_proj.weight`` -> ``q_proj``."""
    parts = target.split(".")
    return parts[-2] if len(parts) >= 2 else target


def _fold_edit(ctx: RewriteContext, chain, eager: bool) -> edit.Edit:
    """The unit norm's edit with the readers' weights folded (``Edit.weights``)."""
    norm_edit, gamma_node = rms_norm.plan_norm(ctx, chain, unit=True, targets=_EAGER if eager else None)
    if gamma_node is None:
        raise Refuse(WORDS("refuse.gamma", op=chain.node_for("gamma")))
    consts = [ctx.by_name[n] for n, r in chain.roles if r == "gamma_const"]
    if consts:   # a scale computed from constants (Gemma's 1 + γ): its value, from the graph's own ops
        sub, inputs = edit.extract_subgraph(ctx.gm, consts, [gamma_node], attrs_as_placeholders=False)
        if inputs:
            raise Refuse(WORDS("refuse.gamma", op=gamma_node.name))
        with torch.no_grad():
            gamma = sub()
    else:
        gamma = ctx.constant(gamma_node, WORDS("refuse.gamma", op=gamma_node.name))
    result = ctx.by_name[chain.roles[-1][0]]
    row_dtype = edit.dtype_of(result)
    if gamma.dtype != row_dtype:
        raise Refuse(WORDS("refuse.dtype", gamma=gamma.dtype, row=row_dtype))
    hidden = int(gamma.shape[0])
    linears, _ = fx_readers(result, hidden)
    weights = {}
    for lin in linears:
        target, w = _reader_weight(ctx, lin)
        weights[target] = fold_rms_gamma(w, gamma)
    readers = ", ".join(_short(t) for t in weights)
    label = (WORDS("label.folded_eager", readers=readers) if eager
             else WORDS("label.folded" if norm_edit.choice.fused else "label.folded_plain", readers=readers,
                        label=norm_edit.choice.label))
    return dataclasses.replace(norm_edit, weights=weights,
                               choice=Choice(norm_edit.choice.impl, label, norm_edit.choice.fused or eager))


def rewrite(ctx: RewriteContext, chain, kernel: str) -> edit.Edit:
    """(add →) RMSNorm without γ as one kernel call; γ folded into every reader's weight."""
    return _fold_edit(ctx, chain, eager=False)


def fold(ctx: RewriteContext, chain) -> edit.Edit:
    """The fold stage: γ folded into the readers, the norm as the eager ops without γ."""
    return _fold_edit(ctx, chain, eager=True)


def alone(gm: torch.fx.GraphModule, chain) -> tuple[list[torch.fx.Node], list[torch.fx.Node]]:
    """A fold chain timed alone holds its readers (their weights change): ``(readers and views, outputs)`` where
    the outputs are the readers' and the sum the chain also writes."""
    by_name = {n.name: n for n in gm.graph.nodes}
    result = by_name[chain.roles[-1][0]]
    val = aten.node_val(result)
    linears, views = fx_readers(result, int(val.shape[-1]))
    return views + linears, [by_name[n] for n in chain.extra_outputs] + linears


# ====================================================================== patterns

def _steps(first: tuple[Step, ...]) -> tuple[Step, ...]:
    """The norm's steps with γ required (role ``gamma``)."""
    norm = tuple(dataclasses.replace(s, role="gamma", optional=False) if s.role == "weight" else s
                 for s in rms_norm.NORM_STEPS)
    return first + norm


#: Which families this one must claim nodes before or after (explorer.fusions.order): the norm is the fold's
#: before it is RMSNorm's.
RUNS_BEFORE = ("rms_norm",)

#: The family this one is a variant of (tests/test_layers.py: the one family a family may import). The fold matches
#: the RMSNorm family's own chains through its matchers (``match_add_rms_norm``, ``match_rms_norm``, ``CASTS``,
#: ``NORM_STEPS``), plans the norm by its rewrite (``plan_norm(..., unit=True)``) and runs its kernels without γ:
#: it moves γ into the linears and leaves the rest to rms_norm. The RMSNorm kernels and references (``rms_norm``,
#: ``add_rms_norm``, their ``*_reference``, ``TOLERANCES``) are still rms_norm.py's: by ``explorer.fusions.kernels``'
#: rule they belong in ``kernels/`` beside ``layer_norm``, a move left for when rms_norm.py's launch tables and
#: recorded choices are not being edited elsewhere (they were, on two branches, when this was declared).
EXTENDS = "rms_norm"

_CAVEATS = (WORDS("caveat.inference"), WORDS("caveat.rounding"), PRECISION_CAVEAT)

PATTERNS = (
    Pattern(
        name="add_rms_fold", label=WORDS("add_rms_fold.label"),
        steps=_steps((Step(frozenset({"add"}), "add", emits=True),
                      Step(rms_norm.CASTS, "cast_in", optional=True, emits=True))),
        match=_fold_matcher(rms_norm.match_add_rms_norm), color="#8c564b", rewrite=rewrite, fold=fold,
        alone=alone, implementation=WORDS("implementation"), explanation=WORDS("explanation"),
        caveats=_CAVEATS, formula=WORDS("formula"),
    ),
    Pattern(
        name="rms_fold", label=WORDS("rms_fold.label"),
        steps=_steps(()),
        match=_fold_matcher(rms_norm.match_rms_norm), color="#e7969c", rewrite=rewrite, fold=fold,
        alone=alone, implementation=WORDS("implementation"), explanation=WORDS("explanation"),
        caveats=_CAVEATS, formula=WORDS("formula"),
    ),
)
