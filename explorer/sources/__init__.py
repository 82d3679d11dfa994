"""Model sources: the zoo, ONNX files, torch.export archives, Hugging Face folders.

``load_model(source, batch=..., seq_len=...)`` accepts a zoo name or a path
and returns a ``LoadedModel``: the ATen-level fx graph every other part of the
explorer works on, with example inputs of the requested size.

Trust rules, because users hand us files:
- nothing is ever unpickled with ``weights_only=False``: a ``.pt2`` archive is
  checked member by member before ``torch.export.load`` sees it, and plain
  ``.pt``/``.pth``/``.bin`` pickles are refused outright;
- Hugging Face folders load with ``local_files_only``, no remote code, and
  safetensors weights only;
- ONNX external data must stay inside the model's folder (``onnx_import``).
"""

from __future__ import annotations

import dataclasses
import io
import json
import os
import zipfile
from pathlib import Path
from typing import Any

import torch
import torch.fx

from explorer.sources import zoo
from explorer.errors import ExplorerError, ModelLoadError

PICKLE_SUFFIXES = (".pt", ".pth", ".bin", ".pkl", ".pickle", ".ckpt")


@dataclasses.dataclass
class LoadedModel:
    """A model ready for analysis and measurement.

    ``gm`` is the ATen-level graph (weights as ``get_attr``, placeholders are
    the user inputs, output a tuple or a tensor). ``module`` is the original
    eager module where one exists (zoo, Hugging Face): the runner times it as
    the eager and ``torch.compile`` baselines.
    """

    name: str
    source: str  # zoo | onnx | pt2 | hf
    gm: torch.fx.GraphModule
    example_inputs: tuple[torch.Tensor, ...]
    input_names: list[str]
    task: str = "features"
    description: str = ""
    module: torch.nn.Module | None = None
    path: str | None = None
    batch: int = 1
    seq_len: int | None = None


def capture(module: torch.nn.Module, inputs: tuple[torch.Tensor, ...], name: str) -> torch.fx.GraphModule:
    """Capture ``module`` as an ATen-level GraphModule with ``torch.export`` (training IR)."""
    try:
        with torch.no_grad():
            program = torch.export.export(module, inputs)
    except ExplorerError:
        raise
    except Exception as exc:  # export raises many types; the user needs one line
        raise ModelLoadError(f"could not capture {name} with torch.export: {_first_line(exc)}") from exc
    return _unlift(program)


def _unlift(program: torch.export.ExportedProgram) -> torch.fx.GraphModule:
    gm = program.module()
    # Drop export's input-guard submodule call: it checks shapes, it is not model work.
    for node in list(gm.graph.nodes):
        if node.op == "call_module" and not node.users:
            gm.graph.erase_node(node)
    gm.graph.lint()
    gm.recompile()
    return gm


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return (text[0] if text else type(exc).__name__)[:300]


# ------------------------------------------------------------------ dispatch

def load_model(source: str, batch: int | None = None, seq_len: int | None = None,
               data_path: str | None = None) -> LoadedModel:
    """Load a zoo name or a path (``.onnx``, ``.pt2``, or a Hugging Face folder).

    Raises ``ModelLoadError`` (one line) for anything it cannot load safely.
    """
    if source in zoo.ZOO:
        return load_zoo(source, batch, seq_len)
    path = Path(source)
    if not path.exists():
        if os.sep in source or "." in source:
            raise ModelLoadError(f"no such file or folder: {source}")
        zoo.get_entry(source)  # raises the "unknown model" message
    if path.is_dir():
        return load_hf_folder(path, batch, seq_len)
    suffix = path.suffix.lower()
    if suffix == ".onnx":
        return load_onnx(path, batch, seq_len, data_path)
    if suffix == ".pt2":
        return load_pt2(path)
    if suffix in PICKLE_SUFFIXES:
        raise ModelLoadError(
            f"{path.name}: pickled PyTorch files are refused because unpickling can run arbitrary "
            "code; save the model with torch.export.save (.pt2) or export it to ONNX"
        )
    raise ModelLoadError(f"{path.name}: unknown model format '{suffix or 'no suffix'}' "
                         "(expected a zoo name, .onnx, .pt2 or a Hugging Face folder)")


