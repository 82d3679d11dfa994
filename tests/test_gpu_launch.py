"""The bound Triton launcher launches exactly what Triton's runner launches (GPU only; skipped without CUDA).

``triton_support.launch`` binds a compiled kernel's C launcher once (``bind_launcher``) on the Triton
versions it knows (``DIRECT_LAUNCH_VERSIONS``) and skips the runner's per-call Python. Checked here
on the kernels the zoo's models call: the same outputs bitwise as through the runner, on the current
stream (a side stream and a CUDA-graph capture), and the direct path really taken where the version
is listed.
"""

from __future__ import annotations

import pytest
import torch

from explorer.fusions import norm, rms_norm, rotary, swiglu, triton_support as ts

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def _cases():
    g = torch.Generator(device="cuda").manual_seed(0)

    def r(*shape, dtype=torch.bfloat16):
        return torch.randn(*shape, device="cuda", dtype=dtype, generator=g)

    x, res, w = r(3, 37, 520), r(3, 37, 520), r(520)
    q, k = r(2, 8, 33, 64), r(2, 2, 33, 64)
    cos, sin = r(1, 33, 64), r(1, 33, 64)
    gu = r(5, 41, 2 * 344)
    return {
        "rms_norm": lambda: rms_norm.rms_norm(x, w, 1e-6),
        "add_rms_norm": lambda: rms_norm.add_rms_norm(x, res, w, 1e-6),
        "add_layernorm": lambda: norm.add_layernorm(x.half(), res.half(), w.half(), None, 1e-5),
        "rotary": lambda: rotary.rotary(q, k, cos, sin),
        "silu_mul_packed": lambda: swiglu.silu_mul_packed(gu, 344),
    }


def _flat(out):
    if isinstance(out, torch.Tensor):
        return [out]
    return [t for o in out if o is not None for t in _flat(o)]


CASES = ("rms_norm", "add_rms_norm", "add_layernorm", "rotary", "silu_mul_packed")


@pytest.mark.parametrize("name", CASES)
def test_direct_launch_equals_the_runner(name, monkeypatch):
    cases = _cases()
    assert tuple(cases) == CASES
    fn = cases[name]
    ts.clear_compiled()
    monkeypatch.setattr(ts, "DIRECT_LAUNCH_VERSIONS", ())            # Triton's runner at every call
    fn()
    through_runner = [t.clone() for t in _flat(fn())]
    assert all(c.direct is None for c in ts.compiled_entries())
    monkeypatch.undo()
    ts.clear_compiled()
    fn()                                                               # compiles, binds
    if ts._triton_minor() in ts.DIRECT_LAUNCH_VERSIONS:
        assert ts.compiled_entries() and all(c.direct is not None for c in ts.compiled_entries()), "no kernel bound"
    direct = _flat(fn())
    assert len(direct) == len(through_runner)
    for a, b in zip(direct, through_runner):
        assert torch.equal(a, b)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        on_side = [t.clone() for t in _flat(fn())]
    torch.cuda.current_stream().wait_stream(side)
    for a, b in zip(on_side, through_runner):
        assert torch.equal(a, b)

    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = _flat(fn())
    graph.replay()
    torch.cuda.synchronize()
    for a, b in zip(captured, through_runner):
        assert torch.equal(a, b)


def test_a_launch_hook_sends_launches_through_the_runner():
    """A profiler's hook (added to Triton's hook chain) is called for every launch: the bound path steps aside."""
    from triton import knobs

    x = torch.randn(4, 256, device="cuda", dtype=torch.float16)
    w = torch.randn(256, device="cuda", dtype=torch.float16)
    rms_norm.rms_norm(x, w, 1e-6)
    seen = []
    hook = knobs.runtime.launch_enter_hook
    if not hasattr(hook, "add"):
        pytest.skip("this Triton's launch hook is not a chain")
    fn = seen.append
    hook.add(fn)
    try:
        rms_norm.rms_norm(x, w, 1e-6)
    finally:
        hook.remove(fn)
    assert seen, "the hook was not called"
    assert not ts._hooks_set()
