"""Fusions page: every chain by its person's name, with an accept box and its kernel in one table;
bulk accept, reject and kernel choice by pattern; once a report exists, each chain's measured
speed-up and verdict beside it; near misses; the plan.

Widget keys: chains_editor_<editor_version> (the table), fusions_filter, bulk_pattern,
bulk_accept_pattern, bulk_reject_pattern, bulk_accept_all, bulk_reject_all, bulk_kernel,
bulk_kernel_set, chain_pick, chain_accept, chain_reject, kernel@<chain id> (the kernel choice in
the one-chain panel), alt_use@<chain id>#<i> (use the chain's i-th alternative instead), plan_download,
plan_file. Competing fusions: a chain's alternatives (``Detection.alternatives``) are listed in the table's
"also possible" column and in the one-chain panel; a chosen alternative's chains appear in the table after
the chain they replace.

Every text is in the sidebar's language (``i18n.t``, ``locale/fusions.py``); the chain table keeps its
column ids in English (the edits and the tests read them) and shows translated headers through its
column configuration. Near-miss reasons and plan messages come from the engine in English and are
translated by ``i18n.message``; pattern labels and kernel choices by ``i18n.translate_text``.
"""

from __future__ import annotations

import pandas as pd
import streamlit as st

from explorer.fusions import BY_NAME
from explorer.fusions.base import KERNEL_CHOICES
from explorer.report import FASTER, NO_KERNEL, NOT_MEASURED, SAME, SLOWER
from explorer.ui import files as ui_files
from explorer.ui import state as ui_state
from explorer.ui.graph import chain_name
from explorer.ui.safe_text import code, markdown as plain
from explorer.ui.i18n import current as current_language
from explorer.ui.i18n import message, pattern_text, t, t_in, translate_text
from explorer.units import human_bytes

#: A verdict label of a report -> its catalog key.
VERDICT_KEYS = {FASTER: "verdict.faster", SLOWER: "verdict.slower", SAME: "verdict.same",
                NO_KERNEL: "verdict.no_kernel", NOT_MEASURED: "verdict.not_measured"}


def _label(pattern: str, lang: str | None = None) -> str:
    return translate_text(BY_NAME[pattern].label, lang) if pattern in BY_NAME else pattern


def verdict_text(verdict: str, lang: str | None = None) -> str:
    """A report's verdict label in ``lang`` (a label of another vocabulary through ``i18n.message``)."""
    if not verdict:
        return verdict
    key = VERDICT_KEYS.get(verdict)
    return t_in(lang or current_language(), key) if key else message(verdict, lang)


def _kernel_choice(kernel: str, lang: str | None = None) -> str:
    """What a kernel choice means, in ``lang``."""
    return translate_text(KERNEL_CHOICES[kernel], lang) if kernel in KERNEL_CHOICES else kernel


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
            # no test's label: a speed-up alone is not "faster" (every verdict comes from explorer.stats.compare;
            # a version 1 entry's "slower" flag is its own rule, which its upgraded report names)
            verdict = "slower" if _get(entry, "slower") else ""
        out[str(chain_id)] = (speedup, verdict)
    return out


def _rows(detection, accepted, patterns) -> list:
    """The table's chains: the detected ones (those of ``patterns`` when given), each followed by the chains
    of an alternative the user chose in its place."""
    out = []
    for c in detection.chains:
        if patterns and c.pattern not in patterns:
            continue
        out.append(c)
        out.extend(x for a in detection.alternatives_of(c.id) for x in a.chains
                   if x.id in accepted and x not in out)
    return out


def _also(detection, chain) -> str:
    """The alternatives to ``chain`` in a few words ("Conv+BN, then Add+act"), or the chain it replaces."""
    alts = detection.alternatives_of(chain.id)
    if alts:
        return "; ".join(t("fusions.alt.then").join(_label(x.pattern) for x in a.chains) for a in alts)
    replaced = next((a.instead_of for a in detection.alternatives if chain in a.chains), None)
    return t("fusions.alt.instead", chain=chain_name(detection.chain(replaced))) if replaced else ""


