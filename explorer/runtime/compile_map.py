"""What torch.compile fused, mapped back onto our graph: inductor's kernels, each with the FX nodes it computes.

``compile_map(source, device, dtype, mode)`` compiles the loaded model's ATen graph (any source)
with ``torch.compile`` in a child process (``runtime.child``: the usual timeout, killed on cancel),
with inductor's provenance tracking on, and returns a ``CompileMap`` (a JSON value, cached on disk
per graph fingerprint, input sizes, device, dtype, mode and torch version).

How a kernel is traced back (inductor's own records, read from its structured-trace artifacts)::

    our node ──(dynamo traces our GraphModule line by line: same ops, same order)──► pre-grad node
    pre-grad node ──(inductor_provenance_tracking_node_mappings: "preToPost")──► post-grad ATen nodes
                                            (a decomposition: batch_norm → sub, rsqrt, mul, add, ...)
    kernel "name:handle" ──("cppCodeToPost")──► the post-grad nodes its code came from

A post-grad node can appear in several kernels: an extern call (``extern_kernels.convolution``)
computes it, and a generated kernel beside it only copies its input into the layout the call wants.
So each of our nodes is *owned* by exactly one kernel: among the kernels that compute its post-grad
nodes (the extern call where there is one, else the generated kernels), the last one launched, which
writes its output. The kernels that touch a node without owning it list it under ``touches``.

``compare(detection, graph, cmap)`` sets our chains beside inductor's groups: per chain ``both``
(one kernel computes all its ops), ``partly`` (inductor fuses some of them together) or ``ours``
(inductor runs each op as its own kernel); the kernels that fuse ops no chain of ours holds
together (``only_inductor``: candidate patterns, with their ops); and the ops inductor leaves as
single-op kernels (``separate``).

``unclaimed(comparison, detection, patterns)``: of those kernels, the ones whose op kinds a family of
ours fuses in principle and that no chain, alternative or near miss of ours touches: what detection
missed silently (``tests/test_corpus.py`` lists them per corpus model, each with a reason).

The parent side (``compile_map``) imports no torch; the child's work does.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any, Callable, Iterable

from explorer.messages import PROGRESS
from explorer.errors import ExplorerError, RunError

#: torch.compile modes the mapping accepts (``torch._inductor.list_mode_options`` knows them).
MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
SCHEMA = 1
#: Kernel kinds, from the kernel's name as inductor writes it.
KINDS = ("triton_pointwise", "triton_reduction", "triton_persistent_reduction", "triton_template",
         "triton", "cpp", "extern")
CACHE_ENV = "FUSION_EXPLORER_CACHE"
DEFAULT_TIMEOUT_S = 900.0


# ------------------------------------------------------------------ values

@dataclasses.dataclass(frozen=True)
class Kernel:
    """One kernel launch of the compiled model.

    ``name`` is inductor's (``cpp_fused_add_relu_2``, ``triton_poi_fused_...``,
    ``extern_kernels.mm``), ``handle`` its provenance debug handle (unique per launch site);
    ``kind`` one of ``KINDS``; ``library`` for an extern call (cuBLAS, cuDNN, oneDNN, ATen);
    ``nodes`` our FX node ids it owns (computes the output of), ``touches`` the ones it computes a
    part of or prepares an input for, without owning them; ``replaced`` those of ``nodes`` that
    inductor's pattern matcher replaced (placed by dataflow, ``kernels_from_provenance``).
    """

    name: str
    handle: int
    kind: str
    library: str
    nodes: tuple[str, ...]
    touches: tuple[str, ...] = ()
    replaced: tuple[str, ...] = ()

    @property
    def key(self) -> str:
        return f"{self.name}:{self.handle}"

    @property
    def label(self) -> str:
        """``cpp_fused_add_relu_2 (C++)``: the kernel's name and kind as the graph labels it."""
        return f"{self.name} ({kind_label(self.kind, self.library)})"

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "handle": self.handle, "kind": self.kind, "library": self.library,
                "nodes": list(self.nodes), "touches": list(self.touches), "replaced": list(self.replaced)}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Kernel":
        return cls(str(d["name"]), int(d["handle"]), str(d["kind"]), str(d.get("library", "")),
                   tuple(map(str, d.get("nodes", ()))), tuple(map(str, d.get("touches", ()))),
                   tuple(map(str, d.get("replaced", ()))))


