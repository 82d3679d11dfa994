"""Issue 9: untrusted files never run code, never read outside their folder, never exhaust the machine.

The hostile corpus (``tests/hostile.py`` builds every file) runs through the real command line,
``python -m explorer.cli``, each case in its own process under an address-space limit of its
size after imports plus the 2 GiB memory budget (``RLIMIT_AS``) and a time limit; every case must
end with exit status 2 and exactly one stderr line, within ``CASE_SECONDS``, with a peak resident
size (``ru_maxrss`` of the process tree, from ``wait4``) under ``BUDGET`` above the interpreter's
own, and no payload may touch its marker file. The cases run two at a time.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

import hostile as H

ROOT = Path(__file__).resolve().parents[1]
BUDGET = 2 * 2**30
CASE_SECONDS = 90


def _baseline() -> tuple[int, int]:
    """(VmSize, max RSS) in bytes of a Python that imported what the CLI imports for a model."""
    code = ("import resource, torch, onnx, transformers, explorer.sources, explorer.cli\n"
            "vm = [l for l in open('/proc/self/status') if l.startswith('VmSize')][0].split()[1]\n"
            "print(int(vm) * 1024, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    vm, rss = out.stdout.split()
    return int(vm), int(rss)


def measured_cli(argv: list[str], limit_as: int, timeout: float = CASE_SECONDS) -> dict:
    """Run the CLI under ``RLIMIT_AS = limit_as`` through a wrapper that ``wait4``s it; returns its exit
    code, stdout, stderr, seconds and the peak resident size of its process tree."""
    wrapper = ("import os, resource, subprocess, sys, json, time\n"
               "limit = int(sys.argv[1]); t = time.monotonic()\n"
               "p = subprocess.Popen([sys.executable, '-m', 'explorer.cli', *sys.argv[2:]],"
               " preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_AS, (limit, limit)))\n"
               "_, status, usage = os.wait4(p.pid, 0)\n"
               "code = os.waitstatus_to_exitcode(status)\n"
               "print(json.dumps({'code': code, 'peak': usage.ru_maxrss * 1024, 'seconds': time.monotonic() - t}),"
               " file=open(os.environ['CASE_RESULT'], 'w'))\n")
    result_file = Path(os.environ.get("TMPDIR", "/tmp")) / f"case-{os.getpid()}-{time.monotonic_ns()}.json"
    env = dict(os.environ, PYTHONWARNINGS="ignore", CASE_RESULT=str(result_file))
    proc = subprocess.run([sys.executable, "-c", wrapper, str(limit_as), *argv], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout + 30)
    try:
        result = json.loads(result_file.read_text())
        result_file.unlink()
    except (OSError, ValueError):
        result = {"code": None, "peak": 0, "seconds": timeout}
    result.update(stdout=proc.stdout, stderr=proc.stderr)
    return result


# ------------------------------------------------------------------ the corpus

def _pt2_with(edit, extra=()):
    def build(folder: Path, marker: Path, base: Path):
        return H.rewrite_zip(base, folder / "evil.pt2", edit(marker), list(extra))
    return build


def corpus(base_pt2: Path, base_hf: Path) -> list[H.Case]:
    """Every class of issue 9, plus the ones the loaders already refused."""
    cases: list[H.Case] = []

    def case(id_, kind, bomb=False):
        def register(fn):
            cases.append(H.Case(id_, kind, fn, bomb))
            return fn
        return register

    def pt2(name: str, edit, extra=()):
        def build(folder, marker):
            extras = [(n, d(marker) if callable(d) else d) for n, d in extra]
            path = H.rewrite_zip(base_pt2, folder / name, edit(marker), extras)
            return ["detect", str(path)], ""
        return build

    top = H.pt2_members(base_pt2)[0].split("/")[0]
    # -- code execution from .pt2
    cases.append(H.Case("pt2-pickled-weight", "code", pt2("w.pt2", lambda m: _chain(
        _replace("data/weights/weight_0", H.payload(m)),
        H.edit_json("model_weights_config.json", lambda c: next(iter(c["config"].values())).update(use_pickle=True))))))
    cases.append(H.Case("pt2-sample-inputs-pickle", "code",
                        pt2("s.pt2", lambda m: _replace("sample_inputs/model.pt", H.payload(m)))))
    cases.append(H.Case("pt2-sample-inputs-torch-save", "code",
                        pt2("t.pt2", lambda m: _replace("sample_inputs/model.pt", H.torch_payload(m)))))
    cases.append(H.Case("pt2-uppercase-member-payload", "code", pt2("u.pt2", lambda m: _rename(
        "data/sample_inputs/model.pt", "data/sample_inputs/MODEL.pt", H.torch_payload(m)))))
    cases.append(H.Case("pt2-case-duplicate", "code", pt2("d.pt2", lambda m: _keep(),
                                                          [(f"{top}/MODELS/model.json", lambda m: H.payload(m))])))
    cases.append(H.Case("pt2-legacy-layout", "code", pt2("l.pt2", lambda m: _keep(), [
        (f"{top}/serialized_state_dict.pt", lambda m: H.payload(m)), (f"{top}/version", b"8.5")])))
    cases.append(H.Case("pt2-only-models-json", "code", lambda f, m: (["detect", str(_only_models_json(base_pt2, f))], "")))
    cases.append(H.Case("pt2-custom-obj", "code", pt2("c.pt2", lambda m: _chain(H.edit_json(
        "model_constants_config.json", lambda c: c.update(config={"obj": {"path_name": "custom_obj_0", "is_param": False,
                                                                           "use_pickle": True}}))),
        [(f"{top}/data/constants/custom_obj_0", lambda m: H.payload(m))])))
    cases.append(H.Case("pt2-aotinductor", "code", pt2("a.pt2", lambda m: _keep(),
                                                       [(f"{top}/data/aotinductor/model/x.so", b"\x7fELF")])))
    cases.append(H.Case("pt2-sympify-expr", "code", pt2("e.pt2", lambda m: H.edit_json(
        "models/model.json", lambda p: _first_size(p, {"as_expr": {
            "expr_str": f"__import__('pathlib').Path('{m}').write_text('x')", "hint": {"as_int": 2}}})))))
    cases.append(H.Case("pt2-guards-code", "code", pt2("g.pt2", lambda m: H.edit_json(
        "models/model.json", lambda p: p.update(guards_code=[f"__import__('pathlib').Path('{m}').write_text('x')"])))))
    cases.append(H.Case("pt2-target-os-system", "code", pt2("o.pt2", lambda m: H.edit_json(
        "models/model.json", lambda p: p["graph_module"]["graph"]["nodes"][0].update(target="torch.os.system")))))
    # -- memory bombs in .pt2
    cases.append(H.Case("pt2-empty-payload-zeros", "memory", pt2("z.pt2", lambda m: _chain(
        _replace("data/weights/weight_0", b""),
        H.edit_json("model_weights_config.json", lambda c: next(iter(c["config"].values()))["tensor_meta"].update(
            sizes=[{"as_int": 1 << 20}, {"as_int": 1 << 12}], strides=[{"as_int": 1 << 12}, {"as_int": 1}])))),
        bomb=True))
    cases.append(H.Case("pt2-inflating-weight", "memory", lambda f, m: (
        ["detect", str(H.rewrite_zip(base_pt2, f / "i.pt2", lambda n, d: [(n, d)],
                                     [(f"{top}/data/weights/weight_99", bytes(2 * 2**30 + 2**20))],
                                     compress=8))], "memory budget"), bomb=True))
    cases.append(H.Case("pt2-not-zip", "format", lambda f, m: (["detect", str(_write(f / "r.pt2", os.urandom(4096)))],
                                                               "not a torch.export archive")))
    cases.append(H.Case("pt2-plain-pickle", "code", lambda f, m: (["detect", str(_write(f / "p.pt2", H.payload(m)))],
                                                                  "pickle")))
    cases.append(H.Case("pt-pickle", "code", lambda f, m: (["detect", str(_write(f / "m.pt", H.payload(m)))], "pickle")))
    # -- ONNX
    for kind in ("ConstantOfShape", "Expand", "Range", "Tile"):
        cases.append(H.Case(f"onnx-{kind}-bomb", "memory", lambda f, m, k=kind: (
            ["detect", str(H.save(H.shape_bomb(k), f / f"{k}.onnx"))], "memory budget"), bomb=True))
    cases.append(H.Case("onnx-input-5GB", "memory", lambda f, m: (
        ["detect", str(H.save(H.relu_model([1, 1250, 1024, 1024]), f / "in5.onnx"))], "memory budget"), bomb=True))
    cases.append(H.Case("onnx-input-120GB", "memory", lambda f, m: (
        ["detect", str(H.save(H.relu_model([30, 1024, 1024, 1024]), f / "in120.onnx"))], "memory budget"), bomb=True))
    cases.append(H.Case("onnx-batch-300000", "memory", lambda f, m: (
        ["detect", str(H.save(H.small_conv_model(), f / "conv.onnx")), "--batch", "300000"], "memory budget"), bomb=True))
    cases.append(H.Case("onnx-run-batch-300000", "memory", lambda f, m: (
        ["run", str(H.save(H.small_conv_model(), f / "conv.onnx")), "--batch", "300000", "--device", "cpu"],
        "memory budget"), bomb=True))
    cases.append(H.Case("onnx-external-sparse-4GiB", "memory", lambda f, m: (
        ["detect", str(_sparse_external(f))], "memory budget"), bomb=True))
    cases.append(H.Case("onnx-external-nul", "paths", lambda f, m: (
        ["detect", str(H.external_model(f, "data\x00.bin"))], "NUL")))
    cases.append(H.Case("onnx-external-absolute", "paths", lambda f, m: (
        ["detect", str(H.external_model(f, "/etc/passwd"))], "escapes its folder")))
    cases.append(H.Case("onnx-external-dotdot", "paths", lambda f, m: (
        ["detect", str(H.external_model(H.mkdir(f / "m"), "../secret.bin"))], "escapes its folder")))
    cases.append(H.Case("onnx-external-symlink-out", "paths", lambda f, m: (
        ["detect", str(_symlinked_external(f))], "escapes its folder")))
    cases.append(H.Case("onnx-external-past-end", "memory", lambda f, m: (
        ["detect", str(_short_external(f))], "past the end")))
    cases.append(H.Case("onnx-negative-dim", "format", lambda f, m: (
        ["detect", str(H.save(H.relu_model([1, -5]), f / "neg.onnx"))], "")))
    cases.append(H.Case("onnx-random-bytes", "format", lambda f, m: (
        ["detect", str(_write(f / "r.onnx", os.urandom(2048)))], "r.onnx")))
    cases.append(H.Case("onnx-fifo", "memory", lambda f, m: (["detect", str(H.fifo(f / "f.onnx"))], "FIFO"), bomb=True))
    cases.append(H.Case("onnx-dev-zero", "memory", lambda f, m: (["detect", str(_link(f / "z.onnx", "/dev/zero"))],
                                                                 "device"), bomb=True))
    # -- Hugging Face folders
    cases.append(H.Case("hf-index-absolute-shard", "paths", lambda f, m: (
        ["detect", str(H.shard_index(H.copy_folder(base_hf, f / "abs"), "/etc/hosts.safetensors"))], "outside its folder")))
    cases.append(H.Case("hf-index-dotdot-shard", "paths", lambda f, m: (
        ["detect", str(H.shard_index(H.copy_folder(base_hf, f / "dd"), "../outside.safetensors"))], "outside its folder")))
    cases.append(H.Case("hf-weights-symlink-out", "paths", lambda f, m: (["detect", str(_hf_symlink_out(base_hf, f))],
                                                                         "escapes its folder")))
    cases.append(H.Case("hf-million-layers", "memory", lambda f, m: (
        ["detect", str(H.set_config(H.copy_folder(base_hf, f / "deep"), num_hidden_layers=1_000_000))], "layers"), bomb=True))
    cases.append(H.Case("hf-hidden-8192", "memory", lambda f, m: (
        ["detect", str(H.set_config(H.copy_folder(base_hf, f / "wide"), hidden_size=8192, intermediate_size=32768))],
        "memory budget"), bomb=True))
    cases.append(H.Case("hf-absurd-sizes", "format", lambda f, m: (
        ["detect", str(H.set_config(H.copy_folder(base_hf, f / "absurd"), hidden_size="big", num_hidden_layers=-3))], "")))
    cases.append(H.Case("hf-remote-code", "code", lambda f, m: (
        ["detect", str(H.set_config(H.copy_folder(base_hf, f / "remote"), auto_map={"AutoModel": "x.Model"}))],
        "custom code")))
    cases.append(H.Case("hf-pickled-weights", "code", lambda f, m: (["detect", str(_hf_pickled(base_hf, f, m))], "refused")))
    cases.append(H.Case("hf-config-fifo", "memory", lambda f, m: (["detect", str(_hf_config_fifo(base_hf, f))], "FIFO"),
                        bomb=True))
    cases.append(H.Case("hf-safetensors-lies", "memory", lambda f, m: (["detect", str(_hf_lying_header(base_hf, f))],
                                                                       "outside the file"), bomb=True))
    # -- plans and reports
    plan = ["run", "conv_bn_relu", "--device", "cpu", "--no-chains", "--no-stages", "--plan"]
    cases.append(H.Case("plan-dev-zero", "memory", lambda f, m: (plan + ["/dev/zero"], "not a regular file"), bomb=True))
    cases.append(H.Case("plan-fifo", "memory", lambda f, m: (plan + [str(H.fifo(f / "p.json"))], "FIFO"), bomb=True))
    cases.append(H.Case("plan-folder", "format", lambda f, m: (plan + [str(f)], "directory")))
    cases.append(H.Case("plan-deep", "crash", lambda f, m: (plan + [str(_write(f / "d.json", H.deep_json().encode()))],
                                                            "nested")))
    cases.append(H.Case("plan-cuda-graphs-string", "strict", lambda f, m: (plan + [str(_plan(f, cuda_graphs="false"))],
                                                                          "cuda_graphs")))
    cases.append(H.Case("plan-accepted-wrong-type", "strict", lambda f, m: (plan + [str(_plan(f, accepted="all"))],
                                                                           "accepted")))
    cases.append(H.Case("plan-huge", "memory", lambda f, m: (plan + [str(_write(f / "h.json", b" " * (6 * 2**20)))],
                                                             "over the limit")))
    slower = ["plan", "residual_block", "--reject-slower"]
    cases.append(H.Case("report-deep", "crash", lambda f, m: (slower + [str(_write(f / "r.json", H.deep_json().encode()))],
                                                              "nested")))
    cases.append(H.Case("report-chains-not-objects", "crash", lambda f, m: (slower + [str(_report(f, chains=[1, 2]))],
                                                                           "report")))
    cases.append(H.Case("report-chain-without-id", "crash", lambda f, m: (slower + [str(_report(f, chains=[{"slower": True}]))],
                                                                         "report")))
    cases.append(H.Case("report-other-model", "strict", lambda f, m: (
        slower + [str(_report(f, plan={"fingerprint": "0123456789abcdef", "model": "resnet50", "cuda_graphs": False}))],
        "report")))
    cases.append(H.Case("report-slower-string", "strict", lambda f, m: (
        slower + [str(_report(f, chains=[{"id": "conv_bn_act@conv2d", "slower": "false"}]))], "report")))
    cases.append(H.Case("report-dev-zero", "memory", lambda f, m: (slower + ["/dev/zero"], "not a regular file"), bomb=True))
    # -- arguments
    cases.append(H.Case("arg-batch-zero", "args", lambda f, m: (["detect", "resnet50", "--batch", "0"], "--batch")))
    cases.append(H.Case("arg-unknown-flag", "args", lambda f, m: (["detect", "resnet50", "--bogus"], "--bogus")))
    cases.append(H.Case("arg-out-missing-folder", "args", lambda f, m: (
        ["run", "conv_bn_relu", "--device", "cpu", "--out", str(f / "missing" / "r.json")], "does not exist")))
    return cases


def _chain(*edits):
    def edit(name, data):
        items = [(name, data)]
        for e in edits:
            items = [out for n, d in items for out in e(n, d)]
        return items
    return edit


def _replace(suffix: str, new: bytes):
    return lambda name, data: [(name, new if name.endswith(suffix) else data)]


def _rename(suffix: str, new_suffix: str, new: bytes):
    return lambda name, data: [(name[: -len(suffix)] + new_suffix, new) if name.endswith(suffix) else (name, data)]


def _keep():
    return lambda name, data: [(name, data)]


def _first_size(program: dict, value: dict) -> None:
    for node in program["graph_module"]["graph"]["tensor_values"].values():
        node["sizes"][0] = value
        return


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def _link(path: Path, target: str) -> Path:
    os.symlink(target, path)
    return path


def _only_models_json(base: Path, folder: Path) -> Path:
    import zipfile

    with zipfile.ZipFile(base) as z:
        member = next(n for n in z.namelist() if n.endswith("models/model.json"))
        data = z.read(member)
    path = folder / "only.pt2"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(member, data)
    return path


def _sparse_external(folder: Path) -> Path:
    with open(folder / "big.bin", "wb") as f:
        f.truncate(4 * 2**30)
    return H.external_model(folder, "big.bin", dims=(1024, 1024, 1024))


def _symlinked_external(folder: Path) -> Path:
    secret = folder / "secret.bin"
    secret.write_bytes(bytes(16))
    inner = H.mkdir(folder / "m")
    os.symlink(secret, inner / "w.bin")
    return H.external_model(inner, "w.bin")


def _short_external(folder: Path) -> Path:
    (folder / "w.bin").write_bytes(bytes(8))
    return H.external_model(folder, "w.bin", dims=(1024,))


def _hf_symlink_out(base: Path, folder: Path) -> Path:
    hf = H.copy_folder(base, folder / "link")
    outside = folder / "outside.safetensors"
    (hf / "model.safetensors").rename(outside)
    os.symlink(outside, hf / "model.safetensors")
    return hf


def _hf_pickled(base: Path, folder: Path, marker: Path) -> Path:
    hf = H.copy_folder(base, folder / "pickled")
    (hf / "model.safetensors").unlink()
    (hf / "pytorch_model.bin").write_bytes(H.payload(marker))
    return hf


def _hf_config_fifo(base: Path, folder: Path) -> Path:
    hf = H.copy_folder(base, folder / "fifo")
    (hf / "config.json").unlink()
    os.mkfifo(hf / "config.json")
    return hf


def _hf_lying_header(base: Path, folder: Path) -> Path:
    hf = H.copy_folder(base, folder / "lies")
    (hf / "model.safetensors").write_bytes(H.safetensors_bytes({"w": ("F32", [1 << 30], 4 << 30)}))
    return hf


def _plan(folder: Path, **changes) -> Path:
    plan = {"version": 1, "model": "conv_bn_relu", "fingerprint": "x", "accepted": [], "kernels": {},
            "memory_format": "nchw", "cuda_graphs": False}
    plan.update(changes)
    return _write(folder / "plan.json", json.dumps(plan).encode())


def _report(folder: Path, **changes) -> Path:
    report = {"version": 1, "plan": {"cuda_graphs": False},
              "chains": [{"id": "conv_bn_act@conv2d", "slower": True}]}
    report.update(changes)
    return _write(folder / "report.json", json.dumps(report).encode())


@pytest.fixture(scope="module")
def bases(tmp_path_factory):
    root = tmp_path_factory.mktemp("bases")
    return H.good_pt2(root / "good.pt2"), H.tiny_bert(root / "tiny-bert")


@pytest.fixture(scope="module")
def results(bases, tmp_path_factory):
    """Every corpus case run through the CLI under the address-space limit, two at a time."""
    vm, rss = _baseline()
    limit_as = vm + BUDGET
    cases = corpus(*bases)

    def one(case: H.Case):
        folder = tmp_path_factory.mktemp(case.id)
        marker = folder / "MARKER"
        argv, needle = case.build(folder, marker)
        result = measured_cli(argv, limit_as)
        result.update(needle=needle, marker=marker.exists(), case=case, argv=argv)
        return case.id, result

    start = time.monotonic()
    with ThreadPoolExecutor(max_workers=2) as pool:
        out = dict(pool.map(one, cases))
    print(f"\n{len(cases)} hostile cases in {time.monotonic() - start:.0f} s; baseline VmSize "
          f"{vm / 2**30:.2f} GiB, RSS {rss / 2**20:.0f} MiB, RLIMIT_AS {limit_as / 2**30:.2f} GiB")
    for cid, r in out.items():
        print(f"  {cid:<34} exit {r['code']} {r['seconds']:5.1f} s peak {r['peak'] / 2**20:6.0f} MiB  "
              f"{r['stderr'].strip()[:110]}")
    return out, rss


def test_corpus_is_large_and_covers_every_class(bases):
    cases = corpus(*bases)
    assert len(cases) >= 40 and len({c.id for c in cases}) == len(cases)
    assert {c.kind for c in cases} >= {"code", "paths", "memory", "crash", "strict", "args", "format"}


def test_every_hostile_case_is_one_line_exit_2_within_budget(results):
    out, base_rss = results
    failures = []
    for cid, r in out.items():
        lines = [ln for ln in r["stderr"].splitlines() if ln.strip()]
        problems = []
        if r["code"] != 2:
            problems.append(f"exit {r['code']}")
        if len(lines) != 1:
            problems.append(f"{len(lines)} stderr lines")
        elif not lines[0].startswith("fusion-explorer"):
            problems.append("stderr is not the CLI's line")
        elif r["needle"] and r["needle"] not in lines[0]:
            problems.append(f"'{r['needle']}' not in the message")
        if "\x1b" in r["stderr"] or "Traceback" in r["stderr"]:
            problems.append("escape or traceback on stderr")
        if r["marker"]:
            problems.append("PAYLOAD RAN")
        if r["seconds"] > CASE_SECONDS:
            problems.append(f"took {r['seconds']:.0f} s")
        if r["peak"] - base_rss > BUDGET:
            problems.append(f"peak RSS {r['peak'] / 2**30:.1f} GiB")
        if problems:
            failures.append(f"{cid}: {', '.join(problems)}: {r['stderr'].strip()[:300]}")
    assert not failures, "\n".join(failures)


def test_no_payload_ran_anywhere(results):
    out, _ = results
    assert not [cid for cid, r in out.items() if r["marker"]]


def test_out_folder_is_checked_before_measuring(results):
    out, _ = results
    assert out["arg-out-missing-folder"]["seconds"] < 20  # a measurement takes far longer


def test_node_names_cannot_drive_the_terminal(tmp_path):
    path = H.save(H.escape_named_model(), tmp_path / "esc.onnx")
    proc = subprocess.run([sys.executable, "-m", "explorer.cli", "detect", str(path)], cwd=ROOT, capture_output=True,
                          timeout=120, env=dict(os.environ, PYTHONWARNINGS="ignore"))
    assert proc.returncode == 0, proc.stderr
    assert b"\x1b" not in proc.stdout and b"\x07" not in proc.stdout
    assert b"conv" in proc.stdout
