"""Learn page: operator fusion taught on the loaded model, in English and 中文.

Seven tabs: a guided tour for a class; every pattern with its before/after
diagram; worked examples computed from the model (a Conv+BN fold by hand, the
bytes each version of a chain reads and writes); the seed's tables regenerated
(where one forward's time goes, memory traffic, the staged table) from this
session or from a teaching report; predicted against measured gain per chain;
when a fusion stops paying (that chain alone swept over batch and dtype by ``explorer.sweeps.chain``: a sweep,
whose folder opens on the Sweeps page); and the precision bisect. The profile, the sweep and the bisect run in a
child process (``explorer.runtime.teach_tasks`` through ``ui.tasks.start_child``), with a time limit, a cancel and
the time left, never in the app's process. All numbers come from the
engine or from committed results, never from this page's text.

A widget's ``format_func`` takes the language as a default argument: the
test harness calls it after the run, outside the session.

Widget keys: tour_load, tour_seen, tour_scale, tour_bias, tour_read, ex_fold_chain, ex_fold_channel,
ex_dtype, teach_source, teach_committed, teach_open_committed, teach_report_file, teach_model,
teach_profile, profile_cancel, profile_timeout, sweep_chain, sweep_batches, sweep_dtypes, sweep_start, sweep_cancel,
sweep_timeout, sweep_open, bisect_mode, bisect_start, bisect_cancel, bisect_timeout.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any, Callable

import streamlit as st

from explorer.errors import ExplorerError, ReportError
from explorer.fusions import BY_NAME, PATTERNS
from explorer.report import SLOWER
from explorer.runtime.ceilings import Ceilings, known_ceilings
from explorer.runtime.measure import torch_dtype
from explorer.runtime.teach_tasks import TIMEOUT_S
from explorer.runtime.traffic import traffic_table
from explorer.teaching import examples as teach_examples
from explorer.teaching import predict as teach_predict
from explorer.teaching import readers
from explorer.teaching import report as teach_report
from explorer.ui import charts, diagrams, kernel_table, tasks
from explorer.ui.safe_text import code, markdown as plain
from explorer.ui import teaching_panels as panels
from explorer.ui import state as ui_state
from explorer.ui import teaching_views as views
from explorer.ui.i18n import current as current_language
from explorer.ui.i18n import family_title, message, pattern_text, t, t_in
from explorer.units import human_bytes

RESULTS = Path(__file__).resolve().parents[3] / "benchmarks" / "results"
BATCHES = (1, 2, 4, 8, 16, 32, 64, 128, 256)
DTYPES = ("fp32", "bf16", "fp16")
TOUR_MODEL = "residual_block"
#: The Sweeps page's root (``ui/pages/sweeps.py``: ``FUSION_EXPLORER_SWEEPS_ROOT``, else the committed sweeps); the
#: Learn page's sweeps go in its ``learn/`` folder, so that the Sweeps page lists them.
SWEEPS_ROOT_ENV = "FUSION_EXPLORER_SWEEPS_ROOT"
SWEEPS_PAGE = "ui/pages/sweeps.py"


def _sweeps_root() -> Path:
    return Path(os.environ.get(SWEEPS_ROOT_ENV) or RESULTS / "sweeps")


# ====================================================================== helpers

@st.cache_data(show_spinner=False, max_entries=32)
def _fold(source: str, batch: int, seq_len: int | None, chain_id: str | None, channel: int) -> dict | None:
    """The worked Conv+BN fold (cached per model, chain and channel)."""
    ex = teach_examples.fold_example(ui_state.load_analysis(source, batch, seq_len), chain_id, channel)
    return ex.to_dict() if ex else None


@st.cache_data(show_spinner=False, max_entries=16)
def _traffic_examples(source: str, batch: int, seq_len: int | None, dtype: str
                      ) -> dict[str, teach_examples.TrafficExample]:
    """One traffic example per pattern family of the model (cached)."""
    return teach_examples.examples_by_family(ui_state.load_analysis(source, batch, seq_len), dtype)


@st.cache_resource(show_spinner=False)
def _cpu_ceilings() -> Ceilings:
    """The CPU's ceilings, measured once per server (quick sizes): the table has none for a CPU."""
    from explorer.runtime.ceilings import measure_ceilings

    return measure_ceilings("cpu", ("fp32", "bf16"), quick=True)


def _ceilings(device: str) -> Ceilings:
    """The ceilings of the device the sidebar names: the table's for a known GPU, measured now for the CPU."""
    if device.startswith("cuda"):
        import torch

        return known_ceilings(torch.cuda.get_device_properties(0).name)
    return _cpu_ceilings()


def _report_matches(detection) -> Any:
    """This session's run report when it was measured on the loaded model, else None."""
    last = st.session_state.get("last_report")
    if not last or detection is None:
        return None
    report = last[1]
    return report if readers.report_fingerprint(report) == detection.fingerprint else None


def _committed_reports() -> list[Path]:
    return sorted(RESULTS.glob("teaching_*.json"))


def _open_teaching_report(name: str, data: bytes) -> None:
    ss = st.session_state
    try:
        ss.teach_report = (name, teach_report.load(data, name))
        ss.teach_report_error = None
        ss.teach_source = "report"
    except ReportError as exc:
        ss.teach_report_error = str(exc)


def _on_teaching_upload() -> None:
    uploaded = st.session_state.get("teach_report_file")
    if uploaded is not None:
        _open_teaching_report(uploaded.name, uploaded.getvalue())


