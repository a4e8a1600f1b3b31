"""NVIDIA NVML, Apple powermetrics, and the estimate from CPU utilisation."""

from __future__ import annotations

import re
import shutil
import subprocess
import time

import psutil

from edgekit.host.nvml import Nvml, NvmlUnavailable
from edgekit.power.base import MeterUnavailable, PowerMeter, Reading


class NvmlMeter(PowerMeter):
    """GPU board power: the total-energy counter where the GPU has one, else power samples."""

    name = "nvml"

    def __init__(self, index: int = 0) -> None:
        try:
            self.nvml = Nvml()
            if self.nvml.count() <= index:
                raise MeterUnavailable("NVML sees no GPU")
        except NvmlUnavailable as exc:
            raise MeterUnavailable(str(exc)) from exc
        self.index = index
        self.read()

    def read(self) -> Reading:
        try:
            energy = self.nvml.energy_j(self.index)
            if energy is not None:
                return Reading(t=time.monotonic(), joules=energy)
            return Reading(t=time.monotonic(), watts=self.nvml.power_w(self.index))
        except NvmlUnavailable as exc:
            raise MeterUnavailable(str(exc)) from exc

    def close(self) -> None:
        self.nvml.__exit__()


_COMBINED = re.compile(r"Combined Power \(CPU \+ GPU \+ ANE\):\s*([\d.]+)\s*mW")


def parse_powermetrics(text: str) -> float:
    """Watts from one powermetrics sample (its "Combined Power" line).

    Raises:
        MeterUnavailable: the line is not there.
    """
    m = _COMBINED.search(text)
    if not m:
        raise MeterUnavailable("powermetrics printed no 'Combined Power' line")
    return float(m.group(1)) / 1000


class PowermetricsMeter(PowerMeter):
    """Apple silicon package power from ``powermetrics`` (needs root: sudo)."""

    name = "powermetrics"

    def __init__(self) -> None:
        if shutil.which("powermetrics") is None:
            raise MeterUnavailable("powermetrics not found (not macOS)")
        self.read()

    def read(self) -> Reading:
        try:
            out = subprocess.run(
                ["powermetrics", "--samplers", "cpu_power,gpu_power", "-i", "100", "-n", "1"],
                capture_output=True,
                text=True,
                timeout=5,
                check=True,
            ).stdout
        except subprocess.CalledProcessError as exc:
            raise MeterUnavailable("powermetrics needs root: run under sudo") from exc
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise MeterUnavailable(f"powermetrics failed: {exc}") from exc
        return Reading(t=time.monotonic(), watts=parse_powermetrics(out))


class EstimatedMeter(PowerMeter):
    """idle + (max - idle) x CPU utilisation since the last sample: an estimate, labelled so.

    The envelope comes from a device profile (the host probe's is itself estimated from
    the core count unless a profile is given)."""

    name = "estimated"
    measured = False

    def __init__(self, idle_w: float, max_w: float) -> None:
        self.idle_w, self.max_w = idle_w, max_w
        psutil.cpu_percent(interval=None)  # start the utilisation window

    def read(self) -> Reading:
        utilisation = psutil.cpu_percent(interval=None) / 100
        return Reading(
            t=time.monotonic(), watts=self.idle_w + (self.max_w - self.idle_w) * utilisation
        )
