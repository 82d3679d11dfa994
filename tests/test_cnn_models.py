"""The CNNs of issue 13 (MobileNetV2, EfficientNet-B0, ConvNeXt-Tiny): detection, fusion, ONNX and ``.pt2``.

Detection counts are derived here from each architecture as torchvision builds it
(its blocks, and the chains each block makes), never copied from a run:

- MobileNetV2 and EfficientNet-B0: the stem and the head are Conv+BN+act; each
  inverted residual block has an expansion Conv+BN+act (when its expansion ratio is
  not 1), a depthwise Conv+BN+act, in EfficientNet a squeeze-and-excitation, and a
  projection that ends in a residual add with no activation where the block keeps
  its input (Conv+BN+Add), else Conv+BN.
- ConvNeXt-Tiny: one ConvNeXt block chain per ``CNBlock``, nothing else.

Importing torchvision imports Triton: ``triton_testing`` is imported first, which imports
Triton in interpreter mode (as in the kernel test modules), so that Triton's library
functions can be interpreted in this process.
"""

from __future__ import annotations

import copy
import functools
import json
import warnings

import pytest
import torch
from triton_testing import INTERPRET, fusion_benchmark

from explorer.fusion_engine import detect
from explorer.fusions import PATTERNS
from explorer.fusions.plan import make_plan
from explorer.fusions.rewrite import apply_plan
from explorer.graph.build import build_graph
from explorer.sources import capture, load_model
from explorer.sources.zoo import get_entry

MODELS = ("mobilenet_v2", "efficientnet_b0", "convnext_tiny")


@functools.lru_cache(maxsize=None)
def _architecture(name: str) -> torch.nn.Module:
    """The model as its builder makes it (the modules are the architecture; the weights do not matter here)."""
    return get_entry(name).builder()


def expected_counts(name: str) -> dict[str, int]:
    """Chains per pattern, from the blocks of the model torchvision builds (module docstring)."""
    from torchvision.models.convnext import CNBlock
    from torchvision.models.efficientnet import MBConv
    from torchvision.models.mobilenetv2 import InvertedResidual

    model = _architecture(name)
    if name == "convnext_tiny":
        from torchvision.models.convnext import LayerNorm2d

        # LayerNorm2d: the stem's (after its conv), one before each downsampling conv, the head's (before its linear)
        downsample = sum(isinstance(m, torch.nn.Sequential) and len(m) == 2 and isinstance(m[0], LayerNorm2d)
                         for m in model.features)
        return {"convnext_block": sum(isinstance(m, CNBlock) for m in model.modules()), "convnext_stem_ln": 1,
                "convnext_downsample_ln": downsample, "convnext_head_ln": 1}
    kind = InvertedResidual if name == "mobilenet_v2" else MBConv
    blocks = [m for m in model.modules() if isinstance(m, kind)]
    layers = [b.conv if name == "mobilenet_v2" else b.block for b in blocks]
    # with an expansion the block's layers are 4: expansion, depthwise, projection conv and its BatchNorm
    # (MobileNetV2), or expansion, depthwise, squeeze-excite and projection (EfficientNet); 3 without
    expanded = sum(len(seq) == 4 for seq in layers)
    residual = sum(b.use_res_connect for b in blocks)
    counts = {"conv_bn_act": 2 + expanded + len(blocks),      # stem + head, expansions, depthwise convs
              "conv_bn_add": residual, "conv_bn": len(blocks) - residual}
    if name == "efficientnet_b0":
        counts["squeeze_excite"] = len(blocks)
    return counts


def expected_shared_batch_norms(name: str) -> int:
    """Projections without a residual whose output the next block adds back: the first block of every stage
    that repeats (its BatchNorm output feeds the next block's conv and its add): a near miss of Conv+BN+Add."""
    from torchvision.models.efficientnet import MBConv
    from torchvision.models.mobilenetv2 import InvertedResidual

    kind = InvertedResidual if name == "mobilenet_v2" else MBConv
    blocks = [m for m in _architecture(name).modules() if isinstance(m, kind)]
    return sum(not a.use_res_connect and b.use_res_connect for a, b in zip(blocks, blocks[1:]))


@pytest.mark.parametrize("name", MODELS)
def test_detection_counts_derived_from_the_architecture(analyze_cached, name):
    _, _, det = analyze_cached(name)
    expected = expected_counts(name)
    assert {k: v for k, v in det.counts.items() if v} == expected
    assert set(det.counts) == {p.name for p in PATTERNS}
    if name != "convnext_tiny":
        shared = [m for m in det.near_misses if m.reason == "BatchNorm output has 2 consumers"]
        assert len(shared) == expected_shared_batch_norms(name) > 0
        assert all(m.pattern == "conv_bn_add" for m in shared)


