"""Bundles: a folder (or one .tar of it) with manifest.json and the variants' files.

    bundle/
      manifest.json           schema: docs/bundle.schema.json
      gguf-q4_k_m/model.gguf  one folder per variant: <format>-<quant>/<format's entry>
      gguf-q8_0/model.gguf

``pack`` (here) converts a model into one or more variants and writes the bundle
atomically. Nothing in it knows a target: a variant's format, entry file and bits per
weight come from its target's ``format``, and the conversion is a route of the
conversion graph (``edgekit.converters.graph``), so a GGUF source packed into two
OpenVINO variants is dequantized once. ``bundle_open`` reads and verifies bundles,
``bundle_choose`` picks the variant ``edgekit.load`` runs, ``bundle_quality`` is pack's
``--max-quality-loss`` gate, ``bundle_contents`` what pack records about each variant.
"""

from __future__ import annotations

import math
import os
import platform
import socket
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from edgekit import __version__
from edgekit.archive import list_members, write_archive
from edgekit.atomic import atomic_path, check_apart, check_destination, work_dir, write_new
from edgekit.bundle_contents import backend_versions, file_entries, source_checksum, tokenizer_info
from edgekit.bundle_open import verify_bundle
from edgekit.bundle_quality import QualityGate, check_evaluable
from edgekit.converters import convert
from edgekit.converters.formats import Edge
from edgekit.converters.planner.admission import load_unit, memory_parts
from edgekit.converters.planner.values import Budgets, Candidate, Plan
from edgekit.converters.recipe import Recipe
from edgekit.errors import PlanError, TargetError, UnsupportedConversionError
from edgekit.inspection import inspect_model
from edgekit.manifest import (
    MANIFEST_NAME,
    SCHEMA_VERSION,
    Figures,
    Manifest,
    ModelIdentity,
    Provenance,
    Quality,
    RuntimeSettings,
    SourceModel,
    Variant,
    read_manifest,
)
from edgekit.modelspec import ModelSpec
from edgekit.progress import ProgressCallback, ProgressEvent, no_progress
from edgekit.targets import registry
from edgekit.targets.contract import Target
from edgekit.targets.registry import all_targets, default_target, get_target
from edgekit.untrusted import clean_text

DEFAULT_CONTEXT = 4096
MAX_CONTEXT = 1 << 24


def _default_target_name() -> str:
    return default_target().name


@dataclass(frozen=True, kw_only=True)
class VariantRequest:
    # default: the registry's default target (the runnable one of lowest ``priority``)
    target: str = field(default_factory=_default_target_name)
    quant: str | None = None  # default: the target's format's pack default
    recipe: str | None = None  # key=value options, as on the CLI
    context: int | None = None
    predicted: Figures | None = None  # the planner's figures (default: the memory estimate)

    @classmethod
    def from_candidate(
        cls, candidate: Candidate, *, budgets: Budgets, device: str, recipe: str | None = None
    ) -> VariantRequest:
        """The request that packs a planned ``candidate`` at the plan's context and KV
        cache (``budgets``), carrying its predictions for ``device`` into the manifest."""
        p = candidate.prediction
        options = [o for o in (recipe or "").split(",") if o.strip()]
        given = {o.partition("=")[0].strip().replace("-", "_") for o in options}
        if "kv_cache" not in given:
            options.append(f"kv_cache={budgets.kv_cache}")
        # what a build for the planned unit needs (a chip to compile for): the caller may
        # repeat it or ask for smaller parts, not build for another chip than the device's
        needed = dict(
            o.strip().partition("=")[::2] for o in candidate.build_recipe.split(",") if o.strip()
        )
        _check_device_options(options, needed, device)
        options += [f"{k}={v}" for k, v in needed.items() if k not in given]
        return cls(
            target=candidate.target,
            quant=candidate.format,
            recipe=",".join(options),
            context=budgets.context,
            predicted=Figures(
                memory_bytes=p.memory_bytes,
                prefill_tok_s=p.prefill_tok_s,
                decode_tok_s=p.decode_tok_s,
                watts=p.watts,
                joules_per_token=p.joules_per_token,
                source=f"edgekit plan for {device} ({p.basis}, {candidate.unit.upper()})",
            ),
        )

    @classmethod
    def from_plan(cls, plan: Plan, *, recipe: str | None = None) -> VariantRequest:
        """The request that packs the plan's pick.

        Raises:
            PlanError: nothing edgekit can build fits (the message says what came closest).
        """
        if plan.choice is None:
            raise PlanError(
                f"no variant to pack for {plan.device}: {plan.summary}",
                hint="loosen a budget (--memory, --ctx, --min-tps, --max-quality-loss) or "
                "pick a larger device",
            )
        return cls.from_candidate(
            plan.choice, budgets=plan.budgets, device=plan.device, recipe=recipe
        )

    @classmethod
    def for_device(cls, plan: Plan, *, recipe: str | None = None) -> list[VariantRequest]:
        """What ``pack --device`` builds: the plan's pick, and on each unit of the device
        that needs a build of its own (a context binary compiled for its chip: the
        candidates carry a ``build_recipe``) the best candidate there that fits and that
        edgekit can build, so the bundle holds what that unit runs beside the pick (an
        app uses the NPU variant where the QNN provider is present, the pick elsewhere).

        Raises:
            PlanError: nothing edgekit can build fits.
        """
        requests = [cls.from_plan(plan, recipe=recipe)]
        picked = {(plan.choice.target, plan.choice.format)} if plan.choice else set()
        units = {(c.target, c.unit) for c in plan.candidates if c.build_recipe}
        for target, unit in sorted(units):
            best = next(
                (
                    c
                    for c in plan.candidates  # ranked: fits first, best first
                    if (c.target, c.unit) == (target, unit) and c.fits and c.buildable
                ),
                None,
            )
            if best is not None and (best.target, best.format) not in picked:
                picked.add((best.target, best.format))
                requests.append(
                    cls.from_candidate(
                        best, budgets=plan.budgets, device=plan.device, recipe=recipe
                    )
                )
        return requests


