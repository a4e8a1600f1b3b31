"""The contract every runnable target's Session keeps, checked on each registered target.

What a caller of any Session may rely on (targets/session.py, targets/handles.py):
streaming gives the text generate gives; stop strings cut before the stop; a seed repeats
a sampled generation; a cancel from another thread stops the running generation at its
next token, and a queued one leaves the queue; an abandoned stream or handle returns at
once and frees the session; close is idempotent and final; logits match the transformers
reference; concurrent calls are serialized, each with its own answer; bad arguments raise
SettingError, and an unknown load setting lists the valid ones.

Logits tolerances are the parity tests' (test_gguf_parity.py): a 32-bit variant within
1e-3 of the largest reference logit and the same argmax everywhere; a 16-bit one within
1e-2, the same argmax wherever the reference's top-2 margin exceeds twice the largest
error (at least 80% of positions).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
from edgekit.targets.values import StreamChunk

from edgekit.errors import EdgekitError, SettingError
from tests.contract.conftest import Variant
from tests.tiny_models import training_text

PROMPT = "It is a truth universally acknowledged, that a single man in possession"
PROMPTS = (PROMPT, "However little known the feelings", "My dear Mr. Bennet,", "Is he married?")
GREEDY: dict[str, Any] = {"temperature": 0.0, "ignore_eos": True}
# Closing or dropping a stream returns within this; the rest of the generation (about a
# thousand tokens of the tiny model) takes seconds on every target.
ABANDON_S = 0.5
WAIT_S = 120.0  # a thread that waits its turn finishes within this
EXTRA_TOKENS = 2  # tokens a cancelled generation may still yield: the one in flight
CANCELLABLE = 200  # the length of a generation a test cancels


def _text(chunks: Iterator[StreamChunk]) -> tuple[str, int, list[StreamChunk]]:
    seen = list(chunks)
    return "".join(c.text for c in seen), sum(c.tokens for c in seen), seen


def _in_thread(call: Callable[[], Any], timeout: float = WAIT_S) -> Any:
    """Run ``call`` on another thread; its result, or its exception raised here."""
    out: list[Any] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            out.append(call())
        except BaseException as exc:
            errors.append(exc)

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(timeout)
    assert not worker.is_alive(), f"the call did not finish within {timeout} s"
    if errors:
        raise errors[0]
    return out[0]


def _long(session: Any) -> int:
    """A generation length that fills most of the context: long enough that waiting for
    its end is seconds, not the bound a stream's abandon must keep."""
    return max(64, session.info.context_length - len(session.tokenize(PROMPT)) - 16)


# --- streaming, stop strings, sampling -----------------------------------------------------


def test_stream_equals_generate(session: Any) -> None:
    full = session.generate(PROMPT, max_tokens=24, temperature=0)
    text, tokens, chunks = _text(session.stream(PROMPT, max_tokens=24, temperature=0))
    assert (text, tokens) == (full.text, full.completion_tokens)
    assert full.completion_tokens > 0 and full.prompt_tokens == len(session.tokenize(PROMPT))
    assert chunks[-1].finish_reason == full.finish_reason
    assert all(c.finish_reason is None for c in chunks[:-1])


def test_chat_stream_equals_chat(session: Any) -> None:
    messages = [{"role": "user", "content": "Is he married or single?"}]
    reply = session.chat(messages, max_tokens=16, **GREEDY)
    text, tokens, _ = _text(session.chat_stream(messages, max_tokens=16, **GREEDY))
    assert (text, tokens) == (reply.text, reply.completion_tokens)
    assert reply.completion_tokens == 16 and reply.finish_reason == "length"


def test_tokens_stream_equals_text_stream(session: Any) -> None:
    ids = session.tokenize(PROMPT)
    by_text = session.generate(PROMPT, max_tokens=12, **GREEDY)
    text, tokens, _ = _text(session.stream_from_tokens(ids, max_tokens=12, **GREEDY))
    assert (text, tokens) == (by_text.text, by_text.completion_tokens)


