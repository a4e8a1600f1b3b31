"""Read safetensors headers (single file or sharded) without reading tensor data.

A safetensors file is an 8-byte little-endian header length N, N bytes of JSON, then the
raw data. Each JSON entry names dtype, shape and ``data_offsets`` (begin, end) relative to
the data section; the header is validated against the file's real size so that a
truncated download is caught here, not deep inside a converter.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path

from edgekit.errors import ModelFormatError
from edgekit.ggml_types import SAFETENSORS_DTYPE_SIZES
from edgekit.modelspec import TensorInfo

# The safetensors format caps its header at 100 MB; a larger value is corruption.
MAX_HEADER = 100_000_000
INDEX_NAME = "model.safetensors.index.json"


@dataclass(frozen=True, kw_only=True)
class TensorLocation:
    """Where a tensor's bytes lie: the file and the absolute byte offset in it."""

    file: Path
    offset: int
    info: TensorInfo


def read_safetensors_header(path: Path) -> tuple[TensorInfo, ...]:
    """Tensor infos of one .safetensors file.

    Raises:
        ModelFormatError: empty, truncated, or a header that is not valid safetensors JSON.
    """
    return tuple(loc.info for loc in _locations(path))


def _locations(path: Path) -> list[TensorLocation]:
    size = path.stat().st_size
    if size == 0:
        raise ModelFormatError(f"{path}: the file is empty")
    if size < 8:
        raise ModelFormatError(f"{path}: truncated safetensors file ({size} bytes)")
    with path.open("rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        if n > MAX_HEADER or n + 8 > size:
            raise ModelFormatError(
                f"{path}: corrupt or truncated safetensors header (declares {n} bytes, "
                f"the file has {size})"
            )
        raw = f.read(n)
    try:
        header = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ModelFormatError(f"{path}: corrupt safetensors header (not JSON: {exc})") from exc
    if not isinstance(header, dict):
        raise ModelFormatError(f"{path}: corrupt safetensors header (not a JSON object)")

    data_size = size - 8 - n
    locations: list[TensorLocation] = []
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        info, begin = _tensor(path, name, entry, data_size)
        locations.append(TensorLocation(file=path, offset=8 + n + begin, info=info))
    return locations


def _tensor(path: Path, name: str, entry: object, data_size: int) -> tuple[TensorInfo, int]:
    try:
        dtype = entry["dtype"]  # type: ignore[index]
        shape = tuple(int(d) for d in entry["shape"])  # type: ignore[index]
        begin, end = (int(x) for x in entry["data_offsets"])  # type: ignore[index]
    except (KeyError, TypeError, ValueError) as exc:
        raise ModelFormatError(f"{path}: corrupt safetensors entry for {name!r}") from exc
    itemsize = SAFETENSORS_DTYPE_SIZES.get(dtype)
    if itemsize is None:
        raise ModelFormatError(f"{path}: tensor {name!r} has unknown dtype {dtype!r}")
    numel = 1
    for d in shape:
        numel *= d
    if end - begin != numel * itemsize or begin < 0:
        raise ModelFormatError(
            f"{path}: corrupt safetensors entry for {name!r} (offsets {begin}..{end} do not "
            f"hold {shape} of {dtype})"
        )
    if end > data_size:
        raise ModelFormatError(
            f"{path}: truncated safetensors file ({name!r} ends at data byte {end}, the file "
            f"holds {data_size})"
        )
    return TensorInfo(name=name, shape=shape, dtype=dtype, nbytes=end - begin), begin


def safetensors_files(folder: Path) -> list[Path]:
    """The weight files of a model folder: the shards an index names, else every file.

    Raises:
        ModelFormatError: the index is corrupt or names a shard that is missing.
    """
    index = folder / INDEX_NAME
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
            names = sorted(set(weight_map.values()))
        except (json.JSONDecodeError, KeyError, TypeError, AttributeError) as exc:
            raise ModelFormatError(f"{index}: corrupt shard index") from exc
        missing = [n for n in names if not (folder / n).is_file()]
        if missing:
            raise ModelFormatError(
                f"{folder}: the shard index names files that are missing: {', '.join(missing)}"
            )
        return [folder / n for n in names]
    return sorted(folder.glob("*.safetensors"))


def read_folder_tensors(folder: Path) -> tuple[TensorInfo, ...]:
    """Every tensor of a (possibly sharded) safetensors model folder."""
    tensors: list[TensorInfo] = []
    for file in safetensors_files(folder):
        tensors.extend(read_safetensors_header(file))
    return tuple(tensors)


def locate_tensors(folder: Path) -> dict[str, TensorLocation]:
    """Every tensor of a model folder with the file and offset of its data."""
    return {loc.info.name: loc for f in safetensors_files(folder) for loc in _locations(f)}
