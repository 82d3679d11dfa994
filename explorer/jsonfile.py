"""Reading JSON that a user hands us (plans, run reports, configs inside model files), safely.

Python's ``json`` module reads whatever it is given: a FIFO blocks it forever,
``/dev/zero`` fills the memory, and an array nested 100,000 deep raises
``RecursionError`` from inside the parser (or from any recursive walk done
afterwards). This module is the one door for such text:

- ``read_json_file(path, what, max_bytes)`` opens regular files only (no FIFO,
  character device, socket or directory: checked on the opened descriptor, so
  a swap after the check changes nothing), reads at most ``max_bytes + 1``
  bytes, and parses them with ``parse_json``;
- ``parse_json(data, what, max_bytes, max_depth)`` decodes UTF-8, measures the
  nesting depth with a linear scan *before* parsing (no recursion, strings and
  escapes skipped properly), and only then calls ``json.loads``.

Every failure is an ``ExplorerError`` subclass (the caller chooses which)
whose message is one line naming ``what``. Nothing here imports the engine.
"""

from __future__ import annotations

import json
import os
import stat
from typing import Any, BinaryIO

from explorer.errors import ExplorerError
from explorer.messages import JSON

MAX_JSON_BYTES = 50 * 2**20
MAX_JSON_DEPTH = 64


def _one_line(text: str, limit: int = 200) -> str:
    return " ".join(str(text).split())[:limit]


def nesting_depth(text: str | bytes) -> int:
    """The deepest nesting of ``[``/``{`` in JSON text, ignoring brackets inside strings.

    Linear in the length of ``text``, no recursion; malformed text gets a
    best-effort answer (the parser reports the malformation itself).
    """
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    depth = deepest = 0
    in_string = escaped = False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            if depth > deepest:
                deepest = depth
        elif ch in "]}":
            depth = max(depth - 1, 0)
    return deepest


def _reject_constant(name: str) -> Any:
    raise ValueError(f"'{name}' is not JSON")


def parse_json(data: bytes | str, what: str, error: type[ExplorerError] = ExplorerError,
               max_bytes: int = MAX_JSON_BYTES, max_depth: int = MAX_JSON_DEPTH,
               allow_nan: bool = False) -> Any:
    """Parse JSON text from an untrusted source; returns the value.

    ``what`` names the text in messages ("plan plan.json"); ``error`` is the
    ``ExplorerError`` subclass raised (one line) when the text is too large, not
    UTF-8, nested deeper than ``max_depth`` or not JSON. ``NaN``/``Infinity``
    are refused (they are not JSON) unless ``allow_nan`` (run reports may hold them).
    """
    if len(data) > max_bytes:
        raise error(JSON("too_big", what=what, size=len(data) / 2**20, limit=max_bytes / 2**20))
    if isinstance(data, bytes):
        try:
            data = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise error(JSON("not_utf8", what=what, reason=_one_line(exc))) from None
    depth = nesting_depth(data)
    if depth > max_depth:
        raise error(JSON("too_deep", what=what, depth=depth, limit=max_depth))
    try:
        if allow_nan:
            return json.loads(data)
        return json.loads(data, parse_constant=_reject_constant)
    except (ValueError, RecursionError) as exc:
        raise error(JSON("not_json", what=what, reason=_one_line(exc))) from None


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return JSON("a_directory")
    if stat.S_ISFIFO(mode):
        return JSON("a_fifo")
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return JSON("a_device")
    if stat.S_ISSOCK(mode):
        return JSON("a_socket")
    return JSON("not_regular_kind")


def open_regular_file(path: str | os.PathLike, what: str, error: type[ExplorerError] = ExplorerError) -> BinaryIO:
    """Open ``path`` for binary reading if, once opened, it is a regular file; raises ``error`` (one line).

    Opens with ``O_NONBLOCK`` so that a FIFO cannot block the open itself, then
    checks the opened descriptor (not the name, which could be swapped): a
    FIFO, a device such as ``/dev/zero``, a socket or a directory is refused
    before a byte is read. The caller closes the returned file.
    """
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0)
    try:
        fd = os.open(os.fspath(path), flags)
    except ValueError:  # a NUL byte in the path
        raise error(JSON("nul", what=what)) from None
    except OSError as exc:
        raise error(JSON("cannot_read", what=what, reason=exc.strerror or _one_line(exc))) from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise error(JSON("not_regular", what=what, kind=_kind(mode)))
        if hasattr(os, "set_blocking"):
            os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_regular_file(path: str | os.PathLike, what: str, error: type[ExplorerError] = ExplorerError,
                      max_bytes: int = MAX_JSON_BYTES) -> bytes:
    """The bytes of a regular file (``open_regular_file``), at most ``max_bytes`` of them; raises
    ``error`` (one line) when it is larger or unreadable."""
    with open_regular_file(path, what, error) as handle:
        try:
            size = os.fstat(handle.fileno()).st_size
            if size > max_bytes:
                raise error(JSON("too_big", what=what, size=size / 2**20, limit=max_bytes / 2**20))
            data = handle.read(max_bytes + 1)
        except OSError as exc:
            raise error(JSON("cannot_read", what=what, reason=exc.strerror or _one_line(exc))) from None
    if len(data) > max_bytes:
        raise error(JSON("grew", what=what, limit=max_bytes / 2**20))
    return data


def read_json_file(path: str | os.PathLike, what: str, error: type[ExplorerError] = ExplorerError,
                   max_bytes: int = MAX_JSON_BYTES, max_depth: int = MAX_JSON_DEPTH,
                   allow_nan: bool = False) -> Any:
    """Read and parse a JSON file a user names (``read_regular_file`` then ``parse_json``)."""
    data = read_regular_file(path, what, error, max_bytes)
    return parse_json(data, what, error, max_bytes, max_depth, allow_nan)
