"""The conversion the ONNX package performs: HF folder -> ONNX (the onnxruntime-genai
model builder, CPU execution provider). A GGUF source reaches it through the GGUF
package's dequantizing edge (GGUF -> HF -> ONNX is a route of the graph).
"""

from __future__ import annotations

from edgekit.converters.edge_checks import check_hf_tokenizer, check_hf_weights, require
from edgekit.converters.formats import ConvertRequest, Edge
from edgekit.converters.onnx.export import (
    BUILDABLE,
    BUILDER,
    build_options,
    check_config,
    hf_to_onnx,
)

from edgekit.architectures import FAMILIES
from edgekit.errors import UnsupportedConversionError
from edgekit.inspection import read_config


def cannot_build(family: str) -> str:
    """Why edgekit cannot build ``family`` to ONNX ("" when it can)."""
    if family in BUILDABLE:
        return ""
    display = next((f.display for f in FAMILIES if f.key == family), family)
    return f"the onnxruntime-genai builder has no {display} model class edgekit checked"


def _check_build(req: ConvertRequest) -> None:
    """Everything knowable before writing: the quantization and recipe, the family, the
    source folder (one an earlier step writes, such as a dequantized GGUF, is checked
    when it exists), the builder installed."""
    options = build_options(req.quant, req.recipe)
    if options.part_gib is not None:  # an HTP variant: every layer must fit one part
        from edgekit.converters.onnx.htp_layout import check_fits

        check_fits(req.spec, options.quant, options.part_gib)
    reason = cannot_build(req.spec.family)
    if reason:
        raise UnsupportedConversionError(
            f"{req.spec.family}: {reason}",
            hint="use the GGUF or OpenVINO target for this model",
        )
    src = req.src
    if req.spec.format == "hf":
        check_hf_weights(req.spec, src, "ONNX export")
        check_hf_tokenizer(src)
        check_config(read_config(src), str(src))
    require(BUILDER, "ONNX export")


def _run_build(req: ConvertRequest) -> tuple[str, ...]:
    built = hf_to_onnx(
        req.src,
        req.destination(),
        req.quant or "INT4",
        recipe=req.recipe,
        force=req.force,
        progress=req.progress,
        context=req.context,
    )
    return built.warnings


EDGES: tuple[Edge, ...] = (
    Edge(
        source="hf",
        output="onnx",
        check=_check_build,
        run=_run_build,
        describe="HF folder -> ONNX (onnxruntime-genai model builder: CPU MatMulNBits, or a "
        "QNN HTP variant: static QDQ parts + context binaries)",
        tools=("onnxruntime-genai", "onnxruntime", "onnx-ir"),
    ),
)
