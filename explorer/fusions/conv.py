"""The convolution family: BatchNorm folding and the conv epilogue (bias, residual add, activation).

::

    conv_bn_add_act                      conv_bn_act             conv_bn_add          conv_bn
    x ─► conv(w) ─► bn ─► + z ─► act     x ─► conv ─► bn ─► act  x ─► conv ─► bn ─► + z   x ─► conv ─► bn
                          ▲ residual
    ==>  x ─► conv(w', b') [+ z] [act]   one call: BatchNorm folded into (w', b'),
                                         bias, residual and activation in the epilogue

    conv_add_act / conv_add / conv_act: the same without a BatchNorm (already
    folded, as ONNX exporters do).

Folding (``fold_conv_bn``) is pure arithmetic done once, in float64::

    s  = γ / sqrt(var + eps)          (one scale per output channel)
    w' = w · s                        (broadcast over in-channels and kernel)
    b' = (b − mean) · s + β           (b = 0 when the conv has no bias)

It is valid only for inference: in training BatchNorm normalises with the
statistics of the current batch, so there is no fixed (mean, var) to fold.

How the epilogue runs: ``select_conv_epilogue`` is the one decision, for a
device, dtype, activation and shape; the runtime call (``conv_epilogue``), the
report's label and the lean lowering (``LOWERINGS``) all ask it::

    cudnn_conv_add_relu  relu with a residual, on CUDA: one cuDNN call
    cudnn_conv_relu      relu, on CUDA, except 1×1 convolutions over large maps
                         (``CUDNN_RELU_1X1_MAX_PIXELS``), depthwise ones
                         (``CUDNN_RELU_DEPTHWISE``) and grouped ones where it
                         measured slower (``conv_measured``): one cuDNN call
    triton_gemm          a 1×1 convolution (stride 1, no padding, one group) over a
                         channels_last input, on CUDA: ONE Triton GEMM over the pixels with
                         the whole epilogue (``conv1x1_epilogue``, ``gemm_epilogue``); any
                         other input layout takes ``triton_epilogue``
    triton_depthwise     a depthwise convolution over a channels_last input, on CUDA:
                         ONE Triton kernel computes the convolution and its whole
                         epilogue (``depthwise_conv_epilogue``); any other input
                         layout takes ``triton_epilogue``
    triton_epilogue      on CUDA otherwise (and on the CPU under TRITON_INTERPRET=1):
                         the convolution WITHOUT bias, then ONE vectorised Triton
                         pass ``bias_act_``: y = act(y + b[c] (+ z)), in place
    separate             anywhere else: the convolution with its bias, then
                         ``add_`` and the activation in place (torch, one kernel each)

Why the bias leaves the convolution on CUDA: ATen's cuDNN path adds a conv's bias
as a separate broadcast ``add_`` over the output, which is not vectorised over a
channels_last tensor, and issue 13's H200 profile of fused MobileNetV2 found those
adds (and the ReLU6 kernels after them) to be the largest share of its GPU time. ``bias_act_`` reads
and writes the output once, in 16-byte vectors, whatever the layout (it reads
the strides at run time: NCHW and channels_last both run as they are; the graph
cannot say which, as it is captured in NCHW).

Why 1×1 convolutions become GEMMs: over a channels_last input a 1×1 convolution is
exactly ``(N·H·W, C_in) @ (C_in, C_out)``, a view, and MobileNetV2's and EfficientNet's
expansions and projections have a small C_in: they are bound by writing their output, so
the epilogue's extra read and write of it would cost as much again. The Triton GEMM adds the
bias, the residual and the activation to its fp32 accumulator before the one store.

Why depthwise convolutions carry their epilogue: they do k² multiply-adds per
output element and are bound by memory, like the epilogue pass itself; one
kernel that writes the activated output moves the output once instead of three
times (conv write, epilogue read and write). The kernel tiles (output pixels ×
channels) with channels innermost, so every load and store is a 16-byte vector
of a channels_last tensor. ``POLICY`` lets a benchmark measure the alternatives
in one run (``benchmarks/bench_cnn_fusions.py``).

The depthwise kernel also takes a LayerNorm over the channels as its epilogue
(ConvNeXt's block, ``explorer.fusions.convnext``): with every channel of a pixel
in one program, the mean and variance are a reduction over the tile's rows.

Works for conv1d/2d/3d, grouped and depthwise convolutions (the output channel
is always dim 0 of the weight); not for transposed convolutions. The Triton
paths take fp32, fp16 and bf16; all arithmetic in them is fp32 and the result is
rounded once, to nearest even.
"""

from __future__ import annotations

import functools
import math
import operator
from collections.abc import Sequence

import torch
import torch.fx

from explorer.fusions import conv_measured, edit
from explorer.fusions.base import WORDS as BASE_WORDS
from explorer.fusions.base import PAYS_CAVEAT, PRECISION_CAVEAT, Chain, Choice, Pattern, Step, selection
from explorer.fusions.edit import NewAttr, Refuse, RewriteContext, UseGeneric
from explorer.fusions.epilogue import (EPILOGUE_TOLERANCES, TRITON_ACTIVATIONS, apply_activation, apply_activation_,
                                       check, in_place_node)
from explorer.fusions.kernels import policy as _policy
# The kernels the convolution family selects between, re-exported: ``conv.bias_act_`` and friends read as before.
from explorer.fusions.kernels.bias_act import (BIAS_ACT_TOLERANCES, bias_act_, bias_act_reference,  # noqa: F401
                                               bias_act_torch_)
from explorer.fusions.kernels.common import (LAYOUTS, PLANS, TRITON_DTYPES, LaunchPlan, as_list, conv_nd,  # noqa: F401
                                             conv_out_shape, is_depthwise, layout_of, sm_count, to_layout)
from explorer.fusions.kernels.depthwise import (DEPTHWISE_TOLERANCES, depthwise_applies, depthwise_conv,  # noqa: F401
                                                depthwise_conv_epilogue, depthwise_split, depthwise_tiles,
                                                pack_depthwise_weight)
from explorer.fusions.kernels.gemm import gemm_applies, gemm_config, gemm_epilogue, gemm_launch, gemm_plan  # noqa: F401
from explorer.fusions.kernels.policy import ConvPolicy, policy  # noqa: F401
from explorer.fusions.triton_support import interpreting, remember, triton_runs_on, where
from explorer.graph import aten
from explorer.vocab import ACTIVATIONS
from explorer.words import Words

