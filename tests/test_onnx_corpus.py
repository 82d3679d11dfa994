"""Public architectures nobody here wrote, through both ONNX exporters and back (issue 20's importer part).

Each model is built from its public transformers or torchvision definition at a small config with
seeded random weights, exported with ``torch.onnx.export`` (the dynamo exporter, and
``dynamo=False`` where this torch still writes the model) into ``tmp_path``, and imported. Checked:

- the imported graph computes what onnxruntime computes on the same file (``max|fx - ort| <=
  RTOL * max|ort|``, RTOL = 1e-4, on seeded inputs);
- detection finds the chains the architecture has, derived from its layer count ``L`` below, from
  either exporter, and the same chains as on the model's ``torch.export`` capture except where the
  two captures differ for a stated reason (``TORCH_DIFFERS``);
- chains from an exported file are named by module paths, as on the torch side (from the dynamo
  exporter's metadata, or the TorchScript exporter's scoped node names).

Default (SDPA) attention, as a user exports it: the dynamo exporter writes it with ``IsNaN`` guards,
RoBERTa's position ids with ``CumSum`` (the ops the importer refused before).
"""

from __future__ import annotations

import logging
import warnings
from dataclasses import dataclass
from typing import Callable

import numpy as np
import onnx
import pytest
import torch

from explorer.fusion_engine import detect
from explorer.graph.build import build_graph
from explorer.ui.graph import chain_name
from explorer.sources.onnx_import import import_onnx

ort = pytest.importorskip("onnxruntime")
transformers = pytest.importorskip("transformers")

RTOL = 1e-4
L = 2  # layers of every text and vision transformer below
SEQ = 8
VOCAB = 100
COMMON = dict(hidden_size=32, num_hidden_layers=L, num_attention_heads=4, intermediate_size=64,
              vocab_size=VOCAB, max_position_embeddings=64)


def _encoder_counts() -> dict[str, int]:
    """BERT-style encoder: per layer Add+LayerNorm twice (after attention, after the MLP), the Q/K/V
    sibling linears, the MLP's Linear+GELU and the scores' MatMul+Softmax; one more Add+LayerNorm in
    the embeddings (word + position [+ type], then LayerNorm)."""
    return {"add_layer_norm": 2 * L + 1, "linear_siblings": L, "linear_act": L, "matmul_softmax": L}


def _pre_norm_counts() -> dict[str, int]:
    """ViT (pre-norm): each residual sum feeds the next LayerNorm (layernorm_before/after, the final
    layernorm), the embeddings' sum the first: 2L+1 Add+LayerNorm; siblings, Linear+GELU, scores per layer."""
    return {"add_layer_norm": 2 * L + 1, "linear_siblings": L, "linear_act": L, "matmul_softmax": L}


def _gpt2_counts() -> dict[str, int]:
    """GPT-2 (pre-norm, fused QKV in one Conv1D, so no siblings): 2L+1 Add+LayerNorm as ViT; its MLP's Conv1D
    (an addmm) and written-out tanh-GELU (x·0.5·(1 + tanh(√(2/π)·(x + 0.044715·x³)))) one Linear+act per layer
    (issue 20: the written forms; before, two elementwise chains)."""
    return {"add_layer_norm": 2 * L + 1, "linear_act_forms": L, "matmul_softmax": L}


def _llama_counts() -> dict[str, int]:
    """Llama-style decoder: per layer the Q/K/V siblings, rotary on q and k, SwiGLU, scores, and two
    Add+RMSNorm (the residual sums into post_attention_layernorm and the next input_layernorm / final
    norm); the first input_layernorm has no add before it: one plain RMSNorm. Every norm that linears read
    has its γ folded into them (rms_fold, add_rms_fold); the final norm is the model's output (no head): no fold."""
    return {"add_rms_fold": 2 * L - 1, "add_rms_norm": 1, "rms_fold": 1, "linear_siblings": L, "rotary": L,
            "swiglu": L,
            "matmul_softmax": L}


@dataclass(frozen=True)
class Corpus:
    build: Callable[[], torch.nn.Module]  # the transformers model (seeded before the call)
    inputs: tuple[str, ...]
    onnx_counts: Callable[[], dict[str, int]]
    torch_differs: dict[str, int]  # torch.export's counts minus the ONNX ones, each with its reason below


def _cfg(cls, **kw):
    cfg = cls(**kw)
    if hasattr(cfg, "use_cache"):
        cfg.use_cache = False
    return cfg


