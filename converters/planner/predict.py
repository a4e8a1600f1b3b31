"""Memory, speed and power of one model in one format on one compute unit: the numbers
the planner ranks by, pack records and load admits by.

    memory    weights (per-tensor layout) x residency + KV cache at the context + runtime
              (``memory.resident_bytes``)
    decode    seconds per token = overhead + bytes read per token / (efficiency x bandwidth)
    prefill   seconds per token = flops per token / (efficiency x peak compute)
    parallel  N streams decoded together (continuous batching), a first estimate: one step
              reads the weights once and every stream's KV cache, so it takes the
              single-stream time + (N - 1) x (KV read / (efficiency x bandwidth) + overhead
              per token); aggregate tok/s = N / step time, capped by the compute ceiling
              (decode flops per token at the prefill efficiency of the unit's peak)
    power     the profile's sustained draw for LLM work, capped by a power mode or budget;
              joules per token = watts / tokens per second

Every coefficient starts as the target's first estimate (``Target.priors``, with the
reasoning beside each in the target's module) and is replaced by a fit to ``edgekit
bench`` measurements when the device is this host (``calibration``). Each prediction says
which it is.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from edgekit.converters.layouts import WeightLayout
from edgekit.converters.planner.memory import (
    kv_cache_bytes,
    resident_bytes,
    stream_runtime_bytes,
)
from edgekit.targets.contract import Basis, Coefficients, Target

from edgekit.devices import GIB, Accelerator, DeviceProfile, PowerMode
from edgekit.modelspec import ModelSpec

# Prompt length the prefill figure is quoted at (edgekit bench measures it too).
PREFILL_TOKENS = 512
# Tokens in the context when the short-context decode figure is quoted (bench: a short
# prompt and 128 generated tokens).
SHORT_DECODE_CONTEXT = 64


@dataclass(frozen=True, kw_only=True)
class Unit:
    """One compute unit of a device as a runtime sees it, under a power mode."""

    accelerator: Accelerator
    memory_bytes: int  # what a model may use on it
    memory_note: str
    bandwidth_gbps: float | None
    peak_tflops: float | None  # at the precision the runtime computes in
    precision: str
    power_mode: PowerMode | None


@dataclass(frozen=True, kw_only=True)
class Prediction:
    weights_bytes: int  # the files
    kv_cache_bytes: int
    runtime_bytes: int
    # resident at the full context: weights x residency + KV x parallel + runtime (and
    # a row of logits per stream beyond the first: memory.stream_runtime_bytes)
    memory_bytes: int
    decode_tok_s: float | None  # one stream, at a short context
    decode_tok_s_full: float | None  # one stream, with the whole context in the KV cache
    prefill_tok_s: float | None  # a 512-token prompt
    watts: float | None
    joules_per_token: float | None
    basis: Basis
    why: str  # the arithmetic behind the decode figure, in one line
    # Continuous batching: ``parallel`` streams decoded together, each with its own KV
    # cache of the context (``kv_cache_bytes`` is one stream's). Always a first estimate
    # (no batched benchmark calibrates it); at parallel 1 the figures are the decode ones.
    parallel: int = 1
    decode_tok_s_aggregate: float | None = None  # all streams together, short context
    decode_tok_s_aggregate_full: float | None = None  # every stream at the whole context
    decode_tok_s_per_stream: float | None = None  # what one stream gets: aggregate / parallel
    decode_ceiling_tok_s: float | None = None  # compute-bound ceiling, short context
    parallel_why: str = ""  # the arithmetic behind the aggregate figure, in one line


def units_for(profile: DeviceProfile, target: type[Target], mode: PowerMode | None) -> list[Unit]:
    """The compute units of ``profile`` that ``target`` runs on, under ``mode``."""
    return [_unit(profile, a, target, mode) for a in target.accelerators(profile)]


def _unit(
    profile: DeviceProfile, acc: Accelerator, target: type[Target], mode: PowerMode | None
) -> Unit:
    if acc.memory_gib:  # a discrete GPU: its own memory, less the driver's share
        memory = int(acc.memory_gib * 0.95 * GIB)
        note = f"{acc.name} has {acc.memory_gib:g} GiB; ~5% is the driver's"
        bandwidth = acc.memory_bandwidth_gbps
    else:
        memory = profile.memory.usable_bytes
        note = profile.memory.usable_note or f"{profile.memory.usable_gib:g} GiB usable"
        bandwidth = profile.memory.bandwidth_gbps
        if mode is not None and mode.bandwidth_gbps is not None:
            bandwidth = mode.bandwidth_gbps
    support = target.unit(acc.kind)
    splits = support is not None and support.splits_model
    if acc.max_model_gib is not None and acc.max_model_gib * GIB < memory and not splits:
        memory = int(acc.max_model_gib * GIB)
        note = f"the {acc.name} maps at most {acc.max_model_gib:g} GiB per process"
    precision, tflops = _peak(profile, acc, target)
    if tflops is not None and mode is not None:
        tflops *= mode.compute_scale
    return Unit(
        accelerator=acc,
        memory_bytes=memory,
        memory_note=note,
        bandwidth_gbps=bandwidth,
        peak_tflops=tflops,
        precision=precision,
        power_mode=mode,
    )


def _peak(
    profile: DeviceProfile, acc: Accelerator, target: type[Target]
) -> tuple[str, float | None]:
    """The precision prefill computes in and the unit's peak for it."""
    tops = acc.peak_tops
    if acc.kind == "cpu":
        fp32 = tops.get("fp32")
        if fp32 is None and profile.cpu.max_ghz:
            # derived: cores x clock x fp32 flops per cycle of the widest vector unit
            isa = set(profile.cpu.isa)
            per_cycle = 32 if {"avx2", "avx512"} & isa else 16 if "neon" in isa else 8
            fp32 = profile.cpu.physical_cores * profile.cpu.max_ghz * per_cycle / 1000
        better = target.compute_precision(profile, acc, fp32)
        return better if better is not None else ("fp32", fp32)
    for precision in ("fp16", "bf16", "int8", "fp32") if acc.kind != "npu" else ("int8", "fp16"):
        if precision in tops:
            return precision, tops[precision]
    return "unknown", None


