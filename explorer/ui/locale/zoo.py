"""中文 for the zoo's descriptions (``explorer/sources/zoo.py``, ``ZooEntry.description``), keyed by their
English text: ``i18n.translate_text(entry.description)`` shows one in the session's language, and
``tests/test_i18n.py`` names any zoo entry whose description has no translation (a new model, or a
changed description).

Model and library names (ResNet-50, torchvision, transformers, SDPA, KV cache) stay as written; the
blocks are named as Chinese engineers name them (深度可分离卷积, 线性瓶颈, 残差相加, 层归一化).
"""

TEXTS = {
    ("Llama-style decoder at Llama-3-8B layer sizes, prefill (2 layers, hidden 4096, 32 heads over 8 KV heads, "
     "SwiGLU 14336, vocabulary 32000, SDPA; 0.7 billion seeded parameters): next-token logits"):
        "Llama-3-8B 层尺寸的 Llama 风格解码器，预填充（2 层，隐藏维 4096，32 个查询头共享 8 个 KV 头，SwiGLU 14336，"
        "词表 32000，SDPA；7 亿个带种子的参数）：下一个 token 的 logits",
    "ResNet-50 (torchvision): Conv+BN+ReLU blocks and residual adds":
        "ResNet-50（torchvision）：Conv+BN+ReLU 块和残差相加",
    "MobileNetV2 (torchvision): depthwise Conv+BN+ReLU6 and linear bottlenecks":
        "MobileNetV2（torchvision）：深度可分离 Conv+BN+ReLU6 和线性瓶颈",
    ("EfficientNet-B0 (torchvision): MBConv blocks, Conv+BN+SiLU, squeeze-and-excitation, linear bottlenecks with "
     "residual adds"):
        "EfficientNet-B0（torchvision）：MBConv 块、Conv+BN+SiLU、squeeze-and-excitation（通道注意力）、带残差相加的线性瓶颈",
    ("ConvNeXt-Tiny (torchvision, weights at realistic scales): depthwise 7x7 conv, LayerNorm over channels, "
     "Linear+GELU MLP, layer scale and residual"):
        "ConvNeXt-Tiny（torchvision，权重取真实量级）：7x7 深度可分离卷积、按通道的 LayerNorm、Linear+GELU MLP、"
        "layer scale 和残差",
    "ViT-B/16 (torchvision): pre-norm encoder with fused SDPA attention":
        "ViT-B/16（torchvision）：pre-norm 编码器，注意力使用融合的 SDPA",
    "BERT-base (transformers BertConfig, eager attention): MatMul->Softmax, Add+LayerNorm":
        "BERT-base（transformers BertConfig，eager 注意力）：MatMul->Softmax、Add+LayerNorm",
    "YOLO-style detector: Conv+BN+SiLU blocks, CSP bottlenecks with residual adds":
        "YOLO 风格的检测器：Conv+BN+SiLU 块，带残差相加的 CSP 瓶颈",
    "Teaching: one Conv-BN-ReLU block":
        "教学用：一个 Conv-BN-ReLU 块",
    "Teaching: one ResNet basic block (Conv-BN-ReLU, Conv-BN, add, ReLU)":
        "教学用：一个 ResNet 基本块（Conv-BN-ReLU、Conv-BN、相加、ReLU）",
    "Teaching: one post-norm transformer encoder block with explicit attention":
        "教学用：一个 post-norm 的 Transformer 编码器块，注意力逐步显式计算",
    "BERT-large (24 layers, hidden 1024, eager attention)":
        "BERT-large（24 层，隐藏维度 1024，eager 注意力）",
    ("Llama-style decoder, prefill (transformers LlamaConfig: 4 layers, hidden 512, 8 heads over 2 KV heads, SwiGLU "
     "1376, SDPA): Add+RMSNorm, rotary Q/K, SwiGLU; next-token logits"):
        "Llama 风格的解码器，prefill 阶段（transformers LlamaConfig：4 层，隐藏维度 512，8 个注意力头共享 2 个 KV 头，"
        "SwiGLU 1376，SDPA）：Add+RMSNorm、Q/K 旋转位置编码、SwiGLU；输出下一个 token 的 logits",
    ("The same Llama-style decoder, one decode step over a static KV cache of S tokens (the cache is the step's "
     "input, updated in place)"):
        "同一个 Llama 风格的解码器，在 S 个 token 的静态 KV cache 上做一步解码（cache 是这一步的输入，原地更新）",
}
