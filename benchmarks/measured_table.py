"""The README's Measured table, generated from ``bench_measured.py``'s JSON: one command after a GPU run.

    python3 benchmarks/measured_table.py benchmarks/results/bench_measured_call1_h200.json \\
        benchmarks/results/bench_measured_call2_h200.json --readme README.md

Reads one or more JSONs (the two device calls of a run): a model measured in several is taken from the last file
that measured it without an error. Prints the markdown table (every model: unfused, fused, compile default,
max-autotune-no-cudagraphs, the plain-call verdict, fused + CUDA graphs, reduce-overhead, the graph verdict,
GPU busy fused / inductor, host µs per launch unfused / fused / inductor with its verdict) and the list of the
targets missed, with their numbers. ``--readme`` replaces the README's block between
``<!-- measured-table:start -->`` and ``<!-- measured-table:end -->`` with them, and leaves the rest as it is.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

START, END = "<!-- measured-table:start -->", "<!-- measured-table:end -->"
ORDER = ("llama_decoder_8b_layers", "gpt2_medium_layers", "convnext_tiny", "llama_decoder", "llama_decode_step",
         "resnet50", "mobilenet_v2", "efficientnet_b0", "bert_base")
#: Titles of models a run did not reach (a measured record carries its own).
TITLES = {"llama_decoder_8b_layers": "8B-layer decoder prefill 4 × 1024",
          "gpt2_medium_layers": "GPT-2-medium layers (HF folder) 4 × 1024", "convnext_tiny": "ConvNeXt-Tiny",
          "llama_decoder": "zoo decoder prefill 16 × 1024", "llama_decode_step": "zoo decode step, cache 1024",
          "resnet50": "ResNet-50", "mobilenet_v2": "MobileNetV2", "efficientnet_b0": "EfficientNet-B0",
          "bert_base": "BERT-base s128"}
#: Issue 22: the 8B-layer prefill's fused GPU busy at least 5% below inductor's.
BUSY_MARGIN = {"llama_decoder_8b_layers": 0.95}
DEFAULT, MANT, RO = "compile_default", "compile_max_autotune_no_cudagraphs", "compile_reduce_overhead"


def merge(docs: list[tuple[str, dict]]) -> dict[str, tuple[str, dict, dict]]:
    """``{model key: (file name, its run's doc, its record)}``: the last file's record, unless it failed and an
    earlier one did not."""
    out: dict[str, tuple[str, dict, dict]] = {}
    for name, doc in docs:
        for key, rec in (doc.get("models") or {}).items():
            usable = bool(rec.get("sessions"))
            if key not in out or usable or not out[key][2].get("sessions"):
                out[key] = (name, doc, rec)
    return out


def _final(rec: dict) -> dict:
    sessions = rec.get("sessions") or []
    return sessions[-1] if sessions else {}


def _ms(rec: dict, v: str) -> float | None:
    row = (_final(rec).get("variants") or {}).get(v)
    return row["latency_ms"]["median"] if row else None


def _fmt(x: float | None, d: int = 2) -> str:
    return "—" if x is None else f"{x:.{d}f}"


def _verdict(rec: dict, target_start: str) -> dict | None:
    for v in rec.get("verdicts") or []:
        if v["target"].startswith(target_start):
            return v
    return None


def _verdict_cell(v: dict | None) -> str:
    if not v:
        return "—"
    words = {"faster": "faster", "slower": "**slower**"}.get(v["verdict"], "level")
    ci = f" [{v['ci_low']:.2f}, {v['ci_high']:.2f}]" if v.get("ci_low") is not None else ""
    return f"{words} {v['ratio']:.2f}×{ci}" if v.get("ratio") else words


def _bold_pair(a: float | None, b: float | None, v: dict | None) -> tuple[str, str]:
    """Two medians (fused, its baseline), the faster in bold where the paired verdict ``v`` says one is."""
    sa, sb = _fmt(a), _fmt(b)
    label = (v or {}).get("verdict")
    if label == "faster":
        sa = f"**{sa}**"
    elif label == "slower":
        sb = f"**{sb}**"
    return sa, sb


def earlier_autotune(docs: list[tuple[str, dict]], key: str, chosen: dict) -> tuple[str, dict] | None:
    """Where the chosen record of ``key`` has no max-autotune-no-cudagraphs, another file's record that has it
    (the last such): ``(file name, record)``, or None."""
    found = None
    for name, doc in docs:
        rec = (doc.get("models") or {}).get(key)
        if rec is not None and rec is not chosen and _ms(rec, MANT) is not None:
            found = (name, rec)
    return found


def _cited_autotune(cited: tuple[str, dict]) -> str:
    """The max-autotune cell taken from another run: its median, and that run's own paired verdict."""
    name, rec = cited
    v = _verdict(rec, "fused <= faster")
    there = (f"; there fused {v['candidate_ms']:.2f} vs {v['baseline'].replace('compile_', '')} "
             f"{v['baseline_ms']:.2f}: {_verdict_cell(v)}") if v else ""
    return f"{_ms(rec, MANT):.2f} (`{name}`{there})"


def row(key: str, rec: dict, title: str, cited: tuple[str, dict] | None = None) -> str:
    """One model's row of the table (``cited``: where its max-autotune figure comes from another run)."""
    if not rec.get("sessions"):
        why = rec.get("error", "not measured")
        return f"| {title} | " + " | ".join(["—"] * 10) + f" | not measured: {why[:80]} |"
    plain = _verdict(rec, "fused <= faster")
    graphs = _verdict(rec, "fused + CUDA graphs")
    base = plain["baseline"] if plain else None
    fused, best = _bold_pair(_ms(rec, "fused"), _ms(rec, base) if base else None, plain)
    cells = {DEFAULT: _fmt(_ms(rec, DEFAULT)), MANT: _fmt(_ms(rec, MANT))}
    if base:
        cells[base] = best
    if _ms(rec, MANT) is None:
        cells[MANT] = _cited_autotune(cited) if cited else "not measured"
    fg, ro = _bold_pair(_ms(rec, "fused_graph"), _ms(rec, RO), graphs)
    if _ms(rec, RO) is not None and any("skip" in k for k in (rec.get("compile_notes") or {}).get(RO, {})):
        ro += " (its capture skipped)"      # inductor's cudagraph_skips counters, not its other cudagraph counters
    busy = rec.get("gpu_busy") or {}
    ind = (busy.get("inductor_ms") or {}).get(busy.get("inductor_best")) if busy.get("inductor_best") else None
    busy_cell = f"{_fmt(busy.get('fused_ms'), 3)} / {_fmt(ind, 3)}"
    if busy.get("ratio") is not None:
        busy_cell += f" ({busy['ratio']:.2f}×)"
    host = (rec.get("host") or {}).get("variants") or {}

    def per_launch(v):
        h = (host.get(v) or {}).get("host_us_per_launch")
        return _fmt(h["median"], 1) if h else "—"

    hv = (rec.get("host") or {}).get("verdict_per_launch")
    host_cell = f"{per_launch('unfused')} / {per_launch('fused')} / {per_launch(DEFAULT)}"
    if hv:
        host_cell += f" ({_verdict_cell(dict(hv, verdict=hv['label']))})"
    return (f"| {title} | {_fmt(_ms(rec, 'unfused'))} | {fused} | {cells[DEFAULT]} | {cells[MANT]} | "
            f"{_verdict_cell(plain)} | {fg} | {ro} | {_verdict_cell(graphs)} | {busy_cell} | {host_cell} | "
            f"{_launches(rec)} |")


def _launches(rec: dict) -> str:
    host = (rec.get("host") or {}).get("variants") or {}
    n = [host.get(v, {}).get("launches") for v in ("unfused", "fused", DEFAULT)]
    return " / ".join("—" if x is None else f"{x:g}" for x in n)


HEADER = ("| model | unfused | fused | compile default | max-autotune-no-cudagraphs | fused vs the faster compile "
          "| fused + CUDA graphs | reduce-overhead | graphs: fused vs reduce-overhead | GPU busy ms: fused / inductor "
          "| host µs per launch: unfused / fused / inductor (fused vs inductor) | launches: unfused / fused / inductor |\n"
          "|---|---|---|---|---|---|---|---|---|---|---|---|")


def missed(merged: dict, docs: list[tuple[str, dict]] = ()) -> list[str]:
    """Every target missed, with its numbers (``docs``: every run, for max-autotune figures cited from another)."""
    lines = []
    for key in [k for k in ORDER if k in merged] + [k for k in merged if k not in ORDER]:
        _name, _doc, rec = merged[key]
        title = (rec.get("case") or {}).get("title", TITLES.get(key, key))
        if not rec.get("sessions"):
            lines.append(f"- {title}: not measured ({rec.get('error', 'no session')[:120]}).")
            continue
        for v in rec.get("verdicts") or []:
            if v["target"] == "fused vs unfused" or v["met"]:
                continue
            lines.append(f"- {title}: {v['target']}: **missed**, {v['candidate_ms']:.3f} against {v['baseline']} "
                         f"{v['baseline_ms']:.3f} ms ({_verdict_cell(v)}, p = {v['p_value']:.2g}, {v['n']} rounds).")
        busy = rec.get("gpu_busy") or {}
        if busy.get("met") is False:
            ind = busy["inductor_ms"][busy["inductor_best"]]
            lines.append(f"- {title}: GPU busy ≤ inductor's: **missed**, {busy['fused_ms']:.3f} against "
                         f"{busy['inductor_best']} {ind:.3f} ms per forward ({busy['ratio']:.2f}×). "
                         f"Top kernels per forward: fused {_top(rec, 'fused')}; inductor {_top(rec, busy['inductor_best'])}.")
        if key in BUSY_MARGIN and busy.get("ratio") is not None and busy["ratio"] > BUSY_MARGIN[key]:
            lines.append(f"- {title}: GPU busy at least {1 - BUSY_MARGIN[key]:.0%} below inductor's: **missed**, "
                         f"{busy['fused_ms']:.3f} against {busy['inductor_ms'][busy['inductor_best']]:.3f} ms "
                         f"(fused / inductor {busy['ratio']:.3f}). Top kernels per forward: fused {_top(rec, 'fused')}; "
                         f"inductor {_top(rec, busy['inductor_best'])}.")
        hv = (rec.get("host") or {}).get("verdict_per_launch")
        if hv and hv.get("label") == "slower":
            h = rec["host"]["variants"]
            lines.append(f"- {title}: host µs per launch ≤ inductor's: **missed**, "
                         f"{h['fused']['host_us_per_launch']['median']:.1f} against "
                         f"{h[DEFAULT]['host_us_per_launch']['median']:.1f} µs ({hv['ratio']:.2f}× "
                         f"[{hv['ci_low']:.2f}, {hv['ci_high']:.2f}]).")
        if _ms(rec, DEFAULT) is None:
            why = "; ".join(n for n in rec.get("notes", []) if n.startswith("compile_"))[:200] or "not requested"
            lines.append(f"- {title}: no torch.compile baseline in this run: {why}.")
        elif _ms(rec, MANT) is None and earlier_autotune(list(docs), key, rec) is None:
            why = "; ".join(n for n in rec.get("notes", []) if "max_autotune" in n)[:200] or "not requested"
            lines.append(f"- {title}: max-autotune-no-cudagraphs not measured: {why}.")
    return lines


def _top(rec: dict, variant: str, n: int = 3) -> str:
    """The ``n`` kernels taking most of a variant's profiled time per forward: ``name (calls) µs``."""
    rows = ((_final(rec).get("variants") or {}).get(variant) or {}).get("top_kernels") or []
    return ", ".join(f"`{k['name'][:48]}` ×{k['calls']:g} {k['total_us']:.0f} µs" for k in rows[:n]) or "not profiled"


#: What ``explorer.stats.compare`` was before the Hodges-Lehmann statistic: runs of then stored no ``method``.
OLD_METHOD = ("the median of the paired ratios with a 95% bootstrap interval and a Wilcoxon signed-rank p, "
              "explorer.stats before its Hodges-Lehmann statistic")


def verdict_method(merged: dict[str, tuple[str, dict, dict]]) -> str:
    """Which statistic produced the stored verdicts the table shows (this table reads them, it does not recompute
    them): the ``method`` they record, or ``OLD_METHOD`` for runs that recorded none."""
    methods = {v.get("method") or OLD_METHOD for _n, _d, rec in merged.values() for v in rec.get("verdicts") or []}
    return "; ".join(sorted(methods)) or OLD_METHOD


def markdown(docs: list[tuple[str, dict]]) -> str:
    """The table, its sources and the targets missed."""
    merged = merge(docs)
    keys = [k for k in ORDER if k in merged] + [k for k in merged if k not in ORDER]
    lines = [HEADER]
    for key in keys:
        _name, _doc, rec = merged[key]
        lines.append(row(key, rec, (rec.get("case") or {}).get("title", TITLES.get(key, key)),
                         earlier_autotune(docs, key, rec)))
    envs = {json.dumps({k: d.get("environment", {}).get(k) for k in ("device_name", "torch", "triton", "driver")})
            for _n, d, _r in merged.values()}
    lines.append("")
    lines.append("Median ms of the paired rounds; a verdict is the one the run stored, `explorer.stats.compare` over "
                 f"them (statistic: {verdict_method(merged)}), as ratio fused / other with its 95% interval; level: "
                 "no significant difference beyond 3%; bold marks the side a verdict calls faster. "
                 "Sources: " + "; ".join(f"{k}: `{merged[k][0]}`" for k in keys) + ". "
                 + " ".join(f"{e['device_name']}, torch {e['torch']}, Triton {e['triton']}, driver {e['driver']}."
                            for e in map(json.loads, sorted(envs))))
    miss = missed(merged, docs)
    if miss:
        lines += ["", "Targets missed in this run:", *miss]
    return "\n".join(lines)


def text_summary(doc: dict) -> str:
    """The short table ``bench_measured.py`` prints last (plain text, one line per variant of a model)."""
    lines = [f"{doc.get('label')}: {doc.get('environment', {}).get('device_name')} torch "
             f"{doc.get('environment', {}).get('torch')} ({doc.get('date_utc')})"]
    for key, rec in (doc.get("models") or {}).items():
        if not rec.get("sessions"):
            lines.append(f"{key}: NOT MEASURED: {rec.get('error', '?')}")
            continue
        s = _final(rec)
        lines.append(f"{key}: session {len(rec['sessions'])}, {s['rounds']} rounds, compile s "
                     + ", ".join(f"{k.replace('compile_', '')} {v}" for k, v in (rec.get("compile_s") or {}).items()))
        for v, r in s["variants"].items():
            lat = r["latency_ms"]
            lines.append(f"  {v:<36} {lat['median']:>8.3f} ms [{lat['p20']:.3f}-{lat['p80']:.3f}] busy "
                         f"{_fmt(r.get('gpu_busy_ms'), 3):>7} launches {r.get('kernel_launches', r.get('kernels'))} "
                         f"rel_l2 {r['precision']['rel_l2']:.1e}")
        for v in rec.get("verdicts") or []:
            lines.append(f"  {v['target']}: {v['candidate_ms']:.3f} vs {v['baseline']} {v['baseline_ms']:.3f}: "
                         f"{_verdict_cell(v)} {'MET' if v['met'] else 'MISSED'}")
        host = (rec.get("host") or {}).get("variants") or {}
        lines.append("  host us/launch: " + ", ".join(
            f"{v} {_fmt((h.get('host_us_per_launch') or {}).get('median'), 1)}" for v, h in host.items()))
        if rec.get("error"):
            lines.append(f"  (cut short: {rec['error']})")
    pre = doc.get("precompile")
    if pre:
        lines.append(f"precompile: {pre['workers']} workers, {pre['wall_s']} s; {pre.get('summary')}")
    return "\n".join(lines)


def replace_block(text: str, block: str) -> str:
    """``text`` with the part between the markers replaced by ``block`` (the markers kept)."""
    if START not in text or END not in text:
        raise SystemExit(f"measured_table: the README has no {START} ... {END} block")
    head, rest = text.split(START, 1)
    _old, tail = rest.split(END, 1)
    return f"{head}{START}\n{block}\n{END}{tail}"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("files", nargs="+", help="bench_measured JSONs, earlier calls first")
    p.add_argument("--readme", default=None, help="rewrite this README's measured-table block")
    args = p.parse_args(argv)
    docs = [(Path(f).name, json.loads(Path(f).read_text())) for f in args.files]
    block = markdown(docs)
    if args.readme:
        path = Path(args.readme)
        path.write_text(replace_block(path.read_text(), block))
        print(f"rewrote the measured table in {path}")
    else:
        print(block)
    return 0


if __name__ == "__main__":
    sys.exit(main())
