"""A sweep folder: the journal of its points, their Parquet table, each point's report, and its progress.

    <folder>/sweep.json        the sweep as last run (``SweepSpec.to_dict``), the workers, the times
    <folder>/results.jsonl     one record per finished point, appended as it finishes (the journal: a killed
                               sweep loses only the points in flight; a re-run resumes from here)
    <folder>/results.parquet   the latest record of every point, as one table (pyarrow), written at the end
    <folder>/reports/<key>.json  the point's whole run report (``explorer.report``), named by its cache key
    <folder>/progress.json     done / failed / cached / left and the time left, rewritten as the sweep goes
                               (the app's Sweeps page shows it live)

A record (``make_record``) is one flat row of scalars: the point's axes, its status ("ok", or "failed" or "refused"
with the one-line ``reason``), the whole-model verdict of the report's paired test (``verdict``, ``speedup`` = 1/ratio and
its 95% interval ``speedup_low``-``speedup_high``, ``p_value``, ``rounds``), the medians for reading, peak memory,
each baseline's verdict against the fused model (``vs_<baseline>_*``: the baseline's median ``_ms`` and, as
``_fused_ms``, the median of the fused variant timed in the same rounds, which is the pair that verdict tested; the
main phase's ``fused_ms`` comes from other rounds and is not its partner), and where it was measured (worker, device,
GPU UUID, driver, clocks before and after, torch, Triton, the host's CPU share and load). ``key_fields`` (JSON) says
what its cache key hashes. Where its wall time went: ``phase_s`` (JSON: seconds per step of the runner,
``worker.PhaseClock``) and, when workers took turns on the device (``workers_per_gpu`` > 1), its exclusive
device section: ``lock_waited_s``, ``lock_held_s`` and the interval held (``lock_acquired_at``-``lock_released_at``,
Unix seconds, taken by the measuring child inside it).

Reading is defensive (a folder is a user's): ``open_folder`` resolves the path and refuses a file, a folder of other
things, and (with a ``root``) a path that leaves the root; files are read through ``explorer.jsonfile`` (regular
files only, bounded size and depth); a record whose fields have the wrong types is refused with one line naming the
line; a truncated last line (a sweep killed while writing) is skipped and counted. Report files are found by key
(32 hex digits), never by a path a record names.
"""

from __future__ import annotations

import io
import json
import os
import re
import tempfile
import time
from pathlib import Path
from typing import Any, Iterable

from explorer.messages import SWEEPS
from explorer.jsonfile import parse_json, read_regular_file
from explorer.report import NOT_MEASURED
from explorer.sweeps.spec import SweepError

#: Seconds after which a "running" progress file that its sweep stopped rewriting (it does so about once a second,
#: ``sweeps.runner.PROGRESS_EVERY_S``) is read as an interrupted sweep.
STALE_S = 60.0
SPEC_FILE, JOURNAL, TABLE, PROGRESS, REPORTS = "sweep.json", "results.jsonl", "results.parquet", "progress.json", \
    "reports"
OURS = {SPEC_FILE, JOURNAL, TABLE, PROGRESS, REPORTS}
MAX_JOURNAL_BYTES = 256 * 2**20
MAX_LINE_BYTES = 1 * 2**20
MAX_REPORT_BYTES = 50 * 2**20
MAX_TABLE_ROWS = 100_000
MAX_TABLE_BYTES = 256 * 2**20
KEY_RE = re.compile(r"^[0-9a-f]{32}$")
PAIR_FILL_MAX = 2000   # reports read to give an older journal's records their baseline pairs' fused medians
STATUSES = ("ok", "failed", "refused", "simulated")
#: Baselines whose verdict against the fused model gets columns of its own (``runtime.baselines`` names).
BASELINE_COLUMNS = ("eager", "eager_cuda_graphs", "torch_compile", "torch_compile_reduce_overhead",
                    "torch_compile_max_autotune_no_cudagraphs")

