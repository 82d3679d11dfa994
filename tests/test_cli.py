"""The command line: detect, models, plan, and one clear line for every kind of bad input."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import onnx
import pytest
import torch

from explorer.sources import zoo

ROOT = Path(__file__).resolve().parents[1]


def cli_process(*args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    """``python -m explorer.cli ARGS``: a fresh interpreter, the entry point itself."""
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    return subprocess.run([sys.executable, "-m", "explorer.cli", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT, env=env)


_server: list = []   # the module's CLI fork server (``forked_cli``)


@pytest.fixture(scope="module", autouse=True)
def forked_cli():
    """One ``hostile.CliForkServer`` for the module: it imports torch and the CLI once, then each ``cli`` call
    is a process forked from it that runs ``explorer.cli.main`` as ``python -m explorer.cli`` does (its own
    exit code, stdout, stderr, a traceback printed if one escaped). About 2 s less per call than a fresh
    interpreter (40 calls); ``cli_process`` keeps the entry point itself tested here, and
    ``test_security``'s ``test_the_command_itself_is_limited_and_one_line`` under a memory limit."""
    from hostile import CliForkServer

    server = CliForkServer(ROOT)
    _server.append(server)
    yield server
    _server.remove(server)
    server.close()


#: No memory limit worth the name on a forked CLI call (the limits are ``test_security``'s subject).
UNLIMITED = 1 << 40


def cli(*args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    """``fusion-explorer ARGS`` in a process forked from the module's server (``forked_cli``)."""
    result = _server[-1].run(list(args), {"PYTHONWARNINGS": "ignore"}, UNLIMITED, timeout)
    if result["timed_out"]:
        raise subprocess.TimeoutExpired(["fusion-explorer", *args], timeout, result["stdout"], result["stderr"])
    return subprocess.CompletedProcess(["fusion-explorer", *args], result["code"], result["stdout"], result["stderr"])


def assert_one_line_error(proc: subprocess.CompletedProcess, *needles: str) -> None:
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr and "Traceback" not in proc.stdout
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("fusion-explorer:")]
    assert len(lines) == 1, proc.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]


def test_models_lists_the_zoo():
    proc = cli_process("models", "--json")
    assert proc.returncode == 0
    names = {m["name"] for m in json.loads(proc.stdout)}
    assert names == set(zoo.ZOO)


def test_detect_json_fields():
    proc = cli("detect", "residual_block", "--json", "--batch", "2")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert {"model", "nodes", "chains", "counts", "near_misses"} <= set(out)
    assert out["model"] == "residual_block" and out["counts"]["conv_bn_add_act"] == 1
    chain = out["chains"][0]
    assert {"id", "pattern", "ops", "nodes", "names", "bytes_saved", "launches_saved"} <= set(chain)
    assert chain["bytes_saved"] == 2 * 2 * 2 * 16 * 32 * 32 * 4  # batch 2: two fp32 intermediates


def test_detect_table():
    proc = cli("detect", "transformer_block", "--seq-len", "16")
    assert proc.returncode == 0, proc.stderr
    assert "MatMul+Softmax" in proc.stdout and "Add+LayerNorm 2" in proc.stdout


def test_plan_accept_and_reject(tmp_path):
    proc = cli("plan", "residual_block", "--accept", "all", "--reject", "conv_bn_act@conv2d")
    assert proc.returncode == 0, proc.stderr
    plan = json.loads(proc.stdout)
    assert plan["accepted"] == ["conv_bn_add_act@conv2d_1"]
    assert_one_line_error(cli("plan", "residual_block", "--accept", "bogus"), "unknown pattern")
    assert_one_line_error(cli("plan", "residual_block", "--reject", "nope@x"), "unknown chain")
    proc = cli("plan", "residual_block", "--kernel", "conv_bn_act@conv2d=separate_epilogue")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["kernels"] == {"conv_bn_act@conv2d": "separate_epilogue"}
    assert_one_line_error(cli("plan", "residual_block", "--kernel", "conv_bn_act@conv2d=triton"), "not a choice")
    assert_one_line_error(cli("plan", "residual_block", "--kernel", "conv_bn_act@conv2d"), "CHAIN_ID=CHOICE")