def coefficients(target: type[Target], unit: Unit, spec: ModelSpec) -> Coefficients:
    """The target's first estimates for ``spec`` on ``unit``."""
    return target.priors(unit.accelerator.kind, spec)


def kv_bytes(
    spec: ModelSpec,
    tokens: int,
    kv_type: str,
    target: type[Target] | None = None,
    *,
    read: bool = False,
) -> int:
    """KV-cache bytes with ``tokens`` in the context as ``target`` allocates them (``read``:
    as a decode step reads them); ``target=None`` counts every token on every layer."""
    layout = target.kv_cache if target is not None else None
    return kv_cache_bytes(spec, tokens, kv_type, layout=layout, allocated=not read)


def prefill_flops_per_token(layout: WeightLayout, spec: ModelSpec, tokens: int) -> float:
    """2 flops per weight multiplied, plus attention over half the prompt on average."""
    attention = 4 * spec.layers * spec.heads * spec.head_dim * tokens / 2
    return 2.0 * layout.matmul_parameters + attention


def decode_flops_per_token(layout: WeightLayout, spec: ModelSpec, context: int) -> float:
    """2 flops per weight multiplied, plus attention over ``context`` positions (every
    layer at the whole context: a windowed layer's fewer flops only raise the ceiling)."""
    return 2.0 * layout.matmul_parameters + 4 * spec.layers * spec.heads * spec.head_dim * context


def prefill_seconds(c: Coefficients, flops_per_token: float, peak_tflops: float) -> float:
    """Seconds per prompt token (inf when the efficiency or peak is not positive)."""
    rate = c.compute_efficiency * peak_tflops * 1e12
    if not rate > 0:
        return math.inf
    return c.prefill_token_overhead_s + flops_per_token / rate


def decode_seconds(
    c: Coefficients, bytes_per_token: float, bandwidth_gbps: float, layers: int = 0
) -> float:
    """Seconds per generated token (inf when the efficiency or bandwidth is not positive)."""
    if not c.bandwidth_efficiency * bandwidth_gbps > 0:
        return math.inf
    curve = c.decode_curve
    if len(curve) >= 2 and curve[0][0] <= bytes_per_token <= curve[-1][0]:
        for (x0, y0), (x1, y1) in zip(curve, curve[1:], strict=False):
            if x0 <= bytes_per_token <= x1:
                if x1 == x0:
                    return y0
                return y0 + (y1 - y0) * (bytes_per_token - x0) / (x1 - x0)
    if curve and bytes_per_token > curve[-1][0]:
        # beyond the largest measured model: its time plus the extra bytes at the fitted
        # bandwidth efficiency (large models are bandwidth-bound)
        x1, y1 = curve[-1]
        return y1 + (bytes_per_token - x1) / (c.bandwidth_efficiency * bandwidth_gbps * 1e9)
    return (
        c.token_overhead_s
        + layers * c.layer_overhead_s
        + bytes_per_token / (c.bandwidth_efficiency * bandwidth_gbps * 1e9)
    )


