"""The unfused baseline computes what the model computes, in every run dtype.

Graphs are captured in float32, where a model's upcasts (``x.to(torch.float32)`` around RMSNorm,
softmax, the rotary angles) are no-ops, and where torch.export attributes later uses of ``x`` to the
cast. ``measure.record_casts`` reads the model's own casts at the run dtype and ``prepare_graph``
applies them: the unfused graph in bf16 or fp16 then runs what eager PyTorch runs. Asserted here, on
the CPU: the prepared graph's output equals eager's (the same ops in the same dtypes), its error
against float64 is within 1.5x of eager's, on the zoo decoder and on transformers configs built with
unit-scale seeded weights (so that the signal is not a vanishing one, as the zoo's calibration
ensures for the zoo); and a plan made at fp32 applies at bf16.
"""

from __future__ import annotations

import math

import pytest
import torch

from explorer.runtime import measure as m
from explorer.sources import capture

DTYPES = (torch.bfloat16, torch.float16)


def _reference(gm, inputs):
    with torch.inference_mode():
        return m.prepare_graph(gm, "cpu", torch.float64)(*m.prepare_inputs(inputs, "cpu", torch.float64))


def _errors(gm, module, inputs, dtype, casts, ref=None):
    """rel_l2 against float64 of: eager, the prepared graph with the record, without it; and graph vs eager."""
    ref = _reference(gm, inputs) if ref is None else ref
    x = m.prepare_inputs(inputs, "cpu", dtype)
    with torch.inference_mode():
        eager = m.prepare_module(module, "cpu", dtype)(*x)
        graph = m.prepare_graph(gm, "cpu", dtype, casts=casts)(*x)
        blanket = m.prepare_graph(gm, "cpu", dtype)(*x)
    rel = lambda out, against: m.precision(out, against, False, dtype)["rel_l2"]  # noqa: E731
    as_ref = [t.double() for t in m.flat_outputs(eager)]
    return rel(eager, ref), rel(graph, ref), rel(blanket, ref), rel(graph, as_ref), rel(blanket, as_ref)


def _check(gm, module, inputs, what):
    ref = _reference(gm, inputs)
    for dtype in DTYPES:
        casts, note = m.record_casts(module, inputs, gm, dtype)
        assert casts is not None, note
        assert casts.kept_float32 > 0, note               # these models do upcast
        eager, graph, blanket, graph_vs_eager, blanket_vs_eager = _errors(gm, module, inputs, dtype, casts, ref)
        assert math.isfinite(eager) and eager > 1e-5, (what, dtype, eager)   # a signal, not underflow
        assert graph <= 1.5 * eager, (what, dtype, graph, eager)
        # the same ops in the same dtypes: what eager computes, to the last bit on the CPU
        assert graph_vs_eager < 1e-6, (what, dtype, graph_vs_eager)
        assert blanket_vs_eager > 1e-4, (what, dtype, blanket_vs_eager)   # without the record it was not


def test_the_zoo_decoder_computes_what_eager_computes(analyze_cached):
    model = analyze_cached("llama_decoder", 1, 12)[0]
    _check(model.gm, model.module, model.example_inputs, "llama_decoder")


class _Logits(torch.nn.Module):
    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=input_ids).logits


