"""The ConvNeXt block family (``explorer.fusions.convnext``): the layer-scale fold, the fused block, the pattern.

The fused block (depthwise conv + bias + LayerNorm in one Triton kernel, the MLP with
the layer scale folded into its second linear, the residual in one pass) is checked
against torchvision's block op by op in float64, on channel counts that are not powers
of two, in every dtype and both input layouts. Without a GPU the Triton kernels run in
Triton's interpreter (``TRITON_INTERPRET=1`` per test). Tolerances:
``convnext.TOLERANCES``.
"""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from triton_testing import (DTYPE_IDS, DTYPES, HAS_CUDA, INTERPRET, assert_close64, fused_matches, fusion_benchmark,
                            needs_backend, triton_interpreter, up64)

import torchvision  # after triton_testing: importing torchvision imports Triton

from explorer.fusion_engine import detect
from explorer.fusions import conv, convnext, triton_support
from explorer.fusions.kernels.linear_act import linear_act_reference
from explorer.fusions.plan import make_plan
from explorer.fusions.rewrite import apply_plan
from explorer.graph.build import build_graph
from explorer.runtime import measure
from explorer.sources import capture

DEVICE = "cuda" if HAS_CUDA else "cpu"


def block(dim: int, seed: int = 0) -> nn.Module:
    """torchvision's ConvNeXt block with unit-scale weights and a layer scale that matters (not 1e-6)."""
    torch.manual_seed(seed)
    module = torchvision.models.convnext.CNBlock(dim, layer_scale=1e-6, stochastic_depth_prob=0.0)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            if name == "layer_scale":
                p.copy_(0.1 + 0.4 * torch.rand(p.shape, generator=gen))
            elif p.dim() == 1:
                p.copy_(0.1 * torch.randn(p.shape, generator=gen) + (1.0 if "block.2.weight" in name else 0.0))
            else:
                p.copy_(torch.randn(p.shape, generator=gen) / p[0].numel() ** 0.5)
    return module.eval()


def _params(module: nn.Module, dtype: torch.dtype):
    """The fused call's arguments for ``module`` (layer scale folded), in ``dtype`` on the test device."""
    dw, ln, fc1, fc2 = module.block[0], module.block[2], module.block[3], module.block[5]
    w2, b2 = convnext.fold_layer_scale(fc2.weight.double(), fc2.bias.double(), module.layer_scale.double())
    cast = lambda t: t.detach().to(dtype=dtype, device=DEVICE)  # noqa: E731
    return (cast(dw.weight), cast(dw.bias), 1, 3, 1, cast(ln.weight), cast(ln.bias), ln.eps,
            cast(fc1.weight), cast(fc1.bias), "gelu", cast(w2), cast(b2))


# ===================================================================== the layer-scale fold

def test_fold_layer_scale_is_exact_in_float64():
    gen = torch.Generator().manual_seed(0)
    w, b = torch.randn(40, 160, generator=gen, dtype=torch.float64), torch.randn(40, generator=gen, dtype=torch.float64)
    gamma = torch.rand(40, 1, 1, generator=gen, dtype=torch.float64) + 0.1
    h = torch.randn(3, 5, 160, generator=gen, dtype=torch.float64)
    w_before = w.clone()
    fw, fb = convnext.fold_layer_scale(w, b, gamma)
    assert torch.equal(w, w_before), "the fold must not modify its inputs"
    ref = (gamma.reshape(-1) * nn.functional.linear(h, w, b))                       # γ · (h Wᵀ + b)
    assert (nn.functional.linear(h, fw, fb) - ref).abs().max().item() <= 1e-12


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_fold_layer_scale_keeps_dtype_and_rejects_mismatches(dtype):
    fw, fb = convnext.fold_layer_scale(torch.ones(4, 6, dtype=dtype), None, torch.full((4,), 0.5))
    assert fw.dtype == dtype and fb is None and torch.equal(fw, torch.full((4, 6), 0.5, dtype=dtype))
    with pytest.raises(ValueError, match="layer scale"):
        convnext.fold_layer_scale(torch.ones(4, 6), None, torch.ones(5))


