"""What a QNN HTP variant (W16A16, W8A16, FP16) holds per tensor, for the planner, and the
per-part size check an HTP build makes before it writes anything.

The rules follow ``htp_build`` (read off built tiny models, tests/test_onnx_htp.py):

- every matrix is the builder's MatMul (Q, K, V fused into ``qkv_proj``, Phi-3's
  ``gate_up_proj`` split): W16A16 / W8A16 store it as uint16 / uint8, one scale and
  zero point per tensor (per-tensor: QNN 2.7.0 rejects per-channel MatMul weights);
  FP16 ships it f32 in the QDQ stage and the HTP holds it at fp16 (the size given here:
  what a part weighs on the device, what ``part_gib`` bounds);
- norm weights and biases: the QDQ quants quantize them like the matrices; FP16 at fp16;
- the embedding runs on the CPU as its own graph and stays f32; a tied embedding is an
  f32 copy of lm_head's matrix there, beside lm_head in the last part;
- RoPE caches: ``max_position_embeddings`` x head_dim / 2 per cos/sin, in every part
  (Gemma 3: a local and a global pair), the QDQ quants as uint16, FP16 at fp16;
- not counted: the per-tensor scales and zero points of activations (a few bytes each,
  under 1% of a tiny model's part).
"""

from __future__ import annotations

from edgekit.converters.layouts import (
    Role,
    TensorLayout,
    WeightLayout,
    numel,
    tensor_layer,
    tensor_role,
)
from edgekit.converters.onnx.layout import _GEMMA3_GLOBAL_EVERY, _add_matrix

from edgekit.errors import UnsupportedConversionError
from edgekit.modelspec import ModelSpec, TensorInfo

GIB = 1 << 30
# bytes per weight as the HTP holds it: (matrices and vectors, RoPE caches)
_BYTES = {"W16A16": (2, 2), "W8A16": (1, 2), "FP16": (2, 2)}
_STORAGE = {"W16A16": "U16", "W8A16": "U8", "FP16": "F16"}
_QDQ = ("W16A16", "W8A16")  # quantized: a scale and zero point per tensor
_QPARAMS = 5  # a per-tensor f32 scale and a uint8 zero point


def htp_layout(spec: ModelSpec, quant: str) -> WeightLayout:
    """``spec`` as an HTP variant in ``quant`` (W16A16, W8A16 or FP16) holds it.

    Raises:
        UnsupportedConversionError: not an HTP quantization, or a matrix the builder does
            not write.
    """
    name = quant.upper()
    if name not in _BYTES:
        raise UnsupportedConversionError(
            f"{quant!r} is not an HTP quantization", hint="use W16A16, W8A16 or FP16"
        )
    out: list[TensorLayout] = []
    matrices: dict[str, tuple[Role, int, int]] = {}
    for t in spec.tensors:
        role = tensor_role(t)
        if role == "vector":
            out.append(_weight(t.name, role, t.shape, name))
        elif role == "token_embd":
            out.append(_f32(t))  # the CPU embeddings graph
            if spec.tied_embeddings:
                matrices["lm_head.MatMul"] = ("output", t.shape[0], t.shape[1])
        elif role == "output":
            matrices["lm_head.MatMul"] = ("output", t.shape[0], t.shape[1])
        else:
            _add_matrix(matrices, t, role)
    for mat, (role, n, k) in matrices.items():
        out.append(_weight(mat, role, (n, k), name))
    out.extend(_rope(spec, name))
    return WeightLayout(format=name, tensors=tuple(out), tied_embeddings=False)


def check_fits(spec: ModelSpec, quant: str, part_gib: float) -> None:
    """Refuse a model one of whose layers (the last one with the final norm and lm_head)
    exceeds ``part_gib`` in ``quant``: no split can fit it (checked before writing; the
    build checks the real graphs again).

    Raises:
        UnsupportedConversionError: it does not fit.
    """
    layout = htp_layout(spec, quant)
    per_layer: dict[int, int] = {}
    shared = tail = 0
    for t in layout.tensors:
        layer = tensor_layer(t.name)
        if t.role == "token_embd":
            continue  # the CPU graph
        if layer is not None:
            per_layer[layer] = per_layer.get(layer, 0) + t.nbytes
        elif t.role == "other":
            shared += t.nbytes  # RoPE caches: in every part
        else:
            tail += t.nbytes  # lm_head, final norm
    if not per_layer:
        return
    last = max(per_layer)
    worst = max(per_layer.values()) + shared
    end = per_layer[last] + shared + tail
    limit = part_gib * GIB
    for size, what in ((worst, "layer"), (end, "last layer with the final norm and lm_head")):
        if size > limit:
            raise UnsupportedConversionError(
                f"one {what} of {spec.name} ({size / GIB:.3f} GiB in {quant}) is bigger "
                f"than part_gib={part_gib:g}",
                hint="raise part_gib (the HTP maps up to 4 GiB per session), or build a "
                "smaller quant",
            )


def _weight(name: str, role: Role, shape: tuple[int, ...], quant: str) -> TensorLayout:
    size = numel(shape) * _BYTES[quant][0] + (_QPARAMS if quant in _QDQ else 0)
    return TensorLayout(name=name, role=role, shape=shape, storage=_STORAGE[quant], nbytes=size)


def _f32(t: TensorInfo) -> TensorLayout:
    return TensorLayout(
        name=t.name, role="token_embd", shape=t.shape, storage="F32", nbytes=numel(t.shape) * 4
    )


def _rope(spec: ModelSpec, quant: str) -> list[TensorLayout]:
    shape = (spec.context_length, spec.head_dim // 2)
    # Gemma 3: a local and a global pair; the static graph drops what no layer reads, so
    # a Gemma 3 of under 6 layers (no global layer) keeps its local pair only
    suffixes: tuple[str, ...] = ("",)
    if spec.family == "gemma3":
        suffixes = ("_local", "_global") if spec.layers >= _GEMMA3_GLOBAL_EVERY else ("_local",)
    return [
        TensorLayout(
            name=f"{kind}_cache{suffix}",
            role="other",
            shape=shape,
            storage="U16" if quant in _QDQ else "F16",
            nbytes=numel(shape) * _BYTES[quant][1],
        )
        for suffix in suffixes
        for kind in ("cos", "sin")
    ]
