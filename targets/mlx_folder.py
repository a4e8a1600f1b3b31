"""An MLX variant folder, read and checked before mlx or mlx_lm opens a file of it.

mlx_lm trusts its folder: ``mlx_lm.utils.load_model`` imports ``mlx_lm.models.<model_type>``
from the config's string, runs the Python file a ``model_file`` key names, turns a legacy
``quantization_config`` into AWQ/GPTQ weight transforms, quantizes by whatever the
``quantization`` block says, reads config.json and generation_config.json unbounded and
loads every ``model*.safetensors`` file in the folder, whatever the index says. So here,
in this order, before any of that:

- config.json: a regular file in the folder (no link), at most 4 MiB of strict JSON
  (``edgekit.untrusted.parse_json``); ``model_type`` one of the families edgekit builds
  (``MODULES``: the mlx_lm module each one loads, so the import is ours, not the file's);
  no ``model_file``, ``quantize_activations`` or legacy ``quantization_config`` (mlx_lm
  writes one equal to ``quantization``: that one is allowed); its structural numbers
  within edgekit's bounds (``edgekit.modelspec.check_structure``).
- ``quantization``: bits in {2, 3, 4, 5, 6, 8}, group size in {32, 64, 128} (exact ints),
  mode affine; per-module entries (a scheme, or false) only for Linear/Embedding modules
  the files hold. The numbers mlx_lm computes with (rope_theta...) numbers.
- Tensors against the config (edgekit.tensor_checks and the family's layout): layers,
  embedding, output head as tied says; each packed module's U32 weight, scales and
  biases the shapes its scheme and the config's widths make; one float dtype.
- Weights: every ``model*.safetensors`` (what mlx_lm loads) is a regular file, not a
  link, and exactly the files the index names (when there is one); every header checked
  against its file (``edgekit.safetensors_header``: the length it claims, every tensor's
  offsets), the total bounded.
- edgekit.json, when present, bounded strict JSON: its kv_cache is the session's default.
- tokenizer.json there (the session tokenizes with it), and the tokenizer files read as
  the ONNX session reads them (targets/hf_tokens.py); generation_config.json, when
  present, bounded strict JSON.

A folder failing any of this is a ModelFormatError naming the problem, with a hint.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edgekit.targets import hf_tokens
from edgekit.targets.hf_tokens import TokenizerFiles

from edgekit.architectures import HF_NAMES
from edgekit.errors import ModelFormatError, ModelNotFoundError
from edgekit.modelspec import TensorInfo, check_structure, shown
from edgekit.safetensors_header import INDEX_NAME, read_folder_tensors

CONFIG = "config.json"
GENERATION_CONFIG = "generation_config.json"
EDGEKIT_JSON = "edgekit.json"  # what edgekit built (converters/mlx)
KV_CACHES = ("f16", "q8_0", "q4_0")  # what a recipe's kv_cache may be for MLX
CONFIG_BYTES = 4 << 20  # a real config.json is a few KB
GENERATION_BYTES = 1 << 20
MAX_WEIGHT_BYTES = 1 << 40  # 1 TiB: beyond any device edgekit plans for
KIND = "an MLX variant folder"
CONVERT_HINT = "convert the model again: edgekit convert MODEL --to mlx -o DIR"
# model_type -> the mlx_lm.models module that runs it (mlx_lm remaps mistral to llama).
# Transformers' Gemma3ForCausalLM writes gemma3_text; "gemma3" is mlx_lm's vision wrapper.
MODULES: Mapping[str, str] = {
    "llama": "llama",
    "mistral": "llama",
    "qwen2": "qwen2",
    "qwen3": "qwen3",
    "phi3": "phi3",
    "gemma3_text": "gemma3_text",
}
BITS = frozenset({2, 3, 4, 5, 6, 8})  # what mlx's affine quantization packs
GROUPS = frozenset({32, 64, 128})
# Keys mlx_lm acts on that an edgekit variant never holds: code to run, legacy
# quantization formats converted on load, activation quantization.
REFUSED_KEYS = ("model_file", "quantize_activations")
_FLOAT_BYTES = {"F32": 4, "F16": 2, "BF16": 2}
# Config numbers the mlx_lm model classes compute with (None where they may be unset).
_NUMBERS = (
    "rope_theta",
    "rms_norm_eps",
    "partial_rotary_factor",
    "query_pre_attn_scalar",
    "rope_local_base_freq",
    "final_logit_softcapping",
    "attn_logit_softcapping",
)
_SWITCHES = ("attention_bias", "mlp_bias", "tie_word_embeddings", "rope_traditional")
# A Linear/Embedding module's last name -> its (input, output) widths, named from the
# config's dimensions (what mlx quantizes; anything else, a norm, it does not).
_MODULE_INPUTS: Mapping[str, tuple[str, str]] = {
    "q_proj": ("hidden", "attention"),
    "k_proj": ("hidden", "kv"),
    "v_proj": ("hidden", "kv"),
    "qkv_proj": ("hidden", "qkv"),
    "o_proj": ("attention", "hidden"),
    "gate_proj": ("hidden", "ffn"),
    "up_proj": ("hidden", "ffn"),
    "gate_up_proj": ("hidden", "ffn2"),
    "down_proj": ("ffn", "hidden"),
    "embed_tokens": ("hidden", "vocab"),
    "lm_head": ("hidden", "vocab"),
}


@dataclass(frozen=True, kw_only=True)
class Quantization:
    bits: int
    group_size: int


@dataclass(frozen=True, kw_only=True)
class MlxFolder:
    """A checked MLX variant folder: what its config says, its files and tokenizer."""

    path: Path
    model_type: str
    module: str  # the mlx_lm.models module that runs it
    config: Mapping[str, Any]  # config.json as checked (what load_model is given)
    context_length: int  # max_position_embeddings
    vocab_size: int
    layers: int
    kv_heads: int
    head_dim: int
    eos_ids: tuple[int, ...]
    weight_files: tuple[str, ...]
    weight_bytes: int  # the tensors' data bytes (what mlx holds resident)
    activation_dtype: str  # the float the model computes in, its KV cache's: F32, F16, BF16
    quantization: Quantization | None
    tokenizer: TokenizerFiles
    per_module: Mapping[str, Any] = field(default_factory=dict)
    kv_cache: str | None = None  # the KV cache edgekit.json records from the recipe

    @property
    def activation_bytes(self) -> int:
        return _FLOAT_BYTES[self.activation_dtype]


def read_folder(path: Path) -> MlxFolder:
    """Read and check ``path`` (see the module text).

    Raises:
        ModelNotFoundError: ``path`` is not a folder.
        ModelFormatError: whatever the module text lists.
    """
    if not path.is_dir():
        raise ModelNotFoundError(
            f"{path}: no such folder (an MLX variant is a folder with {CONFIG})",
            hint="pass the variant folder that edgekit convert --to mlx wrote",
        )
    config = _object(_json(path, CONFIG, CONFIG_BYTES), CONFIG)
    model_type = config.get("model_type")
    if not isinstance(model_type, str) or model_type not in MODULES:
        raise _bad(
            f"model_type {shown(model_type)} is not one edgekit runs on MLX ({', '.join(MODULES)})"
        )
    for key in REFUSED_KEYS:
        if key in config:
            raise _bad(f"sets {key!r}, which edgekit does not let mlx_lm act on")
    dims = check_structure(
        {k: config.get(v) for k, v in HF_NAMES.items()},
        where=str(path / CONFIG),
        names=HF_NAMES,
        hint=CONVERT_HINT,
    )
    _check_numbers(config)
    files, tensors = _weights(path)
    names = {t.name for t in tensors}
    quant, per_module = _quantization(config, names)
    _check_tensors(path, config, model_type, tensors, quant, per_module)
    vocab = int(dims["vocab_size"] or 0)
    return MlxFolder(
        path=path,
        model_type=model_type,
        module=MODULES[model_type],
        config=config,
        context_length=int(dims["context_length"] or 0),
        vocab_size=vocab,
        layers=int(dims["layers"] or 0),
        kv_heads=int(dims["kv_heads"] or 0),
        head_dim=int(dims["head_dim"] or 0),
        eos_ids=_eos_ids(path, config, vocab),
        weight_files=files,
        weight_bytes=sum(t.nbytes for t in tensors),
        activation_dtype=_activation_dtype(tensors),
        quantization=quant,
        per_module=per_module,
        kv_cache=_recorded_kv_cache(path),
        tokenizer=hf_tokens.read_tokenizer_files(path, kind=KIND, hint=CONVERT_HINT),
    )


def _bad(what: str) -> ModelFormatError:
    return ModelFormatError(f"{CONFIG}: {what}", hint=CONVERT_HINT)


def _json(folder: Path, name: str, max_bytes: int) -> Any:
    data = hf_tokens.read_bytes(folder, name, max_bytes, kind=KIND, hint=CONVERT_HINT)
    if len(data) > max_bytes:
        raise ModelFormatError(
            f"{folder / name}: larger than the {max_bytes:,} bytes allowed", hint=CONVERT_HINT
        )
    return hf_tokens.read_json(folder, name, max_bytes, kind=KIND, hint=CONVERT_HINT)


def _object(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise _bad(f"{where} is not an object")
    return value


def _weights(folder: Path) -> tuple[tuple[str, ...], tuple[TensorInfo, ...]]:
    """The weight files mlx_lm will load, each checked, and every tensor in them."""
    loaded = sorted(p.name for p in folder.glob("model*.safetensors"))
    for name in [*loaded, INDEX_NAME]:
        try:
            st = os.lstat(folder / name)
        except FileNotFoundError:
            continue
        if not stat.S_ISREG(st.st_mode):
            what = "a link" if stat.S_ISLNK(st.st_mode) else "not a regular file"
            raise ModelFormatError(
                f"{folder / name}: {what}; an MLX variant's weight files are plain files in "
                "its folder",
                hint="copy the files into the variant folder; " + CONVERT_HINT,
            )
    if not loaded:
        raise ModelFormatError(f"{folder}: no model*.safetensors weight file", hint=CONVERT_HINT)
    tensors = read_folder_tensors(folder)  # the index's names, the headers, the tiling
    named = {t.name for t in tensors}
    if len(named) != len(tensors):
        raise ModelFormatError(f"{folder}: a tensor appears twice", hint=CONVERT_HINT)
    if os.path.lexists(folder / INDEX_NAME):
        from edgekit.safetensors_header import safetensors_files

        indexed = sorted(p.name for p in safetensors_files(folder))
        if indexed != loaded:
            raise ModelFormatError(
                f"{folder}: the index names {', '.join(map(shown, indexed[:4]))}, but mlx "
                f"loads {', '.join(map(shown, loaded[:4]))} (every model*.safetensors)",
                hint=CONVERT_HINT,
            )
    else:
        others = sorted(p.name for p in folder.glob("*.safetensors") if p.name not in loaded)
        if others:
            raise ModelFormatError(
                f"{folder}: {shown(others[0])} is a weight file mlx would not load "
                "(it loads model*.safetensors)",
                hint=CONVERT_HINT,
            )
    total = sum(t.nbytes for t in tensors)
    if total > MAX_WEIGHT_BYTES:
        raise ModelFormatError(
            f"{folder}: {total:,} bytes of weights, more than the {MAX_WEIGHT_BYTES:,} allowed",
            hint=CONVERT_HINT,
        )
    return tuple(loaded), tensors


def _quantization(
    config: dict[str, Any], names: set[str]
) -> tuple[Quantization | None, dict[str, Any]]:
    """The bulk quantization and the per-module overrides, each checked."""
    block = config.get("quantization")
    legacy = config.get("quantization_config")
    text = config.get("text_config")
    if isinstance(text, dict) and "quantization_config" in text:
        raise _bad("text_config sets a quantization_config, which edgekit does not load")
    if legacy is not None and legacy != block:
        raise _bad(
            "sets a quantization_config other than its quantization block (a format mlx_lm "
            "converts on load: AWQ, GPTQ, bitnet...), which edgekit does not load"
        )
    if block is None:
        return None, {}
    block = _object(block, "quantization")
    bulk = _scheme(block, "quantization")
    per_module: dict[str, Any] = {}
    for key, value in block.items():
        if key in ("bits", "group_size", "mode"):
            continue
        module = str(key)
        if f"{module}.weight" not in names:
            raise _bad(f"quantization names {shown(module)}, a module the weights do not hold")
        if module.rsplit(".", 1)[-1] not in _MODULE_INPUTS:
            raise _bad(f"quantization names {shown(module)}, not a Linear or Embedding module")
        if isinstance(value, dict):
            value = _scheme(value, f"quantization[{shown(module)}]")
        elif value is not False:  # mlx-lm writes a scheme, or false for a module it left
            raise _bad(f"quantization[{shown(module)}] is {shown(value)}, not an object or false")
        per_module[module] = value
    return bulk, per_module


def _scheme(block: dict[str, Any], where: str) -> Quantization:
    bits, group, mode = block.get("bits"), block.get("group_size"), block.get("mode", "affine")
    # exact ints: mlx packs by bits and group as ints (4.0 or true would pass `in`)
    if type(bits) is not int or bits not in BITS:
        raise _bad(f"{where}.bits is {shown(bits)}, not one of {sorted(BITS)}")
    if type(group) is not int or group not in GROUPS:
        raise _bad(f"{where}.group_size is {shown(group)}, not one of {sorted(GROUPS)}")
    if mode != "affine":
        raise _bad(f"{where}.mode is {shown(mode)}; edgekit runs affine quantization only")
    return Quantization(bits=bits, group_size=group)


def _eos_ids(folder: Path, config: dict[str, Any], vocab: int) -> tuple[int, ...]:
    """The end-of-sequence ids: generation_config.json's (as mlx_lm takes them), else the
    config's; each a token id."""
    given = config.get("eos_token_id")
    if os.path.lexists(folder / GENERATION_CONFIG):
        generation = _json(folder, GENERATION_CONFIG, GENERATION_BYTES)
        if not isinstance(generation, dict):
            raise ModelFormatError(
                f"{folder / GENERATION_CONFIG}: not an object", hint=CONVERT_HINT
            )
        if generation.get("eos_token_id"):
            given = generation["eos_token_id"]
    ids = given if isinstance(given, list) else [] if given is None else [given]
    if len(ids) > 64 or not all(
        isinstance(i, int) and not isinstance(i, bool) and 0 <= i < vocab for i in ids
    ):
        raise _bad(f"eos_token_id {shown(given)} is not 0 to 64 token ids below {vocab:,}")
    return tuple(int(i) for i in ids)


