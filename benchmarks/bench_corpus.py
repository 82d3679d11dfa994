"""The corpus (``benchmarks/corpus.py``) at its real sizes on one GPU: fused against unfused and torch.compile.

Every corpus model at its real layer sizes and real input shape (``Entry.real``), fp16 (bf16 for decoders),
CNNs channels_last, through the runner's own pieces: captured, detected, every chain fused
(``fusion_engine`` / ``fusions.rewrite``), both graphs prepared as the runner prepares them
(``runtime.measure.prepare_graph`` with the model's own casts, ``record_casts``), against eager, torch.compile
default and, as CUDA graphs, the fused graph replayed against ``torch.compile(mode="reduce-overhead")``. All
variants of a model are timed in the same alternated rounds (``measure.time_paired``) and each pair gets the
paired verdict (``explorer.stats.compare``: Wilcoxon over paired rounds, 3% minimum effect). Precision is
rel_l2 against the model in float64. Where the fused graph loses, the JSON keeps the top kernels of one
profiled forward of fused and compiled beside the kernel each chain chose (its label): the per-kernel reason.

Device time is scarce, so:
- models run in order of what they tell (``ORDER``: one of each family first, the decoders at 7-8B layer
  sizes early), each in a child process of its own (a CUDA fault or an out-of-memory loses one model);
- before the serial timing phase, ``--warm-workers`` child processes (default 6) build each model, compile it
  (default and reduce-overhead) and run the fused graph once, all sharing one ``TORCHINDUCTOR_CACHE_DIR`` and
  ``TRITON_CACHE_DIR``: the timing phase then finds inductor's and Triton's kernels compiled. The warm phase
  takes at most ``--warm-share`` of the budget;
- ``--budget-s`` (default 330: the one call this session has is 360 s) bounds the whole run: no model starts after it and each child's timeout is
  what is left; what was skipped is listed in the JSON and the table;
- ``--only`` / ``--skip`` (comma-separated corpus names or prefixes: ``hf/``, ``tv/resnet``);
- the timing phase is a pipeline of ``--workers`` model processes (default 3; 2 in ``--smoke``): what needs no
  GPU (process start, the imports of torch, the engine and the model's library) runs while another model holds
  the GPU; each model's GPU section (an exclusive OS file lock, ``fcntl.flock`` on ``--lock``, held from before
  its first GPU allocation, the build on the device, through capture, compile, float64 reference, timing and
  profiling, released after its GPU memory is freed) runs alone. The JSON keeps per model the seconds waited
  for the lock and held (``lock``), with the wall-clock interval held;
- the warm phase warms only the models the rest of the budget can time (``PER_MODEL_S`` each), not the queue;
- ``--merge A.json,B.json,...``: one table from several runs' JSONs (a model measured twice keeps the later);
- ``--smoke``: the CPU, two tiny entries at their CI sizes, float32, end to end through the pipeline (no warm
  workers; the numbers are not GPU numbers).

Why the overlap cannot perturb the timing: every variant of one model is still built, prepared and timed in one
process, in the same alternated rounds, with the same layout and plan as before. While a process holds the lock
no other process has a CUDA context doing work: the others are either before their first GPU call (they take
the lock before building on the device) or gone (a child frees its GPU memory and exits its GPU section before
releasing). Their CPU work (imports) cannot slow a host-bound model's launch path because the lock holder pins
itself (``os.sched_setaffinity``) to its own cores (the first half of the machine's), and every waiting process
to the other half. What still shares the host is memory bandwidth and the page cache of the imports: a waiting
process's imports are short and read cached files.

    python3 benchmarks/bench_corpus.py                         # on the H200: JSON per model + summary in $OUT
    python3 benchmarks/bench_corpus.py --smoke                 # here, on the CPU
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks._common import results_path, run_stamp, write_json  # noqa: E402
from explorer.runtime.gpulock import GpuLock, core_sets  # noqa: E402,F401  (the one exclusive section)

#: What runs first: the decoders nobody here wrote at 7-8B layer sizes, then the architectures that failed
#: before (RegNet, Swin, ViT, EfficientNet-V2), then one of each family; the rest of torchvision last.
ORDER = ("hf/llama", "hf/qwen2", "tv/regnet_y_1_6gf", "tv/swin_t", "hf/vit", "tv/efficientnet_v2_s", "hf/mistral",
         "hf/bert", "tv/resnet50", "timm/convnextv2_atto", "hf/gemma2", "hf/phi3", "hf/mixtral", "hf/gpt2",
         "tv/mobilenet_v3_large", "timm/regnety_016", "timm/efficientnetv2_rw_t", "timm/ghostnet_100",
         "hf/t5_encoder", "hf/whisper_encoder", "hf/falcon", "hf/gpt_neox", "hf/opt", "tv/efficientnet_b0",
         "tv/convnext_tiny", "timm/mobilenetv4_conv_small", "hf/roberta", "hf/distilbert", "hf/clip_vision",
         "hf/swin", "timm/repvgg_a0", "timm/resnet50d", "tv/densenet121", "tv/shufflenet_v2_x1_0", "tv/vit_b_16",
         "timm/edgenext_xx_small", "timm/fastvit_t8", "timm/levit_128s", "timm/mobilevit_xxs",
         "timm/poolformer_s12", "timm/coatnet_0_rw_224", "timm/maxvit_tiny_rw_224", "timm/deit_tiny_patch16_224",
         "timm/swin_tiny_patch4_window7_224", "timm/mixer_b16_224", "tv/maxvit_t", "tv/mnasnet1_0",
         "tv/squeezenet1_1", "tv/googlenet", "tv/inception_v3", "tv/resnext50_32x4d", "tv/swin_v2_t")
SMOKE = ("tv/squeezenet1_1", "hf/distilbert")
#: the pairs each model's verdicts compare: (baseline, candidate)
PAIRS = (("unfused", "fused"), ("eager", "fused"), ("compile_default", "fused"),
         ("compile_reduce_overhead", "fused_cuda_graphs"))


def ordered(names: list[str]) -> list[str]:
    """``ORDER`` first, then every other corpus entry (the rest of torchvision, smallest names first)."""
    rank = {n: i for i, n in enumerate(ORDER)}
    return sorted(names, key=lambda n: (rank.get(n, len(ORDER)), n))


def select(all_names: list[str], only: str, skip: str) -> list[str]:
    def hit(n: str, spec: str) -> bool:
        return any(n == s or (s.endswith("/") and n.startswith(s)) or n.startswith(s) for s in spec.split(",") if s)

    names = [n for n in all_names if (not only or hit(n, only)) and not (skip and hit(n, skip))]
    return ordered(names)


#: device seconds one model takes in the timing pipeline (build through profile, caches warm): sizes the warm set
PER_MODEL_S = 18.0
#: a child that gets the lock with less than this left skips (part 4 lost 22 s to a model killed mid-section)
LOCK_MARGIN_S = 35.0


def free_device(device: str) -> None:
    """What the model left on the device, freed before the lock is released."""
    import gc

    gc.collect()
    if device == "cuda":
        import torch

        torch.cuda.synchronize()
        torch.cuda.empty_cache()


def run_case(args) -> dict:
    """A child: the imports outside the lock (on the waiting cores), the model inside it (on the holder's)."""
    import importlib

    holder, waiting = core_sets()
    if len(os.sched_getaffinity(0)) > 1:
        os.sched_setaffinity(0, waiting)
    t0 = time.perf_counter()
    import torch  # noqa: F401

    from benchmarks import corpus
    from explorer.fusion_engine import detect  # noqa: F401
    from explorer.fusions.rewrite import apply_plan  # noqa: F401

    library = {"torchvision": "torchvision", "timm": "timm", "transformers": "transformers"}.get(
        corpus.by_name(args.case).library)
    if library:
        importlib.import_module(library)
    imports_s = round(time.perf_counter() - t0, 1)
    device = "cpu" if args.smoke else "cuda"
    # the warm phase shares the GPU on purpose (nothing is timed then): no lock, no pinning
    lock_path = None if args.warm or os.environ.get("BENCH_CORPUS_NO_LOCK") == "1" else args.lock
    with GpuLock(lock_path, holder if len(holder | waiting) > 1 and not args.warm else None) as lock:
        if args.deadline and time.time() > args.deadline - LOCK_MARGIN_S:
            result = dict(model=args.case, error="skipped: the lock came too late (past --budget-s)")
        else:
            result = measure_model(args.case, args.smoke, args.warm, args.no_compile)
        free_device(device)
    result["lock"] = dict(lock.record, imports_s=imports_s)
    return result


# ====================================================================== one model (in a child process)

def measure_model(name: str, smoke: bool, warm_only: bool, no_compile: bool) -> dict:
    """One corpus model: build, capture, detect, fuse, prepare, compile; unless ``warm_only``: check against
    float64, time every variant alternated, the paired verdicts, a profile of fused and compiled."""
    import torch

    from benchmarks import corpus
    from benchmarks._common import compile_copy, cuda_graph_replay, errors, profile_forward
    from explorer import stats
    from explorer.fusion_engine import detect
    from explorer.fusions.plan import make_plan
    from explorer.fusions.rewrite import apply_plan
    from explorer.graph.build import build_graph
    from explorer.runtime import measure as m
    from explorer.sources import capture

    t0 = time.perf_counter()
    device = "cpu" if smoke else "cuda"
    entry = corpus.by_name(name)
    scale = "ci" if smoke else "real"
    dtype_name = "fp32" if smoke else entry.bench_dtype
    dtype = m.torch_dtype(dtype_name)
    channels_last = entry.input_kind == "image"
    seconds: dict[str, float] = {}
    out: dict = dict(model=name, kind=entry.kind, library=entry.library, description=entry.description,
                     shape=dataclasses.asdict(entry.shape(scale)), dtype=dtype_name,
                     memory_format="channels_last" if channels_last else "nchw", notes=[], seconds=seconds)
    module = entry.build(scale, device=device)
    features = corpus.features_module(entry, module)
    x_cpu = entry.inputs(scale, module=module)
    x32 = tuple(t.to(device) for t in x_cpu)
    out["parameters"] = sum(p.numel() for p in features.parameters())
    seconds["build"] = round(time.perf_counter() - t0, 1)
    gm = capture(features, x32, name)
    graph = build_graph(gm, name)
    det = detect(graph)
    fused = apply_plan(gm, det, make_plan(det), device)
    out["chains"] = {k: v for k, v in det.counts.items() if v}
    out["applied"] = dict(collections.Counter(a.status for a in fused.applied))
    out["kernels_chosen"] = dict(collections.Counter(a.implementation for a in fused.applied if a.status == "fused"))
    out["near_misses"] = len(det.near_misses)
    casts, note = m.record_casts(features, x32, gm, dtype)
    if note:
        out["notes"].append(note)
    unfused_gm = m.prepare_graph(gm, device, dtype, channels_last, casts=casts)
    fused_gm = m.prepare_graph(fused.gm, device, dtype, channels_last, casts=casts)
    eager = m.prepare_module(features, device, dtype, channels_last)
    x = m.prepare_inputs(x32, device, dtype, channels_last)
    seconds["prepare"] = round(time.perf_counter() - t0 - seconds["build"], 1)
    fns = {"unfused": lambda: unfused_gm(*x), "fused": lambda: fused_gm(*x), "eager": lambda: eager(*x)}
    keep = []
    if not no_compile:
        modes = [("compile_default", None)] + ([("compile_reduce_overhead", "reduce-overhead")]
                                               if device == "cuda" else [])
        for label, mode in modes:
            try:
                call, target, s = compile_copy(eager, mode, x, device)
                fns[label] = call
                keep.append(target)
                seconds[label] = s
            except Exception as exc:  # a compile failure is a result
                out["notes"].append(f"{label}: torch.compile failed: {type(exc).__name__}: {str(exc)[:200]}")
    with torch.inference_mode():
        fns["fused"]()
    m.synchronize(device)
    if warm_only:
        seconds["total"] = round(time.perf_counter() - t0, 1)
        return dict(out, warm_only=True)
    if device == "cuda":
        replay, why = cuda_graph_replay(fns["fused"], device)
        if replay is not None:
            fns["fused_cuda_graphs"] = replay
        else:
            out["notes"].append(f"fused_cuda_graphs: not captured: {why}")
    # precision against the model in float64 (on the device; a model too large for that is a note)
    try:
        ref_module = m.prepare_module(features, device, torch.float64)
        with torch.inference_mode():
            ref = m.flat_outputs(ref_module(*m.prepare_inputs(x32, device, torch.float64)))[0]
        del ref_module
        out["precision"] = {}
        for v, fn in fns.items():
            try:
                with torch.inference_mode():
                    out["precision"][v] = errors(m.flat_outputs(fn())[0].float(), ref)
            except Exception as exc:   # one variant's check must not lose the others'
                out["notes"].append(f"precision of {v}: {type(exc).__name__}: {str(exc)[:200]}")
        out["fidelity"] = fidelity(features, x32, gm, ref, device, channels_last)
        del ref
    except Exception as exc:
        out["notes"].append(f"precision: not measured: {type(exc).__name__}: {str(exc)[:200]}")
    if device == "cuda":
        torch.cuda.empty_cache()
    plan = (m.TimingPlan(warmup=1, reps=3) if smoke else
            m.TimingPlan(target_s=0.6, min_reps=10, max_reps=200, max_rounds=300, budget_s=3.0))
    pairs = [(b, c) for b, c in PAIRS if b in fns and c in fns]
    t1 = time.perf_counter()
    samples = m.time_paired(fns, pairs, device, plan)
    seconds["timing"] = round(time.perf_counter() - t1, 1)
    out["latency_ms"] = {v: m.summarize(s) for v, s in samples.items()}
    out["samples_ms"] = {v: [round(t, 5) for t in s] for v, s in samples.items()}
    out["verdicts"] = {}
    for b, c in pairs:
        verdict = stats.compare(samples[b], samples[c], basis=f"{c} against {b}, paired rounds")
        out["verdicts"][f"{c}_vs_{b}"] = dict(dataclasses.asdict(verdict), speedup=(1 / verdict.ratio
                                                                                    if verdict.ratio else None))
    losing = any(v["label"] == stats.SLOWER for v in out["verdicts"].values())
    if losing or smoke:
        out["profile"] = {v: profile_forward(fns[v], device, top=8, cpu_ops=False)
                          for v in ("fused", "compile_default", "unfused") if v in fns}
    seconds["total"] = round(time.perf_counter() - t0, 1)
    return out


def fidelity(features, x32, gm, ref, device: str, channels_last: bool,
             labels: tuple[str, ...] = ("fp16", "bf16")) -> dict:
    """Per low dtype (``labels``): whether the model's own casts were recorded (``matched``) and the record's note,
    and rel_l2 against float64 of eager and of the unfused graph prepared with that record (the issue's bar: the
    graph within 1.5x of eager), one copy at a time. ``check_cast_record.py`` asks the same."""
    import torch

    from benchmarks._common import errors
    from explorer.runtime import measure as m

    out = {}
    for label in labels:
        dtype = m.torch_dtype(label)
        try:
            casts, note = m.record_casts(features, x32, gm, dtype)
            x = m.prepare_inputs(x32, device, dtype, channels_last)
            row = {"matched": casts is not None, "casts_note": note}
            for what, make in (("eager", lambda: m.prepare_module(features, device, dtype, channels_last)),
                               ("unfused", lambda: m.prepare_graph(gm, device, dtype, channels_last, casts=casts))):
                model = make()
                with torch.inference_mode():
                    row[what] = errors(m.flat_outputs(model(*x))[0].float(), ref)["rel_l2"]
                del model
            row["ratio"] = row["unfused"] / row["eager"] if row["eager"] else None
            out[label] = row
        except Exception as exc:
            out[label] = {"error": f"{type(exc).__name__}: {str(exc)[:200]}"}
        if device == "cuda":
            torch.cuda.empty_cache()
    return out


# ====================================================================== the run

def _child(name: str, args, warm: bool, timeout: float, env: dict, folder: Path,
           lock: str | None = None, deadline: float = 0.0) -> subprocess.Popen:
    path = folder / (name.replace("/", "_") + (".warm" if warm else "") + ".json")
    path.unlink(missing_ok=True)
    cmd = [sys.executable, str(Path(__file__).resolve()), "--case", name, "--case-out", str(path)]
    cmd += (["--lock", lock] if lock else []) + (["--deadline", f"{deadline:.3f}"] if deadline else [])
    cmd += (["--warm"] if warm else []) + (["--smoke"] if args.smoke else []) + (["--no-compile"] if args.no_compile else [])
    log = open(folder / (name.replace("/", "_") + (".warm" if warm else "") + ".log"), "w")
    proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    proc.case = (name, path, time.perf_counter() + timeout, log)  # type: ignore[attr-defined]
    return proc


def _finish(proc: subprocess.Popen, kill: bool = False) -> dict:
    import signal

    name, path, _deadline, log = proc.case  # type: ignore[attr-defined]
    if kill:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()
    log.close()
    if path.exists():
        return json.loads(path.read_text())
    tail = Path(log.name).read_text()[-800:]
    why = "timed out (past --budget-s)" if kill else f"exited {proc.returncode}"
    return dict(model=name, error=f"{why}: {tail.strip().splitlines()[-1] if tail.strip() else ''}"[:400])


def summarize(results: list[dict]) -> dict:
    """How many models gain, lose, are level per comparison; the worst losses with their kernels."""
    out: dict = {}
    for key in ("fused_vs_unfused", "fused_vs_eager", "fused_vs_compile_default",
                "fused_cuda_graphs_vs_compile_reduce_overhead"):
        tally = collections.Counter()
        losses = []
        for r in results:
            v = (r.get("verdicts") or {}).get(key)
            if not v:
                continue
            tally[v["label"]] += 1
            if v["label"] == "slower":
                losses.append((v["ratio"], r))
        losses.sort(key=lambda t: -t[0])
        out[key] = dict(counts=dict(tally), worst=[dict(
            model=r["model"], ratio=round(ratio, 3),
            fused_top_kernels=[k["name"][:80] for k in ((r.get("profile") or {}).get("fused") or {}).get(
                "top_kernels", [])[:4]],
            compile_top_kernels=[k["name"][:80] for k in ((r.get("profile") or {}).get("compile_default") or {}).get(
                "top_kernels", [])[:4]],
            kernels_chosen=sorted(r.get("kernels_chosen", {}), key=lambda k: -r["kernels_chosen"][k])[:4])
            for ratio, r in losses[:5]])
    for label in ("fp16", "bf16"):
        rows = {r["model"]: (r.get("fidelity") or {}).get(label, {}) for r in results}
        ratios = {n: f["ratio"] for n, f in rows.items() if f.get("ratio") is not None}
        out[f"fidelity_{label}"] = dict(within_1_5x=sum(v <= 1.5 for v in ratios.values()),
                                        beyond_1_5x={n: round(v, 2) for n, v in ratios.items() if v > 1.5},
                                        not_measured=sorted(n for n, f in rows.items() if f.get("ratio") is None))
    return out


def table(results: list[dict], skipped: list[str], label: str) -> list[str]:
    lines = [label, f"{'model':<36} {'dtype':<5} {'unfused':>9} {'fused':>9} {'compile':>9} {'fused+CG':>9} "
             f"{'red.-ovh':>9}  verdict fused vs unfused / compile / red.-ovh"]
    for r in results:
        if "error" in r:
            lines.append(f"{r['model']:<36} FAILED: {r['error'][:120]}")
            continue
        lat = r.get("latency_ms", {})

        def ms(v):
            return f"{lat[v]['median']:.3f}" if v in lat else "-"

        verdicts = r.get("verdicts", {})
        words = [(verdicts.get(k) or {}).get("label", "-") for k in
                 ("fused_vs_unfused", "fused_vs_compile_default", "fused_cuda_graphs_vs_compile_reduce_overhead")]
        lines.append(f"{r['model']:<36} {r['dtype']:<5} {ms('unfused'):>9} {ms('fused'):>9} {ms('compile_default'):>9} "
                     f"{ms('fused_cuda_graphs'):>9} {ms('compile_reduce_overhead'):>9}  {' / '.join(words)}")
    if skipped:
        lines.append(f"skipped (past --budget-s): {', '.join(skipped)}")
    return lines


def merge(paths: list[str], out: str | None) -> int:
    """One table from several runs' JSONs (``--merge``): the models of each in order, a model measured in more
    than one keeping the later file's row; the summary recomputed over them all."""
    models: dict[str, dict] = {}
    sources, skipped = [], []
    for p in paths:
        try:
            doc = json.loads(Path(p).read_text())
        except (OSError, ValueError) as exc:
            print(f"bench_corpus --merge: cannot read {p}: {type(exc).__name__}: {exc}", file=sys.stderr)
            return 2
        if not isinstance(doc, dict) or doc.get("schema") != "bench_corpus/1":
            print(f"bench_corpus --merge: {p} is not a bench_corpus/1 result", file=sys.stderr)
            return 2
        for name, row in (doc.get("models") or {}).items():
            if str(row.get("error", "")).startswith("timed out (past --budget-s)"):
                skipped.append(name)        # the run's budget ended, not the model
            elif "error" not in row or name not in models or "error" in models[name]:
                models[name] = dict(row, source=Path(p).name)
        skipped += doc.get("skipped_models") or []
        sources.append(dict(file=Path(p).name, git=doc.get("git"), wall_s=doc.get("wall_s"),
                            models=len(doc.get("models") or {}), gpu=(doc.get("environment") or {}).get("gpu")))
    results = list(models.values())
    never = sorted(set(skipped) - set(models))
    merged = dict(schema="bench_corpus/1", label=f"merged from {len(paths)} runs", merged_from=sources,
                  models=models, skipped_models=never, summary=summarize(results))
    path = results_path(out, "bench_corpus_merged.json")
    write_json(path, merged)
    for line in table(results, [], merged["label"]):
        print(line)
    print(f"wrote {path} ({len(models)} models; {len(never)} skipped in every part and measured in none)")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget-s", type=float, default=330.0)
    parser.add_argument("--only", default="")
    parser.add_argument("--skip", default="")
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--no-compile", action="store_true")
    parser.add_argument("--warm-workers", type=int, default=6)
    parser.add_argument("--warm-share", type=float, default=0.4)
    parser.add_argument("--out", default=None)
    parser.add_argument("--case", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--case-out", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--warm", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--workers", type=int, default=None, help="model processes in the pipeline (3; 2 in --smoke)")
    parser.add_argument("--lock", default=None, help="the GPU lock file (default: one in the run's folder)")
    parser.add_argument("--deadline", type=float, default=0.0, help=argparse.SUPPRESS)
    parser.add_argument("--merge", default="", help="comma-separated result JSONs: write one table of them")
    args = parser.parse_args(argv)
    if args.case:
        write_json(Path(args.case_out), run_case(args))
        return 0
    if args.merge:
        return merge(args.merge.split(","), args.out)
    started = time.perf_counter()
    deadline = started + args.budget_s
    import torch

    from benchmarks import corpus

    path = results_path(args.out, "bench_corpus_smoke_cpu.json" if args.smoke else "bench_corpus_h200.json")
    doc: dict = dict(schema="bench_corpus/1", **run_stamp(),
                     label="SMOKE run on the CPU: the numbers are not GPU numbers" if args.smoke else "GPU run",
                     settings=vars(args))
    if not args.smoke and not torch.cuda.is_available():
        doc["skipped"] = "no CUDA device here: run with --smoke for the CPU path"
        write_json(path, doc)
        print(f"bench_corpus: SKIPPED - no CUDA device; wrote {path}")
        return 0
    from explorer.runtime.measure import environment

    doc["environment"] = environment("cpu" if args.smoke else "cuda")
    names = list(SMOKE) if args.smoke else select([e.name for e in corpus.entries()], args.only, args.skip)
    if args.smoke and (args.only or args.skip):
        names = select(names, args.only, args.skip)
    folder = path.parent / (path.stem + "_models")
    folder.mkdir(parents=True, exist_ok=True)
    cache = Path(tempfile.gettempdir()) / "bench_corpus_cache"
    env = dict(os.environ, PYTHONPATH=str(ROOT), TORCHINDUCTOR_CACHE_DIR=str(cache / "inductor"),
               TRITON_CACHE_DIR=str(cache / "triton"), TRANSFORMERS_VERBOSITY="error", HF_HUB_OFFLINE="1")
    if args.smoke:
        env.setdefault("EXPLORER_GENERIC_COMPILE", "0")
        env["OMP_NUM_THREADS"] = env.get("OMP_NUM_THREADS", "1")
    warmed: dict[str, dict] = {}
    if not args.smoke and args.warm_workers > 0 and not args.no_compile:
        warm_end = started + args.warm_share * args.budget_s
        # warm only what the rest of the budget can time (warming the whole queue was most of part 2's warm phase)
        fits = max(1, int((1 - args.warm_share) * args.budget_s / PER_MODEL_S) + (args.workers or 3))
        queue, running = list(names[:fits]), []
        while (queue or running) and time.perf_counter() < warm_end:
            while queue and len(running) < args.warm_workers:
                running.append(_child(queue.pop(0), args, True, warm_end - time.perf_counter(), env, folder))
            time.sleep(0.5)
            for p in [p for p in running if p.poll() is not None]:
                running.remove(p)
                warmed[p.case[0]] = _finish(p)
        for p in running:
            warmed[p.case[0]] = _finish(p, kill=True)
        doc["warm"] = {n: (r.get("seconds") or {}).get("total") if "error" not in r else r["error"]
                       for n, r in warmed.items()}
        doc["warm_s"] = round(time.perf_counter() - started, 1)
        print(f"warm phase: {len(warmed)} models in {doc['warm_s']} s", file=sys.stderr, flush=True)
    results, skipped = [], []
    workers = args.workers or (2 if args.smoke else 3)
    lock = args.lock or str(folder / "gpu.lock")
    wall_deadline = time.time() + (deadline - time.perf_counter())
    queue, running = list(names), []
    while queue or running:
        while queue and len(running) < workers:
            left = deadline - time.perf_counter()
            if left < 20:
                skipped.extend(queue)
                queue.clear()
                break
            running.append(_child(queue.pop(0), args, False, left, env, folder, lock, wall_deadline))
        time.sleep(0.2)
        for p in list(running):
            late = time.perf_counter() > p.case[2]
            if p.poll() is None and not late:
                continue
            running.remove(p)
            r = _finish(p, kill=p.poll() is None)
            if str(r.get("error", "")).startswith("skipped"):
                skipped.append(r["model"])
                continue
            results.append(r)
            lk = r.get("lock") or {}
            print(f"[{time.perf_counter() - started:6.1f}s] {r['model']}: "
                  + (r["error"][:100] if "error" in r else f"{(r.get('seconds') or {}).get('total')} s")
                  + (f" (lock waited {lk.get('waited_s')} s, held {lk.get('held_s')} s)" if lk else ""),
                  file=sys.stderr, flush=True)
            doc["models"] = {x["model"]: {k: v for k, v in x.items() if k != "samples_ms"} for x in results}
            doc["skipped_models"] = skipped
            write_json(path, doc)
    held = sum((r.get("lock") or {}).get("held_s") or 0 for r in results)
    doc["pipeline"] = dict(workers=workers, lock=lock, held_s=round(held, 1), models_timed=len(results),
                           models_per_device_minute=round(60 * len(results) / (time.perf_counter() - started), 2))
    doc["models"] = {x["model"]: {k: v for k, v in x.items() if k != "samples_ms"} for x in results}
    doc["skipped_models"] = skipped
    doc["summary"] = summarize(results)
    doc["wall_s"] = round(time.perf_counter() - started, 1)
    doc["pipeline"]["models_per_device_minute"] = round(60 * len(results) / doc["wall_s"], 2) if doc["wall_s"] else None
    write_json(path, doc)
    for line in table(results, skipped, doc["label"]):
        print(line)
    print(json.dumps(doc["summary"], indent=1)[:3000])
    print(f"wrote {path} (per model, with every round: {folder})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