def _check_device_options(options: list[str], needed: dict[str, str], device: str) -> None:
    """Refuse recipe options that contradict what the device's build needs.

    Raises:
        UnsupportedConversionError: another SoC than the device's, or parts larger than
            its per-session limit.
    """
    for option in options:
        key, _, value = (s.strip() for s in option.partition("="))
        key = key.replace("-", "_")
        if key not in needed:
            continue
        if key == "part_gib":
            try:
                larger = float(value) > float(needed[key])
            except ValueError:
                continue  # the recipe parser says what is wrong with it
            if not larger:
                continue
        elif value.upper() == needed[key].upper():
            continue
        raise UnsupportedConversionError(
            f"recipe {key}={clean_text(value)} contradicts {device}, whose build needs "
            f"{key}={needed[key]}",
            hint=f"leave {key} out with --device (pack --device takes it from the profile), "
            "or pack with --target and --quant for another chip",
        )


@dataclass(frozen=True, kw_only=True)
class PackResult:
    path: Path
    manifest: Manifest
    warnings: tuple[str, ...]


@dataclass(frozen=True, kw_only=True)
class PlannedVariant:
    """One requested variant, checked: its target, quantization, recipe and route."""

    request: VariantRequest
    target: type[Target]
    quant: str  # the format's own spelling (upper case)
    recipe: Recipe
    route: tuple[Edge, ...]

    @property
    def name(self) -> str:
        return f"{self.target.format.name}-{self.quant.lower()}"


def pack(
    model: str | Path,
    out: str | Path,
    variants: list[VariantRequest],
    *,
    name: str | None = None,
    archive: bool = False,
    force: bool = False,
    max_quality_loss: float | None = None,
    progress: ProgressCallback = no_progress,
) -> PackResult:
    """Convert ``model`` into each requested variant and write one bundle at ``out``.

    With ``archive``, ``out`` is a .tar file of the bundle folder instead of the folder.
    With ``max_quality_loss`` (mean KL divergence, nats per token, against ``model``), each
    variant is evaluated after conversion and the pack fails if one measures worse; the
    measurement is stored in the variant's ``quality``.

    Raises:
        UnsupportedConversionError: a target or format that cannot be packed (before any work).
        OutputExistsError: ``out`` exists and ``force`` is not set.
        ModelError, ConversionError: from inspection and conversion; nothing is left at ``out``.
        QualityError: a variant measured a larger loss than ``max_quality_loss``.
    """
    for what, value in (("model", model), ("out", out)):
        if not isinstance(value, str | os.PathLike):
            raise UnsupportedConversionError(
                f"pack's {what} is a path (a string or a Path), not {type(value).__name__}"
            )
    model, out = Path(model), Path(out)
    check_destination(out, force=force)
    check_apart(model, out)
    spec = inspect_model(model)
    bundle_name = name or out.name.removesuffix(".tar")
    planned = validate_pack(
        spec, model, variants, bundle_name=bundle_name, max_quality_loss=max_quality_loss
    )
    with atomic_path(out, force=force) as tmp_out, work_dir(out, "build") as build:
        folder = (build / bundle_name) if archive else tmp_out
        folder.mkdir()
        builder = _Builder(model, spec, folder, build, progress)
        gate = None if max_quality_loss is None else QualityGate(model, max_quality_loss, progress)
        with gate or nullcontext():  # the reference is closed however the pack ends
            built = [builder.build(i, p, len(planned), gate) for i, p in enumerate(planned)]
        manifest = _manifest(model, spec, bundle_name, folder, built)
        write_new(folder / MANIFEST_NAME, manifest.to_json())
        verify_bundle(folder, read_manifest(folder), checksums=True)
        progress(
            ProgressEvent(stage="pack", done=len(planned), total=len(planned), detail="verified")
        )
        if archive:
            write_archive(folder, tmp_out)
            list_members(tmp_out)  # what edgekit writes, edgekit's own reader accepts
    return PackResult(path=out, manifest=manifest, warnings=tuple(builder.warnings))


