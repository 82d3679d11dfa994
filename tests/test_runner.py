"""The measurement runner: the child-process protocol, the report contract, failures.

Everything here runs on the CPU (small zoo models, few repetitions); the test
marked ``gpu`` needs CUDA and is skipped without it. CPU timings are not
asserted on (the CPU is shared and noisy); what is asserted is that every
contract key is there, that numbers are finite where they must be, that the
fused model matches the float64 reference, and that every failure reaches the
caller as a one-line ``RunError`` while the caller survives.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import threading
import time

import pytest
import torch

from explorer import stats
from explorer.errors import RunError
from explorer.gpu_runner import RunSettings, run
from explorer.report import FASTER, NO_KERNEL, SAME, SLOWER, VERDICTS, Report, summary_table
from explorer.runtime import child, measure
from explorer.runtime.session import measure as measure_in_process

FAST = dict(device="cpu", warmup=1, reps=8)


def _one_line(err: BaseException) -> str:
    text = str(err)
    assert "\n" not in text and "Traceback" not in text, text
    return text


@pytest.mark.parametrize("name", ["conv_bn_relu", "residual_block", "transformer_block"])
def test_full_run_on_cpu_through_the_child(name, analyze_cached):
    from explorer.fusions.plan import make_plan

    _, _, det = analyze_cached(name)
    seen: list[tuple[float, str]] = []
    report = run(name, None, RunSettings(**FAST), progress=lambda f, s: seen.append((f, s)))
    assert isinstance(report, Report)
    assert Report.from_dict(json.loads(report.to_json())) == report   # plain JSON, read back exactly

    for side in (report.unfused, report.fused):
        lat = side.latency
        assert 0 < lat.p20 <= lat.median <= lat.p80 and lat.reps >= 8
        assert side.throughput > 0
        for value in (side.precision.max_abs, side.precision.max_rel, side.precision.rel_l2):
            assert math.isfinite(value), side.name
        assert side.precision.cosine > 0.999999 and side.precision.refused is None
        assert side.peak_memory_bytes is None and "CPU" in side.memory_note  # not faked on CPU
        assert side.launches_kind == "aten ops (cpu)" and side.kernel_launches > 0
        assert side.bytes_moved > 0 and side.bound is None
    assert report.fused.precision.rel_l2 < 1e-4 and report.unfused.precision.rel_l2 < 1e-4
    assert report.fused.bytes_moved < report.unfused.bytes_moved
    assert report.verdict.n >= 8 and report.verdict.label in VERDICTS and report.verdict.method

    env = report.environment
    assert env.is_cpu is True and env.device == "cpu" and env.torch and env.started_utc
    assert env.note == "CPU run: numbers are CPU numbers, not GPU numbers"

    accepted = make_plan(det, "all").accepted
    assert report.plan.accepted == accepted
    assert [c.id for c in report.chains] == list(accepted)
    for c in report.chains:
        assert c.title == det.chain(c.id).title
        if c.status == "fused" and c.fused_kernel:
            assert c.unfused.median > 0 and c.fused.median > 0 and c.verdict.n >= stats.MIN_ROUNDS
            assert c.verdict.label in (FASTER, SLOWER, SAME) and c.verdict.basis == "synchronised calls"
            assert c.rel_err is not None and c.rel_err < 1e-4
            assert c.bytes_fused <= c.bytes_unfused and "not rotated" in c.rotation
        elif c.status == "fused":
            assert c.verdict.label == NO_KERNEL and c.fused is None   # the same ops: labelled, not timed
        else:
            assert c.reason, c

    assert [s.stage for s in report.stages] == ["none", "conv_bn", "activation", "all"]
    assert report.stages[0].label == "original"
    for s in report.stages:
        assert (s.latency is None) == (s.same_as is not None), s
        assert s.latency is None or s.latency.median > 0

    statuses = [s for _, s in seen]
    assert seen and seen[-1][0] == 1.0
    assert any(s.startswith("timing chain 1/") for s in statuses), statuses
    assert all("left" in s for _, s in seen[:-1]), statuses      # every status says how long is left
    assert all(0.0 <= f <= 1.0 for f, _ in seen)
    assert summary_table(report)


def test_bad_source_is_one_line():
    with pytest.raises(RunError) as info:
        run("no_such_model_anywhere", None, RunSettings(**FAST))
    assert "unknown model" in _one_line(info.value)


def test_plan_for_another_model_is_refused(analyze_cached):
    from explorer.fusions.plan import make_plan

    _, _, other = analyze_cached("residual_block")
    plan = make_plan(other, "all")
    with pytest.raises(RunError) as info:
        run("conv_bn_relu", plan, RunSettings(**FAST))
    assert "this plan was made for model 'residual_block'" in _one_line(info.value)


def test_child_crash_becomes_run_error(monkeypatch):
    monkeypatch.setenv(child.CRASH_TEST_ENV, "1")
    t0 = time.monotonic()
    with pytest.raises(RunError) as info:
        run("conv_bn_relu", None, RunSettings(**FAST))
    msg = _one_line(info.value)
    assert "exit status 3" in msg and "simulated crash" in msg  # the child's last stderr line
    assert time.monotonic() - t0 < 30


class _RecordingPopen(subprocess.Popen):
    instances: list = []

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        _RecordingPopen.instances.append(self)


def test_cancel_kills_the_child(monkeypatch):
    monkeypatch.setattr(child.subprocess, "Popen", _RecordingPopen)
    _RecordingPopen.instances.clear()
    cancel = threading.Event()
    first_progress: list[float] = []

    def progress(fraction, status):
        if not first_progress:
            first_progress.append(time.monotonic())
        cancel.set()

    with pytest.raises(RunError) as info:
        run("residual_block", None, RunSettings(**FAST), progress=progress, cancel=cancel)
    assert str(info.value) == "cancelled"
    assert time.monotonic() - first_progress[0] < 5
    (proc,) = _RecordingPopen.instances
    assert proc.poll() is not None  # the child is gone (killed and reaped)


def test_timeout_kills_the_child():
    with pytest.raises(RunError) as info:
        run("conv_bn_relu", None, RunSettings(timeout_s=0.5, **FAST))
    assert "timed out" in _one_line(info.value)


def test_shape_that_does_not_fit_memory_is_refused():
    t0 = time.monotonic()
    with pytest.raises(RunError) as info:
        run("resnet50", None, RunSettings(device="cpu", batch=10**6))
    msg = _one_line(info.value)
    assert msg.startswith("does not fit in memory: needs ") and "GiB available" in msg
    assert time.monotonic() - t0 < 60


def test_engine_and_runner_never_import_ui_packages():
    code = (
        "import sys\n"
        "for m in ('streamlit', 'plotly', 'pyvis'): sys.modules[m] = None  # any import now fails\n"
        "from explorer.runtime.session import measure\nfrom explorer.gpu_runner import RunSettings\n"
        "r = measure('conv_bn_relu', None, RunSettings(device='cpu', warmup=1, reps=3))\n"
        "assert r.fused.precision.rel_l2 < 1e-4\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180)
    assert out.returncode == 0 and "ok" in out.stdout, out.stderr[-2000:]


# ---------------------------------------------------------------- in-process pieces

def test_levers_and_low_precision_in_process():
    """channels_last + CUDA graphs on CPU (noted, not faked) and bf16 against float64."""
    from explorer.fusion_engine import analyze
    from explorer.fusions.plan import make_plan

    _, _, det = analyze("residual_block", batch=2)
    plan = make_plan(det, "all", memory_format="channels_last", cuda_graphs=True)
    report = measure_in_process("residual_block", plan.to_dict(),
                                RunSettings(dtype="bf16", batch=2, per_chain=False, stages=False, **FAST))
    assert any("CUDA graphs" in n for n in report.notes)
    assert report.plan.memory_format == "channels_last"
    # bf16 operands: rel_l2 between ~1e-3 and 1e-2 (METHOD.md); far from float32 accuracy, still sane
    assert 1e-5 < report.unfused.precision.rel_l2 < 5e-2 and 1e-5 < report.fused.precision.rel_l2 < 5e-2
    # bytes scale to bf16: half of fp32
    fp32_bytes = measure.graph_bytes(analyze("residual_block", batch=2)[1], torch.float32)
    assert abs(report.unfused.bytes_moved - fp32_bytes / 2) <= 1
    assert report.chains and all(c.fused is None for c in report.chains)
    assert any("per-chain micro-benchmarks not run" in n for n in report.notes)


def test_quick_mode_takes_fewer_rounds_and_no_chain_timing():
    """Quick mode: the per-chain timing is skipped (said in the notes), the whole model gets the test's
    minimum of rounds and no more than the quick plan's cap."""
    settings = RunSettings(device="cpu", quick=True)
    assert not settings.chains_timed
    threads_before = torch.get_num_threads()
    report = measure_in_process("residual_block", None, settings)
    plan = measure.TimingPlan.for_device("cpu", quick=True)
    assert stats.MIN_ROUNDS <= report.unfused.latency.reps <= plan.max_rounds
    assert all(c.fused is None for c in report.chains)
    assert any("quick mode" in n for n in report.notes)
    assert report.settings["quick"] is True and len(report.stages) == 4
    # one intra-op thread on the CPU (stable on a shared machine), recorded, and restored afterwards
    assert report.environment.extra["cpu_threads"] == 1 and any("1 intra-op thread" in n for n in report.notes)
    assert torch.get_num_threads() == threads_before


