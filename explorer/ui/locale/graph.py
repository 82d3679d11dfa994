"""Strings of the Graph page (``graph.*``) and of the drawn graph itself (``gv.*``: node labels, tooltips,
notes and the overview map of ``explorer.graph_view``, which passes its ``lang`` to ``i18n.t_in``).

Terms (the seed's): kernel launch 内核启动, memory traffic 访存量, intermediate 中间结果, chain 链 / 融合链,
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

    # ------------------------------------------------------------------ the drawing (explorer.graph_view)
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
    "gv.tip.runs": ("runs: {implementation}", "实际运行：{implementation}"),
    "gv.tip.replaces": ("replaces {n} nodes: {ops}", "替换 {n} 个节点：{ops}"),
    "gv.tip.launches": ("kernel launches: {n}", "内核启动次数：{n}"),
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
}
