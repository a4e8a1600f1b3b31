"""The conversion graph: the edges of every registered format, joined into routes.

A node is a source kind: "hf" (a Hugging Face folder) or a format's name ("gguf",
"openvino", ...); an edge is one conversion a format package performs
(``Format.edges``). ``route`` finds the shortest chain of edges from what the user has
to what they ask for, so GGUF Q4_1 -> OpenVINO INT4 is the route GGUF -> HF -> OpenVINO,
not a branch in ``convert`` or ``pack``.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable

from edgekit.converters.formats import Edge, Format, SourceKind
from edgekit.targets.registry import all_formats

from edgekit.errors import UnsupportedConversionError

HF: SourceKind = "hf"  # the Hugging Face folder: a source, and the dequantized output


def edges(formats: Iterable[Format] | None = None) -> tuple[Edge, ...]:
    """Every edge of ``formats`` (default: the registered targets' formats)."""
    chosen = all_formats() if formats is None else tuple(formats)
    return tuple(e for f in chosen for e in f.edges())


def outputs(formats: Iterable[Format] | None = None) -> tuple[SourceKind, ...]:
    """What ``convert --to`` offers: every output some edge writes, the formats in their
    registry order and "hf" last."""
    found = {e.output for e in edges(formats)}
    ordered = [f.name for f in (all_formats() if formats is None else formats)]
    return tuple(
        [name for name in ordered if name in found] + ([HF] if HF in found else [])
    )


def reachable(source: SourceKind, formats: Iterable[Format] | None = None) -> tuple[str, ...]:
    """Every output some route from ``source`` reaches, in ``outputs`` order (``source``
    itself only through a direct edge, such as requantizing a GGUF)."""
    graph = edges(formats)
    seen = {e.output for e in graph if e.source == source}
    queue = deque(seen - {source})
    while queue:
        node = queue.popleft()
        for e in graph:
            if e.source == node and e.output not in seen and e.output != source:
                seen.add(e.output)
                queue.append(e.output)
    return tuple(o for o in outputs(formats) if o in seen)


def route(
    source: SourceKind, output: SourceKind, formats: Iterable[Format] | None = None
) -> tuple[Edge, ...]:
    """The shortest chain of edges from ``source`` to ``output`` (at least one edge: a
    GGUF to GGUF is the requantizing edge).

    Raises:
        UnsupportedConversionError: ``output`` is no format edgekit writes, or no route
            reaches it from ``source`` (the hint lists what does).
    """
    chosen = all_formats() if formats is None else tuple(formats)
    graph = edges(chosen)
    known = outputs(chosen)
    if output not in known:
        planned = next((f for f in chosen if f.name == output), None)
        if planned is not None:  # a format edgekit sizes and plans for, without edges yet
            raise UnsupportedConversionError(
                f"edgekit cannot build {planned.display} models yet (it plans for them)",
                hint=f"use {_either(known)}",
            )
        raise UnsupportedConversionError(
            f"unknown output format {output!r}", hint=f"use {_either(known)}"
        )
    queue: deque[tuple[Edge, ...]] = deque((e,) for e in graph if e.source == source)
    # A route back to its own kind is one edge (requantize), never a detour through another.
    visited = {source} | {e.output for e in graph if e.source == source}
    while queue:
        path = queue.popleft()
        if path[-1].output == output:
            return path
        for e in graph:
            if e.source == path[-1].output and e.output not in visited:
                visited.add(e.output)
                queue.append((*path, e))
    there = reachable(source, chosen)
    raise UnsupportedConversionError(
        f"edgekit cannot convert {describe(source, chosen)} to {describe(output, chosen)}",
        hint=f"convert it --to {_either(there)}" if there else "no conversion starts there",
    )


def describe(kind: SourceKind, formats: Iterable[Format] | None = None) -> str:
    """A source kind in words: "a Hugging Face folder", "GGUF"."""
    if kind == HF:
        return "a Hugging Face folder"
    chosen = all_formats() if formats is None else formats
    return next((f.display for f in chosen if f.name == kind), kind)


def _either(names: tuple[str, ...]) -> str:
    if len(names) <= 1:
        return "".join(names)
    return f"{', '.join(names[:-1])} or {names[-1]}"
