"""The model families edgekit supports, as a table, and the tensor layout of each.

A family row says how a Hugging Face config and a GGUF file name the family, and the
structural facts that decide its tensor shapes (biases on q/k/v, q/k norms, fused
projections, extra norms). ``expected_tensors`` turns a config into the exact tensor list
a checkpoint of that family holds: the planner uses it for models described only by a
config, and the tests check it against real checkpoints.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from edgekit.errors import ModelFormatError, UnsupportedArchitectureError
from edgekit.modelspec import TensorInfo


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


def supported_names() -> str:
    return ", ".join(f.display for f in FAMILIES)


def family_for_hf(model_type: str | None, architectures: list[str] | None = None) -> Family:
    """The family of a Hugging Face config.

    Raises:
        UnsupportedArchitectureError: the model_type is not in the table.
    """
    family = _BY_HF.get(model_type or "")
    if family is None:
        arch = ", ".join(architectures or []) or "no architectures field"
        raise UnsupportedArchitectureError(
            f"model_type {model_type!r} ({arch}) is not supported",
            hint=f"edgekit supports: {supported_names()}",
        )
    return family


def family_for_gguf(arch: str | None) -> Family:
    """The family of a GGUF ``general.architecture``.

    Raises:
        UnsupportedArchitectureError: the architecture is not in the table.
    """
    family = _BY_GGUF.get(arch or "")
    if family is None:
        raise UnsupportedArchitectureError(
            f"GGUF architecture {arch!r} is not supported",
            hint=f"edgekit supports: {supported_names()}",
        )
    return family


@dataclass(frozen=True, kw_only=True)
class Dimensions:
    """The structural numbers of a decoder-only transformer."""

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


def dimensions_from_config(config: dict[str, Any], family: Family, where: str) -> Dimensions:
    """Read the structural numbers from a Hugging Face config.

    Raises:
        ModelFormatError: a required key is missing or not a positive integer.
    """
    tc = text_config(config)

    def need(key: str) -> int:
        value = tc.get(key)
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise ModelFormatError(
                f"{where}: config.json has no valid {key!r} (found {value!r})",
                hint="the config is incomplete or not a causal language model's",
            )
        return value

    hidden = need("hidden_size")
    heads = need("num_attention_heads")
    kv_heads = tc.get("num_key_value_heads") or heads
    head_dim = tc.get("head_dim") or hidden // heads
    tied = tc.get("tie_word_embeddings")
    if tied is None:
        tied = family.tied_default
    window = tc.get("sliding_window")
    if family.sliding_window_flag and not tc.get(family.sliding_window_flag, False):
        window = None
    return Dimensions(
        layers=need("num_hidden_layers"),
        hidden_size=hidden,
        heads=heads,
        kv_heads=int(kv_heads),
        head_dim=int(head_dim),
        ffn_size=need("intermediate_size"),
        vocab_size=need("vocab_size"),
        context_length=need("max_position_embeddings"),
        tied_embeddings=bool(tied),
        sliding_window=int(window) if isinstance(window, int) and window > 0 else None,
    )


def expected_tensors(
    family: Family, dims: Dimensions, *, dtype: str = "BF16", itemsize: int = 2
) -> tuple[TensorInfo, ...]:
    """The tensors a Hugging Face checkpoint of this family and size holds, in HF names."""
    h, hd, f = dims.hidden_size, dims.head_dim, dims.ffn_size
    q, kv = dims.heads * hd, dims.kv_heads * hd
    shapes: list[tuple[str, tuple[int, ...]]] = [
        ("model.embed_tokens.weight", (dims.vocab_size, h))
    ]
    for i in range(dims.layers):
        p = f"model.layers.{i}."
        if family.fused_projections:
            shapes.append((p + "self_attn.qkv_proj.weight", (q + 2 * kv, h)))
        else:
            shapes += [
                (p + "self_attn.q_proj.weight", (q, h)),
                (p + "self_attn.k_proj.weight", (kv, h)),
                (p + "self_attn.v_proj.weight", (kv, h)),
            ]
        if family.qkv_bias:
            shapes += [
                (p + "self_attn.q_proj.bias", (q,)),
                (p + "self_attn.k_proj.bias", (kv,)),
                (p + "self_attn.v_proj.bias", (kv,)),
            ]
        if family.qk_norm:
            shapes += [
                (p + "self_attn.q_norm.weight", (hd,)),
                (p + "self_attn.k_norm.weight", (hd,)),
            ]
        shapes.append((p + "self_attn.o_proj.weight", (h, q)))
        if family.fused_projections:
            shapes.append((p + "mlp.gate_up_proj.weight", (2 * f, h)))
        else:
            shapes += [(p + "mlp.gate_proj.weight", (f, h)), (p + "mlp.up_proj.weight", (f, h))]
        shapes.append((p + "mlp.down_proj.weight", (h, f)))
        shapes += [
            (p + "input_layernorm.weight", (h,)),
            (p + "post_attention_layernorm.weight", (h,)),
        ]
        if family.sandwich_norms:
            shapes += [
                (p + "pre_feedforward_layernorm.weight", (h,)),
                (p + "post_feedforward_layernorm.weight", (h,)),
            ]
    shapes.append(("model.norm.weight", (h,)))
    if not dims.tied_embeddings:
        shapes.append(("lm_head.weight", (dims.vocab_size, h)))
    return tuple(
        TensorInfo(name=n, shape=s, dtype=dtype, nbytes=_numel(s) * itemsize) for n, s in shapes
    )


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n