_STR, _INT, _FLOAT, _BOOL = (str,), (int,), (int, float), (bool,)
#: Every field of a record and its JSON types (None allowed for all but the first four).
SCHEMA: dict[str, tuple[type, ...]] = {
    "key": _STR, "status": _STR, "point": _STR, "model": _STR,
    "reason": _STR, "model_label": _STR, "plan": _STR, "batch": _INT, "seq_len": _INT, "dtype": _STR,
    "memory_format": _STR, "cuda_graphs": _BOOL, "baselines": _BOOL,
    "model_fingerprint": _STR, "plan_fingerprint": _STR, "chains_detected": _INT, "chains_accepted": _INT,
    "verdict": _STR, "speedup": _FLOAT, "speedup_low": _FLOAT, "speedup_high": _FLOAT, "p_value": _FLOAT,
    "rounds": _INT, "decided": _BOOL, "verdict_note": _STR,
    "unfused_ms": _FLOAT, "fused_ms": _FLOAT, "unfused_p20": _FLOAT, "unfused_p80": _FLOAT, "fused_p20": _FLOAT,
    "fused_p80": _FLOAT, "peak_unfused_bytes": _INT, "peak_fused_bytes": _INT,
    **{f"vs_{b}_{f}": t for b in BASELINE_COLUMNS
       for f, t in (("verdict", _STR), ("speedup", _FLOAT), ("low", _FLOAT), ("high", _FLOAT), ("ms", _FLOAT),
                    ("fused_ms", _FLOAT))},
    "worker": _INT, "device_kind": _STR, "device_name": _STR, "gpu_uuid": _STR, "gpu_index": _STR,
    "driver": _STR, "sm_clock_mhz": _FLOAT, "sm_clock_mhz_after": _FLOAT, "sm_clock_max_mhz": _FLOAT,
    "gpu_util_pct_after": _FLOAT, "temperature_c": _FLOAT, "torch": _STR, "triton": _STR, "host": _STR,
    "host_cpu_busy": _FLOAT, "load_avg_1m": _FLOAT, "wall_s": _FLOAT, "duration_s": _FLOAT,
    "workers_per_gpu": _INT, "lock_waited_s": _FLOAT, "lock_held_s": _FLOAT, "lock_acquired_at": _FLOAT,
    "lock_released_at": _FLOAT, "phase_s": _STR,
    "measured_utc": _STR, "attempts": _INT, "has_report": _BOOL, "key_fields": _STR,
}


# ====================================================================== records

def _num(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) and value == value else None


def _verdict_columns(prefix: str, verdict: dict | None) -> dict[str, Any]:
    """``<prefix>verdict``, ``speedup`` (1/ratio) and its interval from a report's ``Verdict``."""
    v = verdict or {}
    ratio, low, high = _num(v.get("ratio")), _num(v.get("ci_low")), _num(v.get("ci_high"))
    return {f"{prefix}verdict": v.get("label") if v else None,
            f"{prefix}speedup": 1.0 / ratio if ratio else None,
            f"{prefix}low": 1.0 / high if high else None,
            f"{prefix}high": 1.0 / low if low else None}


def _baseline_medians(report: Any) -> dict[str, tuple[float | None, float | None]]:
    """``{baseline: (its median ms, the median ms of the fused variant its verdict paired it with)}`` from a
    report's baselines (one phase's alternated rounds: the main phase's ``fused`` is other rounds)."""
    entries = [b for b in (report.get("baselines") or []) if isinstance(b, dict)] if isinstance(report, dict) else []
    medians = {b.get("name"): _num(((b.get("measurement") or {}).get("latency") or {}).get("median"))
               for b in entries}
    return {b["name"]: (medians.get(b["name"]), medians.get(b.get("pairs_with")))
            for b in entries if b.get("name") in BASELINE_COLUMNS}


