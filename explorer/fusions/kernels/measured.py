"""Per-shape measured choices between a GEMM with the LLM epilogue in it and cuBLAS followed by a pass.

A GEMM with SwiGLU (or rotary) in its epilogue never writes the (M, 2I) product
(or the unrotated q, k) to memory, but it is our Triton GEMM against cuBLAS: it
pays only where the bytes it saves are worth more than what cuBLAS does better.
That is a measurement, per shape, so the choice is a committed table of H200
numbers (``MEASURED``, from ``benchmarks/bench_llm_epilogues.py``; the JSON is
``benchmarks/results/bench_llm_epilogues_h200.json``): ours runs for a shape only
where its best tile's median beat cuBLAS + pass by more than ``MARGIN``, and with
that tile. A shape not in the table takes cuBLAS + pass, and says so.

``decide`` answers for one shape: a ``Decision`` with both times (the loser is
shown as a kernel note in the app); ``policy(...)`` switches the rule for a block
("measured", "always", "never"), as ``kernels.policy`` does for the CNN kernels:
tests force the fused path under the interpreter, a benchmark the other one.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator

import torch

#: Ours must beat cuBLAS + pass by more than this fraction of the latter's median.
MARGIN = 0.02
MODES = ("measured", "always", "never")


@dataclasses.dataclass(frozen=True)
class Measurement:
    """One shape's medians (ms) on ``device``: ours at its best tile, cuBLAS + our pass, inductor."""

    ours_ms: float
    baseline_ms: float
    inductor_ms: float | None
    tiles: tuple[int, int, int, int, int] | None   # (BLOCK_M, BLOCK_N, BLOCK_K, warps, stages); None: the default
    device: str = "NVIDIA H200"
    variant: str = "paired"   # SwiGLU: "paired" (two accumulators, BLOCK_N pairs) or "interleaved" (BLOCK_N columns)


@dataclasses.dataclass(frozen=True)
class Decision:
    """What runs for one shape: ``fused`` (ours) or not, the tile, and the measurement behind it (None: unmeasured)."""

    fused: bool
    tiles: tuple[int, ...] | None
    measurement: Measurement | None
    why: str        # "measured_faster" | "measured_slower" | "unmeasured" | "forced" | "off" | "device"


#: (kind, dtype, shape...) -> Measurement. kind "swiglu": (M, K, I); kind "qkv_rotary": (M, K, Hq, Hkv, D).
#: From the H200 runs of ``benchmarks/bench_llm_epilogues.py`` (``table_from_runs`` of the committed
#: ``benchmarks/results/bench_llm_epilogues_h200.json`` and its follow-up ``..._followup_h200.json``, 2026-12-01):
#: the QKV GEMM with rotary wins at the zoo decoder's sizes (2.2x) and loses at Llama-3-8B's, where our GEMM
#: reaches 72% of cuBLAS's rate; SwiGLU's epilogue wins at the zoo's sizes with the interleaved weight (3.2%
#: ahead of cuBLAS + pass, 1% ahead of inductor; the paired variant tied) and loses at 8B's (78% of the rate;
#: the interleaved variant is not measured there).
MEASURED: dict[tuple, Measurement] = {
    ("swiglu", "bfloat16", 16384, 512, 1376): Measurement(0.1121, 0.1158, 0.1132, (128, 256, 64, 8, 3),
                                                          variant="interleaved"),
    ("swiglu", "bfloat16", 4096, 4096, 14336): Measurement(1.8224, 1.5066, 1.5267, (128, 128, 64, 8, 3)),
    ("qkv_rotary", "bfloat16", 16384, 512, 8, 2, 64): Measurement(0.0578, 0.128, 0.1543, (64, 64, 64, 4, 4)),
    ("qkv_rotary", "bfloat16", 4096, 4096, 32, 8, 128): Measurement(0.4234, 0.3248, 0.3348, (128, 128, 64, 8, 3)),
}


@dataclasses.dataclass(frozen=True)
class EpiloguePolicy:
    """How ``decide`` chooses: "measured" (the table), "always" (ours wherever Triton runs), "never"."""

    swiglu: str = "measured"
    qkv_rotary: str = "measured"


POLICY = EpiloguePolicy()


@contextlib.contextmanager
def policy(**changes: str) -> Iterator[EpiloguePolicy]:
    """Run a block with the rule of some kinds changed (``policy(swiglu="always")``); restored after."""
    global POLICY
    for kind, mode in changes.items():
        if mode not in MODES:
            raise ValueError(f"{kind}: mode must be one of {', '.join(MODES)}, got {mode!r}")
    saved = POLICY
    POLICY = dataclasses.replace(saved, **changes)
    try:
        yield POLICY
    finally:
        POLICY = saved


def key(kind: str, dtype: torch.dtype, *shape: int) -> tuple:
    """The table's key for ``kind`` in ``dtype`` at ``shape``."""
    return (kind, str(dtype).replace("torch.", ""), *(int(s) for s in shape))


def decide(kind: str, device: torch.device | str, dtype: torch.dtype, *shape: int) -> Decision:
    """Ours or cuBLAS + pass for ``kind`` at ``shape`` on ``device`` (Triton must run there: callers check)."""
    mode = getattr(POLICY, kind)
    found = MEASURED.get(key(kind, dtype, *shape))
    if mode == "never":
        return Decision(False, None, found, "off")
    if mode == "always":
        return Decision(True, found.tiles if found else None, found, "forced")
    if torch.device(device).type != "cuda":
        return Decision(False, None, found, "device")
    if found is None:
        return Decision(False, None, None, "unmeasured")
    if found.ours_ms < (1 - MARGIN) * found.baseline_ms:
        return Decision(True, found.tiles, found, "measured_faster")
    return Decision(False, None, found, "measured_slower")


def table_from_bench(doc: dict) -> dict[tuple, Measurement]:
    """``MEASURED`` entries from a ``bench_llm_epilogues.py`` JSON (its "swiglu" and "qkv" parts' tables)."""
    import re

    out: dict[tuple, Measurement] = {}
    device = (doc.get("environment") or {}).get("device_name") or "?"
    for part, kind, fields in (("swiglu", "swiglu", ("M", "K", "I")), ("qkv", "qkv_rotary", ("M", "K", "Hq", "Hkv", "D"))):
        for row in (doc.get(part) or {}).get("table", []):
            shape = [int(re.search(rf"\b{f}(\d+)", row["case"]).group(1)) for f in fields]
            tiles = re.search(r"\[(il )?(\d+)x(\d+)x(\d+) w(\d+) s(\d+)\]", row.get("ours_variant") or "")
            if row.get("ours_ms") is None or row.get("baseline_ms") is None:
                continue
            best = tuple(int(g) for g in tiles.groups()[1:]) if tiles else None
            variant = "interleaved" if tiles and tiles.group(1) else "paired"
            out[key(kind, torch.bfloat16, *shape)] = Measurement(
                round(row["ours_ms"], 4), round(row["baseline_ms"], 4),
                None if row.get("inductor_ms") is None else round(row["inductor_ms"], 4), best, device, variant)
    return out


def table_from_runs(docs: list[dict]) -> dict[tuple, Measurement]:
    """``table_from_bench`` of several runs, oldest first: a later run's entry for a shape replaces an earlier one."""
    out: dict[tuple, Measurement] = {}
    for doc in docs:
        out.update(table_from_bench(doc))
    return out
