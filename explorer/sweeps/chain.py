"""When does one fusion stop paying? A chain over batch sizes and dtypes, measured as a sweep.

The Learn page asks it of the loaded model's chosen chain. ``sweep_chain`` builds the sweep (the model at each
batch size and dtype, with the plan ``chain:<id>``: that chain accepted alone, ``worker.one_chain_plan``; each
chain timed alone, ``per_chain``) and runs it with ``runner.run_sweep`` on the local backend, so every point is
measured by ``gpu_runner.run`` in worker processes and the runner's child: nothing is timed in the caller's
process (the Learn page's task child, ``runtime.teach_tasks``, which loads no model either). Each point of the answer (``runtime.sweep.SweepPoint``) is the chain's own result from
the point's report: its unfused and fused medians with their p20-p80, the speed-up, the byte model's traffic,
and the report's paired-test verdict (``verdict``); a point that failed carries its one-line reason.

Until its first point is measured, the runner cannot say how long the rest will take: the sweep prices its points
from the last sweep of this model on this machine (``runtime.progress.CostMemory``), else from starting a measuring
process and loading the model, so its progress says the time left from the start.

The sweep folder is a temporary one unless ``folder`` is given (then a re-run reads the points measured already;
the Learn page gives a new one under the Sweeps page's root, which opens it there).
"""

from __future__ import annotations

import json
import shutil
import tempfile
import threading
import time
from typing import Callable, Sequence

from explorer.messages import PROGRESS
from explorer.errors import ExplorerError
from explorer.report import Report
from explorer.runtime.progress import PRIOR_CHILD_START_S, PRIOR_LOAD_S, CostMemory, child_load_key, with_left
from explorer.runtime.sweep import SweepPoint, verdict_fields
from explorer.sweeps.runner import run_sweep
from explorer.sweeps.spec import PlanSpec, SweepSettings, SweepSpec
from explorer.sweeps.store import SweepStore
from explorer.sweeps.worker import CHAIN_PREFIX


def chain_spec(source: str, chain_id: str, batches: Sequence[int], dtypes: Sequence[str], device: str = "cpu",
               seq_len: int | None = None, warmup: int | None = None, reps: int | None = None) -> SweepSpec:
    """The sweep of one chain (module docstring). ``warmup``/``reps`` None: the runner's adaptive timing, so that
    each point's chain takes rounds until its paired test decides (or its budget runs out: "undecided"), as in a
    run; fixed repetitions would leave most points undecided, or decided by too few rounds."""
    label = CHAIN_PREFIX + chain_id
    return SweepSpec(models=(source,), plans=(PlanSpec(label, accept=label),),
                     batches=tuple(sorted({int(b) for b in batches})), dtypes=tuple(dtypes),
                     seq_lens=(int(seq_len),) if seq_len else (),
                     settings=SweepSettings(device=device, per_chain=True, stages=False, warmup=warmup, reps=reps,
                                            cpu_threads=1 if device == "cpu" else None))


def sweep_chain(source: str, chain_id: str, batches: Sequence[int], dtypes: Sequence[str], device: str = "cpu",
                seq_len: int | None = None, on_step: Callable[[float, str], None] | None = None,
                cancel: threading.Event | None = None, folder: str | None = None) -> list[SweepPoint]:
    """The chain's speed-up at every (batch, dtype), in batch order then dtype order (module docstring).
    ``on_step(fraction, status)`` follows the sweep's progress; ``cancel`` stops it (the points so far are
    returned)."""
    spec = chain_spec(source, chain_id, batches, dtypes, device, seq_len)
    where = folder or tempfile.mkdtemp(prefix="fusion-explorer-chain-sweep-")
    memory = CostMemory()
    key = f"sweep_point:{source}|{seq_len}|{device}"
    total = len(spec.batches) * len(spec.dtypes)
    started = time.monotonic()

    def progress(p) -> None:
        line = p.line()
        if p.left_s is None and p.status == "running":   # no point measured yet: price them from earlier sweeps
            per_point = memory.get(key) or (memory.get("child_start", PRIOR_CHILD_START_S)
                                            + memory.get(child_load_key(f"{source}|None|{seq_len}"), PRIOR_LOAD_S) + 5.0)
            line = with_left(line.rsplit(" · ", 1)[0], max(0.0, per_point * (p.total - p.finished)
                                                         - (time.monotonic() - started)))
        on_step(p.fraction, line)

    if on_step:   # before the workers start (seconds on a busy machine): the time the whole sweep should take
        first = memory.get(key) or (memory.get("child_start", PRIOR_CHILD_START_S)
                                    + memory.get(child_load_key(f"{source}|None|{seq_len}"), PRIOR_LOAD_S) + 5.0)
        on_step(0.0, with_left(PROGRESS("starting_sweep_worker", n=total), first * total))
    try:
        summary = run_sweep(spec, where, "local", cancel=cancel, progress=progress if on_step else None)
        store = SweepStore(summary.folder)
        points = [_point(store, rec, chain_id) for rec in summary.records]
        measured = sum(1 for rec in summary.records if rec.get("status") == "ok")
        if measured and measured == total:
            memory.record(key, (time.monotonic() - started) / measured)
    finally:
        if folder is None:
            shutil.rmtree(where, ignore_errors=True)
    order = {d: i for i, d in enumerate(spec.dtypes)}
    return sorted(points, key=lambda p: (p.batch, order.get(p.dtype, 0)))


def _point(store: SweepStore, rec: dict, chain_id: str) -> SweepPoint:
    if rec["status"] != "ok" or not rec["has_report"]:
        return SweepPoint(rec["batch"], rec["dtype"], error=rec.get("reason") or "not measured")
    try:
        report = Report.from_dict(json.loads(store.report_bytes(rec["key"])), rec["point"])
        chain = report.chain(chain_id)
    except (ExplorerError, KeyError, ValueError) as exc:
        return SweepPoint(rec["batch"], rec["dtype"], error=f"the point's report has no result for the chain ({exc})")
    u, f = chain.unfused, chain.fused
    if u is None or f is None:
        return SweepPoint(rec["batch"], rec["dtype"], bytes_unfused=chain.bytes_unfused,
                          bytes_fused=chain.bytes_fused, error=chain.reason or chain.verdict.describe())
    return SweepPoint(rec["batch"], rec["dtype"], u.median, f.median, u.p20, u.p80, f.p20, f.p80, chain.speedup,
                      chain.bytes_unfused, chain.bytes_fused, **verdict_fields(chain.verdict))
