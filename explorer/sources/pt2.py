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
well); and validates the program JSON (its parse cost estimated first; node
targets must be on the operator allowlist, ``pure_ops``; symbolic expressions
must pass a strict, bounded grammar, ``_Expr``; ``guards_code`` must be empty;
no custom objects) before torch's deserializer sees it, with ready tensors,
so nothing in torch loads a payload. The deserialized graph is checked again
against the allowlist (with its rules on in-place writes and seeded
operators), and ``derive_shapes`` recomputes every node's shape on fake
tensors, refusing recorded metadata that disagrees and checking the memory
budget against the derived sizes. The caller's process reads only the
file's first bytes (``check_header``); everything else is parsed first in
the isolated loader's child (``isolate``).

``load_graph(path) -> (GraphModule, example inputs)`` is what
``explorer.sources.load_pt2`` calls;
``load_program(path) -> (ExportedProgram, example inputs)`` is the step before unlifting.
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
from explorer.messages import LOAD
from explorer.errors import ModelLoadError
from explorer.sources import limits, pure_ops

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
#: A module path as ``torch.export.save`` writes it: dotted parts of letters, digits, ``_`` and ``-``
#: (torchvision's RegNet names blocks ``block1-0``); ``_module_path_ok`` refuses dunder parts and parts
#: that name an attribute every ``nn.Module`` has (``forward``, ``_parameters``), which torch would overwrite.
FQN = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_\-]{0,200}(\.[A-Za-z0-9_][A-Za-z0-9_\-]{0,200}){0,64}")
ATEN_TARGET = re.compile(r"torch\.ops\.aten\.[A-Za-z0-9_]{1,100}\.[A-Za-z0-9_]{1,100}")
STRIDED_LAYOUT = 7
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
            raise ModelLoadError(LOAD("pt2_pickle", name=name)) from None
        raise ModelLoadError(LOAD("pt2_not_zip", name=name)) from None
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
    # the sample inputs are read as bytes, then unpickled into tensors: both are alive at once
    total += out["data/sample_inputs/model.pt"].file_size
    limits.check_budget(total, f"{name} (its members, unpacked)")
    return out


def _read(archive: zipfile.ZipFile, info: zipfile.ZipInfo, name: str, into: bool = False) -> bytes | bytearray:
    """A member's bytes, exactly its declared size; ``into`` reads into one ``bytearray`` (no second copy)."""
    member_name = info.filename.partition('/')[2]
    try:
        with archive.open(info) as member:
            if into:
                data: bytes | bytearray = bytearray(info.file_size)
                view = memoryview(data)
                got = 0
                while got < info.file_size:
                    n = member.readinto(view[got:])
                    if not n:
                        break
                    got += n
                extra = member.read(1)
                view.release()
                if got != info.file_size or extra:
                    raise _refuse(name, f"archive member '{member_name}' is not the size it declares")
                return data
            data = member.read(info.file_size + 1)
    except (zipfile.BadZipFile, OSError, EOFError, ValueError, NotImplementedError, RuntimeError) as exc:
        raise _refuse(name, f"archive member '{member_name}' cannot be read ({type(exc).__name__})") from None
    if len(data) != info.file_size:
        raise _refuse(name, f"archive member '{member_name}' is not the size it declares")
    return data


def _int_of(value: Any, what: str, name: str) -> int:
    if isinstance(value, dict) and set(value) == {"as_int"}:
        value = value["as_int"]
    if isinstance(value, bool) or not isinstance(value, int) or value < 0 or value > 2**62:
        raise _refuse(name, f"{what} is not a concrete non-negative integer")
    return value


def _module_path_ok(fqn: Any) -> bool:
    """Whether ``fqn`` is a module path that names only fresh attributes (see ``FQN``)."""
    import torch

    if not isinstance(fqn, str) or not FQN.fullmatch(fqn):
        return False
    reserved = _module_attributes(torch.nn.Module)
    return not any(part.startswith("__") or part in reserved for part in fqn.split("."))


_RESERVED: dict[type, frozenset[str]] = {}


def _module_attributes(cls: type) -> frozenset[str]:
    if cls not in _RESERVED:
        _RESERVED[cls] = frozenset(dir(cls())) | frozenset(dir(cls))
    return _RESERVED[cls]


