"""``explorer.rewrite``: applying a plan makes a new fused GraphModule that computes the same thing.

Every test runs on the CPU. Fused and original graphs run on the same seeded
inputs; tolerances are relative to the largest output magnitude:
float64 1e-9 (folding is computed in float64, the fused ops are the same
arithmetic reordered), float32 1e-4 (a folded conv rounds its weights once,
SDPA and the conv epilogue reorder sums).

The Triton kernels are tested in ``test_kernels.py`` (which may set
``TRITON_INTERPRET=1`` for the whole session); here the interpreter is turned
off so that the models run the plain CPU paths quickly, and the generic
fallback's ``torch.compile`` (a minute of inductor start-up on a small CPU) is
off except where stated.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import operator
import shutil

import pytest
import torch

from explorer.fusions import rewrite
from explorer.graph import aten as ops
from explorer.errors import PlanError
from explorer.fusion_engine import Chain, Detection, analyze, detect
from explorer.graph.build import build_graph
from explorer.fusions import conv, siblings
from explorer.fusions.plan import make_plan
from explorer.fusions.rewrite import LEVELS, AppliedChain, FusedModel, apply_plan, chain_module
from explorer.sources import LoadedModel, capture

F64_RTOL = 1e-9
F32_RTOL = 1e-4

slow = pytest.mark.slow


@pytest.fixture(autouse=True)
def _plain_cpu_paths(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    monkeypatch.setenv("EXPLORER_GENERIC_COMPILE", "0")


@functools.lru_cache(maxsize=None)   # for this file: tests/conftest.py clears it at the file's end
def _analysis(name: str, batch: int | None, seq_len: int | None):
    return analyze(name, batch=batch, seq_len=seq_len)


def _analyzed(name: str, batch: int | None = None, seq_len: int | None = None):
    model, _, detection = _analysis(name, batch, seq_len)
    return model, detection


def _outputs(gm: torch.nn.Module, inputs) -> tuple[torch.Tensor, ...]:
    with torch.no_grad():
        out = gm(*inputs)
    return tuple(out) if isinstance(out, (tuple, list)) else (out,)


def _assert_close(got, want, rtol: float) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype
        assert torch.isfinite(g).all()
        scale = w.abs().max().item()
        err = (g - w).abs().max().item()
        assert err <= rtol * scale, f"max |fused - original| = {err:.3g} > {rtol:g} * {scale:.3g}"


def _compute_ops(gm: torch.fx.GraphModule) -> int:
    """Call nodes that launch work: everything but views, getitems and ignored asserts."""
    return sum(1 for n in gm.graph.nodes if n.op == "call_function" and not ops.is_ignored(n)
               and ops.kind_of(n) not in ("view", "dropout"))


def _double(inputs):
    return tuple(t.double() if t.is_floating_point() else t for t in inputs)


def _as_double(model: LoadedModel) -> LoadedModel:
    return dataclasses.replace(model, gm=copy.deepcopy(model.gm).double(), example_inputs=_double(model.example_inputs))


def _check_model(name: str, batch: int | None = None, seq_len: int | None = None, f64: bool = True) -> FusedModel:
    model, detection = _analyzed(name, batch, seq_len)
    assert detection.chains, f"{name} should have fusible chains"
    code_before = model.gm.code
    ref = _outputs(model.gm, model.example_inputs)

    fused = apply_plan(model.gm, detection, make_plan(detection), level="all")

    assert [a.chain_id for a in fused.applied] == [c.id for c in detection.chains]
    assert all(a.status == "fused" for a in fused.applied), [a for a in fused.applied if a.status != "fused"]
    assert all(a.implementation for a in fused.applied)
    # the original is untouched: same code, same outputs
    assert model.gm.code == code_before
    _assert_close(_outputs(model.gm, model.example_inputs), ref, 0.0)
    # every chain's nodes are gone, and the compute ops dropped by the launches the chains save
    names = {n.name: n for n in fused.gm.graph.nodes}
    for chain in detection.chains:
        left = [n for n in chain.nodes if n in names and not str(names[n].target).startswith("<function fused_")]
        assert not left, f"{chain.id}: {left} still in the fused graph"
    saved = sum(c.launches_saved for c in detection.chains)
    baseline = copy.deepcopy(model.gm)
    baseline.graph.eliminate_dead_code()  # the rewrite also drops the original's dead nodes
    assert _compute_ops(fused.gm) == _compute_ops(baseline) - saved
    calls = lambda gm: sum(1 for n in gm.graph.nodes if n.op == "call_function")  # noqa: E731
    assert calls(fused.gm) < calls(model.gm)
    # float32
    _assert_close(_outputs(fused.gm, model.example_inputs), ref, F32_RTOL)
    # float64: the model converted first, then fused (so the fold is computed and kept in float64)
    if f64:
        model64 = _as_double(model)
        ref64 = _outputs(model64.gm, model64.example_inputs)
        got64 = _outputs(apply_plan(model64.gm, detection, make_plan(detection)).gm, model64.example_inputs)
        _assert_close(got64, ref64, F64_RTOL)
    return fused


# ---------------------------------------------------------------------- whole models

@pytest.mark.parametrize("name", ["conv_bn_relu", "residual_block", "transformer_block", "yolo_style",
                                  "mobilenet_v2"])
def test_all_chains_fused_outputs_match(name):
    _check_model(name, batch=2)


@slow
def test_resnet50_all_chains_fused_outputs_match():
    fused = _check_model("resnet50", batch=1)
    labels = {a.pattern: a.implementation for a in fused.applied}
    assert "folded" in labels["conv_bn_act"] and "cpu" in labels["conv_bn_act"]
    assert "add" in labels["conv_bn_add_act"]


@slow
def test_bert_base_all_chains_fused_fp32():
    fused = _check_model("bert_base", seq_len=16, f64=False)
    assert {a.pattern for a in fused.applied} == {"add_layer_norm", "matmul_softmax", "linear_act",
                                                  "linear_siblings"}
    # post-norm: nothing but the LayerNorm reads each sum, so the kernel is asked not to write it
    code = fused.gm.code
    direct = [a for a in fused.applied if a.pattern == "add_layer_norm" and not a.implementation.startswith("generic")]
    assert len(direct) >= 24 and code.count("fused_add_layer_norm_normed(") == len(direct)
    # the only tuple results are the Q/K/V column views of the 12 sibling GEMMs
    getitems = [n for n in fused.gm.graph.nodes if n.target is operator.getitem]
    assert len(getitems) == 36 and {n.args[0].target for n in getitems} == {siblings.fused_linear_siblings}


class _Heads(torch.nn.Module):
    """Q, K, V projections split into heads, or (``flat``) flattened by a view a column slice refuses."""

    def __init__(self, flat: bool = False) -> None:
        super().__init__()
        self.q, self.k, self.v = (torch.nn.Linear(32, 32) for _ in range(3))
        self.flat = flat

    def forward(self, x):
        b, s, _ = x.shape
        if self.flat:
            return self.q(x).view(-1) + self.k(x).view(-1) + self.v(x).view(-1)
        q, k, v = (p(x).view(b, s, 4, 8).transpose(1, 2) for p in (self.q, self.k, self.v))
        return torch.nn.functional.scaled_dot_product_attention(q, k, v)


def test_sibling_linears_become_one_gemm_of_column_views():
    x = torch.randn(3, 7, 32)
    gm = capture(_Heads().eval(), (x,), "heads")
    det = detect(build_graph(gm, "heads"))
    model = LoadedModel("heads", "pt2", gm, (x,), ["x"])
    fused = apply_plan(model.gm, det, make_plan(det, "all"), level="all")
    [applied] = [a for a in fused.applied if a.pattern == "linear_siblings"]
    assert applied.status == "fused" and "32+32+32 columns" in applied.implementation
    calls = [n for n in fused.gm.graph.nodes if n.target is siblings.fused_linear_siblings]
    assert len(calls) == 1 and not [n for n in fused.gm.graph.nodes if ops.aten_name(n) == "linear"]
    weight = getattr(fused.gm, calls[0].args[1].target)
    assert weight.shape == (96, 32)
    _assert_close(_outputs(fused.gm, (x,)), _outputs(gm, (x,)), F32_RTOL)
    # the three separate weights are gone from the fused copy; the original keeps them
    assert sum(p.numel() for p in fused.gm.parameters()) + sum(b.numel() for b in fused.gm.buffers()) == \
        sum(p.numel() for p in gm.parameters()) + sum(b.numel() for b in gm.buffers())
    unfused_c, fused_c, inputs = chain_module(model.gm, det, applied.chain_id)
    _assert_close(_outputs(fused_c, inputs), _outputs(unfused_c, inputs), F32_RTOL)


def test_sibling_linears_refused_when_a_view_needs_a_copy():
    x = torch.randn(3, 7, 32)
    gm = capture(_Heads(flat=True).eval(), (x,), "flat_heads")
    det = detect(build_graph(gm, "flat_heads"))
    model = LoadedModel("flat_heads", "pt2", gm, (x,), ["x"])
    fused = apply_plan(model.gm, det, make_plan(det, "all"), level="all")
    [applied] = [a for a in fused.applied if a.pattern == "linear_siblings"]
    assert applied.status == "refused" and "column slice does not allow" in applied.reason
    _assert_close(_outputs(fused.gm, (x,)), _outputs(gm, (x,)), 0.0)


def test_labels_are_honest_about_cpu():
    model, detection = _analyzed("transformer_block", batch=2)
    fused = apply_plan(model.gm, detection, make_plan(detection), "cpu")
    by_pattern = {a.pattern: a.implementation for a in fused.applied}
    assert "reference composition" in by_pattern["add_layer_norm"]
    assert "cpu" in by_pattern["linear_act"] and "2 kernels" in by_pattern["linear_act"]
    assert "scaled_dot_product_attention" in by_pattern["matmul_softmax"]
    code = fused.gm.code
    for fn in ("fused_attention", "fused_add_layer_norm", "fused_linear_act"):
        assert fn in code


def test_channels_last_inputs():
    model, detection = _analyzed("residual_block", batch=2)
    fused = apply_plan(model.gm, detection, make_plan(detection, memory_format="channels_last"))
    ref = _outputs(model.gm, model.example_inputs)
    gm = copy.deepcopy(fused.gm).to(memory_format=torch.channels_last)
    x = tuple(t.contiguous(memory_format=torch.channels_last) for t in model.example_inputs)
    _assert_close(_outputs(gm, x), ref, F32_RTOL)


# ---------------------------------------------------------------------- levels

def _kinds(gm: torch.fx.GraphModule) -> list[str]:
    return [ops.kind_of(n) for n in gm.graph.nodes if n.op == "call_function"]


def test_levels_on_residual_block():
    model, detection = _analyzed("residual_block", batch=2)
    plan = make_plan(detection)
    ref = _outputs(model.gm, model.example_inputs)
    before = _kinds(model.gm)
    assert before.count("batch_norm") == 2 and before.count("relu") == 2

    none = apply_plan(model.gm, detection, plan, level="none")
    assert none.gm.code == model.gm.code
    assert all(a.status == "refused" and "none" in a.reason for a in none.applied)
    _assert_close(_outputs(none.gm, model.example_inputs), ref, 0.0)

    conv_bn = apply_plan(model.gm, detection, plan, level="conv_bn")
    kinds = _kinds(conv_bn.gm)
    assert "batch_norm" not in kinds and kinds.count("relu") == 2 and kinds.count("add") == 1
    assert all(a.status == "fused" and "folded" in a.implementation for a in conv_bn.applied)
    _assert_close(_outputs(conv_bn.gm, model.example_inputs), ref, F32_RTOL)

    activation = apply_plan(model.gm, detection, plan, level="activation")
    kinds = _kinds(activation.gm)
    assert "batch_norm" not in kinds and "relu" not in kinds and "add" not in kinds
    _assert_close(_outputs(activation.gm, model.example_inputs), ref, F32_RTOL)

    with pytest.raises(PlanError):
        apply_plan(model.gm, detection, plan, level="everything")
    assert LEVELS == ("none", "conv_bn", "activation", "all")


def test_activation_level_leaves_transformer_chains_alone():
    model, detection = _analyzed("transformer_block", batch=2)
    fused = apply_plan(model.gm, detection, make_plan(detection), level="activation")
    status = {a.pattern: a.status for a in fused.applied}
    assert status == {"linear_act": "fused", "matmul_softmax": "refused", "add_layer_norm": "refused"}
    kinds = _kinds(fused.gm)
    assert "softmax" in kinds and "layer_norm" in kinds and "gelu" not in kinds
    _assert_close(_outputs(fused.gm, model.example_inputs), _outputs(model.gm, model.example_inputs), F32_RTOL)


# ---------------------------------------------------------------------- failures and refusals

def test_one_failing_chain_leaves_the_others_fused(monkeypatch):
    model, detection = _analyzed("residual_block", batch=2)
    real_select = conv.select_conv_epilogue

    def select(device, dtype, act, residual=False, **kw):  # the conv+add kernel "breaks"
        if residual:
            raise RuntimeError("conv+add kernel unavailable\nsecond line")
        return real_select(device, dtype, act, residual=residual, **kw)

    monkeypatch.setattr(conv, "select_conv_epilogue", select)
    fused = apply_plan(model.gm, detection, make_plan(detection))
    status = {a.pattern: a for a in fused.applied}
    assert status["conv_bn_add_act"].status == "failed"
    assert "conv+add kernel unavailable" in status["conv_bn_add_act"].reason
    assert "\n" not in status["conv_bn_add_act"].reason
    assert status["conv_bn_act"].status == "fused"
    kinds = _kinds(fused.gm)
    assert kinds.count("batch_norm") == 1 and kinds.count("add") == 1
    _assert_close(_outputs(fused.gm, model.example_inputs), _outputs(model.gm, model.example_inputs), F32_RTOL)


class _ConvBnReluTrain(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(8)

    def forward(self, x):
        return torch.relu(self.bn(self.conv(x)))


def test_training_mode_batch_norm_is_not_folded():
    torch.manual_seed(0)
    x = torch.randn(2, 3, 9, 7)
    gm = capture(_ConvBnReluTrain().train(), (x,), "train_bn")
    model = LoadedModel("train_bn", "zoo", gm, (x,), ["x"])
    detection = detect(build_graph(gm, "train_bn"))
    # detection already refuses it, with the reason
    assert not detection.chains
    assert any("training" in m.reason for m in detection.near_misses)
    # and the rewrite refuses it too when handed such a chain anyway
    chain = Chain(id="conv_bn_act@conv2d", pattern="conv_bn_act", ops=("conv", "batch_norm", "relu"),
                  nodes=("conv2d", "batch_norm", "relu"), names=("conv", "bn", "relu"),
                  roles=(("conv2d", "conv"), ("batch_norm", "bn"), ("relu", "act")),
                  bytes_saved=0, launches_saved=2)
    forged = dataclasses.replace(detection, chains=(chain,))
    fused = apply_plan(model.gm, forged, make_plan(forged))
    assert fused.applied == (AppliedChain(chain.id, "conv_bn_act", fused.applied[0].implementation, "refused",
                                          conv.TRAINING_REFUSAL),)
    assert "batch_norm" in _kinds(fused.gm)


def test_plan_for_another_model_raises():
    model, detection = _analyzed("residual_block", batch=2)
    _, other = _analyzed("conv_bn_relu", batch=2)
    with pytest.raises(PlanError, match="made for model"):
        apply_plan(model.gm, detection, make_plan(other))


class _BadSoftmax(torch.nn.Module):
    def forward(self, q, k, v):
        return torch.softmax(q @ k.transpose(-2, -1) * 0.5, dim=-2) @ v


def test_softmax_not_over_last_dim_is_refused():
    q, k, v = (torch.randn(2, 3, 5, 4) for _ in range(3))
    gm = capture(_BadSoftmax(), (q, k, v), "bad_softmax")
    model = LoadedModel("bad_softmax", "zoo", gm, (q, k, v), ["q", "k", "v"])
    detection = detect(build_graph(gm, "bad_softmax"))
    assert [c.pattern for c in detection.chains] == ["matmul_softmax"]
    fused = apply_plan(model.gm, detection, make_plan(detection))
    assert fused.applied[0].status == "refused" and "dim" in fused.applied[0].reason
    _assert_close(_outputs(fused.gm, (q, k, v)), _outputs(gm, (q, k, v)), 0.0)


# ---------------------------------------------------------------------- extra outputs, generic fallback

class _PreNormResidual(torch.nn.Module):
    """The sum of the add is needed after the LayerNorm: an extra output of the fused kernel."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = torch.nn.LayerNorm(24)
        self.fc = torch.nn.Linear(24, 24)

    def forward(self, x, y):
        s = x + y
        return s + self.fc(self.norm(s))


