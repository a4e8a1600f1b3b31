"""Memory, speed and power of one model in one format on one compute unit: the numbers
the planner ranks by.

    memory    weights (per-tensor layout) x residency + KV cache at the context + runtime
    decode    seconds per token = overhead + bytes read per token / (efficiency x bandwidth)
    prefill   seconds per token = flops per token / (efficiency x peak compute)
    power     the profile's sustained draw for LLM work, capped by a power mode or budget;
              joules per token = watts / tokens per second

Every coefficient starts as a first estimate (``PRIORS``, with the reasoning beside each)
and is replaced by a fit to ``edgekit bench`` measurements when the device is this host
(converters/calibration.py). Each prediction says which it is.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Literal

from edgekit.converters.layouts import WeightLayout

from edgekit.devices import GIB, Accelerator, DeviceProfile, PowerMode
from edgekit.memory_estimate import OUTPUT_BUFFER_ROWS, RUNTIME_BASE, kv_cache_bytes
from edgekit.modelspec import ModelSpec

Basis = Literal["first estimate", "calibrated"]
MB = 1 << 20
# Prompt length the prefill figure is quoted at (edgekit bench measures it too).
PREFILL_TOKENS = 512
# Tokens in the context when the short-context decode figure is quoted (bench: a short
# prompt and 128 generated tokens).
SHORT_DECODE_CONTEXT = 64


@dataclass(frozen=True, kw_only=True)
class Coefficients:
    """How a runtime turns a device's raw figures into throughput and memory."""

    bandwidth_efficiency: float  # share of the memory bandwidth a decode step achieves
    token_overhead_s: float  # fixed cost per generated token (sampling, graph launch, Python)
    compute_efficiency: float  # share of peak compute prefill achieves
    runtime_bytes: int  # buffers and libraries beyond weights and KV cache
    weight_residency: float  # resident bytes per weight byte (1.0: mapped once, no copy)
    kv_preallocated: bool  # True: the whole context's KV cache is allocated at load
    kv_scale: float = 1.0  # resident bytes per nominal KV-cache byte (copies, padding)
    prefill_token_overhead_s: float = 0.0  # fixed cost per prompt token
    layer_overhead_s: float = 0.0  # per layer per generated token (kernel launches)
    # Measured (bytes read per token, seconds per token) on this host, by size: between
    # two measured sizes the time is interpolated, which captures what one line cannot,
    # e.g. small models that fit in the CPU's last-level cache.
    decode_curve: tuple[tuple[float, float], ...] = ()
    basis: Basis = "first estimate"
    note: str = ""


def _llamacpp_runtime(spec: ModelSpec) -> int:
    return RUNTIME_BASE + spec.vocab_size * 4 * OUTPUT_BUFFER_ROWS


