"""The continuous-batching loop (targets/batch_loop.py) over a fake BatchRuntime: what the
loop itself promises, whatever the runtime (the llama.cpp and OpenVINO runtimes have their
own tests against their reference sessions).

The fake runs up to ``slots`` sequences; each step it gives every running sequence the
next byte of a fixed text, starting at an offset its prompt decides, and records what it
was asked: so each stream's expected output is known, and the tests see when requests
were added and removed.
"""

from __future__ import annotations

import gc
import threading
import time
from collections.abc import Sequence
from typing import Any

import pytest
from edgekit.targets.batch_text import TokenText
from edgekit.targets.batching import SeqRequest, SeqStep
from edgekit.targets.session import Session
from edgekit.targets.values import SessionInfo

from edgekit.errors import GenerationError

TEXT = "the quick brown fox jumps over the lazy dog. "
EOS = 300


class FakeBatch:
    def __init__(self, slots: int = 2, context: int = 64, *, delay: float = 0.0) -> None:
        self._slots, self._context, self.delay = slots, context, delay
        self.running: dict[int, list[int]] = {}  # rid -> its tokens so far
        self.starts: dict[int, int] = {}
        self.requests: dict[int, SeqRequest] = {}
        self.added: list[int] = []
        self.removed: list[int] = []
        self.most = 0  # the most sequences ever running together
        self.fail_add: set[int] = set()  # prompt lengths whose add fails
        self.fail_step = False
        self.eos_after: int | None = None
        self.closed = 0
        self.generated: dict[int, int] = {}  # tokens made for each request
        self.forgot: list[str] = []  # the thread of each forget_prefixes call
        self.refuse_forget = False

    @property
    def slots(self) -> int:
        return self._slots

    @property
    def context(self) -> int:
        return self._context

    def add(self, request: SeqRequest) -> None:
        if len(request.prompt) in self.fail_add:
            raise RuntimeError("out of KV blocks")
        assert len(self.running) < self._slots, "the loop added past the slots"
        self.running[request.rid] = list(request.prompt)
        self.starts[request.rid] = sum(request.prompt) % len(TEXT)
        self.requests[request.rid] = request
        self.added.append(request.rid)
        self.most = max(self.most, len(self.running))

    def step(self) -> list[SeqStep]:
        if self.delay:
            time.sleep(self.delay)
        if self.fail_step:
            self.fail_step = False
            raise RuntimeError("device lost")
        out = []
        for rid, tokens in self.running.items():
            n = len(tokens) - len(self.requests[rid].prompt)
            if self.eos_after is not None and n == self.eos_after:
                out.append(SeqStep(rid=rid, tokens=(), end="stop"))
                continue
            token = ord(TEXT[(self.starts[rid] + n) % len(TEXT)])
            tokens.append(token)
            self.generated[rid] = n + 1
            end = "length" if len(tokens) >= self._context else None
            out.append(SeqStep(rid=rid, tokens=(token,), end=end, cached=3 if n == 0 else 0))
        return out

    def remove(self, rid: int) -> None:
        self.running.pop(rid, None)
        self.removed.append(rid)

    def forget_prefixes(self) -> None:
        self.forgot.append(threading.current_thread().name)
        if self.refuse_forget:
            raise RuntimeError("no call drops the prefix cache")

    def close(self) -> None:
        self.closed += 1


def expected(prompt: str, n: int) -> str:
    start = sum([256, *prompt.encode()]) % len(TEXT)
    return "".join(TEXT[(start + i) % len(TEXT)] for i in range(n))