# ===================================================================== the fused block

def _grid():
    params, i = [], 0
    for channels in (40, 100):
        for dtype, did in zip(DTYPES, DTYPE_IDS):
            for layout in ("nchw", "nhwc"):
                params.append(pytest.param(i, channels, dtype, layout, id=f"C{channels}-{did}-{layout}"))
                i += 1
    return params


@needs_backend
@pytest.mark.parametrize("i, channels, dtype, layout", _grid())
def test_fused_block_matches_float64(i, channels, dtype, layout):
    """Every other case with the MLP's linears as Triton GEMMs with their epilogues (``mlp_gemm_triton``)."""
    module = block(channels, seed=i)
    x = torch.randn(2, channels, 7, 9, generator=torch.Generator().manual_seed(i)).to(dtype=dtype, device=DEVICE)
    if layout == "nhwc":
        x = x.contiguous(memory_format=torch.channels_last)
    with torch.no_grad(), conv.policy(mlp_gemm_triton=i % 2 == 0):
        ref64 = module.double()(up64(x))                                          # torchvision's block, float64
        out = convnext.convnext_block(x, *_params(module, dtype))
    assert out.dtype == dtype and conv.layout_of(out) == "nhwc", "channels_last, as the unfused block's output"
    assert_close64(out, ref64, convnext.TOLERANCES[dtype])


@needs_backend
def test_block_reference_is_the_unfused_block():
    module = block(24)
    x = torch.randn(2, 24, 5, 6, dtype=torch.float64)
    dw, ln, fc1, fc2 = module.block[0], module.block[2], module.block[3], module.block[5]
    module = module.double()
    with torch.no_grad():
        ref = convnext.convnext_block_reference(x, dw.weight, dw.bias, ln.weight, ln.bias, ln.eps, fc1.weight,
                                                fc1.bias, fc2.weight, fc2.bias, module.layer_scale)
        torch.testing.assert_close(ref, module(x), rtol=1e-12, atol=1e-12)


