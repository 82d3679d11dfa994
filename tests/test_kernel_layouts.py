"""The program layouts issue 22's bandwidth sweep (``benchmarks/bench_membw.py``) chooses between, each against float64.

Every layout knob the launch tables set is a different kernel: rotary's cos/sin loaded in x's register layout or
as broadcast rows (``rotary.TABLE_TILE``), the SwiGLU pass walked flat or in tiles (``swiglu.flat_rule``),
Add+LayerNorm's unmasked ``EVEN`` path with several rows a program. Each runs in Triton's interpreter on awkward
shapes (one token or row, head dims 64/128/40, ragged widths) in fp32, fp16 and bf16 against float64 with the
family's tolerances, outputs poisoned first; two layouts of one kernel must agree bitwise (the same arithmetic
on the same elements). The rules that pick a layout per shape are tested for the shapes they were measured on, and
the settings the H200 sweep baked in (``bench_membw_sweep_h200.json``) give the same bits as the ones they replaced.
"""

from __future__ import annotations

import pytest
import torch
from triton_testing import DTYPE_IDS, DTYPES, assert_close64, device_params, poison, rand, triton_interpreter, up64

from explorer.fusions import norm, swiglu
from explorer.fusions import rms_norm as rn
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
    float64, and the same bits in bf16/fp16 (only the load layout differs). In float32 the compiler may contract
    ``q·cos − r·sin`` into an FMA in one layout and not the other (the H200, Triton 3.6: 1-ulp differences), which
    the 16-bit roundings hide; there the two agree within 2 ulp of the larger term."""
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
    if dtype == torch.float32:
        for a, b_ in zip(got[True], got[False]):
            torch.testing.assert_close(a, b_, rtol=2.4e-7, atol=2.4e-7 * float(q.abs().max()))
    else:
        assert torch.equal(got[True][0], got[False][0]) and torch.equal(got[True][1], got[False][1])


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


def test_flat_rule_picks_per_shape(monkeypatch):
    """Flat where rows are ragged against the tile (the zoo's packed I = 1376), tiles where they fit (8B's 14336);
    one long row is the same walk either way (tiles). Launches follow the rule only with ``FLAT_WHEN_RAGGED`` (off
    until measured): the default plan of a ragged packed output uses tiles, and flat once it is switched on."""
    assert swiglu.flat_rule(16384, 1376, swiglu.launch_config(16384, 1376)[1])
    assert not swiglu.flat_rule(4096, 14336, swiglu.launch_config(4096, 14336)[1])
    assert not swiglu.flat_rule(1, 4096 * 14336, swiglu.launch_config(1, 4096 * 14336)[1])
    assert swiglu.flat_rule(7, 1000, 1024) and not swiglu.flat_rule(7, 2048, 1024)
    gu = torch.zeros(5, 2 * 1000)
    tiles = swiglu._plan(gu, gu, 1000, swiglu._tuning(None, None, None))
    assert swiglu.FLAT_WHEN_RAGGED is False and tiles.constexprs["FLAT"] is False
    monkeypatch.setattr(swiglu, "FLAT_WHEN_RAGGED", True)
    flat = swiglu._plan(gu, gu, 1000, swiglu._tuning(None, None, None))
    assert flat.constexprs["FLAT"] is True and flat.grid == (-(-5 * 1000 // (tiles.constexprs["BLOCK_M"] * 1024)),)


# ====================================================================== the sweep's winners: the same bits as before

def test_swiglu_measured_rule_per_shape(monkeypatch):
    """``launch_setting`` gives each shape the sweep measured its winner (``bench_membw_sweep_h200.json``), and with
    ``MEASURED`` off the rule before it (what ``bench_membw.PREVIOUS`` times): outputs under 1024 wide keep it."""
    assert swiglu.launch_setting(1, 16384 * 1376) == (1, 1024, 4, False, 1)          # one long row: 97.0%
    assert swiglu.launch_setting(1, 4096 * 14336) == (1, 1024, 4, False, 1)          # 100.1%
    assert swiglu.launch_setting(16384, 1376) == (1, 1024, 4, True, 0)               # ragged packed: flat, 97.8%
    assert swiglu.launch_setting(4096, 14336) == (4, 1024, 8, False, 1)              # packed 1024 tiles: 100.3%
    assert swiglu.launch_setting(2, 2048) == (2, 1024, 8, False, 1)                  # no empty tile rows
    assert swiglu.launch_setting(7, 1000) == (4, 1024, 8, False, 0) == (*swiglu.launch_config_before(7, 1000), False,
                                                                         swiglu.HINTS)
    monkeypatch.setattr(swiglu, "MEASURED", False)
    assert swiglu.launch_setting(1, 16384 * 1376) == (1, 4096, 8, False, 0)
    assert swiglu.launch_setting(16384, 1376) == (4, 1024, 8, False, 0)
    assert swiglu.launch_setting(4096, 14336) == (4, 1024, 8, False, 0)


@pytest.mark.parametrize("device", device_params())
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("rows, inter", [(1, 1100), (3, 1100), (2, 2048), (5, 37)],
                         ids=["1row-ragged", "ragged-flat", "fills-tiles", "narrow"])
def test_swiglu_measured_settings_give_the_same_bits_as_before(rows, inter, dtype, device, monkeypatch):
    """The measured rule and the rule before it (``MEASURED`` off), packed and on two contiguous inputs (one long
    row): torch.equal, and each within TOLERANCES of float64; every output element written (poisoned)."""
    gen = torch.Generator().manual_seed(rows * 7 + inter)
    gu = rand((rows, 2 * inter), dtype, device, gen)
    gu[:, :inter] *= 3
    gate, up = rand((rows, inter), dtype, device, gen, scale=3.0), rand((rows, inter), dtype, device, gen)
    ref_packed = swiglu.silu_mul_packed_reference(up64(gu), inter)
    ref_split = swiglu.silu_mul_reference(up64(gate), up64(up))
    poison(monkeypatch, swiglu)
    got = {}
    for measured in (True, False):
        monkeypatch.setattr(swiglu, "MEASURED", measured)
        monkeypatch.setattr(swiglu, "_LAUNCHES", {})                              # plans are cached per signature
        got[measured] = (swiglu.silu_mul_packed(gu, inter), swiglu.silu_mul(gate, up))
        assert_close64(got[measured][0], ref_packed, swiglu.TOLERANCES[dtype])
        assert_close64(got[measured][1], ref_split, swiglu.TOLERANCES[dtype])
    assert torch.equal(got[True][0], got[False][0]) and torch.equal(got[True][1], got[False][1])


def test_rms_norm_tuned_entry_and_the_one_it_replaced():
    """Add+RMSNorm without γ, the sum written, at hidden 4096 in 16-bit: 2 rows a program (95.2% of copy in the
    sweep) where ``PREVIOUS_TUNED`` keeps the 4 rows it replaced (92.5%); the four Add+RMSNorm variants at 4096 launch
    the verifies' best cache hints (evict-last, ``bench_membw_verify2_h200.json``), every other setting evict-first."""
    assert rn.launch_config(4096, 2, True, False, True) == (4096, 2, 16)
    assert rn.PREVIOUS_TUNED[(4096, 2, True, False, True)] == (4, 16, 0)
    assert rn.HINTS == 0
    assert {v: rn.launch_setting(4096, 2, True, *v)[3] for v in ((True, True), (True, False), (False, True),
                                                                (False, False))} == {
        (True, True): 2, (True, False): 2, (False, True): 2, (False, False): 2}
    assert rn.launch_setting(4096, 2, False, True)[3] == rn.launch_setting(512, 2)[3] == 0
    assert rn.launch_setting(4096, 4)[3] == rn.launch_setting(1000, 2)[3] == rn.HINTS     # fp32, untuned: the heuristic
    x = torch.zeros(4, 4096, dtype=torch.bfloat16)
    assert rn._plan_launch(x, x, None, False, None, None, "triton").constexprs["HINTS"] == 2          # launched: TUNED's
    assert rn._plan_launch(x, x, x[0], False, None, None, "triton").constexprs["HINTS"] == 2
    assert rn._plan_launch(x, x, x[0], False, None, None, "triton", 0).constexprs["HINTS"] == 0  # a call's own wins