def load_zoo(name: str, batch: int | None = None, seq_len: int | None = None) -> LoadedModel:
    entry = zoo.get_entry(name)
    inputs = entry.example_inputs(batch, seq_len)
    module = entry.build()
    gm = capture(module, inputs, name)
    b, s = entry.inputs.resolve(batch, seq_len)
    return LoadedModel(
        name=name, source="zoo", gm=gm, example_inputs=inputs,
        input_names=[t.name for t in entry.inputs.tensors], task=entry.task,
        description=entry.description, module=module, batch=b,
        seq_len=s if entry.inputs.seq_len is not None else None,
    )


# ------------------------------------------------------------------ ONNX

def load_onnx(path: Path, batch: int | None = None, seq_len: int | None = None,
              data_path: str | None = None) -> LoadedModel:
    from explorer.sources import onnx_import

    imported = onnx_import.import_onnx(path, data_path=data_path,
                                       input_shapes=None if batch is None and seq_len is None else
                                       _onnx_shape_overrides(path, batch, seq_len))
    inputs = _inputs_for_shapes(imported.input_shapes, imported.input_dtypes, batch, seq_len)
    gm = imported.gm
    from explorer.graph.build import ensure_shapes

    try:
        ensure_shapes(gm, inputs)
    except Exception as exc:
        raise ModelLoadError(f"{path.name}: shapes could not be propagated: {_first_line(exc)}") from exc
    b = inputs[0].shape[0] if inputs and inputs[0].dim() else 1
    return LoadedModel(
        name=path.stem, source="onnx", gm=gm, example_inputs=inputs,
        input_names=list(imported.input_names), task=_guess_task(inputs, gm),
        description=f"ONNX file {path.name} (opset {imported.opset})", path=str(path),
        batch=int(b), seq_len=seq_len,
    )


def _onnx_shape_overrides(path: Path, batch: int | None, seq_len: int | None) -> dict[str, tuple] | None:
    """Concrete input shapes for an ONNX model's symbolic dims: dim 0 is the batch, dim 1 of an
    integer input is the sequence."""
    import onnx

    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception:
        return None  # import_onnx reports the real problem
    shapes: dict[str, tuple] = {}
    inits = {i.name for i in model.graph.initializer}
    for inp in model.graph.input:
        if inp.name in inits:
            continue
        dims = []
        tensor_type = inp.type.tensor_type
        for i, d in enumerate(tensor_type.shape.dim):
            if i == 0 and batch is not None:
                dims.append(int(batch))
            elif i == 1 and seq_len is not None and tensor_type.elem_type in (6, 7):
                dims.append(int(seq_len))
            elif d.HasField("dim_value"):
                dims.append(int(d.dim_value))
            else:
                dims.append(1 if i == 0 else 128)
        shapes[inp.name] = tuple(dims)
    return shapes


def _inputs_for_shapes(shapes: list[tuple], dtypes: list[torch.dtype], batch: int | None,
                       seq_len: int | None) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(zoo.SEED)
    out = []
    for shape, dtype in zip(shapes, dtypes):
        dims = []
        for i, d in enumerate(shape):
            if isinstance(d, int) and d > 0 and not (i == 0 and batch is not None):
                dims.append(d)
            elif i == 0:
                dims.append(batch or 1)
            else:
                dims.append(seq_len or 128)
        if any(d > 1 << 31 for d in dims):
            raise ModelLoadError(f"input shape {dims} is too large")
        if dtype in (torch.int64, torch.int32):
            out.append(torch.randint(0, 1000, dims, generator=gen, dtype=dtype))
        elif dtype == torch.bool:
            out.append(torch.ones(dims, dtype=torch.bool))
        else:
            out.append(torch.randn(dims, generator=gen).to(dtype))
    return tuple(out)


