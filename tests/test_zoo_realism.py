"""Zoo models have realistic activations: outputs of a sane scale in fp32 and fp16, no denormals.

Before ``explorer.sources.calibrate``, ViT-B/16's output was exactly 0 (zero-initialised head) and
MobileNetV2's about 1e-9 (default BatchNorm statistics): zero in fp16, denormal on the CPU, where a
batch-4 forward took over a second instead of tens of milliseconds.
"""

from __future__ import annotations

import copy
import statistics
import subprocess
import sys
import time

import pytest
import torch

from explorer.sources import zoo
from explorer.sources.calibrate import calibrate_batch_norm, reinit_zero_layers


def _first_float(out) -> torch.Tensor:
    if isinstance(out, torch.Tensor):
        return out
    if isinstance(out, dict):
        out = list(out.values())
    if hasattr(out, "to_tuple"):
        out = out.to_tuple()
    for item in out:
        if isinstance(item, torch.Tensor) and item.is_floating_point():
            return item
    raise AssertionError(f"no floating output in {type(out).__name__}")


def _check_scale(y: torch.Tensor, dtype: torch.dtype, name: str) -> None:
    y64 = y.detach().double()
    assert bool(torch.isfinite(y64).all()), f"{name} {dtype}: not finite"
    rms = float(y64.pow(2).mean().sqrt())
    assert 1e-3 < rms < 1e3, f"{name} {dtype}: output rms {rms:.3g} is not a sane scale"
    assert float(y64.abs().max()) < torch.finfo(dtype).max / 16, f"{name} {dtype}: close to overflow"
    tiny = torch.finfo(dtype).tiny
    denormal = float(((y64 != 0) & (y64.abs() < tiny)).double().mean())
    zero = float((y64 == 0).double().mean())
    assert denormal < 0.01, f"{name} {dtype}: {denormal:.1%} of the output is denormal"
    assert zero < 0.9, f"{name} {dtype}: {zero:.1%} of the output is exactly zero"  # a ReLU output: about half
    assert float(y64.std()) > 0, f"{name} {dtype}: constant output"


@pytest.mark.parametrize("name", sorted(n for n, e in zoo.ZOO.items() if not e.large))  # large: test_zoo_sizes
def test_every_zoo_model_has_a_sane_output_scale_in_fp32_and_fp16(name):
    entry = zoo.ZOO[name]
    model = entry.build()
    # sequence models at 32 tokens: the scale does not depend on the length, the CPU's fp16 time does
    inputs = entry.example_inputs(seq_len=min(entry.inputs.seq_len, 32) if entry.inputs.seq_len else None)
    with torch.inference_mode():
        _check_scale(_first_float(model(*inputs)), torch.float32, name)
        half = model.half()
        _check_scale(_first_float(half(*(t.half() if t.is_floating_point() else t for t in inputs))).float(),
                     torch.float16, name)


def _denormal_fraction(model: torch.nn.Module, x: torch.Tensor) -> float:
    """The fraction of denormal float32 values over every module's output in one forward."""
    counts = [0, 0]

    def hook(_module, _inputs, out):
        if isinstance(out, torch.Tensor) and out.is_floating_point():
            counts[0] += int(((out != 0) & (out.abs() < torch.finfo(out.dtype).tiny)).sum())
            counts[1] += out.numel()

    handles = [m.register_forward_hook(hook) for m in model.modules()]
    try:
        with torch.inference_mode():
            model(x)
    finally:
        for h in handles:
            h.remove()
    return counts[0] / max(counts[1], 1)


def test_mobilenet_v2_on_the_cpu_computes_no_denormals_and_is_not_denormal_slow():
    entry = zoo.ZOO["mobilenet_v2"]
    model = entry.build()
    (x,) = entry.example_inputs(batch=4)
    assert _denormal_fraction(model, x) < 1e-4
    # In fp16 the default BatchNorm statistics left 18% of MobileNetV2's activations denormal (its output
    # was about 1e-9); calibrated, almost none are.
    assert _denormal_fraction(copy.deepcopy(model).half(), x.half()) < 1e-3
    # Not denormal-slow: flushing denormals to zero (which is what makes denormal inputs fast) must not
    # change the time. Alternated, median of 5 each (the CPU is shared). Denormal inputs made it 10x.
    ratios = []
    with torch.inference_mode():
        model(x)
        for _ in range(5):
            pair = []
            for flush in (False, True):
                torch.set_flush_denormal(flush)
                t0 = time.perf_counter()
                model(x)
                pair.append(time.perf_counter() - t0)
            ratios.append(pair[0] / pair[1])
    torch.set_flush_denormal(False)
    assert statistics.median(ratios) < 1.5, ratios


def test_calibration_is_deterministic_across_processes():
    code = ("from explorer.sources import zoo\n"
            "m = zoo.ZOO['mobilenet_v2'].build()\n"
            "print(repr(float(sum(b.double().sum() for n, b in m.named_buffers() if 'running' in n))))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    here = zoo.ZOO["mobilenet_v2"].build()
    mine = float(sum(b.double().sum() for n, b in here.named_buffers() if "running" in n))
    assert float(out.stdout.strip()) == mine


def test_zero_initialised_layers_are_reinitialised_and_batch_norm_is_calibrated():
    layer = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.BatchNorm2d(8), torch.nn.Linear(6, 4))
    torch.nn.init.zeros_(layer[2].weight)
    assert reinit_zero_layers(layer) == ["2"] and bool(layer[2].weight.any())
    x = torch.randn(4, 3, 8, 8) * 5 + 3
    assert calibrate_batch_norm(layer[:2], lambda i: (x,)) == 1
    with torch.no_grad():
        y = layer[1](layer[0](x))
    assert abs(float(y.mean())) < 0.05 and abs(float(y.std()) - 1) < 0.05   # normalised what reaches it
    assert not layer[1].training and layer[1].momentum == 0.1                # eval mode, momentum restored
