"""The engine's entry point: detect the fusible chains of a graph, and the load → detect → fuse pipeline.

``detect(graph)`` walks the patterns of ``explorer.fusions.PATTERNS`` in
the registry's order (``explorer.fusions.order``: what each family says it runs
before or after) and, for each, the graph's nodes in topological order. A match
follows single-consumer dataflow from an anchor op through the pattern's
steps, looking through transparent ops (views, inference dropout). A sibling
pattern (``Pattern.siblings``) instead gathers the parallel consumers of one
input: the Q, K and V projections of an attention layer. It has no
side effects on the graph; it returns a ``Detection``:

- ``chains``: non-overlapping ``Chain`` values (every node in at most one);
- ``alternatives``: for a chain, other ways to fuse its nodes that the order
  did not take (``Alternative``): a pattern that runs later, matched where the
  chain's claim was all that stopped it, alone or followed by the chains its
  rest then forms (Conv+BN, then Add+ReLU, instead of Conv+BN+Add+ReLU). A plan
  may accept them instead of the chain; the runner measures them like any chain;
- ``near_misses``: candidates a guard refused, each with a readable reason
  ("conv output has 2 consumers", "BatchNorm in training mode", ...): a family's
  ``Message`` (``explorer.words``), English as a ``str``, rendered by the UI in
  either language. A candidate refused only because a pattern that runs first
  already claimed its node ("add already in chain X") is not a near miss.

Each anchor is tried once per pattern and a match is at most a few steps
long, so detection is linear in the size of the graph.

The pipeline every caller uses (the runner, the benchmarks, the app, the
command line)::

    analyze(source) ─► Analysis(model, graph, detection)
    fuse(analysis, plan, target, level) ─► FusedModel (a new graph; the original untouched; each chain's
        kernel chosen once for the Target(device, dtype, memory_format), recorded on its fused call)
    launch_counts(analysis, applied, accepted, device) ─► launches.LaunchCounts (the device's kernel
        launches before and after; ``chain_launch_table`` every chain's, as if accepted)

    >>> analysis = analyze("resnet50")
    >>> analysis.detection.counts["conv_bn_act"]
    33
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from typing import Iterable, NamedTuple

import networkx as nx

from explorer import launches
from explorer.fusions import ALREADY_FUSED, PATTERNS
from explorer.fusions.base import WORDS, Alternative, Chain, Detection, NearMiss, NoMatch, Pattern, Step
from explorer.fusions.plan import Plan, make_plan
from explorer.fusions.rewrite import AppliedChain, FusedModel, apply_plan
from explorer.graph.build import build_graph, topo_nodes
from explorer.sources import LoadedModel, load_model
from explorer.vocab import TRANSPARENT, Target
from explorer.words import Message


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
    while g.nodes[node]["kind"] in TRANSPARENT:
        succ = _successors(g, node)
        if len(succ) != 1:
            return WORDS("consumers_view", op=_label(g.nodes[owner]['kind']), n=len(succ))
        path.append(node)
        node = succ[0]
    return path, node


def _branches(g: nx.DiGraph, start: str) -> list[tuple[list[str], str]]:
    """Every compute op reached from ``start`` through transparent ops that fan out (an eval-mode dropout
    or a reshape of a residual sum that the next block also reads), each with an empty path: the
    transparent ops are shared, so they stay outside the chain and read its output, which it writes."""
    found, todo, seen = [], [start], set()
    while todo:
        node = todo.pop(0)
        if node in seen:
            continue
        seen.add(node)
        if g.nodes[node]["kind"] in TRANSPARENT:
            todo.extend(_successors(g, node))
        else:
            found.append(([], node))
    return sorted(found, key=lambda pn: g.nodes[pn[1]]["order"])


def _match(g: nx.DiGraph, pattern: Pattern, anchor: str, claimed: dict[str, str]) -> list[tuple[str, str, bool]]:
    """Match ``pattern`` at ``anchor``. Returns [(node, role, is_compute)] or raises NoMatch.

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
            if isinstance(followed, str) and cur_step.emits:
                candidates.extend(_branches(g, c))   # the op's output is written anyway: one more reader is free
            elif isinstance(followed, str):
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
                kind = g.nodes[node]["kind"]
                why = (WORDS("unsupported_activation", kind=kind, pattern=pattern.label) if step.role == "act"
                       else WORDS("unsupported", role=step.role, kind=kind, pattern=pattern.label))
                raise NoMatch(why, chain_nodes + [node])
            raise NoMatch(None, chain_nodes)  # the pattern does not fit here at all
        path, node, j = fits[0]
        step = steps[j]
        reason = None
        if (len(consumers) > 1 or fanout_reason) and not cur_step.emits:
            reason = fanout_reason or WORDS("consumers", op=_label(g.nodes[cur]['kind']), n=len(consumers))
        elif node in claimed or any(p in claimed for p in path):
            taken = node if node in claimed else next(p for p in path if p in claimed)
            reason = WORDS("already_in_chain", op=_label(g.nodes[taken]['kind']), chain=claimed[taken])
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
        raise NoMatch(*refusal)
    n_compute = sum(1 for _, _, c in matched if c)
    if n_compute < 2 or any(not s.optional for s in steps[i:]):
        raise NoMatch(None, [n for n, _, _ in matched])
    return matched


