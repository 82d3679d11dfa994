"""What a sweep measures: a strictly validated value, read from a TOML/YAML file or built from flags, and its points.

A sweep file (TOML; YAML when PyYAML is installed) names the axes of a grid::

    name = "cnn-dtypes"                      # optional
    models = ["resnet50", "mobilenet_v2"]    # zoo names, or paths (relative to the file's folder)
    plans = ["all", "none"]                  # all | none | pattern[,pattern...] | chain:ID | a plan .json file
    batches = [1, 8, 32]
    seq_lens = [128, 1024]                   # optional: only models that take a sequence use it
    dtypes = ["fp16", "bf16"]
    memory_formats = ["channels_last"]       # optional, default ["nchw"]
    cuda_graphs = [false]                    # optional, default [false]
    baselines = [true]                       # optional, default [false]: eager and torch.compile too

    [settings]                               # optional: how each point is measured
    device = "auto"                          # auto | cuda | cpu
    quick = false
    per_chain = false                        # each chain timed alone (slow on big models)
    stages = false
    timeout_s = 900.0                        # per point
    workers_per_gpu = 1                      # N > 1: N workers take turns on each GPU (exclusive device section)
    # cpu_threads, warmup, reps, compile_modes, allow_mixed_gpus

Every axis is a non-empty list without repeats; an unknown key, a value of the
wrong type (``true`` for a batch, ``"1"`` for an integer) or an empty list is
refused with one line naming the file and the key (``SweepError``). Nothing is
coerced.

``expand(spec)`` is the grid's product, in a fixed order (model, plan, batch,
seq_len, dtype, memory format, CUDA graphs, baselines). A plan file's own
memory format and CUDA-graph switch are replaced by the point's (the axes are the
levers); its accepted chains and kernel choices are kept. ``cache_key`` is the
identity of a measured point: the model's graph fingerprint and the plan's
fingerprint (both found by a worker, ``worker.resolve``), the shape, dtype, memory
format, CUDA graphs, baselines, the device name, driver, torch and Triton
versions, and the measurement settings.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from pathlib import Path
from typing import Any, Iterable, Sequence

from explorer.errors import ExplorerError
from explorer.jsonfile import parse_json, read_regular_file
from explorer.runtime.settings import COMPILE_MODES, DEFAULT_COMPILE_MODES, RunSettings
from explorer.vocab import DEVICE_NAMES, DTYPE_NAMES, MEMORY_FORMATS

MAX_SPEC_BYTES = 1 * 2**20
MAX_POINTS = 100_000
DTYPES = DTYPE_NAMES          # the one vocabulary (explorer.vocab), as a sweep spells its axes
DEVICES = DEVICE_NAMES        # a sweep's workers pick their GPU (CUDA_VISIBLE_DEVICES): no cuda:N here
MAX_PLAN_BYTES = 5 * 2**20
#: Bumped when what a point measures changes meaning: part of every cache key.
KEY_VERSION = 1


class SweepError(ExplorerError):
    """A sweep file, its flags or a sweep folder is malformed (one line)."""


@dataclasses.dataclass(frozen=True)
class PlanSpec:
    """One entry of ``plans``: ``label`` as the user wrote it, ``accept`` (all, none, or pattern names) or ``data``
    (a plan file's JSON, already checked by ``Plan.from_dict``)."""

    label: str
    accept: str | None = None
    data: dict | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"label": self.label, "accept": self.accept, "data": self.data}


@dataclasses.dataclass(frozen=True)
class SweepSettings:
    """How each point is measured (``RunSettings`` of the runner, less the per-point axes)."""

    device: str = "auto"
    quick: bool = False
    per_chain: bool = False
    stages: bool = False
    cpu_threads: int | None = None
    warmup: int | None = None
    reps: int | None = None
    timeout_s: float = 900.0
    compile_modes: tuple[str, ...] = DEFAULT_COMPILE_MODES
    allow_mixed_gpus: bool = False
    #: How many workers take turns on each GPU (``worker.Worker``'s ``share``): how the points are scheduled, not
    #: what one measures, so not part of a point's cache key.
    workers_per_gpu: int = 1

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["compile_modes"] = list(self.compile_modes)
        return d