@pytest.mark.parametrize("device", device_params())
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("rows, hidden", [(8, 4096), (7, 4096), (3, 4000)], ids=["even", "row-tail", "masked"])
def test_add_rms_norm_rows_and_hints_give_the_same_bits(rows, hidden, dtype, device, monkeypatch):
    """4 rows a program (before), 2 (the sweep's winner) and the candidate cache hints (``hints`` 1, 2) at 16 warps,
    sum written or not, with and without γ: torch.equal, each within TOLERANCES of float64."""
    gen = torch.Generator().manual_seed(rows * 13 + hidden)
    x, r = rand((rows, hidden), dtype, device, gen), rand((rows, hidden), dtype, device, gen)
    w = rand(hidden, dtype, device, gen, scale=0.1) + 1
    poison(monkeypatch, rn)
    for weight in (None, w):
        s64, y64 = rn.add_rms_norm_reference(up64(x), up64(r), up64(weight), 1e-6)
        outs = []
        for per, hints in ((4, 0), (2, 0), (2, 1), (1, 1), (1, 2), (None, None)):      # None: what is launched
            s, y = rn.add_rms_norm(x, r, weight, 1e-6, rows_per_prog=per, num_warps=16, hints=hints)
            _, y_nosum = rn.add_rms_norm(x, r, weight, 1e-6, False, rows_per_prog=per, num_warps=16, hints=hints)
            assert torch.equal(s, x + r) and torch.equal(y_nosum, y)
            assert_close64(y, y64, rn.TOLERANCES[dtype])
            outs.append(y)
        assert all(torch.equal(o, outs[0]) for o in outs[1:])


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


