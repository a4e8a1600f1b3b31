"""Hugging Face folder (safetensors; fp32, fp16 or bf16) -> GGUF F32 / F16 / BF16.

Everything that can fail is checked before a byte is written: the architecture, every
tensor's GGUF name, the tokenizer and its pre-tokenizer, the RoPE settings. The file is
then written through gguf-py's GGUFWriter in streaming mode (all tensor infos first, then
one tensor's data at a time) into a temporary sibling, read back, and renamed into place.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from edgekit.converters.gguf.arch import (
    ARCHES,
    llama3_rope_factors,
    tensor_name_map,
    transform,
    write_metadata,
)
from edgekit.converters.gguf.table import RECIPE_KEY, recorded_recipe
from edgekit.converters.gguf.tokenizer.specials import general_name
from edgekit.converters.gguf.tokenizer.to_gguf import read_vocab, write_vocab
from edgekit.converters.recipe import Recipe
from edgekit.converters.tensor_io import f32_to_bf16_bits, read_safetensors_f32

from edgekit.architectures import Family, dimensions_from_config, family_for_hf
from edgekit.atomic import atomic_path, check_destination
from edgekit.errors import ConversionError, UnsupportedConversionError
from edgekit.gguf_header import read_gguf_header
from edgekit.inspection import inspect_model, read_config, spec_from_gguf
from edgekit.modelspec import ModelSpec
from edgekit.progress import ProgressCallback, ProgressEvent, no_progress
from edgekit.safetensors_header import TensorLocation, locate_tensors

log = logging.getLogger(__name__)

# output type -> (ggml type of 2-D weights, llama_ftype of the file)
FLOAT_OUTPUTS: dict[str, tuple[int, int]] = {"F32": (0, 0), "F16": (1, 1), "BF16": (30, 32)}
# Tensors a checkpoint may carry that llama.cpp recomputes or does not use.
_SKIP_SUFFIXES = ("rotary_emb.inv_freq",)


@dataclass(frozen=True, kw_only=True)
class _Planned:
    hf_name: str
    gguf_name: str
    shape: tuple[int, ...]
    ggml_type: int
    location: TensorLocation | None  # None: computed (rope_freqs)


def hf_to_gguf(
    src: str | Path,
    out: str | Path,
    *,
    out_type: str = "F16",
    recipe: Recipe | None = None,
    tokenizer_pre: str | None = None,
    force: bool = False,
    progress: ProgressCallback = no_progress,
) -> Path:
    """Convert a Hugging Face model folder to a GGUF file of ``out_type``.

    ``recipe`` is recorded in the file's metadata (``edgekit.recipe``) so the runtime can
    apply its KV-cache type. ``tokenizer_pre`` overrides the detected pre-tokenizer name.

    Raises:
        UnsupportedConversionError: architecture, tensor, tokenizer or option not supported.
        OutputExistsError: ``out`` exists and ``force`` is not set.
        ConversionError: writing or verifying failed (nothing is left at ``out``).
    """
    src, out = Path(src), Path(out)
    if out_type not in FLOAT_OUTPUTS:
        raise UnsupportedConversionError(
            f"GGUF output type {out_type!r} is not a float type",
            hint="write F32, F16 or BF16 here; quantize with quantize_gguf",
        )
    check_destination(out, force=force)
    spec, config, family = _source(src)
    dims = dimensions_from_config(config, family, str(src))
    arch = ARCHES[family.key]
    vocab = read_vocab(src, dims.vocab_size, pre_override=tokenizer_pre)
    for warning in vocab.warnings:
        log.warning("%s", warning)
    plan = _plan(
        src, spec.tensors, arch, dims, FLOAT_OUTPUTS[out_type][0], tied=dims.tied_embeddings
    )

    import gguf

    with atomic_path(out, force=force) as tmp:
        writer = gguf.GGUFWriter(tmp, arch.name)
        try:
            name = str(config.get("_name_or_path") or src.name)
            writer.add_name(general_name(name, phi3_rstrip=vocab.phi3_rstrip))
            writer.add_file_type(FLOAT_OUTPUTS[out_type][1])
            writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
            scaling = write_metadata(writer, family, config, dims)
            write_vocab(writer, vocab)
            if recipe is not None:
                writer.add_string(RECIPE_KEY, recorded_recipe(recipe))
            if scaling.get("type") == "llama3":
                plan.append(
                    _Planned(
                        hf_name="rope_freqs",
                        gguf_name="rope_freqs.weight",
                        shape=(dims.head_dim // 2,),
                        ggml_type=0,
                        location=None,
                    )
                )
            _add_tensor_infos(writer, plan)
            writer.write_header_to_file()
            writer.write_kv_data_to_file()
            writer.write_ti_data_to_file()
            _write_tensors(writer, plan, arch, dims, progress, rope=(scaling, config))
        except OSError as exc:
            raise ConversionError(
                f"writing {out} failed: {exc}", hint="check free disk space"
            ) from exc
        finally:
            writer.close()
        _verify(tmp, plan)
    log.info("wrote %s (%s, %d tensors)", out, out_type, len(plan))
    return out


def _source(src: Path) -> tuple[ModelSpec, dict[str, Any], Family]:
    """The Hugging Face folder's spec, config and family, refused when edgekit cannot
    write it as GGUF."""
    spec = inspect_model(src)
    if spec.format != "hf" or spec.parameters_source != "tensors":
        raise UnsupportedConversionError(
            f"{src}: needs a Hugging Face folder with safetensors weights",
            hint="a GGUF is converted with --to gguf --quant (requantize) or --to hf",
        )
    config: dict[str, Any] = read_config(src)
    family = family_for_hf(config.get("model_type"), config.get("architectures"))
    if "text_config" in config:
        raise UnsupportedConversionError(
            f"{src}: a multimodal {family.display} checkpoint; edgekit converts the text model",
            hint="export the language model alone (e.g. Gemma3ForCausalLM) and convert that",
        )
    return spec, config, family


def _add_tensor_infos(writer: Any, plan: list[_Planned]) -> None:
    import gguf

    for p in plan:
        dtype = (
            np.dtype(np.uint16)
            if p.ggml_type == 30
            else np.dtype(np.float16 if p.ggml_type == 1 else np.float32)
        )
        nbytes = int(np.prod(p.shape, dtype=np.int64)) * dtype.itemsize
        writer.add_tensor_info(
            p.gguf_name,
            p.shape,
            dtype,
            nbytes,
            raw_dtype=gguf.GGMLQuantizationType(p.ggml_type),
        )


def _write_tensors(
    writer: Any,
    plan: list[_Planned],
    arch: Any,
    dims: Any,
    progress: ProgressCallback,
    *,
    rope: tuple[dict[str, Any], dict[str, Any]],
) -> None:
    """Each planned tensor, read one at a time from the safetensors (rope_freqs computed
    from ``rope``: the scaling settings and the model config), in the file's order."""
    for i, p in enumerate(plan):
        if p.location is None:
            scaling, config = rope
            theta = float(config.get("rope_theta") or 10000.0)
            data = np.asarray(llama3_rope_factors(scaling, dims.head_dim, theta), np.float32)
        else:
            data = transform(p.hf_name, read_safetensors_f32(p.location), arch, dims)
        writer.write_tensor_data(_narrow(data, p.ggml_type))
        progress(ProgressEvent(stage="convert", done=i + 1, total=len(plan), detail=p.gguf_name))


