"""Fusion detection: find every chain of ops that a registered pattern can fuse.

``detect(graph)`` walks the patterns of ``explorer.patterns.PATTERNS`` in
registry order and, for each, the graph's nodes in topological order. A match
follows single-consumer dataflow from an anchor op through the pattern's
steps, looking through transparent ops (views, inference dropout). A sibling
pattern (``Pattern.siblings``) instead gathers the parallel consumers of one
input: the Q, K and V projections of an attention layer. It has no
side effects on the graph; it returns a ``Detection``:

- ``chains``: non-overlapping ``Chain`` values (every node in at most one);
- ``near_misses``: candidates a guard refused, each with a readable reason
  ("conv output has 2 consumers", "BatchNorm in training mode", ...).

Each anchor is tried once per pattern and a match is at most a few steps
long, so detection is linear in the size of the graph.

    >>> from explorer.sources import load_model
    >>> from explorer.graph_model import build_graph
    >>> det = detect(build_graph(load_model("resnet50").gm))
    >>> det.counts["conv_bn_act"]
    33
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from typing import Any, Iterable

import networkx as nx

from explorer import ops
from explorer.graph_model import topo_nodes
from explorer.patterns import ALREADY_FUSED, BY_NAME, PATTERNS, Pattern, Step


@dataclasses.dataclass(frozen=True)
class Chain:
    """One fusible chain.

    ``ops`` are the canonical kinds of its compute ops in dataflow order;
    ``nodes`` all its node ids (views included); ``roles`` maps each compute
    node to its step role; ``extra_outputs`` are intermediates the fused
    kernel must still write because something outside the chain reads them.
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

    @property
    def compute_nodes(self) -> tuple[str, ...]:
        return tuple(n for n, _ in self.roles)

    def node_for(self, role: str) -> str | None:
        return next((n for n, r in self.roles if r == role), None)

    @property
    def siblings(self) -> bool:
        """Its ops are parallel consumers of one input (horizontal fusion), not a sequence."""
        return BY_NAME[self.pattern].siblings if self.pattern in BY_NAME else False

    @property
    def ops_text(self) -> str:
        """``conv → batch_norm → relu``, or ``linear ∥ linear ∥ linear`` for siblings."""
        return (BY_NAME[self.pattern].joiner if self.pattern in BY_NAME else " → ").join(self.ops)

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
                "roles": {n: r for n, r in self.roles}}


@dataclasses.dataclass(frozen=True)
class NearMiss:
    """A candidate chain that was refused, with the reason a person can read."""

    pattern: str
    nodes: tuple[str, ...]
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return {"pattern": self.pattern, "nodes": list(self.nodes), "reason": self.reason}


@dataclasses.dataclass(frozen=True)
class Detection:
    """The result of ``detect``: chains, near misses and per-pattern counts."""

    model: str
    fingerprint: str
    chains: tuple[Chain, ...]
    near_misses: tuple[NearMiss, ...]
    totals: dict[str, int]

    @property
    def counts(self) -> dict[str, int]:
        c = Counter(ch.pattern for ch in self.chains)
        return {p.name: c.get(p.name, 0) for p in PATTERNS}

    def chain(self, chain_id: str) -> Chain:
        for ch in self.chains:
            if ch.id == chain_id:
                return ch
        raise KeyError(chain_id)

    def node_to_chain(self) -> dict[str, str]:
        return {n: ch.id for ch in self.chains for n in ch.nodes}

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "fingerprint": self.fingerprint,
            "nodes": self.totals.get("nodes", 0),
            "totals": dict(self.totals),
            "chains": [c.to_dict() for c in self.chains],
            "counts": self.counts,
            "near_misses": [m.to_dict() for m in self.near_misses],
            "bytes_saved": sum(c.bytes_saved for c in self.chains),
            "launches_saved": sum(c.launches_saved for c in self.chains),
        }


class _Refused(Exception):
    """Internal: a candidate failed; ``reason`` is None for a plain structural mismatch."""

    def __init__(self, reason: str | None, nodes: Iterable[str]) -> None:
        super().__init__(reason)
        self.reason = reason
        self.nodes = tuple(nodes)


_LABEL = {"batch_norm": "BatchNorm", "layer_norm": "LayerNorm", "conv": "conv", "matmul": "MatMul"}


def _label(kind: str) -> str:
    return _LABEL.get(kind, kind)


def _successors(g: nx.DiGraph, node: str) -> list[str]:
    return sorted(g.successors(node), key=lambda n: g.nodes[n]["order"])