def test_add_layer_norm_keeps_the_sum_as_extra_output():
    x, y = torch.randn(2, 7, 24), torch.randn(2, 7, 24)
    gm = capture(_PreNormResidual(), (x, y), "prenorm")
    model = LoadedModel("prenorm", "zoo", gm, (x, y), ["x", "y"])
    detection = detect(build_graph(gm, "prenorm"))
    chain = next(c for c in detection.chains if c.pattern == "add_layer_norm")
    assert chain.extra_outputs == ("add",)
    fused = apply_plan(model.gm, detection, make_plan(detection))
    assert all(a.status == "fused" for a in fused.applied)
    assert "getitem" in fused.gm.code
    _assert_close(_outputs(fused.gm, (x, y)), _outputs(gm, (x, y)), F32_RTOL)
    model64 = _as_double(model)
    ref64 = _outputs(model64.gm, model64.example_inputs)
    got64 = _outputs(apply_plan(model64.gm, detection, make_plan(detection)).gm, model64.example_inputs)
    _assert_close(got64, ref64, F64_RTOL)


class _Embeddings(torch.nn.Module):
    """BERT's embeddings: a position table broadcast over the batch, added first, then LayerNorm."""

    def __init__(self) -> None:
        super().__init__()
        self.pos = torch.nn.Parameter(torch.randn(1, 7, 24))
        self.norm = torch.nn.LayerNorm(24)

    def forward(self, x):
        return self.norm(self.pos + x)          # the broadcast operand first: the rewrite swaps them


