"""The device's ceilings, in one place: memory bandwidth, peak FLOP/s, L2 size, and the cost of one launch.

Every roofline, ridge point and predicted gain in the explorer reads its figures
from here (``explorer.teaching.predict``, ``explorer.runtime.breakdown``), so a
figure is written once, with where it came from.

Two sources, never mixed silently:

- ``KNOWN``: figures for a named device, each with its source. For the NVIDIA
  H200 the bandwidth and the bf16 matrix rate were *measured* (a committed
  result of this repository and this workplace's own measurement); the rates
  of the other dtypes are the vendor's datasheet and say so. The CPU has no
  entry: its ceilings are unknown until measured.
- ``measure_ceilings(device, dtype)``: measured now on this machine: a large
  device copy (bytes read + bytes written over the time), a large matrix
  product in ``dtype`` (2·n³ FLOP over the time, random data, never zeros),
  and ``measure_launch_cost``: the host time of one small kernel call from
  Python (``torch.relu_`` on a small tensor, many calls, synchronised once at
  the end), which is what removing one launch from a host-bound forward saves.

The ridge point (``Ceilings.ridge``) is peak FLOP/s over bandwidth: a kernel
whose arithmetic intensity (FLOP per byte moved) is below it is memory-bound.
"""

from __future__ import annotations

import dataclasses
import json
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from explorer.messages import CEILINGS

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"

#: The committed measurement a per-launch cost is read from (host time of one more kernel call).
LAUNCH_COST_FILE = "host_overhead_lean_h200.json"
_LAUNCH_ROWS = ("conv+relu eager (2 ops)", "conv+relu: direct cudnn call (lean)")


@dataclasses.dataclass(frozen=True)
class Ceilings:
    """What one device can do at most, with the source of every figure.

    ``bandwidth`` in bytes per second (bytes read plus bytes written);
    ``flops`` maps a dtype name (fp32, fp16, bf16) to FLOP/s of its matrix
    units; ``l2_bytes`` the last-level cache; ``launch_us`` the host time of one
    kernel call; ``sources`` says, per figure, where it comes from;
    ``measured`` is True when every figure used was measured (none from a datasheet).
    """

    device_name: str
    bandwidth: float | None = None
    flops: dict[str, float] = dataclasses.field(default_factory=dict)
    l2_bytes: int | None = None
    launch_us: float | None = None
    sources: dict[str, str] = dataclasses.field(default_factory=dict)
    measured: bool = False

    def peak_flops(self, dtype: str) -> float | None:
        """FLOP/s in ``dtype`` (fp32, fp16, bf16), or None when unknown."""
        return self.flops.get(dtype)

    def ridge(self, dtype: str) -> float | None:
        """FLOP per byte at which compute and memory take equally long (None when either is unknown)."""
        peak = self.peak_flops(dtype)
        if not peak or not self.bandwidth:
            return None
        return peak / self.bandwidth

    def known(self, dtype: str) -> bool:
        """Both ceilings of a roofline in ``dtype`` are known."""
        return self.ridge(dtype) is not None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Ceilings":
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})


def _committed_launch_cost() -> tuple[float | None, str]:
    """Host µs that one more kernel call costs, read from the committed H200 host-overhead result."""
    path = RESULTS / LAUNCH_COST_FILE
    try:
        rows = {r["op"]: r for r in json.loads(path.read_text())["rows"]}
        two, one = (float(rows[name]["host_us_per_call"]) for name in _LAUNCH_ROWS)
    except (OSError, KeyError, ValueError, TypeError):
        return None, CEILINGS("available_found_readable", name=LAUNCH_COST_FILE)
    return two - one, CEILINGS("benchmarks_results_minus_host", name=LAUNCH_COST_FILE, x=_LAUNCH_ROWS[0],
                               x2=f"{two:.1f}", x3=_LAUNCH_ROWS[1], x4=f"{one:.1f}")


def _h200() -> Ceilings:
    launch_us, launch_source = _committed_launch_cost()
    return Ceilings(
        device_name="NVIDIA H200",
        bandwidth=4155e9,
        flops={"bf16": 769e12, "fp16": 769e12, "fp32": 67e12},
        l2_bytes=60 * 10**6,
        launch_us=launch_us,
        sources={
            "bandwidth": ("measured: device copy 4155 GB/s (bytes read + written), "
                          "benchmarks/results/bench_kernels_add_layernorm_h200.json, 2026-11-30"),
            "bf16": ("measured: 8192³ bf16 matrix product through PyTorch, 769–798 TFLOP/s on random data "
                     "(this workplace's KINDS.md, 2026-11-04); the lower figure"),
            "fp16": "assumed equal to bf16 (the same tensor-core rate in the datasheet); not measured",
            "fp32": ("datasheet: 67 TFLOP/s plain FP32 (PyTorch's default for fp32 matrix products; cuDNN "
                     "convolutions use TF32 and can go faster); not measured"),
            "l2_bytes": "PyTorch's device properties on an H200 of this workplace: 60 MB (KINDS.md)",
            "launch_us": launch_source,
        },
        measured=False,
    )