def test_stages_differ_as_their_names_say(analyze_cached):
    """Each stage's graph is what its name says: Conv+BN folds BatchNorms and keeps activations and adds
    as ops; + epilogues fuses the conv epilogues; all accepted adds the non-epilogue chains; an identical
    graph is named as such, never timed twice."""
    from explorer.fusions.plan import make_plan
    from explorer.runtime.stages import describe_stages, graph_signature

    model, _, det = analyze_cached("residual_block")
    stages = {s.stage: (s, gm) for s, gm in describe_stages(model, det, make_plan(det), "cpu")}
    none, conv_bn, act, every = (stages[k][0] for k in ("none", "conv_bn", "activation", "all"))
    assert none.batch_norms == 2 and conv_bn.batch_norms == 0 and conv_bn.chains_folded == 2
    relus = lambda gm: sum(t.startswith("aten.relu") for t in graph_signature(gm))  # noqa: E731
    adds = lambda gm: sum(t.startswith("aten.add") for t in graph_signature(gm))  # noqa: E731
    assert relus(stages["conv_bn"][1]) == relus(stages["none"][1]) == 2       # activations still separate
    assert adds(stages["conv_bn"][1]) == adds(stages["none"][1]) == 1
    assert relus(stages["activation"][1]) == 0 and adds(stages["activation"][1]) == 0
    assert act.chains_fused == 2 and act.graph_ops < conv_bn.graph_ops < none.graph_ops
    assert every.same_as == "activation" and stages["all"][1] is None and "same graph" in every.differs
    assert "folded" in conv_bn.differs and "epilogues" in act.differs

    model, _, det = analyze_cached("transformer_block")
    stages = {s.stage: (s, gm) for s, gm in describe_stages(model, det, make_plan(det), "cpu")}
    assert stages["conv_bn"][0].same_as == "none"                          # no BatchNorm to fold
    assert stages["activation"][0].same_as is None                         # Linear+GELU is an epilogue
    assert stages["all"][0].same_as is None and stages["all"][0].chains_fused == len(det.chains)
    assert stages["all"][0].fused_calls > stages["activation"][0].fused_calls


