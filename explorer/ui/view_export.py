"""The SVG and PNG downloads of a graph view (``explorer.ui.graph.svg``), shared by the Graph and Export pages.

The Graph page records each view it draws (``record``: the ``GraphView`` with its overlay paint, its
legend rows and title, in the page's language) in ``st.session_state.graph_export_views`` and offers the
two downloads under it; the Export page offers the recorded views again (``recorded``), or, before the
Graph page has drawn one in this language, the original graph under the Graph page's view options.
The PNG is made when its button is clicked (a deferred download) and cached per SVG.

Texts: ``export.view.*`` (``locale/export.py``).
"""

from __future__ import annotations

import hashlib
import importlib.util

import streamlit as st

from explorer.ui.graph import svg as graph_svg
from explorer.ui.i18n import t

SESSION_KEY = "graph_export_views"


@st.cache_data(max_entries=8, show_spinner=False)
def _png(digest: str, _svg: str) -> bytes:
    return graph_svg.render_png(_svg)


def png_available() -> bool:
    """Whether cairosvg is installed (the ``png`` extra)."""
    return importlib.util.find_spec("cairosvg") is not None


def record(model_key: tuple, name: str, lang: str, view, legend, title: str) -> None:
    """Remember the view the Graph page drew as ``name`` (original, fused, compile, compare)."""
    views = st.session_state.setdefault(SESSION_KEY, {})
    views[name] = {"model": model_key, "lang": lang, "view": view, "legend": list(legend), "title": title}


def recorded(model_key: tuple, lang: str) -> dict[str, dict]:
    """The views the Graph page drew of this model in this language, by name."""
    views = st.session_state.get(SESSION_KEY) or {}
    return {n: v for n, v in views.items() if v["model"] == model_key and v["lang"] == lang}


def buttons(container, stem: str, view, legend, title: str, key: str) -> None:
    """Two download buttons in ``container``: the view as SVG and as PNG."""
    svg = graph_svg.render_svg(view, legend, title)
    c = container.columns(2)
    c[0].download_button(t("export.view.svg"), svg.encode("utf-8"), file_name=f"{stem}.svg", mime="image/svg+xml",
                         key=f"{key}_svg", help=t("export.view.svg_help"), on_click="ignore")
    if png_available():
        digest = hashlib.sha256(svg.encode("utf-8")).hexdigest()
        c[1].download_button(t("export.view.png"), lambda: _png(digest, svg), file_name=f"{stem}.png",
                             mime="image/png", key=f"{key}_png", help=t("export.view.png_help"), on_click="ignore")
    else:
        c[1].download_button(t("export.view.png"), b"", file_name=f"{stem}.png", mime="image/png", key=f"{key}_png",
                             disabled=True, help=t("export.view.png_missing"))
