"""The OpenVINO session's parts (targets/openvino.py runs the session): its settings, the
model folder's JSON files, and one generation of the pipeline on a worker thread.

openvino-genai's ``LLMPipeline.generate`` blocks until the generation ends and reports
each token to a streamer, so it runs on a worker thread (``PipelineRun``) and hands its
text to the reader through a queue. A reader that stops early (its stream closed or
dropped) tells the worker to stop at its next token and does not wait for it: closing a
stream returns at once. The session waits for that worker before the pipeline's next
use (a generation, ``clear_cache``, ``close``).
"""

from __future__ import annotations

import queue
import secrets
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
from edgekit.targets import checks
from edgekit.targets.handles import CancelToken
from edgekit.targets.streams import StopMatcher
from edgekit.targets.values import FinishReason, Sampling, StreamChunk

from edgekit.errors import ModelFormatError
from edgekit.untrusted import parse_json

DEFAULT_CONTEXT = 4096
NPU_MAX_PROMPT = 1024
NPU_MIN_RESPONSE = 128
PRECISIONS = ("f32", "f16", "bf16")
KV_PRECISIONS = ("f32", "f16", "bf16", "u8", "u4", "u3")
KV_ALIASES = {"q8_0": "u8", "q4_0": "u4"}  # the GGUF names edgekit recipes use
JSON_BYTES = 64 << 20  # tokenizer.json of a 256k vocabulary is about 35 MB


# --- settings -----------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Settings:
    device: str  # as OpenVINO names it: CPU, GPU.1, NPU
    precision: str
    kv_cache: str
    context: int
    threads: int
    max_prompt_len: int  # NPU only: the static prompt length compiled in
    min_response_len: int  # NPU only

    @property
    def kind(self) -> str:
        return self.device.split(".")[0]

    def properties(self) -> dict[str, Any]:
        """The pipeline's properties for these settings on their device."""
        out: dict[str, Any] = {
            "INFERENCE_PRECISION_HINT": self.precision,
            "KV_CACHE_PRECISION": self.kv_cache,
        }
        if self.kind == "CPU":
            out["INFERENCE_NUM_THREADS"] = self.threads
        if self.kind == "NPU":
            out.update(MAX_PROMPT_LEN=self.max_prompt_len, MIN_RESPONSE_LEN=self.min_response_len)
        return out


def read_settings(
    device: str,
    folder: Path,
    *,
    inference_precision: str | None,
    kv_cache: str | None,
    threads: int | None,
    context: int | None,
    max_prompt_len: int | None,
    min_response_len: int | None,
) -> Settings:
    """The checked settings for ``folder`` on ``device`` (already picked): each given one
    in its valid range, the rest from edgekit.json and config.json, else defaults.

    Raises:
        SettingError: a setting of the wrong type or out of range, naming the range.
    """
    saved = read_json(folder / "edgekit.json")
    kind = device.split(".")[0]
    # The precision chosen at conversion (the fastest that matched f32, recorded in
    # edgekit.json) applies on CPU; GPUs and NPUs run f16.
    if inference_precision is None:
        inference_precision = saved.get("inference_precision", "f32") if kind == "CPU" else "f16"
    if kv_cache is None:
        kv_cache = saved.get("kv_cache_precision") or "f16"
    trained = read_json(folder / "config.json").get("max_position_embeddings")
    model_ctx = trained if isinstance(trained, int) and trained > 0 else DEFAULT_CONTEXT
    n_ctx = (
        min(model_ctx, DEFAULT_CONTEXT)
        if context is None
        else checks.integer(
            "context", context, low=1, high=model_ctx, note="the model's context length"
        )
    )
    return Settings(
        device=device,
        precision=checks.choice("inference_precision", inference_precision, PRECISIONS),
        kv_cache=checks.choice(
            "kv_cache",
            KV_ALIASES.get(kv_cache, kv_cache) if isinstance(kv_cache, str) else kv_cache,
            KV_PRECISIONS,
        ),
        context=n_ctx,
        threads=psutil.cpu_count(logical=False) or 1
        if threads is None
        else checks.integer("threads", threads, low=1, high=checks.max_threads()),
        max_prompt_len=_up_to_context("max_prompt_len", max_prompt_len, NPU_MAX_PROMPT, n_ctx),
        min_response_len=_up_to_context(
            "min_response_len", min_response_len, NPU_MIN_RESPONSE, n_ctx
        ),
    )