def _tensors(archive: zipfile.ZipFile, members: dict[str, zipfile.ZipInfo], config_member: str,
             folder: str, pattern: re.Pattern, name: str, params: bool, payloads: bool = True) -> dict[str, Any]:
    """Weights or constants from their payload config, built from raw bytes (never unpickled).
    With ``payloads=False`` only the config and the extents are checked (nothing is read)."""
    import torch
    from torch._export.serde.serialize import _SERIALIZE_TO_TORCH_DTYPE

    text = _read(archive, members[config_member], name)
    limits.check_json_cost(text, f"{name}: {config_member}")
    config = jsonfile.parse_json(text, f"{name}: {config_member}", ModelLoadError, MAX_JSON_BYTES, 16)
    entries = config.get("config") if isinstance(config, dict) else None
    if not isinstance(entries, dict):
        raise _refuse(name, f"{config_member} has no 'config' object")
    dtypes = {int(getattr(k, "value", k)): v for k, v in _SERIALIZE_TO_TORCH_DTYPE.items()}
    storages: dict[str, Any] = {}
    out: dict[str, Any] = {}
    for fqn, meta in entries.items():
        if not _module_path_ok(fqn):
            raise _refuse(name, f"{config_member} names a tensor {str(fqn)[:80]!r} that is not a module path")
        if not isinstance(meta, dict):
            raise _refuse(name, f"{config_member}: entry '{fqn}' is not an object")
        path_name = meta.get("path_name")
        if meta.get("use_pickle") is not False:
            raise ModelLoadError(LOAD("pt2_pickled_tensor", name=name, tensor=fqn))
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
                data = _read(archive, info, name, into=True)
                storages[member] = torch.frombuffer(data, dtype=dtype) if data else torch.empty(0, dtype=dtype)
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


# ------------------------------------------------------------------ symbolic sizes

#: Functions a symbolic size may call: sympy's constructors as ``srepr`` writes them (this torch saves
#: ``Mul(Integer(2), Symbol('s77', positive=True, integer=True))``) and the functions torch's
#: deserializer offers. ``Symbol`` and ``Pow`` take their arguments under stricter rules (``_Expr``).
EXPR_FUNCTIONS = {
    "Integer", "Mul", "Add", "Rational", "Max", "Min", "Eq", "Ne", "Lt", "Le", "Gt", "Ge", "And", "Or",
    "Not", "Abs", "FloorDiv", "ModularIndexing", "Where", "PythonMod", "Mod", "CleanDiv", "CeilToInt",
    "FloorToInt", "CeilDiv", "IntTrueDiv", "IsNonOverlappingAndDenseIndicator",
    "TruncToInt", "RoundToInt", "Identity", "StrictLessThan", "StrictGreaterThan", "LessThan",
    "GreaterThan", "Equality", "Unequality",
}
EXPR_CONSTANTS = {"True", "False", "oo", "int_oo"}
#: Assumptions ``Symbol(name, ...)`` may carry, each ``True`` or ``False``.
SYMBOL_ASSUMPTIONS = {"positive", "integer", "nonnegative", "negative", "nonpositive", "real", "finite",
                      "zero", "nonzero", "even", "odd", "rational", "extended_real"}
SYMBOL = re.compile(r"[a-z]{1,8}[0-9]{1,9}")
MAX_EXPR_TOKENS = 400
MAX_EXPR_DEPTH = 32
MAX_POWER = 8  # the largest exponent |k| of a power; a power's base may hold no power
MAX_DIGITS = 19
_EXPR_TOKEN = re.compile(r"\s*(?:(?P<int>[0-9]+)|(?P<name>[A-Za-z_][A-Za-z0-9_]*)|(?P<str>'[^']{0,40}')"
                         r"|(?P<op>\*\*|//|<=|>=|==|!=|[-+*/%(),=<>]))")


class _ExprError(Exception):
    pass


