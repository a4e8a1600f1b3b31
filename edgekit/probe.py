"""probe_host: this machine as a DeviceProfile, plus what it can run and measure.

Each part (CPU, memory, GPUs, Jetson, sensors, targets) runs on its own and fails soft:
a part that breaks is reported in ``parts`` with the reason, the rest still come back.
Figures the probe derives rather than reads (peak FLOPS, the power envelope) are marked
as estimates in the profile.
"""

from __future__ import annotations

import logging
import platform
import re
import socket
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TypeVar

from edgekit.devices import (
    GIB,
    SCHEMA_VERSION,
    Accelerator,
    CpuSpec,
    DeviceKind,
    DeviceProfile,
    MemorySpec,
    PowerSpec,
)
from edgekit.host.cpu import CpuFacts, peak_fp32_gflops, read_cpu
from edgekit.host.jetson import JetsonFacts, read_board_model, read_jetson
from edgekit.host.memory import MemoryFacts, measure_copy_bandwidth, read_memory
from edgekit.host.nvml import NvidiaGpu, list_nvidia_gpus
from edgekit.host.sensors import SensorFacts, read_sensors
from edgekit.targets.availability import TargetStatus, all_target_status, missing_modules
from edgekit.targets.contract import HostDevice, Target
from edgekit.targets.registry import all_targets

log = logging.getLogger(__name__)
T = TypeVar("T")

# Share of RAM the probe assumes a model may use: the OS, the runtime and the app keep the
# rest. On Apple silicon the Metal working-set cap (recommendedMaxWorkingSetSize) is the
# limit: llama.cpp logs show 2/3 of RAM on 16 and 32 GB Macs and 3/4 above that.
USABLE_SHARE = 0.75
APPLE_SMALL_SHARE = 2 / 3
APPLE_SMALL_MAX_GIB = 36
# platform.system() -> the os name profiles use
_OS_NAMES = {"Darwin": "macos", "Linux": "linux", "Windows": "windows"}
# Rough package power per physical core at full load, for the estimated envelope when no
# profile matches: x86 desktop/server cores draw 8-15 W each, big Arm cores 2-4 W.
_WATTS_PER_CORE = {"x86_64": 10.0, "AMD64": 10.0, "arm64": 3.0, "aarch64": 3.0}
# SMBIOS chassis types (DMTF DSP0134, 7.4.1) -> edgekit device kind
_CHASSIS: dict[int, DeviceKind] = {
    **{t: "laptop" for t in (8, 9, 10, 14, 31, 32)},
    **{t: "server" for t in (17, 23, 28, 29)},
    **{t: "desktop" for t in (3, 4, 5, 6, 7, 13, 15, 16, 24, 35, 36)},
}


@dataclass(frozen=True, kw_only=True)
class ProbePart:
    name: str
    ok: bool
    detail: str


@dataclass(frozen=True, kw_only=True)
class HostReport:
    """What ``edgekit probe`` reports: the host profile and the facts behind it."""

    profile: DeviceProfile
    hostname: str
    os_release: str
    board: str | None
    jetson: JetsonFacts | None
    nvidia_gpus: tuple[NvidiaGpu, ...]
    # GPUs and NPUs each target's SDK lists here (target name -> devices)
    target_devices: dict[str, tuple[HostDevice, ...]]
    sensors: tuple[SensorFacts, ...]
    targets: tuple[TargetStatus, ...]
    parts: tuple[ProbePart, ...]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class _Parts:
    """Runs probe parts, recording each outcome instead of letting one failure escape."""

    def __init__(self) -> None:
        self.results: list[ProbePart] = []

    def run(self, name: str, fn: Callable[[], T], default: T, describe: Callable[[T], str]) -> T:
        try:
            value = fn()
        except Exception as exc:  # a probe part must never take the probe down
            log.debug("probe part %s failed", name, exc_info=True)
            self.results.append(
                ProbePart(name=name, ok=False, detail=f"{type(exc).__name__}: {exc}")
            )
            return default
        self.results.append(ProbePart(name=name, ok=True, detail=describe(value)))
        return value


