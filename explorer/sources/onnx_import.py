"""Import an ONNX file as a ``torch.fx.GraphModule`` of the ATen ops ``torch.export`` emits.

The explorer has one representation: an fx graph in the ATen "training IR"
vocabulary (``aten.conv2d.default``, ``aten.linear.default``, ...). This module
translates ONNX operators onto those same targets so that the fusion patterns
are written once, for PyTorch and ONNX models alike::

    ONNX file ─► load (+ checked external data) ─► scan every op ─► build fx graph
                                                   (one error      (weights as get_attr
                                                    naming all      buffers, shape-only
                                                    unsupported)    subgraphs folded)

    >>> imported = import_onnx("model.onnx")
    >>> outputs = imported.gm(*inputs)          # always a tuple

Nothing from the file is executed beyond interpreting ONNX operators. Values
that do not depend on a graph input (``Shape -> Gather -> Concat -> Reshape``
chains, ``Constant`` nodes, weight transposes) are computed at import time, so
``Reshape`` nodes get constant shapes. Folding uses the declared static input
shapes; symbolic dims become 1 (first dim) or 128 (others) unless the caller
passes ``input_shapes={"input_ids": (1, 16)}``.

Exporters spell some ops differently from ``torch.export``; the importer maps
them back so that one pattern finds a chain from either source: ``MatMul`` +
``Add`` with constant weights is ``linear``, ``x * Sigmoid(x)`` is ``silu``, and a
``Gather`` of every index in order (the dynamo exporter's channels_last
``as_strided`` of a pooled tensor) is a ``reshape``.

Every ``call_function`` node carries ``meta["onnx_name"]`` (the ONNX node it
came from) and ``meta["val"]`` (a meta-device tensor with its shape and dtype);
where the file records the module an ONNX node came from (torch's dynamo exporter
writes ``pkg.torch.onnx.name_scopes``; the TorchScript exporter's node names are
scoped, ``/layer1/layer1.0/conv1/Conv``), also ``meta["nn_module_stack"]`` in
torch.export's form, so chains are named by module paths from either source.

Every value made at import time (a folded constant, a ``Range``, a list attribute)
is sized from its declaration and reserved against the memory budget
(``sources/limits.py``) before it is allocated; output counts (``Split``) are
checked against the node's own outputs before any list of that length is made.
"""

from __future__ import annotations

import dataclasses
import math
import operator
import os
import re
from typing import Any, Callable, Mapping, Sequence

import torch
import torch.fx

from explorer.messages import LOAD
from explorer.errors import ExplorerError, ModelLoadError, UnsupportedOpError
from explorer.sources import limits

aten = torch.ops.aten

DEFAULT_BATCH = 1
DEFAULT_DIM = 128
_INT64_MAX = 2**63 - 1


@dataclasses.dataclass
class ImportedOnnx:
    """An ONNX model as an fx graph; ``gm(*inputs)`` returns a tuple of output tensors."""

    gm: torch.fx.GraphModule
    input_names: list[str]
    input_shapes: list[tuple]  # declared dims; a str is a symbolic dim
    input_dtypes: list[torch.dtype]
    opset: int


def import_onnx(
    path: str | os.PathLike,
    data_path: str | os.PathLike | None = None,
    input_shapes: Mapping[str, Sequence[int]] | None = None,
) -> ImportedOnnx:
    """Read the ONNX file at ``path`` and translate it into an fx ``GraphModule``.

    ``data_path`` is where external weight data lives: a folder, or the data file
    itself (it then stands for the model's single external data file, whatever
    name the model records). Without it, data is looked up next to the model.
    ``input_shapes`` overrides input shapes by input name (for symbolic dims).

    Raises ``UnsupportedOpError`` (once, naming every unsupported op type) and
    ``ModelLoadError`` for files that are not ONNX, external data that escapes
    its folder or is missing, and graphs that cannot be translated.
    """
    path = os.fspath(path)
    model = _load_model(path)
    _check_structure(model, path)
    opset = _default_opset(model, path)
    _check_ops(model, path)
    _load_external_data(model, path, data_path)
    return _Builder(model, opset, path, dict(input_shapes or {})).build()


# ---------------------------------------------------------------- loading and checks


def _load_model(path: str):
    import onnx

    if not os.path.isfile(path):
        raise ModelLoadError(f"ONNX file not found: {path}")
    try:
        model = onnx.load(path, load_external_data=False)
    except Exception as err:  # protobuf raises DecodeError and friends
        raise ModelLoadError(LOAD("onnx_invalid", name=os.path.basename(path), kind=type(err).__name__)) from None
    if model.ir_version <= 0 or not model.HasField("graph") or not model.graph.output:
        raise ModelLoadError(LOAD("onnx_no_graph", name=os.path.basename(path)))
    return model


def _check_structure(model, path: str) -> None:
    """Every node input must be defined before use (catches truncated files)."""
    graph = model.graph
    if graph.sparse_initializer:
        raise ModelLoadError(f"{os.path.basename(path)} uses sparse initializers, which are not supported")
    known = {i.name for i in graph.input} | {t.name for t in graph.initializer} | {""}
    for node in graph.node:
        for name in node.input:
            if name not in known:
                raise ModelLoadError(
                    f"{os.path.basename(path)} is not a valid ONNX graph: node '{node.name or node.op_type}' "
                    f"uses undefined value '{name}' (truncated or corrupt file?)"
                )
        known.update(node.output)
    for out in graph.output:
        if out.name not in known:
            raise ModelLoadError(
                f"{os.path.basename(path)} is not a valid ONNX graph: output '{out.name}' is never produced"
            )


def _default_opset(model, path: str) -> int:
    for imp in model.opset_import:
        if imp.domain in ("", "ai.onnx"):
            return int(imp.version)
    raise ModelLoadError(f"{os.path.basename(path)} declares no default-domain ONNX opset")


def _check_ops(model, path: str) -> None:
    """Raise one ``UnsupportedOpError`` naming every op type the importer cannot map."""
    import onnx

    bad: set[str] = set()
    for node in model.graph.node:
        if node.domain not in ("", "ai.onnx"):
            bad.add(f"{node.domain}::{node.op_type}")
        elif node.op_type not in _HANDLERS:
            bad.add(node.op_type)
        elif any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in node.attribute):
            bad.add(f"{node.op_type} (subgraph)")
    if bad:
        raise UnsupportedOpError(sorted(bad), os.path.basename(path))


def check_model(model, path: str, data_path: str | os.PathLike | None = None) -> None:
    """Every check ``import_onnx`` makes before translating, on an already parsed model, without
    reading external data: structure, opset, supported ops, external locations and extents, and the
    declared bytes of all weights and constant tensors against the memory budget."""
    _check_structure(model, path)
    _default_opset(model, path)
    _check_ops(model, path)
    _load_external_data(model, path, data_path, load=False)
    tensors = list(model.graph.initializer)
    for node in model.graph.node:
        for a in node.attribute:
            tensors.extend([a.t] if a.HasField("t") else [])
            tensors.extend(a.tensors)
    total = sum(declared_bytes(t, f"tensor '{t.name[:80]}'") for t in tensors)
    limits.check_budget(total, f"{os.path.basename(path)}: its weights and constants")


def _external_tensors(model) -> list:
    """Initializers and Constant attribute tensors whose bytes live in another file."""
    import onnx

    tensors = list(model.graph.initializer)
    for node in model.graph.node:
        for a in node.attribute:
            if a.type == onnx.AttributeProto.TENSOR:
                tensors.append(a.t)
            elif a.type == onnx.AttributeProto.TENSORS:
                tensors.extend(a.tensors)
    return [t for t in tensors if t.HasField("data_location") and t.data_location == t.EXTERNAL]


def _external_location(tensor) -> str:
    for entry in tensor.external_data:
        if entry.key == "location":
            return entry.value
    raise ModelLoadError(f"external tensor '{tensor.name}' records no data location")


def _element_size(data_type: int, what: str) -> int:
    """Bytes per element of an ONNX tensor data type (strings and unknown types are refused)."""
    from onnx import helper

    if data_type == 16:  # BFLOAT16
        return 2
    try:
        import numpy as np

        dtype = np.dtype(helper.tensor_dtype_to_np_dtype(data_type))
    except Exception:
        raise ModelLoadError(f"{what} has an unsupported element type {data_type}") from None
    if dtype.kind not in "biuf":
        raise ModelLoadError(f"{what} has an unsupported element type {dtype}")
    return dtype.itemsize


def declared_bytes(tensor, what: str) -> int:
    """Bytes a TensorProto declares through its dims and data type (nothing is read)."""
    return limits.tensor_bytes([int(d) for d in tensor.dims], _element_size(tensor.data_type, what), what)


def _external_entry(tensor, key: str) -> str | None:
    for entry in tensor.external_data:
        if entry.key == key:
            return entry.value
    return None


def _external_int(tensor, key: str) -> int | None:
    value = _external_entry(tensor, key)
    if value is None:
        return None
    try:
        number = int(value)
    except ValueError:
        raise ModelLoadError(f"external tensor '{tensor.name[:80]}' records a {key} that is not a number") from None
    if number < 0:
        raise ModelLoadError(f"external tensor '{tensor.name[:80]}' records a negative {key}")
    return number