def _activation_dtype(tensors: tuple[TensorInfo, ...]) -> str:
    """The float the model computes in: its norms' dtype (a quantized model keeps them,
    and its scales, in the float dtype it was converted at)."""
    for t in tensors:
        if t.name.endswith("norm.weight") and t.dtype in _FLOAT_BYTES:
            return t.dtype
    return "F16"


def _recorded_kv_cache(folder: Path) -> str | None:
    """The kv_cache edgekit.json records (what the recipe asked for), when it is one the
    session takes; None without the file (a variant mlx_lm.convert wrote)."""
    if not os.path.lexists(folder / EDGEKIT_JSON):
        return None
    recorded = _json(folder, EDGEKIT_JSON, GENERATION_BYTES)
    if not isinstance(recorded, dict):
        raise ModelFormatError(f"{folder / EDGEKIT_JSON}: not an object", hint=CONVERT_HINT)
    kv = recorded.get("kv_cache")
    if kv is not None and kv not in KV_CACHES:
        raise ModelFormatError(
            f"{folder / EDGEKIT_JSON}: kv_cache {shown(kv)} is not one of {', '.join(KV_CACHES)}",
            hint=CONVERT_HINT,
        )
    return kv if isinstance(kv, str) else None


def _check_numbers(config: dict[str, Any]) -> None:
    """mlx_lm computes with these: numbers (not a str, nor a bool taken as 1), booleans."""
    import math

    for key in _NUMBERS:
        value = config.get(key)
        if value is None:
            continue
        if type(value) not in (int, float) or not math.isfinite(value):
            raise _bad(f"{key} is {shown(value)}, not a finite number")
    for key in _SWITCHES:
        if key in config and not isinstance(config[key], bool):
            raise _bad(f"{key} is {shown(config[key])}, not true or false")


