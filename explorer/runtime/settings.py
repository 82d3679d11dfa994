"""What a run measures and how: the settings the runner's caller passes to its child process."""

from __future__ import annotations

import dataclasses
from typing import Any


@dataclasses.dataclass(frozen=True)
class RunSettings:
    """What to measure and how. ``warmup``/``reps`` override the adaptive choice."""

    device: str = "auto"  # auto | cuda | cpu
    dtype: str = "fp32"  # fp32 | fp16 | bf16
    batch: int | None = None
    seq_len: int | None = None
    per_chain: bool = True
    stages: bool = True
    compile_baseline: bool = False
    warmup: int | None = None
    reps: int | None = None
    timeout_s: float = 900.0

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "RunSettings":
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})
