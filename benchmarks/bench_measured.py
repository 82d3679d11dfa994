"""Issue 22's measured table in one command: every model, every compile mode that matters, one process per model.

For each model, in a process of its own (so no model's profile, allocator or compiled code touches another's),
every variant is timed in the SAME alternated rounds (``explorer.runtime.measure.time_paired``: CUDA events around
one synchronised call, warm-up first, each timed call after one of its own, ABBA order, more rounds while a verdict
is open):

- plain calls: ``unfused`` (the captured graph as the runner prepares it), ``fused`` (every chain, lean),
  ``compile_default`` and ``compile_max_autotune_no_cudagraphs`` (``torch.compile`` of the eager module);
- CUDA graphs: ``fused_graph`` (the fused forward captured by the runner's own capture) and
  ``compile_reduce_overhead`` (torch.compile's CUDA graphs), the only pairing of the graph target;
- ``unfused_graph`` and ``compile_default_graph`` (the same capture of the unfused graph and of inductor's
  default wrapper): with ``unfused_graph`` and ``fused_graph`` they give host µs per launch as
  ``bench_launch_path.py`` defines it, per round ``(plain − its own replay) / kernels launched``, and the host
  time to issue one call with the GPU idle.

Then one profile per variant (3 synchronised forwards, per-forward figures): GPU busy (union of the kernels'
intervals), kernel launches, the top kernels. Every variant's output is compared with the unfused graph run in
float64. Verdicts (``explorer.stats.compare``, paired rounds, 3% minimum effect):

1. fused against the faster (median) of compile default and max-autotune-no-cudagraphs, and against unfused;
2. fused + CUDA graphs against reduce-overhead;
3. host µs per launch: fused against inductor (compile default).

max-autotune-no-cudagraphs compiles for minutes: the model's first session (every other variant) is timed and
written first; the autotuned compile then runs only if its expected time (``CASES``) fits before ``--budget-s``,
and a second session times every variant again with it, which the verdicts use (the first stays in the JSON: the
spread between the two sessions is what separates noise from a difference).

``--precompile-workers N`` compiles every model's default mode first, in N parallel processes sharing one
``TORCHINDUCTOR_CACHE_DIR`` (FX graph cache on), so the serial phase loads inductor's code from the cache; the
JSON keeps the phase's wall time, each worker's (cold, contended) compile time and each model's warm compile in
the serial phase, to decide whether it saves device time. Autotuning modes are never compiled in parallel (they
benchmark candidate kernels on the GPU: two at once would make inductor's choices unfair).

Models (``--models``, in this order by default: what issue 22 most needs first)::

    llama_decoder_8b_layers  zoo, Llama-3-8B layer sizes, 2 layers   bf16  4 x 1024
    gpt2_medium_layers       HF folder (GPT2Config n_embd 1024, 16 heads, 4 layers), seeded, via explorer.sources
                                                                      bf16  4 x 1024
    convnext_tiny            zoo                                      fp16  32, channels_last
    llama_decoder            zoo decoder prefill                      bf16  16 x 1024
    llama_decode_step        zoo decode step, cache 1024              bf16  16
    resnet50 mobilenet_v2 efficientnet_b0                             fp16  32, channels_last
    bert_base                                                         fp16  32 x 128

Usage::

    python3 benchmarks/bench_measured.py --models llama_decoder_8b_layers,gpt2_medium_layers --budget-s 540
    python3 benchmarks/bench_measured.py --modes default,reduce-overhead --precompile-workers 4
    python3 benchmarks/bench_measured.py --smoke        # CPU, two tiny cases end to end (not GPU numbers)
    python3 benchmarks/measured_table.py FILE.json ...  # the README's table from the JSON

Writes ``--out`` (default ``$OUT/bench_measured.json``, else ``benchmarks/results/bench_measured.json``) after
every model, so a run cut short keeps what it measured; prints a short table last. No model and no autotuned
compile starts past ``--budget-s`` (a model that started gets its default and reduce-overhead compiles while 40 s
are left before ``--hard-s``); a model still running at ``--hard-s`` is stopped and keeps what its process had written.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks import _common as common  # noqa: E402

SCHEMA = "bench_measured/1"
MODES = ("default", "reduce-overhead", "max-autotune-no-cudagraphs")
MANT = "max-autotune-no-cudagraphs"
LABELS = {"default": "compile_default", "reduce-overhead": "compile_reduce_overhead",
          MANT: "compile_max_autotune_no_cudagraphs"}


@dataclasses.dataclass(frozen=True)
class Case:
    """One model measured: its source (a zoo name, or ``hf:gpt2:<sizes key>`` for a folder this script writes),
    batch, sequence length (None for images), dtype, channels_last, its title in the table, and the seconds
    max-autotune-no-cudagraphs is expected to compile for (earlier H200 runs; a guess where none ran)."""

    key: str
    source: str
    batch: int
    seq_len: int | None
    dtype: str
    channels_last: bool
    title: str
    autotune_s: float
    min_s: float = 50.0          # seconds it needs at least without the autotuned compile (H200, call 1 of 12-02)


CASES = {c.key: c for c in (
    Case("llama_decoder_8b_layers", "llama_decoder_8b_layers", 4, 1024, "bf16", False,
         "8B-layer decoder prefill 4 × 1024", 150, 65),
    Case("gpt2_medium_layers", "hf:gpt2:medium", 4, 1024, "bf16", False, "GPT-2-medium layers (HF folder) 4 × 1024",
         150, 75),
    Case("convnext_tiny", "convnext_tiny", 32, None, "fp16", True, "ConvNeXt-Tiny", 250),
    Case("llama_decoder", "llama_decoder", 16, 1024, "bf16", False, "zoo decoder prefill 16 × 1024", 100),
    Case("llama_decode_step", "llama_decode_step", 16, 1024, "bf16", False, "zoo decode step, cache 1024", 80,
         110),   # its default-mode compile alone took 83 s (a precompile worker, 12-02)
    Case("resnet50", "resnet50", 32, None, "fp16", True, "ResNet-50", 300),
    Case("mobilenet_v2", "mobilenet_v2", 32, None, "fp16", True, "MobileNetV2", 340),
    Case("efficientnet_b0", "efficientnet_b0", 32, None, "fp16", True, "EfficientNet-B0", 480),
    Case("bert_base", "bert_base", 32, 128, "fp16", False, "BERT-base s128", 150),
)}
SMOKE_CASES = {c.key: c for c in (
    Case("residual_block_smoke", "residual_block", 2, None, "fp32", True, "residual block (smoke)", 0),
    Case("gpt2_tiny_smoke", "hf:gpt2:tiny", 2, 16, "bf16", False,
         "GPT-2 tiny, HF folder, bf16 (smoke: the cast record)", 0),
)}
#: GPT2Config sizes of the folders this script writes (seeded weights).
GPT2_SIZES = {"medium": dict(n_embd=1024, n_head=16, n_layer=4, n_positions=1024),
              "tiny": dict(n_embd=64, n_head=4, n_layer=2, n_positions=64)}
ISSUE_CALLS = 40


# ====================================================================== loading

def write_gpt2_folder(size: str, folder: Path) -> None:
    """A Hugging Face folder (``save_pretrained``, safetensors, bf16 on a GPU run) of GPT-2 at ``GPT2_SIZES[size]``,
    vocabulary 50257, seeded weights: what a user would hand the explorer."""
    import torch
    import transformers

    config = transformers.GPT2Config(vocab_size=50257, **GPT2_SIZES[size])
    torch.manual_seed(0)
    model = transformers.GPT2Model(config)
    if size != "tiny":
        model = model.to(torch.bfloat16)
    model.save_pretrained(folder, safe_serialization=True)


def load_case(case: Case, tmp: Path):
    """``fusion_engine.analyze`` of the case's source (a folder written first for ``hf:`` sources)."""
    from explorer.fusion_engine import analyze

    source = case.source
    if source.startswith("hf:"):
        _, _arch, size = source.split(":")
        folder = tmp / f"gpt2_{size}"
        write_gpt2_folder(size, folder)
        source = str(folder)
    return analyze(source, batch=case.batch, seq_len=case.seq_len)


