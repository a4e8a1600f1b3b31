"""Intel/AMD RAPL through the powercap sysfs: package energy counters, with wrap-around.

Since 2020 (CVE-2020-8694, "Platypus") most kernels make energy_uj readable by root only;
the meter then reports that and the sampler falls back to another meter.
"""

from __future__ import annotations

import time
from pathlib import Path

from edgekit.power.base import MeterUnavailable, PowerMeter, Reading


class RaplMeter(PowerMeter):
    name = "rapl"

    def __init__(self, root: Path = Path("/")) -> None:
        zones = sorted((root / "sys/class/powercap").glob("intel-rapl:*"))
        self.packages = [z for z in zones if z.name.count(":") == 1]
        if not self.packages:
            raise MeterUnavailable("no powercap RAPL zones")
        self.ranges = [self._range(z) for z in self.packages]
        self.last: list[int] | None = None
        self.total_uj = 0
        self.read()  # fail now, not in the sampler, if the counters are unreadable

    @staticmethod
    def _range(zone: Path) -> int:
        try:
            return int((zone / "max_energy_range_uj").read_text())
        except (OSError, ValueError):
            return 1 << 32

    def _counters(self) -> list[int]:
        values = []
        for zone in self.packages:
            try:
                values.append(int((zone / "energy_uj").read_text()))
            except PermissionError as exc:
                raise MeterUnavailable(
                    f"{zone / 'energy_uj'} is readable by root only (CVE-2020-8694 hardening)"
                ) from exc
            except (OSError, ValueError) as exc:
                raise MeterUnavailable(f"{zone}: {exc}") from exc
        return values

    def read(self) -> Reading:
        now = time.monotonic()
        values = self._counters()
        if self.last is not None:
            for old, new, span in zip(self.last, values, self.ranges, strict=True):
                # The counter wraps at max_energy_range_uj back to 0.
                self.total_uj += new - old if new >= old else new + span - old
        self.last = values
        return Reading(t=now, joules=self.total_uj / 1e6)
