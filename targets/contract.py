"""The contract a target plug-in implements: what it runs on, what it loads, how fast it
is expected to be, whether it can run here, and how it loads a model.

A target is one runtime family (llama.cpp, OpenVINO, ...). Core code, the CLI, the
planner, pack, load, bench, eval and the TUI loop over the registered targets
(``edgekit.targets.registry``) and read these capabilities; none of them names a target.
Adding a target is one module with one ``Target`` subclass, its format package
(``edgekit.converters.<format>``) and one entry point in the ``edgekit.targets`` group.

Everything here is readable without importing the target's SDK: only
``check_host`` and ``load`` import it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from edgekit.errors import TargetError, TargetUnavailableError

if TYPE_CHECKING:
    from edgekit.converters.formats import Format
    from edgekit.targets.session import Session

    from edgekit.devices import Accelerator, DeviceProfile
    from edgekit.modelspec import ModelSpec

UnitKind = Literal["cpu", "gpu", "npu"]
Basis = Literal["first estimate", "calibrated"]


@dataclass(frozen=True, kw_only=True)
class Coefficients:
    """How a runtime turns a device's raw figures into throughput and memory."""

    bandwidth_efficiency: float  # share of the memory bandwidth a decode step achieves
    token_overhead_s: float  # fixed cost per generated token (sampling, graph launch, Python)
    compute_efficiency: float  # share of peak compute prefill achieves
    runtime_bytes: int  # buffers and libraries beyond weights and KV cache
    weight_residency: float  # resident bytes per weight byte (1.0: mapped once, no copy)
    kv_preallocated: bool  # True: the whole context's KV cache is allocated at load
    kv_scale: float = 1.0  # resident bytes per nominal KV-cache byte (copies, padding)
    prefill_token_overhead_s: float = 0.0  # fixed cost per prompt token
    layer_overhead_s: float = 0.0  # per layer per generated token (kernel launches)
    # Measured (bytes read per token, seconds per token) on this host, by size: between
    # two measured sizes the time is interpolated, which captures what one line cannot,
    # e.g. small models that fit in the CPU's last-level cache.
    decode_curve: tuple[tuple[float, float], ...] = ()
    basis: Basis = "first estimate"
    note: str = ""


@dataclass(frozen=True, kw_only=True)
class UnitSupport:
    """One kind of compute unit a target runs on: the formats the planner considers there
    (names of the target's format's quantizations, most precise first) and the first
    estimates of its prediction coefficients."""

    kind: UnitKind
    formats: tuple[str, ...]
    priors: Coefficients
    # Why edgekit cannot build variants that run on this unit yet, though it builds the
    # format for another ("": it can). The planner then marks the unit's candidates
    # prediction-only, so pack --device never packs a variant that would not run there.
    not_built: str = ""
    # The build splits a model into parts that each fit the accelerator's max_model_gib
    # (one session each, as Qualcomm's HTP pipelines do): that limit then bounds one
    # part, not the model, and the planner holds the model to the device's memory.
    splits_model: bool = False


@dataclass(frozen=True, kw_only=True)
class KvCacheLayout:
    """How the runtime allocates its KV cache, as far as memory prediction cares."""

    # families whose sliding-window layers the runtime keeps at the window only
    windowed_families: frozenset[str] = frozenset()
    pad: int = 1  # the context (and a window) is rounded up to this many cells
    window_extra: int = 0  # positions a windowed layer holds beyond the window


@dataclass(frozen=True, kw_only=True)
class MemoryCap:
    """A limit a runtime puts on the memory one model may take on a unit, below what the
    unit has (Metal's working set, of which mlx-lm lets a model use 0.9)."""

    bytes: int  # the most a model's resident memory may be
    why: str  # whose limit, in words: "mlx-lm's 0.9 of the GPU working set"
    hint: str  # how to raise it


@dataclass(frozen=True, kw_only=True)
class HostDevice:
    """A compute unit a target's SDK lists on this host beyond the CPU (an Intel GPU or
    NPU as OpenVINO names it): the probe adds it to the host profile."""

    kind: UnitKind
    device: str  # how the runtime names it: "GPU.0", "NPU"
    name: str  # the SDK's full device name


