"""Refitting the first estimates to benchmark samples: decode, prefill and memory.

    decode    the measured (bytes read/token, seconds/token) points, interpolated between
              sizes; past the largest, its time plus the extra bytes at the slope of the
              two largest; below the smallest, overhead (+ per layer) + cost per byte from
              a relative least-squares fit (one sample keeps the prior overhead)
    prefill   seconds/token = overhead + flops/token x cost per flop  (the same line fit)
    memory    peak RSS above the pre-load baseline - KV cache used
                  = runtime + residency x weight bytes                     (same fitting)
    power     not refitted yet: a sample keeps the watts a sensor measured while decoding
              (None with an estimated meter) for when the planner uses them

A coefficient without samples keeps its first estimate; the plan says which is which.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, replace

from edgekit.targets.contract import Coefficients

# Two samples fit a line only when their sizes differ this much; closer ones average.
MIN_SPREAD = 1.5


@dataclass(frozen=True, kw_only=True)
class Sample:
    """One benchmarked variant, reduced to what the fits need."""

    key: str  # bundle#variant@threads: re-benchmarking replaces it
    bytes_per_token: float  # weights + KV read per decode step during the benchmark
    decode_s_per_token: float
    flops_per_token: float | None
    prefill_s_per_token: float | None
    weights_bytes: int
    kv_used_bytes: int
    vocab_term_bytes: int  # the part of the runtime that scales with the vocabulary
    memory_bytes: int | None  # peak RSS above the pre-load baseline
    watts: float | None  # measured by a sensor while decoding; None when estimated
    recorded: str
    layers: int = 0


def _line(points: list[tuple[float, float]], prior_intercept: float) -> tuple[float, float]:
    """Intercept and slope of y = a + b x (a >= 0, b > 0), fitted to minimise the relative
    error (weights 1/y^2), so a tiny model's microseconds count as much as a large
    model's milliseconds. Points too close in x keep the prior intercept."""
    xs = [x for x, _ in points]
    if len(points) >= 2 and max(xs) >= MIN_SPREAD * min(xs):
        w = [1.0 / (y * y) for _, y in points]
        sw = sum(w)
        mx = sum(wi * x for wi, (x, _) in zip(w, points, strict=True)) / sw
        my = sum(wi * y for wi, (_, y) in zip(w, points, strict=True)) / sw
        sxx = sum(wi * (x - mx) ** 2 for wi, (x, _) in zip(w, points, strict=True))
        sxy = sum(wi * (x - mx) * (y - my) for wi, (x, y) in zip(w, points, strict=True))
        b = sxy / sxx
        a = my - b * mx
        if a >= 0 and b > 0:
            return a, b
        # through the origin, same weights
        b = sum(wi * x * y for wi, (x, y) in zip(w, points, strict=True)) / sum(
            wi * x * x for wi, (x, _) in zip(w, points, strict=True)
        )
        return 0.0, b
    a = min(prior_intercept, min(y for _, y in points) / 2)
    b = statistics.fmean((y - a) / x for x, y in points)
    return a, b


def _plane(points: list[tuple[float, float, float]]) -> tuple[float, float, float] | None:
    """y = a + c l + b x by relative least squares (weights 1/y^2); None when the samples
    cannot pin three coefficients or the fit is not physical (a negative term)."""
    if len(points) < 3 or len({depth for depth, _, _ in points}) < 2:
        return None
    rows = [(1.0, depth, x) for depth, x, _ in points]
    w = [1.0 / (y * y) for _, _, y in points]
    m = [
        [sum(wi * r[i] * r[j] for wi, r in zip(w, rows, strict=True)) for j in range(3)]
        for i in range(3)
    ]
    v = [
        sum(wi * r[i] * y for wi, r, (_, _, y) in zip(w, rows, points, strict=True))
        for i in range(3)
    ]
    try:
        a, c, b = _solve3(m, v)
    except ZeroDivisionError:
        return None
    if a < 0 or c < 0 or b <= 0:
        return None
    return a, c, b