@dataclasses.dataclass(frozen=True)
class CompileMap:
    """Inductor's kernels for one model on one device, dtype and mode, mapped onto our node ids.

    ``generated_kernel_count`` is inductor's own counter (``torch._inductor.metrics``: on the CPU
    it counts each variant it generates, scalar and vectorised, so it exceeds the kernels kept),
    ``defined`` the generated kernels its output code defines and ``launch_sites`` the provenance
    handles that code names: the sources the kernels listed here are checked against. ``removed``
    are our nodes inductor dropped without a trace (``kernels_from_provenance``). ``unmapped_kernels`` are kernels none of whose post-grad
    nodes came from one of ours (empty when the mapping is whole).
    """

    model: str
    fingerprint: str
    device: str
    dtype: str
    mode: str
    batch: int
    seq_len: int | None
    torch_version: str
    kernels: tuple[Kernel, ...]
    generated_kernel_count: int
    launch_sites: int
    defined: tuple[str, ...] = ()
    removed: tuple[str, ...] = ()
    unmapped_kernels: tuple[str, ...] = ()
    compile_s: float = 0.0
    schema: int = SCHEMA

    def owner(self) -> dict[str, Kernel]:
        """Our node id → the kernel that owns it."""
        return {n: k for k in self.kernels for n in k.nodes}

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["kernels"] = [k.to_dict() for k in self.kernels]
        d["unmapped_kernels"] = list(self.unmapped_kernels)
        d["defined"] = list(self.defined)
        d["removed"] = list(self.removed)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any], what: str = "the compile map") -> "CompileMap":
        try:
            if int(d.get("schema", 0)) != SCHEMA:
                raise RunError(f"{what} has schema {d.get('schema')}, this explorer reads {SCHEMA}")
            return cls(str(d["model"]), str(d["fingerprint"]), str(d["device"]), str(d["dtype"]),
                       str(d["mode"]), int(d["batch"]), None if d.get("seq_len") is None else int(d["seq_len"]),
                       str(d["torch_version"]), tuple(Kernel.from_dict(k) for k in d["kernels"]),
                       int(d["generated_kernel_count"]), int(d["launch_sites"]),
                       tuple(map(str, d.get("defined", ()))), tuple(map(str, d.get("removed", ()))), tuple(map(str, d.get("unmapped_kernels", ()))), float(d.get("compile_s", 0.0)))
        except ExplorerError:
            raise
        except (KeyError, TypeError, ValueError) as exc:
            raise RunError(f"{what} is malformed: {type(exc).__name__}: {exc}") from None


def kind_of(name: str) -> str:
    """The kind of a kernel from the name inductor gives it."""
    if name.startswith(("extern_kernels.", "aten.", "torch.ops.", "torch._C.")) or "." in name:
        return "extern"
    for prefix, kind in (("triton_poi", "triton_pointwise"), ("triton_red", "triton_reduction"),
                         ("triton_per", "triton_persistent_reduction"), ("triton_tem", "triton_template"),
                         ("cpp_", "cpp"), ("triton", "triton")):
        if name.startswith(prefix):
            return kind
    return "cpp" if name.startswith("kernel") else "triton"


def library_of(name: str, device: str) -> str:
    """Which library an extern call runs on: cuBLAS/cuDNN on CUDA, oneDNN (mkldnn) or ATen on the CPU."""
    if kind_of(name) != "extern":
        return ""
    low = name.lower()
    if "mkldnn" in low or "onednn" in low:
        return "oneDNN"
    cuda = device.startswith("cuda")
    if any(op in low for op in ("mm", "addmm", "bmm", "baddbmm", "linear")) and "_int_mm" not in low:
        return "cuBLAS" if cuda else "ATen (BLAS)"
    if "convolution" in low or "conv" in low:
        return "cuDNN" if cuda else "ATen (oneDNN)"
    if "flash" in low or "efficient_attention" in low or "scaled_dot_product" in low or "cudnn_attention" in low:
        return "FlashAttention/SDPA" if cuda else "ATen (SDPA)"
    return "ATen"


_KIND_LABELS = {"triton_pointwise": "Triton pointwise", "triton_reduction": "Triton reduction",
                "triton_persistent_reduction": "Triton persistent reduction",
                "triton_template": "Triton template", "triton": "Triton", "cpp": "C++", "extern": "extern"}


def kind_label(kind: str, library: str = "") -> str:
    """``Triton pointwise``, ``extern cuBLAS``: a kind as a person reads it."""
    text = _KIND_LABELS.get(kind, kind)
    return f"{text} {library}" if kind == "extern" and library else text


# ------------------------------------------------------------------ the mapping (pure: JSON in, kernels out)

_HANDLE = re.compile(r"^(.*):(\d+)$")


