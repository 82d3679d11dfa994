"""The ConvNeXt block and ConvNeXt's LayerNorm2d: each step chosen per shape from measurement, the folds exact.

::

    unfused (eager, channels_last: 8 kernels; NCHW: a 9th, the copy LayerNorm makes of the permuted tensor)
    x ─┬─► dwconv 7×7 ─► +b ─► permute ─► LayerNorm(C) ─► linear(4C)+b ─► GELU ─► linear(C)+b ─► permute ─► ·γ ─► + ─► y
       │    (cuDNN)   (bias kernel)        (1 kernel)      (cuBLASLt)    (1 kernel)  (cuBLASLt)               (1)  (1)
       └──────────────────────────────────────────────────────────────────────────────────────────────────────────┘

    fused: the first step as ``dwln_impl`` chooses for the shape (``DWLN_MEASURED``), then the MLP as ``mlp_impl``
    chooses (``MLP_MEASURED``), the layer scale folded into the second linear
    x ─┬─► cudnn_ln:  cuDNN dwconv (no bias) ─► ONE LayerNorm pass adding the bias (kernels.layer_norm)
       │   triton:    ONE Triton kernel: conv, bias and the LayerNorm over C (kernels.depthwise)
       │      ─► t (M=N·H·W, C) ─► cublas:      linear+b₁ ─► GELU pass ─► linear(γ·W₂)+γ·b₂ ─► +x pass ─► y
       │                           triton_fc1:  Triton GEMM+b₁+GELU ─► linear(γ·W₂)+γ·b₂ ─► +x pass
       │                           triton_gemm: Triton GEMM+b₁+GELU ─► Triton GEMM(γ·W₂)+γ·b₂+x
       │                           gelu_prologue: linear+b₁ ─► Triton GEMM(GELU(h)·(γ·W₂)ᵀ)+γ·b₂+x
       │                           cublas_accumulate: linear([W₁;0], [b₁;8]) ─► GELU in place ─►
       │                                        x += h·[γW₂ | γb₂/8]ᵀ (cuBLAS, β = 1, into x's storage: no +x pass)
       │                           triton_fc1_accumulate: the same, fc1 our Triton GEMM with the GELU epilogue
       └───────────────────────────────────────────────────────────────────────────────────────────▲

    LayerNorm2d (permute → layer_norm(C) → permute), one pass over the channels_last rows each:
      stem        conv 4×4/4 (no bias) ─► LayerNorm pass adding the conv's bias
      downsample  LayerNorm pass (γ, β folded into the conv 2×2/2: exact without padding) ─► conv
      head        LayerNorm pass (γ, β folded into the classifier) ─► linear

What each step buys, and why it is this way:

- **Depthwise conv + bias + LayerNorm**: our one kernel (``depthwise_conv`` with a LayerNorm
  epilogue) never writes the conv output, but it is bound by instruction issue (each input
  element loaded and converted 49 times: ``docs/kernel-notes.md``); cuDNN's depthwise conv
  without its bias, then one LayerNorm pass that adds the bias (inductor's split), measured
  faster at ConvNeXt-Tiny's first three stages on the H200 and ours at the 7×7 one
  (``DWLN_MEASURED``). Both need Triton and a channels_last input; otherwise cuDNN's conv,
  then ``layer_norm``.
- **Layer scale folded into the second linear**: ``γ · (h W₂ᵀ + b₂) = h (γW₂)ᵀ + γb₂``
  per output channel, exact algebra done once in float64 like the BatchNorm fold
  (``fold_layer_scale``): the multiply disappears.
- **The residual as one pass** (``residual_add_``'s kernel, launched from the call's plan);
  eager runs the multiply by γ and the add as two.
- **Or no residual pass at all** (``cublas_accumulate``, ``triton_fc1_accumulate``): cuBLAS can add the block
  input in its epilogue (``addmm_``, β = 1) but not a bias as well, so fc2's bias rides in the GEMM: fc1 gets
  ``K_PAD`` more outputs, zero weights, bias 8 on the first (GELU(8) = 8 exactly in every dtype), and fc2's
  weight the column ``γb₂/8`` (a power of two: exact). The sum is written once, into x's storage: only in a
  lean graph where x is provably dead after the block (``_owned_input``: a fresh tensor, every view of it used
  once), else the residual pass.
- **The MLP per shape** (``MLP_MEASURED``): cuBLASLt's GELU epilogue is the tanh
  approximation, so after cuBLAS the exact GELU is a pass of its own; our Triton GEMM with
  the exact GELU in its epilogue (``triton_fc1``) ties cuBLAS + the pass on the GPU at two
  stages and saves a launch there; cuBLAS elsewhere. Both linears as Triton GEMMs
  (``triton_gemm``) launch least but took 0.35 ms more GPU time in the model; the GEMM that
  applies the GELU to its input (``gelu_prologue``, ``kernels.gemm_prologue``) removes the
  pass but lost to cuBLAS + the pass. Both stay ``kernels.policy`` switches.
- **LayerNorm2d**: one pass over the rows (``kernels.layer_norm``), the stem conv's bias
  added in it, the affine folded into the next layer where exact (``fold_layer_norm_affine``);
  torch's ``layer_norm`` where it measured faster (``LN2D_MEASURED``: the launch-bound ones).

Whether the whole model pays is measured, not assumed: ``benchmarks/bench_convnext_kernels.py --only model``
times the fused model with each ``kernels.policy`` ConvNeXt switch forced beside the defaults.
``select_convnext_block`` and ``select_layer_norm2d`` are the decisions the runtime call, the label and the
lowering ask; each label says the measurement behind its choice.
"""

from __future__ import annotations

import torch
import torch.fx
import torch.nn.functional as F

from explorer.fusions import edit
from explorer.fusions.kernels import policy
from explorer.fusions.kernels.bias_act import bias_act_, plan_bias_act
from explorer.fusions.kernels.common import (PLANS, LaunchPlan, cached_plan, conv_nd, conv_out_shape, fallback_plan,
                                             is_depthwise, layout_of)
from explorer.fusions.kernels.depthwise import depthwise_applies, pack_depthwise_weight, plan_depthwise
from explorer.fusions.kernels.gemm import gemm_applies, gemm_launch, gemm_plan
from explorer.fusions.kernels.gemm_prologue import gemm_act_prologue_applies, prologue_launch, prologue_plan
from explorer.fusions.kernels.layer_norm import channels_layer_norm, rows_layer_norm
from explorer.fusions.kernels.linear_act import (LINEAR_ACTIVATIONS, fused_linear_act, linear_act, linear_act_reference,
                                                 lower_linear_act, select_linear_act)
from explorer.fusions.base import WORDS as BASE_WORDS
from explorer.fusions.base import PRECISION_CAVEAT, Choice, NoMatch, Pattern, Step, selection
from explorer.fusions.edit import NewAttr, Refuse, RewriteContext, UseGeneric
from explorer.fusions.epilogue import apply_activation_
from explorer.fusions.triton_support import interpreting, launch, remember, triton_runs_on, where
from explorer.graph import aten
from explorer.vocab import TRANSPARENT
from explorer.words import Words

