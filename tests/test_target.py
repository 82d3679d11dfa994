"""One target, one decision (issue 21): ``Target(device, dtype, memory_format)`` and its one vocabulary of names,
refused in the parent with one line (the command line, a sweep's spec, the run settings); each chain's kernel
``Choice`` made once per target, recorded on its fused call and read by the lowering.

The counts come from the selection registry (``fusions.base.counting``), which patches nothing: every family's
``select_*`` is registered there and counts its own calls while the block is open. The model is a small CNN and
MLP written here whose chains are one of each family with a lowering that reads the choice (conv, squeeze-excite,
linear + activation, linear + residual); its fused outputs are compared with the unfused model's. The zoo decoder
and GPT-2 (the corpus's CI size) show that a lean graph's calls follow the recorded choice when they run: no
selection is asked in the forward, and the outputs are bit for bit those of the fused graph run as it is.
"""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from torch import nn
from triton_testing import detect_module

from explorer import cli
from explorer.fusions.base import SELECTIONS, Choice, counting
from explorer.fusions.plan import make_plan
from explorer.fusions.rewrite import apply_plan
from explorer.runtime import lean, measure
from explorer.runtime.settings import RunSettings
from explorer.sweeps import spec as sweep_spec
from explorer.vocab import DTYPE_NAMES, MEMORY_FORMATS, Target, TargetError


# ====================================================================== the vocabulary, refused in the parent

@pytest.mark.parametrize("fields, words", [
    ({"dtype": "fp8"}, "unknown dtype 'fp8'"),
    ({"dtype": "fp64"}, "unknown dtype 'fp64'"),          # the reference's dtype is never a run's
    ({"device": "tpu"}, "unknown device 'tpu'"),
    ({"device": "cuda:x"}, "unknown device 'cuda:x'"),
    ({"memory_format": "nhwc"}, "memory_format must be one of nchw, channels_last, got 'nhwc'"),
])
def test_a_bad_name_is_one_line(fields, words):
    with pytest.raises(TargetError) as err:
        Target(**fields)
    assert words in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("fields", [{"dtype": "fp8"}, {"device": "tpu"}, {"dtype": 16}])
def test_the_run_settings_refuse_a_bad_name(fields):
    """What ``gpu_runner.run`` is given is made in the parent: a bad name never reaches a child process."""
    with pytest.raises(TargetError):
        RunSettings(**fields)


def test_the_names_a_target_takes():
    assert str(Target("cuda:1", "bf16", "channels_last")) == "cuda:1/bf16/channels_last"
    assert Target("cuda:1").device_type == "cuda" and Target().channels_last is False
    assert [Target("cpu", d).dtype for d in DTYPE_NAMES] == ["fp32", "fp16", "bf16"]
    assert measure.torch_dtype("bf16") is torch.bfloat16 and measure.torch_dtype("fp64") is torch.float64
    assert measure.run_target("cuda", torch.float16, True) == Target("cuda", "fp16", "channels_last")


@pytest.mark.parametrize("argv, words", [
    (["run", "no_such_model", "--dtype", "fp8"], "unknown dtype 'fp8'"),
    (["run", "no_such_model", "--device", "tpu"], "unknown device 'tpu'"),
    (["plan", "no_such_model", "--memory-format", "nhwc"], "got 'nhwc'"),
    (["compare-compile", "no_such_model", "--dtype", "float16"], "unknown dtype 'float16'"),
    (["sweep", "--out", "unused", "--models", "no_such_model", "--batches", "1", "--dtypes", "fp16,fp8"],
     "unknown dtype 'fp8'"),
    (["sweep", "--out", "unused", "--models", "no_such_model", "--batches", "1", "--dtypes", "fp16",
      "--memory-formats", "nhwc"], "got 'nhwc'"),
])
def test_the_command_line_refuses_a_bad_name_first(argv, words, capsys):
    """One line, and before anything else is read: the model does not exist, yet the name is what is refused."""
    assert cli.main(argv) == cli.EXIT_USAGE
    err = capsys.readouterr().err
    assert words in err and err.count("\n") == 1 and "Traceback" not in err


@pytest.mark.parametrize("key, value, words", [("dtypes", ["fp8"], "dtypes (fp32, fp16, bf16)"),
                                               ("memory_formats", ["nhwc"], "memory formats (nchw, channels_last)")])
