"""The drawn nodes: an op, a collapsed module or a fused chain as a ``ViewNode``, with its label, its
tooltip and its colours, in the language of the view.

A box label is at most ``CHARS_PER_LINE`` Latin characters a line (a CJK character counts two), so a
long module path is shortened by ``fit`` (the numbered parts first: ``…layer.3…self.query``). Every text
comes from the catalog (``explorer/ui/locale/graph.py``, keys ``gv.*``) through ``i18n.t_in``, which
needs no Streamlit session. Pure.
"""

from __future__ import annotations

from collections import Counter

import networkx as nx

from explorer.fusions import BY_NAME, PATTERNS, color_of
from explorer.fusions.base import Chain
from explorer.ui.graph.collapse import SEGMENT
from explorer.ui.graph.model import (CHARS_PER_LINE, FUSED_HEIGHT, GROUP_BORDER, GROUP_COLOR, IO_COLOR,
                                     MODULE_HEIGHT, MODULE_WIDTH, OP_WIDTH, PLAIN_BORDER, PLAIN_COLOR,
                                     REJECTED_FILL, ViewNode, darker, tint)
from explorer.ui.graph.names import chain_name
from explorer.ui.i18n import catalog, t_in, translate_phrases, translate_text
from explorer.units import human_bytes, human_count


# ------------------------------------------------------------------ labels

def fit(text: str, chars: int) -> str:
    """A dotted module path in at most ``chars`` characters.

    The last part (``query``) and the numbered parts (``layer.3``, ``layer1.0``) tell ops
    apart, so they are kept first; then the parts nearest the end, as room allows; gaps
    are written "…" (``bert.encoder.layer.3.attention.self.query`` -> ``…layer.3…self.query``).
    """
    if len(text) <= chars:
        return text
    parts = text.split(".")
    last = len(parts) - 1
    keep = {last, last - 1} if parts[last].isdigit() and last else {last}   # downsample.0, not just 0
    numbered = []
    for i in range(last - 1, -1, -1):
        if parts[i].isdigit():
            numbered.append({i, i - 1} if i else {i})
        elif any(ch.isdigit() for ch in parts[i]):
            numbered.append({i})

    def render(idx: set) -> str:
        out, prev = "", -1
        for i in sorted(idx):
            out += ("…" if i != prev + 1 else ("." if out else "")) + parts[i]
            prev = i
        return out

    for extra in numbered:                 # the numbered parts nearest the end, while they fit
        if len(render(keep | extra)) <= chars:
            keep |= extra
    for i in range(last - 1, -1, -1):      # then the parts nearest the end, while they fit
        if i not in keep:
            if len(render(keep | {i})) > chars:
                break
            keep.add(i)
    text = render(keep)
    return text if len(text) <= chars else "…" + text[-(chars - 1):]


def text_width(text: str) -> int:
    """How many Latin characters' room ``text`` takes in a label (a CJK character or full-width mark: two)."""
    return sum(2 if "\u2e80" <= ch <= "\u9fff" or "\uff00" <= ch <= "\uffef" else 1 for ch in text)


def _box_label(label: str, lang: str, chars: int) -> str:
    """A pattern's label for a node box: in ``lang`` where that fits in ``chars``, else as registered (the
    short, technical name: "Add+LayerNorm", whose Chinese adds a gloss; the tooltip has the whole)."""
    shown = translate_text(label, lang)
    return shown if text_width(shown) <= chars else label


def _op_label(nid: str, a: dict) -> str:
    kind = str(a.get("kind", "?"))
    origin = str(a.get("origin", nid))
    chars = CHARS_PER_LINE[OP_WIDTH]
    second = origin if origin != kind else nid
    return f"{fit(kind, chars)}\n{fit(second, chars)}"


def _node_title(nid: str, a: dict, chain: Chain | None, accepted: bool, lang: str = "en") -> str:
    scalar = t_in(lang, "gv.scalar")
    shapes = "; ".join("x".join(str(d) for d in s) or scalar for s in a.get("shapes", [])) or "-"
    lines = [
        f"{nid}  ({a.get('kind', '?')})",
        t_in(lang, "gv.tip.op", op=a.get("target", "?")),
        t_in(lang, "gv.tip.origin", origin=a.get("origin", "?")),
        t_in(lang, "gv.tip.shape", shapes=shapes, dtypes=", ".join(a.get("dtypes", []))),
        t_in(lang, "gv.tip.bytes", read=human_bytes(a.get("bytes_read", 0)),
             written=human_bytes(a.get("bytes_written", 0))),
        t_in(lang, "gv.tip.flops", flops=human_count(a.get("flops", 0))),
    ]
    if chain is not None:
        status = t_in(lang, "gv.status.accepted" if accepted else "gv.status.rejected")
        lines.append(t_in(lang, "gv.tip.chain", name=chain_name(chain), status=status))
        lines.append(t_in(lang, "gv.tip.chain_id", id=chain.id))
    return "\n".join(lines)


