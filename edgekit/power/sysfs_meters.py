"""Meters that read instantaneous power from sysfs: Jetson INA3221 rails and batteries."""

from __future__ import annotations

import time
from pathlib import Path

from edgekit.power.base import MeterUnavailable, PowerMeter, Reading


def _read_int(path: Path) -> int:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError) as exc:
        raise MeterUnavailable(f"{path}: {exc}") from exc


class JetsonInaMeter(PowerMeter):
    """The module's input rail (VDD_IN) of the INA3221 monitor: bus millivolts x milliamps.

    Without a VDD_IN label, the labelled rails are summed (an under-count: it misses what
    the monitor does not see)."""

    name = "jetson-ina"

    def __init__(self, root: Path = Path("/")) -> None:
        self.rails: list[tuple[Path, Path]] = []
        for name_file in sorted((root / "sys/class/hwmon").glob("hwmon*/name")):
            if name_file.read_text(errors="replace").strip() != "ina3221":
                continue
            hwmon = name_file.parent
            labelled = {
                label.read_text().strip(): label.name.split("_")[0][2:]
                for label in sorted(hwmon.glob("in*_label"))
            }
            channels = [labelled["VDD_IN"]] if "VDD_IN" in labelled else list(labelled.values())
            self.rails = [(hwmon / f"in{c}_input", hwmon / f"curr{c}_input") for c in channels]
            break
        if not self.rails:
            raise MeterUnavailable("no INA3221 power monitor")
        self.read()

    def read(self) -> Reading:
        watts = sum(_read_int(v) * _read_int(i) for v, i in self.rails) / 1e6
        return Reading(t=time.monotonic(), watts=watts)


class BatteryMeter(PowerMeter):
    """Discharge power of a laptop or phone battery (power_supply sysfs): power_now, or
    current_now x voltage_now. Meaningful only while on battery, so it refuses otherwise."""

    name = "battery"

    def __init__(self, root: Path = Path("/")) -> None:
        supplies = [
            s
            for s in sorted((root / "sys/class/power_supply").glob("*"))
            if (s / "type").is_file() and (s / "type").read_text().strip() == "Battery"
        ]
        if not supplies:
            raise MeterUnavailable("no battery")
        self.supply = supplies[0]
        self.read()

    def read(self) -> Reading:
        status = (
            (self.supply / "status").read_text().strip()
            if (self.supply / "status").is_file()
            else ""
        )
        if status != "Discharging":
            raise MeterUnavailable(
                f"the battery is {status.lower() or 'not discharging'}: unplug to measure"
            )
        if (self.supply / "power_now").is_file():
            watts = _read_int(self.supply / "power_now") / 1e6
        else:
            watts = (
                _read_int(self.supply / "current_now")
                * _read_int(self.supply / "voltage_now")
                / 1e12
            )
        return Reading(t=time.monotonic(), watts=abs(watts))