def align_nodes(ours: list[tuple[str, str]], theirs: list[tuple[str, str]]) -> dict[str, str]:
    """Map dynamo's node names onto ours: (name, target) lists in graph order, call_function nodes only.

    Dynamo traces our GraphModule's code line by line, so its call sequence is ours with some ops
    dropped (dead code). A name that exists on both sides with the same target maps to itself;
    the rest are matched in order, each to the next of our nodes with the same target.
    """
    our_target = dict(ours)
    mapping: dict[str, str] = {}
    i = 0
    for name, target in theirs:
        if our_target.get(name) == target:
            mapping[name] = name
            i = max(i, next((j + 1 for j, (n, _) in enumerate(ours) if n == name), i))
            continue
        j = i
        while j < len(ours) and ours[j][1] != target:
            j += 1
        if j < len(ours):
            mapping[name] = ours[j][0]
            i = j + 1
    return mapping


def kernels_from_provenance(provenance: dict[str, Any], pre_to_ours: dict[str, str], device: str,
                            post_graph: dict[str, tuple[bool, tuple[str, ...], str]] | None = None,
                            our_successors: dict[str, list[str]] | None = None
                            ) -> tuple[list[Kernel], list[str], dict[str, list[str]], list[str]]:
    """Our nodes per kernel from inductor's ``inductor_provenance_tracking_node_mappings`` (module docstring).

    ``pre_to_ours`` maps pre-grad (dynamo) node names to our node ids; ``post_graph`` is the
    post-grad graph as {node: (is a view, its inputs, its target)}, ``our_successors`` our graph's edges. Two
    gaps in inductor's records are closed with them, and the nodes so placed are returned per kernel:

    - a post-grad node a pattern replacement made (scaled_dot_product_attention for
      matmul → softmax → matmul) has no origin; it takes the origins of the nodes that read it;
    - our ops the replacement removed have no post-grad node at all; each belongs to the kernel
      that its result reaches first (through other removed ops), when every path reaches the same one.

    Returns the kernels in launch order, the keys of kernels none of whose nodes map to ours,
    {kernel key: our nodes placed by dataflow}, and our nodes inductor removed without a trace (no
    post-grad node, none placed: no-ops such as a ``to`` into the dtype a tensor has, dead code).
    """
    kernel_to_post: dict[str, list[str]] = provenance.get("cppCodeToPost") or {}
    post_to_pre: dict[str, list[str]] = {k: list(v) for k, v in (provenance.get("postToPre") or {}).items()}
    post_graph = post_graph or {}
    parsed: list[tuple[int, str, str]] = []
    for key in kernel_to_post:
        m = _HANDLE.match(key)
        name, handle = (m.group(1), int(m.group(2))) if m else (key, 0)
        parsed.append((handle, name, key))
    parsed.sort()
    readers: dict[str, list[str]] = {}
    for node, (_, inputs, *_) in post_graph.items():
        for i in inputs:
            readers.setdefault(i, []).append(node)
    for post in {p for _, _, key in parsed for p in kernel_to_post[key]}:
        if not post_to_pre.get(post):
            inherited = [pre for r in readers.get(post, ()) for pre in post_to_pre.get(r, ())]
            if inherited:
                post_to_pre[post] = list(dict.fromkeys(inherited))

    def is_view(post: str) -> bool:
        if post in post_graph:
            return post_graph[post][0]
        return bool(re.match(r"(view|permute|unsqueeze|squeeze|expand|getitem|unbind|reshape|transpose|"
                             r"slice|select|alias|as_strided|t)(_\d+)?$", post))

    extern = {key for _, name, key in parsed if kind_of(name) == "extern"}
    order = {key: i for i, (_, _, key) in enumerate(parsed)}
    ours_of_post = {post: [pre_to_ours[p] for p in pres if p in pre_to_ours] for post, pres in post_to_pre.items()}
    computing: dict[str, set[str]] = {}  # our node -> kernels computing its non-view post-grad nodes
    touching: dict[str, set[str]] = {}
    for post in {p for _, _, key in parsed for p in kernel_to_post[key]}:
        keys = [key for _, _, key in parsed if post in kernel_to_post[key]]
        if is_view(post):
            chosen: list[str] = []
        else:
            # an extern call computes the op it calls; for the others listed with it (the pointwise ops
            # inlined into its inputs) the generated kernel that computes them is the one
            exact = [k for k in keys if k in extern and _extern_op(k) == _post_op(post, post_graph)]
            generated = [k for k in keys if k not in extern]
            chosen = exact or generated or keys
        for node in ours_of_post.get(post, ()):
            touching.setdefault(node, set()).update(keys)
            if chosen:
                computing.setdefault(node, set()).update(chosen)
    owner: dict[str, str] = {}
    for node, keys in computing.items():
        ext = [k for k in keys if k in extern]
        owner[node] = max(ext or keys, key=order.__getitem__)
    placed: dict[str, list[str]] = {}
    gone: list[str] = []
    if our_successors:
        mapped = set(ours_of_post_values(ours_of_post))
        removed = [n for n in dict.fromkeys(pre_to_ours.values()) if n not in mapped and n not in owner]
        for node in removed:
            reached, stack, seen = set(), list(our_successors.get(node, ())), set()
            while stack:
                n = stack.pop()
                if n in seen:
                    continue
                seen.add(n)
                if n in owner:
                    reached.add(owner[n])
                elif n not in mapped:
                    stack.extend(our_successors.get(n, ()))
                else:
                    reached.add(None)
            if len(reached) == 1 and None not in reached:
                placed.setdefault(next(iter(reached)), []).append(node)
            else:
                gone.append(node)
        for key, nodes in placed.items():
            for node in nodes:
                owner[node] = key
    owned: dict[str, list[str]] = {}
    touched: dict[str, list[str]] = {}
    for node, key in owner.items():
        owned.setdefault(key, []).append(node)
    for node, keys in touching.items():
        for key in keys:
            if owner.get(node) != key:
                touched.setdefault(key, []).append(node)
    kernels, unmapped = [], []
    for handle, name, key in parsed:
        nodes = tuple(sorted(owned.get(key, ())))
        touches = tuple(sorted(touched.get(key, ())))
        if not nodes and not touches:
            unmapped.append(key)
        kernels.append(Kernel(name, handle, kind_of(name), library_of(name, device), nodes, touches,
                              tuple(sorted(placed.get(key, ())))))
    return kernels, unmapped, placed, gone