def _guess_task(inputs: tuple[torch.Tensor, ...], gm: torch.fx.GraphModule) -> str:
    out = [n for n in gm.graph.nodes if n.op == "output"][0].args[0]
    first = out[0] if isinstance(out, (list, tuple)) else out
    val = first.meta.get("val") if isinstance(first, torch.fx.Node) else None
    if isinstance(val, torch.Tensor) and val.dim() == 2 and val.shape[-1] >= 10:
        return "classification"
    return "features"


# ------------------------------------------------------------------ torch.export archives

def check_pt2_archive(data: bytes, name: str) -> None:
    """Refuse a ``.pt2`` whose loading would unpickle anything with ``weights_only=False``.

    ``torch.export.load`` unpickles tensor-subclass weights, custom objects and
    legacy ``.pt`` payloads with the full unpickler, and retries sample inputs
    with it when the safe one fails. We accept only archives where every
    weight and constant is a raw tensor payload and the sample inputs load with
    the safe unpickler.
    """
    try:
        archive = zipfile.ZipFile(io.BytesIO(data))
        names = archive.namelist()
    except zipfile.BadZipFile:
        if data[:1] == b"\x80":
            raise ModelLoadError(f"{name}: this is a pickle, not a torch.export archive; "
                                 "pickles are refused because they can run arbitrary code") from None
        raise ModelLoadError(f"{name}: not a torch.export archive (not a zip file)") from None
    if not any("/models/" in n and n.endswith(".json") for n in names):
        raise ModelLoadError(f"{name}: not a torch.export archive (no models/*.json inside)")
    for member in names:
        if member.startswith("/") or ".." in member.split("/"):
            raise ModelLoadError(f"{name}: archive member '{member}' escapes the archive")
        base = member.split("/", 1)[-1]
        if base.startswith(("data/weights/", "data/constants/")) and base.endswith(".pt"):
            raise ModelLoadError(f"{name}: legacy pickled weights ({base}) are refused; "
                                 "re-save with a current torch.export.save")
        if base.startswith(("data/aotinductor/", "data/mtia/", "data/executorch/")):
            raise ModelLoadError(f"{name}: compiled artifacts ({base}) are refused; save the "
                                 "ExportedProgram alone with torch.export.save")
        if base.endswith("_config.json") and base.startswith(("data/weights/", "data/constants/")):
            try:
                config = json.loads(archive.read(member))["config"]
            except Exception:
                raise ModelLoadError(f"{name}: unreadable payload config {base}") from None
            for key, meta in config.items():
                path_name = str(meta.get("path_name", ""))
                if meta.get("use_pickle") or path_name.startswith(("custom_obj", "opaque_obj")):
                    raise ModelLoadError(f"{name}: '{key}' is stored as a pickle, which is "
                                         "refused because unpickling can run arbitrary code")
        if base.startswith("data/sample_inputs/"):
            try:
                torch.load(io.BytesIO(archive.read(member)), weights_only=True)
            except Exception:
                raise ModelLoadError(f"{name}: its sample inputs need the unsafe unpickler; refused") from None


def load_pt2(path: Path) -> LoadedModel:
    data = path.read_bytes()
    check_pt2_archive(data, path.name)
    try:
        program = torch.export.load(io.BytesIO(data))
    except Exception as exc:
        raise ModelLoadError(f"{path.name}: could not read the torch.export archive: {_first_line(exc)}") from exc
    args, kwargs = program.example_inputs if program.example_inputs else ((), {})
    if kwargs:
        raise ModelLoadError(f"{path.name}: keyword inputs are not supported; export with positional inputs")
    inputs = tuple(a for a in args if isinstance(a, torch.Tensor))
    if not inputs:
        raise ModelLoadError(f"{path.name}: the archive has no example inputs; save it with them")
    gm = _unlift(program)
    names = [n.name for n in gm.graph.nodes if n.op == "placeholder"]
    b = inputs[0].shape[0] if inputs[0].dim() else 1
    return LoadedModel(
        name=path.stem, source="pt2", gm=gm, example_inputs=inputs, input_names=names,
        task=_guess_task(inputs, gm), description=f"torch.export archive {path.name}",
        path=str(path), batch=int(b),
    )


# ------------------------------------------------------------------ Hugging Face folders

