"""Read a GGUF file's metadata and tensor table without touching the tensor data.

The reader streams the header through a small buffer, so inspecting a 40 GB file costs
the same few MB as a 100 MB one. Large arrays (the vocabulary, the merges) are skipped
and summarised by their length unless ``keep_arrays`` is set.

Layout (GGUF v2 and v3): magic ``GGUF``, u32 version, u64 tensor count, u64 key/value
count, the key/value pairs, the tensor infos, padding to ``general.alignment``, the data.

The header is hostile until checked: every count, length and nesting depth is bounded
before it is looped over or allocated, every key llama.cpp reads must hold the type it
reads (``KEY_TYPES``; a ``block_count`` that is a string or an array is refused here, not
inside llama.cpp), keys and tensor names are unique, and each tensor's data is aligned,
inside the file and overlaps no other.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from edgekit.errors import ModelFormatError
from edgekit.ggml_types import GGML_TYPES, ggml_nbytes
from edgekit.modelspec import TensorInfo, shown

GGUF_MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32
# Arrays longer than this are summarised, not read (the vocabulary has ~50k-250k entries).
SMALL_ARRAY = 1024
# Bounds no real file comes near; beyond them a file is corrupt or hostile.
MAX_KEY = 1 << 16  # the GGUF spec: keys are at most 65535 bytes
MAX_STRING = 1 << 26  # one string value (a chat template, an embedded tokenizer.json)
MAX_ARRAY = 1 << 22  # elements of one array (the largest vocabularies have 262,144)
MAX_ARRAY_DEPTH = 2  # an array of arrays at most; llama.cpp reads no nested arrays at all
MAX_KEYS = 1 << 16  # real files have ~40
MAX_TENSORS = 1 << 16  # a 405B model has ~1,100
MAX_ITEMS = 1 << 23  # strings read or skipped, and array elements kept, over the header
MAX_TENSOR_NAME = 63  # llama.cpp's GGML_MAX_NAME (64) includes the terminating NUL
MAX_DIMS = 4  # GGML_MAX_DIMS
MAX_ALIGNMENT = 1 << 16
HINT = "the file is corrupt or was not written for llama.cpp: convert the model again"

# GGUF value type ids
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
_INTS = frozenset({0, 1, 2, 3, 4, 5, 10, 11})
_FLOATS = frozenset({6, 12})
_BOOL = 7
TYPE_NAMES = {
    0: "uint8",
    1: "int8",
    2: "uint16",
    3: "int16",
    4: "uint32",
    5: "int32",
    6: "float32",
    7: "bool",
    8: "string",
    9: "array",
    10: "uint64",
    11: "int64",
    12: "float64",
}

# What each key llama.cpp reads must hold: int, float, bool, str, ints (an array of
# integers), floats, strs, or int|ints (a count that may be given per layer). Keys of
# the architecture are listed without their "{arch}." prefix.
KEY_TYPES: dict[str, str] = {
    "general.architecture": "str",
    "general.name": "str",
    "general.alignment": "int",
    "general.file_type": "int",
    "general.quantization_version": "int",
    "tokenizer.ggml.model": "str",
    "tokenizer.ggml.pre": "str",
    "tokenizer.ggml.tokens": "strs",
    "tokenizer.ggml.scores": "floats",
    "tokenizer.ggml.token_type": "ints",
    "tokenizer.ggml.merges": "strs",
    "tokenizer.ggml.add_bos_token": "bool",
    "tokenizer.ggml.add_eos_token": "bool",
    "tokenizer.ggml.add_space_prefix": "bool",
    "tokenizer.ggml.remove_extra_whitespaces": "bool",
    "tokenizer.chat_template": "str",
    "tokenizer.huggingface.json": "str",
}
ARCH_KEY_TYPES: dict[str, str] = {
    "context_length": "int",
    "embedding_length": "int",
    "block_count": "int",
    "feed_forward_length": "int",
    "vocab_size": "int",
    "attention.head_count": "int",
    "attention.head_count_kv": "int|ints",
    "attention.key_length": "int",
    "attention.value_length": "int",
    "attention.layer_norm_rms_epsilon": "float",
    "attention.layer_norm_epsilon": "float",
    "attention.sliding_window": "int",
    "rope.dimension_count": "int",
    "rope.freq_base": "float",
    "rope.scaling.type": "str",
    "rope.scaling.factor": "float",
    "rope.scaling.original_context_length": "int",
    "attn_logit_softcapping": "float",
    "final_logit_softcapping": "float",
}


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
    # key -> (GGUF value type, element type of an array or None): what the file declared
    value_types: dict[str, tuple[int, int | None]] = field(default_factory=dict)

    def get(self, key: str, default: Any = None) -> Any:
        return self.metadata.get(key, default)

    def array_length(self, key: str) -> int | None:
        value = self.metadata.get(key)
        if isinstance(value, ArraySummary):
            return value.length
        if isinstance(value, list):
            return len(value)
        return None


def _corrupt(path: Path, why: str) -> ModelFormatError:
    return ModelFormatError(f"{path}: corrupt GGUF header ({why})", hint=HINT)


class _Reader:
    def __init__(self, f: BinaryIO, path: Path, size: int) -> None:
        self.f = f
        self.path = path
        self.size = size
        self.items = 0  # strings and kept array elements so far (bounded by MAX_ITEMS)
        self.top_item: int | None = None  # element type of the last top-level array

    def read(self, n: int) -> bytes:
        data = self.f.read(n)
        if len(data) != n:
            raise ModelFormatError(
                f"{self.path}: GGUF header is truncated (wanted {n} bytes at offset "
                f"{self.f.tell() - len(data)}, the file has {self.size})",
                hint=HINT,
            )
        return data

    def scalar(self, fmt: str) -> Any:
        return struct.unpack(fmt, self.read(struct.calcsize(fmt)))[0]

    def count(self, n: int) -> None:
        self.items += n
        if self.items > MAX_ITEMS:
            raise _corrupt(self.path, f"more than {MAX_ITEMS:,} strings and array elements")

    def length(self, limit: int, what: str) -> int:
        n: int = self.scalar("<Q")
        if n > limit:
            raise _corrupt(self.path, f"{what} of {n:,} bytes (at most {limit:,})")
        return n  # a length past the end of the file fails as truncation on reading

    def string(self, limit: int = MAX_STRING, what: str = "a string") -> str:
        self.count(1)
        raw = self.read(self.length(limit, what))
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise _corrupt(self.path, f"{what} that is not UTF-8") from exc

    def skip(self, n: int) -> None:
        if self.f.tell() + n > self.size:
            raise ModelFormatError(f"{self.path}: GGUF header is truncated", hint=HINT)
        self.f.seek(n, 1)

    def value(self, vtype: int, key: str, keep_arrays: bool, depth: int = 0) -> Any:
        if vtype in _SCALARS:
            return self.scalar(_SCALARS[vtype])
        if vtype == _STRING:
            return self.string(what=f"{shown(key)}: a string")
        if vtype == _ARRAY:
            if depth >= MAX_ARRAY_DEPTH:
                raise _corrupt(
                    self.path, f"{shown(key)}: arrays nested more than {MAX_ARRAY_DEPTH} deep"
                )
            item_type = self.scalar("<I")
            length = self.scalar("<Q")
            if depth == 0:
                self.top_item = item_type
            if item_type not in _SCALARS and item_type not in (_STRING, _ARRAY):
                raise _corrupt(self.path, f"{shown(key)}: unknown array element type {item_type}")
            if length > MAX_ARRAY or length > self.size:
                raise _corrupt(
                    self.path, f"{shown(key)}: an array of {length:,} (at most {MAX_ARRAY:,})"
                )
            if keep_arrays or length <= SMALL_ARRAY:
                self.count(length)
                return [self.value(item_type, key, keep_arrays, depth + 1) for _ in range(length)]
            self._skip_array(item_type, length, key, depth)
            return ArraySummary(item_type=item_type, length=length)
        raise _corrupt(self.path, f"{shown(key)}: unknown value type {vtype}")

    def _skip_array(self, item_type: int, length: int, key: str, depth: int) -> None:
        if item_type in _SCALARS:
            self.skip(struct.calcsize(_SCALARS[item_type]) * length)
        elif item_type == _STRING:
            self.count(length)
            for _ in range(length):
                self.skip(self.length(MAX_STRING, f"{shown(key)}: a string"))
        else:
            for _ in range(length):
                self.value(item_type, key, keep_arrays=False, depth=depth + 1)


def read_gguf_header(path: str | Path, *, keep_arrays: bool = False) -> GGUFHeader:
    """Parse the header of a GGUF file.

    Raises:
        ModelFormatError: bad magic, unsupported version, truncated or corrupt metadata,
            a count, length or nesting beyond the bounds above, a key of the wrong type,
            a repeated key or tensor, an unknown tensor type, a misaligned, overlapping
            or truncated tensor.
    """
    path = Path(path)
    with path.open("rb") as f:
        size = f.seek(0, 2)
        f.seek(0)
        if size == 0:
            raise ModelFormatError(f"{path}: the file is empty", hint=HINT)
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
            raise _corrupt(path, f"{n_tensors} tensors, {n_kv} keys in {size} bytes")
        if n_kv > MAX_KEYS:
            raise _corrupt(path, f"{n_kv:,} metadata keys, at most {MAX_KEYS:,}")
        if n_tensors > MAX_TENSORS:
            raise _corrupt(path, f"{n_tensors:,} tensors, at most {MAX_TENSORS:,}")
        metadata: dict[str, Any] = {}
        types: dict[str, tuple[int, int | None]] = {}
        for _ in range(n_kv):
            key = r.string(MAX_KEY, "a metadata key")
            if key in metadata:
                raise _corrupt(path, f"the key {shown(key)} appears twice")
            vtype = r.scalar("<I")
            r.top_item = None
            metadata[key] = r.value(vtype, key, keep_arrays)
            types[key] = (vtype, r.top_item)
        _check_types(path, metadata, types)
        alignment = metadata.get("general.alignment", DEFAULT_ALIGNMENT)
        if not (0 < alignment <= MAX_ALIGNMENT and alignment & (alignment - 1) == 0):
            raise _corrupt(path, f"general.alignment = {alignment} is not a power of two")
        tensors, tensor_types, offsets = _tensor_infos(r, path, n_tensors, alignment)
        here = f.tell()
        data_offset = (here + alignment - 1) // alignment * alignment

    _check_data(path, tensors, offsets, data_offset, size)
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
        value_types=types,
    )


def _expected_type(key: str, arch: object) -> str | None:
    if key in KEY_TYPES:
        return KEY_TYPES[key]
    if key.startswith("tokenizer.ggml.") and key.endswith("_token_id"):
        return "int"
    if isinstance(arch, str) and key.startswith(arch + "."):
        return ARCH_KEY_TYPES.get(key[len(arch) + 1 :])
    return None


def _fits(kind: str, vtype: int, item: int | None, value: Any) -> bool:
    if kind == "int|ints":
        return _fits("int", vtype, item, value) or _fits("ints", vtype, item, value)
    if kind == "int":
        return vtype in _INTS
    if kind == "float":
        return vtype in _FLOATS and math.isfinite(value)
    if kind == "bool":
        return vtype == _BOOL
    if kind == "str":
        return vtype == _STRING
    element = {"ints": _INTS, "floats": _FLOATS, "strs": frozenset({_STRING})}[kind]
    return vtype == _ARRAY and item in element


_KIND_NAMES = {
    "int": "an integer",
    "float": "a finite number",
    "bool": "a bool",
    "str": "a string",
    "ints": "an array of integers",
    "floats": "an array of numbers",
    "strs": "an array of strings",
    "int|ints": "an integer or an array of integers",
}


def _check_types(
    path: Path, metadata: dict[str, Any], types: dict[str, tuple[int, int | None]]
) -> None:
    """Every key llama.cpp reads must hold the type it reads it as."""
    arch = metadata.get("general.architecture")
    for key, (vtype, item) in types.items():
        kind = _expected_type(key, arch if key != "general.architecture" else None)
        if kind is None or _fits(kind, vtype, item, metadata[key]):
            continue
        declared = TYPE_NAMES.get(vtype, str(vtype))
        if vtype == _ARRAY:
            declared += f" of {TYPE_NAMES.get(item or 0, str(item))}"
        raise ModelFormatError(
            f"{path}: GGUF metadata {shown(key)} must be {_KIND_NAMES[kind]}, but the file "
            f"holds {declared}" + (" (not finite)" if kind == "float" and vtype in _FLOATS else ""),
            hint=HINT,
        )


def _tensor_infos(
    r: _Reader, path: Path, n_tensors: int, alignment: int
) -> tuple[list[TensorInfo], dict[str, int], list[tuple[int, int]]]:
    tensors: list[TensorInfo] = []
    tensor_types: dict[str, int] = {}
    offsets: list[tuple[int, int]] = []
    for _ in range(n_tensors):
        name = r.string(MAX_TENSOR_NAME, "a tensor name")
        if name in tensor_types:
            raise _corrupt(path, f"the tensor {shown(name)} appears twice")
        n_dims = r.scalar("<I")
        if not 1 <= n_dims <= MAX_DIMS:
            raise _corrupt(path, f"tensor {shown(name)} has {n_dims} dimensions (1 to {MAX_DIMS})")
        dims = [r.scalar("<Q") for _ in range(n_dims)]
        type_id = r.scalar("<I")
        offset = r.scalar("<Q")
        ggml_type = GGML_TYPES.get(type_id)
        if ggml_type is None:
            raise ModelFormatError(
                f"{path}: tensor {shown(name)} has unknown GGML type {type_id}",
                hint="the file may need a newer edgekit, or it is corrupt",
            )
        if min(dims) < 1:
            raise _corrupt(path, f"tensor {shown(name)} has a dimension of 0")
        if dims[0] % ggml_type.block_size:
            raise _corrupt(
                path,
                f"tensor {shown(name)} rows of {dims[0]} are not whole {ggml_type.name} blocks "
                f"of {ggml_type.block_size}",
            )
        if offset % alignment:
            raise _corrupt(path, f"tensor {shown(name)} data is not aligned to {alignment}")
        numel = 1
        for d in dims:
            numel *= d
        nbytes = ggml_nbytes(type_id, numel)
        # GGUF lists the innermost dimension first; report PyTorch order.
        shape = tuple(reversed(dims))
        tensors.append(TensorInfo(name=name, shape=shape, dtype=ggml_type.name, nbytes=nbytes))
        tensor_types[name] = type_id
        offsets.append((offset, nbytes))
    return tensors, tensor_types, offsets


def _check_data(
    path: Path,
    tensors: list[TensorInfo],
    offsets: list[tuple[int, int]],
    data_offset: int,
    size: int,
) -> None:
    """Each tensor's bytes lie inside the file, and no two tensors share a byte."""
    spans = sorted(zip(offsets, tensors, strict=True), key=lambda s: s[0])
    end_of_previous, previous = 0, ""
    for (offset, nbytes), tensor in spans:
        end = data_offset + offset + nbytes
        if end > size:
            raise ModelFormatError(
                f"{path}: tensor data is truncated ({shown(tensor.name)} ends at byte {end}, "
                f"the file has {size})",
                hint=HINT,
            )
        if offset < end_of_previous:
            raise _corrupt(path, f"tensor {shown(tensor.name)} overlaps {shown(previous)}")
        end_of_previous, previous = offset + nbytes, tensor.name