def make_record(point: Any, key: str, fields: dict, answer: dict, attempts: int = 1) -> dict[str, Any]:
    """One flat record from a worker's ``measure`` answer (or a failure) for ``point`` (module docstring)."""
    env = answer.get("environment") or {}
    before, after = answer.get("clocks_before") or {}, answer.get("clocks_after") or {}
    load = answer.get("host_load") or {}
    rec: dict[str, Any] = {name: None for name in SCHEMA}
    rec.update(
        key=key, status=str(answer.get("status", "failed")), point=point.label, model=point.model,
        reason=answer.get("reason"), model_label=_model_label(point.model), plan=point.plan, batch=point.batch,
        seq_len=point.seq_len, dtype=point.dtype, memory_format=point.memory_format, cuda_graphs=point.cuda_graphs,
        baselines=point.baselines, model_fingerprint=fields.get("model_fingerprint"),
        plan_fingerprint=fields.get("plan_fingerprint"),
        worker=env.get("worker"), device_kind=env.get("device_kind"), device_name=env.get("device_name"),
        gpu_uuid=env.get("gpu_uuid"), gpu_index=None if env.get("gpu_index") is None else str(env["gpu_index"]),
        driver=None if env.get("driver") is None else str(env["driver"]),
        sm_clock_mhz=_num(before.get("sm_clock_mhz")), sm_clock_mhz_after=_num(after.get("sm_clock_mhz")),
        sm_clock_max_mhz=_num(before.get("sm_clock_max_mhz") or env.get("sm_clock_max_mhz")),
        gpu_util_pct_after=_num(after.get("gpu_util_pct")), temperature_c=_num(after.get("temperature_c")),
        torch=env.get("torch"), triton=env.get("triton"), host=env.get("host"),
        host_cpu_busy=_num(load.get("host_cpu_busy")), load_avg_1m=_num(load.get("load_avg_1m")),
        wall_s=_num(answer.get("wall_s")), attempts=int(attempts),
        workers_per_gpu=env.get("workers_per_gpu") if isinstance(env.get("workers_per_gpu"), int) else None,
        phase_s=json.dumps(answer["phase_s"]) if isinstance(answer.get("phase_s"), dict) else None,
        measured_utc=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), has_report=False,
        key_fields=json.dumps(fields, sort_keys=True))
    report = answer.get("report")
    if isinstance(report, dict):
        rec["has_report"] = True
        rec.update(_verdict_columns("", report.get("verdict")))
        v = report.get("verdict") or {}
        rec.update(speedup_low=rec.pop("low"), speedup_high=rec.pop("high"), p_value=_num(v.get("p_value")),
                   rounds=v.get("n") if isinstance(v.get("n"), int) else None, decided=bool(v.get("decided")),
                   verdict_note=str(v.get("note") or "") or None)
        for side in ("unfused", "fused"):
            m = report.get(side) or {}
            lat = m.get("latency") or {}
            rec[f"{side}_ms"], rec[f"{side}_p20"], rec[f"{side}_p80"] = (_num(lat.get("median")), _num(lat.get("p20")),
                                                                       _num(lat.get("p80")))
            peak = m.get("peak_memory_bytes")
            rec[f"peak_{side}_bytes"] = peak if isinstance(peak, int) else None
        model, plan = report.get("model") or {}, report.get("plan") or {}
        rec["chains_detected"] = model.get("chains_detected")
        rec["chains_accepted"] = len(plan.get("accepted") or [])
        rec["duration_s"] = _num(report.get("duration_s"))
        extra = (report.get("environment") or {}).get("extra") or {}
        for field in ("waited_s", "held_s", "acquired_at", "released_at"):
            rec[f"lock_{field}"] = _num(extra.get(f"gpu_lock_{field}"))
        pairs = _baseline_medians(report)
        for b in report.get("baselines") or []:
            name = b.get("name") if isinstance(b, dict) else None
            if name in BASELINE_COLUMNS:
                cols = _verdict_columns(f"vs_{name}_", b.get("verdict"))
                cols[f"vs_{name}_ms"], cols[f"vs_{name}_fused_ms"] = pairs[name]
                if b.get("error"):
                    cols[f"vs_{name}_verdict"] = NOT_MEASURED
                rec.update(cols)
    for k in ("low", "high"):
        rec.pop(k, None)
    return rec


def _model_label(model: str) -> str:
    from explorer.sweeps.spec import model_label

    return model_label(model)


