"""The app's flows on the GPU machine, through ``streamlit.testing.v1.AppTest``, with ``device=cuda``.

The app had never run on a GPU. This script drives it as a user would, by widget key, and
checks each step: load a zoo model, reject a chain, run it on CUDA (fp16, per-chain timing,
baselines), open the Results page (charts, baselines as bars and rows, verdicts), reject the
slower chains, and export the report (JSON read back by ``explorer.report.load``, CSV parsed).
If the run found no slower chain, the "reject slower" step marks one chain slower in the
report on screen (as ``tests/test_app.py`` does on the CPU) and says so in the JSON.

The GPU machine has no UI packages: bring them as wheels (``benchmarks/fetch_ui_wheels.sh``,
carry ``.whl``) and install them first::

    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \\
        --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PYTHONPATH
    python3 benchmarks/app_on_gpu.py                     # about 2-3 min on an H200
    python3 benchmarks/app_on_gpu.py --smoke             # here, on the CPU: the same flow, device=cpu

The wheels leave out pydeck and jedi (see the fetch script); this script blocks both imports so a
CPU smoke run proves the app works without them. Writes ``$OUT/app_on_gpu.json`` (else
``benchmarks/results/app_on_gpu.json``; ``--out``) with each step's outcome and time, and prints
a table last. Without CUDA (and without ``--smoke``) it says so and exits 0.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import io
import sys
import time
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks._common import results_path, run_stamp, write_json, write_skipped  # noqa: E402

APP = str(ROOT / "explorer" / "app.py")
NOT_SHIPPED = ("pydeck", "jedi")


class Flow:
    """Steps with their outcome and time, written as JSON."""

    def __init__(self) -> None:
        self.steps: list[dict[str, Any]] = []
        self.t0 = time.perf_counter()

    def step(self, name: str, fn: Callable[[], str]) -> bool:
        start = time.perf_counter()
        try:
            detail = fn() or ""
            ok = True
        except Exception as exc:  # a failed step is recorded, the later ones still try
            import traceback

            traceback.print_exc()
            detail, ok = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''}", False
        self.steps.append({"step": name, "ok": ok, "seconds": round(time.perf_counter() - start, 1), "detail": detail})
        print(f"[{time.perf_counter() - self.t0:6.1f}s] {name}: {'ok' if ok else 'FAILED'} {detail}",
              file=sys.stderr, flush=True)
        return ok


def _check(at) -> None:
    if at.exception:
        raise AssertionError(f"app exception: {at.exception[0].value}")
    errors = [e.value for e in at.error]
    if errors:
        raise AssertionError(f"app error: {errors[0]}")


def _wait(at, timeout_s: float) -> None:
    end = time.time() + timeout_s
    while time.time() < end:
        job = at.session_state["run_job"]
        if job is None or job.done:
            break
        time.sleep(0.5)
    at.run()


def run_flow(model: str, batch: int, device: str, dtype: str, baselines: bool, timeout_s: float) -> dict:
    """The whole flow; returns the JSON-able record."""
    from streamlit.testing.v1 import AppTest

    from explorer import report as run_report
    from explorer.fusion_engine import analyze
    from explorer.ui import files as ui_files

    flow = Flow()
    state: dict[str, Any] = {}
    at = AppTest.from_file(APP, default_timeout=max(timeout_s, 300))
    _, _, det = analyze(model, batch=batch)
    ids = [c.id for c in det.chains]

    def load() -> str:
        at.session_state["zoo_name"] = model
        at.session_state["batch"] = batch
        at.run()
        at.selectbox(key="device").set_value(device).run()
        at.selectbox(key="dtype").set_value(dtype).run()
        _check(at)
        active = at.session_state["active"]
        assert active.source == model and active.batch == batch, active
        return f"{model} batch {batch}, {len(ids)} chains, device {device}, {dtype}"

    def reject() -> str:
        at.switch_page("ui/pages/fusions.py").run()
        at.selectbox(key="chain_pick").set_value(ids[0]).run()
        at.button(key="chain_reject").click().run()
        _check(at)
        accepted = at.session_state["accepted"][det.fingerprint]
        assert ids[0] not in accepted and len(accepted) == len(ids) - 1, accepted
        return f"rejected {ids[0]}"

    def run() -> str:
        at.switch_page("ui/pages/run.py").run()
        at.checkbox(key="run_per_chain").check()
        if baselines:
            at.checkbox(key="run_compile_baseline").check()
        at.run()
        at.button(key="run_start").click().run()
        assert at.session_state["run_job"] is not None, "no job started"
        _wait(at, timeout_s)
        _check(at)
        key, report = at.session_state["last_report"]
        state["report"] = report
        assert isinstance(report, run_report.Report), type(report)
        assert report.environment.is_cpu == (device == "cpu"), report.environment.device
        assert ids[0] not in report.plan.accepted
        assert report.settings["dtype"] == dtype
        return (f"{report.environment.device_name}: unfused {report.unfused.latency.median:.3f} ms, fused "
                f"{report.fused.latency.median:.3f} ms ({report.verdict.label}); chains "
                + ", ".join(f"{n} {label}" for label, n in report.verdict_counts().items() if n)
                + f"; {len(report.baselines)} baseline entries; {report.duration_s} s")

    def results() -> str:
        at.switch_page("ui/pages/results.py").run()
        _check(at)
        report = state["report"]
        drawn = {c.key for c in at.get("plotly_chart")}
        assert {"chart_compare", "chart_chain_speedup", "chart_stages"} <= drawn, drawn
        if baselines:
            names = [b.label for b in report.baselines if b.measurement is not None and b.method != "fused"]
            assert names, [b.error for b in report.baselines]
            tables = [d for d in at.dataframe if "verdict (fused vs this)" in d.value.columns]
            assert tables and len(tables[0].value) == len(report.baselines)
        return f"charts {sorted(drawn)}; baseline rows {len(report.baselines)}"

    def reject_slower() -> str:
        report = state["report"]
        slower = set(report.slower_chains)
        synthetic = not slower
        if synthetic:  # nothing slower on this GPU: mark one, as the CPU test does, to drive the button
            victim = report.chains[-1].id
            chains = tuple(dataclasses.replace(c, verdict=dataclasses.replace(c.verdict, label=run_report.SLOWER))
                           if c.id == victim else c for c in report.chains)
            report = dataclasses.replace(report, chains=chains)
            at.session_state["last_report"] = ("app_on_gpu", report)
            slower = {victim}
        at.switch_page("ui/pages/results.py").run()
        before = set(at.session_state["accepted"][det.fingerprint])
        at.button(key="reject_slower").click().run()
        _check(at)
        after = set(at.session_state["accepted"][det.fingerprint])
        assert after == before - slower, (before, after, slower)
        return f"rejected {len(slower)} slower chain(s)" + (" (marked slower by this script)" if synthetic else "")

    def export() -> str:
        at.switch_page("ui/pages/export.py").run()
        _check(at)
        buttons = {b.key for b in at.get("download_button")}
        assert {"export_report_json", "export_report_csv"} <= buttons, buttons
        report = at.session_state["last_report"][1]
        back = run_report.load(report.to_json().encode(), "exported.json")
        assert back == report
        rows = list(csv.reader(io.StringIO(ui_files.report_csv(report))))
        assert rows[0] == ["section", "name", "metric", "value"] and len(rows) > 20
        return f"JSON read back equal; CSV {len(rows)} rows"

    for name, fn in (("load", load), ("reject a chain", reject), (f"run on {device}", run), ("results", results),
                     ("reject slower", reject_slower), ("export", export)):
        if not flow.step(name, fn) and name in ("load", f"run on {device}"):
            break
    return {"model": model, "batch": batch, "device": device, "dtype": dtype, "baselines": baselines,
            "steps": flow.steps, "ok": len(flow.steps) == 6 and all(s["ok"] for s in flow.steps),
            "report": state["report"].to_dict() if "report" in state else None}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", "--quick", action="store_true", dest="smoke", help="the same flow on the CPU")
    parser.add_argument("--model", default="residual_block")
    parser.add_argument("--batch", type=int, default=None, help="default: 8 on CUDA, 2 with --smoke")
    parser.add_argument("--no-baselines", action="store_true", help="skip the torch.compile baselines")
    parser.add_argument("--timeout-s", type=float, default=420.0, help="the run's time limit (the budget)")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    for name in NOT_SHIPPED:  # not among the wheels carried to the GPU machine: prove they are not needed
        sys.modules[name] = None  # type: ignore[assignment]

    import torch

    out_path = results_path(args.out, "app_on_gpu.json")
    doc: dict[str, Any] = run_stamp()
    device = "cpu" if args.smoke else "cuda"
    if device == "cuda" and not torch.cuda.is_available():
        return write_skipped(doc, out_path, "app_on_gpu", "flow")
    import streamlit

    from explorer.runtime import measure as m

    doc["environment"] = {**m.environment(device), "streamlit": streamlit.__version__}
    result = run_flow(args.model, args.batch or (2 if args.smoke else 8), device, "fp32" if args.smoke else "fp16",
                      not args.no_baselines, args.timeout_s)
    doc.update(result)
    write_json(out_path, doc)
    env = doc["environment"]
    print(f"app on {env.get('device_name')} (streamlit {env['streamlit']}, torch {env['torch']}, "
          f"driver {env.get('driver')}), {args.model} batch {result['batch']} {result['dtype']}")
    print(f"{'step':<18}{'ok':<8}{'s':>7}  detail")
    for s in result["steps"]:
        print(f"{s['step']:<18}{'ok' if s['ok'] else 'FAILED':<8}{s['seconds']:>7.1f}  {s['detail'][:150]}")
    print(f"app flow: {'PASS' if result['ok'] else 'FAIL'}; wrote {out_path}")
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
