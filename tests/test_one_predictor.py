"""One predictor: for every variant of a packed bundle, load's fit decision is the plan's.

A tiny model is packed in GGUF and OpenVINO variants. For each variant and context,
``edgekit.load``'s admission (``choose_variant``, through ``planner.admission.load_fit``)
runs with a given amount of free memory, and ``edgekit plan`` runs for the same model on a
device whose only compute unit, a CPU, has exactly that memory: both must say the same
thing. The memory tried is the variant's own predicted need (fits) and one byte less
(does not), so the two agree only if they predict the same bytes, and once far above
and far below.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from edgekit.converters.planner import Budgets, plan

from edgekit.bundle_choose import choose_variant, variant_fit
from edgekit.bundle_open import open_bundle
from edgekit.devices import GIB, DeviceProfile, load_profile
from edgekit.errors import InsufficientMemoryError
from edgekit.inspection import inspect_model
from edgekit.manifest import OpenedBundle, Variant
from tests.conftest import require

pytestmark = pytest.mark.slow  # packs an OpenVINO export
CONTEXTS = (256, 2048)


@pytest.fixture(scope="module")
def packed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, OpenedBundle]:
    require("torch", "the tiny model is built with torch")
    require("llama_cpp", "llama.cpp quantizes the GGUF variants")
    require("optimum.intel", "the OpenVINO export")
    from edgekit.bundle import VariantRequest, pack
    from tests.tiny_models import build_tiny_model

    root = tmp_path_factory.mktemp("one-predictor")
    hf = build_tiny_model("llama", root / "hf", hidden=256, vocab_size=512, layers=4)
    requests = [
        VariantRequest(target="llamacpp", quant="Q8_0"),
        VariantRequest(target="llamacpp", quant="Q4_K_M"),
        VariantRequest(target="openvino", quant="INT8"),
        VariantRequest(target="openvino", quant="INT4"),
    ]
    bundle = pack(hf, root / "bundle", requests).path
    return hf, open_bundle(bundle)


def _device(available: int, targets: tuple[str, ...]) -> DeviceProfile:
    """A laptop whose one compute unit, its CPU, leaves a model ``available`` bytes."""
    base = load_profile("x86-laptop-no-gpu")
    profile = replace(
        base,
        memory=replace(base.memory, usable_gib=available / GIB),
        accelerators=tuple(a for a in base.accelerators if a.kind == "cpu"),
        targets=targets,
    )
    assert profile.memory.usable_bytes == available  # n / 2**30 * 2**30 is exact
    return profile


def _load_admits(opened: OpenedBundle, variant: Variant, available: int, context: int) -> bool:
    try:
        chosen = choose_variant(
            opened,
            requested=variant.name,
            available_bytes=available,
            runnable={variant.target},
            context=context,
            device="cpu",
        )
    except InsufficientMemoryError:
        return False
    assert chosen.name == variant.name
    return True


def _plan_admits(
    hf: Path, variant: Variant, available: int, context: int, calibrate_for: str | None = None
) -> tuple[bool, int]:
    spec = inspect_model(hf)
    p = plan(
        spec,
        _device(available, (variant.target,)),
        Budgets(context=context, kv_cache=variant.runtime.kv_cache),
        calibrate_for=calibrate_for,
    )
    (c,) = [
        c
        for c in p.candidates
        if (c.target, c.format, c.unit) == (variant.target, variant.quant, "cpu")
    ]
    return c.fits, c.prediction.memory_bytes


@pytest.mark.parametrize("context", CONTEXTS)
def test_load_and_plan_agree_on_every_variant(
    packed: tuple[Path, OpenedBundle],
    context: int,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Uncalibrated: an empty cache (other tests of the session record benchmarks)."""
    monkeypatch.setenv("EDGEKIT_CACHE", str(tmp_path))
    hf, opened = packed
    variants = opened.manifest.variants
    assert {v.format for v in variants} == {"gguf", "openvino"} and len(variants) == 4
    for variant in variants:
        need = variant_fit(
            opened, variant, available_bytes=1 << 50, context=context, device="cpu"
        ).memory_bytes
        decisions = []
        for available in (need, need - 1, 4 * need, need // 4):
            load = _load_admits(opened, variant, available, context)
            planned, planned_need = _plan_admits(hf, variant, available, context)
            assert planned_need == need, (variant.name, context)
            assert load == planned, (variant.name, context, available, need)
            decisions.append(load)
        assert decisions == [True, False, True, False], variant.name


def test_load_and_plan_agree_once_this_host_is_calibrated(
    packed: tuple[Path, OpenedBundle], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With benchmarks recorded for this host, load admits by the calibrated memory, as
    ``edgekit plan --device host`` predicts it (the samples here are made up, larger than
    the first estimates by a wide margin, so that a load that ignored them would differ)."""
    from edgekit.converters.planner.calibration import record, this_host_key
    from edgekit.converters.planner.fitting import Sample

    hf, opened = packed
    monkeypatch.setenv("EDGEKIT_CACHE", str(tmp_path))
    key = this_host_key()
    assert key is not None
    context = CONTEXTS[0]
    before = {
        v.name: variant_fit(
            opened, v, available_bytes=1 << 50, context=context, device="cpu"
        ).memory_bytes
        for v in opened.manifest.variants
    }
    for target in {v.target for v in opened.manifest.variants}:
        for i, weights in enumerate((10_000_000, 40_000_000)):
            record(
                key,
                target,
                "cpu",
                Sample(
                    key=f"made-up-{i}",
                    bytes_per_token=float(weights),
                    decode_s_per_token=0.01 * (i + 1),
                    flops_per_token=None,
                    prefill_s_per_token=None,
                    weights_bytes=weights,
                    kv_used_bytes=0,
                    vocab_term_bytes=0,
                    memory_bytes=400_000_000 + 2 * weights,
                    watts=None,
                    recorded="2026-12-01T00:00:00+00:00",
                ),
            )
    for variant in opened.manifest.variants:
        need = variant_fit(
            opened,
            variant,
            available_bytes=1 << 50,
            context=context,
            device="cpu",
            calibrate_for=key,
        ).memory_bytes
        assert need > before[variant.name] + 100_000_000, variant.name  # the samples count
        for available in (need, need - 1):
            load = _load_admits(opened, variant, available, context)
            planned, planned_need = _plan_admits(hf, variant, available, context, key)
            assert planned_need == need, variant.name
            assert load == planned == (available == need), (variant.name, available, need)
