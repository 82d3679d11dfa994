"""Issue 19, text is text: a string from a file reaches a person as written, never as markup or as
terminal layout; and a report's every field is checked before it is used.

- Markdown (``explorer.ui.safe_text``): hostile node names, file names and report strings are
  escaped so that GitHub-flavoured markdown (Streamlit's renderer: CommonMark + remark-gfm, whose
  autolink literals are found in the text *after* backslash escapes are resolved) draws no link,
  image, HTML or autolink, and a backtick cannot end a code span. ``rendered`` below models that
  renderer closely enough to tell: backslash escapes, code spans by backtick-run length, and the
  autolink-literal patterns run over the resolved text.
- HTML (``explorer.ui.graph.render_html``): a node name cannot open a tag in the pyvis page, nor
  switch pyvis to its ``innerHTML`` tooltip (it does so when a title holds "href").
- The command line (``explorer.terminal.visible``): ``detect`` shows every control and bidi
  character of a node name as a visible escape; a name cannot forge a line of the chain table.
- Reports (``explorer.report``, v1 upgrade included) and teaching reports: the values that crashed
  readers (a 400-digit integer where a float is read, ``int("abc")``, ``int(inf)``, a list where an
  object is read, a string compared with a number) are one ``ReportError`` line, and
  ``fusion-explorer plan --reject-slower`` exits 2 with one line.
"""

from __future__ import annotations

import copy
import json
import re
import unicodedata
from pathlib import Path

import pytest
from onnx import TensorProto, helper

import hostile as H
from explorer import report as R
from explorer.errors import ReportError
from report_samples import sample_report

ROOT = Path(__file__).resolve().parents[1]

# ------------------------------------------------------------------ a model of the markdown renderer

_ASCII_PUNCT = set("!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~")
# remark-gfm's autolink literals (mdast-util-gfm-autolink-literal), found in the resolved text.
_AUTOLINK = re.compile(r"(https?://|www(?=\.)|mailto:|xmpp:)|([-.\w+]+@[-\w]+(?:\.[-\w]+)+)", re.IGNORECASE)


def rendered(md: str) -> list[tuple[str, str, str]]:
    """Segments of ``md`` as CommonMark reads them: (kind, resolved text, raw-marks), kind "code" for a
    code span (its content literal), "text" otherwise; raw-marks has "r" for each character that came
    unescaped from the source and "e" for one a backslash escaped."""
    out: list[tuple[str, str, str]] = []
    text, marks = [], []

    def flush() -> None:
        if text:
            out.append(("text", "".join(text), "".join(marks)))
            text.clear(), marks.clear()

    i = 0
    while i < len(md):
        ch = md[i]
        if ch == "\\" and i + 1 < len(md) and md[i + 1] in _ASCII_PUNCT:
            text.append(md[i + 1]), marks.append("e")
            i += 2
            continue
        if ch == "`":
            run = len(md[i:]) - len(md[i:].lstrip("`"))
            fence = "`" * run
            j = i + run
            close = -1
            while True:
                k = md.find(fence, j)
                if k < 0:
                    break
                if (k + run >= len(md) or md[k + run] != "`") and (k == 0 or md[k - 1] != "`"):
                    close = k
                    break
                j = k + 1
            if close < 0:  # no closing run: the backticks are literal text
                text.extend(fence), marks.extend("r" * run)
                i += run
                continue
            flush()
            content = md[i + run:close].replace("\n", " ")
            if len(content) > 2 and content[0] == content[-1] == " " and content.strip(" "):
                content = content[1:-1]
            out.append(("code", content, "r" * len(content)))
            i = close + run
            continue
        text.append(ch), marks.append("r")
        i += 1
    flush()
    return out


