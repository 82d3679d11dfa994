"""The app's session state, caches and background run, in one place.

The pages (``explorer/pages/*.py``) and ``app.py`` read and change state only
through this module. Everything heavy is done by the engine
(``fusion_engine.analyze``, ``plan.make_plan``, ``gpu_runner.run``); this
module only remembers the user's choices and wires results to the views.

State (``st.session_state``), initialised by ``init_state``:
    active          LoadSpec of the model on screen (None before the first load)
    failed_spec     the LoadSpec that failed last, with ``load_error`` (its one-line message)
    accepted        {graph fingerprint: set of accepted chain ids} -- choices survive reloads
    kernels         {graph fingerprint: {chain id: kernel choice}} -- only choices other than "auto"
    editor_version  bumps to reset the chains table after a bulk change
    plan_error / plan_notice   plan upload feedback
    run_job         the RunJob in flight (None when idle)
    last_report     (run key, Report) of the latest finished run, or of an opened report file
    last_report_wait_s  seconds from the Run click to that report on screen (None: not waited for here)
    results_teaching (file name, validated teaching report dict) opened on the Results page, or None
    report_error / report_notice   feedback of the report uploader (Results page): the error in English
                    (translated where it is shown), the notice as ("run" or "teaching", file name)
    run_error       one-line message of the latest failed run (English, as the runner wrote it)
    run_cancelled   the latest run was cancelled by the user (not a failure)
    upload_paths    ``ui_files.UploadFolders``: {uploaded file ids: path on disk}; the folders of
                    uploads other than the active model's are removed when the model changes,
                    and all of them when the session's state is released

State holds no text in a language: errors and the run's status are kept in
English as the engine and the runner wrote them, and every text this module
shows goes through ``explorer.ui.i18n`` (``t`` for its own, ``message`` for an
English message) in the language of the moment, so that switching the language
changes them too.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import threading
import time
from typing import Any, Callable

import streamlit as st
from streamlit.runtime.scriptrunner import add_script_run_ctx

from explorer.ui import files as ui_files
from explorer.ui.i18n import message, t
from explorer.errors import ExplorerError, PlanError, ReportError
from explorer.fusions.plan import Plan, choose_alternative, make_plan, plan_for_chains
from explorer.report import Report
from explorer.runtime.progress import CostMemory, Countdown

DEFAULTS: dict[str, Any] = {
    "active": None,
    "failed_spec": None,
    "load_error": None,
    "accepted": {},
    "kernels": {},
    "editor_version": 0,
    "plan_error": None,
    "plan_notice": None,
    "run_job": None,
    "last_report": None,
    "last_report_cached": False,
    "last_report_wait_s": None,  # the click to the report on screen, in seconds (the Run page says both times)
    "results_teaching": None,    # (file name, validated teaching report) opened on the Results page
    "report_error": None,
    "report_notice": None,
    "run_error": None,
    "run_cancelled": False,
    "export_error": None,
    # Learn page (explorer/ui/pages/learn.py): background tasks, an opened teaching report, the tour
    "tasks": {},                 # {name: explorer.ui.tasks.TaskJob} (sweep, bisect, profile)
    "teach_report": None,        # (file name, validated teaching report dict)
    "teach_report_error": None,
    "tour_done": {},             # {step: True} ticked by the student
}

# Widgets on pages that are not always drawn: their values are kept across page switches.
PERSISTENT_WIDGETS: dict[str, Any] = {
    "graph_depth": 0,
    "graph_expand": [],
    "graph_search": "",
    "graph_chain": "(whole graph)",
    "graph_hops": 2,
    "graph_mode": "original",
    "graph_overlay": "none",
    "graph_compile_mode": "default",
    "graph_direction": "TB",
    "graph_match": None,
    "run_per_chain": True,
    "run_stages": True,
    "run_compile_baseline": False,
    "run_quick": False,
    "run_cpu_threads": 0,        # 0: the runner's default (one thread on the CPU, quick or not)
    "fusions_filter": [],
    "lang": "en",                # the sidebar's language switch (explorer.ui.i18n)
    "teach_source": "now",
    "bisect_mode": "both",
}


@dataclasses.dataclass(frozen=True)
class LoadSpec:
    """What to load: a zoo name or a path, at a batch size and sequence length."""

    source: str
    batch: int
    seq_len: int | None
    label: str
    kind: str  # zoo | onnx | pt2 | hf


def init_state() -> None:
    """Set every state key once per session and keep page widgets' values across pages."""
    for key, value in DEFAULTS.items():
        if key not in st.session_state:
            st.session_state[key] = value.copy() if isinstance(value, (dict, list)) else value
    if "upload_paths" not in st.session_state:
        st.session_state.upload_paths = ui_files.UploadFolders()
    for key, value in PERSISTENT_WIDGETS.items():
        st.session_state[key] = st.session_state.get(key, value)