def _on_open_committed() -> None:
    name = st.session_state.get("teach_committed")
    if name:
        path = RESULTS / name
        try:
            _open_teaching_report(name, path.read_bytes())
        except OSError as exc:
            st.session_state.teach_report_error = f"{name}: {exc.strerror or exc}"


def _svg(spec: diagrams.DiagramSpec, fused: bool, device_launches: int | None = None) -> str:
    """One drawing with its caption; ``device_launches`` is the chain's fused launches on the sidebar's device
    (``explorer.launches``, the count the Graph page shows), said when it is not the one kernel drawn."""
    c = diagrams.counts(spec, fused)
    if fused and device_launches is not None and device_launches != c["launches"]:
        caption = t("diagram.caption_device", launches=device_launches, device=_device_word(),
                    trips=c["round_trips"])
    elif spec.siblings:
        caption = t("diagram.caption_siblings", launches=c["launches"], reads=c["input_reads"])
    else:
        caption = t("diagram.caption", launches=c["launches"], trips=c["round_trips"])
    return diagrams.svg(spec, fused, {"chip": t("diagram.chip"), "memory": t("diagram.memory"),
                                      "kept_on_chip": t("diagram.kept_on_chip"), "caption": caption})


def _device_word() -> str:
    return "GPU" if str(st.session_state.get("device", "cpu")).startswith("cuda") else "CPU"


def _chain_launches(cur, chain_id: str):
    """A chain's launches on the sidebar's device with the user's kernel choice (``ui_state.launch_table``, the
    one count the Graph and Fusions pages show), or None when the table does not have it."""
    spec, _model, _graph, detection = cur
    return ui_state.launch_table(spec, detection).of(chain_id)


def _before_after(spec: diagrams.DiagramSpec, launches=None) -> None:
    """The unfused and the fused drawing side by side, inline in the page (an SVG shown as an image draws with
    the machine's fonts only; inline, its Chinese uses the app's own CJK font, explorer/ui/fonts.py).
    ``launches`` (a ``ChainLaunches``: a real chain's on this device) puts the device's count in the fused
    caption where it differs from the one kernel the drawing shows."""
    left, right = st.columns(2)
    with left:
        st.markdown(f"**{t('diagram.before')}**")
        st.markdown(diagrams.fit_width(_svg(spec, False)), unsafe_allow_html=True)
    with right:
        st.markdown(f"**{t('diagram.after')}**")
        st.markdown(diagrams.fit_width(_svg(spec, True, launches.fused if launches is not None else None)),
                    unsafe_allow_html=True)


def _poll(name: str) -> None:
    """Progress of a background task, redrawn on its own every half second; the page reruns when it ends."""
    @st.fragment(run_every=0.5)
    def _progress() -> None:
        job = tasks.get(name)
        if job is None:
            return
        if job.running:
            fraction, status, elapsed = job.view()   # the time left counted down, the bar a share of the time
            st.progress(fraction, text=t("learn.task.progress", message=message(status), seconds=f"{elapsed:.0f}"))
        elif job.finished and time.time() - job.finished < 2:
            st.rerun(scope="app")

    _progress()


# ====================================================================== the tabs

def _intro() -> None:
    st.subheader(t("learn.title"))
    st.markdown(t("learn.intro"))
    with st.expander(t("learn.general.title")):
        st.markdown(t("learn.general.why"))
        st.markdown(t("learn.general.precision"))
        st.markdown(t("learn.general.training"))
        st.markdown(t("learn.general.pays"))
        _committed_evidence()
    kernel_table.panel(RESULTS, current_language())   # the LLM kernels per shape, from the committed H200 JSON


def _committed_evidence() -> None:
    """What the committed H200 results say about fusions that do not pay, read from the files themselves."""
    path = RESULTS / "report_resnet50_fp16_channels_last_h200.json"
    host = RESULTS / "host_overhead_lean_h200.json"
    lines = []
    try:
        data = json.loads(path.read_text())
        measured = readers.measured_chains(data)
        slower_graph = [c for c in measured.values() if c.graph_speedup is not None and c.graph_speedup < 1]
        slower_plain = [c for c in measured.values() if c.slower]
        lines.append(t("learn.evidence.chains", file=path.name, n=len(measured), plain=len(slower_plain),
                       graph=len(slower_graph),
                       date=str((data.get("environment") or {}).get("started_utc", ""))[:10]))
    except (OSError, ValueError, AttributeError):
        pass
    try:
        rows = {r["op"]: r for r in json.loads(host.read_text())["rows"]}
        lines.append(t("learn.evidence.host", file=host.name,
                       eager=rows["add+LN eager (2 ops)"]["host_us_per_call"],
                       triton=rows["add+LN triton"]["host_us_per_call"],
                       three=rows["QKV: 3 linears"]["host_us_per_call"],
                       one=rows["QKV: 1 linear + split (siblings)"]["host_us_per_call"]))
    except (OSError, ValueError, KeyError):
        pass
    if lines:
        st.markdown(f"**{t('learn.evidence.title')}**")
        for line in lines:
            st.markdown(f"- {line}")


