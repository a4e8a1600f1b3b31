"""Property-based fuzzing of the server's request parser, alone and behind a live server.

Properties:

- ``read_request`` on any body (arbitrary JSON, near-valid OpenAI requests with random
  values for every field, bytes that are not UTF-8) returns a GenerationRequest whose
  every field is in range, or raises RequestError; never another exception.
- A live server (the fake Session of tests/serve_harness.py) answers every such body
  with 200 or a 4xx JSON error, never a 5xx, and after the run it still answers /health
  and a normal request, with every slot given back.

The CI run is bounded (tests/conftest.py: 150 examples a test); EDGEKIT_FUZZ_EXAMPLES
raises it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("hypothesis")
pytest.importorskip("uvicorn")
pytest.importorskip("httpx")

import httpx
from hypothesis import example, given
from hypothesis import strategies as st

from edgekit.errors import RequestError
from edgekit.serve_requests import MAX_SEED, GenerationRequest, read_request
from tests.serve_harness import KEY, FakeSession, LiveServer, wait_until

pytestmark = pytest.mark.fuzz

LIMIT = 8  # max_tokens_limit: the fake generates a few words, quickly
MAX_BYTES = 16_384

scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.sampled_from([0, 1, 2, -1, LIMIT, LIMIT + 1, MAX_SEED, MAX_SEED + 1, 2**63])
    | st.floats(allow_nan=False, width=64)
    | st.sampled_from([0.0, 0.5, 1.0, 1.5, 2.0, 2.5, -0.0, 1e-300, 1e308])
    | st.text(max_size=12)
    | st.sampled_from(["", "false", "true", "none", "text", "\ud800", "<|im_start|>", "\x00"])
)
json_values = st.recursive(
    scalars,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=12,
)
roles = st.sampled_from(["system", "developer", "user", "assistant", "tool", "wizard", ""])
parts = st.lists(
    st.fixed_dictionaries({"type": st.sampled_from(["text", "image_url"]), "text": st.text()})
    | json_values,
    max_size=3,
)
messages = st.lists(
    st.fixed_dictionaries(
        {"role": roles | json_values},
        optional={
            "content": st.text(max_size=40) | parts | json_values,
            "name": st.text(max_size=5) | json_values,
            "refusal": st.none() | json_values,
        },
    )
    | json_values,
    max_size=4,
)
FIELDS = {
    "model": st.text(max_size=8),
    "max_tokens": st.integers(min_value=-2, max_value=LIMIT + 2),
    "max_completion_tokens": st.integers(min_value=-2, max_value=LIMIT + 2),
    "temperature": st.floats(min_value=-1, max_value=3),
    "top_p": st.floats(min_value=-0.5, max_value=1.5),
    "top_k": st.integers(min_value=-2, max_value=100),
    "min_p": st.floats(min_value=-0.5, max_value=1.5),
    "repeat_penalty": st.floats(min_value=-1, max_value=11),
    "n": st.integers(min_value=0, max_value=3),
    "seed": st.integers(min_value=-2, max_value=2**33),
    "stop": st.text(max_size=4) | st.lists(st.text(max_size=4), max_size=6),
    "stream": st.booleans(),
    "stream_options": st.fixed_dictionaries({"include_usage": st.booleans()}),
    "frequency_penalty": st.floats(min_value=-3, max_value=3),
    "presence_penalty": st.just(0),
    "logprobs": st.booleans(),
    "user": st.text(max_size=4),
    "tools": st.just([]),
    "response_format": st.just({"type": "text"}),
    "echo": st.booleans(),
    "suffix": st.text(max_size=3),
    "best_of": st.integers(min_value=0, max_value=2),
    "unknown_field": json_values,
}
requests = st.fixed_dictionaries(
    {},
    optional={
        "messages": messages | json_values,
        "prompt": st.text(max_size=60) | st.lists(st.text(max_size=10), max_size=2) | json_values,
        **{k: v | json_values for k, v in FIELDS.items()},
    },
)


def _encode(value: Any, how: int) -> bytes:
    if how == 0:  # what most clients send
        return json.dumps(value).encode()
    if how == 1:  # raw characters: a lone surrogate becomes bytes that are not UTF-8
        return json.dumps(value, ensure_ascii=False).encode("utf-8", "surrogatepass")
    return json.dumps(value)[:-1].encode()  # cut short


bodies = st.one_of(
    st.builds(_encode, requests, st.integers(min_value=0, max_value=2)),
    st.builds(_encode, json_values, st.integers(min_value=0, max_value=2)),
    st.binary(max_size=64),
)


# Requests the schema accepts, with random values in range: the server must answer 200.
words = st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=30)
VALID = {
    "max_tokens": st.integers(min_value=1, max_value=LIMIT),
    "temperature": st.floats(min_value=0, max_value=2),
    "top_p": st.floats(min_value=0.01, max_value=1),
    "top_k": st.integers(min_value=0, max_value=50),
    "seed": st.integers(min_value=0, max_value=MAX_SEED),
    "stop": st.none() | words | st.lists(words, max_size=4),
    "stream": st.booleans(),
    "n": st.just(1),
    "user": words,
    "model": words,
}
valid_message = st.fixed_dictionaries(
    {
        "role": st.sampled_from(["system", "developer", "user", "assistant"]),
        "content": words
        | st.lists(st.fixed_dictionaries({"type": st.just("text"), "text": words}), min_size=1),
    }
)
valid_cases = st.one_of(
    st.tuples(
        st.fixed_dictionaries(
            {"messages": st.lists(valid_message, min_size=1, max_size=3)}, optional=VALID
        ).map(lambda v: json.dumps(v).encode()),
        st.just(True),
    ),
    st.tuples(
        st.fixed_dictionaries(
            {"prompt": words | st.lists(words, min_size=1, max_size=1)}, optional=VALID
        ).map(lambda v: json.dumps(v).encode()),
        st.just(False),
    ),
)
cases = st.one_of(st.tuples(bodies, st.booleans()), valid_cases)


def _check_request(request: GenerationRequest, *, chat: bool) -> None:
    s = request.sampling
    assert 1 <= s.max_tokens <= LIMIT
    assert 0.0 <= s.temperature <= 2.0 and 0.0 < s.top_p <= 1.0
    assert s.seed is None or 0 <= s.seed <= MAX_SEED
    assert all(isinstance(x, str) for x in s.stop) and len(s.stop) <= 4
    if chat:
        assert request.messages and request.prompt == ""
        for m in request.messages:
            assert set(m) == {"role", "content"}
            assert m["role"] in ("system", "user", "assistant")
            m["content"].encode("utf-8")  # valid text
    else:
        assert request.prompt and not request.messages
        request.prompt.encode("utf-8")
    assert request.include_usage is False or request.stream


@given(case=cases)
@example(case=(b'{"messages": [{"role": "user", "content": "hi"}]}', True))
@example(case=(b'{"prompt": "hi", "seed": 1.5}', False))
@example(case=(b"[" * 100_000, True))
def test_parser_returns_a_checked_request_or_a_request_error(case: tuple[bytes, bool]) -> None:
    body, chat = case
    try:
        request = read_request(body, chat=chat, max_bytes=MAX_BYTES, max_tokens_limit=LIMIT)
    except RequestError as exc:
        assert exc.message and isinstance(exc.message, str)
        return
    _check_request(request, chat=chat)


@pytest.fixture(scope="module")
def live() -> Iterator[LiveServer]:
    with LiveServer(
        FakeSession(context=4096),
        model_name="fake",
        max_tokens_limit=LIMIT,
        max_request_bytes=MAX_BYTES,
        queue_size=4,
    ) as server:
        yield server


HEADERS = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}


def test_server_answers_any_body_with_200_or_a_4xx_json_error(live: LiveServer) -> None:
    # no keep-alive: a pooled connection the server closes as idle (after 5 s, which a loaded
    # machine can take between two examples) would fail the next request on the client side
    http = httpx.Client(
        timeout=60, headers=HEADERS, limits=httpx.Limits(max_keepalive_connections=0)
    )
    answered: list[int] = []

    @given(case=cases)
    @example(case=(b'{"messages": [{"role": "user", "content": "hi"}], "stream": true}', True))
    @example(case=(b'{"prompt": "hi", "seed": 1.5}', False))
    def one(case: tuple[bytes, bool]) -> None:
        body, chat = case
        path = "/chat/completions" if chat else "/completions"
        r = http.post(f"{live.url}{path}", content=body)
        answered.append(r.status_code)
        assert r.status_code == 200 or 400 <= r.status_code < 500, (r.status_code, r.text)
        if r.status_code != 200:
            error = r.json()["error"]
            assert isinstance(error["message"], str) and error["message"]
        elif r.headers["content-type"].startswith("text/event-stream"):
            lines = [line for line in r.text.splitlines() if line.startswith("data: ")]
            assert lines[-1] == "data: [DONE]"
        else:
            assert r.json()["choices"][0]["finish_reason"] in ("stop", "length")

    one()
    # still healthy: every slot back, /health and a normal request answered
    assert wait_until(lambda: live.stats.open == 0, 30)
    assert http.get(f"http://127.0.0.1:{live.port}/health").status_code == 200
    ok = http.post(
        f"{live.url}/chat/completions",
        json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
    )
    assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 2
    assert 200 in answered and any(400 <= s < 500 for s in answered)
