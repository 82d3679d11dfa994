"""The variants a run times, and the primitives that time them alike.

A ``Variant`` is one way of running the model: its ``timed`` callable (a CUDA
graph replay when graphs are on), its plain ``forward``, and the bytes it
keeps resident. ``measure_variants`` times several alternated
(``explorer.runtime.measure.time_alternated``) and adds throughput, peak
memory and kernel launches; ``reference_output`` is the float64 reference
every precision figure is measured against.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import torch

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
    graph_pool_bytes: int | None = None
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
            before = torch.cuda.memory_allocated()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                static_out = forward()
            torch.cuda.synchronize()
            pool = torch.cuda.memory_allocated() - before
    except Exception as exc:
        torch.cuda.synchronize()
        return dataclasses.replace(variant, note=f"CUDA graph capture failed, plain calls instead: {m._one_line(exc)}")

    def replay() -> Any:
        graph.replay()
        return static_out

    return dataclasses.replace(variant, timed=replay, cuda_graph=True, graph_pool_bytes=int(max(pool, 0)),
                               note="timed as CUDA-graph replays of a forward captured on static inputs",
                               keepalive=graph)  # the graph (and its memory pool) lives as long as the variant


def measure_variants(variants: list[Variant], device: str, timing: Any, batch: int,
                     graph_bytes: dict[str, int] | None = None,
                     on_round: Callable[[int, int], None] | None = None,
                     launches: bool = True) -> dict[str, dict]:
    """Latency (alternated), throughput, peak memory and launches of each variant."""

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

    where = device if device.startswith("cuda") else "cpu"
    ref_gm = m.prepare_graph(gm, where, torch.float64)
    ref_in = m.prepare_inputs(inputs, where, torch.float64)
    with torch.inference_mode():
        out = ref_gm(*ref_in)
    out = [t.detach().to("cpu") for t in m.flat_outputs(out)]
    del ref_gm, ref_in
    return out, f"unfused graph in float64 on {where}"
