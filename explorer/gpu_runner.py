"""The runtime's entry point: measure a model unfused and fused, in a child process, and return one report.

``run(source, plan, settings, progress, cancel)`` is what the command line and
the app call. It runs on the GPU when there is one and on the CPU otherwise
(the report says which). The work happens in ``python -m explorer.gpu_runner
--child`` (``explorer.runtime.child``: JSON in, JSON lines out), so an
out-of-memory error, a CUDA fault or a crash ends the child, not the caller,
and reaches it as one ``RunError`` line. Inside the child,
``explorer.runtime.session.measure`` does the measurement.

This module imports no torch: the parent stays light. Never Streamlit,
plotly or pyvis either.
"""

from __future__ import annotations

import sys
import threading
from typing import Any, Callable

from explorer.errors import ReportError, RunError
from explorer.report import Report
from explorer.runtime.child import child_main, run_child
from explorer.runtime.settings import RunSettings

__all__ = ["Report", "RunSettings", "run"]


def run(source: str, plan: Any | None, settings: RunSettings,
        progress: Callable[[float, str], None] | None = None,
        cancel: threading.Event | None = None) -> Report:
    """Measure ``source`` under ``plan`` in a child process and return the typed report.

    ``plan`` is a ``Plan`` (or ``None``: every detected chain accepted).
    ``progress(fraction, status)`` is called from this thread as the child
    reports (the status ends with the estimated time left). Raises ``RunError``
    with one line on any failure, including ``RunError("cancelled")`` when
    ``cancel`` is set.
    """
    payload = {"source": str(source), "plan": plan.to_dict() if plan is not None else None,
               "settings": settings.to_dict()}
    data = run_child("explorer.gpu_runner", payload, settings.timeout_s, progress, cancel)
    try:
        return Report.from_dict(data, "the measurement's report")
    except ReportError as exc:
        raise RunError(str(exc)) from None


def _measure_in_child(payload: dict, emit: Callable[[float, str], None]) -> dict:
    """The child's work: ``explorer.runtime.session.measure`` (torch is imported here, in the child only)."""
    from explorer.runtime.session import measure  # the parent never imports torch

    settings = RunSettings.from_dict(payload.get("settings") or {})
    return measure(payload["source"], payload.get("plan"), settings, emit).to_dict()


if __name__ == "__main__":
    if "--child" in sys.argv[1:]:
        sys.exit(child_main(_measure_in_child))
    print("usage: python -m explorer.gpu_runner --child  (arguments as JSON on stdin); "
          "use the fusion-explorer CLI to run a measurement", file=sys.stderr)
    sys.exit(2)