# ====================================================================== what only the compiler shows

_COMPILE_LAYOUTS_FOR_SM90 = r'''
from explorer.fusions import norm, rms_norm as rn, rotary as rot, swiglu

def aligned(kernel, names):  # what Triton's launcher assumes for 16-aligned pointers and ints
    return {(list(kernel.arg_names).index(n),): [["tt.divisibility", 16]] for n in names}

def build(kernel, pointers, dtype, const, warps, floats=()):
    sig = {a: ("constexpr" if a in const else "fp32" if a in floats else "i32") for a in kernel.arg_names}
    sig.update({p: "*" + dtype for p in pointers})
    ints = [a for a in kernel.arg_names if sig[a] == "i32"]
    c = triton.compile(ASTSource(kernel, sig, const, aligned(kernel, list(pointers) + ints)), target=target,
                       options={"num_warps": warps})
    ptx = c.asm["ptx"]
    loads, stores = re.findall(r"ld\.global[^;]*;", ptx), re.findall(r"st\.global[^;]*;", ptx)
    return dict(loads=len(loads), vector_loads=sum(".v4" in l for l in loads), stores=len(stores),
                streaming_stores=sum(".cs" in s for s in stores), shared=c.metadata.shared, local=local_bytes(c))

out = []
k = rot._build_kernel(False)
for hq, hkv, d in ((32, 8, 128),):                                  # Llama-3-8B's heads
    bhq, bhk, tq, tk, bh, warps = rot.launch_config(hq, hkv, d)
    qb, kb = -(-hq // bhq), -(-hkv // bhk)
    for table in (True, False):
        const = dict(HALF=d // 2, BLOCK_HALF=bh, BLOCK_HQ=bhq, BLOCK_HK=bhk, TOKENS_Q=tq, TOKENS_K=tk, Q_BLOCKS=qb,
                     Q_PER=(tk // tq) * qb, PER=(tk // tq) * qb + kb, BF16_RTNE_BY_HAND=False, TABLE_TILE=table)
        out.append(dict(kernel="rotary", d=d, table=table, **build(k, ("Q", "K", "C", "SN", "QO", "KO"), "bf16",
                                                                   const, warps)))
k = swiglu._build_kernel(False)
for flat, hints in ((True, 2),):                                    # the zoo's packed I = 1376, 4 x 1024 tiles
    const = dict(BLOCK_M=4, BLOCK_N=1024, BF16_RTNE_BY_HAND=False, ACT=0, FLAT=flat, HINTS=hints)
    out.append(dict(kernel="swiglu", flat=flat, hints=hints, **build(k, ("G", "U", "O"), "bf16", const, 8)))
k = norm._build_kernel(False)
const = dict(HAS_W=True, HAS_B=True, BLOCK=1024, BF16_RTNE_BY_HAND=False, LIBRARY_REDUCE=True, ROWS=4,
             WRITE_SUM=True, EVEN=True)
out.append(dict(kernel="add_layernorm", **build(k, "XRWBSY", "bf16", const, 8, floats=("eps",))))
k = rn._build_kernel(False)
# 8B Add+RMSNorm without γ, the sum written: 4 rows evict-first (before the sweep), 2 (after it); and every variant
# whose TUNED entry launches other cache hints, at its rows, with evict-first and with its hints
settings = [(False, True, 4, 0), (False, True, 2, 0)] + sorted(
    {(w, ws, rows, h) for (block, e, res, w, ws), (rows, _, hints) in rn.TUNED.items()
     if block == 4096 and e == 2 and res and hints for h in (0, hints)})
for has_w, write_sum, rows, hints in settings:
    const = dict(HAS_R=True, HAS_W=has_w, WRITE_SUM=write_sum, BLOCK=4096, ROWS=rows, BF16_RTNE_BY_HAND=False,
                 LIBRARY_REDUCE=True, EVEN=True, HINTS=hints)
    sig = {a: ("constexpr" if a in const else "fp32" if a == "eps" else "i32") for a in k.arg_names}
    sig.update({p: "*bf16" for p in "XRWSY"})
    ints = [a for a in k.arg_names if sig[a] == "i32"]
    c = triton.compile(ASTSource(k, sig, const, aligned(k, list("XRWSY") + ints)), target=target,
                       options={"num_warps": 16})
    ptx = c.asm["ptx"]
    loads = re.findall(r"ld\.global[^;]*;", ptx)
    out.append(dict(kernel="add_rms_norm", has_w=has_w, write_sum=write_sum, rows=rows, hints=hints, loads=len(loads),
                    vector_loads=sum(".v4" in l for l in loads), evict_first=sum("evict_first" in l for l in loads),
                    evict_last=sum("evict_last" in l for l in loads),
                    layouts=sorted(set(re.findall(r"#ttg\.blocked<\{[^}]*\}>", c.asm["ttgir"]))),
                    local=local_bytes(c)))
print(json.dumps(out))
'''


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU the compiled kernels are run by the gpu tests")
def test_layouts_compile_for_sm90_to_16_byte_accesses():
    """Compiled (not run) for an H100/H200: every proposed layout keeps 16-byte global loads and spills nothing;
    rotary's cos/sin tiles need no shared memory (the broadcast rows do: what ``TABLE_TILE`` removes); ``HINTS`` 2
    stores streaming; Add+LayerNorm's EVEN programs of 4 rows load γ/β without a shared-memory conversion (the
    kernel before loaded them as (1, BLOCK) and converted them through 8 KB of shared memory); Add+RMSNorm's rows
    laid out alike at 2 and 4 rows a program."""
    from triton_testing import compile_for_sm90

    results = compile_for_sm90(_COMPILE_LAYOUTS_FOR_SM90)
    for r in results:
        assert r["local"] in (0, None), f"register spills: {r}"
        if not (r["kernel"] == "rotary" and not r["table"]):
            assert r["loads"] == r["vector_loads"] > 0, f"loads narrower than 16 bytes: {r}"
    rotary = {(r["d"], r["table"]): r for r in results if r["kernel"] == "rotary"}
    assert rotary[128, True]["shared"] == 0 < rotary[128, False]["shared"], rotary
    swiglu_hints = [r for r in results if r["kernel"] == "swiglu" and r["hints"] == 2]
    assert swiglu_hints[0]["streaming_stores"] == swiglu_hints[0]["stores"] > 0
    ln = [r for r in results if r["kernel"] == "add_layernorm"][0]
    # the row reductions' scratch only (64 bytes); γ/β loaded as (1, BLOCK) took 8 KB and 6 more barriers here
    assert ln["shared"] <= 256, f"more shared memory than the row reductions need: {ln}"
    # Add+RMSNorm at 16 warps: 2 and 4 rows a program lay each row out alike (one blocked layout, warps along the
    # row), so each row's sum of squares is reduced in the same order on the GPU too: the same bits, which the
    # interpreter (numpy's sum) cannot show; hints=1 drops the evict-first loads and keeps 16-byte ones
    # Each TUNED entry's hints (1: none, 2: evict-last) against evict-first at the same rows: the same layout, the
    # same 16-byte loads, only the hint on them changes (2 makes x and r evict-last; 1 would drop evict-first)
    rms = {(r["has_w"], r["write_sum"], r["rows"], r["hints"]): r for r in results if r["kernel"] == "add_rms_norm"}
    assert rms[False, True, 4, 0]["layouts"] == rms[False, True, 2, 0]["layouts"]
    assert len(rms[False, True, 2, 0]["layouts"]) == 1 and "warpsPerCTA = [1, 16]" in rms[False, True, 2, 0]["layouts"][0]
    baked = [k for k in rms if k[3]]
    assert len(baked) == 4, sorted(rms)                                  # the four Add+RMSNorm variants at 4096
    for w, ws, rows, hints in baked:
        first, tuned = rms[w, ws, rows, 0], rms[w, ws, rows, hints]
        assert tuned["layouts"] == first["layouts"] and tuned["local"] == first["local"], (first, tuned)
        assert tuned["vector_loads"] == tuned["loads"] == first["loads"] > 0, (first, tuned)
        assert first["evict_first"] >= 2 * rows and tuned["evict_first"] == 0, (first, tuned)   # x and r, per row
        assert tuned["evict_last"] == (tuned["loads"] if hints == 2 else first["evict_last"]), (first, tuned)


