"""Bundles: a folder (or one .tar of it) with manifest.json and the variants' files.

    bundle/
      manifest.json           schema: docs/bundle.schema.json
      gguf-q4_k_m/model.gguf  one folder per variant
      gguf-q8_0/model.gguf

``pack`` converts a model into one or more variants and writes the bundle atomically;
``open_bundle`` reads a folder or an archive (extracted safely into a cache);
``verify_bundle`` checks sizes and, when asked, checksums; ``choose_variant`` picks the
best variant that can run on this host and fits its memory.
"""

from __future__ import annotations

import hashlib
import math
import os
import platform
import socket
import stat
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from edgekit import __version__
from edgekit.archive import extract_archive, list_members, write_archive
from edgekit.atomic import (
    atomic_path,
    check_destination,
    work_dir,
    write_atomic,
    write_new,
)
from edgekit.cache import cache_root
from edgekit.errors import (
    BundleError,
    BundleIntegrityError,
    BundleNotFoundError,
    InsufficientMemoryError,
    NoUsableVariantError,
    UnsupportedConversionError,
)
from edgekit.inspection import inspect_model
from edgekit.manifest import (
    MANIFEST_NAME,
    SCHEMA_VERSION,
    Figures,
    FileEntry,
    Manifest,
    ModelIdentity,
    Provenance,
    Quality,
    RuntimeSettings,
    SourceModel,
    TokenizerInfo,
    Variant,
    read_manifest,
)
from edgekit.memory_estimate import MemoryEstimate, estimate_memory
from edgekit.modelspec import ModelSpec
from edgekit.progress import ProgressCallback, ProgressEvent, no_progress
from edgekit.safe_files import (
    UnsafePathError,
    kind_of,
    open_regular,
    read_capped,
    walk_no_follow,
)
from edgekit.untrusted import clean_text, parse_json

GB = 1e9
DEFAULT_CONTEXT = 4096
# target -> (bundle format, what the target loads inside the variant folder; "" = the folder)
PACKABLE = {"llamacpp": ("gguf", "model.gguf"), "openvino": ("openvino", "")}
_BACKENDS = ("llama-cpp-python", "gguf", "openvino", "onnxruntime", "mlx")


@dataclass(frozen=True, kw_only=True)
class VariantRequest:
    target: str = "llamacpp"
    quant: str = "Q4_K_M"
    recipe: str | None = None  # key=value options, as on the CLI
    context: int | None = None
    predicted: Figures | None = None  # the planner's figures (default: the memory estimate)


@dataclass(frozen=True, kw_only=True)
class PackResult:
    path: Path
    manifest: Manifest
    warnings: tuple[str, ...]


@dataclass(frozen=True, kw_only=True)
class OpenedBundle:
    folder: Path
    manifest: Manifest

    def variant_path(self, variant: Variant) -> Path:
        return self.folder / variant.entry


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    with path.open("rb") as f:
        return _sha256_of(f, chunk)


