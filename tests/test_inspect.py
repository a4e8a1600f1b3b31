"""edgekit inspect: real models, every family's layout, and every kind of bad input."""

from __future__ import annotations

import json
import pickle
import struct
from pathlib import Path

import pytest

from edgekit.architectures import FAMILIES, dimensions_from_config, expected_tensors, family_for_hf
from edgekit.errors import (
    ModelFormatError,
    ModelNotFoundError,
    UnsafeModelError,
    UnsupportedArchitectureError,
)
from edgekit.inspection import inspect_model
from tests.builders import (
    FAMILY_CONFIGS,
    gguf_bytes,
    tiny_config,
    tiny_gguf_metadata,
    tiny_gguf_tensors,
    write_hf_folder,
)

# Llama-2-7B's published config: 6,738,415,616 parameters.
LLAMA2_7B = {
    "model_type": "llama",
    "architectures": ["LlamaForCausalLM"],
    "hidden_size": 4096,
    "intermediate_size": 11008,
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 32,
    "vocab_size": 32000,
    "max_position_embeddings": 4096,
}
# SmolLM2-135M: 30 layers, hidden 576, 9 heads / 3 KV heads, FFN 1536, vocab 49152, tied.
SMOLLM2_PARAMS = 134_515_008
SMOLLM2 = {
    "family": "llama",
    "layers": 30,
    "hidden_size": 576,
    "heads": 9,
    "kv_heads": 3,
    "head_dim": 64,
    "ffn_size": 1536,
    "vocab_size": 49152,
    "tied_embeddings": True,
}


def test_family_table_covers_the_required_families() -> None:
    keys = {f.key for f in FAMILIES}
    assert {"llama", "mistral", "qwen2", "qwen3", "phi3", "gemma3"} <= keys
    # every family has a test config: a new family without one fails here
    assert keys == set(FAMILY_CONFIGS)


@pytest.mark.parametrize("family", sorted(FAMILY_CONFIGS))
@pytest.mark.parametrize("shards", [1, 3])
def test_each_family_from_headers(tmp_path: Path, family: str, shards: int) -> None:
    config = tiny_config(family)
    fam = family_for_hf(config["model_type"])
    dims = dimensions_from_config(config, fam, "test")
    tensors = {t.name: (t.shape, "BF16") for t in expected_tensors(fam, dims)}
    folder = write_hf_folder(tmp_path / family, config, tensors, shards=shards)
    (folder / "tokenizer.json").write_text(
        json.dumps(
            {
                "added_tokens": [],
                "pre_tokenizer": {"type": "ByteLevel"},
                "model": {"type": "BPE", "vocab": {}, "merges": []},
            }
        )
    )

    spec = inspect_model(folder)

    assert spec.family == fam.key
    assert spec.format == "hf"
    assert spec.parameters_source == "tensors"
    assert spec.parameters == sum(t.numel for t in expected_tensors(fam, dims))
    assert {t.name: t.shape for t in spec.tensors} == {n: s for n, (s, _) in tensors.items()}
    assert spec.dtype == "BF16"
    assert spec.tokenizer == "bpe-byte-level"
    assert spec.chat_template is False
    assert (spec.layers, spec.hidden_size, spec.heads, spec.kv_heads) == (2, 64, 4, 2)
    assert spec.head_dim == config.get("head_dim", 16)
    assert spec.sliding_window == config.get("sliding_window")
    assert spec.tied_embeddings == (fam.tied_default or config.get("tie_word_embeddings", False))


def test_config_only_folder_is_described_from_the_config(tmp_path: Path) -> None:
    config = {**LLAMA2_7B, "torch_dtype": "float16"}
    tmp_path.joinpath("config.json").write_text(json.dumps(config))
    spec = inspect_model(tmp_path)
    assert spec.parameters_source == "config"
    assert spec.parameters == 6_738_415_616
    assert spec.dtype == "F16"
    assert spec.weight_bytes == 2 * 6_738_415_616


def test_multimodal_gemma3_reads_the_text_config(tmp_path: Path) -> None:
    config = {
        "model_type": "gemma3",
        "architectures": ["Gemma3ForConditionalGeneration"],
        "text_config": {k: v for k, v in tiny_config("gemma3").items() if k != "architectures"},
    }
    tmp_path.joinpath("config.json").write_text(json.dumps(config))
    spec = inspect_model(tmp_path)
    assert spec.family == "gemma3"
    assert spec.tied_embeddings is True
    assert spec.sliding_window == 512


