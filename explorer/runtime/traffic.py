"""Memory traffic before and after fusion: the byte model per chain and in total, and DRAM bytes measured by Nsight Compute.

The seed's table 内存访问量 (ResNet-50 约 1.2 GB → 约 0.7 GB) on the loaded model:

- **The byte model** (``traffic_table``): each op reads its inputs and weights
  once and writes its outputs once (``explorer.graph.build``), scaled to the
  dtype by ``measure.graph_bytes``; a fused chain moves its ops' bytes minus
  what ``Chain.bytes_saved`` says fusion removes (the intermediates no longer
  written and read back). The totals are exactly the run report's
  ``bytes_moved`` of the unfused and fused models.
- **Measured DRAM bytes** (``measure_dram_bytes``, on a GPU with Nsight
  Compute): one forward of the prepared model in a child process under
  ``ncu --metrics dram__bytes_read.sum,dram__bytes_write.sum --clock-control
  none --cache-control none --profile-from-start off``: only the forward
  between ``cudaProfilerStart`` and ``cudaProfilerStop`` is profiled (the
  warm-up is not), and caches are not flushed between kernels, as in a real
  forward. ``parse_ncu_csv`` reads ncu's CSV.

Why the two differ (``explain_difference``): the byte model charges every
tensor to device memory (DRAM/HBM), but a tensor that the next kernel reads
while it is still in the L2 cache (60 MB on an H200) never reaches DRAM, so
the measured bytes are lower, most for small intermediates; and kernels may
read a tensor more than once (tiling, im2col, workspaces, layout changes) or
not at all, which the model does not count.

Run as ``python -m explorer.runtime.traffic --ncu-child '<json>'`` this module
is the small script ncu profiles (``_ncu_child``).
"""

from __future__ import annotations

import csv
import glob
import io
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Iterable

import torch

from explorer.messages import NCU
from explorer.runtime import measure as m

ROOT = Path(__file__).resolve().parents[2]
METRICS = ("dram__bytes_read.sum", "dram__bytes_write.sum")
BYTE_MODEL_NOTE = ("byte model: each op reads its inputs and weights once and writes its outputs once (graph "
                   "captured in float32, floating tensors scaled to the dtype); a fused chain saves its "
                   "intermediates' write and read-back (Chain.bytes_saved)")
_UNITS = {"byte": 1, "b": 1, "kbyte": 1e3, "kb": 1e3, "mbyte": 1e6, "mb": 1e6, "gbyte": 1e9, "gb": 1e9,
          "tbyte": 1e12, "tb": 1e12, "kibyte": 1024, "mibyte": 1024 ** 2, "gibyte": 1024 ** 3}


# ------------------------------------------------------------------ the byte model

def chain_bytes(graph: Any, chain: Any, dtype: torch.dtype) -> tuple[int, int]:
    """(bytes unfused, bytes fused) of one chain by the byte model, in ``dtype``."""
    before = m.graph_bytes(graph, dtype, chain.compute_nodes)
    return int(before), int(round(before - chain.bytes_saved * m.element_ratio(dtype)))


def traffic_table(graph: Any, detection: Any, chain_ids: Iterable[str], dtype: torch.dtype) -> dict[str, Any]:
    """Bytes before and after, per fused chain and for the whole model, from the byte model.

    ``chain_ids`` are the chains fused (a plan's accepted chains that applied).
    Returns {"chains": [{id, pattern, title, bytes_unfused, bytes_fused,
    bytes_saved, fraction_saved}], "total": {bytes_unfused, bytes_fused,
    bytes_saved, fraction_saved}, "note"}; the totals equal the run report's
    ``bytes_moved`` (``measure.graph_bytes`` and the chains' ``bytes_saved``).
    """
    ids = set(chain_ids)
    ratio = m.element_ratio(dtype)
    rows = []
    for chain in detection.accepted_chains(ids):
        before, after = chain_bytes(graph, chain, dtype)
        rows.append({"id": chain.id, "pattern": chain.pattern, "title": chain.title, "bytes_unfused": before,
                     "bytes_fused": after, "bytes_saved": before - after,
                     "fraction_saved": (before - after) / before if before else 0.0})
    total_before = int(m.graph_bytes(graph, dtype))
    saved = int(round(sum(c.bytes_saved for c in detection.accepted_chains(ids)) * ratio))
    total = {"bytes_unfused": total_before, "bytes_fused": total_before - saved, "bytes_saved": saved,
             "fraction_saved": saved / total_before if total_before else 0.0}
    return {"chains": rows, "total": total, "note": BYTE_MODEL_NOTE}


