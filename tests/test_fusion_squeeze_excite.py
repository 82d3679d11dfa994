"""The squeeze-and-excitation family (``explorer.fusions.squeeze_excite``): kernels, selection, pattern, rewrite.

The two Triton kernels are checked against the unfused graph in float64 on awkward
shapes (odd channel counts, a 1×1 map, tiles and spatial splits that do not divide)
in every dtype and both layouts, with every buffer they allocate (the output and the
partial sums) poisoned with NaN. Without a GPU they run in Triton's interpreter
(``TRITON_INTERPRET=1`` per test). Tolerances: ``squeeze_excite.TOLERANCES``.

The flavour (EfficientNet: SiLU and sigmoid; MobileNetV3: ReLU and hardsigmoid) and
the launch configuration (automatic, or forced spatial splits with small tiles)
rotate over the (shape, dtype, layout) grid.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn
from triton_testing import (DTYPE_IDS, DTYPES, HAS_CUDA, INTERPRET, assert_close64, fused_matches, needs_backend,
                            triton_interpreter, up64)

import torchvision  # after triton_testing: importing torchvision imports Triton

from explorer.fusion_engine import detect
from explorer.fusions import squeeze_excite as se
from explorer.fusions import triton_support
from explorer.fusions.plan import make_plan
from explorer.fusions.rewrite import apply_plan
from explorer.graph.build import build_graph
from explorer.runtime import measure
from explorer.sources import capture

DEVICE = "cuda" if HAS_CUDA else "cpu"

FLAVOURS = [("silu", "sigmoid"), ("relu", "hardsigmoid")]                # EfficientNet, MobileNetV3


@pytest.fixture
def poisoned(monkeypatch):
    """Every buffer ``squeeze_excite`` allocates (output, partial sums) starts full of NaN."""
    monkeypatch.setattr(se, "_new_output_like", lambda t: torch.full_like(t, float("nan")))
    monkeypatch.setattr(se, "_new_output", lambda shape, dtype, device: torch.full(
        shape, float("nan"), dtype=dtype, device=device))


def rand(shape, dtype, gen, scale=1.0):
    return (torch.randn(shape, generator=gen, dtype=torch.float64) * scale).to(dtype=dtype, device=DEVICE)


def to_layout(t, layout):
    return t.contiguous(memory_format=torch.channels_last) if layout == "nhwc" else t.contiguous()


def _inputs(shape, dtype, layout, gen, weights_dtype=None):
    n, c, cr, h, w = shape
    wd = weights_dtype or dtype
    # a per-channel offset, so that the pooled means (and the gates) differ from channel to channel
    x = to_layout((rand((n, c, h, w), torch.float64, gen) + rand((n, c, 1, 1), torch.float64, gen)).to(dtype), layout)
    w1 = rand((cr, c, 1, 1), wd, gen, scale=2 * c ** -0.5)
    b1 = rand(cr, wd, gen)
    w2 = rand((c, cr, 1, 1), wd, gen, scale=2 * cr ** -0.5)
    b2 = rand(c, wd, gen)
    return x, w1, b1, w2, b2


# ===================================================================== the kernels

SHAPES = [((2, 24, 6, 7, 9), "2x24(6)x7x9"), ((3, 37, 5, 13, 13), "3x37(5)x13x13"), ((2, 97, 24, 1, 1), "2x97(24)x1x1")]
CONFIGS = [None, ((3, 2), (16, 4))]                                     # automatic, or split with small tiles


def _grid():
    params, i = [], 0
    for shape, sid in SHAPES:
        for dtype, did in zip(DTYPES, DTYPE_IDS):
            for layout in ("nchw", "nhwc"):
                params.append(pytest.param(i, shape, dtype, layout, id=f"{sid}-{did}-{layout}"))
                i += 1
    return params


@needs_backend
@pytest.mark.parametrize("i, shape, dtype, layout", _grid())
def test_squeeze_excite_matches_float64(i, shape, dtype, layout, poisoned):
    gen = torch.Generator().manual_seed(30 + i)
    x, w1, b1, w2, b2 = _inputs(shape, dtype, layout, gen)
    act, gate = FLAVOURS[i % 2]
    splits, tiles = CONFIGS[(i // 2) % 2] or (None, None)
    ref64 = se.squeeze_excite_reference(up64(x), up64(w1), up64(b1), up64(w2), up64(b2), act, gate)
    y = se.squeeze_excite(x, w1, b1, w2, b2, act, gate, splits=splits, tiles=tiles)
    assert y.stride() == x.stride(), "the output keeps x's layout"
    assert_close64(y, ref64, se.TOLERANCES[dtype])


def test_inputs_exercise_the_gate_range():
    """The inputs above put the gates in their non-linear range, not at a constant 0 or 1."""
    gen = torch.Generator().manual_seed(30)
    x, w1, b1, w2, b2 = _inputs(SHAPES[1][0], torch.float32, "nchw", gen)
    for act, gate in FLAVOURS:
        g = (se.squeeze_excite_reference(up64(x), up64(w1), up64(b1), up64(w2), up64(b2), act, gate)
             / up64(x))[:, :, 0, 0]
        assert ((g > 0.05) & (g < 0.95)).float().mean() > 0.5, g


@needs_backend
@pytest.mark.parametrize("case", ["no-bias", "fp32-weights", "3d", "5d", "strided-x", "linear-weights"])
def test_squeeze_excite_variants(case, poisoned):
    gen = torch.Generator().manual_seed(31)
    dtype = torch.bfloat16 if case == "fp32-weights" else torch.float16
    x, w1, b1, w2, b2 = _inputs((2, 24, 6, 5, 7), dtype, "nhwc", gen,
                                weights_dtype=torch.float32 if case == "fp32-weights" else None)
    if case == "no-bias":
        b1 = b2 = None
    elif case == "3d":
        x = x.flatten(2)                                                         # (N, C, L), channels innermost
    elif case == "5d":
        x = x.unsqueeze(2).expand(-1, -1, 2, -1, -1).contiguous()                # (N, C, 2, H, W)
    elif case == "strided-x":
        x = x[..., ::2]
    elif case == "linear-weights":
        w1, w2 = w1.flatten(1), w2.flatten(1)                                    # (Cr, C), (C, Cr)
    ref64 = se.squeeze_excite_reference(up64(x), up64(w1), up64(b1), up64(w2), up64(b2), "silu", "sigmoid")
    y = se.squeeze_excite(x, w1, b1, w2, b2, "silu", "sigmoid", splits=(2, 2), tiles=(8, 4))
    assert_close64(y, ref64, se.TOLERANCES[dtype])


@needs_backend
def test_squeeze_excite_without_library_reductions(monkeypatch, poisoned):
    """The ``tl.reduce`` path taken when Triton was imported before TRITON_INTERPRET was set."""
    monkeypatch.setattr(se, "library_reductions_usable", lambda: False)
    gen = torch.Generator().manual_seed(32)
    x, w1, b1, w2, b2 = _inputs((2, 24, 6, 5, 7), torch.float16, "nchw", gen)
    ref64 = se.squeeze_excite_reference(up64(x), up64(w1), up64(b1), up64(w2), up64(b2), "relu", "hardsigmoid")
    y = se.squeeze_excite(x, w1, b1, w2, b2, "relu", "hardsigmoid", splits=(2, 1), tiles=(16, 8))
    assert_close64(y, ref64, se.TOLERANCES[torch.float16])


def test_squeeze_excite_rejects_bad_operands():
    x = torch.zeros(2, 8, 3, 3, device=DEVICE)
    w1, w2 = torch.zeros(2, 8, device=DEVICE), torch.zeros(8, 2, device=DEVICE)
    with pytest.raises(ValueError, match="gate"):
        se.squeeze_excite(x, w1, None, w2, None, "relu", "softmax")
    with pytest.raises(ValueError, match="w1 must be"):
        se.squeeze_excite(x, w1, None, torch.zeros(8, 3, device=DEVICE), None)


def test_selection_says_why(monkeypatch):
    assert se.select_squeeze_excite("cpu", torch.float64).impl == "reference"
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    choice = se.select_squeeze_excite("cpu", torch.float16, "silu", "sigmoid")
    assert choice.impl == "reference" and not choice.fused
    assert choice.label == ("pool, conv, silu, conv, sigmoid, mul (6 kernels; reference composition: no Triton on "
                            "cpu (TRITON_INTERPRET=1 interprets it))")
    if triton_support.triton_available():
        cuda = se.select_squeeze_excite("cuda", torch.float16, "relu", "hardsigmoid")
        assert cuda.impl == "triton" and cuda.label == ("triton squeeze-excite: 2 kernels (squeeze+fc1, "
                                                        "fc2+hardsigmoid+scale)")
        assert "copying x" in se.select_squeeze_excite("cuda", torch.float16, layout="other").label
        assert "copying x" not in se.select_squeeze_excite("cuda", torch.float16, layout=None).label


# ===================================================================== pattern and rewrite

class _Block(nn.Module):
    """A depthwise conv and its activation, then torchvision's squeeze-and-excitation, then a projection."""

    def __init__(self, c: int = 24, squeeze: int = 6, act=nn.SiLU, gate=nn.Sigmoid) -> None:
        super().__init__()
        self.dw = nn.Conv2d(c, c, 3, padding=1, groups=c)
        self.act = act()
        self.se = torchvision.ops.SqueezeExcitation(c, squeeze, activation=act, scale_activation=gate)
        self.project = nn.Conv2d(c, 8, 1)

    def forward(self, x):
        return self.project(self.se(self.act(self.dw(x))))