def test_default_model_gguf(default_gguf: Path) -> None:
    spec = inspect_model(default_gguf)
    assert spec.format == "gguf"
    assert spec.parameters == pytest.approx(134.5e6, rel=0.005)
    assert spec.parameters == SMOLLM2_PARAMS
    for key, value in SMOLLM2.items():
        assert getattr(spec, key) == value, key
    assert spec.file_type == "Q4_1"
    assert spec.tokenizer == "bpe-byte-level"
    assert spec.chat_template is True
    shapes = {t.name: t.shape for t in spec.tensors}
    assert shapes["token_embd.weight"] == (49152, 576)
    assert shapes["blk.0.attn_q.weight"] == (576, 576)
    assert shapes["blk.0.attn_k.weight"] == (192, 576)
    assert shapes["blk.0.ffn_down.weight"] == (576, 1536)
    assert "output.weight" not in shapes
    assert len(spec.tensors) == 1 + 30 * 9 + 1


@pytest.mark.slow
def test_default_model_hf_export(smollm2_hf: Path, default_gguf: Path) -> None:
    spec = inspect_model(smollm2_hf)
    assert spec.format == "hf"
    assert spec.parameters == SMOLLM2_PARAMS
    for key, value in SMOLLM2.items():
        assert getattr(spec, key) == value, key
    assert spec.tokenizer == "bpe-byte-level"
    assert spec.chat_template is True
    # The export holds exactly the tensors the Llama layout predicts from its config.
    fam = family_for_hf("llama")
    config = json.loads((smollm2_hf / "config.json").read_text())
    expected = expected_tensors(fam, dimensions_from_config(config, fam, "export"))
    assert {t.name: t.shape for t in spec.tensors} == {t.name: t.shape for t in expected}


def test_inspect_reads_headers_only(default_gguf: Path) -> None:
    """Inspection of a 100 MB file must not read its data: a few MB of allocation at most."""
    import tracemalloc

    tracemalloc.start()
    inspect_model(default_gguf)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert peak < 8 << 20


# --- bad input ----------------------------------------------------------------------


def _hf(tmp_path: Path) -> Path:
    config = tiny_config("llama")
    fam = family_for_hf("llama")
    tensors = {
        t.name: (t.shape, "BF16")
        for t in expected_tensors(fam, dimensions_from_config(config, fam, "t"))
    }
    return write_hf_folder(tmp_path / "m", config, tensors)


def _truncate(path: Path, keep: int) -> None:
    data = path.read_bytes()
    path.write_bytes(data[:keep])


def case_missing_path(tmp_path: Path) -> Path:
    return tmp_path / "nope"


def case_missing_config(tmp_path: Path) -> Path:
    folder = _hf(tmp_path)
    (folder / "config.json").unlink()
    return folder


def case_config_not_json(tmp_path: Path) -> Path:
    folder = _hf(tmp_path)
    (folder / "config.json").write_text("{not json")
    return folder


def case_config_missing_key(tmp_path: Path) -> Path:
    folder = _hf(tmp_path)
    config = json.loads((folder / "config.json").read_text())
    del config["hidden_size"]
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def case_unsupported_architecture(tmp_path: Path) -> Path:
    folder = _hf(tmp_path)
    (folder / "config.json").write_text(
        json.dumps({"model_type": "bert", "architectures": ["BertModel"]})
    )
    return folder


def case_safetensors_header_truncated(tmp_path: Path) -> Path:
    folder = _hf(tmp_path)
    _truncate(folder / "model.safetensors", 100)
    return folder


def case_safetensors_data_truncated(tmp_path: Path) -> Path:
    folder = _hf(tmp_path)
    f = folder / "model.safetensors"
    _truncate(f, f.stat().st_size - 10)
    return folder


def case_safetensors_corrupt_header(tmp_path: Path) -> Path:
    folder = _hf(tmp_path)
    f = folder / "model.safetensors"
    data = bytearray(f.read_bytes())
    data[8:20] = b"#garbage####"
    f.write_bytes(bytes(data))
    return folder


def case_safetensors_huge_header_length(tmp_path: Path) -> Path:
    folder = _hf(tmp_path)
    f = folder / "model.safetensors"
    f.write_bytes(struct.pack("<Q", 1 << 60) + f.read_bytes()[8:])
    return folder


