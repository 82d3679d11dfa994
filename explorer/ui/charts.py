"""Plotly figures and tables of a typed run report (``explorer.report.Report``).

Every function here is pure: it takes the report and returns a
``plotly.graph_objects.Figure`` or a list of row dicts. Missing numbers (peak
memory on a CPU run, a chain that was not timed) are shown as "not measured",
never as zero. Verdicts are read from the report's one field
(``ChainResult.verdict``, ``Baseline.verdict``), never recomputed here.

    report.unfused/fused/baselines -> comparison_figure, summary_rows, baseline_rows
    report.chains                  -> chain_rows, chain_speedup_figure (bars coloured by verdict),
                                      chain_precision_figure
    report.stages                  -> stages_rows, stages_figure (the seed's staged table)
"""

from __future__ import annotations

import math
from typing import Any

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from explorer.fusions import BY_NAME, color_of
from explorer.report import (FASTER, GPU, HOST, NO_KERNEL, NOT_MEASURED, SAME, SLOWER, Latency, Measurement,
                             Report)

UNFUSED_COLOR = "#8c8c8c"
FUSED_COLOR = "#1f77b4"
BASELINE_COLORS = {"eager": "#bcbcbc", "torch.compile": "#6f4e7c", "fused": FUSED_COLOR}
#: Chains that got slower: near-black with a cross-hatch, a colour no pattern uses (tests check the distance).
SLOWER_COLOR = "#141414"
SLOWER_PATTERN = "x"
#: Chains with no fused kernel on the device: light grey, diagonal hatch.
NO_KERNEL_COLOR = "#d9d9d9"
NO_KERNEL_PATTERN = "/"
SAME_OPACITY = 0.4
VERDICT_NAMES = {FASTER: "faster", SLOWER: "slower after fusion", SAME: "no significant difference",
                 NO_KERNEL: "no fused kernel here", NOT_MEASURED: "not measured"}

METRICS = (
    # attribute of Measurement, title, unit, scale
    ("latency", "Latency (median, p20-p80)", "ms", 1.0),
    ("throughput", "Throughput", "items/s", 1.0),
    ("peak_memory_bytes", "Peak memory", "MiB", 1 / 2**20),
    ("kernel_launches", "Kernel launches", "count", 1.0),
    ("bytes_moved", "Bytes moved (model)", "MiB", 1 / 2**20),
)


def _value(m: Measurement | None, key: str, scale: float = 1.0) -> float | None:
    if m is None:
        return None
    if key == "latency":
        return m.latency.median if m.latency else None
    v = getattr(m, key)
    return None if v is None else float(v) * scale


def device_caption(report: Report) -> str:
    """One line: where these numbers come from."""
    env = report.environment
    parts = [f"device: {env.device_name or env.device}"]
    if env.is_cpu:
        parts.append("CPU numbers (no GPU here)")
    for key in ("dtype", "batch", "seq_len"):
        if report.settings.get(key) is not None:
            parts.append(f"{key} {report.settings[key]}")
    if report.settings.get("quick"):
        parts.append("quick mode")
    if env.torch:
        parts.append(f"torch {env.torch}")
    if env.note:
        parts.append(env.note)
    return " · ".join(parts)


def compared(report: Report) -> list[tuple[str, Measurement, str]]:
    """(label, measurement, colour) of every whole-model variant: unfused, fused, then each measured baseline
    (eager, torch.compile modes, CUDA-graph variants) as bars of their own."""
    out = [("unfused", report.unfused, UNFUSED_COLOR), ("fused", report.fused, FUSED_COLOR)]
    for b in report.baselines:
        if b.measurement is not None and b.method != "fused":
            out.append((b.label, b.measurement, BASELINE_COLORS.get(b.method, "#999999")))
    graphs = report.baseline("fused_cuda_graphs")
    if graphs is not None and graphs.measurement is not None and not report.fused.cuda_graph:
        out.append((graphs.label, graphs.measurement, "#0b3f66"))
    return out


