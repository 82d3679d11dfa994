"""Which fused calls of a lean graph bind, and which replays decline: ``lean.audit_bound_calls`` per model, on the CPU.

A fused node that never binds ("reads a tensor made outside the call") or whose replay declines at every call
(an input's strides differ from the recorded ones) pays the fused call's whole Python path at every forward on
CUDA, tens of µs each; ``bench_corpus``'s ``bound_fused`` (the states after the first call) sees the first kind
only. Here each model is loaded, fused (every chain), prepared as the runner prepares it (``measure.prepare_graph``,
channels_last for the CNNs) in float32 on the CPU, its fused calls bound (``lean.bind_calls``, which
``prepare_graph`` applies on CUDA only) and run 3 times with the Triton kernels in Triton's interpreter; per
model: the bound nodes, those that never bound and those whose replay declined (with the reasons), and
whether the bound graph's output equals the unbound graph's bit for bit.

Not a GPU result: the CPU lowering chooses the kernels for the CPU (under the interpreter), so a fused call that
only CUDA lowers to a Triton call is not audited here, and a reason that only the CUDA launcher gives (a
compiled handle) cannot show.

Models (``--models``): ``bench_measured``'s zoo models (bert_base, convnext_tiny, resnet50, mobilenet_v2,
efficientnet_b0, llama_decoder) and gpt2_medium_layers at batch 1 (sequences of ``--seq-len``, images at the
zoo's 224), and the corpus's tv/swin_t and tv/vit_b_16 at their CI size.

Usage::

    TRITON_INTERPRET=1 python3 benchmarks/check_bound_replays.py [--models resnet50,tv/swin_t] [--seq-len 32]
    # writes $OUT/check_bound_replays.json (else benchmarks/results/)
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
for p in (ROOT, ROOT / "tests"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

from benchmarks import _common as common  # noqa: E402

ZOO = ("bert_base", "convnext_tiny", "resnet50", "mobilenet_v2", "efficientnet_b0", "llama_decoder")
MEASURED = ("gpt2_medium_layers",)
CORPUS = ("tv/swin_t", "tv/vit_b_16")
MODELS = ZOO + MEASURED + CORPUS


def build(name: str, seq_len: int):
    """(fused graph, inputs, channels_last) of one model on the CPU in float32, before ``prepare_graph``."""
    import torch

    from benchmarks import bench_measured as bm
    from explorer.fusion_engine import analyze, fuse
    from explorer.fusions.plan import make_plan
    from explorer.runtime import measure

    if name in CORPUS:
        from benchmarks import corpus
        from triton_testing import detect_module, fuse_all

        entry = corpus.by_name(name)
        module = entry.build("ci").eval()
        inputs = entry.inputs("ci", module=module)
        gm, det = detect_module(module, inputs, name.replace("/", "_"))
        return fuse_all(gm, det).gm, measure.prepare_inputs(inputs, "cpu", torch.float32, False), False
    case = bm.CASES[name]
    seq = seq_len if case.seq_len is not None else None
    case = dataclasses.replace(case, batch=1, seq_len=seq)
    with tempfile.TemporaryDirectory() as tmp:
        analysis = bm.load_case(case, Path(tmp)) if case.source.startswith("hf:") else analyze(
            case.source, batch=1, seq_len=seq)
    model, _graph, det = analysis
    plan = make_plan(det, "all", memory_format="channels_last" if case.channels_last else "nchw")
    fused = fuse(analysis, plan, "cpu")
    inputs = measure.prepare_inputs(model.example_inputs, "cpu", torch.float32, case.channels_last)
    return fused.gm, inputs, case.channels_last


def audit_model(name: str, seq_len: int, forwards: int = 3) -> dict:
    """``lean.audit_bound_calls`` of one model's fused graph, its summary, and the bound output against the
    unbound graph's, bit for bit."""
    import torch

    from explorer.runtime import lean, measure

    start = time.perf_counter()
    fused_gm, inputs, channels_last = build(name, seq_len)
    plain = measure.prepare_graph(fused_gm, "cpu", torch.float32, channels_last)
    bound = measure.prepare_graph(fused_gm, "cpu", torch.float32, channels_last)   # (a deep copy of a prepared
    lean.bind_calls(bound)                      # GPT-2's may hold a folded tensor with autograd history)
    rows = lean.audit_bound_calls(bound, inputs, forwards)
    with torch.inference_mode():
        want, got = measure.flat_outputs(plain(*inputs)), measure.flat_outputs(bound(*inputs))
    same = all(torch.equal(a, b) and a.stride() == b.stride() for a, b in zip(want, got))
    return dict(model=name, **lean.audit_summary(rows), bitwise=same, nodes=rows,
                seconds=round(time.perf_counter() - start, 1))


def line(r: dict) -> str:
    never = "; ".join(f"{n}× {why}" for why, n in r["never_bound"].items()) or "-"
    declining = "; ".join(f"{n}× {why}" for why, n in r["declining"].items()) or "-"
    return (f"| {r['model']} | {r['fused']} | {r['bound']} | {never} | {declining} "
            f"({r['always_declining']} always) | {r['bitwise']} |")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--seq-len", type=int, default=32)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    os.environ["TRITON_INTERPRET"] = "1"
    import torch

    torch.manual_seed(0)
    doc = dict(schema="check_bound_replays/1", **common.run_stamp(),
               label="CPU (Triton interpreter), float32, batch 1: bound fused calls and declined replays",
               seq_len=args.seq_len, models={})
    print("| model | fused nodes | bound | never bound (reasons) | replays declining (reasons) | bitwise |")
    print("|---|---|---|---|---|---|")
    for name in args.models.split(","):
        try:
            r = audit_model(name, args.seq_len)
        except Exception as exc:   # one model's failure must not lose the others'
            r = dict(model=name, error=f"{type(exc).__name__}: {str(exc)[:300]}")
            print(f"| {name} | error: {r['error']} |", flush=True)
        else:
            print(line(r), flush=True)
        doc["models"][name] = r
    path = Path(args.out) if args.out else common.results_path(None, "check_bound_replays.json")
    common.write_json(path, doc)
    print("wrote", path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
