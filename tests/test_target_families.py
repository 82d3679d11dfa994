"""Every decision made once, for the families that decided per call (issue 21): Add+LayerNorm and the attention
scores kernel are handed the choice the rewrite recorded for the target when their lean graph is lowered, and then
ask no selection at run time; the conv selection is given the target's memory format.

The counts come from the selection registry (``fusions.base.counting``). The Triton kernels run in Triton's
interpreter here (``triton_interpreter``), so the CPU's choice for both families is their kernel; the convs'
targets are CUDA ones, decided and lowered on this machine without running (the selections take a device name;
``compiled`` unsets the interpreter, under which Triton would not compile for CUDA tensors).
"""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from torch import nn
from triton_testing import INTERPRET, detect_module, triton_interpreter  # noqa: F401  (the fixture)

from explorer.fusions import attention, conv, norm
from explorer.fusions.base import Choice, counting
from explorer.fusions.plan import make_plan
from explorer.fusions.rewrite import apply_plan
from explorer.runtime import lean, measure
from explorer.vocab import Target

pytestmark = pytest.mark.skipif(not INTERPRET, reason="needs Triton's interpreter (no CUDA here)")


class _Block(nn.Module):
    """A pre-norm residual add whose sum leaves the block (Add+LayerNorm keeping the sum), and attention scores
    whose probabilities are the output (the scores→softmax kernel: no P·V for SDPA to take)."""

    def __init__(self) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(24)

    def forward(self, x: torch.Tensor, r: torch.Tensor, mask: torch.Tensor):
        s = x + r                                                       # (B, T, C)
        h = self.ln(s)
        p = torch.softmax(h @ h.transpose(-2, -1) * 0.125 + mask, dim=-1)  # (B, T, T)
        return s, p


_SELECTIONS = {"add_layer_norm": "norm.select_add_layer_norm", "matmul_softmax": "attention.select_matmul_softmax"}
_TARGETS = {norm.fused_add_layer_norm, attention.fused_matmul_softmax}


@pytest.fixture(scope="module")
def block():
    torch.manual_seed(0)
    module = _Block().eval()
    inputs = (torch.randn(2, 7, 24), torch.randn(2, 7, 24), torch.randn(2, 1, 7))
    gm, detection = detect_module(module, inputs, "choice_block")
    assert sorted(c.pattern for c in detection.chains) == sorted(_SELECTIONS)
    return module, gm, detection, inputs


def _fused_calls(gm: torch.fx.GraphModule) -> dict[str, torch.fx.Node]:
    return {n.meta["fused_pattern"]: n for n in gm.graph.nodes if n.op == "call_function" and n.target in _TARGETS}


def test_the_lean_call_follows_the_recorded_choice_and_asks_nothing(block):
    module, gm, detection, inputs = block
    with counting() as calls:
        fused = apply_plan(gm, detection, make_plan(detection, "all"), Target("cpu"))
    assert calls == Counter(_SELECTIONS.values())                               # once each, at the rewrite
    assert {a.impl for a in fused.applied} == {"triton"}                        # the interpreter runs them
    with counting() as calls:
        lean_gm = measure.prepare_graph(fused.gm, "cpu", torch.float32)
    assert not calls                                                            # the lowering read both
    bound = _fused_calls(lean_gm)
    assert set(bound) == set(_SELECTIONS) and all(n.args[-1] == "triton" == n.meta["fused_bound"]
                                                  for n in bound.values())
    with torch.inference_mode(), counting() as calls:
        out = lean_gm(*inputs)
        lean_gm(*inputs)
    assert not calls                                                            # nor the fused calls, twice
    with torch.inference_mode():
        want = module(*inputs)
    for got, ref in zip(out, want):
        torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)


def test_a_changed_choice_changes_what_runs(block):
    """Reading, not deciding again: both calls recorded as "reference" are handed it and run the reference
    compositions, the very torch ops the model runs (bitwise equal to it), where the selection says "triton"."""
    module, gm, detection, inputs = block
    fused = apply_plan(gm, detection, make_plan(detection, "all"), Target("cpu"))
    for node in _fused_calls(fused.gm).values():
        node.meta["fused_choice"] = Choice("reference", "as recorded", False)
    lean_gm = measure.prepare_graph(fused.gm, "cpu", torch.float32)
    assert [n.args[-1] for n in _fused_calls(lean_gm).values()] == ["reference", "reference"]
    with torch.inference_mode():
        got, want = lean_gm(*inputs), module(*inputs)
    assert all(torch.equal(g, w) for g, w in zip(got, want))