#: What this family says to a person, in English and 中文 (rendered by explorer.ui.i18n by id).
WORDS = Words("convnext", {
    "title": ("ConvNeXt block", "ConvNeXt 块"),
    "convnext_block.label": ("ConvNeXt block", "ConvNeXt 块"),
    "convnext_block.implementation": (("depthwise conv + bias + LayerNorm in one Triton kernel, Linear+GELU, the "
                                       "second linear with the layer scale folded in, the residual add in one "
                                       "vectorised pass"),
                                      ("深度可分离卷积 + 偏置 + LayerNorm 合成一个 Triton 内核，Linear+GELU，第二个线性层折叠进 layer "
                                       "scale，残差相加用一个向量化内核完成")),
    "convnext_block.explanation": (("A ConvNeXt block is eight kernels in eager mode, five of them moving the "
                                    "whole activation for a few flops each (the conv's bias, LayerNorm, GELU, the "
                                    "layer scale, the residual add). The LayerNorm runs in the depthwise "
                                    "convolution's epilogue, the layer scale disappears into the second linear's "
                                    "weights, and the residual add is one pass."),
                                   ("ConvNeXt 块在 eager "
                                    "模式下是八个内核，其中五个每次只做几次浮点运算却要搬运整个激活张量（卷积偏置、LayerNorm、GELU、layer "
                                    "scale、残差相加）。LayerNorm 放进深度可分离卷积的尾处理，layer scale 折叠进第二个线性层的权重，残差相加只需一遍。")),
    "caveat": (("Folding the layer scale into the second linear rounds γ·W₂ to the weights' dtype once, as "
                "BatchNorm folding does; valid in inference and training alike (it is exact algebra)."),
               "把 layer scale 折叠进第二个线性层时，γ·W₂ 会按权重的数据类型舍入一次，和 BN 折叠一样；推理和训练都成立（这是精确的代数变换）。"),
    "caveat_measured": (("Measured on the H200 (ConvNeXt-Tiny, fp16, batch 32, channels_last), by the profiler's GPU "
                         "time: each block's steps were chosen block by block (bench_convnext_blocks_h200.json); in "
                         "the same run the whole model with cuDNN's depthwise conv at every stage took 2.12 ms of GPU "
                         "time per forward against torch.compile's default mode's 2.35. A plain call's latency "
                         "depends on the host too. Time these chains on your GPU before accepting them."),
                        ("在 H200 上按性能分析器的 GPU 时间实测（ConvNeXt-Tiny，fp16，batch 32，channels_last）：每个块的各步骤逐块选择"
                         "（bench_convnext_blocks_h200.json）；同一次运行中，每个 stage 都用 cuDNN 深度可分离卷积的整个模型每次前向占用 "
                         "2.12 ms GPU 时间，torch.compile 默认模式为 2.35 ms。普通调用的延迟还取决于主机。接受这些链之前，先在你的 "
                         "GPU 上给它们计时。")),
    "convnext_block.formula": ("gamma * (h W2^T + b2) = h (gamma W2)^T + gamma b2   (per output channel)",
                               "gamma * (h W2^T + b2) = h (gamma W2)^T + gamma b2（逐输出通道）"),
    "mlp.gemm": (("triton GEMM+bias+{act} (1 kernel) + triton GEMM+bias+residual, layer scale folded (1 kernel; a "
                  "residual that is not channels_last: 1 pass more)"),
                 ("triton GEMM+bias+{act}（1 个内核） + triton GEMM+bias+残差，折叠 layer scale（1 个内核；残差不是 channels_last 时多 "
                  "1 遍）")),
    "mlp.fused": ("linear+{act} (1 kernel: {impl}) + linear, layer scale folded (1 kernel) + {residual}",
                  "linear+{act}（1 个内核：{impl}） + linear，折叠 layer scale（1 个内核） + {residual}"),
    "mlp.separate": ("linear+{act} (2 kernels) + linear, layer scale folded (1 kernel) + {residual}",
                     "linear+{act}（2 个内核） + linear，折叠 layer scale（1 个内核） + {residual}"),
    "residual.triton": ("triton residual add (1 pass)", "triton 残差相加（1 遍）"),
    "residual.torch": ("residual add_", "残差 add_"),
    "label.triton": ("triton dwconv+bias+LayerNorm (1 kernel) + {mlp}",
                     "triton dwconv+bias+LayerNorm（1 个内核） + {mlp}"),
    "label.triton.noted": ("triton dwconv+bias+LayerNorm (1 kernel) [chosen by: {note}] + {mlp}",
                           "triton dwconv+bias+LayerNorm（1 个内核）【依据：{note}】 + {mlp}"),
    "label.triton_cl": (("triton dwconv+bias+LayerNorm (1 kernel for a channels_last input, else conv + "
                         "layer_norm) + {mlp}"),
                        "triton dwconv+bias+LayerNorm（1 个内核，限 channels_last 输入，否则 conv + layer_norm） + {mlp}"),
    "label.triton_cl.noted": (("triton dwconv+bias+LayerNorm (1 kernel for a channels_last input, "
                               "else conv + layer_norm) [chosen by: {note}] + {mlp}"),
                              ("triton dwconv+bias+LayerNorm（1 个内核，限 channels_last 输入，否则 conv + "
                               "layer_norm）【依据：{note}】 + {mlp}")),
    "label.reference": ("dwconv+bias + layer_norm + {mlp} ({why})", "dwconv+bias + layer_norm + {mlp}（{why}）"),
    "label.cudnn_ln": ("cuDNN dwconv + triton bias+LayerNorm (1 pass) + {mlp}",
                       "cuDNN 深度可分离卷积 + triton 偏置+LayerNorm（1 遍） + {mlp}"),
    "label.cudnn_ln.noted": ("cuDNN dwconv + triton bias+LayerNorm (1 pass) [chosen by: {note}] + {mlp}",
                             "cuDNN 深度可分离卷积 + triton 偏置+LayerNorm（1 遍）【依据：{note}】 + {mlp}"),
    "label.cudnn_ln_cl": (("cuDNN dwconv + triton bias+LayerNorm (1 pass for a channels_last input, else "
                           "layer_norm) + {mlp}"),
                          "cuDNN 深度可分离卷积 + triton 偏置+LayerNorm（1 遍，限 channels_last 输入，否则 layer_norm） + {mlp}"),
    "label.cudnn_ln_cl.noted": (("cuDNN dwconv + triton bias+LayerNorm (1 pass for a channels_last "
                                 "input, else layer_norm) [chosen by: {note}] + {mlp}"),
                                ("cuDNN 深度可分离卷积 + triton 偏置+LayerNorm（1 遍，限 channels_last 输入，否则 "
                                 "layer_norm）【依据：{note}】 + {mlp}")),
    "mlp.fc1": (("triton GEMM+bias+{act} (1 kernel) + cuBLAS linear, layer scale folded (1 kernel) + triton residual "
                 "add (1 pass)"),
                ("triton GEMM+偏置+{act}（1 个内核） + cuBLAS 线性层，折叠 layer scale（1 个内核） + triton 残差相加（1 遍）")),
    "mlp.prologue": (("cuBLAS linear+bias (1 kernel) + triton GEMM with the {act} applied to its input as it "
                      "loads it, bias and residual in its epilogue, layer scale folded (1 kernel: no {act} pass)"),
                     ("cuBLAS linear+偏置（1 个内核） + triton GEMM：读入输入时就地做 {act}，尾处理加偏置和残差，折叠 layer scale"
                      "（1 个内核：没有单独的 {act} 遍）")),
    "mlp.accumulate": (("cuBLAS linear+bias (1 kernel, one padded column of 8s) + {act} in place (1 pass) + cuBLAS "
                        "linear accumulating onto the block input, its bias carried by the padded column, layer scale "
                        "folded (1 kernel: no residual pass; where the input is dead after the block, else the "
                        "residual pass)"),
                       ("cuBLAS 线性层+偏置（1 个内核，多一列常数 8） + 就地 {act}（1 遍） + cuBLAS 线性层直接累加到块输入上，"
                        "偏置由补出的那一列带入，折叠 layer scale（1 个内核：没有残差遍；仅当输入在块之后不再使用，否则保留残差遍）")),
    "mlp.fc1_accumulate": (("triton GEMM+bias+{act} (1 kernel, one padded column of 8s) + cuBLAS linear "
                            "accumulating onto the block input, its bias carried by the padded column, layer scale "
                            "folded (1 kernel: no {act} pass, no residual pass; where the input is dead after the "
                            "block, else the residual pass)"),
                           ("triton GEMM+偏置+{act}（1 个内核，多一列常数 8） + cuBLAS 线性层直接累加到块输入上，偏置由补出的那一列带入，"
                            "折叠 layer scale（1 个内核：没有 {act} 遍，也没有残差遍；仅当输入在块之后不再使用，否则保留残差遍）")),
    "accumulate.explanation": (("fc2's bias rides in its GEMM: fc1 gets one more output whose bias is 8 and whose "
                                "weights are 0, GELU(8) = 8 exactly, and fc2's weight gets the column b₂/8; then "
                                "cuBLAS computes x + h·W₂ᵀ + b₂ straight into x's storage (β = 1), so the residual "
                                "add is no pass of its own."),
                               ("把 fc2 的偏置放进它的 GEMM：fc1 多一个输出，权重为 0、偏置为 8，GELU(8) 恰好等于 8；fc2 的权重多一列 "
                                "b₂/8。cuBLAS 于是直接在 x 的存储上算出 x + h·W₂ᵀ + b₂（β = 1），残差相加不再单独一遍。")),
    "notes.two": ("{first}; for the MLP, {second}", "{first}；MLP：{second}"),
    "stem.label": ("ConvNeXt stem: conv + LayerNorm2d", "ConvNeXt stem：卷积 + LayerNorm2d"),
    "downsample.label": ("ConvNeXt downsampling: LayerNorm2d + conv", "ConvNeXt 下采样：LayerNorm2d + 卷积"),
    "head.label": ("ConvNeXt head: LayerNorm2d + linear", "ConvNeXt 头部：LayerNorm2d + 线性层"),
    "ln2d.implementation": (("one Triton LayerNorm pass over the channels of the channels_last map (its pixels "
                             "are contiguous rows), with the stem conv's bias added in it, or with the affine "
                             "folded into the next conv or linear"),
                            ("一个 Triton LayerNorm 遍，在 channels_last 特征图的通道上归一化（像素就是连续的行）；stem "
                             "卷积的偏置在其中相加，或把仿射参数折叠进下一个卷积或线性层")),
    "stem.explanation": (("torchvision's LayerNorm2d permutes the map and runs layer_norm over C; ATen adds the "
                          "stem conv's bias as a pass of its own. The conv runs without its bias and one "
                          "LayerNorm pass adds it, normalises and writes the rows once."),
                         ("torchvision 的 LayerNorm2d 先 permute 特征图再在 C 上做 layer_norm；ATen 把 stem "
                          "卷积的偏置作为单独一遍相加。这里卷积不带偏置，由一个 LayerNorm 遍加上偏置、归一化并只写一次。")),
    "downsample.explanation": (("Before each downsampling conv (2×2, stride 2) a LayerNorm2d: one pass over the "
                                "channels_last rows, and γ, β folded into the conv's weights and bias (exact "
                                "algebra without padding, like BatchNorm folding), so the pass writes x̂ alone."),
                               ("每个下采样卷积（2×2，步长 2）前的 LayerNorm2d：在 channels_last 的行上一遍完成，γ、β "
                                "折叠进卷积的权重和偏置（无填充时是精确的代数变换，和 BN 折叠一样），这一遍只写 x̂。")),
    "head.explanation": (("The classifier's LayerNorm2d of the pooled (N, C, 1, 1) map: one pass, γ and β folded "
                          "into the final linear (exact)."),
                         "分类头对池化后 (N, C, 1, 1) 的 LayerNorm2d：一遍完成，γ 和 β 折叠进最后的线性层（精确）。"),
    "stem.formula": ("LN(conv(x) + b) = LN(conv_without_bias(x) + b), b added inside the LayerNorm pass",
                     "LN(conv(x) + b) = LN(无偏置卷积(x) + b)，b 在 LayerNorm 遍内相加"),
    "ln2d.formula": ("W (γ·x̂ + β) + b = (W·γ) x̂ + (b + W β)   (per input channel)",
                     "W (γ·x̂ + β) + b = (W·γ) x̂ + (b + W β)（逐输入通道）"),
    "ln2d.caveat": (("Folding γ into the next layer rounds W·γ to the weights' dtype once, as BatchNorm "
                     "folding does."), "把 γ 折叠进下一层时，W·γ 会按权重的数据类型舍入一次，和 BN 折叠一样。"),
    "ln2d.stem": ("cuDNN conv (no bias) + triton bias+LayerNorm (1 pass)", "cuDNN 卷积（无偏置） + triton 偏置+LayerNorm（1 遍）"),
    "ln2d.downsample": ("triton LayerNorm (1 pass) + cuDNN conv", "triton LayerNorm（1 遍） + cuDNN 卷积"),
    "ln2d.downsample.folded": ("triton LayerNorm (1 pass, affine folded into the conv) + cuDNN conv",
                               "triton LayerNorm（1 遍，仿射折叠进卷积） + cuDNN 卷积"),
    "ln2d.head.folded": ("triton LayerNorm (1 pass, affine folded into the linear) + linear",
                         "triton LayerNorm（1 遍，仿射折叠进线性层） + 线性层"),
    "ln2d.reference": ("permute + layer_norm + the next layer ({why})", "permute + layer_norm + 下一层（{why}）"),
    "ln2d.noted": ("{label} [chosen by: measured at C={c} {h}×{w}: ours {ours:.0f} µs, torch {torch:.0f} µs]",
                   "{label}【依据：在 C={c} {h}×{w} 实测：我们的 {ours:.0f} µs，torch {torch:.0f} µs】"),
    "ln2d.why_measured": ("measured faster at C={c} {h}×{w}: torch {torch:.0f} µs, ours {ours:.0f} µs",
                          "在 C={c} {h}×{w} 实测更快：torch {torch:.0f} µs，我们的 {ours:.0f} µs"),
    "ln2d.why_policy": ("kernels.policy: convnext_ln2d off", "kernels.policy：convnext_ln2d 已关闭"),
    "ln2d.kernel": ("the one-pass LayerNorm2d", "单遍 LayerNorm2d"),
    "refuse.ln2d": ("the LayerNorm is not over the channels of a permuted (N, C, H, W) map",
                    "该 LayerNorm 不是对 permute 后的 (N, C, H, W) 特征图在通道上归一化"),
    "refuse.stem": ("the convolution before the LayerNorm does not reduce the map (not a stem)",
                    "LayerNorm 前的卷积没有缩小特征图（不是 stem）"),
    "generic.geometry": ("the convolution's geometry is not integer lists (or it is grouped)",
                         "卷积的几何参数不是整数列表（或是分组卷积）"),
    "generic.head": ("the head is not LayerNorm2d of a 1×1 map, permute, flatten, linear",
                     "头部不是 1×1 特征图的 LayerNorm2d、permute、flatten、linear"),
    "what.next_weight": ("the next layer's weight", "下一层的权重"),
    "what.next_bias": ("the next layer's bias", "下一层的偏置"),
    "what.ln_weight": ("LayerNorm weight", "LayerNorm 权重"),
    "what.ln_bias": ("LayerNorm bias", "LayerNorm 偏置"),
    "measured.none": ("not measured at this shape: the default", "此形状未实测：使用默认"),
    "measured.dwln": ("measured at C={c} {h}×{w}: our kernel {ours:.0f} µs, cuDNN + LayerNorm pass {split:.0f} µs",
                      "在 C={c} {h}×{w} 实测：我们的内核 {ours:.0f} µs，cuDNN + LayerNorm 遍 {split:.0f} µs"),
    "measured.block": (("GPU time per block measured at C={c} {h}×{w}: {pair} {us:.0f} µs, inductor {inductor} µs; "
                        "the others {others}"),
                       "在 C={c} {h}×{w} 实测每个块的 GPU 时间：{pair} {us:.0f} µs，inductor {inductor} µs；其余 {others}"),
    "measured.mlp": (("measured at C={c} {h}×{w} in bursts that include each launch's host cost: {times}; "
                      "chosen with each GEMM's GPU time too (convnext.MLP_MEASURED)"),
                     "在 C={c} {h}×{w} 以连续调用实测（含每次启动的主机开销）：{times}；选择时也考虑了各 GEMM 的 GPU 时间（convnext.MLP_MEASURED）"),
    "why.dtype": ("dtype {dtype}", "数据类型 {dtype}"),
    "why.policy": ("conv.POLICY: depthwise_triton off", "conv.POLICY：depthwise_triton 已关闭"),
    "why.channels": ("{channels} channels > {max}", "{channels} 个通道 > {max}"),
    "why.layout": ("the input is not channels_last", "输入不是 channels_last"),
    "fused_kernel": ("the ConvNeXt block", " ConvNeXt 块"),
    "generic.permute": ("{first} → {last} is not one permute{dims}", "{first} → {last} 不是一次 permute{dims}"),
    "generic.forward": ("{op} is not a forward convolution", "{op} 不是前向卷积"),
    "generic.depthwise": ("the convolution is not a 2-D depthwise convolution with integer geometry",
                          "该卷积不是几何参数为整数的二维深度可分离卷积"),
    "refuse.channels": ("the LayerNorm does not normalise over the channels alone", "LayerNorm 不是只在通道上归一化"),
    "generic.mlp": ("the MLP is not linear → act → linear reading the LayerNorm",
                    "MLP 不是读取 LayerNorm 的 linear → act → linear"),
    "generic.act": ("activation {act} has no linear epilogue", "激活函数 {act} 没有线性层尾处理"),
    "refuse.residual": ("the residual add does not add the block's input", "残差相加加的不是这个块的输入"),
    "what.w2": ("second linear weight", "第二个线性层的权重"),
    "what.b2": ("second linear bias", "第二个线性层的偏置"),
    "what.scale": ("layer scale", "layer scale"),
    "refuse.scale": ("the scale has {n} elements, not one per channel ({channels})",
                     "缩放因子有 {n} 个元素，不是每个通道一个（{channels}）"),
    "refuse.not_depthwise": ("the convolution before the LayerNorm is not depthwise", "LayerNorm 前面的卷积不是深度可分离卷积"),
    "refuse.last_dim": ("LayerNorm normalizes over more than the last dimension", "LayerNorm 归一化的不只是最后一维"),
    "refuse.constant": ("the multiply is not by a constant (a layer scale)", "乘的不是常量（不是 layer scale）"),
    "refuse.block_input": ("the add does not add the block's input (not a residual)", "相加的不是这个块的输入（不是残差）"),
})


