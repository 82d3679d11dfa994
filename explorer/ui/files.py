"""Files the app receives and hands out: uploads on disk, reports as CSV, fused models as bytes.

No Streamlit here (the app calls these; the tests call them directly).

- ``store_upload(name, data)`` writes an uploaded model into a fresh temp dir
  keyed by its content hash and returns the path ``load_model`` takes;
  ``extract_zip(data)`` unpacks a .zip (model + external data) safely:
  absolute paths, ``..``, links and oversized archives are refused.
- ``report_csv(report)`` flattens a run report into one CSV; ``load_report``
  reads one back from JSON (data only: it is parsed, never run) and checks
  that it has the report's contract keys.
- ``fused_pt2_bytes`` / ``fused_onnx_bytes`` export the model a plan makes
  (``explorer.rewrite.apply_plan``) with ``torch.export.save`` / ``torch.onnx.export``.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import os
import re
import stat
import tempfile
import zipfile
from pathlib import Path
from typing import Any

from explorer.errors import ExplorerError, ModelLoadError, ReportError

MAX_UPLOAD_MB = 200
MAX_UPLOAD_BYTES = MAX_UPLOAD_MB * 1024 * 1024
UPLOAD_ROOT_PREFIX = "fusion-explorer-upload-"
MAX_REPORT_MB = 50


def _safe_name(name: str) -> str:
    base = os.path.basename(name.replace("\\", "/")) or "model"
    base = re.sub(r"[^A-Za-z0-9._-]+", "_", base).lstrip(".") or "model"
    return base[:120]


def check_size(name: str, size: int) -> None:
    if size > MAX_UPLOAD_BYTES:
        raise ModelLoadError(f"{name}: {size / 2**20:.0f} MB is over the upload limit of {MAX_UPLOAD_MB} MB")


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
    path = folder / _safe_name(name)
    path.write_bytes(data)
    for extra_name, extra_data in extra:
        (folder / _safe_name(extra_name)).write_bytes(extra_data)
    return str(path)


def extract_zip(data: bytes, name: str = "upload.zip") -> str:
    """Extract an archive holding one ``.onnx`` (plus its external data) into a fresh temp dir.

    Refuses members with absolute paths, ``..`` parts, drive letters or links,
    and archives that expand beyond the upload limit. Returns the ``.onnx`` path.
    """
    try:
        archive = zipfile.ZipFile(io.BytesIO(data))
        infos = archive.infolist()
    except zipfile.BadZipFile:
        raise ModelLoadError(f"{name}: not a zip file") from None
    total = 0
    for info in infos:
        member = info.filename
        parts = member.replace("\\", "/").split("/")
        if member.startswith(("/", "\\")) or re.match(r"^[A-Za-z]:", member) or ".." in parts:
            raise ModelLoadError(f"{name}: member '{member}' would be written outside the archive; refused")
        mode = info.external_attr >> 16
        if stat.S_ISLNK(mode):
            raise ModelLoadError(f"{name}: member '{member}' is a link; refused")
        total += info.file_size
    if total > 4 * MAX_UPLOAD_BYTES:
        raise ModelLoadError(f"{name}: expands to {total / 2**20:.0f} MB, over the limit")
    models = [i.filename for i in infos if i.filename.lower().endswith((".onnx", ".pt2")) and not i.is_dir()]
    if len(models) != 1:
        raise ModelLoadError(f"{name}: the zip must hold exactly one .onnx or .pt2 model, found {len(models)}")
    folder = _fresh_dir(hashlib.sha256(data).hexdigest())
    root = folder.resolve()
    for info in infos:
        target = (folder / info.filename).resolve()
        if root not in target.parents and target != root:
            raise ModelLoadError(f"{name}: member '{info.filename}' escapes the folder; refused")
        if info.is_dir():
            target.mkdir(parents=True, exist_ok=True)
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        with archive.open(info) as src, open(target, "wb") as dst:
            dst.write(src.read())
    return str(folder / models[0])


# ------------------------------------------------------------------ reports

def report_csv(report: dict[str, Any]) -> str:
    """The report as one CSV: model-level metrics, then one row per chain, then the stages."""
    out = io.StringIO()
    w = csv.writer(out)
    w.writerow(["section", "name", "metric", "value"])
    for variant in ("unfused", "fused"):
        d = report.get(variant) or {}
        for key, value in d.items():
            if isinstance(value, dict):
                for sub, v in value.items():
                    if not isinstance(v, (dict, list)):
                        w.writerow(["model", variant, f"{key}.{sub}", v])
            elif not isinstance(value, list):
                w.writerow(["model", variant, key, value])
    for chain in report.get("chains") or []:
        for key, value in chain.items():
            if key != "id" and not isinstance(value, (dict, list)):
                w.writerow(["chain", chain.get("id"), key, value])
    for stage in report.get("stages") or []:
        name = stage.get("stage")
        for key, value in stage.items():
            if isinstance(value, dict):
                for sub, v in value.items():
                    if not isinstance(v, (dict, list)):
                        w.writerow(["stage", name, f"{key}.{sub}", v])
            elif key != "stage":
                w.writerow(["stage", name, key, value])
    for key, value in (report.get("environment") or {}).items():
        if not isinstance(value, (dict, list)):
            w.writerow(["environment", "", key, value])
    return out.getvalue()


# ------------------------------------------------------------------ fused models

def load_report(name: str, data: bytes) -> dict[str, Any]:
    """A run report read back from its JSON (the Export page's, or ``fusion-explorer run --out``).

    Raises ``ReportError`` (one line) for anything else: too large, not UTF-8 JSON,
    or without the report contract's ``unfused``/``fused`` latency objects.
    """
    if len(data) > MAX_REPORT_MB * 2**20:
        raise ReportError(f"{name}: {len(data) / 2**20:.0f} MB is over the report limit of {MAX_REPORT_MB} MB")
    try:
        report = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise ReportError(f"{name} is not a JSON report: {_one_line(exc)}") from None
    if not isinstance(report, dict):
        raise ReportError(f"{name} is not a run report: it holds a JSON {type(report).__name__}, not an object")
    missing = [k for k in ("unfused", "fused")
               if not isinstance(report.get(k), dict) or not isinstance(report[k].get("latency_ms"), dict)]
    if missing:
        raise ReportError(f"{name} is not a run report: no {' or '.join(repr(k) for k in missing)} "
                          "object with latency_ms")
    for key, kind in (("chains", list), ("stages", list), ("environment", dict), ("plan", dict)):
        if key in report and report[key] is not None and not isinstance(report[key], kind):
            raise ReportError(f"{name} is not a run report: '{key}' is not a {kind.__name__}")
    return report


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return (text[0] if text else type(exc).__name__)[:300]


def fused_graph(model: Any, detection: Any, plan: Any):
    """The fused GraphModule for ``plan`` (``explorer.rewrite.apply_plan`` on the CPU)."""
    try:
        from explorer.fusions import rewrite
    except ImportError as exc:
        raise ExplorerError(f"the rewriter is not available: {_one_line(exc)}") from None
    fused = rewrite.apply_plan(model.gm, detection, plan, device="cpu")
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
        raise ExplorerError(f"torch.export could not save the fused model: {_one_line(exc)}") from exc
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
        raise ExplorerError(f"torch.onnx.export failed: {_one_line(exc)}") from exc
