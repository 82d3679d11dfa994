"""Results page: the latest run report, or a saved one, as charts and tables (figures from ``explorer.ui.charts``);
a saved teaching report as its time breakdown, traffic table and staged table per model.

A report saved elsewhere (an H200 run's JSON, say) opens here without a GPU: uploaded, or chosen among the
reports committed in ``benchmarks/results``. A teaching report (``explorer.teaching.report``: schema
"fusion-explorer-teaching-report", written by ``benchmarks/teach_reports.py`` on the GPU machine) is
validated by that module's loader and drawn, model by model, with the Learn page's panels
(``explorer.ui.teaching_panels``: ``breakdown_panel``, ``traffic_panel``, ``stages_panel``).
Every string that comes from a report goes through ``ui_files.escape_markdown``
before an element that renders markdown shows it: a report file is data, and its
text is shown as written (no link, image, HTML or LaTeX from it is rendered).
The report is the typed ``explorer.report.Report``: verdicts come from its one
field (``ChainResult.verdict``), baselines are bars and table rows of their own.

Every text is in the sidebar's language: the page's own from the catalog (``results.*``), the figures' and
tables' from ``explorer.ui.charts`` (given the language), the runtime's notes and errors through
``explorer.ui.i18n.message``.

Chart keys: chart_compare, chart_chain_speedup, chart_chain_precision, chart_stages, and per model of a
teaching report chart_breakdown_<i>, chart_traffic_<i>; tables: table_baselines, table_stages; buttons: reject_slower,
separate_gpu_slower, results_open_committed; select box: results_committed; uploader: report_file.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from pathlib import Path

import streamlit as st

from explorer.ui import charts
from explorer.ui import state as ui_state
from explorer.ui import teaching_panels as panels
from explorer.ui.safe_text import code, markdown as plain
from explorer.ui.i18n import current as current_language
from explorer.ui.i18n import message, t
from explorer.fusions.plan import gpu_slower_chains, slower_chains
from explorer.report import PHASES, READINGS, UNDECIDED, Report, finiteness_warning

RESULTS = Path(__file__).resolve().parents[3] / "benchmarks" / "results"


def _committed_reports() -> list[str]:
    """The run and teaching reports committed in ``benchmarks/results`` (file names)."""
    return sorted(p.name for pattern in ("report_*.json", "teaching_*.json") for p in RESULTS.glob(pattern))


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
        st.caption(t("results.other_model", model=plain(report.model.name)))
        return
    slower = set(slower_chains(report, detection))
    if st.button(t("results.reject_slower", n=len(slower)), key="reject_slower"):
        ui_state.set_accepted(detection, ui_state.accepted_ids(detection) - slower)
        st.success(t("results.rejected", n=len(slower)))


def _open_saved_report() -> None:
    """The committed reports and the uploader for a saved one (a run report's JSON from the Export page or
    ``fusion-explorer run --out``, or a teaching report)."""
    ss = st.session_state
    with st.expander(t("results.open_title"), expanded=ss.last_report is None and ss.get("results_teaching") is None):
        committed = _committed_reports()
        if committed:
            c1, c2 = st.columns([3, 1])
            c1.selectbox(t("results.committed"), committed, key="results_committed")
            c2.button(t("results.open"), key="results_open_committed", on_click=ui_state.on_open_committed,
                      args=(RESULTS,))
        st.file_uploader(t("results.upload"), key="report_file", on_change=ui_state.on_report_upload)
    if ss.report_error:
        st.error(t("results.not_opened", error=plain(message(ss.report_error))))
    elif ss.report_notice:
        kind, name = ss.report_notice
        st.success(t(f"results.opened.{kind}", name=plain(name)))


def _explain_slower(report: Report) -> None:
    """Say what limits the chains that got slower: the host (launch overhead) or the GPU (decided by the runner)."""
    where = charts.slower_where(report)
    if where["host"]:
        st.info(t("results.host_slower", n=len(where["host"])))
    if where["gpu"]:
        st.info(t("results.gpu_slower", n=len(where["gpu"]), column=t("chart.col.speedup_graph")))
        _offer_separate_epilogue(report)


def _offer_separate_epilogue(report: Report) -> None:
    """A button that sets the kernel choice "separate_epilogue" for the chains slower on the GPU itself."""
    detection = _detection_of(report)
    if detection is None:
        return
    ids = gpu_slower_chains(report, detection)
    if ids and st.button(t("results.separate", n=len(ids)), key="separate_gpu_slower"):
        for cid in ids:
            ui_state.set_kernel(detection, cid, "separate_epilogue")
        st.success(t("results.separate_set", n=len(ids)))


def _teaching_report(name: str, rep: dict) -> None:
    """A teaching report, model by model: the time breakdown, the traffic table and the staged table."""
    st.subheader(t("results.teach.title", name=plain(name)))
    env = rep.get("environment") or {}
    st.caption(t("teach.report.caption", device=plain(env.get("device_name") or env.get("device")),
                 date=plain(rep["date_utc"][:10]), command=code(rep["command"]), torch=plain(env.get("torch"))))
    if env.get("is_cpu"):
        st.warning(t("teach.report.cpu"))
    st.markdown(t("results.teach.intro"))
    for i, entry in enumerate(rep["models"]):
        if "error" in entry:
            st.markdown(f"### {plain(entry['name'])}")
            st.error(t("teach.report.model_failed", error=plain(message(entry["error"]))))
            continue
        seq = t("results.teach.seq", seq=entry["seq_len"]) if entry.get("seq_len") else ""
        st.markdown("### " + t("results.teach.model", name=plain(entry["name"]), batch=entry.get("batch"), seq=seq,
                               dtype=plain(entry["dtype"]), format=plain(entry.get("memory_format") or "nchw"),
                               fused=entry.get("chains_fused", "?")))
        panels.breakdown_panel(entry.get("breakdown") or {}, entry["name"], key=f"chart_breakdown_{i}")
        panels.traffic_panel(entry.get("traffic") or {}, entry["name"], key=f"chart_traffic_{i}")
        panels.stages_panel(entry.get("stages") or [], t("teach.stages.from_report"))
        notes = [n for n in entry.get("notes") or [] if isinstance(n, str)]
        if notes:
            with st.expander(t("results.teach.notes", name=plain(entry["name"]))):
                for n in notes:
                    st.markdown(f"- {plain(message(n))}")


def _named_by_engine(report: Report) -> Report:
    """The report with each chain named by the engine's one name (``Chain.title``) when it was measured on the
    loaded model: a report saved before the names were unified keeps its old titles otherwise."""
    detection = _detection_of(report)
    if detection is None:
        return report
    known = {c.id: c.title for c in detection.chains}
    # the graph model's launches of this report's plan on its device, as the Graph and Fusions pages count them
    # (a report saved before the count was per device carries the GPU's saving on every device)
    spec = ui_state.current()[0]
    table = ui_state.launches_for(spec, detection, report.plan, report.environment.device)
    saved = {c.chain_id: c.saved for c in table.chains}
    return dataclasses.replace(
        report, chains=tuple(dataclasses.replace(c, title=known.get(c.id, c.title),
                                                 graph_launches_saved=saved.get(c.id, c.graph_launches_saved))
                             for c in report.chains),
        unfused=dataclasses.replace(report.unfused, graph_launches=table.before),
        fused=dataclasses.replace(report.fused, graph_launches=table.after))


def _run_report(report: Report) -> None:
    report = _named_by_engine(report)
    lang = current_language()
    st.subheader(t("results.title", model=plain(report.model.name or t("results.model"))))
    st.caption(plain(charts.device_caption(report, lang)))
    if report.is_cpu:
        st.warning(t("results.cpu"))
    for f in report.failures:  # a failed phase ended only itself: say which, on which variant, why
        phase = t(f"results.phase.{f.phase}") if f.phase in PHASES else plain(f.phase)
        if f.not_run:
            st.warning(t("results.phase_not_run", phase=phase, reason=plain(message(f.reason))))
        else:
            variant = t("results.phase_variant", variant=plain(f.variant)) if f.variant else ""
            st.error(t("results.phase_failed", phase=phase, variant=variant, reason=plain(message(f.reason))))
    if report.fresh_processes:
        st.caption(t("results.fresh_processes", n=report.fresh_processes))

    st.markdown("#### " + (t("results.compare_baselines") if report.baselines else t("results.compare")))
    st.markdown(plain(charts.verdict_text(report, lang)))
    st.plotly_chart(charts.comparison_figure(report, lang), key="chart_compare", width="stretch")
    st.dataframe(charts.summary_rows(report, lang), hide_index=True, width="stretch")
    for m in (report.unfused, report.fused):   # (a CPU run's memory notes say why its memory cells are n/a)
        notes = [message(x) for x in (m.memory_note, m.launches_kind, m.note) if x]
        if m.bound in ("host", "gpu"):
            notes.append(t("results.bound", bound=t(f"results.bound.{m.bound}"), ms=m.gpu_busy_ms or 0.0))
        if notes:
            st.caption(t("results.variant_notes", variant=t(f"chart.{m.name}") if m.name in ("unfused", "fused")
                         else plain(m.name), notes=plain(charts.NOTE_SEP.get(lang, "; ").join(notes))))
    if report.baselines:
        st.markdown("#### " + t("results.baselines"))
        st.dataframe(charts.baseline_rows(report, lang), hide_index=True, width="stretch", key="table_baselines")

    st.markdown("#### " + t("results.precision"))
    warning = finiteness_warning(report)
    if warning is not None:          # NaN or infinity: the model's own ops in this dtype, or a fusion
        st.warning(plain(message(warning)))
    st.dataframe(charts.precision_rows(report, lang), hide_index=True, width="stretch")  # cells are text: no None
    if report.precision_note:
        st.caption(plain(message(report.precision_note)))

    st.markdown("#### " + t("results.per_chain"))
    rows = charts.chain_rows(report, lang)
    if any(c.speedup is not None for c in report.chains):
        counts = Counter(c.verdict.reading for c in report.chains)   # as the table reads them (undecided too)
        st.markdown(plain(charts.LIST_SEP.get(lang, ", ").join(
            t("results.count", n=counts[label], label=charts.verdict_label(label, lang)) for label in READINGS
            if counts[label])))
        if counts[UNDECIDED]:   # what "undecided" means, in the statistic's own words
            st.caption(t("results.undecided", n=counts[UNDECIDED]))
        slower = report.slower_chains
        if slower:
            st.warning(t("results.slower", n=len(slower)))
            _offer_reject_slower(report)
        _explain_slower(report)  # says nothing when no chain is slower either way
        st.plotly_chart(charts.chain_speedup_figure(report, lang), key="chart_chain_speedup", width="stretch")
        st.dataframe(rows, hide_index=True, width="stretch")
        st.plotly_chart(charts.chain_precision_figure(report, lang), key="chart_chain_precision", width="stretch")
        if report.rotation_note:
            st.caption(plain(message(report.rotation_note)))
    elif rows:
        st.caption(t("results.no_chain_timings"))
        st.dataframe(rows, hide_index=True, width="stretch")
    else:
        st.caption(t("results.no_chains"))

    st.markdown("#### " + t("results.stages"))
    stage_rows = charts.stages_rows(report, lang)
    if stage_rows:
        # how each stage's graph differs is a sentence: listed below the table, whose last column cut it off
        graph, stage = t("chart.col.graph"), t("chart.col.stage")
        st.dataframe([{k: v for k, v in r.items() if k != graph} for r in stage_rows], hide_index=True,
                     width="stretch", key="table_stages")
        st.markdown("\n".join(f"- **{plain(r[stage])}**: {plain(r[graph])}" for r in stage_rows if r[graph]))
        if report.is_cpu:
            st.caption(t("chart.missing.memory_cpu_why"))
        st.plotly_chart(charts.stages_figure(report, lang), key="chart_stages", width="stretch")
    else:
        st.caption(t("results.no_stages"))
    notes = list(report.notes) + [n for n in (report.bytes_note, report.graph_calls_note) if n]
    if notes:
        with st.expander(t("results.notes")):
            for n in notes:
                st.markdown(f"- {plain(message(n))}")


def page() -> None:
    _open_saved_report()
    ss = st.session_state
    teaching, last = ss.get("results_teaching"), ss.last_report
    if teaching is not None:
        _teaching_report(*teaching)
    if last is None:
        if teaching is None:
            st.info(t("results.none"))
        return
    if teaching is not None:
        st.divider()
        st.markdown("### " + t("results.run_title"))
    _run_report(last[1])


ui_state.guarded(page)
