"""A TensorRT Edge-LLM variant folder, checked before any file of it is opened for use.

The layout is what ``tensorrt-edgellm-export`` writes plus edgekit's settings::

    <variant>/engine.json          the engine build settings (settings.EngineSettings)
    <variant>/llm/model.onnx       the graph (custom op trt_edgellm::AttentionPlugin)
    <variant>/llm/model.onnx.data  its external weights
    <variant>/llm/config.json      Edge-LLM's model config (dims, rope, kv_cache_dtype)
    <variant>/llm/embedding.safetensors   the token embedding [vocab, hidden]
    <variant>/llm/tokenizer.json, tokenizer_config.json, chat_template.jinja

A variant comes from a bundle edgekit did not write itself, so every entry must be a
regular file (no link, FIFO or device), of a bounded size, with no stray entries under
``llm/``; config.json is strict JSON with integer dims inside edgekit's model bounds,
agreeing with the embedding's shape and the settings; model.onnx's external data lies in
model.onnx.data only (onnx_refs). The engine builder (the target's)
and the export's own check (the converter's) both read it through ``read_export``.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import stat
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgekit.converters.tensorrt.onnx_refs import check_external_data
from edgekit.converters.tensorrt.settings import ENGINE_JSON, EngineSettings

from edgekit.atomic import write_atomic
from edgekit.cache import cache_root
from edgekit.errors import EdgekitError, ModelFormatError, ModelNotFoundError
from edgekit.modelspec import ModelSpec
from edgekit.safe_files import UnsafePathError, kind_of, open_regular
from edgekit.safetensors_header import read_safetensors_header
from edgekit.untrusted import parse_json

LLM = "llm"
ONNX, DATA, CONFIG = "model.onnx", "model.onnx.data", "config.json"
EMBEDDING = "embedding.safetensors"
_GIB = 1 << 30
# name -> the most bytes a real one holds (protobuf caps model.onnx at 2 GiB; the data
# of a 70B model at f16 is ~140 GB; a 256k-vocabulary tokenizer.json is ~35 MB)
FILES: dict[str, int] = {
    ONNX: 2 * _GIB,
    DATA: 1024 * _GIB,
    CONFIG: 1 << 20,
    EMBEDDING: 64 * _GIB,
    "tokenizer.json": 256 << 20,
    "tokenizer_config.json": 16 << 20,
    "chat_template.jinja": 1 << 20,
}
ENGINE_JSON_BYTES = 64 << 10
# what the engine builder copies beside llm.engine (the runtime reads the copies there)
BUILDER_COPIES = ("tokenizer.json", "tokenizer_config.json", EMBEDDING)
# config.json's dims, and edgekit's bound on each (modelspec's limits)
DIMS: dict[str, int] = {
    "vocab_size": 1 << 21,
    "hidden_size": 1 << 16,
    "num_hidden_layers": 1 << 12,
    "num_attention_heads": 1 << 12,
    "num_key_value_heads": 1 << 12,
    "head_dim": 1 << 12,
    "max_position_embeddings": 1 << 26,
}
HINT = "export the model again: edgekit convert MODEL --to tensorrt -o DIR"


@dataclass(frozen=True)
class ExportFolder:
    root: Path
    llm: Path
    config: Mapping[str, Any]
    settings: EngineSettings
    onnx_bytes: int
    data_bytes: int
    embedding_bytes: int


def _bad(where: str, what: str) -> ModelFormatError:
    return ModelFormatError(f"{where}: {what}", hint=HINT)


def _only_known(root: Path) -> None:
    """The variant folder holds llm/ and engine.json and nothing else: whatever else an
    exporter wrote there (a link to /etc, a script) would be published and packed
    unchecked. A link or special file named like either is refused by the reads."""
    with os.scandir(root) as entries:
        for n, entry in enumerate(entries):
            if n >= 16:
                raise _bad(str(root), "holds far more entries than an export")
            if entry.name not in (LLM, ENGINE_JSON):
                what = kind_of(entry.stat(follow_symlinks=False).st_mode)
                raise _bad(
                    str(root / entry.name),
                    f"is {what} that is not part of an Edge-LLM variant (llm/, {ENGINE_JSON})",
                )


def _sizes(root: Path) -> dict[str, int]:
    """The size of every file under ``llm/``, each a regular file (lstat: no link
    followed) within its bound, and nothing else there."""
    _only_known(root)
    llm = root / LLM
    try:
        mode = os.lstat(llm).st_mode
    except OSError as exc:
        raise _bad(str(llm), "missing (a TensorRT Edge-LLM variant holds llm/)") from exc
    if not stat.S_ISDIR(mode):
        raise _bad(str(llm), f"is {kind_of(mode)}, not a folder")
    sizes: dict[str, int] = {}
    with os.scandir(llm) as entries:
        for n, entry in enumerate(entries):
            if n >= 4 * len(FILES):
                raise _bad(str(llm), "holds far more entries than an export")
            if entry.name not in FILES:
                raise _bad(str(llm / entry.name), "is not a file of an Edge-LLM export")
            st = entry.stat(follow_symlinks=False)
            if not stat.S_ISREG(st.st_mode):
                raise _bad(str(llm / entry.name), f"is {kind_of(st.st_mode)}, not a regular file")
            if st.st_size > FILES[entry.name]:
                raise _bad(
                    str(llm / entry.name),
                    f"{st.st_size:,} bytes is more than the {FILES[entry.name]:,} allowed",
                )
            sizes[entry.name] = st.st_size
    missing = [name for name in FILES if name not in sizes]
    if missing:
        raise _bad(str(llm), f"missing {', '.join(missing)}")
    return sizes


def _read(root: Path, rel: str, max_bytes: int) -> bytes:
    """The bytes of the regular file ``root/rel``, opened without following links."""
    try:
        fd = open_regular(root, rel)
    except UnsafePathError as exc:
        raise _bad(str(root / rel), exc.reason) from exc
    try:
        with os.fdopen(fd, "rb") as f:
            data = f.read(max_bytes + 1)
    except OSError as exc:
        raise _bad(str(root / rel), f"cannot be read ({exc.strerror})") from exc
    if len(data) > max_bytes:
        raise _bad(str(root / rel), f"larger than the {max_bytes:,} bytes allowed")
    return data


def _json(root: Path, rel: str, max_bytes: int) -> Any:
    return parse_json(
        _read(root, rel, max_bytes),
        where=str(root / rel),
        max_bytes=max_bytes,
        error=ModelFormatError,
        hint=HINT,
    )


def _config(root: Path, settings: EngineSettings) -> dict[str, Any]:
    where = str(root / LLM / CONFIG)
    config = _json(root, f"{LLM}/{CONFIG}", FILES[CONFIG])
    if not isinstance(config, dict):
        raise _bad(where, "is not a JSON object")
    for key, high in DIMS.items():
        value = config.get(key)
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= high:
            raise _bad(where, f"{key} is {str(value)[:40]!r}, not an integer from 1 to {high:,}")
    if config["num_attention_heads"] % config["num_key_value_heads"]:
        raise _bad(where, "num_key_value_heads does not divide num_attention_heads")
    if config.get("engine_role") != "llm":
        raise _bad(where, f"engine_role is {str(config.get('engine_role'))[:40]!r}, not 'llm'")
    if config.get("kv_cache_dtype") != settings.kv_cache_type:
        raise _bad(
            where,
            f"kv_cache_dtype {str(config.get('kv_cache_dtype'))[:40]!r} is not engine.json's "
            f"{settings.kv_cache_type}",
        )
    if config.get("edgellm_version") != settings.edgellm_version:
        raise _bad(
            where,
            f"exported by Edge-LLM {str(config.get('edgellm_version'))[:40]!r}, engine.json "
            f"says {settings.edgellm_version}",
        )
    context = config["max_position_embeddings"]
    if settings.max_kv_cache_capacity > context:
        raise _bad(
            str(root / ENGINE_JSON),
            f"a KV cache of {settings.max_kv_cache_capacity} tokens is more than the "
            f"model's {context:,}",
        )
    return config


def _embedding(root: Path, config: Mapping[str, Any]) -> None:
    path = root / LLM / EMBEDDING
    tensors = read_safetensors_header(path)
    want = (config["vocab_size"], config["hidden_size"])
    if len(tensors) != 1 or tensors[0].shape != want:
        shapes = ", ".join(f"{t.name} {list(t.shape)}" for t in tensors[:3])
        raise _bad(str(path), f"holds {shapes or 'nothing'}, not one tensor of {list(want)}")


def read_export(path: Path) -> ExportFolder:
    """Read and check the variant folder ``path`` (see the module text).

    Raises:
        ModelNotFoundError: ``path`` is not a folder.
        ModelFormatError: an entry is missing, a link, not a regular file, oversized or
            unexpected; engine.json or config.json is malformed or disagrees; the
            embedding's shape is not [vocab, hidden]; model.onnx is not an ONNX graph or
            names external data other than model.onnx.data (onnx_refs).
        TargetUnavailableError: the onnx package is missing.
    """
    if not path.is_dir():
        raise ModelNotFoundError(
            f"{path}: no such folder (a TensorRT Edge-LLM variant is a folder)",
            hint="pass the variant folder that edgekit convert --to tensorrt wrote",
        )
    sizes = _sizes(path)
    settings = EngineSettings.from_json(
        _json(path, ENGINE_JSON, ENGINE_JSON_BYTES), str(path / ENGINE_JSON)
    )
    config = _config(path, settings)
    _embedding(path, config)
    # the graph's external-data paths: the builder would read whatever they name
    check_external_data(
        _read(path, f"{LLM}/{ONNX}", FILES[ONNX]), str(path / LLM / ONNX), DATA, sizes[DATA], HINT
    )
    return ExportFolder(
        root=path,
        llm=path / LLM,
        config=config,
        settings=settings,
        onnx_bytes=sizes[ONNX],
        data_bytes=sizes[DATA],
        embedding_bytes=sizes[EMBEDDING],
    )


def check_matches(folder: ExportFolder, spec: ModelSpec) -> None:
    """The export describes the model ``spec`` describes (what an exporter that
    misread the source would get wrong).

    Raises:
        ModelFormatError: a dimension differs.
    """
    want = {
        "vocab_size": spec.vocab_size,
        "hidden_size": spec.hidden_size,
        "num_hidden_layers": spec.layers,
        "num_attention_heads": spec.heads,
        "num_key_value_heads": spec.kv_heads,
        "head_dim": spec.head_dim,
    }
    config = folder.config
    wrong = [f"{k} {config[k]} (source {v})" for k, v in want.items() if config[k] != v]
    if wrong:
        raise _bad(str(folder.llm / CONFIG), f"disagrees with the source: {', '.join(wrong)}")


def export_digest(folder: ExportFolder) -> str:
    """sha256 hex of what identifies the export's graph and weights: engine.json,
    config.json, model.onnx, model.onnx.data and the chat template, each hashed in full
    (a merged LoRA changes weights anywhere in model.onnx.data: a sample of it would let
    another model's cached engine be reused). A large file's hash is remembered in
    edgekit's cache (``file_sha256``), so a load does not reread ~100 GB each time. The
    files the engine builder copies beside the engine (BUILDER_COPIES) are the engine
    cache's to identify (its ``copied_files``), so that a change to them alone is named
    as such when the engine is rebuilt.

    Raises:
        ModelFormatError: a file changed into something unreadable since it was read.
    """
    h = hashlib.sha256()
    names = sorted(name for name in FILES if name not in BUILDER_COPIES)
    for rel in (ENGINE_JSON, *(f"{LLM}/{name}" for name in names)):
        size, digest = file_sha256(folder.root, rel)
        h.update(f"{rel}\0{size}\0{digest}\0".encode())
    return h.hexdigest()


# --- remembered hashes of large files ----------------------------------------------------------

MEMO_MIN = 16 << 20  # smaller files are hashed every time (milliseconds)
MEMO_BYTES = 4 << 10
# A file changed within this long of its last change may change again without its
# timestamps moving (they tick coarsely: ~4 ms on ext4, 2 s on FAT): its hash is not
# remembered until it is older ("racy git" has the same rule).
RACY_NS = 3 * 10**9
_HEX = frozenset("0123456789abcdef")
_MEMO_FLAGS = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)


def file_sha256(root: Path, rel: str) -> tuple[int, str]:
    """(size, sha256 hex) of the regular file ``root/rel``, opened without following
    links. A file of MEMO_MIN bytes or more is hashed once per identity: the memo, in
    ``<edgekit cache>/digests/``, is keyed by the file's real path, device, inode, size,
    mtime and ctime (ctime cannot be set by a user, so no file rewritten later matches
    an older memo); it lives in the user's cache, never beside the variant, so a bundle
    cannot bring a memo that vouches for bytes it does not hold.

    Raises:
        ModelFormatError: the file is missing, a link or not a regular file.
    """
    try:
        fd = open_regular(root, rel)
    except UnsafePathError as exc:
        raise _bad(str(root / rel), exc.reason) from exc
    with os.fdopen(fd, "rb") as f:
        before = os.fstat(f.fileno())
        if before.st_size < MEMO_MIN:
            return before.st_size, _hash_file(f)
        key = _identity(root / rel, before)
        memo = _memo_path(key)
        known = _recall(memo, key)
        if known:
            return before.st_size, known
        digest = _hash_file(f)
        after = os.fstat(f.fileno())
    if _identity(root / rel, after) == key and time.time_ns() - after.st_ctime_ns > RACY_NS:
        _remember(memo, key, digest)
    return before.st_size, digest


def _hash_file(f: Any) -> str:
    h = hashlib.sha256()
    while chunk := f.read(1 << 20):
        h.update(chunk)
    return h.hexdigest()


def _identity(path: Path, st: os.stat_result) -> list[Any]:
    real = os.path.realpath(path)
    return [real, st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]


def _memo_path(key: list[Any]) -> Path:
    name = hashlib.sha256(json.dumps(key).encode()).hexdigest()
    return cache_root() / "digests" / f"{name}.json"


def _recall(memo: Path, key: list[Any]) -> str:
    """The remembered sha256 for ``key``, or "" (no memo, or one not of this key)."""
    try:
        fd = os.open(memo, _MEMO_FLAGS)
    except OSError:
        return ""
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            return ""
        raw = f.read(MEMO_BYTES + 1)
    try:
        data = parse_json(raw, where=str(memo), max_bytes=MEMO_BYTES)
    except EdgekitError:  # a torn or foreign memo is none: the file is hashed again
        return ""
    if not isinstance(data, dict) or data.get("key") != key:
        return ""
    digest = data.get("sha256")
    if not isinstance(digest, str) or len(digest) != 64 or not set(digest) <= _HEX:
        return ""
    return digest


def _remember(memo: Path, key: list[Any], digest: str) -> None:
    # best effort: without the memo the next load hashes the file again
    with contextlib.suppress(OSError, EdgekitError):
        write_atomic(memo, json.dumps({"key": key, "sha256": digest}))
