"""TensorRT Edge-LLM in the planner: the precisions each chip runs (an Orin is never
offered FP8, an RTX 4090 never NVFP4, an unnamed chip only what every chip runs), F16
buildable and the quantized precisions planned but prediction-only with the reason,
the engine settings pack records for the device, and the power modes compared."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner
from edgekit.converters.planner import Budgets, plan
from edgekit.converters.planner.sources import formats_for
from edgekit.converters.tensorrt.socs import CHIPS, F16, FP8, INT4, INT8, NVFP4, PRECISIONS
from edgekit.targets import tensorrt_plan
from edgekit.targets.registry import all_targets, get_target

from edgekit.cli import main
from edgekit.devices import Accelerator, DeviceProfile, load_profile, profile_names
from edgekit.inspection import inspect_model
from edgekit.modelspec import ModelSpec

NANO = "jetson-orin-nano-super"
TRT = "tensorrt"
# HuggingFaceTB/SmolLM2-135M-Instruct's published config.json (the default model's
# shape, llama family): planned from the config alone, no weights.
SMOLLM2_135M = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 576,
    "intermediate_size": 1536,
    "num_hidden_layers": 30,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "vocab_size": 49152,
    "max_position_embeddings": 8192,
    "rope_theta": 100000,
    "rms_norm_eps": 1e-5,
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
}


@pytest.fixture(autouse=True)
def _own_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EDGEKIT_CACHE", str(tmp_path / "cache"))


@pytest.fixture
def smollm2_config(tmp_path: Path) -> ModelSpec:
    folder = tmp_path / "smollm2-135m"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(SMOLLM2_135M))
    return inspect_model(folder)


def _gpu(profile: DeviceProfile) -> Accelerator:
    return next(a for a in profile.accelerators if (a.runtime_device or "").startswith("cuda"))


def _with_soc(profile: DeviceProfile, soc: str | None) -> DeviceProfile:
    accs = tuple(
        replace(a, soc=soc) if (a.runtime_device or "").startswith("cuda") else a
        for a in profile.accelerators
    )
    return replace(profile, accelerators=accs)


# --- the precisions a chip runs --------------------------------------------------------


@pytest.mark.parametrize(
    ("device", "soc", "expected"),
    [
        (NANO, "ORIN", (F16, INT8, INT4)),
        ("jetson-agx-orin-64gb", "ORIN", (F16, INT8, INT4)),
        ("rtx-4090-desktop", "AD102", (F16, INT8, INT4, FP8)),
    ],
)
def test_each_nvidia_profile_names_its_chip_and_gets_its_precisions(
    device: str, soc: str, expected: tuple[str, ...]
) -> None:
    profile = load_profile(device)
    gpu = _gpu(profile)
    assert gpu.soc == soc
    assert tensorrt_plan.unit_formats(profile, gpu, PRECISIONS) == expected
    assert tensorrt_plan.build_recipe(profile, gpu) == f"soc={soc}"


def test_every_shipped_cuda_gpu_names_a_chip_the_table_knows() -> None:
    """A new NVIDIA profile without a known chip would silently get the narrow set."""
    for name in profile_names():
        profile = load_profile(name)
        for acc in profile.accelerators:
            if (acc.runtime_device or "").startswith("cuda"):
                assert acc.soc in CHIPS, f"{name}: {acc.name} soc {acc.soc!r}"


@pytest.mark.parametrize("soc", [None, "GB10"])
def test_an_unnamed_or_unknown_chip_gets_what_every_chip_runs(soc: str | None) -> None:
    """Decision: no soc, or one the table lacks (a profile written by hand, a new chip):
    only the precisions every chip in the table runs, and no soc in the build (the
    export records none; the engine's precision is then F16/INT8/INT4, which every
    supported SM runs)."""
    profile = _with_soc(load_profile("rtx-4090-desktop"), soc)
    gpu = _gpu(profile)
    common = tuple(p for p in PRECISIONS if all(p in c.precisions for c in CHIPS.values()))
    assert common == (F16, INT8, INT4)
    assert tensorrt_plan.unit_formats(profile, gpu, PRECISIONS) == common
    assert tensorrt_plan.build_recipe(profile, gpu) == ""


def test_the_default_offer_is_the_formats_quants_by_bits() -> None:
    profile = load_profile("rtx-4090-desktop")
    offered = tensorrt_plan.unit_formats(profile, _gpu(profile))
    trt = get_target(TRT).format
    bits = [trt.quants[f].bits_per_weight for f in offered]
    assert bits == sorted(bits, reverse=True) and NVFP4 not in offered


def test_the_planner_asks_the_target_for_the_units_formats() -> None:
    """formats_for is the target's unit_formats: TensorRT narrows by chip, every other
    target keeps the contract's default (its unit's list)."""
    nano, rtx = load_profile(NANO), load_profile("rtx-4090-desktop")
    trt = get_target(TRT)
    on_nano = formats_for(trt, nano, _gpu(nano), None)
    on_rtx = formats_for(trt, rtx, _gpu(rtx), None)
    assert FP8 not in on_nano and NVFP4 not in on_nano and F16 in on_nano
    assert NVFP4 not in on_rtx
    if FP8 in trt.format.quants:  # the format sizes FP8: the 4090 (SM89) is offered it
        assert FP8 in on_rtx
    for target in all_targets():
        if target.name == TRT:
            continue
        for acc in target.accelerators(nano):
            unit = target.unit(acc.kind)
            assert unit is not None
            assert formats_for(target, nano, acc, None) == unit.formats


# --- plan: F16 built, the quantized ones planned ---------------------------------------


def test_on_the_orin_nano_f16_is_buildable_and_the_quantized_are_prediction_only(
    smollm2_config: ModelSpec,
) -> None:
    p = plan(smollm2_config, load_profile(NANO), Budgets(context=4096))
    trt = {c.format: c for c in p.candidates if c.target == TRT}
    assert set(trt) <= {F16, INT8, INT4} and F16 in trt
    f16 = trt[F16]
    assert f16.fits and f16.buildable, f16.rejections or f16.build_note
    assert f16.build_recipe == "soc=ORIN"
    assert "engine" in f16.build_note and "on the device" in f16.build_note
    fmt = get_target(TRT).format
    for name, c in trt.items():
        if name == F16:
            continue
        assert not c.buildable and c.build_note == fmt.quant_not_built(name), name
        assert "ModelOpt" in c.build_note
    assert fmt.quant_not_built(F16) == ""


def test_plan_json_compares_the_power_modes(smollm2_config: ModelSpec, tmp_path: Path) -> None:
    config = tmp_path / "smollm2-135m" / "config.json"
    out = CliRunner().invoke(main, ["plan", str(config), "--device", NANO, "--json"])
    assert out.exit_code == 0, out.output
    data = json.loads(out.output)
    modes = {m["mode"]: m for m in data["power_modes"]}
    profile = load_profile(NANO)
    assert list(modes) == [m.name for m in profile.power.modes]
    assert [m["mode"] for m in data["power_modes"] if m["chosen"]] == [data["power_mode"]]
    # 7W caps the memory clock (68 of 102 GB/s) and the draw: slower, fewer watts
    low, high = modes["7W"], modes["MAXN_SUPER"]
    assert low["decode_tok_s"] < high["decode_tok_s"]
    assert low["watts"] == 7.0 and low["watts"] < high["watts"]
    for m in modes.values():
        assert m["joules_per_token"] == pytest.approx(m["watts"] / m["decode_tok_s"])
    table = CliRunner().invoke(main, ["plan", str(config), "--device", NANO])
    assert table.exit_code == 0 and "power modes" in table.output


def test_a_power_budget_marks_the_modes_above_it(smollm2_config: ModelSpec) -> None:
    p = plan(smollm2_config, load_profile(NANO), Budgets(context=4096, watts=15))
    fits = {m.mode: m.fits for m in p.power_modes}
    assert fits["7W"] and fits["15W"] and not fits["25W"] and not fits["MAXN_SUPER"]
    assert p.power_mode == "15W"


def test_no_power_modes_no_comparison(smollm2_config: ModelSpec) -> None:
    assert plan(smollm2_config, load_profile("rtx-4090-desktop"), Budgets()).power_modes == ()


def test_the_default_model_plans_onto_the_orin_nano(default_gguf: Path) -> None:
    p = plan(inspect_model(default_gguf), load_profile(NANO), Budgets(context=4096))
    assert p.choice is not None
    f16 = next(c for c in p.candidates if (c.target, c.format) == (TRT, F16))
    assert f16.fits and f16.buildable and f16.build_recipe == "soc=ORIN"


# --- pack --device: the export and its engine settings ---------------------------------


def _tool_env_or_skip() -> None:
    """The export runs in edgekit's tool environment (without it pack refuses before
    writing: the export's own tests check that), so this test needs it installed."""
    from edgekit.converters.tensorrt.tool_env import EXPORT_ENV

    from edgekit.tool_envs import status

    found = status(EXPORT_ENV)
    if not found.ready:
        pytest.skip(
            f"the {EXPORT_ENV.name} tool environment at {found.path} is not ready "
            f"({found.reason}): {EXPORT_ENV.install_hint}"
        )


@pytest.mark.slow
def test_pack_for_the_orin_nano_packs_the_f16_export_and_its_settings(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    _tool_env_or_skip()
    from tests.tiny_models import build_tiny_model

    model = build_tiny_model("llama", tmp_path / "tiny-llama")
    out = tmp_path / "bundle"
    result = CliRunner().invoke(
        main, ["pack", str(model), "--device", NANO, "--context", "512", "-o", str(out), "--json"]
    )
    assert result.exit_code == 0, result.output
    manifest = json.loads((out / "manifest.json").read_text())
    variant = next(v for v in manifest["variants"] if v["target"] == TRT)
    assert variant["quant"] == F16 and variant["recipe"]["soc"] == "ORIN"
    assert variant["runtime"]["context"] == 512
    engine = json.loads((out / variant["entry"] / "engine.json").read_text())
    assert engine["precision"] == F16 and engine["soc"] == "ORIN"
    assert engine["max_kv_cache_capacity"] == engine["max_input_len"] + engine["max_output_len"]
    assert engine["max_kv_cache_capacity"] == 512  # the plan's context, not the model's 1024
    assert (out / variant["entry"] / "llm" / "model.onnx").is_file()
    assert variant["predicted"]["source"].startswith(f"edgekit plan for {NANO}")
