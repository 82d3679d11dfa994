"""The run report, typed: what ``explorer.gpu_runner.run`` returns and everything else reads.

One schema, frozen dataclasses, a version, strict validation on load::

    Report
      model: ModelInfo              name, source, fingerprint, batch, inputs, sizes
      plan: PlanInfo                the plan measured (accepted chains, kernels, levers)
      settings, environment         how and where (device, driver, library versions, date)
      unfused, fused: Measurement   latency (median, p20-p80), throughput, memory, launches,
                                    bytes, precision against float64 (or why not)
      verdict: Verdict              fused against unfused: a statistical test over paired rounds
      chains: ChainResult...        each accepted chain timed alone, with its Verdict
      stages: Stage...              the staged table (original, Conv+BN, + epilogues, all)
      baselines: Baseline...        eager and torch.compile modes, each paired with its like
      failures: PhaseFailure...     a phase that failed (a fault, an out-of-memory, a compile failure):
                                    which, on which variant, why; the other phases' results stay
      host: HostLoad                the host's load while it measured, its cores, torch's threads
      notes                         what a reader must know (rotation, quick mode, upgrades)

The runner (``explorer.runtime.session``) builds it and computes every derived
fact once: each verdict (``explorer.stats.compare``), and for each chain what
limits it (``limited_by``: the host or the GPU). The command line, the app, the
plan helpers and the CSV export only read those fields: a chain is slower when
``chain.verdict.label == SLOWER``, nowhere else.

``Report.to_dict()`` gives plain JSON values; ``load(data_or_path, name)`` and
``Report.from_dict`` read one back, checking every field's type and range
(integers within 64 bits, floats within float range and finite but for the
errors of non-finite outputs, no negative count, size or time, a verdict label
of ``VERDICTS``), refusing unknown and missing fields, and raising
``ReportError`` with one line naming the file and the field. Size and nesting are bounded by ``explorer.jsonfile``.
Version 1 reports (an untyped dict, before this module) are upgraded on load
(``upgrade_v1``, each field's type checked before it is converted): their per-chain verdicts were the old spread rule, not a test,
and their verdicts say so.

Layer 0: no torch, no networkx.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import types
import typing
from pathlib import Path
from typing import Any, Union

from explorer.errors import ReportError
from explorer.jsonfile import parse_json, read_json_file
from explorer.terminal import visible

REPORT_VERSION = 2
READABLE_VERSIONS = (1, 2)
MAX_REPORT_BYTES = 50 * 2**20
#: The largest integer a report may hold (a 64-bit signed integer, as JSON readers elsewhere take it).
MAX_INT = 2**63 - 1

# Verdict labels: the one vocabulary of "faster / slower" in the project.
FASTER = "faster"
SLOWER = "slower"
SAME = "no significant difference"
NO_KERNEL = "no fused kernel here"
NOT_MEASURED = "not measured"
VERDICTS = (FASTER, SLOWER, SAME, NO_KERNEL, NOT_MEASURED)
#: How a verdict reads where its stored label would say too much (``Verdict.reading``; never stored): a
#: SAME whose rounds ran out before the test could tell, and a ratio with no paired samples behind it
#: (a version 1 report's whole model: its two medians, no test).
UNDECIDED = "undecided"
UNTESTED = "not tested"
READINGS = VERDICTS + (UNDECIDED, UNTESTED)
#: What the one speed-up of the project is (``Verdict.speedup``): said beside it wherever it is explained.
SPEEDUP_DEFINITION = ("speed-up = unfused time ÷ fused time over paired rounds: the Hodges-Lehmann estimate of the "
                      "signed-rank test, with the 95% interval of that same test (reports made before it: the median "
                      "of the per-round ratios with a bootstrap interval, as their verdict's method says)")

# What limits a chain that is slower: the host issuing calls, or the GPU itself.
HOST, GPU = "host", "gpu"
HOST_BOUND_BUSY = 0.8

#: A scalar JSON value (environment extras, settings).
Scalar = Union[str, int, float, bool, None]
Setting = Union[str, int, float, bool, None, tuple[str, ...]]


# ====================================================================== the schema

@dataclasses.dataclass(frozen=True)
class Latency:
    """Milliseconds per call: median, 20th and 80th percentiles, over ``reps`` timed calls."""

    median: float
    p20: float
    p80: float
    reps: int


@dataclasses.dataclass(frozen=True)
class Precision:
    """Errors of an output against a reference (float64 unless stated).

    ``max_rel`` = max|out-ref| / max|ref|; ``rel_l2`` = ||out-ref|| / ||ref||. When the
    reference is all zero, constant or denormal the relative figures are None and
    ``refused`` says why (they would be meaningless).
    """

    max_abs: float | None = None
    max_rel: float | None = None
    rel_l2: float | None = None
    cosine: float | None = None
    top1_agreement: float | None = None
    finite: bool | None = None
    refused: str | None = None


@dataclasses.dataclass(frozen=True)
class Measurement:
    """One way of running the whole model, measured (unfused, fused, a baseline, a stage).

    ``gpu_busy_ms`` is the summed duration of the kernels of one forward (CUDA
    profiler); ``bound`` compares it with the latency: ``HOST`` when the GPU is
    busy for less than ``HOST_BOUND_BUSY`` of the time (it waits for the host to
    issue calls), ``GPU`` otherwise; None on the CPU.
    """

    name: str
    latency: Latency | None = None
    throughput: float | None = None
    peak_memory_bytes: int | None = None
    activation_peak_bytes: int | None = None
    resident_bytes: int | None = None
    kernel_launches: int | None = None
    launches_kind: str = ""
    graph_launches: int | None = None
    bytes_moved: int | None = None
    precision: Precision | None = None
    gpu_busy_ms: float | None = None
    bound: str | None = None
    cuda_graph: bool = False
    note: str = ""
    memory_note: str = ""


#: What a verdict of the older statistic says where its bootstrap interval excludes 1 and its test did not reject.
OLDER_INTERVAL_NOTE = ("interval from the earlier bootstrap statistic, which can exclude 1 where the test does not "
                       "reject; the reading is the test's")


@dataclasses.dataclass(frozen=True)
class Verdict:
    """A candidate (the fused form) against a baseline, decided by a test over paired rounds.

    ``ratio`` is candidate time / baseline time over the paired rounds, the
    Hodges-Lehmann estimate of the Wilcoxon signed-rank test (``explorer.stats``;
    below 1: the candidate is faster; ``speedup`` = 1 / ratio), ``ci_low``-``ci_high``
    its 95% confidence interval from inverting that same test, ``p_value`` that
    test's (so the interval excludes 1 exactly when p < 0.05, but for a tie at an
    end), ``n`` the paired rounds, ``method`` the statistic's name (a report made
    before that statistic records the median ratio and its bootstrap interval there),
    ``rounds_needed`` how many the observed spread needs for 80% power at
    ``min_effect``. ``label`` is one of ``VERDICTS``; ``decided`` is False when
    the rounds ran out before the test could tell (then the label is ``SAME``).
    """

    label: str
    ratio: float | None = None
    ci_low: float | None = None
    ci_high: float | None = None
    p_value: float | None = None
    n: int = 0
    rounds_needed: int | None = None
    min_effect: float = 0.03
    decided: bool = False
    basis: str = ""
    method: str = ""
    note: str = ""

    @property
    def speedup(self) -> float | None:
        """THE speed-up (``SPEEDUP_DEFINITION``): 1 / ``ratio``, the Hodges-Lehmann estimate of the paired
        per-round ratios unfused ÷ fused; ``interval`` is its 95% interval (the same signed-rank test's).
        None where nothing was timed."""
        return 1.0 / self.ratio if self.ratio else None

    @property
    def tested(self) -> bool:
        """Whether a paired test stands behind the ratio (an interval from paired rounds)."""
        return self.n > 0 and self.ci_low is not None and self.ci_high is not None

    @property
    def interval(self) -> tuple[float, float] | None:
        """The 95% interval of ``speedup`` (low, high), or None where untested."""
        if not self.tested or not self.ci_low or not self.ci_high:
            return None
        return 1.0 / self.ci_high, 1.0 / self.ci_low

    @property
    def reading(self) -> str:
        """The word to show (one of ``READINGS``): the label, but ``UNDECIDED`` for a SAME the test could not
        decide, and ``UNTESTED`` for a ratio measured without a paired test (never "not measured" beside a
        number)."""
        if self.label == SAME and not self.decided:
            return UNDECIDED
        if self.label == NOT_MEASURED and self.ratio is not None:
            return UNTESTED
        return self.label

    def describe(self) -> str:
        """One line: ``slower: 0.91x (95% CI 0.88-0.94x), p=0.001, 60 rounds``."""
        word = self.reading
        if self.ratio is None:
            return word + (f" ({self.note})" if self.note else "")
        if not self.tested:
            return f"{word}: {self.speedup:.2f}x, no paired test ({self.method or self.note})"
        lo, hi = self.interval or (None, None)
        p = f", p={self.p_value:.2g}" if self.p_value is not None else ""
        line = f"{word}: {self.speedup:.2f}x (95% CI {lo:.2f}-{hi:.2f}x){p}, {self.n} rounds"
        if self.older_interval_disagrees:
            return f"{line} ({OLDER_INTERVAL_NOTE})"
        return f"{line} ({self.note})" if self.significant_but_same else line

    @property
    def older_interval_disagrees(self) -> bool:
        """A verdict stored by the statistic before the Hodges-Lehmann one (its ``method`` names a bootstrap
        interval) whose interval excludes 1 although its test did not reject: that older interval and test were
        two statistics and could disagree; the reading is the test's, and wherever the interval is shown a note
        says so (a report keeps its medians, not its rounds, so the verdict cannot be recomputed)."""
        lo, hi = self.interval or (None, None)
        return (self.tested and self.label == SAME and "bootstrap" in (self.method or "") and lo is not None
                and hi is not None and (lo > 1 or hi < 1) and not self.significant_but_same)

    @property
    def significant_but_same(self) -> bool:
        """A "no significant difference" whose test rejected (p under the test's 0.05, ``explorer.stats.ALPHA``):
        the difference is under the minimum effect, which its note says wherever the p-value is shown."""
        return self.label == SAME and self.p_value is not None and self.p_value < 0.05 and bool(self.note)


@dataclasses.dataclass(frozen=True)
class ChainResult:
    """One accepted chain, timed alone on its real shapes, unfused against fused.

    ``verdict`` is THE decision (on ``verdict.basis``: CUDA-graph replays when the
    plan replays graphs, else synchronised calls); ``plain`` and ``graph`` are the
    two timings' own verdicts where measured. ``fused_kernel`` False means the
    "fused" form runs the same ops on this device: its verdict is ``NO_KERNEL``,
    never slower. ``limited_by`` says what makes a slower chain slower: ``HOST``
    (slower as plain calls only) or ``GPU`` (slower even as CUDA graphs).
    """

    id: str
    title: str
    pattern: str
    status: str
    reason: str
    implementation: str
    kernel: str
    fused_kernel: bool
    verdict: Verdict
    bytes_unfused: int | None = None
    bytes_fused: int | None = None
    graph_launches_saved: int = 0
    launches_unfused: int | None = None
    launches_fused: int | None = None
    launches_kind: str = ""
    unfused: Latency | None = None
    fused: Latency | None = None
    unfused_graph: Latency | None = None
    fused_graph: Latency | None = None
    plain: Verdict | None = None
    graph: Verdict | None = None
    limited_by: str | None = None
    max_abs: float | None = None
    rel_err: float | None = None
    rel_err_unfused: float | None = None
    rotation: str = ""

    @property
    def speedup(self) -> float | None:
        """THE chain's speed-up: its decisive verdict's (``verdict.speedup``, on ``verdict.basis``), the
        statistic its interval (``verdict.interval``) and its label are about; None where not timed.
        Never the ratio of the two medians (``unfused.median / fused.median``), which a busy host can
        put far outside that interval."""
        return self.verdict.speedup

    @property
    def graph_speedup(self) -> float | None:
        """The speed-up as CUDA-graph replays (``graph``'s; None where not measured)."""
        return self.graph.speedup if self.graph is not None else None

    @property
    def slower(self) -> bool:
        return self.verdict.label == SLOWER


@dataclasses.dataclass(frozen=True)
class Stage:
    """One row of the staged table: the model with fusion applied up to ``stage``.

    ``differs`` says how its graph differs from the previous stage's (the test
    checks it); a stage whose graph is identical to an earlier one is not timed
    again: ``same_as`` names that stage and ``latency`` is None.
    """

    stage: str
    label: str
    differs: str
    graph_ops: int
    fused_calls: int
    batch_norms: int
    chains_fused: int
    chains_folded: int
    same_as: str | None = None
    latency: Latency | None = None
    throughput: float | None = None
    peak_memory_bytes: int | None = None
    activation_peak_bytes: int | None = None


@dataclasses.dataclass(frozen=True)
class Baseline:
    """A way of running the model timed in the same alternated rounds as the fused model.

    ``method`` is eager | torch.compile | fused; ``mode`` the torch.compile mode;
    every entry uses the plan's memory format. ``pairs_with`` names the fused entry
    it is fairly compared with (CUDA graphs against CUDA graphs, i.e. fused +
    CUDA graphs against ``reduce-overhead``), and ``verdict`` is that fused entry
    against this one (``FASTER``: the fused model is faster).
    """

    name: str
    label: str
    method: str
    mode: str | None
    cuda_graphs: bool
    memory_format: str
    measurement: Measurement | None = None
    compile_s: float | None = None
    pairs_with: str | None = None
    verdict: Verdict | None = None
    error: str | None = None


#: The phases of a run, in order (``explorer.runtime.session``): the float64 reference and the precision
#: figures, the main unfused/fused timing, the per-chain timing, the staged table, the baselines.
PHASES = ("reference", "main", "chains", "stages", "baselines")


@dataclasses.dataclass(frozen=True)
class PhaseFailure:
    """A phase of the run that failed (or was not run), and why, in one line.

    The report keeps everything the other phases measured. ``variant`` names the
    variant that was running when it failed, where one was (``fused``,
    ``torch_compile``, a chain id). ``process_lost`` is True when the failure ended
    the measuring process or left its CUDA context unusable (a CUDA fault): the
    phases after it ran in a fresh process (``fresh_process`` on their side) or,
    in an in-process run, were not run (``not_run``).
    """

    phase: str
    reason: str
    variant: str | None = None
    process_lost: bool = False
    not_run: bool = False


@dataclasses.dataclass(frozen=True)
class InputInfo:
    """One model input as measured."""

    name: str
    shape: tuple[int, ...]
    dtype: str


@dataclasses.dataclass(frozen=True)
class ModelInfo:
    """The model measured: its name, where it came from, its graph fingerprint and sizes."""

    name: str
    source: str
    fingerprint: str
    batch: int | None = None
    seq_len: int | None = None
    path: str | None = None
    task: str = ""
    description: str = ""
    inputs: tuple[InputInfo, ...] = ()
    chains_detected: int = 0
    ops: int = 0
    params: int = 0
    flops: int = 0


@dataclasses.dataclass(frozen=True)
class PlanInfo:
    """The plan measured: the fields of a fusion plan, declared here once (``explorer.fusions.plan.Plan``
    extends this class with its checks and its JSON form)."""

    model: str
    fingerprint: str
    accepted: tuple[str, ...] = ()
    kernels: dict[str, str] = dataclasses.field(default_factory=dict)
    memory_format: str = "nchw"
    cuda_graphs: bool = False
    version: int = 1


@dataclasses.dataclass(frozen=True)
class Environment:
    """Where the numbers come from; ``extra`` holds the rest (clocks, TF32 switches, host)."""

    device: str
    device_name: str | None
    is_cpu: bool
    note: str = ""
    started_utc: str = ""
    torch: str | None = None
    triton: str | None = None
    cuda: str | None = None
    cudnn: int | None = None
    driver: str | None = None
    python: str | None = None
    extra: dict[str, Scalar] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class HostLoad:
    """How busy the host was while the run measured. ``load_1min``: ``os.getloadavg()``'s 1-minute average
    sampled at the start, after each phase and at the end; ``cores``: the CPUs this process may use;
    ``torch_threads``: torch's intra-op threads in the measuring process (``threads_set``: by the user's
    setting, not the default); ``busy``: the highest sample was above the cores, so other work shared the
    CPU and the times are slower and noisier than on an idle host."""

    cores: int
    torch_threads: int
    load_1min: tuple[float, ...] = ()
    busy: bool = False
    threads_set: bool = False

    @property
    def peak(self) -> float | None:
        return max(self.load_1min) if self.load_1min else None

    def warning(self) -> str:
        """The one line the report's notes, the command line and the app say when the host was busy ("")."""
        if not self.busy or self.peak is None:
            return ""
        return (f"the host was busy while this run measured: 1-minute load average up to {self.peak:.1f} on "
                f"{self.cores} core(s); other work shared the CPU, so times are slower and noisier than on an idle "
                "host")


@dataclasses.dataclass(frozen=True)
class Report:
    """A whole run: see the module docstring."""

    model: ModelInfo
    plan: PlanInfo
    environment: Environment
    unfused: Measurement
    fused: Measurement
    verdict: Verdict
    settings: dict[str, Setting] = dataclasses.field(default_factory=dict)
    fused_vs_unfused: Precision | None = None
    reference: str = ""
    fused_worse: bool | None = None
    chains: tuple[ChainResult, ...] = ()
    stages: tuple[Stage, ...] = ()
    baselines: tuple[Baseline, ...] = ()
    notes: tuple[str, ...] = ()
    precision_note: str = ""
    bytes_note: str = ""
    graph_calls_note: str = ""
    rotation_note: str = ""
    duration_s: float | None = None
    failures: tuple[PhaseFailure, ...] = ()
    fresh_processes: int = 0
    host: HostLoad | None = None
    upgraded_from: int | None = None
    version: int = REPORT_VERSION

    # ------------------------------------------------------------ reading the stored facts

    @property
    def speedup(self) -> float | None:
        """THE whole-model speed-up: the verdict's (``Verdict.speedup``: the Hodges-Lehmann estimate of the
        paired per-round ratios, with ``verdict.interval``); None where the main phase did not run."""
        return self.verdict.speedup

    @property
    def is_cpu(self) -> bool:
        return self.environment.is_cpu

    def chain(self, chain_id: str) -> ChainResult:
        for c in self.chains:
            if c.id == chain_id:
                return c
        raise KeyError(chain_id)

    def chain_ids(self, label: str) -> list[str]:
        """Ids of the chains whose verdict is ``label`` (one of ``VERDICTS``)."""
        return [c.id for c in self.chains if c.verdict.label == label]

    @property
    def slower_chains(self) -> list[str]:
        return self.chain_ids(SLOWER)

    def limited_by(self, what: str) -> list[str]:
        """Ids of slower chains limited by ``HOST`` or ``GPU``."""
        return [c.id for c in self.chains if c.limited_by == what]

    def verdict_counts(self) -> dict[str, int]:
        """How many chains got each verdict, every label listed."""
        return {label: len(self.chain_ids(label)) for label in VERDICTS}

    def baseline(self, name: str) -> Baseline | None:
        return next((b for b in self.baselines if b.name == name), None)

    def failure(self, phase: str) -> PhaseFailure | None:
        """The failure of ``phase`` (one of ``PHASES``), or None when it ran."""
        return next((f for f in self.failures if f.phase == phase), None)

    def check_model(self, fingerprint: str, model: str = "") -> None:
        """Raise a one-line ``ReportError`` when this report was measured on another model."""
        if self.model.fingerprint != fingerprint:
            mine = f"'{model}' " if model else ""
            raise ReportError(f"this report was measured on model '{self.model.name}' (graph "
                              f"{self.model.fingerprint}), not on the model {mine}loaded here (graph {fingerprint})")

    # ------------------------------------------------------------ (de)serialising

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON values (tuples become lists); ``from_dict`` reads it back."""
        return _plain(dataclasses.asdict(self))

    def to_json(self, indent: int | None = 1) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    @classmethod
    def from_dict(cls, data: Any, name: str = "report") -> "Report":
        """Validate and build; version 1 is upgraded first. Raises ``ReportError`` (one line)."""
        if not isinstance(data, dict):
            raise ReportError(f"{name} is not a run report: it holds a JSON {_json_type(data)}, not an object")
        version = data.get("version")
        if isinstance(version, bool) or not isinstance(version, int):
            raise ReportError(f"{name} is not a run report: no integer 'version'")
        if version not in READABLE_VERSIONS:
            raise ReportError(f"{name}: report version {version} is not supported "
                              f"(this explorer reads versions {', '.join(map(str, READABLE_VERSIONS))})")
        if version == 1:
            data = upgrade_v1(data, name)
        try:
            return _build(cls, data, "")
        except _Invalid as bad:
            raise ReportError(f"{name} is not a valid run report: {bad}") from None


def load(source: bytes | str | os.PathLike, name: str | None = None) -> Report:
    """A report from JSON bytes/text or a file path; raises ``ReportError`` (one line).

    ``bytes`` and ``str`` are JSON text (``name`` names it in messages); a
    ``Path`` is read with ``explorer.jsonfile`` (regular files only, bounded size and depth).
    """
    if isinstance(source, (bytes, str)):
        what = name or "report"
        data = parse_json(source, what, ReportError, max_bytes=MAX_REPORT_BYTES, allow_nan=True)
    else:
        what = name or str(source)
        data = read_json_file(source, what, ReportError, max_bytes=MAX_REPORT_BYTES, allow_nan=True)
    return Report.from_dict(data, what)


def save(report: Report, path: str | os.PathLike) -> None:
    """Write the report's JSON to ``path``."""
    Path(path).write_text(report.to_json())


# ====================================================================== strict validation

class _Invalid(Exception):
    """A field that does not match the schema: the message names its path."""


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    return {bool: "boolean", int: "number", float: "number", str: "string", list: "list",
            dict: "object"}.get(type(value), type(value).__name__)


def _describe(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        return " or ".join(_describe(a) for a in typing.get_args(tp))
    if tp is type(None):
        return "null"
    if origin is tuple:
        return "a list"
    if origin is dict:
        return "an object"
    if dataclasses.is_dataclass(tp):
        return "an object"
    return {int: "an integer", float: "a number", str: "a string", bool: "true or false"}.get(tp, str(tp))


_HINTS: dict[type, dict[str, Any]] = {}


def _hints(cls: type) -> dict[str, Any]:
    if cls not in _HINTS:
        _HINTS[cls] = typing.get_type_hints(cls)
    return _HINTS[cls]


def _build(cls: type, data: Any, path: str) -> Any:
    if not isinstance(data, dict):
        raise _Invalid(f"'{path or cls.__name__}' must be an object, got {_json_type(data)}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise _Invalid(f"unknown field '{_join(path, unknown[0])}'")
    hints = _hints(cls)
    values = {}
    for fname, f in fields.items():
        where = _join(path, fname)
        if fname not in data:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise _Invalid(f"missing field '{where}'")
            continue
        values[fname] = _in_range(cls, fname, _check(data[fname], hints[fname], where), where)
    return cls(**values)


#: Fields whose numbers (every item, for a shape) are never negative, by class and field name;
#: ``None`` for every class.
_NON_NEGATIVE = {
    None: {"median", "p20", "p80", "reps", "throughput", "peak_memory_bytes", "activation_peak_bytes",
           "resident_bytes", "kernel_launches", "graph_launches", "bytes_moved", "gpu_busy_ms", "n",
           "rounds_needed", "min_effect", "bytes_unfused", "bytes_fused", "launches_unfused", "launches_fused",
           "graph_ops", "fused_calls", "batch_norms", "chains_fused", "chains_folded", "compile_s", "shape",
           "batch", "seq_len", "chains_detected", "ops", "params", "flops", "cudnn", "duration_s", "version",
           "upgraded_from"},
    Verdict: {"ratio", "ci_low", "ci_high", "p_value"},
    HostLoad: {"cores", "torch_threads", "load_1min"},
}
#: Float fields that may hold NaN or infinity (errors of outputs that were not finite); every
#: other float is finite.
_MAY_BE_NON_FINITE = {Precision: {"max_abs", "max_rel", "rel_l2", "cosine", "top1_agreement"},
                      ChainResult: {"max_abs", "rel_err", "rel_err_unfused"}}
#: Text fields that hold one word of a fixed vocabulary.
_ONE_OF = {(Verdict, "label"): VERDICTS, (ChainResult, "limited_by"): (HOST, GPU, None),
           (Measurement, "bound"): (HOST, GPU, None)}


def _in_range(cls: type, fname: str, value: Any, where: str) -> Any:
    """``value`` of field ``cls.fname`` when it is in the field's range; raises ``_Invalid`` otherwise:
    finite floats (but errors of non-finite outputs), no negative counts, sizes or times, a positive
    median latency, a p-value within 0-1, a verdict label of ``VERDICTS``."""
    numbers = value if isinstance(value, tuple) else (value,)
    for number in numbers:
        if isinstance(number, float) and not math.isfinite(number) \
                and fname not in _MAY_BE_NON_FINITE.get(cls, ()):
            raise _Invalid(f"'{where}' must be a finite number, got {number}")
        if isinstance(number, (int, float)) and not isinstance(number, bool) and number < 0 \
                and (fname in _NON_NEGATIVE[None] or fname in _NON_NEGATIVE.get(cls, ())):
            raise _Invalid(f"'{where}' must not be negative, got {number:.6g}")
    if cls is Latency and fname == "median" and not value > 0:  # readers divide by it
        raise _Invalid(f"'{where}' must be a positive time, got {value:.6g}")
    if cls is Verdict and fname == "p_value" and value is not None and value > 1:
        raise _Invalid(f"'{where}' must be a probability (0 to 1), got {value:.6g}")
    allowed = _ONE_OF.get((cls, fname))
    if allowed is not None and value not in allowed:
        words = ", ".join(repr(a) if a is not None else "null" for a in allowed)
        raise _Invalid(f"'{where}' must be one of {words}, got {str(value)[:60]!r}")
    return value


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


def _check(value: Any, tp: Any, path: str) -> Any:
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None:
            if type(None) in args:
                return None
            raise _Invalid(f"'{path}' must be {_describe(tp)}, got null")
        real = [a for a in args if a is not type(None)]
        if len(real) == 1:  # Optional[X]: X's own message names the deepest bad field
            return _check(value, real[0], path)
        for arg in real:
            try:
                return _check(value, arg, path)
            except _Invalid:
                continue
        raise _Invalid(f"'{path}' must be {_describe(tp)}, got {_json_type(value)}")
    if tp is type(None):
        if value is None:
            return None
    elif tp is bool:
        if isinstance(value, bool):
            return value
    elif tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            if not -MAX_INT <= value <= MAX_INT:
                raise _Invalid(f"'{path}' must be an integer of at most {len(str(MAX_INT))} digits")
            return value
    elif tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            try:
                return float(value)
            except OverflowError:
                raise _Invalid(f"'{path}' must be a number of float range, got an integer of "
                               f"{len(str(abs(value)))} digits") from None
    elif tp is str:
        if isinstance(value, str):
            return value
    elif origin is tuple:
        if isinstance(value, list):
            (item,) = [a for a in typing.get_args(tp) if a is not Ellipsis]
            return tuple(_check(v, item, f"{path}[{i}]") for i, v in enumerate(value))
    elif origin is dict:
        if isinstance(value, dict):
            _key, item = typing.get_args(tp)
            return {str(k): _check(v, item, f"{path}.{k}") for k, v in value.items()}
    elif dataclasses.is_dataclass(tp):
        return _build(tp, value, path)
    raise _Invalid(f"'{path}' must be {_describe(tp)}, got {_json_type(value)}")


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


# ====================================================================== version 1

V1_RULE = "version 1 rule: fused p20 above unfused p80 (a spread rule, no statistical test)"


class _V1:
    """Typed reads of a version-1 dict: each returns the value when it has the expected type (None
    when absent or null) and raises ``ReportError`` (one line naming the file and the field)
    otherwise, so that nothing is converted (``int``, ``float``, a comparison) that was not checked."""

    def __init__(self, name: str) -> None:
        self.name = name

    def bad(self, where: str, expected: str, value: Any) -> ReportError:
        return ReportError(f"{self.name} is not a valid run report (version 1): '{where}' must be {expected}, "
                           f"got {_json_type(value)}")

    def obj(self, d: dict, key: str, where: str) -> dict | None:
        value = d.get(key)
        if value is None or isinstance(value, dict):
            return value
        raise self.bad(where, "an object", value)

    def items(self, d: dict, key: str, where: str) -> list:
        value = d.get(key)
        if value is None:
            return []
        if isinstance(value, list):
            return value
        raise self.bad(where, "a list", value)

    def num(self, d: dict, key: str, where: str, minimum: float | None = None) -> float | None:
        value = d.get(key)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise self.bad(where, "a number", value)
        try:
            number = float(value)
        except OverflowError:
            raise self.bad(where, "a number of float range", value) from None
        if minimum is not None and not number >= minimum:  # NaN fails too
            raise self.bad(where, f"a number of at least {minimum:g}", value)
        return number

    def int_(self, d: dict, key: str, where: str) -> int | None:
        value = d.get(key)
        if value is None:
            return None
        if isinstance(value, float) and math.isfinite(value) and value.is_integer():
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_INT:
            raise self.bad(where, f"an integer from 0 to {MAX_INT}", value)
        return value

    def text(self, d: dict, key: str, where: str) -> str | None:
        value = d.get(key)
        if value is None or isinstance(value, str):
            return value
        raise self.bad(where, "a string", value)

    def flag(self, d: dict, key: str, where: str) -> bool | None:
        value = d.get(key)
        if value is None or isinstance(value, bool):
            return value
        raise self.bad(where, "true or false", value)


def upgrade_v1(data: dict, name: str = "report") -> dict:
    """A version-1 report (the untyped dict the runner wrote before this module) as a version-2 dict.

    Numbers are carried over as they are, each read with its type checked first
    (``_V1``: a number where a number is read, an integer in range where an
    integer is, an object or a list where one is); the result is then validated
    as any version-2 report. What version 1 did not record is left empty (chain
    titles fall back to ids; whether a chain had a fused kernel is taken from its
    status). Its per-chain verdicts came from a spread rule, not a test: they are
    carried over with ``method = V1_RULE`` and no p-value, and a note says so.
    Raises ``ReportError`` (one line) for a field of the wrong type, or when the
    dict lacks what every version-1 report has.
    """
    v = _V1(name)
    for key in ("unfused", "fused"):
        part = v.obj(data, key, key)
        if part is None:
            raise v.bad(key, "an object", None)
        if not isinstance(part.get("latency_ms"), dict):
            raise ReportError(f"{name} is not a run report: no '{key}' object with latency_ms")
    for key, kind in (("chains", list), ("stages", list), ("environment", dict), ("plan", dict),
                      ("model", dict)):
        if data.get(key) is not None and not isinstance(data[key], kind):
            raise ReportError(f"{name} is not a run report: '{key}' is not a {kind.__name__}")
    model = v.obj(data, "model", "model") or {}
    plan = v.obj(data, "plan", "plan") or {}
    env = v.obj(data, "environment", "environment") or {}
    reference = v.obj(data, "reference", "reference") or {}
    settings = v.obj(data, "settings", "settings") or {}
    graphs = bool(v.flag(plan, "cuda_graphs", "plan.cuda_graphs"))
    known_env = {f.name for f in dataclasses.fields(Environment)} - {"extra"}
    environment = {k: env.get(k) for k in known_env if k in env}
    environment["device"] = v.text(env, "device", "environment.device") or "?"
    environment.setdefault("device_name", None)
    environment["is_cpu"] = bool(v.flag(env, "is_cpu", "environment.is_cpu"))
    if environment.get("cudnn") is not None and (isinstance(environment["cudnn"], bool)
                                                 or not isinstance(environment["cudnn"], int)):
        environment["cudnn"] = None
    environment["extra"] = {k: val for k, val in env.items() if k not in known_env
                            and (val is None or isinstance(val, (str, int, float, bool)))}
    unfused, fused = data["unfused"], data["fused"]
    chains = [_v1_chain(v, c, graphs, f"chains[{i}]")
              for i, c in enumerate(v.items(data, "chains", "chains")) if isinstance(c, dict)]
    notes = [v.text({"n": n}, "n", f"notes[{i}]") or "" for i, n in enumerate(v.items(data, "notes", "notes"))]
    notes.append("Upgraded from report version 1: per-chain verdicts are the old spread rule (fused p20 above "
                 "unfused p80), not a statistical test; re-measure for tested verdicts.")
    model_info = {k: model.get(k) for k in ("name", "source", "fingerprint", "batch", "seq_len", "path",
                                            "task", "description", "chains_detected", "ops", "params", "flops")
                  if k in model}
    model_info.setdefault("name", v.text(plan, "model", "plan.model") or "?")
    model_info.setdefault("source", "?")
    model_info.setdefault("fingerprint", v.text(plan, "fingerprint", "plan.fingerprint") or "")
    model_info["inputs"] = [i for i in v.items(model, "inputs", "model.inputs") if isinstance(i, dict)]
    stages = [_v1_stage(v, s, f"stages[{i}]") for i, s in enumerate(v.items(data, "stages", "stages"))
              if isinstance(s, dict)]
    for i, s in enumerate(v.items(data, "stages_skipped", "stages_skipped")):
        if not isinstance(s, dict):
            continue
        where = f"stages_skipped[{i}]"
        stage = v.text(s, "stage", f"{where}.stage") or "?"
        stages.append({"stage": stage, "label": v.text(s, "label", f"{where}.label") or stage,
                       "differs": f"not timed in version 1: {v.text(s, 'reason', f'{where}.reason') or ''}",
                       "graph_ops": 0, "fused_calls": 0, "batch_norms": 0, "chains_fused": 0, "chains_folded": 0})
    order = {"none": 0, "conv_bn": 1, "activation": 2, "all": 3}
    stages.sort(key=lambda s: order.get(s["stage"], 9))
    speedup = v.num(data, "speedup", "speedup", minimum=0.0)
    ratio = 1.0 / speedup if speedup else None
    return {
        "version": REPORT_VERSION, "upgraded_from": 1,
        "model": model_info, "plan": {k: plan[k] for k in ("model", "fingerprint", "accepted", "kernels",
                                                           "memory_format", "cuda_graphs", "version") if k in plan},
        "settings": {k: val for k, val in settings.items()
                     if val is None or isinstance(val, (str, int, float, bool))},
        "environment": environment,
        "unfused": _v1_measurement(v, "unfused", unfused, "unfused"),
        "fused": _v1_measurement(v, "fused", fused, "fused"),
        "verdict": {"label": NOT_MEASURED, "ratio": ratio, "method": V1_RULE,
                    "note": "version 1 recorded no paired samples for the whole model"},
        "fused_vs_unfused": _v1_precision(v, fused, "precision_vs_unfused", "fused.precision_vs_unfused"),
        "reference": v.text(reference, "what", "reference.what") or "",
        "fused_worse": v.flag(reference, "fused_worse", "reference.fused_worse"),
        "chains": chains, "stages": stages, "baselines": _v1_baselines(v, data, plan),
        "notes": notes,
        "precision_note": v.text(data, "precision_note", "precision_note") or "",
        "bytes_note": v.text(data, "bytes_note", "bytes_note") or "",
        "graph_calls_note": v.text(data, "graph_calls_note", "graph_calls_note") or "",
        "rotation_note": "version 1: chain inputs were the same tensors every call (cache-resident), not rotated",
        "duration_s": v.num(data, "duration_s", "duration_s"),
    }


def _v1_latency(v: _V1, lat: Any, where: str) -> dict | None:
    if lat is None:
        return None
    if not isinstance(lat, dict):
        raise v.bad(where, "an object", lat)
    median = v.num(lat, "median", f"{where}.median", minimum=0.0)
    if median is None:
        return None
    p20 = v.num(lat, "p20", f"{where}.p20", minimum=0.0)
    p80 = v.num(lat, "p80", f"{where}.p80", minimum=0.0)
    return {"median": median, "p20": median if p20 is None else p20, "p80": median if p80 is None else p80,
            "reps": v.int_(lat, "reps", f"{where}.reps") or 0}


def _v1_precision(v: _V1, d: dict, key: str, where: str) -> dict | None:
    p = v.obj(d, key, where)
    if p is None:
        return None
    keys = {f.name for f in dataclasses.fields(Precision)}
    return {k: val for k, val in p.items() if k in keys}


def _v1_measurement(v: _V1, name: str, d: dict, where: str) -> dict:
    return {"name": name, "latency": _v1_latency(v, d.get("latency_ms"), f"{where}.latency_ms"),
            "throughput": d.get("throughput"),
            "peak_memory_bytes": d.get("peak_memory_bytes"), "activation_peak_bytes": d.get("activation_peak_bytes"),
            "resident_bytes": d.get("resident_bytes"), "kernel_launches": d.get("kernel_launches"),
            "launches_kind": v.text(d, "kernel_launches_kind", f"{where}.kernel_launches_kind") or "",
            "graph_launches": d.get("graph_launches"), "bytes_moved": d.get("bytes_moved"),
            "precision": _v1_precision(v, d, "precision", f"{where}.precision"),
            "cuda_graph": bool(v.flag(d, "cuda_graph", f"{where}.cuda_graph")),
            "note": v.text(d, "note", f"{where}.note") or "",
            "memory_note": v.text(d, "memory_note", f"{where}.memory_note") or ""}


def _v1_verdict(slower: bool | None, faster: bool, speedup: float | None, basis: str) -> dict:
    label = SLOWER if slower else (FASTER if faster else SAME)
    ratio = 1.0 / speedup if speedup else None
    return {"label": label, "ratio": ratio, "basis": basis, "method": V1_RULE, "decided": bool(slower or faster)}


def _v1_chain(v: _V1, c: dict, graphs: bool, where: str) -> dict:
    def at(key: str) -> str:
        return f"{where}.{key}"

    status = v.text(c, "status", at("status")) or ""
    speedup = v.num(c, "speedup", at("speedup"), minimum=0.0)
    graph_speedup = v.num(c, "graph_speedup", at("graph_speedup"), minimum=0.0)
    slower = v.flag(c, "slower", at("slower"))
    slower_in_graph = v.flag(c, "slower_in_graph", at("slower_in_graph"))
    verdict = c.get("verdict")
    plain = _v1_verdict(slower, verdict == "faster", speedup, "synchronised calls") if speedup is not None else None
    # version 1 did not say "faster" for graph replays
    graph = _v1_verdict(slower_in_graph, False, graph_speedup, "CUDA-graph replays") \
        if graph_speedup is not None else None
    decision = (graph if graphs and graph is not None else plain) or {"label": NOT_MEASURED, "basis": ""}
    limited = None
    if slower_in_graph:
        limited = GPU
    elif slower and graph_speedup is not None:
        limited = HOST
    chain_id = v.text(c, "id", at("id"))
    if chain_id is None:
        raise v.bad(at("id"), "a string", None)

    def timing(latency_key: str, ms_key: str) -> dict | None:
        if c.get(latency_key) is not None:
            return _v1_latency(v, c[latency_key], at(latency_key))
        ms = v.num(c, ms_key, at(ms_key), minimum=0.0)
        return {"median": ms, "p20": ms, "p80": ms, "reps": 0} if ms is not None else None

    def graph_timing(key: str) -> dict | None:
        ms = v.num(c, key, at(key), minimum=0.0)
        return {"median": ms, "p20": ms, "p80": ms, "reps": 0} if ms else None

    return {
        "id": chain_id, "title": v.text(c, "title", at("title")) or chain_id,
        "pattern": v.text(c, "pattern", at("pattern")) or "?",
        "status": status, "reason": v.text(c, "reason", at("reason")) or "",
        "implementation": v.text(c, "implementation", at("implementation")) or "",
        "kernel": v.text(c, "kernel", at("kernel")) or "auto", "fused_kernel": status == "fused",
        "verdict": decision, "plain": plain, "graph": graph, "limited_by": limited,
        "bytes_unfused": c.get("bytes_unfused"), "bytes_fused": c.get("bytes_fused"),
        "graph_launches_saved": v.int_(c, "graph_launches_saved", at("graph_launches_saved")) or 0,
        "launches_unfused": c.get("launches_unfused"), "launches_fused": c.get("launches_fused"),
        "launches_kind": v.text(c, "launches_kind", at("launches_kind")) or "",
        "unfused": timing("unfused_latency_ms", "unfused_ms"), "fused": timing("fused_latency_ms", "fused_ms"),
        "unfused_graph": graph_timing("unfused_graph_ms"), "fused_graph": graph_timing("fused_graph_ms"),
        "max_abs": c.get("max_abs"), "rel_err": c.get("rel_err"), "rel_err_unfused": c.get("rel_err_unfused"),
        "rotation": "not rotated (version 1)",
    }


def _v1_stage(v: _V1, s: dict, where: str) -> dict:
    stage = v.text(s, "stage", f"{where}.stage") or "?"
    return {"stage": stage, "label": v.text(s, "label", f"{where}.label") or stage,
            "differs": "version 1 did not record how this stage's graph differs",
            "graph_ops": 0, "fused_calls": 0, "batch_norms": 0,
            "chains_fused": v.int_(s, "chains_fused", f"{where}.chains_fused") or 0, "chains_folded": 0,
            "latency": _v1_latency(v, s.get("latency_ms"), f"{where}.latency_ms"), "throughput": s.get("throughput"),
            "peak_memory_bytes": s.get("peak_memory_bytes"), "activation_peak_bytes": s.get("activation_peak_bytes")}


def _v1_baselines(v: _V1, data: dict, plan: dict) -> list[dict]:
    value = data.get("baselines")
    if not isinstance(value, dict):
        return []
    out = []
    fmt = v.text(plan, "memory_format", "plan.memory_format") or "nchw"
    graphs = bool(v.flag(plan, "cuda_graphs", "plan.cuda_graphs"))
    for key, d in value.items():
        if not isinstance(d, dict):
            continue
        where = f"baselines.{key}"
        method = "torch.compile" if key.startswith("torch_compile") else ("fused" if key.startswith("fused") else "eager")
        entry = {"name": key, "label": key.replace("_", " "), "method": method,
                 "mode": d.get("mode") if isinstance(d.get("mode"), str) else None, "cuda_graphs": graphs,
                 "memory_format": fmt, "error": d.get("error") if isinstance(d.get("error"), str) else None,
                 "compile_s": d.get("compile_s")}
        if "latency_ms" in d:
            entry["measurement"] = _v1_measurement(v, key, d, where)
        out.append(entry)
    return out


# ====================================================================== reading plain JSON

def verdict_speedup(verdict: Any) -> float | None:
    """``Verdict.speedup`` of a typed verdict or of its JSON object (None where it has no ratio)."""
    ratio = verdict.ratio if isinstance(verdict, Verdict) else (verdict.get("ratio") if isinstance(verdict, dict)
                                                                else None)
    return 1.0 / ratio if isinstance(ratio, (int, float)) and not isinstance(ratio, bool) and ratio > 0 else None


def chain_speedups(entry: Any) -> tuple[float | None, float | None]:
    """(speed-up, speed-up as CUDA-graph replays) of one chain: a ``ChainResult`` or its JSON object (a
    version 2 report's; ``load`` upgrades version 1). The same statistics as ``ChainResult.speedup`` and
    ``graph_speedup``, for readers of plain JSON (the teaching readers, the graph's overlays)."""
    if isinstance(entry, ChainResult):
        return entry.speedup, entry.graph_speedup
    if not isinstance(entry, dict):
        return None, None
    graph = entry.get("graph")
    return verdict_speedup(entry.get("verdict")), verdict_speedup(graph) if isinstance(graph, dict) else None


def finiteness_warning(report: Report) -> Any:
    """Where an output was not finite (NaN or infinity), whose fault it is, as a ``NOTES`` message: the model's
    own ops in the run's dtype (the unfused graph's output, and eager PyTorch's where that baseline ran), or a
    fusion (the unfused graph's output finite, the fused one's not). None where no output is known not finite.
    Swin-V2 in fp16 is the first kind: its padded windows' keys are zero and ``F.normalize``'s eps is 0 in fp16."""
    from explorer.messages import NOTES

    def finite(m: Measurement | None) -> bool | None:
        return m.precision.finite if m is not None and m.precision is not None else None

    dtype = report.settings.get("dtype") or "the run's dtype"
    if finite(report.unfused) is False:
        eager = report.baseline("eager")
        eager_too = eager is not None and finite(eager.measurement) is False
        return NOTES("unfused_not_finite_eager" if eager_too else "unfused_not_finite", dtype=dtype)
    if finite(report.unfused) is True and finite(report.fused) is False:
        return NOTES("fused_not_finite", dtype=dtype)
    return None


# ====================================================================== text

def summary_table(report: Report) -> str:
    """A compact plain-text table of a report (for the command line); the text of every line is shown
    through ``explorer.terminal.visible`` (a control or bidi character as a visible escape)."""
    env = report.environment
    lines = [f"{report.model.name} on {env.device_name} ({report.settings.get('dtype')}, batch {report.model.batch})"
             + (f"  [{env.note}]" if env.is_cpu else "")]
    lines.append(f"{'variant':<40}{'median ms':>11}{'p20':>9}{'p80':>9}{'items/s':>11}{'launches':>10}{'rel_l2':>10}")

    def row(name: str, m: Measurement | None, latency: Latency | None = None, throughput: float | None = None) -> None:
        lat = latency if latency is not None else (m.latency if m else None)
        prec = m.precision if m else None
        rel = prec.rel_l2 if prec else None
        lines.append(f"{name[:39]:<40}{_fmt(lat.median if lat else None):>11}{_fmt(lat.p20 if lat else None):>9}"
                     f"{_fmt(lat.p80 if lat else None):>9}"
                     f"{_fmt(throughput if throughput is not None else (m.throughput if m else None), 1):>11}"
                     f"{str(m.kernel_launches if m and m.kernel_launches is not None else '-'):>10}"
                     f"{(f'{rel:.1e}' if isinstance(rel, float) else '-'):>10}")

    row("unfused", report.unfused)
    row("fused", report.fused)
    warning = finiteness_warning(report)
    if warning is not None:
        lines.append(f"WARNING: {warning}")
    lines.append(f"fused vs unfused: {report.verdict.describe()}")
    lines.append(f"  ({SPEEDUP_DEFINITION})")
    launches = launch_lines(report)
    lines += launches
    for s in report.stages:
        if s.latency is not None:
            row(f"stage: {s.label}", None, s.latency, s.throughput)
        else:
            lines.append(f"stage: {s.label:<33} " + (f"same graph as '{s.same_as}', not timed again" if s.same_as
                                                       else s.differs))
    for b in report.baselines:
        if b.measurement is not None:
            row(f"baseline: {b.label}", b.measurement)
            if b.verdict is not None:
                lines.append(f"  {b.pairs_with} against it: {b.verdict.describe()}")
        elif b.error:
            lines.append(f"baseline: {b.label}: {b.error}")
    if report.chains:
        counts = {word: sum(1 for c in report.chains if c.verdict.reading == word) for word in READINGS}
        slower = report.slower_chains
        lines.append(f"chains: {len(report.chains)} accepted: " + ", ".join(f"{n} {label}" for label, n in counts.items() if n)
                     + (f" (slower: {', '.join(slower[:5])}{' ...' if len(slower) > 5 else ''})" if slower else ""))
        for c in sorted((c for c in report.chains if c.speedup is not None), key=lambda c: -(c.speedup or 0)):
            lines.append(f"  {c.title}: {c.verdict.describe()}"
                         + (f" [{c.launches_unfused} -> {c.launches_fused} launches measured]"
                            if c.launches_unfused is not None and c.launches_fused is not None else ""))
    for f in report.failures:
        lines.append(f"phase {f.phase} {'not run' if f.not_run else 'FAILED'}"
                     + (f" ({f.variant})" if f.variant else "") + f": {f.reason}")
    if report.fresh_processes:
        lines.append(f"{report.fresh_processes} fresh measuring process(es) ran the phases after a lost one")
    return "\n".join(visible(line) for line in lines)  # a name holding a newline cannot add a line


def launch_lines(report: Report) -> list[str]:
    """The kernel launches in words: the graph model's count for the report's device and kernel choices
    (``explorer.launches``), then the profiler's measured count, each with its saving."""
    u, f, device = report.unfused, report.fused, report.environment.device
    lines = []
    if u.graph_launches is not None and f.graph_launches is not None:
        lines.append(f"kernel launches on {device} (graph model, this plan's kernels): {u.graph_launches} -> "
                     f"{f.graph_launches} (saves {u.graph_launches - f.graph_launches})")
    if u.kernel_launches is not None and f.kernel_launches is not None:
        lines.append(f"kernel launches measured ({u.launches_kind or 'profiler'}): {u.kernel_launches} -> "
                     f"{f.kernel_launches} (saves {u.kernel_launches - f.kernel_launches})")
    return lines


def _fmt(x: Any, digits: int = 3) -> str:
    return f"{x:.{digits}f}" if isinstance(x, (int, float)) and math.isfinite(x) else "-"
