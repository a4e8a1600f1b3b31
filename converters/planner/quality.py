"""Expected quality loss per format: the format packages' figures, refined locally.

The loss is the mean KL divergence (nats per token) of a format's next-token distributions
from the source model's, by edgekit's method (docs/accuracy.md). Each format package
states its quantizations' expected loss (``Format.quants[...].expected_kl``, measured on
SmolLM2-135M by benchmarks/quality_table.py, or taken from the closest measured format);
every ``edgekit eval`` run stores its measurement in a small local file, which then takes
precedence for that target and format. The planner reads ``expected_kl``.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from edgekit.targets.registry import all_targets

from edgekit.atomic import write_atomic
from edgekit.cache import cache_root
from edgekit.errors import SchemaError
from edgekit.safe_files import read_capped
from edgekit.untrusted import clean_text, parse_json

MAX_FILE_BYTES = 1 << 20  # (target, format) pairs: a few hundred bytes
_DELETE_IT = "delete it; the next `edgekit eval` writes a new one"
LOCAL_SOURCE = "measured here (edgekit eval)"


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
    """The expected mean KL of ``target``'s format ``fmt`` and where the figure comes from:
    a local measurement, else the format package's figure (None, "unknown": neither)."""
    local = _local().get(f"{target}:{fmt}")
    if local is not None:
        return local, LOCAL_SOURCE
    found = next((t for t in all_targets() if t.name == target), None)
    quant = found.format.quant(fmt) if found is not None else None
    if quant is None or quant.expected_kl is None:
        return None, "unknown"
    return quant.expected_kl, quant.kl_source


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
