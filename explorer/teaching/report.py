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
VARIANTS = ("unfused", "fused")
#: The words of a chain's bound, of why a prediction missed, and of why DRAM bytes differ from the model's.
BOUNDS = ("memory", "compute")
WHYS = ("close", "compute_bound", "host_bound", "l2_resident", "slower_kernel", "unexplained")
REASONS = ("l2", "rereads")


class _Bad(Exception):
    """A field that does not fit the schema: the message is ``path: what is wrong``."""


def _type_name(value: Any) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean", type(None): "null"}.get(
        type(value), "a number" if isinstance(value, (int, float)) else type(value).__name__)


#: The largest integer a field may hold (64-bit signed, as elsewhere).
MAX_INT = 2**63 - 1
_EXPECTED = {"str": "a string", "int": "an integer", "num": "a number", "dict": "an object", "list": "a list",
             "bool": "a boolean"}


def _need(data: dict, key: str, kind: str, path: str, optional: bool = False, minimum: float | None = None,
          one_of: tuple | None = None) -> Any:
    """``data[key]`` when it is of ``kind`` (str, int, num, dict, list, bool) and in range; raises ``_Bad``.

    A number ("num") is an int or float within float range and finite; an "int" is within 64 bits;
    ``minimum`` bounds numbers from below, ``one_of`` lists the words a string may be. ``optional``
    accepts a missing key or null (returns None)."""
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
        raise _Bad(f"{where}: expected {_EXPECTED[kind]}, got {_type_name(value)}")
    if kind == "int" and not -MAX_INT <= value <= MAX_INT:
        raise _Bad(f"{where}: an integer of more than 64 bits")
    if kind == "num":
        try:
            finite = math.isfinite(float(value))
        except OverflowError:
            finite = False
        if not finite:
            raise _Bad(f"{where}: not a finite number")
    if minimum is not None and kind in ("int", "num") and value < minimum:
        raise _Bad(f"{where}: {value:.6g} is below {minimum:g}")
    if one_of is not None and value not in one_of:
        raise _Bad(f"{where}: {str(value)[:40]!r} is not one of {', '.join(one_of)}")
    return value


def _texts(data: dict, key: str, path: str, one_of: tuple | None = None) -> None:
    """An optional list of strings (``one_of`` the words they may be)."""
    for i, item in enumerate(_need(data, key, "list", path, optional=True) or []):
        if not isinstance(item, str):
            raise _Bad(f"{path}.{key}[{i}]: expected a string, got {_type_name(item)}")
        if one_of is not None and item not in one_of:
            raise _Bad(f"{path}.{key}[{i}]: {item[:40]!r} is not one of {', '.join(one_of)}")


def _rows(data: dict, key: str, path: str, check) -> None:
    """An optional list of objects, each checked by ``check(row, where)``."""
    for i, row in enumerate(_need(data, key, "list", path, optional=True) or []):
        where = f"{path}.{key}[{i}]"
        if not isinstance(row, dict):
            raise _Bad(f"{where}: expected an object, got {_type_name(row)}")
        check(row, where)


def _variants(data: dict, path: str) -> None:
    unknown = sorted(set(data) - set(VARIANTS))
    if unknown:
        raise _Bad(f"{path}.{unknown[0][:40]}: not a variant ({', '.join(VARIANTS)})")


def _breakdown(b: Any, path: str) -> None:
    if not isinstance(b, dict):
        raise _Bad(f"{path}: expected an object, got {_type_name(b)}")
    wall = _need(b, "wall_ms", "num", path, minimum=0)
    _need(b, "busy_ms", "num", path, minimum=0)
    _need(b, "is_cpu", "bool", path)
    _need(b, "kernels", "int", path, minimum=0)
    _need(b, "ridge", "num", path, optional=True, minimum=0)
    for key in ("wall_p20_ms", "wall_p80_ms"):
        _need(b, key, "num", path, optional=True, minimum=0)
    cats = _need(b, "categories_ms", "dict", path)
    for c in CATEGORIES:
        _need(cats, c, "num", f"{path}.categories_ms", minimum=0)
    total = sum(float(cats[c]) for c in CATEGORIES)
    if abs(total - wall) > 1e-6 * max(1.0, abs(wall)):
        raise _Bad(f"{path}.categories_ms: they add up to {total:.6g} ms, not the wall time {wall:.6g} ms")
    _texts(b, "notes", path)

    def top(row: dict, where: str) -> None:
        _need(row, "node", "str", where, optional=True)
        _need(row, "kernel", "str", where)
        _need(row, "category", "str", where, one_of=CATEGORIES)
        _need(row, "us", "num", where, minimum=0)
        _need(row, "intensity", "num", where, optional=True, minimum=0)
    _rows(b, "top", path, top)


