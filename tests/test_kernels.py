"""Fused kernels against float64 references, on awkward shapes, for every dtype.

(The convolution family's kernels are tested in ``test_fusion_conv.py``, squeeze-and-excitation's
and the ConvNeXt block's in ``test_fusion_squeeze_excite.py`` and ``test_fusion_convnext.py``.)

Without a GPU the Triton kernels run in Triton's interpreter (``TRITON_INTERPRET=1``,
set per test by an autouse fixture, never leaking into other modules), on small shapes. The CUDA-only paths
(cuDNN fused conv, cuBLASLt epilogues, compiled Triton) are marked ``gpu`` and run
with ``pytest -m gpu tests/test_kernels.py`` on a CUDA machine.

Tolerances: ``|out - ref64| <= atol + rtol * |ref64|`` where ``ref64`` is the
unfused computation in float64 from the same inputs upcast. Each kernel module
declares its ``TOLERANCES`` per dtype, a small multiple of the dtype's unit
roundoff ``u`` (fp32 6e-8, fp16 4.9e-4, bf16 3.9e-3) justified by its error model.
NaN never passes (``assert_close`` with ``equal_nan=False`` plus an explicit
finiteness check), and outputs are allocated full of NaN ("poisoned") so an
element a kernel forgets to write fails the test.
"""

from __future__ import annotations

import pytest
import torch
from triton_testing import (DTYPE_IDS, DTYPES, HAS_CUDA, KERNEL_DEVICE, assert_close64, compile_for_sm90,
                            device_params, triton_interpreter, up64)

from explorer.fusions import attention, edit, norm, siblings
from explorer.fusions.kernels import linear_act as linear_kernel
from explorer.fusions.kernels import packed_gemm

gpu = pytest.mark.gpu
needs_cuda = pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device")

# Tolerances live beside each kernel (with their error model); the tests use them as they are.
TOL_ADD_LAYERNORM = norm.TOLERANCES
TOL_MATMUL_SOFTMAX = attention.TOLERANCES
TOL_LINEAR = linear_kernel.TOLERANCES
TOL_ATTENTION = attention.ATTENTION_TOLERANCES


def poison(monkeypatch, module) -> None:
    """Make ``module``'s output allocators return NaN-filled tensors."""
    def nan_output(shape, dtype, device):
        return torch.full(shape, float("nan"), dtype=dtype, device=device)
    monkeypatch.setattr(module, "_new_output", nan_output)
    if hasattr(module, "_new_output_like"):
        monkeypatch.setattr(module, "_new_output_like", lambda t: nan_output(t.shape, t.dtype, t.device))


def rand(shape, dtype, device, gen, scale=1.0):
    return (torch.randn(shape, generator=gen, dtype=torch.float64) * scale).to(dtype=dtype, device=device)


@pytest.fixture
def no_tf32():
    """fp32 GPU results are compared with float64 at 1e-5: keep cuDNN and cuBLAS off TF32."""
    saved = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    yield
    torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved


# ------------------------------------------------------------------- add + LayerNorm

# (rows, hidden); kept small when interpreted
ALN_SHAPES_CPU = [(1, 768), (3, 4095), (37, 1000), (5, 1)]
ALN_SHAPES_GPU = [(1, 768), (3, 4095), (37, 1000), (4097, 768), (257, 16384), (64, 5)]


def _aln_inputs(rows, hidden, dtype, device, gen, affine=True):
    x = rand((rows, hidden), dtype, device, gen)
    r = rand((rows, hidden), dtype, device, gen)
    w = rand(hidden, dtype, device, gen, scale=0.1) + 1 if affine else None
    b = rand(hidden, dtype, device, gen, scale=0.1) if affine else None
    return x, r, w, b


