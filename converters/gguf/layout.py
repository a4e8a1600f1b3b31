"""llama.cpp's per-tensor type choice: what a GGUF of each file type stores, tensor by
tensor, from a model's tensor list alone (a config is enough).

The rules follow llama.cpp's ``llama_tensor_get_type`` (src/llama-quant.cpp) for the file
types edgekit writes: Q4_K_M keeps the output projection and some attention-value and
feed-forward-down tensors at Q6_K, and a type whose 256-element block does not divide a
row falls back to a 32-element type. tests/test_layouts.py checks them against files
llama.cpp itself wrote.
"""

from __future__ import annotations

from edgekit.converters.layouts import (
    Role,
    TensorLayout,
    WeightLayout,
    numel,
    tensor_layer,
    tensor_role,
)

from edgekit.errors import UnsupportedConversionError
from edgekit.ggml_types import GGML_TYPES
from edgekit.modelspec import ModelSpec

# llama.cpp file type -> the tensor type most tensors get (llama_ftype_get_default_type)
_GGUF_DEFAULT = {
    "F32": "F32",
    "F16": "F16",
    "BF16": "BF16",
    "Q8_0": "Q8_0",
    "Q6_K": "Q6_K",
    "Q5_K_M": "Q5_K",
    "Q5_K_S": "Q5_K",
    "Q4_K_M": "Q4_K",
    "Q4_K_S": "Q4_K",
    "Q4_1": "Q4_1",
    "Q4_0": "Q4_0",
    "IQ4_NL": "IQ4_NL",
    "Q3_K_M": "Q3_K",
    "Q2_K": "Q2_K",
}
# A type whose block does not divide a row falls back to a 32-element type.
_GGUF_FALLBACK = {"Q2_K": "Q4_0", "Q3_K": "Q4_0", "Q4_K": "Q5_0", "Q5_K": "Q5_1", "Q6_K": "Q8_0"}
_GGML_BY_NAME = {t.name: t for t in GGML_TYPES.values()}
# Families whose 80-layer checkpoints llama.cpp labels 70B (attn_v gets one step more).
_SEVENTY_B_FAMILIES = ("llama", "mistral", "qwen2")


def _use_more_bits(i: int, n: int) -> bool:
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def gguf_tensor_type(
    ftype: str,
    role: Role,
    *,
    ncols: int,
    index: int,
    count: int,
    tied: bool,
    gqa: int,
    seventy_b: bool,
) -> str:
    """The ggml type llama.cpp's quantizer gives one tensor.

    ``index``/``count`` are the tensor's position among tensors of its role (attn_v and
    ffn_down take more bits in some layers); ``gqa`` is heads / kv_heads.
    """
    default = _GGUF_DEFAULT[ftype]
    if role in ("vector", "other"):
        return "F32"
    if ftype in ("F32", "F16", "BF16"):
        return default
    new = default
    block = _GGML_BY_NAME[default].block_size
    if role == "output" or (tied and role == "token_embd"):
        if ncols % block != 0:
            new = "Q8_0"
        elif new != "Q8_0":
            new = "Q6_K"
    elif role == "token_embd":
        pass
    elif role in ("attn_v", "attn_qkv"):
        if ftype == "Q2_K":
            new = "Q4_K" if gqa >= 4 else "Q3_K"
        elif ftype == "Q3_K_M":
            new = "Q5_K" if index < 2 else "Q4_K"
        elif ftype == "IQ4_NL" and gqa >= 4:
            new = "Q5_K"
        elif ftype in ("Q4_K_M", "Q5_K_M") and _use_more_bits(index, count):
            new = "Q6_K"
        elif ftype == "Q4_K_S" and index < 4:
            new = "Q5_K"
        if seventy_b and new in ("Q3_K", "Q4_K"):
            new = "Q5_K"
    elif role == "ffn_down":
        if ftype == "Q2_K":
            new = "Q3_K"
        elif ftype == "Q3_K_M":
            new = "Q5_K" if index < count // 16 else "Q4_K"
        elif ftype in ("Q4_K_M", "Q5_K_M") and _use_more_bits(index, count):
            new = "Q6_K"
        elif ftype == "IQ4_NL" and index < count // 8 or ftype == "Q4_K_S" and index < count // 8:
            new = "Q5_K"
    elif role == "attn_output":
        if ftype == "Q2_K":
            new = "Q3_K"
        elif ftype == "Q3_K_M":
            new = "Q4_K"
    if ncols % _GGML_BY_NAME[new].block_size != 0:
        new = _GGUF_FALLBACK.get(new, new)
        if ncols % _GGML_BY_NAME[new].block_size != 0:
            new = "F16"
    return new


def _ggml_bytes(ggml_type: str, shape: tuple[int, ...]) -> int:
    t = _GGML_BY_NAME[ggml_type]
    return numel(shape) // t.block_size * t.type_size


def gguf_layout(spec: ModelSpec, ftype: str) -> WeightLayout:
    """The tensor types and sizes of ``spec`` quantized to ``ftype`` by llama.cpp.

    Raises:
        UnsupportedConversionError: ``ftype`` is not a GGUF format edgekit writes.
    """
    if ftype not in _GGUF_DEFAULT:
        raise UnsupportedConversionError(
            f"{ftype!r} is not a GGUF format edgekit plans for",
            hint=f"choose one of {', '.join(_GGUF_DEFAULT)}",
        )
    roles = [(t, tensor_role(t)) for t in spec.tensors]
    counts: dict[str, int] = {}
    for _, role in roles:
        key = "attn_v" if role in ("attn_v", "attn_qkv") else role
        counts[key] = counts.get(key, 0) + 1
    seen: dict[str, int] = {}
    gqa = spec.heads // max(spec.kv_heads, 1)
    seventy_b = spec.family in _SEVENTY_B_FAMILIES and spec.layers == 80 and gqa > 1
    out: list[TensorLayout] = []
    for t, role in sorted(roles, key=lambda tr: (tensor_layer(tr[0].name) or 0, tr[0].name)):
        key = "attn_v" if role in ("attn_v", "attn_qkv") else role
        index = seen.get(key, 0)
        seen[key] = index + 1
        if role == "ffn_down":
            index, count = tensor_layer(t.name) or 0, spec.layers
        else:
            count = counts[key]
        ggml_type = gguf_tensor_type(
            ftype,
            role,
            ncols=t.shape[-1] if t.shape else 1,
            index=index,
            count=count,
            tied=spec.tied_embeddings,
            gqa=gqa,
            seventy_b=seventy_b,
        )
        out.append(
            TensorLayout(
                name=t.name,
                role=role,
                shape=t.shape,
                storage=ggml_type,
                nbytes=_ggml_bytes(ggml_type, t.shape),
            )
        )
    return WeightLayout(format=ftype, tensors=tuple(out), tied_embeddings=spec.tied_embeddings)


def file_layout(spec: ModelSpec, quant: str) -> WeightLayout:
    """The layout of a GGUF file as written: its own tensors, types and sizes (``spec``
    inspected from the file); a spec of any other source gets the planned layout."""
    if spec.format != "gguf":
        return gguf_layout(spec, quant)
    tensors = tuple(
        TensorLayout(
            name=t.name, role=tensor_role(t), shape=t.shape, storage=t.dtype, nbytes=t.nbytes
        )
        for t in spec.tensors
    )
    return WeightLayout(format=quant, tensors=tensors, tied_embeddings=spec.tied_embeddings)
