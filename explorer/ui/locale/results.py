"""Strings of the Results page (``results.*``, ``explorer/ui/pages/results.py``): opening a saved run or teaching
report, the section headings, what the verdicts say and the buttons that act on them.

The figures' and tables' own texts are ``chart.*`` (``locale/charts.py``); a teaching report's panels are
``teach.*`` (``locale/teach.py``); notes and errors of the runtime are its messages (``explorer/messages.py``). Terms: report 报告, teaching report 教学报告, run report 运行报告, verdict 结论,
baseline 基线, precision 精度, staged table 分阶段表, plain calls 普通调用, epilogue 尾处理.
"""

STRINGS = {
    # ------------------------------------------------------------------ opening a report
    "results.open_title": ("Open a saved report (.json)", "打开已保存的报告（.json）"),
    "results.committed": ("Committed report (benchmarks/results)", "仓库中已提交的报告（benchmarks/results）"),
    "results.open": ("Open", "打开"),
    "results.upload": ("Report JSON: a run report (from the Export page or `fusion-explorer run --out`) or a "
                       "teaching report (`benchmarks/teach_reports.py`)",
                       "报告 JSON：运行报告（来自导出页或 `fusion-explorer run --out`）或教学报告"
                       "（`benchmarks/teach_reports.py`）"),
    "results.not_opened": ("Report not opened: {error}", "报告未打开：{error}"),
    "results.opened.run": ("showing {name}, a saved report (not a run of this session)",
                           "正在显示 {name}：一份已保存的报告（不是本次会话的运行结果）"),
    "results.opened.teaching": ("showing {name}, a saved teaching report: its time breakdown, traffic table and staged "
                                "table are below",
                                "正在显示 {name}：一份已保存的教学报告，它的时间分解、访存表和分阶段表在下面"),
    "results.none": ("No results yet: press Run on the Run page, or open a saved report above.",
                     "还没有结果：在运行页点击“运行”，或者在上面打开一份已保存的报告。"),

    # ------------------------------------------------------------------ a teaching report
    "results.teach.title": ("Teaching report: {name}", "教学报告：{name}"),
    "results.teach.intro": ("For each model the report measured: where one forward's time goes, the memory traffic "
                            "before and after fusion, and the staged table — the tables of the reference article (docs/reference-article.zh.txt, the overview of operator fusion this project grew from), regenerated from "
                            "measurements.",
                            "报告测量的每个模型：一次前向的时间花在哪里、融合前后的访存量，以及分阶段表——"
                            "也就是用实测数据重新生成的参考文章（docs/reference-article.zh.txt，本项目由之发展而来的一篇算子融合概述）中的表。"),
    "results.teach.model": ("{name} · batch {batch}{seq} · {dtype} · {format} · {fused} chains fused",
                            "{name} · 批大小 {batch}{seq} · {dtype} · {format} · 融合了 {fused} 条链"),
    "results.teach.seq": (" · sequence {seq}", " · 序列长度 {seq}"),
    "results.teach.notes": ("Notes on {name}", "{name} 的备注"),
    "results.run_title": ("Run report", "运行报告"),

    # ------------------------------------------------------------------ a run report
    "results.title": ("Results: {model}", "结果：{model}"),
    "results.model": ("model", "模型"),
    "results.cpu": ("These are CPU numbers: the fused GPU kernels were not what was timed.",
                    "这些是 CPU 上的数字：计时的不是融合后的 GPU 内核。"),
    "results.compare": ("Unfused vs fused", "融合前与融合后"),
    "results.compare_baselines": ("Unfused vs fused and the baselines", "融合前、融合后与各基线"),
    "results.bound": ("{bound}: the GPU is busy {ms:.3f} ms of each forward", "{bound}：每次前向中 GPU 忙碌 {ms:.3f} ms"),
    "results.bound.host": ("host-bound", "受主机限制"),
    "results.bound.gpu": ("gpu-bound", "受 GPU 限制"),
    "results.variant_notes": ("{variant}: {notes}", "{variant}的说明：{notes}"),
    "results.baselines": ("Baselines (like with like: same memory format; CUDA graphs against reduce-overhead)",
                          "基线（同类相比：内存格式相同；CUDA graph 对比 reduce-overhead）"),
    "results.precision": ("Precision of the model output", "模型输出的精度"),
    "results.per_chain": ("Per chain", "逐链结果"),
    "results.count": ("{n} {label}", "{label} {n} 条"),
    "results.undecided": ("{n} chain(s) undecided: the paired test (Wilcoxon signed-rank over the alternated rounds; "
                          "the speed-up is its Hodges-Lehmann estimate and the interval inverts the same test, so the "
                          "interval excludes 1 exactly when p < 0.05) ran out of rounds while its 95% interval was "
                          "still too wide to say whether the difference is beyond the 3% minimum effect or within it. "
                          "A normal run (more rounds) or a quieter machine decides them.",
                          "{n} 条链尚无定论：配对检验（对交替测量的各轮做 Wilcoxon 符号秩检验；加速比是它的 Hodges-Lehmann "
                          "估计值，置信区间由反演同一检验得到，所以区间不含 1 当且仅当 p < 0.05）在轮数用完时，95% 置信区间"
                          "仍然太宽，说不清差异是超过 3% 的最小效应还是在其以内。普通模式运行（轮数更多）或换一台更空闲的"
                          "机器可以判定它们。"),
    "results.slower": ("{n} chain(s) got slower when fused (dark, cross-hatched bars): not every fusion pays. Reject "
                       "them and run again.",
                       "{n} 条链融合后变慢了（深色、带交叉阴影的条）：并不是每个融合都划算。拒绝它们，再运行一次。"),
    "results.other_model": ("This report was measured on '{model}', not on the model loaded here: load that model to "
                            "act on its verdicts.",
                            "这份报告测的是“{model}”，不是这里加载的模型：加载那个模型后，才能按它的结论操作。"),
    "results.reject_slower": ("Reject the {n} slower chain(s)", "拒绝这 {n} 条变慢的链"),
    "results.rejected": ("Rejected {n} chain(s); the plan on the Fusions page now leaves them unfused.",
                         "已拒绝 {n} 条链；融合页上的融合计划现在不再融合它们。"),
    "results.host_slower": ("{n} chain(s) are slower only as plain calls: replayed as a CUDA graph (no launch or host "
                            "overhead) they are not. On this machine the host, issuing calls, limits them, not the GPU; "
                            "CUDA graphs (a plan option on the Run page) remove that cost.",
                            "{n} 条链只在普通调用时更慢：按 CUDA graph 回放（没有内核启动和主机开销）时并不慢。在这台"
                            "机器上，限制它们的是下发调用的主机，而不是 GPU；CUDA graph（运行页上融合计划的一个选项）"
                            "可以去掉这部分开销。"),
    "results.gpu_slower": ("{n} chain(s) are slower even as CUDA graphs: the fused kernel itself is slower on the GPU "
                           "than the ops it replaces ('{column}' column).",
                           "{n} 条链即使按 CUDA graph 回放也更慢：融合内核本身在 GPU 上就比它替换掉的那些算子慢"
                           "（见“{column}”列）。"),
    "results.separate": ("Use the separate epilogue for the {n} of them whose pattern offers it (conv/linear chains)",
                         "为其中融合模式提供分开尾处理的 {n} 条（卷积/线性层链）改用分开的尾处理"),
    "results.separate_set": ("Kernel choice 'separate_epilogue' set for {n} chain(s): the next run times them with the "
                             "conv or GEMM and its epilogue as separate kernels.",
                             "已为 {n} 条链设置内核选择“separate_epilogue”：下一次运行时，卷积或 GEMM 与它的尾处理"
                             "作为分开的内核计时。"),
    "results.no_chain_timings": ("No per-chain timings in this report (quick mode or per-chain timing off): verdicts "
                                 "below are only what the plan did.",
                                 "这份报告中没有逐链计时（快速模式，或关闭了逐链计时）：下面的结论只说明融合计划做了什么。"),
    "results.no_chains": ("No accepted chains in this report.", "这份报告中没有已接受的链。"),
    "results.stages": ("Staged fusion (the reference article's table)", "分阶段融合（参考文章中的表）"),
    "results.no_stages": ("No staged timings in this report (enable them on the Run page).",
                          "这份报告中没有分阶段计时（可在运行页开启）。"),
    "results.notes": ("Notes", "备注"),
    # ------------------------------------------------------------------ a phase that failed (report.failures)
    "results.phase_failed": ("Phase “{phase}” failed{variant}: {reason}. The other phases' results are below.",
                             "阶段“{phase}”失败{variant}：{reason}。其他阶段的结果见下文。"),
    "results.phase_not_run": ("Phase “{phase}” was not run: {reason}", "阶段“{phase}”未运行：{reason}"),
    "results.phase_variant": (" (while timing {variant})", "（计时 {variant} 时）"),
    "results.fresh_processes": ("{n} fresh measuring process(es) ran the phases after a lost one (a CUDA fault "
                                "or a crash ends its process).",
                                "在一个测量进程失效后，由 {n} 个新的测量进程运行了其余阶段（CUDA 故障或崩溃会结束所在进程）。"),
    "results.phase.reference": ("float64 reference and precision", "float64 参考与精度"),
    "results.phase.main": ("unfused against fused", "融合前对比融合后"),
    "results.phase.chains": ("per-chain timing", "逐链计时"),
    "results.phase.stages": ("staged table", "分阶段表"),
    "results.phase.baselines": ("baselines", "基线"),
}
