"""Fusion plans: the user's choice of chains, as a plain JSON-serialisable value.

A plan names the model it was made for (by graph fingerprint), the accepted
chain ids, an optional kernel choice per chain, and the global options that
are levers beside fusion: memory format and CUDA-graph replay. Applying it
(``explorer.rewrite``) makes a new model; the plan itself never changes
anything.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Iterable

from explorer.errors import PlanError
from explorer.fusions import BY_NAME
from explorer.fusions.base import Detection

PLAN_VERSION = 1
MEMORY_FORMATS = ("nchw", "channels_last")


@dataclasses.dataclass(frozen=True)
class Plan:
    """Accepted chains and global options for one model."""

    model: str
    fingerprint: str
    accepted: tuple[str, ...] = ()
    kernels: dict[str, str] = dataclasses.field(default_factory=dict)
    memory_format: str = "nchw"
    cuda_graphs: bool = False

    def __post_init__(self) -> None:
        if self.memory_format not in MEMORY_FORMATS:
            raise PlanError(f"memory_format must be one of {', '.join(MEMORY_FORMATS)}, got '{self.memory_format}'")

    def to_dict(self) -> dict[str, Any]:
        return {"version": PLAN_VERSION, "model": self.model, "fingerprint": self.fingerprint,
                "accepted": list(self.accepted), "kernels": dict(self.kernels),
                "memory_format": self.memory_format, "cuda_graphs": bool(self.cuda_graphs)}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    @classmethod
    def from_dict(cls, data: Any) -> "Plan":
        if not isinstance(data, dict):
            raise PlanError("a plan must be a JSON object")
        missing = [k for k in ("model", "fingerprint", "accepted") if k not in data]
        if missing:
            raise PlanError(f"plan is missing {', '.join(missing)}")
        if data.get("version", PLAN_VERSION) != PLAN_VERSION:
            raise PlanError(f"plan version {data.get('version')} is not supported (expected {PLAN_VERSION})")
        accepted = data["accepted"]
        if not isinstance(accepted, list) or not all(isinstance(a, str) for a in accepted):
            raise PlanError("plan 'accepted' must be a list of chain ids")
        kernels = data.get("kernels") or {}
        if not isinstance(kernels, dict):
            raise PlanError("plan 'kernels' must be an object")
        return cls(model=str(data["model"]), fingerprint=str(data["fingerprint"]),
                   accepted=tuple(accepted), kernels={str(k): str(v) for k, v in kernels.items()},
                   memory_format=str(data.get("memory_format", "nchw")),
                   cuda_graphs=bool(data.get("cuda_graphs", False)))

    @classmethod
    def from_json(cls, text: str | bytes) -> "Plan":
        try:
            data = json.loads(text)
        except (ValueError, UnicodeDecodeError) as exc:
            raise PlanError(f"plan is not valid JSON: {exc}") from None
        return cls.from_dict(data)

    def check_for(self, detection: Detection) -> None:
        """Refuse a plan made for another model, or naming chains this model does not have."""
        if self.fingerprint != detection.fingerprint:
            raise PlanError(f"this plan was made for model '{self.model}' (graph {self.fingerprint}), "
                            f"not for '{detection.model}' (graph {detection.fingerprint})")
        known = {c.id: c for c in detection.chains}
        unknown = [a for a in self.accepted if a not in known]
        if unknown:
            raise PlanError(f"plan accepts chains this model does not have: {', '.join(unknown[:5])}")
        for chain_id, kernel in self.kernels.items():
            if chain_id not in known:
                raise PlanError(f"plan chooses a kernel for a chain this model does not have: {chain_id}")
            choices = BY_NAME[known[chain_id].pattern].kernels
            if kernel not in choices:
                raise PlanError(f"kernel '{kernel}' is not a choice for {chain_id}: choose one of {', '.join(choices)}")

    def kernel_for(self, chain_id: str) -> str:
        """The kernel choice for one chain ("auto" unless the plan names another)."""
        return self.kernels.get(chain_id, "auto")


def slower_chains(report: dict[str, Any]) -> list[str]:
    """Ids of the chains a runner report measured slower fused than unfused.

    The report's plan says whether CUDA graphs were on; then the replayed timing
    (``slower_in_graph``) is the one that applies, else the plain one (``slower``).
    """
    if not isinstance(report, dict) or not isinstance(report.get("chains"), list):
        raise PlanError("not a runner report: it has no 'chains' list")
    graphs = bool((report.get("plan") or {}).get("cuda_graphs"))
    slower = []
    for chain in report["chains"]:
        flag = chain.get("slower_in_graph") if graphs and "slower_in_graph" in chain else chain.get("slower")
        if flag:
            slower.append(str(chain["id"]))
    return slower


def gpu_slower_chains(report: dict[str, Any], detection: Detection) -> list[str]:
    """Ids of the chains a CUDA report measured slower fused *even as CUDA graphs* (the fused kernel
    itself is slower on the GPU) whose pattern offers the "separate_epilogue" kernel choice."""
    if not isinstance(report, dict) or not isinstance(report.get("chains"), list):
        raise PlanError("not a runner report: it has no 'chains' list")
    offers = {c.id for c in detection.chains if "separate_epilogue" in BY_NAME[c.pattern].kernels}
    return [str(c["id"]) for c in report["chains"] if c.get("slower_in_graph") and c.get("id") in offers]


def make_plan(detection: Detection, accept: str | Iterable[str] = "all", reject: Iterable[str] = (),
              memory_format: str = "nchw", cuda_graphs: bool = False,
              kernels: dict[str, str] | None = None) -> Plan:
    """Build a plan: ``accept`` is "all", "none", or pattern names; ``reject`` lists chain ids;
    ``kernels`` maps chain ids to a kernel choice of their pattern (``Pattern.kernels``)."""
    if isinstance(accept, str):
        accept = [a.strip() for a in accept.split(",") if a.strip()]
    accept = list(accept)
    if accept == ["all"]:
        patterns = set(BY_NAME)
    elif accept in (["none"], []):
        patterns = set()
    else:
        unknown = [a for a in accept if a not in BY_NAME]
        if unknown:
            raise PlanError(f"unknown pattern(s) {', '.join(unknown)}: choose from all, none, {', '.join(BY_NAME)}")
        patterns = set(accept)
    reject = set(reject)
    known = {c.id for c in detection.chains}
    unknown_ids = sorted(reject - known)
    if unknown_ids:
        raise PlanError(f"cannot reject unknown chain(s): {', '.join(unknown_ids[:5])}")
    accepted = tuple(c.id for c in detection.chains if c.pattern in patterns and c.id not in reject)
    unknown_ids = sorted(set(kernels or {}) - known)
    if unknown_ids:
        raise PlanError(f"cannot choose a kernel for unknown chain(s): {', '.join(unknown_ids[:5])}")
    plan = Plan(model=detection.model, fingerprint=detection.fingerprint, accepted=accepted,
                kernels={k: v for k, v in (kernels or {}).items() if v != "auto"},
                memory_format=memory_format, cuda_graphs=cuda_graphs)
    plan.check_for(detection)
    return plan