def test_a_known_error_injected_into_one_chain_is_recovered(monkeypatch):
    """Scale the last fused call's result (the model's output) by (1 + eps) in the fused graph: the report's
    relative L2 errors of the fused model (against float64 and against the unfused model) recover eps."""
    import operator

    from explorer.runtime import session

    eps = 3e-3
    real_fuse = session.fuse

    def fuse_with_error(analysis, plan, device):
        fused = real_fuse(analysis, plan, device)
        graph = fused.gm.graph
        last = [n for n in graph.nodes if n.op == "call_function" and "fused_chain" in n.meta][-1]
        with graph.inserting_after(last):
            scaled = graph.call_function(operator.mul, (last, 1.0 + eps))
        last.replace_all_uses_with(scaled, delete_user_cb=lambda user: user is not scaled)
        fused.gm.recompile()
        return fused

    monkeypatch.setattr(session, "fuse", fuse_with_error)
    report = measure_in_process("residual_block", None, RunSettings(device="cpu", quick=True, stages=False))
    assert report.fused.precision.rel_l2 == pytest.approx(eps, rel=0.02)
    assert report.fused_vs_unfused.rel_l2 == pytest.approx(eps, rel=0.02)
    assert report.fused.precision.max_rel == pytest.approx(eps, rel=0.05)
    assert report.unfused.precision.rel_l2 < 1e-5                            # the reference path is untouched
    assert report.fused_worse is True


