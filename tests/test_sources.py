"""Model sources: torch.export archives, Hugging Face folders, and the refusal of unsafe files."""

from __future__ import annotations

import io
import json
import pickle
import zipfile
from pathlib import Path

import pytest
import torch
from hostile import tiny_bert

from explorer.sources import zoo
from explorer.errors import ModelLoadError
from explorer.fusion_engine import detect
from explorer.graph.build import build_graph
from explorer.sources import load_model


def _save_pt2(path: Path, name: str = "residual_block") -> Path:
    entry = zoo.get_entry(name)
    program = torch.export.export(entry.build(), entry.example_inputs(batch=2))
    torch.export.save(program, str(path))
    return path


class _Boom:
    """Unpickling this writes a marker file: proof that code ran."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.write_text, (Path(self.marker), "pwned"))


def _rewrite_member(src: Path, dst: Path, match: str, new: bytes, config_edit=None) -> None:
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w") as zout:
        for item in zin.infolist():
            data = zin.read(item.filename)
            if match in item.filename:
                data = new
            if config_edit and item.filename.endswith("model_weights_config.json"):
                data = config_edit(data)
            zout.writestr(item, data)


def test_pt2_loads_and_detects(tmp_path):
    model = load_model(str(_save_pt2(tmp_path / "block.pt2")))
    assert model.source == "pt2" and model.example_inputs[0].shape[0] == 2
    det = detect(build_graph(model.gm, model.name))
    assert det.counts["conv_bn_act"] == 1 and det.counts["conv_bn_add_act"] == 1


class _ScalarConstants(torch.nn.Module):
    """A 0-d integer buffer and a 0-d float buffer: what a decode step's write position looks like."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("position", torch.tensor(15, dtype=torch.int64))
        self.register_buffer("scale", torch.tensor(0.5))

    def forward(self, x):
        return x * self.scale + self.position


def test_pt2_zero_dim_constants_keep_their_values(tmp_path):
    """Our own archive reader must read a 0-d tensor's one element, not make it zero."""
    module = _ScalarConstants().eval()
    x = torch.randn(2, 3, generator=torch.Generator().manual_seed(0))
    path = tmp_path / "scalars.pt2"
    torch.export.save(torch.export.export(module, (x,)), str(path))
    model = load_model(str(path))
    with torch.no_grad():
        assert torch.equal(model.gm(*model.example_inputs), module(*model.example_inputs))


def test_pt2_with_pickled_weight_is_refused_without_running_it(tmp_path):
    good = _save_pt2(tmp_path / "good.pt2")
    marker = tmp_path / "marker"
    payload = pickle.dumps(_Boom(str(marker)))

    def use_pickle(data: bytes) -> bytes:
        config = json.loads(data)
        first = next(iter(config["config"].values()))
        first["use_pickle"] = True
        return json.dumps(config).encode()

    bad = tmp_path / "bad.pt2"
    _rewrite_member(good, bad, "data/weights/weight_0", payload, use_pickle)
    with pytest.raises(ModelLoadError, match="pickle"):
        load_model(str(bad))
    assert not marker.exists()


def test_pt2_with_malicious_sample_inputs_is_refused(tmp_path):
    good = _save_pt2(tmp_path / "good.pt2")
    marker = tmp_path / "marker"
    bad = tmp_path / "bad.pt2"
    buffer = io.BytesIO()
    pickle.dump((_Boom(str(marker)),), buffer)
    _rewrite_member(good, bad, "sample_inputs/model.pt", buffer.getvalue())
    with pytest.raises(ModelLoadError, match="unsafe unpickler"):
        load_model(str(bad))
    assert not marker.exists()


def test_plain_pickles_are_refused(tmp_path):
    marker = tmp_path / "marker"
    for name in ("model.pt", "model.pth", "disguised.pt2"):
        path = tmp_path / name
        path.write_bytes(pickle.dumps(_Boom(str(marker))))
        with pytest.raises(ModelLoadError) as err:
            load_model(str(path))
        assert "pickle" in str(err.value) and "\n" not in str(err.value)
    assert not marker.exists()


def test_unknown_file_kinds(tmp_path):
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(ModelLoadError, match="unknown model format"):
        load_model(str(tmp_path / "notes.txt"))
    with pytest.raises(ModelLoadError, match="no such file"):
        load_model(str(tmp_path / "missing.onnx"))
    with pytest.raises(ModelLoadError, match="not a torch.export archive"):
        (tmp_path / "junk.pt2").write_bytes(b"PK\x03\x04garbage")
        load_model(str(tmp_path / "junk.pt2"))


def _tiny_bert_folder(path: Path) -> Path:
    """Two layers (five Add+LayerNorm chains, two attention ones), at most 64 tokens."""
    return tiny_bert(path, layers=2, hidden=64, heads=4, vocab=500, positions=64)


def test_hugging_face_folder_loads_offline(tmp_path):
    folder = _tiny_bert_folder(tmp_path / "tiny-bert")
    model = load_model(str(folder), batch=2, seq_len=16)
    assert model.source == "hf" and model.example_inputs[0].shape == (2, 16)
    det = detect(build_graph(model.gm, model.name))
    assert det.counts["add_layer_norm"] == 5 and det.counts["matmul_softmax"] == 2
    with torch.no_grad():
        direct = model.module(*model.example_inputs)
        captured = model.gm(*model.example_inputs)
    torch.testing.assert_close(captured, direct, rtol=1e-5, atol=1e-5)


def test_hugging_face_folder_with_pickled_weights_is_refused(tmp_path):
    folder = _tiny_bert_folder(tmp_path / "pickled")
    for w in folder.glob("*.safetensors"):
        w.unlink()
    (folder / "pytorch_model.bin").write_bytes(b"\x80\x04not really")
    with pytest.raises(ModelLoadError, match="refused"):
        load_model(str(folder))
    with pytest.raises(ModelLoadError, match="exceeds"):
        load_model(str(_tiny_bert_folder(tmp_path / "ok")), seq_len=1000)
