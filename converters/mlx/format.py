"""MLX as a bundle format: the folders mlx-lm loads (config.json, model.safetensors, the
source's tokenizer files, edgekit.json), the quantizations edgekit builds with what each
is expected to lose, the per-tensor layout, and the conversion edge."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

from edgekit.converters.formats import Edge, Format, Quant
from edgekit.converters.layouts import TensorLayout, WeightLayout, tensor_role
from edgekit.converters.mlx.edges import EDGES, cannot_build
from edgekit.converters.mlx.layout import (
    FLOAT_QUANTS,
    default_plan,
    float_dtype,
    plan_layout,
)

from edgekit.errors import EdgekitError
from edgekit.inspection import read_config
from edgekit.modelspec import ModelSpec, TensorInfo
from edgekit.packed_weights import Packing, Scheme, packing_from_config


def _float(name: str, bits: int, note: str) -> Quant:
    return Quant(
        name=name,
        bits_per_weight=float(bits),
        expected_kl=0.0,
        kl_source="lossless against the source",
        note=note,
        lossless=True,
    )


# Measured here (benchmarks/mlx_convert.py --kl): SmolLM2-135M-Instruct from the embedded
# Q4_1 GGUF (dequantized by edgekit: an f32 source, so f32 scales), each quant against the
# F32 variant, mean next-token KL over the first 512 tokens of the shipped text, mlx-lm on
# mlx's CPU build. The tied embedding is quantized with lm_head's bits: most of the 4-bit
# loss (a recipe embeddings=8BIT keeps it at 8).
_MEASURED = "measured (SmolLM2-135M, 512 tokens, against the F32 variant)"


def _measured(name: str, bits: float, kl: float, note: str) -> Quant:
    return Quant(name=name, bits_per_weight=bits, expected_kl=kl, kl_source=_MEASURED, note=note)


def _quants() -> dict[str, Quant]:
    """Bits per weight are nominal for a 16-bit source (a 16-bit scale and bias per group
    of 64: +0.5); an f32 source's scales are f32 (+1.0)."""
    return {
        "F32": _float("F32", 32, "every tensor f32: the parity reference"),
        "F16": _float("F16", 16, "every tensor f16"),
        "BF16": _float("BF16", 16, "every tensor bf16"),
        "8BIT": _measured("8BIT", 8.5, 0.00184, "affine 8-bit, groups of 64 (top-1 0.977)"),
        "6BIT": _measured("6BIT", 6.5, 0.03591, "affine 6-bit, groups of 64 (top-1 0.908)"),
        "4BIT": _measured("4BIT", 4.5, 0.49304, "affine 4-bit, groups of 64 (top-1 0.602)"),
        "MIXED_4_6": _measured("MIXED_4_6", 4.7, 0.3489, f"4-bit, {_MIXED} (top-1 0.668)"),
        "MIXED_3_6": _measured("MIXED_3_6", 3.8, 1.33597, f"3-bit, {_MIXED} (top-1 0.395)"),
    }


_MIXED = "mlx-lm's mixed rule: v_proj/down_proj of sensitive layers and lm_head at 6 bits"


class MlxFormat(Format):
    """An MLX model folder, loaded by mlx-lm (Metal on Apple silicon, the CPU elsewhere)."""

    name: ClassVar[str] = "mlx"
    display: ClassVar[str] = "MLX"
    entry: ClassVar[str] = ""  # the variant folder itself
    default_quant: ClassVar[str] = "4BIT"
    pack_quant: ClassVar[str] = "4BIT"
    quants: ClassVar[Mapping[str, Quant]] = _quants()

    def layout(self, spec: ModelSpec, quant: str, *, group_size: int | None = None) -> WeightLayout:
        """``spec``'s tensors as the converter writes ``quant`` with no recipe pins."""
        name = self.require_quant(quant).name
        plan = default_plan(spec, name, None if name in FLOAT_QUANTS else group_size)
        return plan_layout(spec, plan, float_dtype(name, spec.dtype))

    def built_layout(self, spec: ModelSpec, quant: str) -> WeightLayout:
        """The layout of a built variant: the bits and group of every module as its
        config.json records them, the sizes from its tensor headers (no data read)."""
        name = self.require_quant(quant).name
        try:
            config = read_config(Path(spec.path))
        except EdgekitError:
            return self.layout(spec, name)
        return recorded_layout(spec, name, config.get("quantization"))

    def cannot_build(self, spec: ModelSpec) -> str:
        return cannot_build(spec.family)

    def edges(self) -> tuple[Edge, ...]:
        return EDGES


def _module_quant(path: str, packing: Packing | None, names: set[str]) -> Scheme | None:
    """(bits, group) of the module at ``path`` as the config's packing says (the loader's
    rule: a per-module entry, else the default where its scales were saved)."""
    if packing is None:
        return None
    if path in packing.modules:
        return packing.modules[path]
    return packing.default if f"{path}.scales" in names else None


def recorded_layout(spec: ModelSpec, quant: str, block: Any) -> WeightLayout:
    """Every module of a variant folder's tensors (packed weights with their scales and
    biases, in one entry under the weight's name and logical shape).

    Raises:
        ModelFormatError: ``block`` is malformed (``packing_from_config``: inspection
            reads the block with the same rule, so the two cannot disagree).
    """
    packing = packing_from_config({"quantization": block}, spec.path)
    by_name = {t.name: t for t in spec.tensors}
    out: list[TensorLayout] = []
    for t in spec.tensors:
        if (
            t.name.endswith((".scales", ".biases"))
            and t.name.rpartition(".")[0] + ".weight" in by_name
        ):
            continue
        path = t.name.removesuffix(".weight")
        found = _module_quant(path, packing, set(by_name)) if t.name.endswith(".weight") else None
        if found is None:
            out.append(_entry(t, t.shape, t.dtype, t.nbytes))
            continue
        bits, group = found
        logical = (*t.shape[:-1], t.shape[-1] * 32 // bits)
        extra = sum(
            by_name[f"{path}.{k}"].nbytes for k in ("scales", "biases") if f"{path}.{k}" in by_name
        )
        out.append(_entry(t, logical, f"{bits}BIT/g{group}", t.nbytes + extra))
    return WeightLayout(format=quant, tensors=tuple(out), tied_embeddings=spec.tied_embeddings)


def _entry(t: TensorInfo, shape: tuple[int, ...], storage: str, nbytes: int) -> TensorLayout:
    logical = TensorInfo(name=t.name, shape=shape, dtype=t.dtype, nbytes=nbytes)
    return TensorLayout(
        name=t.name, role=tensor_role(logical), shape=shape, storage=storage, nbytes=nbytes
    )


__all__ = ["MlxFormat", "recorded_layout"]
