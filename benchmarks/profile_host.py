"""Where a plain call's host time goes: per graph node and per Python function, for the fused and unfused graphs.

Issue 22's table says the fused decoders spend about twice inductor's host time per launch (zoo prefill: 34 against
17 µs) although they launch fewer kernels. This script says where that time is, on the GPU machine, for the graphs
exactly as ``bench_measured.py`` prepares them (``bench_measured.prepared``: the runner's casts, lean passes, fused
calls specialised):

- **per node**: the graph is run node by node by a small interpreter that times each call on the host
  (``time.perf_counter_ns`` around the call, the GPU idle and its queue far from full: one forward is synchronised
  before the next), summed per node target over ``--calls`` forwards; the interpreter's own cost is measured apart
  (a forward of the same nodes with no-op calls) and reported, not hidden;
- **per function**: ``cProfile`` over ``--calls`` plain forwards of the generated ``forward`` (no interpreter),
  the top functions by own time;
- **whole call**: host ms to issue one forward (synchronised before each) for the fused and unfused graphs;
- **syncs**: the calls of one forward that make the host wait for the GPU (``torch.cuda.set_sync_debug_mode``
  "warn": a device-to-host copy, ``.item()``, ``nonzero``...), each with the line of the graph's code that made it.
  A forward that syncs cannot queue ahead of the GPU: its plain call costs host time plus GPU time, not the larger
  of the two (the question Swin-S's plain calls raise: 27.6 ms for 7.6 ms of GPU work, all its fused calls bound).

A model is a ``bench_measured`` case (``llama_decoder``...) or a corpus entry (``tv/swin_s``: built, captured,
fused and prepared as ``bench_corpus.py`` does, ``bench_corpus.model_on_device``).

The per-node figures come from a different calling path than a real forward (the interpreter's frames), so they
show where the time is spent, not what a forward costs; the whole-call figure is the real one.

Usage (GPU machine)::

    python3 benchmarks/profile_host.py --models llama_decoder,gpt2_medium_layers --calls 50
    python3 benchmarks/profile_host.py --models tv/swin_s,tv/vit_b_32 --calls 20

Writes ``$OUT/profile_host.json`` (else ``benchmarks/results/profile_host.json``); prints the top rows.
"""

from __future__ import annotations

import argparse
import collections
import cProfile
import pstats
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks import _common as common  # noqa: E402
from benchmarks import bench_measured as bm  # noqa: E402


def _label(node) -> str:
    target = node.target
    if node.op == "call_function":
        name = getattr(target, "__name__", None) or str(target)
        module = getattr(target, "__module__", "") or ""
        return f"{module}.{name}" if module and not str(name).startswith("aten") else str(target)
    if node.op == "call_method":
        return f"Tensor.{target}"
    return node.op


def node_host_ns(gm, inputs: tuple, calls: int, device: str) -> tuple[dict[str, list[int]], int]:
    """Host ns per node label summed over ``calls`` forwards (each forward synchronised before it starts), and
    the interpreter's own ns per forward (the same walk with the calls replaced by returning the cached output)."""
    from explorer.runtime import measure as m

    import torch

    nodes = list(gm.graph.nodes)
    per: dict[str, list[int]] = collections.defaultdict(lambda: [0, 0])

    def walk(timed: bool, cached: dict | None) -> dict:
        env: dict = {}
        it = iter(inputs)
        for node in nodes:
            if node.op == "placeholder":
                env[node] = next(it)
                continue
            if node.op == "output":
                return env
            args = _resolve(node.args, env)
            kwargs = _resolve(node.kwargs, env)
            t0 = time.perf_counter_ns()
            if cached is not None:
                value = cached[node]
            elif node.op == "call_function":
                value = node.target(*args, **kwargs)
            elif node.op == "call_method":
                value = getattr(args[0], node.target)(*args[1:], **kwargs)
            elif node.op == "get_attr":
                value = _attr(gm, node.target)
            elif node.op == "call_module":
                value = gm.get_submodule(node.target)(*args, **kwargs)
            else:
                raise RuntimeError(f"node op {node.op}")
            dt = time.perf_counter_ns() - t0
            if timed:
                row = per[_label(node)]
                row[0] += dt
                row[1] += 1
            env[node] = value
        return env

    with torch.inference_mode():
        env = walk(False, None)
        m.synchronize(device)
        for _ in range(calls):
            m.synchronize(device)
            walk(True, None)
        m.synchronize(device)
        t0 = time.perf_counter_ns()
        for _ in range(calls):
            walk(False, env)
        idle = (time.perf_counter_ns() - t0) // max(calls, 1)
    return dict(per), idle


def _attr(gm, target: str):
    obj: Any = gm
    for part in target.split("."):
        obj = getattr(obj, part)
    return obj


def _resolve(value, env):
    import torch.fx
    if isinstance(value, torch.fx.Node):
        return env[value]
    if isinstance(value, (list, tuple)):
        return type(value)(_resolve(v, env) for v in value)
    if isinstance(value, dict):
        return {k: _resolve(v, env) for k, v in value.items()}
    return value


def cprofile_top(fn, calls: int, device: str, top: int) -> list[dict]:
    """cProfile over ``calls`` forwards: the ``top`` functions by own time, µs per forward."""
    from explorer.runtime import measure as m

    prof = cProfile.Profile()
    for _ in range(calls):
        m.synchronize(device)
        prof.enable()
        fn()
        prof.disable()
    m.synchronize(device)
    stats = pstats.Stats(prof)
    rows = []
    for (path, line, name), (cc, nc, tt, ct, _callers) in stats.stats.items():
        rows.append(dict(function=f"{Path(path).name}:{line}:{name}", calls_per_forward=nc / calls,
                         own_us=tt * 1e6 / calls, cumulative_us=ct * 1e6 / calls))
    rows.sort(key=lambda r: -r["own_us"])
    return rows[:top]