class _Builder:
    """Converts the planned variants of one pack into its folder, one after the other;
    intermediates of a route (a dequantized HF folder) are written once and reused."""

    def __init__(
        self, model: Path, spec: ModelSpec, folder: Path, scratch: Path, progress: ProgressCallback
    ) -> None:
        self.model, self.spec, self.folder, self.scratch = model, spec, folder, scratch
        self.progress = progress
        self.reuse: dict[tuple[Path, str], Path] = {}
        self.warnings: list[str] = []

    def build(
        self, index: int, planned: PlannedVariant, total: int, gate: QualityGate | None
    ) -> Variant:
        fmt = planned.target.format
        variant_dir = self.folder / planned.name
        path = variant_dir / fmt.entry if fmt.entry else variant_dir
        if fmt.entry:
            variant_dir.mkdir()
        self.progress(ProgressEvent(stage="pack", done=index, total=total, detail=planned.name))
        converted = convert.convert_along(
            planned.route,
            self.model,
            self.spec,
            path,
            quant=planned.quant,
            recipe=planned.recipe,
            scratch=self.scratch,
            reuse=self.reuse,
            context=self._context(planned),
            progress=self.progress,
        )
        self.warnings.extend(w for w in converted.warnings if w not in self.warnings)
        measured = gate.check(planned.target, planned.quant, path) if gate is not None else None
        return self._variant(planned, variant_dir, path, measured)

    def _context(self, planned: PlannedVariant) -> int:
        """The context the variant is packed for (the runtime's, and a static KV cache's)."""
        return planned.request.context or min(self.spec.context_length, DEFAULT_CONTEXT)

    def _variant(
        self, planned: PlannedVariant, variant_dir: Path, path: Path, measured: Quality | None
    ) -> Variant:
        recipe = planned.recipe
        context = self._context(planned)
        predicted = planned.request.predicted or Figures(
            memory_bytes=memory_parts(
                inspect_model(path),
                planned.target,
                planned.quant,
                context=context,
                kv_cache=recipe.kv_cache,
                unit_kind=load_unit(planned.target, "auto"),
            ).memory_bytes,
            source="estimate",
        )
        return Variant(
            name=planned.name,
            target=planned.target.name,
            format=planned.target.format.name,
            quant=planned.quant,
            recipe=asdict(recipe),
            entry=path.relative_to(self.folder).as_posix(),
            files=file_entries(self.folder, variant_dir),
            runtime=RuntimeSettings(context=context, kv_cache=recipe.kv_cache),
            predicted=predicted,
            quality=measured,
        )


def _manifest(
    model: Path, spec: ModelSpec, bundle_name: str, folder: Path, built: list[Variant]
) -> Manifest:
    return Manifest(
        schema_version=SCHEMA_VERSION,
        name=bundle_name,
        model=ModelIdentity(
            name=spec.name or model.name,
            family=spec.family,
            architecture=spec.architecture,
            parameters=spec.parameters,
            context_length=spec.context_length,
            source=SourceModel(
                path=str(model),
                format=spec.format,
                sha256=source_checksum(model),
                file_type=spec.file_type,
            ),
        ),
        tokenizer=tokenizer_info(folder / built[0].entry),
        variants=tuple(built),
        provenance=Provenance(
            edgekit_version=__version__,
            created=datetime.now(UTC).isoformat(timespec="seconds"),
            backends=backend_versions(),
            host=f"{socket.gethostname()} ({platform.system()} {platform.machine()})",
        ),
    )


