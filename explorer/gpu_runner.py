"""Measure a model unfused and fused, in a child process, and return one report.

``run(source, plan, settings, progress, cancel)`` is what the CLI and the app
call. It starts ``python -m explorer.gpu_runner --child`` with its arguments as
JSON on stdin; the child streams JSON lines on stdout::

    {"progress": 0.42, "status": "timing chain 12/49"}
    {"report": {...}}            # last line on success
    {"error": "one line"}        # last line on a failure the child could name

so an out-of-memory error, a CUDA fault or a hard crash ends the child, not the
caller: every failure reaches the caller as ``RunError`` with one line (for a
crash, the exit status and the last line of the child's stderr). ``cancel``
(a ``threading.Event``) and ``settings.timeout_s`` kill the child's whole
process group (torch.compile starts workers).

Inside the child, ``measure(source, plan, settings, emit)`` does the work::

    load_model ─► build_graph ─► detect ─► plan (None: all accepted; else plan.check_for)
       ─► rewrite.apply_plan(level="all") ─► unfused gm | fused gm
       ─► dtype / device / memory format (/ CUDA-graph capture), both alike
       ─► latency (alternated) · peak memory · launches · bytes · precision vs float64
       ─► per-chain micro-benchmarks ─► stages (cumulative levels) ─► baselines (eager, torch.compile)

The measuring primitives live in ``explorer.measure`` and are reused by
``benchmarks/bench_models.py``. This module imports torch, networkx and the
engine only: never Streamlit, plotly or pyvis.

Test hook (a real code path, kept on purpose): with the environment variable
``FUSION_EXPLORER_CHILD_CRASH_TEST=1`` the child writes one line to stderr and
exits with status 3 before doing anything, so tests can prove that a crashing
child becomes a ``RunError`` and the caller survives.
"""

from __future__ import annotations

import dataclasses
import json
import os
import queue
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable

from explorer.errors import ExplorerError, RunError

CRASH_TEST_ENV = "FUSION_EXPLORER_CHILD_CRASH_TEST"
REPORT_VERSION = 1

STAGE_LABELS = {
    "none": "original",
    "conv_bn": "Conv+BN fused",
    "activation": "+ epilogues (activation/add)",
    "all": "all accepted",
}


@dataclasses.dataclass(frozen=True)
class RunSettings:
    """What to measure and how. ``warmup``/``reps`` override the adaptive choice."""

    device: str = "auto"  # auto | cuda | cpu
    dtype: str = "fp32"  # fp32 | fp16 | bf16
    batch: int | None = None
    seq_len: int | None = None
    per_chain: bool = True
    stages: bool = True
    compile_baseline: bool = False
    warmup: int | None = None
    reps: int | None = None
    timeout_s: float = 900.0

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "RunSettings":
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})


# ====================================================================== parent side

def run(source: str, plan: Any | None, settings: RunSettings,
        progress: Callable[[float, str], None] | None = None,
        cancel: threading.Event | None = None) -> dict:
    """Measure ``source`` under ``plan`` in a child process and return the report.

    ``plan`` is a ``Plan`` (or ``None``: every detected chain accepted).
    ``progress(fraction, status)`` is called from this thread as the child
    reports. Raises ``RunError`` with one line on any failure, including
    ``RunError("cancelled")`` when ``cancel`` is set.
    """
    payload = json.dumps({"source": str(source),
                          "plan": plan.to_dict() if plan is not None else None,
                          "settings": settings.to_dict()})
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parent.parent)
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.setdefault("PYTHONUNBUFFERED", "1")
    stderr_file = tempfile.TemporaryFile(mode="w+b")
    try:
        proc = subprocess.Popen([sys.executable, "-m", "explorer.gpu_runner", "--child"],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr_file,
                                env=env, start_new_session=True)
    except OSError as exc:
        stderr_file.close()
        raise RunError(f"could not start the measurement process: {exc}") from None
    lines: queue.Queue = queue.Queue()

    def read_stdout() -> None:
        assert proc.stdout is not None
        for raw in proc.stdout:
            lines.put(raw)
        lines.put(None)

    reader = threading.Thread(target=read_stdout, name="gpu-runner-stdout", daemon=True)
    reader.start()
    try:
        assert proc.stdin is not None
        try:
            proc.stdin.write(payload.encode())
            proc.stdin.close()
        except BrokenPipeError:
            pass  # the child died at once; its exit status says why below
        deadline = time.monotonic() + float(settings.timeout_s)
        result: dict | None = None
        error: str | None = None
        eof = False
        while not eof:
            if cancel is not None and cancel.is_set():
                _kill(proc)
                raise RunError("cancelled")
            if time.monotonic() > deadline:
                _kill(proc)
                raise RunError(f"the measurement timed out after {settings.timeout_s:g} s and was stopped")
            try:
                raw = lines.get(timeout=0.1)
            except queue.Empty:
                continue
            if raw is None:
                eof = True
                break
            message = _parse_line(raw)
            if message is None:
                continue
            if "progress" in message and progress is not None:
                progress(float(message["progress"]), str(message.get("status", "")))
            elif "report" in message:
                result = message["report"]
            elif "error" in message:
                error = str(message["error"])
        # stdout closed: the child is exiting
        try:
            code = proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            _kill(proc)
            code = proc.wait()
        if error is not None:
            raise RunError(error)
        if result is not None and code == 0:
            return result
        raise RunError(_crash_message(code, _last_stderr_line(stderr_file)))
    finally:
        if proc.poll() is None:
            _kill(proc)
        stderr_file.close()


