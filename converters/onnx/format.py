"""ONNX as a bundle format: the folders onnxruntime-genai's model builder writes for the
CPU execution provider (model.onnx + model.onnx.data, genai_config.json, the tokenizer),
what each quantization weighs tensor by tensor, the quality each is expected to lose, and
the build edge.

INT8 and INT4 are also the names the QNN target plans with; their layout is the CPU
build's (MatMulNBits blocks). W8A16 and FP16 are the QNN HTP variants (``htp_build``, one
Snapdragon SoC each, ``recipe.soc``); their layout is what the HTP holds (``htp_layout``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import ClassVar

from edgekit.converters.formats import Edge, Format, Quant
from edgekit.converters.layouts import WeightLayout
from edgekit.converters.onnx.edges import EDGES, cannot_build
from edgekit.converters.onnx.export import HTP_QUANTS, SETTINGS_FILE
from edgekit.converters.onnx.htp_layout import htp_layout
from edgekit.converters.onnx.layout import BLOCK_SIZES, DEFAULT_BLOCK, onnx_layout

from edgekit.modelspec import ModelSpec

_SETTINGS_MAX = 64 * 1024


# Measured here (docs/onnx.md): SmolLM2-135M-Instruct from the embedded Q4_1 GGUF, built
# FP32, INT8 and INT4; next-token KL against the FP32 build (within 2.5e-6 of
# transformers in the tiny-model parity tests) over 512 tokens of the shipped text,
# onnxruntime-genai on the CPU provider.
_MEASURED = "measured (SmolLM2-135M, 512 tokens, against the FP32 build)"


def _quants() -> dict[str, Quant]:
    return {
        "FP32": Quant(
            name="FP32",
            bits_per_weight=32.0,
            expected_kl=0.0,
            kl_source="lossless against the source",
            note="every weight f32: the parity reference",
            lossless=True,
        ),
        # 8 bits and one f32 scale per block of 32: 9 bits per weight
        "INT8": Quant(
            name="INT8",
            bits_per_weight=9.0,
            expected_kl=0.00549,
            kl_source=_MEASURED,
            note="MatMulNBits 8-bit symmetric, blocks of 32 (embedding f32)",
        ),
        # a tied embedding shares lm_head's 4-bit blocks: most of the loss on SmolLM2
        "INT4": Quant(
            name="INT4",
            bits_per_weight=5.0,
            expected_kl=0.48455,
            kl_source=_MEASURED,
            note="MatMulNBits 4-bit symmetric, blocks of 32 (untied embedding f32)",
        ),
        # QNN HTP variants (htp_build), for one Snapdragon SoC (recipe soc=...)
        # measured: SmolLM2-135M-Instruct, 512 tokens of the shipped text (256 through the
        # prompt graph, 256 token steps), the QDQ stage on the CPU provider against the FP32
        # static graphs: mean KL 0.921, top-1 agreement 0.678 (the HTP's integer kernels
        # compute what the QDQ graph says; not measured on a device)
        # measured: SmolLM2-135M-Instruct, 128 tokens of the shipped text (64 through the
        # prompt graph, 64 token steps), the QDQ graph on the CPU provider against the FP32
        # static graphs: mean KL 0.0218, top-1 agreement 0.938; compiled for SM8750 with no
        # CPU fallback. On onnxruntime-qnn's x86 HTP simulator its prompt graph agreed on
        # 0.828 of the first 64 positions (0.922 on the CPU): the CPU check is optimistic.
        "W16A16": Quant(
            name="W16A16",
            bits_per_weight=16.0,
            expected_kl=0.0218,
            kl_source="measured (SmolLM2-135M, 128 tokens, QDQ graph on the CPU against the "
            "FP32 static graphs)",
            note="QNN HTP: QDQ uint16 per-tensor weights, uint16 activations, calibrated on "
            "local text; static prompt/token graphs in parts (embedding f32 on the CPU)",
        ),
        "W8A16": Quant(
            name="W8A16",
            bits_per_weight=8.0,
            expected_kl=0.921,
            kl_source="measured (SmolLM2-135M, 512 tokens, QDQ stage on the CPU against the "
            "FP32 static graphs)",
            note="QNN HTP: QDQ uint8 per-tensor weights, uint16 activations, calibrated on "
            "local text; half W16A16's weight bytes, but per-tensor 8-bit weights lose much "
            "(SmolLM2: top-1 0.68)",
        ),
        "FP16": Quant(
            name="FP16",
            bits_per_weight=16.0,
            expected_kl=None,
            kl_source="no measurement",
            note="QNN HTP: the float graph, run at fp16 by the HTP (no calibration)",
        ),
    }


class OnnxFormat(Format):
    """An onnxruntime-genai model folder, loaded by onnxruntime-genai."""

    name: ClassVar[str] = "onnx"
    display: ClassVar[str] = "ONNX"
    entry: ClassVar[str] = ""  # the variant folder itself (model.onnx, genai_config.json)
    default_quant: ClassVar[str] = "INT4"
    pack_quant: ClassVar[str] = "INT4"
    quants: ClassVar[Mapping[str, Quant]] = _quants()

    def layout(self, spec: ModelSpec, quant: str, *, group_size: int | None = None) -> WeightLayout:
        """The builder's tensors; ``group_size`` is the MatMulNBits block size (16-256)."""
        name = self.require_quant(quant).name
        if name in HTP_QUANTS:
            return htp_layout(spec, name)
        return onnx_layout(spec, name, block_size=group_size if name != "FP32" else None)

    def built_layout(self, spec: ModelSpec, quant: str) -> WeightLayout:
        """The layout at the block size the build recorded in the variant folder."""
        name = self.require_quant(quant).name
        if name in HTP_QUANTS:
            return htp_layout(spec, name)
        block = recorded_block_size(Path(spec.path)) if name != "FP32" else None
        return onnx_layout(spec, name, block_size=block)

    def cannot_build(self, spec: ModelSpec) -> str:
        return cannot_build(spec.family)

    def edges(self) -> tuple[Edge, ...]:
        return EDGES


def recorded_block_size(folder: Path) -> int:
    """The block size ``edgekit.json`` in a built variant folder records (the default
    when there is none, or it is not one edgekit writes: the layout is an estimate then)."""
    path = folder / SETTINGS_FILE
    try:
        if not path.is_file() or path.is_symlink() or path.stat().st_size > _SETTINGS_MAX:
            return DEFAULT_BLOCK
        settings = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return DEFAULT_BLOCK
    block = settings.get("block_size") if isinstance(settings, dict) else None
    return block if isinstance(block, int) and block in BLOCK_SIZES else DEFAULT_BLOCK
