"""explorer.lean: a lean graph computes exactly what the plain one does, and takes the same kernels.

- Every public binding that replaces an ``OpOverload`` gives a bitwise-equal
  result on sample arguments (a binding without a sample fails the test).
- Whole zoo models, unfused and fused: the lean graph's outputs equal the plain
  graph's bitwise on the CPU.
- The fused-call specialisation picks, for a CUDA device, the library calls the
  generic targets pick at run time (cuDNN's fused conv+ReLU, cuBLASLt's
  epilogue): checked on graphs built on the CPU, and run on the GPU (``gpu``).
- Pinned weight reads keep parameter counts, follow a parameter moved in place,
  and survive ``deepcopy``.
"""

from __future__ import annotations

import copy
import gc

import pytest
import torch

from explorer.fusions import LOWERINGS, conv, rewrite
from explorer.fusions.epilogue import ACTIVATIONS, apply_activation, apply_activation_
from explorer.runtime import lean, measure
from explorer.fusion_engine import detect
from explorer.graph.build import build_graph
from explorer.fusions.plan import make_plan
from explorer.sources import load_model

aten = torch.ops.aten
HAS_CUDA = torch.cuda.is_available()


def _t(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


# (args, kwargs) per overload: each exercises the binding with the arguments the graph passes.
SAMPLES = {
    aten.linear.default: lambda: ((_t(2, 3, 8), _t(5, 8, seed=1), _t(5, seed=2)), {}),
    aten.transpose.int: lambda: ((_t(2, 3, 4), 1, 2), {}),
    aten.view.default: lambda: ((_t(2, 12), [2, 3, -1]), {}),
    aten.reshape.default: lambda: ((_t(2, 3, 4).transpose(1, 2), [2, -1]), {}),
    aten.contiguous.default: lambda: ((_t(2, 3, 4).transpose(1, 2),), {}),
    aten.expand.default: lambda: ((_t(1, 3), [4, -1]), {}),
    aten.permute.default: lambda: ((_t(2, 3, 4), [2, 0, 1]), {}),
    aten.unsqueeze.default: lambda: ((_t(2, 3), 1), {}),
    aten.squeeze.dim: lambda: ((_t(2, 1, 3), 1), {}),
    aten.unflatten.int: lambda: ((_t(2, 12), 1, [3, 4]), {}),
    aten.flatten.using_ints: lambda: ((_t(2, 3, 4), 1), {}),
    aten.select.int: lambda: ((_t(2, 3, 4), 1, 2), {}),
    aten.cat.default: lambda: (([_t(2, 3), _t(2, 3, seed=1)], 1), {}),
    aten.add.Tensor: lambda: ((_t(2, 3), _t(2, 3, seed=1)), {"alpha": 2}),
    aten.add_.Tensor: lambda: ((_t(2, 3), _t(3, seed=1)), {}),
    aten.mul.Tensor: lambda: ((_t(2, 3), 0.5), {}),
    aten.matmul.default: lambda: ((_t(2, 3, 4), _t(4, 5, seed=1)), {}),
    aten.conv2d.default: lambda: ((_t(1, 3, 9, 9), _t(4, 3, 3, 3, seed=1), _t(4, seed=2), [2, 2], [1, 1], [1, 1], 1),
                                  {}),
    aten.batch_norm.default: lambda: ((_t(2, 3, 4, 4), _t(3, seed=1), _t(3, seed=2), _t(3, seed=3),
                                       _t(3, seed=4).abs() + 0.1, False, 0.1, 1e-5, True), {}),
    aten.layer_norm.default: lambda: ((_t(2, 3, 8), [8], _t(8, seed=1), _t(8, seed=2), 1e-12), {}),
    aten.softmax.int: lambda: ((_t(2, 5), -1), {}),
    aten.relu.default: lambda: ((_t(2, 5),), {}),
    aten.relu_.default: lambda: ((_t(2, 5),), {}),
    aten.gelu.default: lambda: ((_t(2, 5),), {"approximate": "tanh"}),
    aten.silu.default: lambda: ((_t(2, 5),), {}),
    aten.hardtanh_.default: lambda: ((_t(2, 5) * 8, 0.0, 6.0), {}),
    aten.max_pool2d.default: lambda: ((_t(1, 2, 9, 9), [3, 3], [2, 2], [1, 1]), {}),
    aten.adaptive_avg_pool2d.default: lambda: ((_t(1, 2, 9, 9), [1, 1]), {}),
    aten.embedding.default: lambda: ((_t(10, 4), torch.tensor([[1, 9, 0]]), 0), {}),
    aten.scaled_dot_product_attention.default: lambda: (
        (_t(1, 2, 5, 8), _t(1, 2, 5, 8, seed=1), _t(1, 2, 5, 8, seed=2)),
        {"attn_mask": _t(1, 1, 5, 5, seed=3), "scale": 0.125}),
    aten.to.dtype: lambda: ((_t(2, 3), torch.float16, False, False), {}),
    aten.addmm.default: lambda: ((_t(5), _t(3, 4, seed=1), _t(4, 5, seed=2)), {"beta": 0.5, "alpha": 2.0}),
    aten.pow.Tensor_Scalar: lambda: ((_t(2, 3), 3.0), {}),
    aten.tanh.default: lambda: ((_t(2, 3),), {}),
    aten.neg.default: lambda: ((_t(2, 3),), {}),
    aten.rsqrt.default: lambda: ((_t(2, 3).abs() + 0.1,), {}),
    aten.mean.dim: lambda: ((_t(2, 3, 4), [-1], True), {"dtype": torch.float64}),
    aten.where.ScalarOther: lambda: ((_t(2, 3) > 0, _t(2, 3, seed=1), -1e4), {}),
}


@pytest.mark.parametrize("act", sorted(ACTIVATIONS))
def test_inplace_activation_equals_the_reference_step(act):
    """The one in-place library call a lowered graph (and an epilogue) runs for each activation
    computes exactly what the unfused reference step computes."""
    t = _t(4, 33) * 4
    assert torch.equal(apply_activation_(t.clone(), act), apply_activation(t.clone(), act))


def test_every_binding_has_a_sample():
    assert set(SAMPLES) == set(lean.PUBLIC_BINDINGS)


@pytest.mark.parametrize("op", list(lean.PUBLIC_BINDINGS), ids=str)
def test_public_binding_equals_overload(op):
    kind, target = lean.PUBLIC_BINDINGS[op]
    args, kwargs = SAMPLES[op]()
    expected = op(*copy.deepcopy(args), **kwargs)
    args = copy.deepcopy(args)
    got = getattr(args[0], target)(*args[1:], **kwargs) if kind == "method" else target(*args, **kwargs)
    assert type(got) is type(expected)
    assert got.shape == expected.shape and got.stride() == expected.stride()
    assert torch.equal(got, expected)


# ------------------------------------------------------------------ whole graphs

def _fused(name, batch=1, seq_len=8, device="cpu"):
    model = load_model(name, batch=batch, seq_len=seq_len)
    det = detect(build_graph(model.gm, model.name))
    return model, det, rewrite.apply_plan(model.gm, det, make_plan(det, "all"), device, level="all")


def _first(out):
    return out[0] if isinstance(out, (tuple, list)) else out


@pytest.mark.parametrize("name", ["conv_bn_relu", "residual_block", "transformer_block", "bert_base",
                                  "mobilenet_v2", "yolo_style"])
def test_lean_graph_equals_plain_graph(name):
    model, _, fused = _fused(name)
    for gm in (model.gm, fused.gm):
        plain = measure.prepare_graph(gm, "cpu", torch.float32, lean=False)
        lean_gm = measure.prepare_graph(gm, "cpu", torch.float32)
        with torch.inference_mode():
            assert torch.equal(_first(plain(*model.example_inputs)), _first(lean_gm(*model.example_inputs)))
        targets = {n.target for n in lean_gm.graph.nodes if n.op == "call_function"}
        assert not targets & set(lean.PUBLIC_BINDINGS), "an overload with a public binding is left"
        left = [n for n in lean_gm.graph.nodes if n.op == "call_function" and n.target in LOWERINGS]
        assert all("fused_bound" in n.meta for n in left), "a fused call was neither lowered nor handed its choice"
        assert all(n.target.startswith("_pin_") for n in lean_gm.graph.nodes if n.op == "get_attr")
        assert sum(p.numel() for p in lean_gm.parameters()) == sum(p.numel() for p in plain.parameters())
        del plain, lean_gm   # each a deep copy (BERT-base: 0.4 GB): two alive at a time, not four
        gc.collect()         # an fx GraphModule and its graph refer to each other


def _targets(gm):
    return [n.target for n in gm.graph.nodes if n.op == "call_function"]


@pytest.mark.skipif(not torch.backends.cudnn.is_available(), reason="this torch build has no cuDNN")
def test_cuda_specialisation_takes_cudnn_fused_calls():
    """On a CUDA device the generic targets take cuDNN's fused calls for ReLU; the lean graph names them."""
    model, det, fused = _fused("resnet50")
    gm = measure.prepare_graph(fused.gm, "cpu", torch.float16, lean=False)
    assert lean.specialize_fused_calls(gm, torch.device("cuda"), torch.float16) == 53
    targets = _targets(gm)
    assert targets.count(torch.cudnn_convolution_relu) == det.counts["conv_bn_act"] == 33
    assert targets.count(torch.cudnn_convolution_add_relu) == det.counts["conv_bn_add_act"] == 16
    # the folded projections: one 1×1 conv with stride 1 (a Triton GEMM with its bias), three with stride 2
    assert targets.count(conv.conv1x1_epilogue) == 1 and targets.count(conv.bias_act_) == 3
    assert targets.count(torch.conv2d) + targets.count(conv.conv1x1_epilogue) == det.counts["conv_bn"] == 4
    # The same graph for the CPU: conv, then add and ReLU in place, as the generic target does there.
    cpu = measure.prepare_graph(fused.gm, "cpu", torch.float32)
    assert torch.cudnn_convolution_relu not in _targets(cpu)
    assert _targets(cpu).count(torch.relu_) == 49


def test_cuda_specialisation_takes_the_triton_epilogue_for_other_activations():
    """ReLU6 has no cuDNN fused call. On CUDA a 1×1 conv runs as one Triton GEMM with its epilogue and a
    depthwise conv as one Triton kernel with its epilogue (where the input is channels_last); any other conv
    runs without its bias, then one Triton pass adds the bias and applies ReLU6. On the CPU: conv2d, then
    clamp_ in place."""
    model, det, fused = _fused("mobilenet_v2")
    graph = build_graph(model.gm, model.name)
    kernel = lambda c: (graph.nodes[c.roles[0][0]].get("groups", 1), graph.nodes[c.roles[0][0]]["kernel"])  # noqa
    depthwise = sum(1 for c in det.chains if kernel(c)[0] > 1)
    pointwise = sum(1 for c in det.chains if kernel(c) == (1, [1, 1]))
    gm = measure.prepare_graph(fused.gm, "cpu", torch.float16, lean=False)
    lean.specialize_fused_calls(gm, torch.device("cuda"), torch.float16)
    targets = _targets(gm)
    assert torch.cudnn_convolution_relu not in targets and torch.clamp_ not in targets
    assert targets.count(conv.depthwise_conv_epilogue) == depthwise == 17       # one per inverted residual block
    assert targets.count(conv.conv1x1_epilogue) == pointwise == 16 + 17 + 1      # expansions, projections, head
    assert targets.count(conv.bias_act_) == targets.count(torch.conv2d) == 1    # the stem (3×3, stride 2)
    cpu = _targets(measure.prepare_graph(fused.gm, "cpu", torch.float32))
    assert cpu.count(torch.clamp_) == sum(1 for c in det.chains if "relu6" in c.ops) > 0
    assert conv.bias_act_ not in cpu


class _MLP(torch.nn.Module):
    def __init__(self, act):
        super().__init__()
        self.fc = torch.nn.Linear(16, 24)
        self.act = act

    def forward(self, x):
        return self.act(self.fc(x))


@pytest.mark.parametrize("act, use_gelu", [(torch.nn.ReLU(), False), (torch.nn.Identity(), None)])
def test_cuda_specialisation_of_linear_epilogue(act, use_gelu, tmp_path):
    """linear+ReLU on CUDA → one ``_addmm_activation`` (cuBLASLt epilogue); it also runs on the CPU."""
    from explorer.sources import LoadedModel  # noqa: F401  (the zoo-free path below builds one)

    module = _MLP(act).eval()
    x = torch.randn(3, 5, 16)
    path = tmp_path / "mlp.pt2"
    torch.export.save(torch.export.export(module, (x,)), path)
    model = load_model(str(path))
    det = detect(build_graph(model.gm, model.name))
    fused = rewrite.apply_plan(model.gm, det, make_plan(det, "all"), "cpu", level="all")
    gm = measure.prepare_graph(fused.gm, "cpu", torch.float32, lean=False)
    lean.specialize_fused_calls(gm, torch.device("cuda"), torch.float32)
    addmm = [n for n in gm.graph.nodes if n.target is torch._addmm_activation]
    if use_gelu is None:
        assert not addmm  # no activation: no linear_act chain
        return
    assert len(addmm) == 1 and addmm[0].kwargs["use_gelu"] is use_gelu
    with torch.inference_mode():
        torch.testing.assert_close(gm(model.example_inputs[0]), module(model.example_inputs[0]))


def test_pinned_weights_follow_parameters_and_deepcopy():
    model, _, fused = _fused("conv_bn_relu")
    gm = measure.prepare_graph(fused.gm, "cpu", torch.float32)
    pinned = {k: v for k, v in gm.__dict__.items() if k.startswith("_pin_")}
    assert pinned
    params = {id(p) for p in gm.parameters()} | {id(b) for b in gm.buffers()}
    assert all(id(v) in params for v in pinned.values())  # the same objects, not copies
    twin = copy.deepcopy(gm)
    twin_params = {id(p) for p in twin.parameters()} | {id(b) for b in twin.buffers()}
    assert all(id(v) in twin_params for k, v in twin.__dict__.items() if k.startswith("_pin_"))
    with torch.inference_mode():
        assert torch.equal(twin(*model.example_inputs), gm(*model.example_inputs))


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device")
@pytest.mark.parametrize("name, dtype", [("residual_block", torch.float16), ("resnet50", torch.float16),
                                         ("bert_base", torch.float16), ("mobilenet_v2", torch.float32)])
def test_lean_graph_on_gpu(name, dtype):
    model, _, fused = _fused(name, batch=2, seq_len=32, device="cuda")
    x = measure.prepare_inputs(model.example_inputs, "cuda", dtype, False)
    plain = measure.prepare_graph(fused.gm, "cuda", dtype, lean=False)
    lean_gm = measure.prepare_graph(fused.gm, "cuda", dtype)
    if "conv" in name or name in ("resnet50", "residual_block"):
        assert torch.cudnn_convolution_relu in _targets(lean_gm)
    with torch.inference_mode():
        a, b = _first(plain(*x)).double(), _first(lean_gm(*x)).double()
    # The same kernels: equal up to nondeterministic algorithm choice inside the libraries.
    assert float((a - b).norm() / a.norm()) < 1e-3


def test_values_that_depend_on_no_input_are_computed_once_on_a_decoder():
    """The zoo decoder's rotary angles (arange → matmul → cat → cos/sin → casts) fold into two attributes;
    every output is bitwise what the unfolded graph computes, unfused and fused, in bf16 too."""
    model, _, fused = _fused("llama_decoder")
    for gm in (model.gm, fused.gm):
        for dtype in (torch.float32, torch.bfloat16):
            plain = measure.prepare_graph(gm, "cpu", dtype, lean=False)
            lean_gm = measure.prepare_graph(gm, "cpu", dtype)
            targets = [str(n.target) for n in lean_gm.graph.nodes if n.op in ("call_function", "call_method")]
            assert not [t for t in targets if "arange" in t or t.endswith(("cos.default", "sin.default"))], targets
            folded = [n.target for n in lean_gm.graph.nodes if n.op == "get_attr" and "_folded_" in n.target]
            assert len(folded) >= 2, folded
            inputs = measure.prepare_inputs(model.example_inputs, "cpu", dtype)
            with torch.inference_mode():
                assert torch.equal(_first(plain(*inputs)), _first(lean_gm(*inputs)))


def test_folding_leaves_inputs_randomness_writes_and_large_values_alone():
    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("big", torch.ones(64, 64))

        def forward(self, x):
            small = torch.arange(8, dtype=torch.float32).cos()            # folds
            noise = torch.rand(8)                                         # random: stays
            big = self.big * 2                                            # over the limit given below: stays
            return x + small + noise * 0, big + x.sum()

    gm = torch.export.export(M(), (torch.ones(8),)).module()
    n = lean.fold_constants(gm, max_bytes=1024)
    assert n == 1
    code = gm.code
    assert "aten.rand" in code and "aten.mul" in code and "aten.cos" not in code
    out, total = gm(torch.ones(8))
    assert torch.equal(out, 1 + torch.arange(8, dtype=torch.float32).cos())
    assert torch.equal(total, torch.full((64, 64), 2.0 + 8))


@pytest.mark.parametrize("lowered", [False, True], ids=["aten", "lowered"])
def test_a_constant_written_in_place_is_computed_at_every_call(lowered):
    """T5's relative-position buckets: ``buckets += torch.where(...)`` on a tensor made from constants only.
    Folded, the ``add_`` would add to the stored buckets at each call (the second indexed past T5's table);
    the written constant, and what it is made from (``view`` would write through to a folded base), stay
    computed, and every call returns what eager returns."""
    class M(torch.nn.Module):
        def forward(self, x):
            pos = torch.arange(6)
            buckets = (pos[None, :] - pos[:, None]).abs().view(36)
            buckets += torch.where(pos.repeat(6) > 2, 1, 0)                # in place, on a constant
            return x + buckets.view(6, 6).to(x.dtype), x * pos.cos()

    model = M()
    gm = torch.export.export(model, (torch.ones(6, 6),)).module()
    if lowered:
        lean.lower_aten_calls(gm)
    lean.fold_constants(gm)
    assert any("_folded_" in str(n.target) for n in gm.graph.nodes if n.op == "get_attr")   # pos.cos() folds
    x = torch.randn(6, 6)
    for _ in range(3):
        for got, want in zip(gm(x), model(x)):
            assert torch.equal(got, want)


@pytest.mark.parametrize("lowered", [False, True], ids=["aten", "lowered"])
def test_a_constant_only_detached_in_place_still_folds(lowered):
    """transformers' empty key/value cache: ``torch.tensor([]).detach_()`` at every forward. ``detach_`` changes
    autograd state, not values, so the constant folds (``pass_empty_cats`` finds the cat's operand empty only as a
    folded attribute); an ``add_`` in the same place keeps it computed (the test above)."""
    class M(torch.nn.Module):
        def forward(self, x):
            empty = torch.tensor([]).detach_()
            return torch.cat([empty, x], 0) * 2

    gm = torch.export.export(M(), (torch.ones(3, 2),)).module()
    if lowered:
        lean.lower_aten_calls(gm)
    assert lean.fold_constants(gm) >= 1
    assert not any(n.target in (aten.lift_fresh_copy.default, torch.tensor) for n in gm.graph.nodes)
    x = torch.randn(3, 2)
    assert torch.equal(gm(x), torch.cat([torch.tensor([]), x], 0) * 2)
