"""inspect_model: a ModelSpec from a Hugging Face folder or a GGUF file, weights untouched."""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path
from typing import Any

from edgekit.architectures import (
    Dimensions,
    Family,
    dimensions_from_config,
    expected_tensors,
    family_for_gguf,
    family_for_hf,
    text_config,
)
from edgekit.errors import ModelFormatError, ModelNotFoundError, UnsafeModelError
from edgekit.ggml_types import LLAMA_FILE_TYPES
from edgekit.gguf_header import GGUF_MAGIC, GGUFHeader, read_gguf_header
from edgekit.modelspec import ModelSpec, TensorInfo
from edgekit.safetensors_header import read_folder_tensors, safetensors_files

# Checkpoints that can only be read by unpickling.
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl", ".pickle")
_TORCH_DTYPES = {"bfloat16": "BF16", "float16": "F16", "float32": "F32", "float64": "F64"}
# GGUF tokenizer.ggml.model -> edgekit's tokenizer kind
_GGUF_TOKENIZERS = {"gpt2": "bpe-byte-level", "llama": "sentencepiece"}
# tokenizer.json is scanned, not parsed: Gemma's is 33 MB. The pre-tokenizer and the model
# type sit near the start once the added tokens are past; stop after this much.
_TOKENIZER_SCAN_LIMIT = 64 << 20
_MODEL_TYPE = re.compile(rb'"model"\s*:\s*\{\s*"type"\s*:\s*"(\w+)"')


def inspect_model(path: str | Path) -> ModelSpec:
    """Read a model's structure from its metadata and tensor headers.

    ``path`` is a Hugging Face folder (config.json plus safetensors, sharded or not; a
    folder with only config.json is described from the config) or a GGUF file.

    Raises:
        ModelNotFoundError: nothing at ``path``, or a folder without a model in it.
        ModelFormatError: a corrupt, truncated or empty file, or an invalid config.
        UnsafeModelError: the weights exist only as pickle checkpoints.
        UnsupportedArchitectureError: the family is not in edgekit's table.
    """
    p = Path(path).expanduser()
    if not p.exists():
        raise ModelNotFoundError(f"{p}: no such file or folder")
    if p.is_dir():
        return _inspect_folder(p)
    return _inspect_file(p)


def _inspect_file(p: Path) -> ModelSpec:
    if p.suffix.lower() in PICKLE_SUFFIXES:
        raise UnsafeModelError(
            f"{p}: a pickle checkpoint; edgekit does not load it, because unpickling runs "
            "arbitrary code from the file"
        )
    if p.suffix == ".safetensors":
        raise ModelNotFoundError(
            f"{p}: a safetensors file alone has no config",
            hint=f"pass the folder that holds it and its config.json: {p.parent}",
        )
    if p.stat().st_size == 0:
        raise ModelFormatError(f"{p}: the file is empty")
    with p.open("rb") as f:
        magic = f.read(4)
    if magic != GGUF_MAGIC and p.suffix.lower() != ".gguf":
        raise ModelFormatError(
            f"{p}: not a model file edgekit reads (neither GGUF nor a model folder)",
            hint="pass a Hugging Face model folder (config.json + *.safetensors) or a .gguf file",
        )
    return spec_from_gguf(read_gguf_header(p))