def _solve3(m: list[list[float]], v: list[float]) -> tuple[float, float, float]:
    """Gaussian elimination with partial pivoting for a 3x3 system."""
    a = [row[:] + [v[i]] for i, row in enumerate(m)]
    for col in range(3):
        pivot = max(range(col, 3), key=lambda r: abs(a[r][col]))
        if abs(a[pivot][col]) < 1e-300:
            raise ZeroDivisionError("singular")
        a[col], a[pivot] = a[pivot], a[col]
        for r in range(col + 1, 3):
            f = a[r][col] / a[col][col]
            for k in range(col, 4):
                a[r][k] -= f * a[col][k]
    x = [0.0, 0.0, 0.0]
    for r in (2, 1, 0):
        x[r] = (a[r][3] - sum(a[r][k] * x[k] for k in range(r + 1, 3))) / a[r][r]
    return x[0], x[1], x[2]


def fit(
    prior: Coefficients,
    found: list[Sample],
    *,
    bandwidth_gbps: float | None,
    peak_tflops: float | None,
    vocab_term_bytes: int,
) -> Coefficients:
    """``prior`` with every coefficient the samples can pin replaced by its fit."""
    if not found:
        return prior
    c = prior
    if bandwidth_gbps:
        c = _fit_decode(c, found, bandwidth_gbps)
    prefill = [
        (s.flops_per_token, s.prefill_s_per_token)
        for s in found
        if s.flops_per_token and s.prefill_s_per_token
    ]
    if prefill and peak_tflops:
        a, b = _line(prefill, prior.prefill_token_overhead_s)
        c = replace(
            c, prefill_token_overhead_s=a, compute_efficiency=1.0 / (b * peak_tflops * 1e12)
        )
    memory = [s for s in found if s.memory_bytes]
    if memory:
        c = _fit_memory(c, memory, vocab_term_bytes)
    return replace(c, basis="calibrated", note=f"fitted to {len(found)} benchmark(s) on this host")


def _fit_decode(c: Coefficients, found: list[Sample], bandwidth_gbps: float) -> Coefficients:
    """Overhead per token + per layer + per byte when the samples pin all three (several
    model depths), else overhead per token + per byte; and the measured curve."""
    plane = _plane([(s.layers, s.bytes_per_token, s.decode_s_per_token) for s in found])
    if plane is not None:
        a, per_layer, b = plane
    else:
        per_layer = 0.0
        a, b = _line([(s.bytes_per_token, s.decode_s_per_token) for s in found], c.token_overhead_s)
    by_size: dict[float, list[float]] = {}
    for s in found:
        by_size.setdefault(round(s.bytes_per_token, -3), []).append(s.decode_s_per_token)
    curve = tuple(sorted((x, statistics.median(ys)) for x, ys in by_size.items()))
    if len(curve) >= 2:
        # the slope between the two largest models sets the bandwidth term used beyond
        # them (they are the most bandwidth-bound)
        (x0, y0), (x1, y1) = curve[-2], curve[-1]
        if x1 > MIN_SPREAD * x0 and y1 > y0:
            b = (y1 - y0) / (x1 - x0)
    return replace(
        c,
        token_overhead_s=a,
        layer_overhead_s=per_layer,
        bandwidth_efficiency=1.0 / (b * bandwidth_gbps * 1e9),
        decode_curve=curve,
    )


def _fit_memory(c: Coefficients, memory: list[Sample], vocab_term_bytes: int) -> Coefficients:
    """Residency and runtime bytes from peak RSS less the KV cache used (the inverse of
    ``memory.resident_bytes``)."""
    points = [
        (
            float(s.weights_bytes),
            float(s.memory_bytes or 0) - s.kv_used_bytes * c.kv_scale - s.vocab_term_bytes,
        )
        for s in memory
    ]
    xs = [x for x, _ in points]
    if len(points) >= 2 and max(xs) >= 2 * min(xs):
        mx, my = statistics.fmean(xs), statistics.fmean(y for _, y in points)
        residency = sum((x - mx) * (y - my) for x, y in points) / sum((x - mx) ** 2 for x in xs)
        base = my - residency * mx
    else:
        residency = c.weight_residency
        base = statistics.fmean(y - residency * x for x, y in points)
    return replace(c, weight_residency=residency, runtime_bytes=int(base) + vocab_term_bytes)