#: What this family says to a person, in English and 中文 (rendered by explorer.ui.i18n by id).
WORDS = Words("conv", {
    "title": ("Convolution (Conv+BN, epilogues)", "卷积（Conv+BN、尾处理）"),
    "conv_bn_add_act.label": ("Conv+BN+Add+act", "Conv+BN+Add+激活"),
    "conv_bn_add_act.implementation": (("BatchNorm folded into the conv; cuDNN conv+bias+ReLU in one call where "
                                        "it wins; 1x1 convs (channels_last) as one Triton GEMM with their "
                                        "epilogue, depthwise convs as one Triton kernel with theirs; otherwise "
                                        "the conv without bias and one vectorised Triton pass for bias, residual "
                                        "and activation"),
                                       ("BN 折叠进卷积；在 cuDNN 的 conv+bias+ReLU 融合调用更快的地方用它（1 次调用）；1x1 "
                                        "卷积（channels_last）用一个带尾处理的 Triton GEMM，深度可分离卷积用一个带尾处理的 Triton "
                                        "内核；其余情况先做不带偏置的卷积，再用一个向量化的 Triton 内核一次完成偏置、残差和激活")),
    "conv_bn_add_act.explanation": (("The residual block's tail. The residual add and the activation run in the "
                                     "convolution's epilogue: the conv output is never written to device memory "
                                     "and read back, and the add and the activation cost no launch of their own."),
                                    "残差块的尾部。残差相加和激活函数在卷积的尾处理（epilogue）中完成：卷积输出不再写回显存再读出，相加和激活也不再各自占用一次内核启动。"),
    "caveat.cudnn_depthwise": (("A library's fused call is not always the fast one: cuDNN's conv+bias+ReLU runs a "
                                "depthwise convolution on a generic grouped kernel. On the H200 MNASNet-1.3's 17 "
                                "depthwise convs took 3.98 ms that way, more than its whole unfused forward (1.54 "
                                "ms), so a depthwise conv + ReLU takes the Triton depthwise kernel here instead. "
                                "Some grouped convolutions fare the same (RegNetX-32GF's grouped 3×3 convs: 59.6 ms "
                                "against 3.3 ms for the plain conv), others are faster fused (ResNeXt-50/101's): a grouped "
                                "conv takes the fused call only where it measured faster for its shape on this "
                                "GPU."),
                               ("库的融合调用不一定最快：cuDNN 的 conv+bias+ReLU 把深度可分离卷积交给通用的分组卷积内核。在 H200 上，"
                                "MNASNet-1.3 的 17 个深度可分离卷积这样跑要 3.98 ms，比它整个未融合的前向（1.54 ms）还长，"
                                "所以这里深度可分离卷积 + ReLU 改用 Triton 深度可分离卷积内核。"
                                "有些分组卷积也是这样（RegNetX-32GF 的分组 3×3 卷积：59.6 ms，而普通卷积只要 3.3 ms），"
                                "另一些融合后更快（ResNeXt-50/101）：分组卷积只在按其形状实测更快时才用这个融合调用。")),
    "fold_caveat": (("BatchNorm folding is valid only for inference: in training the batch statistics change "
                     "every step, so the folded weights would be wrong."),
                    "BN 折叠只在推理时成立：训练时每一步的批统计量都在变，折叠后的权重就不对了。"),
    "formula": (("W' = W * gamma / sqrt(var + eps)  (per output channel);  b' = (b - mean) * gamma / sqrt(var + "
                 "eps) + beta"),
                "W' = W * gamma / sqrt(var + eps)（逐输出通道）；  b' = (b - mean) * gamma / sqrt(var + eps) + beta"),
    "conv_add_act.label": ("Conv+Add+act", "Conv+Add+激活"),
    "implementation": (("cuDNN conv+bias+ReLU in one call where it wins; 1x1 convs (channels_last) as one Triton "
                        "GEMM with their epilogue, depthwise convs as one Triton kernel with theirs; otherwise "
                        "the conv without bias and one vectorised Triton pass for bias, residual and activation"),
                       ("在 cuDNN 的 conv+bias+ReLU 融合调用更快的地方用它（1 次调用）；1x1 卷积（channels_last）用一个带尾处理的 Triton "
                        "GEMM，深度可分离卷积用一个带尾处理的 Triton 内核；其余情况先做不带偏置的卷积，再用一个向量化的 Triton 内核一次完成偏置、残差和激活")),
    "conv_add_act.explanation": (("Conv, residual add and activation, BatchNorm already folded (as ONNX exporters "
                                  "do). The residual add and the activation run in the convolution's epilogue: "
                                  "the conv output is never written to device memory and read back, and the add "
                                  "and the activation cost no launch of their own."),
                                 ("卷积、残差相加和激活，BN 已经折叠（ONNX "
                                  "导出器就是这样做的）。残差相加和激活函数在卷积的尾处理（epilogue）中完成：卷积输出不再写回显存再读出，相加和激活也不再各自占用一次内核启动。")),
    "conv_bn_add.label": ("Conv+BN+Add", "Conv+BN+Add"),
    "conv_bn_add.implementation": (("BatchNorm folded into the conv; the residual added in the epilogue pass with "
                                    "the bias"),
                                   "BN 折叠进卷积；残差在加偏置的那一遍尾处理中加上"),
    "projection_why": (("MobileNetV2's and EfficientNet's projection convolutions end in a residual add with no "
                        "activation (a linear bottleneck). Unfused, the add is a kernel of its own that reads the "
                        "conv output and the residual and writes the sum; in the epilogue it is one more read of "
                        "the residual in the pass that adds the bias."),
                       ("MobileNetV2 和 EfficientNet "
                        "的投影卷积以不带激活的残差相加结尾（线性瓶颈）。不融合时，相加是一个单独的内核，要读卷积输出和残差、写出和；放进尾处理后，只是在加偏置的那一遍里多读一次残差。")),
    "conv_add.label": ("Conv+Add", "Conv+Add"),
    "conv_add.implementation": ("the residual added in the epilogue pass with the bias", "残差在加偏置的那一遍尾处理中加上"),
    "conv_add.explanation": (("A convolution and a residual add with no activation, BatchNorm already folded (as "
                              "ONNX exporters do). MobileNetV2's and EfficientNet's projection convolutions end "
                              "in a residual add with no activation (a linear bottleneck). Unfused, the add is a "
                              "kernel of its own that reads the conv output and the residual and writes the sum; "
                              "in the epilogue it is one more read of the residual in the pass that adds the bias."),
                             ("卷积加上不带激活的残差相加，BN 已经折叠（ONNX 导出器就是这样做的）。MobileNetV2 和 EfficientNet "
                              "的投影卷积以不带激活的残差相加结尾（线性瓶颈）。不融合时，相加是一个单独的内核，要读卷积输出和残差、写出和；放进尾处理后，只是在加偏置的那一遍里多读一次残差。")),
    "conv_bn_act.label": ("Conv+BN+act", "Conv+BN+激活"),
    "conv_bn_act.explanation": (("conv -> temp1 -> bn -> temp2 -> relu is three launches and two intermediates "
                                 "written and read back. Folding BN into the conv's weights removes one op "
                                 "exactly; running the activation in the conv's epilogue removes the other."),
                                ("conv -> temp1 -> bn -> temp2 -> relu 是 3 次内核启动，外加 2 个写回显存再读出的中间结果。把 BN "
                                 "折叠进卷积权重，精确地去掉一个算子；把激活放进卷积的尾处理，去掉另一个。")),
    "conv_act.label": ("Conv+act", "Conv+激活"),
    "conv_act.explanation": (("Convolution with its activation in the epilogue (BatchNorm already folded, as ONNX "
                              "exporters do): the pre-activation tensor is never written out."),
                             "卷积在尾处理中完成激活（BN 已经折叠，ONNX 导出器就是这样做的）：激活前的张量从不写出。"),
    "conv_bn.label": ("Conv+BN", "Conv+BN"),
    "conv_bn.implementation": (("BatchNorm folded into the conv's weight and bias (exact algebra, no kernel); on "
                                "CUDA the bias in one vectorised Triton pass after the conv"),
                               "BN 折叠进卷积的权重和偏置（精确的代数变换，不需要内核）；在 CUDA 上，偏置在卷积之后用一个向量化的 Triton 内核加上"),
    "conv_bn.explanation": (("In inference BatchNorm is a per-channel affine map, so it folds into the "
                             "convolution's weights: one op and one intermediate disappear at no cost."),
                            "推理时 BN 是逐通道的仿射变换，所以可以折叠进卷积权重：一个算子和一个中间结果零成本地消失。"),
    "refuse.training": (("BatchNorm in training mode: its statistics change every step, folding is valid only for "
                         "inference"),
                        "BN 处于训练模式：它的统计量每一步都在变，折叠只在推理时成立"),
    "refuse.no_stats": (("BatchNorm without running statistics (track_running_stats=False) normalises with batch "
                         "statistics even in eval mode: there is nothing fixed to fold"),
                        "BN 没有运行统计量（track_running_stats=False），即使在 eval 模式下也用批统计量归一化：没有固定的值可以折叠"),
    "refuse.training_guard": ("BatchNorm in training mode: folding is valid only for inference (frozen statistics)",
                              "BN 处于训练模式：折叠只在推理时成立（统计量冻结）"),
    "refuse.broadcast": ("add operand shape {shape} differs from the conv output {out} (broadcast)",
                         "相加操作数的形状 {shape} 与卷积输出 {out} 不同（广播）"),
    "refuse.constant": ("add of a constant, not a residual", "加的是常量，不是残差"),
    "refuse.stats_used": ("BatchNorm statistics outputs are used: not folded", "BN 的统计量输出被使用了：不折叠"),
    "refuse.variant": ("BatchNorm variant {op} is not folded", "BN 变体 {op} 不折叠"),
    "refuse.not_direct": ("BatchNorm does not read the conv output directly", "BN 没有直接读取卷积的输出"),
    "generic.op": ("conv op {op} is not one the epilogue takes", "卷积算子 {op} 不是尾处理能接受的"),
    "generic.transposed": ("transposed convolution", "转置卷积"),
    "generic.output_padding": ("convolution with output padding", "带 output padding 的卷积"),
    "generic.no_epilogue": ("activation {act} has no conv epilogue", "激活函数 {act} 没有卷积尾处理"),
    "what.conv_weight": ("conv weight", "卷积权重"),
    "what.conv_bias": ("conv bias", "卷积偏置"),
    "what.running_mean": ("running mean", "运行均值"),
    "what.running_var": ("running var", "运行方差"),
    "what.bn_weight": ("BatchNorm weight", "BN 权重"),
    "what.bn_bias": ("BatchNorm bias", "BN 偏置"),
    "label.folded": ("BatchNorm folded (exact) + {label}", "BN 折叠（精确） + {label}"),
    "label.sep1": ("conv+bias (1 kernel)", "conv+bias（1 个内核）"),
    "label.sep_add": ("conv+bias + add_ in place (2 kernels)", "conv+bias + 原地 add_（2 个内核）"),
    "label.sep_act": ("conv+bias + {act} in place (2 kernels)", "conv+bias + 原地 {act}（2 个内核）"),
    "label.sep_add_act": ("conv+bias + add_ in place + {act} in place (3 kernels)",
                          "conv+bias + 原地 add_ + 原地 {act}（3 个内核）"),
    "label.cudnn_add_relu": ("cudnn conv+bias+add+relu (1 fused call: cudnn_convolution_add_relu)",
                             "cudnn conv+bias+add+relu（1 次融合调用：cudnn_convolution_add_relu）"),
    "label.grouped_noted": (("{label} [chosen by: measured at N={n}, {c_in}→{c_out} channels, {h}×{w}, "
                             "{kh}×{kw}, {groups} groups: cuDNN's fused call {cudnn:.0f} µs, conv + pass "
                             "{epilogue:.0f} µs]"),
                            ("{label}【依据：在 N={n}、{c_in}→{c_out} 通道、{h}×{w}、{kh}×{kw}、{groups} 组实测："
                             "cuDNN 融合调用 {cudnn:.0f} µs，卷积 + 单遍 {epilogue:.0f} µs】")),
    "label.cudnn_relu": ("cudnn conv+bias+relu (1 fused call: cudnn_convolution_relu)",
                         "cudnn conv+bias+relu（1 次融合调用：cudnn_convolution_relu）"),
    "label.gemm": ("triton 1x1 conv as a GEMM + {steps} (1 kernel)", "triton 把 1x1 卷积当作 GEMM + {steps}（1 个内核）"),
    "label.gemm_cl": (("triton 1x1 conv as a GEMM + {steps} (1 kernel for a channels_last input; any other: conv "
                       "+ triton epilogue)"),
                      "triton 把 1x1 卷积当作 GEMM + {steps}（1 个内核，限 channels_last 输入；其他输入：conv + triton 尾处理）"),
    "label.depthwise": ("triton depthwise conv+{steps} (1 kernel)", "triton 深度可分离卷积+{steps}（1 个内核）"),
    "label.depthwise_cl": (("triton depthwise conv+{steps} (1 kernel for a channels_last input; any other: conv + "
                            "triton epilogue)"),
                           "triton 深度可分离卷积+{steps}（1 个内核，限 channels_last 输入；其他输入：conv + triton 尾处理）"),
    "label.epilogue": ("conv (no bias) + triton {steps} (2 kernels: one vectorised pass after the conv)",
                       "conv（不带偏置） + triton {steps}（2 个内核：卷积之后一遍向量化处理）"),
    "label.legacy_fold": ("BatchNorm folded into the conv weights (exact arithmetic, 1 conv kernel on any device)",
                          "BN 折叠进卷积权重（精确运算，任何设备上都只有 1 个卷积内核）"),
})