def prepared(case: Case, device: str, tmp: Path) -> dict:
    """The model loaded, fused (every chain) and prepared on ``device`` in the case's dtype and layout, both graphs
    with the model's own casts (``measure.record_casts``, as the runner's ``session`` prepares them)."""
    from explorer.fusion_engine import fuse
    from explorer.fusions.plan import make_plan
    from explorer.runtime import measure as m

    analysis = load_case(case, tmp)
    model, _graph, det = analysis
    plan = make_plan(det, "all", memory_format="channels_last" if case.channels_last else "nchw")
    fused = fuse(analysis, plan, device)
    dtype = m.torch_dtype(case.dtype)
    # the model's own casts (its fp32 upcasts in a bf16/fp16 run: RMSNorm statistics, softmax, rotary angles) kept
    # in both graphs, exactly as the runner prepares them (explorer.runtime.session): eager and torch.compile keep
    # them, so without the record the graphs would compute those steps in the run dtype and be compared unfairly
    casts, cast_note = (m.record_casts(model.module, model.example_inputs, model.gm, dtype)
                        if model.module is not None else (None, "no eager module: no cast record"))
    return dict(analysis=analysis, model=model, detection=det, fused=fused, dtype=dtype,
                casts=dict(kept=casts is not None, note=cast_note or ("float32/float64 run: no record needed"
                                                                      if casts is None else "")),
                inputs=m.prepare_inputs(model.example_inputs, device, dtype, case.channels_last),
                unfused_gm=m.prepare_graph(model.gm, device, dtype, case.channels_last, casts=casts),
                fused_gm=m.prepare_graph(fused.gm, device, dtype, case.channels_last, casts=casts),
                eager=m.prepare_module(model.module, device, dtype, case.channels_last))


