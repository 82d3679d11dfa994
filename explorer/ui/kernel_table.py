"""The Learn page's per-shape kernel table of the LLM kernels: ours, cuBLAS + pass (or eager), inductor, on the H200.

Read-only: it renders the ``table`` entries of the committed
``benchmarks/results/bench_llm_epilogues_h200.json`` (written by
``benchmarks/bench_llm_epilogues.py``), one row per kernel and shape, with the
fraction of a device copy (memory-bound kernels) or of cuBLAS's matrix rate
(the GEMMs with an epilogue) measured in the same run, and what the explorer
runs there (``explorer.fusions.kernels.measured`` reads the same numbers).
``kernel_rows`` makes the rows (no Streamlit: tested); ``panel`` draws them.
Its words are its own (``WORDS``), in English and 中文.
"""

from __future__ import annotations

import json
from pathlib import Path

from explorer.words import Words, merge, render

#: The committed runs, first the full one, then shorter follow-ups (each row is timed against competitors of its own run).
FILES = ("bench_llm_epilogues_h200.json", "bench_llm_epilogues_followup_h200.json")
FILE = FILES[0]

WORDS = Words("kernel_table", {
    "title": ("Per-shape kernel table: LLM kernels on the H200", "按形状的内核表：H200 上的 LLM 内核"),
    "intro": (("Each row is one kernel at one shape, timed in one run with its competitors ({date}, {device}). "
               "Memory-bound kernels are compared with a device copy of the same bytes; GEMMs with an epilogue "
               "with cuBLAS's GEMM alone (the matrix rate). A fused GEMM runs only where it measured faster "
               "than cuBLAS + pass."),
              ("每一行是一个内核在一个形状下，与对手在同一次运行中计时（{date}，{device}）。"
               "受内存带宽限制的内核与同字节数的设备拷贝相比；带尾处理的 GEMM 与单独的 cuBLAS GEMM（矩阵乘速率）相比。"
               "融合的 GEMM 只在实测比 cuBLAS + 单独一遍更快的地方运行。")),
    "col.case": ("kernel and shape", "内核与形状"),
    "col.ours": ("ours (µs)", "我们的（µs）"),
    "col.baseline": ("cuBLAS + pass / eager (µs)", "cuBLAS + 单独一遍 / eager（µs）"),
    "col.inductor": ("torch.compile (µs)", "torch.compile（µs）"),
    "col.fraction": ("ours, % of", "我们的，占"),
    "col.runs": ("what runs", "实际运行"),
    "metric.copy": ("{pct:.0f}% of copy", "拷贝的 {pct:.0f}%"),
    "metric.matrix": ("{pct:.0f}% of cuBLAS's rate", "cuBLAS 速率的 {pct:.0f}%"),
    "runs.ours": ("ours (the epilogue)", "我们的（尾处理）"),
    "runs.baseline": ("cuBLAS + pass (ours measured slower)", "cuBLAS + 单独一遍（我们的实测更慢）"),
    "runs.kernel": ("our kernel", "我们的内核"),
    "target.met": ("{pct:.1f}% of copy: target 93% met", "拷贝的 {pct:.1f}%：达到 93% 的目标"),
    "target.missed": ("{pct:.1f}% of copy: target 93% missed", "拷贝的 {pct:.1f}%：未达到 93% 的目标"),
    "missing": ("No committed kernel table ({file}): run benchmarks/bench_llm_epilogues.py on a GPU.",
                "没有提交的内核表（{file}）：请在 GPU 上运行 benchmarks/bench_llm_epilogues.py。"),
})
CATALOG = merge([WORDS])


def _w(lang: str, key: str, **args) -> str:
    return render(WORDS(key, **args), lang, CATALOG)


def _us(ms) -> str:
    return "-" if ms is None else f"{ms * 1e3:.1f}"


def load(results: Path, name: str = FILE) -> dict | None:
    """A committed benchmark document, or None where it is missing or unreadable."""
    try:
        return json.loads((results / name).read_text())
    except (OSError, ValueError):
        return None


def kernel_rows(doc: dict, lang: str = "en") -> list[dict[str, str]]:
    """One row per kernel-table entry of ``doc`` (every part), column names and cells in ``lang``."""
    rows = []
    for part in [k for k, v in doc.items() if isinstance(v, dict) and "table" in v]:   # the bench's parts, in order
        for e in doc[part].get("table", []):
            gemm = e.get("metric") == "matrix rate"
            pct = 100 * (e.get("ours_fraction") or 0)
            if gemm:
                runs = _w(lang, "runs.ours" if e.get("decision") == "ours" else "runs.baseline")
                fraction = _w(lang, "metric.matrix", pct=pct)
            else:
                default = 100 * (e.get("default_fraction") or 0)
                runs = _w(lang, "runs.kernel")
                fraction = _w(lang, "target.met" if default >= 93 else "target.missed", pct=default)
            rows.append({_w(lang, "col.case"): str(e.get("case", "")), _w(lang, "col.ours"): _us(e.get("ours_ms") if gemm else e.get("ours_default_ms")),
                         _w(lang, "col.baseline"): _us(e.get("baseline_ms")),
                         _w(lang, "col.inductor"): _us(e.get("inductor_ms")),
                         _w(lang, "col.fraction"): fraction, _w(lang, "col.runs"): runs})
    return rows


def panel(results: Path, lang: str) -> None:
    """Draw the table in an expander on the Learn page (a one-line note where the file is missing)."""
    import streamlit as st

    with st.expander(_w(lang, "title")):
        docs = [(name, load(results, name)) for name in FILES]
        if docs[0][1] is None:
            st.caption(_w(lang, "missing", file=FILE))
            return
        for name, doc in docs:
            if doc is None:
                continue
            env = doc.get("environment") or {}
            st.caption(_w(lang, "intro", date=str(doc.get("date_utc", ""))[:16].replace("T", " "),
                          device=env.get("device_name", "?")) + f" ({name})")
            st.dataframe(kernel_rows(doc, lang), hide_index=True, width="stretch")
