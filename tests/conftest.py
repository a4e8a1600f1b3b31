"""Shared fixtures.

With EDGEKIT_STRICT=1 (set by .ci/test), a fixture whose dependency is missing fails the
test instead of skipping it: CI must not go green by skipping what set-up should install.

Real-model tests are marked ``slow`` here, so ``pytest -m "not slow"`` is the quick loop:
a test reaches the embedded default model through the ``default_gguf`` fixture (or one
built on it, such as ``smollm2_hf``), and is marked for that. A test that is not marked
and reaches the model some other way (``edgekit pack`` with no model, ``default_model_path``)
fails, saying to request the fixture: the marking cannot silently fall behind.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from edgekit.converters.convert import ConvertResult

STRICT = os.environ.get("EDGEKIT_STRICT") == "1"

# Fuzz tests (tests/fuzz/) run a bounded number of examples in CI; a longer run sets
# EDGEKIT_FUZZ_EXAMPLES (docs/fuzzing.md). No example database: runs stay independent.
try:
    from hypothesis import HealthCheck, settings

    settings.register_profile(
        "edgekit",
        max_examples=int(os.environ.get("EDGEKIT_FUZZ_EXAMPLES", "150")),
        deadline=None,
        database=None,
        derandomize=os.environ.get("EDGEKIT_FUZZ_SEED") is None and bool(os.environ.get("CI")),
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    )
    settings.load_profile("edgekit")
except ImportError:  # hypothesis is a dev dependency; only the fuzz tests need it
    pass


def pytest_configure(config: pytest.Config) -> None:
    """Point edgekit's cache (calibration, quality records, unpacked bundles, results) at
    a folder of this test session's own: a developer's benchmarks in ~/.cache/edgekit
    would otherwise change what load admits and what plan predicts in the tests. Tests
    that need a cache of their own still set EDGEKIT_CACHE themselves."""
    import tempfile

    os.environ["EDGEKIT_CACHE"] = tempfile.mkdtemp(prefix="edgekit-test-cache-")


def pytest_unconfigure(config: pytest.Config) -> None:
    import shutil

    shutil.rmtree(os.environ.get("EDGEKIT_CACHE", ""), ignore_errors=True)


# Fixtures that hand a test the real default model (100 MB, seconds to load or convert).
REAL_MODEL_FIXTURES = frozenset({"default_gguf", "smollm2_hf"})
_NOT_HERE_HINT = (
    "this test reaches the real default model without the default_gguf fixture: request "
    "default_gguf (tests/conftest.py then marks it slow), or mark it slow"
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark every test that uses a real-model fixture, directly or through another
    fixture, as slow (``fixturenames`` is the closure of the fixtures a test requests)."""
    for item in items:
        if REAL_MODEL_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)


