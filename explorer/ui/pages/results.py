"""Results page: the latest run report, or a saved one, as charts and tables (figures from ``explorer.charts``).

A report saved elsewhere (an H200 run's JSON, say) opens here without a GPU.
Every string that comes from a report goes through ``ui_files.escape_markdown``
before an element that renders markdown shows it: a report file is data, and its
text is shown as written (no link, image, HTML or LaTeX from it is rendered).
Chart keys: chart_compare, chart_chain_speedup, chart_chain_precision, chart_stages; buttons: reject_slower,
separate_gpu_slower; uploader: report_file.
"""

from __future__ import annotations

import streamlit as st

from explorer.ui import charts
from explorer.ui import state as ui_state
from explorer.ui.files import escape_markdown as plain
from explorer.fusions.plan import gpu_slower_chains, slower_chains


def _detection_of(report: dict):
    """The loaded model's detection when this report was measured on it (same graph), else None."""
    cur = ui_state.current()
    plan = report.get("plan") or {}
    if cur is None or plan.get("fingerprint") != cur[3].fingerprint:
        return None
    return cur[3]


def _offer_reject_slower(report: dict) -> None:
    """A button that rejects, in the current choices, every chain this report measured slower."""
    detection = _detection_of(report)
    if detection is None:
        return
    slower = set(slower_chains(report))
    if st.button(f"Reject the {len(slower)} slower chain(s)", key="reject_slower"):
        ui_state.set_accepted(detection, ui_state.accepted_ids(detection) - slower)
        st.success(f"Rejected {len(slower)} chain(s); the plan on the Fusions page now leaves them unfused.")


def _open_saved_report() -> None:
    """The uploader for a saved report (JSON from the Export page or ``fusion-explorer run --out``)."""
    with st.expander("Open a saved report (.json)", expanded=st.session_state.last_report is None):
        st.file_uploader("Report JSON, from the Export page or `fusion-explorer run --out`", type=["json"],
                         key="report_file", on_change=ui_state.on_report_upload)
    if st.session_state.report_error:
        st.error(f"Report not opened: {st.session_state.report_error}")
    elif st.session_state.report_notice:
        st.success(st.session_state.report_notice)


def _explain_slower(report: dict) -> None:
    """Say what limits the chains that got slower: the host (launch overhead) or the GPU."""
    where = charts.slower_where(report)
    if where["host"]:
        st.info(f"{len(where['host'])} of the slower chains are slower only as plain calls: replayed as a CUDA graph "
                "(no launch or host overhead) they are not. On this machine the host, issuing calls, limits "
                "them, not the GPU; CUDA graphs (a plan option on the Run page) remove that cost.")
    if where["gpu"]:
        st.info(f"{len(where['gpu'])} chain(s) are slower even as CUDA graphs: the fused kernel itself is "
                "slower on the GPU than the ops it replaces ('speed-up, CUDA graph' column).")
        _offer_separate_epilogue(report)


def _offer_separate_epilogue(report: dict) -> None:
    """A button that sets the kernel choice "separate_epilogue" for the chains slower on the GPU itself."""
    detection = _detection_of(report)
    if detection is None:
        return
    ids = gpu_slower_chains(report, detection)
    if ids and st.button(f"Use the separate epilogue for the {len(ids)} conv/linear chain(s) slower on the GPU",
                         key="separate_gpu_slower"):
        for cid in ids:
            ui_state.set_kernel(detection, cid, "separate_epilogue")
        st.success(f"Kernel choice 'separate_epilogue' set for {len(ids)} chain(s): the next run times them "
                   "with the conv or GEMM and its epilogue as separate kernels.")


def page() -> None:
    _open_saved_report()
    last = st.session_state.last_report
    if last is None:
        st.info("No results yet: press Run on the Run page, or open a saved report above.")
        return
    _key, report = last
    model = report.get("model")
    name = model.get("name") if isinstance(model, dict) else model
    st.subheader(f"Results: {plain(name or 'model')}")
    st.caption(plain(charts.device_caption(report)))
    env = report.get("environment") or {}
    if env.get("is_cpu"):
        st.warning("These are CPU numbers: the fused GPU kernels were not what was timed.")
    if report.get("error"):
        st.error(f"The runner reported: {plain(report['error'])}")

    st.markdown("#### Unfused vs fused")
    st.plotly_chart(charts.comparison_figure(report), key="chart_compare", width="stretch")
    st.dataframe(charts.summary_rows(report), hide_index=True, width="stretch")
    for variant in ("unfused", "fused"):
        d = report.get(variant) or {}
        notes = [str(d[k]) for k in ("memory_note", "kernel_launches_kind") if d.get(k)]
        if notes:
            st.caption(f"{variant}: " + plain("; ".join(notes)))

    st.markdown("#### Precision of the model output")
    sci = {k: st.column_config.NumberColumn(format="%.2e")
           for k in ("max_abs", "max_rel", "rel_l2", "max abs err", "rel err")}
    sci["cosine"] = st.column_config.NumberColumn(format="%.9f")
    st.dataframe(charts.precision_rows(report), hide_index=True, width="stretch", column_config=sci)
    if report.get("precision_note"):
        st.caption(plain(report["precision_note"]))

    st.markdown("#### Per chain")
    rows = charts.chain_rows(report)
    if rows:
        slower = [r for r in rows if r["slower"]]
        if slower:
            st.warning(f"{len(slower)} chain(s) got slower when fused (red bars): not every fusion pays. "
                       "Reject them and run again.")
            _offer_reject_slower(report)
        _explain_slower(report)  # says nothing when no chain is slower either way
        st.plotly_chart(charts.chain_speedup_figure(report), key="chart_chain_speedup", width="stretch")
        st.dataframe(rows, hide_index=True, width="stretch", column_config=sci)
        st.plotly_chart(charts.chain_precision_figure(report), key="chart_chain_precision",
                        width="stretch")
    else:
        st.caption("No per-chain timings in this report (enable them on the Run page).")

    st.markdown("#### Staged fusion (the seed's table)")
    stage_rows = charts.stages_rows(report)
    if stage_rows:
        st.dataframe(stage_rows, hide_index=True, width="stretch")
        st.plotly_chart(charts.stages_figure(report), key="chart_stages", width="stretch")
    else:
        st.caption("No staged timings in this report (enable them on the Run page).")
    for skipped in report.get("stages_skipped") or []:
        if isinstance(skipped, dict):
            st.caption(plain(f"stage '{skipped.get('label') or skipped.get('stage')}' not timed: "
                             f"{skipped.get('reason', '')}"))
    notes = [str(n) for n in (report.get("notes") or [])]
    for key in ("bytes_note", "graph_calls_note"):
        if report.get(key):
            notes.append(str(report[key]))
    if notes or report.get("baselines"):
        with st.expander("Notes and baselines"):
            for n in notes:
                st.markdown(f"- {plain(n)}")
            if report.get("baselines"):
                st.json(report["baselines"], expanded=False)


ui_state.guarded(page)
