"""What the runner makes of a model before measuring it, on the cases the corpus found failing (issue 20).

- ``grouped_mm_reference``: the loop of per-group matmuls equals ``torch._grouped_mm`` (and transformers'
  ``grouped_mm_fallback``) in float32 on awkward shapes, an empty group included; a float64 eager model whose
  MoE calls ``_grouped_mm`` (no float64 kernel) runs through ``prepare_module`` and agrees with its float32 self.
- ``copy_module`` / ``record_casts``: a module caching a tensor autograd computed (timm LeViT's attention-bias
  cache after a forward with gradients) copies, and ``record_casts`` leaves the module as it was.
- ``prepare_graph``: the dtype arguments inside a fused graph's chain graph (an inductor chain's
  ``CompiledChain``) are retargeted as the root's are (Falcon's softmax with ``dtype=float32`` inside one).
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.fx

from explorer.runtime import measure


def test_grouped_mm_reference_is_the_op_in_float32():
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(13, 12, generator=gen)                     # (S, K), 13 rows sorted by group
    b = torch.randn(4, 12, 20, generator=gen)                  # (G, K, N)
    offs = torch.tensor([3, 3, 9, 11], dtype=torch.int32)      # group 1 empty; rows 11, 12 in no group
    want = torch._grouped_mm(a, b, offs=offs)
    got = measure.grouped_mm_reference(a, b, offs)
    torch.testing.assert_close(got[:11], want[:11], rtol=1e-5, atol=1e-5)   # the op leaves rows past 11 unwritten
    assert got[11:].abs().max() == 0
    batched = torch.randn(4, 5, 12, generator=gen)
    torch.testing.assert_close(measure.grouped_mm_reference(batched, b), torch._grouped_mm(batched, b))
    pytest.importorskip("transformers.integrations.moe")
    fallback = torch.ops.transformers.grouped_mm_fallback(a, b, offs)
    torch.testing.assert_close(got[:11], fallback[:11], rtol=1e-5, atol=1e-5)
    with pytest.raises(NotImplementedError):
        measure.grouped_mm_reference(a, a.T.contiguous(), offs)


def test_a_float64_reference_of_a_moe_runs_its_grouped_gemm_by_reference():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.MixtralConfig(hidden_size=64, intermediate_size=96, num_attention_heads=4,
                                        num_key_value_heads=2, num_hidden_layers=1, num_local_experts=4,
                                        num_experts_per_tok=2, vocab_size=128)
    config._attn_implementation = "eager"
    model = transformers.MixtralModel(config).eval()
    ids = torch.randint(0, 128, (2, 7))
    with torch.no_grad():
        with pytest.raises(RuntimeError, match="Double"):   # the op itself: no float64 kernel on this torch
            copy.deepcopy(model).double()(ids)
        want = model(ids).last_hidden_state.double()
        got = measure.prepare_module(model, "cpu", torch.float64)(ids).last_hidden_state
    assert got.dtype == torch.float64
    assert (got - want).abs().max() <= 1e-4 * want.abs().max()


class _CachedBias(torch.nn.Module):
    """A bias table read through a per-device cache, as timm's LeViT attention reads its biases."""

    def __init__(self) -> None:
        super().__init__()
        self.table = torch.nn.Parameter(torch.randn(6))
        self.cache: dict[str, torch.Tensor] = {}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        key = str(x.device)
        if key not in self.cache:
            self.cache[key] = self.table * 2.0
        return torch.softmax(x + self.cache[key], dim=-1)


def test_a_module_caching_a_non_leaf_tensor_copies_and_is_left_as_it_was():
    module = _CachedBias().eval()
    x = torch.randn(3, 6)
    module(x)                                       # with gradients on: the cache holds a non-leaf tensor
    assert not module.cache["cpu"].is_leaf
    with pytest.raises(RuntimeError, match="graph leaves"):
        copy.deepcopy(module)
    twin = measure.copy_module(module)
    torch.testing.assert_close(twin(x), module(x))
    assert twin.cache["cpu"] is not module.cache["cpu"] and twin.table is not module.table
    ref = measure.prepare_module(module, "cpu", torch.float64)
    assert ref(x.double()).dtype == torch.float64
    with torch.no_grad():
        gm = torch.export.export(module, (x,)).module()
    measure.record_casts(module, (x,), gm, torch.bfloat16)
    assert list(module.cache) == ["cpu"] and module.table.device.type == "cpu"   # no meta entry left behind


