"""Every grouped convolution of the corpus's RegNets and ResNeXts: cuDNN's fused conv+bias+ReLU against the plain
conv + our Triton bias+ReLU pass, per shape, on the GPU; writes the table ``conv.select_conv_epilogue`` reads.

Why: ``torch.cudnn_convolution_relu`` lets cuDNN's heuristics pick an engine, and for some grouped shapes that
engine is a generic one (RegNetX-32GF's grouped 3×3 convs: ``convolve_common_engine_float_NHWC``, 59.6 ms of a
34.7 ms forward's kernels, where the plain conv took 3.3 ms), while for others (ResNeXt's) the fused call is the
fast one. No rule on the shape separates them, so each shape is measured (``explorer/fusions/conv_measured.py``).

For each model (torchvision, weights=None, built on the meta device: only the shapes are needed) the grouped,
not depthwise, ``nn.Conv2d`` inputs are recorded at batch ``--batch`` and ``--image`` pixels; each distinct shape
is then, in fp16 and bf16, channels_last: checked against float64 (``conv.TOLERANCES``), and timed (warm-up, CUDA
events around every call, rounds alternating the variants, inputs rotated past the L2; median, p20, p80 in µs):

    cudnn      torch.cudnn_convolution_relu(x, w, b, ...)
    epilogue   torch.conv2d(x, w, None, ...) then conv.bias_act_(y, b, None, "relu")   (what the fused graph runs)

Usage (H200)::

    python3 benchmarks/bench_grouped_conv.py [--out PATH] [--table explorer/fusions/conv_grouped_measured.json]
                                             [--models regnet_x_32gf,...] [--budget-s 200] [--smoke]

``--smoke`` checks (no timing) two shapes on the CPU. Without a CUDA device (and no ``--smoke``) it measures
nothing and says so. Exit status 1 when any variant's check against float64 failed.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_kernels as bk  # noqa: E402
from benchmarks._common import bench_device, elapsed_logger, results_path, run_stamp, write_json  # noqa: E402
from explorer.fusions import conv, conv_measured  # noqa: E402

MODELS = ("regnet_x_400mf", "regnet_x_800mf", "regnet_x_1_6gf", "regnet_x_3_2gf", "regnet_x_8gf", "regnet_x_16gf",
          "regnet_x_32gf", "regnet_y_400mf", "regnet_y_800mf", "regnet_y_1_6gf", "regnet_y_3_2gf", "regnet_y_8gf",
          "regnet_y_16gf", "regnet_y_32gf", "regnet_y_128gf", "resnext50_32x4d", "resnext101_32x8d",
          "resnext101_64x4d")
DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16}


def grouped_shapes(name: str, batch: int, image: int) -> list[dict]:
    """The grouped, not depthwise, 2-D convs of torchvision's ``name`` with their input shapes (a forward on meta
    tensors; the model is built on the CPU with its weight initialisation skipped, then moved to meta: only the
    shapes are read)."""
    import unittest.mock

    import torchvision

    skip = [unittest.mock.patch.object(torch.nn.init, f, lambda t, *a, **k: t)
            for f in ("kaiming_normal_", "kaiming_uniform_", "normal_", "uniform_", "zeros_", "ones_", "constant_")]
    for p in skip:
        p.start()
    try:
        model = getattr(torchvision.models, name)(weights=None).eval().to("meta")
    finally:
        for p in skip:
            p.stop()
    found = []

    def hook(mod, args):
        x = args[0]
        if mod.groups > 1 and not conv.is_depthwise(x.shape[1], mod.weight.shape, mod.groups):
            found.append({"x": tuple(x.shape), "w": tuple(mod.weight.shape), "stride": tuple(mod.stride),
                          "padding": tuple(mod.padding), "dilation": tuple(mod.dilation), "groups": mod.groups})

    handles = [m.register_forward_pre_hook(hook) for m in model.modules() if isinstance(m, torch.nn.Conv2d)]
    with torch.no_grad():
        model(torch.empty(batch, 3, image, image, device="meta"))
    for h in handles:
        h.remove()
    return found


def measure_shape(s: dict, dtype: torch.dtype, device: str, smoke: bool, l2: int | None) -> dict:
    """One shape in one dtype: both variants checked against float64, then timed (not with ``smoke``)."""
    x_bytes = torch.Size(s["x"]).numel() * torch.tensor([], dtype=dtype).element_size()
    sets = 2 if smoke else bk.rotation(3 * x_bytes, l2, cap=8)
    key = conv_measured.shape_key(s["x"], s["w"], s["stride"], s["padding"], s["dilation"], s["groups"])
    xs, w, b, _ = conv_measured.seeded_inputs(key, dtype, device, copies=sets)     # drawn where they are used
    st, pad, dil, g = list(s["stride"]), list(s["padding"]), list(s["dilation"]), s["groups"]
    variants = {
        "cudnn": lambda i: torch.cudnn_convolution_relu(xs[i % sets], w, b, st, pad, dil, g),
        "epilogue": lambda i: conv.bias_act_(torch.conv2d(xs[i % sets], w, None, st, pad, dil, g), b, None, "relu"),
    }
    if device == "cpu":                                 # cuDNN is not here: the reference stands in, checked alike
        variants["cudnn"] = lambda i: conv.conv_epilogue_reference(xs[i % sets], w, b, None, st, pad, dil, g,
                                                                   act="relu")
    ref64 = conv.conv_epilogue_reference(xs[0].double(), w.double(), b.double(), None, st, pad, dil, g, act="relu")
    checks = {}
    for n, fn in variants.items():
        try:
            checks[n] = bk.error_vs(fn(0).float(), ref64, conv.TOLERANCES[dtype])
        except Exception as exc:                                            # noqa: BLE001 - recorded, not fatal
            checks[n] = {"ok": False, "error": f"{type(exc).__name__}: {str(exc)[:160]}"}
    row = {"dtype": str(dtype).replace("torch.", ""), "x": list(s["x"]), "w": list(s["w"]),
           "stride": st, "padding": pad, "dilation": dil, "groups": g, "check": checks, "us": None}
    if smoke or not all(c.get("ok") for c in checks.values()):
        return row
    timing = bk.time_variants(variants, reps=20, rounds=4, warmup_s=0.05)
    row["us"] = {n: {k: (v * 1000 if k != "n" else v) for k, v in t.items()} for n, t in timing.items()}
    return row


def table_rows(rows: list[dict], device_name: str) -> list[dict]:
    """The timed rows as ``conv_measured`` table rows (one per shape and dtype)."""
    out = []
    for r in rows:
        if r.get("us") is None:
            continue
        key = conv_measured.shape_key(r["x"], r["w"], r["stride"], r["padding"], r["dilation"], r["groups"])
        out.append({"device": device_name, "dtype": r["dtype"], "key": list(key), "residual": False,
                    "us": {n: {k: round(r["us"][n][k], 2) for k in ("median", "p20", "p80")}
                           for n in conv_measured.CANDIDATES}})
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None)
    ap.add_argument("--table", default=None, help="also write the conv_measured table here")
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--image", type=int, default=224)
    ap.add_argument("--budget-s", type=float, default=200.0)
    ap.add_argument("--smoke", action="store_true")
    args = ap.parse_args(argv)
    started = time.perf_counter()
    log = elapsed_logger(started)
    path = results_path(args.out, "bench_grouped_conv_smoke_cpu.json" if args.smoke else "bench_grouped_conv.json")
    device = bench_device("bench_grouped_conv", args.smoke)
    doc = {"schema": "bench_grouped_conv/1", **run_stamp(), "environment": bk.environment(),
           "settings": {"batch": args.batch, "image": args.image, "layout": "channels_last"}}
    if device is None:
        doc["skipped"] = "no CUDA device"
        write_json(path, doc)
        return 0
    models = [m for m in args.models.split(",") if m]
    shapes: dict[tuple, dict] = {}
    used_by: dict[tuple, list[str]] = {}
    for name in models:
        for s in grouped_shapes(name, 1 if args.smoke else args.batch, 32 if args.smoke else args.image):
            k = (s["x"], s["w"], s["stride"], s["padding"], s["dilation"], s["groups"])
            shapes.setdefault(k, s)
            used_by.setdefault(k, []).append(name)
    keys = list(shapes)[:2] if args.smoke else list(shapes)
    log(f"{len(keys)} distinct grouped conv shapes in {len(models)} models")
    l2 = torch.cuda.get_device_properties(0).L2_cache_size if device == "cuda" else None
    rows, stopped = [], None
    for i, k in enumerate(keys):
        for dname, dtype in DTYPES.items():
            if time.perf_counter() - started > args.budget_s:
                stopped = f"budget of {args.budget_s:.0f} s spent after {len(rows)} rows"
                break
            row = measure_shape(shapes[k], dtype, device, args.smoke, l2)
            row["models"] = sorted(set(used_by[k]))
            rows.append(row)
            if row["us"]:
                u = row["us"]
                log(f"[{i + 1}/{len(keys)}] {dname} x={row['x']} g={row['groups']}: cudnn {u['cudnn']['median']:.0f}"
                    f" µs, epilogue {u['epilogue']['median']:.0f} µs")
            else:
                log(f"[{i + 1}/{len(keys)}] {dname} x={row['x']} g={row['groups']}: checked {row['check']}")
            torch.cuda.empty_cache() if device == "cuda" else None
        if stopped:
            break
    doc.update(rows=rows, stopped=stopped, wall_s=round(time.perf_counter() - started, 1))
    name = torch.cuda.get_device_name(0) if device == "cuda" else None
    if name:
        doc["table"] = table_rows(rows, name)
        wins = sum(conv_measured.best(r) == "cudnn" for r in doc["table"])
        doc["summary"] = {"shapes_timed": len(doc["table"]), "cudnn_faster": wins,
                          "epilogue_faster_or_tied": len(doc["table"]) - wins,
                          "failed_checks": sum(not all(c.get("ok") for c in r["check"].values()) for r in rows)}
        print(doc["summary"])
        if args.table:
            write_json(Path(args.table), {"schema": conv_measured.TABLE_SCHEMA, "source": str(path.name),
                                          **run_stamp(), "rows": doc["table"]})
    write_json(path, doc)
    print(f"wrote {path}")
    failed = [r for r in rows if not all(c.get("ok") for c in r["check"].values())]
    for r in failed:
        print(f"FAILED check: {r['dtype']} x={r['x']} w={r['w']} g={r['groups']}: {r['check']}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
