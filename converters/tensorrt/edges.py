"""The conversion the TensorRT package performs: HF folder -> TensorRT Edge-LLM export
(F16), through NVIDIA's exporter in its own tool environment. A GGUF source reaches it
through the GGUF package's dequantizing edge (GGUF -> HF -> TensorRT is a route)."""

from __future__ import annotations

from edgekit.converters.edge_checks import check_hf_tokenizer, check_hf_weights, hf_side_files
from edgekit.converters.formats import ConvertRequest, Edge
from edgekit.converters.recipe import set_options
from edgekit.converters.tensorrt.export import hf_to_tensorrt
from edgekit.converters.tensorrt.format import BUILT, NOT_BUILT, SCHEMES
from edgekit.converters.tensorrt.settings import settings_from_recipe
from edgekit.converters.tensorrt.staging import check_dtypes
from edgekit.converters.tensorrt.tool_env import EXPORT_ENV

from edgekit.architectures import FAMILIES
from edgekit.errors import UnsupportedConversionError
from edgekit.tool_envs import locate

# What NVIDIA lists as supported LLM families (Llama 3.x, Qwen 2/2.5/3, the DeepSeek-R1
# distills of those). The exporter also ran on tiny Mistral, Phi-3 and Gemma 3 models
# here, but NVIDIA lists no runtime support for them: edgekit does not build them.
EXPORT_FAMILIES = ("llama", "qwen2", "qwen3")


def cannot_build(family: str) -> str:
    """Why edgekit cannot export ``family`` to Edge-LLM ("" when it can)."""
    if family in EXPORT_FAMILIES:
        return ""
    display = next((f.display for f in FAMILIES if f.key == family), family)
    return f"NVIDIA TensorRT Edge-LLM lists no support for {display}"


def _check_quant(quant: str | None) -> str:
    name = (quant or BUILT[0]).upper()
    if name not in SCHEMES:
        raise UnsupportedConversionError(
            f"TensorRT Edge-LLM has no precision {name!r}",
            hint=f"choose one of {', '.join(SCHEMES)}",
        )
    if name not in BUILT:
        raise UnsupportedConversionError(
            f"TensorRT Edge-LLM {name}: {NOT_BUILT}", hint="use --quant F16"
        )
    return name


def _check_export(req: ConvertRequest) -> None:
    """Everything knowable before writing: the precision and engine settings, options
    the export cannot express, the family, the source folder (one an earlier step
    writes is checked when it exists), the tool environment."""
    quant = _check_quant(req.quant)
    # the very settings the run computes (the pack's context included), so the run never
    # fails on a setting the check passed
    settings_from_recipe(quant, req.recipe, req.spec, context=req.context)
    recipe = req.recipe
    if recipe is not None:
        unsupported = set_options(
            ("embeddings", recipe.embeddings),
            ("output", recipe.output),
            ("group_size", recipe.group_size),
            ("ratio", recipe.ratio),
            ("calibration", recipe.calibration),
            ("part_gib", recipe.part_gib),
        )
        if unsupported:
            raise UnsupportedConversionError(
                f"a TensorRT Edge-LLM F16 export cannot express {', '.join(unsupported)}",
                hint="its options are max_batch, max_input, max_output, kv_cache=f16 and soc",
            )
    reason = cannot_build(req.spec.family)
    if reason:
        raise UnsupportedConversionError(reason, hint="use the GGUF target for this model")
    if req.spec.format == "hf":
        check_hf_weights(req.spec, req.src, "TensorRT Edge-LLM export")
        check_hf_tokenizer(req.src)
        if not (req.src / "tokenizer.json").is_file():
            raise UnsupportedConversionError(
                f"{req.src}: the Edge-LLM runtime reads tokenizer.json, which is not there",
                hint="save the tokenizer with transformers (it writes tokenizer.json) first",
            )
        if not req.spec.chat_template:
            raise UnsupportedConversionError(
                f"{req.src}: no chat template (the Edge-LLM exporter requires one)",
                hint="save chat_template.jinja beside the weights",
            )
        hf_side_files(req.src)
        check_dtypes(req.src)
    locate(EXPORT_ENV)


def _run_export(req: ConvertRequest) -> tuple[str, ...]:
    quant = _check_quant(req.quant)
    exported = hf_to_tensorrt(
        req.src,
        req.destination(),
        settings_from_recipe(quant, req.recipe, req.spec, context=req.context),
        req.spec,
        force=req.force,
        progress=req.progress,
    )
    return exported.warnings


EDGES: tuple[Edge, ...] = (
    Edge(
        source="hf",
        output="tensorrt",
        check=_check_export,
        run=_run_export,
        describe="HF folder -> TensorRT Edge-LLM ONNX export, F16 (tensorrt-edgellm-export in "
        "its tool environment; the engine is built on the device)",
        tools=(),
    ),
)
