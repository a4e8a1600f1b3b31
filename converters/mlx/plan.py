"""A recipe in edgekit's vocabulary as one MLX build: the bits of every module, the float
type, the KV cache it records and the calibration it runs. Every refusal is here, so the
edge's check makes it before anything is written.

    weights      the quant (bulk bits; MIXED_* add mlx-lm's mixed rule)
    embeddings   pin embed_tokens: F16/F32/BF16 (kept in float), 8BIT, 6BIT or 4BIT
    output       pin lm_head likewise (a tied embedding is one tensor: one pin)
    group_size   32, 64 or 128
    ratio        share of layers at the low bits (NNCF's meaning), the rest at 8 bits
    calibration  a local text file: data-aware 4-bit (AWQ through mlx-lm), 4BIT only
    kv_cache     f16 (unquantized), q8_0 or q4_0 (mlx-lm's QuantizedKVCache, group 64)
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass, replace

from edgekit.converters.mlx.layout import (
    FLOAT_QUANTS,
    QUANT_BITS,
    BitPlan,
    default_plan,
    eight_bit_layers,
    float_dtype,
)
from edgekit.converters.recipe import Recipe, set_options

from edgekit.errors import UnsupportedConversionError
from edgekit.modelspec import ModelSpec
from edgekit.safe_files import kind_of

# the recipe's KV-cache names -> mlx-lm's kv_bits (None: the unquantized cache)
KV_BITS: dict[str, int | None] = {"f16": None, "q8_0": 8, "q4_0": 4}
KV_GROUP = 64
PIN_BITS = {"F16": 0, "F32": 0, "BF16": 0, "8BIT": 8, "6BIT": 6, "4BIT": 4}
# the families mlx-lm's AWQ has a layer map for (mlx_lm.quant.awq.AWQ_MODEL_CONFIGS)
AWQ_FAMILIES = ("llama", "mistral", "qwen2", "qwen3", "gemma3")
MAX_CALIBRATION = 16 << 20  # AWQ reads 2,048 tokens of it: 16 MiB is far more than enough


@dataclass(frozen=True, kw_only=True)
class MlxBuild:
    plan: BitPlan
    dtype: str  # mlx's name of the variant's float type: "float32", "bfloat16"...
    kv_cache: str
    kv_bits: int | None
    calibration: str | None
    warnings: tuple[str, ...]


def _pin(what: str, value: str | None) -> int | None:
    if value is None:
        return None
    bits = PIN_BITS.get(value.upper())
    if bits is None:
        raise UnsupportedConversionError(
            f"recipe {what}={value} is not an MLX precision",
            hint=f"use one of {', '.join(PIN_BITS)} (F16/F32/BF16: not quantized)",
        )
    return bits


def _check_device_options(name: str, recipe: Recipe) -> None:
    device = set_options(("soc", recipe.soc), ("part_gib", recipe.part_gib))
    if device:
        raise UnsupportedConversionError(
            f"MLX {name} has no device-specific build: {', '.join(device)} does not apply",
            hint="drop them: soc and part_gib are for Qualcomm HTP builds",
        )


def _kv_bits(recipe: Recipe, spec: ModelSpec) -> int | None:
    if recipe.kv_cache not in KV_BITS:
        raise UnsupportedConversionError(
            f"KV-cache type {recipe.kv_cache!r} has no mlx-lm equivalent",
            hint="use f16 (unquantized), q8_0 or q4_0 (mlx-lm's quantized KV cache)",
        )
    bits = KV_BITS[recipe.kv_cache]
    # the target refuses such a cache at load (targets/mlx_runtime.py): a bundle that
    # records one would not open with its own settings
    if bits is not None and spec.head_dim % KV_GROUP:
        raise UnsupportedConversionError(
            f"kv_cache={recipe.kv_cache}: mlx-lm quantizes the KV cache in groups of "
            f"{KV_GROUP} values of a head, and this model's heads have {spec.head_dim}",
            hint="use kv_cache=f16",
        )
    # of the families edgekit builds, mlx-lm gives only Gemma 3's windowed layers a
    # rotating cache (its Mistral ignores the window)
    if bits is not None and spec.family == "gemma3":
        raise UnsupportedConversionError(
            f"kv_cache={recipe.kv_cache}: mlx-lm 0.31 cannot quantize the rotating cache "
            "of Gemma 3's sliding-window layers",
            hint="use kv_cache=f16",
        )
    return bits


def _check_calibration(name: str, recipe: Recipe, spec: ModelSpec, plan: BitPlan) -> None:
    if recipe.calibration is None:
        return
    if name != "4BIT":
        raise UnsupportedConversionError(
            f"calibration (data-aware AWQ) is for MLX 4BIT, not {name}",
            hint="build 4BIT with calibration=..., or drop calibration",
        )
    if spec.family not in AWQ_FAMILIES:
        raise UnsupportedConversionError(
            f"mlx-lm's AWQ has no layer map for {spec.family}",
            hint="drop calibration: plain 4BIT builds every family",
        )
    unsupported = set_options(("ratio", recipe.ratio))
    if 0 in (plan.embeddings, plan.output):
        unsupported.append("a float embeddings/output pin")
    if plan.embeddings is not None and plan.output is not None and plan.embeddings != plan.output:
        unsupported.append("different embeddings and output pins")
    if unsupported:
        raise UnsupportedConversionError(
            f"mlx-lm's AWQ cannot express {', '.join(unsupported)}",
            hint="AWQ quantizes every block at 4 bits and the embedding and lm_head at one "
            "integer precision: drop those options, or drop calibration",
        )
    _check_calibration_file(recipe.calibration)
    from edgekit.converters.openvino.export import calibration_texts

    try:  # the file is there, with text (read with OpenVINO's bounds)
        calibration_texts(recipe.calibration)
    except UnsupportedConversionError as exc:
        raise UnsupportedConversionError(
            exc.message, hint=exc.hint or "give calibration= a local UTF-8 text file"
        ) from exc


def _check_calibration_file(path: str) -> None:
    """A regular file (a link to one is the user's own choice) of 1 byte to 16 MiB, said
    so before OpenVINO's reader calls anything else missing or reads it whole."""
    hint = "give calibration= a local UTF-8 text file of 1 byte to 16 MiB"
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise UnsupportedConversionError(
            f"calibration text {path} does not exist", hint=hint
        ) from None
    except OSError as exc:
        raise UnsupportedConversionError(
            f"calibration text {path} cannot be read ({exc.strerror})", hint=hint
        ) from exc
    if not stat.S_ISREG(st.st_mode):
        raise UnsupportedConversionError(
            f"calibration text {path} is {kind_of(st.st_mode)}, not a regular file", hint=hint
        )
    if not 0 < st.st_size <= MAX_CALIBRATION:
        raise UnsupportedConversionError(
            f"calibration text {path} is {st.st_size:,} bytes", hint=hint
        )


def mlx_build(quant: str | None, recipe: Recipe | None, spec: ModelSpec) -> MlxBuild:
    """``quant`` (default 4BIT) and ``recipe`` as one MLX build of ``spec``.

    Raises:
        UnsupportedConversionError: an option MLX cannot express (the hint says what it can).
    """
    name = (quant or "4BIT").upper()
    recipe = recipe or Recipe(weights=name)
    _check_device_options(name, recipe)
    plan = default_plan(spec, name, recipe.group_size)
    warnings: list[str] = []
    embeddings, output = _pin("embeddings", recipe.embeddings), _pin("output", recipe.output)
    if spec.tied_embeddings and None not in (embeddings, output) and embeddings != output:
        raise UnsupportedConversionError(
            f"{spec.path}: the embedding is tied to the output (one tensor), but the recipe "
            f"pins embeddings={recipe.embeddings} and output={recipe.output}",
            hint="give one of them, or the same precision for both",
        )
    if recipe.ratio is not None and not 0.0 < recipe.ratio <= 1.0:
        raise UnsupportedConversionError(
            f"recipe ratio={recipe.ratio} is outside (0, 1]",
            hint="ratio is the share of layers at the low precision: 0.8 keeps a fifth at 8 bits",
        )
    if name in FLOAT_QUANTS:
        unused = set_options(
            ("embeddings", recipe.embeddings),
            ("output", recipe.output),
            ("group_size", recipe.group_size),
            ("ratio", recipe.ratio),
        )
        if unused:
            warnings.append(f"MLX {name} quantizes nothing: {', '.join(unused)} unused")
        if recipe.calibration:
            raise UnsupportedConversionError(
                f"calibration is for quantized builds, not MLX {name}",
                hint="drop calibration, or build 4BIT",
            )
    else:
        if recipe.ratio is not None and QUANT_BITS[name][0] >= 8:
            warnings.append(f"MLX {name} has no lower precision: ratio={recipe.ratio} unused")
        layers = eight_bit_layers(spec.layers, recipe.ratio if QUANT_BITS[name][0] < 8 else None)
        plan = replace(plan, embeddings=embeddings, output=output, eight_bit_layers=layers)
    _check_calibration(name, recipe, spec, plan)
    return MlxBuild(
        plan=plan,
        dtype=float_dtype(name, spec.dtype),
        kv_cache=recipe.kv_cache,
        kv_bits=_kv_bits(recipe, spec),
        calibration=recipe.calibration,
        warnings=tuple(warnings),
    )
