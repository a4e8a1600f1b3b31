"""Data-aware 4-bit MLX: AWQ through mlx-lm (``mlx_lm.quant.awq``), calibrated on a local
text file (the recipe's ``calibration``, read with OpenVINO's bounds).

AWQ scales each block's input channels by the activations it sees on the text (and clips
the weights) before quantizing the block at 4 bits; the embedding and lm_head are
quantized at the recipe's pin (4 bits by default), at the same group size. mlx-lm's
script downloads a calibration set; edgekit tokenizes the user's file with the source's
own tokenizer.json (Hugging Face ``tokenizers``) instead.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from edgekit.converters.mlx.plan import MlxBuild

from edgekit.errors import UnsupportedConversionError
from edgekit.safetensors_header import model_file

# Calibration sequences x tokens and grid points: mlx-lm's script takes 128 x 512, grid 20;
# edgekit takes 8 x 256 (2,048 tokens of the user's file, enough to rank channels). AWQ
# runs each block dozens of times per grid search: on mlx's CPU build here (2 shared
# cores) SmolLM2-135M took 602 s at 2 x 128, grid 5 (benchmarks/mlx_convert.py --kl
# --awq 2x128,5); the default is for a Mac's GPU.
SAMPLES = 8
LENGTH = 256
MIN_TOKENS = 32
GRID = 20


def calibration_inputs(src: Path, path: str) -> list[list[int]]:
    """Token-id rows (``SAMPLES`` x ``LENGTH`` at most) of the calibration text.

    Raises:
        UnsupportedConversionError: no tokenizer.json, or too little text.
    """
    from edgekit.converters.openvino.export import calibration_texts
    from tokenizers import Tokenizer

    texts = calibration_texts(path) or []
    tokenizer = Tokenizer.from_file(str(model_file(src, "tokenizer.json")))
    ids: list[int] = []
    for text in texts:
        ids.extend(tokenizer.encode(text, add_special_tokens=False).ids)
        if len(ids) >= SAMPLES * LENGTH:
            break
    if len(ids) < MIN_TOKENS:
        raise UnsupportedConversionError(
            f"calibration text {path} holds {len(ids)} tokens",
            hint=f"give at least {MIN_TOKENS} tokens of text (a few paragraphs)",
        )
    length = min(LENGTH, len(ids))
    rows = min(SAMPLES, len(ids) // length)
    return [ids[r * length : (r + 1) * length] for r in range(rows)]


def awq_quantize(model: Any, config: dict[str, Any], src: Path, build: MlxBuild) -> dict[str, Any]:
    """Quantize ``model`` in place with AWQ; returns the config with its quantization."""
    import mlx.core as mx
    from mlx_lm.quant.awq import AWQ_MODEL_CONFIGS
    from mlx_lm.quant.awq import awq_quantize as run_awq

    plan = build.plan
    awq_config = AWQ_MODEL_CONFIGS.get(config["model_type"])
    if awq_config is None or build.calibration is None:
        raise UnsupportedConversionError(
            f"mlx-lm's AWQ has no layer map for {config['model_type']}",
            hint="drop calibration: plain 4BIT builds every family",
        )
    rows = calibration_inputs(src, build.calibration)
    mx.random.seed(0)
    pin = plan.embeddings if plan.embeddings is not None else plan.output
    run_awq(
        model,
        mx.array(rows),
        awq_config,
        group_size=plan.group_size,
        bits=plan.bits,
        embed_group_size=plan.group_size,
        embed_bits=pin or plan.bits,
        n_grid=GRID,
    )
    return {**config, "quantization": quantization_block(model, plan.bits, plan.group_size)}


def quantization_block(model: Any, bits: int, group_size: int) -> dict[str, Any]:
    """config.json's ``quantization`` for a quantized ``model``: the default, one entry
    per module that differs, False for a Linear or Embedding left in float."""
    block: dict[str, Any] = {"group_size": group_size, "bits": bits, "mode": "affine"}
    for path, module in model.named_modules():
        got = getattr(module, "bits", None)
        if got is not None:
            if (got, module.group_size) != (bits, group_size):
                block[path] = {"group_size": module.group_size, "bits": got, "mode": "affine"}
        elif quantizable_module(module):
            block[path] = False
    return block


def quantizable_module(module: object) -> bool:
    """A module mlx-lm would quantize (a Linear or an Embedding: it has to_quantized)."""
    return hasattr(module, "to_quantized") and hasattr(module, "weight")
