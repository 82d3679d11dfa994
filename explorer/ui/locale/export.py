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
}