def test_add_layernorm_even_path_can_be_switched_off(monkeypatch):
    """``EVEN_PATH`` False (the masked kernel everywhere, as before) plans the masked kernel for rows that fill BLOCK."""
    x = torch.zeros(8, 256)
    assert norm._plan_launch(x, x, None, None, None, 4, True).constexprs["EVEN"] is True
    monkeypatch.setattr(norm, "EVEN_PATH", False)
    assert norm._plan_launch(x, x, None, None, None, 4, True).constexprs["EVEN"] is False


def test_bench_membw_proposes_only_winners_beyond_the_spread():
    """``--propose``: a swept setting replaces the launched one only if its median is under the launched one's
    20th percentile; a win inside the spread, or a setting whose check failed, proposes nothing."""
    import benchmark_scripts

    bench = benchmark_scripts.load("bench_membw")

    def case(name, best_ms, check="ok"):
        rows = [dict(case=name, variant="fused", ms_p50=10.0, ms_p20=9.5, check="ok"),
                dict(case=name, variant="cfg[rows=2,warps=4]", ms_p50=best_ms, ms_p20=best_ms, check=check)]
        summary = dict(case=name, family="layernorm", variant="add_layer_norm", shape="s", dtype="bf16",
                       default=dict(rows=1, warps=4), default_fraction=0.9, best_variant="cfg[rows=2,warps=4]",
                       best_settings=dict(rows=2, warps=4), best_fraction=0.95)
        return rows, summary

    cases = [case("wins", 9.0), case("inside the spread", 9.7), case("failed its check", 8.0, "mismatch")]
    doc = {"layernorm": dict(rows=[r for rows, _ in cases for r in rows], summary=[s for _, s in cases])}
    got = {p["case"]: p["proposed"] for p in bench.proposals(doc)}
    assert got == {"wins": dict(rows=2, warps=4), "inside the spread": None, "failed its check": None}


