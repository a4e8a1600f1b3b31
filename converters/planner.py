"""The planner: for a model and a device, every (target, compute unit, format) with its
predicted memory, speed, power and quality loss; the ones that fit, ranked; a pick; and a
one-line reason for every rejection.

Ranking among the candidates that meet every budget: the best quality tier first (mean KL
against the source: near lossless <= 0.01, small <= 0.05, moderate <= 0.15, large); within
a tier, from an already-quantized source, those that do not requantize it up (more bits
recover nothing of what its quantization lost); then candidates edgekit can build before
those it can only predict; then the fastest decode. When nothing fits, the plan names the
smallest option and how far it misses.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from edgekit.converters import calibration, quality
from edgekit.converters.gguf_formats import GGUF_FORMATS, QUANTIZED_FILE_TYPES
from edgekit.converters.layouts import (
    IntScheme,
    WeightLayout,
    gguf_layout,
    grouped_layout,
    openvino_layout,
)
from edgekit.converters.predict import (
    Coefficients,
    Prediction,
    Unit,
    coefficients,
    predict,
    units_for,
    vocab_term,
)

from edgekit.devices import GIB, DeviceProfile, PowerMode
from edgekit.errors import PlanError
from edgekit.memory_estimate import KV_BYTES, WINDOWED_KV, attention_layers, kv_cache_bytes
from edgekit.modelspec import ModelSpec

DEFAULT_CONTEXT = 4096
MIB = 1 << 20

# Formats the planner considers per target and unit kind, most precise first.
FORMATS: dict[tuple[str, str], tuple[str, ...]] = {
    ("llamacpp", "cpu"): ("F16", "Q8_0", "Q6_K", "Q5_K_M", "Q4_K_M", "Q4_0", "Q3_K_M", "Q2_K"),
    ("llamacpp", "gpu"): ("F16", "Q8_0", "Q6_K", "Q5_K_M", "Q4_K_M", "Q4_0", "Q3_K_M", "Q2_K"),
    ("openvino", "cpu"): ("F16", "INT8", "INT4"),
    ("openvino", "gpu"): ("F16", "INT8", "INT4"),
    # NPUs run symmetric channel-wise INT4 (openvino-genai NPU guide)
    ("openvino", "npu"): ("F16", "INT8", "INT4_SYM"),
    ("qnn", "npu"): ("INT8", "INT4"),
    ("mlx", "gpu"): ("F16", "8bit", "4bit"),
    ("tensorrt", "gpu"): ("F16", "INT8", "INT4"),
}
# Layouts of targets edgekit cannot build yet: what their usual tools write.
#   QNN (AI Hub / Genie style): W4A16 / W8A16, per-channel symmetric, f32 scales
#   MLX (mlx_lm.convert -q): group 64, f16 scale and bias per group, embeddings included
#   TensorRT-LLM (ModelOpt): INT8 weight-only per channel, INT4 AWQ group 128; embeddings
#   and lm_head stay F16
_FP16 = IntScheme(bits=16, group=-1, zero_point=False)
_GROUPED: dict[tuple[str, str], tuple[IntScheme, IntScheme | None, IntScheme | None]] = {
    ("qnn", "INT8"): (IntScheme(bits=8, group=-1, zero_point=False, scale_bytes=4), None, None),
    ("qnn", "INT4"): (
        IntScheme(bits=4, group=-1, zero_point=False, scale_bytes=4),
        IntScheme(bits=8, group=-1, zero_point=False, scale_bytes=4),
        IntScheme(bits=8, group=-1, zero_point=False, scale_bytes=4),
    ),
    ("mlx", "F16"): (_FP16, None, None),
    ("mlx", "8bit"): (IntScheme(bits=8, group=64, zero_point=False, bias_bytes=2), None, None),
    ("mlx", "4bit"): (IntScheme(bits=4, group=64, zero_point=False, bias_bytes=2), None, None),
    ("tensorrt", "F16"): (_FP16, None, None),
    ("tensorrt", "INT8"): (IntScheme(bits=8, group=-1, zero_point=False), _FP16, _FP16),
    ("tensorrt", "INT4"): (IntScheme(bits=4, group=128, zero_point=False), _FP16, _FP16),
}
# Quality of formats without a measurement, by the closest measured format.
_QUALITY_ANALOGY = {
    ("qnn", "INT8"): ("openvino", "INT8"),
    ("qnn", "INT4"): ("openvino", "INT4_SYM"),
    ("mlx", "8bit"): ("openvino", "INT8"),
    ("mlx", "4bit"): ("llamacpp", "Q4_0"),
    ("tensorrt", "INT8"): ("openvino", "INT8"),
    ("tensorrt", "INT4"): ("openvino", "INT4"),
}
TIERS = ((0.01, "near lossless"), (0.05, "small loss"), (0.15, "moderate loss"))
BUILDABLE_TARGETS = ("llamacpp", "openvino")


@dataclass(frozen=True, kw_only=True)
class Budgets:
    memory_bytes: int | None = None
    watts: float | None = None
    context: int = DEFAULT_CONTEXT
    min_decode_tok_s: float | None = None
    max_quality_loss: float | None = None  # mean KL, nats per token
    kv_cache: str = "f16"


@dataclass(frozen=True, kw_only=True)
class Candidate:
    target: str
    unit: str  # cpu, gpu, npu
    unit_name: str
    format: str
    power_mode: str | None
    prediction: Prediction
    memory_limit_bytes: int
    memory_limit_why: str
    quality_loss: float | None
    quality_source: str
    quality_tier: str
    buildable: bool
    build_note: str
    rejections: tuple[str, ...]
    storage: dict[str, int] = field(default_factory=dict)  # bytes per storage type
    # From an already-quantized source: more bits per weight than the source stores
    # (requantizing up recovers nothing of what the source's quantization lost).
    requantizes_up: bool = False
    quality_note: str = ""

    @property
    def fits(self) -> bool:
        return not self.rejections

    @property
    def label(self) -> str:
        return f"{self.target} {self.format} on {self.unit.upper()}"


@dataclass(frozen=True, kw_only=True)
class Plan:
    model: str
    family: str
    parameters: int
    parameters_source: str
    device: str
    device_display: str
    budgets: Budgets
    power_mode: str | None
    candidates: tuple[Candidate, ...]  # ranked fits first, then rejections by memory
    choice: Candidate | None  # the best candidate edgekit can build
    best: Candidate | None  # the best overall, buildable or not
    closest: Candidate | None  # when nothing fits: the smallest option
    summary: str
    notes: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        from dataclasses import asdict

        def cand(c: Candidate | None) -> dict[str, Any] | None:
            if c is None:
                return None
            data = asdict(c)
            data["fits"] = c.fits
            return data

        return {
            "model": self.model,
            "family": self.family,
            "parameters": self.parameters,
            "parameters_source": self.parameters_source,
            "device": self.device,
            "device_display": self.device_display,
            "budgets": asdict(self.budgets),
            "power_mode": self.power_mode,
            "summary": self.summary,
            "notes": list(self.notes),
            "choice": cand(self.choice),
            "best": cand(self.best),
            "closest": cand(self.closest),
            "candidates": [cand(c) for c in self.candidates],
        }


def layout_for(spec: ModelSpec, target: str, fmt: str) -> WeightLayout:
    if target == "llamacpp":
        if fmt == "F16" and spec.format != "gguf" and spec.dtype == "BF16":
            return gguf_layout(spec, "BF16")
        return gguf_layout(spec, fmt)
    if target == "openvino":
        return openvino_layout(spec, fmt)
    scheme, emb, out = _GROUPED[(target, fmt)]
    return grouped_layout(spec, target=target, fmt=fmt, scheme=scheme, embeddings=emb, output=out)


def expected_quality(target: str, fmt: str) -> tuple[float | None, str]:
    if fmt in ("F16", "F32", "BF16"):
        return 0.0, "lossless against the source"
    kl, source = quality.expected_kl(target, fmt)
    if kl is not None:
        return kl, source
    analog = _QUALITY_ANALOGY.get((target, fmt))
    if analog:
        kl, source = quality.expected_kl(*analog)
        if kl is not None:
            return kl, f"as {analog[0]} {analog[1]} ({source}): not measured for {target}"
    return None, "unknown"


def tier(kl: float | None) -> str:
    if kl is None:
        return "unknown"
    for limit, name in TIERS:
        if kl <= limit:
            return name
    return "large loss"


def _tier_rank(name: str) -> int:
    order = [n for _, n in TIERS] + ["large loss", "unknown"]
    return order.index(name)


def choose_power_mode(profile: DeviceProfile, watts: float | None) -> tuple[PowerMode | None, str]:
    """The fastest power mode within the budget (the default mode without one)."""
    modes = profile.power.modes
    if not modes:
        return None, ""
    if watts is None:
        default = next((m for m in modes if m.name == profile.power.default_mode), None)
        return default or modes[-1], "the default power mode"
    within = [m for m in modes if m.max_w <= watts]
    if not within:
        lowest = min(modes, key=lambda m: m.max_w)
        return (
            lowest,
            f"no power mode fits {watts:g} W; the lowest, {lowest.name}, allows {lowest.max_w:g} W",
        )
    best = max(within, key=lambda m: (m.compute_scale, m.bandwidth_gbps or 0, m.max_w))
    return best, f"the fastest mode within {watts:g} W"


def _limit_why(profile: DeviceProfile, unit: Unit, budgets: Budgets) -> tuple[int, str]:
    limit = unit.memory_bytes
    if budgets.memory_bytes is not None and budgets.memory_bytes < limit:
        return budgets.memory_bytes, "the --memory budget is"
    acc = unit.accelerator
    if acc.max_model_gib is not None and acc.max_model_gib * GIB <= limit:
        return limit, f"the {acc.name} maps at most"
    if acc.memory_gib:
        return limit, f"the {acc.name} has"
    if profile.kind == "phone":
        return limit, "the phone lets an app use about"
    if profile.os == "macos" or acc.runtime_device == "metal":
        return limit, "macOS lets the GPU use (working-set cap)"
    if profile.kind == "jetson":
        return limit, "the Jetson leaves a model (shared with the OS and CUDA)"
    return limit, "the device leaves a model"


def _buildable(spec: ModelSpec, target: str, fmt: str) -> tuple[bool, str]:
    if target not in BUILDABLE_TARGETS:
        return False, f"edgekit cannot build {target} bundles yet (prediction only)"
    if target == "openvino":
        from edgekit.converters.openvino_convert import EXPORTABLE

        if spec.family not in EXPORTABLE:
            return False, f"edgekit's OpenVINO export does not support {spec.family} yet"
    return True, ""


FLOAT_TYPES = ("F32", "F16", "BF16")


@dataclass(frozen=True, kw_only=True)
class SourceQuantization:
    """An already-quantized GGUF source: what its file type says and what its matrices
    really store."""

    file_type: str
    bits_per_weight: float  # over the matrices (norms and biases excluded)
    tensor_types: dict[str, str]  # tensor name -> ggml type


def _bits_per_weight(matrices: list[tuple[tuple[int, ...], int]]) -> float:
    weights = sum(_numel(shape) for shape, _ in matrices)
    return 8.0 * sum(nbytes for _, nbytes in matrices) / max(weights, 1)


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def source_quantization(spec: ModelSpec) -> SourceQuantization | None:
    """The quantization an already-quantized GGUF carries (None for float sources): any
    matrix stored in a block type means every format planned from it stacks on, or
    cannot undo, that quantization."""
    if spec.format != "gguf":
        return None
    matrices = [t for t in spec.tensors if len(t.shape) >= 2]
    if not any(t.dtype not in FLOAT_TYPES for t in matrices):
        return None
    counts: dict[str, int] = {}
    for t in matrices:
        counts[t.dtype] = counts.get(t.dtype, 0) + t.nbytes
    return SourceQuantization(
        file_type=spec.file_type or max(counts, key=lambda k: counts[k]),
        bits_per_weight=_bits_per_weight([(t.shape, t.nbytes) for t in matrices]),
        tensor_types={t.name: t.dtype for t in spec.tensors},
    )


def _layout_bits(layout: WeightLayout) -> float:
    return _bits_per_weight([(t.shape, t.nbytes) for t in layout.tensors if t.role != "vector"])


def _copies_source(layout: WeightLayout, source: SourceQuantization) -> bool:
    """llama.cpp's quantizer copies a tensor that already has the type it would choose
    (llama-quant.cpp: ``quantize = cur_type != new_type``): when that holds for every
    tensor, the "conversion" is the source file itself."""
    return layout.target == "llamacpp" and all(
        source.tensor_types.get(t.name) == t.storage for t in layout.tensors
    )


def formats_for(target: str, kind: str, source: SourceQuantization | None) -> tuple[str, ...]:
    """The formats planned for a target and unit, most bits first; from an
    already-quantized GGUF, the source's own llama.cpp file type too (kept as it is, it
    loses nothing more)."""
    formats = FORMATS.get((target, kind), ())
    if target != "llamacpp" or source is None:
        return formats
    own = source.file_type
    if own not in QUANTIZED_FILE_TYPES or own in formats:
        return formats
    return tuple(sorted((*formats, own), key=lambda f: -GGUF_FORMATS[f].bits_per_weight))


def _source_notes(source: SourceQuantization | None) -> list[str]:
    if source is None:
        return []
    return [
        f"the source is already {source.file_type} ({source.bits_per_weight:.1f} bits per "
        "weight): quality figures are losses against that file, not against the original "
        f"model. Formats that store more bits recover nothing of what {source.file_type} "
        "lost and only cost memory: within a quality tier they rank after those that do "
        "not. Quantize from the F16/BF16/F32 original when you have it"
    ]


def _window_notes(spec: ModelSpec, profile: DeviceProfile, context: int) -> list[str]:
    layers = attention_layers(spec)
    if spec.sliding_window is None:
        return []
    if not layers.windowed:
        return [
            f"the model sets a {spec.sliding_window}-token sliding window, but no runtime "
            f"edgekit plans for keeps only the window for {spec.family}: the KV cache is "
            "counted for the whole context on every layer"
        ]
    full = kv_cache_bytes(spec, context, "f16")
    notes = []
    for target in profile.targets:
        if spec.family in WINDOWED_KV.get(target, ()):
            kv = kv_cache_bytes(spec, context, "f16", target=target)
            notes.append(
                f"{layers.describe()}: {target} keeps only the window on those layers, "
                f"{kv / MIB:,.0f} MiB of f16 KV cache at ctx {context} instead of "
                f"{full / MIB:,.0f} MiB"
            )
    others = [t for t in profile.targets if spec.family not in WINDOWED_KV.get(t, ())]
    if others:
        notes.append(
            f"{', '.join(others)}: the whole context on every layer (no windowed KV cache "
            f"for {spec.family}), {full / MIB:,.0f} MiB of f16 KV cache at ctx {context}"
        )
    return notes


def plan(
    spec: ModelSpec,
    profile: DeviceProfile,
    budgets: Budgets = Budgets(),
    *,
    calibrate_for: str | None = None,
) -> Plan:
    """Plan ``spec`` on ``profile`` within ``budgets``.

    ``calibrate_for`` is a calibration device key (``calibration.device_key``) whose
    benchmark samples refit the coefficients: pass it when ``profile`` is this host.

    Raises:
        PlanError: a budget that cannot be met by construction (context < 1, an unknown
            KV-cache type), or a device with none of the targets edgekit knows.
    """
    if budgets.context < 1:
        raise PlanError(f"context {budgets.context} must be at least 1 token")
    if budgets.kv_cache not in KV_BYTES:
        raise PlanError(
            f"KV-cache type {budgets.kv_cache!r} is not known",
            hint=f"use one of {', '.join(KV_BYTES)}",
        )
    notes: list[str] = []
    if budgets.context > spec.context_length:
        notes.append(
            f"--ctx {budgets.context} is longer than the model's trained context "
            f"({spec.context_length}); quality past it is not assured"
        )
    mode, mode_why = choose_power_mode(profile, budgets.watts)
    if mode is not None:
        notes.append(f"power mode {mode.name} ({mode_why}): {mode.note}".rstrip(": "))
    source = source_quantization(spec)
    notes += _source_notes(source)
    notes += _window_notes(spec, profile, budgets.context)
    candidates: list[Candidate] = []
    for target in profile.targets:
        units = units_for(profile, target, mode)
        if not units:
            notes.append(f"{target}: no compute unit of this device that it runs on")
            continue
        for unit in units:
            kind = unit.accelerator.kind
            prior = coefficients(target, unit, spec)
            coeff = _calibrated(prior, target, kind, unit, spec, calibrate_for)
            for fmt in formats_for(target, kind, source):
                candidates.append(
                    _candidate(spec, profile, budgets, target, unit, fmt, coeff, mode, source)
                )
    if not candidates:
        raise PlanError(
            f"{profile.name}: none of its targets ({', '.join(profile.targets) or 'none'}) "
            "has a compute unit edgekit can plan for",
            hint="check the profile's targets and accelerators (edgekit profiles --json)",
        )
    fitting = sorted((c for c in candidates if c.fits), key=_rank)
    rejected = sorted(
        (c for c in candidates if not c.fits), key=lambda c: c.prediction.memory_bytes
    )
    best = fitting[0] if fitting else None
    choice = next((c for c in fitting if c.buildable), None)
    closest = None
    if choice is None:
        buildable = [c for c in rejected if c.buildable] or rejected
        closest = min(buildable, key=lambda c: _shortfall(c))
    return Plan(
        model=spec.name or spec.path,
        family=spec.family,
        parameters=spec.parameters,
        parameters_source=spec.parameters_source,
        device=profile.name,
        device_display=profile.display_name,
        budgets=budgets,
        power_mode=mode.name if mode else None,
        candidates=tuple(fitting + rejected),
        choice=choice,
        best=best,
        closest=closest,
        summary=_summary(choice, best, closest),
        notes=tuple(notes),
    )


def _shortfall(c: Candidate) -> tuple[int, int]:
    """How far a rejected candidate misses: memory first (the hard limit), then count."""
    over = max(c.prediction.memory_bytes - c.memory_limit_bytes, 0)
    return over, len(c.rejections)


def _rank(c: Candidate) -> tuple[int, int, int, float]:
    """Quality tier, then (from a quantized source) the candidates that do not spend bits
    the source does not have, then buildable, then decode speed."""
    return (
        _tier_rank(c.quality_tier),
        1 if c.requantizes_up else 0,
        0 if c.buildable else 1,
        -(c.prediction.decode_tok_s or 0),
    )


def _calibrated(
    prior: Coefficients,
    target: str,
    kind: str,
    unit: Unit,
    spec: ModelSpec,
    device: str | None,
) -> Coefficients:
    if device is None:
        return prior
    return calibration.fit(
        prior,
        calibration.samples(device, target, kind),
        bandwidth_gbps=unit.bandwidth_gbps,
        peak_tflops=unit.peak_tflops,
        vocab_term_bytes=vocab_term(target, kind, spec),
    )


def _candidate(
    spec: ModelSpec,
    profile: DeviceProfile,
    budgets: Budgets,
    target: str,
    unit: Unit,
    fmt: str,
    coeff: Coefficients,
    mode: PowerMode | None,
    source: SourceQuantization | None = None,
) -> Candidate:
    layout = layout_for(spec, target, fmt)
    acc = unit.accelerator
    context = budgets.context
    pred = predict(
        spec,
        layout,
        unit,
        coeff,
        profile,
        context=context,
        kv_type=budgets.kv_cache,
        watts_cap=budgets.watts,
    )
    limit, why = _limit_why(profile, unit, budgets)
    kl, kl_source = expected_quality(target, fmt)
    up, quality_note = False, ""
    if source is not None:
        kl, kl_source, up, quality_note = _from_quantized_source(layout, source, kl, kl_source)
    reasons: list[str] = []
    name = f"{target} {fmt}"
    if pred.memory_bytes > limit:
        reasons.append(
            f"{name} needs {pred.memory_bytes / GIB:.2f} GiB at ctx {context}; {why} "
            f"{limit / GIB:.2f} GiB"
        )
    if acc.max_prompt_tokens is not None and context > acc.max_prompt_tokens:
        reasons.append(
            f"the {acc.name} compiles a static prompt of at most {acc.max_prompt_tokens} "
            f"tokens; --ctx {context} is longer"
        )
    if budgets.watts is not None and budgets.watts < profile.power.idle_w:
        reasons.append(
            f"the device draws ~{profile.power.idle_w:g} W idle, above the {budgets.watts:g} W "
            "budget"
        )
    elif mode is not None and budgets.watts is not None and mode.max_w > budgets.watts:
        reasons.append(
            f"the lowest power mode, {mode.name}, allows {mode.max_w:g} W, above the "
            f"{budgets.watts:g} W budget"
        )
    if budgets.min_decode_tok_s is not None:
        if pred.decode_tok_s is None:
            reasons.append(f"{name}: no decode prediction (the profile has no bandwidth figure)")
        elif pred.decode_tok_s < budgets.min_decode_tok_s:
            reasons.append(
                f"{name} decodes ~{pred.decode_tok_s:.1f} tok/s, below --min-tps "
                f"{budgets.min_decode_tok_s:g}"
            )
    if budgets.max_quality_loss is not None:
        if kl is None:
            reasons.append(
                f"{name}: no quality figure to hold to --max-quality-loss; run edgekit eval"
            )
        elif kl > budgets.max_quality_loss:
            reasons.append(
                f"{name} loses ~{kl:.3f} nats/token ({kl_source}), more than --max-quality-loss "
                f"{budgets.max_quality_loss:g}"
            )
    buildable, build_note = _buildable(spec, target, fmt)
    return Candidate(
        target=target,
        unit=acc.kind,
        unit_name=acc.name,
        format=fmt,
        power_mode=mode.name if mode else None,
        prediction=pred,
        memory_limit_bytes=limit,
        memory_limit_why=why,
        quality_loss=kl,
        quality_source=kl_source,
        quality_tier=tier(kl),
        buildable=buildable,
        build_note=build_note,
        rejections=tuple(reasons),
        storage=layout.by_storage(),
        requantizes_up=up,
        quality_note=quality_note,
    )


def _from_quantized_source(
    layout: WeightLayout, source: SourceQuantization, kl: float | None, kl_source: str
) -> tuple[float | None, str, bool, str]:
    """(expected loss, where it comes from, requantizes up, note) of ``layout`` built from
    an already-quantized source. Kept as it is, the source loses nothing more; any other
    format is judged against the source file, and one with more bits than the source is
    marked: it recovers nothing of what the source's quantization lost."""
    name = source.file_type
    if _copies_source(layout, source):
        return 0.0, f"the {name} source as it is (llama.cpp copies every tensor)", False, ""
    where = (
        f"lossless against the {name} source (not the original model)"
        if kl == 0.0
        else f"{kl_source}; against the {name} source, not the original model"
    )
    bits = _layout_bits(layout)
    if bits <= source.bits_per_weight * 1.01:
        return kl, where, False, ""
    note = (
        f"requantizes up: {bits:.1f} bits per weight from a {source.bits_per_weight:.1f}-bit "
        f"{name} source, recovering nothing of what {name} lost"
    )
    return kl, where, True, note