def _table(detection, shown, accepted, results, table=None) -> pd.DataFrame:
    """The chain table; its column ids stay English (``_apply_edits`` and the tests read them), the headers
    shown are translated by ``_chains_section``'s column configuration."""
    columns = {
        "accept": pd.Series([c.id in accepted for c in shown], dtype=bool),
        "chain": [chain_name(c) for c in shown],
        "pattern": [_label(c.pattern) for c in shown],
        "kernel": [ui_state.kernel_for(detection, c.id) for c in shown],
        "launches saved": pd.Series([_saved(table, c) for c in shown], dtype="int64"),
        "bytes saved (MiB)": pd.Series([c.bytes_saved / 2**20 for c in shown], dtype="float64"),
        "extra outputs": [", ".join(c.extra_outputs) for c in shown],
    }
    if detection.alternatives:
        columns["also possible"] = [_also(detection, c) for c in shown]
    if results:   # text: the speed-up with its interval, or why there is none (never a bare None)
        columns["speed-up"] = [_speedup_cell(results.get(c.id)) for c in shown]
        columns["verdict"] = [verdict_text(results.get(c.id, (None, ""))[1]) or t("fusions.not_in_report")
                              for c in shown]
    columns["id"] = [c.id for c in shown]
    return pd.DataFrame(columns)


def _speedup_cell(result) -> str:
    """A chain's measured speed-up as the Results page writes it, or why the report has none."""
    if result is None:
        return t("fusions.not_in_report")
    speedup, verdict = result
    if speedup is None:
        return verdict_text(verdict) or t("fusions.not_in_report")
    return f"{speedup:.2f}×"


def _saved(table, chain) -> int:
    """The launches ``chain`` saves on the sidebar's device with its kernel choice (``ui_state.launch_table``)."""
    got = table.of(chain.id) if table is not None else None
    return got.saved if got is not None else chain.launches_saved


def _on_table_edit(detection, shown_ids: list[str], key: str) -> None:
    """Callback of the chains table: every edit so far (``edited_rows``, relative to the table as drawn)
    becomes the accepted set and kernel choices, without resetting the table (no new key, no rerun of its own)."""
    state = st.session_state.get(key) or {}
    rows = (state.get("edited_rows") if hasattr(state, "get") else None) or {}
    accepted = set(ui_state.accepted_ids(detection))
    by_id = detection.known_chains()
    for index, change in rows.items():
        try:
            cid = shown_ids[int(index)]
        except (ValueError, IndexError):
            continue
        if "accept" in change:
            (accepted.add if change["accept"] else accepted.discard)(cid)
        choice = change.get("kernel")
        if choice is not None and cid in by_id and choice in _kernels(by_id[cid].pattern):
            ui_state.set_kernel(detection, cid, choice)   # a choice not the pattern's is refused on the page
    ui_state.set_accepted(detection, accepted, reset_table=False)


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
                refused.append(t("fusions.kernel_refused", chain=chain_name(c), choice=choice,
                                 pattern=_label(c.pattern), choices=", ".join(_kernels(c.pattern))))
    if new != old:
        ui_state.set_accepted(detection, (set(accepted) - {c.id for c in shown}) | new)
    if kernels:
        ui_state.set_kernels(detection, kernels)
    if new != old or kernels:
        st.rerun()
    return refused


@ui_state.needs_model
def page(spec, model, graph, detection) -> None:
    ss = st.session_state
    accepted = ui_state.accepted_ids(detection)
    st.subheader(t("fusions.title", model=ui_files.escape_markdown(model.name)))
    if not detection.chains:
        st.info(t("fusions.none"))
    else:
        _chains_section(detection, accepted)
    _near_misses(detection)
    _plan_section(model, detection)


