"""The Learn page's own strings: title, general text, tabs, pattern cards and the guided tour."""

STRINGS = {
    # ------------------------------------------------------------------ frame
    "learn.title": ("Operator fusion, taught on your model", "算子融合：在你自己的模型上学"),
    "learn.intro": (
        "Operator fusion merges several consecutive operators into one kernel, like cutting, blanching and "
        "stir-frying in one wok instead of plating the food between steps. It attacks two costs: **kernel "
        "launches** (each one is work for the CPU before the GPU can start) and **memory traffic** (every "
        "intermediate result written to device memory and read back). Each tab below shows one part of that "
        "story on the model loaded in the sidebar, with its own numbers.",
        "算子融合就是把多个连续的算子合并成一个内核：像切菜、焯水、爆炒放在一个锅里完成，省去中间倒腾的功夫。"
        "它砍的是两块开销：**内核启动**（每次启动，CPU 都要先做一份工作，GPU 才能开始）和**访存**（每个中间结果"
        "都要写回显存再读出来）。下面每个标签页都在侧栏加载的模型上，用它自己的数字讲这个故事的一部分。"),
    "learn.need_model": ("Choose a model in the sidebar first.", "请先在侧栏选择一个模型。"),
    "learn.tab.tour": ("Guided tour", "导览"),
    "learn.tab.patterns": ("Patterns", "融合模式"),
    "learn.tab.examples": ("Worked examples", "实例演算"),
    "learn.tab.time": ("Where the time goes", "时间花在哪里"),
    "learn.tab.predicted": ("Predicted vs measured", "预测与实测"),
    "learn.tab.sweep": ("When does it stop paying?", "何时不再划算"),
    "learn.tab.bisect": ("Precision bisect", "精度二分定位"),
    "learn.tab_failed": ("This tab could not be drawn: {error}", "这个标签页无法显示：{error}"),
    "learn.task.progress": ("{message} · {seconds} s", "{message} · {seconds} 秒"),
    "learn.task.cancel": ("Cancel", "取消"),
    "learn.task.cancelled": ("Cancelled: the results below are the points finished before the cancel.",
                             "已取消：下面只有取消前完成的结果。"),
    "learn.task.failed": ("The computation failed: {error}", "计算失败：{error}"),
    "learn.task.cancelled_empty": ("Cancelled before anything was finished.", "已取消：取消前还没有完成任何结果。"),
    "learn.task.timeout": ("Time limit (s)", "时间上限（秒）"),

    # ------------------------------------------------------------------ general text
    "learn.general.title": ("Why fusion pays, and when it does not", "为什么融合有收益，什么时候没有"),
    "learn.general.why": (
        "**Why fusion pays.** `conv → temp1 → bn → temp2 → relu` is three kernel launches, and two intermediate "
        "results written to device memory and read back; the fused kernel is one launch and no round trip. The "
        "reference article (docs/reference-article.zh.txt: the overview of operator fusion this project grew from) quotes a ResNet-50 profile of about 40% compute, 15% kernel launches, 35% memory reads and "
        "writes of intermediates and 10% other. The tab *Where the time goes* measures what your model really "
        "spends, on this machine or from a report measured on a GPU.",
        "**为什么融合有收益。** `conv → temp1 → bn → temp2 → relu` 是 3 次内核启动，外加 2 个写回显存再读出的中间结果；"
        "融合后的内核只启动 1 次，没有往返。参考文章（docs/reference-article.zh.txt，本项目由之发展而来的一篇算子融合概述）引用了一次 ResNet-50 的 profiling：实际计算约 40%，内核启动约 "
        "15%，中间结果的内存读写约 35%，其他开销约 10%。标签页《时间花在哪里》实测你的模型真正把时间花在哪里：在这台机器上，"
        "或者来自一份在 GPU 上测得的报告。"),
    "learn.general.precision": (
        "**Precision.** Fusion reorders arithmetic: a folded BatchNorm rounds differently, a fused softmax keeps "
        "fp32 statistics. Expect differences near the dtype's rounding (about 1e-6 relative in fp32, 1e-3 in fp16 "
        "and bf16). The Results page measures them against float64, and the tab *Precision bisect* finds the chain "
        "responsible when the fused model drifts.",
        "**数值精度。** 算子融合会改变计算顺序：折叠后的 BN 舍入方式不同，融合的 softmax 用 fp32 统计量。误差应在该数据类型"
        "的舍入量级（fp32 约 1e-6 相对误差，fp16 和 bf16 约 1e-3）。结果页以 float64 为参照测量误差；融合后的模型偏离时，"
        "标签页《精度二分定位》能找出是哪条链造成的。"),
    "learn.general.training": (
        "**Training and inference.** Folding BatchNorm is valid only with frozen (inference) statistics: in "
        "training the batch statistics change every step. A fused op with a subtly wrong backward can slow "
        "convergence: be careful with aggressive fusion in training, bold in inference.",
        "**训练与推理。** BN 折叠只在统计量冻结（推理）时成立：训练时每一步的批统计量都在变。反向传播实现有细微偏差的融合"
        "算子会拖慢收敛：训练阶段谨慎使用激进融合，推理阶段可以大胆用。"),
    "learn.general.pays": (
        "**Not every fusion pays.** A fusion can lose in two ways. The fused kernel can be slower on the GPU than "
        "the library kernels it replaces (register pressure, a worse algorithm). Or the fused call can cost the host "
        "more time than the launches it saves, and a model whose GPU waits for the host gets slower. On a GPU the "
        "Results page times every chain both ways (plain calls, and a CUDA graph that takes the host out) and says "
        "which it is. Measure, then reject the chains that lose or give them another kernel.",
        "**不是所有融合都划算。** 融合可能以两种方式变慢。一是融合内核在 GPU 上比它替换的库内核更慢（寄存器压力、算法更差）；"
        "二是融合调用在主机（CPU）上的开销比省下的内核启动还多，而 GPU 一直在等主机的模型就会变慢。在 GPU 上，结果页会用两种"
        "方式给每条链计时（普通调用，以及去掉主机开销的 CUDA Graph 回放），并指出属于哪一种。先测量，再拒绝变慢的链，或者给它"
        "换一个内核。"),
    "learn.evidence.title": ("What the committed H200 results say (read from the files now)",
                             "仓库中已提交的 H200 结果怎么说（现在从文件中读取）"),
    "learn.evidence.chains": (
        "`{file}` ({date}): {n} chains of ResNet-50 fp16 timed alone; {plain} slower fused as plain calls, "
        "{graph} slower even as CUDA-graph replays (the fused kernel itself lost).",
        "`{file}`（{date}）：单独计时了 ResNet-50 fp16 的 {n} 条链；按普通调用有 {plain} 条融合后更慢，按 CUDA Graph "
        "回放仍有 {graph} 条更慢（融合内核本身输了）。"),
    "learn.evidence.host": (
        "`{file}`: host time per call: eager add + layer_norm {eager} µs, the fused Triton add+LayerNorm {triton} µs; "
        "three Q/K/V linears {three} µs, one GEMM and a split {one} µs.",
        "`{file}`：每次调用的主机耗时：eager 的 add + layer_norm 为 {eager} µs，融合的 Triton add+LayerNorm 为 "
        "{triton} µs；Q/K/V 三个 linear 为 {three} µs，一个 GEMM 加切分为 {one} µs。"),

    # ------------------------------------------------------------------ pattern cards
    "learn.patterns.intro": (
        "Every pattern the explorer knows, with a drawing of what goes to device memory and back before and after "
        "fusion (red: an intermediate result written and read back; green: kept in registers), and the chains of "
        "the loaded model that match it.",
        "下面是探索器认识的每一种融合模式：图中画出融合前后哪些张量要写回显存再读出（红色：写回显存再读回的中间结果；绿色："
        "留在寄存器里），以及当前模型中匹配它的链。"),
    "learn.pattern.title_model": ("{label}: {n} chain(s) in {model}", "{label}：{model} 中有 {n} 条链"),
    "learn.pattern.matches": ("`{name}` matches `{steps}`", "`{name}` 匹配 `{steps}`"),
    "learn.pattern.siblings_steps": ("{kinds} ∥ {kinds} ∥ … (two or more reading one input)",
                                     "{kinds} ∥ {kinds} ∥ …（两个或更多，读同一个输入）"),
    "learn.pattern.implementation": ("**Implementation:** {text}", "**实现：** {text}"),
    "learn.pattern.in_model": ("In this model", "本模型中"),
    "learn.pattern.not_found": ("Not found in this model.", "本模型中没有。"),
    "learn.pattern.near_misses": ("Near misses", "差一点匹配的候选"),
    "learn.pattern.saves": ("{launches} launch(es), {bytes}", "{launches} 次内核启动，{bytes}"),
    "learn.col.id": ("id", "编号"),
    "learn.col.accepted": ("accepted", "已接受"),
    "learn.col.saves": ("saves", "节省"),

    # ------------------------------------------------------------------ the guided tour
    "tour.intro": (
        "A path through the app for a class, about 15 minutes. Each step says what to do and what to look at; "
        "a step is ticked when it is done.",
        "一条给课堂用的路线，大约 15 分钟。每一步都说明要做什么、要看什么；完成的步骤会打上勾。"),
    "tour.step": ("Step {n}", "第 {n} 步"),
    "tour.s1.title": ("Load residual_block", "加载 residual_block"),
    "tour.s1.body": (
        "A ResNet basic block: conv → BN → ReLU → conv → BN → add (residual) → ReLU, small enough to see every "
        "op. Look at the sidebar: it says *Loaded: residual_block*.",
        "一个 ResNet 基本块：conv → BN → ReLU → conv → BN → 残差相加 → ReLU，小到每个算子都看得清。看侧栏：它显示"
        "*已加载：residual_block*。"),
    "tour.s1.button": ("Load residual_block", "加载 residual_block"),
    "tour.s2.title": ("See the chain", "看清这条链"),
    "tour.s2.body": (
        "The first chain is **{chain}** ({ops}). Unfused it is three kernels, and two intermediate results go to "
        "device memory and come back (red below). Fused it is one kernel and they stay in registers. On the Graph "
        "page the chain has one colour: hover its nodes for their shapes and bytes.",
        "第一条链是 **{chain}**（{ops}）。不融合时是 3 个内核，2 个中间结果要写回显存再读回（下图红色）；融合后是 1 个内核，"
        "中间结果留在寄存器里。在计算图页面上这条链是同一种颜色：把鼠标悬停在节点上，可以看到形状和字节数。"),
    "tour.s2.link": ("Open the Graph page", "打开计算图页面"),
    "tour.s2.cpu": (
        "On this CPU the fused chain is not one kernel: PyTorch has no fused conv+ReLU for the CPU, so the fused "
        "form runs the conv (BatchNorm folded into its weights) and then ReLU in place: 2 launches instead of 3. "
        "That is why the Graph page's fused node says ⚙ ×2 here, and why its header counts the CPU's saving; on a "
        "GPU one kernel runs the whole chain.",
        "在这台 CPU 上，融合后的链不是 1 个内核：PyTorch 在 CPU 上没有融合的 conv+ReLU，所以融合后先做卷积（BatchNorm "
        "已折叠进权重），再原地做 ReLU：2 次启动而不是 3 次。所以计算图页面上融合节点标着 ⚙ ×2，页首统计的也是 CPU "
        "上的节省量；在 GPU 上，整条链由一个内核完成。"),
    "tour.s2.check": ("I found the chain on the Graph page", "我在计算图页面上找到了这条链"),
    "tour.s3.title": ("Fold BN by hand", "手算 BN 折叠"),
    "tour.s3.body": (
        "In inference BatchNorm is a per-channel affine map, so it folds into the convolution. Output channel 0 "
        "of **{chain}** has γ = {gamma:.6g}, β = {beta:.6g}, μ = {mean:.6g}, σ² = {var:.6g}, ε = {eps:.0e} and a "
        "conv bias b = {bias:.6g}. Compute the scale s and the folded bias b':",
        "推理时 BN 是逐通道的仿射变换，所以可以折叠进卷积。**{chain}** 的输出通道 0：γ = {gamma:.6g}，β = {beta:.6g}，"
        "μ = {mean:.6g}，σ² = {var:.6g}，ε = {eps:.0e}，卷积偏置 b = {bias:.6g}。请算出缩放 s 和折叠后的偏置 b'："),
    "tour.s3.scale": ("scale s", "缩放 s"),
    "tour.s3.bias": ("folded bias b'", "折叠后的偏置 b'"),
    "tour.s3.right": ("Right: s = {scale:.6g}, b' = {bias:.6g}. Every weight of this channel is multiplied by s, and "
                      "the BatchNorm disappears from the graph.",
                      "正确：s = {scale:.6g}，b' = {bias:.6g}。这个通道的每个权重都乘以 s，BN 就从计算图中消失了。"),
    "tour.s3.wrong": ("Not yet: check {which} (within 0.1%).", "还不对：请检查 {which}（允许 0.1% 误差）。"),
    "tour.s4.title": ("Run it", "运行测量"),
    "tour.s4.body": (
        "On the Run page tick *Quick* and press **Run**: the model is timed unfused and fused in a separate "
        "process. Look at the kernel launches (or ATen ops on a CPU) before and after, and at the precision "
        "against float64. This step is ticked when a run of this model is on screen.",
        "在运行页勾选 *快速模式*，然后点击 **运行**：模型会在独立进程里分别按未融合、融合计时。看融合前后的内核启动次数（CPU 上"
        "是 ATen 算子数），以及相对 float64 的精度。屏幕上出现这个模型的测量结果后，这一步就打上勾。"),
    "tour.s4.link": ("Open the Run page", "打开运行页面"),
    "tour.s5.title": ("Read the breakdown", "读懂时间分解"),
    "tour.s5.body": (
        "In the tab *Where the time goes*, press the profile button. Compare the bars before and after fusion: "
        "which part shrank, the launch and host overhead or the memory-bound kernels? On a CPU there are no kernel "
        "launches: the first part is the framework's own time. Then open a teaching report measured on a GPU "
        "(ResNet-50, BERT-base) and compare with the reference article's claim of 15% launches and 35% memory traffic.",
        "在标签页《时间花在哪里》中点击 profiling 按钮。比较融合前后的条形：缩短的是内核启动与主机开销，还是访存受限的内核？"
        "CPU 上没有内核启动：第一部分是框架自身的开销。然后打开一份在 GPU 上测得的教学报告（ResNet-50、BERT-base），"
        "和参考文章“内核启动约 15%、内存读写约 35%”的说法比较。"),
    "tour.s5.where": ("Not profiled yet: use the button in the tab *Where the time goes*.",
                      "还没有做 profiling：请使用标签页《时间花在哪里》中的按钮。"),
    "tour.s5.check": ("I compared the breakdown before and after fusion", "我比较了融合前后的时间分解"),
}
