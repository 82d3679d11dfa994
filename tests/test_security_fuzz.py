"""Fuzzing the one-line contract (issue 9): mutated ONNX files, plans and reports either load or fail
with exactly one ``ExplorerError`` line, never another exception, over thousands of inputs.

ONNX files go through ``load_model`` in-process as the isolated loader's child runs it (the child
marker is set, so no second process is started per example); the memory budget is lowered to
64 MiB so that a mutation that inflates a size is refused quickly instead of allocating.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import hostile as H
from explorer.errors import ExplorerError, PlanError, ReportError
from explorer.fusions.plan import Plan
from explorer.ui import files as ui_files

def fuzz(examples: int) -> settings:
    return settings(max_examples=examples, deadline=None, derandomize=True, database=None,
                    suppress_health_check=list(HealthCheck))

VALID_PLAN = {"version": 1, "model": "residual_block", "fingerprint": "abc", "accepted": ["conv_bn_act@conv2d"],
              "kernels": {"conv_bn_act@conv2d": "auto"}, "memory_format": "nchw", "cuda_graphs": False}
VALID_REPORT = {"version": 1, "model": {"name": "m"}, "plan": {"cuda_graphs": False},
                "unfused": {"latency_ms": {"median": 1.0, "p20": 0.9, "p80": 1.1}},
                "fused": {"latency_ms": {"median": 0.8, "p20": 0.7, "p80": 0.9}},
                "chains": [{"id": "a", "slower": False, "speedup": 1.2}], "notes": ["n"]}

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=20)


def _one_line(exc: ExplorerError) -> None:
    text = str(exc)
    assert text and "\n" not in text and "\r" not in text, repr(text)


def _mutate(data: bytes, edits: list[tuple[int, int, int]]) -> bytes:
    """Apply (kind, position, byte) edits: 0 flips a byte, 1 inserts one, 2 deletes one, 3 truncates."""
    out = bytearray(data)
    for kind, pos, value in edits:
        if not out:
            break
        pos %= len(out)
        if kind == 0:
            out[pos] ^= value or 1
        elif kind == 1:
            out.insert(pos, value)
        elif kind == 2:
            del out[pos]
        else:
            del out[pos:]
    return bytes(out)


edits = st.lists(st.tuples(st.integers(0, 3), st.integers(0, 1 << 20), st.integers(0, 255)), min_size=1, max_size=6)


@pytest.fixture(scope="module")
def onnx_seed() -> bytes:
    return H.escape_named_model().SerializeToString()


def test_mutated_onnx_files_load_or_fail_in_one_line(onnx_seed, tmp_path_factory, monkeypatch):
    from explorer.sources import isolate, load_model

    monkeypatch.setenv(isolate.CHILD_ENV, "1")
    monkeypatch.setenv("FUSION_EXPLORER_MEMORY_BUDGET", "64M")
    folder = tmp_path_factory.mktemp("fuzz-onnx")
    outcomes = {"loaded": 0, "refused": 0}

    @fuzz(400)
    @given(edits)
    def check(mutation):
        path = folder / "m.onnx"
        path.write_bytes(_mutate(onnx_seed, mutation))
        try:
            load_model(str(path))
            outcomes["loaded"] += 1
        except ExplorerError as exc:
            _one_line(exc)
            outcomes["refused"] += 1

    check()
    assert outcomes["refused"] > 50, outcomes  # the mutations do reach the error paths


@fuzz(1500)
@given(st.one_of(
    json_values.map(json.dumps),
    st.tuples(st.sampled_from(sorted(VALID_PLAN)), json_values).map(
        lambda kv: json.dumps({**VALID_PLAN, kv[0]: kv[1]})),
    edits.map(lambda e: _mutate(json.dumps(VALID_PLAN).encode(), e).decode("utf-8", "replace"))))
def test_mutated_plans_parse_or_fail_in_one_line(text):
    try:
        plan = Plan.from_json(text)
    except PlanError as exc:
        _one_line(exc)
        return
    assert isinstance(plan.cuda_graphs, bool) and all(isinstance(a, str) for a in plan.accepted)


@fuzz(1500)
@given(st.one_of(
    json_values.map(lambda v: json.dumps(v).encode()),
    st.tuples(st.sampled_from(sorted(VALID_REPORT)), json_values).map(
        lambda kv: json.dumps({**VALID_REPORT, kv[0]: kv[1]}).encode()),
    edits.map(lambda e: _mutate(json.dumps(VALID_REPORT).encode(), e))))
def test_mutated_reports_load_or_fail_in_one_line(data):
    try:
        report = ui_files.load_report("r.json", data)
    except ReportError as exc:
        _one_line(exc)
        return
    assert isinstance(report, dict)
