"""Load a script of ``benchmarks/`` as a module in a test: the folder is not a package, and the scripts are
run as files (``python benchmarks/<name>.py``), so the tests execute them freshly with ``importlib``."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]


def load(name: str, module_name: str | None = None) -> ModuleType:
    """``benchmarks/<name>.py``, freshly executed, registered in ``sys.modules`` as ``module_name`` (default
    ``name``): its dataclasses look their module up there while it executes."""
    spec = importlib.util.spec_from_file_location(module_name or name, ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def fused_smoke_case(key: str):
    """``bench_measured``'s smoke case ``key`` (``SMOKE_CASES``: a folder the script writes, seeded), loaded and
    fused with every chain on the CPU: ``(model, fused graph)``, the graph before ``prepare_graph``."""
    import tempfile

    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from benchmarks import bench_measured as bm
    from explorer.fusion_engine import fuse
    from explorer.fusions.plan import make_plan

    with tempfile.TemporaryDirectory() as tmp:
        analysis = bm.load_case(bm.SMOKE_CASES[key], Path(tmp))
    model, _graph, det = analysis
    return model, fuse(analysis, make_plan(det, "all"), "cpu").gm
