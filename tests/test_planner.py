"""The planner: pinned choices for a table of models, devices and budgets; rejections,
device limits, power modes; calibration fits; the CLI."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner
from edgekit.converters.planner import Budgets, Plan, calibration, fitting, plan

from edgekit.cli import main
from edgekit.cli.plan_view import parse_size, parse_watts
from edgekit.devices import GIB, load_profile
from edgekit.errors import PlanError, SchemaError
from edgekit.inspection import inspect_model
from edgekit.modelspec import ModelSpec

# Configs only, as published (mistralai/Mistral-7B-v0.1, meta-llama/Llama-3.1-70B): the
# samples the README plans with.
CONFIGS = Path(__file__).parent.parent / "samples" / "configs"
MISTRAL_7B = json.loads((CONFIGS / "mistral-7b" / "config.json").read_text())
LLAMA_70B = json.loads((CONFIGS / "llama-3.1-70b" / "config.json").read_text())


@pytest.fixture(autouse=True)
def _own_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No local quality or calibration file: the built-in tables decide."""
    monkeypatch.setenv("EDGEKIT_CACHE", str(tmp_path / "cache"))


def _config_spec(tmp_path: Path, config: dict[str, object], name: str) -> ModelSpec:
    folder = tmp_path / name
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    return inspect_model(folder)


def _as_float(spec: ModelSpec) -> ModelSpec:
    """``spec`` as if its GGUF held F16 matrices (F32 vectors): a float source of the same
    shape, for the choices a float source gets."""
    tensors = tuple(
        replace(t, dtype="F16", nbytes=t.numel * 2)
        if len(t.shape) >= 2
        else replace(t, dtype="F32", nbytes=t.numel * 4)
        for t in spec.tensors
    )
    return replace(
        spec,
        tensors=tensors,
        dtype="F16",
        file_type="F16",
        weight_bytes=sum(t.nbytes for t in tensors),
    )


@pytest.fixture
def specs(tmp_path: Path, default_gguf: Path) -> dict[str, ModelSpec]:
    smollm2 = inspect_model(default_gguf)
    return {
        "smollm2": smollm2,  # the embedded Q4_1 file: an already-quantized source
        "smollm2-f16": _as_float(smollm2),
        "7b": _config_spec(tmp_path, MISTRAL_7B, "mistral-7b"),
        "70b": _config_spec(tmp_path, LLAMA_70B, "llama-70b"),
    }


def _pick(p: Plan) -> str:
    if p.choice is not None:
        return f"{p.choice.target} {p.choice.format} {p.choice.unit}"
    assert p.closest is not None
    return f"none; closest {p.closest.target} {p.closest.format}"


