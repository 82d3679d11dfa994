"""Run page: measure the unfused and the fused model (``explorer.gpu_runner.run``).

The run goes to a background thread; this page shows its progress live (a
fragment redrawn every second: the phase, the estimated time left, the time
elapsed) and offers Cancel, after which it says "cancelled", not "failed".
Quick mode takes fewer repetitions and skips the per-chain timing. Reports are
kept per (model, plan, settings): the same run twice is answered from the cache.

Widget keys: run_per_chain, run_stages, run_compile_baseline, run_quick, run_start, run_cancel.
"""

from __future__ import annotations

import streamlit as st

from explorer.ui import charts
from explorer.ui import state as ui_state
from explorer.ui.files import escape_markdown as plain


def _settings(spec):
    from explorer.gpu_runner import RunSettings

    ss = st.session_state
    return RunSettings(device=ss.get("device", "cpu"), dtype=ss.get("dtype", "fp32"), batch=spec.batch,
                       seq_len=spec.seq_len, per_chain=bool(ss.run_per_chain), stages=bool(ss.run_stages),
                       compile_baseline=bool(ss.run_compile_baseline), quick=bool(ss.run_quick))


def page() -> None:
    cur = ui_state.current_or_prompt()
    if cur is None:
        return
    spec, model, graph, detection = cur
    ss = st.session_state
    plan = ui_state.current_plan(detection)
    st.subheader(f"Measure {model.name}")
    st.markdown(f"Plan: **{len(plan.accepted)} of {len(detection.chains)}** chains accepted · device "
                f"**{ss.get('device')}** · dtype **{ss.get('dtype')}** · batch **{spec.batch}**"
                + (f" · sequence **{spec.seq_len}**" if spec.seq_len else "")
                + f" · memory format **{plan.memory_format}** · CUDA graphs **{'on' if plan.cuda_graphs else 'off'}**")
    c = st.columns(4)
    c[0].checkbox("Time every chain alone", key="run_per_chain")
    c[1].checkbox("Staged table (none → Conv+BN → +act → all)", key="run_stages")
    c[2].checkbox("torch.compile baseline", key="run_compile_baseline")
    c[3].checkbox("Quick (fewer repetitions, no per-chain timing)", key="run_quick",
                  help="A first look: ResNet-50 on a 2-core CPU in under a minute")

    try:
        settings = _settings(spec)
    except ImportError:
        st.error("The measurement runner (explorer.gpu_runner) is not available in this installation.")
        return
    job = ss.run_job
    busy = job is not None and not job.done
    b = st.columns([1, 1, 4])
    b[0].button("Run", key="run_start", type="primary", disabled=busy,
                on_click=ui_state.start_run, args=(spec, plan, settings))
    b[1].button("Cancel", key="run_cancel", disabled=not busy, on_click=ui_state.cancel_run)
    if busy:
        st.caption("The estimate of the time left appears once the first forward is timed, and is revised "
                   "as each phase ends.")
        ui_state.live_progress("page")
        return
    if ss.get("run_cancelled"):
        st.info("Run cancelled: nothing was measured; press Run to start again.")
    elif ss.run_error:
        st.error(f"Run failed: {plain(ss.run_error)}")
    last = ss.last_report
    if last is None:
        st.info("Press Run: the runner measures the model unfused and with your plan, in a separate process.")
        return
    key, report = last
    same = key == ui_state.run_key(spec, plan, settings)
    st.success(("Results for the current plan and settings" if same else
                "Results of the last run (for another plan or settings; press Run to measure this one)")
               + (" (answered from the cache: same model, plan and settings)." if ss.get("last_report_cached") else "."))
    st.caption(plain(charts.device_caption(report)))
    st.markdown(plain(charts.verdict_text(report)))
    if report.duration_s is not None:
        st.caption(f"measured in {report.duration_s:.0f} s")
    st.dataframe(charts.summary_rows(report), hide_index=True, width="stretch")
    st.page_link("ui/pages/results.py", label="See every chart on the Results page", icon=":material/bar_chart:")


ui_state.guarded(page)
