"""What the Triton kernel tests share: the CNN families' (``test_kernels.py``, ``test_fusion_conv.py``,
``test_fusion_squeeze_excite.py``, ``test_fusion_convnext.py``, ``test_cnn_models.py``) and the decoder
families' (``test_fusion_rms_norm/swiglu/rotary.py``, ``test_llama.py``).

Without a GPU the Triton kernels run in Triton's interpreter: ``triton_interpreter`` (an autouse
fixture once imported into a test module) sets ``TRITON_INTERPRET=1`` for each test of that module
only. Triton decorates its library functions (``tl.sum``) when first imported, so this module
imports it in interpreter mode when nothing has imported it yet (a test module imports this one
before anything that imports Triton, torchvision included); the kernels fall back to
``tl.reduce`` otherwise (the same result, more slowly).

Tolerances: ``|out - ref64| <= atol + rtol·|ref64|`` where ``ref64`` is the family's ``*_reference``
on the same inputs upcast to float64. NaN never passes (an explicit check, then
``equal_nan=False``), and outputs are allocated full of NaN ("poisoned") so that an element a
kernel forgets to write fails.

``compile_for_sm90`` compiles (never runs) kernels for an H100/H200 in a fresh process, for what
only the compiler checks; ``fusion_benchmark`` loads a family's benchmark script as a module.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

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

ROOT = Path(__file__).resolve().parents[1]

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
    """TRITON_INTERPRET=1 for each test of the importing module only, never leaking into other modules.

    ``triton.jit`` reads it when it decorates; our kernels are decorated at first call, in a cache
    keyed by the interpreter mode, and call only Triton's core builtins, so a per-test setting works
    whatever imported Triton first.
    """
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


def fused_matches(gm, detection, x: torch.Tensor, rtol: float, layout: str = "nchw", device: str = KERNEL_DEVICE):
    """``gm`` rewritten on ``device`` with the default plan (every chain accepted, ``apply_plan`` at its default
    level) in the memory format of ``layout``; asserts that every chain is fused and that the fused graph computes
    what ``gm`` does on ``x`` (both run channels_last when ``layout`` is "nhwc") within ``rtol`` of the largest
    output. Returns the rewrite."""
    from explorer.fusions.plan import make_plan
    from explorer.fusions.rewrite import apply_plan

    memory_format = "channels_last" if layout == "nhwc" else "nchw"
    fused = apply_plan(gm, detection, make_plan(detection, memory_format=memory_format), device)
    assert all(a.status == "fused" for a in fused.applied), fused.applied
    fgm = fused.gm
    if layout == "nhwc":
        gm, fgm, x = (m.to(memory_format=torch.channels_last) for m in (gm, fgm, x))
    with torch.no_grad():
        ref, out = gm(x), fgm(x)
    assert (out - ref).abs().max().item() <= rtol * ref.abs().max().item()
    return fused


#: The start of every ``compile_for_sm90`` script: Triton compiled (interpreter off) for sm_90, and
#: ``local_bytes(compiled)``, the local memory (register spills) a compiled kernel uses.
SM90_PRELUDE = r'''
import json, os, re, subprocess, sys, tempfile
os.environ.pop("TRITON_INTERPRET", None)
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

target = GPUTarget("cuda", 90, 32)
cuobjdump = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")

def local_bytes(compiled):
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(compiled.asm["cubin"])
    usage = subprocess.run([cuobjdump, "-res-usage", f.name], capture_output=True, text=True).stdout
    os.unlink(f.name)
    m = re.search(r"LOCAL:(\d+)", usage)
    return int(m.group(1)) if m else None
'''


def compile_for_sm90(body: str) -> list:
    """Run ``SM90_PRELUDE`` + ``body`` in a fresh Python at the repository root, with ``TRITON_INTERPRET``
    unset (the interpreter does not check what only the compiler does); ``body`` prints a JSON list last,
    which is returned. Skips without Triton or without its ``ptxas``; needs Triton's NVIDIA backend."""
    pytest.importorskip("triton")
    from triton.backends.compiler import GPUTarget  # noqa: F401  (a Triton with the NVIDIA backend)

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, "-c", SM90_PRELUDE + body], capture_output=True, text=True,
                          cwd=ROOT, env=env, timeout=300)
    if proc.returncode and ("ptxas" in proc.stderr and "not found" in proc.stderr):
        pytest.skip("Triton's ptxas is not available")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def fusion_benchmark(name: str):
    """``benchmarks/<name>.py`` (``bench_cnn_fusions``, ``bench_llm_fusions``...) as a module, freshly executed
    (``benchmark_scripts.load``), after this module has set Triton up for the interpreter."""
    import benchmark_scripts

    return benchmark_scripts.load(name)