def test_stop_strings(session: Any) -> None:
    full = session.generate(PROMPT, max_tokens=32, **GREEDY)
    assert len(full.text) >= 8, full.text
    stop = full.text[4:7]
    expected = full.text[: full.text.index(stop)]
    stopped = session.generate(PROMPT, max_tokens=32, stop=[stop], **GREEDY)
    assert (stopped.text, stopped.finish_reason) == (expected, "stop")
    assert stopped.completion_tokens <= full.completion_tokens
    text, _, chunks = _text(session.stream(PROMPT, max_tokens=32, stop=[stop], **GREEDY))
    assert (text, chunks[-1].finish_reason) == (expected, "stop")
    # a stop string the text never holds changes nothing
    assert session.generate(PROMPT, max_tokens=32, stop=["\x00never"], **GREEDY) == full


def test_max_tokens_and_length(session: Any) -> None:
    g = session.generate(PROMPT, max_tokens=5, **GREEDY)
    assert (g.completion_tokens, g.finish_reason) == (5, "length")


def test_greedy_repeats(session: Any) -> None:
    assert session.generate(PROMPT, max_tokens=16, temperature=0) == session.generate(
        PROMPT, max_tokens=16, temperature=0
    )


def test_seeded_sampling_repeats(session: Any) -> None:
    def sample(seed: int) -> str:
        return str(
            session.generate(
                PROMPT, max_tokens=24, temperature=1.0, seed=seed, ignore_eos=True
            ).text
        )

    first, again, other = sample(7), sample(7), sample(8)
    assert first == again
    assert first != other  # the seed is used: 24 tokens of a random model at temperature 1
    text, _, _ = _text(
        session.stream(PROMPT, max_tokens=24, temperature=1.0, seed=7, ignore_eos=True)
    )
    assert text == first


# --- cancel, abandon, close -------------------------------------------------------------------


def test_cancel_from_another_thread_stops_at_the_next_token(session: Any) -> None:
    stream = session.stream(PROMPT, max_tokens=CANCELLABLE, **GREEDY)
    before = [next(stream), next(stream)]
    _in_thread(session.cancel, timeout=10)
    after = list(stream)
    assert (before + after)[-1].finish_reason == "cancelled"
    assert sum(c.tokens for c in after) <= EXTRA_TOKENS, after
    # the cancel was for that generation only
    g = session.generate(PROMPT, max_tokens=4, **GREEDY)
    assert (g.completion_tokens, g.finish_reason) == (4, "length")


def test_cancel_with_nothing_running_does_not_stop_the_next_call(session: Any) -> None:
    session.cancel()
    g = session.generate(PROMPT, max_tokens=4, **GREEDY)
    assert (g.completion_tokens, g.finish_reason) == (4, "length")


def test_closing_a_stream_returns_at_once_and_frees_the_session(session: Any) -> None:
    stream = session.stream(PROMPT, max_tokens=_long(session), **GREEDY)
    next(stream)
    next(stream)
    start = time.monotonic()
    stream.close()
    assert time.monotonic() - start < ABANDON_S
    assert list(stream) == []
    # the next call, from this thread or another, runs
    g = _in_thread(lambda: session.generate(PROMPT, max_tokens=4, **GREEDY))
    assert g.completion_tokens == 4
    assert session.generate(PROMPT, max_tokens=4, **GREEDY) == g


def test_dropping_a_stream_returns_at_once_and_frees_the_session(session: Any) -> None:
    stream = session.stream(PROMPT, max_tokens=_long(session), **GREEDY)
    next(stream)
    start = time.monotonic()
    del stream  # the last reference: no garbage collection needed to free the session
    assert time.monotonic() - start < ABANDON_S
    g = _in_thread(lambda: session.generate(PROMPT, max_tokens=4, **GREEDY))
    assert g.completion_tokens == 4


