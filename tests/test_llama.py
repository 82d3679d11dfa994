"""The Llama-style decoder of the zoo (``llama_decoder`` prefill, ``llama_decode_step``): detection counts
derived from its config, the fused graph against the unfused one, the model through .pt2 and ONNX, and
``benchmarks/bench_llm_fusions.py`` (its CPU smoke run, its clean skip without CUDA, its sm_90 compile check).

The rewrites run on the CPU with the Triton interpreter off (the fused calls take their reference ops,
the same maths as the unfused graph), except ``test_tiny_decoder_through_the_kernels``, which runs a
two-layer decoder of awkward sizes through the interpreted kernels in fp32 and bf16.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings

import pytest
import torch
from triton_testing import INTERPRET, detect_module, fuse_all, fusion_benchmark

from explorer.fusions import PATTERNS
from explorer.runtime import measure
from explorer.sources import models, zoo

pytest.importorskip("transformers")

try:
    import triton
except ImportError:  # no Triton: the sm_90 compile test skips
    triton = None

LAYERS = zoo.LLAMA["layers"]
BATCH, SEQ = 2, 16


def expected_counts(layers: int) -> dict[str, int]:
    """Chains per pattern in a Llama decoder of ``layers`` layers, from its architecture.

    Each layer has two residual adds, and each feeds an RMSNorm: the attention's sum feeds the
    layer's ``post_attention_layernorm``, the MLP's sum the next layer's ``input_layernorm`` (after
    the last layer, the final norm): 2 Add+RMSNorm per layer. The first layer's ``input_layernorm``
    reads the embeddings, with no add before it: 1 plain RMSNorm. Every norm's readers are linears (Q/K/V,
    gate/up, the LM head), so each has its γ folded (rms_fold, add_rms_fold). Per layer, one SwiGLU MLP, one
    rotary embedding of q and k, and one group of Q/K/V projections. Nothing else fuses.
    """
    counts = {p.name: 0 for p in PATTERNS}
    counts.update(add_rms_fold=2 * layers, rms_fold=1, swiglu=layers, rotary=layers, linear_siblings=layers)
    return counts


def _clone(inputs):
    """Fresh copies (the decode step updates its cache inputs in place)."""
    return tuple(t.clone() for t in inputs)


@pytest.fixture(autouse=True)
def _plain_cpu_paths(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    monkeypatch.setenv("EXPLORER_GENERIC_COMPILE", "0")


@pytest.mark.parametrize("name", ["llama_decoder", "llama_decode_step"])
def test_detection_counts_follow_the_architecture(analyze_cached, name):
    """Counts per pattern from ``expected_counts``; every sum but the final norm's leaves its chain (the
    next residual reads it); the Q/K/V groups are three linears; the zoo lists both models."""
    model, graph, det = analyze_cached(name, BATCH, SEQ)
    assert det.counts == expected_counts(LAYERS)
    adds = [c for c in det.chains if c.pattern == "add_rms_fold"]
    assert [bool(c.extra_outputs) for c in adds] == [True] * (2 * LAYERS - 1) + [False]
    assert all(c.ops == ("linear",) * 3 for c in det.chains if c.pattern == "linear_siblings")
    assert all(c.ops == ("mul", "neg", "cat", "mul", "add") * 2 for c in det.chains if c.pattern == "rotary")
    assert name in {e.name for e in zoo.menu()} and model.task == "classification"


def test_decode_step_inputs_are_a_static_cache():
    """The decode step takes one token per sequence and a key and a value cache per layer, (B, kv_heads, S, D)."""
    entry = zoo.get_entry("llama_decode_step")
    inputs = entry.example_inputs(batch=3, seq_len=24)
    head_dim = zoo.LLAMA["hidden"] // zoo.LLAMA["heads"]
    assert inputs[0].shape == (3, 1) and len(inputs) == 1 + 2 * LAYERS
    assert all(t.shape == (3, zoo.LLAMA["kv_heads"], 24, head_dim) for t in inputs[1:])


@pytest.mark.parametrize("name", ["llama_decoder", "llama_decode_step"])
def test_fused_decoder_equals_unfused(analyze_cached, name):
    """Every chain fuses; fp32 outputs (and the decode step's updated caches) match the unfused graph; in
    float64 (the model converted first, so the concatenated weights are float64 too) to 1e-9."""
    from explorer.fusion_engine import fuse
    from explorer.fusions.plan import make_plan
    from explorer.fusions.rewrite import apply_plan

    analysis = analyze_cached(name, BATCH, SEQ)
    model, _, det = analysis
    fused = fuse(analysis)
    assert [a.status for a in fused.applied] == ["fused"] * len(det.chains)
    before, after = _clone(model.example_inputs), _clone(model.example_inputs)
    with torch.no_grad():
        want, got = model.gm(*before), fused.gm(*after)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    for a, b in zip(before[1:], after[1:]):                                       # the caches, updated alike
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-5)
    gm64 = measure.prepare_graph(model.gm, "cpu", torch.float64, lean=False)    # capture-time dtype asserts dropped
    x64 = measure.prepare_inputs(model.example_inputs, "cpu", torch.float64)
    fused64 = apply_plan(gm64, det, make_plan(det, "all"))
    with torch.no_grad():
        want64, got64 = gm64(*_clone(x64)), fused64.gm(*_clone(x64))
    assert (got64 - want64).abs().max() <= 1e-9 * want64.abs().max()


TINY = dict(layers=2, hidden=120, heads=3, kv_heads=1, intermediate=200, vocab=64, max_positions=64)


@pytest.mark.skipif(not INTERPRET, reason="needs Triton's interpreter (no CUDA here)")
def test_tiny_decoder_through_the_kernels(monkeypatch):
    """A two-layer decoder of awkward sizes (head_dim 40, GQA 3 over 1, I = 200) through the interpreted
    kernels: fp32 within 1e-5 of the unfused graph; in bf16 (graphs prepared as the runner prepares
    them, the SwiGLU call lowered) no less accurate than the unfused graph, both against float64."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    torch.manual_seed(0)
    module = models.LlamaDecoder(TINY).eval()
    ids = torch.randint(0, TINY["vocab"], (2, 5))
    gm, det = detect_module(module, (ids,), "tiny_llama")
    assert det.counts == expected_counts(TINY["layers"])
    fused = fuse_all(gm, det)
    assert all(a.fused_kernel for a in fused.applied), [a.implementation for a in fused.applied]
    with torch.no_grad():
        torch.testing.assert_close(fused.gm(ids), gm(ids), rtol=1e-5, atol=1e-5)
        ref64 = measure.prepare_graph(gm, "cpu", torch.float64)(ids).double()
        errors = {}
        for label, graph in (("unfused", gm), ("fused", fused.gm)):
            prepared = measure.prepare_graph(graph, "cpu", torch.bfloat16)
            errors[label] = (prepared(ids).double() - ref64).pow(2).mean().sqrt().item()
    assert errors["fused"] <= 1.1 * errors["unfused"], errors


def test_the_decode_step_through_pt2_is_refused_in_one_line(tmp_path):
    """A decode step writes its static KV cache, a graph input, in place (``index_copy_``): the .pt2 reader
    runs only what writes into values the graph computed itself (``explorer.sources.pure_ops``, issue 19),
    so the archive is refused in one line naming the op. The zoo's own capture still measures it."""
    from explorer.errors import ModelLoadError
    from explorer.sources import load_model

    entry = zoo.get_entry("llama_decode_step")
    module, inputs = entry.build(), entry.example_inputs(batch=BATCH, seq_len=SEQ)
    with torch.no_grad():
        program = torch.export.export(module, _clone(inputs))
    torch.export.save(program, str(tmp_path / "step.pt2"))
    with pytest.raises(ModelLoadError) as err:
        load_model(str(tmp_path / "step.pt2"))
    assert "writes its argument" in str(err.value) and "an input" in str(err.value)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("name", ["llama_decoder"])
def test_through_pt2(tmp_path, name):
    """Saved with ``torch.export.save`` and loaded through the explorer's .pt2 reader: the same counts, and
    the same logits as the module."""
    from explorer.fusion_engine import detect
    from explorer.graph.build import build_graph
    from explorer.sources import load_model

    entry = zoo.get_entry(name)
    module, inputs = entry.build(), entry.example_inputs(batch=BATCH, seq_len=SEQ)
    with torch.no_grad():
        program = torch.export.export(module, _clone(inputs))
    torch.export.save(program, str(tmp_path / f"{name}.pt2"))
    loaded = load_model(str(tmp_path / f"{name}.pt2"))
    assert detect(build_graph(loaded.gm, name)).counts == expected_counts(LAYERS)
    with torch.no_grad():
        torch.testing.assert_close(loaded.gm(*_clone(inputs)), module(*_clone(inputs)), rtol=1e-5, atol=1e-5)


def test_through_onnx(tmp_path):
    """Exported by the dynamo ONNX exporter (the TorchScript exporter cannot export ``aten::diff``) and
    imported: the logits of onnxruntime and of the module, and the same chains: the exporter writes rsqrt
    as reciprocal(sqrt), silu as x·sigmoid(x), folds the rotary tables into constants, and decomposes
    SDPA into matmul, softmax, matmul (one more chain per layer, matmul_softmax). Fused, the same logits."""
    import numpy as np

    from explorer.fusion_engine import detect
    from explorer.graph.build import build_graph
    from explorer.sources.onnx_import import import_onnx

    ort = pytest.importorskip("onnxruntime")
    entry = zoo.get_entry("llama_decoder")
    module, inputs = entry.build(), entry.example_inputs(batch=1, seq_len=SEQ)
    path = str(tmp_path / "llama.onnx")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(module, inputs, path, dynamo=True)
    imported = import_onnx(path)
    with torch.no_grad():
        ours, want = imported.gm(*inputs)[0], module(*inputs)
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    theirs = session.run(None, {n: t.numpy() for n, t in zip(imported.input_names, inputs)})[0]
    np.testing.assert_allclose(ours.numpy(), theirs, rtol=1e-4, atol=1e-4 * float(np.abs(theirs).max()))
    torch.testing.assert_close(ours, want, rtol=1e-4, atol=1e-4)
    det = detect(build_graph(imported.gm, "llama_onnx"))
    assert det.counts == dict(expected_counts(LAYERS), matmul_softmax=LAYERS)
    fused = fuse_all(imported.gm, det)
    assert {a.status for a in fused.applied} == {"fused"}
    with torch.no_grad():
        torch.testing.assert_close(fused.gm(*inputs)[0], ours, rtol=1e-5, atol=1e-5)


# ====================================================================== the benchmark script

def _bench():
    """``benchmarks/bench_llm_fusions.py`` as a module."""
    return fusion_benchmark("bench_llm_fusions")


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA present: the benchmark would run for real")
def test_bench_skips_cleanly_without_cuda(capsys):
    """Without CUDA (and without --smoke) the benchmark measures nothing, says so, and exits 0."""
    assert _bench().main(["--quick"]) == 0
    assert "SKIPPED" in capsys.readouterr().out


@pytest.mark.skipif(not INTERPRET, reason="needs Triton's interpreter (no CUDA here)")
def test_bench_smoke_run_writes_every_part(tmp_path, monkeypatch, capsys):
    """``--smoke`` on the CPU (kernels interpreted): every part runs and lands in the JSON with its command and
    environment; each kernel variant is checked against eager, each model variant against float64, and the
    table is printed last."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    out = tmp_path / "bench.json"
    assert _bench().main(["--smoke", "--part", "kernels,prefill,decode", "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["command"] and doc["environment"]["torch"] and doc["label"].startswith("SMOKE")
    rows = doc["kernels"]["rows"]
    assert {r["kernel"] for r in rows} == {"add_rms_norm", "rms_norm", "silu_mul", "rotary"}
    assert all(r["check"] in ("ok", "n/a") for r in rows) and {r["variant"] for r in rows} == {"copy", "fused", "eager"}
    assert all(r["ms_p20"] <= r["ms_p50"] <= r["ms_p80"] for r in rows)
    assert len(doc["kernels"]["verdicts"]) == 4                       # Add+RMSNorm bf16/fp32, silu_mul, packed
    for part in ("prefill", "decode"):
        variants = doc[part]["variants"]
        assert set(variants) == {"eager", "graph", "fused"}
        assert all(v["precision"]["rel_l2"] < 1e-5 for v in variants.values())
        assert {a["status"] for a in doc[part]["applied"]} == {"fused"}
    printed = capsys.readouterr().out
    assert "llama_decode_step" in printed and printed.rstrip().endswith(str(out))


@pytest.mark.skipif(not os.path.exists(os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin",
                                                    "ptxas")) if triton else True,
                    reason="Triton's bundled ptxas is not available")
def test_kernels_compile_for_sm90_without_spills():
    """The interpreter accepts code the compiler may reject: ``--aot-check`` compiles every kernel for sm_90 in a
    fresh process (interpreter off) and there must be no register spills, and 16-byte vector loads and stores
    at Llama sizes (hidden 4096, intermediate 11008, head_dim 128)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    script = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks",
                          "bench_llm_fusions.py")
    proc = subprocess.run([sys.executable, script, "--aot-check"], env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    lines = proc.stdout.splitlines()
    titles, memory_ops = lines[::2], lines[1::2]
    assert len(titles) == 18 and all("STACK:0 " in t for t in titles), proc.stdout
    for title, ops in zip(titles, memory_ops):
        if any(size in title for size in ("N=4096", "N=16384", "x11008", "D128")):
            assert ".v4.b32" in ops and "st.global.v4.b32" in ops, (title, ops)
