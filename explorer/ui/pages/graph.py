"""Graph page: the model's ops in layers, each chain a band of its pattern's colour, and the graph
after the accepted fusions beside it.

The views come from ``explorer.graph_view`` (pure) and are drawn by its pyvis renderer; the
fused graph is what the engine's ``fusion_engine.fuse`` made of the current plan. Every text is in
the sidebar's language: the page's through ``i18n.t`` (``locale/graph.py``), the drawing's through
``ViewOptions.lang`` and ``RenderOptions.lang``. A widget's ``format_func`` takes the language as a
default argument (the test harness calls it after the run, outside the session).

Widget keys: graph_mode (original | fused | side), graph_depth, graph_expand, graph_direction,
graph_search, graph_match, graph_prev, graph_next, graph_chain, graph_hops.
"""

from __future__ import annotations

import dataclasses
import html as html_lib
import json

import streamlit as st

from explorer import graph_view
from explorer.fusions import BY_NAME
from explorer.graph_view import FusedChain, RenderOptions, ViewOptions
from explorer.ui import files as ui_files
from explorer.ui import links
from explorer.ui import state as ui_state
from explorer.ui.i18n import current as current_language
from explorer.ui.i18n import message, t, t_in, translate_text

HEIGHT = 640
WHOLE = "(whole graph)"   # the chain picker's value for the whole graph (shown as t("graph.whole"))
MODES = links.VIEWS       # shown as t("graph.mode.<view>")


@st.cache_data(max_entries=16, show_spinner=False)
def fused_chains(model_key: tuple, plan_json: str, device: str, _analysis) -> dict[str, tuple[str, str, bool]]:
    """{chain id: (kernel, implementation, fused kernel?)} of every chain the engine fused under the plan."""
    from explorer.fusion_engine import fuse
    from explorer.fusions.plan import Plan

    fused = fuse(_analysis, Plan.from_json(plan_json), device)
    return {a.chain_id: (a.impl, a.implementation, a.fused_kernel) for a in fused.applied if a.status == "fused"}


@st.cache_data(max_entries=32, show_spinner=False)
def view_html(model_key: tuple, accepted: tuple, fused_key: tuple, options_json: str, render_json: str,
              _graph, _detection) -> dict:
    """One drawn view (cached per model, choices, fused chains and options): its html and facts."""
    options = ViewOptions(**{k: tuple(v) if isinstance(v, list) else v
                             for k, v in json.loads(options_json).items()})
    render = RenderOptions(**json.loads(render_json))
    graph = _graph
    if render.name == "fused":
        graph = graph_view.fused_graph(_graph, _detection, {cid: FusedChain(*info) for cid, info in fused_key})
    view = graph_view.build_view(graph, _detection, accepted, options)
    return {"html": graph_view.render_html(view, render), "drawn": len(view.nodes), "total": view.total_nodes,
            "collapsed": view.collapsed_modules, "notes": view.notes, "depth": view.depth}


def _chip(color: str, text: str, border: str = "none") -> str:
    return (f"<span style='display:inline-block;margin:2px 12px 2px 0;white-space:nowrap'>"
            f"<span style='display:inline-block;width:12px;height:12px;border-radius:2px;background:{color};"
            f"border:{border};vertical-align:middle'></span> {text}</span>")


def legend_html(detection, lang: str = "en") -> str:
    """The legend: only the patterns this model has (with their chain counts), then the states."""
    def label(item) -> str:
        return t_in(lang, "graph.legend.unknown") if item.name == "unknown" else translate_text(item.label, lang)

    chips = [_chip(item.color, f"{html_lib.escape(label(item))} <b>{item.count}</b>")
             for item in graph_view.legend(detection)]
    chips.append(_chip(graph_view.REJECTED_FILL, html_lib.escape(t_in(lang, "graph.legend.rejected")),
                       "2px dashed #555"))
    chips.append(_chip(graph_view.PLAIN_COLOR, html_lib.escape(t_in(lang, "graph.legend.plain")), "1px solid #999"))
    chips.append(_chip("#ffffff", html_lib.escape(t_in(lang, "graph.legend.band")), "2px solid #777"))
    return "<div style='font-size:0.85rem;line-height:1.5'>" + "".join(chips) + "</div>"


