"""``lean.collapse_views``: trees of view-like nodes read from one tensor, made by one bound ``as_strided`` call each.

Every case compares the collapsed graph with the same graph before the pass, bit for bit and in layout (shape,
strides, storage offset), at the first call (which runs the tree's own ops and binds) and at later ones (which
take ``as_strided``): GPT-2's split of the QKV rows into heads, BERT's head views, the zoo decoder fused and
prepared lean, a corpus transformers model (``hf/gpt2`` at its CI size) through ``prepare_graph``, and the odd
cases: a view of a graph input (then an input with other strides: the tree's own ops again), a view that is an
output, a write through a collapsed view, a ``reshape`` that copies (stays on its ops, with the reason), a
root written in place before a ``reshape`` copies it (Swin's mask: that copy stays where the graph makes it), an
in-place geometry change (left alone), an input that requires grad under autograd (its ops).
"""

from __future__ import annotations

import copy
import sys
from pathlib import Path

import torch
import torch.fx

from explorer.runtime import lean, measure

ROOT = Path(__file__).resolve().parent.parent


def _same(a, b) -> None:
    fa, fb = measure.flat_outputs(a), measure.flat_outputs(b)
    assert len(fa) == len(fb) and fa
    for x, y in zip(fa, fb):
        assert x.shape == y.shape and x.stride() == y.stride() and x.storage_offset() == y.storage_offset()
        assert x.dtype == y.dtype and torch.equal(x, y)


def _collapsed(module: torch.nn.Module):
    """(the traced graph, a copy with its view trees collapsed, how many)."""
    gm = torch.fx.symbolic_trace(module)
    lean_gm = copy.deepcopy(gm)
    return gm, lean_gm, lean.collapse_views(lean_gm)


def _trees(gm):
    return [n.target for n in gm.graph.nodes if isinstance(n.target, lean.BoundViews)]


class _Gpt2Heads(torch.nn.Module):
    """GPT-2's attention input: one QKV GEMM, its rows split into q, k, v, each viewed into heads."""

    def forward(self, x, w):
        qkv = torch.matmul(x, w).view(2, 5, 3 * 24)
        q, k, v = qkv.split(24, 2)
        q = q.view(2, 5, 4, 6).transpose(1, 2)
        k = k.view(2, 5, 4, 6).transpose(1, 2)
        v = v.view(2, 5, 4, 6).transpose(1, 2)
        out = torch.softmax(q @ k.transpose(-1, -2), -1) @ v
        return out.transpose(1, 2).reshape(2, 5, 24).view(10, 24).sum(0)


def test_gpt2_heads_collapse_to_one_call_and_stay_bitwise():
    x, w = torch.randn(10, 16), torch.randn(16, 72)
    gm, lean_gm, n = _collapsed(_Gpt2Heads())
    assert n == 2
    trees = _trees(lean_gm)
    assert {(t.calls, t.leaves) for t in trees} == {(9, 3), (3, 1)}   # k read transposed once more
    with torch.inference_mode():
        want = gm(x, w)
        _same(lean_gm(x, w), want)                   # the first call: the trees' own ops, then bound
        heads = next(t for t in trees if t.leaves == 3)
        assert heads.root is not None, trees
        out = next(t for t in trees if t.leaves == 1)  # on the CPU the attention output is (B, H, S, D) rows:
        assert out.root is None and "copy" in out.why  # its reshape copies, the tree keeps its ops
        _same(lean_gm(x, w), want)                   # as_strided
        assert lean.aten_calls_per_forward(lean_gm, x, w) < lean.aten_calls_per_forward(gm, x, w)
    assert len(lean_gm.graph.nodes) < len(gm.graph.nodes)


class _InputViews(torch.nn.Module):
    """A tree read from a graph input, one of whose views is an output, another written through."""

    def forward(self, x):
        a = x.reshape(4, 6).t().unsqueeze(0)          # an output, a view of the input
        b = x.reshape(4, 6)[1:3].transpose(0, 1)      # written through below
        b.mul_(2.0)
        return a, b, x + 1


