"""Benchmark: where a graph's host (CPU) time goes, node by node, unfused against fused.

Without CUDA graphs a whole-model forward on the H200 machines we are lent is
host-bound: the GPU waits for Python to issue the next call. This script runs a
model's unfused and fused ``GraphModule`` with a host clock read around every
call node *without synchronising*, so each number is the time Python and the
dispatcher spend issuing that call (the device work runs behind). Each call
goes through a thin timing closure; everything else in the generated code
(attribute reads, tuple indexing) is the model's own. Calls are grouped by
what they call; the table shows which cost the host most, how many there are,
and the plain forward's host and wall time for comparison.

    python3 benchmarks/bench_graph_host.py --models bert_base_fp16,resnet50_fp16_cl --out $OUT/graph_host.json
    python3 benchmarks/bench_graph_host.py --device cpu --models transformer_block_fp32   # proves it runs

Writes JSON with the command, date, device and library versions.
"""

from __future__ import annotations

import argparse
import collections
import datetime
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

#: key -> (zoo model, batch, seq_len, dtype, channels_last)
CASES = {
    "bert_base_fp16": ("bert_base", 32, 128, "fp16", False),
    "resnet50_fp16_cl": ("resnet50", 32, None, "fp16", True),
    "resnet50_fp32_cl": ("resnet50", 32, None, "fp32", True),
    "transformer_block_fp32": ("transformer_block", 2, 32, "fp32", False),
    "residual_block_fp32": ("residual_block", 2, None, "fp32", False),
}


def node_label(node) -> str:
    """What a node calls, short: ``aten.view``, ``fused_add_layer_norm``, ``getitem``."""
    import torch

    if node.op == "call_function":
        t = node.target
        if isinstance(t, torch._ops.OpOverload):
            return f"aten.{t._schema.name.split('::')[-1]}"
        return getattr(t, "__name__", str(t))
    if node.op == "call_module":
        return f"module:{type(node.graph.owning_module.get_submodule(node.target)).__name__}"
    return node.op


def _timed_copy(gm, acc: dict[str, float]):
    """A copy of ``gm`` whose every call_function target adds its host time to ``acc[label]``.

    The generated code stays what it was (attribute reads, one call per node); each call
    only goes through a thin closure reading ``perf_counter`` twice (well under 1 µs).
    """
    import copy

    gm = copy.deepcopy(gm)
    for node in gm.graph.nodes:
        if node.op != "call_function":
            continue
        label, target = node_label(node), node.target

        def timed(*args, _label=label, _target=target, **kwargs):
            t0 = time.perf_counter()
            out = _target(*args, **kwargs)
            acc[_label] += time.perf_counter() - t0
            return out

        timed.__name__ = f"timed_{getattr(target, '__name__', 'op')}".replace(".", "_")
        node.target = timed
    gm.recompile()
    return gm


