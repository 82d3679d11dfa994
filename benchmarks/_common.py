"""What the benchmark scripts share: where and how they write their JSON, their log, and the model sessions.

The scripts in ``benchmarks/`` are run as files (``python benchmarks/<script>.py``) and loaded by the tests
with ``importlib``; each puts the repository root on ``sys.path`` and imports this module as
``benchmarks._common``. Nothing heavy is imported here at import time: ``bench_cnn_fusions.py`` must set
``TRITON_INTERPRET`` before Triton is first imported, so torch and the explorer are imported inside the
functions that need them.

- **Run records**: ``ModelCase`` (one zoo model at one size, dtype and memory format), ``results_path``
  (``--out``, else ``$OUT/<name>``, else ``benchmarks/results/<name>``), ``run_stamp`` (the command and
  the UTC date every result carries), ``write_json``, ``write_skipped`` (no CUDA: say so, write why, exit
  0), ``elapsed_logger`` (``[  12.3s] message`` on stderr), ``bench_device`` (CUDA, the CPU for a smoke
  run, or a clean skip), and ``BenchRun``: one run's JSON document, rewritten after each part so that a run cut short keeps what it measured.
- **Timing and profiling through the runner's own code**: ``cuda_graph_replay`` captures with
  ``explorer.runtime.variants.make_variant`` (the runner's capture: warm-up on a side stream, inference
  mode, a failed capture said in words); ``profile_forward`` profiles through
  ``explorer.runtime.measure.profiling`` (which tears CUPTI down afterwards) and measures GPU-busy time
  with ``explorer.runtime.breakdown.interval_union_us``. The benches cannot drift from the runner's.
- **Model sessions** (the CNN and decoder fusion benches): ``session`` (float64 check, alternated timing,
  one profiled forward per variant), ``compile_copy``, ``sessions_against_compile`` (session 1 with
  torch.compile default and reduce-overhead, session 2 with max-autotune-no-cudagraphs), ``model_verdicts``
  (the two targets) and ``model_table_lines`` (their rows in the printed table).
"""

from __future__ import annotations

import collections
import copy
import dataclasses
import datetime
import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parent.parent
#: torch.compile baselines of a model session (variant name, mode), in the order they are compiled: the
#: slowest to compile last, so that ``--budget-s`` skips it rather than the CUDA-graph baseline.
COMPILE_MODES = (("compile_default", None), ("compile_reduce_overhead", "reduce-overhead"),
                 ("compile_max_autotune_no_cudagraphs", "max-autotune-no-cudagraphs"))
#: The slowest compile: timed in a second session of its own, after the first is written.
SESSION_2_MODE = "max-autotune-no-cudagraphs"


# ====================================================================== run records

@dataclasses.dataclass(frozen=True)
class ModelCase:
    """One zoo model measured: case key, zoo name, batch, sequence length (None for images), dtype name
    (``fp16``...), memory format (``channels_last`` or ``nchw``)."""

    key: str
    model: str
    batch: int
    seq_len: int | None
    dtype: str
    memory_format: str


