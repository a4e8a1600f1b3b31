"""Hugging Face folder -> ONNX for ONNX Runtime GenAI's CPU execution provider, with the
onnxruntime-genai model builder (``onnxruntime_genai.models.builder``), called in-process.

Why the builder: it writes the graph ONNX Runtime GenAI runs as it is (GroupQueryAttention
with a KV cache, RoPE caches, MatMulNBits weight-only quantization), plus genai_config.json
and the tokenizer files. ``torch.onnx.export(dynamo=True)`` gives a plain graph that still
needs the KV-cache wiring, the GQA fusion, the quantizer and the GenAI config written by
hand; optimum-onnx cannot be installed beside optimum-intel 2.x (transformers < 4.58).

Quantizations and what they map to in the builder:

    FP32   --precision fp32: every weight f32 (the parity reference)
    INT8   --precision int8: MatMulNBits bits=8, symmetric, blocks of 32 (block_size)
    INT4   --precision int4: MatMulNBits bits=4, symmetric, blocks of 32 (block_size)

In INT8 and INT4 every MatMul is quantized, lm_head included, with accuracy_level 4 (the
CPU default: activations quantized to int8 inside MatMulNBits); the embedding stays f32
(a tied one shares lm_head's blocks in INT4). The recipe's group size is the block size
(16, 32, 64, 128 or 256). The CPU graph keeps its KV cache in f32 (its I/O type): the
vocabulary's default ``kv_cache=f16`` names no other choice the builder has, and any
quantized KV cache (which needs calibrated scales) is refused, as are ``embeddings``,
``output``, ``ratio`` and ``calibration``, which the builder's CPU path cannot express.

The builder's output gets the source's config.json (and generation_config.json) beside
it, so ``inspect_model`` describes the variant folder from its config, and ``edgekit.json``
recording what was built (the block size the layout needs).
"""

from __future__ import annotations

import json
import logging
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgekit.converters.edge_checks import Tool, check_hf_tokenizer, require
from edgekit.converters.onnx.layout import DEFAULT_BLOCK, check_block_size
from edgekit.converters.onnx.socs import Soc, require_soc
from edgekit.converters.quiet import quiet_builder
from edgekit.converters.recipe import Recipe, set_options

from edgekit.atomic import atomic_path, check_destination, work_dir, write_new
from edgekit.errors import ConversionError, EdgekitError, UnsupportedConversionError
from edgekit.inspection import inspect_model, read_config
from edgekit.progress import ProgressCallback, ProgressEvent, no_progress
from edgekit.safetensors_header import model_file
from edgekit.untrusted import parse_json

log = logging.getLogger(__name__)

# The builder reads the Hugging Face folder with torch and transformers: the reference
# extra, beside the onnx extra (running a built model needs the onnx extra only).
BUILDER = Tool(
    modules=("onnxruntime_genai", "onnxruntime", "onnx", "onnx_ir", "torch", "transformers"),
    package="onnxruntime-genai, onnx-ir, torch and transformers",
    install="pip install 'edgekit[onnx,reference]'",
)
# The builder dispatches on config.architectures[0]: the classes of edgekit's families it
# has (onnxruntime-genai 0.18.0), each checked against transformers by the parity tests.
ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
    "Phi3ForCausalLM": "phi3",
    "Gemma3ForCausalLM": "gemma3",
}
BUILDABLE = frozenset(ARCHITECTURES.values())
PRECISIONS = {"FP32": "fp32", "INT8": "int8", "INT4": "int4"}
# QNN HTP variants (htp_build): built from the builder's FP32 graph, for one Snapdragon SoC
HTP_QUANTS = ("W16A16", "W8A16", "FP16")
KV_CACHE = ("f32", "f16")  # both mean the CPU graph's f32 cache (see above)
SETTINGS_FILE = "edgekit.json"
NEEDED = ("model.onnx", "genai_config.json", "tokenizer.json")
COPIED = ("config.json", "generation_config.json")
_GENAI_CONFIG_MAX = 1 << 20


