"""Fusion Explorer, the Streamlit app: declares the pages and wires the sidebar.

Run it with ``fusion-explorer app`` or ``streamlit run explorer/app.py``.

The sidebar chooses the model (zoo, ONNX upload, ``.pt2`` upload or a local
Hugging Face folder) and the measurement settings; the pages in
``explorer/ui_page_*.py`` show the graph, the chains to accept or reject, the run,
its results, the patterns explained, and the downloads. State lives in
``explorer.ui_state``; all analysis is the engine's.

Every text is in the language the sidebar's switch chooses (``explorer.ui.i18n``:
``app.*`` keys, ``explorer/ui/locale/app.py``); a widget's values stay as they are
(``model_kind`` is "Zoo", "ONNX upload", ...) and its ``format_func`` shows them
translated, taking the language as a default argument (AppTest calls it outside
the session). Errors are kept in English in the session and translated when shown.

Widget keys (the tests drive these): lang, model_kind, zoo_name, onnx_file,
onnx_data_file, pt2_file, hf_path, batch, seq_len, dtype, device,
memory_format, cuda_graphs; page keys are listed in each page's docstring.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

if __package__ in (None, ""):  # `streamlit run explorer/app.py` runs this file as a script
    root = str(Path(__file__).resolve().parent.parent)
    if root not in sys.path:
        sys.path.insert(0, root)

import streamlit as st

from explorer.sources import zoo
from explorer.ui import fonts
from explorer.ui import files as ui_files
from explorer.ui import i18n
from explorer.ui.i18n import message, t, t_in, translate_text
from explorer.ui import links
from explorer.ui import state as ui_state
from explorer.errors import ExplorerError
from explorer.fusions.plan import MEMORY_FORMATS
from explorer.vocab import DTYPE_NAMES

HERE = Path(__file__).resolve().parent
MODEL_KINDS = ("Zoo", "ONNX upload", ".pt2 upload", "Hugging Face folder")
#: The catalog key of each model kind's name (the widget's values stay the English ones).
KIND_KEYS = dict(zip(MODEL_KINDS, ("app.kind.zoo", "app.kind.onnx", "app.kind.pt2", "app.kind.hf")))
DTYPES = DTYPE_NAMES


def _cuda_available() -> bool:
    import torch

    return bool(torch.cuda.is_available())


def _upload_path(files: list, kind: str) -> str:
    """Path on disk of the uploaded file(s), written once per upload; the model file's name and first
    bytes are checked first (``ui_files.check_upload``: a renamed file is one line, not Streamlit's
    exception, which its own extension check would raise)."""
    ss = st.session_state
    ident = tuple(getattr(f, "file_id", f.name) for f in files)
    if ident not in ss.upload_paths:
        first, rest = files[0], files[1:]
        for f in files:
            ui_files.check_size(f.name, f.size)
        ui_files.check_upload(first.name, first.getvalue(), kind)
        ui_state.keep_uploads(set())  # a new upload: earlier ones, but the active model's, are removed
        ss.upload_paths[ident] = ui_files.store_upload(
            first.name, first.getvalue(), tuple((f.name, f.getvalue()) for f in rest))
    return ss.upload_paths[ident]


def _seq_len_widget(default: int | None, maximum: int | None) -> int | None:
    if default is None:
        return None
    if "seq_len" not in st.session_state:
        st.session_state.seq_len = int(default)
    return int(st.sidebar.number_input(t("app.seq_len"), min_value=1, max_value=int(maximum or 4096),
                                       step=1, key="seq_len", help=t("app.seq_len_help")))


def sidebar_model() -> ui_state.LoadSpec | None:
    """Draw the model chooser and return what the user asks for (None: nothing new)."""
    sb = st.sidebar
    lang = i18n.current()
    sb.header(t("app.model"))
    kind = sb.radio(t("app.source"), MODEL_KINDS, key="model_kind", horizontal=True,
                    format_func=lambda k, lang=lang: t_in(lang, KIND_KEYS[k]))
    batch = int(sb.number_input(t("app.batch"), min_value=1, max_value=1024, step=1, key="batch"))
    active = st.session_state.active
    if kind == "Zoo":
        entries = {e.name: e for e in zoo.menu()}
        name = sb.selectbox(t("app.zoo_model"), list(entries), key="zoo_name",
                            format_func=lambda n, lang=lang: f"{n} — {_family(entries[n].family, lang)}",
                            help=t("app.zoo_help"))
        entry = entries[name]
        sb.caption(translate_text(entry.description))
        seq = _seq_len_widget(entry.inputs.seq_len, entry.max_seq_len)
        return ui_state.LoadSpec(name, batch, seq, name, "zoo")
    limit = t("app.limit", mb=ui_files.MAX_UPLOAD_MB)
    if kind == "ONNX upload":
        model_file = sb.file_uploader(t("app.onnx_file", limit=limit), key="onnx_file")
        data_file = sb.file_uploader(t("app.onnx_data"), key="onnx_data_file")
        if model_file is None:
            sb.info(t("app.onnx_prompt"))
            return None
        files = [model_file] + ([data_file] if data_file is not None else [])
        path = _upload_path(files, "onnx")
        seq = _seq_len_widget(active.seq_len if active and active.source == path else None, None)
        return ui_state.LoadSpec(path, batch, seq, model_file.name, "onnx")
    if kind == ".pt2 upload":
        pt2 = sb.file_uploader(t("app.pt2_file", limit=limit), key="pt2_file")
        if pt2 is None:
            sb.info(t("app.pt2_prompt"))
            return None
        path = _upload_path([pt2], "pt2")
        return ui_state.LoadSpec(path, batch, None, pt2.name, "pt2")
    folder = sb.text_input(t("app.hf_folder"), key="hf_path", placeholder=t("app.hf_placeholder")).strip()
    if not folder:
        return None
    seq = _seq_len_widget(active.seq_len if active and active.source == folder else None, None)
    return ui_state.LoadSpec(folder, batch, seq, Path(folder).name or folder, "hf")


def _family(family: str, lang: str) -> str:
    """A zoo family's name in ``lang`` (a family the catalog does not know is shown as written)."""
    key = f"app.family.{family}"
    return t_in(lang, key) if key in i18n.catalog() else family


