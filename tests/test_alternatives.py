"""Competing fusions: detection records the other ways to fuse a chain's nodes, and a plan may choose one.

Derived from the architectures: every ResNet-50 bottleneck ends in conv3 → bn3 → add → relu, one
Conv+BN+Add+ReLU chain each (3 + 4 + 6 + 3 = 16), and each has the alternative Conv+BN then Add+ReLU;
a post-norm transformer block's Add+LayerNorm competes with the Linear+residual epilogue; a Llama
layer's Add+RMSNorm with o_proj's/down_proj's residual epilogue (then RMSNorm alone).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from explorer.errors import PlanError
from explorer.fusion_engine import analyze, fuse
from explorer.fusions.plan import Plan, choose_alternative, make_plan


@pytest.fixture(scope="module")
def resnet():
    return analyze("resnet50")


def _alts(detection, pattern, into):
    return [a for a in detection.alternatives
            if detection.chain(a.instead_of).pattern == pattern and tuple(c.pattern for c in a.chains) == into]


def test_every_resnet50_bottleneck_offers_conv_bn_then_add_relu(resnet):
    d = resnet.detection
    blocks = [c for c in d.chains if c.pattern == "conv_bn_add_act"]
    assert len(blocks) == 3 + 4 + 6 + 3
    alts = _alts(d, "conv_bn_add_act", ("conv_bn", "elementwise_chain"))
    assert sorted(a.instead_of for a in alts) == sorted(c.id for c in blocks)
    for alt in alts:
        chain = d.chain(alt.instead_of)
        assert {n for c in alt.chains for n in c.nodes} <= set(chain.nodes) | set(), "an alternative took a claimed node"
        assert alt.chains[1].ops == ("add", "relu")
    owners = d.node_to_chain()
    for alt in d.alternatives:
        for c in alt.chains:
            assert all(owners.get(n) in (None, alt.instead_of) for n in c.nodes)


@pytest.mark.parametrize("model, patterns, first", [
    ("transformer_block", ("add_layer_norm",), "linear_residual"),
    # Add+RMSNorm, or Add+RMSNorm with γ folded into the next linears: either competes with the epilogue
    ("llama_decoder", ("add_rms_norm", "add_rms_fold"), "linear_residual"),
])
def test_transformer_norms_compete_with_the_residual_epilogue(model, patterns, first):
    d = analyze(model).detection
    found = [a for a in d.alternatives if d.chain(a.instead_of).pattern in patterns and a.chains[0].pattern == first]
    assert found, [(d.chain(a.instead_of).pattern, [c.pattern for c in a.chains]) for a in d.alternatives]


def test_choosing_an_alternative_fuses_it_and_computes_the_same(resnet):
    analysis = analyze("residual_block")
    d = analysis.detection
    (alt,) = _alts(d, "conv_bn_add_act", ("conv_bn", "elementwise_chain"))
    plan = choose_alternative(make_plan(d, "all"), d, alt.id)
    assert alt.instead_of not in plan.accepted and {c.id for c in alt.chains} <= set(plan.accepted)
    assert Plan.from_json(plan.to_json()) == plan
    fused = fuse(analysis, plan, "cpu")
    statuses = {a.chain_id: a.status for a in fused.applied}
    assert all(statuses[c.id] == "fused" for c in alt.chains), statuses
    x = analysis.model.example_inputs
    with torch.inference_mode():
        expected, got = analysis.model.gm(*x), fused.gm(*x)
    expected = expected[0] if isinstance(expected, (tuple, list)) else expected
    got = got[0] if isinstance(got, (tuple, list)) else got
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5)


def test_a_chain_and_its_alternative_cannot_both_be_accepted():
    d = analyze("residual_block").detection
    (alt,) = d.alternatives
    both = Plan(model=d.model, fingerprint=d.fingerprint,
                accepted=tuple(c.id for c in d.chains) + tuple(c.id for c in alt.chains))
    with pytest.raises(PlanError, match="share node"):
        both.check_for(d)
    with pytest.raises(PlanError, match="no alternative"):
        choose_alternative(make_plan(d, "all"), d, "conv_bn@nowhere")


def test_the_fusions_page_offers_the_alternative_and_uses_it():
    from streamlit.testing.v1 import AppTest

    at = AppTest.from_file(str(Path(__file__).resolve().parents[1] / "explorer" / "app.py"), default_timeout=180)
    at.session_state["zoo_name"] = "residual_block"
    at.run()
    d = analyze("residual_block").detection
    (alt,) = d.alternatives
    at.switch_page("ui/pages/fusions.py").run()
    assert not at.exception, at.exception
    at.selectbox(key="chain_pick").set_value(alt.instead_of).run()
    at.button(key=f"alt_use@{alt.instead_of}#0").click().run()
    assert not at.exception, at.exception
    accepted = set(at.session_state["accepted"][d.fingerprint])
    assert alt.instead_of not in accepted and {c.id for c in alt.chains} <= accepted
    assert at.button(key=f"alt_use@{alt.instead_of}#0").disabled
    assert any("in use" in m.value for m in at.markdown)
    # the one-chain picker now offers the alternative's chains, and accepting the original drops them
    options = at.selectbox(key="chain_pick").options
    assert all(any(f"({c.id})" in o for o in options) for c in (*alt.chains, d.chain(alt.instead_of))), options
    at.selectbox(key="chain_pick").set_value(alt.instead_of).run()
    at.button(key="chain_accept").click().run()
    accepted = set(at.session_state["accepted"][d.fingerprint])
    assert alt.instead_of in accepted and not {c.id for c in alt.chains} & accepted


def _zoo_names():
    from explorer.sources.zoo import ZOO

    return sorted(n for n, e in ZOO.items() if not e.large and n != "bert_large")


@pytest.mark.parametrize("name", _zoo_names())
def test_every_zoo_models_alternatives_are_choosable(detection_cached, name):
    """On every zoo model: each alternative replaces one detected chain, takes only that chain's nodes or nodes no
    chain claimed, reaches beyond it or partitions it, and a plan choosing it passes ``check_for``; ids stay
    unique between detected and alternative chains. (Token models at sequence length 32, as the engine's tests.)"""
    from explorer.sources.zoo import ZOO

    _, d = detection_cached(name, None, 32 if ZOO[name].inputs.seq_len else None)
    owners = d.node_to_chain()
    detected = {c.id for c in d.chains}
    for alt in d.alternatives:
        assert alt.instead_of in detected
        nodes = {n for c in alt.chains for n in c.nodes}
        assert all(owners.get(n) in (None, alt.instead_of) for n in nodes), alt.id
        assert not {c.id for c in alt.chains} & detected, alt.id
        own = set(d.chain(alt.instead_of).nodes)
        assert not nodes <= own or len(alt.chains) > 1, alt.id       # beyond the chain, or a partition of it
        choose_alternative(make_plan(d, "all"), d, alt.id).check_for(d)