class _Expr:
    """A recursive-descent reader of one symbolic size, bounded in tokens, depth and powers.

    It accepts exactly: integers of at most ``MAX_DIGITS`` digits; symbols ``s0``/``u3`` (bare, or as
    ``Symbol('s0', positive=True, integer=True)`` with known assumptions); calls of ``EXPR_FUNCTIONS``;
    ``+ - * / // % < <= > >= == !=``, unary minus, parentheses; and powers whose exponent is an integer
    literal of magnitude at most ``MAX_POWER`` and whose base holds no power (``s77**9**9**9`` and
    ``Pow(Pow(9, 8), 8)`` are refused: sympy would evaluate them to numbers of millions of digits).
    Nothing is evaluated; the text is handed to torch's deserializer only once this accepted it.
    """

    def __init__(self, text: str) -> None:
        self.tokens: list[tuple[str, str]] = []
        pos = 0
        while pos < len(text):
            if text[pos:].strip() == "":
                break
            match = _EXPR_TOKEN.match(text, pos)
            if not match:
                raise _ExprError(f"unexpected character {text[pos]!r}")
            kind = match.lastgroup or "op"
            self.tokens.append((kind, match.group(kind)))
            if len(self.tokens) > MAX_EXPR_TOKENS:
                raise _ExprError(f"more than {MAX_EXPR_TOKENS} tokens")
            pos = match.end()
        self.at = 0

    def peek(self) -> tuple[str, str]:
        return self.tokens[self.at] if self.at < len(self.tokens) else ("end", "")

    def take(self, value: str | None = None, kind: str | None = None) -> str:
        tok_kind, tok = self.peek()
        if (value is not None and tok != value) or (kind is not None and tok_kind != kind) or tok_kind == "end":
            raise _ExprError(f"expected {value or kind}, found {tok or 'the end'!r}")
        self.at += 1
        return tok

    def parse(self) -> None:
        self.expr(0)
        if self.peek()[0] != "end":
            raise _ExprError(f"unexpected {self.peek()[1]!r}")

    # Each level returns whether its value holds a power.
    def expr(self, depth: int) -> bool:
        if depth > MAX_EXPR_DEPTH:
            raise _ExprError("nested too deep")
        powered = self.sum(depth)
        if self.peek()[1] in ("<", "<=", ">", ">=", "==", "!="):
            self.take()
            powered |= self.sum(depth)
        return powered

    def sum(self, depth: int) -> bool:
        powered = self.term(depth)
        while self.peek()[1] in ("+", "-"):
            self.take()
            powered |= self.term(depth)
        return powered

    def term(self, depth: int) -> bool:
        powered = self.unary(depth)
        while self.peek()[1] in ("*", "/", "//", "%"):
            self.take()
            powered |= self.unary(depth)
        return powered

    def unary(self, depth: int) -> bool:
        if self.peek()[1] == "-":
            self.take()
            return self.unary(depth + 1)
        base_powered = self.atom(depth)
        if self.peek()[1] == "**":
            self.take()
            self.exponent()
            if base_powered:
                raise _ExprError("a power of a power")
            if self.peek()[1] == "**":
                raise _ExprError("a power of a power")
            return True
        return base_powered

    def exponent(self) -> None:
        negative = self.peek()[1] == "-"
        if negative:
            self.take()
        if self.peek()[1] == "Integer":
            self.take()
            self.take("(")
            self.exponent()
            self.take(")")
            return
        digits = self.take(kind="int")
        if int(digits) > MAX_POWER:
            raise _ExprError(f"an exponent of {digits}, more than {MAX_POWER}")

    def integer(self) -> None:
        digits = self.take(kind="int")
        if len(digits) > MAX_DIGITS:
            raise _ExprError(f"an integer of {len(digits)} digits")

    def atom(self, depth: int) -> bool:
        kind, tok = self.peek()
        if kind == "int":
            self.integer()
            return False
        if tok == "(":
            self.take()
            powered = self.expr(depth + 1)
            self.take(")")
            return powered
        if kind != "name":
            raise _ExprError(f"unexpected {tok or 'end'!r}")
        self.take()
        if tok in EXPR_CONSTANTS or SYMBOL.fullmatch(tok):
            return False
        if self.peek()[1] != "(":
            raise _ExprError(f"the name {tok[:40]!r}")
        if tok == "Symbol":
            self.symbol()
            return False
        if tok == "Integer":
            self.take("(")
            if self.peek()[1] == "-":
                self.take()
            self.integer()
            self.take(")")
            return False
        if tok == "Pow":
            self.take("(")
            if self.expr(depth + 1):
                raise _ExprError("a power of a power")
            self.take(",")
            self.exponent()
            self.take(")")
            return True
        if tok not in EXPR_FUNCTIONS:
            raise _ExprError(f"the name {tok[:40]!r}")
        self.take("(")
        powered = False
        if self.peek()[1] != ")":
            powered |= self.expr(depth + 1)
            while self.peek()[1] == ",":
                self.take()
                powered |= self.expr(depth + 1)
        self.take(")")
        return powered

    def symbol(self) -> None:
        self.take("(")
        name = self.take(kind="str")[1:-1]
        if not SYMBOL.fullmatch(name):
            raise _ExprError(f"the symbol name {name[:40]!r}")
        while self.peek()[1] == ",":
            self.take()
            key = self.take(kind="name")
            if key not in SYMBOL_ASSUMPTIONS:
                raise _ExprError(f"the assumption {key[:40]!r}")
            self.take("=")
            if self.take(kind="name") not in ("True", "False"):
                raise _ExprError("an assumption that is not True or False")
        self.take(")")


