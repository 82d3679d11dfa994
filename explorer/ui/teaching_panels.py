"""Streamlit panels of the teaching results: the time breakdown, the traffic table and the staged table.

The Learn page draws them from this session or from an opened teaching report;
another page (the Results page, say) can draw a teaching report with the same
three calls::

    entry = explorer.teaching.report.model_entry(report, "resnet50")
    breakdown_panel(entry["breakdown"], entry["name"])
    traffic_panel(entry["traffic"], entry["name"])
    stages_panel(entry["stages"], t("teach.stages.from_report"))

Figures and rows come from ``explorer.ui.teaching_views``; every string from
the catalog (``explorer.ui.i18n``). A text that comes from the report (a note, an
error) is shown through ``escape_markdown``: a report file is data, never markdown.
"""

from __future__ import annotations

import streamlit as st

from explorer.ui import teaching_views as views
from explorer.ui.files import escape_markdown as plain
from explorer.ui.i18n import message, t
from explorer.units import human_bytes


def breakdown_panel(bd: dict, model_name: str = "", key: str = "chart_breakdown") -> None:
    """The time breakdown before and after fusion (a teaching report's or this session's), with how to read it."""
    st.markdown(f"#### {t('teach.bd.title')}")
    if "error" in bd:
        st.error(t("teach.bd.failed", error=plain(message(bd["error"]))))
        return
    if not bd:
        return
    cpu = any(b.get("is_cpu") for b in bd.values())
    if cpu:
        st.warning(t("teach.bd.cpu"))
    st.plotly_chart(views.breakdown_figure(bd), key=key, width="stretch")
    st.dataframe(views.breakdown_rows(bd), hide_index=True, width="stretch")
    unf, fus = bd.get("unfused"), bd.get("fused")
    if unf and fus:
        st.markdown(t("teach.bd.read", before=unf["wall_ms"], after=fus["wall_ms"],
                      launch_before=unf["categories_ms"]["launch_host"], launch_after=fus["categories_ms"]["launch_host"],
                      mem_before=unf["categories_ms"]["memory_bound"], mem_after=fus["categories_ms"]["memory_bound"],
                      k_before=unf["kernels"], k_after=fus["kernels"]))
    st.caption(t("teach.bd.seed_note"))
    with st.expander(t("teach.bd.rule_title")):
        st.markdown(t("teach.bd.rule"))
        ridge = (unf or fus or {}).get("ridge")
        st.markdown(t("teach.bd.ridge", ridge=f"{ridge:.1f}") if ridge else t("teach.bd.no_ridge"))
        for variant, b in bd.items():
            for note in b.get("notes") or []:
                st.caption(f"{t('teach.variant.' + variant)}: {plain(message(note))}")
            top = b.get("top") or []
            if top:
                st.markdown(f"**{t('teach.bd.top', variant=t('teach.variant.' + variant))}**")
                st.dataframe([{t("teach.col.node"): r.get("node") or "-", t("teach.col.kernel"): r["kernel"][:80],
                               t("teach.col.category"): views.category_label(r["category"], b.get("is_cpu")),
                               t("teach.col.us"): round(r["us"], 1),
                               t("teach.col.intensity"): f"{r['intensity']:.1f}" if r.get("intensity") else "—"}
                              for r in top], hide_index=True, width="stretch")


def traffic_panel(traffic: dict, model_name: str = "", key: str = "chart_traffic") -> None:
    """Memory traffic before and after fusion: the byte model, ncu's DRAM bytes where measured, and why they differ."""
    st.markdown(f"#### {t('teach.tr.title')}")
    if not traffic or "error" in traffic:
        st.caption(t("teach.tr.none"))
        return
    st.plotly_chart(views.traffic_figure(traffic, model_name), key=key, width="stretch")
    st.dataframe(views.traffic_rows(traffic), hide_index=True, width="stretch")
    st.caption(t("teach.tr.model_note"))
    ncu = traffic.get("ncu")
    if ncu is None:
        st.caption(t("teach.tr.no_ncu"))
        return
    for variant in ("unfused", "fused"):
        got = ncu.get(variant) or {}
        if "error" in got:
            st.caption(t("teach.tr.ncu_failed", variant=t("teach.variant." + variant), error=plain(message(got["error"]))))
    for variant, ex in (traffic.get("explained") or {}).items():
        reasons = " ".join(t("teach.tr.reason." + r, l2=human_bytes(ex["l2_bytes"]) if ex.get("l2_bytes") else "?")
                           for r in ex["reasons"])
        st.markdown(t("teach.tr.explained", variant=t("teach.variant." + variant),
                      model=ex["model_bytes"] / 1e6, dram=ex["dram_bytes"] / 1e6,
                      ratio=f"{ex['ratio']:.2f}" if ex.get("ratio") else "-", reasons=reasons))


def stages_panel(rows: list[dict], origin: str) -> None:
    """The staged table (original → Conv+BN folded → + epilogues → all accepted)."""
    st.markdown(f"#### {t('teach.stages.title')}")
    if not rows:
        st.caption(t("teach.stages.none"))
        return
    st.caption(origin)
    st.dataframe(views.stage_table(rows), hide_index=True, width="stretch")
    first, last = rows[0], next((r for r in reversed(rows) if r.get("latency_ms")), None)
    if first.get("latency_ms") and last and last is not first:
        st.markdown(t("teach.stages.read", before=first["latency_ms"], after=last["latency_ms"],
                      speedup=first["latency_ms"] / last["latency_ms"]))