def _tour(cur) -> None:
    ss = st.session_state
    done = ss.tour_done
    st.markdown(t("tour.intro"))
    loaded = cur is not None and cur[0].source == TOUR_MODEL

    def step(n: int, ok: bool, title: str) -> None:
        icon = ":material/check_circle:" if ok else ":material/radio_button_unchecked:"
        st.markdown(f"#### {icon} {t('tour.step', n=n)} · {title}")

    step(1, loaded, t("tour.s1.title"))
    st.markdown(t("tour.s1.body"))
    if not loaded:
        st.button(t("tour.s1.button"), key="tour_load", on_click=_load_tour_model)
        return
    spec, model, graph, detection = cur
    chain = detection.chains[0]

    seen = "seen" in done
    step(2, seen, t("tour.s2.title"))
    st.markdown(t("tour.s2.body", chain=plain(chain.title), ops=code(chain.ops_text)))
    if st.session_state.get("device", "cpu") == "cpu":   # the Graph page shows the CPU's launches: say why
        st.caption(t("tour.s2.cpu"))
    ex = teach_examples.traffic_example(graph, chain, "fp32")
    _before_after(diagrams.spec_for_example(ex, BY_NAME[chain.pattern].color), _chain_launches(cur, chain.id))
    st.page_link("ui/pages/graph.py", label=t("tour.s2.link"), icon=":material/hub:")
    if st.checkbox(t("tour.s2.check"), value=seen, key="tour_seen"):
        done["seen"] = True
    else:
        done.pop("seen", None)

    fold = _fold(spec.source, spec.batch, spec.seq_len, None, 0)
    folded = "fold" in done
    step(3, folded, t("tour.s3.title"))
    if fold:
        st.markdown(t("tour.s3.body", gamma=fold["gamma"], beta=fold["beta"], mean=fold["mean"], var=fold["var"],
                      eps=fold["eps"], bias=fold["conv_bias"], chain=fold["title"]))
        st.code("s  = γ / √(σ² + ε)\nb' = (b − μ) · s + β", language=None)
        c1, c2 = st.columns(2)
        scale = c1.number_input(t("tour.s3.scale"), value=0.0, format="%.6f", key="tour_scale")
        bias = c2.number_input(t("tour.s3.bias"), value=0.0, format="%.6f", key="tour_bias")
        ok_scale = abs(scale - fold["scale"]) <= 1e-3 * max(1.0, abs(fold["scale"]))
        ok_bias = abs(bias - fold["folded_bias"]) <= 1e-3 * max(1.0, abs(fold["folded_bias"]))
        if ok_scale and ok_bias:
            done["fold"] = True
            st.success(t("tour.s3.right", scale=fold["scale"], bias=fold["folded_bias"]))
        elif scale or bias:
            st.warning(t("tour.s3.wrong", which=", ".join(
                w for w, ok in ((t("tour.s3.scale"), ok_scale), (t("tour.s3.bias"), ok_bias)) if not ok)))

    ran = _report_matches(detection) is not None
    step(4, ran, t("tour.s4.title"))
    st.markdown(t("tour.s4.body"))
    st.page_link("ui/pages/run.py", label=t("tour.s4.link"), icon=":material/timer:")

    job = tasks.get("profile")
    profiled = job is not None and job.done and job.result is not None
    step(5, profiled and "read" in done, t("tour.s5.title"))
    st.markdown(t("tour.s5.body"))
    if not profiled:
        st.markdown(t("tour.s5.where"))
    elif st.checkbox(t("tour.s5.check"), value="read" in done, key="tour_read"):
        done["read"] = True
    else:
        done.pop("read", None)


def _load_tour_model() -> None:
    """Callback of the tour's first button: choose the zoo model in the sidebar (drawn after this)."""
    st.session_state.model_kind = "Zoo"
    st.session_state.zoo_name = TOUR_MODEL


def _patterns(cur) -> None:
    detection = cur[3] if cur else None
    accepted = ui_state.accepted_ids(detection) if detection else set()
    st.markdown(t("learn.patterns.intro"))
    present = {c.pattern for c in detection.chains} if detection else set()
    table = ui_state.launch_table(cur[0], detection) if cur else None   # the device's launches, as on the Graph page
    for p in sorted(PATTERNS, key=lambda p: p.name not in present):  # the model's own patterns first
        chains = [c for c in detection.chains if c.pattern == p.name] if detection else []
        misses = [m for m in detection.near_misses if m.pattern == p.name] if detection else []
        label = pattern_text(p, "label")
        title = t("learn.pattern.title_model", label=label, n=len(chains), model=cur[1].name) if cur else label
        with st.expander(title, expanded=bool(chains)):
            st.markdown(f"<span style='display:inline-block;width:14px;height:14px;background:{p.color};"
                        f"border-radius:3px;vertical-align:middle'></span> "
                        + t("learn.pattern.matches", name=p.name, steps=_steps_text(p)), unsafe_allow_html=True)
            _before_after(diagrams.spec_for_pattern(p))
            st.markdown(pattern_text(p, "explanation"))
            st.markdown(t("learn.pattern.implementation", text=pattern_text(p, "implementation")))
            if p.formula:
                st.code(pattern_text(p, "formula"), language=None)
            for caveat in pattern_text(p, "caveats"):
                st.markdown(f"- {caveat}")
            if chains:
                st.markdown(f"**{t('learn.pattern.in_model')}**")
                st.dataframe([{t("teach.col.chain"): c.title, t("learn.col.id"): c.id,
                               t("learn.col.accepted"): c.id in accepted,
                               t("learn.col.saves"): t("learn.pattern.saves", launches=_saved(table, c),
                                                       bytes=human_bytes(c.bytes_saved))}
                              for c in chains], hide_index=True, width="stretch")
            elif cur:
                st.caption(t("learn.pattern.not_found"))
            if misses:
                st.markdown(f"**{t('learn.pattern.near_misses')}**")
                for m in misses[:8]:
                    st.markdown(f"- {code(', '.join(m.nodes[:4]))}: {plain(message(m.reason))}")


