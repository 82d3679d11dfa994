"""Strings of the frame (``app.*``, ``explorer/app.py``): the sidebar's language switch, model chooser and settings,
the pages' names, and the banners above every page.

Terms: model 模型, zoo 模型库, upload 上传, batch 批大小, sequence length 序列长度, dtype 数据类型, device 设备,
memory format 内存格式, CUDA-graph replay CUDA graph 回放, kernel launch 内核启动; CUDA, CPU, GPU, ONNX,
torch.export, safetensors, Hugging Face and channels_last stay as written.
"""

STRINGS = {
    "app.language": ("Language / 语言", "语言 / Language"),
    "app.name": ("Fusion Explorer", "算子融合探索器 Fusion Explorer"),

    # ------------------------------------------------------------------ pages
    "app.page.graph": ("Graph", "计算图"),
    "app.page.fusions": ("Fusions", "融合"),
    "app.page.run": ("Run", "运行"),
    "app.page.results": ("Results", "结果"),
    "app.page.learn": ("Learn", "学习"),
    "app.page.export": ("Export", "导出"),

    # ------------------------------------------------------------------ the model
    "app.model": ("Model", "模型"),
    "app.source": ("Source", "来源"),
    "app.kind.zoo": ("Zoo", "模型库"),
    "app.kind.onnx": ("ONNX upload", "上传 ONNX"),
    "app.kind.pt2": (".pt2 upload", "上传 .pt2"),
    "app.kind.hf": ("Hugging Face folder", "Hugging Face 文件夹"),
    "app.batch": ("Batch", "批大小"),
    "app.zoo_model": ("Zoo model", "模型库中的模型"),
    "app.zoo_help": ("Real architectures with seeded random weights; nothing is downloaded",
                     "真实的网络结构，权重是按固定种子生成的随机数；不下载任何东西"),
    "app.family.cnn": ("cnn", "卷积网络"),
    "app.family.transformer": ("transformer", "Transformer 模型"),
    "app.family.detector": ("detector", "目标检测"),
    "app.family.teaching": ("teaching", "教学示例"),
    "app.limit": ("Files up to {mb} MB.", "文件不超过 {mb} MB。"),
    # Streamlit's own uploader text ("200MB per file", "Upload") is English only, and its limit is not the app's:
    # the app hides it and shows these instead (explorer/ui/i18n.py, uploader_css)
    "app.upload.drop": ("or drag and drop a file here", "或者把文件拖到这里"),
    "app.upload.button": ("Upload", "上传文件"),
    "app.onnx_file": ("ONNX model (.onnx or .zip with its .onnx.data). {limit}",
                      "ONNX 模型（.onnx，或连同其 .onnx.data 的 .zip）。{limit}"),
    "app.onnx_data": ("External data (optional, e.g. model.onnx.data)", "外部数据（可选，例如 model.onnx.data）"),
    "app.onnx_prompt": ("Upload an .onnx file (or a .zip holding the model and its external data).",
                        "请上传 .onnx 文件（或包含模型及其外部数据的 .zip）。"),
    "app.pt2_file": ("torch.export archive (.pt2). {limit}", "torch.export 归档（.pt2）。{limit}"),
    "app.pt2_prompt": ("Upload a .pt2 saved with torch.export.save (its example inputs set the batch).",
                       "请上传用 torch.export.save 保存的 .pt2（批大小由它的示例输入决定）。"),
    "app.hf_folder": ("Local Hugging Face folder (save_pretrained, safetensors)",
                      "本地 Hugging Face 文件夹（save_pretrained，safetensors）"),
    "app.hf_placeholder": ("/path/to/model", "/模型/所在/路径"),
    "app.seq_len": ("Sequence length", "序列长度"),
    "app.seq_len_help": ("Tokens per input; only for sequence models", "每个输入的 token 数；只用于序列模型"),

    # ------------------------------------------------------------------ settings
    "app.settings": ("Settings", "设置"),
    "app.dtype": ("dtype", "数据类型（dtype）"),
    "app.device": ("Device", "设备"),
    "app.device_help": ("No CUDA device here: only the CPU can be measured", "这里没有 CUDA 设备：只能测量 CPU"),
    "app.memory_format": ("Memory format", "内存格式"),
    "app.memory_format_help": ("channels_last often speeds up convolutions on tensor cores",
                               "channels_last 往往能让卷积在张量核心上跑得更快"),
    "app.cuda_graphs": ("CUDA-graph replay", "CUDA graph 回放"),
    "app.cuda_graphs_help": ("Replays the whole forward as one CUDA graph: removes launch overhead (GPU only)",
                             "把整个前向作为一个 CUDA graph 回放：去掉内核启动开销（仅限 GPU）"),

    # ------------------------------------------------------------------ banners
    "app.load_error": ("Could not load the model: {error}", "无法加载模型：{error}"),
    "app.still_showing": (" — still showing {label}.", "——仍在显示 {label}。"),
    "app.no_gpu": ("No GPU on this machine: every number the Run page measures is a CPU number, not what a fused GPU "
                   "kernel would give.",
                   "这台机器没有 GPU：运行页测出的每个数字都是 CPU 上的数字，不代表融合后的 GPU 内核的表现。"),
    "app.loaded": ("Loaded: {label} · batch {batch}", "已加载：{label} · 批大小 {batch}"),
    "app.loaded_seq": (" · seq {seq}", " · 序列长度 {seq}"),
    "app.link_ignored": ("Link ignored: {reason}.", "链接参数已忽略：{reason}。"),
}
