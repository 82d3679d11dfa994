"""The parts every fusion is declared with: steps, patterns, chains, and a kernel choice.

Plain frozen dataclasses, no torch and no networkx: a family module
(``explorer/fusions/<family>.py``) declares its patterns with these, the
matcher (``explorer.fusion_engine.detect``) returns ``Chain``/``NearMiss``
values in a ``Detection``, and a kernel selection answers with a ``Choice``.

A pattern is data: an ordered list of steps, each a set of op kinds
(``explorer.vocab``), with optional steps, guards that return a readable
refusal, and a flag for steps whose output may leave the chain as an extra
output of the fused kernel. Beside the data it names the functions that make
it real: ``rewrite`` (plan the edit for one chain), ``fold`` (the part of the
chain the "Conv+BN folded" stage applies), and its family's kernel
selection and lowering (see ``explorer/fusions/__init__.py``).

Each family's kernel selection (``select_*``) is registered with ``selection``:
``SELECTIONS`` holds them by name, and ``counting()`` counts their calls while
it is open (how ``tests/test_target.py`` shows that each chain's kernel is
decided once per target, however many steps read the decision).
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
from collections import Counter
from typing import Any, Callable, Iterator, Optional, TypeVar

from explorer.words import Words

#: ``guard(graph, node, context) -> refusal or None``; ``context`` holds ``chain`` (node ids so
#: far), ``prev`` (the op before, through views) and ``prev_real`` (the compute op before).
Guard = Callable[[Any, str, dict], Optional[str]]

#: ``match(graph, pattern, anchor, claimed) -> [(node, role, is_compute), ...]`` in dataflow order, the
#: last compute node being the chain's result; raises ``NoMatch``. For shapes the step matcher cannot
#: follow (a subgraph with a fan-out inside, such as RMSNorm's ``x * rsqrt(mean(x²) + eps)``).
Matcher = Callable[[Any, "Pattern", str, dict], list]


class NoMatch(Exception):
    """A candidate does not match: ``reason`` is None for a plain structural mismatch, else a refusal a
    person can read (it becomes a near miss); ``nodes`` are the candidate's nodes so far."""

    def __init__(self, reason: str | None, nodes=()) -> None:
        super().__init__(reason)
        self.reason = reason
        self.nodes = tuple(nodes)


