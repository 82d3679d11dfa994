"""The drawn graph: which ops fuse into which chains, laid out in layers, drawn as a pyvis page or an SVG.

Split by what each part is, so that what is drawn is testable without a browser:

- the **view model** (``model``: ``GraphView``, ``ViewNode``, ``ViewEdge``, ``ChainBand``, the styles),
  built by ``build.build_view(graph, detection, accepted, options)`` from the networkx graph of
  ``explorer.graph.build``, the detection and the accepted chain ids: pure data, no renderer. Its parts:
  ``collapse`` (modules by origin prefix under a node cap), ``nodes`` (labels, tooltips, colours),
  ``names`` (chain names, search, sorting), ``fused`` (the graph after the accepted fusions:
  ``fused_graph``, ``FusedChain``, ``fused_counts``);
- the **layout** (``layout``: a layered Sugiyama layout by igraph, edges routed around nodes, and the
  geometry checks the tests use);
- the **renderers** of that one view model: ``pyvis_page.render_html`` (one offline HTML page, its
  script the package asset ``page.js``) and ``svg.render_svg`` / ``svg.render_png`` (for slides).

Every text a person reads in a view (labels, tooltips, notes, the overview's title) is in the language
``ViewOptions.lang`` / ``RenderOptions.lang`` names ("en" or "zh"), from the catalog
(``explorer/ui/locale/graph.py``, keys ``gv.*``) through ``explorer.ui.i18n.t_in``, which needs no
Streamlit session: nothing here imports Streamlit, and pyvis is imported only when a page is drawn.

      x ──────────┐
      ▼           │        ╭───────────╮ band: one chain (pattern colour)
    ╭─conv─╮      │        │ conv      │
    │ bn   │      │        │ bn        │ filled: accepted; grey, dashed: rejected
    ╰─relu─╯      │        │ add ◄─────┘ the skip edge routed around the chain
      ...         │

The names below are the package's public interface (the pages, the command line, the tests and the
benchmarks use them); ``svg`` is imported as its own module.
"""

from __future__ import annotations

from explorer.ui.graph.build import build_view, legend
from explorer.ui.graph.fused import FusedChain, FusedCounts, chain_launches, fused_counts, fused_graph
from explorer.ui.graph.layout import hidden_edges, layered_layout, overlapping_nodes, segment_hits_box
from explorer.ui.graph.model import (BAND_PAD, DEFAULT_MAX_NODES, DIRECTIONS, EDGE_COLOR, FONT_PX, GROUP_BORDER,
                                     GROUP_COLOR, HIGHLIGHT_BORDER, IO_COLOR, OP_HEIGHT, OP_WIDTH, PLAIN_COLOR,
                                     REJECTED_FILL, ChainBand, GraphView, LegendItem, ViewEdge, ViewNode,
                                     ViewOptions, box_of)
from explorer.ui.graph.names import chain_name, find_nodes, module_of, module_prefixes, natural_key, neighbourhood
from explorer.ui.graph.nodes import implementation_text
from explorer.ui.graph.pyvis_page import WAYPOINT_PREFIX, RenderOptions, remote_urls, render_html

__all__ = (
    "BAND_PAD", "DEFAULT_MAX_NODES", "DIRECTIONS", "EDGE_COLOR", "FONT_PX", "GROUP_BORDER", "GROUP_COLOR",
    "HIGHLIGHT_BORDER", "IO_COLOR", "OP_HEIGHT", "OP_WIDTH", "PLAIN_COLOR", "REJECTED_FILL", "WAYPOINT_PREFIX",
    "ChainBand", "FusedChain", "FusedCounts", "GraphView", "LegendItem", "RenderOptions", "ViewEdge", "ViewNode",
    "ViewOptions", "box_of", "build_view", "chain_launches", "chain_name", "find_nodes", "fused_counts",
    "fused_graph", "hidden_edges", "implementation_text", "layered_layout", "legend", "module_of",
    "module_prefixes", "natural_key", "neighbourhood", "overlapping_nodes", "remote_urls", "render_html",
    "segment_hits_box",
)
