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
from explorer.messages import JSON, PLAN
from explorer.jsonfile import parse_json
from explorer.fusions import BY_NAME
from explorer.fusions.base import Detection
from explorer.report import GPU, PlanInfo, Report
from explorer.vocab import MEMORY_FORMATS

PLAN_VERSION = 1
PLAN_FIELDS = ("version", "model", "fingerprint", "accepted", "kernels", "memory_format", "cuda_graphs")
MAX_PLAN_BYTES = 5 * 2**20
MAX_NAME_CHARS = 500
MAX_CHAINS = 100_000


@dataclasses.dataclass(frozen=True)
class Plan(PlanInfo):
    """Accepted chains and global options for one model.

    Its fields are the report's ``PlanInfo`` (the plan a run measured), declared there once; a
    ``Plan`` adds the checks and the JSON round trip.
    """

    def __post_init__(self) -> None:
        if self.version != PLAN_VERSION:
            raise PlanError(PLAN("version", version=str(self.version)[:20], expected=PLAN_VERSION))
        if self.memory_format not in MEMORY_FORMATS:
            raise PlanError(PLAN("memory_format", choices=", ".join(MEMORY_FORMATS), got=self.memory_format))

    def to_dict(self) -> dict[str, Any]:
        return {"version": PLAN_VERSION, "model": self.model, "fingerprint": self.fingerprint,
                "accepted": list(self.accepted), "kernels": dict(self.kernels),
                "memory_format": self.memory_format, "cuda_graphs": bool(self.cuda_graphs)}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    @classmethod
    def from_dict(cls, data: Any) -> "Plan":
        """A plan from its JSON value, strictly: every field of the wrong type is an error (one line),
        never coerced (``"cuda_graphs": "false"`` is refused, not read as true); unknown fields too."""
        if not isinstance(data, dict):
            raise PlanError(PLAN("not_object"))
        unknown = sorted(str(k)[:40] for k in data if k not in PLAN_FIELDS)
        if unknown:
            raise PlanError(PLAN("unknown_fields", fields=", ".join(unknown[:5])))
        missing = [k for k in ("model", "fingerprint", "accepted") if k not in data]
        if missing:
            raise PlanError(PLAN("missing", fields=", ".join(missing)))
        version = data.get("version", PLAN_VERSION)
        if isinstance(version, bool) or version != PLAN_VERSION or not isinstance(version, int):
            raise PlanError(PLAN("version", version=str(version)[:20], expected=PLAN_VERSION))
        for key in ("model", "fingerprint"):
            if not isinstance(data[key], str) or not data[key] or len(data[key]) > MAX_NAME_CHARS:
                raise PlanError(PLAN("name_field", field=key, n=MAX_NAME_CHARS))
        accepted = data["accepted"]
        if not isinstance(accepted, list) or not all(isinstance(a, str) and a for a in accepted):
            raise PlanError(PLAN("accepted_type"))
        if len(accepted) > MAX_CHAINS or len(set(accepted)) != len(accepted):
            raise PlanError(PLAN("accepted_twice"))
        kernels = data.get("kernels", {})
        if not isinstance(kernels, dict) or len(kernels) > MAX_CHAINS or not all(
                isinstance(v, str) and v for v in kernels.values()):
            raise PlanError(PLAN("kernels_type"))
        memory_format = data.get("memory_format", "nchw")
        if not isinstance(memory_format, str):
            raise PlanError(PLAN("memory_format_type", choices=", ".join(MEMORY_FORMATS)))
        cuda_graphs = data.get("cuda_graphs", False)
        if not isinstance(cuda_graphs, bool):
            raise PlanError(PLAN("cuda_graphs_type"))
        return cls(model=data["model"], fingerprint=data["fingerprint"], accepted=tuple(accepted),
                   kernels=dict(kernels), memory_format=memory_format[:40], cuda_graphs=cuda_graphs)

    @classmethod
    def from_json(cls, text: str | bytes) -> "Plan":
        """A plan from JSON text (bounded size and nesting, ``explorer.jsonfile``), then ``from_dict``."""
        return cls.from_dict(parse_json(text, JSON("plan"), PlanError, MAX_PLAN_BYTES))

    def check_for(self, detection: Detection) -> None:
        """Refuse a plan made for another model, naming chains this model does not have, or accepting two
        chains that share a node (a chain and one of its alternatives)."""
        if self.fingerprint != detection.fingerprint:
            raise PlanError(PLAN("other_model", model=self.model, fingerprint=self.fingerprint, here=detection.model,
                                 here_fingerprint=detection.fingerprint))
        known = detection.known_chains()
        unknown = [a for a in self.accepted if a not in known]
        if unknown:
            raise PlanError(PLAN("unknown_accepted", chains=", ".join(unknown[:5])))
        owner: dict[str, str] = {}
        for chain_id in self.accepted:
            for n in known[chain_id].nodes:
                if n in owner:
                    raise PlanError(PLAN("shared_node", first=owner[n], second=chain_id, node=n))
                owner[n] = chain_id
        for chain_id, kernel in self.kernels.items():
            if chain_id not in known:
                raise PlanError(PLAN("unknown_kernel_chain", chain=chain_id))
            choices = BY_NAME[known[chain_id].pattern].kernels
            if kernel not in choices:
                raise PlanError(PLAN("not_a_choice", kernel=kernel, chain=chain_id, choices=", ".join(choices)))

    def kernel_for(self, chain_id: str) -> str:
        """The kernel choice for one chain ("auto" unless the plan names another)."""
        return self.kernels.get(chain_id, "auto")


