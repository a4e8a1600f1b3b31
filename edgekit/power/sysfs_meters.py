"""Meters that read instantaneous power from sysfs: Jetson INA3221 rails and batteries."""

from __future__ import annotations

import time
from pathlib import Path

from edgekit.host.ina3221 import find_rails
from edgekit.host.sysfs import TreeError
from edgekit.power.base import MeterUnavailable, PowerMeter, Reading


def _read_int(path: Path) -> int:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError) as exc:
        raise MeterUnavailable(f"{path}: {exc}") from exc


class JetsonInaMeter(PowerMeter):
    """The Jetson module's power from its INA3221 monitors: the input rail (VDD_IN) where
    the board has one, else the sum its layout defines (edgekit.host.ina3221); ``detail``
    says which rails, ``rails()`` reads each of them."""

    name = "jetson-ina"

    def __init__(self, root: Path = Path("/")) -> None:
        self.root = root
        self.railset = find_rails(root)
        if not self.railset.module:
            why = "; ".join(self.railset.skipped[:3])
            raise MeterUnavailable("no INA3221 power monitor" + (f" ({why})" if why else ""))
        self.detail = self.railset.derivation
        self.read()  # fail now, not in the sampler, if a rail is unreadable

    def read(self) -> Reading:
        try:
            watts = self.railset.module_watts(self.root)
        except TreeError as exc:
            raise MeterUnavailable(str(exc)) from exc
        return Reading(t=time.monotonic(), watts=watts)

    def rails(self) -> dict[str, float]:
        """Watts of every rail now, by label."""
        try:
            return self.railset.read(self.root)
        except TreeError as exc:
            raise MeterUnavailable(str(exc)) from exc


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
