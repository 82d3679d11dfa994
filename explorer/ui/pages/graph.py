"""Graph page: the model's ops in layers, each chain a band of its pattern's colour, and the graph
after the accepted fusions beside it.

The views come from ``explorer.ui.graph`` (pure) and are drawn by its pyvis renderer; the
fused graph is what the engine's ``fusion_engine.fuse`` made of the current plan. Every text is in
the sidebar's language: the page's through ``i18n.t`` (``locale/graph.py``), the drawing's through
``ViewOptions.lang`` and ``RenderOptions.lang``. A widget's ``format_func`` takes the language as a
default argument (the test harness calls it after the run, outside the session).

Widget keys: graph_mode (original | fused | side | compile | compare), graph_depth, graph_expand,
graph_direction, graph_search, graph_match, graph_prev, graph_next, graph_chain, graph_hops,
graph_overlay (``graph_overlays.OVERLAYS``), graph_compile_mode, graph_compile_start,
graph_compile_cancel, graph_export_<view>, graph_export_<view>_svg, graph_export_<view>_png (``view_export``).

The views "torch.compile" and "compare" read a ``runtime.compile_map.CompileMap`` (compiled in a
child process as the background task "compile_map", or read from its cache); the overlays read the
session's last report (``last_report``) when it was measured on this graph.
"""

from __future__ import annotations

import dataclasses
import html as html_lib
import json
import time

import streamlit as st

from explorer.fusions import BY_NAME
from explorer.ui import fonts
from explorer.ui import files as ui_files
from explorer.ui import graph as graph_view
from explorer.ui import graph_overlays as overlays
from explorer.ui import links
from explorer.ui import tasks
from explorer.ui import view_export
from explorer.ui import state as ui_state
from explorer.ui.graph import FusedChain, RenderOptions, ViewOptions
from explorer.ui.graph import svg as graph_svg
from explorer.ui.i18n import current as current_language
from explorer.ui.i18n import message, t, t_in, translate_text
from explorer.units import human_bytes

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
              _graph, _detection, layer_key: str = "", _layer=None) -> dict:
    """One drawn view (cached per model, choices, fused chains, options and ``layer_key``): its html and
    facts. ``_layer`` (named by ``layer_key``) is (detection to band, chain paints, node paints, legend
    html, layer name) for the torch.compile, compare and overlay views, or None."""
    options = ViewOptions(**{k: tuple(v) if isinstance(v, list) else v
                             for k, v in json.loads(options_json).items()})
    render = RenderOptions(**json.loads(render_json))
    graph = _graph
    if render.name == "fused":
        graph = graph_view.fused_graph(_graph, _detection, {cid: FusedChain(*info) for cid, info in fused_key})
    detection, chain_paint, node_paint, legend, layer = _layer or (_detection, {}, {}, "", "")
    view = graph_view.build_view(graph, detection, accepted if _layer is None or layer == "overlay"
                                 else tuple(c.id for c in detection.chains), options)
    if _layer is not None:
        view = overlays.paint(view, chain_paint, node_paint)
    html = graph_view.render_html(view, render)
    html = overlays.decorate(html, view if _layer is not None else None, legend, layer)
    return {"html": html, "drawn": len(view.nodes), "total": view.total_nodes,
            "collapsed": view.collapsed_modules, "notes": view.notes, "depth": view.depth, "view": view}


def _chip(color: str, text: str, border: str = "none") -> str:
    return (f"<span style='display:inline-block;margin:2px 12px 2px 0;white-space:nowrap'>"
            f"<span style='display:inline-block;width:12px;height:12px;border-radius:2px;background:{color};"
            f"border:{border};vertical-align:middle'></span> {text}</span>")


