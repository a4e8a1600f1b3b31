"""Installed targets, found through the ``edgekit.targets`` entry-point group.

Listing reads entry-point metadata only; ``get_target`` imports the one module asked
for (target modules import their SDK lazily, in ``load``).
"""

from __future__ import annotations

from importlib.metadata import entry_points

from edgekit.targets.base import Target

from edgekit.errors import TargetError

GROUP = "edgekit.targets"


def registered_targets() -> list[str]:
    """Names of the targets installed in this environment, without importing them."""
    return sorted(ep.name for ep in entry_points(group=GROUP))


def get_target(name: str) -> type[Target]:
    """The Target class registered under ``name``.

    Raises:
        TargetError: no target of that name is installed.
    """
    for ep in entry_points(group=GROUP):
        if ep.name == name:
            target = ep.load()
            if not (isinstance(target, type) and issubclass(target, Target)):
                raise TargetError(f"entry point {ep.value} is not an edgekit Target")
            return target
    installed = ", ".join(registered_targets()) or "none"
    raise TargetError(
        f"unknown target {name!r}; installed: {installed}",
        hint="reinstall edgekit (pip install -e .) if a target is missing",
    )
