"""GGUF -> Hugging Face folder (float32 safetensors, config, tokenizer), dequantizing.

This lets a GGUF-only model (like the embedded default) feed converters that start from
a Hugging Face folder. The result carries the GGUF's quantization error: it is recorded
in ``edgekit.json`` beside the weights and returned as a warning.

Tokenizers: byte-level BPE (``tokenizer.ggml.model = gpt2``) and SentencePiece-style BPE
(``llama``) GGUFs are written as a tokenizer.json that tokenizes as llama.cpp does with the
GGUF (``tokenizer.to_hf.hf_tokenizer_files``).

Structure is checked before anything is allocated: ``inspect_model`` validates the header,
and the tensor set must be the one ``block_count`` layers of the family have (a 10 KB file
claiming 2^32-1 layers is refused, not given per-layer name tables).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from edgekit.converters.gguf.arch import ARCHES, tensor_name_map, untransform
from edgekit.converters.gguf.table import FLOAT_FORMATS
from edgekit.converters.gguf.tokenizer.to_hf import dump_tokenizer, hf_tokenizer_files
from edgekit.converters.tensor_io import write_safetensors

from edgekit.architectures import Dimensions, Family, expected_tensors, family_for_gguf
from edgekit.atomic import atomic_path, check_destination, write_new
from edgekit.errors import ModelFormatError, UnsupportedConversionError
from edgekit.gguf_header import GGUFHeader, read_gguf_header
from edgekit.inspection import inspect_model, spec_from_gguf
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
    inspect_model(src)  # the header's structure, validated before the arrays are read
    header = read_gguf_header(src, keep_arrays=True)
    spec = spec_from_gguf(header)
    family = family_for_gguf(header.get("general.architecture"))
    dims = _dims(spec)
    arch = ARCHES[family.key]
    _check_blocks(header, dims.layers)
    names = _hf_names(header, family, dims, arch)
    tokenizer, tokenizer_config = hf_tokenizer_files(header)
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
        write_new(tmp / "config.json", json.dumps(config, indent=2))
        write_new(tmp / "tokenizer.json", dump_tokenizer(tokenizer))
        write_new(tmp / "tokenizer_config.json", json.dumps(tokenizer_config, indent=2))
        template = header.get("tokenizer.chat_template")
        if isinstance(template, str):
            write_new(tmp / "chat_template.jinja", template)
        write_new(
            tmp / "edgekit.json",
            json.dumps(
                {
                    "converted_from": str(src),
                    "source_file_type": source_type,
                    "warnings": list(warnings),
                },
                indent=2,
            ),
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


def _check_blocks(header: GGUFHeader, layers: int) -> None:
    """Refuse a block_count the tensors do not have, before per-layer tables are built:
    every ``blk.N.`` index must be below block_count and every layer must have tensors."""
    if layers < 1:
        raise ModelFormatError(f"{header.path}: block_count is {layers}; a model has layers")
    seen: set[int] = set()
    for t in header.tensors:
        parts = t.name.split(".")
        if parts[0] == "blk":
            if len(parts) < 3 or not parts[1].isdigit() or int(parts[1]) >= layers:
                raise ModelFormatError(
                    f"{header.path}: tensor {t.name!r} does not belong to any of the "
                    f"{layers} layers block_count declares"
                )
            seen.add(int(parts[1]))
    if len(seen) != layers:
        raise ModelFormatError(
            f"{header.path}: block_count says {layers} layers but the file has tensors for "
            f"{len(seen)}",
            hint="the file is corrupt or was not written for this architecture",
        )


def _hf_names(header: GGUFHeader, family: Family, dims: Dimensions, arch: Any) -> list[str]:
    """The Hugging Face name of every GGUF tensor, in file order; refuses unknown ones, and
    a tensor set or shape that is not the family's (transformers would fill a missing
    tensor with random values)."""
    name_map = tensor_name_map(arch, dims.layers)
    reverse: dict[str, tuple[str, tuple[int, ...]]] = {}
    for t in expected_tensors(family, dims):
        gguf_name = name_map.get_name(t.name, try_suffixes=(".weight", ".bias"))
        if gguf_name:
            reverse[gguf_name] = (t.name, t.shape)
    names, unknown = [], []
    for t in header.tensors:
        if t.name not in reverse:
            unknown.append(t.name)
            continue
        hf_name, shape = reverse[t.name]
        if tuple(t.shape) != shape:
            raise ModelFormatError(
                f"{header.path}: tensor {t.name} has shape {tuple(t.shape)}; the header's "
                f"dimensions give {shape}"
            )
        names.append(hf_name)
    if unknown:
        raise UnsupportedConversionError(
            f"{header.path}: tensors without a Hugging Face counterpart: {', '.join(unknown[:5])}",
            hint="the GGUF carries parts edgekit cannot map back (RoPE factors, adapters?)",
        )
    missing = sorted(set(reverse) - {t.name for t in header.tensors})
    if missing:
        raise ModelFormatError(
            f"{header.path}: {len(missing)} tensors of a {family.display} model are missing "
            f"(e.g. {', '.join(missing[:3])})",
            hint="the file is incomplete or not the architecture it declares",
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
