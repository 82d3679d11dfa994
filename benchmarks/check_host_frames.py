"""A CPU proxy of the fused graph's host path: Python frames of the explorer per forward, bound against generic.

Not a GPU number and not a time: on the CPU the Triton kernels run in Triton's interpreter, whose own frames say
nothing about a CUDA launch. What it counts is the explorer's own Python work per forward (frames whose code is
in ``explorer/``: selections, plans, keys, wrappers), the part ``lean.bind_calls``/``bind_attention``/
``bind_linears`` remove, for the tiny zoo-style Llama decoder (2 layers, GQA 3 over 1 heads of 16, both LLM
epilogues on) fused and prepared lean on the CPU, then bound; and the environment reads (``os.environ``) per
forward. Then the view pass (``lean.collapse_views``): graph nodes and ATen calls per forward (a dispatcher count,
``lean.aten_calls_per_forward``) with it off and on, for the tiny decoder (unfused and fused), the zoo's BERT-style
transformer block (unfused and fused), the corpus's ``hf/gpt2`` at its CI size (unfused) and ``bench_measured``'s
GPT-2-medium layers and BERT-base at batch 1 × 128 (unfused and fused, float32), each checked bit for bit
against the graph without the pass. Then ``lean.addmm_as_linear`` (``Binds.addmm_linears``, off by default until
measured) on the same graphs: ``addmm`` nodes and ATen calls per forward with the default binds and with it, bit
for bit. Then ``lean_heads`` (``Binds.heads``) on torchvision's ViT-B/32, unfused and fused: ATen calls and
activation copies (``lean.copies_per_forward``) per forward without the pass and with it, bit for bit.

Usage::

    python3 benchmarks/check_host_frames.py        # writes $OUT/check_host_frames.json (else benchmarks/results/)
"""

from __future__ import annotations

