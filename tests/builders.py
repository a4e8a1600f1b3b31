"""Small model files built in-process for tests: safetensors folders and GGUF headers.

The bytes are written by hand (struct + json) so the tests of edgekit's readers do not
depend on the libraries whose output they are meant to check.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

from edgekit.ggml_types import SAFETENSORS_DTYPE_SIZES

FAMILY_CONFIGS: dict[str, dict[str, Any]] = {
    "llama": {"model_type": "llama", "architectures": ["LlamaForCausalLM"]},
    "mistral": {
        "model_type": "mistral",
        "architectures": ["MistralForCausalLM"],
        "sliding_window": 4096,
    },
    "qwen2": {
        "model_type": "qwen2",
        "architectures": ["Qwen2ForCausalLM"],
        "tie_word_embeddings": True,
    },
    "qwen3": {"model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"], "head_dim": 32},
    "phi3": {"model_type": "phi3", "architectures": ["Phi3ForCausalLM"], "sliding_window": 2047},
    "gemma3": {
        "model_type": "gemma3_text",
        "architectures": ["Gemma3ForCausalLM"],
        "head_dim": 32,
        "sliding_window": 512,
    },
}


def tiny_config(family: str, **overrides: Any) -> dict[str, Any]:
    config = {
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "intermediate_size": 128,
        "vocab_size": 256,
        "max_position_embeddings": 2048,
        "torch_dtype": "bfloat16",
        **FAMILY_CONFIGS[family],
    }
    config.update(overrides)
    return config


def safetensors_bytes(tensors: dict[str, tuple[tuple[int, ...], str]]) -> bytes:
    """A complete safetensors file (zero-filled data) holding ``tensors``."""
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, (shape, dtype) in tensors.items():
        n = SAFETENSORS_DTYPE_SIZES[dtype]
        for d in shape:
            n *= d
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + n]}
        offset += n
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    return struct.pack("<Q", len(raw)) + raw + bytes(offset)


def write_hf_folder(
    folder: Path,
    config: dict[str, Any],
    tensors: dict[str, tuple[tuple[int, ...], str]],
    *,
    shards: int = 1,
) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    names = list(tensors)
    if shards == 1:
        (folder / "model.safetensors").write_bytes(safetensors_bytes(tensors))
        return folder
    weight_map = {}
    per = -(-len(names) // shards)
    for i in range(shards):
        part = names[i * per : (i + 1) * per]
        fname = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        (folder / fname).write_bytes(safetensors_bytes({n: tensors[n] for n in part}))
        weight_map.update({n: fname for n in part})
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    return folder


# --- GGUF ---------------------------------------------------------------------------


def _str(s: str) -> bytes:
    b = s.encode()
    return struct.pack("<Q", len(b)) + b


def _kv(key: str, value: Any) -> bytes:
    if isinstance(value, bool):
        return _str(key) + struct.pack("<I?", 7, value)
    if isinstance(value, int):
        return _str(key) + struct.pack("<II", 4, value)
    if isinstance(value, float):
        return _str(key) + struct.pack("<If", 6, value)
    if isinstance(value, str):
        return _str(key) + struct.pack("<I", 8) + _str(value)
    if isinstance(value, list):  # of strings (and empty), bools, int32 or float32
        if value and all(isinstance(v, bool) for v in value):
            body = b"".join(struct.pack("<?", v) for v in value)
            return _str(key) + struct.pack("<IIQ", 9, 7, len(value)) + body
        if value and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
            body = b"".join(struct.pack("<i", v) for v in value)
            return _str(key) + struct.pack("<IIQ", 9, 5, len(value)) + body
        if value and all(isinstance(v, float) for v in value):
            body = b"".join(struct.pack("<f", v) for v in value)
            return _str(key) + struct.pack("<IIQ", 9, 6, len(value)) + body
        body = b"".join(_str(v) for v in value)
        return _str(key) + struct.pack("<IIQ", 9, 8, len(value)) + body
    raise TypeError(value)


def gguf_bytes(
    metadata: dict[str, Any], tensors: dict[str, tuple[tuple[int, ...], int]], version: int = 3
) -> bytes:
    """A complete GGUF file. ``tensors`` maps name -> (PyTorch-order shape, GGML type id);
    only F32 (0) and F16 (1) sizes are supported here."""
    out = b"GGUF" + struct.pack("<IQQ", version, len(tensors), len(metadata))
    out += b"".join(_kv(k, v) for k, v in metadata.items())
    offset = 0
    sizes = []
    for name, (shape, type_id) in tensors.items():
        dims = list(reversed(shape))
        out += _str(name) + struct.pack("<I", len(dims)) + struct.pack(f"<{len(dims)}Q", *dims)
        out += struct.pack("<IQ", type_id, offset)
        n = {0: 4, 1: 2}[type_id]
        for d in shape:
            n *= d
        sizes.append(n)
        offset += n + (-n % 32)
    out += b"\x00" * (-len(out) % 32)
    return out + bytes(offset)


def tiny_gguf_metadata(arch: str = "llama") -> dict[str, Any]:
    return {
        "general.architecture": arch,
        "general.name": "tiny",
        "general.file_type": 1,
        f"{arch}.context_length": 2048,
        f"{arch}.embedding_length": 64,
        f"{arch}.block_count": 1,
        f"{arch}.feed_forward_length": 128,
        f"{arch}.attention.head_count": 4,
        f"{arch}.attention.head_count_kv": 2,
        f"{arch}.attention.layer_norm_rms_epsilon": 1e-5,
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.tokens": [f"t{i}" for i in range(8)],
    }


def tiny_gguf_tensors() -> dict[str, tuple[tuple[int, ...], int]]:
    return {
        "token_embd.weight": ((8, 64), 1),
        "blk.0.attn_q.weight": ((64, 64), 1),
        "blk.0.attn_norm.weight": ((64,), 0),
        "output_norm.weight": ((64,), 0),
    }


def full_tiny_gguf_tensors(
    layers: int = 1, vocab: int = 8, hidden: int = 64, ffn: int = 128, kv: int = 32
) -> dict[str, tuple[tuple[int, ...], int]]:
    """Every tensor of a tiny Llama-architecture GGUF (F32), as llama.cpp names them."""
    tensors: dict[str, tuple[tuple[int, ...], int]] = {"token_embd.weight": ((vocab, hidden), 0)}
    for i in range(layers):
        tensors.update(
            {
                f"blk.{i}.attn_norm.weight": ((hidden,), 0),
                f"blk.{i}.attn_q.weight": ((hidden, hidden), 0),
                f"blk.{i}.attn_k.weight": ((kv, hidden), 0),
                f"blk.{i}.attn_v.weight": ((kv, hidden), 0),
                f"blk.{i}.attn_output.weight": ((hidden, hidden), 0),
                f"blk.{i}.ffn_norm.weight": ((hidden,), 0),
                f"blk.{i}.ffn_gate.weight": ((ffn, hidden), 0),
                f"blk.{i}.ffn_up.weight": ((ffn, hidden), 0),
                f"blk.{i}.ffn_down.weight": ((hidden, ffn), 0),
            }
        )
    tensors["output_norm.weight"] = ((hidden,), 0)
    tensors["output.weight"] = ((vocab, hidden), 0)
    return tensors


def external_data_graph(
    llm: Path, data: bytes, *, location: str = "model.onnx.data", length: int | None = None
) -> None:
    """``llm/model.onnx``: a one-node ONNX graph whose one initializer (f16) lies in the
    external file ``location`` (offset 0, ``length`` bytes: all of ``data`` unless given),
    and ``llm/model.onnx.data`` holding ``data``: the shape of an Edge-LLM export's graph
    and weights, without its operators. Built with onnx's own helper, the format's
    reference writer (edgekit's check of it parses with onnx too)."""
    import onnx
    from onnx import TensorProto, helper

    size = len(data) if length is None else length
    weight = TensorProto(name="w", data_type=TensorProto.FLOAT16, dims=[size // 2])
    weight.data_location = TensorProto.EXTERNAL
    for key, value in (("location", location), ("offset", "0"), ("length", str(size))):
        entry = weight.external_data.add()
        entry.key, entry.value = key, value
    graph = helper.make_graph(
        [helper.make_node("Identity", ["w"], ["y"])],
        "edgellm-shape",
        [],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT16, [size // 2])],
        initializer=[weight],
    )
    (llm / "model.onnx").write_bytes(helper.make_model(graph).SerializeToString())
    (llm / "model.onnx.data").write_bytes(data)
    if location == "model.onnx.data" and length is None:  # a valid graph, as onnx sees it
        onnx.checker.check_model(str(llm / "model.onnx"))
