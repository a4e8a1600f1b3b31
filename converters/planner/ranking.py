"""How candidates are ranked, and the plan's one-line account of its pick.

Among the candidates that meet every budget: the best quality tier first (mean KL against
the source: near lossless <= 0.01, small <= 0.05, moderate <= 0.15, large); within a
tier, from an already-quantized source, those that do not requantize it up (more bits
recover nothing of what its quantization lost); then candidates edgekit can build before
those it can only predict; then the fastest decode. When nothing fits, the plan names the
smallest option and how far it misses.

``describe`` and ``summary`` are part of the plan itself (``Plan.summary``, shown by
``--json`` and quoted by errors), not of its rendering.
"""

from __future__ import annotations

from edgekit.converters.planner.values import Candidate

from edgekit.devices import GIB

TIERS = ((0.01, "near lossless"), (0.05, "small loss"), (0.15, "moderate loss"))
_ORDER = [n for _, n in TIERS] + ["large loss", "unknown"]


def tier(kl: float | None) -> str:
    if kl is None:
        return "unknown"
    for limit, name in TIERS:
        if kl <= limit:
            return name
    return "large loss"


def rank(c: Candidate) -> tuple[int, int, int, float]:
    """Quality tier, then (from a quantized source) the candidates that do not spend bits
    the source does not have, then buildable, then decode speed (of all streams together
    when the plan decodes several)."""
    p = c.prediction
    speed = p.decode_tok_s if p.parallel == 1 else p.decode_tok_s_aggregate
    return (
        _ORDER.index(c.quality_tier),
        1 if c.requantizes_up else 0,
        0 if c.buildable else 1,
        -(speed or 0),
    )


def shortfall(c: Candidate) -> tuple[int, int]:
    """How far a rejected candidate misses: memory first (the hard limit), then count."""
    over = max(c.prediction.memory_bytes - c.memory_limit_bytes, 0)
    return over, len(c.rejections)


def describe(c: Candidate) -> str:
    """One line: what it costs and what it gives."""
    p = c.prediction
    parts = [f"{p.memory_bytes / GIB:.2f} GiB of {c.memory_limit_bytes / GIB:.2f} GiB"]
    if p.decode_tok_s:
        parts.append(f"~{p.decode_tok_s:.1f} tok/s decode")
    if p.parallel > 1 and p.decode_tok_s_aggregate and p.decode_tok_s_per_stream:
        parts.append(
            f"~{p.decode_tok_s_aggregate:.1f} tok/s over {p.parallel} streams "
            f"(~{p.decode_tok_s_per_stream:.1f} each, first estimate)"
        )
    if p.prefill_tok_s:
        parts.append(f"~{p.prefill_tok_s:.0f} tok/s prefill")
    if p.watts:
        parts.append(f"~{p.watts:g} W")
    if p.joules_per_token:
        parts.append(f"~{p.joules_per_token:.2f} J/token")
    loss = (
        "quality loss unknown"
        if c.quality_loss is None
        else f"{c.quality_tier} (KL {c.quality_loss:.3f})"
    )
    parts.append(loss)
    if c.quality_note:
        parts.append(c.quality_note)
    return f"{c.label}: " + ", ".join(parts) + f" [{p.basis}]"


def summary(choice: Candidate | None, best: Candidate | None, closest: Candidate | None) -> str:
    if choice is not None:
        text = "pick " + describe(choice)
        if best is not None and best is not choice:
            text += (
                f". {best.label} ranks higher ({best.quality_tier}, "
                f"~{best.prediction.decode_tok_s or 0:.1f} tok/s) but {best.build_note}"
            )
        return text
    if best is not None:
        return f"only {best.label} fits, and {best.build_note}"
    near = closest
    if near is None:
        return "no candidate"
    over = near.prediction.memory_bytes - near.memory_limit_bytes
    miss = (
        f"needs {near.prediction.memory_bytes / GIB:.2f} GiB, {over / GIB:.2f} GiB more "
        f"than the {near.memory_limit_bytes / GIB:.2f} GiB available"
        if over > 0
        else "; ".join(near.rejections)
    )
    return f"nothing fits. The smallest option, {near.label}, {miss}"