def _check_add_layernorm(rows, hidden, dtype, device, monkeypatch, affine=True):
    gen = torch.Generator().manual_seed(rows * 7919 + hidden)
    x, r, w, b = _aln_inputs(rows, hidden, dtype, device, gen, affine)
    assert norm.select_add_layer_norm(device, hidden, dtype).impl == "triton"
    poison(monkeypatch, norm)
    s, y = norm.add_layernorm(x, r, w, b, 1e-5)
    assert s.dtype == dtype and y.dtype == dtype
    # the sum is one rounded fp32 add, exactly what torch's add does
    assert torch.equal(s, x + r)
    s64, y64 = norm.add_layernorm_reference(up64(x), up64(r), up64(w), up64(b), 1e-5)
    assert_close64(s, s64, TOL_ADD_LAYERNORM[dtype])
    assert_close64(y, y64, TOL_ADD_LAYERNORM[dtype])


@pytest.mark.parametrize("device", device_params())
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("rows, hidden", ALN_SHAPES_CPU)
def test_add_layernorm(rows, hidden, dtype, device, monkeypatch):
    _check_add_layernorm(rows, hidden, dtype, device, monkeypatch)


@gpu
@needs_cuda
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("rows, hidden", ALN_SHAPES_GPU)
def test_add_layernorm_gpu_shapes(rows, hidden, dtype, monkeypatch):
    _check_add_layernorm(rows, hidden, dtype, "cuda", monkeypatch)


@pytest.mark.parametrize("device", device_params())
def test_add_layernorm_without_affine_and_strided_3d(device, monkeypatch):
    gen = torch.Generator().manual_seed(8)
    poison(monkeypatch, norm)
    big = rand((2, 5, 1200), torch.float32, device, gen)
    x = big[..., :1000]                                   # rows strided by 1200, last dim contiguous
    r = rand((2, 5, 1000), torch.float32, device, gen)
    s, y = norm.add_layernorm(x, r, None, None, 1e-6)
    assert s.shape == (2, 5, 1000)
    s64, y64 = norm.add_layernorm_reference(up64(x), up64(r), None, None, 1e-6)
    assert_close64(s, s64, TOL_ADD_LAYERNORM[torch.float32])
    assert_close64(y, y64, TOL_ADD_LAYERNORM[torch.float32])


def test_add_layernorm_falls_back_and_says_so(monkeypatch):
    assert norm.select_add_layer_norm("cpu", MAX := norm.MAX_HIDDEN + 1).impl == "reference"
    assert norm.select_add_layer_norm("cpu", 64, torch.float64).impl == "reference"
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert norm.select_add_layer_norm("cpu", 64).impl == "reference"
    x = torch.randn(3, MAX, dtype=torch.float64)
    s, y = norm.add_layernorm(x, x, None, None)
    s_ref, y_ref = norm.add_layernorm_reference(x, x, None, None)
    assert torch.equal(s, s_ref) and torch.equal(y, y_ref)


@pytest.mark.parametrize("device", device_params())
def test_add_layernorm_describe(device):
    assert norm.select_add_layer_norm(device, 768, torch.float16).label.startswith(
        "triton add+layer_norm (1 kernel, 2 outputs)")
    assert "the sum is not written" in norm.select_add_layer_norm(device, 768, torch.float16, keep_sum=False).label
    assert norm.select_add_layer_norm(device, norm.MAX_HIDDEN + 1).label.startswith("add + layer_norm (2 kernels")


@pytest.mark.parametrize("device", device_params())
@pytest.mark.parametrize("per_program", [2, 4, 8])
def test_add_layernorm_row_tails(per_program, device, monkeypatch):
    """37 rows in programs of 2, 4 or 8: the last program's spare rows must stay masked."""
    gen = torch.Generator().manual_seed(11)
    x, r, w, b = _aln_inputs(37, 200, torch.float32, device, gen, True)
    poison(monkeypatch, norm)
    s, y = norm.add_layernorm(x, r, w, b, 1e-5, rows_per_prog=per_program)
    assert torch.equal(s, x + r)
    _, y64 = norm.add_layernorm_reference(up64(x), up64(r), up64(w), up64(b), 1e-5)
    assert_close64(y, y64, TOL_ADD_LAYERNORM[torch.float32])


