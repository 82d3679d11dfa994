"""Loading a local Hugging Face folder (``save_pretrained``, safetensors) that a user names.

What a folder can do to a loader that trusts it, and what this module does instead:

- ``config.json`` declares the model's size: a million layers hang the build,
  ``hidden_size`` 8192 allocates gigabytes. ``estimate_bytes(config)`` counts
  parameters from the declared sizes (embeddings, per-layer attention and MLP
  weights) plus one forward's activations, and ``limits.check_budget`` refuses
  before anything is built; layer counts are capped at ``MAX_LAYERS``.
- ``model.safetensors.index.json`` may name any shard path (absolute, ``..``)
  and transformers joins it to the folder and reads it. Every file the loader
  reads must resolve inside the folder (links followed) and be a regular file.
- transformers reads more than it is asked for (``generation_config.json``,
  adapter configs, custom code). So nothing is loaded from the user's folder:
  a private staging folder receives the validated config (re-serialised from
  the parsed JSON), the validated index (re-serialised) and links to the
  validated weight files, and transformers loads from there, offline, with
  ``trust_remote_code=False`` and ``use_safetensors=True``.
- Safetensors headers are read (bounded) and the tensors they declare must lie
  inside their file; their total is checked against the budget too.
- ``architectures`` in the config names the class that wrote the folder; it is
  taken only when it is a bare model class the installed transformers package
  exports for this config's type (``named_base_model``: a ``T5EncoderModel``
  folder builds ``T5EncoderModel``, not AutoModel's encoder-decoder ``T5Model``);
  any other name leaves the choice to ``AutoModel``. A name is never code.

``load_hf_folder(path, batch, seq_len) -> LoadedModel`` is what
``explorer.sources.load_model`` calls for a folder.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import struct
import tempfile
from pathlib import Path
from typing import Any, Iterator

import torch

from explorer import jsonfile
from explorer.messages import LOAD
from explorer.errors import ModelLoadError
from explorer.sources import limits

MAX_LAYERS = 256
MAX_DIM = 1 << 20
MAX_CONFIG_BYTES = 4 * 2**20
MAX_INDEX_BYTES = 64 * 2**20
MAX_HEADER_BYTES = 100 * 2**20
INDEX_NAME = "model.safetensors.index.json"
PICKLE_SUFFIXES = (".pt", ".pth", ".bin", ".pkl", ".pickle", ".ckpt")
_LAYER_KEYS = ("num_hidden_layers", "n_layer", "num_layers", "n_layers", "encoder_layers", "decoder_layers",
               "num_encoder_layers", "num_decoder_layers", "depths")
_HIDDEN_KEYS = ("hidden_size", "d_model", "n_embd", "dim", "embed_dim")
_INTER_KEYS = ("intermediate_size", "ffn_dim", "n_inner", "hidden_dim", "d_ff", "encoder_ffn_dim",
               "decoder_ffn_dim")
_DTYPE_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1,
                "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1, "U16": 2, "U32": 4, "U64": 8}


def _int_field(config: dict, keys: tuple[str, ...], where: str, default: int = 0, total: bool = False) -> int:
    """The first of ``keys`` the config sets: an integer, or a list of them (Swin's ``num_heads``,
    ``depths``: their largest entry, or with ``total`` their sum)."""
    for key in keys:
        value = config.get(key)
        if value is None:
            continue
        if isinstance(value, list) and value and len(value) <= MAX_LAYERS and all(
                isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= MAX_DIM * 64 for v in value):
            value = sum(value) if total else max(value)
        if isinstance(value, bool) or not isinstance(value, int):
            raise ModelLoadError(f"{where}: '{key}' is {str(value)[:40]!r}, not an integer")
        if value < 0 or value > MAX_DIM * 64:
            raise ModelLoadError(f"{where}: '{key}' is {value}, outside any model this tool loads")
        return value
    return default


def _sub_configs(config: dict) -> Iterator[dict]:
    """The config and every nested config object (text_config, vision_config, ...), without recursion."""
    stack, seen = [config], 0
    while stack and seen < 64:
        current = stack.pop()
        seen += 1
        yield current
        for value in current.values():
            if isinstance(value, dict):
                stack.append(value)


def estimate_bytes(config: dict, batch: int, seq_len: int, where: str) -> int:
    """Bytes a model of ``config`` materialises in fp32 (weights plus one forward at ``batch`` ×
    ``seq_len``), from the declared sizes alone. Raises ``ModelLoadError`` for a layer count over
    ``MAX_LAYERS`` or a size that is not a non-negative integer."""
    total = 0
    for sub in _sub_configs(config):
        layers = sum(_int_field(sub, (k,), where, total=True) for k in _LAYER_KEYS)
        if layers > MAX_LAYERS:
            raise ModelLoadError(f"{where}: the config declares {layers} layers; at most {MAX_LAYERS} are loaded")
        hidden = _int_field(sub, _HIDDEN_KEYS, where)
        if not hidden:
            continue
        inter = _int_field(sub, _INTER_KEYS, where, 4 * hidden)
        vocab = _int_field(sub, ("vocab_size",), where)
        positions = _int_field(sub, ("max_position_embeddings", "n_positions", "max_seq_len"), where)
        heads = max(_int_field(sub, ("num_attention_heads", "n_head", "num_heads"), where, 1), 1)
        experts = max(_int_field(sub, ("num_local_experts", "num_experts", "n_routed_experts"), where, 1), 1)
        image = sub.get("image_size")
        patch = _int_field(sub, ("patch_size",), where, 16) or 16
        if isinstance(image, int) and not isinstance(image, bool) and image > 0:
            tokens = (min(image, 1 << 16) // patch) ** 2 + 1
        else:
            tokens = seq_len
        params = (vocab + positions + 2) * hidden + layers * (4 * hidden * hidden + 2 * experts * hidden * inter
                                                             + 8 * hidden)
        activations = batch * tokens * (6 * hidden + 2 * inter) + 3 * batch * heads * tokens * tokens
        total += 4 * (params + activations)
    return total


def _read_json(real: Path, where: str, max_bytes: int, max_depth: int):
    """A JSON file of the folder: a regular file, at most ``max_bytes``, its parse cost within the budget."""
    with jsonfile.open_regular_file(real, where, ModelLoadError) as handle:
        data = handle.read(max_bytes + 1)
    limits.check_json_cost(data, where)
    return jsonfile.parse_json(data, where, ModelLoadError, max_bytes, max_depth)


def _header_length(handle, shown: str) -> tuple[int, int]:
    """``(file size, header length)`` of an open safetensors file, read from its fixed 8-byte prefix; the
    handle is left just past it. A length the file or ``MAX_HEADER_BYTES`` cannot hold is one line."""
    size = os.fstat(handle.fileno()).st_size
    head = handle.read(8)
    if len(head) != 8:
        raise ModelLoadError(f"{shown} is not a safetensors file (too short)")
    (length,) = struct.unpack("<Q", head)
    if length > min(MAX_HEADER_BYTES, size - 8):
        raise ModelLoadError(f"{shown} declares a header of {length} bytes, more than the file or the limit")
    return size, length


def check_headers(path: Path) -> None:
    """What the caller checks before the isolated loader, reading no JSON: a folder with a config, whose
    ``.safetensors`` files resolve inside it, are regular, and declare (in their fixed 8-byte header) a
    header length their size can hold. The JSON (config, index, safetensors headers) is parsed only in
    the isolated loader's child first."""
    folder = Path(os.path.realpath(path))
    if not folder.is_dir():
        raise ModelLoadError(LOAD("not_folder", path=path))
    if not (folder / "config.json").exists() and not (folder / "config.json").is_symlink():
        raise ModelLoadError(LOAD("not_hf_folder", path=path))
    limits.resolve_inside(folder, "config.json", "config.json")
    for name in sorted(p.name for p in folder.iterdir() if p.name.endswith(".safetensors"))[:10_000]:
        real = limits.resolve_inside(folder, name, "weight file")
        with jsonfile.open_regular_file(real, name, ModelLoadError) as handle:
            _header_length(handle, name)


