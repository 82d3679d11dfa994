"""Reading a ``torch.export`` archive (``.pt2``) that a user hands us, without running anything in it.

``torch.export.load`` is not safe for untrusted files, and no pre-check in
front of it can make it so (torch's own docstring says: never load data from
an untrusted source). Reading torch 2.x's loader shows why:

- ``pt2_archive._package`` unpickles weights and constants marked
  ``use_pickle`` with ``torch.load(weights_only=False)``, and custom/opaque
  objects with ``torch._C._pickle_load_obj`` and ``pickle.loads``;
- ``_export.serde.serialize.deserialize_torch_artifact`` retries a failed
  weights-only load of the sample inputs with the full unpickler;
- when ``load_pt2`` finds no program, ``torch.export.load`` falls back to the
  pre-2.7 layout (``serialized_*.pt`` members, unpickled);
- torch's zip reader finds members whatever the case of their names, so a
  name check done in Python with exact case does not see what torch reads;
- the program JSON itself is code: symbolic sizes (``expr_str``) go through
  ``sympy.sympify`` (which ``eval``s), ``guards_code`` becomes Python source
  that is compiled, and node targets are resolved by ``getattr`` from
  ``torch`` (``torch.os.system`` resolves) and called when the graph runs.

So this module never calls ``torch.export.load``. ``read_archive`` opens the
zip with Python's ``zipfile`` and accepts exactly the members a current
``torch.export.save`` of one program writes (names compared exactly: another
casing, another layout, compiled artifacts or extra members are refused);
checks the declared sizes against the memory budget before reading; reads
weights and constants as raw bytes itself (``torch.frombuffer``), refusing any
entry marked as a pickle or custom object; reads the sample inputs with the
weights-only unpickler (with PyTorch's process-wide weights-only switch on as
well); and validates the program JSON (node targets must be ATen operators or
``operator.getitem``, symbolic expressions must match a small arithmetic
grammar, ``guards_code`` must be empty, no custom objects) before torch's
deserializer sees it, with ready tensors, so nothing in torch loads a payload.
The deserialized graph is checked again (every call is an ATen op or
``getitem``) before it is returned.

``load_program(path) -> (ExportedProgram, example inputs)`` is what
``explorer.sources.load_pt2`` calls.
"""

from __future__ import annotations

import dataclasses
import io
import operator
import os
import re
import zipfile
from pathlib import Path
from typing import Any

from explorer import jsonfile
from explorer.errors import ModelLoadError
from explorer.sources import limits

ARCHIVE_VERSION = "0"
MAX_MEMBERS = 100_000
MAX_JSON_BYTES = 256 * 2**20
MAX_JSON_DEPTH = 200
MAX_NODES = 500_000
MAX_EXPR_CHARS = 2_000
#: Members written by ``torch.export.save(program, f)``, below the archive's top folder.
FIXED_MEMBERS = {
    "archive_format", "archive_version", "byteorder", ".data/version", ".data/serialization_id",
    "models/model.json", "data/weights/model_weights_config.json",
    "data/constants/model_constants_config.json", "data/sample_inputs/model.pt",
}
REQUIRED_MEMBERS = FIXED_MEMBERS - {".data/version", ".data/serialization_id", "byteorder"}
WEIGHT_MEMBER = re.compile(r"data/weights/weight_[0-9]{1,9}")
CONSTANT_MEMBER = re.compile(r"data/constants/tensor_[0-9]{1,9}")
MEMBER_NAME = re.compile(r"[A-Za-z0-9_.\-/]{1,300}")
FQN = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,200}(\.[A-Za-z0-9_]{1,200}){0,64}")
ATEN_TARGET = re.compile(r"torch\.ops\.aten\.[A-Za-z0-9_]{1,100}\.[A-Za-z0-9_]{1,100}")
OTHER_TARGETS = {"_operator.getitem"}
STRIDED_LAYOUT = 7
#: Identifiers a symbolic size may use besides symbols (``s0``, ``u3``): the functions torch's
#: deserializer offers and sympy's relational and min/max names.
SYMPY_NAMES = {
    "FloorDiv", "ModularIndexing", "Where", "PythonMod", "Mod", "CleanDiv", "CeilToInt", "FloorToInt",
    "CeilDiv", "LShift", "RShift", "PowByNatural", "FloatPow", "FloatTrueDiv", "IntTrueDiv",
    "IsNonOverlappingAndDenseIndicator", "TruncToFloat", "TruncToInt", "RoundToInt", "RoundDecimal",
    "ToFloat", "Identity", "Max", "Min", "Eq", "Ne", "Lt", "Le", "Gt", "Ge", "And", "Or", "Not",
    "True", "False", "oo", "Abs",
}
SYMBOL = re.compile(r"[a-z]{1,8}[0-9]{1,9}")
EXPR_CHARS = re.compile(r"[A-Za-z0-9_ +\-*/%(),<>=!]*")


