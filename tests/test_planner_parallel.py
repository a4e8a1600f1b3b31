"""Continuous batching in the planner (issue 18): ``Budgets.parallel`` streams each hold a
KV cache of the context; the aggregate decode of N streams rises and saturates at the
compute ceiling; ``suggest_parallel`` is serve's default; ``edgekit plan --parallel``;
and ``edgekit.load(parallel=N)`` is admitted for N KV caches."""

from __future__ import annotations

import json
import math
import shutil
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from edgekit.converters.planner import (
    MAX_SUGGESTED_PARALLEL,
    Budgets,
    Candidate,
    Plan,
    plan,
    suggest_parallel,
)
from edgekit.converters.planner.admission import load_fit, load_streams
from edgekit.converters.planner.memory import (
    kv_cache_bytes,
    resident_bytes,
    stream_runtime_bytes,
)
from edgekit.converters.planner.predict import aggregate_rate, predict, units_for
from edgekit.targets.contract import Coefficients
from edgekit.targets.registry import get_target

from edgekit.cli import main
from edgekit.devices import load_profile
from edgekit.errors import InsufficientMemoryError, PlanError, SettingError
from edgekit.inspection import inspect_model
from edgekit.modelspec import ModelSpec
from tests.test_hostile_files import FakeTarget, make_bundle
from tests.test_hostile_predict import COEFFICIENT_CASES

CONFIGS = Path(__file__).parent.parent / "samples" / "configs"
LLAMACPP = get_target("llamacpp")
OPENVINO = get_target("openvino")


