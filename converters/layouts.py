"""How many bytes each format stores per tensor: the shared types of a weight layout.

A format is not one number of bits per weight. llama.cpp's Q4_K_M keeps the output
projection and some attention-value and feed-forward-down tensors at Q6_K; NNCF's INT4
keeps the embeddings at INT8 and stores a scale (and a zero point) for every group of
weights. Each format package applies its own rules tensor by tensor, from a model's
tensor list alone (a config is enough), into the ``WeightLayout`` defined here, which
says which bytes a decode step reads: ``edgekit.converters.gguf.layout`` (llama.cpp's
type choice), ``edgekit.converters.openvino.layout`` (NNCF), and the group-wise integer
schemes below for formats edgekit predicts but does not build yet.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

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
    """A format applied to every tensor of a model (``format``: the quantization's name;
    which runtime loads it is the caller's business)."""

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


def numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


# ---------------------------------------------------------------------------------------
# Group-wise integer formats (NNCF's, and the first estimates of formats not built yet)


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
    rows, ncols = numel(shape[:-1]), shape[-1]
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


# INT8 per output channel with a zero point: NNCF's backup precision, and the fallback for
# a matrix no group size fits.
INT8_CHANNEL_ASYM = IntScheme(bits=8, group=-1, zero_point=True)
FP16 = IntScheme(bits=16, group=-1, zero_point=False)


def grouped_layout(
    spec: ModelSpec,
    *,
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
            size, label = numel(t.shape) * 4, "F32"
        else:
            chosen = scheme
            if role == "token_embd" and embeddings is not None:
                chosen = embeddings
            elif role == "output" and output is not None:
                chosen = output
            fitted = int_nbytes(t.shape, chosen) or int_nbytes(t.shape, INT8_CHANNEL_ASYM)
            if fitted is None:  # pragma: no cover - per-channel always fits
                fitted = (numel(t.shape) * 2, "F16")
            size, label = fitted
        out.append(TensorLayout(name=t.name, role=role, shape=t.shape, storage=label, nbytes=size))
    return WeightLayout(format=fmt, tensors=tuple(out), tied_embeddings=spec.tied_embeddings)