def syncs(fn, device: str, top: int = 10) -> dict:
    """The synchronising calls of one ``fn()`` (``torch.cuda.set_sync_debug_mode("warn")``): how many, and the
    first ``top`` with the graph code's line that made each (the innermost frame of a generated ``forward``)."""
    import traceback
    import warnings

    import torch

    if device != "cuda":
        return dict(count=None, note="cpu: no device to wait for")
    seen: list[str] = []

    def record(message, category, filename, lineno, file=None, line=None):
        where = [f for f in traceback.extract_stack() if f.name == "forward" and "<eval_with_key>" in f.filename]
        seen.append(f"{str(message)[:160]} @ {where[-1].line if where else filename + ':' + str(lineno)}")

    old = torch.cuda.get_sync_debug_mode()
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = record
        try:
            torch.cuda.set_sync_debug_mode("warn")
            fn()
        finally:
            torch.cuda.set_sync_debug_mode(old)
    torch.cuda.synchronize()
    return dict(count=len(seen), first=seen[:top])


def _graphs(key: str, device: str) -> tuple[dict, dict]:
    """(the row's header, {"unfused_gm", "fused_gm", "inputs"}) of a bench_measured case or a corpus entry."""
    if "/" in key:
        from benchmarks import bench_corpus as bc

        model = bc.model_on_device(key, smoke=device != "cuda")
        return (dict(model=key, title=model.out.get("description", key), casts=model.record is not None),
                dict(unfused_gm=model.prepare(model.gm), fused_gm=model.prepare(model.fused.gm), inputs=model.x))
    case = bm.CASES.get(key) or bm.SMOKE_CASES[key]
    with tempfile.TemporaryDirectory() as tmp:
        p = bm.prepared(case, device, Path(tmp))
    return dict(model=key, title=case.title, casts=p["casts"]), p


def profile_case(key: str, calls: int, top: int, device: str = "cuda") -> dict:
    import torch

    from explorer.runtime import measure as m

    head, p = _graphs(key, device)
    out: dict[str, Any] = dict(head)
    for name in ("unfused_gm", "fused_gm"):
        gm = p[name]
        inputs = p["inputs"]

        def call(gm=gm):
            return gm(*inputs)

        with torch.inference_mode():
            for _ in range(5):
                call()
            m.synchronize(device)
            issue = bm.host_issue_ms(call, device, calls)
            top_fns = cprofile_top(call, calls, device, top)
            synced = syncs(call, device)
        per, idle = node_host_ns(gm, inputs, calls, device)
        rows = sorted(({"node": k, "count_per_forward": v[1] / calls, "host_us_per_forward": v[0] / 1e3 / calls}
                       for k, v in per.items()), key=lambda r: -r["host_us_per_forward"])
        ops = collections.Counter(n.op for n in gm.graph.nodes)
        out[name] = dict(issue_ms_median=sorted(issue)[len(issue) // 2], issue_ms=issue,
                         nodes=dict(ops), interpreter_us_per_forward=idle / 1e3,
                         per_node=rows[:top], node_sum_us=sum(r["host_us_per_forward"] for r in rows),
                         cprofile=top_fns, syncs=synced)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=None, help="bench_measured cases or corpus entries (default: "
                    "llama_decoder,gpt2_medium_layers; with --smoke, bench_measured's smoke cases)")
    ap.add_argument("--calls", type=int, default=50)
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--out", default=None)
    ap.add_argument("--smoke", action="store_true", help="CPU, bench_measured's smoke cases (not GPU numbers)")
    args = ap.parse_args(argv)
    path = common.results_path(args.out, "profile_host.json")
    doc: dict[str, Any] = dict(schema="profile_host/1", **common.run_stamp(), models={})
    import torch
    device = "cpu" if args.smoke else "cuda"
    if args.models is None:
        args.models = ",".join(bm.SMOKE_CASES) if args.smoke else "llama_decoder,gpt2_medium_layers"
    if not args.smoke and not torch.cuda.is_available():
        return common.write_skipped(doc, path, "profile_host.py")
    doc["gpu"] = torch.cuda.get_device_name(0) if device == "cuda" else "none (CPU smoke)"
    doc["versions"] = dict(torch=torch.__version__, triton=__import__("triton").__version__)
    for key in [k for k in args.models.split(",") if k]:
        try:
            doc["models"][key] = profile_case(key, args.calls, args.top, device)
        except Exception as exc:  # a failed model is recorded, the others still run
            doc["models"][key] = dict(error=f"{type(exc).__name__}: {exc}"[:400])
        common.write_json(path, doc)
        r = doc["models"][key]
        if "error" in r:
            print(key, r["error"])
            continue
        for g in ("unfused_gm", "fused_gm"):
            x = r[g]
            print(f"{key} {g}: issue {x['issue_ms_median']:.3f} ms, nodes {x['nodes']}, "
                  f"node sum {x['node_sum_us']:.0f} us, interp {x['interpreter_us_per_forward']:.0f} us, "
                  f"syncs {x['syncs'].get('count')}")
            for line in x["syncs"].get("first") or []:
                print(f"   sync: {line}")
            for row in x["per_node"][:12]:
                print(f"   {row['host_us_per_forward']:8.1f} us  x{row['count_per_forward']:.0f}  {row['node']}")
            for row in x["cprofile"][:12]:
                print(f"   cprof own {row['own_us']:8.1f} us  x{row['calls_per_forward']:.0f}  {row['function']}")
    print("wrote", path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