def _match_siblings(g: nx.DiGraph, pattern: Pattern, anchor: str,
                    claimed: dict[str, str]) -> list[tuple[str, str, bool]]:
    """Gather the unclaimed consumers of ``anchor``'s input that fit the pattern's one step.

    Siblings must read that input as their activation operand and take their
    weights from parameters (a GEMM over concatenated weights needs constant
    weights), with or without a bias alike. Raises NoMatch when fewer than two
    fit, with a reason when two or more would have but differ.
    """
    step = pattern.steps[0]
    attrs = g.nodes[anchor]
    x = attrs.get("first_input")
    if x is None or x not in g or not attrs.get("const_weight"):
        raise NoMatch(None, [anchor])
    found = [n for n in _successors(g, x)
             if g.nodes[n]["kind"] in step.kinds and n not in claimed
             and g.nodes[n].get("first_input") == x and g.nodes[n].get("const_weight")]
    if anchor not in found or found[0] != anchor or len(found) < 2:
        raise NoMatch(None, [anchor])
    dtypes = {tuple(g.nodes[n]["dtypes"]) for n in found}
    biases = {g.nodes[n].get("has_bias") for n in found}
    if len(dtypes) > 1:
        raise NoMatch(WORDS("sibling_dtypes", op=_label(attrs["kind"]), x=x), found)
    if len(biases) > 1:
        raise NoMatch(WORDS("sibling_bias", op=_label(attrs["kind"]), x=x), found)
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
        siblings=pattern.siblings,
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
                matcher = pattern.match or (_match_siblings if pattern.siblings else _match)
                matched = matcher(g, pattern, anchor, claimed)
            except NoMatch as why:
                if why.reason and not _outranked(why.reason, pattern):
                    refused.append(NearMiss(pattern.name, why.nodes, why.reason))
                continue
            chain = _make_chain(g, pattern, matched)
            chains.append(chain)
            for n in chain.nodes:
                claimed[n] = chain.id
    for kind, pattern_name in ALREADY_FUSED.items():
        for n in by_kind.get(kind, ()):
            refused.append(NearMiss(pattern_name, (n,), WORDS("already_fused", op=g.nodes[n]['target'].split('.')[1])))
    chains.sort(key=lambda c: g.nodes[c.nodes[0]]["order"])
    patterns = tuple(patterns)
    alternatives = tuple(alt for c in chains for alt in _alternatives(g, patterns, by_kind, c, claimed))
    per_pattern = Counter(c.pattern for c in chains)
    return Detection(
        model=str(g.graph.get("model", "model")),
        fingerprint=str(g.graph.get("fingerprint", "")),
        chains=tuple(chains),
        near_misses=tuple(_keep_informative(refused, claimed)),
        totals={k: int(g.graph[k]) for k in ("nodes", "ops", "params", "flops", "bytes", "launches") if k in g.graph},
        counts={p.name: per_pattern.get(p.name, 0) for p in PATTERNS},
        alternatives=alternatives,
    )