def case_safetensors_empty(tmp_path: Path) -> Path:
    folder = _hf(tmp_path)
    (folder / "model.safetensors").write_bytes(b"")
    return folder


def case_shard_missing(tmp_path: Path) -> Path:
    folder = _hf(tmp_path)
    (folder / "model.safetensors").unlink()
    (folder / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"a": "model-00001-of-00002.safetensors"}})
    )
    return folder


def case_pickle_only_folder(tmp_path: Path) -> Path:
    folder = _hf(tmp_path)
    (folder / "model.safetensors").unlink()
    (folder / "pytorch_model.bin").write_bytes(pickle.dumps({"weights": [1, 2, 3]}))
    return folder


def case_pickle_file(tmp_path: Path) -> Path:
    f = tmp_path / "model.pt"
    f.write_bytes(pickle.dumps({"weights": [1]}))
    return f


def case_empty_file(tmp_path: Path) -> Path:
    f = tmp_path / "model.gguf"
    f.write_bytes(b"")
    return f


def case_gguf_bad_magic(tmp_path: Path) -> Path:
    f = tmp_path / "model.gguf"
    f.write_bytes(b"GGML" + gguf_bytes(tiny_gguf_metadata(), tiny_gguf_tensors())[4:])
    return f


def case_gguf_truncated_metadata(tmp_path: Path) -> Path:
    f = tmp_path / "model.gguf"
    f.write_bytes(gguf_bytes(tiny_gguf_metadata(), tiny_gguf_tensors())[:200])
    return f


def case_gguf_truncated_data(tmp_path: Path) -> Path:
    f = tmp_path / "model.gguf"
    f.write_bytes(gguf_bytes(tiny_gguf_metadata(), tiny_gguf_tensors())[:-100])
    return f


def case_gguf_unsupported_arch(tmp_path: Path) -> Path:
    f = tmp_path / "model.gguf"
    f.write_bytes(gguf_bytes(tiny_gguf_metadata("bert"), tiny_gguf_tensors()))
    return f


def case_gguf_old_version(tmp_path: Path) -> Path:
    f = tmp_path / "model.gguf"
    f.write_bytes(gguf_bytes(tiny_gguf_metadata(), tiny_gguf_tensors(), version=1))
    return f


def case_gguf_missing_required_key(tmp_path: Path) -> Path:
    meta = tiny_gguf_metadata()
    del meta["llama.block_count"]
    f = tmp_path / "model.gguf"
    f.write_bytes(gguf_bytes(meta, tiny_gguf_tensors()))
    return f


def case_not_a_model_file(tmp_path: Path) -> Path:
    f = tmp_path / "notes.txt"
    f.write_text("hello")
    return f


def case_folder_of_something_else(tmp_path: Path) -> Path:
    folder = tmp_path / "photos"
    folder.mkdir()
    (folder / "a.jpg").write_bytes(b"\xff\xd8\xff")
    return folder


def case_lonely_safetensors(tmp_path: Path) -> Path:
    return _hf(tmp_path) / "model.safetensors"


BAD_INPUT = {
    case_missing_path: (ModelNotFoundError, "no such file"),
    case_missing_config: (ModelNotFoundError, "no config.json"),
    case_config_not_json: (ModelFormatError, "not valid JSON"),
    case_config_missing_key: (ModelFormatError, "hidden_size"),
    case_unsupported_architecture: (UnsupportedArchitectureError, "bert"),
    case_safetensors_header_truncated: (ModelFormatError, "truncated"),
    case_safetensors_data_truncated: (ModelFormatError, "truncated"),
    case_safetensors_corrupt_header: (ModelFormatError, "not valid JSON"),
    case_safetensors_huge_header_length: (ModelFormatError, "corrupt or truncated"),
    case_safetensors_empty: (ModelFormatError, "empty"),
    case_shard_missing: (ModelFormatError, "missing"),
    case_pickle_only_folder: (UnsafeModelError, "runs arbitrary code"),
    case_pickle_file: (UnsafeModelError, "runs arbitrary code"),
    case_empty_file: (ModelFormatError, "empty"),
    case_gguf_bad_magic: (ModelFormatError, "magic"),
    case_gguf_truncated_metadata: (ModelFormatError, "truncated"),
    case_gguf_truncated_data: (ModelFormatError, "tensor data is truncated"),
    case_gguf_unsupported_arch: (UnsupportedArchitectureError, "bert"),
    case_gguf_old_version: (ModelFormatError, "version 1"),
    case_gguf_missing_required_key: (ModelFormatError, "block_count"),
    case_not_a_model_file: (ModelFormatError, "not a model file"),
    case_folder_of_something_else: (ModelNotFoundError, "no config.json"),
    case_lonely_safetensors: (ModelNotFoundError, "has no config"),
}


