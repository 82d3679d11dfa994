"""``lean.addmm_as_linear``: ``addmm(b, x.view(-1, K), W)`` and the views around it as one ``linear(x, Wᵀ, b)``.

ATen's ``linear`` runs the same ``addmm`` on the same flattened view (a 2-D input, or a contiguous 3-D one), so
each case checks the passed graph against the graph before the pass bit for bit, in float32, float16 and
bfloat16 on shapes that fit no tile (K = 19, N = 45), and against float64 within the dtype's rounding; that the
two views' dispatcher calls are gone; that ``Wᵀ`` is a view of the weight (no copy); and the cases the pass must
leave alone: an input a view made (it may not be contiguous: ``linear`` would take its ``matmul`` path), a 4-D
input, a reader of the ``addmm`` that is not a view, ``beta``/``alpha``. Then a GPT-2 folder (transformers'
``Conv1D``) through ``prepare_graph``.
"""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch
import torch.fx

from benchmark_scripts import fused_smoke_case

from explorer.runtime import lean, measure

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
#: the addmm's own rounding against float64: fp32 accumulation over K = 19 terms, one rounding to the dtype
TOL64 = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}


#: the leading dims of each form's input to the projection (the view back restores them)
LEAD = dict(conv1d=(3, 7), two_d=(7,), transposed_input=(7, 3), four_d=(1, 3, 7), non_view_reader=(3, 7),
            beta=(3, 7))


class _Conv1D(torch.nn.Module):
    """transformers' ``Conv1D`` after a LayerNorm: ``x.view(-1, nx)``, ``addmm``, a view back; ``form`` varies it."""

    def __init__(self, k=19, n=45, form="conv1d"):
        super().__init__()
        gen = torch.Generator().manual_seed(3)
        self.gamma = torch.nn.Parameter(1 + torch.randn(k, generator=gen) / 4)
        self.weight = torch.nn.Parameter(torch.randn(k, n, generator=gen) / k ** 0.5)
        self.bias = torch.nn.Parameter(torch.randn(n, generator=gen))
        self.form, self.k, self.n = form, k, n                 # plain ints: the traced views' shapes are constants

    def forward(self, x):
        h = torch.nn.functional.layer_norm(x, (self.k,), self.gamma)   # (B, S, K), contiguous, not a view
        if self.form == "transposed_input":
            h = h.transpose(0, 1)                              # a view: not contiguous
        if self.form == "four_d":
            h = h.unsqueeze(0) * 1.0                           # (1, B, S, K)
        if self.form == "two_d":
            h = h[0] * 1.0                                     # (S, K), not a view
        k = self.k
        flat = h.reshape(-1, k) if self.form == "transposed_input" else h.view(-1, k)
        if self.form == "beta":
            out = torch.addmm(self.bias, flat, self.weight, beta=0.5)
        else:
            out = torch.addmm(self.bias, flat, self.weight)
        if self.form == "non_view_reader":
            return out * 2.0
        return out.view(*LEAD[self.form], self.n)


def _graph(form="conv1d", dtype=torch.float32):
    module = _Conv1D(form=form).to(dtype)
    gm = torch.fx.symbolic_trace(module)
    x = _input(dtype)
    _Record(gm).run(x)                                         # node.meta["val"], as a capture records it
    return gm, x


class _Record(torch.fx.Interpreter):
    """Runs the graph once and keeps each node's value as its ``meta["val"]``."""

    def run_node(self, n):
        value = super().run_node(n)
        n.meta["val"] = value
        return value


def _input(dtype):
    return torch.randn(3, 7, 19, generator=torch.Generator().manual_seed(4)).to(dtype)


def _passed(gm):
    lean_gm = copy.deepcopy(gm)
    return lean_gm, lean.addmm_as_linear(lean_gm)


def _addmms(gm):
    return [n for n in gm.graph.nodes if n.target is torch.addmm]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("form", ["conv1d", "two_d"])