def test_plan_separate_epilogue_for_chains_slower_on_the_gpu():
    report = Path(__file__).resolve().parent.parent / "benchmarks" / "results" / \
        "report_resnet50_fp16_channels_last_h200.json"
    proc = cli("plan", "resnet50", "--separate-gpu-slower", str(report))
    assert proc.returncode == 0, proc.stderr
    kernels = json.loads(proc.stdout)["kernels"]
    assert len(kernels) == 8 and set(kernels.values()) == {"separate_epilogue"}
    assert all(k.startswith("conv_bn_act@") for k in kernels)   # conv_bn@conv2d_4 has no epilogue to separate
    assert_one_line_error(cli("plan", "resnet50", "--separate-gpu-slower", "/no/such/report.json"),
                          "cannot read report")


def test_unknown_zoo_name():
    assert_one_line_error(cli("detect", "resnet51"), "unknown model 'resnet51'")


def test_bad_numbers():
    proc = cli_process("detect", "resnet50", "--batch", "0")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr


@pytest.fixture(scope="module")
def onnx_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("onnx") / "block.onnx"
    entry = zoo.get_entry("residual_block")
    torch.onnx.export(entry.build(), entry.example_inputs(), str(path), dynamo=False)
    return path


def test_truncated_onnx(onnx_file, tmp_path):
    bad = tmp_path / "truncated.onnx"
    bad.write_bytes(onnx_file.read_bytes()[: onnx_file.stat().st_size // 2])
    assert_one_line_error(cli("detect", str(bad)), "truncated.onnx")


def test_random_bytes_named_onnx(tmp_path):
    bad = tmp_path / "random.onnx"
    bad.write_bytes(os.urandom(4096))
    assert_one_line_error(cli("detect", str(bad)), "random.onnx")


def test_onnx_external_data_escaping_its_folder_is_refused(onnx_file, tmp_path):
    model = onnx.load(str(onnx_file))
    folder = tmp_path / "models"
    folder.mkdir()
    onnx.save_model(model, str(folder / "m.onnx"), save_as_external_data=True, all_tensors_to_one_file=True,
                    location="m.onnx.data", size_threshold=0)
    ok = cli("detect", str(folder / "m.onnx"), "--json")
    assert ok.returncode == 0, ok.stderr
    evil = onnx.load(str(folder / "m.onnx"), load_external_data=False)
    for init in evil.graph.initializer:
        for entry in init.external_data:
            if entry.key == "location":
                entry.value = "../secret.bin"
    (tmp_path / "secret.bin").write_bytes((folder / "m.onnx.data").read_bytes())
    onnx.save_model(evil, str(folder / "evil.onnx"))
    assert_one_line_error(cli("detect", str(folder / "evil.onnx")), "escapes its folder")


def test_pickle_is_refused(tmp_path):
    path = tmp_path / "model.pt"
    torch.save(zoo.get_entry("conv_bn_relu").build(), str(path))
    assert_one_line_error(cli("detect", str(path)), "pickle")
    renamed = tmp_path / "model.pt2"
    renamed.write_bytes(path.read_bytes())
    assert_one_line_error(cli("detect", str(renamed)))


def test_onnx_detects_folded_resnet_block(onnx_file):
    proc = cli("detect", str(onnx_file), "--json")
    assert proc.returncode == 0, proc.stderr
    counts = json.loads(proc.stdout)["counts"]
    assert counts["conv_act"] == 1 and counts["conv_add_act"] == 1


def test_shape_that_does_not_fit_memory():
    assert_one_line_error(cli("detect", "resnet50", "--batch", "100000000"), "do not fit in memory")


def test_plan_then_run_on_cpu(tmp_path):
    plan = tmp_path / "plan.json"
    proc = cli("plan", "conv_bn_relu", "--accept", "all")
    assert proc.returncode == 0, proc.stderr
    plan.write_text(proc.stdout)
    report = tmp_path / "report.json"
    proc = cli("run", "conv_bn_relu", "--plan", str(plan), "--device", "cpu", "--no-chains", "--no-stages",
               "--out", str(report))
    assert proc.returncode == 0, proc.stderr
    data = json.loads(report.read_text())
    assert {"unfused", "fused", "chains", "stages", "plan", "environment"} <= set(data)
    assert data["environment"]["is_cpu"] is True
    assert data["fused"]["precision"]["rel_l2"] < 1e-4
    other = tmp_path / "other.json"
    other.write_text(cli("plan", "residual_block").stdout)
    assert_one_line_error(cli("run", "conv_bn_relu", "--plan", str(other), "--device", "cpu"),
                          "made for model 'residual_block'")
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    assert_one_line_error(cli("run", "conv_bn_relu", "--plan", str(broken)), "not valid JSON")


def test_plan_rejects_the_chains_a_report_measured_slower(tmp_path):
    """--reject-slower reads the typed report's one verdict field; a report of another model is refused
    in one line."""
    import dataclasses

    from explorer.fusion_engine import analyze
    from report_samples import sample_report

    _, _, det = analyze("residual_block")
    base = sample_report()
    conv, res = det.chains[0].id, det.chains[1].id
    report = dataclasses.replace(
        base, model=dataclasses.replace(base.model, name="residual_block", fingerprint=det.fingerprint),
        chains=(dataclasses.replace(base.chains[1], id=conv),      # verdict: slower
                dataclasses.replace(base.chains[0], id=res)))      # verdict: faster
    path = tmp_path / "report.json"
    path.write_text(report.to_json())
    proc = cli("plan", "residual_block", "--reject-slower", str(path))
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["accepted"] == [res]
    other = Path(__file__).resolve().parent.parent / "benchmarks" / "results" / \
        "report_resnet50_fp16_channels_last_h200.json"
    assert_one_line_error(cli("plan", "residual_block", "--reject-slower", str(other)), "measured on model 'resnet50'")
    path.write_text("[]")
    assert_one_line_error(cli("plan", "residual_block", "--reject-slower", str(path)), "not a run report")


def test_help_shows_examples_and_no_raw_markup():
    """``--help`` (the top level and each command's) reads as plain text: no ``backticks`` of docstrings, and
    examples that name real commands; the plan's help says which report a CPU machine uses."""
    import argparse

    from explorer import cli as cli_module

    parser = cli_module.build_parser()
    helps = {"": parser.format_help()}
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    helps.update({name: p.format_help() for name, p in sub.choices.items()})
    helps["app"] = cli_module.build_app_parser().format_help()
    assert not [name for name, text in helps.items() if "`" in text], [n for n, x in helps.items() if "`" in x]
    for name in ("", "models", "detect", "plan", "run", "sweep", "compare-compile"):
        assert "examples:\n  fusion-explorer " + (name or "models") in helps[name], name
    assert cli_module.H200_REPORT in helps["plan"] and (ROOT / cli_module.H200_REPORT).is_file()
    for lines in cli_module.EXAMPLES.values():     # every example parses
        for line, _ in lines:
            parser.parse_args(line.split()[1:])


def test_plan_out_is_written_only_on_success(tmp_path):
    """``plan --out FILE`` writes the plan once it is made; a failed plan leaves no file (``> FILE`` would leave
    an empty one)."""
    out = tmp_path / "plan.json"
    assert_one_line_error(cli("plan", "residual_block", "--reject-slower", str(tmp_path / "missing.json"),
                              "--out", str(out)), "cannot read report")
    assert not out.exists() and not list(tmp_path.iterdir())
    proc = cli("plan", "residual_block", "--out", str(out))
    assert proc.returncode == 0 and proc.stdout == "", proc.stderr
    assert json.loads(out.read_text())["model"] == "residual_block" and [p.name for p in tmp_path.iterdir()] == [
        "plan.json"]
    assert_one_line_error(cli("plan", "residual_block", "--out", str(tmp_path / "no" / "p.json")), "does not exist")


def test_the_apps_menu_is_the_zoo_the_cli_lists():
    assert [e.name for e in zoo.menu()] == list(zoo.ZOO) and "bert_large" in zoo.ZOO
