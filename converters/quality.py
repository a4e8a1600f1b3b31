"""Expected quality loss per format: a table measured on a real model, refined locally.

The loss is the mean KL divergence (nats per token) of a format's next-token distributions
from the source model's, by edgekit's method (docs/accuracy.md). The built-in table was
measured on SmolLM2-135M (benchmarks/quality_table.py); every ``edgekit eval`` run stores
its measurement in a small local file, which then takes precedence for that target and
format. The planner reads ``expected_kl``.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from edgekit.atomic import write_atomic
from edgekit.cache import cache_root
from edgekit.errors import SchemaError
from edgekit.safe_files import read_capped
from edgekit.untrusted import clean_text, parse_json

MAX_FILE_BYTES = 1 << 20  # (target, format) pairs: a few hundred bytes
_DELETE_IT = "delete it; the next `edgekit eval` writes a new one"

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
    """The local measurements ({"target:FORMAT": mean KL}); none when there is no file.

    Raises:
        SchemaError: the file is not such a table (the hint says to delete it).
    """
    path = calibration_file()
    try:
        raw = read_capped(path, max_bytes=MAX_FILE_BYTES, error=SchemaError, hint=_DELETE_IT)
    except FileNotFoundError:
        return {}
    data = parse_json(raw, where=str(path), max_bytes=MAX_FILE_BYTES, hint=_DELETE_IT)
    if not isinstance(data, dict):
        raise SchemaError(f"{path}: not a table of measurements", hint=_DELETE_IT)
    table: dict[str, float] = {}
    for key, value in data.items():
        if (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or not math.isfinite(value)
            or value < 0
        ):
            raise SchemaError(
                f"{path}: {clean_text(key)!r} is {clean_text(value)!r}, not a mean KL "
                "(a number of nats per token, zero or more)",
                hint=_DELETE_IT,
            )
        table[key] = float(value)
    return table


def record(target: str, fmt: str, kl_mean: float) -> None:
    """Remember a measurement (the latest one wins) for later estimates."""
    data = _local()
    data[f"{target}:{fmt}"] = kl_mean
    write_atomic(calibration_file(), json.dumps(data, indent=2, sort_keys=True))


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