@pytest.fixture(autouse=True)
def _own_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No local quality or calibration file: the first estimates decide."""
    monkeypatch.setenv("EDGEKIT_CACHE", str(tmp_path / "cache"))


@pytest.fixture
def smollm2(default_gguf: Path) -> ModelSpec:
    return inspect_model(default_gguf)


@pytest.fixture
def mistral() -> ModelSpec:
    return inspect_model(CONFIGS / "mistral-7b")


def _find(p: Plan, target: str, fmt: str, unit: str = "cpu") -> Candidate:
    return next(c for c in p.candidates if (c.target, c.format, c.unit) == (target, fmt, unit))


# --- memory ------------------------------------------------------------------------------


def test_memory_counts_a_kv_cache_per_stream(smollm2: ModelSpec) -> None:
    profile = load_profile("x86-laptop-no-gpu")
    one = plan(smollm2, profile, Budgets(context=4096))
    four = plan(smollm2, profile, Budgets(context=4096, parallel=4))
    kv = kv_cache_bytes(smollm2, 4096, "f16", layout=LLAMACPP.kv_cache)
    logits = smollm2.vocab_size * 4  # one f32 row of logits per further stream
    assert stream_runtime_bytes(smollm2) == logits
    a, b = _find(one, "llamacpp", "Q8_0").prediction, _find(four, "llamacpp", "Q8_0").prediction
    # llama.cpp maps the file once and holds its cache as allocated (residency, scale 1)
    assert a.kv_cache_bytes == b.kv_cache_bytes == kv  # one stream's
    assert a.memory_bytes == a.weights_bytes + kv + a.runtime_bytes
    assert b.memory_bytes == b.weights_bytes + 4 * kv + b.runtime_bytes + 3 * logits
    # OpenVINO's cache takes three times its nominal size: the formula scales each stream's
    intel = load_profile("intel-core-ultra-7-155h-laptop")
    ov = _find(plan(smollm2, intel, Budgets(parallel=4)), "openvino", "INT8").prediction
    c = OPENVINO.priors("cpu", smollm2)
    assert c.kv_scale != 1.0
    weights = ov.weights_bytes * c.weight_residency
    expected = int(weights + 4 * ov.kv_cache_bytes * c.kv_scale) + c.runtime_bytes + 3 * logits
    assert ov.memory_bytes == expected


def test_one_stream_is_todays_prediction(smollm2: ModelSpec) -> None:
    profile = load_profile("galaxy-s25-ultra")
    unit = units_for(profile, LLAMACPP, None)[0]
    c = LLAMACPP.priors("cpu", smollm2)
    layout = LLAMACPP.format.layout(smollm2, "Q8_0")
    p = predict(
        smollm2, layout, LLAMACPP, unit, c, profile, context=4096, kv_type="f16", watts_cap=None
    )
    assert p == predict(
        smollm2,
        layout,
        LLAMACPP,
        unit,
        c,
        profile,
        context=4096,
        kv_type="f16",
        watts_cap=None,
        parallel=1,
    )
    assert p.parallel == 1
    assert p.memory_bytes == resident_bytes(p.weights_bytes, p.kv_cache_bytes, c)
    assert p.decode_tok_s is not None
    assert p.decode_tok_s_aggregate == p.decode_tok_s == p.decode_tok_s_per_stream
    assert p.decode_tok_s_aggregate_full == p.decode_tok_s_full
    default = plan(smollm2, profile)
    assert (
        default.to_dict()["candidates"]
        == plan(smollm2, profile, Budgets(parallel=1)).to_dict()["candidates"]
    )


# --- throughput ---------------------------------------------------------------------------


def test_aggregate_rises_saturates_and_each_stream_slows(mistral: ModelSpec) -> None:
    profile = load_profile("rtx-4090-desktop")
    previous: tuple[float, float] | None = None
    for n in (1, 2, 4, 8, 16, 32, 64):
        p = _find(plan(mistral, profile, Budgets(parallel=n)), "llamacpp", "Q4_K_M", "gpu")
        total, each = p.prediction.decode_tok_s_aggregate, p.prediction.decode_tok_s_per_stream
        ceiling = p.prediction.decode_ceiling_tok_s
        assert total is not None and each is not None and ceiling is not None
        assert math.isclose(each, total / n)
        assert total <= max(ceiling, p.prediction.decode_tok_s or 0) * (1 + 1e-12)
        if previous is not None:
            assert total >= previous[0] and each < previous[1], n
        previous = (total, each)
        assert p.prediction.parallel == n and "first estimate" in p.prediction.parallel_why
    assert previous is not None
    one = _find(plan(mistral, profile), "llamacpp", "Q4_K_M", "gpu").prediction
    assert previous[0] > 4 * (one.decode_tok_s or 0)  # the weights are read once a step


def test_a_cpu_saturates_at_its_compute_ceiling(mistral: ModelSpec) -> None:
    """On a CPU the matmuls become compute-bound: past some N the aggregate is the
    ceiling prefill's throughput model allows, and stays there."""
    profile = load_profile("x86-laptop-no-gpu")
    figures = []
    for n in (1, 2, 4, 8, 16, 32, 64):
        p = _find(plan(mistral, profile, Budgets(parallel=n)), "llamacpp", "Q4_K_M").prediction
        assert p.decode_tok_s_aggregate is not None and p.decode_ceiling_tok_s is not None
        assert p.decode_tok_s_aggregate <= p.decode_ceiling_tok_s * (1 + 1e-12)
        figures.append(p.decode_tok_s_aggregate)
    assert figures == sorted(figures)
    assert math.isclose(figures[-1], p.decode_ceiling_tok_s)  # saturated
    assert figures[-1] == figures[-2]


def test_the_ceiling_caps_what_bandwidth_would_allow() -> None:
    c = Coefficients(
        bandwidth_efficiency=0.5,
        token_overhead_s=0.0,
        compute_efficiency=0.4,
        runtime_bytes=0,
        weight_residency=1.0,
        kv_preallocated=True,
    )
    # 1 GB of weights at 50 GB/s: 50 tok/s alone; 1 MB of KV per stream
    rates = [aggregate_rate(c, 1e9, 1e6, 100.0, 0, streams=n, ceiling=300.0) for n in (1, 2, 8, 64)]
    assert rates[0] == pytest.approx(50.0, rel=1e-3)
    assert rates[1] == pytest.approx(2 / (1.001e9 / 50e9 + 1e6 / 50e9), rel=1e-9)
    assert rates[2] == 300.0 and rates[3] == 300.0  # compute-bound: 8 x 50 > 300
    assert aggregate_rate(c, 1e9, 1e6, 100.0, 0, streams=64, ceiling=None) == pytest.approx(
        64 / (1e9 / 50e9 + 64 * 1e6 / 50e9)
    )


