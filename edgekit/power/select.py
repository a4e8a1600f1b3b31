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
    """The first readable sensor (rapl, nvml, jetson-ina, powermetrics, battery), else the
    estimate from the envelope ``idle_w``..``max_w``; plus why each sensor was passed over.

    ``prefer`` names one meter to use (``estimated`` included).
    """
    candidates: list[tuple[str, Callable[[], PowerMeter]]] = [
        ("rapl", lambda: RaplMeter(root)),
        ("nvml", NvmlMeter),
        ("jetson-ina", lambda: JetsonInaMeter(root)),
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
