"""A Session over TensorRT Edge-LLM's native runtime (``LLMRuntime``) on a cached engine
(targets/tensorrt_engine.py builds it).

Edge-LLM's runtime takes text, not token ids: a request holds chat messages, which it
formats with its own template or, with ``apply_chat_template`` off, tokenizes as they
are. edgekit's Session works on token ids (tokenize, chat_tokens, stream_tokens), so:

- Tokens are the export's tokenizer.json run by Hugging Face ``tokenizers``, as the other
  sessions that ship Hugging Face tokenizer files do (targets/hf_tokens.py); chat prompts
  are rendered by edgekit's sandboxed template (targets/templates.py).
- ``stream_tokens`` sends the prompt ids' text (control tokens written as their text) as
  one message with the runtime's template off, after checking that the text tokenizes
  back to exactly those ids. Ids that do not survive the round trip (message text that
  spells a control token, which chat_tokens encodes as plain text so a user cannot forge
  one; or a segmentation the tokenizer would not make) are refused, never sent: the
  runtime would read them as other tokens. The prompt length the runtime reports in its
  first chunk is checked against the ids too.
- Generated tokens come back as ids on a ``StreamChannel`` and are decoded here
  (``TextStream``: complete UTF-8, stop strings cut before the stop); the runtime is
  given the stop strings as well, so it stops generating early.
- Sampling: temperature, top_p, top_k (0: off) and a per-request seed (a fresh random
  one when none is given, so no call's seed stays behind); greedy is top_k 1.
  ``ignore_eos``: Edge-LLM has only a process-wide switch (the EDGELLM_IGNORE_EOS
  environment variable), so the end-of-sequence ids get a logit bias of -100 for that
  request: they are never picked. ``repeat_penalty`` other than 1 is refused (the text
  runtime has none); ``min_p`` is not applied (Edge-LLM samples with temperature, top_k
  and top_p only): SessionInfo.settings says so.
- ``handle_request`` blocks, so it runs on a worker thread while the generation reads the
  channel; ``cancel`` (and a stop string, and an abandoned stream) cancels the channel,
  which Edge-LLM checks at every step. A stream that is left returns at once: the next
  generation, and ``close``, wait for that worker first.
- No per-position logits: Edge-LLM 0.11's runtime returns generated tokens (and top-k
  log-probabilities) only, so ``logits`` refuses and the target does not evaluate.

None of this has run against the real runtime here (no NVIDIA GPU, no TensorRT): the
tests drive it with a fake native module.
"""

from __future__ import annotations

import secrets
import threading
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from edgekit.targets import checks
from edgekit.targets.hf_tokens import TextStream, bos_added, open_tokenizer, read_tokenizer_files
from edgekit.targets.runtime_calls import backend_errors
from edgekit.targets.session import Session
from edgekit.targets.templates import NO_TEMPLATE_HINT, render_chat_template
from edgekit.targets.values import FinishReason, Sampling, SessionInfo, StreamChunk

from edgekit.errors import (
    GenerationError,
    ModelFormatError,
    SettingError,
    TargetUnavailableError,
)

if TYPE_CHECKING:
    import numpy as np
    from edgekit.converters.tensorrt.folder import ExportFolder
    from edgekit.converters.tensorrt.settings import EngineSettings
    from edgekit.targets.tensorrt_engine import Engine

POLL_MS = 50  # how long one wait on the channel blocks before the cancel token is read
FAILURE_WAIT_S = 2.0  # after an unexpected final chunk: how long handle_request may take to raise
EOS_BIAS = -100.0  # the most negative logit bias Edge-LLM's server accepts
SEED_SPAN = checks.MAX_SEED + 1  # Sampling.seed's range: 0 to 2**32 - 2
KIND = "a TensorRT Edge-LLM export"
HINT = "export the model again: edgekit convert MODEL --to tensorrt -o DIR"
ROUND_TRIP = "It is a truth universally acknowledged, that a single man in possession"
MIN_P_NOTE = "not applied: Edge-LLM samples with temperature, top_k and top_p only"
FORGED = (
    "TensorRT Edge-LLM takes the prompt as text, and these token ids do not come back "
    "from their text: message text that spells a control token (such as <|im_start|>), "
    "or ids the tokenizer would segment otherwise"
)