def test_a_graph_fused_for_another_target_is_decided_once_at_its_lowering(block):
    """Fused for cuda/fp16, lowered for the CPU in fp32: each call's selection is asked once, by the lowering,
    and the call follows its answer (the kernel, under the interpreter) without asking at run time."""
    _module, gm, detection, inputs = block
    fused = apply_plan(gm, detection, make_plan(detection, "all"), Target("cuda", "fp16"))
    with counting() as calls:
        lean_gm = measure.prepare_graph(fused.gm, "cpu", torch.float32)
    assert calls == Counter(_SELECTIONS.values())
    assert all(n.args[-1] == "triton" for n in _fused_calls(lean_gm).values())
    with torch.inference_mode(), counting() as calls:
        lean_gm(*inputs)
    assert not calls


# ====================================================================== the conv selection and the memory format

class _Convs(nn.Module):
    """A 1×1 conv and a depthwise conv, each with ReLU6 (no cuDNN fused call: a Triton path on CUDA); with
    ``permuted`` the input arrives as (N, H, W, C) and is permuted to NCHW (a channels_last tensor in an nchw
    graph, as ConvNeXt's blocks hand their convs)."""

    def __init__(self, permuted: bool) -> None:
        super().__init__()
        self.permuted = permuted
        self.pw = nn.Conv2d(8, 16, 1)
        self.dw = nn.Conv2d(16, 16, 3, padding=1, groups=16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.permuted:
            x = x.permute(0, 3, 1, 2)                                           # (N, C, H, W), nhwc strides
        y = torch.nn.functional.relu6(self.pw(x))
        return torch.nn.functional.relu6(self.dw(y))


@pytest.fixture
def compiled(monkeypatch):
    """No interpreter: on a CUDA target Triton compiles (what a GPU run decides), which the selections read."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)


def _conv_impls(permuted: bool, target: Target):
    x = torch.randn(2, 5, 6, 8) if permuted else torch.randn(2, 8, 5, 6)
    gm, detection = detect_module(_Convs(permuted), (x,), "choice_convs")
    fused = apply_plan(gm, detection, make_plan(detection, "all", memory_format=target.memory_format), target)
    by_conv = {a.chain_id.split("@")[-1]: a for a in fused.applied}
    assert len(by_conv) == 2 and all(a.status == "fused" for a in by_conv.values())
    return fused, [by_conv[k] for k in sorted(by_conv, key=lambda k: "dw" in k)]   # (1×1, depthwise)


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_nchw_takes_the_epilogue_pass_for_contiguous_inputs(dtype, compiled):
    """In nchw the graph runs with the capture's layouts: a contiguous input is not one the 1×1 GEMM or the
    depthwise kernel takes, so both convs take the epilogue pass, and their lean calls are conv2d + bias_act_ (what
    the GEMM and depthwise calls fell back to at run time) with no selection asked."""
    fused, (pw, dw) = _conv_impls(False, Target("cuda", dtype, "nchw"))
    assert (pw.impl, dw.impl) == ("triton_epilogue", "triton_epilogue")
    assert "GEMM" not in str(pw.implementation) and "depthwise" not in str(dw.implementation)
    prepared = measure.prepare_graph(fused.gm, "cpu", measure.torch_dtype(dtype), lean=False)
    with counting() as calls:
        lean.specialize_fused_calls(prepared, torch.device("cuda"), measure.torch_dtype(dtype), "nchw")
    targets = Counter(n.target for n in prepared.graph.nodes if n.op == "call_function")
    assert not calls and targets[conv.bias_act_] == 2 and not targets[conv.conv1x1_epilogue]
    assert not targets[conv.depthwise_conv_epilogue]


def test_channels_last_and_a_permuted_input_keep_the_kernels(compiled):
    """channels_last: the layout is a run-time question (the kernels' calls check it), as before; an nchw graph
    whose conv reads a permuted (nhwc) tensor: the 1×1 GEMM, labelled as the one kernel it then is."""
    _, (pw, dw) = _conv_impls(False, Target("cuda", "fp16", "channels_last"))
    assert (pw.impl, dw.impl) == ("triton_gemm", "triton_depthwise")
    assert "channels_last input" in str(pw.implementation)                     # hedged: known at run time only
    _, (pw, _dw) = _conv_impls(True, Target("cuda", "fp16", "nchw"))
    assert pw.impl == "triton_gemm" and "channels_last input" not in str(pw.implementation)


def test_a_graph_lowered_for_another_memory_format_asks_again(compiled):
    """Fused for nchw, lowered for channels_last: the nchw choices are set aside and each conv's selection is
    asked by its lowering, which then takes the 1×1 GEMM and the depthwise kernel's calls."""
    fused, _ = _conv_impls(False, Target("cuda", "fp16", "nchw"))
    prepared = measure.prepare_graph(fused.gm, "cpu", torch.float16, True, lean=False)
    with counting() as calls:
        lean.specialize_fused_calls(prepared, torch.device("cuda"), torch.float16, "channels_last")
    targets = Counter(n.target for n in prepared.graph.nodes if n.op == "call_function")
    assert calls == Counter({"conv.select_conv_epilogue": 2})
    assert targets[conv.conv1x1_epilogue] == 1 and targets[conv.depthwise_conv_epilogue] == 1