def check_record(rec: Any, where: str) -> dict[str, Any]:
    """A record read back, every field of its declared type (``SCHEMA``); one line naming ``where`` otherwise.
    Fields a newer writer added are dropped; missing ones are None."""
    if not isinstance(rec, dict):
        raise SweepError(f"{where}: a record must be a JSON object")
    out: dict[str, Any] = {}
    for name, types in SCHEMA.items():
        value = rec.get(name)
        if value is None:
            if name in ("key", "status", "point", "model"):
                raise SweepError(f"{where}: the record has no '{name}'")
            out[name] = None
            continue
        if isinstance(value, bool) and bool not in types:
            raise SweepError(f"{where}: field '{name}' is {json.dumps(value)}, not {types[-1].__name__}")
        if not isinstance(value, types):
            raise SweepError(f"{where}: field '{name}' has type {type(value).__name__}, not {types[-1].__name__}")
        if isinstance(value, str) and len(value) > 20000:
            raise SweepError(f"{where}: field '{name}' is longer than 20000 characters")
        out[name] = value
    if not KEY_RE.match(out["key"]):
        raise SweepError(f"{where}: key '{out['key'][:40]}' is not 32 hexadecimal digits")
    if out["status"] not in STATUSES:
        raise SweepError(f"{where}: status '{out['status'][:40]}' is not one of {', '.join(STATUSES)}")
    return out


def latest(records: Iterable[dict]) -> list[dict]:
    """The last record of every key, in the order the keys first appeared."""
    by_key: dict[str, dict] = {}
    for rec in records:
        by_key[rec["key"]] = rec
    return list(by_key.values())


def parse_journal(data: bytes, where: str) -> tuple[list[dict], int]:
    """The records of a ``results.jsonl`` (all of them, in order) and how many unreadable lines were skipped
    (only the last line may be cut short; a bad line elsewhere is refused)."""
    lines = data.split(b"\n")
    records, skipped = [], 0
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        last = all(not rest.strip() for rest in lines[i:])
        try:
            value = parse_json(line, f"{where} line {i}", SweepError, MAX_LINE_BYTES)
        except SweepError:
            if last:
                skipped += 1       # a line cut short by a kill: the point is measured again
                continue
            raise
        records.append(check_record(value, f"{where} line {i}"))
    return records, skipped


def parse_table(data: bytes, where: str) -> list[dict]:
    """The records of a ``results.parquet`` (pyarrow), each checked like a journal's."""
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise SweepError(f"{where}: reading Parquet needs pyarrow (pip install pyarrow); results.jsonl needs nothing") \
            from None
    try:
        meta = pq.ParquetFile(io.BytesIO(data)).metadata   # the footer only: sizes before anything is decoded
        rows = meta.num_rows
        size = sum(meta.row_group(i).total_byte_size for i in range(meta.num_row_groups))
    except Exception as exc:  # pyarrow's errors: a file that is not Parquet, a corrupt footer
        raise SweepError(SWEEPS("readable_parquet_file", x=where, x2=' '.join(str(exc).split())[:160])) from None
    if rows > MAX_TABLE_ROWS or size > MAX_TABLE_BYTES:
        raise SweepError(f"{where}: {rows} rows, {size} bytes decoded: more than a sweep's table holds "
                         f"({MAX_TABLE_ROWS} rows, {MAX_TABLE_BYTES // 2**20} MiB)")
    try:
        table = pq.read_table(io.BytesIO(data), columns=[c for c in SCHEMA if c in meta.schema.names])
    except Exception as exc:
        raise SweepError(SWEEPS("readable_parquet_file", x=where, x2=' '.join(str(exc).split())[:160])) from None
    return [check_record(row, f"{where} row {i + 1}") for i, row in enumerate(table.to_pylist())]


def read_results(name: str, data: bytes) -> list[dict]:
    """Uploaded results (the app): a ``.jsonl`` journal or a ``.parquet`` table; the latest record per point."""
    if name.endswith(".parquet"):
        return latest(parse_table(data, name))
    if name.endswith((".jsonl", ".json")):
        return latest(parse_journal(data, name)[0])
    raise SweepError(SWEEPS("sweep_results_are_results", x=name))


# ====================================================================== the folder

