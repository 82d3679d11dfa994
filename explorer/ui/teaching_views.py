"""Figures and tables of the teaching results (breakdown, traffic, stages, predictions, sweep, bisect), translated.

Pure view builders: each takes plain values (a ``Breakdown.to_dict()``, a
traffic table, stage rows, ...) and returns a plotly figure or a list of rows
whose headers and labels come from the catalog (``explorer.ui.i18n``). The
Learn page calls them; the Results page can call the same ones to show a
teaching report (``breakdown_figure``, ``breakdown_rows``, ``traffic_rows``).

The seed's own figures (``SEED_BREAKDOWN``, ``SEED_TRAFFIC``) are what
``shared/seed/operator-fusion-overview.zh.txt`` claims for ResNet-50 and
BERT-Base; they are drawn beside the measured ones and always labelled as the
seed's claims, never as measurements.
"""

from __future__ import annotations

from typing import Any, Iterable

import plotly.graph_objects as go

from explorer.fusions import BY_NAME
from explorer.ui.i18n import pattern_text, t
from explorer.units import human_bytes

#: Bytes per MiB: the tables and the chart count bytes as the other pages do (``human_bytes``: KiB, MiB).
MIB = 2 ** 20

CATEGORIES = ("launch_host", "memory_bound", "compute_bound", "other")
COLORS = {"launch_host": "#f59e0b", "memory_bound": "#3b82f6", "compute_bound": "#10b981", "other": "#9ca3af"}

#: The seed's profile of ResNet-50 (1.2 为什么需要算子融合): 实际计算 40%, Kernel Launch 15%, 内存读写 35%, 其他 10%.
SEED_BREAKDOWN = {"compute_bound": 0.40, "launch_host": 0.15, "memory_bound": 0.35, "other": 0.10}
#: The seed's memory-access volumes before and after fusion (1.3.2 内存带宽节省), in bytes.
SEED_TRAFFIC = {"resnet50": (1.2e9, 0.7e9), "bert_base": (2.8e9, 1.6e9)}


#: The GPU picture of the seed's table (``explorer.runtime.breakdown.GPU_TEACHING_REPORT``), named from a CPU profile.
GPU_TEACHING_REPORT = "benchmarks/results/teaching_report_h200.json"
#: Kinds of op a CPU profile's time is split into (``explorer.runtime.breakdown.OP_KINDS``), in order.
OP_KINDS = ("convolution", "matmul", "normalization", "activation", "elementwise", "softmax_attention",
            "data_movement", "other")


def cpu_kind_figure(breakdowns: dict[str, dict]) -> go.Figure:
    """Milliseconds of CPU time per kind of op, unfused beside fused (a CPU profile's honest figure)."""
    kinds = [k for k in OP_KINDS if any((b.get("by_kind_ms") or {}).get(k) for b in breakdowns.values())]
    fig = go.Figure()
    for variant, color in (("unfused", "#9ca3af"), ("fused", "#3b82f6")):
        b = breakdowns.get(variant)
        if not b:
            continue
        got = b.get("by_kind_ms") or {}
        fig.add_trace(go.Bar(name=t(f"teach.variant.{variant}"), orientation="h", marker_color=color,
                             y=[t(f"teach.kind.{k}") for k in kinds], x=[got.get(k, 0.0) for k in kinds],
                             hovertemplate="%{y}: %{x:.3f} ms<extra>" + t(f"teach.variant.{variant}") + "</extra>"))
    fig.update_layout(barmode="group", title=t("teach.bd.cpu_fig_title"), xaxis_title=t("teach.bd.cpu_x"),
                      yaxis={"autorange": "reversed"}, height=120 + 45 * max(len(kinds), 1), legend_orientation="h",
                      legend_y=-0.25, margin={"l": 10, "r": 10, "t": 50, "b": 10})
    return fig


