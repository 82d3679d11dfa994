"""The program layouts issue 22's bandwidth sweep (``benchmarks/bench_membw.py``) chooses between, each against float64.

Every layout knob the launch tables set is a different kernel: rotary's cos/sin loaded in x's register layout or
as broadcast rows (``rotary.TABLE_TILE``), the SwiGLU pass walked flat or in tiles (``swiglu.flat_rule``),
Add+LayerNorm's unmasked ``EVEN`` path with several rows a program. Each runs in Triton's interpreter on awkward
shapes (one token or row, head dims 64/128/40, ragged widths) in fp32, fp16 and bf16 against float64 with the
family's tolerances, outputs poisoned first; two layouts of one kernel must agree bitwise (the same arithmetic
on the same elements). The rules that pick a layout per shape are tested for the shapes they were measured on.
"""

from __future__ import annotations

import pytest
import torch
from triton_testing import DTYPE_IDS, DTYPES, assert_close64, device_params, poison, rand, triton_interpreter, up64

from explorer.fusions import norm, swiglu
from explorer.fusions import rotary as rot

assert triton_interpreter  # the autouse fixture, imported into this module


def _poison_norm(monkeypatch) -> None:
    """NaN-filled outputs for the Add+LayerNorm kernel (its fast path's allocator takes the tensor only)."""
    monkeypatch.setattr(norm, "_new_output_like", lambda t: torch.full_like(t, float("nan")))
    monkeypatch.setattr(norm, "_new_output", lambda shape, dtype, device: torch.full(shape, float("nan"),
                                                                                     dtype=dtype, device=device))


# ====================================================================== rotary: cos/sin layout

@pytest.mark.parametrize("device", device_params())
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("b, hq, hkv, s, d", [(1, 4, 2, 1, 128), (2, 3, 1, 5, 64), (1, 2, 1, 3, 40)],
                         ids=["1token-D128", "gqa-D64", "masked-D40"])
def test_rotary_table_layouts_match_float64_and_each_other(b, hq, hkv, s, d, dtype, device, monkeypatch):
    """cos/sin as whole tiles in x's layout (the default) and as broadcast rows: both within TOLERANCES of
    float64, and the same bits (only the load layout differs)."""
    gen = torch.Generator().manual_seed(b * 1000 + s * 10 + d)
    q = rand((b, s, hq, d), dtype, device, gen).transpose(1, 2)                    # (B, Hq, S, D) strided
    k = rand((b, s, hkv, d), dtype, device, gen).transpose(1, 2)
    cos, sin = rand((b, s, d), dtype, device, gen).clamp(-1, 1), rand((b, s, d), dtype, device, gen).clamp(-1, 1)
    q64, k64 = rot.rotary_reference(up64(q), up64(k), up64(cos), up64(sin))
    poison(monkeypatch, rot)
    got = {}
    for table in (True, False):
        qo, ko = rot.rotary(q, k, cos, sin, table_tile=table)
        assert_close64(qo, q64, rot.TOLERANCES[dtype])
        assert_close64(ko, k64, rot.TOLERANCES[dtype])
        got[table] = (qo, ko)
    assert torch.equal(got[True][0], got[False][0]) and torch.equal(got[True][1], got[False][1])
    assert rot.TABLE_TILE is True                                  # what the runner launches


# ====================================================================== SwiGLU: flat or tiles

@pytest.mark.parametrize("device", device_params())
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("rows, inter, tile", [(1, 37, (1, 16)), (5, 37, (2, 16)), (3, 96, (2, 32))],
                         ids=["1row-ragged", "ragged", "even"])
