"""Strings of the Sweeps page (``sweeps.*``, ``explorer/ui/pages/sweeps.py``) and its figures and tables
(``explorer/ui/sweep_views.py``).

Terms: sweep 扫描, point 测量点, sweep folder 扫描文件夹, speed-up 加速比, interval 置信区间, verdict 结论,
cached 已缓存, plan 方案, heatmap 热力图, peak memory 峰值显存, break-even 收支平衡.
"""

STRINGS = {
    "app.page.sweeps": ("Sweeps", "扫描"),
    "sweeps.title": ("Sweeps: many models, plans, shapes and dtypes", "扫描：多个模型、方案、形状与数据类型"),
    "sweeps.intro": ("A sweep measures every point of a grid (models × plans × batch sizes × sequence lengths × "
                     "dtypes × memory formats × CUDA graphs × baselines) with the same runner as the Run page: "
                     "`fusion-explorer sweep` (docs/sweeps.md). Each speed-up below is the paired test of its "
                     "report (Wilcoxon signed-rank: its Hodges-Lehmann estimate and the 95% interval of that test), "
                     "set against the times of the rounds it paired.",
                     "扫描用与运行页相同的测量程序测量网格中的每个测量点（模型 × 方案 × 批大小 × 序列长度 × 数据类型 × "
                     "内存格式 × CUDA 图 × 基线）：`fusion-explorer sweep`（见 docs/sweeps.md）。下面每个加速比都来自其报告的"
                     "配对检验（Wilcoxon 符号秩检验：它的 Hodges-Lehmann 估计值和同一检验的 95% 置信区间），并与它所配对的那些轮次的时间对照。"),
    "sweeps.source": ("Results from", "结果来源"),
    "sweeps.source.folder": ("a sweep folder", "扫描文件夹"),
    "sweeps.source.upload": ("an uploaded file", "上传的文件"),
    "sweeps.upload": ("Sweep results: results.jsonl or results.parquet", "扫描结果：results.jsonl 或 results.parquet"),
    "sweeps.upload_prompt": ("Upload a sweep's results.jsonl or results.parquet.",
                             "请上传扫描的 results.jsonl 或 results.parquet。"),
    "sweeps.no_folders": ("No sweep folder under {root}: run `fusion-explorer sweep ... --out {root}/NAME`, or set "
                          "FUSION_EXPLORER_SWEEPS_ROOT.",
                          "{root} 下没有扫描文件夹：运行 `fusion-explorer sweep ... --out {root}/NAME`，或设置 "
                          "FUSION_EXPLORER_SWEEPS_ROOT。"),
    "sweeps.folder": ("Sweep folder", "扫描文件夹"),
    "sweeps.folder_help": ("Folders under {root} (FUSION_EXPLORER_SWEEPS_ROOT); a folder outside it is refused.",
                           "{root}（FUSION_EXPLORER_SWEEPS_ROOT）下的文件夹；其外的文件夹会被拒绝。"),
    "sweeps.empty": ("This sweep has no finished point yet.", "这个扫描还没有完成的测量点。"),
    "sweeps.summary": ("**{n} points**: {ok} measured, {failed} failed · measured on {devices}",
                       "**{n} 个测量点**：{ok} 个已测量，{failed} 个失败 · 测量设备：{devices}"),
    "sweeps.summary_refused": ("**{n} points**: {ok} measured, {failed} failed, {refused} refused · measured on {devices}",
                               "**{n} 个测量点**：{ok} 个已测量，{failed} 个失败，{refused} 个被拒绝 · 测量设备：{devices}"),
    "sweeps.cpu": ("Some points were measured on the CPU: their numbers are CPU numbers, not GPU numbers.",
                   "部分测量点是在 CPU 上测量的：这些是 CPU 上的数字，不是 GPU 上的。"),
    "sweeps.progress": ("{done} measured, {failed} failed, {refused} refused, {cached} cached of {total} · {running} "
                        "running · {left}",
                        "共 {total} 个：{done} 个已测量，{failed} 个失败，{refused} 个被拒绝，{cached} 个已缓存 · "
                        "{running} 个正在测量 · {left}"),
    "sweeps.left_unknown": ("estimating the time left", "正在估计剩余时间"),
    "sweeps.left_s": ("about {s} s left", "大约还剩 {s} 秒"),
    "sweeps.left_min": ("about {m} min {s} s left", "大约还剩 {m} 分 {s} 秒"),
    "sweeps.last_run": ("Last run {status}: {done} measured, {failed} failed, {refused} refused, {cached} cached of "
                        "{total}.",
                        "上次运行{status}：共 {total} 个，{done} 个已测量，{failed} 个失败，{refused} 个被拒绝，"
                        "{cached} 个已缓存。"),
    "sweeps.run_status.done": ("finished", "已完成"),
    "sweeps.run_status.cancelled": ("cancelled", "已取消"),
    "sweeps.run_status.interrupted": ("interrupted", "被中断"),
    "sweeps.nothing_measured": ("No point of this sweep was measured: see the reasons in the table below.",
                                "这个扫描没有成功测量的测量点：原因见下表。"),
    "sweeps.x": ("Along", "横轴"),
    "sweeps.axis.batch": ("batch size", "批大小"),
    "sweeps.axis.seq_len": ("sequence length", "序列长度"),
    "sweeps.axis.speedup": ("speed-up (unfused ÷ fused), 95% interval", "加速比（融合前 ÷ 融合后），95% 置信区间"),
    "sweeps.axis.speedup_short": ("speed-up", "加速比"),
    "sweeps.axis.vs_compile": ("speed-up (torch.compile ÷ fused), 95% interval",
                               "加速比（torch.compile ÷ 融合后），95% 置信区间"),
    "sweeps.axis.plan": ("plan", "方案"),
    "sweeps.axis.model": ("model", "模型"),
    "sweeps.axis.memory": ("peak memory (MiB)", "峰值显存（MiB）"),
    "sweeps.short.batch": ("batch {n}", "批 {n}"),
    "sweeps.short.seq_len": ("seq {n}", "序列 {n}"),
    "sweeps.with_baselines": ("baselines", "含基线"),
    "sweeps.graphs": ("CUDA graphs", "CUDA 图"),
    "sweeps.break_even": ("break-even", "收支平衡"),
    "sweeps.hover": ("%{x}: speed-up %{y:.2f}× · %{customdata[1]}", "%{x}：加速比 %{y:.2f}× · %{customdata[1]}"),
    "sweeps.heat_hover": ("%{y} · %{x}: speed-up %{customdata:.2f}×", "%{y} · %{x}：加速比 %{customdata:.2f}×"),
    "sweeps.fig.speedup": ("Fused against unfused", "融合后与融合前"),
    "sweeps.fig.compile": ("Fused against torch.compile (default)", "融合后与 torch.compile（默认模式）"),
    "sweeps.fig.heatmap": ("Models × plans, {dtype}, batch {batch}", "模型 × 方案，{dtype}，批大小 {batch}"),
    "sweeps.fig.memory": ("Peak device memory per point", "每个测量点的峰值显存"),
    "sweeps.unfused": ("unfused", "融合前"),
    "sweeps.fused": ("fused", "融合后"),
    "sweeps.h.speedup": ("Speed-up as the shape grows", "加速比随形状的变化"),
    "sweeps.speedup_caption": ("Each marker is a point, coloured by its verdict (green faster, red slower, grey no "
                               "significant difference); the bars are the 95% interval. Click a point to open its "
                               "report.",
                               "每个标记是一个测量点，颜色表示结论（绿色更快，红色更慢，灰色无显著差异）；误差线是 95% "
                               "置信区间。点击测量点可打开其报告。"),
    "sweeps.h.compile": ("Fused against torch.compile", "融合后与 torch.compile"),
    "sweeps.no_compile": ("This sweep measured no baseline: add `baselines = [true]` to compare with torch.compile.",
                          "这个扫描没有测量基线：加入 `baselines = [true]` 即可与 torch.compile 比较。"),
    "sweeps.h.heatmap": ("Models × plans", "模型 × 方案"),
    "sweeps.heat_dtype": ("dtype", "数据类型"),
    "sweeps.heat_batch": ("Batch size", "批大小"),
    "sweeps.h.memory": ("Peak memory", "峰值显存"),
    "sweeps.no_memory": ("Peak memory is measured on CUDA only: this sweep has no CUDA point.",
                         "峰值显存只在 CUDA 上测量：这个扫描没有 CUDA 测量点。"),
    "sweeps.h.stops": ("Where does fusion stop paying?", "融合从哪里开始不再划算？"),
    "sweeps.stops_caption": ("Read from the verdicts along each series: the first size at which the fused model is "
                             "no longer faster, after being faster at a smaller one.",
                             "按每条曲线上的结论读取：在较小形状上更快之后，融合模型第一次不再更快的形状。"),
    "sweeps.no_stops": ("No series with a plan that fuses anything.", "没有包含融合的方案曲线。"),
    "sweeps.stop.never": ("never faster here", "在这里从未更快"),
    "sweeps.stop.pays_one": ("pays at the one size measured ({at}): a trend needs more sizes",
                             "在唯一测量的形状（{at}）上划算：要看趋势需要更多形状"),
    "sweeps.stop.pays": ("pays at every size measured (last: {last})", "在测量的每个形状上都划算（最后一个：{last}）"),
    "sweeps.stop.at": ("stops paying at {at} ({verdict}); last faster at {last}",
                       "在 {at} 处不再划算（{verdict}）；最后一次更快是在 {last}"),
    "sweeps.col.series": ("series", "曲线"),
    "sweeps.col.verdicts": ("verdicts", "结论"),
    "sweeps.col.reading": ("reading", "解读"),
    "sweeps.h.points": ("Every point", "所有测量点"),
    "sweeps.failed": ("{n} point(s) failed: their one-line reasons are in the table.",
                      "{n} 个测量点失败：表中有每个的一行原因。"),
    "sweeps.refused": (("{n} point(s) refused before measuring: the sweep asks of a model what it cannot take (a "
                        "sequence longer than its positions, a batch that does not fit in memory, a plan that does "
                        "not apply). Nothing crashed; their one-line reasons are in the table."),
                       "{n} 个测量点在测量前被拒绝：扫描要求了模型无法接受的输入（序列长于其位置数、批大小放不进内存、"
                       "计划不适用于该图）。没有任何崩溃；表中有每个的一行原因。"),
    "sweeps.col.point": ("point", "测量点"),
    "sweeps.col.status": ("status", "状态"),
    "sweeps.col.verdict": ("verdict", "结论"),
    "sweeps.col.speedup": ("speed-up", "加速比"),
    "sweeps.col.interval": ("95% interval", "95% 置信区间"),
    "sweeps.col.unfused_ms": ("unfused ms (median)", "融合前 ms（中位数）"),
    "sweeps.col.fused_ms": ("fused ms (median)", "融合后 ms（中位数）"),
    "sweeps.col.vs_compile": ("vs torch.compile", "相对 torch.compile"),
    "sweeps.col.vs_compile_pair": ("torch.compile ms · fused ms in the same rounds (medians)",
                                   "torch.compile ms · 同一批轮次中融合后的 ms（中位数）"),
    "sweeps.col.device": ("device", "设备"),
    "sweeps.col.clock": ("SM clock MHz", "SM 时钟 MHz"),
    "sweeps.col.host_busy": ("host CPU busy", "主机 CPU 占用"),
    "sweeps.col.wall": ("wall s", "耗时 s"),
    "sweeps.col.reason": ("reason", "原因"),
    "sweeps.status.ok": ("measured", "已测量"),
    "sweeps.status.failed": ("failed", "失败"),
    "sweeps.status.refused": ("refused", "被拒绝"),
    "sweeps.status.simulated": ("simulated", "模拟"),
    "sweeps.upload_no_reports": ("An uploaded results file has no reports beside it: choose a sweep folder to open a "
                                 "point's report.",
                                 "上传的结果文件旁边没有报告：选择扫描文件夹才能打开测量点的报告。"),
    "sweeps.point": ("Point", "测量点"),
    "sweeps.open_report": ("Open its report", "打开其报告"),
    "sweeps.no_report": ("This point has no report (it failed).", "这个测量点没有报告（测量失败）。"),
    "sweeps.not_opened": ("Report not opened: {error}", "报告未打开：{error}"),
    # a sweep's plans "all" and "none" (fusion-explorer sweep --plan all), in a series' name
    "sweeps.plan.all": ("all", "全部融合"),
    "sweeps.plan.none": ("none", "不融合"),
}