@dataclasses.dataclass(frozen=True)
class SweepSpec:
    """The axes of a sweep and how its points are measured (module docstring)."""

    models: tuple[str, ...]
    plans: tuple[PlanSpec, ...]
    batches: tuple[int, ...]
    dtypes: tuple[str, ...]
    seq_lens: tuple[int, ...] = ()
    memory_formats: tuple[str, ...] = ("nchw",)
    cuda_graphs: tuple[bool, ...] = (False,)
    baselines: tuple[bool, ...] = (False,)
    settings: SweepSettings = SweepSettings()
    name: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "models": list(self.models), "plans": [p.to_dict() for p in self.plans],
                "batches": list(self.batches), "seq_lens": list(self.seq_lens), "dtypes": list(self.dtypes),
                "memory_formats": list(self.memory_formats), "cuda_graphs": list(self.cuda_graphs),
                "baselines": list(self.baselines), "settings": self.settings.to_dict()}


@dataclasses.dataclass(frozen=True)
class Point:
    """One measurement of a sweep: a model at one shape, dtype and plan, with its levers."""

    model: str
    plan: str
    batch: int
    seq_len: int | None
    dtype: str
    memory_format: str
    cuda_graphs: bool
    baselines: bool

    @property
    def label(self) -> str:
        """``resnet50 · all · b8 · fp16 · channels_last`` (CUDA graphs and baselines when on)."""
        parts = [model_label(self.model), self.plan, f"b{self.batch}"]
        if self.seq_len is not None:
            parts.append(f"s{self.seq_len}")
        parts += [self.dtype, self.memory_format]
        if self.cuda_graphs:
            parts.append("graphs")
        if self.baselines:
            parts.append("baselines")
        return " · ".join(parts)

    @property
    def shape_key(self) -> tuple[str, int, int | None]:
        """What a worker loads once to resolve fingerprints: (model, batch, seq_len)."""
        return (self.model, self.batch, self.seq_len)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def model_label(model: str) -> str:
    """A model as charts name it: a zoo name as it is, a path by its file or folder name."""
    return Path(model).name if os.sep in model or model.endswith((".onnx", ".pt2")) else model


# ====================================================================== reading

_AXES = ("models", "plans", "batches", "seq_lens", "dtypes", "memory_formats", "cuda_graphs", "baselines")
_TOP = ("name", *_AXES, "settings")
_REQUIRED = ("models", "plans", "batches", "dtypes")
_SETTINGS = tuple(f.name for f in dataclasses.fields(SweepSettings))


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _list(data: dict, key: str, where: str, check, what: str) -> tuple:
    value = data[key]
    if not isinstance(value, list):
        raise SweepError(f"{where}: '{key}' must be a list of {what}, got {type(value).__name__}")
    if not value:
        raise SweepError(f"{where}: '{key}' is an empty list: give at least one value")
    for item in value:
        if not check(item):
            raise SweepError(f"{where}: '{key}' holds {_show(item)}: expected {what}")
    seen: set = set()
    for item in value:
        if (type(item), item) in seen:
            raise SweepError(f"{where}: '{key}' lists {_show(item)} twice")
        seen.add((type(item), item))
    return tuple(value)


def _show(value: Any) -> str:
    text = json.dumps(value) if isinstance(value, (str, int, float, bool)) or value is None else type(value).__name__
    return text[:80]