# ------------------------------------------------------------------ Nsight Compute

def find_ncu() -> str | None:
    """The ``ncu`` executable: on the PATH, else under the usual CUDA and Nsight Compute folders."""
    exe = shutil.which("ncu")
    if exe:
        return exe
    for pattern in ("/usr/local/cuda/bin/ncu", "/usr/local/cuda-*/bin/ncu", "/opt/nvidia/nsight-compute/*/ncu"):
        found = sorted(glob.glob(pattern))
        if found:
            return found[-1]
    return None


def ncu_command(ncu: str, log_file: str, child_args: dict[str, Any], python: str | None = None) -> list[str]:
    """The ncu command line that profiles one forward (``_ncu_child``) for DRAM bytes, CSV into ``log_file``."""
    return [ncu, "--metrics", ",".join(METRICS), "--clock-control", "none", "--cache-control", "none",
            "--profile-from-start", "off", "--csv", "--print-units", "base", "--log-file", log_file,
            python or sys.executable, "-m", "explorer.runtime.traffic", "--ncu-child", json.dumps(child_args)]


def _number(text: str) -> float | None:
    text = (text or "").strip().replace(",", "")
    try:
        return float(text)
    except ValueError:
        return None


def parse_ncu_csv(text: str) -> dict[str, Any]:
    """DRAM bytes read and written per kernel from ncu's CSV (``--csv``, page ``details`` or ``raw``).

    Lines before the CSV header (``==PROF==`` messages, the program's own
    output) are skipped; values are scaled by their unit (``byte``, ``Kbyte``,
    ...; ``--print-units base`` gives bytes). Returns {"kernels": n,
    "dram_read_bytes", "dram_write_bytes", "dram_bytes", "per_kernel": [{id,
    name, read, write}]}. Raises ValueError when no kernel row has the metrics.
    """
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith('"ID"')), None)
    if start is None:
        raise ValueError("no CSV header (\"ID\", ...) in the ncu output")
    rows = list(csv.reader(io.StringIO("\n".join(lines[start:]))))
    header = rows[0]
    col = {name: i for i, name in enumerate(header)}
    kernels: dict[str, dict[str, Any]] = {}

    def add(kid: str, name: str, metric: str, value: float | None, unit: str) -> None:
        if value is None or metric not in METRICS:
            return
        k = kernels.setdefault(kid, {"id": kid, "name": name, "read": 0.0, "write": 0.0})
        scale = _UNITS.get(unit.strip().lower(), None)
        if scale is None:
            raise ValueError(f"unknown unit '{unit}' for {metric}")
        k["read" if metric.startswith("dram__bytes_read") else "write"] += value * scale

    if "Metric Name" in col:  # details page: one row per (kernel, metric)
        for r in rows[1:]:
            if len(r) < len(header):
                continue
            add(r[col["ID"]], r[col.get("Kernel Name", col["ID"])], r[col["Metric Name"]],
                _number(r[col["Metric Value"]]), r[col.get("Metric Unit", col["Metric Value"])] or "byte")
    else:  # raw page: one column per metric, a units row first
        units = {}
        for r in rows[1:]:
            if len(r) < len(header):
                continue
            if not r[col["ID"]].strip():
                units = {metric: r[col[metric]] for metric in METRICS if metric in col}
                continue
            for metric in METRICS:
                if metric in col:
                    add(r[col["ID"]], r[col.get("Kernel Name", col["ID"])], metric, _number(r[col[metric]]),
                        units.get(metric) or "byte")
    if not kernels:
        raise ValueError("the ncu output has no kernel with " + " or ".join(METRICS))
    per = list(kernels.values())
    read = sum(k["read"] for k in per)
    write = sum(k["write"] for k in per)
    return {"kernels": len(per), "dram_read_bytes": int(read), "dram_write_bytes": int(write),
            "dram_bytes": int(read + write),
            "per_kernel": [{**k, "read": int(k["read"]), "write": int(k["write"])}
                           for k in sorted(per, key=lambda k: -(k["read"] + k["write"]))[:20]]}