def _check_tensors(
    folder: Path,
    config: dict[str, Any],
    model_type: str,
    tensors: tuple[TensorInfo, ...],
    quant: Quantization | None,
    per_module: Mapping[str, Any],
) -> None:
    """The tensors agree with the config: the family's layers and embedding, every packed
    module's weight/scales/biases the shapes and dtypes of its scheme, every unpacked
    Linear a float (out, in), one float dtype throughout, the output head as tied says."""
    from edgekit.architectures import dimensions_from_config, family_for_hf
    from edgekit.tensor_checks import check_hf_tensors

    family = family_for_hf(model_type, config.get("architectures"))
    dims = dimensions_from_config(config, family, str(folder / CONFIG))
    by_name = {t.name: t for t in tensors}
    embed = next((n[: -len(".weight")] for n in by_name if n.endswith("embed_tokens.weight")), "")
    embed_scheme = _scheme_of(embed, by_name, quant, per_module)
    check_hf_tensors(
        family,
        dims,
        tensors,
        where=str(folder),
        quantized=quant is not None,
        embedding_columns=None
        if embed_scheme is None
        else dims.hidden_size * embed_scheme.bits // 32,
    )
    if ("lm_head.weight" in by_name) == dims.tied_embeddings:
        state = "ties" if dims.tied_embeddings else "does not tie"
        raise _bad(
            f"tie_word_embeddings: the config {state} the output head to the embedding, but "
            f"lm_head.weight is {'there' if dims.tied_embeddings else 'missing'}"
        )
    widths = {
        "hidden": dims.hidden_size,
        "attention": dims.heads * dims.head_dim,
        "ffn": dims.ffn_size,
        "kv": dims.kv_heads * dims.head_dim,
        "qkv": (dims.heads + 2 * dims.kv_heads) * dims.head_dim,
        "ffn2": 2 * dims.ffn_size,
        "vocab": dims.vocab_size,
    }
    floats = {t.dtype for t in tensors if t.dtype != "U32"}
    if len(floats) != 1 or not floats <= set(_FLOAT_BYTES):
        raise _bad(
            f"the tensors are {', '.join(sorted(floats))}: mlx runs one float dtype of "
            f"{', '.join(_FLOAT_BYTES)} (and U32 packed weights)"
        )
    _check_layout(family, dims, by_name, model_type)
    packed = set()
    for name, t in by_name.items():
        module, _, leaf = name.rpartition(".")
        kind = _MODULE_INPUTS.get(module.rsplit(".", 1)[-1])
        if kind is None or leaf != "weight":
            continue
        scheme = _scheme_of(module, by_name, quant, per_module)
        _check_module(module, t, by_name, scheme, widths[kind[0]], widths[kind[1]])
        if scheme is not None:
            packed |= {name, f"{module}.scales", f"{module}.biases"}
    stray = [t.name for t in tensors if t.dtype == "U32" and t.name not in packed]
    if stray:
        raise _bad(f"{shown(stray[0])} is U32, but no quantized module packs it")


