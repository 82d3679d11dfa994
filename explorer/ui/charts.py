"""Plotly figures and tables of a run report (the JSON of ``explorer.gpu_runner.run``).

Every function here is pure: it takes the report dict (or a part of it) and
returns a ``plotly.graph_objects.Figure`` or a list of row dicts. Missing
numbers (``None``: peak memory on a CPU run, a chain that failed) are shown
as "not measured", never as zero.

    report["unfused"|"fused"] -> comparison_figure(report)      latency with p20-p80 bars, throughput,
                                                                  peak memory, launches, bytes moved
    report["chains"]          -> chain_speedup_figure(report)   sorted; slower chains in SLOWER_COLOR
                                 chain_precision_figure(report)
    report["stages"]          -> stages_figure(report), stages_rows(report)  (the seed's staged table)
"""

from __future__ import annotations

import math

from typing import Any

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from explorer.fusions import BY_NAME, color_of

UNFUSED_COLOR = "#8c8c8c"
FUSED_COLOR = "#1f77b4"
SLOWER_COLOR = "#e8000b"        # chains that got slower: their own colour, whatever the pattern
VARIANTS = (("unfused", "unfused", UNFUSED_COLOR), ("fused", "fused", FUSED_COLOR))

METRICS = (
    # key in the variant dict, title, unit, scale
    ("latency_ms", "Latency (median, p20-p80)", "ms", 1.0),
    ("throughput", "Throughput", "items/s", 1.0),
    ("peak_memory_bytes", "Peak memory", "MiB", 1 / 2**20),
    ("kernel_launches", "Kernel launches", "count", 1.0),
    ("bytes_moved", "Bytes moved (model)", "MiB", 1 / 2**20),
)


def _num(v: Any) -> float | None:
    if isinstance(v, bool) or v is None:
        return None
    if isinstance(v, (int, float)):
        return float(v)
    if isinstance(v, dict):  # e.g. {"median": ...}
        return _num(v.get("median", v.get("value", v.get("count"))))
    return None


def _latency(d: dict | None) -> tuple[float | None, float | None, float | None]:
    lat = (d or {}).get("latency_ms") or {}
    if not isinstance(lat, dict):
        return _num(lat), None, None
    return _num(lat.get("median")), _num(lat.get("p20")), _num(lat.get("p80"))


def device_caption(report: dict) -> str:
    """One line: where these numbers come from."""
    env = report.get("environment") or {}
    where = env.get("device_name") or env.get("device") or "?"
    parts = [f"device: {where}"]
    if env.get("is_cpu"):
        parts.append("CPU numbers (no GPU here)")
    settings = report.get("settings") or {}
    for key in ("dtype", "batch", "seq_len"):
        if settings.get(key) is not None:
            parts.append(f"{key} {settings[key]}")
    if env.get("torch"):
        parts.append(f"torch {env['torch']}")
    if env.get("note"):
        parts.append(str(env["note"]))
    return " · ".join(parts)


def comparison_figure(report: dict) -> go.Figure:
    """Unfused vs fused side by side, one panel per metric (latency has p20-p80 error bars)."""
    fig = make_subplots(rows=1, cols=len(METRICS), subplot_titles=[m[1] for m in METRICS],
                        horizontal_spacing=0.06)
    for col, (key, _title, unit, scale) in enumerate(METRICS, start=1):
        for variant, name, color in VARIANTS:
            d = report.get(variant) or {}
            if key == "latency_ms":
                med, p20, p80 = _latency(d)
                y = med
                err = None
                if med is not None and p20 is not None and p80 is not None:
                    err = dict(type="data", symmetric=False, array=[max(p80 - med, 0)],
                               arrayminus=[max(med - p20, 0)], thickness=1.5, width=6)
                hover = (f"{name}: median {med:.3f} ms (p20 {p20:.3f}, p80 {p80:.3f})"
                         if None not in (med, p20, p80) else f"{name}: {med}")
            else:
                raw = _num(d.get(key))
                y = raw * scale if raw is not None else None
                err = None
                hover = f"{name}: {y:,.2f} {unit}" if y is not None else f"{name}: not measured"
            fig.add_trace(go.Bar(x=[name], y=[y if y is not None else 0], marker_color=color, name=name,
                                 error_y=err, hovertext=[hover], hoverinfo="text",
                                 text=["n/a" if y is None else _short(y)], textposition="outside",
                                 showlegend=col == 1), row=1, col=col)
        fig.update_yaxes(title_text=unit, row=1, col=col, rangemode="tozero")
    fig.update_layout(height=360, margin=dict(l=40, r=10, t=60, b=30), barmode="group",
                      legend=dict(orientation="h", y=-0.12))
    return fig


def _short(v: float) -> str:
    if abs(v) >= 1e6:
        return f"{v / 1e6:.2f}M"
    if abs(v) >= 1e3:
        return f"{v / 1e3:.1f}k"
    if abs(v) >= 10:
        return f"{v:.0f}"
    return f"{v:.3g}"