def _sha256_of(f: Any, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    while block := f.read(chunk):
        h.update(block)
    return h.hexdigest()


def _source_checksum(path: Path) -> str:
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    h = hashlib.sha256()
    for f in files:
        h.update(
            f"{f.relative_to(path.parent if path.is_file() else path)}\0{sha256_file(f)}\n".encode()
        )
    return h.hexdigest()


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
    from edgekit.converters.convert import convert_model
    from edgekit.converters.recipe import Recipe

    model, out = Path(model), Path(out)
    check_destination(out, force=force)
    spec = inspect_model(model)
    bundle_name = name or out.name.removesuffix(".tar")
    validate_pack(spec, model, variants, bundle_name=bundle_name, max_quality_loss=max_quality_loss)

    with (
        atomic_path(out, force=force) as tmp_out,
        work_dir(out, "build") as build,
    ):
        folder = (build / bundle_name) if archive else tmp_out
        folder.mkdir()
        built: list[Variant] = []
        warnings: list[str] = []
        hf_source: Path | None = None
        reference: tuple[Any, Any] | None = None
        for i, request in enumerate(variants):
            fmt, entry = PACKABLE[request.target]
            quant = request.quant.upper()
            variant_name = f"{fmt}-{quant.lower()}"
            variant_dir = folder / variant_name
            target_path = variant_dir / entry if entry else variant_dir
            if entry:
                variant_dir.mkdir()
            progress(ProgressEvent(stage="pack", done=i, total=len(variants), detail=variant_name))
            source = model
            if fmt == "openvino" and spec.format == "gguf":
                # OpenVINO exports start from a Hugging Face folder: dequantize once.
                if hf_source is None:
                    hf_source = build / "hf-source"
                    result = convert_model(model, "hf", hf_source, progress=progress)
                    warnings.extend(w for w in result.warnings if w not in warnings)
                source = hf_source
            converted = convert_model(
                source,
                "openvino" if fmt == "openvino" else "gguf",
                target_path,
                quant=quant,
                recipe=request.recipe,
                progress=progress,
            )
            warnings.extend(w for w in converted.warnings if w not in warnings)
            measured = None
            if max_quality_loss is not None:
                if reference is None:
                    reference = _open_source_reference(model)
                measured = _check_quality(
                    request.target,
                    quant,
                    target_path,
                    reference[0],
                    str(model),
                    max_quality_loss,
                    progress,
                )
            recipe = Recipe(weights=quant).with_options(request.recipe)
            context = request.context or min(spec.context_length, DEFAULT_CONTEXT)
            files = _file_entries(folder, variant_dir)
            weights = sum(f.size for f in files if f.path.endswith((".gguf", "openvino_model.bin")))
            estimate = estimate_memory(
                inspect_model(target_path),
                weight_bytes=weights,
                context=context,
                kv_cache=recipe.kv_cache,
                target=request.target,
            )
            built.append(
                Variant(
                    name=variant_name,
                    target=request.target,
                    format=fmt,
                    quant=quant,
                    recipe=asdict(recipe),
                    entry=target_path.relative_to(folder).as_posix(),
                    files=files,
                    runtime=RuntimeSettings(context=context, kv_cache=recipe.kv_cache),
                    predicted=request.predicted
                    or Figures(memory_bytes=estimate.total, source="estimate"),
                    quality=measured,
                )
            )
        if reference is not None:
            reference[1].close()
        manifest = Manifest(
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
                    sha256=_source_checksum(model),
                    file_type=spec.file_type,
                ),
            ),
            tokenizer=_tokenizer_info(folder / built[0].entry),
            variants=tuple(built),
            provenance=Provenance(
                edgekit_version=__version__,
                created=datetime.now(UTC).isoformat(timespec="seconds"),
                backends=_backend_versions(),
                host=f"{socket.gethostname()} ({platform.system()} {platform.machine()})",
            ),
        )
        write_new(folder / MANIFEST_NAME, manifest.to_json())
        verify_bundle(folder, read_manifest(folder), checksums=True)
        progress(
            ProgressEvent(stage="pack", done=len(variants), total=len(variants), detail="verified")
        )
        if archive:
            write_archive(folder, tmp_out)
            list_members(tmp_out)  # what edgekit writes, edgekit's own reader accepts
    return PackResult(path=out, manifest=manifest, warnings=tuple(warnings))


MAX_CONTEXT = 1 << 24


