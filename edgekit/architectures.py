"""The model families edgekit supports, as a table, and the tensor layout of each.

A family row says how a Hugging Face config and a GGUF file name the family, and the
structural facts that decide its tensor shapes (biases on q/k/v, q/k norms, fused
projections, extra norms). ``expected_tensors`` turns a config into the exact tensor list
a checkpoint of that family holds: the planner uses it for models described only by a
config, and the tests check it against real checkpoints.

``dimensions_from_config`` bounds every structural number (``modelspec.LIMITS``) before
anything is sized by it; ``edgekit.tensor_checks`` checks that the tensors a file holds
agree with it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from edgekit.errors import ModelFormatError, UnsupportedArchitectureError
from edgekit.modelspec import TensorInfo, check_structure, shown


@dataclass(frozen=True, kw_only=True)
class Family:
    key: str
    display: str
    hf_model_types: tuple[str, ...]
    gguf_archs: tuple[str, ...]
    tied_default: bool = False
    qkv_bias: bool = False
    qk_norm: bool = False
    fused_projections: bool = False  # Phi-3: qkv_proj and gate_up_proj
    sandwich_norms: bool = False  # Gemma 3: norms before and after the feed-forward block
    sliding_window_flag: str | None = None  # config key that switches the window on


FAMILIES: tuple[Family, ...] = (
    Family(key="llama", display="Llama", hf_model_types=("llama",), gguf_archs=("llama",)),
    # Mistral GGUFs are written with general.architecture = "llama" (same graph).
    Family(key="mistral", display="Mistral", hf_model_types=("mistral",), gguf_archs=()),
    Family(
        key="qwen2",
        display="Qwen2/Qwen2.5",
        hf_model_types=("qwen2",),
        gguf_archs=("qwen2",),
        qkv_bias=True,
        sliding_window_flag="use_sliding_window",
    ),
    Family(
        key="qwen3",
        display="Qwen3",
        hf_model_types=("qwen3",),
        gguf_archs=("qwen3",),
        qk_norm=True,
        sliding_window_flag="use_sliding_window",
    ),
    Family(
        key="phi3",
        display="Phi-3",
        hf_model_types=("phi3",),
        gguf_archs=("phi3",),
        fused_projections=True,
    ),
    Family(
        key="gemma3",
        display="Gemma 3",
        hf_model_types=("gemma3_text", "gemma3"),
        gguf_archs=("gemma3",),
        tied_default=True,
        qk_norm=True,
        sandwich_norms=True,
    ),
)

_BY_HF = {t: f for f in FAMILIES for t in f.hf_model_types}
_BY_GGUF = {a: f for f in FAMILIES for a in f.gguf_archs}
CONFIG_HINT = "the config is incomplete, corrupt, or not a causal language model's"
GGUF_HINT = "the file is corrupt or was not written for llama.cpp: convert the model again"


def supported_names() -> str:
    return ", ".join(f.display for f in FAMILIES)


def family_for_hf(model_type: object, architectures: object = None) -> Family:
    """The family of a Hugging Face config.

    Raises:
        ModelFormatError: ``model_type`` is not a string.
        UnsupportedArchitectureError: the model_type is not in the table.
    """
    if model_type is not None and not isinstance(model_type, str):
        raise ModelFormatError(
            f"config.json: model_type = {shown(model_type)} is not a string", hint=CONFIG_HINT
        )
    family = _BY_HF.get(model_type or "")
    if family is None:
        names = (
            [a for a in architectures if isinstance(a, str)]
            if isinstance(architectures, list)
            else []
        )
        arch = ", ".join(shown(a, 60)[1:-1] for a in names[:4]) or "no architectures field"
        raise UnsupportedArchitectureError(
            f"model_type {shown(model_type)} ({arch}) is not supported",
            hint=f"edgekit supports: {supported_names()}",
        )
    return family


def family_for_gguf(arch: object) -> Family:
    """The family of a GGUF ``general.architecture``.

    Raises:
        UnsupportedArchitectureError: the architecture is not in the table.
    """
    family = _BY_GGUF.get(arch) if isinstance(arch, str) else None
    if family is None:
        raise UnsupportedArchitectureError(
            f"GGUF architecture {shown(arch)} is not supported",
            hint=f"edgekit supports: {supported_names()}",
        )
    return family


@dataclass(frozen=True, kw_only=True)
class Dimensions:
    """The structural numbers of a decoder-only transformer (validated: see
    ``dimensions_from_config`` and ``inspection.spec_from_gguf``)."""

    layers: int
    hidden_size: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn_size: int
    vocab_size: int
    context_length: int
    tied_embeddings: bool
    sliding_window: int | None


def text_config(config: dict[str, Any]) -> dict[str, Any]:
    """The language-model part of a config (multimodal Gemma 3 nests it in text_config)."""
    nested = config.get("text_config")
    if isinstance(nested, dict):
        merged = dict(nested)
        merged.setdefault("tie_word_embeddings", config.get("tie_word_embeddings"))
        return merged
    return config


# Hugging Face config keys of each structural number.
HF_NAMES = {
    "layers": "num_hidden_layers",
    "hidden_size": "hidden_size",
    "heads": "num_attention_heads",
    "kv_heads": "num_key_value_heads",
    "head_dim": "head_dim",
    "ffn_size": "intermediate_size",
    "vocab_size": "vocab_size",
    "context_length": "max_position_embeddings",
    "sliding_window": "sliding_window",
}


def dimensions_from_config(config: dict[str, Any], family: Family, where: str) -> Dimensions:
    """Read and validate the structural numbers of a Hugging Face config.

    Raises:
        ModelFormatError: a required key is missing, a number is not an integer or not
            plausible (``modelspec.LIMITS``), KV heads do not divide the heads, heads do
            not divide the hidden size without an explicit head_dim, or a switch is not
            a boolean.
    """
    if "text_config" in config and not isinstance(config["text_config"], dict):
        raise ModelFormatError(
            f"{where}: text_config = {shown(config['text_config'])} is not an object",
            hint=CONFIG_HINT,
        )
    tc = text_config(config)
    tied = tc.get("tie_word_embeddings")
    if tied is None:
        tied = family.tied_default
    if not isinstance(tied, bool):
        raise ModelFormatError(
            f"{where}: tie_word_embeddings = {shown(tied)} is not true or false", hint=CONFIG_HINT
        )
    raw = {key: tc.get(name) for key, name in HF_NAMES.items()}
    if family.sliding_window_flag:
        switch = tc.get(family.sliding_window_flag)
        if switch is not None and not isinstance(switch, bool):
            raise ModelFormatError(
                f"{where}: {family.sliding_window_flag} = {shown(switch)} is not true or false",
                hint=CONFIG_HINT,
            )
        if not switch:
            raw["sliding_window"] = None  # a window the model does not use
    values = check_structure(raw, where=where, names=HF_NAMES, hint=CONFIG_HINT)
    return _dimensions(values, tied=tied)


def _dimensions(values: dict[str, int | None], *, tied: bool) -> Dimensions:
    def get(key: str) -> int:
        return int(values[key] or 0)  # check_structure filled every required key

    return Dimensions(
        layers=get("layers"),
        hidden_size=get("hidden_size"),
        heads=get("heads"),
        kv_heads=get("kv_heads"),
        head_dim=get("head_dim"),
        ffn_size=get("ffn_size"),
        vocab_size=get("vocab_size"),
        context_length=get("context_length"),
        tied_embeddings=tied,
        sliding_window=values["sliding_window"],
    )


def dimensions_from_values(values: dict[str, int | None], *, tied: bool) -> Dimensions:
    """Dimensions from numbers ``check_structure`` returned (the GGUF reader's path)."""
    return _dimensions(values, tied=tied)


def expected_tensors(
    family: Family, dims: Dimensions, *, dtype: str = "BF16", itemsize: int = 2
) -> tuple[TensorInfo, ...]:
    """The tensors a Hugging Face checkpoint of this family and size holds, in HF names."""
    return tuple(
        TensorInfo(name=n, shape=s, dtype=dtype, nbytes=_numel(s) * itemsize)
        for n, s in hf_shapes(family, dims)
    )


def hf_shapes(family: Family, dims: Dimensions) -> list[tuple[str, tuple[int, ...]]]:
    shapes: list[tuple[str, tuple[int, ...]]] = [
        ("model.embed_tokens.weight", (dims.vocab_size, dims.hidden_size))
    ]
    for i in range(dims.layers):
        shapes += [(f"model.layers.{i}.{n}", s) for n, s in _hf_layer(family, dims)]
    shapes.append(("model.norm.weight", (dims.hidden_size,)))
    if not dims.tied_embeddings:
        shapes.append(("lm_head.weight", (dims.vocab_size, dims.hidden_size)))
    return shapes


def _hf_layer(family: Family, dims: Dimensions) -> list[tuple[str, tuple[int, ...]]]:
    """The tensors of one decoder layer, relative to ``model.layers.N.``."""
    h, hd, f = dims.hidden_size, dims.head_dim, dims.ffn_size
    q, kv = dims.heads * hd, dims.kv_heads * hd
    shapes: list[tuple[str, tuple[int, ...]]] = []
    if family.fused_projections:
        shapes.append(("self_attn.qkv_proj.weight", (q + 2 * kv, h)))
    else:
        shapes += [
            ("self_attn.q_proj.weight", (q, h)),
            ("self_attn.k_proj.weight", (kv, h)),
            ("self_attn.v_proj.weight", (kv, h)),
        ]
    if family.qkv_bias:
        shapes += [
            ("self_attn.q_proj.bias", (q,)),
            ("self_attn.k_proj.bias", (kv,)),
            ("self_attn.v_proj.bias", (kv,)),
        ]
    if family.qk_norm:
        shapes += [("self_attn.q_norm.weight", (hd,)), ("self_attn.k_norm.weight", (hd,))]
    shapes.append(("self_attn.o_proj.weight", (h, q)))
    if family.fused_projections:
        shapes.append(("mlp.gate_up_proj.weight", (2 * f, h)))
    else:
        shapes += [("mlp.gate_proj.weight", (f, h)), ("mlp.up_proj.weight", (f, h))]
    shapes.append(("mlp.down_proj.weight", (h, f)))
    shapes += [("input_layernorm.weight", (h,)), ("post_attention_layernorm.weight", (h,))]
    if family.sandwich_norms:
        shapes += [
            ("pre_feedforward_layernorm.weight", (h,)),
            ("post_feedforward_layernorm.weight", (h,)),
        ]
    return shapes


def gguf_layer_shapes(
    family: Family, dims: Dimensions, *, kv_known: bool
) -> dict[str, tuple[int, ...]]:
    """The shape of every GGUF block tensor llama.cpp names, relative to ``blk.N.``
    (PyTorch order). K/V shapes are left out when the KV heads vary by layer."""
    h, hd, f = dims.hidden_size, dims.head_dim, dims.ffn_size
    q, kv = dims.heads * hd, dims.kv_heads * hd
    shapes: dict[str, tuple[int, ...]] = {
        "attn_norm.weight": (h,),
        "attn_q.weight": (q, h),
        "attn_q.bias": (q,),
        "attn_output.weight": (h, q),
        "attn_q_norm.weight": (hd,),
        "attn_k_norm.weight": (hd,),
        "ffn_norm.weight": (h,),
        "post_attention_norm.weight": (h,),
        "post_ffw_norm.weight": (h,),
        "ffn_gate.weight": (f, h),
        # Phi-3 keeps gate and up fused in one ffn_up of twice the width.
        "ffn_up.weight": (2 * f if family.fused_projections else f, h),
        "ffn_down.weight": (h, f),
    }
    if kv_known:
        shapes.update(
            {
                "attn_k.weight": (kv, h),
                "attn_v.weight": (kv, h),
                "attn_k.bias": (kv,),
                "attn_v.bias": (kv,),
                "attn_qkv.weight": (q + 2 * kv, h),
            }
        )
    return shapes


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n
