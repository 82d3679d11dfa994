"""A corpus of hostile inputs, built by the tests themselves (nothing hostile is committed), and the
limited processes the dangerous ones run in.

Each ``Case`` of ``corpus()`` names a class of attack from issue 9 and builds its
files in a temporary folder: ``build(folder, marker, bases)`` returns the
command-line arguments that hand them to ``fusion-explorer`` (``argv``) and a
word the one-line error must contain. Payloads that would run code touch
``marker``; the tests assert it never appears. ``bases`` (``Bases``) holds the
valid files the cases mutate, built once. ``docs/security.md`` maps each class
to its defence.

``CliForkServer`` runs CLI cases in processes of their own under an
address-space limit (``serve`` is its server side): a server imports the CLI's
libraries once and forks one child per case, which lowers ``RLIMIT_AS``,
runs ``explorer.cli.main`` exactly as ``python -m explorer.cli`` does, and is
reaped with ``os.wait4`` for its peak resident size (its probe child
included) and killed, with every process it started, at its time limit.
"""

from __future__ import annotations

import dataclasses
import io
import json
import os
import pickle
import signal
import struct
import subprocess
import sys
import threading
import time
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
    """A plain pickle that writes ``marker`` when unpickled."""
    return pickle.dumps(Boom(str(marker)))


def torch_payload(marker: Path) -> bytes:
    """A ``torch.save`` file (sample-inputs layout) whose unpickling writes ``marker``."""
    buf = io.BytesIO()
    torch.save(((Boom(str(marker)),), {}), buf)
    return buf.getvalue()


# ------------------------------------------------------------------ .pt2

def good_pt2(path: Path, name: str = "residual_block") -> Path:
    """A valid ``torch.export.save`` archive of zoo model ``name`` at ``path``."""
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
    """An edit for ``rewrite_zip`` that applies ``change`` to the JSON member ending in ``member_suffix``."""
    def edit(name: str, data: bytes):
        if name.endswith(member_suffix):
            value = json.loads(data)
            change(value)
            data = json.dumps(value).encode()
        return [(name, data)]
    return edit


def pt2_members(path: Path) -> list[str]:
    """The member names of the archive at ``path``."""
    with zipfile.ZipFile(path) as z:
        return z.namelist()


# ------------------------------------------------------------------ ONNX

def onnx_model(nodes, inputs, outputs, initializers=()) -> onnx.ModelProto:
    """An opset-17 ONNX model of one graph."""
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(initializers))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def save(model: onnx.ModelProto, path: Path) -> Path:
    """``model`` serialised to ``path``; returns ``path``."""
    path.write_bytes(model.SerializeToString())
    return path


def fin(name: str, shape) -> onnx.ValueInfoProto:
    """A float tensor value of ``shape`` (``None``: no shape)."""
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)


def const_i64(name: str, values) -> onnx.NodeProto:
    """A Constant node producing the int64 vector ``values`` as ``name``."""
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
    """One Relu whose input declares ``shape``."""
    return onnx_model([helper.make_node("Relu", ["x"], ["y"], name="relu")], [fin("x", shape)], [fin("y", shape)])


def small_conv_model() -> onnx.ModelProto:
    """Conv + Relu on a dynamic-batch 3x64x64 input (a harmless model for batch bombs)."""
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

def tiny_bert(folder: Path, layers: int = 1, hidden: int = 32, heads: int = 2, vocab: int = 100,
              positions: int = 32) -> Path:
    """A BERT of ``layers`` layers (width ``hidden``, ``heads`` heads, an MLP twice as wide, ``vocab`` words,
    at most ``positions`` tokens; one layer by default), its weights drawn from seed 0, saved with
    ``save_pretrained`` (safetensors) into ``folder``."""
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    config = BertConfig(num_hidden_layers=layers, hidden_size=hidden, num_attention_heads=heads,
                        intermediate_size=2 * hidden, vocab_size=vocab, max_position_embeddings=positions)
    BertModel(config, add_pooling_layer=False).save_pretrained(str(folder))
    return folder


