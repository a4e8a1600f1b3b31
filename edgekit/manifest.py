"""The bundle manifest: what a bundle holds, as frozen dataclasses and as JSON.

The dataclasses are the schema (``docs/bundle.schema.json`` is the published JSON Schema
of the same document; a test keeps the two in step). Reading rejects an unknown
``schema_version`` and unknown keys.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from edgekit.errors import BundleSchemaError
from edgekit.schema import build, dataclass_json_schema

MANIFEST_NAME = "manifest.json"
SCHEMA_VERSION = 1


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
    """Measured by ``edgekit eval`` against ``reference`` (docs/accuracy.md states the method)."""

    reference: str
    text: str
    perplexity: float
    reference_perplexity: float
    kl_mean: float
    kl_p99: float
    top1_agreement: float
    tokens_scored: int
    ctx: int

    @classmethod
    def of(cls, result: Any, *, reference: str, text: str) -> Quality:
        """From an ``edgekit.accuracy.EvalResult``."""
        return cls(
            reference=reference,
            text=text,
            perplexity=result.perplexity,
            reference_perplexity=result.reference_perplexity,
            kl_mean=result.kl_mean,
            kl_p99=result.kl_p99,
            top1_agreement=result.top1_agreement,
            tokens_scored=result.tokens_scored,
            ctx=result.ctx,
        )


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


def parse_manifest(text: str, where: str) -> Manifest:
    """A Manifest from JSON text.

    Raises:
        BundleSchemaError: invalid JSON, an unknown schema version, unknown or missing keys.
    """
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise BundleSchemaError(f"{where}: not valid JSON ({exc})") from exc
    version = data.get("schema_version") if isinstance(data, dict) else None
    if version != SCHEMA_VERSION:
        raise BundleSchemaError(
            f"{where}: manifest schema version {version!r} is not supported (this edgekit "
            f"reads version {SCHEMA_VERSION})",
            hint="upgrade edgekit, or pack the bundle again with this version",
        )
    manifest = build(Manifest, data, where, BundleSchemaError)
    if not manifest.variants:
        raise BundleSchemaError(f"{where}: the bundle has no variants")
    names = [v.name for v in manifest.variants]
    if len(set(names)) != len(names):
        raise BundleSchemaError(f"{where}: variant names repeat: {', '.join(names)}")
    for v in manifest.variants:
        for f in v.files:
            if f.path.startswith("/") or ".." in Path(f.path).parts:
                raise BundleSchemaError(f"{where}: file path {f.path!r} leaves the bundle")
    return manifest


def read_manifest(folder: Path) -> Manifest:
    path = folder / MANIFEST_NAME
    return parse_manifest(path.read_text(encoding="utf-8"), str(path))


def json_schema() -> dict[str, Any]:
    """The JSON Schema of the manifest (``docs/bundle.schema.json``, ``edgekit schema``;
    a test keeps them equal)."""
    return dataclass_json_schema(
        Manifest,
        title="edgekit bundle manifest",
        schema_id="https://edgekit.dev/schemas/bundle-manifest-1.json",
        consts={"schema_version": SCHEMA_VERSION},
    )