@dataclass(frozen=True, kw_only=True)
class BuildOptions:
    """A quantization and recipe, checked and mapped onto the builder's switches."""

    quant: str  # FP32, INT8, INT4
    precision: str  # the builder's --precision
    block_size: int | None  # None: FP32 (no blocks)
    recipe: Recipe
    soc: Soc | None = None  # an HTP quant's SoC (None: a CPU build)
    part_gib: float | None = None  # an HTP quant's per-part limit

    def extra_options(self) -> list[str]:
        # hf_token=false: a local folder needs no Hugging Face login, and none is looked up
        options = ["hf_token=false"]
        if self.block_size is not None:
            options.append(f"block_size={self.block_size}")
        return options


@dataclass(frozen=True, kw_only=True)
class OnnxResult:
    path: Path
    quant: str
    block_size: int | None
    warnings: tuple[str, ...]


def build_options(quant: str | None, recipe: Recipe | None) -> BuildOptions:
    """``quant`` (default INT4) and ``recipe`` as builder switches.

    Raises:
        UnsupportedConversionError: a quantization or recipe option the builder's CPU
            path cannot express.
    """
    name = (quant or "INT4").upper()
    if name in HTP_QUANTS:
        return _htp_options(name, recipe or Recipe(weights=name))
    precision = PRECISIONS.get(name)
    if precision is None:
        raise UnsupportedConversionError(
            f"{name!r} is not an ONNX quantization edgekit builds",
            hint=f"choose one of {', '.join((*PRECISIONS, *HTP_QUANTS))}",
        )
    recipe = recipe or Recipe(weights=name)
    device = [
        f"{k}={v}" for k, v in (("soc", recipe.soc), ("part_gib", recipe.part_gib)) if v is not None
    ]
    if device:
        raise UnsupportedConversionError(
            f"{name} is a CPU build: {', '.join(device)} does not apply",
            hint=f"drop them, or build an HTP variant ({' or '.join(HTP_QUANTS)}) for that SoC",
        )
    unsupported = set_options(
        ("embeddings", recipe.embeddings),
        ("output", recipe.output),
        ("ratio", recipe.ratio),
        ("calibration", recipe.calibration),
    )
    if unsupported:
        raise UnsupportedConversionError(
            f"the onnxruntime-genai builder cannot express {', '.join(unsupported)}",
            hint="leave them unset: the embedding stays f32 (a tied one shares lm_head's "
            "blocks in INT4), lm_head is quantized like the other matrices, weight-only RTN",
        )
    if recipe.kv_cache not in KV_CACHE:
        raise UnsupportedConversionError(
            f"KV-cache type {recipe.kv_cache!r} has no equivalent in the ONNX CPU build",
            hint="the CPU graph keeps its KV cache in f32: use kv_cache=f32 (or f16, the default)",
        )
    block: int | None = None
    if name != "FP32":
        block = check_block_size(recipe.group_size or DEFAULT_BLOCK)
    elif recipe.group_size is not None:
        raise UnsupportedConversionError(
            "FP32 has no quantization blocks: group_size does not apply",
            hint="drop group_size, or build INT8 / INT4",
        )
    return BuildOptions(quant=name, precision=precision, block_size=block, recipe=recipe)