def test_a_stream_left_open_on_this_thread_is_refused_not_corrupted(session: Any) -> None:
    stream = session.stream(PROMPT, max_tokens=16, **GREEDY)
    first = next(stream)
    with pytest.raises(EdgekitError, match="busy"):
        session.generate(PROMPT, max_tokens=2, **GREEDY)
    rest = list(stream)
    whole = session.generate(PROMPT, max_tokens=16, **GREEDY)
    assert first.text + "".join(c.text for c in rest) == whole.text


def test_close_is_idempotent_and_final(variant: Variant) -> None:
    s = variant.load()
    assert s.generate(PROMPT, max_tokens=2, **GREEDY).completion_tokens == 2
    s.close()
    s.close()
    with pytest.raises(EdgekitError):
        s.generate(PROMPT, max_tokens=2)
    with pytest.raises(EdgekitError):
        list(s.stream(PROMPT, max_tokens=2))
    with pytest.raises(EdgekitError):
        s.chat([{"role": "user", "content": "hi"}], max_tokens=2)


def test_close_ends_an_open_stream(variant: Variant) -> None:
    s = variant.load()
    stream = s.stream(PROMPT, max_tokens=_long(s), **GREEDY)
    next(stream)
    start = time.monotonic()
    s.close()
    assert time.monotonic() - start < ABANDON_S
    assert list(stream) == []
    with pytest.raises(EdgekitError):
        s.generate(PROMPT, max_tokens=2)


def test_a_session_is_a_context_manager(variant: Variant) -> None:
    with variant.load() as s:
        assert s.generate(PROMPT, max_tokens=2, **GREEDY).completion_tokens == 2
    with pytest.raises(EdgekitError):
        s.generate(PROMPT, max_tokens=2)


# --- generation handles -----------------------------------------------------------------------


def _queued(session: Any, prompt: str) -> tuple[Any, threading.Thread, list[Any]]:
    """A handle whose reader (another thread) waits in the queue, and that reader's chunks
    (filled when it returns)."""
    handle = session.start(prompt, max_tokens=8, **GREEDY)
    got: list[Any] = []
    reader = threading.Thread(target=lambda: got.extend(handle), daemon=True)
    reader.start()
    deadline = time.monotonic() + 10
    while handle.state != "queued" and time.monotonic() < deadline:
        time.sleep(0.005)
    assert handle.state == "queued"
    return handle, reader, got


def test_a_handle_gives_what_generate_gives(session: Any) -> None:
    expected = session.generate(PROMPT, max_tokens=16, **GREEDY)
    handle = session.start(PROMPT, max_tokens=16, **GREEDY)
    assert handle.state == "pending" and not handle.started
    assert handle.result() == expected
    assert handle.state == "finished" and handle.started
    assert handle.prompt_tokens == expected.prompt_tokens
    by_ids = session.start(session.tokenize(PROMPT), max_tokens=16, **GREEDY).result()
    assert by_ids == expected
    messages = [{"role": "user", "content": "Is he married or single?"}]
    assert session.start(messages, max_tokens=8, **GREEDY).result() == session.chat(
        messages, max_tokens=8, **GREEDY
    )


def test_a_handle_cancelled_from_another_thread_stops_at_the_next_token(session: Any) -> None:
    with session.start(PROMPT, max_tokens=CANCELLABLE, **GREEDY) as handle:
        before = [next(handle), next(handle)]
        _in_thread(handle.cancel, timeout=10)
        after = list(handle)
    assert (before + after)[-1].finish_reason == "cancelled"
    assert sum(c.tokens for c in after) <= EXTRA_TOKENS, after
    assert handle.result().finish_reason == "cancelled"


def test_a_queued_handle_cancelled_leaves_the_queue(session: Any) -> None:
    running = session.start(PROMPT, max_tokens=_long(session), **GREEDY)
    next(running)
    queued, reader, got = _queued(session, PROMPTS[1])
    queued.cancel()
    reader.join(10)  # while the first still holds the session
    assert not reader.is_alive()
    assert [(c.text, c.tokens, c.finish_reason) for c in got] == [("", 0, "cancelled")]
    assert not queued.started
    assert next(running).finish_reason is None  # the running one was not touched
    running.close()
    assert session.generate(PROMPT, max_tokens=4, **GREEDY).completion_tokens == 4