T = transformers
# torch.export keeps SDPA as one op (nothing for MatMul+Softmax to find); both ONNX exporters write it out.
SDPA = {"matmul_softmax": -L}
MODELS: dict[str, Corpus] = {
    "bert": Corpus(lambda: T.BertModel(_cfg(T.BertConfig, **COMMON), add_pooling_layer=False),
                   ("input_ids",), _encoder_counts, SDPA),
    "roberta": Corpus(lambda: T.RobertaModel(_cfg(T.RobertaConfig, **COMMON), add_pooling_layer=False),
                      ("input_ids",), _encoder_counts,
                      # its position ids, (cumsum(mask) + 0) * mask, are one elementwise chain on the torch
                      # side; the exporters put a Cast between the add and the multiply
                      {**SDPA, "elementwise_chain": 1}),
    "distilbert": Corpus(lambda: T.DistilBertModel(_cfg(T.DistilBertConfig, dim=32, n_layers=L, n_heads=4,
                                                        hidden_dim=64, vocab_size=VOCAB, max_position_embeddings=64)),
                         ("input_ids",), _encoder_counts, SDPA),
    "vit": Corpus(lambda: T.ViTModel(_cfg(T.ViTConfig, hidden_size=32, num_hidden_layers=L, num_attention_heads=4,
                                          intermediate_size=64, image_size=32, patch_size=8), add_pooling_layer=False),
                  ("pixel_values",), _pre_norm_counts,
                  # on the torch side the embeddings' eval-mode dropout sits between the sum and the first
                  # LayerNorm; Add+LayerNorm now looks through it (issue 20), as the exporters drop it
                  SDPA),
    # decoders get an all-ones attention mask: without one, transformers' packed-sequence check calls
    # aten::diff, which the TorchScript exporter cannot write
    "gpt2": Corpus(lambda: T.GPT2Model(_cfg(T.GPT2Config, n_embd=32, n_layer=L, n_head=4, vocab_size=VOCAB,
                                            n_positions=64)),
                   ("input_ids", "attention_mask"), _gpt2_counts, SDPA),  # the dropout as ViT's
    "llama": Corpus(lambda: T.LlamaModel(_cfg(T.LlamaConfig, **COMMON, num_key_value_heads=2)),
                    ("input_ids", "attention_mask"), _llama_counts, SDPA),
    "qwen2": Corpus(lambda: T.Qwen2Model(_cfg(T.Qwen2Config, **COMMON, num_key_value_heads=2)),
                    ("input_ids", "attention_mask"), _llama_counts, SDPA),
}
EXPORTERS = ("dynamo", "torchscript")


def _inputs(names: tuple[str, ...]) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(0)
    made = {"input_ids": lambda: torch.randint(0, VOCAB, (1, SEQ), generator=gen),
            "attention_mask": lambda: torch.ones(1, SEQ, dtype=torch.int64),
            "pixel_values": lambda: torch.randn(1, 3, 32, 32, generator=gen)}
    return tuple(made[n]() for n in names)


def _nonzero(counts: dict[str, int]) -> dict[str, int]:
    return {k: v for k, v in counts.items() if v}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """``corpus(name)`` -> (the wrapped model, its inputs, {exporter: ONNX path}), built and exported once."""
    from explorer.sources.hf import HFFeatures

    folder = tmp_path_factory.mktemp("onnx_corpus")
    cache: dict[str, tuple] = {}

    def get(name: str):
        if name not in cache:
            spec = MODELS[name]
            torch.manual_seed(0)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                logging.disable(logging.WARNING)
                try:
                    model = HFFeatures(spec.build().eval(), spec.inputs).eval()
                    args = _inputs(spec.inputs)
                    paths = {}
                    for exporter in EXPORTERS:
                        path = str(folder / f"{name}_{exporter}.onnx")
                        torch.onnx.export(model, args, path, dynamo=exporter == "dynamo")
                        paths[exporter] = path
                finally:
                    logging.disable(logging.NOTSET)
            cache[name] = (model, args, paths)
        return cache[name]

    return get