def open_folder(path: str | os.PathLike, root: str | os.PathLike | None = None, create: bool = False) -> Path:
    """The real path of a sweep folder. Refused (one line): a NUL byte; with ``root``, anything that leaves it
    (``..``, an absolute path elsewhere, a link); a file; with ``create``, a non-empty folder that holds things a
    sweep does not write (so a sweep never writes into a folder of other files); without ``create``, a folder
    that is not a sweep's."""
    text = str(path)
    if "\x00" in text:
        raise SweepError("the sweep folder's name holds a NUL byte")
    if root is not None:
        base = os.path.realpath(root)
        real = os.path.realpath(os.path.join(base, text))
        if not (real == base or real.startswith(base.rstrip(os.sep) + os.sep)):
            raise SweepError(SWEEPS("sweep_folder_outside_sweeps", x=text[:200], x2=base))
    else:
        real = os.path.realpath(text)
    folder = Path(real)
    if folder.exists() and not folder.is_dir():
        raise SweepError(f"sweep folder {text[:200]} is a file, not a folder")
    if create:
        if folder.is_dir():
            others = sorted(p.name for p in folder.iterdir() if p.name not in OURS and not p.name.startswith("."))
            if others:
                raise SweepError(f"sweep folder {text[:200]} holds other files ({', '.join(others[:3])}): "
                                 "choose an empty or new folder")
        else:
            try:
                folder.mkdir(parents=True)
            except OSError as exc:
                raise SweepError(f"cannot create the sweep folder {text[:200]}: {exc.strerror or exc}") from None
        for name in (SPEC_FILE, JOURNAL, TABLE, PROGRESS, REPORTS):
            if (folder / name).is_symlink():
                raise SweepError(f"sweep folder {text[:200]}: {name} is a link; a sweep writes only its own files")
        (folder / REPORTS).mkdir(exist_ok=True)
        return folder
    if not folder.is_dir() or not ((folder / JOURNAL).is_file() or (folder / SPEC_FILE).is_file()):
        raise SweepError(SWEEPS("sweep_folder_no_it", x=text[:200], x2=JOURNAL, x3=SPEC_FILE))
    return folder


def sweep_folders(root: str | os.PathLike) -> list[str]:
    """The sweep folders directly under ``root`` or one level deeper (names relative to it), sorted."""
    base = Path(root)
    if not base.is_dir():
        return []
    found = []
    for candidate in [base, *sorted(p for p in base.iterdir() if p.is_dir()),
                      *sorted(q for p in base.iterdir() if p.is_dir() for q in p.iterdir() if q.is_dir())]:
        if (candidate / JOURNAL).is_file() or (candidate / SPEC_FILE).is_file():
            rel = os.path.relpath(candidate, base)
            found.append(rel)
    return found