def summary_rows(report: dict) -> list[dict[str, Any]]:
    """Rows (metric, unfused, fused, change) for the headline table."""
    rows = []
    for key, title, unit, scale in METRICS:
        if key == "latency_ms":
            u, f = _latency(report.get("unfused"))[0], _latency(report.get("fused"))[0]
        else:
            u, f = _num((report.get("unfused") or {}).get(key)), _num((report.get("fused") or {}).get(key))
            u = u * scale if u is not None else None
            f = f * scale if f is not None else None
        change = (f / u) if (u and f is not None) else None
        rows.append({"metric": f"{title.split(' (')[0]} ({unit})", "unfused": u, "fused": f,
                     "fused / unfused": change})
    return rows


PRECISION_KEYS = ("max_abs", "max_rel", "rel_l2", "cosine", "top1_agreement")


def precision_rows(report: dict) -> list[dict[str, Any]]:
    """Model-output errors: each model against float64, and the fused model against the unfused one."""
    unfused = report.get("unfused") or {}
    fused = report.get("fused") or {}
    ref = report.get("reference") or {}
    sources = (
        ("unfused model vs float64 (its own rounding)", unfused.get("precision") or ref.get("unfused")),
        ("fused model vs float64", fused.get("precision") or ref.get("fused")),
        ("fused vs unfused model", fused.get("precision_vs_unfused")),
    )
    rows = []
    for label, prec in sources:
        if not isinstance(prec, dict):
            continue
        rows.append({"comparison": label, **{k: _num(prec.get(k)) for k in PRECISION_KEYS}})
    return rows


def _chains(report: dict) -> list[dict]:
    return [c for c in (report.get("chains") or []) if isinstance(c, dict)]


def chain_rows(report: dict) -> list[dict[str, Any]]:
    """Per-chain table rows, fastest speed-up first.

    Reports measured on CUDA also time each chain replayed as a CUDA graph (no launch or
    host overhead); their rows get that speed-up too, as "speed-up, CUDA graph". When the
    plan chose a kernel for some chain, a "kernel" column says which each chain ran.
    """
    chains = _chains(report)
    graphs = any(_num(c.get("graph_speedup")) is not None for c in chains)
    chosen = any(c.get("kernel", "auto") != "auto" for c in chains)
    rows = []
    for c in chains:
        row = {"chain": c.get("id"), "pattern": BY_NAME[c["pattern"]].label if c.get("pattern") in BY_NAME
               else c.get("pattern"), "status": c.get("status")}
        if chosen:  # the plan chose kernels: say which each chain ran
            row["kernel"] = c.get("kernel", "auto")
        row["speed-up"] = _num(c.get("speedup"))
        if graphs:
            row["speed-up, CUDA graph"] = _num(c.get("graph_speedup"))
        row.update({"unfused ms": _num(c.get("unfused_ms")), "fused ms": _num(c.get("fused_ms")),
                    "launches": f"{c.get('launches_unfused')} → {c.get('launches_fused')}",
                    "max abs err": _num(c.get("max_abs")), "rel err": _num(c.get("rel_err")),
                    "slower": bool(c.get("slower")), "reason": c.get("reason") or ""})
        rows.append(row)
    rows.sort(key=lambda r: -(r["speed-up"] or 0))
    return rows


def slower_where(report: dict) -> dict[str, list[str]]:
    """Which chains got slower, split by what limits them (from the runner's two timings of each).

    ``host``: slower as plain calls but not as a CUDA graph: the fused call costs the host
    more than the launches it saves (the GPU work itself did not get slower).
    ``gpu``: slower even replayed as a CUDA graph: the fused kernel is slower on the GPU.
    ``unknown``: slower, with no CUDA-graph timing to tell (CPU runs).
    """
    out: dict[str, list[str]] = {"host": [], "gpu": [], "unknown": []}
    for c in _chains(report):
        cid = str(c.get("id"))
        if c.get("slower_in_graph"):
            out["gpu"].append(cid)
        elif c.get("slower"):
            out["host" if _num(c.get("graph_speedup")) is not None else "unknown"].append(cid)
    return out