def _check_layout(family: Any, dims: Any, by_name: Mapping[str, TensorInfo], kind: str) -> None:
    """Every tensor of the family's layout is there; a norm of the config's shape."""
    from edgekit.architectures import hf_shapes

    for name, shape in hf_shapes(family, dims):
        module = name.rpartition(".")[0]
        if name not in by_name:
            raise _bad(f"the {kind} layout needs {shown(name)}, which the files lack")
        if module.rsplit(".", 1)[-1] not in _MODULE_INPUTS and by_name[name].shape != shape:
            raise _bad(f"{shown(name)} is {by_name[name].shape}, not the config's {shape}")


def _scheme_of(
    module: str,
    by_name: Mapping[str, TensorInfo],
    quant: Quantization | None,
    per_module: Mapping[str, Any],
) -> Quantization | None:
    """The scheme mlx_lm quantizes ``module`` by (its class predicate): the per-module
    entry, else the bulk scheme where the files hold its scales, else none."""
    if module in per_module:
        entry = per_module[module]
        return entry if isinstance(entry, Quantization) else None
    if quant is not None and f"{module}.scales" in by_name:
        return quant
    return None


def _check_module(
    module: str,
    weight: TensorInfo,
    by_name: Mapping[str, TensorInfo],
    scheme: Quantization | None,
    width: int,
    out: int,
) -> None:
    scales, biases = by_name.get(f"{module}.scales"), by_name.get(f"{module}.biases")
    if scheme is None:
        if scales is not None or weight.shape != (out, width) or weight.dtype == "U32":
            raise _bad(
                f"{shown(module)} is not quantized, so its weight must be a float "
                f"({out}, {width}) without scales; the files hold {weight.dtype} "
                f"{weight.shape}{' and scales' if scales is not None else ''}"
            )
        return
    bits, group = scheme.bits, scheme.group_size
    if width % group or (width * bits) % 32:
        raise _bad(f"{shown(module)}: {width} inputs do not pack in groups of {group}")
    want = {"weight": (out, width * bits // 32), "scales": (out, width // group)}
    want["biases"] = want["scales"]
    for leaf, t in (("weight", weight), ("scales", scales), ("biases", biases)):
        dtype_ok = t is not None and (t.dtype == "U32") == (leaf == "weight")
        if t is None or not dtype_ok or tuple(t.shape) != want[leaf]:
            held = "nothing" if t is None else f"{t.dtype} {tuple(t.shape)}"
            raise _bad(
                f"{shown(module)} is {bits}-bit in groups of {group}, so its {leaf} must be "
                f"{'U32' if leaf == 'weight' else 'float'} {want[leaf]}; the files hold {held}"
            )
