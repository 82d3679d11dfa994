"""Realistic activations for random-weight zoo models, with nothing downloaded.

A zoo model is built with seeded random weights (``explorer.sources.zoo``). Two
of torchvision's initialisations then give degenerate outputs that make every
measurement of them misleading:

- ViT-B/16's classification head is zero-initialised: its output is exactly 0,
  so every relative precision metric divides by zero;
- BatchNorm keeps its default running statistics (mean 0, variance 1), which
  are nothing like the statistics of the activations that reach it: in
  MobileNetV2 the output shrinks to about 1e-9, which underflows to 0 in fp16
  and makes the CPU compute on denormal numbers (a forward 10-50 times slower).

``realistic_init(module, make_inputs)`` fixes both, deterministically:

1. every ``Linear``/``Conv`` layer whose weight is all zero gets its layer's own
   default initialisation (``reset_parameters``) under a fixed seed;
2. BatchNorm running statistics are calibrated: the BatchNorm layers (only
   they) go to training mode with a cumulative average (``momentum=None``), the
   model runs on ``CALIBRATION_BATCHES`` seeded random batches without
   gradients, and everything returns to eval mode. Each BatchNorm then
   normalises what really reaches it, as a trained network's statistics do.

Weights other than zero-initialised layers are left as built, so the model's
graph (and its fingerprint) do not change.
"""

from __future__ import annotations

from typing import Callable

import torch

CALIBRATION_BATCHES = 1  # one seeded batch of 4: per-channel statistics over thousands of values, half the cost of two
CALIBRATION_SEED = 1234

_BATCH_NORMS = (torch.nn.BatchNorm1d, torch.nn.BatchNorm2d, torch.nn.BatchNorm3d)
_LAYERS = (torch.nn.Linear, torch.nn.Conv1d, torch.nn.Conv2d, torch.nn.Conv3d)


def reinit_zero_layers(module: torch.nn.Module, seed: int = CALIBRATION_SEED) -> list[str]:
    """Give every Linear/Conv layer whose weight is all zero its default initialisation.

    Returns the names of the layers re-initialised (``heads.head`` for ViT-B/16).
    Seeded, so the result is the same in every process.
    """
    names = []
    gen_state = torch.random.get_rng_state()
    try:
        torch.manual_seed(seed)
        for name, layer in module.named_modules():
            if isinstance(layer, _LAYERS) and layer.weight is not None and not bool(layer.weight.detach().any()):
                layer.reset_parameters()
                names.append(name)
    finally:
        torch.random.set_rng_state(gen_state)
    return names


def calibrate_batch_norm(module: torch.nn.Module, make_inputs: Callable[[int], tuple[torch.Tensor, ...]],
                         batches: int = CALIBRATION_BATCHES) -> int:
    """Set every BatchNorm's running statistics from ``batches`` forwards; returns how many BatchNorms.

    ``make_inputs(i)`` gives the seeded inputs of batch ``i``. The BatchNorm
    layers run in training mode with ``momentum=None`` (a cumulative average over
    the batches); every other layer stays in eval mode (dropout off). The module
    is returned to eval mode with the BatchNorms' momentum as it was.
    """
    norms = [m for m in module.modules() if isinstance(m, _BATCH_NORMS) and m.track_running_stats]
    if not norms:
        return 0
    momenta = [m.momentum for m in norms]
    module.eval()
    try:
        for m in norms:
            m.reset_running_stats()
            m.momentum = None
            m.train()
        with torch.no_grad():
            for i in range(batches):
                module(*make_inputs(i))
    finally:
        for m, momentum in zip(norms, momenta):
            m.momentum = momentum
        module.eval()
    return len(norms)


def realistic_init(module: torch.nn.Module, make_inputs: Callable[[int], tuple[torch.Tensor, ...]],
                   batches: int = CALIBRATION_BATCHES) -> torch.nn.Module:
    """Re-initialise zero-initialised layers, then calibrate BatchNorm statistics (module docstring).

    Changes ``module`` in place and returns it, in eval mode.
    """
    reinit_zero_layers(module)
    calibrate_batch_norm(module, make_inputs, batches)
    return module.eval()