# ====================================================================== measuring one model (a child process)

def host_issue_ms(fn: Callable[[], Any], device: str, calls: int = ISSUE_CALLS) -> list[float]:
    """Host time to issue one call with an idle GPU (``bench_launch_path.host_issue_ms``): ms per call."""
    from explorer.runtime import measure as m

    times = []
    for _ in range(calls):
        m.synchronize(device)
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    m.synchronize(device)
    return times


def host_per_launch(plain_ms: list[float], graph_ms: list[float], launches: float) -> list[float]:
    """Exposed host µs per launch, per round: (plain call − its own CUDA-graph replay) / kernels launched."""
    return [(a - b) * 1e3 / launches for a, b in zip(plain_ms, graph_ms)]


def verdict(samples: dict[str, list[float]], baseline: str, candidate: str, basis: str, target: str) -> dict:
    """``explorer.stats.compare`` of ``candidate`` against ``baseline`` over their paired rounds, with medians."""
    from explorer import stats

    test = stats.compare(samples[baseline], samples[candidate], basis=basis)
    c_ms, b_ms = statistics.median(samples[candidate]), statistics.median(samples[baseline])
    return dict(target=target, candidate=candidate, baseline=baseline, candidate_ms=c_ms, baseline_ms=b_ms,
                verdict=test.label, met=test.label != stats.SLOWER, ratio=test.ratio, ci_low=test.ci_low,
                ci_high=test.ci_high, p_value=test.p_value, n=test.n, note=test.note, method=test.method)


def session_verdicts(samples: dict[str, list[float]], medians_from: dict[str, list[float]] | None = None) -> list[dict]:
    """The issue's pairings among the variants of one session (``samples``: every round of each)."""
    out = []
    compiled = [v for v in (LABELS["default"], LABELS[MANT]) if v in samples]
    if "fused" in samples and compiled:
        best = min(compiled, key=lambda v: statistics.median(samples[v]))
        out.append(verdict(samples, best, "fused", "plain calls, paired rounds",
                           "fused <= faster of compile default / max-autotune-no-cudagraphs"
                           + ("" if LABELS[MANT] in samples else " (max-autotune-no-cudagraphs not measured)")))
    if "fused" in samples and "unfused" in samples:
        out.append(verdict(samples, "unfused", "fused", "plain calls, paired rounds", "fused vs unfused"))
    if "fused_graph" in samples and LABELS["reduce-overhead"] in samples:
        out.append(verdict(samples, LABELS["reduce-overhead"], "fused_graph", "CUDA graphs, paired rounds",
                           "fused + CUDA graphs <= reduce-overhead"))
    return out


def compile_mode(eager, mode: str, inputs: tuple, device: str) -> tuple[Callable[[], Any], Any, float, dict]:
    """``_common.compile_copy`` in ``mode`` (``default`` is mode None), with inductor's CUDA-graph skip counters
    (reduce-overhead skips its capture where inputs are mutated: the decode step's cache)."""
    try:
        from torch._dynamo.utils import counters
    except Exception:  # the counters are evidence, not a requirement
        counters = None
    before = {k: dict(v) for k, v in counters.items()} if counters is not None else {}
    call, target, seconds = common.compile_copy(eager, None if mode == "default" else mode, inputs, device)
    skips = {}
    if counters is not None:
        for group, values in counters.items():
            for k, n in values.items():
                if "cudagraph" in f"{group}{k}".lower() and n != before.get(group, {}).get(k, 0):
                    skips[f"{group}:{str(k)[:160]}"] = n
    return call, target, seconds, skips


#: Seconds a default or reduce-overhead compile and the session after it need at least.
COMPILE_AND_SESSION_S = 40.0