def _unit_scale(model: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """Weights that keep activations at unit scale (as ``realistic_llama_weights``): linears N(0, 1/fan_in),
    embeddings N(0, 1), norm scales 1 + N(0, 0.1²), biases N(0, 0.1²)."""
    from transformers.pytorch_utils import Conv1D

    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for mod in model.modules():
            weight = getattr(mod, "weight", None)
            if not isinstance(weight, torch.nn.Parameter):
                continue
            if isinstance(mod, (torch.nn.Linear, Conv1D)):
                fan_in = weight.shape[1] if isinstance(mod, torch.nn.Linear) else weight.shape[0]
                weight.copy_(torch.randn(weight.shape, generator=gen) / math.sqrt(fan_in))
            elif isinstance(mod, torch.nn.Embedding):
                weight.copy_(torch.randn(weight.shape, generator=gen))
            elif weight.dim() == 1:
                weight.copy_(1 + 0.1 * torch.randn(weight.shape, generator=gen))
            bias = getattr(mod, "bias", None)
            if isinstance(bias, torch.nn.Parameter):
                bias.copy_(0.1 * torch.randn(bias.shape, generator=gen))
    return model.eval()


def _config(kind: str):
    import transformers

    common = dict(vocab_size=512, attn_implementation="eager")
    if kind == "llama":
        return transformers.LlamaForCausalLM(transformers.LlamaConfig(
            hidden_size=96, intermediate_size=160, num_hidden_layers=2, num_attention_heads=6, num_key_value_heads=2,
            max_position_embeddings=128, use_cache=False, **common))
    if kind == "qwen2":
        return transformers.Qwen2ForCausalLM(transformers.Qwen2Config(
            hidden_size=96, intermediate_size=160, num_hidden_layers=2, num_attention_heads=6, num_key_value_heads=2,
            max_position_embeddings=128, use_cache=False, **common))
    return transformers.GPT2LMHeadModel(transformers.GPT2Config(
        n_embd=96, n_layer=2, n_head=6, n_positions=128, use_cache=False, **common))


@pytest.mark.parametrize("kind", ["llama", "qwen2", "gpt2"])
def test_transformers_configs_compute_what_eager_computes(kind):
    torch.manual_seed(0)
    module = _Logits(_unit_scale(_config(kind)))
    inputs = (torch.randint(0, 512, (2, 20), generator=torch.Generator().manual_seed(1)),)
    gm = capture(module, inputs, kind)
    if kind == "gpt2":
        # GPT-2 has no float32 islands of its own (softmax in the input's dtype): the record changes nothing
        casts, _ = m.record_casts(module, inputs, gm, torch.bfloat16)
        eager, graph, _blanket, graph_vs_eager, _ = _errors(gm, module, inputs, torch.bfloat16, casts)
        assert graph <= 1.5 * eager and graph_vs_eager < 1e-6, (graph, eager, graph_vs_eager)
        return
    _check(gm, module, inputs, kind)


def test_a_plan_made_at_fp32_applies_at_bf16(analyze_cached):
    """The analysis (and so every chain id) is the float32 capture's whatever the run dtype: a plan of it
    runs at bf16 with every chain applied, the model's casts kept, the fused output near the unfused."""
    from explorer.fusions.plan import make_plan
    from explorer.runtime.session import measure
    from explorer.runtime.settings import RunSettings

    _model, _graph, fp32 = analyze_cached("llama_decoder", 1, 12)
    plan = make_plan(fp32, "all")
    report = measure("llama_decoder", plan.to_dict(),
                     RunSettings(device="cpu", dtype="bf16", batch=1, seq_len=12, quick=True, stages=False))
    assert report.failures == ()
    assert report.plan.accepted == plan.accepted and [c.id for c in report.chains] == list(plan.accepted)
    assert all(c.status == "fused" for c in report.chains), [(c.id, c.reason) for c in report.chains]
    assert any("the model's own casts kept in bfloat16" in n for n in report.notes), report.notes
    assert report.unfused.precision.rel_l2 < 3e-2 and report.fused_vs_unfused.rel_l2 < 3e-2


class _Buckets(torch.nn.Module):
    """T5's relative-position buckets (its unidirectional form) indexing a table, and, as the control, integer
    positions cast to the activations' dtype that meet them (model work, which runs in the run dtype)."""

    def __init__(self, buckets: int = 32, max_distance: int = 1024):
        super().__init__()
        self.buckets, self.max_distance = buckets, max_distance
        self.table = torch.nn.Embedding(buckets, 4)

    def forward(self, x):
        pos = torch.arange(x.shape[1])
        rp = -torch.min(pos[None, :] - pos[:, None], torch.zeros_like(pos[None, :] - pos[:, None]))
        exact = self.buckets // 2
        large = exact + (torch.log(rp.float() / exact) / math.log(self.max_distance / exact)
                         * (self.buckets - exact)).to(torch.long)
        bucket = torch.where(rp < exact, rp, torch.min(large, torch.full_like(large, self.buckets - 1)))
        return x + self.table(bucket).sum(-1), x * pos.to(x.dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=["bf16", "fp16"])
def test_an_index_computation_keeps_its_float32_without_a_cast_record(dtype):
    """Without a cast record (a model whose capture in the run dtype differs, as T5's does) the capture dtype
    becomes the run dtype everywhere but in an index computation (``measure._index_regions``): T5's buckets in
    bf16 pick other table rows (27 of 1008 distances here) and, on a GPU, index past the table. Kept in float32
    the graph's output is eager's exactly; the positions that meet ``x`` still run in the run dtype."""
    torch.manual_seed(0)
    model = _Buckets().eval()
    x = (torch.randn(1, 600),)
    gm = capture(model, x, "buckets")
    prepared = m.prepare_graph(gm, "cpu", dtype, lean=False, casts=None)
    kept = {n.name for n in prepared.graph.nodes if n.target is torch.ops.aten.to.dtype and n.args[1] is torch.float32}
    assert len(kept) == 1                                   # the bucket's ``rp.float()``; not ``pos.to(x.dtype)``
    with torch.inference_mode():
        got = prepared(*m.prepare_inputs(x, "cpu", dtype))
        want = model.to(dtype)(x[0].to(dtype))
    for g, w in zip(got, want):
        assert g.dtype == w.dtype == dtype
        torch.testing.assert_close(g, w, rtol=0, atol=0)


#: The corpus entries whose capture in a run dtype differs from their float32 capture, so that no cast record
#: applies, and the dtypes where it differs (``benchmarks/check_cast_records.py`` at CI sizes, all 117 entries:
#: ``benchmarks/results/cast_records_cpu.json``; every torchvision and timm entry has a record in both): T5 (its
#: norm casts back to its weight's dtype in bf16 and fp16, and clamps in fp16), Whisper's encoder (its fp16
#: clamp), Mixtral (its experts take another path in bf16). In the others' dtypes a record applies (Mixtral's
#: fp16 and torchvision Swin's bf16 only since ``record_casts`` retries on fake CPU tensors: on meta tensors
#: transformers' MoE, and Swin, take another path than on the CPU).
BRANCHING = {"hf/t5_encoder": ("bf16", "fp16"), "hf/whisper_encoder": ("fp16",), "hf/mixtral": ("bf16",)}
LABELS = {"bf16": torch.bfloat16, "fp16": torch.float16}


def _check_run_dtype_baseline(module, inputs, gm, branching, what, changed: bool):
    """Where the model branches on its dtype: no record, and the unfused baseline (``run_dtype_graph``, prepared)
    is eager bit for bit and within 1.5x of eager's error; elsewhere a record and no run-dtype graph. ``changed``:
    the float32 capture prepared without a record is not eager (the test could fail on it)."""
    ref = _reference(gm, inputs)
    for label, dtype in LABELS.items():
        casts, note = m.record_casts(module, inputs, gm, dtype)
        typed = m.run_dtype_graph(module, inputs, gm, dtype)
        if label not in branching:
            assert casts is not None and typed is None, (what, label, note)
            continue
        assert casts is None and "differs from its float32 capture" in note, (what, label, note)
        assert typed is not None, (what, label)
        x = m.prepare_inputs(inputs, "cpu", dtype)
        with torch.inference_mode():
            eager = m.prepare_module(module, "cpu", dtype)(*x)
            graph = m.prepare_graph(typed, "cpu", dtype)(*x)
            blanket = m.prepare_graph(gm, "cpu", dtype)(*x)
        rel = lambda out, against: m.precision(out, against, False, dtype)["rel_l2"]  # noqa: E731
        as_eager = [t.double() for t in m.flat_outputs(eager)]
        e, g = rel(eager, ref), rel(graph, ref)
        assert math.isfinite(e) and e > 1e-5, (what, label, e)
        assert g <= 1.5 * e, (what, label, g, e)
        assert rel(graph, as_eager) < 1e-6, (what, label, rel(graph, as_eager))
        if changed:
            assert rel(blanket, as_eager) > 1e-4, (what, label, rel(blanket, as_eager))


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow if n == "hf/mixtral" else [])
                                  for n in BRANCHING])
