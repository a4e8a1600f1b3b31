"""edgekit's GGML tables agree with gguf-py's, row by row."""

from __future__ import annotations

import pytest

from edgekit.ggml_types import GGML_TYPES, LLAMA_FILE_TYPES
from tests.conftest import require


def test_ggml_types_match_gguf_py() -> None:
    require("gguf", "the cross-check reads gguf-py's constants")
    import gguf

    for type_id, row in GGML_TYPES.items():
        qtype = gguf.GGMLQuantizationType(type_id)
        assert qtype.name == row.name
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
