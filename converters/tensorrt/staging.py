"""The folder the Edge-LLM exporter is given: built by edgekit from the checked source.

The exporter reads its input with ``AutoConfig.from_pretrained(..., trust_remote_code=True)``
and falls back to the Hugging Face Hub for names it cannot find, so it never sees the
user's folder: it sees a staging folder inside the conversion's private folder holding
only what edgekit checked: config.json rewritten without ``auto_map`` (the key that makes
transformers import a Python file shipped with the model), the tokenizer and template
files (tokenizer_config.json without ``auto_map`` either), and one safetensors file of the
weights, never a .py file.

The weights are written one tensor at a time (peak memory: one tensor in f32 and its f16
copy): f32 tensors are cast to f16, because the exporter's FP16 linear layers refuse f32
activations for some families (Qwen2 at f32 fails with "FP16Linear expects float16
input") and the engine is F16 anyway; f16 and bf16 tensors are copied as they are.
"""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path
from typing import Any

from edgekit.converters.edge_checks import hf_side_files

from edgekit.atomic import open_new
from edgekit.errors import UnsupportedConversionError
from edgekit.safetensors_header import (
    MAX_HEADER,
    TensorLocation,
    locate_tensors,
    model_file,
    read_small,
)
from edgekit.untrusted import parse_json

CONFIG_BYTES = 4 << 20
WEIGHTS = "model.safetensors"


# what the exporter's F16 path takes: F32 is cast to F16 here, BF16 and F16 go as they
# are; an F8/INT weight without its scales, or F64/I64, would be cast blindly into a
# wrong model rather than refused by the exporter
FLOAT_DTYPES = ("F16", "BF16", "F32")


def check_dtypes(src: Path) -> None:
    """Every tensor of ``src`` is F16, BF16 or F32.

    Raises:
        UnsupportedConversionError: one is not (the first is named).
    """
    for loc in locate_tensors(src).values():
        if loc.info.dtype not in FLOAT_DTYPES:
            raise UnsupportedConversionError(
                f"{src}: tensor {loc.info.name} is {loc.info.dtype}; the Edge-LLM F16 export "
                f"takes {', '.join(FLOAT_DTYPES)} weights",
                hint="convert from the unquantized Hugging Face checkpoint",
            )


def needs_staging(src: Path) -> bool:
    """Whether ``src`` holds an f32 tensor (the exporter is given an f16 copy then)."""
    return any(loc.info.dtype == "F32" for loc in locate_tensors(src).values())


# the config keys that make transformers import code shipped with the model
REMOTE_CODE_KEYS = ("auto_map",)
_REWRITTEN = ("config.json", "tokenizer_config.json")


def stage_f16(src: Path, dest: Path) -> Path:
    """Write the staging folder of ``src`` at ``dest`` (a new folder): its f32 tensors
    cast to f16, the rest copied, the configs without remote-code keys; returns ``dest``."""
    dest.mkdir()
    config = _json_object(model_file(src, "config.json"))
    if needs_staging(src):
        config["dtype"] = "float16"  # transformers 5's key; 4.x wrote torch_dtype
        if "torch_dtype" in config:
            config["torch_dtype"] = "float16"
    _write_json(config, dest / "config.json")
    for path in hf_side_files(src):
        if path.name in _REWRITTEN:
            _write_json(_json_object(path), dest / path.name)
        else:
            shutil.copyfile(path, dest / path.name)
    _write_f16(list(locate_tensors(src).values()), dest / WEIGHTS)
    return dest


def _json_object(path: Path) -> dict[str, Any]:
    data = parse_json(read_small(path, CONFIG_BYTES), where=str(path), max_bytes=CONFIG_BYTES)
    if not isinstance(data, dict):
        raise UnsupportedConversionError(f"{path} is not a JSON object")
    return data


def _write_json(data: dict[str, Any], path: Path) -> None:
    clean = {k: v for k, v in data.items() if k not in REMOTE_CODE_KEYS}
    with open_new(path) as f:
        f.write(json.dumps(clean, indent=2).encode("utf-8"))


def _write_f16(locations: list[TensorLocation], path: Path) -> None:
    """One safetensors file of every tensor, F32 ones cast to F16 (round to nearest
    even), the rest copied as they are."""
    import numpy as np

    header: dict[str, Any] = {"__metadata__": {"format": "pt", "writer": "edgekit"}}
    offset = 0
    for loc in locations:
        dtype = "F16" if loc.info.dtype == "F32" else loc.info.dtype
        n = loc.info.nbytes // 2 if loc.info.dtype == "F32" else loc.info.nbytes
        header[loc.info.name] = {
            "dtype": dtype,
            "shape": list(loc.info.shape),
            "data_offsets": [offset, offset + n],
        }
        offset += n
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    if len(raw) > MAX_HEADER:
        raise UnsupportedConversionError(f"{path}: the staged header would be too large")
    with open_new(path) as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        for loc in locations:
            count = loc.info.numel
            if loc.info.dtype == "F32":
                data = np.memmap(
                    loc.file, dtype=np.float32, mode="r", offset=loc.offset, shape=(count,)
                )
                with np.errstate(over="ignore"):  # overflow is refused just below
                    half = data.astype(np.float16)
                # element by element: a source inf elsewhere must not hide an overflow
                if (np.isfinite(half) != np.isfinite(data)).any():
                    raise _beyond_f16(loc.info.name)
                half.tofile(f)
                del data, half
            else:
                if loc.info.dtype == "BF16":
                    _check_bf16_range(loc)  # the exporter casts it to the engine's F16
                with open(loc.file, "rb") as g:
                    g.seek(loc.offset)
                    _copy(g, f, loc.info.nbytes)


F16_MAX = 65504.0
_BF16_CHUNK = 1 << 24  # elements upcast at a time (64 MiB of float32)


def _beyond_f16(name: str) -> UnsupportedConversionError:
    return UnsupportedConversionError(
        f"{name}: values beyond f16's range ({F16_MAX:g}), which an F16 engine cannot hold",
        hint="this model needs a BF16 or quantized engine edgekit does not build",
    )


def _check_bf16_range(loc: TensorLocation) -> None:
    """Refuse a BF16 tensor holding a finite value an F16 engine would turn into inf (bf16
    shares f32's exponent range; the exporter casts to f16 without saying so)."""
    import numpy as np

    raw = np.memmap(loc.file, dtype=np.uint16, mode="r", offset=loc.offset, shape=(loc.info.numel,))
    for start in range(0, raw.shape[0], _BF16_CHUNK):
        values = (raw[start : start + _BF16_CHUNK].astype(np.uint32) << 16).view(np.float32)
        finite = values[np.isfinite(values)]
        if finite.size and float(np.abs(finite).max()) > F16_MAX:
            raise _beyond_f16(loc.info.name)
    del raw


def _copy(src: Any, dest: Any, n: int) -> None:
    left = n
    while left:
        chunk = src.read(min(left, 16 << 20))
        if not chunk:
            raise UnsupportedConversionError(f"{src.name}: shorter than its header says")
        dest.write(chunk)
        left -= len(chunk)
