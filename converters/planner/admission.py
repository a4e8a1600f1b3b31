"""Load's admission check: does a built variant fit the memory this host has now?

The same predictor as the plan: weights from the variant's own layout
(``Format.built_layout``) x the target's residency, the KV cache the target allocates at
the context, and its runtime buffers (``memory.resident_bytes``), on the compute unit the
variant is loaded on. ``edgekit plan`` decides fit for the same variant, context and KV
type with the same formula, so a variant the plan rejects for a device is one load
refuses on a host whose free memory is that device's limit (tests/test_one_predictor.py).
A load of ``parallel`` streams (continuous batching) is admitted for that many KV caches,
as a plan with ``Budgets.parallel`` counts them.
"""

from __future__ import annotations

from dataclasses import dataclass

from edgekit.converters.planner import calibration
from edgekit.converters.planner.fitting import fit
from edgekit.converters.planner.memory import (
    kv_cache_bytes,
    resident_bytes,
    stream_runtime_bytes,
    streams_that_fit,
)
from edgekit.targets.contract import Coefficients, MemoryCap, Target

from edgekit.devices import GIB
from edgekit.modelspec import ModelSpec


@dataclass(frozen=True, kw_only=True)
class Fit:
    """A variant's predicted resident memory against the memory it may use."""

    memory_bytes: int
    limit_bytes: int
    fits: bool
    why: str  # one line: what it needs against what there is
    # the target's own limit when it is below the host's free memory ("": none), and how
    # to raise it
    cap_why: str = ""
    cap_hint: str = ""


def load_unit(target: type[Target], device: str) -> str:
    """The kind of compute unit ``edgekit.load(device=...)`` puts ``target`` on (the
    target decides: ``Target.load_unit``)."""
    return target.load_unit(device)


def variant_coefficients(
    spec: ModelSpec, target: type[Target], unit_kind: str, *, calibrate_for: str | None = None
) -> Coefficients:
    """The target's first estimates on ``unit_kind``, refitted to the samples stored for
    ``calibrate_for`` (a calibration device key) when given.

    Raises:
        TargetError: the target does not run on a unit of that kind.
    """
    prior = target.priors(unit_kind, spec)
    if calibrate_for is None:
        return prior
    # Memory is all admission needs: the fit of residency and runtime bytes needs no
    # bandwidth or peak compute.
    found = calibration.samples(calibrate_for, target.name, unit_kind)
    return fit(
        prior,
        found,
        bandwidth_gbps=None,
        peak_tflops=None,
        vocab_term_bytes=target.vocab_runtime_bytes(unit_kind, spec),
    )


@dataclass(frozen=True, kw_only=True)
class VariantMemory:
    """A built variant's predicted memory, and what it is made of."""

    weights_bytes: int  # the variant's tensors
    kv_cache_bytes: int  # one stream's, as the target allocates it at the context
    runtime_bytes: int
    # resident: weights x residency + parallel x KV x scale + runtime (+ a row of logits
    # per stream beyond the first)
    memory_bytes: int
    parallel: int = 1


def _variant_parts(
    spec: ModelSpec,
    target: type[Target],
    quant: str,
    context: int,
    kv_cache: str,
    unit_kind: str,
    calibrate_for: str | None,
) -> tuple[int, int, Coefficients]:
    """The built variant's weight bytes, one stream's KV cache bytes at ``context``, and
    the coefficients its memory is predicted with (load's formula, used by the two below)."""
    c = variant_coefficients(spec, target, unit_kind, calibrate_for=calibrate_for)
    weights = target.format.built_layout(spec, quant).total_bytes
    kv = kv_cache_bytes(spec, context, kv_cache, layout=target.kv_cache)
    return weights, kv, c


def memory_parts(
    spec: ModelSpec,
    target: type[Target],
    quant: str,
    *,
    context: int,
    kv_cache: str,
    unit_kind: str,
    calibrate_for: str | None = None,
    parallel: int = 1,
) -> VariantMemory:
    """Predicted memory of the built variant ``spec`` (its file or folder, inspected) of
    ``target`` in ``quant``, loaded on ``unit_kind`` at ``context`` with ``parallel``
    streams, part by part: what load admits by, and what pack records as a variant's
    predicted memory when no plan predicted it."""
    weights, kv, c = _variant_parts(
        spec, target, quant, context, kv_cache, unit_kind, calibrate_for
    )
    return VariantMemory(
        weights_bytes=weights,
        kv_cache_bytes=kv,
        runtime_bytes=c.runtime_bytes,
        memory_bytes=resident_bytes(
            weights, kv, c, streams=parallel, stream_bytes=stream_runtime_bytes(spec)
        ),
        parallel=parallel,
    )


def load_streams(
    spec: ModelSpec,
    target: type[Target],
    quant: str,
    *,
    context: int,
    kv_cache: str,
    available_bytes: int,
    unit_kind: str,
    most: int,
    calibrate_for: str | None = None,
    cap: MemoryCap | None = None,
) -> int:
    """The most streams, 0 to ``most``, of the built variant ``spec`` whose KV caches of
    ``context`` fit ``available_bytes`` (and the target's ``cap``) beside its weights and
    runtime, by ``load_fit``'s formula; 0: not even one.

    Raises:
        TargetError, UnsupportedConversionError: as ``load_fit``.
    """
    weights, kv, c = _variant_parts(
        spec, target, quant, context, kv_cache, unit_kind, calibrate_for
    )
    limit = min(available_bytes, cap.bytes) if cap is not None else available_bytes
    return streams_that_fit(
        weights,
        kv,
        c,
        limit,
        stream_bytes=stream_runtime_bytes(spec),
        most=most,
    )


def load_fit(
    spec: ModelSpec,
    target: type[Target],
    quant: str,
    *,
    context: int,
    kv_cache: str,
    available_bytes: int,
    unit_kind: str,
    calibrate_for: str | None = None,
    cap: MemoryCap | None = None,
    parallel: int = 1,
) -> Fit:
    """Whether the built variant ``spec`` with ``parallel`` streams fits
    ``available_bytes`` (and the target's own ``cap`` on this host, when it is lower), by
    the plan's formula.

    Raises:
        TargetError: the target does not run on a unit of ``unit_kind``.
        UnsupportedConversionError: ``quant`` is not one of the target's format's.
    """
    need = memory_parts(
        spec,
        target,
        quant,
        context=context,
        kv_cache=kv_cache,
        unit_kind=unit_kind,
        calibrate_for=calibrate_for,
        parallel=parallel,
    ).memory_bytes
    capped = cap is not None and cap.bytes < available_bytes
    limit = cap.bytes if cap is not None and capped else available_bytes
    fits = need <= limit
    verdict = "fits" if fits else f"is {(need - limit) / GIB:.2f} GiB short"
    whose = f" ({cap.why})" if cap is not None and capped else ""
    streams = f" x {parallel} streams" if parallel > 1 else ""
    why = (
        f"{target.name} {quant} needs {need / GIB:.2f} GiB at ctx {context}{streams} "
        f"({unit_kind.upper()}); {limit / GIB:.2f} GiB available{whose}: {verdict}"
    )
    if cap is not None and capped:
        return Fit(
            memory_bytes=need,
            limit_bytes=limit,
            fits=fits,
            why=why,
            cap_why=cap.why,
            cap_hint=cap.hint,
        )
    return Fit(memory_bytes=need, limit_bytes=limit, fits=fits, why=why)