def _load_external_data(model, path: str, data_path: str | os.PathLike | None, load: bool = True) -> None:
    """Validate every external location and extent (before reading a byte), then load the data
    (``load=False``: validate only).

    Each location must resolve inside the model's folder (or the folder given
    as ``data_path``), links followed, and be a regular file; each tensor's
    bytes (offset + the length its shape needs) must lie inside that file, and
    a recorded ``length`` must equal what the shape needs. A missing length is
    set to that size, so no read runs to the end of a file.
    """
    from onnx import external_data_helper

    tensors = _external_tensors(model)
    if not tensors:
        return
    model_dir = os.path.dirname(os.path.abspath(path))
    locations = sorted({_external_location(t) for t in tensors})
    for loc in locations:
        limits.resolve_inside(model_dir, loc, "external data location")

    base_dir = model_dir
    if data_path is not None:
        data_path = os.path.abspath(os.fspath(data_path))
        if os.path.isdir(data_path):
            base_dir = data_path
        elif os.path.isfile(data_path):
            if len(locations) != 1:
                raise ModelLoadError(
                    f"the model keeps its weights in {len(locations)} external files; "
                    "give the folder that holds them, not one file"
                )
            base_dir = os.path.dirname(data_path)
            for t in tensors:
                for entry in t.external_data:
                    if entry.key == "location":
                        entry.value = os.path.basename(data_path)
            locations = [os.path.basename(data_path)]
        else:
            raise ModelLoadError(f"external data path not found: {data_path}")
    sizes: dict[str, int] = {}
    for loc in locations:
        full = limits.resolve_inside(base_dir, loc, "external data location")
        if not full.exists():
            raise ModelLoadError(f"external data file '{loc}' not found next to {os.path.basename(path)}")
        if not full.is_file():
            raise ModelLoadError(f"external data '{loc}' is not a regular file")
        sizes[loc] = full.stat().st_size
    for t in tensors:
        what = f"external tensor '{t.name[:80]}'"
        need = declared_bytes(t, what)
        offset = _external_int(t, "offset") or 0
        length = _external_int(t, "length")
        if length is not None and length != need:
            raise ModelLoadError(f"{what} records {length} bytes but its shape needs {need}")
        loc = _external_location(t)
        if offset + need > sizes[loc]:
            raise ModelLoadError(f"{what} reaches past the end of '{loc}' ({offset + need} > {sizes[loc]} bytes)")
        if length is None:
            entry = t.external_data.add()
            entry.key, entry.value = "length", str(need)
    if not load:
        return
    try:
        external_data_helper.load_external_data_for_model(model, base_dir)
    except ExplorerError:
        raise
    except Exception as err:
        raise ModelLoadError(f"could not read external data: {' '.join(str(err).split())[:200]}") from None


# ---------------------------------------------------------------- the graph builder

Value = Any  # torch.Tensor (a constant known at import time) or torch.fx.Node


def _is_node(v: Any) -> bool:
    return isinstance(v, torch.fx.Node)


def _map(v: Any, fn: Callable[[Any], Any]) -> Any:
    if isinstance(v, (list, tuple)):
        return type(v)(_map(x, fn) for x in v)
    return fn(v)


def _any_node(v: Any) -> bool:
    if isinstance(v, (list, tuple)):
        return any(_any_node(x) for x in v)
    return _is_node(v)


def _sanitize(name: str) -> str:
    name = re.sub(r"\W", "_", name).strip("_") or "const"
    return "_" + name if name[0].isdigit() else name


class _Builder:
    """Walks the ONNX nodes in order, folding constants and emitting fx nodes."""

    def __init__(self, model, opset: int, path: str, shape_override: dict) -> None:
        self.model = model
        self.opset = opset
        self.path = path
        self.shape_override = shape_override
        self.graph = torch.fx.Graph()
        self.root = torch.nn.Module()
        self.env: dict[str, Value] = {}
        self.const_names: dict[int, str] = {}  # id(constant tensor) -> ONNX value name
        # id(constant) -> (the constant, its get_attr node); the constant is held so that its id cannot be
        # reused by a later temporary (a folded weight transpose) while the entry exists
        self.attr_nodes: dict[int, tuple[torch.Tensor, torch.fx.Node]] = {}
        self.buffer_names: set[str] = set()
        self.onnx_name = ""
        self.module_stack: dict[str, tuple[str, str]] | None = None  # the current node's, from its metadata
        self.scopes: set[str] = set()  # module paths read from TorchScript-style node names so far
        self.weight_names: set[str] = set()  # the file's initializers (a node's weight names its module)
        self.current_outputs = 0
        self.constant_bytes = 0  # weights and every value folded at import time, kept in self.env

    def reserve(self, nbytes: int, what: str) -> None:
        """Count ``nbytes`` of constants about to be materialised; refuse past the memory budget."""
        self.constant_bytes += int(nbytes)
        limits.check_budget(self.constant_bytes, f"{os.path.basename(self.path)}: {what} (with the weights "
                                                 "and the values folded before it)")

    def fits(self, nbytes: int, what: str) -> None:
        """Refuse if ``nbytes`` more (held only for a moment) would pass the memory budget."""
        limits.check_budget(self.constant_bytes + int(nbytes), f"{os.path.basename(self.path)}: {what} (with "
                                                                "the weights and the values folded before it)")

    def _reserve_eager(self, target, args, kwargs) -> None:
        """Before folding ``target`` on constants, compute its output on the meta device (no data)
        and reserve its size; ops without a meta kernel are left to their eager bound."""
        def to_meta(v):
            return v.to("meta") if isinstance(v, torch.Tensor) else v

        try:
            out = target(*_map(args, to_meta), **{k: _map(v, to_meta) for k, v in kwargs.items()})
        except ExplorerError:
            raise
        except Exception:
            return
        outs = out if isinstance(out, (list, tuple)) else [out]
        nbytes = sum(o.numel() * o.element_size() for o in outs if isinstance(o, torch.Tensor))
        self.reserve(nbytes, f"constant folding of node '{self.onnx_name[:80]}'")

    # -- values

    def tensor_const(self, name: str, t: torch.Tensor) -> torch.Tensor:
        self.const_names.setdefault(id(t), name)
        return t

    def get_attr(self, t: torch.Tensor) -> torch.fx.Node:
        key = id(t)
        if key in self.attr_nodes:
            return self.attr_nodes[key][1]
        base = _sanitize(self.const_names.get(key, "const"))
        name, i = base, 1
        while name in self.buffer_names or hasattr(self.root, name):
            name, i = f"{base}_{i}", i + 1
        self.buffer_names.add(name)
        self.root.register_buffer(name, t.contiguous())
        node = self.graph.get_attr(name)
        node.meta["val"] = t.to("meta")
        self.attr_nodes[key] = (t, node)
        return node

    def call(self, target, *args, **kwargs):
        """Apply ``target``: eagerly on constants, else as an fx node with a meta value."""
        if not _any_node(args) and not _any_node(list(kwargs.values())):
            self._reserve_eager(target, args, kwargs)
            return target(*args, **kwargs)
        args = _map(args, lambda v: self.get_attr(v) if isinstance(v, torch.Tensor) else v)
        kwargs = {k: _map(v, lambda x: self.get_attr(x) if isinstance(x, torch.Tensor) else x) for k, v in kwargs.items()}

        def to_meta(v):
            return v.meta["val"] if _is_node(v) else v

        val = target(*_map(args, to_meta), **{k: _map(v, to_meta) for k, v in kwargs.items()})
        node = self.graph.call_function(target, tuple(args), kwargs)
        node.meta["val"] = val
        node.meta["onnx_name"] = self.onnx_name
        if self.module_stack:
            node.meta["nn_module_stack"] = dict(self.module_stack)
        if isinstance(val, (list, tuple)):
            items = []
            for i, v in enumerate(val):
                item = self.graph.call_function(operator.getitem, (node, i))
                item.meta["val"] = v
                item.meta["onnx_name"] = self.onnx_name
                if self.module_stack:
                    item.meta["nn_module_stack"] = dict(self.module_stack)
                items.append(item)
            return items
        return node

    # -- build

    def build(self) -> ImportedOnnx:
        from onnx import numpy_helper

        graph = self.model.graph
        for init in graph.initializer:
            self.reserve(declared_bytes(init, f"weight '{init.name[:80]}'"), f"weight '{init.name[:80]}'")
            try:
                arr = numpy_helper.to_array(init)
            except Exception as err:
                raise ModelLoadError(f"could not read weight '{init.name}': {' '.join(str(err).split())[:200]}") from None
            self.env[init.name] = self.tensor_const(init.name, _to_torch(arr))
        self.weight_names = {init.name for init in graph.initializer}

        names, declared, dtypes = [], [], []
        for inp in graph.input:
            if inp.name in self.env:  # IR < 4 lists initializers as inputs
                continue
            declared_shape, dtype = _input_type(inp, self.path)
            concrete = self.shape_override.get(inp.name)
            if concrete is None:
                concrete = tuple(
                    d if isinstance(d, int) else (DEFAULT_BATCH if i == 0 else DEFAULT_DIM)
                    for i, d in enumerate(declared_shape)
                )
            concrete = tuple(int(d) for d in concrete)
            if len(concrete) != len(declared_shape):
                raise ModelLoadError(
                    f"input '{inp.name}' has rank {len(declared_shape)}, override gives {list(concrete)}"
                )
            ph = self.graph.placeholder(_unique_placeholder(inp.name, names))
            ph.meta["val"] = torch.empty(concrete, dtype=dtype, device="meta")
            self.env[inp.name] = ph
            names.append(inp.name)
            declared.append(declared_shape)
            dtypes.append(dtype)
        unknown = set(self.shape_override) - set(names)
        if unknown:
            raise ModelLoadError(f"input_shapes names unknown input(s): {', '.join(sorted(unknown))}")

        for node in graph.node:
            self.onnx_name = node.name or f"{node.op_type}:{node.output[0] if node.output else ''}"
            self.module_stack = own_module(node, module_stack(node, self.scopes), self.weight_names)
            ins = [self.env[n] if n else None for n in node.input]
            attrs = _attributes(node, self)
            self.current_outputs = len(node.output)
            try:
                outs = _HANDLERS[node.op_type](self, ins, attrs)
            except ExplorerError:
                raise
            except Exception as err:
                msg = " ".join(str(err).split())[:300]
                raise ModelLoadError(
                    f"could not translate ONNX node '{self.onnx_name}' ({node.op_type}): {msg}"
                ) from None
            if not isinstance(outs, (list, tuple)):
                outs = [outs]
            for name, value in zip(node.output, outs):
                if name:
                    if isinstance(value, torch.Tensor):
                        value = self.tensor_const(name, value)
                    self.env[name] = value
            for name in list(node.output)[len(outs):]:
                if name:
                    self.env[name] = _Missing(node.op_type, name)

        results = []
        for out in graph.output:
            v = self.env[out.name]
            if isinstance(v, _Missing):
                raise ModelLoadError(f"{v.op_type} output '{v.name}' is not supported")
            results.append(self.get_attr(v) if isinstance(v, torch.Tensor) else v)
        self.graph.output(tuple(results))
        for n in self.graph.nodes:  # an unsupported optional output that was consumed
            for a in n.args:
                if isinstance(a, _Missing):
                    raise ModelLoadError(f"{a.op_type} output '{a.name}' is not supported")
        self.graph.eliminate_dead_code()
        _canonicalize_linear(self.graph, self.root)
        _canonicalize_silu(self.graph)
        gm = torch.fx.GraphModule(self.root, self.graph, class_name="OnnxModel")
        gm.graph.lint()
        return ImportedOnnx(
            gm=gm,
            input_names=names,
            input_shapes=declared,
            input_dtypes=dtypes,
            opset=self.opset,
        )