def test_precision_metrics():
    ref = torch.tensor([[1.0, -2.0, 4.0], [0.5, 0.25, -8.0]], dtype=torch.float64)
    out = ref + torch.tensor([[0.0, 0.0, 0.1], [0.0, 0.0, 0.0]], dtype=torch.float64)
    p = measure.precision(out.float(), ref, classification=True)
    assert p["max_abs"] == pytest.approx(0.1, rel=1e-6)
    assert p["max_rel"] == pytest.approx(0.1 / 8, rel=1e-6)
    assert p["rel_l2"] == pytest.approx(0.1 / float(ref.norm()), rel=1e-6)
    assert p["top1_agreement"] == 1.0 and 0.999 < p["cosine"] <= 1.0
    bad = measure.precision(torch.full((2, 3), float("nan")), ref, classification=False)
    assert bad["finite"] is False and bad["rel_l2"] == float("inf") and bad["top1_agreement"] is None


@pytest.mark.parametrize("ref, dtype, needle", [
    (torch.zeros(4, 10, dtype=torch.float64), torch.float32, "all zero"),
    (torch.full((4, 10), 0.25, dtype=torch.float64), torch.float32, "constant"),
    (torch.randn(4, 10, dtype=torch.float64) * 1e-9, torch.float16, "denormal in float16"),
])
def test_precision_refuses_a_degenerate_reference(ref, dtype, needle):
    """Relative figures against an all-zero, constant or (in the run dtype) denormal reference would be
    meaningless: they are None and the reason is given; max_abs is still there."""
    out = ref.to(dtype) + 1e-3
    p = measure.precision(out, ref, classification=True, dtype=dtype)
    assert needle in p["refused"]
    assert p["rel_l2"] is None and p["max_rel"] is None and p["cosine"] is None and p["top1_agreement"] is None
    assert p["max_abs"] is not None
    ok = measure.precision(out, ref + 1.0 + torch.rand_like(ref), classification=False, dtype=torch.float32)
    assert ok["refused"] is None and ok["rel_l2"] is not None


def test_alternated_timing_and_percentiles():
    assert measure.percentile([1, 2, 3, 4, 5], 20) == pytest.approx(1.8)
    calls: list[str] = []
    res = measure.time_alternated({"a": lambda: calls.append("a"), "b": lambda: calls.append("b")}, "cpu",
                                  measure.TimingPlan(warmup=1, reps=4))
    rounds = calls[4:]  # after warm-up (1) and the first-time probe (1) of each variant
    # Timed calls alternate ABBA; where the order switches variant, one untimed call of the new one
    # runs first, so that every timed call follows one of its own (steady state, not the other's caches).
    assert rounds == ["a", "a", "b", "b", "b", "a", "a", "a", "b", "b", "b", "a", "a"]
    assert res["a"]["reps"] == 4 and res["a"]["p20"] <= res["a"]["median"] <= res["a"]["p80"]


