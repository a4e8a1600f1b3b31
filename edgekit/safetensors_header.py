"""Read safetensors headers (single file or sharded) without reading tensor data.

A safetensors file is an 8-byte little-endian header length N, N bytes of JSON, then the
raw data. Each JSON entry names dtype, shape and ``data_offsets`` (begin, end) relative to
the data section; the header is validated against the file's real size so that a
truncated download is caught here, not deep inside a converter.

Everything here is hostile until checked: the header's JSON is bounded in size and depth
(``edgekit.untrusted.parse_json``), every entry is typed, the tensors must tile the data
section exactly (no overlap, no gap: the format's own rule), and a shard index may only
name plain ``.safetensors`` files inside the model folder (``model_file``).
"""

from __future__ import annotations

import os
import stat
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgekit.errors import ModelFormatError
from edgekit.ggml_types import SAFETENSORS_DTYPE_SIZES
from edgekit.modelspec import TensorInfo, shown
from edgekit.untrusted import parse_json

# The format allows 100 MB; a 1T-parameter MoE shard's header is a few hundred KB, and a
# JSON header costs ~10x its size to parse: 16 MiB bounds that.
MAX_HEADER = 16 << 20
MAX_INDEX = 32 << 20  # the index of a 1T-parameter MoE (~150k tensors) is ~15 MB
MAX_DIMS = 8
MAX_TENSORS = 1 << 18  # per model folder
INDEX_NAME = "model.safetensors.index.json"
_HINT = "the file may be incomplete or corrupt: download or export it again"


@dataclass(frozen=True, kw_only=True)
class TensorLocation:
    """Where a tensor's bytes lie: the file and the absolute byte offset in it."""

    file: Path
    offset: int
    info: TensorInfo


class _MissingFile(ModelFormatError):
    """``model_file``: no such file (reported together with the others missing)."""


def model_file(folder: Path, name: object, *, suffix: str | None = None) -> Path:
    """``folder / name``, checked: ``name`` is a plain file name (no separator, not
    ``..``, ending with ``suffix`` when given), and it is a regular file inside the folder.
    A link is followed only to a file inside the folder, or, for a Hugging Face cache
    snapshot (``snapshots/REV/``), into that repository's ``blobs/``.

    Raises:
        ModelFormatError: a name that is not a plain file name, a link out of the folder,
            not a regular file (a FIFO, a device, a folder), or no such file.
    """
    plain = (
        isinstance(name, str)
        and 0 < len(name.encode("utf-8", "surrogatepass")) <= 255
        and name not in (".", "..")
        and not any(c in name for c in "/\\\x00")
        and (suffix is None or (name.endswith(suffix) and len(name) > len(suffix)))
    )
    if not plain:
        kind = f"a {suffix} file" if suffix else "a file"
        raise ModelFormatError(
            f"{folder}: {shown(name)} is not {kind} in the model folder (a plain file name)",
            hint="an index or header names files beside it only; this one was refused",
        )
    path = folder / str(name)
    try:
        st = path.lstat()
        if stat.S_ISLNK(st.st_mode):
            target = path.resolve(strict=True)
            if not _inside(folder.resolve(), target):
                raise ModelFormatError(
                    f"{path}: a link to {shown(str(target), 120)}, outside the model folder",
                    hint="copy the file into the model folder; links out of it are refused",
                )
            st = target.stat()
    except (FileNotFoundError, NotADirectoryError) as exc:
        raise _MissingFile(f"{path}: missing", hint=_HINT) from exc
    except RuntimeError as exc:  # Python 3.11's resolve() on a loop of links
        raise ModelFormatError(f"{path}: a loop of links", hint=_HINT) from exc
    except OSError as exc:
        raise ModelFormatError(f"{path}: cannot be read ({exc.strerror})", hint=_HINT) from exc
    if not stat.S_ISREG(st.st_mode):
        raise ModelFormatError(
            f"{path}: not a regular file", hint="model files are plain files; this one was refused"
        )
    return path


def _inside(root: Path, target: Path) -> bool:
    if target.is_relative_to(root):
        return True
    # huggingface_hub's cache: models--ORG--NAME/snapshots/REV/FILE -> ../../blobs/HASH
    return root.parent.name == "snapshots" and target.is_relative_to(root.parent.parent / "blobs")


