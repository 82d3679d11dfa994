"""The RMSNorm family (``explorer.fusions.rms_norm``): the kernel against float64, its selection, its matcher
and its rewrite.

Kernels run in Triton's interpreter without a GPU (``triton_testing``), on awkward shapes (hidden 103,
1000; 4096, a Llama-7B row; 16384, the largest row) in fp32, fp16 and bf16; the ``gpu``-marked
parameters run the compiled kernels on CUDA. The references are checked bitwise against transformers'
``LlamaRMSNorm``. Model-level tests build small pre-norm stacks of ``LlamaRMSNorm`` and derive their
detection counts from the architecture.
"""

from __future__ import annotations

import pytest
import torch
from triton_testing import (DTYPE_IDS, DTYPES, KERNEL_DEVICE, assert_close64, detect_module, device_params, fuse_all,
                            needs_backend, poison, rand, randomized, triton_interpreter, up64)

from explorer.fusions import rms_norm as rn

transformers = pytest.importorskip("transformers")
from transformers.models.llama.modeling_llama import LlamaRMSNorm  # noqa: E402

assert triton_interpreter  # the autouse fixture, imported into this module

#: (leading shape, hidden): 96+7 and 1000 (not powers of two), 4096 (a Llama-7B row), 16384 (the largest row).
RMS_SHAPES = [((1, 5), 103), ((3, 13), 1000), ((2, 5), 4096), ((2,), 16384)]


def _inputs(lead, hidden, dtype, device, seed):
    """x, residual (*lead, hidden) and a weight around 1, drawn reproducibly from ``seed``."""
    gen = torch.Generator().manual_seed(seed)
    return (rand((*lead, hidden), dtype, device, gen), rand((*lead, hidden), dtype, device, gen),
            rand(hidden, dtype, device, gen, scale=0.1, shift=1.0))


# ====================================================================== kernel

@pytest.mark.parametrize("device", device_params())
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("lead, hidden", RMS_SHAPES)
def test_add_rms_norm_matches_float64(lead, hidden, dtype, device, monkeypatch):
    """Both outputs against float64; the sum bitwise as torch's add stores it; y close to eager."""
    x, r, w = _inputs(lead, hidden, dtype, device, seed=hidden * 31 + len(lead))
    assert rn.select_rms_norm(device, hidden, dtype).fused
    poison(monkeypatch, rn)
    s, y = rn.add_rms_norm(x, r, w, 1e-6)
    assert s.dtype == dtype and y.dtype == dtype and s.shape == x.shape
    assert torch.equal(s, x + r), "the sum is one add rounded to nearest, exactly like torch's"
    s64, y64 = rn.add_rms_norm_reference(up64(x), up64(r), up64(w), 1e-6)
    assert_close64(s, s64, rn.TOLERANCES[dtype])
    assert_close64(y, y64, rn.TOLERANCES[dtype])
    torch.testing.assert_close(y, rn.add_rms_norm_reference(x, r, w, 1e-6)[1], **rn.EAGER_TOLERANCES[dtype])


@needs_backend
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_add_rms_norm_rounds_where_llama_rounds(dtype):
    """16-bit: the kernel rounds h to the dtype before the weight multiply, as LlamaRMSNorm does, so it
    agrees bitwise with eager almost everywhere; skipping that rounding would differ on many elements."""
    x, r, w = _inputs((3, 13), 1000, dtype, KERNEL_DEVICE, seed=7)
    _, y = rn.add_rms_norm(x, r, w, 1e-6)
    _, y_eager = rn.add_rms_norm_reference(x, r, w, 1e-6)
    assert (y == y_eager).double().mean().item() >= 0.99
    s = (x + r).float()
    unrounded = (w.float() * (s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + 1e-6))).to(dtype)
    assert (unrounded == y_eager).double().mean().item() < 0.99       # the test can tell the difference


