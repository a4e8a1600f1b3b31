"""The installed targets, found through the ``edgekit.targets`` entry-point group.

Every target is a ``Target`` subclass (``edgekit.targets.contract``) registered under its
own name; what an entry point loads is checked: a ``Target`` subclass whose ``name`` is
the entry-point name and that declares every capability the contract requires.

A broken plug-in (its module fails to import, or it breaks the contract) must not hide the
others: ``all_targets`` leaves it out and logs a warning, ``broken_targets`` lists it with
the reason (``edgekit probe`` shows it), and ``get_target`` of its name raises
``TargetError`` with that reason. Target modules import their SDK only in ``load`` and
``check_host``, so listing targets imports no SDK.

A plug-in installed into a running process (a test's fake target) appears after
``edgekit.plugins.refresh()``; a test may instead replace
``edgekit.plugins.target_entry_points``, which the registry and the profile check read.
"""

from __future__ import annotations

import functools
import logging
from importlib.metadata import EntryPoint

from edgekit.converters.formats import Format
from edgekit.targets.contract import KvCacheLayout, Target, UnitSupport

from edgekit import plugins
from edgekit.errors import TargetError, UnsupportedConversionError

log = logging.getLogger(__name__)

# capabilities without a default in the contract: a plug-in must declare each one
_REQUIRED = (
    "display_name",
    "devices",
    "format",
    "install_hint",
    "sdk_modules",
    "distribution",
    "units",
)
_warned: set[str] = set()
_HINT = "reinstall edgekit (pip install -e .) or the plug-in's distribution"


def all_targets() -> tuple[type[Target], ...]:
    """Every registered target that loads, sorted by name (broken ones are logged and
    left out: see ``broken_targets``)."""
    found: list[type[Target]] = []
    for name in _names():
        try:
            found.append(_load(name))
        except TargetError as exc:
            if exc.message not in _warned:  # once per process, not per listing
                _warned.add(exc.message)
                log.warning("%s", exc.message)
    return tuple(found)


def runnable_targets() -> tuple[type[Target], ...]:
    """The registered targets edgekit can run (``runs``), not only plan for."""
    return tuple(t for t in all_targets() if t.runs)


def broken_targets() -> tuple[tuple[str, str], ...]:
    """(name, why) of every registered target that fails to load or breaks the contract."""
    broken: list[tuple[str, str]] = []
    for name in _names():
        try:
            _load(name)
        except TargetError as exc:
            broken.append((name, exc.message))
    return tuple(broken)


def get_target(name: str) -> type[Target]:
    """The Target class registered under ``name``.

    Raises:
        TargetError: no target of that name is installed, or its plug-in is broken.
    """
    if name in _names():
        return _load(name)
    installed = ", ".join(_names()) or "none"
    raise TargetError(f"unknown target {name!r}; installed: {installed}", hint=_HINT)


def default_target() -> type[Target]:
    """The target chosen where the user names none: the runnable one with the lowest
    ``priority`` (then by name).

    Raises:
        TargetError: no runnable target is installed.
    """
    runnable = runnable_targets()
    if not runnable:
        raise TargetError("no runnable edgekit target is installed", hint=_HINT)
    return min(runnable, key=lambda t: (t.priority, t.name))


def all_formats() -> tuple[Format, ...]:
    """The formats of the registered targets, each once, in target order."""
    formats: dict[str, Format] = {}
    for target in all_targets():
        formats.setdefault(target.format.name, target.format)
    return tuple(formats.values())


def get_format(name: str) -> Format:
    """The format called ``name`` (a variant folder prefix, ``convert --to``) of a registered
    target.

    Raises:
        UnsupportedConversionError: no registered target has that format.
    """
    for fmt in all_formats():
        if fmt.name == name:
            return fmt
    known = ", ".join(f.name for f in all_formats()) or "none"
    raise UnsupportedConversionError(
        f"unknown format {name!r}; the installed targets have: {known}",
        hint=f"use one of {known}",
    )


def _names() -> list[str]:
    """The registered names, each once, sorted."""
    return sorted({ep.name for ep in plugins.target_entry_points()})


def _load(name: str) -> type[Target]:
    """The checked target registered as ``name``.

    Raises:
        TargetError: two distributions register the name, its module fails to import, or
            what it names breaks the contract.
    """
    values = sorted({ep.value for ep in plugins.target_entry_points() if ep.name == name})
    if len(values) > 1:
        raise TargetError(
            f"target {name!r} is registered twice ({', '.join(values)})",
            hint="uninstall one of the distributions that register it",
        )
    return _import(name, values[0])


@functools.cache
def _import(name: str, value: str) -> type[Target]:
    """Import and check one entry point (cached: a target module is imported once; a
    failure is not cached, so a plug-in fixed in the process loads on the next call)."""
    try:
        loaded = EntryPoint(name=name, value=value, group=plugins.TARGET_GROUP).load()
    except Exception as exc:  # any failure of a plug-in's import is that plug-in's
        raise TargetError(
            f"target plug-in {name!r} ({value}) failed to load: {type(exc).__name__}: {exc}",
            hint=_HINT,
        ) from exc
    if not (isinstance(loaded, type) and issubclass(loaded, Target)):
        raise TargetError(f"target plug-in {name!r} ({value}) is not an edgekit Target", hint=_HINT)
    declared = getattr(loaded, "name", None)
    if declared != name:
        raise TargetError(
            f"target plug-in {value} declares name {declared!r}, but is registered as {name!r}",
            hint="the Target's name must be its entry-point name",
        )
    lacks = [attr for attr in _REQUIRED if not hasattr(loaded, attr)]
    lacks += sorted(getattr(loaded, "__abstractmethods__", ()))
    if lacks:
        raise TargetError(f"target plug-in {name!r} ({value}) lacks {', '.join(lacks)}", hint=_HINT)
    wrong = _wrongly_typed(loaded)
    if wrong:
        raise TargetError(
            f"target plug-in {name!r} ({value}) declares {'; '.join(wrong)}", hint=_HINT
        )
    return loaded


def _wrongly_typed(target: type[Target]) -> list[str]:
    """What a target declares with the wrong type (a plug-in's ``format = None`` would
    otherwise break every format listing, hence every conversion, not just its own)."""
    wrong = [
        f"{attr} not a string"
        for attr in ("display_name", "devices", "install_hint", "distribution")
        if not isinstance(getattr(target, attr), str)
    ]
    if not isinstance(target.format, Format):
        wrong.append("format not an edgekit Format")
    if not (
        isinstance(target.sdk_modules, tuple)
        and all(isinstance(m, str) and m for m in target.sdk_modules)
    ):
        wrong.append("sdk_modules not a tuple of module names")
    if not (
        isinstance(target.units, tuple)
        and target.units
        and all(isinstance(u, UnitSupport) for u in target.units)
    ):
        wrong.append("units not a non-empty tuple of UnitSupport")
    if not isinstance(target.kv_cache, KvCacheLayout):
        wrong.append("kv_cache not a KvCacheLayout")
    return wrong
