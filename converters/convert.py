"""convert_model: one entry point for every conversion the CLI's ``convert`` offers.

What can be converted to what is the conversion graph's business
(``edgekit.converters.graph``): each format package declares its edges, and a
conversion follows the shortest route from the source's kind to the output asked for
(a GGUF to OpenVINO is GGUF -> HF -> OpenVINO). Intermediates are written in a private
folder beside the output and removed however the conversion ends; the output itself is
written atomically by its edge.

``check_conversion`` is the one check of a conversion before any work: the output and
its options, the source, and the tools every step needs. ``convert_model`` runs it
first, and ``pack`` runs it for every variant before converting the first one, then
converts each along its route with ``convert_along`` (sharing intermediates).
"""

from __future__ import annotations

import time
from collections.abc import MutableMapping
from dataclasses import dataclass
from pathlib import Path

from edgekit.converters import graph
from edgekit.converters.formats import ConvertRequest, Edge
from edgekit.converters.recipe import Recipe
from edgekit.targets.registry import get_format

from edgekit.atomic import check_apart, check_destination, work_dir
from edgekit.errors import UnsupportedConversionError
from edgekit.inspection import inspect_model
from edgekit.modelspec import ModelSpec
from edgekit.progress import ProgressCallback, no_progress

# Intermediates already written, by (the route's source path, the kind written): pack
# dequantizes a GGUF once for all its OpenVINO variants.
Intermediates = MutableMapping[tuple[Path, str], Path]


@dataclass(frozen=True, kw_only=True)
class ConvertResult:
    path: Path
    format: str  # a format name, or "hf"
    quant: str | None
    seconds: float
    warnings: tuple[str, ...]


def output_quant(to: str, quant: str | None) -> str | None:
    """The quantization a conversion to ``to`` writes: ``quant`` in upper case, or the
    format's default (None for a Hugging Face folder, which has none)."""
    if to == graph.HF:
        return quant.upper() if quant else None
    return (quant or get_format(to).default_quant).upper()


def convert_model(
    src: str | Path,
    to: str,
    out: str | Path,
    *,
    quant: str | None = None,
    recipe: str | None = None,
    tokenizer_pre: str | None = None,
    threads: int | None = None,
    context: int | None = None,
    force: bool = False,
    progress: ProgressCallback = no_progress,
) -> ConvertResult:
    """Convert ``src`` to ``to`` (a format name, or "hf") at ``out``; ``context`` sizes a
    static KV cache (an HTP variant's), where the format has one.

    Raises:
        UnsupportedConversionError, TargetUnavailableError, OutputExistsError,
        ConversionError, ModelError.
    """
    src, out = Path(src), Path(out)
    check_destination(out, force=force)
    check_apart(src, out)
    spec = inspect_model(src)
    route = _route(spec, src, to)
    name = output_quant(to, quant)
    options = Recipe(weights=name).with_options(recipe) if to != graph.HF and name else None
    check_route(route, spec, src, quant=name, recipe=options)
    with work_dir(out, "build") as scratch:
        return convert_along(
            route,
            src,
            spec,
            out,
            quant=name,
            recipe=options,
            scratch=scratch,
            reuse={},
            tokenizer_pre=tokenizer_pre,
            threads=threads,
            context=context,
            force=force,
            progress=progress,
        )


def check_conversion(
    spec: ModelSpec,
    src: Path,
    to: str,
    *,
    quant: str | None,
    recipe: Recipe | None,
) -> tuple[Edge, ...]:
    """Everything knowable about converting ``src`` (described by ``spec``) to ``to``
    before writing anything, for every step of its route; returns the route.

    ``quant`` is the output's quantization (upper case; None for ``to="hf"``) and
    ``recipe`` the parsed options.

    Raises:
        UnsupportedConversionError: the output, an option or the source cannot be
            converted so.
        TargetUnavailableError: a tool some step needs is not installed.
    """
    route = _route(spec, src, to)
    check_route(route, spec, src, quant=quant, recipe=recipe)
    return route


def check_route(
    route: tuple[Edge, ...],
    spec: ModelSpec,
    src: Path,
    *,
    quant: str | None,
    recipe: Recipe | None,
) -> None:
    """Every step's check, in order, before any step runs (a step whose source an earlier
    step writes is checked with the route's source: see ``ConvertRequest``)."""
    for i, edge in enumerate(route):
        last = i == len(route) - 1
        edge.check(
            ConvertRequest(
                src=src,
                out=None,
                spec=spec,
                quant=quant if last else _intermediate_quant(edge.output),
                recipe=recipe if last else None,
                progress=no_progress,
            )
        )


def convert_along(
    route: tuple[Edge, ...],
    src: Path,
    spec: ModelSpec,
    out: Path,
    *,
    quant: str | None,
    recipe: Recipe | None,
    scratch: Path,
    reuse: Intermediates,
    tokenizer_pre: str | None = None,
    threads: int | None = None,
    context: int | None = None,
    force: bool = False,
    progress: ProgressCallback = no_progress,
) -> ConvertResult:
    """Run ``route`` (checked with ``check_route``) from ``src`` to ``out``.

    Intermediates go to ``scratch`` (the caller's private folder, removed by the caller)
    and into ``reuse``; one already in ``reuse`` is not written again. The last step
    writes ``out`` atomically.
    """
    start = time.perf_counter()
    warnings: list[str] = []
    current, current_spec = src, spec
    for i, edge in enumerate(route):
        last = i == len(route) - 1
        key = (src, edge.output)
        if not last and key in reuse:
            current = reuse[key]
            current_spec = inspect_model(current)
            continue
        request = ConvertRequest(
            src=current,
            out=out if last else scratch / f"{src.stem}.{edge.output}-intermediate",
            spec=current_spec,
            quant=quant if last else _intermediate_quant(edge.output),
            recipe=recipe if last else None,
            tokenizer_pre=tokenizer_pre,
            threads=threads,
            context=context if last else None,
            force=force and last,
            progress=progress,
        )
        if i > 0:  # its source exists now: check what could not be checked before
            edge.check(request)
        warnings.extend(w for w in edge.run(request) if w not in warnings)
        if not last:
            current = reuse[key] = request.destination()
            current_spec = inspect_model(current)
    return ConvertResult(
        path=out,
        format=route[-1].output,
        quant=quant,
        seconds=time.perf_counter() - start,
        warnings=tuple(warnings),
    )


def _route(spec: ModelSpec, src: Path, to: str) -> tuple[Edge, ...]:
    try:
        return graph.route(spec.format, to)
    except UnsupportedConversionError as exc:
        if spec.format != to:
            raise
        there = graph.reachable(spec.format)
        raise UnsupportedConversionError(
            f"{src} is already {graph.describe(to)}",
            hint=f"convert it --to {' or '.join(there)}" if there else exc.hint,
        ) from None


def _intermediate_quant(kind: str) -> str | None:
    """What an intermediate is written as: a Hugging Face folder has no quantization; a
    format, its first lossless quantization (its default when it has none)."""
    if kind == graph.HF:
        return None
    fmt = get_format(kind)
    return next((q.name for q in fmt.quants.values() if q.lossless), fmt.default_quant)
