"""Bundles: packing, the published schema, verification, tampering, archives (crafted
malicious ones included), variant choice and over-budget loads."""

from __future__ import annotations

import io
import json
import shutil
import tarfile
import threading
from pathlib import Path
from typing import Any

import pytest

import edgekit
from edgekit.bundle import VariantRequest, pack
from edgekit.bundle_choose import choose_variant
from edgekit.bundle_open import open_bundle, verify_bundle
from edgekit.errors import (
    BundleIntegrityError,
    BundleNotFoundError,
    BundleSchemaError,
    InsufficientMemoryError,
    NoUsableVariantError,
    OutputExistsError,
    SettingError,
    UnsafeArchiveError,
    UnsupportedConversionError,
)
from edgekit.manifest import MANIFEST_NAME, json_schema
from tests.conftest import require

ROOT = Path(__file__).resolve().parent.parent
PROMPT = "The capital of France is"


@pytest.fixture(scope="module")
def bundle(default_gguf: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    require("llama_cpp", "packing GGUF variants uses llama.cpp's quantizer")
    out = tmp_path_factory.mktemp("bundles") / "smollm2"
    result = pack(
        default_gguf,
        out,
        [VariantRequest(quant="Q4_K_M", recipe="kv_cache=q8_0"), VariantRequest(quant="Q8_0")],
    )
    assert result.path == out
    assert any("both quantization errors" in w for w in result.warnings)  # Q4_1 source
    return out


@pytest.fixture
def copy(bundle: Path, tmp_path: Path) -> Path:
    dest = tmp_path / "copy"
    shutil.copytree(bundle, dest)
    return dest


def test_manifest_contents(bundle: Path, default_gguf: Path) -> None:
    m = open_bundle(bundle).manifest
    assert m.schema_version == 1 and m.name == "smollm2"
    assert m.model.parameters == 134_515_008 and m.model.source.file_type == "Q4_1"
    assert len(m.model.source.sha256) == 64
    assert [v.name for v in m.variants] == ["gguf-q4_k_m", "gguf-q8_0"]
    q4 = m.variant("gguf-q4_k_m")
    assert q4.runtime.kv_cache == "q8_0" and q4.recipe["kv_cache"] == "q8_0"
    assert m.variant("gguf-q8_0").runtime.kv_cache == "f16"
    assert q4.predicted.memory_bytes and q4.predicted.source == "estimate"
    assert q4.predicted.memory_bytes < m.variant("gguf-q8_0").predicted.memory_bytes
    assert m.tokenizer.chat_template and m.tokenizer.eos_token == "<|im_end|>"
    assert m.provenance.backends["llama-cpp-python"] == "0.3.36"
    for v in m.variants:
        assert (bundle / v.files[0].path).stat().st_size == v.files[0].size


def test_published_schema_is_current_and_validates(bundle: Path) -> None:
    import jsonschema

    published = json.loads((ROOT / "docs" / "bundle.schema.json").read_text())
    assert published == json_schema(), "regenerate: edgekit schema > docs/bundle.schema.json"
    jsonschema.Draft202012Validator.check_schema(published)
    jsonschema.validate(json.loads((bundle / MANIFEST_NAME).read_text()), published)


def test_verify_and_tampering(copy: Path) -> None:
    opened = open_bundle(copy)
    verify_bundle(copy, opened.manifest, checksums=True)
    model = copy / "gguf-q4_k_m" / "model.gguf"
    data = bytearray(model.read_bytes())
    data[len(data) // 2] ^= 0xFF  # same size, one byte flipped
    model.write_bytes(bytes(data))
    verify_bundle(copy, opened.manifest, checksums=False)  # sizes alone cannot see it
    with pytest.raises(BundleIntegrityError, match="sha256"):
        verify_bundle(copy, opened.manifest, checksums=True)
    with pytest.raises(BundleIntegrityError, match="sha256"):
        edgekit.load(copy, variant="gguf-q4_k_m", verify=True)
    model.write_bytes(bytes(data[:-10]))
    with pytest.raises(BundleIntegrityError, match="bytes"):
        edgekit.load(copy, variant="gguf-q4_k_m")  # sizes are always checked


def test_missing_file(copy: Path) -> None:
    (copy / "gguf-q8_0" / "model.gguf").unlink()
    with pytest.raises(BundleIntegrityError, match="missing"):
        verify_bundle(copy, open_bundle(copy).manifest, checksums=False)


@pytest.mark.parametrize(
    ("edit", "fragment"),
    [
        (lambda m: m.update(schema_version=2), "schema version 2"),
        (lambda m: m.update(colour="red"), "unknown key(s) colour"),
        (lambda m: m["variants"][0].update(turbo=True), "unknown key(s) turbo"),
        (
            lambda m: m["variants"][0]["files"][0].update(path="../../etc/passwd"),
            "leaves the bundle",
        ),
        (lambda m: m.update(variants=[]), "no variants"),
        (lambda m: m["model"].pop("parameters"), "missing required key 'parameters'"),
    ],
    ids=["version", "unknown-top", "unknown-nested", "path-escape", "no-variants", "missing"],
)
def test_manifest_rejections(copy: Path, edit, fragment: str) -> None:  # type: ignore[no-untyped-def]
    path = copy / MANIFEST_NAME
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data))
    with pytest.raises(BundleSchemaError) as info:
        open_bundle(copy)
    assert fragment in info.value.message