#: Ceilings of named devices (``torch.cuda.get_device_properties(...).name``). The CPU has none.
KNOWN: dict[str, Any] = {"NVIDIA H200": _h200}


def known_ceilings(device_name: str | None) -> Ceilings:
    """The table's ceilings of ``device_name``; for a device the table lacks, an empty ``Ceilings``
    whose ``sources`` say that they are unknown (the CPU's always are)."""
    make = KNOWN.get(str(device_name or ""))
    if make is not None:
        return make()
    return Ceilings(device_name=str(device_name or "unknown device"),
                    sources={"all": "unknown: no entry for this device; measure them "
                                    "(explorer.runtime.ceilings.measure_ceilings)"})


# ------------------------------------------------------------------ measuring now

def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _median_seconds(fn, device: str, reps: int) -> float:
    times = []
    for _ in range(reps):
        _sync(device)
        t0 = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def measure_bandwidth(device: str, nbytes: int | None = None, reps: int = 10) -> float:
    """Bytes per second of a device-to-device copy (bytes read plus bytes written), median of ``reps``."""
    cuda = device.startswith("cuda")
    nbytes = nbytes or ((1 << 30) if cuda else (64 << 20))
    src = torch.randn(nbytes // 4, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)
    seconds = _median_seconds(lambda: dst.copy_(src), device, reps)
    return 2 * src.numel() * src.element_size() / seconds


def measure_matmul_rate(device: str, dtype: torch.dtype, n: int | None = None, reps: int = 10) -> float:
    """FLOP/s of an n×n×n matrix product in ``dtype`` on random data (2·n³ FLOP per product), median."""
    cuda = device.startswith("cuda")
    n = n or (8192 if cuda else 512)
    gen = torch.Generator(device="cpu").manual_seed(0)
    a = torch.randn(n, n, generator=gen).to(device=device, dtype=dtype)
    b = torch.randn(n, n, generator=gen).to(device=device, dtype=dtype)
    torch.mm(a, b)
    seconds = _median_seconds(lambda: torch.mm(a, b), device, reps)
    return 2.0 * n ** 3 / seconds


def measure_launch_cost(device: str, calls: int = 2000) -> float:
    """Host µs per call of one small kernel (``torch.relu_`` on 1024 elements), synchronised once at the end.

    On a GPU this is what a host-bound forward pays per launch; on the CPU it is
    the dispatch cost of one small ATen op (there is no kernel launch there).
    """
    x = torch.randn(1024, device=device)
    with torch.inference_mode():
        for _ in range(50):
            torch.relu_(x)
        _sync(device)
        t0 = time.perf_counter()
        for _ in range(calls):
            torch.relu_(x)
        _sync(device)
    return (time.perf_counter() - t0) / calls * 1e6


def measure_ceilings(device: str, dtypes: tuple[str, ...] = ("fp32",), quick: bool = False) -> Ceilings:
    """Ceilings measured now on ``device`` for each dtype of ``dtypes``, with a source line per figure.

    ``quick`` uses smaller sizes (for tests and the CPU); the L2 size comes from
    the device properties on CUDA and is unknown on the CPU.
    """
    from explorer.runtime.measure import torch_dtype

    cuda = device.startswith("cuda")
    name = torch.cuda.get_device_properties(torch.device(device)).name if cuda else "CPU"
    when = time.strftime("%Y-%m-%d", time.gmtime())
    size = None if not quick else ((256 << 20) if cuda else (16 << 20))
    bandwidth = measure_bandwidth(device, size, reps=5 if quick else 10)
    flops: dict[str, float] = {}
    sources: dict[str, str] = {"bandwidth": CEILINGS("measured_now_copy_mib", x=when,
                                                     n=(size or ((1 << 30) if cuda else (64 << 20))) >> 20)}
    for dt in dtypes:
        n = (2048 if cuda else 256) if quick else None
        try:
            flops[dt] = measure_matmul_rate(device, torch_dtype(dt), n, reps=5 if quick else 10)
            sources[dt] = CEILINGS("measured_now_matrix_product", x=when, n=n or (8192 if cuda else 512), x2=dt)
        except (RuntimeError, TypeError) as exc:  # e.g. a dtype the CPU has no matrix product for
            sources[dt] = CEILINGS("measured", x=str(exc).splitlines()[0][:120])
    l2 = None
    if cuda:
        l2 = int(getattr(torch.cuda.get_device_properties(torch.device(device)), "L2_cache_size", 0)) or None
        sources["l2_bytes"] = "the device properties (torch.cuda.get_device_properties)"
    else:
        sources["l2_bytes"] = CEILINGS("unknown_cpu")
    launch = measure_launch_cost(device, calls=500 if quick else 2000)
    sources["launch_us"] = CEILINGS("measured_now_host_time_2" if cuda else "measured_now_host_time", x=when)
    if not cuda:
        sources["note"] = ("CPU figures measured now on a machine that may be shared: noisy, and not what a "
                           "GPU would give")
    return Ceilings(device_name=name, bandwidth=bandwidth, flops=flops, l2_bytes=l2, launch_us=launch,
                    sources=sources, measured=True)