def hazards(md: str) -> list[str]:
    """What in ``md`` a GFM renderer would turn into more than text: an unescaped link or image
    opener, an HTML tag, an autolink literal (in the resolved text, escapes or not)."""
    found = []
    for kind, text, marks in rendered(md):
        if kind == "code":
            continue
        raw = "".join(c if m == "r" else "\0" for c, m in zip(text, marks))
        for pattern in ("](", "<", "!["):
            if pattern in raw:
                found.append(f"unescaped {pattern!r} in {text[:80]!r}")
        for match in _AUTOLINK.finditer(text):
            found.append(f"autolink {match.group(0)!r} in {text[:80]!r}")
    return found


def shown(md: str) -> str:
    """The text a reader sees (code spans and escapes resolved, invisible joiners dropped), one line."""
    text = "".join(seg for _, seg, _ in rendered(md))
    text = "".join(c for c in text if unicodedata.category(c) != "Cf")
    return " ".join(text.split())


HOSTILE = [
    "name`with`backticks",
    "``double`` ticks",
    "![x](http://evil.invalid/x.png)",
    "[a](http://evil.invalid)",
    "<img src=http://evil.invalid/x.png>",
    "see http://evil.invalid/path and https://evil.invalid",
    "www.evil.invalid",
    "mail me: someone@evil.invalid",
    "$\\includegraphics{http://evil.invalid/x.png}$",
    ":material/warning: :red[red]",
    "back\\slash \\[",
]


def test_the_renderer_model_sees_what_escape_alone_misses():
    """The checker itself: a raw link, an image, a tag and a backslash-escaped URL are hazards
    (remark-gfm links ``http\\://x`` once the escape is resolved); plain text is not."""
    assert hazards("[a](http://x)") and hazards("![x](y)") and hazards("<img>")
    assert hazards("http\\://evil.invalid") and hazards("www\\.evil.invalid")
    assert not hazards("conv_bn_relu: 3 chains") and not hazards("`[a](http://x)`")
    assert shown("a `` b`c `` d") == "a b`c d"


@pytest.mark.parametrize("text", HOSTILE)
def test_markdown_text_is_shown_as_written_and_draws_nothing(text):
    from explorer.ui import safe_text

    md = safe_text.markdown(text)
    assert not hazards(md), hazards(md)
    assert shown(md) == " ".join(text.split())
    assert "\n" not in md
    # a code span holding it, inside a sentence of the app's own markdown
    span = safe_text.code(text)
    md = f"origin: {span} and more **bold**"
    assert not hazards(md), hazards(md)
    assert shown(md) == f"origin: {' '.join(text.split())} and more **bold**"


# ------------------------------------------------------------------ hostile ONNX names

#: Node names of a Conv + Relu model: markdown, HTML that would close the graph page's script, a
#: pyvis "href", and every kind of control and bidi character (a newline that would forge a row of
#: the chain table first).
NODE_NAMES = ("conv\nconv_act@fake_line                 Conv+act  1.0 KiB  1  forged\tend"
              " </script><img src=x onerror=alert(1)> `x` ![x](http://evil.invalid/x.png)",
              "relu\x1b[2J\x85\u061c\u2028\u2029\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069\x07\x00"
              " <a href=http://evil.invalid>x</a> [a](http://evil.invalid) www.evil.invalid a@evil.invalid")
FORBIDDEN = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def hostile_onnx(names=NODE_NAMES) -> bytes:
    """Conv + Relu (one fusible chain) whose node names are ``names``."""
    w = helper.make_tensor("w", TensorProto.FLOAT, [8, 3, 3, 3], [0.01] * 216)
    b = helper.make_tensor("b", TensorProto.FLOAT, [8], [0.0] * 8)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1], name=names[0]),
             helper.make_node("Relu", ["c"], ["y"], name=names[1])]
    return H.onnx_model(nodes, [H.fin("x", [1, 3, 16, 16])], [H.fin("y", None)], [w, b]).SerializeToString()