def test_not_a_bundle(tmp_path: Path) -> None:
    with pytest.raises(BundleNotFoundError):
        open_bundle(tmp_path / "nothing")
    with pytest.raises(BundleNotFoundError, match="manifest.json"):
        open_bundle(tmp_path)
    (tmp_path / "x.tar").write_bytes(b"not a tar")
    with pytest.raises(BundleNotFoundError):
        open_bundle(tmp_path / "x.tar")


# --- choosing and loading -----------------------------------------------------------------


def _admitted_bytes(opened: Any) -> dict[str, int]:
    """What load admits each variant by: the plan's memory on this host, calibrated by
    whatever benchmarks this test session recorded (the manifest's figure is pack's
    first estimate)."""
    from edgekit.converters.planner.calibration import this_host_key

    from edgekit.bundle_choose import variant_fit

    return {
        v.name: variant_fit(
            opened, v, available_bytes=1 << 50, calibrate_for=this_host_key()
        ).memory_bytes
        for v in opened.manifest.variants
    }


def test_load_picks_the_best_variant_that_fits(bundle: Path) -> None:
    opened = open_bundle(bundle)
    sizes = _admitted_bytes(opened)
    big = choose_variant(opened, requested=None, available_bytes=10 << 30, runnable={"llamacpp"})
    assert big.name == "gguf-q8_0"  # higher quality first
    small = choose_variant(
        opened, requested=None, available_bytes=sizes["gguf-q4_k_m"] + 1, runnable={"llamacpp"}
    )
    assert small.name == "gguf-q4_k_m"
    with edgekit.load(bundle) as session:
        assert session.variant.name == "gguf-q8_0"
    with edgekit.load(bundle, variant="gguf-q4_k_m") as session:
        assert session.info.kv_cache == "q8_0"  # the bundle's runtime setting
        assert "Paris" in session.generate(PROMPT, max_tokens=8, temperature=0).text


