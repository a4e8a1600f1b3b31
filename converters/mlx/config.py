"""The config.json an MLX variant needs beyond its source's.

transformers 5 saves RoPE settings as ``rope_parameters`` (per attention type for
Gemma 3); mlx-lm 0.31.3's model classes read the older top-level ``rope_theta``,
``rope_scaling``, ``partial_rotary_factor`` and (Gemma 3) ``rope_local_base_freq``, and
silently take their defaults without them: a Qwen3 saved by transformers 5 would run
with RoPE base 10,000 instead of 1,000,000, a tiny Gemma 3 with 1,000,000 instead of
its 10,000. The converter writes those keys from ``rope_parameters``, so mlx-lm builds
the model the source describes (tests/test_mlx_convert.py: greedy tokens equal
transformers' for every family).
"""

from __future__ import annotations

from typing import Any

from edgekit.errors import UnsupportedConversionError


def _scaling(params: dict[str, Any]) -> dict[str, Any] | None:
    """``rope_scaling`` as mlx-lm reads it (both ``type`` and ``rope_type``: Phi-3's
    class requires ``type``), None for plain RoPE."""
    kind = params.get("rope_type") or params.get("type") or "default"
    if kind == "default":
        return None
    scaling = {k: v for k, v in params.items() if k not in ("rope_theta",)}
    scaling.update(type=kind, rope_type=kind)
    return scaling


def _gemma3_pattern(config: dict[str, Any]) -> dict[str, Any]:
    """Gemma 3's attention pattern as mlx-lm's ``sliding_window_pattern``: transformers 5
    writes ``layer_types``; mlx-lm makes layer i global iff (i + 1) % pattern == 0
    (default 6) and indexes the first global layer's cache, so a layer list it cannot
    express is refused rather than run with other attention.

    Raises:
        UnsupportedConversionError: ``layer_types`` is not such a pattern.
    """
    types = config.get("layer_types")
    if config.get("model_type") != "gemma3_text" or "sliding_window_pattern" in config:
        return {}
    if not isinstance(types, list) or not types:
        return {}
    full = [i for i, t in enumerate(types) if t == "full_attention"]
    pattern = full[0] + 1 if full else 0
    fits = pattern > 0 and all(
        (t == "full_attention") == ((i + 1) % pattern == 0) for i, t in enumerate(types)
    )
    if not fits:
        raise UnsupportedConversionError(
            f"Gemma 3 layer types {types[:12]} are not a pattern mlx-lm's gemma3_text runs "
            "(every n-th layer global, the first within the model)",
            hint="mlx-lm needs at least one full-attention layer every sliding_window_pattern",
        )
    return {"sliding_window_pattern": pattern}


def mlx_config_changes(config: dict[str, Any]) -> dict[str, Any]:
    """Keys to add to the source's config (none when it has the top-level ones).

    Raises:
        UnsupportedConversionError: the source is already quantized (a Hugging Face
            AWQ/GPTQ checkpoint: edgekit converts float weights only), names code for
            mlx-lm to run, or has a Gemma 3 layer pattern mlx-lm cannot express.
    """
    if "model_file" in config:  # mlx-lm would import and run that Python file
        raise UnsupportedConversionError(
            "the source's config.json names a model_file: mlx-lm would run its code",
            hint="remove model_file from config.json: edgekit converts the families it knows",
        )
    if "quantization_config" in config or "quantization" in config:
        raise UnsupportedConversionError(
            "the source's config.json declares a quantization: edgekit builds MLX from "
            "float weights",
            hint="convert the float checkpoint (or its GGUF) instead",
        )
    changes = _gemma3_pattern(config)
    params = config.get("rope_parameters")
    if not isinstance(params, dict) or "rope_theta" in config:
        return changes
    full, sliding = params.get("full_attention"), params.get("sliding_attention")
    if isinstance(full, dict):  # Gemma 3: one set per attention type
        params = full
        if isinstance(sliding, dict) and sliding.get("rope_theta") is not None:
            changes["rope_local_base_freq"] = sliding["rope_theta"]
    if params.get("rope_theta") is not None:
        changes["rope_theta"] = params["rope_theta"]
    if "partial_rotary_factor" in params and "partial_rotary_factor" not in config:
        changes["partial_rotary_factor"] = params["partial_rotary_factor"]
    scaling = _scaling(params)
    if scaling is not None and "rope_scaling" not in config:
        changes["rope_scaling"] = scaling
    return changes
