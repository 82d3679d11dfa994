"""Files the app receives and hands out: uploads on disk, reports as CSV, fused models as bytes.

No Streamlit here (the app calls these; the tests call them directly).

- ``store_upload(name, data)`` writes an uploaded model into a fresh temp dir
  keyed by its content hash and returns the path ``load_model`` takes;
  ``extract_zip(data)`` unpacks a .zip (model + external data) safely:
  absolute paths, ``..``, links, too many members, a total over
  ``MAX_EXTRACT_BYTES`` or a member inflating more than ``MAX_INFLATION``
  times are refused before a byte is written, every member is streamed
  through a byte counter, and a failed extraction leaves no folder behind.
- ``check_upload(name, data, kind)`` refuses a file the uploader does not take
  by name, or whose first bytes contradict its name (``sniff``: a fixed-size
  look at the header), in one line saying what the content is.
- ``UploadFolders`` remembers one session's upload folders and removes them
  when the session's state is dropped (or the process exits);
  ``remove_upload(path)`` removes one (only folders this module made).
- ``report_csv(report)`` flattens a run report into one CSV; ``load_report``
  reads one back from JSON (``explorer.jsonfile``: bounded size and nesting,
  data only, never run) and checks the types of the fields the app reads.
- ``escape_markdown(text)`` makes a string from a file safe to pass to a
  Streamlit element that renders markdown (``explorer.ui.safe_text.markdown``).
- ``fused_pt2_bytes`` / ``fused_onnx_bytes`` export the model a plan makes
  (``explorer.rewrite.apply_plan``) with ``torch.export.save`` / ``torch.onnx.export``.
"""

from __future__ import annotations

import csv
import dataclasses
import hashlib
import io
import os
import re
import shutil
import stat
import tempfile
import weakref
import zipfile
from collections.abc import MutableMapping
from pathlib import Path
from typing import Any, Iterator

from explorer import report as run_report
from explorer.ui import safe_text
from explorer.messages import UPLOAD
from explorer.errors import ExplorerError, ModelLoadError, ReportError
from explorer.report import Report

MAX_UPLOAD_MB = 200
MAX_UPLOAD_BYTES = MAX_UPLOAD_MB * 1024 * 1024
UPLOAD_ROOT_PREFIX = "fusion-explorer-upload-"
MAX_REPORT_MB = 50
MAX_EXTRACT_BYTES = 2 * MAX_UPLOAD_BYTES
MAX_INFLATION = 100  # uncompressed / compressed, per member larger than 1 MiB
MAX_ZIP_MEMBERS = 1000


def _safe_name(name: str) -> str:
    base = os.path.basename(name.replace("\\", "/")) or "model"
    base = re.sub(r"[^A-Za-z0-9._-]+", "_", base).lstrip(".") or "model"
    return base[:120]


def check_size(name: str, size: int) -> None:
    if size > MAX_UPLOAD_BYTES:
        raise ModelLoadError(UPLOAD("too_big", name=name, mb=size / 2**20, limit=MAX_UPLOAD_MB))


#: The file names each model uploader takes.
UPLOAD_SUFFIXES = {"onnx": (".onnx", ".zip"), "pt2": (".pt2",)}
_CONTENT = {"zip": "a zip archive (as a .pt2, a .zip or a torch.save checkpoint is)",
            "pickle": "a Python pickle (never loaded here)", "onnx": "an ONNX model", "json": "JSON text",
            "empty": "empty", "unknown": "not a format the explorer reads"}


def sniff(data: bytes) -> str:
    """What the first bytes of ``data`` say it is: zip, pickle, onnx, json, empty or unknown (a fixed-size
    look at the header; nothing is parsed). An ONNX model (a protobuf ModelProto) starts with its
    ``ir_version`` field: tag 0x08, then a small version number."""
    head = data[:8]
    if not head:
        return "empty"
    if head[:4] in (b"PK\x03\x04", b"PK\x05\x06"):
        return "zip"
    if head[0] == 0x80 and len(head) > 1 and 2 <= head[1] <= 5 and data[-1:] == b".":  # PROTO ... STOP
        return "pickle"
    if head[0] == 0x08 and len(head) > 1 and 1 <= head[1] <= 0x20:
        return "onnx"
    if head.lstrip()[:1] in (b"{", b"["):
        return "json"
    return "unknown"