def chain_speedup_figure(report: dict) -> go.Figure:
    """Horizontal bars of per-chain speed-up (unfused/fused time), sorted; slower ones stand out."""
    measured = [c for c in _chains(report) if _num(c.get("speedup")) is not None]
    measured.sort(key=lambda c: _num(c.get("speedup")))
    ids = [c.get("id", "?") for c in measured]
    speed = [_num(c.get("speedup")) for c in measured]
    slower = [bool(c.get("slower")) or (s is not None and s < 1.0) for c, s in zip(measured, speed)]
    colors = [SLOWER_COLOR if s else color_of(c.get("pattern", "")) for c, s in zip(measured, slower)]
    hover = [f"{c.get('id')}<br>{c.get('pattern')}: {c.get('unfused_ms')} ms → {c.get('fused_ms')} ms"
             f"<br>speed-up {s:.2f}x" + ("<br><b>slower after fusion</b>" if sl else "")
             + (f"<br>as a CUDA graph {_num(c.get('graph_speedup')):.2f}x"
                if _num(c.get("graph_speedup")) is not None else "")
             for c, s, sl in zip(measured, speed, slower)]
    fig = go.Figure(go.Bar(x=speed, y=ids, orientation="h", marker_color=colors, hovertext=hover,
                           hoverinfo="text", showlegend=False))
    fig.add_vline(x=1.0, line_dash="dash", line_color="#444",
                  annotation_text="no change", annotation_position="top")
    # legend entries: the patterns present, and "slower"
    for name in sorted({c.get("pattern") for c, sl in zip(measured, slower) if not sl}):
        label = BY_NAME[name].label if name in BY_NAME else str(name)
        fig.add_trace(go.Bar(x=[None], y=[None], marker_color=color_of(name or ""), name=label))
    if any(slower):
        fig.add_trace(go.Bar(x=[None], y=[None], marker_color=SLOWER_COLOR, name="slower after fusion"))
    fig.update_layout(title="Per-chain speed-up (unfused time / fused time)", xaxis_title="speed-up (x)",
                      height=max(300, 22 * len(ids) + 120), margin=dict(l=10, r=10, t=60, b=40),
                      yaxis=dict(automargin=True), legend=dict(orientation="h", y=-0.15 if ids else 0))
    if not ids:
        fig.add_annotation(text="no per-chain timings in this report", showarrow=False, x=0.5, y=0.5,
                           xref="paper", yref="paper")
    return fig


def chain_precision_figure(report: dict) -> go.Figure:
    """Per-chain max abs error of the fused chain against the unfused one (log scale)."""
    chains = [c for c in _chains(report) if _num(c.get("max_abs")) is not None]
    ids = [c.get("id", "?") for c in chains]
    vals = [max(_num(c.get("max_abs")), 1e-12) for c in chains]
    fig = go.Figure(go.Bar(x=ids, y=vals, marker_color=[color_of(c.get("pattern", "")) for c in chains],
                           hovertext=[f"{c.get('id')}: max abs {c.get('max_abs')}, rel {c.get('rel_err')}"
                                      for c in chains], hoverinfo="text"))
    # An explicit log range a decade either side of the data: plotly's autorange on a log axis
    # with one or two bars picks odd, unlabelled ticks.
    lo = math.floor(math.log10(min(vals))) - 1 if vals else -12
    hi = math.ceil(math.log10(max(vals))) + 1 if vals else 0
    fig.update_layout(title="Per-chain max abs error (fused vs unfused chain)",
                      yaxis=dict(type="log", range=[lo, hi], exponentformat="power", dtick=1),
                      yaxis_title="max |fused - unfused|", height=340, margin=dict(l=40, r=10, t=60, b=40),
                      xaxis=dict(showticklabels=len(ids) <= 30))
    return fig


def stages_rows(report: dict) -> list[dict[str, Any]]:
    """The seed's staged table: latency, throughput, memory and speed-up per fusion level."""
    stages = [s for s in (report.get("stages") or []) if isinstance(s, dict)]
    base = _latency(stages[0])[0] if stages else None
    rows = []
    for s in stages:
        med, p20, p80 = _latency(s)
        mem = _num(s.get("peak_memory_bytes"))
        rows.append({"stage": s.get("label") or s.get("stage"), "latency ms (median)": med,
                     "p20": p20, "p80": p80, "throughput /s": _num(s.get("throughput")),
                     "memory MiB": mem / 2**20 if mem is not None else None,
                     "speed-up": (base / med) if (base and med) else None})
    return rows


def stages_figure(report: dict) -> go.Figure:
    """Latency per fusion level (bars with p20-p80) and throughput (line, right axis)."""
    rows = stages_rows(report)
    labels = [str(r["stage"]) for r in rows]
    fig = make_subplots(specs=[[{"secondary_y": True}]])
    med = [r["latency ms (median)"] for r in rows]
    err = dict(type="data", symmetric=False,
               array=[(r["p80"] - r["latency ms (median)"]) if None not in (r["p80"], r["latency ms (median)"])
                      else 0 for r in rows],
               arrayminus=[(r["latency ms (median)"] - r["p20"]) if None not in (r["p20"], r["latency ms (median)"])
                           else 0 for r in rows])
    palette = ["#8c8c8c", "#ff7f0e", "#2ca02c", "#1f77b4"]
    fig.add_trace(go.Bar(x=labels, y=med, error_y=err, name="latency (ms)",
                         marker_color=[palette[i % len(palette)] for i in range(len(rows))]),
                  secondary_y=False)
    fig.add_trace(go.Scatter(x=labels, y=[r["throughput /s"] for r in rows], name="throughput (/s)",
                             mode="lines+markers", line=dict(color="#111111")), secondary_y=True)
    fig.update_yaxes(title_text="latency (ms)", secondary_y=False, rangemode="tozero")
    fig.update_yaxes(title_text="throughput (/s)", secondary_y=True, rangemode="tozero")
    fig.update_layout(title="Staged fusion (the seed's table): none → Conv+BN → +activation → all",
                      height=380, margin=dict(l=40, r=40, t=60, b=40), legend=dict(orientation="h", y=-0.15))
    if not rows:
        fig.add_annotation(text="no staged timings in this report", showarrow=False, x=0.5, y=0.5,
                           xref="paper", yref="paper")
    return fig