def _inspect_folder(p: Path) -> ModelSpec:
    config_path = p / "config.json"
    if not config_path.is_file():
        ggufs = sorted(p.glob("*.gguf"))
        if len(ggufs) == 1:
            return _inspect_file(ggufs[0])
        if ggufs:
            names = ", ".join(g.name for g in ggufs)
            raise ModelNotFoundError(
                f"{p}: holds several GGUF files ({names})", hint="pass one of them"
            )
        raise ModelNotFoundError(
            f"{p}: no config.json, so this is not a Hugging Face model folder",
            hint="pass a folder with config.json and *.safetensors, or a .gguf file",
        )
    config = _read_config(config_path)
    family = family_for_hf(config.get("model_type"), config.get("architectures"))
    dims = dimensions_from_config(config, family, str(config_path))

    files = safetensors_files(p)
    if not files:
        # An OpenVINO IR keeps its weights in NAME.bin beside NAME.xml: not a pickle.
        pickles = sorted(
            f.name
            for f in p.iterdir()
            if f.suffix.lower() in PICKLE_SUFFIXES and not f.with_suffix(".xml").is_file()
        )
        if pickles:
            raise UnsafeModelError(
                f"{p}: the weights are pickle checkpoints only ({', '.join(pickles)}); "
                "edgekit does not load them, because unpickling runs arbitrary code"
            )
        return _spec_from_config_only(p, config, family, dims)

    tensors = read_folder_tensors(p)
    parameters = _count_parameters(tensors, dims.tied_embeddings, lm_head="lm_head.weight")
    by_bytes: Counter[str] = Counter()
    for t in tensors:
        by_bytes[t.dtype] += t.nbytes
    return ModelSpec(
        path=str(p),
        format="hf",
        family=family.key,
        architecture=_hf_architecture(config),
        name=config.get("_name_or_path") or p.name,
        parameters=parameters,
        parameters_source="tensors",
        **_dims_fields(dims),
        tokenizer=_hf_tokenizer_kind(p),
        chat_template=_hf_has_chat_template(p),
        dtype=by_bytes.most_common(1)[0][0],
        file_type=None,
        weight_bytes=sum(t.nbytes for t in tensors),
        tensors=tensors,
    )


def _spec_from_config_only(
    p: Path, config: dict[str, Any], family: Family, dims: Dimensions
) -> ModelSpec:
    tc = text_config(config)
    dtype = _TORCH_DTYPES.get(str(tc.get("torch_dtype") or tc.get("dtype") or ""), "BF16")
    itemsize = 4 if dtype == "F32" else 8 if dtype == "F64" else 2
    tensors = expected_tensors(family, dims, dtype=dtype, itemsize=itemsize)
    return ModelSpec(
        path=str(p),
        format="hf",
        family=family.key,
        architecture=_hf_architecture(config),
        name=config.get("_name_or_path") or p.name,
        parameters=sum(t.numel for t in tensors),
        parameters_source="config",
        **_dims_fields(dims),
        tokenizer=_hf_tokenizer_kind(p),
        chat_template=_hf_has_chat_template(p),
        dtype=dtype,
        file_type=None,
        weight_bytes=sum(t.nbytes for t in tensors),
        tensors=tensors,
    )