def _try(g: nx.DiGraph, pattern: Pattern, anchor: str, claimed: dict[str, str]) -> Chain | None:
    try:
        matcher = pattern.match or (_match_siblings if pattern.siblings else _match)
        return _make_chain(g, pattern, matcher(g, pattern, anchor, claimed))
    except NoMatch:
        return None


def _alternatives(g: nx.DiGraph, patterns: tuple[Pattern, ...], by_kind: dict[str, list[str]], chain: Chain,
                  claimed: dict[str, str]) -> list[Alternative]:
    """Other ways to fuse ``chain``'s nodes: each pattern of another name, tried at the chain's nodes and their
    neighbours as if the chain had claimed nothing. A match that takes a node of the chain is kept when it
    reaches beyond the chain, or when the rest of the chain then forms chains of its own (a partition); a
    match that is only a part of the chain, leaving its other ops unfused, is no alternative worth a choice."""
    nodes = set(chain.nodes)
    free = {n: c for n, c in claimed.items() if c != chain.id}
    near = set(nodes)
    for n in chain.nodes:
        near.update(g.predecessors(n))
        near.update(g.successors(n))
    found: list[Alternative] = []
    seen: set[tuple[str, ...]] = set()
    for pattern in patterns:
        if pattern.name == chain.pattern:
            continue
        kinds = set(pattern.anchor_kinds)
        for anchor in sorted((n for n in near if g.nodes[n]["kind"] in kinds), key=lambda n: g.nodes[n]["order"]):
            if anchor in free:
                continue
            alt = _try(g, pattern, anchor, free)
            if alt is None or not nodes & set(alt.nodes):
                continue
            rest = _rest_chains(g, patterns, by_kind, nodes - set(alt.nodes),
                                {**free, **{n: alt.id for n in alt.nodes}})
            key = tuple(sorted(c.id for c in (alt, *rest)))
            if key in seen or (set(alt.nodes) <= nodes and not rest):
                continue
            seen.add(key)
            found.append(Alternative(chain.id, tuple(sorted((alt, *rest), key=lambda c: g.nodes[c.nodes[0]]["order"]))))
    return found


def _rest_chains(g: nx.DiGraph, patterns: tuple[Pattern, ...], by_kind: dict[str, list[str]], rest: set[str],
                 claimed: dict[str, str]) -> list[Chain]:
    """The chains the registry's order forms among ``rest`` (a chain's nodes an alternative left), given ``claimed``."""
    out: list[Chain] = []
    claimed = dict(claimed)
    for pattern in patterns:
        for anchor in sorted((n for k in pattern.anchor_kinds for n in by_kind.get(k, ()) if n in rest),
                             key=lambda n: g.nodes[n]["order"]):
            if anchor in claimed:
                continue
            chain = _try(g, pattern, anchor, claimed)
            if chain is None or not set(chain.nodes) <= rest | {n for n in chain.nodes if n not in claimed}:
                continue
            out.append(chain)
            claimed.update({n: chain.id for n in chain.nodes})
    return out


def _outranked(reason: str, pattern: Pattern) -> bool:
    """A near miss that only says "already in chain X" where X's pattern claims nodes before this one (the
    registry's order): not a near miss, just the order at work. (``NoMatch`` of a pattern's own matcher
    wraps its reason under the pattern's label, and is read through.)"""
    while isinstance(reason, Message) and reason.id == "fusion.own_matcher":
        reason = reason.args["reason"]
    if not (isinstance(reason, Message) and reason.id == "fusion.already_in_chain"):
        return False
    return not str(reason.args["chain"]).startswith(pattern.name + "@")


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


class Analysis(NamedTuple):
    """A loaded model, its annotated graph and what ``detect`` found in it."""

    model: LoadedModel
    graph: nx.DiGraph
    detection: Detection


