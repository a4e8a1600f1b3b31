"""Predictions against measurements on this machine, after calibration: for the embedded
default model and for tiny models, on every runnable target (llama.cpp, OpenVINO).

Round 1 benchmarks every variant and feeds the calibration (as `edgekit bench` does);
round 2 measures again and is compared with the calibrated prediction: peak memory within
10%. Benchmarks run as `edgekit bench` subprocesses so each has a clean process (memory is
measured above the pre-load baseline).

Decode is tested on sizes the calibration has not seen: per (target, unit), the fit on
two of the three model sizes predicts the third. The sizes held out are the mid model
(interpolated between the tiny model and SmolLM2) and SmolLM2 (extrapolated beyond the
two smaller ones, where decode is bandwidth-bound). The tiny model is not held out:
below the smallest size nothing pins the fixed cost per token, which dominates there.
That test replays benchmarks recorded on this VM (tests/data/planner_held_out.json,
written by benchmarks/planner_held_out.py: each size in three loads, round-robin, one
thread, the median load used) through the current fitting code, so it judges the fit,
not this hour's load: the same live benchmark varies by more than 20% between loads on a
shared 2-core VM (the tiny model, llama.cpp Q8_0, 512 tokens, EOS ignored, one thread,
four loads in one process: 10771, 5567, 9305, 10363 tok/s; SmolLM2 Q4_K_M, five loads:
94, 110, 109, 107, 105), and a held-out prediction rests on two such measurements
besides the one it is compared with; under another test run's load one live figure
missed by +70%. The benchmark script measures it live and prints the same errors.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import require

# The memory check's workload: peak memory is the 512-token prefill's (the KV cache
# counted is the whole context, or the longest prompt's: sample_from_bench), so a 128-token
# prompt and a long decode add seconds to each of the 12 benchmarks on the 2-core CI and
# nothing to the peak. Measured here on the same bundles, old workload (128,512 prompts,
# 64 tokens) -> this one, memory above baseline: tiny Q8_0 18.1 -> 18.2 MB, mid INT8
# 105.5 -> 101.7 MB, SmolLM2 Q4_K_M 257.2 -> 256.6 MB, INT4 354.2 -> 349.2 MB. 512 is
# also the prefill the calibration samples (the planner's PREFILL_TOKENS).
BENCH = ["--prompt-lengths", "512", "--gen-tokens", "16", "--repeats", "2", "--json"]


@pytest.fixture(scope="module")
def bundles(
    tmp_path_factory: pytest.TempPathFactory, smollm2_bundle: Path
) -> list[tuple[Path, str]]:
    require("torch", "the tiny models are built with torch")
    require("llama_cpp", "the llama.cpp target")
    require("optimum.intel", "the OpenVINO export")
    from edgekit.bundle import VariantRequest, pack
    from tests.tiny_models import build_tiny_model

    root = tmp_path_factory.mktemp("accuracy")
    out: list[tuple[Path, str]] = []
    for name, kw in (
        ("tiny", {"hidden": 64, "vocab_size": 512}),
        ("mid", {"hidden": 256, "vocab_size": 4096, "layers": 8}),
    ):
        hf = build_tiny_model("llama", root / f"{name}-hf", **kw)  # type: ignore[arg-type]
        b = root / name
        pack(hf, b, [VariantRequest(quant="Q8_0"), VariantRequest(target="openvino", quant="INT8")])
        out += [(b, "gguf-q8_0"), (b, "openvino-int8")]
    out += [(smollm2_bundle, "gguf-q4_k_m"), (smollm2_bundle, "openvino-int4")]
    return out


def _bench(bundle: Path, variant: str, cache: Path, *extra: str) -> dict[str, object]:
    env = {**os.environ, "EDGEKIT_CACHE": str(cache)}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "edgekit",
            "bench",
            str(bundle),
            "--variant",
            variant,
            *BENCH,
            *extra,
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    data: dict[str, object] = json.loads(done.stdout)
    return data


def _benchmarked(bundle: Path, variant: str) -> dict[str, Any]:
    """What the calibration needs of a benchmarked variant besides the result: its
    inspected spec and KV-cache type (the planner does not open bundles)."""
    from edgekit.bundle_open import open_bundle
    from edgekit.inspection import inspect_model

    opened = open_bundle(bundle)
    v = opened.manifest.variant(variant)
    return {"spec": inspect_model(opened.variant_path(v)), "kv_cache": v.runtime.kv_cache}


def test_calibrated_memory_predictions_hold_up(
    bundles: list[tuple[Path, str]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from edgekit.converters.planner.calibration import check_against_bench

    from edgekit.bench_results import load_result
    from edgekit.probe import probe_host

    cache = tmp_path / "cache"
    for bundle, variant in bundles:  # round 1: calibrate
        _bench(bundle, variant, cache)
    monkeypatch.setenv("EDGEKIT_CACHE", str(cache))
    profile = probe_host(measure=True).profile
    rows = []
    for bundle, variant in bundles:  # round 2: fresh measurements, not recorded
        data = _bench(bundle, variant, cache, "--no-calibrate")
        saved = tmp_path / f"{bundle.name}-{variant}.json"
        saved.write_text(json.dumps(data))
        check = check_against_bench(
            load_result(saved), profile, leave_out=False, **_benchmarked(bundle, variant)
        )
        assert check.basis == "calibrated"
        rows.append((f"{bundle.name}/{variant}", check.memory_error, check.decode_error))
    report = "\n".join(f"{n}: memory {m:+.1%}, decode {d:+.1%}" for n, m, d in rows)  # type: ignore[str-format]
    for _name, memory_error, decode_error in rows:
        assert memory_error is not None and abs(memory_error) <= 0.10, report
        assert decode_error is not None  # predicted: reported, bounded in the test below


# Largest error of a decode prediction for a model size the calibration has not seen, on
# the recorded benchmarks of tests/data/planner_held_out.json (their figures: see
# docs/planner.md). Earlier live runs on this VM, other test runs sharing its 2 cores:
# llama.cpp +13% / -13% (mid / SmolLM2), +49% / -37% in a busier hour; OpenVINO +16% / -19%
# and +39% / -35%. A broken fit misses by several times (+200% to +700% where two
# spin-waiting threads skewed the samples), which is what this bound is there to catch.
DECODE_TOLERANCE = 0.5
SIZES = {"tiny", "mid", "smollm2"}
HELD_OUT = ("mid", "smollm2")  # interpolated, extrapolated (see the module docstring)
RECORDED = Path(__file__).parent / "data" / "planner_held_out.json"


def _median_load(variant: dict[str, Any]) -> Any:
    """The benchmark with the median decode time among a variant's loads."""
    from edgekit.converters.planner.fitting import Sample

    loads = sorted(variant["loads"], key=lambda s: s["decode_s_per_token"])
    return Sample(**loads[len(loads) // 2])


def test_calibration_predicts_decode_of_held_out_sizes() -> None:
    """Per (target, unit), the decode fitted to two model sizes predicts the third within
    DECODE_TOLERANCE of what it measured, on benchmarks recorded on this VM by
    benchmarks/planner_held_out.py (which measures it live; re-record with ``--out``)."""
    from edgekit.converters.planner.calibration import predict_decode
    from edgekit.targets.contract import Coefficients

    recorded = json.loads(RECORDED.read_text())
    variants = recorded["variants"]
    rows = []
    for v in variants:
        if v["size"] not in HELD_OUT:
            continue
        unit = (v["target"], v["unit"])
        fitted_on = [o for o in variants if (o["target"], o["unit"]) == unit and o is not v]
        # fitted without this size: the other two sizes of the same target and unit
        assert sorted(o["size"] for o in fitted_on) == sorted(SIZES - {v["size"]})
        own = _median_load(v)
        prior = Coefficients(**{**v["prior"], "decode_curve": ()})
        predicted = predict_decode(
            prior, [_median_load(o) for o in fitted_on], own, bandwidth_gbps=v["bandwidth_gbps"]
        )
        assert predicted is not None
        rows.append((f"{v['size']}/{v['variant']}", predicted * own.decode_s_per_token - 1))
    targets = {v["target"] for v in variants}
    assert len(targets) >= 2 and len(rows) == len(HELD_OUT) * len(targets)  # both targets
    report = "\n".join(f"{n}: held-out decode {d:+.1%}" for n, d in rows)
    for _name, decode_error in rows:
        assert abs(decode_error) <= DECODE_TOLERANCE, report


def test_held_out_check_can_fail() -> None:
    """The same replay with the fit's input broken (every fitted size's decode time
    cut to a third, as a skewed benchmark could record it) misses by more than the tolerance:
    the bound above tells a working calibration from a broken one."""
    from dataclasses import replace

    from edgekit.converters.planner.calibration import predict_decode
    from edgekit.targets.contract import Coefficients

    variants = json.loads(RECORDED.read_text())["variants"]
    misses = []
    for v in variants:
        if v["size"] != "smollm2":
            continue
        others = [
            replace(_median_load(o), decode_s_per_token=_median_load(o).decode_s_per_token / 3)
            for o in variants
            if (o["target"], o["unit"]) == (v["target"], v["unit"]) and o is not v
        ]
        own = _median_load(v)
        prior = Coefficients(**{**v["prior"], "decode_curve": ()})
        predicted = predict_decode(prior, others, own, bandwidth_gbps=v["bandwidth_gbps"])
        assert predicted is not None
        misses.append(predicted * own.decode_s_per_token - 1)
    assert misses and all(abs(m) > DECODE_TOLERANCE for m in misses), misses
