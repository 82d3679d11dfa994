"""Issues 19 and 20: the ``.pt2`` reader derives what it is told, bounds what it parses, and accepts what
``torch.export.save`` really writes.

- Derived, not trusted: ``aten.full([35000, 35000])`` recorded as ``[4, 4]`` is refused for the lie, and
  honestly recorded for the memory budget; a sample input far larger than the recorded graph expects
  (deflated into a small archive) is counted at its derived size.
- Parsers run in the isolated child: a ``.pt2`` whose ``models/model.json`` is ``[{"":{}},...]``, an
  ONNX file of empty ``NodeProto``s and a safetensors header with a huge ``__metadata__`` list are
  refused in one line while the caller's peak resident size (``VmHWM``, reset through
  ``/proc/self/clear_refs``) grows by less than ``CALLER_GROWTH``: before, each was parsed in the
  caller, at about 40 bytes per byte of text.
- Symbolic sizes: a power tower ``s77**9**9**9`` is refused by the grammar at once, ``Symbol('s77',
  positive=True, integer=True)`` (what this torch writes for a dynamic batch) is read.
- ``FUSION_EXPLORER_LOAD_TIMEOUT`` that is not a finite positive number is one line, exit 2.
- No false refusal: torchvision's RegNet-Y 1.6GF (module paths such as ``block1-0``) and a
  dynamic-batch export load through the ``.pt2`` source (``sources.load_pt2``; the isolated probe
  in front of it is ``test_security_ops``'s and ``test_security``'s) and detect the chains their
  programs show; an autocast region (``wrap_with_autocast``) is refused by name.
"""

from __future__ import annotations

import json
import os
import re
import struct
import time
import zipfile
from pathlib import Path

import pytest
import torch

from explorer.errors import ModelLoadError
from explorer.sources import limits, pt2

SMALL_BUDGET = "64M"
CALLER_GROWTH = 24 * 2**20


def _edit(src: Path, dst: Path, member_suffix: str, change) -> Path:
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w", zipfile.ZIP_DEFLATED) as zout:
        for info in zin.infolist():
            data = zin.read(info)
            if info.filename.endswith(member_suffix):
                data = change(data)
            zout.writestr(info.filename, data, compress_type=zipfile.ZIP_DEFLATED)
    return dst


def _edit_json(src: Path, dst: Path, change) -> Path:
    def apply(data: bytes) -> bytes:
        program = json.loads(data)
        change(program)
        return json.dumps(program).encode()

    return _edit(src, dst, "models/model.json", apply)


def _save(module: torch.nn.Module, inputs: tuple, path: Path, dynamic_shapes=None) -> Path:
    with torch.no_grad():
        torch.export.save(torch.export.export(module.eval(), inputs, dynamic_shapes=dynamic_shapes), path)
    return path


class _AddsFull(torch.nn.Module):
    def __init__(self, n: int) -> None:
        super().__init__()
        self.n = n

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.full([self.n, self.n], 1.0)


class _Relu(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x)


class _ConvBnRelu(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1, bias=False)
        self.bn = torch.nn.BatchNorm2d(8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.bn(self.conv(x)))


