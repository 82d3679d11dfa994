"""Graph page: the model's ops, coloured by the chain each belongs to.

Widget keys: graph_depth, graph_expand, graph_search, graph_chain, graph_hops.
"""

from __future__ import annotations

import dataclasses
import html as html_lib

import streamlit as st

from explorer import graph_view
from explorer.ui import state as ui_state
from explorer.graph_view import ViewOptions

HEIGHT = 640
WHOLE = "(whole graph)"


@st.cache_data(max_entries=32, show_spinner=False)
def _graph_html(model_key: tuple, accepted: tuple, options_json: str, _graph, _detection) -> tuple:
    """(html, node count, collapsed modules, notes, depth) of one view; cached per model+choices+options."""
    import json

    options = ViewOptions(**{k: tuple(v) if isinstance(v, list) else v
                             for k, v in json.loads(options_json).items()})
    view = graph_view.build_view(_graph, _detection, accepted, options)
    return (graph_view.render_html(view, HEIGHT), len(view.nodes), view.collapsed_modules,
            view.notes, view.depth, view.total_nodes)


def legend_html(detection) -> str:
    chips = []
    for item in graph_view.legend(detection):
        if item.name == "unknown":
            continue
        chips.append(f"<span style='display:inline-block;margin:2px 10px 2px 0'>"
                     f"<span style='display:inline-block;width:12px;height:12px;border-radius:2px;"
                     f"background:{item.color};vertical-align:middle'></span> "
                     f"{html_lib.escape(item.label)} <b>{item.count}</b></span>")
    chips.append("<span style='display:inline-block;margin:2px 10px 2px 0'>"
                 "<span style='display:inline-block;width:12px;height:12px;background:#e6e6e6;"
                 "border:2px dashed #555;vertical-align:middle'></span> rejected chain (dashed, "
                 "pattern-coloured border)</span>")
    chips.append(f"<span style='display:inline-block;margin:2px 10px 2px 0'>"
                 f"<span style='display:inline-block;width:12px;height:12px;background:{graph_view.PLAIN_COLOR};"
                 f"border:1px solid #999;vertical-align:middle'></span> in no chain</span>")
    chips.append(f"<span style='display:inline-block;margin:2px 10px 2px 0'>"
                 f"<span style='display:inline-block;width:12px;height:12px;background:{graph_view.UNKNOWN_COLOR};"
                 f"vertical-align:middle'></span> unknown pattern</span>")
    return "<div style='font-size:0.85rem;line-height:1.6'>" + "".join(chips) + "</div>"


def page() -> None:
    cur = ui_state.current_or_prompt()
    if cur is None:
        return
    spec, model, graph, detection = cur
    accepted = ui_state.accepted_ids(detection)
    summary = detection.to_dict()
    st.subheader(f"{model.name}: {graph.graph.get('ops', 0)} ops, {len(detection.chains)} fusible chains")
    c = st.columns(5)
    c[0].metric("Graph nodes", graph.number_of_nodes())
    c[1].metric("Chains accepted", f"{len(accepted)} / {len(detection.chains)}")
    c[2].metric("Launches saved (accepted)", sum(ch.launches_saved for ch in detection.chains if ch.id in accepted))
    c[3].metric("Bytes saved (accepted)", graph_view.human_bytes(
        sum(ch.bytes_saved for ch in detection.chains if ch.id in accepted)))
    c[4].metric("Near misses", len(summary["near_misses"]))
    st.markdown(legend_html(detection), unsafe_allow_html=True)

    cols = st.columns([1.1, 2.2, 1.6, 2.0, 1.0])
    cols[0].selectbox("Collapse modules", [0, 1, 2, 3, 4], key="graph_depth",
                      format_func=lambda d: "no collapse" if d == 0 else f"depth {d}",
                      help="One node per module at this origin-name depth (layer1, encoder.layer.3)")
    prefixes = graph_view.module_prefixes(graph)
    st.session_state.graph_expand = [m for m in st.session_state.graph_expand if m in prefixes]
    cols[1].multiselect("Expand modules", prefixes, key="graph_expand",
                        help="Open these collapsed modules one level")
    cols[2].text_input("Find a node (id or origin)", key="graph_search", placeholder="e.g. layer3.2.conv2")
    chain_ids = [WHOLE] + [ch.id for ch in detection.chains]
    if st.session_state.graph_chain not in chain_ids:
        st.session_state.graph_chain = WHOLE
    cols[3].selectbox("Show one chain", chain_ids, key="graph_chain")
    cols[4].number_input("Hops", min_value=0, max_value=8, step=1, key="graph_hops",
                         help="Neighbourhood radius around the chain or the search hits")

    focus: tuple[str, ...] = ()
    if st.session_state.graph_chain != WHOLE:
        focus = tuple(detection.chain(st.session_state.graph_chain).nodes)
    elif st.session_state.graph_search.strip():
        hits = graph_view.find_nodes(graph, st.session_state.graph_search)
        if hits:
            focus = tuple(hits)
            st.caption(f"{len(hits)} match(es): {', '.join(hits[:8])}{' …' if len(hits) > 8 else ''}")
        else:
            st.warning(f"No node matches '{st.session_state.graph_search}'.")
    options = ViewOptions(depth=int(st.session_state.graph_depth), expand=tuple(st.session_state.graph_expand),
                          focus=focus, hops=int(st.session_state.graph_hops))
    import json

    html, n_drawn, collapsed, notes, depth, total = _graph_html(
        (spec.source, spec.batch, spec.seq_len, detection.fingerprint), tuple(sorted(accepted)),
        json.dumps(dataclasses.asdict(options)), graph, detection)
    for note in notes:
        st.info(note)
    st.caption(f"Drawing {n_drawn} of {total} nodes"
               + (f" (modules collapsed at depth {depth}: {len(collapsed)} module nodes)" if collapsed else "")
               + ". Hover a node for its op, origin, shapes, bytes and FLOPs; scroll to zoom, drag to pan.")
    st.iframe(html, height=HEIGHT + 10)


ui_state.guarded(page)
