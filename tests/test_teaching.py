"""The teaching engine: time breakdown, traffic, ceilings, predictions, precision bisect, worked examples,
the teaching report and its GPU script's CPU path. All on the CPU, on the zoo's teaching models."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from explorer.errors import ReportError
from explorer.fusion_engine import fuse
from explorer.fusions.conv import FOLD_TOLERANCE_F64, fold_conv_bn
from explorer.graph import aten
from explorer.runtime import breakdown as bd
from explorer.runtime import ceilings as ceil
from explorer.runtime import measure as m
from explorer.runtime import traffic as tr
from explorer.runtime.bisect import default_fuse, precision_bisect
from explorer.teaching import examples as ex
from explorer.teaching import predict as pr
from explorer.teaching import readers
from explorer.teaching import report as trep

ROOT = Path(__file__).resolve().parents[1]
QUICK = m.TimingPlan(warmup=1, reps=3)


@pytest.fixture(scope="module")
def residual(analyze_cached):
    return analyze_cached("residual_block")


@pytest.fixture(scope="module")
def transformer(analyze_cached):
    return analyze_cached("transformer_block")


# ------------------------------------------------------------------ breakdown

def test_breakdown_categories_add_up_to_the_wall_time_and_follow_the_rule():
    ridge = 100.0
    kernels = [
        bd.KernelTime("sm90_xmma_gemm_f16f16_f16f32", 40.0, "mm", flops=1e9, nbytes=1e6),   # 1000 FLOP/B: compute
        bd.KernelTime("sm90_xmma_gemm_f16f16_f16f32", 10.0, "mm_small", flops=1e6, nbytes=1e6),  # 1 FLOP/B: memory
        bd.KernelTime("void at::native::vectorized_elementwise_kernel<4>", 20.0, "relu", flops=1e6, nbytes=8e6),
        bd.KernelTime("Memcpy DtoD (Device -> Device)", 5.0, ""),
        bd.KernelTime("cutlass_80_tensorop_s1688gemm", 15.0, ""),                            # no counts: by name
        bd.KernelTime("triton_per_fused_add_native_layer_norm_0", 10.0, ""),                 # no counts: by name
    ]
    b = bd.combine("unfused", "cuda", wall_ms=0.2, kernels=kernels, ridge=ridge, busy_ms=0.1)
    assert math.isclose(sum(b.categories_ms.values()), 0.2, rel_tol=1e-12)
    assert math.isclose(b.categories_ms["launch_host"], 0.1)
    share = {"compute_bound": 55 / 100, "memory_bound": 40 / 100, "other": 5 / 100}
    for cat, frac in share.items():
        assert math.isclose(b.categories_ms[cat], 0.1 * frac, rel_tol=1e-9), cat
    assert (b.by_intensity, b.by_name) == (3, 3)
    # no ridge known: every kernel by its name
    by_name = bd.combine("unfused", "cuda", 0.2, kernels, None, 0.1)
    assert by_name.by_intensity == 0 and math.isclose(by_name.categories_ms["compute_bound"], 0.1 * 65 / 100)
    # busy longer than the wall: scaled down to it, no launch share, and a note says so
    over = bd.combine("fused", "cuda", 0.05, kernels, ridge, 0.1)
    assert over.categories_ms["launch_host"] == 0.0 and "exceeded" in over.notes[0]
    assert math.isclose(sum(over.categories_ms.values()), 0.05, rel_tol=1e-12)


def test_kernel_name_families():
    compute = ["sm90_xmma_fprop_implicit_gemm_f16f16_f16f32_f32_nhwckrsc_nhwc", "nvjet_hsh_128x256_64x4_2x1_v_bz",
               "cutlass_80_wmma_tensorop_f16_s161616gemm", "void cudnn::cnn::conv2d_grouped_direct_kernel",
               "flash_fwd_kernel", "aten::mm", "aten::conv2d"]
    memory = ["void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<c10::Half>>",
              "void cudnn::bn_fw_inf_1C11_kernel_NCHW<__half, float, true, 1>", "_add_layernorm_kernel",
              "triton_poi_fused_relu_0", "void at::native::(anonymous namespace)::cunn_SoftMaxForward",
              "aten::batch_norm", "aten::add_", "void nchwToNhwcKernel<__half>"]
    assert [bd.kernel_family(n) for n in compute] == ["compute"] * len(compute)
    assert [bd.kernel_family(n) for n in memory] == ["memory"] * len(memory)
    assert bd.kernel_family("Memset (Device)") == "other"
    # of a node that issues a conv and an in-place ReLU, only the conv takes the node's intensity
    conv = bd.KernelTime("aten::conv2d", 5.0, "n", flops=1e9, nbytes=1e6)
    relu = bd.KernelTime("aten::relu_", 1.0, "n", flops=1e9, nbytes=1e6)
    assert bd.classify(conv, 10.0, alone=False)[0] == "compute_bound"
    assert bd.classify(relu, 10.0, alone=False)[0] == "memory_bound"
    assert bd.classify(relu, 10.0, alone=True)[0] == "compute_bound"


def test_cuda_profiler_events_are_charged_to_their_graph_nodes():
    """The CUDA path on made-up profiler events (this machine has no GPU): host ranges fx::<node>, an ATen op
    inside each with the kernels the profiler linked to it, a Triton kernel linked to the range itself, the
    GPU-timeline copies of the ranges (not kernels), a memcpy, and a kernel nobody linked."""
    from collections import namedtuple
    from types import SimpleNamespace

    from torch.autograd import DeviceType

    kernel = namedtuple("Kernel", "name device duration")

    def event(name, start, end, device=DeviceType.CPU, kernels=(), thread=1, annotation=False):
        return SimpleNamespace(name=name, time_range=SimpleNamespace(start=start, end=end), device_type=device,
                               thread=thread, kernels=list(kernels), is_user_annotation=annotation)

    gpu = DeviceType.CUDA
    events = [
        event("fx::conv2d", 0, 30), event("aten::conv2d", 2, 28, kernels=[kernel("sm90_xmma_fprop", 0, 50.0)]),
        event("fx::relu", 30, 40), event("aten::relu", 31, 39, kernels=[kernel("elementwise_kernel", 0, 10.0)]),
        event("fx::fused_add_layer_norm", 40, 60, kernels=[kernel("_add_layernorm_kernel", 0, 20.0)]),
        event("fx::conv2d", 100, 150, gpu, annotation=True),          # the GPU timeline's copy of a range
        event("sm90_xmma_fprop", 100, 150, gpu), event("elementwise_kernel", 150, 160, gpu),
        event("_add_layernorm_kernel", 160, 180, gpu), event("Memcpy DtoD (Device -> Device)", 180, 185, gpu),
        event("stray_kernel", 185, 190, gpu),
    ]
    costs = {"conv2d": (1e9, 1e6), "relu": (1e3, 8e6), "fused_add_layer_norm": (1e4, 4e6)}
    kernels, busy_ms, notes = bd.attribute_events(events, costs, cuda=True)
    assert [(k.name, k.node) for k in kernels] == [
        ("sm90_xmma_fprop", "conv2d"), ("elementwise_kernel", "relu"),
        ("_add_layernorm_kernel", "fused_add_layer_norm"), ("Memcpy DtoD (Device -> Device)", ""),
        ("stray_kernel", "")]
    assert math.isclose(busy_ms, 0.090)  # 100..190 µs, the annotation copy not counted
    assert kernels[0].flops == 1e9 and kernels[4].flops is None
    assert "2 of 5 kernels could not be linked" in notes[0]
    b = bd.combine("fused", "cuda", 0.2, kernels, ridge=100.0, busy_ms=busy_ms)
    assert math.isclose(b.categories_ms["compute_bound"], 0.09 * 50 / 90)   # the conv: 1000 FLOP/B
    assert math.isclose(b.categories_ms["memory_bound"], 0.09 * 35 / 90)    # relu, add+LN, the stray one by name
    assert math.isclose(b.categories_ms["other"], 0.09 * 5 / 90)
    assert math.isclose(b.categories_ms["launch_host"], 0.11)


def test_breakdown_of_a_real_forward_on_the_cpu(residual):
    fused = fuse(residual)
    out = bd.model_breakdowns(residual, fused.gm, "cpu", "fp32", ridge=10.0, timing=QUICK)
    for name, b in out.items():
        assert b.is_cpu and any("CPU profile" in n for n in b.notes), name
        assert math.isclose(sum(b.categories_ms.values()), b.wall_ms, rel_tol=1e-9), name
        assert min(b.categories_ms.values()) >= 0 and b.kernels > 0
        assert b.by_intensity > 0  # the nodes' counts reached the kernels
        # the CPU's honest split: op time by kind of op, adding up to the ops' time
        assert set(b.by_kind_ms) == set(bd.OP_KINDS) and b.ops == b.kernels, name
        assert math.isclose(sum(b.by_kind_ms.values()), b.busy_ms, rel_tol=1e-4, abs_tol=1e-5), name
        assert b.by_kind_ms["convolution"] > 0, name
    # the fused graph runs fewer top-level ops: conv+BN folded, the activation in place after the conv
    assert out["fused"].kernels < out["unfused"].kernels
    top = {r["node"] for r in out["fused"].top}
    assert any(n.startswith("fused_conv_bn") for n in top), top
    json.dumps(out["fused"].to_dict())
    assert bd.Breakdown.from_dict(out["fused"].to_dict()) == out["fused"]


# ------------------------------------------------------------------ traffic

@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_traffic_totals_are_the_byte_model(residual, dtype):
    _, graph, det = residual
    ids = [c.id for c in det.chains]
    table = tr.traffic_table(graph, det, ids, dtype)
    total = table["total"]
    assert total["bytes_unfused"] == m.graph_bytes(graph, dtype)
    saved = sum(c.bytes_saved for c in det.chains) * m.element_ratio(dtype)
    assert total["bytes_fused"] == total["bytes_unfused"] - round(saved)
    for row, chain in zip(table["chains"], det.chains):
        assert row["bytes_unfused"] == m.graph_bytes(graph, dtype, chain.compute_nodes)
        assert row["bytes_unfused"] - row["bytes_fused"] == round(chain.bytes_saved * m.element_ratio(dtype))
    only_first = tr.traffic_table(graph, det, ids[:1], dtype)
    assert len(only_first["chains"]) == 1 and only_first["total"]["bytes_saved"] < total["bytes_saved"]


def test_ncu_csv_parsing_both_pages_and_units():
    details = "\n".join([
        "==PROF== Connected to process 123 (/usr/bin/python3)",
        '"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size",'
        '"Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"',
        '"0","123","python3","127.0.0.1","gemm_a","1","7","(128, 1, 1)","(64, 1, 1)","0","9.0",'
        '"Command line profiler metrics","dram__bytes_read.sum","byte","1,048,576"',
        '"0","123","python3","127.0.0.1","gemm_a","1","7","(128, 1, 1)","(64, 1, 1)","0","9.0",'
        '"Command line profiler metrics","dram__bytes_write.sum","Kbyte","512"',
        '"1","123","python3","127.0.0.1","relu_b","1","7","(128, 1, 1)","(64, 1, 1)","0","9.0",'
        '"Command line profiler metrics","dram__bytes_read.sum","Mbyte","2"',
        "==PROF== Disconnected from process 123",
    ])
    got = tr.parse_ncu_csv(details)
    assert got["kernels"] == 2
    assert got["dram_read_bytes"] == 1_048_576 + 2_000_000 and got["dram_write_bytes"] == 512_000
    assert got["dram_bytes"] == got["dram_read_bytes"] + got["dram_write_bytes"]
    raw = "\n".join([
        '"ID","Kernel Name","dram__bytes_read.sum","dram__bytes_write.sum"',
        '"","","byte","byte"',
        '"0","k0","100","50"',
        '"1","k1","n/a","25"',
    ])
    got = tr.parse_ncu_csv(raw)
    assert (got["dram_read_bytes"], got["dram_write_bytes"], got["kernels"]) == (100, 75, 2)
    with pytest.raises(ValueError, match="no CSV header"):
        tr.parse_ncu_csv("==ERROR== LibraryNotLoaded")
    with pytest.raises(ValueError, match="unknown unit"):
        tr.parse_ncu_csv(details.replace('"Kbyte"', '"furlong"'))


def test_ncu_command_and_its_absence(monkeypatch):
    cmd = tr.ncu_command("/opt/ncu", "/tmp/x.csv", {"source": "resnet50", "variant": "fused"}, python="py")
    for flag in ("--clock-control", "none", "--cache-control", "--profile-from-start", "off", "--csv",
                 "dram__bytes_read.sum,dram__bytes_write.sum", "explorer.runtime.traffic", "--ncu-child"):
        assert flag in cmd
    monkeypatch.setattr(tr, "find_ncu", lambda: None)
    got = tr.measure_dram_bytes("residual_block", "fused", "fp32", 1, None)
    assert got == {"error": "Nsight Compute (ncu) not found on this machine"}
    got = tr.measure_dram_bytes("residual_block", "fused", "fp32", 1, None, ncu="/nonexistent/ncu")
    assert "error" in got  # no CUDA here, or ncu failing: one line either way, never an exception
    low = tr.explain_difference(1000, 600, 60 * 10**6)
    assert low["reasons"] == ["l2"] and low["difference"] == -400 and low["ratio"] == 0.6
    assert tr.explain_difference(1000, 1500, None)["reasons"] == ["rereads"]


# ------------------------------------------------------------------ ceilings and predictions

def test_ceilings_table_and_measured_now():
    h200 = ceil.known_ceilings("NVIDIA H200")
    rows = {r["op"]: r["host_us_per_call"]
            for r in json.loads((ROOT / "benchmarks/results/host_overhead_lean_h200.json").read_text())["rows"]}
    assert math.isclose(h200.launch_us, rows["conv+relu eager (2 ops)"] - rows["conv+relu: direct cudnn call (lean)"])
    assert 150 < h200.ridge("bf16") < 250 and h200.ridge("fp32") < h200.ridge("bf16")
    assert all(k in h200.sources for k in ("bandwidth", "bf16", "fp16", "fp32", "launch_us"))
    cpu = ceil.known_ceilings("CPU")
    assert cpu.ridge("fp32") is None and cpu.launch_us is None and "unknown" in cpu.sources["all"]
    now = ceil.measure_ceilings("cpu", ("fp32",), quick=True)
    assert now.measured and now.bandwidth > 0 and now.flops["fp32"] > 0 and now.launch_us > 0
    assert now.l2_bytes is None and "measured now" in now.sources["bandwidth"]
    assert ceil.Ceilings.from_dict(now.to_dict()) == now


def test_predicted_gain_never_falls_as_more_bytes_are_saved():
    c = ceil.Ceilings("device", bandwidth=1e12, flops={"fp16": 1e14}, launch_us=5.0, l2_bytes=50 * 10**6)
    ops = [(1e6, 64e6, 1), (1e5, 64e6, 1), (1e5, 64e6, 1)]   # memory-bound ops, 64 µs each on the device
    gains = [pr.predict_from_counts("c", "p", "t", ops, saved, 0, c, "fp16").gain for saved in
             (0, 16e6, 32e6, 64e6, 96e6, 128e6)]
    assert all(b > a for a, b in zip(gains, gains[1:])), gains
    assert math.isclose(gains[0], 1.0)  # nothing saved: one kernel moving all three ops' bytes takes as long
    assert math.isclose(gains[3], 192 / 128)  # a third of the bytes saved: 192 MB moved before, 128 after
    # tiny shapes: the host's launches set the time, and the gain is the launches' ratio
    tiny = pr.predict_from_counts("c", "p", "t", [(10, 100, 1)] * 3, 200, 0, c, "fp16")
    assert math.isclose(tiny.gain, 3.0) and tiny.host_unfused_us > tiny.device_unfused_us
    # compute-bound: intensity above the ridge (100 FLOP/B), saving bytes buys nothing on the device
    heavy = pr.predict_from_counts("c", "p", "t", [(1e12, 1e6, 1), (1e3, 1e6, 1)], 1e6, 0, c, "fp16")
    assert heavy.bound == "compute" and heavy.gain < 1.01
    unknown = ceil.Ceilings("cpu")
    assert pr.predict_from_counts("c", "p", "t", ops, 64e6, 0, unknown, "fp16").gain is None


def test_predictions_on_a_model_and_why_a_measurement_is_far(residual):
    _, graph, det = residual
    c = ceil.known_ceilings("NVIDIA H200")
    preds = pr.predict_chains(graph, det, [x.id for x in det.chains], "fp16", c)
    assert [p.id for p in preds] == [x.id for x in det.chains]
    for p, chain in zip(preds, det.chains):
        assert p.bytes_unfused - p.bytes_fused == round(chain.bytes_saved * 0.5)
        assert p.launches_unfused == len(chain.compute_nodes) and p.gain > 1
    p = preds[0]
    far = lambda speedup, graph_speedup=None: pr.why_far(  # noqa: E731
        p, readers.MeasuredChain(p.id, 1.0, 1.0, speedup, graph_speedup, None), c, "fp16")
    assert far(p.gain) is None
    assert far(0.5, 0.6) == "slower_kernel"
    assert far(p.gain / 3, p.gain) == "host_bound"       # plain calls and graph replays disagree
    assert far(p.gain * 3) == "host_bound"              # the model expects the host to dominate here
    device_bound = pr.predict_from_counts("c", "p", "t", [(1e6, 64e6, 1), (1e5, 64e6, 1)], 64e6, 32e6, c, "fp16")
    m_low = readers.MeasuredChain("c", 1.0, 1.0, device_bound.gain / 2, device_bound.gain / 2, None)
    assert pr.why_far(device_bound, m_low, c, "fp16") == "l2_resident"   # 32 MB intermediate < 60 MB of L2
    big = pr.predict_from_counts("c", "p", "t", [(1e6, 640e6, 1), (1e5, 640e6, 1)], 640e6, 320e6, c, "fp16")
    assert pr.why_far(big, readers.MeasuredChain("c", 1, 1, big.gain / 2, big.gain / 2, None), c, "fp16") \
        == "unexplained"
    rows = pr.compare(preds, {p.id: readers.MeasuredChain(p.id, 2.0, 1.0, 2.0, None, False)}, c, "fp16")
    assert len(rows) == 1 and rows[0]["measured"] == 2.0 and rows[0]["far"] >= 1


def test_readers_take_both_report_versions():
    v1 = {"version": 1, "plan": {"fingerprint": "abc"}, "settings": {"dtype": "fp16"},
          "chains": [{"id": "a", "unfused_ms": 2.0, "fused_ms": 1.0, "unfused_graph_ms": 1.5, "fused_graph_ms": 1.0,
                      "slower": False}, {"id": "b", "unfused_ms": None, "fused_ms": None}],
          "stages": [{"stage": "none", "label": "original", "latency_ms": {"median": 3.0, "p20": 2.9, "p80": 3.1},
                      "throughput": 10.0, "peak_memory_bytes": None}]}
    v2 = {"version": 2, "model": {"fingerprint": "abc"}, "settings": {"dtype": "fp16"},
          "chains": [{"id": "a", "unfused": {"median": 2.0}, "fused": {"median": 1.0}, "unfused_graph": None,
                      "fused_graph": None, "verdict": {"label": "slower"}}],
          "stages": [{"stage": "all", "label": "all", "latency": None, "same_as": "none"}]}
    got = readers.measured_chains(v1)
    assert list(got) == ["a"] and got["a"].speedup == 2.0 and got["a"].graph_speedup == 1.5
    got = readers.measured_chains(v2)
    assert got["a"].slower is True and got["a"].graph_speedup is None
    assert readers.report_stages(v1)[0]["latency_ms"] == 3.0
    assert readers.report_stages(v2)[0]["same_as"] == "none"
    assert readers.report_fingerprint(v1) == readers.report_fingerprint(v2) == "abc"
    assert readers.report_dtype(v2) == "fp16"


# ------------------------------------------------------------------ precision bisect

def _inflating(analysis, target: str, factor: float = 1 + 1e-2):
    """A fuse function whose chain ``target`` is wrong by ``factor`` (its fused call's outputs scaled)."""
    base = default_fuse(analysis)

    def fuse_fn(ids):
        gm = base(ids)
        for node in gm.graph.nodes:
            if node.meta.get("fused_chain") == target:
                original = node.target

                def scaled(*args, _f=original):
                    out = _f(*args)
                    return tuple(o * factor for o in out) if isinstance(out, tuple) else out * factor

                node.target = scaled
        gm.recompile()
        return gm

    return fuse_fn


@pytest.mark.parametrize("mode", ["one_at_a_time", "bisect"])
def test_bisect_finds_the_chain_whose_error_was_inflated(transformer, mode):
    ids = [c.id for c in transformer.detection.chains]
    target = ids[2]
    result = precision_bisect(transformer, ids, mode=mode, fuse=_inflating(transformer, target))
    assert result.drifts and result.culprit == target
    assert result.fused_rel_l2 > 100 * result.unfused_rel_l2
    if mode == "one_at_a_time":
        assert result.ranked[0].id == target and len(result.ranked) == len(ids)
        assert result.ranked[0].contribution > 100 * max(abs(c.contribution) for c in result.ranked[1:])
    else:
        assert result.fused_models <= 2 * len(ids).bit_length() + 1 and len(result.steps) >= 2
    assert json.dumps(result.to_dict())


def test_bisect_without_drift_names_no_culprit(residual):
    ids = [c.id for c in residual.detection.chains]
    result = precision_bisect(residual, ids, mode="both")
    assert not result.drifts and result.culprit is None and len(result.ranked) == len(ids)


# ------------------------------------------------------------------ worked examples

def test_fold_example_agrees_with_fold_conv_bn(residual):
    model, _, det = residual
    chain = ex.bn_chains(det)[1]
    got = ex.fold_example(residual, chain.id, channel=3)
    by_name = {n.name: n for n in model.gm.graph.nodes}
    c = aten.conv_args(by_name[chain.node_for("conv")])
    b = aten.batch_norm_args(by_name[chain.node_for("bn")])
    value = lambda node: None if node is None else aten.attr_value(model.gm, node.target).detach().double()  # noqa: E731
    w, bias = fold_conv_bn(value(c.weight), value(c.bias), value(b.running_mean), value(b.running_var),
                           value(b.weight), value(b.bias), b.eps)
    gamma, var = value(b.weight)[3], value(b.running_var)[3]
    assert math.isclose(got.scale, float(gamma / torch.sqrt(var + b.eps)), rel_tol=1e-12)
    assert math.isclose(got.folded_bias, float(bias[3]), rel_tol=1e-12, abs_tol=1e-15)
    assert got.weights_after == tuple(float(v) for v in w[3].reshape(-1)[:3])
    assert got.tolerance == FOLD_TOLERANCE_F64 and got.agrees and got.rel_diff_f64 <= FOLD_TOLERANCE_F64
    assert got.rel_diff_f32_folded < 1e-5 and got.channels == w.shape[0]
    with pytest.raises(ValueError, match="out of range"):
        ex.fold_example(residual, chain.id, channel=got.channels)
    assert ex.fold_example(residual) is not None


def test_add_layer_norm_bytes_each_version_reads_and_writes(transformer):
    _, graph, det = transformer
    chain = next(c for c in det.chains if c.pattern == "add_layer_norm")
    got = ex.traffic_example(graph, chain, "fp16")
    add, norm = got.ops
    assert (add["kind"], norm["kind"]) == ("add", "layer_norm")
    total = lambda n: m.graph_bytes(graph, torch.float16, [n])  # noqa: E731
    assert add["reads"] + add["writes"] == total(chain.compute_nodes[0])
    (summed,) = got.intermediates
    assert summed["bytes"] == add["writes"]
    assert got.fused_reads == add["reads"] + norm["reads"] - summed["bytes"]   # the sum is not read back
    expected_writes = norm["writes"] + (summed["bytes"] if summed["kept"] else 0)
    assert got.fused_writes == expected_writes
    unfused = got.unfused_reads + got.unfused_writes
    assert unfused - (got.fused_reads + got.fused_writes) == got.bytes_saved == round(chain.bytes_saved / 2)
    families = ex.examples_by_family(transformer, "fp32")
    assert set(families) == {ex.FAMILY_OF[c.pattern] for c in det.chains}
    for e in families.values():
        assert e.unfused_reads + e.unfused_writes - e.fused_reads - e.fused_writes == e.bytes_saved


# ------------------------------------------------------------------ the teaching report and its GPU script

@pytest.fixture(scope="module")
def quick_report(tmp_path_factory):
    """The GPU script's CPU path, in process: one tiny model, no chains, no stages."""
    import benchmark_scripts

    script = benchmark_scripts.load("teach_reports")
    out = tmp_path_factory.mktemp("teach") / "teaching_report.json"
    rc = script.main(["--quick", "--models", "residual_block_fp32", "--no-chains", "--no-stages", "--out", str(out)])
    return rc, out, script


def test_the_gpu_script_runs_on_the_cpu_and_writes_a_valid_report(quick_report, capsys):
    rc, out, _ = quick_report
    assert rc == 0
    doc = trep.load(out.read_bytes(), out.name)
    assert doc["schema"] == trep.SCHEMA and doc["version"] == trep.VERSION
    assert doc["label"].startswith("CPU run") and doc["command"] and doc["date_utc"]
    for key in ("torch", "device_name", "python"):
        assert key in doc["environment"]
    entry = trep.model_entry(doc, "residual_block")
    assert entry["breakdown"]["unfused"]["is_cpu"] and entry["traffic"]["ncu"] is None
    assert entry["predictions"] and doc["ceilings"]["measured"]
    assert trep.load(out).keys() == doc.keys()


def test_the_gpu_script_says_so_without_cuda(quick_report, capsys):
    _, _, script = quick_report
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    assert script.main(["--models", "resnet50_fp16"]) == 2
    assert "no CUDA device" in capsys.readouterr().err


def test_teaching_report_validation_names_the_field(quick_report):
    _, out, _ = quick_report
    good = json.loads(out.read_text())
    bad = json.loads(out.read_text())
    bad["models"][0]["breakdown"]["fused"]["categories_ms"]["other"] = "x"
    with pytest.raises(ReportError, match=r"models\[0\]\.breakdown\.fused\.categories_ms\.other: expected a number"):
        trep.validate(bad, "t.json")
    bad = json.loads(out.read_text())
    bad["models"][0]["breakdown"]["unfused"]["categories_ms"]["other"] += 1.0
    with pytest.raises(ReportError, match="add up to"):
        trep.validate(bad, "t.json")
    for broken, needle in (({"schema": "x"}, "not a teaching report"), ([], "not a teaching report"),
                           ({**good, "version": 9}, "version 9"), ({**good, "models": []}, "models: empty")):
        with pytest.raises(ReportError, match=needle) as err:
            trep.validate(broken, "t.json")
        assert "\n" not in str(err.value)
    with pytest.raises(ReportError):
        trep.load(b"{not json", "t.json")
    assert trep.is_teaching_report(good) and not trep.is_teaching_report({"version": 2})
