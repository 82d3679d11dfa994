"""中文 for messages the runtime writes in English (plans, notes, sources of figures, progress, errors).

What a fusion family says (a pattern's texts, near misses, refusals, kernel
labels) is not here: each family declares its words in both languages beside its
patterns (``explorer/fusions/<family>.py``'s ``WORDS``), as messages with ids
that ``explorer.ui.i18n`` renders.

``RULES`` is a list of (regular expression matching the whole English message,
Chinese template): the expression's groups fill the template's ``{0}``,
``{1}``, ... in order. The first rule that matches wins, so a specific rule
goes before a general one. A message no rule matches is shown in English with
"（英文原文）" after it (``explorer.ui.i18n.message``). ``tests/test_i18n.py``
checks every rule on the example beside it.

A group named ``msg...`` is a message itself (translated again, a family's
message included); a group named ``text...`` a text of the translation memory
(``i18n.translate_text``).
"""

#: (regex, Chinese template, an English example the regex must match)
EXAMPLES: list[tuple[str, str, str]] = [
    # ------------------------------------------------------------------ plans (explorer.fusions.plan, explorer.ui.state)
    (r"kernel '(\S+)' is not a choice for (\S+): choose one of (.+)", "内核“{0}”不是 {1} 的可选项：可选 {2}",
     "kernel 'x' is not a choice for conv_bn_act@conv2d: choose one of auto, inductor"),
    (r"chain nodes not in the graph: (.+)", "链的节点不在计算图中：{0}", "chain nodes not in the graph: add_3"),
    (r"rewrite failed: (?P<msg>.+)", "重写失败：{0}", "rewrite failed: chain nodes not in the graph: add_3"),
    (r"load a model before uploading a plan", "请先加载模型，再上传融合计划", "load a model before uploading a plan"),
    (r"(.+): a plan file over 5 MB is not a plan", "{0}：超过 5 MB 的文件不是融合计划", "big.json: a plan file over 5 MB is not a plan"),
    (r"restored (\d+) accepted chain\(s\) and (\d+) kernel choice\(s\) from (.+) \(memory format (\S+), CUDA graphs "
     r"on\)",
     "已从 {2} 恢复 {0} 条已接受的链和 {1} 个内核选择（内存格式 {3}，CUDA graph 回放：开）",
     "restored 2 accepted chain(s) and 1 kernel choice(s) from p.json (memory format nchw, CUDA graphs on)"),
    (r"restored (\d+) accepted chain\(s\) and (\d+) kernel choice\(s\) from (.+) \(memory format (\S+), CUDA graphs "
     r"off\)",
     "已从 {2} 恢复 {0} 条已接受的链和 {1} 个内核选择（内存格式 {3}，CUDA graph 回放：关）",
     "restored 2 accepted chain(s) and 1 kernel choice(s) from p.json (memory format nchw, CUDA graphs off)"),
    (r"a plan must be a JSON object", "融合计划必须是一个 JSON 对象", "a plan must be a JSON object"),
    (r"plan has unknown field\(s\): (.+)", "融合计划有未知字段：{0}", "plan has unknown field(s): foo"),
    (r"plan is missing (.+)", "融合计划缺少 {0}", "plan is missing model, fingerprint"),
    (r"plan version (.+) is not supported \(expected (\S+)\)", "不支持融合计划版本 {0}（应为 {1}）",
     "plan version 7 is not supported (expected 1)"),
    (r"plan '(\S+)' must be a non-empty string of at most (\d+) characters",
     "融合计划的“{0}”必须是不超过 {1} 个字符的非空字符串", "plan 'model' must be a non-empty string of at most 200 characters"),
    (r"plan 'accepted' must be a list of chain ids \(strings\)", "融合计划的“accepted”必须是链编号（字符串）的列表",
     "plan 'accepted' must be a list of chain ids (strings)"),
    (r"plan 'accepted' lists a chain twice, or more chains than any model has",
     "融合计划的“accepted”把一条链列了两次，或者列出的链比任何模型都多",
     "plan 'accepted' lists a chain twice, or more chains than any model has"),
    (r"plan 'kernels' must be an object mapping chain ids to kernel names \(strings\)",
     "融合计划的“kernels”必须是从链编号映射到内核名（字符串）的对象",
     "plan 'kernels' must be an object mapping chain ids to kernel names (strings)"),
    (r"plan 'memory_format' must be one of (.+)", "融合计划的“memory_format”必须是以下之一：{0}",
     "plan 'memory_format' must be one of nchw, channels_last"),
    (r"memory_format must be one of (.+), got '(.*)'", "memory_format 必须是以下之一：{0}，实际是“{1}”",
     "memory_format must be one of nchw, channels_last, got 'x'"),
    (r"plan 'cuda_graphs' must be true or false", "融合计划的“cuda_graphs”必须是 true 或 false",
     "plan 'cuda_graphs' must be true or false"),
    (r"this plan was made for model '(.*)' \(graph (\S*)\), not for '(.*)' \(graph (\S*)\)",
     "这个融合计划是为模型“{0}”（计算图 {1}）制定的，不是为“{2}”（计算图 {3}）",
     "this plan was made for model 'resnet50' (graph 0123abcd), not for 'residual_block' (graph 4567ef01)"),
    (r"plan accepts chains this model does not have: (.+)", "融合计划接受了这个模型没有的链：{0}",
     "plan accepts chains this model does not have: x, y"),
    (r"plan chooses a kernel for a chain this model does not have: (.+)", "融合计划为这个模型没有的链选择了内核：{0}",
     "plan chooses a kernel for a chain this model does not have: x"),
    (r"unknown pattern\(s\) (.+): choose from (.+)", "未知的融合模式 {0}：可选 {1}", "unknown pattern(s) x: choose from all, none"),
    (r"cannot reject unknown chain\(s\): (.+)", "无法拒绝未知的链：{0}", "cannot reject unknown chain(s): x"),
    (r"cannot choose a kernel for unknown chain\(s\): (.+)", "无法为未知的链选择内核：{0}",
     "cannot choose a kernel for unknown chain(s): x"),
    (r"(.+) is (\S+) MiB, over the limit of (\S+) MiB", "{0} 有 {1} MiB，超过了 {2} MiB 的上限",
     "plan is 6.0 MiB, over the limit of 5 MiB"),
    (r"(.+) is not valid JSON here: nested (\d+) deep, more than (\d+)", "{0} 在这里不是有效的 JSON：嵌套 {1} 层，超过 {2} 层",
     "plan is not valid JSON here: nested 100 deep, more than 64"),
    (r"(.+) is not valid JSON: not UTF-8 text \((.*)\)", "{0} 不是有效的 JSON：不是 UTF-8 文本（{1}）",
     "plan is not valid JSON: not UTF-8 text (invalid start byte)"),
    (r"(.+) is not valid JSON: (.*)", "{0} 不是有效的 JSON：{1}", "plan is not valid JSON: Expecting value: line 1 column 1"),

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