def _follow(g: nx.DiGraph, start: str, owner: str) -> tuple[list[str], str] | str:
    """From ``start`` walk through transparent ops to the next compute op.

    Returns (transparent path, compute node) or a refusal reason when a
    transparent op fans out (the intermediate is then used elsewhere).
    """
    path: list[str] = []
    node = start
    while g.nodes[node]["kind"] in ops.TRANSPARENT:
        succ = _successors(g, node)
        if len(succ) != 1:
            return f"{_label(g.nodes[owner]['kind'])} output has {len(succ)} consumers (through a view)"
        path.append(node)
        node = succ[0]
    return path, node


def _match(g: nx.DiGraph, pattern: Pattern, anchor: str, claimed: dict[str, str]) -> list[tuple[str, str, bool]]:
    """Match ``pattern`` at ``anchor``. Returns [(node, role, is_compute)] or raises _Refused.

    A guard, a claimed node or a fan-out refuses the candidate, but matching goes
    on structurally: the refusal becomes a near miss only if the whole pattern
    would otherwise have matched (so a training-mode BatchNorm before a ReLU is
    reported under Conv+BN+act, not under every pattern that starts with conv).
    """
    steps = pattern.steps
    matched: list[tuple[str, str, bool]] = [(anchor, steps[0].role, True)]
    refusal: tuple[str, list[str]] | None = None
    cur, cur_step = anchor, steps[0]
    i = 1
    while i < len(steps):
        rest_optional = all(s.optional for s in steps[i:])
        consumers = _successors(g, cur)
        candidates: list[tuple[list[str], str]] = []
        fanout_reason = None
        for c in consumers:
            followed = _follow(g, c, cur)
            if isinstance(followed, str):
                fanout_reason = followed
            else:
                candidates.append(followed)
        # Which step could each candidate fill? (first step j >= i with only optional steps between)
        fits: list[tuple[list[str], str, int]] = []
        family_miss: tuple[str, Step] | None = None
        for path, node in candidates:
            kind = g.nodes[node]["kind"]
            for j in range(i, len(steps)):
                if kind in steps[j].kinds:
                    fits.append((path, node, j))
                    break
                if kind in steps[j].family and family_miss is None:
                    family_miss = (node, steps[j])
                if not steps[j].optional:
                    break
        chain_nodes = [n for n, _, _ in matched]
        if not fits:
            if rest_optional:
                break
            if refusal is None and family_miss is not None:
                node, step = family_miss
                raise _Refused(f"{step.role if step.role != 'act' else 'activation'} "
                               f"{g.nodes[node]['kind']} not supported by {pattern.label}", chain_nodes + [node])
            raise _Refused(None, chain_nodes)  # the pattern does not fit here at all
        path, node, j = fits[0]
        step = steps[j]
        reason = None
        if (len(consumers) > 1 or fanout_reason) and not cur_step.emits:
            reason = fanout_reason or f"{_label(g.nodes[cur]['kind'])} output has {len(consumers)} consumers"
        elif node in claimed or any(p in claimed for p in path):
            reason = f"{_label(g.nodes[node]['kind'])} already in chain {claimed.get(node)}"
        elif step.guard:
            ctx = {"chain": set(chain_nodes), "prev": path[-1] if path else cur, "prev_real": cur}
            reason = step.guard(g, node, ctx)
        if reason:
            if rest_optional and refusal is None:
                break
            refusal = refusal or (reason, chain_nodes + path + [node])
        matched.extend((p, "view", False) for p in path)
        matched.append((node, step.role, True))
        cur, cur_step = node, step
        i = j + 1
    if refusal:
        raise _Refused(*refusal)
    n_compute = sum(1 for _, _, c in matched if c)
    if n_compute < 2 or any(not s.optional for s in steps[i:]):
        raise _Refused(None, [n for n, _, _ in matched])
    return matched


def _match_siblings(g: nx.DiGraph, pattern: Pattern, anchor: str,
                    claimed: dict[str, str]) -> list[tuple[str, str, bool]]:
    """Gather the unclaimed consumers of ``anchor``'s input that fit the pattern's one step.

    Siblings must read that input as their activation operand and take their
    weights from parameters (a GEMM over concatenated weights needs constant
    weights), with or without a bias alike. Raises _Refused when fewer than two
    fit, with a reason when two or more would have but differ.
    """
    step = pattern.steps[0]
    attrs = g.nodes[anchor]
    x = attrs.get("first_input")
    if x is None or x not in g or not attrs.get("const_weight"):
        raise _Refused(None, [anchor])
    found = [n for n in _successors(g, x)
             if g.nodes[n]["kind"] in step.kinds and n not in claimed
             and g.nodes[n].get("first_input") == x and g.nodes[n].get("const_weight")]
    if anchor not in found or found[0] != anchor or len(found) < 2:
        raise _Refused(None, [anchor])
    dtypes = {tuple(g.nodes[n]["dtypes"]) for n in found}
    biases = {g.nodes[n].get("has_bias") for n in found}
    what = f"sibling {_label(attrs['kind'])}s of {x}"
    if len(dtypes) > 1:
        raise _Refused(f"{what} differ in dtype", found)
    if len(biases) > 1:
        raise _Refused(f"{what}: some have a bias, some do not", found)
    return [(n, f"{step.role}{i}", True) for i, n in enumerate(found)]