def results_path(out: str | None, filename: str) -> Path:
    """Where a script writes its JSON: ``out`` when given, else ``$OUT/<filename>`` when ``$OUT`` is set (the
    GPU machine's returned folder), else ``benchmarks/results/<filename>``; its folder is created."""
    if out:
        path = Path(out)
    else:
        folder = Path(os.environ["OUT"]) if os.environ.get("OUT") else ROOT / "benchmarks" / "results"
        path = folder / filename
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def run_stamp() -> dict:
    """The command that produced a result, the UTC date and the code it ran: ``{"command": ..., "date_utc": ...,
    "code": code_fingerprint()}``."""
    return {"command": " ".join([os.path.basename(sys.executable), *sys.argv]),
            "date_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "code": code_fingerprint()}


#: What a code fingerprint covers: the package, recursively, and the benchmark scripts (not their results).
CODE_FILES = ("explorer/", "benchmarks/*.py")
_NOT_CODE = ("__pycache__", ".egg-info")


def _is_code(rel: str) -> bool:
    """Whether a repository path (posix) is one ``CODE_FILES`` covers and git tracks (``.gitignore``: no byte code)."""
    if rel.endswith(".pyc") or any(part == "__pycache__" or part.endswith(".egg-info") for part in rel.split("/")):
        return False
    return rel.startswith("explorer/") or (rel.startswith("benchmarks/") and rel.count("/") == 1
                                           and rel.endswith(".py"))


def _fingerprint(entries: list[tuple[str, str]]) -> dict:
    import hashlib

    lines = "\n".join(f"{path} {blob}" for path, blob in sorted(entries))
    return {"covers": list(CODE_FILES), "files": len(entries), "sha256": hashlib.sha256(lines.encode()).hexdigest()}


def code_fingerprint(root: Path = ROOT) -> dict:
    """The code a result was measured with, where the tree has no git (the GPU machine gets a copy of the working
    tree): a SHA-256 over each covered file's path and git blob id (SHA-1 of ``blob <size>\0<bytes>``), so
    ``benchmarks/which_commit.py`` finds the commit whose tree it is from ``git ls-tree`` alone."""
    import hashlib

    entries = []
    for path in [*(root / "explorer").rglob("*"), *(root / "benchmarks").glob("*.py")]:
        rel = path.relative_to(root).as_posix()
        if path.is_file() and not path.is_symlink() and _is_code(rel):
            data = path.read_bytes()
            entries.append((rel, hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()))
    return _fingerprint(entries)


def commit_fingerprint(commit: str, root: Path = ROOT) -> dict:
    """``code_fingerprint`` of a commit's tree, from git's own blob ids (``git ls-tree -r``)."""
    import subprocess

    out = subprocess.run(["git", "-C", str(root), "ls-tree", "-r", commit, "--", "explorer", "benchmarks"],
                         capture_output=True, text=True, check=True).stdout
    entries = []
    for line in out.splitlines():
        meta, rel = line.split("\t", 1)
        mode, kind, blob = meta.split()
        if kind == "blob" and mode != "120000" and _is_code(rel):
            entries.append((rel, blob))
    return _fingerprint(entries)


def write_json(path: Path, doc: dict) -> None:
    """Write ``doc`` as indented JSON (what JSON cannot hold as its ``str``)."""
    path.write_text(json.dumps(doc, indent=1, default=str))


def write_skipped(doc: dict, path: Path, script: str, what: str = "path") -> int:
    """No CUDA device: record why in ``doc["skipped"]``, write it, say so; returns the exit status 0."""
    doc["skipped"] = f"no CUDA device here: run with --smoke for the CPU {what}"
    path.write_text(json.dumps(doc, indent=1))
    print(f"{script}: skipped ({doc['skipped']}); wrote {path}")
    return 0


def bench_device(script: str, smoke: bool) -> str | None:
    """The device a GPU fusion benchmark runs on: ``"cuda"``, or ``"cpu"`` for a ``--smoke`` run (with the
    explorer's generic compile off); None, after printing why, when it must measure nothing here (no CUDA,
    or the compiled kernels would be interpreted)."""
    import torch

    if smoke:
        os.environ.setdefault("EXPLORER_GENERIC_COMPILE", "0")
        return "cpu"
    if not torch.cuda.is_available():
        print(f"{script}: SKIPPED - no CUDA device here (torch.cuda.is_available() is False); nothing "
              "was measured. Run it on a GPU machine, or pass --smoke for the CPU plumbing check.")
        return None
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        print(f"{script}: SKIPPED - TRITON_INTERPRET is set; unset it to benchmark compiled kernels.")
        return None
    return "cuda"


def elapsed_logger(started: float) -> Callable[[str], None]:
    """A ``log(message)`` that prints ``[seconds since started] message`` to stderr at once."""
    def log(msg: str) -> None:
        print(f"[{time.perf_counter() - started:6.1f}s] {msg}", file=sys.stderr, flush=True)

    return log


class BenchRun:
    """One run of a GPU benchmark script: its JSON document, where it goes, its clock, budget and log.

    The document opens with the schema, the command, the date, the label (a CPU smoke run says its numbers
    are not GPU numbers), the environment and the settings; ``run_parts`` fills one key per part and
    rewrites the file after each (and whenever a part checkpoints), so a run cut short keeps what it
    measured.
    """

    def __init__(self, path: Path, schema: str, smoke: bool, environment: dict, settings: dict,
                 budget_s: float) -> None:
        self.path = path
        self.started = time.perf_counter()
        self.deadline = self.started + budget_s      # no part or compile starts after it
        self.log = elapsed_logger(self.started)
        self.doc: dict[str, Any] = dict(
            schema=schema, **run_stamp(),
            label=("SMOKE run on the CPU: the numbers are not GPU numbers" if smoke else "GPU run"),
            environment=environment, settings=settings)

    def write(self) -> None:
        """Rewrite the JSON with the wall time so far."""
        self.doc["wall_s"] = round(time.perf_counter() - self.started, 1)
        write_json(self.path, self.doc)

    def run_parts(self, parts: dict[str, Callable[[Callable[[dict], None]], dict]]) -> bool:
        """Run each part in turn, ``parts[key](checkpoint)`` into ``doc[key]``; a part that would start after
        the deadline is recorded as skipped, one that raises as its error (the others still run). A part may
        call ``checkpoint(partial)`` to have what it measured so far written. Returns whether one failed."""
        failed = False
        for key, run in parts.items():
            if time.perf_counter() > self.deadline:
                self.doc[key] = dict(error="skipped: past --budget-s")
                continue

            def checkpoint(partial: dict, key: str = key) -> None:
                """Write what a part has measured so far (a run cut short keeps it)."""
                self.doc[key] = dict(partial, incomplete=True)
                self.write()

            try:
                self.doc[key] = run(checkpoint)
            except Exception as exc:  # one failed part must not lose the others
                import traceback

                import torch

                traceback.print_exc()
                self.doc[key] = dict(error=f"{type(exc).__name__}: {str(exc).strip()[:300]}")
                failed = True
                if torch.cuda.is_available():
                    torch.cuda.empty_cache()
            self.write()
            self.log(f"[{key}] done; wrote {self.path}")
        return failed

    def failed_checks(self, parts) -> list[dict]:
        """The rows of ``parts`` whose correctness check (``row["check"]``) is neither ``ok`` nor ``n/a``, each
        printed as ``CHECK FAILED: <case> <variant>: <why>``: a script exits non-zero when there are any."""
        bad = [r for part in parts for r in (self.doc.get(part) or {}).get("rows", [])
               if r["check"] not in ("ok", "n/a")]
        for r in bad:
            print(f"CHECK FAILED: {r['case']} {r['variant']}: {r['check']}")
        return bad

    def environment_line(self, libraries: tuple[str, ...] = ("torch", "cuda", "triton")) -> str:
        """``<label>: <GPU> torch x cuda y ... driver z (<date>)``, printed above the table."""
        env = self.doc["environment"]
        return (f"{self.doc['label']}: {env.get('device_name')} "
                + "".join(f"{lib} {env.get(lib)} " for lib in libraries)
                + f"driver {env.get('driver')} ({self.doc['date_utc']})")


# ====================================================================== timing and profiling

def cuda_graph_replay(fn: Callable[[], Any], device: str) -> tuple[Callable[[], Any] | None, str]:
    """``fn`` captured as a CUDA graph by the runner's own capture (``explorer.runtime.variants.make_variant``:
    three warm-up calls on a side stream, then the capture, in inference mode); returns ``(replay, "")``,
    or ``(None, why)`` when the capture failed or ``device`` is not CUDA. ``replay`` keeps its graph alive."""
    from explorer.runtime.variants import make_variant

    variant = make_variant("captured", fn, (), device, cuda_graphs=True)
    return (variant.timed, "") if variant.cuda_graph else (None, variant.note)


def profile_forward(fn: Callable[[], Any], device: str, top: int, cpu_ops: bool, calls: int = 1) -> dict:
    """One call of ``fn`` (after one unprofiled call) under ``explorer.runtime.measure.profiling``: the device
    kernels, their GPU-busy time (the union of their intervals, ``breakdown.interval_union_us``) and the
    ``top`` kernels by total time. On the CPU, with ``cpu_ops``: the top-level ATen ops by CPU time instead;
    without: nothing but a note. Returns ``gpu_busy_ms``, ``kernels``, ``top_kernels``, ``note``; a failed
    profile is a note, never an exception.

    ``calls`` > 1 profiles that many synchronised calls and reports the figures per call, so that one
    profile's noise weighs less. On CUDA also ``kernel_launches`` (kernels less memcpy/memset, as
    ``measure.count_launches`` counts them) and ``kernel_sum_ms`` (the kernels' summed durations)."""
    import torch
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity

    from explorer.runtime.breakdown import interval_union_us
    from explorer.runtime.measure import profiling

    cuda = device.startswith("cuda")
    try:
        with torch.inference_mode():
            fn()
            if cuda:
                torch.cuda.synchronize()
            with profiling([ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])) as prof:
                for _ in range(max(1, calls)):
                    fn()
                    if cuda:
                        torch.cuda.synchronize()
        events = prof.events()
    except Exception as exc:  # the profile is evidence, never a reason to fail the run
        return dict(gpu_busy_ms=None, kernels=None, top_kernels=[], note=f"profiler failed: {exc}"[:200])
    if cuda:
        kernels = [e for e in events if e.device_type == DeviceType.CUDA]
        note = "" if kernels else "the profiler saw no device kernels (a CUDA graph it cannot trace?)"
    elif cpu_ops:
        kernels = [e for e in events if e.name.startswith("aten::")
                   and (e.cpu_parent is None or not e.cpu_parent.name.startswith("aten::"))]
        note = "cpu: top-level ATen ops, CPU time (not a GPU measurement)"
    else:
        return dict(gpu_busy_ms=None, kernels=None, top_kernels=[], note="cpu: no device kernels")
    by_name: dict[str, list[float]] = collections.defaultdict(list)
    for e in kernels:
        by_name[e.name].append(e.time_range.elapsed_us())
    n = max(1, calls)
    busy = interval_union_us([(e.time_range.start, e.time_range.end) for e in kernels]) / 1e3 / n if cuda else None
    ranked = sorted(by_name.items(), key=lambda kv: -sum(kv[1]))[:top]
    total_us = sum(sum(v) for v in by_name.values()) or 1.0
    out = dict(gpu_busy_ms=busy, kernels=len(kernels) if n == 1 else round(len(kernels) / n, 2),
               top_kernels=[dict(name=name[:120], calls=len(v) / n if n > 1 else len(v),
                                 total_us=round(sum(v) / n, 1), share=round(sum(v) / total_us, 3))
                            for name, v in ranked], note=note)
    if cuda:
        launched = [e for e in kernels if not e.name.lower().startswith(("memcpy", "memset"))]
        out.update(kernel_launches=round(len(launched) / n, 2), kernel_sum_ms=total_us / 1e3 / n, calls=n)
    return out