def test_launch_config_scales_warps():
    assert norm.launch_config(4096) == (4096, 8)
    assert norm.launch_config(4095) == (4096, 8)
    assert norm.launch_config(768) == (1024, 4)
    assert norm.launch_config(16384) == (16384, 16)


# ------------------------------------------------------------------- matmul + softmax

MMS_CASES = [
    # a shape, b shape, mask shape or None
    ((37, 24), (24, 45), None),
    ((2, 3, 17, 64), (2, 3, 64, 100), (2, 1, 1, 100)),        # BERT-style padding mask
    ((5, 7, 33), (33, 9), (7, 9)),                            # b and mask broadcast over batch
    ((2, 2, 3, 1, 16), (2, 2, 3, 16, 129), (2, 1, 1, 1, 129)),  # 3 batch dims, N = 129
]
MMS_IDS = ["2d", "bert-mask", "broadcast-b", "3-batch-dims"]


def _mms_inputs(case, dtype, device, gen):
    a_shape, b_shape, m_shape = case
    a = rand(a_shape, dtype, device, gen)
    b = rand(b_shape, dtype, device, gen)
    mask = None
    if m_shape is not None:
        mask = rand(m_shape, dtype, device, gen)
        mask[..., -3:] = float("-inf")                       # padded keys
    return a, b, mask


@pytest.mark.parametrize("device", device_params())
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("case", MMS_CASES, ids=MMS_IDS)
def test_matmul_softmax(case, dtype, device, monkeypatch):
    gen = torch.Generator().manual_seed(9)
    a, b, mask = _mms_inputs(case, dtype, device, gen)
    scale = a.shape[-1] ** -0.5
    assert attention.select_for_tensors(a, b, mask).impl == "triton"
    poison(monkeypatch, attention)
    p = attention.matmul_softmax(a, b, scale, mask)
    assert p.dtype == dtype
    ref64 = attention.matmul_softmax_reference(up64(a), up64(b), scale, up64(mask))
    assert_close64(p, ref64, TOL_MATMUL_SOFTMAX[dtype])
    if mask is not None:
        assert (p[..., -3:] == 0).all(), "masked keys must get probability 0"


@gpu
@needs_cuda
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("n", [128, 1000, 1024])
def test_matmul_softmax_gpu_long_rows(n, dtype, monkeypatch, no_tf32):
    gen = torch.Generator().manual_seed(10)
    a, b, mask = _mms_inputs(((3, 4, 77, 64), (3, 4, 64, n), (3, 1, 1, n)), dtype, "cuda", gen)
    poison(monkeypatch, attention)
    p = attention.matmul_softmax(a, b, 0.125, mask)
    ref64 = attention.matmul_softmax_reference(up64(a), up64(b), 0.125, up64(mask))
    assert_close64(p, ref64, TOL_MATMUL_SOFTMAX[dtype])


@pytest.mark.parametrize("device", device_params())
def test_matmul_softmax_bool_mask(device, monkeypatch):
    gen = torch.Generator().manual_seed(11)
    a, b, _ = _mms_inputs(((2, 5, 16), (2, 16, 21), None), torch.float32, device, gen)
    keep = torch.ones(2, 1, 21, dtype=torch.bool, device=device)
    keep[1, :, 7:] = False
    poison(monkeypatch, attention)
    p = attention.matmul_softmax(a, b, 0.5, keep)
    ref64 = attention.matmul_softmax_reference(up64(a), up64(b), 0.5, keep.cpu())
    assert_close64(p, ref64, TOL_MATMUL_SOFTMAX[torch.float32])
    assert (p[1, :, 7:] == 0).all()


