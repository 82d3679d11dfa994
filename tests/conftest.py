"""Shared fixtures, and the suite's housekeeping that keeps ``make test`` inside a 2-core, 24 GiB machine.

- ``analyze_cached``: analyses of zoo models shared by every test and file that loads the same model,
  within a memory budget (``AnalysisCache``, 1 GB of tensors): the least recently used are dropped
  past it, so the session never holds every zoo model at once (it did: 13 GB resident, issue 26).
  ``detection_cached``: their graphs and detections (no weights), kept for the session.
- After a test that leaves the process 256 MB larger, a full garbage collection (an fx graph and its
  module refer to each other: without it a test's models stay until the collector's next full pass).
- After each test file: its module-level ``functools.lru_cache`` wrappers are cleared, the shared
  analyses trimmed to half their budget, torch.compile's state is reset, the garbage collector runs
  and glibc gives freed heap pages back to the system, so one file's models do not stay under the next.
- A line per file: which file ran, its tests, its time, the process's resident memory after it and its
  peak during it (the kernel's high-water mark, reset at each file's start), so a slow or heavy file
  shows where it is. ``FUSION_EXPLORER_SUITE_LOG=path`` also
  writes these as tab-separated rows (docs/test-suite.md's tables were made so).
- The browser tests' app (``app_url``) is started once per module that asks for it.
"""

from __future__ import annotations

import collections
import ctypes
import functools
import gc
import os
import re
import sys
import time

import pytest

#: Bytes of model tensors the analysis cache may hold across tests (``FUSION_EXPLORER_TEST_CACHE_MB``).
CACHE_BUDGET = int(os.environ.get("FUSION_EXPLORER_TEST_CACHE_MB", "1000")) * 2**20


def _tensor_bytes(analysis) -> int:
    """Bytes of the distinct storages of an analysis' module (parameters and buffers) and example inputs."""
    import torch

    model = analysis[0]
    tensors = [*model.module.parameters(), *model.module.buffers(),
               *(t for t in model.example_inputs if isinstance(t, torch.Tensor))]
    seen: dict[int, int] = {}
    for t in tensors:
        if t.device.type != "meta":
            storage = t.untyped_storage()
            seen[storage.data_ptr()] = storage.nbytes()
    return sum(seen.values())


