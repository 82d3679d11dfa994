"""Links to a view of the app: ``?model=residual_block&dtype=fp16&device=cpu&view=fused``.

``&overlay=speedup`` colours the chains by a measure of the last report (``OVERLAYS``).
A teacher hands out such a link and it opens on that model, dtype, device and graph view.
``apply_query_params`` reads the URL once per session, before the sidebar's widgets are drawn,
and sets their keys (``zoo_name``, ``model_kind``, ``dtype``, ``device``, ``graph_mode``,
``graph_overlay``);
``sync_query_params`` writes the current choices back into the address bar on every run, so
the address bar is always a link to what is on screen. Values the app does not know are
reported and ignored, never obeyed; the report is in the link's language (``lang=``), else the
session's (``explorer.ui.i18n``).

Session state: ``links_applied`` (the URL was read for this session).
"""

from __future__ import annotations

import re
from typing import Iterable

import streamlit as st

from explorer.ui import i18n

#: The graph page's views, as written in the URL (``view=``) and kept in ``graph_mode``.
VIEWS = ("original", "fused", "side", "compile", "compare")
#: The graph page's per-chain overlays (``overlay=``, kept in ``graph_overlay``; ``ui.graph_overlays.OVERLAYS``).
OVERLAYS = ("none", "speedup", "bytes", "launches", "precision", "predicted")


def apply_query_params(zoo_names: Iterable[str], dtypes: Iterable[str], devices: Iterable[str]) -> list[str]:
    """On a session's first run, set the widgets the URL names; return one line per value refused."""
    ss = st.session_state
    if ss.get("links_applied"):
        return []
    ss.links_applied = True
    params = st.query_params
    lang = params.get("lang") if params.get("lang") in i18n.LANGUAGES else i18n.current()
    refused = []
    wanted = {"model": (tuple(zoo_names), ("model_kind", "zoo_name")), "dtype": (tuple(dtypes), ("dtype",)),
              "device": (tuple(devices), ("device",)), "view": (VIEWS, ("graph_mode",)),
              "overlay": (OVERLAYS, ("graph_overlay",))}
    for name, (allowed, keys) in wanted.items():
        value = params.get(name)
        if value is None:
            continue
        if value not in allowed:
            shown = re.sub(r"[^A-Za-z0-9_.-]", "?", value[:40])   # echoed as plain text, never markdown
            refused.append(i18n.t_in(lang, "links.refused", name=name, value=shown, allowed=", ".join(allowed)))
            continue
        if name == "model":
            ss.model_kind, ss.zoo_name = "Zoo", value
        else:
            ss[keys[0]] = value
    return refused


def sync_query_params() -> None:
    """Write the active zoo model, dtype, device and graph view into the URL (only what changed)."""
    ss = st.session_state
    current = {"dtype": ss.get("dtype"), "device": ss.get("device"), "view": ss.get("graph_mode")}
    active = ss.get("active")
    if active is not None and getattr(active, "kind", "") == "zoo":
        current["model"] = active.source
    elif "model" in st.query_params:
        del st.query_params["model"]   # an upload or a folder cannot be linked to
    for name, value in current.items():
        if value and st.query_params.get(name) != value:
            st.query_params[name] = value
    overlay = ss.get("graph_overlay")
    if overlay and overlay != "none":
        if st.query_params.get("overlay") != overlay:
            st.query_params["overlay"] = overlay
    elif "overlay" in st.query_params:
        del st.query_params["overlay"]
