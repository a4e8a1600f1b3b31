"""edgekit serve, live on loopback, driven by the official openai client and by httpx."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import require
from tests.serve_harness import KEY, LiveServer, wait_until

__all__ = ["KEY", "LiveServer"]  # tests/test_samples.py serves through these

LONG = "Once upon a time"


@pytest.fixture(scope="module")
def session(default_gguf: Path) -> Iterator[Any]:
    require("llama_cpp", "the server runs the llama.cpp target")
    require("uvicorn", "the server runs on uvicorn")
    require("openai", "the tests use the official openai client")
    from edgekit.targets.llamacpp import LlamaCppTarget

    with LlamaCppTarget.load(default_gguf, context=1024) as s:
        yield s


@pytest.fixture(scope="module")
def server(session: Any) -> Iterator[LiveServer]:
    with LiveServer(session, max_tokens_limit=512, max_request_bytes=4096) as live:
        yield live


@pytest.fixture
def client(server: LiveServer) -> Any:
    import openai

    return openai.OpenAI(base_url=server.url, api_key=KEY, max_retries=0)


def test_models(client: Any) -> None:
    assert [m.id for m in client.models.list()] == ["smollm2"]


def test_chat_completion_streams_like_it_answers(client: Any, session: Any) -> None:
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    full = client.chat.completions.create(
        model="smollm2", messages=messages, max_tokens=24, temperature=0
    )
    text = full.choices[0].message.content
    assert full.choices[0].message.role == "assistant" and text
    assert full.usage.completion_tokens == 24 and full.choices[0].finish_reason == "length"
    assert text == session.chat(messages, max_tokens=24, temperature=0).text

    stream = client.chat.completions.create(
        model="smollm2", messages=messages, max_tokens=24, temperature=0, stream=True
    )
    deltas, reasons = [], []
    for chunk in stream:
        deltas.append(chunk.choices[0].delta.content or "")
        reasons.append(chunk.choices[0].finish_reason)
    assert "".join(deltas) == text
    assert reasons[-1] == "length" and set(reasons[:-1]) == {None}


def test_completions(client: Any) -> None:
    r = client.completions.create(
        model="smollm2", prompt="The capital of France is", max_tokens=8, temperature=0, stop=["\n"]
    )
    assert "Paris" in r.choices[0].text and "\n" not in r.choices[0].text
    assert r.choices[0].finish_reason == "stop"
    streamed = "".join(
        c.choices[0].text
        for c in client.completions.create(
            model="smollm2",
            prompt="The capital of France is",
            max_tokens=8,
            temperature=0,
            stop=["\n"],
            stream=True,
        )
    )
    assert streamed == r.choices[0].text


def test_api_key_is_required(server: LiveServer) -> None:
    import openai

    bad = openai.OpenAI(base_url=server.url, api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()


def test_limits(client: Any, server: LiveServer) -> None:
    import httpx
    import openai

    with pytest.raises(openai.BadRequestError, match="over this server's limit"):
        client.completions.create(model="smollm2", prompt="x", max_tokens=10_000)
    big = {"model": "smollm2", "prompt": "word " * 2000, "max_tokens": 4}
    r = httpx.post(
        f"{server.url}/completions", json=big, headers={"Authorization": f"Bearer {KEY}"}
    )
    assert r.status_code == 413 and "error" in r.json()


def _read_events(lines: Iterator[str], n: int) -> list[dict[str, Any]]:
    """The next ``n`` events. ``lines`` is the response's ``iter_lines()``, kept by the
    caller: dropping it closes the connection."""
    events = []
    for line in lines:
        if line.startswith("data: ") and line != "data: [DONE]":
            events.append(json.loads(line[6:]))
            if len(events) >= n:
                break
    return events


def test_client_disconnect_cancels_the_generation(session: Any) -> None:
    import httpx

    with LiveServer(session) as live:
        body = {
            "model": "smollm2",
            "prompt": LONG,
            "max_tokens": 400,
            "temperature": 0,
            "stream": True,
        }
        headers = {"Authorization": f"Bearer {KEY}"}
        with httpx.stream(
            "POST", f"{live.url}/completions", json=body, headers=headers, timeout=60
        ) as r:
            assert len(_read_events(r.iter_lines(), 3)) == 3
        # The client is gone: the generation stops at its next token.
        stats = live.app.state.stats
        deadline = time.monotonic() + 30
        while stats.cancelled == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert stats.cancelled == 1
        # and the session is free again at once
        r = httpx.post(
            f"{live.url}/completions",
            headers=headers,
            timeout=60,
            json={"model": "smollm2", "prompt": "Hi", "max_tokens": 2},
        )
        assert r.status_code == 200


def test_full_queue_answers_503(session: Any) -> None:
    import httpx

    with LiveServer(session, queue_size=1) as live:
        headers = {"Authorization": f"Bearer {KEY}"}
        body = {
            "model": "smollm2",
            "prompt": LONG,
            "max_tokens": 300,
            "temperature": 0,
            "stream": True,
        }
        with httpx.stream(
            "POST", f"{live.url}/completions", json=body, headers=headers, timeout=60
        ) as r:
            lines = r.iter_lines()
            _read_events(lines, 1)  # the only slot is taken
            busy = httpx.post(
                f"{live.url}/completions",
                headers=headers,
                timeout=60,
                json={"model": "smollm2", "prompt": "Hi", "max_tokens": 2},
            )
            assert busy.status_code == 503
            assert busy.json()["error"]["type"] == "server_busy"
        assert live.app.state.stats.rejected_busy == 1
        # the stream's client left: its slot comes back
        assert wait_until(lambda: live.stats.open == 0, 30)


def test_a_queued_client_that_disconnects_does_not_cancel_the_running_one(session: Any) -> None:
    """The second client waits behind the first and goes away: its own generation leaves
    the queue and never starts; the first one runs to its end."""
    import httpx

    from tests.serve_harness import http_bytes, send_and_close

    with LiveServer(session) as live:
        headers = {"Authorization": f"Bearer {KEY}"}
        body = {"model": "smollm2", "prompt": LONG, "max_tokens": 60, "temperature": 0}
        with httpx.stream(
            "POST",
            f"{live.url}/completions",
            json={**body, "stream": True, "stream_options": {"include_usage": True}},
            headers=headers,
            timeout=60,
        ) as r:
            lines = r.iter_lines()
            first = _read_events(lines, 1)
            queued = json.dumps({**body, "max_tokens": 5}).encode()
            send_and_close(live.port, http_bytes("POST", "/v1/completions", queued, port=live.port))
            assert wait_until(lambda: live.stats.left_queue == 1, 30)
            rest = [json.loads(x[6:]) for x in lines if x.startswith("data: {")]
        events = first + rest
        assert events[-1]["usage"]["completion_tokens"] == 60
        assert [e["choices"][0]["finish_reason"] for e in events if e["choices"]][-1] == "length"
        assert live.stats.cancelled == 0 and live.stats.requests == 2


class _FailingLlama:
    """llama-cpp-python's Llama whose generation raises its RuntimeError after 3 tokens."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def generate(self, *args: Any, **kwargs: Any) -> Iterator[int]:
        for i, token in enumerate(self._inner.generate(*args, **kwargs)):
            if i == 3:
                raise RuntimeError("llama_decode returned -3")
            yield token


