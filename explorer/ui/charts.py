"""Plotly figures and tables of a typed run report (``explorer.report.Report``), in English or 中文.

Every function here is pure: it takes the report and the language (``lang``,
"en" or "zh"; English by default) and returns a ``plotly.graph_objects.Figure``
or a list of row dicts whose headers, labels and notes are in that language
(the catalog's ``chart.*`` keys, ``explorer/ui/locale/charts.py``; a note the
runtime wrote in English through ``explorer.ui.i18n.message``). Missing numbers
(peak memory on a CPU run, a chain that was not timed) are shown as "not
measured", never as zero. Verdicts are read from the report's one field
(``ChainResult.verdict``, ``Baseline.verdict``), never recomputed here.

    report.unfused/fused/baselines -> comparison_figure, summary_rows, baseline_rows
    report.chains                  -> chain_rows, chain_speedup_figure (bars coloured by verdict),
                                      chain_precision_figure
    report.stages                  -> stages_rows, stages_figure (the seed's staged table)

In English a label the report carries (a baseline's, a stage's) is shown as the
report wrote it; in Chinese the catalog's translation of a known one is shown.
"""

from __future__ import annotations

import math
from typing import Any

# pandas before plotly, at import: plotly and Streamlit import it lazily, and a first import racing another
# session's thread left it "partially initialized" on the Results page (seen in Chromium after a quick run)
import pandas  # noqa: F401
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from explorer.fusions import BY_NAME, color_of
from explorer.report import (FASTER, GPU, HOST, NO_KERNEL, NOT_MEASURED, SAME, SLOWER, UNDECIDED, UNTESTED, Latency,
                             Measurement, Report, Verdict)
from explorer.ui.i18n import catalog, engine_message, message, t_in, translate_text

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
#: The catalog key of each verdict reading (``explorer.report.READINGS``: the labels, undecided, not tested).
VERDICT_KEYS = {FASTER: "chart.verdict.faster", SLOWER: "chart.verdict.slower", SAME: "chart.verdict.same",
                NO_KERNEL: "chart.verdict.no_kernel", NOT_MEASURED: "chart.verdict.not_measured",
                UNDECIDED: "chart.verdict.undecided", UNTESTED: "chart.verdict.untested"}
#: The legend's name of a verdict in the per-chain figure.
LEGEND_KEYS = {SAME: "chart.legend.same", SLOWER: "chart.legend.slower"}

METRICS = (
    # attribute of Measurement, unit key, scale (titles: chart.metric.<attribute>, chart.row.<attribute>)
    ("latency", "ms", 1.0),
    ("throughput", "items_s", 1.0),
    ("peak_memory_bytes", "mib", 1 / 2**20),
    ("kernel_launches", "count", 1.0),
    ("bytes_moved", "mib", 1 / 2**20),
)
STAGES = ("none", "conv_bn", "activation", "all")
#: How a list and a run of notes are joined in each language (Chinese takes full-width punctuation).
LIST_SEP = {"en": ", ", "zh": "，"}
NOTE_SEP = {"en": "; ", "zh": "；"}
COLON = {"en": ": ", "zh": "："}
DASH = {"en": " — ", "zh": "——"}


def verdict_label(label: str, lang: str = "en") -> str:
    """A verdict label (``explorer.report.VERDICTS``) in ``lang``."""
    key = VERDICT_KEYS.get(label)
    return t_in(lang, key) if key else message(label, lang)


def _known(lang: str, key: str, english: str) -> str:
    """``english`` (the report's own text) in English; in Chinese the catalog's ``key`` when there is one,
    else the text through the message rules."""
    if lang == "en":
        return english
    return t_in(lang, key) if key in catalog() else message(english, lang)


def variant_label(name: str, label: str, lang: str = "en") -> str:
    """A whole-model variant's label: unfused, fused, or a baseline's (``explorer.runtime.baselines.LABELS``)."""
    if name in ("unfused", "fused"):
        return t_in(lang, f"chart.{name}")
    return _known(lang, f"chart.baseline.{name}", label)


def stage_label(stage: str, label: str, lang: str = "en") -> str:
    """A stage's label (``explorer.runtime.stages.STAGE_LABELS``) in ``lang``."""
    return _known(lang, f"chart.stage.{stage}", label)