#: Activations the conv epilogue applies (every path: cuDNN takes relu only, the others all of them).
CONV_ACTIVATIONS = TRITON_ACTIVATIONS
_CUDNN_DTYPES = (torch.float32, torch.float16, torch.bfloat16)

#: Conv with an epilogue against the unfused computation in float64 (see ``explorer.fusions.epilogue``).
TOLERANCES = EPILOGUE_TOLERANCES

#: The BatchNorm fold in float64 is exact algebra up to float64 rounding.
FOLD_TOLERANCE_F64 = 1e-10

#: cuDNN's fused conv+bias+ReLU lost to the convolution followed by a separate ReLU for 1×1
#: convolutions over large maps on the H200 (ResNet-50 fp16 channels_last, batch 32: slower than
#: unfused, as CUDA graphs, for the eight 1×1 convolutions at 56×56 and 28×28, faster for every 3×3
#: and every 1×1 at 14×14 or 7×7: ``chains`` of
#: ``benchmarks/results/report_resnet50_fp16_channels_last_h200.json``). Above this many output
#: pixels (N·H·W) a 1×1 conv + ReLU takes a Triton path instead.
CUDNN_RELU_1X1_MAX_PIXELS = 16384

#: Whether a depthwise convolution may take cuDNN's fused conv+bias+ReLU (or +add+ReLU). It may not: on the H200
#: (torch 2.11, fp16 channels_last, batch 32) that call runs every depthwise conv as
#: ``cudnn::cnn::conv2d_grouped_direct_kernel``, 3.98 ms for MNASNet-1.3's 17 (87% of its fused GPU work), 1.30 ms
#: for MobileNetV3-L's 6 and 0.74 ms for MobileNetV4-small's 11, where the same convolutions without the bias
#: and ReLU ran as ``sm90_xmma_depthwise_convolution_fprop`` in the unfused graph of the same run (MNASNet-1.3's
#: whole unfused forward 1.54 ms of GPU work): ``benchmarks/results/bench_corpus_h200_part11.json`` and
#: ``_part5``'s rows. A depthwise conv + ReLU takes the depthwise or epilogue path instead.
CUDNN_RELU_DEPTHWISE = False