@pytest.mark.parametrize("name", sorted(MODELS))
def test_public_transformers_import_compute_and_detect_as_their_architecture_says(corpus, name):
    model, args, paths = corpus(name)
    spec = MODELS[name]
    expected = spec.onnx_counts()
    for exporter, path in paths.items():
        imported = import_onnx(path)
        with torch.no_grad():
            (ours,) = imported.gm(*args)
        sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
        (ref,) = sess.run(None, {n: a.numpy() for n, a in zip(imported.input_names, args)})
        scale = float(np.abs(ref).max())
        assert scale > 0
        np.testing.assert_allclose(ours.numpy(), ref, rtol=RTOL, atol=RTOL * scale, err_msg=f"{name} {exporter}")
        det = detect(build_graph(imported.gm, name))
        assert _nonzero(det.counts) == expected, f"{name} through the {exporter} exporter"
        names = [chain_name(c) for c in det.chains]  # by module paths, never by node ids or scoped names
        assert not [n for n in names if "node_" in n or "/" in n], names
    captured = torch.export.export(model, args).module()
    torch_counts = _nonzero(detect(build_graph(captured, name)).counts)
    want = _nonzero({k: expected.get(k, 0) + spec.torch_differs.get(k, 0)
                     for k in set(expected) | set(spec.torch_differs)})
    assert torch_counts == want


def test_the_ops_the_importer_refused_are_in_these_exports(corpus):
    """The corpus exercises what it is here for: the dynamo exporter's SDPA writes ``IsNaN``; RoBERTa's
    position ids are a ``CumSum`` from either exporter."""
    def ops(name, exporter):
        return {n.op_type for n in onnx.load(corpus(name)[2][exporter]).graph.node}

    assert "IsNaN" in ops("bert", "dynamo")
    assert {"CumSum", "IsNaN"} <= ops("roberta", "dynamo") and "CumSum" in ops("roberta", "torchscript")


def test_resnet18_chains_from_both_exporters_are_named_by_module_paths(tmp_path):
    """ResNet-18 through the dynamo exporter: its chains read as on the torch side ("layer1.0: conv2 → add →
    relu"), not by node ids. The exporter's optimiser folds each BatchNorm into its convolution and gives the
    folded Conv the BatchNorm's path; the importer names it after the weight it reads (``layer1.0.conv2.weight``,
    ``onnx_import.own_module``), so where torch.export names "conv2 → bn2 → add → relu" the ONNX chain reads
    "conv2 → add → relu", as from the TorchScript exporter; the three downsample Conv+BN pairs, folded
    already, leave nothing to fuse."""
    import torchvision

    torch.manual_seed(0)
    model = torchvision.models.resnet18().eval()
    x = torch.randn(1, 3, 32, 32)
    path = str(tmp_path / "resnet18.onnx")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, (x,), path, dynamo=True)
    imported = import_onnx(path)
    onnx_names = sorted(chain_name(c) for c in detect(build_graph(imported.gm, "resnet18")).chains)
    blocks = [f"layer{i}.{j}" for i in range(1, 5) for j in range(2)]
    assert onnx_names == sorted(["conv1 → relu"] + [f"{b}: conv1 → relu" for b in blocks]
                                + [f"{b}: conv2 → add → relu" for b in blocks])
    torch_chains = detect(build_graph(torch.export.export(model, (x,)).module(), "resnet18")).chains
    torch_names = [chain_name(c) for c in torch_chains if c.pattern in ("conv_bn_act", "conv_bn_add_act")]
    assert sorted(n.replace(" → bn1", "").replace(" → bn2", "") for n in torch_names) == onnx_names
    # the TorchScript exporter records no metadata; its node names (/layer1/layer1.0/conv2/Conv) give the
    # paths, and its folded Conv keeps the convolution's name: "layer1.0: conv2 → add → relu"
    script_path = str(tmp_path / "resnet18_ts.onnx")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, (x,), script_path, dynamo=False)
    script_names = sorted(chain_name(c) for c in detect(build_graph(import_onnx(script_path).gm, "r")).chains)
    assert script_names == sorted(n.replace(" → bn1", "").replace(" → bn2", "") for n in torch_names)
    with torch.no_grad():
        (ours,) = imported.gm(x)
    (ref,) = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, {imported.input_names[0]:
                                                                                      x.numpy()})
    np.testing.assert_allclose(ours.numpy(), ref, rtol=RTOL, atol=RTOL * float(np.abs(ref).max()))


# ---------------------------------------------------------------- torchvision's Swin, Swin-V2 and MaxViT, small


def _swin(v2: bool = False):
    from torchvision.models import swin_transformer as S

    extra = dict(block=S.SwinTransformerBlockV2, downsample_layer=S.PatchMergingV2) if v2 else {}
    return S.SwinTransformer(patch_size=[4, 4], embed_dim=16, depths=[2, 2], num_heads=[2, 2], window_size=[4, 4],
                             num_classes=10, **extra)


def _maxvit():
    from torchvision.models import maxvit

    return maxvit.MaxVit(input_size=(64, 64), stem_channels=8, partition_size=4, block_channels=[16, 32],
                         block_layers=[1, 1], head_dim=8, stochastic_depth_prob=0.0, num_classes=10)