@pytest.mark.parametrize("device", device_params())
def test_matmul_softmax_describe(device):
    a, b = torch.randn(2, 3, 8, device=device), torch.randn(2, 8, 5, device=device)
    assert attention.select_for_tensors(a, b).label.startswith("triton matmul+scale+mask+softmax")
    long_b = torch.randn(2, 8, attention.MAX_FUSED_N + 1, device=device)
    assert attention.select_for_tensors(a, long_b, torch.zeros(1, device=device)).label.startswith("matmul, scale, mask, softmax (4 kernels")


def test_matmul_softmax_long_rows_fall_back_with_reason():
    a = torch.randn(2, 3, 8).to(KERNEL_DEVICE)          # where Triton runs: the length is the only reason left
    b = torch.randn(2, 8, attention.MAX_FUSED_N + 1).to(KERNEL_DEVICE)
    choice = attention.select_for_tensors(a, b)
    assert choice.impl == "reference" and "does not fit" in choice.label and not choice.fused
    torch.testing.assert_close(attention.matmul_softmax(a, b), attention.matmul_softmax_reference(a, b), rtol=0, atol=0)
    assert attention.select_for_tensors(a.double(), b.double()[..., :10]).impl == "reference"


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=[gpu, needs_cuda])])
def test_attention_matches_explicit_reference(dtype, device, no_tf32):
    gen = torch.Generator().manual_seed(12)
    q = rand((2, 3, 5, 16), dtype, device, gen)
    k = rand((2, 3, 11, 16), dtype, device, gen)
    v = rand((2, 3, 11, 8), dtype, device, gen)
    mask = rand((2, 1, 1, 11), dtype, device, gen)
    out = attention.attention(q, k, v, 0.25, mask)
    ref64 = attention.attention_reference(up64(q), up64(k), up64(v), 0.25, up64(mask))
    assert_close64(out, ref64, TOL_ATTENTION[dtype])
    # the unfused reference in the same dtype is within the same tolerance
    assert_close64(attention.attention_reference(q, k, v, 0.25, mask), ref64, TOL_ATTENTION[dtype])


# ------------------------------------------------------------------- linear + activation

LINEAR_SHAPES = [((1, 24), 17), ((3, 5, 40), 33), ((37, 64), 100)]


@pytest.mark.parametrize("act", linear_kernel.LINEAR_ACTIVATIONS)
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("x_shape, out_features", LINEAR_SHAPES)
def test_linear_act_cpu(x_shape, out_features, dtype, act):
    gen = torch.Generator().manual_seed(13)
    x = rand(x_shape, dtype, "cpu", gen)
    w = rand((out_features, x_shape[-1]), dtype, "cpu", gen, scale=x_shape[-1] ** -0.5)
    b = rand(out_features, dtype, "cpu", gen)
    out = linear_kernel.linear_act(x, w, b, act)
    ref64 = linear_kernel.linear_act_reference(up64(x), up64(w), up64(b), act)
    assert_close64(out, ref64, TOL_LINEAR[dtype])
    assert "cuBLASLt" not in linear_kernel.select_linear_act("cpu", dtype, act).label


@pytest.mark.parametrize("approximate, act", [("none", "gelu"), ("tanh", "gelu_tanh")])
def test_linear_gelu_variant_is_read_from_the_graph(approximate, act):
    """The exact and tanh GELUs differ by up to ~5e-4: the rewrite must hand the fused call the
    variant the model uses, and the fused chain must compute exactly the model's function."""
    from explorer.fusion_engine import detect
    from explorer.fusions.plan import make_plan
    from explorer.fusions.rewrite import apply_plan
    from explorer.graph.build import build_graph
    from explorer.sources import capture

    block = torch.nn.Sequential(torch.nn.Linear(24, 40), torch.nn.GELU(approximate=approximate)).eval()
    x = torch.randn(3, 24, generator=torch.Generator().manual_seed(0))
    gm = capture(block, (x,), "linear_gelu")
    det = detect(build_graph(gm, "linear_gelu"))
    fused = apply_plan(gm, det, make_plan(det))
    (call,) = [n for n in fused.gm.graph.nodes if n.target is linear_kernel.fused_linear_act]
    assert call.args[-1] == act
    with torch.no_grad():
        assert torch.equal(fused.gm(x), block(x))