def test_views_of_an_input_an_output_and_a_write_through_a_view():
    gm, lean_gm, n = _collapsed(_InputViews())
    assert n == 1 and _trees(lean_gm)[0].leaves == 2
    with torch.inference_mode():
        for _ in range(2):                             # bind, then as_strided
            xa, xb = torch.randn(2, 12), None
            xb = xa.clone()
            want, got = gm(xa), lean_gm(xb)
            _same(got, want)
            assert torch.equal(xa, xb)                 # the write reached the input through the view, both ways
            assert got[0].untyped_storage().data_ptr() == xb.untyped_storage().data_ptr()
        # an input with other strides: the tree's own ops (reshape copies), the same results as the graph's
        base = torch.randn(12, 2)
        xa, xb = base.t(), base.clone().t()
        assert not xa.is_contiguous()
        _same(lean_gm(xb), gm(xa))
        assert torch.equal(xa, xb)


class _CopyingReshape(torch.nn.Module):
    def forward(self, x):
        return x.transpose(0, 1).reshape(-1).view(3, -1) * 1.0


def test_a_reshape_that_copies_keeps_the_tree_ops():
    x = torch.randn(4, 6)
    gm, lean_gm, n = _collapsed(_CopyingReshape())
    assert n == 1
    with torch.inference_mode():
        _same(lean_gm(x), gm(x))
        _same(lean_gm(x), gm(x))
    tree = _trees(lean_gm)[0]
    assert tree.root is None and "copy" in tree.why


class _MaskFilledInPlace(torch.nn.Module):
    """torchvision Swin's shifted-window mask: zeros, slices of it filled in place, then viewed, permuted and
    reshaped (a copy) into windows. A tree's ops run where its first node is, so a reshape inside one would copy
    the mask before the fills."""

    def forward(self, x):
        mask = x.new_zeros((4, 6))
        count = 0
        for h in (slice(0, 2), slice(2, 3), slice(3, None)):
            for w in (slice(0, 3), slice(3, 5), slice(5, None)):
                mask[h, w] = count
                count += 1
        windows = mask.view(2, 2, 3, 2).permute(0, 2, 1, 3).reshape(-1, 4)
        return x + windows.unsqueeze(1).transpose(0, 1)


def test_a_copy_of_a_root_written_in_place_is_made_after_the_writes():
    gm = torch.export.export(_MaskFilledInPlace(), (torch.randn(1, 6, 4),)).module()
    lean_gm = copy.deepcopy(gm)
    lean.collapse_views(lean_gm)
    x = torch.randn(1, 6, 4)
    with torch.inference_mode():
        want = gm(x)
        assert want.abs().sum() > x.abs().sum() - 1                 # the mask is not all zeros
        _same(lean_gm(x), want)
        _same(lean_gm(x), want)
    assert not any("reshape" in str(n.target) for t in _trees(lean_gm) for n in t.generic.graph.nodes)


class _GeometryWrite(torch.nn.Module):
    def forward(self, x):
        y = x.view(6, 4).transpose(0, 1)
        x.t_()                                          # changes x's geometry after the first view
        return y.view(-1, 2).unsqueeze(0) + 0, x.view(-1).unsqueeze(1).squeeze(1) + 0


def test_an_in_place_geometry_change_leaves_the_tree_alone():
    gm, lean_gm, n = _collapsed(_GeometryWrite())
    assert n == 0 and not _trees(lean_gm)


def test_autograd_takes_the_tree_ops():
    x, w = torch.randn(10, 16), torch.randn(16, 72, requires_grad=True)
    gm, lean_gm, _ = _collapsed(_Gpt2Heads())
    with torch.inference_mode():
        lean_gm(x, w.detach())                          # bind
    out = lean_gm(x, w)
    out.sum().backward()
    g = w.grad.clone()
    w.grad = None
    gm(x, w).sum().backward()
    assert torch.equal(g, w.grad)


def test_single_views_are_left_alone():
    class One(torch.nn.Module):
        def forward(self, x):
            return x.view(-1) + 1, x.transpose(0, 1) * 2

    _, lean_gm, n = _collapsed(One())
    assert n == 0