NAME_SCOPES_KEY = "pkg.torch.onnx.name_scopes"
CLASS_HIERARCHY_KEY = "pkg.torch.onnx.class_hierarchy"
_METADATA_TEXT_MAX = 16384  # characters of one metadata value read; a longer one is ignored
_SCOPE_MAX, _SCOPE_NAME_MAX = 64, 512


def _string_list(text: str | None) -> list[str] | None:
    """A metadata value written as a Python list of strings (``"['', 'layer1', 'layer1.0']"``), or None.

    The text comes from the file: it is read only when short, by ``ast.literal_eval`` (literals, never
    code), and kept only if it is a short list of short strings. The strings stay data (any character,
    escaped where they are shown)."""
    import ast

    if not isinstance(text, str) or len(text) > _METADATA_TEXT_MAX:
        return None
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return None
    if (not isinstance(value, list) or len(value) > _SCOPE_MAX
            or not all(isinstance(v, str) and len(v) <= _SCOPE_NAME_MAX for v in value)):
        return None
    return value


def module_stack(node, scopes: set[str] | None = None) -> dict[str, tuple[str, str]] | None:
    """The module path an ONNX node came from, in the form of torch.export's ``nn_module_stack``
    (``{path: (path, class name)}``, outermost first), when the file records it; else None.

    torch's dynamo exporter writes ``pkg.torch.onnx.name_scopes`` on each node: the module paths from the
    root (``''``) inwards, then the op's own name (``['', 'layer1', 'layer1.0', 'layer1.0.conv1',
    'conv2d_1']``), and ``pkg.torch.onnx.class_hierarchy`` beside it with each scope's class. With it,
    chains from an ONNX file are named as on the torch side (``layer1.0: conv1 → bn1 → relu``), not by
    node ids (``node_Conv_786``). Without it, a TorchScript-exporter node name is read (``scopes``: the
    paths read so far, see ``_scoped_name``)."""
    props = {p.key: p.value for p in node.metadata_props if p.key in (NAME_SCOPES_KEY, CLASS_HIERARCHY_KEY)}
    scopes_meta = _string_list(props.get(NAME_SCOPES_KEY))
    if not scopes_meta:
        return _scoped_name(node.name, scopes) if scopes is not None else None
    if len(scopes_meta) < 2:
        return None
    classes = _string_list(props.get(CLASS_HIERARCHY_KEY)) or []
    stack = {path: (path, classes[i] if i < len(classes) else "")
             for i, path in enumerate(scopes_meta[:-1]) if path}
    return stack or None


#: A parameter named after its module: ``layer1.0.conv1.weight`` (identifier-like segments, a short path).
_PARAMETER = re.compile(r"((?:[A-Za-z_][A-Za-z0-9_]*|\d+)(?:\.(?:[A-Za-z_][A-Za-z0-9_]*|\d+)){0,31})\.weight")
#: Ops whose second input is their module's weight.
_WEIGHTED = frozenset({"Conv", "ConvTranspose", "Gemm", "MatMul"})


def own_module(node, stack: dict[str, tuple[str, str]] | None, weights: set[str] | frozenset = frozenset()
               ) -> dict[str, tuple[str, str]] | None:
    """``stack`` (``module_stack``) with its innermost module replaced by the module whose weight ``node``
    reads, where the two differ under the same parent.

    torch's dynamo exporter folds an inference BatchNorm into the Conv before it (onnxscript's
    ``FuseBatchNormIntoConv``) and the Conv keeps the BatchNorm's scope::

        Conv(x, 'layer1.0.conv1.weight')   name_scopes ['', 'layer1', 'layer1.0', 'layer1.0.bn1', ...]

    so ResNet's convs would be named ``bn1``. The weight is an initializer of the file named after its
    parameter: its module (``layer1.0.conv1``) is the node's own when it is the innermost module's sibling
    (same parent, ``layer1.0``, or both at the root) or child; otherwise ``stack`` is kept as it is.
    ``weights``: the file's initializer names."""
    if not stack or node.op_type not in _WEIGHTED or len(node.input) < 2 or node.input[1] not in weights:
        return stack
    found = _PARAMETER.fullmatch(node.input[1])
    if found is None:
        return stack
    path = found.group(1)
    inner = list(stack)[-1]
    parent = path.rpartition(".")[0]
    if path in stack:
        return stack
    if parent == inner:   # a module calling its child's weight: the child is the node's
        return {**stack, path: (path, "")}
    if parent != inner.rpartition(".")[0]:   # not the inner module's sibling: nothing to correct
        return stack
    own = {k: v for k, v in stack.items() if k != inner}
    own[path] = (path, "")
    return own


_SCOPED_NAME = re.compile(r"(?:/[^/]+){2,64}")


def _scoped_name(name: str, scopes: set[str]) -> dict[str, tuple[str, str]] | None:
    """The module path in a TorchScript-exporter node name: ``/model/encoder/layer.0/attention/self/query/
    MatMul`` is ``model.encoder.layer.0.attention.self.query``, ``/layer1/layer1.0/conv1/Conv`` is
    ``layer1.0.conv1`` (a container's child is written ``<container>.<index>``, so a segment that starts
    with the one before it and a dot adds only its tail).

    The exporter names a module's second call ``relu_1``: a last segment ``<name>_<n>`` whose ``<name>``
    was already read under the same parent is that module. Paths read are added to ``scopes``."""
    if len(name) > _METADATA_TEXT_MAX or not _SCOPED_NAME.fullmatch(name):
        return None
    segments = name.split("/")[1:-1]
    parts: list[str] = []
    for i, seg in enumerate(segments):
        prev = segments[i - 1] if i else None
        if prev is not None and seg.startswith(prev + ".") and len(seg) > len(prev) + 1:
            parts.append(seg[len(prev) + 1:])
        else:
            parts.append(seg)
    repeat = re.fullmatch(r"(.+)_\d+", parts[-1])
    if repeat and ".".join(parts[:-1] + [repeat.group(1)]) in scopes:
        parts[-1] = repeat.group(1)
    stack: dict[str, tuple[str, str]] = {}
    for i in range(len(parts)):
        path = ".".join(parts[: i + 1])
        stack[path] = (path, "")
        scopes.add(path)
    return stack