def _saved(table, chain) -> int:
    """The launches ``chain`` saves on the sidebar's device (``table``: ``ui_state.launch_table``)."""
    counted = table.of(chain.id) if table is not None else None
    return counted.saved if counted is not None else chain.launches_saved


def _steps_text(p) -> str:
    """``conv → batch_norm → relu/…``; siblings: ``linear ∥ linear ∥ …``."""
    if p.siblings:
        kinds = "/".join(sorted(p.steps[0].kinds))
        return t("learn.pattern.siblings_steps", kinds=kinds)
    return p.joiner.join(_kinds_text(s.kinds) + ("?" if s.optional else "") for s in p.steps)


def _kinds_text(kinds, limit: int = 40) -> str:
    """A step's op kinds joined by "/", cut after the last whole kind that fits in ``limit`` characters
    ("relu/relu6/…", never "relu6/si")."""
    shown: list[str] = []
    for kind in sorted(kinds):
        if shown and len("/".join([*shown, kind])) > limit:
            return "/".join(shown) + "/…"
        shown.append(kind)
    return "/".join(shown)


def _examples(cur) -> None:
    if cur is None:
        st.info(t("learn.need_model"))
        return
    spec, model, graph, detection = cur
    st.markdown(f"### {t('ex.fold.title')}")
    bn = teach_examples.bn_chains(detection)
    if not bn:
        st.caption(t("ex.fold.none", model=plain(model.name)))
    else:
        c1, c2 = st.columns([3, 1])
        chain_id = c1.selectbox(t("ex.fold.chain"), [c.id for c in bn], key="ex_fold_chain",
                                format_func=lambda cid: detection.chain(cid).title)
        channels = _fold(spec.source, spec.batch, spec.seq_len, chain_id, 0)["channels"]
        channel = int(c2.number_input(t("ex.fold.channel"), min_value=0, max_value=channels - 1, value=0, step=1,
                                      key="ex_fold_channel"))
        fold = _fold(spec.source, spec.batch, spec.seq_len, chain_id, channel)
        st.markdown(t("ex.fold.values", chain=plain(fold["title"]), channel=channel, channels=channels))
        st.dataframe([
            {t("ex.col.symbol"): "γ", t("ex.col.meaning"): t("ex.sym.gamma"), t("ex.col.value"): f"{fold['gamma']:.6g}"},
            {t("ex.col.symbol"): "β", t("ex.col.meaning"): t("ex.sym.beta"), t("ex.col.value"): f"{fold['beta']:.6g}"},
            {t("ex.col.symbol"): "μ", t("ex.col.meaning"): t("ex.sym.mean"), t("ex.col.value"): f"{fold['mean']:.6g}"},
            {t("ex.col.symbol"): "σ²", t("ex.col.meaning"): t("ex.sym.var"), t("ex.col.value"): f"{fold['var']:.6g}"},
            {t("ex.col.symbol"): "ε", t("ex.col.meaning"): t("ex.sym.eps"), t("ex.col.value"): f"{fold['eps']:.1e}"},
            {t("ex.col.symbol"): "b", t("ex.col.meaning"): t("ex.sym.bias"), t("ex.col.value"): f"{fold['conv_bias']:.6g}"},
            {t("ex.col.symbol"): "s = γ/√(σ²+ε)", t("ex.col.meaning"): t("ex.sym.scale"),
             t("ex.col.value"): f"{fold['scale']:.6g}"},
            {t("ex.col.symbol"): "b' = (b−μ)·s+β", t("ex.col.meaning"): t("ex.sym.folded_bias"),
             t("ex.col.value"): f"{fold['folded_bias']:.6g}"},
        ], hide_index=True, width="stretch")
        st.markdown(t("ex.fold.weights", before=", ".join(f"{w:.5f}" for w in fold["weights_before"]),
                      after=", ".join(f"{w:.5f}" for w in fold["weights_after"]), scale=fold["scale"]))
        verdict = t("ex.fold.agrees") if fold["agrees"] else t("ex.fold.disagrees")
        (st.success if fold["agrees"] else st.error)(t(
            "ex.fold.check", shape="×".join(map(str, fold["input_shape"])), diff=fold["max_abs_diff_f64"],
            top=fold["max_abs_output"], rel=fold["rel_diff_f64"], tol=fold["tolerance"], verdict=verdict))
        st.caption(t("ex.fold.f32", folded=fold["rel_diff_f32_folded"], unfused=fold["rel_diff_f32_unfused"]))

    st.markdown(f"### {t('ex.bytes.title')}")
    dtype = st.selectbox(t("ex.bytes.dtype"), DTYPES, key="ex_dtype",
                         index=DTYPES.index(st.session_state.get("dtype", "fp32")))
    found = _traffic_examples(spec.source, spec.batch, spec.seq_len, dtype)
    if not found:
        st.caption(t("ex.bytes.none"))
    for family, ex in found.items():
        st.markdown(f"#### {t('ex.bytes.family', family=family_title(family))} · {code(ex.title)}")
        rows = [{t("ex.col.version"): f"{o['kind']} ({o['origin']})", t("ex.col.reads"): human_bytes(o["reads"]),
                 t("ex.col.writes"): human_bytes(o["writes"])} for o in ex.ops]
        rows.append({t("ex.col.version"): t("ex.bytes.unfused_total", n=len(ex.ops)),
                     t("ex.col.reads"): human_bytes(ex.unfused_reads), t("ex.col.writes"): human_bytes(ex.unfused_writes)})
        rows.append({t("ex.col.version"): t("ex.bytes.fused_total"), t("ex.col.reads"): human_bytes(ex.fused_reads),
                     t("ex.col.writes"): human_bytes(ex.fused_writes)})
        st.dataframe(rows, hide_index=True, width="stretch")
        kept = [i for i in ex.intermediates if i["kept"]]
        if ex.siblings:
            st.markdown(t("ex.bytes.saved_siblings", saved=human_bytes(ex.bytes_saved), n=len(ex.ops) - 1))
        else:
            st.markdown(t("ex.bytes.saved", saved=human_bytes(ex.bytes_saved), n=len(ex.intermediates) - len(kept),
                          kept=len(kept)))
        _before_after(diagrams.spec_for_example(ex, BY_NAME[ex.pattern].color), _chain_launches(cur, ex.chain_id))


