"""A quantization recipe: one small value that every backend maps onto its own switches.

    Recipe(weights="Q4_K_M", embeddings="Q8_0", output="Q8_0", kv_cache="q8_0")

``weights`` is the format of the bulk of the weights; ``embeddings`` and ``output`` pin the
token embedding and the output projection (the tensors most sensitive to quantization);
``kv_cache`` is the KV-cache type the runtime should use, recorded with the model;
``group_size``, ``ratio`` and ``calibration`` steer group-wise, mixed and data-aware
compression where a backend has them; ``soc`` names the chip a device-specific build
(a Qualcomm HTP context binary) is compiled for. A
backend reports what it cannot express (``unsupported``) instead of dropping it silently.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields, replace

from edgekit.errors import UnsupportedConversionError

_PARSERS = {
    "group_size": int,
    "ratio": float,
    "part_gib": float,
    "max_batch": int,
    "max_input": int,
    "max_output": int,
}
KV_CACHE_TYPES = ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1")


@dataclass(frozen=True, kw_only=True)
class Recipe:
    weights: str
    embeddings: str | None = None
    output: str | None = None
    kv_cache: str = "f16"
    group_size: int | None = None  # for group-wise INT4 backends
    ratio: float | None = None  # share of layers at the low precision, the rest at INT8
    calibration: str | None = None  # a text file for data-aware compression
    # the SoC a device-specific build is for (a Snapdragon part number, "SM8750": the QNN
    # HTP variant); pack takes it from the device profile
    soc: str | None = None
    # the most one part of a split build may weigh (GiB): the Hexagon maps at most 4 GiB
    # per session (the device profiles' max_model_gib)
    part_gib: float | None = None
    # the engine a runtime that compiles on the device builds (TensorRT Edge-LLM): the most
    # sequences at once, prompt tokens and generated tokens it is sized for (engine.json)
    max_batch: int | None = None
    max_input: int | None = None
    max_output: int | None = None

    def to_json(self) -> str:
        return json.dumps({k: v for k, v in asdict(self).items() if v is not None}, sort_keys=True)

    def with_options(self, text: str | None) -> Recipe:
        """Apply ``key=value,key=value`` options (the CLI's ``--recipe``).

        Raises:
            UnsupportedConversionError: an unknown key or KV-cache type.
        """
        if not text:
            return self
        allowed = {f.name for f in fields(self)} - {"weights"}
        changes: dict[str, object] = {}
        for item in text.split(","):
            key, sep, value = item.partition("=")
            key, value = key.strip().replace("-", "_"), value.strip()
            if not sep or key not in allowed:
                raise UnsupportedConversionError(
                    f"recipe option {item!r} is not understood",
                    hint=f"use key=value with keys: {', '.join(sorted(allowed))}",
                )
            try:
                changes[key] = _PARSERS.get(key, str)(value)
            except ValueError as exc:
                raise UnsupportedConversionError(f"recipe option {item!r}: {exc}") from exc
        recipe = replace(self, **changes)  # type: ignore[arg-type]
        if recipe.kv_cache.lower() not in KV_CACHE_TYPES:
            raise UnsupportedConversionError(
                f"KV-cache type {recipe.kv_cache!r} is not known",
                hint=f"use one of {', '.join(KV_CACHE_TYPES)}",
            )
        return replace(recipe, kv_cache=recipe.kv_cache.lower())


def set_options(*options: tuple[str, object]) -> list[str]:
    """``key=value`` for each recipe option that is set (a build that cannot express
    them lists them in its refusal)."""
    return [f"{what}={value}" for what, value in options if value is not None]
