"""What a family's ``rewrite`` returns, and the helpers it plans with.

A rewrite never touches the graph. It reads the chain's nodes (by role, through
``RewriteContext``), checks what its kernel needs, computes new weights if any
(a folded BatchNorm) and returns one ``Edit``: the nodes to remove, the fused
call to insert (``target(*args)``), where its result goes, and the ``Choice``
that names the implementation. ``explorer.fusions.rewrite`` applies the edits
of a plan one after another on a copy of the graph.

Two exceptions carry a rewrite's "no": ``Refuse`` (a guard says the chain must
stay unfused: status "refused", the message is the reason) and ``UseGeneric``
(the specialised kernel does not take this chain: the generic fallback, the
chain compiled by inductor, takes it instead).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Iterable

import torch
import torch.fx

from explorer.fusions.base import WORDS, Chain, Choice
from explorer.graph import aten
from explorer.vocab import Target


class Refuse(Exception):
    """A guard said no (status "refused"): the message is the reason."""


class UseGeneric(Exception):
    """The specialised kernel does not take this chain; run the generic fallback (message: why)."""


@dataclasses.dataclass(frozen=True)
class NewAttr:
    """A tensor (or module) the edit registers on the graph module, referenced in the call's arguments."""

    key: str


@dataclasses.dataclass(frozen=True)
class Edit:
    """One planned rewrite: replace ``remove`` by ``target(*args)``; reroute ``outputs``' users.

    With ``tuple_result`` the call returns a tuple and ``outputs[i]``'s users read
    item ``i`` (``None`` entries are items nothing reads). ``tensors`` and
    ``modules`` are registered on the graph module under fresh names and
    referenced through ``NewAttr(key)`` in ``args``. ``weights`` (a fold into
    ops outside the chain: RMSNorm's γ into the linears that read it) maps
    ``get_attr`` targets to the values that replace theirs; such an edit is
    applied as soon as it is planned, so that the chains planned after it
    (sibling linears concatenating those weights) read the folded values.
    ``parts`` are the choices of calls a lowering makes of its own for a part of the chain (ConvNeXt's hidden
    linear, a ``fused_linear_act``), decided here with the chain's: recorded on the fused call
    (``node.meta["fused_parts"]``) and handed to the part's call by ``hand_part``.
    """

    chain: Chain
    remove: tuple[torch.fx.Node, ...]
    outputs: tuple[torch.fx.Node | None, ...]
    target: Callable
    args: tuple
    choice: Choice
    tensors: dict[str, torch.Tensor] = dataclasses.field(default_factory=dict)
    modules: dict[str, torch.nn.Module] = dataclasses.field(default_factory=dict)
    tuple_result: bool = False
    weights: dict[str, torch.Tensor] = dataclasses.field(default_factory=dict)
    parts: dict[str, Choice] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class RewriteContext:
    """What a rewrite reads: the graph module being rewritten, its nodes by name, and what it is made for: the
    ``target`` (its device resolved: never ``auto``), as a torch ``device`` and the floating ``dtype`` the
    prepared graph runs in (``run_dtype``). A family's selection is asked once per chain, here, for that target;
    the fused call records its ``Choice`` (``planned``)."""

    gm: torch.fx.GraphModule
    by_name: dict[str, torch.fx.Node]
    device: torch.device
    dtype: torch.dtype | None = None    # None: each node's own dtype (the capture's)
    target: Target = Target()

    def run_dtype(self, node: "torch.fx.Node | torch.dtype | None") -> torch.dtype:
        """The dtype ``node`` (or a dtype read from the graph) has when the graph runs for the target: a
        floating one becomes the target's (``prepare_graph`` casts the capture's floating tensors and the
        fused call's inputs to it), any other stays."""
        found = node if isinstance(node, torch.dtype) else dtype_of(node) if node is not None else torch.float32
        return self.dtype if self.dtype is not None and found.is_floating_point else found

    def node(self, chain: Chain, role: str) -> torch.fx.Node | None:
        """The node playing ``role`` in ``chain`` (None when the optional step was skipped)."""
        name = chain.node_for(role)
        return None if name is None else self.by_name[name]

    def members(self, chain: Chain) -> list[torch.fx.Node]:
        return [self.by_name[n] for n in chain.nodes]

    def constant(self, node: Any, what: str) -> torch.Tensor | None:
        """The tensor behind a ``get_attr`` node (None stays None); refuses anything computed."""
        if node is None:
            return None
        if isinstance(node, torch.fx.Node) and node.op == "get_attr":
            value = aten.attr_value(self.gm, node.target)
            if isinstance(value, torch.Tensor):
                return value.detach()
        raise Refuse(WORDS("not_constant", what=what))

    def scalar(self, operand: Any) -> float | None:
        """A Python number, or a one-element constant tensor, as a float; else None."""
        if isinstance(operand, (int, float)) and not isinstance(operand, bool):
            return float(operand)
        if isinstance(operand, torch.fx.Node) and operand.op == "get_attr":
            value = aten.attr_value(self.gm, operand.target)
            if isinstance(value, torch.Tensor) and value.numel() == 1:
                return float(value.item())
        return None


