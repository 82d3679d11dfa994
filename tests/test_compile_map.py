"""torch.compile's kernels mapped onto our graph (``explorer.runtime.compile_map``), the comparison with
our chains, the ``compare-compile`` command, the Graph page's torch.compile / compare views and overlays.

Compiles on the CPU (inductor's C++ kernels) three small models, once each for the module: the zoo's
ResNet-style ``residual_block`` through the child process and its cache, the zoo's BERT-style
``transformer_block`` (post-norm, explicit attention) and a one-layer Llama-style decoder (hidden 64)
in this process. Each mapping is checked against what inductor itself wrote: the launch sites of its output
code and the kernels that code defines. The GPU version (Triton kernels) is marked ``gpu``.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from collections import Counter
from pathlib import Path

import pytest
import torch

from explorer.errors import RunError
from explorer.fusion_engine import analyze, detect
from explorer.graph.build import build_graph
from explorer.runtime import compile_map as cm
from explorer.sources import LoadedModel, capture

HAS_CUDA = torch.cuda.is_available()
APP = str(Path(__file__).resolve().parent.parent / "explorer" / "app.py")
#: Shared with tests/test_browser_compile.py (``$FUSION_EXPLORER_CACHE`` = ``CACHE_ROOT``): entries are keyed by
#: graph, sizes, device, dtype, mode, torch and compile_map's own code, so one is never stale.
CACHE_ROOT = Path(tempfile.gettempdir()) / "fusion-explorer-tests-cache"
CACHE = CACHE_ROOT / "compile_map"


def tiny_bert() -> tuple[LoadedModel, object]:
    from explorer.sources.models import BertEncoderOnly

    torch.manual_seed(0)
    module = BertEncoderOnly.from_config_sizes(1, 64, 4, 128).eval()
    inputs = (torch.randint(0, 30522, (1, 16)), torch.ones(1, 16, dtype=torch.int64))
    gm = capture(module, inputs, "tiny_bert")
    return LoadedModel("tiny_bert", "zoo", gm, inputs, ["input_ids", "attention_mask"], batch=1, seq_len=16), module


def tiny_llama() -> LoadedModel:
    from explorer.sources.models import LlamaDecoder

    torch.manual_seed(0)
    sizes = dict(layers=1, hidden=64, heads=4, kv_heads=2, intermediate=96, vocab=128, max_positions=64)
    module = LlamaDecoder(sizes).eval()
    inputs = (torch.randint(0, 128, (1, 8)),)
    return LoadedModel("tiny_llama", "zoo", capture(module, inputs, "tiny_llama"), inputs, ["input_ids"],
                       batch=1, seq_len=8)


@pytest.fixture(scope="module")
def residual():
    """residual_block compiled through the child process (and cached in ``CACHE``)."""
    analysis = analyze("residual_block")
    cmap, comparison = cm.for_analysis(analysis, "residual_block", "cpu", "fp32", directory=CACHE, timeout_s=600)
    return analysis, cmap, comparison


@pytest.fixture(scope="module")
def bert():
    """The zoo's BERT-style block (post-norm encoder layer: explicit attention, Add+LayerNorm, GELU MLP)."""
    model, graph, det = analyze("transformer_block")
    cmap = cm.map_loaded(model, "cpu", "fp32")
    return graph, det, cmap, cm.compare(det.chains, graph, cmap)


@pytest.fixture(scope="module")
def llama():
    model = tiny_llama()
    graph = build_graph(model.gm, model.name)
    det = detect(graph)
    cmap = cm.map_loaded(model, "cpu", "fp32")
    return graph, det, cmap, cm.compare(det.chains, graph, cmap)


