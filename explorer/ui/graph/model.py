"""The view model: what a drawn graph is made of, renderer-neutral (no pyvis, no SVG here).

A ``GraphView`` is nodes (``ViewNode``: an op, a collapsed module or a fused chain, with its label,
tooltip, colours, size and fixed position), edges (``ViewEdge``, with the waypoints that route them
around nodes) and one ``ChainBand`` per chain drawn as a unit. ``ViewOptions`` says what to draw;
``LegendItem`` is one pattern of the legend. The styles (colours, box sizes, gaps) and the colour
arithmetic that both renderers use live here too, so the pyvis page and the SVG draw the same thing.
"""

from __future__ import annotations

import dataclasses
import re

PLAIN_COLOR = "#f4f4f4"      # ops in no chain
PLAIN_BORDER = "#9e9e9e"
REJECTED_FILL = "#e6e6e6"    # rejected chains: grey fill, pattern-coloured dashed border
GROUP_COLOR = "#eef1f6"      # a collapsed module with no accepted chain
GROUP_BORDER = "#424242"
IO_COLOR = "#ffe082"         # model inputs and output
EDGE_COLOR = "#7a7a7a"
HIGHLIGHT_BORDER = "#d81b60"  # search hits
DEFAULT_MAX_NODES = 600
DIRECTIONS = ("TB", "LR")

FONT_PX = 14                 # label font size in graph units (on screen at zoom 1)
OP_WIDTH, OP_HEIGHT = 170, 44
FUSED_HEIGHT = 60
MODULE_WIDTH, MODULE_HEIGHT = 230, 64
LAYER_GAP = 44               # free space between two layers
SLOT_GAP = 46                # free space between two neighbours in a layer
BAND_PAD = 7                 # how far a chain's band reaches around its nodes
CHARS_PER_LINE = {OP_WIDTH: 19, MODULE_WIDTH: 27}


@dataclasses.dataclass(frozen=True)
class ViewOptions:
    """What to draw.

    depth      collapse modules by origin prefix of this many dotted parts (0: no collapse)
    expand     module prefixes to open one level further
    focus      node ids to centre on (one chain's nodes): drawn with their neighbourhood;
               empty: the whole graph
    hops       neighbourhood radius around ``focus``
    highlight  node ids to mark (search hits); a hit inside a collapsed module marks the module
    reveal     a node that must be drawn on its own: the modules around it are opened
    max_nodes  hard cap on drawn nodes; beyond it the view collapses on its own
    direction  "TB" (top to bottom, the default) or "LR" (left to right)
    lang       the language of labels, tooltips and notes: "en" (the default) or "zh"
    """

    depth: int = 0
    expand: tuple[str, ...] = ()
    focus: tuple[str, ...] = ()
    hops: int = 2
    highlight: tuple[str, ...] = ()
    reveal: str | None = None
    max_nodes: int = DEFAULT_MAX_NODES
    direction: str = "TB"
    lang: str = "en"


@dataclasses.dataclass(frozen=True)
class ViewNode:
    """One drawn node: an op, a collapsed module (``members`` > 1) or a fused chain (``kind`` "fused")."""

    id: str
    label: str
    title: str             # hover text
    fill: str
    border: str
    dashed: bool = False
    shape: str = "box"
    members: int = 1       # >1 for a collapsed module
    chain: str | None = None
    pattern: str | None = None
    highlighted: bool = False
    x: float = 0.0
    y: float = 0.0
    width: float = OP_WIDTH
    height: float = OP_HEIGHT
    kind: str = "op"       # op | io | module | fused


@dataclasses.dataclass(frozen=True)
class ViewEdge:
    """A drawn edge; ``points`` are the waypoints (graph units) that route it around nodes."""

    source: str
    target: str
    title: str = ""
    weight: int = 1        # how many graph edges it stands for
    points: tuple[tuple[float, float], ...] = ()


@dataclasses.dataclass(frozen=True)
class ChainBand:
    """One chain drawn as a unit: a band around its drawn nodes, along its own edges."""

    chain: str
    title: str
    pattern: str
    accepted: bool
    fill: str
    border: str
    nodes: tuple[str, ...]
    paths: tuple[tuple[tuple[float, float], ...], ...]   # polylines (node centres and waypoints) it follows


@dataclasses.dataclass(frozen=True)
class GraphView:
    """Everything a renderer needs to draw one view of a graph."""

    nodes: tuple[ViewNode, ...]
    edges: tuple[ViewEdge, ...]
    total_nodes: int            # nodes in the full graph
    depth: int                  # collapse depth actually used
    collapsed_modules: tuple[str, ...]   # modules drawn as one node (expandable)
    notes: tuple[str, ...] = ()
    bands: tuple[ChainBand, ...] = ()
    direction: str = "TB"
    drawn_of: tuple[tuple[str, str], ...] = ()   # (graph node, drawn node id) for every drawn graph node

    def drawn_id(self, node: str) -> str | None:
        """The id of the drawn node that shows graph node ``node`` (itself, its module, its fused chain)."""
        return dict(self.drawn_of).get(node)


@dataclasses.dataclass(frozen=True)
class LegendItem:
    """One pattern in the legend, with how many chains of it the model has."""

    name: str
    label: str
    color: str
    count: int


# ------------------------------------------------------------------ styles both renderers draw

def border_width(node: ViewNode) -> float:
    """How thick a node's border is drawn: thickest for a search hit, thicker for a rejected chain's op,
    a module or a fused chain."""
    return 4 if node.highlighted else (2.5 if node.dashed or node.members > 1 or node.kind == "fused" else 1.5)


def box_of(node: ViewNode) -> tuple[float, float, float, float]:
    """(left, top, right, bottom) of a node's box in graph units."""
    return (node.x - node.width / 2, node.y - node.height / 2, node.x + node.width / 2, node.y + node.height / 2)


def _rgb(color: str) -> tuple[int, int, int] | None:
    m = re.fullmatch(r"#([0-9a-fA-F]{6})", color)
    if not m:
        return None
    v = int(m.group(1), 16)
    return (v >> 16) & 255, (v >> 8) & 255, v & 255


def darker(color: str, factor: float = 0.65) -> str:
    """``color`` (``#rrggbb``) darkened by ``factor``; any other spelling as it is."""
    rgb = _rgb(color)
    if rgb is None:
        return color
    return "#{:02x}{:02x}{:02x}".format(*(int(c * factor) for c in rgb))


def tint(color: str, strength: float) -> str:
    """``color`` mixed with white: ``strength`` 1 is the colour, 0 is white."""
    rgb = _rgb(color)
    if rgb is None:
        return color
    return "#{:02x}{:02x}{:02x}".format(*(int(255 - (255 - c) * strength) for c in rgb))


def text_color(fill: str) -> str:
    """Black or white, whichever reads on ``fill``."""
    rgb = _rgb(fill)
    if rgb is None:
        return "#000000"
    r, g, b = rgb
    return "#000000" if (0.299 * r + 0.587 * g + 0.114 * b) > 150 else "#ffffff"