def test_a_flattened_addmm_becomes_one_linear_bit_for_bit(form, dtype):
    gm, x = _graph(form, dtype)
    lean_gm, n = _passed(gm)
    assert n == 1 and not _addmms(lean_gm)
    (linear,) = [node for node in lean_gm.graph.nodes if node.target is torch._C._nn.linear]
    views = [node for node in lean_gm.graph.nodes if node.op == "call_method" and node.target == "view"]
    assert views == [] if form == "conv1d" else len(views) <= 1, lean_gm.code   # the view back is dropped
    with torch.inference_mode():
        want, got = gm(x), lean_gm(x)
        assert got.shape == want.shape and got.stride() == want.stride()
        assert torch.equal(got, want)
        assert lean.aten_calls_per_forward(lean_gm, x) <= lean.aten_calls_per_forward(gm, x) - 1
    ref = _Conv1D(form=form).double()
    ref.load_state_dict({k: v.double() for k, v in gm.state_dict().items() if k in ref.state_dict()})
    with torch.no_grad():
        want64 = ref(x.double())
    err = ((got.double() - want64).norm() / want64.norm()).item()
    assert err < TOL64[dtype], err
    wt = lean_gm.__dict__[linear.args[1].target]
    assert wt.data_ptr() == lean_gm.weight.data_ptr() and torch.equal(wt, lean_gm.weight.t())   # a view, no copy


def test_the_conv1d_views_are_two_fewer_calls():
    gm, x = _graph("conv1d")
    lean_gm, _ = _passed(gm)
    with torch.inference_mode():
        assert lean.aten_calls_per_forward(lean_gm, x) == lean.aten_calls_per_forward(gm, x) - 2


@pytest.mark.parametrize("form", ["transposed_input", "four_d", "non_view_reader", "beta"])
def test_forms_the_pass_leaves_alone(form):
    gm, x = _graph(form)
    lean_gm, n = _passed(gm)
    assert n == 0 and len(_addmms(lean_gm)) == 1
    assert [node.target for node in lean_gm.graph.nodes] == [node.target for node in gm.graph.nodes]


def test_the_switch_is_off_by_default():
    assert not lean.DEFAULT_BINDS.addmm_linears and not lean.Binds().addmm_linears   # on only with a measurement
    assert "addmm_linears" in lean.Binds(addmm_linears=True).label()


def test_gpt2_through_prepare_graph_is_bitwise_equal():
    """bench_measured's GPT-2 tiny smoke case (an HF folder: ``Conv1D`` projections), fused, prepared on the CPU in
    float32 and bfloat16 with and without the pass: c_attn and the MLP's c_proj per layer become linears (c_fc is
    already one, in the Linear+GELU chain)."""
    model, gm = fused_smoke_case("gpt2_tiny_smoke")
    for dtype in (torch.float32, torch.bfloat16):
        inputs = measure.prepare_inputs(model.example_inputs, "cpu", dtype, False)
        off = measure.prepare_graph(gm, "cpu", dtype)
        on = measure.prepare_graph(gm, "cpu", dtype, binds=dataclasses.replace(lean.DEFAULT_BINDS, addmm_linears=True))
        # 2 layers x 3 projections; c_proj after attention stays: its input is a reshape of the transposed heads
        assert len(_addmms(off)) == 6 and len(_addmms(on)) == 2, on.code
        with torch.inference_mode():
            want = off(*inputs)
            for got in (on(*inputs), on(*inputs)):
                assert all(torch.equal(a, b) for a, b in zip(measure.flat_outputs(got), measure.flat_outputs(want)))
            assert lean.aten_calls_per_forward(on, *inputs) < lean.aten_calls_per_forward(off, *inputs)


def test_the_transposed_weight_view_is_detached_and_copies():
    """``weight_t_attr``'s ``w.t()`` is a view of the parameter with no autograd link: a prepared graph holding it
    deep-copies (with the link it raised "Only Tensors created explicitly by the user support the deepcopy
    protocol")."""
    from explorer.fusions.kernels.linear_act import weight_t_attr

    gm = torch.fx.symbolic_trace(torch.nn.Linear(3, 4))
    weight = next(n for n in gm.graph.nodes if n.op == "get_attr" and n.target == "weight")
    name = weight_t_attr(gm, weight, gm.weight)
    wt = getattr(gm, name)
    assert wt.grad_fn is None and wt.data_ptr() == gm.weight.data_ptr() and wt.shape == (3, 4)
    assert torch.equal(getattr(copy.deepcopy(gm), name), wt)