def copy_folder(src: Path, dst: Path) -> Path:
    """A flat copy of folder ``src`` at ``dst``."""
    dst.mkdir(parents=True)
    for f in src.iterdir():
        (dst / f.name).write_bytes(f.read_bytes())
    return dst


def set_config(folder: Path, **changes) -> Path:
    """``folder``, its ``config.json`` updated with ``changes``."""
    config = json.loads((folder / "config.json").read_text())
    config.update(changes)
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def shard_index(folder: Path, shard: str) -> Path:
    """``folder`` with a safetensors index mapping a weight to ``shard``."""
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
    """An array nested ``depth`` deep (``RecursionError`` in a recursive parser or walk)."""
    return "[" * depth + "]" * depth


def zip_bytes(members: dict[str, bytes], compress: int = zipfile.ZIP_DEFLATED) -> bytes:
    """A zip archive of ``{name: data}`` as bytes."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compress) as z:
        for name, data in members.items():
            z.writestr(name, data)
    return buf.getvalue()


def zeros_zip(name: str, nbytes: int, extra: tuple[tuple[str, bytes], ...] = ()) -> bytes:
    """A zip whose member ``name`` is ``nbytes`` zeros, deflated (it inflates about a thousandfold),
    followed by the ``extra`` (name, data) members."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED, compresslevel=1) as z:
        with z.open(name, "w", force_zip64=True) as member:
            chunk = bytes(16 * 2**20)
            for _ in range(nbytes // len(chunk)):
                member.write(chunk)
        for extra_name, data in extra:
            z.writestr(extra_name, data)
    return buf.getvalue()


def symlink_zip(name: str, target: str, extra: tuple[tuple[str, bytes], ...] = ()) -> bytes:
    """A zip whose member ``name`` is a symbolic link to ``target`` (as ``zip --symlinks`` stores one),
    followed by the ``extra`` (name, data) members."""
    import stat

    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        info = zipfile.ZipInfo(name)
        info.external_attr = (stat.S_IFLNK | 0o777) << 16
        z.writestr(info, target)
        for extra_name, data in extra:
            z.writestr(extra_name, data)
    return buf.getvalue()


def mkdir(path: Path) -> Path:
    """``path`` created with its parents (no error when it exists)."""
    path.mkdir(parents=True, exist_ok=True)
    return path


def fifo(path: Path) -> Path:
    """A FIFO at ``path``: reading it blocks until a writer comes, which none does."""
    os.mkfifo(path)
    return path


def chain_model(length: int) -> onnx.ModelProto:
    """A valid ONNX model of ``length`` Relu nodes in a row (a file that takes long to load)."""
    names = ["x"] + [f"r{i}" for i in range(length)]
    nodes = [helper.make_node("Relu", [a], [b], name=f"relu{i}") for i, (a, b) in enumerate(zip(names, names[1:]))]
    return onnx_model(nodes, [fin("x", [1, 8])], [fin(names[-1], [1, 8])])


# ------------------------------------------------------------------ the corpus

class Bases:
    """The valid files the corpus mutates, built in ``root`` on first use (thread-safe): ``pt2``, a
    ``torch.export`` archive of residual_block, and ``hf``, a one-layer BERT folder."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._lock = threading.Lock()
        self._pt2: Path | None = None
        self._hf: Path | None = None

    @property
    def pt2(self) -> Path:
        """The valid ``.pt2`` archive."""
        with self._lock:
            if self._pt2 is None:
                self._pt2 = good_pt2(self.root / "good.pt2")
            return self._pt2

    @property
    def hf(self) -> Path:
        """The valid Hugging Face folder."""
        with self._lock:
            if self._hf is None:
                self._hf = tiny_bert(self.root / "tiny-bert")
            return self._hf

    @property
    def pt2_top(self) -> str:
        """The top folder of the archive's members (``torch.export.save`` names it after the file)."""
        return pt2_members(self.pt2)[0].split("/")[0]


Build = Callable[[Path, Path, Bases], tuple[list[str], str]]


@dataclasses.dataclass(frozen=True)
class Case:
    """One hostile input: ``build(folder, marker, bases) -> (argv, needle)``; ``env`` is set for its run."""

    id: str
    kind: str  # the class of attack (docs/security.md): code, paths, memory, time, crash, strict, args, format
    build: Build
    bomb: bool = False  # would exhaust memory or time without its defence
    env: tuple[tuple[str, str], ...] = ()

    @property
    def isolated(self) -> bool:
        """Whether the case must run in a limited process of its own: a bomb whose defence failed would
        take the machine (or hang), and a code payload whose defence failed would run in the test's
        process. The others prove the one-line contract and run in-process."""
        return self.bomb or self.kind in ("code", "time")


def _chain(*edits):
    def edit(name, data):
        items = [(name, data)]
        for e in edits:
            items = [out for n, d in items for out in e(n, d)]
        return items
    return edit


def _replace(suffix: str, new: bytes):
    return lambda name, data: [(name, new if name.endswith(suffix) else data)]


def _rename(suffix: str, new_suffix: str, new: bytes):
    return lambda name, data: [(name[: -len(suffix)] + new_suffix, new) if name.endswith(suffix) else (name, data)]


def _keep():
    return lambda name, data: [(name, data)]


def _first_size(program: dict, value: dict) -> None:
    for node in program["graph_module"]["graph"]["tensor_values"].values():
        node["sizes"][0] = value
        return


def write(path: Path, data: bytes) -> Path:
    """``data`` written to ``path``; returns ``path``."""
    path.write_bytes(data)
    return path


def _link(path: Path, target: str) -> Path:
    os.symlink(target, path)
    return path


def _only_models_json(base: Path, folder: Path) -> Path:
    with zipfile.ZipFile(base) as z:
        member = next(n for n in z.namelist() if n.endswith("models/model.json"))
        data = z.read(member)
    path = folder / "only.pt2"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(member, data)
    return path


def _sparse_external(folder: Path) -> Path:
    with open(folder / "big.bin", "wb") as f:
        f.truncate(4 * 2**30)
    return external_model(folder, "big.bin", dims=(1024, 1024, 1024))


def _symlinked_external(folder: Path) -> Path:
    secret = folder / "secret.bin"
    secret.write_bytes(bytes(16))
    inner = mkdir(folder / "m")
    os.symlink(secret, inner / "w.bin")
    return external_model(inner, "w.bin")


def _short_external(folder: Path) -> Path:
    (folder / "w.bin").write_bytes(bytes(8))
    return external_model(folder, "w.bin", dims=(1024,))


def hf_symlink_out(base: Path, folder: Path) -> Path:
    """A copy of the HF folder ``base`` whose weights file is a link to a file outside it."""
    hf = copy_folder(base, folder / "link")
    outside = folder / "outside.safetensors"
    (hf / "model.safetensors").rename(outside)
    os.symlink(outside, hf / "model.safetensors")
    return hf


def hf_pickled(base: Path, folder: Path, marker: Path) -> Path:
    """A copy of the HF folder ``base`` whose weights are a pickle that writes ``marker``."""
    hf = copy_folder(base, folder / "pickled")
    (hf / "model.safetensors").unlink()
    (hf / "pytorch_model.bin").write_bytes(payload(marker))
    return hf


def _hf_config_fifo(base: Path, folder: Path) -> Path:
    hf = copy_folder(base, folder / "fifo")
    (hf / "config.json").unlink()
    os.mkfifo(hf / "config.json")
    return hf


def _hf_lying_header(base: Path, folder: Path) -> Path:
    hf = copy_folder(base, folder / "lies")
    (hf / "model.safetensors").write_bytes(safetensors_bytes({"w": ("F32", [1 << 30], 4 << 30)}))
    return hf


def plan_file(folder: Path, **changes) -> Path:
    """A plan for conv_bn_relu with ``changes`` applied, written to ``folder/plan.json``."""
    plan = {"version": 1, "model": "conv_bn_relu", "fingerprint": "x", "accepted": [], "kernels": {},
            "memory_format": "nchw", "cuda_graphs": False}
    plan.update(changes)
    return write(folder / "plan.json", json.dumps(plan).encode())


def report_file(folder: Path, **changes) -> Path:
    """A version 1 run report with ``changes`` applied, written to ``folder/report.json``."""
    report = {"version": 1, "plan": {"cuda_graphs": False},
              "chains": [{"id": "conv_bn_act@conv2d", "slower": True}]}
    report.update(changes)
    return write(folder / "report.json", json.dumps(report).encode())


def _pt2(name: str, edit, extra=()) -> Build:
    """A case building a copy of the valid archive through ``edit(marker)`` plus ``extra`` members
    ``(lambda top: name, lambda marker: data)``, handed to ``detect``."""
    def build(folder: Path, marker: Path, bases: Bases):
        top = bases.pt2_top
        extras = [(n(top), d(marker)) for n, d in extra]
        path = rewrite_zip(bases.pt2, folder / name, edit(marker), extras)
        return ["detect", str(path)], ""
    return build


def _detect(make: Callable[[Path, Path, Bases], Path], needle: str, *more: str) -> Build:
    """A case handing the path ``make(folder, marker, bases)`` to ``detect`` (with ``more`` arguments)."""
    return lambda f, m, b: (["detect", str(make(f, m, b)), *more], needle)


def corpus() -> list[Case]:
    """Every class of issue 9, plus the ones the loaders already refused. Pure: nothing is built until a
    case's ``build`` runs."""
    cases: list[Case] = []
    add = cases.append

    def set_weight_pickle(c):
        next(iter(c["config"].values())).update(use_pickle=True)

    # -- code execution from .pt2
    add(Case("pt2-pickled-weight", "code", _pt2("w.pt2", lambda m: _chain(
        _replace("data/weights/weight_0", payload(m)), edit_json("model_weights_config.json", set_weight_pickle)))))
    add(Case("pt2-sample-inputs-pickle", "code", _pt2("s.pt2", lambda m: _replace("sample_inputs/model.pt", payload(m)))))
    add(Case("pt2-sample-inputs-torch-save", "code",
             _pt2("t.pt2", lambda m: _replace("sample_inputs/model.pt", torch_payload(m)))))
    add(Case("pt2-uppercase-member-payload", "code", _pt2("u.pt2", lambda m: _rename(
        "data/sample_inputs/model.pt", "data/sample_inputs/MODEL.pt", torch_payload(m)))))
    add(Case("pt2-case-duplicate", "code", _pt2("d.pt2", lambda m: _keep(),
                                                [(lambda top: f"{top}/MODELS/model.json", payload)])))
    add(Case("pt2-legacy-layout", "code", _pt2("l.pt2", lambda m: _keep(), [
        (lambda top: f"{top}/serialized_state_dict.pt", payload), (lambda top: f"{top}/version", lambda m: b"8.5")])))
    add(Case("pt2-only-models-json", "code", _detect(lambda f, m, b: _only_models_json(b.pt2, f), "")))
    add(Case("pt2-custom-obj", "code", _pt2("c.pt2", lambda m: edit_json(
        "model_constants_config.json", lambda c: c.update(config={"obj": {"path_name": "custom_obj_0", "is_param": False,
                                                                           "use_pickle": True}})),
        [(lambda top: f"{top}/data/constants/custom_obj_0", payload)])))
    add(Case("pt2-aotinductor", "code", _pt2("a.pt2", lambda m: _keep(),
                                             [(lambda top: f"{top}/data/aotinductor/model/x.so", lambda m: b"\x7fELF")])))
    add(Case("pt2-sympify-expr", "code", _pt2("e.pt2", lambda m: edit_json(
        "models/model.json", lambda p: _first_size(p, {"as_expr": {
            "expr_str": f"__import__('pathlib').Path('{m}').write_text('x')", "hint": {"as_int": 2}}})))))
    add(Case("pt2-guards-code", "code", _pt2("g.pt2", lambda m: edit_json(
        "models/model.json", lambda p: p.update(guards_code=[f"__import__('pathlib').Path('{m}').write_text('x')"])))))
    add(Case("pt2-target-os-system", "code", _pt2("o.pt2", lambda m: edit_json(
        "models/model.json", lambda p: p["graph_module"]["graph"]["nodes"][0].update(target="torch.os.system")))))
    # -- memory bombs in .pt2
    add(Case("pt2-empty-payload-zeros", "memory", _pt2("z.pt2", lambda m: _chain(
        _replace("data/weights/weight_0", b""),
        edit_json("model_weights_config.json", lambda c: next(iter(c["config"].values()))["tensor_meta"].update(
            sizes=[{"as_int": 1 << 20}, {"as_int": 1 << 12}], strides=[{"as_int": 1 << 12}, {"as_int": 1}])))),
        bomb=True))
    add(Case("pt2-inflating-weight", "memory", _detect(lambda f, m, b: rewrite_zip(
        b.pt2, f / "i.pt2", lambda n, d: [(n, d)], [(f"{b.pt2_top}/data/weights/weight_99", bytes(2 * 2**30 + 2**20))],
        compress=8), "memory budget"), bomb=True))
    add(Case("pt2-not-zip", "format", _detect(lambda f, m, b: write(f / "r.pt2", os.urandom(4096)),
                                              "not a torch.export archive")))
    add(Case("pt2-plain-pickle", "code", _detect(lambda f, m, b: write(f / "p.pt2", payload(m)), "pickle")))
    add(Case("pt-pickle", "code", _detect(lambda f, m, b: write(f / "m.pt", payload(m)), "pickle")))
    # -- ONNX
    for kind in ("ConstantOfShape", "Expand", "Range", "Tile"):
        add(Case(f"onnx-{kind}-bomb", "memory", _detect(
            lambda f, m, b, k=kind: save(shape_bomb(k), f / f"{k}.onnx"), "memory budget"), bomb=True))
    add(Case("onnx-input-5GB", "memory", _detect(
        lambda f, m, b: save(relu_model([1, 1250, 1024, 1024]), f / "in5.onnx"), "memory budget"), bomb=True))
    add(Case("onnx-input-120GB", "memory", _detect(
        lambda f, m, b: save(relu_model([30, 1024, 1024, 1024]), f / "in120.onnx"), "memory budget"), bomb=True))
    add(Case("onnx-batch-300000", "memory", _detect(
        lambda f, m, b: save(small_conv_model(), f / "conv.onnx"), "memory budget", "--batch", "300000"), bomb=True))
    add(Case("onnx-run-batch-300000", "memory", lambda f, m, b: (
        ["run", str(save(small_conv_model(), f / "conv.onnx")), "--batch", "300000", "--device", "cpu"],
        "memory budget"), bomb=True))
    add(Case("onnx-external-sparse-4GiB", "memory", _detect(lambda f, m, b: _sparse_external(f), "memory budget"),
             bomb=True))
    add(Case("onnx-external-nul", "paths", _detect(lambda f, m, b: external_model(f, "data\x00.bin"), "NUL")))
    add(Case("onnx-external-absolute", "paths", _detect(lambda f, m, b: external_model(f, "/etc/passwd"),
                                                        "escapes its folder")))
    add(Case("onnx-external-dotdot", "paths", _detect(lambda f, m, b: external_model(mkdir(f / "m"), "../secret.bin"),
                                                      "escapes its folder")))
    add(Case("onnx-external-symlink-out", "paths", _detect(lambda f, m, b: _symlinked_external(f), "escapes its folder")))
    add(Case("onnx-external-past-end", "memory", _detect(lambda f, m, b: _short_external(f), "past the end")))
    add(Case("onnx-negative-dim", "format", _detect(lambda f, m, b: save(relu_model([1, -5]), f / "neg.onnx"), "")))
    add(Case("onnx-random-bytes", "format", _detect(lambda f, m, b: write(f / "r.onnx", os.urandom(2048)), "r.onnx")))
    add(Case("onnx-fifo", "memory", _detect(lambda f, m, b: fifo(f / "f.onnx"), "FIFO"), bomb=True))
    add(Case("onnx-dev-zero", "memory", _detect(lambda f, m, b: _link(f / "z.onnx", "/dev/zero"), "device"), bomb=True))
    # -- time: a file whose isolated load outlasts the load timeout is stopped, with its process group
    add(Case("onnx-slow-load-timeout", "time", _detect(lambda f, m, b: save(chain_model(20_000), f / "slow.onnx"),
                                                       "longer than 3 s"),
             bomb=True, env=(("FUSION_EXPLORER_LOAD_TIMEOUT", "3"),)))
    # -- Hugging Face folders
    add(Case("hf-index-absolute-shard", "paths", _detect(
        lambda f, m, b: shard_index(copy_folder(b.hf, f / "abs"), "/etc/hosts.safetensors"), "outside its folder")))
    add(Case("hf-index-dotdot-shard", "paths", _detect(
        lambda f, m, b: shard_index(copy_folder(b.hf, f / "dd"), "../outside.safetensors"), "outside its folder")))
    add(Case("hf-weights-symlink-out", "paths", _detect(lambda f, m, b: hf_symlink_out(b.hf, f), "escapes its folder")))
    add(Case("hf-million-layers", "memory", _detect(
        lambda f, m, b: set_config(copy_folder(b.hf, f / "deep"), num_hidden_layers=1_000_000), "layers"), bomb=True))
    add(Case("hf-hidden-8192", "memory", _detect(
        lambda f, m, b: set_config(copy_folder(b.hf, f / "wide"), hidden_size=8192, intermediate_size=32768),
        "memory budget"), bomb=True))
    add(Case("hf-absurd-sizes", "format", _detect(
        lambda f, m, b: set_config(copy_folder(b.hf, f / "absurd"), hidden_size="big", num_hidden_layers=-3), "")))
    add(Case("hf-remote-code", "code", _detect(
        lambda f, m, b: set_config(copy_folder(b.hf, f / "remote"), auto_map={"AutoModel": "x.Model"}), "custom code")))
    add(Case("hf-pickled-weights", "code", _detect(lambda f, m, b: hf_pickled(b.hf, f, m), "refused")))
    add(Case("hf-config-fifo", "memory", _detect(lambda f, m, b: _hf_config_fifo(b.hf, f), "FIFO"), bomb=True))
    add(Case("hf-safetensors-lies", "memory", _detect(lambda f, m, b: _hf_lying_header(b.hf, f), "outside the file"),
             bomb=True))
    # -- plans and reports
    plan = ["run", "conv_bn_relu", "--device", "cpu", "--no-chains", "--no-stages", "--plan"]
    add(Case("plan-dev-zero", "memory", lambda f, m, b: (plan + ["/dev/zero"], "not a regular file"), bomb=True))
    add(Case("plan-fifo", "memory", lambda f, m, b: (plan + [str(fifo(f / "p.json"))], "FIFO"), bomb=True))
    add(Case("plan-folder", "format", lambda f, m, b: (plan + [str(f)], "directory")))
    add(Case("plan-deep", "crash", lambda f, m, b: (plan + [str(write(f / "d.json", deep_json().encode()))], "nested")))
    add(Case("plan-cuda-graphs-string", "strict", lambda f, m, b: (plan + [str(plan_file(f, cuda_graphs="false"))],
                                                                   "cuda_graphs")))
    add(Case("plan-accepted-wrong-type", "strict", lambda f, m, b: (plan + [str(plan_file(f, accepted="all"))],
                                                                    "accepted")))
    add(Case("plan-huge", "memory", lambda f, m, b: (plan + [str(write(f / "h.json", b" " * (6 * 2**20)))],
                                                     "over the limit")))
    slower = ["plan", "residual_block", "--reject-slower"]
    add(Case("report-deep", "crash", lambda f, m, b: (slower + [str(write(f / "r.json", deep_json().encode()))],
                                                      "nested")))
    add(Case("report-chains-not-objects", "crash", lambda f, m, b: (slower + [str(report_file(f, chains=[1, 2]))],
                                                                    "report")))
    add(Case("report-chain-without-id", "crash", lambda f, m, b: (
        slower + [str(report_file(f, chains=[{"slower": True}]))], "report")))
    add(Case("report-other-model", "strict", lambda f, m, b: (slower + [str(report_file(
        f, plan={"fingerprint": "0123456789abcdef", "model": "resnet50", "cuda_graphs": False}))], "report")))
    add(Case("report-slower-string", "strict", lambda f, m, b: (
        slower + [str(report_file(f, chains=[{"id": "conv_bn_act@conv2d", "slower": "false"}]))], "report")))
    add(Case("report-dev-zero", "memory", lambda f, m, b: (slower + ["/dev/zero"], "not a regular file"), bomb=True))
    # -- arguments
    add(Case("arg-batch-zero", "args", lambda f, m, b: (["detect", "resnet50", "--batch", "0"], "--batch")))
    add(Case("arg-unknown-flag", "args", lambda f, m, b: (["detect", "resnet50", "--bogus"], "--bogus")))
    add(Case("arg-out-missing-folder", "args", lambda f, m, b: (
        ["run", "conv_bn_relu", "--device", "cpu", "--out", str(f / "missing" / "r.json")], "does not exist")))
    return cases


def case(case_id: str) -> Case:
    """The corpus case named ``case_id``."""
    return next(c for c in corpus() if c.id == case_id)


# ------------------------------------------------------------------ the CLI in limited processes

#: What the server imports before forking: everything a CLI case would import, so that a child's
#: cost is its case's alone (the address-space limit is set above this size).
SERVER_IMPORTS = ("torch", "onnx", "numpy", "transformers", "explorer.cli", "explorer.fusion_engine",
                  "explorer.sources", "explorer.sources.hf", "explorer.sources.onnx_file", "explorer.sources.pt2",
                  "explorer.sources.isolate", "explorer.fusions.plan", "explorer.report", "explorer.gpu_runner",
                  "torch._export.serde.serialize")
TOKEN_ENV = "FUSION_EXPLORER_CASE_TOKEN"  # marks every process a case starts, to find any left running


def _vm_size() -> int:
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmSize:"))


def _processes_with_token(token: str) -> list[int]:
    """Ids of this user's live processes whose environment holds ``TOKEN_ENV=token``."""
    needle = f"{TOKEN_ENV}={token}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if needle in f.read().split(b"\0"):
                    found.append(int(entry))
        except OSError:  # gone, a zombie, or another user's
            continue
    return found


def _kill_all(pid: int, token: str) -> None:
    """SIGKILL the case's process group and every process carrying its token (the probe child runs in
    a session of its own)."""
    for target in [pid] + _processes_with_token(token):
        for kill in (os.killpg, os.kill):
            try:
                kill(target, signal.SIGKILL)
            except OSError:
                pass


def _child(argv: list[str], env: dict, limit: int, out_path: str, err_path: str) -> None:
    """In the forked child: own process group, output to files, ``env``, ``RLIMIT_AS = limit``, then
    ``explorer.cli.main(argv)`` as ``python -m explorer.cli`` runs it (``sys.exit(main())``: an exception
    that escaped would print its traceback and exit 1). Never returns."""
    code = 1
    try:
        import resource
        import traceback

        os.setpgid(0, 0)
        for fd, path in ((1, out_path), (2, err_path)):
            os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), fd)
        os.environ.update(env)
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
        from explorer import cli

        sys.argv = ["fusion-explorer", *argv]
        try:
            code = cli.main(argv)
            code = 0 if code is None else code
        except SystemExit as exc:
            if exc.code is None or isinstance(exc.code, int):
                code = exc.code or 0
            else:
                print(exc.code, file=sys.stderr)
                code = 1
        except BaseException:
            traceback.print_exc()
            code = 1
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def serve() -> None:
    """The server side of ``CliForkServer`` (``python -c 'import hostile; hostile.serve()'``).

    Imports ``SERVER_IMPORTS``, answers one JSON line ``{"vm", "rss", "fork_rss"}`` (its address-space
    and peak resident sizes, and the peak resident size of a forked child that does nothing: where
    every case child starts, since a child counts only the pages it maps), in bytes, then for each request line ``{"argv", "env", "limit", "timeout"}`` forks a
    child (``_child``), reaps it with ``os.wait4`` (killing it and every process carrying its token at
    ``timeout``), and answers ``{"code", "peak", "seconds", "timed_out", "left_running", "stdout",
    "stderr"}``; ``peak`` is ``ru_maxrss`` of the child and the children it waited for, in bytes.
    """
    import importlib
    import resource
    import tempfile
    import warnings

    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    warnings.simplefilter("ignore")
    for name in SERVER_IMPORTS:
        importlib.import_module(name)
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()  # a child that does nothing: the resident size every case child starts from
    if pid == 0:
        os._exit(0)
    _, _, usage = os.wait4(pid, 0)
    proto.write(json.dumps({"vm": _vm_size(), "rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
                            "fork_rss": usage.ru_maxrss * 1024}) + "\n")
    for line in sys.stdin:
        request = json.loads(line)
        token = f"{os.getpid()}-{time.monotonic_ns()}"
        env = dict(request.get("env") or {}, **{TOKEN_ENV: token})
        with tempfile.TemporaryDirectory() as tmp:
            out_path, err_path = os.path.join(tmp, "out"), os.path.join(tmp, "err")
            sys.stdout.flush()
            sys.stderr.flush()
            start = time.monotonic()
            pid = os.fork()
            if pid == 0:
                _child(request["argv"], env, int(request["limit"]), out_path, err_path)
            timed_out = False
            while True:
                done, status, usage = os.wait4(pid, os.WNOHANG)
                if done:
                    break
                if time.monotonic() - start > request["timeout"]:
                    timed_out = True
                    _kill_all(pid, token)
                    done, status, usage = os.wait4(pid, 0)
                    break
                time.sleep(0.02)
            seconds = time.monotonic() - start
            left = _processes_with_token(token)
            if left:
                _kill_all(pid, token)
            with open(out_path, "rb") as f:
                stdout = f.read().decode("utf-8", "replace")
            with open(err_path, "rb") as f:
                stderr = f.read().decode("utf-8", "replace")
        proto.write(json.dumps({"code": os.waitstatus_to_exitcode(status), "peak": usage.ru_maxrss * 1024,
                                "seconds": seconds, "timed_out": timed_out, "left_running": len(left),
                                "stdout": stdout, "stderr": stderr}) + "\n")


