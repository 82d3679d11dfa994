"""Shared fixtures, and the suite's housekeeping that keeps ``make test`` inside a 2-core, 24 GiB machine.

- ``analyze_cached``: analyses of zoo models shared by every test and file that loads the same model,
  within a memory budget (``AnalysisCache``, 1 GB of tensors): the least recently used are dropped
  past it, so the session never holds every zoo model at once (it did: 13 GB resident, issue 26).
  ``detection_cached``: their graphs and detections (no weights), kept for the session. Under
  pytest-xdist each worker has its own (a module-level object of the worker's process).
- After a test that leaves the process 256 MB larger, a full garbage collection (an fx graph and its
  module refer to each other: without it a test's models stay until the collector's next full pass).
- After each test file: its module-level ``functools.lru_cache`` wrappers are cleared, the shared
  analyses trimmed to half their budget, torch.compile's state is reset, the garbage collector runs
  and glibc gives freed heap pages back to the system, so one file's models do not stay under the next
  (in the process that ran the file: each worker keeps its own house).
- A line per file: which file ran (and on which worker), its tests, its time and CPU seconds, the
  process's resident memory after it and its peak during it (the kernel's high-water mark, reset at
  each file's start), and all the suite's processes together (sampled each second), so a slow or heavy
  file shows where it is. The worker measures, at the file's last teardown, and sends the numbers with
  that test's report; the controller (or the only process) prints the line and, with
  ``FUSION_EXPLORER_SUITE_LOG=path``, writes a tab-separated row (docs/test-suite.md's tables were made so).
- Under xdist (``make test``: ``-n 2 --dist loadfile``) the files are handed out longest first
  (``tests/file_seconds.tsv``) and the timing-sensitive ones last (``TIMING_FILES``).
- The browser tests' app (``app_url``) is started once per module that asks for it, on a free port.
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


def _worker_id(config) -> str:
    """``gw0``, ``gw1``... in a pytest-xdist worker; ``""`` in the controller or a run without workers."""
    return getattr(config, "workerinput", {}).get("workerid", "")


#: The key of the file's measurement in the ``user_properties`` of its last test's teardown report: the report
#: travels from an xdist worker to the controller, which prints the line (a worker's own output is not shown).
FILE_KEY = "fusion_explorer_file"

#: Seconds each file took in a recent run (``FUSION_EXPLORER_SUITE_LOG`` rows): under xdist the files are
#: handed to the workers longest first, so the two workers end together (a long file last leaves one core idle).
FILE_SECONDS = os.path.join(os.path.dirname(__file__), "file_seconds.tsv")

#: Files whose tests compare a run's time with its own estimate: handed out last, beside the suite's
#: lightest files, not beside a file that starts a dozen processes (``pytest_collection_modifyitems``).
TIMING_FILES = ("tests/test_waits.py",)


def _cpu_seconds() -> float:
    """CPU seconds (user and system) of this process and of the children it has waited for (theirs once they
    end: an app a module started counts at its module's end). Unlike the wall time it barely depends on how
    busy the machine is: what a file costs, and the suite's wall time on an idle machine, come from it."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


class _FileMeter:
    """Where the tests run (the only process, or each xdist worker): a file's time and the process's memory
    during it, measured at its last test's teardown, after the module's fixtures are gone."""

    def __init__(self, config) -> None:
        self.worker = _worker_id(config)
        self.current = None
        self.file_start = time.monotonic()
        self.file_start_epoch = time.time()
        self.file_start_cpu = _cpu_seconds()

    def begin(self, path) -> None:
        self.current = path
        self.file_start = time.monotonic()
        self.file_start_epoch = time.time()
        self.file_start_cpu = _cpu_seconds()
        _reset_peak()

    def end(self, module) -> dict:
        seconds = time.monotonic() - self.file_start
        peak = _status_kb("VmHWM")
        release_memory(module)
        return {"worker": self.worker, "seconds": round(seconds, 2), "peak_kb": peak,
                "cpu": round(_cpu_seconds() - self.file_start_cpu, 2),
                "after_kb": _status_kb("VmRSS"), "load": os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0,
                "started": self.file_start_epoch, "ended": time.time(), "analyses": analyzed.made}


def _tree_rss_kb(root: int) -> int:
    """Resident kB of ``root`` and every process below it (``/proc/<pid>/stat``), summed: the suite's
    processes together (pytest, its xdist workers, the apps and children they start). A page shared by a
    parent and its forked child counts once per process, so the sum is an upper bound."""
    parent: dict[int, int] = {}
    rss: dict[int, int] = {}
    page_kb = os.sysconf("SC_PAGE_SIZE") // 1024
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()   # after "pid (comm) ": state, ppid, ... rss is the 22nd
        parent[int(entry)] = int(fields[1])
        rss[int(entry)] = int(fields[21]) * page_kb
    children: dict[int, list[int]] = collections.defaultdict(list)
    for pid, ppid in parent.items():
        children[ppid].append(pid)
    total, todo = 0, [root]
    while todo:
        pid = todo.pop()
        total += rss.get(pid, 0)
        todo.extend(children.get(pid, ()))
    return total


class _TreeSampler:
    """Samples ``_tree_rss_kb`` of this process once a second in a thread: what the two workers and their
    children hold together, which ``/usr/bin/time -v`` (the largest process only) does not say."""

    def __init__(self, interval: float = 1.0) -> None:
        import threading

        self.samples: list[tuple[float, int]] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, args=(interval,), name="suite-rss", daemon=True)
        if os.path.isdir("/proc"):
            self.thread.start()

    def _run(self, interval: float) -> None:
        root = os.getpid()
        while not self.stop.is_set():
            try:
                self.samples.append((time.time(), _tree_rss_kb(root)))
            except (OSError, ValueError, IndexError):
                pass
            self.stop.wait(interval)

    def peak_kb(self, since: float = 0.0, until: float = float("inf")) -> int:
        """The largest sample from ``since`` to ``until`` (epoch seconds), else the last one before ``until``."""
        samples = list(self.samples)
        inside = [kb for t, kb in samples if since <= t <= until]
        before = [kb for t, kb in samples if t < since]
        return max(inside) if inside else (before[-1] if before else 0)


