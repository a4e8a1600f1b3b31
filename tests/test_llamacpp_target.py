"""The llama.cpp target on the embedded default model: generation controls, streaming,
chat, cancellation, thread safety, closing, and refusals."""

from __future__ import annotations

import threading
from pathlib import Path

import psutil
import pytest
from edgekit.targets.text import StopMatcher, Utf8Stream, render_chat_template

from edgekit.errors import GenerationError, ModelFormatError
from tests.conftest import require

PROMPT = "The capital of France is"


@pytest.fixture(scope="module")
def session(default_gguf: Path):  # type: ignore[no-untyped-def]
    require("llama_cpp", "the GGUF runtime is llama-cpp-python")
    from edgekit.targets.llamacpp import LlamaCppTarget

    with LlamaCppTarget.load(default_gguf, context=1024) as s:
        yield s


def test_defaults(session) -> None:  # type: ignore[no-untyped-def]
    assert session.info.threads == psutil.cpu_count(logical=False)
    assert session.info.context_length == 1024
    assert session.info.kv_cache == "f16"


def test_greedy_is_deterministic_and_coherent(session) -> None:  # type: ignore[no-untyped-def]
    a = session.generate(PROMPT, max_tokens=16, temperature=0)
    b = session.generate(PROMPT, max_tokens=16, temperature=0)
    assert a == b
    assert "Paris" in a.text
    assert a.prompt_tokens == len(session.tokenize(PROMPT))


def test_seeded_sampling_repeats(session) -> None:  # type: ignore[no-untyped-def]
    runs = [
        session.generate("Once upon a time", max_tokens=24, temperature=1.0, seed=s).text
        for s in (7, 7, 8)
    ]
    assert runs[0] == runs[1]
    assert runs[0] != runs[2]


def test_max_tokens_and_length(session) -> None:  # type: ignore[no-untyped-def]
    g = session.generate("Count: one, two, three,", max_tokens=5, temperature=0)
    assert g.completion_tokens == 5 and g.finish_reason == "length"


def test_stop_strings(session) -> None:  # type: ignore[no-untyped-def]
    free = session.generate(PROMPT, max_tokens=24, temperature=0)
    assert "\n" in free.text
    stopped = session.generate(PROMPT, max_tokens=24, temperature=0, stop=["\n"])
    assert stopped.finish_reason == "stop"
    assert stopped.text == free.text.split("\n")[0]


def test_stream_matches_generate(session) -> None:  # type: ignore[no-untyped-def]
    chunks = list(session.stream(PROMPT, max_tokens=20, temperature=0))
    g = session.generate(PROMPT, max_tokens=20, temperature=0)
    assert "".join(c.text for c in chunks) == g.text
    assert sum(c.tokens for c in chunks) == g.completion_tokens
    assert chunks[-1].finish_reason == g.finish_reason
    assert all(c.finish_reason is None for c in chunks[:-1])


def test_chat_uses_the_models_template(session) -> None:  # type: ignore[no-untyped-def]
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    rendered = session.render_chat(messages)
    assert rendered.startswith("<|im_start|>") and rendered.endswith("<|im_start|>assistant\n")
    reply = session.chat(messages, max_tokens=24, temperature=0)
    assert reply.completion_tokens > 0 and "<|im_start|>" not in reply.text
    # The same reply as llama-cpp-python's own chat completion with the same settings.
    import llama_cpp

    direct = llama_cpp.Llama(session.info.model_path, n_ctx=1024, verbose=False)
    expected = direct.create_chat_completion(messages, max_tokens=24, temperature=0)
    direct.close()
    assert reply.text == expected["choices"][0]["message"]["content"]
    streamed = "".join(c.text for c in session.chat_stream(messages, max_tokens=24, temperature=0))
    assert streamed == reply.text


def test_cancel_from_another_thread(session) -> None:  # type: ignore[no-untyped-def]
    chunks = []
    for chunk in session.stream("Once upon a time", max_tokens=200, temperature=0):
        chunks.append(chunk)
        if len(chunks) == 3:
            threading.Thread(target=session.cancel).start()
    assert chunks[-1].finish_reason == "cancelled"
    assert len(chunks) < 50
    # The next call is not affected by the earlier cancel.
    assert session.generate(PROMPT, max_tokens=4, temperature=0).finish_reason == "length"


def test_concurrent_calls_are_serialized(session) -> None:  # type: ignore[no-untyped-def]
    expected = session.generate(PROMPT, max_tokens=12, temperature=0).text
    results: list[str] = []
    errors: list[BaseException] = []

    def work() -> None:
        try:
            results.append(session.generate(PROMPT, max_tokens=12, temperature=0).text)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors
    assert results == [expected] * 4


def test_prompt_longer_than_context(default_gguf: Path) -> None:
    from edgekit.targets.llamacpp import LlamaCppTarget

    with (
        LlamaCppTarget.load(default_gguf, context=64) as s,
        pytest.raises(GenerationError, match="context"),
    ):
        s.generate("word " * 300, max_tokens=4)


def test_logits_need_to_be_asked_for(session) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(GenerationError, match="logits=True"):
        session.logits([1, 2, 3])


def test_close_is_final_and_idempotent(default_gguf: Path) -> None:
    from edgekit.targets.llamacpp import LlamaCppTarget

    s = LlamaCppTarget.load(default_gguf, context=256)
    s.close()
    s.close()
    with pytest.raises(GenerationError, match="closed"):
        s.generate(PROMPT, max_tokens=2)


def test_refusals(tmp_path: Path, default_gguf: Path) -> None:
    import llama_cpp
    from edgekit.targets.llamacpp import LlamaCppTarget

    bad = tmp_path / "x.gguf"
    bad.write_bytes(b"not a gguf at all")
    with pytest.raises(ModelFormatError):
        LlamaCppTarget.load(bad)
    with pytest.raises(GenerationError, match="KV-cache"):
        LlamaCppTarget.load(default_gguf, kv_cache="q3")
    if not llama_cpp.llama_supports_gpu_offload():
        with pytest.raises(GenerationError, match="GPU backend"):
            LlamaCppTarget.load(default_gguf, gpu_layers=-1)


def test_quantized_kv_cache_runs(default_gguf: Path) -> None:
    from edgekit.targets.llamacpp import LlamaCppTarget

    with LlamaCppTarget.load(default_gguf, context=256, kv_cache="q8_0") as s:
        assert "Paris" in s.generate(PROMPT, max_tokens=8, temperature=0).text


# --- text helpers ---------------------------------------------------------------------------


def test_stop_matcher_holds_back_a_partial_stop() -> None:
    m = StopMatcher(["<END>"])
    assert m.feed("hello <E") == ("hello ", False)
    assert m.feed("N") == ("", False)
    assert m.feed("D> tail") == ("", True)
    m = StopMatcher(["<END>"])
    assert m.feed("a <E") == ("a ", False)
    assert m.feed("X") == ("<EX", False)


def test_utf8_split_across_tokens() -> None:
    s = Utf8Stream()
    data = "é日".encode()
    assert s.feed(data[:1]) == ""
    assert s.feed(data[1:3]) == "é"
    assert s.feed(data[3:]) == "日"


def test_chat_templates_run_sandboxed() -> None:
    evil = "{{ ''.__class__.__mro__[1].__subclasses__() }}"
    with pytest.raises(GenerationError):
        render_chat_template(evil, [], bos_token="", eos_token="")
    with pytest.raises(GenerationError, match="refused"):
        render_chat_template(
            "{{ raise_exception('no system role') }}", [], bos_token="", eos_token=""
        )
