"""edgekit probe: checked field by field against what the OS reports, and against
recorded sysfs trees for the parts this machine does not have."""

from __future__ import annotations

import json
import os
import platform
import re
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from edgekit.host import sensors
from edgekit.host.cpu import parse_cpuinfo, read_cpu
from edgekit.host.jetson import read_jetson
from edgekit.probe import probe_host

GIB = 1 << 30


@pytest.fixture(scope="module")
def probe_json() -> dict:
    out = subprocess.run(
        [sys.executable, "-m", "edgekit", "probe", "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return json.loads(out.stdout)


def _meminfo_kib(key: str) -> int:
    text = Path("/proc/meminfo").read_text()
    return int(re.search(rf"^{key}:\s+(\d+) kB", text, re.M).group(1))


@pytest.mark.skipif(not Path("/proc/cpuinfo").exists(), reason="checks against Linux /proc")
def test_probe_json_matches_the_os(probe_json: dict) -> None:
    profile = probe_json["profile"]
    cpuinfo = Path("/proc/cpuinfo").read_text()

    assert profile["name"] == "host"
    assert profile["os"] == {"Darwin": "macos"}.get(platform.system(), platform.system().lower())
    assert profile["arch"] == platform.machine()

    model = re.search(r"^model name\s*:\s*(.+)$", cpuinfo, re.M)
    if model:
        assert profile["cpu"]["model"] == model.group(1).strip()
    assert profile["cpu"]["logical_cores"] == os.cpu_count()
    assert profile["cpu"]["physical_cores"] == psutil.cpu_count(logical=False)

    flags = set(re.search(r"^(?:flags|Features)\s*:(.*)$", cpuinfo, re.M).group(1).split())
    isa = set(profile["cpu"]["isa"])
    assert ("avx2" in isa) == ("avx2" in flags)
    assert ("avx512" in isa) == ("avx512f" in flags)
    assert ("fma" in isa) == ("fma" in flags)
    assert ("neon" in isa) == ("asimd" in flags)

    total = _meminfo_kib("MemTotal") * 1024 / GIB
    assert profile["memory"]["total_gib"] == pytest.approx(total, abs=0.01)
    available = _meminfo_kib("MemAvailable") * 1024 / GIB
    assert profile["memory"]["available_gib"] == pytest.approx(available, rel=0.1)
    assert profile["memory"]["usable_gib"] < profile["memory"]["total_gib"]
    assert profile["memory"]["bandwidth_source"] == "unknown"  # not measured without --measure

    assert profile["power"]["source"] == "estimated"
    assert {s["name"] for s in probe_json["sensors"]} == set(sensors.SENSOR_NAMES)
    usable = {t["name"] for t in probe_json["targets"] if t["usable"]}
    assert set(profile["targets"]) == usable
    # Parts that fail say why; the probe itself did not crash.
    assert all(p["detail"] for p in probe_json["parts"])


def test_usable_targets_match_installed_sdks(probe_json: dict) -> None:
    import importlib.util

    by_name = {t["name"]: t for t in probe_json["targets"]}
    assert by_name["llamacpp"]["installed"] == (importlib.util.find_spec("llama_cpp") is not None)
    if by_name["llamacpp"]["installed"]:
        assert by_name["llamacpp"]["usable"]
        # The set-up builds llama.cpp portable (GGML_NATIVE=OFF): AVX2 on, no AMX kernels.
        assert "AVX2" in by_name["llamacpp"]["detail"]
        assert "AMX" not in by_name["llamacpp"]["detail"]
    # ONNX Runtime's CPU provider runs wherever onnxruntime-genai is installed; there is
    # no Snapdragon here, and the detail says so beside the providers it found
    qnn = by_name["qnn"]
    onnx_sdk = all(
        importlib.util.find_spec(m) for m in ("onnxruntime", "onnxruntime_genai", "tokenizers")
    )
    assert qnn["installed"] == qnn["usable"] == onnx_sdk
    if onnx_sdk:
        assert "CPUExecutionProvider" in qnn["detail"] and "no QNN HTP here" in qnn["detail"]
    else:
        assert "not installed" in qnn["detail"]


def test_measure_adds_a_measured_bandwidth() -> None:
    report = probe_host(measure=True)
    assert report.profile.memory.bandwidth_source == "measured"
    assert 0.5 < report.profile.memory.bandwidth_gbps < 2000


def test_a_failing_part_is_reported_not_raised(monkeypatch: pytest.MonkeyPatch) -> None:
    import edgekit.probe as probe

    def broken() -> None:
        raise PermissionError("denied by test")

    monkeypatch.setattr(probe, "read_sensors", lambda root: broken())
    report = probe.probe_host()
    part = next(p for p in report.parts if p.name == "sensors")
    assert not part.ok and "denied by test" in part.detail
    assert report.sensors == ()
    assert report.profile.cpu.logical_cores >= 1


def test_a_target_sdk_under_a_missing_parent_package_is_not_asked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A dotted SDK module whose parent package is not installed (find_spec imports the
    parent and raises) makes the target unavailable, not the probe fail; a target that
    enumerates no devices gets no "<target>-devices" part."""
    from edgekit.targets.contract import Target
    from edgekit.targets.registry import all_targets

    import edgekit.probe as probe

    lister = next(t for t in all_targets() if probe._enumerates_devices(t))
    monkeypatch.setattr(lister, "sdk_modules", ("edgekit_tests_no_such_sdk.core",))
    report = probe.probe_host()
    names = {p.name for p in report.parts}
    assert f"{lister.name}-devices" not in names and lister.name not in report.target_devices
    status = next(s for s in report.targets if s.name == lister.name)
    assert not status.usable and "edgekit_tests_no_such_sdk.core" in status.detail
    silent = [t for t in all_targets() if t.host_devices.__func__ is Target.host_devices.__func__]  # type: ignore[attr-defined]
    assert silent and not {f"{t.name}-devices" for t in silent} & names


# --- recorded trees -----------------------------------------------------------------


def _write(root: Path, rel: str, text: str | bytes, mode: int | None = None) -> Path:
    p = root / rel
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_bytes(text if isinstance(text, bytes) else text.encode())
    if mode is not None:
        p.chmod(mode)
    return p


NVPMODEL_CONF = """
< POWER_MODEL ID=0 NAME=15W >
CPU_ONLINE CORE_0 1
< POWER_MODEL ID=1 NAME=25W >
CPU_ONLINE CORE_0 1
< POWER_MODEL ID=2 NAME=MAXN_SUPER >
CPU_ONLINE CORE_0 1
"""


def test_jetson_from_a_recorded_tree(tmp_path: Path) -> None:
    _write(
        tmp_path,
        "proc/device-tree/model",
        b"NVIDIA Jetson Orin Nano Engineering Reference Developer Kit Super\x00",
    )
    _write(tmp_path, "etc/nvpmodel.conf", NVPMODEL_CONF)
    _write(tmp_path, "var/lib/nvpmodel/status", "pmode:0002 fmode:quiet\n")
    facts = read_jetson(tmp_path)
    assert facts is not None
    assert facts.model.startswith("NVIDIA Jetson Orin Nano")
    assert (facts.power_mode_id, facts.power_mode) == (2, "MAXN_SUPER")


def test_raspberry_pi_is_not_a_jetson(tmp_path: Path) -> None:
    _write(tmp_path, "proc/device-tree/model", b"Raspberry Pi 5 Model B Rev 1.0\x00")
    assert read_jetson(tmp_path) is None


def test_jetson_ina_rails(tmp_path: Path) -> None:
    _write(tmp_path, "sys/class/hwmon/hwmon1/name", "ina3221\n")
    _write(tmp_path, "sys/class/hwmon/hwmon1/in1_label", "VDD_IN\n")
    _write(tmp_path, "sys/class/hwmon/hwmon1/in2_label", "VDD_CPU_GPU_CV\n")
    # labels alone are no reading: the channel's mV and mA files are needed
    s = sensors.jetson_ina(tmp_path)
    assert not s.readable and "hwmon1 channel 1 (VDD_IN): no in1_input" in s.detail
    for channel in (1, 2):
        _write(tmp_path, f"sys/class/hwmon/hwmon1/in{channel}_input", "5000\n")
        _write(tmp_path, f"sys/class/hwmon/hwmon1/curr{channel}_input", "400\n")
    s = sensors.jetson_ina(tmp_path)
    assert s.readable and "VDD_IN 2.00 W" in s.detail and "VDD_CPU_GPU_CV" in s.detail


def test_rapl_readable(tmp_path: Path) -> None:
    _write(tmp_path, "sys/class/powercap/intel-rapl:0/energy_uj", "123456\n")
    _write(tmp_path, "sys/class/powercap/intel-rapl:0:0/energy_uj", "1\n")
    s = sensors.rapl(tmp_path)
    assert s.readable and s.detail == "1 package zone(s)"


def test_rapl_permission_error_is_explained(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _write(tmp_path, "sys/class/powercap/intel-rapl:0/energy_uj", "1\n")
    original = Path.read_text

    def deny(self: Path, *a, **k):  # type: ignore[no-untyped-def]
        if self.name == "energy_uj":
            raise PermissionError(13, "Permission denied")
        return original(self, *a, **k)

    monkeypatch.setattr(Path, "read_text", deny)
    s = sensors.rapl(tmp_path)
    assert not s.readable and "CVE-2020-8694" in s.detail


@pytest.mark.parametrize(
    ("status", "readable"), [("Discharging", True), ("Charging", False), ("Full", False)]
)
def test_battery(tmp_path: Path, status: str, readable: bool) -> None:
    _write(tmp_path, "sys/class/power_supply/AC/type", "Mains\n")
    _write(tmp_path, "sys/class/power_supply/BAT0/type", "Battery\n")
    _write(tmp_path, "sys/class/power_supply/BAT0/status", status + "\n")
    _write(tmp_path, "sys/class/power_supply/BAT0/current_now", "1500000\n")
    _write(tmp_path, "sys/class/power_supply/BAT0/voltage_now", "11400000\n")
    s = sensors.battery(tmp_path)
    assert s.readable is readable
    if not readable:
        assert "only on battery" in s.detail


def test_no_sensors_on_an_empty_tree(tmp_path: Path) -> None:
    assert not sensors.rapl(tmp_path).readable
    assert not sensors.jetson_ina(tmp_path).readable
    assert sensors.battery(tmp_path).detail == "no battery"


RPI5_CPUINFO = """processor\t: 0
BogoMIPS\t: 108.00
Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm lrcpc dcpop asimddp
CPU implementer\t: 0x41
CPU part\t: 0xd0b

processor\t: 1
Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm lrcpc dcpop asimddp
"""


def test_arm_cpuinfo() -> None:
    model, isa = parse_cpuinfo(RPI5_CPUINFO)
    assert model is None  # Pi kernels name no model in cpuinfo: the device tree does
    assert set(isa) == {"neon", "dotprod", "fp16"}


def test_probe_on_a_recorded_jetson_tree(tmp_path: Path) -> None:
    _write(tmp_path, "proc/cpuinfo", RPI5_CPUINFO)
    _write(tmp_path, "proc/device-tree/model", b"NVIDIA Jetson AGX Orin Developer Kit\x00")
    _write(tmp_path, "etc/nvpmodel.conf", NVPMODEL_CONF)
    _write(tmp_path, "var/lib/nvpmodel/status", "pmode:0001\n")
    report = probe_host(root=tmp_path)
    assert report.profile.kind == "jetson"
    assert report.jetson is not None and report.jetson.power_mode == "25W"
    assert report.profile.memory.unified is True
    assert read_cpu(tmp_path).isa == ("dotprod", "fp16", "neon")
