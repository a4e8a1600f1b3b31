"""The conversion the MLX package performs: HF folder -> MLX (mlx-lm in-process). A GGUF
source reaches it through the GGUF package's dequantizing edge (GGUF -> HF -> MLX is a
route of the graph)."""

from __future__ import annotations

from edgekit.converters.edge_checks import Tool, check_hf_tokenizer, check_hf_weights, require
from edgekit.converters.formats import ConvertRequest, Edge
from edgekit.converters.mlx.config import mlx_config_changes
from edgekit.converters.mlx.export import check_source, hf_to_mlx
from edgekit.converters.mlx.plan import mlx_build

from edgekit.architectures import FAMILIES
from edgekit.errors import UnsupportedConversionError
from edgekit.inspection import read_config

# Families whose mlx-lm model class edgekit checked against transformers (greedy parity,
# tests/test_mlx_convert.py); Gemma 3's text model is mlx-lm's gemma3_text.
MLX_FAMILIES = ("llama", "mistral", "qwen2", "qwen3", "phi3", "gemma3")
CONVERTER = Tool(
    modules=("mlx.core", "mlx_lm", "tokenizers"),
    package="mlx and mlx-lm",
    install="pip install 'edgekit[mlx]'",
)


def cannot_build(family: str) -> str:
    """Why edgekit cannot build ``family`` to MLX ("" when it can)."""
    if family in MLX_FAMILIES:
        return ""
    display = next((f.display for f in FAMILIES if f.key == family), family)
    return f"edgekit has not checked mlx-lm's {display} model class"


def _check_convert(req: ConvertRequest) -> None:
    """Everything knowable before writing: the quantization and recipe, the family, the
    source folder (one an earlier step writes, such as a dequantized GGUF, is checked
    when it exists), mlx-lm installed."""
    build = mlx_build(req.quant, req.recipe, req.spec)
    reason = cannot_build(req.spec.family)
    if reason:
        raise UnsupportedConversionError(
            f"{req.spec.family}: {reason}", hint="use the GGUF target for this model"
        )
    if req.spec.format == "hf":
        check_hf_weights(req.spec, req.src, "MLX conversion")
        check_hf_tokenizer(req.src)
        mlx_config_changes(read_config(req.src))  # refuses an already-quantized source
        check_source(req.src)  # the files mlx-lm opens, and the shards it globs
        if build.calibration and not (req.src / "tokenizer.json").is_file():
            raise UnsupportedConversionError(
                f"{req.src}: calibration is tokenized with tokenizer.json, which is not there",
                hint="save the tokenizer with transformers (it writes tokenizer.json) first",
            )
    require(CONVERTER, "MLX conversion")


def _run_convert(req: ConvertRequest) -> tuple[str, ...]:
    built = hf_to_mlx(
        req.src,
        req.destination(),
        mlx_build(req.quant, req.recipe, req.spec),
        force=req.force,
        progress=req.progress,
    )
    return built.warnings


EDGES: tuple[Edge, ...] = (
    Edge(
        source="hf",
        output="mlx",
        check=_check_convert,
        run=_run_convert,
        describe="HF folder -> MLX (mlx-lm: affine 8/6/4-bit, mixed 3/6 and 4/6, AWQ on "
        "local text)",
        tools=("mlx", "mlx-lm"),
    ),
)