def _up_to_context(name: str, value: int | None, default: int, n_ctx: int) -> int:
    if value is None:
        return min(default, n_ctx)
    return checks.integer(name, value, low=1, high=n_ctx, note="up to the context")


# --- the model folder's files ----------------------------------------------------------------


def read_json(path: Path) -> dict[str, Any]:
    """A JSON object from the model folder (untrusted: size, depth and keys checked)."""
    if not path.is_file():
        return {}
    data = parse_json(
        path.read_bytes(), where=str(path), max_bytes=JSON_BYTES, error=ModelFormatError
    )
    return data if isinstance(data, dict) else {}


def vocab_size(config: dict[str, Any], tokenizer: Any) -> int:
    """Token ids are 0 to this minus one: the model's embedding rows, else the tokenizer's."""
    size = config.get("vocab_size")
    if isinstance(size, int) and not isinstance(size, bool) and size > 0:
        return size
    return len(tokenizer.get_vocab())


def token_text(value: Any) -> str:
    if isinstance(value, dict):  # older tokenizer configs store AddedToken dicts
        return str(value.get("content", ""))
    return value if isinstance(value, str) else ""


def special_token_texts(folder: Path, tok_config: dict[str, Any]) -> set[str]:
    """The special tokens of the Hugging Face tokenizer the IR was made from (its
    tokenizer.json and tokenizer_config.json)."""
    tokenizer_json = folder / "tokenizer.json"
    added: list[Any] = []
    if tokenizer_json.is_file():
        data = parse_json(
            tokenizer_json.read_bytes(),
            where=str(tokenizer_json),
            max_bytes=JSON_BYTES,
            max_depth=None,
            error=ModelFormatError,
        )
        found = data.get("added_tokens") if isinstance(data, dict) else None
        added += found if isinstance(found, list) else []
    decoder = tok_config.get("added_tokens_decoder")
    added += list(decoder.values()) if isinstance(decoder, dict) else []
    return {
        t["content"]
        for t in added
        if isinstance(t, dict) and t.get("special") and isinstance(t.get("content"), str)
    }


def logits_feed(ids: Sequence[int], input_names: set[str]) -> dict[str, Any]:
    """The inputs of one whole-sequence forward pass of the IR."""
    import numpy as np

    batch = np.asarray([list(ids)], dtype=np.int64)
    feed: dict[str, Any] = {"input_ids": batch, "attention_mask": np.ones_like(batch)}
    if "position_ids" in input_names:
        feed["position_ids"] = np.arange(batch.shape[1], dtype=np.int64)[None, :]
    if "beam_idx" in input_names:
        feed["beam_idx"] = np.zeros(1, dtype=np.int32)
    return feed


# --- one generation on a worker thread -------------------------------------------------------


def configure(config: Any, sampling: Sampling, budget: int) -> Any:
    """The pipeline's generation config set from ``sampling`` (every field, on every
    call: no call's setting, its seed included, stays behind for the next)."""
    config.max_new_tokens = min(sampling.max_tokens, budget)
    config.do_sample = sampling.temperature > 0
    if config.do_sample:
        config.temperature = sampling.temperature
        config.top_p = sampling.top_p
        if sampling.top_k:  # 0 is "off": OpenVINO's default, every token
            config.top_k = sampling.top_k
        config.min_p = sampling.min_p
    config.repetition_penalty = sampling.repeat_penalty
    config.ignore_eos = sampling.ignore_eos
    # unseeded calls differ: a fresh seed each
    config.rng_seed = (
        secrets.randbelow(checks.MAX_SEED + 1) if sampling.seed is None else sampling.seed
    )
    return config


