"""The llama.cpp target on the embedded default model: generation controls, streaming,
chat, cancellation, thread safety, closing, and refusals; on a tiny Gemma 3, the windowed
KV cache of sliding-window attention. Hostile settings and calls: test_hostile_runtime.py."""

from __future__ import annotations

import json
import logging
import re
import threading
from pathlib import Path

import psutil
import pytest
from edgekit.targets.streams import StopMatcher, Utf8Stream
from edgekit.targets.templates import render_chat_template

from edgekit.errors import GenerationError, ModelFormatError, SettingError
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
    with pytest.raises(SettingError, match="kv_cache 'q3' is not one of f32, f16"):
        LlamaCppTarget.load(default_gguf, kv_cache="q3")
    if not llama_cpp.llama_supports_gpu_offload():
        with pytest.raises(GenerationError, match="GPU backend"):
            LlamaCppTarget.load(default_gguf, gpu_layers=-1)


def test_quantized_kv_cache_runs(default_gguf: Path) -> None:
    from edgekit.targets.llamacpp import LlamaCppTarget

    with LlamaCppTarget.load(default_gguf, context=256, kv_cache="q8_0") as s:
        assert "Paris" in s.generate(PROMPT, max_tokens=8, temperature=0).text


# --- sliding-window attention: the windowed KV cache -------------------------------------------

WINDOW = 16


@pytest.fixture(scope="module")
def tiny_gemma3(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Gemma 3 GGUF whose layers attend over a 16-token window, trained context 8192."""
    require("llama_cpp", "the GGUF runtime is llama-cpp-python")
    require("torch", "the tiny model is built with transformers")
    from edgekit.converters.convert import convert_model

    from tests.tiny_models import build_tiny_model

    src = build_tiny_model("gemma3", tmp_path_factory.mktemp("gemma3"))
    config = json.loads((src / "config.json").read_text())
    config.update(sliding_window=WINDOW, max_position_embeddings=8192)
    (src / "config.json").write_text(json.dumps(config))
    out = tmp_path_factory.mktemp("gemma3-gguf") / "gemma3.gguf"
    convert_model(src, "gguf", out, quant="F16")
    return out


def _kv_cells(caplog: pytest.LogCaptureFixture) -> dict[str, int]:
    """The KV caches llama.cpp reports creating (its log, routed to edgekit.llamacpp)."""
    found = {}
    for record in caplog.records:
        m = re.search(r"creating\s+(non-SWA|SWA) KV cache, size = (\d+) cells", record.getMessage())
        if m:
            found[m.group(1)] = int(m.group(2))
    return found


def test_sliding_window_layers_get_a_windowed_cache(
    tiny_gemma3: Path, caplog: pytest.LogCaptureFixture
) -> None:
    import llama_cpp
    from edgekit.targets.llamacpp import LlamaCppTarget

    caplog.set_level(logging.DEBUG, logger="edgekit.llamacpp")
    with LlamaCppTarget.load(tiny_gemma3, context=8192) as s:
        windowed = _kv_cells(caplog)
        assert s.info.settings["sliding_window"] == WINDOW
        assert s.info.settings["swa_full"] is False
    caplog.clear()
    # What llama-cpp-python's default (swa_full=True) allocates for the same model.
    full = llama_cpp.Llama(str(tiny_gemma3), n_ctx=8192, swa_full=True, verbose=False)
    full_cells = _kv_cells(caplog)
    full.close()
    assert full_cells["SWA"] == 8192
    # The window plus one batch, padded: a tenth of the context, not all of it.
    assert windowed["SWA"] <= WINDOW + 512 + 256
    assert windowed["SWA"] * 10 <= full_cells["SWA"]


def test_windowed_cache_never_resumes_from_positions_it_dropped(tiny_gemma3: Path) -> None:
    """llama-cpp-python resumes a prompt from the longest prefix it has cached. Once a long
    prompt has pushed old positions out of the window, a prompt that shares only an early
    prefix must be evaluated afresh: resuming would run the sliding-window layers without
    the positions before it (logits off by as much as the largest logit, seen here).
    Every row from the resume point must equal a fresh evaluation."""
    import numpy as np
    from edgekit.targets.llamacpp import LlamaCppTarget
    from edgekit.targets.values import Sampling

    from tests.tiny_models import training_text

    greedy = Sampling(max_tokens=1, temperature=0)
    with LlamaCppTarget.load(tiny_gemma3, context=8192, logits=True) as s:
        text = s.tokenize(training_text())
        long_prompt = text[:1000]
        list(s.stream_tokens(long_prompt, greedy))
        for shared in (100, 900):  # before the cached window; inside it
            prompt = long_prompt[:shared] + text[1000:1040]
            list(s.stream_tokens(prompt, greedy))
            resumed = np.array(s._llm.scores[shared : len(prompt)], dtype=np.float32)
            fresh = s.logits(prompt)[shared:]
            assert np.abs(resumed - fresh).max() <= 1e-4 * np.abs(fresh).max(), shared
            list(s.stream_tokens(long_prompt, greedy))


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
