"""Benchmark the fused kernels against the unfused ops they replace (CUDA only).

::

    add_layernorm   8192x4096 fp32/bf16: triton (num_warps sweep; and without writing the sum) | eager add+LN
                    | torch.compile(add+LN)
                    | device-to-device copy of the same byte count (the bandwidth ceiling)
    matmul_softmax  BERT scores B=32 H=12 S=128 D=64 fp16: triton | eager matmul,*,+,softmax
                    (+ attention: SDPA | explicit matmul/softmax/matmul)
    conv_epilogue   N=32 C=64 56x56 3x3 fp32/fp16, NCHW/NHWC: cudnn conv+relu, conv+add+relu | unfused
    linear_act      BERT FFN 4096x768 -> 3072 fp16 relu/gelu_tanh: cuBLASLt epilogue | linear then act

Every variant is first checked against float64 (the tolerances declared beside
each kernel), then timed: warm-up, CUDA events around every call, several
rounds that alternate the variants, inputs rotated over enough copies that the
L2 cache cannot serve them; reported as median with p20/p80. Throughput comes
from an explicit byte model per variant (``bytes``) and, for comparison, from
the minimal "useful" traffic of the fused op (``useful_gbps``). The kernel count
per call is read with the profiler.

Usage::

    python benchmarks/bench_kernels.py [--out PATH] [--quick] [--only add_layernorm,conv,...]

Without a CUDA device nothing is timed: it says so, runs the small CPU
correctness checks with ``--quick``, writes a JSON that says ``measured: false``
and exits 0. Writes JSON (default ``$OUT/bench_kernels.json`` when ``$OUT`` is
set, else ``benchmarks/results/bench_kernels.json``) with the command line, UTC
date, GPU, driver/CUDA/cuDNN/torch/triton versions and every number, and prints
a table at the end. Under 3 minutes on an H200.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import math
import os
import platform
import shlex
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from explorer.fusions import attention as mms  # noqa: E402
from explorer.fusions import conv  # noqa: E402
from explorer.fusions.kernels import linear_act as linear  # noqa: E402 (the linear + activation call)
from explorer.fusions import norm as aln  # noqa: E402

SECTIONS = ("add_layernorm", "matmul_softmax", "conv", "linear")
#: Nominal peak HBM bandwidth (bytes/s) by device name fragment, for reference only:
#: the ceiling the report uses is the measured device-to-device copy.
NOMINAL_HBM_BYTES_PER_S = {"H200": 4.8e12, "H100": 3.35e12, "A100": 2.0e12}
TARGET_FRACTION_OF_COPY = 0.90
#: fp32 convs/GEMMs with TF32 allowed (torch's default for cuDNN) are checked at TF32 accuracy.
TF32_TOLERANCE = dict(rtol=1e-2, atol=1e-2)


# ----------------------------------------------------------------------------- environment

def environment() -> dict:
    env = {
        "command": " ".join(shlex.quote(a) for a in [sys.executable] + sys.argv),
        "date_utc": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "host": platform.node(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda_runtime": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "cudnn_allow_tf32": torch.backends.cudnn.allow_tf32,
        "matmul_allow_tf32": torch.backends.cuda.matmul.allow_tf32,
    }
    try:
        import triton
        env["triton"] = triton.__version__
    except Exception as exc:  # the fused Triton kernels are then not measured
        env["triton"] = f"unavailable: {exc}"
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        env.update(gpu=props.name, sm_count=props.multi_processor_count,
                   memory_bytes=props.total_memory, l2_bytes=getattr(props, "L2_cache_size", None),
                   capability=f"{props.major}.{props.minor}")
        try:
            env["driver"] = subprocess.run(
                ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                capture_output=True, text=True, timeout=20).stdout.strip().splitlines()[0]
        except Exception as exc:
            env["driver"] = f"unknown ({exc.__class__.__name__})"
        env["nominal_hbm_bytes_per_s"] = next(
            (v for k, v in NOMINAL_HBM_BYTES_PER_S.items() if k in props.name), None)
    return env


# ----------------------------------------------------------------------------- timing

def quantiles(times_ms: list[float]) -> dict:
    t = torch.tensor(times_ms, dtype=torch.float64)
    q = torch.quantile(t, torch.tensor([0.5, 0.2, 0.8], dtype=torch.float64)).tolist()
    return {"median": q[0], "p20": q[1], "p80": q[2], "n": len(times_ms)}


def time_variants(variants: dict[str, Callable[[int], object]], reps: int, rounds: int,
                  warmup_s: float) -> dict[str, dict]:
    """Per-call CUDA-event times of each variant; rounds alternate the order of the variants.

    Each ``fn(i)`` must use input set ``i`` modulo its rotation, so that consecutive
    calls do not find their inputs in L2.
    """
    for fn in variants.values():                          # warm-up (and compile)
        fn(0)
        torch.cuda.synchronize()
        t0, i = time.perf_counter(), 1
        while time.perf_counter() - t0 < warmup_s or i < 3:
            fn(i)
            i += 1
            torch.cuda.synchronize()
    names = list(variants)
    times = {n: [] for n in names}
    for r in range(rounds):
        order = names[r % len(names):] + names[:r % len(names)]
        if r % 2:
            order.reverse()
        for name in order:
            fn = variants[name]
            starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
            ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
            for i in range(reps):
                starts[i].record()
                fn(i)
                ends[i].record()
            torch.cuda.synchronize()
            times[name] += [s.elapsed_time(e) for s, e in zip(starts, ends)]
    return {n: quantiles(t) for n, t in times.items()}


def kernels_per_call(fn: Callable[[int], object]) -> int | None:
    """Number of GPU kernels (and memsets/copies) one call launches, from the profiler."""
    try:
        from torch.profiler import ProfilerActivity

        from explorer.runtime.measure import profiling
        fn(0)
        torch.cuda.synchronize()
        with profiling([ProfilerActivity.CUDA]) as prof:
            fn(1)
            torch.cuda.synchronize()
        return sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)
    except Exception:
        return None


def rotation(bytes_per_set: int, l2_bytes: int | None, cap: int = 16) -> int:
    """Input sets needed so that one pass over them is >= 3x the L2 size."""
    l2 = l2_bytes or 64 * 2**20
    return max(2, min(cap, math.ceil(3 * l2 / max(bytes_per_set, 1))))


def error_vs(out: torch.Tensor, ref64: torch.Tensor, tol: dict) -> dict:
    out64 = out.detach().double()
    ref64 = ref64.to(out64.device)
    diff = (out64 - ref64).abs()
    finite = bool(torch.isfinite(out64).all())
    ok = finite and bool((diff <= tol["atol"] + tol["rtol"] * ref64.abs()).all())
    return {"max_abs": diff.max().item(), "max_rel": (diff / ref64.abs().clamp_min(1e-6)).max().item(),
            "tolerance": tol, "ok": ok}


def summarize(name: str, timing: dict, bytes_moved: int | None, useful_bytes: int | None,
              flops: float | None = None) -> dict:
    s = timing["median"] * 1e-3
    row = {"variant": name, "ms": timing, "bytes": bytes_moved}
    if bytes_moved:
        row["gbps"] = bytes_moved / s / 1e9
    if useful_bytes:
        row["useful_gbps"] = useful_bytes / s / 1e9
    if flops:
        row["tflops"] = flops / s / 1e12
    return row


# ----------------------------------------------------------------------------- sections

def bench_add_layernorm(env, quick: bool) -> list[dict]:
    rows_n, hidden = (2048, 4096) if quick else (8192, 4096)
    out = []
    for dtype in (torch.float32, torch.bfloat16):
        es = torch.tensor([], dtype=dtype).element_size()
        mn = rows_n * hidden
        useful = 4 * mn * es + 2 * hidden * es               # read x, r; write sum, y; read γ, β
        eager_bytes = 5 * mn * es + 2 * hidden * es           # add: 2R 1W; layer_norm: 1R 1W (+γ, β)
        useful_no_sum = 3 * mn * es + 2 * hidden * es         # read x, r; write y; read γ, β
        n_sets = rotation(2 * mn * es, env.get("l2_bytes"))
        gen = torch.Generator(device="cuda").manual_seed(0)
        xs = [torch.randn(rows_n, hidden, device="cuda", dtype=dtype, generator=gen) for _ in range(n_sets)]
        rs = [torch.randn(rows_n, hidden, device="cuda", dtype=dtype, generator=gen) for _ in range(n_sets)]
        w = 1 + 0.1 * torch.randn(hidden, device="cuda", dtype=dtype, generator=gen)
        b = 0.1 * torch.randn(hidden, device="cuda", dtype=dtype, generator=gen)
        src = [torch.empty(2 * mn, device="cuda", dtype=dtype).copy_(torch.cat([x.view(-1), r.view(-1)]))
               for x, r in zip(xs, rs)]
        dst = torch.empty(2 * mn, device="cuda", dtype=dtype)
        compiled = torch.compile(aln.add_layernorm_reference, dynamic=False)
        block, default_warps = aln.launch_config(hidden)
        default_rows = aln.DEFAULT_ROWS_PER_PROGRAM
        variants = {
            f"triton (num_warps={default_warps}, rows={default_rows}, default)":
                lambda i: aln.add_layernorm(xs[i % n_sets], rs[i % n_sets], w, b, 1e-5),
        }
        for rows in (1, 2, 4):
            if rows != default_rows and not quick:
                variants[f"triton (num_warps={default_warps}, rows={rows})"] = (
                    lambda i, rows=rows: aln.add_layernorm(xs[i % n_sets], rs[i % n_sets], w, b, 1e-5,
                                                           rows_per_prog=rows))
        for nw in (4, 8, 16):
            if nw != default_warps and not quick:
                variants[f"triton (num_warps={nw})"] = (
                    lambda i, nw=nw: aln.add_layernorm(xs[i % n_sets], rs[i % n_sets], w, b, 1e-5, num_warps=nw))
        variants["triton, sum not written (keep_sum=False)"] = (
            lambda i: aln.add_layernorm(xs[i % n_sets], rs[i % n_sets], w, b, 1e-5, keep_sum=False))
        variants["eager add + layer_norm"] = lambda i: aln.add_layernorm_reference(xs[i % n_sets], rs[i % n_sets], w, b, 1e-5)
        variants["torch.compile(add + layer_norm)"] = lambda i: compiled(xs[i % n_sets], rs[i % n_sets], w, b, 1e-5)
        variants["copy (same bytes)"] = lambda i: dst.copy_(src[i % n_sets])

        s64, y64 = aln.add_layernorm_reference(xs[0].double(), rs[0].double(), w.double(), b.double(), 1e-5)
        checks = {}
        for name, fn in variants.items():
            if name.startswith("copy"):
                continue
            try:
                s, y = fn(0)
                e_y = error_vs(y, y64, aln.TOLERANCES[dtype])
                e_s = error_vs(s, s64, aln.TOLERANCES[dtype]) if s is not None else {"ok": True, "not_written": True}
                checks[name] = {"sum": e_s, "normed": e_y, "ok": e_s["ok"] and e_y["ok"]}
            except Exception as exc:
                checks[name] = {"ok": False, "error": f"{exc.__class__.__name__}: {exc}"}
        del s64, y64
        torch.cuda.empty_cache()
        runnable = {n: f for n, f in variants.items() if "error" not in checks.get(n, {})}
        t0 = time.perf_counter()
        timing = time_variants(runnable, reps=20 if quick else 50, rounds=3 if quick else 5,
                               warmup_s=0.1 if quick else 0.3)
        copy_bytes = 2 * src[0].numel() * es                  # read + write of 2·M·N elements
        copy_gbps = copy_bytes / (timing["copy (same bytes)"]["median"] * 1e-3) / 1e9
        results = []
        for name, t in timing.items():
            nbytes = eager_bytes if name.startswith("eager") else copy_bytes if name.startswith("copy") else useful
            if "sum not written" in name:  # 2R + 1W: what it moves, and all that its caller needs
                nbytes = useful_no_sum
            row = summarize(name, t, nbytes, useful_no_sum if "sum not written" in name else useful)
            row["fraction_of_copy"] = row["useful_gbps"] / copy_gbps
            row["kernels_per_call"] = kernels_per_call(runnable[name])
            row["check"] = checks.get(name)
            results.append(row)
        best = max((r for r in results if r["variant"].startswith("triton") and "sum not written" not in r["variant"]
                    and r["check"]["ok"]),
                   key=lambda r: r["useful_gbps"], default=None)
        out.append({
            "section": "add_layernorm", "dtype": str(dtype).replace("torch.", ""),
            "shape": [rows_n, hidden], "input_sets": n_sets, "impl": aln.select_add_layer_norm("cuda", hidden, dtype).label,
            "launch_config": dict(zip(("BLOCK", "num_warps"), aln.launch_config(hidden))),
            "byte_model": {"useful (fused: 2R+2W+weights)": useful, "eager (5 transfers+weights)": eager_bytes,
                           "sum not written (2R+1W+weights)": useful_no_sum},
            "copy_gbps": copy_gbps, "target_fraction_of_copy": TARGET_FRACTION_OF_COPY,
            "default_meets_target": any(r["variant"].endswith("default)") and r["check"]["ok"]
                                        and r["fraction_of_copy"] >= TARGET_FRACTION_OF_COPY for r in results),
            "best_triton": best and best["variant"], "results": results,
            "seconds": time.perf_counter() - t0,
        })
        del xs, rs, src, dst
        torch.cuda.empty_cache()
    return out


def bench_matmul_softmax(env, quick: bool) -> list[dict]:
    B, H, S, D = (8, 12, 128, 64) if quick else (32, 12, 128, 64)
    dtype = torch.float16
    es = 2
    gen = torch.Generator(device="cuda").manual_seed(1)
    per_set = (2 * B * H * S * D + B * S) * es
    n_sets = rotation(per_set, env.get("l2_bytes"))
    qs = [torch.randn(B, H, S, D, device="cuda", dtype=dtype, generator=gen) for _ in range(n_sets)]
    ks = [torch.randn(B, H, S, D, device="cuda", dtype=dtype, generator=gen) for _ in range(n_sets)]
    vs = [torch.randn(B, H, S, D, device="cuda", dtype=dtype, generator=gen) for _ in range(n_sets)]
    mask = torch.zeros(B, 1, 1, S, device="cuda", dtype=dtype)
    mask[: B // 2, ..., S - S // 4:] = float("-inf")          # half the batch padded by a quarter
    scale = D ** -0.5
    kts = [k.transpose(-2, -1) for k in ks]                   # (B, H, D, S) views, no copy
    scores = B * H * S * S * es
    qk_bytes = 2 * B * H * S * D * es + B * S * es
    fused_bytes = qk_bytes + scores                            # read q, k, mask; write P
    eager_bytes = qk_bytes + scores * 7                       # matmul W; *scale R W; +mask R W; softmax R W
    flops = 2 * B * H * S * S * D
    variants = {
        "triton matmul+scale+mask+softmax": lambda i: mms.matmul_softmax(qs[i % n_sets], kts[i % n_sets], scale, mask),
        "eager matmul, *, +, softmax": lambda i: mms.matmul_softmax_reference(qs[i % n_sets], kts[i % n_sets], scale, mask),
    }
    p64 = mms.matmul_softmax_reference(qs[0].double(), kts[0].double(), scale, mask.double())
    checks = {}
    for name, fn in variants.items():
        try:
            checks[name] = error_vs(fn(0), p64, mms.TOLERANCES[dtype])
        except Exception as exc:
            checks[name] = {"ok": False, "error": f"{exc.__class__.__name__}: {exc}"}
    att_variants = {
        "SDPA attention": lambda i: mms.attention(qs[i % n_sets], ks[i % n_sets], vs[i % n_sets], scale, mask),
        "explicit attention": lambda i: mms.attention_reference(qs[i % n_sets], ks[i % n_sets], vs[i % n_sets], scale, mask),
    }
    o64 = mms.attention_reference(qs[0].double(), ks[0].double(), vs[0].double(), scale, mask.double())
    for name, fn in att_variants.items():
        try:
            checks[name] = error_vs(fn(0), o64, mms.ATTENTION_TOLERANCES[dtype])
        except Exception as exc:
            checks[name] = {"ok": False, "error": f"{exc.__class__.__name__}: {exc}"}
    del p64, o64
    runnable = {n: f for n, f in {**variants, **att_variants}.items() if "error" not in checks[n]}
    t0 = time.perf_counter()
    timing = time_variants(runnable, reps=30 if quick else 100, rounds=3 if quick else 5, warmup_s=0.1 if quick else 0.3)
    att_bytes = 4 * B * H * S * D * es + B * S * es          # q, k, v, mask read; o written
    results = []
    for name, t in timing.items():
        if name in variants:
            row = summarize(name, t, fused_bytes if name.startswith("triton") else eager_bytes, fused_bytes, flops)
        else:
            row = summarize(name, t, att_bytes if name.startswith("SDPA") else att_bytes + 8 * scores,
                            att_bytes, 2 * flops)
        row["kernels_per_call"] = kernels_per_call(runnable[name])
        row["check"] = checks[name]
        results.append(row)
    return [{"section": "matmul_softmax", "dtype": "float16", "shape": {"B": B, "H": H, "S": S, "D": D},
             "impl": mms.select_for_tensors(qs[0], kts[0], mask).label, "launch_config": mms.launch_config(S, D, es),
             "input_sets": n_sets,
             "byte_model": {"fused": fused_bytes, "eager": eager_bytes, "attention_io": att_bytes},
             "results": results, "seconds": time.perf_counter() - t0}]


def bench_conv(env, quick: bool) -> list[dict]:
    N, C, HW = (8, 64, 56) if quick else (32, 64, 56)
    out = []
    for dtype in (torch.float32, torch.float16):
        for channels_last in (False, True):
            fmt = torch.channels_last if channels_last else torch.contiguous_format
            es = torch.tensor([], dtype=dtype).element_size()
            act_bytes = N * C * HW * HW * es
            n_sets = rotation(2 * act_bytes, env.get("l2_bytes"))
            gen = torch.Generator(device="cuda").manual_seed(2)
            xs = [torch.randn(N, C, HW, HW, device="cuda", dtype=dtype, generator=gen).to(memory_format=fmt)
                  for _ in range(n_sets)]
            zs = [torch.randn(N, C, HW, HW, device="cuda", dtype=dtype, generator=gen).to(memory_format=fmt)
                  for _ in range(n_sets)]
            w = (torch.randn(C, C, 3, 3, device="cuda", dtype=dtype, generator=gen) / 24).to(memory_format=fmt)
            b = torch.randn(C, device="cuda", dtype=dtype, generator=gen)
            args = (1, 1, 1, 1)
            variants = {
                "cudnn conv+bias+relu": lambda i: conv.conv_epilogue(xs[i % n_sets], w, b, None, *args, act="relu"),
                "conv, relu (unfused)": lambda i: conv.conv_epilogue_reference(xs[i % n_sets], w, b, None, *args, act="relu"),
                "cudnn conv+bias+add+relu": lambda i: conv.conv_epilogue(
                    xs[i % n_sets], w, b, zs[i % n_sets], *args, act="relu"),
                "conv, add, relu (unfused)": lambda i: conv.conv_epilogue_reference(
                    xs[i % n_sets], w, b, zs[i % n_sets], *args, act="relu"),
            }
            x64, w64, b64, z64 = xs[0].double(), w.double(), b.double(), zs[0].double()
            refs = {"relu": conv.conv_epilogue_reference(x64, w64, b64, None, *args, act="relu"),
                    "add": conv.conv_epilogue_reference(x64, w64, b64, z64, *args, act="relu")}
            tol = TF32_TOLERANCE if dtype == torch.float32 and torch.backends.cudnn.allow_tf32 else conv.TOLERANCES[dtype]
            checks = {}
            for name, fn in variants.items():
                try:
                    checks[name] = error_vs(fn(0), refs["add" if "add" in name else "relu"], tol)
                except Exception as exc:
                    checks[name] = {"ok": False, "error": f"{exc.__class__.__name__}: {exc}"}
            del refs, x64, z64
            runnable = {n: f for n, f in variants.items() if "error" not in checks[n]}
            t0 = time.perf_counter()
            timing = time_variants(runnable, reps=20 if quick else 40, rounds=3 if quick else 4,
                                   warmup_s=0.1 if quick else 0.2)
            flops = 2 * N * C * C * 9 * HW * HW
            results = []
            for name, t in timing.items():
                adds = "add" in name
                fused = name.startswith("cudnn")
                # x read + y written, + z read with add; unfused: each extra op reads and writes y once more
                nbytes = act_bytes * (2 + adds) + (0 if fused else act_bytes * 2 * (1 + adds))
                row = summarize(name, t, nbytes, act_bytes * (2 + adds), flops)
                row["kernels_per_call"] = kernels_per_call(runnable[name])
                row["check"] = checks[name]
                results.append(row)
            out.append({"section": "conv", "dtype": str(dtype).replace("torch.", ""),
                        "memory_format": "channels_last" if channels_last else "nchw",
                        "shape": {"N": N, "C": C, "H": HW, "W": HW, "k": 3},
                        "labels": {"relu": conv.select_conv_epilogue("cuda", dtype, "relu").label,
                                   "add_relu": conv.select_conv_epilogue("cuda", dtype, "relu", residual=True).label},
                        "input_sets": n_sets, "results": results, "seconds": time.perf_counter() - t0})
            del xs, zs
            torch.cuda.empty_cache()
    return out


def bench_linear(env, quick: bool) -> list[dict]:
    rows_n, d_in, d_out = (1024, 768, 3072) if quick else (4096, 768, 3072)
    dtype = torch.float16
    es = 2
    gen = torch.Generator(device="cuda").manual_seed(3)
    n_sets = rotation(rows_n * d_in * es, env.get("l2_bytes"))
    xs = [torch.randn(rows_n, d_in, device="cuda", dtype=dtype, generator=gen) for _ in range(n_sets)]
    w = torch.randn(d_out, d_in, device="cuda", dtype=dtype, generator=gen) / d_in ** 0.5
    b = torch.randn(d_out, device="cuda", dtype=dtype, generator=gen)
    out_bytes = rows_n * d_out * es
    io = rows_n * d_in * es + d_out * d_in * es + out_bytes
    flops = 2 * rows_n * d_in * d_out
    sections = []
    for act in ("relu", "gelu_tanh", "gelu"):
        variants = {
            f"linear_act ({act})": lambda i, act=act: linear.linear_act(xs[i % n_sets], w, b, act),
            f"linear, {act} (unfused)": lambda i, act=act: linear.linear_act_reference(xs[i % n_sets], w, b, act),
        }
        ref64 = linear.linear_act_reference(xs[0].double(), w.double(), b.double(), act)
        checks = {}
        for name, fn in variants.items():
            try:
                checks[name] = error_vs(fn(0), ref64, linear.TOLERANCES[dtype])
            except Exception as exc:
                checks[name] = {"ok": False, "error": f"{exc.__class__.__name__}: {exc}"}
        runnable = {n: f for n, f in variants.items() if "error" not in checks[n]}
        t0 = time.perf_counter()
        timing = time_variants(runnable, reps=30 if quick else 60, rounds=3 if quick else 4,
                               warmup_s=0.1 if quick else 0.2)
        label = linear.select_linear_act("cuda", dtype, act).label
        results = []
        for name, t in timing.items():
            fused = name.startswith("linear_act") and label.startswith("cuBLASLt")
            row = summarize(name, t, io + (0 if fused else 2 * out_bytes), io, flops)
            row["kernels_per_call"] = kernels_per_call(runnable[name])
            row["check"] = checks[name]
            results.append(row)
        sections.append({"section": "linear", "dtype": "float16", "act": act, "label": label,
                         "gelu_epilogue_variant": linear.gelu_epilogue_variant("cuda", dtype),
                         "shape": [rows_n, d_in, d_out], "results": results, "seconds": time.perf_counter() - t0})
    return sections


# ----------------------------------------------------------------------------- CPU smoke

def cpu_correctness() -> list[dict]:
    """Small correctness checks of whatever path runs here (no timing)."""
    gen = torch.Generator().manual_seed(0)
    checks = []
    x, r = torch.randn(3, 1000, generator=gen), torch.randn(3, 1000, generator=gen)
    s, y = aln.add_layernorm(x, r, None, None)
    _, y64 = aln.add_layernorm_reference(x.double(), r.double(), None, None)
    checks.append({"op": "add_layernorm", "impl": aln.select_add_layer_norm("cpu", 1000, x.dtype).impl,
                   **error_vs(y, y64, aln.TOLERANCES[torch.float32])})
    a, bm = torch.randn(2, 17, 24, generator=gen), torch.randn(2, 24, 45, generator=gen)
    p = mms.matmul_softmax(a, bm, 0.2)
    checks.append({"op": "matmul_softmax", "impl": mms.select_for_tensors(a, bm).impl,
                   **error_vs(p, mms.matmul_softmax_reference(a.double(), bm.double(), 0.2), mms.TOLERANCES[torch.float32])})
    xc, wc, bc = torch.randn(2, 3, 7, 9, generator=gen), torch.randn(17, 3, 3, 3, generator=gen), torch.randn(17, generator=gen)
    yc = conv.conv_epilogue(xc, wc, bc, None, 2, 1, 1, 1, "relu")
    checks.append({"op": "conv_bias_act", "impl": conv.select_conv_epilogue("cpu", torch.float32, "relu").label,
                   **error_vs(yc, conv.conv_epilogue_reference(xc.double(), wc.double(), bc.double(), None, 2, 1, 1, 1, "relu"),
                              conv.TOLERANCES[torch.float32])})
    return checks


# ----------------------------------------------------------------------------- report

def print_table(report: dict) -> None:
    print(f"\n{'section':<15} {'case':<26} {'variant':<40} {'median ms':>10} {'p20':>9} {'p80':>9} "
          f"{'GB/s':>8} {'useful':>8} {'%copy':>6} {'kern':>4} {'ok':>3}")
    for sec in report["sections"]:
        case = " ".join(str(sec.get(k)) for k in ("dtype", "memory_format", "act") if sec.get(k))
        for row in sec.get("results", []):
            ms = row["ms"]
            frac = row.get("fraction_of_copy")
            check = row.get("check") or {}
            print(f"{sec['section']:<15} {case:<26} {row['variant'][:40]:<40} {ms['median']:>10.4f} "
                  f"{ms['p20']:>9.4f} {ms['p80']:>9.4f} {row.get('gbps', 0):>8.0f} {row.get('useful_gbps', 0):>8.0f} "
                  f"{(f'{100 * frac:.0f}' if frac else ''):>6} {str(row.get('kernels_per_call') or ''):>4} "
                  f"{('' if not check else 'yes' if check.get('ok') else 'NO'):>3}")
    for sec in report["sections"]:
        if sec["section"] == "add_layernorm":
            print(f"add_layernorm {sec['dtype']}: copy ceiling {sec['copy_gbps']:.0f} GB/s; default Triton config "
                  f"{'meets' if sec['default_meets_target'] else 'MISSES'} {TARGET_FRACTION_OF_COPY:.0%} of it; "
                  f"best Triton: {sec['best_triton']}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    default_out = (Path(os.environ["OUT"]) / "bench_kernels.json" if os.environ.get("OUT")
                   else Path(__file__).resolve().parent / "results" / "bench_kernels.json")
    parser.add_argument("--out", type=Path, default=default_out)
    parser.add_argument("--quick", action="store_true", help="small shapes and few repetitions (smoke test)")
    parser.add_argument("--only", default=",".join(SECTIONS), help=f"comma-separated subset of {SECTIONS}")
    args = parser.parse_args(argv)
    wanted = [s.strip() for s in args.only.split(",") if s.strip()]
    unknown = sorted(set(wanted) - set(SECTIONS))
    if unknown:
        parser.error(f"unknown section(s) {unknown}; known: {SECTIONS}")

    report = {"environment": environment(), "quick": args.quick, "sections": []}
    t_start = time.perf_counter()
    if not torch.cuda.is_available():
        print("no CUDA device: nothing measured")
        report["measured"] = False
        if args.quick:
            report["cpu_correctness"] = cpu_correctness()
            for c in report["cpu_correctness"]:
                print(f"  correctness {c['op']:<15} impl={c['impl']:<40} max_abs={c['max_abs']:.2e} ok={c['ok']}")
    else:
        report["measured"] = True
        runners = {"add_layernorm": bench_add_layernorm, "matmul_softmax": bench_matmul_softmax,
                   "conv": bench_conv, "linear": bench_linear}
        for name in wanted:
            t0 = time.perf_counter()
            try:
                report["sections"] += runners[name](report["environment"], args.quick)
            except Exception as exc:  # keep the other sections' numbers
                report["sections"].append({"section": name, "error": f"{exc.__class__.__name__}: {exc}"})
                print(f"{name}: FAILED: {exc.__class__.__name__}: {exc}", file=sys.stderr)
            print(f"[{name}: {time.perf_counter() - t0:.1f} s]", file=sys.stderr)
            torch.cuda.empty_cache()
        print_table(report)
    report["total_seconds"] = time.perf_counter() - t_start
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1, default=str))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
