"""Issue 9 in the app: a hostile upload or path is one ``st.error``, and the user loses nothing.

Every case loads a zoo model (residual_block), rejects one of its chains on the Fusions page, then
feeds one hostile input where a user would: the ONNX uploader (an ``.onnx`` or a ``.zip``), the
``.pt2`` uploader, the Hugging Face folder box, the plan uploader (Fusions page) or the report
uploader (Results page). Then the page must show exactly one ``st.error`` element (no traceback,
text from the file escaped), the zoo model must still be the active one with its chain still
rejected, and no payload may have touched its marker file. The inputs are built by the tests
(``tests/hostile.py``); ``docs/security.md`` maps them to their defences.

Issue 19 adds two flows: names from files (an ONNX's node names, an upload's file name, a plan's
file name, a report's and a teaching report's strings) render as text on every page they reach,
and a renamed upload or a report with out-of-range fields is one line.

The app runs through ``streamlit.testing.v1.AppTest`` (the real script, pages and state; the
engine and the isolated loader are real too). Also here: the upload temporaries are removed when
the model changes and when the session's state is released, and the pages work for a model with no
fusible chain.
"""

from __future__ import annotations

import dataclasses
import gc
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Callable

import pytest

import hostile as H

ROOT = Path(__file__).resolve().parents[1]
APP = str(ROOT / "explorer" / "app.py")
ZOO_MODEL = "residual_block"
UPLOADERS = {"onnx": ("ONNX upload", "onnx_file"), "zip": ("ONNX upload", "onnx_file"),
             "pt2": (".pt2 upload", "pt2_file")}
# Markdown that would draw a link or fetch an image if an error showed it unescaped.
LINK = "[click](javascript:alert(1))"
IMAGE = "![x](http://example.invalid/x.png)"


@dataclasses.dataclass(frozen=True)
class AppCase:
    """One hostile input for the app: ``make(folder, marker, bases, detection)`` returns what ``feed``
    takes: (file name, bytes) for the uploaders, a folder for "hf"."""

    id: str
    feed: str  # onnx | zip | pt2 | hf | plan | report
    make: Callable
    needle: str = ""  # a word the error must contain


def _onnx_bytes(model) -> bytes:
    return model.SerializeToString()


def _pt2_bytes(name: str, folder: Path, marker: Path, bases: H.Bases) -> bytes:
    argv, _ = H.case(name).build(folder, marker, bases)
    return Path(argv[1]).read_bytes()


def _external_escape(folder: Path) -> bytes:
    return H.external_model(folder, "/etc/passwd").read_bytes()


def _injected_op_name() -> bytes:
    """An ONNX whose unsupported op type is markdown: the error quotes it."""
    from onnx import helper

    node = helper.make_node(IMAGE, ["x"], ["y"])
    return _onnx_bytes(H.onnx_model([node], [H.fin("x", [1, 4])], [H.fin("y", [1, 4])]))


def _plan(detection, **changes) -> bytes:
    plan = {"version": 1, "model": detection.model, "fingerprint": detection.fingerprint,
            "accepted": [c.id for c in detection.chains], "kernels": {}, "memory_format": "nchw",
            "cuda_graphs": False}
    plan.update(changes)
    return json.dumps(plan).encode()


def _report(**changes) -> bytes:
    report = {"version": 1, "model": {"name": ZOO_MODEL}, "plan": {"cuda_graphs": False},
              "unfused": {"latency_ms": {"median": 1.0, "p20": 0.9, "p80": 1.1}},
              "fused": {"latency_ms": {"median": 0.8, "p20": 0.7, "p80": 0.9}},
              "chains": [{"id": "conv_bn_act@conv2d", "slower": False}]}
    report.update(changes)
    return json.dumps(report).encode()


def _hf_named(bases: H.Bases, folder: Path) -> Path:
    """A Hugging Face folder named like a markdown link, declaring a million layers."""
    return H.set_config(H.copy_folder(bases.hf, folder / LINK), num_hidden_layers=1_000_000)