def test_bench_membw_lean_verify_times_what_changed_and_the_candidates():
    """The lean verify call's ``--cases`` select, in both dtypes, exactly the cases whose launched setting differs
    from ``PREVIOUS`` (timed beside it) or that have ``CANDIDATES`` (the 8B Add+RMSNorm variants), plus the zoo
    rotary; each such case carries its previous setting or its candidates for ``--verify`` to keep."""
    import benchmark_scripts

    bench = benchmark_scripts.load("bench_membw")
    wanted = bench.LEAN_VERIFY_CASES.split(",")
    assert f"--cases '{bench.LEAN_VERIFY_CASES}'" in bench.LEAN_VERIFY and "--verify" in bench.LEAN_VERIFY
    selected, expected = set(), set()
    for dt in (torch.bfloat16, torch.float16):
        for family in (bench.rms_cases, bench.swiglu_cases, bench.rotary_cases, bench.layernorm_cases):
            for case, meta in family("cpu", dt, False):                   # built lazily: no input is made
                if any(w in case.name for w in wanted):
                    selected.add(case.name)
                if meta.get("previous") or meta.get("candidates") or case.name.startswith("rotary zoo"):
                    expected.add(case.name)
                for label in [meta.get("previous"), *meta.get("candidates", ())]:
                    assert label is None or label in case.sweep
    assert selected == expected and len(selected) == 18, sorted(selected ^ expected)
    changed = {n.rsplit(" ", 1)[0] for n in expected if not n.startswith(("rotary", "add_rms_norm 8B",
                                                                          "add_rms_norm_nosum", "add_rms_norm_unit_nosum"))}
    assert changed == {"silu_mul zoo 16384x1376", "silu_mul_packed zoo 16384x1376", "silu_mul 8B 4096x14336",
                       "silu_mul_packed 8B 4096x14336", "add_rms_norm_unit 8B 4096x4096"}, changed