STAGES = 2  # every model below: two stages of one layer (MaxViT) or of two blocks, plain then shifted (Swin)
VISION = {
    # Swin: per block an MLP Linear+GELU and the attention sum into norm2; the MLP sum into the next block's
    # norm1 within a stage, and into the final norm after the last (the patch merging's cat comes between
    # otherwise): 3 per stage, one more at the end. A plain block's scores are MatMul+Softmax; a shifted
    # block's bias and mask make two adds before the softmax: MatMul+Softmax with its two additive terms (issue 20;
    # before, an elementwise chain). The patch embedding's conv 4×4/4 + LayerNorm over channels is ConvNeXt's stem.
    # The ScatterND writes the shifted windows' mask. The one MLP sum per stage that reaches no norm (the
    # patch merging comes next; the last stage's goes into the final norm) is its fc2's Linear + residual add.
    "swin": (lambda: _swin(), "ScatterND",
             {"add_layer_norm": 3 * STAGES + 1, "linear_act": 2 * STAGES, "matmul_softmax": 2 * STAGES,
              "linear_residual": STAGES - 1, "convnext_stem_ln": 1}, {}),
    # Swin-V2 is post-norm (no Add+LayerNorm but the last stage's final norm) and normalises q and k
    # (ReduceL2). Its continuous position-bias MLP and logit scale read only parameters: the importer folds
    # them into constants, so no Linear+ReLU of cpb_mlp is left, and every block's scores (scaled by that
    # constant) are MatMul+Softmax with their bias (and the shifted ones' mask) as additive terms; the q/k
    # normalisations are elementwise chains (four per stage). Its stem as Swin's. (torch.export keeps both computations; not compared here.)
    "swin_v2": (lambda: _swin(v2=True), "ReduceL2",
                {"add_layer_norm": 1, "linear_act": 2 * STAGES, "matmul_softmax": 2 * STAGES,
                 "elementwise_chain": 4 * STAGES, "convnext_stem_ln": 1}, None),
    # MaxViT: the stem's Conv+BN+GELU, per layer MBConv's two Conv+BN+GELU, its squeeze-excite and its
    # projection + residual (Conv+Add), then block and grid attention, each an Add+LayerNorm and an MLP
    # Linear+GELU, and the head's Linear+Tanh. The exporter folds BatchNorm into the convolutions (torch.export
    # keeps it: conv_bn_act there). Its block and grid attention are Einsum scores + Softmax: MatMul+Softmax,
    # two per layer (issue 20). Of each layer's four residual sums, three reach a LayerNorm (across the window
    # partition's reshapes, issue 20); the last is fc2's Linear + residual add: one per layer.
    "maxvit": (_maxvit, "Einsum",
               {"conv_act": 1 + 2 * STAGES, "squeeze_excite": STAGES, "conv_add": STAGES,
                "add_layer_norm": 3 * STAGES, "linear_act": 2 * STAGES + 1, "linear_residual": STAGES,
                "matmul_softmax": 2 * STAGES},
               {"conv_act": -(1 + 2 * STAGES), "conv_bn_act": 1 + 2 * STAGES}),
}


@pytest.mark.parametrize("name", sorted(VISION))
def test_torchvision_window_attention_models_import_and_detect(tmp_path, name):
    """Through the TorchScript exporter (the dynamo exporter writes the same ops, at ten times the export
    time on this machine): the op each was refused for, a match with onnxruntime, the pinned counts, and
    torch.export's where stated."""
    build, op, expected, torch_differs = VISION[name]
    torch.manual_seed(0)
    model = build().eval()
    x = torch.randn(1, 3, 64, 64, generator=torch.Generator().manual_seed(1))
    path = str(tmp_path / f"{name}.onnx")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, (x,), path, dynamo=False)
    assert op in {n.op_type for n in onnx.load(path).graph.node}
    imported = import_onnx(path)
    with torch.no_grad():
        (ours,) = imported.gm(x)
    (ref,) = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, {imported.input_names[0]:
                                                                                      x.numpy()})
    np.testing.assert_allclose(ours.numpy(), ref, rtol=RTOL, atol=RTOL * float(np.abs(ref).max()))
    assert _nonzero(detect(build_graph(imported.gm, name)).counts) == expected
    if torch_differs is not None:
        captured = torch.export.export(model, (x,)).module()
        want = _nonzero({k: expected.get(k, 0) + torch_differs.get(k, 0) for k in set(expected) | set(torch_differs)})
        assert _nonzero(detect(build_graph(captured, name)).counts) == want