def _step(hits: list[str], delta: int) -> None:
    """Callback of the ◀ ▶ buttons: the previous or next search hit."""
    current = st.session_state.get("graph_match")
    i = hits.index(current) if current in hits else -1
    st.session_state.graph_match = hits[(i + delta) % len(hits)]


def _describe_hit(graph, nid: str) -> str:
    a = graph.nodes[nid]
    return f"{nid} · {a.get('kind', '?')} · {a.get('origin', '')}"


def _chain_label(detection, cid: str, lang: str = "en") -> str:
    if cid == WHOLE:
        return t_in(lang, "graph.whole")
    chain = detection.chain(cid)
    pattern = translate_text(BY_NAME[chain.pattern].label, lang) if chain.pattern in BY_NAME else chain.pattern
    return f"{graph_view.chain_name(chain)} · {pattern}"


@ui_state.needs_model
def page(spec, model, graph, detection) -> None:
    ss = st.session_state
    lang = current_language()
    accepted = ui_state.accepted_ids(detection)
    acc_chains = [c for c in detection.chains if c.id in accepted]
    st.markdown(t("graph.summary", model=ui_files.escape_markdown(model.name), ops=graph.graph.get("ops", 0),
                  nodes=graph.number_of_nodes(), accepted=len(acc_chains), chains=len(detection.chains),
                  launches=sum(c.launches_saved for c in acc_chains),
                  traffic=graph_view.human_bytes(sum(c.bytes_saved for c in acc_chains)),
                  near=len(detection.near_misses)))

    # --- controls: the view, search, one chain; the layout's settings in a popover
    c = st.columns([2.6, 1.9, 2.2, 0.5, 0.5, 2.2, 1.1], vertical_alignment="bottom")
    if ss.graph_mode not in MODES:
        ss.graph_mode = "original"
    c[0].segmented_control(t("graph.view"), list(MODES), key="graph_mode",
                           format_func=lambda m, lang=lang: t_in(lang, f"graph.mode.{m}"), help=t("graph.view_help"))
    chain_ids = [WHOLE] + [ch.id for ch in detection.chains]
    if ss.graph_chain not in chain_ids:
        ss.graph_chain = WHOLE
    c[5].selectbox(t("graph.one_chain"), chain_ids, key="graph_chain",
                   format_func=lambda cid, lang=lang: _chain_label(detection, cid, lang),
                   help=t("graph.one_chain_help"))
    with c[6].popover(t("graph.layout"), help=t("graph.layout_help")):
        st.selectbox(t("graph.collapse"), [0, 1, 2, 3, 4], key="graph_depth",
                     format_func=lambda d, lang=lang: t_in(lang, "graph.collapse_none") if d == 0
                     else t_in(lang, "graph.collapse_depth", depth=d),
                     help=t("graph.collapse_help"))
        prefixes = graph_view.module_prefixes(graph)
        ss.graph_expand = [m for m in ss.graph_expand if m in prefixes]
        st.multiselect(t("graph.expand"), prefixes, key="graph_expand", help=t("graph.expand_help"),
                       placeholder=t("graph.expand_placeholder"))
        st.selectbox(t("graph.direction"), graph_view.DIRECTIONS, key="graph_direction",
                     format_func=lambda d, lang=lang: t_in(lang, f"graph.direction.{d}"))
        st.number_input(t("graph.hops"), min_value=0, max_value=8, step=1, key="graph_hops",
                        help=t("graph.hops_help"))

    focus: tuple[str, ...] = ()
    if ss.graph_chain != WHOLE:
        focus = tuple(detection.chain(ss.graph_chain).nodes)
    c[1].text_input(t("graph.search"), key="graph_search", placeholder=t("graph.search_placeholder"))
    hits = graph_view.find_nodes(graph, ss.graph_search) if ss.graph_search.strip() else []
    all_hits = len(hits)
    if focus and hits:
        near = graph_view.neighbourhood(graph, focus, int(ss.graph_hops))
        hits = [h for h in hits if h in near]
    if hits and ss.get("graph_match") not in hits:
        ss.graph_match = hits[0]
    c[2].selectbox(t("graph.matches", n=len(hits)), hits or ["—"], key="graph_match" if hits else "graph_match_none",
                   format_func=lambda n: _describe_hit(graph, n) if n in graph else n, disabled=not hits)
    c[3].button("◀", key="graph_prev", on_click=_step, args=(hits, -1), disabled=len(hits) < 2,
                help=t("graph.prev"))
    c[4].button("▶", key="graph_next", on_click=_step, args=(hits, 1), disabled=len(hits) < 2, help=t("graph.next"))
    current = ss.graph_match if hits else None
    if ss.graph_search.strip():
        if not all_hits:
            st.warning(t("graph.no_match", query=ui_files.escape_markdown(ss.graph_search[:80])))
        elif focus:
            st.caption(t("graph.in_neighbourhood", shown=len(hits), total=all_hits, hops=ss.graph_hops,
                         whole=t("graph.whole")))
        else:
            st.caption(t("graph.matches_marked", n=len(hits), i=hits.index(current) + 1,
                         node=ui_files.escape_markdown(current)))
    st.markdown(legend_html(detection, lang), unsafe_allow_html=True)

    options = ViewOptions(depth=int(ss.graph_depth), expand=tuple(ss.graph_expand), focus=focus,
                          hops=int(ss.graph_hops), highlight=tuple(hits), reveal=current,
                          direction=ss.graph_direction, lang=lang)
    model_key = (spec.source, spec.batch, spec.seq_len, detection.fingerprint)
    fused_key: tuple = ()
    mode = ss.graph_mode
    if mode in ("fused", "side"):
        try:
            plan = ui_state.current_plan(detection)
            with st.spinner(t("graph.applying")):   # shown only when it takes a while (not when cached)
                fused_key = tuple(sorted(fused_chains(
                    model_key, plan.to_json(), ss.get("device", "cpu"),
                    ui_state.load_analysis(spec.source, spec.batch, spec.seq_len)).items()))
        except Exception as exc:  # the original graph stays usable
            first = (str(exc).splitlines() or [type(exc).__name__])[0][:300]
            st.warning(t("graph.fuse_failed", error=ui_files.escape_markdown(message(first))))
            mode = "original"
    names = {"original": ["original"], "fused": ["fused"], "side": ["original", "fused"]}[mode]
    columns = st.columns(len(names)) if len(names) > 1 else [st.container()]
    counts = graph_view.fused_counts(graph, detection, {cid: FusedChain(*info) for cid, info in fused_key})
    for name, column in zip(names, columns):
        render = RenderOptions(height_px=HEIGHT, center_on=current, name=name, lang=lang)
        drawn = view_html(model_key, tuple(sorted(accepted)), fused_key if name == "fused" else (),
                          json.dumps(dataclasses.asdict(options)), json.dumps(dataclasses.asdict(render)),
                          graph, detection)
        with column:
            if len(names) > 1 or name == "fused":
                nodes = counts.nodes_before if name == "original" else counts.nodes_after
                launches = counts.launches_before if name == "original" else counts.launches_after
                st.markdown(t("graph.title_counts", title=t(f"graph.title.{name}"), nodes=nodes, launches=launches))
            for note in drawn["notes"]:
                st.info(ui_files.escape_markdown(note))
            st.iframe(drawn["html"], height=HEIGHT + 10)
            st.caption(t("graph.drawing", drawn=drawn["drawn"], total=drawn["total"])
                       + (t("graph.drawing_collapsed", depth=drawn["depth"], n=len(drawn["collapsed"]))
                          if drawn["collapsed"] else ""))
    if mode != "original":
        st.markdown(t("graph.fused_summary", before=counts.nodes_before, after=counts.nodes_after,
                      launches_before=counts.launches_before, launches_after=counts.launches_after,
                      saved=counts.launches_before - counts.launches_after, fused=counts.chains_fused,
                      device=ss.get("device", "cpu")))
    st.caption(t("graph.navigate"))


ui_state.guarded(page)