class ByteSession(Session):
    """A session whose tokens are bytes (256 is BOS), batched over ``runtime``."""

    def __init__(self, runtime: FakeBatch) -> None:
        super().__init__()
        self.info = SessionInfo(
            target="fake", model_path="fake", context_length=runtime.context, threads=1,
            kv_cache="f16", vocab_size=512,
        )  # fmt: skip
        self._use_batching(runtime)

    def tokenize(self, text: str, *, add_special: bool = True) -> list[int]:
        data = list(text.encode("utf-8"))
        return [256, *data] if add_special else data

    def detokenize(self, tokens: Sequence[int]) -> str:
        return bytes(t for t in tokens if 0 <= t < 256).decode("utf-8", "replace")

    def stream_tokens(self, prompt_tokens: Sequence[int], sampling: Any) -> Any:
        raise AssertionError("a batched session never streams one at a time")

    def render_chat(self, messages: Sequence[dict[str, str]]) -> str:
        return "".join(f"{m['role']}: {m['content']}\n" for m in messages)

    def logits(self, tokens: Sequence[int]) -> Any:
        raise GenerationError("no logits here", hint="-")

    def _close(self) -> None:
        pass


@pytest.fixture
def batch() -> FakeBatch:
    return FakeBatch(slots=2)


def test_each_stream_of_a_batch_is_what_it_is_alone(batch: FakeBatch) -> None:
    batch.delay = 0.002  # a step takes time, so the four readers overlap
    prompts = ["alpha", "beta", "gamma", "delta"]
    with ByteSession(batch) as session:
        handles = [session.stream(p, max_tokens=12, temperature=0) for p in prompts]
        results: dict[str, str] = {}

        def read(p: str, h: Any) -> None:
            results[p] = h.result().text

        threads = [
            threading.Thread(target=read, args=(p, h))
            for p, h in zip(prompts, handles, strict=True)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(10)
    assert results == {p: expected(p, 12) for p in prompts}
    assert batch.most == 2  # never more than the slots; four requests, two at a time
    assert sorted(batch.added) == [1, 2, 3, 4]  # each once (the last may close with it)
    assert set(batch.removed) <= set(batch.added)
    assert batch.closed == 1


def test_a_request_joins_the_running_batch_and_leaves_when_done() -> None:
    runtime = FakeBatch(slots=4, delay=0.005)
    with ByteSession(runtime) as session:
        long = session.stream("first", max_tokens=40, temperature=0)
        chunks = [next(long) for _ in range(5)]
        short = session.generate("second", max_tokens=4, temperature=0)  # joins mid-run
        assert short.text == expected("second", 4) and short.finish_reason == "length"
        assert _soon(lambda: 2 in runtime.removed)  # it left at the next step
        assert 1 not in runtime.removed and runtime.most == 2  # the first ran on beside it
        rest = long.result()
    assert "".join(c.text for c in chunks) == expected("first", 5)
    assert rest.text == expected("first", 40) and rest.completion_tokens == 40


def _soon(check: Any, timeout: float = 2.0) -> bool:
    """``check()`` becomes true within ``timeout`` (the loop retires between steps)."""
    end = time.monotonic() + timeout
    while not check():
        if time.monotonic() > end:
            return False
        time.sleep(0.002)
    return True


def test_cancelling_one_stream_leaves_the_others_unchanged(batch: FakeBatch) -> None:
    with ByteSession(batch) as session:
        a = session.stream("one", max_tokens=20, temperature=0)
        b = session.stream("two", max_tokens=20, temperature=0)
        next(a), next(b)
        a.cancel()
        rest = list(a)
        assert rest[-1].finish_reason == "cancelled"
        assert b.result().text == expected("two", 20)


def test_stop_strings_and_max_tokens_are_applied_per_request(batch: FakeBatch) -> None:
    with ByteSession(batch) as session:
        whole = expected("x", 30)
        stop = whole[10:13]
        cut = session.generate("x", max_tokens=30, stop=[stop], temperature=0)
        assert cut.text == whole[: whole.index(stop)] and cut.finish_reason == "stop"
        assert session.generate("x", max_tokens=7).text == whole[:7]


def test_end_of_sequence_from_the_runtime_stops_the_stream() -> None:
    runtime = FakeBatch(slots=1)
    runtime.eos_after = 5
    with ByteSession(runtime) as session:
        out = session.generate("eos", max_tokens=50)
    assert out.finish_reason == "stop" and out.completion_tokens == 5


def test_a_prompt_beyond_the_context_is_refused_before_it_queues(batch: FakeBatch) -> None:
    with ByteSession(batch) as session, pytest.raises(GenerationError, match="holds 64"):
        session.generate("y" * 80)
    assert batch.added == []


def test_a_failed_add_fails_that_request_only(batch: FakeBatch) -> None:
    batch.fail_add = {len("bad") + 1}
    with ByteSession(batch) as session:
        good = session.stream("good!", max_tokens=8, temperature=0)
        with pytest.raises(GenerationError, match="out of KV blocks"):
            session.generate("bad")
        assert good.result().text == expected("good!", 8)


def test_a_failed_step_fails_its_requests_and_the_loop_serves_the_next(batch: FakeBatch) -> None:
    with ByteSession(batch) as session:
        doomed = session.stream("first", max_tokens=8)
        batch.fail_step = True
        with pytest.raises(GenerationError, match="device lost"):
            doomed.result()
        assert session.generate("after", max_tokens=6).text == expected("after", 6)


def test_a_dropped_stream_frees_its_slot() -> None:
    runtime = FakeBatch(slots=1, delay=0.002)
    with ByteSession(runtime) as session:
        dropped = session.stream("drop me", max_tokens=500)
        next(dropped)
        del dropped
        gc.collect()
        started = time.monotonic()
        assert session.generate("next", max_tokens=3).text == expected("next", 3)
        assert time.monotonic() - started < 2  # not after 500 tokens of the dropped one
        assert _soon(lambda: 1 in runtime.removed)


def test_closing_the_session_ends_every_stream_and_frees_the_runtime(batch: FakeBatch) -> None:
    session = ByteSession(batch)
    running = [session.stream(p, max_tokens=1000) for p in ("a", "b", "c")]
    for h in running[:2]:
        next(h)
    session.close()
    for h in running[:2]:  # begun: they end with a last "cancelled" chunk, or nothing
        assert [c.finish_reason for c in h] in ([], ["cancelled"])
    with pytest.raises(GenerationError, match="closed"):  # made before close, begun after
        next(running[2])
    session.close()  # idempotent
    assert batch.closed >= 1
    with pytest.raises(GenerationError, match="closed"):
        session.generate("late")


def test_a_closed_handle_returns_at_once_and_the_others_go_on(batch: FakeBatch) -> None:
    batch.delay = 0.002
    with ByteSession(batch) as session:
        a = session.stream("aa", max_tokens=200)
        b = session.stream("bb", max_tokens=10, temperature=0)
        next(a)
        started = time.monotonic()
        a.close()
        assert time.monotonic() - started < 0.5 and list(a) == []
        assert b.result().text == expected("bb", 10)


def test_stats_and_cached_tokens(batch: FakeBatch) -> None:
    with ByteSession(batch) as session:
        assert session.parallel == 2
        h = session.stream("cache", max_tokens=3)
        next(h)
        assert h.cached_tokens == 3  # type: ignore[attr-defined]
        stats = session.batch_stats()
        assert stats is not None and stats.slots == 2
        h.close()


def test_token_text_keeps_characters_and_spaces_whole() -> None:
    def spm(ids: Sequence[int]) -> str:  # a SentencePiece-like decoder: drops a lead space
        return "".join(VOCAB[i] for i in ids).replace("_", " ").lstrip(" ")

    VOCAB.clear()
    VOCAB.extend(["_Hello", "_wor", "ld", "!", "_x"])
    text = TokenText(spm, (), prompt=[4])
    assert [text.feed([i])[0] for i in (0, 1, 2, 3)] == [" Hello", " wor", "ld", "!"]
    utf8 = TokenText(lambda ids: bytes(ids).decode("utf-8", "replace"), ())
    euro = list("€".encode())
    assert [utf8.feed([b])[0] for b in euro] == ["", "", "€"]
    stopped = TokenText(lambda ids: bytes(ids).decode(), ("END",))
    assert stopped.feed(list(b"abcE")) == ("abc", False)
    assert stopped.feed(list(b"ND more")) == ("", True)


VOCAB: list[str] = []


# --- second review ------------------------------------------------------------------------


def test_a_cancelled_queued_request_ends_at_once_while_the_slots_are_busy() -> None:
    runtime = FakeBatch(slots=1, delay=0.002)
    with ByteSession(runtime) as session:
        busy = session.stream("busy", max_tokens=100_000)
        next(busy)
        queued = session.stream("queued", max_tokens=5)
        waiter: list[Any] = []
        reader = threading.Thread(target=lambda: waiter.append(list(queued)))
        reader.start()
        assert _soon(lambda: (session.batch_stats() or FakeStats()).waiting == 1)
        queued.cancel()
        reader.join(2)
        assert not reader.is_alive() and waiter[0][-1].finish_reason == "cancelled"
        assert _soon(lambda: (session.batch_stats() or FakeStats()).waiting == 0)
        busy.close()


class FakeStats:
    waiting = -1


def test_a_slow_reader_does_not_keep_its_slot_decoding_past_max_tokens() -> None:
    runtime = FakeBatch(slots=1, delay=0.001)
    with ByteSession(runtime) as session:
        slow = session.stream("slow", max_tokens=3)
        next(slow)  # then the reader sleeps: the loop frees the slot at the third token
        assert _soon(lambda: 1 in runtime.removed)
        assert runtime.generated[1] == 3  # not one token more in the runtime
        assert session.generate("next", max_tokens=2).completion_tokens == 2
        assert slow.result().completion_tokens == 3


def test_a_bug_in_the_loop_fails_every_reader_instead_of_hanging_them(batch: FakeBatch) -> None:
    def broken() -> list[Any]:
        return [object()]  # not a SeqStep: the loop's own code fails on it

    with ByteSession(batch) as session:
        batch.step = broken  # type: ignore[method-assign]
        with pytest.raises(GenerationError, match="batch loop"):
            session.generate("anything", max_tokens=4)


def test_a_dropped_batched_session_is_freed_with_its_loop() -> None:
    import weakref

    runtime = FakeBatch(slots=2)
    session = ByteSession(runtime)
    assert session.generate("x", max_tokens=2).completion_tokens == 2
    gone = weakref.ref(session)
    del session
    gc.collect()
    assert gone() is None
    assert _soon(lambda: runtime.closed == 1)  # the finalizer stopped the loop


def test_clear_cache_drops_the_batch_prefixes_on_the_loop_thread(batch: FakeBatch) -> None:
    batch.delay = 0.002
    with ByteSession(batch) as session:
        running = session.stream("first", max_tokens=40, temperature=0)
        next(running)
        session.clear_cache()  # between two steps, while a stream runs
        assert batch.forgot == ["edgekit-batch"]
        assert running.result().text == expected("first", 40)  # the running one goes on
        batch.refuse_forget = True
        with pytest.raises(GenerationError, match="dropping the cached prefixes"):
            session.clear_cache()
        assert session.generate("next", max_tokens=3, temperature=0).text == expected("next", 3)
    with pytest.raises(GenerationError, match="closed"):
        session.clear_cache()


def test_clear_cache_never_hangs_when_the_runtime_stops_the_loop(batch: FakeBatch) -> None:
    class Fatal(BaseException):
        pass

    def fatal() -> None:
        raise Fatal("the runtime broke the loop")

    batch.forget_prefixes = fatal  # type: ignore[method-assign]
    with ByteSession(batch) as session:
        done: list[BaseException] = []

        def clear() -> None:
            try:
                session.clear_cache()
            except GenerationError as exc:
                done.append(exc)

        t = threading.Thread(target=clear)
        t.start()
        t.join(5)
        assert not t.is_alive(), "clear_cache hung"
        assert done and "dropping the cached prefixes" in done[0].message
        with pytest.raises(GenerationError):  # the loop is gone: said, not hung
            session.generate("after", max_tokens=2, temperature=0)