def test_add_layer_norm_with_a_residual_broadcast_over_the_batch():
    x = torch.randn(3, 7, 24)
    gm = capture(_Embeddings(), (x,), "embeddings")
    model = LoadedModel("embeddings", "zoo", gm, (x,), ["x"])
    detection = detect(build_graph(gm, "embeddings"))
    assert [c.pattern for c in detection.chains] == ["add_layer_norm"]
    fused = apply_plan(model.gm, detection, make_plan(detection))
    applied = fused.applied[0]
    assert applied.status == "fused" and not applied.implementation.startswith("generic"), applied
    assert "fused_add_layer_norm_normed" in fused.gm.code
    _assert_close(_outputs(fused.gm, (x,)), _outputs(gm, (x,)), F32_RTOL)
    model64 = _as_double(model)
    got64 = _outputs(apply_plan(model64.gm, detection, make_plan(detection)).gm, model64.example_inputs)
    _assert_close(got64, _outputs(model64.gm, model64.example_inputs), F64_RTOL)


def test_kernel_choices_change_the_implementation_not_the_result():
    """A plan's kernel choice picks the chain's implementation: the separate epilogue (conv with its
    bias, then add and activation in place) or inductor, and the model still computes the same."""
    model, detection = _analyzed("residual_block", batch=2)
    by_pattern = {c.pattern: c.id for c in detection.chains}
    conv, res = by_pattern["conv_bn_act"], by_pattern["conv_bn_add_act"]
    plan = make_plan(detection, kernels={conv: "separate_epilogue", res: "inductor"})
    fused = apply_plan(model.gm, detection, plan)
    applied = fused.by_id()
    assert applied[conv].kernel == "separate_epilogue" and "kernel choice: separate epilogue" in \
        applied[conv].implementation and applied[conv].status == "fused"
    assert applied[res].kernel == "inductor" and applied[res].implementation.startswith("generic") and \
        "kernel choice: inductor" in applied[res].implementation
    code = fused.gm.code
    assert "fused_conv_separate_epilogue" in code and "fused_subgraph" in code and "fused_conv_bn_act(" not in code
    _assert_close(_outputs(fused.gm, model.example_inputs), _outputs(model.gm, model.example_inputs), F32_RTOL)
    # the chain alone, as the runner times it, takes the same choice
    _, alone, _ = chain_module(model.gm, detection, conv, kernel="separate_epilogue")
    assert "fused_conv_separate_epilogue" in alone.code
    # a level's fold mode folds BatchNorm whatever the choice
    staged = apply_plan(model.gm, detection, plan, level="conv_bn")
    assert "fused_conv_bn(" in staged.gm.code and "fused_subgraph" not in staged.gm.code