@gpu
@needs_cuda
@pytest.mark.parametrize("act", linear_kernel.LINEAR_ACTIVATIONS)
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("x_shape, out_features", LINEAR_SHAPES + [((4, 128, 768), 3072)])
def test_linear_act_gpu(x_shape, out_features, dtype, act, no_tf32):
    gen = torch.Generator().manual_seed(14)
    x = rand(x_shape, dtype, "cuda", gen)
    w = rand((out_features, x_shape[-1]), dtype, "cuda", gen, scale=x_shape[-1] ** -0.5)
    b = rand(out_features, dtype, "cuda", gen)
    label = linear_kernel.select_linear_act("cuda", dtype, act).label
    if act == "relu":
        assert label.startswith("cuBLASLt")
    variant = linear_kernel.gelu_epilogue_variant("cuda", dtype)
    assert variant in ("gelu", "gelu_tanh")
    assert label.startswith("cuBLASLt") == (act == "relu" or act == variant)
    out = linear_kernel.linear_act(x, w, b, act)
    ref64 = linear_kernel.linear_act_reference(up64(x), up64(w), up64(b), act)
    assert_close64(out, ref64, TOL_LINEAR[dtype])


# ------------------------------------------------------------------- sibling linears (horizontal fusion)

SIBLING_CASES = [((1, 24), (17,) * 2, True), ((3, 5, 40), (33, 7, 20), True), ((37, 64), (100, 1, 64), False)]


def _sibling_inputs(x_shape, sizes, bias, dtype, device, gen):
    x = rand(x_shape, dtype, device, gen)
    ws = [rand((n, x_shape[-1]), dtype, device, gen, scale=x_shape[-1] ** -0.5) for n in sizes]
    bs = [rand(n, dtype, device, gen) if bias else None for n in sizes]
    return x, ws, bs


def _check_siblings(x_shape, sizes, bias, dtype, device):
    gen = torch.Generator().manual_seed(15)
    x, ws, bs = _sibling_inputs(x_shape, sizes, bias, dtype, device, gen)
    weight, b, got_sizes = packed_gemm.concat_weights(ws, bs)
    assert got_sizes == list(sizes) and weight.shape == (sum(sizes), x_shape[-1])
    outs = siblings.fused_linear_siblings(x, weight, b, got_sizes)
    refs = packed_gemm.packed_linear_reference(up64(x), [up64(w) for w in ws], [up64(t) for t in bs])
    assert len(outs) == len(sizes)
    base = outs[0].untyped_storage().data_ptr()
    for out, ref in zip(outs, refs):
        assert_close64(out, ref, packed_gemm.PACKED_TOLERANCES[dtype])
        assert out.untyped_storage().data_ptr() == base  # views of one output: no copy
        assert out.stride(-1) == 1 and out.stride(-2) == sum(sizes)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("x_shape, sizes, bias", SIBLING_CASES)
def test_linear_siblings_cpu(x_shape, sizes, bias, dtype):
    _check_siblings(x_shape, sizes, bias, dtype, "cpu")


@gpu
@needs_cuda
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("x_shape, sizes, bias", SIBLING_CASES + [((4, 128, 768), (768,) * 3, True)])
def test_linear_siblings_gpu(x_shape, sizes, bias, dtype, no_tf32):
    _check_siblings(x_shape, sizes, bias, dtype, "cuda")


def test_concat_weights_refuses_mismatches():
    w = torch.randn(4, 8)
    with pytest.raises(ValueError, match="in_features"):
        packed_gemm.concat_weights([w, torch.randn(4, 9)], [None, None])
    with pytest.raises(ValueError, match="bias"):
        packed_gemm.concat_weights([w, w], [torch.randn(4), None])
    with pytest.raises(ValueError, match="dtype"):
        packed_gemm.concat_weights([w, w.half()], [None, None])