def status_label(status: str, lang: str = "en") -> str:
    """What the plan did to a chain (fused, refused, failed, not applied) in ``lang``."""
    return _known(lang, "chart.status." + status.replace(" ", "_"), status)


def describe_verdict(v: Verdict, lang: str = "en") -> str:
    """``Verdict.describe`` in ``lang``: ``slower: 0.91x (95% CI 0.88-0.94x), p=0.001, 60 rounds``."""
    label = verdict_label(v.reading, lang)
    if v.ratio is None:
        return t_in(lang, "chart.describe.note", label=label, note=message(v.note, lang)) if v.note else label
    if not v.tested:
        return t_in(lang, "chart.describe.untested", label=label, speedup=v.speedup,
                    why=message(v.method or v.note, lang))
    lo, hi = v.interval or (0.0, 0.0)
    p = t_in(lang, "chart.describe.p", p=v.p_value) if v.p_value is not None else ""
    line = t_in(lang, "chart.describe.tested", label=label, speedup=v.speedup, lo=f"{lo:.2f}", hi=f"{hi:.2f}", p=p,
                n=v.n)
    if v.older_interval_disagrees:    # a stored verdict of the older statistic: its interval and test disagree
        return t_in(lang, "chart.describe.note", label=line, note=t_in(lang, "chart.describe.older_interval"))
    # p under alpha beside "no significant difference": the note says why (under the minimum effect)
    return t_in(lang, "chart.describe.note", label=line, note=message(v.note, lang)) if v.significant_but_same else line


def speedup_text(v: Verdict | None, lang: str = "en", why: str = "") -> str:
    """A speed-up cell: ``1.12×`` with its 95% interval (``[1.08–1.15]``), or why there is none (``why``, or
    the verdict's reading): the one statistic (``Verdict.speedup``), never a bare None."""
    if v is None or v.speedup is None:
        return why or (verdict_label(v.reading, lang) if v is not None else t_in(lang, "chart.missing.not_measured"))
    if not v.tested:
        return t_in(lang, "chart.cell.untested", x=v.speedup)
    lo, hi = v.interval or (0.0, 0.0)
    return t_in(lang, "chart.cell.speedup", x=v.speedup, lo=lo, hi=hi)


def _num(x: Any, fmt: str = "{:.3f}", missing: str = "") -> str:
    """A number as text (tables show no raw None: ``missing`` says why where it is absent)."""
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return missing
    if isinstance(x, float) and not math.isfinite(x):
        return str(x)
    return fmt.format(x)


def _value(m: Measurement | None, key: str, scale: float = 1.0) -> float | None:
    if m is None:
        return None
    if key == "latency":
        return m.latency.median if m.latency else None
    v = getattr(m, key)
    return None if v is None else float(v) * scale


def device_caption(report: Report, lang: str = "en") -> str:
    """One line: where these numbers come from."""
    env = report.environment
    name = env.device_name or env.device
    parts = [t_in(lang, "chart.caption.device", device=message(name, lang) if engine_message(name) else name)]
    if env.is_cpu:
        parts.append(t_in(lang, "chart.caption.cpu"))
    for key in ("dtype", "batch", "seq_len"):
        if report.settings.get(key) is not None:
            parts.append(t_in(lang, f"chart.caption.{key}", value=report.settings[key]))
    if report.settings.get("quick"):
        parts.append(t_in(lang, "chart.caption.quick"))
    if env.torch:
        parts.append(f"torch {env.torch}")
    if env.note:
        parts.append(message(env.note, lang))
    return " · ".join(parts)


def compared(report: Report, lang: str = "en") -> list[tuple[str, Measurement, str]]:
    """(label, measurement, colour) of every whole-model variant: unfused, fused, then each measured baseline
    (eager, torch.compile modes, CUDA-graph variants) as bars of their own."""
    out = [(t_in(lang, "chart.unfused"), report.unfused, UNFUSED_COLOR),
           (t_in(lang, "chart.fused"), report.fused, FUSED_COLOR)]
    for b in report.baselines:
        if b.measurement is not None and b.method != "fused":
            out.append((variant_label(b.name, b.label, lang), b.measurement,
                        BASELINE_COLORS.get(b.method, "#999999")))
    graphs = report.baseline("fused_cuda_graphs")
    if graphs is not None and graphs.measurement is not None and not report.fused.cuda_graph:
        out.append((variant_label(graphs.name, graphs.label, lang), graphs.measurement, "#0b3f66"))
    return out


