"""Device profiles: every shipped file loads, covers the devices edgekit targets, sources
its figures, and the schema rejects what it does not know."""

from __future__ import annotations

import re
from importlib import resources
from pathlib import Path

import pytest

from edgekit.devices import DeviceProfile, load_profile, parse_profile, profile_names
from edgekit.errors import ProfileNotFoundError, ProfileSchemaError
from edgekit.plugins import target_names

NAMES = profile_names()


def test_at_least_twelve_profiles() -> None:
    assert len(NAMES) >= 12


@pytest.mark.parametrize("name", NAMES)
def test_profile_loads_and_is_consistent(name: str) -> None:
    p = load_profile(name)
    assert p.name == name, "the file name is the profile name"
    assert p.sources, "a profile names its sources"
    assert p.targets and set(p.targets) <= set(target_names())
    assert p.memory.bandwidth_gbps and p.memory.bandwidth_gbps > 0
    assert any(a.kind == "cpu" for a in p.accelerators)
    assert p.cpu.physical_cores <= p.cpu.logical_cores


@pytest.mark.parametrize("name", NAMES)
def test_every_figure_is_sourced(name: str) -> None:
    """Each numeric value has a comment on its line or on the comment lines above it."""
    text = resources.files("edgekit.profiles").joinpath(f"{name}.toml").read_text()
    lines = text.splitlines()
    unsourced = []
    for i, line in enumerate(lines):
        if not re.match(r"^\s*[\w.]+\s*=\s*-?[\d.]+\s*(#.*)?$", line):
            continue
        if line.split("=", 1)[0].strip() in ("schema",):
            continue
        if "#" in line:
            continue
        j = i - 1
        while j >= 0 and re.match(r"^\s*[\w.]+\s*=", lines[j]) and "#" not in lines[j]:
            j -= 1  # a block of figures under one comment shares it
        if j < 0 or not lines[j].lstrip().startswith("#") and "#" not in lines[j]:
            unsourced.append(line.strip())
    assert not unsourced, unsourced


def _profiles() -> list[DeviceProfile]:
    return [load_profile(n) for n in NAMES]


def test_the_fleet_spans_every_target_and_kind() -> None:
    profiles = _profiles()
    kinds = {p.kind for p in profiles}
    assert {"phone", "laptop", "desktop", "jetson", "sbc", "mini-pc"} <= kinds
    for target in target_names():
        assert any(target in p.targets for p in profiles), target
    # Apple phone and Macs; Snapdragon phones with a Hexagon NPU; Intel with an NPU.
    assert any(p.kind == "phone" and p.os == "ios" for p in profiles)
    assert sum(p.kind == "phone" and "qnn" in p.targets for p in profiles) >= 2
    assert sum("mlx" in p.targets and p.os == "macos" for p in profiles) >= 3
    assert any(
        "openvino" in p.targets and any(a.kind == "npu" for a in p.accelerators) for p in profiles
    )
    # Jetsons carry their power modes; a desktop GPU carries its own memory.
    jetsons = [p for p in profiles if p.kind == "jetson"]
    assert len(jetsons) >= 2 and all(len(p.power.modes) >= 2 for p in jetsons)
    assert any(a.kind == "gpu" and a.memory_gib for p in profiles for a in p.accelerators)
    # An x86 laptop without a GPU.
    assert any(
        p.kind == "laptop"
        and p.arch == "x86_64"
        and not any(a.kind == "gpu" for a in p.accelerators)
        for p in profiles
    )


def test_apple_gpu_cap_is_below_ram() -> None:
    for p in _profiles():
        if p.os == "macos":
            assert p.memory.usable_gib <= 0.8 * p.memory.total_gib, p.name


MINIMAL = """
schema = 1
name = "t"
display_name = "T"
kind = "laptop"
os = "linux"
arch = "x86_64"
targets = ["llamacpp"]
[cpu]
model = "x"
physical_cores = 4
logical_cores = 8
[memory]
total_gib = 16
usable_gib = 12
[power]
idle_w = 2
typical_w = 10
max_w = 30
"""


def test_minimal_profile_parses() -> None:
    p = parse_profile(MINIMAL, "t.toml")
    assert p.memory.usable_bytes == 12 << 30
    assert p.power.source == "spec"


@pytest.mark.parametrize(
    ("edit", "fragment"),
    [
        (lambda s: "colour = 'red'\nweight_g = 3\n" + s, "t.toml: unknown key(s) colour, weight_g"),
        (lambda s: s.replace("[cpu]", "[cpu]\nturbo = true"), "t.toml.cpu: unknown key(s) turbo"),
        (lambda s: s.replace('model = "x"\n', ""), "missing required key 'model'"),
        (lambda s: s.replace("physical_cores = 4", 'physical_cores = "four"'), "expected int"),
        (lambda s: s.replace('kind = "laptop"', 'kind = "toaster"'), "'toaster' is not one of"),
        (lambda s: s.replace("schema = 1", "schema = 2"), "schema version 2"),
        (lambda s: s.replace('["llamacpp"]', '["cuda"]'), "unknown target(s) cuda"),
        (lambda s: s.replace("usable_gib = 12", "usable_gib = 20"), "usable_gib"),
        (lambda s: s.replace("idle_w = 2", "idle_w = 50"), "idle <= typical <= max"),
        (lambda s: s.replace("max_w = 30", "max_w = 30\ndefault_mode = 'turbo'"), "default_mode"),
        (lambda s: s + "\n[[accelerators]]\nkind = 'tpu'\nname = 'x'\n", "'tpu' is not one of"),
        (lambda s: s.replace("[power]", "[power"), "not valid TOML"),
    ],
    ids=[
        "unknown-top",
        "unknown-nested",
        "missing",
        "type",
        "literal",
        "version",
        "target",
        "usable",
        "power-order",
        "mode",
        "accelerator-kind",
        "toml",
    ],
)
def test_schema_rejects(edit, fragment: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ProfileSchemaError) as info:
        parse_profile(edit(MINIMAL), "t.toml")
    assert fragment in info.value.message


def test_unknown_keys_name_the_allowed_ones() -> None:
    with pytest.raises(ProfileSchemaError) as info:
        parse_profile("foo = 1\n" + MINIMAL, "t.toml")
    assert "display_name" in info.value.hint


def test_profile_by_path(tmp_path: Path) -> None:
    f = tmp_path / "mine.toml"
    f.write_text(MINIMAL)
    assert load_profile(f).name == "t"


def test_unknown_profile_name() -> None:
    with pytest.raises(ProfileNotFoundError):
        load_profile("no-such-device")