def check_expr(expr: Any, name: str) -> None:
    """Refuse, in one line and without evaluating it, a symbolic size torch would hand to
    ``sympy.sympify`` (which evaluates Python) unless ``_Expr`` accepts it."""
    if not isinstance(expr, str) or len(expr) > MAX_EXPR_CHARS:
        raise _refuse(name, f"symbolic size {str(expr)[:60]!r} is not a bounded expression; refused")
    try:
        _Expr(expr).parse()
    except _ExprError as exc:
        raise _refuse(name, f"symbolic size {expr[:60]!r} is refused: {exc}") from None


def check_program_json(program: Any, name: str) -> None:
    """Refuse a program JSON that would make torch's deserializer or the graph run code.

    Walks the whole document without recursion. Node targets and operator
    arguments must be on the allowlist (``pure_ops.json_target_refusal``:
    ``torch.ops.aten.NAME.OVERLOAD`` of a pure operator, or a pure Python size
    operator; a higher-order operator is refused by name); every ``expr_str``
    must pass ``check_expr``;
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
        if not isinstance(target, str):
            raise _refuse(name, "a node has no operator name; refused")
        why = pure_ops.json_target_refusal(target)
        if why:
            raise _refuse(name, why)
    stack: list[Any] = [program]
    while stack:
        value = stack.pop()
        if isinstance(value, dict):
            for key, item in value.items():
                if key == "expr_str":
                    check_expr(item, name)
                elif key in ("as_custom_obj", "custom_obj", "token", "as_graph", "as_graphs"):
                    raise _refuse(name, f"the program uses '{key}' values, which are refused")
                elif key in ("as_operator", "as_operators"):
                    for op in item if isinstance(item, list) else [item]:
                        if not isinstance(op, str) or pure_ops.json_target_refusal(op) or not ATEN_TARGET.fullmatch(op):
                            raise _refuse(name, f"operator argument {str(op)[:80]!r} is not an ATen operator")
                stack.append(item)
        elif isinstance(value, list):
            stack.extend(value)


def check_header(path: str | os.PathLike) -> None:
    """What the caller checks before the isolated loader, reading only the file's first bytes: a regular
    file, within the memory budget, that starts as a zip does (a pickle is named as one)."""
    path = Path(path)
    name = path.name
    with jsonfile.open_regular_file(path, name, ModelLoadError) as handle:
        limits.check_budget(os.fstat(handle.fileno()).st_size, name)
        head = handle.read(4)
    if head[:1] == b"\x80":
        raise ModelLoadError(LOAD("pt2_pickle", name=name))
    if head != b"PK\x03\x04":
        raise ModelLoadError(LOAD("pt2_not_zip", name=name))


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
        text = _read(archive, members["models/model.json"], name)
        limits.check_json_cost(text, f"{name}: models/model.json")
        program = jsonfile.parse_json(text, f"{name}: models/model.json", ModelLoadError, MAX_JSON_BYTES,
                                      MAX_JSON_DEPTH)
        del text
        check_program_json(program, name)
        state_dict = _tensors(archive, members, "data/weights/model_weights_config.json", "data/weights/",
                              WEIGHT_MEMBER, name, params=True, payloads=payloads)
        constants = _tensors(archive, members, "data/constants/model_constants_config.json",
                             "data/constants/", CONSTANT_MEMBER, name, params=False, payloads=payloads)
        inputs = _sample_inputs(_read(archive, members["data/sample_inputs/model.pt"], name), name) \
            if payloads else ((), {})
    return Archive(program, state_dict, constants, inputs)


def check_graph_targets(gm: Any, name: str) -> None:
    """Every node of a deserialized graph is on the allowlist (``pure_ops.check_graph_ops``): nothing else runs."""
    pure_ops.check_graph_ops(gm, name)


def _tensor_bytes(value: Any) -> int:
    import torch

    if isinstance(value, torch.Tensor):
        return limits.tensor_bytes(value.shape, value.element_size(), "a value")
    if isinstance(value, (list, tuple)):
        return sum(_tensor_bytes(v) for v in value)
    return 0


def _disagreement(recorded: Any, derived: Any) -> str | None:
    """How a node's recorded ``meta['val']`` differs from the value derived from its inputs, or None.
    A symbolic recorded size is compared by its number of dimensions only (its value is the input's)."""
    import torch

    if isinstance(recorded, torch.Tensor):
        if not isinstance(derived, torch.Tensor):
            return f"a tensor is recorded where {type(derived).__name__} is computed"
        if recorded.dtype != derived.dtype:
            return f"dtype {recorded.dtype} is recorded, {derived.dtype} is computed"
        if recorded.dim() != derived.dim() or any(
                isinstance(r, int) and r != d for r, d in zip(recorded.shape, derived.shape)):
            return f"shape {list(recorded.shape)[:8]} is recorded, {list(derived.shape)[:8]} is computed"
        return None
    if isinstance(recorded, (list, tuple)):
        if not isinstance(derived, (list, tuple)) or len(recorded) != len(derived):
            return "a different number of outputs is recorded"
        for r, d in zip(recorded, derived):
            why = _disagreement(r, d)
            if why:
                return why
    return None


def derive_shapes(gm: Any, inputs: tuple[Any, ...], name: str) -> int:
    """Recompute every node's output shape and dtype from the example inputs on fake tensors, refuse a
    graph whose recorded metadata disagrees, and replace the recorded values by the derived ones.

    Nothing is allocated: ``FakeTensorMode`` runs each operator's meta function (the graph's operators
    were allowlisted first, ``check_graph_targets``). Returns the derived peak bytes of one forward:
    the weights and constants the graph reads, plus the largest set of values alive at once (the
    example inputs included, each value freed after its last use), all from derived sizes, so that a
    file that records ``[4, 4]`` for an ``aten.full([35000, 35000])`` cannot hide it.
    Raises ``ModelLoadError`` (one line).
    """
    import torch
    import torch.fx
    from torch._subclasses.fake_tensor import FakeTensorMode

    nodes = list(gm.graph.nodes)
    placeholders = [n for n in nodes if n.op == "placeholder"]
    if len(placeholders) != len(inputs):
        raise _refuse(name, f"the graph takes {len(placeholders)} inputs but the archive holds {len(inputs)}")
    weights = 0
    seen: set[int] = set()
    for node in nodes:
        if node.op == "get_attr":
            value = gm
            for part in str(node.target).split("."):
                value = getattr(value, part, None)
            if isinstance(value, torch.Tensor) and id(value) not in seen:
                seen.add(id(value))
                weights += _tensor_bytes(value)
    last_use: dict[Any, int] = {}
    for i, node in enumerate(nodes):
        for inp in node.all_input_nodes:
            last_use[inp] = i
    state = {"live": 0, "peak": 0, "sizes": {}, "index": {n: i for i, n in enumerate(nodes)}}

    class Derive(torch.fx.Interpreter):
        def run_node(self, node):
            out = super().run_node(node)
            if node.op in ("placeholder", "call_function"):
                recorded = node.meta.get("val")
                why = _disagreement(recorded, out) if recorded is not None else None
                if why:
                    raise _refuse(name, f"node '{str(node.name)[:60]}' ({str(node.target)[:60]}): its recorded "
                                        f"metadata disagrees with what its inputs give ({why}); refused")
                node.meta["val"] = out
                size = _tensor_bytes(out)
                state["sizes"][node] = size
                state["live"] += size
                state["peak"] = max(state["peak"], state["live"])
                limits.check_budget(weights + state["peak"], f"{name} (weights and one forward, derived)")
            i = state["index"][node]
            for inp in node.all_input_nodes:
                if last_use.get(inp) == i:
                    state["live"] -= state["sizes"].pop(inp, 0)
            return out

    mode = FakeTensorMode(allow_non_fake_inputs=True)
    try:
        with mode:
            fake = [mode.from_tensor(t) for t in inputs]
            Derive(gm).run(*fake)
    except ModelLoadError:
        raise
    except (Exception, RecursionError) as exc:
        text = " ".join(str(exc).split())[:160] or type(exc).__name__
        raise _refuse(name, f"its shapes could not be derived from its inputs ({type(exc).__name__}: {text})") \
            from None
    return weights + state["peak"]


def load_graph(path: str | os.PathLike) -> tuple[Any, tuple[Any, ...]]:
    """The unlifted fx graph of a validated ``.pt2`` (operators allowlisted, shapes derived and within the
    memory budget) and its example inputs. Raises ``ModelLoadError`` (one line)."""
    from explorer.sources import _unlift

    name = Path(path).name
    program, inputs = load_program(path)
    gm = _unlift(program)
    pure_ops.initialise_allocations(gm)
    check_graph_targets(gm, name)
    derive_shapes(gm, inputs, name)
    return gm, inputs


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
    pure_ops.initialise_allocations(program.graph_module)   # empty_like -> zeros_like, before anything runs
    check_graph_targets(program.graph_module, name)
    args = tuple(a for a in archive.example_inputs[0] if isinstance(a, torch.Tensor))
    return program, args