# (target, unit kind) -> first estimates. Reasoning, in order of the fields:
#  llama.cpp CPU: token generation reaches ~50-60% of DRAM bandwidth on desktop and phone
#    CPUs (llama.cpp CPU benchmarks, e.g. discussion #4167's CPU rows); ~0.5 ms per token
#    of sampling and Python; prefill ~40% of fp32 peak (int8 dot products on quantized
#    rows); runtime from edgekit/memory_estimate.py (fitted here); the file is mmapped.
#  llama.cpp GPU (Metal, CUDA): M-series Q4_0 7B token generation is ~60-65% of the spec
#    bandwidth (discussion #4167: M1 Pro 36 tok/s at 200 GB/s, M3 Max 66 tok/s at 400 GB/s);
#    CUDA context and compute buffers add ~300 MB.
#  OpenVINO CPU: measured on this project's machine (SmolLM2 INT4/INT8): decode like
#    llama.cpp; resident memory grows ~1.8 bytes per weight byte (the CPU plugin keeps
#    its own copy of most weights beside the mapped file), ~180 MB of plugin and
#    compiled-model buffers; the KV cache grows with the tokens used.
#  OpenVINO GPU/NPU, QNN HTP, MLX, TensorRT: no measurement here; bandwidth efficiencies
#    from the same public token-generation figures, lower for NPUs whose LLM pipelines
#    are younger; runtime buffers are round first estimates (CUDA context ~300 MB on
#    Jetson, HTP shared buffers, Metal heaps).
PRIORS: dict[tuple[str, str], Coefficients] = {
    ("llamacpp", "cpu"): Coefficients(
        bandwidth_efficiency=0.55,
        token_overhead_s=0.0005,
        compute_efficiency=0.4,
        runtime_bytes=0,  # computed per model: _llamacpp_runtime
        weight_residency=1.0,
        kv_preallocated=True,
    ),
    ("llamacpp", "gpu"): Coefficients(
        bandwidth_efficiency=0.62,
        token_overhead_s=0.001,
        compute_efficiency=0.35,
        runtime_bytes=300 * MB,
        weight_residency=1.0,
        kv_preallocated=True,
    ),
    ("openvino", "cpu"): Coefficients(
        bandwidth_efficiency=0.55,
        token_overhead_s=0.0005,
        compute_efficiency=0.5,
        runtime_bytes=180 * MB,
        weight_residency=1.8,
        kv_preallocated=False,
        # measured here: peak RSS grows 71 KB per context token for SmolLM2 INT4 (prompts
        # of 128-1024 tokens) where its f16 KV cache is 23 KB per token
        kv_scale=3.0,
    ),
    ("openvino", "gpu"): Coefficients(
        bandwidth_efficiency=0.5,
        token_overhead_s=0.002,
        compute_efficiency=0.3,
        runtime_bytes=400 * MB,
        weight_residency=1.0,
        kv_preallocated=False,
    ),
    ("openvino", "npu"): Coefficients(
        bandwidth_efficiency=0.4,
        token_overhead_s=0.003,
        compute_efficiency=0.2,
        runtime_bytes=300 * MB,
        weight_residency=1.0,
        kv_preallocated=True,  # static shapes: the KV cache is sized at compile time
    ),
    ("qnn", "npu"): Coefficients(
        bandwidth_efficiency=0.4,
        token_overhead_s=0.003,
        compute_efficiency=0.2,
        runtime_bytes=200 * MB,
        weight_residency=1.0,
        kv_preallocated=True,
    ),
    ("mlx", "gpu"): Coefficients(
        bandwidth_efficiency=0.65,
        token_overhead_s=0.001,
        compute_efficiency=0.4,
        runtime_bytes=200 * MB,
        weight_residency=1.0,
        kv_preallocated=False,
    ),
    ("tensorrt", "gpu"): Coefficients(
        bandwidth_efficiency=0.7,
        token_overhead_s=0.001,
        compute_efficiency=0.5,
        runtime_bytes=500 * MB,
        weight_residency=1.0,
        kv_preallocated=True,
    ),
}


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


def units_for(profile: DeviceProfile, target: str, mode: PowerMode | None) -> list[Unit]:
    """The compute units ``target`` runs on for this device (llama.cpp: the GPU when the
    device has a Metal or CUDA one, else the CPU; OpenVINO: each of CPU, GPU, NPU)."""
    by_kind = {a.kind: a for a in profile.accelerators}
    chosen: list[Accelerator] = []
    if target == "llamacpp":
        gpu = by_kind.get("gpu")
        if gpu and (gpu.runtime_device or "").startswith(("metal", "cuda")):
            chosen = [gpu]
        elif "cpu" in by_kind:
            chosen = [by_kind["cpu"]]
    elif target == "openvino":
        chosen = [a for a in profile.accelerators if a.runtime_device in ("CPU", "GPU", "NPU")]
    elif target == "qnn":
        chosen = [a for a in profile.accelerators if a.runtime_device == "HTP"]
    elif target == "mlx":
        chosen = [a for a in profile.accelerators if a.runtime_device == "metal"]
    elif target == "tensorrt":
        chosen = [a for a in profile.accelerators if (a.runtime_device or "").startswith("cuda")]
    return [_unit(profile, a, target, mode) for a in chosen]


def _unit(profile: DeviceProfile, acc: Accelerator, target: str, mode: PowerMode | None) -> Unit:
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
    if acc.max_model_gib is not None and acc.max_model_gib * GIB < memory:
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


def _peak(profile: DeviceProfile, acc: Accelerator, target: str) -> tuple[str, float | None]:
    """The precision prefill computes in and the unit's peak for it."""
    tops = acc.peak_tops
    if acc.kind == "cpu":
        fp32 = tops.get("fp32")
        if fp32 is None and profile.cpu.max_ghz:
            # derived: cores x clock x fp32 flops per cycle of the widest vector unit
            isa = set(profile.cpu.isa)
            per_cycle = 32 if {"avx2", "avx512"} & isa else 16 if "neon" in isa else 8
            fp32 = profile.cpu.physical_cores * profile.cpu.max_ghz * per_cycle / 1000
        if target == "openvino" and fp32 and {"avx512_bf16", "amx_bf16"} & set(profile.cpu.isa):
            return "bf16", fp32 * 2  # the CPU plugin infers in bf16 there, twice the rate
        return "fp32", fp32
    for precision in ("fp16", "bf16", "int8", "fp32") if acc.kind != "npu" else ("int8", "fp16"):
        if precision in tops:
            return precision, tops[precision]
    return "unknown", None