#: Any other grouped convolution (groups > 1) takes cuDNN's fused call where ``conv_measured`` measured it faster for
#: its shape on this GPU (the committed table, else timed once in this process), the plain conv + the Triton pass
#: where it measured slower. Either can be many times slower for some shapes (RegNetX-32GF's 7.9× through the fused
#: call, ResNeXt-101-32x8d's 16× without it: ``benchmarks/results/bench_grouped_conv_h200.json``), so this default
#: is only for a CUDA plan made where that GPU is absent and its table lacks the shape: the pass, which won 128 of
#: the table's 244 rows.
GROUPED_UNMEASURED = "epilogue"

TRAINING_REFUSAL = WORDS("refuse.training")
NO_RUNNING_STATS_REFUSAL = WORDS("refuse.no_stats")
FOLD_CAVEAT = WORDS("fold_caveat")
FORMULA = WORDS("formula")


# ====================================================================== the arithmetic

def check_foldable(training: bool, has_running_stats: bool = True) -> str | None:
    """Return ``None`` when a BatchNorm can be folded, else a readable reason."""
    if training:
        return TRAINING_REFUSAL
    if not has_running_stats:
        return NO_RUNNING_STATS_REFUSAL
    return None


def fold_conv_bn(conv_weight: torch.Tensor, conv_bias: torch.Tensor | None, bn_mean: torch.Tensor,
                 bn_var: torch.Tensor, bn_weight: torch.Tensor | None, bn_bias: torch.Tensor | None,
                 eps: float, *, training: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Return ``(weight, bias)`` of the conv that equals conv → BatchNorm(eval).

    Takes the conv weight ``(C_out, C_in/groups, *kernel)``, its bias ``(C_out,)``
    or None, and the BatchNorm's running mean/var, affine weight γ and bias β
    (None when ``affine=False``) and eps. Computes in float64 and returns
    tensors in the conv weight's dtype and device; the bias is always returned
    (a conv without bias gains one). The inputs are not modified.
    Raises ``Refuse`` when ``training`` is true or the statistics are missing.
    """
    reason = check_foldable(training, has_running_stats=bn_mean is not None and bn_var is not None)
    if reason:
        raise Refuse(reason)
    out_channels = conv_weight.shape[0]
    for name, t in (("bn_mean", bn_mean), ("bn_var", bn_var), ("bn_weight", bn_weight),
                    ("bn_bias", bn_bias), ("conv_bias", conv_bias)):
        if t is not None and t.numel() != out_channels:
            raise ValueError(f"{name} has {t.numel()} elements, the conv has {out_channels} output channels")

    f64 = dict(dtype=torch.float64, device=conv_weight.device)
    w = conv_weight.detach().to(**f64)                                     # (C_out, C_in/g, *k)
    b = conv_bias.detach().to(**f64) if conv_bias is not None else torch.zeros(out_channels, **f64)
    mean = bn_mean.detach().to(**f64).reshape(-1)                          # (C_out,)
    var = bn_var.detach().to(**f64).reshape(-1)
    gamma = bn_weight.detach().to(**f64).reshape(-1) if bn_weight is not None else torch.ones(out_channels, **f64)
    beta = bn_bias.detach().to(**f64).reshape(-1) if bn_bias is not None else torch.zeros(out_channels, **f64)

    scale = gamma / torch.sqrt(var + eps)                                  # (C_out,)
    new_w = w * scale.reshape((-1,) + (1,) * (w.dim() - 1))
    new_b = (b - mean) * scale + beta
    return new_w.to(conv_weight.dtype), new_b.to(conv_weight.dtype)


def conv_bn_reference(x, conv_weight, conv_bias, bn_mean, bn_var, bn_weight, bn_bias, eps,
                      stride=1, padding=0, dilation=1, groups: int = 1) -> torch.Tensor:
    """The unfused computation: convolution, then BatchNorm in eval mode."""
    y = conv_nd(x, conv_weight, conv_bias, stride, padding, dilation, groups)
    return torch.nn.functional.batch_norm(y, bn_mean, bn_var, bn_weight, bn_bias, training=False, eps=eps)


def conv_epilogue_reference(x, weight, bias, z=None, stride=1, padding=0, dilation=1, groups=1, act="relu"):
    """Unfused: conv (with bias), then ``+ z`` (when given), then the activation, each out of place.

    Runs in any dtype torch's convolution takes, float64 included (the tests' reference).
    """
    check(act, CONV_ACTIVATIONS)
    y = conv_nd(x, weight, bias, stride, padding, dilation, groups)
    return apply_activation(y if z is None else y + z, act)


def is_pointwise_conv(weight_shape: Sequence[int], stride, padding, dilation, groups) -> bool:
    """A 2-D 1×1 convolution with stride 1, no padding, no dilation, one group: a GEMM over the pixels."""
    lists = edit.int_lists(2, stride, padding, dilation)
    return (len(weight_shape) == 4 and tuple(weight_shape[2:]) == (1, 1) and groups == 1 and lists is not None
            and lists == ([1, 1], [0, 0], [1, 1]))


def conv1x1_applies(x: torch.Tensor, weight: torch.Tensor, z: torch.Tensor | None = None) -> bool:
    """Whether a 1×1 conv (``is_pointwise_conv``) of ``x`` runs as one GEMM: ``x`` channels_last (its pixels
    are then the rows of a (N·H·W, C_in) matrix with row stride C_in) and ``z`` channels_last or absent."""
    return (x.dim() == 4 and layout_of(x) == "nhwc" and (z is None or (layout_of(z) == "nhwc"
                                                                     and z.dtype.is_floating_point
                                                                     and z.device == x.device))
            and x.dtype == weight.dtype and x.dtype in TRITON_DTYPES and triton_runs_on(x.device)
            and weight.device == x.device)


def conv1x1_epilogue(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, z: torch.Tensor | None,
                     act: str) -> torch.Tensor:
    """``act(conv1x1(x) + bias (+ z))`` for a 1×1 conv (stride 1, no padding, one group): ONE Triton GEMM with
    its epilogue where ``conv1x1_applies`` (a channels_last input), else the conv without bias + ``bias_act_``.

    ``x``: ``(N, C_in, H, W)``; ``weight``: ``(C_out, C_in, 1, 1)``; returns ``(N, C_out, H, W)`` in
    channels_last memory (the GEMM's output rows are the pixels). The decision and the launch are planned
    once per call signature; the kernel reads the 4-D tensors through their strides (no views per call):
    x's element (n, c, h, w) sits at ((n·H + h)·W + w)·C + c, row m = (n, h, w) of stride C.
    """
    key = ("1x1", x.shape, x.stride(), x.dtype, x.device, weight.shape, weight.stride(), weight.dtype, weight.device,
           None if bias is None else (bias.dtype, bias.device),
           None if z is None else (z.shape, z.stride(), z.dtype, z.device), act, interpreting())
    n, c, h, w = x.shape
    c_out = weight.shape[0]
    plan = PLANS.get(key)
    if plan is None:
        if conv1x1_applies(x, weight, z) and weight.shape[1] == c and x.numel() > 0:
            plan = gemm_plan(key, x, weight, bias, z, act, n * h * w, c, (c, 1), (c_out, 1), (c_out, 1))
        else:
            check(act, CONV_ACTIVATIONS)
            plan = remember(PLANS, key, LaunchPlan(out_shape="fallback"))
    if plan.out_shape == "fallback":
        y = torch.conv2d(x, weight, None, 1, 0, 1, 1)                       # (N, C_out, H, W)
        return bias_act_(y, bias, z, act)
    out = torch.empty((n, c_out, h, w), dtype=x.dtype, device=x.device, memory_format=torch.channels_last)
    return gemm_launch(plan, key, x, weight, bias, z, out)                   # (N, C_out, H, W) channels_last


# ====================================================================== kernel selection

def _steps_label(act: str, residual: bool) -> str:
    return "bias" + (" + add" if residual else "") + ("" if act == "none" else f" + {act}")


def _separate_choice(act: str, residual: bool) -> Choice:
    """The convolution with its bias, then the epilogue as separate torch ops (no fused kernel)."""
    key = "label.sep" + ("_add" if residual else "") + ("_act" if act != "none" else "")
    return Choice("separate", WORDS("label.sep1" if key == "label.sep" else key, act=act), False)


@selection
def select_conv_epilogue(device: torch.device | str, dtype: torch.dtype, act: str, *, weight_dim: int = 4,
                         int_padding: bool = True, residual: bool = False, residual_fits: bool = True,
                         separate: bool = False, kernel_size: Sequence[int] | None = None,
                         depthwise: bool = False, grouped: bool = False, grouped_key: tuple | None = None,
                         pointwise: bool = False, out_pixels: int | None = None,
                         layout: str | None = None) -> Choice:
    """The one decision of how ``act(conv(x, w) + b [+ z])`` runs on ``device`` in ``dtype``.

    ``residual_fits``: z has the conv output's shape and x's dtype (cuDNN does not
    broadcast z). ``separate``: the plan's kernel choice "separate_epilogue" (the
    convolution with its bias, then the epilogue as separate torch ops). ``kernel_size``,
    ``depthwise`` (``is_depthwise``), ``grouped`` (groups > 1) with ``grouped_key``
    (``conv_measured.shape_key``: its row in the measured table), ``pointwise``
    (``is_pointwise_conv``), ``out_pixels``
    (N·H'·W' of the output) and ``layout`` (the input's, ``layout_of``: at run time the tensor's;
    at the rewrite the graph's for an nchw target, whose prepared graph keeps the capture's
    layouts, and None for channels_last, where a permute may still hand the conv a contiguous
    tensor) are read where they decide (module docstring; None: unknown). ``Choice.impl`` is one of ``cudnn_conv_add_relu``, ``cudnn_conv_relu``,
    ``triton_gemm``, ``triton_depthwise``, ``triton_epilogue``, ``separate``; ``fused`` is
    whether the epilogue costs no kernel of its own per op.
    """
    check(act, CONV_ACTIVATIONS)
    device = torch.device(device)
    steps = _steps_label(act, residual)
    if separate:
        return _separate_choice(act, residual)
    large_1x1 = (kernel_size is not None and all(k == 1 for k in kernel_size) and out_pixels is not None
                 and out_pixels > CUDNN_RELU_1X1_MAX_PIXELS)
    cudnn = (_policy.POLICY.cudnn_relu and act == "relu" and device.type == "cuda" and dtype in _CUDNN_DTYPES
             and weight_dim == 4 and int_padding and (not residual or residual_fits)
             and (CUDNN_RELU_DEPTHWISE or not depthwise)
             and torch.backends.cudnn.is_available()
             and torch._C._get_cudnn_enabled())          # torch.backends.cudnn.enabled, without its wrapper
    # A grouped (not depthwise) conv that could take cuDNN's fused call does so only where its shape measured
    # faster that way; the row that decided is cited in the label, whichever way it went.
    row = (conv_measured.measured_row(device, dtype, grouped_key, residual)
           if cudnn and grouped and not depthwise else None)
    if cudnn and grouped and not depthwise:
        cudnn = (conv_measured.best(row) if row is not None else GROUPED_UNMEASURED) == "cudnn"
    choice = _plain_choice(device, dtype, act, cudnn, residual, large_1x1, pointwise, depthwise, weight_dim,
                           int_padding, layout, steps)
    if row is None or choice.impl not in ("cudnn_conv_relu", "cudnn_conv_add_relu", "triton_epilogue"):
        return choice                   # no measurement decided, or neither measured way runs (a policy is off)
    return Choice(choice.impl, _grouped_note(choice.label, row), choice.fused)


def _plain_choice(device: torch.device, dtype: torch.dtype, act: str, cudnn: bool, residual: bool, large_1x1: bool,
                  pointwise: bool, depthwise: bool, weight_dim: int, int_padding: bool, layout: str | None,
                  steps: str) -> Choice:
    """``select_conv_epilogue``'s answer once whether cuDNN's fused call may run is known."""
    if cudnn and residual:
        return Choice("cudnn_conv_add_relu", WORDS("label.cudnn_add_relu"), True)
    if cudnn and not large_1x1:
        return Choice("cudnn_conv_relu", WORDS("label.cudnn_relu"), True)
    triton = triton_runs_on(device) and dtype in TRITON_DTYPES
    tail = "" if layout == "nhwc" else "_cl"
    if triton and _policy.POLICY.gemm_triton and pointwise and weight_dim == 4 and layout in (None, "nhwc"):
        return Choice("triton_gemm", where(WORDS("label.gemm" + tail, steps=steps), device), True)
    if (triton and _policy.POLICY.depthwise_triton and depthwise and weight_dim == 4 and int_padding
            and layout in (None, "nhwc")):
        return Choice("triton_depthwise", where(WORDS("label.depthwise" + tail, steps=steps), device), True)
    if triton and _policy.POLICY.triton_epilogue:
        return Choice("triton_epilogue", where(WORDS("label.epilogue", steps=steps), device), True)
    return _separate_choice(act, residual)


def _grouped_note(label, row: dict):
    """``label`` with the measured row that chose it: the shape it was timed at and both ways' median µs."""
    return _noted(label, tuple(row["key"]), row["us"]["cudnn"]["median"], row["us"]["epilogue"]["median"])