def _chains_section(detection, accepted) -> None:
    ss = st.session_state
    lang = current_language()
    patterns = [p for p, n in detection.counts.items() if n]
    # --- bulk actions, by pattern
    b = st.columns([2, 1.15, 1.15, 1.6, 1.0, 0.9, 0.9], vertical_alignment="bottom")
    if ss.get("bulk_pattern") not in patterns:
        ss.bulk_pattern = patterns[0]
    b[0].selectbox(t("fusions.bulk.pattern"), patterns, key="bulk_pattern",
                   format_func=lambda p, lang=lang: _label(p, lang))
    pat = ss.bulk_pattern
    b[1].button(t("fusions.bulk.accept_pattern"), key="bulk_accept_pattern", on_click=_bulk,
                args=(detection, pat, True))
    b[2].button(t("fusions.bulk.reject_pattern"), key="bulk_reject_pattern", on_click=_bulk,
                args=(detection, pat, False))
    kernel_options = _kernels(pat)
    if ss.get("bulk_kernel") not in kernel_options:
        ss.bulk_kernel = kernel_options[0]
    b[3].selectbox(t("fusions.bulk.kernel"), kernel_options, key="bulk_kernel",
                   help="\n\n".join(f"**{k}**: {_kernel_choice(k)}" for k in kernel_options))
    b[4].button(t("fusions.bulk.set_kernel"), key="bulk_kernel_set", on_click=_bulk_kernel, args=(detection, pat))
    b[5].button(t("fusions.bulk.accept_all"), key="bulk_accept_all", on_click=_bulk, args=(detection, None, True))
    b[6].button(t("fusions.bulk.reject_all"), key="bulk_reject_all", on_click=_bulk, args=(detection, None, False))

    # --- the table: accept and kernel are editable
    st.multiselect(t("fusions.filter"), patterns, key="fusions_filter",
                   format_func=lambda p, lang=lang: _label(p, lang), placeholder=t("fusions.filter_placeholder"))
    shown = _rows(detection, accepted, ss.fusions_filter)
    report = ss.last_report[1] if ss.get("last_report") else None
    results = measured(report, detection)
    spec = ui_state.current()[0]
    launch_table = ui_state.launch_table(spec, detection)   # the device's, per kernel choice (explorer.launches)
    counted = ui_state.launches(spec, detection)
    table = _table(detection, shown, accepted, results, launch_table)
    all_kernels = list(dict.fromkeys(k for c in detection.chains for k in _kernels(c.pattern)))
    config = {
        "accept": st.column_config.CheckboxColumn(t("fusions.col.accept"), help=t("fusions.col.accept_help"),
                                                  width=70),
        "chain": st.column_config.TextColumn(t("fusions.col.chain"), width=265, help=t("fusions.col.chain_help")),
        "pattern": st.column_config.TextColumn(t("fusions.col.pattern"), width=120),
        "kernel": st.column_config.SelectboxColumn(
            t("fusions.col.kernel"), options=all_kernels, required=True, width=120,
            help=t("fusions.col.kernel_help", choices="; ".join(f"{k}: {_kernel_choice(k)}" for k in all_kernels))),
        "launches saved": st.column_config.NumberColumn(t("fusions.col.launches"), width=80,
                                                        help=t("fusions.col.launches_device_help",
                                                               device=counted.device)),
        "bytes saved (MiB)": st.column_config.NumberColumn(t("fusions.col.mib"), format="%.2f", width=80,
                                                           help=t("fusions.col.mib_help")),
        "extra outputs": st.column_config.TextColumn(t("fusions.col.extra"), width=90,
                                                     help=t("fusions.col.extra_help")),
        "speed-up": st.column_config.TextColumn(t("fusions.col.speedup"), width=80,
                                                help=t("fusions.col.speedup_paired_help")),
        "verdict": st.column_config.TextColumn(t("fusions.col.verdict"), width=70),
        "also possible": st.column_config.TextColumn(t("fusions.col.also"), width=170,
                                                     help=t("fusions.col.also_help")),
        "id": st.column_config.TextColumn(t("fusions.col.id"), width=175, help=t("fusions.col.id_help")),
    }
    editor_key = f"chains_editor_{ss.editor_version}"
    edited = st.data_editor(
        table, key=editor_key, hide_index=True, width="stretch",
        disabled=[c for c in table.columns if c not in ("accept", "kernel")],
        column_config={k: v for k, v in config.items() if k in table.columns},
        height=min(35 * (len(shown) + 1) + 3, 520),
        # each click applied in its callback, before the rerun, keeping the table's key: a click made while
        # the page reruns reaches the same widget and is applied with the next one, never dropped
        on_change=_on_table_edit, args=(detection, [c.id for c in shown], editor_key),
    )
    for line in _apply_edits(detection, shown, accepted, edited):
        st.warning(t("fusions.kernel_not_changed", line=ui_files.escape_markdown(line)))
    acc_chains = detection.accepted_chains(accepted)
    st.caption(t("fusions.summary_device", accepted=len(acc_chains), chains=len(detection.chains),
                 launches=counted.saved, before=counted.before, after=counted.after, device=counted.device,
                 traffic=human_bytes(sum(c.bytes_saved for c in acc_chains)))
               + (t("fusions.summary_measured") if results else t("fusions.summary_run")))

    # --- one chain
    with st.expander(t("fusions.one.title"), expanded=False):
        ids = [c.id for c in _rows(detection, accepted, ())]
        if ss.get("chain_pick") not in ids:
            ss.chain_pick = ids[0]
        cid = st.selectbox(t("fusions.one.chain"), ids, key="chain_pick",
                           format_func=lambda i: f"{chain_name(detection.chain(i))} ({i})")
        chain = detection.chain(cid)
        speedup, verdict = results.get(cid, (None, ""))
        st.markdown(t("fusions.one.details", pattern=_label(chain.pattern),
                      state=t("fusions.one.accepted") if cid in accepted else t("fusions.one.rejected"),
                      id=code(chain.id), ops=code(chain.ops_text), origin=code(", ".join(chain.names)),
                      launches=_saved(launch_table, chain), bytes=human_bytes(chain.bytes_saved))
                    + (t("fusions.one.extra", outputs=plain(", ".join(chain.extra_outputs))) if chain.extra_outputs
                       else "")
                    + (t("fusions.one.measured", speedup=speedup, verdict=plain(verdict_text(verdict)))
                       if speedup is not None else ""))
        caveats = pattern_text(BY_NAME[chain.pattern], "caveats") if chain.pattern in BY_NAME else ()
        if caveats:  # the seed's warnings (numerics, inference only, not every fusion pays) where the choice is made
            st.markdown(t("fusions.one.caveats") + "\n" + "\n".join(f"- {c}" for c in caveats))
        c = st.columns(2)
        c[0].button(t("fusions.one.accept"), key="chain_accept", on_click=_one, args=(detection, cid, True))
        c[1].button(t("fusions.one.reject"), key="chain_reject", on_click=_one, args=(detection, cid, False))
        choices = _kernels(chain.pattern)
        key = f"kernel@{cid}"
        current = ui_state.kernel_for(detection, cid)
        if ss.get(key) != current:  # follow the plan (e.g. one just uploaded, or the table)
            ss[key] = current if current in choices else "auto"
        st.selectbox(t("fusions.one.kernel"), choices, key=key,
                     format_func=lambda k, lang=lang: f"{k}: {_kernel_choice(k, lang)}",
                     on_change=lambda: ui_state.set_kernels(detection, {cid: st.session_state[key]}))
        _alternatives_panel(detection, chain, accepted)


