"""Epilogues: every activation a fused epilogue applies, declared once, and their error model.

Each entry says how to apply it out of place (the unfused reference step) and
in place as one library call (what an epilogue runs after a GEMM or a
convolution, and what the lean lowering writes into the graph). The fused
families state which of these names their kernels take; nothing else lists
activations.

"gelu" is the exact (erf) GELU and "gelu_tanh" the tanh approximation; they
differ by up to ~5e-4 and are never interchanged.

``triton_activation(interpret)`` is the same table for Triton kernels: one
``@triton.jit`` helper ``_activation(v, ACT)`` (fp32 in, fp32 out) that the conv
epilogue, the depthwise convolution and squeeze-and-excitation kernels call with
a compile-time activation name (``TRITON_ACTIVATIONS``).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Callable

import torch
import torch.fx
import torch.nn.functional as F

from explorer.fusions.triton_support import import_triton


@dataclasses.dataclass(frozen=True)
class Activation:
    """``out_of_place(t)`` returns a new tensor; ``in_place`` is one library call ``fn(t, **kwargs)``
    that overwrites ``t`` and returns it."""

    name: str
    out_of_place: Callable[[torch.Tensor], torch.Tensor]
    in_place_fn: Callable[..., torch.Tensor] | None
    in_place_kwargs: tuple[tuple[str, object], ...] = ()


def quick_gelu(t: torch.Tensor) -> torch.Tensor:
    """CLIP's quick GELU, ``x·sigmoid(1.702·x)``, as the model writes it."""
    return t * torch.sigmoid(1.702 * t)


def quick_gelu_(t: torch.Tensor) -> torch.Tensor:
    """``quick_gelu`` overwriting ``t`` (one temporary for the gate)."""
    return t.mul_(torch.sigmoid(t * 1.702))


ACTIVATIONS: dict[str, Activation] = {a.name: a for a in (
    Activation("none", lambda t: t, None),
    Activation("relu", torch.relu, torch.relu_),
    Activation("relu6", F.relu6, torch.clamp_, (("min", 0.0), ("max", 6.0))),
    Activation("silu", F.silu, torch._C._nn.silu_),
    Activation("gelu", F.gelu, torch._C._nn.gelu_),
    Activation("gelu_tanh", lambda t: F.gelu(t, approximate="tanh"), torch._C._nn.gelu_,
               (("approximate", "tanh"),)),
    Activation("hardswish", F.hardswish, torch._C._nn.hardswish_),
    Activation("hardsigmoid", F.hardsigmoid, torch._C._nn.hardsigmoid_),
    Activation("tanh", torch.tanh, torch.tanh_),
    Activation("sigmoid", torch.sigmoid, torch.sigmoid_),
    Activation("quick_gelu", quick_gelu, quick_gelu_),
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


# ====================================================================== the same, in Triton

#: Activations ``triton_activation`` computes (every entry of ``ACTIVATIONS``).
TRITON_ACTIVATIONS = ("none", "relu", "relu6", "silu", "gelu", "gelu_tanh", "hardswish", "hardsigmoid",
                      "tanh", "sigmoid", "quick_gelu")


@functools.lru_cache(maxsize=2)
def triton_activation(interpret: bool):
    """The Triton helper ``_activation(v, ACT)``: ``ACT`` (a ``tl.constexpr`` name of
    ``TRITON_ACTIVATIONS``) applied to the fp32 tensor ``v``; cached per interpreter mode.

    ``triton.jit`` reads ``TRITON_INTERPRET`` when it decorates, hence the lazy
    definition; ``tl`` is bound as a module global (Triton resolves a kernel's
    names through its module's globals). Every clamp is written with comparisons
    so that NaN propagates as it does in torch; tanh is computed from
    ``exp(-2|x|)`` (no overflow), and SiLU as ``x / (1 + exp(-x))``.
    """
    global tl
    del interpret  # part of the cache key only
    triton, tl = import_triton()

    @triton.jit
    def _activation(v, ACT: tl.constexpr):
        if ACT == "relu":
            v = tl.where(v < 0.0, 0.0, v)                          # NaN stays NaN, as in torch
        elif ACT == "relu6":
            v = tl.where(v < 0.0, 0.0, tl.where(v > 6.0, 6.0, v))
        elif ACT == "silu":
            v = v / (1.0 + tl.exp(-v))                             # x·sigmoid(x); -0.0 for x << 0
        elif ACT == "hardswish":
            t = v + 3.0
            v = v * tl.where(t < 0.0, 0.0, tl.where(t > 6.0, 6.0, t)) / 6.0
        elif ACT == "hardsigmoid":
            t = v + 3.0
            v = tl.where(t < 0.0, 0.0, tl.where(t > 6.0, 6.0, t)) / 6.0
        elif ACT == "gelu":
            v = 0.5 * v * (1.0 + tl.math.erf(v * 0.7071067811865476))
        elif ACT == "gelu_tanh":
            u = 0.7978845608028654 * (v + 0.044715 * v * v * v)   # sqrt(2/pi)·(x + 0.044715x³)
            e = tl.exp(-2.0 * tl.abs(u))                           # tanh(|u|) = (1 - e) / (1 + e)
            th = (1.0 - e) / (1.0 + e)
            v = 0.5 * v * (1.0 + tl.where(u < 0.0, -th, th))
        elif ACT == "sigmoid":
            v = 1.0 / (1.0 + tl.exp(-v))
        elif ACT == "quick_gelu":
            v = v / (1.0 + tl.exp(-1.702 * v))                     # x·sigmoid(1.702x)
        elif ACT == "tanh":
            e = tl.exp(-2.0 * tl.abs(v))
            th = (1.0 - e) / (1.0 + e)
            v = tl.where(v < 0.0, -th, th)
        return v

    return _activation


@functools.lru_cache(maxsize=2)
def triton_round_bf16(interpret: bool):
    """The Triton helper ``_round_for(v, BF16_RTNE_BY_HAND)``: ``v`` (fp32) unchanged, or, when the
    flag is set (the interpreter, whose fp32 → bf16 cast truncates), rounded to the nearest bf16
    value with ties to even, so that the cast after it is exact."""
    global tl
    del interpret
    triton, tl = import_triton()

    @triton.jit
    def _round_for(v, BF16_RTNE_BY_HAND: tl.constexpr):
        if BF16_RTNE_BY_HAND:
            bits = v.to(tl.uint32, bitcast=True)
            v = ((bits + (((bits >> 16) & 1) + 0x7FFF)) >> 16 << 16).to(tl.float32, bitcast=True)
        return v

    return _round_for