class _SuiteReport:
    """Where the results arrive (the only process, or the xdist controller): the line per test file, the
    suite's rows for ``FUSION_EXPLORER_SUITE_LOG`` and the summary at the end."""

    def __init__(self, config) -> None:
        self.config = config
        self.start = time.monotonic()
        self.start_epoch = time.time()
        self.outcomes: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
        self.files_done = 0
        self.files_total = 0
        self.worker_peak_kb: dict[str, int] = {}
        self.analyses: dict[str, int] = {}
        self.cpu = 0.0
        self.sampler = _TreeSampler()
        self.log = os.environ.get("FUSION_EXPLORER_SUITE_LOG")
        if self.log:
            with open(self.log, "w") as f:
                f.write("file\ttests\tseconds\trss_after_gb\tpeak_gb\tload1\tworker\tstart_s\ttree_peak_gb\tcpu_s\n")

    def record(self, report) -> None:
        path = report.nodeid.split("::")[0]
        counts = self.outcomes[path]
        if report.when == "call" or (report.when == "setup" and not report.passed):
            counts[report.outcome] += 1
        elif report.when == "teardown" and report.failed:
            counts["error"] += 1
        for key, data in getattr(report, "user_properties", ()):
            if key == FILE_KEY:
                self.end_file(path, data)

    def end_file(self, path: str, data: dict) -> None:
        counts = self.outcomes.pop(path, collections.Counter())
        self.files_done += 1
        worker = data["worker"]
        self.worker_peak_kb[worker] = max(self.worker_peak_kb.get(worker, 0), data["peak_kb"])
        self.analyses[worker] = data["analyses"]
        self.cpu += data["cpu"]
        tree = self.sampler.peak_kb(data["started"], data["ended"])
        tests = ", ".join(f"{n} {k}" for k, n in sorted(counts.items()))
        elapsed = time.monotonic() - self.start
        where = f" ({worker})" if worker else ""
        together = f"; all processes {_gb(tree)}" if tree else ""
        line = (f"[{self.files_done}/{self.files_total or '?'}] {path}{where}: {tests or 'no tests'} in "
                f"{data['seconds']:.1f} s, cpu {data['cpu']:.0f} s (suite {elapsed / 60:.1f} min); resident {_gb(data['after_kb'])} after, "
                f"peak {_gb(data['peak_kb'])}{together}; load {data['load']:.1f}")
        reporter = self.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.ensure_newline()
            reporter.write_line(line)
        if self.log:
            with open(self.log, "a") as f:
                f.write(f"{path}\t{sum(counts.values())}\t{data['seconds']:.1f}\t{data['after_kb'] / 2**20:.2f}\t"
                        f"{data['peak_kb'] / 2**20:.2f}\t{data['load']:.1f}\t{worker or '-'}\t"
                        f"{data['started'] - self.start_epoch:.0f}\t{tree / 2**20:.2f}\t{data['cpu']:.1f}\n")

    def summary(self) -> str:
        self.sampler.stop.set()
        workers = ", ".join(f"{w} {_gb(kb)}" for w, kb in sorted(self.worker_peak_kb.items()) if w)
        peaks = (f"the workers' processes peaked at {workers}" if workers else
                 f"the pytest process peaked at {_gb(max(self.worker_peak_kb.values(), default=0))}")
        tree = self.sampler.peak_kb()
        together = (f"; all its processes together at {_gb(tree)} (resident, summed each second)" if tree else "")
        return (f"suite: {self.files_done} files in {(time.monotonic() - self.start) / 60:.1f} min, "
                f"cpu {self.cpu / 60:.1f} min; {peaks} "
                f"resident{together}; {sum(self.analyses.values())} zoo analyses made")