def _canonicalize_linear(graph: torch.fx.Graph, root: torch.nn.Module) -> None:
    """Rewrite ``MatMul(x, W) [+ b]`` with a constant 2-D ``W`` (and 1-D ``b``) as ``aten.linear``.

    ONNX exporters decompose ``nn.Linear`` into MatMul and Add; torch.export keeps
    ``aten.linear``. Mapping back makes Linear+activation chains look the same
    from both sources::

        x   W(const)               x
         \\ /                       |
        matmul   b(const, 1-D)  -> linear(x, W^T, b)
            \\   /
             add
    """
    aten = torch.ops.aten
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target is not aten.matmul.default:
            continue
        x, w = node.args
        w_val = getattr(root, w.target, None) if _is_node(w) and w.op == "get_attr" else None
        if not isinstance(w_val, torch.Tensor) or w_val.dim() != 2 or not _is_node(x):
            continue
        bias, tail = None, node
        users = list(node.users)
        if len(users) == 1 and users[0].op == "call_function" and users[0].target is aten.add.Tensor:
            add = users[0]
            other = add.args[1] if add.args[0] is node else add.args[0]
            b_val = getattr(root, other.target, None) if _is_node(other) and other.op == "get_attr" else None
            if (isinstance(b_val, torch.Tensor) and b_val.dim() == 1 and b_val.shape[0] == w_val.shape[1]
                    and len(add.args) == 2 and not add.kwargs):
                bias, tail = other, add
        name = f"{w.target}_t"
        while hasattr(root, name):
            name += "_"
        root.register_buffer(name, w_val.t().contiguous())
        with graph.inserting_before(tail):  # after x, W and b are all defined
            weight = graph.get_attr(name)
            weight.meta["val"] = torch.empty(tuple(w_val.t().shape), dtype=w_val.dtype, device="meta")
            linear = graph.call_function(aten.linear.default, (x, weight, bias))
        linear.meta.update(tail.meta)
        linear.meta["onnx_name"] = node.meta.get("onnx_name", "")
        tail.replace_all_uses_with(linear)
        graph.erase_node(tail)
        if tail is not node:
            graph.erase_node(node)
    graph.eliminate_dead_code()


def _canonicalize_silu(graph: torch.fx.Graph) -> None:
    """Rewrite ``Mul(x, Sigmoid(x))`` (either operand order) as ``aten.silu(x)``.

    ONNX has had no SiLU operator, so exporters write ``nn.SiLU`` as Sigmoid and Mul;
    torch.export keeps ``aten.silu``. Mapping back makes Conv+SiLU, squeeze-excite and
    SwiGLU chains look the same from both sources. Only the exact form is taken (the
    product's two operands are ``x`` and the sigmoid of that same ``x``); a gate
    ``x * sigmoid(y)``, as squeeze-excite ends, stays a multiply. The sigmoid goes
    when nothing else reads it. ``silu`` rounds once where the pair rounded twice:
    the imported graph may differ from the file's arithmetic by an fp32 ulp.
    """
    aten = torch.ops.aten
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target is not aten.mul.Tensor or node.kwargs or len(node.args) != 2:
            continue
        a, b = node.args
        for x, sig in ((a, b), (b, a)):
            if (_is_node(sig) and sig.op == "call_function" and sig.target is aten.sigmoid.default
                    and len(sig.args) == 1 and sig.args[0] is x and _is_node(x)):
                with graph.inserting_before(node):
                    silu = graph.call_function(aten.silu.default, (x,))
                silu.meta.update(node.meta)
                node.replace_all_uses_with(silu)
                graph.erase_node(node)
                break
    graph.eliminate_dead_code()


@dataclasses.dataclass(frozen=True)
class _Missing:
    """An optional ONNX output the importer does not produce (e.g. MaxPool indices)."""

    op_type: str
    name: str


def _unique_placeholder(name: str, taken: list[str]) -> str:
    base = _sanitize(name)
    used = {_sanitize(n) for n in taken}
    out, i = base, 1
    while out in used:
        out, i = f"{base}_{i}", i + 1
    return out


def _to_torch(arr) -> torch.Tensor:
    import numpy as np

    arr = np.array(arr, copy=True)
    if arr.dtype.kind not in "biuf":
        raise ModelLoadError(f"unsupported tensor dtype {arr.dtype}")
    return torch.from_numpy(arr)


def _onnx_dtype(elem_type: int) -> torch.dtype:
    import numpy as np
    from onnx import helper

    if elem_type == 16:  # BFLOAT16
        return torch.bfloat16
    try:
        return torch.from_numpy(np.zeros(0, dtype=helper.tensor_dtype_to_np_dtype(elem_type))).dtype
    except Exception:
        raise ModelLoadError(f"unsupported ONNX element type {elem_type}") from None


def _input_type(inp, path: str) -> tuple[tuple, torch.dtype]:
    tt = inp.type.tensor_type
    if not inp.type.HasField("tensor_type") or not tt.HasField("shape"):
        raise ModelLoadError(f"input '{inp.name}' of {os.path.basename(path)} is not a tensor of known rank")
    dims = tuple(
        int(d.dim_value) if d.HasField("dim_value") else (d.dim_param or "?") for d in tt.shape.dim
    )
    return dims, _onnx_dtype(tt.elem_type)


_LIST_ATTR_MAX = 1 << 16  # longer INTS/FLOATS attributes stay numpy arrays (a Constant's value_ints)


def _attributes(node, builder: "_Builder | None" = None) -> dict[str, Any]:
    """A node's attributes as Python values; tensors as torch tensors.

    With ``builder``, every tensor or list attribute is sized from its protobuf field
    (dims and type, or the repeated field's length) and reserved against the memory
    budget before it is converted, the conversion's transient copy included; lists are
    converted through numpy (8 bytes an element), never through a Python list of ints.
    """
    import numpy as np
    import onnx
    from onnx import numpy_helper

    def size_first(nbytes: int, what: str) -> None:
        if builder is not None:
            builder.fits(2 * nbytes, what)  # the conversion holds a second copy for a moment
            builder.reserve(nbytes, what)

    out = {}
    for a in node.attribute:
        what = f"attribute '{a.name[:40]}' of node '{(node.name or node.op_type)[:80]}'"
        if a.type == onnx.AttributeProto.TENSOR:
            size_first(declared_bytes(a.t, what), what)
            out[a.name] = _to_torch(numpy_helper.to_array(a.t))
        elif a.type in (onnx.AttributeProto.INTS, onnx.AttributeProto.FLOATS):
            field, dtype = (a.ints, np.int64) if a.type == onnx.AttributeProto.INTS else (a.floats, np.float32)
            size_first(len(field) * np.dtype(dtype).itemsize, what)
            arr = np.array(field, dtype=dtype)
            out[a.name] = arr.tolist() if arr.size <= _LIST_ATTR_MAX else arr
        elif a.type == onnx.AttributeProto.TENSORS:
            size_first(sum(declared_bytes(t, what) for t in a.tensors), what)
            out[a.name] = [_to_torch(numpy_helper.to_array(t)) for t in a.tensors]
        else:
            v = onnx.helper.get_attribute_value(a)
            out[a.name] = v.decode() if isinstance(v, bytes) else v
    return out


# ---------------------------------------------------------------- helpers for handlers


def _shape(v: Value) -> list[int]:
    return list((v.meta["val"] if _is_node(v) else v).shape)


def _dtype(v: Value) -> torch.dtype:
    return (v.meta["val"] if _is_node(v) else v).dtype


def _const(v: Value, what: str) -> torch.Tensor:
    if not isinstance(v, torch.Tensor):
        raise ModelLoadError(f"{what} must be a constant (it depends on a graph input)")
    return v


def _ints(v: Value, what: str) -> list[int]:
    return [int(x) for x in _const(v, what).reshape(-1).tolist()]


def _axis(a: int, rank: int) -> int:
    return a + rank if a < 0 else a


def _scalar_or(v: Value, other: Value) -> Value:
    """A one-element constant as a Python number when that cannot change dtype or shape."""
    if (
        isinstance(v, torch.Tensor)
        and v.numel() == 1
        and v.dim() <= len(_shape(other))
        and v.dtype == _dtype(other)
        and _is_node(other)
    ):
        return v.item()
    return v


# ---------------------------------------------------------------- handlers: one per ONNX op

Handler = Callable[[_Builder, list, dict], Any]
_HANDLERS: dict[str, Handler] = {}


def _op(*names: str):
    def register(fn: Handler) -> Handler:
        for n in names:
            _HANDLERS[n] = fn
        return fn

    return register


def _unary(target) -> Handler:
    return lambda b, ins, attrs: b.call(target, ins[0])


for _name, _target in {
    "Relu": aten.relu.default, "Sigmoid": aten.sigmoid.default, "Tanh": aten.tanh.default,
    "Erf": aten.erf.default, "Sqrt": aten.sqrt.default, "Exp": aten.exp.default,
    "Log": aten.log.default, "Neg": aten.neg.default, "Abs": aten.abs.default,
    "Reciprocal": aten.reciprocal.default, "Floor": aten.floor.default, "Ceil": aten.ceil.default,
    "Sin": aten.sin.default, "Cos": aten.cos.default, "HardSwish": aten.hardswish.default,
    "Not": aten.logical_not.default, "Softplus": aten.softplus.default,
}.items():
    _HANDLERS[_name] = _unary(_target)