def test_prepare_graph_retargets_the_dtypes_inside_a_chains_graph():
    from explorer.fusions.generic import CompiledChain, fused_subgraph

    sub = torch.fx.Graph()
    a, v = sub.placeholder("a"), sub.placeholder("v")
    scores = sub.call_function(torch.ops.aten.softmax.int, (a, -1, torch.float32))   # the capture's dtype
    sub.output(sub.call_function(torch.ops.aten.matmul.default, (scores, v)))
    root = torch.fx.GraphModule(torch.nn.Module(), torch.fx.Graph())
    root.chain = CompiledChain(torch.fx.GraphModule(torch.nn.Module(), sub), compile_it=False)
    root.register_buffer("v", torch.randn(5, 3))
    x = root.graph.placeholder("x")
    root.graph.output(root.graph.call_function(fused_subgraph, (root.graph.get_attr("chain"), x,
                                                                root.graph.get_attr("v"))))
    root.recompile()
    inputs = torch.randn(2, 5)
    want = torch.softmax(inputs.double(), -1) @ root.v.double()
    got = measure.prepare_graph(root, "cpu", torch.bfloat16, lean=False)(inputs.bfloat16())
    assert got.dtype == torch.bfloat16
    assert (got.double() - want).abs().max() <= 2e-2 * want.abs().max()
    # the original is unchanged: its chain still says float32
    assert torch.float32 in next(n for n in root.chain.sub.graph.nodes if n.target is torch.ops.aten.softmax.int).args


def test_the_cast_record_reads_a_constant_through_its_fresh_copy():
    """Falcon's attention indexes with a constant the model makes with ``torch.tensor``: the float32 capture
    (real tensors) reads it through ``lift_fresh_copy``, the meta capture directly. The record matches the
    two anyway (it did not: "differs", and the bf16 graph lost the model's float32 islands); where two
    captures really differ (T5 casts to its weights' dtype only in bf16) the note says where."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.FalconConfig(hidden_size=64, num_attention_heads=4, multi_query=True, parallel_attn=True,
                                       new_decoder_architecture=False, bias=False, vocab_size=128, alibi=False,
                                       num_hidden_layers=1)
    config._attn_implementation = "eager"
    falcon = transformers.FalconModel(config).eval()

    class Hidden(torch.nn.Module):
        def __init__(self, model, **kwargs):
            super().__init__()
            self.model, self.kwargs = model, kwargs

        def forward(self, *ids):
            return self.model(*ids, **self.kwargs).last_hidden_state

    class Indexed(torch.nn.Module):
        """What Falcon's attention did up to transformers 4.x: index with a ``torch.tensor`` made in forward, around
        a float32 island (5.x no longer makes the constant, so the case is written out as well)."""
        def __init__(self):
            super().__init__()
            self.proj = torch.nn.Linear(16, 16)

        def forward(self, x):
            h = self.proj(x)
            picked = h[:, torch.tensor([0, 2, 3])]
            return torch.softmax(picked.float(), dim=-1).to(h.dtype)

    x = (torch.randn(2, 5, 16, generator=torch.Generator().manual_seed(1)),)
    indexed = Indexed().eval()
    with torch.no_grad():
        gm = torch.export.export(indexed, x).module()
    assert any(str(n.target) == "aten.lift_fresh_copy.default" for n in gm.graph.nodes)
    record, note = measure.record_casts(indexed, x, gm, torch.bfloat16)
    assert record is not None and "kept" in note.id, note

    ids = (torch.randint(0, 128, (1, 8), generator=torch.Generator().manual_seed(0)),)
    module = Hidden(falcon, use_cache=False).eval()
    with torch.no_grad():
        gm = torch.export.export(module, ids).module()
    record, note = measure.record_casts(module, ids, gm, torch.bfloat16)
    assert record is not None and "kept" in note.id, note
    t5 = Hidden(transformers.T5EncoderModel(transformers.T5Config(vocab_size=128, d_model=48, d_kv=12, d_ff=80,
                                                                  num_layers=1, num_heads=4)).eval())
    with torch.no_grad():
        gm = torch.export.export(t5, ids).module()
    record, note = measure.record_casts(t5, ids, gm, torch.bfloat16)
    assert record is None and "float32 has" in str(note) and "\n" not in str(note)