def probe_host(*, measure: bool = False, root: Path = Path("/")) -> HostReport:
    """Probe this machine. ``measure`` adds a measured memory bandwidth (about a second).

    Never raises for a missing part: see ``HostReport.parts`` for what failed and why.
    """
    parts = _Parts()
    cpu = parts.run(
        "cpu",
        lambda: read_cpu(root),
        CpuFacts(model="unknown", physical_cores=1, logical_cores=1, isa=(), max_ghz=None),
        lambda c: f"{c.model}, {c.physical_cores} physical / {c.logical_cores} logical cores",
    )
    mem = parts.run(
        "memory",
        read_memory,
        MemoryFacts(total_bytes=0, available_bytes=0),
        lambda m: f"{m.total_bytes / GIB:.1f} GiB total, {m.available_bytes / GIB:.1f} available",
    )
    bandwidth: float | None = None
    if measure:
        bandwidth = (
            parts.run(
                "bandwidth", measure_copy_bandwidth, 0.0, lambda b: f"copy {b:.1f} GB/s (measured)"
            )
            or None
        )
    no_board: str | None = None
    board = parts.run("board", lambda: read_board_model(root), no_board, lambda b: b or "none")
    jetson = parts.run(
        "jetson",
        lambda: read_jetson(root),
        None,
        lambda j: f"{j.model}, power mode {j.power_mode}" if j else "not a Jetson",
    )
    no_gpus: tuple[NvidiaGpu, ...] = ()
    gpus = parts.run(
        "nvidia",
        list_nvidia_gpus,
        no_gpus,
        lambda g: ", ".join(x.name for x in g) or "NVML sees no GPU",
    )
    target_devices = _target_devices(parts)
    no_sensors: tuple[SensorFacts, ...] = ()
    sensors = parts.run(
        "sensors",
        lambda: read_sensors(root),
        no_sensors,
        lambda s: ", ".join(x.name for x in s if x.readable) or "no readable power sensor",
    )
    no_targets: tuple[TargetStatus, ...] = ()
    targets = parts.run(
        "targets",
        all_target_status,
        no_targets,
        lambda t: ", ".join(x.name for x in t if x.usable) or "no usable target",
    )
    devices = tuple(d for found in target_devices.values() for d in found)
    profile = _host_profile(cpu, mem, bandwidth, jetson, gpus, devices, sensors, targets, root)
    return HostReport(
        profile=profile,
        hostname=socket.gethostname(),
        os_release=platform.platform(),
        board=board,
        jetson=jetson,
        nvidia_gpus=gpus,
        target_devices=target_devices,
        sensors=sensors,
        targets=targets,
        parts=tuple(parts.results),
    )


def _target_devices(parts: _Parts) -> dict[str, tuple[HostDevice, ...]]:
    """Each installed target's own list of GPUs and NPUs (one probe part per target that
    enumerates devices, named "<target>-devices")."""
    found: dict[str, tuple[HostDevice, ...]] = {}
    for target in all_targets():
        # a target that enumerates no devices is not asked (no part), nor one whose SDK
        # is missing (a missing parent package counts: find_spec imports it)
        if not _enumerates_devices(target) or missing_modules(target.sdk_modules):
            continue
        no_devices: tuple[HostDevice, ...] | None = None
        devices = parts.run(
            f"{target.name}-devices",
            target.host_devices,
            no_devices,
            lambda d: ", ".join(f"{x.device} ({x.name})" for x in d or ()) or "none",
        )
        if devices is not None:
            found[target.name] = devices
    return found


def _enumerates_devices(target: type[Target]) -> bool:
    """Whether ``target`` overrides ``Target.host_devices`` (the base lists nothing)."""
    return getattr(target.host_devices, "__func__", None) is not getattr(
        Target.host_devices, "__func__", None
    )


def _kind(root: Path, jetson: JetsonFacts | None, sensors: tuple[SensorFacts, ...]) -> DeviceKind:
    if jetson is not None:
        return "jetson"
    chassis = root / "sys/class/dmi/id/chassis_type"
    try:
        kind = _CHASSIS.get(int(chassis.read_text().strip()))
    except (OSError, ValueError):
        kind = None
    if kind:
        return kind
    if any(s.name == "battery" and "no battery" not in s.detail for s in sensors):
        return "laptop"
    # A virtual machine without SMBIOS chassis data is, in practice, a cloud server.
    cpuinfo = root / "proc/cpuinfo"
    try:
        if re.search(r"^flags\s*:.*\bhypervisor\b", cpuinfo.read_text(errors="replace"), re.M):
            return "server"
    except OSError:
        pass
    return "desktop"