CASES = [
    # ONNX uploads
    AppCase("onnx-input-120GB", "onnx", lambda f, m, b, d: (
        "in120.onnx", _onnx_bytes(H.relu_model([30, 1024, 1024, 1024]))), "memory budget"),
    AppCase("onnx-Tile-bomb", "onnx", lambda f, m, b, d: ("tile.onnx", _onnx_bytes(H.shape_bomb("Tile"))),
            "memory budget"),
    AppCase("onnx-external-absolute", "onnx", lambda f, m, b, d: ("ext.onnx", _external_escape(f)),
            "escapes its folder"),
    AppCase("onnx-markdown-op-name", "onnx", lambda f, m, b, d: ("md.onnx", _injected_op_name()), "unsupported"),
    AppCase("onnx-random-bytes", "onnx", lambda f, m, b, d: ("r.onnx", os.urandom(2048)), "not a valid ONNX"),
    # .pt2 uploads (the payloads write the marker)
    AppCase("pt2-pickled-weight", "pt2", lambda f, m, b, d: ("w.pt2", _pt2_bytes("pt2-pickled-weight", f, m, b)),
            "pickle"),
    AppCase("pt2-sample-inputs-torch-save", "pt2", lambda f, m, b, d: (
        "t.pt2", _pt2_bytes("pt2-sample-inputs-torch-save", f, m, b)), "unpickler"),
    AppCase("pt2-sympify-expr", "pt2", lambda f, m, b, d: ("e.pt2", _pt2_bytes("pt2-sympify-expr", f, m, b)),
            "symbolic size"),
    AppCase("pt2-plain-pickle", "pt2", lambda f, m, b, d: ("model.pt2", H.payload(m)), "pickle"),
    # .zip uploads
    AppCase("zip-bomb", "zip", lambda f, m, b, d: ("bomb.zip", H.zeros_zip(
        "model.onnx.data", 64 * 2**20, (("model.onnx", _onnx_bytes(H.relu_model([1, 4]))),))), "zip bomb"),
    AppCase("zip-dotdot", "zip", lambda f, m, b, d: ("dd.zip", H.zip_bytes({
        "../evil.onnx": _onnx_bytes(H.relu_model([1, 4]))})), "outside the archive"),
    AppCase("zip-symlink", "zip", lambda f, m, b, d: ("ln.zip", H.symlink_zip(
        "model.onnx.data", "/etc/passwd", (("model.onnx", _onnx_bytes(H.relu_model([1, 4]))),))), "link"),
    AppCase("zip-many-members", "zip", lambda f, m, b, d: ("many.zip", H.zip_bytes(
        {f"d{i}.bin": b"" for i in range(1001)} | {"model.onnx": b""}, 0)), "members"),
    AppCase("zip-pt2-payload", "zip", lambda f, m, b, d: ("p.zip", H.zip_bytes({
        "m/model.pt2": _pt2_bytes("pt2-pickled-weight", f, m, b)})), "pickle"),
    # Hugging Face folder paths
    AppCase("hf-pickled-weights", "hf", lambda f, m, b, d: H.hf_pickled(b.hf, f, m), "refused"),
    AppCase("hf-index-dotdot-shard", "hf", lambda f, m, b, d: H.shard_index(
        H.copy_folder(b.hf, f / "dd"), "../outside.safetensors"), "outside its folder"),
    AppCase("hf-weights-symlink-out", "hf", lambda f, m, b, d: H.hf_symlink_out(b.hf, f), "escapes its folder"),
    AppCase("hf-markdown-name-million-layers", "hf", lambda f, m, b, d: _hf_named(b, f), "layers"),
    # plans (Fusions page)
    AppCase("plan-deep", "plan", lambda f, m, b, d: ("deep.json", H.deep_json().encode()), "nested"),
    AppCase("plan-cuda-graphs-string", "plan", lambda f, m, b, d: ("p.json", _plan(d, cuda_graphs="false")),
            "cuda_graphs"),
    AppCase("plan-accepts-markdown-chain", "plan", lambda f, m, b, d: ("p.json", _plan(d, accepted=[IMAGE])),
            "does not have"),
    AppCase("plan-huge", "plan", lambda f, m, b, d: ("h.json", b" " * (6 * 2**20)), "5 MB"),
    # reports (Results page)
    AppCase("report-deep", "report", lambda f, m, b, d: ("deep.json", H.deep_json().encode())),
    AppCase("report-chains-not-objects", "report", lambda f, m, b, d: ("r.json", _report(chains=[1, 2]))),
    AppCase("report-slower-string", "report", lambda f, m, b, d: ("r.json", _report(
        chains=[{"id": IMAGE, "slower": "false"}]))),
    AppCase("report-not-utf8", "report", lambda f, m, b, d: ("r.json", b"\xff\xfe{\x00")),
]