def legend_html(detection, lang: str = "en", fused: bool = False) -> str:
    """The legend: only the patterns this model has (with their chain counts), then every style the view
    draws (``fused``: the fused view's too: a fused chain's node, and a dashed one where no fused kernel runs)."""
    def label(item) -> str:
        return t_in(lang, "graph.legend.unknown") if item.name == "unknown" else translate_text(item.label, lang)

    chips = [_chip(item.color, f"{html_lib.escape(label(item))} <b>{item.count}</b>")
             for item in graph_view.legend(detection)]
    chips.append(_chip(graph_view.REJECTED_FILL, html_lib.escape(t_in(lang, "graph.legend.rejected")),
                       "2px dashed #555"))
    chips.append(_chip(graph_view.PLAIN_COLOR, html_lib.escape(t_in(lang, "graph.legend.plain")), "1px solid #999"))
    chips.append(_chip("#ffffff", html_lib.escape(t_in(lang, "graph.legend.band")), "2px solid #777"))
    chips.append(_chip(graph_view.IO_COLOR, html_lib.escape(t_in(lang, "graph.legend.io")), "1px solid #999"))
    chips.append(_chip(graph_view.GROUP_COLOR, html_lib.escape(t_in(lang, "graph.legend.module")),
                       f"2px solid {graph_view.GROUP_BORDER}"))
    chips.append(_chip(graph_view.REJECTED_FILL, html_lib.escape(t_in(lang, "graph.legend.module_rejected")),
                       "2px dashed #555"))
    if fused:
        chips.append(_chip("#dddddd", html_lib.escape(t_in(lang, "graph.legend.fused")), "2px solid #333"))
        chips.append(_chip("#dddddd", html_lib.escape(t_in(lang, "graph.legend.no_kernel")), "2px dashed #333"))
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
    counted = ui_state.launches(spec, detection)   # the device's launches, per kernel (explorer.launches)
    st.markdown(t("graph.summary_device", model=ui_files.escape_markdown(model.name), ops=graph.graph.get("ops", 0),
                  nodes=graph.number_of_nodes(), accepted=len(acc_chains), chains=len(detection.chains),
                  launches=counted.saved, before=counted.before, after=counted.after, device=counted.device,
                  traffic=human_bytes(sum(c.bytes_saved for c in acc_chains)),
                  near=len(detection.near_misses)))
    if counted.device == "cpu" and any(c.fused_kernel and c.fused > 1 for c in counted.chains):
        gpu = ui_state.launches(spec, detection, "cuda")   # the GPU's count of the same plan, for comparison
        st.caption(t("graph.cpu_launches", gpu_saved=gpu.saved, gpu_before=gpu.before, gpu_after=gpu.after))

    # --- controls: the view, search, one chain; the layout's settings in a popover
    # the view on a row of its own (five views), then search, one chain and the layout
    c = [st.container(), *st.columns([1.9, 2.2, 0.5, 0.5, 2.2, 1.1], vertical_alignment="bottom")]
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
    if ss.graph_mode not in ("compile", "compare"):   # those views draw their own legend
        st.markdown(legend_html(detection, lang, fused=ss.graph_mode in ("fused", "side")), unsafe_allow_html=True)

    options = ViewOptions(depth=int(ss.graph_depth), expand=tuple(ss.graph_expand), focus=focus,
                          hops=int(ss.graph_hops), highlight=tuple(hits), reveal=current,
                          direction=ss.graph_direction, lang=lang)
    model_key = (spec.source, spec.batch, spec.seq_len, detection.fingerprint)
    fused_key: tuple = ()
    mode = ss.graph_mode
    layer = None
    layer_key = ""
    compiled = None
    if mode in ("compile", "compare"):
        compiled = _compile_controls(spec, graph, detection, lang)
        if compiled is None:
            st.caption(t("graph.navigate"))
            return
        cmap, comparison = compiled
        if mode == "compile":
            det_k, kernels = overlays.kernel_detection(graph, cmap, model.name)
            layer = (det_k, overlays.kernel_paint(kernels, lang), {}, overlays.kernel_legend_html(kernels, lang),
                     "compile")
        else:
            det_c, category = overlays.compare_detection(graph, detection, comparison)
            chain_paint, node_paint = overlays.compare_paint(category, comparison, graph, cmap, lang)
            layer = (det_c, chain_paint, node_paint, overlays.compare_legend_html(comparison, lang), "compare")
        layer_key = json.dumps([mode, cmap.device, cmap.dtype, cmap.mode, cmap.torch_version, lang])
    else:
        layer, layer_key = _overlay_layer(detection, graph, lang)
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
    names = {"original": ["original"], "fused": ["fused"], "side": ["original", "fused"],
             "compile": ["compile"], "compare": ["compare"]}[mode]
    columns = st.columns(len(names)) if len(names) > 1 else [st.container()]
    counts = graph_view.fused_counts(graph, detection, {cid: FusedChain(*info) for cid, info in fused_key})
    for name, column in zip(names, columns):
        render = RenderOptions(height_px=HEIGHT, center_on=current, name=name, lang=lang)
        drawn = view_html(model_key, tuple(sorted(accepted)), fused_key if name == "fused" else (),
                          json.dumps(dataclasses.asdict(options)), json.dumps(dataclasses.asdict(render)),
                          graph, detection, layer_key, layer)
        with column:
            if name in ("original", "fused") and (len(names) > 1 or name == "fused"):
                nodes = counts.nodes_before if name == "original" else counts.nodes_after
                launches = counted.before if name == "original" else counted.after
                st.markdown(t("graph.title_counts", title=t(f"graph.title.{name}"), nodes=nodes, launches=launches))
            for note in drawn["notes"]:
                st.info(ui_files.escape_markdown(note))
            st.iframe(fonts.with_font(drawn["html"], st.get_option("server.baseUrlPath")), height=HEIGHT + 10)
            st.caption(t("graph.drawing", drawn=drawn["drawn"], total=drawn["total"])
                       + (t("graph.drawing_collapsed", depth=drawn["depth"], n=len(drawn["collapsed"]))
                          if drawn["collapsed"] else ""))
            export = drawn["html"] if layer is not None else overlays.decorate(
                drawn["html"], None, legend_html(detection, lang, fused=name == "fused"))
            st.download_button(t("graph.export"), overlays.export_html(export),
                               file_name=f"{_file_stem(model.name)}_{name}.html", mime="text/html",
                               key=f"graph_export_{name}", help=t("graph.export_help"))
            title = f"{model.name} — {t(f'graph.mode.{name}')}" + (
                f" — {t(f'graph.overlay.{ss.graph_overlay}')}" if layer is not None and layer[4] == "overlay" else "")
            legend = (graph_svg.legend_entries(detection, lang, fused=name == "fused") if layer is None
                      else graph_svg.legend_from_html(layer[3]))
            view_export.record(model_key, name, lang, drawn["view"], legend, title)
            view_export.buttons(st, f"{_file_stem(model.name)}_{name}", drawn["view"], legend, title,
                                key=f"graph_export_{name}")
    if mode in ("fused", "side"):
        st.markdown(t("graph.fused_summary", before=counts.nodes_before, after=counts.nodes_after,
                      launches_before=counted.before, launches_after=counted.after,
                      saved=counted.saved, fused=counts.chains_fused,
                      device=ss.get("device", "cpu")))
    if mode == "compare" and compiled is not None:
        _compare_tables(detection, compiled[1], lang)
    st.caption(t("graph.navigate"))