def implementation_text(label: str, lang: str = "en") -> str:
    """An engine's implementation label (``rewrite.AppliedChain.implementation``: "cudnn conv+bias+relu (1 fused
    call: ...)") in ``lang``: its prose translated (``i18n.translate_phrases``), its op and kernel names as
    written."""
    return translate_phrases(label, lang)


# ------------------------------------------------------------------ nodes

def _chain_colours(pattern: str, accepted: bool) -> tuple[str, str]:
    color = color_of(pattern)
    if accepted:
        return color, darker(color)
    return REJECTED_FILL, color


def op_node(nid: str, graph: nx.DiGraph, node_chain: dict, chains: dict, accepted: set,
            highlighted: bool, lang: str = "en") -> ViewNode:
    """One graph node drawn on its own: an op (its chain's colours, dashed when rejected), a model input or
    output, or a fused chain of a ``fused_graph``."""
    a = graph.nodes[nid]
    kind = a.get("kind", "?")
    if kind == "fused":
        return _fused_node(nid, a, chains, highlighted, lang)
    chain = chains.get(node_chain.get(nid, ""))
    label = _op_label(nid, a)
    if chain is None:
        io = kind in ("input", "output")
        return ViewNode(id=nid, label=label, title=_node_title(nid, a, None, False, lang),
                        fill=IO_COLOR if io else PLAIN_COLOR, border=PLAIN_BORDER, highlighted=highlighted,
                        kind="io" if io else "op")
    ok = chain.id in accepted
    fill, border = _chain_colours(chain.pattern, ok)
    return ViewNode(id=nid, label=label, title=_node_title(nid, a, chain, ok, lang),
                    fill=fill, border=border, dashed=not ok, chain=chain.id, pattern=chain.pattern,
                    highlighted=highlighted)


def kernel_name(impl: str, lang: str = "en") -> str:
    """A kernel choice's name as the view shows it: the ones that are English words (``separate``,
    ``reference``) in the chosen language, the names of libraries and kernels (``triton``, ``cudnn_conv_relu``)
    as they are."""
    key = f"gv.impl.{impl}"
    return t_in(lang, key) if key in catalog() else impl


def _fused_node(nid: str, a: dict, chains: dict, highlighted: bool, lang: str = "en") -> ViewNode:
    """A fused chain's node: its pattern, first module and kernel (with its launches); dashed where no fused
    kernel runs (the same ops one after another)."""
    chain = chains.get(a.get("chain", nid))
    pattern = a.get("pattern", "")
    label_of = translate_text(BY_NAME[pattern].label, lang) if pattern in BY_NAME else pattern
    chars = CHARS_PER_LINE[OP_WIDTH]
    box_label = _box_label(BY_NAME[pattern].label, lang, chars) if pattern in BY_NAME else pattern
    members = a.get("members", ())
    first = chain.names[0] if chain is not None and chain.names else str(a.get("origin", ""))
    n_launches = a.get("launches")
    impl = kernel_name(str(a.get("kernel", "?")), lang)
    kernel = f"⚙ {impl}" + (f" ×{n_launches}" if isinstance(n_launches, int) and n_launches > 1 else "")
    label = "\n".join([fit(box_label, chars), fit(first, chars), kernel[:chars]])
    fill, border = _chain_colours(pattern, True)
    lines = [t_in(lang, "gv.tip.fused_chain", name=a.get("title") or nid), t_in(lang, "gv.tip.chain_id", id=nid),
             t_in(lang, "gv.tip.pattern", pattern=label_of), t_in(lang, "gv.tip.kernel", kernel=impl),
             t_in(lang, "gv.tip.runs", implementation=implementation_text(str(a.get("implementation", "?")), lang)),
             t_in(lang, "gv.tip.replaces", n=len(members), ops=chain.ops_text if chain else ", ".join(members)),
             t_in(lang, "gv.tip.launches_device", before=a.get("launches_unfused", "?"), n=a.get("launches", "?"))]
    if not a.get("fused_kernel", True):
        lines.append(t_in(lang, "gv.tip.no_fused_kernel"))
    return ViewNode(id=nid, label=label, title="\n".join(lines), fill=fill, border=border,
                    dashed=not a.get("fused_kernel", True), chain=nid, pattern=pattern,
                    highlighted=highlighted, height=FUSED_HEIGHT, kind="fused")