def _extern_op(key: str) -> str:
    """``extern_kernels.convolution:2`` → ``convolution``; ``torch.ops.aten._foo.default:8`` → ``_foo``."""
    name = _HANDLE.sub(r"\1", key)
    parts = [p for p in name.split(".") if p not in ("default", "Tensor", "out")]
    return parts[-1] if parts else name


def _post_op(post: str, post_graph: dict[str, tuple]) -> str:
    """The ATen op a post-grad node calls (``aten.convolution.default`` → ``convolution``), from the
    recorded graph or else from its name (``convolution_1``)."""
    if post in post_graph and len(post_graph[post]) > 2:
        target = str(post_graph[post][2])
        parts = [p for p in target.split(".") if p not in ("default", "Tensor", "out")]
        return parts[-1] if parts else target
    return re.sub(r"(_default)?(_\d+)?$", "", post)


def ours_of_post_values(ours_of_post: dict[str, list[str]]) -> Iterable[str]:
    """Every one of our nodes that some post-grad node came from."""
    for nodes in ours_of_post.values():
        yield from nodes


_DEFINED = re.compile(r"^(\w+) = async_compile\.(cpp_pybinding|cpp|triton|cuda|rocm|halide|mps)\(", re.M)


def defined_kernels(output_code: Iterable[str]) -> list[str]:
    """The kernels inductor's output code defines (``triton_poi_fused_relu_0 = async_compile.triton(...``)."""
    return [m.group(1) for code in output_code for m in _DEFINED.finditer(code)]


def count_launch_sites(output_code: Iterable[str]) -> int:
    """How many provenance handles inductor's output code names (``# [Provenance debug handles] k:3``)."""
    n = 0
    for code in output_code:
        for line in code.splitlines():
            if "[Provenance debug handles]" in line:
                n += len(line.split("]", 1)[1].split(","))
    return n


# ------------------------------------------------------------------ the child's work (torch imported here)