def test_timed_calls_follow_their_own_variant(monkeypatch):
    """Every timed call is preceded by a call of the same variant, whatever the number of variants."""
    calls: list[tuple[str, bool]] = []
    timing = {"on": False}

    def make(name):
        return lambda: calls.append((name, timing["on"]))

    variants = {n: make(n) for n in "abc"}
    orig = measure._timed_call

    def spy(fn, device, before=None):
        timing["on"] = True
        try:
            return orig(fn, device, before)
        finally:
            timing["on"] = False

    monkeypatch.setattr(measure, "_timed_call", spy)
    samples = measure.time_rounds(variants, "cpu", 5)
    assert all(len(v) == 5 for v in samples.values())
    timed_positions = [i for i, (_, timed) in enumerate(calls) if timed]
    assert len(timed_positions) == 15
    assert all(i > 0 and calls[i - 1][0] == calls[i][0] for i in timed_positions)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_prepare_graph_retargets_dtype_and_keeps_integers(dtype, analyze_cached):
    """BERT's exported mask uses finfo(float32).min, which overflows fp16 unless clamped."""
    model = analyze_cached("bert_base", 1, 8)[0]
    gm = measure.prepare_graph(model.gm, "cpu", dtype)
    inputs = measure.prepare_inputs(model.example_inputs, "cpu", dtype)
    assert all(t.dtype == torch.int64 for t in inputs)
    with torch.inference_mode():
        out = gm(*inputs)
    out = measure.flat_outputs(out)[0]
    assert out.dtype == dtype and torch.isfinite(out).all()
    assert next(model.gm.parameters()).dtype == torch.float32  # the original is untouched


