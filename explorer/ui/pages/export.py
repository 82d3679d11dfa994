"""Export page: the plan, the report (JSON, CSV), the fused model (.pt2, ONNX) and the graph view (SVG, PNG).

Every text is in the sidebar's language (``i18n.t``, ``locale/export.py``); an export's error comes
from the engine in English and is translated by ``i18n.message``.

Widget keys: export_plan, export_report_json, export_report_csv, export_pt2_build, export_pt2,
export_onnx_build, export_onnx, export_view_<name>_svg, export_view_<name>_png (the views the Graph page
drew in this language, ``ui.view_export``; before it has, the original graph under its view options).
"""

from __future__ import annotations

import streamlit as st

from explorer.ui import files as ui_files
from explorer.ui import graph as graph_view
from explorer.ui import state as ui_state
from explorer.ui import view_export
from explorer.ui.graph import svg as graph_svg
from explorer.ui.i18n import current as current_language
from explorer.ui.i18n import message, t


@st.cache_data(max_entries=4, show_spinner=False)
def _fused_bytes(fmt: str, model_key: tuple, plan_json: str, _model, _detection, _plan) -> bytes:
    if fmt == "pt2":
        return ui_files.fused_pt2_bytes(_model, _detection, _plan)
    return ui_files.fused_onnx_bytes(_model, _detection, _plan)


@ui_state.needs_model
def page(spec, model, graph, detection) -> None:
    ss = st.session_state
    plan = ui_state.current_plan(detection)
    st.subheader(t("export.title", model=ui_files.escape_markdown(model.name)))

    st.markdown(f"#### {t('export.plan')}")
    st.download_button(t("export.plan_json", n=len(plan.accepted)), plan.to_json(),
                       file_name=f"{model.name}.plan.json", mime="application/json", key="export_plan")

    st.markdown(f"#### {t('export.report')}")
    if ss.last_report is None:
        st.caption(t("export.no_report"))
    else:
        report = ss.last_report[1]
        c = st.columns(2)
        c[0].download_button(t("export.report_json"), report.to_json(indent=2),  # the typed report (explorer.report)
                             file_name=f"{model.name}.report.json", mime="application/json",
                             key="export_report_json")
        c[1].download_button(t("export.report_csv"), ui_files.report_csv(report),
                             file_name=f"{model.name}.report.csv", mime="text/csv", key="export_report_csv")

    _view_downloads(spec, model, graph, detection)

    st.markdown(f"#### {t('export.fused')}")
    st.caption(t("export.fused_caption"))
    model_key = (spec.source, spec.batch, spec.seq_len, detection.fingerprint)
    for fmt, mime in (("pt2", "application/zip"), ("onnx", "application/octet-stream")):
        label = t(f"export.format.{fmt}")
        c = st.columns([1, 2])
        if c[0].button(t("export.build", format=label), key=f"export_{fmt}_build"):
            ss[f"export_{fmt}_want"] = (model_key, plan.to_json())
        if ss.get(f"export_{fmt}_want") == (model_key, plan.to_json()):
            try:
                with st.spinner(t("export.building", format=fmt)):
                    data = _fused_bytes(fmt, model_key, plan.to_json(), model, detection, plan)
                c[1].download_button(t("export.download", format=label, mb=len(data) / 2**20), data,
                                     file_name=f"{model.name}.fused.{fmt}", mime=mime, key=f"export_{fmt}")
            except Exception as exc:  # noqa: BLE001 - shown as one line, the page stays usable
                text = str(exc).strip().splitlines()
                error = message(text[0][:300]) if text else type(exc).__name__
                c[1].error(t("export.failed", format=fmt, error=ui_files.escape_markdown(error)))


def _view_downloads(spec, model, graph, detection) -> None:
    """SVG and PNG of the view the Graph page drew (same options, overlay, language), or of the original graph."""
    ss = st.session_state
    lang = current_language()
    st.markdown(f"#### {t('export.view')}")
    st.caption(t("export.view.caption"))
    model_key = (spec.source, spec.batch, spec.seq_len, detection.fingerprint)
    views = view_export.recorded(model_key, lang)
    if not views:
        st.caption(t("export.view.default"))
        focus: tuple[str, ...] = ()
        chain = ss.get("graph_chain")
        if chain and chain in {c.id for c in detection.chains}:
            focus = tuple(detection.chain(chain).nodes)
        options = graph_view.ViewOptions(depth=int(ss.get("graph_depth", 0)), expand=tuple(ss.get("graph_expand", ())),
                                         focus=focus, hops=int(ss.get("graph_hops", 2)),
                                         direction=ss.get("graph_direction", "TB"), lang=lang)
        view = graph_view.build_view(graph, detection, ui_state.accepted_ids(detection), options)
        views = {"original": {"view": view, "legend": graph_svg.legend_entries(detection, lang),
                              "title": f"{model.name} — {t('graph.mode.original')}"}}
    stem = graph_svg.file_stem(model.name)
    for name, v in views.items():
        if len(views) > 1:
            st.caption(t(f"graph.mode.{name}"))
        view_export.buttons(st, f"{stem}_{name}", v["view"], v["legend"], v["title"], key=f"export_view_{name}")


ui_state.guarded(page)
