"""Every registered target keeps the plug-in contract (edgekit.targets.contract), and the
registry finds them, checks them and survives a broken one."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from importlib import resources
from importlib.metadata import EntryPoint
from pathlib import Path
from typing import Any, ClassVar

import pytest
from edgekit.converters.formats import Format
from edgekit.targets import registry
from edgekit.targets.availability import all_target_status, missing_modules, target_status
from edgekit.targets.contract import Target
from edgekit.targets.llamacpp import LlamaCppTarget
from edgekit.targets.qnn import QnnTarget

from edgekit import plugins
from edgekit.devices import load_profile, parse_profile, profile_names
from edgekit.errors import TargetError, TargetUnavailableError, UnsupportedConversionError
from edgekit.inspection import inspect_model
from edgekit.modelspec import ModelSpec
from tests.builders import tiny_config

TESTS = Path(__file__).parent
ENTRY_POINTS = {ep.name: ep.value for ep in plugins.target_entry_points()}
TARGETS = registry.all_targets()
IDS = [t.name for t in TARGETS]
PROFILES = [load_profile(n) for n in profile_names()]
# what importing a target module must not import besides each target's own SDK
HEAVY = ("torch", "transformers", "numpy", "gguf", "onnxruntime_genai", "textual")


@pytest.fixture(scope="module")
def spec(tmp_path_factory: pytest.TempPathFactory) -> ModelSpec:
    folder = tmp_path_factory.mktemp("config-only")
    (folder / "config.json").write_text(json.dumps(tiny_config("llama", vocab_size=32000)))
    return inspect_model(folder)


# --- the registry ------------------------------------------------------------------------


def test_every_entry_point_loads_as_its_own_target() -> None:
    assert registry.broken_targets() == ()
    assert [t.name for t in TARGETS] == sorted(ENTRY_POINTS)
    for name in ENTRY_POINTS:
        target = registry.get_target(name)
        assert issubclass(target, Target) and target.name == name


def test_runnable_targets_are_those_that_run() -> None:
    runnable = registry.runnable_targets()
    assert LlamaCppTarget in runnable
    assert set(runnable) == {t for t in TARGETS if t.runs}


def test_the_default_target_is_llamacpp() -> None:
    assert registry.default_target() is LlamaCppTarget


def test_formats_are_listed_once_and_found_by_name() -> None:
    formats = registry.all_formats()
    names = [f.name for f in formats]
    assert len(names) == len(set(names))
    assert set(names) == {t.format.name for t in TARGETS}
    for fmt in formats:
        assert registry.get_format(fmt.name) is fmt
    with pytest.raises(UnsupportedConversionError, match="unknown format 'safetensors'") as info:
        registry.get_format("safetensors")
    assert all(n in info.value.message for n in names)


def test_unknown_target_lists_the_installed_ones() -> None:
    with pytest.raises(TargetError) as info:
        registry.get_target("cuda")
    assert "unknown target 'cuda'; installed: " in info.value.message
    assert all(name in info.value.message for name in ENTRY_POINTS)


class NamedWrong(LlamaCppTarget):
    name: ClassVar[str] = "something-else"


class WronglyTyped(QnnTarget):
    """Every attribute present, two of the wrong type: a ``format = None`` would break
    every format listing (and so every conversion), not just its own target."""

    name: ClassVar[str] = "wronglytyped"
    format = None  # type: ignore[assignment]
    sdk_modules = "qnn_sdk"  # type: ignore[assignment]


class Incomplete(Target):
    name: ClassVar[str] = "incomplete"

    @classmethod
    def accelerators(cls, profile: Any) -> list[Any]:
        return []

    @classmethod
    def check_host(cls) -> tuple[bool, str]:
        return False, "never"


def _register(monkeypatch: pytest.MonkeyPatch, **extra: str) -> None:
    """The real entry points plus ``extra`` (name -> object reference)."""
    eps = [EntryPoint(name=n, value=v, group=plugins.TARGET_GROUP) for n, v in extra.items()]
    found = (*plugins.target_entry_points(), *eps)
    monkeypatch.setattr(plugins, "target_entry_points", lambda: found)


@pytest.mark.parametrize(
    ("name", "value", "why"),
    [
        ("missing", "edgekit_no_such_plugin:Target", "failed to load: ModuleNotFoundError"),
        ("nottarget", "tests.test_targets:TESTS", "is not an edgekit Target"),
        ("wrongname", "tests.test_targets:NamedWrong", "declares name 'something-else'"),
        ("incomplete", "tests.test_targets:Incomplete", "lacks display_name, devices, format"),
        ("llamacpp", "tests.test_targets:NamedWrong", "registered twice"),
        (
            "wronglytyped",
            "tests.test_targets:WronglyTyped",
            "declares format not an edgekit Format; sdk_modules not a tuple of module names",
        ),
    ],
)
def test_a_broken_plugin_is_named_and_does_not_hide_the_others(
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    name: str,
    value: str,
    why: str,
) -> None:
    _register(monkeypatch, **{name: value})
    with caplog.at_level(logging.WARNING, logger="edgekit.targets.registry"):
        listed = registry.all_targets()
    others = [t for t in TARGETS if t.name != name]
    assert [t for t in listed if t.name != name] == others
    assert name not in [t.name for t in listed]
    assert why in caplog.text
    with pytest.raises(TargetError, match=why) as info:
        registry.get_target(name)
    assert name in info.value.message
    assert (name, info.value.message) in registry.broken_targets()
    # the probe lists it, not installed, with the reason
    status = next(s for s in all_target_status() if s.name == name)
    assert not status.installed and not status.usable and why in status.detail
    # and every format is still listed (conversion and pack keep working)
    assert {f.name for f in registry.all_formats()} == {t.format.name for t in others}


class FakeTarget(QnnTarget):
    name: ClassVar[str] = "fake"


def test_a_plugin_installed_in_the_process_registers(tmp_path: Path) -> None:
    dist = tmp_path / "edgekit_fake-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: edgekit-fake\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(
        f"[{plugins.TARGET_GROUP}]\nfake = tests.test_targets:FakeTarget\n"
    )
    try:
        with pytest.MonkeyPatch.context() as mp:
            mp.syspath_prepend(str(tmp_path))
            assert "fake" not in plugins.target_names()  # read before it was installed
            plugins.refresh()
            assert "fake" in plugins.target_names()
            assert registry.get_target("fake") is FakeTarget
            assert FakeTarget in registry.all_targets()
            text = resources.files("edgekit.profiles").joinpath("galaxy-s24-ultra.toml")
            profile = parse_profile(
                text.read_text().replace('targets = ["', 'targets = ["fake", "'), "mine"
            )
            assert "fake" in profile.targets and FakeTarget.accelerators(profile)
    finally:
        plugins.refresh()
    assert "fake" not in plugins.target_names()


# --- each target against the contract ---------------------------------------------------


@pytest.mark.parametrize("target", TARGETS, ids=IDS)
def test_declares_the_contract(target: type[Target]) -> None:
    assert target.name == next(n for n, v in ENTRY_POINTS.items() if v.endswith(target.__name__))
    for text in (target.display_name, target.devices, target.install_hint, target.distribution):
        assert isinstance(text, str) and text.strip()
    assert isinstance(target.format, Format)
    assert target.sdk_modules and all(isinstance(m, str) and m for m in target.sdk_modules)
    assert target.kv_cache.pad >= 1 and target.kv_cache.window_extra >= 0
    if target.runs:
        assert target.load_settings, "a runnable target says which settings load takes"
        assert (TESTS / f"test_{target.name}_target.py").is_file(), f"{target.name} has no tests"
    else:
        assert target.runtime_note.strip(), "a target that cannot run says why"


@pytest.mark.parametrize("target", TARGETS, ids=IDS)
def test_units_name_quants_of_its_format(target: type[Target]) -> None:
    kinds = [u.kind for u in target.units]
    assert kinds and len(kinds) == len(set(kinds)) and set(kinds) <= {"cpu", "gpu", "npu"}
    for unit in target.units:
        assert unit.formats, f"{target.name} plans nothing on its {unit.kind}"
        missing = [q for q in unit.formats if target.format.quant(q) is None]
        assert not missing, f"{target.format.name} has no {missing}"
        assert target.unit(unit.kind) is unit


@pytest.mark.parametrize("target", TARGETS, ids=IDS)
def test_priors_are_positive(target: type[Target], spec: ModelSpec) -> None:
    for unit in target.units:
        c = target.priors(unit.kind, spec)
        assert 0 < c.bandwidth_efficiency <= 1 and 0 < c.compute_efficiency <= 1
        assert c.token_overhead_s >= 0 and c.prefill_token_overhead_s >= 0
        assert c.runtime_bytes > 0 and c.weight_residency > 0 and c.kv_scale > 0
        assert c.basis == "first estimate"
        vocab = target.vocab_runtime_bytes(unit.kind, spec)
        assert 0 <= vocab <= c.runtime_bytes
    absent = {"cpu", "gpu", "npu"} - {u.kind for u in target.units}
    for kind in absent:
        with pytest.raises(TargetError, match=kind.upper()):
            target.priors(kind, spec)


def test_llamacpp_cpu_runtime_grows_with_the_vocabulary(spec: ModelSpec) -> None:
    base = LlamaCppTarget.unit("cpu").priors.runtime_bytes  # type: ignore[union-attr]
    output_buffer = spec.vocab_size * 4 * 64
    assert LlamaCppTarget.vocab_runtime_bytes("cpu", spec) == output_buffer
    assert LlamaCppTarget.priors("cpu", spec).runtime_bytes == base + output_buffer
    assert LlamaCppTarget.vocab_runtime_bytes("gpu", spec) == 0


@pytest.mark.parametrize("target", TARGETS, ids=IDS)
def test_accelerators_on_every_shipped_profile(target: type[Target]) -> None:
    kinds = {u.kind for u in target.units}
    for profile in PROFILES:
        found = target.accelerators(profile)
        assert all(a in profile.accelerators for a in found), profile.name
        assert {a.kind for a in found} <= kinds, profile.name
        if target.name in profile.targets:
            assert found, f"{profile.name} lists {target.name} but it finds no unit there"
        for a in found:
            precision = target.compute_precision(profile, a, 1.0)
            assert precision is None or (precision[0] and (precision[1] or 0) > 0)
    assert any(target.accelerators(p) for p in PROFILES), "no shipped profile runs it"


@pytest.mark.parametrize("target", TARGETS, ids=IDS)
def test_check_host_answers_or_the_sdk_is_absent(target: type[Target]) -> None:
    status = target_status(target)
    if missing_modules(target.sdk_modules):
        assert not status.installed and target.install_hint in status.detail
        return
    usable, detail = target.check_host()
    assert isinstance(usable, bool) and isinstance(detail, str) and detail
    assert status.installed and status.usable == usable


def test_a_check_that_raises_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken() -> tuple[bool, str]:
        raise RuntimeError("driver fell over")

    monkeypatch.setattr(LlamaCppTarget, "check_host", broken)
    monkeypatch.setattr(LlamaCppTarget, "sdk_modules", ("json",))  # installed everywhere
    status = target_status(LlamaCppTarget)
    assert status.installed and not status.usable
    assert status.detail == "installed but failed: RuntimeError: driver fell over"


@pytest.mark.parametrize("target", [t for t in TARGETS if t.runs], ids=lambda t: t.name)
def test_device_settings_are_load_settings(target: type[Target]) -> None:
    for device in target.devices_accepted:
        assert set(target.device_settings(device)) <= set(target.load_settings), device


def test_llamacpp_devices() -> None:
    assert LlamaCppTarget.device_settings("auto") == {}
    assert LlamaCppTarget.device_settings("cpu") == {}
    assert LlamaCppTarget.device_settings("gpu") == {"gpu_layers": -1}
    with pytest.raises(TargetError, match="device 'npu'") as info:
        LlamaCppTarget.device_settings("npu")
    assert info.value.hint == "use auto, cpu, gpu"


class PlannedOnly(LlamaCppTarget):
    """A target edgekit plans for but cannot run (every registered target runs today)."""

    name: ClassVar[str] = "planned-only"
    display_name: ClassVar[str] = "Planned Only"
    runs: ClassVar[bool] = False
    runtime_note: ClassVar[str] = "its engines are not built yet"
    load = Target.__dict__["load"]  # the contract's refusal, not llama.cpp's loader


def test_a_target_that_cannot_run_refuses_to_load(tmp_path: Path) -> None:
    with pytest.raises(TargetUnavailableError) as info:
        PlannedOnly.load(tmp_path)
    assert PlannedOnly.runtime_note in info.value.message
    assert PlannedOnly.display_name in info.value.message


IMPORT_ALL = """
import importlib, json, sys
for value in sys.argv[1:]:
    importlib.import_module(value.split(":")[0])
print(json.dumps(sorted({m.split(".")[0] for m in sys.modules})))
"""


def test_importing_every_target_imports_no_sdk() -> None:
    modules = sorted(ENTRY_POINTS.values())
    out = subprocess.run(
        [sys.executable, "-c", IMPORT_ALL, *modules],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    loaded = set(json.loads(out.stdout))
    sdks = {m.split(".")[0] for t in TARGETS for m in t.sdk_modules} | set(HEAVY)
    assert not loaded & sdks, sorted(loaded & sdks)
