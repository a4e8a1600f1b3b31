"""Reading and writing tensors one at a time, as float32 numpy arrays.

Conversions stream: a tensor is memory-mapped from its file, widened to float32,
transformed, narrowed to the output type and written, before the next one is touched.
Peak memory is therefore about the largest tensor in float32 plus its output copy.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterable
from pathlib import Path
from typing import BinaryIO

import numpy as np

from edgekit.atomic import open_new
from edgekit.safetensors_header import TensorLocation

_NUMPY = {"F32": np.float32, "F16": np.float16, "F64": np.float64}


def read_safetensors_f32(loc: TensorLocation) -> np.ndarray:
    """One safetensors tensor as a float32 array (bf16 widened exactly)."""
    info = loc.info
    count = info.numel
    if info.dtype == "BF16":
        raw = np.memmap(loc.file, dtype=np.uint16, mode="r", offset=loc.offset, shape=(count,))
        out = (raw.astype(np.uint32) << 16).view(np.float32)
    elif info.dtype == "F32":
        # No copy: the mapped pages are read once, straight into the output.
        out = np.memmap(loc.file, dtype=np.float32, mode="r", offset=loc.offset, shape=(count,))
    elif info.dtype in _NUMPY:
        raw = np.memmap(
            loc.file, dtype=_NUMPY[info.dtype], mode="r", offset=loc.offset, shape=(count,)
        )
        out = raw.astype(np.float32)
    else:
        raise TypeError(f"{info.name}: dtype {info.dtype} is not a floating-point weight")
    return out.reshape(info.shape)


def f32_to_bf16_bits(x: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bit patterns (uint16), rounding to nearest even."""
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    rounding = ((bits >> 16) & 1) + np.uint32(0x7FFF)
    return ((bits + rounding) >> 16).astype(np.uint16)


def write_safetensors(
    path: Path, tensors: Iterable[tuple[str, tuple[int, ...]]], arrays: Iterable[np.ndarray]
) -> None:
    """Write a float32 safetensors file, streaming: the header is computed from the
    shapes first, then each array is written as it comes (in the same order).

    Raises:
        OutputExistsError: something is already at ``path`` (write into an atomic_path folder).
    """
    names_shapes = list(tensors)
    header: dict[str, object] = {"__metadata__": {"format": "pt", "writer": "edgekit"}}
    offset = 0
    for name, shape in names_shapes:
        n = 4 * int(np.prod(shape, dtype=np.int64))
        header[name] = {"dtype": "F32", "shape": list(shape), "data_offsets": [offset, offset + n]}
        offset += n
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    with open_new(path) as f:  # a new file: never through a link planted at its name
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        for (name, shape), array in zip(names_shapes, arrays, strict=True):
            _write_array(f, name, shape, array)


def _write_array(f: BinaryIO, name: str, shape: tuple[int, ...], array: np.ndarray) -> None:
    if tuple(array.shape) != tuple(shape):
        raise ValueError(f"{name}: shape {array.shape} differs from the planned {shape}")
    np.ascontiguousarray(array, dtype=np.float32).tofile(f)
