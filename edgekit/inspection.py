"""inspect_model: a ModelSpec from a Hugging Face folder or a GGUF file, weights untouched.

This is the one reader of model structure: the planner, the converters and ``pack`` all
take the ModelSpec it returns, validated (``modelspec.check_structure``, the tensor-set
checks of ``architectures``), so that no number a hostile file claims reaches code that
sizes anything by it. Every file read in a model folder goes through
``safetensors_header.model_file`` (plain names, no links out of the folder, regular files
only) and every JSON document through ``edgekit.untrusted.parse_json``.
"""

from __future__ import annotations

import os
import re
from collections import Counter
from pathlib import Path
from typing import Any

from edgekit.architectures import (
    CONFIG_HINT,
    GGUF_HINT,
    Dimensions,
    Family,
    dimensions_from_config,
    dimensions_from_values,
    expected_tensors,
    family_for_gguf,
    family_for_hf,
    text_config,
)
from edgekit.errors import ModelError, ModelFormatError, ModelNotFoundError, UnsafeModelError
from edgekit.ggml_types import LLAMA_FILE_TYPES
from edgekit.gguf_header import GGUF_MAGIC, GGUFHeader, read_gguf_header
from edgekit.modelspec import ModelSpec, TensorInfo, check_structure, shown
from edgekit.packed_weights import (
    check_packed,
    logical_parameters,
    packed_columns,
    packing_from_config,
)
from edgekit.safetensors_header import (
    model_file,
    read_folder_tensors,
    read_small,
    safetensors_files,
)
from edgekit.tensor_checks import check_gguf_tensors, check_hf_tensors
from edgekit.untrusted import parse_json

# Checkpoints that can only be read by unpickling.
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl", ".pickle")
_TORCH_DTYPES = {"bfloat16": "BF16", "float16": "F16", "float32": "F32", "float64": "F64"}
# GGUF tokenizer.ggml.model -> edgekit's tokenizer kind
_GGUF_TOKENIZERS = {"gpt2": "bpe-byte-level", "llama": "sentencepiece"}
# tokenizer.json is scanned, not parsed: Gemma's is 33 MB. The pre-tokenizer and the model
# type sit near the start once the added tokens are past; stop after this much.
_TOKENIZER_SCAN_LIMIT = 64 << 20
_MODEL_TYPE = re.compile(rb'"model"\s*:\s*\{\s*"type"\s*:\s*"(\w+)"')
MAX_CONFIG = 4 << 20  # config.json: real ones are a few KB
MAX_TOKENIZER_CONFIG = 64 << 20  # tokenizer_config.json may list every added token


def inspect_model(path: str | Path) -> ModelSpec:
    """Read a model's structure from its metadata and tensor headers.

    ``path`` is a Hugging Face folder (config.json plus safetensors, sharded or not; a
    folder with only config.json is described from the config) or a GGUF file.

    Raises:
        ModelNotFoundError: nothing at ``path``, or a folder without a model in it.
        ModelFormatError: a corrupt, truncated, empty or implausible file or config, a
            file outside the model folder, or tensors that disagree with the config.
        UnsafeModelError: the weights exist only as pickle checkpoints.
        UnsupportedArchitectureError: the family is not in edgekit's table.
    """
    if not isinstance(path, str | os.PathLike):
        raise ModelNotFoundError(
            f"a model path is a string or a Path, not {type(path).__name__}",
            hint="pass the model's folder or .gguf file",
        )
    if "\x00" in str(path):
        raise ModelNotFoundError(f"{shown(str(path))}: a path cannot contain a NUL byte")
    p = Path(path).expanduser()
    try:
        if not p.exists():
            raise ModelNotFoundError(f"{p}: no such file or folder")
        if p.is_dir():
            return _inspect_folder(p)
        return _inspect_file(p)
    except ModelError:
        raise
    except OSError as exc:
        # A name too long, a permission denied, an I/O error: the file cannot be read.
        raise ModelFormatError(f"{p}: cannot be read ({exc.strerror or exc})") from exc


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
    if not p.is_file():
        raise ModelFormatError(f"{p}: not a regular file", hint="pass a .gguf file")
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


# torch.save writes a zip archive; a bare pickle of protocol 2 or later starts with PROTO
_PICKLE_MAGIC = (b"PK\x03\x04", b"\x80")


def _pickle_checkpoint(folder: Path, f: Path) -> bool:
    """Whether ``f`` in ``folder`` may be a pickle checkpoint. Two folder formats keep
    other data in .bin files: an OpenVINO IR its weights in NAME.bin beside NAME.xml, an
    ONNX Runtime GenAI variant (genai_config.json) its QNN context binaries, NAME_qnn.bin
    beside the NAME.onnx wrapper; such a .bin still counts when it starts like a
    checkpoint (a zip archive or a pickle)."""
    if f.suffix.lower() not in PICKLE_SUFFIXES:
        return False
    if f.suffix.lower() != ".bin":
        return True
    if f.with_suffix(".xml").is_file():
        return False
    wrapper = folder / (f.name.removesuffix("_qnn.bin") + ".onnx")
    if not (
        (folder / "genai_config.json").is_file()
        and f.name.endswith("_qnn.bin")
        and wrapper.is_file()
    ):
        return True
    try:
        with f.open("rb") as handle:
            head = handle.read(4)
    except OSError:
        return True
    return head.startswith(_PICKLE_MAGIC) or not head