def cpu_kind_rows(breakdowns: dict[str, dict]) -> list[dict[str, Any]]:
    """One row per kind of op (ms unfused and fused), then the time between ops, the wall time and the ops."""
    rows = []
    for k in OP_KINDS:
        values = {v: (b.get("by_kind_ms") or {}).get(k, 0.0) for v, b in breakdowns.items() if b}
        if not any(values.values()):
            continue
        rows.append({t("teach.col.kind"): t(f"teach.kind.{k}"),
                     **{t(f"teach.col.{v}_ms"): round(ms, 3) for v, ms in values.items()}})
    def between(b: dict) -> Any:
        # the ops' own time can fill the whole wall time (it is measured node by node): then nothing between
        # them can be told apart, which is not "0 ms"
        ms = b["categories_ms"]["launch_host"]
        return round(ms, 3) if ms > 0.01 * (b["wall_ms"] or 0.0) else "-"

    for label, read in ((t("teach.bd.cpu_between"), between),
                        (t("teach.bd.total_wall"), lambda b: round(b["wall_ms"], 3)),
                        (t("teach.bd.cpu_ops"), lambda b: b.get("ops") or b["kernels"])):
        rows.append({t("teach.col.kind"): label, **{t(f"teach.col.{v}_ms"): read(b) for v, b in breakdowns.items()
                                                    if b}})
    return rows


def category_label(category: str, cpu: bool = False) -> str:
    """The translated name of a breakdown category (the CPU's first category is framework overhead)."""
    if category == "launch_host" and cpu:
        return t("teach.cat.framework_cpu")
    return t(f"teach.cat.{category}")


def breakdown_figure(breakdowns: dict[str, dict], with_seed: bool = True) -> go.Figure:
    """Stacked bars (share of one forward's wall time) for unfused and fused, the seed's claim above them."""
    cpu = any(b.get("is_cpu") for b in breakdowns.values())
    rows: list[tuple[str, dict[str, float], dict[str, float]]] = []
    if with_seed:
        rows.append((t("teach.bd.row_seed"), SEED_BREAKDOWN, {}))
    for variant in ("unfused", "fused"):
        b = breakdowns.get(variant)
        if not b:
            continue
        wall = b["wall_ms"] or 1.0
        rows.append((t(f"teach.bd.row_{variant}", ms=b["wall_ms"]),
                     {c: b["categories_ms"][c] / wall for c in CATEGORIES}, b["categories_ms"]))
    fig = go.Figure()
    for c in CATEGORIES:
        fig.add_trace(go.Bar(
            name=category_label(c, cpu), orientation="h", marker_color=COLORS[c],
            y=[r[0] for r in rows], x=[100 * r[1].get(c, 0.0) for r in rows],
            text=[f"{100 * r[1].get(c, 0.0):.0f}%" for r in rows], textposition="inside",
            customdata=[(r[2].get(c) if r[2] else None) for r in rows],
            hovertemplate="%{y}<br>%{x:.1f}%<br>%{customdata:.3f} ms<extra>" + category_label(c, cpu) + "</extra>"))
    fig.update_layout(barmode="stack", title=t("teach.bd.fig_title"), xaxis_title=t("teach.bd.x_share"),
                      yaxis={"autorange": "reversed"}, height=140 + 55 * len(rows), legend_orientation="h",
                      legend_y=-0.35, margin={"l": 10, "r": 10, "t": 50, "b": 10})
    return fig


def breakdown_rows(breakdowns: dict[str, dict], with_seed: bool = True) -> list[dict[str, Any]]:
    """One row per category: ms and share before and after fusion, and the seed's claimed share."""
    cpu = any(b.get("is_cpu") for b in breakdowns.values())
    rows = []
    for c in CATEGORIES:
        row: dict[str, Any] = {t("teach.col.category"): category_label(c, cpu)}
        for variant in ("unfused", "fused"):
            b = breakdowns.get(variant)
            if b:
                ms = b["categories_ms"][c]
                row[t(f"teach.col.{variant}_ms")] = round(ms, 4)
                row[t(f"teach.col.{variant}_share")] = f"{100 * ms / b['wall_ms']:.0f}%" if b["wall_ms"] else "-"
        if with_seed:
            row[t("teach.col.seed_share")] = f"{100 * SEED_BREAKDOWN[c]:.0f}%"
        rows.append(row)
    total: dict[str, Any] = {t("teach.col.category"): t("teach.bd.total_wall")}
    for variant in ("unfused", "fused"):
        b = breakdowns.get(variant)
        if b:
            total[t(f"teach.col.{variant}_ms")] = round(b["wall_ms"], 4)
            total[t(f"teach.col.{variant}_share")] = "100%"
    if with_seed:
        total[t("teach.col.seed_share")] = "100%"
    rows.append(total)
    return rows