_meter: _FileMeter | None = None
_suite: _SuiteReport | None = None
_LAST_IN_FILE = pytest.StashKey[bool]()


def pytest_configure(config) -> None:
    global _meter, _suite
    _meter = _FileMeter(config)
    if not _worker_id(config):
        _suite = _SuiteReport(config)


def _file_order(config) -> dict[str, float]:
    """``file -> seconds`` from ``FILE_SECONDS`` (a ``FUSION_EXPLORER_SUITE_LOG`` file): its ``cpu_s`` column
    where it has one (what a file costs, whatever the machine's load was), else ``seconds``; empty without one."""
    seconds: dict[str, float] = {}
    try:
        with open(FILE_SECONDS) as f:
            header, *rows = f.read().splitlines()
        column = header.split("\t").index("cpu_s" if "cpu_s" in header.split("\t") else "seconds")
        for row in rows:
            cells = row.split("\t")
            seconds[cells[0]] = seconds.get(cells[0], 0.0) + float(cells[column])
    except (OSError, ValueError, IndexError):
        return {}
    return seconds


def pytest_collection_modifyitems(session, config, items) -> None:
    """In an xdist worker, the files longest first (``FILE_SECONDS``; a file not in it counts as 20 s) and
    ``TIMING_FILES`` last; each file's tests keep their order. Every worker sorts alike, so their
    collections agree; with ``--dist loadfile --no-loadscope-reorder`` the controller hands files out in
    this order to whichever worker is free."""
    if not _worker_id(config):
        return
    seconds = _file_order(config)
    first_index: dict[str, int] = {}
    for i, item in enumerate(items):
        first_index.setdefault(item.nodeid.split("::")[0], i)

    def key(item):
        path = item.nodeid.split("::")[0]
        return (path in TIMING_FILES, -seconds.get(path, 20.0), first_index[path])

    items.sort(key=key)   # stable: a file's own tests stay in their order


def pytest_collection_finish(session) -> None:
    if _suite is not None and session.items:   # an xdist controller collects nothing (its workers do)
        _suite.files_total = len({item.nodeid.split("::")[0] for item in session.items})


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_node_collection_finished(node, ids) -> None:
    """The controller's count of files (it collects nothing itself: each worker does)."""
    if _suite is not None and not _suite.files_total:
        _suite.files_total = len({nodeid.split("::")[0] for nodeid in ids})


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    if _meter is not None and item.path != _meter.current:
        _meter.begin(item.path)
    # the module's fixtures are torn down in this item's teardown when the next test is in another file
    item.stash[_LAST_IN_FILE] = nextitem is None or nextitem.path != item.path
    before = _status_kb("VmRSS")
    yield
    if _status_kb("VmRSS") - before > GREW_KB:   # a test's models and graphs (cycles) freed now, not at
        gc.collect()                              # the collector's next full pass, tests later
        if _trim is not None:
            _trim(0)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    if call.when == "teardown" and _meter is not None and item.stash.get(_LAST_IN_FILE, False):
        report = outcome.get_result()
        data = _meter.end(getattr(item, "module", None))
        report.user_properties = [*report.user_properties, (FILE_KEY, data)]


def pytest_runtest_logreport(report) -> None:
    if _suite is not None:   # the controller (or the only process); a worker sends its reports there
        _suite.record(report)


def pytest_terminal_summary(terminalreporter) -> None:
    if _suite is not None and _suite.files_done:
        terminalreporter.write_line(_suite.summary())
