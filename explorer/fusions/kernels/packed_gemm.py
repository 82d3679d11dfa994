"""The packed GEMM: several projections of one input as one GEMM over their weights stacked side by side.

::

    W_1 (n_1, in) ┐                                     x ─► linear(W, b) ─► Y (…, sum n_i)
    W_2 (n_2, in) ├─ concat_weights ─► W (sum n_i, in)       y_i = Y[..., o_i : o_i + n_i]  (column views)
    W_3 (n_3, in) ┘                    b alike, or None

``concat_weights`` is the layout (stacked once, when a plan is applied; exact); ``packed_linear`` is the one
GEMM returned as column views of widths ``sizes`` (no copy: each view's row stride is ``sum(n_i)``);
``packed_linear_reference`` is the unfused computation, one ``F.linear`` per projection. The sibling linears
(Q, K, V) and SwiGLU's gate and up projections use this layout; a family's fused call that returns the views is
marked ``packed_gemm_call``, and another family that reads them in place (rotary's QKV epilogue) finds it by
``is_packed_gemm_call``.

Numerics: each output column is the same dot product over the same ``x`` row; the library may pick another GEMM
algorithm for the wider matrix, so results can differ from the unfused ones at the dtype's rounding
(``PACKED_TOLERANCES``: a GEMM's error model, ``explorer.fusions.epilogue``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

import torch

from explorer.fusions.epilogue import EPILOGUE_TOLERANCES

PACKED_TOLERANCES = EPILOGUE_TOLERANCES


def concat_weights(weights: Sequence[torch.Tensor], biases: Sequence[torch.Tensor | None]
                   ) -> tuple[torch.Tensor, torch.Tensor | None, list[int]]:
    """``(W, b, sizes)``: weights ``(n_i, in)`` stacked to ``(sum n_i, in)``; biases alike or all None."""
    if not weights:
        raise ValueError("no weights to concatenate")
    if len(biases) != len(weights):
        raise ValueError(f"{len(weights)} weights but {len(biases)} biases")
    in_features = {w.shape[1] for w in weights}
    if any(w.dim() != 2 for w in weights) or len(in_features) != 1:
        raise ValueError(f"weights must be 2-D with one in_features, got {[tuple(w.shape) for w in weights]}")
    if len({w.dtype for w in weights}) != 1:
        raise ValueError("weights differ in dtype")
    have = [b is not None for b in biases]
    if any(have) and not all(have):
        raise ValueError("some siblings have a bias and some do not")
    weight = torch.cat([w.detach() for w in weights], dim=0)                       # (sum n_i, in)
    bias = torch.cat([b.detach() for b in biases], dim=0) if all(have) else None   # (sum n_i,)
    return weight, bias, [int(w.shape[0]) for w in weights]


def packed_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                  sizes: Sequence[int]) -> tuple[torch.Tensor, ...]:
    """One GEMM ``x @ weightᵀ + bias``, returned as ``len(sizes)`` column views of widths ``sizes``."""
    return torch.split_with_sizes(torch.nn.functional.linear(x, weight, bias), list(sizes), -1)


def packed_linear_reference(x: torch.Tensor, weights: Sequence[torch.Tensor],
                            biases: Sequence[torch.Tensor | None]) -> tuple[torch.Tensor, ...]:
    """Unfused: one ``F.linear`` per projection, each reading ``x`` again."""
    return tuple(torch.nn.functional.linear(x, w, b) for w, b in zip(weights, biases))


_Call = TypeVar("_Call", bound=Callable)


def packed_gemm_call(call: _Call) -> _Call:
    """Mark a family's fused call target as a packed GEMM: ``call(x, weight, bias, sizes)`` returns
    ``packed_linear(x, weight, bias, sizes)``'s column views (weight and bias in ``concat_weights``' layout). Another
    family recognises such a call by this mark (``is_packed_gemm_call``), without importing the family that made it."""
    call.packed_gemm = True
    return call


def is_packed_gemm_call(target: object) -> bool:
    """Whether an fx node's target is a fused call marked by ``packed_gemm_call``."""
    return getattr(target, "packed_gemm", False) is True
