"""How often each family's ``select_*`` runs to fuse a zoo model, lower its lean graph, and (on the CPU) run it once.

Runs on any tree, before issue 21's change as after (it wraps each family module's ``select_*`` attribute,
which the call sites look up at call time, rather than reading the selection registry the old tree lacks), so
that the two counts compare. Per model: cpu/fp32 (fuse, lowering, one forward) and cuda/fp16 as planned (fuse and
lowering: no GPU needed). A name with a slash is a corpus entry (``benchmarks/corpus.py``, at its CI size:
one layer, eager attention), captured as ``bench_corpus.py`` captures it. The CPU forward runs the Triton
kernels under the interpreter (``TRITON_INTERPRET=1`` unless set otherwise). ``--out`` writes the rows as JSON
(each phase's count, and every call after the rewrite by selection)::

    python3 benchmarks/check_selection_calls.py resnet50 bert_base llama_decoder hf/gpt2 [--out calls.json]
"""
import argparse
import importlib
import json
import os
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
from explorer import fusion_engine  # noqa: E402
from explorer.fusions import FAMILY_NAMES  # noqa: E402
from explorer.fusions.plan import make_plan  # noqa: E402
from explorer.runtime import lean, measure  # noqa: E402

counts = Counter()
phase = ["fuse"]


def count_selections() -> None:
    """Wrap each family module's ``select_*`` so that its calls count under the current phase."""
    for fam in FAMILY_NAMES:
        mod = importlib.import_module(f"explorer.fusions.{fam}")
        for name in dir(mod):
            fn = getattr(mod, name)
            if name.startswith("select_") and callable(fn) and fn.__module__ == mod.__name__:
                def wrap(*a, _fn=fn, _n=f"{fam}.{name}", **k):
                    counts[(phase[0], _n)] += 1
                    return _fn(*a, **k)
                setattr(mod, name, wrap)


try:
    from explorer.vocab import Target
except ImportError:
    Target = None


def analysis(name: str):
    """The zoo model ``name``'s analysis, or a corpus entry's (``hf/gpt2``) captured at its CI size."""
    if "/" not in name:
        return fusion_engine.analyze(name)
    from benchmarks import corpus
    from explorer.graph.build import build_graph
    from explorer.sources import LoadedModel, capture

    entry = corpus.by_name(name)
    module = entry.build("ci")
    features = corpus.features_module(entry, module)
    x = entry.inputs("ci", module=module)
    gm = capture(features, x, name)
    graph = build_graph(gm, name)
    model = LoadedModel(name, "corpus", gm, tuple(x), [f"x{i}" for i in range(len(x))])
    return fusion_engine.Analysis(model, graph, fusion_engine.detect(graph))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="*", default=["resnet50", "bert_base", "llama_decoder"])
    ap.add_argument("--out", help="write the rows as JSON here")
    args = ap.parse_args()
    os.environ.setdefault("TRITON_INTERPRET", "1")
    count_selections()
    out = {}
    for model in args.models:
        a = analysis(model)
        for device, dtype in (("cpu", "fp32"), ("cuda", "fp16")):
            counts.clear()
            plan = make_plan(a.detection, "all")
            phase[0] = "fuse"
            target = Target(device, dtype) if Target else device
            fused = fusion_engine.fuse(a, plan, target)
            phase[0] = "lowering"
            gm = measure.prepare_graph(fused.gm, "cpu", measure.torch_dtype(dtype), lean=False)
            lean.specialize_fused_calls(gm, torch.device(device), measure.torch_dtype(dtype))
            if device == "cpu":
                phase[0] = "forward"
                x = measure.prepare_inputs(a.model.example_inputs, "cpu", torch.float32)
                with torch.inference_mode():
                    gm(*x)
            n_fused = sum(1 for c in fused.applied if c.status == "fused")
            by_phase = Counter()
            for (p, _), v in counts.items():
                by_phase[p] += v
            later = {f"{p}:{n}": v for (p, n), v in counts.items() if p != "fuse"}
            out[f"{model} {device}/{dtype}"] = {"fused_chains": n_fused, **by_phase, "after_fuse": later}
            print(model, device, dtype, {"fused_chains": n_fused, **by_phase}, later, flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps({
            "command": " ".join(["python3", "benchmarks/check_selection_calls.py", *sys.argv[1:]]),
            "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "TRITON_INTERPRET": os.environ.get("TRITON_INTERPRET"), "rows": out}, indent=1))


if __name__ == "__main__":
    main()
