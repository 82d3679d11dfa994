"""A corpus of hostile inputs, built by the tests themselves (nothing hostile is committed).

Each ``Case`` names a class of attack from issue 9 and builds its files in a
temporary folder: ``build(folder, marker)`` returns the command-line arguments
that hand them to ``fusion-explorer`` (``argv``) and a word the one-line error
must contain. Payloads that would run code touch ``marker``; the tests assert
it never appears. ``docs/security.md`` maps each class to its defence.
"""

from __future__ import annotations

import dataclasses
import io
import json
import os
import pickle
import struct
import zipfile
from pathlib import Path
from typing import Callable

import onnx
import torch
from onnx import TensorProto, helper

GiB = 2**30


class Boom:
    """Unpickling this writes the marker file: proof that code from a file ran."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.write_text, (Path(self.marker), "pwned"))


def payload(marker: Path) -> bytes:
    return pickle.dumps(Boom(str(marker)))


def torch_payload(marker: Path) -> bytes:
    buf = io.BytesIO()
    torch.save(((Boom(str(marker)),), {}), buf)
    return buf.getvalue()


# ------------------------------------------------------------------ .pt2

def good_pt2(path: Path, name: str = "residual_block") -> Path:
    from explorer.sources import zoo

    entry = zoo.get_entry(name)
    torch.export.save(torch.export.export(entry.build(), entry.example_inputs(batch=2)), str(path))
    return path


def rewrite_zip(src: Path, dst: Path, edit: Callable[[str, bytes], list[tuple[str, bytes]]],
                extra: list[tuple[str, bytes]] = (), compress: int = zipfile.ZIP_STORED) -> Path:
    """Copy an archive member by member through ``edit(name, data) -> [(name, data), ...]``."""
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w", compress) as zout:
        for info in zin.infolist():
            for name, data in edit(info.filename, zin.read(info.filename)):
                zout.writestr(name, data)
        for name, data in extra:
            zout.writestr(name, data)
    return dst


def edit_json(member_suffix: str, change: Callable[[dict], None]):
    def edit(name: str, data: bytes):
        if name.endswith(member_suffix):
            value = json.loads(data)
            change(value)
            data = json.dumps(value).encode()
        return [(name, data)]
    return edit


def pt2_members(path: Path) -> list[str]:
    with zipfile.ZipFile(path) as z:
        return z.namelist()


# ------------------------------------------------------------------ ONNX

def onnx_model(nodes, inputs, outputs, initializers=()) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(initializers))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def save(model: onnx.ModelProto, path: Path) -> Path:
    path.write_bytes(model.SerializeToString())
    return path


def fin(name: str, shape) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)


def const_i64(name: str, values) -> onnx.NodeProto:
    return helper.make_node("Constant", [], [name],
                            value=helper.make_tensor(name + "_v", TensorProto.INT64, [len(values)], values))


def shape_bomb(kind: str) -> onnx.ModelProto:
    """A few hundred bytes whose import-time folding would materialise gigabytes."""
    out = [fin("y", None)]
    if kind == "ConstantOfShape":
        nodes = [const_i64("s", [1024, 1024, 1536]), helper.make_node("ConstantOfShape", ["s"], ["big"]),
                 helper.make_node("Add", ["x", "big"], ["y"])]
    elif kind == "Expand":
        one = helper.make_node("Constant", [], ["one"], value=helper.make_tensor("o", TensorProto.FLOAT, [1], [1.0]))
        nodes = [one, const_i64("s", [1024, 1024, 1024]), helper.make_node("Expand", ["one", "s"], ["big"]),
                 helper.make_node("Add", ["x", "big"], ["y"])]
    elif kind == "Range":
        scalars = [helper.make_node("Constant", [], [n], value=helper.make_tensor(n + "_v", TensorProto.FLOAT, [], [v]))
                   for n, v in (("a", 0.0), ("b", 1.4e9), ("d", 1.0))]
        nodes = scalars + [helper.make_node("Range", ["a", "b", "d"], ["big"]),
                           helper.make_node("Add", ["x", "big"], ["y"])]
    elif kind == "Tile":
        one = helper.make_node("Constant", [], ["one"], value=helper.make_tensor("o", TensorProto.FLOAT, [1], [1.0]))
        nodes = [one, const_i64("r", [1500000000]), helper.make_node("Tile", ["one", "r"], ["big"]),
                 helper.make_node("Add", ["x", "big"], ["y"])]
    else:
        raise ValueError(kind)
    return onnx_model(nodes, [fin("x", [1])], out)


def relu_model(shape) -> onnx.ModelProto:
    return onnx_model([helper.make_node("Relu", ["x"], ["y"], name="relu")], [fin("x", shape)], [fin("y", shape)])


def small_conv_model() -> onnx.ModelProto:
    w = helper.make_tensor("w", TensorProto.FLOAT, [8, 3, 3, 3], [0.01] * 216)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["c"], ["y"])]
    return onnx_model(nodes, [fin("x", ["N", 3, 64, 64])], [fin("y", None)], [w])


def external_model(folder: Path, location: str, dims=(4,), length: int | None = None) -> Path:
    """An ONNX whose weight 'w' lives in external data at ``location`` (nothing is written there)."""
    w = TensorProto()
    w.name, w.data_type = "w", TensorProto.FLOAT
    w.dims.extend(dims)
    w.data_location = TensorProto.EXTERNAL
    for key, value in (("location", location), ("offset", "0")) + ((("length", str(length)),) if length else ()):
        entry = w.external_data.add()
        entry.key, entry.value = key, value
    model = onnx_model([helper.make_node("Add", ["x", "w"], ["y"])], [fin("x", list(dims))], [fin("y", None)], [w])
    return save(model, folder / "ext.onnx")


def escape_named_model() -> onnx.ModelProto:
    """Node names carrying terminal escape sequences (retitle, clear the screen)."""
    w = helper.make_tensor("w", TensorProto.FLOAT, [8, 3, 3, 3], [0.01] * 216)
    b = helper.make_tensor("b", TensorProto.FLOAT, [8], [0.0] * 8)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1], name="conv\x1b]0;pwned\x07\x1b[2J"),
             helper.make_node("Relu", ["c"], ["y"], name="relu\x1b[31mred\x1b[0m")]
    return onnx_model(nodes, [fin("x", [1, 3, 16, 16])], [fin("y", None)], [w, b])


# ------------------------------------------------------------------ Hugging Face

def tiny_bert(folder: Path) -> Path:
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    config = BertConfig(num_hidden_layers=1, hidden_size=32, num_attention_heads=2, intermediate_size=64,
                        vocab_size=100, max_position_embeddings=32)
    BertModel(config, add_pooling_layer=False).save_pretrained(str(folder))
    return folder


def copy_folder(src: Path, dst: Path) -> Path:
    dst.mkdir(parents=True)
    for f in src.iterdir():
        (dst / f.name).write_bytes(f.read_bytes())
    return dst


def set_config(folder: Path, **changes) -> Path:
    config = json.loads((folder / "config.json").read_text())
    config.update(changes)
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def shard_index(folder: Path, shard: str) -> Path:
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": {
        "embeddings.word_embeddings.weight": shard}}))
    return folder


def safetensors_bytes(tensors: dict[str, tuple[str, list[int], int]], data: bytes = b"") -> bytes:
    """A safetensors file whose header declares ``{name: (dtype, shape, nbytes)}`` laid end to end."""
    header, offset = {}, 0
    for name, (dtype, shape, nbytes) in tensors.items():
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    text = json.dumps(header).encode()
    return struct.pack("<Q", len(text)) + text + data


# ------------------------------------------------------------------ plans and reports

def deep_json(depth: int = 100_000) -> str:
    return "[" * depth + "]" * depth


def zip_bytes(members: dict[str, bytes], compress: int = zipfile.ZIP_DEFLATED) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compress) as z:
        for name, data in members.items():
            z.writestr(name, data)
    return buf.getvalue()


def zeros_zip(name: str, nbytes: int) -> bytes:
    """A deflated member of ``nbytes`` zeros (inflates about a thousandfold)."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED, compresslevel=1) as z:
        with z.open(name, "w", force_zip64=True) as member:
            chunk = bytes(16 * 2**20)
            for _ in range(nbytes // len(chunk)):
                member.write(chunk)
    return buf.getvalue()


@dataclasses.dataclass(frozen=True)
class Case:
    """One hostile input: ``build(folder, marker) -> (argv, needle)``."""

    id: str
    kind: str  # the class of attack (docs/security.md)
    build: Callable[[Path, Path], tuple[list[str], str]]
    bomb: bool = False  # would exhaust memory or time without its defence


def mkdir(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path


def fifo(path: Path) -> Path:
    os.mkfifo(path)
    return path
