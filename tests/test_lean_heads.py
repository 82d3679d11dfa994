"""``lean_heads.batch_first_heads``: ``nn.MultiheadAttention``'s sequence-first head split and gather, batch-first.

Every case prepares one captured graph twice, without the pass and with it (everything else as ``prepare_graph``'s
default), and checks: the outputs bit for bit (``torch.equal``) in float32, float16 and bfloat16, at sizes that
fit no tile (E = 20 over 4 heads of 5, 7 tokens, batch 3) and at batch 1 (where the transposed input is
contiguous and ATen's linear takes its ``addmm`` path, which the pass must take too); the outputs against a
float64 run of the module within the dtype's rounding; the copies gone (``aten.clone``/``copy_`` per forward, a
dispatcher count) and the dispatcher calls fewer; the cases it must leave alone (``need_weights=True``: no SDPA;
a cross-attention, whose key and value are another tensor's). Then torchvision's ViT-B/32 (its 12 attentions)
at the corpus's CI size.
"""

from __future__ import annotations

import collections
import dataclasses

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from triton_testing import detect_module

from explorer.runtime import lean, lean_heads, measure

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
#: the graph against the module in float64: two GEMMs over E = 20 terms, softmax over 7 keys, one LayerNorm
TOL64 = {torch.float32: 2e-5, torch.float16: 4e-3, torch.bfloat16: 3e-2}
OFF = dataclasses.replace(lean.DEFAULT_BINDS, heads=False)


class _Block(torch.nn.Module):
    """A pre-norm attention block as torchvision's ViT writes it: LayerNorm, batch-first self-attention, residual."""

    def __init__(self, e=20, heads=4, need_weights=False, cross=False, bias=True):
        super().__init__()
        torch.manual_seed(5)
        self.ln = torch.nn.LayerNorm(e)
        self.attn = torch.nn.MultiheadAttention(e, heads, batch_first=True, bias=bias)
        self.need_weights, self.cross = need_weights, cross

    def forward(self, x):
        h = self.ln(x)
        kv = h * 0.5 + 1.0 if self.cross else h
        y, _ = self.attn(h, kv, kv, need_weights=self.need_weights)
        return x + y


def _ops(fn, *args) -> collections.Counter:
    count: collections.Counter = collections.Counter()

    class _Count(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            count[str(func.overloadpacket.__name__)] += 1
            return func(*args, **(kwargs or {}))

    with _Count():
        fn(*args)
    return count


def _prepared(module, x, dtype):
    gm, _ = detect_module(module, (x,), "mha")
    x = x.to(dtype)
    off = measure.prepare_graph(gm, "cpu", dtype, binds=OFF)
    on = measure.prepare_graph(gm, "cpu", dtype)
    return gm, off, on, x


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("batch", [3, 1])
def test_bit_for_bit_and_the_copies_gone(dtype, batch):
    module = _Block().eval()
    x = torch.randn(batch, 7, 20, generator=torch.Generator().manual_seed(1))
    gm, off, on, xd = _prepared(module, x, dtype)
    names = [lean_heads.op_name(n) for n in on.graph.nodes]
    assert names.count("seq_first_qkv") == 1 and names.count("batch_first_out") == 1
    assert "contiguous" not in names and "unflatten" not in names
    with torch.inference_mode():
        want, got, again = off(xd), on(xd), on(xd)
        assert torch.equal(want, got) and torch.equal(want, again)
        ref = module.double()(x.double())
        err = (got.double() - ref).abs().max().item() / ref.abs().max().item()
        assert err <= TOL64[dtype], err
        ops_off, ops_on = _ops(off, xd), _ops(on, xd)
        copies_off, copies_on = lean.copies_per_forward(off, xd), lean.copies_per_forward(on, xd)
    if batch > 1:                                   # the input's rows, Q/K/V, the heads gathered: three copies
        assert copies_off == 3 and copies_on <= 1, (copies_off, copies_on)   # the gather's, where SDPA's output
    else:                                           # is (B, H, L, D) in memory (CPU): a copy either way
        assert copies_off >= 1 and copies_on < copies_off, (copies_off, copies_on)
    assert sum(ops_on.values()) < sum(ops_off.values()), (ops_off, ops_on)


def test_without_bias():
    module = _Block(bias=False).eval()
    x = torch.randn(3, 7, 20, generator=torch.Generator().manual_seed(2))
    _, off, on, xd = _prepared(module, x, torch.float32)
    assert any(lean_heads.op_name(n) == "seq_first_qkv" for n in on.graph.nodes)
    with torch.inference_mode():
        assert torch.equal(off(xd), on(xd))


@pytest.mark.parametrize("form", ["need_weights", "cross"])
def test_left_alone(form):
    """No SDPA (the weights are asked for), or key and value that are not the query's projection."""
    module = _Block(need_weights=form == "need_weights", cross=form == "cross").eval()
    x = torch.randn(3, 7, 20, generator=torch.Generator().manual_seed(3))
    gm, _ = detect_module(module, (x,), "mha")
    lowered = measure.prepare_graph(gm, "cpu", torch.float32, binds=lean.NO_BINDS)
    assert lean_heads.batch_first_heads(lowered) == 0


def test_torchvision_vit_b_32():
    """torchvision's ViT-B/32 at the corpus's CI size, captured at batch 2: all 12 attentions rewritten, the
    output bit for bit the graph's without the pass."""
    from benchmarks import corpus

    entry = corpus.by_name("tv/vit_b_32")
    module = entry.build("ci").eval()
    image = entry.inputs("ci", module=module)[0]
    x = torch.randn(2, *image.shape[1:], generator=torch.Generator().manual_seed(4))
    gm, _ = detect_module(module, (x,), "vit")
    lowered = measure.prepare_graph(gm, "cpu", torch.float32, binds=lean.NO_BINDS)
    assert lean_heads.batch_first_heads(lowered) == len(module.encoder.layers)
    off = measure.prepare_graph(gm, "cpu", torch.float32, binds=OFF)
    on = measure.prepare_graph(gm, "cpu", torch.float32)
    with torch.inference_mode():
        want, got = off(x), on(x)
        assert torch.equal(want, got)
        copies_off, copies_on = lean.copies_per_forward(off, x), lean.copies_per_forward(on, x)
    assert copies_off - copies_on >= 2 * len(module.encoder.layers), (copies_off, copies_on)


def test_bench_heads_smoke(tmp_path):
    """``bench_heads.py --smoke`` (CPU, CI size, fp32): both graphs with the pass and without, the rewrite counted,
    the outputs bit for bit, every variant timed and given a verdict; no GPU number."""
    import json

    from benchmarks import bench_heads

    out = tmp_path / "heads.json"
    assert bench_heads.main(["--smoke", "--models", "tv/vit_b_32", "--out", str(out)]) == 0
    row = json.loads(out.read_text())["models"]["tv/vit_b_32"]
    assert "error" not in row, row
    assert row["rewritten"] == dict(fused_on=12, fused_off=0, unfused_on=12, unfused_off=0)
    assert all(v["bitwise"] for v in row["same_outputs"].values())
    assert set(row["latency_ms"]) == {"fused_on", "fused_off", "unfused_on", "unfused_off"}
    assert set(row["verdicts"]) == {"fused_on_vs_fused_off", "unfused_on_vs_unfused_off"}
