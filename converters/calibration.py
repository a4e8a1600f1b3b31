"""Calibration: ``edgekit bench`` measurements refit the planner's coefficients for this host.

Each benchmark of a bundle variant becomes one sample, stored per device and per
(target, compute unit) in a small JSON file ($EDGEKIT_CACHE/calibration.json, else
~/.cache/edgekit/). Re-benchmarking the same variant replaces its sample. At plan time:

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

import dataclasses
import json
import statistics
from dataclasses import asdict, dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from edgekit.converters.layouts import (
    TensorLayout,
    WeightLayout,
    gguf_layout,
    openvino_layout,
    tensor_role,
)
from edgekit.converters.predict import (
    PREFILL_TOKENS,
    Coefficients,
    kv_bytes,
    prefill_flops_per_token,
)

from edgekit.atomic import write_atomic
from edgekit.cache import cache_root
from edgekit.devices import DeviceProfile
from edgekit.errors import SchemaError
from edgekit.modelspec import ModelSpec
from edgekit.safe_files import read_capped
from edgekit.schema import build
from edgekit.untrusted import parse_json

FILE_VERSION = 1
MAX_SAMPLES = 32  # per device and unit; the oldest go first
MAX_FILE_BYTES = 16 << 20  # 32 samples of ~400 bytes per device and unit: far below
_DELETE_IT = "delete it; the next `edgekit bench` writes a new one"
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


def calibration_file() -> Path:
    return cache_root() / "calibration.json"


def device_key(profile: DeviceProfile) -> str:
    """What identifies a host across runs: CPU, cores, memory, architecture."""
    cpu = profile.cpu
    memory = f"{profile.memory.total_gib:.0f} GiB"
    return f"{cpu.model} | {cpu.physical_cores} cores | {memory} | {profile.arch}"


def _read() -> dict[str, Any]:
    path = calibration_file()
    try:
        raw = read_capped(path, max_bytes=MAX_FILE_BYTES, error=SchemaError, hint=_DELETE_IT)
    except FileNotFoundError:
        return {"version": FILE_VERSION, "devices": {}}
    data = parse_json(
        raw,
        where=f"{path}: cannot read the calibration file",
        max_bytes=MAX_FILE_BYTES,
        hint=_DELETE_IT,
    )
    if (
        not isinstance(data, dict)
        or data.get("version") != FILE_VERSION
        or not isinstance(data.get("devices"), dict)
        or not all(
            isinstance(units, dict) and all(isinstance(slot, dict) for slot in units.values())
            for units in data["devices"].values()
        )
    ):
        raise SchemaError(
            f"{path}: not a calibration file of version {FILE_VERSION}", hint=_DELETE_IT
        )
    return data


_SAMPLE_KEYS = {f.name for f in dataclasses.fields(Sample)}
_REQUIRED_KEYS = {
    f.name
    for f in dataclasses.fields(Sample)
    if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
}


def samples(device: str, target: str, unit: str) -> list[Sample]:
    """The stored samples of a device and compute unit.

    A sample with other keys (from another edgekit version) is skipped; one with this
    version's keys but a wrong value is an error, not a silent skip.

    Raises:
        SchemaError: the file or a sample is damaged (the hint says to delete it).
    """
    raw = _read()["devices"].get(device, {}).get(f"{target}/{unit}", {})
    out: list[Sample] = []
    for key, value in raw.items():
        if not isinstance(value, dict) or not _REQUIRED_KEYS <= set(value) <= _SAMPLE_KEYS:
            continue  # a sample from another edgekit version: skip, do not fail the plan
        where = f"{calibration_file()}: sample {key!r}"
        try:
            sample = build(Sample, value, where, SchemaError)
        except SchemaError as exc:
            raise SchemaError(exc.message, hint=_DELETE_IT) from exc
        out.append(sample)
    return out


def record(device: str, target: str, unit: str, sample: Sample) -> Path:
    """Store ``sample`` (replacing one with the same key) and return the file's path."""
    data = _read()
    slot = data["devices"].setdefault(device, {}).setdefault(f"{target}/{unit}", {})
    slot.pop(sample.key, None)
    slot[sample.key] = asdict(sample)
    while len(slot) > MAX_SAMPLES:
        slot.pop(next(iter(slot)))
    return write_atomic(calibration_file(), json.dumps(data, indent=1, sort_keys=True))


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
        # decode: overhead per token + per layer + per byte when the samples pin all three
        # (several model depths), else overhead per token + per byte
        plane = _plane([(s.layers, s.bytes_per_token, s.decode_s_per_token) for s in found])
        if plane is not None:
            a, per_layer, b = plane
        else:
            per_layer = 0.0
            a, b = _line(
                [(s.bytes_per_token, s.decode_s_per_token) for s in found], prior.token_overhead_s
            )
        by_size: dict[float, list[float]] = {}
        for s in found:
            by_size.setdefault(round(s.bytes_per_token, -3), []).append(s.decode_s_per_token)
        curve = tuple(sorted((x, statistics.median(ys)) for x, ys in by_size.items()))
        if len(curve) >= 2:
            # the slope between the two largest models sets the bandwidth term used
            # beyond them (they are the most bandwidth-bound)
            (x0, y0), (x1, y1) = curve[-2], curve[-1]
            if x1 > MIN_SPREAD * x0 and y1 > y0:
                b = (y1 - y0) / (x1 - x0)
        c = replace(
            c,
            token_overhead_s=a,
            layer_overhead_s=per_layer,
            bandwidth_efficiency=1.0 / (b * bandwidth_gbps * 1e9),
            decode_curve=curve,
        )
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
        points = [
            (
                float(s.weights_bytes),
                float(s.memory_bytes or 0) - s.kv_used_bytes * prior.kv_scale - s.vocab_term_bytes,
            )
            for s in memory
        ]
        xs = [x for x, _ in points]
        if len(points) >= 2 and max(xs) >= 2 * min(xs):
            mx, my = statistics.fmean(xs), statistics.fmean(y for _, y in points)
            residency = sum((x - mx) * (y - my) for x, y in points) / sum((x - mx) ** 2 for x in xs)
            base = my - residency * mx
        else:
            residency = prior.weight_residency
            base = statistics.fmean(y - residency * x for x, y in points)
        c = replace(c, weight_residency=residency, runtime_bytes=int(base) + vocab_term_bytes)
    c = replace(
        c,
        basis="calibrated",
        note=f"fitted to {len(found)} benchmark(s) on this host",
    )
    return c