def _make_chain(g: nx.DiGraph, pattern: Pattern, matched: list[tuple[str, str, bool]]) -> Chain:
    nodes = tuple(n for n, _, _ in matched)
    members = set(nodes)
    compute = [(n, r) for n, r, c in matched if c]
    anchor = compute[0][0]
    saved = 0
    extra: list[str] = []
    if pattern.siblings:
        # Every output is still written; what goes is n-1 reads of the shared input.
        saved = g.edges[g.nodes[anchor]["first_input"], anchor]["bytes"] * (len(compute) - 1)
    else:
        for n, _ in compute[:-1]:
            written = g.nodes[n]["bytes_written"]
            outside = [s for s in g.successors(n) if s not in members]
            if outside:
                extra.append(n)
                saved += written  # still written (extra output), but not read back by the chain
            else:
                saved += 2 * written
    launches = sum(g.nodes[n]["launches"] for n, _ in compute)
    return Chain(
        id=f"{pattern.name}@{anchor}",
        pattern=pattern.name,
        ops=tuple(g.nodes[n]["kind"] for n, _ in compute),
        nodes=nodes,
        names=tuple(g.nodes[n]["origin"] for n, _ in compute),
        roles=tuple(compute),
        bytes_saved=int(saved),
        launches_saved=int(max(launches - 1, 0)),
        extra_outputs=tuple(extra),
    )


def detect(g: nx.DiGraph, patterns: Iterable[Pattern] = PATTERNS) -> Detection:
    """Find the fusible chains and the near misses of graph ``g`` (see module docstring)."""
    order = topo_nodes(g)
    by_kind: dict[str, list[str]] = {}
    for n in order:
        by_kind.setdefault(g.nodes[n]["kind"], []).append(n)
    claimed: dict[str, str] = {}
    chains: list[Chain] = []
    refused: list[NearMiss] = []
    for pattern in patterns:
        anchors = sorted((n for k in pattern.anchor_kinds for n in by_kind.get(k, ())),
                         key=lambda n: g.nodes[n]["order"])
        for anchor in anchors:
            if anchor in claimed:
                continue
            try:
                matched = (_match_siblings if pattern.siblings else _match)(g, pattern, anchor, claimed)
            except _Refused as why:
                if why.reason:
                    refused.append(NearMiss(pattern.name, why.nodes, why.reason))
                continue
            chain = _make_chain(g, pattern, matched)
            chains.append(chain)
            for n in chain.nodes:
                claimed[n] = chain.id
    for kind, pattern_name in ALREADY_FUSED.items():
        for n in by_kind.get(kind, ()):
            refused.append(NearMiss(pattern_name, (n,), f"already fused ({g.nodes[n]['target'].split('.')[1]})"))
    chains.sort(key=lambda c: g.nodes[c.nodes[0]]["order"])
    return Detection(
        model=str(g.graph.get("model", "model")),
        fingerprint=str(g.graph.get("fingerprint", "")),
        chains=tuple(chains),
        near_misses=tuple(_keep_informative(refused, claimed)),
        totals={k: int(g.graph[k]) for k in ("nodes", "ops", "params", "flops", "bytes", "launches") if k in g.graph},
    )


def _keep_informative(refused: list[NearMiss], claimed: dict[str, str]) -> list[NearMiss]:
    """Drop near misses that a chain covers entirely, and repeats of one anchor and reason."""
    seen: set[tuple[str, str]] = set()
    kept = []
    for miss in refused:
        owners = {claimed.get(n) for n in miss.nodes}
        if len(owners) == 1 and None not in owners:
            continue
        key = (miss.nodes[0], miss.reason)
        if key in seen:
            continue
        seen.add(key)
        kept.append(miss)
    return kept


def analyze(source: str, batch: int | None = None, seq_len: int | None = None):
    """Load, capture, build the graph and detect: returns (model, graph, detection)."""
    from explorer.graph_model import build_graph
    from explorer.sources import load_model

    model = load_model(source, batch=batch, seq_len=seq_len)
    graph = build_graph(model.gm, model.name)
    return model, graph, detect(graph)