def test_bench_membw_table_puts_a_verify_over_the_sweep(tmp_path):
    """``--table SWEEP,VERIFY``: the verify's cases replace the sweep's, in the sweep's order, each row naming the
    file it came from; the sweep's other cases stay."""
    import json

    import benchmark_scripts

    bench = benchmark_scripts.load("bench_membw")

    def summary(case, fraction):
        variant, shape, dtype = case.split()
        return dict(case=case, family="swiglu", variant=variant, shape=shape, dtype=dtype, copy_gbps=3000.0,
                    default_fraction=fraction, best_fraction=fraction, best_variant="fused", inductor_fraction=None,
                    previous=None, previous_fraction=None, meets_target=fraction >= 0.93, checks_ok=True)
    sweep = {"swiglu": dict(summary=[summary("silu_mul zoo bf16", 0.917), summary("silu_mul 8B bf16", 0.913)],
                            rows=[])}
    verify = {"swiglu": dict(summary=[summary("silu_mul zoo bf16", 0.97)], rows=[])}
    (tmp_path / "sweep.json").write_text(json.dumps(sweep))
    (tmp_path / "verify.json").write_text(json.dumps(verify))
    lines = bench.markdown_table(bench.merge_results([str(tmp_path / "sweep.json"), str(tmp_path / "verify.json")]))
    assert lines[0].endswith(" source |") and len(lines) == 4
    assert "97.0%" in lines[2] and "`verify.json`" in lines[2]
    assert "91.3% (< 93%)" in lines[3] and "`sweep.json`" in lines[3]
    # a second verify over both: its case replaces the first verify's, the rest stay where they came from
    (tmp_path / "verify2.json").write_text(json.dumps({"swiglu": dict(summary=[summary("silu_mul zoo bf16", 0.99)],
                                                                      rows=[])}))
    lines = bench.markdown_table(bench.merge_results([str(tmp_path / f) for f in ("sweep.json", "verify.json",
                                                                                   "verify2.json")]))
    assert len(lines) == 4 and "99.0%" in lines[2] and "`verify2.json`" in lines[2] and "`sweep.json`" in lines[3]