def guarded(fn: Callable[[], None]) -> None:
    """Run a page body; an error becomes one ``st.error`` line, never a traceback."""
    try:
        fn()
    except ExplorerError as exc:
        st.error(ui_files.escape_markdown(message(str(exc))))  # it may quote a file: shown as written
    except Exception as exc:  # the page boundary: the user gets one line, the app keeps going
        text = str(exc).strip().splitlines()
        st.error(t("state.unexpected", type=type(exc).__name__,
                   error=ui_files.escape_markdown(text[0][:300] if text else "")))


# ------------------------------------------------------------------ models

@st.cache_resource(max_entries=4, show_spinner=False)
def load_analysis(source: str, batch: int, seq_len: int | None):
    """(LoadedModel, graph, Detection) for a source; cached per source+batch+seq_len."""
    from explorer.fusion_engine import analyze

    return analyze(source, batch=batch, seq_len=seq_len)


def load_progress_text(what: str, seconds: float, measured: bool, elapsed: float) -> tuple[float, str]:
    """(the bar's fraction, its line) of a load ``elapsed`` seconds after the click that an estimate of
    ``seconds`` (``load_estimate``: ``measured`` on this machine, or a first guess) priced: the time left
    counted down, then "taking longer than the N s estimated" once it has run out; the elapsed time beside it."""
    left = seconds - elapsed
    if left > 0:
        line = (t("state.load_left", left=left, elapsed=elapsed) if measured
                else t("state.load_left_guess", left=left, elapsed=elapsed))
    else:
        line = t("state.load_overdue", s=seconds, elapsed=elapsed)
    fraction = min(elapsed / (elapsed + max(left, 0.0)), 0.99) if elapsed + max(left, 0.0) > 0 else 0.0
    return fraction, f"{what} {line}"


#: How often the load's line is redrawn while the model loads (seconds).
LOAD_REDRAW_S = 0.5


def _load_with_progress(spec: LoadSpec, clicked: float):
    """``load_analysis(spec)`` in a worker thread (with this run's context, so that its cache is the app's)
    while this script thread redraws the time left and the time since ``clicked`` every ``LOAD_REDRAW_S``
    (a spinner's text cannot change during a blocking call)."""
    seconds, measured = load_estimate(spec)
    what = t(f"state.loading.{spec.kind}", label=ui_files.escape_markdown(spec.label))
    box = st.empty()
    result: dict[str, Any] = {}

    def work() -> None:
        try:
            result["value"] = load_analysis(spec.source, spec.batch, spec.seq_len)
        except BaseException as exc:   # raised again in the script thread below
            result["error"] = exc

    worker = add_script_run_ctx(threading.Thread(target=work, name="fusion-explorer-load", daemon=True))
    worker.start()
    worker.join(0.2)   # a model in the cache answers at once: no bar flashes
    while worker.is_alive():
        fraction, line = load_progress_text(what, seconds, measured, time.time() - clicked)
        box.progress(fraction, text=line)
        worker.join(LOAD_REDRAW_S)
    box.empty()
    if "error" in result:
        raise result["error"]
    return result["value"]


def request_load(spec: LoadSpec, clicked: float | None = None) -> None:
    """Make ``spec`` the active model; on failure keep the previous one and remember the error. ``clicked``:
    when the user asked for it (the script run's start), the load's elapsed time counts from it."""
    ss = st.session_state
    if spec == ss.active:
        return
    if spec == ss.failed_spec:
        return  # its error is still shown; do not retry on every rerun
    try:
        started = time.monotonic()
        model, graph, detection = _load_with_progress(spec, time.time() if clicked is None else clicked)
        took = time.monotonic() - started
        if took > 0.5:   # not answered from the cache: a real load, the next estimate's measure
            _remember_load(spec, took)
    except ExplorerError as exc:
        ss.failed_spec, ss.load_error = spec, str(exc)
        return
    except Exception as exc:
        text = str(exc).strip().splitlines()
        ss.failed_spec = spec
        ss.load_error = f"could not load {spec.label}: {type(exc).__name__}: {text[0][:300] if text else ''}"
        return
    ss.active, ss.failed_spec, ss.load_error = spec, None, None
    keep_uploads({spec.source})
    if detection.fingerprint not in ss.accepted:
        ss.accepted[detection.fingerprint] = {c.id for c in detection.chains}