def map_loaded(model: Any, device: str, dtype: str, mode: str = "default",
               emit: Callable[[float, str], None] | None = None) -> CompileMap:
    """Compile ``model`` (a ``LoadedModel``) with torch.compile in this process and map its kernels.

    ``device`` ``cpu`` or ``cuda[:n]``; ``dtype`` fp32, fp16 or bf16. Raises ``RunError`` (one line)
    when the model does not compile as one graph or inductor records no provenance.
    """
    import logging

    import torch
    import torch._inductor.config as inductor_config
    from torch._inductor import metrics
    from torch._inductor.compile_fx import compile_fx
    from torch._inductor.custom_graph_pass import CustomGraphPass

    from explorer.graph.build import build_graph, fingerprint
    from explorer.runtime import measure as m

    if mode not in MODES:
        raise RunError(f"unknown torch.compile mode '{mode}': choose from {', '.join(MODES)}")
    emit = emit or (lambda f, s: None)
    emit(0.05, f"preparing {model.name} ({dtype}, {device})")
    torch_dtype = m.torch_dtype(dtype)
    gm = m.prepare_graph(model.gm, device, torch_dtype, lean=False)
    inputs = m.prepare_inputs(model.example_inputs, device, torch_dtype, False)
    graph = build_graph(model.gm, model.name)

    records: list[tuple[dict, Any]] = []

    class _Artifacts(logging.Handler):
        """Keeps the structured-trace records the mapping reads (provenance, output code)."""

        def emit(self, record: logging.LogRecord) -> None:
            meta = getattr(record, "metadata", None) or {}
            art = meta.get("artifact", {}).get("name") if isinstance(meta.get("artifact"), dict) else None
            if art == "inductor_provenance_tracking_node_mappings" or "inductor_output_code" in meta:
                records.append((meta, getattr(record, "payload", None)))

    post_graphs: list[dict[str, tuple[bool, tuple[str, ...], str]]] = []

    class _RecordPostGrad(CustomGraphPass):
        """Reads the post-grad graph (each node: a view or not, its inputs); changes nothing."""

        def __call__(self, g: Any) -> None:
            post_graphs.append({n.name: (_is_view_target(n.target), tuple(i.name for i in n.all_input_nodes),
                                         str(n.target)) for n in g.nodes})

        def uuid(self) -> str:
            return "fusion-explorer-record-post-grad"

    dynamo_graphs: list[Any] = []
    options = {} if mode == "default" else dict(torch._inductor.list_mode_options(mode))

    def backend(g: Any, example: list) -> Any:
        dynamo_graphs.append(g)
        return compile_fx(g, example, config_patches=options or None)

    trace_log = logging.getLogger("torch.__trace")
    handler = _Artifacts(logging.DEBUG)
    level, propagate = trace_log.level, trace_log.propagate
    trace_log.addHandler(handler)
    trace_log.setLevel(logging.DEBUG)
    trace_log.propagate = False   # the records are for the handler only, never the root logger's
    patches = {"trace.provenance_tracking_level": 1, "fx_graph_cache": False,
               "post_grad_custom_post_pass": _RecordPostGrad()}
    if not device.startswith("cuda"):
        patches["compile_threads"] = 1  # no worker pool for a CPU compile on a shared machine
    torch._dynamo.reset()
    metrics.reset()
    emit(0.1, f"compiling {model.name} with torch.compile ({mode})")
    t0 = time.perf_counter()
    try:
        with inductor_config.patch(patches), torch.no_grad():
            compiled = torch.compile(gm, backend=backend, fullgraph=True, dynamic=False)
            compiled(*inputs)
        m.synchronize(device)
    except ExplorerError:
        raise
    except Exception as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:240]
        raise RunError(f"torch.compile failed on {model.name}: {type(exc).__name__}: {first}") from None
    finally:
        trace_log.removeHandler(handler)
        trace_log.setLevel(level)
        trace_log.propagate = propagate
    compile_s = time.perf_counter() - t0
    generated = int(metrics.generated_kernel_count)
    emit(0.9, "mapping kernels to graph nodes")
    provenance = [json.loads(p) if isinstance(p, str) else p for meta, p in records
                  if "artifact" in meta and p]
    codes = [p for meta, p in records if "inductor_output_code" in meta and isinstance(p, str)]
    if len(dynamo_graphs) != 1 or not provenance:
        raise RunError(f"torch.compile made {len(dynamo_graphs)} graph(s) of {model.name} and inductor recorded "
                       f"{'no' if not provenance else 'its'} provenance: cannot map its kernels")
    ours = [(n.name, str(n.target)) for n in gm.graph.nodes if n.op == "call_function"]
    theirs = [(n.name, str(n.target)) for n in dynamo_graphs[0].graph.nodes if n.op == "call_function"]
    pre_to_ours = align_nodes(ours, theirs)
    successors = {n: list(graph.successors(n)) for n in graph.nodes}
    kernels, unmapped, _, gone = kernels_from_provenance(provenance[-1], pre_to_ours, device,
                                                   post_graphs[-1] if post_graphs else None, successors)
    return CompileMap(model=model.name, fingerprint=fingerprint(graph), device=device, dtype=dtype, mode=mode,
                      batch=int(model.batch), seq_len=model.seq_len, torch_version=torch.__version__,
                      kernels=tuple(kernels), generated_kernel_count=generated,
                      launch_sites=count_launch_sites(codes), defined=tuple(defined_kernels(codes)),
                      removed=tuple(gone), unmapped_kernels=tuple(unmapped),
                      compile_s=round(compile_s, 2))


def _is_view_target(target: Any) -> bool:
    """A post-grad call that only reinterprets memory (``aten.view``, ``permute``, a tuple's item)."""
    import operator

    if target is operator.getitem:
        return True
    return bool(getattr(target, "is_view", False))


