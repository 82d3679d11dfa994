"""Load an untrusted model source once in a child process first, under a memory limit and a timeout.

The loaders estimate what a file will materialise before allocating it
(``limits``); this module is the second line, for whatever slips past an
estimate: a parser that allocates more than the data it returns, a graph
whose size the metadata understates, a pathological file that makes a
library loop. ``probe(source, batch, seq_len, data_path)`` runs
``python -m explorer.sources.isolate`` with the request as JSON on stdin; the
child imports what the source kind needs, then lowers its own address-space
limit (``RLIMIT_AS``) to its size at that moment (the interpreter and its
libraries) plus the memory budget, plus twice the source's bytes on disk
(``PARSE_COPIES``: the bytes a parser read and the message it parsed from
them, alive together) and ``LIMIT_SLACK`` for allocator arenas and
thread stacks, and loads the source with the same ``load_model`` the caller
uses. It parses what the caller never parses: the caller reads only
fixed-size headers (``sources.precheck``); the ``.pt2`` zip directory and
program JSON, the ONNX protobuf, the Hugging Face configs and safetensors
headers are parsed here first, so a file whose parse amplifies (a 160 KB
archive holding 96 MiB of ``[{"":{}},...]``) costs the child its limit, never
the caller its memory. It answers one JSON line on its stdout: ``{"ok": true}`` or
``{"error": "one line"}``. The caller kills the child's process group at the
load timeout (``limits.load_timeout_s``). Any failure, a crash or a kill
included, becomes one ``ModelLoadError`` line; only after the child succeeded
does the caller load the source itself (its loaders repeat the same checks).

Why probe and then load again, instead of handing the loaded graph back? The
graph would have to cross the process boundary in some serialised form, and
the only ones that carry an fx ``GraphModule`` whole (pickle, which rebuilds
the module by executing generated code; ``torch.export`` archives, whose
loader is what ``pt2`` works around) are themselves the attack surface. A
second load costs one more process start and parse, paid once per file,
batch and sequence length (``probe`` remembers successes) and only for files,
never for the zoo. A child that a payload took over could still answer "ok":
the probe protects the caller's memory and time, not its integrity, which is
what the loaders' refusal to run code from a file is for.

The probe child sets ``CHILD_ENV`` so that its own ``load_model`` does not
probe again. Starting and killing the child and its stdout protocol are
``explorer.childproc``'s, shared with the runner's child.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

from explorer.childproc import child_env, kill, parse_message, signal_name, start, take_stdout
from explorer.errors import ExplorerError, ModelLoadError
from explorer.sources import limits

CHILD_ENV = "FUSION_EXPLORER_LOAD_CHILD"
PROBED_ENV = "FUSION_EXPLORER_LOADS_PROBED"  # digests of probed (file, size, mtime, ...) keys, for child processes
PARSE_COPIES = 2  # a parser holds the bytes it read and what it parsed from them (an ONNX message) at once
LIMIT_SLACK = 256 * 2**20  # beyond the budget and the file's bytes: malloc arenas and thread stacks
ARENAS_ENV = "MALLOC_ARENA_MAX"  # glibc reserves 64 MiB of address space per arena; the child needs two
_probed: set[tuple] = set()
_probed_lock = threading.Lock()


def in_child() -> bool:
    """Whether this process is a probe child (its loads are not probed again)."""
    return os.environ.get(CHILD_ENV) == "1"


def _key(source: str, batch: int | None, seq_len: int | None, data_path: str | None) -> tuple:
    parts: list[Any] = [os.path.realpath(source), batch, seq_len, data_path, limits.memory_budget()]
    path = Path(source)
    files = [path] + (sorted(path.iterdir()) if path.is_dir() else [])
    for f in files[:1000]:
        try:
            st = os.stat(f)
            parts.append((f.name, st.st_size, st.st_mtime_ns))
        except OSError:
            parts.append((f.name, None))
    return tuple(parts)


def _digest(key: tuple) -> str:
    return hashlib.sha256(repr(key).encode()).hexdigest()[:32]


def _known(key: tuple) -> bool:
    with _probed_lock:
        return key in _probed or _digest(key) in os.environ.get(PROBED_ENV, "").split()


def _remember(key: tuple) -> None:
    """Remember a successful probe here and for child processes started later (the runner's child
    loads the same file again: its key, with the file's size and mtime, says it was probed)."""
    with _probed_lock:
        _probed.add(key)
        digests = [d for d in os.environ.get(PROBED_ENV, "").split() if d != _digest(key)]
        os.environ[PROBED_ENV] = " ".join((digests + [_digest(key)])[-64:])


def probe(source: str, batch: int | None = None, seq_len: int | None = None,
          data_path: str | None = None) -> None:
    """Load ``source`` in a limited child process; return when it loaded, else raise one line.

    Raises ``ModelLoadError`` naming the cause: the child's own error line, the
    memory limit, a crash (signal), or the timeout.
    """
    if in_child():
        return
    key = _key(source, batch, seq_len, data_path)
    if _known(key):
        return
    name = Path(source).name or source
    payload = json.dumps({"source": source, "batch": batch, "seq_len": seq_len, "data_path": data_path})
    env = child_env()
    env[CHILD_ENV] = "1"
    env[limits.WEIGHTS_ONLY_ENV] = "1"
    env.pop("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", None)
    env.setdefault("PYTHONWARNINGS", "ignore")
    env[ARENAS_ENV] = "2"
    timeout = limits.load_timeout_s()
    with tempfile.TemporaryFile() as err_file:
        try:
            proc = start(["-m", "explorer.sources.isolate"], env, err_file)
        except OSError as exc:
            raise ModelLoadError(f"{name}: could not start the isolated loader: {exc.strerror}") from None
        try:
            out, _ = proc.communicate(payload.encode(), timeout=timeout)
        except subprocess.TimeoutExpired:
            kill(proc)
            raise ModelLoadError(f"{name}: loading took longer than {timeout:g} s and was stopped "
                                 f"(set {limits.LOAD_TIMEOUT_ENV} to allow more)") from None
        finally:
            if proc.poll() is None:
                kill(proc)
        message = _last_message(out)
        if message.get("ok") is True and proc.returncode == 0:
            _remember(key)
            return
        if isinstance(message.get("error"), str):
            raise ModelLoadError(message["error"])
        raise ModelLoadError(_crash_line(name, proc.returncode))


def _last_message(out: bytes) -> dict:
    """The child's last message on ``out`` (its stdout), or ``{}``."""
    for raw in reversed(out.splitlines()):
        message = parse_message(raw)
        if message is not None:
            return message
    return {}


def _crash_line(name: str, code: int | None) -> str:
    budget = limits.gib(limits.memory_budget())
    if code is not None and code < 0:
        return (f"{name}: the isolated loader was killed by {signal_name(-code)} (limit: the memory budget of {budget} beyond its "
                "libraries); the file needs more than it declares, or is malformed")
    return f"{name}: the isolated loader failed with exit status {code} (limit {budget} of memory beyond its libraries)"


def _vm_size() -> int:
    """This process's address-space size in bytes (``VmSize``)."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmSize:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def limit_address_space(extra_bytes: int) -> int:
    """Lower ``RLIMIT_AS`` to the current size plus ``extra_bytes`` (never above an inherited hard limit);
    returns the limit set, or 0 where the platform offers none."""
    try:
        import resource
    except ImportError:
        return 0
    size = _vm_size()
    if not size:
        return 0
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    want = size + int(extra_bytes)
    if hard != resource.RLIM_INFINITY:
        want = min(want, hard)
    resource.setrlimit(resource.RLIMIT_AS, (want, hard))
    return want


def _import_for(source: str) -> None:
    """Import the libraries this source kind needs before the limit is set (they are not the file's cost)."""
    import torch  # noqa: F401

    import explorer.sources  # noqa: F401

    path = Path(source)
    if path.is_dir():
        import transformers  # noqa: F401
        from transformers import AutoConfig, AutoModel  # noqa: F401
    elif path.suffix.lower() == ".onnx":
        import onnx  # noqa: F401
        import numpy  # noqa: F401
    elif path.suffix.lower() == ".pt2":
        from torch._export.serde import serialize  # noqa: F401
        from torch._subclasses import fake_tensor  # noqa: F401
        from torch.fx.experimental import symbolic_shapes  # noqa: F401

        from explorer.sources import pt2, pure_ops  # noqa: F401


def source_bytes(source: str) -> int:
    """Bytes of the source on disk: the file, or a folder's files (not followed below it)."""
    path = Path(source)
    try:
        if not path.is_dir():
            return os.stat(path).st_size
        return sum(os.stat(f).st_size for f in list(path.iterdir())[:10_000] if f.is_file())
    except OSError:
        return 0


def child_main() -> int:
    """``python -m explorer.sources.isolate``: one request on stdin, one JSON line on stdout."""
    send = take_stdout()
    request: dict = {}
    try:
        request = json.loads(sys.stdin.read() or "{}")
        source = str(request["source"])
        _import_for(source)
        limits.force_weights_only()
        import torch

        torch.set_num_threads(1)  # a load computes little; each thread costs a stack and an arena
        budget = limits.memory_budget()
        limit_address_space(budget + PARSE_COPIES * min(source_bytes(source), budget) + LIMIT_SLACK)
        from explorer.sources import load_model

        load_model(source, batch=request.get("batch"), seq_len=request.get("seq_len"),
                   data_path=request.get("data_path"))
        send({"ok": True})
    except ExplorerError as exc:
        send({"error": str(exc)})
    except MemoryError:
        send({"error": f"{Path(str(request.get('source', ''))).name}: loading it ran out of the isolated "
                       "loader's memory limit"})
    except (Exception, RecursionError) as exc:
        first = " ".join(str(exc).split())[:240] or type(exc).__name__
        if "allocate" in first or "out of memory" in first.lower():
            send({"error": f"loading ran out of the isolated loader's memory limit: {first}"})
        else:
            send({"error": f"could not load the model: {type(exc).__name__}: {first}"})
    return 0


if __name__ == "__main__":
    sys.exit(child_main())
