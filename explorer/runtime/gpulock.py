"""Processes taking turns on one device: an exclusive device section (an OS file lock) and the cores each side uses.

Several measuring processes may share one GPU when only one at a time does device work: each does what needs no
device (its start, the imports, building, capturing and planning the model) while another holds the device, and
takes the lock before its first device allocation. While a process holds it, no other process has device work in
flight: the others are before their first allocation, or past their last (their memory freed). The lock is
``fcntl.flock`` on a file named by the device (``lock_path``), so it ends with its process (a crash, a kill)
and serialises every process of this host that names the same device, whatever started them.

Host work of the waiting processes must not slow the holder's launch path either (a host-bound model's timing is
its host's): the holder runs on its own cores (the first half of the machine's, ``core_sets``), the waiting
processes on the rest. What still shares the host is memory bandwidth and the page cache.

``GpuLock`` is the section as a context manager (``benchmarks/bench_corpus.py`` uses it so); ``Section`` is the
same, for a process that takes the lock at one point of its work and releases it at another (the runner's child:
``explorer.gpu_runner``), configured by its parent through the environment (``LOCK_ENV``, ``CORES_ENV``). Each
records the seconds waited and held and the wall-clock interval held (``acquired_at``/``released_at``, Unix
seconds), taken inside the held interval, so that the intervals of processes that really took turns never
overlap.
"""

from __future__ import annotations

import hashlib
import os
import re
import tempfile
import time
from typing import Any

#: The lock file a measuring child takes before its first device allocation (unset: no lock, no pinning).
LOCK_ENV = "FUSION_EXPLORER_GPU_LOCK"
#: The holder's and the waiting processes' cores, as ``format_cores`` writes them: ``0-7|8-15``.
CORES_ENV = "FUSION_EXPLORER_GPU_CORES"


def core_sets(cores: set[int] | None = None, waiting: int | None = None) -> tuple[set[int], set[int]]:
    """(the lock holder's cores, the waiting processes' cores): the first half of ``cores`` (this process's CPUs)
    and the rest (both the same single core on a one-core machine). ``waiting``: that many cores for the waiting
    side instead of half (at most half), the holder keeping the rest (its compiles use them)."""
    ordered = sorted(cores if cores is not None else _affinity())
    half = max(1, len(ordered) // 2)
    keep = len(ordered) - min(half, max(1, waiting)) if waiting is not None and len(ordered) > 1 else half
    return set(ordered[:keep]), set(ordered[keep:] or ordered[:keep])


def _affinity() -> set[int]:
    try:
        return set(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return set(range(os.cpu_count() or 1))


def _ranges(cores: set[int]) -> str:
    out, run = [], []
    for c in sorted(cores):
        if run and c == run[-1] + 1:
            run.append(c)
            continue
        if run:
            out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
        run = [c]
    if run:
        out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
    return ",".join(out)


def format_cores(holder: set[int], waiting: set[int]) -> str:
    """``CORES_ENV``'s value: ``0-7|8-15``."""
    return f"{_ranges(holder)}|{_ranges(waiting)}"


def parse_cores(text: str) -> tuple[set[int], set[int]] | None:
    """``format_cores`` read back; None for anything else (then nothing is pinned)."""
    if not re.fullmatch(r"[0-9,\-]+\|[0-9,\-]+", text or ""):
        return None
    sides = []
    for part in text.split("|"):
        cores: set[int] = set()
        for item in part.split(","):
            lo, _, hi = item.partition("-")
            if not lo.isdigit() or (hi and not hi.isdigit()):
                return None
            cores.update(range(int(lo), int(hi or lo) + 1))
        sides.append(cores)
    return sides[0], sides[1]


def lock_path(device: str, folder: str | None = None) -> str:
    """The lock file of one device (a GPU's UUID or index as ``CUDA_VISIBLE_DEVICES`` names it, or "cpu") in
    ``folder`` (the system's temporary folder by default): every process of this host that names the device takes
    the same lock."""
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", str(device))[:80] or "device"
    digest = hashlib.sha256(str(device).encode()).hexdigest()[:8]
    return os.path.join(folder or tempfile.gettempdir(), f"fusion-explorer-device-{safe}-{digest}.lock")


def pin(cores: set[int] | None) -> None:
    """Run this process (and the children it starts from now on) on ``cores``; nothing where that is not possible."""
    if not cores:
        return
    try:
        os.sched_setaffinity(0, cores)
    except (AttributeError, OSError, ValueError):
        pass


def free_device() -> None:
    """What a holder's work left on the device, freed before its section ends (the next holder finds the memory
    free): a collection, then, where CUDA is in use, a synchronize and the caching allocator emptied. torch is
    imported here only (a parent that configures sections never imports it)."""
    import gc

    import torch

    gc.collect()
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


class Section:
    """The exclusive device section of one process (module docstring): ``acquire()`` blocks until the lock is
    free, then pins this process to the holder's cores; ``release()`` records the interval, gives the lock back and
    pins it to the waiting cores. ``path`` None: no lock (``record`` still says so: ``locked`` False)."""

    def __init__(self, path: str | None, holder: set[int] | None = None, waiting: set[int] | None = None) -> None:
        self.path, self.holder, self.waiting = path, holder, waiting
        self.fd: int | None = None
        self.record: dict[str, Any] = {}

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None) -> "Section | None":
        """The section the parent configured (``LOCK_ENV``, ``CORES_ENV``), or None when it asked for none."""
        env = os.environ if environ is None else environ
        path = env.get(LOCK_ENV)
        if not path:
            return None
        cores = parse_cores(env.get(CORES_ENV, ""))
        holder, waiting = cores if cores is not None else (None, None)
        return cls(path, holder, waiting)

    @property
    def held(self) -> bool:
        return "acquired_at" in self.record and "released_at" not in self.record

    def acquire(self) -> dict[str, Any]:
        import fcntl

        if self.held:
            return self.record
        t0 = time.time()
        if self.path:
            self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            fcntl.flock(self.fd, fcntl.LOCK_EX)
        now = time.time()
        self.record = dict(waited_s=round(now - t0, 3), wait_started_at=t0, acquired_at=now, locked=bool(self.path))
        pin(self.holder)
        return self.record

    def release(self) -> dict[str, Any]:
        import fcntl

        if not self.held:
            return self.record
        now = time.time()
        self.record.update(released_at=now, held_s=round(now - self.record["acquired_at"], 3))
        if self.fd is not None:
            fcntl.flock(self.fd, fcntl.LOCK_UN)
            os.close(self.fd)
            self.fd = None
        pin(self.waiting)
        return self.record


class GpuLock(Section):
    """``Section`` as a context manager: held for the ``with`` block (``path`` None: no lock)."""

    def __enter__(self) -> "GpuLock":
        self.acquire()
        return self

    def __exit__(self, *exc: Any) -> bool:
        self.release()
        return False
