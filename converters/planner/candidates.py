"""One candidate: a target, a compute unit and a format, predicted and held to the
budgets and the device's limits, with a one-line reason for every budget it misses."""

from __future__ import annotations

from dataclasses import dataclass

from edgekit.converters.layouts import WeightLayout, tensor_layer
from edgekit.converters.planner import quality
from edgekit.converters.planner.memory import stream_runtime_bytes, streams_that_fit
from edgekit.converters.planner.predict import Prediction, Unit, predict
from edgekit.converters.planner.ranking import tier
from edgekit.converters.planner.sources import SourceQuantization, from_quantized_source
from edgekit.converters.planner.values import MAX_SUGGESTED_PARALLEL, Budgets, Candidate
from edgekit.targets.contract import Coefficients, Target

from edgekit.devices import GIB, DeviceProfile, PowerMode
from edgekit.errors import EdgekitError
from edgekit.modelspec import ModelSpec


@dataclass(frozen=True, kw_only=True)
class Slot:
    """Where candidates are planned: one compute unit of one target, its coefficients,
    the power mode and the source's quantization (None for a float source)."""

    target: type[Target]
    unit: Unit
    coefficients: Coefficients
    mode: PowerMode | None
    source: SourceQuantization | None


def expected_quality(target: type[Target], fmt: str) -> tuple[float | None, str]:
    """The expected mean KL of ``fmt`` on ``target`` and where it comes from."""
    quant = target.format.quant(fmt)
    if quant is not None and quant.lossless:
        return 0.0, "lossless against the source"
    return quality.expected_kl(target.name, fmt)


def limit_why(
    profile: DeviceProfile, unit: Unit, budgets: Budgets, target: type[Target]
) -> tuple[int, str, str]:
    """The memory a model may use on ``unit``, the words that say whose limit it is, and
    how to raise it ("" when the words say enough): the device's limit, or the target's
    own below it (``Target.memory_cap``: mlx-lm keeps a model within 0.9 of Metal's
    working set)."""
    limit, why = _device_limit(profile, unit, budgets)
    cap = target.memory_cap(profile, unit.accelerator.kind, limit)
    if cap is None or cap.bytes >= limit:
        return limit, why, ""
    return cap.bytes, f"{why} {limit / GIB:.2f} GiB; {cap.why} is", cap.hint


def _device_limit(profile: DeviceProfile, unit: Unit, budgets: Budgets) -> tuple[int, str]:
    limit = unit.memory_bytes
    if budgets.memory_bytes is not None and budgets.memory_bytes < limit:
        return budgets.memory_bytes, "the --memory budget is"
    acc = unit.accelerator
    # the unit's memory is the accelerator's mapping limit (not for a build that splits)
    if acc.max_model_gib is not None and int(acc.max_model_gib * GIB) == limit:
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


def buildable(spec: ModelSpec, target: type[Target], unit_kind: str, fmt: str) -> tuple[bool, str]:
    """Whether edgekit can build ``spec`` in ``fmt`` for ``target`` to run on a
    ``unit_kind`` unit, and why not (when it can: what of that build cannot run on this
    host, if anything). A format edgekit sizes but does not build (``quant_not_built``:
    a quantization that needs a GPU calibration step) is prediction-only with its reason."""
    if not (target.runs and target.format.buildable):
        return False, f"edgekit cannot build {target.name} bundles yet (prediction only)"
    support = target.unit(unit_kind)
    if support is not None and support.not_built:
        return False, support.not_built
    why = target.format.quant_not_built(fmt) or target.format.cannot_build(spec)
    return (False, why) if why else (True, target.build_note(unit_kind))