def _read_config(folder: Path) -> dict:
    where = f"{folder.name}/config.json"
    real = limits.resolve_inside(folder, "config.json", "config.json")
    config = _read_json(real, where, MAX_CONFIG_BYTES, 32)
    if not isinstance(config, dict):
        raise ModelLoadError(f"{where} is not a JSON object")
    if config.get("auto_map") or config.get("trust_remote_code"):
        raise ModelLoadError(f"{where} asks for custom code (auto_map), which is never run")
    model_type = config.get("model_type")
    if not isinstance(model_type, str) or not model_type.replace("-", "_").isidentifier():
        raise ModelLoadError(f"{where} has no valid 'model_type'")
    return config


def _safetensors_bytes(path: Path, shown: str) -> int:
    """Bytes of the tensors a safetensors file declares; each must lie inside the file."""
    with jsonfile.open_regular_file(path, shown, ModelLoadError) as handle:
        size, length = _header_length(handle, shown)
        text = handle.read(length)
        limits.check_json_cost(text, f"{shown}: its header")
        header = jsonfile.parse_json(text, shown, ModelLoadError, MAX_HEADER_BYTES, 8)
        del text
    if not isinstance(header, dict):
        raise ModelLoadError(f"{shown} has no safetensors header object")
    data_size = size - 8 - length
    total = 0
    for key, entry in header.items():
        if key == "__metadata__":
            continue
        if not isinstance(entry, dict):
            raise ModelLoadError(f"{shown}: tensor '{str(key)[:60]}' has no description")
        offsets, shape, dtype = entry.get("data_offsets"), entry.get("shape"), entry.get("dtype")
        if (not isinstance(offsets, list) or len(offsets) != 2 or not all(
                isinstance(o, int) and not isinstance(o, bool) and 0 <= o <= data_size for o in offsets)
                or offsets[0] > offsets[1] or dtype not in _DTYPE_BYTES or not isinstance(shape, list)):
            raise ModelLoadError(f"{shown}: tensor '{str(key)[:60]}' lies outside the file or is malformed")
        if limits.tensor_bytes(shape, _DTYPE_BYTES[dtype], f"{shown}: '{key}'") != offsets[1] - offsets[0]:
            raise ModelLoadError(f"{shown}: tensor '{str(key)[:60]}' declares a shape its bytes do not hold")
        total += offsets[1] - offsets[0]
    return total


