"""convert_model: one entry point for every conversion the CLI's ``convert`` offers.

    HF folder -> OpenVINO IR F16/INT8/INT4/INT4_SYM  (hf_to_openvino, NNCF compression)
    HF folder -> GGUF F32/F16/BF16               (hf_to_gguf)
    HF folder -> GGUF quantized                  (hf_to_gguf to a lossless intermediate,
                                                  then llama.cpp's quantizer)
    GGUF      -> GGUF quantized (requantize)     (quantize_gguf, with a stacked-error warning)
    GGUF      -> HF folder (dequantize)          (gguf_to_hf)

``check_conversion`` is the one check of a conversion before any work: the output
format and options, the source kind, and the tools installed. ``convert_model`` runs it
first, and ``pack`` runs it for every variant before converting the first one.
"""

from __future__ import annotations

import importlib.util
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from edgekit.converters.gguf_formats import FLOAT_FORMATS, GGUF_FORMATS
from edgekit.converters.gguf_quantize import quantize_gguf
from edgekit.converters.gguf_to_hf import gguf_to_hf
from edgekit.converters.hf_to_gguf import hf_to_gguf
from edgekit.converters.recipe import Recipe

from edgekit.atomic import check_destination, work_dir
from edgekit.errors import TargetUnavailableError, UnsupportedConversionError
from edgekit.inspection import inspect_model
from edgekit.modelspec import ModelSpec
from edgekit.progress import ProgressCallback, no_progress

OutputFormat = Literal["gguf", "hf", "openvino"]


@dataclass(frozen=True, kw_only=True)
class ConvertResult:
    path: Path
    format: OutputFormat
    quant: str | None
    seconds: float
    warnings: tuple[str, ...]


def convert_model(
    src: str | Path,
    to: OutputFormat,
    out: str | Path,
    *,
    quant: str | None = None,
    recipe: str | None = None,
    tokenizer_pre: str | None = None,
    threads: int | None = None,
    force: bool = False,
    progress: ProgressCallback = no_progress,
) -> ConvertResult:
    """Convert ``src`` to ``to`` at ``out``; see the module docstring for the paths.

    Raises:
        UnsupportedConversionError, OutputExistsError, ConversionError, ModelError.
    """
    src, out = Path(src), Path(out)
    start = time.perf_counter()

    def done(fmt: OutputFormat, quant: str | None, warnings: tuple[str, ...]) -> ConvertResult:
        return ConvertResult(
            path=out,
            format=fmt,
            quant=quant,
            seconds=time.perf_counter() - start,
            warnings=warnings,
        )

    check_destination(out, force=force)
    spec = inspect_model(src)
    name = (quant or ("INT4" if to == "openvino" else "F16")).upper() if to != "hf" else None
    options = Recipe(weights=name).with_options(recipe) if name is not None else None
    check_conversion(spec, src, to, quant=quant if to == "hf" else name, recipe=options)
    if to == "hf":
        r = gguf_to_hf(src, out, force=force, progress=progress)
        return done("hf", None, r.warnings)
    if to == "openvino":
        from edgekit.converters.openvino_convert import hf_to_openvino

        fmt = name or "INT4"
        exported = hf_to_openvino(src, out, fmt, recipe=options, force=force, progress=progress)
        return done("openvino", fmt, exported.warnings)

    name = name or "F16"
    if spec.format == "gguf":
        q = quantize_gguf(
            src, out, name, recipe=options, threads=threads, force=force, progress=progress
        )
        return done("gguf", name, q.warnings)
    if name in FLOAT_FORMATS:
        hf_to_gguf(
            src,
            out,
            out_type=name,
            recipe=options,
            tokenizer_pre=tokenizer_pre,
            force=force,
            progress=progress,
        )
        return done("gguf", name, ())
    # Quantize from a lossless intermediate in the source's own precision, written in a
    # private folder beside the output (removed on the way out, however it ends).
    lossless = spec.dtype if spec.dtype in FLOAT_FORMATS else "F32"
    with work_dir(out, "build") as scratch:
        intermediate = scratch / f"{out.stem}.{lossless.lower()}-intermediate.gguf"
        hf_to_gguf(
            src,
            intermediate,
            out_type=lossless,
            recipe=options,
            tokenizer_pre=tokenizer_pre,
            progress=progress,
        )
        q = quantize_gguf(
            intermediate, out, name, recipe=options, threads=threads, force=force, progress=progress
        )
    return done("gguf", name, q.warnings)


# Importable modules each conversion step needs, and the extra that installs them.
_TOOLS: dict[str, tuple[tuple[str, ...], str]] = {
    "quantize": (("llama_cpp",), "llama-cpp-python: pip install 'edgekit[gguf]'"),
    "gguf": (("gguf", "numpy"), "the gguf package: pip install 'edgekit[gguf]'"),
    "openvino": (
        ("optimum.intel", "openvino", "openvino_tokenizers", "nncf", "transformers"),
        "optimum-intel and openvino-tokenizers: pip install 'edgekit[openvino]'",
    ),
}


