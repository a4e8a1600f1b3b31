"""What ``edgekit plan`` and the TUI's Plan tab share: reading budgets typed as text, and
a candidate as table cells."""

from __future__ import annotations

import re

from edgekit.converters.planner import Candidate
from edgekit.devices import GIB
from edgekit.errors import PlanError

# Table columns both `edgekit plan` and the TUI's Plan tab show (each adds one of its own).
COLUMNS = ("", "target", "unit", "format", "GiB", "decode", "prefill", "W", "J/tok", "KL")
TEXT_COLUMNS = ("", "target", "unit", "format")

_SIZE_UNITS = {"": 1e9, "b": 1, "kb": 1e3, "mb": 1e6, "gb": 1e9, "tb": 1e12}
_SIZE_UNITS.update({"kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40})


def candidate_cells(c: Candidate, choice: Candidate | None) -> tuple[str, ...]:
    """``c`` as the cells of COLUMNS: "*" marks the pick, "~" a prediction-only target."""
    p = c.prediction
    return (
        "*" if c is choice else ("~" if not c.buildable else ""),
        c.target,
        c.unit,
        c.format,
        f"{p.memory_bytes / GIB:.2f}",
        f"{p.decode_tok_s:.1f}" if p.decode_tok_s else "-",
        f"{p.prefill_tok_s:.0f}" if p.prefill_tok_s else "-",
        f"{p.watts:g}" if p.watts else "-",
        f"{p.joules_per_token:.2f}" if p.joules_per_token else "-",
        f"{c.quality_loss:.3f}" if c.quality_loss is not None else "?",
    )


# With several streams (``Budgets.parallel``) "decode" is what each stream gets and "all"
# what they make together; both are first estimates.
PARALLEL_COLUMNS = tuple(
    x for column in COLUMNS for x in (("each", "all") if column == "decode" else (column,))
)


def parallel_cells(c: Candidate, choice: Candidate | None) -> tuple[str, ...]:
    """``c`` as the cells of PARALLEL_COLUMNS."""
    p = c.prediction
    cells = candidate_cells(c, choice)
    at = COLUMNS.index("decode")
    each = f"{p.decode_tok_s_per_stream:.1f}" if p.decode_tok_s_per_stream else "-"
    together = p.decode_tok_s_aggregate
    total = "-" if not together else f"{together:.0f}" if together >= 100 else f"{together:.1f}"
    return (*cells[:at], each, total, *cells[at + 1 :])


def parse_size(text: str) -> int:
    """ "6GB", "6 GiB", "512MB", "6" (GB) -> bytes.

    Raises:
        PlanError: not a size.
    """
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", text)
    unit = m.group(2).lower() if m else ""
    if m is None or unit not in _SIZE_UNITS or float(m.group(1)) <= 0:
        raise PlanError(f"{text!r} is not a memory size", hint="write it like 6GB, 6GiB or 512MB")
    return int(float(m.group(1)) * _SIZE_UNITS[unit])


def parse_watts(text: str) -> float:
    """ "10W", "10", "7.5 W" -> watts.

    Raises:
        PlanError: not a power.
    """
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*[wW]?\s*", text)
    if m is None or float(m.group(1)) <= 0:
        raise PlanError(f"{text!r} is not a power budget", hint="write it like 10W")
    return float(m.group(1))
