"""Kernel launches per device and kernel choice: the one count the pages, the command line and the report show.

A chain's unfused launches are its ops' (the graph's ``launches``: one per compute op, none for a view).
After fusion it launches what its kernel selection says runs on that device for that kernel choice:
the count the selection's label states (``conv+bias + relu in place (2 kernels)`` on the CPU,
``cudnn conv+bias+relu (1 fused call: ...)`` on CUDA), read here once::

    stated count   "(2 kernels)", "(1 fused call: ...)", "(1 elementwise kernel)", "2 kernels (...)",
                   summed over the parts of a label ("... (1 kernel) + linear (1 kernel)"), plus one for a
                   "one GEMM over ..." that states no count of its own; an alternative the label names
                   for another layout ("; any other: ...", ", else ...") is not counted
    no count       1 when the selection has a fused kernel (``fused_kernel``), else the chain's own ops
    no fused kernel (``fused_kernel`` False: the same ops run one after another) -> the chain's own ops

So the saving is the device's: on the CPU, where the conv epilogues run as separate ops, Conv+BN+ReLU saves
the BatchNorm only (3 -> 2); on CUDA, where one cuDNN call runs it, 3 -> 1. The runner measures the
same thing with the profiler (``Measurement.kernel_launches``: CUDA kernels, or on the CPU the top-level
ATen ops, views such as ``flatten`` included, which the graph counts as free): the savings agree, but for
views inside a chain that its fused form drops (attention's ``transpose``: one ATen op fewer on the CPU's
count, no kernel fewer).

``count(total, per_chain, accepted, device)`` is the model's count under a plan; ``chain_launches`` one
chain's. Layer 0: no torch, no networkx (the engine passes plain numbers and its ``AppliedChain`` values).
"""

from __future__ import annotations

import dataclasses
import re
from typing import Iterable, Mapping, Protocol

#: A stated count: "2 kernels", "1 fused call", "1 elementwise kernel", "1 conv kernel", "1 pass".
_COUNT = re.compile(r"\b(\d+)\s+(?:fused\s+|elementwise\s+|conv\s+)?(?:kernels?|calls?|pass(?:es)?)\b")
#: An alternative for another input or device, up to the closing parenthesis: not what runs here.
_ALTERNATIVE = re.compile(r"[;,]\s*(?:any other|else|a residual that is not)\b[^)]*")
_ONE_GEMM = re.compile(r"\bone GEMM\b")


def stated_kernels(label: str) -> int | None:
    """The kernels a selection's label says run (module docstring), or None when it states none."""
    text = _ALTERNATIVE.sub("", str(label))
    counts = [int(n) for n in _COUNT.findall(text)]
    gemm = 1 if _ONE_GEMM.search(text) else 0
    if not counts:
        return gemm or None
    return sum(counts) + gemm


@dataclasses.dataclass(frozen=True)
class ChainLaunches:
    """One chain's launches on ``device``: ``unfused`` (its ops), ``fused`` (what its kernel runs there),
    ``stated`` whether ``fused`` is the count its kernel's label states (else: one fused kernel, or the
    same ops where there is no fused kernel), ``fused_kernel`` whether a fused kernel runs at all."""

    chain_id: str
    unfused: int
    fused: int
    stated: bool = False
    fused_kernel: bool = True

    @property
    def saved(self) -> int:
        return self.unfused - self.fused


@dataclasses.dataclass(frozen=True)
class LaunchCounts:
    """The model's kernel launches on ``device`` before and after the accepted chains (``chains``)."""

    device: str
    before: int
    after: int
    chains: tuple[ChainLaunches, ...] = ()

    @property
    def saved(self) -> int:
        return self.before - self.after

    def of(self, chain_id: str) -> ChainLaunches | None:
        return next((c for c in self.chains if c.chain_id == chain_id), None)


class AppliedKernel(Protocol):
    """What a count reads of a chain's one kernel choice (``explorer.fusions.rewrite.AppliedChain``, made once
    per chain and target by the rewrite): its status, its label and whether a fused kernel runs."""

    status: str
    implementation: str
    fused_kernel: bool


def chain_launches(chain_id: str, unfused: int, applied: AppliedKernel | None) -> ChainLaunches:
    """One chain's launches: ``applied`` is what the rewrite made of it (an ``AppliedChain``: ``status``,
    ``implementation``, ``fused_kernel``: the chain's kernel choice, read here, never made again), None when it
    was not applied (then nothing changes)."""
    if applied is None or getattr(applied, "status", "") != "fused":
        return ChainLaunches(chain_id, unfused, unfused, False, False)
    if not getattr(applied, "fused_kernel", False):
        return ChainLaunches(chain_id, unfused, unfused, False, False)
    stated = stated_kernels(getattr(applied, "implementation", ""))
    fused = stated if stated is not None else min(1, unfused)
    return ChainLaunches(chain_id, unfused, fused, stated is not None, True)


def count(total: int, per_chain: Mapping[str, ChainLaunches], accepted: Iterable[str], device: str) -> LaunchCounts:
    """The model's launches on ``device``: ``total`` unfused (every op's), minus each accepted chain's
    saving (``per_chain``: chain id -> ``ChainLaunches``; a chain absent from it saves nothing)."""
    chains = tuple(per_chain[c] for c in accepted if c in per_chain)
    return LaunchCounts(device, int(total), int(total) - sum(c.saved for c in chains), chains)