#: The words every family shares: the matcher's near misses, the rewrite's refusals, the kernel choices and the
#: caveats that hold for most patterns (each family declares its own beside its patterns).
WORDS = Words("fusion", {
    # the matcher (explorer.fusion_engine)
    "consumers_view": ("{op} output has {n} consumers (through a view)", "{op} 的输出有 {n} 个使用者（经过一个视图）"),
    "consumers": ("{op} output has {n} consumers", "{op} 的输出有 {n} 个使用者"),
    "already_in_chain": ("{op} already in chain {chain}", "{op} 已经属于链 {chain}"),
    "already_fused": ("already fused ({op})", "已经是融合算子（{op}）"),
    "unsupported_activation": ("activation {kind} not supported by {pattern}", "{pattern} 不支持激活函数 {kind}"),
    "unsupported": ("{role} {kind} not supported by {pattern}", "{pattern} 不支持 {kind}（{role}）"),
    "own_matcher": ("{pattern}: {reason}", "{pattern}：{reason}"),
    "sibling_dtypes": ("sibling {op}s of {x} differ in dtype", "{x} 的并列 {op} 数据类型不同"),
    "sibling_bias": ("sibling {op}s of {x}: some have a bias, some do not", "{x} 的并列 {op}：有的带偏置，有的不带"),
    # the rewrite (explorer.fusions.rewrite, explorer.fusions.edit)
    "not_constant": ("{what} is computed in the graph, not a constant: cannot fold", "{what} 是在计算图中算出来的，不是常量：无法折叠"),
    "extra_outputs": ("the chain has extra outputs this kernel does not write", "这条链有该内核不写出的额外输出"),
    "used_outside": ("{node} is also used by {user} outside the chain", "{node} 也被链外的 {user} 使用"),
    "training_dropout": ("dropout in training mode inside the chain", "链中有处于训练模式的 dropout"),
    "op_inside": ("a {op} inside the chain", "链中有一个 {op}"),
    "operand_unclear": ("{node}: cannot tell the chain operand from the other one", "{node}：分不清哪个操作数来自链"),
    "adds_constant": ("{node} adds a constant", "{node} 加的是常量"),
    "alpha": ("{node} has alpha != 1", "{node} 的 alpha 不等于 1"),
    "add_constant": ("add of a constant", "加的是常量"),
    "add_dtypes": ("the add mixes dtypes", "相加混合了不同的数据类型"),
    "add_broadcast": ("the add broadcasts other than over leading dims", "相加除了前导维度之外还有广播"),
    "not_a_choice": ("kernel '{kernel}' is not a choice for {pattern}", "内核“{kernel}”不是 {pattern} 的可选项"),
    "mutates": ("{node} mutates {victim} in place, which {reader} reads later",
                "{node} 原地修改了 {victim}，而 {reader} 之后还要读它"),
    "planning_failed": ("planning failed: {reason}", "规划失败：{reason}"),
    "level_none": ("level 'none': nothing is fused", "级别“none”：什么都不融合"),
    "level_conv_bn": ("level 'conv_bn': only BatchNorm is folded; the rest of the chain runs as separate ops",
                      "级别“conv_bn”：只折叠 BN；链的其余部分作为单独的算子运行"),
    "level_activation": ("level 'activation': only BatchNorm folding and conv/linear epilogues are applied",
                         "级别“activation”：只应用 BN 折叠和 conv/linear 的尾处理"),
    "weight": ("weight", "权重"),
    "bias": ("bias", "偏置"),
    "no_shape": ("{node} has no shape metadata", "{node} 没有形状元数据"),
    # labels the rewrite composes
    "unfused": ("unfused (separate ops)", "未融合（单独的算子）"),
    "not_fused_cpu": ("{label}; cpu: no fused kernel for {what}, the ops run one after another",
                      "{label}；cpu 上没有{what}的融合内核，这些算子依次运行"),
    "kernel_separate": ("{label}; kernel choice: separate epilogue", "{label}；内核选择：分开的尾处理"),
    "interpreted": ("{label} [Triton interpreter on cpu]", "{label} [cpu 上用 Triton 解释器运行]"),
    "gemm_epilogue": ("the GEMM epilogue", " GEMM 尾处理"),
    "conv_epilogue": ("the conv epilogue", "卷积尾处理"),
    "no_triton_interpret": ("no Triton on {device} (TRITON_INTERPRET=1 interprets it)",
                            "{device} 上没有 Triton（设置 TRITON_INTERPRET=1 时解释执行）"),
    "no_triton": ("no Triton on {device}", "{device} 上没有 Triton"),
    "triton_import": ("Triton does not import in this environment", "这个环境中无法导入 Triton"),
    "interpret_cuda": ("TRITON_INTERPRET=1 is set: Triton would interpret, not compile, for CUDA tensors",
                       "设置了 TRITON_INTERPRET=1：对 CUDA 张量，Triton 会解释执行而不是编译"),
    "no_backend": ("no Triton backend for {device} tensors", "没有面向 {device} 张量的 Triton 后端"),
    "dtypes_one_of": ("dtypes {a}/{b}: the kernel takes one of fp32, fp16, bf16",
                      "数据类型 {a}/{b}：该内核只接受 fp32、fp16、bf16 之一"),
    "dtype_one_of": ("dtype {dtype} is not one of fp32, fp16, bf16", "数据类型 {dtype} 不是 fp32、fp16、bf16 之一"),
    "dtype_slash": ("dtype {dtype} is not one of fp32/fp16/bf16", "数据类型 {dtype} 不是 fp32/fp16/bf16 之一"),
    "autograd": ("autograd records this call and the kernel is forward-only", "autograd 会记录这次调用，而该内核只支持前向"),
    "empty": ("empty input", "空输入"),
    "devices": ("inputs on different devices", "输入在不同的设备上"),
    # the kernel choices a plan may name (KERNEL_CHOICES)
    "choice_auto": ("the pattern's fused kernel where it applies on the device (the default)",
                    "该融合模式在这台设备上适用时使用其融合内核（默认）"),
    "choice_separate": (("the GEMM or convolution with its bias, then the residual add and the activation in "
                         "place: one kernel more, no fused epilogue (BatchNorm still folded)"),
                        "先做带偏置的 GEMM 或卷积，再原地做残差相加和激活：多一个内核，没有融合的尾处理（BN 仍然折叠）"),
    "choice_inductor": ("the chain's subgraph compiled by torch.compile's inductor, as the generic fallback does",
                        "把链的子图交给 torch.compile 的 inductor 编译，与通用兜底方案相同"),
    # caveats that hold for most patterns
    "precision": (("Fusion reorders arithmetic: expect output differences near the dtype's rounding (about 1e-6 "
                   "relative in fp32, 1e-3 in fp16 and bf16)."),
                  "算子融合会改变计算顺序：输出差异应在该数据类型的舍入量级（fp32 约 1e-6 相对误差，fp16 和 bf16 约 1e-3）。"),
    "pays": (("Not every fusion pays: a fused kernel that is slower than the library kernels it replaces "
              "(register pressure, a worse algorithm choice) makes the model slower. Measure."),
             "不是所有融合都划算：融合内核若比它替换的库内核更慢（寄存器压力、算法选择更差），模型就会变慢。要实测。"),
})