def test_a_sweep_spec_spells_the_same_vocabulary(key, value, words):
    data = {"models": ["conv_bn_relu"], "plans": ["all"], "batches": [1], "dtypes": ["fp32"], key: value}
    with pytest.raises(sweep_spec.SweepError) as err:
        sweep_spec.parse_spec(data)
    assert words in str(err.value) and "\n" not in str(err.value)
    assert sweep_spec.DTYPES == DTYPE_NAMES and sweep_spec.MEMORY_FORMATS == MEMORY_FORMATS


# ====================================================================== one decision per chain and target

class _Net(nn.Module):
    """conv → BN → ReLU, a squeeze-excite gate, then a linear + ReLU and a projection added to its input."""

    def __init__(self) -> None:
        super().__init__()
        self.conv, self.bn = nn.Conv2d(3, 12, 3, padding=1), nn.BatchNorm2d(12)
        self.fc1, self.fc2 = nn.Conv2d(12, 4, 1), nn.Conv2d(4, 12, 1)
        self.lin, self.proj = nn.Linear(12, 20), nn.Linear(20, 12)
        with torch.no_grad():
            self.bn.running_mean.uniform_(-0.5, 0.5)
            self.bn.running_var.uniform_(0.5, 2.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.bn(self.conv(x)))                                            # (N, 12, H, W)
        y = y * torch.sigmoid(self.fc2(torch.relu(self.fc1(y.mean((2, 3), keepdim=True)))))
        h = y.mean((2, 3))                                                               # (N, 12)
        return self.proj(torch.relu(self.lin(h))) + h                                    # (N, 12)


#: The selection each of the model's patterns asks.
_SELECTION = {"conv_bn_act": "conv.select_conv_epilogue", "squeeze_excite": "squeeze_excite.select_squeeze_excite",
              "linear_act": "linear.select_linear_act", "linear_residual": "linear_residual.select_linear_residual"}


@pytest.fixture(scope="module")
def net():
    torch.manual_seed(0)
    x = torch.randn(2, 3, 9, 7)
    gm, detection = detect_module(_Net(), (x,), "target_net")
    assert sorted(c.pattern for c in detection.chains) == sorted(_SELECTION)
    return gm, detection, x


def _fused_calls(gm: torch.fx.GraphModule) -> list[torch.fx.Node]:
    return [n for n in gm.graph.nodes if "fused_choice" in n.meta and n.op == "call_function"]


@pytest.mark.parametrize("target", [Target("cpu"), Target("cuda", "fp16", "channels_last"), Target("cuda", "bf16")],
                         ids=str)
def test_each_chain_is_decided_once_per_target(net, target):
    gm, detection, _x = net
    plan = make_plan(detection, "all", memory_format=target.memory_format)
    with counting() as calls:
        fused = apply_plan(gm, detection, plan, target)
    assert all(a.status == "fused" for a in fused.applied)
    assert calls == Counter(_SELECTION[a.pattern] for a in fused.applied)       # once each, at the rewrite
    dtype = measure.torch_dtype(target.dtype)
    recorded = {n.meta["fused_chain"]: n.meta["fused_choice"] for n in _fused_calls(fused.gm)}
    assert {a.chain_id: a.impl for a in fused.applied} == {k: c.impl for k, c in recorded.items()}
    assert all(n.meta["fused_for"] == (target.device_type, dtype, target.memory_format)
               for n in _fused_calls(fused.gm))
    prepared = measure.prepare_graph(fused.gm, "cpu", dtype, target.channels_last, lean=False)
    with counting() as later:
        lowered = lean.specialize_fused_calls(prepared, torch.device(target.device), dtype)
    assert lowered == len(fused.applied) and not later                           # the lowering read every choice