def analyze(source: str, batch: int | None = None, seq_len: int | None = None) -> Analysis:
    """Load a source (``explorer.sources.load_model``), build its graph and detect its chains."""
    model = load_model(source, batch=batch, seq_len=seq_len)
    graph = build_graph(model.gm, model.name)
    return Analysis(model, graph, detect(graph))


def fuse(analysis: Analysis, plan: Plan | None = None, target: Target | str = "cpu", level: str = "all") -> FusedModel:
    """The fused model a plan makes for ``target`` (every chain accepted when ``plan`` is None): each chain's
    kernel is chosen once for the target's device, dtype and memory format and recorded on its fused call
    (``explorer.fusions.rewrite``); a device name alone means fp32 in the plan's memory format. The original
    is untouched."""
    plan = plan if plan is not None else make_plan(analysis.detection, "all")
    return apply_plan(analysis.model.gm, analysis.detection, plan, target, level)


def unfused_launches(graph: nx.DiGraph, chain: Chain) -> int:
    """The kernels a chain's ops launch unfused (the graph's ``launches`` of its nodes: views launch none)."""
    return int(sum(graph.nodes[n].get("launches", 0) for n in chain.nodes if n in graph))


def launch_counts(analysis: Analysis, applied: Iterable[AppliedChain], accepted: Iterable[str],
                  device: str) -> launches.LaunchCounts:
    """The model's kernel launches on ``device`` before and after the ``accepted`` chains, each chain's from
    what the rewrite made of it (``applied``: ``AppliedChain`` values, ``explorer.launches``). The one count
    the Graph and Fusions pages, the runner's report and the command line show."""
    graph, detection = analysis.graph, analysis.detection
    by_id = {a.chain_id: a for a in applied}
    per_chain = {c.id: launches.chain_launches(c.id, unfused_launches(graph, c), by_id.get(c.id))
                 for c in detection.known_chains().values() if c.id in by_id}
    return launches.count(int(detection.totals.get("launches", 0)), per_chain, accepted, device)


def chain_launch_table(analysis: Analysis, plan: Plan | None, device: Target | str) -> launches.LaunchCounts:
    """Every chain's launches on ``device`` (a ``Target``, or a device name: fp32) with ``plan``'s kernel
    choices and memory format, as if every chain were accepted (a chain's kernel does not depend on which
    others are): the Fusions page's column, and, restricted to the accepted chains (``launches.count``), the
    count of any plan of those choices. Each chain's count is read from its one kernel choice (its label)."""
    plan = plan if plan is not None else make_plan(analysis.detection, "all")
    every = make_plan(analysis.detection, "all", memory_format=plan.memory_format, cuda_graphs=plan.cuda_graphs,
                      kernels=dict(plan.kernels))
    name = device.device if isinstance(device, Target) else device
    fused = apply_plan(analysis.model.gm, analysis.detection, every, device, "all")
    table = launch_counts(analysis, fused.applied, every.accepted, name)
    extra = [c for r in _alternative_rounds(analysis, every, device) for c in r.chains]
    return dataclasses.replace(table, chains=table.chains + tuple(extra)) if extra else table


def _alternative_rounds(analysis: Analysis, every: Plan, device: Target | str) -> list[launches.LaunchCounts]:
    """The alternatives' chains' launches: rounds of plans, each taking as many alternatives as do not overlap
    (a chain's kernel does not depend on which others are accepted, as in ``chain_launch_table``)."""
    from explorer.fusions.plan import choose_alternative

    pending, rounds = list(analysis.detection.alternatives), []
    while pending:
        plan, taken, later, chosen = every, set(), [], []
        for alt in pending:
            nodes = {n for c in alt.chains for n in c.nodes}
            if nodes & taken or alt.instead_of in {a.instead_of for a in chosen}:
                later.append(alt)
                continue
            plan = choose_alternative(plan, analysis.detection, alt.id)
            taken |= nodes
            chosen.append(alt)
        fused = apply_plan(analysis.model.gm, analysis.detection, plan, device, "all")
        ids = [c.id for a in chosen for c in a.chains]
        name = device.device if isinstance(device, Target) else device
        rounds.append(launch_counts(analysis, fused.applied, ids, name))
        pending = later
    return rounds
