"""Pick the best power meter this host can read, and say why the others cannot be used."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from edgekit.power.base import MeterUnavailable, PowerMeter
from edgekit.power.other_meters import EstimatedMeter, NvmlMeter, PowermetricsMeter
from edgekit.power.rapl import RaplMeter
from edgekit.power.sysfs_meters import BatteryMeter, JetsonInaMeter


def select_meter(
    *, idle_w: float, max_w: float, root: Path = Path("/"), prefer: str | None = None
) -> tuple[PowerMeter, dict[str, str]]:
    """The first readable sensor (rapl, jetson-ina, nvml, powermetrics, battery), else the
    estimate from the envelope ``idle_w``..``max_w``; plus why each sensor was passed over.

    ``prefer`` names one meter to use (``estimated`` included).
    """
    candidates: list[tuple[str, Callable[[], PowerMeter]]] = [
        ("rapl", lambda: RaplMeter(root)),
        # before NVML: where INA3221 rails exist (a Jetson) they measure the whole module
        ("jetson-ina", lambda: JetsonInaMeter(root)),
        ("nvml", NvmlMeter),
        ("powermetrics", PowermetricsMeter),
        ("battery", lambda: BatteryMeter(root)),
    ]
    skipped: dict[str, str] = {}
    for name, make in candidates:
        if prefer and name != prefer:
            continue
        try:
            return make(), skipped
        except MeterUnavailable as exc:
            skipped[name] = str(exc)
    return EstimatedMeter(idle_w=idle_w, max_w=max_w), skipped


def use_meter(
    meter: str | PowerMeter | None, *, idle_w: float, max_w: float, root: Path = Path("/")
) -> tuple[PowerMeter, dict[str, str]]:
    """``meter`` itself when it is a PowerMeter (the caller's, to close), else the one
    select_meter picks by that name (or the best here, for None); plus why each sensor
    was passed over."""
    if isinstance(meter, PowerMeter):
        return meter, {}
    return select_meter(idle_w=idle_w, max_w=max_w, root=root, prefer=meter)
