"""GGUF -> quantized GGUF with llama.cpp's own quantizer (llama_model_quantize).

Recipe controls map onto llama.cpp's switches: ``embeddings`` -> token_embedding_type,
``output`` -> output_tensor_type. Requantizing an already quantized file is allowed but
stacks the two quantization errors, and says so.

llama.cpp copies every metadata key of the source into the output; ``edgekit.recipe`` is
replaced through the quantizer's key overrides with the recipe the output really has
(its weights format, the tensor types asked for, the KV-cache type), so a Q4_K_M file made
from an F16 one does not say F16.
"""

from __future__ import annotations

import ctypes
import logging
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import psutil
from edgekit.converters.gguf.llamacpp_log import route_llamacpp_logs
from edgekit.converters.gguf.table import (
    FLOAT_FORMATS,
    GGUF_FORMATS,
    QUANTIZED_FILE_TYPES,
    RECIPE_KEY,
    ggml_type_id,
    recorded_recipe,
)
from edgekit.converters.recipe import Recipe

from edgekit.atomic import atomic_path, check_destination
from edgekit.errors import ConversionError, TargetUnavailableError, UnsupportedConversionError
from edgekit.ggml_types import LLAMA_FILE_TYPES
from edgekit.gguf_header import read_gguf_header
from edgekit.inspection import spec_from_gguf
from edgekit.progress import ProgressCallback, ProgressEvent, no_progress

log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class QuantizeResult:
    path: Path
    quant: str
    source_file_type: str | None
    warnings: tuple[str, ...]


def quantize_gguf(
    src: str | Path,
    out: str | Path,
    quant: str,
    *,
    recipe: Recipe | None = None,
    threads: int | None = None,
    force: bool = False,
    progress: ProgressCallback = no_progress,
) -> QuantizeResult:
    """Quantize a GGUF file to ``quant`` (Q8_0, Q4_K_M, ...).

    Raises:
        UnsupportedConversionError: an unknown format or recipe tensor type.
        OutputExistsError: ``out`` exists and ``force`` is not set.
        TargetUnavailableError: llama-cpp-python is not installed.
        ConversionError: llama.cpp failed (nothing is left at ``out``).
    """
    src, out = Path(src), Path(out)
    fmt = GGUF_FORMATS.get(quant.upper())
    if fmt is None or fmt.name in FLOAT_FORMATS:
        raise UnsupportedConversionError(
            f"{quant!r} is not a GGUF quantization edgekit offers",
            hint=f"choose one of {', '.join(n for n in GGUF_FORMATS if n not in FLOAT_FORMATS)}",
        )
    check_destination(out, force=force)
    header = read_gguf_header(src)
    spec_from_gguf(header)  # unsupported architecture -> clear error before any work
    source_type = LLAMA_FILE_TYPES.get(header.get("general.file_type"))
    warnings: list[str] = []
    if source_type in QUANTIZED_FILE_TYPES:
        warnings.append(
            f"requantizing a {source_type} file to {fmt.name}: the result carries both "
            "quantization errors; quantize from the F16/BF16/F32 source when you have it"
        )
    try:
        import llama_cpp
    except ImportError as exc:
        raise TargetUnavailableError(
            "quantization needs llama-cpp-python", hint="pip install 'edgekit[gguf]'"
        ) from exc
    route_llamacpp_logs()
    recipe = replace(recipe or Recipe(weights=fmt.name), weights=fmt.name)
    for option in ("group_size", "ratio", "calibration", "soc", "part_gib"):
        if getattr(recipe, option) is not None:
            warnings.append(
                f"recipe {option}={getattr(recipe, option)} has no llama.cpp equivalent: unused"
            )
    params = _params(llama_cpp, fmt.ftype, recipe, threads, source_type)
    # Kept alive until the quantizer returns: llama.cpp reads the array through a pointer.
    overrides = _recipe_override(llama_cpp, recipe)
    params.kv_overrides = overrides

    with atomic_path(out, force=force) as tmp:
        rc = _run_with_heartbeat(
            lambda: llama_cpp.llama_model_quantize(
                str(src).encode(), str(tmp).encode(), ctypes.byref(params)
            ),
            progress,
            fmt.name,
        )
        if rc != 0 or not tmp.is_file():
            raise ConversionError(
                f"llama.cpp could not quantize {src} to {fmt.name} (code {rc})",
                hint="run with -vv to see llama.cpp's log",
            )
        written = read_gguf_header(tmp)
        if written.get("general.file_type") != fmt.ftype:
            raise ConversionError(f"verification failed: {tmp} is not {fmt.name}")
        if written.get(RECIPE_KEY) != recorded_recipe(recipe):
            raise ConversionError(f"verification failed: {tmp} does not record its recipe")
    for w in warnings:
        log.info("%s", w)
    return QuantizeResult(
        path=out, quant=fmt.name, source_file_type=source_type, warnings=tuple(warnings)
    )


def _params(
    llama_cpp: Any, ftype: int, recipe: Recipe, threads: int | None, source_type: str | None
) -> Any:
    """llama.cpp's quantize parameters for ``recipe`` (the key overrides are set apart)."""
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = ftype
    params.nthread = threads or psutil.cpu_count(logical=False) or 1
    params.allow_requantize = source_type in QUANTIZED_FILE_TYPES
    if recipe.embeddings:
        params.token_embedding_type = ggml_type_id(recipe.embeddings, "embeddings")
    if recipe.output:
        params.output_tensor_type = ggml_type_id(recipe.output, "output")
    return params


def _recipe_override(llama_cpp: Any, recipe: Recipe) -> Any:
    """A zero-terminated llama.cpp key-override array that sets ``edgekit.recipe``."""
    value = recorded_recipe(recipe).encode()
    if len(value) >= 128:  # llama_model_kv_override.val_str is char[128]
        raise UnsupportedConversionError(
            f"the recipe {value.decode()!r} is too long to record in the GGUF",
            hint="use shorter tensor type names",
        )
    array = (llama_cpp.llama_model_kv_override * 2)()
    array[0].tag = llama_cpp.LLAMA_KV_OVERRIDE_TYPE_STR
    array[0].key = RECIPE_KEY.encode()
    array[0].value.val_str = value
    return array


def _run_with_heartbeat(fn: object, progress: ProgressCallback, quant: str) -> int:
    """Run the (blocking, C-level) quantizer on a thread, reporting elapsed time.

    llama.cpp reports no per-tensor progress through its API, so the event carries
    elapsed seconds with an unknown total.
    """
    result: list[int] = []
    errors: list[BaseException] = []

    def work() -> None:
        try:
            result.append(int(fn()))  # type: ignore[operator]
        except BaseException as exc:  # re-raised on the caller's thread
            errors.append(exc)

    thread = threading.Thread(target=work, name="edgekit-quantize", daemon=True)
    start = time.monotonic()
    thread.start()
    while thread.is_alive():
        thread.join(0.25)
        progress(
            ProgressEvent(
                stage="quantize",
                done=int(time.monotonic() - start),
                total=None,
                detail=f"quantizing to {quant}",
            )
        )
    if errors:
        raise ConversionError(f"quantization failed: {errors[0]}") from errors[0]
    return result[0]
