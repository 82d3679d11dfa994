"""Where a worker measures: its device, driver, clocks, library versions and the host's load, without importing torch.

``visible_gpus()`` lists the GPUs this process may use (``CUDA_VISIBLE_DEVICES`` when set, else every GPU
``nvidia-smi`` lists); ``probe(gpu)`` describes one worker's device (``gpu`` is its index or UUID as
``CUDA_VISIBLE_DEVICES`` names it, None on the CPU): name, UUID, driver, SM clock and its maximum, utilisation,
memory in use, the torch and Triton versions installed (package metadata, so the worker need not import them),
Python, host name and the load average. ``HostLoad`` samples ``/proc/stat`` so a point's record can say how busy
the host's CPUs were while it ran (another job on the machine skews plain-call timings).

``nvidia-smi`` ignores ``CUDA_VISIBLE_DEVICES``: a worker's row is found by its index or UUID. Every probe
answers, with None where something cannot be read; nothing here raises.
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import shutil
import subprocess
from typing import Any

_FIELDS = ("index", "uuid", "name", "driver_version", "clocks.sm", "clocks.max.sm", "utilization.gpu",
           "memory.used", "memory.total", "temperature.gpu", "power.draw")
_KEYS = ("gpu_index", "gpu_uuid", "device_name", "driver", "sm_clock_mhz", "sm_clock_max_mhz", "gpu_util_pct",
         "memory_used_mib", "memory_total_mib", "temperature_c", "power_w")


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def _number(text: str) -> float | int | str | None:
    text = text.strip()
    if not text or text.startswith("[") or text.lower() in ("n/a", "[n/a]"):
        return None
    try:
        value = float(text)
    except ValueError:
        return text
    return int(value) if value.is_integer() else value


def gpu_rows() -> list[dict[str, Any]]:
    """Every GPU ``nvidia-smi`` lists (all of the host's: it ignores ``CUDA_VISIBLE_DEVICES``); [] without it."""
    exe = shutil.which("nvidia-smi")
    if not exe:
        return []
    try:
        out = subprocess.run([exe, f"--query-gpu={','.join(_FIELDS)}", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=15)
    except (OSError, subprocess.SubprocessError):
        return []
    rows = []
    for line in out.stdout.strip().splitlines():
        values = [v.strip() for v in line.split(",")]
        if len(values) != len(_FIELDS):
            continue
        row = dict(zip(_KEYS, values))
        for key in _KEYS[4:]:
            row[key] = _number(row[key])
        row["gpu_index"] = _number(row["gpu_index"])
        rows.append(row)
    return rows


def visible_gpus() -> list[str]:
    """The GPUs this process may use, as ``CUDA_VISIBLE_DEVICES`` names them (indices or UUIDs); [] for none."""
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is not None:
        return [g.strip() for g in env.split(",") if g.strip() and g.strip() != "-1"]
    return [str(r["gpu_index"]) for r in gpu_rows()]


def _row_for(gpu: str, rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    for row in rows:
        if gpu == str(row.get("gpu_index")) or (row.get("gpu_uuid") and str(row["gpu_uuid"]).startswith(gpu)):
            return row
    return None


def probe(gpu: str | None) -> dict[str, Any]:
    """One worker's environment (module docstring): ``device_kind`` is "cuda" or "cpu"."""
    env: dict[str, Any] = {
        "torch": _version("torch"), "triton": _version("triton"), "python": platform.python_version(),
        "host": platform.node(), "host_cpus": os.cpu_count(), "load_avg_1m": _load_avg(), "pid": os.getpid(),
    }
    if gpu is None:
        cpu = platform.processor() or platform.machine()
        env.update(device_kind="cpu", device_name=f"CPU ({cpu})", driver=None, gpu_uuid=None, gpu_index=None)
        return env
    row = _row_for(str(gpu), gpu_rows())
    env["device_kind"] = "cuda"
    if row is None:
        env.update(device_name=None, driver=None, gpu_uuid=None, gpu_index=gpu,
                   note=f"GPU {gpu} is not listed by nvidia-smi")
        return env
    env.update(row)
    return env


def clocks(gpu: str | None) -> dict[str, Any]:
    """The clock, utilisation and memory of one GPU now (before and after a point); {} on the CPU."""
    if gpu is None:
        return {}
    row = _row_for(str(gpu), gpu_rows()) or {}
    return {k: row.get(k) for k in ("sm_clock_mhz", "sm_clock_max_mhz", "gpu_util_pct", "memory_used_mib",
                                    "temperature_c", "power_w")}


def _load_avg() -> float | None:
    try:
        return round(os.getloadavg()[0], 2)
    except (OSError, AttributeError):
        return None


class HostLoad:
    """The share of the host's CPU time that was busy between ``start()`` and ``stop()`` (``/proc/stat``; None
    elsewhere), and the load average at the end: how much else the host was doing while a point ran."""

    def __init__(self) -> None:
        self._start: tuple[int, int] | None = None

    @staticmethod
    def _sample() -> tuple[int, int] | None:
        try:
            with open("/proc/stat", encoding="ascii") as f:
                fields = [int(v) for v in f.readline().split()[1:]]
        except (OSError, ValueError):
            return None
        idle = fields[3] + (fields[4] if len(fields) > 4 else 0)   # idle + iowait
        return sum(fields), idle

    def start(self) -> None:
        self._start = self._sample()

    def stop(self) -> dict[str, Any]:
        end = self._sample()
        busy = None
        if self._start is not None and end is not None and end[0] > self._start[0]:
            total, idle = end[0] - self._start[0], end[1] - self._start[1]
            busy = round(1.0 - idle / total, 3)
        return {"host_cpu_busy": busy, "load_avg_1m": _load_avg()}
