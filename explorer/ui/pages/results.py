"""Results page: the latest run report, or a saved one, as charts and tables (figures from ``explorer.charts``).

A report saved elsewhere (an H200 run's JSON, say) opens here without a GPU.
Every string that comes from a report goes through ``ui_files.escape_markdown``
before an element that renders markdown shows it: a report file is data, and its
text is shown as written (no link, image, HTML or LaTeX from it is rendered).
The report is the typed ``explorer.report.Report``: verdicts come from its one
field (``ChainResult.verdict``), baselines are bars and table rows of their own.
Chart keys: chart_compare, chart_chain_speedup, chart_chain_precision, chart_stages; table: table_baselines;
buttons: reject_slower, separate_gpu_slower; uploader: report_file.
"""

from __future__ import annotations

import streamlit as st

from explorer.ui import charts
from explorer.ui import state as ui_state
from explorer.ui.files import escape_markdown as plain
from explorer.fusions.plan import gpu_slower_chains, slower_chains
from explorer.report import Report


def _detection_of(report: Report):
    """The loaded model's detection when this report was measured on it (same graph), else None."""
    cur = ui_state.current()
    if cur is None or report.model.fingerprint != cur[3].fingerprint:
        return None
    return cur[3]


def _offer_reject_slower(report: Report) -> None:
    """A button that rejects, in the current choices, every chain this report found slower (its one verdict)."""
    detection = _detection_of(report)
    if detection is None:
        st.caption(plain(f"This report was measured on '{report.model.name}', not on the model loaded here: "
                         "load that model to act on its verdicts."))
        return
    slower = set(slower_chains(report, detection))
    if st.button(f"Reject the {len(slower)} slower chain(s)", key="reject_slower"):
        ui_state.set_accepted(detection, ui_state.accepted_ids(detection) - slower)
        st.success(f"Rejected {len(slower)} chain(s); the plan on the Fusions page now leaves them unfused.")


def _open_saved_report() -> None:
    """The uploader for a saved report (JSON from the Export page or ``fusion-explorer run --out``)."""
    with st.expander("Open a saved report (.json)", expanded=st.session_state.last_report is None):
        st.file_uploader("Report JSON, from the Export page or `fusion-explorer run --out`", type=["json"],
                         key="report_file", on_change=ui_state.on_report_upload)
    if st.session_state.report_error:
        st.error(f"Report not opened: {plain(st.session_state.report_error)}")
    elif st.session_state.report_notice:
        st.success(plain(st.session_state.report_notice))


def _explain_slower(report: Report) -> None:
    """Say what limits the chains that got slower: the host (launch overhead) or the GPU (decided by the runner)."""
    where = charts.slower_where(report)
    if where["host"]:
        st.info(f"{len(where['host'])} chain(s) are slower only as plain calls: replayed as a CUDA graph "
                "(no launch or host overhead) they are not. On this machine the host, issuing calls, limits "
                "them, not the GPU; CUDA graphs (a plan option on the Run page) remove that cost.")
    if where["gpu"]:
        st.info(f"{len(where['gpu'])} chain(s) are slower even as CUDA graphs: the fused kernel itself is "
                "slower on the GPU than the ops it replaces ('speed-up, CUDA graph' column).")
        _offer_separate_epilogue(report)


def _offer_separate_epilogue(report: Report) -> None:
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
    st.subheader(f"Results: {plain(report.model.name or 'model')}")
    st.caption(plain(charts.device_caption(report)))
    if report.is_cpu:
        st.warning("These are CPU numbers: the fused GPU kernels were not what was timed.")

    st.markdown("#### Unfused vs fused" + (" and the baselines" if report.baselines else ""))
    st.markdown(plain(charts.verdict_text(report)))
    st.plotly_chart(charts.comparison_figure(report), key="chart_compare", width="stretch")
    st.dataframe(charts.summary_rows(report), hide_index=True, width="stretch")
    for m in (report.unfused, report.fused):
        notes = [x for x in (m.memory_note, m.launches_kind, m.note) if x]
        if m.bound:
            notes.append(f"{m.bound}-bound: the GPU is busy {m.gpu_busy_ms:.3f} ms of each forward")
        if notes:
            st.caption(f"{m.name}: " + plain("; ".join(notes)))
    if report.baselines:
        st.markdown("#### Baselines (like with like: same memory format; CUDA graphs against reduce-overhead)")
        st.dataframe(charts.baseline_rows(report), hide_index=True, width="stretch", key="table_baselines")

    st.markdown("#### Precision of the model output")
    sci = {k: st.column_config.NumberColumn(format="%.2e")
           for k in ("max_abs", "max_rel", "rel_l2", "max abs err", "rel err", "p")}
    sci["cosine"] = st.column_config.NumberColumn(format="%.9f")
    st.dataframe(charts.precision_rows(report), hide_index=True, width="stretch", column_config=sci)
    if report.precision_note:
        st.caption(plain(report.precision_note))

    st.markdown("#### Per chain")
    rows = charts.chain_rows(report)
    if any(r["speed-up"] is not None for r in rows):
        counts = report.verdict_counts()
        st.markdown(plain(", ".join(f"{n} {label}" for label, n in counts.items() if n)))
        slower = report.slower_chains
        if slower:
            st.warning(f"{len(slower)} chain(s) got slower when fused (dark, cross-hatched bars): not every fusion "
                       "pays. Reject them and run again.")
            _offer_reject_slower(report)
        _explain_slower(report)  # says nothing when no chain is slower either way
        st.plotly_chart(charts.chain_speedup_figure(report), key="chart_chain_speedup", width="stretch")
        st.dataframe(rows, hide_index=True, width="stretch", column_config=sci)
        st.plotly_chart(charts.chain_precision_figure(report), key="chart_chain_precision", width="stretch")
        if report.rotation_note:
            st.caption(plain(report.rotation_note))
    elif rows:
        st.caption("No per-chain timings in this report (quick mode or per-chain timing off): verdicts below "
                   "are only what the plan did.")
        st.dataframe(rows, hide_index=True, width="stretch")
    else:
        st.caption("No accepted chains in this report.")

    st.markdown("#### Staged fusion (the seed's table)")
    stage_rows = charts.stages_rows(report)
    if stage_rows:
        st.dataframe(stage_rows, hide_index=True, width="stretch")
        st.plotly_chart(charts.stages_figure(report), key="chart_stages", width="stretch")
    else:
        st.caption("No staged timings in this report (enable them on the Run page).")
    notes = list(report.notes) + [n for n in (report.bytes_note, report.graph_calls_note) if n]
    if notes:
        with st.expander("Notes"):
            for n in notes:
                st.markdown(f"- {plain(n)}")


ui_state.guarded(page)