@pytest.mark.parametrize(
    ("case", "coefficients"), COEFFICIENT_CASES, ids=[c[0] for c in COEFFICIENT_CASES]
)
def test_parallel_rates_are_never_negative_or_nan(
    smollm2: ModelSpec, case: str, coefficients: Coefficients
) -> None:
    profile = load_profile("x86-laptop-no-gpu")
    unit = units_for(profile, LLAMACPP, None)[0]
    for n, watts in ((4, None), (64, None), (8, profile.power.idle_w / 2)):
        p = predict(
            smollm2,
            LLAMACPP.format.layout(smollm2, "Q8_0"),
            LLAMACPP,
            unit,
            coefficients,
            profile,
            context=4096,
            kv_type="f16",
            watts_cap=watts,
            parallel=n,
        )
        for name in (
            "decode_tok_s_aggregate",
            "decode_tok_s_aggregate_full",
            "decode_tok_s_per_stream",
            "decode_ceiling_tok_s",
        ):
            value = getattr(p, name)
            assert value is None or (math.isfinite(value) and value >= 0), (name, value)


# --- budgets, rejections ------------------------------------------------------------------


def test_rejections_name_the_streams_and_min_tps_is_per_stream(mistral: ModelSpec) -> None:
    phone = load_profile("galaxy-s25-ultra")
    p = plan(mistral, phone, Budgets(parallel=4))
    q8 = _find(p, "llamacpp", "Q8_0")
    assert not q8.fits and "at ctx 4096 x 4 streams;" in q8.rejections[0]
    assert "streams" not in _find(plan(mistral, phone), "llamacpp", "Q8_0").rejections[0]
    desk = load_profile("rtx-4090-desktop")
    one = _find(plan(mistral, desk), "llamacpp", "Q4_K_M", "gpu").prediction
    assert one.decode_tok_s is not None
    floor = one.decode_tok_s * 0.9  # one stream meets it; each of 8 does not
    slow = _find(
        plan(mistral, desk, Budgets(parallel=8, min_decode_tok_s=floor)),
        "llamacpp",
        "Q4_K_M",
        "gpu",
    )
    assert any("per stream at 8 streams, below --min-tps" in r for r in slow.rejections)
    assert _find(
        plan(mistral, desk, Budgets(min_decode_tok_s=floor)), "llamacpp", "Q4_K_M", "gpu"
    ).fits


@pytest.mark.parametrize("bad", [0, -1, 65, True, 2.0])
def test_a_parallel_out_of_range_is_a_plan_error(smollm2: ModelSpec, bad: Any) -> None:
    with pytest.raises(PlanError, match="parallel"):
        plan(smollm2, load_profile("galaxy-s25-ultra"), Budgets(parallel=bad))


# --- suggest_parallel ---------------------------------------------------------------------


def test_suggest_parallel_small_and_large_devices(mistral: ModelSpec, tmp_path: Path) -> None:
    phone = suggest_parallel(mistral, load_profile("galaxy-s25-ultra"))
    desk = suggest_parallel(mistral, load_profile("rtx-4090-desktop"))
    assert 1 <= phone < desk == MAX_SUGGESTED_PARALLEL
    p = plan(mistral, load_profile("galaxy-s25-ultra"))
    assert p.parallel_suggested == phone == p.to_dict()["parallel_suggested"]
    # a --memory budget shrinks it
    tight = suggest_parallel(
        mistral, load_profile("rtx-4090-desktop"), Budgets(memory_bytes=9 * 10**9)
    )
    assert 1 <= tight < desk
    # nothing fits: 0
    folder = tmp_path / "llama-70b"
    shutil.copytree(CONFIGS / "llama-3.1-70b", folder)
    assert suggest_parallel(inspect_model(folder), load_profile("galaxy-s25-ultra")) == 0


def test_suggest_parallel_is_one_when_a_second_cache_does_not_fit(mistral: ModelSpec) -> None:
    desk = load_profile("rtx-4090-desktop")
    pick = plan(mistral, desk).choice
    assert pick is not None
    budget = pick.prediction.memory_bytes + pick.prediction.kv_cache_bytes // 2
    tight = plan(mistral, desk, Budgets(memory_bytes=budget))
    assert tight.choice is not None and tight.choice.format == pick.format
    assert tight.parallel_suggested == 1
    assert suggest_parallel(mistral, desk, Budgets(memory_bytes=budget)) == 1
    # exactly two caches (and a row of logits) more: three
    three = pick.prediction.memory_bytes + 2 * (
        pick.prediction.kv_cache_bytes + stream_runtime_bytes(mistral)
    )
    assert suggest_parallel(mistral, desk, Budgets(memory_bytes=three)) == 3


