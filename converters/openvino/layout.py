"""What NNCF's weight compression stores per tensor, as edgekit exports OpenVINO IR.

The rules were read off NNCF-compressed models (the Const sizes in the IR);
tests/test_layouts.py checks them against real exports.
"""

from __future__ import annotations

from edgekit.converters.layouts import (
    INT8_CHANNEL_ASYM,
    IntScheme,
    TensorLayout,
    WeightLayout,
    grouped_layout,
    numel,
    tensor_role,
)

from edgekit.errors import UnsupportedConversionError
from edgekit.modelspec import ModelSpec

# OpenVINO formats as edgekit exports them (export.py).
OPENVINO_SCHEMES: dict[str, IntScheme] = {
    "F16": IntScheme(bits=16, group=-1, zero_point=False),
    "INT8": INT8_CHANNEL_ASYM,
    "INT4": IntScheme(bits=4, group=128, zero_point=True),
    "INT4_SYM": IntScheme(bits=4, group=-1, zero_point=False),
}


def openvino_layout(spec: ModelSpec, fmt: str, *, group_size: int | None = None) -> WeightLayout:
    """``spec`` compressed by NNCF as edgekit exports it: 4-bit formats keep the embedding
    (and an untied lm_head) at INT8 per channel, NNCF's backup precision. "F16" stores
    every float constant as f16 (openvino's compress_to_fp16, norms included), whatever
    the source's float type: 2 bytes per weight.

    Raises:
        UnsupportedConversionError: ``fmt`` is not an OpenVINO format.
    """
    scheme = OPENVINO_SCHEMES.get(fmt.upper())
    if scheme is None:
        raise UnsupportedConversionError(
            f"{fmt!r} is not an OpenVINO format",
            hint=f"choose one of {', '.join(OPENVINO_SCHEMES)}",
        )
    fmt = fmt.upper()
    if scheme.bits == 16:
        return WeightLayout(
            format=fmt,
            tensors=tuple(
                TensorLayout(
                    name=t.name,
                    role=tensor_role(t),
                    shape=t.shape,
                    storage="F16",
                    nbytes=numel(t.shape) * 2,
                )
                for t in spec.tensors
            ),
            tied_embeddings=spec.tied_embeddings,
        )
    if group_size and scheme.bits == 4:
        scheme = IntScheme(bits=4, group=group_size, zero_point=scheme.zero_point)
    backup = INT8_CHANNEL_ASYM if scheme.bits == 4 else None
    return grouped_layout(spec, fmt=fmt, scheme=scheme, embeddings=backup, output=backup)