@functools.lru_cache(maxsize=512)
def _noted(label, key: tuple, cudnn_us: float, epilogue_us: float):
    """``_grouped_note``'s message, made once per label and row: the selection also runs at every call of a fused
    conv that is not lowered, where only its ``impl`` is read."""
    n, c_in, h, w, c_out, kh, kw, *_rest, groups = key
    return WORDS("label.grouped_noted", label=label, n=n, c_in=c_in, c_out=c_out, h=h, w=w, kh=kh, kw=kw,
                 groups=groups, cudnn=cudnn_us, epilogue=epilogue_us)


def _fits(x: torch.Tensor, weight: torch.Tensor, z: torch.Tensor | None, stride, padding, dilation) -> bool:
    """Whether the residual ``z`` has the conv output's shape and ``x``'s dtype (no broadcast)."""
    return z is None or (z.dtype == x.dtype and not isinstance(padding, str)
                         and tuple(z.shape) == conv_out_shape(x.shape, weight.shape, stride, padding, dilation))


def conv_epilogue(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, z: torch.Tensor | None,
                  stride=1, padding=0, dilation=1, groups: int = 1, act: str = "relu",
                  separate: bool = False) -> torch.Tensor:
    """``act(conv(x, weight) + bias [+ z])`` as ``select_conv_epilogue`` decides.

    Shapes: ``x`` ``(N, C_in, *spatial)``; ``weight`` ``(C_out, C_in/groups, *kernel)``;
    ``bias`` ``(C_out,)`` or None; ``z`` the conv output's shape, or None.
    """
    fits = _fits(x, weight, z, stride, padding, dilation)
    int_padding = not isinstance(padding, str)
    kernel = tuple(weight.shape[2:])
    out_pixels = None
    if act == "relu" and x.is_cuda and int_padding and all(k == 1 for k in kernel):
        out_pixels = math.prod(conv_out_shape(x.shape, weight.shape, stride, padding, dilation)[2:]) * x.shape[0]
    choice = select_conv_epilogue(x.device, x.dtype, act, weight_dim=weight.dim(), int_padding=int_padding,
                                  residual=z is not None, residual_fits=fits, separate=separate,
                                  kernel_size=kernel, depthwise=x.dim() == 4 and is_depthwise(x.shape[1], weight.shape,
                                                                                             groups),
                                  grouped=groups > 1, grouped_key=conv_measured.shape_key(
                                      x.shape, weight.shape, stride, padding, dilation, groups),
                                  pointwise=is_pointwise_conv(weight.shape, stride, padding, dilation, groups),
                                  out_pixels=out_pixels, layout=layout_of(x))
    n = weight.dim() - 2
    if choice.impl == "cudnn_conv_relu":
        return torch.cudnn_convolution_relu(x, weight, bias, as_list(stride, n), as_list(padding, n),
                                            as_list(dilation, n), groups)
    if choice.impl == "cudnn_conv_add_relu":
        return torch.cudnn_convolution_add_relu(x, weight, z, 1.0, bias, as_list(stride, n),
                                                as_list(padding, n), as_list(dilation, n), groups)
    if choice.impl == "triton_depthwise" and fits and depthwise_applies(x, weight, groups, z):
        return depthwise_conv(x, weight, bias, z, stride, padding, dilation, act)
    if choice.impl == "triton_gemm" and fits and conv1x1_applies(x, weight, z):
        return conv1x1_epilogue(x, weight, bias, z, act)
    if choice.impl in ("triton_gemm", "triton_depthwise", "triton_epilogue"):
        y = conv_nd(x, weight, None, stride, padding, dilation, groups)     # (N, C_out, *out_spatial)
        if z is None or z.shape == y.shape:
            return bias_act_(y, bias, z, act)
        return bias_act_torch_(y, bias, z, act)                            # z broadcasts: the torch ops
    y = conv_nd(x, weight, bias, stride, padding, dilation, groups)         # (N, C_out, *out_spatial)
    if z is not None:
        y.add_(z)
    return apply_activation_(y, act)