# Table columns both `edgekit plan` and the TUI's Plan tab show (each adds one of its own).
COLUMNS = ("", "target", "unit", "format", "GiB", "decode", "prefill", "W", "J/tok", "KL")
TEXT_COLUMNS = ("", "target", "unit", "format")


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


def describe(c: Candidate) -> str:
    """One line: what it costs and what it gives."""
    p = c.prediction
    parts = [f"{p.memory_bytes / GIB:.2f} GiB of {c.memory_limit_bytes / GIB:.2f} GiB"]
    if p.decode_tok_s:
        parts.append(f"~{p.decode_tok_s:.1f} tok/s decode")
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


def _summary(choice: Candidate | None, best: Candidate | None, closest: Candidate | None) -> str:
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


def with_budget_defaults(spec: ModelSpec, budgets: Budgets) -> Budgets:
    """The default context is 4096 tokens or the model's own, whichever is shorter."""
    if budgets.context == DEFAULT_CONTEXT and spec.context_length < DEFAULT_CONTEXT:
        return replace(budgets, context=spec.context_length)
    return budgets


def resolve_device(device: str) -> tuple[DeviceProfile, str | None]:
    """A shipped profile, a profile file, or "host" (probed, with its memory bandwidth
    measured). Returns the profile and, for the host, its calibration key.

    Raises:
        ProfileNotFoundError, ProfileSchemaError: from loading a profile.
    """
    from edgekit.devices import load_profile

    if device == "host":
        from edgekit.probe import probe_host

        profile = probe_host(measure=True).profile
        return profile, calibration.device_key(profile)
    return load_profile(device), None