@pytest.mark.parametrize("make", list(BAD_INPUT), ids=lambda f: f.__name__[5:])
def test_bad_input(tmp_path: Path, make) -> None:  # type: ignore[no-untyped-def]
    error, fragment = BAD_INPUT[make]
    path = make(tmp_path)
    with pytest.raises(error) as info:
        inspect_model(path)
    assert fragment in info.value.message
    assert info.value.hint, "every error carries a hint"


def test_unsupported_architecture_lists_the_supported_ones(tmp_path: Path) -> None:
    with pytest.raises(UnsupportedArchitectureError) as info:
        inspect_model(case_unsupported_architecture(tmp_path))
    for family in FAMILIES:
        assert family.display in info.value.hint


def test_tiny_gguf_is_read(tmp_path: Path) -> None:
    f = tmp_path / "tiny.gguf"
    f.write_bytes(gguf_bytes(tiny_gguf_metadata(), tiny_gguf_tensors()))
    spec = inspect_model(f)
    assert spec.vocab_size == 8
    assert spec.tied_embeddings is True
    assert spec.parameters == 8 * 64 + 64 * 64 + 64 + 64
    assert spec.file_type == "F16"


def test_a_7b_folder_is_inspected_fast_and_small(tmp_path: Path) -> None:
    """Llama-2-7B's real tensor table over sparse shards (14 GB apparent, no disk used)."""
    import time
    import tracemalloc

    config = LLAMA2_7B
    fam = family_for_hf("llama")
    tensors = expected_tensors(fam, dimensions_from_config(config, fam, "7b"))
    tmp_path.joinpath("config.json").write_text(json.dumps(config))
    weight_map = {}
    for shard, part in enumerate((tensors[: len(tensors) // 2], tensors[len(tensors) // 2 :])):
        name = f"model-{shard + 1:05d}-of-00002.safetensors"
        offset, entries = 0, {}
        for t in part:
            entries[t.name] = {
                "dtype": "BF16",
                "shape": list(t.shape),
                "data_offsets": [offset, offset + t.nbytes],
            }
            offset += t.nbytes
        raw = json.dumps(entries).encode()
        with (tmp_path / name).open("wb") as f:
            f.write(struct.pack("<Q", len(raw)) + raw)
            f.truncate(8 + len(raw) + offset)  # sparse: the data is never written
        weight_map.update({t.name: name for t in part})
    tmp_path.joinpath("model.safetensors.index.json").write_text(
        json.dumps({"weight_map": weight_map})
    )

    tracemalloc.start()
    t0 = time.perf_counter()
    spec = inspect_model(tmp_path)
    elapsed = time.perf_counter() - t0
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()

    assert spec.parameters == 6_738_415_616 and spec.parameters_source == "tensors"
    assert spec.weight_bytes == 2 * 6_738_415_616
    assert elapsed < 1.0
    assert peak < 8 << 20


def test_qnn_context_binaries_in_an_onnx_variant_are_not_pickles(tmp_path: Path) -> None:
    """An ONNX Runtime GenAI variant compiled for the HTP keeps its QNN context binaries
    in .bin files: the folder inspects from its config.json, while a real checkpoint
    beside genai_config.json (zip or pickle bytes) is still refused."""
    folder = _hf(tmp_path)
    (folder / "model.safetensors").unlink()
    (folder / "genai_config.json").write_text("{}")
    (folder / "part0.prompt_ctx_qnn.bin").write_bytes(b"\x00\x00\x02\x00" + bytes(64))
    with pytest.raises(UnsafeModelError):  # no wrapper names it: it may be anything
        inspect_model(folder)
    (folder / "part0.prompt_ctx.onnx").write_bytes(b"\x08\x07")
    assert inspect_model(folder).family == "llama"
    (folder / "pytorch_model.bin").write_bytes(pickle.dumps({"weights": [1]}))
    with pytest.raises(UnsafeModelError, match="pytorch_model.bin"):
        inspect_model(folder)
