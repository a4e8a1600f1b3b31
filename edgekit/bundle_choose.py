"""Which variant of a bundle ``edgekit.load`` runs: the one asked for, or the
highest-quality one whose target runs here and that fits the memory available.

Memory is admitted by ``edgekit.converters.planner.admission.load_fit``, the predictor
``edgekit plan`` uses for the same variant, calibrated by this host's benchmarks as
``edgekit plan --device host`` is, so load and plan agree on what fits. A variant whose
memory cannot be predicted (a quantization its format does not list) is loaded only
when asked for by name or forced; choosing on its own, load skips it. A load of
``parallel`` streams (continuous batching) is admitted for that many KV caches of the
context; ``variant_parallel`` says how many a variant could hold here.
"""

from __future__ import annotations

from edgekit.bundle_open import verify_variants
from edgekit.converters.planner.admission import Fit, load_fit, load_streams, load_unit
from edgekit.converters.planner.calibration import this_host_key
from edgekit.converters.planner.values import MAX_SUGGESTED_PARALLEL
from edgekit.errors import (
    InsufficientMemoryError,
    ModelError,
    NoUsableVariantError,
    TargetError,
    UnsupportedConversionError,
)
from edgekit.inspection import inspect_model
from edgekit.manifest import OpenedBundle, Variant
from edgekit.modelspec import ModelSpec
from edgekit.targets.availability import target_status
from edgekit.targets.contract import Target
from edgekit.targets.registry import get_target

GB = 1e9
UNKNOWN_BITS = 16.0  # a quantization the target's format does not list: ranked as float


def unit_kind(target: type[Target], device: str) -> str:
    """The compute unit ``device`` (edgekit.load's argument: auto, cpu, gpu, NPU, GPU.1,
    ...) puts ``target`` on, as the planner names units."""
    return load_unit(target, device.lower().split(".", 1)[0])


def quality_rank(target: type[Target], quant: str) -> float:
    """Bits per weight of a quantization: more bits, less loss."""
    q = target.format.quant(quant)
    return q.bits_per_weight if q is not None else UNKNOWN_BITS


def variant_fit(
    opened: OpenedBundle,
    variant: Variant,
    *,
    available_bytes: int,
    context: int | None = None,
    device: str = "auto",
    calibrate_for: str | None = None,
    parallel: int = 1,
) -> Fit:
    """Whether ``variant`` at ``context`` (default: its runtime setting) with ``parallel``
    streams fits in ``available_bytes`` on the unit ``device`` selects, and what it is
    predicted to take (refitted to the benchmarks of ``calibrate_for``, a calibration
    device key, if given).

    Raises:
        BundleIntegrityError: the variant's files are missing or of the wrong size.
        TargetError: the variant's target is not installed.
        UnsupportedConversionError: the variant's quantization is not one its format
            lists, so its memory cannot be predicted.
    """
    spec, target, unit = _built(opened, variant, device)
    return load_fit(
        spec,
        target,
        variant.quant,
        context=context or variant.runtime.context,
        kv_cache=variant.runtime.kv_cache,
        available_bytes=available_bytes,
        unit_kind=unit,
        calibrate_for=calibrate_for,
        cap=target.host_memory_cap(unit),
        parallel=parallel,
    )


def variant_parallel(
    opened: OpenedBundle,
    variant: Variant,
    *,
    available_bytes: int,
    context: int | None = None,
    device: str = "auto",
    most: int = MAX_SUGGESTED_PARALLEL,
) -> int:
    """The most streams, 0 to ``most``, of ``variant`` whose KV caches of ``context``
    (default: its runtime setting) fit ``available_bytes`` beside its weights and runtime
    on the unit ``device`` selects, calibrated for this host as load's admission is: the
    default of ``edgekit serve --parallel``. 0: not even one.

    Raises:
        BundleIntegrityError, TargetError, UnsupportedConversionError: as ``variant_fit``.
    """
    spec, target, unit = _built(opened, variant, device)
    return load_streams(
        spec,
        target,
        variant.quant,
        context=context or variant.runtime.context,
        kv_cache=variant.runtime.kv_cache,
        available_bytes=available_bytes,
        unit_kind=unit,
        most=most,
        calibrate_for=this_host_key(),
        cap=target.host_memory_cap(unit),
    )


def _built(
    opened: OpenedBundle, variant: Variant, device: str
) -> tuple[ModelSpec, type[Target], str]:
    """``variant``'s files checked (sizes), read as a model, with its target and the unit
    ``device`` selects: what both admission figures start from."""
    verify_variants(opened.folder, (variant,), checksums=False)
    target = get_target(variant.target)
    return inspect_model(opened.variant_path(variant)), target, unit_kind(target, device)