def spec_from_gguf(header: GGUFHeader) -> ModelSpec:
    """A ModelSpec from a parsed GGUF header.

    Raises:
        UnsupportedArchitectureError: ``general.architecture`` is not in edgekit's table.
        ModelFormatError: a key llama.cpp itself requires is missing.
    """
    arch = header.get("general.architecture")
    family = family_for_gguf(arch)

    def need(key: str) -> int:
        value = header.get(f"{arch}.{key}")
        if not isinstance(value, int) or value <= 0:
            raise ModelFormatError(
                f"{header.path}: GGUF metadata lacks {arch}.{key} (llama.cpp cannot load it)"
            )
        return value

    hidden = need("embedding_length")
    heads = need("attention.head_count")
    kv_heads = header.get(f"{arch}.attention.head_count_kv", heads)
    if isinstance(kv_heads, list):  # per-layer counts (some hybrid models): take the max
        kv_heads = max(kv_heads)
    head_dim = header.get(f"{arch}.attention.key_length") or hidden // heads
    vocab = header.get(f"{arch}.vocab_size") or header.array_length("tokenizer.ggml.tokens") or 0
    names = {t.name for t in header.tensors}
    tied = "output.weight" not in names
    window = header.get(f"{arch}.attention.sliding_window")
    file_type = header.get("general.file_type")
    dims = Dimensions(
        layers=need("block_count"),
        hidden_size=hidden,
        heads=heads,
        kv_heads=int(kv_heads),
        head_dim=int(head_dim),
        ffn_size=need("feed_forward_length"),
        vocab_size=int(vocab),
        context_length=need("context_length"),
        tied_embeddings=tied,
        sliding_window=int(window) if isinstance(window, int) and window > 0 else None,
    )
    by_bytes: Counter[str] = Counter()
    for t in header.tensors:
        by_bytes[t.dtype] += t.nbytes
    tokenizer_model = header.get("tokenizer.ggml.model")
    return ModelSpec(
        path=str(header.path),
        format="gguf",
        family=family.key,
        architecture=str(arch),
        name=header.get("general.name"),
        parameters=_count_parameters(header.tensors, tied, lm_head="output.weight"),
        parameters_source="tensors",
        **_dims_fields(dims),
        tokenizer=_GGUF_TOKENIZERS.get(tokenizer_model, tokenizer_model),
        chat_template="tokenizer.chat_template" in header.metadata,
        dtype=LLAMA_FILE_TYPES.get(file_type, by_bytes.most_common(1)[0][0])
        if header.tensors
        else "unknown",
        file_type=LLAMA_FILE_TYPES.get(file_type) if isinstance(file_type, int) else None,
        weight_bytes=sum(t.nbytes for t in header.tensors),
        tensors=header.tensors,
    )


def _count_parameters(tensors: tuple[TensorInfo, ...], tied: bool, *, lm_head: str) -> int:
    # A tied output projection shares the embedding's storage: count it once.
    return sum(t.numel for t in tensors if not (tied and t.name == lm_head))


def _dims_fields(d: Dimensions) -> dict[str, Any]:
    return {
        "layers": d.layers,
        "hidden_size": d.hidden_size,
        "heads": d.heads,
        "kv_heads": d.kv_heads,
        "head_dim": d.head_dim,
        "ffn_size": d.ffn_size,
        "vocab_size": d.vocab_size,
        "context_length": d.context_length,
        "tied_embeddings": d.tied_embeddings,
        "sliding_window": d.sliding_window,
    }


def _read_config(path: Path) -> dict[str, Any]:
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ModelFormatError(f"{path}: not valid JSON ({exc})") from exc
    if not isinstance(config, dict):
        raise ModelFormatError(f"{path}: not a JSON object")
    return config


def _hf_architecture(config: dict[str, Any]) -> str:
    archs = config.get("architectures")
    if isinstance(archs, list) and archs:
        return str(archs[0])
    return str(config.get("model_type"))


def _hf_tokenizer_kind(folder: Path) -> str | None:
    tj = folder / "tokenizer.json"
    if tj.is_file():
        head = bytearray()
        match = None
        with tj.open("rb") as f:
            while match is None and len(head) < _TOKENIZER_SCAN_LIMIT:
                chunk = f.read(1 << 20)
                if not chunk:
                    break
                start = max(0, len(head) - 256)  # a match may straddle two chunks
                head += chunk
                match = _MODEL_TYPE.search(head, start)
        if match:
            kind = match.group(1).decode().lower()
            if kind == "bpe":
                return "bpe-byte-level" if b'"ByteLevel"' in head else "bpe-sentencepiece"
            return kind
    if (folder / "tokenizer.model").is_file():
        return "sentencepiece"
    return None


def _hf_has_chat_template(folder: Path) -> bool:
    if (folder / "chat_template.jinja").is_file() or (folder / "chat_template.json").is_file():
        return True
    tc = folder / "tokenizer_config.json"
    if tc.is_file():
        try:
            return bool(json.loads(tc.read_text(encoding="utf-8")).get("chat_template"))
        except (UnicodeDecodeError, json.JSONDecodeError, AttributeError):
            return False
    return False