def validate_pack(
    spec: ModelSpec,
    model: Path,
    variants: list[VariantRequest],
    *,
    bundle_name: str,
    max_quality_loss: float | None,
) -> list[PlannedVariant]:
    """Everything ``pack`` can know before converting anything, for every variant: the
    target and format exist, a conversion route leads there, every step of it can take
    the source and options with the tools installed here, no variant is asked for twice.
    A pack that would refuse its third variant refuses before converting the first.

    Raises:
        UnsupportedConversionError: a target, format, option or source that cannot be packed.
        TargetUnavailableError: a conversion tool (or, with ``max_quality_loss``, the
            target that evaluates the variant) is not installed here.
    """
    if not isinstance(variants, list | tuple) or not all(
        isinstance(v, VariantRequest) for v in variants
    ):
        raise UnsupportedConversionError(
            "variants must be a list of VariantRequest",
            hint="e.g. [VariantRequest(quant='Q4_K_M')]",
        )
    if not variants:
        raise UnsupportedConversionError(
            "no variant asked for", hint="pass --quant Q4_K_M (or several)"
        )
    _check_bundle_name(bundle_name)
    if max_quality_loss is not None and not (
        math.isfinite(max_quality_loss) and max_quality_loss > 0
    ):
        raise UnsupportedConversionError(
            f"--max-quality-loss {max_quality_loss} is not a positive number of nats per token",
            hint="e.g. --max-quality-loss 0.05",
        )
    planned: list[PlannedVariant] = []
    for request in variants:
        variant = _plan_variant(spec, model, request)
        if any(p.name == variant.name for p in planned):
            raise UnsupportedConversionError(
                f"variant {variant.name} is asked for twice",
                hint="list each target:format once",
            )
        if max_quality_loss is not None:
            check_evaluable(variant.target)
        planned.append(variant)
    return planned


def _plan_variant(spec: ModelSpec, model: Path, request: VariantRequest) -> PlannedVariant:
    target = _packable_target(request.target)
    fmt = target.format
    asked = fmt.pack_default() if request.quant is None else request.quant
    quant = fmt.quant(asked) if isinstance(asked, str) else None
    if quant is None:
        raise UnsupportedConversionError(
            f"{clean_text(str(asked))!r} is not one of the {fmt.display} quantizations",
            hint=f"choose one of {', '.join(fmt.quants)}",
        )
    context = request.context
    if context is not None and (
        isinstance(context, bool) or not isinstance(context, int) or not 0 < context <= MAX_CONTEXT
    ):
        raise UnsupportedConversionError(
            f"context {clean_text(repr(context))} is not a usable context length",
            hint=f"pass a positive number of tokens up to {MAX_CONTEXT:,}, e.g. 4096",
        )
    recipe = Recipe(weights=quant.name).with_options(request.recipe)
    route = convert.check_conversion(spec, model, fmt.name, quant=quant.name, recipe=recipe)
    return PlannedVariant(
        request=request, target=target, quant=quant.name, recipe=recipe, route=route
    )


def _packable_target(name: str) -> type[Target]:
    """The registered target ``name``, when edgekit can build its format.

    Raises:
        UnsupportedConversionError: no such target, or its format cannot be built yet.
    """
    packable = [t.name for t in all_targets() if t.format.buildable]
    try:
        target = get_target(name)
    except TargetError as exc:
        # a registered plug-in that fails to load says why; an unknown name lists the rest
        broken = name in dict(registry.broken_targets())
        raise UnsupportedConversionError(
            exc.message if broken else f"target {clean_text(name)!r} cannot be packed",
            hint=exc.hint if broken else f"packable targets: {', '.join(packable)}",
        ) from exc
    if not target.format.buildable:
        raise UnsupportedConversionError(
            f"target {clean_text(name)!r} cannot be packed yet: edgekit does not build "
            f"{target.format.display} yet",
            hint=f"packable targets: {', '.join(packable)}",
        )
    return target


def _check_bundle_name(bundle_name: str) -> None:
    """The bundle's folder name (inside an archive too): one plain path component."""
    if (
        not bundle_name
        or bundle_name in (".", "..")
        or any(c in bundle_name for c in "/\\\0")
        or clean_text(bundle_name, max_len=256) != bundle_name
        or len(bundle_name.encode("utf-8")) > 200
    ):
        raise UnsupportedConversionError(
            f"bundle name {clean_text(bundle_name)!r} is not a plain folder name",
            hint="use letters, digits, '-', '_' and '.' (no '/', no '..')",
        )
