"""edgekit.load: the one call a desktop app makes to run a bundle.

    import edgekit
    with edgekit.load("smollm2.bundle") as session:
        reply = session.generate("Hello", max_tokens=64)

The variant is the one asked for, or the best this host can run and hold in memory;
sizes are always checked, checksums when ``verify=True``; settings come from the call,
then the bundle's runtime settings, then the target's defaults. Everything about a
target comes from the registry: whether it runs here (``availability.target_status``),
the settings it takes (``load_settings``), what a device means to it
(``device_settings``).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import psutil

from edgekit.bundle_choose import choose_variant, variant_parallel
from edgekit.bundle_open import open_bundle, verify_variants
from edgekit.converters.planner.values import MAX_PARALLEL
from edgekit.errors import SettingError, UnsupportedConversionError
from edgekit.manifest import OpenedBundle
from edgekit.progress import ProgressCallback
from edgekit.targets import checks
from edgekit.targets.availability import target_status
from edgekit.targets.contract import Target
from edgekit.targets.registry import get_target, runnable_targets
from edgekit.targets.session import Session

# edgekit.load's own arguments, listed beside a target's settings when one is unknown
LOAD_ARGUMENTS = ("variant", "device", "verify", "force", "progress")


def load(
    bundle: str | Path,
    variant: str | None = None,
    device: str = "auto",
    *,
    verify: bool = False,
    force: bool = False,
    progress: ProgressCallback | None = None,
    **settings: Any,
) -> Session:
    """Open ``bundle`` (folder or .tar) and load a variant; returns a Session.

    ``settings`` override the bundle's runtime settings (context, threads, kv_cache, ...).
    ``parallel`` (where the target takes it): generations decoded together, each with its
    own KV cache of the context; memory is admitted for all of them.
    ``progress`` receives the load's ProgressEvents where the target reports any (a
    TensorRT engine built on the first load: minutes); other targets load without.

    Raises:
        SettingError: a setting the variant's target does not take (the message lists the
            valid ones), or one of the wrong type or out of range.
        BundleError: missing, invalid or tampered bundle; no usable variant.
        InsufficientMemoryError: the variant is predicted not to fit (``force`` overrides).
        TargetError: the target is not installed, or refused the device or a setting.
    """
    # A setting no target takes is refused before the bundle is opened; the context
    # sizes the memory check below, before the target validates the rest.
    _check_names(settings, (s for t in runnable_targets() for s in t.load_settings))
    if not isinstance(device, str):
        accepted = sorted({d for t in runnable_targets() for d in t.devices_accepted})
        raise SettingError(
            f"device must be a string, not {type(device).__name__}",
            hint=f"use one of {', '.join(accepted)}",
        )
    if settings.get("context") is not None:
        settings["context"] = checks.integer("context", settings["context"], low=1)
    if settings.get("parallel") is not None:
        settings["parallel"] = check_parallel(settings["parallel"])
    opened = open_bundle(bundle)
    chosen = choose_variant(
        opened,
        requested=variant,
        available_bytes=psutil.virtual_memory().available,
        runnable=_runnable_here(opened),
        context=settings.get("context"),
        device=device,
        force=force,
        parallel=settings.get("parallel") or 1,
    )
    target = get_target(chosen.target)
    _check_names(settings, target.load_settings)
    # the manifest records every runtime setting; a target gets those it takes (ONNX
    # Runtime's KV cache type is fixed in the graph: it has no kv_cache setting)
    recorded = {
        "context": chosen.runtime.context,
        "kv_cache": chosen.runtime.kv_cache,
        "threads": chosen.runtime.threads,
    }
    merged = {
        **{k: v for k, v in recorded.items() if k in target.load_settings},
        **target.device_settings(device),
        **settings,
    }
    if progress is not None and "progress" in target.load_settings:
        merged["progress"] = progress
    # Sizes were checked while choosing; checksums only when asked (they read every byte).
    if verify:
        verify_variants(opened.folder, (chosen,), checksums=True)
    session = target.load(opened.variant_path(chosen), **merged)
    session.bundle = opened
    session.variant = chosen
    return session


def check_parallel(value: Any) -> int:
    """``parallel`` as an int from 1 to MAX_PARALLEL (64).

    Raises:
        SettingError: not an integer, below 1, or above 64.
    """
    number = checks.integer("parallel", value, low=1)
    if number > MAX_PARALLEL:
        raise SettingError(
            f"parallel {number} is more than edgekit decodes together ({MAX_PARALLEL})",
            hint=f"pass parallel from 1 to {MAX_PARALLEL}: each stream holds a KV cache of the "
            "context, so a few streams usually use the memory up first",
        )
    return number


def suggest_parallel(
    bundle: str | Path,
    variant: str | None = None,
    device: str = "auto",
    *,
    context: int | None = None,
) -> int:
    """The streams ``edgekit.load(bundle, variant, device, context=context)`` could
    decode together here: the variant load would choose (one stream), and the most
    streams, up to 8, whose KV caches of the context fit the memory available now beside
    its weights and runtime (``bundle_choose.variant_parallel``, load's own admission
    formula). At least 1 when a variant is chosen: one stream is what load admits alone;
    1 when its target has no batched runtime (no ``parallel`` load setting).

    Raises:
        BundleError, InsufficientMemoryError, TargetError: as ``load`` choosing a variant.
    """
    if context is not None:
        context = checks.integer("context", context, low=1)
    opened = open_bundle(bundle)
    available = psutil.virtual_memory().available
    chosen = choose_variant(
        opened,
        requested=variant,
        available_bytes=available,
        runnable=_runnable_here(opened),
        context=context,
        device=device,
    )
    if "parallel" not in get_target(chosen.target).load_settings:
        return 1  # its target decodes one stream at a time
    try:
        streams = variant_parallel(
            opened, chosen, available_bytes=available, context=context, device=device
        )
    except UnsupportedConversionError:  # asked for by name, memory not predictable
        return 1
    return max(streams, 1)


def _runnable_here(opened: OpenedBundle) -> set[str]:
    """The targets of ``opened``'s variants that are installed and usable on this host
    (only those are checked: a check imports the target's SDK)."""
    named = {v.target for v in opened.manifest.variants}
    return {t.name for t in runnable_targets() if t.name in named and _usable(t)}


def _usable(target: type[Target]) -> bool:
    return target_status(target).usable


def _check_names(settings: dict[str, Any], valid: Iterable[str]) -> None:
    """Refuse a setting that is not one of ``valid``, listing those and load's own.

    Raises:
        SettingError: an unknown setting name.
    """
    known = set(valid)
    unknown = sorted(set(settings) - known)
    if unknown:
        listed = ", ".join(sorted(known - set(LOAD_ARGUMENTS)) + list(LOAD_ARGUMENTS))
        raise SettingError(
            f"edgekit.load got unknown setting(s) {', '.join(map(repr, unknown))}; valid: {listed}",
            hint="pass only the settings listed (see the target's load() docs)",
        )