# ---------------------------------------------------------------------- building edits

def whole_chain_edit(ctx: RewriteContext, chain: Chain, target: Callable, args: tuple, choice: Choice,
                     tensors: dict[str, torch.Tensor] | None = None, outputs: list | None = None,
                     tuple_result: bool = False, parts: dict[str, Choice] | None = None) -> Edit:
    """An edit removing every node of ``chain``; the fused call's result replaces its last op
    (``outputs``: the nodes whose users get result[i] when the call returns a tuple; ``parts``: ``Edit.parts``)."""
    members = ctx.members(chain)
    if outputs is None:
        outputs = [ctx.by_name[chain.roles[-1][0]]]
        if chain.extra_outputs:
            raise UseGeneric(WORDS("extra_outputs"))
    check_no_outside_users(members, [o for o in outputs if o is not None])
    return Edit(chain, tuple(members), tuple(outputs), target, tuple(args), choice,
                tensors=dict(tensors or {}), tuple_result=tuple_result, parts=dict(parts or {}))


def check_no_outside_users(remove: list[torch.fx.Node], outputs: list[torch.fx.Node]) -> None:
    """Nodes being removed may be read outside the edit only through ``outputs`` (or by ignorable asserts)."""
    removing = set(remove)
    for node in remove:
        if node in outputs:
            continue
        for user in node.users:
            if user not in removing and not aten.is_ignored(user):
                raise Refuse(WORDS("used_outside", node=node.name, user=user.name))


_IDENTITY_VIEWS = ("dropout", "dropout_", "feature_dropout", "alias", "detach", "getitem")


def through_identity(node: Any, target: torch.fx.Node) -> bool:
    """Whether ``node`` is ``target`` seen through identities (eval dropout, alias, getitem)."""
    while isinstance(node, torch.fx.Node) and node is not target and aten.aten_name(node) in _IDENTITY_VIEWS:
        node = node.args[0]
    return node is target


def is_identity_view(node: torch.fx.Node) -> bool:
    """Whether a fused call may skip ``node``: an eval-mode dropout, ``alias``/``detach``, or ``getitem`` 0 (a
    BatchNorm's output). A training-mode dropout is refused (``Refuse``): it is not an identity."""
    aname = aten.aten_name(node)
    if aname.startswith("dropout") or aname == "feature_dropout":
        if aten.is_training_dropout(node):
            raise Refuse(WORDS("training_dropout"))
        return True
    return aname in ("alias", "detach") or (aname == "getitem" and node.args[1] == 0)


def only_identity_views(ctx: RewriteContext, chain: Chain) -> None:
    """Specialised kernels skip the chain's views: only identities (``is_identity_view``) are allowed."""
    compute = set(chain.compute_nodes)
    for name in chain.nodes:
        if name not in compute and not is_identity_view(ctx.by_name[name]):
            raise UseGeneric(WORDS("op_inside", op=aten.aten_name(ctx.by_name[name])))


def other_operand(node: torch.fx.Node, members: set, allow_scalar: bool = False) -> Any:
    """The operand of a binary op that does not come from the chain."""
    a, b = node.args[0], node.args[1]
    inside = [x in members for x in (a, b)]
    if inside == [True, False]:
        other = b
    elif inside == [False, True]:
        other = a
    else:
        raise UseGeneric(WORDS("operand_unclear", node=node.name))
    if not allow_scalar and not isinstance(other, torch.fx.Node):
        raise UseGeneric(WORDS("adds_constant", node=node.name))
    return other


def check_alpha(node: torch.fx.Node) -> None:
    """Fused adds take ``a + b`` only, not ``a + alpha * b``."""
    binary = aten.binary_args(node)
    if binary is not None and binary.alpha != 1:
        raise UseGeneric(WORDS("alpha", node=node.name))


def dtype_of(node: torch.fx.Node) -> torch.dtype:
    """The dtype of a node's (first) output tensor; float32 when unknown."""
    vals = aten.tensor_vals(node.meta.get("val"))
    return vals[0].dtype if vals else torch.float32


