"""Sweeps without measuring: the sweep file's strict validation, the grid, the cache key, the folder's defences.

Nothing here times anything; ``resolve`` loads the small teaching models in this process to show that the
cache key follows the plan and the shape.
"""

from __future__ import annotations

import json
import os
import sys

import pytest

from explorer.cli import main
from explorer.sweeps import backends, spec as S, store as st
from explorer.sweeps import env as sweep_env
from explorer.sweeps.worker import plan_slot, resolve

GOOD = """
name = "teaching"
models = ["conv_bn_relu", "transformer_block"]
plans = ["all", "none"]
batches = [1, 2]
seq_lens = [16, 32]
dtypes = ["fp32"]
[settings]
device = "cpu"
quick = true
"""


def _write(tmp_path, text, name="sweep.toml"):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_a_good_file_expands_to_its_grid(tmp_path):
    spec = S.load_spec(_write(tmp_path, GOOD))
    points = S.expand(spec)
    # conv_bn_relu takes no sequence: 2 plans x 2 batches; transformer_block: x 2 sequence lengths
    assert len(points) == 2 * 2 + 2 * 2 * 2
    assert {p.seq_len for p in points if p.model == "conv_bn_relu"} == {None}
    assert {p.seq_len for p in points if p.model == "transformer_block"} == {16, 32}
    assert spec.settings.device == "cpu" and spec.settings.quick is True
    settings = S.run_settings(spec, points[0])
    assert settings.batch == points[0].batch and settings.dtype == "fp32" and not settings.compile_baseline


def test_yaml_and_flags_give_the_same_spec(tmp_path):
    yaml = pytest.importorskip("yaml")
    data = {"name": "teaching", "models": ["conv_bn_relu", "transformer_block"], "plans": ["all", "none"],
            "batches": [1, 2], "seq_lens": [16, 32], "dtypes": ["fp32"], "settings": {"device": "cpu", "quick": True}}
    from_yaml = S.load_spec(_write(tmp_path, yaml.safe_dump(data), "sweep.yaml"))
    flags = S.from_flags(data["models"], data["plans"], data["batches"], data["dtypes"], data["seq_lens"],
                         settings=data["settings"], name="teaching")
    assert S.expand(from_yaml) == S.expand(flags) == S.expand(S.load_spec(_write(tmp_path, GOOD)))


BAD = [
    ('models = ["conv_bn_relu"]\nplans = ["all"]\nbatches = [1]\ndtypes = ["fp32"]\ncolour = 3', "unknown key(s) colour"),
    ('models = ["conv_bn_relu"]\nplans = ["all"]\nbatches = [true]\ndtypes = ["fp32"]', "'batches' holds true"),
    ('models = ["conv_bn_relu"]\nplans = ["all"]\nbatches = ["1"]\ndtypes = ["fp32"]', "'batches' holds \"1\""),
    ('models = ["conv_bn_relu"]\nplans = ["all"]\nbatches = []\ndtypes = ["fp32"]', "'batches' is an empty list"),
    ('models = ["conv_bn_relu"]\nplans = ["all"]\nbatches = 1\ndtypes = ["fp32"]', "'batches' must be a list"),
    ('models = ["conv_bn_relu"]\nplans = ["all"]\nbatches = [1, 1]\ndtypes = ["fp32"]', "lists 1 twice"),
    ('models = ["conv_bn_relu"]\nplans = ["all"]\nbatches = [1]\ndtypes = ["fp8"]', "'dtypes' holds \"fp8\""),
    ('models = ["conv_bn_relu"]\nplans = ["all"]\nbatches = [1]', "missing key(s) dtypes"),
    ('models = ["no_such_model"]\nplans = ["all"]\nbatches = [1]\ndtypes = ["fp32"]', "neither a zoo model"),
    ('models = ["conv_bn_relu"]\nplans = ["conv_bn_acts"]\nbatches = [1]\ndtypes = ["fp32"]', "unknown: conv_bn_acts"),
    ('models = ["conv_bn_relu"]\nplans = ["all"]\nbatches = [1]\ndtypes = ["fp32"]\n[settings]\nspeed = 1',
     "unknown setting(s) speed"),
    ('models = ["conv_bn_relu"]\nplans = ["all"]\nbatches = [1]\ndtypes = ["fp32"]\n[settings]\nquick = "yes"',
     "setting 'quick' is \"yes\""),
    ('models = ["conv_bn_relu"]\nplans = ["all"]\nbatches = [1]\ndtypes = ["fp32"]\n[settings]\ntimeout_s = 0',
     "setting 'timeout_s' is 0"),
    ('models = ["conv_bn_relu"]\nplans = ["missing.json"]\nbatches = [1]\ndtypes = ["fp32"]', "plan missing.json"),
    ('models = ["conv_bn_relu"\nplans = ', "not valid TOML"),
]


