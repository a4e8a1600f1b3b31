"""The PowerMeter interface."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass


class MeterUnavailable(Exception):
    """The sensor cannot be read (absent, no permission, gone); the message says why."""


@dataclass(frozen=True, kw_only=True)
class Reading:
    """One sample: the time it was taken and either the energy counter (joules, for meters
    with a cumulative counter) or the instantaneous power (watts)."""

    t: float
    joules: float | None = None
    watts: float | None = None


class PowerMeter(ABC):
    name: str  # rapl, nvml, jetson-ina, powermetrics, battery, estimated
    measured: bool = True  # False only for the estimate
    detail: str = ""  # what the figure covers, where a sensor sees more than one thing

    @abstractmethod
    def read(self) -> Reading:
        """Take one sample. Raises MeterUnavailable when the sensor cannot be read."""

    def close(self) -> None:  # noqa: B027 - optional hook, a no-op for most meters
        """Release what the meter holds (a subprocess, a library handle)."""