def epilogue_choice(ctx: RewriteContext, choice: Choice, separate: bool, what: str) -> Choice:
    """A GEMM's or a conv's epilogue ``choice`` as the chain's label says it: the plan's kernel choice
    "separate_epilogue" named (``separate``), else the note for a device where the ops run one after another
    (``what``: the fused kernel it lacks). The one composition the conv, linear and linear+residual
    families share."""
    if separate:
        return Choice(choice.impl, WORDS("kernel_separate", label=choice.label), choice.fused)
    if not choice.fused:
        return Choice(choice.impl, not_fused_note(ctx.device, choice.label, what), choice.fused)
    return choice


def planned(node: torch.fx.Node, device: torch.device, dtype: torch.dtype) -> Choice | None:
    """The ``Choice`` the rewrite recorded on a fused call (``node.meta["fused_choice"]``) when it was made for
    this device type and dtype (``node.meta["fused_for"]``: device type, torch dtype, memory format); None for a
    call fused for another target (or by a lowering of its own, or set aside by ``set_aside_for``): the lowering
    then asks the family's selection, its one other caller."""
    choice, made_for = node.meta.get("fused_choice"), node.meta.get("fused_for")
    if isinstance(choice, Choice) and made_for is not None and tuple(made_for[:2]) == (torch.device(device).type,
                                                                                       dtype):
        return choice
    return None


def set_aside_for(node: torch.fx.Node, memory_format: str) -> None:
    """A fused call recorded for another memory format than the one its graph is lowered for is a call fused
    for another target: its recorded choice is set aside (``planned`` then answers None). The conv selection
    reads the memory format (an nchw graph's layouts are the capture's), so its nchw choice is not a
    channels_last one."""
    made_for = node.meta.get("fused_for")
    if made_for is not None and len(made_for) > 2 and made_for[2] != memory_format:
        node.meta.pop("fused_choice", None)


def hand_part(fused: torch.fx.Node, call: torch.fx.Node, part: str) -> None:
    """Record on ``call``, a call a lowering makes for a part of the fused call ``fused``, the choice the rewrite
    made for that part (``Edit.parts``), for the same target as ``fused``'s (``fused_for``): the part's lowering then
    reads it (``planned``) instead of asking its selection. Nothing is recorded where the rewrite decided none."""
    choice = (fused.meta.get("fused_parts") or {}).get(part)
    if isinstance(choice, Choice) and fused.meta.get("fused_for") is not None:
        call.meta["fused_choice"] = choice
        call.meta["fused_for"] = fused.meta["fused_for"]


def bind_choice(node: torch.fx.Node, arity: int, impl: str) -> bool:
    """Pass ``impl`` (a ``Choice.impl``) to a fused call as its argument after its ``arity`` own ones, for a
    family whose fused call follows the choice it is given instead of asking its selection at run time (the
    call target, and so the lean graph's list of calls, stays the same; ``node.meta["fused_bound"]`` says it was
    handed one). Returns whether it did (a call written with fewer arguments keeps asking)."""
    if len(node.args) < arity:
        return False
    node.args = (*node.args[:arity], impl)
    node.meta["fused_bound"] = impl
    return True


def not_fused_note(device: torch.device, label: str, what: str) -> str:
    """``label`` with the note for a chain whose ops run one after another on this device (``what``: a message
    naming the fused kernel it lacks)."""
    if device.type == "cpu":
        return WORDS("not_fused_cpu", label=label, what=what)
    return label


# ---------------------------------------------------------------------- subgraphs

def in_graph_order(gm: torch.fx.GraphModule, names: Iterable[str]) -> list[str]:
    wanted = set(names)
    return [n.name for n in gm.graph.nodes if n.name in wanted]


def extract_subgraph(gm: torch.fx.GraphModule, members: list[torch.fx.Node], outputs: list[torch.fx.Node],
                     attrs_as_placeholders: bool) -> tuple[torch.fx.GraphModule, list[torch.fx.Node]]:
    """A GraphModule of just ``members`` (in graph order). Returns it and the nodes its placeholders stand for.

    Weights stay weights (copied ``get_attr``) unless ``attrs_as_placeholders``;
    the module returns the ``outputs`` (a tuple when there are several).
    """
    graph = torch.fx.Graph()
    member_set = set(members)
    env: dict[torch.fx.Node, torch.fx.Node] = {}
    inputs: list[torch.fx.Node] = []
    attrs: dict[str, Any] = {}
    externals: list[torch.fx.Node] = []
    for node in members:
        for src in node.all_input_nodes:
            if src not in member_set and src not in externals:
                externals.append(src)
    for src in externals:  # placeholders first, in first-use order
        if src.op == "get_attr" and not attrs_as_placeholders:
            continue
        ph = graph.placeholder(src.name)
        ph.meta = dict(src.meta)
        env[src] = ph
        inputs.append(src)
    for src in externals:
        if src.op == "get_attr" and not attrs_as_placeholders:
            value = aten.attr_value(gm, src.target)
            attrs[src.target] = value.detach().clone() if isinstance(value, torch.Tensor) else value
            env[src] = graph.get_attr(src.target)
            env[src].meta = dict(src.meta)
    for node in members:
        env[node] = graph.node_copy(node, lambda n: env[n])
    outs = [env[o] for o in outputs]
    graph.output(outs[0] if len(outs) == 1 else tuple(outs))
    graph.lint()
    sub = torch.fx.GraphModule(attrs if attrs else torch.nn.Module(), graph, class_name="ChainModule")
    return sub, inputs