@pytest.mark.parametrize("text,expected", BAD, ids=[b[1][:30] for b in BAD])
def test_a_bad_file_is_refused_in_one_line(tmp_path, text, expected):
    path = _write(tmp_path, text)
    with pytest.raises(S.SweepError) as err:
        S.load_spec(path)
    message = str(err.value)
    assert expected in message and "\n" not in message and str(path) in message


def test_a_bad_plan_file_and_a_bad_suffix_are_refused(tmp_path):
    (tmp_path / "p.json").write_text(json.dumps({"model": "x", "fingerprint": "y", "accepted": [], "colour": 1}))
    with pytest.raises(S.SweepError, match="unknown field"):
        S.load_spec(_write(tmp_path, 'models=["conv_bn_relu"]\nplans=["p.json"]\nbatches=[1]\ndtypes=["fp32"]'))
    with pytest.raises(S.SweepError, match="is .toml, .yaml or .json"):
        S.load_spec(_write(tmp_path, "models = []", "sweep.ini"))
    with pytest.raises(S.SweepError, match="not UTF-8"):
        (tmp_path / "bin.toml").write_bytes(b"\xff\xfe\x00")
        S.load_spec(tmp_path / "bin.toml")


def test_the_cli_refuses_a_bad_sweep_in_one_line(tmp_path, capsys):
    path = _write(tmp_path, 'models = ["conv_bn_relu"]\nplans = ["all"]\nbatches = [0]\ndtypes = ["fp32"]')
    assert main(["sweep", str(path), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "'batches' holds 0" in err and "Traceback" not in err
    assert main(["sweep", str(path), "--models", "conv_bn_relu", "--out", str(tmp_path / "out")]) == 2
    assert "not both (--models)" in capsys.readouterr().err
    assert main(["sweep", "--models", "conv_bn_relu", "--batches", "1,x", "--out", str(tmp_path / "o")]) == 2
    assert "'x' is not one" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_the_cache_key_follows_the_plan_the_shape_and_the_device():
    spec = S.from_flags(["conv_bn_relu"], ["all", "none", "conv_bn_act"], [1, 2], ["fp32"], settings={"device": "cpu"})
    env = {"device_kind": "cpu", "device_name": "CPU (x86_64)", "driver": None, "torch": "2.x", "triton": "3.x"}
    keys = {}
    for batch in (1, 2):
        answer = resolve({"model": "conv_bn_relu", "batch": batch, "seq_len": None,
                          "plans": [p.to_dict() for p in spec.plans], "levers": [("nchw", False)]})
        assert answer["status"] == "ok" and answer["chains"] >= 1
        for label in ("all", "none", "conv_bn_act"):
            plan = answer["plans"][plan_slot(label, "nchw", False)]
            point = S.Point("conv_bn_relu", label, batch, None, "fp32", "nchw", False, False)
            fields = S.key_fields(point, answer["model_fingerprint"], S.plan_fingerprint(plan), env,
                                  S.run_settings(spec, point))
            keys[(batch, label)] = S.cache_key(fields)
    # "all" and "conv_bn_act" accept the same chains of this model: the same plan, the same key
    assert keys[(1, "all")] == keys[(1, "conv_bn_act")]
    assert keys[(1, "all")] != keys[(1, "none")]                   # another plan, another key
    assert keys[(1, "all")] != keys[(2, "all")]                    # another shape
    point = S.Point("conv_bn_relu", "all", 1, None, "fp32", "nchw", False, False)
    base = S.key_fields(point, "fp", "plan", env, S.run_settings(spec, point))
    for field, value in (("device_name", "NVIDIA H200"), ("driver", "580"), ("torch", "2.y"), ("triton", "3.y")):
        assert S.cache_key(S.key_fields(point, "fp", "plan", {**env, field: value}, S.run_settings(spec, point))) \
            != S.cache_key(base), field
    assert S.cache_key(base) == S.cache_key(S.key_fields(point, "fp", "plan", {**env, "load_avg_1m": 9.0},
                                                         S.run_settings(spec, point)))
    # points that failed before their fingerprints were known keep keys of their own
    unresolved = {S.cache_key(S.key_fields(S.Point(m, p, 10**7, None, "fp32", "nchw", False, False), None, None, env,
                                           S.run_settings(spec, point)))
                  for m in ("conv_bn_relu", "residual_block") for p in ("all", "none")}
    assert len(unresolved) == 4


def test_a_plan_file_made_for_another_model_fails_its_points_only(tmp_path):
    from explorer.fusion_engine import analyze
    from explorer.fusions.plan import make_plan

    plan = make_plan(analyze("residual_block")[2], "all")
    (tmp_path / "p.json").write_text(plan.to_json())
    spec = S.load_spec(_write(tmp_path, 'models=["conv_bn_relu"]\nplans=["p.json","all"]\nbatches=[1]\ndtypes=["fp32"]'))
    answer = resolve({"model": "conv_bn_relu", "batch": 1, "seq_len": None,
                      "plans": [p.to_dict() for p in spec.plans], "levers": [("channels_last", True)]})
    assert "made for model" in answer["plans"][plan_slot("p.json", "channels_last", True)]["error"]
    resolved = answer["plans"][plan_slot("all", "channels_last", True)]
    assert resolved["memory_format"] == "channels_last" and resolved["cuda_graphs"] is True


def test_the_folder_refuses_escapes_files_and_other_folders(tmp_path):
    root = tmp_path / "root"
    (root / "a").mkdir(parents=True)
    (root / "a" / st.SPEC_FILE).write_text("{}")
    assert st.open_folder("a", root=root) == (root / "a").resolve()
    assert st.sweep_folders(root) == ["a"]
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / st.SPEC_FILE).write_text("{}")
    os.symlink(outside, root / "link")
    for name in ("../outside", str(outside), "link", "a/../../outside"):
        with pytest.raises(S.SweepError, match="outside the sweeps root"):
            st.open_folder(name, root=root)
    (tmp_path / "f").write_text("x")
    with pytest.raises(S.SweepError, match="is a file"):
        st.open_folder(tmp_path / "f", create=True)
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "thesis.tex").write_text("x")
    with pytest.raises(S.SweepError, match="holds other files"):
        st.open_folder(tmp_path / "busy", create=True)
    with pytest.raises(S.SweepError, match="not a sweep folder"):
        st.open_folder(tmp_path / "busy")
    with pytest.raises(S.SweepError, match="is not a point's key"):
        st.SweepStore(root / "a").report_path("../../etc/passwd")


