"""The conversions the GGUF package performs, as edges of the conversion graph:

    HF folder -> GGUF F32/F16/BF16    edgekit's writer (from_hf)
    HF folder -> GGUF quantized       the writer to a lossless intermediate in the source's
                                      own precision, then llama.cpp's quantizer
    GGUF      -> GGUF quantized       llama.cpp's quantizer (requantize: the errors stack,
                                      and the result says so)
    GGUF      -> HF folder            dequantize to float32 safetensors (to_hf)

Each edge's check is everything knowable before writing: the options, the source, and
the tools installed. The converters import numpy, gguf and llama_cpp, so each run
imports its converter when it runs: listing the edges imports no SDK.
"""

from __future__ import annotations

from edgekit.converters.edge_checks import Tool, check_hf_weights, require
from edgekit.converters.formats import ConvertRequest, Edge
from edgekit.converters.gguf.table import FLOAT_FORMATS, GGUF_FORMATS, ggml_type_id
from edgekit.converters.recipe import Recipe

from edgekit.atomic import work_dir
from edgekit.errors import UnsupportedConversionError

# The importable modules each step needs, and the extra that installs them.
QUANTIZER = Tool(
    modules=("llama_cpp",),
    package="llama-cpp-python",
    install="pip install 'edgekit[gguf]'",
)
WRITER = Tool(
    modules=("gguf", "numpy"),
    package="the gguf package",
    install="pip install 'edgekit[gguf]'",
)


def _file_type(quant: str | None) -> str:
    """The GGUF file type asked for (upper case), refused when edgekit does not write it."""
    name = (quant or "F16").upper()
    if name not in GGUF_FORMATS:
        raise UnsupportedConversionError(
            f"{quant!r} is not a GGUF type edgekit writes",
            hint=f"choose one of {', '.join(GGUF_FORMATS)}",
        )
    return name


def _check_recipe_types(recipe: Recipe | None, name: str) -> None:
    """The recipe's tensor types are ggml types (they only matter when quantizing)."""
    if recipe is None or name in FLOAT_FORMATS:
        return
    for what in ("embeddings", "output"):
        value = getattr(recipe, what)
        if value:
            ggml_type_id(value, what)


def _check_from_hf(req: ConvertRequest) -> None:
    name = _file_type(req.quant)
    # A source an earlier step of the route writes is such a folder by construction.
    if req.spec.format == "hf":
        check_hf_weights(req.spec, req.src, "GGUF conversion")
    require(WRITER, "writing a GGUF")
    if name not in FLOAT_FORMATS:
        require(QUANTIZER, f"quantizing to {name}")
    _check_recipe_types(req.recipe, name)


def _run_from_hf(req: ConvertRequest) -> tuple[str, ...]:
    # from_hf and quantize import numpy, gguf and llama_cpp: imported when run.
    from edgekit.converters.gguf.from_hf import hf_to_gguf
    from edgekit.converters.gguf.quantize import quantize_gguf

    name, out = _file_type(req.quant), req.destination()
    if name in FLOAT_FORMATS:
        hf_to_gguf(
            req.src,
            out,
            out_type=name,
            recipe=req.recipe,
            tokenizer_pre=req.tokenizer_pre,
            force=req.force,
            progress=req.progress,
        )
        return ()
    # Quantize from a lossless intermediate in the source's own precision, written in a
    # private folder beside the output (removed on the way out, however it ends).
    lossless = req.spec.dtype if req.spec.dtype in FLOAT_FORMATS else "F32"
    with work_dir(out, "build") as scratch:
        intermediate = scratch / f"{out.stem}.{lossless.lower()}-intermediate.gguf"
        hf_to_gguf(
            req.src,
            intermediate,
            out_type=lossless,
            recipe=req.recipe,
            tokenizer_pre=req.tokenizer_pre,
            progress=req.progress,
        )
        q = quantize_gguf(
            intermediate,
            out,
            name,
            recipe=req.recipe,
            threads=req.threads,
            force=req.force,
            progress=req.progress,
        )
    return q.warnings


def _check_requantize(req: ConvertRequest) -> None:
    name = _file_type(req.quant)
    if name in FLOAT_FORMATS:
        raise UnsupportedConversionError(
            f"{req.src} is already GGUF; converting it to {name} adds nothing",
            hint="quantize it (--quant Q4_K_M, ...) or convert it --to hf",
        )
    require(QUANTIZER, "quantizing a GGUF")
    _check_recipe_types(req.recipe, name)


def _run_requantize(req: ConvertRequest) -> tuple[str, ...]:
    from edgekit.converters.gguf.quantize import quantize_gguf

    q = quantize_gguf(
        req.src,
        req.destination(),
        _file_type(req.quant),
        recipe=req.recipe,
        threads=req.threads,
        force=req.force,
        progress=req.progress,
    )
    return q.warnings


def _check_to_hf(req: ConvertRequest) -> None:
    if req.quant:
        raise UnsupportedConversionError("--quant does not apply to --to hf (it writes float32)")


def _run_to_hf(req: ConvertRequest) -> tuple[str, ...]:
    from edgekit.converters.gguf.to_hf import gguf_to_hf  # imports numpy

    result = gguf_to_hf(req.src, req.destination(), force=req.force, progress=req.progress)
    return result.warnings


EDGES: tuple[Edge, ...] = (
    Edge(
        source="hf",
        output="gguf",
        check=_check_from_hf,
        run=_run_from_hf,
        describe="HF folder -> GGUF (edgekit's writer; quantized by llama.cpp's quantizer)",
        tools=("gguf", "llama-cpp-python"),
    ),
    Edge(
        source="gguf",
        output="gguf",
        check=_check_requantize,
        run=_run_requantize,
        describe="GGUF -> GGUF quantized (llama.cpp's quantizer; requantizing stacks errors)",
        tools=("llama-cpp-python",),
    ),
    Edge(
        source="gguf",
        output="hf",
        check=_check_to_hf,
        run=_run_to_hf,
        describe="GGUF -> HF folder (dequantized to float32 safetensors)",
        tools=("gguf",),
    ),
)
