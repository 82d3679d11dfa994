"""Strings of the Export page (``export.*``): the plan, the report and the fused model as downloads.

Terms: plan 融合计划, report 报告, fused model 融合后的模型, torch.export archive torch.export 归档.
"""

STRINGS = {
    "export.title": ("Export {model}", "导出 {model}"),
    "export.plan": ("Plan", "融合计划"),
    "export.plan_json": ("Plan JSON ({n} chains accepted)", "融合计划 JSON（已接受 {n} 条链）"),
    "export.report": ("Report", "报告"),
    "export.no_report": ("No report yet: run the model on the Run page.", "还没有报告：请先在运行页运行模型。"),
    "export.report_json": ("Report JSON", "报告 JSON"),
    "export.report_csv": ("Report CSV", "报告 CSV"),
    "export.fused": ("Fused model", "融合后的模型"),
    "export.fused_caption": ("The model your plan makes (explorer.rewrite.apply_plan), built on the CPU in fp32.",
                             "按你的融合计划生成的模型（explorer.rewrite.apply_plan），在 CPU 上以 fp32 构建。"),
    "export.format.pt2": ("torch.export archive (.pt2)", "torch.export 归档（.pt2）"),
    "export.format.onnx": ("ONNX (.onnx)", "ONNX 模型（.onnx）"),
    "export.build": ("Build {format}", "构建 {format}"),
    "export.building": ("Building the fused model ({format})…", "正在构建融合后的模型（{format}）…"),
    "export.download": ("Download {format} ({mb:.1f} MB)", "下载 {format}（{mb:.1f} MB）"),
    "export.failed": ("Could not export {format}: {error}", "无法导出 {format}：{error}"),
    "export.view": ("Graph view (for slides)", "计算图视图（用于幻灯片）"),
    "export.view.caption": ("The view the Graph page draws, with its bands, colours and legend.",
                            "计算图页绘制的视图，包括链的色带、颜色和图例。"),
    "export.view.default": ("The Graph page has not drawn a view in this language yet: this is the original graph "
                            "under its current view options.",
                            "计算图页还没有用这种语言绘制视图：这是按当前视图选项绘制的原始计算图。"),
    "export.view.svg": ("SVG", "SVG"),
    "export.view.png": ("PNG", "PNG"),
    "export.view.svg_help": ("One standalone SVG file of this view (vector: sharp at any size).",
                             "这个视图的独立 SVG 文件（矢量图，任意缩放都清晰）。"),
    "export.view.png_help": ("This view as a PNG image (twice the screen size).",
                             "这个视图的 PNG 图片（屏幕尺寸的两倍）。"),
    "export.view.png_missing": ("PNG needs `cairosvg`: `pip install 'fusion-explorer[png]'`.",
                                "PNG 需要 `cairosvg`：`pip install 'fusion-explorer[png]'`。"),
}