# ---------------------------------------------------------------------- lowering helpers

def replace_node(gm: torch.fx.GraphModule, node: torch.fx.Node,
                 build: Callable[[torch.fx.Graph], torch.fx.Node]) -> bool:
    """Replace ``node`` by what ``build(graph)`` inserts before it (for the lean lowering); returns True."""
    with gm.graph.inserting_before(node):
        new = build(gm.graph)
    new.meta.update(node.meta)
    node.replace_all_uses_with(new)
    gm.graph.erase_node(node)
    return True


def register_buffer(gm: torch.fx.GraphModule, name: str, tensor: torch.Tensor) -> str:
    """A root buffer ``name`` holding ``tensor`` (made once per graph); returns the name."""
    if not hasattr(gm, name):
        gm.register_buffer(name, tensor, persistent=False)
    return name


def attr_tensor(gm: torch.fx.GraphModule, arg: Any) -> torch.Tensor | None:
    """The tensor a ``get_attr`` argument reads, or None for anything else."""
    if not (isinstance(arg, torch.fx.Node) and arg.op == "get_attr"):
        return None
    value = aten.attr_value(gm, arg.target)
    return value if isinstance(value, torch.Tensor) else None


def int_lists(n: int, *values: Any) -> tuple[list[int], ...] | None:
    """Each value (an int, or a list of 1 or ``n`` ints) as a list of ``n`` ints; None when one is not
    (string padding such as "same", symbolic sizes): the caller then leaves the node alone."""
    out = []
    for v in values:
        if isinstance(v, int):
            out.append([v] * n)
        elif isinstance(v, (list, tuple)) and all(isinstance(i, int) for i in v) and len(v) in (1, n):
            out.append([int(i) for i in v] * (n if len(v) == 1 else 1))
        else:
            return None
    return tuple(out)


def leading_broadcast(r_shape, x_shape) -> bool:
    """Whether ``r`` broadcasts to ``x`` over leading dims only (or equals it): after dropping its
    leading 1s, ``r``'s shape is a suffix of ``x``'s ending in the normalised dim, e.g. BERT's
    position embeddings ``(1, S, N)`` against ``(B, S, N)``. Its rows then repeat every
    ``numel(r) / N`` rows of ``x``, which is all the kernel needs."""
    r_shape, x_shape = tuple(r_shape), tuple(x_shape)
    while r_shape and r_shape[0] == 1 and len(r_shape) > 1:
        r_shape = r_shape[1:]
    return 0 < len(r_shape) <= len(x_shape) and x_shape[len(x_shape) - len(r_shape):] == r_shape


def residual_add_operands(add: torch.fx.Node) -> tuple[torch.fx.Node, torch.fx.Node, torch.Tensor]:
    """``(x, residual, sum)`` of the residual add before a row-wise norm, for its fused kernel: ``x``
    the operand of the sum's shape, ``residual`` the other, which may broadcast over ``x``'s leading
    dims only (``leading_broadcast``), and ``sum`` the add's value (shape and dtype). Raises
    ``UseGeneric`` for an add the kernels do not take (alpha, a constant, mixed dtypes, another broadcast).
    """
    check_alpha(add)
    x, residual = add.args[0], add.args[1]
    if not all(isinstance(t, torch.fx.Node) for t in (x, residual)):
        raise UseGeneric(WORDS("add_constant"))
    xs, rs, out = aten.node_val(x), aten.node_val(residual), aten.node_val(add)
    if not all(isinstance(t, torch.Tensor) for t in (xs, rs, out)) or xs.dtype != rs.dtype:
        raise UseGeneric(WORDS("add_dtypes"))
    if xs.shape != out.shape and rs.shape == out.shape:  # the add is commutative: the full operand first
        x, residual, xs, rs = residual, x, rs, xs
    if xs.shape != out.shape or not leading_broadcast(rs.shape, xs.shape):
        raise UseGeneric(WORDS("add_broadcast"))
    return x, residual, out