def parse_spec(data: Any, where: str = "sweep", base: str | os.PathLike | None = None) -> SweepSpec:
    """A ``SweepSpec`` from the parsed file (a dict), strictly (module docstring); ``base`` is the folder relative
    model and plan paths are read from (the file's folder; the working directory for flags)."""
    if not isinstance(data, dict):
        raise SweepError(f"{where}: a sweep must be a table of keys (models, plans, batches, dtypes, ...)")
    unknown = sorted(str(k)[:40] for k in data if k not in _TOP)
    if unknown:
        raise SweepError(f"{where}: unknown key(s) {', '.join(unknown[:5])}: a sweep has {', '.join(_TOP)}")
    missing = [k for k in _REQUIRED if k not in data]
    if missing:
        raise SweepError(f"{where}: missing key(s) {', '.join(missing)}")
    base_dir = Path(base) if base is not None else Path.cwd()
    name = data.get("name", "")
    if not isinstance(name, str) or len(name) > 200:
        raise SweepError(f"{where}: 'name' must be a string of at most 200 characters")
    models = _list(data, "models", where, lambda v: isinstance(v, str) and 0 < len(v) < 4096 and "\x00" not in v,
                   "model names or paths (strings)")
    models = tuple(_model(m, base_dir, where) for m in models)
    plans = tuple(_plan(p, base_dir, where) for p in _list(
        data, "plans", where, lambda v: isinstance(v, str) and 0 < len(v) < 4096 and "\x00" not in v,
        "plans (all, none, pattern names, or a plan file)"))
    positive = "positive integers"
    batches = _list(data, "batches", where, lambda v: _is_int(v) and 1 <= v <= 2**31, positive)
    seq_lens = _list(data, "seq_lens", where, lambda v: _is_int(v) and 1 <= v <= 2**31, positive) \
        if "seq_lens" in data else ()
    dtypes = _list(data, "dtypes", where, lambda v: v in DTYPES, "dtypes (" + ", ".join(DTYPES) + ")")
    formats = _list(data, "memory_formats", where, lambda v: v in MEMORY_FORMATS,
                    "memory formats (" + ", ".join(MEMORY_FORMATS) + ")") if "memory_formats" in data else ("nchw",)
    graphs = _list(data, "cuda_graphs", where, lambda v: isinstance(v, bool), "true or false") \
        if "cuda_graphs" in data else (False,)
    base_on = _list(data, "baselines", where, lambda v: isinstance(v, bool), "true or false") \
        if "baselines" in data else (False,)
    settings = _settings(data.get("settings", {}), where)
    spec = SweepSpec(models=models, plans=plans, batches=batches, seq_lens=seq_lens, dtypes=dtypes,
                     memory_formats=formats, cuda_graphs=graphs, baselines=base_on, settings=settings, name=name)
    count = _count(spec)
    if count > MAX_POINTS:
        raise SweepError(f"{where}: the grid has {count} points, more than the {MAX_POINTS} a sweep may hold")
    return spec


def _count(spec: SweepSpec) -> int:
    n = 1
    for axis in (spec.models, spec.plans, spec.batches, spec.seq_lens or (None,), spec.dtypes, spec.memory_formats,
                 spec.cuda_graphs, spec.baselines):
        n *= len(axis)
    return n


def _model(name: str, base: Path, where: str) -> str:
    from explorer.sources import zoo   # the zoo's table imports torch: only when a sweep is read

    if name in zoo.ZOO:
        return name
    path = Path(name) if os.path.isabs(name) else base / name
    if not path.exists():
        raise SweepError(f"{where}: model '{name[:200]}' is neither a zoo model ({', '.join(list(zoo.ZOO)[:6])}, ...) "
                         "nor an existing file or folder")
    return str(path.resolve())


def _plan(text: str, base: Path, where: str) -> PlanSpec:
    from explorer.fusions import BY_NAME
    from explorer.fusions.plan import Plan

    if text in ("all", "none"):
        return PlanSpec(text, accept=text)
    if text.startswith("chain:") and len(text) > len("chain:"):
        return PlanSpec(text, accept=text)   # one chain alone, by its id (worker.one_chain_plan)
    if text.endswith(".json") or os.sep in text:
        path = Path(text) if os.path.isabs(text) else base / text
        data = parse_json(read_regular_file(path, f"{where}: plan {text[:200]}", SweepError, MAX_PLAN_BYTES),
                          f"{where}: plan {text[:200]}", SweepError)
        try:
            Plan.from_dict(data)
        except ExplorerError as exc:
            raise SweepError(f"{where}: plan {text[:200]}: {exc}") from None
        return PlanSpec(text, data=data)
    names = [n.strip() for n in text.split(",")]
    unknown = [n for n in names if n not in BY_NAME]
    if unknown or not all(names):
        raise SweepError(f"{where}: plan '{text[:200]}' is not all, none, a plan .json file or pattern names "
                         f"(unknown: {', '.join(n for n in unknown if n)[:200] or 'an empty name'}; patterns: "
                         f"{', '.join(BY_NAME)})")
    return PlanSpec(text, accept=",".join(names))


