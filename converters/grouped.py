"""Formats edgekit sizes and predicts but does not build yet: group-wise integer weights
on every matrix, with quality taken by analogy from the closest measured format.

A package for such a format (``edgekit.converters.onnx``, ``.mlx``, ``.tensorrt``)
declares its schemes and analogies; building it later means adding its edges.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar

from edgekit.converters.formats import Format, Quant
from edgekit.converters.layouts import FP16, IntScheme, WeightLayout, grouped_layout

from edgekit.modelspec import ModelSpec


@dataclass(frozen=True, kw_only=True)
class GroupedQuant:
    """One quantization as a scheme for every matrix, with overrides for the embedding
    and the output projection (None: the same as the rest)."""

    scheme: IntScheme
    embeddings: IntScheme | None = None
    output: IntScheme | None = None


def nominal_bits(scheme: IntScheme) -> float:
    """Bits per weight of ``scheme`` on a long row: the weights, plus the scale, bias and
    zero point of each group (per channel: those are negligible)."""
    if scheme.bits >= 16 or scheme.group <= 0:
        return float(scheme.bits)
    extra = (scheme.scale_bytes + scheme.bias_bytes) * 8 + (scheme.bits if scheme.zero_point else 0)
    return scheme.bits + extra / scheme.group


def lossless(name: str) -> Quant:
    return Quant(
        name=name,
        bits_per_weight=float(FP16.bits),
        expected_kl=0.0,
        kl_source="lossless against the source",
        lossless=True,
    )


def by_analogy(name: str, scheme: IntScheme, analog_format: Format, analog: str) -> Quant:
    """A quantization not measured yet: its expected loss is ``analog_format``'s
    ``analog``, the closest measured one."""
    measured = analog_format.require_quant(analog)
    return Quant(
        name=name,
        bits_per_weight=round(nominal_bits(scheme), 3),
        expected_kl=measured.expected_kl,
        kl_source=f"by analogy with {analog_format.display} {measured.name} (no measurement)",
    )


class GroupedFormat(Format):
    """A format sized by group-wise integer schemes, with no conversion edges yet."""

    buildable: ClassVar[bool] = False
    # upper-case quant name -> its scheme (the same keys as ``quants``)
    schemes: ClassVar[Mapping[str, GroupedQuant]]

    def layout(self, spec: ModelSpec, quant: str, *, group_size: int | None = None) -> WeightLayout:
        """``spec`` under the quantization's scheme. ``group_size`` overrides a 4-bit
        scheme's group (as a recipe would)."""
        q = self.require_quant(quant)
        chosen = self.schemes[q.name.upper()]
        scheme = chosen.scheme
        if group_size and scheme.bits == 4:
            scheme = IntScheme(
                bits=4,
                group=group_size,
                zero_point=scheme.zero_point,
                scale_bytes=scheme.scale_bytes,
                bias_bytes=scheme.bias_bytes,
            )
        return grouped_layout(
            spec, fmt=q.name, scheme=scheme, embeddings=chosen.embeddings, output=chosen.output
        )