@pytest.fixture(scope="module")
def bases(tmp_path_factory) -> H.Bases:
    return H.Bases(tmp_path_factory.mktemp("bases"))


def _detection():
    from explorer.fusion_engine import analyze

    return analyze(ZOO_MODEL)[2]


def _accepted(at, detection) -> set[str]:
    return set(at.session_state["accepted"][detection.fingerprint])


def _loaded_with_a_rejected_chain():
    """The app with the zoo model loaded and its first chain rejected on the Fusions page:
    (AppTest, detection, the rejected chain id)."""
    from streamlit.testing.v1 import AppTest

    detection = _detection()
    at = AppTest.from_file(APP, default_timeout=180)
    at.session_state["zoo_name"] = ZOO_MODEL
    at.switch_page("ui/pages/fusions.py").run()
    assert not at.exception and at.session_state["active"].source == ZOO_MODEL
    rejected = detection.chains[0].id
    assert at.selectbox(key="chain_pick").value == rejected  # the one-chain panel opens on the first
    at.button(key="chain_reject").click().run()
    assert _accepted(at, detection) == {c.id for c in detection.chains} - {rejected}
    assert not at.error
    return at, detection, rejected


def feed(at, how: str, value) -> None:
    """Hand ``value`` to the app where a user would: an uploader, the Hugging Face box, the plan or
    report uploader."""
    if how in UPLOADERS:
        kind, key = UPLOADERS[how]
        at.radio(key="model_kind").set_value(kind).run()
        name, data = value
        at.file_uploader(key=key).set_value((name, data, "application/octet-stream")).run()
    elif how == "hf":
        at.radio(key="model_kind").set_value("Hugging Face folder").run()
        at.text_input(key="hf_path").set_value(str(value)).run()
    elif how == "plan":
        name, data = value
        at.file_uploader(key="plan_file").set_value((name, data, "application/json")).run()
    elif how == "report":
        at.switch_page("ui/pages/results.py").run()
        name, data = value
        at.file_uploader(key="report_file").set_value((name, data, "application/json")).run()
    else:
        raise ValueError(how)


def _unescaped_markdown(text: str) -> bool:
    """Whether ``text`` holds a markdown link or image that Streamlit would render (unescaped ``](``)."""
    return "](" in text.replace("\\]\\(", "")


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_hostile_input_is_one_error_and_keeps_model_and_choices(case, bases, tmp_path):
    at, detection, rejected = _loaded_with_a_rejected_chain()
    before = _accepted(at, detection)
    marker = tmp_path / "MARKER"
    feed(at, case.feed, case.make(tmp_path, marker, bases, detection))
    assert not marker.exists(), f"{case.id}: PAYLOAD RAN"
    for attempt in range(2):  # as shown, and after one more rerun (the error is not lost or repeated)
        assert not at.exception, at.exception
        errors = [e.value for e in at.error]
        assert len(errors) == 1, f"{case.id}: {len(errors)} st.error elements: {errors}"
        assert case.needle in errors[0], errors[0]
        assert "Traceback" not in errors[0] and "\n" not in errors[0].strip(), errors[0]
        assert not _unescaped_markdown(errors[0]), errors[0]
        assert at.session_state["active"].source == ZOO_MODEL
        assert _accepted(at, detection) == before and rejected not in before
        at.run()


def test_app_corpus_covers_every_entry():
    assert {c.feed for c in CASES} == {"onnx", "zip", "pt2", "hf", "plan", "report"}
    assert len({c.id for c in CASES}) == len(CASES) >= 20


# ------------------------------------------------------------------ upload temporaries

def _relu_upload(at) -> Path:
    """Upload a one-Relu ONNX (a model with no fusible chain) and return its folder on disk."""
    feed(at, "onnx", ("relu.onnx", _onnx_bytes(H.relu_model([1, 4]))))
    assert not at.exception and not at.error, [e.value for e in at.error]
    spec = at.session_state["active"]
    assert spec.kind == "onnx"
    folder = Path(spec.source).parent
    assert folder.is_dir() and folder.name.startswith("fusion-explorer-upload-")
    return folder