def _map_in_child(payload: dict, emit: Callable[[float, str], None]) -> dict:
    """The child's work: load the source, resolve the device, compile and map."""
    from explorer.runtime import measure as m
    from explorer.sources import load_model

    emit(0.0, PROGRESS("loading", x=payload['source']))
    model = load_model(payload["source"], batch=payload.get("batch"), seq_len=payload.get("seq_len"))
    device = m.resolve_device(payload.get("device", "auto"))
    return map_loaded(model, device, payload.get("dtype", "fp32"), payload.get("mode", "default"), emit).to_dict()


# ------------------------------------------------------------------ the parent side: cache and child

def cache_dir() -> Path:
    """Where compile maps are kept: ``$FUSION_EXPLORER_CACHE/compile_map`` or ``~/.cache/fusion-explorer/compile_map``."""
    base = os.environ.get(CACHE_ENV) or os.path.join(os.path.expanduser("~"), ".cache", "fusion-explorer")
    return Path(base) / "compile_map"


def cache_key(fingerprint: str, batch: int | None, seq_len: int | None, device: str, dtype: str, mode: str,
              torch_version: str) -> str:
    """One file name per graph, input sizes, device, dtype, mode, torch version and this module's code
    (a changed mapping is never answered from an old entry)."""
    text = json.dumps([fingerprint, batch, seq_len, device, dtype, mode, torch_version, _code_version()])
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def _cache_path(fingerprint: str, batch: int | None, seq_len: int | None, device: str, dtype: str, mode: str,
                directory: Path | None, torch_version: str) -> Path:
    folder = directory or cache_dir()
    return folder / f"{cache_key(fingerprint, batch, seq_len, device, dtype, mode, torch_version or _installed_torch())}.json"


def cached_map(fingerprint: str, device: str = "auto", dtype: str = "fp32", mode: str = "default",
               batch: int | None = None, seq_len: int | None = None, directory: Path | None = None,
               torch_version: str = "") -> CompileMap | None:
    """The cached compile map for these settings, or None (nothing is compiled)."""
    path = _cache_path(fingerprint, batch, seq_len, device, dtype, mode, directory, torch_version)
    if not path.is_file():
        return None
    try:
        cached = CompileMap.from_dict(json.loads(path.read_text()), str(path))
    except (OSError, ValueError, RunError):
        return None  # a damaged entry is computed again
    return cached if cached.fingerprint == fingerprint else None


def compile_map(source: str, fingerprint: str, device: str = "auto", dtype: str = "fp32", mode: str = "default",
                batch: int | None = None, seq_len: int | None = None, timeout_s: float = DEFAULT_TIMEOUT_S,
                progress: Callable[[float, str], None] | None = None, cancel: threading.Event | None = None,
                directory: Path | None = None, torch_version: str = "") -> CompileMap:
    """The compile map of ``source`` (a zoo name or a path), from the cache or from a child process.

    ``fingerprint`` is the graph's (``graph.build.fingerprint``): with the sizes, device, dtype, mode
    and ``torch_version`` it names the cache entry. Raises ``RunError`` with one line on any failure
    (timeout, cancel, a crash, a model torch.compile cannot take whole).
    """
    from explorer.runtime.child import run_child

    if mode not in MODES:
        raise RunError(f"unknown torch.compile mode '{mode}': choose from {', '.join(MODES)}")
    path = _cache_path(fingerprint, batch, seq_len, device, dtype, mode, directory, torch_version)
    folder = path.parent
    cached = cached_map(fingerprint, device, dtype, mode, batch, seq_len, directory, torch_version)
    if cached is not None:
        return cached
    payload = {"source": str(source), "device": device, "dtype": dtype, "mode": mode, "batch": batch,
               "seq_len": seq_len}
    data = run_child("explorer.runtime.compile_map", payload, timeout_s, progress, cancel)
    result = CompileMap.from_dict(data, "the compile map")
    if result.fingerprint != fingerprint:
        raise RunError(f"the compiled graph of {source} is not the one loaded here "
                       f"(fingerprint {result.fingerprint}, expected {fingerprint})")
    try:
        folder.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(result.to_dict()))
        tmp.replace(path)
    except OSError:
        pass  # no cache, still an answer
    return result


def _code_version() -> str:
    try:
        return hashlib.sha256(Path(__file__).read_bytes()).hexdigest()[:12]
    except OSError:
        return "unknown"


def _installed_torch() -> str:
    from importlib import metadata

    try:
        return metadata.version("torch")
    except metadata.PackageNotFoundError:
        return "unknown"


