"""``docs/design.md``'s tree is the package: every module it names exists, and every module of the package is named.

The tree is the first code block after "## The tree is the architecture": a line is its indentation (two spaces
a level), its names (``x.py``, ``dir/``, separated by single spaces), then, after two spaces or more, what they
hold. A module's directory is the last directory line above it one level up.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def documented_modules(text: str) -> set[str]:
    """The paths (``explorer/fusions/kernels/gemm.py``) the design document's tree names."""
    section = text.split("## The tree is the architecture", 1)[1]
    block = section.split("```", 2)[1]
    stack: list[str] = []
    found = set()
    for line in block.splitlines():
        if not line.strip():
            continue
        indent = len(line) - len(line.lstrip(" "))
        depth = indent // 2
        names = re.split(r" {2,}", line.strip(), maxsplit=1)[0].split(" ")
        for name in names:
            if name.endswith("/"):
                stack = stack[:depth] + [name.rstrip("/")]
            elif name.endswith(".py"):
                found.add("/".join([*stack[:depth], name]))
    return found


def package_modules() -> set[str]:
    return {str(p.relative_to(ROOT)) for p in (ROOT / "explorer").rglob("*.py")}


def test_the_tree_names_every_module_and_only_modules_that_exist():
    named = documented_modules((ROOT / "docs" / "design.md").read_text())
    missing, stale = package_modules() - named, named - package_modules()
    assert not missing, f"docs/design.md's tree does not name: {sorted(missing)}"
    assert not stale, f"docs/design.md's tree names modules that do not exist: {sorted(stale)}"


def test_the_reader_reads_a_tree():
    text = ("## The tree is the architecture\n\n```\nexplorer/\n  a.py b.py   two\n  pkg/   a package\n"
            "    __init__.py\n    c.py  three\n  d.py\n```\n")
    assert documented_modules(text) == {"explorer/a.py", "explorer/b.py", "explorer/pkg/__init__.py",
                                        "explorer/pkg/c.py", "explorer/d.py"}