def tokenized_inputs(genai: Any, ids: Sequence[int]) -> Any:
    import numpy as np
    import openvino as ov

    batch = np.asarray([list(ids)], dtype=np.int64)
    return genai.TokenizedInputs(ov.Tensor(batch), ov.Tensor(np.ones_like(batch)))


class PipelineRun:
    """One ``LLMPipeline.generate`` on a worker thread: the streamer counts tokens, hands
    them to openvino-genai's own incremental detokenizer (TextStreamer, in C++), and its
    text goes through the stop-string matcher into a queue the reader empties."""

    def __init__(
        self, genai: Any, tokenizer: Any, stops: Sequence[str], cancel: CancelToken
    ) -> None:
        self.events: queue.Queue[tuple[str, Any]] = queue.Queue()
        self.abandoned = threading.Event()  # the reader closed or dropped the stream
        self.stops = StopMatcher(stops)
        self.cancel = cancel
        self.streamer = _streamer(genai, tokenizer, self)

    def start(self, generate: Callable[[Any], object]) -> threading.Thread:
        """Run ``generate(streamer)`` on a worker thread (returned: the session waits for
        it before the pipeline's next use)."""

        def run() -> None:
            try:
                generate(self.streamer)
                self.events.put(("done", None))
            except Exception as exc:  # noqa: BLE001 - delivered to the reader, mapped there
                self.events.put(("error", exc))

        worker = threading.Thread(target=run, name="edgekit-openvino", daemon=True)
        worker.start()
        return worker

    def chunks(self, max_new_tokens: int) -> Iterator[StreamChunk]:
        """The generation's chunks as the worker produces them; the runtime's own
        exception, raised in the worker, is raised here (the Session boundary maps it).
        The pipeline runs ahead of a slow reader: once cancelled, the reader stops at the
        next event, and what was made beyond it is not delivered."""
        count = 0
        held = 0  # tokens whose text has not come out of the detokenizer yet
        try:
            while True:
                kind, payload = self.events.get()
                if self.cancel.is_set():  # what the pipeline made ahead of the reader is dropped
                    break
                if kind == "error":
                    raise payload
                if kind == "done":
                    break
                if kind == "tokens":
                    count += payload
                    held += payload
                else:
                    yield StreamChunk(text=payload, tokens=held)
                    held = 0
        finally:
            self.abandoned.set()  # a closed stream stops the runtime at its next token
        stopped = self.streamer.stopped
        tail = self.stops.flush() if not stopped else ""
        reason: FinishReason
        if self.cancel.is_set():
            reason = "cancelled"
        elif stopped or count < max_new_tokens:
            reason = "stop"
        else:
            reason = "length"
        # Tokens still held at the end (an end-of-sequence token, a stop string) are
        # reported with the final chunk so the counts add up.
        yield StreamChunk(text=tail, tokens=held, finish_reason=reason)


def _streamer(genai: Any, tokenizer: Any, run: PipelineRun) -> Any:
    """openvino-genai's streamer for ``run`` (a class of the SDK's, so made here)."""
    status = genai.StreamingStatus

    class Streamer(genai.StreamerBase):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.stopped = False
            self.inner = genai.TextStreamer(tokenizer, self.on_text)

        def on_text(self, text: str) -> Any:
            if self.stopped:  # text flushed after a stop string: not part of the reply
                return status.STOP
            out, hit = run.stops.feed(text)
            if out:
                run.events.put(("text", out))
            if hit:
                self.stopped = True
                return status.STOP
            return status.RUNNING

        def write(self, token: Any) -> Any:
            new = list(token) if isinstance(token, list | tuple) else [int(token)]
            run.events.put(("tokens", len(new)))
            result = self.inner.write(token)
            if self.stopped or run.abandoned.is_set():
                return status.STOP
            if run.cancel.is_set():
                return status.CANCEL
            return result

        def end(self) -> None:
            self.inner.end()

    return Streamer()
