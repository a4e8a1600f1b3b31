"""Expected quality loss per format: a table measured on a real model, refined locally.

The loss is the mean KL divergence (nats per token) of a format's next-token distributions
from the source model's, by edgekit's method (docs/accuracy.md). The built-in table was
measured on SmolLM2-135M (benchmarks/quality_table.py); every ``edgekit eval`` run stores
its measurement in a small local file, which then takes precedence for that target and
format. The planner reads ``expected_kl``.
"""

from __future__ import annotations

import json
from pathlib import Path

from edgekit.cache import cache_root

# (target, format) -> mean KL vs the source, SmolLM2-135M, 8 x 512-token windows of the
# shipped text (benchmarks/quality_table.py; the reference is the float32 export).
MEASURED_KL: dict[tuple[str, str], float] = {
    ("llamacpp", "Q8_0"): 0.00357,
    ("llamacpp", "Q6_K"): 0.00836,
    ("llamacpp", "Q5_K_M"): 0.06512,
    ("llamacpp", "Q5_K_S"): 0.07473,
    ("llamacpp", "Q4_K_M"): 0.0449,
    ("llamacpp", "Q4_K_S"): 0.05081,
    ("llamacpp", "Q4_0"): 0.24878,
    ("llamacpp", "IQ4_NL"): 0.16704,
    ("llamacpp", "Q3_K_M"): 0.11113,
    ("llamacpp", "Q2_K"): 0.34359,
    ("openvino", "INT8"): 0.00544,
    ("openvino", "INT4"): 0.30513,
    ("openvino", "INT4_SYM"): 0.69138,
}


def calibration_file() -> Path:
    return cache_root() / "quality.json"


def _local() -> dict[str, float]:
    try:
        data = json.loads(calibration_file().read_text())
    except (OSError, json.JSONDecodeError):
        return {}
    return {k: float(v) for k, v in data.items()} if isinstance(data, dict) else {}


def record(target: str, fmt: str, kl_mean: float) -> None:
    """Remember a measurement (the latest one wins) for later estimates."""
    data = _local()
    data[f"{target}:{fmt}"] = kl_mean
    path = calibration_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True))
    tmp.replace(path)


def expected_kl(target: str, fmt: str) -> tuple[float | None, str]:
    """The expected mean KL of a format and where the figure comes from."""
    local = _local().get(f"{target}:{fmt}")
    if local is not None:
        return local, "measured here (edgekit eval)"
    table = MEASURED_KL.get((target, fmt))
    if table is not None:
        return table, "table (SmolLM2-135M)"
    return None, "unknown"


def next_larger_meeting(
    target: str, formats: list[tuple[str, float]], fmt: str, max_kl: float
) -> str | None:
    """Among ``formats`` (name, bits per weight), the smallest one larger than ``fmt``
    whose expected KL is within ``max_kl``."""
    sizes = dict(formats)
    for name, bits in sorted(formats, key=lambda f: f[1]):
        if bits <= sizes.get(fmt, 0):
            continue
        kl, _ = expected_kl(target, name)
        if kl is not None and kl <= max_kl:
            return name
    return None