def _check_mapping(graph, cmap) -> None:
    """Every kernel maps to >= 1 node of ours, no node is owned twice, the kernels are inductor's
    (``compile_map.problems``: against the launch sites and kernel definitions of its output code)."""
    assert cm.problems(cmap, graph) == []
    assert all(k.kind in cm.KINDS for k in cmap.kernels)
    assert len(cmap.kernels) == cmap.launch_sites and len(cmap.defined) <= cmap.generated_kernel_count
    assert not set(cmap.removed) & set(cmap.owner())


def test_residual_block_kernels_map_to_our_nodes(residual):
    analysis, cmap, comparison = residual
    _check_mapping(analysis.graph, cmap)
    assert cmap.device == "cpu" and cmap.fingerprint == analysis.detection.fingerprint
    owner = cmap.owner()
    convs = [n for n, a in analysis.graph.nodes(data=True) if a["kind"] == "conv"]
    assert len(convs) == 2
    for conv in convs:   # convolutions are extern calls on the CPU; inductor fuses BN + ReLU (+ add) after them
        assert owner[conv].kind == "extern" and owner[conv].nodes == (conv,)
    for chain in analysis.detection.chains:
        rest = [n for n in chain.compute_nodes if analysis.graph.nodes[n]["kind"] != "conv"]
        assert len({owner[n].key for n in rest}) == 1, chain.id     # the epilogue in one C++ kernel
        assert owner[rest[0]].kind == "cpp"
    assert {c.status for c in comparison.chains} == {"partly"}
    assert sorted(n for n, _, _ in comparison.separate) == sorted(convs)
    assert comparison.only_inductor == ()


def test_bert_block_kernels_map_to_our_nodes(bert):
    graph, det, cmap, comparison = bert
    _check_mapping(graph, cmap)
    # inductor's pattern matcher replaces matmul → softmax → matmul by one SDPA call: our MatMul+Softmax chain
    # is inside that one extern kernel, placed there by dataflow
    chain = next(c for c in det.chains if c.pattern == "matmul_softmax")
    assert comparison.status_of()[chain.id] == "both"
    sdpa = cmap.owner()[chain.compute_nodes[0]]
    assert "scaled_dot_product" in sdpa.name and sdpa.kind == "extern" and sdpa.replaced
    status = comparison.status_of()
    by_pattern = Counter((det.chain(c).pattern, s) for c, s in status.items())
    # Add+LayerNorm: one inductor kernel, as for us (the residual add with the norm after it)
    assert by_pattern[("add_layer_norm", "both")] == sum(1 for c in det.chains if c.pattern == "add_layer_norm") > 0
    # the GEMMs are extern calls; the linear's activation is a kernel of its own
    owner = cmap.owner()
    linears = [n for n, a in graph.nodes(data=True) if a["kind"] == "linear"]
    assert linears and all(owner[n].kind == "extern" for n in linears)
    assert all(owner[n].library == "ATen (BLAS)" for n in linears)


def test_llama_block_kernels_map_to_our_nodes(llama):
    graph, det, cmap, comparison = llama
    _check_mapping(graph, cmap)
    owner = cmap.owner()
    sdpa = [n for n, a in graph.nodes(data=True) if a["kind"] == "sdpa"]
    assert len(sdpa) == 1 and owner[sdpa[0]].kind == "extern" and "scaled_dot_product" in owner[sdpa[0]].name
    status = comparison.status_of()
    norms = [c.id for c in det.chains if c.pattern in ("rms_norm", "add_rms_norm", "rms_fold", "add_rms_fold")]
    assert norms and all(status[c] in ("both", "partly") for c in norms)
    swiglu = [c for c in det.chains if c.pattern == "swiglu"]
    assert len(swiglu) == 1 and status[swiglu[0].id] == "partly"   # two GEMMs, then silu(gate)·up in one kernel
    # inductor fuses the rotary embedding's table math with the attention's input copies: a group of ours it
    # spreads further than we do
    assert comparison.only_inductor and all(len(g.ops) >= 2 for g in comparison.only_inductor)


