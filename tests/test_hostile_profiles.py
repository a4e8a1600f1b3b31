"""Hostile device profiles: infinite, NaN, negative, zero or absurd figures, inconsistent
cores and power modes, deep nesting, huge or non-UTF-8 files, names that walk out of the
shipped profiles. Each is refused with the offending key's path, through the API and the
CLI (`edgekit profiles show PATH`, `edgekit plan --device PATH`), exit code 1, no
traceback, nothing written.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from edgekit.cli import main
from edgekit.devices import DeviceProfile, load_profile, parse_profile
from edgekit.errors import ProfileError, ProfileNotFoundError, ProfileSchemaError, SchemaError
from edgekit.schema import bounds, build, dataclass_json_schema
from tests.builders import tiny_config

# Every figure distinct, so that an edit names exactly one line.
BASE = """\
schema = 1
name = "t"
display_name = "T"
kind = "jetson"
os = "linux"
arch = "aarch64"
targets = ["llamacpp"]
sources = ["x"]

[cpu]
model = "x"
physical_cores = 4
logical_cores = 8
performance_cores = 2
efficiency_cores = 1
max_ghz = 3.0

[memory]
total_gib = 16
usable_gib = 12
bandwidth_gbps = 100.0

[[accelerators]]
kind = "cpu"
name = "CPU"
[accelerators.peak_tops]
fp32 = 1.5

[[accelerators]]
kind = "gpu"
name = "GPU"
memory_gib = 8.0
memory_bandwidth_gbps = 200.0
max_model_gib = 4.0
max_prompt_tokens = 1024
[accelerators.peak_tops]
fp16 = 20.0
int8 = 40.0

[power]
idle_w = 2
typical_w = 10
max_w = 30
default_mode = "MAXN"

[[power.modes]]
name = "MAXN"
max_w = 29
compute_scale = 1.0
bandwidth_gbps = 99.0

