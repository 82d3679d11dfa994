"""The corpus: public architectures nobody in the project wrote, as one list (issue 20).

Each ``Entry`` is a public architecture built from its public definition (torchvision's builders, timm's,
transformers' configs) with seeded weights at realistic activation scales (``realistic_weights``, then the
zoo's calibration, ``explorer.sources.calibrate.realistic_init``), at its real layer sizes: every torchvision
classification builder, a timm sample of the families people deploy, and transformers configs at the sizes
of public checkpoints with ``layers`` layers (1-2). An entry says which sources it goes through
(``SOURCES``: ``pt2`` via ``torch.export.save``, ``onnx_dynamo`` / ``onnx_torchscript`` via
``torch.onnx.export``, ``hf`` via ``save_pretrained``) and carries two shapes: ``real`` (what the H200 bench
measures) and ``ci`` (a small input for the CPU test, ``tests/test_corpus.py``). A transformers entry's CI
model keeps the real hidden size, heads and MLP with one layer and a vocabulary of ``CI_VOCAB`` tokens (an
embedding table is not a layer size, and 150k rows of it cost the CPU more than the layer does); where even
that would not fit the CPU test, ``ci_sizes`` says what it changes and why.

Used by ``tests/test_corpus.py`` and ``benchmarks/bench_corpus.py`` (both import it as
``benchmarks.corpus``); the app's menu does not list it. Nothing is built at import time.

    >>> e = by_name("tv/resnet18")
    >>> model = e.build("ci")              # nn.Module in eval mode, seeded, calibrated
    >>> inputs = e.inputs("ci")            # seeded example inputs at the CI shape
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable

SOURCES = ("pt2", "onnx_dynamo", "onnx_torchscript", "hf")
SEED = 0
CI_VOCAB = 1024
#: A pool of N(0, 1) values every weight is filled from (as ``explorer.sources.models.fast_llama_weights``):
#: a prime count, so that consecutive rows do not repeat at the same offset. Filling billions of parameters
#: one normal draw at a time takes minutes; copies of a scaled pool run at memory speed.
POOL_SIZE = 1_048_573


@dataclasses.dataclass(frozen=True)
class Shape:
    """One input shape: batch, and an image side or a sequence length (or audio frames)."""

    batch: int
    image: int | None = None
    seq: int | None = None


@dataclasses.dataclass(frozen=True)
class Entry:
    """One public architecture of the corpus.

    ``name``: ``<library>/<builder or family>`` (``tv/resnet50``, ``timm/ghostnet_100``, ``hf/llama``).
    ``kind``: the architecture family (``cnn``, ``vit``, ``hybrid``, ``mlp``, ``encoder``, ``decoder``, ``moe``,
    ``audio``, ``encdec``), which the CI subset covers once each. ``make(scale)`` builds the bare module
    (``scale`` is ``"real"`` or ``"ci"``); ``inputs_of(module, shape)`` makes its inputs. ``bench_dtype``: what
    the H200 bench runs it in (bf16 for decoders, fp16 otherwise). ``description``: where its sizes come from.
    """

    name: str
    library: str                 # torchvision | timm | transformers
    kind: str
    make: Callable[[str], Any]
    real: Shape
    ci: Shape
    sources: tuple[str, ...]
    bench_dtype: str = "fp16"
    description: str = ""
    input_kind: str = "image"    # image | tokens | tokens_mask | audio | t5 | pixel_values
    ci_sizes: str = ""           # what the CI model changes beyond one layer and CI_VOCAB, and why

    def shape(self, scale: str) -> Shape:
        return self.real if scale == "real" else self.ci

    def build(self, scale: str = "ci", device: str = "cpu"):
        """The module at ``scale``, seeded, with realistic weights and calibrated BatchNorms, in eval mode,
        built and calibrated on ``device``. The weights the library itself initialises draw from that device's
        generator, so a model built on the GPU has other draws (of the same distributions) than one built on the
        CPU; the rest (``realistic_weights``' pool, the calibration inputs) come from seeded CPU generators. The
        bench's timing children build on the CPU, as the CI tests do (its warm phase, which measures nothing, on
        the GPU)."""
        import torch

        from explorer.sources.calibrate import CALIBRATION_SEED, realistic_init

        torch.manual_seed(SEED)
        with torch.device(device):
            module = self.make(scale)
        realistic_weights(module, SEED)
        shape = self.shape(scale)
        # BatchNorm statistics from 8 seeded samples (4 at real sizes, as the zoo): at CI sizes a late stage is a
        # few pixels, and statistics over 2 samples of them make ill-conditioned folds (errors ~1e-3 in fp32)
        calib = dataclasses.replace(shape, batch=8 if scale == "ci" else 4)
        return realistic_init(module, lambda i: tuple(
            t.to(device) for t in self.inputs(scale, CALIBRATION_SEED + i, calib, module)))

    def inputs(self, scale: str = "ci", seed: int = SEED, shape: Shape | None = None, module=None):
        """Seeded example inputs at ``scale`` (a tuple of CPU tensors, in the module's argument order)."""
        import torch

        s = shape or self.shape(scale)
        gen = torch.Generator().manual_seed(seed)
        if self.input_kind in ("image", "pixel_values"):
            return (torch.randn(s.batch, 3, s.image, s.image, generator=gen, device="cpu"),)
        vocab = CI_VOCAB if scale == "ci" else (getattr(getattr(module, "config", None), "vocab_size", None)
                                                or CI_VOCAB)
        ids = torch.randint(0, vocab, (s.batch, s.seq), generator=gen, device="cpu")
        if self.input_kind == "tokens":
            return (ids,)
        if self.input_kind == "tokens_mask":
            return ids, torch.ones(s.batch, s.seq, dtype=torch.int64, device="cpu")
        if self.input_kind == "audio":           # log-mel features: (B, mels, frames)
            mels = module.config.num_mel_bins if module is not None else 80
            return (torch.randn(s.batch, mels, s.seq, generator=gen, device="cpu"),)
        raise ValueError(f"unknown input kind {self.input_kind}")


# ====================================================================== realistic weights

def _pool(seed: int):
    import torch

    return torch.randn(POOL_SIZE, generator=torch.Generator().manual_seed(seed), device="cpu")


def _fill(p, values, gen) -> None:
    """Copy ``values`` (a pool, scaled) into ``p``, starting at a seeded offset and wrapping around."""
    import torch

    flat = p.view(-1)
    values = values.to(p.device)
    at, pos = 0, int(torch.randint(0, POOL_SIZE, (), generator=gen, device="cpu"))
    while at < flat.numel():
        take = min(flat.numel() - at, POOL_SIZE - pos)
        flat[at:at + take].copy_(values[pos:pos + take])
        at, pos = at + take, 0


_NORMS = ("LayerNorm", "RMSNorm", "GroupNorm", "BatchNorm", "LayerNorm2d", "Norm")


def realistic_weights(module, seed: int = SEED) -> list[str]:
    """Give a randomly initialised public model the weight scales of a trained one, in place; returns what
    it changed (``"<name>: <rule>"``, for the record).

    Public initialisations are written for training, not for measuring: transformers draws every projection
    with std 0.02 (each one shrinks its input), ConvNeXt and CaiT-style blocks scale their branch by a layer
    scale of 1e-6, ConvNeXt-V2's GRN starts at zero, heads start at zero. With them, some public models'
    outputs are around 1e-14 and a fused kernel that got a block wrong would change the output by less than
    fp32 noise. Rules, each deterministic (one seeded pool):

    - a Linear, Conv or Embedding weight whose spread is under half of ``1/sqrt(fan_in)``: ``N(0, 1/fan_in)``
      (an embedding ``N(0, 1)``): a layer keeps its input's scale. Kaiming-initialised convolutions are kept;
    - a bias that is all zero: ``N(0, 0.1²)``, so that a kernel that dropped it is caught;
    - a norm's weight that is all one: ``1 + N(0, 0.1²)``; all zero (Gemma's ``1 + w``): ``N(0, 0.1²)``;
      its bias all zero: ``N(0, 0.1²)``;
    - any other parameter whose largest magnitude is under 1e-4 (layer scales, GRN's γ and β, zero-init
      gates): uniform in [0.1, 0.5], neither the identity nor negligible.

    BatchNorm statistics are calibrated afterwards (``Entry.build``: ``realistic_init``).
    """
    import torch

    gen = torch.Generator().manual_seed(seed)
    pool = _pool(seed)
    changed = []
    done: set[int] = set()
    with torch.no_grad():
        for mname, m in module.named_modules():
            cls = type(m).__name__
            is_norm = any(k in cls for k in _NORMS) or isinstance(m, (torch.nn.LayerNorm, torch.nn.GroupNorm))
            for pname, p in m.named_parameters(recurse=False):
                if id(p) in done or p.numel() == 0 or not p.is_floating_point() or p.device.type == "meta":
                    continue
                done.add(id(p))
                where = f"{mname}.{pname}" if mname else pname
                if isinstance(m, torch.nn.Embedding) and pname == "weight":
                    if float(p.std()) < 0.5:
                        _fill(p, pool, gen)
                        changed.append(f"{where}: N(0,1)")
                    continue
                if is_norm:
                    if pname == "weight" and bool((p == 1).all()):
                        _fill(p, 1 + 0.1 * pool, gen)
                        changed.append(f"{where}: 1+N(0,0.01)")
                    elif not bool(p.any()):
                        _fill(p, 0.1 * pool, gen)
                        changed.append(f"{where}: N(0,0.01)")
                    continue
                if pname == "weight" and p.dim() >= 2 and isinstance(m, (torch.nn.Linear, torch.nn.modules.conv._ConvNd)) \
                        or (p.dim() >= 2 and "weight" in pname and cls.startswith(("Conv1D", "Linear"))):
                    fan_in = p.shape[0] if cls == "Conv1D" else p[0].numel()
                    if float(p.std()) * math.sqrt(fan_in) < 0.5:
                        _fill(p, pool / math.sqrt(fan_in), gen)
                        changed.append(f"{where}: N(0,1/fan_in)")
                    continue
                if "bias" in pname and not bool(p.any()):
                    _fill(p, 0.1 * pool, gen)
                    changed.append(f"{where}: N(0,0.01)")
                    continue
                if float(p.abs().max()) < 1e-4:
                    u = torch.rand(p.shape, generator=gen, device="cpu")
                    p.copy_(0.1 + 0.4 * u.to(p.device))
                    changed.append(f"{where}: U(0.1,0.5)")
    return changed


# ====================================================================== builders

def _torchvision(name: str) -> Callable[[str], Any]:
    def make(scale: str):
        import torchvision

        kwargs = {"aux_logits": False, "init_weights": False} if name in ("googlenet", "inception_v3") else {}
        return torchvision.models.get_model(name, weights=None, **kwargs)

    return make


def _timm(name: str, **kwargs) -> Callable[[str], Any]:
    def make(scale: str):
        import timm

        return timm.create_model(name, pretrained=False, **kwargs)

    return make


def _hf(config_cls: str, model_cls: str, sizes: dict, layers: int = 2, layer_key: str = "num_hidden_layers",
        ci_override: dict | None = None, vocab_key: str = "vocab_size") -> Callable[[str], Any]:
    """A transformers model of ``sizes`` with ``layers`` layers (real) or one (ci, vocabulary ``CI_VOCAB``),
    eager attention (what a Hugging Face folder loads with)."""
    def make(scale: str):
        import transformers

        cfg = dict(sizes)
        if isinstance(layer_key, tuple):
            for k in layer_key:
                cfg[k] = layers if scale == "real" else 1
        else:
            cfg[layer_key] = layers if scale == "real" else 1
        if scale == "ci":
            if vocab_key in cfg:
                cfg[vocab_key] = CI_VOCAB
            cfg.update(ci_override or {})
        config = getattr(transformers, config_cls)(**cfg)
        if scale == "ci":   # special token ids inside the CI vocabulary (a padding row must exist)
            for i, key in enumerate(("pad_token_id", "bos_token_id", "eos_token_id", "decoder_start_token_id")):
                if isinstance(getattr(config, key, None), int) and getattr(config, key) >= CI_VOCAB:
                    setattr(config, key, i)
        config._attn_implementation = "eager"
        model = getattr(transformers, model_cls)(config)
        return model.eval()

    return make


def _tv_ci_image(name: str) -> int:
    """The smallest image a builder takes at CI cost: ViTs and MaxViT fix 224; Inception needs 75+."""
    if name.startswith(("vit_", "maxvit")):
        return 224
    if name in ("inception_v3",):
        return 96
    return 64


def _tv_entries() -> list[Entry]:
    import torchvision

    names = torchvision.models.list_models(module=torchvision.models)
    out = []
    for n in names:
        kind = "vit" if n.startswith(("vit_", "swin", "maxvit")) else "cnn"
        # every builder with weights=None is 224 px, vit_h_14 too (518 is its SWAG weights' size, not the builder's:
        # its position embedding is for 224 / 14 = 16 patches a side, and another image size fails its shape check)
        real = Shape(32, image=224)
        out.append(Entry(f"tv/{n}", "torchvision", kind, _torchvision(n), real, Shape(1, image=_tv_ci_image(n)),
                         ("pt2", "onnx_dynamo", "onnx_torchscript"),
                         description=f"torchvision.models.{n}(weights=None)"))
    return out


#: timm's sample: (builder, kind, CI image side). One per family the issue names.
TIMM = (
    ("resnet50d", "cnn", 64), ("regnety_016", "cnn", 64), ("efficientnet_b0", "cnn", 64),
    ("efficientnetv2_rw_t", "cnn", 64), ("mobilenetv3_large_100", "cnn", 64), ("mobilenetv4_conv_small", "cnn", 64),
    ("ghostnet_100", "cnn", 64), ("repvgg_a0", "cnn", 64), ("convnextv2_atto", "cnn", 64),
    ("edgenext_xx_small", "hybrid", 64), ("fastvit_t8", "hybrid", 64), ("levit_128s", "hybrid", 224),
    ("mobilevit_xxs", "hybrid", 64), ("poolformer_s12", "mlp", 64), ("coatnet_0_rw_224", "hybrid", 224),
    ("maxvit_tiny_rw_224", "hybrid", 224), ("deit_tiny_patch16_224", "vit", 224),
    ("swin_tiny_patch4_window7_224", "vit", 224), ("mixer_b16_224", "mlp", 224),
)


def _timm_entries() -> list[Entry]:
    return [Entry(f"timm/{n}", "timm", kind, _timm(n), Shape(32, image=224), Shape(1, image=ci),
                  ("pt2", "onnx_dynamo", "onnx_torchscript"), description=f"timm.create_model('{n}')")
            for n, kind, ci in TIMM]


_TEXT = ("pt2", "onnx_dynamo", "onnx_torchscript", "hf")


def _hf_entries() -> list[Entry]:
    dec, enc = Shape(4, seq=1024), Shape(32, seq=128)
    ci = Shape(1, seq=8)
    return [
        Entry("hf/llama", "transformers", "decoder", _hf("LlamaConfig", "LlamaModel", dict(
            hidden_size=4096, num_attention_heads=32, num_key_value_heads=8, intermediate_size=14336,
            vocab_size=128256, rope_theta=500000.0, max_position_embeddings=8192)), dec, ci, _TEXT, "bf16",
              "Llama-3-8B layer sizes", "tokens"),
        Entry("hf/mistral", "transformers", "decoder", _hf("MistralConfig", "MistralModel", dict(
            hidden_size=4096, num_attention_heads=32, num_key_value_heads=8, intermediate_size=14336,
            vocab_size=32000, sliding_window=4096)), dec, ci, _TEXT, "bf16", "Mistral-7B-v0.1 layer sizes", "tokens"),
        Entry("hf/qwen2", "transformers", "decoder", _hf("Qwen2Config", "Qwen2Model", dict(
            hidden_size=3584, num_attention_heads=28, num_key_value_heads=4, intermediate_size=18944,
            vocab_size=152064, max_position_embeddings=32768)), dec, ci, _TEXT, "bf16", "Qwen2-7B layer sizes",
              "tokens"),
        Entry("hf/gemma2", "transformers", "decoder", _hf("Gemma2Config", "Gemma2Model", dict(
            hidden_size=2304, num_attention_heads=8, num_key_value_heads=4, head_dim=256, intermediate_size=9216,
            vocab_size=256000, attn_logit_softcapping=50.0, final_logit_softcapping=30.0,
            query_pre_attn_scalar=256, sliding_window=4096)), dec, ci, _TEXT, "bf16", "Gemma-2-2B layer sizes",
              "tokens"),
        Entry("hf/phi3", "transformers", "decoder", _hf("Phi3Config", "Phi3Model", dict(
            hidden_size=3072, num_attention_heads=32, num_key_value_heads=32, intermediate_size=8192,
            vocab_size=32064, max_position_embeddings=4096, pad_token_id=0)), dec, ci, _TEXT, "bf16",
              "Phi-3-mini layer sizes", "tokens"),
        Entry("hf/gpt2", "transformers", "decoder", _hf("GPT2Config", "GPT2Model", dict(
            n_embd=768, n_head=12, vocab_size=50257, n_positions=1024), layer_key="n_layer"), dec, ci, _TEXT, "bf16",
              "GPT-2 (124M) layer sizes", "tokens"),
        Entry("hf/gpt_neox", "transformers", "decoder", _hf("GPTNeoXConfig", "GPTNeoXModel", dict(
            hidden_size=2048, num_attention_heads=16, intermediate_size=8192, vocab_size=50304,
            rotary_pct=0.25, max_position_embeddings=2048)), dec, ci, _TEXT, "bf16", "Pythia-1.4B layer sizes",
              "tokens"),
        Entry("hf/opt", "transformers", "decoder", _hf("OPTConfig", "OPTModel", dict(
            hidden_size=2048, num_attention_heads=32, ffn_dim=8192, word_embed_proj_dim=2048, vocab_size=50272,
            max_position_embeddings=2048)), dec, ci, _TEXT, "bf16", "OPT-1.3B layer sizes", "tokens"),
        Entry("hf/falcon", "transformers", "decoder", _hf("FalconConfig", "FalconModel", dict(
            hidden_size=4544, num_attention_heads=71, multi_query=True, parallel_attn=True, new_decoder_architecture=False,
            bias=False, vocab_size=65024, alibi=False)), dec, ci, _TEXT, "bf16", "Falcon-7B layer sizes", "tokens"),
        Entry("hf/mixtral", "transformers", "moe", _hf("MixtralConfig", "MixtralModel", dict(
            hidden_size=4096, num_attention_heads=32, num_key_value_heads=8, intermediate_size=14336,
            num_local_experts=8, num_experts_per_tok=2, vocab_size=32000),
            ci_override=dict(hidden_size=1024, intermediate_size=3584, num_attention_heads=8, num_key_value_heads=2)),
              dec, ci, _TEXT, "bf16", "Mixtral-8x7B layer sizes (8 experts, top-2)", "tokens",
              ci_sizes="CI: hidden 1024, MLP 3584, 8 heads over 2 (8 experts of 14336 are 1.4 B parameters a layer)"),
        Entry("hf/bert", "transformers", "encoder", _hf("BertConfig", "BertModel", dict(
            hidden_size=768, num_attention_heads=12, intermediate_size=3072, vocab_size=30522)), enc, ci, _TEXT,
              "fp16", "BERT-base layer sizes", "tokens_mask"),
        Entry("hf/roberta", "transformers", "encoder", _hf("RobertaConfig", "RobertaModel", dict(
            hidden_size=768, num_attention_heads=12, intermediate_size=3072, vocab_size=50265,
            max_position_embeddings=514, pad_token_id=1)), enc, ci, _TEXT, "fp16", "RoBERTa-base layer sizes",
              "tokens_mask"),
        Entry("hf/distilbert", "transformers", "encoder", _hf("DistilBertConfig", "DistilBertModel", dict(
            dim=768, n_heads=12, hidden_dim=3072, vocab_size=30522), layer_key="n_layers"), enc, ci, _TEXT, "fp16",
              "DistilBERT-base layer sizes", "tokens_mask"),
        Entry("hf/t5_encoder", "transformers", "encoder", _hf("T5Config", "T5EncoderModel", dict(
            d_model=768, d_kv=64, d_ff=3072, num_heads=12, vocab_size=32128, feed_forward_proj="relu"),
            layer_key="num_layers"), enc, ci, _TEXT, "fp16", "T5-base encoder layer sizes", "tokens_mask"),
        Entry("hf/vit", "transformers", "vit", _hf("ViTConfig", "ViTModel", dict(
            hidden_size=768, num_attention_heads=12, intermediate_size=3072, image_size=224, patch_size=16)),
              Shape(32, image=224), Shape(1, image=224), _TEXT, "fp16", "ViT-B/16 layer sizes", "pixel_values"),
        Entry("hf/swin", "transformers", "vit", _hf("SwinConfig", "SwinModel", dict(
            embed_dim=96, depths=[2, 2, 2, 2], num_heads=[3, 6, 12, 24], window_size=7, image_size=224,
            patch_size=4), layer_key="_unused_layers"),
              Shape(32, image=224), Shape(1, image=224), _TEXT, "fp16",
              "Swin-T widths and heads, 2 blocks a stage (a shifted and an unshifted window)", "pixel_values"),
        Entry("hf/clip_vision", "transformers", "vit", _hf("CLIPVisionConfig", "CLIPVisionModel", dict(
            hidden_size=768, num_attention_heads=12, intermediate_size=3072, image_size=224, patch_size=32,
            hidden_act="quick_gelu")), Shape(32, image=224), Shape(1, image=224), _TEXT, "fp16",
              "CLIP ViT-B/32 vision tower layer sizes", "pixel_values"),
        Entry("hf/whisper_encoder", "transformers", "audio", _hf("WhisperConfig", "WhisperModel", dict(
            d_model=512, encoder_attention_heads=8, decoder_attention_heads=8, encoder_ffn_dim=2048,
            decoder_ffn_dim=2048, num_mel_bins=80, max_source_positions=1500, vocab_size=51865,
            max_target_positions=448, pad_token_id=50257, bos_token_id=50257, eos_token_id=50257,
            decoder_start_token_id=50258, suppress_tokens=[], begin_suppress_tokens=[]),
            layer_key=("encoder_layers", "decoder_layers"), ci_override=dict(max_source_positions=50)),
              Shape(8, seq=3000), Shape(1, seq=100), _TEXT, "fp16",
              "Whisper-base layer sizes (the encoder; its Hugging Face folder is the whole model)", "audio",
              ci_sizes="CI: 100 frames (max_source_positions 50), a position table, not a layer size"),
    ]


def entries() -> list[Entry]:
    """Every corpus entry: torchvision's classification builders, the timm sample, the transformers configs."""
    return [*_tv_entries(), *_timm_entries(), *_hf_entries()]


def by_name(name: str) -> Entry:
    for e in entries():
        if e.name == name:
            return e
    raise KeyError(f"no corpus entry {name!r}")


# ====================================================================== the torch-side module of an entry

def features_module(entry: Entry, module):
    """The module that ``torch.export`` and ``torch.onnx.export`` see: a transformers model wrapped to take
    positional tensors and return its last hidden state (the encoder's, for Whisper), without a KV cache (a
    prefill, as the zoo's decoder; with transformers' default ``use_cache=True`` the cache's update writes
    ``aten.detach_`` on the empty cache's fresh copy, which the reader allows since issue 20: the same chains,
    ``tests/test_security_ops.py``); a vision model as is."""
    import inspect

    import torch

    if entry.library != "transformers":
        return module
    names = {"tokens": ("input_ids",), "tokens_mask": ("input_ids", "attention_mask"),
             "pixel_values": ("pixel_values",), "audio": ("input_features",)}[entry.input_kind]

    class HFPositional(torch.nn.Module):
        """A transformers model called with ``names`` positionally; returns the last hidden state."""

        def __init__(self, model, names, encoder_only):
            super().__init__()
            self.model = model.get_encoder() if encoder_only else model
            self.names = names
            self.kwargs = {"use_cache": False} if "use_cache" in inspect.signature(self.model.forward).parameters else {}

        def forward(self, *inputs):
            out = self.model(**dict(zip(self.names, inputs)), **self.kwargs)
            return out.last_hidden_state

    return HFPositional(module, names, entry.input_kind == "audio").eval()


# ====================================================================== torch.compile's fusions beside ours

def compile_check(name: str, folder, device: str = "cpu", dtype: str = "fp32") -> dict:
    """One entry at its CI shape, written as a ``.pt2`` (``torch.export.save``) under ``folder``, loaded as a
    user's file, detected, compiled by torch.compile on ``device`` in ``dtype`` with inductor's kernels mapped
    onto our graph (``explorer.runtime.compile_map``), and set beside our detection: per op sequence, the
    kernels that fuse ops one of our families covers in principle and that no chain, alternative or near miss
    of ours touches (``compile_map.unclaimed``). A JSON-ready dict; a compile that fails is ``compile_failed``
    with its one line. Used by ``tests/test_corpus.py`` (CPU) and ``benchmarks/check_compile_map_corpus.py``
    (the GPU)."""
    import collections
    import time
    from pathlib import Path

    import torch

    from explorer.errors import ExplorerError
    from explorer.fusion_engine import detect
    from explorer.fusions import PATTERNS
    from explorer.graph.build import build_graph
    from explorer.runtime import compile_map as cm
    from explorer.sources import load_model

    t0 = time.perf_counter()
    entry = by_name(name)
    module = entry.build("ci")
    inputs = entry.inputs("ci", module=module)
    path = Path(folder) / "model.pt2"
    with torch.no_grad():
        torch.export.save(torch.export.export(features_module(entry, module), inputs), str(path))
    del module
    out: dict = {"entry": name, "device": device, "dtype": dtype}
    try:
        loaded = load_model(str(path))
    except ExplorerError as exc:   # a refused file: nothing to compile (tests/test_corpus.py's REFUSED says why)
        return dict(out, status="refused", reason=str(exc), seconds=round(time.perf_counter() - t0, 1))
    graph = build_graph(loaded.gm, name)
    det = detect(graph)
    try:
        cmap = cm.map_loaded(loaded, device, dtype)
    except ExplorerError as exc:
        return dict(out, status="compile_failed", reason=str(exc), seconds=round(time.perf_counter() - t0, 1))
    comparison = cm.compare(det.chains, graph, cmap)
    missed = cm.unclaimed(comparison, det, PATTERNS)
    work = set(cm.compute_nodes(graph))
    multi = [k for k in cmap.kernels if len([n for n in k.nodes if n in work]) >= 2]
    return dict(out, status="ok", kernels=len(cmap.kernels), multi_op_kernels=len(multi),
                only_inductor=len(comparison.only_inductor), problems=cm.problems(cmap, graph),
                chains=dict(collections.Counter(c.status for c in comparison.chains)),
                candidate_patterns=[{"ops": ops, "count": n} for ops, n in comparison.candidate_patterns()],
                unclaimed=dict(collections.Counter(u.text for u in missed)),
                unclaimed_patterns={u.text: list(u.patterns) for u in missed},
                compile_s=cmap.compile_s, seconds=round(time.perf_counter() - t0, 1))