def measure_case(case: Case, args, deadline: float, write: Callable[[dict], None], hard: float = float("inf")) -> dict:
    """Everything of one model (module docstring); ``write(partial)`` after each stage. ``deadline``: no autotuned
    compile starts after it; ``hard``: when the parent stops this process (both ``time.perf_counter`` values)."""
    import torch

    from explorer.runtime import measure as m
    from explorer.runtime.variants import reference_output

    device = "cpu" if args.smoke else "cuda"
    cuda = device == "cuda"
    t0 = time.perf_counter()
    stage: dict[str, Any] = dict(case=dataclasses.asdict(case), notes=[], compile_s={}, compile_notes={})
    notes = stage["notes"]

    def checkpoint(what: str) -> None:
        stage["stage"] = what
        stage["wall_s"] = round(time.perf_counter() - t0, 1)
        write(stage)

    with tempfile.TemporaryDirectory(prefix="bench_measured_") as tmp:
        p = prepared(case, device, Path(tmp))
    model, det, fused = p["model"], p["detection"], p["fused"]
    stage.update(model=model.name, source=model.source, batch=case.batch, seq_len=case.seq_len, dtype=case.dtype,
                 memory_format="channels_last" if case.channels_last else "nchw",
                 chains_detected=len(det.chains),
                 chains_fused=sum(1 for a in fused.applied if a.status == "fused"), casts=p["casts"],
                 load_s=round(time.perf_counter() - t0, 1))
    ref, where = reference_output(model.gm, model.example_inputs, device)
    stage["reference"] = where
    checkpoint("loaded")
    inputs, unfused_gm, fused_gm, eager = p["inputs"], p["unfused_gm"], p["fused_gm"], p["eager"]
    plain: dict[str, Callable[[], Any]] = {"unfused": lambda: unfused_gm(*inputs), "fused": lambda: fused_gm(*inputs)}
    keep: list[Any] = []
    for mode in [md for md in args.modes if md != MANT]:
        if mode == "reduce-overhead" and not cuda:
            notes.append("compile_reduce_overhead: not timed (CUDA graphs need CUDA)")
            continue
        # a model that started before --budget-s gets its default and reduce-overhead compiles (seconds each)
        # while --hard-s leaves time for them and a session: call 2 lost BERT's baselines to its own load time
        if time.perf_counter() > hard - COMPILE_AND_SESSION_S:
            notes.append(f"{LABELS[mode]}: skipped: less than {COMPILE_AND_SESSION_S:.0f} s left before --hard-s")
            continue
        try:
            call, target, seconds, skips = compile_mode(eager, mode, inputs, device)
        except Exception as exc:  # a compile that fails is a result
            notes.append(f"{LABELS[mode]}: torch.compile failed: {m._one_line(exc)[:200]}")
            continue
        keep.append(target)
        plain[LABELS[mode]] = call
        stage["compile_s"][LABELS[mode]] = seconds
        if skips:
            stage["compile_notes"][LABELS[mode]] = skips
        checkpoint(f"compiled {mode}")
    variants = dict(plain)
    replays = {}
    for name in ("unfused", "fused", LABELS["default"]):
        if name not in plain:
            continue
        if not cuda:
            notes.append(f"{name}_graph: not timed (CUDA graphs need CUDA)")
            continue
        replay, why = common.cuda_graph_replay(plain[name], device)
        if replay is None:
            notes.append(f"{name}_graph: not captured: {why}")
            continue
        replays[f"{name}_graph"] = replay
    variants.update(replays)
    # the reduce-overhead variant goes beside the graph replays in the table's order
    if LABELS["reduce-overhead"] in variants:
        variants[LABELS["reduce-overhead"]] = variants.pop(LABELS["reduce-overhead"])
    stage["sessions"] = []
    stage["sessions"].append(time_session(variants, ref, device, args, "session 1"))
    stage["verdicts"] = session_verdicts(stage["sessions"][0]["samples_ms"])
    checkpoint("session 1")
    if MANT in args.modes:
        left = deadline - time.perf_counter()
        if args.autotune_models is not None and case.key not in args.autotune_models:
            notes.append("compile_max_autotune_no_cudagraphs: not run for this model in this call "
                         "(--autotune-models)")
        elif left < case.autotune_s:
            notes.append(f"compile_max_autotune_no_cudagraphs: skipped: {left:.0f} s left before --budget-s, its "
                         f"compile is expected to take about {case.autotune_s:.0f} s")
        else:
            try:
                call, target, seconds, _skips = compile_mode(eager, MANT, inputs, device)
                keep.append(target)
                stage["compile_s"][LABELS[MANT]] = seconds
                checkpoint(f"compiled {MANT}")
                order = list(variants)
                order.insert(order.index(LABELS["default"]) + 1 if LABELS["default"] in order else 2, LABELS[MANT])
                variants[LABELS[MANT]] = call
                variants = {v: variants[v] for v in order}
                stage["sessions"].append(time_session(variants, ref, device, args, "session 2"))
                stage["verdicts"] = session_verdicts(stage["sessions"][-1]["samples_ms"])
            except Exception as exc:
                notes.append(f"compile_max_autotune_no_cudagraphs: failed: {m._one_line(exc)[:200]}")
    final = stage["sessions"][-1]
    stage["final_session"] = len(stage["sessions"])
    stage["host"] = host_figures(plain, final, device)
    stage["gpu_busy"] = busy_figures(final["variants"])
    del plain, variants, replays, keep
    if cuda:
        torch.cuda.empty_cache()
    checkpoint("done")
    return stage


