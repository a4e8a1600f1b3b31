"""`import edgekit` is fast and imports no runtime SDK, no torch and no textual."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

HEAVY = (
    "torch",
    "textual",
    "llama_cpp",
    "openvino",
    "openvino_genai",
    "onnxruntime",
    "onnxruntime_genai",
    "mlx",
    "mlx_lm",
    "transformers",
    "tensorrt",
    "numpy",
    "gguf",
)

PROBE = """
import json, sys, time
t0 = time.perf_counter()
import edgekit, edgekit.inspection, edgekit.devices, edgekit.probe, edgekit.targets.registry
elapsed = time.perf_counter() - t0
print(json.dumps({"elapsed": elapsed, "modules": sorted(sys.modules)}))
"""


@pytest.fixture(scope="module")
def imported() -> dict:
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def test_no_heavy_module_is_imported(imported: dict) -> None:
    loaded = {m.split(".")[0] for m in imported["modules"]}
    assert not loaded & set(HEAVY), sorted(loaded & set(HEAVY))


def test_import_is_fast(imported: dict) -> None:
    # Measured here at about 0.1 s (psutil, the edgekit modules); the bound leaves room for
    # a slow CI disk without hiding an accidental SDK import (each costs 0.3-3 s).
    assert imported["elapsed"] < 0.5


def test_cli_import_stays_light() -> None:
    code = "import sys, edgekit.cli; print(sorted(sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    loaded = {m.split(".")[0] for m in eval(out.stdout)}
    assert not loaded & set(HEAVY), sorted(loaded & set(HEAVY))
