"""Strings of the Fusions page (``fusions.*``), the verdict labels of a report (``verdict.*``, one per
``explorer.report.VERDICTS``). The kernel choices a plan may name are the registry's words
(``explorer.fusions.base.KERNEL_CHOICES``: messages of ``explorer.fusions.base.WORDS``).

Terms: chain 链, accept / reject 接受 / 拒绝, pattern 融合模式, kernel 内核, kernel launch 内核启动,
memory traffic 访存量, intermediate 中间结果, extra output 额外输出, speed-up 加速比, verdict 结论,
near miss 差一点匹配的候选 (as on the Learn page), plan 融合计划, epilogue 尾处理.
"""

STRINGS = {
    "fusions.title": ("Fusible chains in {model}", "{model} 中可融合的链"),
    "fusions.none": ("No fusible chain was found in this model. The near misses below say why candidates were "
                     "refused.",
                     "这个模型中没有找到可融合的链。下面“差一点匹配的候选”说明了候选为什么被拒绝。"),
    # bulk actions
    "fusions.bulk.pattern": ("Pattern", "融合模式"),
    "fusions.bulk.accept_pattern": ("Accept all of it", "接受此模式"),
    "fusions.bulk.reject_pattern": ("Reject all of it", "拒绝此模式"),
    "fusions.bulk.kernel": ("Kernel for all of it", "此模式全部链的内核"),
    "fusions.bulk.set_kernel": ("Set kernel", "设置内核"),
    "fusions.bulk.accept_all": ("Accept all", "全部接受"),
    "fusions.bulk.reject_all": ("Reject all", "全部拒绝"),
    "fusions.filter": ("Show patterns", "显示的融合模式"),
    "fusions.filter_placeholder": ("all patterns", "全部融合模式"),
    # the table
    "fusions.col.accept": ("accept", "接受"),
    "fusions.col.accept_help": ("Fuse this chain", "融合这条链"),
    "fusions.col.chain": ("chain", "链"),
    "fusions.col.chain_help": ("The chain's ops by module path; its id is in the last column",
                               "按模块路径列出的链中算子；链的编号在最后一列"),
    "fusions.col.pattern": ("pattern", "融合模式"),
    "fusions.col.kernel": ("kernel", "内核"),
    "fusions.col.kernel_help": ("The plan's kernel choice for this chain: {choices}",
                                "融合计划为这条链选择的内核：{choices}"),
    "fusions.col.launches": ("launches", "省下的启动"),
    "fusions.col.launches_help": ("Kernel launches saved", "省下的内核启动次数"),
    "fusions.col.mib": ("MiB saved", "省下的 MiB"),
    "fusions.col.mib_help": ("Intermediate traffic saved (graph byte model, fp32)",
                             "省下的中间结果访存量（按计算图的字节模型，fp32）"),
    "fusions.col.extra": ("extra outputs", "额外输出"),
    "fusions.col.extra_help": ("Intermediates the fused kernel must still write",
                               "融合内核仍须写出的中间结果"),
    "fusions.col.speedup": ("speed-up", "加速比"),
    "fusions.col.speedup_paired_help": (
        "Measured, this chain alone: the Hodges-Lehmann estimate of the paired ratios unfused ÷ fused, the "
        "signed-rank test's own estimate (the Results page shows its 95% interval from that test)",
        "实测，单独这条链：配对的融合前 ÷ 融合后之比的 Hodges-Lehmann 估计，即符号秩检验自己的估计值（结果页给出由同一检验"
        "得到的 95% 置信区间）"),
    "fusions.not_in_report": ("not in the report (not accepted when it ran)", "报告中没有（运行时未被接受）"),
    "fusions.col.speedup_help": ("Measured, this chain alone: unfused time / fused time",
                                 "实测，只看这条链：未融合时间 / 融合后时间"),
    "fusions.col.verdict": ("verdict", "结论"),
    "fusions.col.id": ("id", "编号"),
    "fusions.col.also": ("also possible", "也可以"),
    "fusions.col.also_help": ("Other ways to fuse these nodes, which the pattern order did not take: choose one in "
                              "the one-chain panel below",
                              "这些节点的其他融合方式（模式顺序没有选它们）：在下面的单条链面板中选择"),
    "fusions.alt.then": (", then ", "，然后 "),
    "fusions.alt.instead": ("chosen instead of {chain}", "替代 {chain}"),
    "fusions.alt.title": ("**Also possible** (competing fusions of the same nodes):",
                          "**也可以**（同一组节点的其他融合方式）："),
    "fusions.alt.use": ("Use this instead", "改用这个"),
    "fusions.alt.in_use": (" — in use", " —— 使用中"),
    "fusions.alt.note": ("The run measures a chosen alternative like any chain: compare the two on the Results page.",
                         "运行时会像测量其他链一样测量所选的替代方案：可在结果页比较两者。"),
    "fusions.col.id_help": ("The chain's stable id (plans and reports use it)", "链的固定编号（融合计划和报告都用它）"),
    "fusions.kernel_refused": ("{chain}: '{choice}' is not a kernel of {pattern} (choose {choices})",
                               "{chain}：“{choice}”不是 {pattern} 的内核（可选 {choices}）"),
    "fusions.kernel_not_changed": ("Kernel not changed: {line}.", "内核未更改：{line}。"),
    "fusions.summary": (
        "{accepted} of {chains} accepted · would save {launches} launches and {traffic} of memory traffic (graph "
        "byte model, fp32).",
        "{chains} 条链中已接受 {accepted} 条 · 可省下 {launches} 次内核启动和 {traffic} 访存量（按计算图的字节模型，fp32）。"),
    "fusions.summary_device": (
        "{accepted} of {chains} accepted · on {device} would save {launches} kernel launches ({before} → {after}) and "
        "{traffic} of memory traffic (graph byte model, fp32).",
        "{chains} 条链中已接受 {accepted} 条 · 在 {device} 上可省下 {launches} 次内核启动（{before} → {after}）和 "
        "{traffic} 访存量（按计算图的字节模型，fp32）。"),
    "fusions.col.launches_device_help": ("Kernel launches saved on {device} with this chain's kernel choice",
                                         "按这条链选择的内核，在 {device} 上省下的内核启动次数"),
    "fusions.summary_measured": (" Speed-up and verdict: the latest report of this model (Results page).",
                                 "加速比和结论来自这个模型最近的一份报告（结果页）。"),
    "fusions.summary_run": (" Run the model (Run page) to see each chain's measured speed-up here.",
                            "运行模型（运行页）后，这里会显示每条链实测的加速比。"),
    # one chain
    "fusions.one.title": ("One chain: details, accept or reject", "单条链：详情、接受或拒绝"),
    "fusions.one.chain": ("Chain", "链"),
    "fusions.one.accepted": ("accepted", "已接受"),
    "fusions.one.rejected": ("rejected", "已拒绝"),
    "fusions.one.details": (
        "**{pattern}** — {state}  \nid: {id}  \nops: {ops}  \norigin: {origin}  \nsaves {launches} launch(es) "
        "and {bytes}",
        "**{pattern}** — {state}  \n编号：{id}  \n算子：{ops}  \n来源：{origin}  \n省下 {launches} 次内核启动和 "
        "{bytes} 访存量"),
    "fusions.one.extra": ("  \nextra outputs kept: {outputs}", "  \n保留的额外输出：{outputs}"),
    "fusions.one.measured": ("  \nmeasured: {speedup:.2f}× ({verdict})", "  \n实测：{speedup:.2f}×（{verdict}）"),
    "fusions.one.caveats": ("**Before you accept:**", "**接受之前：**"),
    "fusions.one.accept": ("Accept this chain", "接受这条链"),
    "fusions.one.reject": ("Reject this chain", "拒绝这条链"),
    "fusions.one.kernel": ("Kernel for this chain (the plan's kernel choice)", "这条链的内核（融合计划中的内核选择）"),
    # near misses
    "fusions.near.title": ("Near misses: why these were not fused", "差一点匹配的候选：为什么没有融合"),
    "fusions.near.pattern": ("pattern", "融合模式"),
    "fusions.near.nodes": ("nodes", "节点"),
    "fusions.near.reason": ("reason", "原因"),
    "fusions.near.none": ("No candidate was refused.", "没有被拒绝的候选。"),
    # the plan
    "fusions.plan.title": ("Plan", "融合计划"),
    "fusions.plan.download": ("Download plan (JSON)", "下载融合计划（JSON）"),
    "fusions.plan.upload": ("Restore choices from a plan", "从融合计划恢复选择"),
    "fusions.plan.error": ("Plan not applied: {error}", "融合计划未应用：{error}"),

    # ------------------------------------------------------------------ verdicts (explorer.report.VERDICTS)
    "verdict.faster": ("faster", "更快"),
    "verdict.slower": ("slower", "更慢"),
    "verdict.same": ("no significant difference", "无显著差异"),
    "verdict.no_kernel": ("no fused kernel here", "这里没有融合内核"),
    "verdict.not_measured": ("not measured", "未测量"),
}

#: The kernel choices' descriptions (``KERNEL_CHOICES``), by their English text.
