"""Export page: the plan, the report (JSON, CSV) and the fused model (.pt2, ONNX).

Widget keys: export_plan, export_report_json, export_report_csv, export_pt2_build, export_pt2,
export_onnx_build, export_onnx.
"""

from __future__ import annotations


import streamlit as st

from explorer.ui import files as ui_files
from explorer.ui import state as ui_state


@st.cache_data(max_entries=4, show_spinner=False)
def _fused_bytes(fmt: str, model_key: tuple, plan_json: str, _model, _detection, _plan) -> bytes:
    if fmt == "pt2":
        return ui_files.fused_pt2_bytes(_model, _detection, _plan)
    return ui_files.fused_onnx_bytes(_model, _detection, _plan)


def page() -> None:
    cur = ui_state.current_or_prompt()
    if cur is None:
        return
    spec, model, graph, detection = cur
    ss = st.session_state
    plan = ui_state.current_plan(detection)
    st.subheader(f"Export {model.name}")

    st.markdown("#### Plan")
    st.download_button(f"Plan JSON ({len(plan.accepted)} chains accepted)", plan.to_json(),
                       file_name=f"{model.name}.plan.json", mime="application/json", key="export_plan")

    st.markdown("#### Report")
    if ss.last_report is None:
        st.caption("No report yet: run the model on the Run page.")
    else:
        report = ss.last_report[1]
        c = st.columns(2)
        c[0].download_button("Report JSON", report.to_json(indent=2),  # the typed report (explorer.report)
                             file_name=f"{model.name}.report.json", mime="application/json",
                             key="export_report_json")
        c[1].download_button("Report CSV", ui_files.report_csv(report), file_name=f"{model.name}.report.csv",
                             mime="text/csv", key="export_report_csv")

    st.markdown("#### Fused model")
    st.caption("The model your plan makes (explorer.rewrite.apply_plan), built on the CPU in fp32.")
    model_key = (spec.source, spec.batch, spec.seq_len, detection.fingerprint)
    for fmt, label, mime in (("pt2", "torch.export archive (.pt2)", "application/zip"),
                             ("onnx", "ONNX (.onnx)", "application/octet-stream")):
        c = st.columns([1, 2])
        if c[0].button(f"Build {label}", key=f"export_{fmt}_build"):
            ss[f"export_{fmt}_want"] = (model_key, plan.to_json())
        if ss.get(f"export_{fmt}_want") == (model_key, plan.to_json()):
            try:
                with st.spinner(f"Building the fused model ({fmt})…"):
                    data = _fused_bytes(fmt, model_key, plan.to_json(), model, detection, plan)
                c[1].download_button(f"Download {label} ({len(data) / 2**20:.1f} MB)", data,
                                     file_name=f"{model.name}.fused.{fmt}", mime=mime, key=f"export_{fmt}")
            except Exception as exc:  # noqa: BLE001 - shown as one line, the page stays usable
                text = str(exc).strip().splitlines()
                c[1].error(f"Could not export {fmt}: {text[0][:300] if text else type(exc).__name__}")


ui_state.guarded(page)
