"""Hugging Face folder -> a QNN HTP variant (docs/onnx.md, "The Qualcomm HTP variant").

Steps, each reported as a progress event:

1. the onnxruntime-genai builder's FP32 CPU decoder, in-process (as ``export`` runs it);
2. static graphs (``htp_graph``): sequence-length inputs, no Skip* norms, batch 1, a
   ``context``-long KV cache;
3. W8A16 and W16A16: QDQ quantization calibrated on local text (``htp_quantize``); FP16 keeps
   the float graph (the HTP runs it at fp16);
4. the split (``htp_split``): a CPU embeddings graph and N parts whose weights each fit
   ``part_gib``, each part a prompt graph (the window) and a token graph (1 token) over
   one external-data file; ``genai_config.json`` a decoder-pipeline over them;
5. the QDQ stage is run on the CPU provider through onnxruntime-genai (it must generate)
   before the variant counts as built;
6. unless stopped at the QDQ stage on purpose: the compile into QNN context binaries
   (``htp_compile``, onnxruntime-qnn) when it can run here; otherwise the QDQ stage ships
   with a warning that says why.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgekit.converters.edge_checks import require
from edgekit.converters.onnx.export import (
    BUILDER,
    COPIED,
    SETTINGS_FILE,
    BuildOptions,
    OnnxResult,
    build_options,
    check_source,
)
from edgekit.converters.onnx.htp_quantize import DEFAULT_QUANT, QUANT_CONFIGS, HtpQuantConfig
from edgekit.converters.onnx.socs import Soc
from edgekit.converters.recipe import Recipe

from edgekit.atomic import atomic_path, check_destination, work_dir, write_new
from edgekit.errors import ConversionError, UnsupportedConversionError
from edgekit.inspection import inspect_model, read_config
from edgekit.progress import ProgressCallback, ProgressEvent, no_progress
from edgekit.safetensors_header import model_file

DEFAULT_WINDOW = 64  # the prompt processor's width
MAX_CONTEXT = 1024  # the default static KV length (fewer when the model has less)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")
VERIFY_TOKENS = 4


@dataclass(frozen=True, kw_only=True)
class HtpPlan:
    """Everything checked before the build writes anything."""

    options: BuildOptions
    soc: Soc
    part_gib: float
    window: int
    context: int
    family: str


def plan_htp(
    src: Path, quant: str, recipe: Recipe | None, *, window: int, context: int | None
) -> HtpPlan:
    """The checked plan of an HTP build of ``src``.

    Raises:
        UnsupportedConversionError: a CPU quant, a recipe value the HTP build cannot
            express, a window/context that does not fit the model, a layer over part_gib.
    """
    options = build_options(quant, recipe)
    if options.soc is None or options.part_gib is None:
        raise UnsupportedConversionError(
            f"{options.quant} is not an HTP quantization", hint="build W8A16 or FP16"
        )
    family = check_source(src)
    config = read_config(src)
    longest = config.get("max_position_embeddings")
    longest = longest if isinstance(longest, int) and longest > 0 else MAX_CONTEXT
    context = min(longest, MAX_CONTEXT) if context is None else context
    if (
        isinstance(window, bool)
        or isinstance(context, bool)
        or not (
            isinstance(window, int)
            and isinstance(context, int)
            and 1 <= window <= context <= longest
        )
    ):
        raise UnsupportedConversionError(
            f"window={window!r}, context={context!r} do not fit {src} "
            f"(max_position_embeddings {longest})",
            hint="1 <= window <= context <= max_position_embeddings",
        )
    sliding = config.get("sliding_window")
    if family == "gemma3" and isinstance(sliding, int) and sliding > context:
        raise UnsupportedConversionError(
            f"context={context} is shorter than the model's sliding window ({sliding})",
            hint=f"use context >= {sliding}: GroupQueryAttention needs the whole window",
        )
    from edgekit.converters.onnx.htp_layout import check_fits

    check_fits(inspect_model(src), options.quant, options.part_gib)
    return HtpPlan(
        options=options,
        soc=options.soc,
        part_gib=options.part_gib,
        window=window,
        context=context,
        family=family,
    )


def hf_to_htp(
    src: str | Path,
    out: str | Path,
    quant: str = "W8A16",
    *,
    recipe: Recipe | None = None,
    force: bool = False,
    progress: ProgressCallback = no_progress,
    window: int = DEFAULT_WINDOW,
    context: int | None = None,
    stop_at_qdq: bool = False,
    quant_config: HtpQuantConfig | None = None,
) -> OnnxResult:
    """Build ``src`` (a Hugging Face folder) as a QNN HTP variant for ``recipe.soc`` at
    ``out``: the context stage when onnxruntime-qnn can compile here and ``stop_at_qdq`` is
    not set, else the QDQ stage (with a warning saying why, unless asked for).

    Raises:
        UnsupportedConversionError: see ``plan_htp`` (checked before any work).
        TargetUnavailableError: the builder's SDKs are not installed.
        OutputExistsError: ``out`` exists and ``force`` is not set.
        ConversionError: a step failed; nothing is left at ``out``.
    """
    src, out = Path(src), Path(out)
    plan = plan_htp(src, quant, recipe, window=window, context=context)
    # the quant's own settings unless the caller brings others (QUANT_CONFIGS says why)
    quant_config = quant_config or QUANT_CONFIGS.get(plan.options.quant, DEFAULT_QUANT)
    check_destination(out, force=force)
    require(BUILDER, "ONNX export")
    why = "" if stop_at_qdq else _compile_unavailable()
    compiling = not stop_at_qdq and not why
    total = 6 if compiling else 5
    with work_dir(out, "tmp") as work, atomic_path(out, force=force) as tmp:
        stage = work / "qdq" if compiling else tmp
        stage.mkdir()
        _build_qdq(
            src,
            work,
            stage,
            plan,
            quant_config,
            lambda d, what: progress(
                ProgressEvent(stage="build", done=d, total=total, detail=what)
            ),
        )
        warnings: tuple[str, ...] = ()
        if compiling:
            from edgekit.converters.onnx.htp_compile import compile_variant

            warnings = compile_variant(stage, tmp, plan.soc, share=True, progress=progress)
        elif why:
            warnings = (f"shipped the QDQ stage, not compiled for {plan.soc.key}: {why}",)
        progress(ProgressEvent(stage="build", done=total, total=total, detail="built"))
    return OnnxResult(path=out, quant=plan.options.quant, block_size=None, warnings=warnings)


def _compile_unavailable() -> str:
    try:
        from edgekit.converters.onnx.htp_compile import compile_unavailable
    except ImportError as exc:
        return f"the HTP compiler module cannot be imported ({exc})"
    return compile_unavailable()


def _build_qdq(
    src: Path, work: Path, stage: Path, plan: HtpPlan, config: HtpQuantConfig, step: Any
) -> None:
    """Steps 1-5 into the folder ``stage``."""
    from edgekit.converters.onnx import htp_graph, htp_split
    from edgekit.converters.onnx.export import _run_builder

    fp32 = work / "fp32"
    fp32.mkdir()
    (work / "cache").mkdir()
    step(0, "onnxruntime-genai builder (FP32)")
    _run_builder(src, fp32, work / "cache", plan.options)
    builder = _read_json(fp32 / "genai_config.json")
    decoder = builder["model"]["decoder"]
    layers = int(decoder["num_hidden_layers"])
    step(1, "static graphs")
    static = htp_graph.make_static(
        htp_graph.load_structure(fp32 / "model.onnx"),
        fp32,
        context=plan.context,
        head_size=int(decoder["head_size"]),
    )
    write_new(fp32 / "static.onnx", static.SerializeToString())  # beside its weights
    source, model, calibration = fp32, static, None
    if plan.options.quant in QUANT_CONFIGS:
        step(2, "calibrating and quantizing (QDQ)")
        source, calibration = work / "quantized", _quantize(fp32, work, plan, config)
        model = htp_graph.infer_shapes(htp_graph.load_structure(source / "static.onnx"), source)
    step(3, "splitting into parts")
    bounds = htp_graph.layer_inputs(model, layers)
    cuts = htp_split.plan_parts(model, bounds, plan.part_gib, _weigher(plan.options.quant))
    htp_split.write_embeddings(static, bounds[0], fp32, stage)
    files = [htp_split.write_part(model, c, bounds, source, stage, plan.window) for c in cuts]
    config_out = _genai_config(builder, cuts, files, plan)
    write_new(stage / "genai_config.json", json.dumps(config_out, indent=2))
    _copy_files(src, fp32, stage)
    write_new(
        stage / SETTINGS_FILE, json.dumps(_settings(plan, len(cuts), calibration, config), indent=2)
    )
    step(4, "checking the QDQ stage on the CPU provider")
    verify_stage(stage, cuts, plan.context)


def _quantize(fp32: Path, work: Path, plan: HtpPlan, config: HtpQuantConfig) -> dict[str, Any]:
    """QDQ of the static graph into ``work``/quantized; the calibration text is tokenized
    with the tokenizer the builder wrote (the one the variant ships)."""
    from edgekit.converters.onnx.htp_quantize import (
        calibration_text,
        calibration_tokens,
        quantize_static,
    )

    name, text = calibration_text(plan.options.recipe.calibration)
    # no more than the static KV cache holds
    limit = min(config.tokens_needed(plan.window), plan.context)
    ids = calibration_tokens(fp32 / "tokenizer.json", text, limit)
    (work / "quantized").mkdir()
    samples = quantize_static(
        fp32 / "static.onnx", work / "quantized" / "static.onnx", ids, plan.window, config
    )
    return {"text": name, "tokens": len(ids), "samples": samples}


def _weigher(quant: str) -> Any:
    """Bytes of an initializer as the HTP holds it: FP16 holds float weights at fp16."""
    from onnx import TensorProto, helper

    def weigh(tensor: Any) -> int:
        count = 1
        for dim in tensor.dims:
            count *= dim
        size = int(helper.tensor_dtype_to_np_dtype(tensor.data_type).itemsize)
        if quant == "FP16" and tensor.data_type == TensorProto.FLOAT:
            size = 2
        return count * size

    return weigh


def _genai_config(
    builder: dict[str, Any], cuts: list[Any], files: list[dict[str, str]], plan: HtpPlan
) -> dict[str, Any]:
    """The builder's genai_config.json as a decoder-pipeline over the embeddings graph and
    the parts (static KV buffers shared between past and present, the window sliding over
    the prompt)."""
    from edgekit.converters.onnx.htp_graph import PAST_SEQ_LEN, TOTAL_SEQ_LEN
    from edgekit.converters.onnx.htp_split import hidden_name

    model = builder["model"]
    decoder = model["decoder"]
    stages: dict[str, Any] = {
        "embeddings": _stage("embeddings.onnx", ["input_ids"], [hidden_name(0)], (True, True))
    }
    for cut, names in zip(cuts, files, strict=True):
        ins = [hidden_name(cut.layers.start), *cut.inputs[1:]]
        outs = [
            "logits" if cut.outputs[0] == "logits" else hidden_name(cut.layers.stop),
            *cut.outputs[1:],
        ]
        stages[f"part{cut.index}_prompt"] = _stage(names["prompt"], ins, outs, (True, False))
        stages[f"part{cut.index}_token"] = _stage(names["token"], ins, outs, (False, True))
    keys = (
        "head_size",
        "hidden_size",
        "num_attention_heads",
        "num_hidden_layers",
        "num_key_value_heads",
    )
    return {
        "model": {
            **{
                k: model[k]
                for k in ("bos_token_id", "eos_token_id", "pad_token_id", "vocab_size")
                if k in model
            },
            "type": "decoder-pipeline",
            "context_length": plan.context,
            "decoder": {
                "session_options": {"log_id": "onnxruntime-genai", "provider_options": []},
                **{k: decoder[k] for k in keys},
                "inputs": {
                    "input_ids": "input_ids",
                    "past_sequence_length": PAST_SEQ_LEN,
                    "total_sequence_length": TOTAL_SEQ_LEN,
                    "past_key_names": "past_key_values.%d.key",
                    "past_value_names": "past_key_values.%d.value",
                },
                "outputs": {
                    "logits": "logits",
                    "present_key_names": "present.%d.key",
                    "present_value_names": "present.%d.value",
                },
                "sliding_window": {
                    "window_size": plan.window,
                    "pad_value": 0,
                    "alignment": "left",
                    "slide_key_value_cache": False,
                    "slide_inputs": True,
                },
                "pipeline": [stages],
            },
        },
        "search": {
            **builder.get("search", {}),
            "max_length": plan.context,
            "past_present_share_buffer": True,
        },
    }


def _stage(
    filename: str, inputs: list[str], outputs: list[str], runs: tuple[bool, bool]
) -> dict[str, Any]:
    return {
        "filename": filename,
        "inputs": inputs,
        "outputs": outputs,
        "run_on_prompt": runs[0],
        "run_on_token_gen": runs[1],
    }


def _copy_files(src: Path, fp32: Path, stage: Path) -> None:
    """The tokenizer files as the builder wrote them, config files from the source."""
    for name in TOKENIZER_FILES:
        if (fp32 / name).is_file():
            shutil.copyfile(fp32 / name, stage / name)
    for name in COPIED:
        if (src / name).exists():
            shutil.copyfile(model_file(src, name), stage / name)


def _settings(
    plan: HtpPlan, parts: int, calibration: dict[str, Any] | None, config: HtpQuantConfig
) -> dict[str, Any]:
    from dataclasses import asdict
    from importlib.metadata import version

    htp: dict[str, Any] = {
        "soc": plan.soc.key,
        "soc_model": plan.soc.soc_model,
        "htp_arch": plan.soc.htp_arch,
        "stage": "qdq",
        "window": plan.window,
        "context_length": plan.context,
        "parts": parts,
        "part_gib": plan.part_gib,
        "calibration": calibration,
    }
    if calibration is not None:
        htp["quantization"] = asdict(config)
    return {
        "format": "onnx",
        "quant": plan.options.quant,
        "block_size": None,
        "execution_provider": "qnn",
        "kv_cache": "f32",
        "recipe": plan.options.recipe.to_json(),
        "builder": f"onnxruntime-genai {version('onnxruntime-genai')}",
        "htp": htp,
    }


def _read_json(path: Path) -> dict[str, Any]:
    from edgekit.untrusted import parse_json

    data = parse_json(path.read_bytes(), where=str(path), max_bytes=1 << 20, error=ConversionError)
    if not isinstance(data, dict) or not isinstance(data.get("model", {}).get("decoder"), dict):
        raise ConversionError(f"{path}: the builder wrote no decoder config")
    return data


def verify_stage(stage: Path, cuts: list[Any], context: int) -> None:
    """Every part graph fully static, and the pipeline generating on the CPU provider.

    Raises:
        ConversionError: a dynamic dim is left, or onnxruntime-genai cannot run the stage.
    """
    from edgekit.converters.onnx.htp_graph import dynamic_io, load_structure

    for cut in cuts:
        for kind in ("prompt", "token"):
            left = dynamic_io(load_structure(stage / f"part{cut.index}.{kind}.onnx"))
            if left:
                raise ConversionError(f"part{cut.index}.{kind}.onnx keeps dynamic dims: {left}")
    try:
        import onnxruntime_genai as og

        config = og.Config(str(stage))
        config.clear_providers()
        model = og.Model(config)
        params = og.GeneratorParams(model)
        # the whole static context: a shorter max_length gives GQA a total length below
        # the window the prompt graph writes
        params.set_search_options(max_length=context, do_sample=False)
        generator = og.Generator(model, params)
        generator.append_tokens([0, 1])
        for _ in range(VERIFY_TOKENS):
            if generator.is_done():
                break
            generator.generate_next_token()
    except Exception as exc:  # onnxruntime-genai raises RuntimeError / OrtException
        raise ConversionError(
            f"the QDQ stage does not generate on the CPU provider: {type(exc).__name__}: {exc}",
            hint="a bug in edgekit's HTP build: report it with edgekit -vv convert ...",
        ) from exc
