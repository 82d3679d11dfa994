"""The variants a run times, and the primitives that time them alike.

A ``Variant`` is one way of running the model: its ``timed`` callable (a CUDA
graph replay when graphs are on), its plain ``forward``, and the bytes it
keeps resident. ``measure_variants`` times several alternated
(``explorer.runtime.measure.time_alternated``) and adds throughput, peak
memory and kernel launches; ``reference_output`` is the float64 reference
every precision figure is measured against.
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any, Callable, Iterator

import torch

from explorer.messages import NOTES
from explorer.report import GPU, HOST, HOST_BOUND_BUSY, Latency, Measurement, Precision
from explorer.runtime import measure as m


@dataclasses.dataclass(frozen=True)
class Variant:
    """One way of running the model: ``timed`` is what gets timed (a graph replay when
    CUDA graphs are on), ``forward`` is one plain forward returning the output."""

    name: str
    timed: Callable[[], Any]
    forward: Callable[[], Any]
    resident_bytes: int
    cuda_graph: bool = False
    note: str = ""
    keepalive: Any = None        # what must outlive the timed callable (a captured CUDA graph)


def make_variant(name: str, module: Any, inputs: tuple, device: str, cuda_graphs: bool = False) -> Variant:
    """Wrap ``module(*inputs)``; with ``cuda_graphs`` on CUDA, capture it and time replays.

    A failed capture falls back to plain calls, with the reason in ``note``.
    """

    def forward() -> Any:
        return module(*inputs)

    resident = (m.weight_bytes(module) if isinstance(module, torch.nn.Module) else 0) + m.tensor_bytes(inputs)
    variant = Variant(name, forward, forward, resident)
    if not cuda_graphs:
        return variant
    if not device.startswith("cuda"):
        return dataclasses.replace(variant, note="CUDA graphs need CUDA: plain calls on CPU")
    try:
        with torch.inference_mode():
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                for _ in range(3):
                    forward()
            torch.cuda.current_stream().wait_stream(stream)
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with _own_cublas_workspace():
                with torch.cuda.graph(graph):
                    static_out = forward()
            torch.cuda.synchronize()
    except Exception as exc:
        torch.cuda.synchronize()
        return dataclasses.replace(variant, note=NOTES("cuda_graph_capture_failed", x=m._one_line(exc)))

    def replay() -> Any:
        graph.replay()
        return static_out

    return dataclasses.replace(variant, timed=replay, cuda_graph=True,
                               note="timed as CUDA-graph replays of a forward captured on static inputs",
                               keepalive=graph)  # the graph (and its memory pool) lives as long as the variant


@contextlib.contextmanager
def _own_cublas_workspace() -> Iterator[None]:
    """Make a capture allocate its cuBLAS workspace in its own graph's pool, and keep no pointer to it.

    cuBLAS keeps one workspace per (handle, stream), and every ``torch.cuda.graph`` capture runs on
    one shared capture stream. Without this, the first capture allocates that stream's workspace in
    its private pool and every later capture bakes the same pointer into its kernels. Once the first
    graph is gone (a per-chain benchmark) and the workspace is dropped (``torch.compile``'s
    reduce-overhead mode clears cuBLAS workspaces before it records), the pool's memory is released
    and the later graph's replay faults: "CUDA error: unspecified launch failure" at Llama-3-8B layer
    sizes (issue 20; reproduced and fixed on the H200, ``tests/test_gpu_graphs.py``). Clearing before
    the capture gives it a workspace of its own, inside its own pool; clearing after it keeps later
    work from sharing that one. torch.compile's CUDA-graph trees do the same around their records.
    """
    torch._C._cuda_clearCublasWorkspaces()
    try:
        yield
    finally:
        torch._C._cuda_clearCublasWorkspaces()


def latency_of(samples_ms: list[float]) -> Latency:
    """The typed latency summary (median, p20, p80, reps) of timed calls."""
    summary = m.summarize(samples_ms)
    return Latency(median=float(summary["median"]), p20=float(summary["p20"]), p80=float(summary["p80"]),
                   reps=int(summary["reps"]))


def precision_of(values: dict[str, Any] | None) -> Precision | None:
    """The typed precision of ``measure.precision``'s dict."""
    if values is None:
        return None
    return Precision(**{k: values.get(k) for k in ("max_abs", "max_rel", "rel_l2", "cosine", "top1_agreement",
                                                    "finite", "refused")})


def measure_variants(variants: list[Variant], device: str, timing: Any, batch: int,
                     graph_bytes: dict[str, int] | None = None,
                     on_round: Callable[[int, int], None] | None = None,
                     launches: bool = True, pairs: tuple[tuple[str, str], ...] = (),
                     ) -> tuple[dict[str, Measurement], dict[str, list[float]]]:
    """Latency (alternated, paired rounds), throughput, peak memory and launches of each variant.

    Returns the typed measurements and every variant's per-round samples (ms):
    round ``i`` of two variants is a pair for ``explorer.stats.compare``. With
    ``pairs`` (baseline, candidate), rounds are added while a pair's verdict is
    open (``measure.time_paired``).
    """
    samples = m.time_paired({v.name: v.timed for v in variants}, pairs, device, timing, on_round)
    out: dict[str, Measurement] = {}
    for v in variants:
        latency = latency_of(samples[v.name])
        try:
            memory = m.peak_memory(v.forward, device, v.resident_bytes)
            counted = m.count_launches(v.forward, device) if launches else {}
        except Exception as exc:  # the phase that fails says which variant did
            raise m.VariantFailed(v.name, exc) from exc
        busy = counted.get("gpu_busy_ms")
        bound = None
        if busy is not None and latency.median > 0:
            bound = HOST if busy < HOST_BOUND_BUSY * latency.median else GPU
        out[v.name] = Measurement(
            name=v.name, latency=latency, throughput=m.throughput(batch, {"median": latency.median}),
            peak_memory_bytes=memory["peak_memory_bytes"], activation_peak_bytes=memory["activation_peak_bytes"],
            resident_bytes=v.resident_bytes, kernel_launches=counted.get("kernel_launches"),
            launches_kind=str(counted.get("kernel_launches_kind") or ""),
            bytes_moved=(graph_bytes or {}).get(v.name), gpu_busy_ms=busy, bound=bound, cuda_graph=v.cuda_graph,
            note=v.note, memory_note=str(memory.get("memory_note") or ""))
    return out, samples


def reference_output(gm: Any, inputs: tuple, device: str) -> tuple[Any, str]:
    """The unfused graph in float64 on ``device`` (CUDA) or the CPU; returns (output, where)."""

    where = device if device.startswith("cuda") else "cpu"
    ref_gm = m.prepare_graph(gm, where, torch.float64)
    ref_in = m.prepare_inputs(inputs, where, torch.float64)
    with torch.inference_mode():
        out = ref_gm(*ref_in)
    out = [t.detach().to("cpu") for t in m.flat_outputs(out)]
    del ref_gm, ref_in
    return out, NOTES("unfused_graph_float64", x=where)