def test_upload_folder_is_removed_when_the_model_changes_and_no_chain_pages_work():
    """An uploaded model's folder lives while it is the active model and goes when another model is
    chosen; a hostile upload's folder goes when the next upload arrives. The model has no fusible
    chain: the Fusions page says so instead of raising."""
    at, _, _ = _loaded_with_a_rejected_chain()
    folder = _relu_upload(at)
    at.switch_page("ui/pages/fusions.py").run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    assert any("No fusible chain" in i.value for i in at.info)
    at.radio(key="model_kind").set_value("Zoo").run()
    at.selectbox(key="zoo_name").set_value("conv_bn_relu").run()
    assert at.session_state["active"].source == "conv_bn_relu"
    assert not folder.exists(), "the upload folder outlived its model"

    feed(at, "onnx", ("bad.onnx", b"not onnx"))
    assert len(at.error) == 1
    failed = Path(at.session_state["failed_spec"].source).parent
    assert failed.is_dir()
    good = _relu_upload(at)  # a new upload: the failed one's folder goes
    assert not failed.exists() and good.is_dir()


def test_upload_folders_are_removed_when_the_session_state_is_released():
    """Streamlit drops a session's state when the session ends (closed, or evicted from its reconnect
    storage); ``UploadFolders``' finalizer then removes every folder. AppTest cannot end a session, so
    its state is released here as the runtime does: the last reference to it goes."""
    at, _, _ = _loaded_with_a_rejected_chain()
    folder = _relu_upload(at)
    del at
    gc.collect()
    assert not folder.exists(), "the upload folder outlived its session"