# --- from a benchmark result -----------------------------------------------------------


def variant_layout(spec: ModelSpec, target: str, quant: str) -> WeightLayout:
    """The layout of a built variant: a GGUF's own tensors, an OpenVINO export's NNCF
    layout (checked against real exports in tests/test_layouts.py)."""
    if target == "llamacpp" and spec.format == "gguf":
        tensors = tuple(
            TensorLayout(
                name=t.name, role=tensor_role(t), shape=t.shape, storage=t.dtype, nbytes=t.nbytes
            )
            for t in spec.tensors
        )
        return WeightLayout(
            target=target, format=quant, tensors=tensors, tied_embeddings=spec.tied_embeddings
        )
    if target == "openvino":
        return openvino_layout(spec, quant)
    return gguf_layout(spec, quant)


def sample_from_bench(
    result: Any,
    spec: ModelSpec,
    layout: WeightLayout,
    *,
    kv_preallocated: bool,
    vocab_term: int,
    kv_type: str = "f16",
) -> Sample:
    """One Sample from an ``edgekit.bench.BenchResult`` of the variant ``layout`` describes."""
    run = result.runs[0]
    prompt_max = max((p.prompt_tokens for p in run.prefill), default=0)
    decode_tokens = max(run.decode.tokens, 1)
    used = run.context if kv_preallocated else max(prompt_max + 1, decode_tokens + 8)
    read = layout.bytes_per_token + kv_bytes(
        spec, decode_tokens // 2 + 8, kv_type, layout.target, read=True
    )
    long_prefill = next((p for p in run.prefill if p.prompt_tokens >= PREFILL_TOKENS), None)
    flops = prefill = None
    if long_prefill is not None:
        flops = prefill_flops_per_token(layout, spec, long_prefill.prompt_tokens)
        prefill = 1.0 / long_prefill.tok_s.median
    memory = None
    if run.rss_before_load_mb is not None:
        memory = int((run.peak_rss_mb - run.rss_before_load_mb) * 1e6)
    watts = run.decode.power.avg_w if result.meter.measured else None
    return Sample(
        key=f"{result.bundle}#{result.variant}@{run.threads}",
        bytes_per_token=float(read),
        decode_s_per_token=1.0 / run.decode.tok_s.median,
        flops_per_token=flops,
        prefill_s_per_token=prefill,
        weights_bytes=layout.total_bytes,
        kv_used_bytes=kv_bytes(spec, used, kv_type, layout.target),
        vocab_term_bytes=vocab_term,
        memory_bytes=memory,
        watts=watts,
        recorded=datetime.now(UTC).isoformat(timespec="seconds"),
        layers=spec.layers,
    )