class AnalysisCache:
    """``(model, graph, detection)`` of zoo models, least recently used dropped past ``budget`` bytes, and
    past half of it before a new model is built (its size is known only once it is).

    The entry just made stays even when it alone is over the budget (BERT-large is 1.3 GB): the tests
    after it on the same model share it until another model is analysed or its file ends. At each
    file's end the cache is trimmed to half its budget (``release_memory``): the small models stay
    shared across files, the large ones are made again where a later file needs them (seconds each).
    Each analysis' graph and detection (a few MB, no weights) are kept for the session: ``detected``.
    """

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self.entries: collections.OrderedDict[tuple, tuple[object, int]] = collections.OrderedDict()
        self.made = 0
        self.detections: dict[tuple, tuple] = {}

    def __call__(self, name: str, batch: int | None = None, seq_len: int | None = None):
        key = (name, batch, seq_len)
        if key in self.entries:
            self.entries.move_to_end(key)
            return self.entries[key][0]
        from explorer.fusion_engine import analyze

        self.trim(self.budget // 2)   # room for the new model while it is built (its size is not known yet)
        analysis = analyze(name, batch=batch, seq_len=seq_len)
        self.made += 1
        self.entries[key] = (analysis, _tensor_bytes(analysis))
        self.detections[key] = (analysis.graph, analysis.detection)
        self.trim(self.budget, keep=1)
        return analysis

    def trim(self, limit: int, keep: int = 0) -> None:
        """Drop the least recently used entries until they hold at most ``limit`` bytes (or ``keep`` are left)."""
        dropped = False
        while len(self.entries) > keep and sum(size for _, size in self.entries.values()) > limit:
            self.entries.popitem(last=False)
            dropped = True
        if dropped:
            gc.collect()   # an fx graph's nodes and the graph refer to each other: freed by the collector only

    def detected(self, name: str, batch: int | None = None, seq_len: int | None = None):
        """``(graph, detection)`` of a zoo model, from its analysis (made once for the session)."""
        key = (name, batch, seq_len)
        if key not in self.detections:
            self(name, batch, seq_len)
        return self.detections[key]

    def clear(self) -> None:
        self.entries.clear()


analyzed = AnalysisCache(CACHE_BUDGET)


@pytest.fixture(scope="session")
def analyze_cached():
    """``analyze_cached(name, batch=None, seq_len=None)`` -> the shared ``Analysis`` (``AnalysisCache``)."""
    return analyzed


@pytest.fixture(scope="session")
def detection_cached():
    """``detection_cached(name, batch=None, seq_len=None)`` -> ``(graph, detection)``, kept for the session
    (for tests that read what was detected and not the model's weights)."""
    return analyzed.detected


@pytest.fixture(scope="module")
def app_url():
    """The URL of ``streamlit run explorer/app.py`` (``browser_harness.running_app``), started once for
    the module and stopped after it; skips when no chromium or no Playwright can be found."""
    from browser_harness import CHROMIUM, running_app

    if CHROMIUM is None:
        pytest.skip("no chromium found")
    pytest.importorskip("playwright.sync_api")
    with running_app() as url:
        yield url


# --- housekeeping between files -------------------------------------------------------------------------

def _status_kb(field: str) -> int:
    """A ``/proc/self/status`` field in kB (0 where there is no /proc)."""
    try:
        with open("/proc/self/status") as f:
            match = re.search(rf"^{field}:\s+(\d+)", f.read(), re.M)
    except OSError:
        return 0
    return int(match.group(1)) if match else 0


def _reset_peak() -> None:
    """Reset the kernel's resident high-water mark (VmHWM) so the next reading is this file's peak."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


try:
    _trim = ctypes.CDLL("libc.so.6").malloc_trim
except (OSError, AttributeError):   # not glibc
    _trim = None


def release_memory(module=None) -> None:
    """Drop what a finished test file left behind: its module's lru caches, a shared analysis over the
    cache's budget, torch.compile's compiled code and guards, unreachable objects, and the heap pages
    glibc keeps after they are freed."""
    if module is not None:
        for value in list(vars(module).values()):
            mine = getattr(value, "__module__", None) == module.__name__
            if mine and isinstance(value, functools._lru_cache_wrapper):
                value.cache_clear()
    analyzed.trim(analyzed.budget // 2)   # files that load their own models run beside at most 0.5 GB of it
    if "torch._dynamo" in sys.modules:
        sys.modules["torch._dynamo"].reset()
    gc.collect()
    if _trim is not None:
        _trim(0)


#: A test that leaves the process this much larger (kB) is followed by a full collection.
GREW_KB = 256 * 1024


def _gb(kb: int) -> str:
    return f"{kb / 2**20:.2f} GB"


class _FileReport:
    """The line per test file, and the suite's rows for ``FUSION_EXPLORER_SUITE_LOG``."""

    def __init__(self, config) -> None:
        self.config = config
        self.start = time.monotonic()
        self.file_start = self.start
        self.outcomes: collections.Counter[str] = collections.Counter()
        self.files_done = 0
        self.files_total = 0
        self.peak_kb = 0
        self.current = None
        self.log = os.environ.get("FUSION_EXPLORER_SUITE_LOG")
        if self.log:
            with open(self.log, "w") as f:
                f.write("file\ttests\tseconds\trss_after_gb\tpeak_gb\tload1\n")

    def begin_file(self, path) -> None:
        self.current = path
        self.file_start = time.monotonic()
        self.outcomes.clear()
        _reset_peak()

    def end_file(self, path: str, module) -> None:
        seconds = time.monotonic() - self.file_start
        peak = _status_kb("VmHWM")
        release_memory(module)
        after = _status_kb("VmRSS")
        self.peak_kb = max(self.peak_kb, peak)
        self.files_done += 1
        load = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
        tests = ", ".join(f"{n} {k}" for k, n in sorted(self.outcomes.items()))
        elapsed = time.monotonic() - self.start
        line = (f"[{self.files_done}/{self.files_total}] {path}: {tests or 'no tests'} in {seconds:.1f} s "
                f"(suite {elapsed / 60:.1f} min); resident {_gb(after)} after, peak {_gb(peak)}; load {load:.1f}")
        reporter = self.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.ensure_newline()
            reporter.write_line(line)
        if self.log:
            with open(self.log, "a") as f:
                f.write(f"{path}\t{sum(self.outcomes.values())}\t{seconds:.1f}\t{after / 2**20:.2f}\t"
                        f"{peak / 2**20:.2f}\t{load:.1f}\n")


_report: _FileReport | None = None


def pytest_configure(config) -> None:
    global _report
    _report = _FileReport(config)


def pytest_collection_finish(session) -> None:
    if _report is not None:
        _report.files_total = len({item.path for item in session.items})


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    if _report is not None and item.path != _report.current:
        _report.begin_file(item.path)
    before = _status_kb("VmRSS")
    yield
    if _status_kb("VmRSS") - before > GREW_KB:   # a test's models and graphs (cycles) freed now, not at
        gc.collect()                              # the collector's next full pass, tests later
        if _trim is not None:
            _trim(0)
    # the module's fixtures are torn down by now when the next test is in another file (or there is none)
    if _report is not None and (nextitem is None or nextitem.path != item.path):
        _report.end_file(item.nodeid.split("::")[0], getattr(item, "module", None))


def pytest_runtest_logreport(report) -> None:
    if _report is None:
        return
    if report.when == "call" or (report.when == "setup" and not report.passed):
        _report.outcomes[report.outcome] += 1
    elif report.when == "teardown" and report.failed:
        _report.outcomes["error"] += 1


def pytest_terminal_summary(terminalreporter) -> None:
    if _report is not None and _report.files_done:
        terminalreporter.write_line(
            f"suite: {_report.files_done} files in {(time.monotonic() - _report.start) / 60:.1f} min; the pytest "
            f"process peaked at {_gb(_report.peak_kb)} resident; {analyzed.made} zoo analyses made")