def _inspect_folder(p: Path) -> ModelSpec:
    if not (p / "config.json").exists() and not (p / "config.json").is_symlink():
        ggufs = sorted(p.glob("*.gguf"))
        if len(ggufs) == 1:
            return _inspect_file(model_file(p, ggufs[0].name))
        if ggufs:
            names = ", ".join(shown(g.name, 60) for g in ggufs[:6])
            raise ModelNotFoundError(
                f"{p}: holds several GGUF files ({names})", hint="pass one of them"
            )
        raise ModelNotFoundError(
            f"{p}: no config.json, so this is not a Hugging Face model folder",
            hint="pass a folder with config.json and *.safetensors, or a .gguf file",
        )
    config = read_config(p)
    family = family_for_hf(config.get("model_type"), config.get("architectures"))
    where = str(p / "config.json")
    dims = dimensions_from_config(config, family, where)

    files = safetensors_files(p)
    if not files:
        pickles = sorted(f.name for f in p.iterdir() if _pickle_checkpoint(p, f))
        if pickles:
            raise UnsafeModelError(
                f"{p}: the weights are pickle checkpoints only "
                f"({', '.join(shown(n, 60) for n in pickles[:6])}); "
                "edgekit does not load them, because unpickling runs arbitrary code"
            )
        return _spec_from_config_only(p, config, family, dims)

    tensors = read_folder_tensors(p)
    tc = text_config(config)
    quantized = "quantization_config" in config or "quantization_config" in tc
    # mlx-lm's group-wise packing: the embedding is stored in fewer columns, and the
    # parameters are counted from the logical shapes
    packing = packing_from_config(config, where)
    check_hf_tensors(
        family,
        dims,
        tensors,
        where=str(p),
        quantized=quantized or packing is not None,
        embedding_columns=None
        if packing is None
        else packed_columns(dims.hidden_size, packing.of(_embedding_module(tensors))),
    )
    if packing is None:
        parameters = _count_parameters(tensors, dims.tied_embeddings, lm_head="lm_head.weight")
    else:
        check_packed(tensors, packing, where)
        skip = "lm_head.weight" if dims.tied_embeddings else ""
        parameters = logical_parameters(tensors, packing, skip=skip)
    by_bytes: Counter[str] = Counter()
    for t in tensors:
        by_bytes[t.dtype] += t.nbytes
    return ModelSpec(
        path=str(p),
        format="hf",
        family=family.key,
        architecture=_hf_architecture(config),
        name=_hf_name(config, p),
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
        name=_hf_name(config, p),
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
    """A validated ModelSpec from a parsed GGUF header (``read_gguf_header`` has checked
    every key's type; this checks the values and the tensors against them).

    Raises:
        UnsupportedArchitectureError: ``general.architecture`` is not in edgekit's table.
        ModelFormatError: a key llama.cpp itself requires is missing, a structural number
            is implausible or inconsistent, or the tensors disagree with the metadata.
    """
    arch = header.get("general.architecture")
    family = family_for_gguf(arch)
    where = str(header.path)
    names = {
        "layers": f"{arch}.block_count",
        "hidden_size": f"{arch}.embedding_length",
        "heads": f"{arch}.attention.head_count",
        "kv_heads": f"{arch}.attention.head_count_kv",
        "head_dim": f"{arch}.attention.key_length",
        "ffn_size": f"{arch}.feed_forward_length",
        "vocab_size": "the vocabulary size (tokenizer.ggml.tokens)",
        "context_length": f"{arch}.context_length",
        "sliding_window": f"{arch}.attention.sliding_window",
    }
    raw: dict[str, object] = {key: header.get(name) for key, name in names.items()}
    raw["vocab_size"] = _gguf_vocab(header, str(arch), where)
    kv = raw["kv_heads"]
    kv_known = True
    if isinstance(kv, list):  # per-layer counts (some hybrid models): check each, take the max
        kv, kv_known = _per_layer_kv(kv, raw["layers"], names["kv_heads"], where)
        raw["kv_heads"] = kv
    values = check_structure(raw, where=where, names=names, hint=GGUF_HINT)
    tied = not any(t.name == "output.weight" for t in header.tensors)
    dims = dimensions_from_values(values, tied=tied)
    check_gguf_tensors(family, dims, header.tensors, where=where, kv_known=kv_known)
    by_bytes: Counter[str] = Counter()
    for t in header.tensors:
        by_bytes[t.dtype] += t.nbytes
    tokenizer_model = header.get("tokenizer.ggml.model")
    file_type = header.get("general.file_type")
    return ModelSpec(
        path=where,
        format="gguf",
        family=family.key,
        architecture=str(arch),
        name=header.get("general.name"),
        parameters=_count_parameters(header.tensors, tied, lm_head="output.weight"),
        parameters_source="tensors",
        **_dims_fields(dims),
        tokenizer=_GGUF_TOKENIZERS.get(tokenizer_model, tokenizer_model),
        chat_template="tokenizer.chat_template" in header.metadata,
        dtype=LLAMA_FILE_TYPES.get(file_type, by_bytes.most_common(1)[0][0]),
        file_type=LLAMA_FILE_TYPES.get(file_type) if isinstance(file_type, int) else None,
        weight_bytes=sum(t.nbytes for t in header.tensors),
        tensors=header.tensors,
    )


def _gguf_vocab(header: GGUFHeader, arch: str, where: str) -> int | None:
    """The vocabulary size: ``{arch}.vocab_size`` and the token list must agree (llama.cpp
    sizes the embedding by the token list)."""
    declared = header.get(f"{arch}.vocab_size")
    tokens = header.array_length("tokenizer.ggml.tokens")
    if declared is not None and tokens is not None and declared != tokens:
        raise ModelFormatError(
            f"{where}: {arch}.vocab_size = {shown(declared)} but tokenizer.ggml.tokens has "
            f"{tokens:,} tokens: the vocabulary sizes disagree",
            hint=GGUF_HINT,
        )
    value = declared if declared is not None else tokens
    return int(value) if isinstance(value, int) else None


def _per_layer_kv(
    counts: list[Any], layers: object, key: str, where: str
) -> tuple[int | None, bool]:
    """The largest per-layer KV head count, and whether every layer has the same."""
    if isinstance(layers, int) and len(counts) != layers:
        raise ModelFormatError(
            f"{where}: {key} lists {len(counts):,} layers, but there are {shown(layers)}",
            hint=GGUF_HINT,
        )
    if not counts:
        return None, True
    for c in counts:
        if not isinstance(c, int) or not 1 <= c <= 1024:
            raise ModelFormatError(
                f"{where}: {key} holds {shown(c)}, not a plausible KV head count", hint=GGUF_HINT
            )
    return max(counts), len(set(counts)) == 1


def _embedding_module(tensors: tuple[TensorInfo, ...]) -> str:
    """The token embedding's module name (its weight's name without ``.weight``)."""
    found = [t.name for t in tensors if t.name.endswith("embed_tokens.weight")]
    return found[0][: -len(".weight")] if found else "model.embed_tokens"


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


def read_config(folder: Path) -> dict[str, Any]:
    """A model folder's config.json, read as untrusted: a regular file inside the folder,
    at most 4 MiB, strict JSON (bounded depth, no repeated keys, no NaN), an object.

    Converters that need the config's other keys read it here, so they see exactly what
    inspection validated.

    Raises:
        ModelFormatError: any of the above does not hold.
    """
    path = model_file(folder, "config.json")
    config = parse_json(
        read_small(path, MAX_CONFIG),
        where=str(path),
        max_bytes=MAX_CONFIG,
        error=ModelFormatError,
        hint=CONFIG_HINT,
    )
    if not isinstance(config, dict):
        raise ModelFormatError(f"{path}: not a JSON object", hint=CONFIG_HINT)
    return config


def _hf_name(config: dict[str, Any], folder: Path) -> str:
    name = config.get("_name_or_path")
    return name if isinstance(name, str) and name else folder.name


def _hf_architecture(config: dict[str, Any]) -> str:
    archs = config.get("architectures")
    if isinstance(archs, list) and archs and isinstance(archs[0], str):
        return archs[0]
    return str(config.get("model_type"))


def _optional_file(folder: Path, name: str) -> Path | None:
    """``folder / name`` checked by ``model_file`` when it exists (or is a link)."""
    p = folder / name
    if not p.exists() and not p.is_symlink():
        return None
    return model_file(folder, name)


def _hf_tokenizer_kind(folder: Path) -> str | None:
    tj = _optional_file(folder, "tokenizer.json")
    if tj is not None:
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
    tc = _optional_file(folder, "tokenizer_config.json")
    if tc is None:
        return False
    hint = "the tokenizer files are corrupt: export the tokenizer again"
    data = parse_json(
        read_small(tc, MAX_TOKENIZER_CONFIG),
        where=str(tc),
        max_bytes=MAX_TOKENIZER_CONFIG,
        error=ModelFormatError,
        hint=hint,
    )
    if not isinstance(data, dict):
        raise ModelFormatError(f"{tc}: not a JSON object", hint=hint)
    return bool(data.get("chat_template"))