def validate_pack(
    spec: ModelSpec,
    model: Path,
    variants: list[VariantRequest],
    *,
    bundle_name: str,
    max_quality_loss: float | None,
) -> None:
    """Everything ``pack`` can know before converting anything, for every variant: the
    target and format exist, the conversion tools are installed, the source can be
    converted that way, the options are valid, no variant is asked for twice. A pack
    that would refuse its third variant refuses before converting the first.

    Raises:
        UnsupportedConversionError: a target, format, option or source that cannot be packed.
        TargetUnavailableError: a conversion tool (or, with ``max_quality_loss``, the
            target that evaluates the variant) is not installed here.
    """
    from edgekit.converters.convert import check_conversion
    from edgekit.converters.recipe import Recipe

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
    seen: set[str] = set()
    for request in variants:
        if request.target not in PACKABLE:
            raise UnsupportedConversionError(
                f"target {clean_text(request.target)!r} cannot be packed yet",
                hint=f"packable targets: {', '.join(PACKABLE)}",
            )
        formats = _formats(request.target)
        quant = request.quant.upper()
        if quant not in formats:
            raise UnsupportedConversionError(
                f"{clean_text(request.quant)!r} is not a {request.target} format",
                hint=f"choose one of {', '.join(formats)}",
            )
        fmt = PACKABLE[request.target][0]
        variant_name = f"{fmt}-{quant.lower()}"
        if variant_name in seen:
            raise UnsupportedConversionError(
                f"variant {variant_name} is asked for twice",
                hint="list each target:format once",
            )
        seen.add(variant_name)
        if request.context is not None and not 0 < request.context <= MAX_CONTEXT:
            raise UnsupportedConversionError(
                f"context {request.context} is not a usable context length",
                hint=f"pass a positive number of tokens up to {MAX_CONTEXT:,}, e.g. 4096",
            )
        recipe = Recipe(weights=quant).with_options(request.recipe)
        if fmt == "openvino" and spec.format == "gguf":
            # OpenVINO exports start from a Hugging Face folder: dequantized first.
            check_conversion(spec, model, "hf", quant=None, recipe=None)
        check_conversion(
            spec, model, "openvino" if fmt == "openvino" else "gguf", quant=quant, recipe=recipe
        )
        if max_quality_loss is not None:
            _check_evaluable(request.target)


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


def _check_evaluable(target: str) -> None:
    from edgekit.errors import TargetUnavailableError
    from edgekit.targets.availability import target_status
    from edgekit.targets.catalog import BY_NAME

    status = target_status(BY_NAME[target])
    if not status.usable:
        raise TargetUnavailableError(
            f"--max-quality-loss evaluates each variant on its target, and {target} cannot "
            f"run here: {status.detail}",
            hint="install the target's extra, or pack without --max-quality-loss",
        )


def update_variant(bundle: str | Path, variant: str, **changes: Any) -> Manifest:
    """Rewrite one variant's fields (``quality``, ``measured``, ...) in a bundle folder's
    manifest, atomically. Returns the new manifest.

    Raises:
        BundleError: the bundle cannot be opened, is an archive, or lacks the variant.
    """
    from dataclasses import replace

    opened = open_bundle(bundle)
    if Path(bundle).is_file():
        raise BundleError(
            f"{bundle} is an archive: results are recorded in bundle folders only",
            hint="unpack it (tar xf) and record into the folder",
        )
    opened.manifest.variant(variant)  # raises for an unknown variant
    manifest = replace(
        opened.manifest,
        variants=tuple(
            replace(v, **changes) if v.name == variant else v for v in opened.manifest.variants
        ),
    )
    write_atomic(opened.folder / MANIFEST_NAME, manifest.to_json())
    return manifest


def _open_source_reference(model: Path) -> tuple[Any, Any]:
    from edgekit.evaluation import open_reference

    return open_reference(str(model))


