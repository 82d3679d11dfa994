"""Sweeps page: the results of ``fusion-explorer sweep``, as charts and tables, and a sweep's progress while it runs.

A sweep folder is chosen among those under the sweeps root (``FUSION_EXPLORER_SWEEPS_ROOT``, by default
``benchmarks/results/sweeps``; a folder that leaves the root, through ``..`` or a link, is refused:
``explorer.sweeps.store.open_folder``), or its results are uploaded (``results.jsonl`` or ``results.parquet``).
While a sweep writes to the chosen folder, its progress (points done, failed, cached, the time left) is redrawn
every two seconds from the folder's ``progress.json``.

The figures (``explorer.ui.sweep_views``): speed-up and its 95% interval against batch size or sequence length,
one line per model · plan · dtype, each marker in its verdict's colour (the report's paired test); the fused
model against ``torch.compile`` where the sweep measured baselines; a heatmap of models × plans at one dtype and
batch; peak memory (CUDA only); where a fusion stops paying, read from the verdicts. A click on a point (or the
point chosen below the charts) opens its report on the Results page (``ui_state.open_report``, as the Results
page's own uploader does). Every string from a results file goes through ``escape_markdown`` where markdown
would render it.

Widget keys: sweeps_source, sweeps_folder, sweeps_upload, sweeps_x, sweeps_heat_dtype, sweeps_heat_batch,
sweeps_point, sweeps_open_report; chart keys: chart_sweep_speedup, chart_sweep_compile, chart_sweep_heatmap,
chart_sweep_memory; tables: table_sweep_stops, table_sweep_points.
"""

from __future__ import annotations

import os
from pathlib import Path

import streamlit as st

from explorer.errors import ExplorerError
from explorer.sweeps import store as sweep_store
from explorer.ui import state as ui_state
from explorer.ui import sweep_views as views
from explorer.ui.files import escape_markdown as plain
from explorer.ui.i18n import current as current_language
from explorer.ui.i18n import message, t, t_in

ROOT_ENV = "FUSION_EXPLORER_SWEEPS_ROOT"
DEFAULT_ROOT = Path(__file__).resolve().parents[3] / "benchmarks" / "results" / "sweeps"
RESULTS_PAGE = Path(__file__).with_name("results.py")
SOURCES = ("folder", "upload")


def sweeps_root() -> Path:
    """The folder sweep folders are chosen under (``FUSION_EXPLORER_SWEEPS_ROOT``, or the committed ones)."""
    return Path(os.environ.get(ROOT_ENV) or DEFAULT_ROOT)


def _choose() -> tuple[list[dict] | None, sweep_store.SweepStore | None]:
    """The records to show and the folder they come from (None for an upload)."""
    lang = current_language()
    source = st.radio(t("sweeps.source"), SOURCES, key="sweeps_source", horizontal=True,
                      format_func=lambda s, lang=lang: t_in(lang, f"sweeps.source.{s}"))
    if source == "upload":
        uploaded = st.file_uploader(t("sweeps.upload"), type=["jsonl", "parquet"], key="sweeps_upload")
        if uploaded is None:
            st.info(t("sweeps.upload_prompt"))
            return None, None
        return sweep_store.read_results(uploaded.name, uploaded.getvalue()), None
    root = sweeps_root()
    folders = sweep_store.sweep_folders(root)
    if not folders:
        st.info(t("sweeps.no_folders", root=plain(root)))
        return None, None
    name = st.selectbox(t("sweeps.folder"), folders, key="sweeps_folder", help=t("sweeps.folder_help", root=root))
    store = sweep_store.SweepStore.open(name, root=root)
    return store.results(), store


@st.fragment(run_every=2.0)
def _live_progress(store: sweep_store.SweepStore) -> None:
    """A running sweep's progress from its folder, redrawn every two seconds; the page reloads when it ends."""
    progress = store.progress() or {}
    if progress.get("status") != "running":
        st.rerun(scope="app")
        return
    st.progress(float(progress.get("fraction") or 0.0),
                text=t("sweeps.progress", done=progress.get("done", 0), failed=progress.get("failed", 0),
                       refused=progress.get("refused", 0), cached=progress.get("cached", 0), total=progress.get("total", 0),
                       running=progress.get("running", 0), left=_left(progress)))