[[power.modes]]
name = "15W"
max_w = 15
compute_scale = 0.6
"""


def edit(*pairs: tuple[str, str]) -> str:
    text = BASE
    for old, new in pairs:
        assert text.count(old + "\n") == 1, old
        text = text.replace(old + "\n", new + "\n")
    return text


def _line(old: str, new: str) -> str:
    return edit((old, new))


CASES: dict[str, tuple[str, str]] = {}


def figure(key: str, old: str, values: dict[str, str], path: str) -> None:
    for label, value in values.items():
        CASES[f"{key}-{label}"] = (_line(old, f"{old.split('=')[0]}= {value}"), path)


BAD_FLOAT = {"inf": "inf", "minus-inf": "-inf", "nan": "nan", "negative": "-1.0", "zero": "0.0"}
figure("total-gib", "total_gib = 16", {**BAD_FLOAT, "1e400": "1e400"}, "memory.total_gib")
figure("usable-gib", "usable_gib = 12", BAD_FLOAT, "memory.usable_gib")
figure(
    "bandwidth",
    "bandwidth_gbps = 100.0",
    {**BAD_FLOAT, "1e308": "1e308"},
    "memory.bandwidth_gbps",
)
figure("max-ghz", "max_ghz = 3.0", {**BAD_FLOAT, "1e6": "1e6"}, "cpu.max_ghz")
figure(
    "physical-cores",
    "physical_cores = 4",
    {"zero": "0", "negative": "-4", "1e30": "1" + "0" * 30},
    "cpu.physical_cores",
)
figure("logical-cores", "logical_cores = 8", {"zero": "0", "negative": "-8"}, "cpu.logical_cores")
figure("performance-cores", "performance_cores = 2", {"negative": "-1"}, "cpu.performance_cores")
figure("efficiency-cores", "efficiency_cores = 1", {"negative": "-1"}, "cpu.efficiency_cores")
figure("cpu-tops", "fp32 = 1.5", BAD_FLOAT, "accelerators[0].peak_tops.fp32")
figure("gpu-tops", "fp16 = 20.0", {**BAD_FLOAT, "1e300": "1e300"}, "accelerators[1].peak_tops.fp16")
figure("gpu-memory", "memory_gib = 8.0", BAD_FLOAT, "accelerators[1].memory_gib")
figure(
    "gpu-bandwidth",
    "memory_bandwidth_gbps = 200.0",
    BAD_FLOAT,
    "accelerators[1].memory_bandwidth_gbps",
)
figure("max-model-gib", "max_model_gib = 4.0", BAD_FLOAT, "accelerators[1].max_model_gib")
figure(
    "max-prompt",
    "max_prompt_tokens = 1024",
    {"zero": "0", "negative": "-1", "2^40": str(2**40)},
    "accelerators[1].max_prompt_tokens",
)
figure("idle-w", "idle_w = 2", {"negative": "-2", "nan": "nan", "zero": "0"}, "power.idle_w")
figure("typical-w", "typical_w = 10", {"inf": "inf", "nan": "nan"}, "power.typical_w")
figure("max-w", "max_w = 30", {"inf": "inf", "nan": "nan", "1e9": "1e9"}, "power.max_w")
figure("mode-max-w", "max_w = 15", {**BAD_FLOAT}, "power.modes[1].max_w")
figure(
    "mode-scale",
    "compute_scale = 0.6",
    {**BAD_FLOAT, "above-one": "2.0"},
    "power.modes[1].compute_scale",
)
figure("mode-bandwidth", "bandwidth_gbps = 99.0", BAD_FLOAT, "power.modes[0].bandwidth_gbps")

CASES["available-negative"] = (
    _line("bandwidth_gbps = 100.0", "bandwidth_gbps = 100.0\navailable_gib = -1.0"),
    "memory.available_gib",
)
CASES["all-power-zero"] = (
    edit(
        ("idle_w = 2", "idle_w = 0"),
        ("typical_w = 10", "typical_w = 0"),
        ("max_w = 30", "max_w = 0"),
    ),
    "power.idle_w",
)
CASES["usable-and-total-inf"] = (
    edit(("total_gib = 16", "total_gib = inf"), ("usable_gib = 12", "usable_gib = inf")),
    "memory.total_gib",
)
CASES["physical-above-logical"] = (_line("physical_cores = 4", "physical_cores = 16"), "logical")
CASES["p-plus-e-above-physical"] = (
    _line("performance_cores = 2", "performance_cores = 4"),
    "performance_cores",
)
CASES["duplicate-mode-names"] = (_line('name = "15W"', 'name = "MAXN"'), "MAXN")
CASES["deep-array"] = (BASE + "x = " + "[" * 50_000 + "]" * 50_000 + "\n", "nested")
CASES["deep-inline-table"] = (BASE + "x = " + "{a=" * 20_000 + "1" + "}" * 20_000 + "\n", "nested")
CASES["deep-known-key"] = (_line('sources = ["x"]', "sources = " + "[" * 40 + "]" * 40), "nested")
CASES["deep-dotted-key"] = (BASE + ".".join(["a"] * 5000) + " = 1\n", "nested")
CASES["huge-file"] = (BASE + "# " + "x" * (2 << 20) + "\n", "larger than")


def _api(text: str) -> tuple[BaseException | None, float]:
    t0 = time.perf_counter()
    try:
        parse_profile(text, "t.toml")
    except Exception as exc:
        return exc, time.perf_counter() - t0
    return None, time.perf_counter() - t0


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name", sorted(CASES))
def test_hostile_profile_api(name: str) -> None:
    text, path = CASES[name]
    caught, elapsed = _api(text)
    assert isinstance(caught, ProfileSchemaError), f"{type(caught).__name__}: {caught}"
    assert path in caught.message, caught.message
    assert caught.hint
    assert elapsed < 5


def _squash(text: str) -> str:
    return "".join(text.split())


def _clean_failure(result: Any, fragment: str) -> None:
    assert isinstance(result.exception, SystemExit), repr(result.exception)
    assert result.exit_code == 1
    assert "Traceback" not in result.output
    assert "error:" in result.output
    assert _squash(fragment) in _squash(result.output), result.output


def _tree(root: Path) -> dict[str, tuple[int, int]]:
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for n in dirnames + filenames:
            st = (Path(dirpath) / n).lstat()
            out[str((Path(dirpath) / n).relative_to(root))] = (st.st_size, st.st_mtime_ns)
    return out


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name", sorted(CASES))
def test_hostile_profile_cli_show(tmp_path: Path, name: str) -> None:
    text, path = CASES[name]
    f = tmp_path / "mine.toml"
    f.write_text(text)
    before = _tree(tmp_path)
    result = CliRunner().invoke(main, ["profiles", "show", str(f)])
    _clean_failure(result, path)
    assert _tree(tmp_path) == before


PLAN_CASES = [
    "bandwidth-nan",
    "bandwidth-negative",
    "gpu-tops-inf",
    "mode-scale-zero",
    "idle-w-negative",
]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name", PLAN_CASES)
def test_hostile_profile_cli_plan(tmp_path: Path, name: str) -> None:
    """Before: plans with NaN or negative tok/s. Now: the profile is refused."""
    text, path = CASES[name]
    f = tmp_path / "mine.toml"
    f.write_text(text)
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(tiny_config("llama")))
    before = _tree(tmp_path)
    result = CliRunner().invoke(main, ["plan", str(model), "--device", str(f), "--json"])
    _clean_failure(result, path)
    assert _tree(tmp_path) == before


# --- files and names ---


def _file_cases(tmp: Path) -> dict[str, tuple[str, type[ProfileError], str]]:
    """name -> (what to pass to load_profile, error type, fragment)."""
    tmp.mkdir(exist_ok=True)
    (tmp / "latin1.toml").write_bytes(BASE.replace('"T"', '"T\xe9"').encode("latin-1"))
    evil = tmp / "evil"
    evil.mkdir()
    (evil / "stolen.toml").write_text(BASE)
    (tmp / "folder.toml").mkdir()
    os.mkfifo(tmp / "fifo.toml")
    (tmp / "huge.toml").write_bytes(b"#" * (3 << 20))
    (tmp / "link.toml").symlink_to("/dev/zero")
    rel = os.path.relpath(evil / "stolen", Path(__file__).parent.parent / "profiles")
    return {
        "not-utf8": (str(tmp / "latin1.toml"), ProfileSchemaError, "UTF-8"),
        "name-walks-out": (rel, ProfileNotFoundError, "no device profile named"),
        "absolute-name-without-suffix": (
            str(evil / "stolen"),
            ProfileNotFoundError,
            "no device profile named",
        ),
        "nul-in-name": ("a\x00b", ProfileNotFoundError, "no device profile named"),
        "nul-in-path": (str(tmp / "a\x00.toml"), ProfileNotFoundError, "no device profile"),
        "folder-named-toml": (str(tmp / "folder.toml"), ProfileError, "folder.toml"),
        "fifo": (str(tmp / "fifo.toml"), ProfileError, "not a regular file"),
        "huge-file": (str(tmp / "huge.toml"), ProfileSchemaError, "larger than"),
        "link-to-dev-zero": (str(tmp / "link.toml"), ProfileError, "not a regular file"),
        "empty-name": ("", ProfileNotFoundError, "no device profile named"),
    }


_NAMES = [
    "not-utf8",
    "name-walks-out",
    "absolute-name-without-suffix",
    "nul-in-name",
    "nul-in-path",
    "folder-named-toml",
    "fifo",
    "huge-file",
    "link-to-dev-zero",
    "empty-name",
]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name", _NAMES)
def test_hostile_profile_files(tmp_path: Path, name: str) -> None:
    arg, error, fragment = _file_cases(tmp_path / "p")[name]
    t0 = time.perf_counter()
    with pytest.raises(error) as info:
        load_profile(arg)
    assert fragment in info.value.message, info.value.message
    assert time.perf_counter() - t0 < 5
    if "\x00" not in arg:
        result = CliRunner().invoke(main, ["profiles", "show", arg])
        _clean_failure(result, fragment)


# --- the schema's bounds, for every document built from dataclasses ---


@dataclass(frozen=True, kw_only=True)
class _Doc:
    ratio: float = field(metadata=bounds(gt=0, le=1))
    count: int = field(default=1, metadata=bounds(ge=1, le=10))
    peaks: dict[str, float] = field(default_factory=dict, metadata=bounds(gt=0))
    sizes: tuple[float, ...] = field(default=(), metadata=bounds(ge=0))
    maybe: float | None = field(default=None, metadata=bounds(gt=0))
    free: float = 0.0


@pytest.mark.parametrize(
    ("data", "fragment"),
    [
        ({"ratio": 0}, "d.ratio"),
        ({"ratio": 1.5}, "d.ratio"),
        ({"ratio": 0.5, "count": 0}, "d.count"),
        ({"ratio": 0.5, "count": 11}, "d.count"),
        ({"ratio": 0.5, "peaks": {"int8": -1}}, "d.peaks.int8"),
        ({"ratio": 0.5, "sizes": [1, -1]}, "d.sizes[1]"),
        ({"ratio": 0.5, "maybe": 0.0}, "d.maybe"),
        ({"ratio": 0.5, "free": float("inf")}, "d.free"),
        ({"ratio": 0.5, "free": float("nan")}, "d.free"),
        ({"ratio": float("nan")}, "d.ratio"),
    ],
)
def test_build_enforces_bounds_and_finiteness(data: dict[str, Any], fragment: str) -> None:
    with pytest.raises(SchemaError) as info:
        build(_Doc, data, "d", SchemaError)
    assert fragment in info.value.message


def test_bounds_reach_the_json_schema() -> None:
    schema = dataclass_json_schema(_Doc, title="t", schema_id="x")
    props = schema["$defs"]["_Doc"]["properties"]
    assert props["ratio"] == {"type": "number", "exclusiveMinimum": 0, "maximum": 1}
    assert props["count"] == {"type": "integer", "minimum": 1, "maximum": 10}
    assert props["peaks"]["additionalProperties"] == {"type": "number", "exclusiveMinimum": 0}
    assert props["sizes"]["items"] == {"type": "number", "minimum": 0}
    assert {"type": "number", "exclusiveMinimum": 0} in props["maybe"]["anyOf"]
    assert props["free"] == {"type": "number"}


def test_profile_json_schema_carries_the_bounds() -> None:
    schema = dataclass_json_schema(DeviceProfile, title="p", schema_id="x")
    memory = schema["$defs"]["MemorySpec"]["properties"]
    assert memory["total_gib"]["exclusiveMinimum"] == 0
    mode = schema["$defs"]["PowerMode"]["properties"]
    assert mode["compute_scale"]["maximum"] == 1