def _check_quality(
    target: str,
    quant: str,
    path: Path,
    reference: Any,
    reference_name: str,
    max_kl: float,
    progress: ProgressCallback,
) -> Quality:
    from edgekit.accuracy import evaluate
    from edgekit.converters import quality
    from edgekit.errors import QualityError
    from edgekit.targets.registry import get_target

    with get_target(target).load(path, logits=True) as session:
        result = evaluate(session, reference, ctx=512, chunks=4, progress=progress)
    quality.record(target, quant, result.kl_mean)
    if result.kl_mean > max_kl:
        sizes = [(f, _quality_rank_of(target, f)) for f in _formats(target)]
        better = quality.next_larger_meeting(target, sizes, quant, max_kl)
        raise QualityError(
            f"{target} {quant} measured a mean KL of {result.kl_mean:.4f} nats/token against the "
            f"source; --max-quality-loss allows {max_kl}",
            hint=f"{better} is expected to meet it"
            if better
            else "no known format of this target is expected to meet it: allow more loss",
        )
    return Quality.of(result, reference=reference_name, text="edgekit default text")


def _formats(target: str) -> tuple[str, ...]:
    if target == "openvino":
        from edgekit.converters.openvino_convert import OPENVINO_FORMATS

        return tuple(OPENVINO_FORMATS)
    from edgekit.converters.gguf_formats import GGUF_FORMATS

    return tuple(GGUF_FORMATS)


def _file_entries(bundle: Path, variant_dir: Path) -> tuple[FileEntry, ...]:
    return tuple(
        FileEntry(
            path=f.relative_to(bundle).as_posix(), size=f.stat().st_size, sha256=sha256_file(f)
        )
        for f in sorted(variant_dir.rglob("*"))
        if f.is_file()
    )


def _tokenizer_info(entry: Path) -> TokenizerInfo:
    if entry.is_dir():  # an exported folder keeps the tokenizer's own JSON files
        from edgekit.errors import ConversionError

        config_file = entry / "tokenizer_config.json"
        config = parse_json(
            read_capped(config_file, max_bytes=64 << 20, error=ConversionError),
            where=str(config_file),
            max_bytes=64 << 20,
            error=ConversionError,
        )
        if not isinstance(config, dict):
            raise ConversionError(f"{config_file}: not a JSON object")
        template_file = entry / "chat_template.jinja"
        template = (
            template_file.read_text(encoding="utf-8")
            if template_file.is_file()
            else config.get("chat_template")
        )
        spec = inspect_model(entry)
        return TokenizerInfo(
            kind=spec.tokenizer,
            chat_template=template,
            bos_token=config.get("bos_token"),
            eos_token=config.get("eos_token"),
        )
    from edgekit.gguf_header import read_gguf_header

    header = read_gguf_header(entry, keep_arrays=True)
    tokens = header.get("tokenizer.ggml.tokens") or []

    def token(key: str) -> str | None:
        i = header.get(f"tokenizer.ggml.{key}")
        return tokens[i] if isinstance(i, int) and 0 <= i < len(tokens) else None

    template = header.get("tokenizer.chat_template")
    kind = {"gpt2": "bpe-byte-level", "llama": "sentencepiece"}.get(
        str(header.get("tokenizer.ggml.model"))
    )
    return TokenizerInfo(
        kind=kind,
        chat_template=template if isinstance(template, str) else None,
        bos_token=token("bos_token_id"),
        eos_token=token("eos_token_id"),
    )


def _backend_versions() -> dict[str, str]:
    found = {}
    for dist in _BACKENDS:
        try:
            found[dist] = version(dist)
        except PackageNotFoundError:
            continue
    return found


def cache_folder() -> Path:
    """Where archives are extracted: $EDGEKIT_CACHE, else ~/.cache/edgekit."""
    return cache_root() / "bundles"


def open_bundle(path: str | Path) -> OpenedBundle:
    """A bundle folder, or an archive extracted (once) into the cache.

    Raises:
        BundleNotFoundError: nothing at ``path``, or no manifest.json in it.
        BundleSchemaError: the manifest is invalid or of an unknown version.
        UnsafeArchiveError: the archive was refused.
    """
    path = Path(path).expanduser()
    if not path.exists():
        raise BundleNotFoundError(f"{path}: no such bundle")
    if path.is_file():
        path = _extracted(path)
    elif not path.is_dir():
        raise BundleNotFoundError(f"{path}: neither a bundle folder nor a bundle archive")
    return OpenedBundle(folder=path, manifest=read_manifest(path))