def test_a_packed_gemm_call_is_known_by_its_mark_not_its_family():
    """Rotary's QKV epilogue finds the siblings' one GEMM by the mark the siblings put on their fused call
    (``packed_gemm_call``), without importing the siblings; an unmarked call is not one."""
    assert packed_gemm.is_packed_gemm_call(siblings.fused_linear_siblings)
    assert not packed_gemm.is_packed_gemm_call(packed_gemm.packed_linear)
    assert not packed_gemm.is_packed_gemm_call(torch.split_with_sizes)
    # rotary's reader of the QKV column views, on a graph with the siblings' fused call not lowered yet
    import operator

    from explorer.fusions import rotary

    g = torch.fx.Graph()
    x, w = g.placeholder("x"), g.placeholder("w")
    packed = g.call_function(siblings.fused_linear_siblings, (x, w, None, [8, 4, 4]))
    q = g.call_function(torch.transpose, (g.call_method("view", (g.call_function(operator.getitem, (packed, 0)),
                                                                (1, 3, 2, 4))), 1, 2))
    found = rotary._projection_source(q)
    assert found is not None and found[1] is packed and found[2] == 0 and found[3] == (x, w, None, [8, 4, 4])
    packed.target = packed_gemm.packed_linear          # the same call, unmarked: not a packed GEMM rotary knows
    assert rotary._projection_source(q) is None


# ------------------------------------------------------------------- compiled code (no GPU needed)

_COMPILE_FOR_SM90 = r'''
from explorer.fusions import attention, norm

def aligned(kernel, names):  # what Triton's launcher assumes for 16-aligned pointers and ints
    return {(list(kernel.arg_names).index(n),): [["tt.divisibility", 16]] for n in names}

out = []
k = norm._build_kernel(False)
for dt, hidden in (("fp32", 4096), ("bf16", 4096), ("fp16", 768), ("fp32", 16384)):
    block, warps = norm.launch_config(hidden)
    sig = {n: "i32" for n in ("stride_x", "stride_r", "stride_s", "stride_y", "M", "N", "R_ROWS")}
    sig.update({p: "*" + dt for p in "XRWBSY"}, eps="fp32")
    const = dict(HAS_W=True, HAS_B=True, BLOCK=block, BF16_RTNE_BY_HAND=False, LIBRARY_REDUCE=True,
                 ROWS=norm.DEFAULT_ROWS_PER_PROGRAM, WRITE_SUM=True, EVEN=hidden == block)
    sig.update({c: "constexpr" for c in const})
    c = triton.compile(ASTSource(k, sig, const, aligned(k, list("XRWBSY") + list(sig)[:6])),
                       target=target, options={"num_warps": warps})
    loads = re.findall(r"ld\.global[^;]*;", c.asm["ptx"])
    out.append(dict(kernel="add_layernorm", dtype=dt, hidden=hidden, loads=len(loads),
                    vector_loads=sum(".v4" in l for l in loads), local=local_bytes(c)))
k = attention._build_kernel(False)
for dt, n, depth, forms in (("fp16", 128, 64, False), ("bf16", 1000, 64, True), ("fp32", 1024, 64, False)):
    cfg = attention.launch_config(n, depth, 4 if dt == "fp32" else 2)
    const = dict(HAS_MASK=True, HAS_TSCALE=forms, HAS_CAP=forms, DOT_PRECISION="ieee" if dt == "fp32" else "tf32",
                 UPCAST=False, LIBRARY_REDUCE=True, BLOCK_M=cfg["BLOCK_M"], BLOCK_N=cfg["BLOCK_N"],
                 BLOCK_K=cfg["BLOCK_K"])
    sig = {a: ("constexpr" if a in const else "i32") for a in k.arg_names}
    sig.update(A="*" + dt, Bm="*" + dt, MASK="*" + dt, O="*" + dt, TS="*" + dt, scale="fp32", cap="fp32")
    c = triton.compile(ASTSource(k, sig, const, aligned(k, ["A", "Bm", "MASK", "O"])), target=target,
                       options={"num_warps": cfg["num_warps"], "num_stages": cfg["num_stages"]})
    out.append(dict(kernel="matmul_softmax", dtype=dt, n=n, local=local_bytes(c)))
print(json.dumps(out))
'''


