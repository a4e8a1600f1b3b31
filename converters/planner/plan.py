"""The planner: for a model and a device, every (target, compute unit, format) with its
predicted memory, speed, power and quality loss; the ones that fit, ranked (``ranking``);
a pick; and a one-line reason for every rejection.

The targets are the registered ones the device profile lists; each says which of the
device's compute units it runs on, which formats it considers there and its first
estimates. Nothing here names a target.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from edgekit.converters.planner import calibration
from edgekit.converters.planner.candidates import Slot, candidate
from edgekit.converters.planner.fitting import fit
from edgekit.converters.planner.memory import KV_BYTES, attention_layers, kv_cache_bytes
from edgekit.converters.planner.predict import Unit, coefficients, units_for
from edgekit.converters.planner.ranking import rank, shortfall, summary
from edgekit.converters.planner.sources import (
    SourceQuantization,
    formats_for,
    source_notes,
    source_quantization,
)
from edgekit.converters.planner.values import (
    DEFAULT_CONTEXT,
    MAX_PARALLEL,
    NO_BUDGETS,
    Budgets,
    Candidate,
    ModeFigures,
    Plan,
)
from edgekit.targets.contract import Coefficients, Target
from edgekit.targets.registry import all_targets

from edgekit.devices import DeviceProfile, PowerMode, load_profile
from edgekit.errors import PlanError
from edgekit.inspection import inspect_model
from edgekit.modelspec import ModelSpec
from edgekit.probe import probe_host

MIB = 1 << 20


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


def profile_targets(profile: DeviceProfile) -> list[type[Target]]:
    """The registered targets ``profile`` lists, in its order."""
    registered = {t.name: t for t in all_targets()}
    return [registered[name] for name in profile.targets if name in registered]


def _window_notes(spec: ModelSpec, targets: list[type[Target]], context: int) -> list[str]:
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
    windowed = [t for t in targets if spec.family in t.kv_cache.windowed_families]
    for target in windowed:
        kv = kv_cache_bytes(spec, context, "f16", layout=target.kv_cache)
        notes.append(
            f"{layers.describe()}: {target.name} keeps only the window on those layers, "
            f"{kv / MIB:,.0f} MiB of f16 KV cache at ctx {context} instead of "
            f"{full / MIB:,.0f} MiB"
        )
    others = [t.name for t in targets if t not in windowed]
    if others:
        notes.append(
            f"{', '.join(others)}: the whole context on every layer (no windowed KV cache "
            f"for {spec.family}), {full / MIB:,.0f} MiB of f16 KV cache at ctx {context}"
        )
    return notes


def _check_budgets(spec: ModelSpec, budgets: Budgets) -> list[str]:
    if budgets.context < 1:
        raise PlanError(f"context {budgets.context} must be at least 1 token")
    if isinstance(budgets.parallel, bool) or not isinstance(budgets.parallel, int):
        raise PlanError(f"parallel {budgets.parallel!r} must be a whole number of streams")
    if not 1 <= budgets.parallel <= MAX_PARALLEL:
        raise PlanError(
            f"parallel {budgets.parallel} is out of range: 1 to {MAX_PARALLEL} streams",
            hint=f"plan at most {MAX_PARALLEL} streams decoded together",
        )
    if budgets.kv_cache not in KV_BYTES:
        raise PlanError(
            f"KV-cache type {budgets.kv_cache!r} is not known",
            hint=f"use one of {', '.join(KV_BYTES)}",
        )
    if budgets.context > spec.context_length:
        return [
            f"--ctx {budgets.context} is longer than the model's trained context "
            f"({spec.context_length}); quality past it is not assured"
        ]
    return []


def plan(
    spec: ModelSpec,
    profile: DeviceProfile,
    budgets: Budgets = NO_BUDGETS,
    *,
    calibrate_for: str | None = None,
) -> Plan:
    """Plan ``spec`` on ``profile`` within ``budgets``.

    ``calibrate_for`` is a calibration device key (``calibration.device_key``) whose
    stored samples refine the coefficients (the host, when planning for it).

    Raises:
        PlanError: a budget that cannot be met by construction (context < 1, an unknown
            KV-cache type), or a device with none of the targets edgekit knows.
    """
    notes = _check_budgets(spec, budgets)
    mode, mode_why = choose_power_mode(profile, budgets.watts)
    if mode is not None:
        notes.append(f"power mode {mode.name} ({mode_why}): {mode.note}".rstrip(": "))
    source = source_quantization(spec)
    targets = profile_targets(profile)
    notes += source_notes(source)
    notes += _window_notes(spec, targets, budgets.context)
    candidates: list[Candidate] = []
    for target in targets:
        units = units_for(profile, target, mode)
        if not units:
            notes.append(f"{target.name}: no compute unit of this device that it runs on")
        for unit in units:
            coeff = _calibrated(target, unit, spec, calibrate_for)
            slot = Slot(target=target, unit=unit, coefficients=coeff, mode=mode, source=source)
            for fmt in formats_for(target, profile, unit.accelerator, source):
                candidates.append(candidate(spec, profile, budgets, slot, fmt))
    if not candidates:
        raise PlanError(
            f"{profile.name}: none of its targets ({', '.join(profile.targets) or 'none'}) "
            "has a compute unit edgekit can plan for",
            hint="check the profile's targets and accelerators (edgekit profiles --json)",
        )
    ranked = _ranked(spec, profile, budgets, mode, candidates, notes)
    modes = _mode_figures(spec, profile, budgets, ranked, source, calibrate_for)
    return replace(ranked, power_modes=modes)


def _mode_figures(
    spec: ModelSpec,
    profile: DeviceProfile,
    budgets: Budgets,
    result: Plan,
    source: SourceQuantization | None,
    device: str | None,
) -> tuple[ModeFigures, ...]:
    """The plan's pick (else the best candidate) predicted under each power mode of the
    device: a Jetson's modes trade tokens/s for watts, and the pick is made in one."""
    pick = result.choice or result.best
    if pick is None or not profile.power.modes:
        return ()
    target = next(t for t in profile_targets(profile) if t.name == pick.target)
    figures = []
    for mode in profile.power.modes:
        unit = next(
            (
                u
                for u in units_for(profile, target, mode)
                if (u.accelerator.kind, u.accelerator.name) == (pick.unit, pick.unit_name)
            ),
            None,
        )
        if unit is None:  # (the pick's unit is the device's: always found)
            continue
        coeff = _calibrated(target, unit, spec, device)
        slot = Slot(target=target, unit=unit, coefficients=coeff, mode=mode, source=source)
        c = candidate(spec, profile, budgets, slot, pick.format)
        p = c.prediction
        figures.append(
            ModeFigures(
                mode=mode.name,
                max_w=mode.max_w,
                note=mode.note,
                decode_tok_s=p.decode_tok_s,
                prefill_tok_s=p.prefill_tok_s,
                watts=p.watts,
                joules_per_token=p.joules_per_token,
                fits=c.fits,
                chosen=mode.name == result.power_mode,
            )
        )
    return tuple(figures)


