"""Strings of the teaching views: breakdown, traffic, stages, worked examples, predictions, sweep, bisect, diagrams."""

STRINGS = {
    # ------------------------------------------------------------------ diagrams
    "diagram.before": ("Unfused", "融合前"),
    "diagram.after": ("Fused", "融合后"),
    "diagram.chip": ("kernels (on chip: registers, shared memory)", "内核（片上：寄存器、共享内存）"),
    "diagram.memory": ("device memory (HBM)", "显存（HBM）"),
    "diagram.kept_on_chip": ("stay in registers", "留在寄存器里"),
    "diagram.caption": ("{launches} launch(es) · {trips} intermediate result(s) written to device memory and read back",
                        "{launches} 次内核启动 · {trips} 个中间结果写回显存再读回"),
    "diagram.caption_device": ("{launches} launch(es) on this {device}; drawn: the one kernel a GPU runs, {trips} "
                               "intermediate result(s) written to device memory and read back",
                               "在这台 {device} 上 {launches} 次内核启动；图中画的是 GPU 上的单个内核：{trips} 个中间结果"
                               "写回显存再读回"),
    "diagram.caption_siblings": ("{launches} launch(es) · the shared input read {reads} time(s)",
                                 "{launches} 次内核启动 · 共享输入被读取 {reads} 次"),

    # ------------------------------------------------------------------ pattern families

    # ------------------------------------------------------------------ worked examples
    "ex.fold.title": ("Conv+BN folded by hand, on this model", "在本模型上手算 Conv+BN 折叠"),
    "ex.fold.none": ("{model} has no Conv+BN chain to fold.", "{model} 中没有可以折叠的 Conv+BN 链。"),
    "ex.fold.chain": ("Conv+BN chain", "Conv+BN 链"),
    "ex.fold.channel": ("Output channel", "输出通道"),
    "ex.fold.values": ("**{chain}**, output channel {channel} of {channels}: the BatchNorm's statistics and the "
                       "folded values.",
                       "**{chain}**，输出通道 {channel}（共 {channels} 个）：BN 的统计量和折叠后的值。"),
    "ex.col.symbol": ("symbol", "符号"),
    "ex.col.meaning": ("meaning", "含义"),
    "ex.col.value": ("value", "数值"),
    "ex.sym.gamma": ("BatchNorm weight (scale)", "BN 的权重（缩放）"),
    "ex.sym.beta": ("BatchNorm bias (shift)", "BN 的偏置（平移）"),
    "ex.sym.mean": ("running mean", "滑动平均的均值"),
    "ex.sym.var": ("running variance", "滑动平均的方差"),
    "ex.sym.eps": ("epsilon (numerical safety)", "epsilon（数值稳定项）"),
    "ex.sym.bias": ("the conv's own bias (0 when it has none)", "卷积自身的偏置（没有时为 0）"),
    "ex.sym.scale": ("folded scale: every weight of the channel is multiplied by it",
                     "折叠后的缩放：该通道的每个权重都乘以它"),
    "ex.sym.folded_bias": ("folded bias: the new conv bias", "折叠后的偏置：新的卷积偏置"),
    "ex.fold.weights": ("First weights of the channel: {before} before, {after} after (each × s = {scale:.6g}).",
                        "该通道的前几个权重：折叠前 {before}，折叠后 {after}（都乘以 s = {scale:.6g}）。"),
    "ex.fold.check": ("On a seeded input of shape {shape}, computed in float64: the largest difference between conv → "
                      "BatchNorm and the folded conv is {diff:.2e} for outputs up to {top:.3g}, i.e. {rel:.2e} "
                      "relative; the stated tolerance is {tol:.0e}: {verdict}",
                      "在形状为 {shape} 的固定种子输入上，用 float64 计算：conv → BN 与折叠后的卷积之间的最大差为 {diff:.2e}"
                      "（输出最大为 {top:.3g}），即相对误差 {rel:.2e}；规定的容差为 {tol:.0e}：{verdict}"),
    "ex.fold.agrees": ("they agree: folding is exact algebra.", "两者一致：折叠是精确的代数变换。"),
    "ex.fold.disagrees": ("they do NOT agree: report this model.", "两者不一致：请报告这个模型。"),
    "ex.fold.f32": ("In float32, as the fused model holds it, the folded conv is {folded:.1e} (relative) from the "
                    "float64 result and the unfused ops are {unfused:.1e}: the difference is rounding, not algebra.",
                    "在 float32 下（融合后的模型就是这样存的），折叠后的卷积与 float64 结果的相对误差为 {folded:.1e}，未融合的"
                    "算子为 {unfused:.1e}：差别来自舍入，而不是代数。"),
    "ex.bytes.title": ("What each version reads and writes", "每个版本读写多少字节"),
    "ex.bytes.dtype": ("dtype of the byte counts", "字节数所用的数据类型"),
    "ex.bytes.none": ("No fusible chain in this model.", "本模型中没有可融合的链。"),
    "ex.bytes.family": ("{family}", "{family}"),
    "ex.col.version": ("op / version", "算子 / 版本"),
    "ex.col.reads": ("reads", "读取"),
    "ex.col.writes": ("writes", "写入"),
    "ex.bytes.unfused_total": ("unfused: {n} kernels together", "融合前：{n} 个内核合计"),
    "ex.bytes.fused_total": ("fused: one kernel (as on a GPU)", "融合后：1 个内核（GPU 上的情形）"),
    "ex.bytes.saved": ("Fusion saves {saved} of device-memory traffic: {n} intermediate result(s) no longer written "
                       "and read back, {kept} still written because something outside the chain reads it.",
                       "融合节省 {saved} 的访存：{n} 个中间结果不再写回显存再读回，{kept} 个仍要写出，因为链外还有算子读它。"),
    "ex.bytes.saved_siblings": ("Fusion saves {saved}: the shared input is read once instead of {n} more time(s); every "
                                "output is still written.",
                                "融合节省 {saved}：共享输入只读 1 次，少读 {n} 次；每个输出仍然都要写出。"),

    # ------------------------------------------------------------------ where the time goes: source
    "teach.source": ("Numbers from", "数据来源"),
    "teach.source.now": ("this session (the loaded model, this machine)", "本次会话（当前模型、这台机器）"),
    "teach.source.report": ("teaching report {name}", "教学报告 {name}"),
    "teach.report.open_title": ("Open a teaching report (measured on a GPU with benchmarks/teach_reports.py)",
                                "打开教学报告（用 benchmarks/teach_reports.py 在 GPU 上测得）"),
    "teach.report.committed": ("Committed report", "仓库中的报告"),
    "teach.report.open": ("Open", "打开"),
    "teach.report.none_committed": ("No teaching report is committed in benchmarks/results yet.",
                                    "benchmarks/results 中还没有提交的教学报告。"),
    "teach.report.upload": ("Or upload one (JSON)", "或者上传一份（JSON）"),
    "teach.report.error": ("Report not opened: {error}", "报告未打开：{error}"),
    "teach.report.model": ("Model in the report", "报告中的模型"),
    "teach.report.caption": ("Measured on {device}, {date}, torch {torch}: {command}",
                             "测量于 {device}，{date}，torch {torch}：{command}"),
    "teach.report.cpu": ("This report was measured on a CPU: these are CPU numbers, not GPU numbers.",
                         "这份报告是在 CPU 上测得的：这些是 CPU 的数字，不是 GPU 的。"),
    "teach.report.model_failed": ("This model failed in the report: {error}", "报告中这个模型测量失败：{error}"),

    # ------------------------------------------------------------------ breakdown
    "teach.bd.title": ("Where one forward's time goes (the reference article's table, measured)",
                       "一次前向的时间花在哪里（参考文章的表，实测）"),
    "teach.bd.profile": ("Profile one forward now ({device}, {dtype}), unfused and fused",
                         "现在对一次前向做 profiling（{device}，{dtype}），融合前和融合后"),
    "teach.bd.press": ("Press the button to profile the loaded model, or open a teaching report measured on a GPU.",
                       "点击按钮对当前模型做 profiling，或者打开一份在 GPU 上测得的教学报告。"),
    "teach.bd.stale": ("This profile is of an earlier model, plan or setting: press the button again for the current one.",
                       "这份 profiling 属于之前的模型、方案或设置：再点一次按钮，测当前的。"),
    "teach.bd.failed": ("The breakdown could not be measured: {error}", "时间分解测量失败：{error}"),
    "teach.bd.cpu": ("CPU profile: there are no kernel launches in the GPU sense. The first part is the framework's "
                     "own time (Python, dispatch, allocation); the rest is the ATen ops' CPU time.",
                     "CPU profiling：这里没有 GPU 意义上的内核启动。第一部分是框架自身的开销（Python、分派、内存分配），"
                     "其余是 ATen 算子的 CPU 时间。"),
    "teach.bd.cpu_limits": (
        "**A CPU profile shows where the CPU's time goes by kind of op**, before and after fusion: each op is timed "
        "as it runs (without the profiler's own cost), and fusion shows up as fewer ops and less time in the kinds "
        "it merges. **It cannot show kernel launch overhead** (on a CPU an op is a function call: nothing is "
        "launched and no device waits), **nor whether an op is bound by memory or by arithmetic** (a timer on the "
        "host does not see memory stalls; that needs hardware counters). The reference article's table (实际计算 / Kernel Launch "
        "/ 内存读写 / 其他开销) is a GPU picture: open the committed H200 teaching report (`{report}`, above: "
        "*Open*) to see it measured.",
        "**CPU 上的 profiling 能显示 CPU 的时间按算子种类花在哪里**，融合前和融合后都有：每个算子运行时单独计时（不含 "
        "profiler 自身的开销），融合表现为算子更少、被合并的那几类算子用时更少。**它显示不了内核启动开销**（在 CPU 上"
        "一个算子就是一次函数调用：没有什么被“启动”，也没有设备在等），**也看不出一个算子受限于访存还是计算**（主机上的"
        "计时器看不到内存停顿，这需要硬件计数器）。参考文章的表（实际计算 / 内核启动 / 内存读写 / 其他开销）是 GPU 上的"
        "情形：打开已提交的 H200 教学报告（`{report}`，见上方的“打开”）就能看到实测结果。"),
    "teach.bd.cpu_fig_title": ("CPU time of one forward by kind of op", "一次前向的 CPU 时间（按算子种类）"),
    "teach.bd.cpu_x": ("ms of CPU time", "CPU 时间（ms）"),
    "teach.bd.cpu_between": ("between ops (Python, dispatch)", "算子之间（Python、分派）"),
    "teach.bd.cpu_ops": ("ops per forward", "每次前向的算子数"),
    "teach.bd.cpu_read": ("How to read it: one forward took {before:.3f} ms unfused and {after:.3f} ms fused, with "
                          "{ops_before} → {ops_after} ops. The rows show which kinds of op the fused model spends less "
                          "(or more) time in.",
                          "怎么读：一次前向融合前 {before:.3f} ms，融合后 {after:.3f} ms，算子数 {ops_before} → "
                          "{ops_after}。各行显示融合后的模型在哪些种类的算子上花的时间更少（或更多）。"),
    "teach.col.kind": ("kind of op", "算子种类"),
    "teach.kind.convolution": ("convolution", "卷积"),
    "teach.kind.matmul": ("matmul / linear", "矩阵乘 / 线性层"),
    "teach.kind.normalization": ("normalization", "归一化"),
    "teach.kind.activation": ("activation", "激活"),
    "teach.kind.elementwise": ("elementwise, reductions, pooling", "逐元素、归约、池化"),
    "teach.kind.softmax_attention": ("softmax / attention", "softmax / 注意力"),
    "teach.kind.data_movement": ("views, copies, concatenation", "视图、拷贝、拼接"),
    "teach.kind.other": ("other", "其他"),
    "teach.bd.fig_title": ("Share of one forward's wall time", "一次前向墙钟时间的占比"),
    "teach.bd.x_share": ("% of the wall time", "占墙钟时间的百分比"),
    "teach.bd.row_seed": ("reference article's claim (ResNet-50)", "参考文章的说法（ResNet-50）"),
    "teach.bd.row_unfused": ("unfused ({ms:.3f} ms)", "融合前（{ms:.3f} ms）"),
    "teach.bd.row_fused": ("fused ({ms:.3f} ms)", "融合后（{ms:.3f} ms）"),
    "teach.bd.total_wall": ("wall time of one forward", "一次前向的墙钟时间"),
    "teach.cat.launch_host": ("kernel launch and host overhead", "内核启动与主机开销"),
    "teach.cat.framework_cpu": ("framework overhead (CPU: no kernel launches)", "框架开销（CPU：没有内核启动）"),
    "teach.cat.memory_bound": ("memory-bound kernels", "访存受限的内核"),
    "teach.cat.compute_bound": ("compute-bound kernels", "计算受限的内核"),
    "teach.cat.other": ("other (copies)", "其他（拷贝）"),
    "teach.col.category": ("category", "类别"),
    "teach.col.unfused_ms": ("unfused ms", "融合前 ms"),
    "teach.col.unfused_share": ("unfused %", "融合前 %"),
    "teach.col.fused_ms": ("fused ms", "融合后 ms"),
    "teach.col.fused_share": ("fused %", "融合后 %"),
    "teach.col.seed_share": ("reference article's claim %", "参考文章 %"),
    "teach.variant.unfused": ("unfused", "融合前"),
    "teach.variant.fused": ("fused", "融合后"),
    "teach.bd.read": ("How to read it: one forward took {before:.3f} ms unfused and {after:.3f} ms fused. Launch and "
                      "host overhead went from {launch_before:.3f} to {launch_after:.3f} ms, memory-bound kernels from "
                      "{mem_before:.3f} to {mem_after:.3f} ms, with {k_before} → {k_after} kernels per forward.",
                      "怎么读：一次前向融合前 {before:.3f} ms，融合后 {after:.3f} ms。内核启动与主机开销从 {launch_before:.3f} "
                      "降到 {launch_after:.3f} ms，访存受限的内核从 {mem_before:.3f} 降到 {mem_after:.3f} ms，"
                      "每次前向的内核数 {k_before} → {k_after}。"),
    "teach.bd.seed_note": ("The reference article's 40/15/35/10% is its author's ResNet-50 profile, quoted for comparison; its "
                           "\"memory\" is the reading and writing of intermediate results, ours is the time of whole "
                           "kernels bound by memory bandwidth.",
                           "参考文章的 40/15/35/10% 是作者对 ResNet-50 的 profiling，这里引用来对比；它的“内存读写”指中间结果的"
                           "读写，我们这里是整个受显存带宽限制的内核的时间。"),
    "teach.bd.rule_title": ("How each kernel is classified", "每个内核如何归类"),
    "teach.bd.rule": (
        "Wall time is the median of plain forwards (synchronised). Device busy time is the union of the kernels' "
        "device time in one forward (torch.profiler), run node by node so that each kernel is charged to the graph "
        "node that issued it. A kernel is **compute-bound** when its node's arithmetic intensity (FLOPs per byte "
        "moved, from the graph's byte model) is at or above the device's ridge point (peak FLOP/s ÷ bandwidth), "
        "else **memory-bound**; when a node issues several kernels, only its GEMM/convolution kernels take the "
        "node's intensity. Kernels without counts are classified by name (GEMM, convolution and attention kernels "
        "compute-bound, the rest memory-bound); copies are *other*. **Launch and host overhead** = wall time − "
        "device busy time: the device idles while the host issues the next kernel.",
        "墙钟时间是普通前向（每次同步）的中位数。设备忙碌时间是一次前向中各内核设备时间的并集（torch.profiler），并逐节点"
        "运行，让每个内核记到发起它的计算图节点上。若节点的算术强度（每字节访存对应的 FLOP 数，来自计算图的字节模型）不低于"
        "设备的屋脊点（峰值 FLOP/s ÷ 带宽），该内核算作**计算受限**，否则算**访存受限**；一个节点发起多个内核时，只有其中的 "
        "GEMM/卷积内核采用节点的算术强度。没有计数的内核按名字归类（GEMM、卷积、注意力内核为计算受限，其余为访存受限）；"
        "拷贝归入*其他*。**内核启动与主机开销** = 墙钟时间 − 设备忙碌时间：主机下发下一个内核时，设备在空等。"),
    "teach.bd.ridge": ("Ridge point used: {ridge} FLOP/byte.", "所用屋脊点：{ridge} FLOP/字节。"),
    "teach.bd.no_ridge": ("No ridge point is known for this device: kernels were classified by name.",
                          "这台设备的屋脊点未知：内核按名字归类。"),
    "teach.bd.top": ("Largest kernels, {variant}", "最耗时的内核（{variant}）"),
    "teach.col.node": ("graph node", "计算图节点"),
    "teach.col.kernel": ("kernel", "内核"),
    "teach.col.us": ("µs", "µs"),
    "teach.col.intensity": ("FLOP/byte", "FLOP/字节"),

    # ------------------------------------------------------------------ traffic
    "teach.tr.title": ("Memory traffic before and after fusion", "融合前后的访存量"),
    "teach.tr.none": ("No traffic table.", "没有访存表。"),
    "teach.tr.fig_title": ("Bytes moved by one forward", "一次前向的访存字节数"),
    "teach.tr.axis": ("MiB", "MiB"),
    "teach.tr.bar_model": ("byte model", "字节模型"),
    "teach.tr.bar_ncu": ("DRAM, measured (Nsight Compute)", "显存实测（Nsight Compute）"),
    "teach.tr.bar_seed": ("reference article's claim (batch not stated)", "参考文章的说法（未说明批大小）"),
    "teach.tr.whole_model": ("whole model", "整个模型"),
    "teach.col.chain": ("chain", "链"),
    "teach.col.pattern": ("pattern", "模式"),
    "teach.col.before_mb": ("before, MiB", "融合前 MiB"),
    "teach.col.after_mb": ("after, MiB", "融合后 MiB"),
    "teach.col.saved": ("saved", "节省"),
    "teach.tr.model_note": ("Byte model: each op reads its inputs and weights once and writes its outputs once; a fused "
                            "chain no longer writes and reads back its intermediate results. The reference article's ResNet-50 "
                            "figure, 1.2 GB → 0.7 GB, does not say its batch size.",
                            "字节模型：每个算子把输入和权重各读一次、把输出写一次；融合后的链不再写回、读回中间结果。"
                            "参考文章的 ResNet-50 数字 1.2 GB → 0.7 GB 没有说明批大小。"),
    "teach.tr.no_ncu": ("No DRAM measurement here: Nsight Compute measures it on the GPU machine "
                        "(benchmarks/teach_reports.py).",
                        "这里没有显存实测：Nsight Compute 在 GPU 机器上测量（benchmarks/teach_reports.py）。"),
    "teach.tr.ncu_failed": ("Nsight Compute, {variant}: {error}", "Nsight Compute 测量{variant}失败：{error}"),
    "teach.tr.explained": ("**{variant}**: byte model {model:,.1f} MB, measured DRAM {dram:,.1f} MB "
                           "(measured ÷ model = {ratio}). {reasons}",
                           "**{variant}**：字节模型 {model:,.1f} MB，显存实测 {dram:,.1f} MB（实测 ÷ 模型 = {ratio}）。{reasons}"),
    "teach.tr.reason.l2": ("Measured is lower: a tensor the next kernel reads while it is still in the L2 cache ({l2}) "
                           "never reaches device memory, and the model counts every tensor in device memory.",
                           "实测更低：下一个内核读取时仍在 L2 缓存（{l2}）中的张量根本不会到达显存，而字节模型把每个张量都算在显存里。"),
    "teach.tr.reason.rereads": ("Measured is higher: kernels read some tensors more than once (tiling, im2col, "
                                "workspaces, layout changes), which the model counts once.",
                                "实测更高：有些内核会多次读取同一张量（分块、im2col、工作区、布局转换），而字节模型只算一次。"),

    # ------------------------------------------------------------------ stages
    "teach.stages.title": ("The staged table (original → Conv+BN folded → + epilogues → all accepted)",
                           "分阶段表（原始模型 → Conv+BN 折叠 → + 尾处理 → 全部接受的融合）"),
    "teach.stages.none": ("No staged timings yet: run the model on the Run page with the staged table ticked, or open "
                          "a teaching report.",
                          "还没有分阶段计时：在运行页面勾选分阶段表后运行模型，或者打开一份教学报告。"),
    "teach.stages.from_run": ("From this session's run of the loaded model.", "来自本次会话对当前模型的测量。"),
    "teach.stages.from_report": ("From the teaching report.", "来自教学报告。"),
    "teach.stages.read": ("From the original model to the last stage: {before:.3f} → {after:.3f} ms, "
                          "{speedup:.2f}× (the reference article's inspection model: 12.5 → 5.1 ms, 2.45×).",
                          "从原始模型到最后一个阶段：{before:.3f} → {after:.3f} ms，{speedup:.2f} 倍"
                          "（参考文章的工业检测模型：12.5 → 5.1 ms，2.45 倍）。"),
    "teach.col.stage": ("stage", "阶段"),
    "teach.col.latency_ms": ("latency, ms", "推理延迟 ms"),
    "teach.col.throughput": ("throughput, items/s", "吞吐量（样本/秒）"),
    "teach.col.memory": ("peak memory", "显存占用峰值"),
    "teach.col.note": ("note", "备注"),
    "teach.na_cpu_memory": ("n/a (CPU)", "无（CPU）"),
    "teach.stage.none": ("original", "原始模型"),
    "teach.stage.conv_bn": ("Conv+BN folded", "Conv+BN 折叠"),
    "teach.stage.activation": ("+ epilogues (activation, add)", "+ 尾处理（激活、残差相加）"),
    "teach.stage.all": ("all accepted fusions", "全部接受的融合"),
    "teach.stage.same_as": ("same graph as \"{stage}\": not timed again", "计算图与“{stage}”相同：不再重复计时"),

    # ------------------------------------------------------------------ predicted vs measured
    "pred.intro": (
        "Before running a chain, predict its gain from a roofline of the device: its kernels' time is set by "
        "bytes ÷ bandwidth or FLOPs ÷ peak, whichever is larger, and the host spends a fixed cost per launch. Then "
        "compare with the measured gain: chains far from their prediction (more than 1.5× either way) are the "
        "interesting ones, and the table says why.",
        "在运行一条链之前，先用设备的屋脊线模型预测它的收益：内核时间取 字节数 ÷ 带宽 与 FLOP ÷ 峰值算力 中的较大者，主机每次"
        "内核启动花固定的开销。再和实测收益比较：偏离预测超过 1.5 倍（任一方向）的链才有意思，表里会说明原因。"),
    "pred.from_report": ("Predictions and measurements of {model} from {name}.", "{model} 的预测与实测，来自 {name}。"),
    "pred.need_run": ("Predictions only: run the model on the Run page (per-chain timings ticked) to compare them with "
                      "measurements.",
                      "目前只有预测：在运行页面勾选逐链计时并运行模型，才能与实测比较。"),
    "pred.ceilings.title": ("The device's ceilings: {device}", "设备的上限：{device}"),
    "pred.col.what": ("ceiling", "上限"),
    "pred.col.value": ("value", "数值"),
    "pred.col.source": ("source", "来源"),
    "pred.ceil.bandwidth": ("memory bandwidth", "显存带宽"),
    "pred.ceil.flops": ("peak FLOP/s ({dtype})", "峰值算力（{dtype}）"),
    "pred.ceil.ridge": ("ridge point (peak ÷ bandwidth)", "屋脊点（峰值 ÷ 带宽）"),
    "pred.ceil.launch": ("host cost of one kernel launch", "一次内核启动的主机开销"),
    "pred.ceil.l2": ("L2 cache", "L2 缓存"),
    "pred.unknown": ("unknown", "未知"),
    "pred.model": ("Model: t_device = max(FLOPs ÷ peak, bytes ÷ bandwidth) per kernel; t_host = launches × launch "
                   "cost; t = max(t_host, t_device). Unfused, every op is its own kernel; fused, one kernel that moves "
                   "the chain's bytes minus the intermediate results. Predicted gain = t_unfused ÷ t_fused.",
                   "模型：每个内核 t_device = max(FLOP ÷ 峰值算力, 字节数 ÷ 带宽)；t_host = 内核启动次数 × 单次启动开销；"
                   "t = max(t_host, t_device)。融合前每个算子是一个内核；融合后是一个内核，访存量为链的字节数减去中间结果。"
                   "预测收益 = t_融合前 ÷ t_融合后。"),
    "pred.col.predicted": ("predicted gain", "预测收益"),
    "pred.col.measured": ("measured gain", "实测收益"),
    "pred.col.graph": ("measured, CUDA graph", "实测（CUDA Graph）"),
    "pred.col.bound": ("bound by", "受限于"),
    "pred.col.why": ("why far", "偏离原因"),
    "pred.col.intensity": ("FLOP/byte (fused)", "FLOP/字节（融合后）"),
    "pred.bound.compute": ("compute", "计算"),
    "pred.bound.memory": ("memory", "访存"),
    "teach.pred.fig_title": ("Measured against predicted gain, per chain", "每条链的实测收益与预测收益"),
    "teach.pred.x": ("predicted gain (unfused ÷ fused)", "预测收益（融合前 ÷ 融合后）"),
    "teach.pred.y": ("measured gain", "实测收益"),
    "teach.pred.diagonal": ("measured = predicted", "实测 = 预测"),
    "teach.pred.hover": ("predicted %{x:.2f}×, measured %{y:.2f}×", "预测 %{x:.2f} 倍，实测 %{y:.2f} 倍"),
    "teach.why.close.short": ("close to the prediction", "与预测接近"),
    "teach.why.close.long": ("within 1.5× of the prediction.", "与预测相差不到 1.5 倍。"),
    "teach.why.slower_kernel.short": ("slower kernel", "内核更慢"),
    "teach.why.slower_kernel.long": (
        "the fused chain is slower on the device itself (even as a CUDA-graph replay): register pressure or a worse "
        "algorithm, which no byte count sees.",
        "融合后的链在设备上本身就更慢（CUDA Graph 回放也一样）：寄存器压力或更差的算法，字节数看不出来。"),
    "teach.why.host_bound.short": ("host-bound", "受主机限制"),
    "teach.why.host_bound.long": (
        "the host, not the device, set the time: plain calls and CUDA-graph replays disagree, or the model expects "
        "the launches to dominate and the real per-call cost differs from the launch constant.",
        "决定时间的是主机而不是设备：普通调用和 CUDA Graph 回放的结果不一致，或者模型预计内核启动占主导，而每次调用的真实开销"
        "与启动常数不同。"),
    "teach.why.compute_bound.short": ("compute-bound", "计算受限"),
    "teach.why.compute_bound.long": (
        "the fused chain's arithmetic intensity is at or above the ridge point: its time is arithmetic, and the bytes "
        "saved were not on the critical path.",
        "融合后链的算术强度不低于屋脊点：时间花在计算上，省下的访存不在关键路径上。"),
    "teach.why.l2_resident.short": ("already in L2", "中间结果本就在 L2"),
    "teach.why.l2_resident.long": (
        "every intermediate result fusion removes fits in the L2 cache: unfused, the next op read it back from L2, not "
        "from device memory, so little device-memory traffic was really saved.",
        "融合去掉的每个中间结果都装得进 L2 缓存：不融合时，下一个算子是从 L2 而不是显存读回它的，所以真正省下的访存很少。"),
    "teach.why.unexplained.short": ("not explained by the model", "模型无法解释"),
    "teach.why.unexplained.long": (
        "none of the above: for example the unfused library kernels run far below their roofline, or the fused kernel "
        "far above what the model expects.",
        "以上都不是：例如未融合的库内核远低于它们的屋脊线，或者融合内核远好于模型的预期。"),

    # ------------------------------------------------------------------ sweep
    "sweep.intro": (
        "The reference article warns that not every operator should be fused. Here one chain's micro-benchmark is re-run over "
        "batch sizes and dtypes, as a sweep in a process of its own: at small shapes a chain is mostly launch cost, which fusion cuts; "
        "at large shapes its kernels are bound by memory or arithmetic, and a fused kernel under register pressure "
        "can lose.",
        "参考文章提醒：不是所有算子都适合融合。这里在单独的进程中，以一次扫描按不同批大小和数据类型重新跑一条链的微基准：形状小时，链的时间主要是"
        "内核启动开销，融合正好砍掉它；形状大时，内核受访存或计算限制，寄存器压力大的融合内核可能反而更慢。"),
    "sweep.no_chains": ("No accepted chain: accept one on the Fusions page.", "没有已接受的链：请在融合页面接受至少一条。"),
    "sweep.chain": ("Chain", "链"),
    "sweep.batches": ("Batch sizes", "批大小"),
    "sweep.dtypes": ("dtypes", "数据类型"),
    "sweep.what": ("{n} point(s) on {device}, measured as a sweep (`fusion-explorer sweep`, docs/sweeps.md) in a worker "
                   "process: each loads the model at that batch with this chain alone accepted and times the chain "
                   "alone, unfused and fused, alternated; slower means the report's paired test says so.",
                   "在 {device} 上共 {n} 个点，作为一次扫描（`fusion-explorer sweep`，见 docs/sweeps.md）在工作进程中测量："
                   "每个点按该批大小加载模型、只接受这条链，单独给这条链计时，融合前后交替进行；“更慢”由报告的配对检验判定。"),
    "sweep.start": ("Run the sweep", "开始扫描"),
    "sweep.fig_title": ("Speed-up of {chain} as the shape grows", "{chain} 的加速比随形状的变化"),
    "teach.sweep.x": ("batch size", "批大小"),
    "teach.sweep.y": ("speed-up (unfused ÷ fused)", "加速比（融合前 ÷ 融合后）"),
    "teach.sweep.break_even": ("break-even", "收支平衡"),
    "teach.sweep.hover": ("batch %{x}: %{y:.2f}× (medians %{customdata[0]:.3f} → %{customdata[1]:.3f} ms)",
                          "批大小 %{x}：%{y:.2f} 倍（中位数 %{customdata[0]:.3f} → %{customdata[1]:.3f} ms）"),
    "sweep.read_losing": ("The fused chain is slower at {n} point(s), batch {batches}: there fusion does not pay.",
                          "融合后的链在 {n} 个点上更慢（批大小 {batches}）：在那里融合不划算。"),
    "sweep.read_all_win": ("The fused chain is at least as fast at every point measured.",
                           "在所有测量点上，融合后的链都不慢。"),
    "sweep.read_undecided": ("At {n} point(s), batch {batches}, the paired test could not decide with the rounds it "
                             "had: its 95% interval is still too wide to say whether the difference is beyond the 3% "
                             "minimum effect or within it, so neither faster nor slower can be said there (run the sweep "
                             "again, or on a quieter machine).",
                             "在 {n} 个点上（批大小 {batches}），配对检验用现有的轮数无法判定：它的 95% 置信区间仍然太宽，"
                             "说不清差异是超过 3% 的最小效应还是在其以内，所以那里既不能说更快，也不能说更慢"
                             "（请再扫描一次，或换一台更空闲的机器）。"),
    "sweep.col.verdict": ("verdict (paired test)", "结论（配对检验）"),
    "sweep.undecided": ("undecided ({n} rounds)", "无法判定（{n} 轮）"),
    "sweep.why": ("Timings in a shared machine's CPU are noisy; the GPU is where the reference article's warning is sharpest. "
                  "Times are medians of alternated calls; each point's verdict is its run report's paired test (Wilcoxon "
                  "signed-rank over paired rounds: its Hodges-Lehmann estimate, the 95% interval of that same test and "
                  "its p-value, 3% minimum effect), as in a run.",
                  "共享机器上的 CPU 计时噪声较大；参考文章的提醒在 GPU 上最明显。时间是交替调用的中位数；每个点的结论来自其运行报告的配对检验（对配对轮次做 Wilcoxon 符号秩检验：它的 Hodges-Lehmann 估计值、同一检验的 95% 置信区间和 p 值，最小效应 3%），"
                  "与一次运行相同。"),
    "sweep.col.batch": ("batch", "批大小"),
    "sweep.col.dtype": ("dtype", "数据类型"),
    "sweep.col.unfused": ("unfused ms", "融合前 ms"),
    "sweep.col.fused": ("fused ms", "融合后 ms"),
    "sweep.col.speedup": ("speed-up", "加速比"),
    "sweep.col.bytes": ("bytes (unfused)", "访存（融合前）"),
    "sweep.col.error": ("error", "错误"),
    "sweep.folder": ("The sweep's folder, with every point's report: {folder}", "这次扫描的文件夹（含每个点的报告）：{folder}"),
    "sweep.open": ("Open on the Sweeps page", "在扫描页面打开"),

    # ------------------------------------------------------------------ bisect
    "bisect.intro": (
        "When the fused model drifts from the float64 reference more than the unfused one does, which chain is "
        "responsible? Fuse the accepted chains one at a time and rank them by their contribution to the output "
        "error, or bisect the accepted set (about 2·log2(n) fused models). It runs in a process of its own: the app stays usable, and Cancel stops it.",
        "当融合后的模型比未融合的模型更偏离 float64 参照时，是哪条链造成的？逐条单独融合，按它们对输出误差的贡献排序；或者"
        "对已接受的集合做二分（大约 2·log2(n) 个融合模型）。计算在单独的进程中进行：应用仍可使用，按“取消”即可停止。"),
    "bisect.mode": ("Method", "方法"),
    "bisect.mode.both": ("one at a time, then bisect", "逐条融合，再二分"),
    "bisect.mode.one_at_a_time": ("one at a time (ranks all)", "逐条融合（全部排序）"),
    "bisect.mode.bisect": ("bisect (fastest)", "二分（最快）"),
    "bisect.what": ("{n} accepted chain(s), on {device} in {dtype}; the error is ‖out − ref‖ / ‖ref‖ of the model's "
                    "output against the unfused graph in float64.",
                    "{n} 条已接受的链，在 {device} 上用 {dtype}；误差为模型输出相对 float64 未融合计算图的 ‖out − ref‖ / ‖ref‖。"),
    "bisect.start": ("Find the chain", "查找是哪条链"),
    "bisect.errors": ("Output error against float64 ({dtype}, {device}): unfused {unfused:.3e}, all accepted chains "
                      "fused {fused:.3e}; {n} fused model(s) built.",
                      "相对 float64 的输出误差（{dtype}，{device}）：未融合 {unfused:.3e}，全部已接受的链融合后 {fused:.3e}；"
                      "共构建了 {n} 个融合模型。"),
    "bisect.culprit": ("The fused model drifts, and the chain responsible is **{chain}** ({id}). Reject it on the "
                       "Fusions page, or give it another kernel.",
                       "融合后的模型偏离了参照，造成偏离的是 **{chain}**（{id}）。请在融合页面拒绝它，或者给它换一个内核。"),
    "bisect.no_drift": ("The fused model does not drift: its error is within twice the unfused model's. The ranking "
                        "below still shows what each chain adds.",
                        "融合后的模型没有偏离：误差不超过未融合模型的两倍。下面的排序仍然列出了每条链带来的误差。"),
    "teach.bisect.fig_title": ("Each chain's contribution to the output error", "每条链对输出误差的贡献"),
    "teach.bisect.x": ("error with only this chain fused − error unfused", "只融合这条链时的误差 − 未融合时的误差"),
    "bisect.col.rank": ("rank", "排名"),
    "bisect.col.error": ("error, only this chain fused", "只融合这条链时的误差"),
    "bisect.col.contribution": ("contribution", "贡献"),
    "bisect.step": ("bisect: {a} + {b} chains, errors {ea:.2e} and {eb:.2e}: kept the {kept}",
                    "二分：{a} + {b} 条链，误差 {ea:.2e} 和 {eb:.2e}：保留{kept}"),
    "bisect.first_half": ("first half", "前一半"),
    "bisect.second_half": ("second half", "后一半"),
}
