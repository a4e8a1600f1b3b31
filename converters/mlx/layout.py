"""Which bits every tensor of an MLX variant gets, and what it weighs as mlx stores it.

One rule decides a tensor's bits (``tensor_bits``): the converter's quant predicate asks
it for every module it quantizes, and the layout asks it for every tensor it sizes, so the
plan and the files cannot disagree. The mixed rule is mlx-lm's own
(``mlx_lm.convert.mixed_quant_predicate_builder``, after llama.cpp's Q4_K_M): v_proj
(phi3's fused qkv_proj too: mlx-lm matches the substring) and down_proj of the first and
last eighth of the layers and of every third layer between, and lm_head, at 6 bits.

As mlx stores a quantized matrix (``nn.QuantizedLinear`` / ``QuantizedEmbedding``): the
weight packed in uint32 words (out x in * bits / 32), then a scale and a bias per group
of ``group_size`` in the variant's float type. Every other tensor is stored in the float
type (norms included).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from edgekit.converters.layouts import TensorLayout, WeightLayout, numel, tensor_layer, tensor_role

from edgekit.errors import UnsupportedConversionError
from edgekit.modelspec import ModelSpec, TensorInfo

# quant -> (bulk bits, the mixed rule's high bits); 0 bits: a float variant
QUANT_BITS: dict[str, tuple[int, int | None]] = {
    "F32": (0, None),
    "F16": (0, None),
    "BF16": (0, None),
    "8BIT": (8, None),
    "6BIT": (6, None),
    "4BIT": (4, None),
    "MIXED_3_6": (3, 6),
    "MIXED_4_6": (4, 6),
}
FLOAT_QUANTS = ("F32", "F16", "BF16")
GROUP_SIZES = (32, 64, 128)  # what mlx's affine quantization supports
DEFAULT_GROUP = 64
FLOAT_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}
# Module paths in mlx's (= Hugging Face's) names, and GGUF's, which the planner sizes a
# GGUF source by: the rule must give a tensor the same bits under either name.
_EMBED = re.compile(r"(^|\.)(embed_tokens|token_embd)$")
_HEAD = re.compile(r"(^|\.)lm_head$|^output$")
# mlx-lm's substring test: "v_proj" also matches phi3's fused qkv_proj
_SENSITIVE = re.compile(r"v_proj|down_proj|attn_v$|attn_qkv$|ffn_down$")


@dataclass(frozen=True, kw_only=True)
class BitPlan:
    """The bits of every quantizable module of one variant (0: kept in float)."""

    quant: str
    bits: int  # the bulk bits (0: a float variant)
    high_bits: int | None  # the mixed rule's bits (None: no mixed rule)
    group_size: int
    layers: int
    embeddings: int | None = None  # pinned bits of embed_tokens (0: float); None: the rule's
    output: int | None = None  # pinned bits of lm_head (0: float)
    tied: bool = False  # one tensor is embedding and output: its pin is either one
    eight_bit_layers: frozenset[int] = frozenset()  # recipe ratio: whole layers at 8 bits


def more_bits(index: int, layers: int) -> bool:
    """mlx-lm's (and llama.cpp's) sensitive layers: the first and last eighth, every third."""
    return index < layers // 8 or index >= 7 * layers // 8 or (index - layers // 8) % 3 == 2


def eight_bit_layers(layers: int, ratio: float | None) -> frozenset[int]:
    """The layers a recipe's ratio keeps at 8 bits: ``(1 - ratio)`` of them, the most
    sensitive by the position rule first (sensitive layers, then nearest an end)."""
    if ratio is None or ratio >= 1.0:
        return frozenset()
    keep = round((1.0 - ratio) * layers)
    ranked = sorted(
        range(layers), key=lambda i: (not more_bits(i, layers), min(i, layers - 1 - i), i)
    )
    return frozenset(ranked[:keep])


def module_bits(path: str, plan: BitPlan) -> int:
    """Bits of the quantizable module at ``path`` (mlx's module path: the tensor name
    without ``.weight``); 0: stays in float."""
    if plan.bits == 0:
        return 0
    if _EMBED.search(path):
        pin = plan.embeddings
        if pin is None and plan.tied:
            pin = plan.output
        return plan.bits if pin is None else pin
    if _HEAD.search(path):
        if plan.output is not None:
            return plan.output
        return plan.high_bits or plan.bits
    layer = tensor_layer(path + ".")
    if layer is not None and layer in plan.eight_bit_layers:
        return 8
    sensitive = layer is not None and more_bits(layer, plan.layers)
    if plan.high_bits and sensitive and _SENSITIVE.search(path):
        return plan.high_bits
    return plan.bits


def quantizable(t: TensorInfo, group_size: int) -> bool:
    """A matrix mlx quantizes: a Linear's or Embedding's weight whose rows split into
    whole groups (mlx-lm leaves the others in float)."""
    return (
        len(t.shape) == 2
        and t.name.endswith(".weight")
        and tensor_role(t) != "vector"
        and t.shape[-1] % group_size == 0
    )


def quantized_nbytes(shape: tuple[int, ...], bits: int, group: int, float_bytes: int) -> int:
    """uint32 words of packed weights, then a scale and a bias per group."""
    rows, cols = numel(shape[:-1]), shape[-1]
    return rows * (cols * bits // 32) * 4 + 2 * rows * (cols // group) * float_bytes


def float_dtype(quant: str, source_dtype: str) -> str:
    """The float type a variant stores (scales, biases, norms, and so its activations and
    KV cache): its own for a float quant; for a quantized one the source's, as
    ``mlx_lm convert`` keeps it (an f32 source, such as a dequantized GGUF, stays f32).
    Measured on mlx 0.32.4's CPU build: a 4-bit matmul with bf16 scales runs ~8x slower
    than with f32 ones, f16 ~40x; on Metal all three are native."""
    if quant == "F32":
        return "float32"
    if quant == "F16":
        return "float16"
    if quant == "BF16":
        return "bfloat16"
    name = source_dtype.upper()
    if name in ("FLOAT16", "F16", "FP16"):
        return "float16"
    if name in ("BFLOAT16", "BF16"):
        return "bfloat16"
    return "float32"


def plan_layout(spec: ModelSpec, plan: BitPlan, dtype: str) -> WeightLayout:
    """Every tensor of ``spec`` (its Hugging Face names and logical shapes) under ``plan``."""
    fbytes = FLOAT_BYTES[dtype]
    label = {"float32": "F32", "float16": "F16", "bfloat16": "BF16"}[dtype]
    out: list[TensorLayout] = []
    for t in spec.tensors:
        bits = module_bits(t.name.removesuffix(".weight"), plan)
        if bits and quantizable(t, plan.group_size):
            size = quantized_nbytes(t.shape, bits, plan.group_size, fbytes)
            storage = f"{bits}BIT/g{plan.group_size}"
        else:
            size, storage = numel(t.shape) * fbytes, label
        out.append(
            TensorLayout(
                name=t.name, role=tensor_role(t), shape=t.shape, storage=storage, nbytes=size
            )
        )
    return WeightLayout(format=plan.quant, tensors=tuple(out), tied_embeddings=spec.tied_embeddings)


def default_plan(spec: ModelSpec, quant: str, group_size: int | None = None) -> BitPlan:
    """The plan of ``quant`` with no recipe pins (what ``convert --quant`` writes).

    Raises:
        UnsupportedConversionError: not an MLX quant, or a group size mlx lacks.
    """
    name = quant.upper()
    if name not in QUANT_BITS:
        raise UnsupportedConversionError(
            f"{quant!r} is not an MLX quantization", hint=f"choose one of {', '.join(QUANT_BITS)}"
        )
    # None is "not given"; 0 is a value, refused like any other mlx lacks
    group = DEFAULT_GROUP if group_size is None else group_size
    if group not in GROUP_SIZES:
        raise UnsupportedConversionError(
            f"group_size={group} is not one mlx's affine quantization supports",
            hint=f"use {', '.join(map(str, GROUP_SIZES))}",
        )
    bits, high = QUANT_BITS[name]
    return BitPlan(
        quant=name,
        bits=bits,
        high_bits=high,
        group_size=group,
        layers=spec.layers,
        tied=spec.tied_embeddings,
    )
