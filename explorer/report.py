"""The run report: its version and its plain-text summary.

A report is what ``explorer.gpu_runner.run`` returns and what the app, the
command line, the plan helpers and the CSV export read.
"""

from __future__ import annotations

from typing import Any

REPORT_VERSION = 1


def summary_table(report: dict) -> str:
    """A compact plain-text table of a report (for the CLI)."""
    env = report.get("environment", {})
    lines = [f"{report.get('model', {}).get('name', '?')} on {env.get('device_name')} "
             f"({report.get('settings', {}).get('dtype')}, batch {report.get('model', {}).get('batch')})"
             + (f"  [{env.get('note')}]" if env.get("is_cpu") else "")]
    lines.append(f"{'variant':<30}{'median ms':>11}{'p20':>9}{'p80':>9}{'items/s':>11}{'launches':>10}{'rel_l2':>10}")

    def row(name: str, r: dict) -> None:
        lat = r.get("latency_ms") or {}
        prec = r.get("precision") or {}
        rel = prec.get("rel_l2")
        lines.append(f"{name:<30}{_fmt(lat.get('median')):>11}{_fmt(lat.get('p20')):>9}{_fmt(lat.get('p80')):>9}"
                     f"{_fmt(r.get('throughput'), 1):>11}{str(r.get('kernel_launches', '')):>10}"
                     f"{(f'{rel:.1e}' if isinstance(rel, float) else '-'):>10}")

    for key in ("unfused", "fused"):
        if key in report:
            row(key, report[key])
    for s in report.get("stages") or []:
        row(f"stage: {s['label']}", s)
    for name, r in (report.get("baselines") or {}).items():
        if isinstance(r, dict) and "latency_ms" in r:
            row(f"baseline: {name}", r)
    chains = report.get("chains") or []
    if chains:
        slower = [c["id"] for c in chains if c.get("slower")]
        failed = [c["id"] for c in chains if c.get("status") == "failed"]
        lines.append(f"chains: {len(chains)} accepted, {len(slower)} slower when fused"
                     + (f" ({', '.join(slower[:5])})" if slower else "")
                     + (f", {len(failed)} failed" if failed else ""))
    if report.get("speedup"):
        lines.append(f"speedup fused vs unfused: {report['speedup']:.3f}x")
    return "\n".join(lines)


def _fmt(x: Any, digits: int = 3) -> str:
    return f"{x:.{digits}f}" if isinstance(x, (int, float)) else "-"