def host_profile(graphs: dict[str, Any], inputs: tuple, device: str, rounds: int) -> dict[str, dict[str, Any]]:
    """Per-label host µs per forward (median over ``rounds``), and each plain forward's host/wall µs.

    The host's speed drifts on a shared machine (twofold within a minute, seen on the lent
    H200 machines), so the graphs alternate round by round, in ABBA order, like the runner.
    """
    import torch

    from explorer.runtime import measure as m

    med = lambda xs: sorted(xs)[len(xs) // 2]  # noqa: E731
    state = {}
    for name, gm in graphs.items():
        acc: dict[str, float] = collections.defaultdict(float)
        state[name] = dict(gm=gm, acc=acc, timed=_timed_copy(gm, acc), rounds=[], timed_total=[],
                           host=[], wall=[],
                           labels={n: node_label(n) for n in gm.graph.nodes if n.op == "call_function"})
    names = list(graphs)
    with torch.inference_mode():
        for st in state.values():
            for _ in range(3):
                st["gm"](*inputs)
                st["timed"](*inputs)
        m.synchronize(device)
        for r in range(rounds):
            for name in (names if r % 2 == 0 else names[::-1]):
                st = state[name]
                st["acc"].clear()
                t0 = time.perf_counter()
                st["timed"](*inputs)
                st["timed_total"].append(time.perf_counter() - t0)
                m.synchronize(device)
                st["rounds"].append(dict(st["acc"]))
                t0 = time.perf_counter()
                st["gm"](*inputs)
                t1 = time.perf_counter()
                m.synchronize(device)
                st["host"].append(t1 - t0)
                st["wall"].append(time.perf_counter() - t0)
    out = {}
    for name, st in state.items():
        counts = collections.Counter(st["labels"].values())
        by_label = {k: {"count": counts[k], "host_us": round(med([r.get(k, 0.0) for r in st["rounds"]]) * 1e6, 1)}
                    for k in counts}
        for d in by_label.values():
            d["us_per_call"] = round(d["host_us"] / d["count"], 2)
        gm = st["gm"]
        out[name] = {
            "nodes": sum(1 for n in gm.graph.nodes if n.op not in ("placeholder", "output")),
            "call_nodes": len(st["labels"]),
            "plain_forward_host_us": round(med(st["host"]) * 1e6, 1),
            "plain_forward_wall_us": round(med(st["wall"]) * 1e6, 1),
            "timed_forward_host_us": round(med(st["timed_total"]) * 1e6, 1),
            "calls_host_us": round(sum(d["host_us"] for d in by_label.values()), 1),
            "by_label": dict(sorted(by_label.items(), key=lambda kv: -kv[1]["host_us"])),
        }
    return out


def run_case(key: str, device: str, rounds: int, log) -> dict[str, Any]:
    from explorer.fusion_engine import analyze, fuse
    from explorer.runtime import measure as m

    name, batch, seq, dtype_name, cl = CASES[key]
    dtype = m.torch_dtype(dtype_name)
    analysis = analyze(name, batch=batch, seq_len=seq)
    model, _, det = analysis
    fused = fuse(analysis, None, device)
    x = m.prepare_inputs(model.example_inputs, device, dtype, cl)
    out: dict[str, Any] = {"case": key, "model": name, "batch": batch, "seq_len": seq, "dtype": dtype_name,
                           "channels_last": cl}
    log(f"[{key}] unfused and fused, alternated")
    out.update(host_profile({"unfused": m.prepare_graph(model.gm, device, dtype, cl),
                             "fused": m.prepare_graph(fused.gm, device, dtype, cl)}, x, device, rounds))
    return out


def table(results: list[dict], top: int) -> str:
    lines = []
    for r in results:
        for variant in ("unfused", "fused"):
            p = r[variant]
            lines.append(f"== {r['case']} {variant}: {p['nodes']} nodes, {p['call_nodes']} calls; plain forward host "
                         f"{p['plain_forward_host_us'] / 1e3:.2f} ms, wall {p['plain_forward_wall_us'] / 1e3:.2f} ms;"
                         f" instrumented {p['timed_forward_host_us'] / 1e3:.2f} ms of which calls "
                         f"{p['calls_host_us'] / 1e3:.2f} ms")
            for label, d in list(p["by_label"].items())[:top]:
                lines.append(f"   {label:<34}{d['count']:>5} x {d['us_per_call']:>7.1f} us = {d['host_us'] / 1e3:6.2f} ms")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="bert_base_fp16,resnet50_fp16_cl",
                        help="comma-separated: " + ", ".join(CASES))
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--top", type=int, default=14)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)

    import torch

    from explorer.runtime import measure as m

    device = m.resolve_device(args.device)
    keys = [k.strip() for k in args.models.split(",") if k.strip()]
    unknown = [k for k in keys if k not in CASES]
    if unknown:
        parser.error(f"unknown case(s) {', '.join(unknown)}")
    started = time.perf_counter()

    def log(msg: str) -> None:
        print(f"[{time.perf_counter() - started:6.1f}s] {msg}", file=sys.stderr, flush=True)

    env = m.environment(device)
    doc = {"benchmark": "bench_graph_host", "command": " ".join([os.path.basename(sys.executable), *sys.argv]),
           "date_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "label": "CPU run: numbers are CPU numbers, not GPU numbers" if env["is_cpu"] else "GPU run",
           "environment": env, "rounds": args.rounds, "cases": []}
    for key in keys:
        doc["cases"].append(run_case(key, device, args.rounds, log))
        if device.startswith("cuda"):
            torch.cuda.empty_cache()
    text = table(doc["cases"], args.top)
    print(f"{doc['label']}: {env.get('device_name')} torch {env['torch']} ({doc['date_utc']})")
    print(text)
    out = Path(args.out) if args.out else (Path(os.environ["OUT"]) / "graph_host.json" if os.environ.get("OUT")
                                           else ROOT / "benchmarks" / "results" / "graph_host.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1, default=str))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
