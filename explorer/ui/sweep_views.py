"""Figures and tables of a sweep's results (``explorer.sweeps.store`` records), in the language they are given.

Every figure takes the records (flat dicts) and a language and returns a plotly figure; every table returns rows.
The speed-ups and intervals are the records' (each from its report's paired test, ``explorer.stats``): a point's
marker is coloured by its verdict, never by comparing medians. Where a fusion stops paying
(``stops_paying``) reads the same verdicts along each series of batch sizes (or sequence lengths).

A point's marker carries its key (``customdata``), so a click on it opens its report (the Sweeps page). Text that
comes from a results file (model and plan names, point labels) is HTML-escaped before plotly draws it: plotly
renders tags such as ``<a href>`` in names and labels, and a results file is data.
"""

from __future__ import annotations

import collections
import html
import math
from typing import Any, Iterable

import plotly.graph_objects as go

from explorer.report import FASTER, NO_KERNEL, NOT_MEASURED, SAME, SLOWER
from explorer.ui.charts import verdict_label
from explorer.ui.i18n import t_in

VERDICT_COLOURS = {FASTER: "#16a34a", SLOWER: "#dc2626", SAME: "#6b7280", NO_KERNEL: "#9ca3af",
                   NOT_MEASURED: "#d1d5db"}
SERIES = ("model_label", "plan", "dtype", "memory_format", "cuda_graphs", "seq_len", "batch")


def _esc(text: Any) -> str:
    """A string from a results file, shown by plotly as written (no tag of it rendered)."""
    return html.escape(str(text), quote=False)


def ok(records: Iterable[dict]) -> list[dict]:
    """The records measured (status ok) with a speed-up."""
    return [r for r in records if r["status"] == "ok" and r.get("speedup") is not None]


def x_options(records: list[dict]) -> list[str]:
    """The axes a chart can run along: batch, and sequence length when the sweep has more than one."""
    out = ["batch"]
    if len({r.get("seq_len") for r in records if r.get("seq_len") is not None}) > 1:
        out.append("seq_len")
    return out


def _series_key(r: dict, x: str) -> tuple:
    return tuple(r.get(f) for f in SERIES if f != x)


def _plan_name(plan: Any, lang: str) -> str:
    """A sweep's plan as the page names it everywhere: all, none (translated), pattern names or a plan file."""
    plan = str(plan)
    return t_in(lang, f"sweeps.plan.{plan}") if plan in ("all", "none") else plan


def _series_name(key: tuple, x: str, lang: str) -> str:
    fields = dict(zip([f for f in SERIES if f != x], key))
    parts = [str(fields["model_label"]), _plan_name(fields["plan"], lang), str(fields["dtype"])]
    if fields.get("memory_format") not in (None, "nchw"):
        parts.append(str(fields["memory_format"]))
    if fields.get("cuda_graphs"):
        parts.append(t_in(lang, "sweeps.graphs"))
    other = "seq_len" if x == "batch" else "batch"
    if fields.get(other) is not None:
        parts.append(t_in(lang, f"sweeps.short.{other}", n=fields[other]))
    return _esc(" · ".join(parts))


def point_name(r: dict, lang: str) -> str:
    """A point as the page names it in ``lang`` (the sweep's own label, ``SweepPoint.label``, is English):
    ``resnet50 · 全部融合 · 批 8 · fp16 · channels_last``, CUDA graphs and baselines when on."""
    parts = [str(r.get("model_label") or r.get("model") or ""), _plan_name(r.get("plan"), lang),
             t_in(lang, "sweeps.short.batch", n=r.get("batch"))]
    if r.get("seq_len") is not None:
        parts.append(t_in(lang, "sweeps.short.seq_len", n=r["seq_len"]))
    parts += [str(r.get("dtype") or ""), str(r.get("memory_format") or "")]
    if r.get("cuda_graphs"):
        parts.append(t_in(lang, "sweeps.graphs"))
    if r.get("baselines"):
        parts.append(t_in(lang, "sweeps.with_baselines"))
    return " · ".join(p for p in parts if p)