#: Seconds per MB of file a load takes before one of its kind was measured (a first guess), and the least it takes.
LOAD_GUESS_S_PER_MB = {"onnx": 1.0, "pt2": 0.6, "hf": 0.4}
LOAD_MIN_S = {"zoo": 4.0, "onnx": 4.0, "pt2": 4.0, "hf": 6.0}


def _source_mb(spec: LoadSpec) -> float:
    """The size of a file source in MB (a folder: its files), 0 for a zoo model."""
    if spec.kind == "zoo":
        return 0.0
    try:
        from pathlib import Path

        path = Path(spec.source)
        files = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()][:1000]
        return sum(p.stat().st_size for p in files) / 1e6
    except OSError:
        return 0.0


def load_estimate(spec: LoadSpec) -> tuple[float, bool]:
    """(seconds a load of ``spec`` should take, whether that was measured on this machine): a zoo model's last
    load, or a file's size times the seconds per MB that loads of its kind took (``CostMemory``)."""
    memory = CostMemory()
    if spec.kind == "zoo":
        last = memory.get(f"load:{spec.source}|{spec.batch}|{spec.seq_len}")
        return (last, True) if last is not None else (LOAD_MIN_S["zoo"], False)
    rate = memory.get(f"load_s_per_mb:{spec.kind}")
    mb = _source_mb(spec)
    guess = rate if rate is not None else LOAD_GUESS_S_PER_MB.get(spec.kind, 1.0)
    return max(LOAD_MIN_S.get(spec.kind, 4.0), guess * mb), rate is not None


def _remember_load(spec: LoadSpec, seconds: float) -> None:
    memory = CostMemory()
    memory.record(f"load:{spec.source}|{spec.batch}|{spec.seq_len}", seconds)
    mb = _source_mb(spec)
    if spec.kind != "zoo" and mb >= 1.0:
        memory.record(f"load_s_per_mb:{spec.kind}", seconds / mb, average=True)


def keep_uploads(keep: set[str]) -> None:
    """Remove the upload folders of every upload but the active model's and those in ``keep``."""
    ss = st.session_state
    active = ss.get("active")
    ss.upload_paths.keep_only(set(keep) | ({active.source} if active is not None else set()))


def current():
    """(spec, model, graph, detection) of the active model, or None."""
    spec = st.session_state.get("active")
    if spec is None:
        return None
    model, graph, detection = load_analysis(spec.source, spec.batch, spec.seq_len)
    return spec, model, graph, detection


def current_or_prompt():
    """Like ``current``, but tells the user to choose a model when there is none."""
    cur = current()
    if cur is None:
        st.info(t("state.choose_model"))
    return cur


def needs_model(body: Callable[..., None]) -> Callable[[], None]:
    """Decorator: the page of a body that needs the active model. The page tells the user to choose a
    model when there is none (``current_or_prompt``), else calls ``body(spec, model, graph, detection)``;
    it is run through ``guarded`` like any page, which also catches a failed load."""

    @functools.wraps(body)
    def page() -> None:
        cur = current_or_prompt()
        if cur is not None:
            body(*cur)

    return page


# ------------------------------------------------------------------ choices and plans

def accepted_ids(detection) -> set[str]:
    ss = st.session_state
    if detection.fingerprint not in ss.accepted:
        ss.accepted[detection.fingerprint] = {c.id for c in detection.chains}
    return ss.accepted[detection.fingerprint]


