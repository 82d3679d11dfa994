"""The sizes people use: the zoo's decoder at Llama-3-8B layer sizes, in the menu and the command line, its
chains found at those sizes, its weights filled at memory speed with the scales of the small decoder's.

CI stays cheap: the 8B-layer model is captured and detected on the meta device (no storage, any size);
its fast initialisation is checked on a tiny decoder of the same code path. The GPU runs it for real
(``benchmarks/run_outside_decoders.py``).
"""

from __future__ import annotations

import json

import torch

from explorer import cli
from explorer.fusion_engine import detect
from explorer.graph.build import build_graph
from explorer.sources import capture, models, zoo
from tests.test_llama import TINY, expected_counts

NAME = "llama_decoder_8b_layers"


def test_the_8b_layer_decoder_is_in_the_menu_and_the_models_command(capsys):
    assert NAME in [e.name for e in zoo.menu()] and zoo.ZOO[NAME].large
    assert cli.main(["models", "--json"]) == 0
    listed = {row["name"]: row for row in json.loads(capsys.readouterr().out)}
    assert "hidden 4096" in listed[NAME]["description"] and listed[NAME]["input"] == "input_ids[1, 128] int64"
    assert "llama_decoder" in listed                                   # the small decoder stays, for the tests
    sizes = zoo.LLAMA_8B_LAYERS
    assert (sizes["hidden"], sizes["heads"], sizes["kv_heads"], sizes["intermediate"], sizes["layers"],
            sizes["vocab"]) == (4096, 32, 8, 14336, 2, 32000)


def test_the_8b_layer_decoder_is_detected_at_its_sizes():
    """Captured on the meta device at batch 4 × 1024 (the GPU run's shape): two layers' chains, and the
    shapes are the real ones (a 14336-wide SwiGLU, 128-wide heads)."""
    module = models.LlamaDecoder(zoo.LLAMA_8B_LAYERS, init="meta").eval()
    assert sum(p.numel() for p in module.parameters()) > 6.9e8
    ids = torch.zeros((4, 1024), dtype=torch.int64, device="meta")
    gm = capture(module, (ids,), NAME)
    det = detect(build_graph(gm, NAME))
    assert det.counts == expected_counts(zoo.LLAMA_8B_LAYERS["layers"])
    swiglu = [c for c in det.chains if c.pattern == "swiglu"]
    shapes = {tuple(n.meta["val"].shape) for n in gm.graph.nodes
              if n.op == "call_function" and isinstance(n.meta.get("val"), torch.Tensor)}
    assert (4, 1024, 14336) in shapes and (4, 32, 1024, 128) in shapes and len(swiglu) == 2


def test_fast_weights_have_the_small_decoders_scales_and_are_seeded():
    a = models.LlamaDecoder(TINY, init="fast").eval()
    b = models.LlamaDecoder(TINY, init="fast").eval()
    ref = models.LlamaDecoder(TINY).eval()          # realistic_llama_weights: the same scales, drawn one by one
    for (name, p), q, r in zip(a.named_parameters(), b.parameters(), ref.parameters()):
        assert torch.equal(p, q), name                                   # seeded
        assert abs(float(p.std()) - float(r.std())) < 0.25 * float(r.std()) + 1e-3, name
        assert abs(float(p.mean()) - float(r.mean())) < 0.1, name
    ids = torch.randint(0, TINY["vocab"], (2, 7), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        logits, logits_ref = a(ids), ref(ids)
    assert torch.isfinite(logits).all() and 0.3 < float(logits.std()) / float(logits_ref.std()) < 3
