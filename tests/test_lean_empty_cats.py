"""``lean.pass_empty_cats``: a ``cat`` onto constant empty tensors returns its one operand, where nothing can tell.

Each case compares the passed graph with the same graph before the pass, output values bit for bit, at the first
call (which runs the ``cat`` and binds) and at later ones (which return the operand): transformers' empty key/value
cache (``torch.tensor([])``, the legacy 1-D empty that ``cat`` skips, and one empty along the dim), a float32 empty
onto a bfloat16 key (the ``cat`` promotes: it stays), and the cases left alone: a cat that is an output, an
in-place write between the cat and its reader or into a view of the cat, two non-empty operands. Then a GPT-2 folder (its cache on) fused
and through ``prepare_graph``.
"""

from __future__ import annotations

import copy
import dataclasses

import torch
import torch.fx

from benchmark_scripts import fused_smoke_case

from explorer.runtime import lean, measure



def _graph(empty: torch.Tensor, *, write_between: bool = False, as_output: bool = False,
           two_full: bool = False, write_view_after: bool = False) -> torch.fx.GraphModule:
    """``q @ cat([empty, k], -2).transpose(-1, -2)``, k a transposed view (as a head split makes it)."""
    root = torch.nn.Module()
    root.register_buffer("empty", empty)
    g = torch.fx.Graph()
    q, kv = g.placeholder("q"), g.placeholder("kv")
    k = g.call_function(torch.transpose, (kv, 1, 2))
    operands = [g.get_attr("empty"), k] + ([k] if two_full else [])
    cat = g.call_function(torch.cat, (operands, -2))
    if write_between:
        g.call_method("mul_", (k, 2.0))
    k_t = g.call_function(torch.transpose, (cat, -1, -2))
    scores = g.call_function(torch.matmul, (q, k_t))
    if write_view_after:                                # a write into a view of the cat after its only reader
        g.call_method("mul_", (k_t, 2.0))
        scores = g.call_function(torch.add, (scores, g.call_function(torch.matmul, (q, k_t))))
    g.output((scores, cat) if as_output else scores)
    return torch.fx.GraphModule(root, g)


def _inputs(dtype=torch.float32):
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(2, 3, 5, 4, generator=gen).to(dtype)
    kv = torch.randn(2, 5, 3, 4, generator=gen).to(dtype)          # (B, L, H, E): transposed to (B, H, L, E)
    return q, kv


def _passed(gm):
    lean_gm = copy.deepcopy(gm)
    return lean_gm, lean.pass_empty_cats(lean_gm)


def _cats(gm) -> list:
    return [n.target for n in gm.graph.nodes if isinstance(n.target, lean.PassEmptyCat)]


def _aten_ops(fn, *args) -> list[str]:
    """The names of the ATen ops one call reaches through the dispatcher."""
    from torch.utils._python_dispatch import TorchDispatchMode

    names = []

    class _Names(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            names.append(func.overloadpacket.__name__)
            return func(*args, **(kwargs or {}))

    with _Names():
        fn(*args)
    return names


def _same_values(a, b) -> None:
    fa, fb = measure.flat_outputs(a), measure.flat_outputs(b)
    assert len(fa) == len(fb) and fa
    for x, y in zip(fa, fb):
        assert x.shape == y.shape and x.dtype == y.dtype and torch.equal(x, y)


def test_a_cat_onto_the_empty_cache_returns_its_operand_after_the_first_call():
    for empty in (torch.tensor([]), torch.zeros(2, 3, 0, 4)):
        gm = _graph(empty)
        lean_gm, n = _passed(gm)
        assert n == 1
        q, kv = _inputs()
        want = gm(q, kv)
        _same_values(lean_gm(q, kv), want)                # the first call: the cat itself
        (bound,) = _cats(lean_gm)
        assert bound.bound is not None, bound
        k = kv.transpose(1, 2)
        assert bound([lean_gm.empty, k]) is k              # later calls: the operand, no copy
        _same_values(lean_gm(q, kv), want)
        assert "cat" in _aten_ops(gm, q, kv) and "cat" not in _aten_ops(lean_gm, q, kv)


def test_a_cat_that_promotes_the_operand_keeps_its_copy():
    gm = _graph(torch.tensor([]))                         # float32 empty: cat onto a bf16 key gives float32
    lean_gm, n = _passed(gm)
    assert n == 1
    q, kv = _inputs(torch.bfloat16)
    q = q.float()
    want = gm(q, kv)
    for _ in range(2):
        _same_values(lean_gm(q, kv), want)
    (bound,) = _cats(lean_gm)
    assert bound.bound is None and "float32" in bound.why, bound


def test_cats_whose_copy_could_be_seen_are_left_alone():
    empty = torch.tensor([])
    for kwargs in (dict(as_output=True), dict(write_between=True), dict(two_full=True),
                   dict(write_view_after=True)):
        gm = _graph(empty, **kwargs)
        lean_gm, n = _passed(gm)
        assert n == 0, kwargs
        assert [node.target for node in lean_gm.graph.nodes] == [node.target for node in gm.graph.nodes]


def test_the_switch_is_on_by_default_and_a_copy_starts_unbound():
    assert lean.DEFAULT_BINDS.empty_cats                # on since bench_host_path_host5_h200.json
    assert not lean.Binds().empty_cats and not lean.NO_BINDS.empty_cats
    gm = _graph(torch.tensor([]))
    lean_gm, _ = _passed(gm)
    q, kv = _inputs()
    lean_gm(q, kv)
    (bound,) = _cats(lean_gm)
    assert bound.bound is not None and copy.deepcopy(bound).bound is None


def test_gpt2_with_its_cache_through_prepare_graph_is_bitwise_equal():
    """bench_measured's GPT-2 tiny smoke case (an HF folder, its cache on: a cat onto the empty cache per key
    and value), fused, prepared on the CPU in float32 with and without the pass."""
    model, gm = fused_smoke_case("gpt2_tiny_smoke")
    inputs = measure.prepare_inputs(model.example_inputs, "cpu", torch.float32, False)
    off = measure.prepare_graph(gm, "cpu", torch.float32,
                                binds=dataclasses.replace(lean.DEFAULT_BINDS, empty_cats=False))
    on = measure.prepare_graph(gm, "cpu", torch.float32)              # the default has the pass
    assert not _cats(off)
    with torch.inference_mode():
        want = off(*inputs)
        _same_values(on(*inputs), want)
        _same_values(on(*inputs), want)
    cats = _cats(on)
    assert len(cats) == 4 and all(c.bound is not None for c in cats), cats     # 2 layers x (key, value)