def _source_picker() -> tuple[str, dict | None]:
    """Where the tables come from: this session ("now") or a teaching report; returns (source, model entry)."""
    ss = st.session_state
    with st.expander(t("teach.report.open_title"), expanded=ss.get("teach_report") is None):
        committed = [p.name for p in _committed_reports()]
        if committed:
            c1, c2 = st.columns([3, 1])
            c1.selectbox(t("teach.report.committed"), committed, key="teach_committed")
            c2.button(t("teach.report.open"), key="teach_open_committed", on_click=_on_open_committed)
        else:
            st.caption(t("teach.report.none_committed"))
        st.file_uploader(t("teach.report.upload"), key="teach_report_file",
                         on_change=_on_teaching_upload)
    if ss.get("teach_report_error"):
        st.error(t("teach.report.error", error=plain(ss.teach_report_error)))
    opened = ss.get("teach_report")
    options = ["now"] + (["report"] if opened else [])
    if ss.get("teach_source") not in options:
        ss.teach_source = options[-1]
    source = st.radio(t("teach.source"), options, key="teach_source", horizontal=True,
                      format_func=lambda o, lang=current_language(): t_in(lang, "teach.source.now") if o == "now"
                      else t_in(lang, "teach.source.report", name=plain(opened[0])))
    if source == "report" and opened:
        name, rep = opened
        models = [m["name"] for m in rep["models"]]
        chosen = st.selectbox(t("teach.report.model"), models, key="teach_model")
        entry = teach_report.model_entry(rep, chosen)
        env = rep.get("environment") or {}
        st.caption(t("teach.report.caption", device=plain(env.get("device_name") or env.get("device")),
                     date=plain(rep["date_utc"][:10]), command=code(rep["command"]), torch=plain(env.get("torch"))))
        if env.get("is_cpu"):
            st.warning(t("teach.report.cpu"))
        return "report", entry
    return "now", None


def _where_time_goes(cur) -> None:
    source, entry = _source_picker()
    if source == "report":
        if entry is None or "error" in entry:
            st.error(t("teach.report.model_failed", error=plain(message((entry or {}).get("error", "")))))
            return
        panels.breakdown_panel(entry.get("breakdown") or {}, entry["name"])
        panels.traffic_panel(entry.get("traffic") or {}, entry["name"])
        panels.stages_panel(entry.get("stages") or [], t("teach.stages.from_report"))
        return
    if cur is None:
        st.info(t("learn.need_model"))
        return
    spec, model, graph, detection = cur
    ss = st.session_state
    device, dtype = ss.get("device", "cpu"), ss.get("dtype", "fp32")
    plan = ui_state.current_plan(detection)
    key = json.dumps([spec.source, spec.batch, spec.seq_len, device, dtype, plan.to_dict()], sort_keys=True)
    job = tasks.get("profile")
    busy = job is not None and job.running
    c1, c2, c3 = st.columns([3, 1, 2], vertical_alignment="bottom")
    timeout = _timeout_input(c3, "profile")
    c1.button(t("teach.bd.profile", device=device, dtype=dtype), key="teach_profile", disabled=busy,
              on_click=_start_profile, args=(spec, plan, device, dtype, key, timeout))
    c2.button(t("learn.task.cancel"), key="profile_cancel", disabled=not busy, on_click=tasks.cancel,
              args=("profile",))
    if busy:
        _poll("profile")
    elif job is not None and job.error:
        st.error(t("learn.task.failed", error=plain(message(job.error))))
    elif job is not None and job.cancelled and job.result is None:
        st.warning(t("learn.task.cancelled_empty"))
    elif job is not None and job.result is not None:
        if job.key != key:
            st.caption(t("teach.bd.stale"))
        panels.breakdown_panel(job.result["breakdowns"], model.name)
    else:
        st.caption(t("teach.bd.press"))
    panels.traffic_panel(traffic_table(graph, detection, plan.accepted, torch_dtype(dtype)), model.name)
    report = _report_matches(detection)
    if report is not None:
        panels.stages_panel(readers.report_stages(report), t("teach.stages.from_run"))
    else:
        panels.stages_panel([], "")


