"""Strings of the app's state module (``state.*``, ``explorer/ui/state.py``): the page boundary's error line,
loading a model, and a run's live progress (its status is one of the runner's messages, ``explorer/messages.py``)."""

STRINGS = {
    "state.unexpected": ("Unexpected error ({type}): {error}", "意外错误（{type}）：{error}"),
    "state.loading": ("Loading {label} (capture with torch.export, detect chains)…",
                      "正在加载 {label}（用 torch.export 捕获计算图，检测可融合的链）…"),
    "state.choose_model": ("Choose a model in the sidebar.", "请在侧边栏选择一个模型。"),
    "state.progress": ("{status} · {elapsed:.0f} s elapsed", "{status} · 已用 {elapsed:.0f} 秒"),
    "state.in_progress": ("Run in progress: {fraction:.0%}", "正在运行：{fraction:.0%}"),
}
