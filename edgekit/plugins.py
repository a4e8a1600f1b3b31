"""The names of installed plug-ins, read from entry-point metadata without importing them.

Core code that must validate a target name (a device profile's ``targets``) reads it
here; loading a plug-in is the target layer's job (``edgekit.targets.registry``).
"""

from __future__ import annotations

from importlib.metadata import entry_points

TARGET_GROUP = "edgekit.targets"


def target_names() -> list[str]:
    """Names of the targets installed in this environment, sorted."""
    return sorted({ep.name for ep in entry_points(group=TARGET_GROUP)})