def _parse_line(raw: bytes) -> dict | None:
    try:
        message = json.loads(raw.decode("utf-8", "replace"))
    except ValueError:
        return None
    return message if isinstance(message, dict) else None


def _kill(proc: subprocess.Popen) -> None:
    """Kill the child and its process group (its own session, started by us), then reap it."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError, OSError):
        try:
            proc.kill()
        except OSError:
            pass
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass


def _last_stderr_line(f: Any) -> str:
    try:
        f.seek(0, os.SEEK_END)
        size = f.tell()
        f.seek(max(0, size - 16384))
        text = f.read().decode("utf-8", "replace")
    except (OSError, ValueError):
        return ""
    kept = [line.strip() for line in text.splitlines() if line.strip()]
    return kept[-1][:300] if kept else ""


def _crash_message(code: int | None, last: str) -> str:
    if code is not None and code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        why = f"the measurement process was killed by {name}"
        if -code == signal.SIGKILL:
            why += " (often: out of host memory)"
    elif code == 0:
        why = "the measurement process ended without a report"
    else:
        why = f"the measurement process crashed with exit status {code}"
    return f"{why}; last stderr line: {last}" if last else why


# ====================================================================== child side

def child_main() -> int:
    """Entry point of ``python -m explorer.gpu_runner --child``: JSON in, JSON lines out."""
    if os.environ.get(CRASH_TEST_ENV) == "1":
        sys.stderr.write(f"{CRASH_TEST_ENV}=1: simulated crash, exiting with status 3\n")
        sys.stderr.flush()
        os._exit(3)
    # The protocol owns the real stdout; anything else printing to fd 1 goes to stderr.
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr

    def send(message: dict) -> None:
        proto.write(json.dumps(message, default=_json_default, allow_nan=True) + "\n")
        proto.flush()

    def emit(fraction: float, status: str) -> None:
        send({"progress": round(float(min(max(fraction, 0.0), 1.0)), 4), "status": status})

    try:
        args = json.loads(sys.stdin.read() or "{}")
        settings = RunSettings.from_dict(args.get("settings") or {})
        report = measure(args["source"], args.get("plan"), settings, emit)
        send({"report": _jsonable(report)})
        return 0
    except ExplorerError as exc:
        send({"error": str(exc)})
        return 0
    except Exception as exc:  # OOM, CUDA errors, bugs: one line for the user, the trace on stderr
        import traceback

        traceback.print_exc()
        send({"error": _describe_failure(exc)})
        return 0
    finally:
        proto.flush()


def _describe_failure(exc: BaseException) -> str:
    import torch

    first = (str(exc).strip().splitlines() or [""])[0][:240]
    if isinstance(exc, torch.cuda.OutOfMemoryError):
        return f"out of GPU memory: {first}"
    text = f"{type(exc).__name__}: {first}"
    if "CUDA" in first or "cuda" in type(exc).__name__.lower() or "cuDNN" in first:
        return f"CUDA error: {text}"
    if "can't allocate memory" in first or "not enough memory" in first.lower():
        return f"out of host memory: {text}"
    return f"measurement failed: {text}"


def _json_default(obj: Any) -> Any:
    return str(obj)


def _jsonable(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, float) and obj != obj:
        return None
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    return str(obj)


# ====================================================================== the measurement

@dataclasses.dataclass
class Variant:
    """One way of running the model: ``timed`` is what gets timed (a graph replay when
    CUDA graphs are on), ``forward`` is one plain forward returning the output."""

    name: str
    timed: Callable[[], Any]
    forward: Callable[[], Any]
    resident_bytes: int
    cuda_graph: bool = False
    graph_pool_bytes: int | None = None
    note: str = ""


def make_variant(name: str, module: Any, inputs: tuple, device: str, cuda_graphs: bool = False) -> Variant:
    """Wrap ``module(*inputs)``; with ``cuda_graphs`` on CUDA, capture it and time replays.

    A failed capture falls back to plain calls, with the reason in ``note``.
    """
    import torch

    from explorer.runtime import measure as m

    def forward() -> Any:
        return module(*inputs)

    resident = (m.weight_bytes(module) if isinstance(module, torch.nn.Module) else 0) + m.tensor_bytes(inputs)
    variant = Variant(name, forward, forward, resident)
    if not cuda_graphs:
        return variant
    if not device.startswith("cuda"):
        variant.note = "CUDA graphs need CUDA: plain calls on CPU"
        return variant
    try:
        with torch.inference_mode():
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                for _ in range(3):
                    forward()
            torch.cuda.current_stream().wait_stream(stream)
            torch.cuda.synchronize()
            before = torch.cuda.memory_allocated()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                static_out = forward()
            torch.cuda.synchronize()
            pool = torch.cuda.memory_allocated() - before
    except Exception as exc:
        torch.cuda.synchronize()
        variant.note = f"CUDA graph capture failed, plain calls instead: {m._one_line(exc)}"
        return variant

    def replay() -> Any:
        graph.replay()
        return static_out

    variant.timed = replay
    variant.cuda_graph = True
    variant.graph_pool_bytes = int(max(pool, 0))
    variant.note = "timed as CUDA-graph replays of a forward captured on static inputs"
    variant._graph = graph  # keep the graph (and its pool) alive with the variant
    return variant


def measure_variants(variants: list[Variant], device: str, timing: Any, batch: int,
                     graph_bytes: dict[str, int] | None = None,
                     on_round: Callable[[int, int], None] | None = None,
                     launches: bool = True) -> dict[str, dict]:
    """Latency (alternated), throughput, peak memory and launches of each variant."""
    from explorer.runtime import measure as m

    lat = m.time_alternated({v.name: v.timed for v in variants}, device, timing, on_round)
    out: dict[str, dict] = {}
    for v in variants:
        entry: dict[str, Any] = {"latency_ms": lat[v.name], "throughput": m.throughput(batch, lat[v.name]),
                                 "throughput_unit": "items/s"}
        entry.update(m.peak_memory(v.forward, device, v.resident_bytes))
        entry["resident_bytes"] = v.resident_bytes
        if launches:
            entry.update(m.count_launches(v.forward, device))
        if v.cuda_graph:
            entry["cuda_graph"] = True
            entry["graph_pool_bytes"] = v.graph_pool_bytes
        if v.note:
            entry["note"] = v.note
        if graph_bytes and v.name in graph_bytes:
            entry["bytes_moved"] = graph_bytes[v.name]
        out[v.name] = entry
    return out


def reference_output(gm: Any, inputs: tuple, device: str) -> tuple[Any, str]:
    """The unfused graph in float64 on ``device`` (CUDA) or the CPU; returns (output, where)."""
    import torch

    from explorer.runtime import measure as m

    where = device if device.startswith("cuda") else "cpu"
    ref_gm = m.prepare_graph(gm, where, torch.float64)
    ref_in = m.prepare_inputs(inputs, where, torch.float64)
    with torch.inference_mode():
        out = ref_gm(*ref_in)
    out = [t.detach().to("cpu") for t in m.flat_outputs(out)]
    del ref_gm, ref_in
    return out, f"unfused graph in float64 on {where}"


def _check_memory(source: str, settings: RunSettings) -> None:
    from explorer.runtime import measure as m

    need = m.zoo_input_bytes(source, settings.batch, settings.seq_len)
    if need is None:
        return
    # fp32 inputs as generated, their float64 reference copy (2x), the copy in the run dtype.
    m.check_fits(4 * need, m.available_host_bytes(), "host memory, inputs alone")


def _check_device_memory(model: Any, graph: Any, device: str, dtype: Any) -> None:
    import torch

    from explorer.runtime import measure as m

    if not device.startswith("cuda"):
        largest = max((a["bytes_written"] for _, a in graph.nodes(data=True)), default=0)
        need = m.weight_bytes(model.gm) + 4 * largest
        m.check_fits(int(need), m.available_host_bytes(), "host memory, weights and largest activations")
        return
    ratio = m.element_ratio(dtype)
    largest = max((a["bytes_written"] for _, a in graph.nodes(data=True)), default=0)
    # two copies of the weights (unfused + fused), the inputs, a few live activations, float64 reference
    need = (2 * ratio + 2) * m.weight_bytes(model.gm) + (ratio + 2) * m.tensor_bytes(model.example_inputs) \
        + 4 * largest * 2
    free, _total = torch.cuda.mem_get_info()
    m.check_fits(int(need), int(free), "GPU memory, estimated from weights, inputs and largest activation")


def measure(source: str, plan_data: dict | None, settings: RunSettings,
            emit: Callable[[float, str], None] | None = None) -> dict:
    """Run the whole measurement in this process and return the report (see module docstring)."""
    import torch

    from explorer.runtime import measure as m
    from explorer.fusion_engine import detect
    from explorer.graph.build import build_graph
    from explorer.fusions.plan import Plan, make_plan
    from explorer.sources import describe_source, load_model

    emit = emit or (lambda f, s: None)
    t_start = time.perf_counter()
    device = m.resolve_device(settings.device)
    dtype = m.torch_dtype(settings.dtype)
    env = m.environment(device)
    env["tf32_matmul"] = bool(torch.backends.cuda.matmul.allow_tf32)
    env["tf32_cudnn"] = bool(torch.backends.cudnn.allow_tf32)
    notes: list[str] = []

    emit(0.01, f"loading {source}")
    _check_memory(source, settings)
    model = load_model(source, batch=settings.batch, seq_len=settings.seq_len)
    emit(0.06, "building graph and detecting chains")
    graph = build_graph(model.gm, model.name)
    detection = detect(graph)
    plan = make_plan(detection, "all") if plan_data is None else Plan.from_dict(plan_data)
    plan.check_for(detection)
    _check_device_memory(model, graph, device, dtype)

    from explorer.fusions import rewrite

    emit(0.08, "applying the plan")
    fused_model = rewrite.apply_plan(model.gm, detection, plan, device, level="all")
    applied = {a.chain_id: a for a in fused_model.applied}
    fused_ids = [a.chain_id for a in fused_model.applied if a.status == "fused"]

    channels_last = plan.memory_format == "channels_last"
    if plan.cuda_graphs and not device.startswith("cuda"):
        notes.append("CUDA graphs requested but ignored: they need CUDA")
    emit(0.1, f"preparing models ({settings.dtype}, {device}, {plan.memory_format})")
    unfused_gm = m.prepare_graph(model.gm, device, dtype, channels_last)
    fused_gm = m.prepare_graph(fused_model.gm, device, dtype, channels_last)
    inputs = m.prepare_inputs(model.example_inputs, device, dtype, channels_last)
    classification = model.task == "classification"

    # -- bytes (graph model, scaled to the dtype)
    ratio = m.element_ratio(dtype)
    bytes_unfused = m.graph_bytes(graph, dtype)
    saved = sum(detection.chain(cid).bytes_saved for cid in fused_ids)
    bytes_fused = int(bytes_unfused - saved * ratio)

    # -- precision first: a wrong fused model is the first thing to know
    emit(0.12, "computing the float64 reference")
    ref, ref_where = reference_output(model.gm, model.example_inputs, device)
    with torch.inference_mode():
        out_unfused = unfused_gm(*inputs)
        out_fused = fused_gm(*inputs)
    prec_unfused = m.precision(out_unfused, ref, classification)
    prec_fused = m.precision(out_fused, ref, classification)
    fused_vs_unfused = m.precision(out_fused, [t.double() for t in m.flat_outputs(out_unfused)], classification)
    del out_unfused, out_fused

    # -- the main A/B
    timing = m.TimingPlan.for_device(device, settings.warmup, settings.reps)
    emit(0.15, "warming up unfused and fused")
    variants = [make_variant("unfused", unfused_gm, inputs, device, plan.cuda_graphs),
                make_variant("fused", fused_gm, inputs, device, plan.cuda_graphs)]

    def main_round(r: int, n: int) -> None:
        if r % max(1, n // 20) == 0 or r == n:
            emit(0.15 + 0.3 * r / n, f"timing unfused vs fused, round {r}/{n}")

    main = measure_variants(variants, device, timing, model.batch,
                            {"unfused": bytes_unfused, "fused": bytes_fused}, main_round)
    main["unfused"]["precision"] = prec_unfused
    main["fused"]["precision"] = prec_fused
    main["fused"]["precision_vs_unfused"] = fused_vs_unfused
    main["unfused"]["graph_launches"] = int(detection.totals.get("launches", 0))
    main["fused"]["graph_launches"] = int(detection.totals.get("launches", 0)
                                          - sum(detection.chain(c).launches_saved for c in fused_ids))
    del variants

    report: dict[str, Any] = {
        "version": REPORT_VERSION,
        "model": {**describe_source(model), "task": model.task, "description": model.description,
                  "fingerprint": detection.fingerprint, "chains_detected": len(detection.chains),
                  "ops": int(detection.totals.get("ops", 0)), "params": int(detection.totals.get("params", 0)),
                  "flops": int(detection.totals.get("flops", 0))},
        "plan": plan.to_dict(),
        "settings": {**settings.to_dict(), "device_resolved": device,
                     "timing": dataclasses.asdict(timing)},
        "environment": env,
        "unfused": main["unfused"],
        "fused": main["fused"],
        "reference": {"what": ref_where, "unfused": prec_unfused, "fused": prec_fused,
                      "fused_worse": _worse(prec_fused, prec_unfused)},
        "precision_note": ("max_rel = max|out-ref| / max|ref|; rel_l2 = ||out-ref|| / ||ref||; ref = "
                           + ref_where + "; top1_agreement only for classification (argmax of last dim)"),
        "bytes_note": ("graph byte model: each op reads its inputs and weights once and writes its outputs "
                       f"once; captured in float32, floating tensors scaled by {ratio:g} for {settings.dtype}; "
                       "fused = unfused minus the fused chains' intermediates"),
        "speedup": _ratio(main["unfused"]["latency_ms"]["median"], main["fused"]["latency_ms"]["median"]),
        "graph_calls_note": ("unfused and fused graphs alike are timed lean (explorer.lean): ATen calls through "
                             "their public bindings, fused calls resolved once to the library call they take "
                             "on this device, weights read as plain attributes; the same kernels either way"),
        "applied": [dataclasses.asdict(a) for a in fused_model.applied],
        "chains": [],
        "stages": [],
        "stages_skipped": [],
        "baselines": None,
        "notes": notes,
    }

    # -- per-chain micro-benchmarks
    accepted = [c for c in detection.chains if c.id in set(plan.accepted)]
    if settings.per_chain:
        report["chains"] = chain_benchmarks(model, graph, detection, accepted, applied, device, dtype,
                                            settings, lambda f, s: emit(0.45 + 0.3 * f, s),
                                            cuda_graphs=plan.cuda_graphs)
    else:
        report["chains"] = [_chain_entry(c, applied.get(c.id), graph, dtype) for c in accepted]
        notes.append("per-chain micro-benchmarks not run (per_chain=False)")

    # -- stages
    if settings.stages:
        emit(0.76, "measuring stages")
        report["stages"], report["stages_skipped"] = stage_measurements(
            model, detection, plan, device, dtype, channels_last, settings,
            lambda f, s: emit(0.76 + 0.14 * f, s))

    # -- baselines
    if settings.compile_baseline:
        emit(0.9, "measuring eager and torch.compile baselines")
        report["baselines"] = baselines(model, fused_gm, inputs, device, dtype, channels_last, settings,
                                        lambda f, s: emit(0.9 + 0.09 * f, s), cuda_graphs=plan.cuda_graphs)
    report["duration_s"] = round(time.perf_counter() - t_start, 2)
    emit(1.0, "done")
    return report


def _ratio(a: float | None, b: float | None) -> float | None:
    return float(a) / float(b) if a and b else None


def _worse(fused: dict, unfused: dict) -> bool | None:
    f, u = fused.get("rel_l2"), unfused.get("rel_l2")
    if f is None or u is None:
        return None
    return bool(f > 2 * u + 1e-12)


# ---------------------------------------------------------------------- chains

def _chain_entry(chain: Any, applied: Any, graph: Any, dtype: Any) -> dict:
    from explorer.runtime import measure as m

    b_unfused = m.graph_bytes(graph, dtype, chain.compute_nodes)
    return {
        "id": chain.id, "pattern": chain.pattern,
        "implementation": getattr(applied, "implementation", "") if applied else "",
        "kernel": getattr(applied, "kernel", "auto") if applied else "auto",
        "status": applied.status if applied else "not applied",
        "reason": getattr(applied, "reason", "") if applied else "apply_plan did not report this chain",
        "unfused_ms": None, "fused_ms": None, "unfused_latency_ms": None, "fused_latency_ms": None,
        "speedup": None,
        "bytes_unfused": b_unfused, "bytes_fused": int(b_unfused - chain.bytes_saved * m.element_ratio(dtype)),
        "launches_unfused": None, "launches_fused": None, "launches_kind": None,
        "graph_launches_saved": chain.launches_saved,
        "max_abs": None, "rel_err": None, "rel_err_unfused": None, "slower": None, "verdict": None,
    }


def chain_benchmarks(model: Any, graph: Any, detection: Any, chains: list, applied: dict, device: str,
                     dtype: Any, settings: RunSettings, emit: Callable[[float, str], None],
                     cuda_graphs: bool = False) -> list[dict]:
    """Time each accepted chain alone, unfused vs fused, on its real shapes.

    Each timed call is synchronised, so ``unfused_ms``/``fused_ms`` include the
    host's launch overhead (Python, Triton's launcher), which a chain of tiny
    kernels pays in an eager model. On CUDA the chain is also captured as a
    CUDA graph and its replays timed (``*_graph_ms``: device time with launch
    overhead removed), alternated with the plain calls. ``slower`` uses the
    plain calls, or the graph replays when the plan uses CUDA graphs
    (``slower_basis`` says which): true when the fused chain's 20th percentile
    is above the unfused chain's 80th, i.e. slower beyond the measured spread.
    ``verdict`` is faster / slower / within noise. A failing chain is reported
    with its reason, never hidden.
    """
    import torch

    from explorer.runtime import measure as m
    from explorer.fusions import rewrite

    timing = m.TimingPlan.for_device(device, 3 if settings.warmup is None else min(settings.warmup, 3),
                                     settings.reps, short=True)
    if settings.reps is not None:
        timing = dataclasses.replace(timing, reps=max(3, min(settings.reps, 20)))
    out = []
    n = len(chains)
    for i, chain in enumerate(chains):
        emit(i / max(n, 1), f"timing chain {i + 1}/{n}")
        entry = _chain_entry(chain, applied.get(chain.id), graph, dtype)
        out.append(entry)
        if entry["status"] != "fused":
            continue
        try:
            unfused_c, fused_c, c_inputs = rewrite.chain_module(model.gm, detection, chain.id, device,
                                                                kernel=entry["kernel"])
            u = m.prepare_graph(unfused_c, device, dtype)
            f = m.prepare_graph(fused_c, device, dtype)
            x = m.prepare_inputs(c_inputs, device, dtype)
            ref_where = device if device.startswith("cuda") else "cpu"
            ref_gm = m.prepare_graph(unfused_c, ref_where, torch.float64)
            with torch.inference_mode():
                ref = ref_gm(*m.prepare_inputs(c_inputs, ref_where, torch.float64))
                out_u, out_f = u(*x), f(*x)
            p_u, p_f = m.precision(out_u, ref, False), m.precision(out_f, ref, False)
            fns = {"unfused": lambda: u(*x), "fused": lambda: f(*x)}
            graph_notes = []
            if device.startswith("cuda"):
                for name, mod in (("unfused", u), ("fused", f)):
                    v = make_variant(name, mod, x, device, cuda_graphs=True)
                    if v.cuda_graph:
                        fns[name + "_graph"] = v.timed
                    else:
                        graph_notes.append(f"{name}: {v.note}")
            lat = m.time_alternated(fns, device, timing)
            lu, lf = m.count_launches(lambda: u(*x), device), m.count_launches(lambda: f(*x), device)
        except Exception as exc:
            if device.startswith("cuda"):
                try:
                    torch.cuda.synchronize()
                except Exception:
                    pass
            entry.update(status="failed", reason=f"chain benchmark failed: {m._one_line(exc)}")
            continue
        ul, fl = lat["unfused"], lat["fused"]
        ug, fg = lat.get("unfused_graph"), lat.get("fused_graph")
        basis = "cuda graph replays" if (cuda_graphs and ug and fg) else "synchronised calls"
        bu, bf = (ug, fg) if basis == "cuda graph replays" else (ul, fl)
        slower = bf["p20"] > bu["p80"]
        faster = bf["p80"] < bu["p20"]
        if ug and fg:
            entry.update(unfused_graph_ms=ug["median"], fused_graph_ms=fg["median"],
                         graph_speedup=_ratio(ug["median"], fg["median"]),
                         slower_in_graph=bool(fg["p20"] > ug["p80"]))
        if graph_notes:
            entry["graph_note"] = "; ".join(graph_notes)
        entry.update(
            unfused_ms=ul["median"], fused_ms=fl["median"], unfused_latency_ms=ul, fused_latency_ms=fl,
            speedup=_ratio(ul["median"], fl["median"]), slower_basis=basis,
            launches_unfused=lu["kernel_launches"], launches_fused=lf["kernel_launches"],
            launches_kind=lu["kernel_launches_kind"],
            max_abs=p_f["max_abs"], rel_err=p_f["rel_l2"], rel_err_unfused=p_u["rel_l2"],
            slower=bool(slower), verdict="slower" if slower else ("faster" if faster else "within noise"),
        )
    emit(1.0, f"timed {n} chains")
    return out


# ---------------------------------------------------------------------- stages

def stage_measurements(model: Any, detection: Any, plan: Any, device: str, dtype: Any, channels_last: bool,
                       settings: RunSettings, emit: Callable[[float, str], None]) -> tuple[list, list]:
    """Cumulative levels of ``rewrite.LEVELS``, timed alternated; a level that fuses
    nothing more than the previous one is skipped and listed with the reason."""
    from explorer.runtime import measure as m
    from explorer.fusions import rewrite

    kept: list[tuple[str, Any, list[str]]] = []
    skipped = []
    previous: set[str] | None = None
    for level in rewrite.LEVELS:
        if level == "none":
            gm, fused = model.gm, []
        else:
            fm = rewrite.apply_plan(model.gm, detection, plan, device, level=level)
            gm, fused = fm.gm, sorted(a.chain_id for a in fm.applied if a.status == "fused")
        if previous is not None and set(fused) == previous:
            skipped.append({"stage": level, "label": STAGE_LABELS.get(level, level),
                            "reason": f"fuses the same {len(fused)} chain(s) as the previous stage"})
            continue
        previous = set(fused)
        kept.append((level, gm, fused))
    emit(0.1, f"timing {len(kept)} stages")
    inputs = m.prepare_inputs(model.example_inputs, device, dtype, channels_last)
    variants = [make_variant(level, m.prepare_graph(gm, device, dtype, channels_last), inputs, device,
                             plan.cuda_graphs) for level, gm, _ in kept]
    timing = m.TimingPlan.for_device(device, settings.warmup, settings.reps)
    timing = dataclasses.replace(timing, target_s=timing.target_s / 2)
    res = measure_variants(variants, device, timing, model.batch, launches=False,
                           on_round=lambda r, n: emit(0.1 + 0.9 * r / n, f"timing stages, round {r}/{n}")
                           if r % max(1, n // 10) == 0 else None)
    stages = []
    for level, _gm, fused in kept:
        r = res[level]
        stages.append({"stage": level, "label": STAGE_LABELS.get(level, level), "latency_ms": r["latency_ms"],
                       "throughput": r["throughput"], "peak_memory_bytes": r["peak_memory_bytes"],
                       "activation_peak_bytes": r["activation_peak_bytes"], "chains_fused": len(fused)})
    return stages, skipped


# ---------------------------------------------------------------------- baselines

def baselines(model: Any, fused_gm: Any, inputs: tuple, device: str, dtype: Any, channels_last: bool,
              settings: RunSettings, emit: Callable[[float, str], None], cuda_graphs: bool = False) -> dict:
    """Eager ``nn.Module`` and ``torch.compile`` (default mode), timed alternated with the fused graph,
    all with the plan's levers (memory format, CUDA graphs) so that only the method differs."""
    import torch

    from explorer.runtime import measure as m

    result: dict[str, Any] = {}
    variants = [make_variant("fused", fused_gm, inputs, device, cuda_graphs)]
    eager = model.module
    if eager is not None:
        eager = m.prepare_module(eager, device, dtype, channels_last)
        variants.append(make_variant("eager", eager, inputs, device, cuda_graphs))
    else:
        result["eager"] = {"error": "this source has no eager nn.Module (ONNX or .pt2): not measured"}
    target = eager if eager is not None else m.prepare_graph(model.gm, device, dtype, channels_last)
    emit(0.1, "compiling with torch.compile (default mode)")
    try:
        compiled = torch.compile(target)
        t0 = time.perf_counter()
        with torch.inference_mode():
            compiled(*inputs)
        m.synchronize(device)
        compile_s = time.perf_counter() - t0
        v = make_variant("torch_compile", compiled, inputs, device, cuda_graphs)
        v.resident_bytes = m.weight_bytes(target) + m.tensor_bytes(inputs)
        variants.append(v)
    except Exception as exc:
        result["torch_compile"] = {"error": f"torch.compile failed: {m._one_line(exc)}"}
        compile_s = None
    emit(0.6, "timing baselines")
    timing = m.TimingPlan.for_device(device, settings.warmup, settings.reps)
    res = measure_variants(variants, device, timing, model.batch)
    for name, r in res.items():
        result[name if name != "fused" else "fused_same_rounds"] = r
    if "torch_compile" in result and compile_s is not None:
        result["torch_compile"]["compile_s"] = round(compile_s, 2)
        result["torch_compile"]["mode"] = "default"
    return result