def set_accepted(detection, ids, reset_table: bool = True) -> None:
    """Accept exactly ``ids`` (detected or alternative chains). A chain just accepted wins over an accepted
    one it shares nodes with (a chain and its alternative are never both accepted). ``reset_table``: draw the
    chains table anew (not from the table's own edit callback, which keeps its key)."""
    known = detection.known_chains()
    before = st.session_state.accepted.get(detection.fingerprint, set())
    ids = set(ids) & set(known)
    for new in [i for i in ids if i not in before]:
        nodes = set(known[new].nodes)
        ids = {i for i in ids if i == new or not nodes & set(known[i].nodes)}
    st.session_state.accepted[detection.fingerprint] = ids
    if reset_table:
        st.session_state.editor_version += 1


def use_alternative(detection, alternative_id: str) -> None:
    """Accept one alternative in place of the chain it replaces (``plan.choose_alternative``)."""
    plan = choose_alternative(current_plan(detection), detection, alternative_id)
    st.session_state.accepted[detection.fingerprint] = set(plan.accepted)
    st.session_state.editor_version += 1


def kernel_for(detection, chain_id: str) -> str:
    """The user's kernel choice for one chain ("auto" unless chosen)."""
    return st.session_state.kernels.get(detection.fingerprint, {}).get(chain_id, "auto")


def set_kernel(detection, chain_id: str, choice: str) -> None:
    chosen = dict(st.session_state.kernels.get(detection.fingerprint, {}))
    if choice == "auto":
        chosen.pop(chain_id, None)
    else:
        chosen[chain_id] = choice
    st.session_state.kernels[detection.fingerprint] = chosen


def set_kernels(detection, choices: dict[str, str]) -> None:
    """Set several chains' kernel choices at once (bulk, or the table's kernel column) and reset
    the chains table so it shows them."""
    for chain_id, choice in choices.items():
        set_kernel(detection, chain_id, choice)
    st.session_state.editor_version += 1


def current_plan(detection) -> Plan:
    """The plan of the user's choices (``plan.plan_for_chains``) with the sidebar's global levers."""
    acc = accepted_ids(detection)
    return plan_for_chains(detection, acc, memory_format=st.session_state.get("memory_format", "nchw"),
                           cuda_graphs=bool(st.session_state.get("cuda_graphs", False)),
                           kernels=st.session_state.kernels.get(detection.fingerprint, {}))


@st.cache_data(max_entries=32, show_spinner=False)
def _launch_table(source: str, batch, seq_len, fingerprint: str, kernels_json: str, memory_format: str,
                  device: str):
    """Every chain's launches on ``device`` for these kernel choices (``fusion_engine.chain_launch_table``)."""
    import json

    from explorer.fusion_engine import chain_launch_table

    analysis = load_analysis(source, batch, seq_len)
    plan = make_plan(analysis.detection, "all", memory_format=memory_format, kernels=json.loads(kernels_json))
    return chain_launch_table(analysis, plan, device)


def launches(spec: LoadSpec, detection, device: str | None = None):
    """The current plan's kernel launches on the sidebar's device (``explorer.launches.LaunchCounts``: before,
    after, each accepted chain's), the one count the Graph and Fusions pages show; ``.of(id)`` any chain's
    as if accepted comes from ``launch_table``."""
    from explorer import launches as launch_counts

    table = launch_table(spec, detection, device)
    return launch_counts.count(table.before, {c.chain_id: c for c in table.chains}, sorted(accepted_ids(detection)),
                               table.device)


def launches_for(spec: LoadSpec, detection, plan, device: str):
    """The launches of ``plan`` (a ``Plan`` or a report's ``PlanInfo``) on ``device``, counted as ``launches``."""
    import json

    from explorer import launches as launch_counts

    table = _launch_table(spec.source, spec.batch, spec.seq_len, detection.fingerprint,
                          json.dumps(dict(sorted(plan.kernels.items()))), plan.memory_format,
                          "cuda" if str(device).startswith("cuda") else "cpu")
    accepted = [c for c in plan.accepted if table.of(c) is not None]
    return launch_counts.count(table.before, {c.chain_id: c for c in table.chains}, accepted, table.device)


def launch_table(spec: LoadSpec, detection, device: str | None = None):
    """Every chain's launches on the sidebar's device as if accepted, with the plan's kernel choices."""
    import json

    plan = current_plan(detection)
    return _launch_table(spec.source, spec.batch, spec.seq_len, detection.fingerprint,
                         json.dumps(dict(sorted(plan.kernels.items()))), plan.memory_format,
                         device or st.session_state.get("device", "cpu"))