# (model, device, budgets) -> the pick. Each row is a judgement a user can check: the best
# quality tier that fits every budget, the fastest within it.
TABLE: list[tuple[str, str, Budgets, str]] = [
    ("smollm2-f16", "galaxy-s25-ultra", Budgets(), "llamacpp Q6_K cpu"),
    ("smollm2-f16", "galaxy-s25-ultra", Budgets(memory_bytes=260 << 20), "llamacpp Q4_K_M cpu"),
    ("smollm2-f16", "galaxy-s25-ultra", Budgets(memory_bytes=250_000_000), "llamacpp Q3_K_M cpu"),
    ("smollm2-f16", "intel-core-ultra-7-258v-laptop", Budgets(), "openvino INT8 cpu"),
    # The Q4_1 file itself: kept as it is (llama.cpp copies every tensor), it loses
    # nothing more and is smaller than any format that requantizes it up.
    ("smollm2", "galaxy-s25-ultra", Budgets(), "llamacpp Q4_1 cpu"),
    ("smollm2", "galaxy-s25-ultra", Budgets(max_quality_loss=0.001), "llamacpp Q4_1 cpu"),
    ("smollm2", "intel-core-ultra-7-258v-laptop", Budgets(), "llamacpp Q4_1 cpu"),
    ("smollm2", "rtx-4090-desktop", Budgets(), "llamacpp Q4_1 gpu"),
    # below the Q4_1 file's own needs, requantizing down is what is left
    ("smollm2", "galaxy-s25-ultra", Budgets(memory_bytes=250_000_000), "llamacpp Q3_K_M cpu"),
    ("7b", "galaxy-s25-ultra", Budgets(), "llamacpp Q4_K_M cpu"),
    ("7b", "galaxy-s25-ultra", Budgets(memory_bytes=4 * GIB), "llamacpp Q3_K_M cpu"),
    ("7b", "galaxy-s25-ultra", Budgets(memory_bytes=3 * GIB), "none; closest llamacpp Q2_K"),
    ("7b", "macbook-air-m3", Budgets(), "llamacpp Q6_K gpu"),
    ("7b", "macbook-air-m3", Budgets(min_decode_tok_s=12), "llamacpp Q4_K_M gpu"),
    ("7b", "jetson-orin-nano-super", Budgets(), "llamacpp Q4_K_M gpu"),
    ("7b", "jetson-orin-nano-super", Budgets(context=16384), "llamacpp Q3_K_M gpu"),
    ("7b", "rtx-4090-desktop", Budgets(), "llamacpp Q6_K gpu"),
    ("7b", "intel-core-ultra-7-258v-laptop", Budgets(), "llamacpp Q6_K cpu"),
    ("7b", "x86-laptop-no-gpu", Budgets(min_decode_tok_s=5), "llamacpp Q4_K_M cpu"),
    ("70b", "macbook-pro-m3-max", Budgets(), "llamacpp Q4_K_M gpu"),
    ("70b", "macbook-pro-m3-max", Budgets(context=32768), "llamacpp Q3_K_M gpu"),
    # without a speed floor the plan favours quality: Q6_K fits 64 GB at ~2 tok/s
    ("70b", "jetson-agx-orin-64gb", Budgets(), "llamacpp Q6_K gpu"),
    ("70b", "jetson-agx-orin-64gb", Budgets(min_decode_tok_s=3), "llamacpp Q4_K_M gpu"),
    ("70b", "rtx-4090-desktop", Budgets(), "none; closest llamacpp Q2_K"),
    ("70b", "galaxy-s25-ultra", Budgets(), "none; closest llamacpp Q2_K"),
]


@pytest.mark.parametrize(("model", "device", "budgets", "expected"), TABLE)
def test_plan_table(
    specs: dict[str, ModelSpec], model: str, device: str, budgets: Budgets, expected: str
) -> None:
    p = plan(specs[model], load_profile(device), budgets)
    assert _pick(p) == expected, p.summary
    # every candidate is explained: a fit has figures, a rejection has reasons
    for c in p.candidates:
        assert c.fits or all(r.strip() for r in c.rejections)
        assert c.prediction.memory_bytes > c.prediction.weights_bytes > 0


def test_rejections_are_one_line_and_name_the_limit(specs: dict[str, ModelSpec]) -> None:
    p = plan(specs["7b"], load_profile("galaxy-s25-ultra"), Budgets())
    by = {(c.target, c.format): c for c in p.candidates}
    q8 = by[("llamacpp", "Q8_0")]
    assert not q8.fits
    assert q8.rejections[0].startswith("llamacpp Q8_0 needs ")
    assert "the phone lets an app use about 6.00 GiB" in q8.rejections[0]
    # the Hexagon NPU maps 4 GiB per session, but the HTP build splits the model into
    # parts that each fit: a 7B W8A16 is held to the phone's app memory, not to 4 GiB
    npu = next(c for c in p.candidates if (c.target, c.format, c.unit) == ("qnn", "W8A16", "npu"))
    assert not npu.fits
    assert "the phone lets an app use about 6.00 GiB" in npu.rejections[0]
    assert not any("maps at most" in r for r in npu.rejections)
    assert all("\n" not in r for c in p.candidates for r in c.rejections)