def test_the_derivation_matches_the_papers_tables():
    """The derivation above, from the papers' tables instead of the modules: MobileNetV2 (t, c, n, s) and
    EfficientNet-B0 (expansion, layers, stride, channels)."""
    mbv2 = [(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1)]
    blocks = sum(n for _, _, n, _ in mbv2)
    residual = sum(n - 1 for _, _, n, _ in mbv2)             # repeats keep their channels and stride 1
    expanded = sum(n for t, _, n, _ in mbv2 if t != 1)
    assert expected_counts("mobilenet_v2") == {"conv_bn_act": 2 + expanded + blocks, "conv_bn_add": residual,
                                               "conv_bn": blocks - residual}
    b0 = [(1, 1, 1, 16), (6, 2, 2, 24), (6, 2, 2, 40), (6, 3, 2, 80), (6, 3, 1, 112), (6, 4, 2, 192), (6, 1, 1, 320)]
    blocks = sum(n for _, n, _, _ in b0)
    residual = sum(n - 1 for _, n, _, _ in b0)
    expanded = sum(n for t, n, _, _ in b0 if t != 1)
    assert expected_counts("efficientnet_b0") == {"conv_bn_act": 2 + expanded + blocks, "conv_bn_add": residual,
                                                  "conv_bn": blocks - residual, "squeeze_excite": blocks}
    assert expected_counts("convnext_tiny") == {"convnext_block": 3 + 3 + 9 + 3, "convnext_stem_ln": 1,
                                                "convnext_downsample_ln": 3, "convnext_head_ln": 1}


@pytest.mark.parametrize("name", MODELS)
def test_fused_model_matches_unfused(analyze_cached, name, monkeypatch):
    """Every chain fused, the CPU paths (no Triton): the same outputs as the original graph."""
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    model, _, det = analyze_cached(name)
    fused = apply_plan(model.gm, det, make_plan(det), "cpu")
    assert [a.status for a in fused.applied] == ["fused"] * len(det.chains)
    with torch.no_grad():
        ref, out = model.gm(*model.example_inputs), fused.gm(*model.example_inputs)
    assert (out - ref).abs().max().item() <= 1e-4 * ref.abs().max().item()


@pytest.mark.skipif(not INTERPRET, reason="the interpreter runs without CUDA, with Triton")
@pytest.mark.parametrize("name", ["efficientnet_b0", "convnext_tiny"])
def test_fused_model_through_the_triton_interpreter(name, monkeypatch, analyze_cached):
    """Every kernel of the model's chains (epilogue, depthwise, squeeze-excite, ConvNeXt block) in one forward,
    channels_last, at 32×32 so that Triton's interpreter takes seconds."""
    from explorer.fusions import triton_support

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    if not triton_support.library_reductions_usable():
        pytest.skip("Triton was first imported without TRITON_INTERPRET: its library functions cannot be interpreted")
    # A copy: the capture shares its parameters, and moving it to channels_last below would change the
    # cached model's weights' layout under every later test (torch's ONNX exporter then writes another graph).
    module = copy.deepcopy(analyze_cached(name)[0].module)
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    gm = capture(module, (x,), name)
    det = detect(build_graph(gm, name))
    fused = apply_plan(gm, det, make_plan(det), "cpu")
    # (ConvNeXt's head LayerNorm2d keeps torch's layer_norm where that measured faster: convnext.LN2D_MEASURED)
    assert all("triton" in a.implementation or "measured faster" in a.implementation
               for a in fused.applied), [a.implementation for a in fused.applied]
    gm, fgm = gm.to(memory_format=torch.channels_last), fused.gm.to(memory_format=torch.channels_last)
    x = x.contiguous(memory_format=torch.channels_last)
    with torch.no_grad():
        ref, out = gm(x), fgm(x)
    assert (out - ref).abs().max().item() <= 1e-5 * ref.abs().max().item()


# ---------------------------------------------------------------------- .pt2 and ONNX

@pytest.mark.parametrize("name", ["efficientnet_b0", "convnext_tiny"])
def test_pt2_detects_what_the_zoo_capture_does(name, tmp_path, analyze_cached):
    zoo_model = analyze_cached(name)[0]
    path = tmp_path / f"{name}.pt2"
    torch.export.save(torch.export.export(zoo_model.module, zoo_model.example_inputs), str(path))
    model = load_model(str(path))
    det = detect(build_graph(model.gm, model.name))
    assert {k: v for k, v in det.counts.items() if v} == expected_counts(name)


