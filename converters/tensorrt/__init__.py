"""The TensorRT format package (NVIDIA TensorRT-LLM engines).

Prediction only for now: edgekit sizes and plans TensorRT variants (weight-only integer
quantization; the embedding and the output projection stay at f16) but cannot build
them yet, so the format has no conversion edges.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

from edgekit.converters.formats import Quant
from edgekit.converters.grouped import GroupedFormat, GroupedQuant, by_analogy, lossless
from edgekit.converters.layouts import FP16, IntScheme
from edgekit.converters.openvino import FORMAT as OPENVINO

_INT8 = IntScheme(bits=8, group=-1, zero_point=False)
_INT4 = IntScheme(bits=4, group=128, zero_point=False)
SCHEMES: dict[str, GroupedQuant] = {
    "F16": GroupedQuant(scheme=FP16),
    "INT8": GroupedQuant(scheme=_INT8, embeddings=FP16, output=FP16),
    "INT4": GroupedQuant(scheme=_INT4, embeddings=FP16, output=FP16),
}


class TensorRtFormat(GroupedFormat):
    name: ClassVar[str] = "tensorrt"
    display: ClassVar[str] = "TensorRT"
    entry: ClassVar[str] = ""  # an engine folder
    default_quant: ClassVar[str] = "INT4"
    schemes: ClassVar[Mapping[str, GroupedQuant]] = SCHEMES
    quants: ClassVar[Mapping[str, Quant]] = {
        "F16": lossless("F16"),
        "INT8": by_analogy("INT8", _INT8, OPENVINO, "INT8"),
        "INT4": by_analogy("INT4", _INT4, OPENVINO, "INT4"),
    }


FORMAT = TensorRtFormat()

__all__ = ["FORMAT", "TensorRtFormat"]