def decode_rate(
    c: Coefficients, bytes_per_token: float, bandwidth_gbps: float, layers: int = 0
) -> float | None:
    """Tokens per second of decode (None: no positive, finite rate)."""
    return per_second(decode_seconds(c, bytes_per_token, bandwidth_gbps, layers))


def prefill_rate(c: Coefficients, flops_per_token: float, peak_tflops: float) -> float | None:
    """Tokens per second of prefill (None: no positive, finite rate)."""
    return per_second(prefill_seconds(c, flops_per_token, peak_tflops))


def step_seconds(
    c: Coefficients,
    weights_read: float,
    kv_read: float,
    bandwidth_gbps: float,
    layers: int = 0,
    *,
    streams: int = 1,
) -> float:
    """Seconds of one decode step that advances ``streams`` sequences by a token each: the
    single-stream time (``decode_seconds``: the weights and one KV cache read, the overhead
    per token and per layer) plus, for each further stream, its KV cache read at the
    bandwidth efficiency and its overhead per token. The weights are read once for all
    streams and the per-layer launches happen once a step; sampling, detokenizing and the
    loop's bookkeeping happen for every token, so the overhead per token is counted for
    each stream (inf when the efficiency or bandwidth is not positive)."""
    one = decode_seconds(c, weights_read + kv_read, bandwidth_gbps, layers)
    if streams == 1:
        return one
    rate = c.bandwidth_efficiency * bandwidth_gbps * 1e9
    if not rate > 0:
        return math.inf
    return one + (streams - 1) * (kv_read / rate + c.token_overhead_s)


def aggregate_rate(
    c: Coefficients,
    weights_read: float,
    kv_read: float,
    bandwidth_gbps: float,
    layers: int,
    *,
    streams: int,
    ceiling: float | None,
) -> float | None:
    """Tokens per second of all ``streams`` together: ``streams`` / step time, never above
    the compute ceiling (``ceiling``, tok/s; None: no figure) unless one stream alone is
    (batching then gains nothing). At one stream: ``decode_rate``. None: no positive,
    finite rate."""
    step = step_seconds(c, weights_read, kv_read, bandwidth_gbps, layers, streams=streams)
    rate = per_second(step / streams)
    if rate is None or streams == 1 or ceiling is None:
        return rate
    single = decode_rate(c, weights_read + kv_read, bandwidth_gbps, layers)
    return min(rate, max(ceiling, single or 0.0))


def predict(
    spec: ModelSpec,
    layout: WeightLayout,
    target: type[Target],
    unit: Unit,
    c: Coefficients,
    profile: DeviceProfile,
    *,
    context: int,
    kv_type: str,
    watts_cap: float | None,
    parallel: int = 1,
) -> Prediction:
    """Memory, decode, prefill, watts and J/token of ``layout`` on ``unit`` of ``target``,
    with ``parallel`` streams decoded together (each with a KV cache of ``context``)."""
    kv_full = kv_bytes(spec, context, kv_type, target)
    decode = decode_full = None
    why = "no memory bandwidth figure for this device"
    if unit.bandwidth_gbps:
        read = layout.bytes_per_token
        short = read + kv_bytes(spec, SHORT_DECODE_CONTEXT, kv_type, target, read=True)
        full = read + kv_bytes(spec, context, kv_type, target, read=True)
        decode = decode_rate(c, short, unit.bandwidth_gbps, spec.layers)
        decode_full = decode_rate(c, full, unit.bandwidth_gbps, spec.layers)
        why = (
            f"{read / 1e6:,.0f} MB read per token at {c.bandwidth_efficiency:.0%} of "
            f"{unit.bandwidth_gbps:g} GB/s + {c.token_overhead_s * 1e3:.2g} ms per token"
        )
    prefill = None
    if unit.peak_tflops:
        prefill = prefill_rate(
            c, prefill_flops_per_token(layout, spec, PREFILL_TOKENS), unit.peak_tflops
        )
    batch = _batched(spec, layout, target, unit, c, context=context, kv_type=kv_type, n=parallel)
    rates: tuple[float | None, ...] = (
        decode,
        decode_full,
        prefill,
        batch.aggregate,
        batch.aggregate_full,
        batch.ceiling,
    )
    watts = _watts(profile, unit.power_mode, watts_cap)
    if watts_cap is not None and watts_cap < profile.power.typical_w and unit.power_mode is None:
        # Below the sustained draw the device throttles: scale throughput with the power
        # above idle (a first-order model; DVFS is not linear, calibrate when it matters).
        idle = profile.power.idle_w
        share = max(watts_cap - idle, 0.0) / max(profile.power.typical_w - idle, 1e-9)
        rates = tuple(r * share if r else r for r in rates)
    decode, decode_full, prefill, aggregate, aggregate_full, ceiling = rates
    return Prediction(
        weights_bytes=layout.total_bytes,
        kv_cache_bytes=kv_full,
        runtime_bytes=c.runtime_bytes,
        memory_bytes=resident_bytes(
            layout.total_bytes,
            kv_full,
            c,
            streams=parallel,
            stream_bytes=stream_runtime_bytes(spec),
        ),
        decode_tok_s=decode,
        decode_tok_s_full=decode_full,
        prefill_tok_s=prefill,
        watts=watts,
        joules_per_token=joules_per_token(watts, decode),
        basis=c.basis,
        why=why,
        parallel=parallel,
        decode_tok_s_aggregate=aggregate,
        decode_tok_s_aggregate_full=aggregate_full,
        decode_tok_s_per_stream=aggregate / parallel if aggregate else aggregate,
        decode_ceiling_tok_s=ceiling,
        parallel_why=batch.why,
    )


