"""How many bytes each format stores per tensor: the weights part of a memory prediction.

A format is not one number of bits per weight. llama.cpp's Q4_K_M keeps the output
projection and some attention-value and feed-forward-down tensors at Q6_K, and falls back
to 32-element block types when a row does not divide into 256; NNCF's INT4 keeps the
embeddings at INT8 and stores a scale (and a zero point) for every group of weights. This
module applies those rules tensor by tensor, from a model's tensor list alone (a config
is enough), and says which bytes a decode step reads.

The GGUF rules follow llama.cpp's ``llama_tensor_get_type`` (src/llama-quant.cpp) for the
formats edgekit writes; tests/test_layouts.py checks them against files llama.cpp itself
wrote. The OpenVINO rules were read off NNCF-compressed models (the Const sizes in the
IR); the same test checks them against real exports.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from edgekit.errors import UnsupportedConversionError
from edgekit.ggml_types import GGML_TYPES
from edgekit.modelspec import ModelSpec, TensorInfo

Role = Literal[
    "token_embd",
    "output",
    "attn_q",
    "attn_k",
    "attn_v",
    "attn_qkv",
    "attn_output",
    "ffn_gate",
    "ffn_up",
    "ffn_down",
    "vector",  # norms and biases: stay in float everywhere
    "other",
]

# Hugging Face and GGUF names -> role. The layer number is read separately.
_ROLE_PATTERNS: tuple[tuple[str, Role], ...] = (
    (r"(embed_tokens|token_embd)\.weight$", "token_embd"),
    (r"(^|\.)(lm_head|output)\.weight$", "output"),
    (r"(q_proj|attn_q)\.weight$", "attn_q"),
    (r"(k_proj|attn_k)\.weight$", "attn_k"),
    (r"(v_proj|attn_v)\.weight$", "attn_v"),
    (r"(qkv_proj|attn_qkv)\.weight$", "attn_qkv"),
    (r"(o_proj|attn_output)\.weight$", "attn_output"),
    (r"(gate_proj|ffn_gate)\.weight$", "ffn_gate"),
    (r"(up_proj|gate_up_proj|ffn_up)\.weight$", "ffn_up"),
    (r"(down_proj|ffn_down)\.weight$", "ffn_down"),
)
_LAYER = re.compile(r"(?:layers|blk)\.(\d+)\.")


def tensor_role(t: TensorInfo) -> Role:
    if len(t.shape) < 2:
        return "vector"
    for pattern, role in _ROLE_PATTERNS:
        if re.search(pattern, t.name):
            return role
    return "other"


def tensor_layer(name: str) -> int | None:
    m = _LAYER.search(name)
    return int(m.group(1)) if m else None


@dataclass(frozen=True, kw_only=True)
class TensorLayout:
    name: str
    role: Role
    shape: tuple[int, ...]
    storage: str  # "Q6_K", "INT4/g64+zp", "F16", ...
    nbytes: int


@dataclass(frozen=True, kw_only=True)
class WeightLayout:
    """A format applied to every tensor of a model."""

    target: str
    format: str
    tensors: tuple[TensorLayout, ...]
    tied_embeddings: bool

    @property
    def total_bytes(self) -> int:
        return sum(t.nbytes for t in self.tensors)

    @property
    def bytes_per_token(self) -> int:
        """Weight bytes one decode step reads: every matrix once, but only one row of an
        untied embedding table (a tied one is read whole as the output projection)."""
        total = 0
        for t in self.tensors:
            if t.role == "token_embd" and not self.tied_embeddings:
                total += t.nbytes // max(t.shape[0], 1)
            else:
                total += t.nbytes
        return total

    @property
    def matmul_parameters(self) -> int:
        """Weights multiplied per token (the embedding lookup is not a multiply unless tied)."""
        n = 0
        for t in self.tensors:
            if t.role == "vector" or (t.role == "token_embd" and not self.tied_embeddings):
                continue
            count = 1
            for d in t.shape:
                count *= d
            n += count
        return n

    def by_storage(self) -> dict[str, int]:
        """Bytes per storage type, largest first (what `edgekit plan --json` shows)."""
        sizes: dict[str, int] = {}
        for t in self.tensors:
            sizes[t.storage] = sizes.get(t.storage, 0) + t.nbytes
        return dict(sorted(sizes.items(), key=lambda kv: -kv[1]))


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


# ---------------------------------------------------------------------------------------
# GGUF (llama.cpp)

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
    return _numel(shape) // t.block_size * t.type_size


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
    return WeightLayout(
        target="llamacpp", format=ftype, tensors=tuple(out), tied_embeddings=spec.tied_embeddings
    )


# ---------------------------------------------------------------------------------------
# Group-wise integer formats (OpenVINO/NNCF; the first estimates for QNN, MLX, TensorRT)


@dataclass(frozen=True, kw_only=True)
class IntScheme:
    """Integer weights with a float scale (and optionally a zero point) per group."""

    bits: int  # 4 or 8; 16 or 32 = float, no scales
    group: int  # elements per scale; -1 = one per output row
    zero_point: bool  # asymmetric: a zero point per group, of ``bits`` bits
    scale_bytes: int = 2  # f16 scales
    bias_bytes: int = 0  # MLX stores a float bias per group instead of a zero point
    min_group: int = 32  # NNCF's "adjust" fallback will not go below this


def _group_for(ncols: int, group: int, min_group: int) -> int | None:
    """The group size used for a row of ``ncols``: NNCF halves the requested size until
    it divides the row, and gives up (backup precision) below ``min_group``."""
    if group <= 0 or group >= ncols:
        return ncols if group <= 0 or ncols % group else group
    g = group
    while g >= min_group:
        if ncols % g == 0:
            return g
        g //= 2
    return None


def int_nbytes(shape: tuple[int, ...], scheme: IntScheme) -> tuple[int, str] | None:
    """Bytes of one matrix under ``scheme`` and its storage label; None when the row
    length admits no group size (the caller keeps a backup precision)."""
    rows, ncols = _numel(shape[:-1]), shape[-1]
    if scheme.bits >= 16:
        return rows * ncols * scheme.bits // 8, f"F{scheme.bits}"
    g = _group_for(ncols, scheme.group, scheme.min_group)
    if g is None:
        return None
    groups = rows * (ncols // g)
    weights = (rows * ncols * scheme.bits + 7) // 8
    zero = (groups * scheme.bits + 7) // 8 if scheme.zero_point else 0
    extra = groups * (scheme.scale_bytes + scheme.bias_bytes) + zero
    label = f"INT{scheme.bits}/" + ("channel" if g == ncols else f"g{g}")
    return weights + extra, label


INT8_CHANNEL_ASYM = IntScheme(bits=8, group=-1, zero_point=True)
# OpenVINO formats as edgekit exports them (converters/openvino_convert.py).
OPENVINO_SCHEMES: dict[str, IntScheme] = {
    "F16": IntScheme(bits=16, group=-1, zero_point=False),
    "INT8": INT8_CHANNEL_ASYM,
    "INT4": IntScheme(bits=4, group=128, zero_point=True),
    "INT4_SYM": IntScheme(bits=4, group=-1, zero_point=False),
}


def grouped_layout(
    spec: ModelSpec,
    *,
    target: str,
    fmt: str,
    scheme: IntScheme,
    embeddings: IntScheme | None,
    output: IntScheme | None,
) -> WeightLayout:
    """``scheme`` on every matrix; ``embeddings``/``output`` override those two (None:
    same as the rest). Vectors stay f32. A matrix no group fits keeps INT8 per channel."""
    out: list[TensorLayout] = []
    for t in spec.tensors:
        role = tensor_role(t)
        if role == "vector":
            size, label = _numel(t.shape) * 4, "F32"
        else:
            chosen = scheme
            if role == "token_embd" and embeddings is not None:
                chosen = embeddings
            elif role == "output" and output is not None:
                chosen = output
            fitted = int_nbytes(t.shape, chosen) or int_nbytes(t.shape, INT8_CHANNEL_ASYM)
            if fitted is None:  # pragma: no cover - per-channel always fits
                fitted = (_numel(t.shape) * 2, "F16")
            size, label = fitted
        out.append(TensorLayout(name=t.name, role=role, shape=t.shape, storage=label, nbytes=size))
    return WeightLayout(
        target=target, format=fmt, tensors=tuple(out), tied_embeddings=spec.tied_embeddings
    )


def openvino_layout(spec: ModelSpec, fmt: str, *, group_size: int | None = None) -> WeightLayout:
    """``spec`` compressed by NNCF as edgekit exports it: 4-bit formats keep the embedding
    (and an untied lm_head) at INT8 per channel, NNCF's backup precision. "F16" stores
    every float constant as f16 (openvino's compress_to_fp16, norms included), whatever
    the source's float type: 2 bytes per weight.

    Raises:
        UnsupportedConversionError: ``fmt`` is not an OpenVINO format.
    """
    scheme = OPENVINO_SCHEMES.get(fmt)
    if scheme is None:
        raise UnsupportedConversionError(
            f"{fmt!r} is not an OpenVINO format",
            hint=f"choose one of {', '.join(OPENVINO_SCHEMES)}",
        )
    if scheme.bits == 16:
        return WeightLayout(
            target="openvino",
            format=fmt,
            tensors=tuple(
                TensorLayout(
                    name=t.name,
                    role=tensor_role(t),
                    shape=t.shape,
                    storage="F16",
                    nbytes=_numel(t.shape) * 2,
                )
                for t in spec.tensors
            ),
            tied_embeddings=spec.tied_embeddings,
        )
    if group_size and scheme.bits == 4:
        scheme = IntScheme(bits=4, group=group_size, zero_point=scheme.zero_point)
    backup = INT8_CHANNEL_ASYM if scheme.bits == 4 else None
    return grouped_layout(
        spec, target="openvino", fmt=fmt, scheme=scheme, embeddings=backup, output=backup
    )
