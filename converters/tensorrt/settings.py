"""The engine build settings a TensorRT Edge-LLM variant carries (``engine.json``).

The export is portable; the engine is built from it on the device (its GPU, its
TensorRT), so the bundle records what to build: the precision, the batch, the prompt and
generation lengths (their sum is the KV-cache capacity the engine allocates), the
KV-cache type and the chip it is meant for. ``settings_from_recipe`` checks a recipe's
options before anything is written; ``EngineSettings.from_json`` reads a bundle's file
strictly (it is untrusted: any missing, extra, mistyped or out-of-range field refuses).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from edgekit.converters.tensorrt.socs import CHIPS, PRECISIONS, chip

from edgekit.errors import ModelError, ModelFormatError, UnsupportedConversionError

if TYPE_CHECKING:
    from edgekit.converters.recipe import Recipe

    from edgekit.modelspec import ModelSpec

ENGINE_JSON = "engine.json"
SCHEMA = 1
# The Edge-LLM release the export tool environment pins (export-requirements.txt; a test
# checks the two agree): the engine must be built by the same release.
EDGELLM_VERSION = "0.11.0"
KV_CACHE_TYPES = ("fp16",)  # what edgekit's F16 exports run; FP8 needs an FP8 export
# Bounds: a batch beyond 8 is not an edge workload; 32k tokens is the most NVIDIA's
# Jetson examples build (the KV cache of a 32k x 8 engine already outgrows an Orin Nano).
BATCH = (1, 8)
INPUT = (16, 32768)
OUTPUT = (1, 32768)
DEFAULT_INPUT = 2048
DEFAULT_OUTPUT = 512
# recipe kv_cache spellings (edgekit's, llama.cpp's) -> Edge-LLM's
_KV_NAMES = {"f16": "fp16", "fp16": "fp16", "fp8": "fp8", "q8_0": "q8_0"}
_FIELDS = (
    "schema",
    "precision",
    "max_batch_size",
    "max_input_len",
    "max_output_len",
    "max_kv_cache_capacity",
    "kv_cache_type",
    "soc",
    "edgellm_version",
)


@dataclass(frozen=True, kw_only=True)
class EngineSettings:
    precision: str
    max_batch_size: int
    max_input_len: int
    max_output_len: int
    kv_cache_type: str
    soc: str | None
    edgellm_version: str

    @property
    def max_kv_cache_capacity(self) -> int:
        """The tokens the engine's KV cache holds: the longest prompt plus the longest
        generation."""
        return self.max_input_len + self.max_output_len

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "precision": self.precision,
            "max_batch_size": self.max_batch_size,
            "max_input_len": self.max_input_len,
            "max_output_len": self.max_output_len,
            "max_kv_cache_capacity": self.max_kv_cache_capacity,
            "kv_cache_type": self.kv_cache_type,
            "soc": self.soc,
            "edgellm_version": self.edgellm_version,
        }

    @classmethod
    def from_json(cls, data: object, where: str) -> EngineSettings:
        """Settings from a parsed engine.json.

        Raises:
            ModelFormatError: not an object, a field missing, extra, mistyped or out of
                range, a capacity that is not input + output, a chip without the precision.
        """
        if not isinstance(data, dict):
            raise _bad(where, "is not a JSON object")
        missing = [k for k in _FIELDS if k not in data]
        extra = sorted(str(k) for k in data if k not in _FIELDS)
        if missing or extra:
            what = "; ".join(
                part
                for part in (
                    f"missing {', '.join(missing)}" if missing else "",
                    f"unknown {', '.join(extra[:5])}" if extra else "",
                )
                if part
            )
            raise _bad(where, what)
        if _int(data["schema"], where, "schema", 1, 1 << 30) != SCHEMA:
            raise _bad(where, f"schema {data['schema']} is not {SCHEMA} (a newer edgekit's?)")
        settings = cls(
            precision=_choice(data["precision"], where, "precision", PRECISIONS),
            max_batch_size=_int(data["max_batch_size"], where, "max_batch_size", *BATCH),
            max_input_len=_int(data["max_input_len"], where, "max_input_len", *INPUT),
            max_output_len=_int(data["max_output_len"], where, "max_output_len", *OUTPUT),
            kv_cache_type=_choice(data["kv_cache_type"], where, "kv_cache_type", KV_CACHE_TYPES),
            soc=None if data["soc"] is None else _choice(data["soc"], where, "soc", tuple(CHIPS)),
            edgellm_version=_choice(
                data["edgellm_version"], where, "edgellm_version", (EDGELLM_VERSION,)
            ),
        )
        capacity = _int(data["max_kv_cache_capacity"], where, "max_kv_cache_capacity", 1, 1 << 17)
        if capacity != settings.max_kv_cache_capacity:
            raise _bad(
                where,
                f"max_kv_cache_capacity {capacity} is not max_input_len + max_output_len "
                f"({settings.max_kv_cache_capacity})",
            )
        if settings.soc is not None and settings.precision not in CHIPS[settings.soc].precisions:
            raise _bad(where, f"{settings.soc} does not run {settings.precision}")
        return settings


def _bad(where: str, what: str) -> ModelFormatError:
    return ModelFormatError(
        f"{where}: {what}",
        hint="export the model again: edgekit convert MODEL --to tensorrt -o DIR",
    )


def _int(value: object, where: str, name: str, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise _bad(where, f"{name} is {value!r}, not an integer from {low} to {high:,}")
    return value


def _choice(value: object, where: str, name: str, allowed: tuple[str, ...]) -> str:
    if not isinstance(value, str) or value not in allowed:
        shown = value if isinstance(value, str | int | float | None) else type(value).__name__
        raise _bad(where, f"{name} is {str(shown)[:40]!r}, not one of {', '.join(allowed)}")
    return value


def _option(recipe: Recipe | None, name: str) -> int | None:
    """A recipe's engine option (``max_batch``, ``max_input``, ``max_output``): None
    when the recipe has no such field or leaves it unset."""
    value = getattr(recipe, name, None) if recipe is not None else None
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise UnsupportedConversionError(f"recipe option {name}={value!r} is not an integer")
    return value


def _bounded(name: str, value: int, bounds: tuple[int, int]) -> int:
    low, high = bounds
    if not low <= value <= high:
        raise UnsupportedConversionError(
            f"TensorRT Edge-LLM: {name}={value} is out of range",
            hint=f"use {name}={low}..{high}",
        )
    return value


def _kv_cache(recipe: Recipe | None) -> str:
    given = (recipe.kv_cache if recipe is not None else "f16").lower()
    kv = _KV_NAMES.get(given, given)
    if kv == "fp8":
        raise UnsupportedConversionError(
            "TensorRT Edge-LLM: an FP8 KV cache needs SM89+ and an FP8 export edgekit does "
            "not build",
            hint="use kv_cache=f16",
        )
    if kv not in KV_CACHE_TYPES:
        raise UnsupportedConversionError(
            f"TensorRT Edge-LLM has no KV-cache type {given!r} for an F16 export",
            hint="use kv_cache=f16",
        )
    return kv


def _soc(recipe: Recipe | None, precision: str) -> str | None:
    given = recipe.soc if recipe is not None else None
    if given is None:
        return None
    try:
        found = chip(given)
    except ModelError as exc:
        raise UnsupportedConversionError(exc.message, hint=exc.hint) from exc
    if precision not in found.precisions:
        raise UnsupportedConversionError(
            f"{found.name} (SM{found.sm}) does not run TensorRT Edge-LLM {precision} engines",
            hint=f"it runs {', '.join(found.precisions)} ({found.source})",
        )
    return found.key


def settings_from_recipe(
    quant: str | None, recipe: Recipe | None, spec: ModelSpec, *, context: int | None = None
) -> EngineSettings:
    """The engine settings a conversion of ``spec`` to ``quant`` records, from the
    recipe's options (``max_batch``, ``max_input``, ``max_output``, ``kv_cache``, ``soc``).

    Defaults: batch 1; generation min(512, context / 2); prompt min(2048, the rest of the
    model's context), so the default capacity always fits the model.

    Raises:
        UnsupportedConversionError: an unknown precision, an option out of range, a
            capacity beyond the model's context, an FP8 or other KV cache, a chip edgekit
            has no row for or one that does not run the precision.
    """
    precision = (quant or "F16").upper()
    if precision not in PRECISIONS:
        raise UnsupportedConversionError(
            f"TensorRT Edge-LLM has no precision {precision!r}",
            hint=f"choose one of {', '.join(PRECISIONS)}",
        )
    # ``context``: what the variant is packed for (the plan's, the manifest's runtime
    # context): the engine's KV capacity is that, so the plan's memory is the engine's
    planned = context if context is not None else spec.context_length
    limit = min(planned, spec.context_length)
    batch = _option(recipe, "max_batch")
    given_out = _option(recipe, "max_output")
    out = given_out if given_out is not None else min(DEFAULT_OUTPUT, max(1, limit // 2))
    given_in = _option(recipe, "max_input")
    if given_in is not None:
        inp = given_in
    elif context is not None:  # the rest of the packed context, within the builder's bound
        inp = min(INPUT[1], max(INPUT[0], limit - out))
    else:
        inp = min(DEFAULT_INPUT, max(INPUT[0], limit - out))
    context = spec.context_length
    settings = EngineSettings(
        precision=precision,
        max_batch_size=_bounded("max_batch", 1 if batch is None else batch, BATCH),
        max_input_len=_bounded("max_input", inp, INPUT),
        max_output_len=_bounded("max_output", out, OUTPUT),
        kv_cache_type=_kv_cache(recipe),
        soc=_soc(recipe, precision),
        edgellm_version=EDGELLM_VERSION,
    )
    if settings.max_kv_cache_capacity > context:
        raise UnsupportedConversionError(
            f"TensorRT Edge-LLM: max_input + max_output = {settings.max_kv_cache_capacity} "
            f"tokens is more than the model's context ({context:,})",
            hint=f"choose max_input and max_output that add up to at most {context}",
        )
    return settings