def _start_profile(spec, plan, device: str, dtype: str, key: str, timeout_s: float) -> None:
    """Callback: profile one forward of the loaded model, unfused and fused, in a child process (the ridge of the
    device's ceilings, which the page measured or knows, goes with it)."""
    tasks.start_child("profile", key, {"source": spec.source, "batch": spec.batch, "seq_len": spec.seq_len,
                                       "device": device, "dtype": dtype, "plan": plan.to_dict(),
                                       "ridge": _ceilings(device).ridge(dtype)}, timeout_s)


def _timeout_input(where, name: str) -> float:
    """The task's time limit (seconds), ``<name>_timeout``: past it the child is stopped and the page says so."""
    return float(where.number_input(t("learn.task.timeout"), min_value=1, max_value=24 * 3600,
                                    value=int(TIMEOUT_S[name]), step=60, key=f"{name}_timeout"))


def _predicted(cur) -> None:
    ss = st.session_state
    st.markdown(t("pred.intro"))
    entry = None
    if ss.get("teach_source") == "report" and ss.get("teach_report"):
        entry = teach_report.model_entry(ss.teach_report[1], ss.get("teach_model") or "")
    if entry is not None and "error" not in entry:
        ceilings = Ceilings.from_dict({"device_name": "?", **ss.teach_report[1]["ceilings"]})  # {}: none recorded
        dtype = entry["dtype"]
        rows = entry.get("comparison") or []
        predictions = entry.get("predictions") or []
        st.caption(t("pred.from_report", model=plain(entry["name"]), name=plain(ss.teach_report[0])))
    else:
        if cur is None:
            st.info(t("learn.need_model"))
            return
        spec, model, graph, detection = cur
        report = _report_matches(detection)
        device = ss.get("device", "cpu")
        dtype = readers.report_dtype(report) or ss.get("dtype", "fp32")
        ceilings = _ceilings(device)
        preds = teach_predict.predict_chains(graph, detection, ui_state.accepted_ids(detection), dtype, ceilings)
        predictions = [p.to_dict() for p in preds]
        rows = teach_predict.compare(preds, readers.measured_chains(report), ceilings, dtype) if report else []
        if report is None:
            st.caption(t("pred.need_run"))
    _ceilings_box(ceilings, dtype)
    if rows:
        st.plotly_chart(views.prediction_figure(rows), key="chart_prediction", width="stretch")
        st.dataframe([{t("teach.col.chain"): r["title"], t("pred.col.predicted"): _x(r["predicted"]),
                       t("pred.col.measured"): _x(r["measured"]), t("pred.col.graph"): _x(r.get("measured_graph")),
                       t("pred.col.bound"): t("pred.bound." + r["bound"]) if r.get("bound") else "-",
                       t("pred.col.why"): t(f"teach.why.{r['why']}.short") if r.get("why") else t("teach.why.close.short")}
                      for r in rows], hide_index=True, width="stretch")
        for why in sorted({r["why"] for r in rows if r.get("why")}):
            st.markdown(f"- **{t(f'teach.why.{why}.short')}**: {t(f'teach.why.{why}.long')}")
    elif predictions:
        st.dataframe([{t("teach.col.chain"): p["title"], t("pred.col.predicted"): _x(p["gain"]),
                       t("pred.col.intensity"): round(p["intensity_fused"], 2) if p.get("intensity_fused") else None,
                       t("pred.col.bound"): t("pred.bound." + p["bound"]) if p.get("bound") else "-"}
                      for p in predictions], hide_index=True, width="stretch")


def _x(value: float | None) -> str:
    return f"{value:.2f}×" if value else "-"


def _ceilings_box(c: Ceilings, dtype: str) -> None:
    with st.expander(t("pred.ceilings.title", device=plain(c.device_name)), expanded=True):
        peak, ridge = c.peak_flops(dtype), c.ridge(dtype)
        rows = [
            {t("pred.col.what"): t("pred.ceil.bandwidth"),
             t("pred.col.value"): f"{c.bandwidth / 1e9:,.0f} GB/s" if c.bandwidth else t("pred.unknown"),
             t("pred.col.source"): message(c.sources.get("bandwidth", c.sources.get("all", "")))},
            {t("pred.col.what"): t("pred.ceil.flops", dtype=dtype),
             t("pred.col.value"): f"{peak / 1e12:,.2f} TFLOP/s" if peak else t("pred.unknown"),
             t("pred.col.source"): message(c.sources.get(dtype, c.sources.get("all", "")))},
            {t("pred.col.what"): t("pred.ceil.ridge"),
             t("pred.col.value"): f"{ridge:.1f} FLOP/B" if ridge else t("pred.unknown"), t("pred.col.source"): ""},
            {t("pred.col.what"): t("pred.ceil.launch"),
             t("pred.col.value"): f"{c.launch_us:.1f} µs" if c.launch_us else t("pred.unknown"),
             t("pred.col.source"): message(c.sources.get("launch_us", ""))},
            {t("pred.col.what"): t("pred.ceil.l2"),
             t("pred.col.value"): human_bytes(c.l2_bytes) if c.l2_bytes else t("pred.unknown"),
             t("pred.col.source"): message(c.sources.get("l2_bytes", ""))},
        ]
        st.table(rows, hide_index=True)   # a static table: its sources wrap (a grid cut them at 1600 px)
        st.markdown(t("pred.model"))
        if c.sources.get("note"):
            st.caption(plain(message(c.sources["note"])))