def _file_stem(name: str) -> str:
    """A model's name as a safe file name part."""
    import re

    return re.sub(r"[^A-Za-z0-9_.-]", "_", name)[:60] or "model"


# ---------------------------------------------------------------------- torch.compile and compare

def _compile_work(source: str, batch, seq_len, device: str, dtype: str, mode: str, on_step, cancel):
    """The background task: compile and map in a child process (``runtime.compile_map``)."""
    from explorer.runtime import compile_map

    analysis = ui_state.load_analysis(source, batch, seq_len)
    return compile_map.for_analysis(analysis, source, device, dtype, mode, progress=on_step, cancel=cancel)


def _compile_controls(spec, graph, detection, lang: str):
    """The compile mode, the start button and the progress; returns (CompileMap, Comparison) when there
    is one for the sidebar's device and dtype (from this session's task or the cache), else None."""
    from explorer.runtime import compile_map

    ss = st.session_state
    device, dtype = ss.get("device", "cpu"), ss.get("dtype", "fp32")
    if ss.graph_compile_mode not in compile_map.MODES:
        ss.graph_compile_mode = "default"
    c = st.columns([2, 2, 1, 5], vertical_alignment="bottom")
    c[0].selectbox(t("graph.compile.mode"), list(compile_map.MODES), key="graph_compile_mode",
                   help=t("graph.compile.mode_help"))
    mode = ss.graph_compile_mode
    key = json.dumps([spec.source, spec.batch, spec.seq_len, detection.fingerprint, device, dtype, mode])
    job = tasks.get("compile_map")
    found = None
    if job is not None and job.done and job.key == key and job.result is not None and not job.error:
        found = job.result
    else:
        cached = compile_map.cached_map(detection.fingerprint, device, dtype, mode,
                                        batch=ui_state.load_analysis(spec.source, spec.batch, spec.seq_len).model.batch,
                                        seq_len=ui_state.load_analysis(spec.source, spec.batch, spec.seq_len).model.seq_len)
        if cached is not None:
            found = (cached, compile_map.compare(detection.chains, graph, cached))
    busy = job is not None and job.running
    c[1].button(t("graph.compile.start"), key="graph_compile_start", type="primary", disabled=busy or found is not None,
                on_click=tasks.start, args=("compile_map", key, _compile_work, spec.source, spec.batch, spec.seq_len,
                                            device, dtype, mode))
    c[2].button(t("graph.compile.cancel"), key="graph_compile_cancel", disabled=not busy, on_click=tasks.cancel,
                args=("compile_map",))
    if found is None:
        st.markdown(t("graph.compile.intro", device=device, dtype=dtype))
        if busy:
            _poll_compile()
        elif job is not None and job.key == key and job.error:
            st.error(t("graph.compile.failed", error=ui_files.escape_markdown(message(job.error))))
        return None
    cmap, comparison = found
    from collections import Counter

    kinds = ", ".join(f"{n} {compile_map.kind_label(k)}" for k, n in sorted(Counter(k.kind for k in cmap.kernels).items()))
    st.markdown(t("graph.compile.summary", kernels=len(cmap.kernels), kinds=kinds, device=cmap.device,
                  torch=cmap.torch_version, mode=cmap.mode, seconds=cmap.compile_s))
    if cmap.unmapped_kernels:
        st.warning(t("graph.compile.unmapped", n=len(cmap.unmapped_kernels),
                     kernels=ui_files.escape_markdown(", ".join(cmap.unmapped_kernels[:8]))))
    return cmap, comparison


