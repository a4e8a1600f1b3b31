"""How each supported family is written as GGUF: its llama.cpp architecture, metadata keys,
tensor names, and the per-tensor transforms llama.cpp expects.

Transforms (each one a silent-wrong-output bug when missed, caught by the parity tests):
- Llama/Mistral: Q and K projections are permuted from Hugging Face's rotate-half layout
  to the interleaved rotary layout llama.cpp's "llama" graph uses.
- Gemma 3: RMSNorm computes x * (1 + w) in Hugging Face; llama.cpp multiplies by w, so
  every norm weight is stored as 1 + w.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from edgekit.architectures import Dimensions, Family, text_config
from edgekit.errors import UnsupportedConversionError

if TYPE_CHECKING:
    import gguf
    import numpy as np


@dataclass(frozen=True, kw_only=True)
class GgufArch:
    name: str  # llama.cpp architecture (general.architecture)
    permute_qk: bool = False
    norm_shift: float = 0.0


ARCHES: dict[str, GgufArch] = {
    "llama": GgufArch(name="llama", permute_qk=True),
    "mistral": GgufArch(name="llama", permute_qk=True),
    "qwen2": GgufArch(name="qwen2"),
    "qwen3": GgufArch(name="qwen3"),
    "phi3": GgufArch(name="phi3"),
    "gemma3": GgufArch(name="gemma3", norm_shift=1.0),
}


def permute_rotary(w: np.ndarray, n_head: int) -> np.ndarray:
    """Hugging Face rotate-half Q/K rows -> llama.cpp's interleaved pairs."""
    return (
        w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
        .swapaxes(1, 2)
        .reshape(w.shape)
    )


def unpermute_rotary(w: np.ndarray, n_head: int) -> np.ndarray:
    """The inverse of ``permute_rotary``: GGUF Q/K rows back to Hugging Face layout."""
    return (
        w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:])
        .swapaxes(1, 2)
        .reshape(w.shape)
    )


def rope_settings(config: dict[str, Any], family: Family) -> tuple[float, dict[str, Any]]:
    """RoPE base frequency and scaling of a config (transformers 4 and 5 spellings).

    Raises:
        UnsupportedConversionError: a RoPE scaling type edgekit cannot express in GGUF.
    """
    tc = text_config(config)
    params = tc.get("rope_parameters") or {}
    if "full_attention" in params:  # Gemma 3 in transformers 5: per attention kind
        params = params["full_attention"]
    scaling = tc.get("rope_scaling") or {}
    theta = float(tc.get("rope_theta") or params.get("rope_theta") or 10000.0)
    kind = scaling.get("rope_type") or scaling.get("type") or params.get("rope_type") or "default"
    source = scaling or params
    if kind == "default":
        return theta, {}
    if kind == "linear":
        return theta, {"type": "linear", "factor": float(source["factor"])}
    if kind == "llama3" and family.key in ("llama", "mistral"):
        return theta, {"type": "llama3", **source}
    raise UnsupportedConversionError(
        f"RoPE scaling {kind!r} of this {family.display} model is not supported yet",
        hint="supported: default, linear, and llama3 (Llama 3.1/3.2)",
    )


def llama3_rope_factors(settings: dict[str, Any], head_dim: int, theta: float) -> list[float]:
    """Per-frequency divisors of Llama 3.1's RoPE scaling (written as rope_freqs.weight).

    Wavelengths shorter than original_context / high_freq_factor keep their frequency,
    longer than original_context / low_freq_factor are divided by ``factor``, and the band
    between is interpolated smoothly.
    """
    factor = float(settings["factor"])
    low = float(settings.get("low_freq_factor", 1.0))
    high = float(settings.get("high_freq_factor", 4.0))
    old_ctx = float(settings.get("original_max_position_embeddings", 8192))
    low_wavelen, high_wavelen = old_ctx / low, old_ctx / high
    factors = []
    for i in range(0, head_dim, 2):
        wavelen = 2 * math.pi * theta ** (i / head_dim)
        if wavelen < high_wavelen:
            factors.append(1.0)
        elif wavelen > low_wavelen:
            factors.append(factor)
        else:
            smooth = (old_ctx / wavelen - low) / (high - low)
            factors.append(1 / ((1 - smooth) / factor + smooth))
    return factors


def write_metadata(
    writer: gguf.GGUFWriter, family: Family, config: dict[str, Any], dims: Dimensions
) -> dict[str, Any]:
    """Write the architecture's hyperparameters; returns the RoPE scaling settings.

    Raises:
        UnsupportedConversionError: a config feature this GGUF architecture cannot hold.
    """
    tc = text_config(config)
    if family.key == "phi3" and (tc.get("rope_scaling") or {}).get("type") == "longrope":
        raise UnsupportedConversionError(
            "Phi-3 LongRoPE (128k context) models are not supported yet",
            hint="use a 4k-context Phi-3 variant",
        )
    theta, scaling = rope_settings(config, family)
    writer.add_context_length(dims.context_length)
    writer.add_embedding_length(dims.hidden_size)
    writer.add_block_count(dims.layers)
    writer.add_feed_forward_length(dims.ffn_size)
    writer.add_head_count(dims.heads)
    writer.add_head_count_kv(dims.kv_heads)
    eps = tc.get("rms_norm_eps") or tc.get("layer_norm_eps") or 1e-6
    writer.add_layer_norm_rms_eps(float(eps))
    writer.add_rope_freq_base(theta)
    rotary = int(dims.head_dim * float(tc.get("partial_rotary_factor") or 1.0))
    writer.add_rope_dimension_count(rotary)
    if dims.head_dim != dims.hidden_size // dims.heads or family.key in ("qwen3", "gemma3"):
        writer.add_key_length(dims.head_dim)
        writer.add_value_length(dims.head_dim)
    writer.add_vocab_size(dims.vocab_size)
    if scaling.get("type") == "linear":
        import gguf as g

        writer.add_rope_scaling_type(g.RopeScalingType.LINEAR)
        writer.add_rope_scaling_factor(scaling["factor"])
    if dims.sliding_window and family.key in ("phi3", "gemma3"):
        writer.add_sliding_window(dims.sliding_window)
    return scaling


def tensor_name_map(arch: GgufArch, layers: int) -> gguf.TensorNameMap:
    import gguf as g

    by_name = {v: k for k, v in g.MODEL_ARCH_NAMES.items()}
    return g.get_tensor_name_map(by_name[arch.name], layers)


def transform(hf_name: str, data: np.ndarray, arch: GgufArch, dims: Dimensions) -> np.ndarray:
    """Apply the family's layout changes to one tensor (float32 in, float32 out)."""
    if arch.permute_qk:
        if hf_name.endswith("self_attn.q_proj.weight"):
            return permute_rotary(data, dims.heads)
        if hf_name.endswith("self_attn.k_proj.weight"):
            return permute_rotary(data, dims.kv_heads)
    if arch.norm_shift and hf_name.endswith("norm.weight"):
        return data + arch.norm_shift
    return data


def untransform(hf_name: str, data: np.ndarray, arch: GgufArch, dims: Dimensions) -> np.ndarray:
    """The inverse of ``transform``: a GGUF tensor back to Hugging Face layout."""
    if arch.permute_qk:
        if hf_name.endswith("self_attn.q_proj.weight"):
            return unpermute_rotary(data, dims.heads)
        if hf_name.endswith("self_attn.k_proj.weight"):
            return unpermute_rotary(data, dims.kv_heads)
    if arch.norm_shift and hf_name.endswith("norm.weight"):
        return data - arch.norm_shift
    return data
