"""Is a target usable on this host? Installed SDK, present hardware, and the reason if not.

Generic over the target contract: the SDK modules a target names are looked up without
importing them, its distribution's version is read from metadata, and only then does
its ``check_host`` import the SDK and look at the hardware. A check that raises reports
"installed but failed" instead of breaking the probe.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
from dataclasses import dataclass

from edgekit.targets.contract import Target
from edgekit.targets.registry import all_targets, broken_targets


@dataclass(frozen=True, kw_only=True)
class TargetStatus:
    name: str
    installed: bool  # the SDK modules import
    usable: bool  # installed, and the hardware it needs is here
    version: str | None
    detail: str  # backends and devices found, or why it cannot run


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def missing_modules(modules: tuple[str, ...]) -> list[str]:
    """The modules of ``modules`` that are not installed (a parent package that fails to
    import counts as missing: find_spec of a submodule imports its parent)."""
    missing = []
    for module in modules:
        try:
            found = importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            missing.append(module)
    return missing


def target_status(target: type[Target]) -> TargetStatus:
    """Check one target. Imports its SDK (call from the probe or load, never at import)."""
    version = _version(target.distribution)
    missing = missing_modules(target.sdk_modules)
    if missing:
        return TargetStatus(
            name=target.name,
            installed=False,
            usable=False,
            version=version,
            detail=f"not installed ({', '.join(missing)} missing): {target.install_hint}",
        )
    try:
        usable, detail = target.check_host()
    except Exception as exc:  # an SDK that imports but breaks must not break the probe
        return TargetStatus(
            name=target.name,
            installed=True,
            usable=False,
            version=version,
            detail=f"installed but failed: {type(exc).__name__}: {exc}",
        )
    if usable and not target.runs:
        detail = f"{detail}; {target.runtime_note}"
    return TargetStatus(
        name=target.name, installed=True, usable=usable, version=version, detail=detail
    )


def all_target_status() -> tuple[TargetStatus, ...]:
    """Every registered target's status, by name; a plug-in that fails to load is listed
    as not installed, with the reason."""
    statuses = [target_status(t) for t in all_targets()]
    statuses += [
        TargetStatus(name=name, installed=False, usable=False, version=None, detail=why)
        for name, why in broken_targets()
    ]
    return tuple(sorted(statuses, key=lambda s: s.name))
