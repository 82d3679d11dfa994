"""Model sources: the zoo, ONNX files, torch.export archives, Hugging Face folders.

``load_model(source, batch=..., seq_len=...)`` accepts a zoo name or a path
and returns a ``LoadedModel``: the ATen-level fx graph every other part of the
explorer works on, with example inputs of the requested size.

Trust rules, because users hand us files (``docs/security.md`` says why each holds):
- no load of a user file can reach an unpickling load: ``.pt2`` archives are
  read by ``pt2`` itself (raw tensor payloads, validated program JSON, sample
  inputs through the weights-only unpickler with PyTorch's process-wide
  weights-only switch on), never by ``torch.export.load``; plain
  ``.pt``/``.pth``/``.bin`` pickles are refused outright;
- every file a source reads resolves inside the source's folder, links followed
  (``limits.resolve_inside``): ONNX external data, Hugging Face configs, indexes
  and shards;
- what a source will materialise is estimated from its declarations and checked
  against one memory budget before allocation (``limits``), and every file source
  is first loaded in a child process with an address-space limit and a timeout
  (``isolate.probe``);
- Hugging Face folders load offline from a staging copy of the validated files,
  with no remote code and safetensors weights only (``hf``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from pathlib import Path
from typing import Any, Iterator

import torch
import torch.fx

from explorer.sources import zoo
from explorer.messages import LOAD
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
        raise ModelLoadError(LOAD("capture_failed", name=name, reason=_first_line(exc))) from exc
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


@contextlib.contextmanager
def _file_failures(path: Path, doing: str, verb: str) -> Iterator[None]:
    """Any failure while ``doing`` (``"loading"``) the file at ``path`` is the file's: it becomes one
    ``ModelLoadError`` line, "out of memory while loading it" or "could not ``verb`` it" with the
    error's type and first line. The explorer's own errors pass as they are."""
    try:
        yield
    except ExplorerError:
        raise
    except MemoryError:
        raise ModelLoadError(f"{path.name}: out of memory while {doing} it") from None
    except (Exception, RecursionError) as exc:
        raise ModelLoadError(f"{path.name}: could not {verb} it: {type(exc).__name__}: {_first_line(exc)}") from exc


# ------------------------------------------------------------------ dispatch

def load_model(source: str, batch: int | None = None, seq_len: int | None = None,
               data_path: str | None = None) -> LoadedModel:
    """Load a zoo name or a path (``.onnx``, ``.pt2``, or a Hugging Face folder).

    A path is loaded once in a limited child process first (``isolate.probe``).
    Raises ``ModelLoadError`` (one line) for anything it cannot load safely;
    any other failure while reading a file is the file's, and becomes one too.
    """
    if source in zoo.ZOO:
        return load_zoo(source, batch, seq_len)
    path = check_source(source, batch, seq_len, data_path)
    with _file_failures(path, "loading", "load"):
        return _load_path(path, batch, seq_len, data_path)


def check_source(source: str, batch: int | None = None, seq_len: int | None = None,
                 data_path: str | None = None) -> Path:
    """Everything but the final load of a file source: its kind, the static checks (``precheck``)
    and the isolated load (``isolate.probe``); returns its path. Raises ``ModelLoadError`` (one line)."""
    from explorer.sources import isolate, limits

    if not isinstance(source, str) or "\x00" in source:
        raise ModelLoadError(LOAD("nul_path"))
    path = Path(source)
    if not path.exists():
        if os.sep in source or "." in source:
            raise ModelLoadError(LOAD("no_such_path", path=source))
        zoo.get_entry(source)  # raises the "unknown model" message
    if not path.is_dir():
        _check_kind(path)
    limits.force_weights_only()
    with _file_failures(path, "checking", "read"):
        precheck(path, batch, seq_len, data_path)
    isolate.probe(source, batch, seq_len, data_path)
    return path


def _check_kind(path: Path) -> None:
    suffix = path.suffix.lower()
    if suffix in (".onnx", ".pt2"):
        return
    if suffix in PICKLE_SUFFIXES:
        raise ModelLoadError(LOAD("pickle_file", name=path.name))
    raise ModelLoadError(LOAD("unknown_format", name=path.name, suffix=suffix or "no suffix"))


def precheck(path: Path, batch: int | None = None, seq_len: int | None = None,
             data_path: str | None = None) -> None:
    """The static checks of a file source (declared sizes, paths, member lists, configs).

    In the caller's process only fixed-size headers are read (``check_header``: the file's kind, size and
    first bytes; a safetensors file's 8-byte length); the JSON, protobuf and zip directory are parsed
    first in the isolated loader's child (``isolate``), under its memory limit and timeout, which runs
    the full checks below before it loads."""
    from explorer.sources import isolate

    if path.is_dir():
        from explorer.sources import hf

        if not isolate.in_child():
            return hf.check_headers(path)
        hf.check_folder(path, batch, seq_len)
    elif path.suffix.lower() == ".onnx":
        from explorer.sources import onnx_file

        if not isolate.in_child():
            return onnx_file.check_header(path)
        onnx_file.precheck(path, batch, seq_len, data_path)
    else:
        from explorer.sources import pt2

        pt2.check_header(path)
        if isolate.in_child():
            pt2.read_archive(path, payloads=False)


def _load_path(path: Path, batch: int | None, seq_len: int | None, data_path: str | None) -> LoadedModel:
    if path.is_dir():
        from explorer.sources.hf import load_hf_folder

        return load_hf_folder(path, batch, seq_len)
    if path.suffix.lower() == ".onnx":
        from explorer.sources.onnx_file import load_onnx

        return load_onnx(path, batch, seq_len, data_path)
    return load_pt2(path)


def load_zoo(name: str, batch: int | None = None, seq_len: int | None = None) -> LoadedModel:
    """A zoo entry built with seeded weights and captured at the requested batch and sequence length."""
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


def guess_task(inputs: tuple[torch.Tensor, ...], gm: torch.fx.GraphModule) -> str:
    """"classification" when the first output is a 2-D tensor of at least 10 columns, else "features"."""
    out = [n for n in gm.graph.nodes if n.op == "output"][0].args[0]
    first = out[0] if isinstance(out, (list, tuple)) else out
    val = first.meta.get("val") if isinstance(first, torch.fx.Node) else None
    if isinstance(val, torch.Tensor) and val.dim() == 2 and val.shape[-1] >= 10:
        return "classification"
    return "features"


# ------------------------------------------------------------------ torch.export archives

def load_pt2(path: Path) -> LoadedModel:
    """A ``.pt2`` read by ``explorer.sources.pt2`` (never ``torch.export.load``), unlifted to a graph."""
    from explorer.sources import pt2

    gm, inputs = pt2.load_graph(path)  # operators allowlisted, shapes derived and within the budget
    names = [n.name for n in gm.graph.nodes if n.op == "placeholder"]
    b = inputs[0].shape[0] if inputs[0].dim() else 1
    return LoadedModel(
        name=path.stem, source="pt2", gm=gm, example_inputs=inputs, input_names=names,
        task=guess_task(inputs, gm), description=f"torch.export archive {path.name}",
        path=str(path), batch=int(b),
    )


def describe_source(model: LoadedModel) -> dict[str, Any]:
    """A small JSON-able summary of where a model came from."""
    return {"name": model.name, "source": model.source, "path": model.path,
            "batch": model.batch, "seq_len": model.seq_len, "inputs": [
                {"name": n, "shape": list(t.shape), "dtype": str(t.dtype).replace("torch.", "")}
                for n, t in zip(model.input_names, model.example_inputs)]}
