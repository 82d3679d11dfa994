"""Epilogues: every activation a fused epilogue applies, declared once, and their error model.

Each entry says how to apply it out of place (the unfused reference step) and
in place as one library call (what an epilogue runs after a GEMM or a
convolution, and what the lean lowering writes into the graph). The fused
families state which of these names their kernels take; nothing else lists
activations.

"gelu" is the exact (erf) GELU and "gelu_tanh" the tanh approximation; they
differ by up to ~5e-4 and are never interchanged.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import torch
import torch.fx
import torch.nn.functional as F


@dataclasses.dataclass(frozen=True)
class Activation:
    """``out_of_place(t)`` returns a new tensor; ``in_place`` is one library call ``fn(t, **kwargs)``
    that overwrites ``t`` and returns it."""

    name: str
    out_of_place: Callable[[torch.Tensor], torch.Tensor]
    in_place_fn: Callable[..., torch.Tensor] | None
    in_place_kwargs: tuple[tuple[str, object], ...] = ()


ACTIVATIONS: dict[str, Activation] = {a.name: a for a in (
    Activation("none", lambda t: t, None),
    Activation("relu", torch.relu, torch.relu_),
    Activation("relu6", F.relu6, torch.clamp_, (("min", 0.0), ("max", 6.0))),
    Activation("silu", F.silu, torch._C._nn.silu_),
    Activation("gelu", F.gelu, torch._C._nn.gelu_),
    Activation("gelu_tanh", lambda t: F.gelu(t, approximate="tanh"), torch._C._nn.gelu_,
               (("approximate", "tanh"),)),
    Activation("hardswish", F.hardswish, torch._C._nn.hardswish_),
    Activation("tanh", torch.tanh, torch.tanh_),
    Activation("sigmoid", torch.sigmoid, torch.sigmoid_),
)}


def _get(act: str) -> Activation:
    try:
        return ACTIVATIONS[act]
    except KeyError:
        raise ValueError(f"unknown activation {act!r}; known: {sorted(ACTIVATIONS)}") from None


def apply_activation(t: torch.Tensor, act: str) -> torch.Tensor:
    """Return ``act(t)`` as a new tensor (the unfused reference step)."""
    return _get(act).out_of_place(t)


def apply_activation_(t: torch.Tensor, act: str) -> torch.Tensor:
    """Apply ``act`` to ``t`` in place (no extra allocation) and return ``t``."""
    a = _get(act)
    return t if a.in_place_fn is None else a.in_place_fn(t, **dict(a.in_place_kwargs))


def in_place_node(graph: torch.fx.Graph, y: torch.fx.Node, act: str) -> torch.fx.Node:
    """Append ``act`` applied in place to ``y`` as one library call (lean lowering); returns the result node."""
    a = _get(act)
    if a.in_place_fn is None:
        return y
    return graph.call_function(a.in_place_fn, (y,), dict(a.in_place_kwargs))


def check(act: str, supported: tuple[str, ...]) -> None:
    """Raise ``ValueError`` unless ``act`` is one of the ``supported`` names."""
    if act not in supported:
        raise ValueError(f"unknown activation {act!r}; known: {list(supported)}")


#: Agreement of a GEMM or convolution with an epilogue (bias, add, activation) with the
#: unfused computation in float64 (TF32 off), ``|out - ref| <= atol + rtol·|ref|`` for
#: unit-scale outputs: the product is rounded (u), then the epilogue's result (u), and
#: 16-bit products may accumulate in reduced precision: ~8u.
EPILOGUE_TOLERANCES = {
    torch.float32: dict(rtol=1e-5, atol=1e-5),
    torch.float16: dict(rtol=4e-3, atol=4e-3),
    torch.bfloat16: dict(rtol=3.2e-2, atol=3.2e-2),
}