def check_upload(name: str, data: bytes, kind: str) -> None:
    """Refuse, in one line, an upload whose name the ``kind`` uploader ("onnx" or "pt2") does not take,
    or whose first bytes contradict its name (a renamed file): the message says what the content is."""
    shown = safe_text.one_line(os.path.basename(name.replace("\\", "/")))[:120] or "the upload"
    allowed = UPLOAD_SUFFIXES[kind]
    suffix = os.path.splitext(shown)[1].lower()
    found = sniff(data)
    if suffix not in allowed:
        hint = f"; if it is one, name it {os.path.splitext(shown)[0]}.onnx" if found == "onnx" else ""
        raise ModelLoadError(f"{shown}: this uploader takes {' or '.join(allowed)} files, and this one's content "
                             f"is {_CONTENT[found]}{hint}")
    if suffix == ".onnx" and found in ("zip", "pickle"):  # the ONNX loader says what else is wrong
        raise ModelLoadError(f"{shown}: its name ends in .onnx but its content is {_CONTENT[found]}, not ONNX")
    if suffix in (".zip", ".pt2") and found != "zip":
        raise ModelLoadError(f"{shown}: its name ends in {suffix} but its content is {_CONTENT[found]}, "
                             f"not a zip archive (a {suffix} file is one)")


def _fresh_dir(digest: str) -> Path:
    return Path(tempfile.mkdtemp(prefix=f"{UPLOAD_ROOT_PREFIX}{digest[:12]}-"))


def store_upload(name: str, data: bytes, extra: tuple[tuple[str, bytes], ...] = ()) -> str:
    """Write an upload (and companion files, e.g. ONNX external data) into a fresh temp dir.

    Returns the model's path. A ``.zip`` is extracted with ``extract_zip``.
    """
    check_size(name, len(data) + sum(len(d) for _, d in extra))
    digest = hashlib.sha256(data + b"".join(d for _, d in extra)).hexdigest()
    if name.lower().endswith(".zip"):
        return extract_zip(data, name)
    folder = _fresh_dir(digest)
    try:
        path = folder / _safe_name(name)
        path.write_bytes(data)
        for extra_name, extra_data in extra:
            (folder / _safe_name(extra_name)).write_bytes(extra_data)
    except OSError as exc:
        shutil.rmtree(folder, ignore_errors=True)
        raise ModelLoadError(UPLOAD("store_failed", name=_safe_name(name), reason=exc.strerror)) from None
    return str(path)


def remove_upload(path: str) -> None:
    """Remove the temp folder holding an upload (``store_upload``/``extract_zip``); anything else is left."""
    folder = Path(path).parent
    tmp = Path(tempfile.gettempdir()).resolve()
    try:
        real = folder.resolve()
    except OSError:
        return
    while real.parent != tmp and real.parent != real:  # a model inside a sub-folder of the zip
        real = real.parent
    if real.parent == tmp and real.name.startswith(UPLOAD_ROOT_PREFIX):
        shutil.rmtree(real, ignore_errors=True)


def remove_uploads(paths: dict) -> None:
    """Remove every upload folder in ``paths`` (values are model paths) and forget them."""
    for path in list(paths.values()):
        remove_upload(path)
    paths.clear()


class UploadFolders(MutableMapping):
    """One session's uploads: {uploaded file ids: model path}. When the object is dropped (the app
    session ended and its state was released) or the process exits, every folder is removed."""

    def __init__(self) -> None:
        self._paths: dict = {}
        self._finalizer = weakref.finalize(self, remove_uploads, self._paths)

    def __getitem__(self, key: Any) -> str:
        return self._paths[key]

    def __setitem__(self, key: Any, path: str) -> None:
        self._paths[key] = path

    def __delitem__(self, key: Any) -> None:
        remove_upload(self._paths.pop(key))

    def __iter__(self) -> Iterator:
        return iter(list(self._paths))

    def __len__(self) -> int:
        return len(self._paths)

    def keep_only(self, keep: set[str]) -> None:
        """Remove the folders of every upload whose path is not in ``keep``."""
        for key, path in list(self._paths.items()):
            if path not in keep:
                del self[key]


