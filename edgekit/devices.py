"""DeviceProfile: what a device offers a model, and the profiles shipped as TOML data.

The dataclass fields are the TOML schema (see docs/profiles.md); ``load_profile`` rejects
unknown keys and names them. Sizes are GiB and bandwidths GB/s in the files, as vendors
state them; the ``*_bytes`` properties convert.

Every figure is bounded in its field's metadata (``edgekit.schema.bounds``): memory,
bandwidth, TOPS, cores, watts and a power mode's compute scale must be finite and
positive (a plan made from a zero, negative or NaN figure predicts nonsense), and below a
ceiling no device comes near. A profile file is read as untrusted: a regular file of at
most 1 MiB, UTF-8, nested at most 16 deep; a profile name is only ever a shipped one.
"""

from __future__ import annotations

import os
import re
import stat
import tomllib
from dataclasses import asdict, dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Literal

from edgekit.errors import ProfileError, ProfileNotFoundError, ProfileSchemaError
from edgekit.plugins import target_names
from edgekit.schema import bounds, build
from edgekit.untrusted import check_depth, clean_text

GIB = 1 << 30
SCHEMA_VERSION = 1
MAX_PROFILE_BYTES = 1 << 20  # shipped profiles are ~5 KB
MAX_PROFILE_DEPTH = 16  # the schema nests 4 deep (accelerators[].peak_tops)

# Ceilings well above any device (a 1 PiB memory, 1 PB/s, a million TOPS, 100 kW,
# 65,536 cores): a larger figure is a typo or an attack, and would overflow the planner.
_GIB = bounds(gt=0, le=1 << 20)
_GBPS = bounds(gt=0, le=1e6)
_WATTS = bounds(gt=0, le=1e5)
_CORES = bounds(ge=1, le=1 << 16)
_SOME_CORES = bounds(ge=0, le=1 << 16)

DeviceKind = Literal["phone", "laptop", "desktop", "mini-pc", "sbc", "jetson", "server"]
AcceleratorKind = Literal["cpu", "gpu", "npu"]
BandwidthSource = Literal["spec", "measured", "unknown"]


@dataclass(frozen=True, kw_only=True)
class CpuSpec:
    model: str
    physical_cores: int = field(metadata=_CORES)
    logical_cores: int = field(metadata=_CORES)
    performance_cores: int | None = field(default=None, metadata=_SOME_CORES)
    efficiency_cores: int | None = field(default=None, metadata=_SOME_CORES)
    isa: tuple[str, ...] = ()
    max_ghz: float | None = field(default=None, metadata=bounds(gt=0, le=100))


@dataclass(frozen=True, kw_only=True)
class MemorySpec:
    """Memory as a model sees it.

    ``usable_gib`` is what the OS lets one process's model use: Apple's GPU working-set
    cap, a phone's per-app limit, the OS's own share on a Jetson or laptop.
    """

    total_gib: float = field(metadata=_GIB)
    usable_gib: float = field(metadata=_GIB)
    usable_note: str = ""
    bandwidth_gbps: float | None = field(default=None, metadata=_GBPS)
    bandwidth_source: BandwidthSource = "spec"
    unified: bool = False
    # measured by the host probe only
    available_gib: float | None = field(default=None, metadata=bounds(ge=0, le=1 << 20))

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
    peak_tops: dict[str, float] = field(default_factory=dict, metadata=bounds(gt=0, le=1e6))
    # dedicated memory (discrete GPUs) and its bandwidth
    memory_gib: float | None = field(default=None, metadata=_GIB)
    memory_bandwidth_gbps: float | None = field(default=None, metadata=_GBPS)
    runtime_device: str | None = None  # how a runtime names it: "NPU", "GPU.0", "cuda:0", "HTP"
    note: str = ""  # how a figure was derived when it is not a vendor figure
    # Limits the planner applies to models on this unit: the address space one model may
    # use (Hexagon: 32-bit), a static prompt shape (NPUs compile fixed shapes).
    max_model_gib: float | None = field(default=None, metadata=_GIB)
    max_prompt_tokens: int | None = field(default=None, metadata=bounds(ge=1, le=1 << 26))
    # The part number of the chip this unit is in, for builds compiled for one chip (a QNN
    # HTP context binary is made for one Snapdragon): "SM8750", as the device reports it.
    soc: str | None = None


@dataclass(frozen=True, kw_only=True)
class PowerMode:
    name: str
    max_w: float = field(metadata=_WATTS)
    # peak compute relative to the fastest mode
    compute_scale: float = field(default=1.0, metadata=bounds(gt=0, le=1))
    # memory bandwidth when the mode caps the memory clock
    bandwidth_gbps: float | None = field(default=None, metadata=_GBPS)
    note: str = ""


@dataclass(frozen=True, kw_only=True)
class PowerSpec:
    idle_w: float = field(metadata=_WATTS)
    typical_w: float = field(metadata=_WATTS)
    max_w: float = field(metadata=_WATTS)
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


_SOC_PART = re.compile(r"[A-Z][A-Z0-9]{1,15}")


def profile_names() -> list[str]:
    """Names of the profiles shipped with edgekit."""
    folder = resources.files("edgekit.profiles")
    return sorted(p.name[:-5] for p in folder.iterdir() if p.name.endswith(".toml"))


