"""Issue 19: a graph from a file runs only operators on the explorer's allowlist (``sources.pure_ops``).

- ``test_from_file_write_is_refused_before_anything_runs``: the attack of the issue, a ``.pt2`` whose
  graph maps a file with ``aten.from_file(path, shared=True)`` and fills it. The explorer before the
  allowlist loaded it (its check accepted every ``torch.ops.aten`` target) and running the graph wrote
  the file; the test runs the loaded graph when a load succeeds, so on that code it fails by finding
  the file written.
- ``test_every_side_effect_operator_of_this_torch_is_refused``: every operator of this torch's registry
  whose schema writes an argument (``Tensor(a!)``), takes a ``Storage`` or a ``str`` (a file name),
  or is tagged ``nondeterministic_seeded``/``inplace_view``, and every operator outside ``aten``
  (``prim``, ``profiler``, ...), is refused by ``pure_ops.refusal`` when its arguments are the
  graph's inputs.
- ``test_zoo_operators_are_allowed`` / ``test_torchvision_operators_are_allowed``: what real
  exports produce is on the list (no false refusal): every zoo model's captured graph, and
  torchvision models' training IR and unlifted module (and, for MobileNetV3, its core-ATen
  decomposition).
"""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch
import torch.fx

from explorer.errors import ModelLoadError
from explorer.sources import pt2, pure_ops, zoo


