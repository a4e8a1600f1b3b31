"""What pack records about a built variant and its source: the files with their sizes
and checksums, the tokenizer's facts, the source's checksum, the tool versions."""

from __future__ import annotations

import hashlib
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from edgekit.bundle_open import sha256_file
from edgekit.errors import ConversionError
from edgekit.gguf_header import read_gguf_header
from edgekit.inspection import inspect_model
from edgekit.manifest import FileEntry, TokenizerInfo
from edgekit.safe_files import read_capped
from edgekit.targets.registry import all_targets
from edgekit.untrusted import parse_json

_TOKENIZER_JSON_BYTES = 64 << 20  # tokenizer_config.json with a long chat template
# GGUF tokenizer.ggml.model -> the tokenizer kind inspection reports for a folder
_GGUF_TOKENIZER_KINDS = {"gpt2": "bpe-byte-level", "llama": "sentencepiece"}


def source_checksum(path: Path) -> str:
    """One sha256 over every file of the source (a file, or a folder's files in path
    order, each as its relative path and its own sha256)."""
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    base = path.parent if path.is_file() else path
    h = hashlib.sha256()
    for f in files:
        h.update(f"{f.relative_to(base)}\0{sha256_file(f)}\n".encode())
    return h.hexdigest()


def file_entries(bundle: Path, variant_dir: Path) -> tuple[FileEntry, ...]:
    """Every file of a variant's folder, relative to the bundle, with size and sha256."""
    return tuple(
        FileEntry(
            path=f.relative_to(bundle).as_posix(), size=f.stat().st_size, sha256=sha256_file(f)
        )
        for f in sorted(variant_dir.rglob("*"))
        if f.is_file()
    )


def tokenizer_info(entry: Path) -> TokenizerInfo:
    """The tokenizer facts of a built variant: from the tokenizer's own JSON files in an
    exported folder, or from the metadata of a single model file."""
    return _folder_tokenizer(entry) if entry.is_dir() else _file_tokenizer(entry)


def _folder_tokenizer(entry: Path) -> TokenizerInfo:
    config_file = entry / "tokenizer_config.json"
    config = parse_json(
        read_capped(config_file, max_bytes=_TOKENIZER_JSON_BYTES, error=ConversionError),
        where=str(config_file),
        max_bytes=_TOKENIZER_JSON_BYTES,
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
    return TokenizerInfo(
        kind=inspect_model(entry).tokenizer,
        chat_template=template,
        bos_token=config.get("bos_token"),
        eos_token=config.get("eos_token"),
    )


def _file_tokenizer(entry: Path) -> TokenizerInfo:
    header = read_gguf_header(entry, keep_arrays=True)
    tokens = header.get("tokenizer.ggml.tokens") or []

    def token(key: str) -> str | None:
        i = header.get(f"tokenizer.ggml.{key}")
        return tokens[i] if isinstance(i, int) and 0 <= i < len(tokens) else None

    template = header.get("tokenizer.chat_template")
    return TokenizerInfo(
        kind=_GGUF_TOKENIZER_KINDS.get(str(header.get("tokenizer.ggml.model"))),
        chat_template=template if isinstance(template, str) else None,
        bos_token=token("bos_token_id"),
        eos_token=token("eos_token_id"),
    )


def backend_versions() -> dict[str, str]:
    """The installed versions of every registered target's SDK and of the tools its
    format's conversions run (what a bundle's provenance records)."""
    dists: dict[str, None] = {}
    for target in all_targets():
        dists[target.distribution] = None
        for edge in target.format.edges():
            dists.update(dict.fromkeys(edge.tools))
    found = {}
    for dist in dists:
        try:
            found[dist] = version(dist)
        except PackageNotFoundError:
            continue
    return found