def test_an_htp_candidate_carries_the_soc_it_is_compiled_for(tmp_path: Path) -> None:
    """pack --device takes the SoC and the per-part limit from the profile (through the
    candidate's build_recipe); a Snapdragon profile that names no SoC edgekit compiles
    for gets prediction-only HTP candidates that say why."""
    from edgekit.devices import parse_profile

    spec = _config_spec(tmp_path, MISTRAL_7B, "mistral")
    for device, soc in (
        ("galaxy-s25-ultra", "SM8750"),
        ("galaxy-s24-ultra", "SM8650"),
        ("snapdragon-x-elite-laptop", "SC8380XP"),
    ):
        p = plan(spec, load_profile(device), Budgets(context=2048))
        npu = [c for c in p.candidates if (c.target, c.unit) == ("qnn", "npu")]
        assert npu and all(c.build_recipe == f"soc={soc},part_gib=4" for c in npu)
        assert all(c.buildable for c in npu)
        cpu = [c for c in p.candidates if (c.target, c.unit) == ("qnn", "cpu")]
        assert cpu and all(c.build_recipe == "" for c in cpu)
    text = (Path(__file__).parent.parent / "profiles" / "galaxy-s25-ultra.toml").read_text()
    anonymous = parse_profile(text.replace('soc = "SM8750"\n', ""), "no-soc")
    p = plan(spec, anonymous, Budgets(context=2048))
    npu = [c for c in p.candidates if (c.target, c.unit) == ("qnn", "npu")]
    assert npu and all(not c.buildable and "names no SoC" in c.build_note for c in npu)


def test_mlx_is_held_to_its_share_of_the_working_set(specs: dict[str, ModelSpec]) -> None:
    """On the M3 Max (48 GiB working set) a 70B at ctx 32768 in MLX 4BIT needs about
    47 GiB: under the working set, over mlx-lm's 0.9 of it. MLX is held to 43.2 GiB and
    says how to raise it; llama.cpp on the same GPU to the whole 48 GiB."""
    from edgekit.targets.mlx import MlxTarget

    p = plan(specs["70b"], load_profile("macbook-pro-m3-max"), Budgets(context=32768))
    by = {(c.target, c.format): c for c in p.candidates}
    mlx = by[(MlxTarget.name, "4BIT")]
    assert mlx.memory_limit_bytes == int(0.9 * 48 * GIB)
    assert 0.9 * 48 * GIB < mlx.prediction.memory_bytes < 48 * GIB, mlx.prediction
    assert not mlx.fits
    (memory,) = [r for r in mlx.rejections if "needs" in r]
    assert "mlx-lm's 0.9 of the GPU working set is 43.20 GiB" in memory, memory
    assert "iogpu.wired_limit_mb" in memory, memory
    assert by[("llamacpp", "Q4_K_M")].memory_limit_bytes == 48 * GIB


def test_nothing_fits_says_the_smallest_option_and_the_shortfall(
    specs: dict[str, ModelSpec],
) -> None:
    p = plan(specs["70b"], load_profile("galaxy-s25-ultra"), Budgets())
    assert p.choice is None and p.closest is not None
    assert p.summary.startswith("nothing fits. The smallest option, llamacpp Q2_K")
    assert "GiB more than the 6.00 GiB available" in p.summary


def test_k_quant_mix_is_in_the_memory(specs: dict[str, ModelSpec]) -> None:
    p = plan(specs["7b"], load_profile("rtx-4090-desktop"), Budgets())
    q4 = next(c for c in p.candidates if c.format == "Q4_K_M")
    assert set(q4.storage) == {"Q4_K", "Q6_K", "F32"}
    assert q4.storage["Q6_K"] > 0.15 * q4.prediction.weights_bytes


def test_npu_static_prompt_limit(specs: dict[str, ModelSpec]) -> None:
    laptop = load_profile("intel-core-ultra-7-155h-laptop")
    long = plan(specs["smollm2"], laptop, Budgets(context=4096))
    npu = [c for c in long.candidates if c.unit == "npu"]
    assert npu and all(any("static prompt" in r for r in c.rejections) for c in npu)
    short = plan(specs["smollm2"], laptop, Budgets(context=1024))
    assert any(c.unit == "npu" and c.fits for c in short.candidates)