@pytest.mark.parametrize("device", device_params())
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_without_sum_and_plain_rms_norm(dtype, device, monkeypatch):
    """``keep_sum=False`` writes no sum and the same y; ``rms_norm`` (no add) matches the float64 math."""
    x, r, w = _inputs((3, 13), 103, dtype, device, seed=11)
    poison(monkeypatch, rn)
    none, y = rn.add_rms_norm(x, r, w, 1e-5, keep_sum=False)
    assert none is None
    assert torch.equal(y, rn.add_rms_norm(x, r, w, 1e-5)[1])
    n = rn.rms_norm(x, w, 1e-5)
    assert_close64(n, rn.rms_norm_reference(up64(x), up64(w), 1e-5), rn.TOLERANCES[dtype])
    torch.testing.assert_close(n, rn.rms_norm_reference(x, w, 1e-5), **rn.EAGER_TOLERANCES[dtype])
    assert_close64(rn.rms_norm(x, None, 1e-5), rn.rms_norm_reference(up64(x), None, 1e-5), rn.TOLERANCES[dtype])


@pytest.mark.parametrize("device", device_params())
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("r_lead", [(1, 13), (13,), (3, 13)], ids=["1xSxN", "SxN", "same"])
def test_broadcast_residual(r_lead, dtype, device, monkeypatch):
    """A residual (1, S, N) or (S, N) broadcast over the batch; also with x and residual swapped."""
    gen = torch.Generator().manual_seed(5)
    x = rand((3, 13, 103), dtype, device, gen)
    r = rand((*r_lead, 103), dtype, device, gen)
    w = rand(103, dtype, device, gen, scale=0.1, shift=1.0)
    poison(monkeypatch, rn)
    for a, b in ((x, r), (r, x)):
        s, y = rn.add_rms_norm(a, b, w, 1e-6)
        assert s.shape == x.shape and torch.equal(s, x + r)
        assert_close64(y, rn.add_rms_norm_reference(up64(a), up64(b), up64(w), 1e-6)[1], rn.TOLERANCES[dtype])


@pytest.mark.parametrize("device", device_params())
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_strided_inputs_and_row_tails(dtype, device, monkeypatch):
    """A transposed x and every-other-row residual take the general path; ``rows_per_prog`` 4 over
    13·3 rows leaves a partial last program."""
    gen = torch.Generator().manual_seed(9)
    x = rand((13, 3, 1000), dtype, device, gen).transpose(0, 1)                  # (3, 13, 1000), strided
    r = rand((3, 26, 1000), dtype, device, gen)[:, ::2]                          # rows 2N apart
    w = rand(1000, dtype, device, gen, scale=0.1, shift=1.0)
    assert not x.is_contiguous() and not r.is_contiguous()
    poison(monkeypatch, rn)
    for rows in (None, 4):
        s, y = rn.add_rms_norm(x, r, w, 1e-6, rows_per_prog=rows)
        assert torch.equal(s, x + r)
        assert_close64(y, rn.add_rms_norm_reference(up64(x), up64(r), up64(w), 1e-6)[1], rn.TOLERANCES[dtype])


@pytest.mark.parametrize("device", device_params())
def test_fp32_weight_promotes_like_the_module(device, monkeypatch):
    """An fp32 weight on bf16 activations gives an fp32 output, as eager's promotion does."""
    x, r, _ = _inputs((3, 5), 103, torch.bfloat16, device, seed=3)
    w = rand(103, torch.float32, device, torch.Generator().manual_seed(4), scale=0.1, shift=1.0)
    poison(monkeypatch, rn)
    s, y = rn.add_rms_norm(x, r, w, 1e-6)
    _, y_eager = rn.add_rms_norm_reference(x, r, w, 1e-6)
    assert s.dtype == torch.bfloat16 and y.dtype == y_eager.dtype == torch.float32
    assert_close64(y, rn.add_rms_norm_reference(up64(x), up64(r), up64(w), 1e-6)[1], rn.TOLERANCES[torch.bfloat16])
    torch.testing.assert_close(y, y_eager, **rn.EAGER_TOLERANCES[torch.bfloat16])


@pytest.mark.parametrize("device", device_params())
def test_fast_path_is_planned_once(device, monkeypatch):
    """Repeated contiguous calls reuse one plan and stay right on fresh inputs."""
    poison(monkeypatch, rn)
    monkeypatch.setattr(rn, "_LAUNCHES", {})
    for seed in range(3):
        x, r, w = _inputs((2, 5), 103, torch.float16, device, seed=seed)
        s, y = rn.add_rms_norm(x, r, w, 1e-6)
        assert torch.equal(s, x + r)
        assert_close64(y, rn.add_rms_norm_reference(up64(x), up64(r), up64(w), 1e-6)[1], rn.TOLERANCES[torch.float16])
    assert len(rn._LAUNCHES) == 1


