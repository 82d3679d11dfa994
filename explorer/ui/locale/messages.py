"""中文 for messages the engine writes in English (near-miss reasons, notes, sources of figures, errors).

``RULES`` is a list of (regular expression matching the whole English message,
Chinese template): the expression's groups fill the template's ``{0}``,
``{1}``, ... in order. The first rule that matches wins, so a specific rule
goes before a general one. A message no rule matches is shown in English with
"（英文原文）" after it (``explorer.ui.i18n.message``). ``tests/test_i18n.py``
checks every rule on the example beside it.
"""

#: (regex, Chinese template, an English example the regex must match)
EXAMPLES: list[tuple[str, str, str]] = [
    # ------------------------------------------------------------------ near misses (explorer.fusion_engine, fusions/*)
    (r"(.+) output has (\d+) consumers \(through a view\)", "{0} 的输出有 {1} 个使用者（经过一个视图）",
     "conv output has 2 consumers (through a view)"),
    (r"(.+) output has (\d+) consumers", "{0} 的输出有 {1} 个使用者", "BatchNorm output has 2 consumers"),
    (r"(\S+) already in chain (\S+)", "{0} 已经属于链 {1}", "add already in chain conv_bn_add_act@conv2d_3"),
    (r"already fused \((.+)\)", "已经是融合算子（{0}）", "already fused (scaled_dot_product_attention)"),
    (r"BatchNorm in training mode: folding is valid only for inference \(frozen statistics\)",
     "BN 处于训练模式：折叠只在推理时成立（统计量冻结）",
     "BatchNorm in training mode: folding is valid only for inference (frozen statistics)"),
    (r"BatchNorm in training mode: its statistics change every step, folding is valid only for inference",
     "BN 处于训练模式：它的统计量每一步都在变，折叠只在推理时成立",
     "BatchNorm in training mode: its statistics change every step, folding is valid only for inference"),
    (r"activation (\S+) not supported by (.+)", "{1} 不支持激活函数 {0}", "activation elu not supported by Conv+BN+act"),
    (r"(\S+) (\S+) not supported by (.+)", "{2} 不支持 {1}（{0}）", "norm group_norm not supported by Add+LayerNorm"),
    (r"add of a constant, not a residual", "加的是常量，不是残差", "add of a constant, not a residual"),
    (r"add operand shape (.+) differs from the conv output (.+) \(broadcast\)",
     "相加操作数的形状 {0} 与卷积输出 {1} 不同（广播）",
     "add operand shape [[1, 64, 1, 1]] differs from the conv output [[1, 64, 56, 56]] (broadcast)"),
    (r"sibling (\S+)s of (\S+) differ in dtype", "{1} 的并列 {0} 数据类型不同", "sibling linears of x differ in dtype"),
    (r"sibling (\S+)s of (\S+): some have a bias, some do not", "{1} 的并列 {0}：有的带偏置，有的不带",
     "sibling linears of x: some have a bias, some do not"),
    (r"scale is a tensor, not a constant", "缩放因子是张量，不是常量", "scale is a tensor, not a constant"),
    (r"softmax output is not the left operand of the next MatMul", "softmax 的输出不是下一个 MatMul 的左操作数",
     "softmax output is not the left operand of the next MatMul"),
    (r"the FC layer is not a plain 1×1 convolution", "全连接层不是普通的 1×1 卷积",
     "the FC layer is not a plain 1×1 convolution"),
    (r"the average pool does not pool to one value per channel", "平均池化没有把每个通道池化成一个值",
     "the average pool does not pool to one value per channel"),
    (r"the multiply does not scale the tensor that was pooled", "乘法缩放的不是被池化的那个张量",
     "the multiply does not scale the tensor that was pooled"),

    # ------------------------------------------------------------------ breakdown notes (explorer.runtime.breakdown)
    (r"CPU profile: no kernel launches in the GPU sense; 'kernels' are the top-level ATen ops of each graph node "
     r"\(their CPU time\) and 'launch and host overhead' is the framework's own time \(Python, dispatch, allocation\)",
     "CPU profiling：没有 GPU 意义上的内核启动；这里的“内核”是每个计算图节点的顶层 ATen 算子（它们的 CPU 时间），"
     "“内核启动与主机开销”是框架自身的时间（Python、分派、内存分配）",
     "CPU profile: no kernel launches in the GPU sense; 'kernels' are the top-level ATen ops of each graph node (their "
     "CPU time) and 'launch and host overhead' is the framework's own time (Python, dispatch, allocation)"),
    (r"device busy time (\S+) ms exceeded the median wall time (\S+) ms by (\S+)%: the busy categories are scaled to "
     r"the wall time",
     "设备忙碌时间 {0} ms 超过了墙钟时间的中位数 {1} ms（多出 {2}%）：忙碌的几类按墙钟时间等比缩放",
     "device busy time 0.478 ms exceeded the median wall time 0.470 ms by 1.7%: the busy categories are scaled to the "
     "wall time"),
    (r"the median of (\d+) profiled forwards by total kernel time", "取 {0} 次 profiling 前向中总内核时间居中的一次",
     "the median of 3 profiled forwards by total kernel time"),
    (r"(\d+) of (\d+) kernels could not be linked to a graph node: classified by name",
     "{1} 个内核中有 {0} 个无法对应到计算图节点：按名字归类",
     "3 of 240 kernels could not be linked to a graph node: classified by name"),

    # ------------------------------------------------------------------ sources of the ceilings (explorer.runtime.ceilings)
    (r"measured now \((\S+)\): copy of (\d+) MiB, bytes read \+ written over the median time",
     "本次实测（{0}）：拷贝 {1} MiB，读写字节数除以中位时间",
     "measured now (2026-12-01): copy of 16 MiB, bytes read + written over the median time"),
    (r"measured now \((\S+)\): (\d+)³ matrix product in (\S+), random data",
     "本次实测（{0}）：{2} 的 {1}³ 矩阵乘法，随机数据",
     "measured now (2026-12-01): 256³ matrix product in fp32, random data"),
    (r"measured now \((\S+)\): host time per torch\.relu_ call on 1024 elements \(CPU: op dispatch, no kernel launch\)",
     "本次实测（{0}）：对 1024 个元素调用一次 torch.relu_ 的主机时间（CPU：算子分派，没有内核启动）",
     "measured now (2026-12-01): host time per torch.relu_ call on 1024 elements (CPU: op dispatch, no kernel launch)"),
    (r"measured now \((\S+)\): host time per torch\.relu_ call on 1024 elements",
     "本次实测（{0}）：对 1024 个元素调用一次 torch.relu_ 的主机时间",
     "measured now (2026-12-01): host time per torch.relu_ call on 1024 elements"),
    (r"unknown on the CPU", "CPU 上未知", "unknown on the CPU"),
    (r"CPU figures measured now on a machine that may be shared: noisy, and not what a GPU would give",
     "CPU 的数字是在可能被共享的机器上现场测的：有噪声，也不代表 GPU 的表现",
     "CPU figures measured now on a machine that may be shared: noisy, and not what a GPU would give"),
    (r"the device properties \(torch\.cuda\.get_device_properties\)", "设备属性（torch.cuda.get_device_properties）",
     "the device properties (torch.cuda.get_device_properties)"),
    (r"not measured: (.+)", "未测量：{0}", "not measured: bf16 matmul not supported"),
    (r"unknown: no entry for this device; measure them \(explorer\.runtime\.ceilings\.measure_ceilings\)",
     "未知：上限表中没有这台设备；请实测（explorer.runtime.ceilings.measure_ceilings）",
     "unknown: no entry for this device; measure them (explorer.runtime.ceilings.measure_ceilings)"),
    (r"measured: device copy (\S+) GB/s \(bytes read \+ written\), (\S+), (\S+)",
     "实测：设备内拷贝 {0} GB/s（读写字节合计），{1}，{2}",
     "measured: device copy 4155 GB/s (bytes read + written), benchmarks/results/bench_kernels_add_layernorm_h200.json, "
     "2026-11-30"),
    (r"measured: 8192³ bf16 matrix product through PyTorch, (\S+) TFLOP/s on random data \(this workplace's KINDS\.md, "
     r"(\S+)\); the lower figure",
     "实测：通过 PyTorch 的 8192³ bf16 矩阵乘法，随机数据上 {0} TFLOP/s（本工作环境的 KINDS.md，{1}）；取较低值",
     "measured: 8192³ bf16 matrix product through PyTorch, 769–798 TFLOP/s on random data (this workplace's KINDS.md, "
     "2026-11-04); the lower figure"),
    (r"assumed equal to bf16 \(the same tensor-core rate in the datasheet\); not measured",
     "假定与 bf16 相同（数据手册中张量核心的速率相同）；未实测",
     "assumed equal to bf16 (the same tensor-core rate in the datasheet); not measured"),
    (r"datasheet: 67 TFLOP/s plain FP32 \(PyTorch's default for fp32 matrix products; cuDNN convolutions use TF32 and "
     r"can go faster\); not measured",
     "数据手册：普通 FP32 为 67 TFLOP/s（PyTorch 对 fp32 矩阵乘法的默认方式；cuDNN 卷积使用 TF32，可以更快）；未实测",
     "datasheet: 67 TFLOP/s plain FP32 (PyTorch's default for fp32 matrix products; cuDNN convolutions use TF32 and can "
     "go faster); not measured"),
    (r"PyTorch's device properties on an H200 of this workplace: 60 MB \(KINDS\.md\)",
     "本工作环境一台 H200 上 PyTorch 报告的设备属性：60 MB（KINDS.md）",
     "PyTorch's device properties on an H200 of this workplace: 60 MB (KINDS.md)"),
    (r"benchmarks/results/(\S+): '(.+)' (\S+) µs minus '(.+)' (\S+) µs of host time: what one more kernel call from "
     r"Python costs on the H200's host",
     "benchmarks/results/{0}：“{1}” {2} µs 减去 “{3}” {4} µs 的主机时间：在 H200 的主机上从 Python 多发一次内核调用的开销",
     "benchmarks/results/host_overhead_lean_h200.json: 'conv+relu eager (2 ops)' 34.0 µs minus 'conv+relu: direct "
     "cudnn call (lean)' 21.1 µs of host time: what one more kernel call from Python costs on the H200's host"),
    (r"not available \((\S+) not found or not readable\)", "不可用（找不到或无法读取 {0}）",
     "not available (host_overhead_lean_h200.json not found or not readable)"),

    # ------------------------------------------------------------------ Nsight Compute (explorer.runtime.traffic)
    (r"Nsight Compute \(ncu\) not found on this machine", "这台机器上没有 Nsight Compute（ncu）",
     "Nsight Compute (ncu) not found on this machine"),
    (r"no CUDA device: DRAM bytes are measured on a GPU only", "没有 CUDA 设备：显存字节数只能在 GPU 上测量",
     "no CUDA device: DRAM bytes are measured on a GPU only"),
    (r"ncu did not finish within (\S+) s", "ncu 没有在 {0} 秒内完成", "ncu did not finish within 180 s"),
    (r"ncu exited with status (\S+): (.*)", "ncu 以状态 {0} 退出：{1}", "ncu exited with status 1: ==ERROR== x"),
    (r"ncu output not readable: (.*)", "无法读取 ncu 的输出：{0}", "ncu output not readable: no CSV header"),
    (r"skipped: the run's time budget is spent", "已跳过：本次运行的时间预算已用完",
     "skipped: the run's time budget is spent"),

    # ------------------------------------------------------------------ progress of the background tasks
    (r"loading the model at batch (\d+)", "按批大小 {0} 加载模型", "loading the model at batch 8"),
    (r"timing batch (\d+), (\S+)", "计时：批大小 {0}，{1}", "timing batch 8, fp32"),
    (r"(\d+) points", "{0} 个点", "5 points"),
    (r"float64 reference", "计算 float64 参照", "float64 reference"),
    (r"the model with every accepted chain fused", "融合全部已接受的链的模型", "the model with every accepted chain fused"),
    (r"only (\S+) fused \((\d+)/(\d+)\)", "只融合 {0}（{1}/{2}）", "only conv_bn_act@conv2d fused (1/2)"),
    (r"bisect: (\d+) \+ (\d+) chains", "二分：{0} + {1} 条链", "bisect: 2 + 2 chains"),
    (r"done", "完成", "done"),
    (r"fusing", "融合中", "fusing"),
    (r"timing the plain forwards", "给普通前向计时", "timing the plain forwards"),
    (r"profiling (\S+) node by node", "逐节点 profiling：{0}", "profiling unfused node by node"),
    (r"profiled", "profiling 完成", "profiled"),

    # ------------------------------------------------------------------ sweep and worked examples
    (r"chain (\S+) is not detected at batch (\d+)", "批大小为 {1} 时没有检测到链 {0}",
     "chain conv_bn_act@conv2d is not detected at batch 8"),
    (r"(\S+) is not a Conv\+BN chain of (\S+)", "{0} 不是 {1} 中的 Conv+BN 链", "x is not a Conv+BN chain of resnet50"),
    (r"channel (\d+) is out of range: the conv has (\d+) output channels", "通道 {0} 超出范围：该卷积有 {1} 个输出通道",
     "channel 99 is out of range: the conv has 64 output channels"),
]

RULES: list[tuple[str, str]] = [(rx, zh) for rx, zh, _ in EXAMPLES]