def _candidates(
    opened: OpenedBundle, requested: str | None, runnable: set[str], device: str
) -> list[Variant]:
    """The requested variant, or every runnable one, highest quality first (a variant
    built for other hardware, such as an HTP context binary, is not a candidate: its
    target's ``variant_runs_here`` says why).

    Raises:
        NoUsableVariantError: the requested variant's (or every variant's) target cannot
            run here.
    """
    manifest = opened.manifest
    if requested is not None:
        chosen = manifest.variant(requested)
        if chosen.target not in runnable:
            raise NoUsableVariantError(
                f"variant {chosen.name} needs target {chosen.target!r}, which cannot run "
                f"here: {_why_not_here(chosen.target)}",
                hint="run `edgekit probe` to see the usable targets",
            )
        return [chosen]
    elsewhere: dict[str, str] = {}
    for v in manifest.variants:
        if v.target in runnable:
            try:
                why = get_target(v.target).variant_runs_here(opened.variant_path(v), device)
            except ModelError as exc:  # a variant its target cannot read is no candidate
                why = exc.message
            if why:
                elsewhere[v.name] = why
    candidates = sorted(
        (v for v in manifest.variants if v.target in runnable and v.name not in elsewhere),
        key=lambda v: quality_rank(get_target(v.target), v.quant),
        reverse=True,
    )
    if not candidates:
        targets = ", ".join(sorted({v.target for v in manifest.variants}))
        absent = sorted({v.target for v in manifest.variants} - runnable)
        reasons = "".join(f"; {name}: {why}" for name, why in elsewhere.items())
        reasons += "".join(f"; {name} cannot run here: {_why_not_here(name)}" for name in absent)
        raise NoUsableVariantError(
            f"no variant of {manifest.name} can run here (it has {targets}){reasons}",
            hint="each variant above says why: pack one for this host (or repack a damaged one)"
            if elsewhere
            else "install the target's extra, or pack a variant for a target this host has",
        )
    return candidates


def _why_not_here(name: str) -> str:
    """Why the target ``name`` cannot run on this host, as its SDK says it (imports the
    SDK: load calls this only after it found the target unusable)."""
    try:
        return target_status(get_target(name)).detail
    except TargetError as exc:  # not a registered target
        return exc.message


def choose_variant(
    opened: OpenedBundle,
    *,
    requested: str | None,
    available_bytes: int,
    runnable: set[str],
    context: int | None = None,
    device: str = "auto",
    force: bool = False,
    parallel: int = 1,
) -> Variant:
    """The requested variant, or the highest-quality one this host can run and hold
    with ``parallel`` streams (each a KV cache of the context).

    ``runnable``: the names of the targets usable here.

    Raises:
        NoUsableVariantError: no variant's target is installed and usable here, or no
            variant's memory can be predicted (and none was asked for or forced).
        InsufficientMemoryError: the chosen (or every) variant is predicted not to fit;
            the message says by how much and which smaller variant would fit.
    """
    candidates = _candidates(opened, requested, runnable, device)
    key = this_host_key()
    fits: list[tuple[Variant, Fit]] = []
    unpredictable: list[str] = []
    for v in candidates:
        try:
            fit = variant_fit(
                opened,
                v,
                available_bytes=available_bytes,
                context=context,
                device=device,
                calibrate_for=key,
                parallel=parallel,
            )
        except UnsupportedConversionError as exc:
            if force or requested is not None:
                return v  # asked for: the load itself says whether it runs
            unpredictable.append(f"{v.name}: {exc.message}")
            continue
        if fit.fits or force:
            return v
        fits.append((v, fit))
    if not fits:
        raise NoUsableVariantError(
            f"no variant of {opened.manifest.name} has a memory edgekit can predict ("
            + "; ".join(unpredictable)
            + ")",
            hint="load one by name (variant=...) or with force=True (--force)",
        )
    raise _too_large(
        opened, *fits[0], runnable, available_bytes, context, device, key, parallel=parallel
    )


def _too_large(
    opened: OpenedBundle,
    variant: Variant,
    fit: Fit,
    runnable: set[str],
    available_bytes: int,
    context: int | None,
    device: str,
    key: str | None,
    *,
    parallel: int = 1,
) -> InsufficientMemoryError:
    """The refusal of ``variant``: by how much it is short, and what would fit instead
    (fewer streams of it, first, when several were asked for)."""
    fitting = []
    for o in opened.manifest.variants:
        if o.target not in runnable:
            continue
        try:
            f = variant_fit(
                opened,
                o,
                available_bytes=available_bytes,
                context=context,
                device=device,
                calibrate_for=key,
                parallel=parallel,
            )
        except UnsupportedConversionError:
            continue  # not suggested: its memory cannot be predicted
        if f.fits:
            fitting.append((o.name, f.memory_bytes))
    fewer = 0
    if parallel > 1:
        fewer = variant_parallel(
            opened,
            variant,
            available_bytes=available_bytes,
            context=context,
            device=device,
            most=parallel - 1,
        )
    options = [f"parallel={fewer} would fit"] if fewer else []
    if fitting:
        options.append(f"variant {fitting[0][0]} ({fitting[0][1] / GB:.2f} GB) would fit")
    suggestion = "; or ".join(options) or (
        f"{_smaller_formats(variant)} or a shorter context would be needed"
    )
    need, limit = fit.memory_bytes, fit.limit_bytes
    streams = f" for {parallel} streams" if parallel > 1 else ""
    whose = f" ({fit.cap_why})" if fit.cap_why else ""
    # the target holds a load to its own cap too (a Mac's working set: past it the GPU
    # swaps or faults), so force does not get past it: raising the cap does
    then = f"; or {fit.cap_hint}" if fit.cap_hint else "; force=True (--force) loads it anyway"
    return InsufficientMemoryError(
        f"variant {variant.name} needs {need / GB:.2f} GB (predicted){streams}; this host has "
        f"{limit / GB:.2f} GB available{whose}: {(need - limit) / GB:.2f} GB short",
        hint=f"{suggestion}{then}",
    )


def _smaller_formats(variant: Variant) -> str:
    """ "a smaller format (e.g. A or B)": the next two the target plans below this one."""
    target = get_target(variant.target)
    bits = quality_rank(target, variant.quant)
    planned = {q for unit in target.units for q in unit.formats}
    smaller = sorted(
        (q for q in planned if quality_rank(target, q) < bits),
        key=lambda q: quality_rank(target, q),
        reverse=True,
    )[:2]
    return f"a smaller format (e.g. {' or '.join(smaller)})" if smaller else "a smaller format"