def test_selection_says_why(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    cpu = convnext.select_convnext_block("cpu", torch.float32, 96)
    assert cpu.impl == "reference+cublas" and "no Triton on cpu" in cpu.label and "residual add_" in cpu.label
    if triton_support.triton_available():
        monkeypatch.setattr(convnext, "BLOCK_MEASURED", {})           # the per-step tables below decide
        monkeypatch.setattr(convnext, "DWLN_MEASURED", {(96, 56, 56): ("triton", 90.0, 120.0)})
        monkeypatch.setattr(convnext, "MLP_MEASURED", {(96, 56, 56): ("gelu_prologue", {"cublas": 150.0,
                                                                                        "gelu_prologue": 120.0})})
        cuda = convnext.select_convnext_block("cuda", torch.float16, 96, hw=(56, 56))
        assert cuda.impl == "triton+gelu_prologue" and cuda.label.startswith("triton dwconv+bias+LayerNorm (1 kernel")
        assert "our kernel 90 µs, cuDNN + LayerNorm pass 120 µs" in cuda.label, "the measurement is said"
        assert "applied to its input" in cuda.label and "gelu_prologue 120 µs, cublas 150 µs" in cuda.label
        other = convnext.select_convnext_block("cuda", torch.float16, 96, hw=(28, 28))
        assert other.impl == f"{convnext.DWLN_DEFAULT}+{convnext.MLP_DEFAULT}" == "cudnn_ln+cublas" and "not measured" in other.label
        assert other.label.startswith("cuDNN dwconv + triton bias+LayerNorm (1 pass")
        assert "linear+gelu" in other.label and "triton GEMM" not in other.label, "cuBLAS by default"
        with conv.policy(mlp_gemm_triton=True):
            gemm = convnext.select_convnext_block("cuda", torch.float16, 96)
        assert "triton GEMM+bias+gelu (1 kernel)" in gemm.label
        with conv.policy(convnext_dwln="triton"):
            assert convnext.select_convnext_block("cuda", torch.float16, 4096).impl.startswith("cudnn_ln+"), "too wide"
        assert convnext.select_convnext_block("cuda", torch.float16, 96, layout="nchw").impl.startswith("reference+")
        with conv.policy(depthwise_triton=False):
            assert convnext.select_convnext_block("cuda", torch.float16, 96).impl.startswith("reference+")


# ===================================================================== pattern and rewrite

class _DenseBlock(nn.Module):
    """A ConvNeXt block whose first convolution is dense, not depthwise."""

    def __init__(self, dim: int = 16) -> None:
        super().__init__()
        self.inner = block(dim)
        self.inner.block[0] = nn.Conv2d(dim, dim, 3, padding=1)

    def forward(self, x):
        return self.inner(x)


def _detect(module, x):
    gm = capture(module.eval(), (x,), type(module).__name__)
    return gm, detect(build_graph(gm, type(module).__name__))


def test_one_chain_per_block():
    stage = nn.Sequential(block(24, 0), block(24, 1), block(24, 2))
    _, det = _detect(stage, torch.randn(2, 24, 7, 7))
    assert [c.pattern for c in det.chains] == ["convnext_block"] * 3
    assert det.chains[0].ops == ("conv", "layer_norm", "linear", "gelu", "linear", "mul", "add")


def test_near_miss_for_a_dense_convolution():
    _, det = _detect(_DenseBlock(), torch.randn(2, 16, 6, 6))
    assert not any(c.pattern == "convnext_block" for c in det.chains)
    assert any(m.pattern == "convnext_block" and "not depthwise" in m.reason for m in det.near_misses)


def _check_rewrite(module, x, rtol, layout="nchw"):
    gm, det = _detect(module.to(DEVICE), x.to(DEVICE))
    fused = fused_matches(gm, det, x.to(DEVICE), rtol, layout, DEVICE)
    assert len(fused.applied) == len(det.chains) and det.chains
    return fused


def test_rewrite_without_triton_is_exact_in_float64(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    x = torch.randn(2, 24, 7, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    fused = _check_rewrite(nn.Sequential(block(24, 0), block(24, 1)).double(), x, 1e-12)
    assert all(a.impl == "reference+cublas" for a in fused.applied)
    assert "layer_scale" not in fused.gm.code and "mul" not in fused.gm.code, "the layer scale is folded away"


@needs_backend
@pytest.mark.parametrize("layout, dwln", [("nchw", "triton"), ("nhwc", "triton"), ("nhwc", "cudnn_ln")])
def test_rewrite_through_triton(layout, dwln):
    x = torch.randn(2, 40, 7, 6, generator=torch.Generator().manual_seed(2))
    with conv.policy(convnext_dwln=dwln):
        fused = _check_rewrite(nn.Sequential(block(40, 0), block(40, 1)), x, 2e-5, layout)
    label = "LayerNorm (1 kernel" if dwln == "triton" else "bias+LayerNorm (1 pass"
    assert all(a.impl.split("+")[0] == dwln and label in a.implementation for a in fused.applied)


@pytest.mark.parametrize("dwln, mlp", [("reference", "cublas"), ("triton", "cublas"), ("cudnn_ln", "gelu_prologue"),
                                       ("triton", "triton_gemm")])
def test_lowering(dwln, mlp, monkeypatch):
    """A lean graph names each step as ``dwln_impl`` and ``mlp_impl`` chose (``depthwise_layer_norm``; cuDNN's
    conv + ``channels_layer_norm``; conv + ``layer_norm``; then ``mlp_hidden``'s GEMM, ``project_gelu_residual``
    after cuBLAS's fc1, or the linear + activation call's lowering), and computes what the plain graph does."""
    triton = dwln != "reference"
    if triton and not (HAS_CUDA or INTERPRET):
        pytest.skip("Triton runs neither compiled nor interpreted")
    if not triton:
        monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    x = torch.randn(3, 24, 7, 7, generator=torch.Generator().manual_seed(3)).to(DEVICE)   # a CPU generator on any device
    gm, det = _detect(block(24).to(DEVICE), x)
    fused = apply_plan(gm, det, make_plan(det), DEVICE)
    plain = measure.prepare_graph(fused.gm, DEVICE, torch.float32, channels_last=True, lean=False)
    # no Triton: off by policy, so a CUDA machine (where Triton runs) takes the reference path too
    forced = dict(depthwise_triton=False, gemm_triton=False) if not triton else dict(convnext_dwln=dwln, convnext_mlp=mlp)
    with conv.policy(**forced):
        lean_gm = measure.prepare_graph(fused.gm, DEVICE, torch.float32, channels_last=True)
    targets = [n.target for n in lean_gm.graph.nodes if n.op == "call_function"]
    assert convnext.fused_convnext_block not in targets
    assert (convnext.depthwise_layer_norm in targets) == (dwln == "triton")
    assert (convnext.channels_layer_norm in targets) == (dwln == "cudnn_ln")
    assert (torch.layer_norm in targets) == (dwln == "reference")
    assert (convnext.mlp_hidden in targets) == (mlp == "triton_gemm")
    assert (convnext.project_gelu_residual in targets) == (mlp == "gelu_prologue")
    assert (convnext.project_residual in targets) == (mlp != "gelu_prologue")
    x = x.contiguous(memory_format=torch.channels_last)
    with torch.inference_mode():
        torch.testing.assert_close(lean_gm(x), plain(x), rtol=2e-5, atol=2e-5)


@pytest.mark.skipif(not INTERPRET, reason="needs Triton's interpreter (no CUDA here)")
def test_kernel_benchmark_smoke_checks_every_variant(tmp_path, monkeypatch):
    """``bench_convnext_kernels.py --smoke``: every variant the GPU run sweeps (our depthwise kernel's tiles,
    the GEMM configs, the library paths) computes the stage's three kernels within tolerance of float64, and a
    broken variant fails the run."""
    from explorer.fusions import triton_support

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    if not triton_support.library_reductions_usable():
        pytest.skip("Triton was first imported without TRITON_INTERPRET: its library functions cannot be interpreted")
    bench = fusion_benchmark("bench_convnext_kernels")
    out = tmp_path / "smoke.json"
    assert bench.main(["--smoke", "--out", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert {r["kind"] for r in rows} == {"dwln", "fc1", "fc2", "mlp", "ln2d"} and all(r["check"]["ok"] for r in rows)
    assert {"cudnn_conv+triton_ln", "gelu_prologue", "triton_ln"} <= {r["variant"] for r in rows}
    assert any(r["variant"].startswith("tap_") and r["variant"][4].isdigit() for r in rows), "the tile sweep ran"
    monkeypatch.setattr(convnext, "TOLERANCES", {k: dict(rtol=0.0, atol=0.0) for k in convnext.TOLERANCES})
    assert bench.main(["--smoke", "--only", "fc1", "--out", str(out)]) == 1


@pytest.mark.parametrize("dwln", ["reference", "cudnn_ln"])
def test_lowering_accumulates_onto_a_dead_block_input(dwln, monkeypatch):
    """``cublas_accumulate``: the second block's input is the first block's output, dead after it, so its lean
    lowering is ``mlp_accumulate_`` (fc2 accumulating onto x in place, the bias in the padded column: no residual
    pass); the first block reads the graph's input, which it must not overwrite: it keeps ``project_residual``.
    The lean graph computes what the plain graph does, and leaves its input untouched."""
    triton = dwln != "reference"
    if triton and not (HAS_CUDA or INTERPRET):
        pytest.skip("Triton runs neither compiled nor interpreted")
    if not triton:
        monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    x = torch.randn(3, 24, 5, 7, generator=torch.Generator().manual_seed(5)).to(DEVICE)
    gm, det = _detect(nn.Sequential(block(24, 0), block(24, 1), block(24, 2)).to(DEVICE), x)
    fused = apply_plan(gm, det, make_plan(det), DEVICE)
    plain = measure.prepare_graph(fused.gm, DEVICE, torch.float32, channels_last=True, lean=False)
    forced = dict(convnext_mlp="cublas_accumulate", convnext_dwln=dwln) if triton else \
        dict(depthwise_triton=False, gemm_triton=False)
    with conv.policy(**forced), monkeypatch.context() as m:
        m.setattr(convnext, "mlp_impl", lambda *a, **k: "cublas_accumulate")   # without Triton too: pure cuBLAS
        lean_gm = measure.prepare_graph(fused.gm, DEVICE, torch.float32, channels_last=True)
    targets = [n.target for n in lean_gm.graph.nodes if n.op == "call_function"]
    assert targets.count(convnext.mlp_accumulate_) == 2 and targets.count(convnext.project_residual) == 1
    x = x.contiguous(memory_format=torch.channels_last)
    before = x.clone()
    with torch.inference_mode():
        torch.testing.assert_close(lean_gm(x), plain(x), rtol=2e-5, atol=2e-5)
    assert torch.equal(x, before), "the graph's input is not overwritten"


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=["fp32", "fp16", "bf16"])
@pytest.mark.parametrize("act, gemm", [("gelu", False), ("relu", False), ("gelu", True)],
                         ids=["gelu", "relu", "gelu-triton-fc1"])
def test_accumulating_mlp_matches_float64(dtype, act, gemm):
    """``mlp_accumulate_`` against the block's MLP in float64 on odd channels and 1×1 and batch-1 maps: the padded
    column carries fc2's bias exactly (the activation maps 8 to 8), and x is updated in place (channels_last
    rows) or through its rows' copy (NCHW). ``gemm``: fc1 as our Triton GEMM with the activation in its epilogue
    (the padded column then goes through the epilogue's GELU)."""
    if gemm and not (HAS_CUDA or INTERPRET):
        pytest.skip("Triton runs neither compiled nor interpreted")
    for (n, c, h, w), layout in (((2, 13, 3, 5), "nhwc"), ((1, 24, 1, 1), "nhwc"), ((2, 9, 4, 3), "nchw"),
                                 ((1, 16, 3, 3), "nhwc")):
        gen = torch.Generator().manual_seed(c)
        x = torch.randn(n, c, h, w, generator=gen)
        t = torch.randn(n, h, w, c, generator=gen)
        w1, b1 = torch.randn(4 * c, c, generator=gen) / c ** 0.5, torch.randn(4 * c, generator=gen)
        w2, b2 = torch.randn(c, 4 * c, generator=gen) / (2 * c) ** 0.5, torch.randn(c, generator=gen) * 3
        ref = linear_act_reference(t.double(), w1.double(), b1.double(), act)
        ref = F.linear(ref, w2.double(), b2.double()).permute(0, 3, 1, 2) + x.double()
        parts = convnext.accumulate_weights(*(p.to(dtype).to(DEVICE) for p in (w1, b1, w2, b2)), act)
        xd = x.to(dtype).to(DEVICE)
        xd = xd.contiguous(memory_format=torch.channels_last) if layout == "nhwc" else xd.contiguous()
        out = convnext.mlp_accumulate_(t.to(dtype).to(DEVICE), *parts, xd, act, gemm)
        assert out is xd and out.dtype == dtype
        tol = convnext.TOLERANCES[dtype]
        torch.testing.assert_close(out.double().cpu(), ref, rtol=tol["rtol"] * 4, atol=tol["atol"] * 4 * 3)


def test_accumulate_weights_refuse_an_activation_that_moves_the_carrier():
    with pytest.raises(ValueError, match="does not map"):
        convnext.accumulate_weights(torch.ones(8, 2), None, torch.ones(2, 8), None, "silu")
    w1a, b1a, w2a = convnext.accumulate_weights(torch.ones(8, 2), None, torch.ones(2, 8), torch.tensor([4.0, -2.0]))
    assert w1a.shape == (8 + convnext.K_PAD, 2) and b1a[8] == convnext.BIAS_CARRIER and not b1a[9:].any()
    assert w2a[:, 8].tolist() == [0.5, -0.25] and not w2a[:, 9:].any() and not w1a[8:].any()


def test_lowering_runs_the_recorded_choice(monkeypatch):
    """The rewrite records ``"<first step>+<MLP>"`` on the fused call (``node.meta["fused_choice"]``); the lean
    lowering runs that (``block_steps``), not what the tables say at lowering time, unless a ConvNeXt switch is
    forced (then the switch wins)."""
    if not (HAS_CUDA or INTERPRET):
        pytest.skip("Triton runs neither compiled nor interpreted")
    x = torch.randn(2, 24, 7, 7, generator=torch.Generator().manual_seed(4)).to(DEVICE)
    gm, det = _detect(block(24).to(DEVICE), x)
    monkeypatch.setattr(convnext, "DWLN_MEASURED", {(24, 7, 7): ("triton", 1.0, 2.0)})
    monkeypatch.setattr(convnext, "MLP_MEASURED", {(24, 7, 7): ("triton_gemm", {"triton_gemm": 1.0})})
    # fused for the layout it is prepared in: a choice recorded for another memory format is set aside
    fused = apply_plan(gm, det, make_plan(det, memory_format="channels_last"), DEVICE)
    assert [a.impl for a in fused.applied] == ["triton+triton_gemm"]
    monkeypatch.setattr(convnext, "DWLN_MEASURED", {})            # the tables would now say cudnn_ln + cublas
    monkeypatch.setattr(convnext, "MLP_MEASURED", {})

    def targets(**switches):
        with conv.policy(**switches):
            lean = measure.prepare_graph(fused.gm, DEVICE, torch.float32, channels_last=True)
        return [n.target for n in lean.graph.nodes if n.op == "call_function"]

    recorded = targets()
    assert convnext.depthwise_layer_norm in recorded and convnext.mlp_hidden in recorded
    forced = targets(convnext_mlp="cublas")
    assert convnext.mlp_hidden not in forced and convnext.channels_layer_norm in forced, "the switch wins"


def test_block_table_decides_both_steps_and_says_the_gpu_time(monkeypatch):
    """``BLOCK_MEASURED`` (GPU time per whole block, inductor's beside it) decides the first step and the MLP for
    its shape and the label says the measurement; an activation the carrier column does not survive keeps the
    residual pass."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    if not triton_support.triton_runs_on("cpu"):
        pytest.skip("Triton's interpreter is not usable here")
    monkeypatch.setattr(convnext, "BLOCK_MEASURED", {(96, 56, 56): (
        "cudnn_ln", "cublas_accumulate", {"cudnn_ln+cublas_accumulate": 70.0, "triton+cublas": 95.0}, 80.0)})
    choice = convnext.select_convnext_block("cpu", torch.float16, 96, hw=(56, 56))
    assert choice.impl == "cudnn_ln+cublas_accumulate"
    assert "GPU time per block measured at C=96 56×56: cudnn_ln+cublas_accumulate 70 µs, inductor 80 µs" in choice.label
    assert "triton+cublas 95 µs" in choice.label and "padded column" in choice.label
    assert convnext.mlp_impl("cpu", torch.float16, 96, (56, 56), "silu") == "cublas", "silu(8) != 8"
    with conv.policy(convnext_dwln="triton"):
        assert convnext.dwln_impl("cpu", torch.float16, 96, (56, 56)) == "triton", "a forced switch wins"


@pytest.mark.skipif(not INTERPRET, reason="needs Triton's interpreter (no CUDA here)")
def test_block_benchmark_smoke_checks_every_pair(tmp_path, monkeypatch):
    """``bench_convnext_kernels.py --smoke --only block,ln2d_gpu``: every (first step, MLP) pair the GPU run
    profiles, the accumulating ones included, and every LayerNorm2d chain match float64."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    if not triton_support.library_reductions_usable():
        pytest.skip("Triton was first imported without TRITON_INTERPRET: its library functions cannot be interpreted")
    bench = fusion_benchmark("bench_convnext_kernels")
    out = tmp_path / "smoke.json"
    assert bench.main(["--smoke", "--only", "block,ln2d_gpu", "--out", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    pairs = {r["variant"] for r in rows if r["kind"] == "block"}
    assert pairs == {f"{d}+{m}" for d in bench.BLOCK_DWLN for m in bench.BLOCK_MLP} and all(r["check"]["ok"] for r in rows)
    assert {r["where"] for r in rows if r["kind"] == "ln2d_gpu"} == {"stem", "downsample", "head"}