def test_linear_separate_epilogue_choice():
    model, detection = _analyzed("transformer_block", batch=2)
    lin = next(c.id for c in detection.chains if c.pattern == "linear_act")
    fused = apply_plan(model.gm, detection, make_plan(detection, kernels={lin: "separate_epilogue"}))
    assert "fused_linear_separate_epilogue" in fused.gm.code
    assert fused.by_id()[lin].implementation == "linear + gelu in place (2 kernels); kernel choice: separate epilogue"
    _assert_close(_outputs(fused.gm, model.example_inputs), _outputs(model.gm, model.example_inputs), F32_RTOL)


class _Pointwise(torch.nn.Module):
    def forward(self, x, y):
        return torch.sigmoid(torch.relu(x * 2 + y))


def test_elementwise_chain_uses_the_generic_fallback():
    x, y = torch.randn(3, 5), torch.randn(3, 5)
    gm = capture(_Pointwise(), (x, y), "pointwise")
    model = LoadedModel("pointwise", "zoo", gm, (x, y), ["x", "y"])
    detection = detect(build_graph(gm, "pointwise"))
    assert [c.pattern for c in detection.chains] == ["elementwise_chain"]
    fused = apply_plan(model.gm, detection, make_plan(detection))
    applied = fused.applied[0]
    assert applied.status == "fused"
    assert applied.implementation.startswith("generic: torch.compile's inductor on the chain subgraph")
    assert "eagerly" in applied.implementation  # compiling is off in these tests, and the label says so
    assert "fused_subgraph" in fused.gm.code
    _assert_close(_outputs(fused.gm, (x, y)), _outputs(gm, (x, y)), 0.0)