@needs_backend
def test_select_says_why_and_falls_back(monkeypatch):
    """Refusals carry a reason in the label, and the call still returns the reference result."""
    dev = KERNEL_DEVICE
    assert "16384" in rn.select_rms_norm(dev, rn.MAX_HIDDEN + 1, torch.float32).label
    assert rn.select_rms_norm(dev, 64, torch.float64).impl == "reference"
    assert "residual" in rn.select_rms_norm(dev, 64, torch.float16, residual_dtype=torch.float32).label
    assert "leading" in rn.select_rms_norm(dev, 64, torch.float16, x_shape=(3, 5, 64), residual_shape=(3, 1, 64)).label
    assert "forward-only" in rn.select_rms_norm(dev, 64, torch.float32, requires_grad=True).label
    assert rn.select_rms_norm(dev, 64, torch.float16, add=False).label.startswith("triton rms_norm")
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert "TRITON_INTERPRET" in rn.select_rms_norm("cpu", 64, torch.float32).label
    x, r = torch.randn(3, 5, 64), torch.randn(3, 1, 64)              # broadcast over a middle dim: refused
    s, y = rn.add_rms_norm(x, r, torch.ones(64), 1e-6)
    s_ref, y_ref = rn.add_rms_norm_reference(x, r, torch.ones(64), 1e-6)
    assert torch.equal(s, s_ref) and torch.equal(y, y_ref)
    with pytest.raises(ValueError):
        rn.add_rms_norm(x, x, None, rows_per_prog=3)


@needs_backend
def test_calls_autograd_records_take_the_reference(monkeypatch):
    """Inputs that require grad launch no kernel and get a differentiable result; under no_grad they do launch."""
    launches = []
    real = rn.launch
    monkeypatch.setattr(rn, "launch", lambda *a, **kw: (launches.append(1), real(*a, **kw))[1])
    x = torch.randn(2, 5, 103, device=KERNEL_DEVICE, requires_grad=True)
    w = torch.ones(103, device=KERNEL_DEVICE, requires_grad=True)
    s, y = rn.add_rms_norm(x, torch.randn(2, 5, 103, device=KERNEL_DEVICE), w)
    assert not launches and y.grad_fn is not None
    y.sum().backward()
    assert torch.isfinite(x.grad).all() and w.grad is not None
    with torch.no_grad():
        rn.rms_norm(x, w)
    assert len(launches) == 1


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_references_equal_llama_rms_norm(dtype):
    """``rms_norm_reference`` is bitwise ``LlamaRMSNorm`` (also with an fp32 weight on 16-bit input), and
    ``add_rms_norm_reference`` is the decoder's ``residual + hidden`` then the norm."""
    gen = torch.Generator().manual_seed(41)
    norm = randomized(LlamaRMSNorm(103, eps=1e-6), 1)
    x, r = rand((3, 13, 103), dtype, "cpu", gen), rand((3, 13, 103), dtype, "cpu", gen)
    with torch.no_grad():
        assert torch.equal(rn.rms_norm_reference(x, norm.weight, 1e-6), norm(x))            # fp32 weight
        norm_d = norm.to(dtype)
        s, y = rn.add_rms_norm_reference(x, r, norm_d.weight, 1e-6)
        assert torch.equal(s, r + x) and torch.equal(y, norm_d(r + x))


# ====================================================================== matching and rewriting