def group_node(key: str, members: list[str], graph: nx.DiGraph, node_chain: dict, chains: dict,
               accepted: set, highlighted: bool, lang: str = "en") -> ViewNode:
    """A collapsed module (or a run of ops, key ``SEGMENT``...) drawn as one box: its chains' main pattern
    tints it (grey when none is accepted, dashed when not all are); the label counts its ops and chains."""
    # the chains in graph order, so that a tie between patterns goes to the first (a set's order would
    # change with the process's string hashing, and with it the module's colour)
    in_chains = list(dict.fromkeys(
        c for m in members
        for c in (node_chain.get(m), graph.nodes[m].get("chain") if graph.nodes[m].get("kind") == "fused" else None)
        if c is not None))
    by_pattern = Counter(chains[c].pattern for c in in_chains if c in chains)
    n_acc = sum(1 for c in in_chains if c in accepted or any(
        graph.nodes[m].get("chain") == c for m in members))
    if by_pattern:
        top = by_pattern.most_common(1)[0][0]
        color = color_of(top)
        fill = tint(color, 0.45) if n_acc else REJECTED_FILL
        border, dashed = (darker(color), False) if n_acc == len(in_chains) else (color, True)
    else:
        top, fill, border, dashed = None, GROUP_COLOR, GROUP_BORDER, False
    label = _group_label(key, len(members), len(in_chains), by_pattern, lang)
    title = _group_title(key, members, graph, len(in_chains), n_acc, by_pattern, lang)
    return ViewNode(id=f"module:{key}", label=label, title=title, fill=fill, border=border,
                    dashed=dashed, shape="box", members=len(members), pattern=top, highlighted=highlighted,
                    width=MODULE_WIDTH, height=MODULE_HEIGHT, kind="module")


def _group_label(key: str, n_ops: int, n_chains: int, by_pattern: Counter, lang: str) -> str:
    """Three lines: the module (or run), how many ops and chains, and which patterns (shortened to fit)."""
    chars = CHARS_PER_LINE[MODULE_WIDTH]
    short = {p.name: _box_label(p.label, lang, chars) for p in PATTERNS}
    inside = (", ".join(f"{n} {short.get(p, p)}" for p, n in by_pattern.most_common())
              or t_in(lang, "gv.group.no_chain"))
    inside_line = inside
    while text_width(inside_line) > chars:
        inside_line = inside_line[:-2] + "…"
    shown = t_in(lang, "gv.group.segment", range=key[len(SEGMENT):]) if key.startswith(SEGMENT) else key
    return "\n".join([fit(shown, chars), t_in(lang, "gv.group.counts", ops=n_ops, chains=n_chains), inside_line])


def _group_title(key: str, members: list[str], graph: nx.DiGraph, n_chains: int, n_acc: int,
                 by_pattern: Counter, lang: str) -> str:
    """The module's tooltip: its chains by pattern, its ops by kind, first and last op, bytes and FLOPs."""
    segment = key.startswith(SEGMENT)
    ops = Counter(str(graph.nodes[m].get("kind", "?")) for m in members)
    flops = sum(graph.nodes[m].get("flops", 0) for m in members)
    moved = sum(graph.nodes[m].get("bytes_read", 0) + graph.nodes[m].get("bytes_written", 0) for m in members)
    label_of = {p.name: translate_text(p.label, lang) for p in PATTERNS}
    lines = [t_in(lang, "gv.tip.run_of" if segment else "gv.tip.module", module=key, ops=len(members),
                  chains=n_chains, accepted=n_acc)]
    lines += [f"  {n} x {label_of.get(p, p)}" for p, n in by_pattern.most_common()]
    lines += [t_in(lang, "gv.tip.ops", ops=", ".join(f"{n} {k}" for k, n in ops.most_common(8))
                   + (" …" if len(ops) > 8 else ""))]
    lines += [t_in(lang, "gv.tip.first_last", first=members[0], last=members[-1])]
    lines += [t_in(lang, "gv.tip.moved", bytes=human_bytes(moved)), t_in(lang, "gv.tip.flops", flops=human_count(flops))]
    if not segment:
        lines.append(t_in(lang, "gv.tip.expand"))
    return "\n".join(lines)