class _LinearSE(nn.Module):
    """Squeeze-and-excitation written with linear layers (as in timm's older SE-ResNets)."""

    def __init__(self, c: int = 20, squeeze: int = 5) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(c, squeeze), nn.Linear(squeeze, c)

    def forward(self, x):
        s = torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1)             # (N, C)
        g = torch.sigmoid(self.fc2(torch.relu(self.fc1(s))))
        return x * g.view(x.shape[0], -1, 1, 1)


class _MeanSE(nn.Module):
    """Squeeze-and-excitation as timm writes it: a mean over the spatial dims, 1×1 convs, ReLU and sigmoid."""

    def __init__(self, c: int = 20, squeeze: int = 6) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Conv2d(c, squeeze, 1), nn.Conv2d(squeeze, c, 1)

    def forward(self, x):
        return x * torch.sigmoid(self.fc2(torch.relu(self.fc1(x.mean((2, 3), keepdim=True)))))


class _NotScalingItsInput(nn.Module):
    """The gate multiplies another tensor than the one that was pooled: not squeeze-and-excitation."""

    def __init__(self) -> None:
        super().__init__()
        self.se = torchvision.ops.SqueezeExcitation(12, 4)

    def forward(self, x, other):
        s = self.se.fc2(self.se.activation(self.se.fc1(self.se.avgpool(x))))
        return other * self.se.scale_activation(s)


