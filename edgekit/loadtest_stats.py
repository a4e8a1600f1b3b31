"""What ``edgekit loadtest`` reports: percentiles of the per-request times, each level's
throughput and errors, and the whole run as JSON (docs/serving.md has the schema).

Percentiles interpolate linearly between the two nearest ranks (numpy's default, and
``statistics.quantiles(..., method="inclusive")``): p50 of [1, 2, 3, 4] is 2.5.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal

from edgekit.loadtest_client import RequestRecord

SCHEMA_VERSION = 1
Mode = Literal["concurrency", "rate"]


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0-100) of ``values`` (not empty), interpolated linearly."""
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


@dataclass(frozen=True, kw_only=True)
class Spread:
    """How a time is spread over the requests (seconds; None: nothing measured)."""

    n: int
    mean: float | None
    p50: float | None
    p95: float | None
    p99: float | None
    max: float | None

    @classmethod
    def of(cls, values: Sequence[float]) -> Spread:
        if not values:
            return cls(n=0, mean=None, p50=None, p95=None, p99=None, max=None)
        return cls(
            n=len(values),
            mean=sum(values) / len(values),
            p50=percentile(values, 50),
            p95=percentile(values, 95),
            p99=percentile(values, 99),
            max=max(values),
        )


@dataclass(frozen=True, kw_only=True)
class Energy:
    """Energy per token from the server's own ``/metrics`` (edgekit's), over one level."""

    sensor: str  # rapl, nvml, ..., or "estimated": an estimate, not a measurement
    measured: bool
    joules: float  # drawn while generations were in flight
    tokens: int  # generated in that time, as the server counted them
    joules_per_token: float | None
    watts: float | None  # the average over the level


@dataclass(frozen=True, kw_only=True)
class LevelResult:
    """One level of the sweep: a number of clients, or an arrival rate."""

    mode: Mode
    value: float  # clients, or requests a second
    requests: int
    ok: int
    errors: int
    duration_s: float  # from the first request sent to the last one's end
    requests_per_s: float  # completed requests a second
    output_tokens_per_s: float  # all clients together
    prompt_tokens_mean: float | None  # as the server counted them (None: it did not say)
    output_tokens_mean: float | None
    ttft_s: Spread
    itl_s: Spread  # every gap between two events with text, all requests pooled
    tpot_s: Spread  # per request: (end-to-end - TTFT) / (output tokens - 1)
    e2e_s: Spread
    error_kinds: dict[str, int]
    energy: Energy | None
    records: tuple[RequestRecord, ...]

    def label(self) -> str:
        if self.mode == "rate":
            return f"{self.value:g}/s"
        return f"{self.value:g} client" + ("" if self.value == 1 else "s")

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["records"] = [_record(r) for r in self.records]
        return data


def _record(r: RequestRecord) -> dict[str, Any]:
    data = asdict(r)
    data["itl_s"] = list(r.itl_s)
    data["tpot_s"] = r.tpot_s
    return data


def summarize(
    mode: Mode,
    value: float,
    records: Sequence[RequestRecord],
    duration_s: float,
    energy: Energy | None = None,
) -> LevelResult:
    ok = [r for r in records if r.ok]
    span = max(duration_s, 1e-9)
    prompts = [r.prompt_tokens for r in ok if r.prompt_tokens is not None]
    return LevelResult(
        mode=mode,
        value=value,
        requests=len(records),
        ok=len(ok),
        errors=len(records) - len(ok),
        duration_s=duration_s,
        requests_per_s=len(ok) / span,
        output_tokens_per_s=sum(r.output_tokens for r in ok) / span,
        prompt_tokens_mean=sum(prompts) / len(prompts) if prompts else None,
        output_tokens_mean=sum(r.output_tokens for r in ok) / len(ok) if ok else None,
        ttft_s=Spread.of([r.ttft_s for r in ok if r.ttft_s is not None]),
        itl_s=Spread.of([gap for r in ok for gap in r.itl_s]),
        tpot_s=Spread.of([t for r in ok if (t := r.tpot_s) is not None]),
        e2e_s=Spread.of([r.e2e_s for r in ok]),
        error_kinds=dict(Counter(_kind(r.error) for r in records if r.error is not None)),
        energy=energy,
        records=tuple(records),
    )


def _kind(error: str) -> str:
    """An error's kind: its text up to the first colon ("HTTP 503", "ConnectionRefusedError")."""
    return error.partition(":")[0][:60]


@dataclass(frozen=True, kw_only=True)
class LoadTestResult:
    """A whole run: what was asked, then each level."""

    created: str
    edgekit_version: str
    url: str
    endpoint: str
    model: str
    prompt_tokens: int  # asked for (words: see prompt_note)
    prompt_note: str
    max_tokens: int
    arrival: str  # for rate levels: "poisson" or "fixed"
    requests_per_level: int
    duration_s: float  # the bound on each level
    levels: tuple[LevelResult, ...]

    def to_dict(self) -> dict[str, Any]:
        data = {k: v for k, v in asdict(self).items() if k != "levels"}
        return {
            "schema_version": SCHEMA_VERSION,
            **data,
            "levels": [level.to_dict() for level in self.levels],
        }
