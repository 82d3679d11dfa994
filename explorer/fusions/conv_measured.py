"""Per-shape measured choice for a grouped convolution + bias + ReLU: cuDNN's fused call or the plain conv + our pass.

``torch.cudnn_convolution_relu`` is one call, but cuDNN picks its engine by
heuristics, and for some grouped shapes the engine it picks for the fused call is
a generic one: on the H200 RegNetX-32GF's grouped 3×3 convs (group width 168) ran
as ``convolve_common_engine_float_NHWC`` at 59.6 ms, where the same convs without
the bias and ReLU took cutlass's implicit GEMM at 3.3 ms. ResNeXt's grouped convs,
on the other hand, are fast through the fused call. No rule on the group width
separates them (RegNet-Y-128GF's 264 is fine, RegNet-Y-32GF's 232 is not), so it is
a measurement per shape: ``benchmarks/bench_grouped_conv.py`` times both for every
grouped conv of the corpus's RegNets and ResNeXts and writes the committed table
(``conv_grouped_measured.json``, package data), and ``winner`` reads it.

Both ways can be far off: RegNetX-32GF's convs are 7.9× slower through the
fused call, ResNeXt-101-32x8d's 16× slower without it (the plain conv's engine at
437 µs against the fused call's 28: ``benchmarks/results/bench_grouped_conv_h200.json``),
so no default is safe. A shape measured at another batch size takes that row's
winner (the nearest batch: cuDNN's engine follows the channels, groups and map
size, which the batch does not change). A shape the table lacks on the CUDA
device present is timed there, once per process (``measure_now``: both ways,
alternated, between CUDA events, on seeded inputs of its shape; not while a
stream is capturing a CUDA graph or torch.compile is tracing). Only a plan made
for a GPU that is not here (or a table swapped in by ``measured_table``, which is
then the whole truth) gets None: the caller's default (``conv.GROUPED_UNMEASURED``).
``measured_table(path)`` swaps the table for a block, as ``attention.measured_table``
does for attention (a benchmark or a test).
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Iterator, Sequence

import torch

from explorer.fusions import measured_tables
from explorer.fusions.kernels import measured as measured_kernels

TABLE_FILE = "conv_grouped_measured.json"
TABLE_SCHEMA = "conv_grouped_measured/1"
#: The two ways a row times: cuDNN's fused conv+bias+ReLU, and the plain conv then our Triton bias+ReLU pass.
CANDIDATES = ("cudnn", "epilogue")
#: The fused call is taken only where its median is below the pass's by more than this fraction of the latter
#: (the LLM epilogue table's rule, ``kernels.measured.MARGIN``): a tie keeps the plain conv, whose engine cuDNN
#: chooses as it does for the unfused graph.
MARGIN = measured_kernels.MARGIN
KEY_LEN = 14      # (N, C_in, H, W, C_out, kH, kW, stride h, w, padding h, w, dilation h, w, groups)
_DTYPES = {torch.float16: "float16", torch.bfloat16: "bfloat16", torch.float32: "float32"}
#: ``measure_now``: samples per way, calls per sample (between one pair of CUDA events), and the largest input it
#: allocates for a shape (a larger one is left to the default rather than timed).
MEASURE_SAMPLES = 9
MEASURE_CALLS = 4
MEASURE_MAX_BYTES = 1 << 30
_MEASURED: dict[tuple, dict | None] = {}      # this process's rows timed by ``measure_now`` (None: could not be)


TableError = measured_tables.TableError


def _pair(v) -> tuple[int, int] | None:
    if isinstance(v, int) and not isinstance(v, bool):
        return (v, v)
    if isinstance(v, (tuple, list)) and len(v) == 2 and all(isinstance(i, int) and not isinstance(i, bool) for i in v):
        return (v[0], v[1])
    return None


def shape_key(x_shape: Sequence[int] | None, w_shape: Sequence[int] | None, stride, padding, dilation,
              groups: int) -> tuple[int, ...] | None:
    """The table's key for a grouped 2-D convolution of input ``x_shape`` (N, C_in, H, W) and weight ``w_shape``;
    None for anything else (one group: asked first, since the runtime selection asks on every conv call; not 2-D, a
    symbolic size, string padding)."""
    if groups <= 1 or x_shape is None or w_shape is None or len(x_shape) != 4 or len(w_shape) != 4:
        return None
    pairs = [_pair(v) for v in (stride, padding, dilation)]
    dims = tuple(x_shape) + (w_shape[0],) + tuple(w_shape[2:])
    if any(p is None for p in pairs) or not all(isinstance(d, int) for d in dims):
        return None
    return dims + pairs[0] + pairs[1] + pairs[2] + (int(groups),)


def _band_ok(band) -> bool:
    return (isinstance(band, dict) and set(band) >= {"median", "p20", "p80"}
            and all(isinstance(band[k], (int, float)) and band[k] >= 0 for k in ("median", "p20", "p80")))


def _row_ok(row: object) -> bool:
    return (isinstance(row, dict) and isinstance(row.get("device"), str) and row.get("dtype") in _DTYPES.values()
            and isinstance(row.get("key"), list) and len(row["key"]) == KEY_LEN
            and all(isinstance(k, int) and not isinstance(k, bool) for k in row["key"])
            and isinstance(row.get("residual"), bool) and isinstance(row.get("us"), dict)
            and set(row["us"]) == set(CANDIDATES) and all(_band_ok(b) for b in row["us"].values()))


TABLE = measured_tables.MeasuredTable(__package__, TABLE_FILE, TABLE_SCHEMA, _row_ok,
                                      lambda row: (row["device"], row["dtype"], tuple(row["key"]), row["residual"]),
                                      "(device, dtype, key, residual, us)")


def read_table(text: str, where: str = TABLE_FILE) -> dict[tuple, dict]:
    """The rows of a table (``TABLE_SCHEMA`` JSON) by ``(device, dtype, key, residual)``; ``TableError`` (one line)
    for anything else."""
    return TABLE.read(text, where)


def committed_table() -> dict[tuple, dict]:
    """The committed table (``explorer/fusions/conv_grouped_measured.json``); empty where the file is absent."""
    return TABLE.committed()


@contextlib.contextmanager
def measured_table(table: "str | os.PathLike | dict[tuple, dict]") -> Iterator[dict[tuple, dict]]:
    """``with measured_table(path):`` ``winner`` reads this table (a file, or ``read_table``'s rows) instead of the
    committed one; it is the whole truth then: a shape it lacks is not timed here (``winner``)."""
    with TABLE.swapped(table) as rows:
        yield rows


def best(row: dict) -> str:
    """What a row picks: ``"cudnn"`` where its median beats the pass's by more than ``MARGIN``, else ``"epilogue"``."""
    us = row["us"]
    return "cudnn" if us["cudnn"]["median"] < (1 - MARGIN) * us["epilogue"]["median"] else "epilogue"


def winner(device: torch.device, dtype: torch.dtype, key: tuple | None, residual: bool) -> str | None:
    """``"cudnn"`` or ``"epilogue"`` as the table measured this shape on ``device``'s GPU; None where it did not
    (or the device's name is unknown: a CUDA plan made on a machine without one, outside ``measured_table``)."""
    row = measured_row(device, dtype, key, residual)
    return None if row is None else best(row)


def measured_row(device: torch.device, dtype: torch.dtype, key: tuple | None, residual: bool) -> dict | None:
    """The row ``winner`` decides by: the table's for this shape on ``device``'s GPU, else its nearest batch, else
    one timed here now (once per process); None where there is none. Its ``key`` is the shape it was measured at
    (another batch for a nearest-batch row), its ``us`` both ways' µs per call: what a label cites."""
    if key is None or dtype not in _DTYPES:
        return None
    from explorer.fusions.attention import planned_device_name    # one notion of "the GPU a plan is for"
    name = planned_device_name(torch.device(device))
    if name is None:
        return None
    rows = TABLE.rows()
    row = rows.get((name, _DTYPES[dtype], tuple(key), bool(residual)))
    if row is None:                                         # the same conv at another batch: the nearest one
        near = _by_batch(rows).get((name, _DTYPES[dtype], tuple(key[1:]), bool(residual)), ())
        row = min(near, key=lambda t: (abs(t[0] - key[0]), t[0]))[1] if near else None
    if row is None and not TABLE.is_swapped() and _here(device, name):      # timed on this GPU, once per process
        where = (name, _DTYPES[dtype], tuple(key), bool(residual))
        if where not in _MEASURED:
            _MEASURED[where] = measure_now(torch.device(device), dtype, tuple(key), bool(residual))
        row = _MEASURED[where]
    return row


def _here(device, name: str) -> bool:
    """Whether ``name`` is the CUDA device present (not a plan made for another GPU); asked once per device and name
    (a selection at run time asks on every call)."""
    return _present(str(torch.device(device)), name)


@functools.lru_cache(maxsize=16)
def _present(device: str, name: str) -> bool:
    device = torch.device(device)
    if device.type != "cuda" or not torch.cuda.is_available():
        return False
    try:
        return torch.cuda.get_device_name(device) == name
    except (RuntimeError, AssertionError, ValueError):
        return False


def seeded_inputs(key: tuple, dtype: torch.dtype, device, copies: int = 1, residual: bool = False
                  ) -> tuple[list[torch.Tensor], torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Inputs of ``key``'s conv (channels_last, seeded by the key): ``copies`` inputs x (a benchmark rotates them past
    the L2), the weight at a 1/sqrt(fan-in) scale, a bias, and a residual z of the output's shape where asked."""
    n, c_in, h, w, c_out, kh, kw, sh, sw, ph, pw, dh, dw, groups = key
    gen = torch.Generator(device=device).manual_seed(sum(key))
    xs = [torch.randn((n, c_in, h, w), generator=gen, device=device, dtype=dtype).to(memory_format=torch.channels_last)
          for _ in range(copies)]
    fan_in = (c_in // groups) * kh * kw
    wt = (torch.randn((c_out, c_in // groups, kh, kw), generator=gen, device=device, dtype=dtype)
          * fan_in ** -0.5).to(memory_format=torch.channels_last)
    b = torch.randn(c_out, generator=gen, device=device, dtype=dtype) * 0.1
    z = None
    if residual:
        out = torch.conv2d(xs[0][:1], wt, None, [sh, sw], [ph, pw], [dh, dw], groups).shape
        z = torch.randn((n, *out[1:]), generator=gen, device=device, dtype=dtype).to(memory_format=torch.channels_last)
    return xs, wt, b, z


def measure_now(device: torch.device, dtype: torch.dtype, key: tuple, residual: bool) -> dict | None:
    """A table row for ``key`` timed on ``device`` now: cuDNN's fused call and the plain conv + our pass on seeded
    inputs of its shape (channels_last), a warm-up, then ``MEASURE_SAMPLES`` samples of each alternated, each
    ``MEASURE_CALLS`` calls between CUDA events; µs per call (median, p20, p80). None where it cannot be measured
    here: not CUDA, a stream capturing a CUDA graph, torch.compile tracing, an input over ``MEASURE_MAX_BYTES``, or
    a call that fails (the caller's default then)."""
    if device.type != "cuda" or not torch.cuda.is_available() or dtype not in _DTYPES:
        return None
    if torch.cuda.is_current_stream_capturing() or torch.compiler.is_compiling():
        return None
    n, c_in, h, w, c_out, kh, kw, sh, sw, ph, pw, dh, dw, groups = key
    size = torch.tensor([], dtype=dtype).element_size()
    if n * c_in * h * w * size > MEASURE_MAX_BYTES or c_in % groups or c_out % groups:
        return None
    from explorer.fusions import conv      # the module that asks (imported here: it imports this one)
    stride, padding, dilation = [sh, sw], [ph, pw], [dh, dw]
    try:
        with torch.inference_mode():
            (x,), wt, b, z = seeded_inputs(key, dtype, device, residual=residual)
            if residual:
                ways = {"cudnn": lambda: torch.cudnn_convolution_add_relu(x, wt, z, 1.0, b, stride, padding, dilation,
                                                                          groups)}
            else:
                ways = {"cudnn": lambda: torch.cudnn_convolution_relu(x, wt, b, stride, padding, dilation, groups)}
            ways["epilogue"] = lambda: conv.bias_act_(torch.conv2d(x, wt, None, stride, padding, dilation, groups),
                                                      b, z, "relu")
            for way in ways.values():           # warm-up: cuDNN's plans, the Triton pass's compile
                way()
                way()
            events = {k: [] for k in ways}
            for _ in range(MEASURE_SAMPLES):
                for k, way in ways.items():
                    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    start.record()
                    for _ in range(MEASURE_CALLS):
                        way()
                    end.record()
                    events[k].append((start, end))
            torch.cuda.synchronize(device)
    except (RuntimeError, ValueError, TypeError, NotImplementedError):   # the default stands; the run goes on
        return None
    us = {}
    for k, pairs in events.items():
        t = sorted(s.elapsed_time(e) * 1000 / MEASURE_CALLS for s, e in pairs)
        pick = lambda q: t[min(len(t) - 1, int(q * (len(t) - 1) + 0.5))]  # noqa: E731
        us[k] = {"median": pick(0.5), "p20": pick(0.2), "p80": pick(0.8)}
    return {"device": torch.cuda.get_device_name(device), "dtype": _DTYPES[dtype], "key": list(key),
            "residual": residual, "us": us, "measured": "now"}


def measured_here() -> dict[tuple, dict | None]:
    """The rows this process timed (``measure_now``), by (device, dtype, key, residual): a report or test reads them."""
    return dict(_MEASURED)


_INDEX: dict[int, tuple[dict, dict]] = {}


def _by_batch(rows: dict[tuple, dict]) -> dict[tuple, list[tuple[int, dict]]]:
    """``rows`` by (device, dtype, key without its batch, residual): the batches measured, each with its row (made
    once per table; a table swapped in by ``measured_table`` is indexed while it is alive)."""
    hit = _INDEX.get(id(rows))
    if hit is not None and hit[0] is rows:
        return hit[1]
    index: dict[tuple, list[tuple[int, dict]]] = {}
    for (name, dtype, key, residual), row in rows.items():
        index.setdefault((name, dtype, key[1:], residual), []).append((key[0], row))
    if len(_INDEX) > 8:
        _INDEX.clear()
    _INDEX[id(rows)] = (rows, index)
    return index
