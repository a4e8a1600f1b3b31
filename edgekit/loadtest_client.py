"""One request of ``edgekit loadtest``, streamed and timed: the standard library's HTTP
client on the calling thread (no dependency), a connection of its own per request.

Whatever the server sends is untrusted: lines and bodies are read within bounds, JSON is
parsed strictly, and nothing it says is shown unless cleaned (``clean_text``). Times are
``time.perf_counter`` seconds: time to first token is from just before the connection is
opened to the first event that carries generated text, inter-token latency the gaps
between such events, end-to-end the time to the end of the stream.
"""

from __future__ import annotations

import http.client
import json
import threading
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from edgekit.errors import ServeError
from edgekit.untrusted import clean_text

MAX_LINE = 1 << 20  # one server-sent event line
MAX_BODY = 1 << 20  # a JSON answer, an error, or /metrics
ENDPOINTS = {"completions": "/completions", "chat": "/chat/completions"}
STOPPED = "stopped: the run was stopped"  # the error of a request cut short by ``stop``


@dataclass(frozen=True, kw_only=True)
class Server:
    """Where the requests go: ``base`` is the API root (``http://127.0.0.1:8000/v1``)."""

    scheme: str
    host: str
    port: int
    base_path: str  # "/v1"
    api_key: str | None = None
    timeout_s: float = 120.0

    @classmethod
    def from_url(cls, url: str, *, api_key: str | None, timeout_s: float) -> Server:
        """``url`` as the server's API root: ``http://host:port`` gets ``/v1``.

        Raises:
            ServeError: not an http(s) URL with a host.
        """
        parts = urlsplit(url.strip())
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ServeError(
                f"{clean_text(url)!r} is not an http:// or https:// URL",
                hint="pass the server's address, such as http://127.0.0.1:8000/v1",
            )
        try:
            port = parts.port or (443 if parts.scheme == "https" else 80)
        except ValueError as exc:
            raise ServeError(
                f"{clean_text(url)!r} has no valid port", hint="pass host:port"
            ) from exc
        path = parts.path.rstrip("/")
        if not path:
            path = "/v1"
        return cls(
            scheme=parts.scheme,
            host=parts.hostname,
            port=port,
            base_path=path,
            api_key=api_key,
            timeout_s=timeout_s,
        )

    @property
    def origin(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.scheme}://{host}:{self.port}"

    def connection(self) -> http.client.HTTPConnection:
        kind = http.client.HTTPSConnection if self.scheme == "https" else http.client.HTTPConnection
        return kind(self.host, self.port, timeout=self.timeout_s)

    def headers(self, *, json_body: bool = False) -> dict[str, str]:
        out = {"Accept": "application/json, text/event-stream, text/plain"}
        if json_body:
            out["Content-Type"] = "application/json"
        if self.api_key:
            out["Authorization"] = f"Bearer {self.api_key}"
        return out


@dataclass(frozen=True, kw_only=True)
class RequestRecord:
    """One request as the load test saw it (times in seconds)."""

    index: int
    start_s: float  # when it was sent, from the level's start
    ttft_s: float | None  # None: no generated text arrived
    e2e_s: float
    itl_s: tuple[float, ...]  # gaps between events that carried generated text
    output_tokens: int  # the server's usage count when it sent one, else events counted
    prompt_tokens: int | None  # the server's usage count (None: it sent none)
    status: int  # the HTTP status (0: no answer)
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def tpot_s(self) -> float | None:
        """Time per output token after the first: (end-to-end - TTFT) / (tokens - 1)."""
        if self.ttft_s is None or self.output_tokens < 2:
            return None
        return (self.e2e_s - self.ttft_s) / (self.output_tokens - 1)


def get(server: Server, path: str) -> tuple[int, bytes]:
    """``GET`` ``path`` (from the server's root): the status and the body (bounded).

    Raises:
        OSError, http.client.HTTPException: no connection, or no HTTP answer.
    """
    conn = server.connection()
    try:
        conn.request("GET", path, headers=server.headers())
        response = conn.getresponse()
        return response.status, response.read(MAX_BODY)
    finally:
        conn.close()


