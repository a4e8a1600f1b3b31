"""Hugging Face folder -> OpenVINO IR, with NNCF weight compression (through optimum-intel).

Formats and what they map to in NNCF (``OVWeightQuantizationConfig``):

    F16        no NNCF compression; every float constant is stored as f16 (openvino's
               compress_to_fp16, what ``optimum-cli export openvino --weight-format fp16``
               writes: the weights, and also the norms and the RoPE frequencies),
               whatever the source's float type
    INT8       8-bit asymmetric, per output channel
    INT4       4-bit asymmetric, group-wise (group 128; 64 with group_size=64): CPU and GPU
    INT4_SYM   4-bit symmetric, per channel (group_size=128 for groups): what NPUs run

In every compressed format NNCF keeps the embedding and the output projection at INT8
(its "backup" precision) unless told otherwise, and ``ratio`` < 1 keeps that share of the
other layers at INT8 too. With ``calibration`` (a local text file) compression is
data-aware: AWQ and scale estimation use activations on that text.

The tokenizer and detokenizer are converted with openvino-tokenizers, so the result runs
under openvino-genai without transformers. Options a recipe names that NNCF cannot
express are returned as warnings, never dropped silently.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgekit.converters.edge_checks import check_hf_tokenizer
from edgekit.converters.recipe import Recipe

from edgekit.architectures import family_for_hf
from edgekit.atomic import atomic_path, check_destination
from edgekit.errors import ConversionError, TargetUnavailableError, UnsupportedConversionError
from edgekit.inspection import inspect_model
from edgekit.progress import ProgressCallback, ProgressEvent, no_progress

log = logging.getLogger(__name__)

OPENVINO_FORMATS = ("F16", "INT8", "INT4", "INT4_SYM")
# Families optimum-intel 2.1.0 exports with the pinned transformers 5.5.4. Gemma 3's exporter
# refuses transformers > 5.0 (checked here, so the refusal comes before any work).
EXPORTABLE = {"llama", "mistral", "qwen2", "qwen3", "phi3"}
# KV-cache names of the shared recipe vocabulary -> OpenVINO's KV_CACHE_PRECISION
KV_PRECISIONS = {"f32": "f32", "f16": "f16", "bf16": "bf16", "q8_0": "u8", "u8": "u8"}
SETTINGS_FILE = "edgekit.json"
CALIBRATION_SAMPLES = 64
CALIBRATION_CHARS = 2000


@dataclass(frozen=True, kw_only=True)
class OpenVinoResult:
    path: Path
    quant: str
    warnings: tuple[str, ...]


def _quantization_config(
    quant: str, recipe: Recipe, calibration: list[str] | None
) -> tuple[Any, list[str]]:
    from optimum.intel import OVWeightQuantizationConfig

    warnings: list[str] = []
    for what, value in (("soc", recipe.soc), ("part_gib", recipe.part_gib)):
        if value is not None:
            warnings.append(f"recipe {what}={value} is for Qualcomm HTP builds: unused")
    for what, value in (("embeddings", recipe.embeddings), ("output", recipe.output)):
        if value and value.upper() not in ("INT8", "Q8_0"):
            warnings.append(
                f"recipe {what}={value} cannot be expressed in NNCF weight compression: the "
                f"{what} stay at INT8, NNCF's backup precision"
            )
    if quant == "F16":
        if recipe.group_size or recipe.ratio or calibration:
            warnings.append("F16 compresses nothing: group_size, ratio and calibration are unused")
        return None, warnings
    if quant == "INT8":
        if recipe.group_size or recipe.ratio:
            warnings.append("INT8 is per-channel: group_size and ratio are unused")
        return OVWeightQuantizationConfig(bits=8, sym=False, group_size=-1), warnings
    kwargs: dict[str, Any] = {
        "bits": 4,
        "sym": quant == "INT4_SYM",
        "group_size": group_size_for(quant, recipe),
        "ratio": recipe.ratio or 1.0,
        "group_size_fallback": "adjust",
    }
    if calibration:
        kwargs.update(
            dataset=calibration,
            quant_method="awq",
            scale_estimation=True,
            num_samples=len(calibration),
        )
    return OVWeightQuantizationConfig(**kwargs), warnings


def group_size_for(quant: str, recipe: Recipe) -> int:
    """The NNCF group size of a 4-bit format (-1: per channel).

    Raises:
        UnsupportedConversionError: the recipe asks for a size NNCF lacks.
    """
    group = recipe.group_size or (-1 if quant == "INT4_SYM" else 128)
    if group not in (-1, 32, 64, 128, 256):
        raise UnsupportedConversionError(
            f"group_size={group} is not one NNCF supports", hint="use 64, 128 (or -1: per channel)"
        )
    return group


def calibration_texts(path: str | None) -> list[str] | None:
    """The chunks of a calibration text file NNCF compresses with (None: no file).

    Raises:
        UnsupportedConversionError: the file is missing or empty.
    """
    if not path:
        return None
    file = Path(path)
    if not file.is_file():
        raise UnsupportedConversionError(f"calibration text {file} does not exist")
    text = file.read_text(encoding="utf-8", errors="replace")
    chunks = [text[i : i + CALIBRATION_CHARS] for i in range(0, len(text), CALIBRATION_CHARS)]
    chunks = [c for c in chunks if c.strip()][:CALIBRATION_SAMPLES]
    if not chunks:
        raise UnsupportedConversionError(f"calibration text {file} is empty")
    return chunks


def hf_to_openvino(
    src: str | Path,
    out: str | Path,
    quant: str = "INT4",
    *,
    recipe: Recipe | None = None,
    force: bool = False,
    progress: ProgressCallback = no_progress,
) -> OpenVinoResult:
    """Export ``src`` to OpenVINO IR at ``out`` (a folder), compressing weights as ``quant``.

    Raises:
        UnsupportedConversionError: unknown format, unsupported architecture, no tokenizer,
            a source that is not a Hugging Face folder (checked before any work).
        TargetUnavailableError: optimum-intel / openvino-tokenizers are not installed.
        OutputExistsError: ``out`` exists and ``force`` is not set.
        ConversionError: the export failed; nothing is left at ``out``.
    """
    src, out = Path(src), Path(out)
    quant = quant.upper()
    if quant not in OPENVINO_FORMATS:
        raise UnsupportedConversionError(
            f"{quant!r} is not an OpenVINO format edgekit writes",
            hint=f"choose one of {', '.join(OPENVINO_FORMATS)}",
        )
    check_destination(out, force=force)
    _check_source(src)
    recipe = recipe or Recipe(weights=quant)
    kv = KV_PRECISIONS.get(recipe.kv_cache)
    if kv is None:
        raise UnsupportedConversionError(
            f"KV-cache type {recipe.kv_cache!r} has no OpenVINO equivalent",
            hint="use f16, q8_0 (u8) or f32",
        )
    calibration = calibration_texts(recipe.calibration)
    try:
        import openvino  # noqa: F401
        import openvino_tokenizers  # noqa: F401
        import optimum.intel  # noqa: F401
        import transformers  # noqa: F401
    except ImportError as exc:
        raise TargetUnavailableError(
            f"OpenVINO export needs optimum-intel and openvino-tokenizers ({exc.name} is missing)",
            hint="pip install 'edgekit[openvino]'",
        ) from exc
    qconfig, warnings = _quantization_config(quant, recipe, calibration)

    with atomic_path(out, force=force) as tmp, _quiet_export():
        try:
            _export(src, tmp, qconfig, progress)
        except (RuntimeError, ValueError, OSError) as exc:
            raise ConversionError(f"OpenVINO export of {src} failed: {exc}") from exc
        _verify(tmp)
        progress(ProgressEvent(stage="export", done=2, total=3, detail="choosing the precision"))
        _return_freed_memory()
        precision, check = choose_cpu_precision(tmp)
        settings = {
            "quant": quant,
            "recipe": recipe.to_json(),
            "kv_cache_precision": kv,
            "inference_precision": precision,
            "precision_check": check,
            "warnings": warnings,
        }
        (tmp / SETTINGS_FILE).write_text(json.dumps(settings, indent=2))
        progress(ProgressEvent(stage="export", done=3, total=3, detail="verified"))
    for w in warnings:
        log.info("%s", w)
    return OpenVinoResult(path=out, quant=quant, warnings=tuple(warnings))


def _export(src: Path, tmp: Path, qconfig: Any, progress: ProgressCallback) -> None:
    """The model (compressed by ``qconfig``; None: f16) and its tokenizer models, into
    ``tmp``."""
    import openvino as ov
    from openvino_tokenizers import convert_tokenizer
    from optimum.intel import OVModelForCausalLM
    from transformers import AutoTokenizer

    progress(ProgressEvent(stage="export", done=0, total=3, detail="tracing the model"))
    if qconfig is None:
        _export_f16(src, tmp)
    else:
        model = OVModelForCausalLM.from_pretrained(
            src,
            export=True,
            compile=False,
            load_in_8bit=False,
            quantization_config=qconfig,
        )
        model.save_pretrained(tmp)
        del model
    progress(ProgressEvent(stage="export", done=1, total=3, detail="tokenizer"))
    hf_tokenizer = AutoTokenizer.from_pretrained(src)
    tokenizer, detokenizer = convert_tokenizer(hf_tokenizer, with_detokenizer=True)
    ov.save_model(tokenizer, tmp / "openvino_tokenizer.xml")
    ov.save_model(detokenizer, tmp / "openvino_detokenizer.xml")
    hf_tokenizer.save_pretrained(tmp)  # chat template and special tokens, as JSON


def _check_source(src: Path) -> None:
    """A Hugging Face folder with weights and a tokenizer, of a family the pinned
    exporter handles."""
    spec = inspect_model(src)
    if spec.format != "hf" or spec.parameters_source != "tensors":
        raise UnsupportedConversionError(
            f"{src}: OpenVINO export needs a Hugging Face folder with weights",
            hint="convert a GGUF to a Hugging Face folder first: edgekit convert M.gguf --to hf",
        )
    config = json.loads((src / "config.json").read_text(encoding="utf-8"))
    family = family_for_hf(config.get("model_type"), config.get("architectures"))
    if family.key not in EXPORTABLE:
        raise UnsupportedConversionError(
            f"{family.display} cannot be exported to OpenVINO with the pinned optimum-intel 2.1.0 "
            "and transformers 5.5.4 (its exporter requires transformers <= 5.0)",
            hint="use the GGUF target for this model, or export it in an environment with an "
            "older transformers",
        )
    check_hf_tokenizer(src)


def _return_freed_memory() -> None:
    """Hand the heap the export freed (the traced torch model and graph) back to the
    system before the precision check compiles the model twice: glibc keeps freed pages
    otherwise, and the check's pipelines stack on top of them (measured on SmolLM2 from a
    bf16 folder: the check's peak 1656 -> 1424 MB)."""
    import ctypes
    import gc

    gc.collect()
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:  # not glibc (macOS, musl, Windows): nothing to hand back this way
        return
    libc.malloc_trim(0)


