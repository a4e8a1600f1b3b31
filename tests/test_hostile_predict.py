"""Hostile input to the predictions: damaged sliding-window metadata (config.json and
GGUF), and coefficients a calibration fit to odd measurements can produce.

Every damaged pattern is refused with a ModelFormatError that names the key (the
library and `edgekit plan`, exit code 1, no traceback, nothing written); a prediction
is never a negative, infinite or NaN rate: a finite number >= 0 or None."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from edgekit.converters.planner import Budgets, plan
from edgekit.converters.planner.memory import attention_layers
from edgekit.converters.planner.predict import predict, units_for
from edgekit.targets.contract import Coefficients
from edgekit.targets.registry import get_target

from edgekit.cli import main
from edgekit.devices import load_profile
from edgekit.errors import ModelFormatError
from edgekit.inspection import inspect_model
from tests.test_kv_window import GEMMA3_270M, gemma3_gguf

SLIDING, FULL = "sliding_attention", "full_attention"

# config.json changes -> the key the error must name
CONFIG_CASES: list[tuple[str, dict[str, Any], str]] = [
    ("layer_types too short", {"layer_types": [SLIDING] * 17}, "layer_types"),
    ("layer_types too long", {"layer_types": [SLIDING] * 19}, "layer_types"),
    ("layer_types empty", {"layer_types": []}, "layer_types"),
    ("layer_types a string", {"layer_types": "sliding_attention"}, "layer_types"),
    ("layer_types an object", {"layer_types": {"0": SLIDING}}, "layer_types"),
    ("layer_types of numbers", {"layer_types": [1] * 18}, "layer_types"),
    ("layer_types of booleans", {"layer_types": [True] * 18}, "layer_types"),
    ("layer_types with null", {"layer_types": [SLIDING] * 17 + [None]}, "layer_types"),
    ("unknown attention kind", {"layer_types": [SLIDING] * 17 + ["chunked"]}, "layer_types"),
    ("nested list entry", {"layer_types": [[SLIDING]] * 18}, "layer_types"),
    ("negative period", {"layer_types": None, "sliding_window_pattern": -6}, "pattern"),
    ("float period", {"layer_types": None, "sliding_window_pattern": 6.0}, "pattern"),
    ("string period", {"layer_types": None, "sliding_window_pattern": "6"}, "pattern"),
    ("boolean period", {"layer_types": None, "sliding_window_pattern": True}, "pattern"),
    ("list period", {"layer_types": None, "sliding_window_pattern": [6]}, "pattern"),
]


def _folder(root: Path, changes: dict[str, Any], *, nested: bool = False) -> Path:
    config = {k: v for k, v in {**GEMMA3_270M, **changes}.items() if v is not None}
    if nested:  # multimodal Gemma 3 keeps the language model's keys in text_config
        config = {"model_type": "gemma3", "architectures": ["X"], "text_config": config}
    folder = root / "model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def _snapshot(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root)): p.stat().st_size for p in root.rglob("*")}


@pytest.mark.parametrize("nested", [False, True], ids=["flat", "text_config"])
@pytest.mark.parametrize(("case", "changes", "key"), CONFIG_CASES, ids=[c[0] for c in CONFIG_CASES])
def test_damaged_config_pattern_is_refused(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    case: str,
    changes: dict[str, Any],
    key: str,
    nested: bool,
) -> None:
    monkeypatch.setenv("EDGEKIT_CACHE", str(tmp_path / "cache"))
    folder = _folder(tmp_path, changes, nested=nested)
    before = _snapshot(tmp_path)
    spec = inspect_model(folder)
    with pytest.raises(ModelFormatError, match=key) as info:
        plan(spec, load_profile("x86-laptop-no-gpu"))
    assert "malformed" in info.value.message and info.value.hint
    result = CliRunner().invoke(main, ["plan", str(folder), "-d", "x86-laptop-no-gpu"])
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output and key in result.output
    assert _snapshot(tmp_path) == before  # nothing written, nothing left behind


GGUF_CASES: list[tuple[str, Any]] = [
    ("a string", "6"),
    ("a float", 6.0),
    ("booleans of the wrong length", [True, False] * 4),
    ("an empty array", []),
    ("integers per layer", [1, 0, 1, 0, 1, 0]),
    ("strings per layer", [SLIDING] * 6),
]


@pytest.mark.parametrize(("case", "value"), GGUF_CASES, ids=[c[0] for c in GGUF_CASES])
def test_damaged_gguf_pattern_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, case: str, value: Any
) -> None:
    monkeypatch.setenv("EDGEKIT_CACHE", str(tmp_path / "cache"))
    path = gemma3_gguf(tmp_path / "g.gguf", **{"gemma3.attention.sliding_window_pattern": value})
    before = _snapshot(tmp_path)
    spec = inspect_model(path)
    with pytest.raises(ModelFormatError, match="sliding_window_pattern") as info:
        attention_layers(spec)
    assert "malformed" in info.value.message
    result = CliRunner().invoke(main, ["plan", str(path), "-d", "galaxy-s25-ultra"])
    assert result.exit_code == 1 and "Traceback" not in result.output, result.output
    assert _snapshot(tmp_path) == before


# Coefficients a fit can produce from odd samples (a negative intercept, an efficiency
# of zero): the rates must stay positive numbers or be absent, never negative or NaN.
LLAMACPP = get_target("llamacpp")
CPU = next(u.priors for u in LLAMACPP.units if u.kind == "cpu")
COEFFICIENT_CASES: list[tuple[str, Coefficients]] = [
    ("negative token overhead", replace(CPU, token_overhead_s=-1.0)),
    ("negative layer overhead", replace(CPU, layer_overhead_s=-1.0)),
    ("zero bandwidth efficiency", replace(CPU, bandwidth_efficiency=0.0)),
    ("negative bandwidth efficiency", replace(CPU, bandwidth_efficiency=-0.5)),
    ("zero compute efficiency", replace(CPU, compute_efficiency=0.0)),
    ("negative prefill overhead", replace(CPU, prefill_token_overhead_s=-1.0)),
    ("a decode curve through zero", replace(CPU, decode_curve=((0.0, 0.0), (1e12, 0.0)))),
    ("a decode curve below zero", replace(CPU, decode_curve=((0.0, -1.0), (1e6, -1.0)))),
]


@pytest.mark.parametrize(
    ("case", "coefficients"), COEFFICIENT_CASES, ids=[c[0] for c in COEFFICIENT_CASES]
)
@pytest.mark.parametrize("context", [1, 4096, 10**7])
def test_rates_are_never_negative_or_nan(
    default_gguf: Path, case: str, coefficients: Coefficients, context: int
) -> None:
    spec = inspect_model(default_gguf)
    profile = load_profile("x86-laptop-no-gpu")
    unit = units_for(profile, LLAMACPP, None)[0]
    for watts in (None, profile.power.idle_w, profile.power.idle_w / 2, 1e-9):
        p = predict(
            spec,
            LLAMACPP.format.layout(spec, "Q8_0"),
            LLAMACPP,
            unit,
            coefficients,
            profile,
            context=context,
            kv_type="f16",
            watts_cap=watts,
        )
        for name in ("decode_tok_s", "decode_tok_s_full", "prefill_tok_s", "joules_per_token"):
            value = getattr(p, name)
            assert value is None or (math.isfinite(value) and value >= 0), (name, value)
        assert p.memory_bytes > 0 and p.kv_cache_bytes > 0


def test_an_enormous_context_on_a_windowed_model_is_finite(tmp_path: Path) -> None:
    spec = inspect_model(_folder(tmp_path, {}))
    p = plan(spec, load_profile("rtx-4090-desktop"), Budgets(context=10**9))
    for c in p.candidates:
        assert c.prediction.kv_cache_bytes > 0 and not c.fits
        assert c.prediction.decode_tok_s is None or c.prediction.decode_tok_s > 0