def request_body(
    endpoint: str, model: str, prompt: str, max_tokens: int, *, seed: int
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": model,
        "max_tokens": max_tokens,
        "temperature": 0,
        "seed": seed,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if endpoint == "chat":
        body["messages"] = [{"role": "user", "content": prompt}]
    else:
        body["prompt"] = prompt
    return body


class _Stream:
    """What one streamed answer has said so far."""

    def __init__(self) -> None:
        self.first: float | None = None
        self.last: float | None = None
        self.gaps: list[float] = []
        self.events = 0
        self.usage: dict[str, Any] = {}
        self.error: str | None = None

    def event(self, payload: Any, now: float) -> None:
        if not isinstance(payload, dict):
            return
        if "error" in payload:
            self.error = "error event: " + _message(payload["error"])
            return
        if isinstance(payload.get("usage"), dict):
            self.usage = payload["usage"]
        if _has_text(payload):
            self.events += 1
            if self.first is None:
                self.first = now
            elif self.last is not None:
                self.gaps.append(now - self.last)
            self.last = now


def _has_text(payload: dict[str, Any]) -> bool:
    choices = payload.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return False
    choice = choices[0]
    delta = choice.get("delta")
    if isinstance(delta, dict):  # chat: content, or a reasoning model's thinking
        return any(
            isinstance(delta.get(k), str) and delta[k]
            for k in ("content", "reasoning_content", "reasoning")
        )
    text = choice.get("text")
    return isinstance(text, str) and bool(text)


def _message(error: Any) -> str:
    if isinstance(error, dict) and isinstance(error.get("message"), str):
        return clean_text(error["message"], max_len=200)
    return clean_text(error, max_len=200)


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def stream_one(
    server: Server,
    endpoint: str,
    body: dict[str, Any],
    *,
    index: int,
    t0: float,
    stop: threading.Event | None = None,
) -> RequestRecord:
    """Send one streamed request and time it (never raises: a failure is in ``error``).

    Once ``stop`` is set the stream is cut at its next line (error ``STOPPED``): a run
    being stopped does not wait for every answer in flight to finish.
    """
    sent = time.perf_counter()
    stream = _Stream()
    status = 0
    conn = server.connection()
    try:
        conn.request(
            "POST",
            server.base_path + ENDPOINTS[endpoint],
            body=json.dumps(body).encode(),
            headers=server.headers(json_body=True),
        )
        response = conn.getresponse()
        status = response.status
        if status != 200:
            stream.error = f"HTTP {status}: " + _error_text(response.read(MAX_BODY))
        else:
            _read_events(response, stream, deadline=sent + server.timeout_s, stop=stop)
    except (OSError, http.client.HTTPException) as exc:
        stream.error = f"{type(exc).__name__}: {clean_text(exc, max_len=200)}"
    finally:
        conn.close()
    end = time.perf_counter()
    usage_out = _int(stream.usage.get("completion_tokens"))
    return RequestRecord(
        index=index,
        start_s=sent - t0,
        ttft_s=stream.first - sent if stream.first is not None else None,
        e2e_s=end - sent,
        itl_s=tuple(stream.gaps),
        output_tokens=usage_out if usage_out is not None else stream.events,
        prompt_tokens=_int(stream.usage.get("prompt_tokens")),
        status=status,
        error=stream.error,
    )


def _read_events(
    response: http.client.HTTPResponse,
    stream: _Stream,
    *,
    deadline: float,
    stop: threading.Event | None = None,
) -> None:
    """Read the events until ``[DONE]``, the end of the stream, ``deadline`` (each read
    waits at most the connection's timeout, so a trickling server is cut off too), or
    ``stop``."""
    done = False
    while not done:
        line = response.readline(MAX_LINE)
        now = time.perf_counter()
        if not line:
            break
        if now > deadline:
            stream.error = "the answer took longer than the timeout"
            return
        if stop is not None and stop.is_set():
            stream.error = STOPPED
            return
        if not line.endswith(b"\n") and len(line) >= MAX_LINE:
            stream.error = f"an event line over {MAX_LINE} bytes"
            return
        text = line.strip()
        if not text.startswith(b"data:"):
            continue  # comments, event names, the blank lines between events
        data = text[5:].strip()
        if data == b"[DONE]":
            done = True
            continue
        try:
            stream.event(json.loads(data), now)
        except ValueError:
            stream.error = "an event that is not JSON"
            return
        if stream.error is not None:
            return
    if not done and stream.error is None:
        stream.error = "the stream ended without [DONE]"


def _error_text(raw: bytes) -> str:
    try:
        return _message(json.loads(raw).get("error", raw[:200]))
    except (ValueError, AttributeError):
        return clean_text(raw[:200].decode("utf-8", "replace"), max_len=200)