# ---------------------------------------------------------------------- text summary

def summary_table(report: dict) -> str:
    """A compact plain-text table of a report (for the CLI)."""
    env = report.get("environment", {})
    lines = [f"{report.get('model', {}).get('name', '?')} on {env.get('device_name')} "
             f"({report.get('settings', {}).get('dtype')}, batch {report.get('model', {}).get('batch')})"
             + (f"  [{env.get('note')}]" if env.get("is_cpu") else "")]
    lines.append(f"{'variant':<30}{'median ms':>11}{'p20':>9}{'p80':>9}{'items/s':>11}{'launches':>10}{'rel_l2':>10}")

    def row(name: str, r: dict) -> None:
        lat = r.get("latency_ms") or {}
        prec = r.get("precision") or {}
        rel = prec.get("rel_l2")
        lines.append(f"{name:<30}{_fmt(lat.get('median')):>11}{_fmt(lat.get('p20')):>9}{_fmt(lat.get('p80')):>9}"
                     f"{_fmt(r.get('throughput'), 1):>11}{str(r.get('kernel_launches', '')):>10}"
                     f"{(f'{rel:.1e}' if isinstance(rel, float) else '-'):>10}")

    for key in ("unfused", "fused"):
        if key in report:
            row(key, report[key])
    for s in report.get("stages") or []:
        row(f"stage: {s['label']}", s)
    for name, r in (report.get("baselines") or {}).items():
        if isinstance(r, dict) and "latency_ms" in r:
            row(f"baseline: {name}", r)
    chains = report.get("chains") or []
    if chains:
        slower = [c["id"] for c in chains if c.get("slower")]
        failed = [c["id"] for c in chains if c.get("status") == "failed"]
        lines.append(f"chains: {len(chains)} accepted, {len(slower)} slower when fused"
                     + (f" ({', '.join(slower[:5])})" if slower else "")
                     + (f", {len(failed)} failed" if failed else ""))
    if report.get("speedup"):
        lines.append(f"speedup fused vs unfused: {report['speedup']:.3f}x")
    return "\n".join(lines)


def _fmt(x: Any, digits: int = 3) -> str:
    return f"{x:.{digits}f}" if isinstance(x, (int, float)) else "-"


if __name__ == "__main__":
    if "--child" in sys.argv[1:]:
        sys.exit(child_main())
    print("usage: python -m explorer.gpu_runner --child  (arguments as JSON on stdin); "
          "use the fusion-explorer CLI to run a measurement", file=sys.stderr)
    sys.exit(2)
