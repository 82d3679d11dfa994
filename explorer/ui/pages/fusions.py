"""Fusions page: every chain by its person's name, with an accept box and its kernel in one table;
bulk accept, reject and kernel choice by pattern; once a report exists, each chain's measured
speed-up and verdict beside it; near misses; the plan.

Widget keys: chains_editor_<editor_version> (the table), fusions_filter, bulk_pattern,
bulk_accept_pattern, bulk_reject_pattern, bulk_accept_all, bulk_reject_all, bulk_kernel,
bulk_kernel_set, chain_pick, chain_accept, chain_reject, kernel@<chain id> (the kernel choice in
the one-chain panel), plan_download, plan_file.
"""

from __future__ import annotations

import pandas as pd
import streamlit as st

from explorer.fusions import BY_NAME
from explorer.fusions.base import KERNEL_CHOICES
from explorer.graph_view import chain_name, human_bytes
from explorer.ui import files as ui_files
from explorer.ui import state as ui_state


def _label(pattern: str) -> str:
    return BY_NAME[pattern].label if pattern in BY_NAME else pattern


def _kernels(pattern: str) -> list[str]:
    """The kernel choices a plan may name for this pattern (the registry's list)."""
    return list(BY_NAME[pattern].kernels) if pattern in BY_NAME else ["auto"]


def _bulk(detection, pattern: str | None, accept: bool) -> None:
    acc = set(ui_state.accepted_ids(detection))
    ids = {c.id for c in detection.chains if pattern is None or c.pattern == pattern}
    ui_state.set_accepted(detection, acc | ids if accept else acc - ids)


def _bulk_kernel(detection, pattern: str | None) -> None:
    choice = st.session_state.get("bulk_kernel", "auto")
    if pattern is None or choice not in _kernels(pattern):
        return
    ui_state.set_kernels(detection, {c.id: choice for c in detection.chains if c.pattern == pattern})


def _one(detection, chain_id: str, accept: bool) -> None:
    acc = set(ui_state.accepted_ids(detection))
    ui_state.set_accepted(detection, acc | {chain_id} if accept else acc - {chain_id})


def _get(obj, key: str):
    """``obj[key]`` of a dict, ``obj.key`` of anything else, None when absent."""
    return obj.get(key) if isinstance(obj, dict) else getattr(obj, key, None)


def measured(report, detection) -> dict[str, tuple[float | None, str]]:
    """{chain id: (speed-up, verdict)} from a report of this model (by graph fingerprint, else by
    model name); empty when there is none. Read defensively: a report dict (the runner's JSON, or
    a saved file) or the typed report, whose chains carry a verdict object with a ``label``."""
    chains = _get(report, "chains") if report is not None else None
    if not isinstance(chains, (list, tuple)):
        return {}
    model, plan = _get(report, "model") or {}, _get(report, "plan") or {}
    fingerprint = _get(model, "fingerprint") or _get(plan, "fingerprint")
    if fingerprint and fingerprint != detection.fingerprint:
        return {}
    if not fingerprint and _get(model, "name") not in (None, detection.model):
        return {}
    out = {}
    for entry in chains:
        chain_id = _get(entry, "id")
        if chain_id is None:
            continue
        speedup = _get(entry, "speedup")
        speedup = float(speedup) if isinstance(speedup, (int, float)) else None
        verdict = _get(entry, "verdict")
        if verdict is not None and not isinstance(verdict, str):
            verdict = _get(verdict, "label")
        if not isinstance(verdict, str):
            verdict = "slower" if _get(entry, "slower") else ("faster" if speedup is not None else "")
        out[str(chain_id)] = (speedup, verdict)
    return out


def _table(detection, shown, accepted, results) -> pd.DataFrame:
    columns = {
        "accept": pd.Series([c.id in accepted for c in shown], dtype=bool),
        "chain": [chain_name(c) for c in shown],
        "pattern": [_label(c.pattern) for c in shown],
        "kernel": [ui_state.kernel_for(detection, c.id) for c in shown],
        "launches saved": pd.Series([c.launches_saved for c in shown], dtype="int64"),
        "bytes saved (MiB)": pd.Series([c.bytes_saved / 2**20 for c in shown], dtype="float64"),
        "extra outputs": [", ".join(c.extra_outputs) for c in shown],
    }
    if results:
        columns["speed-up"] = pd.Series([results.get(c.id, (None, ""))[0] for c in shown], dtype="float64")
        columns["verdict"] = [results.get(c.id, (None, ""))[1] for c in shown]
    columns["id"] = [c.id for c in shown]
    return pd.DataFrame(columns)


