"""The Intel target: OpenVINO IR through openvino-genai's LLMPipeline (no torch at run time).

Device: NPU > GPU > CPU among the devices OpenVINO lists, unless one is asked for; an
absent device is refused, naming those present. NPU settings (a static prompt length and
a minimum response length) are passed to the pipeline, and a prompt longer than the
NPU's maximum is refused with an error instead of being run.

Precision: ``inference_precision`` (f32, bf16, f16) and ``kv_cache`` (f16, u8, ...) are
OpenVINO's INFERENCE_PRECISION_HINT and KV_CACHE_PRECISION. The default inference
precision on CPU is f32: it is the one that passes the greedy parity test against
transformers (bf16, the CPU plugin's own default on bf16-capable CPUs, moves logits by
about 1e-2 and flips greedy choices on small models).

Every setting is checked before OpenVINO sees it (targets/checks.py): OpenVINO accepts a
thread count of 100000 and runs a token id past its vocabulary without a word.
"""

from __future__ import annotations

import queue
import secrets
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import psutil
from edgekit.targets import checks
from edgekit.targets.base import Sampling, Session, SessionInfo, StreamChunk, Target
from edgekit.targets.catalog import BY_NAME, TargetInfo
from edgekit.targets.text import NO_TEMPLATE_HINT, StopMatcher, render_chat_template

from edgekit.errors import GenerationError, ModelFormatError, SettingError, TargetUnavailableError
from edgekit.untrusted import parse_json

if TYPE_CHECKING:
    import numpy as np

DEVICE_ORDER = ("NPU", "GPU", "CPU")
DEFAULT_CONTEXT = 4096
NPU_MAX_PROMPT = 1024
NPU_MIN_RESPONSE = 128
PRECISIONS = ("f32", "f16", "bf16")
KV_PRECISIONS = ("f32", "f16", "bf16", "u8", "u4", "u3")
KV_ALIASES = {"q8_0": "u8", "q4_0": "u4"}  # the GGUF names edgekit recipes use
SETTINGS = (
    "device",
    "inference_precision",
    "kv_cache",
    "threads",
    "context",
    "max_prompt_len",
    "min_response_len",
    "logits",
)
_JSON_BYTES = 64 << 20  # tokenizer.json of a 256k vocabulary is about 35 MB


class OpenVinoTarget(Target):
    info: ClassVar[TargetInfo] = BY_NAME["openvino"]

    @classmethod
    def load(cls, model: str | Path, **settings: Any) -> OpenVinoSession:
        """Load an OpenVINO IR folder (openvino_model.xml + tokenizer IRs).

        Settings: ``device`` (auto, CPU, GPU, NPU), ``inference_precision``, ``kv_cache``,
        ``threads``, ``context``, ``max_prompt_len`` / ``min_response_len`` (NPU).

        Raises:
            TargetUnavailableError: openvino-genai missing, or the device is not present.
            ModelFormatError: the folder is not an OpenVINO export with tokenizers.
            SettingError: an unknown setting, or one of the wrong type or out of range.
            GenerationError: OpenVINO refused the model.
        """
        checks.known_settings(settings, SETTINGS, what="OpenVINO setting")
        given = {k: v for k, v in settings.items() if v is not None}  # None: the default
        return OpenVinoSession(Path(model), **given)


def available_devices() -> list[str]:
    import openvino as ov

    return list(ov.Core().available_devices)


def pick_device(requested: str, present: Sequence[str]) -> str:
    """The device to run on: the one asked for, or the best present (NPU > GPU > CPU).

    Raises:
        SettingError: ``requested`` is not a device name OpenVINO has.
        TargetUnavailableError: the requested device is not present.
    """
    wanted = _device_name(requested)
    if wanted in ("AUTO", ""):
        for kind in DEVICE_ORDER:
            for device in present:
                if device.split(".")[0] == kind:
                    return device
        raise TargetUnavailableError("OpenVINO lists no device here")
    if wanted in present or any(d.split(".")[0] == wanted for d in present):
        return wanted
    raise TargetUnavailableError(
        f"device {requested!r} is not present; OpenVINO sees: {', '.join(present) or 'none'}",
        hint="use device='auto' to take the best one present",
    )


