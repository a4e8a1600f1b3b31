"""Jetson power: the nvpmodel mode and the INA3221 rails read from recorded trees of real
Jetson layouts (tests/data/jetson/*, reconstructed from NVIDIA's documentation: see each
SOURCE.md), hostile trees, and `edgekit bench` reporting watts, J/token and the mode."""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from edgekit.targets.session import Session
from edgekit.targets.values import Sampling, SessionInfo, StreamChunk

from edgekit.host.ina3221 import find_rails
from edgekit.host.jetson import read_jetson
from edgekit.host.sensors import jetson_ina
from edgekit.power.base import MeterUnavailable
from edgekit.power.select import select_meter
from edgekit.power.sysfs_meters import JetsonInaMeter

TREES = Path(__file__).resolve().parent / "data" / "jetson"
NANO_HWMON = "sys/devices/platform/bus@0/c240000.i2c/i2c-1/1-0040/hwmon/hwmon1"
NANO_VDD_IN_W = 5064 * 1224 / 1e6  # in1_input x curr1_input of the recorded tree


@pytest.fixture
def nano(tmp_path: Path) -> Path:
    """A writable copy of the Orin Nano Super tree, links kept as links."""
    root = tmp_path / "nano"
    shutil.copytree(TREES / "orin-nano-super", root, symlinks=True)
    return root


def _put(root: Path, rel: str, text: str | bytes) -> None:
    p = root / rel
    if p.is_symlink() or p.exists():
        p.unlink()
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_bytes(text if isinstance(text, bytes) else text.encode())


# --- the recorded trees -----------------------------------------------------------------


def test_orin_nano_super_tree() -> None:
    root = TREES / "orin-nano-super"
    facts = read_jetson(root)
    assert facts is not None
    assert facts.model == "NVIDIA Jetson Orin Nano Engineering Reference Developer Kit Super"
    assert (facts.power_mode_id, facts.power_mode) == (2, "MAXN_SUPER")
    assert [(m.id, m.name) for m in facts.modes] == [(0, "15W"), (1, "25W"), (2, "MAXN_SUPER")]
    assert facts.default_mode_id == 1
    # /etc/nvpmodel.conf is an absolute link: followed inside the tree, never to this host's /etc
    assert facts.conf == "/etc/nvpmodel/nvpmodel_p3767_0003_super.conf"
    rails = find_rails(root)
    assert [(r.label, r.monitor, r.channel) for r in rails.rails] == [
        ("VDD_IN", "1-0040", 1),
        ("VDD_CPU_GPU_CV", "1-0040", 2),
        ("VDD_SOC", "1-0040", 3),
    ]  # found once, through both /sys/bus/i2c/drivers/ina3221 and /sys/class/hwmon
    assert rails.module == ("VDD_IN",) and "input rail" in rails.derivation
    assert rails.skipped == ()
    watts = rails.read(root)
    assert watts["VDD_IN"] == pytest.approx(NANO_VDD_IN_W)
    assert watts["VDD_SOC"] == pytest.approx(5064 * 464 / 1e6)
    meter = JetsonInaMeter(root)
    assert meter.read().watts == pytest.approx(NANO_VDD_IN_W)  # not the sum of three rails
    assert meter.detail.startswith("VDD_IN")


def test_agx_orin_tree_sums_its_three_supplies() -> None:
    root = TREES / "agx-orin"
    facts = read_jetson(root)
    assert facts is not None and facts.model == "NVIDIA Jetson AGX Orin Developer Kit"
    assert (facts.power_mode_id, facts.power_mode) == (3, "MODE_50W")
    assert facts.conf == "/etc/nvpmodel/nvpmodel_p3701_0000.conf"
    assert [m.name for m in facts.modes] == ["MAXN", "MODE_15W", "MODE_30W", "MODE_50W"]
    rails = find_rails(root)
    assert [(r.label, r.monitor) for r in rails.rails] == [
        ("VDD_GPU_SOC", "1-0040"),
        ("VDD_CPU_CV", "1-0040"),
        ("VIN_SYS_5V0", "1-0040"),
        ("VDDQ_VDD2_1V8AO", "1-0041"),
    ]
    assert rails.module == ("VDD_GPU_SOC", "VDD_CPU_CV", "VIN_SYS_5V0")
    assert "VDDQ_VDD2_1V8AO reported, not added" in rails.derivation
    assert rails.skipped == (
        "1-0041 channel 1: not connected (NC)",
        "1-0041 channel 3: not connected (NC)",
    )
    expected = (19184 * 180 + 19184 * 60 + 4968 * 600) / 1e6
    assert JetsonInaMeter(root).read().watts == pytest.approx(expected)


