"""The GGUF file types edgekit writes, as a table: llama.cpp file type, nominal bits per
weight (for size predictions) and what each one costs in quality, per llama.cpp's own
quantize tool and edgekit's measurement.
"""

from __future__ import annotations

from dataclasses import replace
from typing import NamedTuple

from edgekit.converters.recipe import Recipe

from edgekit.errors import UnsupportedConversionError
from edgekit.ggml_types import GGML_TYPES


class GgufFileType(NamedTuple):
    name: str
    ftype: int  # llama_ftype
    bits_per_weight: float  # nominal, for a 7B Llama (llama.cpp quantize's table)
    note: str


GGUF_FORMATS: dict[str, GgufFileType] = {
    f.name: f
    for f in (
        GgufFileType("F32", 0, 32.0, "lossless"),
        GgufFileType("F16", 1, 16.0, "lossless for fp16 sources"),
        GgufFileType("BF16", 32, 16.0, "lossless for bf16 sources"),
        GgufFileType("Q8_0", 7, 8.5, "near lossless"),
        GgufFileType("Q6_K", 18, 6.56, "very small loss"),
        GgufFileType("Q5_K_M", 17, 5.67, "small loss"),
        GgufFileType("Q5_K_S", 16, 5.52, "small loss"),
        GgufFileType("Q4_K_M", 15, 4.89, "the usual balance of size and quality"),
        GgufFileType("Q4_K_S", 14, 4.58, "more loss than Q4_K_M"),
        GgufFileType("Q4_1", 3, 4.78, "legacy 4-bit with offsets"),
        GgufFileType("Q4_0", 2, 4.34, "legacy 4-bit, fast on ARM"),
        GgufFileType("IQ4_NL", 25, 4.5, "non-linear 4-bit"),
        GgufFileType("Q3_K_M", 12, 3.91, "large loss"),
        GgufFileType("Q2_K", 10, 3.35, "very large loss"),
    )
}
FLOAT_FORMATS = ("F32", "F16", "BF16")
_GGML_BY_NAME = {t.name: i for i, t in GGML_TYPES.items()}
# File types whose tensors are already quantized (requantizing stacks the errors).
QUANTIZED_FILE_TYPES = {f.name for f in GGUF_FORMATS.values() if f.name not in FLOAT_FORMATS}

# file type -> mean KL against the source, SmolLM2-135M, 8 x 512-token windows of the
# shipped text (benchmarks/quality_table.py; the reference is the float32 export).
MEASURED_KL: dict[str, float] = {
    "Q8_0": 0.00357,
    "Q6_K": 0.00836,
    "Q5_K_M": 0.06512,
    "Q5_K_S": 0.07473,
    "Q4_K_M": 0.0449,
    "Q4_K_S": 0.05081,
    "Q4_0": 0.24878,
    "IQ4_NL": 0.16704,
    "Q3_K_M": 0.11113,
    "Q2_K": 0.34359,
}
KL_SOURCE = "table (SmolLM2-135M)"

# The metadata key a GGUF written by edgekit records its recipe under.
RECIPE_KEY = "edgekit.recipe"


def recorded_recipe(recipe: Recipe) -> str:
    """``recipe`` as a GGUF records it (``edgekit.recipe``): the options llama.cpp has a
    meaning for; group-wise and calibration options belong to other backends."""
    return replace(recipe, group_size=None, ratio=None, calibration=None).to_json()


def ggml_type_id(name: str, what: str) -> int:
    """The ggml type id of a recipe's tensor type (``what``: the recipe field).

    Raises:
        UnsupportedConversionError: ``name`` is not a ggml tensor type.
    """
    type_id = _GGML_BY_NAME.get(name.upper())
    if type_id is None:
        raise UnsupportedConversionError(
            f"recipe {what}={name!r} is not a GGML tensor type",
            hint="use e.g. Q8_0, Q6_K, F16",
        )
    return type_id