@pytest.mark.skipif(HAS_CUDA, reason="on a GPU the compiled kernels are run by the gpu tests")
def test_triton_kernels_compile_for_sm90_without_gpu():
    """Compile (not run) both Triton kernels for an H100/H200 (sm_90): the interpreter does not
    check what only the compiler does. On 16-byte aligned rows the add+LayerNorm kernel must
    use only 128-bit loads, and no kernel may spill registers to local memory."""
    results = compile_for_sm90(_COMPILE_FOR_SM90)
    for r in results:
        assert r["local"] in (0, None), f"register spills: {r}"
        if r["kernel"] == "add_layernorm" and r["hidden"] % 16 == 0:
            assert r["loads"] == r["vector_loads"] > 0, f"scalar loads on aligned rows: {r}"


def test_launch_specialization_keys():
    from explorer.fusions.triton_support import _specialization

    t = torch.zeros(8)
    assert _specialization(t) == ("t", torch.float32, True)
    assert _specialization(t[1:]) == ("t", torch.float32, False)         # 4 bytes off: not 16-aligned
    assert _specialization(1) != _specialization(2) != _specialization(16)
    assert _specialization(32) == _specialization(48)
    assert _specialization(1 << 31) != _specialization(32)               # needs a 64-bit integer


@gpu
@needs_cuda
@pytest.mark.parametrize("offsets", [
    ((0, 0), (1, 1), (0, 0), (1, 1), (4, 4), (1, 1)),      # both aligned, then both not, alternating
    ((0, 1), (1, 0), (0, 1), (1, 1), (0, 0), (1, 0)),      # one aligned and the other not, both ways
], ids=["together", "mixed"])
def test_launch_cache_keeps_specialisations_apart(offsets):
    """Aligned and misaligned rows alternate: each launch must use the kernel compiled for its own
    alignments (one shared "all aligned" flag would launch a kernel compiled for the other)."""
    gen = torch.Generator(device="cuda").manual_seed(3)
    base = torch.randn(2, 5 * 768 + 4, device="cuda", generator=gen)
    for off_x, off_r in offsets:
        x = base[0, off_x:off_x + 5 * 768].view(5, 768)
        r = base[1, off_r:off_r + 5 * 768].view(5, 768)
        s, y = norm.add_layernorm(x, r, None, None, 1e-5)
        assert torch.equal(s, x + r)
        _, y64 = norm.add_layernorm_reference(x.double(), r.double(), None, None, 1e-5)
        assert_close64(y, y64, TOL_ADD_LAYERNORM[torch.float32])


@pytest.mark.parametrize("device", device_params())
def test_add_layernorm_fast_path_is_planned_once_and_stays_right(device, monkeypatch):
    """Contiguous inputs are planned once per signature; later calls on fresh inputs (the
    same shapes, as a model's forward makes them) reuse the plan and stay correct."""
    gen = torch.Generator().manual_seed(12)
    poison(monkeypatch, norm)
    for dtype in (torch.float32, torch.bfloat16):
        before = len(norm._LAUNCHES)
        for call in range(3):
            x = rand((3, 7, 96), dtype, device, gen)
            r = rand((3, 7, 96), dtype, device, gen)
            w, b = rand(96, dtype, device, gen, 0.1) + 1, rand(96, dtype, device, gen, 0.1)
            s, y = norm.add_layernorm(x, r, w, b, 1e-5)
            assert s.shape == y.shape == (3, 7, 96)
            assert torch.equal(s, x + r)
            _, y64 = norm.add_layernorm_reference(up64(x), up64(r), up64(w), up64(b), 1e-5)
            assert_close64(y, y64, TOL_ADD_LAYERNORM[dtype])
            assert len(norm._LAUNCHES) == before + 1, "one plan per signature, reused by later calls"
        key = norm._signature(x, r, w, b, 1e-5, None, None)
        assert norm._LAUNCHES[key].kernel is not None                     # the plan runs the kernel
    strided = rand((4, 130), torch.float32, device, gen)[:, :96]
    assert norm._signature(strided, strided, None, None, 1e-5, None, None) is None   # general path