def test_a_closed_queued_handle_never_starts(session: Any) -> None:
    running = session.start(PROMPT, max_tokens=_long(session), **GREEDY)
    next(running)
    queued, reader, got = _queued(session, PROMPTS[1])
    queued.close()
    reader.join(10)
    assert not reader.is_alive() and got == []
    assert not queued.started and queued.state == "closed"
    running.close()


def test_session_cancel_stops_only_the_running_generation(session: Any) -> None:
    expected = session.generate(PROMPTS[1], max_tokens=8, **GREEDY)
    running = session.start(PROMPT, max_tokens=_long(session), **GREEDY)
    next(running)
    queued, reader, got = _queued(session, PROMPTS[1])
    session.cancel()
    assert list(running)[-1].finish_reason == "cancelled"
    reader.join(WAIT_S)
    assert not reader.is_alive()
    assert "".join(c.text for c in got) == expected.text
    assert queued.result() == expected


def test_closing_a_handle_from_another_thread_returns_at_once(session: Any) -> None:
    handle = session.start(PROMPT, max_tokens=_long(session), **GREEDY)
    next(handle)
    start = time.monotonic()
    _in_thread(handle.close, timeout=10)
    assert time.monotonic() - start < ABANDON_S
    assert list(handle) == []
    assert handle.state == "closed"
    g = _in_thread(lambda: session.generate(PROMPT, max_tokens=4, **GREEDY))
    assert g.completion_tokens == 4


# --- logits against the reference ------------------------------------------------------------


def _reference(variant: Variant, ids: list[int]) -> np.ndarray:
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(variant.source, dtype=torch.float32)
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].numpy()


def test_logits_match_transformers(variant: Variant) -> None:
    from transformers import AutoTokenizer

    if not variant.target.evaluates:
        pytest.skip(f"{variant.target.display_name} gives no per-position logits (evaluates)")
    if not variant.quant.lossless:
        pytest.skip(f"{variant.target.format.display} has no lossless quantization to compare")
    tokenizer = AutoTokenizer.from_pretrained(variant.source)
    text = PROMPT + " " + training_text()[:400]
    ids = list(tokenizer(text)["input_ids"])
    with variant.load(**variant.known(logits=True, kv_cache="f32")) as s:
        assert s.tokenize(text) == ids
        got = np.asarray(s.logits(ids))
    ref = _reference(variant, ids)
    assert got.shape == ref.shape == (len(ids), ref.shape[-1])
    error = float(np.abs(got - ref).max())
    if variant.quant.bits_per_weight >= 32:
        assert error <= 1e-3 * np.abs(ref).max()
        assert (got.argmax(-1) == ref.argmax(-1)).all()
    else:
        assert error <= 1e-2 * np.abs(ref).max()
        top2 = np.sort(ref, -1)[:, -2:]
        decisive = (top2[:, 1] - top2[:, 0]) > 2 * error
        assert decisive.mean() >= 0.8
        assert (got.argmax(-1) == ref.argmax(-1))[decisive].all()


def test_logits_follow_the_greedy_path(variant: Variant) -> None:
    """Greedy generation picks, token after token, the argmax of ``logits`` over the text
    so far: the runtime's sampler and its logits are the same model."""
    if not variant.target.evaluates:
        pytest.skip(f"{variant.target.display_name} gives no per-position logits (evaluates)")
    with variant.load(**variant.known(logits=True, kv_cache="f32")) as s:
        prompt = s.tokenize(PROMPT)
        path = list(prompt)
        for _ in range(8):
            path.append(int(np.asarray(s.logits(path))[-1].argmax()))
        g = s.generate(PROMPT, max_tokens=8, **GREEDY)
        assert g.text == s.detokenize(path[len(prompt) :])


# --- concurrency ------------------------------------------------------------------------------