# ====================================================================== fused call targets
# Module-level functions: gm.code names them, pickle finds them by name.

def fused_conv_bn(x, weight, bias, stride, padding, dilation, groups):
    """conv with BatchNorm folded into ``weight``/``bias``: the conv, its bias where the selection puts it."""
    return conv_epilogue(x, weight, bias, None, stride, padding, dilation, groups, "none")


def fused_conv_act(x, weight, bias, stride, padding, dilation, groups, act):
    """``act(conv(x, weight) + bias)``: conv epilogue (cuDNN fused for relu on CUDA)."""
    return conv_epilogue(x, weight, bias, None, stride, padding, dilation, groups, act)


def fused_conv_bn_act(x, weight, bias, stride, padding, dilation, groups, act):
    """``act(conv(x, w') + b')`` with BatchNorm folded into ``w'``/``b'``."""
    return conv_epilogue(x, weight, bias, None, stride, padding, dilation, groups, act)


def fused_conv_add_act(x, weight, bias, z, stride, padding, dilation, groups, act):
    """``act(conv(x, weight) + bias + z)``: residual add and activation ("none": no activation) in the epilogue."""
    return conv_epilogue(x, weight, bias, z, stride, padding, dilation, groups, act)


def fused_conv_bn_add_act(x, weight, bias, z, stride, padding, dilation, groups, act):
    """``act(conv(x, w') + b' + z)`` with BatchNorm folded into ``w'``/``b'`` ("none": no activation)."""
    return conv_epilogue(x, weight, bias, z, stride, padding, dilation, groups, act)


def fused_conv_separate_epilogue(x, weight, bias, z, stride, padding, dilation, groups, act):
    """Kernel choice "separate_epilogue": conv with its bias, then ``+ z`` (when given) and ``act`` in place."""
    return conv_epilogue(x, weight, bias, z, stride, padding, dilation, groups, act, separate=True)


# ====================================================================== rewrite

def _bn_output(bn: torch.fx.Node, chain_nodes: set[str]) -> tuple[torch.fx.Node, list[torch.fx.Node]]:
    """The node that carries the normalised tensor (bn itself, or its ``getitem 0``), and extra nodes to remove."""
    val = bn.meta.get("val")
    if not isinstance(val, (tuple, list)):
        return bn, []
    users = list(bn.users)
    firsts = [u for u in users if u.target is operator.getitem and u.args[1] == 0]
    others = [u for u in users if u not in firsts and not aten.is_ignored(u)]
    if len(firsts) != 1 or any(u.users for u in others):
        raise Refuse(WORDS("refuse.stats_used"))
    return firsts[0], [u for u in users if u is not firsts[0]] if firsts[0].name in chain_nodes else users


def _conv(conv: torch.fx.Node) -> aten.ConvArgs:
    args = aten.conv_args(conv)
    if args is None:
        raise UseGeneric(WORDS("generic.op", op=aten.aten_name(conv)))
    if args.transposed:
        raise UseGeneric(WORDS("generic.transposed"))
    if any(args.output_padding or [0]):
        raise UseGeneric(WORDS("generic.output_padding"))
    return args


def _folded(ctx: RewriteContext, conv: torch.fx.Node, bn: torch.fx.Node) -> tuple[torch.Tensor, torch.Tensor]:
    """Fold ``bn`` into ``conv``: returns the new (weight, bias)."""
    c = _conv(conv)
    b = aten.batch_norm_args(bn)
    if b is None:
        raise Refuse(WORDS("refuse.variant", op=aten.aten_name(bn)))
    if b.training:
        raise Refuse(TRAINING_REFUSAL)
    if b.running_mean is None or b.running_var is None:
        raise Refuse(NO_RUNNING_STATS_REFUSAL)
    if not edit.through_identity(b.input, conv):
        raise Refuse(WORDS("refuse.not_direct"))
    tensors = [ctx.constant(t, what) for t, what in (
        (c.weight, WORDS("what.conv_weight")), (c.bias, WORDS("what.conv_bias")),
        (b.running_mean, WORDS("what.running_mean")), (b.running_var, WORDS("what.running_var")),
        (b.weight, WORDS("what.bn_weight")), (b.bias, WORDS("what.bn_bias")))]
    return fold_conv_bn(*tensors, b.eps)


def _choice(ctx: RewriteContext, conv: torch.fx.Node, act: str, z: torch.fx.Node | None, separate: bool) -> Choice:
    """``select_conv_epilogue`` for a chain's conv, from the shapes the graph records, in the dtype the graph
    runs in for the rewrite's target (``RewriteContext.run_dtype``) and the input layout its memory format
    gives (``_target_layout``)."""
    c = _conv(conv)
    weight_val = aten.node_val(c.weight)
    w_shape = tuple(weight_val.shape) if isinstance(weight_val, torch.Tensor) else None
    x_shape = aten.static_shape(c.input)
    int_padding = not isinstance(c.padding, str)
    out_shape = (conv_out_shape(x_shape, w_shape, c.stride, c.padding, c.dilation)
                 if x_shape is not None and w_shape is not None and int_padding else None)
    z_shape = aten.static_shape(z)
    fits = z is None or (out_shape is not None and z_shape == out_shape)
    return select_conv_epilogue(ctx.device, ctx.run_dtype(conv), act, weight_dim=len(w_shape) if w_shape else 4,
                                int_padding=int_padding, residual=z is not None, residual_fits=fits,
                                separate=separate, kernel_size=w_shape[2:] if w_shape else None,
                                depthwise=(x_shape is not None and w_shape is not None
                                           and is_depthwise(x_shape[1], w_shape, c.groups)),
                                grouped=c.groups > 1, grouped_key=conv_measured.shape_key(
                                    x_shape, w_shape, c.stride, c.padding, c.dilation, c.groups),
                                pointwise=w_shape is not None and is_pointwise_conv(w_shape, c.stride, c.padding,
                                                                                    c.dilation, c.groups),
                                out_pixels=math.prod(out_shape[2:]) * out_shape[0] if out_shape else None,
                                layout=_target_layout(ctx, c.input))


