"""A benchmark result names the code it ran (``benchmarks/_common.code_fingerprint``), and
``benchmarks/which_commit.py`` finds that commit from git alone, in a repository the test makes."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import _common  # noqa: E402
import benchmark_scripts  # noqa: E402

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="needs git")


def _git(root: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, check=True).stdout


def _repo(root: Path) -> Path:
    """explorer/ (a package, with a nested folder), benchmark scripts and results, byte code git ignores."""
    for rel, text in (("explorer/__init__.py", '"""pkg"""\n'), ("explorer/fusions/conv.py", "X = 1\n"),
                      ("explorer/fusions/table.json", "{}\n"), ("benchmarks/bench_a.py", "print(1)\n"),
                      ("benchmarks/results/a.json", "{}\n"), ("README.md", "readme\n"), (".gitignore", "__pycache__/\n*.pyc\n")):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    _git(root, "init", "-q")
    _git(root, "add", "-A")
    _git(root, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "first")
    return root


def test_the_working_trees_fingerprint_is_its_commits(tmp_path):
    root = _repo(tmp_path)
    here = _common.code_fingerprint(root)
    assert here == _common.commit_fingerprint("HEAD", root) and here["files"] == 4     # 2 package files, 1 json, 1 script
    (root / "explorer" / "__pycache__").mkdir()
    (root / "explorer" / "__pycache__" / "conv.cpython-311.pyc").write_bytes(b"\0\1")
    (root / "benchmarks" / "results" / "b.json").write_text("[]")
    (root / "README.md").write_text("other")
    assert _common.code_fingerprint(root) == here                  # byte code, results, docs: not the code
    (root / "explorer" / "fusions" / "conv.py").write_text("X = 2\n")
    changed = _common.code_fingerprint(root)
    assert changed["sha256"] != here["sha256"]
    _git(root, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qam", "second")
    assert _common.commit_fingerprint("HEAD", root) == changed
    assert _common.commit_fingerprint("HEAD~1", root) == here


def test_which_commit_finds_a_results_commit_and_refuses_bad_input(tmp_path, capsys):
    root = _repo(tmp_path / "repo")
    first = _git(root, "rev-parse", "HEAD").strip()
    stamp = _common.code_fingerprint(root)
    (root / "explorer" / "fusions" / "conv.py").write_text("X = 3\n")
    _git(root, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qam", "second")
    which = benchmark_scripts.load("which_commit")
    assert which.find(stamp["sha256"], 10, root) == first
    assert which.find("0" * 64, 10, root) is None
    result = tmp_path / "r.json"
    result.write_text(json.dumps({"command": "x", "code": stamp}))
    assert which.wanted_fingerprint(str(result)) == stamp["sha256"]
    old = tmp_path / "old.json"
    old.write_text(json.dumps({"command": "x"}))
    for bad, words in ((str(old), "no code fingerprint"), (str(tmp_path / "none"), "neither a result"),
                       (str(tmp_path), "neither a result")):
        with pytest.raises(ValueError, match=words):
            which.wanted_fingerprint(bad)
    (tmp_path / "junk.json").write_bytes(b"\xff\xfe")
    assert which.main([str(tmp_path / "junk.json")]) == 2
    assert "which_commit: " in capsys.readouterr().err


def test_every_result_stamp_names_its_code():
    stamp = _common.run_stamp()
    assert set(stamp) == {"command", "date_utc", "code"} and len(stamp["code"]["sha256"]) == 64
    assert stamp["code"]["files"] > 100                              # this repository's package and scripts