def _apply_edits(detection, shown, accepted, edited: pd.DataFrame) -> list[str]:
    """Turn the table's edits into choices; return the kernel edits refused (not the pattern's)."""
    if len(edited) != len(shown):
        return []
    refused = []
    new = {c.id for c, ok in zip(shown, edited["accept"]) if ok}
    old = {c.id for c in shown if c.id in accepted}
    kernels = {}
    for c, choice in zip(shown, edited["kernel"]):
        if choice != ui_state.kernel_for(detection, c.id):
            if choice in _kernels(c.pattern):
                kernels[c.id] = choice
            else:
                refused.append(f"{chain_name(c)}: '{choice}' is not a kernel of {_label(c.pattern)} "
                               f"(choose {', '.join(_kernels(c.pattern))})")
    if new != old:
        ui_state.set_accepted(detection, (set(accepted) - {c.id for c in shown}) | new)
    if kernels:
        ui_state.set_kernels(detection, kernels)
    if new != old or kernels:
        st.rerun()
    return refused


def page() -> None:
    cur = ui_state.current_or_prompt()
    if cur is None:
        return
    spec, model, graph, detection = cur
    ss = st.session_state
    accepted = ui_state.accepted_ids(detection)
    st.subheader(f"Fusible chains in {ui_files.escape_markdown(model.name)}")
    if not detection.chains:
        st.info("No fusible chain was found in this model. The near misses below say why candidates were refused.")
    else:
        _chains_section(detection, accepted)
    _near_misses(detection)
    _plan_section(model, detection)