def _plan(
    src: Path, tensors: Any, arch: Any, dims: Any, weight_type: int, *, tied: bool
) -> list[_Planned]:
    name_map = tensor_name_map(arch, dims.layers)
    locations = locate_tensors(src)
    planned: list[_Planned] = []
    unmapped: list[str] = []
    for t in tensors:
        if t.name.endswith(_SKIP_SUFFIXES) or (tied and t.name == "lm_head.weight"):
            continue
        gguf_name = name_map.get_name(t.name, try_suffixes=(".weight", ".bias"))
        if gguf_name is None:
            unmapped.append(t.name)
            continue
        if t.dtype not in ("F32", "F16", "BF16"):
            raise UnsupportedConversionError(
                f"{src}: tensor {t.name} is {t.dtype}; edgekit converts float checkpoints",
                hint="dequantize the checkpoint to fp16/bf16 first",
            )
        # llama.cpp keeps 1-D tensors (norms, biases) in F32 whatever the file type.
        ggml_type = weight_type if len(t.shape) > 1 else 0
        planned.append(
            _Planned(
                hf_name=t.name,
                gguf_name=gguf_name,
                shape=t.shape,
                ggml_type=ggml_type,
                location=locations[t.name],
            )
        )
    if unmapped:
        shown = ", ".join(unmapped[:5]) + (
            f" and {len(unmapped) - 5} more" if len(unmapped) > 5 else ""
        )
        raise UnsupportedConversionError(
            f"{src}: tensors with no GGUF name for the {arch.name} architecture: {shown}",
            hint="the checkpoint carries parts llama.cpp cannot run (adapters, vision towers?)",
        )
    return planned


def _narrow(data: np.ndarray, ggml_type: int) -> np.ndarray:
    if ggml_type == 1:
        return data.astype(np.float16)
    if ggml_type == 30:
        return f32_to_bf16_bits(data)
    return np.ascontiguousarray(data, dtype=np.float32)


def _verify(path: Path, plan: list[_Planned]) -> None:
    header = read_gguf_header(path)
    if len(header.tensors) != len(plan):
        raise ConversionError(
            f"verification failed: {len(header.tensors)} tensors written, {len(plan)} planned"
        )
    spec_from_gguf(header)  # every key llama.cpp needs to load is present