def _task_panel(name: str, cur, intro: str, start_label: str, settings: Callable[..., tuple[tuple, bool]],
                start: Callable[..., None], show: Callable[[Any, Any], None]) -> None:
    """A tab that runs one background task (``tasks``: "sweep", "bisect") on the loaded model's accepted chains.

    ``intro``; with a model that has accepted chains, the task's own widgets, drawn by
    ``settings(spec, detection, ids)``, which returns the arguments of ``start`` (the Start button's
    callback, given the time limit last) and whether Start may be pressed; Start (``<name>_start``, labelled
    ``start_label``), Cancel (``<name>_cancel``) and the time limit (``<name>_timeout``); the task's progress
    while it runs; once it has ended, its one-line error, that a cancel left nothing, or ``show(job, detection)``."""
    st.markdown(intro)
    if cur is None:
        st.info(t("learn.need_model"))
        return
    spec, model, graph, detection = cur
    ids = [c.id for c in detection.chains if c.id in ui_state.accepted_ids(detection)]
    if not ids:
        st.caption(t("sweep.no_chains"))
        return
    args, ready = settings(spec, detection, ids)
    job = tasks.get(name)
    busy = job is not None and job.running
    c1, c2, c3 = st.columns([2, 1, 2], vertical_alignment="bottom")
    timeout = _timeout_input(c3, name)
    c1.button(start_label, key=f"{name}_start", type="primary", disabled=busy or not ready, on_click=start,
              args=(*args, timeout))
    c2.button(t("learn.task.cancel"), key=f"{name}_cancel", disabled=not busy, on_click=tasks.cancel, args=(name,))
    if busy:
        _poll(name)
        return
    if job is None:
        return
    if job.error:
        st.error(t("learn.task.failed", error=plain(message(job.error))))
        return
    if job.result is None:
        st.warning(t("learn.task.cancelled_empty"))
        return
    show(job, detection)


def _sweep(cur) -> None:
    """When a fusion stops paying: one chain swept over batch sizes and dtypes, in the background."""
    _task_panel("sweep", cur, t("sweep.intro"), t("sweep.start"), _sweep_settings, _start_sweep, _sweep_result)


def _sweep_settings(spec, detection, ids: list[str]) -> tuple[tuple, bool]:
    ss = st.session_state
    chain_id = st.selectbox(t("sweep.chain"), ids, key="sweep_chain", format_func=lambda c: detection.chain(c).title)
    low, high = st.select_slider(t("sweep.batches"), options=BATCHES, value=(1, 16), key="sweep_batches")
    dtypes = st.multiselect(t("sweep.dtypes"), DTYPES, default=[ss.get("dtype", "fp32")], key="sweep_dtypes")
    batches = [b for b in BATCHES if low <= b <= high]
    device = ss.get("device", "cpu")
    st.caption(t("sweep.what", n=len(batches) * len(dtypes), device=device))
    return (spec, chain_id, batches, list(dtypes), device), bool(dtypes)


def _sweep_result(job, detection) -> None:
    points = list(job.result.get("points") or [])
    chain_title = detection.chain(json.loads(job.key)[1]).title if json.loads(job.key)[1] in \
        {c.id for c in detection.chains} else json.loads(job.key)[1]
    if job.cancelled:
        st.warning(t("learn.task.cancelled"))
    good = [p for p in points if p.get("speedup")]
    if good:
        st.plotly_chart(views.sweep_figure(good, t("sweep.fig_title", chain=chain_title)), key="chart_sweep",
                        width="stretch")
        # each point decided by the paired test of its report, as a run decides; medians alone decide nothing
        losing = [p for p in good if p.get("verdict") == SLOWER]
        open_ = [p for p in good if p.get("undecided") or not p.get("verdict")]
        if losing:
            st.markdown(t("sweep.read_losing", n=len(losing), batches=", ".join(str(p["batch"]) for p in losing)))
        if open_:
            st.markdown(t("sweep.read_undecided", n=len(open_), batches=", ".join(str(p["batch"]) for p in open_)))
        if not losing and not open_:
            st.markdown(t("sweep.read_all_win"))
    lang = current_language()
    st.dataframe([{t("sweep.col.batch"): p["batch"], t("sweep.col.dtype"): p["dtype"],
                   t("sweep.col.unfused"): p["unfused_ms"], t("sweep.col.fused"): p["fused_ms"],
                   t("sweep.col.speedup"): _x(p["speedup"]),
                   t("sweep.col.verdict"): (t("sweep.undecided", n=p.get("rounds") or 0) if p.get("undecided")
                                            else charts.verdict_label(p["verdict"], lang) if p.get("verdict") else "-"),
                   t("sweep.col.bytes"): human_bytes(p["bytes_unfused"]) if p.get("bytes_unfused") else "-",
                   t("sweep.col.error"): message(p["error"]) if p.get("error") else ""} for p in points],
                 hide_index=True, width="stretch")
    st.caption(t("sweep.why"))
    folder = _sweep_folder_name(job.result.get("folder"))
    if folder is not None:
        st.caption(t("sweep.folder", folder=code(folder)))
        if st.button(t("sweep.open"), key="sweep_open", icon=":material/stacked_line_chart:"):
            st.session_state.sweeps_source = "folder"
            st.session_state.sweeps_folder = folder
            st.switch_page(SWEEPS_PAGE)


