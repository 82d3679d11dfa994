"""The linear + residual family: a linear layer whose output is added to the residual stream, in the GEMM's epilogue.

::

    unfused (2 kernels)                              fused (1 kernel)
    x ─► linear(W, b) ─► y ─► HBM ─► + r ─► out      x ─► GEMM + bias + r (epilogue) ─► out
                                     ▲ residual                       ▲ r read in the epilogue
    (y written once and read back once)              (y never reaches device memory)

A transformer's attention output projection and its MLP's down projection end in
``x + linear(h)``; a ResNet-style MLP block ends in ``linear(h) + x``. Unfused, the
add is a kernel of its own that reads the GEMM's output and the residual and
writes the sum; in the epilogue it is one more read of the residual while the
output tile is still in registers.

The kernel is the shared Triton GEMM with its epilogue (``kernels.gemm``: fp32
accumulation, bias and residual added before the one rounding). ``select_linear_residual``
is the one decision, for a device and dtype: ``triton_gemm`` where Triton runs (CUDA,
or the CPU under ``TRITON_INTERPRET=1``) in fp32/fp16/bf16, else ``separate``
(``F.linear`` then ``add_`` in place, one kernel each). ``linear_residual_reference``
is the unfused computation; ``TOLERANCES`` are the GEMM epilogue's.

The add a decoder writes after o_proj and down_proj (``residual + proj(h)``, transformers' Llama and
Qwen2 as captured) is also the first op of the Add+RMSNorm after it: two fusions want one add.
``explorer.fusions.claims.residual_home(m, k, n)`` is the one decision, from measurement per shape
(``claims.RESIDUAL_EPILOGUE_WINS``); the Add+RMSNorm matchers (``explorer.fusions.rms_norm``) ask it
and step aside where the epilogue wins, and this family's matcher (``_match_linear_residual``) reports
the add the Add+RMSNorm kept as a near miss with the measured reason; the Add+RMSNorm reports the add
it gave up the same way (``claims.WORDS``).
"""

from __future__ import annotations

import torch

from explorer.fusions import edit
from explorer.fusions.base import PAYS_CAVEAT, PRECISION_CAVEAT, Chain, Choice, NoMatch, Pattern, Step, selection
from explorer.fusions.base import WORDS as BASE_WORDS
from explorer.fusions.claims import NORM_PATTERNS, projection_shape, residual_home
from explorer.fusions.edit import RewriteContext, UseGeneric
from explorer.fusions.kernels.common import TRITON_DTYPES
from explorer.fusions.kernels.gemm import TOLERANCES, gemm_applies, gemm_epilogue  # noqa: F401 (the error model)
from explorer.fusions.triton_support import no_triton, triton_runs_on, where
from explorer.graph import aten
from explorer.vocab import TRANSPARENT
from explorer.words import Words

#: What this family says to a person, in English and 中文 (rendered by explorer.ui.i18n by id).
WORDS = Words("linear_residual", {
    "title": ("Linear + residual add", "线性层 + 残差相加"),
    "label": ("Linear+bias+residual", "Linear+偏置+残差"),
    "explanation": (("A projection that ends the block adds its output to the residual stream. In the GEMM's "
                     "epilogue the residual is read while the output tile is still in registers: the projection's "
                     "output is never written to device memory and read back, and the add costs no launch of its "
                     "own."),
                    "结束一个块的投影把输出加到残差流上。在 GEMM 的尾处理中，输出分块还在寄存器里时就读入残差：投影的输出不再写回显存再读出，相加也不再单独占用一次内核启动。"),
    "implementation": ("one Triton GEMM with bias and residual in its epilogue (fp32 accumulation, one rounding)",
                       "一个在尾处理中加偏置和残差的 Triton GEMM（fp32 累加，只舍入一次）"),
    "formula": ("out = x Wᵀ + b + r", "out = x Wᵀ + b + r"),
    "caveat.rounding": (("The unfused graph rounds the projection to the dtype before the add; the epilogue adds "
                         "in fp32 and rounds once, so 16-bit outputs can differ by one rounding step."),
                        "未融合的计算图在相加之前先把投影结果舍入到该数据类型；尾处理用 fp32 相加、只舍入一次，所以 16 位输出可能相差一个舍入步长。"),
    "label.triton": ("triton GEMM+bias+residual (1 kernel)", "triton GEMM+bias+残差（1 个内核）"),
    "label.separate": ("linear + add_ in place (2 kernels)", "linear + 原地 add_（2 个内核）"),
    "label.reference": ("linear + add_ in place (2 kernels: {why})", "linear + 原地 add_（2 个内核：{why}）"),
    "why.dtype": ("dtype {dtype} is not one of fp32, fp16, bf16", "数据类型 {dtype} 不是 fp32、fp16、bf16 之一"),
    "refuse.constant": ("add of a constant, not a residual", "加的是常量，不是残差"),
    "refuse.broadcast": ("the residual's shape {shape} differs from the linear output {out} (broadcast)",
                         "残差的形状 {shape} 与线性层输出 {out} 不同（广播）"),
    "refuse.view": ("a view reshapes the linear output before the add", "相加之前有一个视图改变了线性层输出的形状"),
    "refuse.dtype": ("the residual is {dtype}, the linear output {out}", "残差是 {dtype}，线性层输出却是 {out}"),
    "generic.not_plain": ("{op} is not a plain linear", "{op} 不是普通的线性层"),
    "refuse.norm_wins": ("the residual add stays with {chain} (cuBLAS + the fused Add+RMSNorm) at M={m}, K={k}, N={n}: {why}",
                         "残差相加留在 {chain}（cuBLAS + 融合的 Add+RMSNorm），M={m}、K={k}、N={n}：{why}"),
    "generic.weight": ("the weight is not a 2-D constant", "权重不是二维常量"),
})


