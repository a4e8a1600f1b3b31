"""TensorRT Edge-LLM as a bundle format: the portable ONNX export NVIDIA's
``tensorrt-edgellm-export`` writes, with the engine build settings beside it.

The engine itself is built on the device (its GPU architecture, its TensorRT): a variant
holds the export, and the target builds and caches the engine at first load. edgekit
builds F16 exports here; the quantized precisions are sized and planned but not built
(``quant_not_built``): quantizing for Edge-LLM runs NVIDIA ModelOpt's calibration on a
CUDA GPU. Which chip runs which precision is the table in ``socs``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

from edgekit.converters.formats import Edge, Quant
from edgekit.converters.grouped import GroupedFormat, GroupedQuant, by_analogy, lossless
from edgekit.converters.layouts import FP16, IntScheme, WeightLayout, grouped_layout
from edgekit.converters.openvino import FORMAT as OPENVINO
from edgekit.converters.tensorrt.socs import F16, FP8, INT4, INT8, NVFP4
from edgekit.converters.tensorrt.tool_env import EXPORT_ENV

from edgekit.modelspec import ModelSpec
from edgekit.tool_envs import ToolEnv

# INT8 SmoothQuant (W8A8): 8-bit weights, a scale per output channel.
_INT8 = IntScheme(bits=8, group=-1, zero_point=False)
# INT4 AWQ (W4A16): Edge-LLM supports only group 128 (NVIDIA's supported-models notes).
_INT4 = IntScheme(bits=4, group=128, zero_point=False)
# FP8 (E4M3): one byte a weight, per-tensor scales (negligible).
_FP8 = IntScheme(bits=8, group=-1, zero_point=False)
# NVFP4: 4-bit E2M1 values, an FP8 scale per 16 (plus one f32 per tensor): 4.5 bits.
_NVFP4 = IntScheme(bits=4, group=16, zero_point=False, scale_bytes=1, min_group=16)
SCHEMES: dict[str, GroupedQuant] = {
    F16: GroupedQuant(scheme=FP16),
    INT8: GroupedQuant(scheme=_INT8, embeddings=FP16, output=FP16),
    INT4: GroupedQuant(scheme=_INT4, embeddings=FP16, output=FP16),
    FP8: GroupedQuant(scheme=_FP8, embeddings=FP16, output=FP16),
    NVFP4: GroupedQuant(scheme=_NVFP4, embeddings=FP16, output=FP16),
}
BUILT = (F16,)
NOT_BUILT = (
    "quantizing for TensorRT Edge-LLM needs NVIDIA ModelOpt calibration on a CUDA GPU "
    "(tensorrt-edgellm-quantize); edgekit builds F16 exports"
)


def _quants() -> dict[str, Quant]:
    notes = {
        INT8: "INT8 SmoothQuant (W8A8), per output channel",
        INT4: "INT4 AWQ (W4A16), group 128",
        FP8: "FP8 E4M3 weights and activations: SM89+ (Ada, Hopper, Blackwell)",
        NVFP4: "NVFP4 (E2M1, an FP8 scale per 16): Blackwell SM100+",
    }
    analog = {INT8: "INT8", INT4: "INT4", FP8: "INT8", NVFP4: "INT4"}
    out = {F16: lossless(F16)}
    for name in (INT8, INT4, FP8, NVFP4):
        q = by_analogy(name, SCHEMES[name].scheme, OPENVINO, analog[name])
        out[name] = Quant(
            name=q.name,
            bits_per_weight=q.bits_per_weight,
            expected_kl=q.expected_kl,
            kl_source=q.kl_source,
            note=notes[name],
        )
    return out


class TensorRtFormat(GroupedFormat):
    """A TensorRT Edge-LLM export folder with its engine settings (``folder``)."""

    name: ClassVar[str] = "tensorrt"
    display: ClassVar[str] = "TensorRT Edge-LLM"
    entry: ClassVar[str] = ""  # the variant folder: llm/ and engine.json
    default_quant: ClassVar[str] = F16  # the one precision edgekit builds
    schemes: ClassVar[Mapping[str, GroupedQuant]] = SCHEMES
    quants: ClassVar[Mapping[str, Quant]] = _quants()
    buildable: ClassVar[bool] = True
    tool_envs: ClassVar[tuple[ToolEnv, ...]] = (EXPORT_ENV,)

    def layout(self, spec: ModelSpec, quant: str, *, group_size: int | None = None) -> WeightLayout:
        """``spec`` under the precision's scheme. ``group_size`` is ignored: Edge-LLM's
        groups are fixed (AWQ 128, NVFP4 16), and the export refuses the option."""
        q = self.require_quant(quant)
        chosen = self.schemes[q.name]
        return grouped_layout(
            spec,
            fmt=q.name,
            scheme=chosen.scheme,
            embeddings=chosen.embeddings,
            output=chosen.output,
        )

    def quant_not_built(self, quant: str) -> str:
        found = self.quant(quant)
        if found is None or found.name in BUILT:
            return ""
        return NOT_BUILT

    # edges imports this module (its schemes): imported when asked, not at import time
    def cannot_build(self, spec: ModelSpec) -> str:
        from edgekit.converters.tensorrt.edges import cannot_build

        return cannot_build(spec.family)

    def edges(self) -> tuple[Edge, ...]:
        from edgekit.converters.tensorrt.edges import EDGES

        return EDGES
