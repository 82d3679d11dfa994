"""Model definitions the zoo builds that are not in torchvision.

- ``BertEncoderOnly``: a transformers ``BertModel`` (eager attention, so the
  MatMul->Softmax chains are explicit ops) that returns the last hidden state.
- ``YoloStyle``: a small YOLO-style detector, Conv+BN+SiLU everywhere with CSP
  bottlenecks that add a residual.
- ``LlamaDecoder`` and ``LlamaDecodeStep``: a transformers ``LlamaForCausalLM``
  (RMSNorm, rotary embedding, grouped-query SDPA attention, SwiGLU MLP), its
  prefill and one decode step over a static KV cache; at Llama-3-8B's layer
  sizes built on the meta device and filled at memory speed (``fast_llama_weights``).
- ``convnext_tiny``: torchvision's ConvNeXt-Tiny with weights at realistic scales
  (its own initialisation makes every block add a millionth of its output).
- Teaching models: one Conv-BN-ReLU block, one residual block, one transformer
  encoder block with attention written out op by op.
"""

from __future__ import annotations

import math

import torch
from torch import nn


class BertEncoderOnly(nn.Module):
    """BERT returning ``last_hidden_state`` for ``(input_ids, attention_mask)``."""

    def __init__(self, bert: nn.Module) -> None:
        super().__init__()
        self.bert = bert

    @classmethod
    def from_config_sizes(cls, layers: int, hidden: int, heads: int, intermediate: int) -> "BertEncoderOnly":
        from transformers import BertConfig, BertModel

        config = BertConfig(
            num_hidden_layers=layers,
            hidden_size=hidden,
            num_attention_heads=heads,
            intermediate_size=intermediate,
            attn_implementation="eager",
        )
        return cls(BertModel(config, add_pooling_layer=False))

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.bert(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state


class ConvBnAct(nn.Module):
    """Conv2d (no bias) -> BatchNorm2d -> activation: the YOLO 'Conv' unit."""

    def __init__(self, c_in: int, c_out: int, k: int = 1, s: int = 1, p: int | None = None) -> None:
        super().__init__()
        self.conv = nn.Conv2d(c_in, c_out, k, s, k // 2 if p is None else p, bias=False)
        self.bn = nn.BatchNorm2d(c_out)
        self.act = nn.SiLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.bn(self.conv(x)))


class Bottleneck(nn.Module):
    """x + ConvBnAct3x3(ConvBnAct1x1(x)): the residual add YOLO models repeat."""

    def __init__(self, c: int) -> None:
        super().__init__()
        self.cv1 = ConvBnAct(c, c, 1)
        self.cv2 = ConvBnAct(c, c, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.cv2(self.cv1(x))


class C3(nn.Module):
    """CSP block: two 1x1 branches, bottlenecks on one, concat, 1x1 fuse."""

    def __init__(self, c_in: int, c_out: int, n: int = 1) -> None:
        super().__init__()
        c_ = c_out // 2
        self.cv1 = ConvBnAct(c_in, c_, 1)
        self.cv2 = ConvBnAct(c_in, c_, 1)
        self.m = nn.Sequential(*(Bottleneck(c_) for _ in range(n)))
        self.cv3 = ConvBnAct(2 * c_, c_out, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.cv3(torch.cat((self.m(self.cv1(x)), self.cv2(x)), dim=1))


class SPPF(nn.Module):
    """Spatial pyramid pooling, fast: three chained 5x5 max-pools, concat."""

    def __init__(self, c_in: int, c_out: int) -> None:
        super().__init__()
        c_ = c_in // 2
        self.cv1 = ConvBnAct(c_in, c_, 1)
        self.cv2 = ConvBnAct(c_ * 4, c_out, 1)
        self.pool = nn.MaxPool2d(5, 1, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.cv1(x)
        y1 = self.pool(x)
        y2 = self.pool(y1)
        return self.cv2(torch.cat((x, y1, y2, self.pool(y2)), dim=1))


class YoloStyle(nn.Module):
    """A compact YOLOv5-like backbone, neck and 3-scale head (80 classes, 3 anchors)."""

    def __init__(self, width: int = 32, classes: int = 80) -> None:
        super().__init__()
        w = width
        self.stem = ConvBnAct(3, w, 6, 2, 2)
        self.stage1 = nn.Sequential(ConvBnAct(w, 2 * w, 3, 2), C3(2 * w, 2 * w, 1))
        self.stage2 = nn.Sequential(ConvBnAct(2 * w, 4 * w, 3, 2), C3(4 * w, 4 * w, 2))
        self.stage3 = nn.Sequential(ConvBnAct(4 * w, 8 * w, 3, 2), C3(8 * w, 8 * w, 3))
        self.stage4 = nn.Sequential(ConvBnAct(8 * w, 16 * w, 3, 2), C3(16 * w, 16 * w, 1), SPPF(16 * w, 16 * w))
        self.lat4 = ConvBnAct(16 * w, 8 * w, 1)
        self.up = nn.Upsample(scale_factor=2, mode="nearest")
        self.neck3 = C3(16 * w, 8 * w, 1)
        self.lat3 = ConvBnAct(8 * w, 4 * w, 1)
        self.neck2 = C3(8 * w, 4 * w, 1)
        outputs = 3 * (classes + 5)
        self.head = nn.ModuleList(nn.Conv2d(c, outputs, 1) for c in (4 * w, 8 * w, 16 * w))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        x = self.stem(x)
        x = self.stage1(x)
        p3 = self.stage2(x)
        p4 = self.stage3(p3)
        p5 = self.stage4(p4)
        l4 = self.lat4(p5)
        n4 = self.neck3(torch.cat((self.up(l4), p4), dim=1))
        l3 = self.lat3(n4)
        n3 = self.neck2(torch.cat((self.up(l3), p3), dim=1))
        return self.head[0](n3), self.head[1](n4), self.head[2](p5)


class ConvBnReluBlock(nn.Module):
    """Teaching: conv -> temp1 -> bn -> temp2 -> relu, the seed's first example."""

    def __init__(self, c_in: int = 3, c_out: int = 16) -> None:
        super().__init__()
        self.conv = nn.Conv2d(c_in, c_out, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(c_out)
        self.relu = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.relu(self.bn(self.conv(x)))


class ResidualBlock(nn.Module):
    """Teaching: a ResNet basic block, relu(bn2(conv2(relu(bn1(conv1 x)))) + x)."""

    def __init__(self, c: int = 16) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(c)
        self.relu = nn.ReLU()
        self.conv2 = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(c)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + x)


class TransformerBlock(nn.Module):
    """Teaching: post-norm encoder block with attention written op by op.

    x -> qkv -> (q @ k^T) * scale -> softmax -> @ v -> proj -> + x -> LayerNorm
      -> Linear -> GELU -> Linear -> + -> LayerNorm
    """

    def __init__(self, dim: int = 64, heads: int = 4, mlp: int = 4) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.norm1 = nn.LayerNorm(dim)
        self.fc1 = nn.Linear(dim, mlp * dim)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(mlp * dim, dim)
        self.norm2 = nn.LayerNorm(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        h = self.heads
        q, k, v = self.qkv(x).reshape(b, s, 3, h, d // h).permute(2, 0, 3, 1, 4)  # 3 x (b, h, s, d/h)
        scores = torch.matmul(q, k.transpose(-2, -1)) * (1.0 / math.sqrt(d // h))  # (b, h, s, s)
        attn = torch.matmul(torch.softmax(scores, dim=-1), v)  # (b, h, s, d/h)
        attn = attn.transpose(1, 2).reshape(b, s, d)
        x = self.norm1(x + self.proj(attn))
        return self.norm2(x + self.fc2(self.act(self.fc1(x))))


# ---------------------------------------------------------------------- Llama-style decoders

#: The attention implementation of the zoo's decoders (``register_causal_sdpa``).
CAUSAL_SDPA = "sdpa_causal"


def _causal_sdpa(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                 attention_mask: torch.Tensor | None, **kwargs):
    """transformers' SDPA attention with the causal mask left to SDPA's ``is_causal`` and grouped-query
    attention to ``enable_gqa``, as transformers itself runs it in eager mode.

    ``query``: (B, Hq, Sq, D), ``key``/``value``: (B, Hkv, Skv, D). A prompt attends causally (Sq == Skv);
    a decode step's one query attends to every cached position (Sq == 1, a full cache). Other shapes
    (a partly filled cache, padding) need a mask tensor and are refused.
    """
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    q_len, kv_len = query.shape[2], key.shape[2]
    if q_len not in (1, kv_len):
        raise ValueError(f"{CAUSAL_SDPA} attends a prompt (q_len == kv_len) or one decoded token, "
                         f"not {q_len} queries over {kv_len} keys")
    return sdpa_attention_forward(module, query, key, value, None, **kwargs)


def _no_mask(*args, **kwargs) -> None:
    """The mask function of ``CAUSAL_SDPA``: no mask tensor (SDPA's ``is_causal`` is the mask)."""
    return None


def register_causal_sdpa() -> str:
    """Register ``CAUSAL_SDPA`` with transformers (idempotent) and return its name.

    Without it, a graph captured by ``torch.export`` builds a (B, 1, S, S) boolean mask and copies K
    and V to every query head (``repeat_kv``): transformers materialises the mask whenever it is
    traced, since an exported program may be called at other shapes. The explorer's graphs are static,
    and eager mode (and ``torch.compile``) skip both; with this implementation the captured graph runs
    the same attention as the module does eagerly: one SDPA call, causal, grouped-query.
    """
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(CAUSAL_SDPA, _causal_sdpa)
    AttentionMaskInterface.register(CAUSAL_SDPA, _no_mask)
    return CAUSAL_SDPA


def llama_config(layers: int, hidden: int, heads: int, kv_heads: int, intermediate: int, vocab: int,
                 max_positions: int = 4096):
    """A transformers ``LlamaConfig`` of these sizes: causal grouped-query SDPA attention
    (``register_causal_sdpa``), SiLU-gated MLP, untied embeddings."""
    from transformers import LlamaConfig

    return LlamaConfig(hidden_size=hidden, intermediate_size=intermediate, num_hidden_layers=layers,
                       num_attention_heads=heads, num_key_value_heads=kv_heads, vocab_size=vocab,
                       max_position_embeddings=max_positions, rms_norm_eps=1e-6, hidden_act="silu",
                       attn_implementation=register_causal_sdpa(), use_cache=False, tie_word_embeddings=False)


def realistic_llama_weights(model: nn.Module, seed: int = 0) -> nn.Module:
    """Seeded weights that keep activations at unit scale through every layer, as a trained model's are.

    transformers initialises every projection with std 0.02, which at hidden 512 shrinks each
    projection's output to ~0.45 of its input and leaves attention almost uniform. Here each
    linear weight is N(0, 1/fan_in) (a projection keeps its input's scale), the embedding N(0, 1)
    (unit-RMS tokens) and each RMSNorm weight 1 + N(0, 0.1²) (a scale that is not the identity,
    so a kernel that dropped it would be caught). Changes ``model`` in place and returns it.
    """
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1:                                                      # RMSNorm weights
                p.copy_(1 + 0.1 * torch.randn(p.shape, generator=gen))
            elif "embed_tokens" in name:
                p.copy_(torch.randn(p.shape, generator=gen))
            else:
                p.copy_(torch.randn(p.shape, generator=gen) / math.sqrt(p.shape[-1]))
    return model


#: Values ``fast_llama_weights`` draws from: a seeded pool of N(0, 1) numbers, a prime count of them,
#: so that consecutive rows of a weight do not repeat it at the same offset.
POOL_SIZE = 4_194_301


def fast_llama_weights(model: nn.Module, seed: int = 0) -> nn.Module:
    """``realistic_llama_weights``' scales at memory speed, for decoders at the sizes people run.

    Drawing 0.7 billion normal numbers one by one takes most of a minute on a CPU; here every tensor
    is filled from one seeded pool of ``POOL_SIZE`` N(0, 1) values, starting at a seeded offset and
    wrapping around, then scaled as ``realistic_llama_weights`` scales it: linears N(0, 1/fan_in), the
    embedding N(0, 1), each RMSNorm weight 1 + N(0, 0.1²). Deterministic; changes ``model`` in place.
    """
    gen = torch.Generator().manual_seed(seed)
    pool = torch.randn(POOL_SIZE, generator=gen)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1:                                                      # RMSNorm weights
                values = 1.0 + 0.1 * pool
            elif "embed_tokens" in name:
                values = pool
            else:
                values = pool / math.sqrt(p.shape[-1])
            flat = p.view(-1)                 # one pass over the weight: copies of the scaled pool
            at, pos = 0, int(torch.randint(0, POOL_SIZE, (), generator=gen))
            while at < flat.numel():
                take = min(flat.numel() - at, POOL_SIZE - pos)
                flat[at:at + take].copy_(values[pos:pos + take])
                at, pos = at + take, 0
    return model


def _llama_causal_lm(sizes: dict, init: str = "standard") -> nn.Module:
    """``LlamaForCausalLM`` of ``sizes`` (``llama_config``'s arguments) with realistic weights.

    ``init``: "standard" (transformers' construction, then ``realistic_llama_weights``), "fast"
    (built on the meta device, so nothing is initialised twice, then ``fast_llama_weights``: the
    Llama-3-8B layer sizes load in seconds), or "meta" (no storage at all: for capturing and
    detecting at any size without the memory).
    """
    from transformers import LlamaForCausalLM

    config = llama_config(**sizes)
    if init == "standard":
        return realistic_llama_weights(LlamaForCausalLM(config))
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    if init == "meta":
        return model
    model = model.to_empty(device="cpu")
    rotary = type(model.model.rotary_emb)(config=config)   # its buffers are computed, not parameters
    model.model.rotary_emb = rotary
    return fast_llama_weights(model)


class LlamaDecoder(nn.Module):
    """A Llama-style decoder's prefill: ``input_ids (B, S)`` -> the next token's logits ``(B, 1, vocab)``.

    ``LlamaForCausalLM`` (transformers) without a cache, ``logits_to_keep=1`` as generation
    does: every layer runs over all B·S tokens; only the last position goes through the head.
    """

    def __init__(self, sizes: dict, init: str = "standard") -> None:
        super().__init__()
        self.llama = _llama_causal_lm(sizes, init)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.llama(input_ids=input_ids, use_cache=False, logits_to_keep=1).logits


class LlamaDecodeStep(nn.Module):
    """One decode step with a static KV cache: ``input_ids (B, 1)`` and, per layer, the cached keys and
    values ``(B, kv_heads, S, head_dim)`` -> the next token's logits ``(B, 1, vocab)``.

    The cache is transformers' ``StaticCache`` (fixed-size tensors, updated in place with
    ``index_copy_``), backed by the step's inputs rather than by module buffers, so that its size
    follows the batch and sequence length a caller asks for. The step writes its key and value at
    the last slot, ``S - 1``, and attends over all ``S`` positions (the cache holds ``S - 1`` earlier
    tokens). ``torch.export`` captures it, in-place cache updates included.
    """

    def __init__(self, sizes: dict) -> None:
        super().__init__()
        self.llama = _llama_causal_lm(sizes)

    def forward(self, input_ids: torch.Tensor, *cache: torch.Tensor) -> torch.Tensor:
        from transformers import StaticCache

        config = self.llama.config
        if len(cache) != 2 * config.num_hidden_layers:
            raise ValueError(f"expected a key and a value per layer ({2 * config.num_hidden_layers} tensors), "
                             f"got {len(cache)}")
        seq = cache[0].shape[2]
        static = StaticCache(config=config, max_cache_len=seq)
        for layer, keys, values in zip(static.layers, cache[0::2], cache[1::2]):
            layer.keys, layer.values = keys, values                                # (B, kv_heads, S, head_dim)
            layer.device, (layer.batch_size, layer.num_heads) = keys.device, keys.shape[:2]
            layer.k_head_dim, layer.v_head_dim = keys.shape[-1], values.shape[-1]
            # the step writes slot S - 1 (a graph op, not a lifted constant: torch.full, not torch.tensor)
            layer.cumulative_length = torch.full((), seq - 1, dtype=torch.int64, device=keys.device)
            layer.is_initialized = True
        position = torch.arange(seq - 1, seq, device=input_ids.device)            # (1,)
        return self.llama(input_ids=input_ids, past_key_values=static, cache_position=position, use_cache=True,
                          logits_to_keep=1).logits


def convnext_tiny(seed: int = 0) -> nn.Module:
    """torchvision's ConvNeXt-Tiny with seeded weights that keep activations at unit scale.

    torchvision initialises convolutions and linears with std 0.02 and every layer scale γ to
    1e-6: each block then adds a millionth of its output to the residual stream, so a block
    computed wrongly would change the model's output by less than fp32 noise, and the random
    model is nothing like a trained one. Here every conv and linear weight is N(0, 1/fan_in)
    (a layer keeps its input's scale), biases N(0, 0.1²), each LayerNorm weight 1 + N(0, 0.1²)
    and bias N(0, 0.1²), and each layer scale uniform in [0.1, 0.5] per channel: neither the
    identity nor negligible, so a fold of γ into the last linear that dropped it is caught.
    Same graph as torchvision's (same modules); changes nothing but values.
    """
    import torchvision

    model = torchvision.models.convnext_tiny(weights=None)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, (nn.Conv2d, nn.Linear)):
                fan_in = module.weight[0].numel()
                module.weight.copy_(torch.randn(module.weight.shape, generator=gen) / math.sqrt(fan_in))
                if module.bias is not None:
                    module.bias.copy_(0.1 * torch.randn(module.bias.shape, generator=gen))
            elif isinstance(module, nn.LayerNorm):
                module.weight.copy_(1 + 0.1 * torch.randn(module.weight.shape, generator=gen))
                module.bias.copy_(0.1 * torch.randn(module.bias.shape, generator=gen))
            elif hasattr(module, "layer_scale"):
                module.layer_scale.copy_(0.1 + 0.4 * torch.rand(module.layer_scale.shape, generator=gen))
    return model