def _traffic(t: Any, path: str) -> None:
    if not isinstance(t, dict):
        raise _Bad(f"{path}: expected an object, got {_type_name(t)}")
    total = _need(t, "total", "dict", path)
    for key in ("bytes_unfused", "bytes_fused", "bytes_saved"):
        _need(total, key, "num", f"{path}.total", minimum=0 if key != "bytes_saved" else None)
    _need(t, "chains", "list", path)
    _need(t, "note", "str", path, optional=True)

    def chain(row: dict, where: str) -> None:
        _need(row, "id", "str", where)
        _need(row, "title", "str", where, optional=True)
        _need(row, "pattern", "str", where)
        for key in ("bytes_unfused", "bytes_fused"):
            _need(row, key, "num", where, minimum=0)
        _need(row, "bytes_saved", "num", where)
    _rows(t, "chains", path, chain)
    ncu = _need(t, "ncu", "dict", path, optional=True)
    _variants(ncu or {}, f"{path}.ncu")
    for variant, result in (ncu or {}).items():
        if not isinstance(result, dict):
            raise _Bad(f"{path}.ncu.{variant}: expected an object, got {_type_name(result)}")
        if "error" in result:
            _need(result, "error", "str", f"{path}.ncu.{variant}")
        else:
            _need(result, "dram_bytes", "num", f"{path}.ncu.{variant}", minimum=0)
    explained = _need(t, "explained", "dict", path, optional=True)
    _variants(explained or {}, f"{path}.explained")
    for variant, ex in (explained or {}).items():
        where = f"{path}.explained.{variant}"
        if not isinstance(ex, dict):
            raise _Bad(f"{where}: expected an object, got {_type_name(ex)}")
        for key in ("model_bytes", "dram_bytes"):
            _need(ex, key, "num", where, minimum=0)
        _need(ex, "ratio", "num", where, optional=True, minimum=0)
        _need(ex, "l2_bytes", "num", where, optional=True, minimum=0)
        _need(ex, "reasons", "list", where)
        _texts(ex, "reasons", where, one_of=REASONS)


def _stage(row: dict, where: str) -> None:
    _need(row, "stage", "str", where)
    _need(row, "label", "str", where, optional=True)
    _need(row, "same_as", "str", where, optional=True)
    _need(row, "latency_ms", "num", where, optional=True, minimum=0)
    for key in ("p20", "p80", "throughput"):
        _need(row, key, "num", where, optional=True, minimum=0)
    _need(row, "peak_memory_bytes", "num", where, optional=True, minimum=0)


def _comparison(row: dict, where: str) -> None:
    _need(row, "id", "str", where)
    _need(row, "title", "str", where)
    _need(row, "pattern", "str", where, optional=True)
    for key in ("predicted", "measured", "measured_graph", "intensity", "far"):
        _need(row, key, "num", where, optional=True)
    _need(row, "bound", "str", where, optional=True, one_of=BOUNDS)
    _need(row, "why", "str", where, optional=True, one_of=WHYS)


def _prediction(row: dict, where: str) -> None:
    _need(row, "id", "str", where)
    _need(row, "title", "str", where)
    _need(row, "pattern", "str", where, optional=True)
    for key, value in row.items():
        if key not in ("id", "title", "pattern", "bound"):
            _need(row, key, "num", where, optional=True)
    _need(row, "bound", "str", where, optional=True, one_of=BOUNDS)