class TensorRtSession(Session):
    def __init__(
        self,
        folder: ExportFolder,
        engine: Engine,
        settings: EngineSettings,
        *,
        rt: Any,
        target: str,
        power_mode: str | None = None,
    ) -> None:
        super().__init__()
        try:
            from tokenizers import Tokenizer
        except ImportError as exc:
            raise TargetUnavailableError(
                "tokenizers is not installed", hint="pip install 'edgekit[tensorrt]'"
            ) from exc
        self._rt = rt
        self._folder = folder
        self._settings = settings
        self._files = read_tokenizer_files(folder.llm, kind=KIND, hint=HINT)
        self._tokenizer = open_tokenizer(Tokenizer, folder.llm)
        self._vocab = int(folder.config["vocab_size"])
        self._eos = _eos_ids(folder.config.get("eos_token_id"), self._vocab)
        self._worker: threading.Thread | None = None  # the last request's, maybe still running
        self._closed = False
        self._check_round_trip()
        with backend_errors(target, f"loading the TensorRT engine {engine.path}"):
            # no cross-request prompt cache: every generation is evaluated from scratch,
            # as bench's clear_cache promises (Session.clear_cache has nothing to clear)
            cache = rt.ContextCacheConfig()
            cache.enabled = False
            self._runtime = rt.LLMRuntime(engine_dir=str(engine.path), context_cache_config=cache)
            self._runtime.capture_decoding_cuda_graph()  # False: runs without graphs
        self.info = SessionInfo(
            target=target,
            model_path=str(folder.root),
            context_length=settings.max_kv_cache_capacity,
            threads=1,
            kv_cache=settings.kv_cache_type,
            settings={
                "engine": str(engine.path),
                "engine_built": engine.built,
                "engine_reason": engine.reason,
                "device": engine.facts.get("device"),
                "tensorrt": engine.facts.get("tensorrt"),
                "precision": settings.precision,
                "max_batch": settings.max_batch_size,
                "max_input": settings.max_input_len,
                "max_output": settings.max_output_len,
                "min_p": MIN_P_NOTE,
                "power_mode": power_mode,
            },
            vocab_size=self._vocab,
            unit="gpu",
        )

    def _check_round_trip(self) -> None:
        """Refuse, at load, a tokenizer whose token ids do not come back from their text
        (SentencePiece's, whose decoding drops the word-start marker the encoder adds):
        every prompt reaches Edge-LLM's runtime as text.

        Raises:
            ModelFormatError: a plain sentence does not round-trip.
        """
        ids = list(self._tokenizer.encode(ROUND_TRIP, add_special_tokens=True).ids)
        text = str(self._tokenizer.decode(ids, skip_special_tokens=False))
        if list(self._tokenizer.encode(text, add_special_tokens=False).ids) != ids:
            raise ModelFormatError(
                f"{self._folder.llm}: this tokenizer's token ids do not come back from their "
                "text (a SentencePiece-style tokenizer), and TensorRT Edge-LLM's runtime "
                "takes prompts as text",
                hint="run this model on another target; on TensorRT edgekit runs byte-level "
                "tokenizers (Llama 3, Qwen 2/2.5/3, their distills)",
            )

    # --- tokens -------------------------------------------------------------------------

    def tokenize(self, text: str, *, add_special: bool = True) -> list[int]:
        self._check_open()
        return list(self._tokenizer.encode(text, add_special_tokens=add_special).ids)

    def detokenize(self, tokens: Sequence[int]) -> str:
        self._check_open()
        return str(self._tokenizer.decode(list(tokens), skip_special_tokens=True))

    def _control_texts(self) -> tuple[str, ...]:
        return self._files.specials

    def render_chat(self, messages: Sequence[dict[str, str]]) -> str:
        self._check_open()
        files = self._files
        if files.template is None:
            raise GenerationError(f"{self._folder.llm} has no chat template", hint=NO_TEMPLATE_HINT)
        text = render_chat_template(
            files.template, messages, bos_token=files.bos, eos_token=files.eos
        )
        if files.bos and text.startswith(files.bos) and bos_added(self._tokenizer, files.bos):
            return text[len(files.bos) :]  # tokenize() adds it
        return text

    def logits(self, tokens: Sequence[int]) -> np.ndarray:
        raise GenerationError(
            "TensorRT Edge-LLM's runtime gives no per-position logits (only generated tokens)",
            hint="evaluate the model on another target (edgekit eval --target ...)",
        )

    # --- generation ---------------------------------------------------------------------

    def stream_tokens(
        self, prompt_tokens: Sequence[int], sampling: Sampling
    ) -> Iterator[StreamChunk]:
        self._check_open()
        ids = list(prompt_tokens)
        budget = self._budget(len(ids), sampling)
        text = self._prompt_text(ids)
        self._wait_for_worker()
        channel = self._rt.StreamChannel.create()
        request = self._request(text, sampling, budget, channel)
        failure: list[BaseException] = []
        worker = threading.Thread(
            target=self._run, args=(request, channel, failure), daemon=True, name="edgellm"
        )
        self._worker = worker
        worker.start()
        try:
            yield from self._chunks(channel, worker, failure, ids, sampling, budget)
        finally:
            # ended here (a stop string, the token budget, an EOS), abandoned or failed:
            # the runtime stops at its next step; a channel it finished is left alone
            if not channel.is_finished():
                channel.cancel()

    def _budget(self, n: int, sampling: Sampling) -> int:
        """The tokens this generation may make, after refusing what the engine or the
        runtime cannot do."""
        if sampling.repeat_penalty != 1.0:
            raise SettingError(
                f"repeat_penalty={sampling.repeat_penalty} is not one TensorRT Edge-LLM's "
                "text runtime applies",
                hint="leave repeat_penalty at 1.0 on this target",
            )
        s = self._settings
        if n > s.max_input_len:
            raise GenerationError(
                f"the prompt has {n} tokens; the engine was built for at most {s.max_input_len}",
                hint="shorten the prompt, or load with a larger max_input (the engine is rebuilt)",
            )
        return min(sampling.max_tokens, s.max_kv_cache_capacity - n)

    def _prompt_text(self, ids: list[int]) -> str:
        """The text the runtime is sent for ``ids``, refused unless it tokenizes back to
        exactly ``ids``."""
        text = str(self._tokenizer.decode(ids, skip_special_tokens=False))
        back = list(self._tokenizer.encode(text, add_special_tokens=False).ids)
        if back != ids:
            raise GenerationError(FORGED, hint="send the prompt without control-token text")
        return text

    def _request(self, text: str, sampling: Sampling, budget: int, channel: Any) -> Any:
        rt = self._rt
        one = rt.Request(messages=[rt.create_text_message("user", text)])
        one.stop_strings = list(sampling.stop)
        seed = secrets.randbelow(SEED_SPAN) if sampling.seed is None else sampling.seed
        one.sampling_seed = seed
        one.logit_bias = {token: EOS_BIAS for token in self._eos} if sampling.ignore_eos else {}
        request = rt.LLMGenerationRequest()
        request.requests = [one]
        request.stream_channels = [channel]
        greedy = sampling.temperature == 0
        request.temperature = 1.0 if greedy else sampling.temperature
        request.top_k = 1 if greedy else sampling.top_k
        request.top_p = 1.0 if greedy else sampling.top_p
        request.max_generate_length = budget
        request.apply_chat_template = False  # the text already is the whole prompt
        request.add_generation_prompt = False
        return request

    def _run(self, request: Any, channel: Any, failure: list[BaseException]) -> None:
        try:
            self._runtime.handle_request(request)
        except BaseException as exc:  # noqa: BLE001 - handed to the reading thread
            failure.append(exc)
            channel.cancel()

    def _chunks(
        self,
        channel: Any,
        worker: threading.Thread,
        failure: list[BaseException],
        ids: list[int],
        sampling: Sampling,
        budget: int,
    ) -> Iterator[StreamChunk]:
        text = TextStream(self._tokenizer, sampling.stop)
        cancel = self._cancel  # this generation's token
        eos = set(self._eos) if not sampling.ignore_eos else set()
        count = 0
        checked = False
        while True:
            if cancel.is_set():
                channel.cancel()
                yield StreamChunk(text=text.end(), tokens=0, finish_reason="cancelled")
                return
            chunk = channel.wait_pop(timeout_ms=POLL_MS)
            if chunk is None:
                if failure:
                    raise _failed(failure[0])
                if channel.is_finished() or channel.is_cancelled() or not worker.is_alive():
                    chunk = channel.wait_pop(timeout_ms=0)  # a last chunk may have landed
                    if chunk is None:
                        raise (
                            _failed(failure[0])
                            if failure
                            else GenerationError(
                                "TensorRT Edge-LLM ended the stream without a final chunk",
                                hint="report it with the Edge-LLM version",
                            )
                        )
                else:
                    continue
            if not checked and int(getattr(chunk, "prompt_token_count", -1)) >= 0:
                checked = True
                _check_prompt_count(int(chunk.prompt_token_count), len(ids))
            for token in chunk.token_ids:
                token = int(token)
                if token in eos:
                    yield StreamChunk(text=text.end(), tokens=0, finish_reason="stop")
                    return
                count += 1
                piece, stopped = text.feed(token)
                if stopped:
                    yield StreamChunk(text=piece, tokens=1, finish_reason="stop")
                    return
                if count >= budget:
                    yield StreamChunk(text=piece + text.end(), tokens=1, finish_reason="length")
                    return
                yield StreamChunk(text=piece, tokens=1)
            if chunk.finished:
                reason = self._reason(chunk, worker, failure)
                yield StreamChunk(text=text.end(), tokens=0, finish_reason=reason)
                return

    def _reason(
        self, chunk: Any, worker: threading.Thread, failure: list[BaseException]
    ) -> FinishReason:
        """edgekit's finish reason for the runtime's final chunk.

        Raises:
            GenerationError: the runtime finished with an error, or handle_request raised
                (Edge-LLM can finish the channel, ERROR or CANCELLED, and then raise: the
                exception is the answer, never a cancel nobody asked for).
        """
        reasons = self._rt.FinishReason
        if chunk.reason == reasons.LENGTH:
            return "length"
        if chunk.reason in (reasons.END_ID, reasons.STOP_WORDS):
            return "stop"
        worker.join(FAILURE_WAIT_S)  # not edgekit's cancel (that returned earlier): a failure?
        if failure:
            raise _failed(failure[0])
        if chunk.reason == reasons.CANCELLED:
            return "cancelled"
        raise GenerationError(
            f"TensorRT Edge-LLM finished the generation with {chunk.reason}",
            hint="the runtime's log says why",
        )

    def _wait_for_worker(self) -> None:
        """Let the previous request's worker finish (a stream left open cancelled it; the
        runtime serves one request at a time)."""
        worker, self._worker = self._worker, None
        if worker is not None:
            worker.join()

    # --- lifetime -------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise GenerationError("the session is closed", hint="load the model again")

    def _close(self) -> None:
        if not self._closed:
            self._closed = True
            self._wait_for_worker()
            del self._runtime  # the last reference: Edge-LLM frees the engine and its memory


