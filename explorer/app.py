"""Fusion Explorer, the Streamlit app: declares the pages and wires the sidebar.

Run it with ``fusion-explorer app`` or ``streamlit run explorer/app.py``.

The sidebar chooses the model (zoo, ONNX upload, ``.pt2`` upload or a local
Hugging Face folder) and the measurement settings; the pages in
``explorer/ui_page_*.py`` show the graph, the chains to accept or reject, the run,
its results, the patterns explained, and the downloads. State lives in
``explorer.ui_state``; all analysis is the engine's.

Widget keys (the tests drive these): model_kind, zoo_name, onnx_file,
onnx_data_file, pt2_file, hf_path, batch, seq_len, dtype, device,
memory_format, cuda_graphs; page keys are listed in each page's docstring.
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):  # `streamlit run explorer/app.py` runs this file as a script
    root = str(Path(__file__).resolve().parent.parent)
    if root not in sys.path:
        sys.path.insert(0, root)

import streamlit as st

from explorer.sources import zoo
from explorer.ui import files as ui_files
from explorer.ui import i18n
from explorer.ui import links
from explorer.ui import state as ui_state
from explorer.errors import ExplorerError
from explorer.fusions.plan import MEMORY_FORMATS

HERE = Path(__file__).resolve().parent
MODEL_KINDS = ("Zoo", "ONNX upload", ".pt2 upload", "Hugging Face folder")
DTYPES = ("fp32", "fp16", "bf16")


def _cuda_available() -> bool:
    import torch

    return bool(torch.cuda.is_available())


def _upload_path(files: list) -> str:
    """Path on disk of the uploaded file(s), written once per upload."""
    ss = st.session_state
    ident = tuple(getattr(f, "file_id", f.name) for f in files)
    if ident not in ss.upload_paths:
        first, rest = files[0], files[1:]
        for f in files:
            ui_files.check_size(f.name, f.size)
        ui_state.keep_uploads(set())  # a new upload: earlier ones, but the active model's, are removed
        ss.upload_paths[ident] = ui_files.store_upload(
            first.name, first.getvalue(), tuple((f.name, f.getvalue()) for f in rest))
    return ss.upload_paths[ident]


def _seq_len_widget(default: int | None, maximum: int | None) -> int | None:
    if default is None:
        return None
    if "seq_len" not in st.session_state:
        st.session_state.seq_len = int(default)
    return int(st.sidebar.number_input("Sequence length", min_value=1, max_value=int(maximum or 4096),
                                       step=1, key="seq_len",
                                       help="Tokens per input; only for sequence models"))


def sidebar_model() -> ui_state.LoadSpec | None:
    """Draw the model chooser and return what the user asks for (None: nothing new)."""
    sb = st.sidebar
    sb.header("Model")
    kind = sb.radio("Source", MODEL_KINDS, key="model_kind", horizontal=True)
    batch = int(sb.number_input("Batch", min_value=1, max_value=1024, step=1, key="batch"))
    active = st.session_state.active
    if kind == "Zoo":
        entries = {e.name: e for e in zoo.menu()}
        name = sb.selectbox("Zoo model", list(entries), key="zoo_name",
                            format_func=lambda n: f"{n} — {entries[n].family}",
                            help="Real architectures with seeded random weights; nothing is downloaded")
        entry = entries[name]
        sb.caption(entry.description)
        seq = _seq_len_widget(entry.inputs.seq_len, entry.max_seq_len)
        return ui_state.LoadSpec(name, batch, seq, name, "zoo")
    limit = f"Files up to {ui_files.MAX_UPLOAD_MB} MB."
    if kind == "ONNX upload":
        model_file = sb.file_uploader(f"ONNX model (.onnx or .zip with its .onnx.data). {limit}",
                                      type=["onnx", "zip"], key="onnx_file")
        data_file = sb.file_uploader("External data (optional, e.g. model.onnx.data)", key="onnx_data_file")
        if model_file is None:
            sb.info("Upload an .onnx file (or a .zip holding the model and its external data).")
            return None
        files = [model_file] + ([data_file] if data_file is not None else [])
        path = _upload_path(files)
        seq = _seq_len_widget(active.seq_len if active and active.source == path else None, None)
        return ui_state.LoadSpec(path, batch, seq, model_file.name, "onnx")
    if kind == ".pt2 upload":
        pt2 = sb.file_uploader(f"torch.export archive (.pt2). {limit}", type=["pt2"], key="pt2_file")
        if pt2 is None:
            sb.info("Upload a .pt2 saved with torch.export.save (its example inputs set the batch).")
            return None
        path = _upload_path([pt2])
        return ui_state.LoadSpec(path, batch, None, pt2.name, "pt2")
    folder = sb.text_input("Local Hugging Face folder (save_pretrained, safetensors)", key="hf_path",
                           placeholder="/path/to/model").strip()
    if not folder:
        return None
    seq = _seq_len_widget(active.seq_len if active and active.source == folder else None, None)
    return ui_state.LoadSpec(folder, batch, seq, Path(folder).name or folder, "hf")


def sidebar_settings(cuda: bool) -> None:
    sb = st.sidebar
    sb.header("Settings")
    sb.selectbox("dtype", DTYPES, key="dtype")
    devices = ("cuda", "cpu") if cuda else ("cpu",)
    if st.session_state.get("device") not in devices:
        st.session_state.device = devices[0]
    sb.selectbox("Device", devices, key="device",
                 help=None if cuda else "No CUDA device here: only the CPU can be measured")
    sb.selectbox("Memory format", MEMORY_FORMATS, key="memory_format",
                 help="channels_last often speeds up convolutions on tensor cores")
    sb.checkbox("CUDA-graph replay", key="cuda_graphs", disabled=not cuda,
                help="Replays the whole forward as one CUDA graph: removes launch overhead (GPU only)")


def init_widget_defaults() -> None:
    defaults = {"model_kind": MODEL_KINDS[0], "zoo_name": zoo.DEFAULT_MODEL, "batch": 1,
                "dtype": "fp32", "memory_format": "nchw", "cuda_graphs": False, "hf_path": ""}
    for key, value in defaults.items():
        if key not in st.session_state:
            st.session_state[key] = value


def main() -> None:
    # A local image: a ":material/...:" page icon makes the browser fetch the favicon from
    # fonts.gstatic.com, and the app makes no network request (docs/security.md).
    st.set_page_config(page_title="Fusion Explorer", page_icon=str(HERE / "ui" / "icon.png"), layout="wide")
    ui_state.init_state()
    init_widget_defaults()
    # ?model=...&dtype=...&device=...&view=... opens that state (once per session)
    refused_link = links.apply_query_params([e.name for e in zoo.menu()], DTYPES,
                                            ("cuda", "cpu") if _cuda_available() else ("cpu",))
    ui_state.finish_run()
    cuda = _cuda_available()

    i18n.language_switch()  # English / 中文, first in the sidebar; every page reads it through i18n.t
    try:
        requested = sidebar_model()
        sidebar_settings(cuda)
        if requested is not None:
            ui_state.request_load(requested)
    except ExplorerError as exc:
        st.session_state.load_error = str(exc)
        requested = None
    except Exception as exc:  # page boundary: one line, never a traceback
        st.session_state.load_error = f"unexpected error ({type(exc).__name__}): {str(exc).splitlines()[0][:300] if str(exc) else ''}"
        requested = None

    pages = [
        st.Page(str(HERE / "ui" / "pages" / "graph.py"), title="Graph", url_path="graph", icon=":material/hub:", default=True),
        st.Page(str(HERE / "ui" / "pages" / "fusions.py"), title="Fusions", url_path="fusions", icon=":material/checklist:"),
        st.Page(str(HERE / "ui" / "pages" / "run.py"), title="Run", url_path="run", icon=":material/timer:"),
        st.Page(str(HERE / "ui" / "pages" / "results.py"), title="Results", url_path="results", icon=":material/bar_chart:"),
        st.Page(str(HERE / "ui" / "pages" / "learn.py"), title="Learn", url_path="learn", icon=":material/school:"),
        st.Page(str(HERE / "ui" / "pages" / "export.py"), title="Export", url_path="export", icon=":material/download:"),
    ]
    nav = st.navigation(pages, position="top")

    ss = st.session_state
    error = ss.load_error
    if error and (requested is None or requested == ss.failed_spec):
        st.error(f"Could not load the model: {ui_files.escape_markdown(error)}"
                 + (f" — still showing {ui_files.escape_markdown(ss.active.label)}." if ss.active else ""))
    if not cuda:
        st.warning("No GPU on this machine: every number the Run page measures is a CPU number, "
                   "not what a fused GPU kernel would give.", icon=":material/warning:")
    job = ss.run_job
    if job is not None and not job.done:
        with st.sidebar:  # redrawn every second on its own, so it never goes stale
            ui_state.live_progress("sidebar")
    if ss.active is not None:
        st.sidebar.success(f"Loaded: {ss.active.label} · batch {ss.active.batch}"
                           + (f" · seq {ss.active.seq_len}" if ss.active.seq_len else ""))
    for line in refused_link:
        st.warning(f"Link ignored: {line}.")
    links.sync_query_params()
    nav.run()


main()
