"""Hostile HTTP requests against ``edgekit serve``: one row per attack.

Every row runs against a live uvicorn server on 127.0.0.1 (raw sockets where the attack is
below HTTP, httpx above it) and then checks that the server still answers a normal request.
Most rows use the fake Session of tests/serve_harness.py (fast, and it records what reached
the runtime); the rows about llama.cpp state (seeds, context) use the real default model.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import require
from tests.serve_harness import (
    CHATML,
    KEY,
    FakeSession,
    LiveServer,
    http_bytes,
    raw_exchange,
    send_and_close,
    status_of,
    wait_until,
)

require("uvicorn", "the server runs on uvicorn")
require("httpx", "the tests drive the server with httpx")

import httpx  # noqa: E402

AUTH = {"Authorization": f"Bearer {KEY}"}
JSON_HEADERS = {**AUTH, "Content-Type": "application/json"}
HI = [{"role": "user", "content": "hi"}]


def chat(**fields: Any) -> bytes:
    return json.dumps({"model": "fake", "messages": HI, "max_tokens": 4, **fields}).encode()


def completion(**fields: Any) -> bytes:
    return json.dumps({"model": "fake", "prompt": "Once", "max_tokens": 4, **fields}).encode()


# One client for the module (a client per request costs more CPU than the request). The
# timeout only bounds a hang: the machine running the tests may be heavily loaded.
# No keep-alive: a pooled connection that the server closes as idle would fail the next
# request on the client side, which is no fault of the server.
HTTP = httpx.Client(timeout=60, limits=httpx.Limits(max_keepalive_connections=0))


def post(live: LiveServer, path: str, body: bytes, **headers: str) -> httpx.Response:
    return HTTP.post(f"{live.url}{path}", content=body, headers={**JSON_HEADERS, **headers})


def assert_still_serving(live: LiveServer) -> None:
    """The server answers a normal chat request and a normal completion after an attack."""
    r = post(live, "/chat/completions", chat())
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["content"]
    r = post(live, "/completions", completion())
    assert r.status_code == 200, r.text


def settled(live: LiveServer, received: int) -> bool:
    """Whether the server has seen ``received`` generation requests and finished them all
    (their slots given back), whatever became of them."""
    return live.stats.received >= received and live.stats.open == 0


def assert_api_error(r: httpx.Response, status: int, fragment: str) -> None:
    assert r.status_code == status, (r.status_code, r.text)
    error = r.json()["error"]
    assert isinstance(error["message"], str) and isinstance(error["type"], str)
    assert fragment.lower() in error["message"].lower(), error["message"]


@pytest.fixture(scope="module")
def fake() -> FakeSession:
    return FakeSession()


@pytest.fixture(scope="module")
def live(fake: FakeSession) -> Iterator[LiveServer]:
    with LiveServer(fake, model_name="fake", queue_size=2) as server:
        yield server


# --- request bodies: every field type-checked, 400 with the field named, never 500 ------


@dataclass(frozen=True)
class Bad:
    id: str
    path: str
    body: bytes
    fragment: str
    status: int = 400


C, P = "/chat/completions", "/completions"
BAD_BODIES = [
    # stop
    Bad("stop-number", C, chat(stop=5), "stop"),
    Bad("stop-object", C, chat(stop={"a": 1}), "stop"),
    Bad("stop-list-of-numbers", C, chat(stop=[1, 2]), "stop"),
    Bad("stop-too-many", C, chat(stop=["a", "b", "c", "d", "e"]), "stop"),
    Bad("stop-nested-list", C, chat(stop=[["a"]]), "stop"),
    # message content
    Bad("content-null", C, chat(messages=[{"role": "user", "content": None}]), "content"),
    Bad("content-number", C, chat(messages=[{"role": "user", "content": 42}]), "content"),
    Bad("content-bool", C, chat(messages=[{"role": "user", "content": True}]), "content"),
    Bad("content-missing", C, chat(messages=[{"role": "user"}]), "content"),
    Bad(
        "content-image-part",
        C,
        chat(messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]),
        "text",
    ),
    Bad(
        "content-part-without-text",
        C,
        chat(messages=[{"role": "user", "content": [{"type": "text"}]}]),
        "text",
    ),
    Bad(
        "content-part-number-text",
        C,
        chat(messages=[{"role": "user", "content": [{"type": "text", "text": 3}]}]),
        "text",
    ),
    Bad("content-part-string", C, chat(messages=[{"role": "user", "content": ["hi"]}]), "content"),
    Bad("content-empty-parts", C, chat(messages=[{"role": "user", "content": []}]), "content"),
    Bad("content-object", C, chat(messages=[{"role": "user", "content": {"x": 1}}]), "content"),
    # messages and roles
    Bad("messages-missing", C, json.dumps({"model": "fake"}).encode(), "messages"),
    Bad("messages-empty", C, chat(messages=[]), "messages"),
    Bad("messages-string", C, chat(messages="hi"), "messages"),
    Bad("message-not-object", C, chat(messages=["hi"]), "messages"),
    Bad("role-unknown", C, chat(messages=[{"role": "wizard", "content": "hi"}]), "role"),
    Bad("role-missing", C, chat(messages=[{"content": "hi"}]), "role"),
    Bad("role-number", C, chat(messages=[{"role": 1, "content": "hi"}]), "role"),
    Bad("role-tool", C, chat(messages=[{"role": "tool", "content": "x"}]), "tool"),
    Bad("message-unknown-key", C, chat(messages=[{"role": "user", "content": "hi", "x": 1}]), "x"),
    Bad("message-name-number", C, chat(messages=[{**HI[0], "name": 5}]), "name"),
    # text that cannot be text
    Bad(
        "content-lone-surrogate",
        C,
        chat(messages=[{"role": "user", "content": "a\ud800b"}]),
        "surrogate",
    ),
    Bad("prompt-lone-surrogate", P, completion(prompt="\udfff"), "surrogate"),
    Bad("stop-lone-surrogate", C, chat(stop="\ud83d"), "surrogate"),
    Bad("invalid-utf8", C, b'{"messages": [{"role": "user", "content": "\xff\xfe"}]}', "utf-8"),
    Bad("utf16-body", C, chat().decode().encode("utf-16"), "utf-8"),
    # documents that are not requests
    Bad("deep-array", C, b"[" * 5000 + b"]" * 5000, "nested"),
    Bad("deep-in-field", C, chat(metadata=json.loads("[" * 40 + "]" * 40)), "nested"),
    Bad("body-array", C, b"[]", "object"),
    Bad("body-string", C, b'"hi"', "object"),
    Bad("body-null", C, b"null", "object"),
    Bad("body-empty", C, b"", "json"),
    Bad("body-truncated", C, chat()[:-3], "json"),
    Bad(
        "repeated-key",
        C,
        b'{"messages": [], "messages": [{"role":"user","content":"hi"}]}',
        "twice",
    ),
    Bad("nan", C, chat().replace(b'"max_tokens": 4', b'"temperature": NaN'), "nan"),
    Bad(
        "infinity-literal", C, chat().replace(b'"max_tokens": 4', b'"top_p": Infinity'), "infinity"
    ),
    Bad(
        "overflowing-float",
        C,
        chat().replace(b'"max_tokens": 4', b'"temperature": 1e400'),
        "temperature",
    ),
    Bad(
        "int-with-5000-digits",
        C,
        chat().replace(b'"max_tokens": 4', b'"max_tokens": ' + b"9" * 5000),
        "json",
    ),
    Bad("unknown-field", C, chat(frobnicate=1), "frobnicate"),
    Bad("model-number", C, chat(model=5), "model"),
    # token budget
    Bad("max-tokens-zero", C, chat(max_tokens=0), "max_tokens"),
    Bad("max-tokens-true", C, chat(max_tokens=True), "max_tokens"),
    Bad("max-tokens-negative", C, chat(max_tokens=-5), "max_tokens"),
    Bad("max-tokens-huge", C, chat(max_tokens=10**30), "max_tokens"),
    Bad("max-tokens-float", C, chat(max_tokens=1.5), "max_tokens"),
    Bad("max-tokens-string", C, chat(max_tokens="10"), "max_tokens"),
    Bad("max-completion-tokens-zero", C, chat(max_completion_tokens=0), "max_completion_tokens"),
    Bad("completion-max-tokens-false", P, completion(max_tokens=False), "max_tokens"),
    # flags and sampling
    Bad("stream-string", C, chat(stream="false"), "stream"),
    Bad("stream-number", P, completion(stream=1), "stream"),
    Bad("temperature-negative", C, chat(temperature=-1), "temperature"),
    Bad("temperature-too-hot", C, chat(temperature=3), "temperature"),
    Bad("temperature-bool", C, chat(temperature=True), "temperature"),
    Bad("temperature-string", P, completion(temperature="hot"), "temperature"),
    Bad("top-p-above-one", C, chat(top_p=1.5), "top_p"),
    Bad("top-p-bool", C, chat(top_p=False), "top_p"),
    Bad("top-k-negative", C, chat(top_k=-3), "top_k"),
    Bad("min-p-two", C, chat(min_p=2), "min_p"),
    Bad("repeat-penalty-zero", C, chat(repeat_penalty=0), "repeat_penalty"),
    Bad("n-two", C, chat(n=2), "n"),
    Bad("n-true", C, chat(n=True), "n"),
    Bad("seed-float", C, chat(seed=1.5), "seed"),
    Bad("seed-string", C, chat(seed="abc"), "seed"),
    Bad("seed-huge", C, chat(seed=2**70), "seed"),
    Bad("seed-negative", P, completion(seed=-1), "seed"),
    Bad("seed-bool", P, completion(seed=True), "seed"),
    Bad("frequency-penalty", C, chat(frequency_penalty=1.0), "frequency_penalty"),
    Bad("presence-penalty-string", C, chat(presence_penalty="x"), "presence_penalty"),
    Bad("logprobs", C, chat(logprobs=True), "logprobs"),
    Bad("logit-bias", C, chat(logit_bias={"1": 100}), "logit_bias"),
    Bad("tools", C, chat(tools=[{"type": "function", "function": {"name": "f"}}]), "tools"),
    Bad(
        "response-format-schema",
        C,
        chat(response_format={"type": "json_schema"}),
        "response_format",
    ),
    Bad(
        "stream-options-without-stream",
        C,
        chat(stream_options={"include_usage": True}),
        "stream_options",
    ),
    Bad(
        "stream-options-bad",
        C,
        chat(stream=True, stream_options={"include_usage": "yes"}),
        "include_usage",
    ),
    Bad("user-number", C, chat(user=1), "user"),
    # the completion prompt
    Bad("prompt-empty", P, completion(prompt=""), "prompt"),
    Bad("prompt-null", P, completion(prompt=None), "prompt"),
    Bad("prompt-missing", P, json.dumps({"model": "fake"}).encode(), "prompt"),
    Bad("prompt-token-ids", P, completion(prompt=[1, 2, 3]), "prompt"),
    Bad("prompt-negative-token-ids", P, completion(prompt=[[-1]]), "prompt"),
    Bad("prompt-two-strings", P, completion(prompt=["a", "b"]), "prompt"),
    Bad("prompt-over-context", P, completion(prompt="x" * 300), "context"),
    Bad("chat-over-context", C, chat(messages=[{"role": "user", "content": "y" * 300}]), "context"),
    Bad("echo", P, completion(echo=True), "echo"),
    Bad("suffix", P, completion(suffix="end"), "suffix"),
    Bad("best-of", P, completion(best_of=2), "best_of"),
    Bad("completion-messages-field", P, completion(messages=HI), "messages"),
]


@pytest.mark.parametrize("case", BAD_BODIES, ids=[c.id for c in BAD_BODIES])
def test_bad_body_is_answered_4xx_json(live: LiveServer, fake: FakeSession, case: Bad) -> None:
    runs = len(fake.state.runs)
    r = post(live, case.path, case.body)
    assert_api_error(r, case.status, case.fragment)
    assert len(fake.state.runs) == runs, "a refused request reached the runtime"
    assert_still_serving(live)


# --- requests the schema allows: accepted, and the runtime sees what was meant -----------


@dataclass(frozen=True)
class Good:
    id: str
    path: str
    body: bytes
    check: Callable[[FakeSession, dict[str, Any]], bool]


def _last_render(fake: FakeSession) -> str:
    return fake.state.rendered[-1]


GOOD_BODIES = [
    Good(
        "text-parts",
        C,
        chat(
            messages=[
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "alpha"},
                        {"type": "text", "text": "beta"},
                    ],
                }
            ]
        ),
        lambda f, _: "alpha\nbeta" in _last_render(f) and "type" not in _last_render(f),
    ),
    Good(
        "developer-role",
        C,
        chat(messages=[{"role": "developer", "content": "be brief"}, *HI]),
        lambda f, _: "<|im_start|>system\nbe brief" in _last_render(f),
    ),
    Good(
        "echoed-assistant-message",
        C,
        chat(
            messages=[
                *HI,
                {"role": "assistant", "content": "yo", "refusal": None, "tool_calls": None},
                *HI,
            ]
        ),
        lambda f, _: "assistant\nyo" in _last_render(f),
    ),
    Good(
        "prompt-list-of-one",
        P,
        completion(prompt=["Once"]),
        lambda f, _: f.state.runs[-1].prompt[1:] == list(b"Once"),
    ),
    Good("stop-string", C, chat(stop="x"), lambda f, _: f.state.runs[-1].sampling.stop == ("x",)),
    Good("stop-null", C, chat(stop=None), lambda f, _: f.state.runs[-1].sampling.stop == ()),
    Good(
        "nulls-mean-defaults",
        C,
        chat(temperature=None, top_p=None, n=None, max_tokens=None),
        lambda f, _: f.state.runs[-1].sampling.max_tokens == 256,
    ),
    Good(
        "max-completion-tokens",
        C,
        chat(max_completion_tokens=3),
        lambda f, b: b["usage"]["completion_tokens"] == 3,
    ),
    Good(
        "seed-kept-per-request",
        C,
        chat(seed=7, temperature=1),
        lambda f, _: f.state.runs[-1].sampling.seed == 7,
    ),
    Good(
        "greedy-integer-temperature",
        P,
        completion(temperature=0, top_p=1),
        lambda f, _: f.state.runs[-1].sampling.temperature == 0.0,
    ),
    Good(
        "extensions-top-k-min-p",
        C,
        chat(top_k=5, min_p=0.1, repeat_penalty=1.1),
        lambda f, _: f.state.runs[-1].sampling.top_k == 5,
    ),
    Good(
        "defaults-penalties-zero",
        C,
        chat(frequency_penalty=0, presence_penalty=0.0, logprobs=False, user="u"),
        lambda f, _: True,
    ),
]


@pytest.mark.parametrize("case", GOOD_BODIES, ids=[c.id for c in GOOD_BODIES])
def test_valid_request_is_served_as_meant(live: LiveServer, fake: FakeSession, case: Good) -> None:
    r = post(live, case.path, case.body)
    assert r.status_code == 200, r.text
    assert case.check(fake, r.json())
    assert_still_serving(live)


def test_a_seed_does_not_outlive_its_request(live: LiveServer, fake: FakeSession) -> None:
    assert post(live, C, chat(seed=1234, temperature=1)).status_code == 200
    assert post(live, C, chat(temperature=1)).status_code == 200
    assert post(live, C, chat(temperature=1)).status_code == 200
    # the seed travels with its own request only (the llama.cpp rows below check that the
    # runtime does not keep it either)
    assert [run.sampling.seed for run in fake.state.runs[-3:]] == [1234, None, None]


# --- HTTP: content type, Host, Origin, CORS, auth, sizes, methods ------------------------


@dataclass(frozen=True)
class Proto:
    id: str
    request: Callable[[int], bytes]
    status: int
    overrides: tuple[tuple[str, Any], ...] = ()
    header_check: Callable[[bytes], bool] = lambda head: True


def _req(
    path: str = "/v1/chat/completions", body: bytes | None = None, **headers: str | None
) -> Callable[[int], bytes]:
    return lambda port: http_bytes(
        "POST",
        path,
        chat() if body is None else body,
        {k.replace("_", "-"): v for k, v in headers.items()},
        port=port,
    )


def _no_cors(head: bytes) -> bool:
    return b"access-control-allow-origin" not in head.lower()


PROTOCOL = [
    Proto("content-type-text-plain", _req(Content_Type="text/plain"), 415),
    Proto("content-type-missing", _req(Content_Type=None), 415),
    Proto("content-type-form", _req(Content_Type="application/x-www-form-urlencoded"), 415),
    Proto("content-type-multipart", _req(Content_Type="multipart/form-data; boundary=x"), 415),
    Proto("content-type-latin1", _req(Content_Type="application/json; charset=latin-1"), 415),
    Proto("content-type-json-utf8-ok", _req(Content_Type="application/json; charset=utf-8"), 200),
    Proto("host-foreign", _req(Host="evil.example"), 403),
    Proto(
        "host-foreign-with-port",
        lambda p: http_bytes(
            "POST", "/v1/chat/completions", chat(), {"Host": f"evil.example:{p}"}, port=p
        ),
        403,
    ),
    Proto("host-rebinding-subdomain", _req(Host="127.0.0.1.evil.example"), 403),
    Proto(
        "host-localhost-ok",
        lambda p: http_bytes(
            "POST", "/v1/chat/completions", chat(), {"Host": f"localhost:{p}"}, port=p
        ),
        200,
    ),
    Proto(
        "host-foreign-on-models",
        lambda p: http_bytes("GET", "/v1/models", b"", {"Host": "evil.example"}, port=p),
        403,
    ),
    Proto(
        "host-foreign-on-health",
        lambda p: http_bytes("GET", "/health", b"", {"Host": "evil.example"}, port=p),
        403,
    ),
    Proto("host-allowed-by-option", _req(Host="box.lan"), 200, (("allow_hosts", ("box.lan",)),)),
    Proto("origin-foreign", _req(Origin="http://evil.example"), 403, header_check=_no_cors),
    Proto("origin-null", _req(Origin="null"), 403, header_check=_no_cors),
    Proto(
        "origin-foreign-text-plain-csrf",
        _req(Origin="http://evil.example", Content_Type="text/plain"),
        403,
        header_check=_no_cors,
    ),
    Proto(
        "origin-same-ok",
        lambda p: http_bytes(
            "POST", "/v1/chat/completions", chat(), {"Origin": f"http://127.0.0.1:{p}"}, port=p
        ),
        200,
    ),
    Proto(
        "origin-allowed-gets-cors",
        _req(Origin="http://app.example"),
        200,
        (("allow_origins", ("http://app.example",)),),
        lambda head: b"access-control-allow-origin: http://app.example" in head.lower(),
    ),
    Proto(
        "preflight-foreign-refused",
        lambda p: http_bytes(
            "OPTIONS",
            "/v1/chat/completions",
            b"",
            {"Origin": "http://evil.example", "Access-Control-Request-Method": "POST"},
            port=p,
        ),
        403,
        header_check=_no_cors,
    ),
    Proto(
        "preflight-allowed",
        lambda p: http_bytes(
            "OPTIONS",
            "/v1/chat/completions",
            b"",
            {
                "Origin": "http://app.example",
                "Access-Control-Request-Method": "POST",
                "Access-Control-Request-Headers": "authorization, content-type",
            },
            port=p,
        ),
        204,
        (("allow_origins", ("http://app.example",)),),
        lambda head: (
            b"access-control-allow-origin: http://app.example" in head.lower()
            and b"authorization" in head.lower()
        ),
    ),
    Proto("auth-missing", _req(Authorization=None), 401),
    Proto("auth-wrong", _req(Authorization="Bearer nope"), 401),
    Proto("auth-empty-bearer", _req(Authorization="Bearer "), 401),
    Proto("auth-key-prefix", _req(Authorization=f"Bearer {KEY}x"), 401),
    Proto("auth-basic", _req(Authorization="Basic dGVzdC1rZXk6"), 401),
    Proto(
        "auth-on-models",
        lambda p: http_bytes("GET", "/v1/models", b"", {"Authorization": "Bearer nope"}, port=p),
        401,
    ),
    Proto(
        "declared-length-over-limit",
        lambda p: http_bytes(
            "POST",
            "/v1/chat/completions",
            b"",
            {"Content-Length": "999999999"},
            port=p,
            content_length=False,
        ),
        413,
    ),
    Proto(
        "body-over-limit",
        _req(body=chat(messages=[{"role": "user", "content": "z" * 70_000}])),
        413,
    ),
    Proto(
        "chunked-body-over-limit",
        lambda p: http_bytes(
            "POST",
            "/v1/chat/completions",
            b"".join(b"4000\r\n" + b"a" * 0x4000 + b"\r\n" for _ in range(5)) + b"0\r\n\r\n",
            {"Transfer-Encoding": "chunked"},
            port=p,
            content_length=False,
        ),
        413,
    ),
    Proto(
        "get-on-post-route", lambda p: http_bytes("GET", "/v1/chat/completions", b"", port=p), 405
    ),
    Proto("unknown-path", _req(path="/v1/embeddings"), 404),
    Proto("path-traversal", lambda p: http_bytes("GET", "/v1/../../etc/passwd", b"", port=p), 404),
    Proto(
        "health-ok",
        lambda p: http_bytes("GET", "/health", b"", {"Authorization": None}, port=p),
        200,
    ),
]


@pytest.mark.parametrize("case", PROTOCOL, ids=[c.id for c in PROTOCOL])
def test_http_attack(case: Proto) -> None:
    fake = FakeSession()
    with LiveServer(
        fake, model_name="fake", max_request_bytes=65536, **dict(case.overrides)
    ) as live:
        response = raw_exchange(live.port, case.request(live.port))
        head, _, body = response.partition(b"\r\n\r\n")
        assert status_of(response) == case.status, response[:600]
        assert case.header_check(head), head
        if case.status >= 400:
            assert "error" in json.loads(body), body[:300]
        if case.status in (401, 403, 405, 413, 415):
            assert fake.state.runs == [], "a refused request reached the runtime"
        assert_still_serving(live)


# --- a client that goes away, at every stage: the slot comes back, the runtime stops -----


def _stream_body(max_tokens: int = 200) -> bytes:
    return chat(stream=True, max_tokens=max_tokens)


STAGES: list[tuple[str, Callable[[int], None]]] = [
    (
        "headers-then-close",
        lambda p: send_and_close(
            p,
            http_bytes("POST", "/v1/chat/completions", _stream_body(), port=p).split(b"\r\n\r\n")[0]
            + b"\r\n\r\n",
        ),
    ),
    (
        "half-body-then-close",
        lambda p: send_and_close(
            p, http_bytes("POST", "/v1/chat/completions", _stream_body(), port=p)[:-20]
        ),
    ),
    (
        "stream-sent-then-close",
        lambda p: send_and_close(
            p, http_bytes("POST", "/v1/chat/completions", _stream_body(), port=p)
        ),
    ),
    (
        "completion-stream-sent-then-close",
        lambda p: send_and_close(
            p,
            http_bytes("POST", "/v1/completions", completion(stream=True, max_tokens=200), port=p),
        ),
    ),
    (
        "plain-sent-then-close",
        lambda p: send_and_close(
            p, http_bytes("POST", "/v1/chat/completions", chat(max_tokens=200), port=p)
        ),
    ),
    (
        "first-bytes-read-then-close",
        lambda p: send_and_close(
            p, http_bytes("POST", "/v1/chat/completions", _stream_body(), port=p), read_first=200
        ),
    ),
    (
        "keepalive-two-then-close",
        lambda p: send_and_close(
            p,
            http_bytes(
                "POST", "/v1/chat/completions", _stream_body(), {"Connection": "keep-alive"}, port=p
            )
            * 2,
        ),
    ),
]


@pytest.mark.parametrize("stage", STAGES, ids=[s[0] for s in STAGES])
def test_client_gone_at_each_stage(stage: tuple[str, Callable[[int], None]]) -> None:
    fake = FakeSession(token_delay=0.02)  # 200 tokens take 4 s or more
    with LiveServer(fake, model_name="fake", queue_size=1) as live:
        stage[1](live.port)
        # the abandoned generation (if it started) stops well before its 200 tokens ...
        assert wait_until(lambda: settled(live, 1) and fake.state.running == 0, 30)
        assert all(r.tokens < 150 for r in fake.state.runs), [r.tokens for r in fake.state.runs]
        assert all(r.reason in ("cancelled", "closed") for r in fake.state.runs)
        # ... and with a queue of one, a held slot would answer 503 here
        assert_still_serving(live)
        assert live.stats.rejected_busy == 0


def test_twenty_abandoned_streams_do_not_exhaust_the_queue() -> None:
    fake = FakeSession(token_delay=0.01)
    with LiveServer(fake, model_name="fake", queue_size=8) as live:
        for i in range(20):  # one after the other: each is gone before the next comes
            send_and_close(
                live.port,
                http_bytes("POST", "/v1/chat/completions", _stream_body(), port=live.port),
            )
            assert wait_until(lambda: settled(live, i + 1), 30)  # noqa: B023 - used at once
        assert live.stats.rejected_busy == 0 and fake.state.running == 0
        assert_still_serving(live)


def test_a_burst_of_abandoned_streams_does_not_exhaust_the_queue() -> None:
    fake = FakeSession(token_delay=0.01)
    with LiveServer(fake, model_name="fake", queue_size=8) as live:
        for _ in range(20):  # all at once: beyond 8 in the building they get 503, unread
            send_and_close(
                live.port,
                http_bytes("POST", "/v1/chat/completions", _stream_body(), port=live.port),
            )
        assert wait_until(lambda: settled(live, 20) and fake.state.running == 0, 30)
        assert all(r.tokens < 150 for r in fake.state.runs)
        assert_still_serving(live)


def test_an_abandoned_plain_request_does_not_delay_the_next() -> None:
    fake = FakeSession(token_delay=0.02)  # 240 tokens take 5 s or more
    with LiveServer(fake, model_name="fake") as live:
        with socket.create_connection(("127.0.0.1", live.port), timeout=30) as s:
            s.sendall(
                http_bytes("POST", "/v1/completions", completion(max_tokens=240), port=live.port)
            )
            assert wait_until(lambda: fake.state.running == 1, 30)
        # the client is gone while its answer is being generated
        r = post(live, P, completion(max_tokens=2))
        assert r.status_code == 200
        # the abandoned one stopped early, and the next one ran to its end after it
        first, second = fake.state.runs
        assert first.reason in ("cancelled", "closed") and first.tokens < 120, first
        assert second.reason == "length" and second.tokens == 2


def test_a_client_that_stops_reading_does_not_hold_the_queue() -> None:
    fake = FakeSession(word="x" * 65536)  # 64 KiB a token: the socket buffers fill at once
    with (
        LiveServer(fake, model_name="fake", queue_size=1, send_timeout=1.0) as live,
        socket.socket() as s,
    ):
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        s.connect(("127.0.0.1", live.port))
        s.sendall(
            http_bytes(
                "POST",
                "/v1/completions",
                completion(stream=True, max_tokens=200),
                port=live.port,
            )
        )
        # it never reads: after send_timeout it counts as gone, and its slot comes back
        assert wait_until(lambda: settled(live, 1), 30)
        assert live.stats.cancelled == 1
        assert_still_serving(live)  # with a queue of one, while it is still connected


def test_a_queued_client_that_leaves_does_not_cancel_the_running_one() -> None:
    fake = FakeSession(token_delay=0.01)
    with LiveServer(fake, model_name="fake", queue_size=4) as live:
        result: dict[str, Any] = {}

        def first() -> None:
            result["r"] = post(live, P, completion(max_tokens=60))

        runner = threading.Thread(target=first)
        runner.start()
        assert wait_until(lambda: fake.state.running == 1, 30)
        # a second client queues behind it, then leaves
        send_and_close(
            live.port,
            http_bytes("POST", "/v1/completions", completion(max_tokens=60), port=live.port),
        )
        runner.join(20)
        r = result["r"]
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 60
        assert r.json()["choices"][0]["finish_reason"] == "length"
        # the one that left never ran
        assert len(fake.state.runs) == 1
        assert_still_serving(live)


def test_a_client_that_leaves_while_its_generation_is_queued_leaves_the_queue() -> None:
    """The second request's generation is in the session's queue when its client goes:
    it leaves the queue and never runs, and the running one is not touched."""
    fake = FakeSession(token_delay=0.01)
    with LiveServer(fake, model_name="fake", queue_size=4) as live:
        result: dict[str, Any] = {}

        def first() -> None:
            result["r"] = post(live, P, completion(max_tokens=150))

        runner = threading.Thread(target=first)
        runner.start()
        assert wait_until(lambda: fake.state.running == 1, 30)
        with socket.create_connection(("127.0.0.1", live.port), timeout=30) as s:
            s.sendall(
                http_bytes("POST", "/v1/completions", completion(max_tokens=60), port=live.port)
            )
            assert wait_until(lambda: fake.waiting == 1, 30)  # queued behind the first
        assert wait_until(lambda: fake.waiting == 0 and live.stats.left_queue == 1, 30)
        runner.join(30)
        r = result["r"]
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 150
        assert len(fake.state.runs) == 1 and live.stats.cancelled == 0
        assert_still_serving(live)


def test_a_full_queue_answers_503_and_recovers() -> None:
    fake = FakeSession(token_delay=0.01)
    with LiveServer(fake, model_name="fake", queue_size=1) as live:
        with httpx.stream(
            "POST",
            f"{live.url}/completions",
            content=completion(stream=True, max_tokens=300),
            headers=JSON_HEADERS,
            timeout=60,
        ) as r:
            lines = r.iter_lines()  # kept: dropping it closes the connection
            next(lines)
            busy = post(live, P, completion())
            assert busy.status_code == 503 and busy.json()["error"]["type"] == "server_busy"
        assert wait_until(lambda: settled(live, 2), 30)
        assert_still_serving(live)


# --- chat templates from the model run off the event loop ----------------------------------

# 10^8 loop steps: seconds to minutes of one CPU if it ran to the end.
LOOP_TEMPLATE = "{% for i in range(10000) %}{% for j in range(10000) %}{% endfor %}{% endfor %}x"


def test_a_slow_template_does_not_block_other_requests() -> None:
    # the real time bound (targets/text.py), made longer here so that the other requests
    # certainly arrive while the template is still running
    fake = FakeSession(template=LOOP_TEMPLATE, template_seconds=4.0, template_steps=10**9)
    with LiveServer(fake, model_name="fake") as live:
        result: dict[str, Any] = {}

        def hostile() -> None:
            result["r"] = post(live, C, chat())

        runner = threading.Thread(target=hostile, daemon=True)
        runner.start()
        assert wait_until(lambda: fake.state.rendering == 1, 30)
        health = HTTP.get(f"http://127.0.0.1:{live.port}/health")
        models = HTTP.get(f"{live.url}/models", headers=AUTH)
        plain = post(live, P, completion())  # a completion needs no template
        # all three were answered while the template was still rendering
        assert fake.state.rendering == 1 and runner.is_alive()
        assert health.status_code == 200 and models.status_code == 200
        assert plain.status_code == 200
        runner.join(60)  # the targets bound how long a template may render
        assert not runner.is_alive(), "the template was not stopped by its time bound"
        assert_api_error(result["r"], 400, "template")
        fake.template = CHATML
        assert_still_serving(live)


TEMPLATE_FAILURES = [
    ("raise-exception", "{{ raise_exception('roles must alternate') }}", "alternate"),
    ("syntax-error", "{% for %}", "template"),
    ("include", "{% include 'x.html' %}", "template"),
    ("huge-range", "{% for i in range(10**9) %}{% endfor %}", "template"),
    ("undefined-call", "{{ nothing() }}", "template"),
    ("attribute-escape", "{{ ''.__class__.__mro__ }}", "template"),
]


@pytest.mark.parametrize("case", TEMPLATE_FAILURES, ids=[c[0] for c in TEMPLATE_FAILURES])
def test_a_failing_template_is_a_400(case: tuple[str, str, str]) -> None:
    fake = FakeSession(template=case[1])
    with LiveServer(fake, model_name="fake") as live:
        assert_api_error(post(live, C, chat()), 400, case[2])
        assert post(live, P, completion()).status_code == 200


# --- a generation that fails --------------------------------------------------------------


def test_a_stream_that_fails_ends_with_an_error_event_not_done() -> None:
    fake = FakeSession(fail_after=2)
    with LiveServer(fake, model_name="fake") as live:
        with httpx.stream(
            "POST",
            f"{live.url}/chat/completions",
            content=chat(stream=True, max_tokens=10),
            headers=JSON_HEADERS,
            timeout=60,
        ) as r:
            lines = [line for line in r.iter_lines() if line.startswith("data: ")]
        assert lines[-1] != "data: [DONE]" and "data: [DONE]" not in lines
        error = json.loads(lines[-1][6:])["error"]
        assert "mid-way" in error["message"] and error["type"] == "server_error"
        fake.fail_after = None
        assert_still_serving(live)


def test_a_plain_request_that_fails_is_a_500_json_error() -> None:
    fake = FakeSession(fail_after=1)
    with LiveServer(fake, model_name="fake") as live:
        r = post(live, P, completion())
        assert_api_error(r, 500, "mid-way")
        fake.fail_after = None
        assert_still_serving(live)


# --- connections that never finish a request: closed, not held (slowloris) ----------------


def _closed_within(s: socket.socket, seconds: float) -> bool:
    """Whether the server closes ``s`` within ``seconds`` (what it still sends is read)."""
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        s.settimeout(left)
        try:
            if s.recv(65536) == b"":
                return True
        except TimeoutError:
            return False
    return False


def test_a_connection_that_never_completes_its_headers_is_closed() -> None:
    """uvicorn alone keeps such a connection open forever: a few thousand of them and the
    server accepts nobody. Before the fix all three stayed open."""
    fake = FakeSession()
    with LiveServer(fake, model_name="fake", header_timeout=1.0) as live:
        silent, partial, trickle = (
            socket.create_connection(("127.0.0.1", live.port), timeout=10) for _ in range(3)
        )
        with silent, partial, trickle:
            partial.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n")
            start = time.monotonic()
            for byte in b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: aaaaaaaa":
                if time.monotonic() - start > 2.5:
                    break
                try:  # a byte every 0.1 s: uvicorn's own timer restarts at each one
                    trickle.sendall(bytes([byte]))
                except OSError:
                    break  # closed by the server, as it should be
                time.sleep(0.1)
            assert _closed_within(silent, 3) and _closed_within(partial, 3)
            assert _closed_within(trickle, 3)
        assert fake.state.runs == []
        assert_still_serving(live)


def test_the_header_deadline_spares_keep_alive_and_long_answers() -> None:
    """The deadline covers a request's headers only: a stream that takes longer than it is
    answered whole, and a kept-alive connection serves its next request; once idle after
    its answer, the connection is closed like a silent one."""
    fake = FakeSession(token_delay=0.05)  # 40 tokens: 2 s, twice the deadline
    with LiveServer(fake, model_name="fake", header_timeout=1.0) as live:
        with socket.create_connection(("127.0.0.1", live.port), timeout=20) as s:
            keep = {"Connection": "keep-alive"}
            s.sendall(
                http_bytes(
                    "POST",
                    "/v1/completions",
                    completion(stream=True, max_tokens=40),
                    keep,
                    port=live.port,
                )
            )
            got = b""
            while not got.endswith(b"\r\n0\r\n\r\n"):  # the last chunk of the answer
                part = s.recv(65536)
                assert part, got[-300:]
                got += part
            assert b"data: [DONE]" in got and fake.state.runs[-1].tokens == 40
            s.sendall(http_bytes("GET", "/health", b"", keep, port=live.port))
            assert b"200 OK" in s.recv(65536)
            assert _closed_within(s, 3)  # then silent: closed
        assert_still_serving(live)


def test_serving_on_a_taken_port_is_a_serve_error() -> None:
    """uvicorn binds with sys.exit(3) on failure: serve() raised SystemExit before the fix."""
    from edgekit.errors import ServeError
    from edgekit.serve import serve
    from edgekit.serve_config import ServeConfig

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        config = ServeConfig(model_name="fake", port=taken.getsockname()[1])
        with pytest.raises(ServeError, match="cannot listen") as caught:
            serve(FakeSession(), config)
    assert "--port" in caught.value.hint


@pytest.mark.parametrize("value", ["30", None, True, float("nan"), float("inf"), 0, -1])
@pytest.mark.parametrize("name", ["header_timeout", "body_timeout", "send_timeout"])
def test_a_bad_timeout_is_a_serve_error(name: str, value: Any) -> None:
    # before the fix a string or None was a TypeError, and NaN or True were accepted
    from edgekit.errors import ServeError
    from edgekit.serve_config import ServeConfig

    with pytest.raises(ServeError, match=name):
        ServeConfig(model_name="m", **{name: value})


# --- starting the server: no open server by accident ---------------------------------------


def test_an_empty_api_key_is_refused() -> None:
    from edgekit.errors import ServeError
    from edgekit.serve_config import ServeConfig

    with pytest.raises(ServeError, match="empty"):
        ServeConfig(model_name="m", api_key="")


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.168.1.10", "myhost.lan"])
def test_beyond_loopback_without_a_key_is_refused(host: str) -> None:
    from edgekit.errors import ServeError
    from edgekit.serve_config import ServeConfig

    with pytest.raises(ServeError, match="insecure-no-auth"):
        ServeConfig(model_name="m", host=host)
    assert ServeConfig(model_name="m", host=host, api_key="k").api_key == "k"
    assert ServeConfig(model_name="m", host=host, insecure_no_auth=True).api_key is None


@pytest.mark.parametrize("host", ["127.0.0.1", "::1", "localhost", "127.0.0.2"])
def test_loopback_without_a_key_is_allowed(host: str) -> None:
    from edgekit.serve_config import ServeConfig

    assert ServeConfig(model_name="m", host=host).host == host


class _Loaded(FakeSession):
    bundle = type("B", (), {"manifest": type("M", (), {"name": "tiny"})()})()
    variant = type("V", (), {"name": "gguf-q4"})()


CLI_CASES = [
    ("empty-key", ["--api-key", ""], "empty", 2),
    ("blank-key", ["--api-key", "   "], "empty", 2),
    ("open-beyond-loopback", ["--host", "0.0.0.0"], "--insecure-no-auth", 2),
    ("open-on-lan-ip", ["--host", "10.1.2.3"], "--insecure-no-auth", 2),
    ("key-with-newline", ["--api-key", "abc\r\nX-Evil: 1"], "printable ASCII", 2),
    ("origin-not-an-origin", ["--allow-origin", "javascript:alert(1)"], "not a web origin", 2),
    ("host-not-a-name", ["--allow-host", "evil host/x"], "not a host name", 2),
    ("queue-of-zero", ["--queue-size", "0"], "queue_size", 2),
]


@pytest.mark.parametrize("case", CLI_CASES, ids=[c[0] for c in CLI_CASES])
def test_serve_cli_refuses_before_loading(
    case: tuple[str, list[str], str, int], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from click.testing import CliRunner

    import edgekit
    import edgekit.serve
    from edgekit.cli import main

    loaded: list[Any] = []
    served: list[Any] = []
    monkeypatch.delenv("EDGEKIT_API_KEY", raising=False)
    monkeypatch.setattr(edgekit, "load", lambda *a, **k: loaded.append(a) or _Loaded())
    monkeypatch.setattr(edgekit.serve, "serve", lambda s, c: served.append(c))
    result = CliRunner().invoke(main, ["serve", str(tmp_path / "b"), *case[1]])
    assert result.exit_code == case[3], result.output
    assert case[2] in result.output and "Traceback" not in result.output
    assert loaded == [] and served == []


def test_serve_cli_insecure_no_auth_serves_and_warns(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from click.testing import CliRunner

    import edgekit
    import edgekit.serve
    from edgekit.cli import main

    served: list[Any] = []
    monkeypatch.delenv("EDGEKIT_API_KEY", raising=False)
    monkeypatch.setattr(edgekit, "load", lambda *a, **k: _Loaded())
    monkeypatch.setattr(edgekit.serve, "serve", lambda s, c: served.append(c))
    result = CliRunner().invoke(
        main,
        [
            "serve",
            str(tmp_path / "b"),
            "--host",
            "0.0.0.0",
            "--insecure-no-auth",
            "--allow-host",
            "box.lan",
            "--allow-origin",
            "http://app.example",
        ],
    )
    assert result.exit_code == 0, result.output
    assert "warning" in result.output.lower() and "without an api key" in result.output.lower()
    (config,) = served
    assert config.model_name == "tiny" and config.api_key is None and config.insecure_no_auth
    assert config.allow_hosts == ("box.lan",) and config.allow_origins == ("http://app.example",)


def test_serve_runs_the_app_until_interrupted() -> None:
    """``serve()`` itself (uvicorn.run with the app's lifespan), in a process of its own."""
    import os
    import signal
    import subprocess
    import sys

    from tests.serve_harness import free_port

    port = free_port()
    script = (
        "from tests.serve_harness import FakeSession; "
        "from edgekit.serve import serve; from edgekit.serve_config import ServeConfig; "
        f"serve(FakeSession(), ServeConfig(model_name='fake', port={port}))"
    )
    root = Path(__file__).resolve().parent.parent
    child = subprocess.Popen(
        [sys.executable, "-c", script],
        cwd=root,
        env={**os.environ, "PYTHONPATH": str(root)},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert wait_until(lambda: _answers(port), 60)
        r = HTTP.post(
            f"http://127.0.0.1:{port}/v1/completions",
            content=completion(),
            headers={"Content-Type": "application/json"},
        )
        assert r.status_code == 200 and "server" not in r.headers
    finally:
        child.send_signal(signal.SIGINT)
        out, _ = child.communicate(timeout=60)
    assert child.returncode == 0, out
    assert "Application startup complete" in out and "Traceback" not in out


def _answers(port: int) -> bool:
    try:
        return HTTP.get(f"http://127.0.0.1:{port}/health").status_code == 200
    except httpx.TransportError:
        return False


# --- the real llama.cpp session: state that must not outlive a request ----------------------


@pytest.fixture(scope="module")
def llama(default_gguf: Path) -> Iterator[Any]:
    require("llama_cpp", "these rows are about llama.cpp's own state")
    from edgekit.targets.llamacpp import LlamaCppTarget

    with LlamaCppTarget.load(default_gguf, context=512) as s:
        yield s


@pytest.fixture(scope="module")
def llama_live(llama: Any) -> Iterator[LiveServer]:
    with LiveServer(llama, max_request_bytes=1 << 16) as server:
        yield server


SAMPLED = {"prompt": "The colour of the sky is", "max_tokens": 6, "temperature": 0.9}

LLAMA_ATTACKS = [
    ("seed-float", completion(seed=1.5), "seed"),
    ("seed-string", completion(seed="abc"), "seed"),
    ("seed-2-to-64", completion(seed=2**64), "seed"),
    ("seed-negative", completion(seed=-7), "seed"),
    ("prompt-over-context", completion(prompt="hello " * 700), "context"),
    ("lone-surrogate", completion(prompt="a\udc80"), "surrogate"),
    ("stop-number", completion(stop=3), "stop"),
]


@pytest.mark.needs_gguf
@pytest.mark.parametrize("case", LLAMA_ATTACKS, ids=[c[0] for c in LLAMA_ATTACKS])
def test_llama_attack_leaves_later_requests_working(
    llama_live: LiveServer, case: tuple[str, bytes, str]
) -> None:
    assert_api_error(post(llama_live, P, case[1]), 400, case[2])
    # a later sampled request from another client (no seed of its own) still works
    for _ in range(2):
        r = post(llama_live, P, json.dumps(SAMPLED).encode())
        assert r.status_code == 200, r.text


@pytest.mark.needs_gguf
def test_llama_seed_is_per_request(llama_live: LiveServer) -> None:
    seeded = {**SAMPLED, "seed": 11, "temperature": 1.5, "max_tokens": 12}
    first = post(llama_live, P, json.dumps(seeded).encode()).json()["choices"][0]["text"]
    again = post(llama_live, P, json.dumps(seeded).encode()).json()["choices"][0]["text"]
    assert first == again  # a seed reproduces
    unseeded = {k: v for k, v in seeded.items() if k != "seed"}
    others = {
        post(llama_live, P, json.dumps(unseeded).encode()).json()["choices"][0]["text"]
        for _ in range(4)
    }
    assert others != {first}, "the seed of one request decided the next requests' samples"


@pytest.mark.needs_gguf
def test_llama_twenty_abandoned_streams(llama_live: LiveServer) -> None:
    port = llama_live.port
    before = llama_live.stats.received
    for i in range(20):
        send_and_close(
            port,
            http_bytes(
                "POST", "/v1/completions", completion(stream=True, max_tokens=200), port=port
            ),
        )
        assert wait_until(lambda: settled(llama_live, before + i + 1), 60)  # noqa: B023
    r = post(llama_live, P, completion(max_tokens=3))
    assert r.status_code == 200, r.text
    assert llama_live.stats.rejected_busy == 0


def test_raw_socket_helpers_are_bounded() -> None:
    # the raw helpers never hang a test run: a silent server times out
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        start = time.monotonic()
        assert raw_exchange(s.getsockname()[1], b"x", timeout=0.5) == b""
        assert time.monotonic() - start < 3


@pytest.mark.parametrize(
    ("args", "suggested", "want"),
    [
        ([], 5, 5),  # the plan's
        (["--queue-size", "3"], 5, 3),  # never more than the queue holds
        (["--parallel", "2"], 5, 2),  # asked for
        (["--parallel", "1"], 5, None),  # one at a time: the single-stream session
        ([], 1, None),  # the target does not batch, or one stream is all that fits
    ],
)
def test_serve_cli_parallel_defaults_to_the_plan(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, args: list[str], suggested: int, want: Any
) -> None:
    from click.testing import CliRunner

    import edgekit
    import edgekit.runtime
    import edgekit.serve
    from edgekit.cli import main

    loads: list[dict[str, Any]] = []
    monkeypatch.setattr(edgekit, "load", lambda *a, **k: loads.append(k) or _Loaded())
    monkeypatch.setattr(edgekit.runtime, "suggest_parallel", lambda *a, **k: suggested)
    monkeypatch.setattr(edgekit.serve, "serve", lambda s, c: None)
    result = CliRunner().invoke(main, ["serve", str(tmp_path / "b"), *args])
    assert result.exit_code == 0, result.output
    assert loads[-1].get("parallel") == want


def test_serve_does_not_retry_a_setting_that_fails_alone_too(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A bad setting that has nothing to do with batching (threads out of range) is the
    user's to see once, not a misleading fallback note and a second failed load."""
    from click.testing import CliRunner

    import edgekit
    import edgekit.runtime
    import edgekit.serve
    from edgekit.cli import main
    from edgekit.errors import SettingError

    loads: list[dict[str, Any]] = []

    def load(*a: Any, **k: Any) -> Any:
        loads.append(k)
        raise SettingError("threads 100000 is out of range", hint="pass 1 to 1024")

    monkeypatch.setattr(edgekit, "load", load)
    monkeypatch.setattr(edgekit.runtime, "suggest_parallel", lambda *a, **k: 4)
    monkeypatch.setattr(edgekit.serve, "serve", lambda s, c: None)
    result = CliRunner().invoke(main, ["serve", str(tmp_path / "b")])
    assert result.exit_code != 0 and "out of range" in result.output
    assert len(loads) == 1 and "serving one at a time" not in result.output


@pytest.mark.parametrize("planned", [True, False])
def test_serve_falls_back_to_one_stream_when_the_planned_batch_is_refused(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, planned: bool
) -> None:
    """A variant whose settings rule batching out (an MLX bundle recorded with a quantized
    KV cache) is served one at a time when the streams were the plan's; asked for, the
    refusal is the user's to see."""
    from click.testing import CliRunner

    import edgekit
    import edgekit.runtime
    import edgekit.serve
    from edgekit.cli import main
    from edgekit.errors import BatchSettingError

    loads: list[dict[str, Any]] = []

    def load(*a: Any, **k: Any) -> Any:
        loads.append(k)
        if k.get("parallel"):
            raise BatchSettingError("kv_cache q8_0 cannot run batched", hint="load with f16")
        return _Loaded()

    monkeypatch.setattr(edgekit, "load", load)
    monkeypatch.setattr(edgekit.runtime, "suggest_parallel", lambda *a, **k: 4)
    monkeypatch.setattr(edgekit.serve, "serve", lambda s, c: None)
    args = [] if planned else ["--parallel", "4"]
    result = CliRunner().invoke(main, ["serve", str(tmp_path / "b"), *args])
    if planned:
        assert result.exit_code == 0, result.output
        assert [k.get("parallel") for k in loads] == [4, None]
        assert "cannot run together here (kv_cache q8_0 cannot run batched)" in result.output
    else:
        assert result.exit_code != 0 and "cannot run batched" in result.output
        assert [k.get("parallel") for k in loads] == [4]


def test_serve_cli_refuses_more_slots_than_the_queue(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from edgekit.cli import main

    result = CliRunner().invoke(
        main, ["serve", str(tmp_path / "b"), "--parallel", "4", "--queue-size", "2"]
    )
    assert result.exit_code == 2 and "smaller than --parallel 4" in result.output