# --- the CLI ------------------------------------------------------------------------------


def test_cli_plan_parallel_json_and_table(default_gguf: Path) -> None:
    runner = CliRunner()
    out = runner.invoke(main, ["plan", "-d", "galaxy-s25-ultra", "--parallel", "4", "--json"])
    assert out.exit_code == 0, out.output
    data = json.loads(out.output)
    assert data["parallel"] == 4 and data["budgets"]["parallel"] == 4
    assert isinstance(data["parallel_suggested"], int) and data["parallel_suggested"] >= 4
    pred = data["choice"]["prediction"]
    assert pred["parallel"] == 4
    assert pred["decode_tok_s_aggregate"] > pred["decode_tok_s"] > pred["decode_tok_s_per_stream"]
    assert pred["decode_tok_s_per_stream"] == pytest.approx(pred["decode_tok_s_aggregate"] / 4)
    assert {"decode_tok_s_aggregate_full", "decode_ceiling_tok_s", "parallel_why"} <= set(pred)
    assert data["choice"]["parallel_suggested"] == data["parallel_suggested"]
    single = json.loads(runner.invoke(main, ["plan", "-d", "galaxy-s25-ultra", "--json"]).output)
    assert single["parallel"] == 1 and single["parallel_suggested"] == data["parallel_suggested"]
    assert pred["memory_bytes"] > single["choice"]["prediction"]["memory_bytes"]
    table = runner.invoke(main, ["plan", "-d", "galaxy-s25-ultra", "--parallel", "4"])
    assert table.exit_code == 0, table.output
    text = " ".join(table.output.split())  # as the terminal wrapped it
    assert "KV f16, 4 streams" in text and " each all " in text
    assert f"edgekit serve --parallel {data['parallel_suggested']}" in text
    bad = runner.invoke(main, ["plan", "-d", "galaxy-s25-ultra", "--parallel", "65"])
    assert bad.exit_code == 2 and "65" in bad.output


# --- load's admission ---------------------------------------------------------------------


def test_admission_counts_every_stream(default_gguf: Path) -> None:
    spec = inspect_model(default_gguf)
    args: dict[str, Any] = {"context": 2048, "kv_cache": "f16", "unit_kind": "cpu"}
    two = load_fit(spec, LLAMACPP, "Q4_1", available_bytes=1 << 40, parallel=2, **args)
    one = load_fit(spec, LLAMACPP, "Q4_1", available_bytes=1 << 40, **args)
    kv = kv_cache_bytes(spec, 2048, "f16", layout=LLAMACPP.kv_cache)
    assert two.memory_bytes - one.memory_bytes == kv + stream_runtime_bytes(spec)
    three = load_fit(spec, LLAMACPP, "Q4_1", available_bytes=two.memory_bytes, parallel=3, **args)
    assert not three.fits and "at ctx 2048 x 3 streams" in three.why
    assert load_fit(
        spec, LLAMACPP, "Q4_1", available_bytes=two.memory_bytes, parallel=2, **args
    ).fits
    streams = load_streams(spec, LLAMACPP, "Q4_1", available_bytes=two.memory_bytes, most=8, **args)
    assert streams == 2
    assert load_streams(spec, LLAMACPP, "Q4_1", available_bytes=1, most=8, **args) == 0


@pytest.fixture
def parallel_bundle(
    tmp_path: Path, default_gguf: Path, monkeypatch: pytest.MonkeyPatch
) -> tuple[Path, list[dict[str, Any]]]:
    """A bundle of the default model whose llama.cpp target takes ``parallel`` (as its
    batched runtime will) and records what it was asked to load instead of loading."""
    from edgekit.targets.registry import all_targets

    model = tmp_path / "src" / "model.gguf"
    model.parent.mkdir()
    shutil.copyfile(default_gguf, model)

    def gguf_only(manifest: dict[str, Any]) -> None:  # (its OpenVINO variant is a stub)
        manifest["variants"] = [v for v in manifest["variants"] if v["target"] == "llamacpp"]

    root = make_bundle(tmp_path / "b", model=model, edit=gguf_only)
    asked: list[dict[str, Any]] = []

    def record(cls: Any, /, path: Path, **settings: Any) -> Any:
        asked.append(settings)
        return FakeTarget().load(path, **settings)

    for target in all_targets():
        monkeypatch.setattr(target, "load", classmethod(record))
    monkeypatch.setattr(LLAMACPP, "load_settings", (*LLAMACPP.load_settings, "parallel"))
    return root, asked


