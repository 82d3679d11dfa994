"""The limits every untrusted model source is held to: one memory budget, one load timeout,
one rule for paths.

A file a user hands us declares sizes (input shapes, initializer lengths,
config dimensions, tensor metadata in an archive) long before anything is
allocated. Each loader estimates what it is about to materialise from those
declarations and calls ``check_budget`` first, so a few hundred bytes that
ask for 6 GB cost one line, not the machine.

Settings (environment variables, read when a load starts):

    FUSION_EXPLORER_MEMORY_BUDGET   bytes one untrusted source may materialise:
                                    weights, example inputs and the activations
                                    of one forward (default 2 GiB; "512M", "4G"
                                    and plain byte counts are accepted)
    FUSION_EXPLORER_LOAD_TIMEOUT    seconds an isolated load may take (default 180)

``inside(folder, path)`` is the path rule: every file a source reads must
resolve, after following links, to a location inside the source's folder.
``force_weights_only()`` turns on PyTorch's process-wide switch that makes
every ``torch.load`` use the weights-only unpickler, whatever its caller asked.
"""

from __future__ import annotations

import math
import os
import re
from pathlib import Path
from typing import Any, Iterable

from explorer.errors import ModelLoadError

MEMORY_BUDGET_ENV = "FUSION_EXPLORER_MEMORY_BUDGET"
LOAD_TIMEOUT_ENV = "FUSION_EXPLORER_LOAD_TIMEOUT"
DEFAULT_MEMORY_BUDGET = 2 * 2**30
DEFAULT_LOAD_TIMEOUT_S = 180.0
WEIGHTS_ONLY_ENV = "TORCH_FORCE_WEIGHTS_ONLY_LOAD"