def _export_f16(src: Path, out: Path) -> None:
    """The model as OpenVINO IR with f16 weights, written straight to ``out``: optimum's
    ``main_export`` with ``OVConfig(dtype="fp16")``, as ``optimum-cli export openvino
    --weight-format fp16`` runs it. (Loading an ``OVModelForCausalLM`` and saving it
    again, as the compressed formats do, would write f32 constants, twice the bytes, and
    convert the model a second time.) An explicit dtype also keeps optimum from
    compressing models over 1B parameters to INT8 on its own."""
    from optimum.exporters.openvino import main_export
    from optimum.intel import OVConfig

    main_export(
        model_name_or_path=str(src),
        output=out,
        task="text-generation-with-past",
        ov_config=OVConfig(dtype="fp16"),
        stateful=True,
        convert_tokenizer=False,  # edgekit converts it below, with the detokenizer
        library_name="transformers",
    )


@contextlib.contextmanager
def _quiet_export() -> Iterator[None]:
    """Keep tracer warnings and NNCF's tables out of the user's terminal (they go to the
    ``edgekit`` debug log instead): the export's own result is what edgekit reports."""
    names = ("nncf", "transformers", "optimum")
    levels = {n: logging.getLogger(n).level for n in names}
    for n in names:
        logging.getLogger(n).setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with contextlib.redirect_stdout(_LogWriter()):
                yield
    finally:
        for n, level in levels.items():
            logging.getLogger(n).setLevel(level)