def traffic_rows(traffic: dict[str, Any], limit: int = 12) -> list[dict[str, Any]]:
    """The chains that save most bytes (``limit`` of them), then the whole model; MiB before, after, saved (MiB as
    every other page counts bytes: ``explorer.units.human_bytes``)."""
    chains = sorted(traffic.get("chains") or [], key=lambda r: -r["bytes_saved"])
    rows = [{t("teach.col.chain"): r.get("title") or r["id"], t("teach.col.pattern"): _pattern_label(r["pattern"]),
             t("teach.col.before_mb"): round(r["bytes_unfused"] / MIB, 3),
             t("teach.col.after_mb"): round(r["bytes_fused"] / MIB, 3),
             t("teach.col.saved"): f"{100 * r['bytes_saved'] / r['bytes_unfused']:.0f}%" if r["bytes_unfused"] else "-"}
            for r in chains[:limit]]
    total = traffic["total"]
    rows.append({t("teach.col.chain"): t("teach.tr.whole_model"), t("teach.col.pattern"): "",
                 t("teach.col.before_mb"): round(total["bytes_unfused"] / MIB, 3),
                 t("teach.col.after_mb"): round(total["bytes_fused"] / MIB, 3),
                 t("teach.col.saved"): f"{100 * total['bytes_saved'] / total['bytes_unfused']:.0f}%"
                 if total["bytes_unfused"] else "-"})
    return rows


def _pattern_label(name: str) -> str:
    """A pattern's label in the session's language (``Conv+BN+Add+act``), as every other table names it; a name the
    registry lacks (a report from another version) as written."""
    return pattern_text(BY_NAME[name], "label") if isinstance(name, str) and name in BY_NAME else name


def traffic_figure(traffic: dict[str, Any], model_name: str = "") -> go.Figure:
    """Bytes of one forward before and after fusion: the byte model, ncu's DRAM bytes where measured, and the
    seed's figures for the same model name (labelled as the seed's claim)."""
    total = traffic["total"]
    groups = [(t("teach.tr.bar_model"), total["bytes_unfused"], total["bytes_fused"])]
    ncu = traffic.get("ncu") or {}
    u, f = ncu.get("unfused") or {}, ncu.get("fused") or {}
    if "dram_bytes" in u and "dram_bytes" in f:
        groups.append((t("teach.tr.bar_ncu"), u["dram_bytes"], f["dram_bytes"]))
    if model_name in SEED_TRAFFIC:
        before, after = SEED_TRAFFIC[model_name]
        groups.append((t("teach.tr.bar_seed"), before, after))
    fig = go.Figure()
    # under 10 MiB the labels take the table's three decimals (0.956 -> 0.331, not 1.0 -> 0.3 beside it)
    fmt = "{:,.3f}" if max(max(g[1], g[2]) for g in groups) / MIB < 10 else "{:,.1f}"
    for idx, (variant, color) in enumerate((("unfused", "#ef4444"), ("fused", "#22c55e"))):
        values = [g[1 + idx] / MIB for g in groups]
        fig.add_trace(go.Bar(name=t(f"teach.variant.{variant}"), x=[g[0] for g in groups], y=values,
                             marker_color=color, text=[fmt.format(v) for v in values], textposition="outside"))
    fig.update_layout(barmode="group", title=t("teach.tr.fig_title"), yaxis_title=t("teach.tr.axis"), height=360,
                      margin={"l": 10, "r": 10, "t": 50, "b": 10})
    return fig