def _weight_files(folder: Path) -> tuple[list[tuple[str, Path]], dict | None]:
    """The validated weight files (name, real path) and the validated index, if any."""
    names = sorted(p.name for p in folder.iterdir() if p.name.endswith(".safetensors"))
    index = None
    if (folder / INDEX_NAME).exists() or (folder / INDEX_NAME).is_symlink():
        real = limits.resolve_inside(folder, INDEX_NAME, INDEX_NAME)
        index = _read_json(real, f"{folder.name}/{INDEX_NAME}", MAX_INDEX_BYTES, 8)
        weight_map = index.get("weight_map") if isinstance(index, dict) else None
        if not isinstance(weight_map, dict) or not weight_map:
            raise ModelLoadError(f"{INDEX_NAME} has no 'weight_map' object")
        shards = set()
        for key, shard in weight_map.items():
            if not isinstance(shard, str) or not shard.endswith(".safetensors"):
                raise ModelLoadError(f"{INDEX_NAME} maps '{str(key)[:60]}' to {str(shard)[:80]!r}, "
                                     "not a .safetensors file")
            if "/" in shard or "\\" in shard or shard.startswith(".."):
                raise ModelLoadError(f"{INDEX_NAME} names the shard '{shard[:120]}' outside its folder; refused")
            shards.add(shard)
        missing = sorted(s for s in shards if s not in names)
        if missing:
            raise ModelLoadError(f"{INDEX_NAME} names shard '{missing[0][:120]}', which is not in the folder")
        names = sorted(shards)
        index = {"metadata": {}, "weight_map": {str(k): v for k, v in weight_map.items()}}
    if not names:
        pickled = sorted(p.name for p in folder.iterdir() if p.suffix in PICKLE_SUFFIXES)
        reason = (f"only pickled weights ({', '.join(pickled)}), which are refused" if pickled
                  else "no .safetensors weights")
        raise ModelLoadError(f"{folder}: {reason}; save with save_pretrained(safe_serialization=True)")
    files = []
    for name in names:
        real = limits.resolve_inside(folder, name, "weight file")
        files.append((name, real))
    return files, index


@contextlib.contextmanager
def _quiet_transformers() -> Iterator[None]:
    """Silence transformers' load reports and warnings for the duration (one line per failure)."""
    from transformers.utils import logging as hf_logging

    level = hf_logging.get_verbosity()
    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        hf_logging.set_verbosity(level)
        if bars:
            hf_logging.enable_progress_bar()


class HFFeatures(torch.nn.Module):
    """Wrap a transformers model so it returns one tensor (logits or the last hidden state)."""

    def __init__(self, model: torch.nn.Module, names: tuple[str, ...]) -> None:
        super().__init__()
        self.model = model
        self.names = names

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        out = self.model(**dict(zip(self.names, inputs)))
        return out.logits if getattr(out, "logits", None) is not None else out.last_hidden_state