def test_over_budget_load_says_by_how_much(bundle: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import psutil

    sizes = _admitted_bytes(open_bundle(bundle))
    q4, q8 = sizes["gguf-q4_k_m"], sizes["gguf-q8_0"]
    assert q4 < q8
    available = (q4 + q8) // 2

    real = psutil.virtual_memory()

    class FakeVM:  # this much free; the host's total (its calibration key) unchanged
        def __init__(self) -> None:
            self.available = available
            self.total = real.total

    monkeypatch.setattr(psutil, "virtual_memory", FakeVM)
    with pytest.raises(InsufficientMemoryError) as info:
        edgekit.load(bundle, variant="gguf-q8_0")
    message = info.value.message
    assert "gguf-q8_0 needs" in message and "GB short" in message
    assert "gguf-q4_k_m" in info.value.hint and "force=True" in info.value.hint
    with edgekit.load(bundle) as session:  # automatic choice falls back to what fits
        assert session.variant.name == "gguf-q4_k_m"
    with edgekit.load(bundle, variant="gguf-q8_0", force=True) as session:
        assert session.variant.name == "gguf-q8_0"


def test_no_usable_variant(bundle: Path) -> None:
    with pytest.raises(NoUsableVariantError, match="llamacpp"):
        choose_variant(
            open_bundle(bundle), requested=None, available_bytes=1 << 40, runnable={"openvino"}
        )


def test_unknown_setting_is_refused_before_the_bundle_is_opened(tmp_path: Path) -> None:
    with pytest.raises(SettingError) as info:
        edgekit.load(tmp_path / "no-such-bundle", unknown_setting=1)
    message = info.value.message
    assert "unknown_setting" in message
    for valid in ("context", "kv_cache", "threads", "variant", "device", "force"):
        assert valid in message


def test_setting_of_another_target_is_refused_naming_this_ones(bundle: Path) -> None:
    """A setting some target takes, but not the chosen variant's: refused before loading,
    listing what this target takes."""
    from edgekit.targets.registry import get_target, runnable_targets

    from edgekit.runtime import LOAD_ARGUMENTS

    target = get_target(open_bundle(bundle).manifest.variants[0].target)
    every = {s for t in runnable_targets() for s in t.load_settings}
    foreign = sorted(every - set(target.load_settings) - set(LOAD_ARGUMENTS))
    if not foreign:
        pytest.skip("every installed target takes the same settings")
    with pytest.raises(SettingError) as info:
        edgekit.load(bundle, **{foreign[0]: 1})
    assert repr(foreign[0]) in info.value.message
    assert all(s in info.value.message for s in target.load_settings)


def test_device_selects_the_unit_memory_is_admitted_on() -> None:
    """auto and cpu: the target's CPU unit (else its first), unless the target picks its
    own (below); a named unit in any case, one of several (GPU.1) included."""
    from edgekit.targets.contract import Target
    from edgekit.targets.registry import all_targets

    from edgekit.bundle_choose import unit_kind

    for target in all_targets():
        kinds = [u.kind for u in target.units]
        if target.load_unit.__func__ is Target.load_unit.__func__:  # type: ignore[attr-defined]
            assert unit_kind(target, "auto") == ("cpu" if "cpu" in kinds else kinds[0])
        for kind in kinds:
            assert unit_kind(target, kind) == kind
            assert unit_kind(target, f"{kind.upper()}.1") == kind


def test_auto_admits_on_the_unit_the_target_will_pick(monkeypatch: pytest.MonkeyPatch) -> None:
    """A target whose runtime picks its device on ``auto`` (OpenVINO: NPU > GPU > CPU)
    says which, so load admits by that unit's figures, not the CPU's."""
    require("openvino", "the OpenVINO target lists its devices")
    import edgekit.targets.openvino as ov_target

    from edgekit.bundle_choose import unit_kind

    target = ov_target.OpenVinoTarget
    for present, expected in ((["CPU", "GPU.0", "NPU"], "npu"), (["CPU", "GPU.1"], "gpu")):
        monkeypatch.setattr(ov_target, "available_devices", lambda p=present: p)
        assert unit_kind(target, "auto") == expected
    monkeypatch.setattr(ov_target, "available_devices", lambda: ["CPU"])
    assert unit_kind(target, "auto") == "cpu"


@pytest.mark.parametrize("device", [None, 5, ["cpu"]])
def test_a_device_that_is_not_a_string_is_refused(tmp_path: Path, device: object) -> None:
    with pytest.raises(SettingError, match="device must be a string") as info:
        edgekit.load(tmp_path / "no-such-bundle", device=device)  # type: ignore[arg-type]
    assert "auto" in info.value.hint


def test_a_variant_of_unknown_quantization_does_not_block_the_others(copy: Path) -> None:
    """A manifest naming a quantization its format does not list (a newer edgekit's, or
    another tool's): its memory cannot be predicted, so automatic choice skips it and
    takes the next variant; asked for by name, or forced, it is loaded as before."""
    manifest = copy / MANIFEST_NAME
    data = json.loads(manifest.read_text())
    odd = next(v for v in data["variants"] if v["name"] == "gguf-q8_0")
    odd["quant"] = "IQ2_XS"
    manifest.write_text(json.dumps(data))
    with edgekit.load(copy) as session:
        assert session.variant.name == "gguf-q4_k_m"
    with edgekit.load(copy, variant="gguf-q8_0") as session:
        assert session.variant.quant == "IQ2_XS"
    with edgekit.load(copy, force=True) as session:
        assert session.variant.name == "gguf-q8_0"  # ranked first, as a float would be
    data["variants"] = [odd]
    manifest.write_text(json.dumps(data))
    with pytest.raises(NoUsableVariantError, match="IQ2_XS") as info:
        edgekit.load(copy)
    assert "variant=" in info.value.hint


def test_pack_defaults_to_the_target_formats_own_quantization(tmp_path: Path) -> None:
    """No quantization named: each target's format says what a bundle gets (GGUF:
    Q4_K_M; OpenVINO: INT4), and a quantization of the wrong type is refused."""
    require("torch", "the tiny model is built with torch")
    from edgekit.targets.registry import all_targets

    from edgekit.bundle import _plan_variant
    from edgekit.inspection import inspect_model
    from tests.tiny_models import build_tiny_model

    hf = build_tiny_model("llama", tmp_path / "hf")
    spec = inspect_model(hf)
    packable = [t for t in all_targets() if t.format.buildable]
    assert len(packable) >= 2
    for target in packable:
        planned = _plan_variant(spec, hf, VariantRequest(target=target.name))
        assert planned.quant == target.format.pack_default(), target.name
    defaults = {t.name: t.format.pack_default() for t in packable}
    assert defaults.items() >= {"llamacpp": "Q4_K_M", "openvino": "INT4"}.items()
    with pytest.raises(UnsupportedConversionError, match="is not one of the GGUF quantizations"):
        _plan_variant(spec, hf, VariantRequest(target="llamacpp", quant=4))  # type: ignore[arg-type]


def test_public_calls_refuse_values_of_the_wrong_type(tmp_path: Path) -> None:
    """A path that is not a path, a variants argument that is not a list of requests, a
    context that is not an integer: edgekit errors, not TypeError or AttributeError."""
    require("torch", "the tiny model is built with torch")
    from edgekit.errors import BundleNotFoundError, ModelNotFoundError
    from edgekit.inspection import inspect_model
    from tests.tiny_models import build_tiny_model

    hf = build_tiny_model("llama", tmp_path / "hf")
    with pytest.raises(BundleNotFoundError, match="not NoneType"):
        edgekit.load(None)  # type: ignore[arg-type]
    with pytest.raises(ModelNotFoundError, match="not int"):
        inspect_model(5)  # type: ignore[arg-type]
    with pytest.raises(UnsupportedConversionError, match="model is a path"):
        pack(None, tmp_path / "out", [VariantRequest()])  # type: ignore[arg-type]
    with pytest.raises(UnsupportedConversionError, match="list of VariantRequest"):
        pack(hf, tmp_path / "out", "Q4_K_M")  # type: ignore[arg-type]
    for context in ("4096", 1.5, True, 0):
        with pytest.raises(UnsupportedConversionError, match="not a usable context"):
            pack(hf, tmp_path / "out", [VariantRequest(quant="Q8_0", context=context)])  # type: ignore[arg-type]
    assert not (tmp_path / "out").exists()


def test_unknown_variant_lists_the_present_ones(bundle: Path) -> None:
    with pytest.raises(BundleSchemaError) as info:
        edgekit.load(bundle, variant="gguf-q2_k")
    assert "gguf-q4_k_m" in info.value.hint


def test_concurrent_generate_on_one_loaded_session(bundle: Path) -> None:
    with edgekit.load(bundle, variant="gguf-q4_k_m") as session:
        expected = session.generate(PROMPT, max_tokens=10, temperature=0).text
        results: list[str] = []
        threads = [
            threading.Thread(
                target=lambda: results.append(
                    session.generate(PROMPT, max_tokens=10, temperature=0).text
                )
            )
            for _ in range(6)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert results == [expected] * 6


# --- packing ------------------------------------------------------------------------------


def test_pack_refuses_before_working(default_gguf: Path, tmp_path: Path) -> None:
    with pytest.raises(UnsupportedConversionError, match="tensorrt"):
        pack(default_gguf, tmp_path / "b", [VariantRequest(target="tensorrt", quant="INT8")])
    with pytest.raises(UnsupportedConversionError, match="not one of the OpenVINO quantizations"):
        pack(default_gguf, tmp_path / "b", [VariantRequest(target="openvino", quant="Q4_K_M")])
    with pytest.raises(UnsupportedConversionError, match="Q9"):
        pack(default_gguf, tmp_path / "b", [VariantRequest(quant="Q9")])
    (tmp_path / "b").mkdir()
    with pytest.raises(OutputExistsError):
        pack(default_gguf, tmp_path / "b", [VariantRequest(quant="Q4_K_M")])
    assert [p.name for p in tmp_path.iterdir()] == ["b"]


def test_failed_pack_leaves_nothing(
    default_gguf: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import edgekit.converters.convert as convert

    calls = []
    real = convert.convert_along

    def second_fails(*a, **k):  # type: ignore[no-untyped-def]
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt  # an interrupted run
        return real(*a, **k)

    monkeypatch.setattr(convert, "convert_along", second_fails)
    with pytest.raises(KeyboardInterrupt):
        pack(
            default_gguf,
            tmp_path / "b",
            [VariantRequest(quant="Q4_K_M"), VariantRequest(quant="Q8_0")],
        )
    assert list(tmp_path.iterdir()) == []


# --- archives -----------------------------------------------------------------------------


def test_archive_round_trip(
    default_gguf: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("EDGEKIT_CACHE", str(tmp_path / "cache"))
    archive = pack(
        default_gguf, tmp_path / "small.tar", [VariantRequest(quant="Q4_K_M")], archive=True
    ).path
    assert tarfile.is_tarfile(archive)
    with edgekit.load(archive, verify=True) as session:
        assert session.bundle.folder.is_relative_to(tmp_path / "cache")
        assert session.generate(PROMPT, max_tokens=4, temperature=0).completion_tokens == 4
    assert open_bundle(archive).folder == session.bundle.folder  # extracted once


def _tar(path: Path, members: list[tuple[tarfile.TarInfo, bytes | None]]) -> Path:
    with tarfile.open(path, "w") as tar:
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return path


def _file(name: str, data: bytes = b"x") -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    return info, data


def _link(name: str, target: str, kind: bytes = tarfile.SYMTYPE) -> tuple[tarfile.TarInfo, None]:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = target
    return info, None


def _device(name: str) -> tuple[tarfile.TarInfo, None]:
    info = tarfile.TarInfo(name)
    info.type = tarfile.CHRTYPE
    info.devmajor, info.devminor = 1, 3
    return info, None


MALICIOUS = {
    "absolute-path": ([_file("/etc/cron.d/evil")], "absolute path"),
    "dot-dot": ([_file("b/manifest.json"), _file("b/../../evil")], "leave the bundle"),
    "symlink-out": (
        [_file("b/manifest.json"), _link("b/model.gguf", "/etc/passwd")],
        "no links",
    ),
    "symlink-up": ([_file("b/manifest.json"), _link("b/x", "../../secret")], "no links"),
    "hardlink-out": (
        [_file("b/manifest.json"), _link("b/h", "etc/shadow", tarfile.LNKTYPE)],
        "no links",
    ),
    "device": ([_file("b/manifest.json"), _device("b/null")], "device"),
    "two-folders": ([_file("a/manifest.json"), _file("b/manifest.json")], "one bundle folder"),
}


@pytest.mark.parametrize("case", sorted(MALICIOUS))
def test_malicious_archives_are_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, case: str
) -> None:
    monkeypatch.setenv("EDGEKIT_CACHE", str(tmp_path / "cache"))
    members, fragment = MALICIOUS[case]
    archive = _tar(tmp_path / f"{case}.tar", members)
    with pytest.raises(UnsafeArchiveError, match=fragment):
        open_bundle(archive)
    assert not (tmp_path / "evil").exists()
    extracted = (
        [p for p in (tmp_path / "cache").rglob("*") if p.is_file()]
        if (tmp_path / "cache").exists()
        else []
    )
    assert extracted == []


def test_archive_size_cap(tmp_path: Path) -> None:
    from edgekit.archive import extract_archive

    big = tarfile.TarInfo("b/model.gguf")
    big.size = 5000
    archive = _tar(tmp_path / "big.tar", [(big, b"\0" * 5000)])
    with pytest.raises(UnsafeArchiveError, match="more than 1,000 bytes"):
        extract_archive(archive, tmp_path / "out", max_total=1000)
    assert not (tmp_path / "out").exists()