@pytest.mark.skipif(shutil.which("g++") is None and shutil.which("c++") is None,
                    reason="inductor's CPU backend needs a C++ compiler")
def test_generic_fallback_compiles_and_respecialises(monkeypatch):
    """With compiling on, the chain runs inductor's code (not the eager ops), agrees with the
    unfused graph, and a call with other shapes or strides compiles another version instead
    of reusing one specialised for the first."""
    monkeypatch.setenv("EXPLORER_GENERIC_COMPILE", "1")
    x, y = torch.randn(3, 5), torch.randn(3, 5)
    gm = capture(_Pointwise(), (x, y), "pointwise")
    model = LoadedModel("pointwise", "zoo", gm, (x, y), ["x", "y"])
    detection = detect(build_graph(gm, "pointwise"))
    fused = apply_plan(model.gm, detection, make_plan(detection))
    assert "eagerly" not in fused.applied[0].implementation
    chain = next(m for m in fused.gm.modules() if type(m).__name__ == "CompiledChain")
    eager_calls = []
    monkeypatch.setattr(chain.sub, "forward", lambda *a: eager_calls.append(a) or (_ for _ in ()).throw(
        AssertionError("the eager subgraph ran")))
    for shape, transpose in (((3, 5), False), ((3, 5), False), ((4, 6), False), ((6, 4), True)):
        a, b = torch.randn(shape), torch.randn(shape)
        if transpose:  # same shape as a compiled call, other strides
            a, b = a.t(), b.t()
        _assert_close(_outputs(fused.gm, (a, b)), _outputs(gm, (a, b)), F32_RTOL)
    assert chain.mode == "compiled" and not eager_calls
    assert len(chain._compiled) == 3          # (3,5) once, (4,6), (4,6) transposed