def _series(records: list[dict], x: str) -> dict[tuple, list[dict]]:
    groups: dict[tuple, list[dict]] = collections.OrderedDict()
    for r in sorted(records, key=lambda r: tuple(str(r.get(f)) for f in SERIES)):
        if r.get(x) is None:
            continue
        groups.setdefault(_series_key(r, x), []).append(r)
    for rows in groups.values():
        rows.sort(key=lambda r: r[x])
    return groups


def _speedup_figure(records: list[dict], x: str, lang: str, prefix: str, title_key: str, y_key: str) -> go.Figure:
    fig = go.Figure()
    col, low, high, verdict = (("speedup", "speedup_low", "speedup_high", "verdict") if not prefix else
                               (f"{prefix}speedup", f"{prefix}low", f"{prefix}high", f"{prefix}verdict"))
    for key, rows in _series(records, x).items():
        rows = [r for r in rows if r.get(col) is not None]
        if not rows:
            continue
        ys = [r[col] for r in rows]
        plus = [max(0.0, (r.get(high) or r[col]) - r[col]) for r in rows]
        minus = [max(0.0, r[col] - (r.get(low) or r[col])) for r in rows]
        fig.add_trace(go.Scatter(
            x=[r[x] for r in rows], y=ys, mode="lines+markers", name=_series_name(key, x, lang),
            error_y={"type": "data", "symmetric": False, "array": plus, "arrayminus": minus, "thickness": 1},
            marker={"size": 10, "color": [VERDICT_COLOURS.get(r.get(verdict), "#d1d5db") for r in rows],
                    "line": {"width": 1, "color": "#111827"}},
            customdata=[[r["key"], verdict_label(r.get(verdict) or NOT_MEASURED, lang)] for r in rows],
            hovertemplate=t_in(lang, f"sweeps.axis.{x}") + " " + t_in(lang, "sweeps.hover") + "<extra></extra>"))
    fig.add_hline(y=1.0, line_dash="dot", line_color="#dc2626", annotation_text=t_in(lang, "sweeps.break_even"))
    values = sorted({r[x] for r in records if r.get(x) is not None})
    fig.update_layout(title=t_in(lang, title_key), xaxis={"type": "log", "title": t_in(lang, f"sweeps.axis.{x}"),
                                                          "tickvals": values, "ticktext": [str(v) for v in values]},
                      yaxis={"title": t_in(lang, y_key)}, height=460, legend={"orientation": "h", "y": -0.2},
                      margin={"l": 10, "r": 10, "t": 50, "b": 10})
    return fig


def speedup_figure(records: list[dict], x: str, lang: str) -> go.Figure:
    """Fused against unfused: speed-up (1 / the paired test's ratio) and its 95% interval against ``x``, one line
    per model · plan · dtype (· levers), each marker in its verdict's colour."""
    return _speedup_figure(ok(records), x, lang, "", "sweeps.fig.speedup", "sweeps.axis.speedup")


def has_compile(records: list[dict]) -> bool:
    return any(r.get("vs_torch_compile_speedup") is not None for r in records)


def compile_figure(records: list[dict], x: str, lang: str) -> go.Figure:
    """The fused model against ``torch.compile`` (default), from each point's baseline verdict (points measured with
    baselines only): above 1 the fused model is faster."""
    return _speedup_figure([r for r in records if r["status"] == "ok"], x, lang, "vs_torch_compile_",
                           "sweeps.fig.compile", "sweeps.axis.vs_compile")