class _PreNormStack(torch.nn.Module):
    """``blocks`` pre-norm residual blocks of LlamaRMSNorm and a linear, then a final norm::

        h = norm_0(x);  for each block i:  x = x + linear_i(h);  h = norm_{i+1}(x)

    The first norm has no add before it (rms_norm); each block's residual add feeds the next norm
    (add_rms_norm), and its sum is read again by the next block's add, except the last one's.
    """

    def __init__(self, hidden: int = 103, blocks: int = 3) -> None:
        super().__init__()
        self.norms = torch.nn.ModuleList(LlamaRMSNorm(hidden, eps=1e-6) for _ in range(blocks + 1))
        self.linears = torch.nn.ModuleList(torch.nn.Linear(hidden, hidden) for _ in range(blocks))

    def forward(self, x):
        h = self.norms[0](x)
        for linear, norm in zip(self.linears, self.norms[1:]):
            x = x + linear(h)
            h = norm(x)
        return h


def _stack(blocks: int, dtype=torch.float32):
    """A seeded ``_PreNormStack`` in ``dtype``, its input (2, 7, 103) and its detection without the γ fold (whose
    patterns run first and would take every norm a linear reads: ``tests/test_fusion_rms_fold.py``)."""
    from explorer.fusion_engine import detect
    from explorer.fusions import PATTERNS
    from explorer.graph.build import build_graph

    model = randomized(_PreNormStack(blocks=blocks), 3).to(dtype).eval()
    x = rand((2, 7, 103), dtype, "cpu", torch.Generator().manual_seed(0))
    gm, _ = detect_module(model, (x,), "prenorm")
    det = detect(build_graph(gm, "prenorm"), [p for p in PATTERNS if not p.name.endswith("rms_fold")])
    return model, x, gm, det


@pytest.mark.parametrize("blocks", [1, 3])
def test_pre_norm_stack_detected_and_fused(blocks, monkeypatch):
    """Counts from the architecture: one rms_norm (the first norm) and one add_rms_norm per block; every
    sum but the last is an extra output. Fused on the CPU's reference path, bitwise the same."""
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    model, x, gm, det = _stack(blocks)
    assert det.counts["rms_norm"] == 1 and det.counts["add_rms_norm"] == blocks
    adds = [c for c in det.chains if c.pattern == "add_rms_norm"]
    assert [bool(c.extra_outputs) for c in adds] == [True] * (blocks - 1) + [False]
    assert all(c.ops[-3:] == ("mul", "to", "mul") for c in det.chains if c.pattern.endswith("rms_norm"))
    fused = fuse_all(gm, det)
    assert {a.status for a in fused.applied} == {"fused"}
    code = fused.gm.code
    assert code.count("fused_add_rms_norm(") == blocks - 1 and code.count("fused_add_rms_norm_normed(") == 1
    assert "rsqrt" not in code and "pow" not in code
    with torch.no_grad():
        assert torch.equal(fused.gm(x), model(x))


@needs_backend
def test_pre_norm_stack_through_the_kernel():
    """The same stack, fused, with the Triton kernel (interpreted on the CPU): within the eager tolerance."""
    model, x, gm, det = _stack(2)
    fused = fuse_all(gm, det, KERNEL_DEVICE)
    assert all(a.fused_kernel and a.impl == "triton" for a in fused.applied if a.pattern.endswith("rms_norm"))
    with torch.no_grad():
        torch.testing.assert_close(fused.gm(x), model(x), **rn.EAGER_TOLERANCES[torch.float32])


def test_bf16_capture_keeps_the_sum_from_the_add(monkeypatch):
    """Captured in bf16, the norm's ``to(float32)`` is a real conversion that only the norm reads, and the
    add's own output is the sum the next block reads: the chain takes the cast in and emits the add."""
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    model, x, gm, det = _stack(2, torch.bfloat16)
    assert det.counts["rms_norm"] == 1 and det.counts["add_rms_norm"] == 2
    first = next(c for c in det.chains if c.pattern == "add_rms_norm")
    assert first.ops[:2] == ("add", "to") and first.extra_outputs == (first.node_for("add"),)
    rms = next(c for c in det.chains if c.pattern == "rms_norm")
    assert rms.node_for("cast_in") is not None                     # only the norm reads the input's fp32 copy
    fused = fuse_all(gm, det)
    with torch.no_grad():
        assert torch.equal(fused.gm(x), model(x))


