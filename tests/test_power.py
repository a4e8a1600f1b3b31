"""Power meters against recorded sysfs trees (wrap-around, missing permission, a sensor
that disappears mid-run), the sampler's window arithmetic, and meter selection."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from edgekit.power.base import MeterUnavailable, PowerMeter, Reading
from edgekit.power.other_meters import EstimatedMeter, parse_powermetrics
from edgekit.power.rapl import RaplMeter
from edgekit.power.sampler import PowerSampler
from edgekit.power.select import select_meter
from edgekit.power.sysfs_meters import BatteryMeter, JetsonInaMeter


def _write(root: Path, rel: str, text: str) -> Path:
    p = root / rel
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text)
    return p


# --- RAPL -------------------------------------------------------------------------------


def _rapl(root: Path, energy: int, span: int = 262143328850) -> Path:
    zone = "sys/class/powercap/intel-rapl:0"
    _write(root, f"{zone}/max_energy_range_uj", f"{span}\n")
    return _write(root, f"{zone}/energy_uj", f"{energy}\n")


def test_rapl_counts_joules(tmp_path: Path) -> None:
    counter = _rapl(tmp_path, 1_000_000)
    meter = RaplMeter(tmp_path)
    counter.write_text("3500000\n")
    assert meter.read().joules == pytest.approx(2.5)


def test_rapl_counter_wraps(tmp_path: Path) -> None:
    counter = _rapl(tmp_path, 990_000, span=1_000_000)
    meter = RaplMeter(tmp_path)
    counter.write_text("10000\n")  # wrapped: 10,000 uJ to the top, 10,000 after zero
    assert meter.read().joules == pytest.approx(0.02)


def test_rapl_root_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _rapl(tmp_path, 1)
    original = Path.read_text

    def deny(self: Path, *a, **k):  # type: ignore[no-untyped-def]
        if self.name == "energy_uj":
            raise PermissionError(13, "Permission denied")
        return original(self, *a, **k)

    monkeypatch.setattr(Path, "read_text", deny)
    with pytest.raises(MeterUnavailable, match="root only"):
        RaplMeter(tmp_path)


def test_rapl_absent(tmp_path: Path) -> None:
    with pytest.raises(MeterUnavailable, match="no powercap"):
        RaplMeter(tmp_path)


# --- Jetson and battery ------------------------------------------------------------------


def _ina(root: Path, mv: int = 5000, ma: int = 1200) -> None:
    h = "sys/class/hwmon/hwmon1"
    _write(root, f"{h}/name", "ina3221\n")
    for channel, label, volts, amps in ((1, "VDD_IN", mv, ma), (2, "VDD_CPU_GPU_CV", 5000, 400)):
        _write(root, f"{h}/in{channel}_label", f"{label}\n")
        _write(root, f"{h}/in{channel}_input", f"{volts}\n")
        _write(root, f"{h}/curr{channel}_input", f"{amps}\n")


def test_jetson_reads_the_input_rail(tmp_path: Path) -> None:
    _ina(tmp_path)
    assert JetsonInaMeter(tmp_path).read().watts == pytest.approx(6.0)  # 5 V x 1.2 A


def test_jetson_sensor_that_disappears(tmp_path: Path) -> None:
    _ina(tmp_path)
    meter = JetsonInaMeter(tmp_path)
    (tmp_path / "sys/class/hwmon/hwmon1/curr1_input").unlink()
    with pytest.raises(MeterUnavailable):
        meter.read()


def _battery(root: Path, status: str) -> None:
    b = "sys/class/power_supply/BAT0"
    _write(root, f"{b}/type", "Battery\n")
    _write(root, f"{b}/status", f"{status}\n")
    _write(root, f"{b}/current_now", "1500000\n")  # 1.5 A
    _write(root, f"{b}/voltage_now", "11400000\n")  # 11.4 V


def test_battery_while_discharging(tmp_path: Path) -> None:
    _battery(tmp_path, "Discharging")
    assert BatteryMeter(tmp_path).read().watts == pytest.approx(17.1)


def test_battery_on_mains_is_refused(tmp_path: Path) -> None:
    _battery(tmp_path, "Charging")
    with pytest.raises(MeterUnavailable, match="unplug"):
        BatteryMeter(tmp_path)


def test_powermetrics_parsing() -> None:
    sample = (
        "**** Processor usage ****\nCPU Power: 3120 mW\nGPU Power: 890 mW\nANE Power: 0 mW\n"
        "Combined Power (CPU + GPU + ANE): 4010 mW\n"
    )
    assert parse_powermetrics(sample) == pytest.approx(4.01)
    with pytest.raises(MeterUnavailable):
        parse_powermetrics("powermetrics must be invoked as the superuser")


def test_estimated_meter_follows_utilisation(monkeypatch: pytest.MonkeyPatch) -> None:
    import psutil

    meter = EstimatedMeter(idle_w=2.0, max_w=12.0)
    monkeypatch.setattr(psutil, "cpu_percent", lambda interval=None: 50.0)
    assert meter.read().watts == pytest.approx(7.0)
    assert meter.measured is False and meter.name == "estimated"


def test_selection_falls_back_to_the_estimate_and_says_why(tmp_path: Path) -> None:
    meter, skipped = select_meter(idle_w=1, max_w=10, root=tmp_path)
    assert meter.name in ("estimated", "nvml", "powermetrics")  # nothing in the empty tree
    assert skipped["rapl"] == "no powercap RAPL zones"
    assert skipped["battery"] == "no battery"
    _ina(tmp_path)
    assert (
        select_meter(idle_w=1, max_w=10, root=tmp_path, prefer="jetson-ina")[0].name == "jetson-ina"
    )


# --- the sampler ---------------------------------------------------------------------------


class ScriptedMeter(PowerMeter):
    """Watts from a list (then the sensor vanishes): a fake of the layer below."""

    name = "scripted"

    def __init__(self, watts: list[float], *, energy: bool = False) -> None:
        self.watts, self.energy, self.t, self.j = list(watts), energy, 0.0, 0.0

    def read(self) -> Reading:
        if not self.watts:
            raise MeterUnavailable("sensor gone")
        self.t += 1.0
        w = self.watts.pop(0)
        if self.energy:
            self.j += w
            return Reading(t=self.t, joules=self.j)
        return Reading(t=self.t, watts=w)


def test_window_integrates_watts() -> None:
    sampler = PowerSampler(ScriptedMeter([10, 10, 20, 20, 10]))
    for _ in range(5):
        sampler.sample_now()
    w = sampler.window(1.0, 5.0)
    assert w.joules == pytest.approx(10 + 15 + 20 + 15)
    assert w.peak_w == 20 and w.avg_w == pytest.approx(60 / 4) and w.complete


def test_energy_counters_become_watts() -> None:
    sampler = PowerSampler(ScriptedMeter([0, 5, 5, 7], energy=True))
    for _ in range(4):
        sampler.sample_now()
    assert [w for _, w in sampler.samples] == [5, 5, 7]


def test_lost_sensor_marks_later_windows_incomplete() -> None:
    sampler = PowerSampler(ScriptedMeter([10, 10]))
    for _ in range(4):
        sampler.sample_now()
    assert sampler.lost == "sensor gone"
    assert sampler.window(1.0, 2.0).complete is True
    assert sampler.window(1.0, time.monotonic() + 10).complete is False


def test_background_sampling_and_peak_memory() -> None:
    meter = EstimatedMeter(idle_w=1, max_w=2)
    with PowerSampler(meter, interval_s=0.01) as sampler:
        time.sleep(0.2)
    assert len(sampler.samples) >= 5
    assert sampler.peak_rss > 10_000_000
