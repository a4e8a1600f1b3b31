"""edgekit.load: the one call a desktop app makes to run a bundle.

    import edgekit
    with edgekit.load("smollm2.bundle") as session:
        reply = session.generate("Hello", max_tokens=64)

The variant is the one asked for, or the best this host can run and hold in memory;
sizes are always checked, checksums when ``verify=True``; settings come from the call,
then the bundle's runtime settings, then the target's defaults.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import psutil

from edgekit.bundle import choose_variant, open_bundle, verify_variants
from edgekit.errors import TargetError
from edgekit.manifest import Variant
from edgekit.targets.base import Session

# device -> llama.cpp GPU layers
_LLAMACPP_DEVICES = {"auto": 0, "cpu": 0, "gpu": -1}


def load(
    bundle: str | Path,
    variant: str | None = None,
    device: str = "auto",
    *,
    verify: bool = False,
    force: bool = False,
    **settings: Any,
) -> Session:
    """Open ``bundle`` (folder or .tar) and load a variant; returns a Session.

    ``settings`` override the bundle's runtime settings (context, threads, kv_cache, ...).

    Raises:
        BundleError: missing, invalid or tampered bundle; no usable variant.
        InsufficientMemoryError: the variant is predicted not to fit (``force`` overrides).
        TargetError: the target is not installed, or refused the device or a setting.
    """
    from edgekit.targets import checks
    from edgekit.targets.availability import target_status
    from edgekit.targets.catalog import BY_NAME
    from edgekit.targets.registry import get_target, registered_targets

    # The context sizes the memory check below, before the target validates the rest.
    if settings.get("context") is not None:
        settings["context"] = checks.integer("context", settings["context"], low=1)
    opened = open_bundle(bundle)
    runnable = {
        name
        for name in registered_targets()
        if name in BY_NAME and target_status(BY_NAME[name]).usable
    }
    chosen = choose_variant(
        opened,
        requested=variant,
        available_bytes=psutil.virtual_memory().available,
        runnable=runnable,
        context=settings.get("context"),
        force=force,
    )
    # Sizes were checked while choosing; checksums only when asked (they read every byte).
    if verify:
        verify_variants(opened.folder, (chosen,), checksums=True)
    target = get_target(chosen.target)
    merged = {
        "context": chosen.runtime.context,
        "kv_cache": chosen.runtime.kv_cache,
        "threads": chosen.runtime.threads,
        **_device_settings(chosen, device),
        **settings,
    }
    session = target.load(opened.variant_path(chosen), **merged)
    session.bundle = opened
    session.variant = chosen
    return session


def _device_settings(variant: Variant, device: str) -> dict[str, Any]:
    if variant.target == "llamacpp":
        if device not in _LLAMACPP_DEVICES:
            raise TargetError(
                f"device {device!r} is not one the llama.cpp target knows",
                hint="use auto, cpu or gpu",
            )
        return {"gpu_layers": _LLAMACPP_DEVICES[device]} if device == "gpu" else {}
    return {"device": device}
