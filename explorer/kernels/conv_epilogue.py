"""Convolution with its bias, residual add and activation applied as one epilogue.

::

    conv_bias_act                       conv_bias_add_act
    x ─► conv(w) ─► +b ─► act ─► y      x ─► conv(w) ─► +b ─► (+ z) ─► act ─► y
                                                               ▲
                                                     residual z┘

On CUDA, for ReLU, cuDNN runs the whole chain as one fused call
(``torch.cudnn_convolution_relu`` / ``torch.cudnn_convolution_add_relu``:
``relu(conv(x, w) + alpha·z + b)``), so the conv output is never written and
read back before the activation. cuDNN has no fused epilogue for the other
activations through these entry points; they run as the convolution (bias
fused by cuDNN) followed by an in-place activation: one extra launch and one
extra read+write of the output, but no extra allocation. On the CPU the same
"conv, then in place" path is used. ``describe`` names the path a call takes.

The ``*_reference`` functions are the unfused graph: conv, add and activation
as separate out-of-place ops, as an eager model runs them.

Shapes: ``x`` is ``(N, C_in, *spatial)``; ``weight`` is ``(C_out, C_in/groups,
*kernel)``; ``bias`` is ``(C_out,)`` or None; ``z`` has the conv output's shape.
``stride``/``padding``/``dilation`` are ints or lists of ints (string padding
such as "same" takes the unfused-epilogue path).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from explorer.kernels import EPILOGUE_TOLERANCES, apply_activation, apply_activation_
from explorer.kernels.bn_fold import conv_nd

CONV_ACTIVATIONS = ("relu", "relu6", "silu", "gelu", "hardswish", "none")
_CUDNN_DTYPES = (torch.float32, torch.float16, torch.bfloat16)

TOLERANCES = EPILOGUE_TOLERANCES  # see explorer.kernels for the error model


def _as_list(value, n: int) -> list[int]:
    if type(value) is list and len(value) == n:       # what the rewritten graph passes: no copy
        return value
    if isinstance(value, int):
        return [value] * n
    value = [int(v) for v in value]
    return value * n if len(value) == 1 else value


def _conv_out_shape(x, weight, stride, padding, dilation) -> tuple[int, ...]:
    """Output shape of a convolution with integer padding (cuDNN does not broadcast ``z``)."""
    n = weight.dim() - 2
    stride, padding, dilation = _as_list(stride, n), _as_list(padding, n), _as_list(dilation, n)
    spatial = [
        (size + 2 * p - d * (k - 1) - 1) // s + 1
        for size, k, s, p, d in zip(x.shape[2:], weight.shape[2:], stride, padding, dilation)
    ]
    return (x.shape[0], weight.shape[0], *spatial)


def _check_act(act: str) -> None:
    if act not in CONV_ACTIVATIONS:
        raise ValueError(f"unknown activation {act!r}; known: {list(CONV_ACTIVATIONS)}")


def cudnn_fusion_applies(act: str, device: torch.device | str, dtype: torch.dtype = torch.float32,
                         weight_dim: int = 4, padding=0) -> bool:
    """Whether the cuDNN fused conv(+add)+bias+relu call is taken for these arguments."""
    if not isinstance(device, torch.device):
        device = torch.device(device)
    return (
        act == "relu"
        and device.type == "cuda"
        and dtype in _CUDNN_DTYPES
        and weight_dim == 4                      # conv2d only: the shape the fused path is tested on
        and not isinstance(padding, str)
        and torch.backends.cudnn.is_available()
        and torch._C._get_cudnn_enabled()        # torch.backends.cudnn.enabled, without its ~1 µs wrapper
    )


def describe(act: str, device: torch.device | str, add: bool = False,
             dtype: torch.dtype = torch.float32, weight_dim: int = 4, cudnn: bool = True) -> str:
    """Human-readable label of the implementation ``conv_bias_act`` / ``conv_bias_add_act`` take
    (``cudnn=False``: of ``conv_bias_act_separate``, which never takes cuDNN's fused call)."""
    _check_act(act)
    if cudnn and cudnn_fusion_applies(act, device, dtype, weight_dim):
        return ("cudnn conv+bias+add+relu (1 fused call: cudnn_convolution_add_relu)" if add
                else "cudnn conv+bias+relu (1 fused call: cudnn_convolution_relu)")
    steps = ["conv+bias"] + (["add_ in place"] if add else []) + ([f"{act} in place"] if act != "none" else [])
    return f"{' + '.join(steps)} ({len(steps)} kernel{'s' if len(steps) > 1 else ''})"


def conv_bias_act(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                  stride: int | Sequence[int] = 1, padding: int | Sequence[int] = 0,
                  dilation: int | Sequence[int] = 1, groups: int = 1, act: str = "relu") -> torch.Tensor:
    """``act(conv(x, weight) + bias)``, fused by cuDNN where ``describe`` says so."""
    _check_act(act)
    if cudnn_fusion_applies(act, x.device, x.dtype, weight.dim(), padding):
        n = weight.dim() - 2
        return torch.cudnn_convolution_relu(
            x, weight, bias, _as_list(stride, n), _as_list(padding, n), _as_list(dilation, n), groups)
    return conv_bias_act_separate(x, weight, bias, None, stride, padding, dilation, groups, act)


def conv_bias_act_separate(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                           z: torch.Tensor | None = None, stride: int | Sequence[int] = 1,
                           padding: int | Sequence[int] = 0, dilation: int | Sequence[int] = 1, groups: int = 1,
                           act: str = "relu") -> torch.Tensor:
    """``act(conv(x, weight) + bias [+ z])`` as the conv (bias fused by the library), then ``+ z``
    and the activation in place: one or two kernels more, on any device, never cuDNN's fused call."""
    _check_act(act)
    y = conv_nd(x, weight, bias, stride, padding, dilation, groups)         # (N, C_out, *out_spatial)
    if z is not None:
        y.add_(z)
    return apply_activation_(y, act)


def conv_bias_add_act(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, z: torch.Tensor,
                      stride: int | Sequence[int] = 1, padding: int | Sequence[int] = 0,
                      dilation: int | Sequence[int] = 1, groups: int = 1, act: str = "relu") -> torch.Tensor:
    """``act(conv(x, weight) + bias + z)``, fused by cuDNN where ``describe(..., add=True)`` says so."""
    _check_act(act)
    if (cudnn_fusion_applies(act, x.device, x.dtype, weight.dim(), padding) and z.dtype == x.dtype
            and tuple(z.shape) == _conv_out_shape(x, weight, stride, padding, dilation)):
        n = weight.dim() - 2
        return torch.cudnn_convolution_add_relu(
            x, weight, z, 1.0, bias, _as_list(stride, n), _as_list(padding, n), _as_list(dilation, n), groups)
    return conv_bias_act_separate(x, weight, bias, z, stride, padding, dilation, groups, act)


def conv_bias_act_reference(x, weight, bias, stride=1, padding=0, dilation=1, groups=1, act="relu"):
    """Unfused: conv (with bias), then the activation out of place."""
    _check_act(act)
    return apply_activation(conv_nd(x, weight, bias, stride, padding, dilation, groups), act)


def conv_bias_add_act_reference(x, weight, bias, z, stride=1, padding=0, dilation=1, groups=1, act="relu"):
    """Unfused: conv (with bias), then ``+ z``, then the activation, each out of place."""
    _check_act(act)
    return apply_activation(conv_nd(x, weight, bias, stride, padding, dilation, groups) + z, act)