def _ranked(
    spec: ModelSpec,
    profile: DeviceProfile,
    budgets: Budgets,
    mode: PowerMode | None,
    candidates: list[Candidate],
    notes: list[str],
) -> Plan:
    fitting = sorted((c for c in candidates if c.fits), key=rank)
    rejected = sorted(
        (c for c in candidates if not c.fits), key=lambda c: c.prediction.memory_bytes
    )
    best = fitting[0] if fitting else None
    choice = next((c for c in fitting if c.buildable), None)
    if choice is not None and choice.build_note:  # a step of its build cannot run here
        notes = [*notes, f"{choice.label}: {choice.build_note}"]
    closest = None
    if choice is None and rejected:  # (all fit but none can be built: no closest)
        closest = min([c for c in rejected if c.buildable] or rejected, key=shortfall)
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
        summary=summary(choice, best, closest),
        notes=tuple(notes),
    )


def _calibrated(
    target: type[Target], unit: Unit, spec: ModelSpec, device: str | None
) -> Coefficients:
    prior = coefficients(target, unit, spec)
    if device is None:
        return prior
    kind = unit.accelerator.kind
    return fit(
        prior,
        calibration.samples(device, target.name, kind),
        bandwidth_gbps=unit.bandwidth_gbps,
        peak_tflops=unit.peak_tflops,
        vocab_term_bytes=target.vocab_runtime_bytes(kind, spec),
    )


def suggest_parallel(
    spec: ModelSpec,
    profile: DeviceProfile,
    budgets: Budgets = NO_BUDGETS,
    *,
    calibrate_for: str | None = None,
) -> int:
    """The most streams, up to ``MAX_SUGGESTED_PARALLEL`` (8), whose KV caches fit beside
    the plan's pick (its weights and runtime) at the plan's context, within the device's
    memory and ``budgets.memory_bytes``: the default of ``edgekit serve --parallel``. 0
    when nothing fits. For this host: ``profile, key = resolve_device("host")`` and
    ``calibrate_for=key``, as ``edgekit plan --device host`` plans.

    Raises:
        PlanError: as ``plan``.
    """
    planned = plan(spec, profile, with_budget_defaults(spec, budgets), calibrate_for=calibrate_for)
    return planned.parallel_suggested


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
    if device == "host":
        profile = probe_host(measure=True).profile
        return profile, calibration.device_key(profile)
    return load_profile(device), None


def plan_for(model: str | Path, device: str, budgets: Budgets = NO_BUDGETS) -> Plan:
    """Inspect ``model`` (a GGUF, a Hugging Face folder, or a folder or config.json
    describing one) and plan it on ``device`` (a profile name, a .toml file, or "host").

    Raises:
        ModelError, ProfileError, PlanError.
    """
    path = Path(model)
    spec = inspect_model(path.parent if path.name == "config.json" else path)
    profile, key = resolve_device(device)
    return plan(spec, profile, with_budget_defaults(spec, budgets), calibrate_for=key)