def _alternatives_panel(detection, chain, accepted) -> None:
    """The other ways to fuse this chain's nodes (competing patterns), each with a button to use it instead."""
    alts = detection.alternatives_of(chain.id)
    if not alts:
        return
    st.markdown(t("fusions.alt.title"))
    for i, alt in enumerate(alts):
        cols = st.columns([4, 1], vertical_alignment="center")
        words = t("fusions.alt.then").join(f"{_label(x.pattern)} ({plain(chain_name(x))})" for x in alt.chains)
        in_use = all(x.id in accepted for x in alt.chains)
        cols[0].markdown(f"- {words}" + (t("fusions.alt.in_use") if in_use else ""))
        cols[1].button(t("fusions.alt.use"), key=f"alt_use@{chain.id}#{i}", disabled=in_use,
                       on_click=ui_state.use_alternative, args=(detection, alt.id))
    st.caption(t("fusions.alt.note"))


def _near_misses(detection) -> None:
    st.subheader(t("fusions.near.title"))
    if detection.near_misses:
        st.dataframe(pd.DataFrame({
            t("fusions.near.pattern"): [_label(m.pattern) for m in detection.near_misses],
            t("fusions.near.nodes"): [", ".join(m.nodes) for m in detection.near_misses],
            t("fusions.near.reason"): [message(m.reason) for m in detection.near_misses],
        }), hide_index=True, width="stretch")
    else:
        st.caption(t("fusions.near.none"))


def _plan_section(model, detection) -> None:
    ss = st.session_state
    st.subheader(t("fusions.plan.title"))
    plan = ui_state.current_plan(detection)
    c = st.columns([1, 2])
    c[0].download_button(t("fusions.plan.download"), plan.to_json(), file_name=f"{model.name}.plan.json",
                         mime="application/json", key="plan_download")
    c[1].file_uploader(t("fusions.plan.upload"), key="plan_file",
                       on_change=ui_state.on_plan_upload)
    if ss.plan_error:  # text from a file (the plan's, its name): translated, then shown as written
        st.error(t("fusions.plan.error", error=plain(message(str(ss.plan_error)))))
    elif ss.plan_notice:  # our sentence; the uploaded file's name in it is escaped (ui_state.on_plan_upload)
        st.success(message(ss.plan_notice))


ui_state.guarded(page)