def _left(progress: dict) -> str:
    left = progress.get("left_s")
    if left is None:
        return t("sweeps.left_unknown")
    left = int(round(left))
    return t("sweeps.left_s", s=left) if left < 90 else t("sweeps.left_min", m=left // 60, s=left % 60)


def _summary(store: sweep_store.SweepStore | None, records: list[dict]) -> None:
    counts = {s: sum(1 for r in records if r["status"] == s) for s in sweep_store.STATUSES}
    devices = sorted({r["device_name"] for r in records if r.get("device_name")})
    where = plain(", ".join(devices) or "?")
    if counts["refused"]:
        st.markdown(t("sweeps.summary_refused", n=len(records), ok=counts["ok"], failed=counts["failed"],
                      refused=counts["refused"], devices=where))
    else:
        st.markdown(t("sweeps.summary", n=len(records), ok=counts["ok"], failed=counts["failed"], devices=where))
    if any(r.get("device_kind") == "cpu" for r in records):
        st.warning(t("sweeps.cpu"))
    if store is not None:
        progress = store.progress() or {}
        if progress.get("status") == "running":
            _live_progress(store)
        elif progress:
            st.caption(t("sweeps.last_run", status=t(f"sweeps.run_status.{progress.get('status', 'done')}")
                         if progress.get("status") in ("done", "cancelled", "interrupted") else plain(progress.get("status")),
                         done=progress.get("done", 0), failed=progress.get("failed", 0),
                         refused=progress.get("refused", 0), cached=progress.get("cached", 0),
                         total=progress.get("total", 0)))


def _open_point(store: sweep_store.SweepStore, key: str) -> None:
    """Open point ``key``'s report on the Results page (or say why not, in one line)."""
    record = next((r for r in store.results() if r["key"] == key), None)
    if record is None or not record["has_report"]:
        st.error(t("sweeps.no_report"))
        return
    try:
        data = store.report_bytes(key)
    except ExplorerError as exc:
        st.error(t("sweeps.not_opened", error=plain(message(str(exc)))))
        return
    ui_state.open_report(f"{record['point']}.json", data, f"sweep:{store.folder}:{key}")
    if st.session_state.report_error:
        st.error(t("sweeps.not_opened", error=plain(message(st.session_state.report_error))))
        return
    st.switch_page(RESULTS_PAGE)


def _clicked(event) -> str | None:
    """The key of the point clicked in a chart (its ``customdata``), or None."""
    try:
        points = event.selection.points
    except AttributeError:
        return None
    for p in points or []:
        data = p.get("customdata") if isinstance(p, dict) else None
        if data:
            return str(data[0])
    return None


def _charts(records: list[dict], store: sweep_store.SweepStore | None) -> None:
    lang = current_language()
    measured = views.ok(records)
    if not measured:
        st.info(t("sweeps.nothing_measured"))
        return
    axes = views.x_options(measured)
    x = st.radio(t("sweeps.x"), axes, key="sweeps_x", horizontal=True,
                 format_func=lambda a, lang=lang: t_in(lang, f"sweeps.axis.{a}"))
    clickable = {"on_select": "rerun", "selection_mode": "points"} if store is not None else {}
    st.markdown("#### " + t("sweeps.h.speedup"))
    st.caption(t("sweeps.speedup_caption"))
    event = st.plotly_chart(views.speedup_figure(records, x, lang), key="chart_sweep_speedup", width="stretch",
                            **clickable)
    clicked = _clicked(event)

    st.markdown("#### " + t("sweeps.h.compile"))
    if views.has_compile(records):
        event = st.plotly_chart(views.compile_figure(records, x, lang), key="chart_sweep_compile", width="stretch",
                                **clickable)
        clicked = clicked or _clicked(event)
    else:
        st.caption(t("sweeps.no_compile"))

    st.markdown("#### " + t("sweeps.h.heatmap"))
    dtypes = sorted({r["dtype"] for r in measured})
    batches = sorted({r["batch"] for r in measured})
    c1, c2 = st.columns(2)
    dtype = c1.selectbox(t("sweeps.heat_dtype"), dtypes, key="sweeps_heat_dtype")
    batch = c2.selectbox(t("sweeps.heat_batch"), batches, key="sweeps_heat_batch")
    st.plotly_chart(views.heatmap_figure(records, lang, dtype, batch), key="chart_sweep_heatmap", width="stretch")

    st.markdown("#### " + t("sweeps.h.memory"))
    if views.has_memory(records):
        st.plotly_chart(views.memory_figure(records, lang), key="chart_sweep_memory", width="stretch")
    else:
        st.caption(t("sweeps.no_memory"))

    st.markdown("#### " + t("sweeps.h.stops"))
    st.caption(t("sweeps.stops_caption"))
    stops = views.stops_rows(records, x, lang)
    if stops:
        st.dataframe(stops, hide_index=True, width="stretch", key="table_sweep_stops")
    else:
        st.caption(t("sweeps.no_stops"))
    if clicked and store is not None:
        _open_point(store, clicked)


def _points(records: list[dict], store: sweep_store.SweepStore | None) -> None:
    lang = current_language()
    st.markdown("#### " + t("sweeps.h.points"))
    failed = [r for r in records if r["status"] == "failed"]
    if failed:
        st.warning(t("sweeps.failed", n=len(failed)))
    refused = [r for r in records if r["status"] == "refused"]
    if refused:
        st.info(t("sweeps.refused", n=len(refused)))
    st.dataframe(views.point_rows(records, lang), hide_index=True, width="stretch", key="table_sweep_points")
    if store is None:
        st.caption(t("sweeps.upload_no_reports"))
        return
    with_report = {r["key"]: views.point_name(r, lang) for r in records if r["has_report"]}
    if not with_report:
        return
    c1, c2 = st.columns([3, 1])
    key = c1.selectbox(t("sweeps.point"), list(with_report), key="sweeps_point",
                       format_func=lambda k, names=with_report: names[k])
    if c2.button(t("sweeps.open_report"), key="sweeps_open_report"):
        _open_point(store, key)


def page() -> None:
    st.title(t("sweeps.title"))
    st.markdown(t("sweeps.intro"))
    records, store = _choose()
    if records is None:
        return
    if not records:
        st.info(t("sweeps.empty"))
        return
    _summary(store, records)
    _charts(records, store)
    _points(records, store)


ui_state.guarded(page)