class _LogWriter(io.StringIO):
    def write(self, text: str) -> int:
        if text.strip():
            log.debug("%s", text.rstrip())
        return len(text)


def _verify(folder: Path) -> None:
    needed = [
        "openvino_model.xml",
        "openvino_model.bin",
        "openvino_tokenizer.xml",
        "openvino_detokenizer.xml",
        "config.json",
    ]
    missing = [n for n in needed if not (folder / n).is_file()]
    if missing:
        raise ConversionError(f"verification failed: the export lacks {', '.join(missing)}")


PRECISION_PROMPT = "It is a truth universally acknowledged, that a single man in possession of"
PRECISION_TOKENS = 16


def choose_cpu_precision(folder: Path) -> tuple[str, dict[str, Any]]:
    """The fastest CPU inference precision whose greedy output equals f32's.

    f32 is the reference (it matches transformers to ~1e-6); bf16 is taken only if its
    16 greedy tokens on a fixed prompt are identical and it decodes faster. The figures
    are recorded with the model, so the choice can be checked.
    """
    import time

    import numpy as np
    import openvino as ov
    import openvino_genai

    results: dict[str, Any] = {}
    for precision in ("f32", "bf16"):
        pipe = openvino_genai.LLMPipeline(str(folder), "CPU", INFERENCE_PRECISION_HINT=precision)
        tokenizer = pipe.get_tokenizer()
        ids = tokenizer.encode(PRECISION_PROMPT).input_ids.data
        inputs = openvino_genai.TokenizedInputs(ov.Tensor(ids), ov.Tensor(np.ones_like(ids)))
        config = pipe.get_generation_config()
        config.max_new_tokens, config.do_sample, config.ignore_eos = PRECISION_TOKENS, False, True
        pipe.generate(inputs, config)  # warm-up
        start = time.perf_counter()
        tokens = [int(t) for t in pipe.generate(inputs, config).tokens[0]]
        seconds = time.perf_counter() - start
        results[precision] = {"tokens": tokens, "tok_s": round(len(tokens) / seconds, 1)}
        del pipe
    same = results["bf16"]["tokens"] == results["f32"]["tokens"]
    faster = results["bf16"]["tok_s"] > 1.1 * results["f32"]["tok_s"]
    choice = "bf16" if same and faster else "f32"
    check = {p: {"tok_s": r["tok_s"]} for p, r in results.items()}
    check["bf16_matches_f32"] = same
    return choice, check