def _atomic_write(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.chmod(tmp, 0o644)   # mkstemp's 0600 would make a shared sweep folder unreadable to others
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


class SweepStore:
    """Writing and reading one sweep folder (module docstring). The driver alone writes it."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.skipped_lines = 0

    @classmethod
    def create(cls, path: str | os.PathLike) -> "SweepStore":
        return cls(open_folder(path, create=True))

    @classmethod
    def open(cls, path: str | os.PathLike, root: str | os.PathLike | None = None) -> "SweepStore":
        return cls(open_folder(path, root=root))

    # ------------------------------------------------------------ reading
    def records(self) -> list[dict]:
        """Every record of the journal, in order (``parse_journal``)."""
        path = self.folder / JOURNAL
        if not path.exists():
            return []
        data = read_regular_file(path, str(path), SweepError, MAX_JOURNAL_BYTES)
        records, self.skipped_lines = parse_journal(data, JOURNAL)
        return records

    def results(self) -> list[dict]:
        """The latest record of every point; a journal written before records kept each baseline verdict's fused
        median (``vs_<b>_fused_ms``) gets it from the point's stored report (at most ``PAIR_FILL_MAX`` reports)."""
        out = latest(self.records())
        missing = [r for r in out if r.get("has_report") and any(
            r.get(f"vs_{b}_ms") is not None and r.get(f"vs_{b}_fused_ms") is None for b in BASELINE_COLUMNS)]
        for rec in missing[:PAIR_FILL_MAX]:
            try:
                report = parse_json(self.report_bytes(rec["key"]), rec["key"], SweepError)
            except SweepError:
                continue
            for name, (_ms, fused_ms) in _baseline_medians(report).items():
                if rec.get(f"vs_{name}_fused_ms") is None:
                    rec[f"vs_{name}_fused_ms"] = fused_ms
        return out

    def measured(self) -> dict[str, dict]:
        """Records with status "ok" whose report is stored, by key: the cache."""
        return {r["key"]: r for r in self.results()
                if r["status"] == "ok" and (not r["has_report"] or self.report_path(r["key"]).is_file())}

    def report_path(self, key: str) -> Path:
        if not KEY_RE.match(str(key)):
            raise SweepError(SWEEPS("point_key", x=str(key)[:40]))
        return self.folder / REPORTS / f"{key}.json"

    def report_bytes(self, key: str) -> bytes:
        return read_regular_file(self.report_path(key), f"the report of point {key}", SweepError, MAX_REPORT_BYTES)

    def spec(self) -> dict | None:
        path = self.folder / SPEC_FILE
        if not path.is_file():
            return None
        return parse_json(read_regular_file(path, SPEC_FILE, SweepError, 5 * 2**20), SPEC_FILE, SweepError)

    def progress(self, now: float | None = None) -> dict | None:
        """The folder's progress as its sweep last wrote it; one still "running" that has not been rewritten for
        ``STALE_S`` is a sweep that stopped without saying so (killed, its machine given back, the call's time
        limit), read as "interrupted" with nothing running and no time left (run the command again to resume)."""
        path = self.folder / PROGRESS
        if not path.is_file():
            return None
        try:
            value = parse_json(read_regular_file(path, PROGRESS, SweepError, 2**20), PROGRESS, SweepError)
        except SweepError:
            return None   # caught while being replaced: the next read has it
        if not isinstance(value, dict):
            return None
        updated = value.get("updated_unix")
        if value.get("status") == "running" and isinstance(updated, (int, float)) and \
                (time.time() if now is None else now) - updated > STALE_S:
            value = {**value, "status": "interrupted", "running": 0, "left_s": None}
        return value

    # ------------------------------------------------------------ writing
    def write_spec(self, value: dict) -> None:
        _atomic_write(self.folder / SPEC_FILE, json.dumps(value, indent=2, sort_keys=True))

    def append(self, record: dict, report: dict | None = None) -> None:
        """Store a point: its report first, then its line in the journal (flushed and synced), so a record that
        says it has a report always has one."""
        if report is not None:
            _atomic_write(self.report_path(record["key"]), json.dumps(report))
        line = json.dumps(record, sort_keys=True, allow_nan=False) + "\n"
        fd = os.open(self.folder / JOURNAL, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o644)
        try:
            os.write(fd, line.encode())
            os.fsync(fd)
        finally:
            os.close(fd)

    def write_progress(self, value: dict) -> None:
        _atomic_write(self.folder / PROGRESS, json.dumps(value))

    def write_table(self) -> Path | None:
        """``results.parquet`` from the latest record of every point (None without pyarrow)."""
        try:
            import pyarrow as pa
            import pyarrow.parquet as pq
        except ImportError:
            return None
        rows = self.results()
        schema = pa.schema([(name, _arrow_type(pa, types)) for name, types in SCHEMA.items()])
        table = pa.Table.from_pylist([{k: r.get(k) for k in SCHEMA} for r in rows], schema=schema)
        fd, tmp = tempfile.mkstemp(dir=self.folder, prefix=f".{TABLE}.")
        os.close(fd)
        try:
            pq.write_table(table, tmp)
            os.chmod(tmp, 0o644)
            os.replace(tmp, self.folder / TABLE)
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise
        return self.folder / TABLE


def _arrow_type(pa: Any, types: tuple[type, ...]) -> Any:
    if types == _BOOL:
        return pa.bool_()
    if types == _INT:
        return pa.int64()
    if types == _FLOAT:
        return pa.float64()
    return pa.string()