def _settings(data: Any, where: str) -> SweepSettings:
    if not isinstance(data, dict):
        raise SweepError(f"{where}: 'settings' must be a table")
    unknown = sorted(str(k)[:40] for k in data if k not in _SETTINGS)
    if unknown:
        raise SweepError(f"{where}: unknown setting(s) {', '.join(unknown[:5])}: settings are {', '.join(_SETTINGS)}")
    checks = {
        "device": (lambda v: v in DEVICES, "one of " + ", ".join(DEVICES)),
        "quick": (lambda v: isinstance(v, bool), "true or false"),
        "per_chain": (lambda v: isinstance(v, bool), "true or false"),
        "stages": (lambda v: isinstance(v, bool), "true or false"),
        "allow_mixed_gpus": (lambda v: isinstance(v, bool), "true or false"),
        "cpu_threads": (lambda v: _is_int(v) and 1 <= v <= 4096, "a positive integer"),
        "workers_per_gpu": (lambda v: _is_int(v) and 1 <= v <= 16, "an integer from 1 to 16"),
        "warmup": (lambda v: _is_int(v) and 0 <= v <= 10**6, "an integer of at least 0"),
        "reps": (lambda v: _is_int(v) and 1 <= v <= 10**7, "a positive integer"),
        "timeout_s": (lambda v: (_is_int(v) or isinstance(v, float)) and 0 < v <= 7 * 86400,
                      "a number of seconds above 0"),
        "compile_modes": (lambda v: isinstance(v, list) and bool(v) and all(m in COMPILE_MODES for m in v)
                          and len(set(v)) == len(v),
                          "a non-empty list of torch.compile modes without repeats (" + ", ".join(COMPILE_MODES) + ")"),
    }
    for key, value in data.items():
        check, what = checks[key]
        if not check(value):
            raise SweepError(f"{where}: setting '{key}' is {_show(value)}: expected {what}")
    values = dict(data)
    if "compile_modes" in values:
        values["compile_modes"] = tuple(values["compile_modes"])
    if "timeout_s" in values:
        values["timeout_s"] = float(values["timeout_s"])
    return SweepSettings(**values)


def load_spec(path: str | os.PathLike) -> SweepSpec:
    """Read a sweep file: ``.toml`` (tomllib), ``.yaml``/``.yml`` (PyYAML's safe loader, when installed) or ``.json``.
    Raises ``SweepError`` with one line for anything else."""
    where = f"sweep file {str(path)[:200]}"
    raw = read_regular_file(path, where, SweepError, MAX_SPEC_BYTES)
    suffix = Path(path).suffix.lower()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise SweepError(f"{where}: not UTF-8 text") from None
    if suffix == ".toml":
        try:
            import tomllib   # Python 3.11+
        except ImportError:  # Python 3.10: the same parser as a package
            try:
                import tomli as tomllib
            except ImportError:
                raise SweepError(f"{where}: reading TOML on Python 3.10 needs tomli (pip install tomli)") from None
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise SweepError(f"{where}: not valid TOML ({' '.join(str(exc).split())[:200]})") from None
    elif suffix in (".yaml", ".yml"):
        try:
            import yaml
        except ImportError:
            raise SweepError(f"{where}: reading YAML needs PyYAML (pip install pyyaml); a .toml sweep needs nothing") \
                from None
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise SweepError(f"{where}: not valid YAML ({' '.join(str(exc).split())[:200]})") from None
    elif suffix == ".json":
        data = parse_json(raw, where, SweepError, MAX_SPEC_BYTES)
    else:
        raise SweepError(f"{where}: a sweep file is .toml, .yaml or .json, not '{suffix or 'no suffix'}'")
    return parse_spec(data, where, Path(path).resolve().parent)