#: What a plan's per-chain kernel choice means (``Plan.kernels``; each pattern lists its own).
KERNEL_CHOICES: dict[str, str] = {
    "auto": WORDS("choice_auto"),
    "separate_epilogue": WORDS("choice_separate"),
    "inductor": WORDS("choice_inductor"),
}

#: Stages of the staged table, in order. A pattern's ``stage`` says from which one it is applied.
STAGES = ("none", "conv_bn", "activation", "all")

#: Caveats that hold for most patterns (each family adds its own).
PRECISION_CAVEAT = WORDS("precision")
PAYS_CAVEAT = WORDS("pays")


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
    """A fusion pattern: what it matches, how it is fused, and why it pays.

    The order in which patterns claim nodes is the registry's
    (``explorer.fusions.order``: each family says which families it runs
    before or after; inside a family, its ``PATTERNS`` order). Matching follows the steps through single-consumer dataflow
    (``explorer.fusion_engine``), or gathers parallel consumers of one input
    (``siblings``), or calls the pattern's own ``match`` for other subgraphs. ``rewrite(ctx, chain, kernel)`` plans the edit for one accepted
    chain (``explorer.fusions.edit``); None means the generic fallback
    (the chain compiled by inductor). ``fold(ctx, chain)`` is the partial edit
    of the "Conv+BN folded" stage, for patterns that hold a BatchNorm.
    ``stage`` is the first stage of the staged table that applies the whole
    chain: "activation" (conv and GEMM epilogues) or "all" (everything else).
    """

    name: str
    label: str
    steps: tuple[Step, ...]
    color: str
    implementation: str
    explanation: str
    stage: str = "all"
    rewrite: Callable | None = None
    fold: Callable | None = None
    caveats: tuple[str, ...] = ()
    formula: str = ""
    kernels: tuple[str, ...] = ("auto", "inductor")   # kernel choices a plan may name (KERNEL_CHOICES)
    siblings: bool = False  # the steps are parallel consumers of one input, not a dataflow chain
    match: Matcher | None = None  # the pattern's own matcher (steps then name its roles and anchor kinds)
    #: ``alone(gm, chain) -> (extra nodes, outputs)``: what a chain timed alone must also hold to compute what
    #: the model computes, for a fold whose edit changes ops outside the chain (RMSNorm's γ into its readers)
    alone: Callable | None = None

    @property
    def joiner(self) -> str:
        """How a chain's ops are written: in sequence, or side by side (siblings)."""
        return " ∥ " if self.siblings else " → "

    @property
    def anchor_kinds(self) -> frozenset[str]:
        return self.steps[0].kinds