SUPPORTED_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
#: A LayerNorm epilogue holds every channel of its pixels in one program: up to this many.
MAX_CHANNELS = 2048

#: The fused block against the unfused one in float64 from the same inputs upcast, for
#: unit-scale data: the LayerNorm output is rounded once (u), each GEMM accumulates in fp32
#: and rounds its output (u relative to the row's scale), GELU rounds once more, the folded
#: weights γ·W₂ are rounded once (u per weight) and the residual sum once: ~8u of the output's
#: scale for 16-bit dtypes (the same error model as a GEMM with an epilogue, ``EPILOGUE_TOLERANCES``),
#: 2e-5 for fp32 (sums over 4C terms).
TOLERANCES = {
    torch.float32: dict(rtol=2e-5, atol=2e-5),
    torch.float16: dict(rtol=4e-3, atol=4e-3),
    torch.bfloat16: dict(rtol=3.2e-2, atol=3.2e-2),
}

CAVEAT = WORDS("caveat")
#: The accumulating MLP's fold (fc2's bias carried through its GEMM by one padded hidden column), taught where the
#: block's pattern is shown.
CAVEAT_ACCUMULATE = WORDS("accumulate.explanation")
#: Not every fusion pays, and this one did not where it was measured: said where the user chooses.
CAVEAT_MEASURED = WORDS("caveat_measured")


# ====================================================================== the arithmetic

