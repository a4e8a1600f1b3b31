"""Read a GGUF file's metadata and tensor table without touching the tensor data.

The reader streams the header through a small buffer, so inspecting a 40 GB file costs
the same few MB as a 100 MB one. Large arrays (the vocabulary, the merges) are skipped
and summarised by their length unless ``keep_arrays`` is set.

Layout (GGUF v2 and v3): magic ``GGUF``, u32 version, u64 tensor count, u64 key/value
count, the key/value pairs, the tensor infos, padding to ``general.alignment``, the data.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from edgekit.errors import ModelFormatError
from edgekit.ggml_types import GGML_TYPES, ggml_nbytes
from edgekit.modelspec import TensorInfo

GGUF_MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32
# Arrays longer than this are summarised, not read (the vocabulary has ~50k-250k entries).
SMALL_ARRAY = 1024
# No real key, string or dimension count comes near these; beyond them the file is corrupt.
MAX_STRING = 1 << 28
MAX_DIMS = 8

# GGUF value type id -> struct format of one scalar (None: string, array handled apart)
_SCALARS: dict[int, str] = {
    0: "<B",
    1: "<b",
    2: "<H",
    3: "<h",
    4: "<I",
    5: "<i",
    6: "<f",
    7: "<?",
    10: "<Q",
    11: "<q",
    12: "<d",
}
_STRING = 8
_ARRAY = 9


@dataclass(frozen=True, kw_only=True)
class ArraySummary:
    """A large metadata array, skipped: its element type and length."""

    item_type: int
    length: int


@dataclass(frozen=True, kw_only=True)
class GGUFHeader:
    path: Path
    version: int
    metadata: dict[str, Any]
    tensors: tuple[TensorInfo, ...]
    tensor_types: dict[str, int]
    tensor_offsets: dict[str, int]  # absolute byte offset of each tensor's data
    data_offset: int

    def get(self, key: str, default: Any = None) -> Any:
        return self.metadata.get(key, default)

    def array_length(self, key: str) -> int | None:
        value = self.metadata.get(key)
        if isinstance(value, ArraySummary):
            return value.length
        if isinstance(value, list):
            return len(value)
        return None


class _Reader:
    def __init__(self, f: BinaryIO, path: Path, size: int) -> None:
        self.f = f
        self.path = path
        self.size = size

    def read(self, n: int) -> bytes:
        data = self.f.read(n)
        if len(data) != n:
            raise ModelFormatError(
                f"{self.path}: GGUF header is truncated (wanted {n} bytes at offset "
                f"{self.f.tell() - len(data)}, the file has {self.size})"
            )
        return data

    def scalar(self, fmt: str) -> Any:
        return struct.unpack(fmt, self.read(struct.calcsize(fmt)))[0]

    def string(self) -> str:
        n = self.scalar("<Q")
        if n > MAX_STRING or n > self.size:
            raise ModelFormatError(f"{self.path}: corrupt GGUF metadata (a string of {n} bytes)")
        raw = self.read(n)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ModelFormatError(f"{self.path}: corrupt GGUF metadata (invalid UTF-8)") from exc

    def skip(self, n: int) -> None:
        if self.f.tell() + n > self.size:
            raise ModelFormatError(f"{self.path}: GGUF header is truncated")
        self.f.seek(n, 1)

    def value(self, vtype: int, keep_arrays: bool) -> Any:
        if vtype in _SCALARS:
            return self.scalar(_SCALARS[vtype])
        if vtype == _STRING:
            return self.string()
        if vtype == _ARRAY:
            item_type = self.scalar("<I")
            length = self.scalar("<Q")
            if length > self.size:
                raise ModelFormatError(f"{self.path}: corrupt GGUF metadata (array of {length})")
            if keep_arrays or length <= SMALL_ARRAY:
                return [self.value(item_type, keep_arrays) for _ in range(length)]
            self._skip_array(item_type, length)
            return ArraySummary(item_type=item_type, length=length)
        raise ModelFormatError(f"{self.path}: corrupt GGUF metadata (unknown value type {vtype})")

    def _skip_array(self, item_type: int, length: int) -> None:
        if item_type in _SCALARS:
            self.skip(struct.calcsize(_SCALARS[item_type]) * length)
        elif item_type == _STRING:
            for _ in range(length):
                n = self.scalar("<Q")
                if n > MAX_STRING:
                    raise ModelFormatError(f"{self.path}: corrupt GGUF metadata (string of {n})")
                self.skip(n)
        else:
            for _ in range(length):
                self.value(item_type, keep_arrays=False)


def read_gguf_header(path: str | Path, *, keep_arrays: bool = False) -> GGUFHeader:
    """Parse the header of a GGUF file.

    Raises:
        ModelFormatError: bad magic, unsupported version, truncated or corrupt metadata,
            unknown tensor type, or tensor data that runs past the end of the file.
    """
    path = Path(path)
    size = path.stat().st_size
    if size == 0:
        raise ModelFormatError(f"{path}: the file is empty")
    with path.open("rb") as f:
        r = _Reader(f, path, size)
        magic = f.read(4)
        if magic != GGUF_MAGIC:
            raise ModelFormatError(
                f"{path}: not a GGUF file (magic {magic!r}, expected {GGUF_MAGIC!r})",
                hint="pass a .gguf file, or a Hugging Face model folder",
            )
        version = r.scalar("<I")
        if version not in (2, 3):
            raise ModelFormatError(
                f"{path}: GGUF version {version} is not supported (edgekit reads v2 and v3)",
                hint="re-convert the model with a current llama.cpp or edgekit",
            )
        n_tensors = r.scalar("<Q")
        n_kv = r.scalar("<Q")
        # Every tensor info and key/value pair takes at least 8 bytes: anything larger
        # than the file can hold is corruption, caught before looping over it.
        if n_tensors > size // 8 or n_kv > size // 8:
            raise ModelFormatError(
                f"{path}: corrupt GGUF header ({n_tensors} tensors, {n_kv} keys in {size} bytes)"
            )
        metadata: dict[str, Any] = {}
        for _ in range(n_kv):
            key = r.string()
            vtype = r.scalar("<I")
            metadata[key] = r.value(vtype, keep_arrays)

        tensors: list[TensorInfo] = []
        tensor_types: dict[str, int] = {}
        offsets: list[tuple[int, int]] = []
        for _ in range(n_tensors):
            name = r.string()
            n_dims = r.scalar("<I")
            if n_dims > MAX_DIMS:
                raise ModelFormatError(f"{path}: corrupt tensor info for {name!r} ({n_dims} dims)")
            dims = [r.scalar("<Q") for _ in range(n_dims)]
            type_id = r.scalar("<I")
            offset = r.scalar("<Q")
            ggml_type = GGML_TYPES.get(type_id)
            if ggml_type is None:
                raise ModelFormatError(
                    f"{path}: tensor {name!r} has unknown GGML type {type_id}",
                    hint="the file may need a newer edgekit, or it is corrupt",
                )
            numel = 1
            for d in dims:
                numel *= d
            nbytes = ggml_nbytes(type_id, numel)
            # GGUF lists the innermost dimension first; report PyTorch order.
            shape = tuple(reversed(dims))
            tensors.append(TensorInfo(name=name, shape=shape, dtype=ggml_type.name, nbytes=nbytes))
            tensor_types[name] = type_id
            offsets.append((offset, nbytes))

        alignment = metadata.get("general.alignment", DEFAULT_ALIGNMENT)
        if not isinstance(alignment, int) or alignment <= 0:
            raise ModelFormatError(f"{path}: corrupt general.alignment {alignment!r}")
        here = f.tell()
        data_offset = (here + alignment - 1) // alignment * alignment

    for (offset, nbytes), tensor in zip(offsets, tensors, strict=True):
        end = data_offset + offset + nbytes
        if end > size:
            raise ModelFormatError(
                f"{path}: tensor data is truncated ({tensor.name!r} ends at byte {end}, "
                f"the file has {size})"
            )
    return GGUFHeader(
        path=path,
        version=version,
        metadata=metadata,
        tensors=tuple(tensors),
        tensor_types=tensor_types,
        tensor_offsets={
            t.name: data_offset + off for t, (off, _) in zip(tensors, offsets, strict=True)
        },
        data_offset=data_offset,
    )