def _detect(module, *inputs):
    gm = capture(module.eval(), inputs, type(module).__name__)
    return gm, detect(build_graph(gm, type(module).__name__))


@pytest.mark.parametrize("flavour", FLAVOURS, ids=["effnet", "mbv3"])
def test_one_chain_per_squeeze_excite_block(flavour):
    act, gate = {"silu": nn.SiLU, "relu": nn.ReLU}[flavour[0]], {"sigmoid": nn.Sigmoid, "hardsigmoid": nn.Hardsigmoid}[flavour[1]]
    _, det = _detect(_Block(act=act, gate=gate), torch.randn(2, 24, 7, 9))
    [chain] = [c for c in det.chains if c.pattern == "squeeze_excite"]
    assert chain.ops == ("avg_pool", "conv", flavour[0], "conv", flavour[1], "mul")
    assert {c.pattern for c in det.chains} == {"squeeze_excite", "conv_act"}   # the depthwise conv + act


def test_linear_squeeze_excite_is_one_chain():
    _, det = _detect(_LinearSE(), torch.randn(2, 20, 5, 6))
    assert [c.ops for c in det.chains] == [("avg_pool", "linear", "relu", "linear", "sigmoid", "mul")]


def test_mean_squeeze_excite_is_one_chain_and_a_partial_mean_is_not():
    _, det = _detect(_MeanSE(), torch.randn(2, 20, 5, 6))
    assert [c.ops for c in det.chains] == [("reduce", "conv", "relu", "conv", "sigmoid", "mul")]

    class _RowMean(_MeanSE):
        def forward(self, x):
            return x * torch.sigmoid(self.fc2(torch.relu(self.fc1(x.mean(3, keepdim=True)))))

    _, det = _detect(_RowMean(), torch.randn(2, 20, 5, 6))
    assert not any(c.pattern == "squeeze_excite" for c in det.chains)
    assert any(m.pattern == "squeeze_excite" and "not a mean over every spatial dim" in m.reason
               for m in det.near_misses)