def _sweep_folder_name(folder: str | None) -> str | None:
    """The sweep's folder as the Sweeps page names it (relative to its root), or None when it is not there."""
    if not folder:
        return None
    root = os.path.realpath(_sweeps_root())
    real = os.path.realpath(folder)
    if not real.startswith(root.rstrip(os.sep) + os.sep) or not os.path.isdir(real):
        return None
    return os.path.relpath(real, root)


def _start_sweep(spec, chain_id: str, batches: list[int], dtypes: list[str], device: str, timeout_s: float) -> None:
    """The chain's sweep in a child process: a ``fusion-explorer sweep`` of that chain alone
    (``explorer.sweeps.chain``, its points measured by the sweep's workers), into a new folder under the Sweeps
    page's root (``learn/``), where the Sweeps page opens it."""
    key = json.dumps([spec.source, chain_id, batches, dtypes, device])
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
    name = "".join(ch if ch.isalnum() or ch in "-_" else "_" for ch in f"{Path(spec.source).stem}-{chain_id}")[:80]
    folder = _sweeps_root() / "learn" / f"{name}-{stamp}-{os.getpid()}"
    tasks.start_child("sweep", key, {"source": spec.source, "batch": spec.batch, "seq_len": spec.seq_len,
                                     "device": device, "chain_id": chain_id, "batches": list(batches),
                                     "dtypes": list(dtypes), "folder": str(folder)}, timeout_s)


def _bisect(cur) -> None:
    """The precision bisect: which accepted chain makes the fused model drift, in the background."""
    _task_panel("bisect", cur, t("bisect.intro"), t("bisect.start"), _bisect_settings, _start_bisect,
                _bisect_result)


def _bisect_settings(spec, detection, ids: list[str]) -> tuple[tuple, bool]:
    ss = st.session_state
    mode = st.radio(t("bisect.mode"), ("both", "one_at_a_time", "bisect"), key="bisect_mode", horizontal=True,
                    format_func=lambda m, lang=current_language(): t_in(lang, f"bisect.mode.{m}"))
    device, dtype = ss.get("device", "cpu"), ss.get("dtype", "fp32")
    st.caption(t("bisect.what", n=len(ids), device=device, dtype=dtype))
    return (spec, ids, device, dtype, mode, dict(ss.kernels.get(detection.fingerprint, {}))), True


def _bisect_result(job, detection) -> None:
    r = job.result["bisect"]
    if r["cancelled"]:
        st.warning(t("learn.task.cancelled"))
    st.markdown(t("bisect.errors", unfused=r["unfused_rel_l2"] or 0.0, fused=r["fused_rel_l2"] or 0.0,
                  dtype=r["dtype"], device=r["device"], n=r["fused_models"]))
    if r["drifts"] and r["culprit"]:
        st.error(t("bisect.culprit", chain=plain(detection.chain(r["culprit"]).title if r["culprit"] in
                   {c.id for c in detection.chains} else r["culprit"]), id=code(r["culprit"])))
    else:
        st.success(t("bisect.no_drift"))
    if r["ranked"]:
        st.plotly_chart(views.bisect_figure(r["ranked"]), key="chart_bisect", width="stretch")
        st.dataframe([{t("bisect.col.rank"): i + 1, t("teach.col.chain"): c["title"], t("learn.col.id"): c["id"],
                       t("bisect.col.error"): f"{c['rel_l2']:.3e}" if c["rel_l2"] is not None else "-",
                       t("bisect.col.contribution"): f"{c['contribution']:+.3e}" if c["contribution"] is not None else "-"}
                      for i, c in enumerate(r["ranked"])], hide_index=True, width="stretch")
    for s in r["steps"]:
        st.caption(t("bisect.step", a=len(s["a"]), b=len(s["b"]), ea=s["error_a"] or 0.0, eb=s["error_b"] or 0.0,
                     kept=t("bisect.first_half") if s["kept"] == "a" else t("bisect.second_half")))


def _start_bisect(spec, ids: list[str], device: str, dtype: str, mode: str, kernels: dict[str, str],
                  timeout_s: float) -> None:
    """Callback: the precision bisect of the accepted chains, in a child process."""
    tasks.start_child("bisect", json.dumps([spec.source, ids, device, dtype, mode]),
                      {"source": spec.source, "batch": spec.batch, "seq_len": spec.seq_len, "device": device,
                       "dtype": dtype, "ids": list(ids), "mode": mode, "kernels": dict(kernels)}, timeout_s)


# ====================================================================== the page

def page() -> None:
    cur = ui_state.current()
    _intro()
    tabs = st.tabs([t("learn.tab.tour"), t("learn.tab.patterns"), t("learn.tab.examples"), t("learn.tab.time"),
                    t("learn.tab.predicted"), t("learn.tab.sweep"), t("learn.tab.bisect")])
    sections = (_tour, _patterns, _examples, _where_time_goes, _predicted, _sweep, _bisect)
    for tab, section in zip(tabs, sections):
        with tab:
            try:
                section(cur)
            except ExplorerError as exc:
                st.error(plain(message(str(exc))))
            except Exception as exc:  # one tab failing leaves the others usable
                text = str(exc).strip().splitlines()
                st.error(t("learn.tab_failed", error=plain(f"{type(exc).__name__}: {text[0][:300] if text else ''}")))


ui_state.guarded(page)
