"""The teaching report: time breakdown, traffic, staged table and predictions of whole models, measured on a GPU.

``benchmarks/teach_reports.py`` writes one on the GPU machine; the app's Learn
page opens it anywhere (a CPU machine included). It is its own small JSON
document beside the run report (``explorer.report``), with its own schema name
and version, validated on load; every failure is one ``ReportError`` line
naming the file and the field::

    {"schema": "fusion-explorer-teaching-report", "version": 1,
     "command", "date_utc", "environment": {...}, "ceilings": {...} (runtime.ceilings.Ceilings),
     "models": [{"name", "batch", "seq_len", "dtype", "memory_format", "fingerprint", "chains_fused",
                 "breakdown": {"unfused": Breakdown, "fused": Breakdown} or {"error": "..."},
                 "traffic": {"chains": [...], "total": {...}, "note", "ncu": {"unfused", "fused"} or null,
                             "explained": {...}},
                 "stages": [{"stage", "label", "latency_ms": {"median", ...}, "throughput", "peak_memory_bytes"}],
                 "predictions": [ChainPrediction], "measured": [MeasuredChain]} ...],
     "notes": [...]}
"""

from __future__ import annotations

import math
import os
from typing import Any

from explorer.errors import ReportError
from explorer.jsonfile import parse_json, read_json_file

SCHEMA = "fusion-explorer-teaching-report"
VERSION = 1
MAX_BYTES = 20 * 2**20
CATEGORIES = ("launch_host", "memory_bound", "compute_bound", "other")


class _Bad(Exception):
    """A field that does not fit the schema: the message is ``path: what is wrong``."""


def _type_name(value: Any) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean", type(None): "null"}.get(
        type(value), "a number" if isinstance(value, (int, float)) else type(value).__name__)


def _need(data: dict, key: str, kind: str, path: str, optional: bool = False) -> Any:
    where = f"{path}.{key}" if path else key
    if key not in data:
        if optional:
            return None
        raise _Bad(f"{where}: missing")
    value = data[key]
    if value is None and optional:
        return None
    ok = {"str": isinstance(value, str), "int": isinstance(value, int) and not isinstance(value, bool),
          "num": isinstance(value, (int, float)) and not isinstance(value, bool),
          "dict": isinstance(value, dict), "list": isinstance(value, list), "bool": isinstance(value, bool)}[kind]
    if not ok:
        expected = {"str": "a string", "int": "an integer", "num": "a number", "dict": "an object",
                    "list": "a list", "bool": "a boolean"}[kind]
        raise _Bad(f"{where}: expected {expected}, got {_type_name(value)}")
    if kind == "num" and not math.isfinite(float(value)):
        raise _Bad(f"{where}: not a finite number")
    return value


def _breakdown(b: Any, path: str) -> None:
    if not isinstance(b, dict):
        raise _Bad(f"{path}: expected an object, got {_type_name(b)}")
    wall = _need(b, "wall_ms", "num", path)
    _need(b, "busy_ms", "num", path)
    _need(b, "is_cpu", "bool", path)
    cats = _need(b, "categories_ms", "dict", path)
    for c in CATEGORIES:
        value = _need(cats, c, "num", f"{path}.categories_ms")
        if value < 0:
            raise _Bad(f"{path}.categories_ms.{c}: negative")
    total = sum(float(cats[c]) for c in CATEGORIES)
    if abs(total - wall) > 1e-6 * max(1.0, abs(wall)):
        raise _Bad(f"{path}.categories_ms: they add up to {total:.6g} ms, not the wall time {wall:.6g} ms")


def _traffic(t: Any, path: str) -> None:
    if not isinstance(t, dict):
        raise _Bad(f"{path}: expected an object, got {_type_name(t)}")
    total = _need(t, "total", "dict", path)
    for key in ("bytes_unfused", "bytes_fused", "bytes_saved"):
        _need(total, key, "num", f"{path}.total")
    for i, row in enumerate(_need(t, "chains", "list", path)):
        where = f"{path}.chains[{i}]"
        if not isinstance(row, dict):
            raise _Bad(f"{where}: expected an object, got {_type_name(row)}")
        _need(row, "id", "str", where)
        for key in ("bytes_unfused", "bytes_fused"):
            _need(row, key, "num", where)
    ncu = _need(t, "ncu", "dict", path, optional=True)
    for variant, result in (ncu or {}).items():
        if not isinstance(result, dict):
            raise _Bad(f"{path}.ncu.{variant}: expected an object, got {_type_name(result)}")
        if "error" not in result:
            _need(result, "dram_bytes", "num", f"{path}.ncu.{variant}")


