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
Each size is benchmarked in three loads (round-robin over the sizes, one thread) and the
median one used; the tolerance (DECODE_TOLERANCE) covers the model's error and what is
left of this 2-core VM's load-to-load spread: the same benchmark varies by more than 20% between loads (the tiny
model, llama.cpp Q8_0, 512 tokens, EOS ignored, one thread, four loads in one process:
10771, 5567, 9305, 10363 tok/s; SmolLM2 Q4_K_M, five loads: 94, 110, 109, 107, 105; mid
model in fresh processes: 2004, 2048, 1495), and a held-out prediction rests on two
such measurements besides the one it is compared with.
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

BENCH = ["--prompt-lengths", "128,512", "--gen-tokens", "64", "--repeats", "2", "--json"]


@pytest.fixture(scope="module")
def bundles(tmp_path_factory: pytest.TempPathFactory, default_gguf: Path) -> list[tuple[Path, str]]:
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
    smol = root / "smollm2"
    pack(
        default_gguf,
        smol,
        [VariantRequest(quant="Q4_K_M"), VariantRequest(target="openvino", quant="INT4")],
    )
    out += [(smol, "gguf-q4_k_m"), (smol, "openvino-int4")]
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


# Largest error of a decode prediction for a model size the calibration has not seen.
# Measured here, one thread, while other test runs shared the 2 cores: llama.cpp +13% /
# -13% (mid / SmolLM2), and +49% / -37% in a busier hour; OpenVINO +16% / -19% and
# +39% / -35% (the fit by size has no per-layer term with two samples: mid has 8 layers,
# the tiny model 2, SmolLM2 30). A broken fit misses by several times (+200% to +700%
# where two spin-waiting threads skewed the samples).
DECODE_TOLERANCE = 0.5
HELD_OUT = ("mid", "smollm2")  # interpolated, extrapolated (see the module docstring)
LOADS = 3  # benchmarks per variant, each in a new load; the median one is used


@pytest.mark.timeout(1800)  # LOADS benchmarks of six variants (and the packing, if first)
def test_calibration_predicts_decode_of_held_out_sizes(
    bundles: list[tuple[Path, str]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Per (target, unit), the decode fitted to two model sizes predicts the third within
    DECODE_TOLERANCE of what it measured (the third's own sample is left out of the fit)."""
    from edgekit.converters.planner.calibration import check_against_bench, record_bench

    from edgekit.bench import bench
    from edgekit.probe import probe_host

    monkeypatch.setenv("EDGEKIT_CACHE", str(tmp_path / "cache"))
    profile = probe_host(measure=True).profile
    # LOADS rounds over every variant (a load each), so that whatever else this machine
    # runs meanwhile weighs on every size alike; each variant keeps its median load: one
    # load's figure varies by more than 20% from the next (see the module docstring).
    # One thread: on a shared 2-core VM llama.cpp's threads spin-wait for each other, and
    # the second thread's share of the machine decides decode more than the model does
    # (measured here under load, the tiny model: 292-424 tok/s with two threads, 5537-6354
    # with one).
    loads: dict[tuple[Path, str], list[Any]] = {b: [] for b in bundles}
    for _ in range(LOADS):
        for bundle, variant in bundles:
            loads[(bundle, variant)].append(
                bench(bundle, variant=variant, threads=(1,), prompt_lengths=(128,), gen_tokens=256)
            )
    results = []
    for (bundle, variant), runs in loads.items():
        result = sorted(runs, key=lambda r: r.runs[0].decode.tok_s.median)[LOADS // 2]
        record_bench(result, profile, **_benchmarked(bundle, variant))
        results.append((bundle, variant, result))
    rows = []
    for bundle, variant, result in results:
        if bundle.name not in HELD_OUT:
            continue
        check = check_against_bench(
            result, profile, leave_out=True, **_benchmarked(bundle, variant)
        )
        # fitted without this size: the other two sizes of the same target and unit
        assert check.basis == "calibrated" and check.samples_used == 2
        rows.append((f"{bundle.name}/{variant}", check.decode_error))
    assert len(rows) == 2 * len(HELD_OUT)  # both targets
    report = "\n".join(f"{n}: held-out decode {d:+.1%}" for n, d in rows)  # type: ignore[str-format]
    print(report)  # shown with -s or -rA: the figures docs/planner.md quotes
    for _name, decode_error in rows:
        assert decode_error is not None and abs(decode_error) <= DECODE_TOLERANCE, report
