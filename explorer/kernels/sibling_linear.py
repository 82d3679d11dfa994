"""Sibling linears (horizontal fusion): several projections of one input as one GEMM.

::

    unfused                                   fused
    x ─► linear(W_1, b_1) ─► y_1              x ─► linear(W_1|W_2|W_3, b_1|b_2|b_3) ─► Y
    x ─► linear(W_2, b_2) ─► y_2                   y_i = Y[..., o_i : o_i + n_i]  (column views)
    x ─► linear(W_3, b_3) ─► y_3
    (x read 3 times, 3 launches)              (x read once, 1 launch)

``concat_weights`` stacks the weights along the output dimension (and the biases
alike) once, when the plan is applied; ``linear_siblings`` then runs one
``F.linear`` and splits its output into views, with no copy. Each ``y_i`` has
the unfused output's shape but not its strides: row stride ``sum(n_i)`` instead
of ``n_i``. Consumers that need a contiguous tensor must copy; the rewrite
refuses a group whose outputs are viewed in a way a column slice does not allow.

Numerics: each output column is the same dot product over the same ``x`` row;
the library may pick another GEMM algorithm for the wider matrix, so results
can differ from the unfused ones at the dtype's rounding (``TOLERANCES``).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from explorer.kernels import EPILOGUE_TOLERANCES

TOLERANCES = EPILOGUE_TOLERANCES  # a GEMM's error model: see explorer.kernels


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


def linear_siblings(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                    sizes: Sequence[int]) -> tuple[torch.Tensor, ...]:
    """One GEMM ``x @ weightᵀ + bias``, returned as ``len(sizes)`` column views of widths ``sizes``."""
    return torch.split_with_sizes(torch.nn.functional.linear(x, weight, bias), list(sizes), -1)


def linear_siblings_reference(x: torch.Tensor, weights: Sequence[torch.Tensor],
                              biases: Sequence[torch.Tensor | None]) -> tuple[torch.Tensor, ...]:
    """Unfused: one ``F.linear`` per sibling, each reading ``x`` again."""
    return tuple(torch.nn.functional.linear(x, w, b) for w, b in zip(weights, biases))
