"""The built-in model zoo: real architectures with random, seeded weights.

No weights are downloaded. Each entry names a builder (torchvision, a
transformers config, or a definition in ``explorer.models``) and declares its
default input, which callers may override (batch, sequence length, image
size). Building is deterministic: every builder runs under a fixed seed.

    >>> entry = get_entry("resnet50")
    >>> model = entry.build()             # nn.Module in eval mode
    >>> inputs = entry.example_inputs(batch=2)
"""

from __future__ import annotations

import dataclasses
import math
from typing import Callable

import torch

from explorer.messages import LOAD
from explorer.errors import ModelLoadError
from explorer.units import available_host_bytes

SEED = 0


def check_fits(nbytes: int, what: str, fraction: float = 0.5) -> None:
    """Refuse, with one line, to allocate more than ``fraction`` of the available host memory."""
    limit = int(available_host_bytes() * fraction)
    if nbytes > limit:
        raise ModelLoadError(f"{what} do not fit in memory: they need {nbytes / 2**30:.1f} GiB, "
                             f"and {limit / 2**30:.1f} GiB may be used")


@dataclasses.dataclass(frozen=True)
class TensorSpec:
    """One model input. ``shape`` may hold the symbols "B" (batch) and "S" (sequence)."""

    name: str
    shape: tuple
    dtype: str = "float32"
    fill: str = "normal"  # normal | tokens | ones
    vocab: int = 0

    def concrete_shape(self, batch: int, seq_len: int) -> tuple[int, ...]:
        sizes = {"B": batch, "S": seq_len}
        return tuple(sizes[d] if isinstance(d, str) else int(d) for d in self.shape)

    def make(self, batch: int, seq_len: int, generator: torch.Generator) -> torch.Tensor:
        shape = self.concrete_shape(batch, seq_len)
        if self.fill == "tokens":
            return torch.randint(0, self.vocab, shape, generator=generator, dtype=torch.int64)
        if self.fill == "ones":
            return torch.ones(shape, dtype=getattr(torch, self.dtype))
        return torch.randn(shape, generator=generator, dtype=getattr(torch, self.dtype))


@dataclasses.dataclass(frozen=True)
class InputSpec:
    """A model's inputs and their defaults."""

    tensors: tuple[TensorSpec, ...]
    batch: int = 1
    seq_len: int | None = None  # None: the model takes no sequence

    def describe(self, batch: int | None = None, seq_len: int | None = None) -> str:
        b, s = self.resolve(batch, seq_len)
        parts = [f"{t.name}{list(t.concrete_shape(b, s))} {t.dtype}" for t in self.tensors]
        return ", ".join(parts)

    def resolve(self, batch: int | None, seq_len: int | None) -> tuple[int, int]:
        b = self.batch if batch is None else int(batch)
        s = (self.seq_len or 0) if seq_len is None else int(seq_len)
        if b < 1:
            raise ModelLoadError(LOAD("batch", got=b))
        if self.seq_len is not None and s < 1:
            raise ModelLoadError(LOAD("seq_len", got=s))
        return b, s

    def nbytes(self, batch: int | None = None, seq_len: int | None = None) -> int:
        b, s = self.resolve(batch, seq_len)
        return sum(math.prod(t.concrete_shape(b, s)) * getattr(torch, t.dtype).itemsize for t in self.tensors)

    def make(self, batch: int | None = None, seq_len: int | None = None, seed: int = SEED) -> tuple[torch.Tensor, ...]:
        b, s = self.resolve(batch, seq_len)
        check_fits(self.nbytes(b, s), f"inputs {self.describe(b, s)}")
        gen = torch.Generator().manual_seed(seed)
        return tuple(t.make(b, s, gen) for t in self.tensors)