def _device_name(requested: object) -> str:
    """``requested`` as OpenVINO spells devices: AUTO, CPU, GPU, NPU, or GPU.1 and such."""
    valid = "auto, CPU, GPU, NPU (or one of several, as in GPU.1)"
    if not isinstance(requested, str):
        raise SettingError(
            f"device must be a string: one of {valid}, not {type(requested).__name__}",
            hint=f"use one of {valid}",
        )
    wanted = requested.upper()
    kind, _, index = wanted.partition(".")
    if wanted in ("AUTO", "") or (kind in DEVICE_ORDER and (not index or index.isdigit())):
        return wanted
    raise SettingError(f"device {requested!r} is not one of {valid}", hint=f"use one of {valid}")


class OpenVinoSession(Session):
    def __init__(
        self,
        folder: Path,
        *,
        device: str = "auto",
        inference_precision: str | None = None,
        kv_cache: str | None = None,
        threads: int | None = None,
        context: int | None = None,
        max_prompt_len: int | None = None,  # default: NPU_MAX_PROMPT, up to the context
        min_response_len: int | None = None,  # default: NPU_MIN_RESPONSE, up to the context
        logits: bool = False,  # accepted for the shared API: logits() always works here
    ) -> None:
        super().__init__()
        try:
            import openvino_genai
        except ImportError as exc:
            raise TargetUnavailableError(
                "openvino-genai is not installed", hint="pip install 'edgekit[openvino]'"
            ) from exc
        for needed in ("openvino_model.xml", "openvino_tokenizer.xml", "openvino_detokenizer.xml"):
            if not (folder / needed).is_file():
                raise ModelFormatError(
                    f"{folder}: no {needed}, so this is not an OpenVINO export edgekit can run",
                    hint="export it with: edgekit convert MODEL --to openvino -o DIR",
                )
        saved = _read_json(folder / "edgekit.json")
        config = _read_json(folder / "config.json")
        self._device = pick_device(device, available_devices())
        kind = self._device.split(".")[0]
        # The precision chosen at conversion (the fastest that matched f32, recorded in
        # edgekit.json) applies on CPU; GPUs and NPUs run f16.
        if inference_precision is None:
            inference_precision = (
                saved.get("inference_precision", "f32") if kind == "CPU" else "f16"
            )
        precision = checks.choice("inference_precision", inference_precision, PRECISIONS)
        if kv_cache is None:
            kv_cache = saved.get("kv_cache_precision") or "f16"
        kv = checks.choice(
            "kv_cache",
            KV_ALIASES.get(kv_cache, kv_cache) if isinstance(kv_cache, str) else kv_cache,
            KV_PRECISIONS,
        )
        trained = config.get("max_position_embeddings")
        model_ctx = trained if isinstance(trained, int) and trained > 0 else DEFAULT_CONTEXT
        n_ctx = (
            min(model_ctx, DEFAULT_CONTEXT)
            if context is None
            else checks.integer(
                "context", context, low=1, high=model_ctx, note="the model's context length"
            )
        )
        n_threads = (
            psutil.cpu_count(logical=False) or 1
            if threads is None
            else checks.integer("threads", threads, low=1, high=checks.max_threads())
        )
        max_prompt_len = (
            min(NPU_MAX_PROMPT, n_ctx)
            if max_prompt_len is None
            else checks.integer(
                "max_prompt_len", max_prompt_len, low=1, high=n_ctx, note="up to the context"
            )
        )
        min_response_len = (
            min(NPU_MIN_RESPONSE, n_ctx)
            if min_response_len is None
            else checks.integer(
                "min_response_len", min_response_len, low=1, high=n_ctx, note="up to the context"
            )
        )
        checks.flag("logits", logits)
        properties: dict[str, Any] = {
            "INFERENCE_PRECISION_HINT": precision,
            "KV_CACHE_PRECISION": kv,
        }
        if kind == "CPU":
            properties["INFERENCE_NUM_THREADS"] = n_threads
        if kind == "NPU":
            properties.update(MAX_PROMPT_LEN=max_prompt_len, MIN_RESPONSE_LEN=min_response_len)
        self._max_prompt = max_prompt_len if kind == "NPU" else None
        try:
            self._pipe = openvino_genai.LLMPipeline(str(folder), self._device, **properties)
        except RuntimeError as exc:
            raise GenerationError(
                f"OpenVINO could not load {folder} on {self._device}: {exc}"
            ) from exc
        self._genai = openvino_genai
        self._tokenizer = self._pipe.get_tokenizer()
        self._folder = folder
        tok_config = _read_json(folder / "tokenizer_config.json")
        template_file = folder / "chat_template.jinja"
        self._template = (
            template_file.read_text(encoding="utf-8")
            if template_file.is_file()
            else tok_config.get("chat_template")
        )
        self._bos = _token_text(tok_config.get("bos_token"))
        self._eos = _token_text(tok_config.get("eos_token"))
        self._tok_config = tok_config
        self._controls: tuple[str, ...] | None = None
        self._context = n_ctx
        self._compiled: Any = None
        self._closed = False
        self.info = SessionInfo(
            target=OpenVinoTarget.info.name,
            model_path=str(folder),
            context_length=n_ctx,
            threads=int(properties.get("INFERENCE_NUM_THREADS", 0)),
            kv_cache=kv,
            settings={
                "device": self._device,
                "inference_precision": precision,
                **(
                    {"max_prompt_len": max_prompt_len, "min_response_len": min_response_len}
                    if kind == "NPU"
                    else {}
                ),
            },
            vocab_size=_vocab_size(config, self._tokenizer),
        )

    # --- tokens -------------------------------------------------------------------------

    def tokenize(self, text: str, *, add_special: bool = True) -> list[int]:
        self._check_open()
        encoded = self._tokenizer.encode(text, add_special_tokens=add_special)
        return [int(t) for t in encoded.input_ids.data[0]]

    def detokenize(self, tokens: Sequence[int]) -> str:
        self._check_open()
        return str(self._tokenizer.decode(list(tokens)))

    def _control_texts(self) -> tuple[str, ...]:
        """The special tokens of the Hugging Face tokenizer the IR was made from (its
        tokenizer.json and tokenizer_config.json), and BOS, EOS and PAD (read once).
        OpenVINO's tokenizer has no switch to leave them unparsed, so message text that
        holds one is encoded in pieces (Session._text_tokens)."""
        if self._controls is None:
            self._check_open()
            texts = {
                self._tokenizer.get_bos_token(),
                self._tokenizer.get_eos_token(),
                self._tokenizer.get_pad_token(),
            }
            tokenizer_json = self._folder / "tokenizer.json"
            added: list[Any] = []
            if tokenizer_json.is_file():
                data = parse_json(
                    tokenizer_json.read_bytes(),
                    where=str(tokenizer_json),
                    max_bytes=_JSON_BYTES,
                    max_depth=None,
                    error=ModelFormatError,
                )
                found = data.get("added_tokens") if isinstance(data, dict) else None
                added += found if isinstance(found, list) else []
            decoder = self._tok_config.get("added_tokens_decoder")
            added += list(decoder.values()) if isinstance(decoder, dict) else []
            texts |= {
                t["content"]
                for t in added
                if isinstance(t, dict) and t.get("special") and isinstance(t.get("content"), str)
            }
            self._controls = tuple(sorted(t for t in texts if isinstance(t, str) and t))
        return self._controls

    # --- generation ---------------------------------------------------------------------

    def stream_tokens(
        self, prompt_tokens: Sequence[int], sampling: Sampling
    ) -> Iterator[StreamChunk]:
        import numpy as np
        import openvino as ov

        self._check_open()
        if self._max_prompt is not None and len(prompt_tokens) > self._max_prompt:
            raise GenerationError(
                f"the prompt has {len(prompt_tokens)} tokens; this NPU pipeline was compiled for "
                f"at most {self._max_prompt}",
                hint="shorten the prompt, or load with a larger max_prompt_len",
            )
        if len(prompt_tokens) >= self._context:
            raise GenerationError(
                f"the prompt has {len(prompt_tokens)} tokens; the context holds {self._context}",
                hint="shorten the prompt or load with a larger context",
            )
        config = self._pipe.get_generation_config()
        config.max_new_tokens = min(sampling.max_tokens, self._context - len(prompt_tokens))
        config.do_sample = sampling.temperature > 0
        if config.do_sample:
            config.temperature = sampling.temperature
            config.top_p = sampling.top_p
            if sampling.top_k:  # 0 is "off": OpenVINO's default, every token
                config.top_k = sampling.top_k
            config.min_p = sampling.min_p
        config.repetition_penalty = sampling.repeat_penalty
        config.ignore_eos = sampling.ignore_eos
        # Set on every call: no call's seed stays behind, and unseeded calls differ.
        config.rng_seed = (
            secrets.randbelow(checks.MAX_SEED + 1) if sampling.seed is None else sampling.seed
        )
        ids = np.asarray([list(prompt_tokens)], dtype=np.int64)
        inputs = self._genai.TokenizedInputs(ov.Tensor(ids), ov.Tensor(np.ones_like(ids)))

        events: queue.Queue[tuple[str, Any]] = queue.Queue()
        abandoned = threading.Event()  # the consumer closed or dropped the stream
        stops = StopMatcher(sampling.stop)
        session = self

        class Streamer(self._genai.StreamerBase):  # type: ignore[name-defined,misc]
            """Counts tokens and hands them to openvino-genai's own incremental detokenizer
            (TextStreamer, in C++), whose text goes through the stop-string matcher."""

            def __init__(self) -> None:
                super().__init__()
                self.stopped = False
                self.inner = session._genai.TextStreamer(session._tokenizer, self.on_text)

            def on_text(self, text: str) -> Any:
                if self.stopped:  # text flushed after a stop string: not part of the reply
                    return session._genai.StreamingStatus.STOP
                out, hit = stops.feed(text)
                if out:
                    events.put(("text", out))
                if hit:
                    self.stopped = True
                    return session._genai.StreamingStatus.STOP
                return session._genai.StreamingStatus.RUNNING

            def write(self, token: Any) -> Any:
                new = list(token) if isinstance(token, list | tuple) else [int(token)]
                events.put(("tokens", len(new)))
                status = self.inner.write(token)
                if self.stopped or abandoned.is_set():
                    return session._genai.StreamingStatus.STOP
                if session._cancel.is_set():
                    return session._genai.StreamingStatus.CANCEL
                return status

            def end(self) -> None:
                self.inner.end()

        streamer = Streamer()

        def run() -> None:
            try:
                self._pipe.generate(inputs, config, streamer)
                events.put(("done", None))
            except Exception as exc:  # delivered to the consumer's thread
                events.put(("error", exc))

        worker = threading.Thread(target=run, name="edgekit-openvino", daemon=True)
        worker.start()
        count = 0
        held = 0  # tokens whose text has not come out of the detokenizer yet
        try:
            while True:
                kind, payload = events.get()
                if kind == "error":
                    raise GenerationError(f"OpenVINO generation failed: {payload}") from payload
                if kind == "done":
                    break
                if kind == "tokens":
                    count += payload
                    held += payload
                else:
                    yield StreamChunk(text=payload, tokens=held)
                    held = 0
        finally:
            abandoned.set()  # a closed stream stops the runtime at its next token
            worker.join()
        tail = stops.flush() if not streamer.stopped else ""
        # Tokens still held at the end (an end-of-sequence token, a stop string) are
        # reported with the final chunk so the counts add up.
        if self._cancel.is_set():
            reason = "cancelled"
        elif streamer.stopped or count < config.max_new_tokens:
            reason = "stop"
        else:
            reason = "length"
        yield StreamChunk(text=tail, tokens=held, finish_reason=reason)  # type: ignore[arg-type]

    def render_chat(self, messages: Sequence[dict[str, str]]) -> str:
        self._check_open()
        if not isinstance(self._template, str):
            raise GenerationError(f"{self._folder} has no chat template", hint=NO_TEMPLATE_HINT)
        text = render_chat_template(
            self._template, messages, bos_token=self._bos, eos_token=self._eos
        )
        return text[len(self._bos) :] if self._bos and text.startswith(self._bos) else text

    def logits(self, tokens: Sequence[int]) -> np.ndarray:
        """Logits of every position, from the IR run directly (the pipeline keeps none)."""
        import numpy as np
        import openvino as ov

        self._check_open()
        with self._lock:
            if self._compiled is None:
                core = ov.Core()
                model = core.read_model(self._folder / "openvino_model.xml")
                self._compiled = core.compile_model(
                    model,
                    self._device,
                    {"INFERENCE_PRECISION_HINT": self.info.settings["inference_precision"]},
                )
            request = self._compiled.create_infer_request()
            request.reset_state()
            ids = np.asarray([list(tokens)], dtype=np.int64)
            names = {i.get_any_name() for i in self._compiled.inputs}
            feed: dict[str, Any] = {"input_ids": ids, "attention_mask": np.ones_like(ids)}
            if "position_ids" in names:
                feed["position_ids"] = np.arange(ids.shape[1], dtype=np.int64)[None, :]
            if "beam_idx" in names:
                feed["beam_idx"] = np.zeros(1, dtype=np.int32)
            result = request.infer(feed)
            return np.asarray(result[self._compiled.output(0)][0], dtype=np.float32)

    def clear_cache(self) -> None:
        """openvino-genai keeps the KV cache of the last generate() and reuses it when the
        next prompt starts the same way (a repeated prompt is 'prefilled' in ~10 ms). It
        has no call to drop it, so a one-token generation replaces the cached prefix: the
        next prompt then shares at most one token with the cache."""
        import numpy as np
        import openvino as ov

        with self._lock:
            self._check_open()
            ids = np.zeros((1, 1), dtype=np.int64)
            config = self._pipe.get_generation_config()
            config.max_new_tokens, config.do_sample = 1, False
            self._pipe.generate(
                self._genai.TokenizedInputs(ov.Tensor(ids), ov.Tensor(np.ones_like(ids))), config
            )

    def _check_open(self) -> None:
        if self._closed:
            raise GenerationError("the session is closed", hint="load the model again")

    def _close(self) -> None:
        if not self._closed:
            del self._pipe
            self._compiled = None
            self._closed = True


def _read_json(path: Path) -> dict[str, Any]:
    """A JSON object from the model folder (untrusted: size, depth and keys checked)."""
    if not path.is_file():
        return {}
    data = parse_json(
        path.read_bytes(), where=str(path), max_bytes=_JSON_BYTES, error=ModelFormatError
    )
    return data if isinstance(data, dict) else {}


def _vocab_size(config: dict[str, Any], tokenizer: Any) -> int:
    """Token ids are 0 to this minus one: the model's embedding rows, else the tokenizer's."""
    size = config.get("vocab_size")
    if isinstance(size, int) and not isinstance(size, bool) and size > 0:
        return size
    return len(tokenizer.get_vocab())


def _token_text(value: Any) -> str:
    if isinstance(value, dict):  # older tokenizer configs store AddedToken dicts
        return str(value.get("content", ""))
    return value if isinstance(value, str) else ""