@dataclasses.dataclass
class Archive:
    """The validated members of a ``.pt2``: the program JSON, tensors built from raw bytes, and inputs."""

    program_json: dict
    state_dict: dict[str, Any]
    constants: dict[str, Any]
    example_inputs: tuple[tuple[Any, ...], dict[str, Any]]


def _refuse(name: str, why: str) -> ModelLoadError:
    return ModelLoadError(f"{name}: {why}")


def _open_zip(path: Path, name: str) -> zipfile.ZipFile:
    handle = jsonfile.open_regular_file(path, name, ModelLoadError)
    try:
        head = handle.read(4)
        handle.seek(0)
        return zipfile.ZipFile(handle)
    except zipfile.BadZipFile:
        handle.close()
        if head[:1] == b"\x80":
            raise _refuse(name, "this is a pickle, not a torch.export archive; pickles are refused "
                                "because they can run arbitrary code") from None
        raise _refuse(name, "not a torch.export archive (not a zip file)") from None
    except (OSError, ValueError, EOFError, NotImplementedError, OverflowError) as exc:
        handle.close()
        raise _refuse(name, f"not a readable zip archive ({type(exc).__name__})") from None


def _members(archive: zipfile.ZipFile, name: str) -> dict[str, zipfile.ZipInfo]:
    """Validate the member list; returns {name below the top folder: ZipInfo}."""
    infos = archive.infolist()
    if len(infos) > MAX_MEMBERS:
        raise _refuse(name, f"{len(infos)} archive members is more than {MAX_MEMBERS}")
    tops = set()
    out: dict[str, zipfile.ZipInfo] = {}
    folded: dict[str, str] = {}
    total = 0
    for info in infos:
        member = info.filename
        if not MEMBER_NAME.fullmatch(member) or member.startswith("/") or ".." in member.split("/"):
            raise _refuse(name, f"archive member {member[:120]!r} has a name a torch.export archive "
                                "never writes; refused")
        if info.is_dir():
            continue
        top, _, rest = member.partition("/")
        tops.add(top)
        if rest.casefold() in folded:
            raise _refuse(name, f"archive members '{folded[rest.casefold()]}' and '{rest}' differ only in "
                                "case; refused")
        folded[rest.casefold()] = rest
        if rest not in FIXED_MEMBERS and not WEIGHT_MEMBER.fullmatch(rest) and not CONSTANT_MEMBER.fullmatch(rest):
            raise _refuse(name, f"archive member '{rest}' is not one that torch.export.save writes for one "
                                "program (legacy layouts, compiled artifacts, pickled payloads and extra "
                                "files are refused)")
        if info.flag_bits & 0x1:
            raise _refuse(name, f"archive member '{rest}' is encrypted")
        total += info.file_size
        out[rest] = info
    if len(tops) > 1:
        raise _refuse(name, "archive members lie in more than one top folder")
    missing = sorted(REQUIRED_MEMBERS - set(out))
    if missing:
        raise _refuse(name, f"not a torch.export archive of one program: no {', '.join(missing)}")
    limits.check_budget(total, f"{name} (its members, unpacked)")
    return out


def _read(archive: zipfile.ZipFile, info: zipfile.ZipInfo, name: str) -> bytes:
    try:
        with archive.open(info) as member:
            data = member.read(info.file_size + 1)
    except (zipfile.BadZipFile, OSError, EOFError, ValueError, NotImplementedError, RuntimeError) as exc:
        raise _refuse(name, f"archive member '{info.filename.partition('/')[2]}' cannot be read "
                            f"({type(exc).__name__})") from None
    if len(data) != info.file_size:
        raise _refuse(name, f"archive member '{info.filename.partition('/')[2]}' is not the size it declares")
    return data