def slower_chains(report: Report, detection: Detection | None = None) -> list[str]:
    """Ids of the chains a run report measured slower fused than unfused.

    Reads the one verdict the runner computed (``ChainResult.verdict``: a test
    over paired rounds, on CUDA-graph replays when the plan replayed graphs).
    A chain with no fused kernel on the device is never slower. With
    ``detection``, a report of another model is refused (``ReportError``, one line).
    """
    if detection is not None:
        report.check_model(detection.fingerprint, detection.model)
    return report.slower_chains


def gpu_slower_chains(report: Report, detection: Detection) -> list[str]:
    """Ids of the chains a CUDA report measured slower fused *even as CUDA graphs* (the fused kernel
    itself is slower on the GPU: ``limited_by == GPU``) whose pattern offers the "separate_epilogue"
    kernel choice. A report of another model is refused (``ReportError``, one line)."""
    report.check_model(detection.fingerprint, detection.model)
    offers = {c.id for c in detection.chains if "separate_epilogue" in BY_NAME[c.pattern].kernels}
    return [cid for cid in report.limited_by(GPU) if cid in offers]


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
            raise PlanError(PLAN("unknown_patterns", patterns=", ".join(unknown), choices="all, none, " + ", ".join(BY_NAME)))
        patterns = set(accept)
    reject = set(reject)
    known = {c.id for c in detection.chains}
    unknown_ids = sorted(reject - known)
    if unknown_ids:
        raise PlanError(PLAN("reject_unknown", chains=", ".join(unknown_ids[:5])))
    accepted = tuple(c.id for c in detection.chains if c.pattern in patterns and c.id not in reject)
    unknown_ids = sorted(set(kernels or {}) - known)
    if unknown_ids:
        raise PlanError(PLAN("kernel_unknown", chains=", ".join(unknown_ids[:5])))
    plan = Plan(model=detection.model, fingerprint=detection.fingerprint, accepted=accepted,
                kernels={k: v for k, v in (kernels or {}).items() if v != "auto"},
                memory_format=memory_format, cuda_graphs=cuda_graphs)
    plan.check_for(detection)
    return plan


def plan_for_chains(detection: Detection, ids: Iterable[str], kernels: dict[str, str] | None = None,
                    memory_format: str = "nchw", cuda_graphs: bool = False) -> Plan:
    """A plan accepting exactly the chains ``ids`` (detected or alternative), checked (``Plan.check_for``)."""
    ids = list(ids)
    chosen = [c.id for c in detection.accepted_chains(ids)]
    missing = sorted(set(ids) - set(chosen))
    if missing:
        raise PlanError(PLAN("accept_unknown", chains=", ".join(missing[:5])))
    plan = Plan(model=detection.model, fingerprint=detection.fingerprint, accepted=tuple(chosen),
                kernels={k: v for k, v in (kernels or {}).items() if v != "auto"},
                memory_format=memory_format, cuda_graphs=cuda_graphs)
    plan.check_for(detection)
    return plan


def choose_alternative(plan: Plan, detection: Detection, alternative_id: str) -> Plan:
    """``plan`` with one alternative (``Alternative.id``) accepted in place of the chain it replaces, and of any
    accepted chain it overlaps; kernel choices of the chains it drops are dropped with them."""
    alt = next((a for a in detection.alternatives if a.id == alternative_id), None)
    if alt is None:
        raise PlanError(PLAN("no_alternative", alternative=alternative_id[:200]))
    taken = {n for c in alt.chains for n in c.nodes}
    known = detection.known_chains()
    keep = [cid for cid in plan.accepted if cid != alt.instead_of and not taken & set(known[cid].nodes)]
    ids = keep + [c.id for c in alt.chains]
    return plan_for_chains(detection, ids, {k: v for k, v in plan.kernels.items() if k in set(ids)},
                           plan.memory_format, plan.cuda_graphs)
