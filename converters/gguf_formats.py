"""The GGUF formats edgekit writes, as a table: llama.cpp file type, nominal bits per
weight (for size predictions) and what each one costs in quality, per llama.cpp's own
quantize tool.
"""

from __future__ import annotations

from typing import NamedTuple


class GgufFormat(NamedTuple):
    name: str
    ftype: int  # llama_ftype
    bits_per_weight: float  # nominal, for a 7B Llama (llama.cpp quantize's table)
    note: str


GGUF_FORMATS: dict[str, GgufFormat] = {
    f.name: f
    for f in (
        GgufFormat("F32", 0, 32.0, "lossless"),
        GgufFormat("F16", 1, 16.0, "lossless for fp16 sources"),
        GgufFormat("BF16", 32, 16.0, "lossless for bf16 sources"),
        GgufFormat("Q8_0", 7, 8.5, "near lossless"),
        GgufFormat("Q6_K", 18, 6.56, "very small loss"),
        GgufFormat("Q5_K_M", 17, 5.67, "small loss"),
        GgufFormat("Q5_K_S", 16, 5.52, "small loss"),
        GgufFormat("Q4_K_M", 15, 4.89, "the usual balance of size and quality"),
        GgufFormat("Q4_K_S", 14, 4.58, "more loss than Q4_K_M"),
        GgufFormat("Q4_1", 3, 4.78, "legacy 4-bit with offsets"),
        GgufFormat("Q4_0", 2, 4.34, "legacy 4-bit, fast on ARM"),
        GgufFormat("IQ4_NL", 25, 4.5, "non-linear 4-bit"),
        GgufFormat("Q3_K_M", 12, 3.91, "large loss"),
        GgufFormat("Q2_K", 10, 3.35, "very large loss"),
    )
}
FLOAT_FORMATS = ("F32", "F16", "BF16")
# File types whose tensors are already quantized (requantizing stacks the errors).
QUANTIZED_FILE_TYPES = {f.name for f in GGUF_FORMATS.values() if f.name not in FLOAT_FORMATS}