def heatmap_figure(records: list[dict], lang: str, dtype: str, batch: int) -> go.Figure:
    """Models × plans at one dtype and batch size: each cell the speed-up (geometric mean over the other levers
    and sequence lengths measured there), its text the verdicts."""
    rows = [r for r in ok(records) if r["dtype"] == dtype and r["batch"] == batch]
    models = sorted({r["model_label"] for r in rows})
    plans = sorted({r["plan"] for r in rows})
    cells: dict[tuple, list[dict]] = collections.defaultdict(list)
    for r in rows:
        cells[(r["model_label"], r["plan"])].append(r)
    z, text = [], []
    for m in models:
        z_row, t_row = [], []
        for p in plans:
            found = cells.get((m, p), [])
            if not found:
                z_row.append(None)
                t_row.append("")
                continue
            gm = math.exp(sum(math.log(r["speedup"]) for r in found) / len(found))
            z_row.append(gm)
            counts = collections.Counter(verdict_label(r["verdict"], lang) for r in found)
            t_row.append(f"{gm:.2f}×<br>" + ", ".join(f"{n} {v}" for v, n in counts.items()))
        z.append(z_row)
        text.append(t_row)
    # colour: log2 of the speed-up between 0.5x and 2x, so that 0.9x is pale and not as red as 0.5x
    zlog = [[None if v is None else max(-1.0, min(1.0, math.log2(v))) for v in row] for row in z]
    fig = go.Figure(go.Heatmap(z=zlog, customdata=z, x=[_esc(_plan_name(p, lang)) for p in plans], y=[_esc(m) for m in models],
                               text=text, texttemplate="%{text}", zmin=-1.0, zmax=1.0,
                               colorscale=[[0, "#dc2626"], [0.5, "#f9fafb"], [1, "#16a34a"]],
                               colorbar={"title": t_in(lang, "sweeps.axis.speedup_short"),
                                         "tickvals": [-1, -0.5, 0, 0.5, 1],
                                         "ticktext": ["0.5×", "0.71×", "1×", "1.41×", "2×"]},
                               hovertemplate=t_in(lang, "sweeps.heat_hover") + "<extra></extra>"))
    fig.update_layout(title=t_in(lang, "sweeps.fig.heatmap", dtype=dtype, batch=batch),
                      xaxis={"title": t_in(lang, "sweeps.axis.plan")}, yaxis={"title": t_in(lang, "sweeps.axis.model")},
                      height=max(260, 90 + 60 * len(models)), margin={"l": 10, "r": 10, "t": 50, "b": 10})
    return fig


def has_memory(records: list[dict]) -> bool:
    return any(r.get("peak_fused_bytes") is not None for r in records)


def memory_figure(records: list[dict], lang: str) -> go.Figure:
    """Peak device memory, unfused and fused, per point (CUDA runs only: the CPU has no peak counter)."""
    rows = [r for r in records if r["status"] == "ok" and r.get("peak_fused_bytes") is not None]
    labels = [_esc(r["point"]) for r in rows]
    fig = go.Figure()
    for side, colour in (("unfused", "#9ca3af"), ("fused", "#2563eb")):
        fig.add_trace(go.Bar(x=labels, y=[(r.get(f"peak_{side}_bytes") or 0) / 2**20 for r in rows],
                             name=t_in(lang, f"sweeps.{side}"), marker_color=colour,
                             customdata=[[r["key"]] for r in rows]))
    fig.update_layout(barmode="group", title=t_in(lang, "sweeps.fig.memory"),
                      yaxis={"title": t_in(lang, "sweeps.axis.memory")}, height=420,
                      margin={"l": 10, "r": 10, "t": 50, "b": 10})
    return fig


def stops_paying(records: list[dict], x: str) -> list[dict[str, Any]]:
    """Each series (model · plan · dtype · levers) along ``x``: the first value of ``x`` where the verdict stops being
    "faster" after a faster point (``stops``), the last faster one (``last_faster``), or that it never was faster or
    never stopped. Verdicts only: a point with no significant difference does not pay."""
    out = []
    for key, rows in _series(ok(records), x).items():
        if not rows or rows[0].get("plan") == "none":
            continue
        faster = [r[x] for r in rows if r["verdict"] == FASTER]
        stops = next((r for i, r in enumerate(rows) if r["verdict"] != FASTER and any(
            q["verdict"] == FASTER for q in rows[:i])), None)
        out.append({"series": key, "values": [r[x] for r in rows], "verdicts": [r["verdict"] for r in rows],
                    "last_faster": max(faster) if faster else None, "stops": None if stops is None else stops[x],
                    "stops_verdict": None if stops is None else stops["verdict"], "never": not faster})
    return out