def fold_layer_scale(weight: torch.Tensor, bias: torch.Tensor | None, gamma: torch.Tensor
                     ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``(γ·W, γ·b)``: a linear ``(C_out, C_in)`` followed by a per-output-channel scale ``γ`` as one linear.

    ``gamma`` has C_out elements (any shape, e.g. ConvNeXt's ``(C, 1, 1)``). Computed in
    float64, returned in the weight's dtype and device; the inputs are not modified.
    """
    if gamma.numel() != weight.shape[0]:
        raise ValueError(f"layer scale has {gamma.numel()} elements, the linear has {weight.shape[0]} outputs")
    g = gamma.detach().to(torch.float64).reshape(-1, 1)                   # (C_out, 1)
    w = (weight.detach().to(torch.float64) * g).to(weight.dtype)          # (C_out, C_in)
    b = None if bias is None else (bias.detach().to(torch.float64) * g[:, 0]).to(bias.dtype)
    return w, b


def convnext_block_reference(x, dw_weight, dw_bias, ln_weight, ln_bias, eps, w1, b1, w2, b2, gamma=None,
                             act: str = "gelu", stride=1, padding=3, dilation=1) -> torch.Tensor:
    """Unfused, as torchvision's ``CNBlock`` runs it: dwconv, permute, LayerNorm, linear, act, linear,
    permute, ``γ ·``, ``+ x``. Any float dtype (float64 for test references)."""
    c = x.shape[1]
    y = conv_nd(x, dw_weight, dw_bias, stride, padding, dilation, c).permute(0, 2, 3, 1)   # (N, H, W, C)
    y = F.layer_norm(y, (c,), ln_weight, ln_bias, eps)
    y = linear_act_reference(y, w1, b1, act)                                                   # (N, H, W, 4C)
    y = F.linear(y, w2, b2).permute(0, 3, 1, 2)                                                # (N, C, H, W)
    if gamma is not None:
        y = gamma * y
    return y + x


# ====================================================================== selection

#: The depthwise 7×7 + bias + LayerNorm step, measured per shape (fp16, batch 32, channels_last, H200; medians of
#: bursts of 10 calls, ``benchmarks/results/bench_convnext_perstage_h200.json``): ``(C, H, W) -> (impl, µs of our
#: one kernel, µs of cuDNN's conv + the one-pass LayerNorm)``; the faster one runs. ConvNeXt-Small has the same
#: four stage shapes (more blocks in the third). Shapes not in it take ``DWLN_DEFAULT``.
DWLN_MEASURED: dict[tuple[int, int, int], tuple[str, float, float]] = {
    (96, 56, 56): ("cudnn_ln", 139.9, 83.9),
    (192, 28, 28): ("cudnn_ln", 70.9, 55.3),
    (384, 14, 14): ("cudnn_ln", 49.3, 39.4),
    (768, 7, 7): ("triton", 44.1, 61.9),
}
#: Where a shape was not measured: cuDNN's depthwise conv (without its bias) and the one-pass LayerNorm that
#: adds it, inductor's split (it won at three of ConvNeXt-Tiny's four stages, above).
DWLN_DEFAULT = "cudnn_ln"
DWLN_IMPLS = ("triton", "cudnn_ln")

#: The MLP (fc1, GELU, fc2 with γ folded, + x) per shape: ``(C, H, W) -> (impl, {impl: µs})``, the medians of the
#: whole MLP in the same run as ``DWLN_MEASURED`` (bursts: they include the host's cost of each launch, four for
#: ``cublas``, three for ``triton_fc1``, two for ``triton_gemm``). ``cublas``: cuBLAS + the GELU pass, cuBLAS + the
#: residual pass; ``triton_fc1``: fc1 as our Triton GEMM with the exact GELU in its epilogue, then cuBLAS + the
#: residual pass; ``triton_gemm``: both as Triton GEMMs with their epilogues; ``gelu_prologue``: cuBLAS's fc1,
#: then ONE Triton GEMM applying the GELU to its input as it loads it (at its best swept tile it only tied
#: cuBLAS at the first stage and lost elsewhere: kept as a switch, not chosen).
#: The choice weighs the GPU time too: each GEMM alone, GPU-bound (``bench_convnext_kernels_split_h200.json``),
#: our fc1 ties cuBLAS + GELU at the 2nd and 4th stages (53 against 52 µs, 29 against 29) and loses at the 1st and
#: 3rd (95/90, 37/32), and our fc2 + residual loses to cuBLAS + the pass at every stage (34/27 at the 2nd), and
#: the model with both Triton GEMMs took 0.35 ms more GPU time (3.42 against 3.07 ms). So ``triton_fc1`` where it
#: ties on the GPU and saves a launch, cuBLAS elsewhere, although ``triton_gemm``'s fewer launches measured faster
#: in these host-inclusive bursts at the 2nd to 4th stages.
MLP_MEASURED: dict[tuple[int, int, int], tuple[str, dict[str, float]]] = {
    (96, 56, 56): ("cublas", {"cublas": 138.5, "triton_fc1": 143.0, "triton_gemm": 148.0, "gelu_prologue": 138.7}),
    (192, 28, 28): ("triton_fc1", {"cublas": 116.1, "triton_fc1": 86.9, "triton_gemm": 89.6, "gelu_prologue": 102.6}),
    (384, 14, 14): ("cublas", {"cublas": 86.2, "triton_fc1": 65.5, "triton_gemm": 69.5, "gelu_prologue": 89.1}),
    (768, 7, 7): ("triton_fc1", {"cublas": 129.2, "triton_fc1": 99.0, "triton_gemm": 76.3, "gelu_prologue": 139.3}),
}
#: Where a shape was not measured: cuBLAS and one pass each (the lower GPU time wherever each kernel was timed).
MLP_DEFAULT = "cublas"
#: ``cublas_accumulate``: cuBLAS's fc1 with one padded column, the activation in place, cuBLAS's fc2 accumulating
#: onto the block input in place (``mlp_accumulate_``: no residual pass); only in a lowered graph where the block
#: input is dead after the block (``_owned_input``), else ``cublas``.
#: ``triton_fc1_accumulate``: the same with fc1 as our Triton GEMM, the activation in its epilogue.
MLP_IMPLS = ("cublas", "triton_fc1", "triton_gemm", "gelu_prologue", "cublas_accumulate", "triton_fc1_accumulate")
#: The MLPs whose fc1 a lowering makes a linear + activation call of (``fused_linear_act``): cuBLAS's, and the
#: accumulating one where the block input is not provably dead (``_owned_input``, a fact of the lean graph). The
#: rewrite records that call's choice as the block's part ``HIDDEN_LINEAR`` (``edit.Edit.parts``).
HIDDEN_LINEAR_MLPS = ("cublas", "cublas_accumulate")
HIDDEN_LINEAR = "hidden_linear"
ACCUMULATE_IMPLS = ("cublas_accumulate", "triton_fc1_accumulate")
#: The GELU-prologue GEMM's tile per shape (the sweep's fastest in the same run), ``(BLOCK_M, BLOCK_N, BLOCK_K,
#: num_warps, num_stages)``; elsewhere ``gemm_prologue.prologue_config``.
PROLOGUE_TILES: dict[tuple[int, int, int], tuple[int, int, int, int, int]] = {
    (96, 56, 56): (128, 128, 32, 4, 5), (192, 28, 28): (128, 256, 64, 8, 3), (384, 14, 14): (128, 256, 64, 8, 3),
    (768, 7, 7): (64, 256, 64, 8, 3),
}
#: The LayerNorm2d chains per shape, ``(C, H, W)`` of the normalised map ``-> (impl, µs ours, µs torch)``: the
#: profiler's GPU busy of the whole chain (the LayerNorm with the downsampling's conv 2×2/2, or with the head's
#: linear) in one run (``bench_convnext_blocks_h200.json``, ``--only ln2d_gpu``): ``triton`` (our one pass, the
#: affine folded into the next layer) or ``torch`` (permute + ``layer_norm``). Ours had the lower GPU time at all
#: of them (inductor's, same run: 41.2, 22.1, 22.6, 4.6 µs). Host-inclusive bursts (``bench_convnext_perstage_h200``)
#: had ranked torch's first at the two small ones, where its C++ launch is cheaper than our Python-side one: the
#: target here is GPU work. Unmeasured shapes: ``triton``.
LN2D_MEASURED: dict[tuple[int, int, int], tuple[str, float, float]] = {
    (96, 56, 56): ("triton", 44.5, 151.9),
    (192, 28, 28): ("triton", 26.6, 56.2),
    (384, 14, 14): ("triton", 26.4, 34.2),
    (768, 1, 1): ("triton", 4.7, 6.1),
}
#: The stem (conv 4×4/4 → LayerNorm2d over 96 channels at 56×56): cuDNN's conv without its bias + our pass adding
#: it, against cuDNN's conv with its bias (ATen's extra pass) + layer_norm: GPU busy of the chain, same run
#: (inductor's: 59.6 µs).
STEM_MEASURED = {(96, 56, 56): ("triton", 50.1, 172.6)}


#: The whole block per shape by GPU time (issue 22: the target is the model's GPU busy, which host-inclusive bursts
#: do not rank): ``(C, H, W) -> (first step, MLP, {"<first>+<mlp>": µs}, µs of inductor's block)``, the profiler's
#: GPU busy per block of every pair the lean lowering can build and of inductor (compile default) on the same
#: unfused block (layer scale unfolded), in one run (``benchmarks/results/bench_convnext_blocks_h200.json``: H200,
#: fp16, batch 32, channels_last; ``bench_convnext_kernels.py --only block``). Where a shape is in it, it decides
#: both steps; elsewhere ``DWLN_MEASURED`` and ``MLP_MEASURED``. cuDNN's depthwise conv + our LayerNorm pass won at
#: every stage, the 7×7 one too (61.8 against 72.8 µs: the host-inclusive bursts had ranked our one kernel first
#: there). The MLPs within 1 µs of each other are ties on the GPU; the one with fewer launches is taken (the
#: accumulating MLP at the 2nd and 4th stages: no residual pass; our fc1 with its GELU epilogue at the 1st). The
#: accumulating MLP loses where the padded column costs more than the pass saves (1st stage: 4C = 384 → 392
#: columns, 266 against 228 µs; 3rd: 81 against 77).
BLOCK_MEASURED: dict[tuple[int, int, int], tuple[str, str, dict[str, float], float | None]] = {
    (96, 56, 56): ("cudnn_ln", "triton_fc1",
                   {"cudnn_ln+triton_fc1": 226.4, "cudnn_ln+cublas": 227.6, "cudnn_ln+cublas_accumulate": 266.4,
                    "triton+triton_fc1": 280.2, "triton+cublas": 281.7, "cudnn_ln+triton_fc1_accumulate": 286.1,
                    "triton+cublas_accumulate": 320.8, "triton+triton_fc1_accumulate": 341.4}, 304.5),
    (192, 28, 28): ("cudnn_ln", "cublas_accumulate",
                    {"cudnn_ln+cublas_accumulate": 122.4, "cudnn_ln+cublas": 123.0, "cudnn_ln+triton_fc1": 128.9,
                     "triton+cublas": 142.4, "triton+cublas_accumulate": 142.7, "triton+triton_fc1": 148.3,
                     "cudnn_ln+triton_fc1_accumulate": 150.4, "triton+triton_fc1_accumulate": 170.5}, 125.5),
    (384, 14, 14): ("cudnn_ln", "cublas",
                    {"cudnn_ln+cublas": 77.1, "cudnn_ln+cublas_accumulate": 81.0, "cudnn_ln+triton_fc1": 85.8,
                     "cudnn_ln+triton_fc1_accumulate": 92.1, "triton+cublas_accumulate": 99.2, "triton+cublas": 99.4,
                     "triton+triton_fc1": 106.0, "triton+triton_fc1_accumulate": 107.0}, 83.8),
    (768, 7, 7): ("cudnn_ln", "cublas_accumulate",
                  {"cudnn_ln+cublas_accumulate": 61.5, "cudnn_ln+cublas": 61.8, "cudnn_ln+triton_fc1": 70.2,
                   "cudnn_ln+triton_fc1_accumulate": 70.5, "triton+cublas_accumulate": 72.4, "triton+cublas": 72.8,
                   "triton+triton_fc1": 80.3, "triton+triton_fc1_accumulate": 81.0}, 61.2),
}


def _shape_key(channels: int | None, hw: tuple[int, int] | None) -> tuple[int, int, int] | None:
    return None if channels is None or hw is None else (int(channels), int(hw[0]), int(hw[1]))


def dwln_impl(device: torch.device | str, dtype: torch.dtype, channels: int | None = None,
              hw: tuple[int, int] | None = None) -> str:
    """How the depthwise conv + bias + LayerNorm step runs: ``triton`` (our one kernel), ``cudnn_ln`` (cuDNN's
    conv without its bias, then ``channels_layer_norm`` adding it in its one pass) or ``reference`` (cuDNN's
    conv, ``layer_norm``: where Triton does not run, or ``policy.POLICY.depthwise_triton`` is off).
    ``policy.POLICY.convnext_dwln`` forces one; "auto" reads ``BLOCK_MEASURED``, then ``DWLN_MEASURED`` for the
    shape ``(C, H, W)`` (the block's input), else ``DWLN_DEFAULT``."""
    if not (triton_runs_on(device) and dtype in SUPPORTED_DTYPES and policy.POLICY.depthwise_triton):
        return "reference"
    forced = policy.POLICY.convnext_dwln
    key = _shape_key(channels, hw)
    if forced in DWLN_IMPLS:
        impl = forced
    elif key in BLOCK_MEASURED:
        impl = BLOCK_MEASURED[key][0]
    else:
        impl = DWLN_MEASURED.get(key, (DWLN_DEFAULT,))[0]
    if impl == "triton" and channels is not None and channels > MAX_CHANNELS:
        return "cudnn_ln"
    return impl


def mlp_impl(device: torch.device | str, dtype: torch.dtype, channels: int | None = None,
             hw: tuple[int, int] | None = None, act: str = "gelu") -> str:
    """How the MLP runs: one of ``MLP_IMPLS``, from ``BLOCK_MEASURED`` for the shape, else ``MLP_MEASURED``
    (an accumulating one only for an activation that maps the carrier 8 to itself, ``ACCUMULATE_ACTS``);
    ``cublas`` where Triton does not run (then the residual pass is torch's ``add_``). ``policy.POLICY.mlp_gemm_triton`` forces
    ``triton_gemm`` (and ``gemm_triton`` off rules out both Triton GEMMs), ``convnext_mlp`` forces any."""
    if not (triton_runs_on(device) and dtype in SUPPORTED_DTYPES and policy.POLICY.gemm_triton):
        return "cublas"
    if policy.POLICY.mlp_gemm_triton:
        return "triton_gemm"
    forced = policy.POLICY.convnext_mlp
    key = _shape_key(channels, hw)
    if forced in MLP_IMPLS:
        impl = forced
    elif key in BLOCK_MEASURED:
        impl = BLOCK_MEASURED[key][1]
    else:
        impl = MLP_MEASURED.get(key, (MLP_DEFAULT,))[0]
    if impl in ACCUMULATE_IMPLS and act not in ACCUMULATE_ACTS:          # the carrier column needs act(8) = 8
        impl = "cublas" if impl == "cublas_accumulate" else "triton_fc1"
    return impl


def uses_gemm(device: torch.device | str, dtype: torch.dtype, channels: int | None = None,
              hw: tuple[int, int] | None = None) -> bool:
    """Whether the block's two linears run as Triton GEMMs with their epilogues (``mlp_impl`` "triton_gemm")."""
    return mlp_impl(device, dtype, channels, hw) == "triton_gemm"


#: The ConvNeXt switches of ``kernels.policy`` at their defaults: a lowering then runs what the rewrite recorded.
_POLICY_DEFAULTS = dict(depthwise_triton=True, gemm_triton=True, mlp_gemm_triton=False, convnext_dwln="auto",
                        convnext_mlp="auto")


def block_steps(recorded: Choice | None, device: torch.device | str, dtype: torch.dtype, channels: int | None,
                hw: tuple[int, int] | None, act: str = "gelu") -> tuple[str, str]:
    """``(first step, MLP)`` of a block: the choice the rewrite recorded on the fused call (``edit.planned``:
    ``select_convnext_block``'s ``impl`` is ``"<dwln_impl>+<mlp_impl>"``), unless a ConvNeXt switch of
    ``kernels.policy`` is forced away from its default (then the switch wins: ``dwln_impl``, ``mlp_impl``
    decide again) or nothing was recorded for this device and dtype."""
    forced = any(getattr(policy.POLICY, k) != v for k, v in _POLICY_DEFAULTS.items())
    if recorded is not None and not forced and recorded.impl.count("+") == 1:
        first, mlp = recorded.impl.split("+")
        if first in DWLN_IMPLS + ("reference",) and mlp in MLP_IMPLS:
            return first, mlp
    return dwln_impl(device, dtype, channels, hw), mlp_impl(device, dtype, channels, hw, act)


def _block_note(key: tuple[int, int, int], pair: str) -> str:
    """"GPU time per block measured at C×H×W: this pair 80 µs, inductor 90 µs, next ..." for a label."""
    _, _, times, inductor = BLOCK_MEASURED[key]
    others = ", ".join(f"{k} {v:.0f} µs" for k, v in sorted(times.items(), key=lambda kv: kv[1]) if k != pair)
    return WORDS("measured.block", c=key[0], h=key[1], w=key[2], pair=pair, us=times.get(pair, float("nan")),
                 inductor="-" if inductor is None else f"{inductor:.0f}", others=others)


def _measured_note(table: dict, key, impl: str) -> str:
    """"measured at C×H×W: ours 137 µs, cuDNN + LN 95 µs"-style note for a label, or "" (not measured)."""
    row = table.get(key)
    if row is None:
        return WORDS("measured.none")
    if table is DWLN_MEASURED:
        return WORDS("measured.dwln", c=key[0], h=key[1], w=key[2], ours=row[1], split=row[2])
    times = ", ".join(f"{k} {v:.0f} µs" for k, v in sorted(row[1].items(), key=lambda kv: kv[1]))
    return WORDS("measured.mlp", c=key[0], h=key[1], w=key[2], times=times)


@selection
def select_convnext_block(device: torch.device | str, dtype: torch.dtype, channels: int | None = None,
                          act: str = "gelu", layout: str | None = None, hw: tuple[int, int] | None = None
                          ) -> Choice:
    """The one decision of how a ConvNeXt block runs; ``Choice.impl`` names its first step
    (``dwln_impl``): ``triton`` (the depthwise conv, its bias and the LayerNorm in one Triton kernel),
    ``cudnn_ln`` (cuDNN's conv, then one LayerNorm pass that adds the conv's bias) or ``reference`` (cuDNN's
    conv with its bias and ``layer_norm``). Then the MLP as ``mlp_impl`` decides. ``hw``: the block input's
    (H, W), which with ``channels`` keys the measured tables; ``layout`` (the input's; None: not known yet, as
    in a captured graph): both Triton steps read channels_last rows, anything else takes the reference
    steps at run time. The label names every kernel and the measurement behind the choice.
    """
    device = torch.device(device)
    triton = triton_runs_on(device) and dtype in SUPPORTED_DTYPES
    key = _shape_key(channels, hw)
    mlp_choice = mlp_impl(device, dtype, channels, hw, act)
    if mlp_choice == "triton_gemm":
        mlp, fused = WORDS("mlp.gemm", act=act), True
    elif mlp_choice == "triton_fc1":
        mlp, fused = WORDS("mlp.fc1", act=act), True
    elif mlp_choice == "gelu_prologue":
        mlp, fused = WORDS("mlp.prologue", act=act), True
    elif mlp_choice == "cublas_accumulate":
        mlp, fused = WORDS("mlp.accumulate", act=act), True
    elif mlp_choice == "triton_fc1_accumulate":
        mlp, fused = WORDS("mlp.fc1_accumulate", act=act), True
    else:
        lin = select_linear_act(device, dtype, act, 2, 2)
        residual = WORDS("residual.triton" if triton else "residual.torch")
        mlp = WORDS("mlp.fused", act=act, impl=lin.impl, residual=residual) if lin.fused else \
            WORDS("mlp.separate", act=act, residual=residual)
        fused = lin.fused
    impl = dwln_impl(device, dtype, channels, hw)
    if impl != "reference" and layout in (None, "nhwc"):
        tail = "" if layout == "nhwc" else "_cl"
        label = WORDS(("label.triton" if impl == "triton" else "label.cudnn_ln") + tail, mlp=mlp)
        notes = []
        auto = policy.POLICY.convnext_dwln == "auto" and policy.POLICY.convnext_mlp == "auto" and \
            not policy.POLICY.mlp_gemm_triton
        if auto and key in BLOCK_MEASURED:
            notes.append(_block_note(key, f"{impl}+{mlp_choice}"))
        else:
            if policy.POLICY.convnext_dwln == "auto":
                notes.append(_measured_note(DWLN_MEASURED, key, impl))
            if triton and policy.POLICY.convnext_mlp == "auto" and not policy.POLICY.mlp_gemm_triton:
                notes.append(_measured_note(MLP_MEASURED, key, mlp_choice))
        notes = list(dict.fromkeys(notes))                 # "not measured" once
        if notes:
            note = notes[0] if len(notes) == 1 else WORDS("notes.two", first=notes[0], second=notes[1])
            label = WORDS(("label.triton" if impl == "triton" else "label.cudnn_ln") + tail + ".noted", mlp=mlp,
                          note=note)
        return Choice(f"{impl}+{mlp_choice}", where(label, device), True)
    if not triton:
        why = BASE_WORDS("no_triton", device=device.type) if not triton_runs_on(device) else \
            WORDS("why.dtype", dtype=dtype)
    elif not policy.POLICY.depthwise_triton:
        why = WORDS("why.policy")
    else:
        why = WORDS("why.layout")
    return Choice(f"reference+{mlp_choice}", where(WORDS("label.reference", mlp=mlp, why=why), device), fused)


# ====================================================================== the block

def _geometry(value):
    """A conv's stride, padding or dilation as a hashable key part (an int, or a tuple of a list's ints)."""
    return value if isinstance(value, int) else tuple(value)


def _aligned(*tensors: torch.Tensor | None) -> tuple:
    """Which pointers are 16-byte aligned (Triton specialises a launch on it), None for a missing operand."""
    return tuple(None if t is None else t.data_ptr() & 15 == 0 for t in tensors)


def depthwise_layer_norm(x: torch.Tensor, weight: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None,
                         stride, padding, dilation, ln_weight, ln_bias, eps: float) -> torch.Tensor:
    """``layer_norm(dwconv(x) + b)`` over the channels, as ``(N, H', W', C)``: one Triton kernel where
    it takes the operands (``depthwise_applies``: a channels_last input on a device Triton runs
    on), reading the weight ``packed`` (``pack_depthwise_weight``; ``weight`` itself works too,
    more slowly); otherwise cuDNN's conv, a permute and ``layer_norm``.

    The checks, the tile and every integer argument are worked out once per call signature (``PLANS``);
    a repeated call is the key, one allocation and the launch."""
    key = ("convnext-dwln", x.shape, x.stride(), x.dtype, x.device, weight.shape, packed.stride(), packed.dtype,
           None if bias is None else bias.dtype, None if ln_weight is None else ln_weight.dtype,
           None if ln_bias is None else ln_bias.dtype, _geometry(stride), _geometry(padding), _geometry(dilation),
           eps, _aligned(x, packed, bias, ln_weight, ln_bias), policy.POLICY.depthwise_triton,
           x.is_cuda or interpreting())
    plan = cached_plan(key)
    if plan is None:
        c = x.shape[1]
        if policy.POLICY.depthwise_triton and c <= MAX_CHANNELS and depthwise_applies(x, weight, weight.shape[0]):
            dw = plan_depthwise(x, packed, bias, None, stride, padding, dilation, "none", (ln_weight, ln_bias, eps),
                                None)
            out_strides = torch.empty(dw.out_shape, device="meta", memory_format=torch.channels_last).stride()
            plan = remember(PLANS, key, LaunchPlan(dw.kernel, dw.grid, (*dw.ints, *out_strides, *dw.tail),
                                                   dw.constexprs, dw.num_warps, out_shape=dw.out_shape))
        else:
            plan = fallback_plan(key)
    if plan.out_shape == "fallback":
        c = x.shape[1]
        y = torch.conv2d(x, weight, bias, stride, padding, dilation, c).permute(0, 2, 3, 1)   # (N, H', W', C)
        return F.layer_norm(y, (c,), ln_weight, ln_bias, eps)
    out = torch.empty(plan.out_shape, dtype=x.dtype, device=x.device, memory_format=torch.channels_last)
    if plan.kernel is not None:
        launch(plan.kernel, plan.grid, (x, packed, x if bias is None else bias, x, out,
                                        x if ln_weight is None else ln_weight, x if ln_bias is None else ln_bias,
                                        *plan.ints), plan.constexprs, key=plan, num_warps=plan.num_warps)
    return out.permute(0, 2, 3, 1)                                                # (N, H', W', C) contiguous


def conv_then_layer_norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, stride, padding,
                         dilation, ln_weight, ln_bias, eps: float) -> torch.Tensor:
    """``layer_norm(dwconv(x) + b)`` over the channels as ``(N, H', W', C)``, inductor's way: cuDNN's conv
    WITHOUT its bias (ATen would add it in a pass of its own), then ``channels_layer_norm``, which adds the bias
    in its one pass (the reference where the conv's output is not channels_last)."""
    y = torch.conv2d(x, weight, None, stride, padding, dilation, x.shape[1])            # (N, C, H', W')
    return channels_layer_norm(y, ln_weight, ln_bias, eps, bias)


def _dwln(impl: str, x, weight, bias, stride, padding, dilation, ln_weight, ln_bias, eps) -> torch.Tensor:
    """The block's first step as ``dwln_impl`` chose (``impl``), as ``(N, H', W', C)``."""
    if impl == "triton":
        return depthwise_layer_norm(x, weight, weight, bias, stride, padding, dilation, ln_weight, ln_bias, eps)
    if impl == "cudnn_ln":
        return conv_then_layer_norm(x, weight, bias, stride, padding, dilation, ln_weight, ln_bias, eps)
    c = x.shape[1]
    y = torch.conv2d(x, weight, bias, stride, padding, dilation, c).permute(0, 2, 3, 1)
    return F.layer_norm(y, (c,), ln_weight, ln_bias, eps)


def residual_add_(y: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """``y += x`` in place: one vectorised Triton pass where Triton runs (any two dense layouts), else ``add_``."""
    return bias_act_(y, None, x, "none")


def mlp_hidden(t: torch.Tensor, w1: torch.Tensor, b1: torch.Tensor | None, act: str, gemm: bool) -> torch.Tensor:
    """``act(t @ w1ᵀ + b1)`` for the contiguous ``t`` ``(N, H, W, C)``, as ``(N·H·W, 4C)``: one Triton GEMM with
    the bias and the activation in its epilogue (``gemm``, where ``gemm_applies``), else as the linear + activation
    call decides (``kernels.linear_act``). Planned once per call signature."""
    c = t.shape[-1]
    key = ("convnext-fc1", t.shape, t.stride(), t.dtype, t.device, w1.shape, w1.stride(), w1.dtype,
           None if b1 is None else b1.dtype, act, gemm, t.is_cuda or interpreting())
    plan = cached_plan(key)
    if plan is None:
        rows = t.reshape(-1, c)
        if gemm and t.is_contiguous() and gemm_applies(rows, w1) and rows.shape[0] > 0:
            plan = gemm_plan(key, t, w1, b1, None, act, rows.shape[0], c, (c, 1), None, (w1.shape[0], 1))
        else:
            plan = fallback_plan(key)
    if plan.out_shape == "fallback":
        return linear_act(t.reshape(-1, c), w1, b1, act)
    out = torch.empty((t.numel() // c, w1.shape[0]), dtype=t.dtype, device=t.device)   # (M, 4C)
    return gemm_launch(plan, key, t, w1, b1, None, out)


def _plan_projection(h, w2, b2, x, gemm: bool, key: tuple) -> LaunchPlan:
    """How ``project_residual`` runs for one call signature: ``out_shape`` names the path, the plan holds the
    launch (the GEMM's, or the residual pass's after cuBLAS)."""
    n, c, hh, ww = x.shape
    if gemm and gemm_applies(h, w2) and h.shape[0] == n * hh * ww > 0:
        z = x if layout_of(x) == "nhwc" else None      # the residual read in the epilogue, as rows of x
        plan = gemm_plan(key, h, w2, b2, z, "none", h.shape[0], h.shape[1], h.stride(),
                         None if z is None else (c, 1), (c, 1))
        plan.out_shape = "residual in the epilogue" if z is not None else "residual pass"
        return plan
    y = torch.empty((n, c, hh, ww), dtype=x.dtype, device=x.device, memory_format=torch.channels_last)
    plan = plan_bias_act(y, None, x, "none") if x.numel() else LaunchPlan()
    if plan.kernel is None or plan.z_layout is not None:
        return LaunchPlan(out_shape="fallback")
    plan.out_shape = "cublas + residual pass"
    return plan


def project_residual(h: torch.Tensor, w2: torch.Tensor, b2: torch.Tensor | None, x: torch.Tensor,
                     gemm: bool) -> torch.Tensor:
    """``x + (h @ w2ᵀ + b2)`` as ``(N, C, H, W)`` (channels_last memory): one Triton GEMM that adds the bias and
    the residual in its epilogue where ``x`` is channels_last (its pixels are then rows of stride C) and ``gemm``;
    else cuBLAS's linear and the residual as one Triton pass (``residual_add_``'s kernel, launched here from the
    plan). Planned once per call signature: a repeated call is the key, the linear and one launch."""
    key = ("convnext-fc2", h.shape, h.stride(), x.shape, x.stride(), x.dtype, x.device, w2.shape, w2.stride(),
           w2.dtype, None if b2 is None else b2.dtype, gemm, _aligned(h, x, w2, b2), x.is_cuda or interpreting())
    plan = cached_plan(key)
    if plan is None:
        plan = remember(PLANS, key, _plan_projection(h, w2, b2, x, gemm, key))
    n, c, hh, ww = x.shape
    path = plan.out_shape
    if path == "cublas + residual pass":
        y = F.linear(h, w2, b2).view(n, hh, ww, c).permute(0, 3, 1, 2)      # (N, C, H, W) channels_last
        launch(plan.kernel, plan.grid, (y, y, x, *plan.ints), plan.constexprs, key=plan, num_warps=plan.num_warps)
        return y
    if path == "fallback":
        y = F.linear(h, w2, b2).view(n, hh, ww, c).permute(0, 3, 1, 2)      # (N, C, H, W)
        return residual_add_(y, x)
    out = torch.empty((n, c, hh, ww), dtype=x.dtype, device=x.device, memory_format=torch.channels_last)
    if path == "residual in the epilogue":
        return gemm_launch(plan, key, h, w2, b2, x, out)
    return residual_add_(gemm_launch(plan, key, h, w2, b2, None, out), x)


#: The accumulating MLP (``mlp_accumulate_``): fc1 gets ``K_PAD`` extra output rows, all zero but the first, whose
#: bias is ``BIAS_CARRIER``; the activation maps it to itself exactly (GELU(8) = 8·Φ(8), Φ(8) = 1 − 6e-16 rounds to
#: 1 in every float dtype; ReLU(8) = 8), so fc2's bias rides in the GEMM as the column ``b₂ / 8`` of its weight
#: (a power of two: exact). ``K_PAD`` = 8 keeps fp16/bf16 rows 16-byte aligned.
K_PAD = 8
BIAS_CARRIER = 8.0
ACCUMULATE_ACTS = ("gelu", "relu")


def accumulate_weights(w1: torch.Tensor, b1: torch.Tensor | None, w2: torch.Tensor, b2: torch.Tensor | None,
                       act: str = "gelu") -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(W₁', b₁', W₂')`` for ``mlp_accumulate_``: ``W₁' = [W₁; 0]`` ``(4C + K_PAD, C)``, ``b₁' = [b₁; 8, 0…]``,
    ``W₂' = [W₂ | b₂/8 | 0…]`` ``(C, 4C + K_PAD)``, so that ``act(t W₁'ᵀ + b₁') W₂'ᵀ = act(t W₁ᵀ + b₁) W₂ᵀ + b₂``
    exactly (the extra hidden column is exactly 8, the others exactly 0). In float64, returned in the weights'
    dtypes; the inputs are not modified."""
    if act not in ACCUMULATE_ACTS:
        raise ValueError(f"activation {act} does not map {BIAS_CARRIER} to itself exactly")
    hidden, c = w1.shape
    w1a = torch.zeros((hidden + K_PAD, c), dtype=torch.float64, device=w1.device)
    w1a[:hidden] = w1.detach().to(torch.float64)
    b1a = torch.zeros(hidden + K_PAD, dtype=torch.float64, device=w1.device)
    if b1 is not None:
        b1a[:hidden] = b1.detach().to(torch.float64)
    b1a[hidden] = BIAS_CARRIER
    w2a = torch.zeros((w2.shape[0], hidden + K_PAD), dtype=torch.float64, device=w2.device)
    w2a[:, :hidden] = w2.detach().to(torch.float64)
    if b2 is not None:
        w2a[:, hidden] = b2.detach().to(torch.float64) / BIAS_CARRIER
    return w1a.to(w1.dtype), b1a.to(w1.dtype if b1 is None else b1.dtype), w2a.to(w2.dtype)


def mlp_accumulate_(t: torch.Tensor, w1a: torch.Tensor, b1a: torch.Tensor, w2a: torch.Tensor, x: torch.Tensor,
                    act: str = "gelu", gemm: bool = False) -> torch.Tensor:
    """``x += act(t W₁ᵀ + b₁) W₂ᵀ + b₂`` IN PLACE on the block input ``x`` ``(N, C, H, W)``, returned, with the
    weights of ``accumulate_weights``: cuBLAS's fc1 (bias in its epilogue), the activation in place, and ONE cuBLAS
    GEMM accumulating onto x's rows (``addmm_``, β = 1: x is read in the GEMM's epilogue), fc2's bias carried by
    the extra column: three kernels where cuBLAS + the residual pass take four, and the sum is never written
    twice. ``t``: ``(N, H, W, C)`` contiguous. Only where x is dead after the block (the lowering proves it:
    ``_owned_input``); an x that is not channels_last is updated through a copy of its rows. ``gemm``: fc1 as our
    Triton GEMM with the bias and the activation in its epilogue (``mlp_hidden``: no activation pass)."""
    n, c, hh, ww = x.shape
    if gemm:
        h = mlp_hidden(t, w1a, b1a, act, True)                                         # (N·H·W, 4C + K_PAD)
    else:
        h = apply_activation_(F.linear(t.reshape(-1, c), w1a, b1a), act)
    rows = x.permute(0, 2, 3, 1)                                                       # (N, H, W, C)
    if rows.is_contiguous():
        rows.view(-1, c).addmm_(h, w2a.t())
        return x
    x.copy_(torch.addmm(rows.reshape(-1, c), h, w2a.t()).view(n, hh, ww, c).permute(0, 3, 1, 2))
    return x


def project_gelu_residual(hp: torch.Tensor, w2: torch.Tensor, b2: torch.Tensor | None, x: torch.Tensor,
                          act: str = "gelu") -> torch.Tensor:
    """``x + (act(hp) @ w2ᵀ + b2)`` as ``(N, C, H, W)`` (channels_last memory), ``hp`` being fc1's output before
    its activation ``(N·H·W, 4C)``: ONE Triton GEMM that applies ``act`` to ``hp`` as it loads it and adds the
    bias and the residual (x's pixels, rows of stride C) in its epilogue, where x is channels_last; else the
    activation, the linear and ``residual_add_``. Planned once per call signature."""
    n, c, hh, ww = x.shape
    key = ("convnext-fc2-prologue", hp.shape, hp.stride(), x.shape, x.stride(), x.dtype, x.device, w2.shape,
           w2.stride(), w2.dtype, None if b2 is None else b2.dtype, act, _aligned(hp, x, w2, b2),
           x.is_cuda or interpreting())
    plan = cached_plan(key)
    if plan is None:
        if (layout_of(x) == "nhwc" and hp.shape[0] == n * hh * ww > 0 and hp.dtype == x.dtype
                and gemm_act_prologue_applies(hp, w2)):
            tiles = PROLOGUE_TILES.get((c, hh, ww)) if x.is_cuda else None
            plan = prologue_plan(key, hp, w2, b2, (c, 1), (c, 1), act, tiles)
        else:
            plan = fallback_plan(key)
    if plan.out_shape == "fallback":
        y = F.linear(apply_activation_(hp, act), w2, b2).view(n, hh, ww, c).permute(0, 3, 1, 2)      # (N, C, H, W)
        return residual_add_(y, x)
    out = torch.empty((n, c, hh, ww), dtype=x.dtype, device=x.device, memory_format=torch.channels_last)
    return prologue_launch(plan, key, hp, w2, b2, x, out)


def convnext_block(x, dw_weight, dw_bias, stride, padding, dilation, ln_weight, ln_bias, eps, w1, b1, act,
                   w2, b2) -> torch.Tensor:
    """A ConvNeXt block with its layer scale already folded into ``(w2, b2)`` (``fold_layer_scale``).

    ``x``: ``(N, C, H, W)``; ``dw_weight``: ``(C, 1, k, k)``; ``w1``: ``(4C, C)``; ``w2``:
    ``(C, 4C)``. Returns ``x + block(x)``, ``(N, C, H, W)`` in channels_last memory (as the
    unfused block's output is, whatever the input's layout). Each step as ``dwln_impl`` and
    ``mlp_impl`` choose for x's shape.
    """
    c, hw = x.shape[1], (x.shape[2], x.shape[3])
    t = _dwln(dwln_impl(x.device, x.dtype, c, hw), x, dw_weight, dw_bias, stride, padding, dilation, ln_weight,
              ln_bias, eps)                                                        # (N, H, W, C)
    mlp = mlp_impl(x.device, x.dtype, c, hw, act)
    if mlp in ACCUMULATE_IMPLS:              # in place only where a lowering proved x dead after the block
        mlp = "cublas" if mlp == "cublas_accumulate" else "triton_fc1"
    if mlp == "gelu_prologue":
        return project_gelu_residual(F.linear(t.reshape(-1, c), w1, b1), w2, b2, x, act)
    h = mlp_hidden(t, w1, b1, act, mlp in ("triton_gemm", "triton_fc1"))          # (N·H·W, 4C)
    return project_residual(h, w2, b2, x, mlp == "triton_gemm")                    # (N, C, H, W)


def fused_convnext_block(x, dw_weight, dw_bias, stride, padding, dilation, ln_weight, ln_bias, eps, w1, b1, act,
                         w2, b2):
    """``x + γ·MLP(LN(dwconv(x)))`` with γ folded into ``(w2, b2)``: as ``select_convnext_block`` decides."""
    return convnext_block(x, dw_weight, dw_bias, stride, padding, dilation, ln_weight, ln_bias, eps, w1, b1, act,
                          w2, b2)


# ====================================================================== rewrite

def _permute_between(ctx: RewriteContext, chain, first: torch.fx.Node, last: torch.fx.Node, dims: list[int]) -> None:
    """The chain's only view between ``first`` and ``last`` is ``permute(dims)``."""
    names = list(chain.nodes)
    views = [ctx.by_name[n] for n in names[names.index(first.name) + 1: names.index(last.name)]]
    if len(views) != 1 or aten.aten_name(views[0]) != "permute" or list(views[0].args[1]) != dims:
        raise UseGeneric(WORDS("generic.permute", first=first.name, last=last.name, dims=tuple(dims)))


def rewrite(ctx: RewriteContext, chain, kernel: str) -> edit.Edit:
    """The whole block as one call: layer scale folded into the second linear, the rest as selected."""
    dw, ln_node = ctx.node(chain, "dwconv"), ctx.node(chain, "norm")
    fc1, act_node, fc2 = ctx.node(chain, "fc1"), ctx.node(chain, "act"), ctx.node(chain, "fc2")
    scale, add = ctx.node(chain, "scale"), ctx.node(chain, "residual")
    c = aten.conv_args(dw)
    if c is None or c.transposed:
        raise UseGeneric(WORDS("generic.forward", op=aten.aten_name(dw)))
    x_shape, w_shape = aten.static_shape(c.input), aten.static_shape(c.weight)
    geometry = edit.int_lists(2, c.stride, c.padding, c.dilation)
    if x_shape is None or w_shape is None or geometry is None or not is_depthwise(x_shape[1], w_shape, c.groups):
        raise UseGeneric(WORDS("generic.depthwise"))
    channels = x_shape[1]
    _permute_between(ctx, chain, dw, ln_node, [0, 2, 3, 1])
    _permute_between(ctx, chain, fc2, scale if scale is not None else add, [0, 3, 1, 2])
    ln = aten.layer_norm_args(ln_node)
    if ln is None or list(ln.normalized_shape) != [channels]:
        raise Refuse(WORDS("refuse.channels"))
    lin1, lin2 = aten.linear_args(fc1), aten.linear_args(fc2)
    if lin1 is None or lin2 is None or lin1.input is not ln_node or lin2.input is not act_node:
        raise UseGeneric(WORDS("generic.mlp"))
    act = aten.activation_name(act_node)
    if act not in LINEAR_ACTIVATIONS:
        raise UseGeneric(WORDS("generic.act", act=act))
    members = set(ctx.members(chain))
    edit.check_alpha(add)
    if not edit.through_identity(edit.other_operand(add, members), c.input):
        raise Refuse(WORDS("refuse.residual"))
    w2, b2 = ctx.constant(lin2.weight, WORDS("what.w2")), ctx.constant(lin2.bias, WORDS("what.b2"))
    tensors = {}
    if scale is not None:
        gamma = ctx.constant(edit.other_operand(scale, members), WORDS("what.scale"))
        if gamma.numel() != channels:
            raise Refuse(WORDS("refuse.scale", n=gamma.numel(), channels=channels))
        w2, b2 = fold_layer_scale(w2, b2, gamma)
    key = fc2.name
    tensors[f"{key}_scaled_weight"] = w2
    w2_arg = NewAttr(f"{key}_scaled_weight")
    b2_arg = None
    if b2 is not None:
        tensors[f"{key}_scaled_bias"] = b2
        b2_arg = NewAttr(f"{key}_scaled_bias")
    stride, padding, dilation = geometry
    choice = select_convnext_block(ctx.device, ctx.run_dtype(dw), channels, act, hw=(x_shape[2], x_shape[3]))
    label = choice.label if choice.fused else edit.not_fused_note(ctx.device, choice.label, WORDS("fused_kernel"))
    args = (c.input, c.weight, c.bias, stride, padding, dilation, ln.weight, ln.bias, ln.eps,
            lin1.weight, lin1.bias, act, w2_arg, b2_arg)
    parts = {}
    w1_shape = aten.static_shape(lin1.weight)
    if choice.impl.rpartition("+")[2] in HIDDEN_LINEAR_MLPS and w1_shape is not None and len(w1_shape) == 2:
        # fc1 as the linear + activation call (the lowering makes one): decided once, here, with its (C, 4C) shape
        parts[HIDDEN_LINEAR] = select_linear_act(ctx.device, ctx.run_dtype(fc1), act, w1_shape[1], w1_shape[0])
    return edit.whole_chain_edit(ctx, chain, fused_convnext_block, args, Choice(choice.impl, label, choice.fused),
                                 tensors, parts=parts)


# ====================================================================== lowering (lean graphs)

def _lower(gm, node, device, dtype) -> bool:
    """The block as direct calls, as ``dwln_impl`` and ``mlp_impl`` choose for its shape: the first step
    (``depthwise_layer_norm``; cuDNN's conv then ``channels_layer_norm``; or conv, permute, layer_norm), then
    the MLP (``mlp_hidden``'s GEMM and ``project_residual``'s; cuBLAS's fc1 and ``project_gelu_residual``; or the
    shared linear+act call's lowering, ``kernels.linear_act.lower_linear_act``, and ``project_residual``)."""
    x, dw_w, dw_b, stride, padding, dilation, ln_w, ln_b, eps, w1, b1, act, w2, b2 = node.args
    weight, w1t, w2t = (edit.attr_tensor(gm, t) for t in (dw_w, w1, w2))
    x_shape = aten.static_shape(x)
    if weight is None or w1t is None or w2t is None or x_shape is None or len(x_shape) != 4:
        return False
    n, c = x_shape[0], x_shape[1]
    hw = (x_shape[2], x_shape[3])
    out = conv_out_shape(x_shape, weight.shape, stride, padding, dilation)
    first, mlp = block_steps(edit.planned(node, device, dtype), device, dtype, c, hw, act)
    accumulate = ()
    if mlp in ACCUMULATE_IMPLS:
        if act in ACCUMULATE_ACTS and _owned_input(x, node):
            parts = accumulate_weights(w1t, edit.attr_tensor(gm, b1), w2t, edit.attr_tensor(gm, b2), act)
            base = "_lean_acc_" + str(w2.target).replace(".", "_")
            accumulate = tuple(edit.register_buffer(gm, base + suffix, p) for suffix, p in zip(("_w1", "_b1", "_w2"),
                                                                                               parts))
        else:
            mlp = "cublas" if mlp == "cublas_accumulate" else "triton_fc1"
    hidden_linear = []

    def build(g: torch.fx.Graph) -> torch.fx.Node:
        if first == "triton":
            packed = edit.register_buffer(gm, "_lean_dw_" + str(dw_w.target).replace(".", "_"),
                                          pack_depthwise_weight(weight))
            t = g.call_function(depthwise_layer_norm, (x, dw_w, g.get_attr(packed), dw_b, stride, padding,
                                                       dilation, ln_w, ln_b, eps))
        elif first == "cudnn_ln":
            y = g.call_function(torch.conv2d, (x, dw_w, None, stride, padding, dilation, c))
            t = g.call_function(channels_layer_norm, (y, ln_w, ln_b, eps, dw_b))
        else:
            y = g.call_function(torch.conv2d, (x, dw_w, dw_b, stride, padding, dilation, c))
            t = g.call_function(torch.layer_norm, (g.call_function(torch.permute, (y, [0, 2, 3, 1])), [c], ln_w,
                                                   ln_b, eps))
        if accumulate:
            return g.call_function(mlp_accumulate_, (t, *(g.get_attr(a) for a in accumulate), x, act,
                                                     mlp == "triton_fc1_accumulate"))
        if mlp in ("triton_gemm", "triton_fc1"):
            h = g.call_function(mlp_hidden, (t, w1, b1, act, True))                      # (N·H·W, 4C)
            return g.call_function(project_residual, (h, w2, b2, x, mlp == "triton_gemm"))
        rows = g.call_function(torch.reshape, (t, [-1, c]))
        if mlp == "gelu_prologue":
            hp = g.call_function(torch._C._nn.linear, (rows, w1, b1))                     # (N·H·W, 4C)
            return g.call_function(project_gelu_residual, (hp, w2, b2, x, act))
        rows.meta["val"] = torch.empty((n * out[2] * out[3], c), dtype=dtype, device="meta")      # (M, C)
        h = g.call_function(fused_linear_act, (rows, w1, b1, act))
        edit.hand_part(node, h, HIDDEN_LINEAR)      # the rewrite's choice for it, read by its lowering
        hidden_linear.append(h)
        return g.call_function(project_residual, (h, w2, b2, x, False))

    edit.replace_node(gm, node, build)
    if hidden_linear:
        lower_linear_act(gm, hidden_linear[0], device, dtype)
    return True




#: Calls whose result is a view of their first argument (the walk of ``_owned_input`` goes through them).
_VIEWS = {torch.permute, torch.ops.aten.permute.default, torch.ops.aten.view.default, torch.reshape,
          torch.ops.aten.reshape.default, torch.ops.aten._unsafe_view.default, "permute", "view"}


def _owned_input(x: torch.fx.Node, consumer: torch.fx.Node) -> bool:
    """Whether the block's input ``x`` may be overwritten by ``consumer`` (the block): every node from the tensor's
    producer through the views to ``consumer`` has that one user, and the producer makes a fresh tensor (one of
    this family's calls or a convolution: ``_FRESH``), so no other value shares the storage. A graph input, a
    weight, or any other producer: not owned (the block then keeps its residual pass)."""
    node, user = x, consumer
    while True:
        if not isinstance(node, torch.fx.Node) or list(node.users) != [user]:
            return False
        if node.op == "call_method" and node.target in _VIEWS or node.op == "call_function" and node.target in _VIEWS:
            node, user = node.args[0], node
            continue
        return node.op == "call_function" and node.target in _FRESH


# ====================================================================== LayerNorm2d: the stem, downsamplings, head

def fold_layer_norm_affine(weight: torch.Tensor, bias: torch.Tensor | None, gamma: torch.Tensor | None,
                           beta: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``(W·γ, b + Σ W·β)``: a LayerNorm's affine ``γ·x̂ + β`` folded into the conv or linear that reads x̂
    (``weight`` ``(C_out, C_in, *kernel)`` or ``(C_out, C_in)``; γ, β over C_in). Exact for a linear, and for a
    convolution without padding (every tap reads a normalised value; a padded zero would not get β). In
    float64, returned in the weight's dtype; the inputs are not modified."""
    shape = (1, -1) + (1,) * (weight.dim() - 2)
    w64 = weight.detach().to(torch.float64)
    w = w64 if gamma is None else w64 * gamma.detach().to(torch.float64).reshape(shape)
    b = None if bias is None else bias.detach().to(torch.float64)
    if beta is not None:
        shift = (w64 * beta.detach().to(torch.float64).reshape(shape)).flatten(1).sum(1)          # (C_out,)
        b = shift if b is None else b + shift
    dtype = weight.dtype if bias is None else bias.dtype
    return w.to(weight.dtype), None if b is None else b.to(dtype)


def _ln2d_on() -> bool:
    return policy.POLICY.convnext_ln2d


def ln2d_impl(device: torch.device | str, dtype: torch.dtype, key: tuple[int, int, int] | None,
              stem: bool = False) -> str:
    """How a LayerNorm2d over the map ``key`` = (C, H, W) runs: ``triton`` (our one pass) where Triton runs,
    ``policy.POLICY.convnext_ln2d`` is on and the measured table (``STEM_MEASURED``, ``LN2D_MEASURED``) does not
    say ``torch`` for the shape; else ``torch``."""
    if not (_ln2d_on() and triton_runs_on(device) and dtype in SUPPORTED_DTYPES):
        return "torch"
    return (STEM_MEASURED if stem else LN2D_MEASURED).get(key, ("triton",))[0]


def _map_key(t: torch.Tensor) -> tuple[int, int, int]:
    """(C, H, W) of an (N, H, W, C) map."""
    return (t.shape[3], t.shape[1], t.shape[2])


def conv_layer_norm2d(x, weight, bias, stride, padding, dilation, groups, ln_weight, ln_bias, eps) -> torch.Tensor:
    """The stem: ``layer_norm(conv(x) + b)`` over the channels as ``(N, H', W', C)``: cuDNN's conv WITHOUT its
    bias, then ``channels_layer_norm`` adding the bias in its one pass (the reference where Triton does not run
    or the conv's output is not channels_last)."""
    y = torch.conv2d(x, weight, None, stride, padding, dilation, groups)               # (N, C, H', W')
    return channels_layer_norm(y, ln_weight, ln_bias, eps, bias)


def fused_conv_layer_norm2d(x, weight, bias, stride, padding, dilation, groups, ln_weight, ln_bias, eps):
    """conv → permute → layer_norm(C), as ``(N, H', W', C)`` (what the LayerNorm returned)."""
    out = conv_out_shape(x.shape, weight.shape, stride, padding, dilation)
    if ln2d_impl(x.device, x.dtype, (out[1], out[2], out[3]), stem=True) != "triton":
        return _stem_reference(x, weight, bias, stride, padding, dilation, groups, ln_weight, ln_bias, eps)
    return conv_layer_norm2d(x, weight, bias, stride, padding, dilation, groups, ln_weight, ln_bias, eps)


def fused_layer_norm2d_conv(t, ln_weight, ln_bias, eps, weight, bias, stride, padding, dilation, groups):
    """A downsampling: ``conv(layer_norm(t).permute(0, 3, 1, 2))`` for ``t`` ``(N, H, W, C)`` (the permuted
    block output), the LayerNorm as one pass (``rows_layer_norm``; γ, β are None where the rewrite folded them
    into the conv's weights), then cuDNN's conv."""
    if ln2d_impl(t.device, t.dtype, _map_key(t)) != "triton":
        return _downsample_reference(t, ln_weight, ln_bias, eps, weight, bias, stride, padding, dilation, groups)
    return _downsample_direct(t, ln_weight, ln_bias, eps, weight, bias, stride, padding, dilation, groups)


def fused_layer_norm_linear(t, ln_weight, ln_bias, eps, weight, bias):
    """The head: ``linear(flatten(layer_norm(t)))`` for ``t`` ``(N, 1, 1, C)``, the LayerNorm as one pass (γ, β
    folded into the linear by the rewrite), then the linear."""
    if ln2d_impl(t.device, t.dtype, _map_key(t)) != "triton":
        return _head_reference(t, ln_weight, ln_bias, eps, weight, bias)
    return _head_direct(t, ln_weight, ln_bias, eps, weight, bias)


@selection
def select_layer_norm2d(device: torch.device | str, dtype: torch.dtype, where_: str, folded: bool,
                        key: tuple[int, int, int] | None = None) -> Choice:
    """How a LayerNorm2d chain runs (``ln2d_impl`` for its map ``key`` = (C, H, W)): ``triton`` (one LayerNorm pass
    over channels_last rows, with the conv's bias (stem) or with its affine folded into the next layer), or
    ``reference`` (permute + ``layer_norm``: no Triton, or measured faster at the shape: the label says so)."""
    device = torch.device(device)
    table = STEM_MEASURED if where_ == "stem" else LN2D_MEASURED
    if ln2d_impl(device, dtype, key, stem=where_ == "stem") == "triton":
        label = WORDS("ln2d." + where_ + (".folded" if folded else ""))
        if key in table:
            _, ours, torch_us = table[key]
            label = WORDS("ln2d.noted", label=label, c=key[0], h=key[1], w=key[2], ours=ours, torch=torch_us)
        return Choice("triton", where(label, device), True)
    if key in table and triton_runs_on(device) and _ln2d_on():
        _, ours, torch_us = table[key]
        why = WORDS("ln2d.why_measured", c=key[0], h=key[1], w=key[2], ours=ours, torch=torch_us)
    elif not triton_runs_on(device):
        why = BASE_WORDS("no_triton", device=device.type)
    elif not _ln2d_on():
        why = WORDS("ln2d.why_policy")
    else:
        why = WORDS("why.dtype", dtype=dtype)
    return Choice("reference", where(WORDS("ln2d.reference", why=why), device), False)


def _channels_ln(ctx: RewriteContext, ln_node: torch.fx.Node) -> aten.LayerNormArgs:
    ln = aten.layer_norm_args(ln_node)
    shape = aten.static_shape(ln_node)
    if ln is None or shape is None or len(shape) != 4 or list(ln.normalized_shape) != [shape[-1]]:
        raise UseGeneric(WORDS("refuse.channels"))
    return ln


def _views_between(ctx: RewriteContext, chain, first: torch.fx.Node, last: torch.fx.Node) -> list[str]:
    names = list(chain.nodes)
    return [aten.aten_name(ctx.by_name[n]) for n in names[names.index(first.name) + 1: names.index(last.name)]]


def rewrite_stem(ctx: RewriteContext, chain, kernel: str) -> edit.Edit:
    """conv → permute → LayerNorm over C as one call: the conv without its bias, the bias added in the LayerNorm."""
    cv, ln_node = ctx.node(chain, "conv"), ctx.node(chain, "norm")
    c = aten.conv_args(cv)
    if c is None or c.transposed or aten.static_shape(cv) is None or len(aten.static_shape(cv)) != 4:
        raise UseGeneric(WORDS("generic.forward", op=aten.aten_name(cv)))
    _permute_between(ctx, chain, cv, ln_node, [0, 2, 3, 1])
    ln = _channels_ln(ctx, ln_node)
    geometry = edit.int_lists(2, c.stride, c.padding, c.dilation)
    if geometry is None or not isinstance(c.groups, int):
        raise UseGeneric(WORDS("generic.geometry"))
    out = aten.static_shape(ln_node)
    choice = select_layer_norm2d(ctx.device, ctx.run_dtype(cv), "stem", False, (out[3], out[1], out[2]))
    label = choice.label if choice.fused else edit.not_fused_note(ctx.device, choice.label, WORDS("ln2d.kernel"))
    args = (c.input, c.weight, c.bias, *geometry, c.groups, ln.weight, ln.bias, ln.eps)
    return edit.whole_chain_edit(ctx, chain, fused_conv_layer_norm2d, args, Choice(choice.impl, label, choice.fused))


def _folded_affine(ctx, ln, weight_node, bias_node, fold: bool, key: str):
    """The next layer's weights with the LayerNorm's affine folded in (``fold``), as new attributes."""
    if not fold or (ln.weight is None and ln.bias is None):
        return ln.weight, ln.bias, weight_node, bias_node, {}
    w = ctx.constant(weight_node, WORDS("what.next_weight"))
    b = ctx.constant(bias_node, WORDS("what.next_bias"))
    gamma = ctx.constant(ln.weight, WORDS("what.ln_weight"))
    beta = ctx.constant(ln.bias, WORDS("what.ln_bias"))
    fw, fb = fold_layer_norm_affine(w, b, gamma, beta)
    tensors = {f"{key}_ln_folded_weight": fw}
    if fb is not None:
        tensors[f"{key}_ln_folded_bias"] = fb
    return (None, None, NewAttr(f"{key}_ln_folded_weight"),
            None if fb is None else NewAttr(f"{key}_ln_folded_bias"), tensors)


def rewrite_downsample(ctx: RewriteContext, chain, kernel: str) -> edit.Edit:
    """LayerNorm over C → permute → conv as one call: the LayerNorm's affine folded into the conv where it has
    no padding (exact), the LayerNorm one pass."""
    ln_node, cv = ctx.node(chain, "norm"), ctx.node(chain, "conv")
    ln = _channels_ln(ctx, ln_node)
    c = aten.conv_args(cv)
    if c is None or c.transposed:
        raise UseGeneric(WORDS("generic.forward", op=aten.aten_name(cv)))
    _permute_between(ctx, chain, ln_node, cv, [0, 3, 1, 2])
    geometry = edit.int_lists(2, c.stride, c.padding, c.dilation)
    if geometry is None or not isinstance(c.groups, int) or c.groups != 1:
        raise UseGeneric(WORDS("generic.geometry"))
    fold = not any(geometry[1])
    lw, lb, w, b, tensors = _folded_affine(ctx, ln, c.weight, c.bias, fold, cv.name)
    shape = aten.static_shape(ln_node)
    choice = select_layer_norm2d(ctx.device, ctx.run_dtype(cv), "downsample", lw is None and lb is None,
                                 (shape[3], shape[1], shape[2]))
    label = choice.label if choice.fused else edit.not_fused_note(ctx.device, choice.label, WORDS("ln2d.kernel"))
    args = (ln.input, lw, lb, ln.eps, w, b, *geometry, c.groups)
    return edit.whole_chain_edit(ctx, chain, fused_layer_norm2d_conv, args, Choice(choice.impl, label, choice.fused),
                                 tensors)


def rewrite_head(ctx: RewriteContext, chain, kernel: str) -> edit.Edit:
    """LayerNorm over C of a (N, 1, 1, C) map → permute → flatten → linear as one call, the affine folded into
    the linear (exact)."""
    ln_node, fc = ctx.node(chain, "norm"), ctx.node(chain, "fc")
    ln = _channels_ln(ctx, ln_node)
    shape = aten.static_shape(ln_node)
    if shape[1] != 1 or shape[2] != 1 or _views_between(ctx, chain, ln_node, fc) not in (["permute", "flatten"],
                                                                                       ["flatten"], ["view"],
                                                                                       ["permute", "view"]):
        raise UseGeneric(WORDS("generic.head"))
    lin = aten.linear_args(fc)
    if lin is None:
        raise UseGeneric(WORDS("generic.mlp"))
    lw, lb, w, b, tensors = _folded_affine(ctx, ln, lin.weight, lin.bias, True, fc.name)
    choice = select_layer_norm2d(ctx.device, ctx.run_dtype(fc), "head", True, (shape[3], shape[1], shape[2]))
    label = choice.label if choice.fused else edit.not_fused_note(ctx.device, choice.label, WORDS("ln2d.kernel"))
    args = (ln.input, lw, lb, ln.eps, w, b)
    return edit.whole_chain_edit(ctx, chain, fused_layer_norm_linear, args, Choice(choice.impl, label, choice.fused),
                                 tensors)


def _lower_ln2d(direct, fallback, stem: bool = False):
    """A lowering that calls ``direct`` (the one-pass LayerNorm) where ``ln2d_impl`` says ``triton`` for the
    node's map when the graph is prepared, else ``fallback`` (the same ops as torch's): the choice baked in."""
    def lower(gm, node, device, dtype) -> bool:
        shape = aten.static_shape(node) if stem else aten.static_shape(node.args[0])
        key = None if shape is None or len(shape) != 4 else (shape[3], shape[1], shape[2])
        target = direct if ln2d_impl(device, dtype, key, stem) == "triton" else fallback
        edit.replace_node(gm, node, lambda g: g.call_function(target, tuple(node.args)))
        return True
    return lower


def _stem_reference(x, weight, bias, stride, padding, dilation, groups, ln_weight, ln_bias, eps):
    """The stem as torch runs it: conv with its bias, permute, layer_norm."""
    y = torch.conv2d(x, weight, bias, stride, padding, dilation, groups).permute(0, 2, 3, 1)
    return F.layer_norm(y, (y.shape[-1],), ln_weight, ln_bias, eps)


def _downsample_reference(t, ln_weight, ln_bias, eps, weight, bias, stride, padding, dilation, groups):
    n = F.layer_norm(t, (t.shape[-1],), ln_weight, ln_bias, eps)
    return torch.conv2d(n.permute(0, 3, 1, 2), weight, bias, stride, padding, dilation, groups)


def _downsample_direct(t, ln_weight, ln_bias, eps, weight, bias, stride, padding, dilation, groups):
    return torch.conv2d(rows_layer_norm(t, ln_weight, ln_bias, eps).permute(0, 3, 1, 2), weight, bias, stride,
                        padding, dilation, groups)


def _head_reference(t, ln_weight, ln_bias, eps, weight, bias):
    n = F.layer_norm(t, (t.shape[-1],), ln_weight, ln_bias, eps)
    return F.linear(n.reshape(n.shape[0], -1), weight, bias)


def _head_direct(t, ln_weight, ln_bias, eps, weight, bias):
    n = rows_layer_norm(t, ln_weight, ln_bias, eps)
    return F.linear(n.reshape(n.shape[0], -1), weight, bias)


#: Calls that return a tensor of their own (not a view of an input that may live on): a block's input made by one
#: of them may be accumulated onto in place. ``mlp_accumulate_`` returns its input, which its own lowering proved
#: was owned.
_FRESH = {torch.conv2d, torch.ops.aten.convolution.default, conv_layer_norm2d, _stem_reference, _downsample_direct,
          _downsample_reference, fused_conv_layer_norm2d, fused_layer_norm2d_conv, fused_convnext_block,
          project_residual, project_gelu_residual, mlp_accumulate_}

LOWERINGS = {fused_convnext_block: _lower,
             fused_conv_layer_norm2d: _lower_ln2d(conv_layer_norm2d, _stem_reference, stem=True),
             fused_layer_norm2d_conv: _lower_ln2d(_downsample_direct, _downsample_reference),
             fused_layer_norm_linear: _lower_ln2d(_head_direct, _head_reference)}


# ====================================================================== pattern

def _depthwise(g, conv_node: str) -> bool:
    attrs = g.nodes[conv_node]
    shapes = attrs["shapes"]
    inputs = list(g.predecessors(conv_node))
    channels = shapes[0][1] if shapes and len(shapes[0]) == 4 else None
    return (channels is not None and attrs.get("groups", 1) == channels and len(inputs) == 1
            and g.nodes[inputs[0]]["shapes"][0][1] == channels)


def _norm_after_depthwise(g, node: str, ctx: dict) -> str | None:
    """(The anchor's own guard would never be asked: the conv is checked here, from the step after it.)"""
    if not _depthwise(g, ctx["prev_real"]):
        return WORDS("refuse.not_depthwise")
    if g.nodes[node].get("norm_dims", 1) != 1:
        return WORDS("refuse.last_dim")
    return None


def _per_channel_constant(g, node: str, ctx: dict) -> str | None:
    if not g.nodes[node].get("const_operand") or g.in_degree(node) != 1:
        return WORDS("refuse.constant")
    return None


def _adds_block_input(g, node: str, ctx: dict) -> str | None:
    """The residual add's other operand is the tensor the block's convolution read."""
    anchor = next(n for n in ctx["chain"] if g.nodes[n]["kind"] == "conv")
    block_input = set(g.predecessors(anchor))
    others = {p for p in g.predecessors(node) if p != ctx["prev"] and p not in ctx["chain"]}
    if others != block_input:
        return WORDS("refuse.block_input")
    return None


def _permuted_from(g, node: str, shape_in: list[int] | None) -> bool:
    """``node``'s one tensor input is a ``permute`` whose own input has ``shape_in`` (None: any 4-D)."""
    preds = [p for p in g.predecessors(node) if g.nodes[p]["kind"] not in ("weight", "input")
             or "permute" in str(g.nodes[p].get("target", ""))]
    perms = [p for p in preds if "permute" in str(g.nodes[p].get("target", ""))]
    if len(perms) != 1:
        return False
    before = [q for q in g.predecessors(perms[0])]
    if len(before) != 1:
        return False
    src = g.nodes[before[0]]["shapes"]
    return bool(src) and len(src[0]) == 4 and (shape_in is None or list(src[0]) == list(shape_in))


def _ln2d_shape(g, ln: str) -> list[int] | None:
    shapes = g.nodes[ln]["shapes"]
    return list(shapes[0]) if shapes and len(shapes[0]) == 4 and g.nodes[ln].get("norm_dims", 1) == 1 else None


def _ln_after_conv(g, node: str, ctx: dict) -> str | None:
    """A LayerNorm over the channels of the conv's output, seen through ``permute(0, 2, 3, 1)``."""
    shape = _ln2d_shape(g, node)
    conv_shape = g.nodes[ctx["prev_real"]]["shapes"]
    if shape is None or not conv_shape or len(conv_shape[0]) != 4:
        return WORDS("refuse.ln2d")
    n, c, h, w = conv_shape[0]
    if shape != [n, h, w, c]:
        return WORDS("refuse.ln2d")
    inputs = [g.nodes[p]["shapes"] for p in g.predecessors(ctx["prev_real"]) if g.nodes[p]["kind"] != "weight"]
    if not any(sh and len(sh[0]) == 4 and sh[0][2] > h for sh in inputs):     # a stem: the conv patchifies
        return WORDS("refuse.stem")
    return None


def _match_after_ln2d(kind: str, role: str, pooled: bool):
    """The matcher of a pattern anchored on a LayerNorm2d (a LayerNorm over C of a permuted (N, C, H, W) map;
    ``pooled``: of a 1×1 map, the head) followed, through views, by one ``kind`` op: ``[(ln, "norm"), views...,
    (op, role)]``. Anything else is no match at all (not a near miss): a transformer's LayerNorm → linear is not
    this pattern's candidate."""
    def match(g, pattern: Pattern, anchor: str, claimed: dict[str, str]) -> list:
        shape = _ln2d_shape(g, anchor)
        if (shape is None or (pooled and shape[1:3] != [1, 1])
                or not _permuted_from(g, anchor, [shape[0], shape[3], shape[1], shape[2]])):
            raise NoMatch(None, [anchor])
        path, node = [], anchor
        while True:
            succ = list(g.successors(node))
            if len(succ) != 1:
                raise NoMatch(None, [anchor])
            node = succ[0]
            if g.nodes[node]["kind"] not in TRANSPARENT:
                break
            path.append(node)
        if g.nodes[node]["kind"] != kind or any(n in claimed for n in (anchor, node, *path)):
            raise NoMatch(None, [anchor])
        return [(anchor, "norm", True), *((p, "view", False) for p in path), (node, role, True)]
    return match


#: Which families this one must claim nodes before or after (explorer.fusions.order).
RUNS_BEFORE = ("conv", "linear", "norm")   # its depthwise conv, LayerNorm and MLP are one block

PATTERNS = (
    Pattern(
        name="convnext_block", label=WORDS("convnext_block.label"),
        steps=(Step(frozenset({"conv"}), "dwconv"),
               Step(frozenset({"layer_norm"}), "norm", guard=_norm_after_depthwise),
               Step(frozenset({"linear"}), "fc1"),
               Step(frozenset(LINEAR_ACTIVATIONS) - {"none", "gelu_tanh"}, "act"),
               Step(frozenset({"linear"}), "fc2"),
               Step(frozenset({"mul"}), "scale", optional=True, guard=_per_channel_constant),
               Step(frozenset({"add"}), "residual", guard=_adds_block_input)),
        color="#6b6ecf", rewrite=rewrite,
        implementation=WORDS("convnext_block.implementation"),
        explanation=WORDS("convnext_block.explanation"),
        caveats=(PRECISION_CAVEAT, CAVEAT, CAVEAT_MEASURED, CAVEAT_ACCUMULATE),
        formula=WORDS("convnext_block.formula"),
    ),
    Pattern(
        name="convnext_stem_ln", label=WORDS("stem.label"),
        steps=(Step(frozenset({"conv"}), "conv"),
               Step(frozenset({"layer_norm"}), "norm", guard=_ln_after_conv)),
        color="#9c9ede", rewrite=rewrite_stem,
        implementation=WORDS("ln2d.implementation"), explanation=WORDS("stem.explanation"),
        caveats=(PRECISION_CAVEAT,), formula=WORDS("stem.formula"),
    ),
    Pattern(
        name="convnext_downsample_ln", label=WORDS("downsample.label"),
        steps=(Step(frozenset({"layer_norm"}), "norm"), Step(frozenset({"conv"}), "conv")),
        match=_match_after_ln2d("conv", "conv", pooled=False),
        color="#9c9ede", rewrite=rewrite_downsample,
        implementation=WORDS("ln2d.implementation"), explanation=WORDS("downsample.explanation"),
        caveats=(PRECISION_CAVEAT, WORDS("ln2d.caveat")), formula=WORDS("ln2d.formula"),
    ),
    Pattern(
        name="convnext_head_ln", label=WORDS("head.label"),
        steps=(Step(frozenset({"layer_norm"}), "norm"), Step(frozenset({"linear"}), "fc")),
        match=_match_after_ln2d("linear", "fc", pooled=True),
        color="#9c9ede", rewrite=rewrite_head,
        implementation=WORDS("ln2d.implementation"), explanation=WORDS("head.explanation"),
        caveats=(PRECISION_CAVEAT, WORDS("ln2d.caveat")), formula=WORDS("ln2d.formula"),
    ),
)
