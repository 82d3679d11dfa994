"""The package's layers, enforced: lower layers never import higher ones, and nothing imports in a cycle.

Layers, lowest first (``docs/design.md`` draws them)::

    0  pure        errors, units, vocab, report, jsonfile, childproc, words, messages (no torch, no networkx)
                   fusions.base, terminal
    1  graph       graph.*                                                  (reading ATen fx graphs)
    2  sources     sources.*           fusions.*                            (peers: neither imports the other)
    3  engine      fusion_engine                                            (detect; load → detect → fuse)
    4  runtime     runtime.*, gpu_runner, teaching.*, sweeps.*              (measuring, in a child process;
                                                                             teaching: predictions, worked examples)
    5  views       ui.* (ui.graph: the drawn graph), app, cli               (Streamlit, plotly, pyvis)

A module may import its own layer or lower ones, at module level or inside a
function alike: a function-local import of a higher layer would only hide the
same dependency. The engine and the runtime never import the UI packages.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import networkx as nx
import pytest

ROOT = Path(__file__).resolve().parents[1] / "explorer"

PURE = {"explorer", "explorer.errors", "explorer.units", "explorer.vocab", "explorer.report", "explorer.stats",
        "explorer.jsonfile", "explorer.childproc", "explorer.words", "explorer.messages", "explorer.fusions.base",
        "explorer.terminal", "explorer.launches"}
UI_PACKAGES = ("streamlit", "plotly", "pyvis")
PURE_FORBIDDEN = ("torch", "networkx", "onnx", "triton", *UI_PACKAGES)


def layer_of(module: str) -> tuple[int, str]:
    """(layer number, peer group) of an explorer module; raises for a module no layer claims."""
    if module in PURE:
        return 0, "pure"
    for prefix, layer, group in (
        ("explorer.graph.", 1, "graph"),
        ("explorer.sources", 2, "sources"),
        ("explorer.fusions", 2, "fusions"),
        ("explorer.fusion_engine", 3, "engine"),
        ("explorer.runtime", 4, "runtime"),
        ("explorer.teaching", 4, "teaching"),
        ("explorer.gpu_runner", 4, "runtime"),
        ("explorer.sweeps", 4, "runtime"),
        ("explorer.ui", 5, "views"),
        ("explorer.app", 5, "views"),
        ("explorer.cli", 5, "views"),
    ):
        if module == prefix.rstrip(".") or module.startswith(prefix if prefix.endswith(".") else prefix + "."):
            return layer, group
    raise AssertionError(f"{module} is in no layer: add it to tests/test_layers.py and docs/design.md")


def _modules() -> dict[str, Path]:
    out = {}
    for path in ROOT.rglob("*.py"):
        rel = path.relative_to(ROOT.parent).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


MODULES = _modules()


def _imports(module: str, path: Path) -> list[tuple[str, bool]]:
    """(imported module, at module level?) for every import in the file; relative imports resolved."""
    tree = ast.parse(path.read_text())
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    top_level = {id(n) for n in tree.body}
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(a.name, id(node) in top_level) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
            names = [f"{base}.{a.name}" for a in node.names]
            # "from explorer.fusions import conv" imports a submodule; "from x import name" imports x
            out += [(n if n in MODULES else base, id(node) in top_level) for n in names]
    return out


@functools.lru_cache(maxsize=1)  # every file parsed once per run, not once per parametrized test
def _explorer_edges() -> tuple[tuple[str, str, bool], ...]:
    edges = []
    for module, path in MODULES.items():
        for target, top in _imports(module, path):
            if target.startswith("explorer") and target != module:
                while target not in MODULES and "." in target:
                    target = target.rpartition(".")[0]
                if target in MODULES and target != module:
                    edges.append((module, target, top))
    return tuple(edges)


def test_every_module_has_a_layer_and_a_docstring():
    for module, path in MODULES.items():
        layer_of(module)
        if path.read_text().strip():
            assert ast.get_docstring(ast.parse(path.read_text())), f"{module} has no module docstring"


@pytest.mark.parametrize("module", sorted(MODULES))
def test_no_import_of_a_higher_layer(module):
    mine, group = layer_of(module)
    for src, target, top in _explorer_edges():
        if src != module:
            continue
        theirs, their_group = layer_of(target)
        where = "at module level" if top else "inside a function"
        assert theirs <= mine, f"{module} (layer {mine}) imports {target} (layer {theirs}) {where}"
        if theirs == mine == 2:
            assert group == their_group, f"{module} and {target} are peers: neither may import the other"


def test_pure_modules_import_nothing_heavy():
    for module in PURE & set(MODULES):
        for target, _ in _imports(module, MODULES[module]):
            assert not target.startswith(PURE_FORBIDDEN), f"{module} imports {target}"


def test_engine_and_runtime_never_import_ui_packages():
    for module, path in MODULES.items():
        if layer_of(module)[0] >= 5:
            continue
        for target, _ in _imports(module, path):
            assert not target.startswith(UI_PACKAGES), f"{module} imports {target}"


def test_no_import_cycles():
    graph = nx.DiGraph((a, b) for a, b, top in _explorer_edges() if top)
    cycles = [c for c in nx.strongly_connected_components(graph) if len(c) > 1]
    # a package's __init__ importing its own submodules is not a cycle of code
    cycles = [c for c in cycles if not all(m.startswith(min(c, key=len)) for m in c)]
    assert not cycles, f"import cycles: {cycles}"


def _family_names() -> tuple[str, ...]:
    """``explorer.fusions.FAMILY_NAMES``, read from its source (no torch import)."""
    tree = ast.parse(MODULES["explorer.fusions"].read_text())
    for node in tree.body:
        if isinstance(node, ast.AnnAssign) and getattr(node.target, "id", None) == "FAMILY_NAMES":
            return tuple(ast.literal_eval(node.value))
    raise AssertionError("explorer/fusions/__init__.py declares no FAMILY_NAMES")


def _declared_extensions(path: Path) -> tuple[str, ...]:
    """The families a family module says it extends (``EXTENDS = "rms_norm"`` or a tuple of names)."""
    for node in ast.parse(path.read_text()).body:
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
        if any(getattr(t, "id", None) == "EXTENDS" for t in targets):
            value = ast.literal_eval(node.value)
            return (value,) if isinstance(value, str) else tuple(value)
    return ()


def test_a_family_imports_no_other_family_but_the_one_it_extends():
    """Kernels stand apart (issue 21): a family module imports shared modules (``fusions.kernels``, ``base``,
    ``edit``, ``claims``, ...), never another family's internals, except the family it declares it extends
    (``EXTENDS``: a variant of that family over the same chains, e.g. the RMSNorm γ fold)."""
    families = {f"explorer.fusions.{name}": name for name in _family_names()}
    assert set(families) <= set(MODULES), sorted(set(families) - set(MODULES))
    problems = []
    for src, target, _top in _explorer_edges():
        if src in families and target in families:
            extends = _declared_extensions(MODULES[src])
            if families[target] not in extends:
                problems.append(f"{families[src]} imports the family {families[target]} (EXTENDS: {extends or 'none'})")
    for module, name in families.items():
        for parent in _declared_extensions(MODULES[module]):
            assert parent in families.values() and parent != name, f"{name} extends {parent!r}, not another family"
    assert not problems, "\n".join(sorted(set(problems)))