def _require(step: str, what: str) -> None:
    modules, install = _TOOLS[step]
    for module in modules:
        try:
            found = importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):  # a parent package is missing or broken
            found = False
        if not found:
            raise TargetUnavailableError(
                f"{what} needs {install.split(':')[0]} ({module} is not installed)",
                hint=install.split(": ", 1)[1],
            )


def check_conversion(
    spec: ModelSpec,
    src: Path,
    to: str,
    *,
    quant: str | None,
    recipe: Recipe | None,
) -> None:
    """Everything knowable about converting ``src`` (described by ``spec``) to ``to``
    before writing anything: the format, the options, the source kind, the tools.

    ``quant`` is the output format name (upper case; None for ``to="hf"``) and ``recipe``
    the parsed options.

    Raises:
        UnsupportedConversionError: the format, option or source cannot be converted so.
        TargetUnavailableError: a tool the conversion needs is not installed.
    """
    if to == "hf":
        if spec.format != "gguf":
            raise UnsupportedConversionError(
                f"{src} is already a Hugging Face folder", hint="convert it --to gguf"
            )
        if quant:
            raise UnsupportedConversionError(
                "--quant does not apply to --to hf (it writes float32)"
            )
        return
    if to == "openvino":
        _check_openvino(spec, src, quant or "INT4", recipe)
        return
    if to != "gguf":
        raise UnsupportedConversionError(
            f"unknown output format {to!r}", hint="use gguf, openvino or hf"
        )
    name = (quant or "F16").upper()
    if name not in GGUF_FORMATS:
        raise UnsupportedConversionError(
            f"{quant!r} is not a GGUF type edgekit writes",
            hint=f"choose one of {', '.join(GGUF_FORMATS)}",
        )
    if spec.format == "gguf":
        if name in FLOAT_FORMATS:
            raise UnsupportedConversionError(
                f"{src} is already GGUF; converting it to {name} adds nothing",
                hint="quantize it (--quant Q4_K_M, ...) or convert it --to hf",
            )
        _require("quantize", "quantizing a GGUF")
    else:
        _check_hf_weights(spec, src, "GGUF conversion")
        _require("gguf", "writing a GGUF")
        if name not in FLOAT_FORMATS:
            _require("quantize", f"quantizing to {name}")
    if recipe is not None and name not in FLOAT_FORMATS:
        from edgekit.converters.gguf_quantize import _ggml_type

        for what in ("embeddings", "output"):
            value = getattr(recipe, what)
            if value:
                _ggml_type(value, what)


def _check_hf_weights(spec: ModelSpec, src: Path, what: str) -> None:
    if spec.format != "hf" or spec.parameters_source != "tensors":
        raise UnsupportedConversionError(
            f"{src}: {what} needs a Hugging Face folder with safetensors weights",
            hint="a GGUF is converted with --to gguf --quant (requantize) or --to hf",
        )


def _check_openvino(spec: ModelSpec, src: Path, quant: str, recipe: Recipe | None) -> None:
    """OpenVINO export: from a Hugging Face folder (a GGUF source is dequantized to one
    first: the caller checks that step), of a family the pinned exporter handles."""
    from edgekit.converters.openvino_convert import (
        EXPORTABLE,
        KV_PRECISIONS,
        OPENVINO_FORMATS,
        _calibration_texts,
        _quantization_config,
    )

    from edgekit.architectures import FAMILIES

    quant = quant.upper()
    if quant not in OPENVINO_FORMATS:
        raise UnsupportedConversionError(
            f"{quant!r} is not an OpenVINO format edgekit writes",
            hint=f"choose one of {', '.join(OPENVINO_FORMATS)}",
        )
    if spec.format == "hf":
        _check_hf_weights(spec, src, "OpenVINO export")
        if not (src / "tokenizer.json").is_file() and not (src / "tokenizer.model").is_file():
            raise UnsupportedConversionError(
                f"{src}: no tokenizer (tokenizer.json or tokenizer.model)",
                hint="save the tokenizer beside the weights (tokenizer.save_pretrained) first",
            )
    if spec.family not in EXPORTABLE:
        display = next((f.display for f in FAMILIES if f.key == spec.family), spec.family)
        raise UnsupportedConversionError(
            f"{display} cannot be exported to OpenVINO with the pinned optimum-intel",
            hint="use the GGUF target for this model",
        )
    recipe = recipe or Recipe(weights=quant)
    if recipe.kv_cache not in KV_PRECISIONS:
        raise UnsupportedConversionError(
            f"KV-cache type {recipe.kv_cache!r} has no OpenVINO equivalent",
            hint="use f16, q8_0 (u8) or f32",
        )
    _require("openvino", "OpenVINO export")
    _calibration_texts(recipe.calibration)
    if recipe.group_size is not None:
        _quantization_config(quant, recipe, None)  # refuses a group size NNCF lacks