def _int_of(value: Any, what: str, name: str) -> int:
    if isinstance(value, dict) and set(value) == {"as_int"}:
        value = value["as_int"]
    if isinstance(value, bool) or not isinstance(value, int) or value < 0 or value > 2**62:
        raise _refuse(name, f"{what} is not a concrete non-negative integer")
    return value


def _tensors(archive: zipfile.ZipFile, members: dict[str, zipfile.ZipInfo], config_member: str,
             folder: str, pattern: re.Pattern, name: str, params: bool, payloads: bool = True) -> dict[str, Any]:
    """Weights or constants from their payload config, built from raw bytes (never unpickled).
    With ``payloads=False`` only the config and the extents are checked (nothing is read)."""
    import torch
    from torch._export.serde.serialize import _SERIALIZE_TO_TORCH_DTYPE

    config = jsonfile.parse_json(_read(archive, members[config_member], name), f"{name}: {config_member}",
                                 ModelLoadError, MAX_JSON_BYTES, 16)
    entries = config.get("config") if isinstance(config, dict) else None
    if not isinstance(entries, dict):
        raise _refuse(name, f"{config_member} has no 'config' object")
    dtypes = {int(getattr(k, "value", k)): v for k, v in _SERIALIZE_TO_TORCH_DTYPE.items()}
    storages: dict[str, Any] = {}
    out: dict[str, Any] = {}
    for fqn, meta in entries.items():
        if not isinstance(fqn, str) or not FQN.fullmatch(fqn) or any(p.startswith("__") for p in fqn.split(".")):
            raise _refuse(name, f"{config_member} names a tensor {str(fqn)[:80]!r} that is not a module path")
        if not isinstance(meta, dict):
            raise _refuse(name, f"{config_member}: entry '{fqn}' is not an object")
        path_name = meta.get("path_name")
        if meta.get("use_pickle") is not False:
            raise _refuse(name, f"'{fqn}' is stored as a pickle, which is refused because unpickling can "
                                "run arbitrary code")
        member = f"{folder}{path_name}" if isinstance(path_name, str) else ""
        if not pattern.fullmatch(member):
            raise _refuse(name, f"'{fqn}' is stored as '{str(path_name)[:60]}', not as a raw tensor payload; refused")
        if member not in members:
            raise _refuse(name, f"'{fqn}' points at a missing member '{member}'")
        tmeta = meta.get("tensor_meta")
        if not isinstance(tmeta, dict):
            raise _refuse(name, f"'{fqn}' has no tensor metadata")
        dtype = dtypes.get(tmeta.get("dtype")) if isinstance(tmeta.get("dtype"), int) else None
        if dtype is None or dtype.is_complex or dtype.itemsize == 0:
            raise _refuse(name, f"'{fqn}' has an unsupported dtype {tmeta.get('dtype')!r}")
        if tmeta.get("layout", STRIDED_LAYOUT) != STRIDED_LAYOUT:
            raise _refuse(name, f"'{fqn}' is not a dense (strided) tensor")
        sizes, strides = tmeta.get("sizes"), tmeta.get("strides")
        if not isinstance(sizes, list) or not isinstance(strides, list) or len(sizes) != len(strides) \
                or len(sizes) > 16:
            raise _refuse(name, f"'{fqn}' has malformed sizes or strides")
        sizes = [_int_of(s, f"a size of '{fqn}'", name) for s in sizes]
        strides = [_int_of(s, f"a stride of '{fqn}'", name) for s in strides]
        offset = _int_of(tmeta.get("storage_offset", 0), f"the storage offset of '{fqn}'", name)
        if member not in storages:
            info = members[member]
            if info.file_size % dtype.itemsize:
                raise _refuse(name, f"payload '{member}' is not a whole number of {dtype} elements")
            if payloads:
                data = _read(archive, info, name)
                storages[member] = torch.frombuffer(bytearray(data), dtype=dtype) if data else \
                    torch.empty(0, dtype=dtype)
            else:
                storages[member] = torch.empty(info.file_size // dtype.itemsize, dtype=dtype, device="meta")
        storage = storages[member]
        if storage.dtype != dtype:
            raise _refuse(name, f"payload '{member}' is shared by tensors of different dtypes")
        if all(s > 0 for s in sizes):  # a 0-d tensor (sizes []) holds one element
            extent = offset + sum((s - 1) * st for s, st in zip(sizes, strides)) + 1
        else:
            extent = 0
        if extent > storage.numel():
            if storage.numel() == 0 and extent:
                raise _refuse(name, f"'{fqn}' declares {limits.numel(sizes, fqn)} elements but its payload is empty")
            raise _refuse(name, f"'{fqn}' reaches past the end of its payload '{member}'")
        if not payloads:
            continue
        tensor = torch.as_strided(storage, sizes, strides, offset) if extent else storage.new_zeros(sizes)
        requires_grad = tmeta.get("requires_grad") is True
        if params and meta.get("is_param") is True:
            tensor = torch.nn.Parameter(tensor, requires_grad=requires_grad)
        out[fqn] = tensor
    return out


def _sample_inputs(data: bytes, name: str) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The archive's sample inputs, through the weights-only unpickler (never the full one)."""
    import torch

    limits.force_weights_only()
    try:
        loaded = torch.load(io.BytesIO(data), weights_only=True, map_location="cpu")
    except Exception:
        raise _refuse(name, "its sample inputs need the unsafe unpickler; refused") from None
    if not (isinstance(loaded, tuple) and len(loaded) == 2 and isinstance(loaded[0], tuple)
            and isinstance(loaded[1], dict)):
        raise _refuse(name, "its sample inputs are not (args, kwargs)")
    args, kwargs = loaded
    if kwargs:
        raise _refuse(name, "keyword inputs are not supported; export with positional inputs")
    if not args or not all(isinstance(a, torch.Tensor) and type(a) is torch.Tensor for a in args):
        raise _refuse(name, "the archive's example inputs are not plain tensors; save it with them")
    return args, kwargs


def _check_expr(expr: Any, name: str) -> None:
    """A symbolic size torch would hand to ``sympy.sympify`` (which evaluates Python): only
    arithmetic on symbols and integers, and the few function names torch itself uses."""
    if not isinstance(expr, str) or len(expr) > MAX_EXPR_CHARS or not EXPR_CHARS.fullmatch(expr):
        raise _refuse(name, f"symbolic size {str(expr)[:60]!r} is not plain arithmetic; refused")
    for ident in re.findall(r"[A-Za-z_][A-Za-z0-9_]*", expr):
        if ident not in SYMPY_NAMES and not SYMBOL.fullmatch(ident):
            raise _refuse(name, f"symbolic size {expr[:60]!r} uses the name '{ident[:40]}'; refused")
    if re.search(r"\*\*\s*(?![0-9]\b)", expr) or re.search(r"[0-9]{19,}", expr):
        raise _refuse(name, f"symbolic size {expr[:60]!r} has a power or a number too large; refused")


def check_program_json(program: Any, name: str) -> None:
    """Refuse a program JSON that would make torch's deserializer or the graph run code.

    Walks the whole document without recursion. Node targets and operator
    arguments must be ATen operators (``torch.ops.aten.NAME.OVERLOAD``) or
    ``operator.getitem``; every ``expr_str`` must pass ``_check_expr``;
    ``guards_code`` must be empty; custom objects, tokens and extension
    operators are refused.
    """
    if not isinstance(program, dict) or not isinstance(program.get("graph_module"), dict):
        raise _refuse(name, "models/model.json is not an exported program")
    if program.get("guards_code") not in (None, []):
        raise _refuse(name, "the program carries guard code, which torch would compile and run; refused")
    nodes = (program["graph_module"].get("graph") or {}).get("nodes")
    if not isinstance(nodes, list) or len(nodes) > MAX_NODES:
        raise _refuse(name, "models/model.json has no node list, or too many nodes")
    for node in nodes:
        target = node.get("target") if isinstance(node, dict) else None
        if not isinstance(target, str) or not (ATEN_TARGET.fullmatch(target) or target in OTHER_TARGETS):
            raise _refuse(name, f"node target {str(target)[:80]!r} is not an ATen operator; refused")
    stack: list[Any] = [program]
    while stack:
        value = stack.pop()
        if isinstance(value, dict):
            for key, item in value.items():
                if key == "expr_str":
                    _check_expr(item, name)
                elif key in ("as_custom_obj", "custom_obj", "token", "as_graph", "as_graphs"):
                    raise _refuse(name, f"the program uses '{key}' values, which are refused")
                elif key in ("as_operator", "as_operators"):
                    for op in item if isinstance(item, list) else [item]:
                        if not isinstance(op, str) or not ATEN_TARGET.fullmatch(op):
                            raise _refuse(name, f"operator argument {str(op)[:80]!r} is not an ATen operator")
                stack.append(item)
        elif isinstance(value, list):
            stack.extend(value)


def read_archive(path: str | os.PathLike, payloads: bool = True) -> Archive:
    """Open and validate a ``.pt2``; returns its program JSON, tensors and sample inputs.

    Raises ``ModelLoadError`` (one line) for anything but an archive a current
    ``torch.export.save`` writes for one program of plain tensors. With
    ``payloads=False`` (the quick check before the isolated load) tensors and
    sample inputs are validated from their metadata but not read.
    """
    path = Path(path)
    name = path.name
    size = os.stat(path).st_size if path.exists() else 0
    limits.check_budget(size, name)
    archive = _open_zip(path, name)
    with archive:
        members = _members(archive, name)
        fmt = _read(archive, members["archive_format"], name)
        if fmt != b"pt2":
            raise _refuse(name, "not a torch.export archive (archive_format is not 'pt2')")
        version = _read(archive, members["archive_version"], name)
        if version.strip() != ARCHIVE_VERSION.encode():
            raise _refuse(name, f"archive version {version[:10]!r} is not the one this torch reads "
                                f"({ARCHIVE_VERSION}); re-save with torch.export.save")
        if "byteorder" in members and _read(archive, members["byteorder"], name) != b"little":
            raise _refuse(name, "the archive's tensors are not little-endian")
        program = jsonfile.parse_json(_read(archive, members["models/model.json"], name),
                                      f"{name}: models/model.json", ModelLoadError, MAX_JSON_BYTES, MAX_JSON_DEPTH)
        check_program_json(program, name)
        state_dict = _tensors(archive, members, "data/weights/model_weights_config.json", "data/weights/",
                              WEIGHT_MEMBER, name, params=True, payloads=payloads)
        constants = _tensors(archive, members, "data/constants/model_constants_config.json",
                             "data/constants/", CONSTANT_MEMBER, name, params=False, payloads=payloads)
        inputs = _sample_inputs(_read(archive, members["data/sample_inputs/model.pt"], name), name) \
            if payloads else ((), {})
    return Archive(program, state_dict, constants, inputs)


def check_graph_targets(gm: Any, name: str) -> None:
    """Every call in a deserialized graph is an ATen operator or ``getitem``; nothing else may run."""
    import torch

    for node in gm.graph.nodes:
        if node.op in ("call_module", "call_method"):
            raise _refuse(name, f"the program calls {node.op} '{node.target}', which is refused")
        if node.op == "call_function":
            target = node.target
            ok = target is operator.getitem or (
                isinstance(target, torch._ops.OpOverload) and target.namespace == "aten")
            if not ok:
                raise _refuse(name, f"the program calls {str(target)[:80]}, which is not an ATen operator")


def load_program(path: str | os.PathLike) -> tuple[Any, tuple[Any, ...]]:
    """The ``ExportedProgram`` of a validated ``.pt2`` and its example inputs (a tuple of tensors)."""
    import torch
    from torch._export.serde import schema
    from torch._export.serde.serialize import ExportedProgramDeserializer, _dict_to_dataclass

    name = Path(path).name
    archive = read_archive(path)
    try:
        serialized = _dict_to_dataclass(schema.ExportedProgram, archive.program_json)
        program = ExportedProgramDeserializer(None).deserialize(
            serialized, archive.state_dict, archive.constants, archive.example_inputs)
    except ModelLoadError:
        raise
    except (Exception, RecursionError) as exc:
        text = " ".join(str(exc).split())[:200] or type(exc).__name__
        raise _refuse(name, f"could not read the torch.export archive: {text}") from None
    check_graph_targets(program.graph_module, name)
    args = tuple(a for a in archive.example_inputs[0] if isinstance(a, torch.Tensor))
    return program, args
