"""The conversion the OpenVINO package performs: HF folder -> OpenVINO IR (NNCF weight
compression, through optimum-intel). A GGUF source reaches it through the GGUF
package's dequantizing edge (GGUF -> HF -> OpenVINO is a route of the graph).
"""

from __future__ import annotations

from edgekit.converters.edge_checks import Tool, check_hf_tokenizer, check_hf_weights, require
from edgekit.converters.formats import ConvertRequest, Edge
from edgekit.converters.openvino.export import (
    EXPORTABLE,
    KV_PRECISIONS,
    OPENVINO_FORMATS,
    calibration_texts,
    group_size_for,
    hf_to_openvino,
)
from edgekit.converters.recipe import Recipe

from edgekit.architectures import FAMILIES
from edgekit.errors import UnsupportedConversionError

EXPORTER = Tool(
    modules=("optimum.intel", "openvino", "openvino_tokenizers", "nncf", "transformers"),
    package="optimum-intel and openvino-tokenizers",
    install="pip install 'edgekit[openvino]'",
)


def _format(quant: str | None) -> str:
    name = (quant or "INT4").upper()
    if name not in OPENVINO_FORMATS:
        raise UnsupportedConversionError(
            f"{name!r} is not an OpenVINO format edgekit writes",
            hint=f"choose one of {', '.join(OPENVINO_FORMATS)}",
        )
    return name


def _check_export(req: ConvertRequest) -> None:
    """From a Hugging Face folder (one an earlier step writes, such as a dequantized
    GGUF, is checked when it exists), of a family the pinned exporter handles."""
    quant = _format(req.quant)
    spec, src = req.spec, req.src
    if spec.format == "hf":
        check_hf_weights(spec, src, "OpenVINO export")
        check_hf_tokenizer(src)
    if spec.family not in EXPORTABLE:
        display = next((f.display for f in FAMILIES if f.key == spec.family), spec.family)
        raise UnsupportedConversionError(
            f"{display} cannot be exported to OpenVINO with the pinned optimum-intel",
            hint="use the GGUF target for this model",
        )
    recipe = req.recipe or Recipe(weights=quant)
    if recipe.kv_cache not in KV_PRECISIONS:
        raise UnsupportedConversionError(
            f"KV-cache type {recipe.kv_cache!r} has no OpenVINO equivalent",
            hint="use f16, q8_0 (u8) or f32",
        )
    require(EXPORTER, "OpenVINO export")
    calibration_texts(recipe.calibration)
    if recipe.group_size is not None and quant.startswith("INT4"):
        group_size_for(quant, recipe)  # refuses a group size NNCF lacks (F16, INT8: unused)


def _run_export(req: ConvertRequest) -> tuple[str, ...]:
    exported = hf_to_openvino(
        req.src,
        req.destination(),
        _format(req.quant),
        recipe=req.recipe,
        force=req.force,
        progress=req.progress,
    )
    return exported.warnings


EDGES: tuple[Edge, ...] = (
    Edge(
        source="hf",
        output="openvino",
        check=_check_export,
        run=_run_export,
        describe="HF folder -> OpenVINO IR (optimum-intel export, NNCF weight compression)",
        tools=("optimum-intel", "nncf", "openvino"),
    ),
)
