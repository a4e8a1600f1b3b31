"""convert_model: one entry point for every conversion the CLI's ``convert`` offers.

    HF folder -> OpenVINO IR F16/INT8/INT4/INT4_SYM  (hf_to_openvino, NNCF compression)
    HF folder -> GGUF F32/F16/BF16               (hf_to_gguf)
    HF folder -> GGUF quantized                  (hf_to_gguf to a lossless intermediate,
                                                  then llama.cpp's quantizer)
    GGUF      -> GGUF quantized (requantize)     (quantize_gguf, with a stacked-error warning)
    GGUF      -> HF folder (dequantize)          (gguf_to_hf)

Names and options are validated before any file is written.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from edgekit.converters.gguf_formats import FLOAT_FORMATS, GGUF_FORMATS
from edgekit.converters.gguf_quantize import quantize_gguf
from edgekit.converters.gguf_to_hf import gguf_to_hf
from edgekit.converters.hf_to_gguf import hf_to_gguf
from edgekit.converters.recipe import Recipe

from edgekit.atomic import check_destination
from edgekit.errors import UnsupportedConversionError
from edgekit.inspection import inspect_model
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
    if to == "hf":
        if spec.format != "gguf":
            raise UnsupportedConversionError(
                f"{src} is already a Hugging Face folder", hint="convert it --to gguf"
            )
        if quant:
            raise UnsupportedConversionError(
                "--quant does not apply to --to hf (it writes float32)"
            )
        r = gguf_to_hf(src, out, force=force, progress=progress)
        return done("hf", None, r.warnings)
    if to == "openvino":
        from edgekit.converters.openvino_convert import hf_to_openvino

        name = (quant or "INT4").upper()
        options = Recipe(weights=name).with_options(recipe)
        exported = hf_to_openvino(src, out, name, recipe=options, force=force, progress=progress)
        return done("openvino", name, exported.warnings)
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
    options = Recipe(weights=name).with_options(recipe)
    if spec.format == "gguf":
        if name in FLOAT_FORMATS:
            raise UnsupportedConversionError(
                f"{src} is already GGUF; converting it to {name} adds nothing",
                hint="quantize it (--quant Q4_K_M, ...) or convert it --to hf",
            )
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
    # Quantize from a lossless intermediate in the source's own precision.
    lossless = spec.dtype if spec.dtype in FLOAT_FORMATS else "F32"
    intermediate = out.with_name(f".{out.name}.{lossless.lower()}-intermediate.gguf")
    try:
        hf_to_gguf(
            src,
            intermediate,
            out_type=lossless,
            recipe=options,
            tokenizer_pre=tokenizer_pre,
            force=True,
            progress=progress,
        )
        q = quantize_gguf(
            intermediate, out, name, recipe=options, threads=threads, force=force, progress=progress
        )
    finally:
        intermediate.unlink(missing_ok=True)
    return done("gguf", name, q.warnings)