def comparison_figure(report: Report) -> go.Figure:
    """Unfused, fused and every baseline side by side, one panel per metric (latency with p20-p80 bars)."""
    fig = make_subplots(rows=1, cols=len(METRICS), subplot_titles=[m[1] for m in METRICS], horizontal_spacing=0.06)
    bars = compared(report)
    for col, (key, _title, unit, scale) in enumerate(METRICS, start=1):
        for name, meas, color in bars:
            err = None
            if key == "latency":
                lat = meas.latency
                y = lat.median if lat else None
                if lat is not None:
                    err = dict(type="data", symmetric=False, array=[max(lat.p80 - lat.median, 0)],
                               arrayminus=[max(lat.median - lat.p20, 0)], thickness=1.5, width=6)
                hover = (f"{name}: median {lat.median:.3f} ms (p20 {lat.p20:.3f}, p80 {lat.p80:.3f})"
                         if lat else f"{name}: not measured")
            else:
                y = _value(meas, key, scale)
                hover = f"{name}: {y:,.2f} {unit}" if y is not None else f"{name}: not measured"
            fig.add_trace(go.Bar(x=[name], y=[y if y is not None else 0], marker_color=color, name=name,
                                 error_y=err, hovertext=[hover], hoverinfo="text",
                                 text=["n/a" if y is None else _short(y)], textposition="outside",
                                 showlegend=col == 1), row=1, col=col)
        fig.update_yaxes(title_text=unit, row=1, col=col, rangemode="tozero")
        fig.update_xaxes(showticklabels=False, row=1, col=col)
    fig.update_layout(height=380, margin=dict(l=40, r=10, t=60, b=30), barmode="group",
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


def summary_rows(report: Report) -> list[dict[str, Any]]:
    """Rows (metric, unfused, fused, fused / unfused) for the headline table, then the verdict."""
    rows = []
    for key, title, unit, scale in METRICS:
        u, f = _value(report.unfused, key, scale), _value(report.fused, key, scale)
        rows.append({"metric": f"{title.split(' (')[0]} ({unit})", "unfused": u, "fused": f,
                     "fused / unfused": (f / u) if (u and f is not None) else None})
    return rows


def verdict_text(report: Report) -> str:
    """The whole-model verdict in one line (a test over paired rounds)."""
    return f"Fused against unfused: {report.verdict.describe()}" + (f" — {report.verdict.note}" if report.verdict.note else "")


def baseline_rows(report: Report) -> list[dict[str, Any]]:
    """One row per way of running the model (fused entries and baselines), like with like: each baseline
    says which fused entry it is compared with and that comparison's verdict."""
    rows = []
    for b in report.baselines:
        m = b.measurement
        lat = m.latency if m else None
        rows.append({
            "variant": b.label, "method": b.method, "mode": b.mode or "", "CUDA graphs": b.cuda_graphs,
            "memory format": b.memory_format,
            "median ms": lat.median if lat else None, "p20": lat.p20 if lat else None, "p80": lat.p80 if lat else None,
            "kernels": m.kernel_launches if m else None,
            "GPU busy ms": m.gpu_busy_ms if m else None,
            "rel_l2 vs float64": m.precision.rel_l2 if m and m.precision else None,
            "compile s": b.compile_s,
            "compared with": b.pairs_with or "",
            "fused speed-up": b.verdict.speedup if b.verdict else None,
            "verdict (fused vs this)": b.verdict.label if b.verdict else (b.error or ""),
        })
    return rows


PRECISION_KEYS = ("max_abs", "max_rel", "rel_l2", "cosine", "top1_agreement")


def precision_rows(report: Report) -> list[dict[str, Any]]:
    """Model-output errors: each model against float64, and the fused model against the unfused one.
    Where relative figures were refused (a degenerate reference), the row says why."""
    rows = []
    for label, prec in (("unfused model vs float64 (its own rounding)", report.unfused.precision),
                        ("fused model vs float64", report.fused.precision),
                        ("fused vs unfused model", report.fused_vs_unfused)):
        if prec is None:
            continue
        rows.append({"comparison": label, **{k: getattr(prec, k) for k in PRECISION_KEYS},
                     "why no relative figures": prec.refused or ""})
    return rows


def chain_rows(report: Report) -> list[dict[str, Any]]:
    """Per-chain table rows, fastest speed-up first, each with its verdict (label, 95% interval, p-value).

    Reports measured on CUDA also time each chain replayed as a CUDA graph; their rows get that
    speed-up too ("speed-up, CUDA graph"). When the plan chose a kernel for some chain, a "kernel"
    column says which each chain ran.
    """
    graphs = any(c.graph_speedup is not None for c in report.chains)
    chosen = any(c.kernel != "auto" for c in report.chains)
    rows = []
    for c in report.chains:
        v = c.verdict
        row: dict[str, Any] = {"chain": c.title, "id": c.id,
                               "pattern": BY_NAME[c.pattern].label if c.pattern in BY_NAME else c.pattern,
                               "verdict": v.label}
        if chosen:
            row["kernel"] = c.kernel
        row["speed-up"] = c.speedup
        if graphs:
            row["speed-up, CUDA graph"] = c.graph_speedup
        row.update({
            "95% CI": (f"{1 / v.ci_high:.2f}–{1 / v.ci_low:.2f}x" if v.ci_low and v.ci_high else ""),
            "p": v.p_value, "rounds": v.n or None,
            "limited by": c.limited_by or "",
            "unfused ms": c.unfused.median if c.unfused else None, "fused ms": c.fused.median if c.fused else None,
            "launches": f"{c.launches_unfused} → {c.launches_fused}" if c.launches_unfused is not None else "",
            "max abs err": c.max_abs, "rel err": c.rel_err, "status": c.status,
            "note": "; ".join(x for x in (v.note, c.reason) if x)})
        rows.append(row)
    rows.sort(key=lambda r: -(r["speed-up"] or 0))
    return rows


def slower_where(report: Report) -> dict[str, list[str]]:
    """Which chains got slower, split by what limits them (the runner decided it once: ``limited_by``).

    ``host``: slower as plain calls but not as a CUDA graph; ``gpu``: slower even as CUDA graphs;
    ``unknown``: slower, with no CUDA-graph timing to tell (CPU runs).
    """
    host, gpu = report.limited_by(HOST), report.limited_by(GPU)
    unknown = [cid for cid in report.slower_chains if cid not in host and cid not in gpu]
    return {"host": host, "gpu": gpu, "unknown": unknown}


def bar_style(verdict: str, pattern: str) -> tuple[str, str, float]:
    """(colour, hatch shape, opacity) of a chain's bar: its pattern's colour when faster, faded when not
    significantly different, SLOWER_COLOR cross-hatched when slower, hatched grey without a fused kernel."""
    if verdict == SLOWER:
        return SLOWER_COLOR, SLOWER_PATTERN, 1.0
    if verdict == NO_KERNEL:
        return NO_KERNEL_COLOR, NO_KERNEL_PATTERN, 1.0
    if verdict == FASTER:
        return color_of(pattern), "", 1.0
    return color_of(pattern), "", SAME_OPACITY


def chain_speedup_figure(report: Report) -> go.Figure:
    """Horizontal bars of per-chain speed-up (unfused/fused time), sorted, styled by verdict."""
    measured = sorted((c for c in report.chains if c.speedup is not None), key=lambda c: c.speedup)
    styles = [bar_style(c.verdict.label, c.pattern) for c in measured]
    hover = [f"{c.title}<br>{c.id}<br>{BY_NAME[c.pattern].label if c.pattern in BY_NAME else c.pattern}: "
             f"{c.unfused.median:.4f} ms → {c.fused.median:.4f} ms<br>{c.verdict.describe()}"
             + (f"<br>as a CUDA graph {c.graph_speedup:.2f}x" if c.graph_speedup is not None else "")
             for c in measured]
    fig = go.Figure(go.Bar(x=[c.speedup for c in measured], y=[c.title for c in measured], orientation="h",
                           marker=dict(color=[s[0] for s in styles], pattern_shape=[s[1] for s in styles],
                                       opacity=[s[2] for s in styles]),
                           hovertext=hover, hoverinfo="text", showlegend=False))
    fig.add_vline(x=1.0, line_dash="dash", line_color="#444", annotation_text="no change", annotation_position="top")
    for name in sorted({c.pattern for c in measured if c.verdict.label in (FASTER, SAME)}):
        label = BY_NAME[name].label if name in BY_NAME else str(name)
        fig.add_trace(go.Bar(x=[None], y=[None], marker_color=color_of(name), name=label))
    for verdict in (SAME, SLOWER):
        if any(c.verdict.label == verdict for c in measured):
            color, shape, opacity = bar_style(verdict, "")
            fig.add_trace(go.Bar(x=[None], y=[None], name=VERDICT_NAMES[verdict],
                                 marker=dict(color=color if verdict == SLOWER else "#888888",
                                             pattern_shape=shape, opacity=opacity)))
    fig.update_layout(title="Per-chain speed-up (unfused time / fused time); colour = pattern, verdict by test",
                      xaxis_title="speed-up (x)", height=max(300, 22 * len(measured) + 120),
                      margin=dict(l=10, r=10, t=60, b=40), yaxis=dict(automargin=True),
                      legend=dict(orientation="h", y=-0.15 if measured else 0))
    if not measured:
        fig.add_annotation(text="no per-chain timings in this report", showarrow=False, x=0.5, y=0.5,
                           xref="paper", yref="paper")
    return fig


def chain_precision_figure(report: Report) -> go.Figure:
    """Per-chain max abs error of the fused chain against float64 (log scale)."""
    chains = [c for c in report.chains if c.max_abs is not None]
    vals = [max(float(c.max_abs), 1e-12) for c in chains]
    fig = go.Figure(go.Bar(x=[c.title for c in chains], y=vals, marker_color=[color_of(c.pattern) for c in chains],
                           hovertext=[f"{c.id}: max abs {c.max_abs}, rel {c.rel_err}" for c in chains],
                           hoverinfo="text"))
    # An explicit log range a decade either side of the data: plotly's autorange on a log axis
    # with one or two bars picks odd, unlabelled ticks.
    lo = math.floor(math.log10(min(vals))) - 1 if vals else -12
    hi = math.ceil(math.log10(max(vals))) + 1 if vals else 0
    fig.update_layout(title="Per-chain max abs error (fused chain vs float64)",
                      yaxis=dict(type="log", range=[lo, hi], exponentformat="power", dtick=1),
                      yaxis_title="max |fused - float64|", height=340, margin=dict(l=40, r=10, t=60, b=40),
                      xaxis=dict(showticklabels=len(chains) <= 30))
    return fig


def stages_rows(report: Report) -> list[dict[str, Any]]:
    """The seed's staged table, all four stages: latency, throughput, memory, speed-up over the original,
    and how each stage's graph differs from the previous one (or which stage it is identical to)."""
    first = next((s.latency for s in report.stages if s.latency is not None), None)
    rows = []
    for s in report.stages:
        lat: Latency | None = s.latency
        mem = s.peak_memory_bytes
        rows.append({"stage": s.label, "latency ms (median)": lat.median if lat else None,
                     "p20": lat.p20 if lat else None, "p80": lat.p80 if lat else None,
                     "throughput /s": s.throughput, "memory MiB": mem / 2**20 if mem is not None else None,
                     "speed-up": (first.median / lat.median) if (first and lat) else None,
                     "ops": s.graph_ops or None, "graph": s.differs})
    return rows


def stages_figure(report: Report) -> go.Figure:
    """Latency per fusion level (bars with p20-p80) and throughput (line, right axis); stages whose graph
    is identical to an earlier one are named but not drawn as a new bar."""
    rows = [r for r in stages_rows(report) if r["latency ms (median)"] is not None]
    labels = [str(r["stage"]) for r in rows]
    fig = make_subplots(specs=[[{"secondary_y": True}]])
    med = [r["latency ms (median)"] for r in rows]
    err = dict(type="data", symmetric=False, array=[r["p80"] - r["latency ms (median)"] for r in rows],
               arrayminus=[r["latency ms (median)"] - r["p20"] for r in rows])
    palette = ["#8c8c8c", "#ff7f0e", "#2ca02c", "#1f77b4"]
    fig.add_trace(go.Bar(x=labels, y=med, error_y=err, name="latency (ms)",
                         marker_color=[palette[i % len(palette)] for i in range(len(rows))]), secondary_y=False)
    fig.add_trace(go.Scatter(x=labels, y=[r["throughput /s"] for r in rows], name="throughput (/s)",
                             mode="lines+markers", line=dict(color="#111111")), secondary_y=True)
    fig.update_yaxes(title_text="latency (ms)", secondary_y=False, rangemode="tozero")
    fig.update_yaxes(title_text="throughput (/s)", secondary_y=True, rangemode="tozero")
    fig.update_layout(title="Staged fusion (the seed's table): original → Conv+BN folded → + epilogues → all accepted",
                      height=380, margin=dict(l=40, r=40, t=60, b=40), legend=dict(orientation="h", y=-0.15))
    if not rows:
        fig.add_annotation(text="no staged timings in this report", showarrow=False, x=0.5, y=0.5,
                           xref="paper", yref="paper")
    return fig