def _chains_section(detection, accepted) -> None:
    ss = st.session_state
    patterns = [p for p, n in detection.counts.items() if n]
    # --- bulk actions, by pattern
    b = st.columns([2, 1.15, 1.15, 1.6, 1.0, 0.9, 0.9], vertical_alignment="bottom")
    if ss.get("bulk_pattern") not in patterns:
        ss.bulk_pattern = patterns[0]
    b[0].selectbox("Pattern", patterns, key="bulk_pattern", format_func=_label)
    pat = ss.bulk_pattern
    b[1].button("Accept all of it", key="bulk_accept_pattern", on_click=_bulk, args=(detection, pat, True))
    b[2].button("Reject all of it", key="bulk_reject_pattern", on_click=_bulk, args=(detection, pat, False))
    kernel_options = _kernels(pat)
    if ss.get("bulk_kernel") not in kernel_options:
        ss.bulk_kernel = kernel_options[0]
    b[3].selectbox("Kernel for all of it", kernel_options, key="bulk_kernel",
                   help="\n\n".join(f"**{k}**: {KERNEL_CHOICES.get(k, k)}" for k in kernel_options))
    b[4].button("Set kernel", key="bulk_kernel_set", on_click=_bulk_kernel, args=(detection, pat))
    b[5].button("Accept all", key="bulk_accept_all", on_click=_bulk, args=(detection, None, True))
    b[6].button("Reject all", key="bulk_reject_all", on_click=_bulk, args=(detection, None, False))

    # --- the table: accept and kernel are editable
    st.multiselect("Show patterns", patterns, key="fusions_filter", format_func=_label, placeholder="all patterns")
    shown = [c for c in detection.chains if not ss.fusions_filter or c.pattern in ss.fusions_filter]
    report = ss.last_report[1] if ss.get("last_report") else None
    results = measured(report, detection)
    table = _table(detection, shown, accepted, results)
    all_kernels = list(dict.fromkeys(k for c in detection.chains for k in _kernels(c.pattern)))
    config = {
        "accept": st.column_config.CheckboxColumn("accept", help="Fuse this chain", width=70),
        "chain": st.column_config.TextColumn("chain", width=265,
                                             help="The chain's ops by module path; its id is in the last column"),
        "pattern": st.column_config.TextColumn("pattern", width=120),
        "kernel": st.column_config.SelectboxColumn(
            "kernel", options=all_kernels, required=True, width=120,
            help="The plan's kernel choice for this chain: " + "; ".join(
                f"{k}: {KERNEL_CHOICES.get(k, k)}" for k in all_kernels)),
        "launches saved": st.column_config.NumberColumn("launches", width=80, help="Kernel launches saved"),
        "bytes saved (MiB)": st.column_config.NumberColumn("MiB saved", format="%.2f", width=80,
                                                           help="Intermediate traffic saved (graph byte model, fp32)"),
        "extra outputs": st.column_config.TextColumn("extra outputs", width=90,
                                                     help="Intermediates the fused kernel must still write"),
        "speed-up": st.column_config.NumberColumn("speed-up", format="%.2f×", width=80,
                                                  help="Measured, this chain alone: unfused time / fused time"),
        "verdict": st.column_config.TextColumn("verdict", width=70),
        "id": st.column_config.TextColumn("id", width=175, help="The chain's stable id (plans and reports use it)"),
    }
    edited = st.data_editor(
        table, key=f"chains_editor_{ss.editor_version}", hide_index=True, width="stretch",
        disabled=[c for c in table.columns if c not in ("accept", "kernel")],
        column_config={k: v for k, v in config.items() if k in table.columns},
        height=min(35 * (len(shown) + 1) + 3, 520),
    )
    for line in _apply_edits(detection, shown, accepted, edited):
        st.warning(f"Kernel not changed: {ui_files.escape_markdown(line)}.")
    acc_chains = [c for c in detection.chains if c.id in accepted]
    st.caption(f"{len(acc_chains)} of {len(detection.chains)} accepted · would save "
               f"{sum(c.launches_saved for c in acc_chains)} launches and "
               f"{human_bytes(sum(c.bytes_saved for c in acc_chains))} of memory traffic (graph byte model, fp32)."
               + (" Speed-up and verdict: the latest report of this model (Results page)." if results else
                  " Run the model (Run page) to see each chain's measured speed-up here."))

    # --- one chain
    with st.expander("One chain: details, accept or reject", expanded=False):
        ids = [c.id for c in detection.chains]
        if ss.get("chain_pick") not in ids:
            ss.chain_pick = ids[0]
        cid = st.selectbox("Chain", ids, key="chain_pick",
                           format_func=lambda i: f"{chain_name(detection.chain(i))} ({i})")
        chain = detection.chain(cid)
        speedup, verdict = results.get(cid, (None, ""))
        st.markdown(f"**{_label(chain.pattern)}** — {'accepted' if cid in accepted else 'rejected'}  \n"
                    f"id: `{chain.id}`  \nops: `{chain.ops_text}`  \norigin: `{', '.join(chain.names)}`  \n"
                    f"saves {chain.launches_saved} launch(es) and {human_bytes(chain.bytes_saved)}"
                    + (f"  \nextra outputs kept: {', '.join(chain.extra_outputs)}" if chain.extra_outputs else "")
                    + (f"  \nmeasured: {speedup:.2f}× ({verdict})" if speedup is not None else ""))
        c = st.columns(2)
        c[0].button("Accept this chain", key="chain_accept", on_click=_one, args=(detection, cid, True))
        c[1].button("Reject this chain", key="chain_reject", on_click=_one, args=(detection, cid, False))
        choices = _kernels(chain.pattern)
        key = f"kernel@{cid}"
        current = ui_state.kernel_for(detection, cid)
        if ss.get(key) != current:  # follow the plan (e.g. one just uploaded, or the table)
            ss[key] = current if current in choices else "auto"
        st.selectbox("Kernel for this chain (the plan's kernel choice)", choices, key=key,
                     format_func=lambda k: f"{k}: {KERNEL_CHOICES.get(k, k)}",
                     on_change=lambda: ui_state.set_kernels(detection, {cid: st.session_state[key]}))


def _near_misses(detection) -> None:
    st.subheader("Near misses: why these were not fused")
    if detection.near_misses:
        st.dataframe(pd.DataFrame({
            "pattern": [_label(m.pattern) for m in detection.near_misses],
            "nodes": [", ".join(m.nodes) for m in detection.near_misses],
            "reason": [m.reason for m in detection.near_misses],
        }), hide_index=True, width="stretch")
    else:
        st.caption("No candidate was refused.")


def _plan_section(model, detection) -> None:
    ss = st.session_state
    st.subheader("Plan")
    plan = ui_state.current_plan(detection)
    c = st.columns([1, 2])
    c[0].download_button("Download plan (JSON)", plan.to_json(), file_name=f"{model.name}.plan.json",
                         mime="application/json", key="plan_download")
    c[1].file_uploader("Restore choices from a plan", type=["json"], key="plan_file",
                       on_change=ui_state.on_plan_upload)
    if ss.plan_error:
        st.error(f"Plan not applied: {ss.plan_error}")
    elif ss.plan_notice:
        st.success(ss.plan_notice)


ui_state.guarded(page)