@_op("Identity", "Dropout")
def _identity(b, ins, attrs):
    return [ins[0]]


@_op("Constant")
def _constant(b, ins, attrs):
    if "value" in attrs:
        return attrs["value"]
    for key, dtype in (("value_float", torch.float32), ("value_int", torch.int64)):
        if key in attrs:
            return torch.tensor(attrs[key], dtype=dtype)
    for key, dtype in (("value_floats", torch.float32), ("value_ints", torch.int64)):
        if key in attrs:  # a list, or a numpy array when long (sized and reserved as it was read)
            value = attrs[key]
            return torch.from_numpy(value) if hasattr(value, "dtype") else torch.tensor(value, dtype=dtype)
    raise ModelLoadError(f"Constant with attributes {sorted(attrs)} is not supported")


def _binary(target_tensor, scalar_ok: bool = False) -> Handler:
    def handler(b, ins, attrs):
        x, y = ins
        return b.call(target_tensor, x, _scalar_or(y, x) if scalar_ok else y)

    return handler


_HANDLERS["Add"] = _binary(aten.add.Tensor, scalar_ok=True)
_HANDLERS["Sub"] = _binary(aten.sub.Tensor, scalar_ok=True)
_HANDLERS["Mul"] = _binary(aten.mul.Tensor, scalar_ok=True)
_HANDLERS["Equal"] = _binary(aten.eq.Tensor)
_HANDLERS["Greater"] = _binary(aten.gt.Tensor)
_HANDLERS["Less"] = _binary(aten.lt.Tensor)
_HANDLERS["GreaterOrEqual"] = _binary(aten.ge.Tensor)
_HANDLERS["LessOrEqual"] = _binary(aten.le.Tensor)
_HANDLERS["And"] = _binary(aten.logical_and.default)
_HANDLERS["Or"] = _binary(aten.logical_or.default)
_HANDLERS["Xor"] = _binary(aten.logical_xor.default)
_HANDLERS["Max"] = lambda b, ins, attrs: _variadic(b, ins, aten.maximum.default)
_HANDLERS["Min"] = lambda b, ins, attrs: _variadic(b, ins, aten.minimum.default)
_HANDLERS["Sum"] = lambda b, ins, attrs: _variadic(b, ins, aten.add.Tensor)


def _variadic(b, ins, target):
    out = ins[0]
    for v in ins[1:]:
        out = b.call(target, out, v)
    return out


@_op("Div")
def _div(b, ins, attrs):
    x, y = ins
    if (isinstance(x, torch.Tensor) and x.numel() == 1 and x.dtype == _dtype(y) and x.is_floating_point()
            and _is_node(y) and x.dim() <= len(_shape(y)) and float(x.reshape(-1)[0]) == 1.0):
        # 1 / y is how the TorchScript exporter writes torch.rsqrt's reciprocal (Div(1, Sqrt(v))); ATen's
        # reciprocal is the same division, and RMSNorm's pattern reads reciprocal(sqrt) as rsqrt
        return b.call(aten.reciprocal.default, y)
    if _dtype(x).is_floating_point:
        return b.call(aten.div.Tensor, x, _scalar_or(y, x))
    return b.call(aten.div.Tensor_mode, x, y, rounding_mode="trunc")


@_op("Mod")
def _mod(b, ins, attrs):
    target = aten.fmod.Tensor if attrs.get("fmod", 0) else aten.remainder.Tensor
    return b.call(target, ins[0], ins[1])


@_op("Pow")
def _pow(b, ins, attrs):
    x, y = ins
    if isinstance(y, torch.Tensor) and y.numel() == 1 and _is_node(x):
        return b.call(aten.pow.Tensor_Scalar, x, y.item())
    out = b.call(aten.pow.Tensor_Tensor, x, y)
    return b.call(aten.to.dtype, out, _dtype(x)) if _dtype(out) != _dtype(x) else out


@_op("Where")
def _where(b, ins, attrs):
    return b.call(aten.where.self, *ins)


@_op("IsNaN")
def _is_nan(b, ins, attrs):
    return b.call(aten.isnan.default, ins[0])


@_op("IsInf")
def _is_inf(b, ins, attrs):
    pos, neg = attrs.get("detect_positive", 1), attrs.get("detect_negative", 1)
    if pos and neg:
        return b.call(aten.isinf.default, ins[0])
    if pos:
        return b.call(aten.isposinf.default, ins[0])
    if neg:
        return b.call(aten.isneginf.default, ins[0])
    return b.call(aten.zeros_like.default, ins[0], dtype=torch.bool)  # detects nothing: all False


@_op("CumSum")
def _cumsum(b, ins, attrs):
    """``CumSum(x, axis)``: ``reverse`` sums from the end (flip, sum, flip back); ``exclusive`` leaves
    each element out of its own sum (the inclusive sum shifted one along the axis, a zero first),
    exactly, not as ``sum - x``. The sum keeps x's dtype (ATen would widen int32 to int64)."""
    x = ins[0]
    rank = len(_shape(x))
    axis = _axis(_ints(ins[1], "CumSum axis")[0], rank)
    if not 0 <= axis < rank:
        raise ModelLoadError(f"CumSum axis {axis} is outside a rank-{rank} input")
    reverse, exclusive = bool(attrs.get("reverse", 0)), bool(attrs.get("exclusive", 0))
    if reverse:
        x = b.call(aten.flip.default, x, [axis])
    y = b.call(aten.cumsum.default, x, axis, dtype=_dtype(x))
    if exclusive:
        size = _shape(y)[axis]
        pads = [0, 0] * (rank - 1 - axis) + [1, 0]  # constant_pad_nd's pairs run from the last dim
        y = b.call(aten.slice.Tensor, b.call(aten.constant_pad_nd.default, y, pads, 0), axis, 0, size)
    if reverse:
        y = b.call(aten.flip.default, y, [axis])
    return y


@_op("ScatterND")
def _scatter_nd(b, ins, attrs):
    """``ScatterND(data, indices, updates)``: ``data`` with ``data[indices[i]] = updates[i]`` as
    ``aten.index_put`` (``reduction="add"``: accumulated). The last dim of ``indices`` indexes the first
    dims of ``data``; negative indices count from the end. Other reductions are refused by name."""
    data, idx, updates = ins
    reduction = attrs.get("reduction", "none")
    if reduction not in ("none", "add"):
        raise ModelLoadError(f"ScatterND with reduction='{str(reduction)[:20]}' is not supported")
    depth = _shape(idx)[-1]
    shape = _shape(data)
    if depth > len(shape):
        raise ModelLoadError(f"ScatterND indices of depth {depth} on a rank-{len(shape)} tensor")
    if isinstance(idx, torch.Tensor):
        columns = []
        for k in range(depth):
            col = idx[..., k]
            columns.append(torch.where(col < 0, col + shape[k], col).contiguous())
    else:
        columns = [b.call(aten.select.int, idx, -1, k) for k in range(depth)]
    return b.call(aten.index_put.default, data, columns, updates, reduction == "add")


@_op("ScatterElements")
def _scatter_elements(b, ins, attrs):
    """``ScatterElements(data, indices, updates)``: ``data`` with ``data[..., indices[i], ...] = updates[i]`` along
    ``axis``, as ``aten.scatter`` (``reduction`` "add": ``scatter_add``; "mul"/"max"/"min": ``scatter_reduce`` with
    ``data`` included, as ONNX defines them). Negative indices count from the end."""
    data, idx, updates = ins
    shape = _shape(data)
    axis = _axis(attrs.get("axis", 0), len(shape))
    if not 0 <= axis < len(shape):
        raise ModelLoadError(f"ScatterElements axis {axis} is outside a rank-{len(shape)} input")
    if isinstance(idx, torch.Tensor):
        idx = torch.where(idx < 0, idx + shape[axis], idx).contiguous()
    else:
        size = shape[axis]
        idx = b.call(aten.where.self, b.call(aten.lt.Scalar, idx, 0), b.call(aten.add.Tensor, idx, size), idx)
    reduction = str(attrs.get("reduction", "none"))
    if reduction == "none":
        return b.call(aten.scatter.src, data, axis, idx, updates)
    if reduction == "add":
        return b.call(aten.scatter_add.default, data, axis, idx, updates)
    if reduction in ("mul", "max", "min"):
        name = {"mul": "prod", "max": "amax", "min": "amin"}[reduction]
        return b.call(aten.scatter_reduce.two, data, axis, idx, updates, name, include_self=True)
    raise ModelLoadError(f"ScatterElements with reduction='{reduction[:20]}' is not supported")