@dataclass(frozen=True, kw_only=True)
class _Batch:
    aggregate: float | None
    aggregate_full: float | None
    ceiling: float | None
    why: str


def _batched(
    spec: ModelSpec,
    layout: WeightLayout,
    target: type[Target],
    unit: Unit,
    c: Coefficients,
    *,
    context: int,
    kv_type: str,
    n: int,
) -> _Batch:
    """Aggregate decode of ``n`` streams at a short and at the whole context, and the
    compute ceiling: what ``Prediction``'s parallel figures are made of."""
    ceiling = ceiling_full = None
    capped = "no peak-compute figure, no compute ceiling"
    if unit.peak_tflops:
        peak = unit.peak_tflops
        ceiling = prefill_rate(c, decode_flops_per_token(layout, spec, SHORT_DECODE_CONTEXT), peak)
        ceiling_full = prefill_rate(c, decode_flops_per_token(layout, spec, context), peak)
        if ceiling is not None:
            capped = (
                f"at most {ceiling:,.0f} tok/s compute-bound "
                f"({c.compute_efficiency:.0%} of {peak:g} TFLOPS)"
            )
    if not unit.bandwidth_gbps:
        return _Batch(aggregate=None, aggregate_full=None, ceiling=ceiling, why="")
    bandwidth, read = unit.bandwidth_gbps, layout.bytes_per_token
    kv_short = kv_bytes(spec, SHORT_DECODE_CONTEXT, kv_type, target, read=True)
    kv_long = kv_bytes(spec, context, kv_type, target, read=True)
    aggregate = aggregate_rate(
        c, read, kv_short, bandwidth, spec.layers, streams=n, ceiling=ceiling
    )
    aggregate_full = aggregate_rate(
        c, read, kv_long, bandwidth, spec.layers, streams=n, ceiling=ceiling_full
    )
    why = (
        f"{n} streams (first estimate): a step reads {read / 1e6:,.0f} MB of weights once + "
        f"{n} x {kv_short / 1e6:,.2g} MB of KV cache at {c.bandwidth_efficiency:.0%} of "
        f"{bandwidth:g} GB/s, + {c.token_overhead_s * 1e3:.2g} ms per token; {capped}"
    )
    return _Batch(aggregate=aggregate, aggregate_full=aggregate_full, ceiling=ceiling, why=why)


def joules_per_token(watts: float | None, decode_tok_s: float | None) -> float | None:
    """Energy per generated token: the sustained draw over the decode rate."""
    return watts / decode_tok_s if watts and watts > 0 and decode_tok_s else None


def per_second(seconds: float) -> float | None:
    """A rate from a time per item; None (no prediction) rather than a negative, infinite
    or NaN rate when coefficients fitted to odd measurements give a time that is not a
    positive number."""
    if not math.isfinite(seconds) or seconds <= 0:
        return None
    return 1.0 / seconds


def _watts(profile: DeviceProfile, mode: PowerMode | None, cap: float | None) -> float | None:
    """Sustained draw while generating: the profile's typical figure, capped by the power
    mode's budget and the user's."""
    watts = profile.power.typical_w
    if mode is not None:
        watts = min(watts, mode.max_w)
    if cap is not None:
        watts = min(watts, cap)
    return watts
