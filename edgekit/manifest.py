"""The bundle manifest: what a bundle holds, as frozen dataclasses and as JSON.

The dataclasses are the schema (``docs/bundle.schema.json`` is the published JSON Schema
of the same document; a test keeps the two in step). A manifest comes from a file edgekit
did not write, so reading it is strict: ``edgekit.untrusted.parse_json`` bounds its size
and nesting and refuses repeated keys and NaN; then an unknown ``schema_version``,
unknown or missing keys, wrong types, numbers out of range, repeated variant names, file
paths that are not plain relative paths (absolute, ``..``, ``.``, empty components,
backslashes, NUL) or listed twice, and a variant ``entry`` that is not one of the
variant's listed files (or the folder holding them) are all refused.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from edgekit.errors import BundleIntegrityError, BundleNotFoundError, BundleSchemaError
from edgekit.safe_files import UnsafePathError, open_regular, split_relative
from edgekit.schema import build, dataclass_json_schema
from edgekit.untrusted import clean_text, parse_json

MANIFEST_NAME = "manifest.json"
SCHEMA_VERSION = 1
# A manifest is a few kilobytes (chat templates are the largest part); 16 MiB is plenty.
MAX_MANIFEST_BYTES = 16 << 20
MAX_INT = (1 << 63) - 1  # sizes, counts, context lengths: anything larger is not real


@dataclass(frozen=True, kw_only=True)
class FileEntry:
    path: str  # relative to the bundle folder, '/'-separated
    size: int
    sha256: str


@dataclass(frozen=True, kw_only=True)
class SourceModel:
    path: str
    format: str  # "hf" or "gguf"
    sha256: str  # of the files' sha256s, in path order
    file_type: str | None = None


@dataclass(frozen=True, kw_only=True)
class ModelIdentity:
    name: str
    family: str
    architecture: str
    parameters: int
    context_length: int
    source: SourceModel


@dataclass(frozen=True, kw_only=True)
class TokenizerInfo:
    kind: str | None
    chat_template: str | None = None
    bos_token: str | None = None
    eos_token: str | None = None


@dataclass(frozen=True, kw_only=True)
class RuntimeSettings:
    """Defaults the runtime applies unless the caller overrides them."""

    context: int
    kv_cache: str = "f16"
    threads: int | None = None  # None: physical cores of the host
    device: str = "cpu"


@dataclass(frozen=True, kw_only=True)
class Figures:
    """Predicted (filled by the planner) or measured (filled by bench) figures."""

    memory_bytes: int | None = None
    prefill_tok_s: float | None = None
    decode_tok_s: float | None = None
    watts: float | None = None
    joules_per_token: float | None = None
    source: str | None = None  # how they were obtained: "estimate", "planner", a sensor name


@dataclass(frozen=True, kw_only=True)
class Quality:
    """Measured by ``edgekit eval`` against ``reference`` (docs/accuracy.md states the method;
    ``edgekit.accuracy.EvalResult.quality`` makes one)."""

    reference: str
    text: str
    perplexity: float
    reference_perplexity: float
    kl_mean: float
    kl_p99: float
    top1_agreement: float
    tokens_scored: int
    ctx: int


@dataclass(frozen=True, kw_only=True)
class Variant:
    name: str
    target: str
    format: str
    quant: str
    recipe: dict[str, Any]
    entry: str  # what the target loads: a file or a folder, relative to the bundle
    files: tuple[FileEntry, ...]
    runtime: RuntimeSettings
    predicted: Figures = field(default_factory=Figures)
    measured: Figures = field(default_factory=Figures)
    quality: Quality | None = None

    @property
    def size(self) -> int:
        return sum(f.size for f in self.files)


@dataclass(frozen=True, kw_only=True)
class Provenance:
    edgekit_version: str
    created: str  # ISO 8601, UTC
    backends: dict[str, str]
    host: str


@dataclass(frozen=True, kw_only=True)
class Manifest:
    schema_version: int
    name: str
    model: ModelIdentity
    tokenizer: TokenizerInfo
    variants: tuple[Variant, ...]
    provenance: Provenance

    def variant(self, name: str) -> Variant:
        """The variant called ``name``.

        Raises:
            BundleSchemaError: no such variant (the message lists those present).
        """
        for v in self.variants:
            if v.name == name:
                return v
        raise BundleSchemaError(
            f"the bundle has no variant {name!r}",
            hint=f"variants: {', '.join(v.name for v in self.variants)}",
        )

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2)


@dataclass(frozen=True, kw_only=True)
class OpenedBundle:
    """A bundle ready to load from: its folder (an archive's is in the cache) and its
    manifest, read and checked (``edgekit.bundle_open.open_bundle`` makes one)."""

    folder: Path
    manifest: Manifest

    def variant_path(self, variant: Variant) -> Path:
        return self.folder / variant.entry


def parse_manifest(text: str | bytes, where: str) -> Manifest:
    """A Manifest from JSON text.

    Raises:
        BundleSchemaError: see the module docstring; the message names the offending key.
    """
    data = parse_json(
        text,
        where=where,
        max_bytes=MAX_MANIFEST_BYTES,
        error=BundleSchemaError,
        hint="the manifest is damaged or was not written by edgekit: pack the bundle again",
    )
    version = data.get("schema_version") if isinstance(data, dict) else None
    if version != SCHEMA_VERSION or isinstance(version, bool):
        raise BundleSchemaError(
            f"{where}: manifest schema version {clean_text(repr(version), max_len=40)} is not "
            f"supported (this edgekit reads version {SCHEMA_VERSION})",
            hint="upgrade edgekit, or pack the bundle again with this version",
        )
    _check_numbers(data, where)
    manifest = build(Manifest, data, where, BundleSchemaError)
    if not manifest.variants:
        raise BundleSchemaError(f"{where}: the bundle has no variants")
    names = [v.name for v in manifest.variants]
    if len(set(names)) != len(names):
        raise BundleSchemaError(f"{where}: variant names repeat: {clean_text(', '.join(names))}")
    listed: set[str] = set()
    for v in manifest.variants:
        for f in v.files:
            _check_path(f.path, f"{where}: variant {v.name}: file path", where)
            if f.path in listed:
                raise BundleSchemaError(
                    f"{where}: file path {clean_text(f.path)!r} is listed twice"
                )
            listed.add(f.path)
            if f.size < 0:
                raise BundleSchemaError(f"{where}: {clean_text(f.path)!r} has size {f.size}")
        _check_entry(v, where)
    return manifest


def _check_path(path: str, what: str, where: str) -> None:
    if "\\" in path:
        raise BundleSchemaError(f"{what} {clean_text(path)!r} contains a backslash")
    try:
        split_relative(path)
    except UnsafePathError:
        raise BundleSchemaError(
            f"{what} {clean_text(path)!r} leaves the bundle or is not a plain relative path "
            "(absolute, '..', '.', an empty component or NUL)"
        ) from None


def _check_entry(variant: Variant, where: str) -> None:
    """The file (or folder) a target loads must be what was verified: one of the
    variant's own listed files, or the folder that holds them."""
    entry = variant.entry
    _check_path(entry, f"{where}: variant {variant.name}: entry", where)
    paths = [f.path for f in variant.files]
    if entry not in paths and not any(p.startswith(entry + "/") for p in paths):
        raise BundleSchemaError(
            f"{where}: variant {variant.name}: entry {clean_text(entry)!r} is not one of its "
            "listed files (or the folder holding them)",
            hint="the manifest was edited or damaged: pack the bundle again",
        )


def _check_numbers(data: Any, where: str) -> None:
    """Every number within range (a 400-digit integer is valid JSON, and breaks the
    arithmetic done on sizes and figures later). Iterative, with the key path."""
    stack: list[tuple[Any, str]] = [(data, "")]
    while stack:
        value, path = stack.pop()
        if isinstance(value, dict):
            stack.extend((v, f"{path}.{k}" if path else str(k)) for k, v in value.items())
        elif isinstance(value, list):
            stack.extend((v, f"{path}[{i}]") for i, v in enumerate(value))
        elif isinstance(value, bool):
            continue
        elif isinstance(value, int) and not -MAX_INT <= value <= MAX_INT:
            raise BundleSchemaError(f"{where}: {clean_text(path)}: the number is out of range")
        elif isinstance(value, float) and not math.isfinite(value):
            raise BundleSchemaError(f"{where}: {clean_text(path)}: not a finite number")


def read_manifest(folder: Path) -> Manifest:
    """The manifest of a bundle folder, read from a regular file inside it (never through
    a link) and at most ``MAX_MANIFEST_BYTES``.

    Raises:
        BundleNotFoundError: no manifest.json in ``folder``.
        BundleIntegrityError: manifest.json is a link or not a regular file.
        BundleSchemaError: see ``parse_manifest``.
    """
    path = folder / MANIFEST_NAME
    try:
        fd = open_regular(folder, MANIFEST_NAME)
    except UnsafePathError as exc:
        if exc.reason == "missing":
            raise BundleNotFoundError(
                f"{folder}: no {MANIFEST_NAME}, so this is not a bundle"
            ) from exc
        raise BundleIntegrityError(f"{path} {exc.reason}") from exc
    with os.fdopen(fd, "rb") as f:
        data = f.read(MAX_MANIFEST_BYTES + 1)
    return parse_manifest(data, str(path))


def json_schema() -> dict[str, Any]:
    """The JSON Schema of the manifest (``docs/bundle.schema.json``, ``edgekit schema``;
    a test keeps them equal)."""
    return dataclass_json_schema(
        Manifest,
        title="edgekit bundle manifest",
        schema_id="https://edgekit.dev/schemas/bundle-manifest-1.json",
        consts={"schema_version": SCHEMA_VERSION},
    )
