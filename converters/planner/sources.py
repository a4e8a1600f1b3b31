"""An already-quantized source: what it stores, and what planning from it means.

From a quantized GGUF every format planned stacks on, or cannot undo, the source's
quantization: quality figures become losses against that file, a format with more bits
recovers nothing and only costs memory, and the source's own type kept as it is loses
nothing more.
"""

from __future__ import annotations

from dataclasses import dataclass

from edgekit.converters.layouts import WeightLayout, numel
from edgekit.targets.contract import Target

from edgekit.devices import Accelerator, DeviceProfile
from edgekit.modelspec import ModelSpec

FLOAT_TYPES = ("F32", "F16", "BF16")


@dataclass(frozen=True, kw_only=True)
class SourceQuantization:
    """An already-quantized source: what its file type says and what its matrices
    really store."""

    format: str  # the source's format ("gguf")
    file_type: str
    bits_per_weight: float  # over the matrices (norms and biases excluded)
    tensor_types: dict[str, str]  # tensor name -> storage type


@dataclass(frozen=True, kw_only=True)
class FromSource:
    """A candidate's quality judged against an already-quantized source."""

    kl: float | None
    source: str  # where the figure comes from
    requantizes_up: bool
    note: str


def _bits_per_weight(matrices: list[tuple[tuple[int, ...], int]]) -> float:
    weights = sum(numel(shape) for shape, _ in matrices)
    return 8.0 * sum(nbytes for _, nbytes in matrices) / max(weights, 1)


def source_quantization(spec: ModelSpec) -> SourceQuantization | None:
    """The quantization an already-quantized GGUF carries (None for float sources): any
    matrix stored in a block type means every format planned from it stacks on, or
    cannot undo, that quantization."""
    if spec.format != "gguf":  # the one quantized source kind edgekit reads
        return None
    matrices = [t for t in spec.tensors if len(t.shape) >= 2]
    if not any(t.dtype not in FLOAT_TYPES for t in matrices):
        return None
    counts: dict[str, int] = {}
    for t in matrices:
        counts[t.dtype] = counts.get(t.dtype, 0) + t.nbytes
    return SourceQuantization(
        format=spec.format,
        file_type=spec.file_type or max(counts, key=lambda k: counts[k]),
        bits_per_weight=_bits_per_weight([(t.shape, t.nbytes) for t in matrices]),
        tensor_types={t.name: t.dtype for t in spec.tensors},
    )


def formats_for(
    target: type[Target],
    profile: DeviceProfile,
    accelerator: Accelerator,
    source: SourceQuantization | None,
) -> tuple[str, ...]:
    """The formats planned for a target on one unit of ``profile``, most bits first (the
    target's ``unit_formats``: what that chip runs); from an already-quantized source of
    the target's own format, the source's own quantization too (kept as it is, it loses
    nothing more)."""
    formats = target.unit_formats(profile, accelerator)
    if source is None or source.format != target.format.name:
        return formats
    own = target.format.quant(source.file_type)
    if own is None or own.lossless or own.name in formats:
        return formats
    bits = {name: q.bits_per_weight for name, q in target.format.quants.items()}
    return tuple(sorted((*formats, own.name), key=lambda f: -bits.get(f, 0.0)))


def source_notes(source: SourceQuantization | None) -> list[str]:
    if source is None:
        return []
    return [
        f"the source is already {source.file_type} ({source.bits_per_weight:.1f} bits per "
        "weight): quality figures are losses against that file, not against the original "
        f"model. Formats that store more bits recover nothing of what {source.file_type} "
        "lost and only cost memory: within a quality tier they rank after those that do "
        "not. Quantize from the F16/BF16/F32 original when you have it"
    ]


def _copies_source(layout: WeightLayout, source: SourceQuantization, target: type[Target]) -> bool:
    """A format's requantizer copies a tensor that already has the type it would choose
    (``Format.requantizer``): when that holds for every tensor of a source already in the
    format, the "conversion" is the source file itself."""
    fmt = target.format
    return (
        bool(fmt.requantizer)
        and source.format == fmt.name
        and all(source.tensor_types.get(t.name) == t.storage for t in layout.tensors)
    )


def from_quantized_source(
    layout: WeightLayout,
    source: SourceQuantization,
    target: type[Target],
    kl: float | None,
    kl_source: str,
) -> FromSource:
    """The quality of ``layout`` built from an already-quantized source. Kept as it is,
    the source loses nothing more; any other format is judged against the source file,
    and one with more bits than the source is marked: it recovers nothing of what the
    source's quantization lost."""
    name = source.file_type
    if _copies_source(layout, source, target):
        copies = f"{target.format.requantizer} copies every tensor"
        return FromSource(
            kl=0.0, source=f"the {name} source as it is ({copies})", requantizes_up=False, note=""
        )
    where = (
        f"lossless against the {name} source (not the original model)"
        if kl == 0.0
        else f"{kl_source}; against the {name} source, not the original model"
    )
    bits = _bits_per_weight([(t.shape, t.nbytes) for t in layout.tensors if t.role != "vector"])
    if bits <= source.bits_per_weight * 1.01:
        return FromSource(kl=kl, source=where, requantizes_up=False, note="")
    note = (
        f"requantizes up: {bits:.1f} bits per weight from a {source.bits_per_weight:.1f}-bit "
        f"{name} source, recovering nothing of what {name} lost"
    )
    return FromSource(kl=kl, source=where, requantizes_up=True, note=note)
