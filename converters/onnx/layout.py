"""What the onnxruntime-genai model builder writes per tensor, as edgekit builds ONNX
variants for the CPU execution provider.

The rules were read off built models (the initializers of model.onnx and their external
data lengths; tests/test_onnx_convert.py checks them against real builds, family by
family):

- every matrix becomes one ``MatMul`` (named ``model.layers.N.attn.qkv_proj.MatMul``,
  ``...mlp.down_proj.MatMul``, ``lm_head.MatMul``): Q, K and V are fused into one
  ``qkv_proj``, Phi-3's fused ``gate_up_proj`` is split into ``gate_proj`` and ``up_proj``.
  FP32 stores it as f32; INT4 / INT8 as MatMulNBits: ``N`` output rows of
  ``ceil(K / block)`` blocks, each block packed (``block`` x bits / 8 bytes, padded to a
  whole block) with one f32 scale, symmetric (no zero points);
- the embedding stays f32 (``Gather``), except when the model ties it to the output
  projection: FP32 then reuses the f32 ``lm_head`` matrix (Transpose + Gather) and INT4
  its 4-bit blocks (GatherBlockQuantized); INT8 writes an f32 embedding beside the 8-bit
  ``lm_head`` (GatherBlockQuantized takes 4 bits only);
- norms and biases stay f32 (the CPU model's I/O type);
- RoPE caches are constants of the graph: ``cos_cache`` and ``sin_cache``,
  ``max_position_embeddings`` x head_dim / 2 f32 each (Gemma 3: a local and a global
  pair).
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

from edgekit.errors import UnsupportedConversionError
from edgekit.modelspec import ModelSpec, TensorInfo

BLOCK_SIZES = (16, 32, 64, 128, 256)  # what the builder's block_size accepts
DEFAULT_BLOCK = 32  # the builder's default
BITS = {"FP32": 32, "INT8": 8, "INT4": 4}
SCALE_BYTES = 4  # f32 scales: the CPU model's I/O type
_GEMMA3_GLOBAL_EVERY = 6  # Gemma 3's sliding-window pattern: layers 6, 12, ... are global

# HF tensor role -> (the builder's MatMul name inside a layer, its role in the layout)
_MATMULS: dict[str, tuple[str, Role]] = {
    "attn_q": ("attn.qkv_proj", "attn_qkv"),
    "attn_k": ("attn.qkv_proj", "attn_qkv"),
    "attn_v": ("attn.qkv_proj", "attn_qkv"),
    "attn_qkv": ("attn.qkv_proj", "attn_qkv"),
    "attn_output": ("attn.o_proj", "attn_output"),
    "ffn_gate": ("mlp.gate_proj", "ffn_gate"),
    "ffn_up": ("mlp.up_proj", "ffn_up"),
    "ffn_down": ("mlp.down_proj", "ffn_down"),
}


def check_block_size(block: int) -> int:
    """``block`` when the builder takes it.

    Raises:
        UnsupportedConversionError: any other size (checked before anything is written).
    """
    if isinstance(block, bool) or not isinstance(block, int) or block not in BLOCK_SIZES:
        raise UnsupportedConversionError(
            f"group_size={block!r} is not a block size the onnxruntime-genai builder writes",
            hint=f"use one of {', '.join(map(str, BLOCK_SIZES))}",
        )
    return block


def matmul_nbytes(n: int, k: int, bits: int, block: int) -> tuple[int, str]:
    """Bytes of a K x N matrix as the builder stores it, and its storage label."""
    if bits >= 32:
        return n * k * 4, "F32"
    blocks = -(-k // block)  # the last block is padded to a whole one
    return n * blocks * (block * bits // 8 + SCALE_BYTES), f"INT{bits}/g{block}"


def onnx_layout(spec: ModelSpec, quant: str, *, block_size: int | None = None) -> WeightLayout:
    """``spec`` as the builder writes it in ``quant`` (FP32, INT8 or INT4) with blocks of
    ``block_size`` (default 32; unused by FP32).

    Raises:
        UnsupportedConversionError: an unknown quantization or block size.
    """
    name = quant.upper()
    bits = BITS.get(name)
    if bits is None:
        raise UnsupportedConversionError(
            f"{quant!r} is not an ONNX quantization edgekit builds", hint="use INT4, INT8 or FP32"
        )
    block = check_block_size(block_size if block_size is not None else DEFAULT_BLOCK)
    # name -> (role, rows (N), columns (K)); fused projections add up their rows
    matrices: dict[str, tuple[Role, int, int]] = {}
    out: list[TensorLayout] = []
    tied = spec.tied_embeddings
    for t in spec.tensors:
        role = tensor_role(t)
        if role == "vector":
            out.append(_float(t, role))
        elif role == "token_embd":
            if tied and bits != 8:  # shared with lm_head: sized there
                matrices["lm_head.MatMul"] = ("token_embd", t.shape[0], t.shape[1])
            else:
                out.append(_float(t, role))
                if tied:  # INT8: an f32 embedding and a separate 8-bit lm_head
                    matrices["lm_head.MatMul"] = ("output", t.shape[0], t.shape[1])
        elif role == "output":
            matrices["lm_head.MatMul"] = ("output", t.shape[0], t.shape[1])
        else:
            _add_matrix(matrices, t, role)
    for mat, (role, n, k) in matrices.items():
        size, storage = matmul_nbytes(n, k, bits, block)
        out.append(TensorLayout(name=mat, role=role, shape=(n, k), storage=storage, nbytes=size))
    out.extend(_rope_caches(spec, pruned=bits < 32))
    return WeightLayout(format=name, tensors=tuple(out), tied_embeddings=tied and bits != 8)


def _float(t: TensorInfo, role: Role) -> TensorLayout:
    return TensorLayout(
        name=t.name, role=role, shape=t.shape, storage="F32", nbytes=numel(t.shape) * 4
    )


def _add_matrix(matrices: dict[str, tuple[Role, int, int]], t: TensorInfo, role: Role) -> None:
    layer = tensor_layer(t.name)
    where = _MATMULS.get(role)
    if layer is None or where is None:
        raise UnsupportedConversionError(
            f"{t.name}: a matrix the ONNX layout does not place",
            hint="this family's tensors are not ones the onnxruntime-genai builder writes",
        )
    rows, cols = numel(t.shape[:-1]), t.shape[-1]
    if "gate_up_proj" in t.name:  # Phi-3: the builder splits it into gate and up
        halves: tuple[tuple[str, Role], ...] = (("gate_proj", "ffn_gate"), ("up_proj", "ffn_up"))
        for part, part_role in halves:
            matrices[f"model.layers.{layer}.mlp.{part}.MatMul"] = (part_role, rows // 2, cols)
        return
    mat, mat_role = where
    key = f"model.layers.{layer}.{mat}.MatMul"
    _, before, _ = matrices.get(key, (mat_role, 0, cols))
    matrices[key] = (mat_role, before + rows, cols)


def _rope_caches(spec: ModelSpec, *, pruned: bool) -> list[TensorLayout]:
    """The cos/sin caches. Gemma 3 has a local pair (sliding layers) and a global one
    (every 6th layer is global, as in every Gemma 3 checkpoint). The quantizer's pass
    (``pruned``: INT8, INT4) drops an initializer no node reads, so a Gemma 3 of under 6
    layers keeps its local pair only there; FP32 keeps both."""
    shape = (spec.context_length, spec.head_dim // 2)
    if spec.family == "gemma3":
        both = not pruned or spec.layers >= _GEMMA3_GLOBAL_EVERY
        suffixes = ("_local", "_global") if both else ("_local",)
    else:
        suffixes = ("",)
    return [
        TensorLayout(
            name=f"{kind}_cache{suffix}",
            role="other",
            shape=shape,
            storage="F32",
            nbytes=numel(shape) * 4,
        )
        for suffix in suffixes
        for kind in ("cos", "sin")
    ]