def _extracted(archive: Path) -> Path:
    """The bundle folder of ``archive`` in the cache, extracted (safely) the first time.

    The extraction goes into a private hidden folder and is renamed into place only when
    the archive was accepted and its manifest read: a refused archive leaves nothing in
    the cache. A cache entry that is not one real folder with a manifest is replaced.
    """
    st = archive.stat()
    key = hashlib.sha256(
        f"{archive.resolve()}\0{st.st_size}\0{st.st_mtime_ns}".encode()
    ).hexdigest()[:16]
    dest = cache_folder() / key
    cached = _cached_bundle(dest)
    if cached is not None:
        return cached
    with work_dir(dest, "partial") as box:
        if os.path.lexists(dest):  # a damaged entry: moved aside, removed with the box
            os.rename(dest, box / "damaged")
        staged = box / key
        top = extract_archive(archive, staged)
        read_manifest(top)
        try:
            os.rename(staged, dest)
        except OSError:
            if _cached_bundle(dest) is None:  # not another process's finished extraction
                raise
    folder = _cached_bundle(dest)
    if folder is None:
        raise BundleError(f"{archive}: the extracted bundle disappeared from {dest}")
    return folder


def _cached_bundle(dest: Path) -> Path | None:
    """The bundle folder in a cache entry: exactly one real folder, holding a manifest."""
    try:
        if not stat.S_ISDIR(os.lstat(dest).st_mode):
            return None
        entries = list(os.scandir(dest))
    except OSError:
        return None
    if len(entries) != 1 or not entries[0].is_dir(follow_symlinks=False):
        return None
    folder = Path(entries[0].path)
    try:
        manifest = os.lstat(folder / MANIFEST_NAME)
    except OSError:
        return None
    return folder if stat.S_ISREG(manifest.st_mode) else None


def verify_bundle(folder: Path, manifest: Manifest, *, checksums: bool = True) -> None:
    """Check every file's presence and size, and its sha256 when ``checksums``.

    Raises:
        BundleIntegrityError: every mismatch found, listed.
    """
    verify_variants(folder, manifest.variants, checksums=checksums)


def verify_variants(folder: Path, variants: tuple[Variant, ...], *, checksums: bool) -> None:
    """``verify_bundle`` for some variants only (a damaged variant nobody loads is no obstacle).

    Every listed file must be a regular file inside the bundle, reached through real
    folders (no symbolic link anywhere on its path), of the listed size (and checksum);
    a variant whose entry is a folder must hold its listed files and nothing else.

    Raises:
        BundleIntegrityError: every problem found, listed.
    """
    problems: list[str] = []
    for variant in variants:
        for entry in variant.files:
            problem = _check_file(folder, entry, checksums=checksums)
            if problem:
                problems.append(f"{clean_text(entry.path)}: {problem}")
        if variant.entry not in {f.path for f in variant.files}:
            problems.extend(_check_folder_entry(folder, variant))
    if problems:
        raise BundleIntegrityError(f"{folder}: " + "; ".join(problems))