def time_session(variants: dict[str, Callable[[], Any]], ref, device: str, args, what: str) -> dict:
    """Check every variant against float64, time them all in the same alternated rounds, then profile each."""
    import torch

    from explorer.runtime import measure as m

    log = common.elapsed_logger(START)
    log(f"{what}: {len(variants)} variants against float64: {', '.join(variants)}")
    precision = {}
    with torch.inference_mode():
        for v, fn in variants.items():
            precision[v] = common.errors(m.flat_outputs(fn())[0].float(), ref[0])
    plan = (m.TimingPlan(warmup=1, reps=args.smoke_rounds) if args.smoke else
            m.TimingPlan(warmup=5, reps=None, target_s=args.target_s, min_reps=40, max_reps=400,
                         max_rounds=800, budget_s=args.extend_s))
    names = list(variants)
    pairs = [(b, c) for b, c in ((LABELS["default"], "fused"), (LABELS[MANT], "fused"),
                                 (LABELS["reduce-overhead"], "fused_graph")) if b in names and c in names]
    cpu_before = common._cpu_times()
    t0 = time.perf_counter()
    samples = m.time_paired(variants, pairs, device, plan)
    timing_s = time.perf_counter() - t0
    host = common.host_activity(cpu_before, common._cpu_times())
    log(f"{what}: {len(samples[names[0]])} rounds in {timing_s:.1f} s; profiling each variant")
    profiles = {v: common.profile_forward(fn, device, top=8, cpu_ops=args.smoke, calls=args.profile_calls)
                for v, fn in variants.items()}
    return dict(name=what, rounds=len(samples[names[0]]), timing_s=round(timing_s, 1), host_activity=host,
                variants={v: dict(latency_ms=m.summarize(samples[v]), precision=precision[v], **profiles[v])
                          for v in variants},
                samples_ms={v: [round(t, 5) for t in s] for v, s in samples.items()})


def host_figures(plain: dict[str, Callable[[], Any]], session: dict, device: str) -> dict:
    """Host µs per launch (exposed, per paired round) and to issue one call, for unfused, fused and inductor."""
    from explorer import stats
    from explorer.runtime import measure as m

    samples, rows = session["samples_ms"], session["variants"]
    out: dict[str, Any] = {"variants": {}}
    per_round: dict[str, list[float]] = {}
    issue: dict[str, list[float]] = {}
    for v in ("unfused", "fused", LABELS["default"]):
        if v not in samples:
            continue
        import torch

        with torch.inference_mode():
            issue[v] = host_issue_ms(plain[v], device)
        launches = rows[v].get("kernel_launches")
        row = {"launches": launches, "host_issue_ms": m.summarize(issue[v])}
        if launches:
            row["host_issue_us_per_launch"] = m.summarize([t * 1e3 / launches for t in issue[v]])
        if launches and f"{v}_graph" in samples:
            per_round[v] = host_per_launch(samples[v], samples[f"{v}_graph"], launches)
            row["host_us_per_launch"] = m.summarize(per_round[v])
            row["exposed_host_ms"] = m.summarize([a - b for a, b in zip(samples[v], samples[f"{v}_graph"])])
        else:
            row["host_us_per_launch"] = None
            row["note"] = "needs the variant's CUDA-graph replay and its launch count (CUDA only)"
        out["variants"][v] = row
    ind = LABELS["default"]
    if "fused" in per_round and ind in per_round:
        # compare() tests log ratios of positive values: a round whose replay came out slower than its plain
        # call (noise) is clipped to 1 ns of host time rather than dropped (bench_launch_path does the same)
        clip = [max(x, 1e-3) for x in per_round[ind]], [max(x, 1e-3) for x in per_round["fused"]]
        out["verdict_per_launch"] = dataclasses.asdict(stats.compare(
            *clip, basis="exposed host µs per launch, fused graph against torch.compile default"))
    if "fused" in issue and ind in issue:
        out["verdict_issue"] = dataclasses.asdict(stats.compare(
            issue[ind], issue["fused"], basis="host time to issue one call, fused against torch.compile default"))
    return out


def busy_figures(rows: dict) -> dict:
    """GPU busy per forward: fused against the lower of the inductor modes (plain calls), and with CUDA graphs."""
    def busy(v):
        return (rows.get(v) or {}).get("gpu_busy_ms")

    inductor = {v: busy(v) for v in (LABELS["default"], LABELS[MANT]) if busy(v) is not None}
    out = {"fused_ms": busy("fused"), "unfused_ms": busy("unfused"), "inductor_ms": inductor,
           "fused_graph_ms": busy("fused_graph"), "reduce_overhead_ms": busy(LABELS["reduce-overhead"])}
    if out["fused_ms"] is not None and inductor:
        best = min(inductor, key=inductor.get)
        out.update(inductor_best=best, ratio=out["fused_ms"] / inductor[best], met=out["fused_ms"] <= inductor[best])
    return out