class _Blocks(torch.nn.Module):
    """Nested weights and both kinds of dropout: what the runner's graph clean-ups touch."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Sequential(torch.nn.Linear(6, 6), torch.nn.Dropout(0.5))
                                          for _ in range(2))
        self.register_buffer("scale", torch.tensor(2.0))

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return torch.nn.functional.dropout(x, 0.5, training=True) * self.scale


def test_prepare_graph_cleanups_keep_the_function():
    """Eval-mode dropout is dropped, training-mode dropout is kept, and nested weights are read
    from the root: the same tensor objects, the same parameter count, the same outputs."""
    from explorer.sources import capture

    x = torch.randn(3, 6)
    gm = capture(_Blocks().eval(), (x,), "blocks")
    dropouts = lambda g: [n.args[2] if len(n.args) > 2 else n.kwargs.get("train")  # noqa: E731
                          for n in g.graph.nodes if n.target is torch.ops.aten.dropout.default]
    assert sorted(dropouts(gm)) == [False, False, True]
    prepared = measure.prepare_graph(gm, "cpu", torch.float32)
    assert dropouts(prepared) == [True]
    reads = [n.target for n in prepared.graph.nodes if n.op == "get_attr"]
    assert reads and all("." not in t for t in reads)
    assert sum(p.numel() for p in prepared.parameters()) == sum(p.numel() for p in gm.parameters())
    first = next(n.target for n in prepared.graph.nodes if n.op == "get_attr" and "layers_0" in n.target)
    assert getattr(prepared, first) is prepared.get_parameter("layers.0.0.weight")
    torch.manual_seed(0)
    expected = gm(x)
    torch.manual_seed(0)
    assert torch.equal(prepared(x), expected)   # the same random mask: the training dropout kept its place


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_full_run_on_cuda_with_graphs():
    from explorer.fusion_engine import analyze
    from explorer.fusions.plan import make_plan

    _, _, det = analyze("residual_block", batch=8)
    plan = make_plan(det, "all", cuda_graphs=True)
    report = run("residual_block", plan, RunSettings(device="cuda", dtype="fp16", batch=8, compile_baseline=True))
    assert report.environment.is_cpu is False
    for side in (report.unfused, report.fused):
        assert side.peak_memory_bytes > 0 and side.launches_kind == "cuda kernels"
        assert side.gpu_busy_ms is not None and side.bound in ("host", "gpu")
    assert report.fused.precision.rel_l2 < 1e-2
    timed = [c for c in report.chains if c.fused is not None]
    assert timed and all(c.graph is not None and "L2 flushed" in c.rotation for c in timed)
    assert all(c.verdict.basis == "CUDA-graph replays" for c in timed)   # the plan replays graphs
    names = {b.name: b for b in report.baselines}
    assert names["torch_compile_reduce_overhead"].pairs_with == "fused_cuda_graphs"
    assert names["torch_compile"].pairs_with == "fused" and names["torch_compile"].compile_s > 0


def test_progress_says_the_time_left_and_never_goes_back():
    """The schedule's fraction only grows, even when a revision makes the run look longer, and every
    status carries the estimated time left, which shrinks as phases end."""
    from explorer.runtime.progress import Schedule, format_seconds

    seen: list[tuple[float, str]] = []
    schedule = Schedule(lambda f, s: seen.append((f, s)), {"load": 0.02, "main": 0.02, "chains": 0.02})
    schedule.emit("load", 0.0, "loading")
    time.sleep(0.03)
    schedule.emit("main", 0.5, "timing")
    schedule.revise(chains=60.0)                       # the first forward was slow: chains will take a minute
    schedule.emit("main", 0.9, "timing")
    assert "about 1 min" in seen[-1][1] or "about 60 s" in seen[-1][1], seen[-1]
    schedule.emit("chains", 0.5, "timing chain 1/2")
    schedule.done()
    fractions = [f for f, _ in seen]
    assert fractions == sorted(fractions) and fractions[-1] == 1.0
    assert all("left" in s for _, s in seen[:-1]) and seen[-1][1].startswith("done in")
    assert format_seconds(200) == "3 min 20 s" and format_seconds(42.4) == "42 s"


def test_check_timer_smoke_interleaves_every_timer(tmp_path):
    """``benchmarks/check_timer.py --smoke``: every case lands in the JSON with the runner's loop, the wall
    clock and the blocks timed in the same rounds (sample counts follow the rounds), deviations computed
    against the runner's loop, and the upfront run beside it as drift."""
    from triton_testing import fusion_benchmark

    check_timer = fusion_benchmark("check_timer")
    out = tmp_path / "check_timer.json"
    assert check_timer.main(["--smoke", "--rounds", "3", "--runner-calls", "4", "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["command"] and doc["environment"]["torch"] and doc["settings"]["interleaved"] is True
    assert [r["case"] for r in doc["results"]] == [c.key for c in check_timer.SMOKE_CASES]
    for result in doc["results"]:
        assert set(result["variants"]) == {"unfused", "fused"}
        for v in result["variants"].values():
            assert v["runner"]["n"] == 3 * 4 and v["wall"]["n"] == 3 * 4 and v["blocks"]["n"] == 3
            assert v["do_bench"] is None                    # no CUDA here: said, not faked
            assert v["deviation"] == pytest.approx(v["wall"]["median"] / v["runner"]["median"] - 1)
            assert v["drift"] == pytest.approx(v["runner_upfront"]["median"] / v["runner"]["median"] - 1)
            assert v["agrees"] == (abs(v["deviation"]) <= check_timer.TOLERANCE)


@pytest.mark.skipif(torch.cuda.is_available(), reason="with CUDA this would run the whole check")
def test_check_timer_without_cuda_says_so(tmp_path, capsys):
    from triton_testing import fusion_benchmark

    out = tmp_path / "check_timer.json"
    assert fusion_benchmark("check_timer").main(["--out", str(out)]) == 0
    assert "no CUDA device" in capsys.readouterr().out and "skipped" in out.read_text()