def _check_file(folder: Path, entry: FileEntry, *, checksums: bool) -> str | None:
    try:
        fd = open_regular(folder, entry.path)
    except UnsafePathError as exc:
        return exc.reason
    with os.fdopen(fd, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size != entry.size:
            return f"{size} bytes, the manifest says {entry.size}"
        if checksums and _sha256_of(f) != entry.sha256:
            return "sha256 differs from the manifest"
    return None


def _check_folder_entry(folder: Path, variant: Variant) -> list[str]:
    """A folder the target loads as a whole: nothing in it that was not verified."""
    listed = {f.path for f in variant.files}
    try:
        found = walk_no_follow(folder, variant.entry)
    except UnsafePathError as exc:
        return [f"{clean_text(variant.entry)}: {exc.reason}"]
    problems = []
    for rel, mode in found:
        if stat.S_ISDIR(mode) or rel in listed:
            continue
        what = kind_of(mode)
        problems.append(f"{clean_text(rel)}: {what} in the variant's folder that is not listed")
    return problems


def variant_memory(
    opened: OpenedBundle, variant: Variant, context: int | None = None
) -> MemoryEstimate:
    """Predicted memory of ``variant`` at ``context`` (default: its runtime setting).

    Raises:
        BundleIntegrityError: the variant's files are missing or of the wrong size.
    """
    verify_variants(opened.folder, (variant,), checksums=False)
    path = opened.variant_path(variant)
    return estimate_memory(
        inspect_model(path),
        weight_bytes=variant.size,
        context=context or variant.runtime.context,
        kv_cache=variant.runtime.kv_cache,
        target=variant.target,
    )


# OpenVINO formats' bits per weight (INT4 group-wise carries scales and zero points).
_OPENVINO_BITS = {"F16": 16.0, "INT8": 8.0, "INT4": 4.6, "INT4_SYM": 4.3}


def _quality_rank_of(target: str, quant: str) -> float:
    """Bits per weight of a format: more bits, less loss."""
    from edgekit.converters.gguf_formats import GGUF_FORMATS

    if target == "openvino":
        return _OPENVINO_BITS.get(quant, 16.0)
    fmt = GGUF_FORMATS.get(quant)
    return fmt.bits_per_weight if fmt else 16.0


def _quality_rank(variant: Variant) -> float:
    return _quality_rank_of(variant.target, variant.quant)


def choose_variant(
    opened: OpenedBundle,
    *,
    requested: str | None,
    available_bytes: int,
    runnable: set[str],
    context: int | None = None,
    force: bool = False,
) -> Variant:
    """The requested variant, or the highest-quality one this host can run and hold.

    Raises:
        NoUsableVariantError: no variant's target is installed and usable here.
        InsufficientMemoryError: the chosen (or every) variant is predicted not to fit;
            the message says by how much and which smaller variant would fit.
    """
    manifest = opened.manifest
    if requested is not None:
        chosen = manifest.variant(requested)
        if chosen.target not in runnable:
            raise NoUsableVariantError(
                f"variant {chosen.name} needs target {chosen.target!r}, which cannot run here",
                hint="run `edgekit probe` to see the usable targets",
            )
        candidates = [chosen]
    else:
        candidates = sorted(
            (v for v in manifest.variants if v.target in runnable), key=_quality_rank, reverse=True
        )
        if not candidates:
            targets = ", ".join(sorted({v.target for v in manifest.variants}))
            raise NoUsableVariantError(
                f"no variant of {manifest.name} can run here (it has {targets})",
                hint="install the target's extra, or pack a variant for a target this host has",
            )
    sized = [(v, variant_memory(opened, v, context).total) for v in candidates]
    for v, need in sized:
        if need <= available_bytes or force:
            return v
    v, need = sized[0]
    fitting = [
        (o.name, variant_memory(opened, o, context).total)
        for o in manifest.variants
        if o.target in runnable and variant_memory(opened, o, context).total <= available_bytes
    ]
    suggestion = (
        f"variant {fitting[0][0]} ({fitting[0][1] / GB:.2f} GB) would fit"
        if fitting
        else "a smaller format (e.g. Q4_K_M or Q3_K_M) or a shorter context would be needed"
    )
    raise InsufficientMemoryError(
        f"variant {v.name} needs {need / GB:.2f} GB (predicted); this host has "
        f"{available_bytes / GB:.2f} GB available: {(need - available_bytes) / GB:.2f} GB short",
        hint=f"{suggestion}; force=True (--force) loads it anyway",
    )