import collections
import copy
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
for p in (ROOT, ROOT / "tests"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

from benchmarks import _common as common  # noqa: E402


def frames_per_forward(fn, calls: int = 3) -> tuple[float, float, dict]:
    """(explorer frames per call, environment reads per call, the top explorer functions by frames)."""
    counts: collections.Counter = collections.Counter()
    env_reads = [0]
    explorer = str(ROOT / "explorer")

    import triton
    interpreter = str(Path(triton.__file__).parent)

    def in_kernel(frame) -> bool:
        """A frame the Triton interpreter runs (a kernel body or its helpers): not host work on a GPU."""
        f = frame.f_back
        while f is not None:
            if f.f_code.co_filename.startswith(interpreter):
                return True
            f = f.f_back
        return False

    def profiler(frame, event, arg):
        if event == "call":
            code = frame.f_code
            if code.co_filename.startswith(explorer) and not in_kernel(frame):
                counts[f"{Path(code.co_filename).name}:{code.co_name}"] += 1
            elif code.co_name == "__getitem__" and code.co_filename in ("<frozen os>", os.__file__):
                env_reads[0] += 1

    sys.setprofile(profiler)
    try:
        for _ in range(calls):
            fn()
    finally:
        sys.setprofile(None)
    top = dict((k, v / calls) for k, v in counts.most_common(15))
    return sum(counts.values()) / calls, env_reads[0] / calls, top


def _flat_outputs(out) -> list:
    from explorer.runtime.measure import flat_outputs   # (torch imported late: --help stays fast)
    return flat_outputs(out)


def bench_cases(keys) -> dict:
    """``bench_measured``'s models at batch 1 × 128 on the CPU in float32: name -> (graph, inputs), unfused and
    fused (every chain)."""
    import dataclasses
    import tempfile

    import torch

    from benchmarks import bench_measured as bm
    from explorer.fusion_engine import fuse
    from explorer.fusions.plan import make_plan
    from explorer.runtime import measure

    out = {}
    for key in keys:
        case = dataclasses.replace(bm.CASES[key], batch=1, seq_len=128)
        with tempfile.TemporaryDirectory() as tmp:
            analysis = bm.load_case(case, Path(tmp))
        model, _graph, det = analysis
        fused = fuse(analysis, make_plan(det, "all"), "cpu")
        inputs = measure.prepare_inputs(model.example_inputs, "cpu", torch.float32, False)
        out[f"{key} 1x128 unfused"] = (model.gm, inputs)
        out[f"{key} 1x128 fused"] = (fused.gm, inputs)
    return out


def view_pass_counts(decoder_gm, decoder_fused_gm, ids) -> dict:
    """Nodes and ATen calls per forward without and with ``collapse_views`` (everything else as
    ``prepare_graph``'s default), per graph, and whether the outputs are the same bit for bit."""
    import torch

    from benchmarks import corpus
    from test_lean import _fused
    from triton_testing import detect_module

    from explorer.runtime import lean, measure

    block, _, block_fused = _fused("transformer_block", batch=2, seq_len=8)
    entry = corpus.by_name("hf/gpt2")
    gpt2 = entry.build("ci")
    gpt2.config.use_cache = False
    gpt2_inputs = entry.inputs("ci", module=gpt2)
    gpt2_gm, _ = detect_module(gpt2, gpt2_inputs, "hf_gpt2")
    cases = {"tiny decoder unfused": (decoder_gm, (ids,)), "tiny decoder fused": (decoder_fused_gm, (ids,)),
             "transformer block unfused": (block.gm, block.example_inputs),
             "transformer block fused": (block_fused.gm, block.example_inputs),
             "hf/gpt2 (CI size) unfused": (gpt2_gm, gpt2_inputs)}
    cases.update(bench_cases(("gpt2_medium_layers", "bert_base")))
    out = {}
    for name, (gm, inputs) in cases.items():
        off = measure.prepare_graph(gm, "cpu", torch.float32, binds=lean.Binds(views=False))
        on = measure.prepare_graph(gm, "cpu", torch.float32, binds=lean.Binds(views=True))
        with torch.inference_mode():
            want, first, again = off(*inputs), on(*inputs), on(*inputs)
            calls_off, calls_on = lean.aten_calls_per_forward(off, *inputs), lean.aten_calls_per_forward(on, *inputs)
        same = all(torch.equal(a, b) and torch.equal(a, c) and a.stride() == c.stride()
                   for a, b, c in zip(_flat_outputs(want), _flat_outputs(first), _flat_outputs(again)))
        trees = [n.target for n in on.graph.nodes if isinstance(n.target, lean.BoundViews)]
        out[name] = dict(nodes_off=len(off.graph.nodes), nodes_on=len(on.graph.nodes), aten_calls_off=calls_off,
                         aten_calls_on=calls_on, trees=len(trees), trees_bound=sum(t.root is not None for t in trees),
                         bitwise=same, states=sorted({repr(t) for t in trees}))
    return out, cases


def addmm_pass_counts(cases) -> dict:
    """Per graph of ``view_pass_counts``: nodes, ATen calls per forward and the outputs bit for bit, with
    ``prepare_graph``'s default binds and with ``lean.addmm_as_linear`` on top (``Binds.addmm_linears``), and how
    many ``addmm`` it made linears."""
    import dataclasses

    import torch

    from explorer.runtime import lean, measure

    out = {}
    for name, (gm, inputs) in cases.items():
        off = measure.prepare_graph(gm, "cpu", torch.float32)
        on = measure.prepare_graph(gm, "cpu", torch.float32,
                                   binds=dataclasses.replace(lean.DEFAULT_BINDS, addmm_linears=True))
        count = lambda g: sum(1 for n in g.graph.nodes if n.target in (torch.addmm, torch.ops.aten.addmm.default))
        with torch.inference_mode():
            want, first, again = off(*inputs), on(*inputs), on(*inputs)
            calls_off, calls_on = lean.aten_calls_per_forward(off, *inputs), lean.aten_calls_per_forward(on, *inputs)
        same = all(torch.equal(a, b) and torch.equal(a, c) and a.stride() == c.stride()
                   for a, b, c in zip(_flat_outputs(want), _flat_outputs(first), _flat_outputs(again)))
        out[name] = dict(nodes_off=len(off.graph.nodes), nodes_on=len(on.graph.nodes), aten_calls_off=calls_off,
                         aten_calls_on=calls_on, addmm_off=count(off), addmm_on=count(on), bitwise=same)
    return out


def heads_pass_counts() -> dict:
    """``lean_heads.batch_first_heads`` (``Binds.heads``) on torchvision's ViT-B/32 at the corpus's CI size,
    captured at batch 2 (at batch 1 the transposed input is contiguous and there is one copy less to remove),
    unfused and fused: nodes, ATen calls and ``aten::copy_`` per forward without the pass and with it
    (everything else ``prepare_graph``'s default), attentions rewritten, outputs bit for bit."""
    import dataclasses

    import torch

    from benchmarks import corpus
    from triton_testing import detect_module, fuse_all

    from explorer.runtime import lean, lean_heads, measure

    entry = corpus.by_name("tv/vit_b_32")
    module = entry.build("ci").eval()
    image = entry.inputs("ci", module=module)[0]
    x = torch.randn(2, *image.shape[1:], generator=torch.Generator().manual_seed(4))
    gm, det = detect_module(module, (x,), "vit_b_32")
    off_binds = dataclasses.replace(lean.DEFAULT_BINDS, heads=False)
    out = {}
    for name, g in (("tv/vit_b_32 (CI size, batch 2) unfused", gm), ("tv/vit_b_32 (CI size, batch 2) fused",
                                                                     fuse_all(gm, det).gm)):
        off = measure.prepare_graph(g, "cpu", torch.float32, binds=off_binds)
        on = measure.prepare_graph(g, "cpu", torch.float32)
        with torch.inference_mode():
            same = torch.equal(off(x), on(x))
            row = dict(nodes_off=len(off.graph.nodes), nodes_on=len(on.graph.nodes),
                       aten_calls_off=lean.aten_calls_per_forward(off, x),
                       aten_calls_on=lean.aten_calls_per_forward(on, x),
                       copies_off=lean.copies_per_forward(off, x), copies_on=lean.copies_per_forward(on, x))
        row.update(rewritten=sum(1 for n in on.graph.nodes if lean_heads.op_name(n) == "seq_first_qkv"), bitwise=same)
        out[name] = row
    return out


def main() -> int:
    os.environ["TRITON_INTERPRET"] = "1"
    import torch
    from triton_testing import detect_module, fuse_all, randomized

    from explorer.fusions.kernels import measured
    from explorer.runtime import lean, measure
    from explorer.sources import models

    torch.manual_seed(0)
    sizes = dict(layers=2, hidden=48, heads=3, kv_heads=1, intermediate=40, vocab=64, max_positions=32)
    model = randomized(models.LlamaDecoder(sizes).eval(), 1)
    ids = torch.randint(0, 64, (2, 7))
    gm, det = detect_module(model, (ids,), "tiny_llama")
    fused = fuse_all(gm, det)
    with measured.policy(swiglu="always", qkv_rotary="always"):
        generic = measure.prepare_graph(fused.gm, "cpu", torch.float32)
    bound = copy.deepcopy(generic)
    n = dict(calls=lean.bind_calls(bound), attention=lean.bind_attention(bound), linears=lean.bind_linears(bound))
    doc = dict(schema="check_host_frames/1", **common.run_stamp(),
               label="CPU proxy (Triton interpreter): explorer frames per forward, not GPU time", bound_nodes=n)
    with torch.inference_mode():
        bound(ids)                                    # the first call records
        for name, g in (("generic", generic), ("bound", bound)):
            frames, env, top = frames_per_forward(lambda g=g: g(ids))
            doc[name] = dict(explorer_frames_per_forward=frames, environment_reads_per_forward=env, top=top)
            print(f"{name:8} explorer frames/forward {frames:7.1f}   os.environ reads/forward {env:5.1f}")
    doc["states"] = [repr(b) for b in lean.bound_calls(bound)]
    doc["views"], cases = view_pass_counts(gm, fused.gm, ids)
    for name, r in doc["views"].items():
        print(f"views {name:28} nodes {r['nodes_off']:4d} -> {r['nodes_on']:4d}   ATen calls/forward "
              f"{r['aten_calls_off']:4d} -> {r['aten_calls_on']:4d}   trees {r['trees']} bound {r['trees_bound']}   "
              f"bitwise {r['bitwise']}")
    doc["addmm_linears"] = addmm_pass_counts(cases)
    for name, r in doc["addmm_linears"].items():
        print(f"addmm {name:28} addmm {r['addmm_off']:3d} -> {r['addmm_on']:3d}   ATen calls/forward "
              f"{r['aten_calls_off']:4d} -> {r['aten_calls_on']:4d}   bitwise {r['bitwise']}")
    doc["heads"] = heads_pass_counts()
    for name, r in doc["heads"].items():
        print(f"heads {name:40} copies/forward {r['copies_off']:3d} -> {r['copies_on']:3d}   ATen calls/forward "
              f"{r['aten_calls_off']:4d} -> {r['aten_calls_on']:4d}   rewritten {r['rewritten']}   "
              f"bitwise {r['bitwise']}")
    path = common.results_path(None, "check_host_frames.json")
    common.write_json(path, doc)
    print("wrote", path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
