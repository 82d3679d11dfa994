"""What the Triton kernel tests of the decoder families share (``test_fusion_rms_norm/swiglu/rotary.py``).

Without a GPU the Triton kernels run in Triton's interpreter: ``triton_interpreter`` (an autouse
fixture once imported into a test module) sets ``TRITON_INTERPRET=1`` for each test of that module
only. Triton decorates its library functions (``tl.sum``) when first imported, so this module
imports it in interpreter mode when nothing has imported it yet; the kernels fall back to
``tl.reduce`` otherwise (the same result, more slowly).

Tolerances: ``|out - ref64| <= atol + rtol·|ref64|`` where ``ref64`` is the family's ``*_reference``
on the same inputs upcast to float64. NaN never passes (an explicit check, then
``equal_nan=False``), and outputs are allocated full of NaN ("poisoned") so that an element a
kernel forgets to write fails.
"""

from __future__ import annotations

import os
import sys

import pytest
import torch

if not torch.cuda.is_available() and "triton" not in sys.modules:
    _before = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1"
    try:
        import triton.language  # noqa: F401
    except Exception:  # no usable Triton: the kernel tests skip
        pass
    finally:
        if _before is None:
            del os.environ["TRITON_INTERPRET"]
        else:
            os.environ["TRITON_INTERPRET"] = _before

from explorer.fusions.triton_support import triton_available  # noqa: E402

HAS_CUDA = torch.cuda.is_available()
#: Without CUDA, the Triton kernels run in Triton's interpreter.
INTERPRET = not HAS_CUDA and triton_available()
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
DTYPE_IDS = ["fp32", "fp16", "bf16"]
#: Where the kernels run in this process (compiled on CUDA, else interpreted on the CPU).
KERNEL_DEVICE = "cuda" if HAS_CUDA else "cpu"
needs_backend = pytest.mark.skipif(not (HAS_CUDA or INTERPRET), reason="no Triton backend (no CUDA, no Triton)")


@pytest.fixture(autouse=True)
def triton_interpreter(monkeypatch):
    """TRITON_INTERPRET=1 for each test of the importing module only (the kernels are decorated lazily, per mode)."""
    if INTERPRET:
        monkeypatch.setenv("TRITON_INTERPRET", "1")


def device_params():
    """CPU (Triton interpreter, when there is no CUDA) and CUDA (compiled kernels, marked gpu)."""
    return [
        pytest.param("cpu", marks=pytest.mark.skipif(
            not INTERPRET, reason="CPU Triton runs only in Triton's interpreter, without CUDA")),
        pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")]),
    ]


def rand(shape, dtype, device, gen, scale=1.0, shift=0.0) -> torch.Tensor:
    """Normal samples drawn in float64 on the CPU (reproducible everywhere), then cast and moved."""
    return (torch.randn(shape, generator=gen, dtype=torch.float64) * scale + shift).to(dtype=dtype, device=device)


def up64(t: torch.Tensor | None) -> torch.Tensor | None:
    """The same values in float64 on the CPU (the oracle's inputs)."""
    return None if t is None else t.detach().double().cpu()


def assert_close64(out: torch.Tensor, ref64: torch.Tensor, tol: dict) -> None:
    """``out`` equals the float64 ``ref64`` within ``tol``; a NaN anywhere fails."""
    assert out.shape == ref64.shape, (out.shape, ref64.shape)
    out64 = out.detach().double().cpu()
    assert not torch.isnan(out64).any(), "output contains NaN (an unwritten, poisoned element)"
    torch.testing.assert_close(out64, ref64.detach().double().cpu(), equal_nan=False, **tol)


def poison(monkeypatch, module) -> None:
    """Make ``module``'s output allocators return NaN-filled tensors (same layout as the real ones)."""
    if hasattr(module, "_new_output"):
        monkeypatch.setattr(module, "_new_output",
                            lambda shape, dtype, device: torch.full(shape, float("nan"), dtype=dtype, device=device))
    if hasattr(module, "_new_output_like"):
        monkeypatch.setattr(module, "_new_output_like",
                            lambda t, dtype: torch.full_like(t, float("nan"), dtype=dtype))


def correctly_rounded_fraction(out: torch.Tensor, ref64: torch.Tensor) -> float:
    """Fraction of elements of ``out`` equal to the float64 ``ref64`` rounded once to ``out``'s dtype."""
    return (out.cpu() == ref64.to(out.dtype)).double().mean().item()


def randomized(module: torch.nn.Module, seed: int) -> torch.nn.Module:
    """``module`` with every parameter redrawn: 1-D (RMSNorm weights) around 1, matrices ~ N(0, 1/fan_in)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            if p.dim() == 1:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.1 + 1)
            else:
                p.copy_(torch.randn(p.shape, generator=gen) / p.shape[-1] ** 0.5)
    return module


def tiny_llama_config(layers: int = 1):
    """A tiny Llama config with awkward sizes: hidden 120 = 3 heads of 40, GQA over 1 kv head, I = 200."""
    import transformers

    config = transformers.LlamaConfig(hidden_size=120, intermediate_size=200, num_attention_heads=3,
                                      num_key_value_heads=1, head_dim=40, max_position_embeddings=64,
                                      rms_norm_eps=1e-6, vocab_size=32, num_hidden_layers=layers,
                                      hidden_act="silu")
    config._attn_implementation = "eager"
    return config


def detect_module(module: torch.nn.Module, inputs: tuple, name: str = "module"):
    """``(graph module, detection)`` of ``module`` captured by ``torch.export`` at ``inputs``."""
    from explorer.fusion_engine import detect
    from explorer.graph.build import build_graph
    from explorer.sources import capture

    gm = capture(module.eval(), inputs, name)
    return gm, detect(build_graph(gm, name))


def fuse_all(gm, detection, device: str = "cpu"):
    """The fused copy of ``gm`` with every detected chain accepted (``apply_plan`` at level "all")."""
    from explorer.fusions.plan import make_plan
    from explorer.fusions.rewrite import apply_plan

    return apply_plan(gm, detection, make_plan(detection, "all"), device, level="all")