def plan_for(model: str | Path, device: str, budgets: Budgets = Budgets()) -> Plan:
    """Inspect ``model`` (a GGUF, a Hugging Face folder, or a folder or config.json
    describing one) and plan it on ``device`` (a profile name, a .toml file, or "host").

    Raises:
        ModelError, ProfileError, PlanError.
    """
    from edgekit.inspection import inspect_model

    path = Path(model)
    spec = inspect_model(path.parent if path.name == "config.json" else path)
    profile, key = resolve_device(device)
    return plan(spec, profile, with_budget_defaults(spec, budgets), calibrate_for=key)


_SIZE_UNITS = {"": 1e9, "b": 1, "kb": 1e3, "mb": 1e6, "gb": 1e9, "tb": 1e12}
_SIZE_UNITS.update({"kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40})


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


def variant_request(result: Plan, *, recipe: str | None = None) -> Any:
    """The ``edgekit.bundle.VariantRequest`` that packs the plan's pick, carrying its
    predictions into the manifest.

    Raises:
        PlanError: nothing edgekit can build fits (the message says what came closest).
    """
    from edgekit.bundle import VariantRequest
    from edgekit.manifest import Figures

    c = result.choice
    if c is None:
        raise PlanError(
            f"no variant to pack for {result.device}: {result.summary}",
            hint="loosen a budget (--memory, --ctx, --min-tps, --max-quality-loss) or pick "
            "a larger device",
        )
    p = c.prediction
    options = [o for o in (recipe or "").split(",") if o.strip()]
    if not any(o.strip().startswith("kv_cache") for o in options):
        options.append(f"kv_cache={result.budgets.kv_cache}")
    return VariantRequest(
        target=c.target,
        quant=c.format,
        recipe=",".join(options),
        context=result.budgets.context,
        predicted=Figures(
            memory_bytes=p.memory_bytes,
            prefill_tok_s=p.prefill_tok_s,
            decode_tok_s=p.decode_tok_s,
            watts=p.watts,
            joules_per_token=p.joules_per_token,
            source=f"edgekit plan for {result.device} ({p.basis}, {c.unit.upper()})",
        ),
    )
