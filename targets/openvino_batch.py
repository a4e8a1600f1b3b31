"""OpenVINO's BatchRuntime (targets/batching.py): several generations at once on one model,
through openvino-genai's ``ContinuousBatchingPipeline`` (paged attention, its own
scheduler).

``open_batch`` loads the pipeline from the variant folder on the device and with the
properties the single-stream session uses (``Settings.properties()``: inference precision,
KV cache precision, threads), so a stream alone runs the session's kernels. Each ``step``
is one ``ContinuousBatchingPipeline.step``: one token for every sequence that is decoding,
and prompt chunks of those still prefilling (at most ``chunk_tokens`` tokens in all), so a
long prompt does not stall the others for its whole length. Every request has its own
GenerationConfig (sampler, seed) and ends with the pipeline's finish reason: STOP
(end-of-sequence, never with ignore_eos) is "stop", LENGTH is "length": its
``max_new_tokens`` is the room left in its context, since ``max_tokens`` is the loop's.

KV cache: ``slots`` sequences of ``context`` tokens in blocks of 32 tokens on CPU, 16 on
GPU (openvino-genai's kv_cache_manager): ``num_kv_blocks = slots * ceil(context / block)``,
each block ``block * layers * kv_heads * (K + V bytes per head and token)`` bytes
(``KvPlan``). Sized so, the scheduler never preempts a sequence for room.

Prefix caching is on: a prompt that starts with blocks the pool holds (a shared system
prompt, the conversation so far) restores them instead of evaluating them. The pipeline
does not report how many it restored; ``SeqStep.cached`` is what edgekit's mirror of its
block index claims (targets/openvino_batch_prefix.py: whole blocks, never more than the
pipeline restores).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
from edgekit.targets import checks
from edgekit.targets.batching import SeqEnd, SeqRequest, SeqStep, check_admission
from edgekit.targets.openvino_batch_prefix import PrefixMirror
from edgekit.targets.openvino_runtime import Settings, configure, read_json
from edgekit.targets.runtime_calls import MEMORY_HINT, backend_errors

from edgekit.errors import (
    GenerationError,
    ModelFormatError,
    SettingError,
    TargetUnavailableError,
)

log = logging.getLogger(__name__)

TARGET = "OpenVINO"
MAX_SLOTS = 256  # the scheduler's own default max_num_seqs
CHUNK_TOKENS = 256  # openvino-genai's default max_num_batched_tokens
BLOCK_TOKENS = {"CPU": 32, "GPU": 16}  # kv_cache_manager.hpp: cpu_block_size, gpu_block_size
# Bytes of one stored K or V value; the quantized ones add a scale and a zero point (two
# f32) per head and token (an estimate: the CPU plugin quantizes keys by channel per block).
VALUE_BYTES = {"f32": 4.0, "f16": 2.0, "bf16": 2.0, "u8": 1.0, "u4": 0.5, "u3": 0.375}
QUANT_EXTRA_BYTES = 8
GIB = 1 << 30


@dataclass(frozen=True, kw_only=True)
class KvPlan:
    """The KV cache the pipeline is given: ``blocks`` blocks of ``block`` tokens, room for
    ``slots`` sequences of ``context`` tokens. ``token_bytes``: one token's K and V over
    every layer (None when config.json does not say the model's shape)."""

    slots: int
    context: int
    block: int
    blocks: int
    token_bytes: int | None

    @property
    def bytes(self) -> int | None:
        return None if self.token_bytes is None else self.blocks * self.block * self.token_bytes


def kv_plan(config: dict[str, Any], *, slots: int, context: int, kind: str, kv: str) -> KvPlan:
    """The KV cache for ``slots`` sequences of ``context`` tokens on a device of ``kind``
    (CPU, GPU) stored as ``kv`` (see the module text for the formula)."""
    block = BLOCK_TOKENS[kind]
    blocks = slots * -(-context // block)
    return KvPlan(
        slots=slots,
        context=context,
        block=block,
        blocks=blocks,
        token_bytes=token_bytes(config, kv),
    )


def token_bytes(config: dict[str, Any], kv: str) -> int | None:
    """One token's K and V over every layer: ``layers * kv_heads * 2 * head_dim`` values
    (plus the scales of a quantized cache), from config.json (a multimodal model's
    ``text_config``)."""
    text = config.get("text_config")
    shape = text if isinstance(text, dict) else config

    def number(key: str) -> int | None:
        value = shape.get(key)
        ok = isinstance(value, int) and not isinstance(value, bool) and value > 0
        return value if ok else None

    layers, heads, hidden = (
        number("num_hidden_layers"),
        number("num_attention_heads"),
        number("hidden_size"),
    )
    if layers is None or heads is None:
        return None
    kv_heads = number("num_key_value_heads") or heads
    head_dim = number("head_dim") or (hidden // heads if hidden else None)
    if head_dim is None:
        return None
    value = VALUE_BYTES[kv] * head_dim + (QUANT_EXTRA_BYTES if VALUE_BYTES[kv] < 2 else 0)
    return int(layers * kv_heads * 2 * value)


def open_batch(
    folder: Path,
    settings: Settings,
    *,
    slots: int,
    chunk_tokens: int = CHUNK_TOKENS,
    keep_log_probs: bool = False,
) -> OpenVinoBatch:
    """A batched runtime on the OpenVINO IR in ``folder``: ``slots`` sequences of
    ``settings.context`` tokens each, on ``settings.device`` with the single-stream
    session's properties, at most ``chunk_tokens`` tokens a step (prompt chunks beside one
    token of every decoding sequence; at least ``slots``). ``keep_log_probs``: keep the
    log-probability of every sampled token, for ``OpenVinoBatch.log_probs`` (checks of
    batched numerics; the pipeline then computes a log-softmax a token).

    Raises:
        SettingError: ``slots`` or ``chunk_tokens`` out of range, or an NPU (its pipelines
            are compiled for one sequence of a static size).
        ModelFormatError: the folder is not an OpenVINO export.
        TargetUnavailableError: openvino-genai is not installed.
        GenerationError: the KV cache does not fit the memory available (CPU), or OpenVINO
            refused the model.
    """
    slots = checks.integer("slots", slots, low=1, high=MAX_SLOTS)
    chunk_tokens = checks.integer("chunk_tokens", chunk_tokens, low=1)
    keep_log_probs = checks.flag("keep_log_probs", keep_log_probs)
    if settings.kind not in BLOCK_TOKENS:
        raise SettingError(
            f"continuous batching runs on a CPU or a GPU, not on {settings.device}: an NPU "
            "pipeline is compiled for one sequence",
            hint="load on device='CPU' or 'GPU' to serve several streams, or serve one",
        )
    if not (folder / "openvino_model.xml").is_file():
        raise ModelFormatError(
            f"{folder}: no openvino_model.xml, so this is not an OpenVINO export edgekit can run",
            hint="export it with: edgekit convert MODEL --to openvino -o DIR",
        )
    plan = kv_plan(
        read_json(folder / "config.json"),
        slots=slots,
        context=settings.context,
        kind=settings.kind,
        kv=settings.kv_cache,
    )
    _check_memory(plan, settings)
    genai = _genai()
    with backend_errors(TARGET, f"loading {folder} for {slots} streams", hint=MEMORY_HINT):
        scheduler = genai.SchedulerConfig()
        scheduler.max_num_seqs = slots
        scheduler.num_kv_blocks = plan.blocks
        scheduler.cache_size = 0  # the blocks above decide
        scheduler.enable_prefix_caching = True
        scheduler.dynamic_split_fuse = True
        scheduler.max_num_batched_tokens = max(chunk_tokens, slots)
        pipe = genai.ContinuousBatchingPipeline(
            str(folder), scheduler, settings.device, settings.properties()
        )
    return OpenVinoBatch(pipe, plan, keep_log_probs=keep_log_probs)


def _check_memory(plan: KvPlan, settings: Settings) -> None:
    """Refuse a CPU cache larger than the memory available now: the pipeline allocates it
    whole at its first step, where failing would fail every request of that step."""
    if settings.kind != "CPU" or plan.bytes is None:
        return
    available = int(psutil.virtual_memory().available)
    if plan.bytes > available:
        raise GenerationError(
            f"the KV cache of {plan.slots} streams x {plan.context} tokens needs "
            f"{plan.bytes / GIB:.1f} GiB; {available / GIB:.1f} GiB of memory is available",
            hint="load with fewer parallel streams or a smaller context",
        )


def _genai() -> Any:
    try:
        import openvino_genai
    except ImportError as exc:
        raise TargetUnavailableError(
            "openvino-genai is not installed", hint="pip install 'edgekit[openvino]'"
        ) from exc
    return openvino_genai


@dataclass(kw_only=True)
class _Live:
    """One request the pipeline holds."""

    handle: Any  # openvino_genai.GenerationHandle
    prompt: tuple[int, ...]
    stops: frozenset[int]  # the ids that end it (none with ignore_eos)
    cached: int
    sampled: list[int] = field(default_factory=list)  # every id, an end-of-sequence one too
    log_probs: list[float] = field(default_factory=list)  # of each sampled id (if kept)
    reported: bool = False  # its first step was given (with ``cached``)
    ended: bool = False


class OpenVinoBatch:
    """Up to ``slots`` sequences on one ContinuousBatchingPipeline (a BatchRuntime; see the
    module text). Driven by one thread; ``close`` may come from another once it stopped."""

    def __init__(self, pipe: Any, plan: KvPlan, *, keep_log_probs: bool = False) -> None:
        self._pipe: Any = pipe
        self.plan = plan
        self._keep_log_probs = keep_log_probs
        self._live: dict[int, _Live] = {}
        self._next_id = 0  # the pipeline's request ids: never reused, whatever the loop's are
        self._prefix = PrefixMirror(block=plan.block, blocks=plan.blocks)

    @property
    def slots(self) -> int:
        return self.plan.slots

    @property
    def context(self) -> int:
        return self.plan.context

    def tokenizer(self) -> Any:
        """The pipeline's openvino_genai.Tokenizer (a batched session needs no LLMPipeline
        for its tokens)."""
        pipe = self._open()
        with backend_errors(TARGET, "reading the tokenizer"):
            return pipe.get_tokenizer()

    def cache_usage(self) -> float:
        """Percent of the KV cache's blocks the sequences of the last step held."""
        pipe = self._open()
        with backend_errors(TARGET, "reading the pipeline's metrics"):
            return float(pipe.get_metrics().cache_usage)

    def cache_bytes(self) -> int | None:
        """The KV cache's size: as allocated (at the first step), else as planned."""
        pipe = self._open()
        with backend_errors(TARGET, "reading the pipeline's metrics"):
            allocated = int(pipe.get_metrics().kv_cache_size_in_bytes)
        return allocated or self.plan.bytes

    def log_probs(self, rid: int) -> tuple[float, ...]:
        """The log-probability of each id ``rid`` sampled so far (its end-of-sequence id
        too), as the pipeline computed it; empty unless opened with ``keep_log_probs``.

        Raises:
            GenerationError: ``rid`` is not running.
        """
        live = self._live.get(rid)
        if live is None:
            raise GenerationError(f"request {rid} is not running", hint="read it before remove")
        return tuple(live.log_probs)

    # --- requests ---------------------------------------------------------------------

    def add(self, request: SeqRequest) -> None:
        """Start ``request``; the pipeline restores the blocks of its prompt it holds.

        Raises:
            GenerationError: the prompt is empty or does not fit the context, every slot is
                taken, or ``request.rid`` is running already.
        """
        pipe = self._open()
        check_admission(
            request,
            context=self.context,
            slots=self.slots,
            running=self._live,
            busy=len(self._live),
        )
        prompt = tuple(request.prompt)
        import numpy as np
        import openvino as ov

        room = self.context - len(prompt)
        with backend_errors(TARGET, "adding a request"):
            config = configure(pipe.get_config(), request.sampling, room)
            config.max_new_tokens = room  # the context's room: max_tokens is the loop's
            config.stop_strings = set()  # stop strings are the loop's too
            config.logprobs = 1 if self._keep_log_probs else 0
            stops: frozenset[int] = frozenset()
            if not request.sampling.ignore_eos:
                stops = frozenset({int(config.eos_token_id), *map(int, config.stop_token_ids)})
            ids = ov.Tensor(np.asarray([prompt], dtype=np.int64))
            handle = pipe.add_request(self._next_id, ids, config)
        self._next_id += 1
        cached = self._prefix.start(request.rid, prompt)
        self._live[request.rid] = _Live(handle=handle, prompt=prompt, stops=stops, cached=cached)

    def step(self) -> list[SeqStep]:
        """One pipeline step; what each request produced (a request still prefilling, or
        one that ended, produces nothing)."""
        pipe = self._open()
        out: list[SeqStep] = []
        with backend_errors(TARGET, "a batched step"):
            if pipe.has_non_finished_requests():
                pipe.step()
            for rid, live in self._live.items():
                if not live.ended:
                    produced = self._read(rid, live)
                    if produced is not None:
                        out.append(produced)
        return out

    def _read(self, rid: int, live: _Live) -> SeqStep | None:
        """What ``live``'s handle holds after a step, as a SeqStep (None: nothing)."""
        ids: list[int] = []
        reason = "NONE"
        if live.handle.can_read():
            for output in live.handle.read().values():
                ids.extend(int(t) for t in output.generated_ids)
                if self._keep_log_probs:
                    live.log_probs.extend(float(p) for p in output.generated_log_probs)
                if output.finish_reason.name != "NONE":
                    reason = output.finish_reason.name
        end = self._end(rid, live, reason, produced=bool(ids))
        if not ids and end is None:
            return None
        first = not live.reported and bool(ids)
        if first:  # the prompt is in: its blocks are computed
            self._prefix.computed(rid, live.prompt)
            live.reported = True
        live.sampled.extend(ids)
        if end == "stop" and ids and ids[-1] in live.stops:
            ids.pop()  # the end-of-sequence id is no text
        if end is None:
            self._prefix.grow(rid, len(live.prompt) + len(live.sampled))
        else:
            live.ended = True
            self._release(rid, live)
        return SeqStep(rid=rid, tokens=tuple(ids), end=end, cached=live.cached if first else 0)

    def _end(self, rid: int, live: _Live, reason: str, *, produced: bool) -> SeqEnd | None:
        if reason == "LENGTH":
            return "length"
        if reason != "NONE":  # STOP (end-of-sequence), TOOL_CALL
            return "stop"
        if produced:
            return None
        status = live.handle.get_status().name
        if status in ("RUNNING", "FINISHED"):
            return None
        # IGNORED: the scheduler found no room for it (never with the cache sized for every
        # slot's context); it ends as a sequence whose context is full
        log.warning("OpenVINO's scheduler dropped request %d (%s): no room", rid, status)
        self._prefix.clear()
        return "length"

    def remove(self, rid: int) -> None:
        """Drop ``rid``'s request (the pipeline frees it at its next step and keeps its
        blocks for prefix reuse). An id not running is ignored."""
        live = self._live.pop(rid, None)
        if live is None or self._pipe is None:
            return
        if not live.ended:
            with backend_errors(TARGET, "removing a request"):
                live.handle.cancel()
            self._release(rid, live)

    def _release(self, rid: int, live: _Live) -> None:
        # the last sampled id was never fed back: its KV is not in the cache
        computed = (*live.prompt, *live.sampled[:-1]) if live.reported else ()
        self._prefix.release(rid, computed)

    def forget_prefixes(self) -> None:
        """openvino-genai's ContinuousBatchingPipeline has no call that drops its prefix
        cache (its block manager keeps every finished sequence's blocks until the pool needs
        them): refused rather than claimed.

        Raises:
            GenerationError: always.
        """
        raise GenerationError(
            "OpenVINO's batch pipeline cannot drop its prefix cache",
            hint="load the model again to start from an empty cache, or load without parallel",
        )

    def close(self) -> None:
        """Free the pipeline and its KV cache. Idempotent."""
        pipe, self._pipe = self._pipe, None
        if pipe is None:
            return
        live, self._live = self._live, {}
        try:
            with backend_errors(TARGET, "closing"):
                for request in live.values():
                    request.handle.cancel()
                if pipe.has_non_finished_requests():
                    pipe.step()  # frees what was cancelled (nothing is left to compute)
        finally:
            live.clear()
            del pipe

    def _open(self) -> Any:
        if self._pipe is None:
            raise GenerationError("the batched runtime is closed", hint="load the model again")
        return self._pipe