def extract_zip(data: bytes, name: str = "upload.zip") -> str:
    """Extract an archive holding one ``.onnx`` or ``.pt2`` (plus external data) into a fresh temp dir.

    Refuses, before writing anything: members with absolute paths, ``..`` parts,
    drive letters, control characters or links; more than ``MAX_ZIP_MEMBERS``
    members; a declared total over ``MAX_EXTRACT_BYTES``; a member that inflates
    more than ``MAX_INFLATION`` times. Members are then streamed through a
    counter that stops at the declared size (a lying header cannot write more).
    On any failure the folder is removed. Returns the model's path.
    """
    try:
        archive = zipfile.ZipFile(io.BytesIO(data))
        infos = archive.infolist()
    except (zipfile.BadZipFile, ValueError, EOFError, NotImplementedError, OverflowError):
        raise ModelLoadError(UPLOAD("not_zip", name=name)) from None
    if len(infos) > MAX_ZIP_MEMBERS:
        raise ModelLoadError(UPLOAD("too_many_members", name=name, n=len(infos), limit=MAX_ZIP_MEMBERS))
    total = 0
    for info in infos:
        member = info.filename
        parts = member.replace("\\", "/").split("/")
        if (member.startswith(("/", "\\")) or re.match(r"^[A-Za-z]:", member) or ".." in parts
                or re.search(r"[\x00-\x1f\x7f]", member)):
            raise ModelLoadError(UPLOAD("outside_archive", name=name, member=repr(member[:120])))
        # The Unix file type, where the archiver recorded one: Python's zipfile writes permission
        # bits alone (0o600), DOS archivers nothing; both are plain files.
        file_type = stat.S_IFMT(info.external_attr >> 16)
        if file_type and file_type not in (stat.S_IFREG, stat.S_IFDIR):
            raise ModelLoadError(UPLOAD("link", name=name, member=member[:120]))
        if info.file_size > 2**20 and info.file_size > MAX_INFLATION * max(info.compress_size, 1):
            raise ModelLoadError(UPLOAD("zip_bomb", name=name, member=member[:120], mb=info.file_size / 2**20,
                                        ratio=info.file_size // max(info.compress_size, 1)))
        total += info.file_size
    if total > MAX_EXTRACT_BYTES:
        raise ModelLoadError(UPLOAD("expands", name=name, mb=total / 2**20, limit=MAX_EXTRACT_BYTES / 2**20))
    models = [i.filename for i in infos if i.filename.lower().endswith((".onnx", ".pt2")) and not i.is_dir()]
    if len(models) != 1:
        raise ModelLoadError(UPLOAD("one_model", name=name, n=len(models)))
    folder = _fresh_dir(hashlib.sha256(data).hexdigest())
    try:
        root = folder.resolve()
        for info in infos:
            target = (folder / info.filename).resolve()
            if root not in target.parents and target != root:
                raise ModelLoadError(UPLOAD("escapes", name=name, member=info.filename[:120]))
            if info.is_dir():
                target.mkdir(parents=True, exist_ok=True)
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            written = 0
            with archive.open(info) as src, open(target, "xb") as dst:
                while chunk := src.read(1 << 20):
                    written += len(chunk)
                    if written > info.file_size:
                        raise ModelLoadError(UPLOAD("larger", name=name, member=info.filename[:120]))
                    dst.write(chunk)
    except ModelLoadError:
        shutil.rmtree(folder, ignore_errors=True)
        raise
    except (zipfile.BadZipFile, OSError, EOFError, ValueError, NotImplementedError, RuntimeError) as exc:
        shutil.rmtree(folder, ignore_errors=True)
        raise ModelLoadError(UPLOAD("extract_failed", name=name, kind=type(exc).__name__)) from None
    return str(folder / models[0])


# ------------------------------------------------------------------ reports

def report_csv(report: Report) -> str:
    """The typed report as one CSV (section, name, metric, value): the model-level measurements and the
    verdict, one block per chain (its verdict's label, ratio, interval and p-value included), the
    stages, the baselines, the environment."""
    out = io.StringIO()
    w = csv.writer(out)
    w.writerow(["section", "name", "metric", "value"])

    def flat(section: str, name: str, value: Any, prefix: str = "") -> None:
        if dataclasses.is_dataclass(value):
            value = dataclasses.asdict(value)
        if isinstance(value, dict):
            for key, v in value.items():
                flat(section, name, v, f"{prefix}{key}.")
        elif isinstance(value, (list, tuple)):
            if all(not isinstance(v, (dict, list, tuple)) for v in value):
                w.writerow([section, name, prefix.rstrip("."), " ".join(str(v) for v in value)])
        else:
            w.writerow([section, name, prefix.rstrip("."), value])

    for variant in (report.unfused, report.fused):
        flat("model", variant.name, variant)
    flat("model", "fused vs unfused", report.verdict, "verdict.")
    for chain in report.chains:
        flat("chain", chain.id, {k: v for k, v in dataclasses.asdict(chain).items() if k != "id"})
    for stage in report.stages:
        flat("stage", stage.stage, {k: v for k, v in dataclasses.asdict(stage).items() if k != "stage"})
    for baseline in report.baselines:
        flat("baseline", baseline.name, {k: v for k, v in dataclasses.asdict(baseline).items() if k != "name"})
    flat("environment", "", report.environment)
    return out.getvalue()


# ------------------------------------------------------------------ fused models

def load_report(name: str, data: bytes) -> Report:
    """A run report read back from its JSON (the Export page's, or ``fusion-explorer run --out``).

    ``explorer.report.load``: bounded size and depth, every field's type checked
    (never coerced), version 1 upgraded. Raises ``ReportError`` (one line) for
    anything else. The report is data: parsed, never run.
    """
    if len(data) > MAX_REPORT_MB * 2**20:
        raise ReportError(f"{name}: {len(data) / 2**20:.0f} MB is over the report limit of {MAX_REPORT_MB} MB")
    try:
        return run_report.load(data, name)
    except ReportError as exc:
        raise ReportError(str(exc).replace(f"{name} is not valid JSON", f"{name} is not a JSON report")) from None


def escape_markdown(text: Any) -> str:
    """``explorer.ui.safe_text.markdown``: ``text`` on one line, shown as written by an element that renders
    markdown (no link, image, autolink, HTML, LaTeX or icon from it)."""
    return safe_text.markdown(text)


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return (text[0] if text else type(exc).__name__)[:300]


def fused_graph(model: Any, detection: Any, plan: Any):
    """The fused GraphModule for ``plan`` (``explorer.rewrite.apply_plan`` on the CPU)."""
    try:
        from explorer.fusions import rewrite
    except ImportError as exc:
        raise ExplorerError(UPLOAD("rewriter", reason=_one_line(exc))) from None
    fused = rewrite.apply_plan(model.gm, detection, plan, "cpu")
    return fused


def fused_pt2_bytes(model: Any, detection: Any, plan: Any) -> bytes:
    """``torch.export.save`` of the fused model, as bytes."""
    import torch

    fused = fused_graph(model, detection, plan)
    try:
        program = torch.export.export(fused.gm, tuple(model.example_inputs))
        buf = io.BytesIO()
        torch.export.save(program, buf)
    except ExplorerError:
        raise
    except Exception as exc:
        raise ExplorerError(UPLOAD("pt2_save", reason=_one_line(exc))) from exc
    return buf.getvalue()


def fused_onnx_bytes(model: Any, detection: Any, plan: Any) -> bytes:
    """``torch.onnx.export`` of the fused model, as bytes (raises a one-line ExplorerError)."""
    import torch

    fused = fused_graph(model, detection, plan)
    folder = Path(tempfile.mkdtemp(prefix="fusion-explorer-onnx-"))
    path = folder / "fused.onnx"
    try:
        try:
            torch.onnx.export(fused.gm, tuple(model.example_inputs), str(path), dynamo=False,
                              input_names=list(model.input_names))
        except TypeError:
            torch.onnx.export(fused.gm, tuple(model.example_inputs), str(path),
                              input_names=list(model.input_names))
        return path.read_bytes()
    except ExplorerError:
        raise
    except Exception as exc:
        raise ExplorerError(UPLOAD("onnx_export", reason=_one_line(exc))) from exc