class _LeakyNorm(torch.nn.Module):
    """An RMSNorm that also returns its rsqrt (``leak``) or takes its mean over the sequence (``wrong_dim``)."""

    def __init__(self, how: str) -> None:
        super().__init__()
        self.how = how
        self.weight = torch.nn.Parameter(torch.ones(16))

    def forward(self, x):
        h = x.to(torch.float32)
        variance = h.pow(2).mean(-2 if self.how == "wrong_dim" else -1, keepdim=True)
        inv = torch.rsqrt(variance + 1e-6)
        y = self.weight * (h * inv).to(x.dtype)
        return (y, inv) if self.how == "leak" else y


@pytest.mark.parametrize("how, reason", [("leak", "rsqrt output has 2 consumers"),
                                         ("wrong_dim", "not over the last dimension")])
def test_near_misses_say_why(how, reason):
    """A norm whose intermediate is read elsewhere, or whose mean is over another dim, is a near miss."""
    _, det = detect_module(_LeakyNorm(how), (torch.randn(2, 5, 16),), how)
    assert det.counts["rms_norm"] == 0
    misses = [m.reason for m in det.near_misses if m.pattern == "rms_norm"]
    assert misses and reason in misses[0], misses


class _SqrtNorm(torch.nn.Module):
    """RMSNorm as ONNX exporters write it: ``x * reciprocal(sqrt(mean(x²) + eps)) * w``, no casts."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(103) * 0.1 + 1)

    def forward(self, x, r):
        s = x + r
        return self.weight * (s * torch.reciprocal(torch.sqrt(s.pow(2).mean(-1, keepdim=True) + 1e-6))), s


def test_reciprocal_of_sqrt_is_rsqrt(monkeypatch):
    """``reciprocal(sqrt(·))`` in place of ``rsqrt`` is matched too (one Add+RMSNorm whose sum is also
    returned), and fuses to the same result within fp32 rounding."""
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    model = _SqrtNorm().eval()
    gen = torch.Generator().manual_seed(8)
    x, r = rand((2, 7, 103), torch.float32, "cpu", gen), rand((2, 7, 103), torch.float32, "cpu", gen)
    gm, det = detect_module(model, (x, r), "sqrt_norm")
    assert det.counts["add_rms_norm"] == 1
    chain = det.chains[0]
    assert "sqrt" in chain.ops and "reciprocal" in chain.ops and chain.extra_outputs == (chain.node_for("add"),)
    fused = fuse_all(gm, det)
    with torch.no_grad():
        for got, want in zip(fused.gm(x, r), model(x, r)):
            torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)


@needs_backend
@pytest.mark.parametrize("case", ["fits", "residual_dtype", "middle_broadcast", "fp64", "plain"])
def test_a_handed_impl_is_followed_without_asking(case, monkeypatch):
    """A lowered fused call is handed the impl the rewrite recorded (``LOWERINGS``): handed ``triton`` it asks no
    selection and still takes the reference wherever the selection would have refused these operands (bit for bit
    the call that asks); handed ``reference`` it runs the eager ops."""
    from explorer.fusions.base import counting

    launches = []
    real = rn.launch
    monkeypatch.setattr(rn, "launch", lambda *a, **kw: (launches.append(1), real(*a, **kw))[1])
    dtype = torch.float64 if case == "fp64" else torch.float16
    x, r, w = _inputs((3, 5), 64, dtype, KERNEL_DEVICE, seed=7)
    if case == "residual_dtype":
        r = r.float()
    elif case == "middle_broadcast":
        r = r[:, :1]
    residual = None if case == "plain" else r

    def call(impl):
        launches.clear()
        if residual is None:
            return [rn.fused_rms_norm(x, w, 1e-6, impl)], len(launches)
        return list(rn.fused_add_rms_norm(x, residual, w, 1e-6, impl)), len(launches)

    asked, asked_launches = call(None)
    with counting() as calls:
        handed, handed_launches = call("triton")
        eager, eager_launches = call("reference")
    assert not calls
    assert handed_launches == asked_launches == (1 if case in ("fits", "plain") else 0) and eager_launches == 0
    reference = [rn.rms_norm_reference(x, w, 1e-6)] if residual is None else list(
        rn.add_rms_norm_reference(x, residual, w, 1e-6))
    for a, b, e, ref in zip(asked, handed, eager, reference):
        assert torch.equal(a, b) and torch.equal(e, ref)