def _target_layout(ctx: RewriteContext, x: torch.fx.Node) -> str | None:
    """The layout the conv's input has when the graph runs for the rewrite's target, where the target says it: in
    nchw the prepared graph keeps the capture's layouts (nothing is converted), so it is the one the graph records
    (``layout_of`` its value: "nchw" for a contiguous input, "nhwc" for a permuted one such as ConvNeXt's, None for
    any other); in channels_last the inputs and weights are converted when the graph is prepared and a permute may
    still hand the conv a contiguous tensor, so the layout stays a run-time question (None)."""
    if ctx.target.channels_last:
        return None
    val = aten.node_val(x)
    return layout_of(val) if isinstance(val, torch.Tensor) else None


def fold(ctx: RewriteContext, chain: Chain) -> edit.Edit:
    """conv → (views) → BN becomes one conv with folded weights; the rest of the chain stays."""
    conv, bn = ctx.node(chain, "conv"), ctx.node(chain, "bn")
    names = list(chain.nodes)
    covered = [ctx.by_name[n] for n in names[: names.index(bn.name) + 1]]
    out, extra_remove = _bn_output(bn, set(names))
    w, b = _folded(ctx, conv, bn)
    if out is not bn and out.name in names:
        covered += [out]
    remove = covered + extra_remove
    edit.check_no_outside_users(remove, [out])
    c = _conv(conv)
    key = conv.name
    choice = _choice(ctx, conv, "none", None, False)
    label = WORDS("label.folded", label=choice.label)
    return edit.Edit(chain, tuple(remove), (out,), fused_conv_bn,
                     (c.input, NewAttr(f"{key}_weight"), NewAttr(f"{key}_bias"),
                      c.stride, c.padding, c.dilation, c.groups),
                     Choice(choice.impl, label, True), tensors={f"{key}_weight": w, f"{key}_bias": b})


def rewrite(ctx: RewriteContext, chain: Chain, kernel: str) -> edit.Edit:
    """conv [→ BN] [→ add z] [→ act] as one epilogue call (BN folded); the kernel choice "separate_epilogue"
    runs the conv with its bias, then the add and the activation in place, never a fused epilogue."""
    conv, bn, add = ctx.node(chain, "conv"), ctx.node(chain, "bn"), ctx.node(chain, "add")
    act_node = ctx.node(chain, "act")
    if act_node is None and add is None:  # conv_bn: the fold is the whole chain
        return fold(ctx, chain)
    edit.only_identity_views(ctx, chain)
    act = "none" if act_node is None else aten.activation_name(act_node)
    if act not in CONV_ACTIVATIONS:
        raise UseGeneric(WORDS("generic.no_epilogue", act=act))
    c = _conv(conv)
    weight, bias = c.weight, c.bias
    tensors: dict[str, torch.Tensor] = {}
    if bn is not None:
        w, b = _folded(ctx, conv, bn)
        tensors = {f"{conv.name}_weight": w, f"{conv.name}_bias": b}
        weight, bias = NewAttr(f"{conv.name}_weight"), NewAttr(f"{conv.name}_bias")
    members = set(ctx.members(chain))
    z = None
    if add is not None:
        edit.check_alpha(add)
        z = edit.other_operand(add, members)
    separate = kernel == "separate_epilogue"
    choice = _choice(ctx, conv, act, z, separate)
    if bn is not None:
        choice = Choice(choice.impl, WORDS("label.folded", label=choice.label), choice.fused)
    choice = edit.epilogue_choice(ctx, choice, separate, BASE_WORDS("conv_epilogue"))
    choice = Choice(choice.impl, choice.label, choice.fused or bn is not None)
    if separate:
        target = fused_conv_separate_epilogue
    elif z is not None:
        target = fused_conv_bn_add_act if bn is not None else fused_conv_add_act
    else:
        target = fused_conv_bn_act if bn is not None else fused_conv_act
    args = (c.input, weight, bias, *((z,) if (z is not None or separate) else ()),
            c.stride, c.padding, c.dilation, c.groups, act)
    return edit.whole_chain_edit(ctx, chain, target, args, choice, tensors)


# ====================================================================== lowering (lean graphs)

def _geometry(gm, weight, stride, padding, dilation, groups):
    """``(weight tensor, stride, padding, dilation)`` as int lists for a 2-D conv, or None when unresolvable."""
    w = edit.attr_tensor(gm, weight)
    lists = edit.int_lists(2, stride, padding, dilation)
    if w is None or w.dim() != 4 or lists is None or not isinstance(groups, int):
        return None
    return (w, *lists)


def _lower(gm: torch.fx.GraphModule, node: torch.fx.Node, device: torch.device, dtype: torch.dtype, x, w, b, z,
           stride, padding, dilation, groups, act: str, separate: bool) -> bool:
    """The fused conv call as the library calls its choice names: the one the rewrite recorded for this device
    and dtype (``edit.planned``), else (a call fused for another target) the selection's."""
    geometry = _geometry(gm, w, stride, padding, dilation, groups)
    x_shape = aten.static_shape(x)
    if geometry is None or act not in CONV_ACTIVATIONS or x_shape is None:
        return False
    weight, stride, padding, dilation = geometry
    out_shape = conv_out_shape(x_shape, weight.shape, stride, padding, dilation)
    fits = True
    if z is not None:
        z_shape = aten.static_shape(z)
        if z_shape is None:
            return False
        fits = out_shape == z_shape
    choice = edit.planned(node, device, dtype) or select_conv_epilogue(
        device, dtype, act, weight_dim=4, residual=z is not None, residual_fits=fits, separate=separate,
        kernel_size=tuple(weight.shape[2:]), depthwise=is_depthwise(x_shape[1], weight.shape, groups),
        grouped=groups > 1,
        grouped_key=conv_measured.shape_key(x_shape, weight.shape, stride, padding, dilation, groups),
        pointwise=is_pointwise_conv(weight.shape, stride, padding, dilation, groups),
        out_pixels=math.prod(out_shape[2:]) * out_shape[0])
    if choice.impl == "cudnn_conv_relu":
        return edit.replace_node(gm, node, lambda g: g.call_function(
            torch.cudnn_convolution_relu, (x, w, b, stride, padding, dilation, groups)))
    if choice.impl == "cudnn_conv_add_relu":  # z floating like x: both in ``dtype`` after prepare_graph
        return edit.replace_node(gm, node, lambda g: g.call_function(
            torch.cudnn_convolution_add_relu, (x, w, z, 1.0, b, stride, padding, dilation, groups)))
    if choice.impl == "triton_depthwise" and fits:
        packed = edit.register_buffer(gm, "_lean_dw_" + str(w.target).replace(".", "_"), pack_depthwise_weight(weight))
        return edit.replace_node(gm, node, lambda g: g.call_function(
            depthwise_conv_epilogue, (x, w, g.get_attr(packed), b, z, stride, padding, dilation, act)))
    if choice.impl == "triton_gemm" and fits:
        return edit.replace_node(gm, node, lambda g: g.call_function(conv1x1_epilogue, (x, w, b, z, act)))
    if choice.impl in ("triton_gemm", "triton_depthwise", "triton_epilogue") and fits:
        return edit.replace_node(gm, node, lambda g: g.call_function(
            bias_act_, (g.call_function(torch.conv2d, (x, w, None, stride, padding, dilation, groups)), b, z, act)))
    if choice.impl != "separate":
        return False

    def build(g: torch.fx.Graph) -> torch.fx.Node:
        y = g.call_function(torch.conv2d, (x, w, b, stride, padding, dilation, groups))
        if z is not None:
            y = g.call_method("add_", (y, z))
        return in_place_node(g, y, act)

    return edit.replace_node(gm, node, build)


