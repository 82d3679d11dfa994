"""Strings of the app's state module (``state.*``, ``explorer/ui/state.py``): the page boundary's error line,
loading a model, and a run's live progress (its status is one of the runner's messages, ``explorer/messages.py``)."""

STRINGS = {
    "state.unexpected": ("Unexpected error ({type}): {error}", "意外错误（{type}）：{error}"),
    "state.loading": ("Loading {label} (capture with torch.export, detect chains)…",
                      "正在加载 {label}（用 torch.export 捕获计算图，检测可融合的链）…"),
    "state.loading.zoo": ("Building {label} from the zoo (seeded weights), capturing it with torch.export and "
                          "detecting its chains…",
                          "正在从模型库构建 {label}（随机种子权重），用 torch.export 捕获计算图并检测可融合的链…"),
    "state.loading.onnx": ("Importing the ONNX file {label}: checked in a separate process first, its ONNX ops "
                           "mapped onto ATen ops, then its chains detected…",
                           "正在导入 ONNX 文件 {label}：先在单独的进程中检查，再把 ONNX 算子映射为 ATen 算子，然后检测可融合的链…"),
    "state.loading.pt2": ("Loading the torch.export archive {label}: checked in a separate process first (only "
                          "allowed pure ops), then its graph read and its chains detected…",
                          "正在加载 torch.export 归档 {label}：先在单独的进程中检查（只允许纯张量算子），再读取计算图并检测"
                          "可融合的链…"),
    "state.loading.hf": ("Loading the Hugging Face folder {label}: its config and safetensors weights checked in a "
                         "separate process first, then the model built, captured with torch.export and its chains "
                         "detected…",
                         "正在加载 Hugging Face 文件夹 {label}：先在单独的进程中检查配置和 safetensors 权重，再构建模型、"
                         "用 torch.export 捕获计算图并检测可融合的链…"),
    "state.load_left": ("About {left:.0f} s left (as loads like it took on this machine) · {elapsed:.0f} s elapsed",
                        "大约还剩 {left:.0f} 秒（按这台机器上类似的加载用时估计）· 已用 {elapsed:.0f} 秒"),
    "state.load_left_guess": ("About {left:.0f} s left (a first guess: no load like it measured yet) · "
                              "{elapsed:.0f} s elapsed",
                              "大约还剩 {left:.0f} 秒（初步估计：还没有测过类似的加载）· 已用 {elapsed:.0f} 秒"),
    "state.load_overdue": ("Taking longer than the {s:.0f} s estimated · {elapsed:.0f} s elapsed",
                           "比估计的 {s:.0f} 秒要久 · 已用 {elapsed:.0f} 秒"),
    "state.choose_model": ("Choose a model in the sidebar.", "请在侧边栏选择一个模型。"),
    "state.progress": ("{status} · {elapsed:.0f} s elapsed", "{status} · 已用 {elapsed:.0f} 秒"),
    "state.in_progress": ("Run in progress: {fraction:.0%}", "正在运行：{fraction:.0%}"),
}