def apply_plan_text(text: bytes | str, detection) -> Plan:
    """Restore choices (accepted chains, kernel choices) from plan JSON; raises PlanError (state
    untouched) if it does not fit."""
    plan = Plan.from_json(text)
    plan.check_for(detection)
    set_accepted(detection, plan.accepted)
    st.session_state.kernels[detection.fingerprint] = dict(plan.kernels)
    return plan


def on_plan_upload() -> None:
    """Callback of the plan uploader: restore the choices, or say why not."""
    ss = st.session_state
    uploaded = ss.get("plan_file")
    ss.plan_error = ss.plan_notice = None
    if uploaded is None:
        return
    cur = current()
    if cur is None:
        ss.plan_error = "load a model before uploading a plan"
        return
    try:
        data = uploaded.getvalue()
        if len(data) > 5 * 2**20:
            raise PlanError(f"{uploaded.name}: a plan file over 5 MB is not a plan")
        plan = apply_plan_text(data, cur[3])
    except ExplorerError as exc:
        ss.plan_error = str(exc)  # the Fusions page shows it escaped (text from a file, not markdown)
        return
    ss.memory_format = plan.memory_format
    ss.cuda_graphs = plan.cuda_graphs
    ss.plan_notice = (f"restored {len(plan.accepted)} accepted chain(s) and {len(plan.kernels)} kernel "
                      f"choice(s) from {ui_files.escape_markdown(uploaded.name)} "  # the page shows it as markdown
                      f"(memory format {plan.memory_format}, CUDA graphs {'on' if plan.cuda_graphs else 'off'})")


def _is_teaching_report(data: bytes) -> bool:
    """Whether JSON bytes say they are a teaching report (``explorer.teaching.report``); bytes that do not
    parse are not (the run report's loader then says why)."""
    from explorer.jsonfile import parse_json
    from explorer.teaching import report as teach_report

    try:
        parsed = parse_json(data, "report", ReportError, max_bytes=ui_files.MAX_REPORT_MB * 2**20, allow_nan=True)
    except ReportError:
        return False
    return teach_report.is_teaching_report(parsed)


def open_report(name: str, data: bytes, ident: str) -> None:
    """Open a saved report on the Results page: a teaching report (validated by
    ``explorer.teaching.report.load``) goes to ``results_teaching``, a run report (``ui_files.load_report``)
    to ``last_report``; a file that is neither leaves both as they were and sets ``report_error``."""
    from explorer.teaching import report as teach_report

    ss = st.session_state
    ss.report_error = ss.report_notice = None
    try:
        if _is_teaching_report(data):
            ss.results_teaching = (name, teach_report.load(data, name))
            ss.report_notice = ("teaching", name)
            return
        report = ui_files.load_report(name, data)
    except ExplorerError as exc:
        ss.report_error = str(exc)  # English; the page translates it and shows it as text, not markdown
        return
    ss.last_report, ss.last_report_cached = (ident, report), False
    ss.last_report_wait_s = None
    ss.results_teaching = None
    ss.report_notice = ("run", name)


def on_report_upload() -> None:
    """Callback of the Results page's uploader: show a saved report, or say why not."""
    uploaded = st.session_state.get("report_file")
    if uploaded is None:
        st.session_state.report_error = st.session_state.report_notice = None
        return
    open_report(uploaded.name, uploaded.getvalue(), f"file:{uploaded.name}:{uploaded.file_id}")


def on_open_committed(folder: Any) -> None:
    """Callback of the Results page's "Open" button: the committed report chosen (``results_committed``)
    in ``folder`` (``benchmarks/results``)."""
    name = st.session_state.get("results_committed")
    if not name:
        return
    try:
        data = (folder / name).read_bytes()
    except OSError as exc:
        st.session_state.report_notice = None
        st.session_state.report_error = f"cannot read {name}: {exc.strerror or exc}"
        return
    open_report(name, data, f"committed:{name}")


# ------------------------------------------------------------------ runs

