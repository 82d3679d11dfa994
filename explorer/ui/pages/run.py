"""Run page: measure the unfused and the fused model (``explorer.gpu_runner.run``).

The run goes to a background thread; this page shows its progress live (a
fragment redrawn every second: the phase, the estimated time left, the time
elapsed) and offers Cancel, after which it says "cancelled", not "failed".
Quick mode takes fewer repetitions and skips the per-chain timing; the CPU threads are the same
for quick and normal runs (one on the CPU) unless chosen. After a run, the host's load while it
measured, with a warning when it was busy. Reports are
kept per (model, plan, settings): the same run twice is answered from the cache.

Every text is the catalog's (``run.*``, ``explorer/ui/locale/run.py``) in the
sidebar's language; the runner's progress and errors, written in English, are
translated where they are shown (``explorer.ui.i18n.message``).

Widget keys: run_per_chain, run_stages, run_compile_baseline, run_quick, run_cpu_threads, run_start,
run_cancel.
"""

from __future__ import annotations

import os

import streamlit as st

from explorer.ui import charts
from explorer.ui import state as ui_state
from explorer.ui.files import escape_markdown as plain
from explorer.ui.i18n import current as current_language
from explorer.ui.i18n import message, t, t_in


def _settings(spec):
    from explorer.gpu_runner import RunSettings

    ss = st.session_state
    threads = int(ss.get("run_cpu_threads") or 0)
    return RunSettings(device=ss.get("device", "cpu"), dtype=ss.get("dtype", "fp32"), batch=spec.batch,
                       seq_len=spec.seq_len, per_chain=bool(ss.run_per_chain), stages=bool(ss.run_stages),
                       compile_baseline=bool(ss.run_compile_baseline), quick=bool(ss.run_quick),
                       cpu_threads=threads or None)


def _host_lines(report) -> None:
    """How busy the host was while the run measured (``Report.host``): a warning when it was busy."""
    host = report.host
    if host is None:
        return
    if host.busy:
        st.warning(plain(message(host.warning())), icon=":material/speed:")
    st.caption(t("run.host", load=host.peak if host.peak is not None else 0.0, cores=host.cores,
                 threads=host.torch_threads,
                 how=t("run.threads_set") if host.threads_set else t("run.threads_default")))


def _durations(report, wait_s: float | None, cached: bool) -> None:
    """The two times a run has, each said for what it is: the wait from the click to the results on screen
    (``wait_s``, the elapsed counter's clock), and the part of it the measuring process spent (``duration_s``:
    loading the model there, preparing both graphs, timing them); the rest started that process."""
    measured = report.duration_s
    if wait_s is not None and measured is not None:
        wait, part = round(wait_s), round(min(measured, wait_s))   # whole seconds that add up as shown
        if cached:
            st.caption(t("run.duration_cached", wait=wait, s=part))
        else:
            st.caption(t("run.duration_wait", wait=wait, s=part, rest=wait - part))
    elif measured is not None:
        st.caption(t("run.duration", s=measured))


@ui_state.needs_model
def page(spec, model, graph, detection) -> None:
    ss = st.session_state
    plan = ui_state.current_plan(detection)
    lang = current_language()
    st.subheader(t("run.title", model=plain(model.name)))
    st.markdown(t("run.plan", accepted=len(plan.accepted), total=len(detection.chains), device=ss.get("device"),
                  dtype=ss.get("dtype"), batch=spec.batch)
                + (t("run.plan_seq", seq=spec.seq_len) if spec.seq_len else "")
                + t("run.plan_format", format=plan.memory_format,
                    graphs=t("run.on") if plan.cuda_graphs else t("run.off")))
    c = st.columns([1, 1, 1, 1, 1.2])
    c[0].checkbox(t("run.per_chain"), key="run_per_chain", help=t("run.per_chain_help"))
    c[1].checkbox(t("run.stages"), key="run_stages", help=t("run.stages_help"))
    c[2].checkbox(t("run.compile_baseline"), key="run_compile_baseline", help=t("run.compile_baseline_help"))
    c[3].checkbox(t("run.quick"), key="run_quick", help=t("run.quick_help"))
    c[4].selectbox(t("run.cpu_threads"), [0, *range(1, (os.cpu_count() or 1) + 1)], key="run_cpu_threads",
                   format_func=lambda n, lang=lang: t_in(lang, "run.cpu_threads_default") if n == 0 else str(n),
                   help=t("run.cpu_threads_help"))

    try:
        settings = _settings(spec)
    except ImportError:
        st.error(t("run.no_runner"))
        return
    job = ss.run_job
    busy = job is not None and not job.done
    b = st.columns([1, 1, 4])
    b[0].button(t("run.start"), key="run_start", type="primary", disabled=busy,
                on_click=ui_state.start_run, args=(spec, plan, settings))
    b[1].button(t("run.cancel"), key="run_cancel", disabled=not busy, on_click=ui_state.cancel_run)
    if busy:
        st.caption(t("run.estimate"))
        ui_state.live_progress("page")
        return
    if ss.get("run_cancelled"):
        st.info(t("run.cancelled"))
    elif ss.run_error:
        st.error(t("run.failed", error=plain(message(ss.run_error))))
    last = ss.last_report
    if last is None:
        st.info(t("run.press"))
        return
    key, report = last
    same = key == ui_state.run_key(spec, plan, settings)
    cached = bool(ss.get("last_report_cached"))
    if same:
        st.success(t("run.results_current_cached") if cached else t("run.results_current"))
    else:
        st.success(t("run.results_other_cached") if cached else t("run.results_other"))
    st.caption(plain(charts.device_caption(report, lang)))
    st.markdown(plain(charts.verdict_text(report, lang)))
    _durations(report, ss.get("last_report_wait_s"), cached)
    _host_lines(report)
    st.dataframe(charts.summary_rows(report, lang), hide_index=True, width="stretch")
    if report.is_cpu:   # the memory cells say "n/a on the CPU"; why, once
        st.caption(t("chart.missing.memory_cpu_why"))
    st.page_link("ui/pages/results.py", label=t("run.to_results"), icon=":material/bar_chart:")


ui_state.guarded(page)