def measure_dram_bytes(source: str, variant: str, dtype: str, batch: int | None, seq_len: int | None,
                       memory_format: str = "nchw", timeout_s: float = 300.0, ncu: str | None = None
                       ) -> dict[str, Any]:
    """DRAM bytes of one forward of ``variant`` ("unfused" or "fused": every chain accepted), measured by ncu.

    Returns the ``parse_ncu_csv`` dict plus "command", or {"error": one line}
    when ncu is missing, fails or its output cannot be read (never raises).
    """
    ncu = ncu or find_ncu()
    if ncu is None:
        return {"error": "Nsight Compute (ncu) not found on this machine"}
    if not torch.cuda.is_available():
        return {"error": "no CUDA device: DRAM bytes are measured on a GPU only"}
    args = {"source": source, "variant": variant, "dtype": dtype, "batch": batch, "seq_len": seq_len,
            "memory_format": memory_format}
    with tempfile.TemporaryDirectory(prefix="fusion-explorer-ncu-") as tmp:
        log = os.path.join(tmp, "ncu.csv")
        cmd = ncu_command(ncu, log, args)
        env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env=env, cwd=str(ROOT))
        except subprocess.TimeoutExpired:
            return {"error": NCU("ncu_did_finish_within", n=f"{timeout_s:.0f}"), "command": " ".join(cmd[:-1])}
        text = Path(log).read_text(errors="replace") if os.path.exists(log) else ""
        if proc.returncode != 0 and not text:
            tail = (proc.stderr or proc.stdout or "").strip().splitlines()[-3:]
            return {"error": NCU("ncu_exited_with_status", n=proc.returncode, x=' | '.join(tail)[:300]),
                    "command": " ".join(cmd[:-1])}
        try:
            result = parse_ncu_csv(text)
        except ValueError as exc:
            errors = [line for line in text.splitlines() if line.startswith("==ERROR==")][:2]
            return {"error": NCU("ncu_output_readable", x=str(exc))
                    + (f" ({' | '.join(errors)[:300]})" if errors else ""),
                    "command": " ".join(cmd[:-1])}
    result["command"] = shlex.join(cmd).replace(log, "ncu.csv")
    result["settings"] = args
    return result


def explain_difference(model_bytes: int, dram_bytes: int, l2_bytes: int | None) -> dict[str, Any]:
    """The measured DRAM bytes against the byte model: the difference and why, as codes a view can translate.

    ``reasons`` holds "l2" (measured below the model: tensors still in the L2
    cache were read from there, not from DRAM), and/or "rereads" (measured
    above: kernels read some tensors more than once, or wrote workspaces).
    """
    diff = dram_bytes - model_bytes
    ratio = dram_bytes / model_bytes if model_bytes else None
    reasons = []
    if diff < 0:
        reasons.append("l2")
    elif diff > 0:
        reasons.append("rereads")
    return {"model_bytes": int(model_bytes), "dram_bytes": int(dram_bytes), "difference": int(diff),
            "ratio": ratio, "l2_bytes": l2_bytes, "reasons": reasons}


# ------------------------------------------------------------------ the child ncu profiles

def _ncu_child(args: dict[str, Any]) -> int:
    """Load the model, prepare ``variant`` as the runner does, warm up, then run ONE forward between
    ``cudaProfilerStart`` and ``cudaProfilerStop`` (what ncu profiles with ``--profile-from-start off``)."""
    from explorer.fusion_engine import analyze, fuse

    device = "cuda"
    dtype = m.torch_dtype(args["dtype"])
    analysis = analyze(args["source"], batch=args.get("batch"), seq_len=args.get("seq_len"))
    channels_last = args.get("memory_format") == "channels_last"
    gm = (analysis.model.gm if args["variant"] == "unfused"
          else fuse(analysis, None, m.run_target(device, dtype, channels_last)).gm)
    prepared = m.prepare_graph(gm, device, dtype, channels_last)
    inputs = m.prepare_inputs(analysis.model.example_inputs, device, dtype, channels_last)
    with torch.inference_mode():
        for _ in range(3):
            prepared(*inputs)
        torch.cuda.synchronize()
        torch.cuda.profiler.start()  # cudaProfilerStart: ncu profiles from here
        prepared(*inputs)
        torch.cuda.synchronize()
        torch.cuda.profiler.stop()
    print(json.dumps({"ok": True, "variant": args["variant"]}))
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--ncu-child":
        sys.exit(_ncu_child(json.loads(sys.argv[2])))
    print("usage: python -m explorer.runtime.traffic --ncu-child '<json>' (run under ncu by measure_dram_bytes)",
          file=sys.stderr)
    sys.exit(2)
