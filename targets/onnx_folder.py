"""An ONNX Runtime GenAI variant folder, read and checked before ONNX Runtime sees it.

The folder is untrusted: ``genai_config.json`` is parsed with a size bound and strict JSON
(``edgekit.untrusted.parse_json``), every number in it that sizes something is bounded,
every model file it names must be a plain file name of a regular file inside the folder
(no path, no link out), and the tokenizer files it needs must be there. A folder that
fails any of this is a ModelFormatError naming the problem, raised before onnxruntime-genai
opens a file (it reads what the config names, wherever that points).

The tokenizer facts the session needs beside tokenizer.json come from the Hugging Face
files the builder copies: the chat template, BOS/EOS texts and the special tokens.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edgekit.targets import hf_tokens
from edgekit.targets.hf_tokens import TokenizerFiles

from edgekit.errors import ModelFormatError, ModelNotFoundError
from edgekit.safe_files import UnsafePathError, open_regular, split_relative

GENAI_CONFIG = "genai_config.json"
CONFIG_BYTES = 4 << 20  # a real genai_config.json is a few KB
MAX_VOCAB = 1 << 21  # the bounds edgekit.modelspec puts on every model
MAX_CONTEXT = 1 << 26
# An EPContext model wraps QNN context binaries kept beside it (ep.context_embed_mode=0):
# the wrapper is a few KB. One larger than this is an ordinary graph (or embeds its binary,
# which edgekit does not write) and is not scanned.
EP_CONTEXT_SCAN_BYTES = 64 << 20
PIPELINE = "decoder-pipeline"  # onnxruntime-genai's static-shape pipeline (QNN HTP variants)
CONVERT_HINT = "convert the model again: edgekit convert MODEL --to onnx -o DIR"


@dataclass(frozen=True, kw_only=True)
class GenaiFolder:
    """A checked variant folder: what genai_config.json says, and its tokenizer files."""

    path: Path
    model_type: str
    context_length: int  # the longest sequence the model was exported for
    vocab_size: int
    eos_ids: tuple[int, ...]
    model_files: tuple[str, ...]  # the ONNX graphs the decoder (or its pipeline) runs
    logits_name: str
    # the shortest max_length onnxruntime-genai takes: a model with a sliding window
    # (Gemma 3) refuses a generator sized below its window
    shortest: int
    present_key_name: str  # "present.%d.key": the KV cache output of layer %d
    # the execution providers the config names, lower case, with their options
    provider_options: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    # per model file, the providers its stage names (its own or the decoder's), lower case
    stage_providers: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    # a static-shape pipeline (model.type decoder-pipeline with a sliding window): the
    # prompt is run in windows of this many tokens, the last one padded, and the padding
    # takes positions in the KV cache (0: not such a pipeline)
    prompt_window: int = 0
    tokenizer: TokenizerFiles

    def names_provider(self, *names: str) -> bool:
        return any(n.lower() in self.provider_options for n in names)

    def holds_ep_context(self) -> bool:
        """Whether the variant is compiled: every stage that names an execution provider
        is an EPContext model (compiled context binaries), and there is one. Stages that
        name none (a pipeline's embeddings) run on the CPU provider."""
        accelerated = [f for f in self.model_files if self.stage_providers.get(f)]
        return bool(accelerated) and all(_is_ep_context(self.path, f) for f in accelerated)


def read_folder(path: Path) -> GenaiFolder:
    """Read and check ``path`` (see the module text).

    Raises:
        ModelNotFoundError: ``path`` is not a folder.
        ModelFormatError: genai_config.json is missing, malformed or names a model file
            that is not a regular file in the folder; tokenizer.json is missing.
    """
    if not path.is_dir():
        raise ModelNotFoundError(
            f"{path}: no such folder (an ONNX variant is a folder with {GENAI_CONFIG})",
            hint="pass the variant folder that edgekit convert --to onnx wrote",
        )
    config = _object(_read_json(path, GENAI_CONFIG, CONFIG_BYTES), GENAI_CONFIG)
    _check_strings(config)
    model = _object(config.get("model"), "model")
    decoder = _object(model.get("decoder"), "model.decoder")
    vocab = _integer(model.get("vocab_size"), "model.vocab_size", MAX_VOCAB)
    eos = model.get("eos_token_id")
    eos_ids = tuple(eos) if isinstance(eos, list) else (eos,)
    if not 1 <= len(eos_ids) <= 64:
        raise _bad("model.eos_token_id is not one id or a list of 1 to 64 ids")
    for token in eos_ids:
        _integer(token, "model.eos_token_id", vocab - 1, low=0)
    stages = _stages(decoder)
    _check_options([decoder, *stages])
    files = tuple(_model_file(path, stage) for stage in stages)
    given = decoder.get("outputs")
    outputs: dict[str, Any] = given if isinstance(given, dict) else {}
    window = decoder.get("sliding_window")
    size = window.get("window_size") if isinstance(window, dict) else None
    context = _integer(model.get("context_length"), "model.context_length", MAX_CONTEXT)
    shortest = 1 if size is None else _integer(size, "the sliding window_size", context)
    model_type = model.get("type")
    if not isinstance(model_type, str) or not model_type:
        raise _bad("model.type is not a model type name")
    inherited = tuple(_providers([decoder]))
    return GenaiFolder(
        path=path,
        model_type=model_type,
        context_length=context,
        vocab_size=vocab,
        eos_ids=tuple(int(t) for t in eos_ids),
        model_files=files,
        logits_name=str(outputs.get("logits", "logits")),
        shortest=shortest,
        present_key_name=str(outputs.get("present_key_names", "present.%d.key")),
        provider_options=_providers([decoder, *stages]),
        stage_providers={
            f: tuple(_providers([stage])) or inherited
            for f, stage in zip(files, stages, strict=True)
        },
        prompt_window=shortest if model_type == PIPELINE and size is not None else 0,
        tokenizer=read_tokenizer_files(path),
    )


# What a variant's session_options may set: what the onnxruntime-genai builder and
# edgekit's HTP compile write, and harmless tuning. Anything else onnxruntime-genai would
# pass to ONNX Runtime unchecked: ``enable_profiling`` writes files at a path it names,
# ``backend_path`` / ``ep_context_file_path`` make the QNN provider load or write one.
SESSION_KEYS = frozenset(
    {
        "log_id",
        "provider_options",
        "intra_op_num_threads",
        "inter_op_num_threads",
        "log_severity_level",
        "enable_cpu_mem_arena",
        "enable_mem_pattern",
        "graph_optimization_level",
        "session.disable_cpu_ep_fallback",
        "ep.share_ep_contexts",
    }
)
PROVIDER_KEYS = frozenset(
    {
        "backend_type",
        "soc_model",
        "htp_arch",
        "offload_graph_io_quantization",
        "enable_htp_fp16_precision",
        "htp_performance_mode",
        "htp_graph_finalization_optimization_mode",
        "vtcm_mb",
        "device_id",
        "enable_cuda_graph",
    }
)
MAX_STAGES = 1024  # every stage of every pipeline entry (a real one: 2 per part + 1)


def _check_options(sections: Sequence[dict[str, Any]]) -> None:
    """Refuse a session or provider option outside SESSION_KEYS / PROVIDER_KEYS."""
    for section in sections:
        options = section.get("session_options", {})
        if not isinstance(options, dict):
            raise _bad("a session_options is not an object")
        unknown = sorted(str(k)[:64] for k in options if k not in SESSION_KEYS)
        providers = options.get("provider_options", [])
        if not isinstance(providers, list):
            raise _bad("a provider_options is not a list")
        for entry in providers:
            for name, values in _object(entry, "a provider_options entry").items():
                opts = _object(values, f"provider {str(name)[:64]!r}'s options")
                unknown += sorted(str(k)[:64] for k in opts if k not in PROVIDER_KEYS)
        if unknown:
            raise _bad(
                f"sets {', '.join(map(repr, unknown[:8]))}, which edgekit does not pass to "
                "ONNX Runtime (a session option can write files or load a library)"
            )


def _check_strings(config: dict[str, Any]) -> None:
    """Refuse what onnxruntime-genai would act on unchecked: a name it formats with C's
    printf (``present.%d.key``: any other conversion reads or writes its stack, ``%s``
    crashes the process) and a custom-ops library it would load from any path."""
    todo: list[Any] = [config]
    while todo:
        value = todo.pop()
        if isinstance(value, dict):
            if "custom_ops_library" in value:
                raise _bad("names a custom_ops_library, which edgekit does not load")
            todo += [*value.keys(), *value.values()]
        elif isinstance(value, list):
            todo += value
        elif isinstance(value, str) and "%" in value.replace("%d", "", 1):
            raise _bad(f"{value!r} holds a % other than one %d (a layer's name pattern)")


def _bad(what: str) -> ModelFormatError:
    return ModelFormatError(f"{GENAI_CONFIG}: {what}", hint=CONVERT_HINT)


KIND = "an ONNX Runtime GenAI folder"


def _read_bytes(folder: Path, name: str, max_bytes: int) -> bytes:
    """Up to ``max_bytes`` + 1 bytes of the regular file ``folder/name`` (no link)."""
    return hf_tokens.read_bytes(folder, name, max_bytes, kind=KIND, hint=CONVERT_HINT)


def _read_json(folder: Path, name: str, max_bytes: int, *, depth: bool = True) -> Any:
    """The JSON document ``folder/name``, read from a regular file inside the folder."""
    return hf_tokens.read_json(folder, name, max_bytes, kind=KIND, hint=CONVERT_HINT, depth=depth)


def _object(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise _bad(f"{where} is not an object")
    return value


def _integer(value: Any, where: str, high: int, *, low: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise _bad(f"{where} is {value!r}, not an integer from {low} to {high:,}")
    return value


def _stages(decoder: dict[str, Any]) -> list[dict[str, Any]]:
    """The decoder's graphs: itself, or each stage of its pipeline (QNN's prompt
    processor and token generator, each in parts)."""
    pipeline = decoder.get("pipeline")
    if pipeline is None:
        return [decoder]
    if not isinstance(pipeline, list) or not pipeline or len(pipeline) > 256:
        raise _bad("model.decoder.pipeline is not a list of 1 to 256 stages")
    stages: list[dict[str, Any]] = []
    for entry in pipeline:
        named = _object(entry, "a model.decoder.pipeline entry")
        if len(stages) + len(named) > MAX_STAGES:
            raise _bad(f"model.decoder.pipeline has more than {MAX_STAGES:,} stages")
        stages += [_object(stage, f"pipeline stage {name!r}") for name, stage in named.items()]
    return stages


def _model_file(folder: Path, stage: dict[str, Any]) -> str:
    name = stage.get("filename")
    if not isinstance(name, str) or not name:
        raise _bad("a decoder names no model filename")
    try:
        parts = split_relative(name)
        if len(parts) != 1:
            raise UnsafePathError(name, "is not a plain file name in the folder")
        fd = open_regular(folder, name)
    except UnsafePathError as exc:
        raise ModelFormatError(
            f"{folder}: {GENAI_CONFIG} names {name!r}: {exc.message.split(': ', 1)[-1]}",
            hint=CONVERT_HINT,
        ) from exc
    else:
        with open(fd, "rb"):
            pass
    return name


def _providers(sections: Sequence[dict[str, Any]]) -> dict[str, dict[str, str]]:
    """The providers named in the sections' session_options.provider_options."""
    found: dict[str, dict[str, str]] = {}
    for section in sections:
        options = section.get("session_options")
        entries = options.get("provider_options") if isinstance(options, dict) else None
        for entry in entries if isinstance(entries, list) else []:
            for name, values in entry.items() if isinstance(entry, dict) else ():
                given = values if isinstance(values, dict) else {}
                found.setdefault(str(name).lower(), {}).update(
                    {str(k): str(v) for k, v in given.items()}
                )
    return found


def _is_ep_context(folder: Path, name: str) -> bool:
    """Whether the ONNX graph ``name`` holds an EPContext node: its op type is stored as
    a protobuf string field (tag 0x22, length 9) in the node list, which a wrapper of a
    few KB holds whole."""
    try:
        fd = open_regular(folder, name)
    except UnsafePathError:
        return False
    with open(fd, "rb") as f:
        data = f.read(EP_CONTEXT_SCAN_BYTES + 1)
    return len(data) <= EP_CONTEXT_SCAN_BYTES and b'"\x09EPContext' in data


# --- the tokenizer files ------------------------------------------------------------------


def read_tokenizer_files(folder: Path) -> TokenizerFiles:
    """The chat template, BOS/EOS texts and special tokens (targets/hf_tokens.py).

    Raises:
        ModelFormatError: tokenizer.json is missing or malformed (the session's
            tokenizer needs it).
    """
    return hf_tokens.read_tokenizer_files(folder, kind=KIND, hint=CONVERT_HINT)