def test_power_budget_picks_a_jetson_power_mode(specs: dict[str, ModelSpec]) -> None:
    nano = load_profile("jetson-orin-nano-super")
    default = plan(specs["7b"], nano, Budgets())
    capped = plan(specs["7b"], nano, Budgets(watts=10))
    assert default.power_mode == "25W" and capped.power_mode == "7W"
    assert default.choice is not None and capped.choice is not None
    d, c = default.choice.prediction, capped.choice.prediction
    # 7W caps the memory clock: 68.3 of 102.4 GB/s
    assert c.decode_tok_s is not None and d.decode_tok_s is not None
    assert c.decode_tok_s == pytest.approx(d.decode_tok_s * 68.3 / 102.4, rel=0.05)
    assert c.watts == 7.0
    too_low = plan(specs["7b"], nano, Budgets(watts=3))
    assert too_low.choice is None
    assert any("idle" in r for c in too_low.candidates for r in c.rejections)


def test_quality_and_speed_budgets(specs: dict[str, ModelSpec]) -> None:
    laptop = load_profile("x86-laptop-no-gpu")
    p = plan(specs["7b"], laptop, Budgets(min_decode_tok_s=50))
    assert p.choice is None
    assert any("below --min-tps 50" in r for c in p.candidates for r in c.rejections)
    strict = plan(specs["smollm2-f16"], laptop, Budgets(max_quality_loss=0.005))
    assert strict.choice is not None and strict.choice.format in ("Q8_0", "F16")
    assert any("--max-quality-loss" in r for c in strict.candidates for r in c.rejections)


def test_bad_budgets_raise_plan_errors(specs: dict[str, ModelSpec]) -> None:
    phone = load_profile("galaxy-s25-ultra")
    with pytest.raises(PlanError):
        plan(specs["smollm2"], phone, Budgets(context=0))
    with pytest.raises(PlanError, match="KV-cache type"):
        plan(specs["smollm2"], phone, Budgets(kv_cache="q3"))
    p = plan(specs["smollm2"], phone, Budgets(context=100_000))
    assert any("longer than the model's trained context" in n for n in p.notes)


def test_parse_sizes_and_watts() -> None:
    assert parse_size("6GB") == 6_000_000_000
    assert parse_size("4 GiB") == 4 * GIB
    assert parse_size("512MB") == 512_000_000
    assert parse_watts("10W") == 10.0 and parse_watts("7.5") == 7.5
    for bad in ("six", "-1GB", "3 parsecs", "0"):
        with pytest.raises(PlanError):
            parse_size(bad)
    with pytest.raises(PlanError):
        parse_watts("ten watts")


# --- calibration -----------------------------------------------------------------------


def _sample(key: str, x: float, y: float, mem: int | None = None) -> fitting.Sample:
    return fitting.Sample(
        key=key,
        bytes_per_token=x,
        decode_s_per_token=y,
        flops_per_token=None,
        prefill_s_per_token=None,
        weights_bytes=int(x),
        kv_used_bytes=0,
        vocab_term_bytes=0,
        memory_bytes=mem,
        watts=None,
        recorded="now",
    )


def test_calibration_fits_a_known_line() -> None:
    from edgekit.targets.registry import get_target

    # 0.2 ms per token + 1 ns per byte, at a nominal 10 GB/s: efficiency 0.1
    found = [
        _sample(str(i), x, 2e-4 + 1e-9 * x, mem=int(50e6 + 1.5 * x))
        for i, x in enumerate((1e6, 1e8))
    ]
    prior = get_target("openvino").unit("cpu").priors  # type: ignore[union-attr]
    c = fitting.fit(prior, found, bandwidth_gbps=10, peak_tflops=None, vocab_term_bytes=0)
    assert c.basis == "calibrated"
    assert c.token_overhead_s == pytest.approx(2e-4, rel=1e-6)
    assert c.bandwidth_efficiency == pytest.approx(0.1, rel=1e-6)
    assert c.weight_residency == pytest.approx(1.5, rel=1e-6)
    assert c.runtime_bytes == pytest.approx(50e6, rel=1e-6)


