"""OpenVINO IR as a bundle format: the NNCF compressions edgekit exports, what each
weighs tensor by tensor, the quality each is expected to lose, and the export edge."""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

from edgekit.converters.formats import Edge, Format, Quant
from edgekit.converters.layouts import WeightLayout
from edgekit.converters.openvino.edges import EDGES
from edgekit.converters.openvino.export import EXPORTABLE
from edgekit.converters.openvino.layout import openvino_layout

from edgekit.modelspec import ModelSpec

_TABLE = "table (SmolLM2-135M)"  # benchmarks/quality_table.py, as for the other formats

QUANTS: dict[str, Quant] = {
    q.name: q
    for q in (
        Quant(
            name="F16",
            bits_per_weight=16.0,
            expected_kl=0.0,
            kl_source="lossless against the source",
            note="every float constant stored as f16",
            lossless=True,
        ),
        Quant(
            name="INT8",
            bits_per_weight=8.0,
            expected_kl=0.00544,
            kl_source=_TABLE,
            note="8-bit asymmetric, per output channel",
        ),
        # group-wise 4-bit carries a scale and a zero point per 128 weights
        Quant(
            name="INT4",
            bits_per_weight=4.6,
            expected_kl=0.30513,
            kl_source=_TABLE,
            note="4-bit asymmetric, group-wise: CPU and GPU",
        ),
        Quant(
            name="INT4_SYM",
            bits_per_weight=4.3,
            expected_kl=0.69138,
            kl_source=_TABLE,
            note="4-bit symmetric, per channel: what NPUs run",
        ),
    )
}


class OpenVinoFormat(Format):
    """An OpenVINO IR folder with its tokenizer models, loaded by openvino-genai."""

    name: ClassVar[str] = "openvino"
    display: ClassVar[str] = "OpenVINO"
    entry: ClassVar[str] = ""  # the variant folder itself
    default_quant: ClassVar[str] = "INT4"
    quants: ClassVar[Mapping[str, Quant]] = QUANTS

    def layout(self, spec: ModelSpec, quant: str, *, group_size: int | None = None) -> WeightLayout:
        return openvino_layout(spec, self.require_quant(quant).name, group_size=group_size)

    def cannot_build(self, spec: ModelSpec) -> str:
        if spec.family not in EXPORTABLE:
            return f"edgekit's OpenVINO export does not support {spec.family} yet"
        return ""

    def edges(self) -> tuple[Edge, ...]:
        return EDGES
