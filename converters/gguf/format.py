"""GGUF as a bundle format: the file types edgekit writes, what each weighs tensor by
tensor, the quality each is expected to lose, and the conversions that build one."""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

from edgekit.converters.formats import Edge, Format, Quant
from edgekit.converters.gguf.edges import EDGES
from edgekit.converters.gguf.layout import file_layout, gguf_layout
from edgekit.converters.gguf.table import FLOAT_FORMATS, GGUF_FORMATS, KL_SOURCE, MEASURED_KL
from edgekit.converters.layouts import WeightLayout

from edgekit.modelspec import ModelSpec


def _quants() -> dict[str, Quant]:
    quants: dict[str, Quant] = {}
    for t in GGUF_FORMATS.values():
        lossless = t.name in FLOAT_FORMATS
        kl = 0.0 if lossless else MEASURED_KL.get(t.name)
        source = "lossless against the source" if lossless else KL_SOURCE
        quants[t.name] = Quant(
            name=t.name,
            bits_per_weight=t.bits_per_weight,
            expected_kl=kl,
            kl_source=source if kl is not None else "no measurement",
            note=t.note,
            lossless=lossless,
        )
    return quants


class GgufFormat(Format):
    """A single GGUF file, loaded by llama.cpp."""

    name: ClassVar[str] = "gguf"
    display: ClassVar[str] = "GGUF"
    entry: ClassVar[str] = "model.gguf"
    default_quant: ClassVar[str] = "F16"
    pack_quant: ClassVar[str] = "Q4_K_M"  # a bundle is for a device: 4-bit, the common pick
    quants: ClassVar[Mapping[str, Quant]] = _quants()
    requantizer: ClassVar[str] = "llama.cpp"  # llama-quant.cpp: quantize = cur_type != new_type

    def layout(self, spec: ModelSpec, quant: str, *, group_size: int | None = None) -> WeightLayout:
        """llama.cpp's type choice for every tensor. ``group_size`` does not apply: GGUF
        block sizes are fixed by the type."""
        name = self.require_quant(quant).name
        # F16 asked of a BF16 checkpoint: the same bytes, stored as the source's BF16.
        if name == "F16" and spec.format != "gguf" and spec.dtype == "BF16":
            return gguf_layout(spec, "BF16")
        return gguf_layout(spec, name)

    def built_layout(self, spec: ModelSpec, quant: str) -> WeightLayout:
        """The GGUF file's own tensors (``spec`` inspected from the built file)."""
        return file_layout(spec, self.require_quant(quant).name)

    def edges(self) -> tuple[Edge, ...]:
        return EDGES