# ====================================================================== model sessions

def errors(out, ref) -> dict:
    """rel_l2, max_abs and top-1 agreement (argmax over the last axis) of ``out`` against the float64 ``ref``."""
    a = out.detach().double().cpu()
    r = ref.detach().double().cpu()
    return dict(rel_l2=float((a - r).norm() / r.norm()), max_abs=float((a - r).abs().max()),
                top1_agreement=float((a.argmax(-1) == r.argmax(-1)).double().mean()))


def compile_copy(eager, mode: str | None, x: tuple, device: str) -> tuple[Callable[[], Any], Any, float]:
    """``torch.compile`` of a copy of ``eager`` in ``mode``, called three times (reduce-overhead records its
    CUDA graph on a later call); returns ``(call, the compiled copy, seconds)``."""
    import torch

    from explorer.runtime import measure

    target = copy.deepcopy(eager)
    compiled = torch.compile(target, mode=mode)
    t0 = time.perf_counter()
    with torch.inference_mode():
        for _ in range(3):
            compiled(*x)
    measure.synchronize(device)
    return (lambda: compiled(*x)), target, round(time.perf_counter() - t0, 1)


def _cpu_times() -> list[int] | None:
    """The aggregate ``cpu`` line of ``/proc/stat`` (user nice system idle iowait irq softirq steal ...), or None."""
    try:
        with open("/proc/stat") as f:
            return [int(v) for v in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None


def host_activity(before: list[int] | None, after: list[int] | None) -> dict | None:
    """What the host's CPUs did between two ``_cpu_times``: the busy and stolen shares of all CPUs' time and the
    load average. Plain calls of a host-bound model slow down when other work shares the host (seen on the
    lent H200 machine: the same variants 1.5-2x slower minutes apart, GPU-busy time unchanged); this puts that
    beside the numbers."""
    if not before or not after or len(before) < 8 or len(after) < 8:
        return None
    d = [a - b for a, b in zip(after, before)]
    total = sum(d[:8]) or 1
    idle = d[3] + d[4]
    return {"busy_share": round(1 - idle / total, 4), "steal_share": round(d[7] / total, 4),
            "loadavg_1m": round(os.getloadavg()[0], 2), "cpus": os.cpu_count()}


def session(variants: dict[str, Callable[[], Any]], ref, device: str, smoke: bool, log, what: str,
            profile: Callable[[Callable[[], Any], str], dict]) -> dict:
    """Check each variant against float64, time them alternated (``measure.time_rounds``: round ``i`` of
    every variant is one paired round), ``profile`` one forward of each: one row each (latency_ms,
    precision, gpu_busy_ms, kernels, top_kernels, profile_note, samples_ms: every round's time, host:
    ``host_activity`` during the timing)."""
    import torch

    from explorer.runtime import measure

    log(f"{what}: checking {len(variants)} variants against float64")
    with torch.inference_mode():
        precision = {v: errors(fn().float(), ref) for v, fn in variants.items()}
    log(f"{what}: timing {', '.join(variants)} alternated")
    plan = measure.TimingPlan.for_device(device, **({"warmup": 1, "reps": 3} if smoke else {}))
    first = measure.warm_up(variants, device, plan)
    cpu_before = _cpu_times()
    samples = measure.time_rounds(variants, device, measure.planned_reps(plan, first))
    host = host_activity(cpu_before, _cpu_times())
    if host:
        log(f"{what}: host during timing: {host['busy_share']:.0%} of {host['cpus']} CPUs busy, "
            f"{host['steal_share']:.1%} stolen, load {host['loadavg_1m']}")
    log(f"{what}: profiling one forward of each")
    profiles = {v: profile(fn, device) for v, fn in variants.items()}
    return {v: dict(latency_ms=measure.summarize(samples[v]), precision=precision[v],
                    gpu_busy_ms=profiles[v]["gpu_busy_ms"], kernels=profiles[v]["kernels"],
                    top_kernels=profiles[v]["top_kernels"], profile_note=profiles[v]["note"],
                    samples_ms=[round(t, 5) for t in samples[v]], host=host) for v in variants}


def sessions_against_compile(variants: dict[str, Callable[[], Any]], eager, x: tuple, ref, head: dict,
                             notes: list[str], *, device: str, args, deadline: float, log,
                             checkpoint: Callable[[dict], None],
                             profile: Callable[[Callable[[], Any], str], dict]) -> dict:
    """A model's variants against torch.compile of ``eager`` on inputs ``x``, in two timing sessions.

    Session 1: ``variants`` (among them ``fused``) with, on CUDA, fused + CUDA graphs (the fused forward
    captured once, ``cuda_graph_replay``), then compile default and (on CUDA) reduce-overhead added,
    alternated; its result
    (``head`` + variants, second_session, notes, verdicts) goes to ``checkpoint`` before
    max-autotune-no-cudagraphs, the slowest compile, starts. Session 2: fused, compile default and
    max-autotune-no-cudagraphs, alternated again, so that the first target compares the three in the same
    rounds. ``args``: ``no_compile``, ``quick`` (no max-autotune), ``smoke``. A compile that would start
    after ``deadline`` is skipped, one that fails is a note. Returns the model's result (verdicts last).
    """
    if device.startswith("cuda"):
        replay, why = cuda_graph_replay(variants["fused"], device)
        if replay is not None:
            variants["fused_cuda_graphs"] = replay
        else:
            notes.append(f"fused_cuda_graphs: not timed: {why}")
    keep: list[Any] = []                         # the compiled copies must outlive the timing
    compile_s: dict[str, float] = {}
    modes = [] if args.no_compile else [(label, mode) for label, mode in COMPILE_MODES
                                        if device.startswith("cuda") or mode != "reduce-overhead"]
    if args.no_compile:
        notes.append("torch.compile variants skipped (--no-compile)")
    elif args.quick:
        notes.append("compile_max_autotune_no_cudagraphs: skipped (--quick)")
        modes = [(label, mode) for label, mode in modes if mode != SESSION_2_MODE]
    for label, mode in [(label, mode) for label, mode in modes if mode != SESSION_2_MODE]:
        if time.perf_counter() > deadline:
            notes.append(f"{label}: skipped: past --budget-s")
            continue
        log(f"torch.compile mode={mode or 'default'}")
        try:
            variants[label], target, compile_s[label] = compile_copy(eager, mode, x, device)
            keep.append(target)
        except Exception as exc:  # a compile failure is a result, not a crash
            notes.append(f"{label}: torch.compile failed: {type(exc).__name__}: {str(exc).strip()[:200]}")
    results = session(variants, ref, device, args.smoke, log, "session 1", profile)
    for v, r in results.items():
        r["compile_s"] = compile_s.get(v)
    out = dict(head, variants=results, second_session=None, notes=notes)
    out["verdicts"] = model_verdicts(results, None)
    checkpoint(out)
    for label, mode in [(label, mode) for label, mode in modes if mode == SESSION_2_MODE]:
        if time.perf_counter() > deadline:
            notes.append(f"{label}: skipped: past --budget-s")
            continue
        log(f"torch.compile mode={mode} (session 2)")
        try:
            call, target, seconds = compile_copy(eager, mode, x, device)
            keep.append(target)
        except Exception as exc:
            notes.append(f"{label}: torch.compile failed: {type(exc).__name__}: {str(exc).strip()[:200]}")
            continue
        again = {v: variants[v] for v in ("fused", "compile_default") if v in variants}
        second = session({**again, label: call}, ref, device, args.smoke, log, "session 2", profile)
        second[label]["compile_s"] = seconds
        results[label] = second[label]
        out["second_session"] = {v: r["latency_ms"] for v, r in second.items()}
        out["second_session_samples_ms"] = {v: r["samples_ms"] for v, r in second.items()}
    out["verdicts"] = model_verdicts(results, out.get("second_session_samples_ms"))
    return out


def model_verdicts(results: dict, second_session: dict | None) -> list[dict]:
    """The two targets: fused vs the faster of compile default and max-autotune-no-cudagraphs (from
    session 2, where the three were alternated, when it ran); fused + CUDA graphs vs reduce-overhead
    (session 1). ``second_session``: session 2's samples per variant. Each verdict is
    ``explorer.stats.compare`` over the paired rounds (Wilcoxon signed-rank, 3% minimum effect): a
    target is met unless the fused side is significantly slower; its medians and GPU-busy times
    stand beside it."""
    import dataclasses
    import statistics

    from explorer import stats

    def samples(v):
        return results[v]["samples_ms"]

    out = []
    if second_session and "fused" in second_session:
        compiled = [v for v in ("compile_default", "compile_max_autotune_no_cudagraphs") if v in second_session]
        best = min(compiled, key=lambda v: statistics.median(second_session[v]))
        out.append(dict(target="fused <= faster of compile default / max-autotune-no-cudagraphs", fused="fused",
                        baseline=best, session=2, fused_samples=second_session["fused"],
                        baseline_samples=second_session[best]))
    elif "fused" in results and "compile_default" in results:
        out.append(dict(target="fused <= compile default (max-autotune-no-cudagraphs not measured)", fused="fused",
                        baseline="compile_default", session=1, fused_samples=samples("fused"),
                        baseline_samples=samples("compile_default")))
    if "fused_cuda_graphs" in results and "compile_reduce_overhead" in results:
        out.append(dict(target="fused + CUDA graphs <= reduce-overhead", fused="fused_cuda_graphs",
                        baseline="compile_reduce_overhead", session=1, fused_samples=samples("fused_cuda_graphs"),
                        baseline_samples=samples("compile_reduce_overhead")))
    for v in out:
        fused_s, base_s = v.pop("fused_samples"), v.pop("baseline_samples")
        v["fused_ms"], v["baseline_ms"] = statistics.median(fused_s), statistics.median(base_s)
        test = stats.compare(base_s, fused_s, basis=f"session {v['session']}, paired rounds")
        v["verdict"] = test.label
        v["test"] = dataclasses.asdict(test)
        v["met"] = test.label != stats.SLOWER
        v["speedup"] = v["baseline_ms"] / v["fused_ms"] if v["fused_ms"] else None
        v["fused_gpu_busy_ms"] = results[v["fused"]]["gpu_busy_ms"]
        v["baseline_gpu_busy_ms"] = results[v["baseline"]]["gpu_busy_ms"]
    return out


def model_table_lines(key: str, m: dict | None, title: str) -> list[str]:
    """A model part's rows of the printed table: nothing when it did not run, its error when it failed, else
    a blank line, ``title`` filled from its result (``"{model} {dtype} batch {batch}:"``), then each variant
    (median, p20, p80, GPU busy, kernels, error, compile time), session 2's medians and each target's verdict."""
    if not m:
        return []
    if "error" in m:
        return [f"{key}: FAILED: {m['error']}"]
    lines = ["", title.format(**m), f"  {'variant':<36} {'median ms':>10} {'p20':>8} {'p80':>8} {'GPU busy ms':>12} "
             f"{'kernels':>8} {'rel_l2':>9} {'compile s':>10}"]
    for v, r in m["variants"].items():
        lat, busy = r["latency_ms"], r["gpu_busy_ms"]
        lines.append(f"  {v:<36} {lat['median']:>10.3f} {lat['p20']:>8.3f} {lat['p80']:>8.3f} "
                     f"{(f'{busy:.3f}' if busy is not None else '-'):>12} {str(r['kernels'] or '-'):>8} "
                     f"{r['precision']['rel_l2']:>9.2e} {str(r.get('compile_s') or '-'):>10}")
    if m.get("second_session"):
        lines.append("  session 2 (alternated again): " + ", ".join(
            f"{v} {lat['median']:.3f} ms" for v, lat in m["second_session"].items()))
    for v in m["verdicts"]:
        t = v["test"]
        ci = f", 95% CI of fused/baseline [{t['ci_low']:.3f}, {t['ci_high']:.3f}]" if t.get("ci_low") is not None else ""
        p_value = f"p={t['p_value']:.2g}" if t.get("p_value") is not None else "no test"
        lines.append(f"  target {v['target']}: {v['fused_ms']:.3f} vs {v['baseline']} {v['baseline_ms']:.3f} ms "
                     f"({v['speedup']:.2f}x, session {v['session']}): fused {v['verdict']} "
                     f"(Wilcoxon {p_value}, n={t['n']}{ci}) {'MET' if v['met'] else 'MISSED'}")
    return lines
