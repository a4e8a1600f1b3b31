"""The contract of a batched session (``load(..., parallel=N)``: continuous batching), on
every registered target whose ``load`` takes ``parallel``.

Generations run together: each stream of a batch gives the greedy tokens it gives alone
(the same session, one stream at a time); where they differ, the first differing position
must be a near tie, shown by the single-stream session's logits there (the top two within
NEAR_TIE of the largest logit's size: batched kernels sum in another order); cancelling or
closing one stream leaves the others' tokens unchanged; stop strings, max_tokens and seeds
hold per stream; an abandoned stream frees its slot at once; closing the session ends every
stream. A target without batching is skipped with that reason.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from edgekit.errors import GenerationError
from tests.contract.conftest import Variant
from tests.contract.test_session_contract import ABANDON_S, GREEDY, PROMPTS, WAIT_S

SLOTS = 3
TOKENS = 24
NEAR_TIE = 1e-3  # of the largest logit's magnitude: the 32-bit parity tests' bound


@pytest.fixture
def batched(variant: Variant) -> Iterator[Any]:
    if "parallel" not in variant.target.load_settings:
        pytest.skip(f"{variant.target.display_name} has no batched runtime (no parallel setting)")
    s = variant.load(parallel=SLOTS)
    yield s
    s.close()


def _ids(handle: Any) -> list[int]:
    handle.result()
    return list(handle.token_ids)


def _together(session: Any, prompts: tuple[str, ...], **sampling: Any) -> list[list[int]]:
    handles = [session.stream(p, max_tokens=TOKENS, **sampling) for p in prompts]
    out: list[list[int]] = [[] for _ in prompts]

    def read(i: int) -> None:
        out[i] = _ids(handles[i])

    threads = [threading.Thread(target=read, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WAIT_S)
    assert not any(t.is_alive() for t in threads)
    return out


def _same_or_near_tie(variant: Variant, prompt: str, alone: list[int], batched: list[int]) -> None:
    if alone == batched:
        return
    k = next(i for i, (a, b) in enumerate(zip(alone, batched, strict=False)) if a != b)
    with variant.load(**variant.known(logits=True, kv_cache="f32")) as single:
        ids = single.tokenize(prompt) + alone[:k]
        row = np.asarray(single.logits(ids))[-1]
    top2 = np.sort(row)[-2:]
    margin = float(top2[1] - top2[0])
    assert margin <= NEAR_TIE * float(np.abs(row).max()), (
        f"{prompt!r}: token {k} differs ({alone[k]} alone, {batched[k]} batched) where the "
        f"logits' top two are {margin:.3g} apart: not a near tie"
    )


def test_each_stream_gives_what_it_gives_alone(batched: Any, variant: Variant) -> None:
    assert batched.parallel == SLOTS
    alone = [_ids(batched.stream(p, max_tokens=TOKENS, **GREEDY)) for p in PROMPTS]
    together = _together(batched, PROMPTS, **GREEDY)  # four requests on three slots
    for prompt, a, b in zip(PROMPTS, alone, together, strict=True):
        assert len(b) == TOKENS
        _same_or_near_tie(variant, prompt, a, b)


def test_stream_text_equals_generate(batched: Any) -> None:
    g = batched.generate(PROMPTS[0], max_tokens=TOKENS, **GREEDY)
    streamed = list(batched.stream(PROMPTS[0], max_tokens=TOKENS, **GREEDY))
    assert "".join(c.text for c in streamed) == g.text
    assert sum(c.tokens for c in streamed) == g.completion_tokens == TOKENS
    assert streamed[-1].finish_reason == g.finish_reason == "length"


def test_stop_strings_cut_each_stream(batched: Any) -> None:
    whole = batched.generate(PROMPTS[1], max_tokens=TOKENS, **GREEDY).text
    stop = whole.strip()[3:6]
    if not stop.strip():
        pytest.skip("the tiny model's text has no stop-worthy piece here")
    cut = batched.generate(PROMPTS[1], max_tokens=TOKENS, stop=[stop], **GREEDY)
    assert cut.finish_reason == "stop" and stop not in cut.text
    assert whole.startswith(cut.text)


def test_seeded_sampling_repeats(batched: Any) -> None:
    sampled = {"temperature": 1.0, "top_p": 1.0, "top_k": 0, "min_p": 0.0, "seed": 7}
    first = batched.generate(PROMPTS[2], max_tokens=TOKENS, ignore_eos=True, **sampled).text
    again = batched.generate(PROMPTS[2], max_tokens=TOKENS, ignore_eos=True, **sampled).text
    assert first == again


def test_cancelling_one_stream_leaves_the_others_unchanged(batched: Any) -> None:
    alone = [_ids(batched.stream(p, max_tokens=TOKENS, **GREEDY)) for p in PROMPTS[:2]]
    victim = batched.stream(PROMPTS[2], max_tokens=10 * TOKENS, **GREEDY)
    next(victim)
    keep = [batched.stream(p, max_tokens=TOKENS, **GREEDY) for p in PROMPTS[:2]]
    next(keep[0])
    victim.cancel()
    assert list(victim)[-1].finish_reason == "cancelled"
    assert [_ids(h) for h in keep] == alone


def test_an_abandoned_stream_returns_at_once_and_frees_its_slot(batched: Any) -> None:
    streams = [batched.stream(p, max_tokens=100_000, **GREEDY) for p in PROMPTS[:SLOTS]]
    for s in streams:
        next(s)
    started = time.monotonic()
    streams[0].close()
    del streams[1]
    assert time.monotonic() - started < ABANDON_S
    # the two freed slots serve new requests while the third stream still runs
    g = batched.generate(PROMPTS[3], max_tokens=4, **GREEDY)
    assert g.completion_tokens == 4
    streams[-1].close()


def test_clear_cache_drops_the_kept_prefixes_or_says_it_cannot(batched: Any) -> None:
    # the same prompt twice: the second may reuse the first's prefix
    for _ in range(2):
        again = batched.stream(PROMPTS[0], max_tokens=4, **GREEDY)
        again.result()
    try:
        batched.clear_cache()
    except GenerationError as exc:  # a runtime with no way to drop them says so
        assert "cannot drop" in exc.message and exc.hint
        return
    after = batched.stream(PROMPTS[0], max_tokens=4, **GREEDY)
    assert after.result().completion_tokens == 4
    assert after.cached_tokens == 0, f"{again.cached_tokens} reused before, still some after"


def test_closing_the_session_ends_every_stream(variant: Variant) -> None:
    if "parallel" not in variant.target.load_settings:
        pytest.skip(f"{variant.target.display_name} has no batched runtime (no parallel setting)")
    s = variant.load(parallel=2)
    running = [s.stream(p, max_tokens=100_000, **GREEDY) for p in PROMPTS[:2]]
    for h in running:
        next(h)
    started = time.monotonic()
    s.close()
    assert time.monotonic() - started < 5
    assert all(list(h) == [] for h in running)
    s.close()