# ---------------------------------------------------------------------- chain_module

@pytest.mark.parametrize("name,pattern", [("conv_bn_relu", "conv_bn_act"),
                                          ("residual_block", "conv_bn_add_act"),
                                          ("transformer_block", "add_layer_norm"),
                                          ("transformer_block", "matmul_softmax"),
                                          ("transformer_block", "linear_act")])
def test_chain_module_fused_matches_unfused(name, pattern):
    model, detection = _analyzed(name, batch=2)
    chain = next(c for c in detection.chains if c.pattern == pattern)
    unfused, fused, inputs = chain_module(model.gm, detection, chain.id)
    assert all(isinstance(t, torch.Tensor) for t in inputs)
    placeholders = [n for n in unfused.graph.nodes if n.op == "placeholder"]
    assert len(placeholders) == len(inputs)
    by_name = {n.name: n for n in model.gm.graph.nodes}
    for ph, t in zip(placeholders, inputs):  # the chain's real shapes and dtypes
        val = by_name[ph.name].meta["val"]
        assert tuple(t.shape) == tuple(val.shape) and t.dtype == val.dtype
    assert _compute_ops(fused) == 1
    assert _compute_ops(unfused) == len(chain.roles)
    _assert_close(_outputs(fused, inputs), _outputs(unfused, inputs), F32_RTOL)
    # the model itself is untouched
    assert {n.name for n in model.gm.graph.nodes} >= set(chain.nodes)