def child_measure(args) -> int:
    """``--worker measure``: one model in this process, its record rewritten to ``--child-out`` at each stage."""
    case = (SMOKE_CASES if args.smoke else CASES)[args.case]
    path = Path(args.child_out)

    def write(doc: dict) -> None:
        common.write_json(path, doc)

    try:
        now = time.perf_counter() - time.time()
        measure_case(case, args, args.deadline_at + now, write, (args.hard_at + now) if args.hard_at else float("inf"))
    except Exception as exc:  # the parent reads the error from the record
        import traceback

        from explorer.runtime import measure as m

        traceback.print_exc()
        doc = json.loads(path.read_text()) if path.exists() else {}
        doc["error"] = m._one_line(exc)[:300]
        write(doc)
        return 1
    return 0


def child_precompile(args) -> int:
    """``--worker precompile``: compile the case's eager module in default mode (filling the shared cache)."""
    case = (SMOKE_CASES if args.smoke else CASES)[args.case]
    device = "cpu" if args.smoke else "cuda"
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bench_measured_") as tmp:
        from explorer.runtime import measure as m

        analysis = load_case(case, Path(tmp))
        model = analysis.model
        dtype = m.torch_dtype(case.dtype)
        eager = m.prepare_module(model.module, device, dtype, case.channels_last)
        inputs = m.prepare_inputs(model.example_inputs, device, dtype, case.channels_last)
        load_s = time.perf_counter() - t0
        _call, _target, seconds = common.compile_copy(eager, None, inputs, device)
    common.write_json(Path(args.child_out), dict(case=case.key, load_s=round(load_s, 1), compile_s=seconds,
                                                 wall_s=round(time.perf_counter() - t0, 1)))
    return 0


# ====================================================================== the parent: budget, processes, JSON

START = time.perf_counter()


def child_env(cache_dir: str) -> dict:
    """The environment of every child: the repository importable, one shared inductor cache, CUPTI torn down."""
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
               TORCHINDUCTOR_CACHE_DIR=cache_dir, TORCHINDUCTOR_FX_GRAPH_CACHE="1",
               TORCHINDUCTOR_AUTOGRAD_CACHE="1", TEARDOWN_CUPTI="1")
    env.setdefault("FUSION_EXPLORER_MEMORY_BUDGET", "64GiB")
    return env


def child_command(args, worker: str, key: str, out: Path, deadline_at: float) -> list[str]:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", worker, "--case", key, "--child-out", str(out),
           "--deadline-at", f"{deadline_at:.3f}", "--hard-at", f"{deadline_at - args.budget_s + args.hard_s:.3f}",
           "--modes", ",".join(args.modes), "--target-s", str(args.target_s),
           "--extend-s", str(args.extend_s), "--profile-calls", str(args.profile_calls)]
    if args.autotune_models is not None:
        cmd += ["--autotune-models", ",".join(args.autotune_models)]
    return cmd + (["--smoke"] if args.smoke else [])


def precompile_phase(args, keys: list[str], env: dict, tmp: Path, log) -> dict:
    """Default-mode compiles of every model in ``args.precompile_workers`` parallel processes (one shared cache)."""
    t0 = time.perf_counter()
    pending, running, done = list(keys), [], {}
    hard_at = START + args.precompile_s
    while pending or running:
        while pending and len(running) < args.precompile_workers:
            key = pending.pop(0)
            out = tmp / f"precompile_{key}.json"
            log(f"precompile: {key}")
            proc = subprocess.Popen(child_command(args, "precompile", key, out, time.time()), env=env,
                                    stdout=subprocess.DEVNULL, stderr=open(tmp / f"precompile_{key}.log", "w"))
            running.append((key, proc, out))
        time.sleep(0.5)
        for item in list(running):
            key, proc, out = item
            if proc.poll() is None and time.perf_counter() < hard_at:
                continue
            if proc.poll() is None:
                proc.kill()
                proc.wait()
                done[key] = {"error": f"stopped at --precompile-s {args.precompile_s:.0f}"}
            elif out.exists():
                done[key] = json.loads(out.read_text())
            else:
                tail = (tmp / f"precompile_{key}.log").read_text()[-400:]
                done[key] = {"error": f"exit {proc.returncode}: {tail.strip().splitlines()[-1:] or ''}"}
            running.remove(item)
    return {"workers": args.precompile_workers, "wall_s": round(time.perf_counter() - t0, 1), "cases": done}