def _first_int(config: Any, *names: str, default: int = 0) -> int:
    """The first of ``names`` the config sets to a positive integer (a list's first entry counts)."""
    for name in names:
        value = getattr(config, name, None)
        if isinstance(value, (list, tuple)) and value:
            value = value[0]
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return int(value)
    return default


def _tokens(name: str, vocab: int) -> Any:
    from explorer.sources import zoo

    return zoo.TensorSpec(name, ("B", "S"), "int64", "tokens", vocab)


def model_inputs(model: torch.nn.Module, config: Any, path: Path, seq_len: int | None):
    """The example inputs of a transformers model, from its config: ``(InputSpec, names)``.

    What the model reads first is its ``main_input_name``: token ids (``input_ids``, with an all-ones
    ``attention_mask`` where the model takes one), images (``pixel_values``: ``num_channels`` ×
    ``image_size``², a list-valued size read as (height, width)), audio features (``input_features``:
    ``num_mel_bins`` × the frames the encoder expects, ``2 × max_source_positions`` for Whisper) or a
    waveform (``input_values``). An encoder-decoder model (``is_encoder_decoder``: T5, BART, Whisper)
    also gets ``decoder_input_ids`` of the sequence length. Raises ``ModelLoadError`` (one line) for a
    model whose inputs the config does not tell.
    """
    import inspect

    from explorer.sources import zoo

    main = getattr(model, "main_input_name", "input_ids")
    params = set(inspect.signature(model.forward).parameters)
    vocab = _first_int(config, "vocab_size")
    enc_dec = bool(getattr(config, "is_encoder_decoder", False))
    limit = _first_int(config, "max_target_positions", "max_position_embeddings", "n_positions", default=128)
    default_seq = min(128, limit)
    if seq_len is not None and seq_len > limit:
        raise ModelLoadError(LOAD("seq_too_long", seq_len=seq_len, limit=limit))
    tensors: list = []
    if main == "input_ids" and vocab:
        tensors.append(_tokens("input_ids", vocab))
        if "attention_mask" in params:
            tensors.append(zoo.TensorSpec("attention_mask", ("B", "S"), "int64", "ones"))
    elif main == "pixel_values":
        size = getattr(config, "image_size", None)
        hw = tuple(size[:2]) if isinstance(size, (list, tuple)) and len(size) >= 2 else (size, size)
        if not all(isinstance(v, int) and not isinstance(v, bool) and 0 < v <= 4096 for v in hw):
            raise ModelLoadError(f"{path}: cannot tell this model's image size (image_size is {str(size)[:40]})")
        tensors.append(zoo.TensorSpec("pixel_values", ("B", _first_int(config, "num_channels", default=3), *hw)))
        default_seq = None
    elif main == "input_features":
        mels = _first_int(config, "num_mel_bins", "feature_size", "input_feat_per_channel")
        frames = 2 * _first_int(config, "max_source_positions", default=0) or 3000
        if not mels:
            raise ModelLoadError(f"{path}: cannot tell this model's audio features (no num_mel_bins in config)")
        tensors.append(zoo.TensorSpec("input_features", ("B", mels, frames)))
    elif main == "input_values":
        tensors.append(zoo.TensorSpec("input_values", ("B", 16000)))
        default_seq = None
    else:
        raise ModelLoadError(f"{path}: cannot tell this model's inputs (it reads '{main}'; the config gives "
                             "no vocabulary, image size or audio features)")
    if enc_dec and "decoder_input_ids" in params:
        if not vocab:
            raise ModelLoadError(f"{path}: an encoder-decoder model without a decoder vocabulary (vocab_size)")
        tensors.append(_tokens("decoder_input_ids", vocab))
        default_seq = default_seq or min(128, limit)
    spec = zoo.InputSpec(tuple(tensors), seq_len=default_seq)
    return spec, tuple(t.name for t in tensors)


def check_folder(path: Path, batch: int | None = None, seq_len: int | None = None):
    """Validate a folder without building anything; returns (config dict, [(name, real path)], index).

    The config, the index and every weight file must resolve inside the folder;
    the safetensors headers must describe tensors inside their files; declared
    weights and the size estimate from the config must fit the memory budget.
    """
    folder = Path(os.path.realpath(path))
    if not folder.is_dir():
        raise ModelLoadError(LOAD("not_folder", path=path))
    if not (folder / "config.json").exists() and not (folder / "config.json").is_symlink():
        raise ModelLoadError(LOAD("not_hf_folder", path=path))
    config_dict = _read_config(folder)
    files, index = _weight_files(folder)
    declared = sum(_safetensors_bytes(real, name) for name, real in files)
    limits.check_budget(declared, f"{path.name}: its weights")
    b = int(batch or 1)
    max_len = config_dict.get("max_position_embeddings")
    if seq_len is not None and isinstance(max_len, int) and seq_len > max_len:
        raise ModelLoadError(LOAD("seq_too_long", seq_len=seq_len, limit=max_len))
    s = int(seq_len or min(128, max_len if isinstance(max_len, int) and max_len > 0 else 128))
    limits.check_budget(estimate_bytes(config_dict, b, s, path.name), f"{path.name} (weights and one forward "
                                                                        f"at batch {b}, sequence {s})")
    return config_dict, files, index