@_op("TopK")
def _topk(b, ins, attrs):
    """``TopK(x, k)``: the ``k`` largest (``largest=0``: smallest) values along ``axis`` and their int64 indices, as
    ``torch.topk``, sorted (ONNX's ``sorted=0`` leaves the order unspecified; sorted is one such order). ``k`` must
    be a constant: the outputs' shape depends on it."""
    x = ins[0]
    shape = _shape(x)
    axis = _axis(attrs.get("axis", -1), len(shape))
    ks = _ints(ins[1], "TopK k")
    if len(ks) != 1 or not 0 <= axis < len(shape) or not 0 <= ks[0] <= shape[axis]:
        raise ModelLoadError(f"TopK k={ks[:2]} along axis {axis} does not fit an input of shape {list(shape)[:8]}")
    return b.call(aten.topk.default, x, ks[0], axis, bool(attrs.get("largest", 1)), True)


@_op("Einsum")
def _einsum(b, ins, attrs):
    equation = str(attrs.get("equation", "")).replace(" ", "")
    if not re.fullmatch(r"[A-Za-z.,]*(->[A-Za-z.]*)?", equation) or len(equation) > 200:
        raise ModelLoadError(f"Einsum equation {equation[:60]!r} is not one the importer reads")
    return b.call(aten.einsum.default, equation, list(ins))


@_op("InstanceNormalization")
def _instance_norm(b, ins, attrs):
    x, scale, bias = ins[:3]
    return b.call(aten.instance_norm.default, x, scale, bias, None, None, True, 0.1,
                  attrs.get("epsilon", 1e-5), True)


@_op("MatMul")
def _matmul(b, ins, attrs):
    return b.call(aten.matmul.default, ins[0], ins[1])


@_op("Gemm")
def _gemm(b, ins, attrs):
    a, w = ins[0], ins[1]
    c = ins[2] if len(ins) > 2 else None
    alpha, beta = attrs.get("alpha", 1.0), attrs.get("beta", 1.0)
    if attrs.get("transA", 0):
        a = b.call(aten.permute.default, a, [1, 0])
    if alpha == 1.0 and beta == 1.0 and (c is None or len(_shape(c)) <= 1):
        if not attrs.get("transB", 0):
            w = b.call(aten.permute.default, w, [1, 0])  # folds when the weight is constant
        return b.call(aten.linear.default, a, w, c)
    if attrs.get("transB", 0):
        w = b.call(aten.permute.default, w, [1, 0])
    out = b.call(aten.matmul.default, a, w)
    if alpha != 1.0:
        out = b.call(aten.mul.Tensor, out, alpha)
    if c is not None:
        if beta != 1.0:
            c = b.call(aten.mul.Tensor, c, beta)
        out = b.call(aten.add.Tensor, out, c)
    return out


