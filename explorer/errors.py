"""Errors the explorer raises for bad input, each carrying one readable line.

Every error a user can provoke (a corrupt file, an unknown model name, an
unsupported operator, a plan made for another model) is an ``ExplorerError``.
The command line prints ``str(err)`` on one line and exits non-zero; the app
shows it in ``st.error``. Nothing else should reach the user as a traceback.
"""

from __future__ import annotations

from explorer.messages import LOAD


class ExplorerError(Exception):
    """Base class: the message is a single line meant for the user."""

    def __init__(self, message: str) -> None:
        super().__init__(" ".join(str(message).split()))


class ModelLoadError(ExplorerError):
    """A model source could not be read, trusted or captured."""


class UnsupportedOpError(ModelLoadError):
    """An ONNX file uses operators the importer does not map onto ATen."""

    def __init__(self, op_types: list[str], path: str = "") -> None:
        self.op_types = sorted(set(op_types))
        ops = ", ".join(self.op_types)
        super().__init__(LOAD("onnx_ops_in", name=path, ops=ops) if path else LOAD("onnx_ops", ops=ops))


class PlanError(ExplorerError):
    """A fusion plan is malformed or was made for another model."""


class RunError(ExplorerError):
    """A measurement run failed (out of memory, CUDA error, crash)."""


class ReportError(ExplorerError):
    """A saved run report could not be read or is not a run report."""
