"""GGUF -> Hugging Face folder (float32 safetensors, config, tokenizer), dequantizing.

This lets a GGUF-only model (like the embedded default) feed converters that start from
a Hugging Face folder. The result carries the GGUF's quantization error: it is recorded
in ``edgekit.json`` beside the weights and returned as a warning.

Tokenizers: byte-level BPE GGUFs (``tokenizer.ggml.model = gpt2``) are written as
tokenizer.json by edgekit; SentencePiece GGUFs (``llama``) are refused for now.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from edgekit.converters.gguf_arch import ARCHES, tensor_name_map, untransform
from edgekit.converters.gguf_formats import FLOAT_FORMATS
from edgekit.converters.gguf_tokenizer import (
    TOKEN_CONTROL,
    TOKEN_USER_DEFINED,
    pre_tokenizer_json,
)
from edgekit.converters.tensor_io import write_safetensors

from edgekit.architectures import Dimensions, Family, expected_tensors, family_for_gguf
from edgekit.atomic import atomic_path, check_destination
from edgekit.errors import UnsupportedConversionError
from edgekit.gguf_header import GGUFHeader, read_gguf_header
from edgekit.inspection import spec_from_gguf
from edgekit.modelspec import ModelSpec
from edgekit.progress import ProgressCallback, ProgressEvent, no_progress

log = logging.getLogger(__name__)

# family -> (HF architecture class, model_type, extra config)
_HF_CLASSES: dict[str, tuple[str, str, dict[str, Any]]] = {
    "llama": ("LlamaForCausalLM", "llama", {"attention_bias": False, "mlp_bias": False}),
    "qwen2": ("Qwen2ForCausalLM", "qwen2", {"use_sliding_window": False}),
    "qwen3": ("Qwen3ForCausalLM", "qwen3", {"attention_bias": False}),
    "phi3": ("Phi3ForCausalLM", "phi3", {}),
    "gemma3": (
        "Gemma3ForCausalLM",
        "gemma3_text",
        {
            "hidden_activation": "gelu_pytorch_tanh",
            "rope_local_base_freq": 10000.0,
            "sliding_window_pattern": 6,
        },
    ),
}


@dataclass(frozen=True, kw_only=True)
class DequantizeResult:
    path: Path
    source_file_type: str | None
    warnings: tuple[str, ...]


def gguf_to_hf(
    src: str | Path,
    out: str | Path,
    *,
    force: bool = False,
    progress: ProgressCallback = no_progress,
) -> DequantizeResult:
    """Write a Hugging Face folder from a GGUF file.

    Raises:
        UnsupportedConversionError: architecture, tensor or tokenizer that cannot be written.
        OutputExistsError: ``out`` exists and ``force`` is not set.
        ModelFormatError: the GGUF is corrupt.
    """
    src, out = Path(src), Path(out)
    check_destination(out, force=force)
    header = read_gguf_header(src, keep_arrays=True)
    spec = spec_from_gguf(header)
    family = family_for_gguf(header.get("general.architecture"))
    dims = _dims(spec)
    arch = ARCHES[family.key]
    if header.get("tokenizer.ggml.model") != "gpt2":
        raise UnsupportedConversionError(
            f"{src}: GGUF tokenizer {header.get('tokenizer.ggml.model')!r} cannot be written as a "
            "Hugging Face tokenizer yet",
            hint="byte-level BPE (gpt2) GGUFs are supported; convert SentencePiece models from "
            "their Hugging Face source",
        )
    names = _hf_names(header, family, dims, arch)
    tokenizer, tokenizer_config = _tokenizer_files(header)
    config = _config(header, family, dims)
    source_type = spec.file_type
    warnings: tuple[str, ...] = ()
    if source_type not in FLOAT_FORMATS:
        warnings = (
            f"the weights are dequantized from {source_type}: they carry the GGUF's "
            "quantization error, and a model converted from them carries it too",
        )

    with atomic_path(out, force=force) as tmp:
        tmp.mkdir()
        (tmp / "config.json").write_text(json.dumps(config, indent=2))
        (tmp / "tokenizer.json").write_text(json.dumps(tokenizer, ensure_ascii=False))
        (tmp / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2))
        template = header.get("tokenizer.chat_template")
        if isinstance(template, str):
            (tmp / "chat_template.jinja").write_text(template)
        (tmp / "edgekit.json").write_text(
            json.dumps(
                {
                    "converted_from": str(src),
                    "source_file_type": source_type,
                    "warnings": list(warnings),
                },
                indent=2,
            )
        )
        order = [(hf, header.tensors[i]) for i, hf in enumerate(names)]
        shapes = [(hf, t.shape) for hf, t in order]

        def arrays() -> Any:
            for i, (hf, t) in enumerate(order):
                data = _dequantize(header, t.name, t.shape)
                yield untransform(hf, data, arch, dims)
                progress(ProgressEvent(stage="dequantize", done=i + 1, total=len(order), detail=hf))

        write_safetensors(tmp / "model.safetensors", shapes, arrays())
    return DequantizeResult(path=out, source_file_type=source_type, warnings=warnings)


def _dims(spec: ModelSpec) -> Dimensions:
    return Dimensions(
        layers=spec.layers,
        hidden_size=spec.hidden_size,
        heads=spec.heads,
        kv_heads=spec.kv_heads,
        head_dim=spec.head_dim,
        ffn_size=spec.ffn_size,
        vocab_size=spec.vocab_size,
        context_length=spec.context_length,
        tied_embeddings=spec.tied_embeddings,
        sliding_window=spec.sliding_window,
    )


def _hf_names(header: GGUFHeader, family: Family, dims: Dimensions, arch: Any) -> list[str]:
    """The Hugging Face name of every GGUF tensor, in file order; refuses unknown ones."""
    name_map = tensor_name_map(arch, dims.layers)
    reverse = {}
    for t in expected_tensors(family, dims):
        gguf_name = name_map.get_name(t.name, try_suffixes=(".weight", ".bias"))
        if gguf_name:
            reverse[gguf_name] = t.name
    names, unknown = [], []
    for t in header.tensors:
        if t.name in reverse:
            names.append(reverse[t.name])
        else:
            unknown.append(t.name)
    if unknown:
        raise UnsupportedConversionError(
            f"{header.path}: tensors without a Hugging Face counterpart: {', '.join(unknown[:5])}",
            hint="the GGUF carries parts edgekit cannot map back (RoPE factors, adapters?)",
        )
    return names


def _dequantize(header: GGUFHeader, name: str, shape: tuple[int, ...]) -> np.ndarray:
    import gguf

    type_id = header.tensor_types[name]
    nbytes = next(t.nbytes for t in header.tensors if t.name == name)
    raw = np.memmap(
        header.path, dtype=np.uint8, mode="r", offset=header.tensor_offsets[name], shape=(nbytes,)
    )
    rows = int(np.prod(shape[:-1], dtype=np.int64)) if len(shape) > 1 else 1
    if type_id == 30:  # BF16: numpy has no bfloat16
        data = (raw.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
    else:
        data = gguf.quants.dequantize(
            raw.reshape(rows, nbytes // rows), gguf.GGMLQuantizationType(type_id)
        )
    return np.asarray(data, dtype=np.float32).reshape(shape)


def _config(header: GGUFHeader, family: Family, dims: Dimensions) -> dict[str, Any]:
    arch = header.get("general.architecture")
    cls, model_type, extra = _HF_CLASSES[family.key]
    config: dict[str, Any] = {
        "_name_or_path": header.get("general.name") or header.path.stem,
        "architectures": [cls],
        "model_type": model_type,
        "hidden_size": dims.hidden_size,
        "intermediate_size": dims.ffn_size,
        "num_hidden_layers": dims.layers,
        "num_attention_heads": dims.heads,
        "num_key_value_heads": dims.kv_heads,
        "head_dim": dims.head_dim,
        "max_position_embeddings": dims.context_length,
        "rms_norm_eps": float(header.get(f"{arch}.attention.layer_norm_rms_epsilon", 1e-6)),
        "rope_theta": float(header.get(f"{arch}.rope.freq_base", 10000.0)),
        "vocab_size": dims.vocab_size,
        "tie_word_embeddings": dims.tied_embeddings,
        "hidden_act": "silu",
        "torch_dtype": "float32",
        **extra,
    }
    for key, gguf_key in (
        ("bos_token_id", "bos_token_id"),
        ("eos_token_id", "eos_token_id"),
        ("pad_token_id", "padding_token_id"),
    ):
        value = header.get(f"tokenizer.ggml.{gguf_key}")
        if isinstance(value, int):
            config[key] = value
    if dims.sliding_window:
        config["sliding_window"] = dims.sliding_window
    if family.key == "gemma3":
        config["query_pre_attn_scalar"] = dims.head_dim
    rotary = header.get(f"{arch}.rope.dimension_count")
    if isinstance(rotary, int) and rotary != dims.head_dim:
        config["partial_rotary_factor"] = rotary / dims.head_dim
    factor = header.get(f"{arch}.rope.scaling.factor")
    if header.get(f"{arch}.rope.scaling.type") == "linear" and factor:
        config["rope_scaling"] = {"type": "linear", "factor": float(factor)}
    return config


def _tokenizer_files(header: GGUFHeader) -> tuple[dict[str, Any], dict[str, Any]]:
    tokens: list[str] = header.get("tokenizer.ggml.tokens")
    types: list[int] = header.get("tokenizer.ggml.token_type") or [1] * len(tokens)
    merges: list[str] = header.get("tokenizer.ggml.merges") or []
    pre = header.get("tokenizer.ggml.pre") or "gpt-2"
    add_bos = bool(header.get("tokenizer.ggml.add_bos_token", False))

    def token(key: str) -> str | None:
        value = header.get(f"tokenizer.ggml.{key}")
        return tokens[value] if isinstance(value, int) and 0 <= value < len(tokens) else None

    added = [
        {
            "id": i,
            "content": tok,
            "single_word": False,
            "lstrip": False,
            "rstrip": False,
            "normalized": types[i] != TOKEN_CONTROL,
            "special": types[i] == TOKEN_CONTROL,
        }
        for i, tok in enumerate(tokens)
        if types[i] in (TOKEN_CONTROL, TOKEN_USER_DEFINED)
    ]
    bos = token("bos_token_id")
    post_processor = None
    if add_bos and bos is not None:
        post_processor = {
            "type": "TemplateProcessing",
            "single": [
                {"SpecialToken": {"id": bos, "type_id": 0}},
                {"Sequence": {"id": "A", "type_id": 0}},
            ],
            "pair": [
                {"SpecialToken": {"id": bos, "type_id": 0}},
                {"Sequence": {"id": "A", "type_id": 0}},
                {"SpecialToken": {"id": bos, "type_id": 1}},
                {"Sequence": {"id": "B", "type_id": 1}},
            ],
            "special_tokens": {bos: {"id": bos, "ids": [tokens.index(bos)], "tokens": [bos]}},
        }
    tokenizer = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": pre_tokenizer_json(pre),
        "post_processor": post_processor,
        "decoder": {
            "type": "ByteLevel",
            "add_prefix_space": True,
            "trim_offsets": True,
            "use_regex": True,
        },
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": pre == "llama-bpe",
            "vocab": {tok: i for i, tok in enumerate(tokens)},
            "merges": merges,
        },
    }
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": bos,
        "eos_token": token("eos_token_id"),
        "unk_token": token("unknown_token_id"),
        "pad_token": token("padding_token_id"),
        "add_bos_token": add_bos,
        "add_eos_token": bool(header.get("tokenizer.ggml.add_eos_token", False)),
        "clean_up_tokenization_spaces": False,
        "model_max_length": int(
            header.get(f"{header.get('general.architecture')}.context_length", 4096)
        ),
    }
    return tokenizer, config