def _record(**changes):
    point = S.Point("conv_bn_relu", "all", 1, None, "fp32", "nchw", False, False)
    rec = st.make_record(point, "0" * 32, {"x": 1}, {"status": "failed", "reason": "why"})
    rec.update(changes)
    return json.dumps(rec)


def test_journal_lines_are_checked_and_a_cut_last_line_is_skipped():
    good = _record()
    records, skipped = st.parse_journal((good + "\n" + good[: len(good) // 2]).encode(), "results.jsonl")
    assert len(records) == 1 and skipped == 1 and records[0]["reason"] == "why"
    for bad, expected in ((_record(batch="1"), "field 'batch' has type str"), (_record(key="../x"), "32 hexadecimal"),
                          (_record(status="great"), "status 'great'"), (_record(cuda_graphs=1), "field 'cuda_graphs'")):
        with pytest.raises(S.SweepError, match=expected):
            st.parse_journal((bad + "\n" + good + "\n").encode(), "results.jsonl")
    with pytest.raises(S.SweepError, match="line 1"):
        st.parse_journal((good[:20] + "\n" + good + "\n").encode(), "results.jsonl")   # cut, but not last
    with pytest.raises(S.SweepError, match="not a readable Parquet"):
        st.read_results("results.parquet", b"PAR1 nonsense")


def test_without_ray_the_ray_backend_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)   # as on a machine without Ray: the import fails
    with pytest.raises(S.SweepError) as err:
        backends.import_ray()
    assert str(err.value) == backends.RAY_INSTALL and "pip install 'fusion-explorer[ray]'" in str(err.value)


def test_the_multi_gpu_benchmark_matches_points_by_key_and_charts_its_runs():
    """bench_sweep_gpus.py (issue 25, needs several GPUs) compares the same point across runs by its key; its
    arithmetic and its chart are checked here on two made-up runs, and without GPUs it refuses in one line."""
    import benchmark_scripts

    bench = benchmark_scripts.load("bench_sweep_gpus", "bench_sweep_gpus_test")
    one = {"records": {"k1": {"point": "p1", "speedup": 2.0, "speedup_low": 1.9, "speedup_high": 2.1, "gpu_uuid": "A"},
                       "k2": {"point": "p2", "speedup": 1.0, "speedup_low": 0.99, "speedup_high": 1.01, "gpu_uuid": "A"}}}
    two = {"records": {"k1": {"point": "p1", "speedup": 2.2, "speedup_low": 2.15, "speedup_high": 2.3, "gpu_uuid": "B"},
                       "k2": {"point": "p2", "speedup": 1.0, "speedup_low": 0.98, "speedup_high": 1.02, "gpu_uuid": "A"}}}
    rows = {r["point"]: r for r in bench.agreement(one, two)}
    assert rows["p1"]["ratio"] == 1.1 and rows["p1"]["intervals_overlap"] is False and rows["p1"]["gpu_n"] == "B"
    assert rows["p2"]["ratio"] == 1.0 and rows["p2"]["intervals_overlap"] is True
    chart = bench.svg([{"backend": "ray", "gpus": 1, "points_per_min": 2.0}, {"backend": "ray", "gpus": 2,
                                                                               "points_per_min": 3.9}])
    assert chart.startswith("<svg") and "ray x2" in chart and "3.90" in chart
    if not sweep_env.visible_gpus():
        assert bench.main(["--gpus", "1,2"]) == 2


def test_a_progress_file_its_sweep_stopped_writing_reads_as_interrupted(tmp_path):
    """A sweep killed mid-run (a device call's time limit) leaves "running" in progress.json: past STALE_S without
    a rewrite it reads as interrupted, nothing running, no time left; a fresh one stays running."""
    store = st.SweepStore(tmp_path)
    store.write_progress({"status": "running", "done": 5, "total": 8, "running": 1, "left_s": 100.0,
                          "updated_unix": 1000.0})
    assert store.progress(now=1000.0 + st.STALE_S - 1)["status"] == "running"
    stale = store.progress(now=1000.0 + st.STALE_S + 1)
    assert (stale["status"], stale["running"], stale["left_s"], stale["done"]) == ("interrupted", 0, None, 5)
    store.write_progress({"status": "done", "updated_unix": 0.0})
    assert store.progress()["status"] == "done"