def _lower_conv_bn(gm: torch.fx.GraphModule, node: torch.fx.Node, device: torch.device, dtype: torch.dtype) -> bool:
    """fused_conv_bn (BatchNorm already folded into the weight): the conv, its bias as the selection says."""
    x, w, b, stride, padding, dilation, groups = node.args
    return _lower(gm, node, device, dtype, x, w, b, None, stride, padding, dilation, groups, "none", False)


def _lower_act(gm: torch.fx.GraphModule, node: torch.fx.Node, device: torch.device, dtype: torch.dtype) -> bool:
    x, w, b, stride, padding, dilation, groups, act = node.args
    return _lower(gm, node, device, dtype, x, w, b, None, stride, padding, dilation, groups, act, False)


def _lower_add_act(gm: torch.fx.GraphModule, node: torch.fx.Node, device: torch.device, dtype: torch.dtype) -> bool:
    x, w, b, z, stride, padding, dilation, groups, act = node.args
    return _lower(gm, node, device, dtype, x, w, b, z, stride, padding, dilation, groups, act, False)


def _lower_separate(gm: torch.fx.GraphModule, node: torch.fx.Node, device: torch.device, dtype: torch.dtype) -> bool:
    x, w, b, z, stride, padding, dilation, groups, act = node.args
    return _lower(gm, node, device, dtype, x, w, b, z, stride, padding, dilation, groups, act, True)


#: fused call target -> lowering(gm, node, device, dtype) -> bool (explorer.runtime.lean)
LOWERINGS = {
    fused_conv_bn: _lower_conv_bn,
    fused_conv_act: _lower_act,
    fused_conv_bn_act: _lower_act,
    fused_conv_add_act: _lower_add_act,
    fused_conv_bn_add_act: _lower_add_act,
    fused_conv_separate_epilogue: _lower_separate,
}


# ====================================================================== patterns

def _bn_inference(g, node: str, ctx: dict) -> str | None:
    if g.nodes[node].get("training"):
        return WORDS("refuse.training_guard")
    return None


def _same_shape_add(g, node: str, ctx: dict) -> str | None:
    """The residual operand of a fused conv+add must have the conv output's shape."""
    prev = ctx["prev"]
    out_shape = g.nodes[prev]["shapes"][:1]
    for src in g.predecessors(node):
        if src == prev or src in ctx["chain"]:
            continue
        if g.nodes[src]["shapes"][:1] != out_shape:
            return WORDS("refuse.broadcast", shape=g.nodes[src]['shapes'][:1], out=out_shape)
    if g.in_degree(node) == 1:
        return WORDS("refuse.constant")
    return None


_CONV = Step(frozenset({"conv"}), "conv")
_BN = Step(frozenset({"batch_norm"}), "bn", guard=_bn_inference)
_ACT = Step(frozenset(CONV_ACTIVATIONS) - {"none", "gelu_tanh"}, "act", family=ACTIVATIONS)
_ADD = Step(frozenset({"add"}), "add", guard=_same_shape_add)
_KERNELS = ("auto", "separate_epilogue", "inductor")
_IMPLEMENTATION = WORDS("implementation")
_PROJECTION_WHY = WORDS("projection_why")
_DEPTHWISE_CAVEAT = WORDS("caveat.cudnn_depthwise")    # the chains whose activation may be a ReLU

PATTERNS = (
    Pattern(
        name="conv_bn_add_act", label=WORDS("conv_bn_add_act.label"), stage="activation",
        steps=(_CONV, _BN, _ADD, _ACT), color="#1f77b4", kernels=_KERNELS, rewrite=rewrite, fold=fold,
        implementation=WORDS("conv_bn_add_act.implementation"),
        explanation=WORDS("conv_bn_add_act.explanation"),
        caveats=(FOLD_CAVEAT, PRECISION_CAVEAT, PAYS_CAVEAT, _DEPTHWISE_CAVEAT), formula=FORMULA,
    ),
    Pattern(
        name="conv_add_act", label=WORDS("conv_add_act.label"), stage="activation",
        steps=(_CONV, _ADD, _ACT), color="#17becf", kernels=_KERNELS, rewrite=rewrite,
        implementation=_IMPLEMENTATION,
        explanation=WORDS("conv_add_act.explanation"),
        caveats=(PRECISION_CAVEAT, PAYS_CAVEAT, _DEPTHWISE_CAVEAT),
    ),
    Pattern(
        name="conv_bn_add", label=WORDS("conv_bn_add.label"), stage="activation",
        steps=(_CONV, _BN, _ADD), color="#ffbb78", kernels=_KERNELS, rewrite=rewrite, fold=fold,
        implementation=WORDS("conv_bn_add.implementation"),
        explanation=_PROJECTION_WHY,
        caveats=(FOLD_CAVEAT, PRECISION_CAVEAT, PAYS_CAVEAT), formula=FORMULA,
    ),
    Pattern(
        name="conv_add", label=WORDS("conv_add.label"), stage="activation",
        steps=(_CONV, _ADD), color="#9edae5", kernels=_KERNELS, rewrite=rewrite,
        implementation=WORDS("conv_add.implementation"),
        explanation=WORDS("conv_add.explanation"),
        caveats=(PRECISION_CAVEAT, PAYS_CAVEAT),
    ),
    Pattern(
        name="conv_bn_act", label=WORDS("conv_bn_act.label"), stage="activation",
        steps=(_CONV, _BN, _ACT), color="#2ca02c", kernels=_KERNELS, rewrite=rewrite, fold=fold,
        implementation=WORDS("conv_bn_add_act.implementation"),
        explanation=WORDS("conv_bn_act.explanation"),
        caveats=(FOLD_CAVEAT, PRECISION_CAVEAT, PAYS_CAVEAT, _DEPTHWISE_CAVEAT), formula=FORMULA,
    ),
    Pattern(
        name="conv_act", label=WORDS("conv_act.label"), stage="activation",
        steps=(_CONV, _ACT), color="#98df8a", kernels=_KERNELS, rewrite=rewrite,
        implementation=_IMPLEMENTATION,
        explanation=WORDS("conv_act.explanation"),
        caveats=(PRECISION_CAVEAT, PAYS_CAVEAT, _DEPTHWISE_CAVEAT),
    ),
    Pattern(
        name="conv_bn", label=WORDS("conv_bn.label"), stage="conv_bn",
        steps=(_CONV, _BN), color="#ff7f0e", rewrite=rewrite, fold=fold,
        implementation=WORDS("conv_bn.implementation"),
        explanation=WORDS("conv_bn.explanation"),
        caveats=(FOLD_CAVEAT, PRECISION_CAVEAT), formula=FORMULA,
    ),
)



def __getattr__(name: str):
    """``conv.POLICY``: the kernels' policy as it is now (``explorer.fusions.kernels.policy`` rebinds it)."""
    if name == "POLICY":
        return _policy.POLICY
    raise AttributeError(name)