class CliForkServer:
    """A ``serve()`` process: ``start`` it, then ``run(argv, env, extra_bytes, timeout)`` runs one CLI case in
    a forked child under ``RLIMIT_AS`` = the server's size after imports (``vm``) plus ``extra_bytes``.
    ``fork_rss`` is where a child's resident size starts, the baseline its peak is compared with;
    ``rss`` the server's own peak (a fresh interpreter that imported the same). One case at a time."""

    def __init__(self, root: Path) -> None:
        """Start the server (it imports in the background; ``ready`` waits for it)."""
        tests = str(Path(__file__).resolve().parent)
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([tests, str(root)]), PYTHONWARNINGS="ignore")
        self.proc = subprocess.Popen([sys.executable, "-c", "import hostile; hostile.serve()"], cwd=root, env=env,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.vm = self.rss = self.fork_rss = 0

    def ready(self) -> "CliForkServer":
        """Wait until the server has imported its libraries; returns the server."""
        if not self.vm:
            hello = json.loads(self.proc.stdout.readline() or "null")
            if not hello:
                raise RuntimeError("the CLI fork server did not start")
            self.vm, self.rss, self.fork_rss = int(hello["vm"]), int(hello["rss"]), int(hello["fork_rss"])
        return self

    def run(self, argv: list[str], env: dict, extra_bytes: int, timeout: float) -> dict:
        """The result of one case (see ``serve``)."""
        self.ready()
        request = {"argv": argv, "env": env, "limit": self.vm + int(extra_bytes), "timeout": timeout}
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        answer = self.proc.stdout.readline()
        if not answer:
            raise RuntimeError("the CLI fork server stopped")
        return json.loads(answer)

    def close(self) -> None:
        """Stop the server."""
        try:
            self.proc.stdin.close()
            self.proc.wait(timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            self.proc.kill()
            self.proc.wait()   # reaped here (no zombie; its CPU time counted in the file that used it)