def test_xavier_nx_jetpack4_iio_tree() -> None:
    root = TREES / "xavier-nx-jp4"
    facts = read_jetson(root)
    assert facts is not None and facts.power_mode == "MODE_15W_6CORE"
    assert facts.conf == "/etc/nvpmodel.conf"  # a plain file on JetPack 4
    rails = find_rails(root)
    assert [r.label for r in rails.rails] == ["VDD_IN", "VDD_CPU_GPU_CV", "VDD_SOC"]
    assert all(r.iio for r in rails.rails)
    assert JetsonInaMeter(root).read().watts == pytest.approx(5032 * 930 // 1000 / 1e3)


def test_sensor_facts_name_every_rail_and_the_derivation() -> None:
    facts = jetson_ina(TREES / "agx-orin")
    assert facts.readable
    for label in ("VDD_GPU_SOC", "VDD_CPU_CV", "VIN_SYS_5V0", "VDDQ_VDD2_1V8AO"):
        assert label in facts.detail
    assert "module power = VDD_GPU_SOC + VDD_CPU_CV + VIN_SYS_5V0" in facts.detail


def test_selection_prefers_the_jetson_rails() -> None:
    meter, skipped = select_meter(idle_w=5, max_w=25, root=TREES / "orin-nano-super")
    assert meter.name == "jetson-ina" and skipped["rapl"] == "no powercap RAPL zones"


# --- hostile trees ----------------------------------------------------------------------


def test_a_huge_attribute_is_refused_without_reading_it(nano: Path) -> None:
    _put(nano, f"{NANO_HWMON}/in1_input", b"5" * (8 << 20))
    with pytest.raises(MeterUnavailable, match="larger than the 4,096 bytes"):
        JetsonInaMeter(nano)


def test_a_fifo_is_refused_not_waited_on(nano: Path) -> None:
    fifo = nano / NANO_HWMON / "curr1_input"
    fifo.unlink()
    os.mkfifo(fifo)
    start = time.monotonic()
    with pytest.raises(MeterUnavailable, match="a FIFO, not a regular file"):
        JetsonInaMeter(nano)
    assert time.monotonic() - start < 5


@pytest.mark.parametrize(
    ("value", "match"),
    [("abc\n", "not a number"), ("", "not a number"), ("99999999\n", "beyond what an INA3221")],
)
def test_a_bad_value_is_named(nano: Path, value: str, match: str) -> None:
    _put(nano, f"{NANO_HWMON}/in1_input", value)
    with pytest.raises(MeterUnavailable, match=match):
        JetsonInaMeter(nano)


def test_a_value_that_goes_bad_mid_run(nano: Path) -> None:
    meter = JetsonInaMeter(nano)
    _put(nano, f"{NANO_HWMON}/curr1_input", "12 mA\n")
    with pytest.raises(MeterUnavailable, match="not a number"):
        meter.read()


def test_links_out_of_the_root_are_not_followed(nano: Path, tmp_path: Path) -> None:
    outside = tmp_path / "outside" / "1-0040"
    shutil.copytree(nano / NANO_HWMON, outside / "hwmon" / "hwmon1", symlinks=True)
    for link in ("sys/class/hwmon/hwmon1", "sys/bus/i2c/drivers/ina3221/1-0040"):
        (nano / link).unlink()
    # an absolute link starts again at the root (where nothing is), a relative one that
    # climbs above the root is refused: neither reaches the monitor outside
    os.symlink(str(outside / "hwmon" / "hwmon1"), nano / "sys/class/hwmon/hwmon1")
    os.symlink("../../../../../../outside/1-0040", nano / "sys/bus/i2c/drivers/ina3221/1-0040")
    shutil.rmtree(nano / "sys/devices/platform/bus@0")
    rails = find_rails(nano)
    assert rails.rails == ()
    assert any("outside" in s for s in rails.skipped)
    with pytest.raises(MeterUnavailable, match="no INA3221 power monitor"):
        JetsonInaMeter(nano)
    assert not jetson_ina(nano).readable


def test_missing_and_malformed_labels(nano: Path) -> None:
    (nano / NANO_HWMON / "in1_label").unlink()
    _put(nano, f"{NANO_HWMON}/in2_label", "VDD_CPU\nGPU\n")
    rails = find_rails(nano)
    assert [r.label for r in rails.rails] == ["VDD_SOC"]
    assert (
        rails.skipped[0] == "1-0040 channel 1: no label (not wired, or disabled in the device tree)"
    )
    assert "not a one-line name" in rails.skipped[1]
    # no input rail left: the sum, said to be an under-count
    assert rails.module == ("VDD_SOC",) and "under-count" in rails.derivation


def test_shunt_channels_are_never_rails(nano: Path) -> None:
    _put(nano, f"{NANO_HWMON}/in4_label", "VDD_IN\n")  # a hostile label on a shunt channel
    assert [r.channel for r in find_rails(nano).rails] == [1, 2, 3]


def test_nvpmodel_status_missing_uses_the_default(nano: Path) -> None:
    (nano / "var/lib/nvpmodel/status").unlink()
    facts = read_jetson(nano)
    assert facts is not None and (facts.power_mode_id, facts.power_mode) == (1, "25W")
    assert "the conf's default" in facts.mode_note


@pytest.mark.parametrize(
    ("status", "note"),
    [("pmode:0009\n", "mode 9 is not defined"), ("garbage\n", "holds no pmode")],
)
def test_nvpmodel_status_unknown(nano: Path, status: str, note: str) -> None:
    _put(nano, "var/lib/nvpmodel/status", status)
    facts = read_jetson(nano)
    assert facts is not None and facts.power_mode is None and note in facts.mode_note


def test_nvpmodel_conf_link_loop_fifo_and_size(nano: Path) -> None:
    conf = nano / "etc/nvpmodel.conf"
    conf.unlink()
    os.symlink("nvpmodel.conf", conf)  # a link to itself
    facts = read_jetson(nano)
    assert facts is not None and facts.modes == () and "links" in facts.mode_note
    conf.unlink()
    os.mkfifo(conf)
    facts = read_jetson(nano)
    assert facts is not None and "a FIFO" in facts.mode_note
    conf.unlink()
    conf.write_text("# x\n" * 100_000)
    facts = read_jetson(nano)
    assert facts is not None and "larger than" in facts.mode_note


def test_nvpmodel_conf_link_to_this_hosts_files(nano: Path, tmp_path: Path) -> None:
    real = tmp_path / "host-nvpmodel.conf"
    real.write_text("< POWER_MODEL ID=2 NAME=FROM_THE_HOST >\n")
    (nano / "etc/nvpmodel.conf").unlink()
    os.symlink(str(real), nano / "etc/nvpmodel.conf")
    facts = read_jetson(nano)
    assert facts is not None and facts.power_mode is None and "missing" in facts.mode_note


def test_device_tree_model_that_is_not_a_name(nano: Path) -> None:
    _put(nano, "sys/firmware/devicetree/base/model", b"\x00\x01\x02")
    assert read_jetson(nano) is None
    _put(nano, "sys/firmware/devicetree/base/model", b"NVIDIA Jetson\x00")
    (nano / "proc/device-tree").unlink()
    os.symlink("../../../../../../dev", nano / "proc/device-tree")
    assert read_jetson(nano) is None


# --- bench on a Jetson ------------------------------------------------------------------


class SleepingSession(Session):
    """Prefills at ~``prefill`` tokens/s and decodes at ~``decode`` tokens/s in real time."""

    def __init__(self, *, prefill: float = 4000.0, decode: float = 200.0) -> None:
        super().__init__()
        self.prefill, self.decode = prefill, decode
        self.info = SessionInfo(
            target="fake", model_path="fake", context_length=4096, threads=1, kv_cache="f16"
        )

    def tokenize(self, text: str, *, add_special: bool = True) -> list[int]:
        return list(text.encode("utf-8"))

    def detokenize(self, tokens: Sequence[int]) -> str:
        return bytes(tokens).decode("utf-8", "replace")

    def stream_tokens(
        self, prompt_tokens: Sequence[int], sampling: Sampling
    ) -> Iterator[StreamChunk]:
        time.sleep(len(prompt_tokens) / self.prefill)
        for i in range(sampling.max_tokens):
            if i:
                time.sleep(1 / self.decode)
            last = i == sampling.max_tokens - 1
            yield StreamChunk(text="x", tokens=1, finish_reason="length" if last else None)

    def render_chat(self, messages: Sequence[dict[str, str]]) -> str:
        raise NotImplementedError

    def logits(self, tokens: Sequence[int]) -> Any:
        raise NotImplementedError

    def _close(self) -> None:
        pass


def test_bench_on_a_recorded_jetson_reports_watts_joules_and_the_mode(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The rails read constant watts (a recorded tree): every window averages exactly
    VDD_IN, and J/token is those watts over the measured rate."""
    import io

    from rich.console import Console

    import edgekit
    from edgekit.bench import bench
    from edgekit.cli.bench_cmd import render_result

    monkeypatch.setattr(edgekit, "load", lambda *a, **k: SleepingSession())
    result = bench(
        "fake.bundle",
        root=TREES / "orin-nano-super",
        prompt_lengths=(16,),
        gen_tokens=9,
        repeats=1,
        warmup=0,
        interval_s=0.02,
    )
    assert result.meter.name == "jetson-ina" and result.meter.measured
    assert result.meter.detail.startswith("VDD_IN: the module's input rail")
    assert result.thermal.power_mode == "MAXN_SUPER"
    (run,) = result.runs
    decode = run.decode
    assert decode.power.avg_w == pytest.approx(NANO_VDD_IN_W)
    assert decode.joules_per_token == pytest.approx(NANO_VDD_IN_W / decode.tok_s.median)
    (prefill,) = run.prefill
    assert prefill.power.avg_w == pytest.approx(NANO_VDD_IN_W)
    assert prefill.joules_per_token == pytest.approx(NANO_VDD_IN_W * prefill.ttft_s.median / 16)
    out = io.StringIO()
    render_result(result, Console(file=out, width=200))
    text = out.getvalue()
    assert "power: jetson-ina (a sensor)" in text
    assert "power mode: MAXN_SUPER (nvpmodel)" in text and "VDD_IN" in text


# --- samples/jetson: the owner's three commands, up to where TensorRT is needed ---------


@pytest.mark.slow
def test_jetson_sample_packs_copies_and_stops_at_the_engine(tmp_path: Path) -> None:
    """On this host (no Jetson, no GPU) `pack` writes the Edge-LLM export with its engine
    settings, `copy` copies it, and `device` stops at the first load, refused because
    TensorRT cannot run here; the probe's tensorrt row gives the SDK's own reason."""
    import json
    import subprocess
    import sys

    pytest.importorskip("torch")
    from edgekit.converters.tensorrt.tool_env import EXPORT_ENV
    from edgekit.targets.availability import target_status
    from edgekit.targets.registry import get_target

    from edgekit.tool_envs import status
    from tests.tiny_models import build_tiny_model

    found = status(EXPORT_ENV)
    if not found.ready:
        pytest.skip(f"the {EXPORT_ENV.name} tool environment is not ready ({found.reason})")
    script = Path(__file__).resolve().parent.parent / "samples" / "jetson" / "day_one.sh"
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}

    def day_one(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["bash", str(script), *args], capture_output=True, text=True, timeout=900, env=env
        )

    model = build_tiny_model("qwen3", tmp_path / "tiny-qwen3")
    bundle = tmp_path / "bundle"
    packed = day_one("pack", str(model), str(bundle), "--context", "512")
    assert packed.returncode == 0, packed.stderr
    manifest = json.loads((bundle / "manifest.json").read_text())
    variant = next(v for v in manifest["variants"] if v["name"] == "tensorrt-f16")
    engine = json.loads((bundle / variant["entry"] / "engine.json").read_text())
    assert (engine["precision"], engine["soc"]) == ("F16", "ORIN")
    assert (bundle / variant["entry"] / "llm" / "model.onnx").is_file()

    copied = day_one("copy", str(bundle), str(tmp_path / "on-the-jetson"))
    assert copied.returncode == 0, copied.stderr
    assert (tmp_path / "on-the-jetson" / "manifest.json").is_file()

    trt = target_status(get_target("tensorrt"))
    if trt.usable:
        pytest.skip("TensorRT runs on this host: the device step would build an engine")
    device = day_one("device", str(tmp_path / "on-the-jetson"))
    assert device.returncode == 1
    assert "variant tensorrt-f16 needs target 'tensorrt', which cannot run here" in device.stderr
    # the SDK's own reason, not only "cannot run" (stderr may wrap it: compare words)
    assert " ".join(trt.detail.split()[:6]) in " ".join(device.stderr.split())
    assert "tensorrt" in device.stdout  # the probe ran first and listed the target
    assert trt.detail and not (tmp_path / "on-the-jetson.bench.json").exists()


def test_a_disabled_channel_is_not_a_rail(nano: Path) -> None:
    """The ina3221 hwmon driver answers ENODATA for the inputs of a channel whose
    in<N>_enable is 0: a labelled but disabled channel is skipped, not read (one bad rail
    would make rails() fail for all)."""
    _put(nano, f"{NANO_HWMON}/in3_enable", "0\n")
    rails = find_rails(nano)
    assert [r.label for r in rails.rails] == ["VDD_IN", "VDD_CPU_GPU_CV"]
    assert any("channel 3 (VDD_SOC): disabled" in s for s in rails.skipped)
    assert rails.module == ("VDD_IN",)