class _HFFeatures(torch.nn.Module):
    """Wrap a transformers model so it returns one tensor (logits or the last hidden state)."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        names = self._names
        out = self.model(**dict(zip(names, inputs)))
        return out.logits if getattr(out, "logits", None) is not None else out.last_hidden_state

    _names: tuple[str, ...] = ("input_ids", "attention_mask")


def load_hf_folder(path: Path, batch: int | None = None, seq_len: int | None = None) -> LoadedModel:
    """Load a ``save_pretrained`` folder offline, safetensors weights only, eager attention."""
    if not (path / "config.json").is_file():
        raise ModelLoadError(f"{path}: not a Hugging Face model folder (no config.json)")
    weights = list(path.glob("*.safetensors"))
    if not weights:
        pickled = [p.name for p in path.iterdir() if p.suffix in PICKLE_SUFFIXES]
        reason = (f"only pickled weights ({', '.join(pickled)}), which are refused" if pickled
                  else "no .safetensors weights")
        raise ModelLoadError(f"{path}: {reason}; save with save_pretrained(safe_serialization=True)")
    for w in weights:
        if not os.path.realpath(w).startswith(os.path.realpath(path) + os.sep):
            raise ModelLoadError(f"{path}: weight file {w.name} points outside its folder")
    try:
        from transformers import AutoConfig, AutoModel, AutoModelForSequenceClassification

        config = AutoConfig.from_pretrained(str(path), local_files_only=True, trust_remote_code=False)
        cls = AutoModelForSequenceClassification if getattr(config, "architectures", None) and any(
            "SequenceClassification" in a for a in config.architectures) else AutoModel
        model = cls.from_pretrained(str(path), local_files_only=True, trust_remote_code=False,
                                    use_safetensors=True, attn_implementation="eager")
    except Exception as exc:
        raise ModelLoadError(f"{path}: could not load the Hugging Face model: {_first_line(exc)}") from exc
    model.eval()
    wrapper = _HFFeatures(model).eval()
    vocab = getattr(config, "vocab_size", None)
    if vocab:
        spec = zoo.InputSpec((
            zoo.TensorSpec("input_ids", ("B", "S"), "int64", "tokens", int(vocab)),
            zoo.TensorSpec("attention_mask", ("B", "S"), "int64", "ones"),
        ), seq_len=min(128, int(getattr(config, "max_position_embeddings", 128))))
        wrapper._names = ("input_ids", "attention_mask")
    elif getattr(config, "image_size", None):
        size = config.image_size if isinstance(config.image_size, int) else config.image_size[0]
        spec = zoo.InputSpec((zoo.TensorSpec("pixel_values", ("B", getattr(config, "num_channels", 3), size, size)),))
        wrapper._names = ("pixel_values",)
    else:
        raise ModelLoadError(f"{path}: cannot tell this model's inputs (no vocab_size or image_size in config)")
    max_len = getattr(config, "max_position_embeddings", None)
    if seq_len is not None and max_len and seq_len > max_len:
        raise ModelLoadError(f"sequence length {seq_len} exceeds this model's maximum of {max_len}")
    inputs = spec.make(batch, seq_len)
    gm = capture(wrapper, inputs, path.name)
    b, s = spec.resolve(batch, seq_len)
    task = "classification" if cls is not AutoModel else "features"
    return LoadedModel(
        name=path.name, source="hf", gm=gm, example_inputs=inputs, input_names=list(wrapper._names),
        task=task, description=f"Hugging Face folder {path.name} ({type(model).__name__})",
        module=wrapper, path=str(path), batch=b, seq_len=s if spec.seq_len else None,
    )


def describe_source(model: LoadedModel) -> dict[str, Any]:
    """A small JSON-able summary of where a model came from."""
    return {"name": model.name, "source": model.source, "path": model.path,
            "batch": model.batch, "seq_len": model.seq_len, "inputs": [
                {"name": n, "shape": list(t.shape), "dtype": str(t.dtype).replace("torch.", "")}
                for n, t in zip(model.input_names, model.example_inputs)]}