def for_analysis(analysis: Any, source: str, device: str = "auto", dtype: str = "fp32", mode: str = "default",
                 timeout_s: float = DEFAULT_TIMEOUT_S, progress: Callable[[float, str], None] | None = None,
                 cancel: threading.Event | None = None, directory: Path | None = None
                 ) -> tuple["CompileMap", "Comparison"]:
    """``compile_map`` of an ``fusion_engine.Analysis`` loaded from ``source``, and its ``compare``."""
    model, graph, detection = analysis
    from explorer.graph.build import fingerprint

    if device == "auto":
        from explorer.runtime.measure import resolve_device

        device = resolve_device(device)

    cmap = compile_map(source, fingerprint(graph), device, dtype, mode, batch=model.batch, seq_len=model.seq_len,
                       timeout_s=timeout_s, progress=progress, cancel=cancel, directory=directory)
    return cmap, compare(detection.chains, graph, cmap)


def problems(cmap: CompileMap, graph: Any) -> list[str]:
    """What is wrong with ``cmap`` as a map of ``graph`` (empty when nothing is), checked against what
    inductor itself wrote: every kernel maps to at least one of our nodes, no node is owned by two
    kernels, there is one kernel per launch site of its output code and the generated ones are the
    kernels that code defines, and every op that works and reaches an output is owned, but for
    those inductor's record says it dropped (no-op ``to``) and constants (no inputs) it folds."""
    import networkx as nx

    out = []
    if not cmap.kernels:
        out.append("no kernels")
    if cmap.unmapped_kernels:
        out.append(f"kernels mapped to no node of ours: {', '.join(cmap.unmapped_kernels)}")
    for k in cmap.kernels:
        if not (k.nodes or k.touches):
            out.append(f"{k.key} maps to no node")
        strangers = (set(k.nodes) | set(k.touches)) - set(graph.nodes)
        if strangers:
            out.append(f"{k.key} names nodes the graph lacks: {', '.join(sorted(strangers))}")
    owned = Counter(n for k in cmap.kernels for n in k.nodes)
    twice = sorted(n for n, c in owned.items() if c > 1)
    if twice:
        out.append(f"nodes owned by two kernels: {', '.join(twice)}")
    if len(cmap.kernels) != cmap.launch_sites:
        out.append(f"{len(cmap.kernels)} kernels, but the output code has {cmap.launch_sites} launch sites")
    generated = {k.name for k in cmap.kernels if k.kind != "extern"}
    if generated != set(cmap.defined):
        out.append(f"generated kernels {sorted(generated ^ set(cmap.defined))} differ from the output code's")
    if cmap.generated_kernel_count < len(cmap.defined):
        out.append(f"inductor counted {cmap.generated_kernel_count} kernels, its code defines {len(cmap.defined)}")
    outputs = [n for n, a in graph.nodes(data=True) if a.get("kind") == "output"]
    live = set(outputs).union(*(nx.ancestors(graph, o) for o in outputs))
    owner = cmap.owner()
    lost = [n for n in compute_nodes(graph) if n not in owner and graph.in_degree(n) and n in live
            and not (n in cmap.removed and graph.nodes[n].get("kind") == "to")]
    if lost:
        out.append(f"ops no kernel computes: {', '.join(lost[:12])}")
    return out


# ------------------------------------------------------------------ our chains beside inductor's kernels

@dataclasses.dataclass(frozen=True)
class ChainVerdict:
    """One of our chains beside inductor: ``status`` both | partly | ours, and the kernels holding its ops."""

    chain_id: str
    pattern: str
    status: str
    kernels: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class InductorGroup:
    """A kernel that fuses two or more of our ops that no one chain of ours holds: a candidate pattern."""

    kernel: str
    label: str
    ops: tuple[str, ...]
    nodes: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class Comparison:
    """Our plan beside inductor's: per chain, the groups only inductor fuses, the ops it leaves alone."""

    chains: tuple[ChainVerdict, ...]
    only_inductor: tuple[InductorGroup, ...]
    separate: tuple[tuple[str, str, str], ...]  # (node, kind, kernel key) of single-op kernels
    no_kernel: tuple[str, ...]  # compute ops no kernel owns (folded away, or views inductor reinterprets)

    def status_of(self) -> dict[str, str]:
        return {c.chain_id: c.status for c in self.chains}

    def candidate_patterns(self) -> list[tuple[str, int]]:
        """``add → layer_norm``: the op sequences of the groups only inductor fuses, with how often."""
        counts = Counter(" → ".join(g.ops) for g in self.only_inductor)
        return sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))

    def to_dict(self) -> dict[str, Any]:
        return {"chains": [dataclasses.asdict(c) for c in self.chains],
                "only_inductor": [dataclasses.asdict(g) for g in self.only_inductor],
                "candidate_patterns": [{"ops": ops, "count": n} for ops, n in self.candidate_patterns()],
                "separate": [{"node": n, "kind": k, "kernel": key} for n, k, key in self.separate],
                "no_kernel": list(self.no_kernel)}


