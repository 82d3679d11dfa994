"""CUDA-graph captures outlive the graphs captured before them (GPU only; skipped without CUDA).

The fault of issue 20: a graph captured after an earlier, destroyed graph used that graph's cuBLAS
workspace; once torch.compile's reduce-overhead mode cleared the workspaces, the later graph's
replay read freed device memory ("unspecified launch failure" at Llama-3-8B layer sizes).
``explorer.runtime.variants.make_variant`` gives every capture a workspace of its own.
"""

from __future__ import annotations

import gc

import pytest
import torch

from explorer.runtime.variants import make_variant

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def _clear_workspaces_and_release() -> None:
    torch.cuda.synchronize()
    torch._C._cuda_clearCublasWorkspaces()  # what reduce-overhead does before it records
    torch.cuda.empty_cache()


@pytest.mark.parametrize("size", [256, 4096])
def test_a_graph_captured_after_a_destroyed_one_survives_a_workspace_clear(size):
    torch.manual_seed(0)
    lin = torch.nn.Sequential(torch.nn.Linear(size, 4 * size), torch.nn.GELU(), torch.nn.Linear(4 * size, size))
    lin = lin.to("cuda", torch.bfloat16).eval()
    x = (torch.randn(8, 512, size, device="cuda") * 0.5).to(torch.bfloat16)
    with torch.inference_mode():
        expected = lin(x).float()
    first = make_variant("first", lin, (x,), "cuda", cuda_graphs=True)
    assert first.cuda_graph, first.note
    first.timed()
    del first
    gc.collect()
    _clear_workspaces_and_release()
    second = make_variant("second", lin, (x,), "cuda", cuda_graphs=True)
    assert second.cuda_graph, second.note
    _clear_workspaces_and_release()
    junk = [torch.full((1 << 26,), 7.0, device="cuda") for _ in range(4)]  # reuse whatever was released
    for _ in range(3):
        out = second.timed()
    torch.cuda.synchronize()
    assert torch.equal(out.float(), expected)
    assert all(bool((j == 7.0).all()) for j in junk), "the replay wrote into memory it does not own"