def test_cache_answers_without_a_child_and_keys_on_the_mode(residual):
    analysis, cmap, _ = residual
    t0 = time.perf_counter()
    again, _ = cm.for_analysis(analysis, "residual_block", "cpu", "fp32", directory=CACHE)
    assert time.perf_counter() - t0 < 2.0 and again == cmap
    assert cm.cached_map(cmap.fingerprint, "cpu", "fp32", "max-autotune", 1, None, CACHE) is None
    assert cm.cached_map(cmap.fingerprint, "cpu", "bf16", "default", 1, None, CACHE) is None
    assert cm.cached_map("0" * 16, "cpu", "fp32", "default", 1, None, CACHE) is None


def test_problems_are_found(residual):
    """The checks fail on a map that is wrong: a node owned twice, a kernel count off by one, a lost op."""
    import dataclasses

    analysis, cmap, _ = residual
    first, second = cmap.kernels[1], cmap.kernels[2]
    doubled = dataclasses.replace(cmap, kernels=(cmap.kernels[0], first,
                                                 dataclasses.replace(second, nodes=second.nodes + first.nodes),
                                                 *cmap.kernels[3:]))
    assert any("owned by two kernels" in p for p in cm.problems(doubled, analysis.graph))
    assert any("launch sites" in p for p in cm.problems(dataclasses.replace(cmap, launch_sites=cmap.launch_sites + 1),
                                                        analysis.graph))
    lost = dataclasses.replace(cmap, kernels=tuple(dataclasses.replace(k, nodes=()) if k.nodes == ("conv2d",) else k
                                                   for k in cmap.kernels))
    assert any("ops no kernel computes: conv2d" in p for p in cm.problems(lost, analysis.graph))


def test_h200_script_checks_with_the_same_rules(residual):
    from benchmark_scripts import load

    analysis, cmap, comparison = residual
    script = load("compile_map_h200")
    entry = script.entry(analysis, cmap, comparison)
    assert entry["problems"] == [] and entry["kernels"] == len(cmap.kernels)
    assert entry["kinds"] == dict(Counter(k.kind for k in cmap.kernels))
    assert entry["chains"] == {"partly": len(analysis.detection.chains)}


def test_one_line_errors(tmp_path):
    analysis = analyze("conv_bn_relu")
    with pytest.raises(RunError, match="unknown torch.compile mode"):
        cm.for_analysis(analysis, "conv_bn_relu", "cpu", "fp32", mode="fastest", directory=tmp_path)
    with pytest.raises(RunError, match="timed out") as info:
        cm.for_analysis(analysis, "conv_bn_relu", "cpu", "fp32", directory=tmp_path, timeout_s=0.5)
    assert "\n" not in str(info.value)
    (tmp_path / "damaged.json").write_text("{not json")
    with pytest.raises(RunError, match="malformed"):
        cm.CompileMap.from_dict({"schema": cm.SCHEMA}, "x")