def vocab_term(target: str, kind: str, spec: ModelSpec) -> int:
    """The part of the runtime buffers that grows with the vocabulary (llama.cpp's output
    buffer on the CPU); calibration fits the rest."""
    if target == "llamacpp" and kind == "cpu":
        return spec.vocab_size * 4 * OUTPUT_BUFFER_ROWS
    return 0


def coefficients(target: str, unit: Unit, spec: ModelSpec) -> Coefficients:
    kind = unit.accelerator.kind
    c = PRIORS[(target, kind)]
    if target == "llamacpp" and kind == "cpu":
        c = replace(c, runtime_bytes=_llamacpp_runtime(spec))
    return c


@dataclass(frozen=True, kw_only=True)
class Prediction:
    weights_bytes: int  # the files
    kv_cache_bytes: int
    runtime_bytes: int
    memory_bytes: int  # resident at the full context: weights x residency + KV + runtime
    decode_tok_s: float | None  # at a short context
    decode_tok_s_full: float | None  # with the whole context in the KV cache
    prefill_tok_s: float | None  # a 512-token prompt
    watts: float | None
    joules_per_token: float | None
    basis: Basis
    why: str  # the arithmetic behind the decode figure, in one line


def kv_bytes(
    spec: ModelSpec, tokens: int, kv_type: str, target: str | None = None, *, read: bool = False
) -> int:
    """KV-cache bytes with ``tokens`` in the context as ``target`` allocates them (``read``:
    as a decode step reads them). A runtime with a windowed cache keeps only the window
    on sliding-window layers (edgekit/memory_estimate.py); ``target=None`` counts every
    token on every layer."""
    return kv_cache_bytes(spec, tokens, kv_type, target=target, allocated=not read)


def prefill_flops_per_token(layout: WeightLayout, spec: ModelSpec, tokens: int) -> float:
    """2 flops per weight multiplied, plus attention over half the prompt on average."""
    attention = 4 * spec.layers * spec.heads * spec.head_dim * tokens / 2
    return 2.0 * layout.matmul_parameters + attention


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


def predict(
    spec: ModelSpec,
    layout: WeightLayout,
    unit: Unit,
    c: Coefficients,
    profile: DeviceProfile,
    *,
    context: int,
    kv_type: str,
    watts_cap: float | None,
) -> Prediction:
    target = layout.target
    kv_full = kv_bytes(spec, context, kv_type, target)
    memory = int(layout.total_bytes * c.weight_residency + kv_full * c.kv_scale) + c.runtime_bytes
    decode = decode_full = None
    why = "no memory bandwidth figure for this device"
    if unit.bandwidth_gbps:
        read = layout.bytes_per_token
        short = read + kv_bytes(spec, SHORT_DECODE_CONTEXT, kv_type, target, read=True)
        full = read + kv_bytes(spec, context, kv_type, target, read=True)
        decode = _per_second(decode_seconds(c, short, unit.bandwidth_gbps, spec.layers))
        decode_full = _per_second(decode_seconds(c, full, unit.bandwidth_gbps, spec.layers))
        why = (
            f"{read / 1e6:,.0f} MB read per token at {c.bandwidth_efficiency:.0%} of "
            f"{unit.bandwidth_gbps:g} GB/s + {c.token_overhead_s * 1e3:.2g} ms per token"
        )
    prefill = None
    if unit.peak_tflops:
        flops = prefill_flops_per_token(layout, spec, PREFILL_TOKENS)
        prefill = _per_second(prefill_seconds(c, flops, unit.peak_tflops))
    watts = _watts(profile, unit.power_mode, watts_cap)
    if watts is not None and watts_cap is not None and watts_cap < profile.power.typical_w:
        # Below the sustained draw the device throttles: scale throughput with the power
        # above idle (a first-order model; DVFS is not linear, calibrate when it matters).
        idle = profile.power.idle_w
        share = max(watts_cap - idle, 0.0) / max(profile.power.typical_w - idle, 1e-9)
        if unit.power_mode is None:
            decode = decode * share if decode else decode
            decode_full = decode_full * share if decode_full else decode_full
            prefill = prefill * share if prefill else prefill
    joules = watts / decode if watts and watts > 0 and decode else None
    return Prediction(
        weights_bytes=layout.total_bytes,
        kv_cache_bytes=kv_full,
        runtime_bytes=c.runtime_bytes,
        memory_bytes=memory,
        decode_tok_s=decode,
        decode_tok_s_full=decode_full,
        prefill_tok_s=prefill,
        watts=watts,
        joules_per_token=joules,
        basis=c.basis,
        why=why,
    )


def _per_second(seconds: float) -> float | None:
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
