"""What a plan is made of: the budgets it is held to, its candidates, the plan itself."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from edgekit.converters.planner.predict import Prediction

DEFAULT_CONTEXT = 4096
# Streams decoded together (continuous batching): the most a plan or a load takes, and
# the most the plan suggests (``Candidate.parallel_suggested``: serve's default).
MAX_PARALLEL = 64
MAX_SUGGESTED_PARALLEL = 8


@dataclass(frozen=True, kw_only=True)
class Budgets:
    memory_bytes: int | None = None
    watts: float | None = None
    context: int = DEFAULT_CONTEXT
    min_decode_tok_s: float | None = None
    max_quality_loss: float | None = None  # mean KL, nats per token
    kv_cache: str = "f16"
    # generations decoded together, each with its own KV cache of the context
    parallel: int = 1


NO_BUDGETS = Budgets()  # the device's own limits, the default context


@dataclass(frozen=True, kw_only=True)
class Candidate:
    target: str
    unit: str  # cpu, gpu, npu
    unit_name: str
    format: str
    power_mode: str | None
    prediction: Prediction
    memory_limit_bytes: int
    memory_limit_why: str
    quality_loss: float | None
    quality_source: str
    quality_tier: str
    buildable: bool
    # why it cannot be built; or, when it can, what of its build cannot run on this host
    build_note: str
    rejections: tuple[str, ...]
    storage: dict[str, int] = field(default_factory=dict)  # bytes per storage type
    # From an already-quantized source: more bits per weight than the source stores
    # (requantizing up recovers nothing of what the source's quantization lost).
    requantizes_up: bool = False
    quality_note: str = ""
    # recipe options the build for this unit needs (Target.build_recipe): pack adds them
    build_recipe: str = ""
    # the most streams (up to MAX_SUGGESTED_PARALLEL) whose KV caches fit beside the
    # weights and runtime at the plan's context, within the memory limit; 0: not one
    parallel_suggested: int = 1

    @property
    def fits(self) -> bool:
        return not self.rejections

    @property
    def label(self) -> str:
        return f"{self.target} {self.format} on {self.unit.upper()}"


@dataclass(frozen=True, kw_only=True)
class ModeFigures:
    """The plan's pick (target, unit, format) predicted under one power mode of the
    device, so the modes can be compared: speed, draw and energy per token."""

    mode: str
    max_w: float
    note: str
    decode_tok_s: float | None
    prefill_tok_s: float | None
    watts: float | None
    joules_per_token: float | None
    fits: bool  # within every budget in this mode (a --power budget below its max_w: no)
    chosen: bool  # the mode the plan is made in


@dataclass(frozen=True, kw_only=True)
class Plan:
    model: str
    family: str
    parameters: int
    parameters_source: str
    device: str
    device_display: str
    budgets: Budgets
    power_mode: str | None
    candidates: tuple[Candidate, ...]  # ranked fits first, then rejections by memory
    choice: Candidate | None  # the best candidate edgekit can build
    best: Candidate | None  # the best overall, buildable or not
    closest: Candidate | None  # when nothing fits: the smallest option
    summary: str
    notes: tuple[str, ...]
    # the pick under each of the device's power modes (none: no modes, or no pick)
    power_modes: tuple[ModeFigures, ...] = ()

    @property
    def parallel_suggested(self) -> int:
        """The streams the pick (else the best candidate) holds at the plan's context: the
        default of ``edgekit serve --parallel``; 0 when nothing fits."""
        pick = self.choice or self.best
        return pick.parallel_suggested if pick is not None else 0

    def to_dict(self) -> dict[str, Any]:
        def cand(c: Candidate | None) -> dict[str, Any] | None:
            if c is None:
                return None
            data = asdict(c)
            data["fits"] = c.fits
            return data

        return {
            "model": self.model,
            "family": self.family,
            "parameters": self.parameters,
            "parameters_source": self.parameters_source,
            "device": self.device,
            "device_display": self.device_display,
            "budgets": asdict(self.budgets),
            "power_mode": self.power_mode,
            "parallel": self.budgets.parallel,
            "parallel_suggested": self.parallel_suggested,
            "summary": self.summary,
            "notes": list(self.notes),
            "choice": cand(self.choice),
            "best": cand(self.best),
            "closest": cand(self.closest),
            "candidates": [cand(c) for c in self.candidates],
            "power_modes": [asdict(m) for m in self.power_modes],
        }