def _measured(row: dict, where: str) -> None:
    _need(row, "id", "str", where)
    for key in ("unfused_ms", "fused_ms", "speedup", "graph_speedup"):
        _need(row, key, "num", where, optional=True, minimum=0)
    _need(row, "slower", "bool", where, optional=True)


def _model(entry: Any, path: str) -> None:
    if not isinstance(entry, dict):
        raise _Bad(f"{path}: expected an object, got {_type_name(entry)}")
    _need(entry, "name", "str", path)
    _texts(entry, "notes", path)
    if "error" in entry:
        _need(entry, "error", "str", path)
        return
    _need(entry, "dtype", "str", path)
    _need(entry, "memory_format", "str", path, optional=True)
    _need(entry, "batch", "int", path, optional=True, minimum=1)
    _need(entry, "seq_len", "int", path, optional=True, minimum=1)
    _need(entry, "chains_fused", "int", path, optional=True, minimum=0)
    _need(entry, "chains_detected", "int", path, optional=True, minimum=0)
    _need(entry, "fingerprint", "str", path)
    breakdown = _need(entry, "breakdown", "dict", path)
    if "error" in breakdown:
        _need(breakdown, "error", "str", f"{path}.breakdown")
    else:
        _variants(breakdown, f"{path}.breakdown")
        for variant in VARIANTS:
            _breakdown(breakdown.get(variant), f"{path}.breakdown.{variant}")
    traffic = _need(entry, "traffic", "dict", path)
    if "error" in traffic:
        _need(traffic, "error", "str", f"{path}.traffic")
    else:
        _traffic(traffic, f"{path}.traffic")
    _rows(entry, "stages", path, _stage)
    _rows(entry, "comparison", path, _comparison)
    _rows(entry, "predictions", path, _prediction)
    _rows(entry, "measured", path, _measured)


def _environment(env: dict) -> None:
    for key, value in env.items():
        if value is not None and not isinstance(value, (str, int, float, bool)):
            raise _Bad(f"environment.{key[:40]}: expected a string, number or boolean, got {_type_name(value)}")
    _need(env, "is_cpu", "bool", "environment", optional=True)


def _ceilings(c: dict) -> None:
    _need(c, "device_name", "str", "ceilings", optional=True)  # {} records no ceilings
    _need(c, "bandwidth", "num", "ceilings", optional=True, minimum=0)
    _need(c, "l2_bytes", "int", "ceilings", optional=True, minimum=0)
    _need(c, "launch_us", "num", "ceilings", optional=True, minimum=0)
    _need(c, "measured", "bool", "ceilings", optional=True)
    flops = _need(c, "flops", "dict", "ceilings", optional=True) or {}
    for key in flops:
        _need(flops, key, "num", "ceilings.flops", minimum=0)
    sources = _need(c, "sources", "dict", "ceilings", optional=True) or {}
    for key in sources:
        _need(sources, key, "str", "ceilings.sources")


def validate(data: Any, name: str = "teaching report") -> dict:
    """Check ``data`` against the schema; returns it, or raises ``ReportError`` (one line naming the field).

    Every field a reader uses is checked for its type and range before anything reads it: numbers
    finite and within float range (never negative where a time, size or count is meant), integers
    within 64 bits, the words of fixed vocabularies (categories, bounds, reasons) among their words."""
    if not isinstance(data, dict):
        raise ReportError(f"{name} is not a teaching report: it holds {_type_name(data)}, not an object")
    if data.get("schema") != SCHEMA:
        found = data.get("schema")
        raise ReportError(f"{name} is not a teaching report: its 'schema' is "
                          f"{repr(found)[:60] if found is not None else 'missing'}, not '{SCHEMA}'")
    version = data.get("version")
    if isinstance(version, bool) or version != VERSION:
        raise ReportError(f"{name}: teaching report version {repr(version)[:40]} is not supported (this explorer "
                          f"reads version {VERSION})")
    try:
        _need(data, "command", "str", "")
        _need(data, "date_utc", "str", "")
        _need(data, "label", "str", "", optional=True)
        _environment(_need(data, "environment", "dict", ""))
        _ceilings(_need(data, "ceilings", "dict", ""))
        _texts(data, "notes", "")
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
