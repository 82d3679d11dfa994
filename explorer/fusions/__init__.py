"""The fusion registry: every family of fusions the explorer knows, one module each.

A family module (``explorer/fusions/<family>.py``) holds everything about its
fusions: the patterns it declares (``PATTERNS``: what it matches, its guards
and near-miss reasons, its teaching text), its ``rewrite`` (the edit for one
chain), its fused call targets with their one kernel selection (``select_*``,
asked by the runtime call, the label and the lowering alike), its lowering for
lean graphs (``LOWERINGS``), its kernels beside their references, and their
``TOLERANCES``, and its words in English and 中文 (``WORDS``: titles, explanations, near misses,
refusals, kernel labels; ``explorer.words``). Adding a family is one module, its test, and one line below.

Everything else is derived from ``FAMILIES``: the app's checkboxes and legend,
the command line's pattern names, the statistics and the tests all read
``PATTERNS``/``BY_NAME``; nothing else spells a pattern name. The order in
which patterns claim nodes is ``explorer.fusions.order``'s: each family names
the families it must run before (``RUNS_BEFORE``) or after (``RUNS_AFTER``),
sorted topologically, ties broken by the order of ``FAMILIES``.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Callable

from explorer.fusions import base, claims
from explorer.fusions.base import Pattern
from explorer.fusions.kernels import linear_act
from explorer.fusions.order import order_patterns
from explorer.words import merge

#: One line per family: the registration (its module is ``explorer/fusions/<name>.py``).
FAMILY_NAMES: tuple[str, ...] = (
    "attention",
    "conv",
    "linear",
    "norm",
    "generic",
    "siblings",
    "rms_norm",
    "swiglu",
    "rotary",
    "squeeze_excite",
    "convnext",
    "linear_residual",
    "rms_fold",
)
FAMILIES: tuple[ModuleType, ...] = tuple(importlib.import_module(f"{__name__}.{n}") for n in FAMILY_NAMES)

PATTERNS: tuple[Pattern, ...] = order_patterns(FAMILIES)
#: Every family's words and the shared ones (``base``'s; ``claims``', the decisions between two families; a shared
#: kernel's whose selection writes labels, ``kernels.linear_act``): {message id: (english, chinese)} (rendered by
#: explorer.ui.i18n).
WORDS: dict[str, tuple[str, str]] = merge([base.WORDS, claims.WORDS, linear_act.WORDS, *(f.WORDS for f in FAMILIES)])
BY_NAME: dict[str, Pattern] = {p.name: p for p in PATTERNS}
#: fused call target -> its lowering for lean graphs (explorer.runtime.lean)
LOWERINGS: dict[Callable, Callable] = {t: fn for f in FAMILIES for t, fn in getattr(f, "LOWERINGS", {}).items()}
#: fused call targets whose work is Triton launches only: a lean CUDA graph binds each node's call once
#: (``triton_support.BoundCall``, explorer.runtime.lean.bind_calls)
BOUND_CALLS: frozenset = frozenset(t for f in FAMILIES for t in getattr(f, "BOUND_CALLS", ()))
#: "Already fused" op kinds, reported as near misses of the pattern they would have been.
ALREADY_FUSED: dict[str, str] = {k: v for f in FAMILIES for k, v in getattr(f, "ALREADY_FUSED", {}).items()}

UNKNOWN_COLOR = "#7f7f7f"


def color_of(pattern_name: str) -> str:
    """A pattern's colour; a visible grey for names the registry does not know."""
    p = BY_NAME.get(pattern_name)
    return p.color if p else UNKNOWN_COLOR