def test_calibration_file_replaces_a_rerun_and_rejects_garbage() -> None:
    calibration.record("dev", "llamacpp", "cpu", _sample("b#v@2", 1e6, 1e-3))
    calibration.record("dev", "llamacpp", "cpu", _sample("b#v@2", 1e6, 2e-3))
    calibration.record("dev", "llamacpp", "cpu", _sample("b#w@2", 2e6, 3e-3))
    found = calibration.samples("dev", "llamacpp", "cpu")
    assert sorted(s.decode_s_per_token for s in found) == [2e-3, 3e-3]
    assert calibration.samples("other", "llamacpp", "cpu") == []
    calibration.calibration_file().write_text("{not json")
    with pytest.raises(SchemaError, match="delete it"):
        calibration.samples("dev", "llamacpp", "cpu")


# --- CLI -------------------------------------------------------------------------------


def test_cli_plan_json_and_table(default_gguf: Path, tmp_path: Path) -> None:
    runner = CliRunner()
    out = runner.invoke(main, ["plan", "--device", "galaxy-s25-ultra", "--json"])
    assert out.exit_code == 0, out.output
    data = json.loads(out.output)
    assert data["choice"]["target"] == "llamacpp" and data["choice"]["fits"] is True
    assert {"memory_bytes", "decode_tok_s", "prefill_tok_s", "watts", "joules_per_token"} <= set(
        data["choice"]["prediction"]
    )
    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(LLAMA_70B))
    table = runner.invoke(
        main, ["plan", str(folder / "config.json"), "-d", "jetson-agx-orin-64gb", "--power", "30W"]
    )
    assert table.exit_code == 0, table.output
    assert "power mode MODE_30W" in table.output and "rejected" in table.output
    bad = runner.invoke(main, ["plan", "--device", "galaxy-s25-ultra", "--memory", "lots"])
    assert bad.exit_code == 1 and "not a memory size" in bad.output


def test_pack_for_a_device_stores_the_plan(default_gguf: Path, tmp_path: Path) -> None:
    pytest.importorskip("llama_cpp")
    runner = CliRunner()
    out = tmp_path / "b"
    result = runner.invoke(
        main,
        ["pack", "--device", "galaxy-s25-ultra", "--memory", "250MB", "-o", str(out), "--json"],
    )
    assert result.exit_code == 0, result.output
    variant = json.loads((out / "manifest.json").read_text())["variants"][0]
    # Q4_K_M needs ~257 MB at ctx 4096 (see the table above): Q3_K_M is the best that fits
    assert (variant["target"], variant["quant"]) == ("llamacpp", "Q3_K_M")
    predicted = variant["predicted"]
    assert predicted["source"].startswith("edgekit plan for galaxy-s25-ultra")
    assert predicted["decode_tok_s"] > 0 and predicted["memory_bytes"] < 250e6
    both = runner.invoke(main, ["pack", "--device", "host", "--quant", "Q8_0", "-o", str(out)])
    assert both.exit_code == 2


# --- an already-quantized source -------------------------------------------------------