@dataclasses.dataclass(frozen=True)
class Choice:
    """What a kernel selection decided for one fused op on one device, dtype and shape.

    ``impl`` names the path (``cudnn_conv_relu``, ``triton``, ``separate`` ...),
    ``label`` is what reports and the app show, ``fused`` says whether it is
    really fewer kernels than the unfused ops (False: the same ops run one
    after another, e.g. no fused kernel on the CPU).
    """

    impl: str
    label: str
    fused: bool


#: Every family's kernel selection by name (``module.select_*``), registered by ``selection``.
SELECTIONS: dict[str, Callable[..., Choice]] = {}
_COUNTS: contextvars.ContextVar[Counter | None] = contextvars.ContextVar("selection_counts", default=None)
_Select = TypeVar("_Select", bound=Callable[..., Choice])


def selection(select: _Select) -> _Select:
    """Register a family's kernel selection (the one function that decides how its fused op runs); its calls
    are counted while ``counting()`` is open, and cost one context-variable read otherwise."""
    name = f"{select.__module__.rpartition('.')[2]}.{select.__name__}"

    @functools.wraps(select)
    def counted(*args: Any, **kwargs: Any) -> Choice:
        counts = _COUNTS.get()
        if counts is not None:
            counts[name] += 1
        return select(*args, **kwargs)

    SELECTIONS[name] = counted
    return counted  # type: ignore[return-value]


@contextlib.contextmanager
def counting() -> Iterator[Counter]:
    """``with counting() as calls: ...``: ``calls[name]`` is how often each registered selection ran inside."""
    token = _COUNTS.set(Counter())
    try:
        yield _COUNTS.get()
    finally:
        _COUNTS.reset(token)


@dataclasses.dataclass(frozen=True)
class Chain:
    """One fusible chain.

    ``ops`` are the canonical kinds of its compute ops in dataflow order;
    ``nodes`` all its node ids (views included); ``roles`` maps each compute
    node to its step role; ``extra_outputs`` are intermediates the fused
    kernel must still write because something outside the chain reads them;
    ``siblings`` marks parallel consumers of one input (horizontal fusion).
    """

    id: str
    pattern: str
    ops: tuple[str, ...]
    nodes: tuple[str, ...]
    names: tuple[str, ...]
    roles: tuple[tuple[str, str], ...]
    bytes_saved: int
    launches_saved: int
    extra_outputs: tuple[str, ...] = ()
    siblings: bool = False

    @property
    def compute_nodes(self) -> tuple[str, ...]:
        return tuple(n for n, _ in self.roles)

    def node_for(self, role: str) -> str | None:
        return next((n for n, r in self.roles if r == role), None)

    @property
    def ops_text(self) -> str:
        """``conv → batch_norm → relu``, or ``linear ∥ linear ∥ linear`` for siblings."""
        return (" ∥ " if self.siblings else " → ").join(self.ops)

    @property
    def title(self) -> str:
        """THE person's name for the chain (every page, the command line and the report show this one),
        from its ops' module paths: the common module, then each op's own part
        (``layer1.0: conv3 → bn3 → add → relu``). An op whose path is the common module itself (the
        residual add of ``layer1.0``) is named by its kind; where ops share one path (BERT's attention
        scores) all are named by their kinds; parts that are bare numbers keep their parent
        (``downsample: 0 → 1``). The id stays the stable key."""
        names = [str(n).split(".") for n in self.names]
        joiner = " ∥ " if self.siblings else " → "
        if not names:
            return joiner.join(self.ops)
        kinds = list(self.ops) if len(self.ops) == len(names) else [""] * len(names)
        common = 0
        while all(len(p) > common for p in names) and len({p[common] for p in names}) == 1:
            common += 1
        rests = [".".join(p[common:]) for p in names]
        if common and all(r.isdigit() for r in rests if r) and any(rests):
            common -= 1                                  # downsample.0 → downsample.1, not 0 → 1
            rests = [".".join(p[common:]) for p in names]
        if len(set(rests)) < len(rests) and all(kinds):  # one module for several ops: their kinds say more
            rests = kinds
        else:
            rests = [r or k or "·" for r, k in zip(rests, kinds)]
        prefix = ".".join(names[0][:common])
        body = joiner.join(rests)
        return f"{prefix}: {body}" if prefix else body

    @property
    def outputs(self) -> tuple[str, ...]:
        """The nodes whose values leave the chain: every branch of siblings, else the last op and the extras."""
        if self.siblings:
            return self.compute_nodes
        return (self.roles[-1][0], *self.extra_outputs)

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "pattern": self.pattern, "ops": list(self.ops), "nodes": list(self.nodes),
                "names": list(self.names), "bytes_saved": self.bytes_saved,
                "launches_saved": self.launches_saved, "extra_outputs": list(self.extra_outputs),
                "roles": {n: r for n, r in self.roles}, "siblings": self.siblings}


