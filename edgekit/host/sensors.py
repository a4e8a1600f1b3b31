"""Which power sensors this user can read on this host, and why not when not.

Detection only: the meters that sample them belong to the profiler. Every check takes a
``root`` so tests run against recorded sysfs trees.
"""

from __future__ import annotations

import os
import platform
import shutil
from dataclasses import dataclass
from pathlib import Path

from edgekit.host.ina3221 import find_rails
from edgekit.host.nvml import Nvml, NvmlUnavailable
from edgekit.host.sysfs import TreeError

SENSOR_NAMES = ("rapl", "nvml", "jetson-ina", "battery", "powermetrics")


@dataclass(frozen=True, kw_only=True)
class SensorFacts:
    name: str
    readable: bool
    detail: str  # the path read, or why it cannot be read


def rapl(root: Path) -> SensorFacts:
    zones = sorted((root / "sys/class/powercap").glob("intel-rapl:*"))
    packages = [z for z in zones if z.name.count(":") == 1]
    if not packages:
        return SensorFacts(name="rapl", readable=False, detail="no powercap RAPL zones")
    counter = packages[0] / "energy_uj"
    try:
        int(counter.read_text().strip())
    except PermissionError:
        return SensorFacts(
            name="rapl",
            readable=False,
            detail=f"{counter} is readable by root only (Linux restricts RAPL since 2020, "
            "CVE-2020-8694): run as root or grant read access",
        )
    except (OSError, ValueError) as exc:
        return SensorFacts(name="rapl", readable=False, detail=f"{counter}: {exc}")
    return SensorFacts(name="rapl", readable=True, detail=f"{len(packages)} package zone(s)")


def nvml() -> SensorFacts:
    try:
        with Nvml() as session:
            if session.count() == 0:
                return SensorFacts(name="nvml", readable=False, detail="NVML sees no GPU")
            watts = session.power_w(0)
    except NvmlUnavailable as exc:
        return SensorFacts(name="nvml", readable=False, detail=str(exc))
    return SensorFacts(name="nvml", readable=True, detail=f"GPU 0 draws {watts:.1f} W")


def jetson_ina(root: Path) -> SensorFacts:
    rails = find_rails(root)
    if not rails.rails:
        why = f": {rails.skipped[0]}" if rails.skipped else ""
        return SensorFacts(name="jetson-ina", readable=False, detail=f"no INA3221 rail{why}")
    try:
        watts = rails.read(root)
    except TreeError as exc:
        return SensorFacts(name="jetson-ina", readable=False, detail=str(exc))
    listed = ", ".join(f"{label} {w:.2f} W" for label, w in watts.items())
    return SensorFacts(
        name="jetson-ina",
        readable=True,
        detail=f"rails: {listed}; module power = {rails.derivation}",
    )


def battery(root: Path) -> SensorFacts:
    for supply in sorted((root / "sys/class/power_supply").glob("*")):
        kind = supply / "type"
        if not kind.is_file() or kind.read_text().strip() != "Battery":
            continue
        has_power = (supply / "power_now").is_file() or (
            (supply / "current_now").is_file() and (supply / "voltage_now").is_file()
        )
        if not has_power:
            return SensorFacts(
                name="battery", readable=False, detail=f"{supply.name} reports no current/power"
            )
        status_file = supply / "status"
        status = status_file.read_text().strip() if status_file.is_file() else "Unknown"
        if status != "Discharging":
            return SensorFacts(
                name="battery",
                readable=False,
                detail=f"{supply.name} is {status.lower()}: discharge is measured only on battery",
            )
        return SensorFacts(name="battery", readable=True, detail=f"{supply.name} discharging")
    return SensorFacts(name="battery", readable=False, detail="no battery")


def powermetrics() -> SensorFacts:
    if platform.system() != "Darwin":
        return SensorFacts(name="powermetrics", readable=False, detail="not macOS")
    if shutil.which("powermetrics") is None:
        return SensorFacts(name="powermetrics", readable=False, detail="powermetrics not found")
    if os.geteuid() != 0:
        return SensorFacts(
            name="powermetrics", readable=False, detail="powermetrics needs sudo (run as root)"
        )
    return SensorFacts(name="powermetrics", readable=True, detail="/usr/bin/powermetrics")


def read_sensors(root: Path = Path("/")) -> tuple[SensorFacts, ...]:
    """Every sensor edgekit knows, readable or with the reason it is not."""
    return (rapl(root), nvml(), jetson_ina(root), battery(root), powermetrics())