class _FillsZeros(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = torch.zeros(16, dtype=torch.uint8)
        t.fill_(65)
        return x + t.sum()


def _edit_program(src: Path, dst: Path, edit) -> Path:
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w") as zout:
        for info in zin.infolist():
            data = zin.read(info)
            if info.filename.endswith("models/model.json"):
                program = json.loads(data)
                edit(program)
                data = json.dumps(program).encode()
            zout.writestr(info, data)
    return dst


def from_file_archive(folder: Path, target: Path) -> Path:
    """A ``.pt2`` whose graph is ``from_file(target, shared=True, size=16).fill_(65)``: written as an attacker
    would, by editing the program JSON of a saved ``zeros(16).fill_(65)`` (export cannot trace from_file)."""
    base = folder / "base.pt2"
    torch.export.save(torch.export.export(_FillsZeros(), (torch.randn(2),)), base)

    def edit(program: dict) -> None:
        node = program["graph_module"]["graph"]["nodes"][0]
        assert node["target"] == "torch.ops.aten.zeros.default"
        node["target"] = "torch.ops.aten.from_file.default"
        node["inputs"] = [
            {"name": "filename", "arg": {"as_string": str(target)}, "kind": 1},
            {"name": "shared", "arg": {"as_bool": True}, "kind": 1},
            {"name": "size", "arg": {"as_int": 16}, "kind": 1},
            {"name": "dtype", "arg": {"as_scalar_type": 1}, "kind": 2},
        ]

    return _edit_program(base, folder / "from_file.pt2", edit)


def test_from_file_write_is_refused_before_anything_runs(tmp_path):
    from explorer.sources import load_model

    target = tmp_path / "written_by_the_archive.pth"
    path = from_file_archive(tmp_path, target)
    refused = None
    try:
        model = load_model(str(path))
    except ModelLoadError as exc:
        refused = str(exc)
    else:  # the old reader: running the graph, as `fusion-explorer run` does, writes the file
        with torch.no_grad():
            model.gm(*model.example_inputs)
    assert not target.exists(), "the archive created and wrote a file"
    assert refused is not None and "aten.from_file.default" in refused and "\n" not in refused
    with pytest.raises(ModelLoadError, match="from_file"):
        pt2.read_archive(path, payloads=False)  # refused from the JSON alone, before deserialising


def _op(qualified: str, overload: str):
    namespace, name = qualified.split("::", 1)
    packet = getattr(getattr(torch.ops, namespace), name)
    return getattr(packet, overload or "default")


def _side_effect(op) -> str | None:
    schema = op._schema
    if any(a.alias_info is not None and a.alias_info.is_write for a in schema.arguments):
        return "writes an argument"
    for arg in schema.arguments:
        kind = str(arg.type).rstrip("?")
        if kind == "Storage" or (kind == "str" and arg.name in ("filename", "path", "file", "f")):
            return "takes a storage or a file name"
    tags = set(op.tags)
    if torch.Tag.nondeterministic_seeded in tags or torch.Tag.inplace_view in tags:
        return "draws random numbers or changes a view in place"
    if op.namespace != "aten":
        return f"is in the '{op.namespace}' namespace"
    return None


def _graph_of(op) -> torch.fx.Node:
    """One node calling ``op`` with every argument a placeholder of the graph (the user's inputs)."""
    graph = torch.fx.Graph()
    args = tuple(graph.placeholder(f"a{i}") for i, _ in enumerate(op._schema.arguments))
    return graph.call_function(op, args)


def test_every_side_effect_operator_of_this_torch_is_refused():
    checked: dict[str, str] = {}
    for full in torch._C._dispatch_get_all_op_names():
        qualified, _, overload = full.partition(".")
        try:
            op = _op(qualified, overload)
        except (AttributeError, RuntimeError):
            continue
        why = _side_effect(op)
        key = pure_ops.key_of(op)
        if why is None or key in pure_ops.LIBRARY_OPS:   # a known library's own operator: its test is below
            continue
        assert pure_ops.refusal(_graph_of(op)) is not None, f"{key} ({why}) is not refused"
        checked[key] = why
    # the set is this torch's, not a hand-picked few: the attack's operators are in it
    assert len(checked) > 1000
    for key in ("aten.from_file.default", "aten.set_.source_Storage", "aten.resize_.default",
                "aten.copy_.default", "aten.fill_.Scalar", "aten.bernoulli_.float", "aten.normal.Tensor_float",
                "aten.dropout.default", "aten.uniform_.default"):
        assert key in checked, key
    for key in ("aten._local_scalar_dense.default", "aten.empty.memory_format", "aten.empty_strided.default",
                "aten.new_empty.default", "aten.set_.source_Storage_storage_offset", "prims.empty_strided.default"):
        namespace, name, overload = key.split(".")
        node = _graph_of(getattr(getattr(getattr(torch.ops, namespace), name), overload))
        assert pure_ops.refusal(node), key
    # and the refusal names the operator, in one line
    why = pure_ops.refusal(_graph_of(torch.ops.aten.from_file.default))
    assert "aten.from_file.default" in why and "\n" not in why


def test_the_list_is_this_torch_and_in_place_writes_only_reach_owned_values():
    for key in pure_ops.PURE_ATEN:
        namespace, name, overload = key.split(".")
        op = getattr(getattr(getattr(torch.ops, namespace), name), overload)  # every entry exists here
        if torch.Tag.nondeterministic_seeded in op.tags:
            assert key in pure_ops.GUARDS, f"{key} draws random numbers and has no argument guard"
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    fresh = graph.call_function(torch.ops.aten.relu.default, (x,))
    view = graph.call_function(torch.ops.aten.view.default, (fresh, [-1]))
    ok = graph.call_function(torch.ops.aten.add_.Tensor, (view, x))
    input_view = graph.call_function(torch.ops.aten.view.default, (x, [-1]))
    bad = graph.call_function(torch.ops.aten.relu_.default, (input_view,))
    weight = graph.get_attr("weight")
    bad_weight = graph.call_function(torch.ops.aten.mul_.Tensor, (weight, 2.0))
    memo: dict = {}
    assert pure_ops.refusal(ok, memo) is None
    assert "into an input" in pure_ops.refusal(bad, memo)
    assert "weight or constant" in pure_ops.refusal(bad_weight, memo)
    dropout = graph.call_function(torch.ops.aten.dropout.default, (fresh, 0.1, False))
    train = graph.call_function(torch.ops.aten.dropout.default, (fresh, 0.1, True))
    assert pure_ops.refusal(dropout) is None and "train=False" in pure_ops.refusal(train)


def _zoo_ids():
    return [pytest.param(name, marks=[pytest.mark.slow, pytest.mark.duplicate])  # BERT-base's at 24 layers
            if name == "bert_large" else name for name in zoo.ZOO]


@pytest.mark.parametrize("name", _zoo_ids())
def test_zoo_operators_are_allowed(analyze_cached, name):
    if zoo.ZOO[name].large:  # GBs of weights (3.6 GB resident to capture): the same check in a child process
        code = ("import sys; sys.path[:0] = ['.', 'tests']; from explorer.sources import load_model; "
                f"from test_security_ops import check_zoo_ops; check_zoo_ops(load_model({name!r}).gm, {name!r})")
        proc = subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).parents[1], capture_output=True,
                              text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr[-3000:]
        return
    # the keys other tests use (test_engine), so that a full run captures each model once
    seq = 32 if zoo.ZOO[name].inputs.seq_len else None
    model = analyze_cached("bert_large", 1, 32)[0] if name == "bert_large" else analyze_cached(name, None, seq)[0]
    check_zoo_ops(model.gm, name)