def test_a_quantized_source_is_kept_and_requantizing_up_is_marked(
    specs: dict[str, ModelSpec],
) -> None:
    """From the Q4_1 file: Q4_1 itself is a candidate (llama.cpp copies every tensor, so
    it loses nothing more and is the file's own size); every format with more bits is
    marked as recovering nothing; the plan says the source is already 4-bit."""
    p = plan(specs["smollm2"], load_profile("galaxy-s25-ultra"), Budgets())
    assert any(n.startswith("the source is already Q4_1 (5.7 bits per weight)") for n in p.notes)
    by = {(c.target, c.format): c for c in p.candidates}
    own = by[("llamacpp", "Q4_1")]
    assert p.choice is own and own.quality_loss == 0.0 and not own.requantizes_up
    assert own.quality_source == "the Q4_1 source as it is (llama.cpp copies every tensor)"
    assert own.prediction.weights_bytes == specs["smollm2"].weight_bytes
    for fmt in ("F16", "Q8_0", "Q6_K", "Q5_K_M", "Q4_K_M"):
        c = by[("llamacpp", fmt)]
        assert c.requantizes_up, fmt
        assert "recovering nothing of what Q4_1 lost" in c.quality_note
        assert "Q4_1 source" in c.quality_source and "not the original model" in c.quality_source
    for fmt in ("Q4_0", "Q3_K_M", "Q2_K"):  # fewer bits: a second loss, not an upgrade
        assert not by[("llamacpp", fmt)].requantizes_up, fmt
    floats = plan(specs["smollm2-f16"], load_profile("galaxy-s25-ultra"), Budgets())
    assert not any("already" in n for n in floats.notes)
    assert not any(c.requantizes_up or c.quality_note for c in floats.candidates)
    assert "Q4_1" not in {c.format for c in floats.candidates}


def test_within_a_tier_requantizing_up_ranks_after_what_does_not(
    specs: dict[str, ModelSpec],
) -> None:
    """A source type edgekit does not plan (Q5_1 here) has no as-is candidate: the pick
    then says it requantizes up; and in a tier, a faster candidate that requantizes up
    still ranks after one that does not."""
    from edgekit.converters.planner.ranking import rank

    q4 = specs["smollm2"]
    q5 = replace(
        q4,
        file_type="Q5_1",
        dtype="Q5_1",
        tensors=tuple(
            replace(t, dtype="Q5_1", nbytes=t.numel // 32 * 24) if t.dtype == "Q4_1" else t
            for t in q4.tensors
        ),
    )
    p = plan(q5, load_profile("galaxy-s25-ultra"), Budgets())
    assert "Q5_1" not in {c.format for c in p.candidates}
    assert p.choice is not None and p.choice.requantizes_up
    assert "requantizes up" in p.summary and "from a 6.5-bit Q5_1 source" in p.summary
    by = {(c.target, c.format): c for c in plan(q4, load_profile("galaxy-s25-ultra")).candidates}
    own, up = by[("llamacpp", "Q4_1")], by[("llamacpp", "Q6_K")]
    assert own.quality_tier == up.quality_tier
    faster_up = replace(up, prediction=replace(up.prediction, decode_tok_s=1e9))
    assert sorted([faster_up, own], key=rank) == [own, faster_up]


def test_a_unit_edgekit_cannot_build_for_is_prediction_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A target that builds its format for one unit but not another (as QNN did before
    edgekit built the HTP variant: ONNX CPU variants yes, the HTP not yet): the other
    unit's candidates are predicted and ranked but never packed, and say why."""
    from edgekit.targets.registry import all_targets, get_target

    qnn = get_target("qnn")
    monkeypatch.setattr(
        qnn,
        "units",
        tuple(
            replace(u, not_built="not built for this test") if u.kind == "npu" else u
            for u in qnn.units
        ),
    )
    spec = _config_spec(tmp_path, MISTRAL_7B, "mistral")
    split = [(t, u) for t in all_targets() for u in t.units if u.not_built and t.runs]
    assert split, "no runnable target declares a unit it cannot build for"
    for target, unit in split:
        profile = next(
            load_profile(n)
            for n in ("galaxy-s25-ultra", "galaxy-s24-ultra")
            if target.name in load_profile(n).targets
        )
        p = plan(spec, profile, Budgets(context=2048))
        on_unit = [c for c in p.candidates if (c.target, c.unit) == (target.name, unit.kind)]
        assert on_unit and all(not c.buildable and c.build_note == unit.not_built for c in on_unit)
        other = [c for c in p.candidates if c.target == target.name and c.unit != unit.kind]
        assert other and all(c.buildable for c in other)
        assert p.choice is None or (p.choice.target, p.choice.unit) != (target.name, unit.kind)
