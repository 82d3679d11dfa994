"""Strings of the Graph page (``graph.*``) and of the drawn graph itself (``gv.*``: node labels, tooltips,
notes and the overview map of ``explorer.ui.graph``, which passes its ``lang`` to ``i18n.t_in``).

Terms (the reference article's): kernel launch 内核启动, memory traffic 访存量, intermediate 中间结果, chain 链 / 融合链,
fused kernel 融合内核, accepted / rejected 已接受 / 已拒绝, near miss 差一点匹配的候选 (as on the Learn page),
module 模块, op 算子, node 节点, neighbourhood 邻域, hop 跳.
"""

STRINGS = {
    # ------------------------------------------------------------------ the page
    "graph.applying": ("Applying the accepted fusions (the engine's rewrite)…", "正在应用已接受的融合（引擎改写计算图）…"),
    "graph.summary": (
        "**{model}** · {ops} ops in **{nodes}** graph nodes · **{accepted} / {chains}** fusible chains accepted · "
        "they save **{launches}** kernel launches and **{traffic}** of traffic · **{near}** near misses",
        "**{model}** · {ops} 个算子，计算图中 **{nodes}** 个节点 · 已接受 **{accepted} / {chains}** 条可融合的链 · "
        "省下 **{launches}** 次内核启动和 **{traffic}** 访存量 · **{near}** 个差一点匹配的候选"),
    "graph.summary_device": (
        "**{model}** · {ops} ops in **{nodes}** graph nodes · **{accepted} / {chains}** fusible chains accepted · "
        "on **{device}** they save **{launches}** kernel launches ({before} → {after}) and **{traffic}** of traffic · "
        "**{near}** near misses",
        "**{model}** · {ops} 个算子，计算图中 **{nodes}** 个节点 · 已接受 **{accepted} / {chains}** 条可融合的链 · "
        "在 **{device}** 上省下 **{launches}** 次内核启动（{before} → {after}）和 **{traffic}** 访存量 · "
        "**{near}** 个差一点匹配的候选"),
    "graph.cpu_launches": (
        "On the CPU a fused chain still runs some of its ops one after another: Conv+BN+ReLU becomes conv (with the "
        "BatchNorm folded into its weights) then ReLU in place, 2 launches instead of 3 (⚙ ×2 on its node); on a GPU "
        "one fused kernel runs it (3 → 1). The saving above is this CPU's; with CUDA the same plan would save "
        "{gpu_saved} ({gpu_before} → {gpu_after}).",
        "在 CPU 上，融合后的链仍有部分算子依次单独运行：Conv+BN+ReLU 变成卷积（BatchNorm 已折叠进权重）再原地做 ReLU，"
        "2 次启动而不是 3 次（节点上标 ⚙ ×2）；在 GPU 上由一个融合内核完成（3 → 1）。上面的节省量是这台 CPU 的；"
        "换成 CUDA，同一个融合计划会省下 {gpu_saved} 次（{gpu_before} → {gpu_after}）。"),
    "graph.whole": ("(whole graph)", "（整个计算图）"),
    "graph.mode.original": ("Original", "原始"),
    "graph.mode.fused": ("Fused", "融合后"),
    "graph.mode.side": ("Side by side", "并排对比"),
    "graph.view": ("View", "视图"),
    "graph.view_help": ("The graph as captured, after the accepted fusions, or both side by side",
                        "捕获到的原始计算图、应用已接受的融合之后的计算图，或两者并排"),
    "graph.one_chain": ("Show one chain", "只看一条链"),
    "graph.one_chain_help": ("The chain with its neighbourhood (hops in Layout)", "这条链及其邻域（跳数在“布局”中设置）"),
    "graph.layout": ("Layout", "布局"),
    "graph.layout_help": ("Collapse modules, direction, neighbourhood", "折叠模块、方向、邻域"),
    "graph.collapse": ("Collapse modules", "折叠模块"),
    "graph.collapse_none": ("no collapse", "不折叠"),
    "graph.collapse_depth": ("depth {depth}", "深度 {depth}"),
    "graph.collapse_help": ("One node per module at this origin-name depth (layer1, encoder.layer.3)",
                            "按来源名称的这一层级，每个模块画成一个节点（如 layer1、encoder.layer.3）"),
    "graph.expand": ("Expand modules", "展开模块"),
    "graph.expand_help": ("Open these collapsed modules one level", "把这些已折叠的模块展开一层"),
    "graph.expand_placeholder": ("Choose modules", "选择模块"),
    "graph.direction": ("Direction", "方向"),
    "graph.direction.TB": ("top to bottom", "从上到下"),
    "graph.direction.LR": ("left to right", "从左到右"),
    "graph.hops": ("Hops", "跳数"),
    "graph.hops_help": ("Neighbourhood radius around the chain shown", "所显示链周围邻域的半径（跳数）"),
    "graph.search": ("Find ops (op, id or origin)", "按算子、编号或来源查找"),
    "graph.search_placeholder": ("e.g. softmax, layer3.2.conv2", "例如 softmax、layer3.2.conv2"),
    "graph.matches": ("Matches ({n})", "匹配项（{n}）"),
    "graph.prev": ("Previous match", "上一个匹配项"),
    "graph.next": ("Next match", "下一个匹配项"),
    "graph.no_match": ("No op matches '{query}'.", "没有与“{query}”匹配的算子。"),
    "graph.in_neighbourhood": (
        "{shown} of {total} matches are in this chain's neighbourhood ({hops} hops); show '{whole}' to see them all.",
        "{total} 个匹配项中有 {shown} 个在这条链的邻域内（{hops} 跳）；选择“{whole}”可看到全部。"),
    "graph.matches_marked": (
        "{n} matches, each marked with a pink border; the view opens on match {i}: {node}.",
        "共 {n} 个匹配项，每个都用粉色边框标出；视图定位在第 {i} 个：{node}。"),
    "graph.fuse_failed": ("Could not apply the fusions for the fused view: {error}",
                          "无法为融合视图应用融合：{error}"),
    "graph.title.original": ("Original", "原始计算图"),
    "graph.title.fused": ("After the accepted fusions", "应用已接受的融合之后"),
    "graph.title_counts": ("**{title}**: {nodes} nodes, {launches} kernel launches",
                           "**{title}**：{nodes} 个节点，{launches} 次内核启动"),
    "graph.drawing": ("Drawing {drawn} of {total} nodes", "画出了 {total} 个节点中的 {drawn} 个"),
    "graph.drawing_collapsed": (" (modules collapsed at depth {depth}: {n} module boxes)",
                                "（模块按深度 {depth} 折叠：{n} 个模块框）"),
    "graph.fused_summary": (
        "The accepted fusions take the graph from **{before} to {after} nodes** and from **{launches_before} to "
        "{launches_after} kernel launches** (−{saved}, the engine's count for the {fused} fused chains). Each fused "
        "chain is one node labelled ⚙ with the kernel it runs on {device} (×n: n kernel launches where there is no "
        "single fused one).",
        "已接受的融合把计算图从 **{before} 个节点减到 {after} 个**，内核启动从 **{launches_before} 次减到 "
        "{launches_after} 次**（−{saved}，按引擎对 {fused} 条已融合链的统计）。每条融合后的链画成一个节点，标有 ⚙ "
        "和它在 {device} 上运行的内核（×n：没有单个融合内核时，需要 n 次内核启动）。"),
    "graph.navigate": (
        "Scroll to move, Ctrl+scroll (or the buttons) to zoom, drag to pan; the map at the top right shows the whole "
        "graph: click it to jump. Hover a node for its op, origin, shapes, bytes, FLOPs and chain.",
        "滚动鼠标滚轮移动视图，Ctrl+滚轮（或按钮）缩放，拖动平移；右上角的小地图显示整个计算图，点击即可跳转。"
        "鼠标悬停在节点上，可查看它的算子、来源、形状、字节数、FLOPs 和所属的链。"),
    # the legend
    "graph.legend.unknown": ("unknown pattern", "未知的融合模式"),
    "graph.legend.rejected": ("rejected chain (dashed)", "已拒绝的链（虚线）"),
    "graph.legend.plain": ("in no chain", "不属于任何链"),
    "graph.legend.band": ("a band: one chain", "一条色带：一条链"),
    "graph.legend.io": ("model input / output", "模型输入 / 输出"),
    "graph.legend.module": ("a module box: collapsed ops (its chains' colour when they are accepted)",
                            "模块框：折叠起来的算子（其中的链被接受时显示链的颜色）"),
    "graph.legend.module_rejected": ("dashed module box: some of its chains rejected",
                                     "虚线模块框：其中有链被拒绝"),
    "graph.legend.fused": ("fused chain: one node, ⚙ its kernel (×n: n launches on this device)",
                           "融合后的链：一个节点，⚙ 后是它的内核（×n：在此设备上启动 n 次）"),
    "graph.legend.no_kernel": ("dashed fused node: no fused kernel here, the same ops run one after another",
                               "虚线的融合节点：这里没有融合内核，原来的算子依次运行"),

    # ------------------------------------------------------------------ the drawing (explorer.ui.graph)
    "gv.scalar": ("scalar", "标量"),
    "gv.status.accepted": ("accepted", "已接受"),
    "gv.status.rejected": ("rejected", "已拒绝"),
    "gv.tip.op": ("op: {op}", "算子：{op}"),
    "gv.tip.origin": ("origin: {origin}", "来源：{origin}"),
    "gv.tip.shape": ("shape: {shapes}  {dtypes}", "形状：{shapes}  {dtypes}"),
    "gv.tip.bytes": ("bytes: read {read}, written {written}", "字节：读 {read}，写 {written}"),
    "gv.tip.flops": ("FLOPs: {flops}", "计算量（FLOPs）：{flops}"),
    "gv.tip.chain": ("chain: {name} ({status})", "链：{name}（{status}）"),
    "gv.tip.chain_id": ("chain id: {id}", "链编号：{id}"),
    "gv.tip.fused_chain": ("fused chain: {name}", "融合后的链：{name}"),
    "gv.tip.pattern": ("pattern: {pattern}", "融合模式：{pattern}"),
    "gv.tip.kernel": ("kernel: {kernel}", "内核：{kernel}"),
    # kernel choices whose names are English words (the others name a library or a kernel: triton, cudnn, sdpa)
    "gv.impl.separate": ("separate", "分开执行"),
    "gv.impl.reference": ("reference", "参考实现"),
    "gv.tip.runs": ("runs: {implementation}", "实际运行：{implementation}"),
    "gv.tip.replaces": ("replaces {n} nodes: {ops}", "替换 {n} 个节点：{ops}"),
    "gv.tip.launches": ("kernel launches: {n}", "内核启动次数：{n}"),
    "gv.tip.launches_device": ("kernel launches on this device: {before} → {n} (what its kernel runs here)",
                               "在此设备上的内核启动次数：{before} → {n}（按它的内核在这里实际运行的计）"),
    "gv.tip.no_fused_kernel": ("no fused kernel for it here: the same ops run one after another",
                               "这里没有它的融合内核：同样的算子依次运行"),
    "gv.tip.module": ("module {module}: {ops} ops, {chains} chains ({accepted} accepted)",
                      "模块 {module}：{ops} 个算子，{chains} 条链（已接受 {accepted} 条）"),
    "gv.tip.run_of": ("run of {ops} ops, {chains} chains ({accepted} accepted)",
                      "连续的 {ops} 个算子，{chains} 条链（已接受 {accepted} 条）"),
    "gv.tip.ops": ("ops: {ops}", "算子：{ops}"),
    "gv.tip.first_last": ("first op: {first}, last op: {last}", "第一个算子：{first}，最后一个算子：{last}"),
    "gv.tip.moved": ("bytes moved unfused: {bytes}", "不融合时的访存量：{bytes}"),
    "gv.tip.expand": ("open it with 'Expand modules'", "用“展开模块”打开它"),
    "gv.group.no_chain": ("no chain", "没有链"),
    "gv.group.counts": ("{ops} ops · {chains} chains", "{ops} 个算子 · {chains} 条链"),
    "gv.group.segment": ("ops {range}", "算子 {range}"),
    "gv.edge.many": ("{bytes} over {n} edges", "{bytes}，共 {n} 条边"),
    "gv.note.no_focus": ("nothing to focus on: no such node", "无法聚焦：没有这个节点"),
    "gv.note.cut": ("neighbourhood cut to the {n} nearest nodes", "邻域只保留最近的 {n} 个节点"),
    "gv.note.not_expanding": ("not expanding {module}: more than {cap} nodes", "未展开 {module}：会超过 {cap} 个节点"),
    "gv.note.collapsed": ("{n} ops are more than the cap of {cap}: modules collapsed at depth {depth}",
                          "{n} 个算子超过了 {cap} 个的上限：模块按深度 {depth} 折叠"),
    "gv.note.segments": (
        "{n} ops and too few module names to collapse them under {cap}: runs of consecutive ops are drawn as one box "
        "each (search or 'Show one chain' opens them)",
        "{n} 个算子，模块名称太少，无法折叠到 {cap} 个以内：每一段连续的算子画成一个框（用查找或“只看一条链”可以打开）"),
    "gv.overview": ("Overview: click or drag to move the view", "全图概览：点击或拖动以移动视图"),
    "gv.describe": ("{drawn} of {total} nodes drawn", "画出了 {total} 个节点中的 {drawn} 个"),

    # ------------------------------------------------------------------ torch.compile, compare, overlays, export
    "graph.mode.compile": ("torch.compile", "torch.compile"),
    "graph.mode.compare": ("Compare", "对比"),
    "graph.compile.mode": ("torch.compile mode", "torch.compile 模式"),
    "graph.compile.mode_help": ("The mode the model is compiled with (inductor; on the run's device and dtype)",
                                "编译模型所用的模式（inductor；使用运行时的设备和数据类型）"),
    "graph.compile.intro": (
        "What torch.compile (inductor) makes of this graph on **{device}** in **{dtype}**: every kernel it generates, "
        "mapped back to our nodes from inductor's provenance records. It compiles in a child process (can take "
        "minutes on a CPU); the result is kept per model, dtype, device and mode.",
        "torch.compile（inductor）在 **{device}** 上、以 **{dtype}** 对这个计算图生成的结果：它生成的每个内核，"
        "按 inductor 的溯源记录对应回我们的节点。编译在子进程中进行（在 CPU 上可能要几分钟）；"
        "结果按模型、数据类型、设备和模式保存。"),
    "graph.compile.start": ("Compile with torch.compile", "用 torch.compile 编译"),
    "graph.compile.cancel": ("Cancel", "取消"),
    "graph.compile.progress": ("{message} ({seconds} s)", "{message}（{seconds} 秒）"),
    "graph.compile.failed": ("torch.compile could not be mapped: {error}", "无法对应 torch.compile 的结果：{error}"),
    "graph.compile.summary": (
        "**{kernels}** inductor kernels ({kinds}) on {device}, torch {torch}, mode {mode}, compiled in {seconds:.1f} s.",
        "**{kernels}** 个 inductor 内核（{kinds}），设备 {device}，torch {torch}，模式 {mode}，编译用时 {seconds:.1f} 秒。"),
    "graph.compile.unmapped": ("{n} kernels could not be traced to a node of ours: {kernels}",
                               "有 {n} 个内核无法追溯到我们的节点：{kernels}"),
    "graph.cmp.both": ("both fuse", "双方都融合"),
    "graph.cmp.partly": ("inductor fuses part", "inductor 只融合一部分"),
    "graph.cmp.ours": ("only ours", "只有我们融合"),
    "graph.cmp.inductor": ("only inductor", "只有 inductor 融合"),
    "graph.cmp.separate": ("separate kernel", "单独的内核"),
    "graph.cmp.candidates": ("Groups only inductor fuses (candidate patterns for us)", "只有 inductor 融合的组（我们可以考虑的模式）"),
    "graph.cmp.candidate_row": ("{ops} ×{n}", "{ops} ×{n}"),
    "graph.cmp.separate_list": ("Ops inductor runs as separate kernels: {ops}", "inductor 单独成内核运行的算子：{ops}"),
    "graph.cmp.table.chain": ("chain", "链"),
    "graph.cmp.table.pattern": ("pattern", "融合模式"),
    "graph.cmp.table.status": ("beside inductor", "与 inductor 相比"),
    "graph.cmp.table.kernels": ("inductor kernels", "inductor 内核"),
    "graph.overlay": ("Colour chains by", "链的着色依据"),
    "graph.overlay_help": ("A measure from the last run's report (or an opened one): kept in Original, Fused and "
                           "Side by side, and in the link (&overlay=)",
                           "来自上一次运行的报告（或打开的报告）的一项指标：在原始、融合后和并排视图中都保留，也写入链接（&overlay=）"),
    "graph.overlay.none": ("pattern", "融合模式"),
    "graph.overlay.speedup": ("measured speed-up", "实测加速比"),
    "graph.overlay.bytes": ("bytes saved", "节省的字节数"),
    "graph.overlay.launches": ("launches saved", "节省的内核启动次数"),
    "graph.overlay.precision": ("precision change (vs float64)", "精度变化（相对 float64）"),
    "graph.overlay.predicted": ("measured / predicted gain", "实测 / 预测收益"),
    "graph.overlay.no_report": ("No report of this model yet: run it (Run page) or open a report (Results page) to "
                                "colour the chains by {measure}.",
                                "还没有这个模型的报告：先运行（运行页）或打开一份报告（结果页），才能按{measure}给链着色。"),
    "graph.overlay.from_report": ("Chains coloured by {measure} from {report}: {n} of {chains} chains have a value.",
                                  "按{measure}给链着色，数据来自 {report}：{chains} 条链中有 {n} 条有数值。"),
    "graph.overlay.no_prediction": ("No roofline prediction for {device}: its ceilings are unknown.",
                                    "{device} 没有屋顶线预测：它的性能上限未知。"),
    "graph.legend.kernels": ("inductor kernels by kind", "按类型区分的 inductor 内核"),
    "graph.legend.compare": ("our chains beside inductor", "我们的链与 inductor 对比"),
    "graph.export": ("Download this view (HTML)", "下载这个视图（HTML）"),
    "graph.export_help": ("One standalone file with the bands, the colours and the legend; it opens offline in any "
                          "browser. (SVG/PNG: use the browser's screenshot of the opened file.)",
                          "一个独立的文件，包含色带、颜色和图例；可以在任何浏览器中离线打开。（SVG/PNG：请对打开的文件截图。）"),
    "gv.cmp.kernel": ("inductor kernel: {name} ({kind})", "inductor 内核：{name}（{kind}）"),
    "gv.cmp.kernel_ops": ("computes {n} of our nodes: {ops}", "计算我们的 {n} 个节点：{ops}"),
    "gv.cmp.touches": ("also reads or computes part of: {nodes}", "还读取或计算以下节点的一部分：{nodes}"),
    "gv.cmp.replaced": ("placed by dataflow (inductor's pattern matcher replaced them): {nodes}",
                        "按数据流归入（inductor 的模式匹配替换了它们）：{nodes}"),
    "gv.cmp.kernels": ("inductor kernels: {kernels}", "inductor 内核：{kernels}"),
    "gv.cmp.status.both": ("torch.compile fuses this chain into one kernel too", "torch.compile 也把这条链融合成一个内核"),
    "gv.cmp.status.partly": ("torch.compile fuses part of this chain", "torch.compile 只融合了这条链的一部分"),
    "gv.cmp.status.ours": ("only we fuse this chain: inductor runs each op as its own kernel",
                           "只有我们融合这条链：inductor 把每个算子作为单独的内核运行"),
    "gv.cmp.status.inductor": ("only torch.compile fuses these ops together", "只有 torch.compile 把这些算子融合在一起"),
    "gv.cmp.candidate": ("candidate pattern: {ops}", "可考虑的模式：{ops}"),
    "gv.cmp.separate": ("inductor runs this op alone: {kernel}", "inductor 单独运行这个算子：{kernel}"),
    "gv.ov.value": ("{measure}: {value}", "{measure}数值：{value}"),
    "gv.ov.verdict": ("verdict: {verdict}", "结论：{verdict}"),
    "gv.ov.no_value": ("no {measure} for this chain in the report", "报告中没有这条链的{measure}"),
    "gv.ov.no_value_short": ("no value", "无数值"),
    "gv.ov.precision_text": ("rel. error {fused} fused, {unfused} unfused ({ratio}×)",
                             "相对误差：融合 {fused}，未融合 {unfused}（{ratio}×）"),
    "gv.ov.predicted_text": ("measured {measured}×, predicted {predicted}× ({ratio}× of the prediction)",
                             "实测 {measured}×，预测 {predicted}×（为预测的 {ratio}×）"),
    "gv.ov.note.speedup": ("unfused time / fused time of each chain timed alone; green: faster",
                           "每条链单独计时：未融合时间 / 融合时间；绿色：更快"),
    "gv.ov.note.bytes": ("intermediate traffic the fused kernel no longer moves", "融合内核不再搬运的中间结果访存量"),
    "gv.ov.note.launches": ("kernel launches saved by the fusion", "融合省下的内核启动次数"),
    "gv.ov.note.precision": ("fused error / unfused error, both against float64; green: no worse",
                             "融合误差 / 未融合误差，均相对 float64；绿色：不更差"),
    "gv.ov.note.predicted": ("measured gain / the roofline prediction; white: as predicted",
                             "实测收益 / 屋顶线预测；白色：与预测一致"),
}