def _poll_compile() -> None:
    """The compile's progress, redrawn on its own every half second; the page reruns when it ends."""
    @st.fragment(run_every=0.5)
    def _progress() -> None:
        job = tasks.get("compile_map")
        if job is None:
            return
        if job.running:
            st.progress(job.fraction, text=t("graph.compile.progress", message=message(job.message),
                                             seconds=f"{time.time() - job.started:.0f}"))
        elif job.finished and time.time() - job.finished < 2:
            st.rerun(scope="app")

    _progress()


def _compare_tables(detection, comparison, lang: str) -> None:
    """Below the compare view: each chain beside inductor, the candidate patterns, the separate ops."""
    rows = [{t("graph.cmp.table.chain"): graph_view.chain_name(detection.chain(c.chain_id)),
             t("graph.cmp.table.pattern"): translate_text(BY_NAME[c.pattern].label, lang) if c.pattern in BY_NAME
             else c.pattern,
             t("graph.cmp.table.status"): t(f"graph.cmp.{c.status}"),
             t("graph.cmp.table.kernels"): ", ".join(c.kernels)} for c in comparison.chains]
    if rows:
        st.dataframe(rows, hide_index=True, width="stretch")
    candidates = comparison.candidate_patterns()
    if candidates:
        st.markdown("**" + t("graph.cmp.candidates") + "**")
        st.markdown("\n".join("- " + ui_files.escape_markdown(t("graph.cmp.candidate_row", ops=ops, n=n))
                               for ops, n in candidates))
    if comparison.separate:
        st.caption(t("graph.cmp.separate_list",
                     ops=ui_files.escape_markdown(", ".join(f"{n} ({k})" for n, k, _ in comparison.separate[:40]))
                     + (" …" if len(comparison.separate) > 40 else "")))