def test_provenance_rules_on_a_written_record():
    """The ownership rules on inductor's record as it writes it: an extern call owns the op it calls and not
    the pointwise ops listed with it; a layout copy touches its conv; views own nothing; a node a pattern
    replacement removed goes to the kernel its result reaches."""
    provenance = {
        "postToPre": {"convolution": ["conv2d"], "mul": ["batch_norm"], "relu": ["relu"], "view": ["flat"],
                      "sdpa_out": [], "getitem": ["matmul_1"]},
        "cppCodeToPost": {"cpp_fused_convolution_0:1": ["convolution"], "extern_kernels.convolution:2": ["convolution"],
                          "cpp_fused_relu_1:3": ["mul", "relu"],
                          "torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default:4": ["sdpa_out", "relu",
                                                                                                   "view"]},
    }
    post_graph = {"convolution": (False, (), "aten.convolution.default"), "mul": (False, ("convolution",), "aten.mul.Tensor"),
                  "relu": (False, ("mul",), "aten.relu.default"), "view": (True, ("relu",), "aten.view.default"),
                  "sdpa_out": (False, ("view",), "aten._scaled_dot_product_flash_attention_for_cpu.default"),
                  "getitem": (True, ("sdpa_out",), "<built-in function getitem>")}
    pre = {n: n for n in ("conv2d", "batch_norm", "relu", "flat", "matmul", "softmax", "matmul_1")}
    ours = {"conv2d": ["batch_norm"], "batch_norm": ["relu"], "relu": ["flat"], "flat": ["matmul"],
            "matmul": ["softmax"], "softmax": ["matmul_1"], "matmul_1": []}
    kernels, unmapped, placed, gone = cm.kernels_from_provenance(provenance, pre, "cpu", post_graph, ours)
    assert gone == []
    by = {k.key: k for k in kernels}
    assert unmapped == []
    assert by["extern_kernels.convolution:2"].nodes == ("conv2d",)
    assert by["cpp_fused_convolution_0:1"].nodes == () and by["cpp_fused_convolution_0:1"].touches == ("conv2d",)
    assert by["cpp_fused_relu_1:3"].nodes == ("batch_norm", "relu")
    sdpa = by["torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default:4"]
    assert set(sdpa.nodes) == {"matmul", "softmax", "matmul_1"} and set(sdpa.replaced) == {"matmul", "softmax"}
    assert "relu" in sdpa.touches and "flat" in sdpa.touches
    assert [k.kind for k in kernels] == ["cpp", "extern", "cpp", "extern"]
    assert cm.library_of("extern_kernels.mm", "cuda") == "cuBLAS" and cm.library_of("extern_kernels.convolution",
                                                                                   "cuda") == "cuDNN"
    assert cm.kind_of("triton_red_fused_native_layer_norm_0") == "triton_reduction"
    assert cm.kind_of("triton_tem_fused_mm_0") == "triton_template"


def test_align_nodes_follows_dynamo_renames():
    ours = [("linear", "aten.linear.default"), ("unbind", "aten.unbind.int"), ("Conv_0", "aten.conv2d.default")]
    theirs = [("linear", "aten.linear.default"), ("unbind_int", "aten.unbind.int"), ("conv2d", "aten.conv2d.default")]
    assert cm.align_nodes(ours, theirs) == {"linear": "linear", "unbind_int": "unbind", "conv2d": "Conv_0"}


