"""NVIDIA Jetson INA3221 power monitors: every rail with its name, and the module's power.

Two driver layouts (NVIDIA Jetson Linux Developer Guide, "Platform Power and Performance"):

- JetPack 5 and later (the upstream ``ina3221`` hwmon driver):
  ``/sys/bus/i2c/drivers/ina3221/<bus>-<addr>/hwmon/hwmonN/`` with ``in[123]_label``,
  ``in[123]_input`` (bus voltage, mV), ``curr[123]_input`` (mA) and ``in[123]_enable``
  (0: disabled, its inputs answer ENODATA: skipped). ``in4..6_input`` are
  shunt voltages (uV) and ``in7`` their sum: they are not rails and are never read. A
  channel the device tree leaves unwired has no label, or the label ``NC``.
- JetPack 4 (NVIDIA's ``ina3221x`` IIO driver):
  ``/sys/bus/i2c/drivers/ina3221x/<bus>-<addr>/iio:deviceN/`` with ``rail_name_[012]`` and
  ``in_power[012]_input`` (mW).

The module's power is its input rail where the board has one (VDD_IN on Orin Nano / NX
and Xavier NX, POM_5V_IN on the Nano); the AGX Orin has none, and its module power is the
sum of its three supplies. Every figure says which rails it is and how it was derived.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from edgekit.host.sysfs import (
    TreeError,
    TreeMissing,
    exists,
    list_dir,
    read_int,
    read_label,
    resolve,
)

HWMON_DRIVER = "sys/bus/i2c/drivers/ina3221"
IIO_DRIVER = "sys/bus/i2c/drivers/ina3221x"
CLASS_HWMON = "sys/class/hwmon"
INPUT_RAILS = ("VDD_IN", "POM_5V_IN")
# Jetson AGX Orin: no input rail; the module's supplies are these three (NVIDIA's guide).
AGX_ORIN_SUPPLIES = ("VDD_GPU_SOC", "VDD_CPU_CV", "VIN_SYS_5V0")
MAX_MV = 26_000  # the INA3221 measures bus voltages up to 26 V
MAX_MA = 100_000
MAX_MW = 500_000
_ADDRESS = re.compile(r"\d{1,3}-00[0-9a-f]{2}")
_HWMON = re.compile(r"hwmon\d{1,4}")
_IIO = re.compile(r"iio:device\d{1,4}")


@dataclass(frozen=True, kw_only=True)
class Rail:
    label: str
    monitor: str  # the monitor's I2C bus and address, e.g. "1-0040"
    channel: int  # 1..3 (hwmon) or 0..2 (iio), as the files number them
    folder: str  # the monitor's folder, relative to the root, links resolved
    iio: bool = False  # the JetPack 4 layout: one mW file

    def watts(self, root: Path) -> float:
        """This rail's power now.

        Raises:
            TreeError: a file is missing, not a number, or out of the monitor's range.
        """
        if self.iio:
            mw = read_int(root, f"{self.folder}/in_power{self.channel}_input")
            if not 0 <= mw <= MAX_MW:
                raise TreeError(f"{self.label}: {mw} mW is not a plausible reading")
            return mw / 1e3
        mv = read_int(root, f"{self.folder}/in{self.channel}_input")
        ma = read_int(root, f"{self.folder}/curr{self.channel}_input")
        if not 0 <= mv <= MAX_MV or abs(ma) > MAX_MA:
            raise TreeError(f"{self.label}: {mv} mV x {ma} mA is beyond what an INA3221 measures")
        return mv * ma / 1e6


@dataclass(frozen=True, kw_only=True)
class RailSet:
    rails: tuple[Rail, ...]
    module: tuple[str, ...]  # the labels whose sum is the module's power
    derivation: str  # how the module figure is made, in words
    skipped: tuple[str, ...]  # channels and folders passed over, and why

    def read(self, root: Path) -> dict[str, float]:
        """Watts of every rail, by label.

        Raises:
            TreeError: a rail cannot be read.
        """
        return {r.label: r.watts(root) for r in self.rails}

    def module_watts(self, root: Path) -> float:
        """The module's power now (``derivation`` says from which rails)."""
        return sum(r.watts(root) for r in self.rails if r.label in self.module)


def find_rails(root: Path = Path("/")) -> RailSet:
    """Every labelled, connected INA3221 rail under ``root``, and how the module's power is
    derived from them. Never raises: what cannot be read is listed in ``skipped``."""
    skipped: list[str] = []
    rails: list[Rail] = []
    seen: set[str] = set()
    for folder, monitor, iio in _monitor_folders(root, skipped):
        for rail in (
            _iio_channels(root, folder, monitor, skipped)
            if iio
            else _hwmon_channels(root, folder, monitor, skipped)
        ):
            if rail.label in seen:
                skipped.append(f"{monitor} channel {rail.channel}: a second {rail.label}")
                continue
            seen.add(rail.label)
            rails.append(rail)
    module, derivation = _module(tuple(r.label for r in rails))
    return RailSet(rails=tuple(rails), module=module, derivation=derivation, skipped=tuple(skipped))