def candidate(
    spec: ModelSpec, profile: DeviceProfile, budgets: Budgets, slot: Slot, fmt: str
) -> Candidate:
    """``fmt`` on ``slot``: predicted, judged for quality and held to every budget."""
    target, unit = slot.target, slot.unit
    layout = target.format.layout(spec, fmt)
    pred = predict(
        spec,
        layout,
        target,
        unit,
        slot.coefficients,
        profile,
        context=budgets.context,
        kv_type=budgets.kv_cache,
        watts_cap=budgets.watts,
        parallel=budgets.parallel,
    )
    limit, why, hint = limit_why(profile, unit, budgets, target)
    suggested = streams_that_fit(
        pred.weights_bytes,
        pred.kv_cache_bytes,
        slot.coefficients,
        limit,
        stream_bytes=stream_runtime_bytes(spec),
        most=MAX_SUGGESTED_PARALLEL,
    )
    kl, kl_source = expected_quality(target, fmt)
    up, quality_note = False, ""
    if slot.source is not None:
        judged = from_quantized_source(layout, slot.source, target, kl, kl_source)
        kl, kl_source = judged.kl, judged.source
        up, quality_note = judged.requantizes_up, judged.note
    reasons = _memory_and_device(f"{target.name} {fmt}", pred, (limit, why, hint), unit, budgets)
    reasons += _parts(f"{target.name} {fmt}", layout, target, unit)
    reasons += _power(profile, slot.mode, budgets)
    reasons += _speed_and_quality(f"{target.name} {fmt}", pred, kl, kl_source, budgets)
    can_build, build_note = buildable(spec, target, unit.accelerator.kind, fmt)
    build_recipe = ""
    try:
        build_recipe = target.build_recipe(profile, unit.accelerator)
    except EdgekitError as exc:  # no build for this unit of this device
        can_build, build_note = False, exc.message
    return Candidate(
        target=target.name,
        unit=unit.accelerator.kind,
        unit_name=unit.accelerator.name,
        format=fmt,
        power_mode=slot.mode.name if slot.mode else None,
        prediction=pred,
        memory_limit_bytes=limit,
        memory_limit_why=why,
        quality_loss=kl,
        quality_source=kl_source,
        quality_tier=tier(kl),
        buildable=can_build,
        build_note=build_note,
        rejections=tuple(reasons),
        storage=layout.by_storage(),
        requantizes_up=up,
        quality_note=quality_note,
        build_recipe=build_recipe,
        parallel_suggested=suggested,
    )


def _memory_and_device(
    name: str,
    pred: Prediction,
    limit_words: tuple[int, str, str],
    unit: Unit,
    budgets: Budgets,
) -> list[str]:
    reasons = []
    context = budgets.context
    limit, why, hint = limit_words
    streams = f" x {budgets.parallel} streams" if budgets.parallel > 1 else ""
    if pred.memory_bytes > limit:
        reasons.append(
            f"{name} needs {pred.memory_bytes / GIB:.2f} GiB at ctx {context}{streams}; {why} "
            f"{limit / GIB:.2f} GiB" + (f" ({hint})" if hint else "")
        )
    acc = unit.accelerator
    if acc.max_prompt_tokens is not None and context > acc.max_prompt_tokens:
        reasons.append(
            f"the {acc.name} compiles a static prompt of at most {acc.max_prompt_tokens} "
            f"tokens; --ctx {context} is longer"
        )
    return reasons


def _parts(name: str, layout: WeightLayout, target: type[Target], unit: Unit) -> list[str]:
    """A build that splits the model (``UnitSupport.splits_model``) cannot split a layer:
    the largest one must fit the accelerator's per-session limit."""
    acc = unit.accelerator
    support = target.unit(acc.kind)
    if acc.max_model_gib is None or support is None or not support.splits_model:
        return []
    per_layer: dict[int, int] = {}
    for t in layout.tensors:
        layer = tensor_layer(t.name)
        if layer is not None:
            per_layer[layer] = per_layer.get(layer, 0) + t.nbytes
    largest = max(per_layer.values(), default=0)
    if largest <= acc.max_model_gib * GIB:
        return []
    return [
        f"{name}: one layer weighs {largest / GIB:.2f} GiB; the {acc.name} maps at most "
        f"{acc.max_model_gib:g} GiB per part"
    ]


def _power(profile: DeviceProfile, mode: PowerMode | None, budgets: Budgets) -> list[str]:
    watts = budgets.watts
    if watts is not None and watts < profile.power.idle_w:
        return [f"the device draws ~{profile.power.idle_w:g} W idle, above the {watts:g} W budget"]
    if mode is not None and watts is not None and mode.max_w > watts:
        return [
            f"the lowest power mode, {mode.name}, allows {mode.max_w:g} W, above the "
            f"{watts:g} W budget"
        ]
    return []


def _speed_and_quality(
    name: str, pred: Prediction, kl: float | None, kl_source: str, budgets: Budgets
) -> list[str]:
    reasons = []
    if budgets.min_decode_tok_s is not None:
        # with several streams, what each one gets is what a user waits on
        rate, each = pred.decode_tok_s, ""
        if budgets.parallel > 1:
            rate, each = pred.decode_tok_s_per_stream, f" per stream at {budgets.parallel} streams"
        if rate is None:
            reasons.append(f"{name}: no decode prediction (the profile has no bandwidth figure)")
        elif rate < budgets.min_decode_tok_s:
            reasons.append(
                f"{name} decodes ~{rate:.1f} tok/s{each}, below --min-tps "
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
    return reasons
