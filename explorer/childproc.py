"""Child processes that answer in JSON lines: the plumbing the runner and the isolated loader share.

Two places run work in a child process so that its failure cannot take the caller down: the
measurement (``explorer.runtime.child``) and the first load of an untrusted file
(``explorer.sources.isolate``). Both start ``python -m <module>`` with this package importable
(``child_env``), in a session of its own so that a kill reaches everything the child started
(``start``, ``kill``), and read its answers as JSON objects, one a line (``parse_message``). On
the child's side the real stdout belongs to that protocol (``take_stdout``): whatever else the
work prints goes to stderr. ``signal_name`` names the signal that ended a child, for the one
line a caller reports. The protocols themselves (which messages, what a failure says) stay
with their modules.

Layer 0: no torch.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import IO, Any, Callable

#: The folder that holds the ``explorer`` package: first on the child's ``PYTHONPATH``.
ROOT = str(Path(__file__).resolve().parents[1])


def child_env() -> dict[str, str]:
    """This process's environment, with ``ROOT`` first on ``PYTHONPATH`` so that the child imports
    this same ``explorer`` (a checkout run in place, not only an installed one)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = ROOT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def start(argv: list[str], env: dict[str, str], stderr: IO[bytes]) -> subprocess.Popen:
    """Start ``python <argv>`` with pipes for stdin and stdout and ``stderr`` as its stderr, in a new
    process session (``kill`` then ends its whole process group). Raises ``OSError`` as ``Popen`` does."""
    return subprocess.Popen([sys.executable, *argv], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=stderr, env=env, start_new_session=True)


#: How long ``kill`` waits for the rest of a killed child's process group (its own children, reparented and
#: reaped by the system once dead) to be gone.
GROUP_GONE_S = 5.0


def kill(proc: subprocess.Popen) -> None:
    """Kill the child and its process group (its own session, from ``start``), reap it, and wait (at most
    ``GROUP_GONE_S``) until no process of the group is left: a sweep's workers die with their parent but are
    reaped by the system a moment later, and a caller that reports the task ended means the whole group."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except OSError:  # gone already, or not ours: the child alone
        try:
            proc.kill()
        except OSError:
            pass
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass
    wait_group_gone(proc.pid)


def wait_group_gone(pgid: int, timeout_s: float = GROUP_GONE_S) -> bool:
    """Wait (at most ``timeout_s``) until no process of group ``pgid`` is left; True when none is."""
    end = time.monotonic() + timeout_s
    while True:
        try:
            os.killpg(pgid, 0)
        except OSError:              # ProcessLookupError: the group is gone (PermissionError: not ours to wait on)
            return True
        if time.monotonic() >= end:
            return False
        time.sleep(0.01)


def parse_message(raw: bytes) -> dict | None:
    """One line of the child's stdout as a message (a JSON object), or None for anything else."""
    try:
        message = json.loads(raw.decode("utf-8", "replace"))
    except ValueError:
        return None
    return message if isinstance(message, dict) else None


def signal_name(signum: int) -> str:
    """``SIGKILL`` for 9: the name of the signal that ended a child (exit status ``-signum``)."""
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def take_stdout(default: Callable[[Any], Any] | None = None) -> Callable[[dict], None]:
    """The child's side: keep the real stdout for the protocol, send everything else printed to stderr.

    Returns ``send(message)``, which writes ``message`` as one JSON line on the real stdout and
    flushes it; ``default`` is ``json.dumps``'s, for values JSON has no type for.
    """
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr

    def send(message: dict) -> None:
        proto.write(json.dumps(message, default=default) + "\n")
        proto.flush()

    return send