def _benchmarked(result: Any) -> tuple[Any, ModelSpec, WeightLayout]:
    """The manifest variant a bench result measured, its spec and its weight layout.

    Raises:
        BundleError: the benchmarked bundle cannot be opened any more.
    """
    from edgekit.bundle import open_bundle
    from edgekit.inspection import inspect_model

    opened = open_bundle(result.bundle)
    variant = opened.manifest.variant(result.variant)
    spec = inspect_model(opened.variant_path(variant))
    return variant, spec, variant_layout(spec, variant.target, variant.quant)


def record_bench(result: Any, profile: DeviceProfile) -> Path:
    """Store a bench result of a bundle variant as a calibration sample for ``profile``
    (this host). Returns the calibration file's path.

    Raises:
        BundleError: the benchmarked bundle cannot be opened any more.
    """
    from edgekit.converters.predict import PRIORS, vocab_term

    variant, spec, layout = _benchmarked(result)
    unit = result.runs[0].device
    prior = PRIORS.get((variant.target, unit))
    sample = sample_from_bench(
        result,
        spec,
        layout,
        kv_preallocated=prior.kv_preallocated if prior else True,
        vocab_term=vocab_term(variant.target, unit, spec),
        kv_type=variant.runtime.kv_cache,
    )
    return record(device_key(profile), variant.target, unit, sample)


@dataclass(frozen=True, kw_only=True)
class Check:
    """A prediction set beside the benchmark it predicts."""

    bundle: str
    variant: str
    target: str
    unit: str
    samples_used: int
    basis: str
    predicted_memory_bytes: int
    measured_memory_bytes: int | None
    predicted_decode_tok_s: float | None
    measured_decode_tok_s: float
    predicted_prefill_tok_s: float | None
    measured_prefill_tok_s: float | None

    @property
    def memory_error(self) -> float | None:
        if not self.measured_memory_bytes:
            return None
        return self.predicted_memory_bytes / self.measured_memory_bytes - 1

    @property
    def decode_error(self) -> float | None:
        if not self.predicted_decode_tok_s:
            return None
        return self.predicted_decode_tok_s / self.measured_decode_tok_s - 1

    @property
    def prefill_error(self) -> float | None:
        if not self.predicted_prefill_tok_s or not self.measured_prefill_tok_s:
            return None
        return self.predicted_prefill_tok_s / self.measured_prefill_tok_s - 1


def check_against_bench(
    result: Any, profile: DeviceProfile, *, leave_out: bool = True, calibrated: bool = True
) -> Check:
    """Predict a benchmarked variant the way the planner would on ``profile`` (this
    host), at the benchmark's own context and token counts, and set the measurement
    beside it. ``leave_out`` fits without this variant's own sample, so the figure
    shows how the calibration carries to a model it has not seen."""
    from edgekit.converters.predict import (
        coefficients,
        decode_seconds,
        prefill_seconds,
        units_for,
        vocab_term,
    )

    variant, spec, layout = _benchmarked(result)
    run = result.runs[0]
    units = [
        u for u in units_for(profile, variant.target, None) if u.accelerator.kind == run.device
    ]
    if not units:
        raise SchemaError(f"{profile.name} has no {run.device} unit for {variant.target}")
    unit = units[0]
    prior = coefficients(variant.target, unit, spec)
    found = samples(device_key(profile), variant.target, run.device) if calibrated else []
    own = sample_from_bench(
        result,
        spec,
        layout,
        kv_preallocated=prior.kv_preallocated,
        vocab_term=vocab_term(variant.target, run.device, spec),
        kv_type=variant.runtime.kv_cache,
    )
    if leave_out:
        found = [s for s in found if s.key != own.key]
    c = fit(
        prior,
        found,
        bandwidth_gbps=unit.bandwidth_gbps,
        peak_tflops=unit.peak_tflops,
        vocab_term_bytes=vocab_term(variant.target, run.device, spec),
    )
    memory = int(
        layout.total_bytes * c.weight_residency + own.kv_used_bytes * c.kv_scale + c.runtime_bytes
    )
    decode = (
        1.0 / decode_seconds(c, own.bytes_per_token, unit.bandwidth_gbps, spec.layers)
        if unit.bandwidth_gbps
        else None
    )
    prefill = None
    if unit.peak_tflops and own.flops_per_token:
        prefill = 1.0 / prefill_seconds(c, own.flops_per_token, unit.peak_tflops)
    longest = max(run.prefill, key=lambda p: p.prompt_tokens, default=None)
    return Check(
        bundle=str(result.bundle),
        variant=result.variant,
        target=variant.target,
        unit=run.device,
        samples_used=len(found),
        basis=c.basis,
        predicted_memory_bytes=memory,
        measured_memory_bytes=own.memory_bytes,
        predicted_decode_tok_s=decode,
        measured_decode_tok_s=run.decode.tok_s.median,
        predicted_prefill_tok_s=prefill,
        measured_prefill_tok_s=longest.tok_s.median if longest else None,
    )