def _htp_options(name: str, recipe: Recipe) -> BuildOptions:
    """An HTP quant's options: a known SoC, a part size, nothing the HTP build ignores.

    Raises:
        UnsupportedConversionError: no or an unknown soc, a bad part_gib, or a recipe
            value the HTP build cannot express.
    """
    from edgekit.converters.onnx.htp_split import check_part_gib

    if recipe.soc is None:
        raise UnsupportedConversionError(
            f"{name} is a QNN HTP variant: it is compiled for one Snapdragon SoC",
            hint="name it: --recipe soc=SM8750 (or pack --device with a Snapdragon profile)",
        )
    soc = require_soc(recipe.soc)
    part_gib = check_part_gib(recipe.part_gib)
    unsupported = set_options(
        ("embeddings", recipe.embeddings),
        ("output", recipe.output),
        ("group_size", recipe.group_size),
        ("ratio", recipe.ratio),
        ("calibration", recipe.calibration if name == "FP16" else None),
    )
    if unsupported:
        raise UnsupportedConversionError(
            f"the {name} HTP build cannot express {', '.join(unsupported)}",
            hint="W16A16 / W8A16: per-tensor uint16 / uint8 weights, uint16 activations, the "
            "embedding f32 on the CPU, calibration=FILE the only option; FP16 is not "
            "calibrated",
        )
    if recipe.kv_cache not in KV_CACHE:
        raise UnsupportedConversionError(
            f"KV-cache type {recipe.kv_cache!r} has no equivalent in the HTP build",
            hint="the HTP graphs keep their KV cache in f32 I/O: use kv_cache=f32 (or f16)",
        )
    if recipe.calibration is not None:
        from edgekit.converters.onnx.htp_quantize import calibration_text

        calibration_text(recipe.calibration)  # a file that is not text is refused now
    return BuildOptions(
        quant=name, precision="fp32", block_size=None, recipe=recipe, soc=soc, part_gib=part_gib
    )


def check_config(config: dict[str, Any], where: str) -> str:
    """The family of a Hugging Face config the builder handles.

    Raises:
        UnsupportedConversionError: an architecture the builder has no class for, a
            pre-quantized checkpoint, or a Phi-3 config the builder would misread.
    """
    archs = config.get("architectures")
    arch = archs[0] if isinstance(archs, list) and archs and isinstance(archs[0], str) else None
    family = ARCHITECTURES.get(arch or "")
    if family is None:
        raise UnsupportedConversionError(
            f"{where}: architecture {arch!r} is not one edgekit builds to ONNX",
            hint=f"the onnxruntime-genai builder path covers {', '.join(ARCHITECTURES)}",
        )
    if config.get("quantization_config") is not None:
        raise UnsupportedConversionError(
            f"{where}: a pre-quantized checkpoint (quantization_config)",
            hint="build from the float checkpoint",
        )
    if family == "phi3":
        _check_phi3_rope(config, where)
    if family == "gemma3":
        _check_gemma3_rope(config, where)
    return family


def _check_gemma3_rope(config: dict[str, Any], where: str) -> None:
    """Plain RoPE only: the builder's Gemma 3 class applies no scaling to the global
    layers (Gemma 3 4B's linear factor 8 would be lost). transformers 4 writes
    ``rope_scaling``; transformers 5 nests ``rope_parameters`` per layer type."""
    kinds: set[str] = set()
    scaling = config.get("rope_scaling")
    if isinstance(scaling, dict):
        kinds.add(str(scaling.get("rope_type") or scaling.get("type") or "default"))
    rope = config.get("rope_parameters")
    if isinstance(rope, dict):
        nested = [v for v in rope.values() if isinstance(v, dict)]
        for part in nested or [rope]:
            kinds.add(str(part.get("rope_type") or "default"))
    if kinds - {"default"}:
        raise UnsupportedConversionError(
            f"{where}: Gemma 3 with scaled RoPE ({', '.join(sorted(kinds))})",
            hint="edgekit builds Gemma 3 models with plain RoPE (270M, 1B) to ONNX",
        )


def _check_phi3_rope(config: dict[str, Any], where: str) -> None:
    """The builder takes a Phi-3 whose max_position_embeddings differs from
    original_max_position_embeddings for a LongRoPE model and reads its factors; without
    them it fails half-way (KeyError 'multi_cache')."""
    longest, original = (
        config.get("max_position_embeddings"),
        config.get("original_max_position_embeddings"),
    )
    rope = config.get("rope_scaling") or config.get("rope_parameters") or {}
    kind = (rope.get("rope_type") or rope.get("type")) if isinstance(rope, dict) else None
    if original is not None and longest != original and kind != "longrope":
        raise UnsupportedConversionError(
            f"{where}: max_position_embeddings {longest} differs from "
            f"original_max_position_embeddings {original} without LongRoPE factors",
            hint="the builder reads such a Phi-3 as LongRoPE: set both to the same context "
            "(as Phi-3-mini-4k does) or give rope_scaling its long/short factors",
        )


