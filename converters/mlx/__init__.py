"""The MLX format package (Apple's MLX: safetensors with group-wise quantized weights).

Prediction only for now: edgekit sizes and plans MLX variants (MLX stores a float scale
and bias per group of 64) but cannot build them yet, so the format has no conversion
edges. The quantization names are MLX's own ("8bit", "4bit").
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

from edgekit.converters.formats import Quant
from edgekit.converters.gguf import FORMAT as GGUF
from edgekit.converters.grouped import GroupedFormat, GroupedQuant, by_analogy, lossless
from edgekit.converters.layouts import FP16, IntScheme
from edgekit.converters.openvino import FORMAT as OPENVINO

_8BIT = IntScheme(bits=8, group=64, zero_point=False, bias_bytes=2)
_4BIT = IntScheme(bits=4, group=64, zero_point=False, bias_bytes=2)
SCHEMES: dict[str, GroupedQuant] = {
    "F16": GroupedQuant(scheme=FP16),
    "8BIT": GroupedQuant(scheme=_8BIT),
    "4BIT": GroupedQuant(scheme=_4BIT),
}


class MlxFormat(GroupedFormat):
    name: ClassVar[str] = "mlx"
    display: ClassVar[str] = "MLX"
    entry: ClassVar[str] = ""  # a folder of safetensors and config
    default_quant: ClassVar[str] = "4bit"
    schemes: ClassVar[Mapping[str, GroupedQuant]] = SCHEMES
    quants: ClassVar[Mapping[str, Quant]] = {
        "F16": lossless("F16"),
        "8BIT": by_analogy("8bit", _8BIT, OPENVINO, "INT8"),
        "4BIT": by_analogy("4bit", _4BIT, GGUF, "Q4_0"),
    }


FORMAT = MlxFormat()

__all__ = ["FORMAT", "MlxFormat"]
