"""Fold an inference-mode BatchNorm into the convolution before it.

::

    x ─► conv(w, b) ─► batch_norm(mean, var, γ, β, eps; eval) ─► y
                          ║  fold (pure arithmetic, done once)
    x ─► conv(w', b') ───────────────────────────────────────────► y

    s  = γ / sqrt(var + eps)          (one scale per output channel)
    w' = w · s                        (broadcast over in-channels and kernel)
    b' = (b − mean) · s + β           (b = 0 when the conv has no bias)

After folding, the BatchNorm costs nothing at run time: no launch, no read and
write of the conv output. The fold is exact algebra, but it reorders the
rounding: it is computed in float64 and cast back to the weight's dtype, so the
only new error is one rounding of w' and b'.

Valid only for inference: in training mode BatchNorm normalises with the
statistics of the current batch (and updates its running ones), so there is
no fixed (mean, var) to fold. ``check_foldable`` says so in words.

Works for conv1d/2d/3d, grouped and depthwise convolutions (their weight is
``(out_channels, in_channels / groups, *kernel)``: the output channel is always
dim 0). Not for transposed convolutions, whose output channel is dim 1.
"""

from __future__ import annotations

import torch

from explorer.errors import ExplorerError

TRAINING_REFUSAL = (
    "BatchNorm in training mode: its statistics change every step, "
    "folding is valid only for inference"
)
NO_RUNNING_STATS_REFUSAL = (
    "BatchNorm without running statistics (track_running_stats=False) normalises "
    "with batch statistics even in eval mode: there is nothing fixed to fold"
)


class FoldRefused(ExplorerError):
    """A BatchNorm that cannot be folded; the message says why."""


def check_foldable(training: bool, has_running_stats: bool = True) -> str | None:
    """Return ``None`` when a BatchNorm can be folded, else a readable reason."""
    if training:
        return TRAINING_REFUSAL
    if not has_running_stats:
        return NO_RUNNING_STATS_REFUSAL
    return None


def fold_conv_bn(
    conv_weight: torch.Tensor,
    conv_bias: torch.Tensor | None,
    bn_mean: torch.Tensor,
    bn_var: torch.Tensor,
    bn_weight: torch.Tensor | None,
    bn_bias: torch.Tensor | None,
    eps: float,
    *,
    training: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Return ``(weight, bias)`` of the conv that equals conv → BatchNorm(eval).

    Takes the conv weight ``(C_out, C_in/groups, *kernel)``, its bias ``(C_out,)``
    or None, and the BatchNorm's running mean/var, affine weight γ and bias β
    (None when ``affine=False``) and eps. Computes in float64 and returns
    tensors in the conv weight's dtype and device; the bias is always returned
    (a conv without bias gains one). The inputs are not modified.
    Raises ``FoldRefused`` when ``training`` is true.
    """
    reason = check_foldable(training, has_running_stats=bn_mean is not None and bn_var is not None)
    if reason:
        raise FoldRefused(reason)
    out_channels = conv_weight.shape[0]
    for name, t in (("bn_mean", bn_mean), ("bn_var", bn_var), ("bn_weight", bn_weight),
                    ("bn_bias", bn_bias), ("conv_bias", conv_bias)):
        if t is not None and t.numel() != out_channels:
            raise ValueError(f"{name} has {t.numel()} elements, the conv has {out_channels} output channels")

    f64 = dict(dtype=torch.float64, device=conv_weight.device)
    w = conv_weight.detach().to(**f64)                                     # (C_out, C_in/g, *k)
    b = conv_bias.detach().to(**f64) if conv_bias is not None else torch.zeros(out_channels, **f64)
    mean = bn_mean.detach().to(**f64).reshape(-1)                          # (C_out,)
    var = bn_var.detach().to(**f64).reshape(-1)
    gamma = bn_weight.detach().to(**f64).reshape(-1) if bn_weight is not None else torch.ones(out_channels, **f64)
    beta = bn_bias.detach().to(**f64).reshape(-1) if bn_bias is not None else torch.zeros(out_channels, **f64)

    scale = gamma / torch.sqrt(var + eps)                                  # (C_out,)
    new_w = w * scale.reshape((-1,) + (1,) * (w.dim() - 1))
    new_b = (b - mean) * scale + beta
    return new_w.to(conv_weight.dtype), new_b.to(conv_weight.dtype)


def conv_bn_reference(
    x: torch.Tensor,
    conv_weight: torch.Tensor,
    conv_bias: torch.Tensor | None,
    bn_mean: torch.Tensor,
    bn_var: torch.Tensor,
    bn_weight: torch.Tensor | None,
    bn_bias: torch.Tensor | None,
    eps: float,
    stride=1,
    padding=0,
    dilation=1,
    groups: int = 1,
) -> torch.Tensor:
    """The unfused computation: convolution, then BatchNorm in eval mode."""
    y = conv_nd(x, conv_weight, conv_bias, stride, padding, dilation, groups)
    return torch.nn.functional.batch_norm(y, bn_mean, bn_var, bn_weight, bn_bias, training=False, eps=eps)


def conv_nd(x, weight, bias, stride=1, padding=0, dilation=1, groups: int = 1) -> torch.Tensor:
    """``conv1d``/``conv2d``/``conv3d`` chosen by the weight's rank."""
    conv = {3: torch.nn.functional.conv1d, 4: torch.nn.functional.conv2d,
            5: torch.nn.functional.conv3d}.get(weight.dim())
    if conv is None:
        raise ValueError(f"conv weight must have 3, 4 or 5 dims, got {tuple(weight.shape)}")
    return conv(x, weight, bias, stride, padding, dilation, groups)