def test_a_failed_generation_is_an_error_event_or_a_500(session: Any) -> None:
    """llama.cpp fails mid-way: a stream ends with an OpenAI-style error event (the
    runtime's error, mapped, as the message), never [DONE]; a plain request is a 500
    JSON error with the message. Then the server serves again."""
    import httpx

    headers = {"Authorization": f"Bearer {KEY}"}
    body = {"model": "smollm2", "prompt": LONG, "max_tokens": 20, "temperature": 0}
    real = session._llm
    with LiveServer(session) as live:
        session._llm = _FailingLlama(real)
        try:
            with httpx.stream(
                "POST",
                f"{live.url}/completions",
                json={**body, "stream": True},
                headers=headers,
                timeout=60,
            ) as r:
                lines = [x for x in r.iter_lines() if x.startswith("data: ")]
            plain = httpx.post(f"{live.url}/completions", json=body, headers=headers, timeout=60)
        finally:
            session._llm = real
        assert "data: [DONE]" not in lines
        error = json.loads(lines[-1][6:])["error"]
        assert error["type"] == "server_error" and error["code"] == 500
        assert "RuntimeError: llama_decode returned -3" in error["message"]
        assert plain.status_code == 500
        assert "llama_decode returned -3" in plain.json()["error"]["message"]
        ok = httpx.post(f"{live.url}/completions", json=body, headers=headers, timeout=60)
        assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 20