def check_zoo_ops(gm: torch.fx.GraphModule, name: str) -> None:
    calls = [n for n in gm.graph.nodes if n.op == "call_function"]
    assert calls and not [pure_ops.key_of(n.target) for n in calls
                          if pure_ops.key_of(n.target) not in pure_ops.PURE_ATEN | set(pure_ops.PURE_PYTHON)]
    if name == "llama_decode_step":  # it writes the new key/value into the cache it is given: from a file,
        with pytest.raises(ModelLoadError, match=r"index_copy_.* into an input"):  # that is a side effect
            pure_ops.check_graph_ops(gm, name)
    else:
        pure_ops.check_graph_ops(gm, name)


@pytest.mark.parametrize("name,decompose", [("mobilenet_v3_small", True), ("shufflenet_v2_x0_5", False),
                                            ("swin_t", False)])
def test_torchvision_operators_are_allowed(name, decompose):
    # the training IR and its unlifted module (what torch.export.save writes and the reader runs), and for
    # one model the core-ATen decomposition too (decomposing is the slow part)
    import torchvision

    from explorer.sources import _unlift

    torch.manual_seed(0)
    module = getattr(torchvision.models, name)(weights=None).eval()
    with torch.no_grad():
        program = torch.export.export(module, (torch.randn(1, 3, 64, 64),))
    graphs = [program.graph_module, _unlift(program)]
    if decompose:
        graphs.append(program.run_decompositions().graph_module)
    for gm in graphs:
        pure_ops.check_graph_ops(gm, name)


# ---------------------------------------------------------------------- a known library's custom operator (issue 20)