@pytest.mark.parametrize("device", device_params())
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("contiguous", [True, False], ids=["fast-path", "general-path"])
def test_add_layernorm_without_the_sum(dtype, device, contiguous, monkeypatch):
    """``keep_sum=False`` (post-norm blocks: nothing else reads the sum): the normalised output
    is the same as with the sum written, no sum comes back, and the sum's buffer is never
    allocated (one output allocation per call)."""
    gen = torch.Generator().manual_seed(21)
    big = rand((4, 9, 168), dtype, device, gen)
    x = big[..., :160] if not contiguous else big[..., :160].contiguous()     # 160: masked lanes too
    r = rand((4, 9, 160), dtype, device, gen)
    w, b = rand(160, dtype, device, gen, 0.1) + 1, rand(160, dtype, device, gen, 0.1)
    poison(monkeypatch, norm)
    allocations = []
    for name in ("_new_output", "_new_output_like"):
        inner = getattr(norm, name)
        monkeypatch.setattr(norm, name, lambda *a, inner=inner: allocations.append(1) or inner(*a))
    s, y = norm.add_layernorm(x, r, w, b, 1e-5, keep_sum=False)
    assert s is None and len(allocations) == 1
    _, y64 = norm.add_layernorm_reference(up64(x), up64(r), up64(w), up64(b), 1e-5)
    assert_close64(y, y64, TOL_ADD_LAYERNORM[dtype])
    _, y_both = norm.add_layernorm(x, r, w, b, 1e-5)
    assert torch.equal(y, y_both)      # the sum is rounded to the dtype before normalising either way


@pytest.mark.parametrize("device", device_params())
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("r_shape", [(1, 7, 96), (7, 96), (1, 1, 96), (96,)], ids=["1SN", "SN", "11N", "N"])
def test_add_layernorm_residual_broadcast_over_leading_dims(r_shape, dtype, device, monkeypatch):
    """A residual that repeats over the leading dims (BERT's position embeddings, (1, S, N)
    against (B, S, N)) is read row by row modulo its own rows: same result as torch's broadcast."""
    gen = torch.Generator().manual_seed(31)
    x = rand((3, 7, 96), dtype, device, gen)
    r = rand(r_shape, dtype, device, gen)
    w, b = rand(96, dtype, device, gen, 0.1) + 1, rand(96, dtype, device, gen, 0.1)
    poison(monkeypatch, norm)
    assert norm._signature(x, r, w, b, 1e-5, None, None) is not None       # the fast path takes it
    s, y = norm.add_layernorm(x, r, w, b, 1e-5)
    assert s.shape == y.shape == x.shape
    assert torch.equal(s, x + r)
    _, y64 = norm.add_layernorm_reference(up64(x), up64(r), up64(w), up64(b), 1e-5)
    assert_close64(y, y64, TOL_ADD_LAYERNORM[dtype])


def test_leading_broadcast_rule():
    lb = edit.leading_broadcast
    assert lb((1, 7, 96), (3, 7, 96)) and lb((7, 96), (3, 7, 96)) and lb((3, 7, 96), (3, 7, 96))
    assert not lb((3, 1, 96), (3, 7, 96))          # broadcast inside: rows do not repeat as a block
    assert not lb((1, 7, 1), (3, 7, 96))           # broadcast over the normalised dim
    assert not lb((2, 3, 7, 96), (3, 7, 96))       # r is the larger one
