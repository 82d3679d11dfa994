"""What the shared kernels have in common: layouts, convolution geometry, and per-signature launch plans.

``layout_of``/``to_layout`` name and make the two layouts the kernels read
(``"nchw"`` row-major, ``"nhwc"`` channels_last); ``conv_out_shape``,
``is_depthwise`` and ``conv_nd`` are the convolution's geometry and its
reference; ``LaunchPlan`` is what one call signature of a kernel needs, worked
out once and kept in ``PLANS`` (bounded, ``triton_support.remember``).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence

import torch

from explorer.fusions.triton_support import remember

TRITON_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
LAYOUTS = ("nchw", "nhwc")


def conv_nd(x, weight, bias, stride=1, padding=0, dilation=1, groups: int = 1) -> torch.Tensor:
    """``conv1d``/``conv2d``/``conv3d`` chosen by the weight's rank."""
    conv = {3: torch.nn.functional.conv1d, 4: torch.nn.functional.conv2d,
            5: torch.nn.functional.conv3d}.get(weight.dim())
    if conv is None:
        raise ValueError(f"conv weight must have 3, 4 or 5 dims, got {tuple(weight.shape)}")
    return conv(x, weight, bias, stride, padding, dilation, groups)


def as_list(value, n: int) -> list[int]:
    if type(value) is list and len(value) == n:       # what the rewritten graph passes: no copy
        return value
    if isinstance(value, int):
        return [value] * n
    value = [int(v) for v in value]
    return value * n if len(value) == 1 else value


def conv_out_shape(x_shape: Sequence[int], weight_shape: Sequence[int], stride, padding, dilation
                   ) -> tuple[int, ...]:
    """Output shape of a convolution with integer padding."""
    n = len(weight_shape) - 2
    stride, padding, dilation = as_list(stride, n), as_list(padding, n), as_list(dilation, n)
    spatial = [(size + 2 * p - d * (k - 1) - 1) // s + 1
               for size, k, s, p, d in zip(x_shape[2:], weight_shape[2:], stride, padding, dilation)]
    return (x_shape[0], weight_shape[0], *spatial)


def channel_view(t: torch.Tensor, ndim: int) -> torch.Tensor:
    """A per-channel vector ``(C,)`` viewed as ``(1, C, 1, ...)`` to broadcast over ``ndim`` dims."""
    return t.view(1, -1, *([1] * (ndim - 2)))


def is_depthwise(x_channels: int, weight_shape: Sequence[int], groups) -> bool:
    """A depthwise 2-D convolution with channel multiplier 1: ``groups == C_in == C_out``, weight ``(C, 1, kh, kw)``."""
    return (len(weight_shape) == 4 and isinstance(groups, int) and groups > 1
            and weight_shape[1] == 1 and weight_shape[0] == groups == x_channels)


# ====================================================================== layouts

def layout_of(t: torch.Tensor) -> str | None:
    """``"nchw"`` (row-major contiguous), ``"nhwc"`` (channels-last contiguous) or None.

    Any rank >= 2 (``(N, C, *spatial)``); strides of size-1 dims are ignored, as
    ``is_contiguous`` does. Where both hold (C == 1 or one spatial element) the answer is
    ``"nchw"``: both layouts then order the storage the same way.
    """
    if t.dim() < 2:
        return None
    if t.is_contiguous():
        return "nchw"
    shape, strides = t.shape, t.stride()
    expected = 1
    for d in (1, *range(t.dim() - 1, 1, -1), 0):         # innermost to outermost: c, spatial..., n
        if shape[d] != 1 and strides[d] != expected:
            return None
        expected *= shape[d]
    return "nhwc"


def to_layout(t: torch.Tensor, layout: str) -> torch.Tensor:
    """``t`` made contiguous in ``layout`` ("nchw" or "nhwc"); ``t`` itself when it already is."""
    current = layout_of(t)
    if current == layout or (layout == "nhwc" and current == "nchw" and layouts_coincide(t)):
        return t
    if layout == "nchw":
        return t.contiguous()
    return t.movedim(1, -1).contiguous().movedim(-1, 1)                    # (N, C, *spatial), C innermost


def layouts_coincide(t: torch.Tensor) -> bool:
    """Both layouts order the storage alike (a single channel, or a single spatial element)."""
    return t.shape[1] == 1 or math.prod(t.shape[2:]) == 1


@functools.lru_cache(maxsize=8)
def _sm_count(device_index: int) -> int:
    """Streaming multiprocessors of a CUDA device (cached)."""
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def sm_count(device: torch.device) -> int:
    """Streaming multiprocessors of ``device`` (CUDA), read once per device."""
    return _sm_count(device.index if device.index is not None else torch.cuda.current_device())


# ====================================================================== launch plans

class LaunchPlan:
    """What one call signature of a kernel needs, worked out once (see ``PLANS``)."""

    __slots__ = ("kernel", "grid", "ints", "constexprs", "num_warps", "z_layout", "num_stages", "tail", "out_shape")

    def __init__(self, kernel=None, grid=(), ints=(), constexprs=None, num_warps=4, z_layout=None,
                 num_stages=None, tail=(), out_shape=None) -> None:
        self.kernel, self.grid, self.ints, self.constexprs = kernel, grid, ints, constexprs
        self.num_warps = num_warps
        self.z_layout = z_layout            # layout z must be copied into first, or None (read as it is)
        self.num_stages = num_stages        # Triton's default where None
        self.tail = tail                    # integer arguments after the per-call ones (strides fixed by the key)
        self.out_shape = out_shape          # the output a call allocates


#: ``LaunchPlan`` by call signature (dtypes, shapes, strides, devices, 16-byte alignment, options): a
#: model calls the same signatures on every forward. Bounded (``triton_support.remember``).
PLANS: dict[tuple, LaunchPlan] = {}


def cached_plan(key: tuple) -> LaunchPlan | None:
    """The plan kept for a call signature ``key`` (of this module's kernels or a caller's), or None."""
    return PLANS.get(key)


def fallback_plan(key: tuple, label: str = "fallback") -> LaunchPlan:
    """Remember what calls of signature ``key`` do when no kernel launch is planned for them: ``label``
    (``"fallback"``: their reference path)."""
    return remember(PLANS, key, LaunchPlan(out_shape=label))