@dataclasses.dataclass(frozen=True)
class ZooEntry:
    """A built-in model: how to build it and what it takes."""

    name: str
    family: str  # cnn | transformer | detector | teaching
    task: str  # classification | features | detection
    description: str
    builder: Callable[[], torch.nn.Module]
    inputs: InputSpec
    max_seq_len: int | None = None
    calibrated: bool = False  # the builder's weights are realistic already: no ``realistic_init`` pass
    large: bool = False  # at the sizes people run (GBs of weights): CI captures it on the meta device only

    def build(self) -> torch.nn.Module:
        """Build the model with seeded random weights and realistic activations, in eval mode.

        ``explorer.sources.calibrate.realistic_init`` re-initialises zero-initialised
        layers (ViT's head) and calibrates BatchNorm statistics on seeded random
        batches, so that outputs have a sane scale in every dtype (no zeros, no denormals).
        """
        from explorer.sources.calibrate import CALIBRATION_SEED, realistic_init

        torch.manual_seed(SEED)
        model = self.builder()
        if self.calibrated:  # no zero-initialised layer, no BatchNorm: a pass over 2.8 GB would find nothing
            return model.eval()
        return realistic_init(model, lambda i: self.inputs.make(batch=4, seed=CALIBRATION_SEED + i))

    def example_inputs(self, batch: int | None = None, seq_len: int | None = None) -> tuple[torch.Tensor, ...]:
        if self.max_seq_len is not None and seq_len is not None and seq_len > self.max_seq_len:
            raise ModelLoadError(
                f"sequence length {seq_len} exceeds {self.name}'s maximum of {self.max_seq_len}"
            )
        return self.inputs.make(batch, seq_len)


def _image(batch: int = 1, size: int = 224) -> InputSpec:
    return InputSpec((TensorSpec("x", ("B", 3, size, size)),), batch=batch)


def _tokens(vocab: int, seq_len: int = 128) -> InputSpec:
    return InputSpec(
        (
            TensorSpec("input_ids", ("B", "S"), "int64", "tokens", vocab),
            TensorSpec("attention_mask", ("B", "S"), "int64", "ones"),
        ),
        batch=1,
        seq_len=seq_len,
    )


def _torchvision(name: str) -> Callable[[], torch.nn.Module]:
    def build() -> torch.nn.Module:
        import torchvision

        return getattr(torchvision.models, name)(weights=None)

    return build


def _bert(layers: int, hidden: int, heads: int, intermediate: int) -> Callable[[], torch.nn.Module]:
    def build() -> torch.nn.Module:
        from explorer.sources.models import BertEncoderOnly

        return BertEncoderOnly.from_config_sizes(layers, hidden, heads, intermediate)

    return build


def _local(name: str) -> Callable[[], torch.nn.Module]:
    def build() -> torch.nn.Module:
        from explorer.sources import models

        return getattr(models, name)()

    return build


BERT_VOCAB = 30522

#: The Llama-style decoder's sizes (``explorer.sources.models.llama_config``): it loads in seconds on a
#: CPU, yet every op of a Llama layer is there (RMSNorm, rotary embedding, grouped-query attention
#: through SDPA, a SwiGLU MLP).
LLAMA = dict(layers=4, hidden=512, heads=8, kv_heads=2, intermediate=1376, vocab=32000, max_positions=4096)


#: Llama-3-8B's layer sizes (hidden 4096, 32 query heads over 8 KV heads of 128, SwiGLU 14336), two
#: layers and a 32000-token vocabulary: the shapes people tune, 0.7 billion parameters (2.8 GB in fp32).
LLAMA_8B_LAYERS = dict(layers=2, hidden=4096, heads=32, kv_heads=8, intermediate=14336, vocab=32000,
                       max_positions=8192)


def _llama(step: bool) -> Callable[[], torch.nn.Module]:
    def build() -> torch.nn.Module:
        from explorer.sources.models import LlamaDecoder, LlamaDecodeStep

        return (LlamaDecodeStep if step else LlamaDecoder)(LLAMA)

    return build


def _llama_8b_layers() -> torch.nn.Module:
    from explorer.sources.models import LlamaDecoder

    return LlamaDecoder(LLAMA_8B_LAYERS, init="fast")


def _llama_prefill_inputs(sizes: dict, seq_len: int = 128) -> InputSpec:
    """A batch of prompts: token ids (B, S)."""
    return InputSpec((TensorSpec("input_ids", ("B", "S"), "int64", "tokens", sizes["vocab"]),), seq_len=seq_len)


def _llama_decode_inputs(sizes: dict, cache_len: int = 128) -> InputSpec:
    """One new token per sequence (B, 1) and each layer's cached keys and values (B, kv_heads, S, head_dim)."""
    head_dim = sizes["hidden"] // sizes["heads"]
    cache = tuple(TensorSpec(f"past_{kv}_{i}", ("B", sizes["kv_heads"], "S", head_dim))
                  for i in range(sizes["layers"]) for kv in ("key", "value"))
    return InputSpec((TensorSpec("input_ids", ("B", 1), "int64", "tokens", sizes["vocab"]), *cache),
                     seq_len=cache_len)