def _available(monkeypatch: pytest.MonkeyPatch, free: int) -> None:
    import psutil

    real = psutil.virtual_memory()
    monkeypatch.setattr(psutil, "virtual_memory", lambda: real._replace(available=free))


def test_load_refuses_streams_that_do_not_fit(
    parallel_bundle: tuple[Path, list[dict[str, Any]]], monkeypatch: pytest.MonkeyPatch
) -> None:
    import edgekit
    from edgekit.bundle_choose import variant_fit
    from edgekit.bundle_open import open_bundle
    from edgekit.runtime import suggest_parallel as load_suggestion

    root, asked = parallel_bundle
    opened = open_bundle(root)
    variant = opened.manifest.variant("gguf-q4_k_m")
    need = variant_fit(opened, variant, available_bytes=1 << 40, parallel=2).memory_bytes
    _available(monkeypatch, need)
    edgekit.load(root, variant="gguf-q4_k_m", parallel=2)
    assert asked[-1]["parallel"] == 2
    assert load_suggestion(root, "gguf-q4_k_m") == 2
    with pytest.raises(InsufficientMemoryError) as info:
        edgekit.load(root, variant="gguf-q4_k_m", parallel=3)
    assert "for 3 streams" in info.value.message and "parallel=2 would fit" in str(info.value.hint)
    assert len(asked) == 1  # refused before loading
    edgekit.load(root, variant="gguf-q4_k_m", parallel=3, force=True)
    assert asked[-1]["parallel"] == 3
    _available(monkeypatch, 1 << 40)
    assert load_suggestion(root, "gguf-q4_k_m") == MAX_SUGGESTED_PARALLEL


@pytest.mark.parametrize(
    ("bad", "words"), [(0, "out of range"), (65, "more than"), ("2", "integer"), (True, "integer")]
)
def test_load_checks_parallel(
    parallel_bundle: tuple[Path, list[dict[str, Any]]], bad: Any, words: str
) -> None:
    import edgekit

    root, asked = parallel_bundle
    with pytest.raises(SettingError, match=words) as info:
        edgekit.load(root, variant="gguf-q4_k_m", parallel=bad)
    assert info.value.hint and asked == []


def test_a_plan_and_a_load_agree_on_streams(
    parallel_bundle: tuple[Path, list[dict[str, Any]]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """One predictor: with the host's free memory at a plan's limit, the plan's streams
    for the variant's own file (the default model's Q4_1 "as it is") are what load
    admits."""
    from edgekit.bundle_choose import variant_parallel
    from edgekit.bundle_open import open_bundle

    root, _ = parallel_bundle
    opened = open_bundle(root)
    variant = opened.manifest.variant("gguf-q4_k_m")
    spec = inspect_model(opened.variant_path(variant))
    fit = load_fit(
        spec,
        LLAMACPP,
        "Q4_1",
        context=256,
        kv_cache="f16",
        available_bytes=1 << 40,
        unit_kind="cpu",
        parallel=5,
    )
    assert variant_parallel(opened, variant, available_bytes=fit.memory_bytes) == 5
    profile = load_profile("x86-laptop-no-gpu")
    profile = replace(
        profile,
        memory=replace(profile.memory, usable_gib=fit.memory_bytes / (1 << 30)),
        accelerators=tuple(a for a in profile.accelerators if a.kind == "cpu"),
        targets=("llamacpp",),
    )
    planned = plan(spec, profile, Budgets(context=256))
    c = _find(planned, "llamacpp", "Q4_1")
    assert c.prediction.weights_bytes == LLAMACPP.format.built_layout(spec, "Q4_1").total_bytes
    assert c.parallel_suggested == 5