def _onnx_export(model, exporter: str, path: str):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model.module, model.example_inputs, path, dynamo=(exporter == "dynamo"))
    return model.example_inputs


@pytest.mark.parametrize("exporter", ["torchscript", pytest.param("dynamo", marks=pytest.mark.slow)])
@pytest.mark.parametrize("name", ["efficientnet_b0", "convnext_tiny"])
def test_onnx_import_matches_onnxruntime_and_detects(name, exporter, tmp_path, analyze_cached):
    """The ONNX graph imports, runs as onnxruntime does, and its chains are found. Exporters fold BatchNorm
    into the convolutions and write SiLU as ``x·sigmoid(x)`` (imported back as ``silu``), so EfficientNet's
    Conv+BN+SiLU chains are Conv+SiLU, its projections with a residual Conv+Add, and its squeeze-excite
    blocks are found as in the PyTorch capture; ConvNeXt's blocks are found whole."""
    ort = pytest.importorskip("onnxruntime")
    import numpy as np
    from torchvision.models.efficientnet import MBConv

    from explorer.sources.onnx_import import import_onnx

    path = str(tmp_path / f"{name}.onnx")
    args = _onnx_export(analyze_cached(name)[0], exporter, path)
    imported = import_onnx(path)
    with torch.no_grad():
        ours = imported.gm(*args)[0].numpy()
    want = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(
        None, {n: t.numpy() for n, t in zip(imported.input_names, args)})[0]
    scale = float(np.abs(want).max())
    np.testing.assert_allclose(ours, want, rtol=1e-4, atol=1e-4 * scale)
    det = detect(build_graph(imported.gm, name))
    if name == "convnext_tiny":
        assert det.counts["convnext_block"] == expected_counts(name)["convnext_block"]
    else:
        blocks = [m for m in _architecture(name).modules() if isinstance(m, MBConv)]
        want = expected_counts(name)
        assert det.counts["conv_add"] == sum(b.use_res_connect for b in blocks) == want["conv_bn_add"]
        assert det.counts["conv_act"] == want["conv_bn_act"]
        assert det.counts["squeeze_excite"] == want["squeeze_excite"]


# ---------------------------------------------------------------------- the benchmark script

def _bench():
    """``benchmarks/bench_cnn_fusions.py`` as a module."""
    return fusion_benchmark("bench_cnn_fusions")


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA present: the benchmark would run for real")
def test_bench_skips_cleanly_without_cuda(capsys):
    """Without CUDA (and without --smoke) the benchmark measures nothing, says so, and exits 0."""
    assert _bench().main(["--part", "models", "--models", "mobilenet_v2"]) == 0
    assert "SKIPPED" in capsys.readouterr().out


@pytest.mark.skipif(not INTERPRET, reason="needs Triton's interpreter (no CUDA here)")
def test_bench_smoke_run_writes_every_part(tmp_path, monkeypatch, capsys):
    """``--smoke`` on the CPU (kernels interpreted, one model on the CPU paths): every case and variant lands in
    the JSON with the command and the environment, each of our kernels passes its float64 check, each model
    variant is checked against float64, and the table is printed last."""
    from explorer.fusions import triton_support

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    if not triton_support.library_reductions_usable():
        pytest.skip("Triton was first imported without TRITON_INTERPRET: its library functions cannot be interpreted")
    out = tmp_path / "bench.json"
    assert _bench().main(["--smoke", "--part", "kernels,models", "--models", "mobilenet_v2", "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["command"] and doc["environment"]["torch"] and "SMOKE" in doc["label"]
    sections = {r["section"] for r in doc["kernels"]["rows"]}
    assert sections == {"epilogue", "conv", "dw+LN", "gemm", "se"}
    ours = [r for r in doc["kernels"]["rows"] if r["variant"].startswith("ours")]
    assert ours and all(r["check"] == "ok" for r in ours)
    model = doc["mobilenet_v2"]
    assert set(model["variants"]) == {"eager", "fused", "fused_depthwise_on_cudnn", "fused_gemms_on_cublas_cudnn"}
    assert all(c == "ok" for c in model["precision_check"].values())
    assert model["chains"]["conv_bn_add"] == expected_counts("mobilenet_v2")["conv_bn_add"]
    printed = capsys.readouterr().out
    assert printed.rstrip().splitlines()[-1].startswith("wrote ") and "mobilenet_v2 float32 batch 1" in printed
