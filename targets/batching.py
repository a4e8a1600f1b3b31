"""The contract of a runtime that advances several generations at once (continuous
batching), and the values it takes and gives.

A ``BatchRuntime`` owns one loaded model's batched machinery (llama.cpp's ``llama_batch``
with one sequence id per slot, OpenVINO GenAI's ``ContinuousBatchingPipeline``, ...). It is
driven by exactly one thread, edgekit's batch loop (targets/batch_loop.py), which between
two steps adds the requests waiting for a free slot and removes the ones that ended or
were cancelled, so new requests join the running batch and finished ones leave it. The
runtime works on token ids only: text, stop strings, ``max_tokens`` and cancellation are
the loop's; sampling (temperature, top-p/k, min-p, repeat penalty, seed) and
end-of-sequence are the runtime's, each request with its own sampler and seed.

Prefix reuse: a runtime that can keep the KV cache of a prompt prefix (a shared system
prompt, the conversation so far) reports how many prompt tokens it did not recompute in
``SeqStep.cached`` on the request's first step.
"""

from __future__ import annotations

from collections.abc import Container
from dataclasses import dataclass
from typing import Literal, Protocol

from edgekit.targets.values import Sampling

from edgekit.errors import GenerationError

# Why a sequence ended, as the runtime sees it: "stop" end-of-sequence (never with
# ignore_eos), "length" the context is full.
SeqEnd = Literal["stop", "length"]


@dataclass(frozen=True, kw_only=True)
class SeqRequest:
    """One generation for the runtime: ``rid`` is unique while the request lives."""

    rid: int
    prompt: tuple[int, ...]  # checked ids, not empty, shorter than the slot's context
    sampling: Sampling


@dataclass(frozen=True, kw_only=True)
class SeqStep:
    """What one step produced for one request."""

    rid: int
    tokens: tuple[int, ...]  # ids sampled in this step, in order (usually one)
    end: SeqEnd | None = None  # set on the last step of the sequence
    cached: int = 0  # first step only: prompt tokens taken from a cached prefix


class BatchRuntime(Protocol):
    """One loaded model running up to ``slots`` sequences at once. Called from one thread
    only (the batch loop's); ``close`` may come from another thread after the loop stopped.

    Each method raises GenerationError for what the runtime does wrong (the loop fails the
    requests concerned and keeps serving the others where it can).
    """

    @property
    def slots(self) -> int:
        """How many sequences run at once (what their KV cache was sized for)."""
        ...

    @property
    def context(self) -> int:
        """Tokens one sequence may hold, prompt and generation together."""
        ...

    def add(self, request: SeqRequest) -> None:
        """Start ``request`` in a free slot (the loop never adds more than ``slots``). Its
        prompt is evaluated by the next ``step`` calls, possibly in chunks beside the
        other sequences' decoding.

        Raises:
            GenerationError: the prompt does not fit the slot's context.
        """
        ...

    def step(self) -> list[SeqStep]:
        """Advance every active sequence: prefill what is pending, decode one token for
        each sequence whose prompt is in. Returns what each request produced (a request
        still prefilling may produce nothing). A sequence that ended (``SeqStep.end``) is
        not stepped again; the loop removes it."""
        ...

    def remove(self, rid: int) -> None:
        """Free ``rid``'s slot: it ended, was cancelled or failed. Its KV cache may be kept
        for prefix reuse, but never read by another sequence beyond the shared prefix."""
        ...

    def forget_prefixes(self) -> None:
        """Drop the KV cache kept for prefix reuse by sequences that are not running
        (``Session.clear_cache``): the next prompt is evaluated from scratch, unless it
        shares a prefix with a sequence running now.

        Raises:
            GenerationError: the runtime has no way to drop it.
        """
        ...

    def close(self) -> None:
        """Free the runtime's memory. Idempotent."""
        ...


def check_admission(
    request: SeqRequest, *, context: int, slots: int, running: Container[int], busy: int
) -> None:
    """The checks every runtime's ``add`` makes before it touches its machinery.

    Raises:
        GenerationError: the prompt is empty or leaves no room for a new token in the
            context, ``request.rid`` is running already, or all ``slots`` are taken
            (``busy`` of them).
    """
    if not 0 < len(request.prompt) < context:
        raise GenerationError(
            f"the prompt has {len(request.prompt)} tokens; a sequence holds {context}, "
            "the prompt and at least one new token",
            hint="shorten the prompt or load with a larger context",
        )
    if request.rid in running:
        raise GenerationError(
            f"request {request.rid} is running already", hint="give each request its own id"
        )
    if busy >= slots:
        raise GenerationError(
            f"all {slots} slots are taken", hint="remove a request that ended first"
        )