def test_the_lowering_reads_the_recorded_choice(net):
    """A recorded choice is what the lean graph runs: one changed on the node changes the lowered call (a test
    of reading, not of deciding again), and the fused graph still computes what the model does."""
    gm, detection, x = net
    fused = apply_plan(gm, detection, make_plan(detection, "all"), Target("cpu"))
    (conv_call,) = [n for n in _fused_calls(fused.gm) if n.meta["fused_pattern"] == "conv_bn_act"]
    assert conv_call.meta["fused_choice"].impl == "separate"
    plain = measure.prepare_graph(fused.gm, "cpu", torch.float32, lean=False)
    lean_gm = measure.prepare_graph(fused.gm, "cpu", torch.float32)
    with torch.inference_mode(), counting() as calls:
        out = lean_gm(x)
    assert not calls                                                            # no selection at run time either
    with torch.inference_mode():
        torch.testing.assert_close(out, plain(x), rtol=0, atol=0)
        torch.testing.assert_close(out, gm(x), rtol=1e-5, atol=1e-5)
    conv_call.meta["fused_choice"] = Choice("cudnn_conv_relu", "as if cuDNN", True)
    relabelled = measure.prepare_graph(fused.gm, "cpu", torch.float32)
    assert torch.cudnn_convolution_relu in [n.target for n in relabelled.graph.nodes]


def test_a_graph_fused_for_another_target_asks_the_selection(net):
    """The one other caller: a fused call recorded for cpu/fp32 lowered for cuda/fp16 asks its selection there."""
    gm, detection, _x = net
    fused = apply_plan(gm, detection, make_plan(detection, "all"), "cpu")
    prepared = measure.prepare_graph(fused.gm, "cpu", torch.float16, lean=False)
    with counting() as calls:
        lean.specialize_fused_calls(prepared, torch.device("cuda"), torch.float16)
    assert calls == Counter(_SELECTION[a.pattern] for a in fused.applied)
    assert set(SELECTIONS) >= set(_SELECTION.values())


@pytest.mark.parametrize("target", [Target("cpu"), Target("cuda", "bf16")], ids=str)
def test_the_decoders_epilogue_lowerings_read_the_recorded_choice(analyze_cached, target):
    """The SwiGLU and rotary lowerings (the GEMM epilogues: ``swiglu.epilogue_decision``, ``rotary.qkv_decision``)
    read the choice their rewrite recorded for the target instead of asking ``select_swiglu`` / ``select_rotary``
    again (they asked 4 + 4 on the zoo decoder before); the committed H200 table still gives the tiles. A graph
    fused for another target asks them again (the one other caller)."""
    from explorer.fusion_engine import fuse

    analysis = analyze_cached("llama_decoder", 2, 16)
    _model, _graph, detection = analysis
    with counting() as calls:
        fused = fuse(analysis, make_plan(detection, "all"), target)
    dtype = measure.torch_dtype(target.dtype)
    prepared = measure.prepare_graph(fused.gm, "cpu", dtype, lean=False)
    with counting() as later:
        lean.specialize_fused_calls(prepared, torch.device(target.device), dtype)
    assert calls["rotary.select_rotary"] and calls["swiglu.select_swiglu"]
    assert not later, later
    other = measure.prepare_graph(fused.gm, "cpu", torch.float16, lean=False)      # fused for another dtype
    with counting() as asked:
        lean.specialize_fused_calls(other, torch.device(target.device), torch.float16)
    assert asked["swiglu.select_swiglu"] and asked["rotary.select_rotary"]


# ====================================================================== the lean graph asks no selection at run time

def _decoder_and_gpt2(name: str, analyze_cached):
    """The zoo decoder (batch 2, 16 tokens) or GPT-2 at the corpus's CI size (one layer), as
    ``benchmarks/check_selection_calls.py`` captures it."""
    if name == "llama_decoder":
        return analyze_cached("llama_decoder", 2, 16)
    pytest.importorskip("transformers")
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from benchmarks.check_selection_calls import analysis

    return analysis(name)


#: The fused calls whose lowering hands them the recorded impl, so that they follow it instead of asking their
#: selection when they run (RMSNorm, the rotary kernel, the SwiGLU pass; the norm, the scores kernel).
_BOUND_BY_LOWERING = ("fused_add_rms_norm", "fused_add_rms_norm_normed", "fused_rms_norm", "fused_rotary",
                      "rotary_token_major", "silu_mul_packed", "fused_add_layer_norm", "fused_add_layer_norm_normed",
                      "fused_add_layer_norm_viewed")


