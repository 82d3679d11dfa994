"""Loading an ONNX file a user names: size checks first, then ``onnx_import``, then the inputs.

An ONNX file of a few hundred bytes can ask for gigabytes: declared inputs of
120 GB, a ``ConstantOfShape``/``Expand``/``Range`` folded at import time, an
external data file of 4 GiB with no recorded length, or a harmless model run
at ``--batch 300000``. Every one of those sizes is declared before it is
allocated, so this module checks them in order, each against the one memory
budget (``limits.memory_budget``):

1. the file itself (size, regular file) and the inputs' declared shapes at
   the requested batch and sequence length;
2. weights and every value folded at import time (``onnx_import`` reserves
   each one from its shape on the meta device before computing it), and
   external data extents against the real files;
3. the imported graph: only operators on the allowlist (``pure_ops``), weights plus the largest set of intermediate values
   alive at once in one forward (``limits.forward_peak_bytes``), before the
   example inputs are made or shapes are propagated.

``load_onnx(path, batch, seq_len, data_path) -> LoadedModel``.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from explorer.messages import LOAD
from explorer.errors import ModelLoadError
from explorer.sources import limits, pure_ops

INT_TYPES = (6, 7)  # INT32, INT64: dim 1 of such an input is the sequence


def _parse(path: Path):
    import onnx

    from explorer import jsonfile

    with jsonfile.open_regular_file(path, path.name, ModelLoadError) as handle:
        size = os.fstat(handle.fileno()).st_size
        limits.check_budget(size, path.name)
        data = handle.read(size + 1)
    try:
        return onnx.load_model_from_string(data)
    except Exception as err:  # protobuf raises DecodeError and friends
        raise ModelLoadError(LOAD("onnx_invalid", name=path.name, kind=type(err).__name__)) from None


def check_header(path: Path) -> None:
    """What the caller checks before the isolated loader, without parsing: a regular file within the
    memory budget. The protobuf is parsed only in the isolated loader's child first."""
    from explorer import jsonfile

    with jsonfile.open_regular_file(path, path.name, ModelLoadError) as handle:
        limits.check_budget(os.fstat(handle.fileno()).st_size, path.name)


def input_shapes(model, batch: int | None, seq_len: int | None) -> dict[str, tuple[int, ...]]:
    """Concrete shapes for an ONNX model's inputs: dim 0 is the batch, dim 1 of an integer input is
    the sequence; other symbolic dims become 128 (and the batch 1) unless given."""
    shapes: dict[str, tuple[int, ...]] = {}
    inits = {i.name for i in model.graph.initializer}
    for inp in model.graph.input:
        if inp.name in inits:
            continue
        tensor_type = inp.type.tensor_type
        dims = []
        for i, d in enumerate(tensor_type.shape.dim):
            if i == 0 and batch is not None:
                dims.append(int(batch))
            elif i == 1 and seq_len is not None and tensor_type.elem_type in INT_TYPES:
                dims.append(int(seq_len))
            elif d.HasField("dim_value"):
                dims.append(int(d.dim_value))
            else:
                dims.append(1 if i == 0 else int(seq_len or 128))
        shapes[inp.name] = tuple(dims)
    return shapes


def check_inputs_fit(model, shapes: dict[str, tuple[int, ...]], name: str) -> None:
    """Refuse inputs whose declared shapes (at the requested batch) are over the memory budget."""
    from explorer.sources.onnx_import import _element_size

    total = 0
    for inp in model.graph.input:
        if inp.name not in shapes:
            continue
        what = f"{name}: input '{inp.name[:80]}' of shape {list(shapes[inp.name])[:8]}"
        total += limits.tensor_bytes(shapes[inp.name], _element_size(inp.type.tensor_type.elem_type, what), what)
    limits.check_budget(total, f"{name}: its inputs")


def make_inputs(shapes: list[tuple], dtypes: list[torch.dtype], name: str) -> tuple[torch.Tensor, ...]:
    """Seeded example inputs of the given concrete shapes (checked against the budget first)."""
    from explorer.sources import zoo

    total = sum(limits.tensor_bytes(s, torch.empty(0, dtype=d).element_size(), name) for s, d in zip(shapes, dtypes))
    limits.check_budget(total, f"{name}: its inputs")
    gen = torch.Generator().manual_seed(zoo.SEED)
    out = []
    for shape, dtype in zip(shapes, dtypes):
        if dtype in (torch.int64, torch.int32):
            out.append(torch.randint(0, 1000, shape, generator=gen, dtype=dtype))
        elif dtype == torch.bool:
            out.append(torch.ones(shape, dtype=torch.bool))
        else:
            out.append(torch.randn(shape, generator=gen).to(dtype))
    return tuple(out)


def precheck(path: Path, batch: int | None = None, seq_len: int | None = None,
             data_path: str | None = None) -> None:
    """The checks that need no translation, cheap enough to run before the isolated load: the file,
    the inputs at the requested batch, the structure, the ops, external data, declared weight bytes."""
    from explorer.sources import onnx_import

    model = _parse(path)
    onnx_import.check_model(model, str(path), data_path)
    check_inputs_fit(model, input_shapes(model, batch, seq_len), path.name)


def load_onnx(path: Path, batch: int | None = None, seq_len: int | None = None,
              data_path: str | None = None):
    """Load an ONNX file (external data in its folder, or ``data_path``); returns a ``LoadedModel``.

    Raises ``ModelLoadError`` (one line) for anything unreadable or over the memory budget,
    before allocating it.
    """
    from explorer.graph.build import ensure_shapes
    from explorer.sources import LoadedModel, guess_task, onnx_import

    model = _parse(path)
    shapes = input_shapes(model, batch, seq_len)
    check_inputs_fit(model, shapes, path.name)
    imported = onnx_import.import_onnx(path, data_path=data_path,
                                       input_shapes=None if batch is None and seq_len is None else shapes)
    gm = imported.gm
    pure_ops.check_graph_ops(gm, path.name)  # the importer's translations: pure operators only
    limits.check_graph_fits(gm, path.name)
    concrete = [tuple(n.meta["val"].shape) for n in gm.graph.nodes if n.op == "placeholder"]
    inputs = make_inputs(concrete, imported.input_dtypes, path.name)
    try:
        ensure_shapes(gm, inputs)
    except Exception as exc:
        text = " ".join(str(exc).split())[:300] or type(exc).__name__
        raise ModelLoadError(f"{path.name}: shapes could not be propagated: {text}") from exc
    b = inputs[0].shape[0] if inputs and inputs[0].dim() else 1
    return LoadedModel(
        name=path.stem, source="onnx", gm=gm, example_inputs=inputs,
        input_names=list(imported.input_names), task=guess_task(inputs, gm),
        description=f"ONNX file {path.name} (opset {imported.opset})", path=str(path),
        batch=int(b), seq_len=seq_len,
    )
