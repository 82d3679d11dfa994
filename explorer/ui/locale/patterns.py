"""中文 for the patterns' teaching texts, keyed by their English text in ``explorer/fusions/<family>.py``.

A pattern's label, explanation, implementation, formula and caveats are written
once, in English, beside the pattern (the registry is the one place for them).
Their Chinese is looked up here by the English text itself: when someone
changes the English, the old translation no longer matches and
``tests/test_i18n.py`` names the text until it is translated again. Formulas
that read the same in both languages map to themselves.
"""

_PRECISION = ("Fusion reorders arithmetic: expect output differences near the dtype's rounding (about 1e-6 relative "
              "in fp32, 1e-3 in fp16 and bf16).")
_PAYS = ("Not every fusion pays: a fused kernel that is slower than the library kernels it replaces (register "
         "pressure, a worse algorithm choice) makes the model slower. Measure.")
_FOLD = ("BatchNorm folding is valid only for inference: in training the batch statistics change every step, so the "
         "folded weights would be wrong.")
_CONV_FORMULA = ("W' = W * gamma / sqrt(var + eps)  (per output channel);  "
                 "b' = (b - mean) * gamma / sqrt(var + eps) + beta")
_CONV_IMPL = ("cuDNN conv+bias+ReLU in one call where it wins; depthwise convs (channels_last) as one Triton kernel "
              "with their epilogue; otherwise the conv without bias and one vectorised Triton pass for bias, residual "
              "and activation")
_CONV_IMPL_ZH = ("在 cuDNN 的 conv+bias+ReLU 融合调用更快的地方用它（1 次调用）；深度可分离卷积（channels_last）用一个带尾处理的 "
                 "Triton 内核；其余情况先做不带偏置的卷积，再用一个向量化的 Triton 内核一次完成偏置、残差和激活")
#: The same text once 1×1 convolutions run as one Triton GEMM with their epilogue (conv.py's ``gemm_triton``).
_CONV_IMPL_GEMM = ("cuDNN conv+bias+ReLU in one call where it wins; 1x1 convs (channels_last) as one Triton GEMM with "
                   "their epilogue, depthwise convs as one Triton kernel with theirs; otherwise the conv without bias and "
                   "one vectorised Triton pass for bias, residual and activation")
_CONV_IMPL_GEMM_ZH = ("在 cuDNN 的 conv+bias+ReLU 融合调用更快的地方用它（1 次调用）；1x1 卷积（channels_last）用一个带尾处理的 "
                      "Triton GEMM，深度可分离卷积用一个带尾处理的 Triton 内核；其余情况先做不带偏置的卷积，再用一个向量化的 "
                      "Triton 内核一次完成偏置、残差和激活")
_ADD_WHY = ("The residual add and the activation run in the convolution's epilogue: the conv output is never written "
            "to device memory and read back, and the add and the activation cost no launch of their own.")
_ADD_WHY_ZH = "残差相加和激活函数在卷积的尾处理（epilogue）中完成：卷积输出不再写回显存再读出，相加和激活也不再各自占用一次内核启动。"
_BOTTLENECK = ("MobileNetV2's and EfficientNet's projection convolutions end in a residual add with no activation (a "
               "linear bottleneck). Unfused, the add is a kernel of its own that reads the conv output and the residual "
               "and writes the sum; in the epilogue it is one more read of the residual in the pass that adds the bias.")
_BOTTLENECK_ZH = ("MobileNetV2 和 EfficientNet 的投影卷积以不带激活的残差相加结尾（线性瓶颈）。不融合时，相加是一个单独的内核，"
                  "要读卷积输出和残差、写出和；放进尾处理后，只是在加偏置的那一遍里多读一次残差。")
_RMS = ("A hand-written RMSNorm (transformers' LlamaRMSNorm) is six ops, each reading and writing the whole activation, "
        "with fp32 temporaries: cast, square, mean, add eps, rsqrt, multiply, cast back, scale. One kernel reads the row "
        "once, keeps it in registers for the mean square, and writes the normalised row, rounding where the module "
        "rounds.")
_RMS_ZH = ("手写的 RMSNorm（transformers 的 LlamaRMSNorm）有六个算子，每个都要读写整个激活张量，还有 fp32 临时张量：类型转换、"
           "平方、求均值、加 eps、rsqrt、相乘、转换回来、缩放。一个内核只读一遍这一行，把它留在寄存器里求均方，再写出归一化后的行，"
           "并在原模块舍入的地方舍入。")