def test_upload_folders_are_removed_when_the_process_exits(tmp_path):
    """The finalizer also runs at interpreter exit (a server stopped with sessions open)."""
    code = ("from explorer.ui import files\n"
            "folders = files.UploadFolders()\n"
            "folders['upload'] = files.store_upload('m.onnx', b'x')\n"
            "print(folders['upload'])\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    path = Path(proc.stdout.strip())
    assert path.name == "m.onnx" and path.parent.name.startswith("fusion-explorer-upload-")
    assert not path.parent.exists(), "the upload folder outlived the process"


# ------------------------------------------------------------------ issue 19: text from files is text

def _texts(at) -> list[str]:
    """Every string the app hands to an element that renders markdown: text elements, alerts,
    headings, expander labels and radio options (Streamlit renders markdown in those too)."""
    out = []
    for kind in ("markdown", "caption", "success", "error", "warning", "info", "subheader", "header", "title"):
        # the app's own HTML (the graph legend: registry labels, html-escaped) is not file text
        out += [e.value for e in getattr(at, kind) if not getattr(e.proto, "allow_html", False)]
    out += [e.label for e in at.expander]
    for radio in at.radio:
        out += list(radio.options)
    return [str(t) for t in out]


def _assert_text_is_text(at, *payloads: str) -> None:
    """No element holds markup from a file (``test_security_text.hazards``: no link, image, tag or
    autolink), and each payload is shown as written (escapes and code spans resolved)."""
    from test_security_text import hazards, shown

    assert not at.exception, at.exception
    texts = _texts(at)
    bad = {t: hazards(t) for t in texts if hazards(t)}
    assert not bad, bad
    seen = " | ".join(shown(t) for t in texts)
    for payload in payloads:
        assert " ".join(payload.split()) in seen, (payload, seen[:2000])


HOSTILE_FILE = "![x](http://evil.invalid/x.png) `a` www.evil.invalid.onnx"
HOSTILE_PLAN = "[a](http://evil.invalid) `x` <img src=http://evil.invalid/p.png>.json"
HOSTILE_NOTE = "see http://evil.invalid/report and [a](http://evil.invalid) `tick`"


def test_names_from_files_render_as_text_on_every_page():
    """Issue 19: an uploaded ONNX whose node names and file name are markdown (backticks, an image,
    a link, a tag, bare URLs) shows them as written in the sidebar ("Loaded: ..."), on the Fusions
    page (the chain's origin in its code span; "restored ... from {plan file name}") and on the Results
    page (a report's model name and notes, a teaching report's command, device and error); nothing
    is drawn from them."""
    from streamlit.testing.v1 import AppTest
    from report_samples import sample_report
    from test_security_text import hostile_onnx

    at = AppTest.from_file(APP, default_timeout=180)
    at.session_state["model_kind"] = "ONNX upload"  # no zoo model first: the upload is the only load
    at.switch_page("ui/pages/fusions.py").run()
    feed(at, "onnx", (HOSTILE_FILE, hostile_onnx()))
    assert not at.error, [e.value for e in at.error]
    assert at.session_state["active"].label == HOSTILE_FILE
    _assert_text_is_text(at, f"Loaded: {HOSTILE_FILE}")

    at.switch_page("ui/pages/fusions.py").run()
    assert not at.error, [e.value for e in at.error]
    _assert_text_is_text(at, "</script><img src=x onerror=alert(1)> `x` ![x](http://evil.invalid/x.png)",
                         "<a href=http://evil.invalid>x</a> [a](http://evil.invalid) www.evil.invalid a@evil.invalid")
    detection = at.session_state["active"]
    from explorer.ui import state as ui_state

    det = ui_state.load_analysis(detection.source, detection.batch, detection.seq_len).detection
    plan = {"version": 1, "model": det.model, "fingerprint": det.fingerprint, "accepted": [det.chains[0].id],
            "kernels": {}, "memory_format": "nchw", "cuda_graphs": False}
    feed(at, "plan", (HOSTILE_PLAN, json.dumps(plan).encode()))
    assert not at.error and at.success, [e.value for e in at.error]
    _assert_text_is_text(at, f"from {HOSTILE_PLAN}")

    report = dataclasses.replace(sample_report(), notes=(HOSTILE_NOTE,), precision_note=HOSTILE_NOTE)
    report = dataclasses.replace(report, model=dataclasses.replace(report.model, name=HOSTILE_FILE))
    feed(at, "report", (HOSTILE_PLAN, report.to_json().encode()))
    assert not at.error, [e.value for e in at.error]
    _assert_text_is_text(at, HOSTILE_NOTE, HOSTILE_FILE)

    teaching = json.loads((ROOT / "benchmarks" / "results" / "teaching_report_h200.json").read_text())
    teaching["command"] = HOSTILE_NOTE
    teaching["environment"]["device_name"] = HOSTILE_FILE
    teaching["models"][1] = {"name": HOSTILE_FILE, "error": HOSTILE_NOTE}
    at.file_uploader(key="report_file").set_value(("t.json", json.dumps(teaching).encode(), "application/json")).run()
    assert at.session_state["results_teaching"] is not None
    _assert_text_is_text(at, HOSTILE_NOTE, HOSTILE_FILE)


def _renamed_and_broken_reports() -> list[tuple[str, bytes, str]]:
    from test_security_text import CRASHERS, _crasher

    picked = [c for c in CRASHERS if c[0] in ("v2-400-digit-float", "v1-int-abc", "v1-int-inf", "v1-reference-list",
                                              "v1-string-vs-number")]
    teaching = json.loads((ROOT / "benchmarks" / "results" / "teaching_report_h200.json").read_text())
    teaching["models"][0]["breakdown"]["unfused"]["wall_ms"] = 10 ** 400
    return ([(f"{name}.json", _crasher(kind, path, value).encode(), "report") for name, kind, path, value in picked]
            + [("teach-400-digits.json", json.dumps(teaching).encode(), "teaching report")])


def test_renamed_uploads_and_broken_reports_are_one_line():
    """Issue 19: an ONNX renamed .pt (either uploader) and a .pt2 renamed .onnx are one line saying
    what the content is, not Streamlit's extension exception; a report or teaching report with a
    400-digit number, int('abc'), int(inf), a list for an object or a string for a number is one
    line on the Results page; the zoo model stays loaded throughout."""
    from streamlit.testing.v1 import AppTest

    at = AppTest.from_file(APP, default_timeout=180)
    at.session_state["zoo_name"] = ZOO_MODEL
    at.run()
    onnx = _onnx_bytes(H.relu_model([1, 4]))
    for how, name, data, needle in (("onnx", "model.pt", onnx, "content is an ONNX model"),
                                    ("pt2", "model.pt", onnx, "content is an ONNX model"),
                                    ("onnx", "model.onnx", H.zip_bytes({"a": b"x"}), "zip archive")):
        feed(at, how, (name, data))
        assert not at.exception, at.exception
        errors = [e.value for e in at.error]
        assert len(errors) == 1 and needle in errors[0] and "\n" not in errors[0], errors
        assert at.session_state["active"].source == ZOO_MODEL
    at.radio(key="model_kind").set_value("Zoo").run()
    for name, data, what in _renamed_and_broken_reports():
        feed(at, "report", (name, data))
        assert not at.exception, at.exception
        errors = [e.value for e in at.error]
        assert len(errors) == 1 and "\n" not in errors[0] and what in errors[0], (name, errors)