class _Quadruples(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([x, x, x, x])


def _dynamic_relu(path: Path, module: torch.nn.Module | None = None) -> Path:
    batch = torch.export.Dim("batch", min=1, max=1 << 20)
    return _save(module or _Relu(), (torch.randn(3, 8),), path, dynamic_shapes=({0: batch},))


# ------------------------------------------------------------------ derived, not trusted

def test_a_full_recorded_smaller_than_it_is_refused_for_the_lie(tmp_path):
    base = _save(_AddsFull(4), (torch.randn(4, 4),), tmp_path / "base.pt2")

    def lie(program: dict) -> None:
        node = next(n for n in program["graph_module"]["graph"]["nodes"] if n["target"].endswith("aten.full.default"))
        node["inputs"][0]["arg"] = {"as_ints": [35000, 35000]}  # the recorded value stays [4, 4]

    path = _edit_json(base, tmp_path / "lie.pt2", lie)
    with pytest.raises(ModelLoadError, match=r"recorded metadata disagrees.*\[35000, 35000\] is computed"):
        pt2.load_graph(path)


def test_a_full_over_the_budget_is_refused_from_derived_sizes(tmp_path):
    path = _save(_AddsFull(35000), (torch.randn(1),), tmp_path / "big.pt2")  # traced on fake tensors
    with pytest.raises(ModelLoadError, match=r"derived.*memory budget"):
        pt2.load_graph(path)


def test_sample_inputs_are_counted_at_their_derived_size(tmp_path, monkeypatch):
    monkeypatch.setenv(limits.MEMORY_BUDGET_ENV, SMALL_BUDGET)
    base = _dynamic_relu(tmp_path / "base.pt2", _Quadruples())
    big = torch.zeros(20 * 2**20 // 32, 8)  # 20 MiB of zeros (deflated to a few KB), 100 MiB with the output

    def swap(_: bytes) -> bytes:
        import io

        buffer = io.BytesIO()
        torch.save(((big,), {}), buffer)
        return buffer.getvalue()

    path = _edit(base, tmp_path / "inputs.pt2", "sample_inputs/model.pt", swap)
    assert path.stat().st_size < 2**20
    with pytest.raises(ModelLoadError, match=r"derived.*memory budget"):
        pt2.load_graph(path)


# ------------------------------------------------------------------ parsers in the child, bombs at small sizes

def _hwm() -> int:
    return int(re.search(r"VmHWM:\s+(\d+)", Path("/proc/self/status").read_text()).group(1)) * 1024


def _caller_growth(call) -> tuple[int, str]:
    """(growth of this process's peak resident size, the one-line refusal) while ``call`` runs."""
    try:
        Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current resident size
    except OSError:
        pytest.skip("this kernel cannot reset the peak resident size")
    before = _hwm()
    with pytest.raises(ModelLoadError) as info:
        call()
    return _hwm() - before, str(info.value)


def _json_bomb_pt2(folder: Path, nbytes: int) -> Path:
    base = _save(_Relu(), (torch.randn(2, 2),), folder / "base.pt2")
    return _edit(base, folder / "bomb.pt2", "models/model.json",
                 lambda _: b"[" + b'{"":{}},' * (nbytes // 8) + b'{"":{}}]')


def _empty_nodes_onnx(path: Path, count: int) -> Path:
    graph = b"\x0a\x00" * count  # GraphProto.node (field 1), each an empty NodeProto
    model = b"\x08\x08" + b"\x3a" + _varint(len(graph)) + graph  # ir_version 8, ModelProto.graph (field 7)
    path.write_bytes(model)
    return path


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        out.append((n & 0x7F) | (0x80 if n > 0x7F else 0))
        n >>= 7
        if not n:
            return bytes(out)


def _metadata_bomb_folder(folder: Path, nbytes: int) -> Path:
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "bert", "num_hidden_layers": 1, "hidden_size": 8,
                                                    "num_attention_heads": 2, "intermediate_size": 8,
                                                    "vocab_size": 10}))
    header = b'{"__metadata__":[' + b'{"":{}},' * (nbytes // 8) + b'{}]}'
    (folder / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header)
    return folder


@pytest.mark.parametrize("kind", ["pt2-json", "onnx-nodes", "safetensors-metadata"])
def test_parse_bombs_cost_the_child_not_the_caller(tmp_path, monkeypatch, kind):
    from explorer.sources import check_source

    monkeypatch.setenv(limits.MEMORY_BUDGET_ENV, SMALL_BUDGET)
    if kind == "pt2-json":
        source = _json_bomb_pt2(tmp_path, 8 * 2**20)  # 8 MiB of text, ~350 MB parsed, ~20 KB deflated
        assert source.stat().st_size < 2**20
    elif kind == "onnx-nodes":
        source = _empty_nodes_onnx(tmp_path / "nodes.onnx", 3 * 2**20)  # 6 MB, ~300 MB parsed
    else:
        source = _metadata_bomb_folder(tmp_path / "hf", 8 * 2**20)
    growth, line = _caller_growth(lambda: check_source(str(source)))
    assert "\n" not in line and line
    assert growth < CALLER_GROWTH, f"the caller grew by {growth / 2**20:.0f} MiB: {line}"


# ------------------------------------------------------------------ symbolic sizes, timeouts

@pytest.mark.parametrize("expr", ["s77**9**9**9", "Pow(Pow(Integer(9), Integer(8)), Integer(8))",
                                  "Symbol('s77', positive=True, integer=True)**99",
                                  "Symbol('__import__', positive=True)", "Integer(1" + "0" * 40 + ")",
                                  "s0.__class__", "LShift(s0, 99999999999)"])
def test_symbolic_sizes_outside_the_grammar_are_refused_at_once(tmp_path, expr):
    base = _dynamic_relu(tmp_path / "base.pt2")
    text = "Symbol('s77', positive=True, integer=True)"

    def swap(data: bytes) -> bytes:
        assert text.encode() in data
        return data.replace(json.dumps(text).encode(), json.dumps(expr).encode())

    path = _edit(base, tmp_path / "expr.pt2", "models/model.json", swap)
    start = time.monotonic()
    with pytest.raises(ModelLoadError, match="symbolic size") as info:
        pt2.read_archive(path, payloads=False)
    assert time.monotonic() - start < 5 and "\n" not in str(info.value)


def test_the_grammar_reads_what_torch_writes():
    for expr in ("Symbol('s77', positive=True, integer=True)", "Mul(Integer(8), Symbol('s77', positive=True, "
                 "integer=True))", "s0*2 + FloorDiv(s1, 4) - 1", "Max(1, s0**2)", "Mul(s0, Pow(Integer(2), -1))"):
        pt2.check_expr(expr, "x.pt2")


@pytest.mark.parametrize("value", ["nan", "inf", "-1", "0", "soon"])
def test_an_unusable_load_timeout_is_one_line(tmp_path, monkeypatch, capfd, value):
    from explorer import cli

    path = _save(_Relu(), (torch.randn(2, 2),), tmp_path / "m.pt2")
    monkeypatch.setenv(limits.LOAD_TIMEOUT_ENV, value)
    try:
        code = cli.main(["detect", str(path)])
    except SystemExit as exc:
        code = exc.code
    err = [line for line in capfd.readouterr().err.splitlines() if line.strip()]
    assert code == 2 and len(err) == 1 and limits.LOAD_TIMEOUT_ENV in err[0], err


# ------------------------------------------------------------------ no false refusals (issue 20)

def _counts(detection) -> dict:
    return {k: v for k, v in detection.counts.items() if v}


def _load_and_detect(path: Path):
    """The ``.pt2`` source itself (``sources.load_pt2``, what ``load_model`` runs after the isolated
    probe), then the graph and its chains."""
    from explorer.fusion_engine import build_graph, detect
    from explorer.sources import load_pt2

    model = load_pt2(path)
    return model, detect(build_graph(model.gm, model.name))


def test_regnet_y_1_6gf_saved_by_torch_export_loads_and_detects(tmp_path):
    import torchvision

    from explorer.fusion_engine import build_graph, detect
    from explorer.sources import _unlift

    torch.manual_seed(0)
    module = torchvision.models.regnet_y_1_6gf(weights=None).eval()
    with torch.no_grad():
        program = torch.export.export(module, (torch.randn(1, 3, 64, 64),))
    path = tmp_path / "regnet_y_1_6gf.pt2"
    torch.export.save(program, path)
    model, detection = _load_and_detect(path)
    assert any("block1-0" in str(n.target) for n in model.gm.graph.nodes if n.op == "get_attr")
    direct = detect(build_graph(_unlift(program), "regnet"))  # the same program, never saved
    assert _counts(detection) == _counts(direct) and detection.chains


def test_a_dynamic_batch_export_loads_and_detects(tmp_path):
    torch.manual_seed(0)
    batch = torch.export.Dim("batch", min=1, max=64)
    path = _save(_ConvBnRelu(), (torch.randn(3, 3, 16, 16),), tmp_path / "dynamic.pt2",
                 dynamic_shapes=({0: batch},))
    assert b"Symbol('s" in zipfile.ZipFile(path).read(next(
        n for n in zipfile.ZipFile(path).namelist() if n.endswith("models/model.json")))
    model, detection = _load_and_detect(path)
    assert model.example_inputs[0].shape[0] == 3
    assert len(detection.chains) == 1 and sum(detection.counts.values()) == 1


def test_an_autocast_region_is_refused_by_name(tmp_path):
    class Autocast(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = torch.nn.Linear(8, 8)

        def forward(self, x):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                y = self.linear(x)
            return y.float().relu()

    path = _save(Autocast(), (torch.randn(2, 8),), tmp_path / "autocast.pt2")
    text = zipfile.ZipFile(path).read(next(n for n in zipfile.ZipFile(path).namelist() if n.endswith("model.json")))
    if b"wrap_with_autocast" not in text:
        pytest.skip("this torch exports autocast without a higher-order operator")
    with pytest.raises(ModelLoadError, match=r"higher-order operator torch\.ops\.higher_order\.wrap_with_autocast"):
        pt2.read_archive(path, payloads=False)


def test_the_measurement_child_limits_its_address_space_for_a_file_on_the_cpu(tmp_path):
    import subprocess
    import sys

    path = _save(_Relu(), (torch.randn(2, 2),), tmp_path / "m.pt2")
    script = ("import json, resource, sys; from explorer.runtime.child import limit_host_memory\n"
              "for source in sys.argv[1:]:\n"
              "    got = limit_host_memory({'source': source, 'settings': {'device': 'cpu'}})\n"
              "    print(json.dumps([got, resource.getrlimit(resource.RLIMIT_AS)[0]]))\n")
    env = {**os.environ, limits.MEMORY_BUDGET_ENV: SMALL_BUDGET, "PYTHONPATH": str(Path(__file__).parents[1])}
    out = subprocess.run([sys.executable, "-c", script, "resnet50", str(path)], env=env, capture_output=True,
                         text=True, timeout=120, check=True).stdout.splitlines()
    zoo_limit, file_limit = json.loads(out[0]), json.loads(out[1])
    assert zoo_limit[0] == 0  # a zoo model is the code's own
    assert file_limit[0] > 0 and file_limit[1] == file_limit[0]
