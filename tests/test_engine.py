"""The engine: zoo capture, the annotated graph, pattern detection and near misses."""

from __future__ import annotations

import collections
import json
import os
import subprocess
import sys

import pytest
import torch
from torch import nn

from explorer import fusion_engine
from explorer.errors import ModelLoadError, PlanError
from explorer.fusion_engine import detect
from explorer.fusions import BY_NAME, PATTERNS
from explorer.fusions.base import KERNEL_CHOICES
from explorer.fusions.plan import Plan, make_plan
from explorer.graph.build import build_graph
from explorer.graph.synthetic import residual_cnn_graph
from explorer.sources import capture, zoo


def _detect_module(module: nn.Module, *inputs: torch.Tensor):
    gm = capture(module.eval(), inputs, type(module).__name__)
    g = build_graph(gm, type(module).__name__)
    return g, detect(g)


def _assert_disjoint(det) -> None:
    seen = collections.Counter(n for c in det.chains for n in c.nodes)
    assert not [n for n, k in seen.items() if k > 1], "a node is in two chains"


def test_resnet50_every_conv_in_exactly_one_chain(analyze_cached):
    _, g, det = analyze_cached("resnet50")
    convs = [n for n, k in g.nodes(data="kind") if k == "conv"]
    assert len(convs) == 53
    owner = det.node_to_chain()
    assert all(c in owner for c in convs)
    assert collections.Counter(owner[c] for c in convs).most_common(1)[0][1] == 1
    counts = det.counts
    assert counts["conv_bn_act"] == 33
    assert counts["conv_bn_add_act"] == 16
    assert counts["conv_bn"] == 4
    assert all(c.ops == ("conv", "batch_norm", "relu") for c in det.chains if c.pattern == "conv_bn_act")
    assert all(c.ops == ("conv", "batch_norm", "add", "relu") for c in det.chains if c.pattern == "conv_bn_add_act")
    _assert_disjoint(det)


def test_resnet50_chain_fields(analyze_cached):
    _, g, det = analyze_cached("resnet50")
    chain = det.chains[0]
    assert chain.id == "conv_bn_act@conv2d" and chain.names == ("conv1", "bn1", "relu")
    # conv and bn outputs (1x64x112x112 fp32) are each written once and read back once.
    assert chain.bytes_saved == 2 * 2 * 64 * 112 * 112 * 4
    assert chain.launches_saved == 2
    d = det.to_dict()
    assert set(d["chains"][0]) >= {"id", "pattern", "ops", "nodes", "names", "bytes_saved", "launches_saved"}
    assert d["nodes"] == g.number_of_nodes()


@pytest.mark.slow
def test_bert_base_counts(analyze_cached):
    _, g, det = analyze_cached("bert_base", None, 64)
    counts = det.counts
    assert counts["add_layer_norm"] == 25
    assert counts["matmul_softmax"] == 12
    gelu = [c for c in det.chains if c.pattern == "linear_act" and c.ops[-1] == "gelu"]
    assert len(gelu) == 12
    attention = [c for c in det.chains if c.pattern == "matmul_softmax"][0]
    assert attention.ops == ("matmul", "mul", "add", "softmax", "matmul")
    qkv = [c for c in det.chains if c.pattern == "linear_siblings"]
    assert len(qkv) == 12 and all(c.ops == ("linear",) * 3 for c in qkv)
    assert [n.rsplit(".", 1)[-1] for n in qkv[0].names] == ["query", "key", "value"]
    assert qkv[0].ops_text == "linear ∥ linear ∥ linear" and qkv[0].outputs == qkv[0].compute_nodes
    # the shared input (B, 64, 768) fp32 is read once instead of three times; two launches go
    x = g.nodes[qkv[0].compute_nodes[0]]["first_input"]
    assert g.nodes[x]["shapes"][0][1:] == [64, 768]
    x_bytes = 4 * 64 * 768 * g.nodes[x]["shapes"][0][0]
    assert qkv[0].bytes_saved == 2 * x_bytes and qkv[0].launches_saved == 2
    _assert_disjoint(det)


def test_graph_node_attributes(analyze_cached):
    _, g, _ = analyze_cached("conv_bn_relu")
    conv = g.nodes["conv2d"]
    assert conv["kind"] == "conv" and conv["origin"] == "conv"
    assert conv["shapes"] == [[1, 16, 32, 32]] and conv["dtypes"] == ["float32"]
    # reads input (1x3x32x32) and weight (16x3x3x3), writes 1x16x32x32, all fp32
    assert conv["bytes_read"] == (3 * 32 * 32 + 16 * 3 * 3 * 3) * 4
    assert conv["bytes_written"] == 16 * 32 * 32 * 4
    assert conv["flops"] == 2 * 16 * 32 * 32 * 27
    assert g.graph["params"] == 16 * 27 + 4 * 16  # conv weight + BN weight, bias, mean, var
    assert g.graph["nodes"] == 5 and g.graph["launches"] == 3


