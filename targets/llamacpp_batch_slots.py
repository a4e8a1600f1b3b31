"""The slots of llama.cpp's batched runtime as plain bookkeeping (targets/llamacpp_batch.py
drives llama.cpp with them): which tokens each sequence's KV cache holds, which slot a new
request takes and how much of its prompt it reuses, and what one step puts in the batch.

No llama.cpp here, so the rules are tested without a model. As in llama.cpp's server, one
slot is one sequence id of one context; a freed slot keeps its KV cache (and the tokens
it holds) until it is taken again, so a later prompt with the same prefix reuses it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

# A prefix held by a running sequence is copied into the new request's slot only when it
# saves at least this many tokens over the best free slot: the copy moves the whole
# sequence's KV buffers (llama.cpp copies a per-sequence cache only whole), which costs
# about as much as evaluating a few dozen tokens of a small model on a CPU.
MIN_COPY_GAIN = 32
# Prompt tokens evaluated even when the cache holds more: the last one's logits give the
# first token, and evaluating two keeps it on llama.cpp's many-row CPU kernels, as when
# the whole prompt is evaluated; one row alone takes the one-row kernels, which round
# otherwise (logits apart by up to ~0.5 on the default model), so a reused prefix would
# change what a seed or a near-tie draws.
EVALUATED = 2


class Slot:
    """One sequence id: the request it runs (``rid`` None: free) and its KV cache."""

    __slots__ = (
        "cached",
        "ended",
        "generated",
        "ignore_eos",
        "last_used",
        "next_token",
        "pending",
        "prompt_len",
        "reported",
        "reused",
        "rid",
        "seq",
    )

    def __init__(self, seq: int) -> None:
        self.seq = seq
        self.rid: int | None = None
        self.cached: list[int] = []  # tokens whose KV the sequence holds, positions 0..n-1
        self.pending: list[int] = []  # prompt tokens still to evaluate
        self.next_token: int | None = None  # sampled, fed at the next step
        self.prompt_len = 0
        self.generated = 0
        self.reused = 0  # prompt tokens taken from the cache (told on the first step)
        self.reported = False  # the first step was reported
        self.ended = False
        self.ignore_eos = False  # end-of-generation tokens are generated like any other
        self.last_used = 0  # when the slot was last taken (least recently used goes first)

    @property
    def busy(self) -> bool:
        return self.rid is not None

    def start(
        self, rid: int, prompt: Sequence[int], *, reuse: int, clock: int, ignore_eos: bool
    ) -> None:
        """Run ``rid`` here: the first ``reuse`` prompt tokens are in the cache already."""
        self.rid = rid
        self.ignore_eos = ignore_eos
        self.cached = list(prompt[:reuse])
        self.pending = list(prompt[reuse:])
        self.next_token = None
        self.prompt_len = len(prompt)
        self.generated = 0
        self.reused = reuse
        self.reported = False
        self.ended = False
        self.last_used = clock

    def free(self) -> None:
        """The request left; the KV cache (``cached``) stays for prefix reuse."""
        self.rid = None
        self.pending = []
        self.next_token = None
        self.ended = False

    def forget(self) -> None:
        """The KV cache is gone (cleared, or its state is unknown after a failure)."""
        self.cached = []


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading tokens ``a`` and ``b`` share."""
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


@dataclass(frozen=True, kw_only=True)
class Placement:
    """Where a new request goes: ``slot`` runs it, ``source`` (when not None) is the
    running sequence whose cache is copied into it first, ``reuse`` prompt tokens are kept."""

    slot: Slot
    source: Slot | None
    reuse: int


def place(slots: Sequence[Slot], prompt: Sequence[int], *, reuse: bool) -> Placement:
    """The free slot for ``prompt``: the one whose kept cache shares the longest prefix
    with it, else the least recently used; or a copy of a running sequence's prefix when
    that saves ``MIN_COPY_GAIN`` tokens more. The last ``EVALUATED`` prompt tokens are
    always evaluated. ``reuse`` False: nothing is reused.

    Raises:
        ValueError: no slot is free (the caller checks first).
    """
    free = [s for s in slots if not s.busy]
    if not free:
        raise ValueError("no free slot")
    limit = max(0, len(prompt) - EVALUATED)
    if not reuse:
        return Placement(slot=min(free, key=lambda s: s.last_used), source=None, reuse=0)
    best = max(free, key=lambda s: (min(common_prefix(s.cached, prompt), limit), -s.last_used))
    best_reuse = min(common_prefix(best.cached, prompt), limit)
    running = [s for s in slots if s.busy and s.cached]
    if running:
        donor = max(running, key=lambda s: common_prefix(s.cached, prompt))
        donor_reuse = min(common_prefix(donor.cached, prompt), limit)
        if donor_reuse - best_reuse >= MIN_COPY_GAIN:
            target = min(free, key=lambda s: s.last_used)
            return Placement(slot=target, source=donor, reuse=donor_reuse)
    if best_reuse > 0:
        return Placement(slot=best, source=None, reuse=best_reuse)
    return Placement(slot=min(free, key=lambda s: s.last_used), source=None, reuse=0)


@dataclass(frozen=True, kw_only=True)
class Part:
    """One slot's tokens in a step's batch, from position ``pos``; ``sample``: the logits
    of the last one are wanted (a decode token, or the last chunk of a prompt)."""

    slot: Slot
    tokens: tuple[int, ...]
    pos: int
    sample: bool


def plan_step(slots: Sequence[Slot], n_batch: int) -> list[list[Part]]:
    """What the next step evaluates, one list per ``llama_decode``: first one decode token
    of every generating slot, then a prompt chunk of each slot still prefilling, oldest
    request first, while the chunks hold ``n_batch`` tokens in all (the first always
    goes), so decoding goes on while a long prompt prefills.

    A chunk is ``min(rest of the prompt, n_batch)`` tokens, in a call of its own: the
    chunks a prompt is cut into are then those of the single-stream session, whose
    ``Llama.eval`` cuts at ``n_batch`` too. llama.cpp's CPU kernels round differently for
    one row than for many, so a prompt cut elsewhere (or mixed into other sequences'
    tokens, which llama.cpp splits into equal-length micro-batches per sequence) gives
    logits that differ in the last digits and may flip a near-tie."""
    calls: list[list[Part]] = []
    decode = [
        Part(slot=s, tokens=(s.next_token,), pos=len(s.cached), sample=True)
        for s in slots
        if s.busy and not s.ended and s.next_token is not None
    ][:n_batch]
    if decode:
        calls.append(decode)
    used = 0
    prefilling = [s for s in slots if s.busy and not s.ended and s.pending]
    for slot in sorted(prefilling, key=lambda s: s.last_used):
        chunk = tuple(slot.pending[:n_batch])
        if used and used + len(chunk) > n_batch:
            break
        done = len(chunk) == len(slot.pending)
        calls.append([Part(slot=slot, tokens=chunk, pos=len(slot.cached), sample=done)])
        used += len(chunk)
    return calls
