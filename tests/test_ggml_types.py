"""edgekit's GGML tables agree with the compiled ggml library and with gguf-py."""

from __future__ import annotations

import ctypes
from pathlib import Path

import pytest

from edgekit.ggml_types import GGML_TYPES, LLAMA_FILE_TYPES
from tests.conftest import require

# gguf-py 0.19 still lists Q8_1 with float scales (4 + 4 + 32 bytes); ggml's block_q8_1
# holds two halves (36 bytes), which the library test below confirms. Q8_1 is an internal
# dot-product type that never appears in a model file.
GGUF_PY_STALE = {"Q8_1"}


def test_ggml_types_match_the_compiled_library() -> None:
    require("llama_cpp", "the cross-check calls ggml_type_size in llama.cpp's own library")
    import llama_cpp

    lib = ctypes.CDLL(str(Path(llama_cpp.__file__).parent / "lib" / "libggml-base.so"))
    lib.ggml_type_size.restype = ctypes.c_size_t
    lib.ggml_blck_size.restype = ctypes.c_int64
    lib.ggml_type_name.restype = ctypes.c_char_p
    for type_id, row in GGML_TYPES.items():
        assert lib.ggml_type_name(type_id).decode().upper() == row.name
        assert (lib.ggml_blck_size(type_id), lib.ggml_type_size(type_id)) == (
            row.block_size,
            row.type_size,
        ), row.name


def test_ggml_types_match_gguf_py() -> None:
    require("gguf", "the cross-check reads gguf-py's constants")
    import gguf

    for type_id, row in GGML_TYPES.items():
        qtype = gguf.GGMLQuantizationType(type_id)
        assert qtype.name == row.name
        if row.name not in GGUF_PY_STALE:
            assert gguf.GGML_QUANT_SIZES[qtype] == (row.block_size, row.type_size), row.name


def test_file_types_match_gguf_py() -> None:
    require("gguf", "the cross-check reads gguf-py's constants")
    import gguf

    for ftype_id, name in LLAMA_FILE_TYPES.items():
        member = gguf.LlamaFileType(ftype_id)
        expected = member.name.removeprefix("MOSTLY_").removeprefix("ALL_")
        assert expected == name, (ftype_id, member.name)


@pytest.mark.parametrize("type_id", sorted(GGML_TYPES))
def test_block_sizes_are_consistent(type_id: int) -> None:
    row = GGML_TYPES[type_id]
    assert row.block_size in (1, 32, 256)
    assert row.type_size > 0
