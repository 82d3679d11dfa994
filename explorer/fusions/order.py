"""The order in which patterns claim nodes: an explicit relation between families, sorted once.

Two patterns compete only where their chains could share a node; the one that
runs first claims it. Instead of global priority numbers (each new pattern
would have to know everyone else's), a family says which families it must run
before or after, beside its patterns:

    RUNS_BEFORE = ("conv", "linear")   # squeeze-excite holds 1×1 convs and an activation
    RUNS_AFTER = ("*",)                # the generic fallback: after every family that does not say "*" itself

Inside a family, its ``PATTERNS`` tuple is its order (longer chains first).
``order_patterns`` sorts the families topologically (Kahn's algorithm), ties
broken by registration order, so the result is deterministic; a cycle or an
unknown family name is an error at import, naming it.
"""

from __future__ import annotations

from types import ModuleType

WILDCARD = "*"


def family_name(module: ModuleType) -> str:
    """A family's name in the relation: its module's last name (``explorer.fusions.conv`` -> ``conv``)."""
    return module.__name__.rsplit(".", 1)[-1]


def family_order(families: tuple[ModuleType, ...]) -> list[ModuleType]:
    """The families sorted by their ``RUNS_BEFORE``/``RUNS_AFTER`` relations (registration order breaks ties)."""
    names = [family_name(f) for f in families]
    index = {n: i for i, n in enumerate(names)}
    edges: dict[str, set[str]] = {n: set() for n in names}   # a -> b: a runs before b
    wild_after = {n for n, f in zip(names, families) if WILDCARD in getattr(f, "RUNS_AFTER", ())}
    for name, fam in zip(names, families):
        for other in getattr(fam, "RUNS_BEFORE", ()):
            if other not in index:
                raise ValueError(f"family '{name}' runs before unknown family '{other}'")
            edges[name].add(other)
        for other in getattr(fam, "RUNS_AFTER", ()):
            if other == WILDCARD:
                edges.update({o: edges[o] | {name} for o in names if o not in wild_after})
            elif other not in index:
                raise ValueError(f"family '{name}' runs after unknown family '{other}'")
            else:
                edges[other].add(name)
    incoming = {n: 0 for n in names}
    for a, targets in edges.items():
        for b in targets:
            incoming[b] += 1
    ready = sorted((n for n in names if incoming[n] == 0), key=index.__getitem__)
    out: list[str] = []
    while ready:
        n = ready.pop(0)
        out.append(n)
        for b in edges[n]:
            incoming[b] -= 1
            if incoming[b] == 0:
                ready.append(b)
        ready.sort(key=index.__getitem__)
    if len(out) != len(names):
        raise ValueError(f"the families' order has a cycle among {sorted(set(names) - set(out))}")
    return [families[index[n]] for n in out]


def order_patterns(families: tuple[ModuleType, ...]) -> tuple:
    """Every family's ``PATTERNS``, families in ``family_order``, each family's own in its declared order."""
    return tuple(p for f in family_order(families) for p in f.PATTERNS)


def runs_before(families: tuple[ModuleType, ...], a: str, b: str) -> bool:
    """Whether pattern ``a`` claims nodes before pattern ``b`` in the registry's order."""
    names = [p.name for p in order_patterns(families)]
    return names.index(a) < names.index(b)