def test_concurrent_calls_are_serialized_each_with_its_own_answer(session: Any) -> None:
    expected = {p: session.generate(p, max_tokens=12, **GREEDY).text for p in PROMPTS}
    start = threading.Barrier(2 * len(PROMPTS))
    results: dict[tuple[str, str], str] = {}
    errors: list[BaseException] = []

    def work(prompt: str, how: str) -> None:
        try:
            start.wait(10)
            if how == "generate":
                text = session.generate(prompt, max_tokens=12, **GREEDY).text
            else:
                text = "".join(c.text for c in session.stream(prompt, max_tokens=12, **GREEDY))
            results[(prompt, how)] = text
        except BaseException as exc:
            errors.append(exc)

    threads = [
        threading.Thread(target=work, args=(p, how), daemon=True)
        for p in PROMPTS
        for how in ("generate", "stream")
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WAIT_S)
    assert not errors, errors
    assert results == {(p, how): expected[p] for p in PROMPTS for how in ("generate", "stream")}


def test_tokenize_while_another_thread_generates(session: Any) -> None:
    ids = session.tokenize(PROMPT)
    stream = session.stream(PROMPT, max_tokens=8, **GREEDY)
    next(stream)
    assert _in_thread(lambda: session.tokenize(PROMPT), timeout=30) == ids
    list(stream)


# --- errors -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "settings",
    [
        {"temperature": -1.0},
        {"temperature": float("nan")},
        {"max_tokens": 0},
        {"top_p": 0.0},
        {"top_k": -1},
        {"seed": -1},
        {"stop": ["ok", 3]},
        {"banana": 1},
    ],
    ids=lambda s: ",".join(f"{k}={v}" for k, v in s.items()),
)
def test_bad_sampling_is_a_setting_error(session: Any, settings: dict[str, Any]) -> None:
    for call in (session.generate, session.stream):
        with pytest.raises(SettingError):
            call(PROMPT, **settings)


def test_bad_token_ids_are_setting_errors(session: Any) -> None:
    vocab = session.info.vocab_size
    bad: list[list[Any]] = [[-1], [1, -5], [], ["a"], [1.5]]
    if vocab is not None:
        bad.append([vocab])
    for ids in bad:
        with pytest.raises(SettingError):
            list(session.stream_from_tokens(ids, max_tokens=2))
        with pytest.raises(SettingError):
            session.detokenize(ids or [-1])
    # the session still works after every refusal
    assert session.generate(PROMPT, max_tokens=2, **GREEDY).completion_tokens == 2


def test_bad_logits_input_is_a_setting_error(variant: Variant) -> None:
    if not variant.target.evaluates:
        pytest.skip(f"{variant.target.display_name} gives no per-position logits (evaluates)")
    with variant.load(**variant.known(logits=True)) as s:
        for ids in ([-1], [], [s.info.vocab_size or 10**9]):
            with pytest.raises(SettingError):
                s.logits(ids)
        with pytest.raises(SettingError, match="context"):
            s.logits([1] * (s.info.context_length + 1))


def test_unknown_load_setting_lists_the_valid_ones(variant: Variant) -> None:
    with pytest.raises(SettingError) as info:
        variant.load(banana=1)
    said = f"{info.value.message} {info.value.hint}"
    assert "banana" in said
    assert variant.target.load_settings, "the target declares what load accepts"
    missing = [name for name in variant.target.load_settings if name not in said]
    assert not missing, f"the error does not list {missing}: {said}"


def test_a_file_that_is_no_model_is_an_edgekit_error(variant: Variant, tmp_path: Any) -> None:
    fmt = variant.target.format
    folder = tmp_path / fmt.name
    folder.mkdir()
    junk = folder / (fmt.entry or "model.bin")
    junk.write_bytes(b"this is not a model at all\n" * 10)
    with pytest.raises(EdgekitError):
        variant.target.load(folder / fmt.entry if fmt.entry else folder)
    with pytest.raises(EdgekitError):
        variant.target.load(tmp_path / "missing")