def read_small(path: Path, max_bytes: int) -> bytes:
    """A file's bytes, refused before reading when larger than ``max_bytes``.

    Raises:
        ModelFormatError: larger than ``max_bytes``, or unreadable.
    """
    try:
        with path.open("rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size > max_bytes:
                raise ModelFormatError(
                    f"{path}: {size:,} bytes is larger than the {max_bytes:,} bytes allowed",
                    hint=_HINT,
                )
            # A file that grows past its stat size is cut there: never more than allowed.
            return f.read(size)
    except OSError as exc:
        raise ModelFormatError(f"{path}: cannot be read ({exc.strerror})", hint=_HINT) from exc


def read_safetensors_header(path: Path) -> tuple[TensorInfo, ...]:
    """Tensor infos of one .safetensors file.

    Raises:
        ModelFormatError: empty, truncated, or a header that is not valid safetensors JSON.
    """
    return tuple(loc.info for loc in _locations(path))


def _read_header(path: Path) -> tuple[Any, int, int]:
    """The parsed header, its length N, and the file size."""
    with path.open("rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size == 0:
            raise ModelFormatError(f"{path}: the file is empty", hint=_HINT)
        if size < 8:
            raise ModelFormatError(f"{path}: truncated safetensors file ({size} bytes)", hint=_HINT)
        (n,) = struct.unpack("<Q", f.read(8))
        if n + 8 > size:
            raise ModelFormatError(
                f"{path}: corrupt or truncated safetensors header (declares {n:,} bytes, "
                f"the file has {size:,})",
                hint=_HINT,
            )
        if n > MAX_HEADER:
            raise ModelFormatError(
                f"{path}: the safetensors header is {n:,} bytes, larger than the "
                f"{MAX_HEADER:,} bytes allowed",
                hint=_HINT,
            )
        raw = f.read(n)
    header = parse_json(
        raw,
        where=f"{path}: safetensors header",
        max_bytes=MAX_HEADER,
        max_depth=8,
        error=ModelFormatError,
        hint=_HINT,
    )
    if not isinstance(header, dict):
        raise ModelFormatError(
            f"{path}: corrupt safetensors header (not a JSON object)", hint=_HINT
        )
    return header, n, size


def _locations(path: Path) -> list[TensorLocation]:
    header, n, size = _read_header(path)
    meta = header.get("__metadata__", {})
    if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
        raise ModelFormatError(
            f"{path}: corrupt safetensors header (__metadata__ must map strings to strings)",
            hint=_HINT,
        )
    data_size = size - 8 - n
    spans: list[tuple[int, int, TensorInfo]] = []
    for name, entry in header.items():
        if name != "__metadata__":
            spans.append(_tensor(path, name, entry))
    _check_tiling(path, spans, data_size)
    return [TensorLocation(file=path, offset=8 + n + b, info=info) for b, _, info in spans]


def _is_count(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= 0


def _tensor(path: Path, name: str, entry: object) -> tuple[int, int, TensorInfo]:
    def corrupt(why: str) -> ModelFormatError:
        return ModelFormatError(
            f"{path}: corrupt safetensors entry for {shown(name, 90)}: {why}", hint=_HINT
        )

    if not isinstance(entry, dict):
        raise corrupt(f"{shown(entry)} is not an object")
    dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
    if not isinstance(dtype, str) or dtype not in SAFETENSORS_DTYPE_SIZES:
        raise corrupt(f"unknown dtype {shown(dtype)}")
    if not (isinstance(shape, list) and len(shape) <= MAX_DIMS and all(map(_is_count, shape))):
        raise corrupt(
            f"shape {shown(shape)} is not a list of at most {MAX_DIMS} non-negative integers"
        )
    if not (
        isinstance(offsets, list)
        and len(offsets) == 2
        and all(map(_is_count, offsets))
        and offsets[0] <= offsets[1]
    ):
        raise corrupt(f"data_offsets {shown(offsets)} are not [begin, end] with 0 <= begin <= end")
    begin, end = offsets
    numel = 1
    for d in shape:
        numel *= d
    if end - begin != numel * SAFETENSORS_DTYPE_SIZES[dtype]:
        raise corrupt(f"data_offsets {begin}..{end} do not hold a {dtype} tensor of shape {shape}")
    return begin, end, TensorInfo(name=name, shape=tuple(shape), dtype=dtype, nbytes=end - begin)


def _check_tiling(path: Path, spans: list[tuple[int, int, TensorInfo]], data_size: int) -> None:
    """The tensors must cover the data section exactly, each byte once."""
    spans.sort(key=lambda s: (s[0], s[1]))
    at, previous = 0, None
    for begin, end, info in spans:
        if begin < at:
            raise ModelFormatError(
                f"{path}: corrupt safetensors header ({shown(info.name, 90)} overlaps "
                f"{shown(previous, 90)})",
                hint=_HINT,
            )
        if begin > at:
            raise ModelFormatError(
                f"{path}: corrupt safetensors header (a gap of {begin - at:,} bytes before "
                f"{shown(info.name, 90)})",
                hint=_HINT,
            )
        at, previous = end, info.name
    if at > data_size:
        raise ModelFormatError(
            f"{path}: truncated safetensors file ({shown(previous, 90)} ends at data byte "
            f"{at:,}, the file holds {data_size:,})",
            hint=_HINT,
        )
    if at < data_size:
        raise ModelFormatError(
            f"{path}: corrupt safetensors file (a gap of {data_size - at:,} bytes after the "
            "last tensor)",
            hint=_HINT,
        )


def _read_index(folder: Path) -> dict[str, str]:
    """The index's weight_map: tensor name -> shard file name.

    Raises:
        ModelFormatError: too large, not JSON, or not ``{"weight_map": {str: str}}``.
    """
    path = model_file(folder, INDEX_NAME)
    data = parse_json(
        read_small(path, MAX_INDEX),
        where=str(path),
        max_bytes=MAX_INDEX,
        error=ModelFormatError,
        hint=_HINT,
    )
    weight_map = data.get("weight_map") if isinstance(data, dict) else None
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        raise ModelFormatError(
            f"{path}: corrupt shard index (needs a weight_map of tensor names to file names)",
            hint=_HINT,
        )
    if len(weight_map) > MAX_TENSORS:
        raise ModelFormatError(
            f"{path}: {len(weight_map):,} tensors, more than the {MAX_TENSORS:,} allowed",
            hint=_HINT,
        )
    return weight_map


def _has_index(folder: Path) -> bool:
    return os.path.lexists(folder / INDEX_NAME)  # a link, even a dangling one, is checked


def safetensors_files(folder: Path) -> list[Path]:
    """The weight files of a model folder: the shards an index names, else every
    ``*.safetensors`` file; each one checked by ``model_file``.

    Raises:
        ModelFormatError: the index is corrupt, names a file outside the folder or one
            that is missing, or a weight file is a link out or not a regular file.
    """
    return _weight_files(folder)[0]


def _weight_files(folder: Path) -> tuple[list[Path], dict[str, str] | None]:
    """The weight files, and the index's weight_map when there is an index."""
    if not _has_index(folder):
        return [model_file(folder, p.name) for p in sorted(folder.glob("*.safetensors"))], None
    index = _read_index(folder)
    files, missing = [], []
    for name in sorted(set(index.values())):
        try:
            files.append(model_file(folder, name, suffix=".safetensors"))
        except _MissingFile:
            missing.append(name)
    if missing:
        raise ModelFormatError(
            f"{folder}: the shard index names files that are missing: "
            + ", ".join(shown(m, 90) for m in missing[:5]),
            hint=_HINT,
        )
    return files, index


def _folder_locations(folder: Path) -> list[TensorLocation]:
    files, index = _weight_files(folder)
    where = folder / INDEX_NAME
    out: list[TensorLocation] = []
    seen: dict[str, Path] = {}
    for file in files:
        for loc in _locations(file):
            name = loc.info.name
            if name in seen:
                raise ModelFormatError(
                    f"{folder}: tensor {shown(name, 90)} appears in both {seen[name].name} "
                    f"and {file.name}",
                    hint=_HINT,
                )
            seen[name] = file
            if index is not None and index.get(name) != file.name:
                placed = index.get(name)
                raise ModelFormatError(
                    f"{where}: {file.name} holds {shown(name, 90)}, but the index "
                    + (f"places it in {shown(placed, 90)}" if placed else "does not list it"),
                    hint=_HINT,
                )
            out.append(loc)
            if len(out) > MAX_TENSORS:
                raise ModelFormatError(f"{folder}: more than {MAX_TENSORS:,} tensors", hint=_HINT)
    if index is not None:
        absent = [n for n in index if n not in seen]
        if absent:
            raise ModelFormatError(
                f"{where}: the index lists tensors no shard holds: "
                + ", ".join(shown(n, 90) for n in absent[:4]),
                hint=_HINT,
            )
    return out


def read_folder_tensors(folder: Path) -> tuple[TensorInfo, ...]:
    """Every tensor of a (possibly sharded) safetensors model folder.

    Raises:
        ModelFormatError: see ``safetensors_files``; a corrupt header; a tensor in two
            files; a tensor where the index does not place it.
    """
    return tuple(loc.info for loc in _folder_locations(folder))


def locate_tensors(folder: Path) -> dict[str, TensorLocation]:
    """Every tensor of a model folder with the file and offset of its data (checked as
    ``read_folder_tensors`` checks them)."""
    return {loc.info.name: loc for loc in _folder_locations(folder)}