@pytest.mark.parametrize("name", [e.name for e in zoo.ZOO.values() if e.name not in ("bert_large",) and not e.large])
def test_every_zoo_model_loads_captures_detects(analyze_cached, name):
    seq = 32 if zoo.ZOO[name].inputs.seq_len else None
    model, g, det = analyze_cached(name, None, seq)
    assert g.number_of_nodes() > 3 and det.chains, f"{name}: no chains"
    assert model.gm is not None and model.example_inputs
    _assert_disjoint(det)
    assert set(det.counts) == {p.name for p in PATTERNS}


@pytest.mark.slow
@pytest.mark.duplicate  # BERT-base's test at 24 layers: make test-all (docs/test-suite.md)
def test_bert_large_captures(analyze_cached):
    _, _, det = analyze_cached("bert_large", 1, 32)
    assert det.counts["add_layer_norm"] == 49 and det.counts["matmul_softmax"] == 24


def test_vit_reports_sdpa_as_already_fused_and_keeps_residual_sum(analyze_cached):
    _, _, det = analyze_cached("vit_b_16")
    reasons = [m.reason for m in det.near_misses if m.pattern == "matmul_softmax"]
    assert len(reasons) == 12 and all("already fused (scaled_dot_product_attention)" in r for r in reasons)
    # pre-norm residual stream: the sum feeds the next residual add, so it is an extra output.
    # 2 per block, and the position embedding's add, whose sum reaches ln_1 and the residual through an eval-mode
    # dropout (issue 20)
    add_ln = [c for c in det.chains if c.pattern == "add_layer_norm"]
    assert len(add_ln) == 25
    # all but the last sum (which only the final LayerNorm reads) are kept for the next residual add
    assert sum(bool(c.extra_outputs) for c in add_ln) == 24


class _TwoConsumers(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)

    def forward(self, x):
        y = self.conv(x)
        return torch.relu(self.bn(y)), y * 2


class _LeakyBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3)
        self.bn = nn.BatchNorm2d(8)
        self.act = nn.LeakyReLU(0.1)

    def forward(self, x):
        return self.act(self.bn(self.conv(x)))


def test_near_miss_conv_output_has_two_consumers():
    _, det = _detect_module(_TwoConsumers(), torch.randn(1, 3, 8, 8))
    assert not [c for c in det.chains if "conv" in c.ops]
    assert any(m.reason == "conv output has 2 consumers" for m in det.near_misses)


def test_near_miss_unsupported_activation_then_shorter_chain():
    _, det = _detect_module(_LeakyBlock(), torch.randn(1, 3, 8, 8))
    assert [c.pattern for c in det.chains] == ["conv_bn"]
    assert any("activation leaky_relu not supported" in m.reason for m in det.near_misses)


class _Projections(nn.Module):
    """Three projections of one input; ``bias_mismatch``: one without a bias."""

    def __init__(self, bias_mismatch: bool = False) -> None:
        super().__init__()
        self.q = nn.Linear(16, 8)
        self.k = nn.Linear(16, 8, bias=not bias_mismatch)
        self.v = nn.Linear(16, 12)

    def forward(self, x):
        return self.q(x) * 2, self.k(x) + 1, self.v(x).relu()


def test_sibling_linears_one_group_with_an_activation_claimed_first():
    """v's linear+ReLU is claimed by linear_act (registry order); q and k are the sibling group."""
    _, det = _detect_module(_Projections(), torch.randn(2, 5, 16))
    by = {c.pattern: c for c in det.chains}
    assert set(by) == {"linear_act", "linear_siblings"}
    assert [n.rsplit(".", 1)[-1] for n in by["linear_siblings"].names] == ["q", "k"]
    _assert_disjoint(det)


def test_sibling_linears_near_miss_when_biases_differ():
    _, det = _detect_module(_Projections(bias_mismatch=True), torch.randn(2, 5, 16))
    assert "linear_siblings" not in {c.pattern for c in det.chains}
    assert any(m.pattern == "linear_siblings" and "some have a bias" in m.reason for m in det.near_misses)


def test_near_miss_batchnorm_in_training_mode():
    module = zoo.get_entry("conv_bn_relu").build().train()
    gm = torch.export.export(module, (torch.randn(2, 3, 8, 8),)).module()
    g = build_graph(gm, "train")
    det = detect(g)
    assert not det.chains
    assert any("BatchNorm in training mode" in m.reason for m in det.near_misses)


_DETECT_IN_A_PROCESS = """
import json, sys
from explorer.fusion_engine import analyze
print(json.dumps(analyze(sys.argv[1]).detection.to_dict(), sort_keys=True))
"""


def test_detection_is_the_same_in_other_processes():
    """Chain ids, order, near misses and fingerprint do not depend on the process (hash seeds, set
    order): a plan saved in one session must fit the model loaded in another."""
    outs = []
    for seed in ("1", "2"):
        proc = subprocess.run([sys.executable, "-c", _DETECT_IN_A_PROCESS, "yolo_style"], capture_output=True,
                              text=True, timeout=300, env={**os.environ, "PYTHONHASHSEED": seed})
        assert proc.returncode == 0, proc.stderr[-2000:]
        outs.append(proc.stdout)
    assert outs[0] == outs[1] and json.loads(outs[0])["chains"]