def load_profile(name_or_path: str | Path) -> DeviceProfile:
    """A shipped profile by name, or a profile TOML file by path.

    Raises:
        ProfileNotFoundError: no shipped profile of that name and no such file.
        ProfileError: the path is not a regular file (a folder, a FIFO, a device).
        ProfileSchemaError: the file is too large, not UTF-8, not valid TOML, or does
            not match the schema.
    """
    text = str(name_or_path)
    candidate = Path(text.replace("\x00", ""))
    if "\x00" not in text and candidate.suffix == ".toml" and os.path.lexists(candidate):
        return parse_profile(_read_profile_file(candidate), str(candidate))
    # A name is only ever one of the shipped profiles: it never becomes a path.
    known = profile_names()
    if text not in known:
        needle = text.lower()
        close = [k for k in known if needle and needle in k]
        raise ProfileNotFoundError(
            f"no device profile named {clean_text(repr(text), max_len=100)}",
            hint=(f"did you mean {', '.join(close)}? " if close else "")
            + "run `edgekit profiles` to list them, or pass a .toml file",
        )
    resource = resources.files("edgekit.profiles").joinpath(f"{text}.toml")
    return parse_profile(resource.read_text(encoding="utf-8"), f"{text}.toml")


def _read_profile_file(path: Path) -> str:
    hint = "pass a device profile .toml file (docs/profiles.md)"
    try:
        st = path.stat()  # follows a link: where it leads must be a plain file
        if not stat.S_ISREG(st.st_mode):
            raise ProfileError(f"{path}: not a regular file", hint=hint)
        if st.st_size > MAX_PROFILE_BYTES:
            raise ProfileSchemaError(
                f"{path}: {st.st_size:,} bytes is larger than the {MAX_PROFILE_BYTES:,} "
                "bytes allowed"
            )
        data = path.read_bytes()[: MAX_PROFILE_BYTES + 1]
    except OSError as exc:
        raise ProfileError(f"{path}: cannot be read ({exc.strerror or exc})", hint=hint) from exc
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ProfileSchemaError(f"{path}: not UTF-8 text ({exc.reason})") from exc


def parse_profile(text: str, where: str) -> DeviceProfile:
    """A DeviceProfile from TOML text.

    Raises:
        ProfileSchemaError: too large, invalid or too deeply nested TOML, schema
            mismatch, a figure out of bounds, or inconsistent figures.
    """
    if len(text) > MAX_PROFILE_BYTES:
        raise ProfileSchemaError(
            f"{where}: {len(text):,} characters is larger than the {MAX_PROFILE_BYTES:,} allowed"
        )
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ProfileSchemaError(f"{where}: not valid TOML ({exc})") from exc
    except RecursionError as exc:  # tomllib recurses into nested arrays and inline tables
        raise ProfileSchemaError(f"{where}: nested too deeply to read") from exc
    except ValueError as exc:  # an integer longer than Python converts (4300 digits)
        raise ProfileSchemaError(f"{where}: not readable TOML ({exc})") from exc
    check_depth(data, where=where, max_depth=MAX_PROFILE_DEPTH, error=ProfileSchemaError)
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
    # the installed targets' names, from entry-point metadata: core imports no target
    known = target_names()
    unknown = sorted(set(p.targets) - set(known))
    if unknown:
        raise ProfileSchemaError(
            f"{where}: unknown target(s) {', '.join(unknown)}",
            hint=f"targets are: {', '.join(known)}",
        )
    if not 0 < p.memory.usable_gib <= p.memory.total_gib:
        raise ProfileSchemaError(
            f"{where}: memory.usable_gib ({p.memory.usable_gib}) must be > 0 and at most "
            f"total_gib ({p.memory.total_gib})"
        )
    if not p.power.idle_w <= p.power.typical_w <= p.power.max_w:
        raise ProfileSchemaError(f"{where}: power figures must satisfy idle <= typical <= max")
    _check_cores(p.cpu, where)
    for i, acc in enumerate(p.accelerators):
        # a part number goes into build options and file names: letters and digits only
        if acc.soc is not None and not _SOC_PART.fullmatch(acc.soc):
            raise ProfileSchemaError(
                f"{where}: accelerators[{i}].soc {clean_text(repr(acc.soc))} is not a chip "
                "part number",
                hint='write it as the device reports it, e.g. "SM8750"',
            )
    names = [m.name for m in p.power.modes]
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise ProfileSchemaError(
            f"{where}: power.modes: the mode name(s) {', '.join(map(repr, repeated))} appear "
            "more than once"
        )
    modes = set(names)
    if p.power.default_mode is not None and p.power.default_mode not in modes:
        raise ProfileSchemaError(
            f"{where}: power.default_mode {p.power.default_mode!r} is not one of the modes"
        )


def _check_cores(cpu: CpuSpec, where: str) -> None:
    if cpu.physical_cores > cpu.logical_cores:
        raise ProfileSchemaError(
            f"{where}: cpu.physical_cores ({cpu.physical_cores}) is more than "
            f"cpu.logical_cores ({cpu.logical_cores})"
        )
    split = (cpu.performance_cores or 0) + (cpu.efficiency_cores or 0)
    if split > cpu.physical_cores:
        raise ProfileSchemaError(
            f"{where}: cpu.performance_cores + cpu.efficiency_cores ({split}) is more than "
            f"cpu.physical_cores ({cpu.physical_cores})"
        )