@pytest.fixture(scope="module")
def hostile_path(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("names") / "names.onnx"
    path.write_bytes(hostile_onnx())
    return path


def test_pyvis_page_opens_no_tag_from_a_node_name(hostile_path):
    """The graph page's HTML: names reach the page only as data (no ``<img`` / ``</script>`` of
    theirs), and no title holds "href", which would make pyvis set tooltips with ``innerHTML``."""
    from explorer.ui import graph as graph_view
    from explorer.fusion_engine import analyze

    _, graph, det = analyze(str(hostile_path))
    assert len(det.chains) == 1
    for accepted in ([], [c.id for c in det.chains]):
        page = graph_view.render_html(graph_view.build_view(graph, det, accepted))
        assert "<img src=x" not in page and "</script><img" not in page
        assert "<a href=http://evil" not in page
        assert "popup.innerHTML" not in page, "pyvis switched to its innerHTML tooltips"


# ------------------------------------------------------------------ the command line

def test_detect_shows_control_and_bidi_characters_as_visible_escapes(hostile_path, capsys):
    from explorer import cli

    assert cli.main(["detect", str(hostile_path)]) == 0
    out = capsys.readouterr().out
    lines = out.split("\n")
    assert not any(FORBIDDEN.search(line) for line in lines), [l for l in lines if FORBIDDEN.search(l)]
    header = next(i for i, l in enumerate(lines) if l.startswith("id "))
    rows = lines[header + 1:lines.index("", header)]
    assert len(rows) == 1 and rows[0].startswith("conv_act@"), rows  # one chain, one line: nothing forged
    for escape in ("\\n", "\\t", "\\x1b", "\\x85", "\\u061c", "\\u2028", "\\u2029", "\\u202e", "\\u2066",
                   "\\u2069", "\\x07", "\\x00"):
        assert escape in rows[0], escape


def test_visible_maps_every_control_and_bidi_character():
    from explorer.terminal import visible

    for code in [*range(0x20), *range(0x7f, 0xa0), 0x061c, 0x200e, 0x200f, 0x2028, 0x2029,
                 *range(0x202a, 0x202f), *range(0x2066, 0x206a)]:
        out = visible(f"a{chr(code)}b")
        assert not FORBIDDEN.search(out) and out.startswith("a\\") and out.endswith("b"), (hex(code), out)
    assert visible("plain ascii, 中文 and émigré") == "plain ascii, 中文 and émigré"


# ------------------------------------------------------------------ reports

def valid_v1() -> dict:
    """A version-1 report (the runner's untyped dict) that loads."""
    return {"version": 1, "model": {"name": "m", "fingerprint": "f"}, "plan": {"model": "m", "fingerprint": "f",
                                                                               "cuda_graphs": True},
            "environment": {"device": "cuda", "device_name": "H200", "is_cpu": False},
            "unfused": {"latency_ms": {"median": 1.0, "p20": 0.9, "p80": 1.1, "reps": 10}},
            "fused": {"latency_ms": {"median": 0.8, "p20": 0.7, "p80": 0.9, "reps": 10}},
            "chains": [{"id": "a", "status": "fused", "slower": False, "speedup": 1.2, "graph_speedup": 1.1,
                        "unfused_ms": 1.0, "fused_ms": 0.8, "unfused_graph_ms": 0.5, "fused_graph_ms": 0.45,
                        "graph_launches_saved": 2}],
            "stages": [{"stage": "none", "label": "original", "latency_ms": {"median": 1.0}}],
            "baselines": {"torch_compile": {"mode": "default", "latency_ms": {"median": 0.9}}},
            "reference": {"what": "float64", "fused_worse": False}, "speedup": 1.25, "notes": ["n"]}


def _set(data: dict, path: tuple, value) -> dict:
    data = copy.deepcopy(data)
    target = data
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return data


BIG = 10 ** 400
CRASHERS = [
    ("v2-400-digit-float", "v2", ("unfused", "latency", "median"), BIG),
    ("v2-400-digit-int", "v2", ("unfused", "kernel_launches"), BIG),
    ("v2-negative-reps", "v2", ("fused", "latency", "reps"), -5),
    ("v2-unknown-verdict", "v2", ("chains", 0, "verdict", "label"), "much faster"),
    ("v2-verdict-n-inf", "v2", ("verdict", "ratio"), float("inf")),
    ("v1-400-digit-speedup", "v1", ("speedup",), BIG),
    ("v1-400-digit-latency", "v1", ("unfused", "latency_ms", "median"), BIG),
    ("v1-int-abc", "v1", ("unfused", "latency_ms", "reps"), "abc"),
    ("v1-int-inf", "v1", ("chains", 0, "graph_launches_saved"), float("inf")),
    ("v1-stage-int-abc", "v1", ("stages", 0, "chains_fused"), "abc"),
    ("v1-reference-list", "v1", ("reference",), []),
    ("v1-settings-list", "v1", ("settings",), [1, 2]),
    ("v1-notes-string", "v1", ("notes",), "abc"),
    ("v1-string-vs-number", "v1", ("chains", 0, "graph_speedup"), "fast"),
    ("v1-precision-list", "v1", ("fused", "precision_vs_unfused"), [1]),
    ("v1-baseline-latency-number", "v1", ("baselines", "torch_compile", "latency_ms"), 5),
]


def _crasher(kind: str, path: tuple, value) -> str:
    base = sample_report().to_dict() if kind == "v2" else valid_v1()
    return json.dumps(_set(base, path, value))


def test_the_valid_bases_load():
    assert R.load(json.dumps(valid_v1()), "v1.json").upgraded_from == 1
    assert R.load(sample_report().to_json(), "v2.json") == sample_report()


@pytest.mark.parametrize("case", CRASHERS, ids=lambda c: c[0])
def test_report_fields_that_crashed_readers_are_one_line(case):
    _, kind, path, value = case
    with pytest.raises(ReportError) as err:
        report = R.load(_crasher(kind, path, value), "r.json")
        R.summary_table(report)  # a reader: formats every number
    text = str(err.value)
    assert text.startswith("r.json") and "\n" not in text, text


def test_plan_reject_slower_refuses_a_bad_report_with_exit_2(tmp_path, capsys):
    from explorer import cli

    for name, kind, path, value in CRASHERS[:1] + [c for c in CRASHERS if c[0] in ("v1-int-abc", "v1-string-vs-number")]:
        report = tmp_path / f"{name}.json"
        report.write_text(_crasher(kind, path, value))
        assert cli.main(["plan", "residual_block", "--reject-slower", str(report)]) == 2, name
        err = capsys.readouterr().err.strip()
        assert err.count("\n") == 0 and "unexpected error" not in err and str(report) in err, err


TEACHING = ROOT / "benchmarks" / "results" / "teaching_report_h200.json"


@pytest.mark.parametrize("path, value", [
    (("models", 0, "breakdown", "unfused", "wall_ms"), BIG),
    (("models", 0, "breakdown", "unfused", "kernels"), "many"),
    (("models", 0, "breakdown", "unfused", "top", 0, "us"), "fast"),
    (("models", 0, "stages", 0, "latency_ms"), [1.0]),
    (("models", 0, "stages", 1, "latency_ms"), -1.0),
    (("models", 0, "traffic", "explained", "fused", "reasons"), "l2"),
    (("models", 0, "traffic", "total", "bytes_unfused"), BIG),
    (("models", 0, "comparison", 0, "measured"), "x"),
    (("models", 0, "predictions", 0, "gain"), {"a": 1}),
    (("ceilings", "bandwidth"), "fast"),
    (("ceilings", "flops"), [1]),
    (("environment", "device_name"), ["H200"]),
], ids=lambda v: ".".join(map(str, v)) if isinstance(v, tuple) else type(v).__name__)
def test_teaching_report_fields_are_checked_before_use(path, value):
    from explorer.teaching import report as teach_report

    data = json.loads(TEACHING.read_text())
    teach_report.validate(copy.deepcopy(data))  # the committed report is valid
    with pytest.raises(ReportError) as err:
        teach_report.validate(_set(data, path, value), "t.json")
    assert "\n" not in str(err.value) and str(err.value).startswith("t.json")
