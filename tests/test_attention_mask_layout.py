"""The attention family's SDPA call hands the kernel a mask whose last dim is contiguous (``attention.attention``).

PyTorch's flash, memory-efficient and cuDNN kernels take an ``attn_mask`` only with ``stride(-1) == 1``; any other
drops the call to the op-by-op math backend. T5's relative-position bias arrives permuted from its embedding lookup
(last stride = heads), so the fix-up matters on a real model. On the CPU this checks what SDPA receives and that the
values are unchanged, against float64, in every dtype; which backend CUDA then picks is the H200's to show.
"""
from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from explorer.fusions import attention

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 2e-2}     # relative L2 against float64


class _SeenMasks(TorchDispatchMode):
    """The attn_mask each ``aten.scaled_dot_product_attention`` receives (shape, strides)."""

    def __init__(self):
        super().__init__()
        self.masks = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if "scaled_dot_product" in str(func):         # the public op, or the CPU kernel it decomposes into
            mask = (kwargs or {}).get("attn_mask")
            mask = args[3] if mask is None and len(args) > 3 and isinstance(args[3], torch.Tensor) else mask
            self.masks.append((tuple(mask.shape), mask.stride()) if mask is not None else None)
        return func(*args, **(kwargs or {}))


def _t5_like(b=3, h=5, lq=7, lk=9, e=12, seed=0):
    """q, k, v and a bias permuted as T5 makes it: ``(lq, lk, h)`` → ``(1, h, lq, lk)``, plus a padding mask."""
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(b, h, n, e, generator=g, dtype=torch.float64) for n in (lq, lk, lk))
    bias = torch.randn(lq, lk, h, generator=g, dtype=torch.float64).permute(2, 0, 1).unsqueeze(0)
    pad = torch.zeros(b, 1, 1, lk, dtype=torch.float64)
    pad[0, ..., -2:] = -1e4
    return q, k, v, bias + pad


def test_last_dim_contiguous_keeps_values_and_broadcasts():
    _, _, _, mask = _t5_like()
    assert mask.stride(-1) != 1                                   # what T5 hands over
    fixed = attention.last_dim_contiguous(mask)
    assert fixed.stride(-1) == 1 and torch.equal(fixed, mask)
    wide = torch.randn(1, 5, 7, 9).permute(0, 1, 3, 2).expand(4, 5, 9, 7)     # broadcast over the batch
    fixed = attention.last_dim_contiguous(wide)
    assert fixed.stride(-1) == 1 and fixed.stride(0) == 0 and torch.equal(fixed, wide)
    assert fixed.untyped_storage().nbytes() == 5 * 7 * 9 * 4      # the batch copy is not materialised
    row = torch.randn(2, 1, 6, 1).expand(2, 3, 6, 8)             # broadcast along the keys: stride 0 last
    fixed = attention.last_dim_contiguous(row)
    assert fixed.stride(-1) == 1 and fixed.stride(1) == 0 and torch.equal(fixed, row)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(3, 5, 7, 9, 12), (1, 1, 1, 3, 8), (2, 3, 17, 5, 20)], ids=str)
def test_sdpa_receives_a_contiguous_last_dim_and_the_result_is_unchanged(dtype, shape):
    q, k, v, mask = _t5_like(*shape)
    ref = attention.attention_reference(q, k, v, 1.0, mask)     # float64, the mask as the model made it
    lo = [t.to(dtype) for t in (q, k, v, mask)]
    with _SeenMasks() as seen:
        out = attention.attention(*lo[:3], 1.0, lo[3])
    assert seen.masks == [(tuple(mask.shape), attention.last_dim_contiguous(lo[3]).stride())]
    assert seen.masks[0][1][-1] == 1
    err = ((out.double() - ref).norm() / ref.norm()).item()
    assert err < TOL[dtype], err


def test_a_contiguous_mask_is_passed_as_it_is():
    q, k, v, mask = _t5_like()
    mask = mask.contiguous()
    with _SeenMasks() as seen:
        attention.attention(q, k, v, None, mask)
    assert seen.masks == [(tuple(mask.shape), mask.stride())]