def hf_to_onnx(
    src: str | Path,
    out: str | Path,
    quant: str = "INT4",
    *,
    recipe: Recipe | None = None,
    force: bool = False,
    progress: ProgressCallback = no_progress,
    context: int | None = None,
) -> OnnxResult:
    """Build ``src`` (a Hugging Face folder) as an onnxruntime-genai CPU model at ``out``;
    an HTP quant (W8A16, FP16, with ``recipe.soc``) goes to ``htp_build.hf_to_htp``, its
    static KV cache ``context`` long (the CPU model's grows as it goes: unused there).

    Raises:
        UnsupportedConversionError: unknown quantization, recipe option, architecture, no
            tokenizer, not a Hugging Face folder with weights (checked before any work).
        TargetUnavailableError: onnxruntime-genai (or onnx-ir, torch, transformers) is
            not installed.
        OutputExistsError: ``out`` exists and ``force`` is not set.
        ConversionError: the builder failed; nothing is left at ``out``.
    """
    src, out = Path(src), Path(out)
    options = build_options(quant, recipe)
    if options.soc is not None:  # a QNN HTP variant
        from edgekit.converters.onnx.htp_build import hf_to_htp

        return hf_to_htp(
            src,
            out,
            options.quant,
            recipe=options.recipe,
            force=force,
            progress=progress,
            context=context,
        )
    check_destination(out, force=force)
    check_source(src)
    require(BUILDER, "ONNX export")
    total = 3
    with work_dir(out, "tmp") as cache, atomic_path(out, force=force) as tmp:
        progress(
            ProgressEvent(stage="build", done=0, total=total, detail="onnxruntime-genai builder")
        )
        _run_builder(src, tmp, cache, options)
        progress(ProgressEvent(stage="build", done=1, total=total, detail="checking the output"))
        _verify(tmp)
        for name in COPIED:
            if (src / name).exists():
                shutil.copyfile(model_file(src, name), tmp / name)
        write_new(tmp / SETTINGS_FILE, json.dumps(_settings(options), indent=2))
        inspect_model(tmp)  # the variant folder is described from its config
        progress(ProgressEvent(stage="build", done=total, total=total, detail="verified"))
    return OnnxResult(path=out, quant=options.quant, block_size=options.block_size, warnings=())


def check_source(src: Path) -> str:
    """A Hugging Face folder with safetensors weights and a tokenizer, of an architecture
    the builder handles; returns its family.

    Raises:
        UnsupportedConversionError: any of that does not hold.
    """
    spec = inspect_model(src)
    if spec.format != "hf" or spec.parameters_source != "tensors":
        raise UnsupportedConversionError(
            f"{src}: ONNX export needs a Hugging Face folder with weights",
            hint="convert a GGUF to a Hugging Face folder first: edgekit convert M.gguf --to hf",
        )
    check_hf_tokenizer(src)
    return check_config(read_config(src), str(src))


def _run_builder(src: Path, tmp: Path, cache: Path, options: BuildOptions) -> None:
    """The builder, in-process, its prints and progress bars sent to the debug log."""
    with quiet_builder() as output:
        try:
            from onnxruntime_genai.models.builder import create_model, parse_extra_options

            extra = parse_extra_options(
                None,
                str(src),
                str(tmp),
                options.precision,
                "cpu",
                str(cache),
                options.extra_options(),
            )
            _fill_config(extra["hf_details"]["hf_config"])
            create_model(None, str(src), str(tmp), options.precision, "cpu", str(cache), **extra)
            _source_tokenizer(src, tmp)
        except EdgekitError:
            raise
        except MemoryError as exc:
            raise ConversionError(
                f"ONNX build of {src} ran out of memory",
                hint="the builder holds the whole model in f32: free memory, or build elsewhere",
            ) from exc
        except Exception as exc:  # the builder raises bare Exception, KeyError, ValueError...
            last = " | ".join(output.tail)
            raise ConversionError(
                f"ONNX build of {src} failed: {type(exc).__name__}: {exc}",
                hint=f"the builder said: {last}"
                if last
                else "edgekit -vv convert ... shows the builder's log",
            ) from exc


