"""The ONNX format package (ONNX Runtime with the Qualcomm QNN execution provider).

Prediction only for now: edgekit sizes and plans ONNX variants (per-channel symmetric
integer weights with f32 scales, as QNN's quantizer writes them) but cannot build them
yet, so the format has no conversion edges.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

from edgekit.converters.formats import Quant
from edgekit.converters.grouped import GroupedFormat, GroupedQuant, by_analogy
from edgekit.converters.layouts import IntScheme
from edgekit.converters.openvino import FORMAT as OPENVINO

_INT8 = IntScheme(bits=8, group=-1, zero_point=False, scale_bytes=4)
_INT4 = IntScheme(bits=4, group=-1, zero_point=False, scale_bytes=4)
SCHEMES: dict[str, GroupedQuant] = {
    "INT8": GroupedQuant(scheme=_INT8),
    # 4-bit matrices; the embedding and the output projection stay at INT8
    "INT4": GroupedQuant(scheme=_INT4, embeddings=_INT8, output=_INT8),
}


class OnnxFormat(GroupedFormat):
    name: ClassVar[str] = "onnx"
    display: ClassVar[str] = "ONNX"
    entry: ClassVar[str] = ""  # an onnxruntime-genai folder (model.onnx, genai_config.json)
    default_quant: ClassVar[str] = "INT8"
    schemes: ClassVar[Mapping[str, GroupedQuant]] = SCHEMES
    quants: ClassVar[Mapping[str, Quant]] = {
        "INT8": by_analogy("INT8", _INT8, OPENVINO, "INT8"),
        "INT4": by_analogy("INT4", _INT4, OPENVINO, "INT4_SYM"),
    }


FORMAT = OnnxFormat()

__all__ = ["FORMAT", "OnnxFormat"]