def _host_accelerators(
    cpu: CpuFacts, gpus: tuple[NvidiaGpu, ...], sdk_devices: tuple[HostDevice, ...]
) -> tuple[Accelerator, ...]:
    """The CPU (its fp32 peak estimated), NVML's GPUs, and the GPUs and NPUs the targets'
    SDKs list (each unit once)."""
    ghz = cpu.max_ghz or 2.5
    accelerators = [
        Accelerator(
            kind="cpu",
            name=cpu.model,
            peak_tops={"fp32": round(peak_fp32_gflops(cpu, ghz) / 1000, 3)},
            runtime_device="CPU",
            note=f"estimated: {cpu.physical_cores} cores x {ghz} GHz"
            + ("" if cpu.max_ghz else " (clock unknown, assumed)")
            + " x FMA width",
        )
    ]
    for g in gpus:
        accelerators.append(
            Accelerator(
                kind="gpu",
                name=g.name,
                memory_gib=round(g.memory_bytes / GIB, 2),
                runtime_device=f"cuda:{g.index}",
            )
        )
    seen = {a.runtime_device for a in accelerators}
    accelerators += [
        Accelerator(kind=d.kind, name=d.name, runtime_device=d.device)
        for d in sdk_devices
        if d.device not in seen
    ]
    return tuple(accelerators)


def _host_profile(
    cpu: CpuFacts,
    mem: MemoryFacts,
    bandwidth: float | None,
    jetson: JetsonFacts | None,
    gpus: tuple[NvidiaGpu, ...],
    sdk_devices: tuple[HostDevice, ...],
    sensors: tuple[SensorFacts, ...],
    targets: tuple[TargetStatus, ...],
    root: Path,
) -> DeviceProfile:
    arch = platform.machine()
    accelerators = _host_accelerators(cpu, gpus, sdk_devices)
    watts = cpu.physical_cores * _WATTS_PER_CORE.get(arch, 5.0)
    total_gib = mem.total_bytes / GIB
    apple = platform.system() == "Darwin" and arch == "arm64"
    share = APPLE_SMALL_SHARE if apple and total_gib <= APPLE_SMALL_MAX_GIB else USABLE_SHARE
    why = "Metal working-set cap" if apple else "the OS, runtime and app keep the rest"
    return DeviceProfile(
        schema=SCHEMA_VERSION,
        name="host",
        display_name=f"this host ({cpu.model})",
        kind=_kind(root, jetson, sensors),
        os=_OS_NAMES.get(platform.system(), platform.system().lower()),
        arch=arch,
        cpu=CpuSpec(
            model=cpu.model,
            physical_cores=cpu.physical_cores,
            logical_cores=cpu.logical_cores,
            performance_cores=cpu.performance_cores,
            efficiency_cores=cpu.efficiency_cores,
            isa=cpu.isa,
            max_ghz=cpu.max_ghz,
        ),
        memory=MemorySpec(
            total_gib=round(total_gib, 3),
            usable_gib=round(total_gib * share, 3),
            usable_note=f"{share:.0%} of RAM: {why}",
            bandwidth_gbps=round(bandwidth, 2) if bandwidth else None,
            bandwidth_source="measured" if bandwidth else "unknown",
            unified=jetson is not None or apple,
            available_gib=round(mem.available_bytes / GIB, 3),
        ),
        power=PowerSpec(
            idle_w=round(0.15 * watts, 1),
            typical_w=round(0.6 * watts, 1),
            max_w=round(watts, 1),
            source="estimated",
            note=f"estimated: {_WATTS_PER_CORE.get(arch, 5.0)} W per physical core at full load",
        ),
        accelerators=accelerators,
        targets=tuple(t.name for t in targets if t.usable),
        sensors=tuple(s.name for s in sensors if s.readable),
        sources=("probe",) + (("measured bandwidth",) if bandwidth else ()),
    )