def test_silu_mul_packed_layouts_match_float64_and_each_other(rows, inter, tile, dtype, device, monkeypatch):
    """One packed (rows, 2I) GEMM output walked flat and in tiles (ragged against the tile, or not), with each
    cache-hint setting: within TOLERANCES of float64 and bitwise equal; every output element written (poisoned)."""
    gen = torch.Generator().manual_seed(rows * 100 + inter)
    gu = rand((rows, 2 * inter), dtype, device, gen)
    gu[:, :inter] *= 3
    ref64 = swiglu.silu_mul_packed_reference(up64(gu), inter)
    poison(monkeypatch, swiglu)
    outs = []
    for flat in (True, False):
        out = swiglu.silu_mul_packed(gu, inter, block_m=tile[0], block_n=tile[1], flat=flat)
        assert_close64(out, ref64, swiglu.TOLERANCES[dtype])
        outs.append(out)
    assert torch.equal(outs[0], outs[1])
    for hints in (1, 2):                                                         # cache hints change no value
        assert torch.equal(swiglu.silu_mul_packed(gu, inter, block_m=tile[0], block_n=tile[1], hints=hints), outs[0])
    gate, up = rand((rows, inter), dtype, device, gen, scale=3.0), rand((rows, inter), dtype, device, gen)
    out = swiglu.silu_mul(gate, up, block_n=16, flat=True)                       # one long row, flat or not
    assert_close64(out, swiglu.silu_mul_reference(up64(gate), up64(up)), swiglu.TOLERANCES[dtype])


def test_flat_rule_picks_per_shape():
    """Flat where rows are ragged against the tile (the zoo's packed I = 1376), tiles where they fit (8B's 14336);
    one long row is the same walk either way (tiles)."""
    assert swiglu.flat_rule(16384, 1376, swiglu.launch_config(16384, 1376)[1])
    assert not swiglu.flat_rule(4096, 14336, swiglu.launch_config(4096, 14336)[1])
    assert not swiglu.flat_rule(1, 4096 * 14336, swiglu.launch_config(1, 4096 * 14336)[1])
    assert swiglu.flat_rule(7, 1000, 1024) and not swiglu.flat_rule(7, 2048, 1024)


# ====================================================================== Add+LayerNorm: EVEN rows

@pytest.mark.parametrize("device", device_params())
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("rows, hidden, per_program", [(1, 256, 1), (8, 256, 4), (6, 256, 4), (5, 96, 2)],
                         ids=["1row-even", "even-4rows", "row-tail", "masked-96"])
def test_add_layernorm_even_and_masked_rows(rows, hidden, per_program, dtype, device, monkeypatch):
    """Unmasked (N == BLOCK, ROWS divides M) and masked programs of several rows, γ/β loaded in the rows' layout:
    the sum equals torch's add bitwise, the normalised rows match float64; sum written or not."""
    gen = torch.Generator().manual_seed(rows * 31 + hidden + per_program)
    x, r = rand((rows, hidden), dtype, device, gen), rand((rows, hidden), dtype, device, gen)
    w = rand(hidden, dtype, device, gen, scale=0.1) + 1
    b = rand(hidden, dtype, device, gen, scale=0.1)
    plan = norm._plan_launch(x, r, w, b, None, per_program, True)
    assert plan.constexprs["EVEN"] == (hidden == 256 and rows % per_program == 0)
    _poison_norm(monkeypatch)
    s, y = norm.add_layernorm(x, r, w, b, 1e-5, rows_per_prog=per_program)
    assert torch.equal(s, x + r)
    _, y64 = norm.add_layernorm_reference(up64(x), up64(r), up64(w), up64(b), 1e-5)
    assert_close64(y, y64, norm.TOLERANCES[dtype])
    _, y2 = norm.add_layernorm(x, r, w, b, 1e-5, rows_per_prog=per_program, keep_sum=False)
    assert torch.equal(y2, y)


# ====================================================================== the benchmark's plumbing

def test_bench_membw_smoke_names_the_best_setting(tmp_path, monkeypatch):
    """``bench_membw.py --smoke --sweep`` on the CPU (interpreted, tiny shapes): every case has the copy, the
    default, eager and its sweep, checked against eager, and a summary naming the best setting it measured."""
    import json

    import benchmark_scripts

    monkeypatch.setenv("EXPLORER_GENERIC_COMPILE", "0")                 # what --smoke sets, undone afterwards
    bench = benchmark_scripts.load("bench_membw")
    out = tmp_path / "membw.json"
    assert bench.main(["--smoke", "--sweep", "--only", "swiglu", "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    summary = doc["swiglu"]["summary"]
    assert [s["variant"] for s in summary] == ["silu_mul", "silu_mul_packed"]
    for s in summary:
        assert s["checks_ok"] and s["best_settings"] is not None and s["copy_gbps"] > 0
    variants = {r["variant"] for r in doc["swiglu"]["rows"] if r["kernel"] == "silu_mul_packed"}
    assert {"copy", "fused", "eager"} <= variants and any(v.startswith("cfg[") for v in variants)