def comparison_figure(report: Report, lang: str = "en") -> go.Figure:
    """Unfused, fused and every baseline side by side, one panel per metric (latency with p20-p80 bars)."""
    fig = make_subplots(rows=1, cols=len(METRICS), subplot_titles=[t_in(lang, f"chart.metric.{m[0]}") for m in METRICS],
                        horizontal_spacing=0.06)
    bars = compared(report, lang)
    for col, (key, unit_key, scale) in enumerate(METRICS, start=1):
        unit = t_in(lang, f"chart.unit.{unit_key}")
        for name, meas, color in bars:
            err = None
            if key == "latency":
                lat = meas.latency
                y = lat.median if lat else None
                if lat is not None:
                    err = dict(type="data", symmetric=False, array=[max(lat.p80 - lat.median, 0)],
                               arrayminus=[max(lat.median - lat.p20, 0)], thickness=1.5, width=6)
                hover = (t_in(lang, "chart.hover.latency", name=name, median=lat.median, p20=lat.p20, p80=lat.p80)
                         if lat else t_in(lang, "chart.hover.not_measured", name=name))
            else:
                y = _value(meas, key, scale)
                hover = (f"{name}{COLON.get(lang, ': ')}{y:,.2f} {unit}" if y is not None
                         else t_in(lang, "chart.hover.not_measured", name=name))
            fig.add_trace(go.Bar(x=[name], y=[y if y is not None else 0], marker_color=color, name=name,
                                 error_y=err, hovertext=[hover], hoverinfo="text",
                                 text=[t_in(lang, "chart.na") if y is None else _short(y)], textposition="outside",
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


def _missing(report: Report, m: Measurement, key: str, lang: str) -> str:
    """Why ``key`` of ``m`` is absent, in words (never a bare None)."""
    if m.latency is None and key in ("latency", "throughput"):
        return t_in(lang, "chart.missing.not_timed")
    if key == "peak_memory_bytes" and report.is_cpu:
        return t_in(lang, "chart.missing.memory_cpu")
    if key == "kernel_launches" and m.launches_kind.startswith("not counted"):
        return message(m.launches_kind, lang)
    return t_in(lang, "chart.missing.not_measured")


def summary_rows(report: Report, lang: str = "en") -> list[dict[str, Any]]:
    """Rows (metric, unfused, fused, change) for the headline table, every cell text. The latency row's change
    is THE speed-up (the verdict's: the Hodges-Lehmann estimate of the paired ratios, with the 95% interval of
    the same signed-rank test), the same figure as the headline and the command line; the other rows' change
    is fused ÷ unfused, said so. Kernel launches
    come twice: measured by the profiler, and the graph model of this device and plan (the Graph and Fusions
    pages' count); both with their saving."""
    col_change = t_in(lang, "chart.ratio")
    rows = []
    fmt = {"latency": "{:.3f}", "throughput": "{:,.1f}", "peak_memory_bytes": "{:,.1f}", "kernel_launches": "{:d}",
           "bytes_moved": "{:,.1f}"}
    for key, _unit, scale in METRICS:
        u, f = _value(report.unfused, key, scale), _value(report.fused, key, scale)
        if key == "kernel_launches":
            u, f = (None if u is None else int(u)), (None if f is None else int(f))
        if key == "bytes_moved" and max(u or 0, f or 0) < 10:   # the chart's three digits: 0.956, not "1.0"
            fmt[key] = "{:,.3f}"
        if key == "latency":
            change = speedup_text(report.verdict, lang, "" if report.verdict.speedup is not None
                                  else t_in(lang, "chart.missing.not_timed"))
            change = t_in(lang, "chart.change.speedup", value=change) if report.verdict.speedup is not None else change
        elif key == "kernel_launches":
            change = t_in(lang, "chart.change.saves", n=u - f) if u is not None and f is not None else ""
        else:
            change = t_in(lang, "chart.change.ratio", r=f / u) if (u and f is not None) else ""
        rows.append({t_in(lang, "chart.col.metric"): t_in(lang, f"chart.row.{key}"),
                     t_in(lang, "chart.unfused"): _num(u, fmt[key], _missing(report, report.unfused, key, lang)),
                     t_in(lang, "chart.fused"): _num(f, fmt[key], _missing(report, report.fused, key, lang)),
                     col_change: change})
        if key == "kernel_launches" and report.unfused.graph_launches is not None \
                and report.fused.graph_launches is not None:
            gu, gf = report.unfused.graph_launches, report.fused.graph_launches
            rows.append({t_in(lang, "chart.col.metric"): t_in(lang, "chart.row.graph_launches",
                                                              device=report.environment.device),
                         t_in(lang, "chart.unfused"): str(gu), t_in(lang, "chart.fused"): str(gf),
                         col_change: t_in(lang, "chart.change.saves", n=gu - gf)})
    return rows


def verdict_text(report: Report, lang: str = "en") -> str:
    """The whole-model verdict in one line (a test over paired rounds)."""
    v = report.verdict
    return (t_in(lang, "chart.verdict_text", verdict=describe_verdict(v, lang))
            + (DASH.get(lang, " — ") + message(v.note, lang) if v.note and not v.significant_but_same else ""))


def baseline_rows(report: Report, lang: str = "en") -> list[dict[str, Any]]:
    """One row per way of running the model (fused entries and baselines), like with like: each baseline
    says which fused entry it is compared with and that comparison's verdict."""
    col = lambda name: t_in(lang, f"chart.col.{name}")  # noqa: E731
    names = {b.name: b for b in report.baselines}
    rows = []
    for b in report.baselines:
        m = b.measurement
        lat = m.latency if m else None
        partner = names.get(b.pairs_with or "")
        rows.append({
            col("variant"): variant_label(b.name, b.label, lang),
            col("method"): t_in(lang, "chart.fused") if b.method == "fused" else b.method,
            col("mode"): b.mode or "", col("cuda_graphs"): b.cuda_graphs,
            col("memory_format"): b.memory_format,
            col("median_ms"): _num(lat.median if lat else None, "{:.3f}", "—"),
            "p20": _num(lat.p20 if lat else None, "{:.3f}", "—"), "p80": _num(lat.p80 if lat else None, "{:.3f}", "—"),
            col("kernels"): _num(m.kernel_launches if m else None, "{:d}", "—"),
            col("gpu_busy_ms"): _num(m.gpu_busy_ms if m else None, "{:.3f}",
                                     t_in(lang, "chart.missing.cpu") if report.is_cpu else "—"),
            col("rel_l2_f64"): _num(m.precision.rel_l2 if m and m.precision else None, "{:.2e}", "—"),
            col("compile_s"): _num(b.compile_s, "{:.1f}", "—"),
            col("compared_with"): (b.pairs_with or "") if lang == "en" or partner is None
            else variant_label(partner.name, partner.label, lang),
            col("fused_speedup"): speedup_text(b.verdict, lang, "—"),
            col("baseline_verdict"): verdict_label(b.verdict.label, lang) if b.verdict
            else message(b.error or "", lang),
        })
    return rows


PRECISION_KEYS = ("max_abs", "max_rel", "rel_l2", "cosine", "top1_agreement")


def precision_rows(report: Report, lang: str = "en") -> list[dict[str, Any]]:
    """Model-output errors: each model against float64, and the fused model against the unfused one.
    Where relative figures were refused (a degenerate reference), the row says why."""
    rows = []
    for key, prec in (("unfused", report.unfused.precision), ("fused", report.fused.precision),
                      ("fused_vs_unfused", report.fused_vs_unfused)):
        if prec is None:
            continue
        cells = {}
        for k in PRECISION_KEYS:
            v = getattr(prec, k)
            if v is None:
                why = (message(prec.refused, lang) if prec.refused and k != "max_abs"
                       else t_in(lang, "chart.missing.top1") if k == "top1_agreement"
                       else t_in(lang, "chart.missing.not_measured"))
                cells[k] = why
            else:
                cells[k] = _num(v, "{:.9f}" if k in ("cosine", "top1_agreement") else "{:.2e}")
        cells = {(t_in(lang, "chart.col.top1_agreement") if k == "top1_agreement" else k): v for k, v in cells.items()}
        rows.append({t_in(lang, "chart.col.comparison"): t_in(lang, f"chart.prec.{key}"), **cells,
                     t_in(lang, "chart.col.why_no_relative"): message(prec.refused or "", lang)
                     or t_in(lang, "chart.missing.none_refused")})
    return rows


def chain_rows(report: Report, lang: str = "en") -> list[dict[str, Any]]:
    """Per-chain table rows, fastest speed-up first, each with its verdict (label, 95% interval, p-value).

    Reports measured on CUDA also time each chain replayed as a CUDA graph; their rows get that
    speed-up too ("speed-up, CUDA graph"). When the plan chose a kernel for some chain, a "kernel"
    column says which each chain ran.
    """
    col = lambda name: t_in(lang, f"chart.col.{name}")  # noqa: E731
    graphs = any(c.graph_speedup is not None for c in report.chains)
    chosen = any(c.kernel != "auto" for c in report.chains)
    rows = []
    for c in sorted(report.chains, key=lambda c: -(c.speedup or 0)):
        v = c.verdict
        why = _not_timed(c, lang)
        row: dict[str, Any] = {col("chain"): c.title, "id": c.id,
                               col("pattern"): translate_text(BY_NAME[c.pattern].label, lang) if c.pattern in BY_NAME
                               else c.pattern,
                               col("verdict"): verdict_label(v.reading, lang)}
        if chosen:
            row[col("kernel")] = c.kernel
        row[col("speedup")] = speedup_text(v, lang, why) if v.speedup is None else _num(v.speedup, "{:.2f}×")
        if graphs:
            row[col("speedup_graph")] = (speedup_text(c.graph, lang) if c.graph is not None
                                         else t_in(lang, "chart.missing.not_measured"))
        interval = v.interval
        row.update({
            col("ci"): f"{interval[0]:.2f}–{interval[1]:.2f}×" if interval else (
                t_in(lang, "chart.cell.no_test") if v.speedup is not None else why),
            "p": _num(v.p_value, "{:.2g}", "—"), col("rounds"): str(v.n) if v.n else "—",
            col("limited_by"): t_in(lang, f"chart.limit.{c.limited_by}") if c.limited_by in (HOST, GPU)
            else (c.limited_by or "—"),
            col("unfused_ms"): _num(c.unfused.median if c.unfused else None, "{:.4f}", "—"),
            col("fused_ms"): _num(c.fused.median if c.fused else None, "{:.4f}", "—"),
            col("launches"): f"{c.launches_unfused} → {c.launches_fused}" if c.launches_unfused is not None
            and c.launches_fused is not None else "—",
            col("max_abs_err"): _num(c.max_abs, "{:.2e}", "—"), col("rel_err"): _num(c.rel_err, "{:.2e}", "—"),
            col("status"): status_label(c.status, lang),
            col("note"): NOTE_SEP.get(lang, "; ").join(message(x, lang) for x in (v.note, c.reason) if x)})
        rows.append(row)
    return rows


def _not_timed(c: Any, lang: str) -> str:
    """Why a chain has no speed-up: not fused (and why), no fused kernel here, not timed."""
    if c.status != "fused":
        return t_in(lang, "chart.missing.not_fused", status=status_label(c.status, lang))
    if c.verdict.label == NO_KERNEL:
        return verdict_label(NO_KERNEL, lang)
    return t_in(lang, "chart.missing.not_timed")


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


def _pattern_label(name: str, lang: str) -> str:
    return translate_text(BY_NAME[name].label, lang) if name in BY_NAME else str(name)


def chain_speedup_figure(report: Report, lang: str = "en") -> go.Figure:
    """Horizontal bars of per-chain speed-up (unfused/fused time), sorted, styled by verdict."""
    measured = sorted((c for c in report.chains if c.speedup is not None), key=lambda c: c.speedup)
    styles = [bar_style(c.verdict.label, c.pattern) for c in measured]
    hover = [f"{c.title}<br>{c.id}<br>{_pattern_label(c.pattern, lang)}: "
             + (t_in(lang, "chart.hover.medians", u=c.unfused.median, f=c.fused.median) if c.unfused and c.fused
                else "")
             + describe_verdict(c.verdict, lang)
             + (t_in(lang, "chart.hover.graph", x=c.graph_speedup) if c.graph_speedup is not None else "")
             for c in measured]
    # A log axis, each bar from 1 (no change) to its speed-up: 0.5x and 2x are as long, and one chain far from
    # the others cannot make the rest unreadable. Each bar is labelled with its speed-up and interval.
    fig = go.Figure(go.Bar(x=[c.speedup - 1.0 for c in measured], base=[1.0] * len(measured),
                           y=[c.title for c in measured], orientation="h",
                           marker=dict(color=[s[0] for s in styles], pattern_shape=[s[1] for s in styles],
                                       opacity=[s[2] for s in styles]),
                           text=[speedup_text(c.verdict, lang) if c.speedup >= 1 else "" for c in measured],
                           textposition="outside", cliponaxis=False, customdata=[c.speedup for c in measured],
                           hovertext=hover, hoverinfo="text", showlegend=False))
    # A bar below 1 ends on the left, where its label would run over the chains' names: its label goes right of
    # the no-change line instead, in its row's empty half (a log axis takes an annotation's x as log10).
    for c in measured:
        if c.speedup < 1:
            fig.add_annotation(x=0.0, y=c.title, text=speedup_text(c.verdict, lang), showarrow=False,
                               xanchor="left", xshift=6, font=dict(size=12))
    fig.add_vline(x=1.0, line_dash="dash", line_color="#444", annotation_text=t_in(lang, "chart.speedup.no_change"),
                  annotation_position="top")
    for name in sorted({c.pattern for c in measured if c.verdict.label in (FASTER, SAME)}):
        fig.add_trace(go.Bar(x=[None], y=[None], marker_color=color_of(name), name=_pattern_label(name, lang)))
    for verdict in (SAME, SLOWER):
        if any(c.verdict.label == verdict for c in measured):
            color, shape, opacity = bar_style(verdict, "")
            undecided = verdict == SAME and any(c.verdict.reading == UNDECIDED for c in measured)
            fig.add_trace(go.Bar(x=[None], y=[None], name=t_in(lang, "chart.legend.same_undecided" if undecided
                                                               else LEGEND_KEYS[verdict]),
                                 marker=dict(color=color if verdict == SLOWER else "#888888",
                                             pattern_shape=shape, opacity=opacity)))
    values = [c.speedup for c in measured] or [1.0]
    low, high = min(min(values), 1.0), max(max(values), 1.0)
    span = max(math.log10(high) - math.log10(low), 0.1)
    fig.update_xaxes(type="log", range=[math.log10(low) - 0.08 * span - 0.02, math.log10(high) + 0.45 * span + 0.05])
    height = max(330, 22 * len(measured) + 190)
    fig.update_layout(title=t_in(lang, "chart.speedup.title"), xaxis_title=t_in(lang, "chart.speedup.x"),
                      height=height, margin=dict(l=10, r=10, t=60, b=110), yaxis=dict(automargin=True),
                      # the legend below the axis title, in pixels (paper units shrink with a short chart and put
                      # it over the title: seen in Chromium on a two-chain model)
                      legend=dict(orientation="h", yanchor="top", y=-64 / max(height - 170, 1) if measured else 0))
    if not measured:
        fig.add_annotation(text=t_in(lang, "chart.speedup.empty"), showarrow=False, x=0.5, y=0.5,
                           xref="paper", yref="paper")
    return fig


def chain_precision_figure(report: Report, lang: str = "en") -> go.Figure:
    """Per-chain max abs error of the fused chain against float64 (log scale)."""
    chains = [c for c in report.chains if c.max_abs is not None]
    vals = [max(float(c.max_abs), 1e-12) for c in chains]
    fig = go.Figure(go.Bar(x=[c.title for c in chains], y=vals, marker_color=[color_of(c.pattern) for c in chains],
                           hovertext=[t_in(lang, "chart.precision.hover", id=c.id, max_abs=c.max_abs, rel=c.rel_err)
                                      for c in chains],
                           hoverinfo="text"))
    # An explicit log range a decade either side of the data: plotly's autorange on a log axis
    # with one or two bars picks odd, unlabelled ticks.
    lo = math.floor(math.log10(min(vals))) - 1 if vals else -12
    hi = math.ceil(math.log10(max(vals))) + 1 if vals else 0
    fig.update_layout(title=t_in(lang, "chart.precision.title"),
                      yaxis=dict(type="log", range=[lo, hi], exponentformat="power", dtick=1),
                      yaxis_title=t_in(lang, "chart.precision.y"), height=340, margin=dict(l=40, r=10, t=60, b=40),
                      xaxis=dict(showticklabels=len(chains) <= 30))
    return fig


def _stage_values(report: Report, lang: str) -> list[dict[str, Any]]:
    """The staged table's numbers by stage, with untranslated keys (the figure and the rows read them)."""
    first = next((s.latency for s in report.stages if s.latency is not None), None)
    out = []
    for i, s in enumerate(report.stages):
        lat: Latency | None = s.latency
        mem = s.peak_memory_bytes
        above = i > 0 and report.stages[i - 1].stage == s.same_as   # the usual case, said short: the cell fits
        same = (t_in(lang, "chart.missing.same_stage_above") if above
                else t_in(lang, "chart.missing.same_stage", stage=next(
                    (stage_label(o.stage, o.label, lang) for o in report.stages if o.stage == s.same_as), s.same_as))
                if s.same_as else t_in(lang, "chart.missing.not_timed"))
        out.append({"stage": stage_label(s.stage, s.label, lang), "latency": lat.median if lat else None,
                    "p20": lat.p20 if lat else None, "p80": lat.p80 if lat else None,
                    "throughput": s.throughput, "memory": mem / 2**20 if mem is not None else None,
                    "speedup": (first.median / lat.median) if (first and lat) else None,
                    "ops": s.graph_ops or None, "graph": message(s.differs, lang), "why": same,
                    "memory_why": t_in(lang, "chart.missing.memory_cpu") if report.is_cpu
                    else (same if lat is None else t_in(lang, "chart.missing.not_measured"))})
    return out


def stages_rows(report: Report, lang: str = "en") -> list[dict[str, Any]]:
    """The seed's staged table, all four stages: latency, throughput, memory, speed-up over the original,
    and how each stage's graph differs from the previous one (or which stage it is identical to)."""
    col = lambda name: t_in(lang, f"chart.col.{name}")  # noqa: E731
    rows = []
    for v in _stage_values(report, lang):
        why = v["why"]
        rows.append({col("stage"): v["stage"], col("latency_median"): _num(v["latency"], "{:.3f}", why),
                     "p20": _num(v["p20"], "{:.3f}", "—"), "p80": _num(v["p80"], "{:.3f}", "—"),
                     col("throughput"): _num(v["throughput"], "{:,.1f}", "—"),
                     col("memory_mib"): _num(v["memory"], "{:,.1f}", v["memory_why"]),
                     col("speedup_stage"): _num(v["speedup"], "{:.2f}×", "—"),
                     col("ops"): str(v["ops"]) if v["ops"] else "—", col("graph"): v["graph"]})
    return rows


def stages_figure(report: Report, lang: str = "en") -> go.Figure:
    """Latency per fusion level (bars with p20-p80) and throughput (line, right axis); stages whose graph
    is identical to an earlier one are named but not drawn as a new bar."""
    rows = [r for r in _stage_values(report, lang) if r["latency"] is not None]
    labels = [str(r["stage"]) for r in rows]
    fig = make_subplots(specs=[[{"secondary_y": True}]])
    med = [r["latency"] for r in rows]
    err = dict(type="data", symmetric=False, array=[r["p80"] - r["latency"] for r in rows],
               arrayminus=[r["latency"] - r["p20"] for r in rows])
    palette = ["#8c8c8c", "#ff7f0e", "#2ca02c", "#1f77b4"]
    latency, throughput = t_in(lang, "chart.stages.latency"), t_in(lang, "chart.stages.throughput")
    fig.add_trace(go.Bar(x=labels, y=med, error_y=err, name=latency,
                         marker_color=[palette[i % len(palette)] for i in range(len(rows))]), secondary_y=False)
    fig.add_trace(go.Scatter(x=labels, y=[r["throughput"] for r in rows], name=throughput,
                             mode="lines+markers", line=dict(color="#111111")), secondary_y=True)
    fig.update_yaxes(title_text=latency, secondary_y=False, rangemode="tozero")
    fig.update_yaxes(title_text=throughput, secondary_y=True, rangemode="tozero")
    fig.update_layout(title=t_in(lang, "chart.stages.title"),
                      height=380, margin=dict(l=40, r=40, t=60, b=40), legend=dict(orientation="h", y=-0.15))
    if not rows:
        fig.add_annotation(text=t_in(lang, "chart.stages.empty"), showarrow=False, x=0.5, y=0.5,
                           xref="paper", yref="paper")
    return fig
