"""DeviceProfile: what a device offers a model, and the profiles shipped as TOML data.

The dataclass fields are the TOML schema (see docs/profiles.md); ``load_profile`` rejects
unknown keys and names them. Sizes are GiB and bandwidths GB/s in the files, as vendors
state them; the ``*_bytes`` properties convert.
"""

from __future__ import annotations

import tomllib
from dataclasses import asdict, dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Literal

from edgekit.errors import ProfileNotFoundError, ProfileSchemaError
from edgekit.schema import build

GIB = 1 << 30
SCHEMA_VERSION = 1

DeviceKind = Literal["phone", "laptop", "desktop", "mini-pc", "sbc", "jetson", "server"]
AcceleratorKind = Literal["cpu", "gpu", "npu"]
BandwidthSource = Literal["spec", "measured", "unknown"]
TARGET_NAMES = ("llamacpp", "openvino", "qnn", "mlx", "tensorrt")


@dataclass(frozen=True, kw_only=True)
class CpuSpec:
    model: str
    physical_cores: int
    logical_cores: int
    performance_cores: int | None = None
    efficiency_cores: int | None = None
    isa: tuple[str, ...] = ()
    max_ghz: float | None = None


@dataclass(frozen=True, kw_only=True)
class MemorySpec:
    """Memory as a model sees it.

    ``usable_gib`` is what the OS lets one process's model use: Apple's GPU working-set
    cap, a phone's per-app limit, the OS's own share on a Jetson or laptop.
    """

    total_gib: float
    usable_gib: float
    usable_note: str = ""
    bandwidth_gbps: float | None = None
    bandwidth_source: BandwidthSource = "spec"
    unified: bool = False
    available_gib: float | None = None  # measured by the host probe only

    @property
    def total_bytes(self) -> int:
        return int(self.total_gib * GIB)

    @property
    def usable_bytes(self) -> int:
        return int(self.usable_gib * GIB)


@dataclass(frozen=True, kw_only=True)
class Accelerator:
    """One compute unit. ``peak_tops`` maps a precision (fp32, fp16, bf16, int8, int4) to
    dense tera-operations per second as the vendor states them (TFLOPS for floats)."""

    kind: AcceleratorKind
    name: str
    peak_tops: dict[str, float] = field(default_factory=dict)
    memory_gib: float | None = None  # dedicated memory (discrete GPUs)
    memory_bandwidth_gbps: float | None = None  # of that dedicated memory
    runtime_device: str | None = None  # how a runtime names it: "NPU", "GPU.0", "cuda:0", "HTP"
    note: str = ""  # how a figure was derived when it is not a vendor figure
    # Limits the planner applies to models on this unit:
    max_model_gib: float | None = None  # address space one model may use (Hexagon: 32-bit)
    max_prompt_tokens: int | None = None  # static prompt shape (NPUs compile fixed shapes)


@dataclass(frozen=True, kw_only=True)
class PowerMode:
    name: str
    max_w: float
    compute_scale: float = 1.0  # peak compute relative to the fastest mode
    bandwidth_gbps: float | None = None  # memory bandwidth when the mode caps the memory clock
    note: str = ""


@dataclass(frozen=True, kw_only=True)
class PowerSpec:
    idle_w: float
    typical_w: float
    max_w: float
    modes: tuple[PowerMode, ...] = ()
    default_mode: str | None = None
    source: Literal["spec", "estimated"] = "spec"
    note: str = ""


@dataclass(frozen=True, kw_only=True)
class DeviceProfile:
    schema: int
    name: str
    display_name: str
    kind: DeviceKind
    os: str
    arch: str
    cpu: CpuSpec
    memory: MemorySpec
    power: PowerSpec
    accelerators: tuple[Accelerator, ...] = ()
    targets: tuple[str, ...] = ()
    sensors: tuple[str, ...] = ()  # power sensors the device exposes: rapl, nvml, jetson-ina, ...
    sources: tuple[str, ...] = ()  # where the figures come from

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def profile_names() -> list[str]:
    """Names of the profiles shipped with edgekit."""
    folder = resources.files("edgekit.profiles")
    return sorted(p.name[:-5] for p in folder.iterdir() if p.name.endswith(".toml"))


def load_profile(name_or_path: str | Path) -> DeviceProfile:
    """A shipped profile by name, or a profile TOML file by path.

    Raises:
        ProfileNotFoundError: no shipped profile of that name and no such file.
        ProfileSchemaError: the file is not valid TOML or does not match the schema.
    """
    candidate = Path(name_or_path)
    if candidate.suffix == ".toml" and candidate.is_file():
        return parse_profile(candidate.read_text(encoding="utf-8"), str(candidate))
    name = str(name_or_path)
    resource = resources.files("edgekit.profiles").joinpath(f"{name}.toml")
    if not resource.is_file():
        known = profile_names()
        close = [k for k in known if name.lower() in k]
        raise ProfileNotFoundError(
            f"no device profile named {name!r}",
            hint=(f"did you mean {', '.join(close)}? " if close else "")
            + "run `edgekit profiles` to list them, or pass a .toml file",
        )
    return parse_profile(resource.read_text(encoding="utf-8"), f"{name}.toml")


def parse_profile(text: str, where: str) -> DeviceProfile:
    """A DeviceProfile from TOML text.

    Raises:
        ProfileSchemaError: invalid TOML, schema mismatch, or inconsistent figures.
    """
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ProfileSchemaError(f"{where}: not valid TOML ({exc})") from exc
    profile = build(DeviceProfile, data, where)
    _check(profile, where)
    return profile


def _check(p: DeviceProfile, where: str) -> None:
    if p.schema != SCHEMA_VERSION:
        raise ProfileSchemaError(
            f"{where}: schema version {p.schema} is not supported (this edgekit reads "
            f"{SCHEMA_VERSION})",
            hint="upgrade edgekit",
        )
    unknown = sorted(set(p.targets) - set(TARGET_NAMES))
    if unknown:
        raise ProfileSchemaError(
            f"{where}: unknown target(s) {', '.join(unknown)}",
            hint=f"targets are: {', '.join(TARGET_NAMES)}",
        )
    if not 0 < p.memory.usable_gib <= p.memory.total_gib:
        raise ProfileSchemaError(
            f"{where}: memory.usable_gib ({p.memory.usable_gib}) must be > 0 and at most "
            f"total_gib ({p.memory.total_gib})"
        )
    if not p.power.idle_w <= p.power.typical_w <= p.power.max_w:
        raise ProfileSchemaError(f"{where}: power figures must satisfy idle <= typical <= max")
    modes = {m.name for m in p.power.modes}
    if p.power.default_mode is not None and p.power.default_mode not in modes:
        raise ProfileSchemaError(
            f"{where}: power.default_mode {p.power.default_mode!r} is not one of the modes"
        )