def _monitor_folders(root: Path, skipped: list[str]) -> list[tuple[str, str, bool]]:
    """(folder relative to root, monitor address, iio layout) of every INA3221, each once:
    the driver's own folders first, then /sys/class/hwmon (links into the same folders)."""
    found: dict[str, tuple[str, bool]] = {}
    candidates: list[tuple[str, str, bool]] = []
    for driver, pattern, iio in ((HWMON_DRIVER, _HWMON, False), (IIO_DRIVER, _IIO, True)):
        for device in _names(root, driver, skipped):
            if not _ADDRESS.fullmatch(device):
                continue  # bind, unbind, uevent, module
            sub = f"{driver}/{device}/hwmon" if not iio else f"{driver}/{device}"
            for name in _names(root, sub, skipped):
                if pattern.fullmatch(name):
                    candidates.append((f"{sub}/{name}", device, iio))
    for name in _names(root, CLASS_HWMON, skipped):
        if _HWMON.fullmatch(name) and _is_ina3221(root, f"{CLASS_HWMON}/{name}", skipped):
            candidates.append((f"{CLASS_HWMON}/{name}", "", False))
    for rel, device, iio in candidates:
        try:
            real = resolve(root, rel).relative_to(root).as_posix()
        except (TreeError, ValueError) as exc:
            skipped.append(str(exc))
            continue
        address = device or next(
            (p for p in reversed(real.split("/")) if _ADDRESS.fullmatch(p)), real.split("/")[-1]
        )
        found.setdefault(real, (address, iio))
    return [(real, address, iio) for real, (address, iio) in found.items()]


def _names(root: Path, rel: str, skipped: list[str]) -> list[str]:
    try:
        return list_dir(root, rel)
    except (TreeError, OSError) as exc:
        skipped.append(str(exc))
        return []


def _is_ina3221(root: Path, folder: str, skipped: list[str]) -> bool:
    try:
        return read_label(root, f"{folder}/name") == "ina3221"
    except TreeMissing:
        return False
    except TreeError as exc:
        skipped.append(str(exc))
        return False


def _hwmon_channels(root: Path, folder: str, monitor: str, skipped: list[str]) -> list[Rail]:
    rails = []
    for channel in (1, 2, 3):  # in4..in7 are shunt voltages and their sum, not rails
        where = f"{monitor} channel {channel}"
        label = _label(root, f"{folder}/in{channel}_label", where, skipped)
        if label is None:
            continue
        missing = [
            f
            for f in (f"in{channel}_input", f"curr{channel}_input")
            if not exists(root, f"{folder}/{f}")
        ]
        if missing:
            skipped.append(f"{where} ({label}): no {' or '.join(missing)}")
            continue
        if _disabled(root, f"{folder}/in{channel}_enable"):
            # the driver answers ENODATA for a disabled channel's inputs
            skipped.append(f"{where} ({label}): disabled (in{channel}_enable is 0)")
            continue
        rails.append(Rail(label=label, monitor=monitor, channel=channel, folder=folder))
    return rails


def _disabled(root: Path, rel: str) -> bool:
    """in<N>_enable reads 0 (older kernels have no such file: enabled)."""
    try:
        return read_int(root, rel) == 0
    except TreeError:
        return False


def _iio_channels(root: Path, folder: str, monitor: str, skipped: list[str]) -> list[Rail]:
    rails = []
    for channel in (0, 1, 2):
        where = f"{monitor} channel {channel}"
        label = _label(root, f"{folder}/rail_name_{channel}", where, skipped)
        if label is None:
            continue
        if not exists(root, f"{folder}/in_power{channel}_input"):
            skipped.append(f"{where} ({label}): no in_power{channel}_input")
            continue
        rails.append(Rail(label=label, monitor=monitor, channel=channel, folder=folder, iio=True))
    return rails


def _label(root: Path, rel: str, where: str, skipped: list[str]) -> str | None:
    if not exists(root, rel):
        skipped.append(f"{where}: no label (not wired, or disabled in the device tree)")
        return None
    try:
        label = read_label(root, rel)
    except TreeError as exc:
        skipped.append(f"{where}: {exc}")
        return None
    if label == "NC":
        skipped.append(f"{where}: not connected (NC)")
        return None
    return label


def _module(labels: tuple[str, ...]) -> tuple[tuple[str, ...], str]:
    """Which rails make up the module's power, and why."""
    for name in INPUT_RAILS:
        if name in labels:
            return (name,), f"{name}: the module's input rail (the other rails are inside it)"
    if all(name in labels for name in AGX_ORIN_SUPPLIES):
        others = [x for x in labels if x not in AGX_ORIN_SUPPLIES]
        return AGX_ORIN_SUPPLIES, (
            " + ".join(AGX_ORIN_SUPPLIES) + ": no input rail on this module (Jetson AGX Orin), "
            "so its three supplies are summed"
            + (f"; {', '.join(others)} reported, not added" if others else "")
            + "; the carrier board is not measured"
        )
    if labels:
        return labels, (
            f"sum of {' + '.join(labels)}: no input rail on this board, so supplies the "
            "monitors do not see are missing (an under-count)"
        )
    return (), "no INA3221 rail"