def from_flags(models: Sequence[str], plans: Sequence[str], batches: Sequence[int], dtypes: Sequence[str],
               seq_lens: Sequence[int] = (), memory_formats: Sequence[str] = ("nchw",),
               cuda_graphs: Sequence[bool] = (False,), baselines: Sequence[bool] = (False,),
               settings: dict | None = None, name: str = "") -> SweepSpec:
    """The same value from the command line's flags (validated by the same rules as a file)."""
    data: dict[str, Any] = {"name": name, "models": list(models), "plans": list(plans), "batches": list(batches),
                            "dtypes": list(dtypes), "memory_formats": list(memory_formats),
                            "cuda_graphs": list(cuda_graphs), "baselines": list(baselines),
                            "settings": dict(settings or {})}
    if seq_lens:
        data["seq_lens"] = list(seq_lens)
    return parse_spec(data, "sweep flags")


# ====================================================================== points

def _takes_sequence(model: str) -> bool | None:
    """True/False for a zoo model (its inputs say), None for a file (not known before it loads)."""
    from explorer.sources import zoo

    entry = zoo.ZOO.get(model)
    return None if entry is None else entry.inputs.seq_len is not None


def expand(spec: SweepSpec) -> list[Point]:
    """The grid's points in a fixed order (module docstring). A zoo model that takes no sequence gets one point per
    shape (``seq_len`` None) whatever ``seq_lens`` says; a file model gets ``seq_lens`` as given."""
    points: list[Point] = []
    for model in spec.models:
        takes = _takes_sequence(model)
        seqs: Iterable[int | None] = (None,) if takes is False or not spec.seq_lens else spec.seq_lens
        for plan in spec.plans:
            for batch in spec.batches:
                for seq in seqs:
                    for dtype in spec.dtypes:
                        for fmt in spec.memory_formats:
                            for graphs in spec.cuda_graphs:
                                for base in spec.baselines:
                                    points.append(Point(model, plan.label, batch, seq, dtype, fmt, graphs, base))
    return points


def plan_by_label(spec: SweepSpec, label: str) -> PlanSpec:
    return next(p for p in spec.plans if p.label == label)


def run_settings(spec: SweepSpec, point: Point) -> RunSettings:
    """The runner's settings for one point: the point's axes and the sweep's settings."""
    s = spec.settings
    return RunSettings(device=s.device, dtype=point.dtype, batch=point.batch, seq_len=point.seq_len,
                       per_chain=s.per_chain, stages=s.stages, compile_baseline=point.baselines,
                       compile_modes=s.compile_modes, quick=s.quick, cpu_threads=s.cpu_threads,
                       warmup=s.warmup, reps=s.reps, timeout_s=s.timeout_s)


#: What of a worker's environment is part of a point's identity (``env.probe`` fields).
KEY_ENVIRONMENT = ("device_kind", "device_name", "driver", "torch", "triton")


def plan_fingerprint(plan: dict) -> str:
    """sha256 of a resolved plan's canonical JSON (accepted chains, kernels, levers, the model it was made for)."""
    return hashlib.sha256(json.dumps(plan, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:32]


def key_fields(point: Point, model_fingerprint: str, plan_fp: str, environment: dict,
               settings: RunSettings) -> dict[str, Any]:
    """The fields a point's cache key hashes (stored beside each record, so a reader can see why two differ)."""
    measured = settings.to_dict()
    for axis in ("dtype", "batch", "seq_len", "compile_baseline", "timeout_s"):
        measured.pop(axis, None)   # the axes are fields of their own; the timeout does not change a number
    fields = {"version": KEY_VERSION, "model_fingerprint": model_fingerprint, "plan_fingerprint": plan_fp,
              "batch": point.batch, "seq_len": point.seq_len, "dtype": point.dtype,
              "memory_format": point.memory_format, "cuda_graphs": point.cuda_graphs, "baselines": point.baselines,
              **{k: environment.get(k) for k in KEY_ENVIRONMENT}, "settings": measured}
    # A point that failed before its fingerprints were known is named by what the sweep says instead
    if model_fingerprint is None:
        fields["model"] = point.model
    if plan_fp is None:
        fields["plan"] = point.plan
    return fields


def cache_key(fields: dict[str, Any]) -> str:
    """The key of ``key_fields``: 32 hex digits of their sha256 (also the name of the point's report file)."""
    return hashlib.sha256(json.dumps(fields, sort_keys=True, separators=(",", ":"), default=str).encode()).hexdigest()[:32]
