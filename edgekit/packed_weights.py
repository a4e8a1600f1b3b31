"""Group-wise packed weights in a Hugging Face-style folder, as mlx-lm writes them: a
quantized module's ``weight`` is uint32 words holding ``bits``-bit integers (``in * bits /
32`` columns), beside a ``scales`` and a ``biases`` tensor of one value per group of
``group_size`` inputs. config.json's ``quantization`` block gives the default bits and
group, and per module (``"model.layers.0.mlp.down_proj": {"bits": 6, "group_size": 64}``,
or ``false`` for a module left in float) what differs.

Inspection reads this to check such a folder's embedding against the config and to count
its parameters as the model has them, not as words: a packed weight's logical shape is its
scales' rows times ``scales columns x group``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from edgekit.errors import ModelFormatError
from edgekit.modelspec import TensorInfo

WORD_BITS = 32
BITS = frozenset({2, 3, 4, 5, 6, 8})  # what mlx's affine quantization packs
GROUPS = frozenset({32, 64, 128})
_HINT = "the quantization block is not a group-wise packing edgekit reads: re-convert the model"

Scheme = tuple[int, int]  # (bits, group_size)


@dataclass(frozen=True, kw_only=True)
class Packing:
    """A folder's packing: the default scheme and each module's own (None: float)."""

    default: Scheme
    modules: Mapping[str, Scheme | None] = field(default_factory=dict)

    def of(self, module: str) -> Scheme | None:
        """The scheme of ``module`` (its tensors' names without ``.weight``)."""
        return self.modules.get(module, self.default)


def packing_from_config(config: Mapping[str, Any], where: str) -> Packing | None:
    """The packing config.json records, or None when it records none (a float folder, or
    another tool's ``quantization_config`` without mlx's ``quantization`` block).

    Raises:
        ModelFormatError: the block is there but malformed (bits or group size mlx does
            not pack, a per-module entry that is neither a scheme nor false).
    """
    block = config.get("quantization")
    if block is None:
        return None
    if not isinstance(block, dict):
        raise ModelFormatError(f"{where}: quantization is not an object", hint=_HINT)
    default = _scheme(block, f"{where}: quantization")
    modules: dict[str, Scheme | None] = {}
    for key, value in block.items():
        if key in ("bits", "group_size", "mode"):
            continue
        if value is False:
            modules[key] = None
        elif isinstance(value, dict):
            modules[key] = _scheme(value, f"{where}: quantization[{key!r}]")
        else:
            raise ModelFormatError(
                f"{where}: quantization[{key!r}] is neither a scheme nor false", hint=_HINT
            )
    return Packing(default=default, modules=modules)


def _scheme(block: Mapping[str, Any], where: str) -> Scheme:
    bits, group = block.get("bits"), block.get("group_size")
    mode = block.get("mode", "affine")
    if mode != "affine":
        raise ModelFormatError(f"{where}: mode {str(mode)[:40]!r} is not affine", hint=_HINT)
    if type(bits) is not int or bits not in BITS:
        raise ModelFormatError(f"{where}: bits must be one of {sorted(BITS)}", hint=_HINT)
    if type(group) is not int or group not in GROUPS:
        raise ModelFormatError(f"{where}: group_size must be one of {sorted(GROUPS)}", hint=_HINT)
    return bits, group


def check_packed(tensors: tuple[TensorInfo, ...], packing: Packing, where: str) -> None:
    """Every packed weight (one with ``scales`` beside it) must be what its module's
    scheme makes of it: uint32 words, ``in x bits / 32`` columns, and ``in / group`` scale
    and bias columns of the same rows; every module the block names must be in the files.

    Raises:
        ModelFormatError: a module the block does not quantize holds packed words, or the
            shapes disagree with its bits and group, or the block names a missing module.
    """
    by_name = {t.name: t for t in tensors}
    modules = {n.rpartition(".")[0] for n in by_name}
    for name in packing.modules:
        if name not in modules:
            raise ModelFormatError(
                f"{where}: the quantization block names {name[:90]!r}, which the weights "
                "do not hold",
                hint=_HINT,
            )
    for t in tensors:
        base, _, leaf = t.name.rpartition(".")
        scales = by_name.get(f"{base}.scales")
        if leaf != "weight" or scales is None:
            continue
        scheme = packing.of(base)
        biases = by_name.get(f"{base}.biases")
        if scheme is None or not _fits(t, scales, biases, scheme):
            what = (
                "is not quantized" if scheme is None else f"has {scheme[0]} bits, group {scheme[1]}"
            )
            raise ModelFormatError(
                f"{where}: {base[:90]} {what} by the quantization block, but its weight is "
                f"stored as {t.dtype} {list(t.shape)} with scales {list(scales.shape)}",
                hint=_HINT,
            )


def _fits(
    weight: TensorInfo, scales: TensorInfo, biases: TensorInfo | None, scheme: Scheme
) -> bool:
    bits, group = scheme
    if weight.dtype != "U32" or not weight.shape or len(weight.shape) != len(scales.shape):
        return False
    if biases is None or biases.shape != scales.shape:
        return False
    words, columns = weight.shape[-1], scales.shape[-1]
    return weight.shape[:-1] == scales.shape[:-1] and words * WORD_BITS == columns * group * bits


def packed_columns(columns: int, scheme: Scheme | None) -> int:
    """How many columns a weight of ``columns`` inputs is stored in under ``scheme``."""
    if scheme is None:
        return columns
    return columns * scheme[0] // WORD_BITS


def logical_parameters(tensors: tuple[TensorInfo, ...], packing: Packing, *, skip: str = "") -> int:
    """The parameters of ``tensors`` as the model has them: a packed weight counts its
    logical shape (rows x words x 32 / its module's bits), its scales and biases count
    nothing; ``skip`` names a tensor not to count (a tied output projection)."""
    names = {t.name for t in tensors}
    total = 0
    for t in tensors:
        if t.name == skip:
            continue
        base, _, leaf = t.name.rpartition(".")
        packed = f"{base}.scales" in names
        if leaf in ("scales", "biases") and f"{base}.weight" in names:
            continue  # part of the packed weight
        scheme = packing.of(base) if packed and leaf == "weight" else None
        if scheme is not None and t.shape:
            total += t.numel * WORD_BITS // scheme[0]
            continue
        total += t.numel
    return total