_UNITS = {"": 1, "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}


def memory_budget() -> int:
    """Bytes one untrusted source may materialise (``FUSION_EXPLORER_MEMORY_BUDGET``, default 2 GiB)."""
    text = os.environ.get(MEMORY_BUDGET_ENV, "").strip().lower().removesuffix("ib").removesuffix("b")
    if not text:
        return DEFAULT_MEMORY_BUDGET
    match = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([kmgt]?)", text)
    if not match:
        raise ModelLoadError(f"{MEMORY_BUDGET_ENV}={os.environ[MEMORY_BUDGET_ENV]!r} is not a size "
                             "(use bytes, or a number with K, M, G)")
    return max(int(float(match.group(1)) * _UNITS[match.group(2)]), 1 << 20)


def load_timeout_s() -> float:
    """Seconds an isolated load may take (``FUSION_EXPLORER_LOAD_TIMEOUT``, default 180).

    A value that is not a finite positive number of seconds (``nan``, ``inf``, ``-5``, ``abc``) is
    refused in one line: a timeout that cannot be reached is no timeout."""
    text = os.environ.get(LOAD_TIMEOUT_ENV, "").strip()
    if not text:
        return DEFAULT_LOAD_TIMEOUT_S
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value <= 0:
        raise ModelLoadError(f"{LOAD_TIMEOUT_ENV}={text[:40]!r} is not a finite positive number of seconds")
    return max(value, 1.0)


def gib(nbytes: float) -> str:
    """``nbytes`` as a short human figure in GiB or MiB."""
    return f"{nbytes / 2**30:.1f} GiB" if nbytes >= 2**30 else f"{nbytes / 2**20:.0f} MiB"


def check_budget(nbytes: int, what: str) -> None:
    """Refuse, with one line, a source that would materialise more than the memory budget."""
    budget = memory_budget()
    if nbytes > budget:
        raise ModelLoadError(f"{what} would need {gib(nbytes)}, over the memory budget of {gib(budget)} "
                             f"(set {MEMORY_BUDGET_ENV} to allow more)")


#: What parsing JSON costs in Python objects, per byte of text that opens one: a dict ``{`` (a small
#: dict is about 200 bytes, with its key strings), a list ``[``, and each further element or value
#: (``,`` and ``:``, a pointer and usually a small object). Counted over the raw bytes, strings
#: included, so it can only overestimate. ``[{"":{}},...]`` costs about 45 bytes per byte of text.
JSON_COST_PER = {b"{": 240, b"[": 72, b",": 48, b":": 16}


def json_parse_bytes(data: bytes | str) -> int:
    """An upper estimate of the memory ``json.loads`` takes for ``data``: one linear count, no parsing."""
    if isinstance(data, str):
        data = data.encode("utf-8", "replace")
    return 3 * len(data) + sum(data.count(ch) * cost for ch, cost in JSON_COST_PER.items())


def check_json_cost(data: bytes | str, what: str) -> None:
    """Refuse, before parsing, JSON whose Python objects would take more than the memory budget."""
    check_budget(json_parse_bytes(data), f"{what} (parsed)")


def numel(shape: Iterable[Any], what: str) -> int:
    """The element count of a declared shape; refuses negative or non-integer dims (one line)."""
    count = 1
    for dim in shape:
        if isinstance(dim, bool) or not isinstance(dim, int):
            raise ModelLoadError(f"{what} has a dimension that is not an integer: {dim!r}"[:300])
        if dim < 0:
            raise ModelLoadError(f"{what} has a negative dimension ({dim})")
        count *= dim
        if count > 2**62:
            count = 2**62  # far over any budget; keeps the arithmetic small
    return count


def tensor_bytes(shape: Iterable[Any], element_size: int, what: str) -> int:
    """Bytes of a dense tensor of ``shape`` with ``element_size``-byte elements."""
    return numel(shape, what) * max(int(element_size), 1)


def inside(folder: str | os.PathLike, candidate: str | os.PathLike) -> bool:
    """Whether ``candidate`` resolves (links followed) to ``folder`` itself or a path below it."""
    try:
        root = os.path.realpath(folder)
        real = os.path.realpath(os.path.join(root, candidate))
    except (ValueError, OSError):  # a NUL byte, a loop of links
        return False
    return real == root or real.startswith(root.rstrip(os.sep) + os.sep)


def resolve_inside(folder: str | os.PathLike, name: str, what: str) -> Path:
    """The real path of ``name`` (relative to ``folder``) if it stays inside ``folder``; else one line.

    Refuses absolute names, drive letters, NUL bytes and anything that leaves the
    folder through ``..`` or a link.
    """
    text = str(name)
    if "\x00" in text:
        raise ModelLoadError(f"{what} '{text[:80]!r}' holds a NUL byte")
    if os.path.isabs(text) or text.startswith(("/", "\\")) or re.match(r"^[A-Za-z]:", text):
        raise ModelLoadError(f"{what} '{text[:200]}' is an absolute path: it escapes its folder")
    if not inside(folder, text):
        raise ModelLoadError(f"{what} '{text[:200]}' escapes its folder")
    return Path(os.path.realpath(os.path.join(os.path.realpath(folder), text)))


def force_weights_only() -> None:
    """Make every later ``torch.load`` in this process use the weights-only unpickler.

    PyTorch reads ``TORCH_FORCE_WEIGHTS_ONLY_LOAD`` on every ``torch.load`` call and
    then ignores a caller's ``weights_only=False`` (``torch/serialization.py``), so
    this also covers the fallbacks inside ``torch.export`` that retry with the full
    unpickler. The opposite switch is removed: both set is an error in torch.
    """
    os.environ[WEIGHTS_ONLY_ENV] = "1"
    os.environ.pop("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", None)


def _val_bytes(val: Any) -> int:
    import torch

    if isinstance(val, torch.Tensor):
        try:
            return int(val.numel()) * val.element_size()
        except Exception:  # symbolic sizes: not countable here
            return 0
    if isinstance(val, (list, tuple)):
        return sum(_val_bytes(v) for v in val)
    return 0


def forward_peak_bytes(gm: Any) -> int:
    """Estimated peak bytes of one forward of fx graph ``gm``: its weights plus the largest set of
    intermediate values alive at once (each freed after its last use), from ``meta['val']``.

    Nothing is allocated: shapes come from the metadata the importers and
    ``torch.export`` attach. Nodes without metadata count as zero.
    """
    weights = 0
    seen: set[int] = set()
    for tensor in list(gm.parameters()) + list(gm.buffers()):
        if id(tensor) not in seen:
            seen.add(id(tensor))
            weights += int(tensor.numel()) * tensor.element_size()
    nodes = list(gm.graph.nodes)
    last_use: dict[Any, int] = {}
    for i, node in enumerate(nodes):
        for inp in node.all_input_nodes:
            last_use[inp] = i
    live = peak = 0
    sizes: dict[Any, int] = {}
    for i, node in enumerate(nodes):
        if node.op in ("placeholder", "call_function", "call_method", "call_module"):
            size = _val_bytes(node.meta.get("val"))
            sizes[node] = size
            live += size
            peak = max(peak, live)
        for inp in node.all_input_nodes:
            if last_use.get(inp) == i:
                live -= sizes.pop(inp, 0)
    return weights + peak


def check_graph_fits(gm: Any, what: str) -> None:
    """Refuse a graph whose weights plus one forward's live values exceed the memory budget."""
    check_budget(forward_peak_bytes(gm), f"{what} (weights and one forward)")


def safe_ceil_div(a: float, b: float) -> int:
    """``ceil(a / b)`` for the element count of a range; 0 for an empty or degenerate range."""
    if b == 0 or not math.isfinite(a) or not math.isfinite(b):
        return 0
    return max(math.ceil(a / b), 0)