@pytest.mark.parametrize("name", ["llama_decoder", "hf/gpt2"])
def test_a_lean_graph_asks_no_selection_when_it_runs(name, analyze_cached, monkeypatch):
    """RMSNorm (every variant), the standalone rotary kernel and the SwiGLU pass asked their selection at the first
    call of each signature (5 calls on the CPU zoo decoder's forward before): now their lowering hands each call the
    impl the rewrite recorded for the target, and the forward asks nothing, the same kernels running bit for bit (the
    graph run as it is fused, whose calls are handed nothing, still asks, as before). On CUDA the bound call's first
    call runs with the handed impl, the later ones are its direct launches: the same objects, run here under the
    interpreter. A graph lowered for a planned CUDA target (no device here) hands every such call its impl too."""
    from explorer.fusions.triton_support import triton_available

    if not triton_available():
        pytest.skip("no Triton")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    from explorer.fusion_engine import fuse

    analysis = _decoder_and_gpt2(name, analyze_cached)
    fused = fuse(analysis, make_plan(analysis.detection, "all"), Target("cpu"))
    x = measure.prepare_inputs(analysis.model.example_inputs, "cpu", torch.float32)
    plain = measure.prepare_graph(fused.gm, "cpu", torch.float32, lean=False)
    with counting() as lowering:
        lean_gm = measure.prepare_graph(fused.gm, "cpu", torch.float32)
    with torch.inference_mode(), counting() as asked:
        out = lean_gm(*x)
    with torch.inference_mode(), counting() as as_fused:
        want = plain(*x)
    assert not lowering and not asked, (lowering, asked)
    if name == "llama_decoder":
        assert set(as_fused) == {"rms_norm.select_rms_norm", "rotary.select_rotary", "swiglu.select_swiglu"}
    torch.testing.assert_close(out, want, rtol=0, atol=0)
    bound = [n for n in lean_gm.graph.nodes if n.op == "call_function" and n.meta.get("fused_bound")]
    assert {n.target.__name__ for n in bound} & set(_BOUND_BY_LOWERING)
    assert lean.bind_calls(lean_gm)                                 # as prepare_graph does for a CUDA graph
    with torch.inference_mode(), counting() as replayed:
        first, again = lean_gm(*x), lean_gm(*x)
    assert not replayed
    torch.testing.assert_close(first, want, rtol=0, atol=0)
    torch.testing.assert_close(again, want, rtol=0, atol=0)
    for target in lean.bound_calls(lean_gm):
        if isinstance(target, lean.BoundCall) and target.__name__ in _BOUND_BY_LOWERING:
            assert target.replay is not None, target                # later calls: its direct launches
    cuda = fuse(analysis, make_plan(analysis.detection, "all"), Target("cuda", "bf16"))
    prepared = measure.prepare_graph(cuda.gm, "cpu", torch.bfloat16, lean=False)
    lean.specialize_fused_calls(prepared, torch.device("cuda"), torch.bfloat16)
    left = [n.target.__name__ for n in prepared.graph.nodes if n.op == "call_function"
            and getattr(n.target, "__name__", "") in _BOUND_BY_LOWERING + ("fused_linear_act_forms",)
            and not n.meta.get("fused_bound")
            and getattr(n.meta.get("fused_choice"), "impl", None) != "cublaslt_on_device"]
    assert not left, left           # cublaslt_on_device: GPT-2's GELU epilogue is probed on the device, named


def test_the_squeeze_excite_kernel_follows_the_recorded_choice(net, monkeypatch):
    """Where Triton runs (here its interpreter), the squeeze-excite lowering calls the kernel function handed the
    recorded impl: the forward asks ``select_squeeze_excite`` nothing (EfficientNet-B0's CPU forward asked it 10
    times), and computes what the fused graph run as it is computes, bit for bit."""
    from explorer.fusions.triton_support import triton_available

    if not triton_available():
        pytest.skip("no Triton")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    gm, detection, x = net
    fused = apply_plan(gm, detection, make_plan(detection, "all"), Target("cpu"))
    (se_call,) = [n for n in _fused_calls(fused.gm) if n.meta["fused_pattern"] == "squeeze_excite"]
    assert se_call.meta["fused_choice"].impl == "triton"
    lean_gm = measure.prepare_graph(fused.gm, "cpu", torch.float32)
    plain = measure.prepare_graph(fused.gm, "cpu", torch.float32, lean=False)
    with torch.inference_mode(), counting() as calls:
        out = lean_gm(x)
    assert not calls
    with torch.inference_mode():
        torch.testing.assert_close(out, plain(x), rtol=0, atol=0)