@dataclasses.dataclass(frozen=True)
class NearMiss:
    """A candidate chain that was refused, with the reason a person can read."""

    pattern: str
    nodes: tuple[str, ...]
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return {"pattern": self.pattern, "nodes": list(self.nodes), "reason": self.reason}


@dataclasses.dataclass(frozen=True)
class Alternative:
    """Another way to fuse the nodes of a chain, which the registry's order did not take.

    ``chains``: the alternative's chains, in graph order (one, or a partition such as Conv+BN then
    Add+ReLU where the chain was Conv+BN+Add+ReLU); ``instead_of``: the chain they replace. Each of
    ``chains`` claims only nodes of that chain or nodes no chain claimed, so a plan can accept them
    in its place (``Plan.check_for`` refuses two accepted chains that share a node).
    """

    instead_of: str
    chains: tuple[Chain, ...]

    @property
    def id(self) -> str:
        return " + ".join(c.id for c in self.chains)

    def to_dict(self) -> dict[str, Any]:
        return {"instead_of": self.instead_of, "chains": [c.id for c in self.chains]}


@dataclasses.dataclass(frozen=True)
class Detection:
    """The result of ``detect``: chains, near misses, per-pattern counts (registry order) and totals;
    ``alternatives``: other ways to fuse a chain's nodes (``Alternative``), which a plan may choose."""

    model: str
    fingerprint: str
    chains: tuple[Chain, ...]
    near_misses: tuple[NearMiss, ...]
    totals: dict[str, int]
    counts: dict[str, int]
    alternatives: tuple[Alternative, ...] = ()

    def chain(self, chain_id: str) -> Chain:
        """The chain with this id: one of ``chains``, or of an alternative's."""
        for ch in self.chains:
            if ch.id == chain_id:
                return ch
        for alt in self.alternatives:
            for ch in alt.chains:
                if ch.id == chain_id:
                    return ch
        raise KeyError(chain_id)

    def alternatives_of(self, chain_id: str) -> tuple[Alternative, ...]:
        """The alternatives to one chain (none for most)."""
        return tuple(a for a in self.alternatives if a.instead_of == chain_id)

    def accepted_chains(self, ids) -> list[Chain]:
        """The chains named by ``ids`` (detected or alternative), in graph order: each detected chain,
        then the alternatives' chains that replace it."""
        ids = set(ids)
        out: list[Chain] = []
        seen: set[str] = set()
        for c in self.chains:
            for cand in (c, *(x for a in self.alternatives_of(c.id) for x in a.chains)):
                if cand.id in ids and cand.id not in seen:
                    seen.add(cand.id)
                    out.append(cand)
        return out

    def known_chains(self) -> dict[str, Chain]:
        """Every chain a plan may accept, by id: the detected ones and every alternative's."""
        out = {c.id: c for c in self.chains}
        for alt in self.alternatives:
            for c in alt.chains:
                out.setdefault(c.id, c)
        return out

    def node_to_chain(self) -> dict[str, str]:
        return {n: ch.id for ch in self.chains for n in ch.nodes}

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "fingerprint": self.fingerprint,
            "nodes": self.totals.get("nodes", 0),
            "totals": dict(self.totals),
            "chains": [c.to_dict() for c in self.chains],
            "counts": dict(self.counts),
            "near_misses": [m.to_dict() for m in self.near_misses],
            "alternatives": [a.to_dict() for a in self.alternatives],
            "alternative_chains": [c.to_dict() for a in self.alternatives for c in a.chains],
            "bytes_saved": sum(c.bytes_saved for c in self.chains),
            "launches_saved": sum(c.launches_saved for c in self.chains),
        }