def stage_table(rows: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """The staged table with translated stage names: latency, throughput, peak memory (or 'same as')."""
    out = []
    for r in rows:
        same = r.get("same_as")
        peak = r.get("peak_memory_bytes")
        # a stage not timed again (its graph is an earlier one's) says so in every cell, never "None"
        missing = t("teach.stage.same_as", stage=t(f"teach.stage.{same}")) if same else t("chart.missing.not_timed")
        out.append({
            t("teach.col.stage"): t(f"teach.stage.{r['stage']}") if r["stage"] in ("none", "conv_bn", "activation", "all")
            else r["label"],
            t("teach.col.latency_ms"): f"{r['latency_ms']:.4f}" if r.get("latency_ms") is not None else missing,
            t("teach.col.throughput"): f"{r['throughput']:,.1f}" if r.get("throughput") else missing,
            t("teach.col.memory"): human_bytes(peak) if peak else (missing if same else t("teach.na_cpu_memory")),
            t("teach.col.note"): t("teach.stage.same_as", stage=t(f"teach.stage.{same}")) if same else "",
        })
    return out


def prediction_figure(rows: list[dict[str, Any]]) -> go.Figure:
    """Measured against predicted gain per chain (log-log), the diagonal drawn, chains far from it coloured
    by the reason ``explorer.teaching.predict.why_far`` gives."""
    fig = go.Figure()
    groups: dict[str, list[dict]] = {}
    for r in rows:
        if r.get("predicted") and r.get("measured"):
            groups.setdefault(r.get("why") or "close", []).append(r)
    colors = {"close": "#6b7280", "slower_kernel": "#dc2626", "host_bound": "#f59e0b", "compute_bound": "#10b981",
              "l2_resident": "#3b82f6", "unexplained": "#8b5cf6"}
    values = [v for r in rows for v in (r.get("predicted"), r.get("measured")) if v]
    lo, hi = (min(values) / 1.3, max(values) * 1.3) if values else (0.5, 2.0)
    fig.add_trace(go.Scatter(x=[lo, hi], y=[lo, hi], mode="lines", line={"dash": "dot", "color": "#9ca3af"},
                             name=t("teach.pred.diagonal"), hoverinfo="skip"))
    for why, items in groups.items():
        fig.add_trace(go.Scatter(
            x=[r["predicted"] for r in items], y=[r["measured"] for r in items], mode="markers",
            marker={"size": 10, "color": colors.get(why, "#6b7280")}, name=t(f"teach.why.{why}.short"),
            text=[r["title"] for r in items],
            hovertemplate="%{text}<br>" + t("teach.pred.hover") + "<extra></extra>"))
    fig.update_layout(title=t("teach.pred.fig_title"), xaxis={"type": "log", "title": t("teach.pred.x")},
                      yaxis={"type": "log", "title": t("teach.pred.y")}, height=420,
                      margin={"l": 10, "r": 10, "t": 50, "b": 10})
    return fig


def sweep_figure(points: list[dict[str, Any]], title: str) -> go.Figure:
    """Speed-up (unfused / fused) against batch size, one line per dtype; the break-even line at 1."""
    fig = go.Figure()
    for dtype in sorted({p["dtype"] for p in points}):
        mine = sorted((p for p in points if p["dtype"] == dtype and p.get("speedup")), key=lambda p: p["batch"])
        # a hollow marker where the paired test could not decide
        fig.add_trace(go.Scatter(x=[p["batch"] for p in mine], y=[p["speedup"] for p in mine], mode="lines+markers",
                                 marker={"size": 9, "symbol": ["circle-open" if p.get("undecided") else "circle"
                                                               for p in mine]},
                                 name=dtype, customdata=[[p["unfused_ms"], p["fused_ms"]] for p in mine],
                                 hovertemplate=t("teach.sweep.hover") + "<extra>" + dtype + "</extra>"))
    fig.add_hline(y=1.0, line_dash="dot", line_color="#dc2626", annotation_text=t("teach.sweep.break_even"))
    batches = sorted({p["batch"] for p in points})   # ticks at the batch sizes measured, not at 1.1, 1.2, ...
    fig.update_layout(title=title, xaxis={"type": "log", "title": t("teach.sweep.x"), "tickvals": batches,
                                          "ticktext": [str(b) for b in batches]},
                      yaxis={"title": t("teach.sweep.y")}, height=400, margin={"l": 10, "r": 10, "t": 50, "b": 10})
    return fig


def bisect_figure(ranked: list[dict[str, Any]]) -> go.Figure:
    """Each chain's contribution to the output error (its model's rel. L2 minus the unfused model's)."""
    items = ranked[:20]
    fig = go.Figure(go.Bar(x=[r["contribution"] or 0.0 for r in items], y=[r["title"] or r["id"] for r in items],
                           orientation="h", marker_color=["#dc2626" if i == 0 else "#60a5fa" for i in range(len(items))],
                           hovertemplate="%{y}<br>%{x:.3e}<extra></extra>"))
    fig.update_layout(title=t("teach.bisect.fig_title"), xaxis={"title": t("teach.bisect.x"), "tickformat": ".1e"},
                      yaxis={"autorange": "reversed"}, height=140 + 28 * len(items),
                      margin={"l": 10, "r": 10, "t": 50, "b": 10})
    return fig