def _failed(exc: BaseException) -> GenerationError:
    error = GenerationError(
        f"TensorRT Edge-LLM failed: {type(exc).__name__}: {exc}",
        hint="the runtime's log says why",
    )
    error.__cause__ = exc
    return error


def _check_prompt_count(counted: int, expected: int) -> None:
    """The runtime read the prompt as the tokens edgekit made of it.

    Raises:
        GenerationError: it counted another number of tokens.
    """
    if counted != expected:
        raise GenerationError(
            f"TensorRT Edge-LLM read the prompt as {counted} tokens; edgekit's tokenizer "
            f"made {expected} of it",
            hint="the export's tokenizer files and the engine's disagree: export again",
        )


def _eos_ids(value: Any, vocab: int) -> tuple[int, ...]:
    """The export config's end-of-sequence ids, each inside the vocabulary.

    Raises:
        ModelFormatError: missing, not integers, or outside the vocabulary.
    """
    raw = value if isinstance(value, list) else [value]
    if (
        not raw
        or len(raw) > 64
        or any(isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < vocab for v in raw)
    ):
        raise ModelFormatError(
            f"the export's eos_token_id {str(value)[:60]!r} is not token ids of the "
            f"{vocab}-token vocabulary",
            hint=HINT,
        )
    return tuple(int(v) for v in raw)