@dataclasses.dataclass
class RunJob:
    """One measurement in a background thread; the page polls it."""

    key: str
    cancel: threading.Event
    fraction: float = 0.0
    message: str = "starting…"
    report: Report | None = None
    error: str | None = None
    cancelled: bool = False
    done: bool = False
    started: float = dataclasses.field(default_factory=time.time)   # the click: the elapsed time counts from it
    thread: threading.Thread | None = None
    countdown: Countdown | None = None

    def __post_init__(self) -> None:
        self.countdown = Countdown(self.started, self.message)

    def progress(self, fraction: float, message: str) -> None:
        self.message = str(message)
        self.countdown.update(fraction, self.message)
        self.fraction = self.countdown.view()[0]


@st.cache_resource(show_spinner=False)
def report_store() -> dict[str, Report]:
    """Finished reports by run key (model, plan JSON, settings), shared by every session."""
    return {}


@st.cache_resource(show_spinner=False)
def wait_store() -> dict[str, float]:
    """Seconds from the Run click to each stored report on screen, by run key (beside ``report_store``)."""
    return {}


def run_key(spec: LoadSpec, plan: Plan, settings: Any) -> str:
    settings_dict = dataclasses.asdict(settings) if dataclasses.is_dataclass(settings) else dict(settings)
    return json.dumps({"source": spec.source, "batch": spec.batch, "seq_len": spec.seq_len,
                       "plan": plan.to_dict(), "settings": settings_dict}, sort_keys=True)


def _run_in_thread(job: RunJob, source: str, plan: Plan, settings: Any) -> None:
    try:
        from explorer import gpu_runner

        report = gpu_runner.run(source, plan, settings, progress=job.progress, cancel=job.cancel)
        if job.cancel.is_set():
            job.cancelled = True
        else:
            job.report = report
    except ExplorerError as exc:
        if job.cancel.is_set():
            job.cancelled = True  # the user's cancel, not a failure
        else:
            job.error = str(exc)
    except ImportError as exc:
        job.error = f"the measurement runner is not available: {exc}"
    except Exception as exc:
        text = str(exc).strip().splitlines()
        job.error = f"run failed ({type(exc).__name__}): {text[0][:300] if text else ''}"
    finally:
        job.done = True


def start_run(spec: LoadSpec, plan: Plan, settings: Any) -> None:
    """Start a run (or reuse the cached report of the same model+plan+settings)."""
    ss = st.session_state
    key = run_key(spec, plan, settings)
    store = report_store()
    ss.run_error = None
    if key in store:
        ss.last_report, ss.last_report_cached = (key, store[key]), True
        ss.last_report_wait_s = wait_store().get(key)
        return
    if ss.run_job is not None and not ss.run_job.done:
        return
    job = RunJob(key=key, cancel=threading.Event())
    job.thread = threading.Thread(target=_run_in_thread, args=(job, spec.source, plan, settings),
                                  name="fusion-explorer-run", daemon=True)
    ss.run_job = job
    job.thread.start()


def cancel_run() -> None:
    job = st.session_state.get("run_job")
    if job is not None and not job.done:
        job.cancel.set()
        job.message = "cancelling…"
        job.countdown.update(job.countdown.reported, job.message)


def finish_run() -> None:
    """Collect a finished job: its report goes to the store and on screen, its error to ``run_error``."""
    ss = st.session_state
    job = ss.get("run_job")
    if job is None or not job.done:
        return
    ss.run_cancelled = job.cancelled
    if job.report is not None:
        report_store()[job.key] = job.report
        ss.last_report, ss.last_report_cached = (job.key, job.report), False
        ss.last_report_wait_s = wait_store()[job.key] = time.time() - job.started   # the click to this screen
        ss.run_error = None
    elif job.cancelled:
        ss.run_error = None
    else:
        ss.run_error = job.error or "run failed"
    ss.run_job = None


@st.fragment(run_every=1.0)
def live_progress(where: str = "page") -> None:
    """The run in flight, redrawn every second on its own: progress bar, status with the estimated time
    left, elapsed time; when it ends, the whole app reruns to show the report (or the cancel)."""
    job = st.session_state.get("run_job")
    if job is None:
        return
    # the time left counted down between the runner's statuses, the bar a fraction of the time since the click
    fraction, _status, _left, elapsed = job.countdown.view()
    text = t("state.progress", status=message(job.countdown.line()), elapsed=elapsed)
    if where == "sidebar":
        st.caption(t("state.in_progress", fraction=fraction))
    st.progress(fraction, text=text)
    if job.done:
        st.rerun(scope="app")