def test_chain_module_unknown_chain():
    model, detection = _analyzed("conv_bn_relu", batch=2)
    with pytest.raises(KeyError):
        chain_module(model.gm, detection, "conv_bn_act@nowhere")


def test_add_layer_norm_through_the_triton_interpreter(monkeypatch):
    pytest.importorskip("triton")
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # the Triton kernel itself, run by the interpreter
    model, detection = _analyzed("transformer_block", batch=2)
    fused = apply_plan(model.gm, detection, make_plan(detection, accept="add_layer_norm"))
    assert [a.status for a in fused.applied] == ["fused", "fused"]
    assert all(a.implementation.startswith("triton add+layer") and "interpreter" in a.implementation
               for a in fused.applied)
    _assert_close(_outputs(fused.gm, model.example_inputs), _outputs(model.gm, model.example_inputs), F32_RTOL)


class _ScoresOnly(torch.nn.Module):
    """MatMul+Softmax without the second MatMul (scores returned), with a divide and a mask."""

    def forward(self, q, k, mask):
        return torch.softmax(q @ k.transpose(-2, -1) / 3.0 + mask, dim=-1)


def test_matmul_softmax_without_context():
    q, k = torch.randn(2, 3, 5, 4), torch.randn(2, 3, 7, 4)
    mask = torch.zeros(2, 1, 1, 7)
    mask[0, ..., -2:] = float("-inf")
    gm = capture(_ScoresOnly(), (q, k, mask), "scores_only")
    model = LoadedModel("scores_only", "zoo", gm, (q, k, mask), ["q", "k", "mask"])
    detection = detect(build_graph(gm, "scores_only"))
    assert [c.ops for c in detection.chains] == [("matmul", "div", "add", "softmax")]
    fused = apply_plan(model.gm, detection, make_plan(detection))
    assert fused.applied[0].status == "fused" and "fused_matmul_softmax" in fused.gm.code
    assert "softmax" in fused.applied[0].implementation
    _assert_close(_outputs(fused.gm, (q, k, mask)), _outputs(gm, (q, k, mask)), F32_RTOL)