def precompile_summary(pre: dict, models: dict) -> dict:
    """Did the parallel default-mode compiles save time? Σ cold compiles (each worker's, contended) against the
    phase's wall time plus Σ warm compiles in the serial phase. Cold compiles measured serially (a run without
    the phase) are the fairer baseline: the README compares with those where both exist."""
    cold = {k: v.get("compile_s") for k, v in pre["cases"].items() if v.get("compile_s") is not None}
    warm = {k: (m.get("compile_s") or {}).get(LABELS["default"]) for k, m in models.items()}
    warm = {k: v for k, v in warm.items() if v is not None and k in cold}
    if not cold or not warm:
        return {}
    saved = sum(cold[k] for k in warm) - sum(warm.values()) - pre["wall_s"]
    return {"cold_compile_s_sum": round(sum(cold.values()), 1), "warm_compile_s_sum": round(sum(warm.values()), 1),
            "phase_wall_s": pre["wall_s"], "saved_s_if_cold_serial_equals_worker": round(saved, 1)}


def watch(proc: subprocess.Popen, out: Path, case: Case, args) -> str | None:
    """Wait for a model's process; stop it at ``--hard-s``, or when its autotuned compile has run past twice its
    expected time (what it measured before is kept). Returns why it was stopped, or None."""
    session_1_at = None
    while proc.poll() is None:
        time.sleep(1.0)
        now = time.perf_counter()
        if session_1_at is None and out.exists():
            try:
                stage = json.loads(out.read_text()).get("stage", "")
            except ValueError:  # being rewritten
                stage = ""
            if stage == "session 1":
                session_1_at = now
        why = None
        if now - START > args.hard_s:
            why = f"stopped at --hard-s {args.hard_s:.0f}"
        elif session_1_at is not None and now - session_1_at > 2 * case.autotune_s + 60:
            why = (f"stopped: max-autotune-no-cudagraphs and its session ran past {2 * case.autotune_s + 60:.0f} s "
                   f"(twice its expected {case.autotune_s:.0f} s, + 60)")
        if why:
            proc.kill()
            proc.wait()
            return why
    return None


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="", help="comma-separated (default, in order: " + ", ".join(CASES) + ")")
    p.add_argument("--modes", default=",".join(MODES), help="torch.compile modes (default: all three)")
    p.add_argument("--autotune-models", default=None,
                   help="comma-separated: the models that get max-autotune-no-cudagraphs (default: every one)")
    p.add_argument("--budget-s", type=float, default=540.0,
                   help="no model and no autotuned compile starts after this many seconds (default 540)")
    p.add_argument("--hard-s", type=float, default=575.0,
                   help="a model still running after this many seconds is stopped (default 575)")
    p.add_argument("--precompile-workers", type=int, default=0,
                   help="compile every model's default mode first in this many parallel processes (0: off)")
    p.add_argument("--precompile-s", type=float, default=150.0, help="stop the precompile phase after this long")
    p.add_argument("--target-s", type=float, default=0.5, help="timed seconds per variant in a session (adaptive rounds)")
    p.add_argument("--extend-s", type=float, default=3.0, help="at most this many more seconds while a verdict is open")
    p.add_argument("--profile-calls", type=int, default=3, help="forwards per profile (figures are per forward)")
    p.add_argument("--smoke", action="store_true",
                   help="CPU, two tiny cases, compile default only unless --modes is given: the plumbing")
    p.add_argument("--smoke-rounds", type=int, default=10, help=argparse.SUPPRESS)
    p.add_argument("--out", default=None, help="JSON path (default $OUT/bench_measured.json)")
    p.add_argument("--worker", choices=["measure", "precompile"], help=argparse.SUPPRESS)
    p.add_argument("--case", help=argparse.SUPPRESS)
    p.add_argument("--child-out", help=argparse.SUPPRESS)
    p.add_argument("--deadline-at", type=float, default=0.0, help=argparse.SUPPRESS)
    p.add_argument("--hard-at", type=float, default=0.0, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    args.modes = [md.strip() for md in args.modes.split(",") if md.strip()]
    if args.autotune_models is not None:
        args.autotune_models = [k.strip() for k in args.autotune_models.split(",") if k.strip()]
    bad = [md for md in args.modes if md not in MODES]
    if bad:
        p.error(f"unknown mode(s) {', '.join(bad)}; known: {', '.join(MODES)}")
    if args.smoke:   # default only, unless --modes says otherwise (reduce-overhead needs CUDA)
        given = any(a == "--modes" or a.startswith("--modes=") for a in (argv if argv is not None else sys.argv))
        args.modes = [md for md in args.modes if md != "reduce-overhead"] if given else ["default"]
    table = SMOKE_CASES if args.smoke else CASES
    args.keys = [k.strip() for k in args.models.split(",") if k.strip()] or list(table)
    unknown = [k for k in args.keys if k not in table]
    if unknown and not args.worker:
        p.error(f"unknown model(s) {', '.join(unknown)}; known: {', '.join(table)}")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.worker == "measure":
        return child_measure(args)
    if args.worker == "precompile":
        return child_precompile(args)
    import torch

    from explorer.runtime import measure as m

    path = common.results_path(args.out, "bench_measured.json")
    log = common.elapsed_logger(START)
    doc: dict[str, Any] = dict(schema=SCHEMA, **common.run_stamp(),
                               label="SMOKE run on the CPU: the numbers are not GPU numbers" if args.smoke
                               else "GPU run")
    if not args.smoke and not torch.cuda.is_available():
        return common.write_skipped(doc, path, "bench_measured", "plumbing")
    device = "cpu" if args.smoke else "cuda"
    if device == "cuda" and os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        print("bench_measured: SKIPPED - TRITON_INTERPRET is set; unset it to benchmark compiled kernels.")
        return 0
    doc.update(environment=m.environment(device),
               settings=dict(models=args.keys, modes=args.modes, budget_s=args.budget_s, hard_s=args.hard_s,
                             precompile_workers=args.precompile_workers, target_s=args.target_s,
                             extend_s=args.extend_s, profile_calls=args.profile_calls),
               method=("one process per model; every variant of a model timed in the same alternated rounds "
                       "(explorer.runtime.measure.time_paired: CUDA events around one synchronised call, warm-up, "
                       "ABBA, each timed call after one of its own); medians with p20/p80 in ms; verdicts "
                       "explorer.stats.compare over the paired rounds (Wilcoxon signed-rank, 3% minimum effect); "
                       "GPU busy: union of kernel intervals per forward, from a profile of "
                       f"{args.profile_calls} forwards; host µs per launch: per round (plain - own CUDA-graph "
                       "replay) / kernel launches (bench_launch_path's definition); precision: first output "
                       "against the unfused graph in float64"),
               models={})
    if args.smoke:
        os.environ.setdefault("EXPLORER_GENERIC_COMPILE", "0")
    cache_dir = tempfile.mkdtemp(prefix="bench_measured_inductor_")
    env = child_env(cache_dir)
    doc["inductor_cache"] = "one TORCHINDUCTOR_CACHE_DIR shared by every process of this run (FX graph cache on)"
    deadline_at = time.time() + args.budget_s - (time.perf_counter() - START)
    with tempfile.TemporaryDirectory(prefix="bench_measured_run_") as tmp_name:
        tmp = Path(tmp_name)
        if args.precompile_workers > 0 and "default" in args.modes:
            doc["precompile"] = precompile_phase(args, args.keys, env, tmp, log)
            log(f"precompile phase: {doc['precompile']['wall_s']} s")
            common.write_json(path, doc)
        for key in args.keys:
            elapsed = time.perf_counter() - START
            need = (SMOKE_CASES if args.smoke else CASES)[key].min_s
            if elapsed > args.budget_s or args.hard_s - elapsed < need:
                doc["models"][key] = {"error": f"not started: {elapsed:.0f} s of the {args.budget_s:.0f} s budget "
                                               f"spent (it needs about {need:.0f} s, {args.hard_s - elapsed:.0f} "
                                               "were left before --hard-s)"}
                continue
            out = tmp / f"measure_{key}.json"
            log(f"[{key}] starting its process")
            t0 = time.perf_counter()
            proc = subprocess.Popen(child_command(args, "measure", key, out, deadline_at), env=env)
            stopped = watch(proc, out, (SMOKE_CASES if args.smoke else CASES)[key], args)
            rec = json.loads(out.read_text()) if out.exists() else {}
            if stopped:
                rec["error"] = f"{stopped} during '{rec.get('stage', 'loading')}' (what it had measured is kept)"
            elif proc.returncode and "error" not in rec:
                rec["error"] = f"its process exited {proc.returncode}"
            rec["process_wall_s"] = round(time.perf_counter() - t0, 1)
            doc["models"][key] = rec
            if "precompile" in doc:
                doc["precompile"]["summary"] = precompile_summary(doc["precompile"], doc["models"])
            doc["wall_s"] = round(time.perf_counter() - START, 1)
            common.write_json(path, doc)
            log(f"[{key}] {rec.get('stage', '?')} in {rec['process_wall_s']} s; wrote {path}")
    doc["wall_s"] = round(time.perf_counter() - START, 1)
    common.write_json(path, doc)
    from benchmarks import measured_table

    print(measured_table.text_summary(doc))
    print(f"wrote {path}")
    return 0 if all("error" not in r for r in doc["models"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
