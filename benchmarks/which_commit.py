"""Which commit a benchmark result was measured with: its ``code`` fingerprint (``_common.code_fingerprint``, written
by ``run_stamp`` into every result) against each commit's, newest first.

The GPU machine gets a copy of the working tree without git, so a result cannot name its commit; it names the
SHA-256 of its code's paths and git blob ids instead, which this script recomputes per commit from ``git ls-tree``.

Usage::

    python3 benchmarks/which_commit.py benchmarks/results/RESULT.json [--max-commits 500]
    python3 benchmarks/which_commit.py SHA256

Prints the matching commit (and its subject), or says that none of the last ``--max-commits`` matches (the run was
made from uncommitted changes, or from older code). Exit status 0 when one matches, 1 otherwise, 2 for bad input.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._common import ROOT, commit_fingerprint  # noqa: E402


def wanted_fingerprint(arg: str) -> str:
    """The fingerprint a result file carries, or the one given; ValueError (one line) for anything else."""
    if re.fullmatch(r"[0-9a-f]{64}", arg):
        return arg
    path = Path(arg)
    if not path.is_file():
        raise ValueError(f"{arg}: neither a result file nor a 64-hex-digit fingerprint")
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise ValueError(f"{arg}: not a JSON result ({type(exc).__name__})") from None
    code = doc.get("code") if isinstance(doc, dict) else None
    sha = code.get("sha256") if isinstance(code, dict) else None
    if not isinstance(sha, str) or not re.fullmatch(r"[0-9a-f]{64}", sha):
        raise ValueError(f"{arg}: carries no code fingerprint (written before run_stamp recorded one)")
    return sha


def find(sha: str, max_commits: int, root: Path = ROOT) -> str | None:
    """The newest of the last ``max_commits`` commits whose code has fingerprint ``sha``."""
    commits = subprocess.run(["git", "-C", str(root), "rev-list", f"--max-count={max_commits}", "HEAD"],
                             capture_output=True, text=True, check=True).stdout.split()
    return next((c for c in commits if commit_fingerprint(c, root)["sha256"] == sha), None)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("result", help="a result JSON, or a fingerprint")
    ap.add_argument("--max-commits", type=int, default=500)
    args = ap.parse_args(argv)
    try:
        sha = wanted_fingerprint(args.result)
    except ValueError as exc:
        print(f"which_commit: {exc}", file=sys.stderr)
        return 2
    commit = find(sha, args.max_commits)
    if commit is None:
        print(f"no commit of the last {args.max_commits} has code {sha[:12]}: uncommitted changes, or older code")
        return 1
    subject = subprocess.run(["git", "-C", str(ROOT), "log", "-1", "--format=%h %ad %s", "--date=short", commit],
                             capture_output=True, text=True, check=True).stdout.strip()
    print(f"{commit} {subject[:120]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