def test_bert_block_prepared_with_views_equals_without():
    """The zoo's BERT-style encoder block through ``prepare_graph``, unfused and fused (CPU): the view pass on
    (the default) against off, bitwise, with fewer nodes and ATen calls."""
    from test_lean import _fused

    model, _, fused = _fused("transformer_block", batch=2, seq_len=8)
    for gm in (model.gm, fused.gm):
        off = measure.prepare_graph(gm, "cpu", torch.float32, binds=lean.Binds(views=False))
        on = measure.prepare_graph(gm, "cpu", torch.float32, binds=lean.Binds(views=True))
        with torch.inference_mode():
            want = off(*model.example_inputs)
            _same(on(*model.example_inputs), want)
            _same(on(*model.example_inputs), want)
            assert lean.aten_calls_per_forward(on, *model.example_inputs) < lean.aten_calls_per_forward(
                off, *model.example_inputs)
        assert _trees(on) and len(on.graph.nodes) < len(off.graph.nodes)


def test_zoo_decoder_fused_and_lean_with_views_equals_without():
    from triton_testing import detect_module, fuse_all, randomized

    from explorer.sources import models

    torch.manual_seed(0)
    sizes = dict(layers=1, hidden=48, heads=3, kv_heads=1, intermediate=40, vocab=64, max_positions=32)
    model = randomized(models.LlamaDecoder(sizes).eval(), 1)
    ids = torch.randint(0, 64, (2, 7))
    gm, det = detect_module(model, (ids,), "tiny_llama")
    for graph in (gm, fuse_all(gm, det).gm):
        off = measure.prepare_graph(graph, "cpu", torch.float32, binds=lean.Binds(views=False))
        on = measure.prepare_graph(graph, "cpu", torch.float32)
        with torch.inference_mode():
            want = off(ids)
            _same(on(ids), want)
            _same(on(ids), want)
        if graph is gm:
            assert _trees(on)


def test_corpus_gpt2_through_prepare_graph():
    """A transformers GPT-2 (the corpus's ``hf/gpt2`` at its CI size, eager attention) captured and prepared
    as the runner prepares it: views on against off, bitwise."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from benchmarks import corpus
    from triton_testing import detect_module

    entry = corpus.by_name("hf/gpt2")
    module = entry.build("ci")
    module.config.use_cache = False                   # no DynamicCache in the outputs (a folder's forward)
    inputs = entry.inputs("ci", module=module)
    gm, _ = detect_module(module, inputs, "hf_gpt2")
    off = measure.prepare_graph(gm, "cpu", torch.float32, binds=lean.Binds(views=False))
    on = measure.prepare_graph(gm, "cpu", torch.float32)
    with torch.inference_mode():
        want = off(*inputs)
        _same(on(*inputs), want)
        _same(on(*inputs), want)
    trees = _trees(on)
    assert trees and any(t.root is not None for t in trees), trees


def test_a_detach_of_a_constant_is_dropped_and_one_of_a_parameter_that_needs_grad_is_not():
    root = torch.nn.Module()
    root.register_buffer("empty", torch.zeros(1, 2, 0, 3))
    root.w = torch.nn.Parameter(torch.ones(3))
    g = torch.fx.Graph()
    k = g.placeholder("k")
    empty, w = g.get_attr("empty"), g.get_attr("w")
    cat = g.call_function(torch.cat, ([g.call_function(torch.ops.aten.detach_.default, (empty,)), k], -2))
    g.output((cat, g.call_function(torch.mul, (g.call_method("detach_", (w,)), 1.0))))
    gm = torch.fx.GraphModule(root, g)
    lean_gm = copy.deepcopy(gm)
    assert lean.drop_noop_detach(lean_gm) == 1        # the buffer's; the parameter requires grad: kept
    kv = torch.randn(1, 2, 4, 3)
    with torch.no_grad():
        _same(lean_gm(kv)[0], gm(kv)[0])
    assert [n.target for n in lean_gm.graph.nodes if n.op == "call_method"] == ["detach_"]