def test_near_miss_when_the_gate_scales_another_tensor():
    _, det = _detect(_NotScalingItsInput(), torch.randn(2, 12, 5, 5), torch.randn(2, 12, 5, 5))
    assert not any(c.pattern == "squeeze_excite" for c in det.chains)
    assert any(m.pattern == "squeeze_excite" and "does not scale the tensor that was pooled" in m.reason
               for m in det.near_misses)


def _check_rewrite(module, x, rtol, layout="nchw"):
    gm, det = _detect(module.to(DEVICE), x.to(DEVICE))
    return fused_matches(gm, det, x.to(DEVICE), rtol, layout, DEVICE)


def test_rewrite_without_triton_is_the_reference(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    for module, shape in ((_Block(), (2, 24, 7, 9)), (_LinearSE(), (2, 20, 5, 6)), (_MeanSE(), (2, 20, 5, 6))):
        x = torch.randn(shape, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
        fused = _check_rewrite(module.double(), x, 1e-12)
        [applied] = [a for a in fused.applied if a.pattern == "squeeze_excite"]
        assert applied.impl == "reference" and "cpu" in applied.implementation


@needs_backend
@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
def test_rewrite_through_triton(layout):
    x = torch.randn(2, 24, 7, 9, generator=torch.Generator().manual_seed(2))
    fused = _check_rewrite(_Block(), x, 1e-5, layout)
    [applied] = [a for a in fused.applied if a.pattern == "squeeze_excite"]
    assert applied.impl == "triton" and "2 kernels" in applied.implementation
    assert "fused_squeeze_excite" in fused.gm.code
    fused = _check_rewrite(_MeanSE(), torch.randn(2, 20, 5, 6, generator=torch.Generator().manual_seed(4)), 1e-5,
                           layout)
    assert [a.impl for a in fused.applied] == ["triton"]


@pytest.mark.parametrize("triton", [False, True], ids=["reference", "triton"])
def test_lowering(triton, monkeypatch):
    """A lean graph calls the kernel directly, or spells out the six unfused library calls."""
    if triton and not (HAS_CUDA or INTERPRET):
        pytest.skip("Triton runs neither compiled nor interpreted")
    if not triton:
        monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    for module, shape in ((_Block(), (2, 24, 7, 9)), (_LinearSE(), (2, 20, 5, 6))):
        x = torch.randn(shape, generator=torch.Generator().manual_seed(3)).to(DEVICE)
        gm, det = _detect(module.to(DEVICE), x)
        fused = apply_plan(gm, det, make_plan(det), DEVICE)
        plain = measure.prepare_graph(fused.gm, DEVICE, torch.float32, lean=False)
        lean_gm = measure.prepare_graph(fused.gm, DEVICE, torch.float32)
        targets = [n.target for n in lean_gm.graph.nodes if n.op == "call_function"]
        assert se.fused_squeeze_excite not in targets
        assert (se.squeeze_excite in targets) == triton
        with torch.inference_mode():
            torch.testing.assert_close(lean_gm(x), plain(x), rtol=1e-6, atol=1e-6)