def _model(entry: Any, path: str) -> None:
    if not isinstance(entry, dict):
        raise _Bad(f"{path}: expected an object, got {_type_name(entry)}")
    _need(entry, "name", "str", path)
    if "error" in entry:
        _need(entry, "error", "str", path)
        return
    _need(entry, "dtype", "str", path)
    _need(entry, "batch", "int", path, optional=True)
    _need(entry, "seq_len", "int", path, optional=True)
    _need(entry, "fingerprint", "str", path)
    breakdown = _need(entry, "breakdown", "dict", path)
    if "error" in breakdown:
        _need(breakdown, "error", "str", f"{path}.breakdown")
    else:
        for variant in ("unfused", "fused"):
            _breakdown(breakdown.get(variant), f"{path}.breakdown.{variant}")
    traffic = _need(entry, "traffic", "dict", path)
    if "error" in traffic:
        _need(traffic, "error", "str", f"{path}.traffic")
    else:
        _traffic(traffic, f"{path}.traffic")
    for i, stage in enumerate(_need(entry, "stages", "list", path, optional=True) or []):
        if not isinstance(stage, dict):
            raise _Bad(f"{path}.stages[{i}]: expected an object, got {_type_name(stage)}")
        _need(stage, "stage", "str", f"{path}.stages[{i}]")
    for key in ("predictions", "measured"):
        for i, row in enumerate(_need(entry, key, "list", path, optional=True) or []):
            if not isinstance(row, dict) or not isinstance(row.get("id"), str):
                raise _Bad(f"{path}.{key}[{i}]: expected an object with a string 'id'")


def validate(data: Any, name: str = "teaching report") -> dict:
    """Check ``data`` against the schema; returns it, or raises ``ReportError`` (one line naming the field)."""
    if not isinstance(data, dict):
        raise ReportError(f"{name} is not a teaching report: it holds {_type_name(data)}, not an object")
    if data.get("schema") != SCHEMA:
        found = data.get("schema")
        raise ReportError(f"{name} is not a teaching report: its 'schema' is "
                          f"{repr(found) if found is not None else 'missing'}, not '{SCHEMA}'")
    version = data.get("version")
    if version != VERSION:
        raise ReportError(f"{name}: teaching report version {version!r} is not supported (this explorer reads "
                          f"version {VERSION})")
    try:
        _need(data, "command", "str", "")
        _need(data, "date_utc", "str", "")
        _need(data, "environment", "dict", "")
        _need(data, "ceilings", "dict", "")
        models = _need(data, "models", "list", "")
        if not models:
            raise _Bad("models: empty")
        for i, entry in enumerate(models):
            _model(entry, f"models[{i}]")
    except _Bad as bad:
        raise ReportError(f"{name} is not a valid teaching report: {bad}") from None
    return data


def is_teaching_report(data: Any) -> bool:
    """Whether a parsed JSON document says it is a teaching report (before validating it)."""
    return isinstance(data, dict) and data.get("schema") == SCHEMA


def load(source: bytes | str | os.PathLike, name: str | None = None) -> dict:
    """A validated teaching report from JSON bytes/text or a file path; raises ``ReportError`` (one line)."""
    if isinstance(source, (bytes, str)):
        what = name or "teaching report"
        data = parse_json(source, what, ReportError, max_bytes=MAX_BYTES)
    else:
        what = name or os.path.basename(str(source))
        data = read_json_file(source, what, ReportError, max_bytes=MAX_BYTES)
    return validate(data, what)


def model_entry(report: dict, name: str) -> dict | None:
    """The entry of model ``name`` in a validated report (None when it has none)."""
    return next((m for m in report.get("models", []) if m.get("name") == name), None)
