"""What a run measures and how: the settings the runner's caller passes to its child process."""

from __future__ import annotations

import dataclasses
from typing import Any

from explorer.errors import RunError
from explorer.messages import RUN
from explorer.vocab import parse_device, parse_dtype

#: torch.compile modes a run can compare with. "default" is compared with the fused model as plain
#: calls, "reduce-overhead" (CUDA graphs) with the fused model replayed as CUDA graphs; the autotuned
#: mode compiles for minutes, so it is measured only when asked for.
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune-no-cudagraphs")
DEFAULT_COMPILE_MODES = ("default", "reduce-overhead")


@dataclasses.dataclass(frozen=True)
class RunSettings:
    """What to measure and how. ``warmup``/``reps`` override the adaptive choice.

    ``quick``: fewer repetitions and no per-chain timing (a first look: ResNet-50
    on a 2-core CPU in under a minute). ``compile_baseline`` adds eager and the
    ``compile_modes`` of torch.compile as baselines, timed in the same rounds.
    ``cpu_threads`` sets torch's intra-op threads for the run: on a CPU shared with
    other work, one thread per forward avoids the threads of one op waiting for each
    other (on the 2-core machine, with other work running, a ResNet-50 forward took
    0.11 s on 1 thread and 0.3-2.4 s on 2). The report's environment records it.
    """

    device: str = "auto"  # explorer.vocab.DEVICE_NAMES: auto | cuda | cuda:N | cpu
    dtype: str = "fp32"  # explorer.vocab.DTYPE_NAMES: fp32 | fp16 | bf16
    batch: int | None = None
    seq_len: int | None = None
    per_chain: bool = True
    stages: bool = True
    compile_baseline: bool = False
    compile_modes: tuple[str, ...] = DEFAULT_COMPILE_MODES
    quick: bool = False
    cpu_threads: int | None = None  # torch's intra-op threads in the measuring process (None: torch's default)
    warmup: int | None = None
    reps: int | None = None
    timeout_s: float = 900.0

    def __post_init__(self) -> None:
        parse_device(self.device)   # a bad name is refused here, in the parent, before any child starts
        parse_dtype(self.dtype)
        unknown = [mode for mode in self.compile_modes if mode not in COMPILE_MODES]
        if unknown:
            raise RunError(RUN("unknown_compile_mode", modes=", ".join(unknown), choices=", ".join(COMPILE_MODES)))
        object.__setattr__(self, "compile_modes", tuple(self.compile_modes))
        if self.cpu_threads is not None and self.cpu_threads < 1:
            raise RunError(RUN("cpu_threads", got=self.cpu_threads))

    @property
    def chains_timed(self) -> bool:
        """Per-chain micro-benchmarks run (never in quick mode)."""
        return self.per_chain and not self.quick

    def runs_phase(self, phase: str) -> bool:
        """Whether a run with these settings runs ``phase`` (one of ``report.PHASES``)."""
        return {"chains": self.chains_timed, "stages": self.stages,
                "baselines": self.compile_baseline}.get(phase, True)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "RunSettings":
        names = {f.name for f in dataclasses.fields(cls)}
        values = {k: v for k, v in data.items() if k in names}
        if "compile_modes" in values:
            values["compile_modes"] = tuple(values["compile_modes"])
        return cls(**values)