TEXTS: dict[str, str] = {
    # ------------------------------------------------------------------ shared caveats and formulas
    _PRECISION: "算子融合会改变计算顺序：输出差异应在该数据类型的舍入量级（fp32 约 1e-6 相对误差，fp16 和 bf16 约 1e-3）。",
    _PAYS: "不是所有融合都划算：融合内核若比它替换的库内核更慢（寄存器压力、算法选择更差），模型就会变慢。要实测。",
    _FOLD: "BN 折叠只在推理时成立：训练时每一步的批统计量都在变，折叠后的权重就不对了。",
    _CONV_FORMULA: "W' = W * gamma / sqrt(var + eps)（逐输出通道）；  b' = (b - mean) * gamma / sqrt(var + eps) + beta",

    # ------------------------------------------------------------------ attention
    "MatMul+Softmax": "MatMul+Softmax（矩阵乘法+Softmax）",
    ("Attention scores (Q K^T, scaled and masked) are sized seq x seq per head: the largest intermediates in a "
     "transformer. Fusing the MatMul with the scale, the mask and the softmax keeps each row of scores in registers; "
     "adding the second MatMul (the whole attention block) means the seq x seq matrix never reaches device memory at "
     "all."):
        ("注意力分数（Q K^T，经过缩放和掩码）每个头的大小是 序列长度 × 序列长度：Transformer 里最大的中间结果。把 MatMul 与缩放、"
         "掩码和 softmax 融合，每一行分数都留在寄存器里；再把第二个 MatMul 也融合进来（整个注意力块），这个 序列长度 × 序列长度 "
         "的矩阵就完全不会写到显存。"),
    ("one Triton kernel for scores->softmax; scaled_dot_product_attention (flash attention) when the chain ends in the "
     "second MatMul"):
        "分数 → softmax 用一个 Triton 内核；链以第二个 MatMul 结尾时用 scaled_dot_product_attention（flash attention）",
    "Softmax is computed in fp32 inside the kernel even for fp16 inputs.": "即使输入是 fp16，内核内部也用 fp32 计算 softmax。",

    # ------------------------------------------------------------------ squeeze-excite
    "Squeeze-excite": "Squeeze-excite（通道注意力）",
    ("Squeeze-and-excitation is six ops, four of them on tensors of one value per channel: their cost is launches, not "
     "bytes. The pool and the first FC layer share one pass over x; the second FC layer, the gate and the multiply "
     "share the other: two kernels, and x is read twice and y written once, as in the unfused graph's pool and "
     "multiply."):
        ("Squeeze-and-excitation 有六个算子，其中四个作用在每通道只有一个值的张量上：它们的开销在内核启动，不在访存。池化和第一个"
         "全连接层共用一遍对 x 的读取；第二个全连接层、门控和乘法共用另一遍：两个内核，x 读两次、y 写一次，和未融合计算图中的"
         "池化与乘法一样。"),
    "two Triton kernels: pool + fc1 partial sums, then fc2 + gate + scale":
        "两个 Triton 内核：先是池化 + fc1 的部分和，然后是 fc2 + 门控 + 缩放",
    "Pooling, both FC layers and the gate are computed in fp32 for 16-bit inputs.":
        "对 16 位输入，池化、两个全连接层和门控都用 fp32 计算。",

    # ------------------------------------------------------------------ ConvNeXt block
    "ConvNeXt block": "ConvNeXt 块",
    ("A ConvNeXt block is eight kernels in eager mode, five of them moving the whole activation for a few flops each "
     "(the conv's bias, LayerNorm, GELU, the layer scale, the residual add). The LayerNorm runs in the depthwise "
     "convolution's epilogue, the layer scale disappears into the second linear's weights, and the residual add is one "
     "pass."):
        ("ConvNeXt 块在 eager 模式下是八个内核，其中五个每次只做几次浮点运算却要搬运整个激活张量（卷积偏置、LayerNorm、GELU、"
         "layer scale、残差相加）。LayerNorm 放进深度可分离卷积的尾处理，layer scale 折叠进第二个线性层的权重，残差相加只需一遍。"),
    ("depthwise conv + bias + LayerNorm in one Triton kernel, Linear+GELU, the second linear with the layer scale folded "
     "in, the residual add in one vectorised pass"):
        ("深度可分离卷积 + 偏置 + LayerNorm 合成一个 Triton 内核，Linear+GELU，第二个线性层折叠进 layer scale，残差相加用一个向量化"
         "内核完成"),
    "gamma * (h W2^T + b2) = h (gamma W2)^T + gamma b2   (per output channel)":
        "gamma * (h W2^T + b2) = h (gamma W2)^T + gamma b2（逐输出通道）",
    ("Slower than torch.compile where it was measured (ConvNeXt-Tiny, fp16, batch 32, H200): "
     "faster than eager (0.95x of its time) but 1.18x the time of torch.compile's default mode "
     "and, with CUDA graphs, 1.20x that of reduce-overhead; the depthwise 7x7 + LayerNorm kernel "
     "takes more GPU time than cuDNN's conv with inductor's LayerNorm "
     "(benchmarks/results/bench_cnn_fusions_convnext_tiny_quick_h200.json). Time these chains on "
     "your GPU before accepting them, or give them the inductor kernel."):
        ("在实测中比 torch.compile 慢（ConvNeXt-Tiny，fp16，batch 32，H200）：比 ea"
         "ger 快（耗时为其 0.95 倍），但耗时是 torch.compile 默认模式的 1.18 倍，使用 CUDA g"
         "raph 时是 reduce-overhead 的 1.20 倍；深度可分离 7x7 卷积 + LayerNorm 内核"
         "占用的 GPU 时间多于 cuDNN 卷积加 inductor 的 LayerNorm（benchmarks/resul"
         "ts/bench_cnn_fusions_convnext_tiny_quick_h200.json）。接受这些链之前，"
         "先在你的 GPU 上给它们计时，或者为它们选择 inductor 内核。"),
    ("Folding the layer scale into the second linear rounds γ·W₂ to the weights' dtype once, as BatchNorm folding does; "
     "valid in inference and training alike (it is exact algebra)."):
        "把 layer scale 折叠进第二个线性层时，γ·W₂ 会按权重的数据类型舍入一次，和 BN 折叠一样；推理和训练都成立（这是精确的代数变换）。",

    # ------------------------------------------------------------------ convolution
    "Conv+BN+Add+act": "Conv+BN+Add+激活",
    "The residual block's tail. " + _ADD_WHY: "残差块的尾部。" + _ADD_WHY_ZH,
    "BatchNorm folded into the conv; " + _CONV_IMPL: "BN 折叠进卷积；" + _CONV_IMPL_ZH,
    _CONV_IMPL: _CONV_IMPL_ZH,
    "BatchNorm folded into the conv; " + _CONV_IMPL_GEMM: "BN 折叠进卷积；" + _CONV_IMPL_GEMM_ZH,
    _CONV_IMPL_GEMM: _CONV_IMPL_GEMM_ZH,
    "Conv+Add+act": "Conv+Add+激活",
    "Conv, residual add and activation, BatchNorm already folded (as ONNX exporters do). " + _ADD_WHY:
        "卷积、残差相加和激活，BN 已经折叠（ONNX 导出器就是这样做的）。" + _ADD_WHY_ZH,
    "Conv+BN+Add": "Conv+BN+Add",
    _BOTTLENECK: _BOTTLENECK_ZH,
    "BatchNorm folded into the conv; the residual added in the epilogue pass with the bias":
        "BN 折叠进卷积；残差在加偏置的那一遍尾处理中加上",
    "Conv+Add": "Conv+Add",
    "A convolution and a residual add with no activation, BatchNorm already folded (as ONNX exporters do). " + _BOTTLENECK:
        "卷积加上不带激活的残差相加，BN 已经折叠（ONNX 导出器就是这样做的）。" + _BOTTLENECK_ZH,
    "the residual added in the epilogue pass with the bias": "残差在加偏置的那一遍尾处理中加上",
    "Conv+BN+act": "Conv+BN+激活",
    ("conv -> temp1 -> bn -> temp2 -> relu is three launches and two intermediates written and read back. Folding BN "
     "into the conv's weights removes one op exactly; running the activation in the conv's epilogue removes the "
     "other."):
        ("conv -> temp1 -> bn -> temp2 -> relu 是 3 次内核启动，外加 2 个写回显存再读出的中间结果。把 BN 折叠进卷积权重，精确地"
         "去掉一个算子；把激活放进卷积的尾处理，去掉另一个。"),
    "Conv+act": "Conv+激活",
    ("Convolution with its activation in the epilogue (BatchNorm already folded, as ONNX exporters do): the "
     "pre-activation tensor is never written out."):
        "卷积在尾处理中完成激活（BN 已经折叠，ONNX 导出器就是这样做的）：激活前的张量从不写出。",
    "Conv+BN": "Conv+BN",
    ("In inference BatchNorm is a per-channel affine map, so it folds into the convolution's weights: one op and one "
     "intermediate disappear at no cost."):
        "推理时 BN 是逐通道的仿射变换，所以可以折叠进卷积权重：一个算子和一个中间结果零成本地消失。",
    ("BatchNorm folded into the conv's weight and bias (exact algebra, no kernel); on CUDA the bias in one vectorised "
     "Triton pass after the conv"):
        "BN 折叠进卷积的权重和偏置（精确的代数变换，不需要内核）；在 CUDA 上，偏置在卷积之后用一个向量化的 Triton 内核加上",

    # the same patterns' implementation texts as committed before the conv family's own Triton epilogue
    "BatchNorm folded into the conv; cuDNN conv+bias+add+ReLU in one kernel":
        "BN 折叠进卷积；cuDNN 的 conv+bias+add+ReLU 合成一个内核",
    "cuDNN conv+bias+add+ReLU in one kernel": "cuDNN 的 conv+bias+add+ReLU 合成一个内核",
    ("BatchNorm folded into the conv; cuDNN conv+bias+ReLU in one kernel (other activations: folded conv, then the "
     "activation in place)"):
        "BN 折叠进卷积；cuDNN 的 conv+bias+ReLU 合成一个内核（其他激活函数：先做折叠后的卷积，再原地做激活）",
    "cuDNN conv+bias+ReLU in one kernel": "cuDNN 的 conv+bias+ReLU 合成一个内核",
    "BatchNorm folded into the conv's weight and bias (exact algebra, no kernel)":
        "BN 折叠进卷积的权重和偏置（精确的代数变换，不需要内核）",

    # ------------------------------------------------------------------ SwiGLU, rotary
    "SwiGLU (gate/up GEMM + silu·mul)": "SwiGLU（gate/up GEMM + silu·mul）",
    ("A gated MLP projects the same input twice (gate and up), applies SiLU to the gate and multiplies: four kernels, "
     "with three intermediates written and read back. One GEMM with both weight matrices stacked reads the input once; "
     "one elementwise kernel then reads gate and up in place and writes only the product."):
        ("门控 MLP 对同一个输入做两次投影（gate 和 up），对 gate 做 SiLU 再相乘：四个内核，三个中间结果写回显存再读出。把两个权重"
         "矩阵堆叠起来的一个 GEMM 只读一次输入；接着一个逐元素内核原地读取 gate 和 up，只写出乘积。"),
    "one GEMM over the concatenated gate and up weights, then one Triton kernel computing silu(gate)·up from its column views":
        "一个 GEMM 作用在拼接后的 gate 与 up 权重上，再用一个 Triton 内核从它的列视图计算 silu(gate)·up",
    "a = silu(x W_gateᵀ) · (x W_upᵀ)": "a = silu(x W_gateᵀ) · (x W_upᵀ)",
    "silu·mul is computed in fp32 and rounded once (eager rounds twice).": "silu·mul 用 fp32 计算、只舍入一次（eager 舍入两次）。",
    "Rotary embedding (Q+K)": "旋转位置编码（Q+K）",
    ("Rotary position embedding, written as transformers writes it, is a multiply, two slices, a negation, a "
     "concatenation, a second multiply and an add, for q and again for k: ten kernels, each reading and writing a whole "
     "(batch, heads, sequence, head_dim) tensor. One kernel reads each q and k element once, with its cos and sin row, "
     "and writes the rotated value."):
        ("按 transformers 的写法，旋转位置编码是一次乘法、两次切片、一次取负、一次拼接、第二次乘法和一次加法，q 做一遍、k 再做一遍："
         "十个内核，每个都读写一整个（batch, heads, sequence, head_dim）张量。一个内核把每个 q、k 元素连同它的 cos、sin 行只读一次，"
         "写出旋转后的值。"),
    "one Triton kernel rotating q and k (all heads, grouped-query attention included)":
        "一个 Triton 内核旋转 q 和 k（所有头，包括分组查询注意力）",
    "t' = t·cos + rotate_half(t)·sin,  rotate_half(t) = (−t[D/2:], t[:D/2])":
        "t' = t·cos + rotate_half(t)·sin，  rotate_half(t) = (−t[D/2:], t[:D/2])",
    "The rotation is computed in fp32 and rounded once (eager rounds three times).":
        "旋转用 fp32 计算、只舍入一次（eager 舍入三次）。",

    # ------------------------------------------------------------------ linear
    "Linear+bias+act": "Linear+偏置+激活",
    ("The GEMM's epilogue adds the bias and applies the activation while the output tile is still in registers: the "
     "pre-activation tensor (4x hidden wide in a transformer MLP) is never written out."):
        "GEMM 的尾处理在输出分块还在寄存器里时加偏置、做激活：激活前的张量（Transformer MLP 中是隐藏维度的 4 倍宽）从不写出。",
    "cuBLASLt bias+activation epilogue (torch._addmm_activation) for ReLU/GELU":
        "ReLU/GELU 用 cuBLASLt 的偏置+激活尾处理（torch._addmm_activation）",

    # ------------------------------------------------------------------ norms
    "Add+RMSNorm": "Add+RMSNorm（残差相加+RMSNorm）",
    ("The residual add writes the sum that the RMSNorm then reads back. " + _RMS + " With the add in the same kernel the "
     "sum is read from registers, and written once for the next residual."):
        ("残差相加写出的和，接着又被 RMSNorm 读回。" + _RMS_ZH + "把相加放进同一个内核后，和直接从寄存器读取，只为下一个残差写出一次。"),
    "one Triton kernel that writes the normalised row, and the sum too where the next residual reads it":
        "一个 Triton 内核写出归一化后的行；下一个残差要读时，也写出和",
    "s = x + r;  y = w · round(s / sqrt(mean(s²) + eps))": "s = x + r；  y = w · round(s / sqrt(mean(s²) + eps))",
    "Statistics are accumulated in fp32 even for fp16/bf16 inputs, as LlamaRMSNorm does.":
        "即使输入是 fp16/bf16，统计量也用 fp32 累加，和 LlamaRMSNorm 一样。",
    "RMSNorm": "RMSNorm",
    _RMS: _RMS_ZH,
    "one Triton kernel for the whole RMSNorm (the first norm of a decoder, with no add before it)":
        "整个 RMSNorm 用一个 Triton 内核（解码器的第一个归一化，前面没有残差相加）",
    "y = w · round(x / sqrt(mean(x²) + eps))": "y = w · round(x / sqrt(mean(x²) + eps))",
    "Add+LayerNorm": "Add+LayerNorm（残差相加+层归一化）",
    ("The residual add and the LayerNorm each read and write the whole activation. One kernel reads both operands once, "
     "keeps the row in registers for the mean and variance, and writes the sum (the residual stream needs it) and the "
     "normalized row."):
        ("残差相加和 LayerNorm 各自都要读写整个激活张量。一个内核把两个操作数只读一次，把这一行留在寄存器里求均值和方差，写出和"
         "（残差流需要它）与归一化后的行。"),
    ("one Triton kernel that writes the normalized output, and the sum too where something else reads it (a pre-norm "
     "residual stream)"):
        "一个 Triton 内核写出归一化结果；别处还要读和时（pre-norm 的残差流），也写出和",
    "Statistics are accumulated in fp32 even for fp16/bf16 inputs.": "即使输入是 fp16/bf16，统计量也用 fp32 累加。",

    # ------------------------------------------------------------------ generic, siblings
    "Elementwise chain": "逐元素算子链",
    ("Consecutive pointwise ops are memory-bound: each reads and writes the whole tensor. One kernel reads the inputs "
     "once and writes the result once."):
        "连续的逐元素算子都受访存限制：每个都要读写整个张量。一个内核把输入只读一次、把结果只写一次。",
    "the chain's subgraph compiled on its own by torch.compile's inductor (generic fallback)":
        "链的子图单独交给 torch.compile 的 inductor 编译（通用兜底方案）",
    "Sibling linears (QKV)": "并列线性层（QKV）",
    ("Horizontal fusion: a transformer layer projects the same input three times, for the queries, keys and values. One "
     "GEMM with the three weight matrices side by side reads the input once instead of three times and costs one launch "
     "instead of three; each projection is then a column slice of the one output. Nothing is saved in the outputs: they "
     "are all still written, because each is read afterwards."):
        ("横向融合：Transformer 层对同一个输入做三次投影，得到查询、键和值。把三个权重矩阵并排放在一个 GEMM 里，输入只读一次而不是"
         "三次，内核启动也只要一次而不是三次；每个投影就是这一个输出的列切片。输出上没有节省：它们仍然都要写出，因为之后都会被读取。"),
    "one GEMM over the concatenated weights (W_1|W_2|...), its output split into column views: no copy":
        "一个 GEMM 作用在拼接后的权重（W_1|W_2|...）上，输出切成列视图：没有拷贝",
    ("The outputs are column slices of one buffer: a consumer that needs them contiguous (a flattening view) makes the "
     "rewrite refuse the group."):
        "输出是同一块缓冲区的列切片：若某个使用者要求它们连续（展平视图），重写就会拒绝这一组。",
}