def test_the_corpus_models_that_branch_on_their_dtype(name):
    """Each corpus entry of ``BRANCHING`` at its CI size (T5's and Whisper's in seconds, Mixtral's ``slow``): in
    the dtypes it branches in, no record and the baseline eager has (for T5, the float32 capture prepared
    without a record is not eager); in the others, a record. Chains and plans stay the float32 capture's
    (``test_a_plan_made_at_fp32_applies_at_bf16``; for a model that branches, in the runner:
    ``test_the_session_times_the_run_dtype_baseline_with_the_float32_plan``)."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from benchmarks import corpus

    entry = corpus.by_name(name)
    module = entry.build("ci")
    inputs = entry.inputs("ci", module=module)
    features = corpus.features_module(entry, module)
    gm = capture(features, inputs, name)
    _check_run_dtype_baseline(features, inputs, gm, BRANCHING[name], name, changed=name == "hf/t5_encoder")


@pytest.mark.slow
def test_the_session_times_the_run_dtype_baseline_with_the_float32_plan(tmp_path):
    """The runner on a T5 encoder folder in bf16: a plan made on the float32 analysis applies as made (every
    chain fused, the same ids), the note says the unfused baseline is the run-dtype capture, and that baseline
    is eager: its error against float64 is what eager's is (``measure.run_dtype_graph``)."""
    import transformers

    from explorer.fusion_engine import analyze
    from explorer.fusions.plan import make_plan
    from explorer.runtime.session import measure
    from explorer.runtime.settings import RunSettings

    torch.manual_seed(0)
    folder = tmp_path / "t5"
    _unit_scale(transformers.T5EncoderModel(transformers.T5Config(
        vocab_size=200, d_model=48, d_kv=12, d_ff=80, num_layers=2, num_heads=4))).save_pretrained(folder)
    fp32 = analyze(str(folder), batch=1, seq_len=8)
    plan = make_plan(fp32.detection, "all")
    assert plan.accepted
    report = measure(str(folder), plan.to_dict(), RunSettings(device="cpu", dtype="bf16", batch=1, seq_len=8,
                                                              quick=True, stages=False, per_chain=False))
    assert report.failures == ()
    assert [c.id for c in report.chains] == list(plan.accepted)
    assert all(c.status == "fused" for c in report.chains), [(c.id, c.reason) for c in report.chains]
    assert any("the unfused baseline is the model captured in bfloat16" in n for n in report.notes), report.notes
    model = fp32.model
    x = m.prepare_inputs(model.example_inputs, "cpu", torch.bfloat16)
    with torch.inference_mode():
        eager = m.prepare_module(model.module, "cpu", torch.bfloat16)(*x)
    e = m.precision(eager, _reference(model.gm, model.example_inputs), False, torch.bfloat16)["rel_l2"]
    assert report.unfused.precision.rel_l2 == pytest.approx(e, rel=1e-6), (report.unfused.precision.rel_l2, e)