_BASE_MODEL_NAME = re.compile(r"[A-Z][A-Za-z0-9]{0,80}Model")


def named_base_model(config: Any) -> Any:
    """The transformers class the folder's config names in ``architectures`` when it is a bare model (no head:
    ``T5EncoderModel``, ``BertModel``) of this config's type, from the installed transformers package (never code
    from the folder); else None (then ``AutoModel`` decides, as for ``LlamaForCausalLM``: its base model).

    ``AutoModel`` maps a config type to one class: a ``T5Config`` to the encoder-decoder ``T5Model``, which
    cannot run the ``T5EncoderModel`` that wrote the folder without decoder inputs. Only a name of one word
    ending in ``Model`` (not a ``...PreTrainedModel``) that the transformers package itself exports, a
    ``PreTrainedModel`` whose ``config_class`` the config is, is taken."""
    import transformers

    names = getattr(config, "architectures", None)
    if not isinstance(names, (list, tuple)) or len(names) != 1 or not isinstance(names[0], str):
        return None
    name = names[0]
    if not _BASE_MODEL_NAME.fullmatch(name) or name.endswith("PreTrainedModel"):
        return None
    try:
        cls = getattr(transformers, name, None)
    except Exception:   # a lazy import of transformers' own module that fails here: AutoModel decides
        return None
    config_class = getattr(cls, "config_class", None)
    if not isinstance(cls, type) or not issubclass(cls, transformers.PreTrainedModel) or \
            not isinstance(config_class, type) or not isinstance(config, config_class):
        return None
    return cls


def load_hf_folder(path: Path, batch: int | None = None, seq_len: int | None = None):
    """Load a ``save_pretrained`` folder offline, safetensors only, eager attention; returns a ``LoadedModel``.

    Raises ``ModelLoadError`` (one line) before building anything whose declared
    size is over the memory budget, and for any file outside the folder.
    """
    from explorer.sources import LoadedModel, capture, zoo

    config_dict, files, index = check_folder(path, batch, seq_len)
    staging = Path(tempfile.mkdtemp(prefix="fusion-explorer-hf-"))
    try:
        (staging / "config.json").write_text(json.dumps(config_dict))
        if index is not None:
            (staging / INDEX_NAME).write_text(json.dumps(index))
        for name, real in files:
            os.symlink(real, staging / name)
        try:
            from transformers import AutoConfig, AutoModel, AutoModelForSequenceClassification

            with _quiet_transformers():
                config = AutoConfig.from_pretrained(str(staging), local_files_only=True, trust_remote_code=False)
                cls = AutoModelForSequenceClassification if getattr(config, "architectures", None) and any(
                    "SequenceClassification" in str(a) for a in config.architectures) else \
                    (named_base_model(config) or AutoModel)
                model = cls.from_pretrained(str(staging), local_files_only=True, trust_remote_code=False,
                                            use_safetensors=True, attn_implementation="eager")
        except (Exception, RecursionError) as exc:
            text = " ".join(str(exc).split())[:300] or type(exc).__name__
            raise ModelLoadError(f"{path}: could not load the Hugging Face model: {text}") from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    model.eval()
    spec, names = model_inputs(model, config, path, seq_len)
    wrapper = HFFeatures(model, names).eval()
    inputs = spec.make(batch, seq_len)
    gm = capture(wrapper, inputs, path.name)
    limits.check_graph_fits(gm, path.name)
    rb, rs = spec.resolve(batch, seq_len)
    task = "classification" if cls is AutoModelForSequenceClassification else "features"
    return LoadedModel(
        name=path.name, source="hf", gm=gm, example_inputs=inputs, input_names=list(names),
        task=task, description=f"Hugging Face folder {path.name} ({type(model).__name__})",
        module=wrapper, path=str(path), batch=rb, seq_len=rs if spec.seq_len else None,
    )
