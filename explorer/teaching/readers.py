"""Reading the facts the teaching views need from a run report, whatever its shape.

A run report reaches the app as a typed ``explorer.report.Report`` (version 2),
as its ``to_dict()``, or as a version-1 dict (older saved files); the runtime
returns its parts as dataclasses (``ChainResult``, ``Stage``) or dicts. These
readers turn any of them into the few plain values the Learn page and the
teaching report use: each chain's measured times and gains, and the staged
table's rows.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from explorer.report import verdict_speedup


def as_plain(value: Any) -> Any:
    """Dataclasses and objects with ``to_dict`` as plain dicts (recursively through lists); others unchanged."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    if hasattr(value, "to_dict") and not isinstance(value, dict):
        return value.to_dict()
    if isinstance(value, (list, tuple)):
        return [as_plain(v) for v in value]
    return value


def _median(value: Any) -> float | None:
    if isinstance(value, dict):
        value = value.get("median")
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a and b else None


@dataclasses.dataclass(frozen=True)
class MeasuredChain:
    """A chain's measured times (ms, medians) and gains (unfused / fused), from a run report of either version."""

    id: str
    unfused_ms: float | None
    fused_ms: float | None
    speedup: float | None
    graph_speedup: float | None
    slower: bool | None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def chain_timing(c: Any) -> MeasuredChain | None:
    """One chain entry (version 1 dict, version 2 dict or ``ChainResult``) as a ``MeasuredChain``;
    None when it has no timings."""
    c = as_plain(c)
    if not isinstance(c, dict) or "id" not in c:
        return None
    if "unfused_ms" in c:  # version 1
        u, f = _median(c.get("unfused_ms")), _median(c.get("fused_ms"))
        ug, fg = _median(c.get("unfused_graph_ms")), _median(c.get("fused_graph_ms"))
        slower = c.get("slower")
    else:  # version 2: latencies as {median, p20, p80, reps}, the decision in a verdict
        u, f = _median(c.get("unfused")), _median(c.get("fused"))
        verdict = c.get("verdict")
        slower = (verdict.get("label") == "slower") if isinstance(verdict, dict) else None
        if u is None or f is None:
            return None
        # the speed-ups are the verdicts' (the Hodges-Lehmann estimate of the paired ratios: ``explorer.stats``), as every
        # page shows them; synchronised calls, and CUDA-graph replays where measured
        plain = c.get("plain") if isinstance(c.get("plain"), dict) else verdict
        return MeasuredChain(str(c["id"]), u, f, verdict_speedup(plain), verdict_speedup(c.get("graph")),
                             bool(slower) if slower is not None else None)
    if u is None or f is None:
        return None
    return MeasuredChain(str(c["id"]), u, f, _ratio(u, f), _ratio(ug, fg),
                         bool(slower) if slower is not None else None)


def measured_chains(report: Any) -> dict[str, MeasuredChain]:
    """{chain id: MeasuredChain} of a run report (or of a list of chain entries); chains without timings
    are left out."""
    if report is None:
        return {}
    plain = as_plain(report)
    entries = plain if isinstance(plain, list) else (plain.get("chains") or [])
    out = {}
    for entry in entries:
        got = chain_timing(entry)
        if got is not None:
            out[got.id] = got
    return out


def stage_rows(stages: Any) -> list[dict[str, Any]]:
    """The staged table as plain rows {stage, label, latency_ms, p20, p80, throughput, peak_memory_bytes,
    same_as}, from version 1 dicts, version 2 dicts or ``Stage`` objects."""
    rows = []
    for s in as_plain(list(stages or [])):
        if not isinstance(s, dict) or "stage" not in s:
            continue
        lat = s.get("latency_ms") if "latency_ms" in s else s.get("latency")
        lat = lat if isinstance(lat, dict) else {}
        rows.append({"stage": str(s["stage"]), "label": str(s.get("label") or s["stage"]),
                     "latency_ms": _median(lat), "p20": _median({"median": lat.get("p20")}),
                     "p80": _median({"median": lat.get("p80")}), "throughput": s.get("throughput"),
                     "peak_memory_bytes": s.get("peak_memory_bytes"), "same_as": s.get("same_as")})
    return rows


def report_stages(report: Any) -> list[dict[str, Any]]:
    """``stage_rows`` of a run report of either version."""
    if report is None:
        return []
    plain = as_plain(report)
    return stage_rows(plain.get("stages") if isinstance(plain, dict) else [])


def report_fingerprint(report: Any) -> str | None:
    """The graph fingerprint a run report was measured on (its plan's, or its model's)."""
    plain = as_plain(report)
    if not isinstance(plain, dict):
        return None
    for section in ("plan", "model"):
        value = plain.get(section)
        if isinstance(value, dict) and value.get("fingerprint"):
            return str(value["fingerprint"])
    return None


def report_dtype(report: Any) -> str | None:
    """The dtype a run report was measured in."""
    plain = as_plain(report)
    settings = plain.get("settings") if isinstance(plain, dict) else None
    return str(settings.get("dtype")) if isinstance(settings, dict) and settings.get("dtype") else None