# what the variant's tokenizer is read from: the session (tokenizers) and ONNX Runtime
# GenAI's own tokenizer read tokenizer.json, with tokenizer_config.json's special tokens
SOURCE_TOKENIZER = ("tokenizer.json", "tokenizer_config.json")


def _source_tokenizer(src: Path, out: Path) -> None:
    """Put the source's own tokenizer files over the ones the builder re-saved. The
    builder loads the tokenizer with transformers' AutoTokenizer and saves it again, which
    rebuilds tokenizer.json from the class tokenizer_config.json names: SmolLM2 exported
    from its GGUF names CodeLlamaTokenizer and came out as a Metaspace (SentencePiece-style)
    tokenizer over its byte-level BPE vocabulary, 1.75x the tokens on English text. The
    source's tokenizer.json is the model's own (byte-level, as its GGUF says)."""
    for name in SOURCE_TOKENIZER:
        if (src / name).is_file():
            shutil.copyfile(model_file(src, name), out / name)


def _fill_config(config: Any) -> None:
    """What the builder's Gemma 3 class reads under transformers 4 names. transformers 5
    nests RoPE per layer type (``rope_parameters.full_attention`` / ``.sliding_attention``)
    and leaves ``rope_theta`` None and ``rope_local_base_freq`` unset; the builder's Gemma 4
    class reads the same values from there. Only plain RoPE is taken: the builder would
    not apply a scaled one (Gemma 3 4B's linear factor 8) to the global layers.

    Raises:
        UnsupportedConversionError: a Gemma 3 config whose RoPE the builder would misread.
    """
    if getattr(config, "model_type", "") != "gemma3_text":
        return
    rope = getattr(config, "rope_parameters", None)
    if not isinstance(rope, dict) or "full_attention" not in rope:
        return  # transformers 4 names: the builder reads them as they are
    full, local = rope.get("full_attention") or {}, rope.get("sliding_attention") or {}
    kinds = {full.get("rope_type", "default"), local.get("rope_type", "default")}
    if kinds != {"default"} or full.get("rope_theta") is None or local.get("rope_theta") is None:
        raise UnsupportedConversionError(
            f"this Gemma 3 config's RoPE ({sorted(kinds)}) is not one the builder reads right",
            hint="edgekit builds Gemma 3 models with plain RoPE (270M, 1B) to ONNX",
        )
    if getattr(config, "rope_theta", None) is None:
        config.rope_theta = full["rope_theta"]
    if getattr(config, "rope_local_base_freq", None) is None:
        config.rope_local_base_freq = local["rope_theta"]


def _settings(options: BuildOptions) -> dict[str, Any]:
    from importlib.metadata import version

    return {
        "quant": options.quant,
        "block_size": options.block_size,
        "execution_provider": "cpu",
        "accuracy_level": 4 if options.block_size is not None else None,
        "kv_cache": "f32",
        "recipe": options.recipe.to_json(),
        "builder": f"onnxruntime-genai {version('onnxruntime-genai')}",
    }


def _verify(folder: Path) -> None:
    missing = [n for n in NEEDED if not (folder / n).is_file()]
    if missing:
        raise ConversionError(f"verification failed: the ONNX build lacks {', '.join(missing)}")
    path = folder / "genai_config.json"
    config = parse_json(
        path.read_bytes(), where=str(path), max_bytes=_GENAI_CONFIG_MAX, error=ConversionError
    )
    decoder = config.get("model", {}).get("decoder", {}) if isinstance(config, dict) else {}
    if not isinstance(decoder, dict) or decoder.get("filename") != "model.onnx":
        raise ConversionError(f"verification failed: {path} names no model.onnx decoder")
