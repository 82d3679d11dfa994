"""Benchmark the CNN fusions of issue 13 on a GPU: the kernels against a copy and cuDNN, three CNNs against torch.compile.

::

    kernels  fp16, batch 32, channels_last, at MobileNetV2 / EfficientNet-B0 / ConvNeXt-Tiny / ResNet-50 shapes:
             epilogue   bias_act_ (bias [+ residual] + act, in place) | eager add_ [add_] act_ | eager bias add_
                        alone | torch.compile of the same epilogue | a copy of the same tensor (1 read + 1 write)
             conv       the whole conv + epilogue: eager (conv with its bias, then add_/act_ in place) | conv
                        without bias + bias_act_ | the depthwise kernel (depthwise convs) | the Triton GEMM with
                        the epilogue (1x1 convs) | cuDNN's fused conv+bias+ReLU (ReLU convs: the
                        1x1-over-large-maps rule of conv.CUDNN_RELU_1X1_MAX_PIXELS)
             dw+LN      ConvNeXt's depthwise 7x7 + bias + LayerNorm over channels: eager | one Triton kernel |
                        torch.compile
             gemm       ConvNeXt's linears: cuBLAS with its bias epilogue + GELU / + residual | one Triton GEMM
                        with the whole epilogue | torch.compile
             se         squeeze-and-excitation: eager (6 ops) | 2 Triton kernels | torch.compile
    models   mobilenet_v2, efficientnet_b0, convnext_tiny in fp16, batch 32, channels_last for every variant:
             eager | fused | fused + CUDA graphs | fused with the depthwise convs on cuDNN | fused with the 1x1
             convs and linears on cuDNN/cuBLAS (conv.POLICY switches: what each Triton path buys) | with
             ConvNeXt's linears as Triton GEMMs with their epilogues (``mlp_gemm_triton``, off by default; models
             with ConvNeXt blocks only) | torch.compile default | reduce-overhead | max-autotune-no-cudagraphs.
             Targets: fused <= the faster of compile default and max-autotune-no-cudagraphs (no CUDA graphs on
             either side); fused + CUDA graphs <= reduce-overhead (CUDA graphs on both).

Method. Kernels: each variant runs over enough input sets that one pass over them is at least 3x the L2
(so no call finds its inputs there); on CUDA the calls over all sets are captured in one CUDA graph (by the
runner's own capture, ``explorer.runtime.variants.make_variant``), and
``explorer.runtime.measure.time_alternated`` times its replays (warm-up, CUDA events, variants alternated
round after round, median with p20/p80), divided by the number of sets: GPU time per call without host gaps.
Every variant is first checked against float64. GB/s from an explicit byte model (each input read once,
each output written once), compared with a copy of the same bytes and a 512 MiB copy in the same run.
Models: graphs prepared by ``measure.prepare_graph`` as the runner times them, the eager module and
torch.compile's copies by ``measure.prepare_module``, every input channels_last; ``time_alternated`` over
all variants of a session; per variant the median with p20/p80, the GPU-busy time of one forward (the union
of its kernels' intervals in ``torch.profiler``), the kernel count, the error against the unfused graph in
float64, and the top kernels of the fused model and of torch.compile's faster mode (the per-kernel profile
that says where a target is missed). max-autotune-no-cudagraphs, the slowest compile, runs in a second
session with fused and compile default alternated again (the first session is written to the JSON first).

Usage (each call fits a 10-minute limit; estimates for an H200, mostly compiling)::

    python benchmarks/bench_cnn_fusions.py --part kernels                  # ~3-5 min
    python benchmarks/bench_cnn_fusions.py --part models --models mobilenet_v2     # ~4-7 min each model
    python benchmarks/bench_cnn_fusions.py --part models --models efficientnet_b0
    python benchmarks/bench_cnn_fusions.py --part models --models convnext_tiny
    python benchmarks/bench_cnn_fusions.py --quick         # both parts, all models: fewer shapes, no max-autotune
    python benchmarks/bench_cnn_fusions.py --smoke         # no GPU: tiny kernel shapes interpreted, models on the CPU

Without CUDA (and without ``--smoke``) it measures nothing, says SKIPPED and exits 0. Writes JSON
(``--out``, default ``$OUT/bench_cnn_fusions_<part>[_<models>].json``, else ``benchmarks/results/``) with
the command, the date, the GPU, driver and library versions and every number, rewritten after each case
and model (a run cut short keeps what it measured), and prints a short table last. ``--budget-s`` bounds
one call: compiles and cases that would start after it are skipped, with a note. Exits 1 when one of our
kernels fails its float64 check or a fused model's error exceeds eager's by more than 3x.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import functools
import math
import os
import sys
import time
import types
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks import _common as common  # noqa: E402  (after the root is on sys.path)

MODELS = ("mobilenet_v2", "efficientnet_b0", "convnext_tiny")
BATCH = 32
#: An eager or compiled fp16 result rounds its intermediates too (conv output, bias add, pooled means):
#: checked against float64 with this (~8u); ours with the kernel's own TOLERANCES.
UNFUSED_TOLERANCE = dict(rtol=4e-3, atol=4e-3)
#: A fused model fails its check when its error against float64 exceeds eager's by this factor (and 5e-3).
MODEL_ERROR_FACTOR = 3.0


# ====================================================================== kernel cases

@dataclasses.dataclass(frozen=True)
class ConvShape:
    """One convolution at 224x224 input: ``c_in -> c_out`` at ``hw`` x ``hw``, then ``act`` (+ residual)."""

    name: str
    c_in: int
    c_out: int
    hw: int
    k: int
    stride: int
    groups: int
    act: str
    residual: bool = False

    @property
    def out_hw(self) -> int:
        return (self.hw + 2 * (self.k // 2) - self.k) // self.stride + 1


def _dw(name: str, c: int, hw: int, k: int, stride: int, act: str) -> ConvShape:
    return ConvShape(name, c, c, hw, k, stride, c, act)


CONV_SHAPES = (
    ConvShape("mbv2.b2.expand 16->96 @112 relu6", 16, 96, 112, 1, 1, 1, "relu6"),
    _dw("mbv2.b2.dw 96 3x3/2 @112 relu6", 96, 112, 3, 2, "relu6"),
    _dw("mbv2.b3.dw 144 3x3 @56 relu6", 144, 56, 3, 1, "relu6"),
    ConvShape("mbv2.b3.project 144->24 @56 +z", 144, 24, 56, 1, 1, 1, "none", True),
    ConvShape("mbv2.b8.expand 64->384 @14 relu6", 64, 384, 14, 1, 1, 1, "relu6"),
    _dw("mbv2.b8.dw 384 3x3 @14 relu6", 384, 14, 3, 1, "relu6"),
    ConvShape("mbv2.b15.project 960->160 @7 +z", 960, 160, 7, 1, 1, 1, "none", True),
    ConvShape("mbv2.head 320->1280 @7 relu6", 320, 1280, 7, 1, 1, 1, "relu6"),
    ConvShape("effb0.stem 3->32 3x3/2 @224 silu", 3, 32, 224, 3, 2, 1, "silu"),
    _dw("effb0.b2.dw 96 3x3/2 @112 silu", 96, 112, 3, 2, "silu"),
    _dw("effb0.b4.dw 240 5x5 @28 silu", 240, 28, 5, 1, "silu"),
    _dw("effb0.b12.dw 1152 5x5 @7 silu", 1152, 7, 5, 1, "silu"),
    ConvShape("effb0.b12.expand 192->1152 @7 silu", 192, 1152, 7, 1, 1, 1, "silu"),
    ConvShape("r50.layer1 1x1 256->64 @56 relu", 256, 64, 56, 1, 1, 1, "relu"),
    ConvShape("r50.layer2 1x1 512->128 @28 relu", 512, 128, 28, 1, 1, 1, "relu"),
    ConvShape("r50.layer3 1x1 1024->256 @14 relu", 1024, 256, 14, 1, 1, 1, "relu"),
    ConvShape("r50.layer1 3x3 64->64 @56 relu", 64, 64, 56, 3, 1, 1, "relu"),
)
QUICK_CONV = {"mbv2.b2.expand 16->96 @112 relu6", "mbv2.b3.dw 144 3x3 @56 relu6", "mbv2.b3.project 144->24 @56 +z",
              "effb0.b4.dw 240 5x5 @28 silu", "r50.layer1 1x1 256->64 @56 relu"}
#: The epilogue alone runs on the outputs of these convolutions (and a ConvNeXt residual).
EPILOGUE_FROM = ("mbv2.b2.expand 16->96 @112 relu6", "mbv2.b3.dw 144 3x3 @56 relu6", "mbv2.b3.project 144->24 @56 +z",
                 "mbv2.b15.project 960->160 @7 +z", "effb0.b4.dw 240 5x5 @28 silu", "mbv2.head 320->1280 @7 relu6")
QUICK_EPILOGUE = {"mbv2.b2.expand 16->96 @112 relu6", "mbv2.b3.project 144->24 @56 +z"}
#: ConvNeXt-Tiny's stages: (channels, spatial size).
DWLN_SHAPES = ((96, 56), (192, 28), (384, 14), (768, 7))
#: Squeeze-excite blocks: (name, channels, squeezed, spatial, act, gate).
SE_SHAPES = (("effb0.se 96(4) @56", 96, 4, 56, "silu", "sigmoid"), ("effb0.se 240(10) @28", 240, 10, 28, "silu", "sigmoid"),
             ("effb0.se 672(28) @14", 672, 28, 14, "silu", "sigmoid"),
             ("effb0.se 1152(48) @7", 1152, 48, 7, "silu", "sigmoid"),
             ("mbv3.se 72(24) @28", 72, 24, 28, "relu", "hardsigmoid"),
             ("mbv3.se 960(240) @7", 960, 240, 7, "relu", "hardsigmoid"))
QUICK_SE = {"effb0.se 96(4) @56", "mbv3.se 960(240) @7"}


@dataclasses.dataclass
class Case:
    """One kernel case.

    ``variants[name](i)`` runs on input set ``i`` (of ``sets``); ``checks[name]()`` returns the output the
    float64 check compares with ``ref64()`` within ``tolerances[name]``; ``bytes`` the byte model of one
    call (``variant_bytes`` for variants that move less, e.g. a copy); ``compile`` = (the unfused body,
    a binder making ``fn(i)`` from its compiled version, the variant's label) for torch.compile's version.
    """

    section: str
    name: str
    sets: int
    variants: dict[str, Callable[[int], Any]]
    checks: dict[str, Callable[[], Any]]
    ref64: Callable[[], Any]
    tolerances: dict[str, dict | None]
    bytes: int
    compile: tuple[Callable, Callable, str]
    variant_bytes: dict[str, int] = dataclasses.field(default_factory=dict)
    notes: list[str] = dataclasses.field(default_factory=list)


def _fresh(fn: Callable, tag: str) -> Callable:
    """A copy of ``fn`` with a code object of its own: dynamo keeps compiled code (and its recompile limit) per
    code object, so every compile of every case is independent (no recompiles, no silent fallback to eager)."""
    code = fn.__code__.replace(co_name=f"{fn.__name__}_{tag}")
    return types.FunctionType(code, fn.__globals__, code.co_name, fn.__defaults__, fn.__closure__)


def _sets(bytes_per_set: int, l2_bytes: int, smoke: bool) -> int:
    """Input sets so that one pass over them is at least 3x the L2 (2 in a smoke run)."""
    return 2 if smoke else max(2, min(64, math.ceil(3 * l2_bytes / max(bytes_per_set, 1))))


def _act(name: str):
    from explorer.fusions.epilogue import apply_activation, apply_activation_
    return (lambda t: apply_activation(t, name)), (lambda t: apply_activation_(t, name))


def epilogue_case(s: ConvShape, device, dtype, batch: int, l2: int, smoke: bool) -> Case:
    """The epilogue alone on ``s``'s output, in place: ours | eager add_/act_ | eager bias add_ | a copy."""
    import torch

    from explorer.fusions import conv

    shape = (batch, s.c_out, s.out_hw, s.out_hw)
    y_bytes = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
    n = _sets(y_bytes * (2 if s.residual else 1), l2, smoke)
    gen = torch.Generator(device=device).manual_seed(2)
    fmt = torch.channels_last
    ys = [torch.randn(shape, device=device, generator=gen).to(dtype).contiguous(memory_format=fmt) for _ in range(n)]
    zs = [torch.randn(shape, device=device, generator=gen).to(dtype).contiguous(memory_format=fmt)
          for _ in range(n)] if s.residual else None
    dst = [torch.empty_like(y) for y in ys]
    b = torch.randn(s.c_out, device=device, generator=gen).to(dtype)                     # (C,)
    y0 = ys[0].clone()
    _, act_ = _act(s.act)

    def z(i):
        return None if zs is None else zs[i % n]

    def eager(i):
        y = ys[i % n]
        y.add_(b.view(1, -1, 1, 1))
        if zs is not None:
            y.add_(zs[i % n])
        return act_(y)

    def restore_then(fn):                                                   # the check runs on set 0's values
        def run():
            ys[0].copy_(y0)
            return fn(0)
        return run

    def compiled_body(y, b, zz):
        v = y + b.view(1, -1, 1, 1)                                         # (N, C, H, W)
        if zz is not None:
            v = v + zz
        return y.copy_(_act(s.act)[0](v))

    variants = {"ours bias_act_": lambda i: conv.bias_act_(ys[i % n], b, z(i), s.act), "eager add_ [add_ z] act_": eager,
                "eager bias add_ only": lambda i: ys[i % n].add_(b.view(1, -1, 1, 1)),
                "copy of y (1R+1W)": lambda i: dst[i % n].copy_(ys[i % n])}
    return Case("epilogue", f"{s.name} -> y {tuple(shape)}", n, variants,
                {"ours bias_act_": restore_then(variants["ours bias_act_"]),
                 "eager add_ [add_ z] act_": restore_then(eager)},
                lambda: conv.bias_act_reference(y0.double(), b.double(), None if zs is None else zs[0].double(),
                                                s.act),
                {"ours bias_act_": conv.BIAS_ACT_TOLERANCES[dtype], "eager add_ [add_ z] act_": UNFUSED_TOLERANCE},
                2 * y_bytes + s.c_out * 2 + (y_bytes if s.residual else 0),
                (compiled_body, lambda fn: (lambda i: fn(ys[i % n], b, z(i))), "inductor y.copy_(act(y + b [+ z]))"),
                variant_bytes={"eager bias add_ only": 2 * y_bytes, "copy of y (1R+1W)": 2 * y_bytes})


def conv_case(s: ConvShape, device, dtype, batch: int, l2: int, smoke: bool) -> Case:
    """conv + bias (+ z) + act: eager | conv without bias + bias_act_ | the depthwise kernel | cuDNN's fused call."""
    import torch
    import torch.nn.functional as F

    from explorer.fusions import conv

    es = torch.empty((), dtype=dtype).element_size()
    x_bytes = batch * s.c_in * s.hw * s.hw * es
    y_bytes = batch * s.c_out * s.out_hw * s.out_hw * es
    n = _sets(x_bytes + (y_bytes if s.residual else 0), l2, smoke)
    gen = torch.Generator(device=device).manual_seed(1)
    fmt = torch.channels_last
    xs = [torch.randn(batch, s.c_in, s.hw, s.hw, device=device, generator=gen).to(dtype).contiguous(memory_format=fmt)
          for _ in range(n)]                                                 # (N, C_in, H, W) each
    fan_in = (s.c_in // s.groups) * s.k * s.k
    w = (torch.randn(s.c_out, s.c_in // s.groups, s.k, s.k, device=device, generator=gen) * fan_in ** -0.5
         ).to(dtype).contiguous(memory_format=fmt)                           # (C_out, C_in/g, k, k)
    packed = conv.pack_depthwise_weight(w)
    b = (torch.randn(s.c_out, device=device, generator=gen) * 0.5).to(dtype)
    zs = [torch.randn(batch, s.c_out, s.out_hw, s.out_hw, device=device, generator=gen).to(dtype).contiguous(
        memory_format=fmt) for _ in range(n)] if s.residual else None
    args = (s.stride, s.k // 2, 1, s.groups)
    _, act_ = _act(s.act)

    def z(i):
        return None if zs is None else zs[i % n]

    def eager(i):
        y = F.conv2d(xs[i % n], w, b, *args)                                 # ATen adds the bias on its own
        if zs is not None:
            y.add_(zs[i % n])
        return act_(y)

    variants = {"eager conv+bias, add_, act_": eager,
                "ours conv (no bias) + bias_act_": lambda i: conv.bias_act_(F.conv2d(xs[i % n], w, None, *args),
                                                                            b, z(i), s.act)}
    tol = {"eager conv+bias, add_, act_": UNFUSED_TOLERANCE, "ours conv (no bias) + bias_act_": conv.TOLERANCES[dtype]}
    if s.groups > 1 and s.groups == s.c_in == s.c_out:
        variants["ours depthwise kernel"] = lambda i: conv.depthwise_conv(xs[i % n], packed, b, z(i), s.stride,
                                                                          s.k // 2, 1, s.act)
        tol["ours depthwise kernel"] = conv.DEPTHWISE_TOLERANCES[dtype]
    if s.k == 1 and s.stride == 1 and s.groups == 1:
        variants["ours 1x1 GEMM + epilogue (1 kernel)"] = lambda i: conv.conv1x1_epilogue(xs[i % n], w, b, z(i), s.act)
        tol["ours 1x1 GEMM + epilogue (1 kernel)"] = conv.TOLERANCES[dtype]
    if s.act == "relu" and device.type == "cuda":
        variants["cudnn conv+bias+relu (1 call)"] = lambda i: torch.cudnn_convolution_relu(
            xs[i % n], w, b, [s.stride] * 2, [s.k // 2] * 2, [1, 1], s.groups)
        tol["cudnn conv+bias+relu (1 call)"] = conv.TOLERANCES[dtype]
    choice = conv.select_conv_epilogue(device, dtype, s.act, residual=s.residual, kernel_size=(s.k, s.k),
                                       depthwise=s.groups > 1 and s.groups == s.c_in,
                                       pointwise=conv.is_pointwise_conv((s.c_out, s.c_in, s.k, s.k), s.stride,
                                                                        s.k // 2, 1, s.groups),
                                       out_pixels=batch * s.out_hw ** 2, layout="nhwc")

    def compiled_body(x, w, b, zz):
        y = F.conv2d(x, w, b, *args)
        if zz is not None:
            y = y + zz
        return _act(s.act)[0](y)

    return Case("conv", s.name, n, variants, {v: (lambda v=v: variants[v](0)) for v in tol},
                lambda: conv.conv_epilogue_reference(xs[0].double().contiguous(), w.double().contiguous(), b.double(),
                                                     None if zs is None else zs[0].double(), *args, act=s.act),
                tol, 2 * y_bytes + (y_bytes if s.residual else 0),
                (compiled_body, lambda fn: (lambda i: fn(xs[i % n], w, b, z(i))), "inductor conv+bias(+z)+act"),
                notes=[f"the selection picks: {choice.impl} ({choice.label})",
                       "bytes: the epilogue's (conv output written and read, residual read); time includes the conv"])


def dwln_case(c: int, hw: int, device, dtype, batch: int, l2: int, smoke: bool) -> Case:
    """ConvNeXt's depthwise 7x7 + bias + LayerNorm over channels: eager (cuDNN conv, permute, layer_norm) | ours."""
    import torch
    import torch.nn.functional as F

    from explorer.fusions import conv

    x_bytes = batch * c * hw * hw * torch.empty((), dtype=dtype).element_size()
    n = _sets(x_bytes, l2, smoke)
    gen = torch.Generator(device=device).manual_seed(4)
    xs = [torch.randn(batch, c, hw, hw, device=device, generator=gen).to(dtype).contiguous(
        memory_format=torch.channels_last) for _ in range(n)]
    w = (torch.randn(c, 1, 7, 7, device=device, generator=gen) / 7).to(dtype)
    packed = conv.pack_depthwise_weight(w)
    b = torch.randn(c, device=device, generator=gen).to(dtype)
    lw = (1 + 0.1 * torch.randn(c, device=device, generator=gen)).to(dtype)
    lb = (0.1 * torch.randn(c, device=device, generator=gen)).to(dtype)

    def eager_body(x, w, b, lw, lb):
        return F.layer_norm(F.conv2d(x, w, b, 1, 3, 1, c).permute(0, 2, 3, 1), (c,), lw, lb, 1e-6)   # (N, H, W, C)

    variants = {"eager dwconv+bias, layer_norm": lambda i: eager_body(xs[i % n], w, b, lw, lb),
                "ours 1 kernel": lambda i: conv.depthwise_conv(xs[i % n], packed, b, None, 1, 3, 1, "none",
                                                               norm=(lw, lb, 1e-6)).permute(0, 2, 3, 1)}
    return Case("dw+LN", f"convnext dwconv7x7+LN {c} @{hw}", n, variants,
                {v: (lambda v=v: variants[v](0)) for v in variants},
                lambda: eager_body(xs[0].double(), w.double(), b.double(), lw.double(), lb.double()),
                {"eager dwconv+bias, layer_norm": UNFUSED_TOLERANCE, "ours 1 kernel": conv.DEPTHWISE_TOLERANCES[dtype]},
                2 * x_bytes, (eager_body, lambda fn: (lambda i: fn(xs[i % n], w, b, lw, lb)),
                              "inductor dwconv+bias+layer_norm"),
                notes=["bytes: x read once, the normalised output written once"])


#: ConvNeXt-Tiny's MLP linears: (name, channels, spatial size, which).
GEMM_SHAPES = (("convnext.s1.fc1 96->384 @56 gelu", 96, 56, "fc1"), ("convnext.s1.fc2 384->96 @56 +z", 96, 56, "fc2"),
               ("convnext.s3.fc1 384->1536 @14 gelu", 384, 14, "fc1"),
               ("convnext.s3.fc2 1536->384 @14 +z", 384, 14, "fc2"))
QUICK_GEMM = {"convnext.s1.fc1 96->384 @56 gelu", "convnext.s3.fc2 1536->384 @14 +z"}


def gemm_case(spec, device, dtype, batch: int, l2: int, smoke: bool) -> Case:
    """ConvNeXt's linears: cuBLAS (bias in its epilogue) + GELU / + residual pass | one Triton GEMM with its epilogue."""
    import torch
    import torch.nn.functional as F

    from explorer.fusions import conv, convnext

    name, c, hw, which = spec
    k, n_out = (c, 4 * c) if which == "fc1" else (4 * c, c)
    m = batch * hw * hw
    es = torch.empty((), dtype=dtype).element_size()
    n = _sets((m * k + m * n_out) * es, l2, smoke)
    gen = torch.Generator(device=device).manual_seed(5)
    a_sets = [torch.randn(m, k, device=device, generator=gen).to(dtype) for _ in range(n)]            # (M, K)
    z_sets = [torch.randn(m, n_out, device=device, generator=gen).to(dtype) for _ in range(n)] if which == "fc2" \
        else None
    w = (torch.randn(n_out, k, device=device, generator=gen) * k ** -0.5).to(dtype)                  # (N, K)
    b = (0.1 * torch.randn(n_out, device=device, generator=gen)).to(dtype)
    act = "gelu" if which == "fc1" else "none"

    def z(i):
        return None if z_sets is None else z_sets[i % n]

    def eager_body(a, w, b, zz):
        y = F.linear(a, w, b)                                               # cuBLASLt adds the bias
        return F.gelu(y) if zz is None else y.add_(zz)

    variants = {"eager cuBLAS linear + " + ("gelu" if which == "fc1" else "add_ z"):
                lambda i: eager_body(a_sets[i % n], w, b, z(i)),
                "ours GEMM + epilogue (1 kernel)": lambda i: conv.gemm_epilogue(a_sets[i % n], w, b, z(i), act)}
    eager_name = next(iter(variants))
    return Case("gemm", name, n, variants, {v: (lambda v=v: variants[v](0)) for v in variants},
                lambda: eager_body(a_sets[0].double(), w.double(), b.double(), None if z_sets is None else
                                   z_sets[0].double()),
                {eager_name: UNFUSED_TOLERANCE, "ours GEMM + epilogue (1 kernel)": convnext.TOLERANCES[dtype]},
                (m * k + n_out * k + m * n_out * (2 if which == "fc2" else 1)) * es,
                (eager_body, lambda fn: (lambda i: fn(a_sets[i % n], w, b, z(i))), "inductor linear + epilogue"),
                notes=[f"{2 * m * n_out * k / 1e9:.2f} GFLOP per call; bytes: a, w, z read once, the output written "
                       "once"])


def se_case(spec, device, dtype, batch: int, l2: int, smoke: bool) -> Case:
    """Squeeze-and-excitation: eager (pool, conv, act, conv, gate, mul) | our 2 Triton kernels."""
    import torch

    from explorer.fusions import squeeze_excite as se

    name, c, cr, hw, act, gate = spec
    x_bytes = batch * c * hw * hw * torch.empty((), dtype=dtype).element_size()
    n = _sets(x_bytes, l2, smoke)
    gen = torch.Generator(device=device).manual_seed(3)
    xs = [(torch.randn(batch, c, hw, hw, device=device, generator=gen)
           + torch.randn(batch, c, 1, 1, device=device, generator=gen)).to(dtype).contiguous(
        memory_format=torch.channels_last) for _ in range(n)]
    w1 = (torch.randn(cr, c, 1, 1, device=device, generator=gen) * 2 * c ** -0.5).to(dtype)
    b1 = torch.randn(cr, device=device, generator=gen).to(dtype)
    w2 = (torch.randn(c, cr, 1, 1, device=device, generator=gen) * 2 * cr ** -0.5).to(dtype)
    b2 = torch.randn(c, device=device, generator=gen).to(dtype)
    variants = {"eager (6 ops)": lambda i: se.squeeze_excite_reference(xs[i % n], w1, b1, w2, b2, act, gate),
                "ours 2 kernels": lambda i: se.squeeze_excite(xs[i % n], w1, b1, w2, b2, act, gate)}
    return Case("se", name, n, variants, {v: (lambda v=v: variants[v](0)) for v in variants},
                lambda: se.squeeze_excite_reference(xs[0].double(), w1.double(), b1.double(), w2.double(),
                                                    b2.double(), act, gate),
                {"eager (6 ops)": UNFUSED_TOLERANCE, "ours 2 kernels": se.TOLERANCES[dtype]}, 3 * x_bytes,
                (se.squeeze_excite_reference, lambda fn: (lambda i: fn(xs[i % n], w1, b1, w2, b2, act, gate)),
                 "inductor squeeze-excite"),
                notes=["bytes: 2 reads of x + 1 write of y (what both move besides the tiny intermediates)"])


def smoke_shapes():
    """Tiny shapes of every case kind, for the CPU smoke run (Triton interpreted)."""
    conv_shapes = (ConvShape("smoke.expand 5->24 @9 relu6", 5, 24, 9, 1, 1, 1, "relu6"),
                   _dw("smoke.dw 24 3x3/2 @9 silu", 24, 9, 3, 2, "silu"),
                   ConvShape("smoke.project 24->8 @5 +z", 24, 8, 5, 1, 1, 1, "none", True),
                   ConvShape("smoke.1x1 relu", 8, 16, 5, 1, 1, 1, "relu"))
    return conv_shapes, ("smoke.expand 5->24 @9 relu6", "smoke.project 24->8 @5 +z"), ((40, 5),), \
        (("smoke.se 24(6) @7", 24, 6, 7, "silu", "sigmoid"),), \
        (("smoke.fc1 40->160 @5 gelu", 40, 5, "fc1"), ("smoke.fc2 160->40 @5 +z", 40, 5, "fc2"))


# ====================================================================== timing kernels

def check(out, ref64, tol: dict | None) -> str:
    """"ok", or what failed: ``|out - ref| <= atol + rtol·|ref|`` elementwise, NaN failing."""
    import torch

    if tol is None:
        return "n/a"
    out64 = out.detach().double().cpu()
    ref = ref64.detach().double().cpu()
    if out64.shape != ref.shape:
        return f"shape {tuple(out64.shape)} != {tuple(ref.shape)}"
    if not torch.isfinite(out64).all():
        return "non-finite output"
    excess = ((out64 - ref).abs() - (tol["atol"] + tol["rtol"] * ref.abs())).max().item()
    return "ok" if excess <= 0 else f"max error {(out64 - ref).abs().max().item():.3g} beyond {tol}"


def run_case(case: Case, device, smoke: bool, compile_: bool, deadline: float, log) -> list[dict]:
    """Check every variant against float64, add torch.compile's version within the budget, time them alternated."""
    import torch

    from explorer.runtime import measure

    ref64 = case.ref64()
    checks = {v: check(fn(), ref64, case.tolerances.get(v)) for v, fn in case.checks.items()}
    del ref64
    body, bind, label = case.compile
    if compile_ and time.perf_counter() < deadline:
        try:
            fn = torch.compile(_fresh(body, f"{abs(hash(case.name)) % 10**8}"), dynamic=False)
            t0 = time.perf_counter()
            run = bind(fn)
            run(0)
            measure.synchronize(str(device))
            case.variants[label] = run
            case.notes.append(f"{label}: compiled in {time.perf_counter() - t0:.1f} s")
        except Exception as exc:  # a failed compile is a result, not a crash
            case.notes.append(f"{label}: torch.compile failed: {type(exc).__name__}: {str(exc)[:200]}")
    elif compile_:
        case.notes.append(f"{label}: skipped: past --budget-s")
    timed = {}                                   # each CUDA-graph replay keeps its graph alive
    for v, fn in case.variants.items():
        def every_set(fn=fn):
            for i in range(case.sets):
                fn(i)
        if device.type == "cuda":
            replay, why = common.cuda_graph_replay(every_set, str(device))
            if replay is not None:
                timed[v] = replay
                continue
            case.notes.append(f"{v}: {why}")         # recorded; the variant is timed as plain calls instead
        timed[v] = every_set
    plan = measure.TimingPlan.for_device(str(device), short=True, **({"warmup": 1, "reps": 2} if smoke else {}))
    latency = measure.time_alternated(timed, str(device), plan)
    rows = []
    copy_ms = latency.get("copy of y (1R+1W)", {}).get("median")
    for v in case.variants:
        lat = latency[v]
        per_call = {k: lat[k] / case.sets for k in ("median", "p20", "p80")}
        nbytes = case.variant_bytes.get(v, case.bytes)
        rows.append(dict(section=case.section, case=case.name, variant=v, ms_p50=per_call["median"],
                         ms_p20=per_call["p20"], ms_p80=per_call["p80"], bytes=nbytes,
                         gbps=nbytes / (per_call["median"] * 1e-3) / 1e9 if per_call["median"] > 0 else None,
                         check=checks.get(v, "n/a"), input_sets=case.sets,
                         vs_copy_same_bytes=(copy_ms / lat["median"] if copy_ms and not v.startswith("copy") else None)))
    for r in rows:
        r["notes"] = case.notes
    del timed
    log(f"  {case.section} {case.name}: " + ", ".join(f"{r['variant']} {r['ms_p50'] * 1e3:.1f} us" for r in rows))
    return rows


def big_copy(device, smoke: bool) -> dict:
    """A device-to-device copy of one large buffer (512 MiB): the bandwidth this run can reach."""
    import torch

    from explorer.runtime import measure

    nbytes = (1 << 20) if smoke else (512 << 20)
    src = torch.empty(nbytes // 2, dtype=torch.float16, device=device).normal_()
    dst = torch.empty_like(src)
    fn = (lambda: dst.copy_(src))
    if device.type == "cuda":
        fn, why = common.cuda_graph_replay(fn, str(device))
        if fn is None:
            raise RuntimeError(f"512 MiB copy: {why}")
    plan = measure.TimingPlan.for_device(str(device), short=True, **({"warmup": 1, "reps": 2} if smoke else {}))
    lat = measure.time_alternated({"copy": fn}, str(device), plan)["copy"]
    return dict(bytes=2 * nbytes, ms=lat, gbps=2 * nbytes / (lat["median"] * 1e-3) / 1e9)


def bench_kernels(args, device, log, deadline: float, checkpoint) -> dict:
    """Every kernel case (module docstring), one after another; rows written after each case."""
    import torch

    dtype = torch.float32 if args.smoke else torch.float16
    batch = 2 if args.smoke else BATCH
    l2 = (torch.cuda.get_device_properties(device).L2_cache_size if device.type == "cuda" else 1 << 20)
    if args.smoke:
        conv_shapes, epi_from, dwln, se_shapes, gemm_shapes = smoke_shapes()
    else:
        conv_shapes = [s for s in CONV_SHAPES if not args.quick or s.name in QUICK_CONV]
        epi_from = [n for n in EPILOGUE_FROM if not args.quick or n in QUICK_EPILOGUE]
        dwln = DWLN_SHAPES[:2] if args.quick else DWLN_SHAPES
        se_shapes = [s for s in SE_SHAPES if not args.quick or s[0] in QUICK_SE]
        gemm_shapes = [s for s in GEMM_SHAPES if not args.quick or s[0] in QUICK_GEMM]
    by_name = {s.name: s for s in (*CONV_SHAPES, *conv_shapes)}
    out: dict[str, Any] = dict(dtype=str(dtype).replace("torch.", ""), batch=batch, memory_format="channels_last",
                               l2_bytes=l2, copy=big_copy(device, args.smoke), rows=[], skipped_past_budget=[])
    log(f"kernels: 512 MiB copy {out['copy']['gbps']:.0f} GB/s")
    makers = ([lambda n=n: epilogue_case(by_name[n], device, dtype, batch, l2, args.smoke) for n in epi_from]
              + [lambda s=s: conv_case(s, device, dtype, batch, l2, args.smoke) for s in conv_shapes]
              + [lambda c=c, hw=hw: dwln_case(c, hw, device, dtype, batch, l2, args.smoke) for c, hw in dwln]
              + [lambda spec=spec: gemm_case(spec, device, dtype, batch, l2, args.smoke) for spec in gemm_shapes]
              + [lambda spec=spec: se_case(spec, device, dtype, batch, l2, args.smoke) for spec in se_shapes])
    for make in makers:
        if time.perf_counter() > deadline:
            out["skipped_past_budget"].append(make.__defaults__)
            continue
        case = make()
        out["rows"] += run_case(case, device, args.smoke, not args.no_compile, deadline, log)
        for r in out["rows"]:
            if r["gbps"] and out["copy"]["gbps"]:
                r["fraction_of_big_copy"] = r["gbps"] / out["copy"]["gbps"]
        del case
        if device.type == "cuda":
            torch.cuda.empty_cache()
        checkpoint(out)
    out["skipped_past_budget"] = [str(s) for s in out["skipped_past_budget"]]
    return out


# ====================================================================== models

#: One profiled forward per variant: the top 15 kernels; on the CPU the top-level ATen ops.
profile_forward = functools.partial(common.profile_forward, top=15, cpu_ops=True)


def bench_model(name: str, args, device: str, log, deadline: float, checkpoint) -> dict:
    """One CNN in fp16 (fp32 in a smoke run), batch 32, channels_last for every variant, in two sessions.

    Session 1: eager, fused, fused + CUDA graphs, fused with depthwise convs on cuDNN, fused with the GEMMs on
    cuDNN/cuBLAS, compile default and reduce-overhead, alternated; written through ``checkpoint`` before max-autotune-no-cudagraphs, the
    slowest compile, starts. Session 2: fused, compile default and max-autotune-no-cudagraphs, alternated again.
    """
    import torch

    from explorer.fusion_engine import analyze, fuse
    from explorer.fusions import conv
    from explorer.runtime import measure

    dtype = torch.float32 if args.smoke else torch.float16
    batch = 1 if args.smoke else args.batch
    t0 = time.perf_counter()
    log(f"[{name}] batch {batch}, {str(dtype).replace('torch.', '')}, channels_last: load, detect, fuse")
    analysis = analyze(name, batch)
    model, _, det = analysis
    fused = fuse(analysis, None, device)
    applied = collections.Counter((a.pattern, a.status, a.implementation) for a in fused.applied)
    x = measure.prepare_inputs(model.example_inputs, device, dtype, channels_last=True)
    ref_gm = measure.prepare_graph(model.gm, device, torch.float64)
    with torch.inference_mode():
        ref = ref_gm(*measure.prepare_inputs(model.example_inputs, device, torch.float64)).detach().cpu()
    del ref_gm
    notes: list[str] = []
    variants: dict[str, Callable[[], Any]] = {}
    eager = measure.prepare_module(model.module, device, dtype, channels_last=True)
    variants["eager"] = lambda: eager(*x)
    fgm = measure.prepare_graph(fused.gm, device, dtype, channels_last=True)
    variants["fused"] = lambda: fgm(*x)
    with conv.policy(depthwise_triton=False):
        dw_cudnn = measure.prepare_graph(fused.gm, device, dtype, channels_last=True)
    variants["fused_depthwise_on_cudnn"] = lambda: dw_cudnn(*x)
    with conv.policy(gemm_triton=False):
        gemm_library = measure.prepare_graph(fused.gm, device, dtype, channels_last=True)
    variants["fused_gemms_on_cublas_cudnn"] = lambda: gemm_library(*x)
    mlp_triton = None
    if det.counts.get("convnext_block"):
        with conv.policy(mlp_gemm_triton=True):
            mlp_triton = measure.prepare_graph(fused.gm, device, dtype, channels_last=True)
        variants["fused_mlp_on_triton_gemms"] = lambda: mlp_triton(*x)
    head = dict(model=name, batch=batch, dtype=str(dtype).replace("torch.", ""), memory_format="channels_last",
                chains=dict(det.counts),
                applied=[dict(pattern=p, status=s, implementation=i, chains=n) for (p, s, i), n in applied.items()])
    out = common.sessions_against_compile(
        variants, eager, x, ref, head, notes, device=device, args=args, deadline=deadline,
        log=lambda msg: log(f"[{name}] {msg}"), profile=profile_forward,
        checkpoint=lambda partial: checkpoint(dict(partial, wall_s=round(time.perf_counter() - t0, 1))))
    results = out["variants"]
    eager_err = results["eager"]["precision"]["rel_l2"]
    out["precision_check"] = {v: ("ok" if results[v]["precision"]["rel_l2"] <= max(MODEL_ERROR_FACTOR * eager_err, 5e-3)
                                  else f"rel_l2 {results[v]['precision']['rel_l2']:.3g} > {MODEL_ERROR_FACTOR} x eager's "
                                       f"{eager_err:.3g}") for v in results if v.startswith("fused")}
    del variants, fgm, dw_cudnn, gemm_library, mlp_triton, eager
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
    return dict(out, wall_s=round(time.perf_counter() - t0, 1))


# ====================================================================== report

def table(doc: dict) -> str:
    """The short table printed last: kernel rows (us per call, GB/s, fraction of a copy), then each model."""
    lines = []
    kernels = doc.get("kernels")
    if kernels and "rows" in kernels:
        lines.append(f"512 MiB device copy: {kernels['copy']['gbps']:.0f} GB/s")
        lines.append(f"{'section':<9} {'case':<40} {'variant':<34} {'p50 us':>8} {'p20-p80 us':>15} {'GB/s':>6} "
                     f"{'xcopy':>6}  check")
        for r in kernels["rows"]:
            spread = f"{r['ms_p20'] * 1e3:.1f}-{r['ms_p80'] * 1e3:.1f}"
            ratio = r.get("vs_copy_same_bytes")
            lines.append(f"{r['section']:<9} {r['case'][:40]:<40} {r['variant'][:34]:<34} {r['ms_p50'] * 1e3:>8.1f} "
                         f"{spread:>15} {(r['gbps'] or 0):>6.0f} {(f'{ratio:.2f}' if ratio else '-'):>6}  {r['check']}")
        for s in kernels.get("skipped_past_budget", []):
            lines.append(f"skipped (past --budget-s): {s}")
    elif kernels:
        lines.append(f"kernels: FAILED: {kernels.get('error')}")
    for name in MODELS:
        lines += common.model_table_lines(name, doc.get(name), "{model} {dtype} batch {batch} channels_last:")
        top = (doc.get(name) or {}).get("variants", {}).get("fused", {}).get("top_kernels", [])[:8]
        if top:
            lines.append("  fused, top kernels of one forward: " + "; ".join(
                f"{k['name'][:48]} x{k['calls']} {k['total_us']:.0f} us" for k in top))
    return "\n".join(lines)


def parse_args(argv=None) -> argparse.Namespace:
    """Command-line options."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--part", default="kernels,models", help="comma-separated: kernels, models")
    p.add_argument("--models", default=",".join(MODELS), help=f"models part: comma-separated subset of {MODELS}")
    p.add_argument("--batch", type=int, default=BATCH, help="models part: batch (default 32)")
    p.add_argument("--no-compile", action="store_true", help="skip every torch.compile variant")
    p.add_argument("--quick", action="store_true", help="fewer kernel shapes, no max-autotune")
    p.add_argument("--smoke", action="store_true",
                   help="no GPU: tiny kernel shapes under TRITON_INTERPRET=1 and the models on the CPU at batch 1, "
                        "fp32, without Triton (proves the plumbing; the numbers are not measurements)")
    p.add_argument("--smoke-compile", action="store_true",
                   help="with --smoke: also run the torch.compile variants (inductor on the CPU: minutes)")
    p.add_argument("--budget-s", type=float, default=420.0,
                   help="no case, model or compile starts after this many seconds (default 420)")
    p.add_argument("--out", default=None, help="JSON path (default $OUT/bench_cnn_fusions_<part>.json)")
    args = p.parse_args(argv)
    if args.smoke and not args.smoke_compile:
        args.no_compile = True   # inductor's CPU compile would take minutes and time nothing of interest here
    args.parts = [s.strip() for s in args.part.split(",") if s.strip()]
    args.model_list = [s.strip() for s in args.models.split(",") if s.strip()]
    unknown = [s for s in args.parts if s not in ("kernels", "models")] + [m for m in args.model_list if m not in MODELS]
    if unknown:
        p.error(f"unknown part(s) or model(s) {', '.join(unknown)}")
    return args


def _default_name(args) -> str:
    """The JSON's file name: bench_cnn_fusions_<parts>[_<models>][_smoke].json."""
    name = "bench_cnn_fusions_" + "_".join(args.parts)
    if "models" in args.parts and args.model_list != list(MODELS):
        name += "_" + "_".join(args.model_list)
    name += "_smoke" if args.smoke else ""
    return f"{name}.json"


def main(argv=None) -> int:
    """Run the benchmark; returns the exit status (0 also when skipped without CUDA)."""
    args = parse_args(argv)
    if args.smoke and "triton" not in sys.modules:
        os.environ["TRITON_INTERPRET"] = "1"        # before Triton is first imported: its library functions too
    import torch

    device = common.bench_device("bench_cnn_fusions.py", args.smoke)
    if device is None:
        return 0
    if device == "cuda":
        torch.backends.cudnn.benchmark = True       # as a deployed model runs, for every variant alike
    from explorer.runtime import measure

    env = measure.environment(device)
    if device == "cuda":
        env.update(tf32_matmul=bool(torch.backends.cuda.matmul.allow_tf32),
                   tf32_cudnn=bool(torch.backends.cudnn.allow_tf32), cudnn_benchmark=True)
    run = common.BenchRun(common.results_path(args.out, _default_name(args)), "bench_cnn_fusions/1", args.smoke,
                          env, dict(parts=args.parts, models=args.model_list, batch=args.batch, quick=args.quick,
                                    compile=not args.no_compile, budget_s=args.budget_s), args.budget_s)
    log, doc, deadline = run.log, run.doc, run.deadline

    def model_part(model: str):
        def part(checkpoint):
            if args.smoke:                       # the models at 224x224 would take minutes interpreted
                os.environ["TRITON_INTERPRET"] = "0"
            return bench_model(model, args, device, log, deadline, checkpoint)
        return part

    parts = ({"kernels": lambda checkpoint: bench_kernels(args, torch.device(device), log, deadline, checkpoint)}
             if "kernels" in args.parts else {})
    parts.update({m: model_part(m) for m in (args.model_list if "models" in args.parts else [])})
    failed = run.run_parts(parts)
    bad_kernels = [r for r in (doc.get("kernels") or {}).get("rows", [])
                   if r["variant"].startswith("ours") and r["check"] not in ("ok", "n/a")]
    bad_models = [(m, v, c) for m in MODELS for v, c in (doc.get(m) or {}).get("precision_check", {}).items()
                  if c != "ok"]
    print(run.environment_line(("torch", "cuda", "cudnn", "triton")))
    print(table(doc))
    for r in bad_kernels:
        print(f"CHECK FAILED: {r['section']} {r['case']} {r['variant']}: {r['check']}")
    for m, v, c in bad_models:
        print(f"PRECISION CHECK FAILED: {m} {v}: {c}")
    print(f"wrote {run.path}")
    return 1 if failed or bad_kernels or bad_models else 0


if __name__ == "__main__":
    sys.exit(main())