def stops_rows(records: list[dict], x: str, lang: str) -> list[dict[str, Any]]:
    """``stops_paying`` as table rows in ``lang``."""
    rows = []
    for s in stops_paying(records, x):
        if s["never"]:
            reading = t_in(lang, "sweeps.stop.never")
        elif s["stops"] is None and len(s["values"]) == 1:   # one size: "every size" would claim a trend
            reading = t_in(lang, "sweeps.stop.pays_one", at=s["values"][0])
        elif s["stops"] is None:
            reading = t_in(lang, "sweeps.stop.pays", last=s["last_faster"])
        else:
            reading = t_in(lang, "sweeps.stop.at", at=s["stops"], verdict=verdict_label(s["stops_verdict"], lang),
                           last=s["last_faster"])
        rows.append({t_in(lang, "sweeps.col.series"): _series_name(s["series"], x, lang),
                     t_in(lang, f"sweeps.axis.{x}"): ", ".join(str(v) for v in s["values"]),
                     t_in(lang, "sweeps.col.verdicts"): ", ".join(verdict_label(v, lang) for v in s["verdicts"]),
                     t_in(lang, "sweeps.col.reading"): reading})
    return rows


def _pair_ms(r: dict, baseline: str) -> str:
    """``"<baseline ms> · <fused ms>"``: the medians of the two sides the baseline's verdict paired, or ``"—"``."""
    ms, fused = r.get(f"vs_{baseline}_ms"), r.get(f"vs_{baseline}_fused_ms")
    return f"{ms:.3f} · {fused:.3f}" if ms is not None and fused is not None else "—"


def _cell(value: Any, fmt: str, missing: str = "—") -> str:
    """A number as the table shows it (one format per column), or ``missing`` where the point has none: a table
    never shows a bare None."""
    return missing if value is None else fmt.format(value)


def point_rows(records: list[dict], lang: str) -> list[dict[str, Any]]:
    """Every point: its status, verdict, speed-up and interval, medians, device and wall time, or its reason;
    every cell text, each column in one format (the speed-up and its interval alike: ``1.07×``, ``0.99–1.20``)."""
    rows = []
    not_measured = t_in(lang, "chart.missing.not_measured")
    for r in records:
        interval = (f"{r['speedup_low']:.2f}–{r['speedup_high']:.2f}"
                    if r.get("speedup_low") is not None and r.get("speedup_high") is not None else "—")
        cpu = r.get("device_kind") == "cpu"
        rows.append({t_in(lang, "sweeps.col.point"): point_name(r, lang),
                     t_in(lang, "sweeps.col.status"): t_in(lang, f"sweeps.status.{r['status']}"),
                     t_in(lang, "sweeps.col.verdict"): verdict_label(r["verdict"], lang) if r.get("verdict") else "—",
                     t_in(lang, "sweeps.col.speedup"): _cell(r.get("speedup"), "{:.2f}×"),
                     t_in(lang, "sweeps.col.interval"): interval,
                     t_in(lang, "sweeps.col.unfused_ms"): _cell(r.get("unfused_ms"), "{:.4f}"),
                     t_in(lang, "sweeps.col.fused_ms"): _cell(r.get("fused_ms"), "{:.4f}"),
                     t_in(lang, "sweeps.col.vs_compile"): _cell(r.get("vs_torch_compile_speedup"), "{:.2f}×",
                                                                not_measured),
                     # that verdict's own pairs: the baselines phase timed its own fused rounds beside compile's
                     t_in(lang, "sweeps.col.vs_compile_pair"): _pair_ms(r, "torch_compile"),
                     t_in(lang, "sweeps.col.device"): r.get("device_name") or "—",
                     t_in(lang, "sweeps.col.clock"): _cell(r.get("sm_clock_mhz"), "{:.0f}",
                                                           t_in(lang, "chart.missing.cpu") if cpu else not_measured),
                     t_in(lang, "sweeps.col.host_busy"): _cell(r.get("host_cpu_busy"), "{:.0%}", not_measured),
                     t_in(lang, "sweeps.col.wall"): _cell(r.get("wall_s"), "{:.1f}"),
                     t_in(lang, "sweeps.col.reason"): r.get("reason") or "—"})
    return rows
