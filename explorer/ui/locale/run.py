"""Strings of the Run page (``run.*``, ``explorer/ui/pages/run.py``): the plan and settings measured, the options,
Run and Cancel, the run's progress and outcome.

Terms: measure 测量, plan 融合计划, per-chain timing 逐链计时, staged table 分阶段表, baseline 基线, quick mode
快速模式, repetitions 重复次数, cache 缓存; the runner's own progress and errors are its messages (``explorer/messages.py``).
"""

STRINGS = {
    "run.title": ("Measure {model}", "测量 {model}"),
    "run.plan": ("Plan: **{accepted} of {total}** chains accepted · device **{device}** · dtype **{dtype}** · "
                 "batch **{batch}**",
                 "融合计划：已接受 **{accepted} / {total}** 条链 · 设备 **{device}** · 数据类型 **{dtype}** · "
                 "批大小 **{batch}**"),
    "run.plan_seq": (" · sequence **{seq}**", " · 序列长度 **{seq}**"),
    "run.plan_format": (" · memory format **{format}** · CUDA graphs **{graphs}**",
                        " · 内存格式 **{format}** · CUDA graph 回放 **{graphs}**"),
    "run.on": ("on", "开"),
    "run.off": ("off", "关"),
    "run.per_chain": ("Time every chain alone", "逐链单独计时"),
    "run.per_chain_help": ("Each accepted chain timed on its own, unfused against fused, with its verdict",
                           "每条已接受的链单独计时，融合前对比融合后，并给出结论"),
    "run.stages": ("Staged table", "分阶段表"),
    "run.stages_help": ("The reference article's staged table (docs/reference-article.zh.txt, the overview of operator fusion this project grew from): the model timed at four levels of fusion, none → Conv+BN folded → "
                        "+ epilogues (activation, add) → all accepted",
                        "参考文章（docs/reference-article.zh.txt，本项目由之发展而来的一篇算子融合概述）中的分阶段表：按四个融合级别给模型计时，不融合 → Conv+BN 折叠 → + 尾处理（激活、残差相加）"
                        " → 全部接受的融合"),
    "run.compile_baseline": ("torch.compile baseline", "torch.compile 基线"),
    "run.compile_baseline_help": ("The same model through torch.compile, compared like with like",
                                  "同一个模型经 torch.compile 编译后测量，同类相比"),
    "run.quick": ("Quick", "快速模式"),
    "run.quick_help": ("Fewer repetitions, no per-chain timing: a first look, ResNet-50 on a 2-core CPU in under a "
                       "minute",
                       "重复次数更少，不做逐链计时：先粗看一眼，ResNet-50 在 2 核 CPU 上一分钟内测完"),
    "run.no_runner": ("The measurement runner (explorer.gpu_runner) is not available in this installation.",
                      "这个安装中没有测量程序（explorer.gpu_runner）。"),
    "run.start": ("Run", "运行"),
    "run.cancel": ("Cancel", "取消"),
    "run.estimate": ("The time left is priced from what this run has measured so far (and what earlier runs of this "
                     "model measured on this machine), counted from when you pressed Run, and revised as each phase "
                     "goes; the bar is the share of the time, not of the steps.",
                     "剩余时间按本次运行已经测得的开销估算（以及这台机器上之前运行这个模型时测得的开销），从你点击"
                     "“运行”时开始计时，并随每个阶段的进展修正；进度条表示时间的比例，而不是步骤的比例。"),
    "run.cpu_threads": ("CPU threads", "CPU 线程数"),
    "run.cpu_threads_default": ("default (1 on the CPU)", "默认（CPU 上为 1）"),
    "run.cpu_threads_help": ("torch's intra-op threads in the measuring process. The default is the same for quick and "
                             "normal runs, so that two runs you compare were taken alike; one thread keeps a shared "
                             "CPU's timings stable.",
                             "测量进程中 torch 的算子内线程数。快速模式与普通运行的默认值相同，这样你比较的两次运行"
                             "是在同样条件下测得的；一个线程能让共享 CPU 上的计时更稳定。"),
    "run.host": ("Host while measuring: 1-minute load average up to {load:.1f} on {cores} core(s); {threads} torch "
                 "thread(s) ({how}).",
                 "测量期间的主机：1 分钟平均负载最高 {load:.1f}，共 {cores} 个核心；torch 线程数 {threads}（{how}）。"),
    "run.threads_set": ("your setting", "你的设置"),
    "run.threads_default": ("the default", "默认值"),
    "run.cancelled": ("Run cancelled: nothing was measured; press Run to start again.",
                      "运行已取消：没有测量任何东西；点击“运行”重新开始。"),
    "run.failed": ("Run failed: {error}", "运行失败：{error}"),
    "run.press": ("Press Run: the runner measures the model unfused and with your plan, in a separate process.",
                  "点击“运行”：测量程序会在单独的进程中分别测量融合前的模型和按你的融合计划融合后的模型。"),
    "run.results_current": ("Results for the current plan and settings.", "当前融合计划和设置的结果。"),
    "run.results_current_cached": ("Results for the current plan and settings (answered from the cache: same model, "
                                   "plan and settings).",
                                   "当前融合计划和设置的结果（来自缓存：模型、融合计划和设置都相同）。"),
    "run.results_other": ("Results of the last run (for another plan or settings; press Run to measure this one).",
                          "上一次运行的结果（属于另一个融合计划或设置；点击“运行”测量当前的）。"),
    "run.results_other_cached": ("Results of the last run (for another plan or settings; press Run to measure this "
                                 "one) (answered from the cache: same model, plan and settings).",
                                 "上一次运行的结果（属于另一个融合计划或设置；点击“运行”测量当前的），来自缓存"
                                 "（模型、融合计划和设置都相同）。"),
    "run.duration": ("the measuring process took {s:.0f} s (loading the model there, preparing both graphs, timing "
                     "them; not counting its start)",
                     "测量进程用时 {s:.0f} 秒（在其中加载模型、准备两张图并计时；不含进程启动）"),
    "run.duration_wait": ("{wait:.0f} s from your click to these results: {s:.0f} s in the measuring process "
                          "(loading the model there, preparing both graphs, timing them), {rest:.0f} s starting it "
                          "and reading its report",
                          "从点击到看到结果共 {wait:.0f} 秒：其中 {s:.0f} 秒在测量进程里（加载模型、准备两张图并计时），"
                          "{rest:.0f} 秒用于启动该进程和读取报告"),
    "run.duration_cached": ("answered from the cache now; when it was measured: {wait:.0f} s from the click to the "
                            "results, {s:.0f} s of it in the measuring process",
                            "本次直接取自缓存；当初测量时从点击到结果共 {wait:.0f} 秒，其中 {s:.0f} 秒在测量进程里"),
    "run.to_results": ("See every chart on the Results page", "在结果页查看全部图表"),
}