def test_detection_work_grows_linearly_with_the_graph(monkeypatch):
    """Each anchor is tried once per pattern and a match is a few steps long: the matcher's node
    visits (calls of ``_successors``) grow linearly with the graph, counted, not timed."""
    visits = {"n": 0}
    real = fusion_engine._successors

    def counting(g, node):
        visits["n"] += 1
        return real(g, node)

    monkeypatch.setattr(fusion_engine, "_successors", counting)
    per_block = {}
    for blocks in (10, 1000):
        visits["n"] = 0
        det = detect(residual_cnn_graph(blocks))
        assert det.counts["conv_bn_act"] == blocks and det.counts["conv_bn_add_act"] == blocks
        per_block[blocks] = visits["n"] / blocks
    assert per_block[1000] <= 1.05 * per_block[10], per_block


def test_no_module_outside_the_registry_spells_a_pattern_name():
    """The registry is the single source of pattern names: views, the CLI and the runtime read them
    from it (a stage name that happens to equal a pattern name is not a pattern name)."""
    import ast
    from pathlib import Path

    from explorer.fusions.base import STAGES

    root = Path(__file__).resolve().parents[1] / "explorer"
    spelled = []
    for path in root.rglob("*.py"):
        if "fusions" in path.relative_to(root).parts:   # the families and their kernels own their names
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and node.value in BY_NAME and node.value not in STAGES:
                spelled.append(f"{path.relative_to(root)}:{node.lineno} {node.value}")
    assert not spelled, spelled
    for p in PATTERNS:
        assert p.label and p.explanation and p.implementation and p.color.startswith("#")
        assert p.rewrite is not None, f"{p.name} has no rewrite"


def test_plan_roundtrip_and_refusal(analyze_cached):
    _, _, det = analyze_cached("residual_block")
    _, _, other = analyze_cached("conv_bn_relu")
    first = det.chains[0].id
    plan = make_plan(det, accept="all", reject=[first])
    assert first not in plan.accepted and len(plan.accepted) == len(det.chains) - 1
    again = Plan.from_json(plan.to_json())
    assert again == plan
    again.check_for(det)
    with pytest.raises(PlanError, match="made for model 'residual_block'"):
        plan.check_for(other)
    with pytest.raises(PlanError, match="unknown pattern"):
        make_plan(det, accept="conv_bn_actt")
    assert make_plan(det, accept="none").accepted == ()
    assert make_plan(det, accept="conv_bn_act").accepted == (first,)


def test_plan_kernel_choices_are_checked(analyze_cached):
    """A plan's per-chain kernel choice must name a chain of the model and a choice of its pattern,
    whether the plan is made here or read back from JSON."""
    _, _, det = analyze_cached("residual_block")
    conv = next(c.id for c in det.chains if c.pattern == "conv_bn_act")
    plan = make_plan(det, kernels={conv: "separate_epilogue", det.chains[-1].id: "auto"})
    assert plan.kernels == {conv: "separate_epilogue"}                     # "auto" is the default: not stored
    assert plan.kernel_for(conv) == "separate_epilogue" and plan.kernel_for(det.chains[-1].id) == "auto"
    assert Plan.from_json(plan.to_json()) == plan
    with pytest.raises(PlanError, match="unknown chain"):
        make_plan(det, kernels={"conv_bn_act@nowhere": "auto"})
    with pytest.raises(PlanError, match="'triton' is not a choice .* auto, separate_epilogue, inductor"):
        make_plan(det, kernels={conv: "triton"})
    edited = json.loads(plan.to_json())
    edited["kernels"] = {conv: "cudnn_please"}
    with pytest.raises(PlanError, match="not a choice"):
        Plan.from_json(json.dumps(edited)).check_for(det)
    assert all(set(p.kernels) <= set(KERNEL_CHOICES) and p.kernels[0] == "auto" for p in PATTERNS)


def test_same_model_other_batch_keeps_fingerprint(analyze_cached):
    _, g1, _ = analyze_cached("residual_block")
    _, g2, _ = analyze_cached("residual_block", 4)
    assert g1.graph["fingerprint"] == g2.graph["fingerprint"]


def test_unknown_zoo_name_is_one_line():
    with pytest.raises(ModelLoadError) as err:
        zoo.get_entry("resnet51")
    assert "\n" not in str(err.value) and "unknown model 'resnet51'" in str(err.value)


def test_sequence_length_limit():
    with pytest.raises(ModelLoadError, match="exceeds"):
        zoo.get_entry("bert_base").example_inputs(1, 100000)


def test_training_batchnorm_is_reported_under_the_pattern_it_would_have_been():
    module = zoo.get_entry("conv_bn_relu").build().train()
    gm = torch.export.export(module, (torch.randn(2, 3, 8, 8),)).module()
    det = detect(build_graph(gm, "train"))
    patterns = {m.pattern for m in det.near_misses if "training mode" in m.reason}
    assert patterns == {"conv_bn_act"}
