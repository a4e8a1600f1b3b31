"""The names of installed plug-ins, read from entry-point metadata without importing them.

Core code that must validate a target name (a device profile's ``targets``) reads it
here; loading a plug-in is the target layer's job (``edgekit.targets.registry``).

Entry-point metadata is read once per process (a scan of every installed distribution
costs ~10 ms, and the planner asks per candidate); ``refresh`` reads it again after a
plug-in was installed into the running process (a test that registers a fake target).
"""

from __future__ import annotations

import functools
import importlib
from importlib.metadata import EntryPoint, entry_points

TARGET_GROUP = "edgekit.targets"


@functools.cache
def target_entry_points() -> tuple[EntryPoint, ...]:
    """The entry points of the ``edgekit.targets`` group, sorted by name (two
    distributions may register the same name: both are kept, the registry refuses it)."""
    return tuple(sorted(entry_points(group=TARGET_GROUP), key=lambda ep: (ep.name, ep.value)))


def target_names() -> list[str]:
    """Names of the targets installed in this environment, sorted."""
    return sorted({ep.name for ep in target_entry_points()})


def refresh() -> None:
    """Forget the entry points read so far (after installing a plug-in in this process)."""
    importlib.invalidate_caches()
    target_entry_points.cache_clear()