# ---------------------------------------------------------------------- overlays from a report

@st.cache_resource(show_spinner=False)
def _cpu_ceilings():
    """The CPU's ceilings, measured once per server (quick sizes), for the predicted-gain overlay."""
    from explorer.runtime.ceilings import measure_ceilings

    return measure_ceilings("cpu", ("fp32", "bf16"), quick=True)


def _predicted_gains(report, graph, detection) -> dict[str, float] | None:
    """{chain id: predicted gain} for the report's device (its ceilings), or None where they are unknown."""
    from explorer.runtime.ceilings import known_ceilings
    from explorer.teaching import predict, readers

    data = readers.as_plain(report) or {}
    env = data.get("environment") or {}
    dtype = readers.report_dtype(report) or "fp32"
    ceilings = _cpu_ceilings() if env.get("is_cpu") else known_ceilings(env.get("device_name"))
    if not ceilings.known(dtype):
        return None
    ids = [c.get("id") for c in data.get("chains") or [] if isinstance(c, dict)]
    preds = predict.predict_chains(graph, detection, ids, dtype, ceilings)
    return {p.id: p.gain for p in preds if p.gain}


def _overlay_layer(detection, graph, lang: str):
    """The overlay control; returns (layer, layer key) for ``view_html`` (None, "" for the patterns' colours)."""
    ss = st.session_state
    if ss.graph_overlay not in overlays.OVERLAYS:
        ss.graph_overlay = "none"
    st.selectbox(t("graph.overlay"), list(overlays.OVERLAYS), key="graph_overlay",
                 format_func=lambda m, lang=lang: t_in(lang, f"graph.overlay.{m}"), help=t("graph.overlay_help"))
    measure = ss.graph_overlay
    if measure == "none":
        return None, ""
    last = ss.get("last_report")
    report = last[1] if last else None
    name = t_in(lang, f"graph.overlay.{measure}")
    if report is None or not overlays.report_matches(report, detection):
        st.info(t("graph.overlay.no_report", measure=name))
        return None, ""
    predicted = None
    if measure == "predicted":
        predicted = _predicted_gains(report, graph, detection)
        if predicted is None:
            from explorer.teaching import readers

            env = (readers.as_plain(report) or {}).get("environment") or {}
            st.info(t("graph.overlay.no_prediction", device=ui_files.escape_markdown(str(env.get("device_name")))))
            return None, ""
    values = overlays.overlay_values(measure, report, detection, predicted, lang)
    scale = overlays.scale_for(measure, values)
    chain_paint = overlays.overlay_paint(measure, values, detection, scale, lang)
    legend = overlays.scale_legend_html(measure, scale, lang)
    st.caption(t("graph.overlay.from_report", measure=name, report=ui_files.escape_markdown(str(last[0])[:60]),
                 n=len(values), chains=len(detection.chains)))
    key = json.dumps([measure, str(last[0]), len(values), lang, sorted((k, v.text) for k, v in values.items())])
    return (detection, chain_paint, {}, legend, "overlay"), key


ui_state.guarded(page)