def test_compare_compile_command(residual, capsys, monkeypatch):
    from explorer import cli

    analysis, cmap, _ = residual
    monkeypatch.setenv(cm.CACHE_ENV, str(CACHE_ROOT))
    assert cli.main(["compare-compile", "residual_block", "--device", "cpu", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["compile_map"]["kernels"] == [k.to_dict() for k in cmap.kernels]
    assert {c["status"] for c in out["comparison"]["chains"]} == {"partly"}
    assert cli.main(["compare-compile", "residual_block", "--device", "cpu"]) == 0
    text = capsys.readouterr().out
    assert "5 kernels" in text or f"{len(cmap.kernels)} kernels" in text
    for k in cmap.kernels:
        assert k.key in text
    assert "ops inductor leaves as separate kernels (2)" in text
    assert cli.main(["compare-compile", "no_such_model"]) == 2


# ------------------------------------------------------------------ overlays and the drawing (pure)

def _report_for(analysis):
    """A typed report of ``analysis``'s model: chain 0 faster (0.5 of the time), chain 1 slower."""
    import dataclasses

    from report_samples import sample_report

    base = sample_report()
    ids = [c.id for c in analysis.detection.chains]
    chains = (dataclasses.replace(base.chains[0], id=ids[0], bytes_unfused=3 << 20, bytes_fused=1 << 20,
                                  launches_unfused=3, launches_fused=1, rel_err=2e-7, rel_err_unfused=1e-7),
              dataclasses.replace(base.chains[1], id=ids[1], bytes_unfused=4 << 20, bytes_fused=1 << 20,
                                  launches_unfused=4, launches_fused=1, rel_err=1e-7, rel_err_unfused=1e-7))
    fp = analysis.detection.fingerprint
    return dataclasses.replace(base, chains=chains, model=dataclasses.replace(base.model, fingerprint=fp,
                                                                                name="residual_block"),
                               plan=dataclasses.replace(base.plan, fingerprint=fp))


def test_overlay_colours_legend_and_export():
    from explorer.ui import graph as graph_view
    from explorer.ui import graph_overlays as go

    analysis = analyze("residual_block")
    det = analysis.detection
    report = _report_for(analysis)
    values = go.overlay_values("speedup", report, det)
    a, b = det.chains[0].id, det.chains[1].id
    assert values[a].value > 1 > values[b].value and values[a].verdict == "faster" and values[b].verdict == "slower"
    scale = go.scale_for("speedup", values)
    green, red = go.color_for(scale, values[a].value), go.color_for(scale, values[b].value)
    assert go._rgb(green)[1] > go._rgb(green)[0] and go._rgb(red)[0] > go._rgb(red)[1]
    assert go.overlay_values("bytes", report, det)[b].value == 3 << 20
    assert go.overlay_values("launches", report, det)[a].value == 2
    assert go.overlay_values("precision", report, det)[a].value == pytest.approx(2.0)
    assert go.overlay_values("predicted", report, det, {a: 2.0})[a].value == pytest.approx(values[a].value / 2)
    other = dict(report.to_dict())   # another graph's report colours nothing
    other["model"] = dict(other["model"], fingerprint="feedfacefeedface")
    assert go.overlay_values("speedup", other, det) == {}

    view = graph_view.build_view(analysis.graph, det, [c.id for c in det.chains])
    painted = go.paint(view, go.overlay_paint("speedup", values, det, scale, "zh"))
    node = next(vn for vn in painted.nodes if vn.chain == b)
    assert node.fill == red and "结论：更慢" in node.title
    html = graph_view.render_html(painted)
    legend = go.scale_legend_html("speedup", scale, "en")
    out = go.decorate(html, painted, legend, "overlay", "residual_block")
    assert "id='fe-legend'" in out and "window.FE.layer = \"overlay\"" in out and "measured speed-up" in out
    assert "<title>residual_block</title>" in out
    assert go.export_html(out).decode() == out and graph_view.remote_urls(out) == []
    with pytest.raises(ValueError):
        go.export_html(out.replace("</head>", "<script src='https://cdn.example/x.js'></script></head>"))


def test_kernel_and_compare_bands(residual):
    from explorer.ui import graph as graph_view
    from explorer.ui import graph_overlays as go

    analysis, cmap, comparison = residual
    det_k, kernels = go.kernel_detection(analysis.graph, cmap)
    assert len(det_k.chains) == sum(1 for k in cmap.kernels if k.nodes)
    view = go.paint(graph_view.build_view(analysis.graph, det_k, [c.id for c in det_k.chains]),
                    go.kernel_paint(kernels))
    titles = {b.title for b in view.bands}
    assert all(any(k.name in t for t in titles) for k in cmap.kernels if k.nodes)
    assert any("(extern ATen (oneDNN))" in t for t in titles) and any("(C++)" in t for t in titles)
    det_c, category = go.compare_detection(analysis.graph, analysis.detection, comparison)
    chains, nodes = go.compare_paint(category, comparison, analysis.graph, cmap)
    assert set(category.values()) == {"partly"} and set(chains) == {c.id for c in analysis.detection.chains}
    assert all(p.fill == go.COMPARE_COLORS["partly"] for p in chains.values())
    legend = go.compare_legend_html(comparison, "zh")
    assert "只有我们融合" in legend and "inductor 只融合一部分" in legend


# ------------------------------------------------------------------ the Graph page (AppTest, both languages)

def test_graph_page_compile_compare_and_overlay_views(residual, monkeypatch):
    from streamlit.testing.v1 import AppTest

    analysis, cmap, comparison = residual
    monkeypatch.setenv(cm.CACHE_ENV, str(CACHE_ROOT))
    at = AppTest.from_file(APP, default_timeout=180)
    at.session_state["zoo_name"] = "residual_block"
    at.run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    at.segmented_control(key="graph_mode").set_value("compile").run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    assert any(f"**{len(cmap.kernels)}** inductor kernels" in m.value for m in at.markdown)
    assert at.get("download_button")
    at.segmented_control(key="graph_mode").set_value("compare").run()
    assert not at.exception and not at.error
    shown = [str(row) for row in at.dataframe[0].value.to_dict("records")]
    assert len(shown) == len(analysis.detection.chains) and all("inductor fuses part" in r for r in shown)
    at.radio(key="lang").set_value("zh").run()
    assert not at.exception
    assert any(f"**{len(cmap.kernels)}** 个 inductor 内核" in m.value for m in at.markdown)
    assert "inductor 只融合一部分" in str(at.dataframe[0].value.to_dict("records"))
    # overlays: none without a report, then the last report's speed-ups, kept in the fused view
    at.segmented_control(key="graph_mode").set_value("original").run()
    at.selectbox(key="graph_overlay").set_value("speedup").run()
    assert any("还没有这个模型的报告" in i.value for i in at.info)
    at.session_state["last_report"] = ("test report", _report_for(analysis))
    at.radio(key="lang").set_value("en").run()
    assert any("Chains coloured by measured speed-up" in c.value for c in at.caption)
    at.segmented_control(key="graph_mode").set_value("fused").run()
    assert not at.exception and not at.error and at.selectbox(key="graph_overlay").value == "speedup"
    assert any("Chains coloured by measured speed-up" in c.value for c in at.caption)


# ------------------------------------------------------------------ on the GPU: Triton kernels

@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device")
def test_mapping_on_the_gpu(tmp_path):
    analysis = analyze("residual_block")
    cmap, comparison = cm.for_analysis(analysis, "residual_block", "cuda", "fp16", directory=tmp_path)
    _check_mapping(analysis.graph, cmap)
    assert any(k.kind.startswith("triton") for k in cmap.kernels)
    assert cmap.generated_kernel_count >= len(cmap.defined)
    model, _ = tiny_bert()
    graph = build_graph(model.gm, model.name)
    gmap = cm.map_loaded(model, "cuda", "fp16")
    _check_mapping(graph, gmap)
    assert {k.library for k in gmap.kernels if k.kind == "extern"} >= {"cuBLAS"}


def test_unclaimed_lists_what_no_chain_alternative_or_near_miss_touches(bert):
    """``compile_map.unclaimed`` (the corpus check's reading, issue 20): on the zoo's BERT block every kernel of
    inductor's that fuses ops a family of ours covers is touched by one of our chains, alternatives or near
    misses; with detection's findings taken away, those kernels are listed, each with the families covering
    its op kinds, and a kernel whose kinds no family takes is not."""
    import dataclasses

    from explorer.fusions import PATTERNS

    graph, det, cmap, comparison = bert
    assert cm.unclaimed(comparison, det, PATTERNS) == ()
    nothing = dataclasses.replace(det, chains=(), near_misses=(), alternatives=())
    missed = cm.unclaimed(cm.compare((), graph, cmap), nothing, PATTERNS)
    assert missed and all(u.patterns and len(u.ops) >= 2 for u in missed)
    assert {u.kernel for u in missed} <= {g.kernel for g in cm.compare((), graph, cmap).only_inductor}
    assert cm.covering_patterns(("add", "layer_norm"), PATTERNS) and not cm.covering_patterns(("sort", "cumsum"),
                                                                                                 PATTERNS)