def _pads(attrs, spatial: int, in_shape, kernel, strides, dilations) -> tuple[list[int], list[int]]:
    """ONNX pads (begin..., end...) after resolving auto_pad."""
    auto = attrs.get("auto_pad", "NOTSET")
    if auto in ("NOTSET", ""):
        pads = list(attrs.get("pads", [0] * (2 * spatial)))
        return pads[:spatial], pads[spatial:]
    if auto == "VALID":
        return [0] * spatial, [0] * spatial
    begin, end = [], []
    for i in range(spatial):
        size = in_shape[2 + i]
        out = -(-size // strides[i])
        total = max(0, (out - 1) * strides[i] + (kernel[i] - 1) * dilations[i] + 1 - size)
        small, big = total // 2, total - total // 2
        begin.append(big if auto == "SAME_LOWER" else small)
        end.append(small if auto == "SAME_LOWER" else big)
    return begin, end


def _pad_input(b, x, begin, end, value):
    """Asymmetric padding goes in front as constant_pad_nd; returns (x, symmetric pads)."""
    if begin == end:
        return x, begin
    flat = []
    for lo, hi in zip(reversed(begin), reversed(end)):
        flat += [lo, hi]
    return b.call(aten.constant_pad_nd.default, x, flat, value), [0] * len(begin)


_CONV = {1: aten.conv1d.default, 2: aten.conv2d.default, 3: aten.conv3d.default}


@_op("Conv")
def _conv(b, ins, attrs):
    x, w = ins[0], ins[1]
    bias = ins[2] if len(ins) > 2 else None
    spatial = len(_shape(w)) - 2
    if spatial not in _CONV:
        raise ModelLoadError(f"Conv with {spatial} spatial dims is not supported")
    kernel = list(attrs.get("kernel_shape", _shape(w)[2:]))
    strides = list(attrs.get("strides", [1] * spatial))
    dilations = list(attrs.get("dilations", [1] * spatial))
    begin, end = _pads(attrs, spatial, _shape(x), kernel, strides, dilations)
    x, pads = _pad_input(b, x, begin, end, 0.0)
    return b.call(_CONV[spatial], x, w, bias, strides, pads, dilations, attrs.get("group", 1))


@_op("BatchNormalization")
def _batch_norm(b, ins, attrs):
    x, scale, bias, mean, var = ins[:5]
    if attrs.get("training_mode", 0):
        raise ModelLoadError("BatchNormalization in training mode is not supported")
    return b.call(aten.batch_norm.default, x, scale, bias, mean, var, False, 0.1, attrs.get("epsilon", 1e-5), True)


@_op("LayerNormalization")
def _layer_norm(b, ins, attrs):
    x, scale = ins[0], ins[1]
    bias = ins[2] if len(ins) > 2 else None
    shape = _shape(x)
    axis = _axis(attrs.get("axis", -1), len(shape))
    return b.call(aten.layer_norm.default, x, shape[axis:], scale, bias, attrs.get("epsilon", 1e-5))


@_op("Clip")
def _clip(b, ins, attrs):
    x = ins[0]
    lo = attrs.get("min")
    hi = attrs.get("max")
    if len(ins) > 1 and ins[1] is not None:
        lo = _const(ins[1], "Clip min").item()
    if len(ins) > 2 and ins[2] is not None:
        hi = _const(ins[2], "Clip max").item()
    if lo is None and hi is None:
        return ins[0]
    if lo == 0 and hi == 6:
        return b.call(aten.hardtanh.default, x, 0.0, 6.0)
    if lo == 0 and hi is None:
        return b.call(aten.relu.default, x)
    return b.call(aten.clamp.default, x, lo, hi)


@_op("LeakyRelu")
def _leaky_relu(b, ins, attrs):
    return b.call(aten.leaky_relu.default, ins[0], attrs.get("alpha", 0.01))


@_op("HardSigmoid")
def _hard_sigmoid(b, ins, attrs):
    alpha, beta = attrs.get("alpha", 0.2), attrs.get("beta", 0.5)
    if math.isclose(alpha, 1 / 6, rel_tol=1e-6) and beta == 0.5:
        return b.call(aten.hardsigmoid.default, ins[0])
    y = b.call(aten.add.Tensor, b.call(aten.mul.Tensor, ins[0], alpha), beta)
    return b.call(aten.clamp.default, y, 0.0, 1.0)


@_op("Gelu")
def _gelu(b, ins, attrs):
    if attrs.get("approximate", "none") == "tanh":
        return b.call(aten.gelu.default, ins[0], approximate="tanh")
    return b.call(aten.gelu.default, ins[0])


def _softmax_like(target) -> Handler:
    def handler(b, ins, attrs):
        x = ins[0]
        shape = _shape(x)
        rank = len(shape)
        axis = _axis(attrs.get("axis", -1 if b.opset >= 13 else 1), rank)
        if b.opset >= 13 or axis == rank - 1:
            return b.call(target, x, axis if axis != rank - 1 else -1)
        # before opset 13 the input is coerced to 2-D at ``axis``
        flat = b.call(aten.reshape.default, x, [math.prod(shape[:axis]), math.prod(shape[axis:])])
        return b.call(aten.reshape.default, b.call(target, flat, -1), shape)

    return handler


_HANDLERS["Softmax"] = _softmax_like(aten.softmax.int)
_HANDLERS["LogSoftmax"] = _softmax_like(aten.log_softmax.int)


def _pool_args(b, x, attrs):
    spatial = len(_shape(x)) - 2
    kernel = list(attrs["kernel_shape"])
    strides = list(attrs.get("strides", [1] * spatial))
    dilations = list(attrs.get("dilations", [1] * spatial))
    begin, end = _pads(attrs, spatial, _shape(x), kernel, strides, dilations)
    return spatial, kernel, strides, dilations, begin, end


_MAX_POOL = {1: aten.max_pool1d.default, 2: aten.max_pool2d.default, 3: aten.max_pool3d.default}
_AVG_POOL = {1: aten.avg_pool1d.default, 2: aten.avg_pool2d.default, 3: aten.avg_pool3d.default}


@_op("MaxPool")
def _max_pool(b, ins, attrs):
    x = ins[0]
    spatial, kernel, strides, dilations, begin, end = _pool_args(b, x, attrs)
    x, pads = _pad_input(b, x, begin, end, float("-inf"))
    return b.call(_MAX_POOL[spatial], x, kernel, strides, pads, dilations, bool(attrs.get("ceil_mode", 0)))


@_op("AveragePool")
def _avg_pool(b, ins, attrs):
    x = ins[0]
    spatial, kernel, strides, dilations, begin, end = _pool_args(b, x, attrs)
    if any(d != 1 for d in dilations):
        raise ModelLoadError("AveragePool with dilations is not supported")
    include = bool(attrs.get("count_include_pad", 0))
    if begin != end and not include:
        raise ModelLoadError("AveragePool with asymmetric pads and count_include_pad=0 is not supported")
    x, pads = _pad_input(b, x, begin, end, 0.0)
    ceil = bool(attrs.get("ceil_mode", 0))
    return b.call(_AVG_POOL[spatial], x, kernel, strides, pads, ceil, include)


@_op("GlobalAveragePool")
def _global_avg_pool(b, ins, attrs):
    x = ins[0]
    rank = len(_shape(x))
    if rank == 4:
        return b.call(aten.adaptive_avg_pool2d.default, x, [1, 1])
    return b.call(aten.mean.dim, x, list(range(2, rank)), True)


@_op("GlobalMaxPool")
def _global_max_pool(b, ins, attrs):
    x = ins[0]
    return b.call(aten.amax.default, x, list(range(2, len(_shape(x)))), True)


@_op("Flatten")
def _flatten(b, ins, attrs):
    x = ins[0]
    shape = _shape(x)
    axis = _axis(attrs.get("axis", 1), len(shape))
    if axis == 1 and len(shape) >= 2:
        return b.call(aten.flatten.using_ints, x, 1, -1)
    return b.call(aten.reshape.default, x, [math.prod(shape[:axis]), math.prod(shape[axis:])])


@_op("Reshape")
def _reshape(b, ins, attrs):
    x = ins[0]
    in_shape = _shape(x)
    target = _ints(ins[1], "Reshape's shape")
    if not attrs.get("allowzero", 0):
        target = [in_shape[i] if d == 0 else d for i, d in enumerate(target)]
    if -1 in target:
        known = math.prod(d for d in target if d != -1)
        target[target.index(-1)] = math.prod(in_shape) // known if known else 0
    return b.call(aten.reshape.default, x, target)


@_op("Transpose")
def _transpose(b, ins, attrs):
    x = ins[0]
    perm = list(attrs.get("perm", reversed(range(len(_shape(x))))))
    return b.call(aten.permute.default, x, perm)


@_op("Concat")
def _concat(b, ins, attrs):
    parts = [v for v in ins if v is not None and (len(_shape(v)) != 1 or _shape(v)[0] != 0 or len(ins) == 1)]
    if not parts:
        return ins[0]
    if len(parts) == 1:
        return parts[0]
    return b.call(aten.cat.default, parts, _axis(attrs.get("axis", 0), len(_shape(parts[0]))))


@_op("Shape")
def _shape_op(b, ins, attrs):
    shape = _shape(ins[0])
    start = attrs.get("start", 0)
    end = attrs.get("end", len(shape))
    return torch.tensor(shape[start:end], dtype=torch.int64)


@_op("Size")
def _size(b, ins, attrs):
    return torch.tensor(math.prod(_shape(ins[0])), dtype=torch.int64)


@_op("ConstantOfShape")
def _constant_of_shape(b, ins, attrs):
    shape = _ints(ins[0], "ConstantOfShape's shape")
    value = attrs.get("value", torch.zeros(1, dtype=torch.float32))
    b.reserve(limits.tensor_bytes(shape, value.element_size(), "ConstantOfShape's shape"),
              f"ConstantOfShape '{b.onnx_name[:80]}' of shape {shape[:8]}")
    return torch.full(shape, value.reshape(-1)[0].item(), dtype=value.dtype)


@_op("Cast")
def _cast(b, ins, attrs):
    dtype = _onnx_dtype(attrs["to"])
    if _dtype(ins[0]) == dtype:
        return ins[0]
    return b.call(aten.to.dtype, ins[0], dtype)


@_op("CastLike")
def _cast_like(b, ins, attrs):
    dtype = _dtype(ins[1])
    return ins[0] if _dtype(ins[0]) == dtype else b.call(aten.to.dtype, ins[0], dtype)


def _axes(b, ins, attrs, index: int = 1) -> list[int] | None:
    if "axes" in attrs:
        return list(attrs["axes"])
    if len(ins) > index and ins[index] is not None:
        return _ints(ins[index], "axes")
    return None


@_op("Unsqueeze")
def _unsqueeze(b, ins, attrs):
    x = ins[0]
    axes = _axes(b, ins, attrs)
    out_rank = len(_shape(x)) + len(axes)
    for a in sorted(_axis(a, out_rank) for a in axes):
        x = b.call(aten.unsqueeze.default, x, a)
    return x


@_op("Squeeze")
def _squeeze(b, ins, attrs):
    x = ins[0]
    shape = _shape(x)
    axes = _axes(b, ins, attrs)
    if axes is None:
        axes = [i for i, d in enumerate(shape) if d == 1]
    axes = [_axis(a, len(shape)) for a in axes]
    if len(axes) == 1:
        return b.call(aten.squeeze.dim, x, axes[0])
    return b.call(aten.squeeze.dims, x, axes)


@_op("Slice")
def _slice(b, ins, attrs):
    x = ins[0]
    if b.opset < 10 and "starts" in attrs:
        starts, ends = list(attrs["starts"]), list(attrs["ends"])
        axes = list(attrs.get("axes", range(len(starts))))
        steps = [1] * len(starts)
    else:
        starts, ends = _ints(ins[1], "Slice starts"), _ints(ins[2], "Slice ends")
        axes = _ints(ins[3], "Slice axes") if len(ins) > 3 and ins[3] is not None else list(range(len(starts)))
        steps = _ints(ins[4], "Slice steps") if len(ins) > 4 and ins[4] is not None else [1] * len(starts)
    if not len(starts) == len(ends) == len(axes) == len(steps):
        raise ModelLoadError("Slice starts, ends, axes and steps differ in length")
    for start, end, axis, step in zip(starts, ends, axes, steps):
        axis = _axis(axis, len(_shape(x)))
        size = _shape(x)[axis]
        if step == 0:
            raise ModelLoadError("Slice with a step of 0 is not valid ONNX")
        start = start + size if start < 0 else start
        end = end + size if end < 0 else end
        if step > 0:
            start, end = min(max(start, 0), size), min(max(end, 0), size)
        else:
            # ONNX clamps a negative-step start into [0, size-1] and its end into [-1, size-1]; the
            # elements are x[start], x[start+step], ... while > end. On the flipped axis (index i is
            # size-1-i there) that is an ordinary slice from size-1-start to size-1-end with step -step.
            start, end = min(max(start, 0), size - 1), min(max(end, -1), size - 1)
            x = b.call(aten.flip.default, x, [axis])
            start, end, step = size - 1 - start, size - 1 - end, -step
        end = max(end, start)
        if start == 0 and end == size and step == 1:
            continue
        x = b.call(aten.slice.Tensor, x, axis, start, end, step)
    return x


@_op("Expand")
def _expand(b, ins, attrs):
    x = ins[0]
    shape = list(torch.broadcast_shapes(tuple(_shape(x)), tuple(_ints(ins[1], "Expand's shape"))))
    if shape == _shape(x):
        return x
    return b.call(aten.expand.default, x, shape)


@_op("Tile")
def _tile(b, ins, attrs):
    return b.call(aten.repeat.default, ins[0], _ints(ins[1], "Tile repeats"))


@_op("Split")
def _split(b, ins, attrs):
    x = ins[0]
    shape = _shape(x)
    axis = _axis(attrs.get("axis", 0), len(shape))
    outputs = b.current_outputs  # the node's own output list: already parsed, so already bounded
    sizes = None
    if "split" in attrs:
        sizes = list(attrs["split"])
    elif len(ins) > 1 and ins[1] is not None:
        sizes = _ints(ins[1], "Split sizes")
    if sizes is None:
        parts = attrs.get("num_outputs", outputs)
        if parts != outputs:  # checked before any list of that length is made
            raise ModelLoadError(f"Split num_outputs={str(parts)[:20]} but the node has {outputs} outputs")
        if parts < 1:
            raise ModelLoadError("Split into no outputs")
        chunk = -(-shape[axis] // parts)
        sizes = [max(min(chunk, shape[axis] - i * chunk), 0) for i in range(parts)]
    if len(sizes) != outputs or any(s < 0 for s in sizes) or sum(sizes) != shape[axis]:
        raise ModelLoadError(f"Split sizes {sizes[:8]} do not split a dimension of {shape[axis]} into "
                             f"{outputs} outputs")
    return b.call(aten.split_with_sizes.default, x, sizes, axis)


@_op("Gather")
def _gather(b, ins, attrs):
    data, idx = ins
    shape = _shape(data)
    axis = _axis(attrs.get("axis", 0), len(shape))
    if isinstance(idx, torch.Tensor):
        if idx.numel() and int(idx.min()) < 0:
            b.reserve(idx.numel() * idx.element_size(), f"Gather '{b.onnx_name[:80]}' indices made non-negative")
            idx = torch.where(idx < 0, idx + shape[axis], idx)
        if idx.dim() == 0:
            return b.call(aten.select.int, data, axis, int(idx))
        if _in_order(idx, shape[axis]):
            # every element once and in order: a reshape (torch's dynamo exporter writes the channels_last
            # as_strided of a pooled (N, C, 1, 1) tensor as Reshape(-1) + Gather(0, 1, ..., N·C-1); seen as an
            # index_select, it would hide squeeze-and-excitation behind an op no pattern passes)
            return b.call(aten.reshape.default, data, shape[:axis] + list(idx.shape) + shape[axis + 1:])
    if isinstance(data, torch.Tensor) and _is_node(idx) and axis == 0 and len(shape) == 2 and data.is_floating_point():
        return b.call(aten.embedding.default, data, idx)
    idx_shape = _shape(idx)
    flat = idx if len(idx_shape) == 1 else b.call(aten.reshape.default, idx, [-1])
    out = b.call(aten.index_select.default, data, axis, flat)
    if len(idx_shape) == 1:
        return out
    return b.call(aten.reshape.default, out, shape[:axis] + idx_shape + shape[axis + 1:])


def _in_order(idx: torch.Tensor, count: int, chunk: int = 1 << 16) -> bool:
    """Whether ``idx`` holds 0, 1, ..., count-1 in order, compared a chunk at a time (no full-size copy)."""
    if idx.numel() != count or not idx.is_contiguous():  # (a non-contiguous one would be copied whole)
        return False
    flat = idx.view(-1)
    for start in range(0, count, chunk):
        part = flat[start:start + chunk]
        if not torch.equal(part, torch.arange(start, start + part.numel(), dtype=idx.dtype)):
            return False
    return True


@_op("GatherElements")
def _gather_elements(b, ins, attrs):
    data, idx = ins
    axis = _axis(attrs.get("axis", 0), len(_shape(data)))
    if isinstance(idx, torch.Tensor):
        idx = torch.where(idx < 0, idx + _shape(data)[axis], idx)
    return b.call(aten.gather.default, data, axis, idx)


@_op("GatherND")
def _gather_nd(b, ins, attrs):
    data, idx = ins
    if attrs.get("batch_dims", 0):
        raise ModelLoadError("GatherND with batch_dims is not supported")
    idx = _const(idx, "GatherND indices")
    shape = _shape(data)
    columns = []
    for k in range(idx.shape[-1]):
        col = idx[..., k]
        columns.append(torch.where(col < 0, col + shape[k], col).contiguous())
    return b.call(aten.index.Tensor, data, columns)


@_op("Range")
def _range(b, ins, attrs):
    start, limit, delta = (_const(v, "Range bounds").item() for v in ins)
    count = limits.safe_ceil_div(limit - start, delta)
    b.reserve(count * ins[0].element_size(), f"Range '{b.onnx_name[:80]}' of {count} elements")
    return torch.arange(start, limit, delta, dtype=ins[0].dtype)


def _reduce(target, axes_input_since: int) -> Handler:
    def handler(b, ins, attrs):
        x = ins[0]
        rank = len(_shape(x))
        axes = list(attrs["axes"]) if "axes" in attrs else None
        if axes is None and b.opset >= axes_input_since and len(ins) > 1 and ins[1] is not None:
            axes = _ints(ins[1], "reduction axes")
        if not axes:
            if attrs.get("noop_with_empty_axes", 0):
                return x
            axes = list(range(rank))
        axes = [_axis(a, rank) for a in axes]
        keep = bool(attrs.get("keepdims", 1))
        if target is aten.prod.dim_int:
            for a in sorted(axes, reverse=True):
                x = b.call(target, x, a, keep)
            return x
        return b.call(target, x, axes, keep)

    return handler


def _reduce_norm(kind: str) -> Handler:
    """ReduceL2 (``linalg_vector_norm``, as ``torch.norm(x, 2, dim)`` exports), ReduceL1 and
    ReduceSumSquare, on the axes the ONNX reductions share (attribute before opset 18, input after)."""
    name = {"l2": "ReduceL2", "l1": "ReduceL1", "sumsquare": "ReduceSumSquare"}[kind]

    def handler(b, ins, attrs):
        x = ins[0]
        rank = len(_shape(x))
        axes = list(attrs["axes"]) if "axes" in attrs else None
        if axes is None and b.opset >= 18 and len(ins) > 1 and ins[1] is not None:
            axes = _ints(ins[1], "reduction axes")
        if not axes:
            if attrs.get("noop_with_empty_axes", 0):  # runtimes disagree on what this returns
                raise ModelLoadError(f"{name} with noop_with_empty_axes=1 and no axes is not supported")
            axes = list(range(rank))
        axes = [_axis(a, rank) for a in axes]
        keep = bool(attrs.get("keepdims", 1))
        if not _dtype(x).is_floating_point:
            raise ModelLoadError(f"{name} of an integer tensor is not supported")
        if kind == "sumsquare":
            return b.call(aten.sum.dim_IntList, b.call(aten.mul.Tensor, x, x), axes, keep)
        return b.call(aten.linalg_vector_norm.default, x, 2 if kind == "l2" else 1, axes, keep)

    return handler


_HANDLERS["ReduceL2"] = _reduce_norm("l2")
_HANDLERS["ReduceL1"] = _reduce_norm("l1")
_HANDLERS["ReduceSumSquare"] = _reduce_norm("sumsquare")
_HANDLERS["ReduceMean"] = _reduce(aten.mean.dim, 18)
_HANDLERS["ReduceSum"] = _reduce(aten.sum.dim_IntList, 13)
_HANDLERS["ReduceMax"] = _reduce(aten.amax.default, 18)
_HANDLERS["ReduceMin"] = _reduce(aten.amin.default, 18)
_HANDLERS["ReduceProd"] = _reduce(aten.prod.dim_int, 18)


@_op("Resize", "Upsample")
def _resize(b, ins, attrs):
    x = ins[0]
    shape = _shape(x)
    spatial = len(shape) - 2
    scales = sizes = None
    if "scales" in attrs:  # Upsample before opset 9
        scales = list(attrs["scales"])
    else:  # (X, scales) for Upsample-9 and Resize-10; (X, roi, scales, sizes) after
        scale_in = ins[1] if len(ins) == 2 else (ins[2] if len(ins) > 2 else None)
        if scale_in is not None and _const(scale_in, "Resize scales").numel():
            scales = [float(s) for s in _const(scale_in, "Resize scales").tolist()]
        if len(ins) > 3 and ins[3] is not None:
            sizes = _ints(ins[3], "Resize sizes")
    if not scales and not sizes:
        raise ModelLoadError("Resize needs constant scales or sizes")
    if scales and (scales[0] != 1 or scales[1] != 1) or sizes and sizes[:2] != shape[:2]:
        raise ModelLoadError("Resize over batch or channel dims is not supported")
    mode = attrs.get("mode", "nearest")
    coord = attrs.get("coordinate_transformation_mode", "half_pixel" if b.opset >= 11 else "asymmetric")
    out_size = list(sizes[2:]) if sizes else None
    scale_factors = None if sizes else list(scales[2:])
    if mode == "nearest":
        nearest = attrs.get("nearest_mode", "round_prefer_floor" if b.opset >= 11 else "floor")
        if coord != "asymmetric" or nearest != "floor":
            raise ModelLoadError(f"Resize nearest with {coord}/{nearest} is not supported")
        targets = {1: aten.upsample_nearest1d.vec, 2: aten.upsample_nearest2d.vec, 3: aten.upsample_nearest3d.vec}
        return b.call(targets[spatial], x, out_size, scale_factors)
    if mode == "linear" and coord in ("half_pixel", "pytorch_half_pixel", "align_corners"):
        targets = {1: aten.upsample_linear1d.vec, 2: aten.upsample_bilinear2d.vec, 3: aten.upsample_trilinear3d.vec}
        return b.call(targets[spatial], x, out_size, coord == "align_corners", scale_factors)
    raise ModelLoadError(f"Resize mode {mode} with {coord} coordinates is not supported")


@_op("Pad")
def _pad(b, ins, attrs):
    x = ins[0]
    rank = len(_shape(x))
    mode = attrs.get("mode", "constant")
    if "pads" in attrs:
        pads, value = list(attrs["pads"]), attrs.get("value", 0.0)
    else:
        pads = _ints(ins[1], "Pad pads")
        value = _const(ins[2], "Pad value").item() if len(ins) > 2 and ins[2] is not None else 0
    axes = _ints(ins[3], "Pad axes") if len(ins) > 3 and ins[3] is not None else list(range(rank))
    axes = [_axis(a, rank) for a in axes]
    begin, end = [0] * rank, [0] * rank
    for i, a in enumerate(axes):
        begin[a], end[a] = pads[i], pads[len(axes) + i]
    flat = []
    for lo, hi in zip(reversed(begin), reversed(end)):
        flat += [lo, hi]
    while len(flat) > 2 and flat[-2:] == [0, 0]:
        flat = flat[:-2]
    if mode == "constant":
        return b.call(aten.constant_pad_nd.default, x, flat, value)
    if mode in ("reflect", "edge"):
        return b.call(aten.pad.default, x, flat, "reflect" if mode == "reflect" else "replicate")
    raise ModelLoadError(f"Pad mode {mode} is not supported")


SUPPORTED_OPS: tuple[str, ...] = tuple(sorted(_HANDLERS))