# ====================================================================== the reference and the kernel choice

def linear_residual_reference(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                              r: torch.Tensor) -> torch.Tensor:
    """Unfused, as the model runs it: ``F.linear(x, weight, bias) + r`` (``x``: ``(..., in)``, ``r``: ``(..., out)``)."""
    return torch.nn.functional.linear(x, weight, bias) + r


@selection
def select_linear_residual(device: torch.device | str, dtype: torch.dtype, separate: bool = False) -> Choice:
    """The one decision of how ``x @ Wᵀ + b + r`` runs on ``device`` in ``dtype``: ``triton_gemm`` (one kernel) or
    ``separate`` (the linear, then ``add_`` in place)."""
    device = torch.device(device)
    if separate:
        return Choice("separate", WORDS("label.separate"), False)
    if not triton_runs_on(device):
        return Choice("separate", WORDS("label.reference", why=no_triton(device)), False)
    if dtype not in TRITON_DTYPES:
        return Choice("separate", WORDS("label.reference", why=WORDS("why.dtype", dtype=dtype)), False)
    return Choice("triton_gemm", where(WORDS("label.triton"), device), True)


def linear_residual(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, r: torch.Tensor,
                    separate: bool = False) -> torch.Tensor:
    """``x @ weightᵀ + bias + r`` as ``select_linear_residual`` decides for these tensors (a graph that was not
    made lean: a lean one calls ``linear_residual_gemm`` or the separate ops, as the rewrite chose)."""
    if select_linear_residual(x.device, x.dtype, separate).impl == "triton_gemm":
        return linear_residual_gemm(x, weight, bias, r)
    return torch.nn.functional.linear(x, weight, bias).add_(r)


def linear_residual_gemm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                         r: torch.Tensor) -> torch.Tensor:
    """``x @ weightᵀ + bias + r`` by the GEMM kernel where it takes the operands (``gemm_applies``: one dtype,
    one device, ``r`` of the output's shape; no autograd), else the separate ops: what the choice
    ``triton_gemm`` runs."""
    n, k = weight.shape
    forward_only = not (torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad))   # no backward kernel
    if forward_only and tuple(r.shape) == (*x.shape[:-1], n) and x.shape[-1] == k:
        a, z = x.reshape(-1, k), r.reshape(-1, n)                              # (M, K), (M, N): views where they can be
        if gemm_applies(a, weight, z) and a.shape[0] > 0:
            return gemm_epilogue(a, weight, bias, z, "none").reshape(*x.shape[:-1], n)   # (..., N)
    return torch.nn.functional.linear(x, weight, bias).add_(r)


# ====================================================================== fused call targets

def fused_linear_residual(x, weight, bias, r):
    """``x @ weightᵀ + bias + r``: one Triton GEMM with the residual in its epilogue where it runs."""
    return linear_residual(x, weight, bias, r)


def fused_linear_residual_separate(x, weight, bias, r):
    """Kernel choice "separate_epilogue": the linear with its bias, then ``add_`` of the residual in place."""
    return linear_residual(x, weight, bias, r, separate=True)


# ====================================================================== rewrite

def rewrite(ctx: RewriteContext, chain: Chain, kernel: str) -> edit.Edit:
    """linear → add(r) as one call; "separate_epilogue" runs the linear, then the add in place."""
    edit.only_identity_views(ctx, chain)
    lin_node, add = ctx.node(chain, "linear"), ctx.node(chain, "add")
    lin = aten.linear_args(lin_node)
    if lin is None:
        raise UseGeneric(WORDS("generic.not_plain", op=aten.aten_name(lin_node)))
    w = aten.static_shape(lin.weight)
    if w is None or len(w) != 2:
        raise UseGeneric(WORDS("generic.weight"))
    edit.check_alpha(add)
    r = edit.other_operand(add, set(ctx.members(chain)))
    separate = kernel == "separate_epilogue"
    choice = select_linear_residual(ctx.device, ctx.run_dtype(lin_node), separate)
    target = fused_linear_residual_separate if separate else fused_linear_residual
    return edit.whole_chain_edit(ctx, chain, target, (lin.input, lin.weight, lin.bias, r),
                                 edit.epilogue_choice(ctx, choice, separate, BASE_WORDS("gemm_epilogue")))


# ====================================================================== lowering (lean graphs)