class Target(ABC):
    """A runtime family, described by class attributes and loaded by ``load``."""

    name: ClassVar[str]  # the entry-point name, the manifest's variant.target
    display_name: ClassVar[str]
    devices: ClassVar[str]  # where it runs, in words
    format: ClassVar[Format]  # the output format its bundles hold
    install_hint: ClassVar[str]  # how to get its SDK
    sdk_modules: ClassVar[tuple[str, ...]]  # top-level modules ``load`` imports
    distribution: ClassVar[str]  # the SDK's distribution name, for version reports
    units: ClassVar[tuple[UnitSupport, ...]]
    kv_cache: ClassVar[KvCacheLayout] = KvCacheLayout()
    # False: edgekit predicts for this target (plan, profiles) but cannot run it yet;
    # ``runtime_note`` says why, and ``load`` refuses with it.
    runs: ClassVar[bool] = True
    runtime_note: ClassVar[str] = ""
    evaluates: ClassVar[bool] = True  # ``load(..., logits=True)`` gives per-position logits
    load_settings: ClassVar[tuple[str, ...]] = ()  # what ``load`` accepts
    devices_accepted: ClassVar[tuple[str, ...]] = ("auto",)  # edgekit.load(device=...)
    # Where one target must be chosen for the user (``edgekit pack``'s default target):
    # the runnable target with the lowest priority, then by name.
    priority: ClassVar[int] = 100

    # --- capabilities read by the planner ------------------------------------------------

    @classmethod
    def unit(cls, kind: str) -> UnitSupport | None:
        return next((u for u in cls.units if u.kind == kind), None)

    @classmethod
    @abstractmethod
    def accelerators(cls, profile: DeviceProfile) -> list[Accelerator]:
        """The compute units of ``profile`` this target runs on (none: it does not)."""

    @classmethod
    def priors(cls, kind: str, spec: ModelSpec) -> Coefficients:
        """First estimates for ``spec`` on a unit of ``kind`` (a target whose buffers grow
        with the model overrides this)."""
        unit = cls.unit(kind)
        if unit is None:
            raise TargetError(f"{cls.display_name} does not run on a {kind.upper()}")
        return unit.priors

    @classmethod
    def unit_formats(cls, profile: DeviceProfile, accelerator: Accelerator) -> tuple[str, ...]:
        """The formats the planner considers on ``accelerator`` of ``profile``, most
        precise first: by default the unit's (``UnitSupport.formats``). A target whose
        chips differ in the precisions they run (an FP8 engine needs an SM89+ GPU)
        narrows them to what this chip runs. Must not import the SDK."""
        unit = cls.unit(accelerator.kind)
        return unit.formats if unit is not None else ()

    @classmethod
    def build_recipe(cls, profile: DeviceProfile, accelerator: Accelerator) -> str:
        """Recipe options (``key=value,...``) a build for ``accelerator`` of ``profile``
        needs beyond its quantization: a build compiled for one chip names the chip and
        its limits ("soc=SM8750,part_gib=4"). "" where a build runs on any such unit;
        ``pack --device`` adds these to the variant's recipe."""
        return ""

    @classmethod
    def build_note(cls, kind: str) -> str:
        """What of a build for a unit of ``kind`` cannot run on this host, and what edgekit
        ships instead (the plan says it): "" when every step runs here. Must not import
        the SDK (the planner calls it)."""
        return ""

    @classmethod
    def memory_cap(cls, profile: DeviceProfile, kind: str, unit_bytes: int) -> MemoryCap | None:
        """The runtime's own limit on a unit of ``kind`` of ``profile`` that leaves a model
        ``unit_bytes`` (the profile's figure), when it is below that: the planner holds
        candidates to it. None: the unit's memory is the limit. Must not import the SDK."""
        return None

    @classmethod
    def vocab_runtime_bytes(cls, kind: str, spec: ModelSpec) -> int:
        """The part of the runtime buffers that grows with the vocabulary (calibration
        fits the rest)."""
        return 0

    @classmethod
    def compute_precision(
        cls, profile: DeviceProfile, accelerator: Accelerator, fp32_tflops: float | None
    ) -> tuple[str, float | None] | None:
        """The precision prefill computes in on a CPU and its peak, when the runtime does
        better than fp32 there (None: fp32)."""
        return None

    # --- on this host --------------------------------------------------------------------

    @classmethod
    @abstractmethod
    def check_host(cls) -> tuple[bool, str]:
        """(usable here, what was found or why not). Imports the SDK: call it from the
        probe or load only, after the SDK modules were found installed."""

    @classmethod
    def host_devices(cls) -> tuple[HostDevice, ...] | None:
        """The GPUs and NPUs this target's SDK lists here, or None when the target does
        not enumerate devices (the probe then asks it nothing). Imports the SDK.

        Raises:
            Exception: whatever the SDK raises; the probe records it as a failed part.
        """
        return None

    @classmethod
    def host_memory_cap(cls, kind: str) -> MemoryCap | None:
        """The runtime's own limit on a unit of ``kind`` on this host (Metal's recommended
        working set, as the SDK reports it), or None: load admits a variant by the host's
        free memory alone. May import the SDK (called by load only)."""
        return None

    @classmethod
    def load_unit(cls, device: str) -> str:
        """The kind of compute unit ``edgekit.load(device=...)`` runs the model on, so load
        admits its memory by that unit's figures: the unit named, else (``auto``) the CPU
        where the target runs on one, else its first unit. A target whose runtime picks
        a device itself on ``auto`` overrides this to say which one it will pick (may
        import the SDK: called by load only).

        Raises:
            TargetError: the target declares no compute unit.
        """
        kinds = [u.kind for u in cls.units]
        if device in kinds:
            return device
        if not kinds:
            raise TargetError(f"{cls.display_name} declares no compute unit")
        return "cpu" if "cpu" in kinds else kinds[0]

    @classmethod
    def variant_runs_here(cls, model: Path, device: str) -> str:
        """Why this host cannot run the built variant at ``model`` on ``device`` ("": it
        can, as far as the target knows before loading): a variant compiled for one chip
        runs only there. ``edgekit.load`` choosing on its own skips such a variant. May
        import the SDK.

        Raises:
            ModelError: the variant is not one the target reads.
        """
        return ""

    @classmethod
    def device_settings(cls, device: str) -> dict[str, Any]:
        """The load settings that put a model on ``device`` (auto, cpu, gpu, npu, ...).

        Raises:
            TargetError: the target has no such device.
        """
        if device not in cls.devices_accepted:
            raise TargetError(
                f"device {device!r} is not one the {cls.display_name} target knows",
                hint=f"use {', '.join(cls.devices_accepted)}",
            )
        return {}

    @classmethod
    def load(cls, model: str | Path, **settings: Any) -> Session:
        """Load ``model`` with runtime ``settings`` (context, threads, KV-cache type, ...).

        Raises:
            SettingError: an unknown setting, or one of the wrong type or out of range.
            TargetUnavailableError: the SDK is missing, or edgekit cannot run it yet.
        """
        raise TargetUnavailableError(
            f"edgekit cannot run {cls.display_name} models yet: {cls.runtime_note}",
            hint="plan for it with edgekit plan; run the model on another target",
        )