ZOO: dict[str, ZooEntry] = {
    e.name: e
    for e in (
        ZooEntry("resnet50", "cnn", "classification",
                 "ResNet-50 (torchvision): Conv+BN+ReLU blocks and residual adds",
                 _torchvision("resnet50"), _image()),
        ZooEntry("mobilenet_v2", "cnn", "classification",
                 "MobileNetV2 (torchvision): depthwise Conv+BN+ReLU6 and linear bottlenecks",
                 _torchvision("mobilenet_v2"), _image()),
        ZooEntry("efficientnet_b0", "cnn", "classification",
                 "EfficientNet-B0 (torchvision): MBConv blocks, Conv+BN+SiLU, squeeze-and-excitation, "
                 "linear bottlenecks with residual adds",
                 _torchvision("efficientnet_b0"), _image()),
        ZooEntry("convnext_tiny", "cnn", "classification",
                 "ConvNeXt-Tiny (torchvision, weights at realistic scales): depthwise 7x7 conv, LayerNorm over "
                 "channels, Linear+GELU MLP, layer scale and residual",
                 _local("convnext_tiny"), _image()),
        ZooEntry("vit_b_16", "transformer", "classification",
                 "ViT-B/16 (torchvision): pre-norm encoder with fused SDPA attention",
                 _torchvision("vit_b_16"), _image()),
        ZooEntry("bert_base", "transformer", "features",
                 "BERT-base (transformers BertConfig, eager attention): MatMul->Softmax, Add+LayerNorm",
                 _bert(12, 768, 12, 3072), _tokens(BERT_VOCAB), max_seq_len=512),
        ZooEntry("yolo_style", "detector", "detection",
                 "YOLO-style detector: Conv+BN+SiLU blocks, CSP bottlenecks with residual adds",
                 _local("YoloStyle"), _image(size=320)),
        ZooEntry("conv_bn_relu", "teaching", "features",
                 "Teaching: one Conv-BN-ReLU block",
                 _local("ConvBnReluBlock"), _image(size=32)),
        ZooEntry("residual_block", "teaching", "features",
                 "Teaching: one ResNet basic block (Conv-BN-ReLU, Conv-BN, add, ReLU)",
                 _local("ResidualBlock"), InputSpec((TensorSpec("x", ("B", 16, 32, 32)),))),
        ZooEntry("transformer_block", "teaching", "features",
                 "Teaching: one post-norm transformer encoder block with explicit attention",
                 _local("TransformerBlock"),
                 InputSpec((TensorSpec("x", ("B", "S", 64)),), seq_len=32), max_seq_len=4096),
        ZooEntry("bert_large", "transformer", "features",
                 "BERT-large (24 layers, hidden 1024, eager attention)",
                 _bert(24, 1024, 16, 4096), _tokens(BERT_VOCAB), max_seq_len=512),
        ZooEntry("llama_decoder", "transformer", "classification",
                 "Llama-style decoder, prefill (transformers LlamaConfig: 4 layers, hidden 512, 8 heads over 2 KV "
                 "heads, SwiGLU 1376, SDPA): Add+RMSNorm, rotary Q/K, SwiGLU; next-token logits",
                 _llama(step=False), _llama_prefill_inputs(LLAMA), max_seq_len=LLAMA["max_positions"]),
        ZooEntry("llama_decoder_8b_layers", "transformer", "classification",
                 "Llama-style decoder at Llama-3-8B layer sizes, prefill (2 layers, hidden 4096, 32 heads over 8 KV "
                 "heads, SwiGLU 14336, vocabulary 32000, SDPA; 0.7 billion seeded parameters): next-token logits",
                 _llama_8b_layers, _llama_prefill_inputs(LLAMA_8B_LAYERS),
                 max_seq_len=LLAMA_8B_LAYERS["max_positions"], calibrated=True, large=True),
        ZooEntry("llama_decode_step", "transformer", "classification",
                 "The same Llama-style decoder, one decode step over a static KV cache of S tokens "
                 "(the cache is the step's input, updated in place)",
                 _llama(step=True), _llama_decode_inputs(LLAMA), max_seq_len=LLAMA["max_positions"]),
    )
}

DEFAULT_MODEL = "resnet50"


def get_entry(name: str) -> ZooEntry:
    """Return the zoo entry called ``name`` or raise a one-line ``ModelLoadError``."""
    try:
        return ZOO[name]
    except KeyError:
        known = ", ".join(sorted(ZOO))
        raise ModelLoadError(LOAD("unknown_model", name=name, known=known)) from None


def menu() -> list[ZooEntry]:
    """The entries of the app's menu: the whole zoo, the list ``fusion-explorer models`` prints (one list, so
    that a model named by the command line is always one the app can open)."""
    return list(ZOO.values())