@pytest.fixture(autouse=True)
def _real_model_only_in_slow_tests(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In a test not marked slow, the default model is not installed (its lookup raises
    ModelNotFoundError with a hint that names the fixture)."""
    if request.node.get_closest_marker("slow") is not None:
        return
    import edgekit.default_model as default_model

    monkeypatch.setattr(default_model, "PACKAGE", "edgekit_tests_no_real_model_here")
    monkeypatch.setattr(default_model, "INSTALL_HINT", _NOT_HERE_HINT)


def require(module: str, why: str) -> None:
    """Skip (or, in strict mode, fail) when ``module`` is not importable."""
    if importlib.util.find_spec(module) is None:
        message = f"{module} is not installed: {why}"
        if STRICT:
            pytest.fail(message + " (EDGEKIT_STRICT=1: set-up should have installed it)")
        pytest.skip(message)


@pytest.fixture(scope="session")
def default_gguf() -> Path:
    """The embedded default model, SmolLM2-135M-Instruct Q4_1."""
    from edgekit.default_model import default_model_path
    from edgekit.errors import ModelNotFoundError

    try:
        return default_model_path()
    except ModelNotFoundError as exc:
        if STRICT:
            pytest.fail(f"{exc} (EDGEKIT_STRICT=1)")
        pytest.skip(str(exc))


@pytest.fixture(scope="session")
def smollm2_hf(default_gguf: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A Hugging Face export of the default model, written by transformers from the GGUF
    (dequantized to fp32, about 540 MB). Built once per test session."""
    require("torch", "the Hugging Face export needs torch")
    require("transformers", "the Hugging Face export needs transformers")
    require("gguf", "transformers reads GGUF through the gguf package")
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    out = tmp_path_factory.mktemp("smollm2-hf")
    folder, name = str(default_gguf.parent), default_gguf.name
    # The config read once and handed on: each read parses the whole GGUF metadata (its
    # 49k-token vocabulary) in Python, ~10 s here; the files written are byte for byte
    # those of the two plain calls (compared here: 49 s against 55 s).
    config = AutoConfig.from_pretrained(folder, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, config=config)
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(folder, gguf_file=name, config=config).save_pretrained(out)
    return out


@pytest.fixture(scope="session")
def smollm2_bundle(default_gguf: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The default model packed as llama.cpp Q4_K_M and OpenVINO INT4 (the README's
    benchmark pair), built once per test session: the OpenVINO export of the 135M model
    takes minutes here, and benchmarks only read the bundle (so does test_openvino_target's
    INT4 check of the default model, which loads its openvino-int4 folder)."""
    require("llama_cpp", "the bundle has a GGUF variant")
    require("optimum.intel", "the bundle has an OpenVINO variant")
    from edgekit.bundle import VariantRequest, pack

    out = tmp_path_factory.mktemp("smollm2-bundle") / "smollm2"
    pack(
        default_gguf,
        out,
        [VariantRequest(quant="Q4_K_M"), VariantRequest(target="openvino", quant="INT4")],
    )
    return out


# The default model's own conversions, each built once per test session: a 135M export
# takes from seconds (GGUF -> HF) to minutes (OpenVINO) on the 2-core CI, and several
# modules checked the same artefact built the same way. Tests only read them; a test that
# changes one copies it first.


@pytest.fixture(scope="session")
def smollm2_dequantized(
    default_gguf: Path, tmp_path_factory: pytest.TempPathFactory
) -> ConvertResult:
    """The default model dequantized to a float32 Hugging Face folder by edgekit's converter
    (GGUF -> HF): the ConvertResult, so a test can check its warnings; ``.path`` is the
    folder. test_gguf_convert checks the round trip, test_accuracy and test_openvino_target
    start from it."""
    require("gguf", "dequantizing uses gguf-py")
    from edgekit.converters.convert import convert_model

    return convert_model(default_gguf, "hf", tmp_path_factory.mktemp("smollm2-dequantized") / "hf")


@pytest.fixture(scope="session")
def smollm2_f32_gguf(
    smollm2_dequantized: ConvertResult, tmp_path_factory: pytest.TempPathFactory
) -> Path:
    """That folder converted back to an F32 GGUF (edgekit's writer): test_accuracy's
    reference and the first step of test_gguf_convert's lossless round trip."""
    require("llama_cpp", "the HF -> GGUF edge quantizes with llama-cpp-python")
    from edgekit.converters.convert import convert_model

    out = tmp_path_factory.mktemp("smollm2-f32") / "f32.gguf"
    convert_model(smollm2_dequantized.path, "gguf", out, quant="F32")
    return out


@pytest.fixture(scope="session")
def smollm2_openvino_int8(
    smollm2_dequantized: ConvertResult, tmp_path_factory: pytest.TempPathFactory
) -> Path:
    """The dequantized folder exported to OpenVINO INT8 (minutes here): test_openvino_target
    compares its greedy text with transformers, test_accuracy its logits."""
    require("optimum.intel", "OpenVINO export uses optimum-intel")
    require("openvino_genai", "the export is run by the OpenVINO target")
    from edgekit.converters.convert import convert_model

    out = tmp_path_factory.mktemp("smollm2-openvino-int8") / "ov"
    convert_model(smollm2_dequantized.path, "openvino", out, quant="INT8")
    return out
