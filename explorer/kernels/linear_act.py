"""Linear layer with its activation applied in the GEMM epilogue.

::

    unfused                                   fused (CUDA, relu / tanh-gelu)
    x ─► linear(W, b) ─► y ─► HBM ─► act ─►   x ─► cuBLASLt GEMM + bias + act epilogue ─►
                         (1 write + 1 read + 1 write of the output)   (1 write)

On CUDA, ``torch._addmm_activation(bias, x, Wᵀ, use_gelu=...)`` asks cuBLASLt
for its BIAS+RELU or BIAS+GELU epilogue (PyTorch ``aten/src/ATen/native/cuda/Blas.cpp``,
``addmm_out_cuda_impl``: the cuBLASLt path needs a 1-D contiguous bias and both
weight dims > 1, and is off under ``DISABLE_ADDMM_CUDA_LT=1``; otherwise it runs a
GEMM then the activation in place). cuBLASLt's GELU epilogue is the *tanh
approximation* (the fallback applies ``gelu(approximate="tanh")`` too), whereas
on the CPU the same op applies the exact erf GELU. A model's ``gelu`` (erf) and
``gelu_tanh`` differ by up to ~5e-4, so the fused path is used only where the
epilogue's variant is the model's variant: it is probed once per device and
dtype (``gelu_epilogue_variant``) rather than assumed. Every other case runs
``F.linear`` then the activation in place. ``describe`` names the path.
"""

from __future__ import annotations

import functools
import os

import torch

from explorer.kernels import EPILOGUE_TOLERANCES, apply_activation, apply_activation_

LINEAR_ACTIVATIONS = ("relu", "gelu", "gelu_tanh", "silu", "tanh", "none")
#: PyTorch reads DISABLE_ADDMM_CUDA_LT once per process too (``getDisableAddmmCudaLt``).
_LT_DISABLED = os.environ.get("DISABLE_ADDMM_CUDA_LT") == "1"
_LT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)

TOLERANCES = EPILOGUE_TOLERANCES  # see explorer.kernels for the error model


def _check_act(act: str) -> None:
    if act not in LINEAR_ACTIVATIONS:
        raise ValueError(f"unknown activation {act!r}; known: {list(LINEAR_ACTIVATIONS)}")


def gelu_epilogue_variant(device: str | torch.device, dtype: torch.dtype) -> str:
    """Which GELU ``torch._addmm_activation(use_gelu=True)`` computes here: ``"gelu"`` (erf) or ``"gelu_tanh"``.

    Probed with a GEMM whose product is exact in any precision (an identity
    weight and inputs that are multiples of 1/8 within ±4), so the only
    difference left is the GELU formula; the result is compared, in float64,
    with both variants. Probed once per device and dtype.
    """
    return _gelu_epilogue_variant(torch.device(device), dtype)


@functools.lru_cache(maxsize=None)
def _gelu_epilogue_variant(dev: torch.device, dtype: torch.dtype) -> str:
    values = torch.arange(-32, 32, dtype=torch.float64) / 8                    # (64,) exact in bf16
    x = torch.diag(values).to(dtype=dtype, device=dev)                         # (64, 64)
    eye = torch.eye(64, dtype=dtype, device=dev)
    bias = torch.zeros(64, dtype=dtype, device=dev)
    y = torch._addmm_activation(bias, x, eye, use_gelu=True).diagonal().double().cpu()
    err_exact = (y - torch.nn.functional.gelu(values)).abs().sum()
    err_tanh = (y - torch.nn.functional.gelu(values, approximate="tanh")).abs().sum()
    return "gelu_tanh" if err_tanh < err_exact else "gelu"


def _lt_epilogue(act: str, device: torch.device, dtype: torch.dtype,
                 in_features: int = 2, out_features: int = 2) -> bool | None:
    """``use_gelu`` for the fused cuBLASLt call, or None when the fused call does not apply."""
    if device.type != "cuda" or dtype not in _LT_DTYPES or _LT_DISABLED:
        return None
    if in_features <= 1 or out_features <= 1:      # PyTorch skips cuBLASLt for these shapes
        return None
    if act == "relu":
        return False
    if act in ("gelu", "gelu_tanh") and _gelu_epilogue_variant(device, dtype) == act:
        return True
    return None


def describe(act: str, device: torch.device | str, dtype: torch.dtype = torch.float32,
             in_features: int = 2, out_features: int = 2) -> str:
    """Human-readable label of the implementation ``linear_act`` takes (for weights of that shape)."""
    _check_act(act)
    device = torch.device(device)
    use_gelu = _lt_epilogue(act, device, dtype, in_features, out_features)
    if use_gelu is not None:
        return f"cuBLASLt GEMM+bias+{'gelu(tanh)' if use_gelu else 'relu'} epilogue (1 call: _addmm_activation)"
    if act == "none":
        return "linear (1 kernel)"
    why = ""
    if device.type == "cuda" and act in ("gelu", "gelu_tanh"):
        why = f"; the cuBLASLt epilogue computes {gelu_epilogue_variant(device, dtype)}, not {act}"
    return f"linear + {act} in place (2 kernels{why})"


def linear_act(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, act: str = "relu") -> torch.Tensor:
    """``act(x @ weightᵀ + bias)``; ``x``: ``(..., in)``, ``weight``: ``(out, in)``, ``bias``: ``(out,)`` or None."""
    _check_act(act)
    use_gelu = _lt_epilogue(act, x.device, x.dtype, weight.shape[1], weight.shape[0])
    if use_gelu is not None and weight.dtype == x.dtype and x.numel() > 0:
        x2 = x.reshape(-1, x.shape[-1])                                       # (rows, in)
        b = bias if bias is not None else torch.zeros(weight.shape[0], dtype=x.dtype, device=x.device)
        y = torch._addmm_activation(b.to(x.dtype).contiguous(), x2, weight.t(), use_gelu=use_gelu)  # (rows, out)
        return y.reshape(*x.shape[:-1], weight.shape[0])
    return linear_act_separate(x, weight, bias, act)


def linear_act_separate(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                        act: str = "relu") -> torch.Tensor:
    """``F.linear`` (bias in the GEMM), then the activation in place: never the fused epilogue."""
    _check_act(act)
    return apply_activation_(torch.nn.functional.linear(x, weight, bias), act)


def linear_act_reference(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                         act: str = "relu") -> torch.Tensor:
    """Unfused: ``F.linear`` then the activation out of place."""
    _check_act(act)
    return apply_activation(torch.nn.functional.linear(x, weight, bias), act)
