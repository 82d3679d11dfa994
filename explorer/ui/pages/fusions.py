"""Fusions page: every chain with an accept box, bulk actions, near misses, the plan.

Widget keys: chains_editor_<editor_version> (the table), fusions_filter, bulk_pattern,
bulk_accept_pattern, bulk_reject_pattern, bulk_accept_all, bulk_reject_all, chain_pick,
chain_accept, chain_reject, kernel@<chain id> (the kernel choice), plan_download, plan_file.
"""

from __future__ import annotations

import pandas as pd
import streamlit as st

from explorer.ui import state as ui_state
from explorer.graph_view import human_bytes
from explorer.fusions import BY_NAME
from explorer.fusions.base import KERNEL_CHOICES


def _label(pattern: str) -> str:
    return BY_NAME[pattern].label if pattern in BY_NAME else pattern


def _bulk(detection, pattern: str | None, accept: bool) -> None:
    acc = set(ui_state.accepted_ids(detection))
    ids = {c.id for c in detection.chains if pattern is None or c.pattern == pattern}
    ui_state.set_accepted(detection, acc | ids if accept else acc - ids)


def _one(detection, chain_id: str, accept: bool) -> None:
    acc = set(ui_state.accepted_ids(detection))
    ui_state.set_accepted(detection, acc | {chain_id} if accept else acc - {chain_id})


def page() -> None:
    cur = ui_state.current_or_prompt()
    if cur is None:
        return
    spec, model, graph, detection = cur
    accepted = ui_state.accepted_ids(detection)
    st.subheader(f"Fusible chains in {model.name}")
    if not detection.chains:
        st.info("No fusible chain was found in this model. The near misses below say why candidates were refused.")

    patterns = [p for p, n in detection.counts.items() if n]
    # --- bulk actions
    b = st.columns([2, 1.2, 1.2, 1, 1])
    b[0].selectbox("Pattern", patterns or ["(none)"], key="bulk_pattern", format_func=_label)
    pat = st.session_state.bulk_pattern if patterns else None
    b[1].button("Accept all of pattern", key="bulk_accept_pattern", on_click=_bulk, args=(detection, pat, True),
                disabled=pat is None)
    b[2].button("Reject all of pattern", key="bulk_reject_pattern", on_click=_bulk, args=(detection, pat, False),
                disabled=pat is None)
    b[3].button("Accept all", key="bulk_accept_all", on_click=_bulk, args=(detection, None, True))
    b[4].button("Reject all", key="bulk_reject_all", on_click=_bulk, args=(detection, None, False))

    # --- the table
    st.multiselect("Show patterns", patterns, key="fusions_filter", format_func=_label,
                   placeholder="all patterns")
    shown = [c for c in detection.chains if not st.session_state.fusions_filter
             or c.pattern in st.session_state.fusions_filter]
    table = pd.DataFrame({
        "accept": [c.id in accepted for c in shown],
        "pattern": [_label(c.pattern) for c in shown],
        "chain": [c.id for c in shown],
        "ops": [c.ops_text for c in shown],
        "origin": [", ".join(dict.fromkeys(c.names)) for c in shown],
        "bytes saved (MiB)": [c.bytes_saved / 2**20 for c in shown],
        "launches saved": [c.launches_saved for c in shown],
        "extra outputs": [", ".join(c.extra_outputs) for c in shown],
    })
    edited = st.data_editor(
        table, key=f"chains_editor_{st.session_state.editor_version}", hide_index=True,
        width="stretch", disabled=[c for c in table.columns if c != "accept"],
        column_config={
            "accept": st.column_config.CheckboxColumn("accept", help="Fuse this chain"),
            "bytes saved (MiB)": st.column_config.NumberColumn(format="%.3f"),
        },
        height=min(35 * (len(shown) + 1) + 3, 520),
    )
    if len(edited) == len(shown):
        new = {cid for cid, ok in zip(edited["chain"], edited["accept"]) if ok}
        old = {c.id for c in shown if c.id in accepted}
        if new != old:
            ui_state.set_accepted(detection, (set(accepted) - {c.id for c in shown}) | new)
            st.rerun()
    acc_chains = [c for c in detection.chains if c.id in accepted]
    st.caption(f"{len(acc_chains)} of {len(detection.chains)} accepted · would save "
               f"{sum(c.launches_saved for c in acc_chains)} launches and "
               f"{human_bytes(sum(c.bytes_saved for c in acc_chains))} of memory traffic (graph byte model, fp32).")

    # --- one chain
    if detection.chains:
        with st.expander("One chain: details, accept or reject", expanded=False):
            ids = [c.id for c in detection.chains]
            if st.session_state.get("chain_pick") not in ids:
                st.session_state.chain_pick = ids[0]
            cid = st.selectbox("Chain", ids, key="chain_pick")
            chain = detection.chain(cid)
            st.markdown(f"**{_label(chain.pattern)}** — {'accepted' if cid in accepted else 'rejected'}  \n"
                        f"ops: `{chain.ops_text}`  \norigin: `{', '.join(chain.names)}`  \n"
                        f"saves {chain.launches_saved} launch(es) and {human_bytes(chain.bytes_saved)}"
                        + (f"  \nextra outputs kept: {', '.join(chain.extra_outputs)}" if chain.extra_outputs else ""))
            c = st.columns(2)
            c[0].button("Accept this chain", key="chain_accept", on_click=_one, args=(detection, cid, True))
            c[1].button("Reject this chain", key="chain_reject", on_click=_one, args=(detection, cid, False))
            choices = list(BY_NAME[chain.pattern].kernels) if chain.pattern in BY_NAME else ["auto"]
            key = f"kernel@{cid}"
            current = ui_state.kernel_for(detection, cid)
            if st.session_state.get(key) != current:  # follow the plan (e.g. one just uploaded)
                st.session_state[key] = current if current in choices else "auto"
            st.selectbox("Kernel for this chain (the plan's kernel choice)", choices, key=key,
                         format_func=lambda k: f"{k}: {KERNEL_CHOICES.get(k, k)}",
                         on_change=lambda: ui_state.set_kernel(detection, cid, st.session_state[key]))

    # --- near misses
    st.subheader("Near misses: why these were not fused")
    if detection.near_misses:
        st.dataframe(pd.DataFrame({
            "pattern": [_label(m.pattern) for m in detection.near_misses],
            "nodes": [", ".join(m.nodes) for m in detection.near_misses],
            "reason": [m.reason for m in detection.near_misses],
        }), hide_index=True, width="stretch")
    else:
        st.caption("No candidate was refused.")

    # --- the plan
    st.subheader("Plan")
    plan = ui_state.current_plan(detection)
    c = st.columns([1, 2])
    c[0].download_button("Download plan (JSON)", plan.to_json(), file_name=f"{model.name}.plan.json",
                         mime="application/json", key="plan_download")
    c[1].file_uploader("Restore choices from a plan", type=["json"], key="plan_file",
                       on_change=ui_state.on_plan_upload)
    if st.session_state.plan_error:
        st.error(f"Plan not applied: {st.session_state.plan_error}")
    elif st.session_state.plan_notice:
        st.success(st.session_state.plan_notice)


ui_state.guarded(page)