def sidebar_settings(cuda: bool) -> None:
    sb = st.sidebar
    sb.header(t("app.settings"))
    sb.selectbox(t("app.dtype"), DTYPES, key="dtype")
    devices = ("cuda", "cpu") if cuda else ("cpu",)
    if st.session_state.get("device") not in devices:
        st.session_state.device = devices[0]
    sb.selectbox(t("app.device"), devices, key="device", help=None if cuda else t("app.device_help"))
    sb.selectbox(t("app.memory_format"), MEMORY_FORMATS, key="memory_format", help=t("app.memory_format_help"))
    sb.checkbox(t("app.cuda_graphs"), key="cuda_graphs", disabled=not cuda, help=t("app.cuda_graphs_help"))


def init_widget_defaults() -> None:
    defaults = {"model_kind": MODEL_KINDS[0], "zoo_name": zoo.DEFAULT_MODEL, "batch": 1,
                "dtype": "fp32", "memory_format": "nchw", "cuda_graphs": False, "hf_path": ""}
    for key, value in defaults.items():
        if key not in st.session_state:
            st.session_state[key] = value


def main() -> None:
    clicked = time.time()   # this run began with the user's click: a load's elapsed time counts from here
    # A local image: a ":material/...:" page icon makes the browser fetch the favicon from
    # fonts.gstatic.com, and the app makes no network request (docs/security.md).
    lang = st.session_state.get("lang") or st.query_params.get("lang")   # the switch is drawn below
    st.set_page_config(page_title=t_in(lang if lang in i18n.LANGUAGES else i18n.DEFAULT, "app.name"),
                       page_icon=str(HERE / "ui" / "icon.png"), layout="wide")
    # the app's own CJK font (explorer/ui/fonts.py): its 中文 never depends on the fonts of the machine
    st.html(fonts.font_face_css(st.get_option("server.baseUrlPath")))
    ui_state.init_state()
    init_widget_defaults()
    # ?model=...&dtype=...&device=...&view=... opens that state (once per session)
    refused_link = links.apply_query_params([e.name for e in zoo.menu()], DTYPES,
                                            ("cuda", "cpu") if _cuda_available() else ("cpu",))
    ui_state.finish_run()
    cuda = _cuda_available()

    lang = i18n.language_switch()  # English / 中文, first in the sidebar; every page reads it through i18n.t
    st.html(i18n.uploader_css(lang))  # Streamlit's uploader text, in the language chosen
    try:
        requested = sidebar_model()
        sidebar_settings(cuda)
        if requested is not None:
            ui_state.request_load(requested, clicked)
    except ExplorerError as exc:
        st.session_state.load_error = str(exc)
        requested = None
    except Exception as exc:  # page boundary: one line, never a traceback
        st.session_state.load_error = f"unexpected error ({type(exc).__name__}): {str(exc).splitlines()[0][:300] if str(exc) else ''}"
        requested = None

    icons = {"graph": ":material/hub:", "fusions": ":material/checklist:", "run": ":material/timer:",
             "results": ":material/bar_chart:", "sweeps": ":material/stacked_line_chart:", "learn": ":material/school:",
             "export": ":material/download:"}
    pages = [st.Page(str(HERE / "ui" / "pages" / f"{name}.py"), title=t(f"app.page.{name}"), url_path=name,
                     icon=icon, default=name == "graph") for name, icon in icons.items()]
    nav = st.navigation(pages, position="top")

    ss = st.session_state
    error = ss.load_error
    if error and (requested is None or requested == ss.failed_spec):
        st.error(t("app.load_error", error=ui_files.escape_markdown(message(error)))
                 + (t("app.still_showing", label=ui_files.escape_markdown(ss.active.label)) if ss.active else ""))
    if not cuda:
        st.warning(t("app.no_gpu"), icon=":material/warning:")
    job = ss.run_job
    if job is not None and not job.done:
        with st.sidebar:  # redrawn every second on its own, so it never goes stale
            ui_state.live_progress("sidebar")
    if ss.active is not None:
        st.sidebar.success(t("app.loaded", label=ui_files.escape_markdown(ss.active.label), batch=ss.active.batch)
                           + (t("app.loaded_seq", seq=ss.active.seq_len) if ss.active.seq_len else ""))
    for line in refused_link:
        st.warning(t("app.link_ignored", reason=ui_files.escape_markdown(line)))
    links.sync_query_params()
    nav.run()


main()