def compute_nodes(graph: Any) -> list[str]:
    """Our nodes that do work (not inputs, outputs or views), in graph order."""
    out = []
    for n, a in sorted(graph.nodes(data=True), key=lambda kv: kv[1]["order"]):
        if a.get("kind") in ("placeholder", "output") or not a.get("launches", 0):
            continue
        out.append(n)
    return out


def compare(chains: Iterable[Any], graph: Any, cmap: CompileMap) -> Comparison:
    """Our ``chains`` (``fusions.base.Chain``) beside ``cmap``'s kernels on ``graph`` (the networkx view)."""
    owner = cmap.owner()
    work = compute_nodes(graph)
    work_set = set(work)
    chain_of: dict[str, str] = {}
    verdicts = []
    for chain in chains:
        ops = [n for n in chain.nodes if n in work_set]
        for n in chain.nodes:
            chain_of[n] = chain.id
        keys = [owner[n].key for n in ops if n in owner]
        held = Counter(keys)
        if ops and len(held) == 1 and len(keys) == len(ops):
            status = "both"
        elif any(c >= 2 for c in held.values()):
            status = "partly"
        else:
            status = "ours"
        verdicts.append(ChainVerdict(chain.id, chain.pattern, status, tuple(dict.fromkeys(keys))))
    groups, separate = [], []
    for k in cmap.kernels:
        ops = [n for n in k.nodes if n in work_set]
        if len(ops) >= 2:
            chains_here = {chain_of.get(n) for n in ops}
            if len(chains_here) > 1 or None in chains_here:
                ordered = sorted(ops, key=lambda n: graph.nodes[n]["order"])
                groups.append(InductorGroup(k.key, k.label, tuple(graph.nodes[n]["kind"] for n in ordered),
                                            tuple(ordered)))
        elif len(ops) == 1:
            separate.append((ops[0], graph.nodes[ops[0]]["kind"], k.key))
    no_kernel = tuple(n for n in work if n not in owner)
    return Comparison(tuple(verdicts), tuple(groups), tuple(separate), no_kernel)


def covering_patterns(kinds: Iterable[str], patterns: Iterable[Any]) -> tuple[str, ...]:
    """The patterns (``fusions.base.Pattern``) whose steps accept every op kind of ``kinds``: the families that
    cover a kernel's op set in principle (all of its kinds are ones they fuse; the order and guards aside)."""
    wanted = set(kinds)
    out = []
    for p in patterns:
        accepted = set().union(*(step.kinds for step in p.steps)) if p.steps else set()
        if wanted and wanted <= accepted:
            out.append(p.name)
    return tuple(out)


@dataclasses.dataclass(frozen=True)
class Unclaimed:
    """A kernel of inductor's that fuses ops one of our families covers in principle (``patterns``), none of
    which any chain, alternative or near miss of ours holds: a fusion detection did not look at."""

    kernel: str
    ops: tuple[str, ...]
    nodes: tuple[str, ...]
    patterns: tuple[str, ...]

    @property
    def text(self) -> str:
        return " → ".join(self.ops)


def unclaimed(comparison: Comparison, detection: Any, patterns: Iterable[Any]) -> tuple[Unclaimed, ...]:
    """inductor's multi-op kernels (``comparison.only_inductor``) that ``detection`` (a ``Detection``) neither
    found nor reported: no node of theirs is in a chain, in an alternative's chain or in a near miss, and
    their op kinds are ones a pattern of ``patterns`` (the registry's) fuses (``covering_patterns``). A
    kernel whose kinds no family takes (an extern call with a copy beside it, a reduction we have no
    family for) is not listed: it is a candidate for a new family, not a miss of an existing one."""
    patterns = tuple(patterns)
    held = {n for c in detection.chains for n in c.nodes}
    held |= {n for alt in detection.alternatives for c in alt.chains for n in c.nodes}
    held |= {n for miss in detection.near_misses for n in miss.nodes}
    out = []
    for group in comparison.only_inductor:
        if set(group.nodes) & held:
            continue
        covering = covering_patterns(group.ops, patterns)
        if covering:
            out.append(Unclaimed(group.kernel, group.ops, group.nodes, covering))
    return tuple(out)


if __name__ == "__main__":
    if "--child" in sys.argv[1:]:
        from explorer.runtime.child import child_main

        sys.exit(child_main(_map_in_child))
    print("usage: python -m explorer.runtime.compile_map --child  (arguments as JSON on stdin); "
          "use fusion-explorer compare-compile", file=sys.stderr)
    sys.exit(2)