def _lower(gm: torch.fx.GraphModule, node: torch.fx.Node, device: torch.device, dtype: torch.dtype,
           separate: bool) -> bool:
    """The fused call as what its choice names (the rewrite's, for this device and dtype: ``edit.planned``;
    else the selection's): ``linear_residual_gemm``, or ``linear`` then ``add_`` in place."""
    x, weight, bias, r = node.args
    choice = edit.planned(node, device, dtype) or select_linear_residual(device, dtype, separate)
    if choice.impl == "triton_gemm":
        node.target = linear_residual_gemm
        return True
    if choice.impl != "separate":
        return False
    return edit.replace_node(gm, node, lambda g: g.call_method(
        "add_", (g.call_function(torch._C._nn.linear, (x, weight, bias)), r)))


#: fused call target -> lowering(gm, node, device, dtype) -> bool (explorer.runtime.lean)
LOWERINGS = {
    fused_linear_residual: lambda gm, node, device, dtype: _lower(gm, node, device, dtype, separate=False),
    fused_linear_residual_separate: lambda gm, node, device, dtype: _lower(gm, node, device, dtype, separate=True),
}

#: Targets a lean CUDA graph binds per node (``triton_support.BoundCall``): Triton launches only.
BOUND_CALLS = (linear_residual_gemm,)


# ====================================================================== patterns

def _residual(g, node: str, ctx: dict) -> str | None:
    """The add's other operand is a tensor of the graph with the linear output's shape and dtype (a residual), and
    what lies between the linear and the add does not reshape its output (an eval dropout may: it is the identity)."""
    prev = ctx["prev"]
    if g.nodes[prev]["shapes"][:1] != g.nodes[ctx["prev_real"]]["shapes"][:1]:
        return WORDS("refuse.view")
    others = [s for s in g.predecessors(node) if s != prev and s not in ctx["chain"]]
    if not others:
        return WORDS("refuse.constant")
    out_shape, out_dtype = g.nodes[prev]["shapes"][:1], g.nodes[prev]["dtypes"][:1]
    for src in others:
        if g.nodes[src]["shapes"][:1] != out_shape:
            return WORDS("refuse.broadcast", shape=g.nodes[src]["shapes"][:1], out=out_shape)
        if g.nodes[src]["dtypes"][:1] != out_dtype:
            return WORDS("refuse.dtype", dtype=g.nodes[src]["dtypes"][0], out=out_dtype[0])
    return None


def _match_linear_residual(g, pattern: Pattern, anchor: str, claimed: dict[str, str]) -> list:
    """``linear ─► (identity views) ─► add(r)`` (its matcher): as the steps would match it, and where an Add+RMSNorm
    chain kept the add (``residual_home``: cuBLAS + the fused Add+RMSNorm is faster there), a near miss saying so."""
    node, path = anchor, []
    while True:
        succ = sorted(g.successors(node), key=lambda s: g.nodes[s]["order"])
        if len(succ) != 1:
            raise NoMatch(None, [anchor, *path])
        if g.nodes[succ[0]]["kind"] not in TRANSPARENT:
            break
        node = succ[0]
        path.append(node)
    add = succ[0]
    nodes = [anchor, *path, add]
    if g.nodes[add]["kind"] != "add":
        raise NoMatch(None, nodes)
    taken = next((n for n in nodes if n in claimed), None)
    if taken is not None:
        owner = claimed[taken]
        shape = projection_shape(g, anchor)
        if taken == add and owner.split("@")[0] in NORM_PATTERNS and shape is not None:
            _, why = residual_home(*shape)
            m, k, n = shape
            raise NoMatch(WORDS("refuse.norm_wins", chain=owner, why=why, m=m, k=k, n=n), nodes)
        raise NoMatch(BASE_WORDS("already_in_chain", op=g.nodes[taken]["kind"], chain=owner), nodes)
    reason = _residual(g, add, {"chain": {anchor, *path}, "prev": path[-1] if path else anchor, "prev_real": anchor})
    if reason:
        raise NoMatch(reason, nodes)
    return [(anchor, "linear", True), *((p, "view", False) for p in path), (add, "add", True)]


#: Which families this one must claim nodes before or after (explorer.fusions.order): an add that starts an Add+Norm
#: chain, or ends a ConvNeXt or SwiGLU block, is theirs (an Add+RMSNorm's only where ``residual_home`` says so).
RUNS_AFTER = ("linear", "norm", "rms_norm", "convnext", "swiglu")

PATTERNS = (
    Pattern(
        name="linear_residual", label=WORDS("label"), stage="activation",
        steps=(Step(frozenset({"linear"}), "linear"), Step(frozenset({"add"}), "add", guard=_residual)),
        match=_match_linear_residual,
        color="#aec7e8", kernels=("auto", "separate_epilogue", "inductor"), rewrite=rewrite,
        implementation=WORDS("implementation"), explanation=WORDS("explanation"), formula=WORDS("formula"),
        caveats=(PRECISION_CAVEAT, WORDS("caveat.rounding"), PAYS_CAVEAT),
    ),
)