class _Experts(torch.nn.Module):
    """A Mixtral-style MoE's experts as transformers 5 calls them: tokens sorted by expert, one grouped matmul
    (``torch.ops.transformers.grouped_mm_fallback``, registered by ``transformers.integrations.moe``), the
    inverse permutation built with ``empty_like`` and ``index_put_``."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(2, 6, 5, generator=torch.Generator().manual_seed(0)))

    def forward(self, x, perm, offs):
        inv = torch.empty_like(perm)
        inv[perm] = torch.arange(perm.numel())
        out = torch.ops.transformers.grouped_mm_fallback(x[perm], self.w, offs)
        return out[inv]


def _experts_archive(folder: Path) -> tuple[Path, tuple]:
    pytest.importorskip("transformers.integrations.moe")
    gen = torch.Generator().manual_seed(1)
    inputs = (torch.randn(7, 6, generator=gen), torch.randperm(7, generator=gen), torch.tensor([3, 7]))
    path = folder / "experts.pt2"
    torch.export.save(torch.export.export(_Experts(), inputs), path)
    return path, inputs


def test_a_known_librarys_custom_operator_runs_its_registered_implementation(tmp_path):
    path, inputs = _experts_archive(tmp_path)
    gm, _ = pt2.load_graph(path)
    targets = {pure_ops.key_of(n.target) for n in gm.graph.nodes if n.op == "call_function"}
    assert "transformers.grouped_mm_fallback.default" in targets
    assert "aten.empty_like.default" not in targets and "aten.zeros_like.default" in targets   # zeroed at load
    want = _Experts()(*inputs)
    torch.testing.assert_close(gm(*inputs), want)
    # the operator is the library's: an operator of that namespace the library does not register is refused
    assert "not on the explorer's list" in pure_ops.json_target_refusal("torch.ops.transformers.grouped_mm_fallback_backward.default")


def test_a_custom_operator_whose_library_is_missing_is_refused_with_its_name(tmp_path, monkeypatch):
    path, _ = _experts_archive(tmp_path)
    monkeypatch.setattr(pure_ops, "LIBRARY_OPS", {"transformers.grouped_mm_fallback.default": "no_such_library.moe"})
    monkeypatch.setattr(pure_ops, "_LIBRARY_CACHE", {})
    with pytest.raises(ModelLoadError) as why:
        pt2.load_graph(path)
    text = str(why.value)
    assert "transformers.grouped_mm_fallback.default" in text and "no_such_library" in text and "\n" not in text


# ---------------------------------------------------------------------- a decoder with its default KV cache (issue 20)

def _llama_archive(folder: Path, use_cache: bool) -> tuple[Path, torch.nn.Module, tuple]:
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.LlamaConfig(hidden_size=64, intermediate_size=96, num_attention_heads=4,
                                      num_key_value_heads=2, num_hidden_layers=1, vocab_size=128)
    config._attn_implementation = "eager"
    model = transformers.LlamaModel(config).eval()

    class Hidden(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, ids):
            return self.model(input_ids=ids, use_cache=use_cache).last_hidden_state

    inputs = (torch.randint(0, 128, (1, 7), generator=torch.Generator().manual_seed(0)),)
    path = folder / f"llama_cache_{use_cache}.pt2"
    with torch.no_grad():
        torch.export.save(torch.export.export(Hidden().eval(), inputs), path)
    return path, Hidden().eval(), inputs


def test_a_decoder_exported_with_its_kv_cache_loads_and_detach_writes_only_owned_values(tmp_path):
    """transformers' ``DynamicCache.update`` writes ``aten.detach_`` on the fresh copy of its empty cache: the
    archive loads, computes what eager does, and its chains are those of the same decoder exported without
    a cache. ``detach_`` on an input or a weight stays refused (the side-effect rule of every write)."""
    from explorer.fusion_engine import detect
    from explorer.graph.build import build_graph

    path, eager, inputs = _llama_archive(tmp_path, use_cache=True)
    gm, _ = pt2.load_graph(path)
    assert any(pure_ops.key_of(n.target) == "aten.detach_.default" for n in gm.graph.nodes if n.op == "call_function")
    with torch.no_grad():
        torch.testing.assert_close(gm(*inputs), eager(*inputs), rtol=1e-5, atol=1e-5)
    plain, _ = pt2.load_graph(_llama_archive(tmp_path, use_cache=False)[0])
    assert detect(build_graph(gm, "cache")).counts == detect(build_graph(plain, "no cache")).counts
    graph = torch.fx.Graph()
    x, weight = graph.placeholder("x"), graph.get_attr("weight")
    assert "into an input" in pure_ops.refusal(graph.call_function(torch.ops.aten.detach_.default, (x,)))
    assert "weight or constant" in pure_ops.refusal(graph.call_function(torch.ops.aten.detach_.default, (weight,)))
